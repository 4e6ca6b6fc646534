"""quantcore.compat.horizon: Horizon FakeQuantize semantics.

Every vector of the project's NVIDIA / Horizon specification section 6 is a test here; the
randomized cases compare against the float32 emulation below, written from
the spec independently of quantcore's kernels, and (``test_live_*``, skipped
without torch) against Horizon's Python reference functions and v1 observer
written with torch ops.
"""
import numpy as np
import pytest

from quantcore.compat import horizon as hz
from quantcore.compat.horizon import (FakeQuantize, MovingAverageMinMaxObserver,
                                      MovingAveragePerChannelMinMaxObserver, QuantRoundMode)
from reference import assert_bits_equal

F32 = np.float32
EPS = F32(np.finfo(F32).eps)


@pytest.fixture(autouse=True)
def _restore_globals():
    yield
    QuantRoundMode.set("bpu_round")
    hz.set_march(None)


# --------------------------------------------------------------- reference
class RefObserver:
    """Horizon's v1 moving-average observer in float32 (per tensor, or per
    row after moving ch_axis first)."""

    def __init__(self, c=0.01, qmin=-128, qmax=127, ch_axis=None):
        self.c, self.qmin, self.qmax, self.ch_axis = F32(c), qmin, qmax, ch_axis
        self.mn = self.mx = None

    def __call__(self, x):
        x = np.asarray(x, F32)
        if x.size == 0:
            return
        if self.ch_axis is None:
            bmn, bmx = x.min(), x.max()
        else:
            rows = np.moveaxis(x, self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)
            bmn, bmx = rows.min(axis=1), rows.max(axis=1)
        if self.mn is None:
            self.mn, self.mx = np.array(bmn, F32), np.array(bmx, F32)
        else:
            self.mn = (self.mn + (self.c * (bmn - self.mn).astype(F32)).astype(F32)).astype(F32)
            self.mx = (self.mx + (self.c * (bmx - self.mx).astype(F32)).astype(F32)).astype(F32)

    def scale(self):
        if self.mn is None:
            return np.ones(1, F32)
        a = np.maximum(np.maximum(-self.mn, self.mx), F32(0)).astype(F32)
        s = (a / F32((self.qmax - self.qmin) / 2)).astype(F32)
        return np.maximum(s, EPS).astype(F32).reshape(-1)


def ref_fake_quant(x, scale, qmin, qmax, mode="bpu_round"):
    """out = clamp(round(x / scale), qmin, qmax) * scale and the saturate mask."""
    x = np.asarray(x, F32)
    v = (x / scale).astype(F32)
    r = np.floor((v + F32(0.5)).astype(F32)) if mode == "bpu_round" else np.rint(v)
    q = np.clip(r, F32(qmin), F32(qmax)).astype(F32)
    return (q * scale).astype(F32), (r >= qmin) & (r <= qmax)


assert_bits = assert_bits_equal  # (NaN lanes: both NaN)


def unpack(fq, shape):
    return np.unpackbits(fq.mask, count=int(np.prod(shape)),
                         bitorder="little").reshape(shape).astype(bool)


# ------------------------------------------------------------ spec vectors
BATCHES = [[-1, 0.5, 2], [-3, 1], [0.2, 4]]


def test_spec_ema_and_scales():
    obs = MovingAverageMinMaxObserver()
    expect_mm = [(-1, 2), (-1.02, 1.99), (-1.0078, 2.0101001)]
    expect_scale = [0.015686275, 0.015607843, 0.015765492]
    for batch, (mn, mx), s in zip(BATCHES, expect_mm, expect_scale):
        assert obs(np.array(batch, F32)) is not None
        assert obs.min_val == F32(mn) and obs.max_val == F32(mx)
        scale, zp = obs.calculate_qparams()
        assert scale.dtype == F32 and scale.shape == (1,) and scale[0] == F32(s)
        assert zp.tolist() == [0]


def test_spec_qint16_scale():
    obs = MovingAverageMinMaxObserver(dtype="qint16")
    obs(np.array(BATCHES[0], F32))
    assert obs.calculate_qparams()[0][0] == F32(6.1036088e-05)


