"""quantcore.compat.mindspore: FakeQuantWithMinMaxObserver (issue 5).

Oracles: the spec's vectors (the project's MindSpore / TensorFlow / OneFlow specification §1), the
seed page's example (a doctest of the module), and an independent NumPy
float32 model of the kernels written below (one rounding per operation).
"""
import doctest
import warnings

import numpy as np
import pytest

import quantcore.compat.mindspore as ms
from quantcore.compat.mindspore import (FakeQuantWithMinMaxObserver, MindSporeArgumentError,
                                        QuantDtype)

import reference as ref

F32 = np.float32
DOC_X = np.array([[1, 2, 1], [-2, 0, -1]], dtype=F32)
X9 = np.array([-1.5, -1, -0.3, 0, 0.2, 1.1, 2.9, 3, 3.5], dtype=F32)


f32 = ref.spec_f32


bits = ref.assert_spec_bits


# --------------------------------------------------- independent reference
def ref_update(old_min, old_max, x, ema, decay, axis):
    """MinMaxUpdate (DECISIONS: Ascend EMA rule)."""
    if axis is None:
        bmin, bmax = F32(x.min()), F32(x.max())
    else:
        red = tuple(i for i in range(x.ndim) if i != axis)
        bmin, bmax = x.min(axis=red).astype(F32), x.max(axis=red).astype(F32)
    if not ema:
        return np.minimum(bmin, F32(0)), np.maximum(bmax, F32(0))
    d = F32(decay)
    c = F32(1.0 - decay)  # computed in double, then cast
    new_min = F32(old_min) * d + bmin * c
    new_max = F32(old_max) * d + bmax * c
    return np.minimum(new_min, F32(0)), np.maximum(new_max, F32(0))


def ref_nudge(mn, mx, qmin, qmax, symmetric):
    mn, mx = np.asarray(mn, F32), np.asarray(mx, F32)
    if symmetric:
        m = np.maximum(mx, -mn)
        mn, mx = -m, m
    scale = (mx - mn) / F32(qmax - qmin)
    zpm = F32(qmin) - mn / scale
    nzp = np.floor(np.clip(zpm, F32(qmin), F32(qmax)) + F32(0.5))
    return (F32(qmin) - nzp) * scale, (F32(qmax) - nzp) * scale, scale


def ref_forward(x, nmin, nmax, scale):
    xc = np.where(x < nmin, nmin, x)
    xc = np.where(xc > nmax, nmax, xc)
    v = (xc - nmin) / scale
    q = np.floor(v + F32(0.5))
    return (q * scale + nmin).astype(F32)


def bshape(p, x, axis):
    if axis is None:
        return np.asarray(p, F32).reshape(())
    shape = [1] * x.ndim
    shape[axis] = -1
    return np.asarray(p, F32).reshape(shape)


