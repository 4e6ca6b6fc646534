"""torch's learnable (LSQ) fake quant and its backward."""

import numpy as np

from ... import ops as _ops
from ... import torch_numerics as TN
from .._errors import RuntimeTypeError, RuntimeValueError
from .functional import (
    _ZP_RANGE_MSG,
    _dim_size,
    _int_arg,
    _item_float,
    fake_quantize_per_channel_affine,
    fake_quantize_per_tensor_affine,
)

F32 = np.float32


def _lsq_check(quant_min, quant_max, func):
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    return qmin, qmax


def _first_float(value, name, func):
    """torch's ``t[0].item<float>()``."""
    a = np.asarray(value)
    if a.ndim == 0:
        raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                         "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
    if a.shape[0] == 0:
        raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
    return _item_float(a[0], name, func)


def fake_quantize_learnable_per_tensor_affine(x, scale, zero_point, quant_min, quant_max,
                                              grad_factor=1.0):
    """``torch._fake_quantize_learnable_per_tensor_affine``: zero point
    ``int64(clamp(nearbyint(f32(zp[0])), f32(qmin), f32(qmax)))``, then the
    per-tensor kernel (which checks the range)."""
    func = "fake_quantize_learnable_per_tensor_affine"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    s = _first_float(scale, "scale", func)
    zp = _clamp_trunc(np.rint(_first_float(zero_point, "zero_point", func)), qmin, qmax)
    return fake_quantize_per_tensor_affine(x, float(s), zp, qmin, qmax)


def _clamp_trunc(v, qmin, qmax):
    """``int64(min(max(v, f32(qmin)), f32(qmax)))`` as torch's
    ``_get_zero_point_from_tensor`` (float32, NaN -> INT64_MIN on x86)."""
    v = F32(v)
    lo, hi = F32(qmin), F32(qmax)
    c = lo if v < lo else v
    c = hi if hi < c else c
    if not np.isfinite(c):
        return -2 ** 63
    return int(np.trunc(np.float64(c)))


def _rounded_zero_points(zero_point, qmin, qmax):
    """``zero_point.round().clamp_(qmin, qmax)`` in the zero point's own
    dtype (bounds cast to it, NaN kept)."""
    z = np.asarray(zero_point)
    if z.dtype.kind != "f":
        z = z.astype(F32)
    with np.errstate(over="ignore"):
        lo, hi = z.dtype.type(qmin), z.dtype.type(qmax)
    r = np.rint(z)
    r = np.where(r < lo, lo, r)
    return np.where(hi < r, hi, r).astype(z.dtype)


def fake_quantize_learnable_per_channel_affine(x, scale, zero_point, axis, quant_min,
                                               quant_max, grad_factor=1.0):
    """``torch._fake_quantize_learnable_per_channel_affine``: zero point
    ``zp.round().clamp(qmin, qmax).int()``, then the per-channel kernel."""
    func = "fake_quantize_learnable_per_channel_affine"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    zi = TN.x86_int32(_rounded_zero_points(zero_point, qmin, qmax))
    return fake_quantize_per_channel_affine(x, scale, zi.reshape(np.shape(zero_point)), axis,
                                            qmin, qmax)


