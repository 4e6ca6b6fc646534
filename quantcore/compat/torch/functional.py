"""torch's fake-quant ops: ``torch.fake_quantize_per_tensor_affine`` /
``_per_channel_affine`` and their ``_cachemask`` variants, bit for bit
with torch's CPU kernels."""
import numbers

import numpy as np

from ... import _arrays as A
from ...ops import _affine, _affine_channels_fast, _affine_fast, affine_mode
from .._errors import RuntimeTypeError, RuntimeValueError

F32 = np.float32


_MODE_PER_TENSOR = affine_mode(nonfinite="nan_to_qmin")
_MODE_CHANNEL_INT = affine_mode(nonfinite="int64", dequant_wide=True)
_MODE_CHANNEL_FLOAT = affine_mode(zero_point_add="before_rounding", nonfinite="int64",
                                  dequant_wide=True, fma_zero_point=True)
#: a float16 zero point goes through c10::Half's operator+: no FMA contraction
_MODE_CHANNEL_HALF = affine_mode(zero_point_add="before_rounding", nonfinite="int64",
                                 dequant_wide=True)
#: float64 input, float zero point: x * inv + zp in double (no FMA), rounded to
#: float32, then lrintf
_MODE_CHANNEL_FLOAT_F64 = affine_mode(zero_point_add="before_rounding", nonfinite="int64",
                                      dequant_wide=True, round_f32=True)
#: float64 input per tensor: rounding in double, dequantization in float32
_MODE_PER_TENSOR_F64 = affine_mode(nonfinite="nan_to_qmin", dequant_narrow=True)


def _needs_exact(dtype, zero_points, qmin, qmax):
    """True when a zero point or a range end is not exact in the compute
    dtype (int32-size ranges in float32): torch's integer steps then need
    the exact-integer kernel."""
    work = A.compute_dtype(np.dtype(dtype)).type
    values = np.append(np.asarray(zero_points, dtype=np.float64).reshape(-1), (qmin, qmax))
    return not np.array_equal(values.astype(work).astype(np.float64), values)


