"""Every framework layer takes cupy arrays and gives cupy arrays back, with
the CPU path's bits.  Runs on a GPU or on the CUDA emulator (``make
gpu-emu-test``), whose cupy refuses implicit conversion to numpy like CuPy,
so a public entry point that would hand a device array to numpy fails.

Each scenario is run twice, once on numpy arrays and once on cupy arrays;
the results must agree bit for bit, and every array result of a call that
was given cupy arrays must be a cupy array.  Object state (attributes
such as ``scale``) and results of calls given no array (``compute_amax()``,
``calculate_qparams()``) stay numpy: they are marked ``State`` below.
"""
import warnings

import numpy as np
import pytest

from reference import bits_equal, gpu_cupy

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(11)
X = (RNG.normal(size=(4, 3, 5)) * 2).astype(np.float32)
X[0, 0, :3] = [0.5, -0.0, 1.5]
G = RNG.normal(size=X.shape).astype(np.float32)


@pytest.fixture
def cp():
    """cupy on a usable device (a GPU, or the CUDA emulator)."""
    return gpu_cupy()


class State:
    """A value that stays a numpy array (object state) in both runs."""

    def __init__(self, *values):
        self.values = values


def flatten(result):
    """The arrays and scalars of a (nested) result, in order."""
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in flatten(item)]
    if isinstance(result, dict):
        return [leaf for key in sorted(result) for leaf in flatten(result[key])]
    if isinstance(result, State):
        return [State(leaf) for leaf in flatten(list(result.values))]
    return [result]


def run_both(cp, scenario):
    host = flatten(scenario(lambda a: a))
    device = flatten(scenario(cp.asarray))
    assert len(host) == len(device)
    for h, d in zip(host, device):
        if isinstance(h, State):
            h, d = h.values[0], d.values[0]
            assert type(h) is type(d) and not isinstance(d, cp.ndarray)
        if isinstance(h, np.ndarray) and isinstance(d, np.ndarray):
            assert np.array_equal(np.atleast_1d(h).view(np.uint8), np.atleast_1d(d).view(np.uint8))
        elif isinstance(h, np.ndarray):
            assert isinstance(d, cp.ndarray), f"expected a cupy result, got {type(d)}"
            d = d.get()
            assert h.dtype == d.dtype and h.shape == d.shape
            # (NaN lanes: NaN in both; a device's NaN is 0x7fffffff)
            assert bits_equal(np.atleast_1d(h), np.atleast_1d(d))
        else:
            assert type(h) is type(d) and (h == d or (h != h and d != d))


# ---------------------------------------------------------------- scenarios
def mindspore_fq(xp):
    from quantcore.compat import mindspore as ms
    out = []
    for kw in ({}, {"ema": True, "symmetric": True, "narrow_range": True},
               {"per_channel": True, "channel_axis": 1, "num_channels": 3}):
        fq = ms.FakeQuantWithMinMaxObserver(**kw)
        out.append(fq(xp(X)))                   # inference
        fq.set_train()
        out += [fq(xp(X)), fq(xp(X * 2)), fq.backward(xp(G), xp(X)), fq.minq.copy(),
                fq.maxq.copy()]  # (copies: the state is updated in place)
        bad = X.copy()
        bad[0, 0, 0] = np.nan  # skipped (counted), the state stays
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # (numpy's skip warning)
            out += [fq(xp(bad)), fq.minq.copy(), fq.maxq.copy()]
        out += [fq(X * 3), State(fq.minq, fq.maxq)]  # a numpy batch: the state comes back
    return out


