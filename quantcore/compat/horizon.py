"""Horizon ``horizon_plugin_pytorch.quantization`` FakeQuantize on NumPy arrays.

``FakeQuantize``, its moving-average observers and the global
``QuantRoundMode`` with Horizon's names, arguments, defaults and attributes
(the project's NVIDIA / Horizon specification section 6).  This layer only translates arguments:
statistics come from :class:`quantcore.observers.MovingAverageMinMaxObserver`
(Horizon's in-place EMA), scales from
:func:`quantcore.qparams.symmetric_qparams`, every element goes through the
shared affine kernel (:func:`quantcore.ops._affine`, division by the scale,
zero point 0) or, for ``fast_training``, the fused observe + fake-quant
kernel of :class:`quantcore.FakeQuantize`; the backward is
:func:`quantcore.ops.ste_backward`.

>>> import numpy as np
>>> from quantcore.compat.horizon import FakeQuantize
>>> fq = FakeQuantize()                                    # qint8, per tensor
>>> y = fq(np.array([-1.0, 0.5, 2.0], dtype=np.float32))
>>> fq.scale                                               # 2 / 127.5
array([0.01568628], dtype=float32)

Decisions (the specification's decisions, "Horizon")
----------------------------------------
- Rounding: the seed page's ``floor(x / scale + 0.5)`` is the default
  (``QuantRoundMode`` ``"bpu_round"``); ``QuantRoundMode.set("half_to_even")``
  selects ``rint``.  Horizon's own default is half_to_even; the J5 seed page
  documents bpu_round.  The mode is read at every forward.
  ``out = clamp(round(x / scale), qmin, qmax) * scale`` (a division, zero
  point always 0), run by the core's affine kernel with no zero point at
  all, so signed zeros are Horizon's too (``-0.0`` stays ``-0.0``, and
  ``-0.0078125`` at scale ``0.015625`` gives ``-0.0`` with half_to_even).
- Observer scale ``max(-min, max, 0) / ((qmax - qmin) / 2)`` clamped at
  float32 eps (divisor 127.5 for qint8); EMA ``m += c * (batch - m)`` in
  float32, the first batch taken as is.
- ``saturate`` (None means True, Horizon's global default): the gradient is
  zero where the rounded ``x / scale`` falls outside ``[qmin, qmax]``;
  ``saturate=False`` is a pure straight-through estimator.  ``compat_mask``:
  the saved mask is bit-packed (``numpy.packbits(mask.ravel(),
  bitorder="little")``).  ``fast_training``: observe, scale and fake quant
  in one fused call, with numbers identical to the general path.
- ``set_qparams`` accepts a scalar, a list or an array (Horizon's list bug is
  not reproduced).

Further behaviour choices
-------------------------
- dtypes are strings: ``"qint8"`` [-128, 127], ``"qint16"``, ``"qint4"``
  [-8, 7], ``"quint4"`` [0, 15], ``"qint32"``; ``"torch.qint8"`` maps to
  qint8 and a ``"horizon."`` prefix is accepted; other torch dtypes and
  unknown names raise ValueError (Horizon asserts).  qschemes
  ``"per_tensor_symmetric"`` / ``"per_channel_symmetric"`` (``"torch."``
  prefix accepted); any other raises ValueError.
- A custom range is used when both ``quant_min`` and ``quant_max`` are given
  (as torch); it must satisfy ``qmin < qmax``, ``qmin <= 0 <= qmax`` and lie
  in the dtype's range, else ValueError (Horizon asserts).
- ``calculate_qparams()`` returns ``(scale float32[C], zero_point
  int64[C])``; the zero point is zeros (Horizon returns None once data was
  seen; API.md asks for arrays).  Before any data: ``([1.0], [0])``.
- Observers keep NaN (``nan_policy="propagate"``, keyword-only, as the
  framework); ``"skip"`` / ``"raise"`` are the core's alternatives.
  ``averaging_constant`` must be in (0, 1] (the core observer's check).
  ``is_sync_quantize`` (DDP all-reduce) and ``factory_kwargs`` are accepted
  and have no effect.
- Power-of-two scales apply when the global march is ``"bernoulli"``
  (:func:`set_march`); the default march (None) gives plain float scales.
  Other BERNOULLI behaviours (J5 "floor" rounding) are not reproduced.
- FakeQuantize: the fast path runs for float32 input in training with
  observer and fake quant on, ``fast_training``, not ``in_place``, the
  per-tensor :class:`MovingAverageMinMaxObserver`, a signed range and march
  not bernoulli (as Horizon's conditions); otherwise the general path.  In
  eval mode the same kernel quantizes (Horizon's ``scale_quanti_opt``); the
  mask is kept in both modes.  ``in_place=True`` writes the result into
  ``x`` when ``x`` is a writable float array.  ``forward`` returns an
  array (Horizon a QTensor).  Per channel: the observer's scale (C values)
  replaces the ``channel_len`` buffer; a 1-element scale is broadcast, any
  other mismatch with ``x.shape[ch_axis]`` raises ValueError.  ``mask`` is
  None when the last forward did not quantize or ``saturate`` is False;
  unpacked masks are bool arrays.  ``backward(grad)`` needs grad of the last
  forward's shape.
- ``set_qparams``: a Python / 0-d scalar fills every channel; arrays and
  lists must have the buffer's shape, else ValueError
  ``"mismatched shape when set scale ..., please check channel_len"``.  The
  zero point is stored but, as in Horizon, never used by the fake quant.
"""