def _f32_inverse(s):
    """torch's reciprocal ``f32(1 / f32(scale))`` (as float64 values; a
    device array stays on the device: an IEEE division and exact casts)."""
    if A.is_cupy_array(s):
        inv = A.channel_arith("rdivide", A.astype_exact(s, F32), F32(1))
        return A.astype_exact(inv, np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        return (F32(1) / np.asarray(s, dtype=F32)).astype(F32).astype(np.float64)


def _int_arg(value, name, func):
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{func}(): argument '{name}' must be int, not {type(value).__name__}")
    return int(value)


_KERNEL_NAMES = {"fake_quantize_per_tensor_affine":
                 "fake_quantize_tensor_cachemask_kernel_type_handling",
                 "fake_quantize_per_channel_affine":
                 "fake_quantize_channel_cachemask_cpu_type_handling"}


def _fq_input(x, func):
    """x as a float array; an integer / bool array raises torch's
    NotImplementedError of the kernel's dtype dispatch."""
    if (isinstance(x, np.ndarray) or A.is_cupy_array(x)) and x.dtype.kind in "biu":
        raise NotImplementedError(f'"{_KERNEL_NAMES.get(func, func)}" not implemented for '
                                  f"'{_torch_dtype_name(x.dtype)}'")
    return A.as_float_array(x, "x", func)


#: float32 scales the core's fast paths take (a finite reciprocal), and
#: the integers exact in float32 (no exact-integer kernel needed)
_FAST_SCALE = (float(np.finfo(F32).tiny), float(np.finfo(F32).max))
_EXACT_F32 = 2 ** 24


def _per_tensor(x, scale, zp, qmin, qmax, func):
    """Per-tensor kernel (torch.md 4.1); scale a float, zp an int."""
    if type(x) is np.ndarray and x.dtype == F32 and -_EXACT_F32 <= qmin <= zp <= qmax \
            <= _EXACT_F32 and qmin < qmax:
        s = float(F32(scale))
        if _FAST_SCALE[0] <= s <= _FAST_SCALE[1]:  # (what _affine_fast accepts)
            res = _affine_fast(x, s, zp, qmin, qmax, _MODE_PER_TENSOR, "after_rounding", None,
                               func, mask_dtype=np.bool_)
            if res is not None:
                return res
    arr = _fq_input(x, func)
    s = np.array([F32(scale)], dtype=np.float64)
    z = np.array([zp], dtype=np.float64)
    exact = _needs_exact(arr.dtype, z, qmin, qmax)
    with np.errstate(all="ignore"):
        if arr.dtype == np.float64:
            return _affine(arr, s, z, qmin, qmax, _MODE_PER_TENSOR_F64, mask=True, func=func,
                           inv=_f32_inverse(s), exact=exact)
        return _affine(arr, s, z, qmin, qmax, _MODE_PER_TENSOR, mask=True, func=func,
                       exact=exact)


def fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, quant_min, quant_max):
    """``torch.ops.aten.fake_quantize_per_tensor_affine_cachemask`` -> (out, mask).

    Python-number ``scale`` / ``zero_point``; arrays select the
    tensor-qparams overload (see :func:`fake_quantize_per_tensor_affine`).
    A cupy x is quantized on the device; cupy tensor qparams are read to
    the host (8 bytes: torch's CPU kernel reads them with ``.item()``; its
    CUDA kernel reads them on the device, which this does not reproduce).
    """
    if isinstance(scale, np.ndarray) or isinstance(zero_point, np.ndarray) or \
            A.is_cupy_array(scale) or A.is_cupy_array(zero_point):
        return _per_tensor_tensor_qparams(x, scale, zero_point, quant_min, quant_max)
    func = "fake_quantize_per_tensor_affine"
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    zp = _int_arg(zero_point, "zero_point", func)
    if type(scale) is not float and (isinstance(scale, bool) or
                                     not isinstance(scale, numbers.Real)):
        raise TypeError(f"{func}(): argument 'scale' must be float, not {type(scale).__name__}")
    if qmin > qmax:
        raise RuntimeValueError(_QMIN_QMAX_MSG)
    if not qmin <= zp <= qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    return _per_tensor(x, float(scale), zp, qmin, qmax, func)


def _item(value, name, func):
    """torch's ``Tensor.item()``: the one element of a numeric array as a
    Python number (bool and integers as int, floats as float)."""
    a = np.asarray(A.to_host(value))
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{func}: {name} must be a numeric array, got dtype {a.dtype}")
    if a.size != 1:
        raise RuntimeValueError(f"a Tensor with {a.size} elements cannot be converted to Scalar")
    v = a.reshape(-1)[0]
    return int(v) if a.dtype.kind in "biu" else float(v)


def _item_float(value, name, func):
    """``.item().toFloat()``: a checked conversion (a finite value beyond
    the float32 range raises), then rounded to float32."""
    v = _item(value, name, func)
    if np.isfinite(v) and abs(v) > float(np.finfo(F32).max):
        raise RuntimeValueError("value cannot be converted to type float without overflow")
    with np.errstate(over="ignore"):
        return F32(v)


def _item_int(value, name, func):
    """``.item().toInt()``: a checked conversion to int32 (NaN and values
    outside [-2**31, 2**31 - 1] raise), truncating a float."""
    v = _item(value, name, func)
    if isinstance(v, float) and (v != v or not -2.0 ** 31 <= v <= 2.0 ** 31 - 1):
        raise RuntimeValueError("value cannot be converted to type int without overflow")
    if isinstance(v, int) and not -2 ** 31 <= v <= 2 ** 31 - 1:
        raise RuntimeValueError("value cannot be converted to type int without overflow")
    return int(v)


_QMIN_QMAX_MSG = "`quant_min` should be less than or         equal to `quant_max`."
_ZP_RANGE_MSG = "`zero_point` must be between `quant_min` and `quant_max`."


