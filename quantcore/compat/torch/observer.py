"""The observers of ``torch.ao.quantization.observer``."""

import operator

import numpy as np

from ... import _arrays as A
from ... import observers as _obs
from ... import qparams as Q
from ..._warn import warn
from ...observers import store_into
from .._errors import AssertionValueError, RuntimeValueError
from ._common import (
    _DEFAULT_EPS,
    _IINFO,
    _IINFO_MSG,
    _NO_DATA_WARNING,
    _PER_CHANNEL_ONLY,
    _PER_TENSOR_ONLY,
    _REDUCE_RANGE_WARNING,
    _as_input,
    _as_state_array,
    _copy_into,
    _dtype,
    _is_per_channel,
    _is_per_tensor,
    _is_symmetric,
    _load_into,
    _Module,
    _name,
    _qrange,
    _qscheme,
    _version,
)
from .functional import _torch_dtype_name

F32 = np.float32


def _held_array(path, shape=None, sync_first=False):
    """A property for the float32 array at ``path`` (``"_core.min_val"``: the
    attribute of an object the module holds).  Reading returns that array
    itself; assigning binds a new host copy (reshaped to ``shape`` if given),
    as assigning a torch buffer does, then, with ``sync_first``, calls the
    module's ``_sync_first``."""
    holder, name = path.split(".")
    get_holder = operator.attrgetter(holder)

    def set_array(self, value):
        arr = np.array(A.to_host(value), dtype=F32)
        setattr(get_holder(self), name, arr if shape is None else arr.reshape(shape))
        if sync_first:
            self._sync_first()
    return property(operator.attrgetter(path), set_array)


class _UniformObserver(_Module):
    """UniformQuantizationObserverBase: dtype, qscheme, range, eps."""

    _BUFFERS = ("eps", "min_val", "max_val")

    def __init__(self, dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic):
        self.dtype = _dtype(dtype)
        self.is_dynamic = bool(is_dynamic)
        if reduce_range:
            warn(_REDUCE_RANGE_WARNING, UserWarning)
        self.reduce_range = bool(reduce_range)
        self.eps = np.array([eps], dtype=F32)
        (self.quant_min, self.quant_max), self.has_customized_qrange = _qrange(
            self.dtype, reduce_range, quant_min, quant_max)

    def _check_symmetric_reduce(self, msg):
        if _is_symmetric(self.qscheme) and self.reduce_range and self.dtype == "quint8":
            raise NotImplementedError(msg)

    # statistics live in a quantcore observer; min_val / max_val are its arrays
    # (device arrays after cupy batches: the core observes those on the device);
    # assigning one also resets the first-call count (a device forward does not
    # look at the values itself)
    min_val = _held_array("_core.min_val", sync_first=True)
    max_val = _held_array("_core.max_val", sync_first=True)

    _VERSION = 3

    def _prepare(self, state, prefix, metadata):
        if _version(metadata, prefix) in (None, 1):
            # "eps was moved to a buffer in version 2": reset to the default
            state[prefix + "eps"] = np.array([_DEFAULT_EPS], dtype=F32)

    def _calculate_qparams(self, min_val, max_val):
        """torch's ``_calculate_qparams`` through :mod:`quantcore.qparams`
        (device statistics give device qparams; the validity check reads a
        byte, as torch's does)."""
        xp = A.array_module(min_val) if A.is_cupy_array(min_val) else np
        mn = xp.asarray(A.to_host(min_val) if xp is np else min_val, dtype=F32)
        mx = xp.asarray(max_val if xp is not np else A.to_host(max_val), dtype=F32)
        if not _check_min_max_valid(mn, mx):
            return xp.array([1.0], dtype=F32), xp.array([0], dtype=np.int64)
        qmin, qmax, eps = self.quant_min, self.quant_max, float(self.eps[0])
        if _is_symmetric(self.qscheme):
            return Q.symmetric_qparams(mn, mx, qmin, qmax, eps,
                                       zero_point=self._symmetric_zero_point())
        if self.qscheme == "per_channel_affine_float_qparams":
            return Q.float_qparams(mn, mx, qmin, qmax, eps)
        scale, zp = Q.affine_qparams(mn, mx, qmin, qmax, eps)
        return scale, zp.astype(np.int32)

    def _symmetric_zero_point(self):
        """torch's zero point of the symmetric qschemes."""
        if self.dtype in ("quint8", "uint8"):
            return (self.quant_min + self.quant_max) // 2 if self.has_customized_qrange else 128
        return 2 ** 15 if self.dtype == "uint16" else 0

    def calculate_qparams(self):
        """``(scale, zero_point)`` from the running statistics."""
        return self._calculate_qparams(self.min_val, self.max_val)

    def forward(self, x_orig):
        """Record x (per tensor, or per channel along ``ch_axis``) and return
        it.  A cupy x is observed on the device with no synchronisation: the
        core applies the first-call rule there (per tensor from the values,
        per channel from its count, which reset, load and the min_val /
        max_val setters keep right); a numpy x first sets the core's count by
        the same rule (:meth:`_sync_first`)."""
        x = _as_input(x_orig, f"{type(self).__name__}.forward")
        if x.size == 0:
            return x_orig
        self._prepare_input(x)
        if not A.is_cupy_array(x):
            self._sync_first()
        self._core.update(x)
        return x_orig

    def _prepare_input(self, x):
        """Checks on a non-empty x before it is observed (none per tensor)."""

    def _load(self, state, prefix):
        if prefix + "eps" in state:
            _load_into(self, "eps", state[prefix + "eps"])
        for name in ("min_val", "max_val"):
            if prefix + name in state:
                # per channel torch resizes the buffer to the checkpoint's shape
                shape = None if self._per_tensor else A.shape_of(state[prefix + name])
                _load_into(self, name, state[prefix + name], shape=shape, target=self._core)
        self._sync_first()

    def _sync_first(self):
        """Tell the core observer whether the next batch is a first call."""
        self._core.num_batches = 0 if self._is_first() else max(self._core.num_batches, 1)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


