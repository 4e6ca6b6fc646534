"""NVIDIA ``pytorch_quantization`` (PQ v2.2.1) on NumPy arrays.

The descriptor, the quantization functions, the calibrators and
``TensorQuantizer`` of ``pytorch_quantization`` with PQ's names, argument
order, defaults and error messages (the project's NVIDIA / Horizon specification sections 1-4).
This layer only translates arguments: every element goes through
:func:`quantcore.ops._amax` (the shared ``qc_fq_amax`` formula),
:func:`quantcore.ops._affine` and :func:`quantcore.ops._nudged` (its range
mask, for the backward's select); statistics come from
:mod:`quantcore.calib`; scales from :mod:`quantcore.qparams`.

>>> import numpy as np
>>> from quantcore.compat.nvidia import fake_tensor_quant, tensor_quant
>>> x = np.array([-1.5, 0.3, 1.0], dtype=np.float32)
>>> q, scale = tensor_quant(x, np.float32(1.0))
>>> q, scale
(array([-127.,   38.,  127.], dtype=float32), array(127., dtype=float32))
>>> float(fake_tensor_quant(x, np.float32(1.0))[1])
0.29921260476112366

Decisions (the specification's decisions, "NVIDIA pytorch_quantization")
------------------------------------------------------------
- The CPU path is the reference: ``fake_tensor_quant`` computes
  ``q = clamp(rint(x * scale), min_bound, max_bound)`` with the multiplier
  ``scale = max_bound / amax`` and returns ``q / scale`` (a division).
  ``narrow_range`` is honoured everywhere (PQ's CUDA launch bug, which
  always clamps signed values to ``[-max_bound, max_bound]``, is not
  reproduced).  ``amax <= 2**-24`` gives zeros and scale 1.
- float16 input is computed in float32 and cast to float16 once at the end
  (as modelopt).  PQ divides in float16 by a float16-rounded scale; about
  20% of random float16 values differ from PQ by one float16 ulp.
- ``ScaledQuantDescriptor.dict()`` / ``to_yaml()`` produce PQ's output
  exactly (sorted keys, ``calib_method`` and ``narrow_range`` not written);
  ``from_yaml`` uses ``yaml.safe_load``.  PyYAML is an optional dependency
  of this module only and is imported when ``to_yaml`` / ``from_yaml`` run.
- ``HistogramCalibrator`` (``torch_hist=True``) reproduces torch's
  ``histc`` / ``linspace`` / ``arange`` rules; entropy needs no SciPy.

Further behaviour choices
-------------------------
- Arrays: ``inputs`` is a float16/32/64 array (or a Python scalar / list);
  ``amax`` may be a Python float, a list or an array.  A Python float or
  list amax is read as float32 (``torch.tensor`` would give float32); amax
  is computed in the compute dtype of the input (float32 for float16 and
  float32 input, float64 for float64 input).  PQ computes the scale of
  float64 input in the amax's dtype (float32 for a float32 amax) and
  multiplies in float64; quantcore computes it in float64 (results can
  differ at rare ties).
- Broadcasting: ``amax`` broadcasts NumPy-style, as in PQ.  One element is
  per tensor; a keep-dims amax with one non-1 dimension (``(C, 1, 1, 1)``,
  ``(1, C, 1, 1)``, ``(C,)`` against the last axis) maps to the core's
  per-channel kernel along that axis; any other broadcast (several non-1
  dimensions) runs the same kernel with one amax per element.  The result
  has the broadcast shape.
- Errors: PQ's messages and types: ``TypeError("Negative values encountered
  in unsigned quantization.")`` (checked first), ``ValueError("Negative values
  in amax")``.  ``num_bits`` must be an int in 2..16 (ValueError), an amax
  that does not broadcast raises ValueError (torch: RuntimeError).
- ``tensor_quant`` returns ``q`` as floats of the input dtype and the final
  scale (1 where ``amax <= 2**-24``) of amax's shape.  The core's amax
  kernel divides by ``scale`` at the end, so ``q`` is recovered exactly as
  ``rint(y * scale)`` (see :func:`_q_of`).  float16 input: ``q`` is cast
  to float16, and a scale above 65504 raises PQ's ValueError.
- Backward functions: ``fake_tensor_quant_backward(grad_outputs, inputs,
  amax)`` passes the gradient where ``|x| <= amax`` (inclusive, NaN input
  blocks it) and ``fake_affine_tensor_quant_backward`` where
  ``min_range <= x <= max_range``.  As PQ's ``torch.where(mask, grad, 0)``
  this is a select: the zero elsewhere is ``+0.0`` and a NaN gradient
  there gives 0.
- ``fake_affine_tensor_quant`` is per tensor (``min_range`` / ``max_range``
  one value each, as PQ documents); its step and zero are
  :func:`quantcore.qparams.pq_affine_qparams` in the compute dtype of the
  input.  For float16 input PQ computes in float16 (0-d tensors do not
  promote); quantcore in float32.
- Calibrators: :class:`HistogramCalibrator` is
  :class:`quantcore.calib.HistogramCalibrator`; :class:`MaxCalibrator` wraps
  :class:`quantcore.calib.MaxCalibrator` so that a shape change raises PQ's
  ``RuntimeError("amax shape changed!")`` and ``num_bits`` (unused by the
  max statistic) is stored unchecked, as PQ.  NaN input raises ValueError
  in both (PQ stores NaN / fails in ``histc``).  Results are numpy arrays
  (0-d per tensor, keep-dims per channel).
- ``TensorQuantizer``: state lives in numpy arrays (``_amax`` float32, or
  the float dtype of an ndarray given to the ``amax`` setter).  The dynamic
  amax is a :class:`quantcore.calib.MaxCalibrator` reduction (NaN input
  raises ValueError; PQ would produce NaN).  ``scale_amax`` multiplies amax
  in amax's dtype.  Messages that PQ logs are sent to the ``logging``
  logger of this module.  Not supported: E4M3 (``num_bits=(4, 3)``:
  NotImplementedError on the quantize step), ONNX export /
  ``use_fb_fake_quant``, ``_pre_quant_scale``, state-dict loading hooks,
  and learning amax: ``learn_amax`` creates the :class:`Clip` stage and its
  forward (``max(min(x, clip_max), clip_min)``, NumPy, exact) runs, but there
  is no autograd, so the clip values never change (the PACT gradient
  ``gx = g*[min < x < max]``, ``gmax = sum(g*[x >= max])``,
  ``gmin = sum(g*[x <= min])`` is not provided).
- Axes (``axis`` of the descriptor, ``MaxCalibrator`` and the dynamic amax
  of ``TensorQuantizer``): one rule everywhere, the seed page's (PQ 2.1):
  the axes that keep their own amax, each in ``[-rank, rank)``; a negative
  axis counts from the end (``axis=(-1,)`` is per channel along the last
  axis) and an axis outside that range raises ValueError.  PQ 2.1's code
  compares ``i in axis`` for ``i in range(rank)``, so there a negative or
  out-of-range axis matches no dimension and the amax silently becomes per
  tensor; that is not reproduced.
- Predefined descriptors follow PQ HEAD: weights ``axis=(0)``, ConvTranspose
  weights ``axis=(1)`` (PQ before TRT 10.9 and modelopt used 0).
"""
import logging

