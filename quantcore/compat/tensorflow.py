"""TensorFlow 2.x ``tf.quantization.fake_quant_with_min_max_*`` on NumPy arrays.

Functions with TensorFlow's names, argument order and defaults.  The nudged
range comes from :func:`quantcore.qparams.nudge_tensorflow` and every
element goes through the shared ``qc_fq_nudged`` kernel in its current-TF
form; the ``d_min`` / ``d_max`` sums of the gradients are float32 sums in
NumPy's order (:func:`quantcore._arrays.sum_rows`).  Cupy input is computed
on its device, ``min`` / ``max`` included: nothing tensor-sized crosses to
the host and nothing synchronises.

>>> import numpy as np
>>> from quantcore.compat import tensorflow as tfq
>>> x = np.array([[1, 2, 1], [-2, 0, -1]], dtype=np.float32)
>>> print(tfq.fake_quant_with_min_max_args(x))
[[ 0.9882353  2.0235295  0.9882353]
 [-1.9764706  0.        -0.9882353]]
>>> print(tfq.fake_quant_with_min_max_vars(x, -6.0, 6.0))
[[ 0.9882353  1.9764706  0.9882353]
 [-1.9764706  0.        -0.9882353]]

Decisions (the specification's decisions, "TensorFlow")
-------------------------------------------
- Current TF (2.21) formulas, bit-exact with TF 2.21 CPU, gradients
  included: ``quant_zero = floor(f32(-nudged_min * inv) + 0.5)``,
  ``y = floor(f32(t - quant_zero) + 0.5) * scale``; ``args`` and
  ``per_channel`` compute ``t = (xc - nudged_min) * inv`` with the
  separately divided ``inv = (qmax - qmin) / (max - min)``, ``vars`` divides
  by the scale.  ``args`` and ``vars`` can therefore differ at ties.
- Range ``[narrow_range ? 1 : 0, 2**num_bits - 1]``, num_bits 2..16.
- Gradients: ``dx = g * (nudged_min <= x <= nudged_max)`` (inclusive;
  ``NaN * 0`` stays NaN);
  ``d_min = sum(g * (x < nudged_min))``, ``d_max = sum(g * (x > nudged_max))``
  as float32 sums starting from +0.0 (Eigen's order of summation may differ
  from NumPy's pairwise one by a few ulp on long inputs).
- ``vars`` / ``per_channel`` with ``min == max == 0`` (per channel): output
  0, ``dx = g``, ``d_min = d_max = 0``.  Another ``min == max`` gives NaN;
  ``min > max`` is computed literally, as in TF.
- per_channel works along the LAST axis (inputs viewed as ``[-1, d]``).

Choices beyond the specification's decisions
---------------------------
- TF's InvalidArgumentError is raised as ValueError with TF's message text
  (without the ``{{function_node ...}}`` / ``[Op:...]`` decoration); TF's
  attribute type errors stay TypeError with TF's text.
- Inputs are converted to float32 as TF's Python wrappers do (lists, ints,
  float16 and float64 arrays are accepted and rounded to float32); results
  are float32.  ``min`` / ``max`` attributes of ``args`` are float32, ``None``
  means the default.  ``narrow_range`` must be a Python bool and
  ``num_bits`` an int (an integral float is accepted), as TF.
- ``..._per_channel`` with a rank-0 input raises ValueError (TF's kernel
  aborts the process).
- The ``name`` argument is accepted and ignored.
"""
import numbers

import numpy as np

from .. import _arrays as A
from .. import qparams as Q
from ..ops import NUDGED_DIVIDE, NUDGED_TF, _nudged, _nudged_fast, ste_backward
from ._fast import scheme_scalars

__all__ = [
    "fake_quant_with_min_max_args", "fake_quant_with_min_max_args_gradient",
    "fake_quant_with_min_max_vars", "fake_quant_with_min_max_vars_gradient",
    "fake_quant_with_min_max_vars_per_channel",
    "fake_quant_with_min_max_vars_per_channel_gradient",
]

F32 = np.float32


