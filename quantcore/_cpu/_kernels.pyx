# cython: language_level=3
"""CPU kernels: OpenMP block loops over the formulas of qc_elementwise.h.

Every function here takes C-contiguous 1-D views of already validated data
(the Python layer in ``quantcore/ops.py`` validates, converts and
allocates) plus ``nthreads``, resolved in Python once per call.  Per-channel
work sees the data as a C-ordered ``(outer, C, inner)`` view, so any axis is
handled without a transposed copy.

Work is split into units of at most ``BLOCK`` contiguous elements; each unit
is one iteration of a static ``prange``.  Reductions write one partial per
unit and fold the partials in unit order, so results do not depend on the
number of threads.
"""
import numpy as np

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t
from libc.math cimport isinf
from libc.stdlib cimport free, malloc

ctypedef fused floating:
    float
    double

cdef extern from "qc_omp.h" nogil:
    int qc_openmp_enabled()
    int qc_omp_max_threads()

cdef extern from "qc_elementwise.h" nogil:
    float qc_ma_update_f32(float m, float x, float c)
    float qc_running_min_f32(float m, float v)
    float qc_running_max_f32(float m, float v)
    void qc_affine_qparams_f32(float mn, float mx, int64_t qmin, int64_t qmax, float eps,
                               float* scale, int64_t* zp)
    float qc_symmetric_scale_f32(float mn, float mx, int64_t qmin, int64_t qmax, float eps)

# the loops, through qc_dispatch.h's run-time choice between the baseline and
# the AVX2 + FMA build of the same source (qcd_* dispatchers)
cdef extern from "qc_dispatch.h" nogil:
    int QC_MM_NAN
    int qc_simd_v3
    int qc_simd_select(int allow)
    int qc_simd_v3_built()
    void qc_affine_block_f32 "qcd_qc_affine_block_f32"(
        const float*, float*, unsigned char*, int64_t, float, float, float, float, float, int)
    void qc_affine_block_f64 "qcd_qc_affine_block_f64"(
        const double*, double*, unsigned char*, int64_t, double, double, double, double, double,
        int)
    void qc_affine_exact_range_f32 "qcd_qc_affine_exact_range_f32"(
        const float*, float*, unsigned char*, int64_t, int64_t, int64_t, int64_t, const float*,
        const float*, const double*, double, double, int)
    void qc_affine_exact_range_f64 "qcd_qc_affine_exact_range_f64"(
        const double*, double*, unsigned char*, int64_t, int64_t, int64_t, int64_t, const double*,
        const double*, const double*, double, double, int)
    void qc_affine_rowvec_f32 "qcd_qc_affine_rowvec_f32"(
        const float*, float*, unsigned char*, int64_t, int64_t, const float*, const float*,
        const float*, float, float, int)
    void qc_affine_rowvec_f64 "qcd_qc_affine_rowvec_f64"(
        const double*, double*, unsigned char*, int64_t, int64_t, const double*, const double*,
        const double*, double, double, int)
    void qc_nudged_block_f32 "qcd_qc_nudged_block_f32"(
        const float*, float*, unsigned char*, int64_t, float, float, float, float, float, int)
    void qc_nudged_block_f64 "qcd_qc_nudged_block_f64"(
        const double*, double*, unsigned char*, int64_t, double, double, double, double, double,
        int)
    void qc_nudged_rowvec_f32 "qcd_qc_nudged_rowvec_f32"(
        const float*, float*, unsigned char*, int64_t, int64_t, const float*, const float*,
        const float*, const float*, const float*, int)
    void qc_nudged_rowvec_f64 "qcd_qc_nudged_rowvec_f64"(
        const double*, double*, unsigned char*, int64_t, int64_t, const double*, const double*,
        const double*, const double*, const double*, int)
    void qc_amax_block_f32 "qcd_qc_amax_block_f32"(
        const float*, float*, unsigned char*, int64_t, float, float, float, float, float)
    void qc_amax_block_f64 "qcd_qc_amax_block_f64"(
        const double*, double*, unsigned char*, int64_t, double, double, double, double, double)
    void qc_amax_rowvec_f32 "qcd_qc_amax_rowvec_f32"(
        const float*, float*, unsigned char*, int64_t, int64_t, const float*, const float*, float,
        float, const float*)
    void qc_amax_rowvec_f64 "qcd_qc_amax_rowvec_f64"(
        const double*, double*, unsigned char*, int64_t, int64_t, const double*, const double*,
        double, double, const double*)
    void qc_ste_block_f32 "qcd_qc_ste_block_f32"(
        const float*, const unsigned char*, float*, int64_t)
    void qc_ste_block_f64 "qcd_qc_ste_block_f64"(
        const double*, const unsigned char*, double*, int64_t)
    void qc_minmax_block_f32 "qcd_qc_minmax_block_f32"(
        const float*, int64_t, float*, float*, unsigned char*)
    void qc_minmax_block_f64 "qcd_qc_minmax_block_f64"(
        const double*, int64_t, double*, double*, unsigned char*)
    void qc_minmax_fold_f32(float*, float*, unsigned char*, float, float, unsigned char)
    void qc_minmax_fold_f64(double*, double*, unsigned char*, double, double, unsigned char)
    void qc_minmax_rowvec_f32 "qcd_qc_minmax_rowvec_f32"(
        const float*, int64_t, int64_t, float*, float*, unsigned char*)
    void qc_minmax_rowvec_f64 "qcd_qc_minmax_rowvec_f64"(
        const double*, int64_t, int64_t, double*, double*, unsigned char*)
    void qc_minmax_finish_f32(float*, float*, unsigned char)
    void qc_minmax_finish_f64(double*, double*, unsigned char)
    void qc_histc_block_f32 "qcd_qc_histc_block_f32"(
        const float*, int64_t, float, float, int, int, int, int64_t*)

