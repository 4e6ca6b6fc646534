"""Shared pieces of the benchmark suite.

Every benchmark records ``extra_info``: ``op``, ``size`` (elements),
``impl`` and ``bytes`` (logical bytes read + written), so GB/s and the
ratios of ``bench/summary.py`` can be read off the JSON.  Inputs rotate
through several copies when one copy would fit in the last-level cache, so
small sizes are not timed on cache-hot data only.
"""
import os
import sys

import numpy as np
import pytest

KI, MI = 1 << 10, 1 << 20
SIZES = [KI, 64 * KI, MI, 16 * MI]
if os.environ.get("QC_BENCH_GPU_SIZES"):
    SIZES.append(256 * MI)
#: total bytes the rotating copies of a small input cover
ROTATE_BYTES = 64 * MI


def size_id(n):
    return f"{n // MI}Mi" if n >= MI else f"{n // KI}Ki"


class Rotating:
    """Cycle through copies of an array so that small inputs are cold."""

    def __init__(self, make, nbytes):
        copies = max(1, min(32, ROTATE_BYTES // max(nbytes, 1)))
        self.items = [make(k) for k in range(copies)]
        self.k = 0

    def next(self):
        item = self.items[self.k]
        self.k = (self.k + 1) % len(self.items)
        return item


def make_input(n, seed=0, shape=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, size=n).astype(np.float32)
    return x.reshape(shape) if shape is not None else x


def annotate(benchmark, op, n, impl, nbytes):
    benchmark.group = f"{op} {size_id(n)}"
    benchmark.extra_info.update({"op": op, "size": n, "impl": impl, "bytes": int(nbytes)})


def torch_or_skip():
    return pytest.importorskip("torch")


class FeedReader:
    """ORT's reader protocol over a list of feeds, with ``rewind()``."""

    def __init__(self, feeds):
        self.feeds = feeds
        self.rewind()

    def rewind(self):
        self.it = iter(self.feeds)

    def get_next(self):
        return next(self.it, None)


def wheel_model(name, batches, size):
    """(path, feeds) of a real ONNX model from its PyPI wheel
    (``tests/test_onnx.py``'s ``REAL_MODELS``), or a skip when the wheel is
    not installed: silero_vad with ``batches`` chunks of ``size`` rows,
    ppocr_det with ``batches`` images of ``size`` x ``size``."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import test_onnx as T
    (package, relative), _ = T.REAL_MODELS[name]
    path = T._wheel_model(package, relative)
    feeds = (T.vad_feeds(path, batches, size) if name == "silero_vad"
             else T.ocr_feeds(batches, size, size))
    return path, feeds
