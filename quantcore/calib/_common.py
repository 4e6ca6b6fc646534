"""Code shared by the calibrators: argument checks, the device amax, and
the state-dict key check."""
import math
import numbers

import numpy as np

from .. import _arrays as A

_f32 = np.float32


def _check_int(value, name, func, low=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{func}: {name} must be an int, got {value!r}")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{func}: {name} must be >= {low}, got {value}")
    return value


def _check_merge_partner(self, other, cls, attr, what, func):
    """A calibrator's ``merge`` takes only a ``cls`` whose ``attr`` equals
    its own (TypeError / ValueError saying which and both values)."""
    if not isinstance(other, cls):
        raise TypeError(f"{func}: other must be a {cls.__name__}, got {type(other).__name__}")
    mine, theirs = getattr(self, attr), getattr(other, attr)
    if theirs != mine:
        raise ValueError(f"{func}: {what} ({mine!r} vs {theirs!r})")


def _check_num_bits(num_bits, func):
    nb = _check_int(num_bits, "num_bits", func)
    if not 2 <= nb <= 16:
        raise ValueError(f"{func}: num_bits must be in 2..16, got {nb}")
    return nb


def _as_f32_input(x, func):
    """x as a C-contiguous float32 array (float16 / float64 are converted);
    cupy input stays on the device."""
    arr = A.as_float_array(x, "x", func)
    if A.is_cupy_array(arr):
        return A.array_module(arr).ascontiguousarray(arr, dtype=_f32)
    return np.require(arr, _f32, ["C", "A"])  # (aligned: the kernels need it)


def _keep_up(state, like):
    """``state`` on the side (host / device) of ``like``: the statistics
    follow the data (small copies)."""
    if A.is_cupy_array(like) and not A.is_cupy_array(state):
        return A.array_module(like).asarray(state)
    if not A.is_cupy_array(like) and A.is_cupy_array(state):
        return state.get()
    return state


def _device_amax(arr, keep, work):
    """``abs(arr).max(axis=<all but keep>, keepdims=True)`` of a cupy array
    in the compute dtype ``work``, on the device: per kept index, the
    finished (min, max) of one reduction, then ``max(|min|, |max|)`` (NaN
    where a NaN was seen)."""
    from ..ops import _finish_minmax, _minmax_flags
    xp = A.array_module(arr)
    red = tuple(d for d in range(arr.ndim) if d not in keep)
    if not red:  # every axis kept: |x| itself
        return A.astype_exact(A.abs_exact(arr), work)
    shape = tuple(arr.shape[d] if d in keep else 1 for d in range(arr.ndim))
    if not keep:
        flat, axis = arr, None
    elif len(keep) == 1:
        flat, axis = arr, keep[0]
    else:  # the kept axes first, in order: one channel per kept index
        flat = xp.ascontiguousarray(arr.transpose(keep + red)).reshape(
            math.prod(arr.shape[d] for d in keep), -1)
        axis = 0
    lo, hi, flags = _minmax_flags(flat, axis, "MaxCalibrator.collect")
    lo, hi = _finish_minmax(lo, hi, flags)
    alo, ahi = A.abs_exact(lo), A.abs_exact(hi)
    return A.astype_exact(xp.where(A.compare_exact(alo, ">=", ahi), alo, ahi), work).reshape(shape)


def _max_into(amax, local):
    """``maximum(amax, local)`` of NaN-free non-negative arrays, in place on
    the device (a select: no ufunc's signed-zero / NaN rule is involved)."""
    xp = A.array_module(amax)
    xp.copyto(amax, xp.where(A.compare_exact(local, ">", amax), local, amax))
    return amax


def _check_keys(state, keys, func):
    if not isinstance(state, dict):
        raise TypeError(f"{func}: state must be a dict, got {type(state).__name__}")
    missing = [k for k in keys if k not in state]
    extra = [k for k in state if k not in keys]
    if missing or extra:
        raise ValueError(f"{func}: state keys do not match: missing {missing}, "
                         f"unexpected {extra}")
