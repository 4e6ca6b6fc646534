"""The affine family: fake_quant, fake_quant_with_mask, quantize,
dequantize and their unchecked twins (``_affine``, ``_affine_fast``, ...).
See :mod:`quantcore.ops`."""
import math

import numpy as np

from .. import _arrays as A
from .._cpu import _kernels as K
from .._cpu.threads import effective_n_threads
from ._base import (_affine_mode_cached, _channel_args, _device_params, _ew, _outputs, _results,
                    affine_mode)


def _affine(x, scale, zero_point, qmin, qmax, mode, *, axis=None, out=None, mask=False,
            func="fake_quant", mask_out=None, mask_dtype=np.bool_, out_dtype=None, inv=None,
            exact=False):
    """Unchecked affine fake quant / quantize: the compat layers' entry.

    ``scale`` and ``zero_point`` are 1-D float arrays (1 value per tensor,
    C per channel), already validated by the caller.  ``inv`` defaults to
    ``T(1) / T(scale)`` in the compute dtype T; a caller may pass its own
    (torch's float32 reciprocal for float64 input, for example).  ``exact``
    selects PyTorch's exact-integer variant (qc_fq_affine_exact: the zero
    point and the range exact in double, for int32-size ranges; CPU only).
    """
    arr = A.as_float_array(x, "x", func)
    work = A.compute_dtype(arr.dtype)
    s, inv_w, z = _scale_inverse(scale, zero_point, work)
    if inv is None:
        inv = inv_w
    elif A.is_cupy_array(inv):
        inv = A.astype_exact(inv.reshape(-1), work)
    else:
        inv = np.asarray(inv, dtype=np.float64).reshape(-1).astype(work)
    if exact:
        return _affine_exact(arr, s, inv, zero_point, qmin, qmax, mode, axis, out, mask,
                             func, mask_out, mask_dtype, out_dtype)
    return _ew("affine", arr, (s, inv, z), float(qmin), float(qmax), mode, axis=axis,
               out=out, mask=mask, func=func, mask_out=mask_out, mask_dtype=mask_dtype,
               out_dtype=out_dtype)


def _affine_exact(arr, s, inv, zero_point, qmin, qmax, mode, axis, out, want_mask, func,
                  mask_out, mask_dtype, out_dtype):
    """qc_fq_affine_exact: the zero point and range exact in double."""
    layout, o, m = _outputs(arr, out, want_mask, mask_out, mask_dtype, out_dtype, func)
    kernels = A.kernels_for(layout.flat, func)
    if kernels is K:
        z_exact = np.asarray(A.to_host(zero_point), dtype=np.float64).reshape(-1)
        s, inv = A.to_host(s), A.to_host(inv)
    else:  # (device parameters stay there; host ones are copied by the kernel module)
        z_exact = zero_point.astype(np.float64).reshape(-1) if A.is_cupy_array(zero_point) \
            else np.asarray(zero_point, dtype=np.float64).reshape(-1)
    if axis is None:
        C, inner = 1, layout.flat.shape[0]
    else:
        (_, C, inner), (s, inv, z_exact) = _channel_args(layout, axis, s, inv, z_exact)
    kernels.fq_affine_exact(layout.flat, o.flat, m.flat if m is not None else None, C, inner,
                            s, inv, z_exact, float(qmin), float(qmax), mode,
                            effective_n_threads(layout.flat.shape[0]))
    return _results(arr, o, m, mask_dtype, out_dtype)


def _scale_inverse(scale, zero_point, work):
    """(scale, inv, zero_point) in the compute dtype, ``inv = T(1) / T(scale)``
    (one rounding; a zero scale gives inf, as the frameworks' kernels).
    Device (cupy) parameters stay on the device."""
    if _device_params((scale, zero_point)):
        xp = A.array_module(scale if A.is_cupy_array(scale) else zero_point)

        def dev(v):  # (the project's cast and division: CuPy's flush float32 subnormals)
            return A.astype_exact(xp.asarray(v).reshape(-1), work)
        s = dev(scale)
        return s, A.channel_arith("rdivide", s, work.type(1)), dev(zero_point)
    if scale.size == 1:  # per tensor: numpy scalars, one rounding each
        s1 = work.type(scale[0])
        if s1 >= _TINY[work]:
            inv1 = work.type(1) / s1
        else:
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                inv1 = work.type(1) / s1
        return (np.array([s1], work), np.array([inv1], work),
                np.array([work.type(zero_point[0])], work))
    s = scale.astype(work)
    z = zero_point.astype(work)
    if (s > _TINY[work]).all():
        return s, (work.type(1) / s).astype(work), z
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return s, (work.type(1) / s).astype(work), z