import functools

import numpy as np

from .. import _arrays as A
from .. import observers as _obs
from .. import qparams as Q
from .._switches import Switches
from .._locks import Locked, locked
from ..fake_quantize import FakeQuantize as _CoreFakeQuantize
from ..ops import _affine, affine_mode, ste_backward
from ._partial import _with_args

__all__ = [
    "QuantRoundMode", "set_march", "get_march",
    "MovingAverageMinMaxObserver", "MovingAveragePerChannelMinMaxObserver", "FakeQuantize",
    "default_8bit_fake_quant", "per_channel_8bit_fake_quant",
    "default_weight_8bit_fake_quant", "default_16bit_fake_quant",
]

F32 = np.float32

#: Horizon's qinfo: dtype name -> (min, max)
QINFO = {"qint8": (-128, 127), "qint16": (-32768, 32767), "qint4": (-8, 7),
         "quint4": (0, 15), "qint32": (-2 ** 31, 2 ** 31 - 1)}


# ----------------------------------------------------------- global modes
class QuantRoundMode:
    """The global rounding of Horizon's fake quant.

    ``"bpu_round"`` (default here, the seed page's formula):
    ``floor(x / scale + 0.5)``; ``"half_to_even"``: ``rint(x / scale)``.
    """

    BPU_ROUND = "bpu_round"
    HALF_TO_EVEN = "half_to_even"
    _mode = BPU_ROUND
    _CORE = {BPU_ROUND: "half_up", HALF_TO_EVEN: "half_even"}

    @classmethod
    def set(cls, mode):
        """Select the global rounding mode."""
        if mode not in cls._CORE:
            raise ValueError(f"QuantRoundMode.set: mode must be 'bpu_round' or 'half_to_even', "
                             f"got {mode!r}")
        cls._mode = mode

    @classmethod
    def get(cls):
        """The current mode name."""
        return cls._mode

    @classmethod
    def rounding(cls):
        """The current mode as a quantcore rounding name."""
        return cls._CORE[cls._mode]


_MARCH = [None]


def set_march(march):
    """Set the global march (a name such as ``"bayes"`` or ``"bernoulli"``,
    case-insensitive, or None).  Only ``"bernoulli"`` changes the numbers:
    observer scales become powers of two."""
    if march is not None and not isinstance(march, str):
        raise TypeError(f"set_march: march must be a string or None, got {march!r}")
    _MARCH[0] = None if march is None else march.lower()


def get_march():
    """The global march set by :func:`set_march` (None by default)."""
    return _MARCH[0]


