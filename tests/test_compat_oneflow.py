"""quantcore.compat.oneflow: MinMaxObserver, MovingAverageMinMaxObserver,
FakeQuantization, Quantization (issue 5).

Oracles: the spec's vectors (the project's MindSpore / TensorFlow / OneFlow specification §3) and an
independent NumPy float32 model of OneFlow's kernels written below.
"""
import doctest
import warnings

import numpy as np
import pytest

import quantcore.compat.oneflow as ofq
from quantcore.compat.oneflow import (FakeQuantization, MinMaxObserver,
                                      MovingAverageMinMaxObserver, Quantization)

import reference as ref

F32 = np.float32
DOC_X = np.array([[1, 2, 1], [-2, 0, -1]], dtype=F32)
W = np.array([[0.3, -0.7, 1.5, 2.0], [-0.1, 0.05, 0.2, -0.4]], dtype=F32)


f32 = ref.spec_f32


bits = ref.assert_spec_bits


# --------------------------------------------------- independent reference
round_half_away = ref.round_half_away_f  # (float32 in, float32 out)


def ref_qparams(lo, hi, b, scheme, formula, zp_round="even"):
    lo, hi = np.asarray(lo, F32), np.asarray(hi, F32)
    with np.errstate(all="ignore"):
        amax = np.maximum(np.abs(hi), np.abs(lo))
        if formula == "cambricon":
            shift = (np.floor(np.log2(amax.astype(np.float64))) - (b - 2)).astype(F32)
            return shift, np.zeros_like(shift)
        if scheme == "symmetric":
            scale = amax / F32(2 ** (b - 1) - 1)
            return scale, np.zeros_like(scale)
        scale = (hi - lo) / F32(2 ** b - 1)
        r = lo / scale
        r = np.rint(r) if zp_round == "even" else round_half_away(r)
        return scale, (-r).astype(F32)


def clamp(v, lo, hi):
    t = np.where(v < lo, F32(lo), v)
    return np.where(t > hi, F32(hi), t).astype(F32)


def ref_fake_quant(x, scale, zp, b, scheme, formula, output_q=False):
    """OneFlow's fake_quantization / quantization kernels, float32; scale and
    zp broadcast against x (per channel: shape [C, 1, ...])."""
    with np.errstate(all="ignore"):
        if formula == "cambricon":
            s = F32(2.0 ** int(np.asarray(scale).reshape(-1)[0]))
            q = clamp(np.rint(x / s), -2 ** (b - 1), 2 ** (b - 1) - 1)
            return q if output_q else (q * s).astype(F32)
        if scheme == "symmetric":
            q = clamp(np.rint(x / scale), -2 ** (b - 1), 2 ** (b - 1) - 1)
            return q if output_q else (q * scale).astype(F32)
        q = clamp(np.rint(x / scale + zp), 0, 2 ** b - 1)
        return q if output_q else ((q - zp) * scale).astype(F32)


def ref_ma_update(mmax, mmin, x, momentum, symmetric):
    m = F32(momentum)
    om = F32(1) - m
    lo, hi = F32(x.min()), F32(x.max())

    def side(old, new):
        return new if old == 0 else F32(old * m + new * om)
    if symmetric:
        mmax = side(mmax, max(abs(hi), abs(lo)))
        return mmax, mmax
    return side(mmax, hi), side(mmin, lo)


def per_channel(p, x):
    return np.asarray(p, F32).reshape((-1,) + (1,) * (x.ndim - 1))