#: scales above these have a finite reciprocal in the compute dtype
_TINY = {np.dtype(np.float32): np.float32(2.0 ** -126), np.dtype(np.float64): 2.0 ** -1022}


def _affine_params(x, scale, zero_point, quant_min, quant_max, axis, zero_point_add, func):
    """Validate the public affine arguments."""
    arr = A.as_float_array(x, "x", func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    qmin, qmax = A.check_range(quant_min, quant_max, func)
    work = A.compute_dtype(arr.dtype)
    if axis is None and isinstance(scale, _REALS) and isinstance(zero_point, _REALS):
        # per tensor, Python / numpy scalars
        s, z = _check_scalar_qparams(scale, zero_point, qmin, qmax, zero_point_add, work, func)
        return arr, axis, qmin, qmax, np.array([s]), np.array([z])
    channels = None if axis is None else arr.shape[axis]
    if A.is_cupy_array(arr) and _device_params((scale, zero_point)):
        # cupy qparams of cupy x stay on the device, unread: checking their
        # values would synchronise (torch's tensor-qparams ops do not either)
        return arr, axis, qmin, qmax, _device_param(scale, "scale", func, channels), \
            _device_param(zero_point, "zero_point", func, channels)
    s = A.param_array(scale, "scale", func, channels)
    z = A.param_array(zero_point, "zero_point", func, channels)
    check_scales(s, work, func)
    _check_zero_point(z, qmin, qmax, zero_point_add, func)
    return arr, axis, qmin, qmax, s, z


def _device_param(value, name, func, channels):
    """A cupy qparam's shape and dtype checked as ``param_array`` checks a
    host one (its values are not read): a 1-D device array of 1 or
    ``channels`` values; a host value goes through ``param_array``."""
    if not A.is_cupy_array(value):
        return A.param_array(value, name, func, channels)
    if value.dtype.kind not in "iufb":
        raise TypeError(f"{func}: {name} must be real, got dtype {value.dtype}")
    return A.param_shape(value, name, func, channels,
                         lambda v: A.array_module(v).broadcast_to(v.reshape(1), (channels,)))


def check_scales(s, work, func):
    """Scales (float64 array) that are finite and > 0 in the compute dtype
    ``work``, with a finite reciprocal there."""
    sw = s.astype(work)
    if not ((sw >= _TINY[work]) & (sw <= np.finfo(work).max)).all():
        A.check_scale(sw, func)
        raise ValueError(f"{func}: scale {s.tolist()} is too small: 1/scale overflows {work}")


def check_zero_points(z, qmin, qmax, func):
    """Integer zero points (added after rounding) in [qmin, qmax]."""
    _check_zero_point(z, qmin, qmax, "after_rounding", func)


def _check_scalar_qparams(scale, zero_point, qmin, qmax, zero_point_add, work, func):
    """Validate per-tensor scalar (scale, zero_point) as ``_affine_params``
    does arrays; returns them as Python floats."""
    s, z = float(scale), float(zero_point)
    sw = float(work.type(s))
    if not (_TINY_F[work] <= sw <= _MAX_F[work]):
        A.check_scale(np.array([sw]), func)
        raise ValueError(f"{func}: scale {s} is too small: 1/scale overflows {work}")
    if not (zero_point_add == "after_rounding" and qmin <= z <= qmax and z.is_integer()):
        _check_zero_point(np.array([z]), qmin, qmax, zero_point_add, func)
    return s, z


def _affine_fast(x, scale, zero_point, quant_min, quant_max, mode, zero_point_add, out, func,
                 mask_dtype=None):
    """Per-tensor affine fake quant of a contiguous float32 / float64 numpy
    array with scalar qparams: the same kernel and numbers as ``_affine``,
    without its layout and ``out`` machinery.  Returns None when the call is
    not that case (the general path then handles it), else the result (and
    the mask when ``mask_dtype`` is given)."""
    if not (isinstance(scale, _REALS) and isinstance(zero_point, _REALS)):
        return None
    flat = A.fast_flat(x)
    if flat is None:
        return None
    dest = A.fast_out(x, out)
    if dest is None:
        return None
    qmin, qmax = A.check_range(quant_min, quant_max, func)
    work = x.dtype
    s, z = _check_scalar_qparams(scale, zero_point, qmin, qmax, zero_point_add, work, func)
    sw = work.type(s)
    inv = work.type(1) / sw  # finite: _check_scalar_qparams bounds the scale
    mask = None if mask_dtype is None else np.empty(x.shape, np.uint8)
    K.ew_tensor(_AFFINE, flat, dest[1], None if mask is None else mask.reshape(-1), float(sw),
                float(inv), z, 0.0, 0.0, float(qmin), float(qmax), mode,
                effective_n_threads(flat.shape[0]))
    if mask is None:
        return dest[0]
    return dest[0], mask.view(np.bool_) if mask_dtype == np.bool_ else mask


def _affine_channels_fast(x, scale, zero_point, quant_min, quant_max, axis, mode,
                          zero_point_add, out, func, mask_dtype=None):
    """Per-channel affine fake quant of a contiguous float32 / float64 numpy
    array with numpy arrays of scales and integer zero points (one per
    channel): ``_affine``'s kernel and numbers without its layout machinery.
    None when the call is not that case or an argument fails a check (the
    general path then raises its error)."""
    flat = A.fast_flat(x)
    if flat is None or zero_point_add != "after_rounding" or type(axis) is not int or \
            type(scale) is not np.ndarray or type(zero_point) is not np.ndarray:
        return None
    shape = x.shape
    if not -len(shape) <= axis < len(shape):
        return None
    axis %= len(shape)
    C = shape[axis]
    if scale.shape != (C,) or zero_point.shape != (C,) or scale.dtype.kind != "f" or \
            zero_point.dtype.kind not in "iuf" or type(quant_min) is not int or \
            type(quant_max) is not int or not quant_min < quant_max:
        return None
    dest = A.fast_out(x, out)
    if dest is None:
        return None
    work = x.dtype
    params = np.empty(3 * C, work)        # scale, 1 / scale, zero point (qc_families.h)
    s, inv, z = params[:C], params[C:2 * C], params[2 * C:]
    s[...] = scale
    if not ((s >= _TINY[work]) & (s <= _MAX_W[work])).all() or \
            not ((zero_point >= quant_min) & (zero_point <= quant_max)).all() or \
            (zero_point.dtype.kind == "f" and not (np.floor(zero_point) == zero_point).all()):
        return None
    np.divide(work.type(1), s, out=inv)
    z[...] = zero_point
    mask = None if mask_dtype is None else np.empty(shape, np.uint8)
    n = flat.shape[0]
    K.ew(_AFFINE, flat, dest[1], None if mask is None else mask.reshape(-1),
         math.prod(shape[:axis]), C, math.prod(shape[axis + 1:]), params, float(quant_min),
         float(quant_max), mode, effective_n_threads(n))
    if mask is None:
        return dest[0]
    return dest[0], mask.view(np.bool_) if mask_dtype == np.bool_ else mask


_REALS = (int, float, np.integer, np.floating)
_AFFINE = K.FAMILIES["affine"]
_NUDGED = K.FAMILIES["nudged"]
_AMAX = K.FAMILIES["amax"]
_MAX_W = {np.dtype(np.float32): np.float32(np.finfo(np.float32).max),
          np.dtype(np.float64): np.finfo(np.float64).max}
_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.uint8))
_TINY_F = {k: float(v) for k, v in _TINY.items()}
_MAX_F = {np.dtype(np.float32): float(np.finfo(np.float32).max),
          np.dtype(np.float64): float(np.finfo(np.float64).max)}


