"""MindSpore 1.x ``nn.FakeQuantWithMinMaxObserver`` on NumPy arrays.

A plain Python class with MindSpore's name, arguments, defaults, attributes
and errors.  Statistics come from :class:`quantcore.EMAMinMaxObserver`
(one pass of :func:`quantcore.minmax`), the nudged range from
:func:`quantcore.qparams.nudge_mindspore`, and every element goes through
the shared ``qc_fq_nudged`` kernel in its MindSpore form
(``floor(t + 0.5) * scale + nudge_min``, ``t = (xc - nudge_min) / scale``).

The documented example holds to the last bit:

>>> import numpy as np
>>> from quantcore.compat.mindspore import FakeQuantWithMinMaxObserver
>>> fake_quant = FakeQuantWithMinMaxObserver()
>>> x = np.array([[1, 2, 1], [-2, 0, -1]], dtype=np.float32)
>>> output = fake_quant(x)
>>> print(output)
[[ 0.9882355  1.9764705  0.9882355]
 [-1.9764705  0.        -0.9882355]]

A new cell is in inference mode (MindSpore's ``Cell.training`` is False),
so the example used ``min_init=-6``, ``max_init=6`` as they are.  In
training mode the statistics are updated first:

>>> fq = FakeQuantWithMinMaxObserver().set_train()
>>> print(fq(x))
[[ 1.0039215  2.007843   1.0039215]
 [-1.992157   0.        -1.0039216]]
>>> fq.minq, fq.maxq
(array([-2.], dtype=float32), array([2.], dtype=float32))

Decisions (the specification's decisions, "MindSpore")
------------------------------------------
- Integer range: the kernels' unsigned range, ``qmin = 0`` (``1`` with
  ``narrow_range``), ``qmax = 2**num_bits - 1``; the signedness of
  ``quant_dtype`` does not change the numbers (as in MindSpore).  Every
  ``QuantDtype`` (2..8 bits) is accepted.
- EMA (``ema=True``): the seed page's rule (Ascend), ``c = f32(1 - d)``
  computed in double, ``new_min = min(f32(f32(old*d) + f32(batch_min*c)), 0)``
  and ``new_max = max(..., 0)``, starting from ``min_init`` / ``max_init``
  (no first-step special case).  ``ema=False``:
  ``new_min = min(batch_min, 0)``, ``new_max = max(batch_max, 0)``.
- Symmetric: ``M = max(max, -min)`` and the range ``[-M, M]`` before
  nudging (:func:`quantcore.qparams.symmetric_range`); ``minq`` / ``maxq``
  keep the unsymmetrised values.
- Nudge: ``nzp = floor(clamp(zp_from_min, qmin, qmax) + 0.5)``; forward
  ``q = floor(f32(f32(xc - nudge_min) / scale) + 0.5)``,
  ``y = f32(f32(q * scale) + nudge_min)``, no FMA.
- ``quant_delay``: in training mode the first ``quant_delay`` forward calls
  return a copy of ``x`` (minq / maxq are still updated); the counter counts
  training forwards only.  Inference always quantizes.
- Gradient (``backward(dout, x)``): ``dx = dout`` where
  ``nudge_min <= x <= nudge_max`` (inclusive), else 0, with the forward's
  own ``symmetric`` / ``narrow_range`` (MindSpore's bprop drops them; that
  bug is not reproduced).  ``backward`` keeps its own call counter, as
  MindSpore's gradient kernel does: its first ``quant_delay`` calls return
  ``dout`` unchanged.
- Per channel: ``channel_axis`` is honoured (any axis); ``num_channels``
  must equal ``x.shape[channel_axis]`` (rank-1 input: axis 0), else
  ValueError.

Choices beyond the specification's decisions
---------------------------
- The gradient is MindSpore's GPU kernel's select
  (``0 if x < nudge_min or x > nudge_max else dout``), not ``dout * mask``:
  the zero outside is ``+0.0`` whatever the sign of ``dout``, a NaN ``dout``
  outside gives 0, and a NaN ``x`` (neither below nor above) passes ``dout``.
  (Ascend multiplies by a strict mask instead.)
- Errors: the seed page documents TypeError for ``min_init >= max_init`` and
  for a negative ``quant_delay``, MindSpore's code raises ValueError.  Both
  raise :class:`MindSporeArgumentError`, a subclass of TypeError *and*
  ValueError, so either ``except`` clause catches them.  Other type errors
  are TypeError, other value errors ValueError, as MindSpore's validator.
  A list ``min_init`` / ``max_init`` (MindSpore >= 1.3) is accepted: one
  value per layer, ``num_channels`` values per channel.
- Degenerate range (``max - min == 0`` after the update, e.g. an all-zero
  batch with ``ema=False``): the output is 0 and the gradient passes where
  ``x == 0`` (or NaN) in that channel, as MindSpore's GPU kernel (Ascend is
  undefined, 0/0).  This is done by passing ``nudge_min = nudge_max = 0``,
  ``scale = 1`` to the kernel; NaN input stays NaN.
- NaN input in training: the observer's ``nan_policy`` (keyword-only,
  default ``"skip"``): a batch holding NaN leaves ``minq`` / ``maxq``
  unchanged with a RuntimeWarning (``"propagate"`` lets NaN into the state,
  ``"raise"`` raises ValueError).  NaN elements give NaN outputs.
- dtypes: float32 is MindSpore's; float16 input is computed in float32 and
  rounded once at the end; float64 input is computed in float64 with the
  float32 nudged range.  Python lists / scalars become float32 (a MindSpore
  ``Tensor(..., mindspore.float32)``).  ``minq`` / ``maxq`` are float32.
- ``ema_decay`` must be a Python / NumPy float (an int raises TypeError, as
  MindSpore's ``check_float_range``); ``ema``, ``per_channel``,
  ``symmetric``, ``narrow_range`` must be bool.  ``quant_dtype`` may also be
  given as its name (``"INT8"``, case-insensitive).
"""
import enum
import numbers