# ------------------------------------------------------------ seed example
def test_module_doctests():
    res = doctest.testmod(ms, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted >= 4 and res.failed == 0


def test_doctest_holds_the_seed_example_verbatim():
    # the seed page's example and printed output, as the module's doctest
    seed_out = ("[[ 0.9882355  1.9764705  0.9882355]\n"
                " [-1.9764705  0.        -0.9882355]]")
    doc = ms.__doc__
    assert ">>> fake_quant = FakeQuantWithMinMaxObserver()" in doc
    assert ">>> output = fake_quant(x)" in doc and ">>> print(output)" in doc
    assert ">>> print(output)\n" + seed_out in doc
    examples = doctest.DocTestParser().get_examples(doc)
    assert any(e.source == "print(output)\n" and e.want == seed_out + "\n" for e in examples)


def test_seed_example_intermediates():
    # spec §1.9: scale 12/255, zp_from_min 127.5, nzp 128, q = [149, 170, ...]
    fq = FakeQuantWithMinMaxObserver()
    nmin, nmax, scale = fq._nudged_range()
    bits(scale, [F32(12) / F32(255)]), bits(scale, ["0.047058824"])
    assert F32(0) - F32(-6) / scale[0] == F32(127.5)
    bits(nmin, ["-6.0235295"]), bits(nmax, ["5.9764705"])
    v = ((DOC_X - nmin[0]) / scale[0]).astype(F32).ravel()
    bits(v, [149.25, "170.49998", 149.25, 85.5, 128, 106.75])
    q = np.floor(v + F32(0.5))
    assert q.tolist() == [149, 170, 149, 86, 128, 107]
    y = fq(DOC_X).ravel()
    bits(y, (q * scale[0]).astype(F32) + nmin[0])
    assert (q - 128).tolist() == [21, 42, 21, -42, 0, -21]


def test_seed_example_bits():
    fq = FakeQuantWithMinMaxObserver()
    assert fq.training is False
    bits(fq(DOC_X), [["0.9882355", "1.9764705", "0.9882355"],
                     ["-1.9764705", 0, "-0.9882355"]])
    # the steps of the documented output: 21, 42, 21, -42, 0, -21
    bits(fq.minq, [-6]), bits(fq.maxq, [6])  # inference: no update


def test_construct_alias_and_list_input():
    fq = FakeQuantWithMinMaxObserver()
    out = fq.construct([[1, 2, 1], [-2, 0, -1]])
    assert out.dtype == F32
    bits(out, fq(DOC_X))


# ------------------------------------------------------ spec §1.9 vectors
def test_training_no_ema_vector():
    fq = FakeQuantWithMinMaxObserver()
    assert fq.set_train() is fq and fq.training
    bits(fq(DOC_X), [["1.0039215", "2.007843", "1.0039215"], ["-1.992157", 0, "-1.0039216"]])
    bits(fq.minq, [-2]), bits(fq.maxq, [2])
    fq.set_train(False)
    assert not fq.training
    fq(np.array([100.0], F32))
    bits(fq.minq, [-2]), bits(fq.maxq, [2])


def test_training_ema_vector_ascend_rule():
    # c = f32(1 - d) computed in double (Ascend); the GPU's f32(1 - f32(d)) differs
    assert float(F32(1.0 - 0.999)) == 0.0010000000474974513
    assert float(F32(1) - F32(0.999)) == 0.0009999871253967285
    fq = FakeQuantWithMinMaxObserver(ema=True, ema_decay=0.999).set_train()
    y = fq(DOC_X)
    assert abs(float(fq.minq[0]) + 5.996) < 1e-6 and abs(float(fq.maxq[0]) - 5.996) < 1e-6
    exp_min, exp_max = ref_update(-6, 6, DOC_X, True, 0.999, None)
    bits(fq.minq, [exp_min]), bits(fq.maxq, [exp_max])
    bits(y, [["0.9875765", "2.02218", "0.9875765"], ["-2.0221803", 0, "-0.9875765"]])


def test_gpu_rule_range_vector():
    # the spec's GPU-rule EMA range (-2.004, 2.004) (not the rule quantcore
    # uses, the specification's decisions) fed in as the stored range: the forward still matches
    d = F32(0.999)
    om = F32(1) - d
    lo = np.minimum(d * F32(-2) + om * F32(-6), F32(0))
    hi = np.maximum(d * F32(2) + om * F32(6), F32(0))
    fq = FakeQuantWithMinMaxObserver()
    fq.minq[:] = lo
    fq.maxq[:] = hi
    bits(fq(DOC_X), [["1.0059292", "1.9961412", "1.0059292"], ["-1.9961411", 0, "-1.0059294"]])


X9_CASES = [
    (dict(), ["-1.0039216", "-1.0039216", "-0.29803926", 0, "0.20392156", "1.0980393",
              "2.9019608", "2.9960785", "2.9960785"]),
    (dict(symmetric=True), ["-1.5058824", "-0.98823524", "-0.30588245", 0, "0.21176481",
                            "1.1058824", "2.8941176", "2.9882352", "2.9882352"]),
    (dict(narrow_range=True), ["-1.007874", "-1.007874", "-0.29921257", 0, "0.20472443",
                               "1.1023622", "2.8976378", "2.992126", "2.992126"]),
    (dict(symmetric=True, narrow_range=True), ["-1.488189", "-0.992126", "-0.3070867", 0,
                                               "0.18897629", "1.1102362", "2.9055119", 3, 3]),
    (dict(quant_dtype=QuantDtype.INT4), ["-1.0666667", "-1.0666667", "-0.26666665", 0,
                                         "0.26666665", "1.0666667", "2.9333334", "2.9333334",
                                         "2.9333334"]),
]


@pytest.mark.parametrize("kwargs,expected", X9_CASES)
def test_x9_vectors(kwargs, expected):
    fq = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3, **kwargs)
    bits(fq(X9), expected)
    # signedness of quant_dtype is ignored
    dt = kwargs.get("quant_dtype", QuantDtype.INT8)
    other = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3,
                                        **{**kwargs, "quant_dtype": QuantDtype.switch_signed(dt)})
    bits(other(X9), expected)


