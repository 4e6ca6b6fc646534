"""quantcore.jax: the fake-quant functions under jax.jit, jax.grad and
jax.vmap give quantcore's bits and the straight-through gradient."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import quantcore as qc  # noqa: E402
import quantcore.jax as qj  # noqa: E402

from reference import assert_bits_equal  # noqa: E402

F32 = np.float32


@pytest.fixture
def x():
    rng = np.random.default_rng(0)
    v = (rng.integers(-400, 400, size=(7, 6)) * 0.025).astype(F32)  # ties on the grid
    v += (rng.random(v.shape) < 0.5) * rng.normal(size=v.shape).astype(F32)
    v[0, 0], v[1, 1], v[2, 2] = np.nan, np.inf, -0.0
    return v


CASES = {
    "affine": (lambda v: qj.fake_quant(v, 0.05, 3, -128, 127, rounding="half_up"),
               lambda v: qc.fake_quant_with_mask(v, 0.05, 3, -128, 127, rounding="half_up")),
    "affine per channel": (
        lambda v: qj.fake_quant(v, np.linspace(0.01, 0.2, 6), np.arange(6), 0, 15, axis=1),
        lambda v: qc.fake_quant_with_mask(v, np.linspace(0.01, 0.2, 6), np.arange(6), 0, 15,
                                          axis=1)),
    "amax": (lambda v: qj.fake_quant_amax(v, 2.5, 4),
             lambda v: qc.fake_quant_amax(v, 2.5, 4, return_mask=True)),
    "nudged": (lambda v: qj.fake_quant_nudged(v, -1.0, 1.0, 2 / 255),
               lambda v: qc.fake_quant_nudged(v, -1.0, 1.0, 2 / 255, return_mask=True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_and_grad(name, x):
    """Under jit: quantcore's output bits; jit(grad(sum(w * f(x)))) is
    ``w * mask`` (the STE), bit for bit."""
    ours, ref = CASES[name]
    want, mask = ref(x)
    assert_bits_equal(np.asarray(jax.jit(ours)(jnp.asarray(x))), want, name)
    assert_bits_equal(np.asarray(ours(x)), want, name)  # eager, numpy input
    w = np.random.default_rng(1).normal(size=x.shape).astype(F32)
    w[3, 3] = np.nan  # NaN * 0 stays NaN where the mask is 0
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.asarray(w) * ours(v))))(jnp.asarray(x))
    with np.errstate(invalid="ignore"):
        assert_bits_equal(np.asarray(g), (w * np.asarray(mask, F32)).astype(F32), name)


def test_traced_parameters_and_vmap(x):
    """A traced scale works (it reaches the kernel rounded to float32) and
    gets a zero cotangent; vmap maps the callback over the batch."""
    f = jax.jit(jax.grad(lambda v, s: jnp.sum(qj.fake_quant(v, s, 0, -8, 7)), argnums=(0, 1)))
    gx, gs = f(jnp.asarray(x), jnp.float32(0.25))
    _, mask = qc.fake_quant_with_mask(x, 0.25, 0, -8, 7)
    assert_bits_equal(np.asarray(gx), mask.astype(F32))
    assert float(gs) == 0.0
    y = jax.jit(lambda v, s: qj.fake_quant(v, s, 0, -8, 7))(jnp.asarray(x), jnp.float32(0.25))
    assert_bits_equal(np.asarray(y), qc.fake_quant(x, 0.25, 0, -8, 7))
    batched = jax.vmap(lambda v: qj.fake_quant_amax(v, 1.5))(jnp.asarray(x))
    assert_bits_equal(np.asarray(batched), qc.fake_quant_amax(x, 1.5))


def test_errors_reach_the_caller(x):
    with pytest.raises(Exception, match="quant_min must be < quant_max"):
        jax.block_until_ready(qj.fake_quant(jnp.asarray(x), 0.1, 0, 5, 5))
