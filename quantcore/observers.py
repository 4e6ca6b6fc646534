"""Min/max observers: statistics as state, one update rule per class.

Every observer works per tensor (``axis=None``: 0-d ``min_val`` /
``max_val``) or per channel along ``axis`` (1-D, one value per channel);
the batch statistics come from one pass of :func:`quantcore.minmax`.  State
is float32 and every update rule is float32 arithmetic in the order given
in the class docstring.

Non-finite policy (``nan_policy``), the same for all observers:

- ``"skip"`` (default): a batch holding a NaN or a +-inf (in any channel)
  does not change the state; a RuntimeWarning is issued and
  ``nonfinite_batches`` counts it, so one bad batch can never poison later
  qparams silently (an inf would make a range infinite for good).
- ``"propagate"``: NaN and +-inf enter the state and stay (frameworks'
  behaviour: +-inf enters min/max and makes moving averages inf / NaN).
- ``"raise"``: ValueError.

State is updated in place, as a framework module updates its buffers: the
``min_val`` / ``max_val`` arrays keep their identity across ``update``,
``merge``, ``reset`` and ``load_state_dict``, and ``state_dict()`` returns
those arrays themselves (not copies), so a reference taken once sees every
later update.  The one exception is a change of shape: a per-channel
observer's arrays get their channel count with the first batch (torch
resizes its buffers in place there; a numpy array cannot change its size
while other references to it may exist, so new arrays are bound then).

Observers are thread-safe: ``update``, ``merge``, ``reset`` and the state
methods hold a per-instance lock.  They pickle, deep-copy and cloudpickle
(the lock is dropped and a new one made), continuing exactly where the
original stands.
"""
import threading

import numpy as np

from . import _arrays as A
from . import qparams as Q
from ._warn import warn
from ._cpu import _kernels
from .ops import MM_NAN, _finish_minmax, _minmax_flags

F32 = np.float32

__all__ = ["MinMaxObserver", "MovingAverageMinMaxObserver", "EMAMinMaxObserver",
           "MomentumMinMaxObserver", "ObserverBase"]


