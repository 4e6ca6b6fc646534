"""Torch dtypes and qschemes, integer ranges, ``with_args`` partials and
the module base (state dicts with torch's keys and versions, buffers shared
like torch's) of :mod:`quantcore.compat.torch`."""
import numbers

import numpy as np

from ... import _arrays as A
from ..._switches import TrainEval
from ..._locks import Locked, locked
from ...observers import store_into
from .._errors import AssertionValueError, RuntimeValueError
from .._partial import _with_args, _with_callable_args

F32 = np.float32


#: torch dtype name -> (iinfo min, iinfo max, bits); float8 has no iinfo
_IINFO = {
    "quint8": (0, 255, 8), "qint8": (-128, 127, 8), "qint32": (-2 ** 31, 2 ** 31 - 1, 32),
    "quint4x2": (0, 255, 8), "int8": (-128, 127, 8), "uint8": (0, 255, 8),
    "int16": (-2 ** 15, 2 ** 15 - 1, 16), "uint16": (0, 2 ** 16 - 1, 16),
    "int32": (-2 ** 31, 2 ** 31 - 1, 32),
}
_OBSERVER_DTYPES = ("qint8", "quint8", "quint4x2", "qint32", "int8", "uint8", "int16",
                    "int32", "float8_e5m2", "float8_e4m3fn", "uint16")
_QSCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
             "per_channel_symmetric", "per_channel_affine_float_qparams")

_PER_TENSOR_ONLY = ("{}'s qscheme only support torch.per_tensor_symmetric" + " " * 21
                    + "and torch.per_tensor_affine.")
_PER_CHANNEL_ONLY = ("{}'s qscheme only support" + " " * 21 + "torch.per_channel_symmetric, "
                     "torch.per_channel_affine and torch.per_channel_affine_float_qparams.")
_IINFO_MSG = "torch.iinfo() requires an integer input type. Use torch.finfo to handle 'torch.iinfo'"
_REDUCE_RANGE_WARNING = (
    "Please use quant_min and quant_max to specify the range for observers."
    "                     reduce_range will be deprecated in a future release of PyTorch.")
_NO_DATA_WARNING = ("must run observer before calling calculate_qparams. "
                    "Returning default values.")


def _name(value, what):
    """A dtype / qscheme string without its ``torch.`` prefix; torch's own
    ``torch.dtype`` / ``torch.qscheme`` objects give their name (their
    ``str`` is ``"torch.qint8"``)."""
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "qscheme"):
        value = str(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{what} must be a torch dtype / qscheme or its name, such as "
            f"torch.quint8, 'quint8' or 'torch.per_tensor_affine', got {value!r}")
    return value[6:] if value.startswith("torch.") else value


def _supported_name(value, what, supported, message):
    """``_name(value)`` if it is in ``supported``, else torch's
    AssertionError (``message`` formatted with ``repr(value)``)."""
    name = _name(value, what)
    if name not in supported:
        raise AssertionValueError(message.format(value))
    return name


def _dtype(value):
    return _supported_name(
        value, "dtype", _OBSERVER_DTYPES,
        "Default Observer only works for (torch.qint8, torch.quint8, torch.quint4x2, "
        "torch.qint32, torch.int8, torch.uint8, torch.int16, torch.int32, "
        "torch.float8_e5m2, torch.float8_e4m3fn, torch.uint16) data type (got {!r})")


def _qscheme(value):
    return _supported_name(
        value, "qscheme", _QSCHEMES,
        "Default Observer only works for per_tensor_affine, per_tensor_symmetric, "
        "per_channel_affine, per_channel_symmetric and per_channel_float_qparams "
        "quantization scheme, got {!r}")


def _is_per_tensor(q):
    return q in ("per_tensor_affine", "per_tensor_symmetric")


def _is_per_channel(q):
    return q in ("per_channel_affine", "per_channel_symmetric",
                 "per_channel_affine_float_qparams")


