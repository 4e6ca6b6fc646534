"""Low-precision formats: FP8 casts and fake quant, ONNX QuantizeLinear /
DequantizeLinear, and integer group quantization of LLM weights (int4 / int8
with a scale and zero point per group), on numpy (CPU) and cupy (GPU).

Exact semantics: the project's formats specification §1-3 and §6.  Every per-element
rule is one template of ``include/qc_formats.h`` run by the CPU extension
and the CUDA kernels alike; this module validates arguments, computes the
per-tensor / per-channel scales (a few values) and lays the data out.

Codes are returned as integers: FP8 codes as uint8 (the raw bits; view them
as an ``ml_dtypes`` float8 dtype on the CPU if wanted), integer codes as
int8 / uint8 / int16 / uint16 values (int4 / uint4 / int2 / uint2 unpacked,
one per byte; :func:`pack_int4` packs them two per byte).

FP8 formats: ``"e4m3fn"``, ``"e5m2"``, ``"e4m3fnuz"``, ``"e5m2fnuz"`` (also
with a ``"float8_"`` prefix).
"""
import math

import numpy as np

from . import _arrays as A
from ._cpu import _kernels as K
from ._cpu.threads import effective_n_threads

__all__ = [
    "FP8_FORMATS", "cast_fp8", "fp8_decode", "fp8_fake_cast", "fp8_scale", "fp8_fake_quant",
    "fp8_quantize", "fp8_dequantize", "quantize_linear", "dequantize_linear",
    "group_quantize", "group_dequantize", "group_fake_quant", "group_qrange",
    "pack_int4", "unpack_int4", "pow2_scale_torch",
    # block-scaled formats, defined in quantcore.mx (imported at the end)
    "mx_quantize", "mx_dequantize", "mx_fake_quant", "nvfp4_quantize", "nvfp4_dequantize",
    "nvfp4_fake_quant",
]

F32 = np.float32

# Mode bits and ids, mirrored from qc_formats.h / qc_families.h (one
# definition there; tests/test_formats.py checks these against the header).
FP8_FORMATS = {"e4m3fn": 0, "e5m2": 1, "e4m3fnuz": 2, "e5m2fnuz": 3}
OVERFLOW = {"satfinite": 0, "nonsat": 16, "torch": 32}
NAN_ENCODING = {"sign": 0, "ml_dtypes": 64}
F8_SCALE_MUL, F8_SCALE_DIV, F8_DEQ_MUL, F8_DEQ_DIV, F8_MASK_AMAX = 128, 256, 512, 1024, 2048
INT_SIGNED, INT_WRAP32, INT_ADD_FLOAT = 32, 64, 128
GRP_SYMMETRIC = 1
#: the largest finite value of each FP8 format
FP8_MAX = {"e4m3fn": 448.0, "e5m2": 57344.0, "e4m3fnuz": 240.0, "e5m2fnuz": 57344.0}

#: ONNX integer element types: (qmin, qmax, numpy container)
INT_TYPES = {
    "int8": (-128, 127, np.int8), "uint8": (0, 255, np.uint8),
    "int16": (-32768, 32767, np.int16), "uint16": (0, 65535, np.uint16),
    "int4": (-8, 7, np.int8), "uint4": (0, 15, np.uint8),
    "int2": (-2, 1, np.int8), "uint2": (0, 3, np.uint8),
}
#: group recipes (qc_families.h QC_GROUP_RECIPES); those with a float zero point
GROUP_RECIPES = tuple(K.GROUP_RECIPES)
_FLOAT_ZP = ("tinygemm", "hqq")
_ENC, _DEC = K.ENCODE_FAMILIES, K.DECODE_FAMILIES


# ----------------------------------------------------------------- helpers
def _fp8_name(fmt, func):
    name = fmt[len("float8_"):] if isinstance(fmt, str) and fmt.startswith("float8_") else fmt
    if not isinstance(name, str) or name not in FP8_FORMATS:
        raise ValueError(f"{func}: fmt must be one of {sorted(FP8_FORMATS)} (optionally with a "
                         f"'float8_' prefix), got {fmt!r}")
    return name


def _cast_mode(name, overflow, nan, func):
    """The mode word of a cast / fake cast: format | overflow policy | NaN
    encoding (which matters for e5m2 only: dropped for the other formats,
    so that their kernels run the loops specialised without it)."""
    nan_bit = _choice(NAN_ENCODING, nan, "nan", func)
    return FP8_FORMATS[name] | _choice(OVERFLOW, overflow, "overflow", func) | \
        (nan_bit if name == "e5m2" else 0)


def _choice(table, value, name, func):
    if not isinstance(value, str) or value not in table:
        raise ValueError(f"{func}: {name} must be one of {sorted(table)}, got {value!r}")
    return table[value]


def _fp8_dtype_name(arr):
    """'e4m3fn' etc. for an ml_dtypes float8 array, else None."""
    name = getattr(arr, "dtype", None)
    name = getattr(name, "name", "")
    return name[len("float8_"):] if name.startswith("float8_") and \
        name[len("float8_"):] in FP8_FORMATS else None


