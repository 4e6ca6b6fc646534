"""The functional API: validate, allocate ``out``, pick the back end, call a
kernel.

Every per-element formula lives in ``include/qc_elementwise.h``; this module
only turns arguments into the kernels' parameters.  Each public function has
an unchecked twin (``_affine``, ``_nudged``, ``_amax``) that the compat layers
call with framework-specific parameters (a zero or negative scale in torch,
for example) after doing their own framework's validation.

Precision: float32 input is computed in float32, float64 in float64, and
float16 in float32 with the result rounded back to float16 once.
"""
import math

import numpy as np

from . import _arrays as A
from ._cpu import _kernels as K
from ._cpu.threads import effective_n_threads

__all__ = [
    "minmax", "fake_quant", "fake_quant_with_mask", "quantize", "dequantize",
    "fake_quant_nudged", "fake_quant_amax", "ste_backward",
]

# Mode bits and rounding modes: qc_elementwise.h's, as the extension exports
# them (one definition, in the header).
_B = K.MODE_BITS
ZP_BEFORE, DIVIDE, DEQUANT_WIDE = _B["ZP_BEFORE"], _B["DIVIDE"], _B["DEQUANT_WIDE"]
NF_PROPAGATE, NF_NAN_TO_QMIN, NF_INT64 = _B["NF_PROPAGATE"], _B["NF_NAN_TO_QMIN"], _B["NF_INT64"]
OUTPUT_Q, NO_ZERO_POINT, FMA_ZP = _B["OUTPUT_Q"], _B["NO_ZERO_POINT"], _B["FMA_ZP"]
DEQUANT_NARROW, ROUND_F32 = _B["DEQUANT_NARROW"], _B["ROUND_F32"]
NUDGED_DIVIDE, NUDGED_TF = _B["NUDGED_DIVIDE"], _B["NUDGED_TF"]
MM_NAN, MM_NEGZERO, MM_POSZERO = K.MM_NAN, K.MM_NEGZERO, K.MM_POSZERO

#: rounding mode name -> id (qc_elementwise.h QC_ROUNDING_MODES): every
#: ``rounding=`` argument, the CLI's ``--rounding`` and the tests' lists
ROUNDING = dict(K.ROUNDING_MODES)
ROUND_HALF_EVEN = ROUNDING["half_even"]  # the default
ROUND_HALF_UP, ROUND_HALF_AWAY = ROUNDING["half_up"], ROUNDING["half_away"]  # (older names)
ZERO_POINT_ADD = {"after_rounding": 0, "before_rounding": ZP_BEFORE, "none": NO_ZERO_POINT}
SCALE_OP = {"mul_inverse": 0, "div": DIVIDE}
NONFINITE = {"propagate": NF_PROPAGATE, "nan_to_qmin": NF_NAN_TO_QMIN, "int64": NF_INT64}
NUDGED_FORMULA = {"tensorflow": NUDGED_TF, "mindspore": 0}


def _choice(table, value, name, func):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise ValueError(f"{func}: {name} must be one of {sorted(table)}, got {value!r}") from None


def affine_mode(rounding="half_even", zero_point_add="after_rounding", scale_op="mul_inverse",
                nonfinite="propagate", dequant_wide=False, output_q=False, fma_zero_point=False,
                dequant_narrow=False, round_f32=False, func="fake_quant"):
    """The kernel mode word for the affine recipe (see qc_elementwise.h)."""
    return ((FMA_ZP if fma_zero_point else 0) | (DEQUANT_NARROW if dequant_narrow else 0)
            | (ROUND_F32 if round_f32 else 0)
            | _choice(ROUNDING, rounding, "rounding", func)
            | _choice(ZERO_POINT_ADD, zero_point_add, "zero_point_add", func)
            | _choice(SCALE_OP, scale_op, "scale_op", func)
            | _choice(NONFINITE, nonfinite, "nonfinite", func)
            | (DEQUANT_WIDE if dequant_wide else 0) | (OUTPUT_Q if output_q else 0))


_MODE_CACHE = {}


def _affine_mode_cached(rounding, zero_point_add, scale_op, nonfinite, func):
    """``affine_mode`` of the public string options, memoised (invalid
    options still raise affine_mode's ValueError)."""
    key = (rounding, zero_point_add, scale_op, nonfinite)
    try:
        return _MODE_CACHE[key]
    except (KeyError, TypeError):
        mode = affine_mode(rounding, zero_point_add, scale_op, nonfinite, func=func)
        _MODE_CACHE[key] = mode
        return mode


