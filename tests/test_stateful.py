"""qparams schemes, observers, FakeQuantize and state files (issue 3)."""
import threading
import warnings

import numpy as np
import pytest

import quantcore as qc
from quantcore import qparams as Q

import reference as ref

F32 = np.float32


def f32(v):
    return np.asarray(v, dtype=F32)


# ------------------------------------------------------------------ qparams
X3 = f32([-1, 0.5, 2])


@pytest.mark.parametrize("qmin,qmax,symmetric,scale,zp", [
    (0, 255, False, "0.011764706", 85),
    (-128, 127, False, "0.011764706", -43),
    (-128, 127, True, "0.015686275", 0),
    (0, 255, True, "0.015686275", 128),
    (0, 127, False, "0.023622047", 42),
    (-64, 63, False, "0.023622047", -22),
    (-2 ** 31, 2 ** 31 - 1, False, "1.1920929e-07", -2139095040),
    (-32768, 32767, True, "6.103609e-05", 0),
    (0, 65535, False, "4.5777066e-05", 21845),
    (0, 15, False, "0.2", 5),
])
def test_torch_observer_qparams_vectors(qmin, qmax, symmetric, scale, zp):
    fn = Q.symmetric_qparams if symmetric else Q.affine_qparams
    s, z = fn(X3.min(), X3.max(), qmin, qmax)
    assert s[0] == F32(scale) and z[0] == zp


def test_qparams_edge_vectors():
    assert Q.affine_qparams(1, 3, 0, 255)[1][0] == 0
    assert Q.affine_qparams(-3, -1, 0, 255)[1][0] == 255
    s, z = Q.affine_qparams(-300, 1e-3, 0, 255)
    assert s[0] == F32("1.1764746") and z[0] == 255
    s, z = Q.affine_qparams(-0.625, 1.875, 0, 10)
    assert s[0] == F32(0.25) and z[0] == 2
    assert Q.affine_qparams(5, 5, 0, 255)[0][0] == F32(5) / F32(255)
    assert Q.affine_qparams(0, 0, 0, 255)[0][0] == F32(2 ** -23)
    s, z = Q.symmetric_qparams(0, 1e-3, -127, 127, eps=2 ** -12)
    assert s[0] == F32("0.00024414062") and z[0] == 0
    # non-finite, as torch on x86
    assert np.isnan(Q.affine_qparams(np.nan, 1, 0, 255)[0][0])
    assert Q.affine_qparams(np.nan, 1, 0, 255)[1][0] == 0
    assert Q.affine_qparams(np.nan, 1, -128, 127)[1][0] == 127
    s, z = Q.affine_qparams(-1, np.inf, 0, 255)
    assert np.isinf(s[0]) and z[0] == 0
    s, z = Q.float_qparams([1, -1, 2], [3, .5, 2], 0, 255)
    assert ref.bits_equal(s, f32(["0.007843138", "0.005882353", 1.0]))
    assert ref.bits_equal(z, f32(["-127.49999237", 170.0, -2.0]))
    s, z = Q.float_qparams([1, -1, 2], [3, .5, 2], 0, 15)
    assert ref.bits_equal(s, f32(["0.13333334", 0.1, 1.0]))
    assert ref.bits_equal(z, f32(["-7.4999995", 10.0, -2.0]))


def test_per_channel_shares_the_per_tensor_path():
    rng = np.random.default_rng(1)
    lo, hi = f32(rng.uniform(-3, 0, 16)), f32(rng.uniform(0, 3, 16))
    s, z = Q.affine_qparams(lo, hi, -128, 127)
    for c in range(16):
        sc, zc = Q.affine_qparams(lo[c], hi[c], -128, 127)
        assert s[c] == sc[0] and z[c] == zc[0]


