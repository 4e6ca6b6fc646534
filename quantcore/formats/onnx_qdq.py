"""ONNX QuantizeLinear / DequantizeLinear (opset 21, with ORT's integer
saturation; the formats specification §2), on numpy (CPU) and cupy (GPU).
The element types: :data:`INT_TYPES`, the FP8 types of
:data:`ONNX_FP8_FORMATS` (with the ``"float8_"`` prefix) and the FP4 type of
:data:`ONNX_FP4_FORMATS` (``"float4_e2m1fn"``, ONNX FLOAT4E2M1).
"""
import numpy as np

from .. import _arrays as A
from ._common import (F8_DEQ_MUL, F8_PLUS_ZERO, F8_SCALE_DIV, INT_SIGNED, INT_TYPES, INT_WRAP32,
                      NAN_ENCODING, ONNX_FP4_FORMATS, ONNX_FP8_FORMATS, OVERFLOW, _DEC, _ENC,
                      _as_codes, _blocked_call, _decode, _encode, _float_input, _nthreads,
                      _onnx_dtype_name, _param, _to_last)


# ------------------------------------------------------------------- ONNX
def _onnx_type(name, func, what="output"):
    """('int', (qmin, qmax, container)) or ('fp8' / 'fp4', format id)."""
    if name in INT_TYPES:
        return "int", INT_TYPES[name]
    if isinstance(name, str):
        short = name[len("float8_"):] if name.startswith("float8_") else name
        if short in ONNX_FP8_FORMATS:
            return "fp8", ONNX_FP8_FORMATS[short]
        if name.startswith("float4_") and name[len("float4_"):] in ONNX_FP4_FORMATS:
            return "fp4", ONNX_FP4_FORMATS[name[len("float4_"):]]
    raise ValueError(f"{func}: {what} must be one of {sorted(INT_TYPES)}, an FP8 type "
                     f"({', '.join('float8_' + f for f in ONNX_FP8_FORMATS)}) or "
                     f"{', '.join('float4_' + f for f in ONNX_FP4_FORMATS)}, got {name!r}")