def _is_symmetric(q):
    return q in ("per_tensor_symmetric", "per_channel_symmetric")


def _qrange(dtype, reduce_range, quant_min, quant_max):
    """torch.ao.quantization.utils.validate_qmin_qmax + calculate_qmin_qmax."""
    custom = quant_min is not None and quant_max is not None
    if not custom:
        if dtype in ("qint8", "int8"):
            return (-64, 63) if reduce_range else (-128, 127), False
        if dtype in ("quint8", "uint8"):
            return (0, 127) if reduce_range else (0, 255), False
        if dtype in ("qint32", "int32"):
            return (-2 ** 31, 2 ** 31 - 1), False
        if dtype == "uint16":
            return (0, 2 ** 16 - 1), False
        if dtype == "int16":
            return (-2 ** 15, 2 ** 15 - 1), False
        return (0, 15), False
    qmin, qmax = quant_min, quant_max
    if not isinstance(qmin, numbers.Real) or not isinstance(qmax, numbers.Real):
        raise TypeError(f"torch observer: quant_min / quant_max must be integers, got "
                        f"{quant_min!r}, {quant_max!r}")
    if not qmin <= 0 <= qmax:
        raise AssertionValueError("Used-specified quantization range must include 0.")
    if qmin >= qmax:
        raise AssertionValueError("qmin must be strictly less than qmax for user-specified "
                                  "quantization range.")
    n = qmax - qmin + 1
    if dtype in ("qint8", "int8") and not 0 < n <= 256:
        raise AssertionValueError(
            "quantization range should be positive and not exceed the maximum "
            "bit range (=256).")
    if dtype in ("qint32", "int32") and not 0 < n <= 2 ** 32:
        raise AssertionValueError(
            "quantization range should be positive and not exceed the maximum "
            "bit range (=4294967296).")
    # torch validates the numbers first; a non-integral bound (which torch
    # would carry on with) is refused after its checks
    qmin = A.as_int(quant_min, "quant_min", "torch observer")
    qmax = A.as_int(quant_max, "quant_max", "torch observer")
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    return (qmin, qmax), True


def _as_input(x, func):
    """x as a float numpy array (integer / bool input read as float32, as
    torch's ``x.to(torch.float32)``)."""
    if type(x) is np.ndarray and (x.dtype == F32 or x.dtype == np.float64):
        return x  # (what as_float_array returns for it)
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "iub":
        return np.asarray(x).astype(F32)
    if A.is_cupy_array(x) and x.dtype.kind in "iub":
        return x.astype(F32)  # (exact below 2**24, correctly rounded above, as numpy)
    return A.as_float_array(x, "x", func)


def _array(value, dtype, name, func):
    try:
        return np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{func}: {name} must be numeric, got {value!r}") from exc


# ------------------------------------------------------------------ with_args
# ------------------------------------------------------------ state helpers
def _load_keys(module, state, strict, own):
    """Check a flat state dict against ``own`` keys; return missing / unexpected."""
    if not isinstance(state, dict) and not hasattr(state, "keys"):
        raise TypeError(f"{type(module).__name__}.load_state_dict: expected a mapping of "
                        f"arrays, got {type(state).__name__}")
    keys = set(state.keys())
    missing = [k for k in own if k not in keys]
    unexpected = sorted(keys - set(own))
    if strict and (missing or unexpected):
        raise RuntimeValueError(f"Error(s) in loading state_dict for {type(module).__name__}: "
                                f"Missing key(s): {missing}. Unexpected key(s): {unexpected}.")
    return missing


def _as_state_array(value, name, module):
    """A state-dict value as an array (a cupy value stays on its device)."""
    arr = value if A.is_cupy_array(value) else np.asarray(value)
    if arr.dtype.kind not in "iufb":
        raise ValueError(f"{type(module).__name__}.load_state_dict: {name} must be numeric, "
                         f"got dtype {arr.dtype}")
    return arr


