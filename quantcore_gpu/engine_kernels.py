"""GPU twins of ``quantcore/_cpu/_engines.pyx`` (``cuda/engines.cu``): the
engine checkpoint writers' loops over a weight's rows on cupy arrays, the
element rules of ``include/qc_engines.h``, bit for bit with the CPU.

Each function takes the CPU function's parameters, with a C-contiguous 2-D
cupy array ``x`` (uint16 BF16 bits or float32 values) where the CPU takes
numpy; ``nthreads`` is accepted and ignored.  The per-row and per-group
statistics (:func:`absmax_rows`, :func:`group_minmax_rows`) come back to
the host as numpy arrays (a value per row or group: the scale arithmetic
is numpy's, in ``quantcore/engines``); the codes stay on the device.
Scales and divisors may be host or device arrays (copied to the device
when host).
"""
import numpy as np

from ._runtime import ENGINE_PACKS, _cupy, _function, _grid, _index

_TYPES = {np.dtype(np.uint16): "unsigned short", np.dtype(np.float32): "float"}


def _rows(x, func):
    """(x, rows, cols, ctype of its stored type) of a 2-D cupy weight."""
    cp = _cupy()
    if not isinstance(x, cp.ndarray) or x.ndim != 2 or np.dtype(x.dtype) not in _TYPES:
        raise TypeError(f"{func}: x must be a 2-D cupy array of uint16 (BF16 bits) or float32, "
                        f"got {type(x).__name__} {getattr(x, 'dtype', '')} "
                        f"{getattr(x, 'shape', '')}")
    x = cp.ascontiguousarray(x)
    return x, int(x.shape[0]), int(x.shape[1]), _TYPES[np.dtype(x.dtype)]


def _device(a, dtype, size, name, func):
    """``a`` as a contiguous 1-D device array of ``dtype`` and ``size``."""
    cp = _cupy()
    a = cp.ascontiguousarray(cp.asarray(a, dtype=dtype)).reshape(-1)
    if a.size != size:
        raise ValueError(f"{func}: {name} has {a.size} values, expected {size}")
    return a


def _group_shift(cols, group, func):
    if group < 2 or group & (group - 1) or cols % group:
        raise ValueError(f"{func}: row length {cols} and group {group}: a power-of-two group "
                         "dividing it")
    return int(group).bit_length() - 1


def absmax_rows(x, nthreads=None):
    """float32 [rows] (numpy): max |x| of each row, on the bits (an integer
    maximum of the bits with the sign cleared: NaN when one is there, else
    inf when one is there), as ``_engines.absmax_rows``."""
    x, rows, cols, _ = _rows(x, "absmax_rows")
    return _absmax_bits(x, rows, cols, 1)


def group_absmax_rows(x, group, nthreads=None):
    """float32 [rows, n / group] (numpy): max |x| of every group, on the
    bits, as ``_engines.group_absmax_rows``."""
    x, rows, cols, _ = _rows(x, "group_absmax_rows")
    gshift = _group_shift(cols, group, "group_absmax_rows")
    return _absmax_bits(x, rows, cols >> gshift, 1 << gshift)


def _absmax_bits(x, rows, ngroups, group):
    """max |x| [rows, ngroups] (numpy; squeezed to [rows] when ``group`` is
    1: a row) of groups of ``group`` values (a row: cols), on the bits."""
    cp = _cupy()
    if x.dtype == np.uint16:
        mask, nan, dt, shift = 0x7FFF, 0x7F80, np.uint16, 16
    else:
        mask, nan, dt, shift = 0x7FFFFFFF, 0x7F800000, np.uint32, 0
    shape = (rows,) if group == 1 else (rows, ngroups)
    if x.size == 0:
        return np.zeros(shape, np.float32)
    width = x.shape[1] if group == 1 else group
    m = cp.asnumpy((x.view(dt) & dt(mask)).reshape(-1, width).max(axis=1)).astype(np.uint32)
    m = np.where(m > nan, np.uint32(0x7FC00000 >> shift), m) << np.uint32(shift)
    return m.view(np.float32).reshape(shape)


