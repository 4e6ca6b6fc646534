"""ORT's quantization parameters and its Q/DQ numerics (``quant_utils``,
``QuantizeLinear`` / ``DequantizeLinear``)."""
import warnings

import numpy as np

from ... import _arrays as A
from .qtypes import (
    TENSOR_TYPES, VERSIONS, _F32, _F64, _FLOAT8_TYPES, _INT_TYPES, _LINEAR_RANGE,
    _ML_DTYPE_NAMES, _RANGE, _REDUCED_RANGE, _SYMMETRIC_RANGE, _ml_dtypes, _require_numpy,
    np_dtype, type_name,
)


# --------------------------------------------------------------- qparams
def get_qmin_qmax_for_qType(qType, reduce_range=False, symmetric=False):  # noqa: N802
    """``(qmin, qmax)`` as 0-d arrays of the quantized dtype.  ``reduce_range``
    wins over ``symmetric``; symmetric INT8 / INT16 drop the lowest code
    (there is no symmetric table for the other types)."""
    name = type_name(qType, "get_qmin_qmax_for_qType")
    if name == "FLOAT8E4M3FN":
        raise NotImplementedError("This function is not implemented for float 8 as not needed.")
    if reduce_range:
        qrange = _REDUCED_RANGE.get(name)
    elif symmetric and name in _SYMMETRIC_RANGE:
        qrange = _SYMMETRIC_RANGE[name]
    else:
        qrange = _RANGE.get(name) if name != "INT32" else None
    if qrange is None:
        raise ValueError(f"Unexpected data type {TENSOR_TYPES[name]} requested. Only INT8, UINT8, "
                         "INT16, and UINT16 are supported.")
    dt = np_dtype(name)
    return np.array(qrange[0], dtype=dt), np.array(qrange[1], dtype=dt)


def get_qrange_for_qType(qType, reduce_range=False, symmetric=False):  # noqa: N802
    """``qmax - qmin`` in the quantized dtype."""
    qmin, qmax = get_qmin_qmax_for_qType(qType, reduce_range, symmetric)
    return qmax - qmin


def _range_array(v, func, name):
    _require_numpy(v, name, func)
    if not isinstance(v, (np.ndarray, np.generic)):
        raise TypeError(f"{func}: {name} must be a numpy array or numpy scalar of float32 or "
                        f"float16 (ORT needs .dtype), got {type(v).__name__}")
    v = np.asarray(v)
    if v.dtype not in (np.float32, np.float16, np.float64):
        raise TypeError(f"{func}: {name} must be float32 or float16, got {v.dtype}")
    return v


