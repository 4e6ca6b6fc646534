"""Calibrators (quantcore.calib): NVIDIA pytorch_quantization's max and
histogram calibrators (the project's NVIDIA / Horizon specification section 3) and the statistics
of PyTorch's HistogramObserver (the project's PyTorch specification section 2).

The live comparisons need torch (installed by ``make test``) and skip
without it.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from quantcore.calib import HistogramCalibrator, MaxCalibrator, TorchHistogram
from quantcore.torch_numerics import arange_f32 as torch_arange_f32
from quantcore.torch_numerics import histc_f32 as torch_histc_f32
from quantcore.torch_numerics import linspace_f32 as torch_linspace_f32

f32 = np.float32


# ------------------------------------------------------------ spec vector
def spec_batches():
    k = (np.arange(200) * 37) % 101 - 50
    b1 = (k ** 3 / 50 ** 3 * 1.25).astype(f32)
    b2 = np.array([2.0, -0.25, 0.1, 0.0], f32)
    return b1, b2


HIST_B1 = [61, 16, 12, 7, 8, 8, 8, 4, 4, 4, 8, 4, 4, 0, 4, 4, 4, 4, 4, 0, 4, 4, 0, 4, 4, 0, 4,
           0, 4, 0, 4, 4]


def test_spec_vector_histogram():
    b1, b2 = spec_batches()
    c = HistogramCalibrator(4, None, False, num_bins=32)
    c.collect(b1)
    assert c.bin_edges[-1] == f32(1.25)
    assert len(c.bin_edges) == 33
    assert c.hist.tolist() == HIST_B1
    c.collect(b2)
    assert c.num_bins == 52
    assert len(c.hist) == 52 and len(c.bin_edges) == 53
    assert c.bin_edges[-1] == f32(2.03125)
    assert c.hist[:8].tolist() == [62, 16, 13, 7, 8, 8, 9, 4]
    # b2's own counts: 0 and 0.1 in bin 0, 0.25 in bin 2, 2.0 in bin 51
    # (the old counts are added by index on top)
    assert c.hist[8:32].tolist() == HIST_B1[8:]
    assert not c.hist[32:51].any() and c.hist[51] == 1

    def amax(*a, **kw):
        r = c.compute_amax(*a, **kw)
        assert r.dtype == f32 and r.shape == ()
        return float(r)

    assert amax("percentile", percentile=90) == 0.9375
    assert amax("percentile", percentile=99.99) == 1.9921875
    assert amax("percentile") == 1.9921875
    assert amax("entropy", start_bin=8) == 1.25
    assert amax("mse", start_bin=8) == 1.66015625
    # compute_amax does not change the histogram (no bins[0] = bins[1] side effect)
    assert c.hist[:8].tolist() == [62, 16, 13, 7, 8, 8, 9, 4]


def test_spec_vector_max():
    b1, b2 = spec_batches()
    m = MaxCalibrator(4, None, False)
    assert m.compute_amax() is None
    m.collect(b1)
    m.collect(b2)
    a = m.compute_amax()
    assert a.shape == () and a.dtype == f32 and float(a) == 2.0


# ---------------------------------------------------------- MaxCalibrator
@pytest.mark.parametrize("axis,shape,expect", [
    (None, (2, 2), ()), (0, (2, 2), (2, 1)), ((1,), (2, 3, 4), (1, 3, 1)),
    (-1, (2, 3, 4), (1, 1, 4)), ((0, 2), (2, 3, 4), (2, 1, 4)), (0, (1, 5), ())])
def test_max_shapes(axis, shape, expect):
    x = np.random.default_rng(0).normal(size=shape).astype(f32)
    m = MaxCalibrator(axis=axis)
    m.collect(x)
    a = m.compute_amax()
    assert a.shape == expect
    keep = () if axis is None else tuple(np.atleast_1d(axis) % x.ndim)
    red = tuple(d for d in range(x.ndim) if d not in keep)
    np.testing.assert_array_equal(a, np.abs(x).max(axis=red, keepdims=True).reshape(expect))


@settings(max_examples=25, deadline=None)
@given(x=hnp.arrays(f32, st.tuples(st.integers(8, 40), st.integers(1, 5), st.integers(1, 3)),
                    elements=st.floats(-1e6, 1e6, width=32)),
       axis=st.sampled_from([None, 1, 2, (1, 2), -2]))
def test_max_merge_over_chunks_equals_single_pass(x, axis):
    single = MaxCalibrator(axis=axis)
    single.collect(x)
    streamed = MaxCalibrator(axis=axis)
    merged = MaxCalibrator(axis=axis)
    for chunk in np.array_split(x, 8, axis=0):
        streamed.collect(chunk)
        part = MaxCalibrator(axis=axis)
        part.collect(chunk)
        merged.merge(part)
    for other in (streamed, merged):
        a, b = single.compute_amax(), other.compute_amax()
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_max_dtypes_track_and_reset():
    m = MaxCalibrator(track_amax=True)
    m.collect(np.array([-3.0, 1.0], np.float16))
    m.collect(np.array([2.5], f32))
    assert m.compute_amax().dtype == f32 and float(m.compute_amax()) == 3.0
    assert [float(a) for a in m.amaxs] == [3.0, 2.5]
    m.reset()
    assert m.compute_amax() is None and m.amaxs == []
    m.collect(np.array([-7.0]))                      # float64 stays float64
    assert m.compute_amax().dtype == np.float64
    m.collect(np.array([-np.inf], f32))              # inf as in PQ
    assert float(m.compute_amax()) == np.inf


def test_max_errors():
    m = MaxCalibrator(axis=0)
    m.collect(np.ones((3, 2), f32))
    with pytest.raises(ValueError, match="amax shape changed"):
        m.collect(np.ones((4, 2), f32))
    with pytest.raises(ValueError, match="NaN"):
        m.collect(np.array([[np.nan, 1.0], [1, 1], [1, 1]], f32))
    assert m.compute_amax().shape == (3, 1)          # state unchanged
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        MaxCalibrator(axis=3).collect(np.ones((2, 2)))
    with pytest.raises(TypeError, match="axis must be an int"):
        MaxCalibrator(axis=1.5)
    with pytest.raises(ValueError, match="num_bits"):
        MaxCalibrator(num_bits=1)
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        MaxCalibrator().collect(np.array(["a"]))
    other = MaxCalibrator(axis=0)
    other.collect(np.ones((5, 2), f32))
    with pytest.raises(ValueError, match="amax shapes differ"):
        m.merge(other)
    with pytest.raises(ValueError, match="axis differs"):
        m.merge(MaxCalibrator(axis=1))
    with pytest.raises(TypeError, match="must be a MaxCalibrator"):
        m.merge(HistogramCalibrator())


def test_max_state_round_trip():
    rng = np.random.default_rng(1)
    m = MaxCalibrator(axis=1)
    m.collect(rng.normal(size=(4, 3)).astype(f32))
    sd = m.state_dict()
    assert all(isinstance(v, (np.ndarray, bool, int, float)) for v in sd.values())
    m2 = MaxCalibrator(axis=1)
    m2.load_state_dict(sd)
    np.testing.assert_array_equal(m2.compute_amax(), m.compute_amax())
    assert m2.compute_amax().dtype == m.compute_amax().dtype
    empty = MaxCalibrator()
    m2.load_state_dict(empty.state_dict())
    assert m2.compute_amax() is None
    with pytest.raises(ValueError, match="state keys"):
        m2.load_state_dict({"amax": np.ones(1)})


# ----------------------------------------------------- HistogramCalibrator
def test_histogram_merge_equals_single_pass():
    rng = np.random.default_rng(2)
    x = rng.normal(size=4000).astype(f32)
    top = np.abs(x).max()
    chunks = [np.append(c, top) for c in np.array_split(x, 4)]  # same range in each part
    single = HistogramCalibrator(num_bins=128)
    single.collect(np.concatenate(chunks))
    merged = HistogramCalibrator(num_bins=128)
    for c in chunks:
        part = HistogramCalibrator(num_bins=128)
        part.collect(c)
        merged.merge(part)
    np.testing.assert_array_equal(merged.hist, single.hist)
    np.testing.assert_array_equal(merged.bin_edges, single.bin_edges)
    for method in ("percentile", "entropy", "mse"):
        assert merged.compute_amax(method, start_bin=16) == \
            single.compute_amax(method, start_bin=16)
    other = HistogramCalibrator(num_bins=128)
    other.collect(x[:10])
    with pytest.raises(ValueError, match="different bin edges"):
        merged.merge(other)
    with pytest.raises(ValueError, match="torch_hist differs"):
        merged.merge(HistogramCalibrator(torch_hist=False))


@pytest.mark.parametrize("torch_hist", [True, False])
def test_histogram_state_round_trip(torch_hist):
    rng = np.random.default_rng(3)
    a = HistogramCalibrator(num_bins=64, torch_hist=torch_hist)
    a.collect(rng.normal(size=500).astype(f32))
    b = HistogramCalibrator(num_bins=64, torch_hist=torch_hist)
    b.load_state_dict(a.state_dict())
    x2 = (rng.normal(size=300) * 3).astype(f32)
    for cal in (a, b):                                # growth after the restore
        cal.collect(x2)
    np.testing.assert_array_equal(a.hist, b.hist)
    np.testing.assert_array_equal(a.bin_edges, b.bin_edges)
    assert a.num_bins == b.num_bins
    assert a.compute_amax("entropy", start_bin=8) == b.compute_amax("entropy", start_bin=8)
    sd = a.state_dict()
    assert all(isinstance(v, (np.ndarray, bool, int)) for v in sd.values())
    a.reset()
    assert a.compute_amax("percentile") is None
    b.load_state_dict(a.state_dict())
    assert b.hist is None and b.compute_amax("mse") is None


def test_histogram_numpy_path():
    rng = np.random.default_rng(4)
    x1 = rng.normal(size=1000).astype(f32)
    x2 = (rng.normal(size=1000) * 4).astype(f32)
    c = HistogramCalibrator(num_bins=50, torch_hist=False)
    c.collect(x1)
    h, e = np.histogram(np.abs(x1), bins=50)           # range [min|x|, max|x|]
    np.testing.assert_array_equal(c.hist, h)
    np.testing.assert_array_equal(c.bin_edges, e)
    c.collect(x2)
    w = e[1] - e[0]
    e2 = np.hstack((e, np.arange(e[-1] + w, np.abs(x2).max() + w, w)))
    h2, _ = np.histogram(np.abs(x2), bins=e2)
    h2[:50] += h
    np.testing.assert_array_equal(c.bin_edges, e2)
    np.testing.assert_array_equal(c.hist, h2)
    for method in ("percentile", "entropy", "mse"):
        assert np.isfinite(c.compute_amax(method, start_bin=10))


def test_histogram_skip_zeros_and_edge_cases():
    c = HistogramCalibrator(num_bins=8, skip_zeros=True)
    c.collect(np.array([0.0, 0.0, 1.0, -0.5], f32))
    assert c.hist.sum() == 2
    with pytest.raises(ValueError, match="empty"):
        c.collect(np.zeros(3, f32))
    z = HistogramCalibrator(num_bins=8)
    z.collect(np.zeros(5, f32))                         # PQ's degenerate first batch
    assert not z.bin_edges.any() and z.hist.tolist() == [0, 0, 0, 0, 5, 0, 0, 0]
    with pytest.raises(ValueError, match="bin width is 0"):
        z.collect(np.ones(2, f32))
    h = HistogramCalibrator(num_bins=8)
    h.collect(np.ones(4, f32))
    with pytest.raises(ValueError, match="NaN or inf"):
        h.collect(np.array([1.0, np.nan], f32))
    assert h.hist.sum() == 4


def test_histogram_errors():
    with pytest.raises(NotImplementedError, match="only supports per tensor"):
        HistogramCalibrator(8, 0, False)
    with pytest.warns(DeprecationWarning, match="grow_method"):
        HistogramCalibrator(grow_method="stretch")
    with pytest.raises(ValueError, match="num_bins must be >= 1"):
        HistogramCalibrator(num_bins=0)
    c = HistogramCalibrator(num_bins=16)
    with pytest.raises(TypeError, match="Unknown calibration method max"):
        c.compute_amax("max")
    with pytest.raises(ValueError, match="Invalid percentile"):
        c.compute_amax("percentile", percentile=100.5)   # checked before the no-data check
    assert c.compute_amax("percentile") is None
    c.collect(np.linspace(0, 1, 100).astype(f32))
    with pytest.raises(ValueError, match="Invalid percentile"):
        c.compute_amax("percentile", percentile=-1)
    with pytest.raises(ValueError, match="start_bin=128"):
        c.compute_amax("entropy")
    with pytest.raises(ValueError, match="start_bin=128"):
        c.compute_amax("mse")
    with pytest.raises(ValueError, match="stride must be >= 1"):
        c.compute_amax("mse", stride=0)
    assert float(c.compute_amax("percentile", percentile=100)) <= 1.0


def test_entropy_prefers_last_minimum_and_inf_kl():
    # Uniform data: every candidate from nq bins on reproduces the histogram
    # exactly (KL = 0), so the last one, edges[len(hist)], wins.
    c = HistogramCalibrator(num_bits=3, num_bins=16)
    c.collect(np.repeat(np.arange(16, dtype=f32) + f32(0.5), 3) / f32(16))
    assert float(c.compute_amax("entropy", start_bin=4)) == float(c.bin_edges[-1])
    # an empty last candidate bin with outliers beyond: KL is inf, never chosen
    d = HistogramCalibrator(num_bits=2, num_bins=8)
    d.collect(np.array([0.05, 0.1, 0.3, 0.3, 0.45, 0.8], f32))
    amax = float(d.compute_amax("entropy", start_bin=2))
    assert amax in d.bin_edges.tolist()


# ---------------------------------------------------------- TorchHistogram
def test_torch_histogram_basics():
    th = TorchHistogram(bins=16)
    th.collect(np.array([], f32))
    assert not th.initialized
    with pytest.warns(UserWarning, match="torch.inf detected"):
        th.collect(np.array([1.0, np.inf, -2.0, -np.inf], f32))
    assert (float(th.min_val), float(th.max_val)) == (-2.0, 1.0)
    assert th.histogram.sum() == 2
    with pytest.raises(ValueError, match="NaN"):
        th.collect(np.array([np.nan], f32))
    th.collect(np.array([3.0, -1.0], f32))            # growth: mass is kept
    assert th.histogram.sum() == 4 and float(th.max_val) == 3.0
    sd = th.state_dict()
    th2 = TorchHistogram(bins=16)
    th2.load_state_dict(sd)
    assert th2.non_linear_param_search(256) == th.non_linear_param_search(256)
    with pytest.raises(ValueError, match="shape"):
        TorchHistogram(bins=8).load_state_dict(sd)
    with pytest.raises(ValueError, match="no data"):
        TorchHistogram(bins=8).non_linear_param_search()


# ------------------------------------------------- live torch comparisons
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def test_torch_primitives_match(torch):
    rng = np.random.default_rng(5)
    for _ in range(40):
        a = f32(rng.normal() * rng.choice([1, 10, 1e-3]))
        b = f32(a + abs(rng.normal()) * rng.choice([1, 100, 1e-3]))
        steps = int(rng.choice([2, 17, 33, 257, 2049, 32769]))
        np.testing.assert_array_equal(torch_linspace_f32(a, b, steps),
                                      torch.linspace(float(a), float(b), steps).numpy())
        w = f32(rng.random() * rng.choice([1, 1e-3, 10]) + 1e-6)
        end = f32(w * rng.integers(1, 3000) + rng.random() * w)
        ref = torch.arange(0, torch.tensor(end), torch.tensor(w)).numpy()
        np.testing.assert_array_equal(torch_arange_f32(end, w), ref)
        x = (rng.normal(size=500) * rng.choice([1, 1e-3, 100])).astype(f32)
        lo, hi = np.sort(rng.choice(x, 2))
        nb = int(rng.choice([7, 32, 2048]))
        np.testing.assert_array_equal(torch_histc_f32(x, nb, lo, hi),
                                      torch.histc(torch.from_numpy(x), nb, float(lo),
                                                  float(hi)).numpy())
    for x in (np.full(5, 2.5, f32), np.zeros(3, f32)):   # min == max rules
        np.testing.assert_array_equal(torch_histc_f32(x, 8, 0.0, 0.0),
                                      torch.histc(torch.from_numpy(x), 8, 0, 0).numpy())


def _pq_torch_collect(torch, batches, num_bins):
    """PQ's torch_hist=True collect, written with torch ops."""
    hist = edges = None
    for b in batches:
        x = torch.from_numpy(b).abs().float()
        xm = x.max()
        if hist is None:
            hist = torch.histc(x, bins=num_bins, min=0, max=xm)
            edges = torch.linspace(0, xm, num_bins + 1)
            continue
        if xm > edges[-1]:
            w = edges[1] - edges[0]
            num_bins = int((xm / w).ceil().item())
            edges = torch.arange(0, xm + w, w)
        h = torch.histc(x, bins=num_bins, min=0, max=edges[-1])
        h[:hist.numel()] += hist
        hist = h
    return hist.numpy(), edges.numpy(), num_bins


