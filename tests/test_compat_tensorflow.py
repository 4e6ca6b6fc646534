"""quantcore.compat.tensorflow: tf.quantization.fake_quant_with_min_max_* (issue 5).

Oracles: the spec's vectors (the project's MindSpore / TensorFlow / OneFlow specification §2, from
tensorflow-cpu 2.21) and an independent NumPy float32 model of the current
TF kernels written below.  The comparison against live TensorFlow is in
test_compat_tensorflow_live.py (skipped cleanly without TensorFlow).
"""
import doctest

import numpy as np
import pytest

import quantcore.compat.tensorflow as tfq
from quantcore.compat.tensorflow import (
    fake_quant_with_min_max_args, fake_quant_with_min_max_args_gradient,
    fake_quant_with_min_max_vars, fake_quant_with_min_max_vars_gradient,
    fake_quant_with_min_max_vars_per_channel,
    fake_quant_with_min_max_vars_per_channel_gradient)

import reference as ref

F32 = np.float32
DOC_X = np.array([[1, 2, 1], [-2, 0, -1]], dtype=F32)
X9 = np.array([-1.5, -1, -0.3, 0, 0.2, 1.1, 2.9, 3, 3.5], dtype=F32)


f32 = ref.spec_f32


bits = ref.assert_spec_bits


# --------------------------------------------------- independent reference
round_half_away = ref.round_half_away_f  # (float32 in, float32 out)


def ref_nudge(mn, mx, qmin, qmax):
    """TF's Nudge in float32, one rounding per operation."""
    mn, mx = np.asarray(mn, F32), np.asarray(mx, F32)
    with np.errstate(all="ignore"):
        span = mx - mn
        scale = span / F32(qmax - qmin)
        inv = F32(qmax - qmin) / span
        zpm = F32(qmin) - mn / scale
        nzp = np.where(zpm < qmin, F32(qmin),
                       np.where(zpm > qmax, F32(qmax), round_half_away(zpm))).astype(F32)
        nmin = (F32(qmin) - nzp) * scale
        nmax = (F32(qmax) - nzp) * scale
        qz = np.floor(-nmin * inv + F32(0.5))
    return nmin, nmax, scale, inv, qz


def ref_forward(x, mn, mx, qmin, qmax, divide):
    """Current TF forward; params broadcast against x (last axis)."""
    nmin, nmax, scale, inv, qz = ref_nudge(mn, mx, qmin, qmax)
    with np.errstate(all="ignore"):
        xc = np.where(x > nmax, nmax, x)
        xc = np.where(xc < nmin, nmin, xc)
        cs = xc - nmin
        t = cs / scale if divide else cs * inv
        y = np.floor((t - qz) + F32(0.5)) * scale
    mask = (x >= nmin) & (x <= nmax)
    return y.astype(F32), mask, x < nmin, x > nmax


def assert_sum_close(actual, terms, axis=None):
    """A float32 sum of ``terms`` in any order: within n * eps * sum|terms| of
    the exact (float64) sum."""
    terms = np.asarray(terms, np.float64)
    exact = terms.sum(axis=axis)
    n = terms.size if axis is None else terms.shape[axis]
    bound = (n + 1) * np.finfo(F32).eps * np.abs(terms).sum(axis=axis)
    assert np.asarray(actual).dtype == F32
    assert (np.abs(np.asarray(actual, np.float64) - exact) <= bound).all(), (actual, exact)


def ref_range(num_bits, narrow):
    return int(narrow), 2 ** num_bits - 1


