# cython: language_level=3
"""The engine checkpoint writers' FP8 weight loops (quantcore.engines).

The per-element rules are in ``quantcore/include/qc_engines.h``; this module
runs them over the rows of a C-contiguous weight given as its stored bits
(BF16 as uint16, F32 as float32), one row per iteration of a static
``prange`` (rows are independent: the bytes do not depend on the thread
count):

* :func:`absmax_rows` -- max |x| of each row (NaN when the row holds a NaN,
  else inf when it holds an inf), in one pass over the stored bits;
* :func:`fp8_rows` -- e4m3fn codes (satfinite) of ``x / s`` per row,
  rounded to BF16 first when asked (compressed-tensors' ``r_D(x / s)``).
"""
import numpy as np

cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t

cdef extern from "qc_engines.h":
    float qc_eng_absmax_bf16(const uint16_t *x, int64_t n) noexcept nogil
    float qc_eng_absmax_f32(const uint32_t *x, int64_t n) noexcept nogil
    uint8_t qc_eng_fp8(float x, float s, int round_bf16) noexcept nogil
    void qc_eng_fp8_table(uint8_t *t) noexcept nogil
    void qc_eng_fp8_row(const uint8_t *t, const void *x, int bf16, uint8_t *q, int64_t n,
                        float s, int r) noexcept nogil
    void qc_eng_fp4_rows(const uint8_t *t, const void *x, int bf16, uint8_t *q, int64_t n,
                         const float *d, int gshift, int r) noexcept nogil

cnp.import_array()

cdef uint8_t _FP8_TABLE[65536]
qc_eng_fp8_table(_FP8_TABLE)


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
        return qc_eng_absmax_bf16(<const uint16_t *>p + r * n, n)
    return qc_eng_absmax_f32(<const uint32_t *>p + r * n, n)


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
                qc_eng_fp8_row(_FP8_TABLE, p + r * n * item, item == 2, op + r * n, n, sp[r * ss], rnd)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_eng_fp8_row(_FP8_TABLE, p + r * n * item, item == 2, op + r * n, n, sp[r * ss], rnd)
    return out


def fp4_rows(x, const float[:, ::1] divisors, int group, const uint8_t[::1] table,
             bint round_bf16, int nthreads):
    """uint8 [rows, n / 2]: the 4-bit codes ``table[index]`` of ``x /
    divisors[row, j // group]`` packed two a byte (element 2i in the low
    nibble); the index is the BF16 bits of the quotient rounded to nearest
    even when ``round_bf16``, else rounded to odd (qc_eng_index); ``x``
    C-contiguous 2-D uint16 BF16 bits or float32, ``n`` a multiple of the
    power-of-two ``group``; ``table`` 65536 codes."""
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    cdef int gshift = group.bit_length() - 1
    if group < 2 or group & (group - 1) or n % group or table.shape[0] != 65536 or \
            divisors.shape[0] != rows or divisors.shape[1] != n // group:
        raise ValueError(f"fp4_rows: x {x.shape}, group {group}, divisors "
                         f"{divisors.shape[0]}x{divisors.shape[1]}, table {table.shape[0]}")
    out = np.empty((rows, n // 2), np.uint8)
    cdef uint8_t[:, ::1] o = out
    cdef int rnd = round_bf16
    if rows == 0 or n == 0:
        return out
    cdef int64_t item
    cdef const char *p = _rows_data(x, &item)
    cdef const float *dp = &divisors[0, 0]
    cdef const uint8_t *tp = &table[0]
    cdef uint8_t *op = &o[0, 0]
    if nthreads <= 1 or rows == 1:  # (one thread: no OpenMP team, threads.py)
        with nogil:
            for r in range(rows):
                qc_eng_fp4_rows(tp, p + r * n * item, item == 2, op + r * (n // 2), n,
                                dp + r * (n // group), gshift, rnd)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_eng_fp4_rows(tp, p + r * n * item, item == 2, op + r * (n // 2), n,
                            dp + r * (n // group), gshift, rnd)
    return out
