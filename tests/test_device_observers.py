"""Core observers and calibrators on cupy input: the statistics are computed
and kept on the device, with the numpy path's bits.

Each scenario runs twice, once on numpy batches and once on the same
batches as cupy arrays; every statistic must agree bit for bit.  Runs on a
GPU, or on the CUDA emulator (``make gpu-emu-test``); skipped otherwise.
"""
import warnings

import numpy as np
import pytest

import quantcore as qc
import quantcore_gpu
from quantcore import calib
from quantcore._cpu import _kernels
from reference import assert_bits_equal, to_numpy

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON))]

RNG = np.random.default_rng(15)
F32 = np.float32


def batches():
    """Five (4, 3, 6) float32 batches with signed zeros, a NaN batch and a
    batch holding -inf."""
    out = [(RNG.normal(size=(4, 3, 6)) * s).astype(F32) for s in (1.0, 3.0, 0.5, 2.0, 1.5)]
    out[0][:, 1, :] = -0.0  # a channel of -0.0 only
    out[0][0, 0, 0] = 0.0
    out[2][1, 2, 3] = np.nan
    out[3][0, 0, 0] = -np.inf
    return out


BATCHES = batches()

OBSERVERS = [
    lambda axis, nan: qc.MinMaxObserver(axis=axis, nan_policy=nan),
    lambda axis, nan: qc.MovingAverageMinMaxObserver(0.25, axis=axis, nan_policy=nan),
    lambda axis, nan: qc.EMAMinMaxObserver(0.9, -1.0, 1.0, axis=axis, nan_policy=nan,
                                           num_channels=None if axis is None else 3),
    lambda axis, nan: qc.MomentumMinMaxObserver(0.75, symmetric=True, axis=axis,
                                                nan_policy=nan),
    lambda axis, nan: qc.MomentumMinMaxObserver(0.75, axis=axis, nan_policy=nan),
]


def observe_all(make, axis, nan, xp):
    """The observer after all batches (numpy's skip warnings asserted)."""
    obs = make(axis, nan)
    for b in BATCHES:
        skipped = nan == "skip" and not np.isfinite(b).all()
        if skipped and xp is np:
            with pytest.warns(RuntimeWarning, match="was skipped"):
                obs.update(b)
        else:  # (a batch skipped on the device is counted without a warning)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                obs.update(xp.asarray(b))
    return obs


@pytest.mark.parametrize("nan", ["skip", "propagate"])
@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("k", range(len(OBSERVERS)))
def test_observer_state_on_device_bit_equal(k, axis, nan):
    host = observe_all(OBSERVERS[k], axis, nan, np)
    dev = observe_all(OBSERVERS[k], axis, nan, cp)
    assert isinstance(dev.min_val, cp.ndarray) and isinstance(dev.max_val, cp.ndarray)
    for name in ("min_val", "max_val"):
        assert_bits_equal(to_numpy(getattr(dev, name)), getattr(host, name), name)
    assert (dev.num_batches, dev.nonfinite_batches) == (host.num_batches, host.nonfinite_batches)
    s_dev, z_dev = dev.calculate_qparams(-128, 127)
    s_host, z_host = host.calculate_qparams(-128, 127)
    assert isinstance(s_dev, cp.ndarray)
    assert_bits_equal(to_numpy(s_dev), s_host)
    assert np.array_equal(to_numpy(z_dev), z_host)


def test_observer_moves_between_host_and_device():
    """numpy and cupy batches in any order continue one state; state_dict /
    load_state_dict, pickling and merge see the device state."""
    import pickle
    host = qc.MinMaxObserver(axis=1)
    mixed = qc.MinMaxObserver(axis=1)
    for i, b in enumerate(BATCHES[:2] + BATCHES[4:] + BATCHES[:2]):
        host.update(b)
        mixed.update(cp.asarray(b) if i % 2 == 0 else b)
    assert isinstance(mixed.min_val, cp.ndarray)
    assert_bits_equal(to_numpy(mixed.min_val), host.min_val)
    assert mixed.num_batches == host.num_batches == 5
    copy = pickle.loads(pickle.dumps(mixed))
    assert type(copy.min_val) is np.ndarray and copy.num_batches == 5
    assert_bits_equal(copy.max_val, host.max_val)
    other = qc.MinMaxObserver(axis=1)
    other.update(cp.asarray(BATCHES[4] * 3))
    host_other = qc.MinMaxObserver(axis=1)
    host_other.update(BATCHES[4] * 3)
    mixed.merge(other)
    host.merge(host_other)
    assert_bits_equal(to_numpy(mixed.max_val), host.max_val)
    assert mixed.num_batches == 6
    loaded = qc.MinMaxObserver(axis=1)
    loaded.load_state_dict(other.state_dict())
    loaded.update(cp.asarray(BATCHES[1]))
    host_other.update(BATCHES[1])
    assert_bits_equal(to_numpy(loaded.min_val), host_other.min_val)
    assert loaded.num_batches == 2