def test_x9_nudged_range():
    fq = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3)
    nmin, nmax, _ = fq._nudged_range()
    bits(nmin, ["-1.0039216"]), bits(nmax, ["2.9960785"])
    # symmetric + narrow: exactly [-3, 3]; symmetric: [-128 s, 127 s], s = 2M/255
    nmin, nmax, s = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3, symmetric=True,
                                                narrow_range=True)._nudged_range()
    bits(nmin, [-3]), bits(nmax, [3])
    nmin, nmax, s = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3,
                                                symmetric=True)._nudged_range()
    bits(s, [F32(6) / F32(255)])
    bits(nmin, [F32(-128) * s[0]]), bits(nmax, [F32(127) * s[0]])


def test_nudge_float_effect_vectors():
    # (-2, 2): zp_from_min 127.49999 -> 127; (-6, 6): exactly 127.5 -> 128
    nmin, nmax, _ = FakeQuantWithMinMaxObserver(min_init=-2, max_init=2)._nudged_range()
    bits(nmin, ["-1.992157"]), bits(nmax, ["2.0078433"])
    nmin, nmax, _ = FakeQuantWithMinMaxObserver()._nudged_range()
    bits(nmin, ["-6.0235295"]), bits(nmax, ["5.9764705"])


def test_per_channel_vector_axis0():
    x = f32([[1, 2, -0.7], [-2, 0.3, 0.05]])
    fq = FakeQuantWithMinMaxObserver(min_init=[-2, -0.5], max_init=[2, 0.5], per_channel=True,
                                     channel_axis=0, num_channels=2)
    bits(fq(x), [["1.0039215", "2.007843", "-0.70588243"],
                 ["-0.49803925", "0.30196083", "0.05098039"]])


def test_symmetric_keeps_stored_range_and_gradient_uses_forward_range():
    # spec §1.8: symmetric, (min, max) = (-1, 3): forward range [-3.0117648, 2.9882352]
    fq = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3, symmetric=True)
    x = f32([-2, -3.0117648, -3.02, 2.9882352, 2.99])
    y = fq(x)
    bits(y[:2], [-2, "-3.0117648"])
    g = fq.backward(np.ones(5, F32), x)
    bits(g, [1, 1, 0, 1, 0])  # MindSpore's bprop would give 0 at x = -2 (bug not reproduced)
    bits(fq.minq, [-1]), bits(fq.maxq, [3])
    fq.set_train()
    fq(f32([-0.5, 1]))
    bits(fq.minq, [-0.5]), bits(fq.maxq, [1])  # not overwritten with -max


# ----------------------------------------------------------------- gradient
def test_backward_inclusive_mask():
    fq = FakeQuantWithMinMaxObserver(min_init=-2, max_init=2)
    x = f32([-3, "-1.992157", "-1.9921569", 0.5, "2.0078433", "2.0078435", np.nan])
    dout = f32([1, 2, 3, 4, 5, 6, 7])
    # the GPU kernel's select: a NaN x is neither below nor above, dout passes
    bits(fq.backward(dout, x), [0, 2, 3, 4, 5, 0, 7])
    narrow = FakeQuantWithMinMaxObserver(min_init=-2, max_init=2, narrow_range=True)
    nmin, nmax, _ = narrow._nudged_range()
    g = narrow.backward(np.ones(4, F32), f32([nmin[0], np.nextafter(nmin[0], F32(-9)),
                                              nmax[0], np.nextafter(nmax[0], F32(9))]))
    bits(g, [1, 0, 1, 0])
    with pytest.raises(ValueError, match="one shape"):
        fq.backward(np.ones(3, F32), x)