def _channel_args(layout, axis, *params):
    """(outer, C, inner) and the parameters as contiguous arrays."""
    outer, C, inner = layout.channels(axis)
    return (outer, C, inner), [A.array_module(p).ascontiguousarray(p) for p in params]


# ------------------------------------------------------------------ min/max
@A.interop
def minmax(x, axis=None, *, nan_policy="propagate"):
    """Minimum and maximum in one pass over ``x``.

    Parameters
    ----------
    x : array_like of float16, float32 or float64
    axis : int or None
        None: per tensor, the results are 0-d arrays.  An int: per channel
        along ``axis`` (any axis, no transposed copy), the results are 1-D
        arrays of ``x.shape[axis]`` values.
    nan_policy : {"propagate", "omit"}
        "propagate": a NaN anywhere (in a channel) makes both results NaN,
        like ``numpy.min``.  "omit": NaNs are skipped.

    Returns
    -------
    (min, max) : arrays of x's dtype.  Empty input (or an all-NaN input with
    "omit") gives the identities ``(+inf, -inf)``.  Zeros are ordered
    ``-0.0 < +0.0``, so the result does not depend on the thread count.
    """
    func = "minmax"
    if nan_policy not in ("propagate", "omit"):
        raise ValueError(f"{func}: nan_policy must be 'propagate' or 'omit', got {nan_policy!r}")
    flat = A.fast_flat(x)
    if flat is not None:  # contiguous float32 / float64: the kernels directly
        nthreads = effective_n_threads(flat.shape[0])
        if axis is None:
            lo, hi = K.minmax_finished(flat, nthreads, nan_policy == "omit")
            return np.array(lo, x.dtype), np.array(hi, x.dtype)
        if type(axis) is int and -x.ndim <= axis < x.ndim:
            axis %= x.ndim
            shape = x.shape
            lo, hi, flags = K.minmax_channels(flat, math.prod(shape[:axis]), shape[axis],
                                              math.prod(shape[axis + 1:]), nthreads)
            if nan_policy == "omit":
                flags &= np.uint8(~MM_NAN & 0xFF)
            K.minmax_finish(lo, hi, flags)
            return lo, hi
    arr = A.as_float_array(x, "x", func)
    if A.is_cupy_array(arr):
        return _minmax_device(arr, axis, nan_policy == "omit", func)
    lo, hi, flags = _minmax_flags(arr, axis, func)
    if nan_policy == "omit":
        flags = A.array_module(lo).asarray(flags, dtype=np.uint8) & np.uint8(~MM_NAN & 0xFF)
    lo, hi = _finish_minmax(lo, hi, flags)
    return lo.astype(arr.dtype, copy=False), hi.astype(arr.dtype, copy=False)


def _minmax_device(arr, axis, omit, func):
    """:func:`minmax` of a cupy array in one launch (contiguous float32 /
    float64 input): the reduction's last block applies the NaN /
    signed-zero rule (``minmax_device`` finish 1, or 2 for "omit")."""
    axis = A.normalize_axis(axis, arr.ndim, func)
    work = A.compute_dtype(arr.dtype)
    layout = A.Layout(arr, work)
    outer, C, inner = (1, 1, layout.flat.shape[0]) if axis is None else layout.channels(axis)
    lo, hi = layout.xp.empty(C, dtype=work), layout.xp.empty(C, dtype=work)
    A.gpu_kernels(func).minmax_device(layout.flat, outer, C, inner, lo, hi,
                                      finish=2 if omit else 1)
    if axis is None:
        lo, hi = lo.reshape(()), hi.reshape(())
    return lo.astype(arr.dtype, copy=False), hi.astype(arr.dtype, copy=False)