class ObserverBase:
    """Shared state handling of the min/max observers.

    Parameters
    ----------
    axis : int or None
        None for per-tensor statistics, an int for per-channel statistics
        along that axis (negative values count from the end).
    nan_policy : {"skip", "propagate", "raise"}
        See the module docstring.
    """

    #: whether merge() combines two observers exactly
    mergeable = False
    _FIELDS = ()  # extra scalar configuration saved in state_dict

    def __init__(self, axis=None, nan_policy="skip"):
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
            raise TypeError(f"{type(self).__name__}: axis must be an int or None, got {axis!r}")
        if nan_policy not in ("skip", "propagate", "raise"):
            raise ValueError(f"{type(self).__name__}: nan_policy must be 'skip', 'propagate' or "
                             f"'raise', got {nan_policy!r}")
        self.axis = None if axis is None else int(axis)
        self.nan_policy = nan_policy
        self._lock = threading.RLock()
        self.reset()

    # -- state -------------------------------------------------------------
    def reset(self):
        """Forget all statistics (per tensor in place; a per-channel observer
        gets new empty arrays, as torch's per-channel observers do)."""
        with self._lock:
            shape = () if self.axis is None else (0,)
            self._store(np.full(shape, np.inf, dtype=F32), np.full(shape, -np.inf, dtype=F32))
            self.num_batches = 0
            self.nonfinite_batches = 0

    def _store(self, mn, mx):
        """Write new statistics into ``min_val`` / ``max_val`` in place (new
        float32 arrays only where the shape changes)."""
        for name, value in (("min_val", mn), ("max_val", mx)):
            store_into(self, name, value, F32)

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_lock"]  # a lock cannot be pickled; __setstate__ makes a new one
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def initialized(self):
        """True once a batch has been recorded."""
        return self.num_batches > 0

    def state_dict(self):
        """The state as a dict of numpy arrays and Python scalars; the arrays
        are the observer's own ``min_val`` / ``max_val`` (shared, as a torch
        state_dict shares its buffers' storage: copy them to keep a snapshot)."""
        with self._lock:
            d = {"min_val": self.min_val, "max_val": self.max_val,
                 "num_batches": int(self.num_batches), "nonfinite_batches": int(self.nonfinite_batches),
                 "axis": -1 if self.axis is None else int(self.axis),
                 "per_channel": self.axis is not None, "nan_policy": self.nan_policy}
            for name in self._FIELDS:
                d[name] = getattr(self, name)
            return d

    def load_state_dict(self, state):
        """Restore ``state_dict()`` output (validated; nothing is unpickled)."""
        name = type(self).__name__
        if not isinstance(state, dict):
            raise TypeError(f"{name}.load_state_dict: expected a dict, got {type(state).__name__}")
        missing = {"min_val", "max_val"} - set(state)
        if missing:
            raise ValueError(f"{name}.load_state_dict: missing keys {sorted(missing)}")
        mn = np.asarray(state["min_val"])
        mx = np.asarray(state["max_val"])
        if mn.dtype.kind != "f" or mx.dtype.kind != "f" or mn.shape != mx.shape:
            raise ValueError(f"{name}.load_state_dict: min_val / max_val must be float arrays of "
                             f"one shape, got {mn.dtype}{mn.shape} and {mx.dtype}{mx.shape}")
        want_ndim = 0 if self.axis is None else 1
        if mn.ndim != want_ndim:
            raise ValueError(f"{name}.load_state_dict: min_val has ndim {mn.ndim}, this observer "
                             f"({'per tensor' if self.axis is None else 'per channel'}) needs "
                             f"{want_ndim}")
        with self._lock:
            self._store(mn, mx)
            self.num_batches = int(state.get("num_batches", 1 if np.isfinite(mn).any() else 0))
            self.nonfinite_batches = int(state.get("nonfinite_batches", 0))
            for field in self._FIELDS:
                if field in state:
                    setattr(self, field, type(getattr(self, field))(state[field]))

    # -- observing ---------------------------------------------------------
    def __call__(self, x):
        """Record ``x`` and return it unchanged (like a framework module)."""
        self.update(x)
        return x

    forward = __call__

    def batch_minmax(self, x):
        """(min, max) of one batch, after the NaN policy; None to skip it."""
        arr = A.as_float_array(x, "x", f"{type(self).__name__}.update")
        if arr.size == 0:
            return None
        axis = A.normalize_axis(self.axis, arr.ndim, f"{type(self).__name__}.update")
        lo, hi, flags = _minmax_flags(arr, axis, "update")
        if A.is_cupy_array(lo):  # the state lives on the host: one small copy
            lo, hi, flags = A.to_host(lo), A.to_host(hi), A.to_host(flags)
        # non-finite: a NaN (flag), or +-inf (a raw min / max at infinity)
        nonfinite = bool(np.any(np.asarray(flags) & MM_NAN)) or \
            bool(np.isinf(lo).any()) or bool(np.isinf(hi).any())
        if nonfinite and self.nan_policy != "propagate":
            if self.nan_policy == "raise":
                raise ValueError(f"{type(self).__name__}.update: the batch contains NaN or inf")
            self._note_nonfinite_batch()
            return None
        lo, hi = _finish_minmax(lo, hi, flags)
        return lo.astype(F32), hi.astype(F32)

    def _note_nonfinite_batch(self, count=1):
        """Count and warn about ``count`` skipped non-finite (NaN or +-inf)
        batches (the warning names the caller's line)."""
        self.nonfinite_batches += count
        what = "a batch" if count == 1 else f"{count} batches"
        warn(f"{type(self).__name__}: {what} containing NaN or inf was skipped "
             f"({self.nonfinite_batches} so far)", RuntimeWarning)

    @A.interop_method
    def update(self, x):
        """Record one batch (an empty batch changes nothing)."""
        with self._lock:
            stats = self.batch_minmax(x)
            if stats is None:
                return
            lo, hi = stats
            if self.axis is not None and self.min_val.size and self.min_val.shape != lo.shape:
                raise ValueError(f"{type(self).__name__}.update: the batch has {lo.shape[0]} "
                                 f"channels, the observer {self.min_val.shape[0]}")
            first = self.num_batches == 0
            self._store(*self._combine(lo, hi, first))
            self.num_batches += 1

    def _combine(self, lo, hi, first):
        raise NotImplementedError

    # -- merging -----------------------------------------------------------
    def merge(self, other):
        """Fold another observer's statistics into this one, exactly.

        Only observers whose statistic combines exactly (running min/max)
        support it; moving averages depend on the order of the batches.
        """
        if not self.mergeable:
            raise ValueError(f"{type(self).__name__} cannot be merged: its moving-average "
                             "statistic depends on the order of the batches")
        if type(other) is not type(self) or other.axis != self.axis:
            raise ValueError(f"{type(self).__name__}.merge: expected a {type(self).__name__} "
                             f"with axis={self.axis}, got {type(other).__name__}")
        with self._lock:
            if other.num_batches == 0:
                self.nonfinite_batches += other.nonfinite_batches
                return self
            if self.num_batches and self.min_val.shape != other.min_val.shape:
                raise ValueError(f"{type(self).__name__}.merge: channel counts differ "
                                 f"({self.min_val.shape} vs {other.min_val.shape})")
            if self.num_batches == 0:
                self._store(other.min_val, other.max_val)
            else:
                self._store(*self._combine(other.min_val, other.max_val, False))
            self.num_batches += other.num_batches
            self.nonfinite_batches += other.nonfinite_batches
        return self

    # -- qparams -----------------------------------------------------------
    def calculate_qparams(self, quant_min=0, quant_max=255, symmetric=False, eps=Q.F32_EPS):
        """(scale, zero_point) from the state via :mod:`quantcore.qparams`.

        Affine (:func:`~quantcore.qparams.affine_qparams`) or symmetric
        (:func:`~quantcore.qparams.symmetric_qparams`).  Before any batch the
        default ``(1.0, 0)`` is returned with a warning.
        """
        if self.num_batches == 0:
            warn(f"{type(self).__name__}: no batch observed yet; returning scale 1.0, "
                 "zero point 0", RuntimeWarning)
            n = 1 if self.axis is None else max(self.min_val.size, 1)
            return np.ones(n, F32), np.zeros(n, np.int64)
        fn = Q.symmetric_qparams if symmetric else Q.affine_qparams
        return fn(self.min_val, self.max_val, quant_min, quant_max, eps)

    def __repr__(self):
        where = "per tensor" if self.axis is None else f"axis={self.axis}"
        return f"{type(self).__name__}({where}, batches={self.num_batches})"