def test_nvidia_histogram_matches_torch_ops(torch):
    rng = np.random.default_rng(6)
    for _ in range(12):
        num_bins = int(rng.choice([32, 100, 2048]))
        batches = [(rng.standard_t(3, size=int(rng.integers(50, 2000)))
                    * rng.choice([0.5, 1, 3])).astype(f32) for _ in range(rng.integers(2, 5))]
        hist, edges, nb = _pq_torch_collect(torch, batches, num_bins)
        c = HistogramCalibrator(num_bins=num_bins)
        for b in batches:
            c.collect(b)
        np.testing.assert_array_equal(c.bin_edges, edges)
        np.testing.assert_array_equal(c.hist, hist)
        assert c.num_bins == nb


def _observe(torch, bins, batches):
    obs = torch.ao.quantization.HistogramObserver(bins=bins)
    th = TorchHistogram(bins)
    for b in batches:
        obs(torch.from_numpy(b))
        th.collect(b)
    return obs, th


def test_torch_histogram_observer_matches(torch):
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(10):
        bins = int(rng.choice([2048, 64, 100]))
        batches = []
        for _ in range(int(rng.integers(1, 5))):
            x = (rng.normal(size=int(rng.integers(1, 2000))) * rng.choice([1, 3, 0.1])
                 + rng.normal()).astype(f32)
            if rng.random() < 0.3:
                x[0] = rng.choice([20.0, -30.0])
            batches.append(x)
        cases.append((bins, batches))
    cases.append((64, [np.full(10, 1.5, f32), np.array([0.5, 2.0], f32),
                       np.array([3.0], f32)]))                     # single-valued old range
    cases.append((128, [np.arange(100, dtype=f32), np.arange(100, dtype=f32)]))  # same range
    for bins, batches in cases:
        obs, th = _observe(torch, bins, batches)
        np.testing.assert_array_equal(th.histogram, obs.histogram.numpy())
        assert th.min_val == obs.min_val.item() and th.max_val == obs.max_val.item()
        lo, hi = obs._non_linear_param_search()
        assert th.non_linear_param_search(obs.dst_nbins) == (lo.item(), hi.item())