def test_observer_raise_policy_on_device():
    obs = qc.MovingAverageMinMaxObserver(0.5, nan_policy="raise")
    obs.update(cp.asarray(BATCHES[0]))
    before = to_numpy(obs.min_val).copy()
    with pytest.raises(ValueError, match="NaN or inf"):
        obs.update(cp.asarray(BATCHES[2]))
    assert_bits_equal(to_numpy(obs.min_val), before)
    assert (obs.num_batches, obs.nonfinite_batches) == (1, 0)
    with pytest.raises(ValueError, match="channels"):
        per_channel = qc.MinMaxObserver(axis=1)
        per_channel.update(cp.asarray(BATCHES[0]))
        per_channel.update(cp.asarray(BATCHES[0][:, :2]))


# qc_observe_update's rules and flags: the CPU extension and the GPU's last
# block apply the same header function.
_STATES = np.array([[np.inf, -np.inf], [0.0, 0.0], [-0.0, -0.0], [-1.5, 2.5], [np.nan, 1.0],
                    [0.0, 3.0]], F32)
_BATCH = np.array([[-0.0, 0.0], [-2.0, 0.0], [-0.0, -0.0], [-0.5, 4.0], [-1.0, 1.0],
                   [1.0, 2.0]], F32)
_MODES = [("minmax", ()), ("moving_average", ()), ("moving_average", ("inf_resets",)),
          ("ema", ()), ("ema", ("include_zero",)), ("ema", ("from_zero", "include_zero")),
          ("momentum", ()), ("momentum", ("absmax",)), ("minmax", ("first_if_empty",))]


@pytest.mark.parametrize("rule,flags", _MODES)
def test_observe_update_rules_host_equals_device(rule, flags):
    from quantcore_gpu import kernels as G
    assert _kernels.OBS_EMA == G._OBSERVERS["ema"] and _kernels.OBS_MOMENTUM == \
        G._OBSERVERS["momentum"]
    for name, value in G.OBS_FLAGS.items():
        assert getattr(_kernels, "OBS_" + name.upper()) == value
    C = len(_STATES)
    # one channel per row: x's channel c holds the batch's (lo, hi) of row c
    x = np.ascontiguousarray(_BATCH.T)  # (2, C): channel c = column c
    mode = G._OBSERVERS[rule]
    for name in flags:
        mode |= G.OBS_FLAGS[name]
    for count in (0, 3):
        smin, smax = _STATES[:, 0].copy(), _STATES[:, 1].copy()
        _kernels.observe_update(mode, count == 0, F32(0.25), F32(0.75), smin, smax,
                                _BATCH[:, 0].copy(), _BATCH[:, 1].copy())
        st = G.ObserverState(C, np.float32)
        st.min_val[...] = cp.asarray(_STATES[:, 0])
        st.max_val[...] = cp.asarray(_STATES[:, 1])
        st.counts[...] = cp.asarray(np.array([count, 0], np.int64))
        G.observe(cp.asarray(x.reshape(-1)), 2, C, 1, st, observer=rule, averaging_constant=0.25,
                  decay=0.75, flags=flags, nan_policy="propagate", qscheme=None)
        assert_bits_equal(to_numpy(st.min_val), smin, f"{rule}{flags} min")
        assert_bits_equal(to_numpy(st.max_val), smax, f"{rule}{flags} max")


# ---------------------------------------------------------------- calibrators
CAL_BATCHES = [(RNG.normal(size=(4, 3, 50)) * s).astype(F32) for s in (1.0, 2.5, 0.5, 4.0)]
CAL_BATCHES[0][0, 0, :5] = [0.0, -0.0, 0.0, 0.0, 0.0]
CAL_BATCHES[2] = np.abs(CAL_BATCHES[2])  # non-negative: the unsigned binning


