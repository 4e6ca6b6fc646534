"""The fake-quantize modules of ``torch.ao.quantization.fake_quantize``
and the module-wide switches."""

import numpy as np

from ... import _arrays as A
from ... import ops as _ops
from ... import qparams as Q
from ...fake_quantize import FakeQuantize as _CoreFakeQuantize
from ..._switches import Switches
from ...observers import store_into
from .._errors import AssertionValueError, RuntimeValueError
from ._common import (
    _IINFO,
    _IINFO_MSG,
    _as_state_array,
    _copy_into,
    _is_per_channel,
    _is_per_tensor,
    _is_symmetric,
    _load_into,
    _Module,
    _name,
)
from .functional import (
    _MODE_PER_TENSOR,
    _per_tensor_tensor_qparams,
    fake_quantize_per_channel_affine_cachemask,
)
from .fused import _fused
from .observer import (
    FixedQParamsObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
)

F32 = np.float32


def _is_float_qparams(q):
    return q == "per_channel_affine_float_qparams"


class _FakeQuantizeBase(Switches, _Module):
    _FLAG_DTYPE = np.uint8
    _SWITCHES_RETURN_SELF = False  # torch's switches return None

    def _init_flags(self):
        self.fake_quant_enabled = np.array([1], dtype=self._FLAG_DTYPE)
        self.observer_enabled = np.array([1], dtype=self._FLAG_DTYPE)


    def backward(self, grad_output):
        """Input gradient of the last forward: ``grad * mask`` (straight-through
        estimator), or ``grad`` itself where fake quant was off."""
        name = type(self).__name__
        if not hasattr(self, "_last_mask"):
            raise RuntimeError(f"{name}.backward: call forward first")
        g = A.as_float_array(grad_output, "grad_output", f"{name}.backward")
        mask = self._last_mask
        if mask is None:
            if g.shape != self._last_shape:
                raise RuntimeValueError(
                    f"{name}.backward: grad_output has shape {g.shape}, the last "
                    f"forward's input {self._last_shape}")
            return g.copy()
        if g.shape != mask.shape:
            raise RuntimeValueError(
                f"{name}.backward: grad_output has shape {g.shape}, the last "
                f"forward's input {mask.shape}")
        if g.size == 0:
            return g
        if A.is_cupy_array(g) != A.is_cupy_array(mask):
            # (a grad on the other side from the last forward's x)
            mask = A.array_module(g).asarray(mask) if A.is_cupy_array(g) else mask.get()
        return _ops.ste_backward(g, mask)


