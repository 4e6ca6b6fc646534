"""JAX wrappers: quantcore's fake quantization under ``jax.jit``,
``jax.grad`` and ``jax.vmap`` (optional: needs ``jax``).

Each function is a ``jax.custom_vjp`` whose forward calls quantcore's CPU
kernels through ``jax.pure_callback`` (the values reach the host as numpy
arrays, so tracing never needs a concrete value: no
``ConcretizationTypeError``), and whose backward is the straight-through
estimator::

    dx = g * mask,   mask = the kernel's "inside the range" mask

(a multiplication, by quantcore's ``ste_backward`` kernel through a second
callback: NaN * 0 is NaN and -g * 0 is -0.0, as in the frameworks; XLA
would turn a jax-side ``g * mask`` into a select).  Quantization parameters given as
Python numbers or numpy arrays are fixed (closed over, in their own
precision, exactly as the functional API reads them); given as jax arrays
(e.g. traced parameters) they are passed through the callback, rounded to
jax's dtype (float32 unless x64 is enabled), and get a zero cotangent --
the STE has no gradient for them.  Results equal the functional API's on
the same values, bit for bit.  ``jax.vmap`` maps the callback over the
batch sequentially.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import ops

__all__ = ["fake_quant", "fake_quant_amax", "fake_quant_nudged"]


def _is_traced(value):
    """True for jax arrays and tracers (passed through the callback)."""
    return isinstance(value, (jax.Array, jax.core.Tracer))


def _straight_through(host, x, params):
    """``host(x, *params) -> (out, mask)`` as a differentiable jax function
    of ``x`` (STE) and of the jax-array entries of ``params`` (zero)."""
    x = jnp.asarray(x)
    dynamic = [i for i, p in enumerate(params) if _is_traced(p)]
    result_types = (jax.ShapeDtypeStruct(x.shape, x.dtype),
                    jax.ShapeDtypeStruct(x.shape, jnp.bool_))

    def callback(xv, *values):
        merged = list(params)
        for i, v in zip(dynamic, values):
            merged[i] = np.asarray(v)
        out, mask = host(np.asarray(xv), *merged)
        return np.asarray(out, dtype=x.dtype), np.asarray(mask, dtype=np.bool_)

    def run(xv, *values):
        return jax.pure_callback(callback, result_types, xv, *values,
                                 vmap_method="sequential")

    @jax.custom_vjp
    def apply(xv, *values):
        return run(xv, *values)[0]

    def forward(xv, *values):
        out, mask = run(xv, *values)
        return out, (mask, values)

    def backward(residuals, g):
        mask, values = residuals
        # quantcore's ste kernel on the host: XLA would turn g * mask into a
        # select (0 for NaN * 0 and -g * 0)
        dx = jax.pure_callback(_ste_host, jax.ShapeDtypeStruct(g.shape, g.dtype), g, mask,
                               vmap_method="sequential")
        return (dx,) + tuple(jnp.zeros_like(v) for v in values)

    apply.defvjp(forward, backward)
    return apply(x, *(params[i] for i in dynamic))


def _ste_host(g, mask):
    g = np.asarray(g)
    return np.asarray(ops.ste_backward(g, np.asarray(mask)), dtype=g.dtype)


def fake_quant(x, scale, zero_point, quant_min, quant_max, *, axis=None, rounding="half_even",
               zero_point_add="after_rounding"):
    """:func:`quantcore.fake_quant` for jax arrays, with the STE gradient
    (mask of :func:`quantcore.fake_quant_with_mask`)."""
    host = functools.partial(_affine_host, quant_min=quant_min, quant_max=quant_max, axis=axis,
                             rounding=rounding, zero_point_add=zero_point_add)
    return _straight_through(host, x, (scale, zero_point))


def _affine_host(x, scale, zero_point, *, quant_min, quant_max, axis, rounding, zero_point_add):
    return ops.fake_quant_with_mask(x, scale, zero_point, quant_min, quant_max, axis=axis,
                                    rounding=rounding, zero_point_add=zero_point_add)


def fake_quant_amax(x, amax, num_bits=8, *, unsigned=False, narrow_range=True, axis=None):
    """:func:`quantcore.fake_quant_amax` (NVIDIA style) for jax arrays, with
    the STE gradient (``|x| <= amax``)."""
    host = functools.partial(ops.fake_quant_amax, num_bits=num_bits, unsigned=unsigned,
                             narrow_range=narrow_range, axis=axis, return_mask=True)
    return _straight_through(host, x, (amax,))


def fake_quant_nudged(x, nudged_min, nudged_max, scale, *, inv_scale=None, quant_zero=None,
                      formula="tensorflow", scale_op="mul_inverse", axis=None):
    """:func:`quantcore.fake_quant_nudged` (TensorFlow / MindSpore family)
    for jax arrays, with the STE gradient (``nudged_min <= x <= nudged_max``)."""
    host = functools.partial(ops.fake_quant_nudged, inv_scale=inv_scale, quant_zero=quant_zero,
                             formula=formula, scale_op=scale_op, axis=axis, return_mask=True)
    return _straight_through(host, x, (nudged_min, nudged_max, scale))