def test_torch_quantization_error_matches(torch):
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.normal(size=3000), rng.normal(size=40) * 8]).astype(f32)
    obs, th = _observe(torch, 256, np.array_split(x, 3))
    for _ in range(30):
        s = int(rng.integers(0, 200))
        e = int(rng.integers(s, 256))
        assert th._quantization_error(s, e, obs.dst_nbins) == \
            obs._compute_quantization_error(s, e)


def test_torch_search_spec_example(torch):
    torch.manual_seed(0)
    x = torch.randn(10000)
    x[0] = 20
    obs, th = _observe(torch, 2048, [x.numpy()])
    lo, hi = obs._non_linear_param_search()
    assert th.non_linear_param_search(256) == (lo.item(), hi.item())
    assert hi.item() < 20.0                    # the outlier is clipped


def test_torch_search_deep(torch):
    # heavy tails on both sides: the search walks many steps before stopping
    rng = np.random.default_rng(9)
    x = rng.standard_cauchy(20000).astype(f32)
    x = x[np.abs(x) < 2000]
    obs, th = _observe(torch, 512, np.array_split(x, 4))
    np.testing.assert_array_equal(th.histogram, obs.histogram.numpy())
    lo, hi = obs._non_linear_param_search()
    assert th.non_linear_param_search(256) == (lo.item(), hi.item())