# ----------------------------------------------------------------- doctests
def test_module_doctests():
    res = doctest.testmod(ofq, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted >= 4 and res.failed == 0


# ------------------------------------------------------ spec §3.5 vectors
def test_minmax_symmetric_vector():
    s, z = MinMaxObserver()(DOC_X)
    assert s.shape == (1,) and z.shape == (1,) and s.dtype == F32 and z.dtype == F32
    bits(s, ["0.015748031"]), bits(z, [0])
    assert s[0] == F32(2) / F32(127)
    bits(FakeQuantization()(DOC_X, s, z), [["1.007874", 2, "1.007874"], [-2, 0, "-1.007874"]])
    bits(Quantization()(DOC_X, s, z), [[64, 127, 64], [-127, 0, -64]])


def test_minmax_affine_vector():
    s, z = MinMaxObserver(quantization_scheme="affine")(DOC_X)
    bits(s, ["0.015686275"]), bits(z, [127])  # rint(-127.49999) = -127
    fq = FakeQuantization(quantization_scheme="affine")
    bits(fq(DOC_X, s, z), [["1.0039216", "1.992157", "1.0039216"], ["-1.992157", 0,
                                                                    "-1.0039216"]])
    # 2 -> 254.49998 -> 254; -2 -> rint(-0.5) = -0.0, kept by the comparison clamp
    bits(Quantization(quantization_scheme="affine")(DOC_X, s, z), [[191, 254, 191],
                                                                    [-0.0, 127, 63]])


def test_minmax_cambricon_vector():
    s, z = MinMaxObserver(quantization_formula="cambricon")(DOC_X)
    bits(s, [-5]), bits(z, [0])
    bits(FakeQuantization("cambricon")(DOC_X, s, z), [[1, 2, 1], [-2, 0, -1]])
    bits(Quantization("cambricon")(DOC_X, s, z), [[32, 64, 32], [-64, 0, -32]])


def test_per_channel_symmetric_vector():
    s, z = MinMaxObserver(per_layer_quantization=False)(W)
    bits(s[:1], ["0.015748031"]), bits(z, [0, 0])
    assert abs(float(s[1]) - 0.003149606) < 1e-9  # the spec prints 7 digits
    bits(s[1:], [F32(0.4) / F32(127)])
    bits(FakeQuantization()(W, s, z), [["0.2992126", "-0.6929134", "1.496063", 2],
                                       ["-0.1007874", "0.0503937", "0.2015748", -0.4]])


def test_per_channel_affine_vector():
    s, z = MinMaxObserver(quantization_scheme="affine", per_layer_quantization=False)(W)
    bits(s[:1], ["0.010588235"])
    assert abs(float(s[1]) - 0.002352941) < 1e-9
    bits(s[1:], [F32(F32(0.2) - F32(-0.4)) / F32(255)])
    bits(z, [66, 170])
    bits(FakeQuantization(quantization_scheme="affine")(W, s, z),
         [["0.29647058", "-0.6988235", "1.5035294", "2.0011764"],
          ["-0.09882353", "0.049411766", "0.20000002", "-0.40000004"]])


def test_cambricon_4bit_vector():
    s, _ = MinMaxObserver("cambricon", 4)(W)
    bits(s, [-1])
    bits(FakeQuantization("cambricon", 4)(W, s, 0), [[0.5, -0.5, 1.5, 2], [-0.0, 0, 0, -0.5]])


def test_symmetric_ties_to_even_and_lower_bound():
    x = f32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 127.4, -200])
    bits(FakeQuantization()(x, 1.0, 0.0), [-2, -2, -0.0, 0, 2, 2, 127, -128])
    bits(Quantization()(x, f32([1]), f32([0])), [-2, -2, -0.0, 0, 2, 2, 127, -128])


def test_affine_tie_zero_points():
    x = f32([-0.5, 254.5])
    s, z = MinMaxObserver(quantization_scheme="affine")(x)
    bits(s, [1]), bits(z, [0])  # rint(-0.5) = -0
    fq = FakeQuantization(quantization_scheme="affine")
    bits(fq(x, s, z), [-0.0, 254])
    obs = MovingAverageMinMaxObserver(quantization_scheme="affine")
    s, z = obs(x, 1)
    bits(s, [1]), bits(z, [1])  # round(-0.5) = -1
    bits(fq(x, s, z), [-1, 254])


@pytest.mark.parametrize("scheme,expected", [
    ("symmetric", [(2.0, "0.015748031", 0), ("2.0999999", "0.016535433", 0),
                   ("2.0999999", "0.016535433", 0)]),
    ("affine", [(2.0, "0.015686275", 127), ("1.925", "0.015784312", 133),
                ("1.925", "0.015784312", 133)]),
])
def test_moving_average_vectors(scheme, expected):
    obs = MovingAverageMinMaxObserver(stop_update_after_iters=2, quantization_scheme=scheme,
                                      momentum=0.95)
    assert obs.training
    bits(obs.moving_max, [0]), bits(obs.moving_min, [0])
    for step, (x, (mmax, scale, zp)) in enumerate(zip([DOC_X, f32([0.5, -4]),
                                                      f32([100, -100])], expected), start=1):
        s, z = obs(x, np.array([step], dtype=np.int64))
        bits(obs.moving_max, [mmax]), bits(s, [scale]), bits(z, [zp])
    if scheme == "affine":
        bits(obs.moving_min, ["-2.0999999"])
    else:
        bits(obs.moving_min, obs.moving_max)


