"""The np.histogram kernel (``quantcore/_cpu/_hist.pyx``) against numpy
itself: the same int64 counts for float32 data on every bin edge and its
float32 neighbours, NaN, +-inf, values out of range, empty input, one bin,
explicit edges with duplicates, ``|x|``; and the same counts for 1, 2 and 3
threads (the data is large enough for every thread to get a share)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore._cpu import _hist as H
from quantcore.compat import onnxruntime as O

F32 = np.float32
THREADS = (1, 2, 3)
#: above _hist's serial cut-off (32768 values): the threads really split the data
PARALLEL_SIZE = 70_000


def near(values, rng, n, ulps=2):
    """``n`` float32 values picked from ``values``, each moved 0..``ulps``
    float32 steps down or up (so every edge and its neighbours occur)."""
    values = np.asarray(values, F32)
    out = values[rng.integers(0, values.size, n)]
    for _ in range(ulps):
        step = rng.integers(-1, 2, n)
        out = np.where(step == 0, out, np.nextafter(out, np.where(step > 0, F32(np.inf),
                                                                  F32(-np.inf)))).astype(F32)
    return out


def sample(rng, edges, n, lo, hi):
    """Normal values over [lo, hi] and a little beyond, a third of them on
    or next to the edges, plus NaN, +-inf, signed zeros and the range ends."""
    x = (rng.normal(size=n) * (hi - lo) * 0.4 + (lo + hi) / 2).astype(F32)
    k = n // 3
    x[:k] = near(edges, rng, k)
    if n > 100:
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, lo, hi], F32)
        x[rng.integers(0, n, 50)] = specials[rng.integers(0, specials.size, 50)]
    rng.shuffle(x)
    return x


def uniform_case(seed):
    rng = np.random.default_rng(seed)
    bins = int(rng.choice([1, 2, 3, 7, 128, 2048, 4097]))
    scale = 10.0 ** rng.integers(-4, 4)
    lo = F32(rng.normal() * scale)
    hi = F32(lo + abs(rng.normal()) * scale + scale * 1e-3)
    n = int(rng.choice([0, 1, 5, 1000, PARALLEL_SIZE]))
    edges = np.linspace(lo, hi, bins + 1, dtype=F32)   # what numpy builds for this call
    return sample(rng, edges, n, lo, hi), edges, lo, hi


@pytest.mark.parametrize("seed", range(40))
def test_uniform_bins_match_numpy(seed):
    x, edges, lo, hi = uniform_case(seed)
    bins = edges.size - 1
    expected, np_edges = np.histogram(x, bins, range=(lo, hi))
    assert np.array_equal(np_edges, edges)
    for nthreads in THREADS:
        got = H.hist_uniform_f32(x, edges, float(lo), float(hi), False, nthreads)
        assert got.dtype == np.int64
        assert np.array_equal(got, expected), (seed, nthreads)


def narrow_cases():
    """(lo, hi, bins) with float32 edges that numpy accepts (increasing)."""
    out = []
    for lo, width in [(1000.0, 0.5), (-3e5, 7.0), (1e-3, 1e-9), (2.0, 1e-5), (-1.0, 2.0),
                      (0.0, 1e-30), (-4e30, 8e30)]:
        for bins in (1, 3, 128, 2048, 50_000):
            lo32, hi32 = F32(lo), F32(lo + width)
            edges = np.linspace(lo32, hi32, bins + 1, dtype=F32)
            if np.all(edges[:-1] < edges[1:]):
                out.append((lo32, hi32, bins))
    return out


@pytest.mark.parametrize("lo, hi, bins", narrow_cases())
def test_uniform_bins_match_numpy_for_narrow_ranges_far_from_zero(lo, hi, bins):
    """Where float32 edges sit far from their exact positions (in bins),
    the kernel must correct more values, never fewer: every value of the
    range on a grid of 70 000 float32 steps, and the edges' neighbours."""
    rng = np.random.default_rng(bins)
    edges = np.linspace(lo, hi, bins + 1, dtype=F32)
    x = np.concatenate([np.linspace(lo, hi, PARALLEL_SIZE, dtype=F32),
                        near(edges, rng, 20_000, ulps=3)])
    expected = np.histogram(x, bins, range=(lo, hi))[0]
    for nthreads in (1, 2):
        assert np.array_equal(H.hist_uniform_f32(x, edges, float(lo), float(hi), False, nthreads),
                              expected)


@pytest.mark.parametrize("t, bins", [(5.0, 2048), (5.0, 2047), (3.3, 128), (1e-20, 2), (7.0, 1)])
@pytest.mark.parametrize("absolute", [False, True])
def test_zeros_on_an_edge_match_numpy(t, bins, absolute):
    """ORT's (-t, t) ranges put 0 on an edge for an even bin count; a ReLU's
    output is half zeros (+0 and -0)."""
    rng = np.random.default_rng(bins)
    x = np.maximum(rng.normal(size=PARALLEL_SIZE).astype(F32) * F32(t), F32(0))
    x[::3] = F32(-0.0)
    lo, hi = (F32(0), F32(t)) if absolute else (F32(-t), F32(t))
    edges = np.linspace(lo, hi, bins + 1, dtype=F32)
    expected = np.histogram(np.abs(x) if absolute else x, bins, range=(lo, hi))[0]
    for nthreads in (1, 2):
        got = H.hist_uniform_f32(x, edges, float(lo), float(hi), absolute, nthreads)
        assert np.array_equal(got, expected)


