# cython: language_level=3
# distutils: language = c++
"""CPU kernels: the work-unit scheduler over the C++ loops of qc_kernels.h.

Every function here takes C-contiguous 1-D views of already validated data
(the Python layer in ``quantcore/ops.py`` validates, converts and
allocates) plus ``nthreads``, resolved in Python once per call.  Per-channel
work sees the data as a C-ordered ``(outer, C, inner)`` view, so any axis is
handled without a transposed copy.

The scheduler (``_units`` / ``_unit``) splits that view into work units of
at most ``BLOCK`` contiguous elements of one channel (the "block" layout),
or, when ``inner == 1``, of about ``BLOCK`` elements of whole rows of C
values (the "rowvec" layout); each unit is one iteration of a static
``prange`` and calls one per-chunk routine of the C++ side (templates over
float / double, deduced from the pointers).  Reductions write one partial
per unit and fold the partials in unit order, so results do not depend on
the number of threads.  A call of one unit runs on the calling thread
without starting a team.

This file holds the scheduler and the shared checks; the entry points are
in the ``_kernels_*.pxi`` files it includes, by area (elementwise, codes
and groups, reductions, qparams and the fused step, the exported tables):
one extension module, one Cython translation.
"""
import numpy as np

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc

from quantcore._cpu._shares cimport run_shares, share_threads

ctypedef fused floating:
    float
    double

cnp.import_array()

import os as _os

#: the builds of the loops by SIMD level (qc_kernels.h)
_SIMD_NAMES = {2: "baseline", 3: "x86-64-v3", 4: "x86-64-v4"}


def _simd_cap(name):
    """The highest level a QUANTCORE_SIMD value allows (unset, empty or
    unknown: every level)."""
    return {v: k for k, v in _SIMD_NAMES.items()}.get(name.strip().lower(), 4)


qc_select_simd(_simd_cap(_os.environ.get("QUANTCORE_SIMD", "")))

#: elementwise family name -> id (qc_registry.h, QC_EW_FAMILIES), and the
#: number of per-channel parameters each takes
FAMILIES = {qc_ew_family_names[i].decode(): i for i in range(QC_EW_COUNT)}
FAMILY_PARAMS = {qc_ew_family_names[i].decode(): qc_ew_family_np[i] for i in range(QC_EW_COUNT)}
#: observer rules and flags (qc_minmax.h: qc_observe_update)
OBS_MINMAX, OBS_MOVING_AVG, OBS_EMA, OBS_MOMENTUM = (QC_OBS_MINMAX, QC_OBS_MOVING_AVG,
                                                     QC_OBS_EMA, QC_OBS_MOMENTUM)
OBS_PROPAGATE, OBS_INCLUDE_ZERO, OBS_FROM_ZERO, OBS_ABSMAX = (
    QC_OBS_PROPAGATE, QC_OBS_INCLUDE_ZERO, QC_OBS_FROM_ZERO, QC_OBS_ABSMAX)
OBS_FIRST_IF_EMPTY, OBS_INF_RESETS = QC_OBS_FIRST_IF_EMPTY, QC_OBS_INF_RESETS
MM_NAN, MM_NEGZERO, MM_POSZERO = QC_MM_NAN, QC_MM_NEGZERO, QC_MM_POSZERO

#: elements per work unit: large enough to amortise scheduling, small
#: enough that 2 threads share 1 Mi elements evenly.
cdef int64_t BLOCK = 32768
cdef float INFINITY_F = float("inf")


def simd_variant():
    """The build of the loops in use: "x86-64-v4" (AVX-512), "x86-64-v3"
    (AVX2 + FMA), the best one the CPU has, chosen at run time, or
    "baseline"."""
    return _SIMD_NAMES[qc_simd_level]


def simd_builds():
    """The builds of the loops compiled in, e.g. ["baseline", "x86-64-v3",
    "x86-64-v4"]."""
    return [name for level, name in _SIMD_NAMES.items() if qc_simd_builds() >> level & 1]


def simd_v3_built():
    """Whether the AVX2 + FMA build of the loops was compiled in."""
    return "x86-64-v3" in simd_builds()


def select_simd(level):
    """Choose the build of the loops: the best one the CPU has up to `level`
    (a name of :func:`simd_builds`; True: the best, False: the baseline).
    For tests, which compare the builds bit for bit; not for use while other
    threads run kernels.  Returns :func:`simd_variant`."""
    if level is True or level is False:
        qc_select_simd(4 if level else 2)
    elif level in _SIMD_NAMES.values():
        qc_select_simd(_simd_cap(level))
    else:
        raise ValueError(f"level: expected True, False or one of {list(_SIMD_NAMES.values())}, "
                         f"got {level!r}")
    return simd_variant()