def _check_min_max_valid(mn, mx):
    """torch.ao.quantization.utils.check_min_max_valid."""
    if mn.size == 0 or mx.size == 0:
        warn(_NO_DATA_WARNING, UserWarning)
        return False
    if mn.ndim == 0 or mx.ndim == 0:
        if bool(mn == np.inf) and bool(mx == -np.inf):
            warn(_NO_DATA_WARNING, UserWarning)
            return False
        if bool(A.compare_exact(mn, ">", mx)):
            raise AssertionValueError(f"min {mn} should be less than max {mx}")
    elif bool(A.compare_exact(mn, ">", mx).any()):
        raise AssertionValueError(f"min {mn} should be less than max {mx}")
    return True


def _checked_qscheme(qscheme, cls_name, per_channel, is_dynamic=False):
    """torch's constructor checks of an observer: the qscheme's name, its
    granularity (per channel or per tensor), then, for the observers that
    refuse it, dynamic quantization.  Returns the qscheme's name."""
    name = _qscheme(qscheme)
    if per_channel and not _is_per_channel(name):
        raise NotImplementedError(_PER_CHANNEL_ONLY.format(cls_name))
    if not per_channel and not _is_per_tensor(name):
        raise NotImplementedError(_PER_TENSOR_ONLY.format(cls_name))
    if is_dynamic:
        raise NotImplementedError(f"{cls_name} doesn't support dynamic quantization")
    return name


def _per_tensor_core(core):
    """A per-tensor core observer with torch's first-call rule on the device:
    a call is the first where the state is (+inf, -inf) (the host path sets
    the core's count by the same rule, _sync_first)."""
    core._obs_flags = ("first_if_empty",)
    return core


