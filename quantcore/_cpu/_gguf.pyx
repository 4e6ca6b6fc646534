# cython: language_level=3
"""GGUF block types (llama.cpp's ggml quantization), CPU loops.

The per-row formulas are in ``quantcore/include/qc_gguf.h`` (legacy types in
``qc_gguf_legacy.h``, K-quants in ``qc_gguf_k.h``); this module runs them
over the rows of a C-contiguous float32 matrix, one row per iteration of a
static ``prange`` (rows are independent: the bytes do not depend on the
thread count).  Types are named by their ggml type id (gguf-py's
``GGMLQuantizationType``); ``quantcore.gguf`` holds the table.
"""
import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cython.parallel cimport prange
from libc.math cimport floorf, log2f
from libc.stdint cimport int64_t, uint8_t

cdef extern from "qc_gguf.h":
    ctypedef void (*qc_gg_row_fn)(const float *x, const float *qw, uint8_t *y,
                                  int64_t n) noexcept nogil
    qc_gg_row_fn qc_gg_quantizer(int type_id) noexcept nogil
    bint qc_gg_dequantize(int type_id, const uint8_t *y, float *x, int64_t n) noexcept nogil
    int qc_gg_iq4_index(float x) noexcept nogil
    void qc_gg_iq4_indices(const float *x, float id, uint8_t *L, int n) noexcept nogil
    float qc_gg_floor_log2(float a) noexcept nogil

cnp.import_array()

#: the ggml type ids the header's QC_GGUF_TYPES list has
QUANTIZE_IDS = tuple(i for i in range(256) if qc_gg_quantizer(i) != NULL)


def quantize_rows(int type_id, const float[:, ::1] x, imatrix, int64_t row_bytes,
                  int nthreads):
    """The blocks of every row of ``x`` (rows, n): bytes (rows * row_bytes),
    written in place (a new bytes object: no copy of the result);
    ``imatrix``: None or a C-contiguous float32 array of n weights."""
    cdef qc_gg_row_fn fn = qc_gg_quantizer(type_id)
    if fn == NULL:
        raise ValueError(f"no quantizer for ggml type id {type_id}")
    cdef int64_t rows = x.shape[0], n = x.shape[1], r
    out = PyBytes_FromStringAndSize(NULL, rows * row_bytes)
    cdef const float[::1] w
    cdef const float *qw = NULL
    if imatrix is not None:
        w = imatrix
        qw = &w[0]
    if rows == 0 or n == 0:
        return out
    cdef const float *xp = &x[0, 0]
    cdef uint8_t *op = <uint8_t *>PyBytes_AS_STRING(out)
    if nthreads <= 1 or rows == 1:
        with nogil:
            for r in range(rows):
                fn(xp + r * n, qw, op + r * row_bytes, n)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            fn(xp + r * n, qw, op + r * row_bytes, n)
    return out


def dequantize_rows(int type_id, const uint8_t[::1] data, int64_t rows, int64_t n,
                    int64_t row_bytes, int nthreads):
    """float32 (rows, n) from ``rows`` rows of ``row_bytes`` bytes of blocks."""
    if type_id not in QUANTIZE_IDS:
        raise ValueError(f"no dequantizer for ggml type id {type_id}")
    out = np.empty((rows, n), np.float32)
    if rows == 0 or n == 0:
        return out
    cdef float[:, ::1] o = out
    cdef const uint8_t *dp = &data[0]
    cdef float *op = &o[0, 0]
    cdef int64_t r
    if nthreads <= 1 or rows == 1:
        with nogil:
            for r in range(rows):
                qc_gg_dequantize(type_id, dp + r * row_bytes, op + r * n, n)
    else:
        for r in prange(rows, nogil=True, schedule='static', num_threads=nthreads):
            qc_gg_dequantize(type_id, dp + r * row_bytes, op + r * n, n)
    return out


def iq4_index_pairs(const float[::1] x):
    """(ggml's bisection ``qc_gg_iq4_index``, the row loops'
    ``qc_gg_iq4_indices``), uint8 each, of every value of ``x`` (length a
    multiple of 4): the tests' check of the SSE4.1 threshold count."""
    cdef int64_t n = x.shape[0], j
    if n % 4:
        raise ValueError(f"iq4_index_pairs: length {n} is not a multiple of 4")
    scalar = np.empty(n, np.uint8)
    lanes = np.empty(n, np.uint8)
    cdef uint8_t[::1] s = scalar, v = lanes
    for j in range(n):
        s[j] = qc_gg_iq4_index(x[j])
    for j in range(0, n, 4):
        qc_gg_iq4_indices(&x[j], 1.0, &v[j], 4)
    return scalar, lanes


def floor_log2_pairs(const float[::1] x):
    """(libm's ``floorf(log2f(x))``, as ggml calls it, and the headers' bits
    form ``qc_gg_floor_log2`` that MXFP4 takes on CPU and GPU), float32
    each, of every positive value of ``x``: the tests' check of its table."""
    cdef int64_t n = x.shape[0], j
    host = np.empty(n, np.float32)
    bits = np.empty(n, np.float32)
    cdef float[::1] h = host, b = bits
    for j in range(n):
        h[j] = floorf(log2f(x[j]))
        b[j] = qc_gg_floor_log2(x[j])
    return host, bits