@pytest.mark.parametrize("seed", range(20))
def test_uniform_bins_of_absolute_values_match_numpy(seed):
    x, _, lo, hi = uniform_case(seed)
    lo, hi = F32(abs(lo) * 0.5), F32(abs(hi) + abs(lo))
    bins = int(np.random.default_rng(seed).choice([1, 5, 2048]))
    edges = np.linspace(lo, hi, bins + 1, dtype=F32)
    x[: x.size // 4] = near(np.concatenate([edges, -edges]), np.random.default_rng(seed),
                            x.size // 4)
    expected, _ = np.histogram(np.abs(x), bins, range=(lo, hi))
    for nthreads in THREADS:
        got = H.hist_uniform_f32(x, edges, float(lo), float(hi), True, nthreads)
        assert np.array_equal(got, expected), (seed, nthreads)


def edges_case(seed, dtype):
    """Non-decreasing edges with duplicates (runs of equal edges)."""
    rng = np.random.default_rng(1000 + seed)
    n_edges = int(rng.choice([2, 3, 10, 300, 2049]))
    steps = np.abs(rng.normal(size=n_edges)) * 10.0 ** rng.integers(-3, 3)
    steps[rng.random(n_edges) < 0.2] = 0.0              # duplicates
    edges = (rng.normal() + np.cumsum(steps)).astype(dtype)
    edges = np.maximum.accumulate(edges)                # float32 rounding keeps it sorted
    lo, hi = F32(edges[0]), F32(edges[-1])
    n = int(rng.choice([0, 7, 2000, PARALLEL_SIZE]))
    pad = F32(max(hi - lo, 1.0))
    return sample(rng, edges.astype(F32), n, F32(lo - pad), F32(hi + pad)), edges


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", range(20))
def test_explicit_edges_match_numpy(seed, dtype):
    x, edges = edges_case(seed, dtype)
    expected, _ = np.histogram(x, bins=edges)
    for nthreads in THREADS:
        got = H.hist_edges_f32(x, edges.astype(np.float64), False, nthreads)
        assert np.array_equal(got, expected), (seed, nthreads)
        got_abs = H.hist_edges_f32(x, edges.astype(np.float64), True, nthreads)
        assert np.array_equal(got_abs, np.histogram(np.abs(x), bins=edges)[0]), (seed, nthreads)


@pytest.mark.parametrize("edges", [[0.0, 0.0], [0.0, 1.0, 1.0, 1.0, 2.0], [-1.0, -1.0, 3.0, 3.0],
                                   [5.0, 5.0, 5.0]])
def test_duplicate_edges_every_bin_value(edges):
    """Values equal to a repeated edge land where numpy puts them (the last
    of the equal edges opens the bin; the top edge closes the last bin)."""
    e = np.array(edges)
    x = np.concatenate([near(e, np.random.default_rng(0), 5000, ulps=1),
                        e.astype(F32)]).astype(F32)
    for nthreads in THREADS:
        got = H.hist_edges_f32(np.tile(x, 14), e, False, nthreads)
        assert np.array_equal(got, np.histogram(np.tile(x, 14), bins=e)[0])


def test_empty_input_and_one_bin():
    empty = np.zeros(0, F32)
    edges = np.array([F32(-1), F32(1)])
    assert np.array_equal(H.hist_uniform_f32(empty, edges, -1.0, 1.0, False, 2), [0])
    assert np.array_equal(H.hist_edges_f32(empty, edges.astype(np.float64), False, 2), [0])
    x = np.array([-1, -1.0000001, 1, 1.0000001, np.nan, np.inf, 0], F32)
    assert np.array_equal(H.hist_uniform_f32(x, edges, -1.0, 1.0, False, 1),
                          np.histogram(x, 1, range=(F32(-1), F32(1)))[0])


def test_only_nan_and_infinities_count_nothing():
    x = np.array([np.nan, np.inf, -np.inf] * 20000, F32)
    edges = np.linspace(F32(-3), F32(3), 65, dtype=F32)
    for nthreads in THREADS:
        assert not H.hist_uniform_f32(x, edges, -3.0, 3.0, False, nthreads).any()
        assert not H.hist_edges_f32(x, edges.astype(np.float64), True, nthreads).any()


@pytest.mark.parametrize("seed", range(10))
def test_absmin_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=int(rng.choice([1, 3, 1000, PARALLEL_SIZE]))).astype(F32)
    if seed % 3 == 1:
        x[rng.integers(0, x.size)] = -0.0
    if seed % 3 == 2:
        x[rng.integers(0, x.size)] = np.nan
    if seed % 4 == 3:
        x[rng.integers(0, x.size)] = -np.inf
    expected = np.abs(x).min()
    for nthreads in THREADS:
        got = H.absmin_f32(x, nthreads)
        assert ((np.isnan(got) and np.isnan(expected))
                or F32(got).view(np.uint32) == expected.view(np.uint32))


