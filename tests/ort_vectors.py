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


# The keys whose recorded value depends on the CPU it was recorded on: ORT's
# DistributionCalibrater sums ``hist * values`` with numpy, and numpy's
# reduction order follows the SIMD level it dispatches to (AVX-512 or not),
# so the last bit of avg / std differs between machines.  These are compared
# with live onnxruntime on this machine, never with the recorded value.
SUM_ORDER_KEYS = ("avg", "std")


def live_avg_std(hist, hist_edges, scenario="same"):
    """(avg, std) as installed onnxruntime computes them here, from the same
    histogram (its own ``HistogramCollector._avg_std``)."""
    from onnxruntime.quantization.calibrate import HistogramCollector
    power = {"same": 1, "p3": 1.0 / 3.0}[scenario]
    return HistogramCollector._avg_std(np.asarray(hist), np.asarray(hist_edges), power=power)


def same_distribution(td, expected, scenario="same"):
    """The keys of a recorded TensorData that quantcore's ``td`` does not
    match, bit for bit: the CPU-independent ones against the recording, avg
    and std against live onnxruntime on the same histogram."""
    live = dict(zip(SUM_ORDER_KEYS, live_avg_std(td.hist, td.hist_edges, scenario)))
    bad = []
    for key, val in expected.items():
        if key not in ("avg", "std", "lowest", "highest", "hist", "hist_edges"):
            continue
        got = np.asarray(getattr(td, key))
        if key in SUM_ORDER_KEYS:
            ok = same_bits(got, live[key])
        else:
            ok = matches_digest(got, val) if "sha256" in val else same_bits(got, dec(val))
        if not ok:
            bad.append(key)
    return bad


def live_entropy(pk, qk):
    """ORT's own ``entropy`` (float32 KL; numpy's log and sums) run here."""
    from onnxruntime.quantization import calibrate
    return calibrate.entropy(pk, qk)


def live_entropy_threshold(histogram, num_quantized_bins):
    """``(threshold, kl)``: installed ORT's ``get_entropy_threshold`` on a
    collector state ``(hist, edges, min, max, ...)``, run here, and the KL
    divergence of every window it tried, as the float64 array ORT fills
    (its module-level ``smooth_distribution`` and ``entropy`` are wrapped for
    the call to record them).  numpy's float32 log gives other last bits at
    other SIMD levels, so these replace recorded values."""
    from onnxruntime.quantization import calibrate
    smoothed, divs = [], []
    inner_smooth, inner_entropy = calibrate.smooth_distribution, calibrate.entropy

    def smooth(p, *args, **kw):
        smoothed.append(inner_smooth(p, *args, **kw))
        return smoothed[-1]

    def entropy(p, q):
        divs.append(inner_entropy(p, q))
        return divs[-1]
    calibrate.smooth_distribution, calibrate.entropy = smooth, entropy
    try:
        threshold = calibrate.HistogramCollector.get_entropy_threshold(
            None, tuple(histogram), num_quantized_bins)
    finally:
        calibrate.smooth_distribution, calibrate.entropy = inner_smooth, inner_entropy
    dtype = np.asarray(histogram[1]).dtype
    pending = iter(divs)
    kl = [np.inf if p is None or q is None else np.array(next(pending), dtype=dtype)
          for p, q in zip(smoothed[0::2], smoothed[1::2])]
    return threshold, np.array(kl, dtype=np.float64)