def _copy_into(module, name, value, shape=None, dtype=F32):
    """torch's ``param.copy_(input_param)`` with its shape check."""
    arr = _as_state_array(value, name, module)
    cur = getattr(module, name)
    want = cur.shape if shape is None else shape
    if arr.shape != want:
        raise RuntimeValueError(
            f"Error(s) in loading state_dict for {type(module).__name__}: size "
            f"mismatch for {name}: copying a param with shape {arr.shape} from "
            f"checkpoint, the shape in current model is {want}.")
    return arr.astype(dtype, copy=True)


def _load_into(module, name, value, shape=None, target=None):
    """torch's ``param.copy_(input_param)`` of ``load_state_dict``: shape
    check, then a copy into the existing array (``target``, default
    ``module``) in place; a new array only where ``shape`` (torch's
    ``resize_`` before the copy) differs from the current one."""
    cur = getattr(module, name)
    new = _copy_into(module, name, value, shape=shape, dtype=cur.dtype)
    store_into(module if target is None else target, name, new, cur.dtype)


class _Module(TrainEval, Locked):
    """What the torch modules share: ``obj(x)`` is ``forward(x)``,
    ``train`` / ``eval``, ``state_dict`` / ``load_state_dict``."""

    training = True
    _BUFFERS = ()

    with_args = classmethod(_with_args)
    with_callable_args = classmethod(_with_callable_args)

    @locked
    def __call__(self, x):
        return self.forward(x)

    def _state_keys(self, prefix=""):
        return [prefix + b for b in self._BUFFERS]

    def _save(self, dest, prefix):
        # the buffers themselves: torch's state dict shares their storage
        for b in self._BUFFERS:
            dest[prefix + b] = getattr(self, b)

    def _load(self, state, prefix):
        for b in self._BUFFERS:
            if prefix + b in state:
                _load_into(self, b, state[prefix + b])

    #: torch's ``Module._version`` of the class (observers: 3, FakeQuantize: 1)
    _VERSION = 1

    def _metadata(self, dest, prefix):
        dest[prefix[:-1]] = {"version": self._VERSION}

    @locked
    def state_dict(self):
        """Buffers as numpy arrays under torch's key names, in a dict that
        carries torch's ``_metadata`` (the module versions), as torch's does."""
        d = _StateDict()
        self._save(d, "")
        d._metadata = {}
        self._metadata(d._metadata, "")
        return d

    def _prepare(self, state, prefix, metadata):
        """torch's ``_load_from_state_dict`` rewrites, before the keys are
        matched (the eps reset of observers without a version)."""

    @locked
    def load_state_dict(self, state_dict, strict=True):
        """Load a state dict with torch's keys (numpy arrays, e.g. from
        ``numpy.load`` of an ``.npz`` or ``safetensors.numpy.load_file``),
        as torch's ``load_state_dict`` does.

        A plain mapping carries no module versions, and torch then treats
        each observer as a version-1 checkpoint: its ``eps`` is reset to
        ``finfo(float32).eps`` whatever the file holds (and needs no ``eps``
        key).  The dict :meth:`state_dict` returns keeps the versions (its
        ``_metadata``), so it loads ``eps`` as stored, as in torch.
        """
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"{type(self).__name__}.load_state_dict: expected a mapping of "
                            f"arrays, got {type(state_dict).__name__}")
        state = {k: state_dict[k] for k in state_dict.keys()}
        self._prepare(state, "", getattr(state_dict, "_metadata", None) or {})
        _load_keys(self, state, strict, self._state_keys())
        self._load(state, "")
        return self


class _StateDict(dict):
    """A state dict with torch's ``_metadata`` attribute."""

    _metadata = None


def _version(metadata, prefix):
    return metadata.get(prefix[:-1], {}).get("version")


_DEFAULT_EPS = float(np.finfo(np.float32).eps)