def store_into(obj, name, value, dtype):
    """``obj.<name>[...] = value`` in place, like a framework's ``copy_`` into
    a buffer; a new array of ``dtype`` is bound only when ``obj`` has none
    yet, or one of another shape or dtype (a numpy array cannot be resized
    safely while other references to it may exist)."""
    cur = getattr(obj, name, None)
    shape = value.shape if isinstance(value, np.ndarray) else np.shape(value)
    if type(cur) is np.ndarray and cur.shape == shape and cur.dtype == dtype and \
            cur.flags.writeable:
        if cur is not value:
            cur[...] = value  # (unsafe casting, as numpy's setitem; cheaper than copyto)
        return cur
    new = np.array(value, dtype=dtype, copy=True)
    setattr(obj, name, new)
    return new


def _running_minmax(m_lo, m_hi, lo, hi):
    """(min(m_lo, lo), max(m_hi, hi)) elementwise in float32, NaN-propagating,
    with ``-0.0 < +0.0`` (qc_running_min_f32 / qc_running_max_f32).

    The same order as :func:`quantcore.minmax` uses inside a batch, so the
    running statistic does not depend on how the data was split into
    batches (``np.minimum`` alone returns its second argument for
    ``min(+0.0, -0.0)`` and ``min(-0.0, +0.0)`` alike).
    """
    shape = np.shape(m_lo)
    flat = [np.ascontiguousarray(v, dtype=F32).reshape(-1) for v in (m_lo, m_hi, lo, hi)]
    new_lo, new_hi = _kernels.running_minmax(*flat)
    return new_lo.reshape(shape), new_hi.reshape(shape)


class MinMaxObserver(ObserverBase):
    """Running min / max over all batches::

        min_val = min(min_val, batch_min);  max_val = max(max_val, batch_max)

    NaN propagates (with ``nan_policy="propagate"``) and zeros are ordered
    ``-0.0 < +0.0``, as inside :func:`quantcore.minmax`.  Mergeable exactly:
    observers over chunks merge to the observer over the concatenation, bit
    for bit, whatever the split.
    """

    mergeable = True

    def _combine(self, lo, hi, first):
        if first:
            return lo.copy(), hi.copy()
        return _running_minmax(self.min_val, self.max_val, lo, hi)


class MovingAverageMinMaxObserver(ObserverBase):
    """Moving average in PyTorch's (and Horizon's in-place) form::

        first batch:  m = batch
        later:        m = f32(m + f32(c * f32(batch - m)))      (c = f32(averaging_constant))

    This is not ``(1 - c) m + c x``: c = 1 is not exactly memoryless.  The
    first-batch rule applies per observer (all channels at once).
    """

    _FIELDS = ("averaging_constant",)

    def __init__(self, averaging_constant=0.01, axis=None, nan_policy="skip"):
        c = float(averaging_constant)
        if not 0.0 < c <= 1.0:
            raise ValueError(f"MovingAverageMinMaxObserver: averaging_constant must be in (0, 1], "
                             f"got {averaging_constant!r}")
        self.averaging_constant = c
        super().__init__(axis, nan_policy)

    def _combine(self, lo, hi, first):
        if first:
            return lo.copy(), hi.copy()
        c = float(F32(self.averaging_constant))
        mn = np.array(self.min_val, dtype=F32, ndmin=1)
        mx = np.array(self.max_val, dtype=F32, ndmin=1)
        _kernels.ma_update(mn, np.array(lo, dtype=F32, ndmin=1), c)  # qc_ma_update_f32
        _kernels.ma_update(mx, np.array(hi, dtype=F32, ndmin=1), c)
        return mn.reshape(np.shape(lo)), mx.reshape(np.shape(hi))


