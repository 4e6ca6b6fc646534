"""Object behaviour (issue 20): in-place state with torch's sharing
semantics, pickle / deepcopy / cloudpickle of every stateful class, torch
dtype objects and exception classes, warnings at the caller's line, the
NaN-first-batch rule of FakeQuantize, quiet HistogramObserver extremes.

torch (CPU) is the oracle where a torch class exists: the same sequence of
calls runs on both, holding references the way user code does.
"""
import copy
import pickle
import warnings

import numpy as np
import pytest

import quantcore as qc
from quantcore import calib
from quantcore.compat import horizon as H
from quantcore.compat import mindspore as MS
from quantcore.compat import nvidia as NV
from quantcore.compat import oneflow as OF
from quantcore.compat import torch as T
from quantcore.compat._errors import AssertionValueError, RuntimeTypeError, RuntimeValueError

from reference import assert_bits_equal, bits_equal

cloudpickle = pytest.importorskip("cloudpickle")
torch = pytest.importorskip("torch")
from torch.ao.quantization import fake_quantize as tfq  # noqa: E402
from torch.ao.quantization import observer as tob  # noqa: E402

F32 = np.float32


def batches(n, shape=(6, 5), seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=shape) * (1 + k)).astype(F32) for k in range(n)]


def tensor(a):
    return torch.from_numpy(np.array(a, copy=True))


# =================================================== in place: core layer
CORE_OBSERVERS = {
    "minmax": lambda axis: qc.MinMaxObserver(axis=axis),
    "moving_average": lambda axis: qc.MovingAverageMinMaxObserver(0.3, axis=axis),
    "ema": lambda axis: qc.EMAMinMaxObserver(0.9, axis=axis,
                                             num_channels=None if axis is None else 5),
    "momentum": lambda axis: qc.MomentumMinMaxObserver(0.9, axis=axis),
}


@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("kind", sorted(CORE_OBSERVERS))
def test_core_observer_state_is_updated_in_place(kind, axis):
    make = CORE_OBSERVERS[kind]
    obs, twin = make(axis), make(axis)
    xs = batches(5)
    obs(xs[0])
    twin(xs[0])
    mn, mx = obs.min_val, obs.max_val  # held once, after the first batch
    state = obs.state_dict()
    assert state["min_val"] is mn and state["max_val"] is mx
    for x in xs[1:]:
        obs(x)
        twin(x)
        assert obs.min_val is mn and obs.max_val is mx
        assert_bits_equal(mn, twin.min_val)
        assert_bits_equal(state["max_val"], twin.max_val)
    # load_state_dict copies into the held arrays
    other = make(axis)
    other(xs[3] * 7)
    obs.load_state_dict(other.state_dict())
    assert obs.min_val is mn and bits_equal(mn, other.min_val) and bits_equal(mx, other.max_val)
    if obs.mergeable:
        obs.merge(twin)
        assert obs.min_val is mn
    if axis is None:  # per tensor, reset is in place too (per channel: new empty arrays)
        obs.reset()
        assert obs.min_val is mn


def test_core_fake_quantize_state_is_updated_in_place():
    xs = batches(4)
    for fq, twin, cast in (
            (qc.FakeQuantize(), qc.FakeQuantize(), F32),                 # fused kernel
            (qc.FakeQuantize(), qc.FakeQuantize(), np.float64),          # general path
            (qc.FakeQuantize(axis=1), qc.FakeQuantize(axis=1), F32)):    # per channel
        fq(xs[0].astype(cast))
        twin(xs[0].astype(cast))
        scale, zp = fq.scale, fq.zero_point
        mn = fq.observer.min_val
        state = fq.state_dict()
        assert state["scale"] is scale and state["observer"]["min_val"] is mn
        for x in xs[1:]:
            y = fq(x.astype(cast))
            assert_bits_equal(y, twin(x.astype(cast)))
            assert fq.scale is scale and fq.zero_point is zp and fq.observer.min_val is mn
            assert_bits_equal(scale, twin.scale)
            assert np.array_equal(zp, twin.zero_point)
        fq.scale = scale * 2  # setters write in place
        assert fq.scale is scale and bits_equal(scale, twin.scale * 2)
        fq.load_state_dict(twin.state_dict())
        assert fq.scale is scale and bits_equal(scale, twin.scale)