# ------------------------------------------------------- observer behaviour
def test_moving_average_train_eval_reset():
    obs = MovingAverageMinMaxObserver(stop_update_after_iters=10)
    obs(DOC_X, 1)
    assert obs.eval() is obs and not obs.training
    s_eval, _ = obs(f32([50]), 2)  # eval: frozen
    bits(obs.moving_max, [2]), bits(s_eval, ["0.015748031"])
    obs.train()
    obs(f32([50]), 2)
    bits(obs.moving_max, [F32(F32(2) * F32(0.95)) + F32(50) * (F32(1) - F32(0.95))])
    obs.reset_running_stats()
    bits(obs.moving_max, [0]), bits(obs.moving_min, [0])
    obs(f32([-3, 1]), 3)
    bits(obs.moving_max, [3])  # a zero buffer takes the batch value


def test_moving_average_zero_buffer_reinitialises():
    # affine: a moving_min stuck at exactly 0 takes each new batch's min as is
    obs = MovingAverageMinMaxObserver(stop_update_after_iters=5, quantization_scheme="affine")
    obs(f32([0, 1, 2]), 1)
    bits(obs.moving_min, [0]), bits(obs.moving_max, [2])
    obs(f32([-1, 1]), 2)
    bits(obs.moving_min, [-1])
    bits(obs.moving_max, [F32(F32(2) * F32(0.95)) + F32(1) * (F32(1) - F32(0.95))])


def test_moving_average_eval_before_update_gives_zero_scale():
    obs = MovingAverageMinMaxObserver().eval()
    s, z = obs(DOC_X, 0)
    bits(s, [0]), bits(z, [0])


def test_moving_average_cambricon_tracks_abs_max():
    obs = MovingAverageMinMaxObserver(quantization_formula="cambricon",
                                      quantization_scheme="affine")
    s, z = obs(DOC_X, 1)
    bits(obs.moving_max, [2]), bits(obs.moving_min, [2]), bits(s, [-5]), bits(z, [0])