class MinMaxObserver(_UniformObserver):
    """``torch.ao.quantization.MinMaxObserver``: running min / max per tensor."""

    _per_tensor = True

    def __init__(self, dtype="quint8", qscheme="per_tensor_affine", reduce_range=False,
                 quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False):
        self.qscheme = qscheme = _checked_qscheme(qscheme, "MinMaxObserver", per_channel=False)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic)
        self._core = self._make_core()
        self._check_symmetric_reduce("Cannot reduce range for symmetric" + " " * 40
                                     + "quantization for quint8")

    def _make_core(self):
        return _per_tensor_core(_obs.MinMaxObserver(axis=None, nan_policy="propagate"))

    def _is_first(self):
        lo, hi = self.min_val, self.max_val
        if lo.shape == () and hi.shape == ():  # (float() of 0-d arrays: cheaper)
            return float(lo) == np.inf and float(hi) == -np.inf
        return bool(lo == np.inf and hi == -np.inf)

    def reset_min_max_vals(self):
        """Back to ``min_val = +inf``, ``max_val = -inf``."""
        self._core.reset()


class MovingAverageMinMaxObserver(MinMaxObserver):
    """``torch.ao.quantization.MovingAverageMinMaxObserver``::

        first call (min_val == +inf and max_val == -inf): min/max of x
        later: m = f32(m + f32(f32(c) * f32(cur - m)))
    """

    def __init__(self, averaging_constant=0.01, dtype="quint8", qscheme="per_tensor_affine",
                 reduce_range=False, quant_min=None, quant_max=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False, *,
                 factory_kwargs=None):
        qscheme_name = _qscheme(qscheme)
        if not _is_per_tensor(qscheme_name):
            raise NotImplementedError(
                "MovingAverageMinMaxObserver's qscheme only support" + " " * 17
                + "torch.per_tensor_symmetric and torch.per_tensor_affine." + " " * 17
                + f"but got: torch.{qscheme_name}")
        self.averaging_constant = averaging_constant
        if is_dynamic and averaging_constant != 1:
            raise NotImplementedError(
                "MovingAverageMinMaxObserver doesn't support dynamic quantization for "
                f"averaging constant of {averaging_constant}")
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, None, eps,
                         is_dynamic)

    def _make_core(self):
        core = _obs.MovingAverageMinMaxObserver(0.5, axis=None, nan_policy="propagate")
        # torch does not range-check the constant: set it after construction
        core.averaging_constant = float(self.averaging_constant)
        return _per_tensor_core(core)


class PerChannelMinMaxObserver(_UniformObserver):
    """``torch.ao.quantization.PerChannelMinMaxObserver``: running min / max
    per channel along ``ch_axis`` (x needs ndim >= 2)."""

    _per_tensor = False

    def __init__(self, ch_axis=0, dtype="quint8", qscheme="per_channel_affine",
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False):
        self.qscheme = qscheme = _checked_qscheme(qscheme, "PerChannelMinMaxObserver",
                                                  per_channel=True, is_dynamic=is_dynamic)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic)
        self.ch_axis = A.as_int(ch_axis, "ch_axis", type(self).__name__)
        self._core = self._make_core()
        self._check_symmetric_reduce("Cannot reduce range for symmetric quantization for "
                                     "quint8")

    def _make_core(self):
        return _obs.MinMaxObserver(axis=0, nan_policy="propagate")

    def forward(self, x_orig):
        """Record x per channel along ``ch_axis`` and return it.  The first
        batch grows the empty ``min_val`` / ``max_val`` buffers in place, as
        torch's ``resize_`` + ``copy_`` does: a reference taken before the
        forward (a state dict, a list of buffers) sees the statistics.  On
        numpy the empty arrays are resized (``ndarray.resize``: no view of an
        empty array can read data, so the reallocation is safe); a cupy batch
        moves the statistics to the device, in new arrays."""
        before = (self._core.min_val, self._core.max_val)
        out = super().forward(x_orig)
        for name, old in zip(("min_val", "max_val"), before):
            new = getattr(self._core, name)
            if new is not old and type(old) is np.ndarray and type(new) is np.ndarray and \
                    old.size == 0 and old.flags.owndata and old.flags.writeable and \
                    old.dtype == new.dtype:
                old.resize(new.shape, refcheck=False)
                old[...] = new
                setattr(self._core, name, old)
        return out

    def _is_first(self):
        return self.min_val.size == 0 or self.max_val.size == 0

    def _prepare_input(self, x):
        """torch's channel-axis checks; the core reduces along ``ch_axis``."""
        if not -x.ndim <= self.ch_axis < x.ndim:
            raise IndexError("list assignment index out of range")
        if x.ndim < 2:
            raise IndexError("Dimension out of range (expected to be in range of [-1, 0], "
                             "but got 1)")
        self._core.axis = self.ch_axis

    def reset_min_max_vals(self):
        """Back to empty ``min_val`` / ``max_val``."""
        self._core.reset()


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """``torch.ao.quantization.MovingAveragePerChannelMinMaxObserver``."""

    def __init__(self, averaging_constant=0.01, ch_axis=0, dtype="quint8",
                 qscheme="per_channel_affine", reduce_range=False, quant_min=None,
                 quant_max=None, eps=float(np.finfo(np.float32).eps), is_dynamic=False, *,
                 factory_kwargs=None):
        _checked_qscheme(qscheme, "MovingAveragePerChannelMinMaxObserver", per_channel=True,
                         is_dynamic=is_dynamic)
        self.averaging_constant = averaging_constant
        super().__init__(ch_axis, dtype, qscheme, reduce_range, quant_min, quant_max, None,
                         eps, is_dynamic)

    def _make_core(self):
        core = _obs.MovingAverageMinMaxObserver(0.5, axis=0, nan_policy="propagate")
        core.averaging_constant = float(self.averaging_constant)
        return core