# -------------------------------------------------------------- helpers
def _dtype_name(dtype, func):
    if not isinstance(dtype, str):
        raise TypeError(f"{func}: dtype must be a string such as 'qint8', got {dtype!r}")
    name = dtype
    if name.startswith("torch."):
        if name != "torch.qint8":
            raise ValueError(f"{func}: unsupported dtype {dtype!r}; of the torch dtypes only "
                             "torch.qint8 is accepted")
        return "qint8"
    if name.startswith("horizon."):
        name = name[len("horizon."):]
    if name not in QINFO:
        raise ValueError(f"{func}: unsupported dtype {dtype!r}; expected one of "
                         f"{sorted(QINFO)}")
    return name


def _qscheme_name(qscheme, allowed, func):
    if not isinstance(qscheme, str):
        raise TypeError(f"{func}: qscheme must be a string, got {qscheme!r}")
    name = qscheme[len("torch."):] if qscheme.startswith("torch.") else qscheme
    if name != allowed:
        raise ValueError(f"{func}: only {allowed} is supported, got {qscheme!r}")
    return name


def _range(dtype, quant_min, quant_max, func):
    lo, hi = QINFO[dtype]
    if quant_min is None or quant_max is None:
        return lo, hi
    qmin = A.as_int(quant_min, "quant_min", func)
    qmax = A.as_int(quant_max, "quant_max", func)
    if not qmin <= 0 <= qmax:
        raise ValueError(f"{func}: Used-specified quantization range must include 0, got "
                         f"[{qmin}, {qmax}]")
    if not qmin < qmax:
        raise ValueError(f"{func}: qmin must be strictly less than qmax for user-specified "
                         f"quantization range, got [{qmin}, {qmax}]")
    if qmin < lo or qmax > hi:
        raise ValueError(f"{func}: user-specified quantization range [{qmin}, {qmax}] must lie "
                         f"within the range of {dtype}, [{lo}, {hi}]")
    return qmin, qmax


# ------------------------------------------------------------ observers
class MovingAverageMinMaxObserver(Locked):
    """Horizon's per-tensor moving-average observer (v1)::

        first batch:  min, max = aminmax(x)
        later:        min += c * (batch_min - min);  max += c * (batch_max - max)
        scale = max(max(-min, max, 0) / ((qmax - qmin) / 2), eps)   (float32)

    ``obs(x)`` records ``x`` (an empty batch is skipped) and returns it.
    Under the ``"bernoulli"`` march the scale is
    :func:`quantcore.qparams.horizon_pow2_scale` of it.
    """

    _per_channel = False
    _QSCHEME = "per_tensor_symmetric"

    def __init__(self, averaging_constant=0.01, dtype="qint8", qscheme="per_tensor_symmetric",
                 quant_min=None, quant_max=None, is_sync_quantize=False, factory_kwargs=None, *,
                 nan_policy="propagate"):
        self._setup(averaging_constant, None, dtype, qscheme, quant_min, quant_max,
                    is_sync_quantize, factory_kwargs, nan_policy)

    def _setup(self, averaging_constant, ch_axis, dtype, qscheme, quant_min, quant_max,
               is_sync_quantize, factory_kwargs, nan_policy):
        func = type(self).__name__
        self.dtype = _dtype_name(dtype, func)
        self.qscheme = _qscheme_name(qscheme, self._QSCHEME, func)
        self.quant_min, self.quant_max = _range(self.dtype, quant_min, quant_max, func)
        self.is_sync_quantize = bool(is_sync_quantize)
        self.factory_kwargs = factory_kwargs
        self.eps = Q.F32_EPS
        self._core = _obs.MovingAverageMinMaxObserver(averaging_constant, axis=ch_axis,
                                                      nan_policy=nan_policy)
        self.averaging_constant = self._core.averaging_constant

    min_val = property(lambda self: self._core.min_val, doc="Running minimum (float32).")
    max_val = property(lambda self: self._core.max_val, doc="Running maximum (float32).")

    @locked
    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        """Record ``x`` and return it unchanged (a cupy x on the device, no
        synchronisation: the statistics become device arrays)."""
        self._core.update(x)
        return x

    def calculate_qparams(self):
        """``(scale float32[C], zero_point int64[C])``; ``([1.0], [0])``
        before any data.  Device statistics give device qparams (the batch
        count is read, 16 bytes; the bernoulli march's power-of-two scale
        is formed on the host from the C scales)."""
        if self._core.num_batches == 0:
            return np.ones(1, F32), np.zeros(1, np.int64)
        scale, zp = Q.symmetric_qparams(self._core.min_val, self._core.max_val, self.quant_min,
                                        self.quant_max, self.eps, zero_point=0)
        if _MARCH[0] == "bernoulli":
            scale = Q.horizon_pow2_scale(scale)
        return scale, zp

    def reset_min_max_vals(self):
        """Forget the statistics."""
        self._core.reset()

    with_args = classmethod(_with_args)

    def __repr__(self):
        return (f"{type(self).__name__}(dtype={self.dtype}, qscheme={self.qscheme}, "
                f"quant_min={self.quant_min}, quant_max={self.quant_max}, "
                f"min_val={self.min_val}, max_val={self.max_val})")


