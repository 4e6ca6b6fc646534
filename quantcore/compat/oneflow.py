"""OneFlow ``nn.MinMaxObserver``, ``nn.MovingAverageMinMaxObserver``,
``nn.FakeQuantization`` and ``nn.Quantization`` on NumPy arrays.

Plain Python classes with OneFlow's names, arguments and defaults.
Statistics come from :func:`quantcore.minmax` and
:class:`quantcore.MomentumMinMaxObserver`, scale and zero point from
:func:`quantcore.qparams.oneflow_qparams`, and every element goes through
the shared affine kernel (``qc_fq_affine``) with division by the scale,
the zero point added before ties-to-even rounding.

>>> import numpy as np
>>> from quantcore.compat import oneflow as ofq
>>> x = np.array([[1, 2, 1], [-2, 0, -1]], dtype=np.float32)
>>> scale, zero_point = ofq.MinMaxObserver(quantization_scheme="affine")(x)
>>> scale, zero_point
(array([0.01568628], dtype=float32), array([127.], dtype=float32))
>>> print(ofq.FakeQuantization(quantization_scheme="affine")(x, scale, zero_point))
[[ 1.0039216  1.992157   1.0039216]
 [-1.992157   0.        -1.0039216]]

Formulas (b = quantization_bit, all float32, one rounding per operation)
-----------------------------------------------------------------------
- MinMaxObserver, google/symmetric: ``scale = max(|hi|, |lo|) / (2**(b-1) - 1)``,
  ``zero_point = 0``; google/affine: ``scale = (hi - lo) / (2**b - 1)``,
  ``zero_point = -rint(lo / scale)`` (no 0-inclusion); cambricon:
  ``scale = floor(log2(max(|hi|, |lo|))) - (b - 2)``, the exponent of the step.
- MovingAverageMinMaxObserver: updates while
  ``training and current_train_step <= stop_update_after_iters``;
  ``om = f32(1 - momentum)``; ``moving = batch`` where the buffer is exactly
  0, else ``f32(f32(moving * momentum) + f32(batch * om))``; symmetric and
  cambricon track ``max(|hi|, |lo|)`` in ``moving_max`` and copy it into
  ``moving_min``.  qparams as above from the buffers, the affine zero point
  rounded half away from zero.
- FakeQuantization, symmetric: ``q = clamp(rint(x / scale), -2**(b-1), 2**(b-1) - 1)``,
  ``y = q * scale``; affine: ``q = clamp(rint(x / scale + zp), 0, 2**b - 1)``,
  ``y = (q - zp) * scale``; cambricon: ``s = 2**int32(scale[0])``,
  ``q = clamp(rint(x / s), -2**(b-1), 2**(b-1) - 1)``, ``y = q * s``.
  Quantization returns ``q`` (as floats).  NaN is not clamped.

Decisions (the specification's decisions, "OneFlow")
----------------------------------------
- Ties to even for values and for the MinMaxObserver zero point; ties away
  from zero for the MovingAverageMinMaxObserver zero point (as OneFlow).
- The CPU kernel's ``uint8`` cast of the zero point is not reproduced: the
  float zero point is used (the GPU behaviour).  Symmetric lower bound is
  ``-2**(bit-1)`` (the kernel; OneFlow's docstring says ``-127``).  Per
  channel is axis 0.  ``cambricon`` returns the exponent.
- Gradient of FakeQuantization (and Quantization): identity,
  ``backward(dy)`` returns ``dy`` (OneFlow has no clipping mask).

Choices beyond the specification's decisions
---------------------------
- Invalid ``quantization_bit`` (not 2..8), ``quantization_scheme`` or
  ``quantization_formula`` (OneFlow: a check failure when the op runs) and
  per-channel cambricon (OneFlow: unimplemented) raise ValueError at
  construction; a non-int bit width raises TypeError.
  ``stop_update_after_iters`` must be an int > 0 (ValueError).
- Input dtypes: float32 is exact.  float16 is computed in float32 (result
  rounded back once).  float64 fake quantization is computed in float64 (as
  OneFlow's double kernel); the observers' statistics of float64 input are
  rounded to float32 and scale / zero point computed and returned in float32
  (OneFlow computes them in double: a documented difference).
- A NaN batch in MovingAverageMinMaxObserver: keyword-only ``nan_policy``,
  default ``"skip"`` (the buffers stay unchanged, RuntimeWarning);
  ``"propagate"`` lets NaN into the buffers as OneFlow would.  The stateless
  MinMaxObserver propagates NaN into scale / zero point.
- ``scale`` / ``zero_point`` with more than one value must have
  ``x.shape[0]`` values (ValueError), zero_point as many as scale (affine).
  Scales are used as given (0 or negative as in OneFlow: inf / NaN results).
- Signed zeros are OneFlow's: symmetric and cambricon compute ``q * s``
  with no zero point, so ``-0.0`` and inputs in ``(-0.5 * scale, 0)`` give
  ``-0.0``; affine computes ``rint(x / s + zp)`` and ``(q - zp) * s``, so a
  ``-0.0`` input gives ``+0.0``, and a negative ``x / s + zp`` that rounds
  to zero gives ``q = -0.0`` (kept by the comparison clamp; ``y = -0.0``
  when ``zp = 0``).
- A zero ``max |x|`` with cambricon gives the exponent ``-inf`` (OneFlow:
  undefined downstream); FakeQuantization then uses the step ``2**-inf = 0``:
  ``x / 0`` is clamped and times 0 gives ``+-0.0``, a zero or NaN input
  gives NaN.
"""
import functools
import numbers

