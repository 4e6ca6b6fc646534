"""The one-pass histc kernel against live ``torch.histc`` (float32 CPU):
the same counts bit for bit, on values at bin edges, out of range, NaN,
+-inf, signed zeros, and independent of the thread count."""
import numpy as np
import pytest

from quantcore._cpu import _kernels as K

torch = pytest.importorskip("torch")


def torch_counts(x, bins, lo, hi):
    return torch.histc(torch.from_numpy(x), bins, lo, hi).numpy()


def edge_values(rng, bins, lo, hi, n):
    """Values on and next to the float32 bin edges of [lo, hi]."""
    edges = np.linspace(lo, hi, bins + 1).astype(np.float32)
    pick = edges[rng.integers(0, bins + 1, n)]
    step = rng.integers(-2, 3, n)
    return np.nextafter(pick, np.where(step >= 0, np.float32(np.inf), np.float32(-np.inf))) \
        if n else pick


@pytest.mark.parametrize("seed", range(40))
def test_histc_matches_torch(seed):
    rng = np.random.default_rng(seed)
    bins = int(rng.choice([1, 2, 3, 7, 100, 2048, 4097]))
    lo = float(np.float32(rng.normal() * 10.0 ** rng.integers(-3, 3)))
    hi = float(np.float32(lo + abs(rng.normal()) * 10.0 ** rng.integers(-6, 4) + 1e-30))
    n = int(rng.integers(0, 90000))
    x = (rng.normal(size=n) * (hi - lo) + (lo + hi) / 2).astype(np.float32)
    k = min(n, 500)
    x[:k] = edge_values(rng, bins, np.float32(lo), np.float32(hi), k)
    if n > 600:
        x[rng.integers(0, n, 20)] = rng.choice(
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, lo, hi], np.float32), 20)
    lo32, hi32 = float(np.float32(lo)), float(np.float32(hi))
    if not lo32 < hi32:  # torch.histc would choose its own range (see the degenerate test)
        pytest.skip("the range collapses in float32")
    expect = torch_counts(x, bins, lo32, hi32)
    for nthreads in (1, 2):
        got = K.histc_f32(x, bins, lo32, hi32, False, False, nthreads)
        assert got.dtype == np.int64 and got.shape == (bins,)
        assert np.array_equal(got.astype(np.float32), expect), (bins, lo32, hi32, nthreads)


def test_histc_absolute_and_skip_zeros():
    rng = np.random.default_rng(1)
    x = rng.normal(size=100000).astype(np.float32)
    x[::7] = 0.0
    x[1::11] = -0.0
    a = np.abs(x)
    hi = float(a.max())
    got = K.histc_f32(x, 2048, 0.0, hi, True, False, 2)
    assert np.array_equal(got.astype(np.float32), torch_counts(a, 2048, 0.0, hi))
    got = K.histc_f32(x, 2048, 0.0, hi, True, True, 2)
    assert np.array_equal(got.astype(np.float32), torch_counts(a[a != 0], 2048, 0.0, hi))


def test_histc_bad_arguments():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="float32"):
        K.histc_f32(x.astype(np.float64), 4, 0.0, 1.0, False, False, 1)
    with pytest.raises(ValueError, match="C-contiguous"):
        K.histc_f32(np.ones(8, np.float32)[::2], 4, 0.0, 1.0, False, False, 1)
    with pytest.raises(ValueError, match="bins must be >= 1"):
        K.histc_f32(x, 0, 0.0, 1.0, False, False, 1)
    with pytest.raises(ValueError, match="lo <= hi"):
        K.histc_f32(x, 4, 1.0, 0.5, False, False, 1)


@pytest.mark.parametrize("value", [0.0, 1.5, -7.0, 3e7, -2e9, 1e-30])
def test_degenerate_range_widened_as_torch(value):
    """A constant input: torch widens min == max by at least one float32
    step each way (plain +-1 vanishes for |v| >= 2**24)."""
    from quantcore.torch_numerics import histc_f32 as torch_histc_f32
    x = np.full(10, value, np.float32)
    for lo_hi in ((0.0, 0.0), (value, value)):
        expect = torch_counts(x, 8, *lo_hi)
        assert np.array_equal(torch_histc_f32(x, 8, *lo_hi), expect), lo_hi
    expect = torch_counts(np.abs(x), 8, 0.0, 0.0)  # |x| binned by the kernel
    assert np.array_equal(torch_histc_f32(x, 8, 0.0, 0.0, absolute=True), expect)
    y = np.concatenate([x, np.zeros(5, np.float32)])
    if value != 0:
        assert np.array_equal(torch_histc_f32(y, 8, 0.0, 0.0, skip_zeros=True), expect)