import numpy as np

from ... import _arrays as A
from ... import calib as _calib
from ... import qparams as Q
from ...ops import _affine, _amax, _amax_fast, _nudged, affine_mode

__all__ = [
    "ScaledQuantDescriptor", "QuantDescriptor",
    "QUANT_DESC_8BIT_PER_TENSOR", "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "tensor_quant", "fake_tensor_quant", "fake_tensor_quant_backward",
    "fake_affine_tensor_quant", "fake_affine_tensor_quant_backward",
    "MaxCalibrator", "HistogramCalibrator", "TensorQuantizer", "Clip",
]

F32 = np.float32
_F32_MAX = float(np.finfo(F32).max)
_log = logging.getLogger(__name__)


# ------------------------------------------------------------ descriptor
class ScaledQuantDescriptor:
    """How a tensor is quantized (PQ's ``ScaledQuantDescriptor``).

    Parameters
    ----------
    num_bits : int or (4, 3), default 8
        An int (a bool passes, as in PQ); negative raises ValueError, 0 only
        logs an error; ``(4, 3)`` is E4M3.  Anything else raises TypeError.
    name : str or None
    **kwargs
        ``fake_quant=True``, ``axis=None`` (not checked), ``amax=None``
        (a Python float, list or ndarray; stored as a float32 ndarray),
        ``learn_amax=False`` (needs ``axis=None``), ``scale_amax=None``,
        ``calib_method="max"`` (not checked), ``unsigned=False``,
        ``narrow_range=False``.  Any other key raises TypeError
        ``"Unused keys: dict_keys([...])"``.

    All fields are read-only properties.  ``==`` compares every field
    (a multi-element amax raises ValueError, as in PQ).
    """

    def __init__(self, num_bits=8, name=None, **kwargs):
        if isinstance(num_bits, int):
            if num_bits < 0:
                raise ValueError("num_bits must be > 0, not {}.".format(num_bits))
            if num_bits == 0:
                _log.error("num_bits is 0. This will result in the tensor being quantized to all "
                           "zeros. This mode should only be used for debugging purposes.")
        elif num_bits != (4, 3):
            raise TypeError("num_bits must be a postive integer or tuple (4,3), not {}.".format(
                type(num_bits)))
        self._num_bits = num_bits
        if not isinstance(name, str) and name is not None:
            raise TypeError("name must be a string or None, not {}.".format(type(name)))
        self._name = name

        self._fake_quant = kwargs.pop("fake_quant", True)
        self._axis = kwargs.pop("axis", None)
        self._learn_amax = kwargs.pop("learn_amax", False)
        if self._learn_amax and self._axis is not None:
            raise TypeError("axis is ignored and must be None when learn_amax is true, got {}."
                            .format(type(self._axis)))
        amax = kwargs.pop("amax", None)
        if amax is not None:
            if not isinstance(amax, (float, list, np.ndarray)):
                raise TypeError("amax must be float, list or ndarray, not {}".format(type(amax)))
            self._amax = np.array(amax, dtype=np.float32)
        else:
            self._amax = amax
        self._scale_amax = kwargs.pop("scale_amax", None)
        self._calib_method = kwargs.pop("calib_method", "max")
        self._unsigned = kwargs.pop("unsigned", False)
        self._narrow_range = kwargs.pop("narrow_range", False)
        if kwargs:
            raise TypeError("Unused keys: {}".format(kwargs.keys()))

    num_bits = property(lambda self: self._num_bits)
    name = property(lambda self: self._name)
    fake_quant = property(lambda self: self._fake_quant)
    axis = property(lambda self: self._axis)
    amax = property(lambda self: self._amax)
    learn_amax = property(lambda self: self._learn_amax)
    scale_amax = property(lambda self: self._scale_amax)
    calib_method = property(lambda self: self._calib_method)
    unsigned = property(lambda self: self._unsigned)
    narrow_range = property(lambda self: self._narrow_range)

    def __str__(self):
        s = (self._name + ": ") if self._name is not None else "QuantDescriptor"
        s += "({}{}bit".format("unsigned " if self._unsigned else "", self._num_bits)
        s += " fake" if self._fake_quant else " real"
        s += " axis={}".format(self._axis if self._axis is not None else " per-tensor")
        if self._amax is not None:
            s += " amax={_amax}"
            s += " full_range"
        if self._learn_amax:
            s += " learn_amax"
        if self._scale_amax:
            s += " scale_amax={_scale_amax}"
        s += ")"
        return s.format(**self.__dict__)

    def __repr__(self):
        return self.__str__()

    def __eq__(self, rhs):
        """Compare two descriptors field by field (PQ compares ``__dict__``)."""
        return self.__dict__ == rhs.__dict__

    __hash__ = None

    def dict(self):
        """The fields that differ from their defaults (PQ's serialization).

        ``num_bits`` and ``name`` always; ``fake_quant`` if False, ``axis``
        if not None (as given), ``amax`` as ``amax.tolist()``, ``scale_amax``
        if not None, ``learn_amax`` and ``unsigned`` if true.
        ``calib_method`` and ``narrow_range`` are never written.
        """
        obj = {"num_bits": self._num_bits, "name": self._name}
        if not self._fake_quant:
            obj["fake_quant"] = self._fake_quant
        if self._axis is not None:
            obj["axis"] = self._axis
        if self._amax is not None:
            obj["amax"] = self._amax.tolist()
        if self._scale_amax is not None:
            obj["scale_amax"] = self._scale_amax
        if self._learn_amax:
            obj["learn_amax"] = self._learn_amax
        if self._unsigned:
            obj["unsigned"] = self._unsigned
        return obj

    def to_yaml(self):
        """YAML text of :meth:`dict` (``axis`` as a list; an int axis raises
        TypeError, as in PQ): ``yaml.dump(d, width=120)``, keys sorted."""
        yaml = _import_yaml()
        obj = self.dict()
        if "axis" in obj:
            obj["axis"] = list(obj["axis"])
        return yaml.dump(obj, width=120)

    @classmethod
    def from_yaml(cls, yaml_str):
        """A descriptor from :meth:`to_yaml` text (``yaml.safe_load``; a
        ``(4, 3)`` num_bits fails there, as in PQ)."""
        yaml = _import_yaml()
        obj = yaml.safe_load(yaml_str)
        if "axis" in obj:
            obj["axis"] = tuple(obj["axis"])
        return cls(**obj)


