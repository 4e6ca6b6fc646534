"""Reliability: many Python threads, no memory growth, 64-bit indexing,
bad input to the stateful layer."""
import gc
import os
import sys
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


def run_in_threads(work, n=8):
    """Run ``work(k)`` for k in range(n) in n Python threads at once; fail
    with the first exception any of them raised."""
    errors = []

    def guarded(k):
        try:
            work(k)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors


def test_eight_python_threads_match_serial():
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(16, 4096)).astype(F32) for _ in range(8)]
    g = rng.normal(size=inputs[0].shape).astype(F32)
    mask = rng.random(inputs[0].shape) > 0.3
    serial = [hot_calls(x.reshape(-1), g.reshape(-1), mask.reshape(-1)) for x in inputs]
    results = [None] * 8

    def work(k):
        for _ in range(20):
            results[k] = hot_calls(inputs[k].reshape(-1), g.reshape(-1), mask.reshape(-1))

    run_in_threads(work)
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


def _hot_functions():
    """name -> a no-argument call of one hot function on small arrays."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=256).astype(F32)
    x2 = x.reshape(16, 16)
    g = np.ones_like(x)
    mask = x > 0
    out = np.empty_like(x)
    s16 = np.linspace(0.01, 0.1, 16)
    q = rng.integers(0, 255, size=256).astype(np.uint8)
    fq = qc.FakeQuantize()
    fq(x)
    obs = qc.MovingAverageMinMaxObserver(axis=0)
    return {
        "fake_quant out=": lambda: qc.fake_quant(x, 0.05, 3, -128, 127, out=out),
        "fake_quant": lambda: qc.fake_quant(x, 0.05, 3, -128, 127),
        "fake_quant per channel": lambda: qc.fake_quant(x2, s16, 0, -8, 7, axis=0),
        "fake_quant_with_mask": lambda: qc.fake_quant_with_mask(x, 0.05, 0, 0, 255),
        "minmax": lambda: qc.minmax(x),
        "minmax per channel": lambda: qc.minmax(x2, axis=0),
        "quantize": lambda: qc.quantize(x, 0.05, 0, -128, 127),
        "dequantize": lambda: qc.dequantize(q, 0.05, 3),
        "fake_quant_amax": lambda: qc.fake_quant_amax(x, 2.0),
        "fake_quant_nudged": lambda: qc.fake_quant_nudged(x, -1.0, 1.0, F32(2 / 255)),
        "ste_backward": lambda: qc.ste_backward(g, mask, out=out),
        "observer update": lambda: obs(x2),
        "FakeQuantize.forward": lambda: fq(x),
        "FakeQuantize.backward": lambda: fq.backward(g),
    }


def _memory_growth(call, n):
    """(Python blocks, RSS bytes, traced bytes) gained over n calls after a
    warm-up: blocks and RSS over all n calls, tracemalloc (5x slower) over
    n // 20 of them."""
    for _ in range(500):  # warm up caches, lazy imports, the OpenMP pool
        call()
    gc.collect()
    blocks0, rss0 = sys.getallocatedblocks(), _rss_bytes()
    for _ in range(n):
        call()
    gc.collect()
    blocks, rss = sys.getallocatedblocks() - blocks0, _rss_bytes() - rss0
    own = (tracemalloc.Filter(False, tracemalloc.__file__),)
    tracemalloc.start()
    try:
        snap0 = tracemalloc.take_snapshot().filter_traces(own)
        for _ in range(max(n // 20, 1)):
            call()
        gc.collect()
        snap1 = tracemalloc.take_snapshot().filter_traces(own)
    finally:
        tracemalloc.stop()
    traced = sum(d.size_diff for d in snap1.compare_to(snap0, "filename"))
    return blocks, rss, traced


MEMORY_CALLS = int(os.environ.get("QC_MEMORY_CALLS", "100000"))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("name", sorted(_hot_functions()))
def test_no_memory_growth_over_1e5_calls(name):
    """10**5 calls of each hot function and of FakeQuantize forward /
    backward: no growth in Python blocks, RSS or tracemalloc (about 25 s for
    all of them on 2 cores)."""
    blocks, rss, traced = _memory_growth(_hot_functions()[name], MEMORY_CALLS)
    assert blocks < 200, f"{blocks} Python memory blocks more after {MEMORY_CALLS} calls"
    assert rss < 4 * 1024 * 1024, f"RSS grew by {rss} bytes over {MEMORY_CALLS} calls"
    assert traced < 64 * 1024, f"tracemalloc: +{traced} bytes over {MEMORY_CALLS // 20} calls"


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_the_memory_check_sees_a_leak():
    """The harness is not vacuous: a call that keeps one small array per
    call is caught by the Python-block count and by tracemalloc.  (RSS only
    grows once a leak outgrows the free heap the process already has, so it
    is the coarse check for native leaks, not a precise one.)"""
    kept = []
    x = np.ones(256, F32)
    blocks, _, traced = _memory_growth(lambda: kept.append(qc.fake_quant(x, .1, 0, 0, 255)),
                                       20000)
    assert blocks > 10000 and traced > 64 * 1024


@pytest.mark.slow
def test_more_than_2_31_elements():
    """64-bit indexing: fake_quant (per tensor and per channel, in place) and
    minmax (per tensor and per channel) over 2**31 + 33 float32 elements
    (8.6 GB, nothing else of that size is allocated).  Run with --runslow."""
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
    # the per-channel kernel, one channel of n elements, in place (values on the grid stay)
    qc.fake_quant(x.reshape(1, n), [0.25], [0], -128, 127, axis=0, out=x.reshape(1, n))
    assert x[-1] == 7.0 and x[-2] == -3.0 and x[2 ** 31 + 5] == 0.5 and x[0] == 0.0


BAD_STATEFUL = [
    (lambda: qc.FakeQuantize()(np.arange(4)), TypeError, "floating dtype"),
    (lambda: qc.FakeQuantize()(np.zeros(3, complex)), TypeError, "floating dtype"),
    (lambda: qc.FakeQuantize()(np.zeros(3, F32), out=np.zeros(2, F32)), ValueError,
     "out has shape"),
    (lambda: qc.FakeQuantize().backward(np.zeros(3, F32)), None, None),
    (lambda: qc.MinMaxObserver(axis="0"), TypeError, "axis must be an int"),
    (lambda: qc.MinMaxObserver(axis=2)(np.zeros(3, F32)), ValueError, "out of range"),
    (lambda: qc.MinMaxObserver().load_state_dict({"min_val": 1}), ValueError, "missing keys"),
    (lambda: qc.MinMaxObserver().load_state_dict([1]), TypeError, "expected a dict"),
    (lambda: qc.MinMaxObserver().load_state_dict({"min_val": np.zeros(2), "max_val": np.zeros(2)}),
     ValueError, "ndim"),
    (lambda: qc.FakeQuantize(quant_min=0, quant_max=255.5), TypeError,
     "quant_max must be an integer"),
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


# ------------------------------------------------------- threads and the GIL
def test_eight_threads_on_shared_inputs_and_separate_outputs(threads):
    """8 Python threads, one shared input, each its own out= arrays (and
    OpenMP inside each call): bit-identical to a serial run."""
    threads(2)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 1024)).astype(F32)
    x.flags.writeable = False  # shared: nobody may write to it
    scale = np.linspace(0.01, 0.1, 64)

    def run(outs):
        qc.fake_quant(x, 0.05, 3, -128, 127, out=outs[0])
        qc.fake_quant_with_mask(x, scale, 0, -8, 7, axis=0, out=outs[1], mask_out=outs[2])
        qc.ste_backward(x, outs[2], out=outs[3])
        return outs + [np.stack(qc.minmax(x, axis=0))]

    def fresh():
        return [np.empty_like(x), np.empty_like(x), np.empty(x.shape, bool), np.empty_like(x)]

    serial = run(fresh())
    results = [None] * 8

    def work(k):
        for _ in range(10):
            results[k] = run(fresh())

    run_in_threads(work)
    for got in results:
        assert all(bits_equal(a, b) for a, b in zip(got, serial))


def _gap_ratios(call, repeats):
    """Run ``call`` ``repeats`` times in a worker thread while this thread
    spins taking timestamps.  For each call, the longest stretch of the
    call's duration in which this (Python) thread took no timestamp, as a
    fraction of the call's duration: about 1 when the call holds the GIL
    (this thread cannot run), near 0 when it releases it (both threads run
    at once).  No absolute time is compared, only this ratio."""
    import time
    stamps, windows = [], []
    done = threading.Event()

    def worker():
        time.sleep(0.01)
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            windows.append((t0, time.perf_counter()))
            time.sleep(0.002)
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    stamp = stamps.append
    clock = time.perf_counter
    while not done.is_set():
        stamp(clock())
    thread.join()
    s = np.array(stamps)
    ratios = []
    for t0, t1 in windows:
        points = np.concatenate([[t0], s[(s > t0) & (s < t1)], [t1]])
        ratios.append(float(np.max(np.diff(points))) / (t1 - t0))
    return sorted(ratios)


def _overlaps(call, repeats=9, attempts=3):
    """True when the Python thread ran during a quarter of the calls or more
    (the lower-quartile ratio below one half).  A call that holds the GIL
    gives a ratio of exactly 1 every time, whatever the load; on a loaded
    2-core machine a call that releases it still often sees the polling
    thread unscheduled (ratio 1), so the median is not used.  A few attempts
    absorb a badly loaded machine."""
    for _ in range(attempts):
        if _gap_ratios(call, repeats)[repeats // 4] < 0.5:
            return True
    return False


def _gil_kernels():
    n = 1 << 26  # 256 MiB of float32: 10-100 ms per call on one thread (AVX-512 included)
    x = np.random.default_rng(8).normal(size=n).astype(F32)
    x2 = x.reshape(256, -1)
    mask = x > 0
    out = np.empty_like(x)
    fq = qc.FakeQuantize(qc.MinMaxObserver(), -128, 127)
    fq_general = qc.FakeQuantize(qc.MinMaxObserver(axis=0), -128, 127, axis=0)
    return {
        "fake_quant": lambda: qc.fake_quant(x, 0.05, 0, -128, 127, out=out),
        "fake_quant per channel": lambda: qc.fake_quant(x2, np.full(256, .05), 0, -8, 7, axis=0),
        "fake_quant_with_mask": lambda: qc.fake_quant_with_mask(x, 0.05, 0, 0, 255),
        "minmax": lambda: qc.minmax(x),
        "minmax per channel": lambda: qc.minmax(x2, axis=0),
        "fake_quant_amax": lambda: qc.fake_quant_amax(x, 2.0, out=out),
        "fake_quant_nudged": lambda: qc.fake_quant_nudged(x, -1.0, 1.0, F32(2 / 255), out=out),
        "quantize": lambda: qc.quantize(x, 0.05, 0, -128, 127),
        "ste_backward": lambda: qc.ste_backward(x, mask, out=out),
        "FakeQuantize fused": lambda: fq(x, out=out),
        "FakeQuantize per channel": lambda: fq_general(x2),
    }


def test_gil_is_released_during_kernels(threads):
    """Two Python threads overlap: while one runs a quantcore kernel the
    other keeps executing Python.  Checked against two controls, a C sleep
    that holds the GIL and one that releases it, so the measurement is
    known to tell the two apart on this machine."""
    import ctypes
    threads(1)
    try:
        holds, releases = ctypes.PyDLL(None).usleep, ctypes.CDLL(None).usleep
    except (OSError, AttributeError):  # pragma: no cover - no usleep in libc
        holds = releases = None
    if holds is not None:
        assert not _overlaps(lambda: holds(20000), attempts=1)
        assert _overlaps(lambda: releases(20000))
    kernels = _gil_kernels()
    held = [name for name, call in kernels.items() if not _overlaps(call)]
    assert not held, f"these kernels hold the GIL: {held}"


# ------------------------------------------------ one NaN batch never poisons
OBSERVERS = {  # name -> factory(axis, nan_policy)
    "MinMaxObserver": lambda axis, p: qc.MinMaxObserver(axis=axis, nan_policy=p),
    "MovingAverageMinMaxObserver": lambda axis, p: qc.MovingAverageMinMaxObserver(
        0.3, axis=axis, nan_policy=p),
    "EMAMinMaxObserver": lambda axis, p: qc.EMAMinMaxObserver(
        0.9, axis=axis, num_channels=None if axis is None else 4, nan_policy=p),
    "MomentumMinMaxObserver": lambda axis, p: qc.MomentumMinMaxObserver(0.9, axis=axis,
                                                                        nan_policy=p),
}


def _clean_and_poisoned():
    rng = np.random.default_rng(9)
    clean = [rng.normal(size=(6, 4)).astype(F32) * (k + 1) for k in range(3)]
    poisoned = clean[1].copy()
    poisoned[2, 1] = np.nan
    return clean, poisoned


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("name", sorted(OBSERVERS))
def test_a_nan_batch_never_poisons_later_qparams(name, axis):
    """Default policy "skip": clean, NaN, clean batches leave exactly the
    state (and qparams) of the clean batches alone, with a RuntimeWarning
    and a count -- never silently."""
    clean, poisoned = _clean_and_poisoned()
    ref, obs = OBSERVERS[name](axis, "skip"), OBSERVERS[name](axis, "skip")
    for b in clean:
        ref(b)
    obs(clean[0])
    with pytest.warns(RuntimeWarning, match="batch containing NaN or inf was skipped"):
        obs(poisoned)
    for b in clean[1:]:
        obs(b)
    assert bits_equal(obs.min_val, ref.min_val) and bits_equal(obs.max_val, ref.max_val)
    assert obs.nonfinite_batches == 1 and obs.num_batches == ref.num_batches
    for symmetric in (False, True):
        s, z = obs.calculate_qparams(-128, 127, symmetric=symmetric)
        rs, rz = ref.calculate_qparams(-128, 127, symmetric=symmetric)
        assert np.all(np.isfinite(s)) and bits_equal(s, rs) and np.array_equal(z, rz)
    # "raise" refuses the batch and leaves the state alone as well
    strict = OBSERVERS[name](axis, "raise")
    strict(clean[0])
    before = strict.state_dict()
    with pytest.raises(ValueError, match="contains NaN"):
        strict(poisoned)
    after = strict.state_dict()
    assert bits_equal(after["min_val"], before["min_val"]) and after["num_batches"] == 1


@pytest.mark.parametrize("dtype", [F32, np.float64])  # float32 per tensor: the fused kernel
@pytest.mark.parametrize("axis", [None, 1])
def test_fake_quantize_skips_a_nan_batch(dtype, axis):
    clean, poisoned = _clean_and_poisoned()
    make = lambda: qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.3, axis=axis), -8, 7,  # noqa
                                   axis=axis)
    ref, fq = make(), make()
    for b in clean:
        ref(b.astype(dtype))
    fq(clean[0].astype(dtype))
    with pytest.warns(RuntimeWarning, match="NaN or inf was skipped"):
        y = fq(poisoned.astype(dtype))
    assert np.isnan(y[2, 1]) and np.isfinite(np.delete(y.ravel(), 2 * 4 + 1)).all()
    for b in clean[1:]:
        fq(b.astype(dtype))
    assert bits_equal(fq.scale, ref.scale) and np.array_equal(fq.zero_point, ref.zero_point)
    assert fq.observer.nonfinite_batches == 1
    x = clean[2].astype(dtype)
    assert bits_equal(fq.eval()(x), ref.eval()(x))


