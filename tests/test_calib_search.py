"""The vectorised amax searches of HistogramCalibrator (entropy and mse) give
the bits of PQ's per-candidate loops.

The oracles are the per-candidate loops themselves, written here as PQ
writes them (mse: one ``fake_quant_amax`` and one torch-order float32 sum
per candidate; entropy: :func:`quantcore.calib._entropy_divergence` for
every candidate, i.e. with the screen switched off), and live
``torch.sum`` for the column sums.  tests/test_calib.py and
tests/test_compat_nvidia.py check the searches against SciPy and torch.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore import calib, torch_numerics
from quantcore.calib import HistogramCalibrator
from quantcore.ops import fake_quant_amax

f32 = np.float32


def with_hist(hist, num_bits=8, unsigned=False, top=3.0):
    """A calibrator holding ``hist`` over edges linspace(0, top)."""
    hist = np.asarray(hist)
    c = HistogramCalibrator(num_bits, None, unsigned, num_bins=len(hist))
    c.load_state_dict({"num_bins": len(hist), "collected": True, "hist": hist.astype(f32),
                       "bin_edges": np.linspace(0, top, len(hist) + 1).astype(f32)})
    return c


def mse_loop(c, stride=1, start_bin=128):
    """PQ's mse search, one candidate at a time (the pre-vectorisation code)."""
    edges = np.asarray(c.bin_edges, f32)
    centers = ((edges[1:] + edges[:-1]) / f32(2)).astype(f32)
    counts = c.hist.astype(np.int64).astype(f32)
    n = f32(len(centers))
    candidates = range(start_bin, len(centers), stride)
    mses = []
    for i in candidates:
        qc = fake_quant_amax(centers, centers[i], c.num_bits, unsigned=c.unsigned,
                             narrow_range=True)
        d = (qc - centers).astype(f32)
        err = ((d * d).astype(f32) * counts).astype(f32)
        mses.append(f32(torch_numerics.sum_f32(err) / n))
    return np.asarray(centers[candidates[int(np.argmin(np.array(mses, f32)))]], f32)