def test_oneflow_qparams_vectors():
    x = f32([[1, 2, 1], [-2, 0, -1]])
    s, z = Q.oneflow_qparams(x.min(), x.max(), 8, "symmetric")
    assert s[0] == F32("0.015748031") and z[0] == 0
    s, z = Q.oneflow_qparams(x.min(), x.max(), 8, "affine")
    assert s[0] == F32("0.015686275") and z[0] == 127
    s, _ = Q.oneflow_qparams(x.min(), x.max(), 8, formula="cambricon")
    assert s[0] == -5
    w = f32([[0.3, -0.7, 1.5, 2.0], [-0.1, 0.05, 0.2, -0.4]])
    lo, hi = qc.minmax(w, axis=0)
    s, z = Q.oneflow_qparams(lo, hi, 8, "affine")
    # the spec prints 0.002352941 with 7 significant digits: check the formula there
    assert s[0] == F32("0.010588235") and abs(float(s[1]) - 0.002352941) < 1e-9
    assert s[1] == F32(F32(F32(0.2) - F32(-0.4)) / F32(255)) and z.tolist() == [66, 170]
    assert Q.oneflow_qparams(-0.5, 254.5, 8, "affine")[1][0] == 0
    assert Q.oneflow_qparams(-0.5, 254.5, 8, "affine", zp_rounding="half_away")[1][0] == 1


X9 = f32([-1.5, -1, -0.3, 0, 0.2, 1.1, 2.9, 3, 3.5])


def test_mindspore_nudge_and_forward_vectors():
    nmin, nmax, s = Q.nudge_mindspore(-1, 3, 0, 255)
    assert nmin[0] == F32("-1.0039216") and nmax[0] == F32("2.9960785")
    y = qc.fake_quant_nudged(X9, nmin, nmax, s, formula="mindspore", scale_op="div")
    exp = f32(["-1.0039216", "-1.0039216", "-0.29803926", 0, "0.20392156", "1.0980393",
               "2.9019608", "2.9960785", "2.9960785"])
    assert ref.bits_equal(y, exp)
    nmin, nmax, s = Q.nudge_mindspore(-1, 3, 0, 15)
    y = qc.fake_quant_nudged(X9, nmin, nmax, s, formula="mindspore", scale_op="div")
    exp = f32(["-1.0666667", "-1.0666667", "-0.26666665", 0, "0.26666665", "1.0666667",
               "2.9333334", "2.9333334", "2.9333334"])
    assert ref.bits_equal(y, exp)


def test_tensorflow_nudge_vectors():
    doc = f32([[1, 2, 1], [-2, 0, -1]])
    nmin, nmax, s, inv, qz = Q.nudge_tensorflow(-6, 6, 0, 255)
    args = qc.fake_quant_nudged(doc, nmin, nmax, s, inv_scale=inv, quant_zero=qz)
    assert ref.bits_equal(args, f32([[0.9882353, 2.0235295, 0.9882353],
                                     [-1.9764706, 0, -0.9882353]]))
    vars_ = qc.fake_quant_nudged(doc, nmin, nmax, s, inv_scale=inv, quant_zero=qz, scale_op="div")
    assert ref.bits_equal(vars_, f32([[0.9882353, 1.9764706, 0.9882353],
                                      [-1.9764706, 0, -0.9882353]]))
    nmin, nmax, s, inv, qz = Q.nudge_tensorflow(-1, 3, 1, 255)
    y = qc.fake_quant_nudged(X9, nmin, nmax, s, inv_scale=inv, quant_zero=qz, scale_op="div")
    exp = f32(["-1.007874", "-0.992126", "-0.29921260", 0, "0.2047244", "1.1023622",
               "2.8976378", "2.992126", "2.992126"])
    assert ref.bits_equal(y, exp)


def test_amax_vectors():
    x = f32([-1.5, -1.0, -0.003937, -0.0039371, 0.5 / 127, 1.5 / 127, 2.5 / 127, 0.3, 1.0, 1.2,
             -1.2])
    y = qc.fake_quant_amax(x, 1.0, narrow_range=False)
    q = [-128, -127, -0.0, -1, 0, 2, 2, 38, 127, 127, -128]
    assert ref.bits_equal(y, (f32(q) / F32(127)).astype(F32))
    assert ref.bits_equal(qc.fake_quant_amax(f32([0.5, 1.5, 2.5, -2.5, 126.5, -127.5]), 127.0,
                                             narrow_range=False),
                          f32([0, 2, 2, -2, 126, -128]))
    for tiny in (0.0, 2.0 ** -24, 1e-8):
        assert not qc.fake_quant_amax(x, tiny).any()


