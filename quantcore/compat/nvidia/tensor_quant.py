"""PQ's ``tensor_quant.py``: the descriptor (``ScaledQuantDescriptor``, the
``QUANT_DESC_*`` presets) and the quantization functions (``tensor_quant``,
``fake_tensor_quant``, ``fake_affine_tensor_quant`` and their backwards),
with the argument checks they share."""
import logging

import numpy as np

from ... import _arrays as A
from ... import qparams as Q
from ...ops import _affine, _amax, _amax_fast, _nudged, affine_mode

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
    if unsigned and arr.size and bool(A.compare_exact(arr, "<", 0.0).any()):
        raise TypeError("Negative values encountered in unsigned quantization.")
    am = _as_param(amax, "amax", func)
    if bool(A.compare_exact(am, "<", 0.0).any()):
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
    if A.is_cupy_array(y):  # (an IEEE product, without CuPy's flush to zero, and rint)
        return A.array_module(y).rint(A.channel_arith("multiply", y, d.reshape(-1), axis))
    if axis is None:
        d = d[0]
    else:
        shape = [1] * ndim
        shape[axis] = d.shape[0]
        d = d.reshape(shape)
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
    return A.astype_exact(q, arr.dtype), A.array_module(arr).asarray(
        A.astype_exact(scale, arr.dtype))


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
