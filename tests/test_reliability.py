"""Reliability: many Python threads, no memory growth, 64-bit indexing,
bad input to the stateful layer."""
import gc
import os
import threading
import tracemalloc

import numpy as np
import pytest

import quantcore as qc

from reference import bits_equal

F32 = np.float32


def hot_calls(x, g, mask):
    """One call of each hot function; returns the arrays produced."""
    return [qc.fake_quant(x, 0.05, 3, -128, 127),
            qc.fake_quant(x.reshape(16, -1), np.linspace(0.01, 0.1, 16), 0, -8, 7, axis=0),
            qc.fake_quant_with_mask(x, 0.05, 0, 0, 255)[1],
            np.stack(qc.minmax(x)), np.stack(qc.minmax(x.reshape(16, -1), axis=0)),
            qc.fake_quant_amax(x, 2.0), qc.ste_backward(g, mask)]


def test_eight_python_threads_match_serial():
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(16, 4096)).astype(F32) for _ in range(8)]
    g = rng.normal(size=inputs[0].shape).astype(F32)
    mask = rng.random(inputs[0].shape) > 0.3
    serial = [hot_calls(x.reshape(-1), g.reshape(-1), mask.reshape(-1)) for x in inputs]
    results = [None] * 8
    errors = []

    def work(k):
        try:
            for _ in range(20):
                results[k] = hot_calls(inputs[k].reshape(-1), g.reshape(-1), mask.reshape(-1))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for got, exp in zip(results, serial):
        assert all(bits_equal(a, b) for a, b in zip(got, exp))


def test_shared_fake_quantize_is_thread_safe():
    rng = np.random.default_rng(1)
    batches = [rng.normal(size=512).astype(F32) for _ in range(64)]
    fq = qc.FakeQuantize(qc.MinMaxObserver())
    threads = [threading.Thread(target=lambda k=k: [fq(b) for b in batches[k::8]])
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ref = qc.MinMaxObserver()
    for b in batches:
        ref(b)
    assert fq.observer.num_batches == 64
    assert bits_equal(fq.observer.min_val, ref.min_val)


def _rss_bytes():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_no_memory_growth_over_1e5_calls():
    """10**5 calls of every hot function and of FakeQuantize forward/backward:
    tracemalloc and RSS stay flat (bounded loop)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=256).astype(F32)
    g = np.ones_like(x)
    mask = x > 0
    out = np.empty_like(x)
    fq = qc.FakeQuantize()
    calls = [
        lambda: qc.fake_quant(x, 0.05, 3, -128, 127, out=out),
        lambda: qc.fake_quant_with_mask(x, 0.05, 0, 0, 255),
        lambda: qc.minmax(x),
        lambda: qc.ste_backward(g, mask, out=out),
        lambda: fq(x),
        lambda: fq.backward(g),
    ]
    n = int(os.environ.get("QC_MEMORY_CALLS", "100000"))
    per_call = max(n // len(calls), 1)
    for f in calls:  # warm up caches and lazy imports
        for _ in range(200):
            f()
    gc.collect()
    tracemalloc.start()
    rss0 = _rss_bytes()
    snap0 = tracemalloc.take_snapshot()
    for f in calls:
        for _ in range(per_call):
            f()
    gc.collect()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap0, "filename"))
    tracemalloc.stop()
    rss_growth = _rss_bytes() - rss0
    assert grown < 256 * 1024, f"Python allocations grew by {grown} bytes"
    assert rss_growth < 16 * 1024 * 1024, f"RSS grew by {rss_growth} bytes"


@pytest.mark.slow
def test_more_than_2_31_elements():
    """64-bit indexing: fake_quant in place and minmax over 2**31 + 33
    float32 elements (8.6 GB).  Run with --runslow."""
    n = 2 ** 31 + 33
    x = np.empty(n, F32)
    x[:] = 0.25
    x[-1] = 7.0
    x[-2] = -3.0
    x[2 ** 31 + 5] = 0.26
    lo, hi = qc.minmax(x)
    assert (float(lo), float(hi)) == (-3.0, 7.0)
    qc.fake_quant(x, 0.5, 0, -128, 127, out=x)
    assert x[-1] == 7.0 and x[-2] == -3.0 and x[2 ** 31 + 5] == 0.5 and x[0] == 0.0
    lo, hi = qc.minmax(x.reshape(1, n), axis=0)
    assert (float(lo[0]), float(hi[0])) == (-3.0, 7.0)


BAD_STATEFUL = [
    (lambda: qc.FakeQuantize()(np.arange(4)), TypeError, "floating dtype"),
    (lambda: qc.FakeQuantize()(np.zeros(3, complex)), TypeError, "floating dtype"),
    (lambda: qc.FakeQuantize()(np.zeros(3, F32), out=np.zeros(2, F32)), ValueError, "out has shape"),
    (lambda: qc.FakeQuantize().backward(np.zeros(3, F32)), None, None),
    (lambda: qc.MinMaxObserver(axis="0"), TypeError, "axis must be an int"),
    (lambda: qc.MinMaxObserver(axis=2)(np.zeros(3, F32)), ValueError, "out of range"),
    (lambda: qc.MinMaxObserver().load_state_dict({"min_val": 1}), ValueError, "missing keys"),
    (lambda: qc.MinMaxObserver().load_state_dict([1]), TypeError, "expected a dict"),
    (lambda: qc.MinMaxObserver().load_state_dict({"min_val": np.zeros(2), "max_val": np.zeros(2)}),
     ValueError, "ndim"),
    (lambda: qc.FakeQuantize(quant_min=0, quant_max=255.5), TypeError, "quant_max must be an integer"),
    (lambda: qc.EMAMinMaxObserver(decay=2), ValueError, "decay"),
]


@pytest.mark.parametrize("case", range(len(BAD_STATEFUL)))
def test_stateful_bad_input(case):
    call, exc, fragment = BAD_STATEFUL[case]
    if exc is None:
        call()  # documented result: backward before any forward is the identity
        return
    with pytest.raises(exc, match=fragment):
        call()