def _nthreads(flat):
    return effective_n_threads(flat.shape[0])


def _param(values, work, xp):
    """A parameter array (NP arrays of C values, concatenated) for the
    kernels: numpy for the CPU, kept as given (host or device) for the GPU."""
    if xp is np:
        return np.ascontiguousarray(np.concatenate([np.asarray(v, work).reshape(-1)
                                                    for v in values]))
    return xp.concatenate([xp.asarray(v, dtype=work).reshape(-1) for v in values])


def _channel_count(axis, shape):
    return None if axis is None else shape[axis]


def _encode(family, arr, params, u0, u1, mode, axis, code_dtype, out, func):
    """An encode family over ``arr`` (per tensor or per channel along
    ``axis``) into codes of ``code_dtype`` with arr's shape."""
    work = A.compute_dtype(arr.dtype)
    layout = A.Layout(arr, work)
    o = A.Output(layout, arr, out, np.dtype(code_dtype), np.dtype(code_dtype), func)
    flat = layout.flat
    outer, C, inner = (1, 1, flat.shape[0]) if axis is None else layout.channels(axis)
    A.kernels_for(flat, func).encode(_ENC[family], flat, o.flat, outer, C, inner,
                                     _param(params, work, layout.xp), u0, u1, mode,
                                     _nthreads(flat))
    return o.finish(np.dtype(code_dtype))