def compute_scale_zp(rmin, rmax, qmin, qmax, symmetric=False, min_real_range=None, *,
                     version="1.32"):
    """``[zero_point, scale]`` of ORT's ``compute_scale_zp`` (module docstring).

    Parameters
    ----------
    rmin, rmax : numpy arrays or scalars of one float dtype T, one element
    qmin, qmax : 0-d integer arrays (:func:`get_qmin_qmax_for_qType`) or ints
    symmetric : bool
    min_real_range : float or None
        ORT's ``MinimumRealRange``: ``hi = max(hi, T(lo + T(mrr)))``.
    version : {"1.32", "1.27"}
        "1.27" (ORT <= 1.27) subtracts the range in T before widening, which
        changes the scale when ``hi - lo`` is inexact in T and overflows for
        +-3.4e38.

    Returns
    -------
    [zero_point, scale] : zero point in qmin's dtype, scale in T, with the
    shape of ``rmin`` (0-d or (1,)).
    """
    func = "compute_scale_zp"
    if version not in VERSIONS:
        raise ValueError(f"{func}: version must be one of {VERSIONS}, got {version!r}")
    rmin = _range_array(rmin, func, "rmin")
    rmax = _range_array(rmax, func, "rmax")
    qmin_a, qmax_a = np.asarray(qmin), np.asarray(qmax)
    if qmin_a > 0 or qmax_a < 0:
        raise ValueError(f"qmin and qmax must meet requirement: qmin <= 0 <= qmax while "
                         f"qmin:{qmin}, qmmax:{qmax}")
    if rmin.size != 1 or rmax.size != 1:
        raise ValueError(f"{func}: rmin and rmax must hold one value each (ORT cannot "
                         f"consume per-channel ranges), got shapes {rmin.shape} and {rmax.shape}")
    dt = rmax.dtype
    lo = np.minimum(rmin, np.array(0, dtype=rmin.dtype))
    hi = np.maximum(rmax, np.array(0, dtype=rmax.dtype))
    if min_real_range is not None:
        hi = max(hi, lo + np.asarray(min_real_range, dtype=rmin.dtype))
    if symmetric:
        m = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -m, +m
    if version == "1.32":
        dr = np.array(hi, dtype=_F64) - np.array(lo, dtype=_F64)
    else:
        with np.errstate(over="ignore"):
            dr = np.array(hi - lo, dtype=_F64)
    dq = np.array(qmax_a, dtype=_F64) - np.array(qmin_a, dtype=_F64)
    s64 = np.array(dr / dq)
    if not s64 >= 0:
        raise AssertionError("scale issue")
    stored = s64.astype(dt)
    if dt == np.float16:
        tiny = np.finfo(np.float16).smallest_subnormal if version == "1.32" else \
            np.finfo(np.float16).tiny
        degenerate = (stored if version == "1.32" else s64) < tiny
    else:
        degenerate = s64 < np.finfo(dt).tiny
    zdt = (qmin_a.dtype
           if qmin_a.dtype.kind in "iu" or qmin_a.dtype.name.startswith(("int", "uint"))
           else np.dtype(np.int64))
    if degenerate:
        return [np.array(0, dtype=zdt).reshape(s64.shape),
                np.array(1.0, dtype=dt).reshape(s64.shape)]
    if symmetric:
        zp = np.array(np.round((qmin_a + qmax_a) / np.array(2.0, dtype=_F64)), dtype=zdt)
    else:
        with np.errstate(invalid="ignore"):
            zp = np.array(np.round(qmin_a - lo / s64), dtype=zdt)
    return [zp.reshape(s64.shape), stored]