def _lsq_grads(dY, x, s, zb, qmin, qmax, gf, axis, func):
    """Per-element LSQ gradients (torch.md 5), torch's CPU kernel as compiled
    (FMA contraction):

        xq = int64(rint(fmaf(x, inv, zb)))            x86 conversion
        in = qmin <= xq <= qmax                        int64 compare
        d  = f32(clamp(xq) - zb)   (exact int64 difference per tensor;
                                    float32(q) - zb per channel, float zb)
        dX = dY * in
        dS = in ? f32(f32(f32(dY * fmaf(d, s, -x)) * inv) * gf)
                : f32(f32(dY * f32(q_bound - zb)) * gf)
        dZ = in ? 0 : f32(f32(f32(-dY) * s) * gf)
    """
    with np.errstate(all="ignore"):
        shape = [1] * x.ndim
        if axis is not None:
            shape[axis] = x.shape[axis]
        s32 = s.astype(F32).reshape(shape)
        z64 = zb.reshape(shape)
        z32 = z64.astype(F32)         # the fma addend: zb as a float
        inv = (F32(1) / s32).astype(F32)
        x = x.astype(F32, copy=False)
        xq = TN.x86_int64(np.rint(TN.fma_f32(x, inv, z32)))
        mask = (xq >= qmin) & (xq <= qmax)
        q = np.clip(xq, qmin, qmax)
        gf = F32(gf)
        if axis is None:   # int64 zero point: exact integer differences
            zi = int(z64.item())
            dsmall, dbig = F32(qmin - zi), F32(qmax - zi)
            qz = (q - zi).astype(F32)
        else:              # float zero point: float32 differences
            dsmall = (F32(qmin) - z32).astype(F32)
            dbig = (F32(qmax) - z32).astype(F32)
            qz = (q.astype(F32) - z32).astype(F32)
        diff = TN.fma_f32(qz, np.broadcast_to(s32, qz.shape), -x)
        dX = _ops.ste_backward(dY, mask)
        inside = (((dY * diff).astype(F32) * inv).astype(F32) * gf).astype(F32)
        outside = (np.where(xq < qmin, (dY * dsmall).astype(F32),
                            (dY * dbig).astype(F32)) * gf).astype(F32)
        dS = np.where(mask, inside, outside).astype(F32)
        dZ = np.where(mask, F32(0), ((-dY * s32).astype(F32) * gf).astype(F32)).astype(F32)
    return dX, dS, dZ


def _lsq_f32(arrays):
    """torch's ``TORCH_CHECK(t.scalar_type() == ScalarType::Float)`` per input."""
    for name, a in arrays:
        if a.dtype != np.float32:
            raise RuntimeTypeError(
                f"Expected {name}.scalar_type() == ScalarType::Float to be true, "
                "but got false.")


def fake_quantize_learnable_per_tensor_affine_backward(grad, x, scale, zero_point, quant_min,
                                                       quant_max, grad_factor=1.0):
    """``torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward``
    -> ``(dX, dScale[1], dZeroPoint[1])``.

    Backward zero point ``zb = trunc(clamp(f32(zp + 0.5), qmin, qmax))`` (not
    the forward one); per element ``xq = int64(rint(fmaf(x, inv, zb)))``::

        dX = dY * (qmin <= xq <= qmax)
        xq < qmin: dS = dY * (qmin - zb) * gf;  dZ = -dY * s * gf
        xq > qmax: dS = dY * (qmax - zb) * gf;  dZ = -dY * s * gf
        else:      dS = dY * fmaf(f32(xq - zb), s, -x) * inv * gf;  dZ = 0

    summed to shape [1] (in float64, rounded once; ``quantcore.torch``
    sums with torch's own reduction instead).  Empty x returns ``(x, scale,
    zero_point)`` (torch's bug).
    """
    dX, dS, dZ, summed = _lsq_terms_per_tensor(grad, x, scale, zero_point, quant_min,
                                               quant_max, grad_factor)
    if summed:
        return dX, dS, dZ
    return (dX, np.array([dS.sum(dtype=np.float64)], dtype=F32),
            np.array([dZ.sum(dtype=np.float64)], dtype=F32))