def _minmax_flags(x, axis, func):
    """(lo, hi, flags) before the NaN / signed-zero rule; for observers."""
    arr = A.as_float_array(x, "x", func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    arr = A.collapse_repeats(arr, axis)  # (a broadcast input: no copy of its repeats)
    work = A.compute_dtype(arr.dtype)
    layout = A.Layout(arr, work)
    n = layout.flat.shape[0]
    nthreads = effective_n_threads(n)
    kernels = A.kernels_for(layout.flat, func)
    if axis is None:
        lo, hi, flags = kernels.minmax(layout.flat, nthreads)
        if kernels is K:
            return work.type(lo), work.type(hi), flags
        return lo, hi, flags  # 0-d device arrays: no host synchronisation
    outer, C, inner = layout.channels(axis)
    return kernels.minmax_channels(layout.flat, outer, C, inner, nthreads)


def _finish_minmax(lo, hi, flags):
    """Apply the NaN / signed-zero rule; 0-d results per tensor."""
    if A.is_cupy_array(lo):
        per_tensor = lo.ndim == 0
        lo, hi = lo.reshape(-1).copy(), hi.reshape(-1).copy()
        A.gpu_kernels("minmax").minmax_finish(lo, hi, flags)
        return (lo.reshape(()), hi.reshape(())) if per_tensor else (lo, hi)
    per_tensor = np.ndim(lo) == 0
    lo = np.array(lo, ndmin=1)
    hi = np.array(hi, ndmin=1)
    K.minmax_finish(lo, hi, np.array(flags, dtype=np.uint8, ndmin=1))
    if per_tensor:
        return lo.reshape(()), hi.reshape(())
    return lo, hi


# ------------------------------------------------------------ affine family
def _ew(family, arr, params, u0, u1, mode, *, axis=None, out=None, mask=False,
        func="fake_quant", mask_out=None, mask_dtype=np.bool_, out_dtype=None):
    """An elementwise family of qc_families.h over ``arr`` (a validated float
    array): the layout, ``out`` and mask plumbing of every recipe.

    ``params``: the family's per-channel parameters, each a 1-D array in the
    compute dtype (one value per tensor, C per channel along ``axis``);
    ``u0, u1, mode``: its uniform parameters.  Returns the result (in
    ``out_dtype``, default arr's), and the mask when ``mask``.
    """
    layout, o, m = _outputs(arr, out, mask, mask_out, mask_dtype, out_dtype, func)
    flat = layout.flat
    mflat = m.flat if m is not None else None
    nthreads = effective_n_threads(flat.shape[0])
    kernels = A.kernels_for(flat, func)
    fid = _FAMILIES[family]
    on_device = _device_params(params)
    if on_device and kernels is K:  # (numpy x with device parameters: a small copy)
        params, on_device = [A.to_host(v) for v in params], False
    if axis is None and not on_device:
        p = [float(v[0]) for v in params] + [0.0] * (5 - len(params))
        kernels.ew_tensor(fid, flat, o.flat, mflat, *p, u0, u1, mode, nthreads)
    else:
        # per channel, or per tensor with parameters in device memory (read
        # there by the kernel: no host synchronisation)
        outer, C, inner = (1, 1, flat.shape[0]) if axis is None else layout.channels(axis)
        work = flat.dtype
        xp = A.array_module(flat) if on_device else np
        kernels.ew(fid, flat, o.flat, mflat, outer, C, inner,
                   xp.concatenate([xp.asarray(v, work).reshape(-1) for v in params]), u0, u1,
                   mode, nthreads)
    return _results(arr, o, m, mask_dtype, out_dtype)


def _device_params(params):
    """True when a recipe parameter is a device (cupy) array."""
    return any(type(v) is not np.ndarray and A.is_cupy_array(v) for v in params)


def _vector(p, work):
    """A recipe parameter as a 1-D array of the compute dtype, on the device
    where it is (a cupy array stays one)."""
    if type(p) is not np.ndarray and A.is_cupy_array(p):
        return p.astype(work).reshape(-1)
    return np.asarray(p).astype(work).reshape(-1)


def _outputs(arr, out, want_mask, mask_out, mask_dtype, out_dtype, func):
    """(layout of arr in its compute dtype, the result's Output, the mask's
    Output or None): where a kernel writes."""
    work = A.compute_dtype(arr.dtype)
    layout = A.Layout(arr, work)
    res_dtype = arr.dtype if out_dtype is None else np.dtype(out_dtype)
    o = A.Output(layout, arr, out, res_dtype, work, func)
    m = A.Output(layout, arr, mask_out, np.dtype(mask_dtype), np.dtype(np.uint8), func,
                 "mask_out") if want_mask else None
    return layout, o, m


def _results(arr, o, m, mask_dtype, out_dtype):
    """The result (and the mask when one was written) of a kernel call."""
    result = o.finish(arr.dtype if out_dtype is None else np.dtype(out_dtype))
    if m is not None:
        return result, m.finish(np.dtype(mask_dtype))
    return result


#: elementwise family name -> the kernels' id (the same on both back ends)
_FAMILIES = K.FAMILIES


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
        inv = inv.reshape(-1).astype(work)
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
        s = xp.asarray(scale).reshape(-1).astype(work)
        return s, work.type(1) / s, xp.asarray(zero_point).reshape(-1).astype(work)
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
    if channels is None:
        if value.size != 1:
            raise ValueError(f"{func}: {name} must be a single value for per-tensor "
                             f"quantization (axis=None), got shape {value.shape}")
        return value.reshape(1)
    if value.ndim == 0:
        return A.array_module(value).broadcast_to(value.reshape(1), (channels,))
    if value.ndim != 1 or value.shape[0] != channels:
        raise ValueError(f"{func}: {name} must be a 1-D array of {channels} values "
                         f"(x.shape[axis]), got shape {value.shape}")
    return value


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
        q = A.array_module(q).clip(q.astype(np.float64), qmin, qmax)
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
    res = qa.astype(dtype)
    xp.subtract(res, z, out=res)
    xp.multiply(res, s, out=res)
    return res


# ------------------------------------------------------------ nudged family
def _nudged(x, nudged_min, nudged_max, scale, inv_scale, quant_zero, mode, *, axis=None,
            out=None, mask=False, func="fake_quant_nudged", mask_dtype=np.bool_):
    """Unchecked nudged fake quant; parameters are 1-D arrays."""
    arr = A.as_float_array(x, "x", func)
    work = A.compute_dtype(arr.dtype)
    params = [_vector(p, work) for p in (nudged_min, nudged_max, scale, inv_scale, quant_zero)]
    return _ew("nudged", arr, params, 0.0, 0.0, mode, axis=axis, out=out, mask=mask, func=func,
               mask_dtype=mask_dtype)


@A.interop
def fake_quant_nudged(x, nudged_min, nudged_max, scale, *, inv_scale=None, quant_zero=None,
                      formula="tensorflow", scale_op="mul_inverse", axis=None, out=None,
                      return_mask=False):
    """Nudged fake quantization (TensorFlow / MindSpore family).

    With the nudged range from :func:`quantcore.qparams.nudge_tensorflow` or
    :func:`quantcore.qparams.nudge_mindspore`, in the compute dtype::

        xc = clamp(x, nudged_min, nudged_max)       (NaN passes through)
        t  = (xc - nudged_min) * inv_scale          (scale_op="mul_inverse")
           = (xc - nudged_min) / scale              (scale_op="div")
        tensorflow: out = floor((t - quant_zero) + 0.5) * scale
        mindspore:  out = floor(t + 0.5) * scale + nudged_min
        mask = nudged_min <= x <= nudged_max

    ``inv_scale`` defaults to ``T(1) / scale``; ``quant_zero`` (tensorflow
    only) to ``floor(-nudged_min * inv_scale + 0.5)``.
    """
    func = "fake_quant_nudged"
    mode = _choice(NUDGED_FORMULA, formula, "formula", func) | (
        NUDGED_DIVIDE if _choice(SCALE_OP, scale_op, "scale_op", func) else 0)
    if axis is None:
        res = _nudged_fast(x, nudged_min, nudged_max, scale, inv_scale, quant_zero, mode, out,
                           return_mask)
        if res is not None:
            return res
    arr = A.as_float_array(x, "x", func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    channels = None if axis is None else arr.shape[axis]
    work = A.compute_dtype(arr.dtype)
    nmin = A.param_array(nudged_min, "nudged_min", func, channels).astype(work)
    nmax = A.param_array(nudged_max, "nudged_max", func, channels).astype(work)
    s = A.param_array(scale, "scale", func, channels).astype(work)
    A.check_scale(s, func)
    if ((nmin > 0) | (nmax < 0) | ~np.isfinite(nmin) | ~np.isfinite(nmax)).any():
        raise ValueError(f"{func}: the nudged range must be finite and contain 0, got "
                         f"[{nmin.tolist()}, {nmax.tolist()}]")
    with np.errstate(divide="ignore", over="ignore"):
        inv = (work.type(1) / s).astype(work) if inv_scale is None else \
            A.param_array(inv_scale, "inv_scale", func, channels).astype(work)
    if quant_zero is None:
        qz = np.floor((-nmin * inv).astype(work) + work.type(0.5)).astype(work)
    else:
        qz = A.param_array(quant_zero, "quant_zero", func, channels).astype(work)
    return _nudged(arr, nmin, nmax, s, inv, qz, mode, axis=axis, out=out, mask=return_mask,
                   func=func)


def _nudged_fast(x, nudged_min, nudged_max, scale, inv_scale, quant_zero, mode, out,
                 want_mask):
    """Per-tensor nudged fake quant of a contiguous float32 / float64 numpy
    array with scalar parameters: the general path's parameters and kernel
    without its layout machinery; None when not that case, or when a
    parameter fails a check or would overflow (the general path then raises
    or computes it)."""
    flat = A.fast_flat(x)
    if flat is None or not (isinstance(nudged_min, _REALS) and isinstance(nudged_max, _REALS)
                            and isinstance(scale, _REALS)) or \
            not (inv_scale is None or isinstance(inv_scale, _REALS)) or \
            not (quant_zero is None or isinstance(quant_zero, _REALS)):
        return None
    dest = A.fast_out(x, out)
    if dest is None:
        return None
    work = x.dtype
    T = work.type
    nmin, nmax, s = T(nudged_min), T(nudged_max), T(scale)
    big = _MAX_W[work]
    if not (-big <= nmin <= 0 <= nmax <= big and _TINY[work] <= s <= big):
        return None
    inv = T(1) / s if inv_scale is None else T(inv_scale)
    if quant_zero is None:   # floor(f(-nmin * inv) + 0.5), each step rounded to T
        p = -float(nmin) * float(inv)   # exact in double for float32 operands
        if not abs(p) < float(_MAX_W[work]):
            return None
        qz = np.floor(T(p) + T(0.5))
    else:
        qz = T(quant_zero)
    mask = np.empty(x.shape, np.uint8) if want_mask else None
    K.ew_tensor(_NUDGED, flat, dest[1], None if mask is None else mask.reshape(-1),
                float(nmin), float(nmax), float(s), float(inv), float(qz), 0.0, 0.0, mode,
                effective_n_threads(flat.shape[0]))
    return dest[0] if mask is None else (dest[0], mask.view(np.bool_))


# -------------------------------------------------------------- amax family
def _amax(x, amax, num_bits, *, unsigned=False, narrow_range=True, axis=None, out=None,
          mask=False, func="fake_quant_amax"):
    """Unchecked amax fake quant (qparams.amax_multiplier gives the scale)."""
    from .qparams import amax_bounds, amax_multiplier
    arr = A.as_float_array(x, "x", func)
    work = A.compute_dtype(arr.dtype)
    amax_w = _vector(amax, work)
    mult, div = amax_multiplier(amax_w, num_bits, unsigned)
    lo, hi = amax_bounds(num_bits, unsigned, narrow_range)
    return _ew("amax", arr, (mult, div, amax_w), float(lo), float(hi), 0, axis=axis, out=out,
               mask=mask, func=func)


@A.interop
def fake_quant_amax(x, amax, num_bits=8, *, unsigned=False, narrow_range=True, axis=None,
                    out=None, return_mask=False):
    """amax (max-calibrated, symmetric) fake quantization, NVIDIA style.

    In the compute dtype::

        max_bound = 2**(num_bits - 1 + unsigned) - 1
        mult = max_bound / amax                     (a multiplier)
        q    = clamp(rint(x * mult), min_bound, max_bound)   (NaN passes)
        out  = q / mult
        min_bound = 0 (unsigned), -max_bound (narrow_range), -max_bound - 1
        mask = |x| <= amax

    An amax <= 2**-24 gives zeros (mult = 0, divisor 1).  amax must be
    >= 0; with ``unsigned`` x must be >= 0.
    """
    func = "fake_quant_amax"
    if axis is None:
        res = _amax_fast(x, amax, num_bits, unsigned, narrow_range, out, return_mask)
        if res is not None:
            return res
    arr = A.as_float_array(x, "x", func)
    axis = A.normalize_axis(axis, arr.ndim, func)
    nb = A.as_int(num_bits, "num_bits", func)
    if not 2 <= nb <= 16:
        raise ValueError(f"{func}: num_bits must be in 2..16, got {nb}")
    channels = None if axis is None else arr.shape[axis]
    am = A.param_array(amax, "amax", func, channels)
    if not (np.isfinite(am) & (am >= 0)).all():
        raise ValueError(f"{func}: amax must be finite and >= 0, got {am.tolist()}")
    if unsigned and bool((arr < 0).any()):
        raise ValueError(f"{func}: negative values in x with unsigned=True")
    return _amax(arr, am, nb, unsigned=bool(unsigned), narrow_range=bool(narrow_range),
                 axis=axis, out=out, mask=return_mask, func=func)


def _amax_fast(x, amax, num_bits, unsigned, narrow_range, out, want_mask):
    """Per-tensor amax fake quant of a contiguous float32 / float64 numpy
    array with a scalar amax: the general path's parameters (the amax
    scheme of qc_qparams.h) and kernel without its layout machinery; None
    when not that case or an argument fails a check."""
    from .qparams import amax_bounds
    flat = A.fast_flat(x)
    if flat is None or not isinstance(amax, _REALS) or type(num_bits) is not int or \
            not 2 <= num_bits <= 16:
        return None
    dest = A.fast_out(x, out)
    if dest is None:
        return None
    work = x.dtype
    am = np.array([amax], work)
    if not (math.isfinite(am[0]) and am[0] >= 0) or (unsigned and bool((flat < 0).any())):
        return None
    sid, _ = K.QP_SCHEMES["amax"]
    mult, div = K.qparams(sid, am, None, 0.0, 0.0, 0.0, num_bits, 1 if unsigned else 0)[:, 0]
    lo, hi = amax_bounds(num_bits, unsigned, narrow_range)
    mask = np.empty(x.shape, np.uint8) if want_mask else None
    K.ew_tensor(_AMAX, flat, dest[1], None if mask is None else mask.reshape(-1), float(mult),
                float(div), float(am[0]), 0.0, 0.0, lo, hi, 0, effective_n_threads(flat.shape[0]))
    return dest[0] if mask is None else (dest[0], mask.view(np.bool_))


# ----------------------------------------------------------------- backward
@A.interop
def ste_backward(grad, mask, *, out=None):
    """Straight-through-estimator backward: ``grad * mask``.

    ``mask`` is a bool / uint8 array of grad's shape, or a bit-packed uint8
    array from ``numpy.packbits(mask.ravel(), bitorder="little")`` (then it
    is unpacked first).  NaN gradients stay NaN where the mask is 0
    (``NaN * 0``), as in the frameworks.
    """
    func = "ste_backward"
    flat = A.fast_flat(grad)
    if flat is not None and type(mask) is np.ndarray and mask.shape == grad.shape and \
            mask.dtype in _MASK_DTYPES and mask.flags.c_contiguous:
        dest = A.fast_out(grad, out)
        if dest is not None:  # the common case, without the layout machinery
            K.ste(flat, mask.view(np.uint8).reshape(-1), dest[1],
                  effective_n_threads(flat.shape[0]))
            return dest[0]
    g = A.as_float_array(grad, "grad", func)
    xp = A.array_module(g)
    mk = xp.asarray(mask)
    if mk.dtype not in (np.bool_, np.uint8):
        raise TypeError(f"{func}: mask must be bool or uint8, got {mk.dtype}")
    if mk.shape != g.shape:
        packed_len = (g.size + 7) // 8
        if mk.dtype == np.uint8 and mk.ndim == 1 and mk.shape[0] == packed_len:
            mk = xp.unpackbits(mk, bitorder="little")[:g.size].reshape(g.shape)
        else:
            raise ValueError(f"{func}: mask has shape {mk.shape}, expected {g.shape} "
                             f"(or {packed_len} packed bytes)")
    work = A.compute_dtype(g.dtype)
    layout = A.Layout(g, work)
    mk8 = mk.view(np.uint8)
    mflat = xp.ascontiguousarray(mk8 if layout.order == "C" else mk8.T).reshape(-1)
    o = A.Output(layout, g, out, g.dtype, work, func)
    A.kernels_for(layout.flat, func).ste(layout.flat, mflat, o.flat,
                                         effective_n_threads(layout.flat.shape[0]))
    return o.finish(g.dtype)