# ========================================= in place: compat.torch vs torch
def _held(obj, names):
    return {n: getattr(obj, n) for n in names}


def _assert_held_equal(ours, theirs, msg):
    for name in theirs:
        o, t = ours[name], theirs[name].detach().numpy()
        assert o.shape == t.shape, (msg, name)
        assert_bits_equal(o.astype(t.dtype), t, f"{msg} {name}")


TORCH_OBSERVERS = [
    ("MinMaxObserver", {}, ("min_val", "max_val", "eps")),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 0.3}, ("min_val", "max_val")),
    ("PerChannelMinMaxObserver", {"ch_axis": 1}, ("min_val", "max_val")),
    ("MovingAveragePerChannelMinMaxObserver", {"ch_axis": 1}, ("min_val", "max_val")),
    ("HistogramObserver", {"bins": 32}, ("histogram", "min_val", "max_val")),
]


@pytest.mark.parametrize("name,kw,buffers", TORCH_OBSERVERS, ids=[c[0] for c in TORCH_OBSERVERS])
def test_compat_observer_buffers_are_shared_like_torch(name, kw, buffers):
    """References held after the first forward (and a state_dict taken
    then) see every later forward and load_state_dict, in both."""
    ours, theirs = getattr(T, name)(**kw), getattr(tob, name)(**kw)
    xs = batches(4)
    ours(xs[0])
    theirs(tensor(xs[0]))
    held_o, held_t = _held(ours, buffers), _held(theirs, buffers)
    sd_o, sd_t = ours.state_dict(), theirs.state_dict()
    for x in xs[1:]:
        ours(x)
        theirs(tensor(x))
        _assert_held_equal(held_o, held_t, name)
        _assert_held_equal({k: sd_o[k] for k in buffers}, {k: sd_t[k] for k in buffers}, name)
    for n in buffers:
        assert getattr(ours, n) is held_o[n] and sd_o[n] is held_o[n]
    source_o, source_t = getattr(T, name)(**kw), getattr(tob, name)(**kw)
    source_o(xs[2] * 5)
    source_t(tensor(xs[2] * 5))
    ours.load_state_dict(source_o.state_dict())
    theirs.load_state_dict(source_t.state_dict())
    _assert_held_equal(held_o, held_t, name + " after load_state_dict")
    if name in ("MinMaxObserver", "MovingAverageMinMaxObserver"):
        ours.reset_min_max_vals()
        theirs.reset_min_max_vals()
        _assert_held_equal(held_o, held_t, name + " after reset")


FAKE_QUANTIZE_CASES = [
    ("FakeQuantize", lambda m: m.FakeQuantize()),
    ("FakeQuantize per channel",
     lambda m: m.FakeQuantize(observer=m.MovingAveragePerChannelMinMaxObserver, ch_axis=1,
                              quant_min=-128, quant_max=127, dtype=torch.qint8,
                              qscheme=torch.per_channel_symmetric)),
    ("FusedMovingAvgObsFakeQuantize", lambda m: m.FusedMovingAvgObsFakeQuantize()),
    ("FusedMovingAvgObsFakeQuantize per channel",
     lambda m: m.FusedMovingAvgObsFakeQuantize(
         observer=m.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
         dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0)),
    ("FixedQParamsFakeQuantize",
     lambda m: m.FixedQParamsFakeQuantize(
         m.FixedQParamsObserver.with_args(scale=1 / 128, zero_point=128))),
]


def _module(m):
    """compat.torch or torch.ao.quantization (observer and fake-quantize names)."""
    if m is T:
        return T

    class _Torch:
        pass
    for name in ("FakeQuantize", "FusedMovingAvgObsFakeQuantize", "FixedQParamsFakeQuantize"):
        setattr(_Torch, name, getattr(tfq, name))
    for name in ("MovingAveragePerChannelMinMaxObserver", "FixedQParamsObserver"):
        setattr(_Torch, name, getattr(tob, name))
    return _Torch


@pytest.mark.parametrize("case", range(len(FAKE_QUANTIZE_CASES)),
                         ids=[c[0] for c in FAKE_QUANTIZE_CASES])