def test_spec_pow2_scale():
    hz.set_march("BERNOULLI")
    obs = MovingAverageMinMaxObserver()
    obs(np.array([-2.0, 2.0], F32))
    assert obs.calculate_qparams()[0].tolist() == [0.03125]
    hz.set_march(None)
    assert obs.calculate_qparams()[0][0] == F32(2) / F32(127.5)


def test_spec_all_zero_gives_eps():
    obs = MovingAverageMinMaxObserver()
    obs(np.zeros(5, F32))
    assert obs.calculate_qparams()[0][0] == EPS == F32(1.1920929e-07)


def test_no_data_defaults():
    for obs in (MovingAverageMinMaxObserver(), MovingAveragePerChannelMinMaxObserver()):
        scale, zp = obs.calculate_qparams()
        assert scale.tolist() == [1.0] and scale.dtype == F32
        assert zp.tolist() == [0] and zp.dtype == np.int64
    obs = MovingAverageMinMaxObserver()
    obs(np.zeros((0,), F32))  # empty batch skipped
    assert obs.calculate_qparams()[0].tolist() == [1.0]
    assert obs.min_val == np.inf and obs.max_val == -np.inf


X_FQ = np.array([-2.1, -2, -0.0234375, -0.0078125, 0.0078125, 0.0234375, 0.5, 1.984375,
                 1.9921875, 2.5], F32)


def _fixed_scale_fq(**kw):
    fq = FakeQuantize(**kw)
    fq.disable_observer()
    fq.set_qparams(0.015625)
    return fq


def test_spec_fake_quant_bpu_round_default():
    assert QuantRoundMode.get() == "bpu_round"
    out = _fixed_scale_fq()(X_FQ)
    expect = np.array([-2, -2, -0.015625, 0, 0.015625, 0.03125, 0.5, 1.984375, 1.984375,
                       1.984375], F32)
    assert_bits(out, expect)


def test_spec_fake_quant_half_to_even():
    QuantRoundMode.set("half_to_even")
    out = _fixed_scale_fq()(X_FQ)
    expect = np.array([-2, -2, -0.03125, -0.0, 0, 0.03125, 0.5, 1.984375, 1.984375, 1.984375],
                      F32)
    assert_bits(out, expect)  # including the -0.0
    QuantRoundMode.set(QuantRoundMode.BPU_ROUND)
    assert_bits(_fixed_scale_fq()(X_FQ), ref_fake_quant(X_FQ, F32(0.015625), -128, 127)[0])


def test_round_mode_validation():
    with pytest.raises(ValueError, match="bpu_round"):
        QuantRoundMode.set("floor")
    assert QuantRoundMode.HALF_TO_EVEN == "half_to_even"


# ------------------------------------------------------- dtypes and ranges
@pytest.mark.parametrize("dtype,rng", [("qint8", (-128, 127)), ("torch.qint8", (-128, 127)),
                                       ("qint16", (-32768, 32767)), ("qint4", (-8, 7)),
                                       ("quint4", (0, 15)), ("qint32", (-2 ** 31, 2 ** 31 - 1)),
                                       ("horizon.qint4", (-8, 7))])
def test_dtypes(dtype, rng):
    obs = MovingAverageMinMaxObserver(dtype=dtype)
    assert (obs.quant_min, obs.quant_max) == rng
    fq = FakeQuantize(dtype=dtype)
    assert (fq.quant_min, fq.quant_max) == rng


def test_bad_dtype_and_qscheme():
    for bad in ("torch.quint8", "quint8", "int8"):
        with pytest.raises(ValueError, match="dtype"):
            MovingAverageMinMaxObserver(dtype=bad)
    with pytest.raises(ValueError, match="per_tensor_symmetric"):
        MovingAverageMinMaxObserver(qscheme="per_tensor_affine")
    assert MovingAverageMinMaxObserver(qscheme="torch.per_tensor_symmetric").qscheme == \
        "per_tensor_symmetric"
    with pytest.raises(ValueError, match="per_channel_symmetric"):
        MovingAveragePerChannelMinMaxObserver(qscheme="per_tensor_symmetric")


