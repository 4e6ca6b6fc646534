"""quantcore.compat.tensorflow against live TensorFlow (issue 5).

Runs when ``tensorflow`` (the ``tensorflow`` extra: ``tensorflow-cpu``) is
importable and skips cleanly otherwise.  Outputs and input gradients must be
bit-identical; the ``d_min`` / ``d_max`` sums must be bit-identical when
they are exact (integer gradients) and within a few ulp otherwise (Eigen's
summation order).  TF's InvalidArgumentError must come out as ValueError
with TF's message text.  About 2 s after TensorFlow's import (about 3 s).
"""
import re

import numpy as np
import pytest

import quantcore.compat.tensorflow as tfq
from quantcore.compat.tensorflow import (
    fake_quant_with_min_max_args, fake_quant_with_min_max_args_gradient,
    fake_quant_with_min_max_vars, fake_quant_with_min_max_vars_gradient,
    fake_quant_with_min_max_vars_per_channel,
    fake_quant_with_min_max_vars_per_channel_gradient)

import reference as ref
from test_compat_tensorflow import DOC_X, _trial, f32

tf = pytest.importorskip("tensorflow")
Qt = tf.quantization
F32 = np.float32


def _sums_match(ours, theirs, exact, maxulp=4):
    for a, b in zip(ours, theirs):
        if exact:
            ref.assert_bits_equal(a, b, "gradient sums")
        else:
            np.testing.assert_array_max_ulp(a, b, maxulp=maxulp)


def _compare_all(x, g, mn, mx, cmn, cmx, exact, **kw):
    """Every op and gradient on one input, per tensor (mn, mx) and per
    channel (cmn, cmx along the last axis)."""
    ref.assert_bits_equal(fake_quant_with_min_max_args(x, float(mn), float(mx), **kw),
                          Qt.fake_quant_with_min_max_args(x, float(mn), float(mx), **kw).numpy(),
                          "args")
    ref.assert_bits_equal(
        fake_quant_with_min_max_args_gradient(g, x, float(mn), float(mx), **kw),
        Qt.fake_quant_with_min_max_args_gradient(g, x, float(mn), float(mx), **kw).numpy(),
        "args_gradient")
    ref.assert_bits_equal(fake_quant_with_min_max_vars(x, mn, mx, **kw),
                          Qt.fake_quant_with_min_max_vars(x, mn, mx, **kw).numpy(), "vars")
    ours = fake_quant_with_min_max_vars_gradient(g, x, mn, mx, **kw)
    theirs = [t.numpy() for t in Qt.fake_quant_with_min_max_vars_gradient(g, x, mn, mx, **kw)]
    ref.assert_bits_equal(ours[0], theirs[0], "vars_gradient dx")
    _sums_match(ours[1:], theirs[1:], exact)
    ref.assert_bits_equal(fake_quant_with_min_max_vars_per_channel(x, cmn, cmx, **kw),
                          Qt.fake_quant_with_min_max_vars_per_channel(x, cmn, cmx, **kw).numpy(),
                          "per_channel")
    ours = fake_quant_with_min_max_vars_per_channel_gradient(g, x, cmn, cmx, **kw)
    theirs = [t.numpy() for t in
              Qt.fake_quant_with_min_max_vars_per_channel_gradient(g, x, cmn, cmx, **kw)]
    ref.assert_bits_equal(ours[0], theirs[0], "per_channel_gradient dx")
    _sums_match(ours[1:], theirs[1:], exact)


def _channel_range(rng, d, degenerate):
    cmn = rng.uniform(-6, 0.5, d).astype(F32)
    cmx = (cmn + rng.uniform(0.01, 6, d)).astype(F32)
    if d > 1 and degenerate:
        cmn[0], cmx[0] = 0, 0
    return cmn, cmx


@pytest.mark.parametrize("block", range(4))
def test_live_tensorflow_bit_identical(block):
    """400 random trials (100 per block): num_bits 2..16, narrow_range,
    min > 0, max < 0, inputs on exact .5 ties of the grid."""
    rng = np.random.default_rng(77 + block)
    for _ in range(100):
        x, g, mn, mx, nb, narrow = _trial(rng)
        exact = rng.random() < 0.5
        # integer gradients (both signs) give exact sums; otherwise positive
        # ones, so that "a few ulp" is meaningful (no cancellation)
        g = np.round(g * 4).astype(F32) if exact else np.abs(g)
        cmn, cmx = _channel_range(rng, x.shape[-1], rng.random() < 0.3)
        _compare_all(x, g, mn, mx, cmn, cmx, exact, num_bits=nb, narrow_range=narrow)