import numpy as np

from .. import _arrays as A
from .. import qparams as Q
from .._locks import Locked, locked
from ..observers import EMAMinMaxObserver
from ..ops import NUDGED_DIVIDE, _nudged, _nudged_fast
from ._fast import scheme_scalars

__all__ = ["QuantDtype", "FakeQuantWithMinMaxObserver", "MindSporeArgumentError"]

F32 = np.float32
_CLS = "FakeQuantWithMinMaxObserver"


class MindSporeArgumentError(TypeError, ValueError):
    """Raised where MindSpore's documentation says TypeError and its code
    raises ValueError (``min_init >= max_init``, negative ``quant_delay``).
    """


@enum.unique
class QuantDtype(enum.Enum):
    """MindSpore's ``QuantDtype``: the quantized integer type.

    >>> QuantDtype.INT8.num_bits, QuantDtype.UINT4.num_bits
    (8, 4)
    """

    INT2 = "INT2"
    INT3 = "INT3"
    INT4 = "INT4"
    INT5 = "INT5"
    INT6 = "INT6"
    INT7 = "INT7"
    INT8 = "INT8"
    UINT2 = "UINT2"
    UINT3 = "UINT3"
    UINT4 = "UINT4"
    UINT5 = "UINT5"
    UINT6 = "UINT6"
    UINT7 = "UINT7"
    UINT8 = "UINT8"

    def __str__(self):
        return self.name

    @property
    def num_bits(self):
        """The bit width (2..8)."""
        return int(self.value.lstrip("UINT"))

    @staticmethod
    def is_signed(dtype):
        """True for the INTn members."""
        return dtype.name.startswith("INT")

    @staticmethod
    def switch_signed(dtype):
        """INTn <-> UINTn."""
        name = dtype.name[1:] if dtype.name.startswith("U") else "U" + dtype.name
        return QuantDtype[name]


def _type_name(v):
    return type(v).__name__


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"For '{_CLS}', the type of '{name}' should be bool, but got "
                        f"{_type_name(value)}.")
    return bool(value)


def _check_int(value, name, minimum, error=ValueError):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"For '{_CLS}', the type of '{name}' should be int, but got "
                        f"{_type_name(value)}.")
    if value < minimum:
        what = "non-negative" if minimum == 0 else "positive"
        raise error(f"For '{_CLS}', the '{name}' should be a {what} int, but got {value}.")
    return int(value)


def _check_init(value, name):
    ok = (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)))
    if isinstance(value, list):
        ok = all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))
                 for v in value)
    if not ok:
        raise TypeError(f"For '{_CLS}', the type of '{name}' should be int, float or list of "
                        f"them, but got {_type_name(value)}: {value!r}.")
    return value


def _quant_dtype(value):
    if isinstance(value, QuantDtype):
        return value
    if isinstance(value, str) and value.upper() in QuantDtype.__members__:
        return QuantDtype[value.upper()]
    raise TypeError(f"For '{_CLS}', 'quant_dtype' should be a QuantDtype, but got "
                    f"{value!r}.")