def snap_zero_point_to_uint8(rmin, rmax, qmin=0, qmax=255, min_real_range=None):
    """ORT's ``ActivationRestrictedAsymmetric`` qparams (uint8, float64 host
    arithmetic): zp ``qmin`` for ``rmin >= 0`` else ``mid = (qmin+qmax+1)//2``;
    scale ``rmax / (qmax - qmin)`` or ``max(-rmin/(mid-qmin), rmax/(qmax-mid))``,
    floored at ``mrr / (qmax - qmin)``; degenerate ranges (``rmax <= rmin``)
    get ``(absmax or 1) / denom``.  Returns ``(zero_point uint8, scale float32)``."""
    qmin_val, qmax_val = int(qmin), int(qmax)
    mid = (qmin_val + qmax_val + 1) // 2
    lo = min(float(np.squeeze(rmin)), 0.0)
    hi = max(float(np.squeeze(rmax)), 0.0)
    if min_real_range is not None and min_real_range > 0:
        hi = max(hi, lo + float(min_real_range))
    floor = None if min_real_range is None else min_real_range / (qmax_val - qmin_val)
    if hi <= lo:
        zp = qmin_val if lo >= 0.0 else mid
        absmax = max(abs(lo), abs(hi))
        denom = (qmax_val - qmin_val) if zp == qmin_val else max(1, (qmax_val - qmin_val) // 2)
        scale = (absmax if absmax > 0 else 1.0) / max(1, denom)
        if floor is not None and scale < floor:
            scale = floor
        return np.array(zp, dtype=np.uint8), np.array(scale, dtype=_F32)
    if lo >= 0.0:
        zp, scale = qmin_val, np.array(hi / (qmax_val - qmin_val), dtype=_F32)
    else:
        zp = mid
        scale = np.array(max(-lo / (mid - qmin_val), hi / (qmax_val - mid)), dtype=_F32)
    if floor is not None and float(scale) < floor:
        scale = np.array(floor, dtype=_F32)
    return np.array(zp, dtype=np.uint8), scale


_STD_F8 = {}


def compute_scale_zp_float8(element_type, std):
    """``[zero_point, scale]`` for FLOAT8E4M3FN: ``scale = T(std / std_f8)``
    (no guard: ``std = 0`` gives scale 0), ``std_f8 = np.std`` (float32) of
    the 254 finite E4M3FN values; zero point ``float8_e4m3fn(0)``."""
    name = type_name(element_type, "compute_scale_zp_float8")
    if name != "FLOAT8E4M3FN":
        raise ValueError(f"Quantization to element_type={TENSOR_TYPES[name]} not implemented.")
    f8 = np_dtype(name)
    if name not in _STD_F8:
        values = np.arange(256, dtype=np.uint8).view(f8).astype(_F32)
        _STD_F8[name] = np.std(values[np.isfinite(values)])
    std = np.asarray(std)
    return [np.array(0, dtype=f8), np.array(std / _STD_F8[name], dtype=std.dtype)]


def compute_scale_zp_blocked(weight, quant_type, axis, block_size, symmetric):
    """ORT's per-block qparams of a rank-2 weight: blocks of ``block_size``
    along ``axis`` (zero padded), ``scale = T(f64(hi - lo) / (qmax - qmin))``
    (``reduce_range`` / ``MinimumRealRange`` ignored), degenerate when the
    *rounded* scale is below tiny; zp ``clip(rint(qmin - f64(lo) /
    f64(scale_T)), qmin, qmax)`` from the rounded scale.  Returns
    ``(zero_points, scales)`` shaped like the weight with ``ceil(k / b)`` on
    ``axis``."""
    func = "compute_scale_zp_blocked"
    weight = np.asarray(_require_numpy(weight, "weight", func))
    if weight.ndim != 2:
        raise NotImplementedError(
            "Per-block (opset-21) quantization is only supported for rank-2 weight tensors. "
            f"Got rank-{weight.ndim} tensor with shape {weight.shape}. "
            "For rank > 2 tensors, reshape to 2-D before quantizing or use per-channel "
            "quantization.")
    if block_size < 1:
        raise ValueError(f"{func}: block_size must be >= 1, got {block_size}")
    name = type_name(quant_type, func)
    k = weight.shape[axis]
    nb = (k + block_size - 1) // block_size
    other = weight.shape[1 - axis % 2]
    moved = np.moveaxis(weight, axis, 0).reshape(k, other)
    qmin, qmax = get_qmin_qmax_for_qType(name, False, symmetric)
    pad = nb * block_size - k
    if pad:
        moved = np.concatenate([moved, np.zeros((pad, other), dtype=moved.dtype)], axis=0)
    blocks = moved.reshape(nb, block_size, other)
    lo = np.minimum(blocks.min(axis=1), 0)
    hi = np.maximum(blocks.max(axis=1), 0)
    lo, hi = lo.astype(weight.dtype), hi.astype(weight.dtype)
    if symmetric:
        m = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -m, m
    qmin64, qmax64 = _F64(qmin), _F64(qmax)
    raw = ((hi - lo).astype(_F64) / (qmax64 - qmin64)).astype(weight.dtype)
    finfo = np.finfo(weight.dtype)
    degenerate = raw < (finfo.smallest_subnormal if weight.dtype == np.float16 else finfo.tiny)
    scales = np.where(degenerate, np.ones_like(raw), raw)
    if symmetric:
        zps = np.full((nb, other), int(np.round((qmin64 + qmax64) / 2.0)), dtype=qmin.dtype)
    else:
        raw_zp = np.clip(np.round(qmin64 - lo.astype(_F64) / scales.astype(_F64)), qmin64, qmax64)
        zps = raw_zp.astype(qmin.dtype)
        zps[degenerate] = 0
    return np.moveaxis(zps, 0, axis), np.moveaxis(scales, 0, axis)


# ------------------------------------------------------------ quantizing
def _check_zero_point_dtype(zero_point):
    z = np.asarray(zero_point)
    if z.dtype in (np.float32, np.float16):
        raise TypeError(f"zero_point cannot be {z.dtype}")
    return z


def _saturate_float8(v, name, saturate):
    """float32 values -> float 8 codes: round to nearest even (ml_dtypes);
    with ``saturate`` overflow and +-inf clamp to +-max, NaN stays NaN."""
    f8 = np_dtype(name)
    v = np.asarray(v, dtype=_F32)
    if saturate:
        big = _F32(_ml_dtypes("float 8").finfo(f8).max)
        v = np.where(np.isnan(v), v, np.clip(v, -big, big))
    return v.astype(f8)


def quantize_nparray(qType, arr, scale, zero_point, low=None, high=None):
    """ORT's Python quantization of stored data (weights).

    Integers: ``clip(rint(f32(arr) / scale) + zero_point, max(qmin, low),
    min(qmax, high))`` in the promoted dtype (float32 for a float32 / float16
    scale, float64 for a float64 scale), then cast; NaN becomes 0 through
    the cast (ORT's kernel gives qmin: :func:`quantize_linear`).  The full
    range of the type is used whatever the scale was computed for.  Float 8:
    zero point must be 0, ``saturate_cast(arr / scale)``.
    """
    func = "quantize_nparray"
    name = type_name(qType, func)
    arr = np.asarray(_require_numpy(arr, "arr", func))
    if name in _FLOAT8_TYPES:
        if np.asarray(zero_point).astype(_F32) != 0:
            raise NotImplementedError(
                f"zero_point is expected to be null for float 8 not {zero_point!r}.")
        if arr.dtype not in (np.float32, np.float16):
            raise ValueError(f"Unexpected dtype {arr.dtype}.")
        scale = np.asarray(scale).astype(arr.dtype)
        return np.asarray(_saturate_float8((arr / scale).astype(_F32), name, True))
    if name not in _INT_TYPES:
        raise ValueError(f"{func}: unexpected data type {qType!r}")
    qmin, qmax = get_qmin_qmax_for_qType(name)
    cliplow = max(qmin, low) if low is not None else qmin
    cliphigh = min(qmax, high) if high is not None else qmax
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = np.asarray((arr.astype(_F32) / scale).round() + zero_point)
        np.clip(q, cliplow, cliphigh, out=q)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN -> int: 0 on x86, as in ORT
            return np.asarray(q.astype(np_dtype(name)))


def compute_data_quant_params(data, quant_type, symmetric, reduce_range=False,
                              min_real_range=None, rmin_override=None, rmax_override=None):
    """``(zero_point, scale)`` of a tensor, ORT's weight path: ``rmin =
    data.min()``, ``rmax = data.max()`` (NaN propagates; empty -> 0.0),
    overrides replace them; integers through :func:`compute_scale_zp` with
    the (reduced / symmetric) range, float 8 through
    :func:`compute_scale_zp_float8` with ``np.std(data)``."""
    func = "compute_data_quant_params"
    _require_numpy(data, "data", func)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"Weight must be given as an array not {type(data)}.")
    name = type_name(quant_type, func)
    rmin = rmin_override if rmin_override is not None else (data.min() if len(data) else 0.0)
    rmax = rmax_override if rmax_override is not None else (data.max() if len(data) else 0.0)
    rmin = np.array(rmin, dtype=data.dtype)
    rmax = np.array(rmax, dtype=data.dtype)
    if name == "FLOAT8E4M3FN":
        if reduce_range:
            raise RuntimeError("Unsupported option reduce_range=True for float 8.")
        zero_point, scale = compute_scale_zp_float8(name, np.std(data))
        return zero_point, np.asarray(scale)
    if name in _INT_TYPES:
        qmin, qmax = get_qmin_qmax_for_qType(name, reduce_range, symmetric=symmetric)
        if len(data):
            zero_point, scale = compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range)
        else:
            zero_point, scale = np.array(0, dtype=qmin.dtype), np.array(1.0, dtype=data.dtype)
        return _check_zero_point_dtype(zero_point), np.asarray(scale)
    raise ValueError(f"Unexpected value for quant_type={TENSOR_TYPES[name]}.")