@pytest.mark.parametrize("scale", [5.0, 30.0, 200.0])
@pytest.mark.parametrize("bins", [256, 2048])
def test_torch_search_synthetic_histograms(torch, scale, bins):
    # smooth two-sided tails: the greedy search takes several steps
    i = np.arange(bins)
    h = np.round(1e4 * np.exp(-np.abs(i - bins * 0.4) / scale * (bins / 256))).astype(f32)
    h[::7] += f32(0.0625)                          # fractional mass, as after re-binning
    obs = torch.ao.quantization.HistogramObserver(bins=bins)
    obs.histogram = torch.from_numpy(h.copy())
    obs.min_val, obs.max_val = torch.tensor(-3.0), torch.tensor(5.0)
    th = TorchHistogram(bins)
    th.load_state_dict({"histogram": h, "min_val": -3.0, "max_val": 5.0})
    lo, hi = obs._non_linear_param_search()
    assert th.non_linear_param_search(256) == (lo.item(), hi.item())


def test_torch_sum_model(torch):
    from quantcore.torch_numerics import sum_f32 as _torch_sum_f32
    rng = np.random.default_rng(10)
    for n in (1, 5, 8, 100, 2047, 2048, 4099):
        x = (rng.random(n) * rng.choice([1, 1e-6, 1e6]) * (rng.random(n) < 0.6)).astype(f32)
        assert _torch_sum_f32(x) == torch.from_numpy(x).sum().item()