def outcome(fn, *args, **kw):
    """fn's result as bytes, or its exception (PQ's count check fails at
    candidate 0, for example)."""
    try:
        return fn(*args, **kw).tobytes()
    except (RuntimeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def entropy_loop(c, **kw):
    """compute_amax("entropy") with every candidate evaluated exactly."""
    screen = calib._entropy_screen
    calib._entropy_screen = lambda *a, **k: None
    try:
        return c.compute_amax("entropy", **kw)
    finally:
        calib._entropy_screen = screen


def random_histogram(rng):
    """Counts of several shapes: smooth, heavy-tailed, sparse, spiky, flat."""
    n = int(rng.choice([4, 16, 33, 128, 300, 2048]))
    kind = int(rng.integers(6))
    if kind == 0:
        h = np.exp(-np.linspace(0, rng.uniform(1, 20), n)) * 1e4
    elif kind == 1:
        h = 1e5 / (1 + np.arange(n)) ** rng.uniform(1, 4)
    elif kind == 2:
        h = rng.integers(0, 3, n) * (rng.random(n) < 0.2)
    elif kind == 3:
        h = np.zeros(n)
        h[rng.integers(0, n, int(rng.integers(1, 6)))] = rng.integers(1, 1000, 1)
    elif kind == 4:
        h = np.full(n, float(rng.integers(1, 50)))
    else:
        h = rng.poisson(rng.uniform(0.1, 30), n)
    h = np.floor(h)
    if h.sum() == 0:
        h[int(rng.integers(n))] = 1
    return h


def test_torch_sum_columns_is_the_sum_of_each_column():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    for n in (0, 1, 5, 7, 8, 9, 100, 2047, 2048, 4099):
        cols = (rng.random((n, 13)) * rng.choice([1, 1e-6, 1e6]) * (rng.random((n, 13)) < 0.6))
        cols = cols.astype(f32)
        got = torch_numerics.sum_f32_columns(cols)
        assert got.dtype == f32 and got.shape == (13,)
        for k in range(13):
            one = torch_numerics.sum_f32(cols[:, k].copy())
            assert got[k].tobytes() == f32(one).tobytes()
            assert got[k] == torch.from_numpy(cols[:, k].copy()).sum().item()


@pytest.mark.parametrize("seed", range(24))
def test_mse_search_equals_the_loop(seed):
    rng = np.random.default_rng(seed)
    hist = random_histogram(rng)
    c = with_hist(hist, int(rng.integers(2, 17)), bool(rng.integers(2)),
                  float(rng.choice([1e-3, 1.0, 300.0])))
    stride = int(rng.choice([1, 2, 5]))
    start = int(rng.integers(0, len(hist)))
    assert c.compute_amax("mse", stride=stride, start_bin=start).tobytes() == \
        mse_loop(c, stride, start).tobytes()


def test_mse_search_equals_the_loop_on_collected_data():
    rng = np.random.default_rng(7)
    x = (rng.standard_t(3, size=200_000) / 8).astype(f32)
    for bits, unsigned in ((8, False), (4, False), (8, True), (16, False)):
        c = HistogramCalibrator(bits, None, unsigned)
        c.collect(np.abs(x) if unsigned else x)
        assert c.compute_amax("mse").tobytes() == mse_loop(c).tobytes()


@pytest.mark.parametrize("seed", range(60))
def test_entropy_screen_keeps_pq_choice(seed):
    rng = np.random.default_rng(1000 + seed)
    hist = random_histogram(rng)
    c = with_hist(hist, int(rng.integers(2, 9)), bool(rng.integers(2)))
    kw = dict(stride=int(rng.choice([1, 1, 2, 7])), start_bin=int(rng.integers(0, len(hist) + 1)))
    assert outcome(c.compute_amax, "entropy", **kw) == outcome(entropy_loop, c, **kw)


@settings(max_examples=150)
@given(st.lists(st.integers(0, 60), min_size=2, max_size=90), st.integers(2, 7),
       st.booleans(), st.integers(0, 40), st.integers(1, 4))
def test_entropy_screen_keeps_pq_choice_hypothesis(hist, bits, unsigned, start, stride):
    c = with_hist(hist, bits, unsigned)
    kw = dict(stride=stride, start_bin=min(start, len(hist)))
    assert outcome(c.compute_amax, "entropy", **kw) == outcome(entropy_loop, c, **kw)


def test_entropy_screen_prunes_and_keeps_ties():
    """A real histogram leaves one or two candidates to evaluate; exact ties
    (mass in 4 bins, 8 levels: every candidate up to 12 bins maps each of
    them to its own level, KL = 0) are all kept, so the last one wins."""
    rng = np.random.default_rng(5)
    x = rng.standard_t(3, size=100_000).astype(f32)
    for bits in (4, 8):
        c = HistogramCalibrator(bits)
        c.collect(x)
        bins = c.hist.astype(np.int64)
        bins[0] = bins[1]
        keep = calib._entropy_screen(bins, list(range(128, len(bins) + 1)),
                                     1 << (bits - 1), int(bins.sum()))
        assert keep is not None and 1 <= len(keep) <= 3
    bins = np.zeros(64, np.int64)
    bins[:4] = [5, 5, 7, 2]
    cands = list(range(4, 65))
    keep = calib._entropy_screen(bins, cands, 8, int(bins.sum()))
    kl = [calib._entropy_divergence(bins, i, 8, int(bins.sum())) for i in cands]
    tied = [k for k, v in enumerate(kl) if v == min(kl)]
    assert len(tied) == 9 and set(tied) <= set(keep.tolist())
    c = with_hist(bins, num_bits=4)
    assert float(c.compute_amax("entropy", start_bin=4)) == float(c.bin_edges[12])


def test_entropy_screen_steps_aside():
    """Cases the screen leaves to the full loop: more levels than bins,
    counts large enough for PQ's count check to matter, negative counts."""
    bins = np.arange(1, 65, dtype=np.int64)
    assert calib._entropy_screen(bins, [8, 16], 128, int(bins.sum())) is None
    huge = bins * (1 << 46)
    assert calib._entropy_screen(huge, [8, 16], 8, int(huge.sum())) is None
    neg = bins.copy()
    neg[3] = -1
    assert calib._entropy_screen(neg, [8, 16], 8, int(neg.sum())) is None
    assert calib._entropy_screen(bins, [8, 16], 8, int(bins.sum())) is not None


@pytest.mark.parametrize("nq", [2, 4, 8, 128, 256, 2048])
def test_entropy_groups_are_numpy_linspace_digitize(nq):
    """The screen's groups (bin j in group g when ceil(k * (i / nq)) <= j)
    are PQ's ``digitize(arange(i), linspace(0, i, nq + 1)) - 1``."""
    rng = np.random.default_rng(nq)
    for i in list(range(0, 40)) + rng.integers(40, 5000, 150).tolist():
        edge = np.arange(nq + 1, dtype=np.float64) * (i / nq)
        edge[-1] = i
        first = np.ceil(edge).astype(np.int64)
        ours = np.searchsorted(first, np.arange(i), side="right") - 1
        assert np.array_equal(ours, np.digitize(np.arange(i), np.linspace(0, i, nq + 1)) - 1)