def _as_input(x):
    """x as a float array: float arrays keep their dtype, the rest float32."""
    if type(x) is np.ndarray and (x.dtype == F32 or x.dtype == np.float64):
        return x
    arr = A.as_real_float(x, "x", _CLS)
    if arr is None:
        raise TypeError(f"For '{_CLS}', the input should be a float tensor, got "
                        f"{A.describe(x)}")
    return arr


class FakeQuantWithMinMaxObserver(Locked):
    """MindSpore's ``nn.FakeQuantWithMinMaxObserver`` (mode "DEFAULT").

    Parameters
    ----------
    min_init, max_init : int, float or list
        Initial ``minq`` / ``maxq`` (a list: 1 value per layer, ``num_channels``
        values per channel).  ``min_init < max_init`` elementwise.
    ema : bool
        Exponential moving average of the statistics (else the batch's).
    ema_decay : float in [0, 1]
    per_channel : bool
    channel_axis : int >= 0
    num_channels : int >= 1
    quant_dtype : QuantDtype
        Only its bit width matters.
    symmetric, narrow_range : bool
    quant_delay : int >= 0
        Training steps without quantization.
    nan_policy : {"skip", "propagate", "raise"}, keyword-only
        What a training batch holding NaN does to ``minq`` / ``maxq``
        (quantcore addition; see the module docstring).

    Attributes
    ----------
    minq, maxq : float32 ndarray of shape [1] or [num_channels]
        MindSpore's ``quant_min`` / ``quant_max`` parameters.
    training : bool
        False for a new cell; :meth:`set_train` changes it.
    """

    def __init__(self, min_init=-6, max_init=6, ema=False, ema_decay=0.999, per_channel=False,
                 channel_axis=1, num_channels=1, quant_dtype=QuantDtype.INT8, symmetric=False,
                 narrow_range=False, quant_delay=0, *, nan_policy="skip"):
        _check_init(min_init, "min_init")
        _check_init(max_init, "max_init")
        self.quant_delay = _check_int(quant_delay, "quant_delay", 0, MindSporeArgumentError)
        self.ema = _check_bool(ema, "ema")
        if self.ema and not ema_decay:
            raise ValueError(f"For '{_CLS}', attr 'ema' and 'ema_decay' should set together.")
        if isinstance(ema_decay, (bool, np.bool_)) or not isinstance(ema_decay, float):
            raise TypeError(f"For '{_CLS}', the type of 'ema_decay' should be float, but got "
                            f"{_type_name(ema_decay)}.")
        if not 0.0 <= ema_decay <= 1.0:
            raise ValueError(f"For '{_CLS}', the 'ema_decay' should be in range [0, 1], but got "
                             f"{ema_decay}.")
        self.ema_decay = float(ema_decay)
        self.per_channel = _check_bool(per_channel, "per_channel")
        self.channel_axis = _check_int(channel_axis, "channel_axis", 0)
        self.num_channels = _check_int(num_channels, "num_channels", 1)
        self.quant_dtype = _quant_dtype(quant_dtype)
        self.num_bits = self.quant_dtype.num_bits
        self.symmetric = _check_bool(symmetric, "symmetric")
        self.narrow_range = _check_bool(narrow_range, "narrow_range")
        if nan_policy not in ("skip", "propagate", "raise"):
            raise ValueError(f"For '{_CLS}', 'nan_policy' should be 'skip', 'propagate' or "
                             f"'raise', but got {nan_policy!r}.")
        self.nan_policy = nan_policy
        self.min_init, self.max_init = min_init, max_init
        min_array = self._init_array(min_init, "min_init")
        max_array = self._init_array(max_init, "max_init")
        if not np.greater(max_array, min_array).all():
            raise MindSporeArgumentError(
                f"For '{_CLS}', the 'max_init' should be greater than 'min_init', but got "
                f"'max_init': {max_init}, 'min_init': {min_init}.")
        self.minq = min_array
        self.maxq = max_array
        self.quant_min = 1 if self.narrow_range else 0
        self.quant_max = 2 ** self.num_bits - 1
        self.training = False
        self._step = 0       # training forwards (quant_delay of the forward kernel)
        self._grad_step = 0  # backward calls (the gradient kernel's own counter)

    def _init_array(self, value, name):
        n = self.num_channels if self.per_channel else 1
        if isinstance(value, list):
            if len(value) != n:
                what = (f"equal to 'num_channels' ({n}) for per-channel quantization"
                        if self.per_channel else "1 for per-layer quantization")
                raise ValueError(f"For '{_CLS}', the length of '{name}' list should be {what}, "
                                 f"but got {value}.")
            return np.array(value, dtype=np.float64).astype(F32)
        return np.full(n, value, dtype=np.float64).astype(F32)

    # -- Cell API ----------------------------------------------------------
    def set_train(self, mode=True):
        """Training (``mode=True``) or inference mode; returns self."""
        self.training = bool(mode)
        return self

    @locked
    def __call__(self, x):
        return self.construct(x)

    def construct(self, x):
        """Fake-quantize ``x`` (training: update ``minq`` / ``maxq`` first).

        A cupy x is computed on the device with no synchronisation:
        ``minq`` / ``maxq`` become device arrays updated in place by the
        EMA kernel (a numpy x brings them back), the nudged range is formed
        on the device (nan_policy="raise" reads the batch count to raise)."""
        arr = _as_input(x)
        axis = self._axis(arr)
        if self.training:
            self._update(arr, axis)
            delayed = self._step < self.quant_delay
            self._step += 1
            if delayed:
                return arr.copy()
        if axis is None:
            res = self._fast_forward(arr)
            if res is not None:
                return res
        nmin, nmax, scale = self._nudged_range()
        return _nudged(arr, nmin, nmax, scale, scale, A.array_module(scale).zeros_like(scale),
                       NUDGED_DIVIDE, axis=axis, func=_CLS)

    forward = construct

    def backward(self, dout, x):
        """Input gradient: ``dout`` inside the nudged range, 0 outside.

        Uses the current ``minq`` / ``maxq`` (those the last training forward
        wrote).  The first ``quant_delay`` calls return ``dout`` unchanged.
        """
        func = f"{_CLS}.backward"
        arr = _as_input(x)
        g = _as_input(dout)
        if g.shape != arr.shape:
            raise ValueError(f"For '{func}', 'dout' and 'x' should have one shape, but got "
                             f"{g.shape} and {arr.shape}.")
        delayed = self._grad_step < self.quant_delay
        self._grad_step += 1
        if delayed:
            return g.copy()
        axis = self._axis(arr)
        nmin, nmax, scale = self._nudged_range()
        _, mask = _nudged(arr, nmin, nmax, scale, scale, A.array_module(scale).zeros_like(scale),
                          NUDGED_DIVIDE, axis=axis, mask=True, func=func)
        # MindSpore's gradient kernel selects: 0 where x < nudge_min or
        # x > nudge_max, else dout (so +0.0 outside, NaN dout blocked there,
        # and a NaN x, which is neither, passes dout)
        xp = A.array_module(g)
        keep = mask.view(np.bool_) | xp.isnan(arr)
        return xp.where(keep, g, g.dtype.type(0))

    # -- internals ---------------------------------------------------------
    def _params(self):
        n = self.num_channels if self.per_channel else 1
        if A.is_cupy_array(self.minq) and A.is_cupy_array(self.maxq):
            mn, mx = self.minq.reshape(-1), self.maxq.reshape(-1)  # (device state)
        else:
            mn = np.asarray(A.to_host(self.minq), dtype=F32).reshape(-1)
            mx = np.asarray(A.to_host(self.maxq), dtype=F32).reshape(-1)
        if mn.shape != (n,) or mx.shape != (n,):
            raise ValueError(f"For '{_CLS}', 'minq' and 'maxq' should hold {n} values, but got "
                             f"shapes {mn.shape} and {mx.shape}.")
        return mn, mx

    def _axis(self, arr):
        """Channel axis for this input (None per layer), checked."""
        if not self.per_channel:
            return None
        axis = 0 if arr.ndim == 1 else self.channel_axis
        if arr.ndim == 0 or axis >= arr.ndim:
            raise ValueError(f"For '{_CLS}', 'channel_axis' ({self.channel_axis}) is out of "
                             f"range for an input of rank {arr.ndim}.")
        if arr.shape[axis] != self.num_channels:
            raise ValueError(f"For '{_CLS}', 'num_channels' ({self.num_channels}) should be "
                             f"equal to x.shape[{axis}] = {arr.shape[axis]}.")
        return axis

    def _update(self, arr, axis):
        """MinMaxUpdate: the EMA (or batch) statistics into minq / maxq."""
        if A.is_cupy_array(arr):
            return self._update_device(arr, axis)
        mn, mx = self._params()
        if self.ema:
            decay, start_min, start_max = self.ema_decay, mn, mx
        else:
            # decay 0 from a zero state: f32(0*0) + f32(batch*1) = batch, so
            # the result is min(batch_min, 0) / max(batch_max, 0)
            decay, start_min, start_max = 0.0, np.zeros_like(mn), np.zeros_like(mx)
        if axis is None:
            start_min, start_max = start_min[0], start_max[0]
        obs = EMAMinMaxObserver(decay=decay, min_init=start_min, max_init=start_max, axis=axis,
                                include_zero=True, nan_policy=self.nan_policy,
                                num_channels=None if axis is None else mn.shape[0])
        obs.update(arr)
        if obs.num_batches:
            self._store("minq", obs.min_val)
            self._store("maxq", obs.max_val)

    def _update_device(self, arr, axis):
        """MinMaxUpdate of a cupy batch: minq / maxq (device float32[C]) are the
        state of an EMA observer, updated in place by its kernel (ema=False:
        from a zero state, the "from_zero" rule); a skipped (non-finite)
        batch leaves them alone."""
        xp = A.array_module(arr)
        for name in ("minq", "maxq"):
            cur = getattr(self, name)
            if not (A.is_cupy_array(cur) and cur.dtype == F32 and cur.ndim == 1):
                setattr(self, name, xp.asarray(np.asarray(A.to_host(cur), F32).reshape(-1)))
        mn, mx = self._params()
        obs = EMAMinMaxObserver(decay=self.ema_decay if self.ema else 0.0, min_init=0.0,
                                max_init=0.0, axis=axis, include_zero=True,
                                nan_policy=self.nan_policy,
                                num_channels=None if axis is None else mn.shape[0])
        obs._from_zero = not self.ema
        # the observer's state is a view of minq / maxq: the kernel writes them
        obs.min_val, obs.max_val = (mn, mx) if axis is not None else \
            (mn.reshape(()), mx.reshape(()))
        obs.update(arr)

    def _store(self, name, value):
        value = np.asarray(value, dtype=F32).reshape(-1)
        cur = getattr(self, name)
        if isinstance(cur, np.ndarray) and cur.dtype == F32 and cur.shape == value.shape \
                and cur.flags.writeable:
            cur[...] = value  # in place, like MindSpore's Assign into the Parameter
        else:
            setattr(self, name, value.copy())

    def _fast_forward(self, arr):
        """Per layer: the nudged range as scalars and the core's fast path
        (``_nudged_range``'s numbers); None when not that case."""
        mn, mx = self.minq, self.maxq
        if not (type(mn) is np.ndarray and type(mx) is np.ndarray and mn.shape == (1,) and
                mx.shape == (1,) and mn.dtype == F32 and mx.dtype == F32):
            return None
        mn, mx = mn[0], mx[0]
        if self.symmetric:
            mn, mx = (F32(v) for v in scheme_scalars("symmetric_range", mn, mx))
        nmin, nmax, scale = (F32(v) for v in scheme_scalars("nudge_ms", mn, mx, self.quant_min,
                                                            self.quant_max))
        if scale == 0:  # degenerate range: zeros out, as MindSpore's GPU kernel
            nmin, nmax, scale = F32(0), F32(0), F32(1)
        return _nudged_fast(arr, nmin, nmax, scale, scale, 0.0, NUDGED_DIVIDE, None, False)

    def _nudged_range(self):
        mn, mx = self._params()
        if self.symmetric:
            mn, mx = Q.symmetric_range(mn, mx)
        nmin, nmax, scale = Q.nudge_mindspore(mn, mx, self.quant_min, self.quant_max)
        # degenerate range: zeros out, as MindSpore's GPU kernel
        flat = A.compare_exact(scale, "==", 0.0)
        if A.is_cupy_array(flat):  # (selected on the device, without a synchronisation)
            xp = A.array_module(flat)
            return (xp.where(flat, F32(0), nmin), xp.where(flat, F32(0), nmax),
                    xp.where(flat, F32(1), scale))
        if flat.any():
            nmin = np.where(flat, F32(0), nmin).astype(F32)
            nmax = np.where(flat, F32(0), nmax).astype(F32)
            scale = np.where(flat, F32(1), scale).astype(F32)
        return nmin, nmax, scale

    def extend_repr(self):
        return (f"quant_dtype={self.quant_dtype}, symmetric={self.symmetric}, "
                f"narrow_range={self.narrow_range}, ema={self.ema}({self.ema_decay}), "
                f"per_channel={self.per_channel}({self.channel_axis}, {self.num_channels}), "
                f"quant_delay={self.quant_delay}, min_init={self.min_init}, "
                f"max_init={self.max_init}")

    def __repr__(self):
        return f"{_CLS}<{self.extend_repr()}>"