def test_compat_fake_quantize_buffers_are_shared_like_torch(case):
    name, make = FAKE_QUANTIZE_CASES[case]
    ours, theirs = make(_module(T)), make(_module(torch))
    buffers = ("scale", "zero_point", "fake_quant_enabled", "observer_enabled")
    xs = batches(5)
    assert_bits_equal(ours(xs[0]), theirs(tensor(xs[0])).numpy(), name)
    held_o, held_t = _held(ours, buffers), _held(theirs, buffers)
    stats = () if "Fixed" in name else ("min_val", "max_val")
    app_o = _held(ours.activation_post_process, stats)
    app_t = _held(theirs.activation_post_process, stats)
    sd_o, sd_t = ours.state_dict(), theirs.state_dict()
    for k, x in enumerate(xs[1:]):
        if k == 2:
            ours.disable_observer()
            theirs.disable_observer()
        assert_bits_equal(ours(x), theirs(tensor(x)).numpy(), name)
        _assert_held_equal(held_o, held_t, name)
        _assert_held_equal(app_o, app_t, name)
        _assert_held_equal(dict(sd_o), dict(sd_t), name + " state_dict")
    for n in buffers:
        assert getattr(ours, n) is held_o[n]
    source_o, source_t = make(_module(T)), make(_module(torch))
    source_o(xs[1] * 3)
    source_t(tensor(xs[1] * 3))
    ours.load_state_dict(source_o.state_dict())
    theirs.load_state_dict(source_t.state_dict())
    _assert_held_equal(held_o, held_t, name + " after load_state_dict")


# ================================================== torch objects, errors
@pytest.mark.parametrize("cls", ["MinMaxObserver", "MovingAverageMinMaxObserver",
                                 "PerChannelMinMaxObserver", "HistogramObserver"])
def test_torch_dtype_and_qscheme_objects_are_accepted(cls):
    per_channel = "PerChannel" in cls
    x = batches(1)[0]
    for dtype in ("quint8", "qint8", "qint32", "int8", "uint8", "int16", "uint16"):
        for qscheme in (("per_channel_affine", "per_channel_symmetric") if per_channel else
                        ("per_tensor_affine", "per_tensor_symmetric")):
            kw_obj = dict(dtype=getattr(torch, dtype), qscheme=getattr(torch, qscheme))
            kw_str = dict(dtype=dtype, qscheme=qscheme)
            a, b, t = getattr(T, cls)(**kw_obj), getattr(T, cls)(**kw_str), \
                getattr(tob, cls)(**kw_obj)
            assert (a.dtype, a.qscheme, a.quant_min, a.quant_max) == \
                (b.dtype, b.qscheme, b.quant_min, b.quant_max) == \
                (dtype, qscheme, t.quant_min, t.quant_max)
            for obs in (a, b):
                obs(x)
            t(tensor(x))
            for (s, z), ref in ((a.calculate_qparams(), t.calculate_qparams()),
                                (b.calculate_qparams(), t.calculate_qparams())):
                assert_bits_equal(np.asarray(s), ref[0].numpy())
                assert np.array_equal(z, ref[1].numpy())


def test_torch_objects_in_fake_quantize_and_fixed_qparams():
    fq = T.FakeQuantize.with_args(observer=T.MovingAverageMinMaxObserver, quant_min=-128,
                                  quant_max=127, dtype=torch.qint8,
                                  qscheme=torch.per_tensor_symmetric)()
    assert (fq.dtype, fq.qscheme) == ("qint8", "per_tensor_symmetric")
    fixed = T.FixedQParamsObserver(0.1, 0, dtype=torch.qint8, qscheme=torch.per_tensor_affine)
    assert (fixed.dtype, fixed.qscheme) == ("qint8", "per_tensor_affine")
    with pytest.raises(TypeError, match="torch dtype / qscheme or its name"):
        T.MinMaxObserver(dtype=np.int8)
    with pytest.raises(ValueError, match="Default Observer only works"):
        T.MinMaxObserver(dtype=torch.float32)
    with pytest.raises(AssertionError, match="Default Observer only works"):
        tob.MinMaxObserver(dtype=torch.float32)