@pytest.mark.parametrize("size", [1, 15, 16, 17, 40, 1000])
def test_absmin_finds_the_value_and_the_nan_in_every_lane_and_the_tail(size):
    x = np.linspace(F32(-3), F32(5), size, dtype=F32) + F32(0.25)
    for k in range(size):
        y = x.copy()
        y[k] = F32(-1e-30)              # the minimum of |y| at k
        assert F32(H.absmin_f32(y)) == F32(1e-30)
        y[k] = np.nan
        assert np.isnan(H.absmin_f32(y))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 0.5, -0.5, 2.0, -3.0, np.inf, -np.inf,
                                 np.nan]) | st.floats(width=32), min_size=1, max_size=40),
       st.sampled_from([1, 70_000]))
def test_absmin_from_the_range_statistics_is_numpys(values, repeat):
    """min |x| as the calibrators take it (histogram._absmin_f32: from the
    min / max pass where the signs decide it, a pass of absmin_f32 only for
    data that crosses zero without a zero) is numpy's, bit for bit, for
    every mix of signs, zeros, infinities and NaN."""
    from quantcore.compat.onnxruntime.histogram import _absmin_f32, _minmax_f32
    x = np.resize(np.array(values, F32), len(values) * repeat)
    expected = np.abs(x).min()
    got = _absmin_f32(x, *_minmax_f32(x))
    assert type(got) is F32
    assert ((np.isnan(got) and np.isnan(expected))
            or got.view(np.uint32) == expected.view(np.uint32)), values


def test_absmin_on_bit_patterns():
    """absmin_f32 compares the patterns without their sign bit: every NaN
    (quiet or signalling, either sign, any payload) is found, and the
    smallest of +-inf, +-0, subnormals and normals is numpy's."""
    specials = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF, 0x7FBFFFFF],
                        np.uint32).view(F32)
    values = np.array([np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, -1.17549435e-38, 3.5, -2.0,
                       np.finfo(F32).max, -np.finfo(F32).max], F32)
    rng = np.random.default_rng(7)
    for _ in range(200):
        x = rng.choice(values, size=int(rng.integers(1, 40)))
        if rng.random() < 0.3:
            x[rng.integers(0, x.size)] = rng.choice(specials)
        expected = np.abs(x).min()
        got = H.absmin_f32(x)
        assert ((np.isnan(got) and np.isnan(expected))
                or F32(got).view(np.uint32) == expected.view(np.uint32)), x


def test_wrapper_np_histogram_matches_numpy_with_autodetected_range():
    """quantcore.compat.onnxruntime.np_histogram: counts and edges of numpy's
    own call (range from the data, +-0.5 for a constant array)."""
    rng = np.random.default_rng(7)
    for x in (rng.normal(size=PARALLEL_SIZE).astype(F32), np.full(40000, 3.0, F32),
              np.array([-0.0, 0.0], F32)):
        for bins in (1, 128, 2048):
            counts, edges = O.np_histogram(x, bins)
            exp_counts, exp_edges = np.histogram(x, bins)
            assert np.array_equal(counts, exp_counts)
            assert exp_edges.dtype == edges.dtype and np.array_equal(
                edges.view(np.uint32), exp_edges.view(np.uint32))
    with pytest.raises(ValueError, match=r"autodetected range of \[nan, nan\] is not finite"):
        O.np_histogram(np.array([1.0, np.nan], F32), 8)


@pytest.mark.parametrize("call, message", [
    (lambda: H.hist_uniform_f32(np.zeros(4), np.zeros(3, F32), 0.0, 1.0, False, 1),
     "expected an aligned C-contiguous float32 array"),
    (lambda: H.hist_uniform_f32(np.zeros(8, F32)[::2], np.zeros(3, F32), 0.0, 1.0, False, 1),
     "expected an aligned C-contiguous float32 array"),
    (lambda: H.hist_uniform_f32(np.zeros(4, F32), np.zeros(3), 0.0, 1.0, False, 1),
     "edges must be a C-contiguous float32 array"),
    (lambda: H.hist_uniform_f32(np.zeros(4, F32), np.zeros(1, F32), 0.0, 1.0, False, 1),
     "need at least 2 edges"),
    (lambda: H.hist_edges_f32(np.zeros(4, F32), np.zeros(3, F32), False, 1),
     "edges must be a C-contiguous float64 array"),
    (lambda: H.hist_edges_f32(np.zeros(4, F32), np.zeros(1), False, 1), "need at least 2 edges"),
    (lambda: H.absmin_f32(np.zeros(0, F32)), "empty array"),
])
def test_bad_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
