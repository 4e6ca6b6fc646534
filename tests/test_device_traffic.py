"""Bytes crossing host <-> device (the emulator's ``cupy.TRANSFERS``) while
observers and calibrators work on a 1e5-element cupy tensor: only scalars
and per-bin / per-channel arrays may cross, never the tensor.

Runs on the CUDA emulator only (real CuPy does not count transfers).
"""
import numpy as np
import pytest

import quantcore as qc
import quantcore_gpu
from quantcore import calib

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON)),
              pytest.mark.skipif(not hasattr(cp, "TRANSFERS"),
                                 reason="needs the CUDA emulator's transfer counters")]

N = 100_000
TENSOR_BYTES = N * 4


@pytest.fixture(scope="module")
def x():
    rng = np.random.default_rng(7)
    return cp.asarray((rng.normal(size=(10, N // 10)) * 3).astype(np.float32))


def moved(step):
    """(bytes to the host, bytes to the device) while ``step()`` runs."""
    before = dict(cp.TRANSFERS)
    step()
    return (cp.TRANSFERS["to_host"] - before["to_host"],
            cp.TRANSFERS["to_device"] - before["to_device"])


@pytest.mark.parametrize("make", [
    lambda: qc.MinMaxObserver(),
    lambda: qc.MovingAverageMinMaxObserver(0.1, axis=0),
    lambda: qc.EMAMinMaxObserver(0.9),
    lambda: qc.MomentumMinMaxObserver(0.9, symmetric=True, axis=0),
], ids=["minmax", "moving_average_per_channel", "ema", "momentum_per_channel"])
def test_observer_step_moves_no_tensor(x, make):
    obs = make()
    obs.update(x)  # the first step uploads the (host) state: a few small arrays
    to_host, to_device = moved(lambda: obs.update(x * 2))
    assert (to_host, to_device) == (0, 0)  # a step: one launch, no synchronisation
    to_host, to_device = moved(lambda: obs.calculate_qparams())
    assert to_device == 0 and to_host <= 16  # the batch counts ("no batch yet" check)


def test_calibrator_collects_move_no_tensor(x):
    bins = 256
    limit = 8 * bins + 64  # the counts of the bins and a few scalars
    assert limit < TENSOR_BYTES // 100
    mc = calib.MaxCalibrator(8, axis=0)
    mc.collect(x)
    assert max(moved(lambda: mc.collect(x * 2))) <= 64
    for torch_hist in (True, False):
        hc = calib.HistogramCalibrator(8, None, False, num_bins=bins, torch_hist=torch_hist)
        hc.collect(x)
        for scale in (0.5, 2.0):  # within the range, then grown (about twice the bins)
            to_host, to_device = moved(lambda: hc.collect(x * scale))
            assert to_host <= 2 * limit and to_device <= 2 * limit, (torch_hist, to_host,
                                                                     to_device)
    th = calib.TorchHistogram(bins=bins)
    th.collect(x)
    for shift in (0.0, 5.0):
        to_host, to_device = moved(lambda: th.collect(x + shift))
        assert to_host <= limit and to_device <= limit, (to_host, to_device)


def test_compat_calibrators_move_no_tensor(x):
    """torch's HistogramObserver step and the NVIDIA calibrators' collect
    (the frameworks synchronise there too: ``.item()`` of the range, the
    histogram's counts)."""
    from quantcore.compat import nvidia as nv
    from quantcore.compat import torch as T
    bins = 256
    limit = 8 * bins + 64
    obs = T.HistogramObserver(bins=bins)
    obs(x)
    for shift in (0.0, 4.0):  # the same range, then a wider one
        to_host, to_device = moved(lambda: obs(x + shift))
        assert to_host <= limit and to_device <= limit, (to_host, to_device)
    amax = nv.MaxCalibrator(8, axis=0)
    amax.collect(x)
    assert max(moved(lambda: amax.collect(x * 2))) <= 64
    assert isinstance(amax.compute_amax(), cp.ndarray)
    hist = nv.HistogramCalibrator(8, None, False, num_bins=bins)
    hist.collect(x)
    to_host, to_device = moved(lambda: hist.collect(x * 0.5))
    assert to_host <= limit and to_device <= limit, (to_host, to_device)


@pytest.mark.parametrize("make", [
    lambda T: T.MinMaxObserver(), lambda T: T.MovingAverageMinMaxObserver(),
    lambda T: T.PerChannelMinMaxObserver(ch_axis=0),
    lambda T: T.MovingAveragePerChannelMinMaxObserver(ch_axis=1)],
    ids=["minmax", "moving_average", "per_channel", "moving_average_per_channel"])
def test_torch_observer_step_moves_nothing(x, make):
    """torch's observers' forward does not synchronise: nor do these."""
    from quantcore.compat import torch as T
    obs = make(T)
    obs(x)
    assert moved(lambda: obs(x * 2)) == (0, 0)


def test_torch_fake_quant_ops_move_no_tensor(x):
    """torch's fake-quant ops on cupy: per tensor (Python qparams) nothing
    crosses but the kernel's scalar arguments; per channel with a float zero
    point nothing is read back (an int32 zero point: its C values, which
    torch reads for the range check)."""
    from quantcore.compat import torch as T
    C = x.shape[0]
    scale = cp.asarray(np.linspace(0.01, 0.1, C).astype(np.float32))
    zp_float = cp.asarray(np.linspace(-3, 3, C).astype(np.float32))
    zp_int = cp.asarray(np.arange(C, dtype=np.int32))
    to_host, to_device = moved(lambda: T.fake_quantize_per_tensor_affine(x, 0.05, 3, 0, 255))
    assert to_host == 0 and to_device <= 64
    to_host, to_device = moved(lambda: T.fake_quantize_per_channel_affine_cachemask(
        x, scale, zp_float, 0, -128, 127))
    assert to_host == 0 and to_device <= 64
    to_host, to_device = moved(lambda: T.fake_quantize_per_channel_affine(
        x, scale, zp_int, 0, -128, 127))
    assert to_host <= 4 * C and to_device <= 16 * C


def test_torch_fake_quantize_step_moves_no_tensor(x):
    """A compat FakeQuantize step (observe, qparams, fake quant) and its
    backward: per tensor the qparams are read (8 bytes) and the validity
    check (2 bytes); per channel the C int32 zero points; nothing else."""
    from quantcore.compat import torch as T
    C = x.shape[0]
    for fq, host_limit, device_limit in ((T.FakeQuantize(), 16, 0),
                                         (T.default_per_channel_weight_fake_quant(),
                                          4 * C + 8, 8 * C)):
        fq(x)
        to_host, to_device = moved(lambda: fq(x * 2))
        assert to_host <= host_limit and to_device <= device_limit, (to_host, to_device)
        assert isinstance(fq.scale, cp.ndarray)
        assert moved(lambda: fq.backward(x)) == (0, 0)


def test_nvidia_functions_move_no_tensor(x):
    """PQ's functions on cupy: nothing tensor-sized crosses (PQ reads
    ``amax.min() < 0`` too: a byte)."""
    from quantcore.compat import nvidia as nv
    amax = cp.asarray(np.full((x.shape[0], 1), 4.0, np.float32))
    for call in (lambda: nv.fake_tensor_quant(x, amax),
                 lambda: nv.tensor_quant(x, amax),
                 lambda: nv.fake_tensor_quant_backward(x, x, amax),
                 lambda: nv.fake_affine_tensor_quant(x, -1.0, 3.0)):
        to_host, to_device = moved(call)
        assert to_host <= 8 and to_device <= 64, (to_host, to_device)


def test_tensorflow_forward_moves_nothing(x):
    """TF's fake_quant_with_min_max_vars(_per_channel) with device min / max:
    the nudged range is computed on the device and read there by the
    kernel (TF does not synchronise either)."""
    from quantcore.compat import tensorflow as tf
    mn, mx = cp.asarray(np.float32(-2.0)), cp.asarray(np.float32(3.0))
    assert moved(lambda: tf.fake_quant_with_min_max_vars(x, mn, mx)) == (0, 0)
    y = x.reshape(-1, 10)
    cmn = cp.asarray(np.full(10, -1.0, np.float32))
    cmx = cp.asarray(np.linspace(0.5, 3, 10).astype(np.float32))
    assert moved(lambda: tf.fake_quant_with_min_max_vars_per_channel(y, cmn, cmx)) == (0, 0)
    to_host, to_device = moved(lambda: tf.fake_quant_with_min_max_args(x, -1.0, 2.0))
    assert to_host == 0 and to_device <= 64


def test_oneflow_observer_and_fake_quant_move_nothing(x):
    """OneFlow's MinMaxObserver gives device qparams and FakeQuantization
    reads them on the device (google formula)."""
    from quantcore.compat import oneflow as of
    for scheme in ("symmetric", "affine"):
        obs, fq = of.MinMaxObserver("google", 8, scheme), of.FakeQuantization("google", 8, scheme)
        s, z = obs(x)
        assert moved(lambda: obs(x)) == (0, 0)
        to_host, to_device = moved(lambda: fq(x, s, z))
        assert to_host == 0 and to_device <= 64, (to_host, to_device)


def test_horizon_fake_quantize_moves_no_tensor(x):
    """Horizon's FakeQuantize: per tensor (the fused core step: its scale is
    read back and set again each call, so the core's small device state is
    uploaded again: ~100 bytes) and per channel (observer on the device;
    the batch count is read, 16 bytes)."""
    from quantcore.compat import horizon as hz
    for fq in (hz.FakeQuantize(),
               hz.FakeQuantize(observer=hz.MovingAveragePerChannelMinMaxObserver, ch_axis=0)):
        fq(x)
        to_host, to_device = moved(lambda: fq(x * 2))
        assert to_host <= 64 and to_device <= 128, (to_host, to_device)
        assert moved(lambda: fq.backward(x)) == (0, 0)


@pytest.mark.parametrize("kw", [{}, {"ema": True, "ema_decay": 0.99},
                                {"per_channel": True, "channel_axis": 0, "num_channels": 10}],
                         ids=["batch", "ema", "per_channel"])
def test_mindspore_step_moves_nothing_back(x, kw):
    """MindSpore's FakeQuantWithMinMaxObserver training step: minq / maxq
    updated on the device, nothing read back (only the observer's zero
    batch counts, 16 bytes, go down)."""
    from quantcore.compat import mindspore as ms
    fq = ms.FakeQuantWithMinMaxObserver(**kw).set_train()
    fq(x)
    to_host, to_device = moved(lambda: fq(x * 2))
    assert to_host == 0 and to_device <= 64, (to_host, to_device)
    assert isinstance(fq.minq, cp.ndarray)
    assert moved(lambda: fq.backward(x, x)) == (0, 0)


def test_nvidia_tensor_quantizer_moves_no_tensor(x):
    """PQ's TensorQuantizer on cupy: calibration (max) and fake quant with a
    dynamic per-channel amax on the device."""
    from quantcore.compat import nvidia as nv
    tq = nv.TensorQuantizer(nv.QuantDescriptor(axis=(0,)), if_calib=True)
    tq(x)
    to_host, to_device = moved(lambda: tq(x * 2))
    assert to_host <= 16 and to_device <= 64, (to_host, to_device)


def test_oneflow_moving_average_observer_moves_nothing(x):
    """OneFlow's MovingAverageMinMaxObserver: the buffers are updated on the
    device and the qparams formed there (a host step tensor: no read)."""
    from quantcore.compat import oneflow as of
    obs = of.MovingAverageMinMaxObserver(stop_update_after_iters=10)
    obs(x, np.array([0], np.int64))
    assert moved(lambda: obs(x * 2, np.array([1], np.int64))) == (0, 0)
    assert isinstance(obs.moving_max, cp.ndarray)


def test_torch_fused_op_moves_no_tensor(x):
    """torch's fused op on cupy: per tensor the new qparams are read for the
    fake-quant call (8 bytes), per row the int32 zero points (C values)."""
    from quantcore.compat import torch as T
    C = x.shape[0]
    on = np.ones(1, np.int64)
    tensor_state = [cp.asarray(np.array([v], np.float32)) for v in (np.inf, -np.inf, 1.0)] + \
        [cp.zeros(1, cp.int32)]
    row_state = [cp.full(C, np.inf, cp.float32), cp.full(C, -np.inf, cp.float32),
                 cp.ones(C, cp.float32), cp.zeros(C, cp.int32)]
    for state, per_row, host_limit in ((tensor_state, False, 16), (row_state, True, 4 * C + 8)):
        T.fused_moving_avg_obs_fake_quant(x, on, on, *state, 0.01, 0, 255, 0, per_row)
        to_host, to_device = moved(lambda: T.fused_moving_avg_obs_fake_quant(
            x * 2, on, on, *state, 0.01, 0, 255, 0, per_row))
        assert to_host <= host_limit and to_device <= 16 * C + 64, (to_host, to_device)


def device_work(step):
    """(kernel launches, other device operations) while ``step()`` runs:
    quantcore's RawKernel launches (the emulator's ``LAUNCHES``) and every
    cupy call that real CuPy runs as a kernel of its own (array results of
    arithmetic, copies, ``astype``, ``full`` / ``zeros`` / ``ones``)."""
    import cupy
    ops = [0]
    patched = {}
    for name in ("_to_device", "full", "zeros", "ones"):
        real = getattr(cupy, name)

        def counting(*args, _real=real, **kwargs):
            ops[0] += 1
            return _real(*args, **kwargs)
        patched[name] = real
        setattr(cupy, name, counting)
    launches = sum(cupy.LAUNCHES.values())
    try:
        result = step()
    finally:
        for name, real in patched.items():
            setattr(cupy, name, real)
    return sum(cupy.LAUNCHES.values()) - launches, ops[0], result


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("nan_policy", ["propagate", "omit"])
def test_minmax_is_one_launch(x, axis, nan_policy):
    """qc.minmax on a contiguous float32 cupy array: the fused reduction
    alone (its last block applies the NaN / signed-zero rule), results
    equal to the CPU's."""
    y = x.copy()
    y[3, 7] = np.nan
    qc.minmax(y)   # (the first reduction of a thread allocates its counter)
    launches, ops, (lo, hi) = device_work(lambda: qc.minmax(y, axis, nan_policy=nan_policy))
    assert (launches, ops) == (1, 0)
    ref = qc.minmax(y.get(), axis, nan_policy=nan_policy)
    for r, g in zip(ref, (lo, hi)):
        assert isinstance(g, cp.ndarray) and g.shape == r.shape and g.dtype == r.dtype
        assert np.array_equal(r, g.get(), equal_nan=True)


@pytest.mark.parametrize("axis", [None, 0])
def test_fake_quant_with_device_qparams_moves_nothing(x, axis):
    """fake_quant / fake_quant_with_mask with cupy scale and zero point:
    read by the kernel on the device (no read-back, no upload), the same
    bits as with host qparams."""
    C = 1 if axis is None else x.shape[0]
    s_host = np.linspace(0.02, 0.05, C).astype(np.float32)
    z_host = np.arange(C, dtype=np.int32) - 3
    if axis is None:
        s_host, z_host = s_host[0], z_host[0]
    s, z = cp.asarray(s_host), cp.asarray(z_host)
    qc.fake_quant(x, s, z, -128, 127, axis=axis)  # (the reduction-free path: no counter)
    for fn in (qc.fake_quant, lambda *a, **k: qc.fake_quant_with_mask(*a, **k)[0]):
        got = []
        assert moved(lambda: got.append(fn(x, s, z, -128, 127, axis=axis))) == (0, 0)
        ref = fn(x.get(), s_host, z_host, -128, 127, axis=axis)
        assert np.array_equal(ref.view(np.uint32), got[0].get().view(np.uint32))
    with pytest.raises(ValueError, match="zero_point must be a single value"):
        qc.fake_quant(x, cp.asarray(np.float32(0.1)), cp.zeros(2, cp.int32), -128, 127)
    with pytest.raises(ValueError, match="1-D array of 10 values"):
        qc.fake_quant(x, cp.ones(3, cp.float32), 0, -128, 127, axis=0)


def test_nvfp4_default_global_scale_moves_nothing(x):
    """NVFP4 modelopt without a global scale: the range and the scale are
    formed on the device (no read-back); the same bits as the CPU, and the
    global scale comes back as a 0-d device array."""
    from quantcore import mx
    y = (x * np.float32(0.01)).reshape(-1, 80)
    ref_codes, ref_scales, ref_g = mx.nvfp4_quantize(y.get())
    mx.nvfp4_quantize(y)
    got = []
    assert moved(lambda: got.append(mx.nvfp4_quantize(y))) == (0, 0)
    codes, scales, g = got[0]
    assert isinstance(g, cp.ndarray) and g.shape == () and g.dtype == np.float32
    assert np.array_equal(codes.get(), ref_codes) and np.array_equal(scales.get(), ref_scales)
    assert g.get().view(np.uint32) == np.float32(ref_g).view(np.uint32)
    fq = []
    assert moved(lambda: fq.append(mx.nvfp4_fake_quant(y))) == (0, 0)
    ref = mx.nvfp4_fake_quant(y.get())
    assert np.array_equal(ref.view(np.uint32), fq[0].get().view(np.uint32))
    nan = y.copy()
    nan[3, 5] = np.nan
    assert np.isnan(mx.nvfp4_quantize(nan)[2].get())


def syncs(step):
    """Reads from the device (each a host synchronisation) while ``step()`` runs."""
    before = cp.TRANSFERS["to_host_calls"]
    step()
    return cp.TRANSFERS["to_host_calls"] - before


def test_synchronisations_are_those_the_frameworks_make(x):
    """The reads left, each no more than the framework's own collect makes
    (docs/ARCHITECTURE.md): MaxCalibrator the NaN check (PQ reads
    ``x.min() < 0``), the histogram calibrators the range and the grown
    bins (PQ / torch read the range for histc and compare it with the
    edges), an observer with nan_policy="raise" the batch counts."""
    mc = calib.MaxCalibrator(8, axis=0)
    mc.collect(x)
    assert syncs(lambda: mc.collect(x * 2)) <= 1
    for torch_hist in (True, False):
        hc = calib.HistogramCalibrator(8, None, False, num_bins=256, torch_hist=torch_hist)
        hc.collect(x)
        assert syncs(lambda: hc.collect(x * 0.5)) <= 2
        assert syncs(lambda: hc.collect(x * 2)) <= 2
    th = calib.TorchHistogram(bins=256)
    th.collect(x)
    assert syncs(lambda: th.collect(x + 5)) <= 2
    obs = qc.MinMaxObserver(nan_policy="raise")
    obs.update(x)
    assert syncs(lambda: obs.update(x * 2)) == 1
    assert syncs(lambda: qc.MinMaxObserver().update(x * 2)) == 0


@pytest.mark.parametrize("make", [lambda: qc.FakeQuantize(),
                                  lambda: qc.FakeQuantize(axis=0)], ids=["tensor", "channel"])
def test_fake_quantize_training_step_is_two_launches_and_no_sync(x, make):
    """The issue's target: a FakeQuantize training step (observe + qparams
    in one launch, fake quant in another) with nothing crossing and no
    other device operation."""
    fq = make()
    y = x * 2
    fq(x)
    fq(y)
    got = []
    assert moved(lambda: got.append(device_work(lambda: fq(y)))) == (0, 0)
    launches, ops, _ = got[0]
    assert launches <= 2 and ops == 0, (launches, ops)
