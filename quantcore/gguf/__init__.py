"""llama.cpp's GGUF block types on arrays, bit for bit with ggml (issue 39).

``gguf_quantize(w, "Q4_K", imatrix=None)`` gives the bytes ggml's
``quantize_<type>(src, dst, nrow, n_per_row, imatrix)`` writes (what
``ggml_quantize_chunk`` and so ``llama-quantize`` call) for a float32 matrix
whose last axis is the row, and ``gguf_dequantize`` reads blocks back as
``dequantize_row_<type>`` does.  The oracle is ggml's C reference built
without FMA contraction (tests/ggml_oracle.py); the formulas are in
``quantcore/include/qc_gguf*.h``, the loops in ``quantcore._cpu._gguf``.

Every type is a row of ``TYPES`` (name, ggml type id as gguf-py's
``GGMLQuantizationType``, values per block, bytes per block); the public
``GGUF_TYPES``, the docs check and the tests derive from it.

Formulas (one block; ``fp16`` is IEEE round-to-nearest-even, ``ni`` is
ggml's ``nearest_int``: round half to even via ``x + 1.5 * 2**23``):

* Q8_0: ``d = fp16(amax / 127)``, ``q = round(x / d)`` (half away from 0);
  ``x' = d * q``.
* Q4_0 / Q5_0: ``d = fp16(m / -8)`` (``-16``), ``m`` the value of largest
  magnitude; ``q = min(15, trunc(x / d + 8.5))`` (31, 16.5);
  ``x' = d * (q - 8)`` (``q - 16``).
* Q4_1 / Q5_1: ``d = fp16((max - min) / 15)`` (31), ``m = fp16(min)``,
  ``q = trunc((x - min) / d + 0.5)``; ``x' = d * q + m``.
* K-quants, super-blocks of 256: Q2_K / Q4_K / Q5_K ``x' = d * sc * q -
  dmin * m`` (16 groups of 16 with 4-bit sc, m; 8 groups of 32 with 6-bit
  sc, m), Q3_K / Q6_K ``x' = d * sc * q`` (16 groups of 16, signed 6- / 8-bit
  sc, q centred at 4 / 32).  Each group's scale (and min) is chosen by
  ggml's searches (make_qx_quants, make_q3_quants, make_qkx2/3_quants,
  make_qp_quants: a few candidate scales, each refit by weighted least
  squares); the codes are then re-rounded against the stored scales:
  ``q = clamp(ni((x + dmin * m) / (d * sc)))``.
* With an imatrix ``w`` (one weight per column), the group weights become
  ``w * sqrt(sigma2 + x**2)`` (``sigma2`` the row's (or super-block's) mean
  square, twice it for Q3_K..Q5_K) and the sub-block scales are themselves
  fitted (make_qp_quants / make_qx_quants); Q6_K uses ``w`` as is; Q8_0
  ignores it.

* IQ4_NL / IQ4_XS: codes index ggml's 16 non-linear values ``K``;
  ``x' = d * K[q]`` (blocks of 32) / ``d * (sc - 32) * K[q]`` (groups of
  32 in super-blocks of 256, 6-bit sc); scales by weighted least squares
  over 16 candidates (ggml's ntry 7).

* MXFP4: ``e = floor(log2(amax)) - 2 + 127`` (E8M0), ``q`` the nearest of
  the 16 doubled E2M1 values ``K2`` times ``2**(e - 128)`` (the first of a
  tie); ``x' = 2**(e - 128) * K2[q]``.

NaN / Inf: ggml propagates them through its comparisons as C does; the
codes of a NaN come from x86's float -> int conversion (``INT32_MIN``'s low
byte, 0), which the headers write out, so the bytes match ggml's x86-64
build (docs/FORMATS.md, "GGUF").
"""
import numbers

import numpy as np

from .. import _arrays as A
from .._cpu import _gguf, threads

#: (name, ggml type id, values per block, bytes per block), in the order
#: they landed; the one table of GGUF types
TYPES = (
    ("Q8_0", 8, 32, 34),
    ("Q4_0", 2, 32, 18),
    ("Q4_1", 3, 32, 20),
    ("Q5_0", 6, 32, 22),
    ("Q5_1", 7, 32, 24),
    ("Q6_K", 14, 256, 210),
    ("Q4_K", 12, 256, 144),
    ("Q5_K", 13, 256, 176),
    ("Q3_K", 11, 256, 110),
    ("Q2_K", 10, 256, 84),
    ("IQ4_NL", 20, 32, 18),
    ("IQ4_XS", 23, 256, 136),
    ("MXFP4", 39, 32, 17),
)
_BY_NAME = {t[0]: t for t in TYPES}
#: the GGUF type names gguf_quantize / gguf_dequantize take
GGUF_TYPES = tuple(t[0] for t in TYPES)


def _type(type):
    if not isinstance(type, str) or type.upper() not in _BY_NAME:
        raise ValueError(f"type: expected one of {list(GGUF_TYPES)}, got {type!r}")
    return _BY_NAME[type.upper()]


def gguf_block(type):
    """(values per block, bytes per block) of a GGUF type name."""
    _, _, bs, bb = _type(type)
    return bs, bb