def tensorflow_functions(xp):
    from quantcore.compat import tensorflow as tf
    mn, mx = np.float32(-1.5), np.float32(2.0)
    cmn, cmx = np.full(5, -1.0, np.float32), np.linspace(0.5, 3, 5).astype(np.float32)
    return [tf.fake_quant_with_min_max_args(xp(X), -1.5, 2.0, num_bits=6),
            tf.fake_quant_with_min_max_args_gradient(xp(G), xp(X), -1.5, 2.0),
            tf.fake_quant_with_min_max_vars(xp(X), xp(mn), xp(mx), narrow_range=True),
            tf.fake_quant_with_min_max_vars_gradient(xp(G), xp(X), xp(mn), xp(mx)),
            tf.fake_quant_with_min_max_vars_per_channel(xp(X), xp(cmn), xp(cmx)),
            tf.fake_quant_with_min_max_vars_per_channel_gradient(xp(G), xp(X), xp(cmn),
                                                                 xp(cmx)),
            # min == max == 0 (zeros), Python min / max, float64 / int inputs
            tf.fake_quant_with_min_max_vars(xp(X), xp(np.float32(0)), xp(np.float32(0))),
            tf.fake_quant_with_min_max_vars(xp(X.astype(np.float64)), -1.0, 1.0),
            tf.fake_quant_with_min_max_vars_per_channel(
                xp(X), xp(np.where(cmn > -2, 0, cmn).astype(np.float32) * (np.arange(5) % 2)),
                xp(cmx * (np.arange(5) % 2))),
            tf.fake_quant_with_min_max_args(xp(np.arange(-4, 5, dtype=np.int32)))]