def test_user_range_validation():
    obs = MovingAverageMinMaxObserver(quant_min=-100, quant_max=100)
    assert (obs.quant_min, obs.quant_max) == (-100, 100)
    with pytest.raises(ValueError, match="include 0"):
        MovingAverageMinMaxObserver(quant_min=1, quant_max=100)
    with pytest.raises(ValueError, match="strictly less"):
        MovingAverageMinMaxObserver(quant_min=0, quant_max=0)
    with pytest.raises(ValueError, match="within the range of qint8"):
        MovingAverageMinMaxObserver(quant_min=-129, quant_max=127)
    with pytest.raises(ValueError, match="within the range of qint4"):
        MovingAverageMinMaxObserver(dtype="qint4", quant_min=-8, quant_max=8)
    # one end alone is ignored (torch's rule)
    assert MovingAverageMinMaxObserver(quant_min=-5).quant_min == -128


# --------------------------------------------------------- observers
def test_observer_random_against_reference():
    rng = np.random.default_rng(0)
    for dtype, (qmin, qmax) in hz.QINFO.items():
        c = float(rng.choice([0.01, 0.1, 0.5, 1.0]))
        obs = MovingAverageMinMaxObserver(averaging_constant=c, dtype=dtype)
        ref = RefObserver(c, qmin, qmax)
        for _ in range(6):
            x = (rng.standard_normal(int(rng.integers(1, 50))) * rng.random() * 5).astype(F32)
            obs(x)
            ref(x)
            assert obs.min_val == ref.mn and obs.max_val == ref.mx
            assert_bits(obs.calculate_qparams()[0], ref.scale())
        obs.reset_min_max_vals()
        assert obs.calculate_qparams()[0].tolist() == [1.0]


@pytest.mark.parametrize("ch_axis", [0, 1, -1])
def test_per_channel_observer_against_reference(ch_axis):
    rng = np.random.default_rng(1)
    obs = MovingAveragePerChannelMinMaxObserver(averaging_constant=0.25, ch_axis=ch_axis)
    assert obs.min_val.shape == (0,)
    ref = RefObserver(0.25, -128, 127, ch_axis=ch_axis)
    for _ in range(4):
        x = rng.standard_normal((3, 4, 2)).astype(F32) * F32(3)
        obs(x)
        ref(x)
        assert_bits(obs.min_val, ref.mn)
        assert_bits(obs.max_val, ref.mx)
        scale, zp = obs.calculate_qparams()
        assert_bits(scale, ref.scale())
        assert zp.tolist() == [0] * scale.size


# ------------------------------------------------------- FakeQuantize
def test_fake_quantize_construction():
    fq = FakeQuantize()
    assert fq.scale.tolist() == [1.0] and fq.scale.dtype == F32
    assert fq.zero_point.tolist() == [0] and fq.zero_point.dtype == np.int64
    assert fq.fake_quant_enabled.tolist() == [1] and fq.observer_enabled.tolist() == [1]
    assert fq.training and fq.saturate is True and fq.compat_mask and fq.fast_training
    assert fq.ch_axis == -1 and not fq.is_per_channel
    assert isinstance(fq.activation_post_process, MovingAverageMinMaxObserver)
    pc = FakeQuantize(observer=MovingAveragePerChannelMinMaxObserver, channel_len=4, ch_axis=1)
    assert pc.is_per_channel and pc.ch_axis == 1 and pc.scale.shape == (4,)
    assert pc.zero_point.shape == (4,)
    # channel_len only sizes per-channel buffers
    assert FakeQuantize(channel_len=4).scale.shape == (1,)
    with pytest.raises(ValueError, match="channel_len"):
        FakeQuantize(channel_len=0)
    assert FakeQuantize(saturate=False).saturate is False