def _lsq_terms_per_tensor(grad, x, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    """The per-tensor LSQ backward before its sums: torch's checks in
    torch's order, then ``(dX, dScale_vec, dZeroPoint_vec, False)`` per
    element (the vectors torch sums), or ``(x, scale, zero_point, True)``
    for an empty x (torch's early return)."""
    func = "fake_quantize_learnable_per_tensor_affine_backward"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    s = _first_float(scale, "scale", func)
    zb = _clamp_trunc(F32(_first_float(zero_point, "zero_point", func) + F32(0.5)), qmin,
                      qmax)
    g, xa, sa, za = (np.asarray(v) for v in (grad, x, scale, zero_point))
    _lsq_f32([("dY", g), ("X", xa), ("scale", sa), ("zero_point", za)])
    if g.size != xa.size:
        raise RuntimeValueError("`X` and `dY` are not the same size")
    if not (qmin <= 0 and qmax >= 0):
        raise RuntimeValueError("`quant_min` should be less than or         equal to "
                                "`quant_max`, and the quantization range should include 0.")
    if not qmin <= zb <= qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    if xa.size == 0:
        return xa, sa, za, True
    if g.shape != xa.shape:   # torch's TensorIterator broadcasts X and dY
        try:
            shape = np.broadcast_shapes(g.shape, xa.shape)
        except ValueError as exc:
            raise RuntimeValueError(f"{func}: X {xa.shape} and dY {g.shape} do not "
                                    "broadcast") from exc
        g, xa = np.broadcast_to(g, shape), np.broadcast_to(xa, shape)
    return _lsq_grads(g, xa, np.array([float(s)]), np.array([float(zb)]), qmin, qmax,
                      grad_factor, None, func) + (False,)


def fake_quantize_learnable_per_channel_affine_backward(grad, x, scale, zero_point, axis,
                                                        quant_min, quant_max, grad_factor=1.0):
    """``torch.ops.aten._fake_quantize_learnable_per_channel_affine_backward``
    -> ``(dX, dScale[C], dZeroPoint[C])``; zero point ``clamp(rint(zp))``
    (float), otherwise the per-tensor formulas per channel, summed over the
    non-axis dimensions (a 1-D x sums everything: 0-d results; float64
    sums rounded once)."""
    dX, dS, dZ, summed = _lsq_terms_per_channel(grad, x, scale, zero_point, axis, quant_min,
                                                quant_max, grad_factor)
    if summed:
        return dX, dS, dZ
    if dX.ndim == 1:
        # torch sums a 1-D input to 0-d gradients
        return (dX, np.asarray(dS.sum(dtype=np.float64), dtype=F32),
                np.asarray(dZ.sum(dtype=np.float64), dtype=F32))
    other = _lsq_sum_axes(dX.ndim, axis)
    return (dX, dS.sum(axis=other, dtype=np.float64).astype(F32),
            dZ.sum(axis=other, dtype=np.float64).astype(F32))


def _lsq_sum_axes(ndim, axis):
    """The dimensions the per-channel LSQ backward sums over (all but axis)."""
    return tuple(d for d in range(ndim) if d != axis)


def _lsq_terms_per_channel(grad, x, scale, zero_point, axis, quant_min, quant_max,
                           grad_factor=1.0):
    """The per-channel LSQ backward before its sums, as
    :func:`_lsq_terms_per_tensor` (checks in torch's order)."""
    func = "fake_quantize_learnable_per_channel_affine_backward"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    g, xa, sa, za = (np.asarray(v) for v in (grad, x, scale, zero_point))
    zr = _rounded_zero_points(za, qmin, qmax)
    _lsq_f32([("dY_", g), ("X_", xa), ("scale_", sa), ("zero_point_", za)])
    if g.shape != xa.shape:
        raise RuntimeValueError("`X` and `dY` are not the same size")
    if not (qmin <= 0 and qmax >= 0):
        raise RuntimeValueError("Expecting `quant_min` <= 0 and `quant_max` >= 0")
    if sa.ndim != 1:
        raise RuntimeValueError("scale should be a 1-D tensor")
    if za.ndim != 1:
        raise RuntimeValueError("zero point should be a 1-D tensor")
    if sa.size != za.size:
        raise RuntimeValueError("scale and zero-point need to have the same dimensions")
    axis = _int_arg(axis, "axis", func)
    if sa.size != _dim_size(xa, axis):
        raise RuntimeValueError("dimensions of scale and zero-point are not consistent with "
                                "input tensor")
    if zr.size == 0:
        raise RuntimeValueError("aminmax(): cannot compute aminmax over an empty dimension as "
                                "the operation has no identity.")
    if np.isnan(zr).any() or zr.min() < qmin or zr.max() > qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    if not 0 <= axis < xa.ndim:
        raise RuntimeValueError("`axis` must be between 0 and number of dimensions of input")
    if xa.size == 0:
        return xa, sa, za, True
    return _lsq_grads(g, xa, sa.astype(np.float64), zr.astype(np.float64), qmin, qmax,
                      grad_factor, axis, func) + (False,)