import numpy as np

from .. import _arrays as A
from .. import qparams as Q
from .._locks import Locked, locked
from ..observers import MomentumMinMaxObserver
from ..ops import _affine, _affine_fast, affine_mode, minmax

__all__ = ["MinMaxObserver", "MovingAverageMinMaxObserver", "FakeQuantization", "Quantization"]

F32 = np.float32
_FORMULAS = ("google", "cambricon")
_SCHEMES = ("symmetric", "affine")


def _check_config(cls, formula, bit, scheme):
    if formula not in _FORMULAS:
        raise ValueError(f"{cls}: quantization_formula must be 'google' or 'cambricon', "
                         f"got {formula!r}")
    if isinstance(bit, (bool, np.bool_)) or not isinstance(bit, numbers.Integral):
        raise TypeError(f"{cls}: quantization_bit must be an int, got {bit!r}")
    if not 2 <= bit <= 8:
        raise ValueError(f"{cls}: quantization_bit must be in [2, 8], got {bit}")
    if scheme not in _SCHEMES:
        raise ValueError(f"{cls}: quantization_scheme must be 'symmetric' or 'affine', "
                         f"got {scheme!r}")
    return formula, int(bit), scheme


def _as_input(x, cls):
    """Float arrays keep their dtype; lists and scalars become float32."""
    arr = A.as_real_float(x, "input", cls)
    if arr is None:
        raise TypeError(f"{cls}: input must be a float tensor, got {A.describe(x)}")
    return arr


class _Module(Locked):
    """The bits of ``oneflow.nn.Module`` these classes need."""

    training = True

    def train(self, mode=True):
        """Training mode (``mode=True``) or evaluation mode; returns self."""
        self.training = bool(mode)
        return self

    def eval(self):
        """Evaluation mode; returns self."""
        return self.train(False)

    @locked
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class MinMaxObserver(_Module):
    """Scale and zero point of the current tensor (stateless).

    Parameters
    ----------
    quantization_formula : {"google", "cambricon"}
    quantization_bit : int in 2..8
    quantization_scheme : {"symmetric", "affine"}
    per_layer_quantization : bool
        False: one scale / zero point per slice along axis 0 (google only).

    ``obs(x) -> (scale, zero_point)``: float32 arrays of shape ``[1]`` per
    layer or ``[x.shape[0]]`` per channel; zero_point is a float array.
    """

    def __init__(self, quantization_formula="google", quantization_bit=8,
                 quantization_scheme="symmetric", per_layer_quantization=True):
        cls = type(self).__name__
        self.quantization_formula, self.quantization_bit, self.quantization_scheme = \
            _check_config(cls, quantization_formula, quantization_bit, quantization_scheme)
        self.per_layer_quantization = bool(per_layer_quantization)
        if self.quantization_formula == "cambricon" and not self.per_layer_quantization:
            raise ValueError(f"{cls}: per-channel quantization is not implemented for the "
                             "cambricon formula (per_layer_quantization must be True)")

    def forward(self, input):
        """(scale, zero_point) of ``input``; a cupy input gives device qparams
        (the reduction and the formula on the device, no synchronisation)."""
        x = _as_input(input, type(self).__name__)
        lo, hi = minmax(x, axis=None if self.per_layer_quantization else 0)
        return Q.oneflow_qparams(lo, hi, self.quantization_bit, self.quantization_scheme,
                                 self.quantization_formula, zp_rounding="half_even")


def _device_buffer(value, xp):
    """A one-element float32 device buffer holding ``value`` (itself when it
    is one already)."""
    if A.is_cupy_array(value) and value.dtype == F32 and value.shape == (1,):
        return value
    return xp.asarray(np.asarray(A.to_host(value), F32).reshape(-1)[:1].copy())