def quantize_data(data, qType, symmetric, reduce_range=False, min_real_range=None,
                  rmin_override=None, rmax_override=None):
    """``(zero_point, scale, quantized)``: :func:`compute_data_quant_params`
    then :func:`quantize_nparray`; float 8 raises ``RuntimeError`` when a code
    is NaN."""
    name = type_name(qType, "quantize_data")
    zero_point, scale = compute_data_quant_params(data, name, symmetric, reduce_range,
                                                  min_real_range, rmin_override, rmax_override)
    q = quantize_nparray(name, data, scale, zero_point)
    if name == "FLOAT8E4M3FN" and np.any((q.view(np.uint8).ravel() & 127) == 127):
        d = np.asarray(data)
        raise RuntimeError(f"One of the quantized value is NaN data in [{d.min()}, {d.max()}], "
                           f"quantized_data in [{q.min()}, {q.max()}].")
    return zero_point, scale, q


def pack_bytes_to_4bit(src_8bit):
    """Two 4-bit values per byte, element ``2k`` in the low nibble, an odd
    tail in a low nibble with high nibble 0 (a bytearray, as ORT)."""
    src = np.asarray(bytearray(src_8bit) if isinstance(src_8bit, (bytes, bytearray))
                     else np.asarray(src_8bit).astype(np.int64)).astype(np.int64) & 0xF
    if src.size % 2:
        src = np.concatenate([src, [0]])
    return bytearray(((src[1::2] << 4) | src[0::2]).astype(np.uint8).tobytes())