class EMAMinMaxObserver(ObserverBase):
    """Exponential moving average in MindSpore's form, from initial values::

        c   = f32(1 - decay)                 (computed in double)
        min = f32(f32(min * decay) + f32(batch_min * c)), then min(min, 0) if include_zero
        max = f32(f32(max * decay) + f32(batch_max * c)), then max(max, 0) if include_zero

    There is no first-batch rule: the average starts from ``min_init`` /
    ``max_init`` (``decay=0`` gives the plain batch statistic).
    """

    _FIELDS = ("decay", "include_zero")

    def __init__(self, decay=0.999, min_init=-6.0, max_init=6.0, axis=None,
                 include_zero=True, nan_policy="skip", num_channels=None):
        d = float(decay)
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"EMAMinMaxObserver: decay must be in [0, 1], got {decay!r}")
        self.decay = d
        self.include_zero = bool(include_zero)
        self._init = (min_init, max_init, num_channels)
        super().__init__(axis, nan_policy)

    def reset(self):
        with self._lock:
            min_init, max_init, n = self._init
            shape = () if self.axis is None else (n if n is not None else np.size(min_init),)
            self._store(np.broadcast_to(np.asarray(min_init, F32), shape),
                        np.broadcast_to(np.asarray(max_init, F32), shape))
            self.num_batches = 0
            self.nonfinite_batches = 0

    @property
    def initialized(self):
        return True

    def _combine(self, lo, hi, first):
        d = F32(self.decay)
        c = F32(1.0 - self.decay)
        with np.errstate(invalid="ignore", over="ignore"):
            mn = ((self.min_val * d).astype(F32) + (lo * c).astype(F32)).astype(F32)
            mx = ((self.max_val * d).astype(F32) + (hi * c).astype(F32)).astype(F32)
        if self.include_zero:
            mn, mx = np.minimum(mn, F32(0)), np.maximum(mx, F32(0))
        return mn.astype(F32), mx.astype(F32)

    def calculate_qparams(self, quant_min=0, quant_max=255, symmetric=False, eps=Q.F32_EPS):
        fn = Q.symmetric_qparams if symmetric else Q.affine_qparams
        return fn(self.min_val, self.max_val, quant_min, quant_max, eps)


class MomentumMinMaxObserver(ObserverBase):
    """Momentum average in OneFlow's form, with its zero-buffer rule::

        om = f32(1 - f32(momentum))
        m  = batch                        if m == 0   (per side, every time)
        m  = f32(f32(m * momentum) + f32(batch * om))   otherwise

    With ``symmetric=True`` the statistic is ``a = max(|max|, |min|)`` of the
    batch, kept in ``max_val``, and ``min_val`` is set equal to it (OneFlow's
    buffers).  Affine tracks min and max independently.  State starts at 0.
    """

    _FIELDS = ("momentum", "symmetric")

    def __init__(self, momentum=0.95, symmetric=False, axis=None, nan_policy="skip"):
        self.momentum = float(momentum)
        self.symmetric = bool(symmetric)
        super().__init__(axis, nan_policy)

    def reset(self):
        with self._lock:
            shape = () if self.axis is None else (0,)
            self._store(np.zeros(shape, F32), np.zeros(shape, F32))
            self.num_batches = 0
            self.nonfinite_batches = 0

    def _side(self, old, new):
        m = F32(self.momentum)
        om = F32(F32(1) - m)
        if old.shape != new.shape:
            old = np.zeros_like(new)
        with np.errstate(invalid="ignore", over="ignore"):
            avg = ((old * m).astype(F32) + (new * om).astype(F32)).astype(F32)
        return np.where(old == 0, new, avg).astype(F32)

    def _combine(self, lo, hi, first):
        if self.symmetric:
            a = np.maximum(np.abs(hi), np.abs(lo)).astype(F32)
            mx = self._side(self.max_val, a)
            return mx.copy(), mx
        return self._side(self.min_val, lo), self._side(self.max_val, hi)