def oneflow_modules(xp):
    from quantcore.compat import oneflow as of
    out = []
    w = X.reshape(4, -1)
    for formula, scheme in (("google", "symmetric"), ("google", "affine"),
                            ("cambricon", "symmetric")):
        obs = of.MinMaxObserver(formula, 8, scheme, per_layer_quantization=True)
        s, z = obs(xp(w))
        fq = of.FakeQuantization(formula, 8, scheme)
        q = of.Quantization(formula, 8, scheme)
        out += [s, z, fq(xp(w), s, z), q(xp(w), s, z), fq.backward(xp(w))]
    per_channel = of.MinMaxObserver("google", 8, "affine", per_layer_quantization=False)
    s, z = per_channel(xp(w))
    out += [s, z, of.FakeQuantization("google", 8, "affine")(xp(w), s, z),
            of.FakeQuantization("google", 6, "symmetric")(xp(w.astype(np.float64)), 0.05, 0),
            of.MinMaxObserver()(xp(np.arange(-3, 9, dtype=np.int32)))]
    ma = of.MovingAverageMinMaxObserver(stop_update_after_iters=3, quantization_scheme="affine")
    for step in range(4):
        out += list(ma(xp(w * (step + 1)), xp(np.array([step], np.int64))))
    out += [ma.moving_max, ma.moving_min]  # (device buffers, updated in place)
    sym = of.MovingAverageMinMaxObserver(stop_update_after_iters=2)
    bad = w.copy()
    bad[1, 1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (numpy's skip warning)
        for step, batch in enumerate((w, bad, w * 3, w * 5)):  # NaN skipped; step 3: no update
            out += list(sym(xp(batch), np.array([step], np.int64))) + [sym.moving_max.copy()]
    out += list(sym(w * 0.5, np.array([1], np.int64)))  # numpy: the buffers come back
    out.append(State(sym.moving_max, sym.moving_min))
    return out


def nvidia_functions(xp):
    from quantcore.compat import nvidia as nv
    amax_c = np.abs(X).max(axis=(1, 2), keepdims=True)
    return [nv.fake_tensor_quant(xp(X), xp(np.float32(2.5))),
            nv.tensor_quant(xp(X), xp(amax_c), 4, False, False),
            nv.fake_tensor_quant(xp(np.abs(X)), xp(amax_c), 8, True),
            nv.fake_tensor_quant_backward(xp(G), xp(X), xp(np.float32(2.0))),
            nv.fake_affine_tensor_quant(xp(X), xp(np.float32(-1.0)), xp(np.float32(3.0))),
            nv.fake_affine_tensor_quant_backward(xp(G), xp(X), -1.0, 3.0),
            # float16 input, an amax over two axes (one channel per element)
            nv.tensor_quant(xp(X.astype(np.float16)), xp(np.abs(X).max(axis=2, keepdims=True))),
            nv.fake_tensor_quant(xp(X), 1.5, 6, False, False)]


def nvidia_stateful(xp):
    from quantcore.compat import nvidia as nv
    out = []
    cal = nv.MaxCalibrator(8, 0)
    cal.collect(xp(X))
    cal.collect(xp(X * 3))
    out.append(cal.compute_amax())  # (PQ's amax: a tensor on the data's device)
    hist = nv.HistogramCalibrator(8, None, False, num_bins=256)
    hist.collect(xp(X))
    hist.collect(xp(X * 4))
    out.append(State(hist.compute_amax("percentile", percentile=99.0),
                     hist.compute_amax("mse", start_bin=16),
                     hist.compute_amax("entropy", start_bin=16)))
    tq = nv.TensorQuantizer(nv.QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL, if_calib=True,
                            if_quant=False)
    tq(xp(X))
    tq.load_calib_amax()
    tq.disable_calib()
    tq.enable_quant()
    out += [tq(xp(X)), State(tq.amax)]
    for desc in (nv.QuantDescriptor(num_bits=6, axis=(1,), scale_amax=0.75),  # dynamic amax
                 nv.QuantDescriptor(fake_quant=False, unsigned=False),        # real quant
                 nv.QuantDescriptor(calib_method="histogram")):
        tq = nv.TensorQuantizer(desc, if_calib=True)
        out.append(tq(xp(X)))
        if desc.fake_quant is False:
            out.append(tq.scale)
    return out


def horizon_modules(xp):
    from quantcore.compat import horizon as hz
    out = []
    for kw in ({}, {"observer": hz.MovingAveragePerChannelMinMaxObserver, "ch_axis": 1},
               {"saturate": False, "compat_mask": False}):
        fq = hz.FakeQuantize(**kw)
        for k in range(3):
            out.append(fq(xp(X * (k + 1))))
        out += [fq.backward(xp(G)), State(fq.zero_point)]
        out.append(fq.scale)  # (a device array on the observer path, host on the fused one)
        fq.set_qparams(xp(np.float32(0.05)))
        fq.eval()
        out += [fq(xp(X)), State(fq.scale)]
    data = xp(X.copy())
    fq = hz.FakeQuantize(in_place=True)
    res = fq(data)
    out += [res, data]  # in place: the caller's (device) array holds the result
    obs = hz.MovingAverageMinMaxObserver(dtype="qint16")
    obs(xp(X))
    out += [*obs.calculate_qparams(), obs.min_val, obs.max_val]  # (device state)
    hz.set_march("bernoulli")
    try:
        fq = hz.FakeQuantize(in_place=False)
        out += [fq(xp(X)), fq(xp(X * 3))]
    finally:
        hz.set_march(None)
    return out


def core_calibrators(xp):
    from quantcore import calib
    out = []
    mc = calib.MaxCalibrator(8, axis=1)
    hc = calib.HistogramCalibrator(8, None, False, num_bins=128, skip_zeros=True)
    th = calib.TorchHistogram(bins=64)
    for k in range(3):
        mc.collect(xp(X * (k + 1)))
        hc.collect(xp(X * (k + 1)))
        out.append(th.collect(xp(X - k)))
    # MaxCalibrator's amax stays where the data is (PQ's amax is a tensor on
    # the data's device); the histogram statistics are host state
    out.append(mc.compute_amax())
    out.append(State(hc.compute_amax("percentile", percentile=99.9), *th.calculate_qparams()))
    return out


def torch_layer(xp):
    from quantcore.compat import torch as T
    out = []
    w = X.reshape(4, -1)
    s_c, z_c = np.linspace(0.02, 0.1, 4).astype(np.float32), np.arange(4, dtype=np.int32)
    out += [T.fake_quantize_per_tensor_affine(xp(X), 0.05, 3, 0, 255),
            T.fake_quantize_per_tensor_affine_cachemask(xp(X), 0.05, 3, 0, 255),
            T.fake_quantize_per_channel_affine(xp(w), xp(s_c), xp(z_c), 0, -128, 127),
            T.fake_quantize_per_channel_affine_cachemask(xp(w), xp(s_c), xp(z_c), 0, -128,
                                                         127)]
    s1, z1 = np.array([0.05], np.float32), np.array([2.4], np.float32)
    out += [T.fake_quantize_learnable_per_tensor_affine(xp(X), xp(s1), xp(z1), 0, 255),
            T.fake_quantize_learnable_per_tensor_affine_backward(xp(G), xp(X), xp(s1), xp(z1),
                                                                 0, 255)]
    state = [xp(np.array([np.inf], np.float32)), xp(np.array([-np.inf], np.float32)),
             xp(np.ones(1, np.float32)), xp(np.zeros(1, np.int32))]
    for k in range(3):  # the four state arrays are updated in place, on the device
        out.append(T.fused_moving_avg_obs_fake_quant(
            xp(X * (k + 1)), xp(np.ones(1, np.int64)), xp(np.ones(1, np.int64)), *state,
            0.01, 0, 255, 0))
    out += state
    w = X.reshape(4, -1)
    rows = [xp(np.full(4, np.inf, np.float32)), xp(np.full(4, -np.inf, np.float32)),
            xp(np.ones(4, np.float32)), xp(np.zeros(4, np.int32))]
    for k, (obs_on, fq_on) in enumerate(((1, 1), (1, 0), (0, 1), (1, 1))):
        batch = w * (k + 1)
        if k == 3:
            batch = batch.copy()
            batch[1, 2] = np.inf  # a row's range at infinity
        out.append(T.fused_moving_avg_obs_fake_quant(
            xp(batch), np.array([obs_on]), np.array([fq_on]), *rows, 0.25, -128, 127, 0, True,
            True))
        out += [r.copy() for r in rows]
    for obs in (T.MinMaxObserver(), T.PerChannelMinMaxObserver(ch_axis=1),
                T.MovingAverageMinMaxObserver(0.25, qscheme="per_tensor_symmetric"),
                T.MovingAveragePerChannelMinMaxObserver(0.5, ch_axis=2)):
        # observed on the device: the statistics and qparams are device arrays
        out += [obs(xp(X)), obs(xp(X * 2)), obs.min_val, obs.max_val]
        out += list(obs.calculate_qparams())
        obs.min_val = obs.min_val - 1  # (set on the host: the next call is not a first)
        out += [obs(xp(X * 0.5)), obs.min_val, obs.max_val]
    obs = T.HistogramObserver(bins=64)  # binned on the device; the histogram is host state
    out += [obs(xp(X)), obs(xp(X * 2)), State(*obs.calculate_qparams())]
    ints = T.MinMaxObserver()
    out += [ints(xp(np.arange(-5, 7, dtype=np.int32))), ints.min_val, ints.max_val]
    for fq in (T.FakeQuantize(), T.default_per_channel_weight_fake_quant(),
               T.FakeQuantize(T.HistogramObserver, quant_min=0, quant_max=255)):
        # observed and quantized on the device: the qparams are device arrays
        out += [fq(xp(X)), fq(xp(X * 3)), fq.backward(xp(G)), fq.scale, fq.zero_point]
        fq.disable_observer()
        fq.disable_fake_quant()
        out += [fq(xp(X)), fq.backward(xp(G))]
    fixed = T.default_fixed_qparams_range_0to1_fake_quant()
    out += [fixed(xp(X)), fixed.backward(xp(G)), State(fixed.scale, fixed.zero_point)]
    for fq in (T.FusedMovingAvgObsFakeQuantize(),
               T.FusedMovingAvgObsFakeQuantize(T.MovingAveragePerChannelMinMaxObserver,
                                               ch_axis=0, qscheme="per_channel_symmetric",
                                               dtype="qint8", quant_min=-128, quant_max=127)):
        out += [fq(xp(X)), fq(xp(X * 3)), fq.backward(xp(G)), fq.scale, fq.zero_point]
    return out


def torch_functional_cases(xp):
    """The torch fake-quant ops' dtype and range cases, on the device for
    cupy input: float / half zero points (kept on the device), float64
    input, int32-size ranges (the exact-integer kernel), empty x,
    tensor qparams."""
    from quantcore.compat import torch as T
    out = []
    w = X.reshape(4, -1)
    s_c = np.linspace(0.02, 0.1, 4).astype(np.float32)
    for z_c in (np.array([-3.5, 0.25, 7.0, 100.5], np.float32),
                np.array([1.5, -2.0, 0.0, 3.25], np.float16), np.arange(4, dtype=np.int32)):
        for x in (w, w.astype(np.float64) * 3):
            out += list(T.fake_quantize_per_channel_affine_cachemask(xp(x), xp(s_c), xp(z_c), 0,
                                                                     -128, 127))
        out.append(T.fake_quantize_per_channel_affine(xp(w * 1e4), xp(s_c), xp(z_c), 0,
                                                      -2 ** 31, 2 ** 31 - 1))
    out.append(T.fake_quantize_per_channel_affine(xp(np.zeros((0, 4), np.float32)), xp(s_c),
                                                  xp(np.zeros(4, np.int32)), 1, 0, 255))
    out += list(T.fake_quantize_per_tensor_affine_cachemask(xp(X * 1e5), 0.5, 3, -2 ** 31,
                                                            2 ** 31 - 1))
    out += list(T.fake_quantize_per_tensor_affine_cachemask(
        xp(X.astype(np.float64)), xp(np.array([0.03], np.float32)),
        xp(np.array([7], np.int32)), 0, 255))
    with pytest.raises(NotImplementedError, match="not implemented for 'Int'"):
        T.fake_quantize_per_tensor_affine(xp(np.arange(3, dtype=np.int32)), 0.1, 0, 0, 255)
    return out


SCENARIOS = [torch_layer, torch_functional_cases, core_calibrators, mindspore_fq,
             tensorflow_functions, oneflow_modules, nvidia_functions, nvidia_stateful,
             horizon_modules]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_layer_takes_cupy(cp, scenario):
    run_both(cp, scenario)


def test_in_place_horizon_result_is_the_callers_array(cp):
    from quantcore.compat import horizon as hz
    data = cp.asarray(X.copy())
    assert hz.FakeQuantize(in_place=True)(data) is data


def test_fused_op_device_state_rules(cp):
    """The fused op on cupy x updates cupy state in place; numpy state for a
    cupy x, and empty cupy per-row buffers (which torch resizes in place),
    raise."""
    from quantcore.compat import torch as T
    w = cp.asarray(X.reshape(4, -1))
    on = np.ones(1, np.int64)
    host_state = [np.full(4, np.inf, np.float32), np.full(4, -np.inf, np.float32),
                  np.ones(4, np.float32), np.zeros(4, np.int32)]
    with pytest.raises(TypeError, match="must be a cupy array"):
        T.fused_moving_avg_obs_fake_quant(w, on, on, *host_state, 0.01, 0, 255, 0, True)
    empty = [cp.zeros(0, cp.float32), cp.zeros(0, cp.float32), cp.ones(1, cp.float32),
             cp.zeros(1, cp.int32)]
    with pytest.raises(ValueError, match="must be resized to 4"):
        T.fused_moving_avg_obs_fake_quant(w, on, on, *empty, 0.01, 0, 255, 0, True)
