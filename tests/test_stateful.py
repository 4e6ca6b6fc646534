"""qparams schemes, observers, FakeQuantize and state files (issue 3)."""
import re
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
    # a -0.0 average: include_zero's min(m, 0) / max(m, 0) are numpy's
    # np.minimum / np.maximum, which give the second argument, +0.0
    zeros = qc.EMAMinMaxObserver(decay=0.0, min_init=-1.0, max_init=-1.0)
    zeros(f32([-0.0, -0.0]))  # m * 0 + b * 1 = -0.0 + -0.0 on both sides
    assert not np.signbit(np.minimum(F32(-0.0), F32(0))) and not np.signbit(zeros.min_val)
    assert not np.signbit(zeros.max_val)
    raw = qc.EMAMinMaxObserver(decay=0.0, min_init=-1.0, max_init=-1.0, include_zero=False)
    raw(f32([-0.0, -0.0]))
    assert np.signbit(raw.min_val) and np.signbit(raw.max_val)


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
    with pytest.warns(RuntimeWarning, match="NaN or inf was skipped"):
        obs(f32([np.nan, 100]))
    assert obs.nonfinite_batches == 1 and float(obs.max_val) == 2.0
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
    np.savez(pickled, __format__=np.array("quantcore-state-1"),
             __class__=np.array("MinMaxObserver"),
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
        assert fast_obs.nonfinite_batches == slow_obs.nonfinite_batches
        g = np.ones_like(x)
        assert ref.bits_equal(fast.backward(g), slow.backward(g)), step


# =========================================================================
# Audit additions: every qparams scheme and update rule against a float64
# reference written here (one float32 rounding per operation, emulated with
# r32), on hypothesis inputs, plus the spec vectors not covered above.
# =========================================================================
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

INT32_MIN = -2 ** 31
QRANGES = [(0, 255), (-128, 127), (-127, 127), (0, 127), (-64, 63), (0, 15), (-8, 7),
           (0, 65535), (-32768, 32767), (-2 ** 31, 2 ** 31 - 1), (0, 10), (-3, 1)]


def r32(v):
    """One float32 rounding of a float64 value (exact op results in double
    round correctly: 53 >= 2 * 24 + 2)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v, np.float64).astype(F32).astype(np.float64)


def x86_int32(v):
    """cvttss2si: truncation; NaN, inf and out-of-range give INT32_MIN."""
    v = np.asarray(v, np.float64)
    ok = np.isfinite(v) & (v > -2.0 ** 31 - 1) & (v < 2.0 ** 31)
    return np.where(ok, np.trunc(np.where(ok, v, 0)), INT32_MIN).astype(np.int64)


def wrap32(v):
    return (np.asarray(v, np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31


def ref_affine_qparams(mn, mx, qmin, qmax, eps):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mn, mx = r32(mn), r32(mx)
        min_neg = np.where(np.isnan(mn), mn, np.minimum(mn, 0.0))
        max_pos = np.where(np.isnan(mx), mx, np.maximum(mx, 0.0))
        scale = r32(r32(max_pos - min_neg) / r32(qmax - qmin))
        scale = np.where(np.isnan(scale), scale, np.maximum(scale, r32(eps)))
        q = x86_int32(np.rint(r32(min_neg / scale)))
        zp = np.clip(wrap32(qmin - q), qmin, qmax)
    return scale, zp


def ref_symmetric_scale(mn, mx, qmin, qmax, eps):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mn, mx = r32(mn), r32(mx)
        min_neg = np.where(np.isnan(mn), mn, np.minimum(mn, 0.0))
        max_pos = np.where(np.isnan(mx), mx, np.maximum(mx, 0.0))
        amax = np.where(np.isnan(min_neg) | np.isnan(max_pos), np.nan,
                        np.maximum(-min_neg, max_pos))
        scale = r32(amax / r32((qmax - qmin) / 2))
        return np.where(np.isnan(scale), scale, np.maximum(scale, r32(eps)))


def round_half_away(v):
    a = np.abs(v)
    r = np.floor(a)
    return np.copysign(r + (a - r >= 0.5), v)


stat_values = st.one_of(st.floats(-1e4, 1e4, width=32),
                        st.floats(-2.0 ** -10, 2.0 ** -10, width=32),
                        st.sampled_from([0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38, 0.5, -0.5]))
stat_values_nf = st.one_of(stat_values, st.sampled_from([np.nan, np.inf, -np.inf]))


@st.composite
def min_max_pairs(draw, nonfinite=True, ordered=True):
    n = draw(st.integers(1, 12))
    el = stat_values_nf if nonfinite else stat_values
    a = np.array(draw(st.lists(el, min_size=n, max_size=n)), np.float32)
    b = np.array(draw(st.lists(el, min_size=n, max_size=n)), np.float32)
    if ordered:
        with np.errstate(invalid="ignore"):
            a, b = np.where(a <= b, a, b), np.where(a <= b, b, a)
    return a, b


@settings(max_examples=600)
@given(min_max_pairs(), st.sampled_from(QRANGES),
       st.sampled_from([2 ** -23, 2 ** -12, 1e-6, 0.0]))
def test_affine_qparams_against_reference(pairs, qrange, eps):
    mn, mx = pairs
    s, z = Q.affine_qparams(mn, mx, *qrange, eps=eps)
    es, ez = ref_affine_qparams(mn, mx, *qrange, eps)
    assert s.dtype == F32 and z.dtype == np.int64 and s.shape == mn.shape
    assert ref.bits_equal(s, es.astype(F32)) and np.array_equal(z, ez)


@settings(max_examples=600)
@given(min_max_pairs(), st.sampled_from(QRANGES), st.sampled_from([2 ** -23, 2 ** -12, 0.0]))
def test_symmetric_qparams_against_reference(pairs, qrange, eps):
    mn, mx = pairs
    s, z = Q.symmetric_qparams(mn, mx, *qrange, eps=eps)
    assert ref.bits_equal(s, ref_symmetric_scale(mn, mx, *qrange, eps).astype(F32))
    assert (z == Q.symmetric_zero_point(*qrange)).all() and z.dtype == np.int64
    assert (Q.symmetric_qparams(mn, mx, *qrange, eps=eps, zero_point=7)[1] == 7).all()


@settings(max_examples=400)
@given(min_max_pairs(nonfinite=False), st.sampled_from([(0, 255), (0, 15), (-128, 127)]))
def test_float_qparams_against_reference(pairs, qrange):
    mn, mx = pairs
    s, z = Q.float_qparams(mn, mx, *qrange)
    with np.errstate(all="ignore"):
        es = r32(r32(r32(mx) - r32(mn)) / r32(qrange[1] - qrange[0]))
        es = np.where(es > r32(2 ** -23), es, 1.0)
        ez = r32(-r32(mn) / es)
    assert ref.bits_equal(s, es.astype(F32)) and ref.bits_equal(z, ez.astype(F32))


@settings(max_examples=600)
@given(min_max_pairs(nonfinite=False, ordered=False), st.integers(2, 8),
       st.sampled_from(["symmetric", "affine"]), st.sampled_from(["half_even", "half_away"]))
def test_oneflow_qparams_against_reference(pairs, bits, scheme, zp_rounding):
    lo, hi = pairs            # OneFlow clamps nothing: any lo, hi
    s, z = Q.oneflow_qparams(lo, hi, bits, scheme, zp_rounding=zp_rounding)
    with np.errstate(all="ignore"):
        if scheme == "symmetric":
            es = r32(np.maximum(np.abs(r32(hi)), np.abs(r32(lo))) / r32(2 ** (bits - 1) - 1))
            ez = np.zeros_like(es)
        else:
            es = r32(r32(r32(hi) - r32(lo)) / r32(2 ** bits - 1))
            ratio = r32(r32(lo) / es)
            ez = -(np.rint(ratio) if zp_rounding == "half_even" else round_half_away(ratio))
    assert ref.bits_equal(s, es.astype(F32)) and ref.bits_equal(z, ez.astype(F32))
    c, cz = Q.oneflow_qparams(lo, hi, bits, formula="cambricon")
    with np.errstate(all="ignore"):
        ec = np.floor(np.log2(np.maximum(np.abs(r32(hi)), np.abs(r32(lo))))) - (bits - 2)
    assert ref.bits_equal(c, ec.astype(F32)) and not cz.any()


def ref_nudge(mn, mx, qmin, qmax, rule):
    with np.errstate(all="ignore"):
        mn, mx = r32(mn), r32(mx)
        d = r32(qmax - qmin)
        scale = r32(r32(mx - mn) / d)
        inv = r32(d / r32(mx - mn))
        zpm = r32(qmin - r32(mn / scale))
        if rule == "tensorflow":
            nzp = np.where(zpm < qmin, qmin, np.where(zpm > qmax, qmax, round_half_away(zpm)))
        else:
            nzp = np.floor(r32(np.clip(zpm, qmin, qmax) + 0.5))
        nmin = r32((qmin - nzp) * scale)
        nmax = r32((qmax - nzp) * scale)
        qz = np.floor(r32(r32(-nmin * inv) + 0.5))
    return nmin, nmax, scale, inv, qz


@settings(max_examples=600)
@given(st.lists(st.floats(-50, 50, width=32), min_size=2, max_size=16),
       st.integers(2, 16), st.booleans(), st.sampled_from(["tensorflow", "mindspore"]))
def test_nudge_against_reference(vals, bits, narrow, rule):
    v = np.array(vals, F32)
    mn, mx = v[: len(v) // 2], v[len(v) // 2: 2 * (len(v) // 2)]
    mn, mx = np.minimum(mn, mx), np.maximum(mn, mx) + F32(2 ** -6)  # min < max, as both require
    qmin, qmax = (1 if narrow else 0), 2 ** bits - 1
    exp = ref_nudge(mn, mx, qmin, qmax, rule)
    if rule == "tensorflow":
        got = Q.nudge_tensorflow(mn, mx, qmin, qmax)
    else:
        got, exp = Q.nudge_mindspore(mn, mx, qmin, qmax), exp[:3]
    for g, e in zip(got, exp):
        assert ref.bits_equal(g, e.astype(F32))


@settings(max_examples=400)
@given(st.lists(st.floats(0, 1e4, width=32), min_size=1, max_size=8), st.integers(2, 16),
       st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_amax_multiplier_against_reference(amax, bits, unsigned, dtype):
    a = np.array(amax + [0.0, 2.0 ** -24, 2.0 ** -23], dtype)
    mult, div = Q.amax_multiplier(a, bits, unsigned)
    mb = 2.0 ** (bits - 1 + int(unsigned)) - 1
    with np.errstate(divide="ignore", over="ignore"):
        m = (dtype(mb) / a).astype(dtype)
    tiny = a <= 2.0 ** -24
    assert ref.bits_equal(mult, np.where(tiny, dtype(0), m).astype(dtype))
    assert ref.bits_equal(div, np.where(tiny, dtype(1), m).astype(dtype))
    assert Q.amax_bounds(bits, unsigned, True) == ((0.0 if unsigned else -mb), mb)
    assert Q.amax_bounds(bits, unsigned, False) == ((0.0 if unsigned else -mb - 1), mb)


@settings(max_examples=300)
@given(min_max_pairs(nonfinite=False), st.integers(2, 12))
def test_pq_affine_qparams_against_reference(pairs, bits):
    mn, mx = pairs
    step, qz = Q.pq_affine_qparams(mn, mx, bits)
    with np.errstate(all="ignore"):
        es = r32(r32(r32(mx) - r32(mn)) / r32(2.0 ** bits - 1))
        eq = r32(np.rint(r32(r32(mn) / es)) + 2.0 ** (bits - 1))
    assert ref.bits_equal(step, es.astype(F32)) and ref.bits_equal(qz, eq.astype(F32))


def test_pow2_and_cambricon_vectors():
    # Horizon BERNOULLI: max(2, 2) / 127.5 -> 2**-6 ... -> 1/32 (spec: pow2 with +-2)
    s, _ = Q.symmetric_qparams(-2.0, 2.0, -128, 127)
    assert Q.horizon_pow2_scale(s)[0] == F32(0.03125)
    assert Q.horizon_pow2_scale([1.0, 1e-9])[0] == F32(0.5)          # clamp to [1, 14]
    assert Q.horizon_pow2_scale([1.0, 1e-9])[1] == F32(2.0 ** -14)
    w = f32([[0.3, -0.7, 1.5, 2.0], [-0.1, 0.05, 0.2, -0.4]])
    shift, _ = Q.oneflow_qparams(w.min(), w.max(), 4, formula="cambricon")
    assert shift[0] == -1 and Q.cambricon_step(shift)[0] == F32(0.5)
    assert Q.cambricon_step([np.nan, 3.9, -2.5, 1e10]).tolist() == [0.0, 8.0, 0.25, 0.0]
    assert Q.oneflow_qparams(0.0, 0.0, 8, formula="cambricon")[0][0] == -np.inf


def test_more_torch_spec_vectors():
    # symmetric zero points: uint16 32768, quint8 custom (0, 15) -> 7
    s, z = Q.symmetric_qparams(X3.min(), X3.max(), 0, 65535,
                               zero_point=Q.torch_symmetric_zero_point("uint16", 0, 65535, False))
    assert s[0] == F32("6.103609e-05") and z[0] == 32768
    qmin, qmax, custom = Q.torch_quant_range("quint8", False, 0, 15)
    s, z = Q.symmetric_qparams(X3.min(), X3.max(), qmin, qmax,
                               zero_point=Q.torch_symmetric_zero_point("quint8", qmin, qmax,
                                                                       custom))
    assert s[0] == F32("0.26666668") and z[0] == 7
    # uint8 + symmetric + reduce_range: range (0, 127) but zp 128 (torch quirk)
    qmin, qmax, custom = Q.torch_quant_range("uint8", True)
    assert (qmin, qmax) == (0, 127)
    assert Q.torch_symmetric_zero_point("uint8", qmin, qmax, custom) == 128
    # PerChannel sym qint8, ch_axis=1
    x = f32([[[-1, 2], [.5, .25]], [[3, -4], [0, 0]]])
    obs = qc.MinMaxObserver(axis=1)
    obs(x)
    s, z = Q.symmetric_qparams(obs.min_val, obs.max_val, -128, 127)
    assert ref.bits_equal(s, f32(["0.03137255", "0.003921569"])) and z.tolist() == [0, 0]


def test_horizon_spec_vectors():
    obs = qc.MovingAverageMinMaxObserver(averaging_constant=0.01)
    obs(f32([-1, 0.5, 2]))
    assert Q.symmetric_qparams(obs.min_val, obs.max_val, -32768, 32767)[0][0] == \
        F32("6.1036088e-05")
    assert Q.symmetric_qparams(0.0, 0.0, -128, 127)[0][0] == F32(2 ** -23)   # all zeros: eps


def test_mindspore_nudge_spec_vectors():
    nmin, nmax, _ = Q.nudge_mindspore(-2, 2, 0, 255)
    assert (nmin[0], nmax[0]) == (F32("-1.992157"), F32("2.0078433"))
    nmin, nmax, s = Q.nudge_mindspore(-6, 6, 0, 255)
    assert (nmin[0], nmax[0]) == (F32("-6.0235295"), F32("5.9764705"))
    doc = f32([[1, 2, 1], [-2, 0, -1]])
    y = qc.fake_quant_nudged(doc, nmin, nmax, s, formula="mindspore", scale_op="div")
    assert ref.bits_equal(y, f32([[0.9882355, 1.9764705, 0.9882355],
                                  [-1.9764705, 0, -0.9882355]]))
    lo, hi = Q.symmetric_range(-1, 3)
    nmin, nmax, s = Q.nudge_mindspore(lo, hi, 1, 255)      # symmetric + narrow: exactly [-3, 3]
    assert (nmin[0], nmax[0]) == (F32(-3), F32(3))
    # TF: min > 0 gives [0, max - min] (vars(x, 1, 5, num_bits=2))
    nmin, nmax, s, inv, qz = Q.nudge_tensorflow(1, 5, 0, 3)
    y = qc.fake_quant_nudged(f32([0, 1, 3, 5, 7]), nmin, nmax, s, inv_scale=inv, quant_zero=qz,
                             scale_op="div")
    assert ref.bits_equal(y, f32([0, "1.3333334", "2.6666667", 4, 4]))


def test_fused_choose_qparams_spec_vectors():
    def run(lo, hi, qmin, qmax, sym):
        s, z = Q.choose_qparams_fused(lo, hi, qmin, qmax, sym)
        return s[0], int(z[0])
    assert run(-1, 2, -128, 127, True) == (F32(2 / 127), 0)
    assert run(-1, 2, -127, 127, True)[0] == F32("0.015810031")
    assert run(.5, 2, -128, 127, True) == (F32("0.007843138"), -128)
    assert run(-2, -.5, -128, 127, True)[1] == 127
    assert run(0, 0, -128, 127, True) == (F32(0.1), 127)
    assert run(0, 1e-6, 0, 255, False)[0] == F32(6.1e-05)
    assert run(-2, 1.5, 0, 255, False) == (F32("0.01372549"), 146)
    assert run(-1, 2, 0, 255, False) == (F32("0.011764706"), 85)
    s, z = Q.choose_qparams_fused(np.nan, 1.0, 0, 255)
    assert np.isnan(s[0]) and z[0] == INT32_MIN


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("qrange,sym", [((0, 255), False), ((-128, 127), False),
                                        ((-128, 127), True), ((-127, 127), True),
                                        ((0, 15), False), ((0, 255), True), ((-8, 7), True),
                                        ((-2 ** 31, 2 ** 31 - 1), False)])
def test_fused_choose_qparams_matches_live_torch(torch, qrange, sym):
    """quant_utils::ChooseQuantizationParams through the per-row fused op:
    every row of x is one (min, max) pair, so one call checks 20000 pairs."""
    rng = np.random.default_rng(hash((qrange, sym)) % 2 ** 32)
    n = 20000
    mag = rng.choice([1e-8, 1e-5, 1e-3, 1, 100, 1e6], size=(n, 2))
    v = (rng.normal(size=(n, 2)) * mag).astype(F32)
    v[rng.random(n) < 0.05, 0] = 0
    v[rng.random(n) < 0.05, 1] = -0.0
    v[rng.random(n) < 0.03] = 0
    eq = rng.random(n) < 0.03
    v[eq, 1] = v[eq, 0]
    mn, mx = np.minimum(v[:, 0], v[:, 1]), np.maximum(v[:, 0], v[:, 1])
    x = torch.from_numpy(np.stack([mn, mx], 1))
    rmin, rmax = torch.full((n,), float("inf")), torch.full((n,), float("-inf"))
    scale, zp = torch.ones(n), torch.zeros(n, dtype=torch.int32)
    torch.fused_moving_avg_obs_fake_quant(x, torch.tensor([1]), torch.tensor([1]), rmin, rmax,
                                          scale, zp, 1.0, *qrange, 0, True, sym)
    s, z = Q.choose_qparams_fused(mn, mx, *qrange, preserve_sparsity=sym)
    assert ref.bits_equal(s, scale.numpy())
    assert np.array_equal(z, zp.numpy().astype(np.int64))


@pytest.mark.parametrize("dtype", ["quint8", "qint8", "uint8", "int8", "qint32", "int32",
                                   "uint16", "int16", "quint4x2"])
def test_torch_quant_range_matches_live_torch(torch, dtype):
    from torch.ao.quantization.utils import calculate_qmin_qmax, validate_qmin_qmax
    tdt = getattr(torch, dtype)
    customs = [(None, None), (0, 255), (-128, 127), (0, 15), (-7, 8), (0, 1000), (1, 10),
               (5, 5), (-300, 300), (-2 ** 31, 2 ** 31 - 1), (-2 ** 31, 2 ** 31), (0, None)]
    for qmin, qmax in customs:
        for rr in (False, True):
            custom = qmin is not None and qmax is not None
            try:
                if custom:
                    validate_qmin_qmax(qmin, qmax)
                exp = calculate_qmin_qmax(qmin, qmax, custom, tdt, rr)
            except AssertionError as e:
                with pytest.raises(ValueError, match=re.escape(str(e)[:30])):
                    Q.torch_quant_range(dtype, rr, qmin, qmax)
                continue
            assert Q.torch_quant_range(dtype, rr, qmin, qmax) == (*exp, custom), (qmin, qmax, rr)
    assert Q.torch_quant_range("torch." + dtype)[:2] == Q.torch_quant_range(dtype)[:2]


def test_symmetric_zero_point_matches_live_torch(torch):
    for dtype in ("quint8", "uint8", "qint8", "int8", "uint16", "int16", "qint32"):
        for kw in ({}, dict(quant_min=0, quant_max=15), dict(quant_min=-8, quant_max=7),
                   dict(reduce_range=True)):
            if dtype in ("uint16", "int16", "qint32") and kw.get("quant_max") == 15:
                continue
            try:
                obs = torch.ao.quantization.MinMaxObserver(
                    dtype=getattr(torch, dtype), qscheme=torch.per_tensor_symmetric, **kw)
            except (AssertionError, NotImplementedError):
                continue
            obs(torch.tensor([-1.0, 0.5, 2.0]))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ts, tz = obs.calculate_qparams()
            qmin, qmax, custom = Q.torch_quant_range(dtype, kw.get("reduce_range", False),
                                                     kw.get("quant_min"), kw.get("quant_max"))
            zp = Q.torch_symmetric_zero_point(dtype, qmin, qmax, custom)
            s, z = Q.symmetric_qparams(-1.0, 2.0, qmin, qmax, zero_point=zp)
            assert (obs.quant_min, obs.quant_max) == (qmin, qmax)
            assert s[0] == ts.item() and z[0] == tz.item(), (dtype, kw)


def test_torch_quant_range_errors():
    with pytest.raises(TypeError, match="quant_min must be an int, got 0.5"):
        Q.torch_quant_range("quint8", False, 0.5, 10)
    with pytest.raises(TypeError, match="dtype must be a torch dtype name"):
        Q.torch_quant_range(8)
    with pytest.raises(ValueError, match=r"must include 0\. \(got quant_min=1, quant_max=10\)"):
        Q.torch_quant_range("quint8", False, 1, 10)


@settings(max_examples=200)
@given(min_max_pairs(), st.sampled_from(QRANGES))
def test_every_scheme_is_one_code_path_per_tensor_and_per_channel(pairs, qrange):
    """Per tensor is one channel: the vector call equals the scalar calls."""
    mn, mx = pairs
    qmin, qmax = qrange
    funcs = [lambda a, b: Q.affine_qparams(a, b, qmin, qmax),
             lambda a, b: Q.symmetric_qparams(a, b, qmin, qmax),
             lambda a, b: Q.float_qparams(a, b, qmin, qmax),
             lambda a, b: Q.oneflow_qparams(a, b, 8, "affine"),
             lambda a, b: Q.oneflow_qparams(a, b, 8, "symmetric", formula="cambricon"),
             lambda a, b: Q.nudge_tensorflow(a, b, 0, 255),
             lambda a, b: Q.nudge_mindspore(a, b, 1, 255),
             lambda a, b: Q.choose_qparams_fused(a, b, qmin, qmax, True),
             lambda a, b: Q.pq_affine_qparams(a, b, 8)]
    for f in funcs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vec = f(mn, mx)
            for c in range(mn.size):
                one = f(mn[c], mx[c])
                for v, o in zip(vec, one):
                    assert o.shape == (1,) and ref.bits_equal(v[c:c + 1], o)


# ------------------------------------------------------- update rules
@st.composite
def batch_sequences(draw, channels=None, nonfinite=False):
    """A list of (min, max) batch statistics (float32, min <= max)."""
    n = draw(st.integers(1, 12))
    C = channels or 1
    el = stat_values_nf if nonfinite else stat_values
    seq = []
    for _ in range(n):
        a = np.array(draw(st.lists(el, min_size=C, max_size=C)), F32)
        b = np.array(draw(st.lists(el, min_size=C, max_size=C)), F32)
        with np.errstate(invalid="ignore"):
            seq.append((np.where(a <= b, a, b), np.where(a <= b, b, a)))
    return seq


def feed(obs, lo, hi, axis):
    """Feed a batch holding (lo, hi) per tensor / per channel (channels on
    axis 0); return its min and max as tests/reference.py computes them
    (NaN propagates, -0.0 < +0.0)."""
    batch = np.array([lo[0], hi[0]], F32) if axis is None else \
        np.stack([lo, hi], axis=1).astype(F32)
    obs(batch)
    lo, hi = ref.minmax(batch, axis=axis)
    return np.atleast_1d(lo), np.atleast_1d(hi)


@settings(max_examples=300)
@given(st.integers(1, 4).flatmap(lambda c: st.tuples(st.just(c), batch_sequences(c, True))),
       st.sampled_from([0.01, 0.5, 1.0, 0.3, 1e-4]), st.booleans())
def test_torch_moving_average_against_reference(cseq, c, per_channel):
    C, seq = cseq
    axis = 0 if per_channel else None
    if not per_channel:
        seq = [(lo[:1], hi[:1]) for lo, hi in seq]
    obs = qc.MovingAverageMinMaxObserver(c, axis=axis, nan_policy="propagate")
    cf = r32(c)
    m = None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for lo, hi in seq:
            lo, hi = feed(obs, lo, hi, axis)
            if m is None:                                   # first call: assign
                m = [r32(lo), r32(hi)]
            else:                                           # m + c * (x - m), in float32
                m = [r32(mv + r32(cf * r32(r32(x) - mv))) for mv, x in zip(m, (lo, hi))]
            assert ref.bits_equal(np.atleast_1d(obs.min_val), m[0].astype(F32))
            assert ref.bits_equal(np.atleast_1d(obs.max_val), m[1].astype(F32))


@settings(max_examples=300)
@given(st.integers(1, 4).flatmap(lambda c: st.tuples(st.just(c), batch_sequences(c))),
       st.sampled_from([0.999, 0.9, 0.5, 0.0, 1.0, 0.99]), st.booleans(), st.booleans(),
       st.floats(-10, 0, width=32), st.floats(0, 10, width=32))
def test_mindspore_ema_against_reference(cseq, decay, include_zero, per_channel, lo0, hi0):
    C, seq = cseq
    axis = 0 if per_channel else None
    if not per_channel:
        seq = [(lo[:1], hi[:1]) for lo, hi in seq]
        C = 1
    obs = qc.EMAMinMaxObserver(decay, lo0, hi0, axis=axis, include_zero=include_zero,
                               num_channels=C if per_channel else None)
    d, c = r32(decay), r32(1.0 - decay)                    # c computed in double, then f32
    m = [np.full(C, r32(lo0)), np.full(C, r32(hi0))]       # no first-call rule
    for lo, hi in seq:
        lo, hi = feed(obs, lo, hi, axis)
        m = [r32(r32(mv * d) + r32(r32(x) * c)) for mv, x in zip(m, (lo, hi))]
        if include_zero:
            m = [np.minimum(m[0], 0.0), np.maximum(m[1], 0.0)]
        assert np.array_equal(np.atleast_1d(obs.min_val), m[0].astype(F32))
        assert np.array_equal(np.atleast_1d(obs.max_val), m[1].astype(F32))


@settings(max_examples=300)
@given(batch_sequences(), st.sampled_from([0.95, 0.9, 0.5, 0.0, 0.999]), st.booleans())
def test_oneflow_momentum_against_reference(seq, momentum, symmetric):
    obs = qc.MomentumMinMaxObserver(momentum, symmetric=symmetric)
    m, om = r32(momentum), r32(1 - r32(momentum))

    def step(old, new):                  # the zero-buffer rule, every time, per side
        return new if old == 0 else r32(r32(old * m) + r32(new * om))
    state = [0.0, 0.0]
    for lo, hi in seq:
        lo, hi = feed(obs, lo, hi, None)
        lo, hi = float(lo[0]), float(hi[0])
        if symmetric:
            a = step(state[1], max(abs(hi), abs(lo)))
            state = [a, a]
        else:
            state = [step(state[0], lo), step(state[1], hi)]
        assert float(obs.min_val) == state[0] and float(obs.max_val) == state[1]


def test_moving_average_first_call_rule():
    """torch: the first batch is assigned; reset() and loading an empty
    state (+inf, -inf) bring the first-call rule back."""
    obs = qc.MovingAverageMinMaxObserver(0.5)
    obs(f32([-4, 4]))
    assert (float(obs.min_val), float(obs.max_val)) == (-4, 4)
    obs(f32([0, 2]))
    assert (float(obs.min_val), float(obs.max_val)) == (-2, 3)
    obs.reset()
    obs(f32([1, 2]))
    assert (float(obs.min_val), float(obs.max_val)) == (1, 2)
    fresh = qc.MovingAverageMinMaxObserver(0.5)
    fresh.load_state_dict({"min_val": np.float32(np.inf), "max_val": np.float32(-np.inf)})
    fresh(f32([5, 6]))
    assert (float(fresh.min_val), float(fresh.max_val)) == (5, 6)
    # the first batch of a per-channel observer is assigned per channel too
    pc = qc.MovingAverageMinMaxObserver(0.5, axis=1)
    pc(f32([[1, -1], [3, 2]]))
    assert pc.min_val.tolist() == [1, -1] and pc.max_val.tolist() == [3, 2]
    # an inf statistic makes the next update NaN (torch: inf + c*(x - inf))
    inf = qc.MovingAverageMinMaxObserver(0.5, nan_policy="propagate")
    inf(f32([-np.inf, 1]))
    inf(f32([0, 1]))
    assert np.isnan(inf.min_val) and float(inf.max_val) == 1


# -------------------------------------------------------------- merging
@st.composite
def chunked_data(draw):
    """An array, an observer axis, and 8 chunks along another axis (some
    maybe empty), with zeros of both signs, +-inf and NaN."""
    per_channel = draw(st.booleans())
    ndim = draw(st.integers(2 if per_channel else 1, 3))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    axis = draw(st.integers(0, ndim - 1)) if per_channel else None
    split = draw(st.sampled_from([d for d in range(ndim) if d != axis]))
    shape[split] = draw(st.integers(8, 40))
    el = st.one_of(st.floats(-100, 100, width=32),
                   st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan]))
    x = draw(arrays(F32, tuple(shape), elements=el))
    cuts = sorted(draw(st.lists(st.integers(0, shape[split]), min_size=7, max_size=7)))
    order = draw(st.permutations(range(8)))
    return x, axis, split, cuts, order


@settings(max_examples=400)
@given(chunked_data(), st.sampled_from(["propagate", "skip_finite"]))
def test_minmax_merge_of_8_random_chunks_is_exact(case, policy):
    x, axis, split, cuts, order = case
    if policy == "skip_finite":  # skip drops whole non-finite batches: compare finite data
        x = np.where(np.isfinite(x), x, F32(1.5))
    nan_policy = "propagate" if policy == "propagate" else "skip"
    chunks = np.split(x, cuts, axis=split)
    whole = qc.MinMaxObserver(axis=axis, nan_policy=nan_policy)
    whole(x)
    parts = []
    for chunk in chunks:
        o = qc.MinMaxObserver(axis=axis, nan_policy=nan_policy)
        o(chunk)
        parts.append(o)
    merged = qc.MinMaxObserver(axis=axis, nan_policy=nan_policy)
    for k in order:
        merged.merge(parts[k])
    streamed = qc.MinMaxObserver(axis=axis, nan_policy=nan_policy)
    for k in order:
        streamed(chunks[k])
    for other in (merged, streamed):
        assert ref.bits_equal(other.min_val, whole.min_val)
        assert ref.bits_equal(other.max_val, whole.max_val)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for sym in (False, True):
                a = whole.calculate_qparams(-128, 127, symmetric=sym)
                b = other.calculate_qparams(-128, 127, symmetric=sym)
                assert ref.bits_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert merged.num_batches == sum(c.size > 0 for c in chunks)


def test_signed_zero_order_in_running_min_max():
    for batches in ([[-0.0, 1], [0.0, 2]], [[0.0, 1], [-0.0, 2]]):
        obs = qc.MinMaxObserver()
        for b in batches:
            obs(f32(b))
        assert float(obs.min_val) == 0 and np.signbit(obs.min_val)       # -0.0 < +0.0
    for batches in ([[0.0, -1], [-0.0, -2]], [[-0.0, -1], [0.0, -2]]):
        obs = qc.MinMaxObserver()
        for b in batches:
            obs(f32(b))
        assert float(obs.max_val) == 0 and not np.signbit(obs.max_val)


def test_fused_fast_path_orders_signed_zeros():
    for batches in ([[0.0, 1.0], [-0.0, 2.0]], [[-1.0, -0.0], [-2.0, 0.0]]):
        fq = qc.FakeQuantize(qc.MinMaxObserver())        # per tensor float32: fused kernel
        general = qc.MinMaxObserver()
        for b in batches:
            fq(f32(b))
            general(f32(b))
            assert ref.bits_equal(fq.observer.min_val, general.min_val), batches
            assert ref.bits_equal(fq.observer.max_val, general.max_val), batches


@pytest.mark.parametrize("obs", [qc.MovingAverageMinMaxObserver(), qc.EMAMinMaxObserver(),
                                 qc.MomentumMinMaxObserver()], ids=lambda o: type(o).__name__)
def test_every_moving_average_refuses_merge(obs):
    other = type(obs)()
    obs(f32([1, 2]))
    other(f32([3, 4]))
    before = (obs.min_val.copy(), obs.max_val.copy())
    with pytest.raises(ValueError, match=rf"{type(obs).__name__} cannot be merged: .*order"):
        obs.merge(other)
    assert ref.bits_equal(obs.min_val, before[0]) and ref.bits_equal(obs.max_val, before[1])


def test_merge_errors_and_empty():
    a, b = qc.MinMaxObserver(axis=0), qc.MinMaxObserver(axis=0)
    a(np.zeros((3, 2), F32))
    b(np.zeros((4, 2), F32))
    with pytest.raises(ValueError, match=r"channel counts differ \(\(3,\) vs \(4,\)\)"):
        a.merge(b)
    empty = qc.MinMaxObserver(axis=0)
    assert a.merge(empty) is a and a.num_batches == 1
    assert empty.merge(a) is empty and ref.bits_equal(empty.min_val, a.min_val)
    with pytest.raises(ValueError, match="got MovingAverageMinMaxObserver"):
        qc.MinMaxObserver().merge(qc.MovingAverageMinMaxObserver())


# ------------------------------------------------- state_dict and reset
def _observers():
    return [qc.MinMaxObserver(), qc.MinMaxObserver(axis=-1, nan_policy="propagate"),
            qc.MovingAverageMinMaxObserver(0.25), qc.MovingAverageMinMaxObserver(0.5, axis=0),
            qc.EMAMinMaxObserver(0.9, -1.0, 2.0), qc.EMAMinMaxObserver(0.99, axis=1,
                                                                         num_channels=3),
            qc.MomentumMinMaxObserver(0.9), qc.MomentumMinMaxObserver(0.8, symmetric=True)]


@pytest.mark.parametrize("k", range(8))
def test_state_dict_round_trip_continues_identically(k, rng):
    obs, twin = _observers()[k], _observers()[k]
    xs = [rng.normal(size=(4, 3)).astype(F32) * (1 + i) for i in range(6)]
    xs[1][0, 0] = -0.0
    xs[2][1, 1] = np.inf
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in xs[:3]:
            obs(x)
    skipped = [w for w in caught if "a batch containing NaN or inf was skipped" in str(w.message)]
    assert len(skipped) == (obs.nan_policy == "skip") and len(caught) == len(skipped)
    state = obs.state_dict()
    assert all(isinstance(v, (np.ndarray, int, float, bool, str)) for v in state.values())
    twin.load_state_dict(state)
    for x in xs[3:]:
        obs(x)
        twin(x)
        assert ref.bits_equal(obs.min_val, twin.min_val)
        assert ref.bits_equal(obs.max_val, twin.max_val)
        for o in (obs, twin):           # float32 ndarrays, never numpy scalars
            assert type(o.min_val) is np.ndarray and o.min_val.dtype == F32
            assert type(o.max_val) is np.ndarray and o.max_val.dtype == F32
    assert obs.num_batches == twin.num_batches
    obs.reset()
    fresh = _observers()[k]
    assert ref.bits_equal(obs.min_val, fresh.min_val) and obs.num_batches == 0
    with pytest.raises(ValueError, match="missing keys"):
        twin.load_state_dict({"min_val": np.zeros(())})


# ------------------------------------------------------------ state files
def _special_objects():
    """Observers / FakeQuantize whose state holds NaN, +-inf and -0.0."""
    objs = []
    nan = qc.MinMaxObserver(nan_policy="propagate")
    nan(f32([np.nan, 1]))
    objs.append(nan)
    # nan_policy="propagate": the default ("skip") would skip these +-inf
    # batches (with a warning) and leave no +-inf in the state
    negzero = qc.MinMaxObserver(axis=0, nan_policy="propagate")
    negzero(f32([[-0.0, 0.0], [1, -np.inf], [np.inf, 2]]))
    objs.append(negzero)
    ma = qc.MovingAverageMinMaxObserver(0.1, nan_policy="propagate")
    ma(f32([-np.inf, 3]))
    ma(f32([1, 2]))                                              # min becomes NaN
    objs.append(ma)
    ema = qc.EMAMinMaxObserver(0.5, -1e-45, 1e38, include_zero=False)
    ema(f32([-0.0, 3e38]))
    objs.append(ema)
    mom = qc.MomentumMinMaxObserver(0.95)
    mom(f32([-0.0, 0.0]))
    objs.append(mom)
    fq = qc.FakeQuantize(qc.MinMaxObserver(axis=1, nan_policy="propagate"), -8, 7,
                         symmetric=True, axis=1, quant_delay=3, packed_mask=True,
                         rounding="half_up", eps=2.0 ** -12)
    fq(f32([[1, -0.0, 3], [-2, 5, np.inf]]))
    fq.disable_observer()
    fq.eval()
    objs.append(fq)
    fresh = qc.FakeQuantize()                                    # nothing observed yet
    objs.append(fresh)
    return objs


@pytest.mark.parametrize("suffix", [".npz", ".json"])
@pytest.mark.parametrize("k", range(7))
def test_state_files_round_trip_special_values_exactly(tmp_path, suffix, k, rng):
    obj = _special_objects()[k]
    path = tmp_path / f"state{suffix}"
    qc.save_state(obj, path)
    back = qc.load_state(path)
    assert type(back) is type(obj)

    def flat(o):
        d = o.state_dict()
        out = {}
        for key, v in d.items():
            if isinstance(v, dict):
                out.update({f"{key}/{k2}": v2 for k2, v2 in v.items()})
            else:
                out[key] = v
        return out
    a, b = flat(obj), flat(back)
    assert sorted(a) == sorted(b)
    for key in a:
        va, vb = a[key], b[key]
        if isinstance(va, (np.ndarray, np.generic)) and np.asarray(va).dtype.kind == "f":
            assert np.asarray(va).dtype == np.asarray(vb).dtype, key
            assert ref.bits_equal(np.asarray(va), np.asarray(vb)), key
        else:
            assert np.array_equal(va, vb) and type(va) is type(vb), (key, va, vb)
    # both continue identically
    for _ in range(3):
        x = rng.normal(size=(3, 3)).astype(F32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ya, yb = obj(x), back(x)
        assert ref.bits_equal(np.asarray(ya), np.asarray(yb))
    oa = obj.observer if isinstance(obj, qc.FakeQuantize) else obj
    ob = back.observer if isinstance(back, qc.FakeQuantize) else back
    assert ref.bits_equal(oa.min_val, ob.min_val) and ref.bits_equal(oa.max_val, ob.max_val)


def test_state_file_mismatch_errors(tmp_path):
    per_tensor = qc.MinMaxObserver()
    per_tensor(f32([1, 2]))
    path = tmp_path / "s.json"
    qc.save_state(per_tensor, path)
    doc = path.read_text()
    (tmp_path / "shape.json").write_text(doc.replace('"per_channel": false',
                                                     '"per_channel": true'))
    with pytest.raises(ValueError, match="needs 1"):
        qc.load_state(tmp_path / "shape.json")
    (tmp_path / "dtype.json").write_text(doc.replace('"<f4"', '"<U1"', 1))
    with pytest.raises(ValueError, match="not a valid quantcore state file"):
        qc.load_state(tmp_path / "dtype.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a valid quantcore state file"):
        qc.load_state(tmp_path / "list.json")
    with pytest.raises(FileNotFoundError):
        qc.load_state(tmp_path / "missing.npz")


# ------------------------------------------------- training loops
def reference_loop(batches, grads, *, qmin, qmax, rule, c=None, symmetric=False, axis=None,
                   rounding="half_even", delay=0, eps=2.0 ** -23, switches=None):
    """FakeQuantize written out in float64-emulated float32: observer rule,
    qparams (torch forms), fake quant and STE via tests/reference.py."""
    switches = switches or {}
    state = None
    scale = np.ones(1)
    zp = np.zeros(1)
    observe, quant = True, True
    outs = []
    for step, (x, g) in enumerate(zip(batches, grads)):
        observe, quant = switches.get(step, (observe, quant))
        if observe:
            lo, hi = ref.minmax(x, axis=axis)
            lo, hi = np.atleast_1d(lo).astype(np.float64), np.atleast_1d(hi).astype(np.float64)
            if state is None:
                state = [lo, hi]
            elif rule == "minmax":
                state = [np.minimum(state[0], lo), np.maximum(state[1], hi)]
            else:
                state = [r32(m + r32(r32(c) * r32(v - m))) for m, v in zip(state, (lo, hi))]
            if symmetric:
                scale = ref_symmetric_scale(*state, qmin, qmax, eps)
                zp = np.full(scale.shape, 0 if qmin < 0 else (qmin + qmax + 1) // 2, float)
            else:
                scale, zp = ref_affine_qparams(*state, qmin, qmax, eps)
        if not quant or step < delay:
            outs.append((x, g, scale, zp))
            continue
        shape = [1] * x.ndim
        if axis is not None:
            shape[axis] = -1
        y, mask = ref.affine(x.astype(np.float64), scale.reshape(shape), zp.reshape(shape),
                             qmin, qmax, rounding=rounding)
        outs.append((y.astype(F32), (g * mask).astype(F32), scale, zp))
    return outs


LOOPS = {
    "ma_affine_per_tensor": dict(obs=lambda: qc.MovingAverageMinMaxObserver(0.01), qmin=0,
                                 qmax=255, rule="ma", c=0.01),
    "ma_symmetric_delay_switches": dict(obs=lambda: qc.MovingAverageMinMaxObserver(0.1),
                                        qmin=-128, qmax=127, rule="ma", c=0.1, symmetric=True,
                                        delay=5, rounding="half_up",
                                        switches={30: (False, True), 50: (True, False),
                                                  60: (True, True)}),
    "minmax_per_channel_symmetric": dict(obs=lambda: qc.MinMaxObserver(axis=1), qmin=-8,
                                         qmax=7, rule="minmax", symmetric=True, axis=1),
    "ma_per_channel_affine_uint4": dict(obs=lambda: qc.MovingAverageMinMaxObserver(0.2, axis=0),
                                        qmin=0, qmax=15, rule="ma", c=0.2, axis=0,
                                        rounding="half_away"),
}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_fake_quantize_100_step_loops_match_reference(name, rng):
    cfg = dict(LOOPS[name])
    obs = cfg.pop("obs")()
    fq = qc.FakeQuantize(obs, cfg["qmin"], cfg["qmax"], symmetric=cfg.get("symmetric", False),
                         axis=cfg.get("axis"), rounding=cfg.get("rounding", "half_even"),
                         quant_delay=cfg.get("delay", 0), packed_mask=(name[0] == "m"))
    batches = [(rng.normal(size=(6, 5, 4)) * (1 + k / 40) + np.sin(k / 7)).astype(F32)
               for k in range(100)]
    for k in (13, 57):
        batches[k][0, 0, 0] = -0.0
    batches[77][1, 1, 1] = 40.0                                    # an outlier
    grads = [rng.normal(size=(6, 5, 4)).astype(F32) for _ in range(100)]
    expected = reference_loop(batches, grads, **{k: v for k, v in cfg.items()})
    switches = cfg.get("switches", {})
    for step, (x, g, (y_exp, gx_exp, s_exp, z_exp)) in enumerate(zip(batches, grads, expected)):
        if step in switches:
            fq.enable_observer(switches[step][0])
            fq.enable_fake_quant(switches[step][1])
        y = fq(x.copy() if step % 2 else x, out=None if step % 3 else np.empty_like(x))
        assert ref.bits_equal(np.atleast_1d(fq.scale), s_exp.astype(F32)), step
        assert np.array_equal(np.atleast_1d(fq.zero_point), z_exp.astype(np.int64)), step
        assert ref.bits_equal(y, y_exp), step
        assert ref.bits_equal(fq.backward(g), gx_exp), step
