"""FakeQuantize: observer + qparams + fake quant, with switches, a delay
and a straight-through backward.

One forward is at most two passes over the input: the observer's one-pass
min/max, then the fake-quant kernel, which writes the output and the
straight-through mask in the same pass.
"""

import numpy as np

from . import _arrays as A
from . import ops
from . import qparams as Q
from ._cpu import _kernels
from ._cpu.threads import effective_n_threads
from ._locks import new_lock
from ._switches import Switches
from .observers import MovingAverageMinMaxObserver, ObserverBase, store_into

F32 = np.float32
_F32 = np.dtype(F32)

__all__ = ["FakeQuantize"]

#: the observer update rules of the fused kernels (qc_observe_update), by
#: the name an observer class declares as its DEVICE_RULE
_RULE_IDS = {"minmax": _kernels.OBS_MINMAX, "moving_average": _kernels.OBS_MOVING_AVG}


_CLASS_RULES = {}   # observer class -> its rule name or None (looked up once per class)
_CLASS_RULE_IDS = {}   # observer class -> its rule's id in _RULE_IDS, 0 for none (the same)


def _device_rule(obs):
    """The fused kernels' rule name of ``obs``'s per-tensor update, or None:
    its class's own DEVICE_RULE (not inherited: a subclass may change the
    update)."""
    try:
        return _CLASS_RULES[type(obs)]
    except KeyError:
        rule = type(obs).__dict__.get("DEVICE_RULE")
        rule = _CLASS_RULES[type(obs)] = rule if rule in _RULE_IDS else None
        return rule


def _rule_id(obs):
    """:func:`_device_rule` as the kernels' id (``_RULE_IDS``), 0 for
    None; cached by class in ``_CLASS_RULE_IDS``, which the forward's fast
    path reads first."""
    rule = _device_rule(obs)
    rule_id = _CLASS_RULE_IDS[type(obs)] = _RULE_IDS[rule] if rule else 0
    return rule_id


_NAN_POLICY = {"skip": 0, "propagate": 1, "raise": 2}
_MOVING_AVG = _kernels.OBS_MOVING_AVG
_OBSERVED, _SKIPPED, _REFUSED = (_kernels.OBSERVED, _kernels.NONFINITE_SKIPPED,
                                 _kernels.NONFINITE_REFUSED)


def _store_minmax(obs, lo, hi):
    """``obs._store(lo, hi)`` for the fused step's new statistics (float32
    scalars): written in place into the float32 0-d arrays a per-tensor
    host observer holds, without ``store_into``'s general conversions (a
    scalar value takes its slow path: 2 x 0.5 us of a 5 us step at 1 Ki);
    any other state goes through ``obs._store``."""
    mn, mx = obs.min_val, obs.max_val
    if type(mx) is np.ndarray and mn.shape == () == mx.shape and mn.dtype is _F32 is mx.dtype \
            and mn.flags.writeable and mx.flags.writeable:
        mn[()] = lo
        mx[()] = hi
    else:
        obs._store(lo, hi)


def _synced_qparam(name, dtype, check, doc):
    """A qparam property of :class:`FakeQuantize` over the host array
    ``_<name>``: reading brings device-resident state back first
    (``_sync_host``); assigning converts the value (``_qparam_values``),
    checks it (``check(self, values)``), then stores it in place (as
    ``dtype``) and drops the device copy of the state."""
    attr = "_" + name

    def get(self):
        self._sync_host()
        return getattr(self, attr)

    def set_values(self, value):
        values = self._qparam_values(value, name)
        check(self, values)
        with self._lock:
            self._sync_host()
            store_into(self, attr, values, dtype)
            self._device = None
    return property(get, set_values, doc=doc)