def quantize_weight(weight, qType, *, symmetric=None, reduce_range=False, per_channel=False,
                    axis=0, block_size=0, min_real_range=None):
    """ORT's QDQ weight initializer: ``(zero_point, scale, quantized)``.

    ``symmetric=None`` is ORT's default (``WeightSymmetric`` unset): True for
    INT4 / INT8 / INT16 / FLOAT8E4M3FN, False for the unsigned types, and
    True for per-channel whatever the type.  Per tensor:
    :func:`quantize_data` of the flattened weight; per channel: every
    ``weight.take(i, axis)`` alone (1-D scale / zp of length C); blocked
    (``block_size > 0``, rank 2): :func:`compute_scale_zp_blocked` and
    :func:`quantize_nparray` block by block.
    """
    func = "quantize_weight"
    w = np.asarray(_require_numpy(weight, "weight", func))
    name = type_name(qType, func)
    if symmetric is None:
        symmetric = True if per_channel else name in ("INT4", "INT8", "INT16", "FLOAT8E4M3FN")
    if block_size:
        zps, scales = compute_scale_zp_blocked(w, name, axis, block_size, symmetric)
        rep = np.repeat(np.moveaxis(scales, axis, 0), block_size, axis=0)[:w.shape[axis]]
        zrep = np.repeat(np.moveaxis(zps, axis, 0), block_size, axis=0)[:w.shape[axis]]
        q = quantize_nparray(name, np.moveaxis(w, axis, 0), rep, zrep.astype(np.int64))
        return zps, scales, np.moveaxis(q, 0, axis)
    if not per_channel:
        return quantize_data(w.flatten(), name, symmetric, reduce_range, min_real_range)
    axis = A.normalize_axis(axis, w.ndim, func)
    zps, scales, qs = [], [], []
    for i in range(w.shape[axis]):
        z, s, q = quantize_data(w.take(i, axis).ravel(), name, symmetric, reduce_range,
                                min_real_range)
        zps.append(z)
        scales.append(s)
        qs.append(np.asarray(q).reshape(w.take(i, axis).shape))
    return (np.asarray(zps).reshape(-1), np.asarray(scales).reshape(-1),
            np.stack(qs, axis=axis))