def _check_zero_point(z, qmin, qmax, zero_point_add, func):
    """Zero points: integral and in [qmin, qmax] when added after rounding,
    0 without a zero point, finite otherwise."""
    if zero_point_add == "after_rounding":
        if not ((z >= qmin) & (z <= qmax)).all():
            if not np.isfinite(z).all():
                raise ValueError(f"{func}: zero_point must be finite, got {z.tolist()}")
            raise ValueError(f"{func}: zero_point must lie in [quant_min, quant_max] = "
                             f"[{qmin}, {qmax}], got {z.tolist()}")
        if not (np.floor(z) == z).all():
            raise ValueError(f"{func}: zero_point must be integral when added after rounding "
                             f"(zero_point_add='after_rounding'), got {z.tolist()}")
    elif zero_point_add == "none":
        if (z != 0).any():
            raise ValueError(f"{func}: zero_point must be 0 with zero_point_add='none', got "
                             f"{z.tolist()}")
    elif not np.isfinite(z).all():
        raise ValueError(f"{func}: zero_point must be finite, got {z.tolist()}")


@A.interop
def fake_quant(x, scale, zero_point, quant_min, quant_max, *, axis=None, rounding="half_even",
               zero_point_add="after_rounding", scale_op="mul_inverse", nonfinite="propagate",
               out=None):
    """Affine fake quantization, per tensor or per channel.

    For each element, computed in the compute dtype T (float32 for float16
    and float32 input, float64 for float64), one rounding per operation::

        v    = x * T(1 / scale)           (scale_op="mul_inverse")
             = x / scale                  (scale_op="div")
        q_f  = round(v) + zero_point      (zero_point_add="after_rounding")
             = round(v + zero_point)      (zero_point_add="before_rounding")
             = round(v)                   (zero_point_add="none": symmetric, no
                                           zero-point arithmetic, -0.0 stays -0.0)
        q    = clamp(q_f, quant_min, quant_max)
        out  = (q - zero_point) * scale   (q * scale with "none")

    Parameters
    ----------
    x : array_like of float16, float32 or float64
        Any layout (C, Fortran, strided, read-only).
    scale, zero_point : float or array
        One value per tensor (``axis=None``) or ``x.shape[axis]`` values.
        scale must be finite and > 0.  With ``zero_point_add="after_rounding"``
        the zero point must be an integer in ``[quant_min, quant_max]``; with
        ``"none"`` it must be 0.  cupy arrays with a cupy ``x`` are
        read by the kernel on the device, and only their shape and dtype are
        checked (checking the values would synchronise with the host).
    quant_min, quant_max : int
        The integer range, ``quant_min < quant_max``.  The clamp and the
        mask use them rounded to the compute dtype (an int32 range in
        float32 clamps at ``f32(2**31 - 1) == 2**31``).
    axis : int or None
        Channel axis for per-channel quantization.
    rounding : {"half_even", "half_up", "half_away"}
        ``rint`` (ties to even), ``floor(v + 0.5)``, or ties away from zero.
    nonfinite : {"propagate", "nan_to_qmin", "int64"}
        What a NaN / inf ``q_f`` becomes.  "propagate" (default): NaN stays
        NaN, +inf / -inf clamp to quant_max / quant_min.  "nan_to_qmin": NaN
        becomes quant_min (PyTorch per tensor).  "int64": NaN, +-inf and
        ``|q_f| >= 2**63`` become quant_min (x86 int64 conversion, PyTorch
        per channel), and q is an integer: never -0.0.
    out : ndarray, optional
        Output of x's shape and dtype; may be ``x`` itself.

    Returns
    -------
    ndarray of x's dtype and shape.
    """
    func = "fake_quant"
    mode = _affine_mode_cached(rounding, zero_point_add, scale_op, nonfinite, func)
    if axis is None:
        res = _affine_fast(x, scale, zero_point, quant_min, quant_max, mode, zero_point_add,
                           out, func)
    else:
        res = _affine_channels_fast(x, scale, zero_point, quant_min, quant_max, axis, mode,
                                    zero_point_add, out, func)
    if res is not None:
        return res
    arr, axis, qmin, qmax, s, z = _affine_params(x, scale, zero_point, quant_min, quant_max,
                                                 axis, zero_point_add, func)
    return _affine(arr, s, z, qmin, qmax, mode, axis=axis, out=out, func=func)


