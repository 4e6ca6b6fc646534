"""ORT's calibration data (``TensorData`` / ``TensorsData``) and its files:
``tensors_data`` JSON and the calibration table."""
import json
import os

import numpy as np

from ..._files import atomic_write
from .qtypes import CalibrationMethod, _F32


# ------------------------------------------------------- calibration data
class TensorData:
    """ORT's ``TensorData``: ``avg``, ``std``, ``lowest``, ``highest``,
    ``hist``, ``hist_edges``, ``bins``; the float fields must be float16 /
    float32 numpy values (ORT's quantizer reads ``.dtype``)."""

    _allowed = frozenset(["avg", "std", "lowest", "highest", "hist", "hist_edges", "bins"])
    _floats = frozenset(["avg", "std", "lowest", "highest", "hist_edges"])

    def __init__(self, **kwargs):
        self._attrs = list(kwargs)
        for k, v in kwargs.items():
            if k not in TensorData._allowed:
                raise ValueError(f"Unexpected value {k!r} not in {TensorData._allowed}.")
            if k in TensorData._floats:
                if not hasattr(v, "dtype"):
                    raise ValueError(f"Unexpected type {type(v)} for k={k!r}")
                if v.dtype not in (np.float16, np.float32):
                    raise ValueError(f"Unexpected dtype {v.dtype} for k={k!r}")
            setattr(self, k, v)

    @property
    def range_value(self):
        if not hasattr(self, "lowest") or not hasattr(self, "highest"):
            raise AttributeError("Attributes 'lowest' and/or 'highest' missing.")
        return (self.lowest, self.highest)

    @property
    def avg_std(self):
        if not hasattr(self, "avg") or not hasattr(self, "std"):
            raise AttributeError("Attributes 'avg' and/or 'std' missing.")
        return (self.avg, self.std)

    def to_dict(self):
        data = {k: getattr(self, k) for k in self._attrs}
        data["CLS"] = type(self).__name__
        return data

    @classmethod
    def from_dict(cls, d):
        kwargs = {}
        for k, v in d.items():
            if k == "CLS":
                continue
            if isinstance(v, dict) and v.get("CLS") == "numpy.array":
                v = np.array(v["data"], dtype=np.dtype(v["dtype"]))
            elif k in cls._floats and isinstance(v, (int, float)):
                v = np.array(v, dtype=_F32)
            kwargs[k] = v
        return cls(**kwargs)

    def __repr__(self):
        return "TensorData(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self._attrs
                                         if k not in ("hist", "hist_edges")) + ")"


class TensorsData:
    """ORT's ``TensorsData``: the calibration method and ``{tensor name:
    TensorData}``; tuples ``(lo, hi)`` (MinMax) and ``(lo, hi, hist, bins)``
    become TensorData."""

    def __init__(self, calibration_method, data):
        self.calibration_method = calibration_method
        self.data = {}
        for k, v in data.items():
            if not isinstance(k, str):
                raise TypeError(f"Keys must be strings not {type(k)}.")
            if isinstance(v, tuple):
                if calibration_method == CalibrationMethod.MinMax and len(v) == 2:
                    v = TensorData(lowest=v[0], highest=v[1])
                elif len(v) == 4:
                    v = TensorData(lowest=v[0], highest=v[1], hist=v[2], bins=v[3])
                else:
                    raise TypeError(f"Unexpected tuple for {k!r}, it has {len(v)} elements.")
            if not isinstance(v, TensorData):
                raise TypeError(f"Values must be TensorData not {type(v)}.")
            self.data[k] = v

    def __iter__(self):
        yield from self.data

    def __contains__(self, key):
        return key in self.data

    def __getitem__(self, key):
        return self.data[key]

    def __len__(self):
        return len(self.data)

    def keys(self):
        return self.data.keys()

    def values(self):
        return self.data.values()

    def items(self):
        return self.data.items()

    def to_dict(self):
        return {"CLS": type(self).__name__, "data": self.data,
                "calibration_method": self.calibration_method}

    @classmethod
    def from_dict(cls, d):
        method = d["calibration_method"]
        if isinstance(method, dict) and method.get("CLS") == "CalibrationMethod":
            method = CalibrationMethod[method["value"].split(".")[-1]]
        return cls(method, {k: TensorData.from_dict(v) for k, v in d["data"].items()})

    def to_ort(self):
        """The same ranges as onnxruntime's own ``TensorsData`` (imports onnxruntime)."""
        from onnxruntime.quantization import calibrate as ort_cal
        method = ort_cal.CalibrationMethod[self.calibration_method.name]
        return ort_cal.TensorsData(method, {
            k: ort_cal.TensorData(**{a: getattr(v, a) for a in v._attrs}) for k, v in self.items()})