class MovingAverageMinMaxObserver(_Module):
    """Momentum-averaged min / max with OneFlow's buffers (per layer).

    Parameters
    ----------
    stop_update_after_iters : int > 0
        The buffers update while ``current_train_step <= stop_update_after_iters``.
    quantization_formula, quantization_bit, quantization_scheme
        As :class:`MinMaxObserver`.
    momentum : float
    nan_policy : {"skip", "propagate", "raise"}, keyword-only
        What a batch holding NaN does to the buffers (quantcore addition).

    Attributes
    ----------
    moving_max, moving_min : float32 arrays of shape [1], initially 0
    training : bool (True for a new module)

    ``obs(x, current_train_step) -> (scale, zero_point)``, float32 ``[1]``.
    """

    def __init__(self, stop_update_after_iters=1, quantization_formula="google",
                 quantization_bit=8, quantization_scheme="symmetric", momentum=0.95, *,
                 nan_policy="skip"):
        cls = type(self).__name__
        self.quantization_formula, self.quantization_bit, self.quantization_scheme = \
            _check_config(cls, quantization_formula, quantization_bit, quantization_scheme)
        if isinstance(stop_update_after_iters, (bool, np.bool_)) or \
                not isinstance(stop_update_after_iters, numbers.Integral):
            raise TypeError(f"{cls}: stop_update_after_iters must be an int, got "
                            f"{stop_update_after_iters!r}")
        if stop_update_after_iters <= 0:
            raise ValueError(f"{cls}: stop_update_after_iters must be > 0, got "
                             f"{stop_update_after_iters}")
        self.stop_update_after_iters = int(stop_update_after_iters)
        self.momentum = float(momentum)
        symmetric = quantization_scheme == "symmetric" or quantization_formula == "cambricon"
        self._observer = MomentumMinMaxObserver(momentum=self.momentum, symmetric=symmetric,
                                                nan_policy=nan_policy)
        self.training = True
        self.moving_max = np.zeros(1, F32)
        self.moving_min = np.zeros(1, F32)

    def reset_running_stats(self):
        """Zero both buffers."""
        self.moving_max = np.zeros(1, F32)
        self.moving_min = np.zeros(1, F32)

    def _update_device(self, x):
        """The update of a cupy batch: the core observer's state is a view of
        the (device) buffers, written in place by its kernel; a skipped batch
        leaves them alone."""
        xp = A.array_module(x)
        self.moving_min = _device_buffer(self.moving_min, xp)
        self.moving_max = _device_buffer(self.moving_max, xp)
        obs = self._observer
        obs.min_val, obs.max_val = self.moving_min.reshape(()), self.moving_max.reshape(())
        obs.update(x)

    def forward(self, input, current_train_step):
        """Update the buffers (training, up to ``stop_update_after_iters``)
        and return their qparams.  A cupy input is observed on the device:
        the buffers become device arrays updated in place by the momentum
        rule in the reduction's last block, and the qparams are device
        arrays; a cupy ``current_train_step`` is read (8 bytes)."""
        cls = type(self).__name__
        x = _as_input(input, cls)
        step = np.asarray(A.to_host(current_train_step))
        if step.size != 1 or step.dtype.kind not in "iu":
            raise TypeError(f"{cls}: current_train_step must be an integer tensor of one "
                            f"element, got {current_train_step!r}")
        if self.training and int(step.reshape(-1)[0]) <= self.stop_update_after_iters and \
                A.is_cupy_array(x):
            self._update_device(x)
        elif self.training and int(step.reshape(-1)[0]) <= self.stop_update_after_iters:
            obs = self._observer
            obs.min_val = np.asarray(A.to_host(self.moving_min), F32).reshape(-1)[0].reshape(())
            obs.max_val = np.asarray(A.to_host(self.moving_max), F32).reshape(-1)[0].reshape(())
            before = obs.num_batches
            obs.update(x)
            if obs.num_batches != before:
                self.moving_max = np.asarray(obs.max_val, F32).reshape(1).copy()
                self.moving_min = np.asarray(obs.min_val, F32).reshape(1).copy()
        if A.is_cupy_array(x):  # (not updated: the qparams still on the input's device)
            xp = A.array_module(x)
            self.moving_min = _device_buffer(self.moving_min, xp)
            self.moving_max = _device_buffer(self.moving_max, xp)
        return Q.oneflow_qparams(self.moving_min, self.moving_max, self.quantization_bit,
                                 self.quantization_scheme, self.quantization_formula,
                                 zp_rounding="half_away")


#: float32 scales with a finite reciprocal (what ops._affine_fast accepts)
_FAST_SCALE = (float(np.finfo(F32).tiny), float(np.finfo(F32).max))