def test_exceptions_keep_torch_classes():
    """``except RuntimeError`` / ``except AssertionError`` catch what they
    catch with torch; every such error is a ValueError / TypeError too."""
    x = np.ones(4, F32)
    cases = [
        (lambda m: m.fake_quantize_per_tensor_affine(x if m is T else tensor(x), 0.1, 0, 5, 3),
         RuntimeError, RuntimeValueError),
        (lambda m: m.fake_quantize_per_channel_affine(  # a float64 scale
            x if m is T else tensor(x),
            np.ones(4) if m is T else torch.ones(4, dtype=torch.float64),
            np.zeros(4, np.int32) if m is T else torch.zeros(4, dtype=torch.int32), 0, 0, 255),
         RuntimeError, RuntimeTypeError),
        (lambda m: (T.MinMaxObserver if m is T else tob.MinMaxObserver)(quant_min=1, quant_max=9),
         AssertionError, AssertionValueError),
        (lambda m: (T.FakeQuantize if m is T else tfq.FakeQuantize)(quant_min=5, quant_max=1),
         AssertionError, AssertionValueError),
    ]
    for call, torch_class, ours_class in cases:
        with pytest.raises(torch_class):
            call(torch)
        with pytest.raises(torch_class) as info:
            call(T)
        assert type(info.value) is ours_class
        assert isinstance(info.value, (ValueError, TypeError))


# =========================================== pickle, deepcopy, cloudpickle
def _step_call(obj, x):
    return obj(x)


def _step_fq_backward(obj, x):
    y = obj(x)
    return y, obj.backward(np.full_like(x, 0.5))


def _step_train_mindspore(obj, x):
    obj.set_train(True)
    return obj(x)


def _step_oneflow_ma(obj, x):
    obj.step = getattr(obj, "step", 0) + 1
    return obj(x, np.array([obj.step]))


def _step_collect(obj, x):
    obj.collect(np.abs(x))
    return obj.compute_amax() if isinstance(obj, calib.MaxCalibrator) else None


def _step_torch_hist(obj, x):
    obj.collect(x)
    return obj.calculate_qparams() if obj.initialized else None


def _step_histogram_calibrator(obj, x):
    obj.collect(x)
    return obj.compute_amax("percentile", percentile=99.0)


def _step_tensor_quantizer(obj, x):
    out = obj(x)
    obj.load_calib_amax()
    return out


def _tensor_quantizer():
    tq = NV.TensorQuantizer(NV.QuantDescriptor(axis=(1,)), if_calib=True)
    return tq


