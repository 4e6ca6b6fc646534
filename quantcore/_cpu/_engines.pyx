# cython: language_level=3
"""The engine checkpoint writers' weight loops (quantcore.engines).

The per-element rules are in ``quantcore/include/qc_engines.h``; this module
runs them over the rows of a C-contiguous weight given as its stored bits
(BF16 as uint16, F32 as float32), one row per iteration of a static
``prange`` (rows are independent: the bytes do not depend on the thread
count):

* :func:`absmax_rows`, :func:`group_absmax_rows` -- max |x| of each row or
  group (NaN when it holds a NaN, else inf when it holds an inf), in one
  pass over the stored bits;
* :func:`fp8_rows` -- e4m3fn codes (satfinite) of ``x / s`` per row,
  rounded to BF16 first when asked (compressed-tensors' ``r_D(x / s)``);
* :func:`fp4_rows` -- e2m1 codes of ``x / d`` per group;
* :func:`group_minmax_rows`, :func:`int_rows` -- the integer group schemes'
  (W8A16, W4A16_ASYM) group minima / maxima and codes.
"""
import numpy as np

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int8_t, int64_t, uint8_t, uint16_t, uint32_t

cdef extern from "qc_engines.h":
    uint8_t qc_eng_fp8(float x, float s, int round_bf16) noexcept nogil
    void qc_eng_fp8_table(uint8_t *t) noexcept nogil

cdef extern from "qc_eng_builds.h":
    float qc_run_eng_absmax_bf16(const uint16_t *x, int64_t n) noexcept nogil
    float qc_run_eng_absmax_f32(const uint32_t *x, int64_t n) noexcept nogil
    void qc_run_eng_fp8_row(const uint8_t *t, const void *x, int bf16, uint8_t *q, int64_t n,
                            float s, int r) noexcept nogil
    void qc_run_eng_fp4_rows(const void *x, int bf16, uint8_t *q, int64_t n, const float *d,
                             int gshift, int r) noexcept nogil
    void qc_run_eng_group_absmax_rows(const void *x, int bf16, int64_t n, int gshift,
                                      float *out) noexcept nogil
    void qc_run_eng_nvfp4_scales(const float *amax, int64_t n, float g, int recipe,
                                 uint8_t *codes, float *divisors) noexcept nogil
    void qc_run_eng_group_minmax_rows(const void *x, int bf16, int64_t n, int gshift,
                                      float *lo, float *hi) noexcept nogil
    void qc_run_eng_int_rows(const void *x, int bf16, uint8_t *q, int64_t n, const float *s,
                             const float *z, int gshift, float qmin, float qmax, int r,
                             int pack) noexcept nogil

cnp.import_array()

cdef uint8_t _FP8_TABLE[65536]
qc_eng_fp8_table(_FP8_TABLE)

include "_simd_follow.pxi"


cdef const char *_rows_data(x, int64_t *item) except NULL:
    """The first byte of ``x`` (C-contiguous 2-D uint16 BF16 bits or float32,
    not empty) and, in ``item[0]``, its item size; valid while ``x`` lives."""
    cdef const uint16_t[:, ::1] xb
    cdef const float[:, ::1] xf
    if x.dtype == np.uint16:
        xb = x
        item[0] = 2
        return <const char *>&xb[0, 0]
    xf = x
    item[0] = 4
    return <const char *>&xf[0, 0]


def fp8_scalar(float x, float s, bint round_bf16):
    """``qc_eng_fp8``: the rule the table loop of :func:`fp8_rows` follows, one
    value (for the tests)."""
    return qc_eng_fp8(x, s, round_bf16)