def gguf_row_bytes(type, n):
    """Bytes of one row of ``n`` values of ``type`` (``n`` a multiple of the
    block size)."""
    name, _, bs, bb = _type(type)
    if n % bs:
        raise ValueError(f"row length {n} is not a multiple of {name}'s block size {bs}")
    return n // bs * bb


def gguf_quantize(w, type, imatrix=None):
    """Quantize rows of float32 values to a GGUF block type, as llama.cpp does.

    Parameters
    ----------
    w : array_like of float32
        The weights; the last axis is the row (a tensor's ``ne[0]``), its
        length a multiple of the type's block size (32, or 256 for the
        K-quants).  Other dtypes are refused (convert to float32 first, as
        llama.cpp does from F16 / BF16).
    type : str
        One of ``GGUF_TYPES``.
    imatrix : array_like of float32, optional
        The importance matrix of this tensor: one non-negative weight per
        column (the row length).  Where ggml takes one (every type but Q8_0
        and MXFP4) it changes the search (``quantize_<type>(...,
        quant_weights)``).

    Returns
    -------
    bytes
        ``rows * row_length / block`` blocks, row after row, each block the
        ggml struct's bytes (little-endian fp16 fields).  For a cupy ``w``:
        the same bytes as a 1-D cupy uint8 array, quantized on its device
        (a row a thread: ``quantcore_gpu.gguf_kernels``).
    """
    name, tid, bs, bb = _type(type)
    gpu = A.is_cupy_array(w)
    a = w if gpu else np.asarray(w)
    if a.dtype != np.float32:
        raise TypeError(f"w: expected float32, got {a.dtype}")
    if a.ndim == 0:
        raise ValueError("w: expected at least one axis (the row), got a scalar")
    n = a.shape[-1]
    if n == 0 or n % bs:
        raise ValueError(f"w: row length {n} (w's last axis) is not a positive multiple of "
                         f"{name}'s block size {bs}")
    rows = A.array_module(a).ascontiguousarray(a.reshape(-1, n))
    qw = None
    if imatrix is not None:
        qw = np.asarray(A.to_host(imatrix))
        if qw.dtype != np.float32:
            raise TypeError(f"imatrix: expected float32, got {qw.dtype}")
        if qw.ndim != 1 or qw.shape[0] != n:
            raise ValueError(f"imatrix: expected one weight per column ({n},) for w's rows, "
                             f"got shape {qw.shape}")
        qw = np.ascontiguousarray(qw)
    if gpu:
        return _gpu("gguf_quantize").quantize_rows(tid, rows, qw, n // bs * bb)
    nt = threads.effective_n_threads(rows.size)
    return _gguf.quantize_rows(tid, rows, qw, n // bs * bb, nt)


def _gpu(func):
    """quantcore_gpu.gguf_kernels, or NotImplementedError saying why the GPU
    path cannot run."""
    A.gpu_kernels(func)
    from quantcore_gpu import gguf_kernels
    return gguf_kernels


def gguf_dequantize(data, type, shape):
    """Float32 values of GGUF blocks, as ggml's ``dequantize_row_<type>``.

    Parameters
    ----------
    data : bytes-like
        The blocks (as ``gguf_quantize`` returns them, or a tensor's data
        in a GGUF file).
    type : str
        One of ``GGUF_TYPES``.
    shape : tuple of int
        The values' shape; its last axis is the row, a multiple of the
        block size; ``len(data)`` must be exactly its bytes.

    Returns
    -------
    numpy.ndarray of float32, ``shape`` (cupy for cupy ``data``: computed on
    its device)
        ``x' = d * q`` (Q8_0), ``d * (q - 8 | 16)`` (Q4_0 / Q5_0),
        ``d * q + m`` (Q4_1 / Q5_1), ``d * sc * q - dmin * m`` (Q2_K, Q4_K,
        Q5_K), ``d * sc * q`` (Q3_K, Q6_K), ``d * K[q]`` (IQ4_NL),
        ``d * (sc - 32) * K[q]`` (IQ4_XS), ``2**(e - 128) * K2[q]`` (MXFP4),
        in ggml's float32 order.
    """
    name, tid, bs, bb = _type(type)
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 0 for s in shape):
        raise ValueError(f"shape: expected a tuple of non-negative ints, got {shape!r}")
    n = shape[-1]
    if n == 0 or n % bs:
        raise ValueError(f"shape: row length {n} (the last axis) is not a positive multiple "
                         f"of {name}'s block size {bs}")
    gpu = A.is_cupy_array(data)
    if gpu and data.dtype != np.uint8:
        raise TypeError(f"data: expected a uint8 cupy array of blocks, got {data.dtype}")
    buf = data.reshape(-1) if gpu else np.frombuffer(memoryview(data).cast("B"), np.uint8)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    want = rows * (n // bs) * bb
    if buf.size != want:
        raise ValueError(f"data: {buf.size} bytes, expected {want} for {name} of shape {shape}")
    if gpu:
        return _gpu("gguf_dequantize").dequantize_rows(tid, buf, rows, n,
                                                       n // bs * bb).reshape(shape)
    nt = threads.effective_n_threads(rows * n)
    return _gguf.dequantize_rows(tid, buf, rows, n, n // bs * bb, nt).reshape(shape)


__all__ = ["TYPES", "GGUF_TYPES", "gguf_block", "gguf_row_bytes", "gguf_quantize",
           "gguf_dequantize"]