def test_backward_is_a_select():
    # MindSpore's gradient kernel: 0 if x < nudge_min or x > nudge_max else dout,
    # so +0.0 outside (not dout * 0 = -0.0) and a NaN dout outside gives 0
    fq = FakeQuantWithMinMaxObserver(min_init=-1, max_init=1)
    g = fq.backward(f32([np.nan, np.nan, -1, -2, -3]), f32([5, 0, 7, -7, 0.5]))
    bits(g, [0, np.nan, 0, 0, -3])
    assert not np.signbit(g[2]) and not np.signbit(g[3])
    g = fq.backward(f32([1, 2, 3]).astype(np.float16), f32([np.nan, 9, 0]).astype(np.float16))
    assert g.dtype == np.float16 and g.tolist() == [1, 0, 3]


def test_per_channel_backward_channel_axis1():
    x = np.stack([f32([-3, 0.5, 3]), f32([-0.2, 0.05, 0.3])], axis=1)  # channels on axis 1
    fq = FakeQuantWithMinMaxObserver(min_init=[-2, -0.1], max_init=[2, 0.1], per_channel=True,
                                     num_channels=2)
    g = fq.backward(np.ones_like(x), x)
    bits(g, [[0, 0], [1, 1], [0, 0]])


# --------------------------------------------------------------- quant_delay
def test_quant_delay():
    fq = FakeQuantWithMinMaxObserver(quant_delay=2).set_train()
    x = f32([0.3, -1.1, 0.77])
    y1 = fq(x)
    assert y1 is not x and ref.bits_equal(y1, x)
    bits(fq.minq, [-1.1]), bits(fq.maxq, [0.77])  # statistics still update
    y2 = fq(x * 2)
    bits(y2, x * 2)
    bits(fq.minq, [-2.2]), bits(fq.maxq, [1.54])
    y3 = fq(x)
    assert not ref.bits_equal(y3, x)
    nmin, nmax, s = ref_nudge(F32(-1.1), F32(0.77), 0, 255, False)
    bits(y3, ref_forward(x, nmin, nmax, s))
    # inference always quantizes; it does not advance the counter
    fq2 = FakeQuantWithMinMaxObserver(quant_delay=1)
    assert not ref.bits_equal(fq2(x), x)
    fq2.set_train()
    bits(fq2(x), x)
    # the gradient's own counter: its first quant_delay calls pass dout through
    dout = f32([5, 6, 7])
    far = f32([100, -100, 0])
    bits(fq2.backward(dout, far), dout)
    bits(fq2.backward(dout, far), [0, 0, 7])


# ---------------------------------------------------------- per-channel axis
def test_per_channel_shape_check_and_rank1():
    fq = FakeQuantWithMinMaxObserver(per_channel=True, channel_axis=1, num_channels=3)
    with pytest.raises(ValueError, match="num_channels"):
        fq(np.zeros((4, 2), F32))
    with pytest.raises(ValueError, match="channel_axis"):
        FakeQuantWithMinMaxObserver(per_channel=True, channel_axis=3, num_channels=3)(
            np.zeros((3, 3), F32))
    # rank-1 input: the axis is forced to 0
    y = fq(f32([0.5, -7, 1]))
    assert y.shape == (3,)
    with pytest.raises(ValueError, match="num_channels"):
        fq(f32([0.5, 1]))


def test_per_channel_training_channel_axis():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 4, 5)).astype(F32)
    for axis in (0, 1, 2, 3):
        n = x.shape[axis]
        fq = FakeQuantWithMinMaxObserver(per_channel=True, channel_axis=axis, num_channels=n,
                                         ema=True, ema_decay=0.9).set_train()
        y = fq(x)
        lo, hi = ref_update(np.full(n, -6, F32), np.full(n, 6, F32), x, True, 0.9, axis)
        bits(fq.minq, lo), bits(fq.maxq, hi)
        nmin, nmax, s = ref_nudge(lo, hi, 0, 255, False)
        bits(y, ref_forward(x, bshape(nmin, x, axis), bshape(nmax, x, axis), bshape(s, x, axis)))