@pytest.mark.parametrize("mode", ["bpu_round", "half_to_even"])
@pytest.mark.parametrize("dtype", ["qint8", "qint16", "qint4", "quint4"])
def test_training_random_against_reference(mode, dtype):
    QuantRoundMode.set(mode)
    rng = np.random.default_rng(sum(map(ord, mode + dtype)))
    qmin, qmax = hz.QINFO[dtype]
    fq = FakeQuantize(dtype=dtype, averaging_constant=0.3)
    ref = RefObserver(0.3, qmin, qmax)
    for _ in range(5):
        x = np.clip(rng.standard_normal((4, 7)) * 2, -4.9, 4.9).astype(F32)
        x[1, :2] = [-5.0, 5.0]
        probe = RefObserver(0.3, qmin, qmax)
        probe.mn, probe.mx = ref.mn, ref.mx
        probe(x)
        s = probe.scale()[0]
        # exact ties of x / scale inside the batch range (the statistics do not move)
        kmax = int(4.0 / s) - 1
        x[0] = ((rng.integers(-kmax, kmax, 7) + F32(0.5)) * s).astype(F32)
        ref(x)
        assert ref.scale()[0] == s
        y = fq(x)
        assert_bits(fq.scale, ref.scale())
        exp_y, exp_mask = ref_fake_quant(x, s, qmin, qmax, mode)
        assert_bits(y, exp_y)
        assert (unpack(fq, x.shape) == exp_mask).all()


def test_training_sequence_against_reference():
    rng = np.random.default_rng(4)
    for mode in ("bpu_round", "half_to_even"):
        QuantRoundMode.set(mode)
        fq = FakeQuantize(averaging_constant=0.2)
        ref = RefObserver(0.2)
        for _ in range(6):
            x = (rng.standard_normal(64) * rng.random() * 4).astype(F32)
            y = fq(x)
            ref(x)
            s = ref.scale()
            assert_bits(fq.scale, s)
            exp_y, exp_mask = ref_fake_quant(x, s[0], -128, 127, mode)
            assert_bits(y, exp_y)
            assert (unpack(fq, x.shape) == exp_mask).all()
            g = rng.standard_normal(64).astype(F32)
            assert_bits(fq.backward(g), (g * exp_mask).astype(F32))


@pytest.mark.parametrize("dtype", ["qint8", "quint4"])
def test_fast_training_identical_numbers(dtype):
    rng = np.random.default_rng(9)
    fast = FakeQuantize(dtype=dtype, fast_training=True)
    slow = FakeQuantize(dtype=dtype, fast_training=False)
    for i in range(8):
        QuantRoundMode.set("half_to_even" if i % 2 else "bpu_round")
        x = (rng.standard_normal((5, 6)) * 3).astype(F32)
        if i == 3:
            x = np.asfortranarray(x)
        if i == 5:
            x = x[:, ::2]  # strided: the core's general path
        assert_bits(fast(x), slow(x))
        assert_bits(fast.scale, slow.scale)
        assert_bits(fast.activation_post_process.min_val, slow.activation_post_process.min_val)
        assert (fast.mask == slow.mask).all()


def test_fast_path_is_used():
    fq = FakeQuantize()
    fq(np.ones(4, F32))
    assert fq._fused is not None
    slow = FakeQuantize(fast_training=False)
    slow(np.ones(4, F32))
    assert slow._fused is None


def test_per_channel_fake_quantize():
    rng = np.random.default_rng(2)
    fq = FakeQuantize(observer=MovingAveragePerChannelMinMaxObserver, ch_axis=1, channel_len=3,
                      averaging_constant=0.5)
    ref = RefObserver(0.5, ch_axis=1)
    for _ in range(3):
        x = (rng.standard_normal((2, 3, 4)) * 2).astype(F32)
        y = fq(x)
        ref(x)
        s = ref.scale()
        assert_bits(fq.scale, s)
        exp_y, exp_mask = ref_fake_quant(x, s.reshape(1, 3, 1), -128, 127)
        assert_bits(y, exp_y)
        assert (unpack(fq, x.shape) == exp_mask).all()
    with pytest.raises(ValueError, match="channels"):
        fq.disable_observer()
        fq(np.ones((2, 5), F32))


