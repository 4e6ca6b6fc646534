"""The nudged (TensorFlow / MindSpore) and amax (NVIDIA) families and the
straight-through backward.  See :mod:`quantcore.ops`."""
import math

import numpy as np

from .. import _arrays as A
from .._cpu import _kernels as K
from .._cpu.threads import effective_n_threads
from ._base import (NUDGED_DIVIDE, NUDGED_FORMULA, SCALE_OP, _choice, _ew, _vector)
from .affine import (_AMAX, _MASK_DTYPES, _MAX_W, _NUDGED, _REALS, _TINY)


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
    from ..qparams import amax_bounds, amax_multiplier
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
    if unsigned and bool(A.compare_exact(arr, "<", 0.0).any()):
        raise ValueError(f"{func}: negative values in x with unsigned=True")
    return _amax(arr, am, nb, unsigned=bool(unsigned), narrow_range=bool(narrow_range),
                 axis=axis, out=out, mask=return_mask, func=func)


def _amax_fast(x, amax, num_bits, unsigned, narrow_range, out, want_mask):
    """Per-tensor amax fake quant of a contiguous float32 / float64 numpy
    array with a scalar amax: the general path's parameters (the amax
    scheme of qc_qparams.h) and kernel without its layout machinery; None
    when not that case or an argument fails a check."""
    from ..qparams import amax_bounds
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