cnp.import_array()

import os as _os

qc_simd_select(_os.environ.get("QUANTCORE_SIMD", "").strip().lower() != "baseline")


def simd_variant():
    """The build of the loops in use: "x86-64-v3" (AVX2 + FMA, chosen at run
    time when the CPU has them) or "baseline"."""
    return "x86-64-v3" if qc_simd_v3 else "baseline"


def simd_v3_built():
    """Whether the AVX2 + FMA build of the loops was compiled in."""
    return bool(qc_simd_v3_built())


def select_simd(bint allow_v3):
    """Choose the build of the loops (for tests, which compare the two bit
    for bit; not for use while other threads run kernels).  Returns
    :func:`simd_variant`."""
    qc_simd_select(allow_v3)
    return simd_variant()

cdef float INFINITY_F = float("inf")

#: elements per work unit: large enough to amortise scheduling, small
#: enough that 2 threads share 1 Mi elements evenly.
cdef int64_t BLOCK = 32768
#: rows of the rowvec layout per unit hold about BLOCK elements
cdef inline int64_t _rows_per_unit(int64_t C) noexcept nogil:
    return BLOCK // C if C < BLOCK else 1


def openmp_enabled():
    """True when the extension was compiled with OpenMP."""
    return bool(qc_openmp_enabled())


def omp_max_threads():
    """omp_get_max_threads(): honours OMP_NUM_THREADS and threadpoolctl."""
    return qc_omp_max_threads()


def block_size():
    return BLOCK


cdef inline unsigned char* _base(unsigned char[::1] mask):
    """Pointer to the mask data, or NULL for no mask."""
    if mask is None or mask.shape[0] == 0:
        return NULL
    return &mask[0]


cdef inline unsigned char* _off(unsigned char* p, int64_t k) noexcept nogil:
    return p + k if p != NULL else NULL