# ------------------------------------- audit additions: qparams and merge
_TORCH_HIST_CONFIGS = [
    dict(),                                                    # quint8 affine (0, 255)
    dict(dtype="qint8", qscheme="per_tensor_symmetric"),
    dict(dtype="quint8", qscheme="per_tensor_symmetric"),
    dict(reduce_range=True),
    dict(dtype="qint8", reduce_range=True),
    dict(quant_min=0, quant_max=127),
    dict(dtype="qint8", quant_min=-8, quant_max=7),
    dict(dtype="quint8", qscheme="per_tensor_symmetric", quant_min=0, quant_max=15),
    dict(bins=256, dtype="qint8", eps=2.0 ** -12),
]


@pytest.mark.parametrize("cfg", _TORCH_HIST_CONFIGS, ids=[str(c) for c in _TORCH_HIST_CONFIGS])
def test_torch_histogram_calculate_qparams_matches_live_torch(torch, cfg):
    """HistogramObserver.calculate_qparams bit for bit: TorchHistogram's
    search, then quantcore.qparams with torch's range and zero point, on
    random multi-batch data (growth, outliers, +-inf, one-valued batches)."""
    from quantcore import qparams as Q
    cfg = dict(cfg)
    bins = cfg.pop("bins", 2048)
    eps = cfg.pop("eps", 2.0 ** -23)
    dtype = cfg.get("dtype", "quint8")
    symmetric = cfg.get("qscheme") == "per_tensor_symmetric"
    qmin, qmax, custom = Q.torch_quant_range(dtype, cfg.get("reduce_range", False),
                                             cfg.get("quant_min"), cfg.get("quant_max"))
    zp = Q.torch_symmetric_zero_point(dtype, qmin, qmax, custom) if symmetric else None
    tkw = {k: getattr(torch, v) if k in ("dtype", "qscheme") else v for k, v in cfg.items()}
    rng = np.random.default_rng(abs(hash(str(cfg))) % 2 ** 32)
    for trial in range(6):
        obs = torch.ao.quantization.HistogramObserver(bins=bins, eps=eps, **tkw)
        th = TorchHistogram(bins)
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(1, 3000))
            x = (rng.standard_t(4, size=n) * rng.choice([0.01, 1, 50]) + rng.normal()).astype(f32)
            if rng.random() < 0.3:
                x[0] = rng.choice([40.0, -60.0, np.inf])
            if rng.random() < 0.1:
                x[:] = x[0] if np.isfinite(x[0]) else 1.0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obs(torch.from_numpy(x))
                th.collect(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ts, tz = obs.calculate_qparams()
        s, z = th.calculate_qparams(qmin, qmax, symmetric=symmetric, eps=eps,
                                    dst_nbins=obs.dst_nbins, zero_point=zp)
        assert (obs.quant_min, obs.quant_max) == (qmin, qmax)
        assert s.tobytes() == ts.numpy().astype(f32).tobytes(), (trial, s, ts)
        assert z.tolist() == tz.numpy().tolist(), (trial, z, tz)


def test_torch_histogram_calculate_qparams_before_data():
    with pytest.warns(RuntimeWarning, match="no data"):
        s, z = TorchHistogram(16).calculate_qparams()
    assert s.tolist() == [1.0] and z.tolist() == [0]


def test_torch_histogram_merge_of_8_chunks_equals_one_pass():
    rng = np.random.default_rng(11)
    x = (rng.standard_t(3, size=20000)).astype(f32)
    lo, hi = x.min(), x.max()
    chunks = [np.concatenate([[lo, hi], c]).astype(f32)
              for c in np.array_split(x, np.sort(rng.integers(0, x.size, 7)))]
    single = TorchHistogram(512)
    single.collect(np.concatenate(chunks))
    merged = TorchHistogram(512)
    for k in rng.permutation(8):
        part = TorchHistogram(512)
        part.collect(chunks[k])
        merged.merge(part)
    assert merged.histogram.tobytes() == single.histogram.tobytes()
    assert (merged.min_val, merged.max_val) == (single.min_val, single.max_val)
    assert merged.non_linear_param_search() == single.non_linear_param_search()
    assert merged.merge(TorchHistogram(512)) is merged                  # empty: no-op
    other = TorchHistogram(512)
    other.collect(x[:100])
    with pytest.raises(ValueError, match="different bin edges"):
        merged.merge(other)
    with pytest.raises(ValueError, match="bins differ"):
        merged.merge(TorchHistogram(64))
    with pytest.raises(TypeError, match="must be a TorchHistogram"):
        merged.merge(HistogramCalibrator())


@pytest.mark.parametrize("torch_hist", [True, False])
def test_histogram_calibrator_merge_of_8_chunks_equals_one_pass(torch_hist):
    rng = np.random.default_rng(12)
    x = rng.normal(size=30000).astype(f32)
    top = np.abs(x).max()
    bottom = np.abs(x).min()
    cuts = np.sort(rng.integers(0, x.size, 7))
    chunks = [np.concatenate([[top, bottom], c]).astype(f32) for c in np.array_split(x, cuts)]
    single = HistogramCalibrator(num_bins=256, torch_hist=torch_hist)
    single.collect(np.concatenate(chunks))
    merged = HistogramCalibrator(num_bins=256, torch_hist=torch_hist)
    for k in rng.permutation(8):
        part = HistogramCalibrator(num_bins=256, torch_hist=torch_hist)
        part.collect(chunks[k])
        merged.merge(part)
    np.testing.assert_array_equal(merged.hist, single.hist)
    np.testing.assert_array_equal(merged.bin_edges, single.bin_edges)
    for method in ("percentile", "entropy", "mse"):
        assert merged.compute_amax(method, start_bin=32) == \
            single.compute_amax(method, start_bin=32)


def test_max_calibrator_merge_of_8_random_chunks_with_signed_zeros():
    rng = np.random.default_rng(13)
    x = rng.normal(size=(64, 3)).astype(f32)
    x[rng.random(x.shape) < 0.2] = -0.0
    cuts = np.sort(rng.integers(0, 64, 7))
    for axis in (None, 1):
        single = MaxCalibrator(axis=axis)
        single.collect(x)
        merged = MaxCalibrator(axis=axis)
        for c in np.array_split(x, cuts):
            if c.size:
                part = MaxCalibrator(axis=axis)
                part.collect(c)
                merged.merge(part)
        assert merged.compute_amax().tobytes() == single.compute_amax().tobytes()


def _pq_entropy_amax(hist, edges, num_bits, unsigned, stride, start_bin):
    """PQ's _compute_amax_entropy, written as PQ does it, with SciPy."""
    from collections import Counter

    from scipy.stats import entropy
    bins = np.array(hist, dtype=np.int64)
    bins[0] = bins[1]
    divergences = []
    nbins = 1 << (num_bits - 1 + int(unsigned))
    new_density_counts = np.zeros(nbins, dtype=np.float64)
    for i in range(start_bin, len(bins) + 1, stride):
        new_density_counts.fill(0)
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += bins[idx]
        counter = Counter(digitized_space)
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.zeros(i, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference_density = np.array(bins[:len(digitized_space)])
        reference_density[-1] += np.sum(bins[i:])
        divergences.append(entropy(reference_density, new_density))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return edges[last_argmin * stride + start_bin]


@pytest.mark.parametrize("seed", range(6))
def test_entropy_without_scipy_matches_pq_with_scipy(seed):
    pytest.importorskip("scipy")
    rng = np.random.default_rng(100 + seed)
    num_bits = int(rng.choice([4, 6, 8]))
    unsigned = bool(rng.random() < 0.3)
    c = HistogramCalibrator(num_bits, None, unsigned, num_bins=int(rng.choice([200, 400])),
                            torch_hist=bool(seed % 2))
    for _ in range(int(rng.integers(1, 4))):
        x = rng.standard_t(int(rng.integers(2, 8)), size=int(rng.integers(500, 5000)))
        x[rng.random(x.size) < 0.1] = 0
        c.collect((np.abs(x) if unsigned else x).astype(f32) * f32(rng.choice([0.1, 3])))
    stride, start = int(rng.choice([1, 3])), int(rng.choice([16, 64]))
    exp = _pq_entropy_amax(c.hist.astype(np.int64), c.bin_edges.astype(f32), num_bits,
                           unsigned, stride, start)
    assert float(c.compute_amax("entropy", stride=stride, start_bin=start)) == float(exp)


def test_kl_divergence_matches_scipy_entropy():
    stats = pytest.importorskip("scipy.stats")
    from quantcore.calib import _kl_divergence
    rng = np.random.default_rng(14)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        p = rng.integers(0, 50, n) * (rng.random(n) < 0.8)
        q = rng.random(n) * (rng.random(n) < 0.9) * 40
        if p.sum() == 0:
            p[0] = 1
        assert _kl_divergence(p.astype(np.int64), q) == pytest.approx(
            stats.entropy(p, q), rel=1e-13, abs=1e-15)