def openmp_enabled():
    """True when the extension was compiled with OpenMP."""
    return bool(qc_openmp_enabled())


def omp_max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS and threadpoolctl."""
    return qc_omp_max_threads()


def block_size():
    return BLOCK


# ---------------------------------------------------------------- scheduler
cdef struct Units:
    int64_t outer, C, inner
    int64_t nblk    # block layout: units per row of `inner` values; 0: rowvec layout
    int64_t nrows   # rowvec layout: rows per unit
    int64_t n       # number of units


cdef inline Units _units(int64_t outer, int64_t C, int64_t inner) noexcept nogil:
    """The work units of the C-ordered (outer, C, inner) view (per tensor:
    (1, 1, size)): the block layout when inner > 1, else rowvec."""
    cdef Units L
    L.outer, L.C, L.inner = outer, C, inner
    if inner > 1:
        L.nblk = (inner + BLOCK - 1) // BLOCK if inner > 0 else 0
        L.nrows = 0
        L.n = outer * C * L.nblk
    else:
        L.nblk = 0
        L.nrows = BLOCK // C if C < BLOCK else 1
        L.n = (outer + L.nrows - 1) // L.nrows
    return L


cdef struct Unit:
    int64_t start    # first element
    int64_t count    # elements (block layout) or rows of C values (rowvec layout)
    int64_t channel  # the unit's channel (block layout), -1 (rowvec layout)


cdef inline Unit _unit(const Units* L, int64_t u) noexcept nogil:
    """Unit u of L.  (Returned by value: assigned in a prange body, it is
    private to each thread.)"""
    cdef Unit un
    cdef int64_t r, b
    if L.nblk:
        r = u // L.nblk
        b = u - r * L.nblk
        un.channel = r % L.C
        un.start = r * L.inner + b * BLOCK
        un.count = L.inner - b * BLOCK
        if un.count > BLOCK:
            un.count = BLOCK
    else:
        un.channel = -1
        un.start = u * L.nrows * L.C
        un.count = L.outer - u * L.nrows
        if un.count > L.nrows:
            un.count = L.nrows
    return un


cdef inline unsigned char* _off(unsigned char* p, int64_t k) noexcept nogil:
    return p + k if p != NULL else NULL


cdef inline int _check_flat(cnp.ndarray x) except -1:
    """x must be a C-contiguous, aligned float32 / float64 array."""
    if not cnp.PyArray_ISCARRAY_RO(x) or (cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 and
                                           cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT64):
        raise ValueError("expected an aligned C-contiguous float32 or float64 array")
    return 0


cdef inline int _check_dest(cnp.ndarray y, cnp.ndarray x) except -1:
    """y must be a writable aligned C-contiguous array of x's type and size."""
    if not cnp.PyArray_ISCARRAY(y) or cnp.PyArray_TYPE(y) != cnp.PyArray_TYPE(x) or \
            cnp.PyArray_SIZE(y) != cnp.PyArray_SIZE(x):
        raise ValueError("expected a writable C-contiguous output of the input's dtype and size")
    return 0


cdef inline unsigned char* _mask_ptr(cnp.ndarray mask, int64_t n) except? NULL:
    """Data of a writable C-contiguous uint8 / bool mask of n elements, or
    NULL for no mask (None)."""
    if mask is None:
        return NULL
    if not cnp.PyArray_ISCARRAY(mask) or cnp.PyArray_ITEMSIZE(mask) != 1 or \
            cnp.PyArray_SIZE(mask) != n:
        raise ValueError(f"expected a writable C-contiguous uint8 mask of {n} elements")
    return <unsigned char*>cnp.PyArray_DATA(mask)


cdef inline void* _params_ptr(cnp.ndarray params, cnp.ndarray x, int64_t count) except NULL:
    """Data of a C-contiguous parameter array of x's dtype with at least
    `count` values."""
    if params is None or not cnp.PyArray_ISCARRAY_RO(params) or \
            cnp.PyArray_TYPE(params) != cnp.PyArray_TYPE(x) or cnp.PyArray_SIZE(params) < count:
        raise ValueError(f"expected a C-contiguous parameter array of the input's dtype with "
                         f"{count} values")
    return cnp.PyArray_DATA(params)


# The entry points, by area (each file's cdef functions see the helpers
# above; one extension module, so that the scheduler is compiled once)
include "_kernels_ew.pxi"
include "_kernels_codes.pxi"
include "_kernels_reduce.pxi"
include "_kernels_qparams.pxi"
include "_kernels_tables.pxi"