def test_presets_and_with_args():
    fq = hz.default_8bit_fake_quant()
    assert fq.dtype == "qint8" and not fq.is_per_channel
    assert hz.default_16bit_fake_quant().quant_max == 32767
    assert hz.per_channel_8bit_fake_quant().ch_axis == 1
    w = hz.default_weight_8bit_fake_quant(channel_len=8)
    assert w.ch_axis == 0 and w.scale.shape == (8,)
    builder = FakeQuantize.with_args(dtype="qint4").with_args(dtype="qint16", saturate=False)
    a, b = builder(), builder()
    assert a is not b and a.activation_post_process is not b.activation_post_process
    assert a.dtype == "qint16" and a.saturate is False
    obs_builder = MovingAverageMinMaxObserver.with_args(averaging_constant=0.5)
    assert obs_builder().averaging_constant == 0.5
    fq = FakeQuantize(observer=MovingAverageMinMaxObserver.with_args(dtype="qint4"))
    assert fq.quant_min == -8


def test_saturate_and_masks():
    x = np.array([-3.0, -1.0, 0.2, 1.0, 3.0], F32)
    g = np.array([1.0, -2.0, 3.0, 4.0, -5.0], F32)
    exp_y, exp_mask = ref_fake_quant(x, F32(1 / 64), -128, 127)
    fq = _fixed_scale_fq()
    fq.set_qparams(F32(1 / 64))
    assert_bits(fq(x), exp_y)
    assert fq.mask.dtype == np.uint8 and fq.mask.shape == (1,)
    assert fq.mask.tolist() == [int(np.packbits(exp_mask, bitorder="little")[0])]
    assert (unpack(fq, x.shape) == exp_mask).all()
    assert_bits(fq.backward(g), (g * exp_mask).astype(F32))
    assert fq.backward(g).tolist() == [-0.0, -2.0, 3.0, 4.0, -0.0]
    # compat_mask=False: a bool mask of x's shape, same gradient
    fq2 = _fixed_scale_fq(compat_mask=False)
    fq2.set_qparams(F32(1 / 64))
    fq2(x)
    assert fq2.mask.dtype == np.bool_ and (fq2.mask == exp_mask).all()
    assert_bits(fq2.backward(g), fq.backward(g))
    # saturate=False: pure STE
    fq3 = _fixed_scale_fq(saturate=False)
    fq3.set_qparams(F32(1 / 64))
    assert_bits(fq3(x), exp_y)
    assert fq3.mask is None
    assert_bits(fq3.backward(g), g)
    with pytest.raises(ValueError, match="shape"):
        fq.backward(np.ones(3, F32))