def fp8_rows(x, scales, round_bf16, nthreads=None):
    """uint8 [rows, n] (cupy): ``qc_eng_fp8(x, scale, round_bf16)`` with
    one scale per row or one for all, as ``_engines.fp8_rows``."""
    x, rows, cols, xt = _rows(x, "fp8_rows")
    cp = _cupy()
    s = cp.ascontiguousarray(cp.asarray(scales, dtype=np.float32)).reshape(-1)
    if s.size not in (1, rows):
        raise ValueError(f"fp8_rows: {s.size} scales for {rows} rows")
    out = cp.empty((rows, cols), np.uint8)
    n = rows * cols
    if n:
        ct, it = _index(n)
        fn = _function("engines.cu", f"qc_eng_fp8_k<{int(bool(round_bf16))}, {xt}, {ct}>")
        fn((_grid(n),), (256,), (x, out, it(n), it(cols), s, np.int32(s.size != 1)))
    return out


def fp4_rows(x, divisors, group, round_bf16, nthreads=None):
    """uint8 [rows, n / 2] (cupy): the e2m1 codes (``qc_eng_e2m1``) of ``x /
    divisors[row, j // group]`` packed two a byte, as ``_engines.fp4_rows``."""
    x, rows, cols, xt = _rows(x, "fp4_rows")
    gshift = _group_shift(cols, group, "fp4_rows")
    cp = _cupy()
    d = _device(divisors, np.float32, rows * (cols // group), "divisors", "fp4_rows")
    out = cp.empty((rows, cols // 2), np.uint8)
    n = rows * cols // 2
    if n:
        ct, it = _index(rows * cols)
        fn = _function("engines.cu", f"qc_eng_fp4_k<{int(bool(round_bf16))}, {xt}, {ct}>")
        fn((_grid(n),), (256,), (x, out, it(n), it(cols), d, np.int32(gshift)))
    return out


def group_minmax_rows(x, group, nthreads=None):
    """(min, max), float32 [rows, n / group] each (numpy), of every group,
    as ``_engines.group_minmax_rows`` (NaN for a group with a NaN)."""
    x, rows, cols, xt = _rows(x, "group_minmax_rows")
    gshift = _group_shift(cols, group, "group_minmax_rows")
    cp = _cupy()
    ng = rows * (cols // group)
    lo, hi = cp.empty(ng, np.float32), cp.empty(ng, np.float32)
    if ng:
        ct, it = _index(rows * cols)
        fn = _function("engines.cu", f"qc_eng_group_minmax_k<{xt}, {ct}>")
        fn((_grid(ng),), (256,), (x, it(ng), np.int32(gshift), lo, hi))
    shape = (rows, cols // group)
    return cp.asnumpy(lo).reshape(shape), cp.asnumpy(hi).reshape(shape)


def int_rows(x, scales, zeros, group, qmin, qmax, round_bf16, nthreads=None, pack=0):
    """uint8 codes (cupy) of ``qc_eng_int_code`` per group (scale and zero
    point float32 [rows, n / group]), as ``_engines.int_rows``: int8 codes
    [rows, n] (``pack`` 0), + 128 a byte (8) or + 8 two a byte (4)."""
    x, rows, cols, xt = _rows(x, "int_rows")
    gshift = _group_shift(cols, group, "int_rows")
    if pack not in ENGINE_PACKS:
        raise ValueError(f"int_rows: pack {pack}: one of {list(ENGINE_PACKS)}")
    cp = _cupy()
    ng = rows * (cols // group)
    s = _device(scales, np.float32, ng, "scales", "int_rows")
    z = _device(zeros, np.float32, ng, "zeros", "int_rows")
    width = cols // 2 if pack == 4 else cols
    out = cp.empty((rows, width), np.int8 if pack == 0 else np.uint8)
    n = rows * width
    if n:
        ct, it = _index(rows * cols)
        fn = _function("engines.cu",
                       f"qc_eng_int_k<{int(bool(round_bf16))}, {pack}, {xt}, {ct}>")
        fn((_grid(n),), (256,), (x, out.view(np.uint8), it(n), it(cols), s, z, np.int32(gshift),
                                 np.float32(qmin), np.float32(qmax)))
    return out