class FakeQuantize(Switches):
    """Observe, compute qparams, fake quantize; backward by the STE mask.

    Forward, with ``(scale, zero_point)`` from the observer's statistics
    (:func:`quantcore.qparams.affine_qparams` or ``symmetric_qparams``)::

        training and observer_enabled:  observer.update(x); recompute qparams
                                        (NaN scales while the observer holds no
                                        batch: every batch so far was skipped)
        fake_quant_enabled and not in the delay:
            out  = (clamp(round(x * f32(1/scale)) + zp, qmin, qmax) - zp) * scale
            mask = qmin <= round(x * f32(1/scale)) + zp <= qmax
        otherwise:                      out = x, backward is the identity

    Parameters
    ----------
    observer : ObserverBase, optional
        Default: ``MovingAverageMinMaxObserver(axis=axis)``.
    quant_min, quant_max : int
        Integer range, ``quant_min < quant_max``.
    symmetric : bool
        Symmetric qparams (half-range divisor, fixed zero point).
    axis : int or None
        Per-channel axis; must agree with the observer's.
    eps : float
        Lower bound of the scale.
    rounding : {"half_even", "half_up", "half_away"}
        Rounding of the fake-quant kernel.
    quant_delay : int
        Training forwards that return ``x`` unchanged before quantizing (the
        observer still records them).
    packed_mask : bool
        Keep the backward mask bit-packed (1 bit per element,
        ``numpy.packbits(..., bitorder="little")``) instead of 1 byte.

    Attributes
    ----------
    scale, zero_point : ndarray
        Current qparams (float32 / int64, one value or one per channel).
    fake_quant_enabled, observer_enabled, training : bool
    step : int
        Training forwards so far.

    Notes
    -----
    Non-finite first batches: with ``nan_policy="skip"`` a batch holding NaN
    or +-inf is not recorded; if the observer then still holds no batch at
    all, there is nothing to compute qparams from and the scale becomes NaN,
    so that forward returns all NaN (mask 0), as a framework whose NaN
    statistics make NaN qparams does -- never values quantized with a
    made-up scale.  The first good batch sets real qparams.

    State is updated in place: ``scale`` / ``zero_point`` and the observer's
    ``min_val`` / ``max_val`` keep their identity across forwards, setters
    and ``load_state_dict``, and ``state_dict()`` shares them (a per-channel
    FakeQuantize binds new arrays once, when the first forward gives them
    their channel count).

    Thread safety: forward, backward, the setters and the state methods
    hold a per-instance lock (``threading.RLock``), so one FakeQuantize may
    be shared between threads; their calls are serialised.

    Pickling, ``copy.deepcopy`` and cloudpickle: the lock is dropped and a
    new one made on loading; a FakeQuantize whose state lives on the GPU
    (cupy input) is synchronised to the host first and pickles its host
    state, so a copy starts on the host (and uploads its state with its
    first cupy forward).  The last forward's mask is kept (as a host array),
    so ``backward`` works on the copy.
    """

    def __init__(self, observer=None, quant_min=0, quant_max=255, *, symmetric=False,
                 axis=None, eps=Q.F32_EPS, rounding="half_even", quant_delay=0,
                 packed_mask=False):
        func = "FakeQuantize"
        self.quant_min, self.quant_max = A.check_range(quant_min, quant_max, func)
        if observer is None:
            observer = MovingAverageMinMaxObserver(axis=axis)
        if not isinstance(observer, ObserverBase):
            raise TypeError(f"{func}: observer must be a quantcore observer instance, got "
                            f"{type(observer).__name__}")
        if axis is not None and observer.axis != axis:
            raise ValueError(f"{func}: axis={axis} but the observer has axis={observer.axis}")
        delay = A.as_int(quant_delay, "quant_delay", func)
        if delay < 0:
            raise ValueError(f"{func}: quant_delay must be >= 0, got {delay}")
        self._observer = observer
        self._device = None  # quantcore_gpu ObserverState while cupy inputs run
        self._host_stale = False  # the device state is ahead of the host's
        self._uploaded = None  # _host_snapshot() of what the device state holds
        # the device state was uploaded from an observer with no batch and
        # has not observed yet (its first observed forward sets NaN qparams)
        self._device_unobserved = False
        self.axis = observer.axis
        self.symmetric = bool(symmetric)
        self.eps = A.check_eps(eps, func)
        self.rounding = rounding
        self._mode = ops.affine_mode(rounding, func=func)
        self.quant_delay = delay
        self.packed_mask = bool(packed_mask)
        self.fake_quant_enabled = True
        self.observer_enabled = True
        self.training = True
        self.step = 0
        self._scale = np.ones(1, F32)
        self._zero_point = np.zeros(1, np.int64)
        self._mask = None
        self._mask_shape = None
        self._lock = new_lock(self)

    # -- host view of the state (synchronised from the GPU when needed) ---
    @property
    def observer(self):
        """The observer (its statistics brought back from the GPU first)."""
        self._sync_host()
        return self._observer

    @observer.setter
    def observer(self, observer):
        if not isinstance(observer, ObserverBase):
            raise TypeError(f"FakeQuantize: observer must be a quantcore observer instance, got "
                            f"{type(observer).__name__}")
        if observer.axis != self.axis:
            raise ValueError(f"FakeQuantize: the new observer has axis={observer.axis}, this "
                             f"FakeQuantize axis={self.axis}")
        self._sync_host()
        self._observer = observer
        self._device = None

    scale = _synced_qparam(
        "scale", F32,
        lambda self, s: ops.check_scales(s, np.dtype(F32), "FakeQuantize.scale"),
        """The qparams' scale (float32 [1] or [C]).  Set: one value, or one per
        channel; finite, > 0 and with a finite float32 reciprocal (ValueError
        otherwise).""")
    zero_point = _synced_qparam(
        "zero_point", np.int64,
        lambda self, z: ops.check_zero_points(z, self.quant_min, self.quant_max,
                                              "FakeQuantize.zero_point"),
        """The zero point (int64 [1] or [C]).  Set: one value, or one per
        channel; integers in [quant_min, quant_max] (ValueError otherwise).""")

    @staticmethod
    def _qparam_values(value, name):
        """A qparam given to a setter: one value, or a 1-D array of one per
        channel, as a float64 1-D array (TypeError / ValueError otherwise)."""
        value = A.to_host(value)
        channels = None if np.ndim(value) == 0 else np.size(value)
        arr = A.param_array(value, name, f"FakeQuantize.{name}", channels)
        if arr.size == 0:
            raise ValueError(f"FakeQuantize.{name}: needs one value or one per channel, got none")
        return arr

    def _sync_host(self):
        """Copy the device-resident statistics and qparams of the GPU path
        back into the host observer (one synchronisation, only when read),
        in place: the host arrays keep their identity."""
        if not self._host_stale:
            return
        self._host_stale = False
        st, obs = self._device, self._observer
        per_tensor = self.axis is None
        with obs._lock:
            lo, hi = st.min_val.get(), st.max_val.get()
            obs._store(lo.reshape(()) if per_tensor else lo, hi.reshape(()) if per_tensor else hi)
            obs.num_batches, obs.nonfinite_batches = (int(v) for v in st.counts.get())
        self._store_qparams(st.scale.get(), st.zero_point.get())
        self._uploaded = self._host_snapshot()

    def _store_qparams(self, scale, zero_point):
        """Write qparams into ``_scale`` / ``_zero_point`` in place."""
        store_into(self, "_scale", np.asarray(scale).reshape(-1), F32)
        store_into(self, "_zero_point", np.asarray(zero_point).reshape(-1), np.int64)

    def _qparams_from_observer(self, skipped_before, channels):
        """After an observed batch of ``channels`` channels: qparams from the
        statistics, or NaN scales (one per channel, as the GPU path keeps
        them) when that batch was skipped (non-finite) and the observer
        still holds no batch (nothing to compute qparams from; see the class
        Notes)."""
        obs = self._observer
        if obs.initialized:  # (the setters would refuse a NaN scale)
            # an observer that keeps its statistics on the device (cupy
            # batches of an observer without a fused device rule here, see
            # _forward_device) gives device qparams: the host keeps them
            # (a small copy)
            self._store_qparams(*(A.to_host(v) for v in self.calculate_qparams()))
        elif obs.nonfinite_batches > skipped_before:
            zp = self._zero_point
            self._store_qparams(np.full(channels, np.nan, F32),
                                zp if zp.size == channels else np.broadcast_to(zp[:1], channels))

    # -- pickling (the lock cannot be pickled; GPU state goes to the host) --
    def __getstate__(self):
        with self._lock:
            self._sync_host()
            state = self.__dict__.copy()
        del state["_lock"]
        state.update(_device=None, _host_stale=False, _uploaded=None, _device_unobserved=False)
        if state["_mask"] is not None:
            state["_mask"] = A.to_host(state["_mask"])
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = new_lock(self)

    def _host_snapshot(self):
        """The host state the device copy is built from (observer statistics,
        batch counts, qparams) as bytes: any change to it, through whatever
        path (host forwards, setters, the observer's own methods, direct
        attribute writes), makes the next device forward upload it again."""
        obs = self._observer
        if obs._on_device():  # the observer observed cupy batches itself: upload again
            return object()
        return (np.asarray(obs.min_val, F32).tobytes(), np.asarray(obs.max_val, F32).tobytes(),
                int(obs.num_batches), int(obs.nonfinite_batches),
                np.asarray(self._scale, F32).tobytes(),
                np.asarray(self._zero_point, np.int64).tobytes())

    # -- qparams -----------------------------------------------------------
    def calculate_qparams(self):
        """(scale, zero_point) from the observer's current statistics."""
        return self.observer.calculate_qparams(self.quant_min, self.quant_max,
                                               symmetric=self.symmetric, eps=self.eps)

    # -- forward / backward ------------------------------------------------
    def forward(self, x, out=None):
        """Fake-quantized ``x`` (see the class docstring); ``out`` may be x.

        Notes
        -----
        The common case takes a fast path: ``x`` a numpy array (not a
        subclass) of the float32 dtype, a per-tensor FakeQuantize whose
        observer has a rule of the fused kernel, and, read under the locks
        with the state the step updates, a current host state and a step
        that observes or quantizes.  It is :meth:`_forward_fused`'s step,
        with that method's checks (the layouts of x and ``out``, the
        observer's 0-d float32 statistics, the float32[1] / int64[1]
        qparams) and allocations made in one call of
        ``_kernels.fake_quantize_step_f32``, which writes the statistics
        and qparams in place.  Same kernel, same arguments read from the
        same attributes at each call (nothing is cached: a changed
        attribute counts at the next call), same order of the updates,
        same errors and warnings.  When a check fails the kernel reads and
        writes nothing, ``step`` is put back, and the general path
        (:meth:`_forward`) runs.  The fast path drops only per-call Python
        work: a few microseconds, most of a 1 Ki-value step.
        """
        if type(x) is np.ndarray and x.dtype is _F32 and self.axis is None:
            obs = self._observer
            rule = _CLASS_RULE_IDS.get(type(obs))
            if rule is None:
                rule = _rule_id(obs)
            if rule:
                with self._lock, obs._lock:
                    training, step = self.training, self.step
                    observe = training and self.observer_enabled
                    quantize = self.fake_quant_enabled and not (training and
                                                                step < self.quant_delay)
                    if (observe or quantize) and not self._host_stale:
                        if training:
                            self.step = step + 1
                        if not observe:
                            rule = 0
                        symmetric, qmin, qmax = self.symmetric, self.quant_min, self.quant_max
                        done = _kernels.fake_quantize_step_f32(
                            x, out, obs.min_val, obs.max_val, obs.num_batches, rule,
                            getattr(obs, "averaging_constant", 1.0) if rule == _MOVING_AVG
                            else 1.0, _NAN_POLICY[obs.nan_policy], self._scale,
                            self._zero_point, qmin, qmax, self.eps, symmetric,
                            Q.symmetric_zero_point(qmin, qmax) if symmetric else 0, quantize,
                            self._mode, effective_n_threads(x.size))
                        if done is None:  # nothing done: the general path counts the step
                            self.step = step
                        else:  # (the end of _forward_fused's step, inline)
                            status, y, mask = done
                            if status == _OBSERVED:
                                obs.num_batches += 1
                            elif status == _SKIPPED:
                                obs._note_nonfinite_batch()
                            elif status == _REFUSED:
                                raise ValueError(f"{type(obs).__name__}.update: the batch "
                                                 "contains NaN or inf")
                            return self._result(x, out, y, mask, quantize)
        return self._forward(x, out)

    def _result(self, x, out, y, mask, quantize):
        """A fused step's return: ``y`` (its mask kept for backward), or, when
        it did not quantize, ``x`` itself or copied into ``out``."""
        if not quantize:
            self._mask = None
            if out is None:
                return x
            np.copyto(out, x)
            return out
        self._mask_shape = x.shape
        self._mask = (np.packbits(mask.reshape(-1), bitorder="little")
                      if self.packed_mask else mask)
        return y

    @A.interop_method
    def _forward(self, x, out=None):
        """:meth:`forward`'s general path: any input (DLPack arrays through
        the interop decorator, cupy on the device), per channel."""
        func = "FakeQuantize.forward"
        arr = A.as_float_array(x, "x", func)
        if A.is_cupy_array(arr) and arr.dtype != np.float16 and \
                _device_rule(self._observer) and self._observer.nan_policy != "raise":
            return self._forward_device(arr, out)
        if arr.dtype == F32 and self._fused_ready():
            fast = self._forward_fused(arr, out)
            if fast is not None:
                return fast
        with self._lock:
            if self.training and self.observer_enabled:
                skipped_before = self.observer.nonfinite_batches
                self.observer.update(arr)
                self._qparams_from_observer(skipped_before, 1 if self.axis is None else
                                            arr.shape[A.normalize_axis(self.axis, arr.ndim,
                                                                       func)])
            delayed = self.training and self.step < self.quant_delay
            if self.training:
                self.step += 1
            if not self.fake_quant_enabled or delayed:
                self._mask = None
                if out is None:
                    return arr
                A.check_out(out, arr.shape, arr.dtype, func)
                np.copyto(out, arr)
                return out
            scale, zp = self.scale, self.zero_point
            if self.axis is not None:
                channels = arr.shape[A.normalize_axis(self.axis, arr.ndim, func)]
                if scale.size == 1:
                    scale = np.full(channels, scale[0], F32)
                    zp = np.full(channels, zp[0], zp.dtype)
                elif scale.size != channels:
                    raise ValueError(f"{func}: x has {channels} channels, the qparams "
                                     f"{scale.size}")
            axis = None if self.axis is None else A.normalize_axis(self.axis, arr.ndim, func)
            y, mask = ops._affine(arr, scale.astype(np.float64), zp.astype(np.float64),
                                  self.quant_min, self.quant_max, self._mode, axis=axis,
                                  out=out, mask=True, func=func, mask_dtype=np.uint8)
            self._mask_shape = arr.shape
            self._mask = (np.packbits(mask.reshape(-1), bitorder="little")
                          if self.packed_mask else mask)
            return y

    def _fused_ready(self):
        """True when a float32 host forward may take :meth:`_forward_fused`
        (per tensor, an observer rule the kernel has, host state current)."""
        return self.axis is None and _device_rule(self._observer) is not None and \
            not self._host_stale and type(self._observer.min_val) is np.ndarray

    def _forward_fused(self, arr, out):
        """Per-tensor float32 forward in one kernel call (observe, qparams,
        fake quant: two passes over x); None when the layout does not allow
        it (then the general path runs).  Same numbers as the general path."""
        c_order = arr.flags.c_contiguous
        if not ((c_order or arr.flags.f_contiguous) and arr.flags.aligned):
            return None
        if out is not None:
            A.check_out(out, arr.shape, arr.dtype, "FakeQuantize.forward")
            same_layout = (out.flags.c_contiguous if c_order else out.flags.f_contiguous) \
                and out.flags.aligned
            partial_overlap = (np.may_share_memory(out, arr) and out.ctypes.data != arr.ctypes.data)
            if not same_layout or partial_overlap:
                return None
        order = "C" if c_order else "F"
        obs = self._observer
        with self._lock, obs._lock:
            observe = self.training and self.observer_enabled
            delayed = self.training and self.step < self.quant_delay
            quantize = self.fake_quant_enabled and not delayed
            if self.training:
                self.step += 1
            if not observe and not quantize:
                self._mask = None
                if out is None:
                    return arr
                np.copyto(out, arr)
                return out
            y = np.empty(arr.shape, F32, order=order) if out is None else out
            mask = np.empty(arr.shape, np.uint8, order=order) if quantize else None
            # the kernel takes C-contiguous arrays of any shape: a Fortran-
            # ordered array is passed as its (C-contiguous) transpose
            xk, yk, mk = (arr, y, mask) if c_order else (
                arr.T, y.T, None if mask is None else mask.T)
            state = np.array((obs.min_val, obs.max_val, 1 if obs.num_batches else 0), F32)
            # the kernel writes the qparams (only when it observes) into the
            # qparams arrays themselves: in place, without copies
            scale, zp = self._scale, self._zero_point
            direct = scale.shape == zp.shape == (1,) and scale.dtype == F32 and \
                zp.dtype == np.int64 and scale.flags.writeable and zp.flags.writeable
            if not direct:
                scale, zp = np.array(scale[:1], F32), np.array(zp[:1], np.int64)
            # no batch yet: NaN qparams, kept if this batch is skipped (class Notes)
            nan_first = observe and not obs.num_batches
            if nan_first:
                kept, scale[0] = scale[0], np.nan
            rule = _RULE_IDS[_device_rule(obs)] if observe else 0
            c = getattr(obs, "averaging_constant", 1.0)
            n = arr.size
            status = None
            try:
                status = _kernels.observe_fake_quant_f32(
                    xk, yk, mk, state, rule, c, _NAN_POLICY[obs.nan_policy], scale, zp,
                    self.quant_min, self.quant_max, self.eps, self.symmetric,
                    Q.symmetric_zero_point(self.quant_min, self.quant_max),
                    quantize, self._mode, effective_n_threads(n))
            finally:
                if nan_first and status not in (_kernels.OBSERVED, _kernels.NONFINITE_SKIPPED):
                    scale[0] = kept  # nothing observed (empty x) or refused: unchanged
            if status == _kernels.NONFINITE_REFUSED:
                raise ValueError(f"{type(obs).__name__}.update: the batch contains NaN or inf")
            if status == _kernels.NONFINITE_SKIPPED:
                obs._note_nonfinite_batch()
            elif status == _kernels.OBSERVED:
                _store_minmax(obs, state[0], state[1])
                obs.num_batches += 1
            if not direct and (status == _kernels.OBSERVED or nan_first):
                self._store_qparams(scale, zp)
            return self._result(arr, out, y, mask, quantize)

    def _forward_device(self, arr, out):
        """cupy input: observe and fake quantize with the statistics and
        qparams kept on the device (two launches, no host synchronisation;
        skipped NaN batches are counted on the device, without a warning)."""
        from quantcore_gpu import kernels as G
        func = "FakeQuantize.forward"
        xp = A.array_module(arr)
        work = A.compute_dtype(arr.dtype)
        layout = A.Layout(arr, work)
        axis = None if self.axis is None else A.normalize_axis(self.axis, arr.ndim, func)
        outer, C, inner = (1, 1, int(layout.flat.size)) if axis is None else \
            layout.channels(axis)
        with self._lock:
            observe = self.training and self.observer_enabled
            quantize = self.fake_quant_enabled and not (self.training and
                                                        self.step < self.quant_delay)
            st = self._device
            if st is None or st.channels != C or st.dtype != work or \
                    (not self._host_stale and self._uploaded != self._host_snapshot()):
                st = self._upload_state(C, work, xp, observe, quantize, func)
            if self.training:
                self.step += 1
            if observe:
                obs = self._observer
                if self._device_unobserved:  # no batch yet: NaN qparams (class Notes)
                    st.set_qparams(np.full(C, np.nan, F32), st.zero_point.get())
                    self._device_unobserved = False
                G.observe(layout.flat, outer, C, inner, st,
                          observer=_device_rule(obs),
                          averaging_constant=getattr(obs, "averaging_constant", 1.0),
                          nan_policy=obs.nan_policy,
                          qscheme="symmetric" if self.symmetric else "affine",
                          quant_min=self.quant_min, quant_max=self.quant_max, eps=self.eps,
                          zero_point=Q.symmetric_zero_point(self.quant_min, self.quant_max))
                self._host_stale = True
            if not quantize:
                self._mask = None
                if out is None:
                    return arr
                A.check_out(out, arr.shape, arr.dtype, func, xp=xp)
                xp.copyto(out, arr)
                return out
            o = A.Output(layout, arr, out, arr.dtype, work, func)
            m = A.Output(layout, arr, None, np.dtype(np.uint8), np.dtype(np.uint8), func)
            G.ew(G.FAMILIES["affine"], layout.flat, o.flat, m.flat, outer, C, inner, st.qp,
                 self.quant_min, self.quant_max, self._mode)
            mask = m.finish(np.dtype(np.uint8))
            self._mask_shape = arr.shape
            self._mask = (xp.packbits(mask.reshape(-1), bitorder="little")
                          if self.packed_mask else mask)
            return o.finish(arr.dtype)

    def _upload_state(self, C, work, xp, observe, quantize, func):
        """A new device state for C channels holding the host state: the
        observer's statistics and batch counts and the current qparams (set
        by a forward or through the setters), broadcast from one value when
        the host holds one.  Channel-count mismatches raise the errors the
        host path raises for them."""
        from quantcore_gpu import kernels as G
        self._sync_host()
        obs = self._observer
        with obs._lock:
            obs._to_host()
        n_stats = np.size(obs.min_val) if obs.num_batches else C
        if observe and n_stats not in (1, C):
            raise ValueError(f"{type(obs).__name__}.update: the batch has {C} channels, the "
                             f"observer {n_stats}")
        n_qparams = np.size(self._scale)
        if quantize and not observe and n_qparams not in (1, C):
            raise ValueError(f"{func}: x has {C} channels, the qparams {n_qparams}")
        st = G.ObserverState(C, work)
        if obs.num_batches and n_stats in (1, C):
            for dev, host in ((st.min_val, obs.min_val), (st.max_val, obs.max_val)):
                dev[...] = xp.asarray(np.broadcast_to(np.asarray(host, F32).reshape(-1), (C,)))
        st.counts[...] = xp.asarray(np.array([obs.num_batches, obs.nonfinite_batches], np.int64))
        if n_qparams in (1, C):
            st.set_qparams(np.broadcast_to(self._scale, (C,)),
                           np.broadcast_to(self._zero_point, (C,)))
        self._device = st
        self._device_unobserved = not obs.num_batches
        # a state that could not take the host's values is rebuilt next time
        self._uploaded = self._host_snapshot() if n_stats in (1, C) and n_qparams in (1, C) \
            else None
        return st

    __call__ = forward

    @property
    def mask(self):
        """The straight-through mask of the last forward (packed if
        ``packed_mask``), or None when that forward did not quantize."""
        return self._mask

    @A.interop_method
    def backward(self, grad_output, out=None):
        """Input gradient of the last forward: ``grad * mask`` (STE), or
        ``grad`` itself when the last forward did not quantize."""
        func = "FakeQuantize.backward"
        g = A.as_float_array(grad_output, "grad_output", func)
        with self._lock:
            mask, shape = self._mask, self._mask_shape
        if mask is None:
            return g
        if g.shape != shape:
            raise ValueError(f"{func}: grad_output has shape {g.shape}, the last forward "
                             f"had {shape}")
        return ops.ste_backward(g, mask, out=out)

    # -- state -------------------------------------------------------------
    def state_dict(self):
        """The state as a dict; ``scale`` / ``zero_point`` and the observer's
        arrays are this object's own arrays (shared, not copies)."""
        with self._lock:
            return {
                "scale": self.scale, "zero_point": self.zero_point,
                "quant_min": self.quant_min, "quant_max": self.quant_max,
                "symmetric": self.symmetric, "eps": self.eps, "rounding": self.rounding,
                "quant_delay": self.quant_delay, "packed_mask": self.packed_mask,
                "fake_quant_enabled": self.fake_quant_enabled,
                "observer_enabled": self.observer_enabled, "training": self.training,
                "step": self.step, "observer": self.observer.state_dict(),
                "observer_class": type(self.observer).__name__,
            }

    def load_state_dict(self, state):
        if not isinstance(state, dict):
            raise TypeError(f"FakeQuantize.load_state_dict: expected a dict, got "
                            f"{type(state).__name__}")
        missing = {"scale", "zero_point", "observer"} - set(state)
        if missing:
            raise ValueError(f"FakeQuantize.load_state_dict: missing keys {sorted(missing)}")
        scale = np.asarray(state["scale"])
        zp = np.asarray(state["zero_point"])
        if scale.dtype.kind != "f" or zp.dtype.kind not in "iuf" or scale.shape != zp.shape:
            raise ValueError("FakeQuantize.load_state_dict: scale / zero_point must be numeric "
                             f"arrays of one shape, got {scale.dtype}{scale.shape} and "
                             f"{zp.dtype}{zp.shape}")
        with self._lock:
            self.observer.load_state_dict(state["observer"])
            self._sync_host()
            self._store_qparams(scale, zp)
            self._device = None
            for key in ("fake_quant_enabled", "observer_enabled", "training"):
                if key in state:
                    setattr(self, key, bool(state[key]))
            if "step" in state:
                self.step = int(state["step"])

    def __repr__(self):
        return (f"FakeQuantize(observer={self.observer!r}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, symmetric={self.symmetric}, "
                f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, training={self.training})")