# ---------------------------------------------------------------- observers
def test_moving_average_torch_example():
    obs = qc.MovingAverageMinMaxObserver(averaging_constant=0.5)
    seen = []
    for batch in ([-1, 1], [-3, 2], [.5, .7]):
        obs(f32(batch))
        seen.append((float(obs.min_val), float(obs.max_val)))
    assert seen == [(-1, 1), (-2, 1.5), (-0.75, float(F32(1.1)))]
    s, z = obs.calculate_qparams(0, 255)
    assert s[0] == F32("0.0072549023") and z[0] == 103


def test_moving_average_is_not_the_convex_form():
    obs = qc.MovingAverageMinMaxObserver(averaging_constant=1.0)
    obs(f32([1e20]))
    obs(f32([1.0]))
    assert float(obs.min_val) == 0.0  # m + 1*(x - m) loses x, as torch


def test_horizon_ema_vectors():
    obs = qc.MovingAverageMinMaxObserver(averaging_constant=0.01)
    scales = []
    for batch in ([-1, 0.5, 2], [-3, 1], [0.2, 4]):
        obs(f32(batch))
        scales.append(obs.calculate_qparams(-128, 127, symmetric=True)[0][0])
    assert float(obs.min_val) == F32(-1.0078) and float(obs.max_val) == F32(2.0101001)
    assert scales == [F32("0.015686275"), F32("0.015607843"), F32("0.015765492")]


def test_mindspore_ema_rule():
    obs = qc.EMAMinMaxObserver(decay=0.999, min_init=-6, max_init=6)
    obs(f32([[1, 2, 1], [-2, 0, -1]]))
    c = F32(1 - 0.999)
    exp_min = min(F32(F32(F32(-6) * F32(0.999)) + F32(F32(-2) * c)), F32(0))
    exp_max = max(F32(F32(F32(6) * F32(0.999)) + F32(F32(2) * c)), F32(0))
    assert float(obs.min_val) == exp_min and float(obs.max_val) == exp_max
    assert abs(float(obs.min_val) + 5.996) < 1e-6
    plain = qc.EMAMinMaxObserver(decay=0.0)
    plain(f32([[1, 2, 1], [-2, 0, -1]]))
    assert (float(plain.min_val), float(plain.max_val)) == (-2.0, 2.0)
    pos = qc.EMAMinMaxObserver(decay=0.0)
    pos(f32([1, 2]))
    assert float(pos.min_val) == 0.0  # 0 is always included


def test_oneflow_momentum_vectors():
    sym = qc.MomentumMinMaxObserver(momentum=0.95, symmetric=True)
    aff = qc.MomentumMinMaxObserver(momentum=0.95, symmetric=False)
    for obs in (sym, aff):
        obs(f32([[1, 2, 1], [-2, 0, -1]]))
        obs(f32([0.5, -4]))
    assert float(sym.max_val) == F32("2.0999999")
    assert Q.oneflow_qparams(sym.min_val, sym.max_val, 8, "symmetric")[0][0] == F32("0.016535433")
    assert float(aff.max_val) == F32("1.925") and float(aff.min_val) == F32("-2.0999999")
    s, z = Q.oneflow_qparams(aff.min_val, aff.max_val, 8, "affine", zp_rounding="half_away")
    assert s[0] == F32("0.015784312") and z[0] == 133