# ----------------------------------------------------------------- doctests
def test_module_doctests():
    res = doctest.testmod(tfq, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted >= 3 and res.failed == 0


# ------------------------------------------------------ spec §2.5 vectors
ARGS_DOC = [["0.9882353", "2.0235295", "0.9882353"], ["-1.9764706", 0, "-0.9882353"]]
VARS_DOC = [["0.9882353", "1.9764706", "0.9882353"], ["-1.9764706", 0, "-0.9882353"]]
M2_DOC = [["1.0039216", "2.0078433", "1.0039216"], ["-1.992157", 0, "-1.0039216"]]


def test_args_and_vars_doc_vectors():
    bits(fake_quant_with_min_max_args(DOC_X), ARGS_DOC)
    bits(fake_quant_with_min_max_vars(DOC_X, -6, 6), VARS_DOC)
    bits(fake_quant_with_min_max_vars(DOC_X, F32(-6), np.array(6.0)), VARS_DOC)
    bits(fake_quant_with_min_max_vars_per_channel(DOC_X, [-6.0] * 3, [6.0] * 3), ARGS_DOC)


def test_tie_differs_between_args_and_vars():
    # (-6, 6), x = 2: args t = 170.5 exactly, vars t = 170.49998
    bits(fake_quant_with_min_max_args(f32([2])), ["2.0235295"])
    bits(fake_quant_with_min_max_vars(f32([2]), -6.0, 6.0), ["1.9764706"])


def test_minus2_2_vectors():
    bits(fake_quant_with_min_max_args(DOC_X, -2, 2), M2_DOC)
    bits(fake_quant_with_min_max_vars(DOC_X, -2.0, 2.0), M2_DOC)
    bits(fake_quant_with_min_max_args(DOC_X, -2, 2, narrow_range=True),
         [["1.007874", 2, "1.007874"], [-2, 0, "-0.992126"]])
    bits(fake_quant_with_min_max_args(DOC_X, -2, 2, num_bits=4),
         [["1.0666667", "2.1333334", "1.0666667"], ["-1.8666668", 0, "-1.0666667"]])


def test_vars_small_vectors():
    # zpm = 127.49999, so nzp = 127
    bits(fake_quant_with_min_max_vars(f32([-1, 0, 1]), -1.0, 1.0),
         ["-0.9960785", 0, "1.0039216"])
    exp = ["-1.0039216", "-1.0039216", "-0.29803923", 0, "0.20392159", "1.0980393",
           "2.9019608", "2.9960785", "2.9960785"]
    bits(fake_quant_with_min_max_vars(X9, -1.0, 3.0), exp)
    bits(fake_quant_with_min_max_args(X9, -1.0, 3.0), exp)
    bits(fake_quant_with_min_max_vars(X9, -1.0, 3.0, narrow_range=True),
         ["-1.007874", "-0.992126", "-0.29921260", 0, "0.2047244", "1.1023622", "2.8976378",
          "2.992126", "2.992126"])
    bits(fake_quant_with_min_max_vars(X9, -1.0, 3.0, num_bits=4),
         ["-1.0666667", "-1.0666667", "-0.26666668", 0, "0.26666668", "1.0666667", "2.9333334",
          "2.9333334", "2.9333334"])


def test_per_channel_vector_with_zero_channel():
    bits(fake_quant_with_min_max_vars_per_channel(DOC_X, [-2.0, -1.0, 0.0], [2.0, 1.0, 0.0]),
         [["1.0039216", "1.0039216", 0], ["-1.992157", 0, 0]])


def test_min_greater_than_max_and_equal():
    bits(fake_quant_with_min_max_vars(DOC_X, 3.0, -3.0), np.full((2, 3), F32("3.0117648")))
    assert np.isnan(fake_quant_with_min_max_vars(DOC_X, 2.0, 2.0)).all()
    bits(fake_quant_with_min_max_vars(DOC_X, 0.0, 0.0), np.zeros((2, 3)))
    bits(fake_quant_with_min_max_vars(f32([np.nan, 1]), -0.0, 0.0), [0, 0])


def test_positive_min_range():
    # §2.2: min > 0 gives nzp = qmin and the range [0, max - min]
    bits(fake_quant_with_min_max_vars(f32([0, 1, 3, 5, 7]), 1.0, 5.0, num_bits=2),
         [0, "1.3333334", "2.6666667", 4, 4])
    # max < 0 gives [min - max, 0]
    y = fake_quant_with_min_max_vars(f32([-9, -3, -1, 0, 2]), -5.0, -1.0)
    assert y.min() == F32(-4) and y.max() == 0


def test_nonfinite_inputs():
    x = f32([np.nan, np.inf, -np.inf, -0.0])
    y = fake_quant_with_min_max_args(x)
    assert np.isnan(y[0])
    bits(y[1:], ["5.976470470428467", "-6.023529529571533", 0])
    y = fake_quant_with_min_max_vars(x, -1.0, 1.0)
    bits(y[1:], ["1.003921627998352", "-0.9960784912109375", 0])


# ------------------------------------------------------------------ gradients
def test_vars_gradient_spec_example():
    x = f32([-3, -2, "-1.992157", 0.5, "2.0078433", 2.01, 4])
    g = f32([1, 2, 3, 4, 5, 6, 7])
    bits(fake_quant_with_min_max_vars(x, -2.0, 2.0),
         ["-1.992157", "-1.992157", "-1.992157", "0.5019608", "2.0078433", "2.0078433",
          "2.0078433"])
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(g, x, -2.0, 2.0)
    bits(dx, [0, 0, 3, 4, 5, 0, 0])
    assert dmin.shape == () and dmin.dtype == F32 and dmin == 3 and dmax == 13
    bits(fake_quant_with_min_max_args_gradient(g, x, -2, 2), [0, 0, 3, 4, 5, 0, 0])


def test_vars_gradient_degenerate_and_nan():
    g = f32([[1, 2, 1], [-2, 0, -1]])
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(g, DOC_X, 0.0, 0.0)
    bits(dx, g)
    assert dmin == 0 and dmax == 0
    # min == max != 0: nudged range [0, 0]
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(
        np.ones(6, F32), f32([-3, -2, 1, 2, 3, np.nan]), 2.0, 2.0)
    bits(dx, np.zeros(6)), bits(dmin, 2), bits(dmax, 3)
    # NaN gradients poison the sums (g * 0 is NaN), NaN inputs are outside
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(
        f32([-1, -1, np.nan, 2, 3, 4]), f32([-3, -2, 1, 2, 3, np.nan]), -1.0, 1.0)
    bits(dx, [-0.0, -0.0, np.nan, 0, 0, 0])
    assert np.isnan(dmin) and np.isnan(dmax)
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(
        f32([-1, -1, -2, 2, 3, 4]), f32([-3, -2, 1, 2, 3, np.nan]), -1.0, 4.0)
    bits(dx, [-0.0, -0.0, -2, 2, 3, 0]), bits(dmin, -2), bits(dmax, 0)
    # an empty input gives +0.0 sums
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(np.zeros((2, 0), F32),
                                                           np.zeros((2, 0), F32), -1.0, 1.0)
    assert dx.shape == (2, 0) and dmin == 0 and not np.signbit(dmin)


def test_per_channel_gradient():
    g = f32([[1, 2, 1], [-2, 0, -1]])
    dx, dmin, dmax = fake_quant_with_min_max_vars_per_channel_gradient(
        g, DOC_X, [0.0, -1.0, 0.0], [0.0, 1.0, 0.0])
    bits(dx, [[1, 0, 1], [-2, 0, -1]]), bits(dmin, [0, 0, 0]), bits(dmax, [0, 2, 0])
    x = np.stack([f32([-3, -2, "-1.992157", 0.5, "2.0078433", 2.01, 4])] * 2, axis=-1)
    gg = np.stack([f32([1, 2, 3, 4, 5, 6, 7]), f32([1, 2, 3, 4, 5, 6, 7]) * 10], axis=-1)
    dx, dmin, dmax = fake_quant_with_min_max_vars_per_channel_gradient(gg, x, [-2.0, -2.0],
                                                                       [2.0, 2.0])
    bits(dx[:, 0], [0, 0, 3, 4, 5, 0, 0]), bits(dmin, [3, 30]), bits(dmax, [13, 130])


# ---------------------------------------------------------------------- errors
def _msg(s):
    import re
    return re.escape(s)


@pytest.mark.parametrize("call,exc,message", [
    (lambda: fake_quant_with_min_max_args(DOC_X, 1.0, 1.0), ValueError,
     "min has to be smaller than max, was: 1 >= 1"),
    (lambda: fake_quant_with_min_max_args(DOC_X, 2.5, 1.0), ValueError,
     "min has to be smaller than max, was: 2.5 >= 1"),
    (lambda: fake_quant_with_min_max_args_gradient(DOC_X, DOC_X, 1.0, 1.0), ValueError,
     "min has to be smaller than max, was: 1 >= 1"),
    (lambda: fake_quant_with_min_max_args(DOC_X, num_bits=1), ValueError,
     "num_bits must be between 2 and 16, inclusive"),
    (lambda: fake_quant_with_min_max_vars(DOC_X, -1.0, 1.0, num_bits=17), ValueError,
     "num_bits must be between 2 and 16, inclusive"),
    (lambda: fake_quant_with_min_max_vars_per_channel(DOC_X, [-1.0] * 3, [1.0] * 3,
                                                      num_bits=0), ValueError,
     "num_bits must be between 2 and 16, inclusive"),
    (lambda: fake_quant_with_min_max_vars_gradient(DOC_X, DOC_X, -1.0, 1.0, num_bits=True),
     ValueError, "num_bits must be between 2 and 16, inclusive"),
    (lambda: fake_quant_with_min_max_vars(DOC_X, [-1.0], [1.0]), ValueError,
     "`min` must be rank 0 but is rank 1"),
    (lambda: fake_quant_with_min_max_vars(DOC_X, -1.0, [1.0]), ValueError,
     "`max` must be rank 0 but is rank 1"),
    (lambda: fake_quant_with_min_max_vars_gradient(DOC_X, DOC_X, [-1.0], 1.0), ValueError,
     "`min` must be rank 0 but is rank 1"),
    (lambda: fake_quant_with_min_max_vars_per_channel(DOC_X, [-1.0, 1], [1.0, 1]), ValueError,
     "min has incorrect size, expected 3 was 2"),
    (lambda: fake_quant_with_min_max_vars_per_channel(DOC_X, [-1.0, 1, 1], [1.0, 1]),
     ValueError, "max has incorrect size, expected 3 was 2"),
    (lambda: fake_quant_with_min_max_vars_per_channel(DOC_X, -1.0, 1.0), ValueError,
     "`min` must be rank 1 but is rank 0"),
    (lambda: fake_quant_with_min_max_vars_per_channel(DOC_X, [[-1.0] * 3], [[1.0] * 3]),
     ValueError, "`min` must be rank 1 but is rank 2"),
    (lambda: fake_quant_with_min_max_vars_per_channel(F32(1), [-1.0], [1.0]), ValueError,
     "Shape must be at least rank 1 but is rank 0"),
    (lambda: fake_quant_with_min_max_args_gradient(DOC_X[0], DOC_X), ValueError,
     "Inputs to operation FakeQuantWithMinMaxArgsGradient of type "
     "FakeQuantWithMinMaxArgsGradient must have the same size and shape.  "
     "Input 0: [3] != input 1: [2,3]"),
    (lambda: fake_quant_with_min_max_vars_gradient(DOC_X[0], DOC_X, -1.0, 1.0), ValueError,
     "gradient and input must be the same size"),
    (lambda: fake_quant_with_min_max_vars_per_channel_gradient(DOC_X[0], DOC_X, [-1.0] * 3,
                                                               [1.0] * 3), ValueError,
     "gradient and input must be the same size"),
    (lambda: fake_quant_with_min_max_vars_per_channel_gradient(DOC_X, DOC_X, [-1.0] * 2,
                                                               [1.0] * 3), ValueError,
     "min has incorrect size, expected 3 was 2"),
    (lambda: fake_quant_with_min_max_args(DOC_X, narrow_range=1), TypeError,
     "Expected bool for argument 'narrow_range' not 1."),
    (lambda: fake_quant_with_min_max_args(DOC_X, min="a"), TypeError,
     "Expected float for argument 'min' not 'a'."),
    (lambda: fake_quant_with_min_max_args(DOC_X, num_bits="8"), TypeError,
     "Expected int for argument 'num_bits' not '8'."),
])
def test_errors(call, exc, message):
    with pytest.raises(exc, match=_msg(message)):
        call()


def test_conversions_like_tf():
    # float64 / float16 / int inputs are converted to float32; results float32
    for x in (DOC_X.astype(np.float64), DOC_X.astype(np.float16), DOC_X.astype(np.int64),
              DOC_X.tolist()):
        y = fake_quant_with_min_max_args(x)
        assert y.dtype == F32
        bits(y, ARGS_DOC)
    bits(fake_quant_with_min_max_args(DOC_X, num_bits=8.0), ARGS_DOC)
    bits(fake_quant_with_min_max_args(DOC_X, min=None, max=None), ARGS_DOC)
    bits(fake_quant_with_min_max_args(f32([0.5]), min=True), ["0.50980395"])
    bits(fake_quant_with_min_max_vars(DOC_X, -1, 1),
         [["1.003921627998352"] * 3, ["-0.9960784912109375", 0, "-0.9960784912109375"]])


# ----------------------------------------------------- randomized vs model
def _trial(rng):
    """Random inputs, range and attributes with exact .5 ties and min > 0."""
    num_bits = int(rng.integers(2, 17))
    narrow = bool(rng.integers(2))
    kind = rng.integers(4)
    mn = F32(rng.uniform(-8, 0))
    mx = F32(rng.uniform(0.01, 8))
    if kind == 1:   # min > 0
        mn, mx = F32(rng.uniform(0.01, 3)), F32(rng.uniform(3.5, 9))
    elif kind == 2:  # max < 0
        mn, mx = F32(rng.uniform(-9, -3.5)), F32(rng.uniform(-3, -0.01))
    shape = tuple(int(v) for v in rng.integers(1, 7, size=int(rng.integers(1, 4))))
    x = (rng.normal(size=shape) * rng.uniform(0.5, 6)).astype(F32)
    qmin, qmax = ref_range(num_bits, narrow)
    nmin, _, scale, _, _ = ref_nudge(mn, mx, qmin, qmax)
    k = rng.integers(-2, min(qmax, 4000) + 2, size=shape).astype(F32)
    ties = ((k + F32(0.5)) * scale + nmin).astype(F32)
    x = np.where(rng.random(shape) < 0.4, ties, x).astype(F32)
    g = rng.normal(size=shape).astype(F32)
    return x, g, mn, mx, num_bits, narrow


@pytest.mark.parametrize("seed", range(60))
def test_random_per_tensor_against_model(seed):
    rng = np.random.default_rng(seed)
    x, g, mn, mx, nb, narrow = _trial(rng)
    qmin, qmax = ref_range(nb, narrow)
    y, mask, _, _ = ref_forward(x, mn, mx, qmin, qmax, divide=False)
    bits(fake_quant_with_min_max_args(x, float(mn), float(mx), nb, narrow), y)
    bits(fake_quant_with_min_max_args_gradient(g, x, float(mn), float(mx), nb, narrow),
         np.where(mask, g, g * F32(0)))
    y, mask, below, above = ref_forward(x, mn, mx, qmin, qmax, divide=True)
    bits(fake_quant_with_min_max_vars(x, mn, mx, nb, narrow), y)
    dx, dmin, dmax = fake_quant_with_min_max_vars_gradient(g, x, mn, mx, nb, narrow)
    bits(dx, np.where(mask, g, g * F32(0)))
    assert_sum_close(dmin, g[below])
    assert_sum_close(dmax, g[above])


@pytest.mark.parametrize("seed", range(40))
def test_random_per_channel_against_model(seed):
    rng = np.random.default_rng(1000 + seed)
    x, g, _, _, nb, narrow = _trial(rng)
    d = x.shape[-1]
    mn = rng.uniform(-6, 0.5, d).astype(F32)
    mx = (mn + rng.uniform(0.01, 6, d)).astype(F32)
    if d > 1:
        mn[0], mx[0] = 0, 0  # a degenerate channel
    qmin, qmax = ref_range(nb, narrow)
    y, mask, below, above = ref_forward(x, mn, mx, qmin, qmax, divide=False)
    zero = (mn == 0) & (mx == 0)
    y = np.where(zero, F32(0), y)
    bits(fake_quant_with_min_max_vars_per_channel(x, mn, mx, nb, narrow), y)
    dx, dmin, dmax = fake_quant_with_min_max_vars_per_channel_gradient(g, x, mn, mx, nb, narrow)
    bits(dx, np.where(zero | mask, g, g * F32(0)))
    flat = lambda m: np.where(m & ~zero, g, 0).reshape(-1, d)  # noqa: E731
    assert_sum_close(dmin, flat(below), axis=0)
    assert_sum_close(dmax, flat(above), axis=0)