def test_moving_average_nan_policy():
    obs = MovingAverageMinMaxObserver(stop_update_after_iters=5)
    obs(DOC_X, 1)
    with pytest.warns(RuntimeWarning, match="NaN"):
        obs(f32([np.nan, 9]), 2)
    bits(obs.moving_max, [2])
    prop = MovingAverageMinMaxObserver(stop_update_after_iters=5, nan_policy="propagate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prop(f32([np.nan, 9]), 1)
    assert np.isnan(prop.moving_max[0])


def test_minmax_observer_nan_and_shapes():
    s, z = MinMaxObserver(per_layer_quantization=False)(np.ones((3, 2, 2), F32))
    assert s.shape == (3,) and z.shape == (3,)
    s, _ = MinMaxObserver()(f32([np.nan, 1]))
    assert np.isnan(s[0])
    s, z = MinMaxObserver(quantization_scheme="affine")(f32([1, 3]))  # no 0-inclusion
    bits(s, [F32(2) / F32(255)]), bits(z, [-np.rint(F32(1) / (F32(2) / F32(255)))])


def test_gradient_is_identity():
    fq = FakeQuantization()
    dy = f32([1, -2, np.nan, 4])
    out = fq.backward(dy)
    bits(out, dy)
    assert out is not dy
    bits(Quantization().backward(dy), dy)


def test_float64_and_float16():
    x = DOC_X.astype(np.float64)
    s, z = MinMaxObserver(quantization_scheme="affine")(x)
    assert s.dtype == F32
    y = FakeQuantization(quantization_scheme="affine")(x, s.astype(np.float64), z)
    assert y.dtype == np.float64
    s64 = np.float64(s[0])
    q = np.clip(np.rint(x / s64 + 127.0), 0, 255)
    assert np.array_equal(y, (q - 127.0) * s64)
    y16 = FakeQuantization()(DOC_X.astype(np.float16), 0.015748031, 0)
    assert y16.dtype == np.float16


def test_quantization_keeps_negative_zero():
    x = f32([-0.0, 0.0, -0.3, 0.3])
    bits(Quantization()(x, 1.0, 0.0), [-0.0, 0, -0.0, 0])
    bits(Quantization("cambricon")(x, 1.0, 0.0), [-0.0, 0, -0.0, 0])
    bits(FakeQuantization()(x[1:], 1.0, 0.0), [0, -0.0, 0])


def test_negative_zero_input_stays_negative_zero():
    # OneFlow: rint(-0.0 / s) = -0.0, y = -0.0 * s = -0.0; the core adds zp 0.0 first
    bits(FakeQuantization()(f32([-0.0]), 1.0, 0.0), [-0.0])


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize("make,exc,match", [
    (lambda: MinMaxObserver(quantization_bit=1), ValueError, "quantization_bit"),
    (lambda: MinMaxObserver(quantization_bit=9), ValueError, "quantization_bit"),
    (lambda: FakeQuantization(quantization_bit=8.0), TypeError, "quantization_bit"),
    (lambda: FakeQuantization(quantization_bit=True), TypeError, "quantization_bit"),
    (lambda: Quantization(quantization_scheme="asymmetric"), ValueError, "quantization_scheme"),
    (lambda: MovingAverageMinMaxObserver(quantization_formula="tf"), ValueError,
     "quantization_formula"),
    (lambda: MinMaxObserver("cambricon", per_layer_quantization=False), ValueError,
     "cambricon"),
    (lambda: MovingAverageMinMaxObserver(stop_update_after_iters=0), ValueError,
     "stop_update_after_iters"),
    (lambda: MovingAverageMinMaxObserver(stop_update_after_iters=1.0), TypeError,
     "stop_update_after_iters"),
    (lambda: MovingAverageMinMaxObserver(nan_policy="zero"), ValueError, "nan_policy"),
    (lambda: FakeQuantization()(DOC_X, [1.0, 2.0, 3.0], 0), ValueError, "x.shape"),
    (lambda: FakeQuantization(quantization_scheme="affine")(DOC_X, [1.0, 2.0], [0.0]),
     ValueError, "zero_point"),
    (lambda: FakeQuantization()(DOC_X, [], 0), ValueError, "empty"),
    (lambda: MovingAverageMinMaxObserver()(DOC_X, 1.5), TypeError, "current_train_step"),
])
def test_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


# ----------------------------------------------------- randomized vs model
@pytest.mark.parametrize("seed", range(60))
def test_random_fake_quant_against_model(seed):
    rng = np.random.default_rng(seed)
    b = int(rng.integers(2, 9))
    formula = "cambricon" if rng.random() < 0.2 else "google"
    scheme = str(rng.choice(["symmetric", "affine"]))
    per_layer = formula == "cambricon" or bool(rng.integers(2))
    shape = tuple(int(v) for v in rng.integers(1, 6, size=int(rng.integers(1, 4))))
    x = (rng.normal(size=shape) * rng.uniform(0.1, 5)).astype(F32)
    obs = MinMaxObserver(formula, b, scheme, per_layer)
    s, z = obs(x)
    if per_layer:
        lo, hi = x.min(), x.max()
    else:
        flat = x.reshape(shape[0], -1)
        lo, hi = flat.min(axis=1), flat.max(axis=1)
    es, ez = ref_qparams(lo, hi, b, scheme, formula)
    bits(s, np.reshape(es, -1)), bits(z, np.reshape(ez, -1))
    # place a third of the inputs on exact .5 ties of the grid
    sb = s if formula != "cambricon" else f32([2.0 ** int(s[0])])
    sbc, zbc = (sb[0], z[0]) if per_layer else (per_channel(sb, x), per_channel(z, x))
    k = rng.integers(-2 ** b, 2 ** b, size=shape).astype(F32)
    zk = zbc if scheme == "affine" and formula == "google" else F32(0)
    with np.errstate(invalid="ignore"):  # a one-element channel has scale 0, zp NaN
        ties = ((k + F32(0.5) - zk) * sbc).astype(F32)
    x = np.where(rng.random(shape) < 0.33, ties, x).astype(F32)
    for cls, out_q in ((FakeQuantization, False), (Quantization, True)):
        got = cls(formula, b, scheme)(x, s, z)
        bits(got, ref_fake_quant(x, sbc if formula != "cambricon" else s, zbc, b, scheme,
                                 formula, out_q))


@pytest.mark.parametrize("seed", range(30))
def test_random_moving_average_against_model(seed):
    rng = np.random.default_rng(500 + seed)
    b = int(rng.integers(2, 9))
    formula = "cambricon" if rng.random() < 0.2 else "google"
    scheme = str(rng.choice(["symmetric", "affine"]))
    momentum = float(rng.choice([0.95, 0.9, 0.5, 0.999]))
    stop = int(rng.integers(1, 5))
    obs = MovingAverageMinMaxObserver(stop, formula, b, scheme, momentum)
    mmax = mmin = F32(0)
    symmetric = scheme == "symmetric" or formula == "cambricon"
    for step in range(1, 7):
        x = (rng.normal(size=int(rng.integers(1, 20))) * rng.uniform(0.1, 5)
             + rng.uniform(-1, 1)).astype(F32)
        train = rng.random() < 0.8
        obs.train(train)
        if train and step <= stop:
            mmax, mmin = ref_ma_update(mmax, mmin, x, momentum, symmetric)
        s, z = obs(x, step)
        bits(obs.moving_max, [mmax]), bits(obs.moving_min, [mmin])
        es, ez = ref_qparams(mmin, mmax, b, scheme, formula, zp_round="away")
        bits(s, np.reshape(es, -1)), bits(z, np.reshape(ez, -1))


# ------------------------------------------------- DECISIONS / §3.4 details
def test_affine_negative_zero_point_uses_float_zp():
    # all-positive input: MinMaxObserver has no 0-inclusion, so zp < 0.  The
    # CPU kernel's uint8(round(zp)) = 129 would give q = 255 at x = 1; the
    # float zero point (OneFlow's GPU path, the specification's decisions) gives q = 0.
    x = f32([1, 2, 3])
    s, z = MinMaxObserver(quantization_scheme="affine")(x)
    bits(s, [F32(2) / F32(255)]), bits(z, [-127])  # rint(127.49999) = 127
    bits(Quantization(quantization_scheme="affine")(x, s, z), [0, 128, 255])
    y = FakeQuantization(quantization_scheme="affine")(x, s, z)
    bits(y, ["0.9960785", 2, "2.9960785"])
    bits(y, ref_fake_quant(x, s[0], z[0], 8, "affine", "google"))


def test_nan_is_not_clamped():
    x = f32([np.nan, 1, -np.nan])
    for formula, scheme, zp in (("google", "symmetric", 0.0), ("google", "affine", 3.0),
                                ("cambricon", "symmetric", 0.0)):
        for cls in (FakeQuantization, Quantization):
            out = cls(formula, 8, scheme)(x, 1.0 if formula == "google" else 0.0, zp)
            finite = 1 + zp if cls is Quantization else 1
            assert np.isnan(out[0]) and np.isnan(out[2]) and out[1] == finite, (cls, formula)


def test_signed_zeros_per_scheme():
    x = f32([-0.0, -0.3, 0.0, 0.3])
    bits(FakeQuantization()(x, 1.0, 0.0), [-0.0, -0.0, 0, 0])
    bits(FakeQuantization("cambricon")(x, 0.0, 0.0), [-0.0, -0.0, 0, 0])
    affine = FakeQuantization(quantization_scheme="affine")
    bits(affine(x, 1.0, 0.0), [0, -0.0, 0, 0])  # -0.0 + 0.0 = +0.0 before rint
    bits(Quantization(quantization_scheme="affine")(x, 1.0, 0.0), [0, -0.0, 0, 0])
    bits(Quantization(quantization_scheme="affine")(x, 1.0, 2.0), [2, 2, 2, 2])


def test_cambricon_zero_input_gives_minus_inf_shift():
    s, z = MinMaxObserver("cambricon")(np.zeros((2, 3), F32))
    assert s.tolist() == [-np.inf] and z.tolist() == [0]
    obs = MovingAverageMinMaxObserver(quantization_formula="cambricon")
    s, _ = obs(np.zeros(4, F32), 1)
    assert s.tolist() == [-np.inf]
    # step 2**-inf = 0: x / 0 = +-inf is clamped and times 0 gives +-0; 0 / 0 is NaN
    bits(FakeQuantization("cambricon")(f32([1, -2, 0]), s, 0.0), [0, -0.0, np.nan])


def test_momentum_complement_is_float32():
    # om = f32(1 - f32(0.95)) = 0.050000012 (spec §3.3), not 0.05
    obs = MovingAverageMinMaxObserver(stop_update_after_iters=2)
    obs(f32([2]), 1)
    obs(f32([4]), 2)
    om = F32(1) - F32(0.95)
    assert om == F32("0.050000012") and om != F32(0.05)
    bits(obs.moving_max, [F32(F32(2) * F32(0.95)) + F32(F32(4) * om)])
