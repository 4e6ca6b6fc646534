"""State files for observers and FakeQuantize: ``.npz`` or ``.json``, never
pickle.

A state file holds the object's ``state_dict()`` flattened to ``a/b`` keys,
plus ``__format__`` (``"quantcore-state-1"``) and ``__class__`` (the name of
a quantcore class).  Loading rebuilds only quantcore's own classes and never
unpickles: ``.npz`` files are read with ``allow_pickle=False`` and ``.json``
arrays are rebuilt from numbers with a numeric dtype.

Before anything is built, the file is checked against the schema of its
class: exactly the keys that class saves (so a file of one class relabelled
as another is refused), each of the expected type (ints are ints, flags are
bools, statistics are float arrays of the right rank with min <= max,
counts are >= 0, integers fit 64 bits, eps is finite and >= 0, scales are
finite and >= min(eps, 1) or NaN -- the NaN scales of a FakeQuantize that
has seen only non-finite batches --, +inf only where the observer's
statistics are infinite, one per tensor or per observed channel,
zero points integral and within [quant_min, quant_max]); the objects are
then built through their constructors, which check the rest.  A truncated, tampered or foreign file
raises ``ValueError("load_state: <path> is not a valid quantcore state file:
<reason>")``; a missing file raises FileNotFoundError.
"""
import json
import math
import os
import tokenize
import zipfile

import numpy as np

from ._files import atomic_write
from .fake_quantize import FakeQuantize
from .observers import ObserverBase

FORMAT = "quantcore-state-1"
#: the classes a state file can hold: every observer of quantcore.observers
#: (registered by being defined there) and FakeQuantize
_CLASSES = {**ObserverBase.REGISTRY, "FakeQuantize": FakeQuantize}

__all__ = ["save_state", "load_state"]


def _flatten(d, prefix=""):
    flat = {}
    for key, value in d.items():
        if "/" in key:
            raise ValueError(f"save_state: key {key!r} contains '/'")
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def _unflatten(flat):
    d = {}
    for key, value in flat.items():
        node = d
        parts = key.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"inconsistent keys around {key!r}")
        node[parts[-1]] = value
    return d

# ------------------------------------------------------------------ schema
#: key -> kind, for every key an observer's state_dict() holds
_OBSERVER_KEYS = {"min_val": "stat", "max_val": "stat", "num_batches": "count",
                  "nonfinite_batches": "count", "axis": "axis", "per_channel": "bool",
                  "nan_policy": "str"}
#: observer class -> its configuration fields (the class's own _FIELDS)
_OBSERVER_FIELDS = {cls: dict(cls._FIELDS) for cls in ObserverBase.REGISTRY.values()}
_FAKE_QUANTIZE_KEYS = {"scale": "scale", "zero_point": "zero_point", "quant_min": "int",
                       "quant_max": "int", "symmetric": "bool", "eps": "real",
                       "rounding": "str", "quant_delay": "count", "packed_mask": "bool",
                       "fake_quant_enabled": "bool", "observer_enabled": "bool",
                       "training": "bool", "step": "count", "observer": "dict",
                       "observer_class": "str"}