@functools.lru_cache(maxsize=None)
def _fast_mode(affine, output_q):
    """FakeQuantization's kernel mode (google formula)."""
    return affine_mode("half_even", "before_rounding" if affine else "none", "div", "propagate",
                       output_q=output_q)


class FakeQuantization(_Module):
    """Fake quantization with a given scale and zero point.

    ``fq(x, scale, zero_point)``: per layer when scale has one value, else per
    channel along axis 0 (``scale.size == x.shape[0]``).  See the module
    docstring for the formulas.
    """

    _output_q = False

    def __init__(self, quantization_formula="google", quantization_bit=8,
                 quantization_scheme="symmetric"):
        self.quantization_formula, self.quantization_bit, self.quantization_scheme = \
            _check_config(type(self).__name__, quantization_formula, quantization_bit,
                          quantization_scheme)

    def _bounds(self):
        b = self.quantization_bit
        if self.quantization_formula == "google" and self.quantization_scheme == "affine":
            return 0, 2 ** b - 1
        return -2 ** (b - 1), 2 ** (b - 1) - 1

    def forward(self, input, scale, zero_point):
        """The fake-quantized (or, Quantization, integer) ``input``.  cupy
        input is computed on the device; device scale / zero_point stay there
        (cambricon reads ``scale[0]``, 4 bytes, to form its step)."""
        cls = type(self).__name__
        if self.quantization_formula == "google":
            res = self._fast_forward(input, scale, zero_point, cls)
            if res is not None:
                return res
        x = _as_input(input, cls)
        if A.is_cupy_array(scale) and (self.quantization_formula == "cambricon" or
                                       not A.is_cupy_array(x)):
            scale = scale.get()
        s = A.astype_exact(scale, np.float64).reshape(-1) if A.is_cupy_array(scale) else \
            np.asarray(scale, dtype=np.float64).reshape(-1)
        if s.size == 0:
            raise ValueError(f"{cls}: scale is empty")
        affine = self.quantization_formula == "google" and self.quantization_scheme == "affine"
        if self.quantization_formula == "cambricon":
            s = Q.cambricon_step(s[0], np.float64)  # only scale[0] is used
        axis = None
        if s.size > 1:
            if x.ndim == 0 or s.size != x.shape[0]:
                raise ValueError(f"{cls}: scale has {s.size} values; per-channel quantization "
                                 f"needs x.shape[0] of them, x has shape {x.shape}")
            axis = 0
        if affine:
            z = A.astype_exact(zero_point, np.float64).reshape(-1) if A.is_cupy_array(zero_point) \
                else np.asarray(zero_point, dtype=np.float64).reshape(-1)
            if z.size != s.size:
                raise ValueError(f"{cls}: zero_point has {z.size} values, scale {s.size}")
        else:
            # symmetric / cambricon: no zero point at all, q = rint(x / s),
            # y = q * s (keeps a -0.0 input's sign, as OneFlow)
            z = np.zeros(s.size)
        work = A.compute_dtype(x.dtype)
        lo, hi = self._bounds()
        mode = affine_mode("half_even", "before_rounding" if affine else "none", "div",
                           "propagate", output_q=self._output_q, func=cls)
        with np.errstate(all="ignore"):
            return _affine(x, A.astype_exact(s, work), A.astype_exact(z, work), lo, hi, mode,
                           axis=axis, func=cls)

    def _fast_forward(self, input, scale, zero_point, cls):
        """Per layer with one float32 scale (and zero point) that the core's
        fast path takes: ``forward``'s numbers; None when not that case."""
        if not (type(scale) is np.ndarray and scale.size == 1 and scale.dtype == F32):
            return None
        s = float(scale.reshape(-1)[0])
        if not _FAST_SCALE[0] <= s <= _FAST_SCALE[1]:  # (0, negative, NaN: inf / NaN results)
            return None
        affine = self.quantization_scheme == "affine"
        if affine:
            if not (type(zero_point) is np.ndarray and zero_point.size == 1 and
                    zero_point.dtype == F32):
                return None
            z = float(zero_point.reshape(-1)[0])
            if not abs(z) <= _FAST_SCALE[1]:
                return None
        else:
            z = 0.0
        lo, hi = self._bounds()
        mode = _fast_mode(affine, self._output_q)
        return _affine_fast(input, s, z, lo, hi, mode, "before_rounding" if affine else "none",
                            None, cls)

    def backward(self, dy):
        """Identity (straight-through, no clipping mask): returns ``dy``."""
        return A.as_float_array(dy, "dy", f"{type(self).__name__}.backward").copy()


class Quantization(FakeQuantization):
    """OneFlow's ``nn.Quantization``: as :class:`FakeQuantization` but returns
    the clamped integers ``q`` (as floats of the input dtype)."""

    _output_q = True