class FakeQuantize(_FakeQuantizeBase):
    """``torch.ao.quantization.FakeQuantize``: observer + qparams + fake quant.

    Buffers ``fake_quant_enabled`` / ``observer_enabled`` (uint8[1]),
    ``scale`` (float32[1], [C] per channel after a forward), ``zero_point``
    (int32, float32 for float_qparams); ``activation_post_process`` is the
    observer.
    """

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
                 is_dynamic=False, **observer_kwargs):
        self._init_flags()
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise AssertionValueError("quant_min must be less than or equal to quant_max")
            dtype = observer_kwargs.get("dtype", "quint8")
            if hasattr(observer, "p"):
                dtype = getattr(getattr(observer, "p", {}), "keywords", {}).get("dtype", dtype)
            dname = _name(dtype, "dtype")
            if dname not in _IINFO:
                raise TypeError(_IINFO_MSG)
            lo, hi, _ = _IINFO[dname]
            if lo > quant_min:
                raise AssertionValueError("quant_min out of bound")
            if quant_max > hi:
                raise AssertionValueError("quant_max out of bound")
            observer_kwargs.update({"quant_min": quant_min, "quant_max": quant_max})
        observer_kwargs["is_dynamic"] = is_dynamic
        self.activation_post_process = observer(**observer_kwargs)
        app = self.activation_post_process
        self.quant_min = app.quant_min
        self.quant_max = app.quant_max
        self.is_dynamic = app.is_dynamic
        zp_dtype = F32 if _is_float_qparams(app.qscheme) else np.int32
        self.scale = np.array([1.0], dtype=F32)
        self.zero_point = np.array([0], dtype=zp_dtype)
        self.dtype = app.dtype
        self.qscheme = app.qscheme
        self.ch_axis = app.ch_axis if hasattr(app, "ch_axis") else -1
        if not (_is_per_channel(self.qscheme) or _is_per_tensor(self.qscheme)):
            raise AssertionValueError(
                "Only per channel and per tensor quantization are supported in "
                f"fake quantize got qscheme: torch.{self.qscheme}")
        self.is_per_channel = _is_per_channel(self.qscheme)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def _store_qparams(self, scale, zero_point):
        """``self.scale.resize_(...).copy_(...)`` as torch: in place (a new
        array where the shape changes, see the module docstring)."""
        with np.errstate(invalid="ignore", over="ignore"):
            store_into(self, "scale", scale, F32)
            store_into(self, "zero_point", zero_point, self.zero_point.dtype)

    def forward(self, X):
        """Observe (if enabled), update scale / zero_point, fake-quantize (if enabled).

        A cupy X is observed and quantized on the device; scale /
        zero_point become device arrays (computed there).  Synchronisations:
        per tensor the qparams are read for the fake-quant call (8 bytes;
        torch's CUDA kernel reads them on the device), per channel the int32
        zero points (C values: torch's range check reads their min / max),
        and a HistogramObserver's own (see there)."""
        if self.observer_enabled[0] == 1 and self.fake_quant_enabled[0] == 1:
            res = self._forward_fused(X)
            if res is not None:
                return res
        if self.observer_enabled[0] == 1:
            self.activation_post_process(X)
            self._store_qparams(*self.calculate_qparams())
        self._last_shape = A.shape_of(X)
        self._last_mask = None
        if self.fake_quant_enabled[0] == 1:
            app = self.activation_post_process
            if self.is_per_channel:
                X, self._last_mask = fake_quantize_per_channel_affine_cachemask(
                    X, self.scale, self.zero_point, self.ch_axis, app.quant_min, app.quant_max)
            else:
                X, self._last_mask = _per_tensor_tensor_qparams(
                    X, self.scale, self.zero_point, app.quant_min, app.quant_max)
        return X

    def _fused_core(self, app):
        """The core FakeQuantize that computes this forward in one kernel call
        (its observer is ``app``'s core observer; torch's per-tensor fake-quant
        mode), or None where its numbers could differ from torch's: another
        observer or qscheme, a range not exact in float32, an eps without a
        finite reciprocal, a moving-average constant outside [0, 1] (torch's
        min <= max then need not hold), torch's symmetric zero point not the
        core's."""
        if type(app) not in _FUSED_OBSERVERS or self.is_per_channel or \
                app.min_val.shape != () or app.max_val.shape != ():
            return None
        qmin, qmax = app.quant_min, app.quant_max
        eps = float(app.eps[0])
        c = getattr(app._core, "averaging_constant", 1.0)
        symmetric = _is_symmetric(app.qscheme)
        if not (-_EXACT_F32 <= qmin < qmax <= _EXACT_F32 and _TINY_F32 <= eps <= _MAX_F32
                and 0.0 <= c <= 1.0) or \
                (symmetric and app._symmetric_zero_point() != Q.symmetric_zero_point(qmin, qmax)):
            return None
        core = self.__dict__.get("_fused")
        if core is None or core.observer is not app._core or core.eps != eps or \
                core.symmetric != symmetric or (core.quant_min, core.quant_max) != (qmin, qmax):
            core = _CoreFakeQuantize(app._core, qmin, qmax, symmetric=symmetric, eps=eps)
            core._mode = _MODE_PER_TENSOR  # torch's per-tensor kernel: NaN -> quant_min
            # (private to this module: its switches stay as set here)
            core.training = core.observer_enabled = core.fake_quant_enabled = True
            core.packed_mask = False
            self._fused = core
        return core

    def _forward_fused(self, X):
        """Observe, qparams and fake quant of a contiguous float32 ``X`` in the
        core FakeQuantize's fused kernel: the same numbers as the three steps
        while the statistics and the scale stay finite.  Otherwise (a NaN /
        inf batch, or min > max, which torch refuses) the observer's state is
        put back and None returned: the general path then computes (or
        raises) as torch."""
        if not (type(X) is np.ndarray and X.dtype == F32 and X.size and
                X.flags.c_contiguous and type(self.scale) is np.ndarray and
                type(self.zero_point) is np.ndarray):
            return None  # (scale / zero_point on the device: a cupy X came before)
        app = self.activation_post_process
        core = self._fused_core(app)
        if core is None:
            return None
        obs = app._core
        app._sync_first()
        kept = (obs.min_val[()], obs.max_val[()], obs.num_batches)  # (exact bits)
        # (X is checked: the core's kernel step itself where it can take it)
        y = core._forward_fused(X, None) if core._fused_ready() else None
        if y is None:
            y = core.forward(X)
        scale = core.scale
        if not (-_MAX_F32 <= float(obs.min_val) <= float(obs.max_val) <= _MAX_F32 and
                _TINY_F32 <= float(scale[0]) <= _MAX_F32):
            obs._store(kept[0], kept[1])
            obs.num_batches = kept[2]
            return None
        # (finite, in range: the casts need no errstate)
        s_buf, z_buf = self.scale, self.zero_point
        if s_buf.shape == (1,) and z_buf.shape == (1,) and s_buf.flags.writeable and \
                z_buf.flags.writeable:  # torch's [1] buffers, written in place
            s_buf[0] = scale[0]
            z_buf[0] = core.zero_point[0]
        else:
            store_into(self, "scale", scale, F32)
            store_into(self, "zero_point", core.zero_point, z_buf.dtype)
        self._last_shape = X.shape
        self._last_mask = core.mask.view(np.bool_)
        return y

    def _save(self, dest, prefix):
        for name in ("fake_quant_enabled", "observer_enabled", "scale", "zero_point"):
            dest[prefix + name] = getattr(self, name)  # shared, as in torch
        self.activation_post_process._save(dest, prefix + "activation_post_process.")

    def _metadata(self, dest, prefix):
        super()._metadata(dest, prefix)
        self.activation_post_process._metadata(dest, prefix + "activation_post_process.")

    def _prepare(self, state, prefix, metadata):
        self.activation_post_process._prepare(state, prefix + "activation_post_process.",
                                              metadata)

    def _state_keys(self, prefix=""):
        return ([prefix + k for k in ("fake_quant_enabled", "observer_enabled", "scale",
                                      "zero_point")]
                + self.activation_post_process._state_keys(prefix + "activation_post_process."))

    def _load(self, state, prefix):
        for name in ("fake_quant_enabled", "observer_enabled"):
            if prefix + name in state:
                _load_into(self, name, state[prefix + name])
        # torch resizes scale / zero_point to the checkpoint's shape, then copies
        for name in ("scale", "zero_point"):
            if prefix + name in state:
                val = _as_state_array(state[prefix + name], name, self)
                _load_into(self, name, val, shape=val.shape)
        self.activation_post_process._load(state, prefix + "activation_post_process.")

    def extra_repr(self):
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
                f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}")

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class FixedQParamsFakeQuantize(FakeQuantize):
    """``torch.ao.quantization.FixedQParamsFakeQuantize``: shares the
    FixedQParamsObserver's scale / zero_point arrays."""

    def __init__(self, observer):
        super().__init__(observer=observer)
        if type(self.activation_post_process) is not FixedQParamsObserver:
            raise AssertionValueError(f"{type(self).__name__}'s observer must be a "
                                      "FixedQParamsObserver")
        self._observer_ctr = observer
        self.scale = self.activation_post_process.scale
        self.zero_point = self.activation_post_process.zero_point
        if not _is_per_tensor(self.qscheme):
            raise AssertionValueError(
                "Only per tensor quantization is supported FixedQParamsFakeQuantize "
                f"module, got qscheme:torch.{self.qscheme}")

    def calculate_qparams(self):
        return self.scale, self.zero_point

    def _load(self, state, prefix):
        for name in ("fake_quant_enabled", "observer_enabled", "scale", "zero_point"):
            if prefix + name in state:
                A.copy_into(getattr(self, name),
                            _copy_into(self, name, state[prefix + name],
                                       dtype=getattr(self, name).dtype))
        self.activation_post_process._load(state, prefix + "activation_post_process.")


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """``torch.ao.quantization.FusedMovingAvgObsFakeQuantize``: one call of
    :func:`fused_moving_avg_obs_fake_quant` per forward; int64 enable flags."""

    _FLAG_DTYPE = np.int64

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                 **observer_kwargs):
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)
        if not isinstance(self.activation_post_process,
                          (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)):
            raise AssertionValueError("Fused observer+fake_quant module only works with "
                                      "MovingAverageMinMaxObserver")
        self._init_flags()
        self.is_symmetric_quant = _is_symmetric(self.activation_post_process.qscheme)

    def forward(self, X):
        """One fused call (a cupy X on the device: see
        :func:`fused_moving_avg_obs_fake_quant`; the running values and
        qparams become device arrays)."""
        app = self.activation_post_process
        res = _fused(X, int(self.observer_enabled[0]), int(self.fake_quant_enabled[0]),
                     app.min_val, app.max_val, self.scale, self.zero_point,
                     app.averaging_constant, app.quant_min, app.quant_max, self.ch_axis,
                     self.is_per_channel, self.is_symmetric_quant)
        out, mask, rmin, rmax, scale, zp = res
        # torch writes the buffers in place (resized per channel on the first call)
        app._core._store(rmin, rmax)
        self._store_qparams(scale, zp)
        self._last_shape = A.shape_of(X)
        self._last_mask = mask
        return out


#: observers whose per-tensor update the core's fused kernel runs
_FUSED_OBSERVERS = (MinMaxObserver, MovingAverageMinMaxObserver)
_EXACT_F32 = 2 ** 24
_TINY_F32 = float(np.finfo(F32).tiny)
_MAX_F32 = float(np.finfo(F32).max)


def _flag_call(attr, enabled):
    def apply(mod):
        if isinstance(mod, _FakeQuantizeBase):
            getattr(mod, attr)(enabled)
    return apply


def enable_fake_quant(mod):
    """``torch.ao.quantization.enable_fake_quant`` for one module."""
    _flag_call("enable_fake_quant", True)(mod)


def disable_fake_quant(mod):
    _flag_call("enable_fake_quant", False)(mod)


def enable_observer(mod):
    _flag_call("enable_observer", True)(mod)


def disable_observer(mod):
    _flag_call("enable_observer", False)(mod)