# ------------------------------------------------------------- conversions
def _tensor(x, op):
    """A float32 array, as tf.convert_to_tensor(x, tf.float32); a cupy array
    stays on the device (converted there: correctly rounded casts)."""
    if type(x) is np.ndarray and x.dtype == F32:
        return x
    if type(x) is F32:
        return np.asarray(x)
    if A.is_cupy_array(x):
        if x.dtype.kind not in "biuf":
            raise TypeError(f"{op}: cannot convert {A.describe(x)} to a float32 tensor")
        return x if x.dtype == F32 else A.astype_exact(x, F32)
    A.require_cpu(x, op)
    try:
        arr = np.asarray(x)
        if arr.dtype.kind not in "biuf":
            raise TypeError
        return np.asarray(arr, dtype=F32)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: cannot convert {A.describe(x)} to a float32 tensor") from None


def _num_bits(num_bits):
    if isinstance(num_bits, (bool, np.bool_)):
        num_bits = int(num_bits)
    elif isinstance(num_bits, numbers.Integral):
        num_bits = int(num_bits)
    elif isinstance(num_bits, numbers.Real) and float(num_bits).is_integer():
        num_bits = int(num_bits)
    else:
        raise TypeError(f"Expected int for argument 'num_bits' not {num_bits!r}.")
    if not 2 <= num_bits <= 16:
        raise ValueError("num_bits must be between 2 and 16, inclusive")
    return num_bits


def _narrow(narrow_range):
    if not isinstance(narrow_range, bool):
        raise TypeError(f"Expected bool for argument 'narrow_range' not {narrow_range!r}.")
    return narrow_range


def _attr_float(value, name, default):
    if type(value) is float or type(value) is int:
        return F32(float(value))
    if value is None:
        return F32(default)
    if not isinstance(value, (numbers.Real, np.bool_)):
        raise TypeError(f"Expected float for argument '{name}' not {value!r}.")
    return F32(float(value))


def _tf_float(v):
    """A float as TF's StrCat prints it (6 significant digits when exact)."""
    v = F32(v)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    s = "%.6g" % float(v)
    return s if F32(float(s)) == v else "%.9g" % float(v)


def _range(num_bits, narrow_range):
    if type(num_bits) is int and 2 <= num_bits <= 16 and type(narrow_range) is bool:
        return (1 if narrow_range else 0), 2 ** num_bits - 1  # (the checks below pass)
    nb = _num_bits(num_bits)
    return (1 if _narrow(narrow_range) else 0), 2 ** nb - 1


def _args_attributes(min, max, num_bits, narrow_range):
    """The ``args`` ops' attributes: (min, max, qmin, qmax), float32 min /
    max (None: the defaults -6 / 6); ValueError unless ``min < max``."""
    mn, mx = _attr_float(min, "min", -6), _attr_float(max, "max", 6)
    if not mn < mx:
        raise ValueError(f"min has to be smaller than max, was: {_tf_float(mn)} >= "
                         f"{_tf_float(mx)}")
    return (mn, mx) + _range(num_bits, narrow_range)


def _vars_minmax(min, max, rank, op):
    mn = _tensor(min, op)
    mx = _tensor(max, op)
    for name, v in (("min", mn), ("max", mx)):
        if v.ndim != rank:
            raise ValueError(f"`{name}` must be rank {rank} but is rank {v.ndim}")
    return mn, mx


def _same_size(g, x, op, args_op=False):
    if g.shape != x.shape:
        if args_op:
            raise ValueError(
                f"Inputs to operation {op} of type {op} must have the same size and shape.  "
                f"Input 0: [{','.join(map(str, g.shape))}] != input 1: "
                f"[{','.join(map(str, x.shape))}]")
        raise ValueError("gradient and input must be the same size")


def _channels(x, mn, mx):
    if x.ndim == 0:
        raise ValueError("Shape must be at least rank 1 but is rank 0")
    depth = x.shape[-1]
    for name, v in (("min", mn), ("max", mx)):
        if v.shape[0] != depth:
            raise ValueError(f"{name} has incorrect size, expected {depth} was {v.shape[0]}")
    return x.ndim - 1


