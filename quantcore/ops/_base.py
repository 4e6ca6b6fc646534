"""The functional API's common part: the mode tables (from the extension),
min / max, and the plumbing of every elementwise family (``_ew``: layout,
``out``, mask).  See :mod:`quantcore.ops`."""
import math

import numpy as np

from .. import _arrays as A
from .._cpu import _kernels as K
from .._cpu.threads import effective_n_threads

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
    """An elementwise family of QC_EW_FAMILIES (qc_registry.h) over ``arr`` (a validated float
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