@pytest.mark.parametrize("axis", [None, 0, 2])
def test_minmax_observer_merge_is_exact(axis, rng):
    data = rng.normal(size=(40, 6, 16)).astype(F32)
    data[3, 2, 1] = -0.0
    whole = qc.MinMaxObserver(axis=axis)
    whole(data)
    chunk_axis = 2 if axis == 0 else 0
    parts = [qc.MinMaxObserver(axis=axis) for _ in range(8)]
    for obs, chunk in zip(parts, np.array_split(data, 8, axis=chunk_axis)):
        obs(chunk)
    merged = qc.MinMaxObserver(axis=axis)
    for obs in parts:
        merged.merge(obs)
    assert ref.bits_equal(merged.min_val, whole.min_val)
    assert ref.bits_equal(merged.max_val, whole.max_val)
    assert merged.num_batches == 8


def test_moving_averages_refuse_merge():
    with pytest.raises(ValueError, match="cannot be merged"):
        qc.MovingAverageMinMaxObserver().merge(qc.MovingAverageMinMaxObserver())
    with pytest.raises(ValueError, match="expected a MinMaxObserver"):
        qc.MinMaxObserver().merge(qc.MinMaxObserver(axis=0))


def test_nan_policies():
    obs = qc.MinMaxObserver()
    obs(f32([1, 2]))
    with pytest.warns(RuntimeWarning, match="NaN was skipped"):
        obs(f32([np.nan, 100]))
    assert obs.nan_batches == 1 and float(obs.max_val) == 2.0
    prop = qc.MinMaxObserver(nan_policy="propagate")
    prop(f32([np.nan, 1]))
    prop(f32([0, 1]))
    assert np.isnan(prop.min_val)
    with pytest.raises(ValueError, match="NaN"):
        qc.MovingAverageMinMaxObserver(nan_policy="raise")(f32([np.nan]))
    per_channel = qc.MinMaxObserver(axis=0)
    with pytest.warns(RuntimeWarning):
        per_channel(f32([[1, np.nan], [2, 3]]))
    assert per_channel.num_batches == 0


def test_observer_errors():
    with pytest.raises(ValueError, match="averaging_constant"):
        qc.MovingAverageMinMaxObserver(averaging_constant=0)
    with pytest.raises(ValueError, match="nan_policy"):
        qc.MinMaxObserver(nan_policy="ignore")
    obs = qc.MinMaxObserver(axis=1)
    obs(np.zeros((2, 3), F32))
    with pytest.raises(ValueError, match="channels"):
        obs(np.zeros((2, 4), F32))
    with pytest.raises(ValueError, match="axis 1 is out of range"):
        obs(np.zeros(3, F32))
    with pytest.warns(RuntimeWarning, match="no batch"):
        s, z = qc.MinMaxObserver().calculate_qparams()
    assert s[0] == 1.0 and z[0] == 0