class HistogramObserver(_UniformObserver):
    """``torch.ao.quantization.HistogramObserver`` on
    :class:`quantcore.calib.TorchHistogram` (histogram + greedy L2 search),
    then the MinMax qparams of the searched range."""

    _per_tensor = True
    _BUFFERS = ("eps", "histogram", "min_val", "max_val")

    def __init__(self, bins=2048, dtype="quint8", qscheme="per_tensor_affine",
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False):
        self.qscheme = qscheme = _checked_qscheme(qscheme, "HistogramObserver",
                                                  per_channel=False, is_dynamic=is_dynamic)
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic)
        try:
            from ...calib import TorchHistogram
        except ImportError as exc:  # pragma: no cover - calib is part of the package
            raise NotImplementedError("HistogramObserver needs quantcore.calib.TorchHistogram, "
                                      "which is not available in this build") from exc
        self.bins = bins
        if self.dtype not in _IINFO:
            raise TypeError(_IINFO_MSG)
        self.dst_nbins = 2 ** _IINFO[self.dtype][2]
        self.upsample_rate = 16
        self._hist = TorchHistogram(bins=bins, upsample_rate=self.upsample_rate)

    # the TorchHistogram's own arrays (updated in place)
    histogram = _held_array("_hist.histogram")
    min_val = _held_array("_hist.min_val", shape=())
    max_val = _held_array("_hist.max_val", shape=())

    def forward(self, x_orig):
        """Add x to the histogram and return it (float32 statistics: torch bins
        float64 / float16 input in that precision, not reproduced).  A cupy
        x is binned on the device; its min / max and the bins' counts cross
        to the host (torch's ``.item()`` calls synchronise there too)."""
        if (isinstance(x_orig, (np.ndarray, np.generic)) or A.is_cupy_array(x_orig)) and \
                x_orig.dtype.kind in "biu" and x_orig.size:
            # torch.histc has no integer kernel
            raise NotImplementedError('"histogram_cpu" not implemented for '
                                      f"'{_torch_dtype_name(x_orig.dtype)}'")
        x = _as_input(x_orig, "HistogramObserver.forward")
        if x.size == 0:
            return x_orig
        try:
            self._hist.collect(x.astype(F32, copy=False))
        except ValueError as exc:  # NaN input: torch.histc's RuntimeError
            raise RuntimeValueError(str(exc)) from exc
        return x_orig

    def calculate_qparams(self):
        """Greedy L2 range search, then the MinMax qparams of that range."""
        if self.min_val == np.inf and self.max_val == -np.inf:
            warn("must run observer before calling calculate_qparams."
                 "                                    Returning default scale and "
                 "zero point ", UserWarning)
            return np.array([1.0], dtype=F32), np.array([0], dtype=np.int64)
        if self.bins != len(self.histogram):
            raise AssertionValueError(
                "The number of bins in histogram should be equal to the number "
                "of bins supplied while making this observer")
        new_min, new_max = self._hist.non_linear_param_search(self.dst_nbins)
        return self._calculate_qparams(np.asarray(new_min, F32), np.asarray(new_max, F32))

    def reset_min_max_vals(self):
        raise NotImplementedError("Cannot reset min/max values in the given observer.")

    def _prepare(self, state, prefix, metadata):
        super()._prepare(state, prefix, metadata)
        version = _version(metadata, prefix)
        if version is None or version < 3:
            # uninitialized [0]-shaped min / max of version-2 checkpoints
            for name, v in (("min_val", np.inf), ("max_val", -np.inf)):
                if prefix + name in state and A.shape_of(state[prefix + name]) == (0,):
                    state[prefix + name] = np.array(v, dtype=F32)

    def _load(self, state, prefix):
        if prefix + "eps" in state:
            _load_into(self, "eps", state[prefix + "eps"])
        # (the histogram state lives on the host: device values are read)
        if prefix + "histogram" in state:
            store_into(self._hist, "histogram", A.to_host(
                _as_state_array(state[prefix + "histogram"], "histogram", self)), F32)
        for name in ("min_val", "max_val"):
            if prefix + name in state:
                # torch binds the state dict's tensors here (setattr): references
                # to the old min_val / max_val are not updated; a copy is bound
                # (torch's shares the source module's storage, see the docstring)
                value = A.to_host(_as_state_array(state[prefix + name], name, self))
                setattr(self._hist, name, np.array(value, dtype=F32).reshape(()))


