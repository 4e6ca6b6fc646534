"""Observers and FakeQuantize-style modules for the low-precision formats of
:mod:`quantcore.formats`.

- :class:`AmaxObserver`: running ``amax = max(|min|, |max|)`` per tensor,
  per channel (``axis``: one value per index of that axis, e.g. per row of
  ``W[N, K]`` with ``axis=0``) or per group (``group_size``: groups of
  consecutive elements along the last axis).
- :class:`GroupMinMaxObserver`: running min / max per group.
- :class:`FP8FakeQuantize`: observe amax (or take it per batch,
  ``dynamic=True``), then :func:`quantcore.formats.fp8_fake_quant`; backward
  by the straight-through mask.
- :class:`GroupFakeQuantize`: weight fake quantization by a group recipe
  (:func:`quantcore.formats.group_fake_quant`, its qparams from the tensor
  itself, as weight-only QAT does), its group min / max observed; backward
  by the mask.

State is float32 numpy; batches may be numpy or cupy (the per-channel / per
group statistics come from :func:`quantcore.minmax` on the device, then one
small copy).  ``state_dict`` / ``load_state_dict`` hold arrays and scalars
only.  Non-finite batches: ``nan_policy`` as in :mod:`quantcore.observers`
("skip" with a RuntimeWarning, "propagate", "raise").
"""
import warnings

import numpy as np

from .. import _arrays as A
from .._locks import Locked, new_lock
from .._switches import TrainEval
from ..ops import minmax, ste_backward
from . import _common, fp8, groups

F32 = np.float32

__all__ = ["AmaxObserver", "GroupMinMaxObserver", "FP8FakeQuantize", "GroupFakeQuantize"]


