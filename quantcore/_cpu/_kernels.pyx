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

#: elementwise family name -> id (qc_families.h, QC_EW_FAMILIES), and the
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


# ---------------------------------------------------------------- elementwise
cdef void _ew_run(int family, const floating* x, floating* y, unsigned char* mask, Units L,
                  const floating* params, floating u0, floating u1, int mode,
                  int nthreads) noexcept nogil:
    """Family `family` over every unit of L."""
    cdef int64_t u
    cdef Unit un
    if L.n == 1:
        _ew_unit(family, x, y, mask, &L, _unit(&L, 0), params, u0, u1, mode)
        return
    for u in prange(L.n, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        _ew_unit(family, x, y, mask, &L, un, params, u0, u1, mode)


cdef inline void _ew_unit(int family, const floating* x, floating* y, unsigned char* mask,
                          const Units* L, Unit un, const floating* params, floating u0,
                          floating u1, int mode) noexcept nogil:
    if un.channel >= 0:
        ew_block(family, x + un.start, y + un.start, _off(mask, un.start), un.count, params,
                 L.C, un.channel, u0, u1, mode)
    else:
        ew_rowvec(family, x + un.start, y + un.start, _off(mask, un.start), un.count, L.C,
                  params, u0, u1, mode)


def ew(int family, cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask, int64_t outer, int64_t C,
       int64_t inner, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """Elementwise family `family` (``FAMILIES``) over the (outer, C, inner)
    view of x into y (may alias x), with the mask when given.

    x, y: C-contiguous float32 / float64 arrays of one dtype and size; mask:
    uint8 of that size or None; params: x's dtype, the family's NP
    parameters as NP arrays of C values (``params[j * C + c]``); u0, u1,
    mode: the family's uniform parameters (rounded to x's dtype).  (Raw data
    pointers: this is on the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    _check_flat(x)
    _check_dest(y, x)
    cdef unsigned char* mp = _mask_ptr(mask, n)
    if not 0 <= family < QC_EW_COUNT:
        raise ValueError(f"ew: unknown family {family}")
    if n == 0 or C == 0:
        return
    if outer * C * inner != n:
        raise ValueError(f"ew: the view ({outer}, {C}, {inner}) does not have {n} elements")
    cdef void* pp = _params_ptr(params, x, qc_ew_family_np[family] * C)
    cdef Units L = _units(outer, C, inner)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            _ew_run(family, <const float*>cnp.PyArray_DATA(x), <float*>cnp.PyArray_DATA(y), mp,
                    L, <const float*>pp, <float>u0, <float>u1, mode, nthreads)
    else:
        with nogil:
            _ew_run(family, <const double*>cnp.PyArray_DATA(x), <double*>cnp.PyArray_DATA(y),
                    mp, L, <const double*>pp, u0, u1, mode, nthreads)


def ew_tensor(int family, cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask, double p0, double p1,
              double p2, double p3, double p4, double u0, double u1, int mode, int nthreads):
    """:func:`ew` per tensor with the family's parameters as scalars
    (p0, p1, ...: the first NP are used, rounded to x's dtype)."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef float pf[5]
    cdef double pd[5]
    _check_flat(x)
    _check_dest(y, x)
    cdef unsigned char* mp = _mask_ptr(mask, n)
    if not 0 <= family < QC_EW_COUNT:
        raise ValueError(f"ew_tensor: unknown family {family}")
    if n == 0:
        return
    cdef Units L = _units(1, 1, n)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        pf[0], pf[1], pf[2], pf[3], pf[4] = p0, p1, p2, p3, p4
        with nogil:
            _ew_run(family, <const float*>cnp.PyArray_DATA(x), <float*>cnp.PyArray_DATA(y), mp,
                    L, pf, <float>u0, <float>u1, mode, nthreads)
    else:
        pd[0], pd[1], pd[2], pd[3], pd[4] = p0, p1, p2, p3, p4
        with nogil:
            _ew_run(family, <const double*>cnp.PyArray_DATA(x), <double*>cnp.PyArray_DATA(y),
                    mp, L, pd, u0, u1, mode, nthreads)


def fq_affine_exact(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
                    int64_t C, int64_t inner, const floating[::1] scale,
                    const floating[::1] inv, const double[::1] zp, double qmin, double qmax,
                    int mode, int nthreads):
    """PyTorch's affine fake quant with exact integer zero points and range
    (qc_fq_affine_exact) over the C-ordered (outer, C, inner) view of x
    (per tensor: C = 1, inner = x.size); y may alias x."""
    cdef int64_t n = x.shape[0]
    cdef int64_t u
    cdef Unit un
    if n == 0:
        return
    if C < 1 or inner < 1 or scale.shape[0] < C or inv.shape[0] < C or zp.shape[0] < C:
        raise ValueError("fq_affine_exact: C and inner must be >= 1, with C parameters each")
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = NULL
    if mask is not None and mask.shape[0] > 0:
        mp = &mask[0]
    cdef Units L = _units(1, 1, n)  # elementwise, the channel of each element computed
    for u in prange(L.n, nogil=True, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        affine_exact_range(xp, yp, mp, un.start, un.count, C, inner, &scale[0], &inv[0], &zp[0],
                           qmin, qmax, mode)


# ------------------------------------------------------- codes and groups
#: encode (float -> code) and decode (code -> float) family name -> id
#: (qc_families.h: QC_ENCODE_FAMILIES, QC_DECODE_FAMILIES), and the group
#: recipes of group_quant (QC_GROUP_RECIPES)
ENCODE_FAMILIES = {qc_encode_family_names[i].decode(): i for i in range(QC_ENC_COUNT)}
DECODE_FAMILIES = {qc_decode_family_names[i].decode(): i for i in range(QC_DEC_COUNT)}
GROUP_RECIPES = {qc_group_recipe_names[i].decode(): i for i in range(QC_GRP_COUNT)}
#: the block-scaled recipes of block_scaled (QC_BLOCK_RECIPES: MX, NVFP4)
BLOCK_RECIPES = {qc_block_recipe_names[i].decode(): i for i in range(QC_BLK_COUNT)}


cdef inline int _check_codes(cnp.ndarray codes, int64_t n, int allowed, bint writable,
                             str func) except -1:
    """codes: an aligned C-contiguous array of n one- or two-byte integers
    whose width the family supports (allowed: bit 1 one byte, bit 2 two)."""
    if codes is None or not cnp.PyArray_ISCARRAY_RO(codes) or \
            cnp.PyArray_SIZE(codes) != n or (writable and not cnp.PyArray_ISWRITEABLE(codes)) \
            or cnp.PyArray_TYPE(codes) not in (cnp.NPY_UINT8, cnp.NPY_INT8, cnp.NPY_UINT16,
                                               cnp.NPY_INT16) \
            or not (allowed & cnp.PyArray_ITEMSIZE(codes)):
        raise ValueError(f"{func}: expected {'a writable ' if writable else 'an '}aligned "
                         f"C-contiguous integer code array of {n} elements with a width the "
                         f"family supports")
    return cnp.PyArray_ITEMSIZE(codes)


cdef void _code_run(bint enc, int family, floating* x, char* codes, int cb, Units L,
                    const floating* params, floating u0, floating u1, int mode,
                    int nthreads) noexcept nogil:
    """Encode (x -> codes) or decode (codes -> x) family `family` over every
    unit of L."""
    cdef int64_t u
    cdef Unit un
    for u in prange(L.n, schedule='static', num_threads=nthreads if L.n > 1 else 1):
        un = _unit(&L, u)
        if un.channel >= 0:
            if enc:
                enc_block(family, x + un.start, codes + un.start * cb, cb, un.count, params,
                          L.C, un.channel, u0, u1, mode)
            else:
                dec_block(family, codes + un.start * cb, cb, x + un.start, un.count, params,
                          L.C, un.channel, u0, u1, mode)
        elif enc:
            enc_rowvec(family, x + un.start, codes + un.start * cb, cb, un.count, L.C, params,
                       u0, u1, mode)
        else:
            dec_rowvec(family, codes + un.start * cb, cb, x + un.start, un.count, L.C, params,
                       u0, u1, mode)


cdef void _code_groups_run(bint enc, int family, floating* x, char* codes, int cb,
                           int64_t rows, int64_t K, int64_t g, const floating* params,
                           floating u0, floating u1, int mode, int nthreads) noexcept nogil:
    """The same over rows of K elements in groups of g (the last of a row
    may be shorter), group b = r * ng + j using parameter b of rows * ng:
    units of whole groups."""
    cdef int64_t ng = (K + g - 1) // g
    cdef Units L = _units(rows * ng, g, 1)   # units of whole groups (one row of g per group)
    cdef Unit un
    cdef int64_t u, b, r, j, start, cnt
    for u in prange(L.n, schedule='static', num_threads=nthreads if L.n > 1 else 1):
        un = _unit(&L, u)
        for b in range(u * L.nrows, u * L.nrows + un.count):
            r = b // ng
            j = b - r * ng
            start = r * K + j * g
            cnt = K - j * g
            if cnt > g:
                cnt = g
            if enc:
                enc_block(family, x + start, codes + start * cb, cb, cnt, params, rows * ng, b,
                          u0, u1, mode)
            else:
                dec_block(family, codes + start * cb, cb, x + start, cnt, params, rows * ng, b,
                          u0, u1, mode)


def _code_call(bint enc, int family, cnp.ndarray x, cnp.ndarray codes, int64_t outer,
               int64_t C, int64_t inner, int64_t g, cnp.ndarray params, double u0, double u1,
               int mode, int nthreads, str func):
    """encode / decode (g == 0: the (outer, C, inner) view) and their
    grouped forms (g > 0: rows = outer, K = inner)."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef int count = QC_ENC_COUNT if enc else QC_DEC_COUNT
    if not 0 <= family < count:
        raise ValueError(f"{func}: unknown family {family}")
    _check_flat(x)
    if not enc and not cnp.PyArray_ISWRITEABLE(x):
        raise ValueError(f"{func}: the output is not writable")
    cdef int allowed = qc_encode_family_bytes[family] if enc else qc_decode_family_bytes[family]
    cdef int cb = _check_codes(codes, n, allowed, enc, func)
    if n == 0:
        return
    cdef int64_t nparams
    if g > 0:
        if outer * inner != n:
            raise ValueError(f"{func}: {outer} rows of {inner} do not make {n} elements")
        nparams = outer * ((inner + g - 1) // g)
    else:
        if outer * C * inner != n:
            raise ValueError(f"{func}: the view ({outer}, {C}, {inner}) does not have {n} "
                             "elements")
        nparams = C
    cdef int np_ = qc_encode_family_np[family] if enc else qc_decode_family_np[family]
    cdef void* pp = _params_ptr(params, x, np_ * nparams)
    cdef char* cp = <char*>cnp.PyArray_DATA(codes)
    cdef Units L
    if g <= 0:
        L = _units(outer, C, inner)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            if g > 0:
                _code_groups_run(enc, family, <float*>cnp.PyArray_DATA(x), cp, cb, outer, inner,
                                 g, <const float*>pp, <float>u0, <float>u1, mode, nthreads)
            else:
                _code_run(enc, family, <float*>cnp.PyArray_DATA(x), cp, cb, L,
                          <const float*>pp, <float>u0, <float>u1, mode, nthreads)
    else:
        with nogil:
            if g > 0:
                _code_groups_run(enc, family, <double*>cnp.PyArray_DATA(x), cp, cb, outer,
                                 inner, g, <const double*>pp, u0, u1, mode, nthreads)
            else:
                _code_run(enc, family, <double*>cnp.PyArray_DATA(x), cp, cb, L,
                          <const double*>pp, u0, u1, mode, nthreads)


def encode(int family, cnp.ndarray x, cnp.ndarray codes, int64_t outer, int64_t C,
           int64_t inner, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """Encode family `family` (``ENCODE_FAMILIES``) over the (outer, C, inner)
    view of x into codes (one- or two-byte integers of x's size, as the
    family allows); params: x's dtype, NP arrays of C values; u0, u1, mode:
    the family's uniform parameters."""
    _code_call(True, family, x, codes, outer, C, inner, 0, params, u0, u1, mode, nthreads,
               "encode")


def decode(int family, cnp.ndarray codes, cnp.ndarray y, int64_t outer, int64_t C,
           int64_t inner, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """Decode family `family` (``DECODE_FAMILIES``): codes into y (float32 /
    float64 of the codes' size) over the (outer, C, inner) view."""
    _code_call(False, family, y, codes, outer, C, inner, 0, params, u0, u1, mode, nthreads,
               "decode")


def encode_groups(int family, cnp.ndarray x, cnp.ndarray codes, int64_t rows, int64_t K,
                  int64_t g, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """:func:`encode` over rows of K elements with one parameter set per
    group of g consecutive elements (the last of a row may be shorter):
    params holds NP arrays of rows * ceil(K / g) values, row-major."""
    if g < 1:
        raise ValueError(f"encode_groups: the group size must be >= 1, got {g}")
    _code_call(True, family, x, codes, rows, 1, K, g, params, u0, u1, mode, nthreads,
               "encode_groups")


def decode_groups(int family, cnp.ndarray codes, cnp.ndarray y, int64_t rows, int64_t K,
                  int64_t g, cnp.ndarray params, double u0, double u1, int mode, int nthreads):
    """:func:`decode` with per-group parameters (as :func:`encode_groups`)."""
    if g < 1:
        raise ValueError(f"decode_groups: the group size must be >= 1, got {g}")
    _code_call(False, family, y, codes, rows, 1, K, g, params, u0, u1, mode, nthreads,
               "decode_groups")


cdef inline void* _opt_ptr(cnp.ndarray a, int typenum, int64_t n, str what,
                           str func) except? NULL:
    """Data of a writable C-contiguous array of `typenum` with n elements,
    or NULL for None."""
    if a is None:
        return NULL
    if not cnp.PyArray_ISCARRAY(a) or cnp.PyArray_SIZE(a) != n or \
            cnp.PyArray_TYPE(a) != typenum:
        raise ValueError(f"{func}: {what} must be a writable C-contiguous array of {n} "
                         "elements")
    return cnp.PyArray_DATA(a)


cdef int64_t _blocks_per_row(cnp.ndarray x, int64_t rows, int64_t K, int64_t g,
                             str func) except -1:
    """ceil(K / g): the groups (blocks) of g along each of the rows of K of
    x, which must be an aligned C-contiguous float32 array of rows * K."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISCARRAY_RO(x):
        raise ValueError(f"{func}: expected an aligned C-contiguous float32 array")
    if g < 1 or K < 1 or rows * K != n:
        raise ValueError(f"{func}: {rows} rows of {K} in groups of {g} do not fit {n} elements")
    return (K + g - 1) // g


cdef void _groups_run(bint scaled, int recipe, const float* x, unsigned char* codes, float* y,
                      unsigned char* mask, float* scale, float* zp, unsigned char* scodes,
                      int64_t rows, int64_t K, int64_t g, int elem, int mode, float p0, float p1,
                      int nthreads) noexcept nogil:
    """group_blocks (recipe of GROUP_RECIPES; p0, p1 = qmin, qmax) or, when
    scaled, block_scaled (recipe of BLOCK_RECIPES, element format elem)
    over the rows * ceil(K / g) groups of g of x, in units of whole groups
    (the rowvec layout of one row of g per group)."""
    cdef Units L = _units(rows * ((K + g - 1) // g), g, 1)
    cdef Unit un
    cdef int64_t u
    for u in prange(L.n, schedule='static', num_threads=nthreads if L.n > 1 else 1):
        un = _unit(&L, u)
        if scaled:
            block_scaled(recipe, x, scodes, codes, y, u * L.nrows, un.count, K, g, elem, mode,
                         p0, p1)
        else:
            group_blocks(recipe, x, codes, y, mask, scale, zp, u * L.nrows, un.count, K, g, p0,
                         p1, mode)


def group_quant(int recipe, cnp.ndarray x, cnp.ndarray codes, cnp.ndarray y,
                cnp.ndarray mask, cnp.ndarray scale, cnp.ndarray zp, int64_t rows, int64_t K,
                int64_t g, double qmin, double qmax, int mode, int nthreads):
    """Group quantization by recipe `recipe` (``GROUP_RECIPES``) of x
    (float32, rows of K, groups of g along each row, the last may be
    shorter): per group the finished min / max, the recipe's qparams into
    scale / zp (float32[rows * ceil(K / g)]), then codes (uint8 / int8), the
    fake-quant values y (float32) and the mask, each when not None."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if not 0 <= recipe < QC_GRP_COUNT:
        raise ValueError(f"group_quant: unknown recipe {recipe}")
    cdef int64_t ng = _blocks_per_row(x, rows, K, g, "group_quant")
    cdef str f = "group_quant"
    cdef unsigned char* cp = <unsigned char*>_opt_ptr(codes, cnp.NPY_UINT8, n, "codes", f)
    cdef float* yp = <float*>_opt_ptr(y, cnp.NPY_FLOAT32, n, "y", f)
    cdef unsigned char* mp = <unsigned char*>_opt_ptr(mask, cnp.NPY_UINT8, n, "mask", f)
    cdef float* sp = <float*>_opt_ptr(scale, cnp.NPY_FLOAT32, rows * ng, "scale", f)
    cdef float* zpp = <float*>_opt_ptr(zp, cnp.NPY_FLOAT32, rows * ng, "zp", f)
    with nogil:
        _groups_run(False, recipe, <const float*>cnp.PyArray_DATA(x), cp, yp, mp, sp, zpp, NULL,
                    rows, K, g, 0, mode, qmin, qmax, nthreads)


def block_scaled_quant(int recipe, cnp.ndarray x, cnp.ndarray scodes, cnp.ndarray codes,
                 cnp.ndarray y, int64_t rows, int64_t K, int64_t g, int elem, int mode,
                 double p0, double p1, int nthreads):
    """Block-scaled quantization by recipe `recipe` (``BLOCK_RECIPES``) of x
    (float32, rows of K, blocks of g along each row, the last may be
    shorter): per block the amax, the recipe's scale code into scodes
    (uint8[rows * ceil(K / g)]), then the element codes (uint8, one per
    element) and the fake-quant values y (float32), each when not None."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if not 0 <= recipe < QC_BLK_COUNT:
        raise ValueError(f"block_scaled_quant: unknown recipe {recipe}")
    cdef int64_t ng = _blocks_per_row(x, rows, K, g, "block_scaled_quant")
    cdef str f = "block_scaled_quant"
    cdef unsigned char* sp = <unsigned char*>_opt_ptr(scodes, cnp.NPY_UINT8, rows * ng, "scodes",
                                                      f)
    cdef unsigned char* cp = <unsigned char*>_opt_ptr(codes, cnp.NPY_UINT8, n, "codes", f)
    cdef float* yp = <float*>_opt_ptr(y, cnp.NPY_FLOAT32, n, "y", f)
    with nogil:
        _groups_run(True, recipe, <const float*>cnp.PyArray_DATA(x), cp, yp, NULL, NULL, NULL, sp,
                    rows, K, g, elem, mode, p0, p1, nthreads)


# ----------------------------------------------------------------- backward
cdef void _ste_run(const floating* gp, const unsigned char* mp, floating* yp, int64_t n,
                   int nthreads) noexcept nogil:
    cdef int64_t u
    cdef Unit un
    cdef Units L = _units(1, 1, n)
    if L.n == 1:
        ste_block(gp, mp, yp, n)
        return
    for u in prange(L.n, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        ste_block(gp + un.start, mp + un.start, yp + un.start, un.count)


def ste(cnp.ndarray grad, cnp.ndarray mask, cnp.ndarray y, int nthreads):
    """Straight-through backward y = grad * mask (y may alias grad).

    grad, y: C-contiguous float32 / float64 of one dtype and size; mask:
    C-contiguous uint8 / bool of that size.  (Raw data pointers: this is on
    the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(grad)
    _check_flat(grad)
    _check_dest(y, grad)
    if mask is None or not cnp.PyArray_IS_C_CONTIGUOUS(mask) or cnp.PyArray_ITEMSIZE(mask) != 1 \
            or cnp.PyArray_SIZE(mask) != n:
        raise ValueError(f"expected a C-contiguous uint8 mask of {n} elements")
    cdef const unsigned char* mp = <const unsigned char*>cnp.PyArray_DATA(mask)
    if n == 0:
        return
    if cnp.PyArray_TYPE(grad) == cnp.NPY_FLOAT32:
        with nogil:
            _ste_run(<const float*>cnp.PyArray_DATA(grad), mp, <float*>cnp.PyArray_DATA(y), n,
                     nthreads)
    else:
        with nogil:
            _ste_run(<const double*>cnp.PyArray_DATA(grad), mp, <double*>cnp.PyArray_DATA(y),
                     n, nthreads)


# ---------------------------------------------------------------- min / max
cdef int _minmax_run(const floating* xp, Units L, int nthreads, floating* lo, floating* hi,
                     unsigned char* flags) noexcept nogil:
    """(lo, hi, flags)[C] of the view L, folded in unit order (the caller
    initialises them to (+inf, -inf, 0)); -1 when out of memory."""
    cdef int64_t u, j, c, C = L.C
    cdef int64_t width = 1 if L.nblk else C   # partial results per unit
    cdef Unit un
    cdef floating* plo
    cdef floating* phi
    cdef unsigned char* pfl
    cdef floating l1, h1
    cdef unsigned char f1
    if L.n == 1 and L.nblk:
        un = _unit(&L, 0)
        minmax_block(xp + un.start, un.count, &l1, &h1, &f1)
        qc_mm_fold(&lo[un.channel], &hi[un.channel], &flags[un.channel], l1, h1, f1)
        return 0
    plo = <floating*>malloc(L.n * width * sizeof(floating))
    phi = <floating*>malloc(L.n * width * sizeof(floating))
    pfl = <unsigned char*>malloc(L.n * width)
    if plo == NULL or phi == NULL or pfl == NULL:
        free(plo)
        free(phi)
        free(pfl)
        return -1
    for u in prange(L.n, schedule='static', num_threads=nthreads):
        un = _unit(&L, u)
        if un.channel >= 0:
            minmax_block(xp + un.start, un.count, &plo[u], &phi[u], &pfl[u])
        else:
            for j in range(C):
                plo[u * C + j] = <floating>INFINITY_F
                phi[u * C + j] = -<floating>INFINITY_F
                pfl[u * C + j] = 0
            minmax_rowvec(xp + un.start, un.count, C, &plo[u * C], &phi[u * C], &pfl[u * C])
    for u in range(L.n):
        if L.nblk:
            c = (u // L.nblk) % C
            qc_mm_fold(&lo[c], &hi[c], &flags[c], plo[u], phi[u], pfl[u])
        else:
            for j in range(C):
                qc_mm_fold(&lo[j], &hi[j], &flags[j], plo[u * C + j], phi[u * C + j],
                           pfl[u * C + j])
    free(plo)
    free(phi)
    free(pfl)
    return 0


def minmax(cnp.ndarray x, int nthreads):
    """Per-tensor (min, max, flags) of a C-contiguous float32 / float64 array
    in one pass; flags = QC_MM_* bits.

    The min / max skip NaN; ``minmax_finish`` turns them into NaN when the
    NaN flag is set and fixes the sign of a zero result.  An empty x gives
    (+inf, -inf, 0).  (Raw data pointers and no allocation for inputs of one
    work unit: this is on the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef float lo32 = INFINITY_F, hi32 = -INFINITY_F
    cdef double lo64 = INFINITY_F, hi64 = -INFINITY_F
    cdef unsigned char fl = 0
    cdef int status = 0
    _check_flat(x)
    if n == 0:
        return lo64, hi64, 0
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            status = _minmax_run(<const float*>cnp.PyArray_DATA(x), _units(1, 1, n), nthreads,
                                 &lo32, &hi32, &fl)
        lo64, hi64 = lo32, hi32
    else:
        with nogil:
            status = _minmax_run(<const double*>cnp.PyArray_DATA(x), _units(1, 1, n), nthreads,
                                 &lo64, &hi64, &fl)
    if status != 0:
        raise MemoryError()
    return lo64, hi64, int(fl)


def minmax_finished(cnp.ndarray x, int nthreads, bint omit_nan):
    """Per-tensor (min, max) with the NaN / signed-zero rule applied
    (qc_minmax_finish): NaN when x holds a NaN (unless ``omit_nan``),
    ``-0.0 < +0.0``.  Values as Python floats, exact in x's dtype."""
    lo, hi, fl = minmax(x, nthreads)
    cdef unsigned flags = fl & (~QC_MM_NAN if omit_nan else 0xFF)
    cdef float lo32, hi32
    cdef double lo64 = lo, hi64 = hi
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        lo32, hi32 = lo64, hi64
        qc_minmax_finish(&lo32, &hi32, flags)
        return lo32, hi32
    qc_minmax_finish(&lo64, &hi64, flags)
    return lo64, hi64


def minmax_channels(const floating[::1] x, int64_t outer, int64_t C, int64_t inner,
                    int nthreads):
    """Per-channel (min[C], max[C], flags[C]) of the (outer, C, inner) view."""
    dtype = np.float32 if floating is float else np.float64
    out_lo = np.full(C, np.inf, dtype=dtype)
    out_hi = np.full(C, -np.inf, dtype=dtype)
    out_fl = np.zeros(C, dtype=np.uint8)
    cdef floating[::1] olo = out_lo
    cdef floating[::1] ohi = out_hi
    cdef unsigned char[::1] ofl = out_fl
    cdef int status
    if x.shape[0] == 0 or C == 0:
        return out_lo, out_hi, out_fl
    with nogil:
        status = _minmax_run(&x[0], _units(outer, C, inner), nthreads, &olo[0], &ohi[0],
                             &ofl[0])
    if status != 0:
        raise MemoryError()
    return out_lo, out_hi, out_fl


def minmax_finish(floating[::1] lo, floating[::1] hi, const unsigned char[::1] flags):
    """In place: NaN if the NaN flag is set; the sign of a zero result fixed
    so that -0.0 < +0.0 (qc_minmax_finish)."""
    cdef int64_t c
    for c in range(lo.shape[0]):
        qc_minmax_finish(&lo[c], &hi[c], flags[c])


# ---------------------------------------------------------------- histogram
cdef struct HistcArgs:
    float lo, hi
    int bins, absolute, skip_zeros
    int64_t* counts      # thread t's two sub-histograms at counts + t * 2 * bins


cdef void _histc_share(const float* xp, int64_t cnt, int t, void* ctx) noexcept nogil:
    """histc_block on thread t's share (run_shares)."""
    cdef const HistcArgs* a = <const HistcArgs*>ctx
    histc_block(xp, cnt, a.lo, a.hi, a.bins, a.absolute, a.skip_zeros,
                a.counts + <int64_t>t * 2 * a.bins)


def histc_f32(cnp.ndarray x, int bins, float lo, float hi, bint absolute, bint skip_zeros,
              int nthreads):
    """``torch.histc(x, bins, lo, hi)`` counts (int64[bins]) of a C-contiguous
    float32 array in one pass (qc_histc_bin_f32, with lo and hi already
    chosen as torch chooses them): NaN and values outside [lo, hi] are not
    counted; ``absolute`` bins |x|; ``skip_zeros`` skips zeros.  Each
    thread counts a contiguous share into its own histograms; integer
    counts make the result independent of the thread count."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISCARRAY_RO(x):
        raise ValueError("histc_f32: expected an aligned C-contiguous float32 array")
    if bins < 1:
        raise ValueError(f"histc_f32: bins must be >= 1, got {bins}")
    if not lo <= hi:
        raise ValueError(f"histc_f32: need lo <= hi, got [{lo}, {hi}]")
    nthreads = share_threads(n, nthreads)
    parts_a = np.zeros((nthreads, 2 * bins), dtype=np.int64)
    cdef int64_t[:, ::1] parts = parts_a
    cdef HistcArgs a
    a.lo, a.hi, a.bins, a.absolute, a.skip_zeros = lo, hi, bins, absolute, skip_zeros
    a.counts = &parts[0, 0]
    with nogil:
        run_shares(_histc_share, <const float*>cnp.PyArray_DATA(x), n, nthreads, &a)
    return parts_a.reshape(nthreads * 2, bins).sum(axis=0)


# ------------------------------------------------------- statistics -> qparams
#: qparams scheme name -> (id, number of outputs) (qc_qparams.h, QC_QP_SCHEMES)
QP_SCHEMES = {qc_qp_scheme_names[i].decode(): (i, qc_qp_scheme_nout[i])
              for i in range(QC_QP_COUNT)}


def qparams(int scheme, const floating[::1] a, const floating[::1] b, double qmin, double qmax,
            double eps, int num_bits, int flags):
    """Scheme ``scheme`` (``QP_SCHEMES``) over the C channels of a (and b;
    None for schemes of one input): float64[NOUT, C], output j at row j."""
    cdef int64_t C = a.shape[0]
    if not 0 <= scheme < QC_QP_COUNT:
        raise ValueError(f"qparams: unknown scheme {scheme}")
    if b is not None and b.shape[0] != C:
        raise ValueError(f"qparams: the two inputs have {C} and {b.shape[0]} channels")
    out_a = np.empty((qc_qp_scheme_nout[scheme], C), dtype=np.float64)
    cdef double[:, ::1] out = out_a
    cdef QcQpArgs g
    g.qmin, g.qmax, g.eps, g.num_bits, g.flags = qmin, qmax, eps, num_bits, flags
    cdef const floating* bp = NULL
    if b is not None and C:
        bp = &b[0]
    if C:
        qc_qparams_run(scheme, &a[0], bp, C, g, &out[0, 0])
    return out_a


def affine_qparams(const float[::1] lo, const float[::1] hi, int64_t qmin, int64_t qmax,
                   float eps):
    """(scale float32[C], zero_point int64[C]) by qc_affine_qparams_f32."""
    cdef int64_t c, n = lo.shape[0]
    scale = np.empty(n, dtype=np.float32)
    zp = np.empty(n, dtype=np.int64)
    cdef float[::1] s = scale
    cdef int64_t[::1] z = zp
    for c in range(n):
        qc_affine_qparams_f32(lo[c], hi[c], qmin, qmax, eps, &s[c], &z[c])
    return scale, zp


def symmetric_scale(const float[::1] lo, const float[::1] hi, int64_t qmin, int64_t qmax,
                    float eps):
    """scale float32[C] by qc_symmetric_scale_f32."""
    cdef int64_t c, n = lo.shape[0]
    scale = np.empty(n, dtype=np.float32)
    cdef float[::1] s = scale
    for c in range(n):
        s[c] = qc_symmetric_scale_f32(lo[c], hi[c], qmin, qmax, eps)
    return scale


def ma_update(float[::1] m, const float[::1] x, float c):
    """In place m = qc_ma_update_f32(m, x, c) (PyTorch's moving average)."""
    cdef int64_t i
    for i in range(m.shape[0]):
        m[i] = qc_ma_update_f32(m[i], x[i], c)


def running_minmax(const float[::1] m_lo, const float[::1] m_hi, const float[::1] lo,
                   const float[::1] hi):
    """(qc_running_min_f32(m_lo, lo), qc_running_max_f32(m_hi, hi)) elementwise,
    as new float32 arrays (a min / max observer's update)."""
    cdef int64_t i, n = m_lo.shape[0]
    if m_hi.shape[0] != n or lo.shape[0] != n or hi.shape[0] != n:
        raise ValueError("running_minmax: all four arrays must have one length")
    new_lo = np.empty(n, dtype=np.float32)
    new_hi = np.empty(n, dtype=np.float32)
    cdef float[::1] rl = new_lo
    cdef float[::1] rh = new_hi
    for i in range(n):
        rl[i] = qc_running_min_f32(m_lo[i], lo[i])
        rh[i] = qc_running_max_f32(m_hi[i], hi[i])
    return new_lo, new_hi


def observe_update(int mode, bint first, float c, float d, float[::1] smin, float[::1] smax,
                   const float[::1] lo, const float[::1] hi):
    """In place, per channel: (smin, smax) = qc_observe_update(mode, first, c,
    d, lo, hi) -- an observer's update by its rule (qc_minmax.h), the one
    the GPU's reductions apply in their last block.  With
    ``OBS_FIRST_IF_EMPTY`` in mode the first-batch rule is per channel by
    the state's values and ``first`` is not used."""
    cdef int64_t i, n = smin.shape[0]
    if smax.shape[0] != n or lo.shape[0] != n or hi.shape[0] != n:
        raise ValueError("observe_update: all four arrays must have one length")
    cdef bint by_value = (mode & QC_OBS_FIRST_IF_EMPTY) != 0
    for i in range(n):
        qc_observe_update(mode, qc_obs_first(mode, 0 if first else 1, smin[i], smax[i])
                          if by_value else first, c, d, lo[i], hi[i], &smin[i], &smax[i])


# -------------------------------------------------------- fused FakeQuantize
cdef enum:
    ST_OBSERVED = 0
    ST_NONFINITE_SKIPPED = 1
    ST_NONFINITE_REFUSED = 2
    ST_NOT_OBSERVED = 3
    ST_NO_MEMORY = 4

#: status codes of observe_fake_quant_f32
OBSERVED, NONFINITE_SKIPPED, NONFINITE_REFUSED, NOT_OBSERVED = (
    ST_OBSERVED, ST_NONFINITE_SKIPPED, ST_NONFINITE_REFUSED, ST_NOT_OBSERVED)

cdef int AFFINE = FAMILIES["affine"]


def observe_fake_quant_f32(cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask,
                           cnp.ndarray state, int rule, float c, int nan_policy,
                           cnp.ndarray qparams_out, cnp.ndarray zp_out,
                           int64_t qmin, int64_t qmax, float eps, int symmetric,
                           int64_t zp_fixed, int quantize, int mode, int nthreads):
    """FakeQuantize's per-tensor float32 step in one call: observe, qparams,
    fake quant (two passes over x, no temporaries).

    All arrays must be C-contiguous with the dtypes below (the caller,
    ``FakeQuantize._forward_fused``, guarantees it; they are checked here
    cheaply): x, y float32[n] (y may be x), mask uint8[n] or None,
    state = float32[3] [min, max, batches seen (0 / 1)], qparams_out
    float32[1] (scale), zp_out int64[1].  rule: ``OBS_MINMAX`` or
    ``OBS_MOVING_AVG`` with c (qc_observe_update), or 0 not to observe;
    nan_policy: 0 skip, 1 propagate, 2 refuse (return NONFINITE_REFUSED,
    nothing written).  qparams (qc_qparams) are recomputed from the state
    whenever it is observed and used for the fake quant when ``quantize``.
    Returns a status code.  (Raw data pointers rather than typed
    memoryviews: this entry point is on the per-step path, where six buffer
    acquisitions would cost more than the kernel at 1 Ki elements.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef int status
    _check_f32(x, n, False)
    _check_f32(y, n, True)
    _check_f32(state, 3, True)
    _check_f32(qparams_out, 1, True)
    if cnp.PyArray_TYPE(zp_out) != cnp.NPY_INT64 or cnp.PyArray_SIZE(zp_out) < 1 or \
            not cnp.PyArray_ISCARRAY(zp_out):
        raise ValueError("zp_out must be a writable contiguous int64[1] array")
    cdef unsigned char* mp = NULL
    if mask is not None:
        if cnp.PyArray_TYPE(mask) != cnp.NPY_UINT8 or cnp.PyArray_SIZE(mask) != n or \
                not cnp.PyArray_ISCARRAY(mask):
            raise ValueError("mask must be a writable contiguous uint8 array like x")
        mp = <unsigned char*>cnp.PyArray_DATA(mask)
    cdef const float* xp = <const float*>cnp.PyArray_DATA(x)
    cdef float* yp = <float*>cnp.PyArray_DATA(y)
    cdef float* sp = <float*>cnp.PyArray_DATA(state)
    cdef float* qp = <float*>cnp.PyArray_DATA(qparams_out)
    cdef int64_t* zp = <int64_t*>cnp.PyArray_DATA(zp_out)
    with nogil:
        status = _observe_fake_quant(xp, yp, mp, n, sp, rule, c, nan_policy, qp, zp, qmin,
                                     qmax, eps, symmetric, zp_fixed, quantize, mode, nthreads)
    if status == ST_NO_MEMORY:
        raise MemoryError()
    return status


cdef inline int _check_f32(cnp.ndarray a, int64_t n, bint writable) except -1:
    if cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or cnp.PyArray_SIZE(a) < n or \
            not cnp.PyArray_ISCARRAY_RO(a) or (writable and not cnp.PyArray_ISWRITEABLE(a)):
        raise ValueError(f"expected a {'writable ' if writable else ''}aligned C-contiguous "
                         f"float32 array of at least {n} elements")
    return 0


cdef int _observe_fake_quant(const float* xp, float* yp, unsigned char* mp, int64_t n,
                             float* state, int rule, float c, int nan_policy,
                             float* scale_out, int64_t* zp_out, int64_t qmin, int64_t qmax,
                             float eps, int symmetric, int64_t zp_fixed, int quantize,
                             int mode, int nthreads) noexcept nogil:
    cdef float lo = INFINITY_F, hi = -INFINITY_F
    cdef float params[3]
    cdef unsigned char flags = 0
    cdef int status = ST_NOT_OBSERVED
    if rule != QC_OBS_NONE and n > 0:
        if _minmax_run(xp, _units(1, 1, n), nthreads, &lo, &hi, &flags) != 0:
            return ST_NO_MEMORY
        qc_minmax_finish(&lo, &hi, flags)
        status = ST_OBSERVED
        if qc_mm_nonfinite(lo, hi, flags):
            if nan_policy == 0:
                status = ST_NONFINITE_SKIPPED
            elif nan_policy == 2:
                return ST_NONFINITE_REFUSED
        if status == ST_OBSERVED:
            qc_observe_update(rule, state[2] == 0, c, 0.0, lo, hi, &state[0], &state[1])
            state[2] += 1
            qc_qparams(state[0], state[1], QC_QS_SYMMETRIC if symmetric else QC_QS_AFFINE, eps,
                       qmin, qmax, zp_fixed, scale_out, zp_out)
    if quantize and n > 0:
        params[0] = scale_out[0]
        params[1] = <float>1.0 / params[0]
        params[2] = <float>zp_out[0]
        _ew_run(AFFINE, xp, yp, mp, _units(1, 1, n), params, <float>qmin, <float>qmax, mode,
                nthreads)
    return status


# ------------------------------------------------ exported tables (issue 28)
# The headers' X-macro tables, exported as they are compiled (no copy in
# Python, no reading of header text): the rounding modes and affine mode
# bits (qc_elementwise.h), and the C++ type of every table entry, which
# quantcore_gpu.kernels instantiates.
cdef extern from *:
    """
    #include "qc_elementwise.h"
    #include "qc_families.h"
    #include "qc_qparams.h"
    #define QC_X_TYPE_NAME(name, Type) #Type,
    #define QC_X_ROUND_NAME(name, id) #name,
    #define QC_X_ROUND_ID(name, id) id,
    static const char *const qc_rounding_names[] = {QC_ROUNDING_MODES(QC_X_ROUND_NAME)};
    static const int qc_rounding_ids[] = {QC_ROUNDING_MODES(QC_X_ROUND_ID)};
    static const int qc_rounding_count = (int)(sizeof(qc_rounding_ids) / sizeof(int));
    static const char *const qc_ew_family_types[] = {QC_EW_FAMILIES(QC_X_TYPE_NAME)};
    static const char *const qc_qp_scheme_types[] = {QC_QP_SCHEMES(QC_X_TYPE_NAME)};
    static const char *const qc_encode_family_types[] = {QC_ENCODE_FAMILIES(QC_X_TYPE_NAME)};
    static const char *const qc_decode_family_types[] = {QC_DECODE_FAMILIES(QC_X_TYPE_NAME)};
    static const char *const qc_group_recipe_types[] = {QC_GROUP_RECIPES(QC_X_TYPE_NAME)};
    static const char *const qc_block_recipe_types[] = {QC_BLOCK_RECIPES(QC_X_TYPE_NAME)};
    """
    const char* qc_rounding_names[]
    const int qc_rounding_ids[]
    const int qc_rounding_count
    const char* qc_ew_family_types[]
    const char* qc_qp_scheme_types[]
    const char* qc_encode_family_types[]
    const char* qc_decode_family_types[]
    const char* qc_group_recipe_types[]
    const char* qc_block_recipe_types[]
    int QC_ROUND_MASK, QC_ZP_BEFORE, QC_DIVIDE, QC_DEQUANT_WIDE, QC_NF_PROPAGATE
    int QC_NF_NAN_TO_QMIN, QC_NF_INT64, QC_OUTPUT_Q, QC_NO_ZERO_POINT, QC_FMA_ZP
    int QC_DEQUANT_NARROW, QC_ROUND_F32, QC_NUDGED_DIVIDE, QC_NUDGED_TF


#: rounding mode name -> id (qc_elementwise.h, QC_ROUNDING_MODES), in its order
ROUNDING_MODES = {qc_rounding_names[i].decode(): qc_rounding_ids[i]
                  for i in range(qc_rounding_count)}
#: the affine and nudged recipes' mode bits (qc_elementwise.h QC_<NAME>)
MODE_BITS = dict(ROUND_MASK=QC_ROUND_MASK, ZP_BEFORE=QC_ZP_BEFORE, DIVIDE=QC_DIVIDE,
                 DEQUANT_WIDE=QC_DEQUANT_WIDE, NF_PROPAGATE=QC_NF_PROPAGATE,
                 NF_NAN_TO_QMIN=QC_NF_NAN_TO_QMIN, NF_INT64=QC_NF_INT64,
                 OUTPUT_Q=QC_OUTPUT_Q, NO_ZERO_POINT=QC_NO_ZERO_POINT, FMA_ZP=QC_FMA_ZP,
                 DEQUANT_NARROW=QC_DEQUANT_NARROW, ROUND_F32=QC_ROUND_F32,
                 NUDGED_DIVIDE=QC_NUDGED_DIVIDE, NUDGED_TF=QC_NUDGED_TF)
#: table -> {entry name: its C++ type} (the CUDA instantiations' arguments)
TYPE_NAMES = {
    "ew": {n: qc_ew_family_types[i].decode() for n, i in FAMILIES.items()},
    "qparams": {n: qc_qp_scheme_types[i].decode() for n, (i, _) in QP_SCHEMES.items()},
    "encode": {n: qc_encode_family_types[i].decode() for n, i in ENCODE_FAMILIES.items()},
    "decode": {n: qc_decode_family_types[i].decode() for n, i in DECODE_FAMILIES.items()},
    "group": {n: qc_group_recipe_types[i].decode() for n, i in GROUP_RECIPES.items()},
    "block": {n: qc_block_recipe_types[i].decode() for n, i in BLOCK_RECIPES.items()}}
#: encode / decode family name -> (per-channel parameters, code widths: 1, 2 or 3 for both)
CODE_FAMILY_INFO = {
    "encode": {n: (qc_encode_family_np[i], qc_encode_family_bytes[i])
               for n, i in ENCODE_FAMILIES.items()},
    "decode": {n: (qc_decode_family_np[i], qc_decode_family_bytes[i])
               for n, i in DECODE_FAMILIES.items()}}
