"""Decoder of tests/data/onnxruntime_vectors.json (copied to tests/data): arrays as
``{"dtype", "shape", "data"}`` (floats exact, "nan" / "inf" as strings),
``{"b64", "b64_dtype"}`` (little-endian), float 8 as ``"bits"``, large arrays
as ``{"sha256", "first", "last", "sum"}`` digests."""
import base64
import hashlib
import json
import os

import numpy as np

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "onnxruntime_vectors.json")

with open(PATH) as _f:
    V = json.load(_f)


def _dtype(name):
    if name in ("int4", "uint4") or name.startswith("float8"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dec(o):
    """numpy array (0-d for shape []) of an encoded value."""
    if "bits" in o:
        return np.array(o["bits"], dtype=np.uint8).view(_dtype(o["dtype"])).reshape(o["shape"])
    if "b64" in o:
        raw = np.frombuffer(base64.b64decode(o["b64"]),
                            dtype=np.dtype(o.get("b64_dtype", o["dtype"])))
        return raw.astype(_dtype(o["dtype"])).reshape(o["shape"])
    data = [float(v) if isinstance(v, str) else v
            for v in np.ravel(np.array(o["data"], dtype=object))]
    dt = _dtype(o["dtype"])
    if dt.name in ("int4", "uint4"):
        return np.array(data, dtype=np.int64).astype(dt).reshape(o["shape"])
    return np.array(data, dtype=dt).reshape(o["shape"])


def matches_digest(arr, o):
    """An array equals a {"sha256", "first", "last", "sum"} digest."""
    arr = np.ascontiguousarray(arr, dtype=np.dtype(o["dtype"]))
    if list(arr.shape) != list(o["shape"]):
        return False
    return hashlib.sha256(arr.tobytes()).hexdigest() == o["sha256"]


def same_bits(a, b):
    """Equal values and dtypes, bit for bit (NaN lanes: both NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.tobytes() == b.tobytes():
        return True
    if a.dtype.kind != "f":
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(nan_a, nan_b) and
                a[~nan_a].tobytes() == b[~nan_b].tobytes())