@pytest.mark.parametrize("narrow", [False, True])
def test_live_tensorflow_every_num_bits(narrow):
    """Each width 2..16 at least once, with ties on the grid."""
    rng = np.random.default_rng(3 + narrow)
    for nb in range(2, 17):
        x = (rng.normal(size=(6, 5)) * 3).astype(F32)
        mn, mx = F32(rng.uniform(-5, -0.1)), F32(rng.uniform(0.1, 5))
        scale = F32((mx - mn) / F32(2 ** nb - 1 - int(narrow)))
        k = rng.integers(-2 ** min(nb, 10), 2 ** min(nb, 10), size=x.shape).astype(F32)
        x = np.where(rng.random(x.shape) < 0.5, (k + F32(0.5)) * scale, x).astype(F32)
        g = np.round(rng.normal(size=x.shape) * 4).astype(F32)
        cmn, cmx = _channel_range(rng, x.shape[-1], nb % 3 == 0)
        _compare_all(x, g, mn, mx, cmn, cmx, True, num_bits=nb, narrow_range=narrow)


def test_live_tensorflow_special_values():
    x = f32([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e-30, 2, -2])
    g = f32([1, -2, np.nan, -0.0, 4, 5, -6, 7, 8])
    for mn, mx in ((-6.0, 6.0), (-1.0, 1.0), (0.0, 0.0), (2.0, 2.0), (3.0, -3.0), (1.0, 5.0)):
        ref.assert_bits_equal(fake_quant_with_min_max_vars(x, mn, mx),
                              Qt.fake_quant_with_min_max_vars(x, mn, mx).numpy())
        ours = fake_quant_with_min_max_vars_gradient(g, x, mn, mx)
        theirs = Qt.fake_quant_with_min_max_vars_gradient(g, x, mn, mx)
        for a, b in zip(ours, theirs):
            ref.assert_bits_equal(a, b.numpy(), f"vars_gradient {mn}, {mx}")
        if mn < mx:
            ref.assert_bits_equal(fake_quant_with_min_max_args(x, mn, mx),
                                  Qt.fake_quant_with_min_max_args(x, mn, mx).numpy())
            ref.assert_bits_equal(fake_quant_with_min_max_args_gradient(g, x, mn, mx),
                                  Qt.fake_quant_with_min_max_args_gradient(g, x, mn, mx).numpy())
    xs = np.stack([x, x[::-1]], axis=-1)
    gs = np.stack([g, g[::-1]], axis=-1)
    for mn, mx in (([0.0, -1.0], [0.0, 1.0]), ([2.0, 3.0], [2.0, -3.0])):
        ref.assert_bits_equal(fake_quant_with_min_max_vars_per_channel(xs, mn, mx),
                              Qt.fake_quant_with_min_max_vars_per_channel(xs, mn, mx).numpy())
        ours = fake_quant_with_min_max_vars_per_channel_gradient(gs, xs, mn, mx)
        theirs = Qt.fake_quant_with_min_max_vars_per_channel_gradient(gs, xs, mn, mx)
        for a, b in zip(ours, theirs):
            ref.assert_bits_equal(a, b.numpy(), f"per_channel_gradient {mn}, {mx}")


def test_live_tensorflow_spec_vectors():
    """The spec's §2.5 table, recomputed by TensorFlow itself."""
    x9 = f32([-1.5, -1, -0.3, 0, 0.2, 1.1, 2.9, 3, 3.5])
    calls = [
        ("fake_quant_with_min_max_args", (DOC_X,), {}),
        ("fake_quant_with_min_max_vars", (DOC_X, -6.0, 6.0), {}),
        ("fake_quant_with_min_max_vars_per_channel", (DOC_X, [-6.0] * 3, [6.0] * 3), {}),
        ("fake_quant_with_min_max_args", (DOC_X, -2.0, 2.0), {}),
        ("fake_quant_with_min_max_args", (DOC_X, -2.0, 2.0), {"narrow_range": True}),
        ("fake_quant_with_min_max_args", (DOC_X, -2.0, 2.0), {"num_bits": 4}),
        ("fake_quant_with_min_max_vars", (f32([-1, 0, 1]), -1.0, 1.0), {}),
        ("fake_quant_with_min_max_vars", (x9, -1.0, 3.0), {}),
        ("fake_quant_with_min_max_args", (x9, -1.0, 3.0), {}),
        ("fake_quant_with_min_max_vars", (x9, -1.0, 3.0), {"narrow_range": True}),
        ("fake_quant_with_min_max_vars", (x9, -1.0, 3.0), {"num_bits": 4}),
        ("fake_quant_with_min_max_vars_per_channel", (DOC_X, [-2.0, -1.0, 0.0], [2.0, 1.0, 0.0]),
         {}),
        ("fake_quant_with_min_max_vars", (DOC_X, 3.0, -3.0), {}),
        ("fake_quant_with_min_max_vars", (DOC_X, 2.0, 2.0), {}),
        ("fake_quant_with_min_max_vars", (f32([0, 1, 3, 5, 7]), 1.0, 5.0), {"num_bits": 2}),
    ]
    for name, args, kw in calls:
        ref.assert_bits_equal(getattr(tfq, name)(*args, **kw),
                              getattr(Qt, name)(*args, **kw).numpy(), name)