def test_observer_is_thread_safe(rng):
    data = [rng.normal(size=5000).astype(F32) for _ in range(64)]
    serial = qc.MinMaxObserver()
    for d in data:
        serial(d)
    shared = qc.MinMaxObserver()
    threads = [threading.Thread(target=lambda k=k: [shared(d) for d in data[k::8]])
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shared.num_batches == 64
    assert shared.min_val == serial.min_val and shared.max_val == serial.max_val


# ------------------------------------------------------------- FakeQuantize
def reference_fake_quantize_loop(batches, grads, qmin, qmax, c):
    """Independent reference: torch-form moving average, affine qparams,
    fake quant and STE written with numpy float32 / tests.reference."""
    mn = mx = None
    outs = []
    for x, g in zip(batches, grads):
        lo, hi = F32(x.min()), F32(x.max())
        if mn is None:
            mn, mx = lo, hi
        else:
            mn = F32(mn + F32(F32(c) * F32(lo - mn)))
            mx = F32(mx + F32(F32(c) * F32(hi - mx)))
        min_neg, max_pos = min(mn, F32(0)), max(mx, F32(0))
        scale = max(F32(F32(max_pos - min_neg) / F32(qmax - qmin)), F32(2 ** -23))
        zp = int(np.clip(qmin - int(np.rint(F32(min_neg / scale))), qmin, qmax))
        y, mask = ref.affine(x.astype(np.float64), scale, zp, qmin, qmax)
        outs.append((y.astype(F32), (g * mask).astype(F32), scale, zp))
    return outs


def test_fake_quantize_matches_reference_loop_100_steps(rng):
    qmin, qmax, c = 0, 255, 0.01
    fq = qc.FakeQuantize(qc.MovingAverageMinMaxObserver(averaging_constant=c), qmin, qmax)
    batches = [(rng.normal(size=(8, 16)) * (1 + k / 50) + k / 100).astype(F32) for k in range(100)]
    grads = [rng.normal(size=(8, 16)).astype(F32) for _ in range(100)]
    expected = reference_fake_quantize_loop(batches, grads, qmin, qmax, c)
    for x, g, (y_exp, gx_exp, s_exp, z_exp) in zip(batches, grads, expected):
        y = fq(x)
        assert fq.scale[0] == s_exp and fq.zero_point[0] == z_exp
        assert ref.bits_equal(y, y_exp)
        assert ref.bits_equal(fq.backward(g), gx_exp)


def test_fake_quantize_switches_delay_and_packed_mask(rng):
    x = rng.normal(size=(4, 5, 6)).astype(F32) * 4
    fq = qc.FakeQuantize(qc.MinMaxObserver(axis=1), -8, 7, symmetric=True, axis=1,
                         quant_delay=2, packed_mask=True)
    assert fq(x) is x and fq.backward(x) is x  # delay: identity, observer still runs
    assert fq.observer.num_batches == 1
    fq(x)
    y = fq(x)
    s, z = Q.symmetric_qparams(*qc.minmax(x, axis=1), -8, 7)
    assert ref.bits_equal(y, qc.fake_quant(x, s, z, -8, 7, axis=1))
    assert fq.mask.dtype == np.uint8 and fq.mask.size == (x.size + 7) // 8
    g = np.ones_like(x)
    _, mask = qc.fake_quant_with_mask(x, s, z, -8, 7, axis=1)
    assert ref.bits_equal(fq.backward(g), (g * mask).astype(F32))
    fq.disable_fake_quant()
    assert fq(x) is x
    fq.enable_fake_quant().disable_observer()
    before = fq.observer.num_batches
    fq(x * 100)
    assert fq.observer.num_batches == before
    fq.enable_observer().eval()
    fq(x * 100)
    assert fq.observer.num_batches == before  # eval: no observing
    out = np.empty_like(x)
    assert fq(x, out=out) is out
    with pytest.raises(ValueError, match="grad_output has shape"):
        fq.backward(np.ones(3, F32))


def test_fake_quantize_errors():
    with pytest.raises(ValueError, match="quant_min must be < quant_max"):
        qc.FakeQuantize(quant_min=5, quant_max=5)
    with pytest.raises(TypeError, match="observer"):
        qc.FakeQuantize(observer="minmax")
    with pytest.raises(ValueError, match="axis=0"):
        qc.FakeQuantize(qc.MinMaxObserver(), axis=0)
    with pytest.raises(ValueError, match="quant_delay"):
        qc.FakeQuantize(quant_delay=-1)


# -------------------------------------------------------------- state files
def make_objects(rng):
    x = rng.normal(size=(6, 5)).astype(F32)
    objs = [qc.MinMaxObserver(), qc.MinMaxObserver(axis=1),
            qc.MovingAverageMinMaxObserver(0.3, axis=0), qc.EMAMinMaxObserver(0.9),
            qc.MomentumMinMaxObserver(0.9, symmetric=True),
            qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.2, axis=1), -128, 127,
                            symmetric=True, axis=1)]
    for o in objs:
        o(x)
        o(x * 2)
    return objs


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_state_round_trip_is_exact(tmp_path, rng, suffix):
    for k, obj in enumerate(make_objects(rng)):
        path = tmp_path / f"s{k}{suffix}"
        qc.save_state(obj, path)
        back = qc.load_state(path)
        assert type(back) is type(obj)
        a = obj.observer if isinstance(obj, qc.FakeQuantize) else obj
        b = back.observer if isinstance(back, qc.FakeQuantize) else back
        assert ref.bits_equal(a.min_val, b.min_val) and ref.bits_equal(a.max_val, b.max_val)
        assert a.axis == b.axis and a.num_batches == b.num_batches
        if isinstance(obj, qc.FakeQuantize):
            assert ref.bits_equal(obj.scale, back.scale)
            assert np.array_equal(obj.zero_point, back.zero_point)
            x = rng.normal(size=(3, 5)).astype(F32)
            assert ref.bits_equal(obj(x), back(x))


