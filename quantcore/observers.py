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

cupy batches are observed on the device: the statistics become cupy arrays
(``min_val`` / ``max_val`` are then the device arrays, updated in place by
the reduction's last block, :func:`quantcore_gpu.kernels.observe`, with the
rule of ``qc_observe_update`` in ``qc_minmax.h`` that the CPU applies too)
and the batch counts live on the device, so an update is one launch with no
host synchronisation.  Two consequences: a non-finite batch skipped on the
device is counted there without a warning (reading ``nonfinite_batches``
shows it), and ``nan_policy="raise"`` synchronises once per batch (a
16-byte read of the counts) to raise.  Reading ``num_batches`` /
``nonfinite_batches`` synchronises (16 bytes); ``calculate_qparams``
(which checks for "no batch yet"), ``state_dict`` and ``merge`` read them.
A numpy batch after cupy ones brings the state back to the host (and a
cupy batch after numpy ones takes it to the device): the arrays keep their
identity while they stay on one side, new ones are bound when the state
moves.

Observers are thread-safe: ``update``, ``merge``, ``reset`` and the state
methods hold a per-instance lock.  They pickle, deep-copy and cloudpickle
(the lock is dropped and a new one made), continuing exactly where the
original stands.
"""
import types

import numpy as np

from . import _arrays as A
from . import qparams as Q
from ._warn import warn
from ._cpu import _kernels
from ._cpu.threads import effective_n_threads
from ._locks import new_lock
from .ops import MM_NAN, _finish_minmax, _minmax_flags

F32 = np.float32
_INF = float("inf")

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
    #: (bound by reset; class defaults so that store_into's look-up of a new
    #: instance's arrays does not go through __getattr__)
    min_val = max_val = None
    #: the constructor's scalar configuration a state file holds, name ->
    #: its kind in state.py's schema ("real", "bool", ...)
    _FIELDS = {}
    #: the rule of qc_minmax.h's qc_observe_update this class's per-tensor
    #: update is ("minmax", "moving_average": its ``averaging_constant``), or
    #: None: FakeQuantize then runs it in its fused CPU step and its
    #: device-resident GPU step (read from the class itself, not inherited:
    #: a subclass that changes the update declares its own)
    DEVICE_RULE = None
    #: every observer class of this module by name: state files can hold
    #: each (state.py reads this; a class defined here is registered)
    REGISTRY = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:
            ObserverBase.REGISTRY[cls.__name__] = cls

    def __init__(self, axis=None, nan_policy="skip"):
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
            raise TypeError(f"{type(self).__name__}: axis must be an int or None, got {axis!r}")
        if nan_policy not in ("skip", "propagate", "raise"):
            raise ValueError(f"{type(self).__name__}: nan_policy must be 'skip', 'propagate' or "
                             f"'raise', got {nan_policy!r}")
        self.axis = None if axis is None else int(axis)
        self.nan_policy = nan_policy
        self._lock = new_lock(self)
        self.reset()

    # -- state -------------------------------------------------------------
    def reset(self):
        """Forget all statistics (per tensor in place; a per-channel observer
        gets new empty arrays, as torch's per-channel observers do)."""
        with self._lock:
            shape = () if self.axis is None else (0,)
            self._store(np.full(shape, np.inf, dtype=F32), np.full(shape, -np.inf, dtype=F32))
            self._set_counts(0, 0)

    def _set_counts(self, num_batches, nonfinite_batches):
        """Set both batch counts on the host (the host values then count;
        the device copy is refreshed by the next device update)."""
        self.num_batches = num_batches
        self.nonfinite_batches = nonfinite_batches

    def _store(self, mn, mx):
        """Write new statistics into ``min_val`` / ``max_val`` in place (new
        float32 arrays only where the shape changes)."""
        for name, value in (("min_val", mn), ("max_val", mx)):
            store_into(self, name, value, F32)

    def __getstate__(self):
        with self._lock:
            self._to_host()  # a copy starts on the host (cupy state is synchronised)
            state = self.__dict__.copy()
        del state["_lock"]  # a lock cannot be pickled; __setstate__ makes a new one
        state.pop("_dev", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = new_lock(self)

    # -- device residency (cupy batches) ------------------------------------
    # While the state is on the device, ``_dev`` holds the batch counts
    # (int64[2]) and the reductions' counter, and the instance attributes
    # num_batches / nonfinite_batches are absent: reading one synchronises
    # through __getattr__ (the host path pays nothing for it).  A count set
    # on the host (present in __dict__) is uploaded by the next device update.
    def __getattr__(self, name):
        if name in ("num_batches", "nonfinite_batches") and \
                self.__dict__.get("_dev") is not None:
            self._pull_counts()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _pull_counts(self):
        """Read the device's batch counts into the host attributes (16 bytes,
        one synchronisation); counts set on the host since are kept."""
        d = self.__dict__
        if "num_batches" not in d or "nonfinite_batches" not in d:
            nb, nf = (int(v) for v in d["_dev"].counts.get())
            d.setdefault("num_batches", nb)
            d.setdefault("nonfinite_batches", nf)

    def _on_device(self):
        """True while the statistics (or counts) live on the device."""
        return self.__dict__.get("_dev") is not None or A.is_cupy_array(self.min_val) or \
            A.is_cupy_array(self.max_val)

    def _to_host(self):
        """Bring device-resident state to the host (small copies; new numpy
        arrays are bound)."""
        if self.__dict__.get("_dev") is not None:
            self._pull_counts()
            self._dev = None
        for name in ("min_val", "max_val"):
            value = getattr(self, name)
            if A.is_cupy_array(value):
                setattr(self, name, value.get())

    def _device_rule(self):
        """(rule name of qc_observe_update, c, d, flags) of this observer."""
        raise NotImplementedError

    #: extra qc_observe_update flags of this observer (framework rules:
    #: compat layers set e.g. ("first_if_empty",) on their core observers)
    _obs_flags = ()

    def _empty_state(self, channels, xp):
        """The state a per-channel observer takes for its first batch."""
        return (xp.full(channels, np.inf, dtype=F32), xp.full(channels, -np.inf, dtype=F32))

    def _device_state(self, C, func):
        """The device state for a batch of C channels (uploaded from the
        host, or created for a first per-channel batch), as the struct
        :func:`quantcore_gpu.kernels.observe` takes."""
        import cupy as xp
        dev = self.__dict__.get("_dev")
        d = self.__dict__
        if dev is None or "num_batches" in d or "nonfinite_batches" in d:
            nb, nf = self.num_batches, self.nonfinite_batches  # (host values win)
            if dev is None:
                dev = types.SimpleNamespace(counts=xp.asarray(np.array([nb, nf], np.int64)),
                                            counter=xp.zeros(1, dtype=np.uint32))
            else:
                dev.counts[...] = xp.asarray(np.array([nb, nf], np.int64))
        mn, mx = self.min_val, self.max_val
        if self.axis is not None and mn.size == 0:
            mn, mx = self._empty_state(C, xp)
            self.min_val, self.max_val = mn, mx
        elif self.axis is not None and mn.shape != (C,):
            raise ValueError(f"{type(self).__name__}.update: the batch has {C} channels, the "
                             f"observer {mn.shape[0]}")
        for name, value in (("min_val", mn), ("max_val", mx)):
            if not A.is_cupy_array(value):
                setattr(self, name, xp.asarray(np.asarray(value, F32)))
        self._dev = dev
        d.pop("num_batches", None)
        d.pop("nonfinite_batches", None)
        return types.SimpleNamespace(channels=C, dtype=None, counts=dev.counts,
                                     counter=dev.counter, min_val=self.min_val.reshape(-1),
                                     max_val=self.max_val.reshape(-1))

    def _update_device(self, arr, func):
        """One cupy batch: reduction + update in one launch (no host sync,
        except with nan_policy="raise")."""
        G = A.gpu_kernels(func)
        axis = A.normalize_axis(self.axis, arr.ndim, func)
        layout = A.Layout(arr, A.compute_dtype(arr.dtype))
        outer, C, inner = (1, 1, int(layout.flat.size)) if axis is None else \
            layout.channels(axis)
        refuse = self.nan_policy == "raise"
        skipped_before = self.nonfinite_batches if refuse else 0
        st = self._device_state(C, func)
        rule, c, d, flags = self._device_rule()
        G.observe(layout.flat, outer, C, inner, st, observer=rule, averaging_constant=c,
                  decay=d, flags=tuple(flags) + tuple(self._obs_flags),
                  nan_policy="propagate" if self.nan_policy == "propagate" else "skip",
                  qscheme=None)
        if refuse and self.nonfinite_batches > skipped_before:
            # the kernel left the state alone and counted the batch: undo the count
            self.__dict__["nonfinite_batches"] = skipped_before
            raise ValueError(f"{type(self).__name__}.update: the batch contains NaN or inf")

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
                 "num_batches": int(self.num_batches),
                 "nonfinite_batches": int(self.nonfinite_batches),
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
        mn, mx = state["min_val"], state["max_val"]
        xp = A.array_module(mn) if A.is_cupy_array(mn) and A.is_cupy_array(mx) else np
        if xp is np:
            mn, mx = np.asarray(A.to_host(mn)), np.asarray(A.to_host(mx))
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
            self._set_counts(
                int(state.get("num_batches", 1 if bool(xp.isfinite(mn).any()) else 0)),
                int(state.get("nonfinite_batches", 0)))
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
        flat = A.fast_flat(x) if self.axis is None else None
        if flat is not None and flat.size:
            # the common case in one kernel call: the finished (min, max) is
            # NaN or infinite exactly when the batch holds NaN or +-inf
            lo, hi = _kernels.minmax_finished(flat, effective_n_threads(flat.size), False)
            if not -_INF < lo <= hi < _INF:
                return self._nonfinite_batch(np.array(lo, F32), np.array(hi, F32))
            return np.array(lo, F32), np.array(hi, F32)
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
        lo, hi = _finish_minmax(lo, hi, flags)
        if nonfinite:
            return self._nonfinite_batch(lo.astype(F32), hi.astype(F32))
        return lo.astype(F32), hi.astype(F32)

    def _nonfinite_batch(self, lo, hi):
        """A batch holding NaN or +-inf under the NaN policy: its finished
        (lo, hi) for "propagate", else None (skipped and counted) or
        ValueError ("raise")."""
        if self.nan_policy == "propagate":
            return lo, hi
        if self.nan_policy == "raise":
            raise ValueError(f"{type(self).__name__}.update: the batch contains NaN or inf")
        self._note_nonfinite_batch()
        return None

    def _note_nonfinite_batch(self, count=1):
        """Count and warn about ``count`` skipped non-finite (NaN or +-inf)
        batches (the warning names the caller's line)."""
        self.nonfinite_batches += count
        what = "a batch" if count == 1 else f"{count} batches"
        warn(f"{type(self).__name__}: {what} containing NaN or inf was skipped "
             f"({self.nonfinite_batches} so far)", RuntimeWarning)

    @A.interop_method
    def update(self, x):
        """Record one batch (an empty batch changes nothing).  A cupy batch
        is observed on the device (see the module docstring)."""
        if type(x) is not np.ndarray and A.is_cupy_array(x):
            func = f"{type(self).__name__}.update"
            arr = A.as_float_array(x, "x", func)
            if arr.size == 0:
                return
            with self._lock:
                return self._update_device(arr, func)
        with self._lock:
            if self.__dict__.get("_dev") is not None or type(self.min_val) is not np.ndarray:
                self._to_host()
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
            self._to_host()  # merged on the host (device state is synchronised)
            if other.num_batches == 0:
                self.nonfinite_batches += other.nonfinite_batches
                return self
            o_min, o_max = A.to_host(other.min_val), A.to_host(other.max_val)
            if self.num_batches and self.min_val.shape != o_min.shape:
                raise ValueError(f"{type(self).__name__}.merge: channel counts differ "
                                 f"({self.min_val.shape} vs {o_min.shape})")
            if self.num_batches == 0:
                self._store(o_min, o_max)
            else:
                self._store(*self._combine(o_min, o_max, False))
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
            xp = A.array_module(self.min_val)
            return xp.ones(n, F32), xp.zeros(n, np.int64)
        fn = Q.symmetric_qparams if symmetric else Q.affine_qparams
        return fn(self.min_val, self.max_val, quant_min, quant_max, eps)

    def __repr__(self):
        where = "per tensor" if self.axis is None else f"axis={self.axis}"
        return f"{type(self).__name__}({where}, batches={self.num_batches})"


def store_into(obj, name, value, dtype):
    """``obj.<name>[...] = value`` in place, like a framework's ``copy_`` into
    a buffer; a new array of ``dtype`` is bound only when ``obj`` has none
    yet, or one of another shape or dtype (a numpy array cannot be resized
    safely while other references to it may exist).  Device (cupy) arrays
    are written in place on the device too; a cupy value given for a numpy
    array binds a new cupy array (the state moves to the device)."""
    cur = getattr(obj, name, None)
    if type(cur) is np.ndarray and type(value) is np.ndarray and cur.shape == value.shape and \
            cur.dtype == dtype and cur.flags.writeable:  # (the common case, first)
        if cur is not value:
            cur[...] = value
        return cur
    if type(cur) is np.ndarray and not A.is_cupy_array(value):
        shape = A.shape_of(value)
        if cur.shape == shape and cur.dtype == dtype and cur.flags.writeable:
            if cur is not value:
                cur[...] = value  # (unsafe casting, as numpy's setitem; cheaper than copyto)
            return cur
        new = np.array(value, dtype=dtype, copy=True)
    elif A.is_cupy_array(cur) or A.is_cupy_array(value):
        xp = A.array_module(cur if A.is_cupy_array(cur) else value)
        shape = A.shape_of(value)
        if A.is_cupy_array(cur) and cur.shape == shape and cur.dtype == dtype:
            if cur is not value:  # (cupy's setitem takes no non-scalar numpy value)
                cur[...] = value if A.is_cupy_array(value) else xp.asarray(value, dtype)
            return cur
        new = xp.array(value if A.is_cupy_array(value) else np.asarray(value, dtype),
                       dtype=dtype, copy=True)
    else:
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
    DEVICE_RULE = "minmax"

    def _combine(self, lo, hi, first):
        if first:
            return lo.copy(), hi.copy()
        return _running_minmax(self.min_val, self.max_val, lo, hi)

    def _device_rule(self):
        return "minmax", 0.0, 0.0, ()


class MovingAverageMinMaxObserver(ObserverBase):
    """Moving average in PyTorch's (and Horizon's in-place) form::

        first batch:  m = batch
        later:        m = f32(m + f32(c * f32(batch - m)))      (c = f32(averaging_constant))

    This is not ``(1 - c) m + c x``: c = 1 is not exactly memoryless.  The
    first-batch rule applies per observer (all channels at once).
    """

    _FIELDS = {"averaging_constant": "real"}
    DEVICE_RULE = "moving_average"

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

    def _device_rule(self):
        return "moving_average", float(F32(self.averaging_constant)), 0.0, ()


class EMAMinMaxObserver(ObserverBase):
    """Exponential moving average in MindSpore's form, from initial values::

        c   = f32(1 - decay)                 (computed in double)
        min = f32(f32(min * decay) + f32(batch_min * c)), then min(min, 0) if include_zero
        max = f32(f32(max * decay) + f32(batch_max * c)), then max(max, 0) if include_zero

    There is no first-batch rule: the average starts from ``min_init`` /
    ``max_init`` (``decay=0`` gives the plain batch statistic).
    """

    _FIELDS = {"decay": "real", "include_zero": "bool"}

    def __init__(self, decay=0.999, min_init=-6.0, max_init=6.0, axis=None,
                 include_zero=True, nan_policy="skip", num_channels=None):
        d = float(decay)
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"EMAMinMaxObserver: decay must be in [0, 1], got {decay!r}")
        self.decay = d
        self.include_zero = bool(include_zero)
        lo, hi = (np.asarray(A.to_host(v), dtype=np.float64) for v in (min_init, max_init))
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
                and np.all(lo <= hi)):  # (each would start every statistic at NaN or inf)
            raise ValueError(f"EMAMinMaxObserver: min_init / max_init must be finite with "
                             f"min_init <= max_init, got {min_init!r:.60} and {max_init!r:.60}")
        self._init = (min_init, max_init, num_channels)
        super().__init__(axis, nan_policy)

    #: every batch starts from a zero state (MindSpore's ema=False:
    #: min(batch_min, 0), max(batch_max, 0)); set by compat.mindspore
    _from_zero = False

    def reset(self):
        with self._lock:
            min_init, max_init, n = self._init
            shape = () if self.axis is None else (n if n is not None else np.size(min_init),)
            self._store(np.broadcast_to(np.asarray(A.to_host(min_init), F32), shape),
                        np.broadcast_to(np.asarray(A.to_host(max_init), F32), shape))
            self._set_counts(0, 0)

    @property
    def initialized(self):
        return True

    def _device_rule(self):
        flags = (("include_zero",) if self.include_zero else ()) + \
            (("from_zero",) if self._from_zero else ())
        return "ema", float(F32(1.0 - self.decay)), float(F32(self.decay)), flags

    def _combine(self, lo, hi, first):
        return _host_update(self, self.min_val, self.max_val, lo, hi, first)

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

    _FIELDS = {"momentum": "real", "symmetric": "bool"}

    def __init__(self, momentum=0.95, symmetric=False, axis=None, nan_policy="skip"):
        self.momentum = float(momentum)
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"MomentumMinMaxObserver: momentum must be in [0, 1], got "
                             f"{momentum!r}")
        self.symmetric = bool(symmetric)
        super().__init__(axis, nan_policy)

    def reset(self):
        with self._lock:
            shape = () if self.axis is None else (0,)
            self._store(np.zeros(shape, F32), np.zeros(shape, F32))
            self._set_counts(0, 0)

    def _empty_state(self, channels, xp):
        return xp.zeros(channels, dtype=F32), xp.zeros(channels, dtype=F32)

    def _device_rule(self):
        m = F32(self.momentum)
        return ("momentum", float(F32(F32(1) - m)), float(m),
                ("absmax",) if self.symmetric else ())

    def _combine(self, lo, hi, first):
        mn, mx = self.min_val, self.max_val
        if np.shape(mn) != np.shape(lo):  # a first per-channel batch: zero buffers
            mn, mx = self._empty_state(np.size(lo), np)
        return _host_update(self, mn, mx, lo, hi, first)