def calibrate(xp):
    out = []
    for axis in (None, 1, (0, 2)):
        mc = calib.MaxCalibrator(8, axis=axis, track_amax=True)
        for b in CAL_BATCHES:
            mc.collect(xp.asarray(b))
        out += [mc.compute_amax(), *mc.amaxs]
    for torch_hist in (True, False):
        for skip in (False, True):
            hc = calib.HistogramCalibrator(8, None, False, num_bins=64, skip_zeros=skip,
                                           torch_hist=torch_hist)
            for b in CAL_BATCHES:
                hc.collect(xp.asarray(b))
            out += [hc.hist, hc.bin_edges, hc.compute_amax("percentile", percentile=99.0),
                    hc.compute_amax("mse", start_bin=16), hc.compute_amax("entropy", start_bin=16)]
    th = calib.TorchHistogram(bins=64, upsample_rate=4)
    for k, b in enumerate(CAL_BATCHES):
        th.collect(xp.asarray(b - k))
    inf_batch = CAL_BATCHES[1].copy()
    inf_batch[0, 0, 0] = np.inf
    with pytest.warns(UserWarning, match="inf detected"):
        th.collect(xp.asarray(inf_batch))
    out += [th.histogram, th.min_val, th.max_val, *th.calculate_qparams(0, 255)]
    return out


def test_calibrators_on_device_bit_equal():
    host, dev = calibrate(np), calibrate(cp)
    assert len(host) == len(dev)
    assert isinstance(dev[0], cp.ndarray)  # MaxCalibrator's amax stays on the device
    for i, (h, d) in enumerate(zip(host, dev)):
        assert_bits_equal(to_numpy(d), to_numpy(h), f"result {i}")


def test_max_calibrator_nan_and_merge_on_device():
    mc = calib.MaxCalibrator(8)
    bad = CAL_BATCHES[0].copy()
    bad[1, 1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mc.collect(cp.asarray(bad))
    a, b = calib.MaxCalibrator(8, axis=1), calib.MaxCalibrator(8, axis=1)
    a.collect(cp.asarray(CAL_BATCHES[0]))
    b.collect(CAL_BATCHES[3])  # numpy: merged into the device amax
    ref = calib.MaxCalibrator(8, axis=1)
    for x in (CAL_BATCHES[0], CAL_BATCHES[3]):
        ref.collect(x)
    assert_bits_equal(to_numpy(a.merge(b).compute_amax()), ref.compute_amax())


@pytest.mark.parametrize("absolute,skip_zeros", [(False, False), (True, True)])
def test_numpy_histogram_kernel_matches_numpy(absolute, skip_zeros):
    """quantcore_gpu.kernels.histogram_f32 against np.histogram: float64
    edges (compared in float64, as numpy does: 1.0 is below the edge
    1.00000005 that rounds to 1.0 in float32) and numpy's uniform-bin rule
    on values lying on the edges."""
    from quantcore_gpu import kernels as G
    x = np.concatenate([RNG.normal(size=300).astype(F32) * 2,
                        np.array([1.0, 1.0000001, 0.5, 2.0, 2.5, np.nan, -1.0, 0.0, -0.0], F32)])
    v = np.abs(x) if absolute else x
    v = v[v != 0] if skip_zeros else v
    edges64 = np.array([0.5, 1.00000005, 1.3, 2.0, 2.0, 3.0])
    got = G.histogram_f32(cp.asarray(x), edges64, False, absolute, skip_zeros)
    assert np.array_equal(to_numpy(got), np.histogram(v, bins=edges64)[0])
    finite = v[np.isfinite(v)]
    ref, edges = np.histogram(finite, bins=37)
    on_edges = np.concatenate([finite, edges.astype(F32)])
    ref = np.histogram(on_edges, bins=edges)[0]
    got = G.histogram_f32(cp.asarray(on_edges), edges, True, absolute, False)
    assert np.array_equal(to_numpy(got), ref)


@pytest.mark.parametrize("pattern", ["cccc", "cncn"])
@pytest.mark.parametrize("make", [lambda: qc.EMAMinMaxObserver(0.9),
                                  lambda: qc.MomentumMinMaxObserver(0.8, axis=0)],
                         ids=["ema", "momentum_per_channel"])
def test_fake_quantize_with_device_observer(make, pattern):
    """FakeQuantize around an observer without a fused device rule: the
    observer updates on the device, the qparams come to the host (a small
    copy); the outputs have the numpy path's bits, in any order of numpy
    (n) and cupy (c) batches."""
    xs = [(RNG.normal(size=(4, 6)) * s).astype(F32) for s in (1.0, 2.0, 0.5, 3.0)]
    axis = make().axis
    host = qc.FakeQuantize(make(), -128, 127, axis=axis)
    dev = qc.FakeQuantize(make(), -128, 127, axis=axis)
    for x, side in zip(xs, pattern):
        want = host(x)
        got = dev(cp.asarray(x) if side == "c" else x)
        assert isinstance(got, cp.ndarray if side == "c" else np.ndarray)
        assert_bits_equal(to_numpy(got), want)
    assert_bits_equal(to_numpy(dev.scale), host.scale)
    assert_bits_equal(to_numpy(dev.observer.max_val), host.observer.max_val)
