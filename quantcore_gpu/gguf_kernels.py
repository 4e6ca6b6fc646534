"""GPU twins of ``quantcore/_cpu/_gguf.pyx`` (``cuda/gguf.cu``): llama.cpp's
GGUF block types on cupy arrays, a row a thread, the row quantizers and
dequantizers of ``include/qc_gguf.h``: the CPU's bytes and values.

Each function takes the CPU function's parameters with cupy arrays where
the CPU takes numpy (``nthreads`` accepted and ignored); the blocks are a
1-D cupy uint8 array instead of ``bytes``.
"""
import numpy as np

from ._runtime import _cupy, _function, _index

_ROW_THREADS = 64  # threads a block: a row a thread, each with its row's local arrays


def _grid(rows):
    return (max(1, -(-rows // _ROW_THREADS)),), (_ROW_THREADS,)


def quantize_rows(type_id, x, imatrix, row_bytes, nthreads=None):
    """uint8 [rows * row_bytes] (cupy): the blocks of every row of the
    C-contiguous float32 cupy matrix ``x`` (rows, n) of ggml type
    ``type_id``; ``imatrix``: None or n float32 weights (host or device)."""
    cp = _cupy()
    from quantcore._cpu import _gguf
    if type_id not in _gguf.QUANTIZE_IDS:
        raise ValueError(f"no quantizer for ggml type id {type_id}")
    if not isinstance(x, cp.ndarray) or x.ndim != 2 or x.dtype != np.float32 or \
            not x.flags.c_contiguous:
        raise TypeError("quantize_rows: x must be a C-contiguous 2-D float32 cupy array")
    rows, n = (int(v) for v in x.shape)
    qw = None
    if imatrix is not None:
        qw = cp.ascontiguousarray(cp.asarray(imatrix, dtype=np.float32)).reshape(-1)
        if qw.size != n:
            raise ValueError(f"quantize_rows: imatrix has {qw.size} weights, expected {n}")
    out = cp.empty(rows * int(row_bytes), np.uint8)
    if rows and n:
        ct, it = _index(rows * max(n, int(row_bytes)))
        fn = _function("gguf.cu", f"qc_gg_rows_k<{int(type_id)}, {ct}>")
        fn(*_grid(rows), (x, qw, out, it(rows), it(n), it(int(row_bytes))))
    return out


def dequantize_rows(type_id, data, rows, n, row_bytes, nthreads=None):
    """float32 (rows, n) (cupy) of ``rows`` rows of ``row_bytes`` bytes of
    blocks in the 1-D cupy uint8 array ``data``."""
    cp = _cupy()
    from quantcore._cpu import _gguf
    if type_id not in _gguf.QUANTIZE_IDS:
        raise ValueError(f"no dequantizer for ggml type id {type_id}")
    data = cp.ascontiguousarray(data).reshape(-1)
    if data.dtype != np.uint8 or data.size != int(rows) * int(row_bytes):
        raise ValueError(f"dequantize_rows: data has {data.size} {data.dtype} values, expected "
                         f"{int(rows) * int(row_bytes)} uint8")
    rows, n = int(rows), int(n)
    out = cp.empty((rows, n), np.float32)
    if rows and n:
        ct, it = _index(rows * max(n, int(row_bytes)))
        fn = _function("gguf.cu", f"qc_gg_dq_rows_k<{ct}>")
        fn(*_grid(rows), (np.int32(type_id), data, out, it(rows), it(n), it(int(row_bytes))))
    return out