class MovingAveragePerChannelMinMaxObserver(MovingAverageMinMaxObserver):
    """The per-channel twin: statistics per index of ``ch_axis``, the same
    EMA and scale formula elementwise (``min_val`` / ``max_val`` have one
    value per channel, empty before any data)."""

    _per_channel = True
    _QSCHEME = "per_channel_symmetric"

    def __init__(self, averaging_constant=0.01, ch_axis=0, dtype="qint8",
                 qscheme="per_channel_symmetric", quant_min=None, quant_max=None,
                 is_sync_quantize=False, factory_kwargs=None, *, nan_policy="propagate"):
        self.ch_axis = A.as_int(ch_axis, "ch_axis", type(self).__name__)
        self._setup(averaging_constant, self.ch_axis, dtype, qscheme, quant_min, quant_max,
                    is_sync_quantize, factory_kwargs, nan_policy)


# --------------------------------------------------------- FakeQuantize
@functools.lru_cache(maxsize=None)
def _mode(rounding):
    """FakeQuantize's kernel mode: no zero point at all, ``y = round(x / s) * s``
    (Horizon's reference formula, signed zeros included: -0.0 and -0.5 -> -0.0
    with half_to_even)."""
    return affine_mode(rounding, zero_point_add="none", scale_op="div",
                       func="FakeQuantize.forward")