# ------------------------------------------------------------ kernels' use
def _forward(x, mn, mx, qmin, qmax, mode, axis, op, want_mask=False):
    if axis is None and type(x) is np.ndarray and not A.is_cupy_array(mn) and \
            not A.is_cupy_array(mx):  # per tensor on the host: the core's fast path
        nmin, nmax, scale, inv, qz = scheme_scalars("nudge_tf", mn, mx, qmin, qmax)
        res = _nudged_fast(x, nmin, nmax, scale, inv, qz, mode, None, want_mask)
        if res is not None:
            return res, (want_mask and (np.array([nmin], F32), np.array([nmax], F32)))
    nmin, nmax, scale, inv, qz = Q.nudge_tensorflow(mn, mx, qmin, qmax)
    return _nudged(x, nmin, nmax, scale, inv, qz, mode, axis=axis, mask=want_mask,
                   func=op), (nmin, nmax)


def _both_zero(mn, mx):
    """``(mn == 0) & (mx == 0)``, exact for float32 subnormals on the device."""
    return A.compare_exact(mn, "==", 0.0) & A.compare_exact(mx, "==", 0.0)


def _outside_sums(g, x, nmin, nmax, axis):
    """(sum g[x < nmin], sum g[x > nmax]) as TF: ``g * mask`` summed in
    float32 from +0, in numpy's order (pairwise over a tensor; per channel
    a running sum down each channel), on the array's device."""
    if axis is None:
        below = ste_backward(g, A.compare_exact(x, "<", nmin.reshape(())))
        above = ste_backward(g, A.compare_exact(x, ">", nmax.reshape(())))
        return (A.sum_rows(below.reshape(1, -1))[0], A.sum_rows(above.reshape(1, -1))[0])
    depth = x.shape[-1]
    below = ste_backward(g, A.compare_exact(x, "<", nmin)).reshape(-1, depth)
    above = ste_backward(g, A.compare_exact(x, ">", nmax)).reshape(-1, depth)
    return A.sum_leading(below), A.sum_leading(above)


# ------------------------------------------------------------------- args
def fake_quant_with_min_max_args(inputs, min=-6, max=6, num_bits=8, narrow_range=False,
                                 name=None):
    """Fake-quantize ``inputs`` into the nudged ``[min, max]`` (attributes).

    ``y = floor(f32(t - quant_zero) + 0.5) * scale`` with
    ``t = (clamp(x) - nudged_min) * inv``.  ValueError unless ``min < max``.
    """
    op = "FakeQuantWithMinMaxArgs"
    mn, mx, qmin, qmax = _args_attributes(min, max, num_bits, narrow_range)
    x = _tensor(inputs, op)
    return _forward(x, mn, mx, qmin, qmax, NUDGED_TF, None, op)[0]


def fake_quant_with_min_max_args_gradient(gradients, inputs, min=-6, max=6, num_bits=8,
                                          narrow_range=False, name=None):
    """``gradients`` where ``nudged_min <= inputs <= nudged_max``, else 0."""
    op = "FakeQuantWithMinMaxArgsGradient"
    mn, mx, qmin, qmax = _args_attributes(min, max, num_bits, narrow_range)
    g, x = _tensor(gradients, op), _tensor(inputs, op)
    _same_size(g, x, op, args_op=True)
    (_, mask), _ = _forward(x, mn, mx, qmin, qmax, NUDGED_TF, None, op, want_mask=True)
    return ste_backward(g, mask)


# ------------------------------------------------------------------- vars
def fake_quant_with_min_max_vars(inputs, min, max, num_bits=8, narrow_range=False, name=None):
    """Fake-quantize ``inputs`` into the nudged ``[min, max]`` (rank-0 tensors).

    ``t = (clamp(x) - nudged_min) / scale``.  ``min == max == 0`` gives zeros.
    """
    op = "FakeQuantWithMinMaxVars"
    qmin, qmax = _range(num_bits, narrow_range)
    x = _tensor(inputs, op)
    mn, mx = _vars_minmax(min, max, 0, op)
    if A.is_cupy_array(mn) or A.is_cupy_array(mx):
        # device min / max: no synchronisation (TF's kernel reads them on the
        # device); min == max == 0 selects zeros on the device
        y = _forward(x, mn, mx, qmin, qmax, NUDGED_TF | NUDGED_DIVIDE, None, op)[0]
        xp = A.array_module(mn if A.is_cupy_array(mn) else mx)
        return xp.where(_both_zero(mn, mx), F32(0), y)
    if mn == 0 and mx == 0:
        return A.array_module(x).zeros_like(x)
    return _forward(x, mn, mx, qmin, qmax, NUDGED_TF | NUDGED_DIVIDE, None, op)[0]