def absmax_rows(x, int nthreads):
    """float32 [rows]: max |x| of each row of the C-contiguous 2-D ``x``
    (uint16 BF16 bits or float32); NaN for a row with a NaN."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    out = np.zeros(rows, np.float32)
    cdef float[::1] o = out
    cdef const uint16_t[:, ::1] xb
    cdef const float[:, ::1] xf
    if rows == 0 or n == 0:
        return out
    cdef const void *p
    cdef int bf16 = x.dtype == np.uint16
    if bf16:
        xb = x
        p = &xb[0, 0]
    else:
        xf = x
        p = &xf[0, 0]
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                o[r] = _absmax_row(p, bf16, r, n)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            o[r] = _absmax_row(p, bf16, r, n)
    return out


cdef inline float _absmax_row(const void *p, int bf16, int64_t r, int64_t n) noexcept nogil:
    if bf16:
        return qc_run_eng_absmax_bf16(<const uint16_t *>p + r * n, n)
    return qc_run_eng_absmax_f32(<const uint32_t *>p + r * n, n)


def fp8_rows(x, const float[::1] scales, bint round_bf16, int nthreads):
    """uint8 [rows, n]: e4m3fn codes (satfinite) of ``x / scales[row]``
    (one scale for every row when ``scales`` has one value), rounded to
    BF16 before the cast when ``round_bf16``; ``x`` C-contiguous 2-D uint16
    BF16 bits or float32."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    cdef int64_t ss = 0 if scales.shape[0] == 1 else 1
    if ss and scales.shape[0] != rows:
        raise ValueError(f"{scales.shape[0]} scales for {rows} rows")
    out = np.empty((rows, n), np.uint8)
    cdef uint8_t[:, ::1] o = out
    cdef int rnd = round_bf16
    if rows == 0 or n == 0:
        return out
    cdef int64_t item
    cdef const char *p = _rows_data(x, &item)
    cdef const float *sp = &scales[0]
    cdef uint8_t *op = &o[0, 0]
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                qc_run_eng_fp8_row(_FP8_TABLE, p + r * n * item, item == 2, op + r * n, n, sp[r * ss], rnd)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_run_eng_fp8_row(_FP8_TABLE, p + r * n * item, item == 2, op + r * n, n, sp[r * ss], rnd)
    return out