def _group_view(arr, group_size, func):
    """(rows * groups, group_size) view of arr's groups along the last axis."""
    g = A.as_int(group_size, "group_size", func)
    if g < 1 or arr.shape[-1] % g:
        raise ValueError(f"{func}: the last axis ({arr.shape[-1]}) must be a multiple of "
                         f"group_size {g}")
    xp = A.array_module(arr)
    return xp.ascontiguousarray(arr).reshape(-1, g), arr.shape[:-1] + (arr.shape[-1] // g,)


class _RunningStats(Locked):
    """Shared state handling: running (min, max) per tensor / channel / group."""

    def __init__(self, axis=None, group_size=None, nan_policy="skip"):
        name = type(self).__name__
        if axis is not None and group_size is not None:
            raise ValueError(f"{name}: give axis or group_size, not both")
        if nan_policy not in ("skip", "propagate", "raise"):
            raise ValueError(f"{name}: nan_policy must be 'skip', 'propagate' or 'raise', got "
                             f"{nan_policy!r}")
        self.axis = None if axis is None else A.as_int(axis, "axis", name)
        self.group_size = None if group_size is None else A.as_int(group_size, "group_size",
                                                                     name)
        self.nan_policy = nan_policy
        self._lock = new_lock(self)
        self.reset()

    def reset(self):
        with self._lock:
            self.min_val = np.full((), np.inf, F32)
            self.max_val = np.full((), -np.inf, F32)
            self.num_batches = 0
            self.nonfinite_batches = 0

    def _batch(self, x):
        """Finished (min, max) of a batch, float32 numpy, in the observer's
        granularity; None to skip it."""
        func = f"{type(self).__name__}.update"
        arr = _common._float_input(x, func)
        if arr.size == 0:
            return None
        if self.group_size is not None:
            view, shape = _group_view(arr, self.group_size, func)
            lo, hi = minmax(view, 0)  # one channel per group
            lo, hi = lo.reshape(shape), hi.reshape(shape)
        else:
            lo, hi = minmax(arr, A.normalize_axis(self.axis, arr.ndim, func))
        lo, hi = np.asarray(A.to_host(lo), F32), np.asarray(A.to_host(hi), F32)
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            if self.nan_policy == "raise":
                raise ValueError(f"{func}: the batch contains NaN or inf")
            if self.nan_policy == "skip":
                self.nonfinite_batches += 1
                warnings.warn(f"{type(self).__name__}: a batch containing NaN or inf was skipped "
                              f"({self.nonfinite_batches} so far)", RuntimeWarning, stacklevel=4)
                return None
        return lo, hi

    @A.interop_method
    def update(self, x):
        """Record one batch (running min / max, NaN-propagating)."""
        with self._lock:
            stats = self._batch(x)
            if stats is None:
                return
            lo, hi = stats
            if self.num_batches and self.min_val.shape != lo.shape:
                raise ValueError(f"{type(self).__name__}.update: the batch's statistics have "
                                 f"shape {lo.shape}, the observer's {self.min_val.shape}")
            if self.num_batches:
                with np.errstate(invalid="ignore"):
                    lo, hi = np.minimum(self.min_val, lo), np.maximum(self.max_val, hi)
            self.min_val, self.max_val = lo.astype(F32), hi.astype(F32)
            self.num_batches += 1

    def __call__(self, x):
        self.update(x)
        return x

    def merge(self, other):
        """Fold another observer of the same kind and granularity in."""
        if type(other) is not type(self) or (other.axis, other.group_size) != \
                (self.axis, self.group_size):
            raise ValueError(f"{type(self).__name__}.merge: expected a {type(self).__name__} "
                             "with the same axis / group_size")
        with self._lock:
            if other.num_batches:
                if self.num_batches:
                    self.min_val = np.minimum(self.min_val, other.min_val).astype(F32)
                    self.max_val = np.maximum(self.max_val, other.max_val).astype(F32)
                else:
                    self.min_val, self.max_val = other.min_val.copy(), other.max_val.copy()
            self.num_batches += other.num_batches
            self.nonfinite_batches += other.nonfinite_batches
        return self

    def state_dict(self):
        with self._lock:
            return {"min_val": self.min_val.copy(), "max_val": self.max_val.copy(),
                    "num_batches": int(self.num_batches),
                    "nonfinite_batches": int(self.nonfinite_batches),
                    "axis": -1 if self.axis is None else self.axis,
                    "group_size": 0 if self.group_size is None else self.group_size}

    def load_state_dict(self, state):
        name = type(self).__name__
        if not isinstance(state, dict) or not {"min_val", "max_val"} <= set(state):
            raise ValueError(f"{name}.load_state_dict: expected a dict with min_val and max_val")
        mn, mx = np.asarray(state["min_val"]), np.asarray(state["max_val"])
        if mn.dtype.kind != "f" or mn.shape != mx.shape:
            raise ValueError(f"{name}.load_state_dict: min_val / max_val must be float arrays "
                             "of one shape")
        with self._lock:
            self.min_val, self.max_val = mn.astype(F32), mx.astype(F32)
            self.num_batches = int(state.get("num_batches", 1))
            self.nonfinite_batches = int(state.get("nonfinite_batches", 0))


class AmaxObserver(_RunningStats):
    """Running ``amax = max(|min|, |max|)`` (modelopt's max calibrator,
    torchao's delayed scaling with history 1 per batch).

    Parameters
    ----------
    axis : int, optional
        One amax per index of this axis (per row of ``W[N, K]``: 0).
    group_size : int, optional
        One amax per group of consecutive elements along the last axis.
    nan_policy : {"skip", "propagate", "raise"}
    """

    @property
    def amax(self):
        """float32 amax (0-d per tensor); NaN propagates."""
        with np.errstate(invalid="ignore"):
            a = np.maximum(np.abs(self.min_val), np.abs(self.max_val))
        return np.where(np.isnan(self.min_val) | np.isnan(self.max_val), F32(np.nan),
                        a).astype(F32)


class GroupMinMaxObserver(_RunningStats):
    """Running min / max per group of ``group_size`` consecutive elements
    along the last axis (the statistics of the group recipes)."""

    def __init__(self, group_size, nan_policy="skip"):
        super().__init__(None, group_size, nan_policy)


class _STE(TrainEval):
    """Forward keeps the mask; backward multiplies by it; ``train`` /
    ``eval`` set ``training``."""

    _mask = None

    def backward(self, grad_output):
        """Straight-through gradient: ``grad * mask`` of the last forward
        (identity when fake quant was off)."""
        if self._mask is None:
            return grad_output
        return ste_backward(grad_output, self._mask)

    @property
    def mask(self):
        return self._mask


class FP8FakeQuantize(_STE):
    """Observe amax, fake quantize to FP8, backward by the STE mask.

    ``forward(x)``: in training with the observer on, the observer records
    x; then ``y = fp8_fake_quant(x, amax, fmt, recipe=..., pow2=..., axis=...)``
    with the observer's running amax (``dynamic=True``: x's own amax, as
    torchao's dynamic scaling).  The mask is modelopt's ``|x| <= amax`` or
    torchao's ``|x * s| <= max``.

    Parameters
    ----------
    fmt : {"e4m3fn", "e5m2", ...}; recipe : {"modelopt", "torchao"};
    pow2 : bool (torchao); axis : int or None (the axis kept);
    dynamic : bool; nan_policy : the observer's
    """

    def __init__(self, fmt="e4m3fn", *, recipe="modelopt", pow2=False, axis=None,
                 dynamic=False, nan_policy="skip"):
        fp8.fp8_scale(np.float32(1), fmt, recipe=recipe, pow2=pow2)  # validates the options
        self.fmt, self.recipe, self.pow2, self.axis = fmt, recipe, bool(pow2), axis
        self.dynamic = bool(dynamic)
        self.observer = AmaxObserver(axis=axis, nan_policy=nan_policy)
        self.training = True
        self.observer_enabled = True
        self.fake_quant_enabled = True

    @property
    def scale(self):
        """The current FP8 scale ``s`` (x is quantized as ``cast(x * s)``)."""
        return fp8.fp8_scale(self.observer.amax, self.fmt, recipe=self.recipe, pow2=self.pow2)

    @A.interop_method
    def forward(self, x):
        if self.training and self.observer_enabled:
            self.observer.update(x)
        if not self.fake_quant_enabled:
            self._mask = None
            return x
        amax = None if self.dynamic else self.observer.amax
        if amax is not None and self.observer.num_batches == 0:
            raise RuntimeError("FP8FakeQuantize: no amax observed yet (train on a batch, or "
                               "use dynamic=True)")
        y, self._mask = fp8.fp8_fake_quant(x, amax, self.fmt, recipe=self.recipe, pow2=self.pow2,
                                         axis=self.axis, return_mask=True)
        return y

    __call__ = forward

    def state_dict(self):
        return {"observer": self.observer.state_dict(), "fmt": self.fmt, "recipe": self.recipe,
                "pow2": self.pow2}

    def load_state_dict(self, state):
        self.observer.load_state_dict(state["observer"])


class GroupFakeQuantize(_STE):
    """Weight fake quantization by a group recipe (spec §6.2), qparams from
    the tensor itself at every forward; the group min / max are recorded by
    a :class:`GroupMinMaxObserver` (``observer``) in training.

    ``forward(w)`` = ``group_fake_quant(w, bits, group_size, recipe=...,
    symmetric=...)`` along the last axis; backward by the mask ``qmin <=
    round(...) <= qmax``.
    """

    def __init__(self, bits=4, group_size=128, *, symmetric=False, recipe="onnx",
                 quant_min=None, quant_max=None, nan_policy="skip"):
        groups.group_qrange(bits, recipe, symmetric, quant_min, quant_max)  # validates
        self.bits, self.group_size = bits, A.as_int(group_size, "group_size", "GroupFakeQuantize")
        if self.group_size < 1:
            raise ValueError(f"GroupFakeQuantize: group_size must be >= 1, got {group_size}")
        self.symmetric, self.recipe = bool(symmetric), recipe
        self.quant_min, self.quant_max = quant_min, quant_max
        self.observer = GroupMinMaxObserver(group_size, nan_policy=nan_policy)
        self.training = True
        self.fake_quant_enabled = True

    def quantize(self, w):
        """(codes, scale, zero_point) of w by the module's recipe."""
        return groups.group_quantize(w, self.bits, self.group_size, symmetric=self.symmetric,
                                recipe=self.recipe, quant_min=self.quant_min,
                                quant_max=self.quant_max)

    @A.interop_method
    def forward(self, w):
        if self.training:
            self.observer.update(w)
        if not self.fake_quant_enabled:
            self._mask = None
            return w
        y, self._mask = groups.group_fake_quant(w, self.bits, self.group_size,
                                           symmetric=self.symmetric, recipe=self.recipe,
                                           quant_min=self.quant_min, quant_max=self.quant_max,
                                           return_mask=True)
        return y

    __call__ = forward