STATEFUL = {
    "MinMaxObserver": (lambda: qc.MinMaxObserver(), _step_call),
    "MinMaxObserver axis": (lambda: qc.MinMaxObserver(axis=-1), _step_call),
    "MovingAverageMinMaxObserver": (lambda: qc.MovingAverageMinMaxObserver(0.2), _step_call),
    "EMAMinMaxObserver": (lambda: qc.EMAMinMaxObserver(0.5), _step_call),
    "MomentumMinMaxObserver": (lambda: qc.MomentumMinMaxObserver(0.5, symmetric=True),
                               _step_call),
    "FakeQuantize": (lambda: qc.FakeQuantize(quant_delay=1), _step_fq_backward),
    "FakeQuantize per channel packed": (
        lambda: qc.FakeQuantize(qc.MinMaxObserver(axis=1), -8, 7, axis=1, symmetric=True,
                                packed_mask=True), _step_fq_backward),
    "calib.MaxCalibrator": (lambda: calib.MaxCalibrator(axis=1, track_amax=True),
                            _step_collect),
    "calib.HistogramCalibrator": (lambda: calib.HistogramCalibrator(num_bins=64),
                                  _step_histogram_calibrator),
    "calib.TorchHistogram": (lambda: calib.TorchHistogram(bins=64), _step_torch_hist),
    "torch.MinMaxObserver": (lambda: T.MinMaxObserver(), _step_call),
    "torch.MovingAverageMinMaxObserver": (lambda: T.MovingAverageMinMaxObserver(), _step_call),
    "torch.PerChannelMinMaxObserver": (lambda: T.PerChannelMinMaxObserver(ch_axis=1),
                                       _step_call),
    "torch.MovingAveragePerChannelMinMaxObserver": (
        lambda: T.MovingAveragePerChannelMinMaxObserver(), _step_call),
    "torch.HistogramObserver": (lambda: T.HistogramObserver(bins=64), _step_call),
    "torch.default_fake_quant": (lambda: T.default_fake_quant(), _step_fq_backward),
    "torch.default_per_channel_weight_fake_quant": (
        lambda: T.default_per_channel_weight_fake_quant(), _step_fq_backward),
    "torch.default_fused_act_fake_quant": (lambda: T.default_fused_act_fake_quant(),
                                           _step_fq_backward),
    "torch.default_histogram_fake_quant": (lambda: T.default_histogram_fake_quant(),
                                           _step_call),
    "torch.FixedQParamsFakeQuantize": (
        lambda: T.default_fixed_qparams_range_neg1to1_fake_quant(), _step_fq_backward),
    "mindspore.FakeQuantWithMinMaxObserver": (
        lambda: MS.FakeQuantWithMinMaxObserver(ema=True, quant_delay=1),
        _step_train_mindspore),
    "oneflow.MinMaxObserver": (lambda: OF.MinMaxObserver(), _step_call),
    "oneflow.MovingAverageMinMaxObserver": (lambda: OF.MovingAverageMinMaxObserver(
        stop_update_after_iters=10), _step_oneflow_ma),
    "nvidia.MaxCalibrator": (lambda: NV.MaxCalibrator(8, 0, False), _step_collect),
    "nvidia.TensorQuantizer": (_tensor_quantizer, _step_tensor_quantizer),
    "horizon.MovingAverageMinMaxObserver": (lambda: H.MovingAverageMinMaxObserver(),
                                            _step_call),
    "horizon.FakeQuantize": (lambda: H.FakeQuantize.with_args(
        observer=H.MovingAveragePerChannelMinMaxObserver, ch_axis=1, channel_len=5)(),
        _step_fq_backward),
}

COPIERS = {
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
    "deepcopy": copy.deepcopy,
    "cloudpickle": lambda o: cloudpickle.loads(cloudpickle.dumps(o)),
}


def leaves(obj, path="", seen=None):
    """Every array (as bytes) and plain value reachable from ``obj``'s
    attributes: two objects with equal leaves hold the same state."""
    seen = set() if seen is None else seen
    out = {}
    if isinstance(obj, np.ndarray):
        out[path] = (obj.dtype.str, obj.shape, np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (bool, int, float, str, bytes, type(None), np.generic)):
        out[path] = repr(obj)
    elif isinstance(obj, (list, tuple)):
        for k, v in enumerate(obj):
            out.update(leaves(v, f"{path}[{k}]", seen))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(leaves(v, f"{path}[{k!r}]", seen))
    elif type(obj).__module__.startswith("quantcore") and hasattr(obj, "__dict__") and \
            not isinstance(obj, type) and id(obj) not in seen:
        seen.add(id(obj))
        for k, v in vars(obj).items():
            if k != "_lock":
                out.update(leaves(v, f"{path}.{k}", seen))
    else:
        out[path] = type(obj).__name__
    return out


def assert_same_outputs(a, b, msg):
    if isinstance(a, tuple):
        for u, v in zip(a, b):
            assert_same_outputs(u, v, msg)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert_bits_equal(np.asarray(a), np.asarray(b), msg)
    else:
        assert a == b or (a is None and b is None), msg


@pytest.mark.parametrize("copier", sorted(COPIERS))
@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_copies_continue_exactly_like_the_original(name, copier):
    make, step = STATEFUL[name]
    xs = batches(5, seed=hash(name) % 1000)
    if not any(word in name for word in ("Calibrator", "Histogram", "histogram",
                                         "TensorQuantizer")):
        xs[1][0, 0] = np.nan  # a skipped / propagated non-finite batch in the history
        # (the calibrators and histograms refuse NaN input: ValueError)
    with warnings.catch_warnings():
        # skipped batches, no-data qparams, torch's reduce_range text: asserted elsewhere
        warnings.simplefilter("ignore")
        original = make()
        for x in xs[:2]:
            step(original, x)
        clone = COPIERS[copier](original)
        assert leaves(clone) == leaves(original), name
        for x in xs[2:]:
            assert_same_outputs(step(original, x), step(clone, x), f"{name} {copier}")
    assert leaves(clone) == leaves(original), name
    # the copy has its own, working lock and its own state
    if hasattr(original, "_lock"):
        assert clone._lock is not original._lock
        with clone._lock:
            pass