def _per_tensor_tensor_qparams(x, scale, zero_point, quant_min, quant_max,
                               fake_quant_enabled=1):
    """``torch._fake_quantize_per_tensor_affine_cachemask_tensor_qparams``:
    ``scale.item()`` as float32, ``zero_point.item()`` as int32 (checked,
    truncated; not range checked)."""
    func = "fake_quantize_per_tensor_affine"
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    if qmin > qmax:
        raise RuntimeValueError(_QMIN_QMAX_MSG)
    arr = _fq_input(x, func)
    # C++ evaluates the kernel's arguments right to left: zero point first
    zp = _item_int(zero_point, "zero_point", func)
    s = _item_float(scale, "scale", func)
    if not fake_quant_enabled:
        return arr, A.array_module(arr).ones(arr.shape, dtype=np.bool_)
    return _per_tensor(arr, float(s), zp, qmin, qmax, func)


def fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max):
    """``torch.fake_quantize_per_tensor_affine``.

    With Python numbers (``scale: float, zero_point: int``): checks
    ``quant_min <= quant_max`` and ``quant_min <= zero_point <= quant_max``
    (no scale check).  With arrays (the ``tensor_qparams`` overload used by
    FakeQuantize): one-element ``scale`` / ``zero_point``, the zero point
    truncated to an int and not range-checked.  Per element, in float32::

        q_f = zp + rint(x * f32(1 / f32(scale)))
        q   = clamp(q_f, qmin, qmax)      NaN and -inf -> qmin, +inf -> qmax
        out = f32(f32(q - zp) * scale)
    """
    return fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, quant_min,
                                                     quant_max)[0]


def _dim_size(arr, axis):
    """torch's ``self.size(axis)`` with its dimension wrapping and IndexErrors."""
    if arr.ndim == 0:
        raise IndexError(f"Dimension specified as {axis} but tensor has no dimensions")
    if not -arr.ndim <= axis < arr.ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-arr.ndim}, {arr.ndim - 1}], but got {axis})")
    return arr.shape[axis]


def _check_channel_qparams(scale, zero_point, x, axis, func):
    """torch's per-channel qparams shape checks, in its order (1-D scale,
    1-D zero point, the same size, the size of ``x``'s ``axis``); returns
    the axis as an int."""
    if scale.ndim != 1:
        raise RuntimeValueError("scale should be a 1-D tensor")
    if zero_point.ndim != 1:
        raise RuntimeValueError("zero point should be a 1-D tensor")
    if scale.size != zero_point.size:
        raise RuntimeValueError("scale and zero-point need to have the same dimensions")
    axis = _int_arg(axis, "axis", func)
    if scale.size != _dim_size(x, axis):
        raise RuntimeValueError("dimensions of scale and zero-point are not consistent with input "
                                "tensor")
    return axis


def _channel_params(arr, scale, zero_point, axis, qmin, qmax, func):
    """``fake_quantize_per_channel_affine_cachemask``'s checks, in torch's order.
    Device (cupy) parameters stay on the device, except an int32 zero point:
    torch reads its min and max for the range check (a synchronisation),
    here the C values are read."""
    s = scale if A.is_cupy_array(scale) else np.asarray(scale)
    z = zero_point if A.is_cupy_array(zero_point) else np.asarray(zero_point)
    if A.is_cupy_array(z) and z.dtype == np.int32:
        z = z.get()
    if s.dtype != np.float32:
        raise RuntimeTypeError(
            f"Scale must be Float or BFloat16, found {_torch_dtype_name(s.dtype)}")
    if z.dtype not in (np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float16)):
        raise RuntimeTypeError("Zero-point must be Int32, Float or Half, found "
                               f"{_torch_dtype_name(z.dtype)}")
    axis = _check_channel_qparams(s, z, arr, axis, func)
    if qmin > qmax:
        raise RuntimeValueError(_QMIN_QMAX_MSG)
    if z.dtype == np.int32 and z.size == 0:
        raise RuntimeValueError(
            "min(): Expected reduction dim to be specified for input.numel() "
            "== 0. Specify the reduction dim with the 'dim' argument.")
    if not 0 <= axis <= arr.ndim:
        _check_zero_point_range(z, qmin, qmax)  # (torch checks it first)
        raise RuntimeValueError("`axis` must be between 0 and number of dimensions of input")
    # the zero points' range, torch's next check: _per_channel (the fast
    # path checks it too)
    return s, z