def _decode(family, codes, params, u0, u1, mode, axis, dtype, out, func):
    """A decode family over integer ``codes`` into floats of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype not in A.FLOAT_DTYPES:
        raise TypeError(f"{func}: dtype must be float16, float32 or float64, got {dtype}")
    work = A.compute_dtype(dtype)
    layout = A.Layout(codes, codes.dtype)
    o = A.Output(layout, codes, out, dtype, work, func)
    flat = layout.flat
    outer, C, inner = (1, 1, flat.shape[0]) if axis is None else layout.channels(axis)
    A.kernels_for(flat, func).decode(_DEC[family], flat, o.flat, outer, C, inner,
                                     _param(params, work, layout.xp), u0, u1, mode,
                                     _nthreads(flat))
    return o.finish(dtype)


def _as_codes(q, name, func):
    """A numpy / cupy integer array of codes (ml_dtypes float8 arrays are
    viewed as their uint8 bits)."""
    A.require_cpu(q, func)
    xp = A.array_module(q)
    arr = q if A.is_cupy_array(q) or isinstance(q, np.ndarray) else np.asarray(q)
    if _fp8_dtype_name(arr) is not None:
        arr = arr.view(np.uint8)
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize > 2:
        raise TypeError(f"{func}: {name} must be an int8 / uint8 / int16 / uint16 array (or an "
                        f"ml_dtypes float8 array), got {A.describe(q)}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return xp, arr


def _float_input(x, func):
    if A.is_cupy_array(x) or isinstance(x, np.ndarray):
        if x.dtype.name == "bfloat16":  # ml_dtypes bfloat16: exact in float32
            x = x.astype(np.float32)
    return A.as_float_array(x, "x", func)


# -------------------------------------------------------------------- FP8
@A.interop
def cast_fp8(x, fmt="e4m3fn", *, overflow="satfinite", nan="sign", out=None):
    """Encode x into FP8 codes (uint8, x's shape), round half to even.

    For finite x the value is rounded to the format's grid (normal and
    subnormal; float32 subnormals give a signed zero), then::

        |r| > max finite or x = +-Inf:
            "satfinite" (default): +-max (ONNX saturate=1, CUDA satfinite)
            "nonsat":   e4m3fn NaN (0x7F|s), e5m2 +-Inf, fnuz NaN (0x80)
                        (ml_dtypes, ONNX saturate=0)
            "torch":    e4m3fn +-max, e5m2 +-Inf, fnuz NaN (torch 2.13 CPU)
        NaN: e4m3fn 0x7F|s; e5m2 0x7F|s (nan="sign") or 0x7E|s
             (nan="ml_dtypes"); fnuz 0x80
        zero: the sign kept (0x80 for -0) except fnuz (no -0: 0x00)

    float64 input is rounded directly (no double rounding through float32),
    as ml_dtypes does; float16 is exact in float32.

    Parameters
    ----------
    x : array_like of float16, float32, float64 (or ml_dtypes bfloat16)
    fmt : {"e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"}
    overflow : {"satfinite", "nonsat", "torch"}
    nan : {"sign", "ml_dtypes"}
    out : uint8 array of x's shape, optional

    Returns
    -------
    uint8 array of codes.
    """
    func = "cast_fp8"
    name = _fp8_name(fmt, func)
    mode = _cast_mode(name, overflow, nan, func)
    arr = _float_input(x, func)
    return _encode("fp8", arr, ([1.0],), 0.0, 0.0, mode, None, np.uint8, out, func)


@A.interop
def fp8_decode(codes, fmt=None, *, dtype=np.float32, out=None):
    """The values of FP8 codes (exact; NaN codes give the quiet NaN
    0x7FC00000 with the code's sign).

    Parameters
    ----------
    codes : uint8 / int8 array of codes, or an ml_dtypes float8 array (then
        ``fmt`` defaults to its format)
    fmt : {"e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"}
    dtype : float32 (default), float64 or float16 (every FP8 value is exact
        in each)
    """
    func = "fp8_decode"
    fmt = _fp8_dtype_name(codes) if fmt is None else fmt
    if fmt is None:
        raise ValueError(f"{func}: fmt is required for {A.describe(codes)} codes")
    name = _fp8_name(fmt, func)
    _, arr = _as_codes(codes, "codes", func)
    if arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: FP8 codes are one byte each, got {arr.dtype}")
    return _decode("fp8", arr, ([1.0],), 0.0, 0.0, FP8_FORMATS[name], None, dtype, out, func)


@A.interop
def fp8_fake_cast(x, fmt="e4m3fn", *, overflow="satfinite", nan="sign", out=None,
                  return_mask=False):
    """``fp8_decode(cast_fp8(x, ...))`` in one pass, in x's dtype (float16
    through float32).  ``mask = |x| <= max finite`` (False for NaN / Inf)."""
    func = "fp8_fake_cast"
    name = _fp8_name(fmt, func)
    mode = _cast_mode(name, overflow, nan, func)
    arr = _float_input(x, func)
    from .ops import _ew
    one = np.ones(1)
    return _ew("fp8", arr, (one, one, one), 0.0, 0.0, mode, out=out, mask=return_mask,
               func=func)


# floor(L(s)) of torch's float32 log2 (spec §3.2 / §4.2): 2**(e + 1) iff the
# mantissa f >= 2**23 - N_FLOOR_UP[e + 126], by binade of e in -126..127
_FLOOR_UP_BINADES = ((-126, -65, 44), (-64, -33, 22), (-32, -17, 11), (-16, -9, 5), (-8, -5, 2),
                     (-4, -3, 1), (-2, 1, 0), (2, 3, 1), (4, 7, 2), (8, 15, 5), (16, 31, 11),
                     (32, 63, 22), (64, 127, 44))
N_FLOOR_UP = np.zeros(254, np.int64)
for _lo, _hi, _n in _FLOOR_UP_BINADES:
    N_FLOOR_UP[_lo + 126:_hi + 127] = _n


def pow2_scale_torch(s):
    """torchao's ``_round_scale_down_to_power_of_2``: ``exp2(floor(log2(s)))``
    with torch's float32 ``log2`` (which rounds, so scales just below a
    power of two go up to it), by the exact rule of spec §3.2: for normal
    ``s = 2**e (1 + f / 2**23)`` the result is ``2**(e + 1)`` iff
    ``f >= 2**23 - N_FLOOR_UP[e]``, else ``2**e``.  0 -> 0, NaN -> NaN, Inf ->
    Inf; float32 subnormals (no table) use the exact floor."""
    s = np.asarray(s, F32)
    b = s.view(np.uint32).astype(np.int64)
    e = ((b >> 23) & 0xFF) - 127
    f = b & 0x7FFFFF
    normal = (e >= -126) & (e <= 127)
    up = normal & (f >= (1 << 23) - N_FLOOR_UP[np.clip(e + 126, 0, 253)])
    res_e = np.where(normal, e + up, 0)
    pow2 = np.ldexp(np.ones_like(s, dtype=np.float64), res_e).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sub = np.exp2(np.floor(np.log2(s.astype(np.float64)))).astype(F32)
    res = np.where(normal, pow2, sub)
    return np.where(np.isfinite(s) & (s != 0), res, s).astype(F32)


def fp8_scale(amax, fmt="e4m3fn", *, recipe="modelopt", pow2=False):
    """The FP8 scale ``s`` (x is quantized as ``cast(x * s)``) from amax.

    modelopt (e4m3fn only)::

        a = 1 if amax <= 2**-24 else amax
        s = f32(f32(1 / a) * 448)            (448.0 / tensor: reciprocal, then product)

    torchao (e4m3fn and e5m2; fmax = 448 / 57344)::

        s = f32(f64(f64(1 / max(f64(amax), 1e-12)) * fmax))
        pow2: s = pow2_scale_torch(s)

    Returns float32 array(s) of amax's shape (Inf amax gives 0 for torchao).
    """
    func = "fp8_scale"
    name = _fp8_name(fmt, func)
    a = np.asarray(A.to_host(amax), dtype=F32)
    if recipe == "modelopt":
        if name != "e4m3fn":
            raise ValueError(f"{func}: the modelopt recipe supports fmt='e4m3fn' only, got "
                             f"{fmt!r}")
        if pow2:
            raise ValueError(f"{func}: pow2 is a torchao option")
        a1 = np.where(a <= F32(2.0 ** -24), F32(1), a)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            return ((F32(1) / a1).astype(F32) * F32(448)).astype(F32)
    if recipe == "torchao":
        if name not in ("e4m3fn", "e5m2"):
            raise ValueError(f"{func}: the torchao recipe supports 'e4m3fn' and 'e5m2', got "
                             f"{fmt!r}")
        a64 = a.astype(np.float64)
        a64 = np.where(a64 < 1e-12, 1e-12, a64)  # torch.clamp: NaN stays NaN
        with np.errstate(divide="ignore", invalid="ignore"):
            s = ((1.0 / a64) * FP8_MAX[name]).astype(F32)
        return pow2_scale_torch(s) if pow2 else s
    raise ValueError(f"{func}: recipe must be 'modelopt' or 'torchao', got {recipe!r}")


def _fp8_params(arr, amax, fmt, recipe, pow2, axis, func):
    """(format name, amax float32[C], scale float32[C]): amax computed as
    max(|min|, |max|) per tensor / per channel when None (NaN propagates)."""
    name = _fp8_name(fmt, func)
    if amax is None:
        from .ops import minmax
        lo, hi = minmax(arr, axis)
        lo, hi = A.to_host(lo), A.to_host(hi)
        am = np.maximum(np.abs(np.asarray(lo, F32)), np.abs(np.asarray(hi, F32)))
        am = np.where(np.isnan(lo) | np.isnan(hi), F32(np.nan), am).astype(F32).reshape(-1)
    else:
        am = A.param_array(amax, "amax", func, _channel_count(axis, arr.shape)).astype(F32)
        bad = ~(np.isfinite(am) & (am >= 0))
        if bad.any():
            raise ValueError(f"{func}: amax must be >= 0 and finite, got "
                             f"{am[bad][:4].tolist()}")
    return name, am, fp8_scale(am, name, recipe=recipe, pow2=pow2)


def _fp8_dequant_args(s, recipe):
    """(dequantize factor, QC_F8_DEQ_* bit): modelopt multiplies by
    f32(1 / s), torchao divides by s."""
    if recipe == "modelopt":
        with np.errstate(divide="ignore"):
            return (F32(1) / s).astype(F32), F8_DEQ_MUL
    return s, F8_DEQ_DIV


@A.interop
def fp8_fake_quant(x, amax=None, fmt="e4m3fn", *, recipe="modelopt", pow2=False, axis=None,
                   out=None, return_mask=False):
    """Scaled FP8 fake quantization (spec §3), in x's compute dtype::

        s    = fp8_scale(amax, fmt, recipe=recipe, pow2=pow2)
        q    = cast_fp8(x * s, fmt)          ("satfinite": clamp to +-max, then RNE)
        y    = decode(q) * f32(1 / s)        (modelopt)
             = decode(q) / s                 (torchao)
        mask = |x| <= amax                   (modelopt, its backward)
             = |x * s| <= max finite         (torchao)

    Parameters
    ----------
    amax : float or array, optional
        Per tensor, or one per index of ``axis``; default: max(|min|, |max|)
        of x (per channel along ``axis``), NaN when x holds a NaN.
    axis : int or None
        The axis kept (one scale per index): torchao's rowwise scaling of
        ``[M, K]`` is ``axis=0``.
    """
    func = "fp8_fake_quant"
    arr = _float_input(x, func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    name, am, s = _fp8_params(arr, amax, fmt, recipe, pow2, axis, func)
    dq, dq_bit = _fp8_dequant_args(s, recipe)
    mode = FP8_FORMATS[name] | F8_SCALE_MUL | dq_bit | (F8_MASK_AMAX if recipe == "modelopt"
                                                         else 0)
    from .ops import _ew
    work = A.compute_dtype(arr.dtype)
    return _ew("fp8", arr, [np.asarray(v).astype(work) for v in (s, dq, am)], 0.0, 0.0, mode,
               axis=axis, out=out, mask=return_mask, func=func)


@A.interop
def fp8_quantize(x, amax=None, fmt="e4m3fn", *, recipe="modelopt", pow2=False, axis=None):
    """FP8 codes and scales: ``(cast_fp8(x * s, fmt), s)`` with ``s`` as in
    :func:`fp8_fake_quant` (torchao's ``hp_tensor_and_scale_to_float8``
    data and scale).  Returns (uint8 codes of x's shape, float32 scale: one
    value, or one per index of ``axis``)."""
    func = "fp8_quantize"
    arr = _float_input(x, func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    name, _, s = _fp8_params(arr, amax, fmt, recipe, pow2, axis, func)
    codes = _encode("fp8", arr, (s,), 0.0, 0.0, FP8_FORMATS[name] | F8_SCALE_MUL, axis,
                    np.uint8, None, func)
    s = A.array_module(codes).asarray(s)  # (the caller's array kind)
    return codes, (s.reshape(()) if axis is None else s)


@A.interop
def fp8_dequantize(codes, scale, fmt="e4m3fn", *, recipe="modelopt", axis=None,
                   dtype=np.float32):
    """Dequantize FP8 codes with the scale ``s`` of :func:`fp8_quantize`:
    ``decode(q) * f32(1 / s)`` (modelopt) or ``decode(q) / s`` (torchao)."""
    func = "fp8_dequantize"
    name = _fp8_name(fmt, func)
    if recipe not in ("modelopt", "torchao"):
        raise ValueError(f"{func}: recipe must be 'modelopt' or 'torchao', got {recipe!r}")
    _, arr = _as_codes(codes, "codes", func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    s = A.param_array(scale, "scale", func, _channel_count(axis, arr.shape)).astype(F32)
    dq, dq_bit = _fp8_dequant_args(s, recipe)
    return _decode("fp8", arr, (dq,), 0.0, 0.0, FP8_FORMATS[name] | dq_bit, axis, dtype, None,
                   func)


# ------------------------------------------------------------------- ONNX
def _onnx_type(name, func, what="output"):
    """('int', (qmin, qmax, container)) or ('fp8', format name)."""
    if name in INT_TYPES:
        return "int", INT_TYPES[name]
    if isinstance(name, str):
        short = name[len("float8_"):] if name.startswith("float8_") else name
        if short in FP8_FORMATS:
            return "fp8", short
    raise ValueError(f"{func}: {what} must be one of {sorted(INT_TYPES)} or an FP8 type "
                     f"({', '.join('float8_' + f for f in FP8_FORMATS)}), got {name!r}")


def _onnx_params(shape, scale, zero_point, axis, block_size, func):
    """The ONNX scale / zero point broadcast rule: ('tensor', ...),
    ('axis', axis, ...) or ('block', axis, B, ...), the parameters as
    float64 numpy arrays (a block's in x's layout with the axis last)."""
    s = np.asarray(A.to_host(scale), dtype=np.float64)
    z = None if zero_point is None else np.asarray(A.to_host(zero_point))
    if z is not None and z.dtype.kind not in "iuf" and _fp8_dtype_name(z) is None:
        raise TypeError(f"{func}: zero_point must be an integer array, got {z.dtype}")
    if z is not None and _fp8_dtype_name(z) is not None:
        z = z.astype(np.float64)
    z = np.zeros(s.shape) if z is None else z.astype(np.float64)
    if z.shape != s.shape:
        raise ValueError(f"{func}: zero_point has shape {z.shape}, scale {s.shape}")
    if not np.isfinite(s).all() or (s == 0).any():
        raise ValueError(f"{func}: scale must be finite and nonzero")
    bs = A.as_int(block_size, "block_size", func)
    ndim = len(shape)
    if s.size == 1 and s.ndim <= 1 and bs == 0:
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


def _to_last(a, ax):
    """``moveaxis(a, ax, -1)`` through ``transpose`` (numpy and cupy alike)."""
    perm = [d for d in range(a.ndim) if d != ax] + [ax]
    return a.transpose(perm)


def _from_last(a, ax):
    """The inverse of :func:`_to_last`."""
    perm = list(range(a.ndim - 1))
    perm.insert(ax, a.ndim - 1)
    return a.transpose(perm)


def _blocked_call(arr, ax, fn):
    """fn(rows x K contiguous data) -> result of the same layout, with the
    block axis moved last (a copy only when it is not already)."""
    xp = A.array_module(arr)
    moved = xp.ascontiguousarray(_to_last(arr, ax))
    res = fn(moved, math.prod(moved.shape[:-1]), moved.shape[-1])
    return xp.ascontiguousarray(_from_last(res, ax))


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

    Parameters
    ----------
    output : str, optional
        int8, uint8, int16, uint16, int4, uint4, int2, uint2 or
        float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz.
        Default: zero_point's type (numpy integer or ml_dtypes float8),
        else uint8.

    Returns
    -------
    int8 / uint8 / int16 / uint16 array of x's shape (4- and 2-bit types
    unpacked in int8 / uint8; FP8 as uint8 codes).
    """
    func = "quantize_linear"
    arr = _float_input(x, func)
    if output is None:
        zd = getattr(zero_point, "dtype", None)
        output = ("float8_" + _fp8_dtype_name(zero_point)) if _fp8_dtype_name(zero_point) \
            else (zd.name if zd is not None and zd.kind in "iu" else "uint8")
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
        container = np.uint8
        family, params, u0, u1 = "fp8", (s,), 0.0, 0.0
        mode = FP8_FORMATS[info] | F8_SCALE_DIV | NAN_ENCODING["ml_dtypes"] | \
            (OVERFLOW["satfinite"] if saturate else OVERFLOW["nonsat"])
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
        FP8 input:      y = f32(q) * scale   (the zero point must be 0)

    ``input`` names the element type when q's dtype does not (FP8 codes as
    uint8, int4 values in int8); ml_dtypes float8 arrays name their own.
    Scale / zero point broadcast as in :func:`quantize_linear`; negative
    scales are allowed (ORT's symmetric MatMulNBits scales are).  Returns
    ``output_dtype`` (float32, or float16 / float64 from the float32 result).
    """
    func = "dequantize_linear"
    xp, arr = _as_codes(q, "q", func)
    name = input if input is not None else (("float8_" + _fp8_dtype_name(q))
                                             if _fp8_dtype_name(q) else arr.dtype.name)
    kind, info = _onnx_type(name, func, "input")
    how, ax, bs, s, z = _onnx_params(arr.shape, scale, zero_point, axis, block_size, func)
    if kind == "fp8":
        if arr.dtype.itemsize != 1:
            raise TypeError(f"{func}: FP8 codes are one byte each, got {arr.dtype}")
        if (z != 0).any():
            raise ValueError(f"{func}: an FP8 zero point must be 0 (ONNX: 'is usually not "
                             "used'), got nonzero values")
        family, params, mode = "fp8", (s,), FP8_FORMATS[info] | F8_DEQ_MUL
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


# ------------------------------------------------------ group quantization
def _group_bits(bits, func):
    b = A.as_int(bits, "bits", func)
    if not 2 <= b <= 8:
        raise ValueError(f"{func}: bits must be in 2..8, got {b}")
    return b


def group_qrange(bits, recipe="onnx", symmetric=False, quant_min=None, quant_max=None):
    """(qmin, qmax) of a group recipe's codes (spec §6.2): [0, 2**bits - 1]
    for onnx (symmetric too: zero point 2**(bits-1)), tinygemm, hqq, gptq and
    asymmetric awq / torchao; [-2**(bits-1), 2**(bits-1) - 1] for symmetric
    awq / torchao.  torchao takes ``quant_min`` / ``quant_max`` as well."""
    func = "group_quantize"
    if recipe not in GROUP_RECIPES:
        raise ValueError(f"{func}: recipe must be one of {list(GROUP_RECIPES)}, got {recipe!r}")
    b = _group_bits(bits, func)
    if symmetric and recipe in _FLOAT_ZP:
        raise ValueError(f"{func}: the {recipe} recipe is asymmetric only (symmetric=False)")
    signed = symmetric and recipe in ("awq", "torchao", "onnx_numpy")
    qmin, qmax = (-(1 << (b - 1)), (1 << (b - 1)) - 1) if signed else (0, (1 << b) - 1)
    if quant_min is not None or quant_max is not None:
        if recipe != "torchao":
            raise ValueError(f"{func}: quant_min / quant_max are torchao options")
        qmin = qmin if quant_min is None else A.as_int(quant_min, "quant_min", func)
        qmax = qmax if quant_max is None else A.as_int(quant_max, "quant_max", func)
        if not -128 <= qmin < qmax <= 255 or (qmin < 0 and qmax > 127):
            raise ValueError(f"{func}: [quant_min, quant_max] = [{qmin}, {qmax}] must fit int8 "
                             "or uint8")
    return qmin, qmax


def _blocked_input(x, axis, size, func, x_name="x", size_name="block_size"):
    """``(arr, axis, size)`` checked for a function that works on blocks (or
    groups) of ``size`` elements along ``axis``: a float input of at least
    one dimension, a valid axis, a whole ``size >= 1``; the messages name
    the arguments ``x_name`` and ``size_name``."""
    arr = _float_input(x, func)
    if arr.ndim == 0:
        raise ValueError(f"{func}: {x_name} must have at least one dimension")
    ax = A.normalize_axis(axis, arr.ndim, func)
    n = A.as_int(size, size_name, func)
    if n < 1:
        raise ValueError(f"{func}: {size_name} must be >= 1, got {n}")
    return arr, ax, n


def _group_args(w, bits, group_size, axis, symmetric, recipe, quant_min, quant_max, func):
    arr, ax, g = _blocked_input(w, axis, group_size, func, "w", "group_size")
    qmin, qmax = group_qrange(bits, recipe, symmetric, quant_min, quant_max)
    if recipe not in ("onnx", "onnx_numpy") and arr.shape[ax] % g:
        raise ValueError(f"{func}: w.shape[axis] = {arr.shape[ax]} is not a multiple of "
                         f"group_size {g} (only recipe='onnx' allows a shorter last group)")
    mode = (GRP_SYMMETRIC if symmetric else 0)
    return arr, ax, g, qmin, qmax, mode


def _group_run(arr, ax, g, recipe, qmin, qmax, mode, want_codes, want_y, want_mask, func):
    """The group driver over arr with groups of g along ax: (codes, y, mask,
    scale, zp) in arr's layout (None for what was not asked)."""
    xp = A.array_module(arr)
    moved = xp.ascontiguousarray(_to_last(arr, ax)).astype(F32, copy=False)
    rows, k = math.prod(moved.shape[:-1]), moved.shape[-1]
    ng = -(-k // g)
    flat = moved.reshape(-1)
    codes = xp.empty(moved.shape, np.uint8) if want_codes else None
    y = xp.empty(moved.shape, F32) if want_y else None
    mask = xp.empty(moved.shape, np.uint8) if want_mask else None
    scale = xp.empty(moved.shape[:-1] + (ng,), F32)
    zp = xp.empty(moved.shape[:-1] + (ng,), F32)
    if flat.size:  # (an empty w: empty codes and no group)
        A.kernels_for(flat, func).group_quant(
            K.GROUP_RECIPES[recipe], flat, None if codes is None else codes.reshape(-1),
            None if y is None else y.reshape(-1), None if mask is None else mask.reshape(-1),
            scale.reshape(-1), zp.reshape(-1), rows, k, g, float(qmin), float(qmax), mode,
            _nthreads(flat))

    def back(a):
        return None if a is None else xp.ascontiguousarray(_from_last(a, ax))
    return back(codes), back(y), back(mask), back(scale), back(zp)


@A.interop
def group_quantize(w, bits=4, group_size=128, *, axis=-1, symmetric=False, recipe="onnx",
                   quant_min=None, quant_max=None):
    """Integer group quantization of a weight: one scale and zero point per
    ``group_size`` consecutive elements along ``axis`` (the input dimension
    K of ``W[N, K]``), by a reference's exact float32 arithmetic (spec §6.2):

    - ``"onnx"`` (default, ORT MatMulNBits / MLAS): zero in the range,
      ``s = (mx0 - mn0) / qmax``, ``zp = RNA(-mn0 / s)``,
      ``q = RNA(x * f32(1 / s) + zp)``; symmetric: ``s = -m / 2**(bits-1)``
      with m the signed value of largest magnitude (negative scales), zero
      point ``2**(bits-1)``.  A shorter last group is allowed.
    - ``"onnx_numpy"``: ORT's numpy weight quantizer (used for Gather):
      the same scales, ``q = rint(x / s) + zp``; symmetric codes signed.
    - ``"torchao"``: ``choose_qparams_affine`` / ``quantize_affine``
      (symmetric divides the range by ``(qmax - qmin) / 2``; eps 2**-126),
      with ``quant_min`` / ``quant_max`` options.
    - ``"tinygemm"``: float zero point ``mn + 8 s``, ``q = rint((x - min) / s)``.
    - ``"hqq"``: HQQ's initialisation (ORT's port, no optimisation).
    - ``"awq"``: llm-awq ``pseudo_quantize_tensor`` (symmetric =
      ``zero_point=False``).
    - ``"gptq"``: GPTQ ``Quantizer.find_params`` + ``quantize`` (no error
      feedback).

    Computed in float32 (float16 / bfloat16 weights are exact in it; float64
    is rounded to float32 first).  Non-finite weights give a NaN / Inf scale
    for their group (a NaN group: integer zero point 0); NaN elements get
    the code qmin.

    Returns
    -------
    (q, scale, zero_point) : q has w's shape: uint8 codes for the unsigned
    ranges, int8 for the signed ones (symmetric awq / torchao / onnx_numpy);
    scale (float32) and zero_point have w's shape with ``axis`` replaced by
    ``ceil(K / group_size)``; zero_point is float32 for tinygemm and hqq,
    else q's dtype.
    """
    func = "group_quantize"
    arr, ax, g, qmin, qmax, mode = _group_args(w, bits, group_size, axis, symmetric, recipe,
                                               quant_min, quant_max, func)
    codes, _, _, scale, zp = _group_run(arr, ax, g, recipe, qmin, qmax, mode, True, False,
                                        False, func)
    code_dtype = np.int8 if qmin < 0 else np.uint8
    if recipe not in _FLOAT_ZP:  # (a group holding NaN has zero point 0)
        xp = A.array_module(zp)
        zp = xp.where(zp == zp, zp, 0).astype(code_dtype)
    return codes.view(code_dtype), scale, zp


@A.interop
def group_fake_quant(w, bits=4, group_size=128, *, axis=-1, symmetric=False, recipe="onnx",
                     quant_min=None, quant_max=None, return_mask=False):
    """``group_dequantize(*group_quantize(w, ...))`` in one pass, float32,
    with the reference's own dequantisation (AWQ / GPTQ keep the sign of a
    zero ``q``).  ``mask``: the rounded value lies in [qmin, qmax] (the
    straight-through estimator's mask).  Returns y (and the mask)."""
    func = "group_fake_quant"
    arr, ax, g, qmin, qmax, mode = _group_args(w, bits, group_size, axis, symmetric, recipe,
                                               quant_min, quant_max, func)
    _, y, mask, _, _ = _group_run(arr, ax, g, recipe, qmin, qmax, mode, False, True,
                                  return_mask, func)
    return (y, mask.view(np.bool_)) if return_mask else y


@A.interop
def group_dequantize(q, scale, zero_point, group_size, *, axis=-1, recipe="onnx", bits=4):
    """Dequantize group codes (float32)::

        y = (f32(q) - zero_point) * scale                 (every recipe but tinygemm)
        y = (f32(q) - 2**(bits-1)) * scale + zero_point    (tinygemm: float zero point)

    ``scale`` / ``zero_point`` as :func:`group_quantize` returns them."""
    func = "group_dequantize"
    xp, arr = _as_codes(q, "q", func)
    if arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: q must be int8 / uint8 codes, got {arr.dtype}")
    if recipe not in GROUP_RECIPES:
        raise ValueError(f"{func}: recipe must be one of {list(GROUP_RECIPES)}, got {recipe!r}")
    ax = A.normalize_axis(axis, arr.ndim, func)
    g = A.as_int(group_size, "group_size", func)
    if g < 1:
        raise ValueError(f"{func}: group_size must be >= 1, got {g}")
    want = list(arr.shape)
    want[ax] = -(-arr.shape[ax] // g)
    s = xp.asarray(scale, dtype=F32)
    z = xp.asarray(zero_point, dtype=F32)
    if list(s.shape) != want or list(z.shape) != want:
        raise ValueError(f"{func}: scale and zero_point must have shape {tuple(want)}, got "
                         f"{s.shape} and {z.shape}")
    mode = 8 | (INT_SIGNED if arr.dtype.kind == "i" else 0)
    s = _to_last(s, ax).reshape(-1)
    z = _to_last(z, ax).reshape(-1)
    if recipe == "tinygemm":
        b = _group_bits(bits, func)
        params, mode = (s, xp.full(s.shape, 1 << (b - 1), F32), z), mode | INT_ADD_FLOAT
    else:
        params = (s, z, xp.zeros(s.shape, F32))

    def run(moved, rows, k):
        y = xp.empty(moved.shape, dtype=F32)
        flat = moved.reshape(-1)
        A.kernels_for(flat, func).decode_groups(_DEC["int"], flat, y.reshape(-1), rows, k, g,
                                                _param(params, F32, xp), 0.0, 0.0, mode,
                                                _nthreads(flat))
        return y
    return _blocked_call(arr, ax, run)


# ---------------------------------------------------------------- packing
_ORDERS = ("low_first", "high_first")


@A.interop
def pack_int4(q, *, order="low_first"):
    """Pack 4-bit values two per byte along the last axis.

    ``order="low_first"`` (ONNX INT4 / UINT4 raw data, ORT MatMulNBits):
    element 2i in the low nibble, 2i+1 in the high nibble; an odd last axis
    is padded with a zero nibble.  ``"high_first"``: tinygemm's CUDA order.
    Signed values are stored as two's-complement nibbles.  A 1-D array
    gives ONNX's raw data: ``pack_int4(q.reshape(-1))``.

    Returns uint8 of shape ``q.shape[:-1] + (ceil(q.shape[-1] / 2),)``.
    """
    func = "pack_int4"
    xp, arr = _as_codes(q, "q", func)
    if order not in _ORDERS:
        raise ValueError(f"{func}: order must be one of {list(_ORDERS)}, got {order!r}")
    if arr.ndim == 0:
        raise ValueError(f"{func}: q must have at least one dimension")
    v = arr.astype(np.int16)
    if bool(((v < -8) | (v > 15)).any()):
        raise ValueError(f"{func}: values must fit 4 bits (int4 -8..7 or uint4 0..15)")
    nib = (v & 0xF).astype(np.uint8)
    if nib.shape[-1] % 2:
        nib = xp.concatenate([nib, xp.zeros(nib.shape[:-1] + (1,), np.uint8)], axis=-1)
    first, second = nib[..., 0::2], nib[..., 1::2]
    if order == "high_first":
        first, second = second, first
    return xp.ascontiguousarray(first | (second << 4))


@A.interop
def unpack_int4(packed, n, *, signed=False, order="low_first"):
    """The inverse of :func:`pack_int4`: ``n`` values along the last axis,
    int8 (``signed``: two's-complement nibbles) or uint8."""
    func = "unpack_int4"
    xp, arr = _as_codes(packed, "packed", func)
    if order not in _ORDERS:
        raise ValueError(f"{func}: order must be one of {list(_ORDERS)}, got {order!r}")
    if arr.dtype.itemsize != 1:
        raise TypeError(f"{func}: packed must be uint8 / int8 bytes, got {arr.dtype}")
    if arr.ndim == 0:
        raise ValueError(f"{func}: packed must have at least one dimension")
    n = A.as_int(n, "n", func)
    if not 0 <= n <= 2 * arr.shape[-1]:
        raise ValueError(f"{func}: n = {n} does not fit {arr.shape[-1]} bytes")
    b = arr.view(np.uint8)
    lo, hi = b & 0xF, b >> 4
    if order == "high_first":
        lo, hi = hi, lo
    out = xp.stack([lo, hi], axis=-1).reshape(b.shape[:-1] + (2 * b.shape[-1],))[..., :n]
    if signed:
        return xp.ascontiguousarray(((out.astype(np.int16) ^ 8) - 8).astype(np.int8))
    return xp.ascontiguousarray(out)


# ------------------------------------------- block-scaled formats (MX, NVFP4)
from .mx import (mx_dequantize, mx_fake_quant, mx_quantize, nvfp4_dequantize,  # noqa: E402
                 nvfp4_fake_quant, nvfp4_quantize)