class FakeQuantize(Switches, Locked):
    """Horizon's ``FakeQuantize``: observe, scale, fake quantize::

        out  = clamp(round(x / scale), quant_min, quant_max) * scale
        mask = quant_min <= round(x / scale) <= quant_max

    with ``round`` the global :class:`QuantRoundMode`.  In training with
    the observer on, the observer records ``x`` first and ``scale`` becomes
    its ``calculate_qparams()[0]``.

    Parameters
    ----------
    observer : class or with_args partial
        Called with ``**observer_kwargs``; default
        :class:`MovingAverageMinMaxObserver`.
    saturate : bool or None
        None means True: gradient zero where ``round(x / scale)`` is out of
        range.  False: pure straight-through estimator.
    in_place : bool
        Write the result into ``x``.
    compat_mask : bool
        Keep the mask bit-packed.
    channel_len : int
        Length of the per-channel ``scale`` / ``zero_point`` buffers.
    fast_training : bool
        Fused observe + fake quant (same numbers).

    Attributes
    ----------
    scale : float32 ndarray, zero_point : int64 ndarray
    fake_quant_enabled, observer_enabled : uint8[1] ndarrays
    activation_post_process : the observer
    quant_min, quant_max, dtype, qscheme, ch_axis, is_per_channel, training
    """

    def __init__(self, observer=MovingAverageMinMaxObserver, saturate=None, in_place=False,
                 compat_mask=True, channel_len=1, fast_training=True, **observer_kwargs):
        func = "FakeQuantize"
        self.activation_post_process = observer(**observer_kwargs)
        obs = self.activation_post_process
        if not isinstance(obs, MovingAverageMinMaxObserver):
            raise TypeError(f"{func}: observer must build a horizon MovingAverageMinMaxObserver "
                            f"or MovingAveragePerChannelMinMaxObserver, got {type(obs).__name__}")
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.dtype, self.qscheme = obs.dtype, obs.qscheme
        self.is_per_channel = self.qscheme == "per_channel_symmetric"
        self.ch_axis = obs.ch_axis if self.is_per_channel else -1
        channel_len = A.as_int(channel_len, "channel_len", func)
        if channel_len < 1:
            raise ValueError(f"{func}: channel_len must be >= 1, got {channel_len}")
        self.channel_len = channel_len
        n = channel_len if self.is_per_channel else 1
        self.scale = np.ones(n, F32)
        self.zero_point = np.zeros(n, np.int64)
        self.saturate = True if saturate is None else bool(saturate)
        self.in_place = bool(in_place)
        self.compat_mask = bool(compat_mask)
        self.fast_training = bool(fast_training)
        self.fake_quant_enabled = np.array([1], np.uint8)
        self.observer_enabled = np.array([1], np.uint8)
        self.training = True
        self._mask = None
        self._mask_shape = None
        self._fused = None

    with_args = classmethod(_with_args)

    # ------------------------------------------------------------- qparams
    def calculate_qparams(self):
        """The observer's ``(scale, zero_point)``."""
        return self.activation_post_process.calculate_qparams()

    def set_qparams(self, scale, zero_point=None):
        """Set ``scale`` (and ``zero_point``, zeros when None): a scalar fills
        every channel, a list / array must have the buffer's shape."""
        self.scale = self._filled(scale, self.scale, F32, "scale")
        if zero_point is None:
            self.zero_point = np.zeros_like(self.zero_point)
        else:
            self.zero_point = self._filled(zero_point, self.zero_point, np.int64, "zero_point")

    @staticmethod
    def _filled(value, buf, dtype, name):
        arr = np.asarray(A.to_host(value))
        buf = A.to_host(buf)
        if arr.dtype.kind not in "iuf":
            raise TypeError(f"FakeQuantize.set_qparams: {name} must be numeric, got {value!r}")
        if arr.ndim == 0:
            return np.full(buf.shape, arr, dtype=dtype)
        if arr.shape != buf.shape:
            raise ValueError(f"mismatched shape when set {name} {arr.shape} vs {buf.shape}, "
                             "please check channel_len")
        return arr.astype(dtype)

    # ------------------------------------------------------------- forward
    @locked
    def __call__(self, x):
        return self.forward(x)

    def _fast_ok(self, arr):
        obs = self.activation_post_process
        return (arr.dtype == F32 and self.fast_training and self.training
                and self.observer_enabled[0] == 1 and self.fake_quant_enabled[0] == 1
                and not self.in_place and type(obs) is MovingAverageMinMaxObserver
                and self.quant_min < 0 and _MARCH[0] != "bernoulli")

    def forward(self, x):
        """Fake-quantized ``x`` (see the class docstring).  A cupy x is
        observed and quantized on the device; the scale is a device array
        then, except on the fused per-tensor path, whose state is read back
        once per call (the core FakeQuantize's scale, a few bytes)."""
        func = "FakeQuantize.forward"
        arr = x if type(x) is np.ndarray and x.dtype == F32 else A.as_float_array(x, "x", func)
        mode = _mode(QuantRoundMode.rounding())
        if self._fast_ok(arr):
            return self._forward_fused(arr, mode)
        obs = self.activation_post_process
        if self.training and self.observer_enabled[0] == 1:
            obs(arr)
            self.scale = obs.calculate_qparams()[0]
        if self.fake_quant_enabled[0] != 1:
            self._mask = None
            return arr
        axis = None
        scale = self.scale
        if self.is_per_channel:
            axis = A.normalize_axis(self.ch_axis, arr.ndim, func)
            channels = arr.shape[axis]
            if scale.size == 1:
                xp = A.array_module(scale)
                scale = xp.ascontiguousarray(xp.broadcast_to(scale.reshape(-1)[:1], (channels,)),
                                             dtype=F32)
            elif scale.size != channels:
                raise ValueError(f"{func}: x has {channels} channels along ch_axis="
                                 f"{self.ch_axis}, the scale {scale.size}")
        elif scale.size != 1:
            raise ValueError(f"{func}: a per-tensor FakeQuantize needs one scale, got "
                             f"{scale.size}")
        writable = (isinstance(x, np.ndarray) and x.flags.writeable) or \
            (A.is_cupy_array(x) and arr is x)
        out = arr if (self.in_place and writable) else None
        y, mask = _affine(arr, A.astype_exact(scale, np.float64), np.zeros(scale.size),
                          self.quant_min, self.quant_max, mode, axis=axis, out=out, mask=True,
                          func=func)
        self._keep_mask(mask, arr.shape)
        return y

    def _forward_fused(self, arr, mode):
        """One call of the core FakeQuantize's fused per-tensor kernel
        (observe, scale, fake quant; the core observer is shared)."""
        obs = self.activation_post_process
        core = self._fused
        if core is None or core.observer is not obs._core:
            core = _CoreFakeQuantize(obs._core, self.quant_min, self.quant_max, symmetric=True,
                                     eps=obs.eps)
            # (private to this module: its switches stay as set here)
            core.packed_mask = False
            core.training = core.observer_enabled = core.fake_quant_enabled = True
            self._fused = core
        core._mode = mode  # division by the scale, current rounding
        # the qparams into the core (through its checking setters unless it
        # holds them already: it keeps what the last forward wrote)
        scale, core_scale = self.scale, core.scale
        if not (type(scale) is np.ndarray and scale.shape == (1,) and scale.dtype == F32 and
                core_scale.shape == (1,) and scale[0] == core_scale[0]):
            core.scale = np.array(A.to_host(self.scale[:1]), F32)
        core_zp = core.zero_point
        if not (core_zp.shape == (1,) and core_zp[0] == 0):
            core.zero_point = np.zeros(1, np.int64)
        y = None
        if type(arr) is np.ndarray and arr.flags.c_contiguous and core._fused_ready():
            y = core._forward_fused(arr, None)  # (arr is checked: the core's kernel step)
        if y is None:
            y = core(arr)
        self.scale = np.array(core.scale, F32).reshape(1)
        mask = core.mask
        self._keep_mask(None if mask is None else mask.view(np.bool_), arr.shape)
        return y

    def _keep_mask(self, mask, shape):
        if mask is None or not self.saturate:
            self._mask = None
            self._mask_shape = shape
            return
        self._mask_shape = shape
        xp = A.array_module(mask)
        self._mask = (xp.packbits(mask.reshape(-1), bitorder="little") if self.compat_mask
                      else mask.astype(np.bool_, copy=False))

    @property
    def mask(self):
        """The saturate mask of the last forward (bit-packed with
        ``compat_mask``), or None (no quantization, or ``saturate=False``)."""
        return self._mask

    def backward(self, grad_output):
        """Input gradient of the last forward: ``grad * mask`` with
        ``saturate``, else ``grad`` (straight through)."""
        func = "FakeQuantize.backward"
        g = A.as_float_array(grad_output, "grad_output", func)
        if self._mask_shape is not None and g.shape != self._mask_shape:
            raise ValueError(f"{func}: grad_output has shape {g.shape}, the last forward had "
                             f"{self._mask_shape}")
        if self._mask is None:
            return g.copy()
        return ste_backward(g, self._mask)

    def extra_repr(self):
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
                f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}, "
                f"saturate={self.saturate}")

    def __repr__(self):
        return f"FakeQuantize({self.extra_repr()})"


default_8bit_fake_quant = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver,
                                                 dtype="qint8")
per_channel_8bit_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, dtype="qint8", ch_axis=1)
default_weight_8bit_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, dtype="qint8", ch_axis=0)
default_16bit_fake_quant = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver,
                                                  dtype="qint16")