_MAX_NDIM = 64  # numpy's limit: an axis beyond it cannot be valid


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _scalar(v):
    """0-d numeric arrays (npz files store Python floats that way) as scalars."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "biuf":
        return v[()]
    return v


def _check_value(where, key, kind, v):
    """Raise ValueError unless ``v`` has the kind the schema gives ``key``."""
    def bad(what):
        shown = repr(v) if not isinstance(v, np.ndarray) else f"an array {v.dtype}{v.shape}"
        raise ValueError(f"{where + key!r} must be {what}, got {shown[:80]}")
    if kind in ("stat", "scale", "zero_point"):
        if not isinstance(v, np.ndarray) or v.ndim > 1:
            bad("a numeric array of rank 0 or 1")
        if kind == "zero_point":
            if v.dtype.kind not in "iuf":
                bad("an integer array")
            if v.dtype.kind == "f" and not np.all(np.isfinite(v) & (v == np.rint(v))):
                bad("integral")
        elif v.dtype.kind != "f" or v.dtype.itemsize > 8:
            bad("a float32 / float64 array")
        if kind == "scale" and bool(np.any(v < 0)):
            bad(">= 0")
        if kind != "zero_point" and v.dtype.itemsize > 4 and \
                bool(np.any(np.isfinite(v) & (np.abs(v) > np.finfo(np.float32).max))):
            bad("within float32 (the statistics are float32)")
        return
    v = _scalar(v)
    if kind == "bool":
        if not isinstance(v, (bool, np.bool_)):
            bad("true or false")
    elif kind == "str":
        if not isinstance(v, str):
            bad("a string")
    elif kind == "dict":
        if not isinstance(v, dict):
            bad("a nested state")
    elif kind in ("int", "count", "axis"):
        if not _is_int(v):
            bad("an integer")
        if kind != "axis" and not -2 ** 63 <= v < 2 ** 63:
            bad("a 64-bit integer")
        if kind == "count" and v < 0:
            bad(">= 0")
        if kind == "axis" and not -_MAX_NDIM <= v < _MAX_NDIM:
            bad(f"in [-{_MAX_NDIM}, {_MAX_NDIM})")
    elif kind == "real":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer,
                                                                  np.floating)):
            bad("a number")
        if not np.isfinite(v):
            bad("finite")
        if key == "eps" and v < 0:
            bad(">= 0")
    else:  # pragma: no cover - schema typo
        raise AssertionError(kind)


def _check_keys(where, state, schema):
    for key, kind in schema.items():  # a per-tensor statistic may be a plain number
        if kind in ("stat", "scale", "zero_point") and isinstance(state.get(key), (int, float)) \
                and not isinstance(state[key], bool):
            state[key] = np.asarray(state[key])
    missing = sorted(set(schema) - set(state))
    if missing:
        raise ValueError(f"{where}missing keys {missing}")
    unexpected = sorted(set(state) - set(schema))
    if unexpected:
        raise ValueError(f"{where}unexpected keys {unexpected} (a file of another class, or "
                         "tampered)")
    for key, kind in schema.items():
        _check_value(where, key, kind, state[key])


def _validate(cls_name, state, where=""):
    """Check ``state`` against the schema of ``cls_name`` (ValueError)."""
    cls = _CLASSES.get(cls_name) if isinstance(cls_name, str) else None
    if cls is None:
        raise ValueError(f"{where}unknown class {cls_name!r}; known: {sorted(_CLASSES)}")
    if cls is FakeQuantize:
        _check_keys(where, state, _FAKE_QUANTIZE_KEYS)
        obs_class = state["observer_class"]
        if _CLASSES.get(obs_class) not in _OBSERVER_FIELDS:
            raise ValueError(f"{where + 'observer_class'!r} must name a quantcore observer, got "
                             f"{obs_class!r}")
        scale, zp = state["scale"], state["zero_point"]
        if scale.shape != zp.shape or scale.ndim != 1 or not scale.size:
            raise ValueError(f"{where}scale and zero_point must be non-empty 1-D arrays of one "
                             f"shape, got {scale.shape} and {zp.shape}")
        _validate(obs_class, state["observer"], f"{where}observer/")
        _check_qparams(where, state)
        return
    _check_keys(where, state, {**_OBSERVER_KEYS, **_OBSERVER_FIELDS[cls]})
    if state["min_val"].shape != state["max_val"].shape:
        raise ValueError(f"{where}min_val and max_val differ in shape: "
                         f"{state['min_val'].shape} and {state['max_val'].shape}")
    per_channel = bool(_scalar(state["per_channel"]))
    if state["min_val"].ndim != (1 if per_channel else 0):
        raise ValueError(f"{where + 'min_val'!r} has rank {state['min_val'].ndim}, a "
                         f"{'per-channel' if per_channel else 'per-tensor'} observer "
                         f"needs {1 if per_channel else 0}")
    lo, hi = state["min_val"], state["max_val"]
    with np.errstate(invalid="ignore"):
        crossed = (lo > hi) & ~((lo == np.inf) & (hi == -np.inf))  # (inf, -inf): no data yet
    if bool(np.any(crossed)):
        raise ValueError(f"{where}min_val must be <= max_val (or inf / -inf before any data), "
                         f"got {np.atleast_1d(lo)[crossed.reshape(-1)][:4].tolist()} > "
                         f"{np.atleast_1d(hi)[crossed.reshape(-1)][:4].tolist()}")


def _check_qparams(where, state):
    """What a FakeQuantize computes its qparams into: per tensor one scale,
    per channel one or one per observed channel; each scale NaN (only
    non-finite batches seen) or finite and >= min(eps, 1) (qparams clamp
    the scale to eps; a fresh object holds 1); zero points within
    [quant_min, quant_max]."""
    scale, zp = state["scale"], state["zero_point"]
    obs = state["observer"]
    channels = obs["min_val"].size
    if not bool(_scalar(obs["per_channel"])):
        if scale.size != 1:
            raise ValueError(f"{where}scale holds {scale.size} values, a per-tensor observer "
                             "has one")
    elif scale.size != 1 and channels and scale.size != channels:
        raise ValueError(f"{where}scale holds {scale.size} values, the per-channel observer "
                         f"{channels} channels")
    lo, hi = obs["min_val"].reshape(-1), obs["max_val"].reshape(-1)
    with np.errstate(invalid="ignore"):
        seen_nonfinite = ~(np.isfinite(lo) & np.isfinite(hi)) & ~((lo == np.inf) & (hi == -np.inf))
    if lo.size != scale.size:
        seen_nonfinite = np.full(scale.shape, lo.size == 1 and bool(seen_nonfinite.all()))
    infinite = np.isinf(scale) & ~seen_nonfinite  # (+-inf data seen with "propagate": inf)
    if bool(np.any(infinite)):
        raise ValueError(f"{where + 'scale'!r} must be finite where the observer saw finite "
                         f"data (or NaN), got {scale[infinite][:4].tolist()}")
    floor = np.float32(min(float(_scalar(state["eps"])), 1.0))
    low = scale < floor
    if bool(np.any(low)):
        raise ValueError(f"{where + 'scale'!r} must be >= min(eps, 1) = {floor} (or NaN), got "
                         f"{scale[low][:4].tolist()}")
    qmin, qmax = _scalar(state["quant_min"]), _scalar(state["quant_max"])
    if qmin >= qmax:
        raise ValueError(f"{where}quant_min must be < quant_max, got [{qmin}, {qmax}]")
    out = (zp < qmin) | (zp > qmax)
    if bool(np.any(out)):
        raise ValueError(f"{where + 'zero_point'!r} must lie in [quant_min, quant_max] = "
                         f"[{qmin}, {qmax}], got {zp[out][:4].tolist()}")


def _build(cls_name, state):
    """An instance of a known class, configured from its state."""
    if cls_name not in _CLASSES:
        raise ValueError(f"load_state: unknown class {cls_name!r}; known: {sorted(_CLASSES)}")
    cls = _CLASSES[cls_name]
    if cls is FakeQuantize:
        obs_state = state.get("observer")
        if not isinstance(obs_state, dict):
            raise ValueError("load_state: FakeQuantize state without an observer")
        observer = _build(str(state.get("observer_class", "")), obs_state)
        obj = FakeQuantize(observer, int(state["quant_min"]), int(state["quant_max"]),
                           symmetric=bool(state.get("symmetric", False)),
                           eps=float(state.get("eps", np.finfo(np.float32).eps)),
                           rounding=str(state.get("rounding", "half_even")),
                           quant_delay=int(state.get("quant_delay", 0)),
                           packed_mask=bool(state.get("packed_mask", False)))
        obj.load_state_dict(state)
        return obj
    axis = int(state.get("axis", -1))
    kwargs = {"axis": axis if bool(state.get("per_channel", False)) else None,
              "nan_policy": str(state.get("nan_policy", "skip"))}
    for field in getattr(cls, "_FIELDS", ()):
        if field in state:
            kwargs[field] = state[field]
    obj = cls(**kwargs)
    obj.load_state_dict(state)
    return obj


def _to_python(value):
    """0-d arrays of npz files back to Python scalars."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuU":
        return value.item()
    return value