def fp4_rows(x, const float[:, ::1] divisors, int group, bint round_bf16, int nthreads):
    """uint8 [rows, n / 2]: compressed-tensors' e2m1 codes (``qc_eng_e2m1``:
    ``compressed_tensors.e2m1_codes``) of ``x / divisors[row, j // group]``,
    rounded to nearest even to BF16 first when ``round_bf16``, packed two a
    byte (element 2i in the low nibble); ``x`` C-contiguous 2-D uint16 BF16
    bits or float32, ``n`` a multiple of the power-of-two ``group``."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    cdef int gshift = _group_shift(n, group)
    if divisors.shape[0] != rows or divisors.shape[1] != n // group:
        raise ValueError(f"fp4_rows: x {x.shape}, group {group}, divisors "
                         f"{divisors.shape[0]}x{divisors.shape[1]}")
    out = np.empty((rows, n // 2), np.uint8)
    cdef uint8_t[:, ::1] o = out
    cdef int rnd = round_bf16
    if rows == 0 or n == 0:
        return out
    cdef int64_t item
    cdef const char *p = _rows_data(x, &item)
    cdef const float *dp = &divisors[0, 0]
    cdef uint8_t *op = &o[0, 0]
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                qc_run_eng_fp4_rows(p + r * n * item, item == 2, op + r * (n // 2), n,
                                dp + r * (n // group), gshift, rnd)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_run_eng_fp4_rows(p + r * n * item, item == 2, op + r * (n // 2), n,
                            dp + r * (n // group), gshift, rnd)
    return out


cdef int _group_shift(int64_t n, int group) except -1:
    if group < 2 or group & (group - 1) or n % group:
        raise ValueError(f"row length {n} and group {group}: a power-of-two group dividing it")
    return group.bit_length() - 1


def group_absmax_rows(x, int group, int nthreads):
    """float32 [rows, n / group]: max |x| of every group of ``group`` values
    along the rows of ``x`` (C-contiguous 2-D uint16 BF16 bits or float32;
    a power-of-two group dividing n), on the bits as :func:`absmax_rows`
    (NaN for a group with a NaN, else inf for one with an inf)."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    cdef int gshift = _group_shift(n, group)
    out = np.empty((rows, n // group), np.float32)
    if rows == 0 or n == 0:
        return out
    cdef float[:, ::1] ov = out
    cdef int64_t item
    cdef const char *p = _rows_data(x, &item)
    cdef float *op = &ov[0, 0]
    cdef int64_t ng = n // group
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                qc_run_eng_group_absmax_rows(p + r * n * item, item == 2, n, gshift, op + r * ng)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_run_eng_group_absmax_rows(p + r * n * item, item == 2, n, gshift, op + r * ng)
    return out


#: nvfp4_scales' recipes (qc_eng_nvfp4_scale's K)
NVFP4_RECIPES = {"compressed-tensors": 0, "compressed-tensors-bf16": 1, "modelopt": 2}


def nvfp4_scales(amax, float g, recipe, int nthreads):
    """(uint8 e4m3fn codes, float32 divisors), each shaped as ``amax``:
    NVFP4's scale of every group from its absmax ``amax`` (float32) and the
    global scale ``g`` by ``recipe`` (:data:`NVFP4_RECIPES`;
    ``qc_eng_nvfp4_scale``): compressed-tensors' (``s = amax / 6``, rounded
    to BF16 for "compressed-tensors-bf16", the code ``e4m3(g * s)``, 0.125's
    where that is 0, the divisor ``decode(code) / g``) or ModelOpt's
    (``s = amax / (6 g)``, 1 where 0, clipped to [2^-9, 448], the code
    ``e4m3(s)``, the divisor ``decode(code) * g``); in blocks of 4096."""
    cdef int k = NVFP4_RECIPES[recipe]
    a = np.ascontiguousarray(amax, np.float32)
    codes = np.empty(a.shape, np.uint8)
    divisors = np.empty(a.shape, np.float32)
    cdef const float[::1] av = a.reshape(-1)
    cdef uint8_t[::1] cv = codes.reshape(-1)
    cdef float[::1] dv = divisors.reshape(-1)
    cdef int64_t n = av.shape[0], b, nb = (n + 4095) // 4096
    if n == 0:
        return codes, divisors
    if nthreads <= 1 or nb == 1:
        with nogil:
            qc_run_eng_nvfp4_scales(&av[0], n, g, k, &cv[0], &dv[0])
    else:
        for b in prange(nb, nogil=True, schedule='static', num_threads=nthreads):
            qc_run_eng_nvfp4_scales(&av[b * 4096], min(4096, n - b * 4096), g, k, &cv[b * 4096],
                                    &dv[b * 4096])
    return codes, divisors


def group_minmax_rows(x, int group, int nthreads):
    """(min, max), float32 [rows, n / group] each, of every group of ``group``
    values along the rows of ``x`` (C-contiguous 2-D uint16 BF16 bits or
    float32; a power-of-two group dividing n); NaN for a group with a NaN."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    cdef int gshift = _group_shift(n, group)
    lo = np.empty((rows, n // group), np.float32)
    hi = np.empty((rows, n // group), np.float32)
    if rows == 0 or n == 0:
        return lo, hi
    cdef float[:, ::1] lv = lo, hv = hi
    cdef int64_t item
    cdef const char *p = _rows_data(x, &item)
    cdef float *lp = &lv[0, 0]
    cdef float *hp = &hv[0, 0]
    cdef int64_t ng = n // group
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                qc_run_eng_group_minmax_rows(p + r * n * item, item == 2, n, gshift, lp + r * ng,
                                         hp + r * ng)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_run_eng_group_minmax_rows(p + r * n * item, item == 2, n, gshift, lp + r * ng,
                                     hp + r * ng)
    return lo, hi


def int_rows(x, const float[:, ::1] scales, const float[:, ::1] zero_points, int group,
             int qmin, int qmax, bint round_bf16, int nthreads, int pack=0):
    """The codes ``clip(rint(r(r(x / s) + z)), qmin, qmax)`` with the scale
    ``s`` and zero point ``z`` (an integer as float32; 0: symmetric) of the
    element's group, ``r`` rounding to BF16 when ``round_bf16`` (else none);
    ``x`` C-contiguous 2-D uint16 BF16 bits or float32.  ``pack`` 0: int8
    [rows, n]; 4 or 8: uint8 [rows, n * pack / 8], the codes + 2^(pack-1)
    packed (4: two a byte, element 2i in the low nibble), compressed-tensors'
    pack_to_int32 bytes."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    cdef int gshift = _group_shift(n, group)
    cdef int64_t ng = n // group
    if scales.shape[0] != rows or scales.shape[1] != ng or zero_points.shape[0] != rows or \
            zero_points.shape[1] != ng or pack not in (0, 4, 8):
        raise ValueError(f"int_rows: x {x.shape}, group {group}, scales "
                         f"{scales.shape[0]}x{scales.shape[1]}, zero points "
                         f"{zero_points.shape[0]}x{zero_points.shape[1]}, pack {pack}")
    cdef int64_t width = n // 2 if pack == 4 else n
    out = np.empty((rows, width), np.int8 if pack == 0 else np.uint8)
    if rows == 0 or n == 0:
        return out
    cdef uint8_t[:, ::1] o = out.view(np.uint8)
    cdef int rnd = round_bf16
    cdef int64_t item
    cdef const char *p = _rows_data(x, &item)
    cdef const float *sp = &scales[0, 0]
    cdef const float *zp = &zero_points[0, 0]
    cdef uint8_t *op = &o[0, 0]
    cdef float lo = qmin, hi = qmax
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                qc_run_eng_int_rows(p + r * n * item, item == 2, op + r * width, n, sp + r * ng,
                                zp + r * ng, gshift, lo, hi, rnd, pack)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_run_eng_int_rows(p + r * n * item, item == 2, op + r * width, n, sp + r * ng,
                            zp + r * ng, gshift, lo, hi, rnd, pack)
    return out