def _check_zero_point_range(z, qmin, qmax):
    """torch's range check of int32 zero points."""
    if z.dtype == np.int32 and (z.min() < qmin or z.max() > qmax):
        raise RuntimeValueError(_ZP_RANGE_MSG)


_TORCH_DTYPE_NAMES = {"float64": "Double", "float32": "Float", "float16": "Half",
                      "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
                      "uint8": "Byte", "bool": "Bool"}


def _torch_dtype_name(dtype):
    return _TORCH_DTYPE_NAMES.get(np.dtype(dtype).name, np.dtype(dtype).name)


def fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, axis, quant_min,
                                               quant_max):
    """``torch.ops.aten.fake_quantize_per_channel_affine_cachemask`` -> (out, mask)."""
    func = "fake_quantize_per_channel_affine"
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    arr = _fq_input(x, func)
    s, z = _channel_params(arr, scale, zero_point, axis, qmin, qmax, func)
    return _per_channel(arr, s, z, axis, qmin, qmax, func)


def _per_channel(arr, s, z, axis, qmin, qmax, func):
    """Per-channel kernel (torch.md 4.2) on parameters validated by
    ``_channel_params`` (all but the zero points' range, checked here)."""
    mode = (_MODE_CHANNEL_INT if z.dtype.kind in "iu" else
            _MODE_CHANNEL_FLOAT_F64 if arr.dtype == np.float64 else
            _MODE_CHANNEL_HALF if z.dtype == np.float16 else _MODE_CHANNEL_FLOAT)
    xp = A.array_module(arr)
    if mode == _MODE_CHANNEL_INT and arr.dtype == F32 and arr.size and arr.ndim and \
            -_EXACT_F32 <= qmin < qmax <= _EXACT_F32:
        # float32 reciprocal and int zero points as _affine computes them;
        # None (then the checks and the general path) for a zero point out
        # of range or a scale without a finite reciprocal
        res = _affine_channels_fast(arr, s, z, qmin, qmax, int(axis), mode, "after_rounding",
                                    None, func, mask_dtype=np.bool_)
        if res is not None:
            return res
    _check_zero_point_range(z, qmin, qmax)
    if arr.size == 0:
        return arr.copy(), xp.zeros(arr.shape, dtype=np.bool_)
    s64 = A.astype_exact(s, np.float64)
    # exact (int32, float32 or float16); rounded to T by the kernel
    z64 = A.astype_exact(z, np.float64)
    inv = _f32_inverse(s64)  # torch's float32 reciprocal, widened for float64 input
    # (a float zero point on the device: float32 / float16 values are exact
    # in every compute dtype, only the range can need the exact kernel)
    exact = _needs_exact(arr.dtype, z64 if not A.is_cupy_array(z64) else np.zeros(0),
                         qmin, qmax)
    with np.errstate(all="ignore"):
        if arr.ndim == 0:
            return _affine(arr.reshape(1), s64, z64, qmin, qmax, mode, axis=0, mask=True,
                           func=func, inv=inv, exact=exact)[0].reshape(()), \
                xp.ones((), np.bool_)
        return _affine(arr, s64, z64, qmin, qmax, mode, axis=int(axis), mask=True, func=func,
                       inv=inv, exact=exact)


def fake_quantize_per_channel_affine(x, scale, zero_point, axis, quant_min, quant_max):
    """``torch.fake_quantize_per_channel_affine``.

    ``scale`` float32[C]; ``zero_point`` int32 (range-checked), float32 or
    float16 (not checked) [C]; ``axis >= 0``.  Per element, ``inv =
    f32(1 / scale[c])``::

        int zp:   q = int64(f32(zp + rint(f32(x * inv))))
        float zp: q = int64(rint(f32(zp + f32(x * inv))))
        (x86: NaN, +-inf -> INT64_MIN -> qmin)
        out = (double(clamp(q)) - zp) * double(scale)   rounded to x's dtype
    """
    return fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, axis, quant_min,
                                                      quant_max)[0]