#: a state file is small: refuse before reading an archive member larger than this
_MAX_MEMBER = 1 << 30


#: what reading a forged .npy header raises (numpy's parser: ast, tokenize)
NPY_HEADER_ERRORS = (ValueError, EOFError, SyntaxError, TypeError, OverflowError,
                     RecursionError, MemoryError, tokenize.TokenError)


def npy_header(fh):
    """(shape, fortran_order, dtype) of the .npy stream at its start;
    ValueError for anything but a well-formed version 1 / 2 header."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fh)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(fh)
    except NPY_HEADER_ERRORS as exc:
        raise ValueError(f"not a .npy array ({' '.join(str(exc).split())[:120]})") from None
    raise ValueError(f"not a .npy array (format version {version})")


def _read_npz(path):
    """``{name: array}`` of an .npz archive, each member's header checked
    against the bytes the member holds before anything is allocated (a
    forged shape cannot ask for more memory than the file provides)."""
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            head = fh.read(6)
        raise ValueError("not an .npz archive (" + (
            "a single .npy array" if head == b"\x93NUMPY" else
            "pickled data, which is never unpickled" if head[:1] == b"\x80" else
            "not a zip file") + ")")
    out = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name in out:
                raise ValueError(f"{name!r} appears twice in the archive")
            if info.file_size > _MAX_MEMBER:
                raise ValueError(f"{name!r}: {info.file_size} bytes, more than a state holds")
            with zf.open(info) as fh:
                shape, fortran, dtype = npy_header(fh)
                if dtype.hasobject:
                    raise ValueError(f"{name!r} holds Python objects (never unpickled)")
                need = int(np.prod(shape, dtype=object)) * dtype.itemsize
                have = info.file_size - fh.tell()
                if need != have:
                    raise ValueError(f"{name!r}: its header declares {need} bytes of "
                                     f"{dtype}{shape}, the member holds {have}")
                data = fh.read(have)
            arr = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
            out[name] = arr.copy()
    return out


def save_state(obj, path):
    """Write ``obj.state_dict()`` to ``path`` (``.json``, else ``.npz``):
    atomically (:func:`quantcore._files.atomic_write`: a previous file at
    ``path`` survives any failure whole, no temporary is left)."""
    name = type(obj).__name__
    if _CLASSES.get(name) is not type(obj):
        raise TypeError(f"save_state: cannot save a {name}; supported: {sorted(_CLASSES)}")
    flat = _flatten(obj.state_dict())
    flat["__format__"] = FORMAT
    flat["__class__"] = name
    path = os.fspath(path)
    if path.endswith(".json"):
        doc = {}
        for key, value in flat.items():
            if isinstance(value, np.generic):  # numpy scalars keep their dtype
                value = np.asarray(value) if value.dtype.kind == "f" else value.item()
            if isinstance(value, np.ndarray):
                doc[key] = {"__ndarray__": value.reshape(-1).tolist(), "dtype": value.dtype.str,
                            "shape": list(value.shape)}
            else:
                doc[key] = value
        with atomic_write(path, text=True) as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        return
    arrays = {}
    for key, value in flat.items():
        arr = np.asarray(value)
        if arr.dtype.kind == "O":
            raise TypeError(f"save_state: {key!r} is not an array or a plain scalar")
        arrays[key] = arr
    with atomic_write(path) as fh:
        np.savez(fh, **arrays)


def load_state(path, expected=None):
    """Rebuild the object saved by :func:`save_state` (nothing is unpickled).

    Parameters
    ----------
    path : str or os.PathLike
        A ``.json`` file, else an ``.npz`` archive.
    expected : class or tuple of classes, optional
        Refuse (ValueError) a file that holds another class, e.g.
        ``load_state(p, expected=quantcore.FakeQuantize)``.

    Raises
    ------
    FileNotFoundError, PermissionError
        As ``open`` raises them.
    ValueError
        ``load_state: <path> is not a valid quantcore state file: <reason>``
        for a truncated, corrupt, tampered or foreign file, or one of an
        unexpected class.
    """
    path = os.fspath(path)
    try:
        if os.path.exists(path) and not os.path.isfile(path):  # (a FIFO would block open())
            raise ValueError("not a regular file (a directory, device, FIFO or socket)")
        if path.endswith(".json"):
            from .checkpoints import _unique_object
            with open(path, encoding="utf-8") as fh:  # (NaN / Infinity: save_state writes them)
                doc = json.load(fh, object_pairs_hook=_unique_object)
            if not isinstance(doc, dict):
                raise ValueError("the top level is not an object")
            flat = {}
            for key, value in doc.items():
                if isinstance(value, dict) and "__ndarray__" in value:
                    if set(value) != {"__ndarray__", "dtype", "shape"}:
                        raise ValueError(f"{key!r}: an array entry holds __ndarray__, dtype "
                                         f"and shape, got {sorted(value)}")
                    dtype = np.dtype(str(value["dtype"]))
                    if dtype.kind not in "biuf":
                        raise ValueError(f"{key!r} has dtype {dtype}")
                    if not isinstance(value["shape"], list) or \
                            not all(_is_int(n) and n >= 0 for n in value["shape"]):
                        raise ValueError(f"{key!r}: shape must be a list of sizes, got "
                                         f"{value['shape']!r}")
                    data = value["__ndarray__"]
                    if not isinstance(data, list) or not all(
                            isinstance(v, (int, float)) and not isinstance(v, bool) for v in data):
                        raise ValueError(f"{key!r}: __ndarray__ must be a flat list of numbers")
                    if dtype.kind in "biu" and not all(isinstance(v, int) for v in data):
                        raise ValueError(f"{key!r}: dtype {dtype} holds integers only")
                    if len(data) != math.prod(value["shape"]):
                        raise ValueError(f"{key!r}: {len(data)} values for shape "
                                         f"{value['shape']}")
                    try:
                        with np.errstate(over="raise"):  # (1e300 as float32: not inf)
                            flat[key] = np.array(data, dtype=dtype).reshape(value["shape"])
                    except (OverflowError, FloatingPointError):
                        raise ValueError(f"{key!r}: a value does not fit {dtype}") from None
                else:
                    flat[key] = value
        else:
            flat = {key: _to_python(value) for key, value in _read_npz(path).items()}
        if flat.get("__format__") != FORMAT:
            raise ValueError(f"missing or unknown __format__ {flat.get('__format__')!r}")
        cls_name = flat.pop("__class__", None)
        flat.pop("__format__")
        state = _unflatten(flat)
        _validate(cls_name, state)
        if expected is not None and not issubclass(_CLASSES[cls_name], expected):
            names = ([c.__name__ for c in expected] if isinstance(expected, tuple)
                     else expected.__name__)
            raise ValueError(f"the file holds a {cls_name}, expected {names}")
        return _build(cls_name, state)
    except (FileNotFoundError, PermissionError):
        raise
    except (OSError, EOFError, zipfile.BadZipFile, json.JSONDecodeError, KeyError, TypeError,
            ValueError, IndexError, AttributeError, OverflowError, RecursionError, SyntaxError,
            tokenize.TokenError) as exc:
        raise ValueError(
            f"load_state: {path!r} is not a valid quantcore state file: {exc}") from exc