# ---------------------------------------------------------------- edge cases
def test_degenerate_range_gives_zeros():
    fq = FakeQuantWithMinMaxObserver().set_train()
    y = fq(np.zeros((2, 3), F32))
    bits(fq.minq, [0]), bits(fq.maxq, [0])
    bits(y, np.zeros((2, 3)))
    fq.set_train(False)
    bits(fq(f32([1, -2, 0, np.nan]))[:3], [0, 0, 0])
    bits(fq.backward(f32([1, 1, 1]), f32([1, 0, -1])), [0, 1, 0])


def test_positive_batch_includes_zero():
    fq = FakeQuantWithMinMaxObserver().set_train()
    fq(f32([1, 2, 3]))
    bits(fq.minq, [0]), bits(fq.maxq, [3])


def test_nan_batch_is_skipped_with_warning():
    fq = FakeQuantWithMinMaxObserver().set_train()
    fq(DOC_X)
    with pytest.warns(RuntimeWarning, match="NaN"):
        y = fq(f32([np.nan, 10, -10]))
    bits(fq.minq, [-2]), bits(fq.maxq, [2])
    assert np.isnan(y[0])
    prop = FakeQuantWithMinMaxObserver(nan_policy="propagate").set_train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prop(f32([np.nan, 1]))
    assert np.isnan(prop.minq[0])
    with pytest.raises(ValueError):
        FakeQuantWithMinMaxObserver(nan_policy="raise").set_train()(f32([np.nan]))


def test_dtypes():
    fq = FakeQuantWithMinMaxObserver(min_init=-1, max_init=3)
    y16 = fq(X9.astype(np.float16))
    assert y16.dtype == np.float16
    bits(y16.astype(F32), fq(X9.astype(np.float16).astype(F32)).astype(np.float16).astype(F32))
    y64 = fq(X9.astype(np.float64))
    assert y64.dtype == np.float64
    assert np.allclose(y64, fq(X9), atol=1e-6)


def test_minq_maxq_are_parameters_updated_in_place():
    fq = FakeQuantWithMinMaxObserver(per_channel=True, channel_axis=0, num_channels=2)
    assert fq.minq.shape == (2,) and fq.minq.dtype == F32
    held = fq.minq
    fq.set_train()
    fq(f32([[1, -1], [2, 3]]))
    assert fq.minq is held
    bits(held, [-1, 0])
    bits(fq.maxq, [1, 3])


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(min_init="a"), TypeError, "min_init"),
    (dict(max_init=None), TypeError, "max_init"),
    (dict(min_init=True), TypeError, "min_init"),
    (dict(min_init=6, max_init=6), MindSporeArgumentError, "greater than 'min_init'"),
    (dict(min_init=7), MindSporeArgumentError, "greater"),
    (dict(quant_delay=1.5), TypeError, "quant_delay"),
    (dict(quant_delay=-1), MindSporeArgumentError, "quant_delay"),
    (dict(ema_decay=1), TypeError, "ema_decay"),
    (dict(ema_decay=1.5), ValueError, "ema_decay"),
    (dict(ema=True, ema_decay=0.0), ValueError, "should set together"),
    (dict(ema=1), TypeError, "ema"),
    (dict(symmetric="yes"), TypeError, "symmetric"),
    (dict(narrow_range=None), TypeError, "narrow_range"),
    (dict(per_channel=1), TypeError, "per_channel"),
    (dict(channel_axis=-1), ValueError, "channel_axis"),
    (dict(channel_axis=1.0), TypeError, "channel_axis"),
    (dict(num_channels=0), ValueError, "num_channels"),
    (dict(quant_dtype=8), TypeError, "quant_dtype"),
    (dict(min_init=[-1, -2]), ValueError, "length"),
    (dict(min_init=[-1], per_channel=True, num_channels=2), ValueError, "num_channels"),
    (dict(min_init=[-1, 7], max_init=[1, 6], per_channel=True, num_channels=2),
     MindSporeArgumentError, "greater"),
    (dict(nan_policy="ignore"), ValueError, "nan_policy"),
])
def test_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        FakeQuantWithMinMaxObserver(**kwargs)


def test_seed_page_error_types_both_hold():
    # the seed page says TypeError, MindSpore's code raises ValueError
    for kwargs in (dict(min_init=1, max_init=1), dict(quant_delay=-3)):
        with pytest.raises(TypeError):
            FakeQuantWithMinMaxObserver(**kwargs)
        with pytest.raises(ValueError):
            FakeQuantWithMinMaxObserver(**kwargs)