# ---------------------------------------------------------------- min / max
cdef int _minmax_flat(const floating* xp, int64_t n, int nthreads, floating* lo, floating* hi,
                      unsigned char* flags) noexcept nogil:
    """Per-tensor folded (lo, hi, flags) of n contiguous values; -1 if out of
    memory.  One work unit is reduced in place; several reduce into one
    partial each (in parallel) and are folded in unit order, so the result
    does not depend on the thread count."""
    cdef int64_t nunits = (n + BLOCK - 1) // BLOCK
    cdef int64_t u, start, cnt
    cdef floating* plo
    cdef floating* phi
    cdef unsigned char* pfl
    lo[0] = <floating>INFINITY_F
    hi[0] = -<floating>INFINITY_F
    flags[0] = 0
    if n <= 0:
        return 0
    if nunits == 1:
        if floating is float:
            qc_minmax_block_f32(xp, n, lo, hi, flags)
        else:
            qc_minmax_block_f64(xp, n, lo, hi, flags)
        return 0
    plo = <floating*>malloc(nunits * sizeof(floating))
    phi = <floating*>malloc(nunits * sizeof(floating))
    pfl = <unsigned char*>malloc(nunits)
    if plo == NULL or phi == NULL or pfl == NULL:
        free(plo)
        free(phi)
        free(pfl)
        return -1
    for u in prange(nunits, schedule='static', num_threads=nthreads):
        start = u * BLOCK
        cnt = n - start
        if cnt > BLOCK:
            cnt = BLOCK
        if floating is float:
            qc_minmax_block_f32(xp + start, cnt, &plo[u], &phi[u], &pfl[u])
        else:
            qc_minmax_block_f64(xp + start, cnt, &plo[u], &phi[u], &pfl[u])
    for u in range(nunits):
        if floating is float:
            qc_minmax_fold_f32(lo, hi, flags, plo[u], phi[u], pfl[u])
        else:
            qc_minmax_fold_f64(lo, hi, flags, plo[u], phi[u], pfl[u])
    free(plo)
    free(phi)
    free(pfl)
    return 0


cdef inline int _check_flat(cnp.ndarray x) except -1:
    """x must be a C-contiguous, aligned float32 / float64 array."""
    if not cnp.PyArray_ISCARRAY_RO(x) or (cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 and
                                           cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT64):
        raise ValueError("expected an aligned C-contiguous float32 or float64 array")
    return 0


def minmax(cnp.ndarray x, int nthreads):
    """Per-tensor (min, max, flags) of a C-contiguous float32 / float64 array
    in one pass; flags = QC_MM_* bits.

    The min / max skip NaN; ``minmax_finish`` turns them into NaN when the NaN flag
    is set and fixes the sign of a zero result.  An empty x gives
    (+inf, -inf, 0).  (Raw data pointers and no allocation for inputs of one
    work unit: this is on the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef float lo32, hi32
    cdef double lo64, hi64
    cdef unsigned char fl
    cdef int status
    _check_flat(x)
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            status = _minmax_flat(<const float*>cnp.PyArray_DATA(x), n, nthreads, &lo32, &hi32, &fl)
        lo64, hi64 = lo32, hi32
    else:
        with nogil:
            status = _minmax_flat(<const double*>cnp.PyArray_DATA(x), n, nthreads, &lo64, &hi64,
                                  &fl)
    if status != 0:
        raise MemoryError()
    return lo64, hi64, int(fl)


def minmax_finished(cnp.ndarray x, int nthreads, bint omit_nan):
    """Per-tensor (min, max) with the NaN / signed-zero rule applied
    (qc_minmax_finish): NaN when x holds a NaN (unless ``omit_nan``),
    ``-0.0 < +0.0``.  Values as Python floats, exact in x's dtype."""
    lo, hi, fl = minmax(x, nthreads)
    cdef unsigned char flags = fl & (~QC_MM_NAN if omit_nan else 0xFF)
    cdef float lo32, hi32
    cdef double lo64 = lo, hi64 = hi
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        lo32, hi32 = lo64, hi64
        qc_minmax_finish_f32(&lo32, &hi32, flags)
        return lo32, hi32
    qc_minmax_finish_f64(&lo64, &hi64, flags)
    return lo64, hi64