@pytest.mark.parametrize("make_obs", [qc.MinMaxObserver, qc.MovingAverageMinMaxObserver,
                                      qc.EMAMinMaxObserver, qc.MomentumMinMaxObserver])
@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("bad", [np.inf, -np.inf])
def test_an_inf_batch_is_skipped_and_counted(make_obs, axis, bad):
    """Under nan_policy="skip" a batch holding +-inf leaves state and qparams
    exactly as without it (per tensor float32 runs the fused kernel, per
    channel the general path), with a warning and a count."""
    clean = [np.array([[1, -1], [0.5, 2]], F32), np.array([[0.3, -0.2], [4, -3]], F32)]
    poisoned = clean[0].copy()
    poisoned[1, 0] = bad
    kw = {"num_channels": 2} if make_obs is qc.EMAMinMaxObserver and axis is not None else {}
    fq, ref = (qc.FakeQuantize(make_obs(axis=axis, **kw), -128, 127, axis=axis)
               for _ in range(2))
    fq(clean[0])
    ref(clean[0])
    with pytest.warns(RuntimeWarning, match="NaN or inf was skipped"):
        fq(poisoned)
    out = fq(clean[1])
    assert np.array_equal(out, ref(clean[1])) and np.isfinite(out).all()
    assert np.array_equal(fq.scale, ref.scale) and np.array_equal(fq.zero_point, ref.zero_point)
    assert fq.observer.nonfinite_batches == 1 and fq.observer.num_batches == 2


def test_inf_batches_under_propagate_and_raise():
    obs = qc.MinMaxObserver(nan_policy="propagate")
    obs(np.array([1.0, np.inf], F32))
    assert obs.max_val == np.inf and obs.nonfinite_batches == 0
    obs = qc.MinMaxObserver(nan_policy="raise")
    obs(np.array([1.0, 2.0], F32))
    with pytest.raises(ValueError, match="contains NaN or inf"):
        obs(np.array([-np.inf, 2.0], F32))
    assert obs.min_val == 1 and obs.max_val == 2