def test_packed_mask_round_trip_large():
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((13, 11)) * 4).astype(F32)  # 143 elements: a partial last byte
    fq = FakeQuantize()
    fq.set_qparams(0.02)
    fq.disable_observer()
    fq(x)
    _, exp_mask = ref_fake_quant(x, F32(0.02), -128, 127)
    assert fq.mask.shape == ((x.size + 7) // 8,)
    assert (np.unpackbits(fq.mask, count=x.size, bitorder="little").reshape(x.shape)
            == exp_mask).all()
    assert (fq.mask == np.packbits(exp_mask.ravel(), bitorder="little")).all()


def test_switches_and_modes():
    x = np.array([-1.0, 0.5, 2.0], F32)
    fq = FakeQuantize()
    fq.disable_fake_quant()
    assert fq.fake_quant_enabled.tolist() == [0]
    y = fq(x)
    assert_bits(y, x)
    assert fq.scale[0] == F32(2) / F32(127.5)      # the observer still ran
    assert fq.mask is None and fq.backward(x).tolist() == x.tolist()
    fq.enable_fake_quant()
    fq.disable_observer()
    before = fq.activation_post_process.min_val.copy()
    fq(x * F32(10))
    assert fq.activation_post_process.min_val == before
    fq.enable_observer()
    fq.eval()
    assert not fq.training
    fq(x * F32(10))
    assert fq.activation_post_process.min_val == before   # no observation in eval
    assert_bits(fq(x), ref_fake_quant(x, fq.scale[0], -128, 127)[0])
    fq.train()
    fq(x * F32(10))
    assert fq.activation_post_process.min_val != before
    assert fq.enable_observer(False).observer_enabled.tolist() == [0]


def test_set_qparams():
    fq = FakeQuantize(observer=MovingAveragePerChannelMinMaxObserver, channel_len=3, ch_axis=1)
    fq.set_qparams(0.5)
    assert fq.scale.tolist() == [0.5] * 3 and fq.zero_point.tolist() == [0] * 3
    fq.set_qparams([0.1, 0.2, 0.3], [1, 2, 3])
    assert fq.scale.tolist() == [F32(0.1), F32(0.2), F32(0.3)]
    assert fq.zero_point.tolist() == [1, 2, 3] and fq.zero_point.dtype == np.int64
    fq.set_qparams(np.array([0.25, 0.5, 1.0], F32))
    assert fq.zero_point.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="mismatched shape when set scale.*channel_len"):
        fq.set_qparams(np.ones(2, F32))
    with pytest.raises(ValueError, match="mismatched shape when set zero_point"):
        fq.set_qparams(0.5, [0, 0])
    # the zero point never enters the fake quant (symmetric)
    fq.set_qparams([0.25, 0.5, 1.0], [5, 5, 5])
    fq.disable_observer()
    x = np.array([[0.3, 0.3, 0.3], [-0.6, 0.9, 1.6]], F32)
    assert_bits(fq(x), ref_fake_quant(x, np.array([0.25, 0.5, 1.0], F32), -128, 127)[0])


def test_in_place():
    x = np.array([0.3, -0.71, 5.0], F32)
    fq = FakeQuantize(in_place=True)
    fq.set_qparams(0.1)
    fq.disable_observer()
    expect = ref_fake_quant(x, F32(0.1), -128, 127)[0]
    y = fq(x)
    assert y is x
    assert_bits(x, expect)


def test_dtypes_of_input():
    fq = FakeQuantize()
    fq.set_qparams(0.1)
    fq.disable_observer()
    x16 = np.array([0.3, -0.71, 5.0], np.float16)
    y = fq(x16)
    assert y.dtype == np.float16
    assert_bits(y.astype(F32), ref_fake_quant(x16.astype(F32), F32(0.1), -128, 127)[0]
                .astype(np.float16).astype(F32))
    assert fq([0.3, 0.35]).dtype == np.float64