@A.interop
def fake_quant_with_mask(x, scale, zero_point, quant_min, quant_max, *, axis=None,
                         rounding="half_even", zero_point_add="after_rounding",
                         scale_op="mul_inverse", nonfinite="propagate", out=None,
                         mask_out=None, mask_dtype=np.bool_):
    """``fake_quant`` that also returns the straight-through mask.

    ``mask = quant_min <= q_f <= quant_max`` (before the clamp; False for
    NaN and inf), as bool (default) or uint8 (``mask_dtype``).  Use it with
    :func:`ste_backward`.

    Returns
    -------
    (out, mask)
    """
    func = "fake_quant_with_mask"
    if np.dtype(mask_dtype) not in (np.dtype(np.bool_), np.dtype(np.uint8)):
        raise TypeError(f"{func}: mask_dtype must be bool or uint8, got {np.dtype(mask_dtype)}")
    mode = _affine_mode_cached(rounding, zero_point_add, scale_op, nonfinite, func)
    if mask_out is None:
        if axis is None:
            res = _affine_fast(x, scale, zero_point, quant_min, quant_max, mode, zero_point_add,
                               out, func, mask_dtype=np.dtype(mask_dtype))
        else:
            res = _affine_channels_fast(x, scale, zero_point, quant_min, quant_max, axis, mode,
                                        zero_point_add, out, func, np.dtype(mask_dtype))
        if res is not None:
            return res
    arr, axis, qmin, qmax, s, z = _affine_params(x, scale, zero_point, quant_min, quant_max,
                                                 axis, zero_point_add, func)
    return _affine(arr, s, z, qmin, qmax, mode, axis=axis, out=out, mask=True, func=func,
                   mask_out=mask_out,
                   mask_dtype=mask_dtype)


