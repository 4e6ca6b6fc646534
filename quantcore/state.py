"""State files for observers and FakeQuantize: ``.npz`` or ``.json``, never
pickle.

A state file holds the object's ``state_dict()`` flattened to ``a/b`` keys,
plus ``__format__`` (``"quantcore-state-1"``) and ``__class__`` (the name of
a quantcore class).  Loading rebuilds only quantcore's own classes; a
truncated, tampered or foreign file raises ValueError.  ``.npz`` files are
read with ``allow_pickle=False``.
"""
import json
import os
import zipfile

import numpy as np

from .fake_quantize import FakeQuantize
from .observers import (EMAMinMaxObserver, MinMaxObserver, MomentumMinMaxObserver,
                        MovingAverageMinMaxObserver)

FORMAT = "quantcore-state-1"
_CLASSES = {cls.__name__: cls for cls in (MinMaxObserver, MovingAverageMinMaxObserver,
                                          EMAMinMaxObserver, MomentumMinMaxObserver,
                                          FakeQuantize)}

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
                raise ValueError(f"load_state: inconsistent keys around {key!r}")
        node[parts[-1]] = value
    return d


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


def save_state(obj, path):
    """Write ``obj.state_dict()`` to ``path`` (``.json``, else ``.npz``)."""
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
            if isinstance(value, np.generic):
                value = value.item()
            if isinstance(value, np.ndarray):
                doc[key] = {"__ndarray__": value.reshape(-1).tolist(), "dtype": value.dtype.str,
                            "shape": list(value.shape)}
            else:
                doc[key] = value
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        return
    arrays = {}
    for key, value in flat.items():
        arr = np.asarray(value)
        if arr.dtype.kind == "O":
            raise TypeError(f"save_state: {key!r} is not an array or a plain scalar")
        arrays[key] = arr
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_state(path):
    """Rebuild the object saved by :func:`save_state` (no unpickling)."""
    path = os.fspath(path)
    try:
        if path.endswith(".json"):
            with open(path) as fh:
                doc = json.load(fh)
            if not isinstance(doc, dict):
                raise ValueError("the top level is not an object")
            flat = {}
            for key, value in doc.items():
                if isinstance(value, dict) and "__ndarray__" in value:
                    dtype = np.dtype(value["dtype"])
                    if dtype.kind not in "biuf":
                        raise ValueError(f"{key!r} has dtype {dtype}")
                    flat[key] = np.array(value["__ndarray__"], dtype=dtype).reshape(value["shape"])
                else:
                    flat[key] = value
        else:
            with np.load(path, allow_pickle=False) as npz:
                flat = {key: _to_python(npz[key]) for key in npz.files}
        if flat.get("__format__") != FORMAT:
            raise ValueError(f"missing or unknown __format__ {flat.get('__format__')!r}")
        cls_name = str(flat.pop("__class__", ""))
        flat.pop("__format__")
        return _build(cls_name, _unflatten(flat))
    except (OSError, EOFError, zipfile.BadZipFile, json.JSONDecodeError, KeyError, TypeError,
            ValueError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValueError(f"load_state: {path!r} is not a valid quantcore state file: {exc}") from exc