def test_module_doctests():
    import doctest
    res = doctest.testmod(hz, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


# ------------------------------------------------ live torch oracle
# Horizon's Python reference functions and its v1 observer written here with
# torch float32 ops (skipped without torch).
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


class TorchHorizonObserver:
    """The v1 moving-average observer in torch: aminmax, in-place EMA,
    ``clamp_min(clamp_min(max(-min, max), 0) / ((qmax - qmin) / 2), eps)``."""

    def __init__(self, torch, c, qmin, qmax, ch_axis=None):
        self.t, self.c, self.qmin, self.qmax, self.ch_axis = torch, c, qmin, qmax, ch_axis
        self.mn = self.mx = None

    def __call__(self, x):
        t = self.t
        x = t.from_numpy(x)
        if self.ch_axis is None:
            mn, mx = t.aminmax(x)
        else:
            rows = t.movedim(x, self.ch_axis, 0).reshape(x.shape[self.ch_axis], -1)
            mn, mx = t.aminmax(rows, dim=1)
        if self.mn is None:
            self.mn, self.mx = mn.clone(), mx.clone()
        else:
            self.mn += self.c * (mn - self.mn)
            self.mx += self.c * (mx - self.mx)

    def scale(self):
        t = self.t
        s = t.clamp_min(t.max(-self.mn, self.mx), 0) / ((self.qmax - self.qmin) / 2)
        return t.clamp_min(s, t.finfo(t.float32).eps).reshape(-1)


def torch_fake_quant(torch, x, scale, qmin, qmax, mode, ch_axis=None):
    xt = torch.from_numpy(x)
    s = torch.from_numpy(np.asarray(scale, F32))
    if ch_axis is not None:
        shape = [1] * x.ndim
        shape[ch_axis] = -1
        s = s.reshape(shape)
    v = xt / s
    r = torch.round(v) if mode == "half_to_even" else torch.floor(v + 0.5)
    return (r.clamp(qmin, qmax) * s).numpy(), ((r >= qmin) & (r <= qmax)).numpy()


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("mode", ["bpu_round", "half_to_even"])
@pytest.mark.parametrize("dtype", ["qint8", "qint16", "qint4", "quint4"])
def test_live_torch_training(torch, dtype, mode, per_channel):
    QuantRoundMode.set(mode)
    rng = np.random.default_rng(sum(map(ord, dtype + mode)) + per_channel)
    qmin, qmax = hz.QINFO[dtype]
    c = 0.25
    if per_channel:
        fq = FakeQuantize(observer=MovingAveragePerChannelMinMaxObserver, ch_axis=1,
                          channel_len=3, dtype=dtype, averaging_constant=c)
        oracle = TorchHorizonObserver(torch, c, qmin, qmax, ch_axis=1)
    else:
        fq = FakeQuantize(dtype=dtype, averaging_constant=c)
        oracle = TorchHorizonObserver(torch, c, qmin, qmax)
    for step in range(5):
        x = (rng.standard_normal((4, 3, 5)) * rng.uniform(0.5, 3)).astype(F32)
        oracle(x)
        s = oracle.scale().numpy()
        # ties of x / scale and zeros strictly inside each channel's batch
        # range, so that the statistics are those of the original x
        red = (0, 2) if per_channel else None
        lo = x.min(axis=red, keepdims=per_channel)
        hi = x.max(axis=red, keepdims=per_channel)
        sx = s.reshape(1, -1, 1) if per_channel else s[0]
        k = rng.integers(-20, 20, size=x.shape).astype(F32) + F32(0.5)
        ties = (k * sx).astype(F32)
        pick = np.where((x == lo) | (x == hi), F32(0.5), rng.random(x.shape))
        x = np.where((pick < 0.3) & (ties > lo) & (ties < hi), ties, x).astype(F32)
        x = np.where((pick > 0.95) & (lo < 0) & (hi > 0), F32(0), x).astype(F32)
        y = fq(x)
        assert_bits(fq.scale, s)
        exp_y, exp_mask = torch_fake_quant(torch, x, s, qmin, qmax, mode,
                                           1 if per_channel else None)
        assert_bits(y, exp_y)
        assert (unpack(fq, x.shape) == exp_mask).all()
        g = rng.standard_normal(x.shape).astype(F32)
        assert (fq.backward(g) == np.where(exp_mask, g, 0)).all()


@pytest.mark.parametrize("mode", ["bpu_round", "half_to_even"])
def test_live_torch_signed_zeros(torch, mode):
    """Signed zeros as torch.round(x / s) * s / torch.floor(x / s + 0.5) * s,
    on the fixed-scale path, the fused fast path and the general path."""
    QuantRoundMode.set(mode)
    x = np.array([-0.0, -0.001, 0.0, 0.001, -0.0078125, 0.0078125, -2.0, 2.0], F32)
    exp, _ = torch_fake_quant(torch, x, np.float32(0.015625), -128, 127, mode)
    assert_bits(_fixed_scale_fq()(x), exp)
    if mode == "half_to_even":
        assert np.signbit(exp).tolist()[:4] == [True, True, False, False]
    for fast in (True, False):
        fq = FakeQuantize(fast_training=fast)
        y = fq(x)
        assert (fq._fused is not None) == fast
        exp, _ = torch_fake_quant(torch, x, fq.scale, -128, 127, mode)
        assert_bits(y, exp)