# ======================================================= warnings' lines
def test_warnings_name_the_callers_line():
    nan32 = np.array([np.nan, 1.0], F32)
    inf32 = np.array([np.inf, 1.0, 2.0], F32)
    cases = [
        lambda: qc.MinMaxObserver()(nan32),
        lambda: qc.MinMaxObserver().update(nan32),
        lambda: qc.MinMaxObserver().update(torch.from_numpy(nan32)),
        lambda: qc.FakeQuantize()(nan32),
        lambda: qc.FakeQuantize()(nan32.astype(np.float64)),
        lambda: qc.FakeQuantize(axis=0)(nan32),
        lambda: qc.MinMaxObserver().calculate_qparams(),
        lambda: T.MinMaxObserver().calculate_qparams(),
        lambda: T.PerChannelMinMaxObserver().calculate_qparams(),
        lambda: T.MinMaxObserver(reduce_range=True),
        lambda: T.FakeQuantize(reduce_range=True),
        lambda: T.HistogramObserver()(inf32),
        lambda: T.HistogramObserver().calculate_qparams(),
        lambda: calib.TorchHistogram().calculate_qparams(),
        lambda: calib.HistogramCalibrator(grow_method="stretch"),
    ]
    for case in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            case()
        assert caught, case
        for w in caught:
            assert (w.filename, w.lineno) == (__file__, case.__code__.co_firstlineno), \
                (str(w.message), w.filename, w.lineno)


# ================================================ NaN in the first batch
def _nan_first(x):
    x = x.copy()
    x.flat[0] = np.nan
    return x


@pytest.mark.parametrize("case", ["fused", "float64", "strided", "per_channel", "minmax"])
def test_fake_quantize_nan_first_batch_gives_nan_like_torch(case):
    """A skipped first batch leaves no statistics: NaN qparams, an all-NaN
    output and a zero mask (torch: NaN statistics, all-NaN output); the
    first good batch then sets the qparams a fresh FakeQuantize would."""
    good, later = batches(2)
    if case == "float64":
        good, later = good.astype(np.float64), later.astype(np.float64)
    if case == "strided":
        good, later = np.repeat(good, 2, axis=1)[:, ::2], np.repeat(later, 2, axis=1)[:, ::2]
    observer = qc.MinMaxObserver if case == "minmax" else qc.MovingAverageMinMaxObserver
    axis = 1 if case == "per_channel" else None
    fq, fresh = (qc.FakeQuantize(observer(axis=axis), axis=axis) for _ in range(2))
    with pytest.warns(RuntimeWarning, match="NaN or inf was skipped"):
        y = fq(_nan_first(good))
    assert np.isnan(y).all() and not np.asarray(fq.mask).any()
    assert np.isnan(fq.scale).all() and fq.observer.num_batches == 0
    assert not fq.backward(np.ones_like(good)).any()
    with pytest.warns(RuntimeWarning):
        assert np.isnan(fq(_nan_first(later))).all()  # still no statistics
    assert_bits_equal(fq(later), fresh(later))
    assert_bits_equal(fq.scale, fresh.scale)
    # the same as torch's module on the NaN batch
    t = tfq.FakeQuantize()
    assert np.isnan(t(tensor(_nan_first(good).astype(F32))).numpy()).all()


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_nan_scales_survive_state_files(tmp_path, suffix):
    fq = qc.FakeQuantize()
    with pytest.warns(RuntimeWarning):
        fq(_nan_first(batches(1)[0]))
    path = tmp_path / ("fq" + suffix)
    qc.save_state(fq, path)
    loaded = qc.load_state(path)
    assert np.isnan(loaded.scale).all()
    good = batches(2)[1]
    assert_bits_equal(loaded(good), fq(good))