def test_live_tensorflow_large_sums():
    """Long inputs: d_min / d_max within a few ulp of Eigen's summation order."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(64, 1024)).astype(F32) * 3
    g = rng.uniform(0, 1, size=x.shape).astype(F32)
    ours = fake_quant_with_min_max_vars_gradient(g, x, -1.0, 1.0)
    theirs = Qt.fake_quant_with_min_max_vars_gradient(g, x, -1.0, 1.0)
    ref.assert_bits_equal(ours[0], theirs[0].numpy())
    _sums_match(ours[1:], [t.numpy() for t in theirs[1:]], False, maxulp=8)
    ours = fake_quant_with_min_max_vars_per_channel_gradient(g, x, [-1.0] * 1024, [1.0] * 1024)
    theirs = Qt.fake_quant_with_min_max_vars_per_channel_gradient(
        g, x, [-1.0] * 1024, [1.0] * 1024)
    ref.assert_bits_equal(ours[0], theirs[0].numpy())
    _sums_match(ours[1:], [t.numpy() for t in theirs[1:]], False, maxulp=8)


# ---------------------------------------------------------------- errors
_G = "gradient"
ERROR_CASES = [
    ("fake_quant_with_min_max_args", (DOC_X, 1.0, 1.0), {}),
    ("fake_quant_with_min_max_args", (DOC_X, 2.5, 1.0), {}),
    ("fake_quant_with_min_max_args_gradient", (DOC_X, DOC_X, 1.0, 1.0), {}),
    ("fake_quant_with_min_max_args", (DOC_X,), {"num_bits": 1}),
    ("fake_quant_with_min_max_vars", (DOC_X, -1.0, 1.0), {"num_bits": 17}),
    ("fake_quant_with_min_max_vars_per_channel", (DOC_X, [-1.0] * 3, [1.0] * 3), {"num_bits": 0}),
    ("fake_quant_with_min_max_vars_gradient", (DOC_X, DOC_X, -1.0, 1.0), {"num_bits": True}),
    ("fake_quant_with_min_max_vars", (DOC_X, [-1.0], [1.0]), {}),
    ("fake_quant_with_min_max_vars", (DOC_X, -1.0, [1.0]), {}),
    ("fake_quant_with_min_max_vars_gradient", (DOC_X, DOC_X, [-1.0], 1.0), {}),
    ("fake_quant_with_min_max_vars_per_channel", (DOC_X, [-1.0, 1], [1.0, 1]), {}),
    ("fake_quant_with_min_max_vars_per_channel", (DOC_X, [-1.0, 1, 1], [1.0, 1]), {}),
    ("fake_quant_with_min_max_vars_per_channel", (DOC_X, -1.0, 1.0), {}),
    ("fake_quant_with_min_max_vars_per_channel", (DOC_X, [[-1.0] * 3], [[1.0] * 3]), {}),
    ("fake_quant_with_min_max_args_gradient", (DOC_X[0], DOC_X), {}),
    ("fake_quant_with_min_max_vars_gradient", (DOC_X[0], DOC_X, -1.0, 1.0), {}),
    ("fake_quant_with_min_max_vars_per_channel_gradient", (DOC_X[0], DOC_X, [-1.0] * 3,
                                                           [1.0] * 3), {}),
    ("fake_quant_with_min_max_vars_per_channel_gradient", (DOC_X, DOC_X, [-1.0] * 2, [1.0] * 3),
     {}),
    ("fake_quant_with_min_max_args", (DOC_X,), {"narrow_range": 1}),
    ("fake_quant_with_min_max_args", (DOC_X,), {"min": "a"}),
    ("fake_quant_with_min_max_args", (DOC_X,), {"num_bits": "8"}),
]


def _tf_message(exc):
    """TF's message without the ``{{function_node ...}}`` / ``[Op:...]`` decoration."""
    text = str(exc)
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S)


@pytest.mark.parametrize("name,args,kw", ERROR_CASES,
                         ids=[f"{c[0][24:]}-{i}" for i, c in enumerate(ERROR_CASES)])
def test_live_tensorflow_errors(name, args, kw):
    with pytest.raises((tf.errors.InvalidArgumentError, TypeError)) as theirs:
        getattr(Qt, name)(*args, **kw)
    expected = ValueError if isinstance(theirs.value, tf.errors.InvalidArgumentError) else TypeError
    with pytest.raises(expected) as ours:
        getattr(tfq, name)(*args, **kw)
    assert str(ours.value) == _tf_message(theirs.value)