class FixedQParamsObserver(_Module):
    """``torch.ao.quantization.FixedQParamsObserver``: fixed ``scale``
    (float32[1]) and ``zero_point`` (int32[1]); forward is the identity."""

    _BUFFERS = ("scale", "zero_point")
    _VERSION = 1  # an ObserverBase, not a UniformQuantizationObserverBase (3)

    def __init__(self, scale, zero_point, dtype="quint8", qscheme="per_tensor_affine",
                 quant_min=0, quant_max=255, is_dynamic=False):
        if is_dynamic:
            raise NotImplementedError("FixedQParamsObserver doesn't support dynamic "
                                      "quantization")
        self.is_dynamic = False
        self.quant_min = quant_min
        self.quant_max = quant_max
        with np.errstate(over="ignore"):
            self.scale = np.array([scale], dtype=F32)
        zp = np.asarray(zero_point).reshape(())
        if zp.dtype.kind == "f" and not (-2.0 ** 31 <= zp <= 2.0 ** 31 - 1) or \
                zp.dtype.kind in "iu" and not -2 ** 31 <= int(zp) <= 2 ** 31 - 1:
            raise RuntimeValueError("value cannot be converted to type int32 without overflow")
        self.zero_point = np.array([zero_point], dtype=np.float64).astype(np.int32) \
            if zp.dtype.kind == "f" else np.array([int(zp)], dtype=np.int32)
        self.dtype = _name(dtype, "dtype")
        self.qscheme = _name(qscheme, "qscheme")

    def forward(self, X):
        return X

    def calculate_qparams(self):
        return self.scale, self.zero_point

    def _load(self, state, prefix):
        # in place: a FixedQParamsFakeQuantize shares these arrays
        for b in self._BUFFERS:
            if prefix + b in state:
                new = _copy_into(self, b, state[prefix + b], dtype=getattr(self, b).dtype)
                A.copy_into(getattr(self, b), new)