def _int_dtype_for(qmin, qmax):
    for dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64):
        info = np.iinfo(dt)
        if info.min <= qmin and qmax <= info.max:
            return np.dtype(dt)
    raise ValueError(f"quantize: no integer dtype holds [{qmin}, {qmax}]")


@A.interop
def quantize(x, scale, zero_point, quant_min, quant_max, *, axis=None, rounding="half_even",
             zero_point_add="after_rounding", scale_op="mul_inverse", dtype=None):
    """Quantize to integers: ``q = clamp(round(x / scale) + zero_point)``.

    The same ``q`` as :func:`fake_quant` computes, returned as integers.
    NaN maps to ``quant_min`` and +-inf clamp (an integer cannot hold NaN).

    Parameters
    ----------
    dtype : integer dtype, optional
        Default: the smallest of int8, uint8, int16, uint16, int32, uint32,
        int64 that holds ``[quant_min, quant_max]``.

    Returns
    -------
    ndarray of integers, x's shape.
    """
    func = "quantize"
    mode = affine_mode(rounding, zero_point_add, scale_op, "nan_to_qmin", output_q=True,
                       func=func)
    q = _affine_fast(x, scale, zero_point, quant_min, quant_max, mode, zero_point_add, None,
                     func) if axis is None else None
    if q is not None:   # per tensor, contiguous float32 / float64: q in x's dtype
        arr, qmin, qmax = x, int(quant_min), int(quant_max)
    else:
        arr, axis, qmin, qmax, s, z = _affine_params(x, scale, zero_point, quant_min,
                                                     quant_max, axis, zero_point_add, func)
    try:
        int_dtype = _int_dtype_for(qmin, qmax) if dtype is None else np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{func}: dtype must be an integer dtype, got {dtype!r}") from None
    if int_dtype.kind not in "iu":
        raise TypeError(f"{func}: dtype must be an integer dtype, got {int_dtype}")
    info = np.iinfo(int_dtype)
    if qmin < info.min or qmax > info.max:
        raise ValueError(f"{func}: dtype {int_dtype} cannot hold [{qmin}, {qmax}]")
    work = A.compute_dtype(arr.dtype)
    if q is None:
        q = _affine(arr, s, z, qmin, qmax, mode, axis=axis, func=func, out_dtype=work)
    if float(work.type(qmin)) != qmin or float(work.type(qmax)) != qmax:
        # the range ends are not exact in the compute dtype (int32 range in
        # float32): clamp again exactly before the integer conversion
        q = A.array_module(q).clip(A.astype_exact(q, np.float64), qmin, qmax)
    return q.astype(int_dtype)


@A.interop
def dequantize(q, scale, zero_point, *, axis=None, dtype=np.float32):
    """``(q - zero_point) * scale`` computed in ``dtype`` (float32 default).

    ``q`` is converted to ``dtype`` first (exact for |q| <= 2**24 in
    float32), then each operation rounds once.
    """
    func = "dequantize"
    A.require_cpu(q, func)
    xp = A.array_module(q)
    qa = xp.asarray(q)
    if qa.dtype.kind not in "iuf":
        raise TypeError(f"{func}: q must be an integer or float array, got {qa.dtype}")
    dtype = np.dtype(dtype)
    if dtype not in A.FLOAT_DTYPES:
        raise TypeError(f"{func}: dtype must be float16, float32 or float64, got {dtype}")
    axis = A.normalize_axis(axis, qa.ndim, func)
    channels = None if axis is None else qa.shape[axis]
    s = A.param_array(scale, "scale", func, channels)
    z = A.param_array(zero_point, "zero_point", func, channels)
    A.check_scale(s, func)
    if not np.isfinite(z).all():
        raise ValueError(f"{func}: zero_point must be finite, got {z.tolist()}")
    s, z = s.astype(dtype), z.astype(dtype)
    if axis is not None:
        shape = [1] * qa.ndim
        shape[axis] = channels
        s, z = xp.asarray(s.reshape(shape)), xp.asarray(z.reshape(shape))
    else:
        s, z = s[0], z[0]
    if xp is not np:  # the project's kernels: CuPy's would flush float32 subnormals
        res = A.astype_exact(qa, dtype)
        return A.channel_arith("multiply", A.channel_arith("subtract", res, z, axis), s, axis)
    res = qa.astype(dtype)
    xp.subtract(res, z, out=res)
    xp.multiply(res, s, out=res)
    return res