def test_bad_state_files(tmp_path, rng):
    obj = make_objects(rng)[1]
    good = tmp_path / "good.npz"
    qc.save_state(obj, good)
    data = good.read_bytes()
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a valid quantcore state file"):
        qc.load_state(trunc)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, a=np.zeros(3))
    with pytest.raises(ValueError, match="__format__"):
        qc.load_state(foreign)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, __format__=np.array("quantcore-state-1"), __class__=np.array("MinMaxObserver"),
             min_val=np.array([object()], dtype=object), max_val=np.zeros(1))
    with pytest.raises(ValueError, match="not a valid"):
        qc.load_state(pickled)
    evil = tmp_path / "evil.json"
    evil.write_text('{"__format__": "quantcore-state-1", "__class__": "os.system"}')
    with pytest.raises(ValueError, match="unknown class"):
        qc.load_state(evil)
    tampered = tmp_path / "tampered.json"
    qc.save_state(obj, tampered)
    tampered.write_text(tampered.read_text().replace('"min_val"', '"min_vals"'))
    with pytest.raises(ValueError, match="missing keys"):
        qc.load_state(tampered)
    with pytest.raises(TypeError, match="cannot save"):
        qc.save_state(object(), tmp_path / "x.npz")


class _SlowMovingAverage(qc.MovingAverageMinMaxObserver):
    """Same rule; a subclass, so FakeQuantize takes its general path."""


class _SlowMinMax(qc.MinMaxObserver):
    pass


@pytest.mark.parametrize("symmetric,qrange", [(False, (0, 255)), (True, (-128, 127)),
                                              (True, (0, 255)), (False, (-8, 7))])
@pytest.mark.parametrize("kind", ["ma", "minmax"])
def test_fused_fast_path_equals_general_path(symmetric, qrange, kind, rng):
    fast_obs = qc.MovingAverageMinMaxObserver(0.1) if kind == "ma" else qc.MinMaxObserver()
    slow_obs = _SlowMovingAverage(0.1) if kind == "ma" else _SlowMinMax()
    fast = qc.FakeQuantize(fast_obs, *qrange, symmetric=symmetric, quant_delay=2)
    slow = qc.FakeQuantize(slow_obs, *qrange, symmetric=symmetric, quant_delay=2)
    for step in range(30):
        shape = (200, 700) if step % 7 == 3 else (5, 9)
        x = (rng.normal(size=shape) * (1 + step)).astype(F32)
        if step == 5:
            x[1, 1] = np.nan
        if step == 9:
            x = np.asfortranarray(x)
        if step == 12:
            fast.disable_observer(), slow.disable_observer()
        if step == 15:
            fast.enable_observer(), slow.enable_observer()
            fast.disable_fake_quant(), slow.disable_fake_quant()
        if step == 17:
            fast.enable_fake_quant(), slow.enable_fake_quant()
        if step == 20:
            fast.eval(), slow.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yf, ys = fast(x), slow(x)
        assert ref.bits_equal(yf, ys), step
        assert ref.bits_equal(fast.scale, slow.scale) and np.array_equal(fast.zero_point,
                                                                          slow.zero_point)
        assert ref.bits_equal(fast_obs.min_val, slow_obs.min_val)
        assert fast_obs.num_batches == slow_obs.num_batches
        assert fast_obs.nan_batches == slow_obs.nan_batches
        g = np.ones_like(x)
        assert ref.bits_equal(fast.backward(g), slow.backward(g)), step