#: qc_observe_update rule and flag names -> the CPU extension's constants
_HOST_RULES = {"minmax": _kernels.OBS_MINMAX, "moving_average": _kernels.OBS_MOVING_AVG,
               "ema": _kernels.OBS_EMA, "momentum": _kernels.OBS_MOMENTUM}
_HOST_FLAGS = {"include_zero": _kernels.OBS_INCLUDE_ZERO, "from_zero": _kernels.OBS_FROM_ZERO,
               "absmax": _kernels.OBS_ABSMAX, "first_if_empty": _kernels.OBS_FIRST_IF_EMPTY,
               "inf_resets": _kernels.OBS_INF_RESETS}


def _host_update(obs, m_lo, m_hi, lo, hi, first):
    """New (min, max) state from (m_lo, m_hi) and a batch's (lo, hi) by the
    observer's qc_observe_update rule (the one the device applies), as new
    float32 arrays of lo's shape."""
    rule, c, d, flags = obs._device_rule()
    mode = _HOST_RULES[rule]
    for name in flags:
        mode |= _HOST_FLAGS[name]
    mn = np.array(m_lo, dtype=F32, ndmin=1)  # (copies: the kernel works in place)
    mx = np.array(m_hi, dtype=F32, ndmin=1)
    _kernels.observe_update(mode, first, c, d, mn, mx,
                            np.ascontiguousarray(lo, dtype=F32).reshape(-1),
                            np.ascontiguousarray(hi, dtype=F32).reshape(-1))
    return mn.reshape(np.shape(lo)), mx.reshape(np.shape(hi))