def adjust_weight_scale_for_int32_bias(input_scale, weight_scale, bias, per_channel=False):
    """ORT's silent enlargement of a weight scale so that the int32 bias
    ``bias / (input_scale * weight_scale)`` fits (INT8 / INT16 weights with
    zero points 0): with ``qrange = 2**32 - 2`` and ``absmax = max(|min(b, 0)|,
    |max(b, 0)|)`` (per channel ``|b[i]|``), if ``0 < f64(in_s) * f64(w_s) <
    1.0001 * 2 * absmax / qrange`` the scale becomes ``T(w_s * ratio)`` (a
    float16 scale rounded up).  Returns ``(adjusted, new_weight_scale)``."""
    w_s = np.asarray(weight_scale)
    if not w_s.size:
        return False, None
    b = np.asarray(bias)
    qrange = _F64(np.iinfo(np.int32).max) - _F64(np.iinfo(np.int32).min + 1)
    in64 = _F64(np.asarray(input_scale).item())
    dt = w_s.dtype

    def fixed(ws64, absmax):
        smallest = 1.0001 * (2.0 * absmax) / qrange
        cand = in64 * ws64
        if cand < smallest and cand > 0.0:
            new = np.array(ws64 * (smallest / cand))
            rounded = new.astype(dt)
            if dt == np.float16 and rounded < new:
                rounded = np.nextafter(rounded, np.array(np.inf, dtype=dt))
            return rounded, True
        return None, False

    if not per_channel:
        absmax = np.maximum(np.abs(np.minimum(b.min(), _F64(0))),
                            np.abs(np.maximum(b.max(), _F64(0))))
        new, changed = fixed(_F64(w_s.item()), absmax)
        return (True, new) if changed else (False, w_s)
    out = w_s.copy()
    changed_any = False
    for i in range(w_s.shape[0]):
        new, changed = fixed(_F64(w_s[i].item()), np.abs(b[i]))
        if changed:
            out[i] = new
            changed_any = True
    return changed_any, out


def quantize_bias(bias, input_scale, weight_scale, beta=1.0):
    """ORT's int32 bias: ``bias_scale = input_scale * weight_scale * beta``
    (float32 products), ``q = clip(rint(f64(b) / f64(bias_scale)), int32)``.
    Returns ``(quantized int32, bias_scale 1-D)``."""
    b = np.asarray(_require_numpy(bias, "bias", "quantize_bias"))
    if beta == 0:
        b, beta = np.zeros_like(b), 1.0
    bias_scale = np.asarray(input_scale) * np.asarray(weight_scale) * beta
    q = np.asarray(b, dtype=_F64) / np.asarray(bias_scale, dtype=_F64)
    q = np.clip(q.round(), _F64(np.iinfo(np.int32).min), _F64(np.iinfo(np.int32).max))
    return q.astype(np.int32).reshape(b.shape), np.asarray(bias_scale, dtype=b.dtype).reshape(-1)