def fake_quant_with_min_max_vars_gradient(gradients, inputs, min, max, num_bits=8,
                                          narrow_range=False, name=None):
    """``(backprops_wrt_input, backprop_wrt_min, backprop_wrt_max)``.

    ``dx = g * (nudged_min <= x <= nudged_max)``; ``d_min`` / ``d_max`` are
    the float32 sums of ``g`` below / above the nudged range (0-d arrays).
    """
    op = "FakeQuantWithMinMaxVarsGradient"
    qmin, qmax = _range(num_bits, narrow_range)
    g, x = _tensor(gradients, op), _tensor(inputs, op)
    _same_size(g, x, op)
    mn, mx = _vars_minmax(min, max, 0, op)
    xp = A.array_module(x)
    on_device = A.is_cupy_array(mn) or A.is_cupy_array(mx)
    if not on_device and mn == 0 and mx == 0:
        return g.copy(), xp.zeros((), F32), xp.zeros((), F32)
    (_, mask), (nmin, nmax) = _forward(x, mn, mx, qmin, qmax, NUDGED_TF | NUDGED_DIVIDE, None,
                                       op, want_mask=True)
    dmin, dmax = _outside_sums(g, x, xp.asarray(nmin), xp.asarray(nmax), None)
    dx = ste_backward(g, mask)
    if on_device:  # min == max == 0 selected on the device (no synchronisation)
        zero = _both_zero(mn, mx)
        return (xp.where(zero, g, dx), xp.where(zero, F32(0), dmin).astype(F32),
                xp.where(zero, F32(0), dmax).astype(F32))
    return dx, xp.asarray(dmin, F32), xp.asarray(dmax, F32)


# ------------------------------------------------------------ per channel
def fake_quant_with_min_max_vars_per_channel(inputs, min, max, num_bits=8, narrow_range=False,
                                             name=None):
    """Per-channel fake quantization along the last axis of ``inputs``.

    ``min`` / ``max`` have shape ``[d]``, ``d = inputs.shape[-1]``;
    ``t = (clamp(x) - nudged_min) * inv``; channels with
    ``min == max == 0`` give zeros.
    """
    op = "FakeQuantWithMinMaxVarsPerChannel"
    qmin, qmax = _range(num_bits, narrow_range)
    x = _tensor(inputs, op)
    mn, mx = _vars_minmax(min, max, 1, op)
    axis = _channels(x, mn, mx)
    y = _forward(x, mn, mx, qmin, qmax, NUDGED_TF, axis, op)[0]
    zero = _both_zero(mn, mx)
    xp = A.array_module(y)
    if xp is not np:  # (on the device, without a synchronisation)
        return xp.where(xp.asarray(zero), F32(0), y)
    if zero.any():
        y[..., zero] = 0
    return y


def fake_quant_with_min_max_vars_per_channel_gradient(gradients, inputs, min, max, num_bits=8,
                                                      narrow_range=False, name=None):
    """``(backprops_wrt_input, backprop_wrt_min[d], backprop_wrt_max[d])``, per
    channel along the last axis (see :func:`fake_quant_with_min_max_vars_gradient`)."""
    op = "FakeQuantWithMinMaxVarsPerChannelGradient"
    qmin, qmax = _range(num_bits, narrow_range)
    g, x = _tensor(gradients, op), _tensor(inputs, op)
    _same_size(g, x, op)
    mn, mx = _vars_minmax(min, max, 1, op)
    axis = _channels(x, mn, mx)
    (_, mask), (nmin, nmax) = _forward(x, mn, mx, qmin, qmax, NUDGED_TF, axis, op,
                                       want_mask=True)
    dx = ste_backward(g, mask)
    xp = A.array_module(x)
    dmin, dmax = _outside_sums(g, x, xp.asarray(nmin), xp.asarray(nmax), axis)
    zero = xp.asarray(_both_zero(mn, mx))
    if xp is not np:  # (selected on the device, without a synchronisation)
        return xp.where(zero, g, dx), xp.where(zero, F32(0), dmin), xp.where(zero, F32(0), dmax)
    if zero.any():
        dx[..., zero] = g[..., zero]
        dmin[zero] = 0
        dmax[zero] = 0
    return dx, dmin, dmax