class _Encoder(json.JSONEncoder):
    """ORT's ``CalibrationCacheEncoder`` format: arrays as ``{"data", "dtype",
    "CLS": "numpy.array"}``, numpy scalars as JSON numbers."""

    def default(self, o):
        if isinstance(o, (TensorData, TensorsData)):
            return o.to_dict()
        if isinstance(o, np.ndarray):
            return {"data": o.tolist(), "dtype": str(o.dtype), "CLS": "numpy.array"}
        if isinstance(o, CalibrationMethod):
            return {"CLS": type(o).__name__, "value": str(o)}
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        return super().default(o)


def save_tensors_data(tensors_data, path, *, smooth_quant=False):
    """Write the JSON calibration cache ORT 1.27+ reads with
    ``quantize_static(..., calibration_cache_path=path)`` (through a
    temporary file, fsync and ``os.replace``: quantcore._files.atomic_write):
    ORT's format (``CalibrationCacheEncoder``'s), the whole text made by one
    call of Python's C JSON encoder, then written as bytes."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload = tensors_data.to_dict()
    payload["smooth_quant"] = smooth_quant
    # one call of the C encoder (json.dump would run its pure-Python
    # iterencode value by value: 21 s for a detector's 2.7 M histogram values)
    text = json.dumps(payload, cls=_Encoder).encode()
    with atomic_write(path) as f:
        f.write(text)


def load_tensors_data(path):
    """Read a calibration cache written by :func:`save_tensors_data` or ORT."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Calibration cache not found: {path}")
    with open(path) as f:
        return TensorsData.from_dict(json.load(f))


def _table_value(td, absmax):
    d = td.to_dict()
    hi = float(np.asarray(d.get("highest", 0)).item())
    lo = float(np.asarray(d.get("lowest", 0)).item())
    return max(abs(hi), abs(lo)) if absmax else max([hi, lo])


def write_calibration_table(calibration_cache, dir=".", *, absmax=False):  # noqa: A002
    """ORT's TensorRT calibration files in ``dir``: ``calibration.json``,
    ``calibration.cache`` (``"name value"`` per tensor, sorted) and
    ``calibration.flatbuffers`` (when the ``flatbuffers`` package is
    installed).  ORT writes ``max(highest, lowest)``, which is the dynamic
    range only for symmetric ranges; ``absmax=True`` writes the correct
    ``max(|highest|, |lowest|)``.  Each file is written atomically
    (quantcore._files.atomic_write)."""
    with atomic_write(os.path.join(dir, "calibration.json"), text=True) as f:
        f.write(json.dumps(calibration_cache, cls=_Encoder))
    keys = sorted(calibration_cache.keys())
    values = {k: str(_table_value(calibration_cache[k], absmax)) for k in keys}
    try:
        import flatbuffers
    except ImportError:
        flatbuffers = None
    if flatbuffers is not None:
        with atomic_write(os.path.join(dir, "calibration.flatbuffers")) as f:
            f.write(_trt_table(flatbuffers, keys, values))
    with atomic_write(os.path.join(dir, "calibration.cache"), text=True) as f:
        for k in keys:
            f.write(f"{k} {values[k]}\n")


def _trt_table(flatbuffers, keys, values):
    """ORT's ``TrtTable { dict: [KeyValue { key: string; value: string }] }``
    flatbuffer, built in the same order as ORT builds it."""
    builder = flatbuffers.Builder(1024)
    entries = []
    for k in keys:
        key, value = builder.CreateString(k), builder.CreateString(values[k])
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(0, key, 0)
        builder.PrependUOffsetTRelativeSlot(1, value, 0)
        entries.append(builder.EndObject())
    builder.StartVector(4, len(entries), 4)
    for e in entries:
        builder.PrependUOffsetTRelative(e)
    vector = builder.EndVector()
    builder.StartObject(1)
    builder.PrependUOffsetTRelativeSlot(0, vector, 0)
    builder.Finish(builder.EndObject())
    return bytes(builder.Output())