def minmax_channels(const floating[::1] x, int64_t outer, int64_t C, int64_t inner,
                    int nthreads):
    """Per-channel (min[C], max[C], flags[C]) of the (outer, C, inner) view."""
    cdef int64_t rows, nblk, nunits, u, r, b, start, cnt, c, row_start, nrows
    cdef const floating* xp
    dtype = np.float32 if floating is float else np.float64
    if inner > 1 or C == 0:
        rows = outer * C
        nblk = (inner + BLOCK - 1) // BLOCK if inner > 0 else 0
        nunits = rows * nblk
        lo_a = np.full(max(nunits, 1), np.inf, dtype=dtype)
        hi_a = np.full(max(nunits, 1), -np.inf, dtype=dtype)
        fl_a = np.zeros(max(nunits, 1), dtype=np.uint8)
    else:
        nrows = _rows_per_unit(C)
        nunits = (outer + nrows - 1) // nrows
        lo_a = np.full((max(nunits, 1), C), np.inf, dtype=dtype)
        hi_a = np.full((max(nunits, 1), C), -np.inf, dtype=dtype)
        fl_a = np.zeros((max(nunits, 1), C), dtype=np.uint8)
    cdef floating[::1] lo1
    cdef floating[::1] hi1
    cdef unsigned char[::1] fl1
    cdef floating[:, ::1] lo2
    cdef floating[:, ::1] hi2
    cdef unsigned char[:, ::1] fl2
    out_lo = np.full(C, np.inf, dtype=dtype)
    out_hi = np.full(C, -np.inf, dtype=dtype)
    out_fl = np.zeros(C, dtype=np.uint8)
    cdef floating[::1] olo = out_lo
    cdef floating[::1] ohi = out_hi
    cdef unsigned char[::1] ofl = out_fl
    if x.shape[0] == 0 or C == 0:
        return out_lo, out_hi, out_fl
    xp = &x[0]
    if inner > 1:
        lo1 = lo_a
        hi1 = hi_a
        fl1 = fl_a
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            r = u // nblk
            b = u - r * nblk
            start = b * BLOCK
            cnt = inner - start
            if cnt > BLOCK:
                cnt = BLOCK
            if floating is float:
                qc_minmax_block_f32(xp + r * inner + start, cnt, &lo1[u], &hi1[u], &fl1[u])
            else:
                qc_minmax_block_f64(xp + r * inner + start, cnt, &lo1[u], &hi1[u], &fl1[u])
        for u in range(nunits):
            c = (u // nblk) % C
            if floating is float:
                qc_minmax_fold_f32(&olo[c], &ohi[c], &ofl[c], lo1[u], hi1[u], fl1[u])
            else:
                qc_minmax_fold_f64(&olo[c], &ohi[c], &ofl[c], lo1[u], hi1[u], fl1[u])
    else:
        lo2 = lo_a
        hi2 = hi_a
        fl2 = fl_a
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            row_start = u * nrows
            cnt = outer - row_start
            if cnt > nrows:
                cnt = nrows
            if floating is float:
                qc_minmax_rowvec_f32(xp + row_start * C, cnt, C, &lo2[u, 0], &hi2[u, 0],
                                     &fl2[u, 0])
            else:
                qc_minmax_rowvec_f64(xp + row_start * C, cnt, C, &lo2[u, 0], &hi2[u, 0],
                                     &fl2[u, 0])
        for u in range(nunits):
            for c in range(C):
                if floating is float:
                    qc_minmax_fold_f32(&olo[c], &ohi[c], &ofl[c], lo2[u, c], hi2[u, c],
                                       fl2[u, c])
                else:
                    qc_minmax_fold_f64(&olo[c], &ohi[c], &ofl[c], lo2[u, c], hi2[u, c],
                                       fl2[u, c])
    return out_lo, out_hi, out_fl


def minmax_finish(floating[::1] lo, floating[::1] hi, const unsigned char[::1] flags):
    """In place: NaN if the NaN flag is set; the sign of a zero result fixed
    so that -0.0 < +0.0 (see qc_minmax_finish in qc_cpu_loops.h)."""
    cdef int64_t c
    for c in range(lo.shape[0]):
        if floating is float:
            qc_minmax_finish_f32(&lo[c], &hi[c], flags[c])
        else:
            qc_minmax_finish_f64(&lo[c], &hi[c], flags[c])


# ------------------------------------------------------------ affine family
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


def fq_affine(cnp.ndarray x, cnp.ndarray y, cnp.ndarray mask,
              double scale, double inv, double zp, double qmin, double qmax,
              int mode, int nthreads):
    """Per-tensor affine fake quant (qc_fq_affine) of x into y (may alias).

    x, y: C-contiguous float32 / float64 arrays of one dtype and size; mask:
    uint8 of the same size or None.  The parameters are rounded to x's dtype.
    (Raw data pointers: this is on the per-call path of small arrays.)
    """
    cdef int64_t n = cnp.PyArray_SIZE(x)
    _check_flat(x)
    _check_dest(y, x)
    cdef unsigned char* mp = _mask_ptr(mask, n)
    if n == 0:
        return
    if cnp.PyArray_TYPE(x) == cnp.NPY_FLOAT32:
        with nogil:
            _affine_flat(<const float*>cnp.PyArray_DATA(x), <float*>cnp.PyArray_DATA(y), mp, n,
                         <float>scale, <float>inv, <float>zp, <float>qmin, <float>qmax, mode,
                         nthreads)
    else:
        with nogil:
            _affine_flat(<const double*>cnp.PyArray_DATA(x), <double*>cnp.PyArray_DATA(y), mp,
                         n, scale, inv, zp, qmin, qmax, mode, nthreads)


def fq_affine_channels(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
                       int64_t outer, int64_t C, int64_t inner,
                       const floating[::1] scale, const floating[::1] inv,
                       const floating[::1] zp, double qmin, double qmax,
                       int mode, int nthreads):
    """Per-channel affine fake quant of the (outer, C, inner) view."""
    cdef int64_t nblk, nunits, u, r, b, c, start, cnt, nrows
    cdef floating lo = <floating>qmin, hi = <floating>qmax
    if x.shape[0] == 0:
        return
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = _base(mask)
    if inner > 1:
        nblk = (inner + BLOCK - 1) // BLOCK
        nunits = outer * C * nblk
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            r = u // nblk
            b = u - r * nblk
            c = r % C
            start = r * inner + b * BLOCK
            cnt = inner - b * BLOCK
            if cnt > BLOCK:
                cnt = BLOCK
            if floating is float:
                qc_affine_block_f32(xp + start, yp + start, _off(mp, start), cnt,
                                    scale[c], inv[c], zp[c], lo, hi, mode)
            else:
                qc_affine_block_f64(xp + start, yp + start, _off(mp, start), cnt,
                                    scale[c], inv[c], zp[c], lo, hi, mode)
    else:
        nrows = _rows_per_unit(C)
        nunits = (outer + nrows - 1) // nrows
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            start = u * nrows
            cnt = outer - start
            if cnt > nrows:
                cnt = nrows
            if floating is float:
                qc_affine_rowvec_f32(xp + start * C, yp + start * C,
                                     _off(mp, start * C), cnt, C,
                                     &scale[0], &inv[0], &zp[0], lo, hi, mode)
            else:
                qc_affine_rowvec_f64(xp + start * C, yp + start * C,
                                     _off(mp, start * C), cnt, C,
                                     &scale[0], &inv[0], &zp[0], lo, hi, mode)


def fq_affine_exact(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
                    int64_t C, int64_t inner, const floating[::1] scale,
                    const floating[::1] inv, const double[::1] zp, double qmin, double qmax,
                    int mode, int nthreads):
    """PyTorch's affine fake quant with exact integer zero points and range
    (qc_fq_affine_exact) over the C-ordered (outer, C, inner) view of x
    (per tensor: C = 1, inner = x.size); y may alias x."""
    cdef int64_t n = x.shape[0]
    cdef int64_t nunits = (n + BLOCK - 1) // BLOCK
    cdef int64_t u, start, cnt
    if n == 0:
        return
    if C < 1 or inner < 1 or scale.shape[0] < C or inv.shape[0] < C or zp.shape[0] < C:
        raise ValueError("fq_affine_exact: C and inner must be >= 1, with C parameters each")
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = _base(mask)
    for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
        start = u * BLOCK
        cnt = n - start
        if cnt > BLOCK:
            cnt = BLOCK
        if floating is float:
            qc_affine_exact_range_f32(xp, yp, mp, start, cnt, C, inner, &scale[0], &inv[0],
                                      &zp[0], qmin, qmax, mode)
        else:
            qc_affine_exact_range_f64(xp, yp, mp, start, cnt, C, inner, &scale[0], &inv[0],
                                      &zp[0], qmin, qmax, mode)


# ------------------------------------------------------------ nudged family
def fq_nudged(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
              double nmin, double nmax, double scale, double inv, double qz,
              int mode, int nthreads):
    """Per-tensor nudged fake quant (qc_fq_nudged)."""
    cdef int64_t n = x.shape[0]
    cdef int64_t nunits = (n + BLOCK - 1) // BLOCK
    cdef int64_t u, start, cnt
    cdef floating a = <floating>nmin, b = <floating>nmax, s = <floating>scale
    cdef floating iv = <floating>inv, z = <floating>qz
    if n == 0:
        return
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = _base(mask)
    for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
        start = u * BLOCK
        cnt = n - start
        if cnt > BLOCK:
            cnt = BLOCK
        if floating is float:
            qc_nudged_block_f32(xp + start, yp + start, _off(mp, start), cnt,
                                a, b, s, iv, z, mode)
        else:
            qc_nudged_block_f64(xp + start, yp + start, _off(mp, start), cnt,
                                a, b, s, iv, z, mode)


def fq_nudged_channels(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
                       int64_t outer, int64_t C, int64_t inner,
                       const floating[::1] nmin, const floating[::1] nmax,
                       const floating[::1] scale, const floating[::1] inv,
                       const floating[::1] qz, int mode, int nthreads):
    """Per-channel nudged fake quant of the (outer, C, inner) view."""
    cdef int64_t nblk, nunits, u, r, b, c, start, cnt, nrows
    if x.shape[0] == 0:
        return
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = _base(mask)
    if inner > 1:
        nblk = (inner + BLOCK - 1) // BLOCK
        nunits = outer * C * nblk
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            r = u // nblk
            b = u - r * nblk
            c = r % C
            start = r * inner + b * BLOCK
            cnt = inner - b * BLOCK
            if cnt > BLOCK:
                cnt = BLOCK
            if floating is float:
                qc_nudged_block_f32(xp + start, yp + start, _off(mp, start), cnt,
                                    nmin[c], nmax[c], scale[c], inv[c], qz[c], mode)
            else:
                qc_nudged_block_f64(xp + start, yp + start, _off(mp, start), cnt,
                                    nmin[c], nmax[c], scale[c], inv[c], qz[c], mode)
    else:
        nrows = _rows_per_unit(C)
        nunits = (outer + nrows - 1) // nrows
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            start = u * nrows
            cnt = outer - start
            if cnt > nrows:
                cnt = nrows
            if floating is float:
                qc_nudged_rowvec_f32(xp + start * C, yp + start * C,
                                     _off(mp, start * C), cnt, C, &nmin[0],
                                     &nmax[0], &scale[0], &inv[0], &qz[0], mode)
            else:
                qc_nudged_rowvec_f64(xp + start * C, yp + start * C,
                                     _off(mp, start * C), cnt, C, &nmin[0],
                                     &nmax[0], &scale[0], &inv[0], &qz[0], mode)


# -------------------------------------------------------------- amax family
def fq_amax(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
            double mult, double div, double lo, double hi, double amax, int nthreads):
    """Per-tensor amax fake quant (qc_fq_amax)."""
    cdef int64_t n = x.shape[0]
    cdef int64_t nunits = (n + BLOCK - 1) // BLOCK
    cdef int64_t u, start, cnt
    cdef floating m = <floating>mult, d = <floating>div, a = <floating>lo
    cdef floating b = <floating>hi, am = <floating>amax
    if n == 0:
        return
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = _base(mask)
    for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
        start = u * BLOCK
        cnt = n - start
        if cnt > BLOCK:
            cnt = BLOCK
        if floating is float:
            qc_amax_block_f32(xp + start, yp + start, _off(mp, start), cnt,
                              m, d, a, b, am)
        else:
            qc_amax_block_f64(xp + start, yp + start, _off(mp, start), cnt,
                              m, d, a, b, am)


def fq_amax_channels(const floating[::1] x, floating[::1] y, unsigned char[::1] mask,
                     int64_t outer, int64_t C, int64_t inner,
                     const floating[::1] mult, const floating[::1] div,
                     double lo, double hi, const floating[::1] amax, int nthreads):
    """Per-channel amax fake quant of the (outer, C, inner) view."""
    cdef int64_t nblk, nunits, u, r, b, c, start, cnt, nrows
    cdef floating a = <floating>lo, bb = <floating>hi
    if x.shape[0] == 0:
        return
    cdef const floating* xp = &x[0]
    cdef floating* yp = &y[0]
    cdef unsigned char* mp = _base(mask)
    if inner > 1:
        nblk = (inner + BLOCK - 1) // BLOCK
        nunits = outer * C * nblk
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            r = u // nblk
            b = u - r * nblk
            c = r % C
            start = r * inner + b * BLOCK
            cnt = inner - b * BLOCK
            if cnt > BLOCK:
                cnt = BLOCK
            if floating is float:
                qc_amax_block_f32(xp + start, yp + start, _off(mp, start), cnt,
                                  mult[c], div[c], a, bb, amax[c])
            else:
                qc_amax_block_f64(xp + start, yp + start, _off(mp, start), cnt,
                                  mult[c], div[c], a, bb, amax[c])
    else:
        nrows = _rows_per_unit(C)
        nunits = (outer + nrows - 1) // nrows
        for u in prange(nunits, nogil=True, schedule='static', num_threads=nthreads):
            start = u * nrows
            cnt = outer - start
            if cnt > nrows:
                cnt = nrows
            if floating is float:
                qc_amax_rowvec_f32(xp + start * C, yp + start * C,
                                   _off(mp, start * C), cnt, C, &mult[0],
                                   &div[0], a, bb, &amax[0])
            else:
                qc_amax_rowvec_f64(xp + start * C, yp + start * C,
                                   _off(mp, start * C), cnt, C, &mult[0],
                                   &div[0], a, bb, &amax[0])


# ----------------------------------------------------------------- backward
cdef void _ste_flat(const floating* gp, const unsigned char* mp, floating* yp, int64_t n,
                    int nthreads) noexcept nogil:
    cdef int64_t nunits = (n + BLOCK - 1) // BLOCK
    cdef int64_t u, start, cnt
    if nunits == 1:
        if floating is float:
            qc_ste_block_f32(gp, mp, yp, n)
        else:
            qc_ste_block_f64(gp, mp, yp, n)
        return
    for u in prange(nunits, schedule='static', num_threads=nthreads):
        start = u * BLOCK
        cnt = n - start
        if cnt > BLOCK:
            cnt = BLOCK
        if floating is float:
            qc_ste_block_f32(gp + start, mp + start, yp + start, cnt)
        else:
            qc_ste_block_f64(gp + start, mp + start, yp + start, cnt)


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
            _ste_flat(<const float*>cnp.PyArray_DATA(grad), mp, <float*>cnp.PyArray_DATA(y), n,
                      nthreads)
    else:
        with nogil:
            _ste_flat(<const double*>cnp.PyArray_DATA(grad), mp, <double*>cnp.PyArray_DATA(y),
                      n, nthreads)


# ---------------------------------------------------------------- histogram
def histc_f32(cnp.ndarray x, int bins, float lo, float hi, bint absolute, bint skip_zeros,
              int nthreads):
    """``torch.histc(x, bins, lo, hi)`` counts (int64[bins]) of a C-contiguous
    float32 array in one pass (qc_histc_bin_f32, with lo and hi already
    chosen as torch chooses them): NaN and values outside [lo, hi] are not
    counted; ``absolute`` bins |x|; ``skip_zeros`` skips
    zeros.  Each thread counts a contiguous share into its own histograms;
    integer counts make the result independent of the thread count."""
    cdef int64_t n = cnp.PyArray_SIZE(x)
    cdef int64_t t, start, cnt, b, share
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISCARRAY_RO(x):
        raise ValueError("histc_f32: expected an aligned C-contiguous float32 array")
    if bins < 1:
        raise ValueError(f"histc_f32: bins must be >= 1, got {bins}")
    if not lo <= hi:
        raise ValueError(f"histc_f32: need lo <= hi, got [{lo}, {hi}]")
    if nthreads < 1 or n < BLOCK:
        nthreads = 1
    share = (n + nthreads - 1) // nthreads
    parts_a = np.zeros((nthreads, 2 * bins), dtype=np.int64)
    cdef int64_t[:, ::1] parts = parts_a
    cdef const float* xp = <const float*>cnp.PyArray_DATA(x)
    if n > 0:
        if nthreads == 1:
            with nogil:
                qc_histc_block_f32(xp, n, lo, hi, bins, absolute, skip_zeros, &parts[0, 0])
        else:
            for t in prange(nthreads, nogil=True, schedule='static', num_threads=nthreads):
                start = t * share
                cnt = n - start
                if cnt > share:
                    cnt = share
                if cnt > 0:
                    qc_histc_block_f32(xp + start, cnt, lo, hi, bins, absolute, skip_zeros,
                                       &parts[t, 0])
    return parts_a.reshape(nthreads * 2, bins).sum(axis=0)


# ------------------------------------------------------- statistics -> qparams
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


cdef enum:
    ST_OBSERVED = 0
    ST_NONFINITE_SKIPPED = 1
    ST_NONFINITE_REFUSED = 2
    ST_NOT_OBSERVED = 3
    ST_NO_MEMORY = 4

#: status codes of observe_fake_quant_f32
OBSERVED, NONFINITE_SKIPPED, NONFINITE_REFUSED, NOT_OBSERVED = (ST_OBSERVED, ST_NONFINITE_SKIPPED,
                                                    ST_NONFINITE_REFUSED, ST_NOT_OBSERVED)


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
    float32[1] (scale), zp_out int64[1].  rule: -1 do not observe, 0 running
    min/max, 1 moving average with c; nan_policy: 0 skip, 1 propagate, 2
    refuse (return NONFINITE_REFUSED, nothing written).  qparams are recomputed
    from the state whenever it is observed and used for the fake quant when
    ``quantize``.  Returns a status code.  (Raw data pointers rather than
    typed memoryviews: this entry point is on the per-step path, where six
    buffer acquisitions would cost more than the kernel at 1 Ki elements.)
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
    cdef float lo, hi, s
    cdef unsigned char flags
    cdef int64_t z
    cdef int status = ST_NOT_OBSERVED
    if rule >= 0 and n > 0:
        if _minmax_flat(xp, n, nthreads, &lo, &hi, &flags) != 0:
            return ST_NO_MEMORY
        qc_minmax_finish_f32(&lo, &hi, flags)
        status = ST_OBSERVED
        if (flags & QC_MM_NAN) or isinf(lo) or isinf(hi):  # a non-finite batch
            if nan_policy == 0:
                status = ST_NONFINITE_SKIPPED
            elif nan_policy == 2:
                return ST_NONFINITE_REFUSED
        if status == ST_OBSERVED:
            if state[2] == 0:
                state[0] = lo
                state[1] = hi
            elif rule == 0:
                state[0] = qc_running_min_f32(state[0], lo)
                state[1] = qc_running_max_f32(state[1], hi)
            else:
                state[0] = qc_ma_update_f32(state[0], lo, c)
                state[1] = qc_ma_update_f32(state[1], hi, c)
            state[2] += 1
            if symmetric:
                scale_out[0] = qc_symmetric_scale_f32(state[0], state[1], qmin, qmax, eps)
                zp_out[0] = zp_fixed
            else:
                qc_affine_qparams_f32(state[0], state[1], qmin, qmax, eps, &s, &z)
                scale_out[0] = s
                zp_out[0] = z
    if quantize and n > 0:
        s = scale_out[0]
        _affine_flat(xp, yp, mp, n, s, <float>1.0 / s, <float>zp_out[0], <float>qmin,
                    <float>qmax, mode, nthreads)
    return status


cdef void _affine_flat(const floating* xp, floating* yp, unsigned char* mp, int64_t n,
                       floating s, floating inv, floating z, floating lo, floating hi, int mode,
                       int nthreads) noexcept nogil:
    """Affine fake quant of n contiguous values in BLOCK units (one unit runs
    on the calling thread without starting a team)."""
    cdef int64_t nunits = (n + BLOCK - 1) // BLOCK
    cdef int64_t u, start, cnt
    if nunits == 1:
        if floating is float:
            qc_affine_block_f32(xp, yp, mp, n, s, inv, z, lo, hi, mode)
        else:
            qc_affine_block_f64(xp, yp, mp, n, s, inv, z, lo, hi, mode)
        return
    for u in prange(nunits, schedule='static', num_threads=nthreads):
        start = u * BLOCK
        cnt = n - start
        if cnt > BLOCK:
            cnt = BLOCK
        if floating is float:
            qc_affine_block_f32(xp + start, yp + start, _off(mp, start), cnt, s, inv, z, lo, hi,
                                mode)
        else:
            qc_affine_block_f64(xp + start, yp + start, _off(mp, start), cnt, s, inv, z, lo, hi,
                                mode)