def _param_view(p, x, axis, block_size, func):
    """Broadcast a per-tensor / per-axis / blocked parameter against x."""
    p = np.asarray(p)
    if p.ndim == 0 or p.size == 1 and not block_size:
        return p.reshape(())
    axis = A.normalize_axis(axis, x.ndim, func)
    if block_size:
        if p.ndim != x.ndim:
            raise ValueError(f"{func}: a blocked scale needs the input's rank {x.ndim}, "
                             f"got shape {p.shape}")
        p = np.repeat(p, block_size, axis=axis)
        return np.take(p, np.arange(x.shape[axis]), axis=axis)
    if p.ndim != 1 or p.shape[0] != x.shape[axis]:
        raise ValueError(f"{func}: a per-axis parameter needs {x.shape[axis]} values along axis "
                         f"{axis}, got shape {p.shape}")
    shape = [1] * x.ndim
    shape[axis] = -1
    return p.reshape(shape)


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, saturate=1,
                    output_type=None):
    """QuantizeLinear as ORT's CPU kernel computes it.

    ``q = saturate(rint(f32(x) / f32(scale)) + zp)`` for the integer types
    (int2 / uint2 / int4 / uint4 / 8 / 16 bit): a float32 division, NaN -> qmin whatever the
    zero point, +-inf and results beyond int32 saturate; float16 input and
    scale are converted to float32 first.  Float 8: ``cast(x / scale)``,
    round to nearest even; ``saturate=1`` clamps to +-max (+-inf too),
    ``saturate=0`` is the ONNX spec's plain cast (ORT's own overflow bugs
    are not reproduced).  ORT 1.32's CPU provider has no kernel for
    FLOAT4E2M1 nor INT2 / UINT2 (opset 25); these follow ``onnx.reference``:
    FLOAT4E2M1 is ml_dtypes' cast of ``f32(x / scale) + zp`` (round half to
    even, beyond +-6 and +-inf -> +-6, NaN -> the zero of the opposite sign),
    INT2 / UINT2 the integer rule.  Per tensor (scalar scale), per axis (1-D scale
    along ``axis``) or blocked (``block_size``: scale of the input's rank).
    The output type is the zero point's (``output_type`` when there is
    none; default UINT8).
    """
    func = "quantize_linear"
    x = np.asarray(_require_numpy(x, "x", func))
    if y_zero_point is None:
        name = type_name(output_type or "UINT8", func)
        zp = np.zeros((), dtype=np_dtype(name))
    else:
        zp = np.asarray(y_zero_point)
        name = type_name(output_type, func) if output_type is not None else _dtype_type_name(zp)
    s = _param_view(np.asarray(y_scale).astype(_F32), x, axis, block_size, func)
    xf = x.astype(_F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = xf / s
    if name in _FLOAT8_TYPES:
        return _saturate_float8(v, name, bool(saturate))
    if name == "FLOAT4E2M1":  # onnx.reference: (x / scale + zp) cast by ml_dtypes
        if y_zero_point is not None:
            v = v + _param_view(zp.astype(_F32), x, axis, block_size, func)
        return v.astype(np_dtype(name))
    qmin, qmax = _LINEAR_RANGE[name]
    z = _param_view(zp.astype(np.int64) if zp.dtype.kind in "iu"
                    else zp.astype(_F32).astype(np.int64),
                    x, axis, block_size, func)
    r = np.rint(v)
    r = np.clip(r, -2.0**31, 2.0**31 - 1)  # the kernel saturates in int32 first
    nan = np.isnan(r)
    r = np.where(nan, 0, r).astype(np.int64) + z
    r = np.where(nan, qmin, np.clip(r, qmin, qmax))
    return r.astype(np_dtype(name))


def _dtype_type_name(a):
    names = {"int8": "INT8", "uint8": "UINT8", "int16": "INT16", "uint16": "UINT16",
             "int32": "INT32", **{md: name for name, md in _ML_DTYPE_NAMES.items()}}
    if a.dtype.name not in names:
        raise TypeError(f"zero point of dtype {a.dtype} is not a quantized type")
    return names[a.dtype.name]


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    """DequantizeLinear as ORT's CPU kernel: ``f32(int32(x) - zp) * scale``
    in float32 (int32 input: ``x - zp`` wraps in int32); float 8: ``f32(x) *
    scale``.  The result has the scale's float dtype."""
    func = "dequantize_linear"
    x = np.asarray(_require_numpy(x, "x", func))
    scale = np.asarray(x_scale)
    s = _param_view(scale, x, axis, block_size, func)
    out_dt = scale.dtype if scale.dtype in (np.float16, np.float32) else np.dtype(_F32)
    if x.dtype.name.startswith(("float8", "float4")):  # the zero point is not used
        return (x.astype(_F32) * s.astype(_F32)).astype(out_dt)
    zp = (np.zeros((), np.int64) if x_zero_point is None
          else np.asarray(x_zero_point).astype(np.int64))
    z = _param_view(zp, x, axis, block_size, func)
    d = (x.astype(np.int64) - z)
    if x.dtype == np.int32:
        d = d.astype(np.int32)  # ORT subtracts in int32, wrapping
    return (d.astype(_F32) * s.astype(_F32)).astype(out_dt)