def test_quant_dtype_enum():
    assert [d.num_bits for d in QuantDtype] == [2, 3, 4, 5, 6, 7, 8] * 2
    assert QuantDtype.is_signed(QuantDtype.INT4) and not QuantDtype.is_signed(QuantDtype.UINT4)
    assert QuantDtype.switch_signed(QuantDtype.UINT8) is QuantDtype.INT8
    assert str(QuantDtype.INT8) == "INT8"
    fq = FakeQuantWithMinMaxObserver(quant_dtype="uint4")
    assert fq.quant_dtype is QuantDtype.UINT4 and fq.quant_max == 15
    for d in QuantDtype:  # every width 2..8 is accepted (the specification's decisions)
        assert FakeQuantWithMinMaxObserver(quant_dtype=d).quant_max == 2 ** d.num_bits - 1


def test_list_init_accepted():
    fq = FakeQuantWithMinMaxObserver(min_init=[-1.5], max_init=[2])
    bits(fq.minq, [-1.5]), bits(fq.maxq, [2])
    fq = FakeQuantWithMinMaxObserver(min_init=-1, max_init=[2, 3], per_channel=True,
                                     num_channels=2)
    bits(fq.minq, [-1, -1]), bits(fq.maxq, [2, 3])


# ----------------------------------------------------- randomized vs model
def _tie_inputs(rng, shape, nmin, nmax, scale, axis, x):
    """Replace a third of x with values on exact .5 ties of the grid."""
    k = rng.integers(-3, 260, size=shape).astype(F32)
    b = lambda p: bshape(p, x, axis)  # noqa: E731
    ties = ((k + F32(0.5)) * b(scale) + b(nmin)).astype(F32)
    sel = rng.random(shape) < 0.33
    return np.where(sel, ties, x).astype(F32)


@pytest.mark.parametrize("seed", range(40))
def test_random_against_model(seed):
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(v) for v in rng.integers(1, 6, size=ndim))
    per_channel = bool(rng.integers(2))
    axis = int(rng.integers(ndim)) if per_channel else None
    if per_channel and ndim == 1:
        axis = 0
    n = shape[axis] if per_channel else 1
    dtype = QuantDtype[f"{'U' if rng.integers(2) else ''}INT{int(rng.integers(2, 9))}"]
    ema = bool(rng.integers(2))
    decay = float(rng.choice([0.5, 0.9, 0.999, 0.1]))
    symmetric, narrow = bool(rng.integers(2)), bool(rng.integers(2))
    lo0 = rng.uniform(-5, 0.5, n).astype(F32)
    hi0 = (lo0 + rng.uniform(0.01, 6, n)).astype(F32)
    fq = FakeQuantWithMinMaxObserver(
        min_init=[float(v) for v in lo0], max_init=[float(v) for v in hi0], ema=ema,
        ema_decay=decay, per_channel=per_channel, channel_axis=axis if per_channel else 1,
        num_channels=n, quant_dtype=dtype, symmetric=symmetric, narrow_range=narrow)
    qmin, qmax = int(narrow), 2 ** dtype.num_bits - 1
    lo, hi = lo0.copy(), hi0.copy()
    for step in range(3):
        train = step < 2
        fq.set_train(train)
        x = (rng.normal(size=shape) * rng.uniform(0.1, 4)).astype(F32)
        if train:
            lo, hi = ref_update(lo, hi, x, ema, decay, axis)
            lo, hi = np.asarray(lo, F32).reshape(-1), np.asarray(hi, F32).reshape(-1)
        nmin, nmax, s = ref_nudge(lo, hi, qmin, qmax, symmetric)
        if not train:
            x = _tie_inputs(rng, shape, nmin, nmax, s, axis, x)
        y = fq(x)
        bits(fq.minq, lo), bits(fq.maxq, hi)
        b = lambda p: bshape(p, x, axis)  # noqa: E731
        bits(y, ref_forward(x, b(nmin), b(nmax), b(s)))
        g = rng.normal(size=shape).astype(F32)
        mask = (x >= b(nmin)) & (x <= b(nmax))
        bits(fq.backward(g, x), np.where(mask, g, F32(0)))