def _onnx_params(shape, scale, zero_point, axis, block_size, func):
    """The ONNX scale / zero point broadcast rule: ('tensor', ...),
    ('axis', axis, ...) or ('block', axis, B, ...), the parameters as
    float64 numpy arrays (a block's in x's layout with the axis last)."""
    s = np.asarray(A.to_host(scale), dtype=np.float64)
    z = None if zero_point is None else np.asarray(A.to_host(zero_point))
    if z is not None and z.dtype.kind not in "iuf" and _onnx_dtype_name(z) is None:
        raise TypeError(f"{func}: zero_point must be an integer array, got {z.dtype}")
    z = np.zeros(s.shape) if z is None else z.astype(np.float64)
    if z.shape != s.shape and not (z.size == s.size == 1 and z.ndim <= 1 and s.ndim <= 1):
        # (a 1-element 1-D zero point beside a 0-d scale, or the reverse, is ONNX-legal)
        raise ValueError(f"{func}: zero_point has shape {z.shape}, scale {s.shape}")
    if not np.isfinite(s).all() or (s == 0).any():
        raise ValueError(f"{func}: scale must be finite and nonzero")
    bs = A.as_int(block_size, "block_size", func)
    ndim = len(shape)
    if s.size == 1 and s.ndim <= 1 and bs == 0:  # per tensor
        return "tensor", None, None, s.reshape(1), z.reshape(1)
    ax = A.normalize_axis(axis, ndim, func)
    if bs == 0:
        if s.ndim != 1 or s.shape[0] != shape[ax]:
            raise ValueError(f"{func}: a per-axis scale must be 1-D of x.shape[axis] = "
                             f"{shape[ax]} values, got shape {s.shape}")
        return "axis", ax, None, s, z
    if bs < 0:
        raise ValueError(f"{func}: block_size must be >= 0, got {bs}")
    want = list(shape)
    want[ax] = -(-shape[ax] // bs)
    if list(s.shape) != want:
        raise ValueError(f"{func}: with block_size={bs} the scale must have shape "
                         f"{tuple(want)}, got {s.shape}")
    return "block", ax, bs, _to_last(s, ax).reshape(-1), _to_last(z, ax).reshape(-1)


@A.interop
def quantize_linear(x, scale, zero_point=None, *, axis=1, block_size=0, saturate=True,
                    output=None, compat=None):
    """ONNX QuantizeLinear (opset 21) with ORT's integer saturation.

    Scale / zero point: one value (per tensor), a 1-D array of
    ``x.shape[axis]`` values (per axis) or, with ``block_size`` B > 0, x's
    shape with dimension ``axis`` replaced by ``ceil(D / B)`` (blocks of B
    along ``axis``, the last one shorter).  In float32 (x's compute dtype)::

        integer outputs:  q = clamp(rint(x / scale) + zero_point, qmin, qmax)
                          NaN -> qmin (ORT);  compat="onnx_reference":
                          q = clamp(int32(rint(x / scale)) + zero_point) with
                          int32 wrap-around (NaN, +Inf, |v| >= 2**31 -> INT32_MIN)
        FP8 outputs:      q = cast_fp8(x / scale, saturate ? "satfinite" : "nonsat",
                          nan="ml_dtypes");  the zero point is ignored (as the
                          reference)
        float4_e2m1fn:    q = ml_dtypes' cast of x / scale to FLOAT4E2M1: round
                          half to even, |v| > 6 (and +-Inf) -> +-6 whatever
                          ``saturate``, NaN -> the zero of the opposite sign
                          (0x8 for +NaN, 0x0 for -NaN); the zero point must be
                          0 (onnx.reference adds it before the cast, which
                          makes a -0 quotient +0, as here when one is given;
                          a nonzero one is refused)

    Parameters
    ----------
    output : str, optional
        int8, uint8, int16, uint16, int4, uint4, int2, uint2,
        float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz or
        float4_e2m1fn.  Default: zero_point's type (numpy integer or an
        ml_dtypes int4 / uint4 / int2 / uint2 / float8 / float4 array), else
        uint8.  ``zero_point`` may be a 1-element 1-D array beside a 0-d
        scale (ONNX allows either shape for per-tensor parameters).

    Returns
    -------
    int8 / uint8 / int16 / uint16 array of x's shape (4- and 2-bit types
    unpacked in int8 / uint8; FP8 and FP4 as uint8 codes).
    """
    func = "quantize_linear"
    arr = _float_input(x, func)
    if output is None:
        output = _onnx_dtype_name(zero_point) or "uint8"
    kind, info = _onnx_type(output, func)
    if compat not in (None, "onnx_reference"):
        raise ValueError(f"{func}: compat must be None or 'onnx_reference', got {compat!r}")
    how, ax, bs, s, z = _onnx_params(arr.shape, scale, zero_point, axis, block_size, func)
    work = A.compute_dtype(arr.dtype)
    if kind == "int":
        qmin, qmax, container = info
        if ((z < qmin) | (z > qmax) | (z != np.round(z))).any():
            raise ValueError(f"{func}: zero_point must be integers in [{qmin}, {qmax}]")
        family, params, u0, u1 = "int", (s, z), float(qmin), float(qmax)
        mode = 8 * np.dtype(container).itemsize | (INT_WRAP32 if compat else 0)
    else:
        if kind == "fp4" and (z != 0).any():
            raise ValueError(f"{func}: a float4_e2m1fn zero point must be 0, got nonzero values")
        container = np.uint8
        family, params, u0, u1 = "fp8", (s,), 0.0, 0.0
        mode = info | F8_SCALE_DIV | NAN_ENCODING["ml_dtypes"] | \
            (OVERFLOW["satfinite"] if saturate or kind == "fp4" else OVERFLOW["nonsat"]) | \
            (F8_PLUS_ZERO if kind == "fp4" and zero_point is not None else 0)
    if how != "block":
        return _encode(family, arr, params, u0, u1, mode, ax if how == "axis" else None,
                       np.dtype(container), None, func)

    def run(moved, rows, k):
        xp = A.array_module(moved)
        mw = moved.astype(work, copy=False).reshape(-1)
        codes = xp.empty(moved.shape, dtype=container)
        A.kernels_for(mw, func).encode_groups(_ENC[family], mw, codes.reshape(-1), rows, k, bs,
                                              _param(params, work, xp), u0, u1, mode,
                                              _nthreads(mw))
        return codes
    return _blocked_call(arr, ax, run)


@A.interop
def dequantize_linear(q, scale, zero_point=None, *, axis=1, block_size=0, input=None,
                      output_dtype=np.float32):
    """ONNX DequantizeLinear (opset 21), computed in float32::

        integer input:  y = (f32(q) - f32(zero_point)) * scale
        FP8 / FP4 input: y = f32(q) * scale   (the zero point must be 0)

    ``input`` names the element type when q's dtype does not (FP8 / FP4
    codes as uint8, int4 values in int8); ml_dtypes float8 / float4_e2m1fn /
    int4 / uint4 / int2 / uint2 arrays name their own.
    Scale / zero point broadcast as in :func:`quantize_linear`; negative
    scales are allowed (ORT's symmetric MatMulNBits scales are).  Returns
    ``output_dtype`` (float32, or float16 / float64 from the float32 result).
    """
    func = "dequantize_linear"
    xp, arr = _as_codes(q, "q", func)
    name = input if input is not None else (_onnx_dtype_name(q) or arr.dtype.name)
    kind, info = _onnx_type(name, func, "input")
    how, ax, bs, s, z = _onnx_params(arr.shape, scale, zero_point, axis, block_size, func)
    if kind != "int":
        if arr.dtype.itemsize != 1:
            raise TypeError(f"{func}: {name} codes are one byte each, got {arr.dtype}")
        if (z != 0).any():
            what = "an FP4" if kind == "fp4" else "an FP8"
            raise ValueError(f"{func}: {what} zero point must be 0 (ONNX: 'is usually not "
                             "used'), got nonzero values")
        if kind == "fp4" and (arr >= 16).any():
            raise ValueError(f"{func}: {name} codes must be in [0, 15]")
        family, params, mode = "fp8", (s,), info | F8_DEQ_MUL
    else:
        qmin, qmax, container = info
        if arr.dtype.itemsize != np.dtype(container).itemsize:
            raise TypeError(f"{func}: {name} values come in {np.dtype(container).name}, got "
                            f"{arr.dtype}")
        if ((z < qmin) | (z > qmax) | (z != np.round(z))).any():
            raise ValueError(f"{func}: zero_point must be integers in [{qmin}, {qmax}]")
        family, params = "int", (s, z, np.zeros_like(s))
        mode = 8 * arr.dtype.itemsize | (INT_SIGNED if qmin < 0 else 0)
    dtype = np.dtype(output_dtype)
    if dtype not in A.FLOAT_DTYPES:
        raise TypeError(f"{func}: output_dtype must be float16, float32 or float64, got {dtype}")
    if how != "block":
        y = _decode(family, arr, params, 0.0, 0.0, mode, ax if how == "axis" else None,
                    np.float32, None, func)
        return y if dtype == np.float32 else y.astype(dtype)

    def run(moved, rows, k):
        y = xp.empty(moved.shape, dtype=np.float32)
        flat = moved.reshape(-1)
        A.kernels_for(flat, func).decode_groups(_DEC[family], flat, y.reshape(-1), rows, k, bs,
                                                _param(params, np.float32, xp), 0.0, 0.0, mode,
                                                _nthreads(flat))
        return y
    y = _blocked_call(arr, ax, run)
    return y if dtype == np.float32 else y.astype(dtype)