def _import_yaml():
    try:
        import yaml
    except ImportError as exc:
        raise ImportError("quantcore.compat.nvidia: to_yaml / from_yaml need PyYAML "
                          "(pip install pyyaml)") from exc
    return yaml


QuantDescriptor = ScaledQuantDescriptor

QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=(0))
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1))
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1))
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=(1))


# ------------------------------------------------------ argument helpers
def _as_param(value, name, func):
    """amax / range argument as a float ndarray (Python numbers: float32); a
    cupy array stays on the device."""
    if A.is_cupy_array(value):
        arr = value
    elif isinstance(value, np.ndarray) or isinstance(value, np.generic):
        arr = np.asarray(value)
    else:
        try:
            arr = np.asarray(value, dtype=F32)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{func}: {name} must be a float or an array of floats, got "
                            f"{type(value).__name__}") from exc
    if arr.dtype.kind in "iub":
        arr = arr.astype(F32)
    if arr.dtype.kind != "f":
        raise TypeError(f"{func}: {name} must be a float array, got {arr.dtype}")
    if arr.dtype == np.float16:
        arr = arr.astype(F32)  # PQ upcasts a half amax
    if arr.size == 0:
        raise ValueError(f"{func}: {name} is empty")
    return arr


def _num_bits(num_bits, func):
    if num_bits == (4, 3):
        raise NotImplementedError(f"{func}: E4M3 (num_bits=(4, 3)) is not supported by quantcore")
    nb = A.as_int(num_bits, "num_bits", func)
    if not 2 <= nb <= 16:
        raise ValueError(f"{func}: num_bits must be in 2..16, got {nb}")
    return nb