def test_histogram_observer_load_binds_copies():
    """torch's HistogramObserver.load_state_dict binds the source's tensors
    (the two then share their range); here the loaded one binds copies."""
    a, b = T.HistogramObserver(bins=16), T.HistogramObserver(bins=16)
    a(np.array([1, 2, 3], F32))
    b(np.array([0, 5], F32))
    held = b.min_val
    b.load_state_dict(a.state_dict())
    assert float(held) == 0.0 and float(b.min_val) == 1.0  # as torch: the old one is left
    b(np.array([-7, 9], F32))
    assert float(a.min_val) == 1.0 and float(b.min_val) == -7.0


def test_fake_quantize_defaults_without_observation_are_kept():
    """Observer off from the start: the default qparams (1.0, 0) are used,
    as torch's buffers are."""
    fq = qc.FakeQuantize().disable_observer()
    x = np.array([np.nan, 0.4, 1.6, -3.0], F32)
    y = fq(x)
    assert np.isnan(y[0]) and y[1:].tolist() == [0.0, 2.0, 0.0]


@pytest.mark.parametrize("dtype", [F32, np.float64])  # fused kernel, general path
def test_qparams_unchanged_when_nothing_is_observed(dtype):
    """A refused batch (nan_policy="raise") and an empty one leave the
    default qparams as they were (the fused kernel gets the qparams arrays
    themselves, so this is checked on both paths)."""
    fq = qc.FakeQuantize(qc.MinMaxObserver(nan_policy="raise"))
    scale = fq.scale
    with pytest.raises(ValueError, match="contains NaN"):
        fq(np.array([np.nan, 1.0], dtype))
    assert fq.scale is scale and float(scale[0]) == 1.0
    fq(np.empty(0, dtype))
    assert fq.scale is scale and float(scale[0]) == 1.0 and fq.observer.num_batches == 0


@pytest.mark.gpu
def test_fake_quantize_nan_first_batch_on_the_device():
    cp = pytest.importorskip("cupy")
    good = batches(1)[0]
    for axis in (None, 1):
        fq, host = (qc.FakeQuantize(axis=axis) for _ in range(2))
        dev_first = fq(cp.asarray(_nan_first(good)))
        with pytest.warns(RuntimeWarning):
            host_first = host(_nan_first(good))
        assert bits_equal(cp.asnumpy(dev_first), host_first)
        assert bits_equal(fq.scale, host.scale) and np.isnan(fq.scale).all()
        assert bits_equal(cp.asnumpy(fq(cp.asarray(good))), host(good))
        assert bits_equal(fq.scale, host.scale)
        # a device-resident FakeQuantize pickles its host state
        fq(cp.asarray(good * 2))
        clone = pickle.loads(pickle.dumps(fq))
        assert clone._device is None
        assert bits_equal(clone.scale, fq.scale)
        assert bits_equal(cp.asnumpy(clone(cp.asarray(good))), cp.asnumpy(fq(cp.asarray(good))))


# ========================================= HistogramObserver extremes
@pytest.mark.parametrize("x", [[-3.4e30, 3.4e30, 1.7e30], [0.0, 4.6e-41]],
                         ids=["huge", "subnormal"])
def test_histogram_observer_extremes_are_quiet_and_match_torch(x):
    """Ranges whose L2 search overflows (or divides by a subnormal width):
    no numpy RuntimeWarning (a ``-W error`` run passes), torch's qparams."""
    x = np.array(x, F32)
    ours, theirs = T.HistogramObserver(bins=256), tob.HistogramObserver(bins=256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours(x)
        theirs(tensor(x))
        s, z = ours.calculate_qparams()
        ts, tz = theirs.calculate_qparams()  # (about 1.5 s in torch's search)
    assert_bits_equal(np.asarray(s), ts.numpy(), f"{x}")
    assert np.array_equal(z, tz.numpy()), x


# ============================================= requires_grad tensors
def test_tensors_that_require_grad_are_read_detached():
    w = torch.linspace(-1, 1, 11, requires_grad=True)
    obs = qc.MinMaxObserver()
    assert obs(w) is w
    assert float(obs.max_val) == 1.0
    lo, hi = qc.minmax(w)
    assert not lo.requires_grad and float(hi) == 1.0
    y = qc.fake_quant(w, 0.25, 0, -4, 4)
    assert isinstance(y, torch.Tensor) and not y.requires_grad
