"""FP8 casts and scaled FP8 fake quantization (the formats specification
§1-3), on numpy (CPU) and cupy (GPU).  Every per-element rule is one
template of ``include/qc_formats.h``; this module validates arguments and
computes the per-tensor / per-channel scales (a few values).

FP8 formats: the names of :data:`FP8_FORMATS` (the ``"cast"`` rows of
``formats._common.MINIFLOATS``), also with a ``"float8_"`` prefix.  Codes are uint8 (the raw
bits; view them as an ``ml_dtypes`` float8 dtype on the CPU if wanted).
"""
import numpy as np

from .. import _arrays as A
from ._common import (F8_DEQ_DIV, F8_DEQ_MUL, F8_MASK_AMAX, F8_SCALE_MUL, F32, FP8_FORMATS,
                      FP8_MAX, _as_codes, _cast_mode, _channel_count, _decode, _encode,
                      _float_input, _fp8_dtype_name, _fp8_name)


# -------------------------------------------------------------------- FP8
@A.interop
def cast_fp8(x, fmt="e4m3fn", *, overflow="satfinite", nan="sign", float64="direct",
             out=None):
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

    float64 input (``float64="direct"``, the default) is rounded once, from
    its float64 bits, to the format's grid (round half to even on the exact
    value: no double rounding).  ``float64="via_float32"`` rounds it to
    float32 first (half to even) and casts that, as ml_dtypes 0.6's
    ``astype`` does (so a float64 value just off a tie of the FP8 grid that
    float32 rounds onto the tie goes to even there); the overflow policy then
    sees the float32 value.  float16 is exact in float32.

    Parameters
    ----------
    x : array_like of float16, float32, float64 (or ml_dtypes bfloat16)
    fmt : {"e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"}
    overflow : {"satfinite", "nonsat", "torch"}
    nan : {"sign", "ml_dtypes"}
    float64 : {"direct", "via_float32"}
        How float64 input is rounded (above); ignored for other dtypes.
    out : uint8 array of x's shape, optional

    Returns
    -------
    uint8 array of codes.
    """
    func = "cast_fp8"
    name = _fp8_name(fmt, func)
    mode = _cast_mode(name, overflow, nan, func)
    if float64 not in ("direct", "via_float32"):
        raise ValueError(f"{func}: float64 must be 'direct' or 'via_float32', got {float64!r}")
    arr = _float_input(x, func)
    if float64 == "via_float32" and arr.dtype == np.float64:
        with np.errstate(over="ignore"):  # (beyond float32: +-inf, as ml_dtypes)
            arr = arr.astype(np.float32)
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
    from ..ops import _ew
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
        from ..ops import minmax
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
    from ..ops import _ew
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