def _quant_args(inputs, amax, num_bits, unsigned, func):
    """PQ's checks, in PQ's order."""
    arr = A.as_float_array(inputs, "inputs", func)
    nb = _num_bits(num_bits, func)
    if unsigned and arr.size and bool((arr < 0).any()):
        raise TypeError("Negative values encountered in unsigned quantization.")
    am = _as_param(amax, "amax", func)
    if bool((am < 0).any()):
        raise ValueError("Negative values in amax")
    return arr, am, nb


def _plan(arr, param, func):
    """Map NumPy broadcasting of ``param`` against ``arr`` onto the core's
    per-tensor / per-channel kernels.

    Returns ``(x, p, axis, shape)``: the input for the kernel, the 1-D
    parameter, the channel axis (None per tensor) and the shape to give the
    result.  Several non-1 dimensions become one channel per element.
    """
    shape = _broadcast(arr.shape, param.shape, f"{func}: amax of shape {param.shape} does not "
                       f"broadcast against inputs of shape {arr.shape}")
    xp = A.array_module(arr)
    if A.is_cupy_array(param) and xp is np:  # (numpy x, device amax: a small copy)
        param = param.get()
    x = arr if arr.shape == shape else xp.broadcast_to(arr, shape)
    if param.size == 1:
        return x, param.reshape(1), None, shape
    p = param.reshape((1,) * (len(shape) - param.ndim) + param.shape)
    big = [d for d in range(len(shape)) if p.shape[d] != 1]
    if len(big) == 1:
        return x, p.reshape(-1), big[0], shape
    pm = A.array_module(p)
    x = xp.ascontiguousarray(x).reshape(-1)
    return x, pm.ascontiguousarray(pm.broadcast_to(p, shape)).reshape(-1), 0, shape


def _q_of(y, div, axis, ndim):
    """The integers ``q`` of the amax kernel's output ``y = q / div``.

    ``rint(y * div)`` in y's dtype gives q exactly: ``y = q/div (1 + d1)``
    and ``y * div = q (1 + d1)(1 + d2)`` with ``|d| <= 2**-24``, an error
    below ``|q| * 2**-22.9 < 2**-7`` for ``|q| <= 2**15``; the sign of a zero
    is kept.  (The core's ``qc_fq_amax`` has no "output q" mode yet.)
    """
    d = div.astype(y.dtype)
    if axis is None:
        d = d[0]
    else:
        shape = [1] * ndim
        shape[axis] = d.shape[0]
        d = d.reshape(shape)
    if A.is_cupy_array(y):  # (an IEEE product and rint of floats)
        return A.array_module(y).rint(y * A.array_module(y).asarray(d)).astype(y.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.rint(y * d).astype(y.dtype)


# ------------------------------------------------------------ functions
def fake_tensor_quant(inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
    """PQ's ``fake_tensor_quant``: quantize with ``amax`` and dequantize.

    In the compute dtype (float32 for float16 / float32 input)::

        max_bound = 2**(num_bits - 1 + unsigned) - 1
        scale     = max_bound / amax                  (a multiplier)
        q         = clamp(rint(x * scale), min_bound, max_bound)
        out       = q / scale
        min_bound = 0 (unsigned), -max_bound (narrow_range), -max_bound - 1

    ``amax <= 2**-24`` gives zeros.  ``amax`` broadcasts NumPy-style
    (per channel: a keep-dims amax such as ``(C, 1, 1, 1)``).

    Returns
    -------
    ndarray of the input's dtype and the broadcast shape.
    """
    func = "fake_tensor_quant"
    if type(num_bits) is int and not unsigned and isinstance(amax, (float, np.floating)) and \
            0 <= amax <= _F32_MAX:
        # per tensor, signed: the core's fast path (None when it does not
        # apply: the general path then checks and computes)
        am = amax if isinstance(amax, np.floating) else F32(amax)  # PQ: a number is float32
        res = _amax_fast(inputs, am, num_bits, False, bool(narrow_range), None, False)
        if res is not None:
            return res
    arr, am, nb = _quant_args(inputs, amax, num_bits, unsigned, func)
    x, p, axis, shape = _plan(arr, am, func)
    y = _amax(x, p, nb, unsigned=bool(unsigned), narrow_range=bool(narrow_range), axis=axis,
              func=func)
    return y.reshape(shape)


def tensor_quant(inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
    """PQ's ``tensor_quant``: ``(q, scale)`` with ``q`` as floats.

    ``q = clamp(rint(x * scale), min_bound, max_bound)`` as in
    :func:`fake_tensor_quant`; ``scale = max_bound / amax`` (1 where
    ``amax <= 2**-24``), of amax's shape, in the input dtype.  ``q / scale``
    dequantizes.

    Returns
    -------
    (q, scale) : arrays of the input's dtype, on the input's device (a host
    amax gives a scale copied there).
    """
    func = "tensor_quant"
    arr, am, nb = _quant_args(inputs, amax, num_bits, unsigned, func)
    work = A.compute_dtype(arr.dtype)
    x, p, axis, shape = _plan(arr.astype(work, copy=False), am, func)
    y = _amax(x, p, nb, unsigned=bool(unsigned), narrow_range=bool(narrow_range), axis=axis,
              func=func)
    _, div = Q.amax_multiplier(p.astype(work), nb, bool(unsigned))
    q = _q_of(y, div, axis, y.ndim).reshape(shape)
    _, scale = Q.amax_multiplier(am.astype(work), nb, bool(unsigned))
    scale = scale.reshape(am.shape)
    if arr.dtype == np.float16 and scale.size and float(scale.max()) > 65504:
        raise ValueError("scale is too large for FP16 with amax={}".format(am))
    return q.astype(arr.dtype), A.array_module(arr).asarray(scale.astype(arr.dtype))


def fake_tensor_quant_backward(grad_outputs, inputs, amax):
    """Gradient of :func:`fake_tensor_quant` / :func:`tensor_quant` with
    respect to ``inputs``: clipped straight-through estimator::

        grad_inputs = grad_outputs where |x| <= amax (inclusive), else 0

    amax gets no gradient (PQ returns None for it).
    """
    func = "fake_tensor_quant_backward"
    arr = A.as_float_array(inputs, "inputs", func)
    g = A.as_float_array(grad_outputs, "grad_outputs", func)
    am = _as_param(amax, "amax", func)
    x, p, axis, shape = _plan(arr, am, func)
    _, mask = _amax(x, p, 8, axis=axis, mask=True, func=func)
    return _ste(g, mask.reshape(shape), func)


def _broadcast(shape_a, shape_b, message):
    """numpy's broadcast shape, or ValueError(message)."""
    try:
        return np.broadcast_shapes(shape_a, shape_b)
    except ValueError:
        raise ValueError(message) from None


def _ste(g, mask, func):
    shape = _broadcast(g.shape, mask.shape, f"{func}: grad_outputs of shape {g.shape} does "
                       f"not broadcast against the inputs' shape {mask.shape}")
    # PQ: torch.where(mask, grad_outputs, zero), a select (+0.0 outside)
    xp = A.array_module(g)
    return xp.where(xp.broadcast_to(mask, shape).view(np.bool_), xp.broadcast_to(g, shape),
                    g.dtype.type(0))


def _affine_args(inputs, min_range, max_range, num_bits, func):
    arr = A.as_float_array(inputs, "inputs", func)
    nb = _num_bits(num_bits, func)
    lo = _as_param(min_range, "min_range", func)
    hi = _as_param(max_range, "max_range", func)
    if lo.size != 1 or hi.size != 1:
        raise ValueError(f"{func}: min_range and max_range must be single values (per-tensor "
                         f"quantization), got shapes {lo.shape} and {hi.shape}")
    return arr, lo, hi, nb


def fake_affine_tensor_quant(inputs, min_range, max_range, num_bits=8):
    """PQ's ``fake_affine_tensor_quant`` (gemmlowp-style, per tensor).

    With ``step, quant_zero`` from :func:`quantcore.qparams.pq_affine_qparams`
    (compute dtype)::

        q   = clamp(round_half_even(x / step) - quant_zero, -2**(n-1), 2**(n-1) - 1)
        out = (q + quant_zero) * step
    """
    func = "fake_affine_tensor_quant"
    arr, lo, hi, nb = _affine_args(inputs, min_range, max_range, num_bits, func)
    work = A.compute_dtype(arr.dtype)
    step, qzero = Q.pq_affine_qparams(lo, hi, nb, dtype=work)
    qmin, qmax = -2 ** (nb - 1), 2 ** (nb - 1) - 1
    mode = affine_mode("half_even", scale_op="div", func=func)
    # the kernel adds the zero point after rounding: round(v) + (-qz) == round(v) - qz
    return _affine(arr, step, -qzero, qmin, qmax, mode, func=func)


def fake_affine_tensor_quant_backward(grad_outputs, inputs, min_range, max_range):
    """Gradient of :func:`fake_affine_tensor_quant`: ``grad_outputs`` where
    ``min_range <= x <= max_range`` (inclusive), else 0."""
    func = "fake_affine_tensor_quant_backward"
    arr, lo, hi, _ = _affine_args(inputs, min_range, max_range, 8, func)
    g = A.as_float_array(grad_outputs, "grad_outputs", func)
    one = np.ones(1)
    # the nudged kernel's mask is exactly nmin <= x <= nmax
    _, mask = _nudged(arr, lo, hi, one, one, np.zeros(1), 0, mask=True, func=func)
    return _ste(g, mask, func)


# ----------------------------------------------------------- calibrators
class MaxCalibrator(_calib.MaxCalibrator):
    """PQ's ``MaxCalibrator(num_bits, axis, unsigned, track_amax=False)``:
    :class:`quantcore.calib.MaxCalibrator` with PQ's shape-change error
    (``RuntimeError("amax shape changed!")``); ``num_bits`` is not used by
    the statistic and stored unchecked."""

    def __init__(self, num_bits=8, axis=None, unsigned=False, track_amax=False):
        super().__init__(8, axis, unsigned, track_amax)
        self._num_bits = num_bits

    def collect(self, x):
        """Update the running amax with ``max |x|`` over the reduced axes (a
        cupy x on the device: the amax stays a device array; one byte, the
        NaN check, is read)."""
        try:
            super().collect(x)
        except ValueError as exc:
            if "amax shape changed" in str(exc):
                raise RuntimeError("amax shape changed!") from exc
            raise


HistogramCalibrator = _calib.HistogramCalibrator


# -------------------------------------------------------- TensorQuantizer
def _settable(attr):
    """A property reading and writing ``attr`` as given (PQ's plain
    getter / setter pairs)."""
    return property(lambda self: getattr(self, attr),
                    lambda self, value: setattr(self, attr, value))


class Clip:
    """PQ's ``Clip`` stage, forward only: ``max(min(x, clip_value_max),
    clip_value_min)`` (NaN propagates).  Learnable values must be scalars."""

    def __init__(self, clip_value_min, clip_value_max, learn_min=False, learn_max=False):
        for value, learn in ((clip_value_min, learn_min), (clip_value_max, learn_max)):
            if learn and not isinstance(value, float) and np.size(value) != 1:
                raise ValueError("clip_value_min/clip_value_max must be scalar for initilizing "
                                 "learnable range.")
        self.clip_value_min = np.array(clip_value_min, dtype=F32)
        self.clip_value_max = np.array(clip_value_max, dtype=F32)
        self.learn_min = bool(learn_min)
        self.learn_max = bool(learn_max)

    def __call__(self, inputs):
        return self.forward(inputs)

    def forward(self, inputs):
        """``max(min(x, clip_value_max), clip_value_min)`` on x's device (the
        two clip values are copied there)."""
        x = A.as_float_array(inputs, "inputs", "Clip")
        xp = A.array_module(x)
        out = xp.minimum(x, xp.asarray(self.clip_value_max.astype(x.dtype)))
        return xp.maximum(out, xp.asarray(self.clip_value_min.astype(x.dtype)))

    def __repr__(self):
        return f"Clip(min={self.clip_value_min}, max={self.clip_value_max})"


class TensorQuantizer:
    """PQ's ``TensorQuantizer``: calibration, clipping and (fake) quantization
    of one tensor, configured by a :class:`QuantDescriptor`.

    ``tq(x)``, in order: disabled -> return x; calibration on -> the
    calibrator collects x; clip on -> ``out = clip(x)``; quant on -> amax
    (the ``_amax`` buffer, else the dynamic ``max |x|`` over the axes not in
    ``axis``, times ``scale_amax``; with ``learn_amax`` the clip range) and
    :func:`fake_tensor_quant` with the descriptor's ``narrow_range``, or
    :func:`tensor_quant` (always narrow, PQ does not pass narrow_range) for
    real quantization, which stores ``scale``.

    See the module docstring for what is not supported.
    """

    def __init__(self, quant_desc=QuantDescriptor(), disabled=False, if_quant=True,
                 if_clip=False, if_calib=False):
        self._num_bits = quant_desc.num_bits
        self._fake_quant = quant_desc.fake_quant
        self._axis = quant_desc.axis
        self._scale_amax = quant_desc.scale_amax
        self._learn_amax = quant_desc.learn_amax
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range

        self._scale = None if not quant_desc.fake_quant else 1.0
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = False
        self._if_calib = if_calib

        if quant_desc.amax is not None:
            self._amax = np.array(quant_desc.amax, dtype=F32)

        if self._learn_amax:
            init_amax = quant_desc.amax if quant_desc.amax is not None else 1.0
            self.clip = Clip(-init_amax, init_amax, learn_min=True, learn_max=True)
            self.enable_clip()
        if if_clip:
            self.enable_clip()

        if quant_desc.calib_method == "histogram":
            _log.info("Creating histogram calibrator")
            self._calibrator = HistogramCalibrator(num_bits=self._num_bits, axis=self._axis,
                                                   unsigned=self._unsigned)
        elif quant_desc.calib_method == "max":
            _log.info("Creating Max calibrator")
            self._calibrator = MaxCalibrator(num_bits=self._num_bits, axis=self._axis,
                                             unsigned=self._unsigned)
        # any other calib_method leaves _calibrator unset (AttributeError later), as PQ

    # ----------------------------------------------------------- properties
    num_bits = _settable("_num_bits")
    unsigned = _settable("_unsigned")
    narrow_range = _settable("_narrow_range")

    @property
    def scale(self):
        if self._fake_quant:
            _log.error("Fake quantize mode doesn't use scale explicitly!")
        if self._scale is None:
            _log.critical("Accessing scale before quantizing any tensor!")
        return self._scale

    @property
    def amax(self):
        """The amax buffer, or None (dynamic amax)."""
        return getattr(self, "_amax", None)

    @amax.setter
    def amax(self, value):
        if value is None:
            _log.error("Setting amax no None is meaningless.")
            return
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            new = np.array(value)
        else:
            new = np.array(value, dtype=F32)
        if not hasattr(self, "_amax"):
            self._amax = new
        else:
            if self._amax.shape != new.shape:
                raise RuntimeError("Changing shape when setting amax is not allowed.")
            np.copyto(self._amax, new, casting="unsafe")

    @property
    def step_size(self):
        if not hasattr(self, "_amax"):
            _log.error("step_size is undefined under dynamic amax mode!")
            return None
        return self._amax / (2.0 ** (self._num_bits - 1 + int(self._unsigned)) - 1.0)

    axis = property(lambda self: self._axis)
    fake_quant = property(lambda self: self._fake_quant)

    # ------------------------------------------------------------- switches
    def disable(self):
        """Bypass the module."""
        self._disabled = True

    def enable(self):
        self._disabled = False

    def disable_clip(self):
        """Disable the clip stage."""
        self._if_clip = False

    def enable_clip(self):
        """Enable the clip stage (needs ``learn_amax``)."""
        _log.warning("Enable `clip` stage for amax learning.")
        if not self._learn_amax:
            raise ValueError("learn_amax is False. Cannot enable clip.")
        self._if_clip = True

    def disable_calib(self):
        self._if_calib = False

    def enable_calib(self):
        if self._calibrator is None:
            raise ValueError("Calibrator was not created, cannot enable calibration.")
        self._if_calib = True

    def disable_quant(self):
        self._if_quant = False

    def enable_quant(self):
        self._if_quant = True

    # ------------------------------------------------------------- amax
    def load_calib_amax(self, *args, **kwargs):
        """Set the amax buffer from the calibrator's ``compute_amax(*args,
        **kwargs)`` (``strict=True`` keyword: a None result raises
        RuntimeError; with ``strict=False`` amax becomes NaN)."""
        strict = kwargs.pop("strict", True)
        if getattr(self, "_calibrator", None) is None:
            raise RuntimeError("Calibrator not created.")
        calib_amax = self._calibrator.compute_amax(*args, **kwargs)
        if calib_amax is None:
            err_msg = ("Calibrator returned None. This usually happens when calibrator hasn't "
                       "seen any tensor.")
            if not strict:
                _log.warning(err_msg)
                _log.warning("Set amax to NaN!")
                calib_amax = np.array(np.nan, dtype=F32)
            else:
                raise RuntimeError(err_msg + " Passing 'strict=False' to `load_calib_amax()` "
                                   "will ignore the error.")
        calib_amax = np.asarray(A.to_host(calib_amax))  # (a device amax: C values read)
        if not hasattr(self, "_amax"):
            self._amax = calib_amax.copy()
        else:
            try:
                np.copyto(self._amax, calib_amax, casting="unsafe")
            except ValueError as exc:
                raise RuntimeError(f"cannot copy a calibrated amax of shape {calib_amax.shape} "
                                   f"into the amax buffer of shape {self._amax.shape}") from exc

    def init_learn_amax(self):
        """Initialize the learned range from the fixed amax."""
        if self._learn_amax is False:
            raise RuntimeError("Called init_learn_amax with learn_amax=False.")
        amax = np.asarray(self._amax)
        init = amax.max() if amax.size != 1 else amax.reshape(())
        self.clip.clip_value_min = np.array(-init, dtype=F32)
        self.clip.clip_value_max = np.array(init, dtype=F32)

    def _get_amax(self, inputs):
        if hasattr(self, "_amax"):
            amax = self._amax
        else:
            # the calibrator's axis rule (module docstring, "Axes")
            reducer = _calib.MaxCalibrator(axis=self._axis)
            reducer.collect(inputs)
            amax = reducer.compute_amax()
        if A.is_cupy_array(amax):  # (a dynamic amax of cupy inputs: on the device)
            if self._scale_amax is not None:
                amax = (amax * amax.dtype.type(self._scale_amax)).astype(amax.dtype)
            return amax if amax.dtype in (np.float32, np.float64) else amax.astype(F32)
        if self._scale_amax is not None:
            amax = np.asarray(amax)
            amax = (amax * amax.dtype.type(self._scale_amax)).astype(amax.dtype)
        amax = np.asarray(amax)
        if amax.dtype not in (np.float32, np.float64):
            amax = amax.astype(F32)
        return amax

    # -------------------------------------------------------------- forward
    def _quant_forward(self, inputs):
        if self._num_bits == (4, 3):
            raise NotImplementedError("TensorQuantizer: E4M3 (num_bits=(4, 3)) is not "
                                      "supported by quantcore")
        if self._learn_amax:
            inputs = self.clip(inputs)
            amax = np.maximum(-self.clip.clip_value_min, self.clip.clip_value_max)
        else:
            amax = self._get_amax(inputs)
        if self._fake_quant:
            return fake_tensor_quant(inputs, amax, self._num_bits, self._unsigned,
                                     self._narrow_range)
        outputs, self._scale = tensor_quant(inputs, amax, self._num_bits, self._unsigned)
        return outputs

    def __call__(self, inputs):
        return self.forward(inputs)

    def forward(self, inputs):
        """Calibrate / clip / quantize ``inputs`` as the switches say.  cupy
        inputs are calibrated and quantized on the device (a fixed amax is
        copied down, C values; the Clip stage of learn_amax too)."""
        if self._disabled:
            return inputs
        inputs = A.as_float_array(inputs, "inputs", "TensorQuantizer")
        outputs = inputs
        if self._if_calib:
            if self._calibrator is None:
                raise RuntimeError("Calibrator was not created.")
            self._calibrator.collect(inputs)
        if self._if_clip:
            if not self._learn_amax:
                raise RuntimeError("Clip without learning amax is not implemented.")
            outputs = self.clip(inputs)
        if self._if_quant:
            outputs = self._quant_forward(inputs)
        return outputs

    # ----------------------------------------------------------------- repr
    def _short_amax(self, fmt=".4f"):
        if not hasattr(self, "_amax"):
            return "dynamic"
        if self._amax.size == 1:
            return "{:{fmt}}".format(float(self._amax.reshape(-1)[0]), fmt=fmt)
        return "[{:{fmt}}, {:{fmt}}]({})".format(float(self._amax.min()), float(self._amax.max()),
                                                 self._amax.size, fmt=fmt)

    def extra_repr(self):
        if self._disabled:
            return "disabled"
        s = "{}{}bit".format("unsigned " if self._unsigned else "", self._num_bits)
        s += " narrow" if self._narrow_range else ""
        s += " fake" if self._fake_quant else ""
        s += " axis={}".format(self._axis) if self._axis is not None else " per-tensor"
        s += " amax={}".format(self._short_amax())
        s += " *{}".format(self._scale_amax) if self._scale_amax else ""
        s += " learned" if self._learn_amax else ""
        calibrator = getattr(self, "_calibrator", None)
        s += " calibrator={}".format(type(calibrator).__name__) if calibrator is not None else ""
        s += " scale={}".format(self._scale) if self._scale is not None else ""
        s += " quant" if self._if_quant else ""
        s += " clip" if self._if_clip else ""
        s += " calib" if self._if_calib else ""
        return s

    def __repr__(self):
        return f"TensorQuantizer({self.extra_repr()})"
