"""torch's learnable (LSQ) fake quant and its backward."""

import numpy as np

from ... import _arrays as A
from ... import ops as _ops
from ... import torch_numerics as TN
from .._errors import RuntimeTypeError, RuntimeValueError
from .functional import (
    _ZP_RANGE_MSG,
    _check_channel_qparams,
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
    """torch's ``t[0].item<float>()`` (of a device array too: one value is
    read, where torch synchronises as well)."""
    a = np.asarray(A.to_host(value))
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
    dtype (bounds cast to it, NaN kept); a device array's few values are
    read."""
    z = np.asarray(A.to_host(zero_point))
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
    return fake_quantize_per_channel_affine(x, scale, zi, axis,
                                            qmin, qmax)


def _tensor_args(grad, x, scale, zero_point):
    """``grad`` and ``x`` as arrays on their device (cupy stays cupy); the
    few-value ``scale`` / ``zero_point`` as numpy (copied from the device)."""
    return (grad if A.is_cupy_array(grad) else np.asarray(grad),
            x if A.is_cupy_array(x) else np.asarray(x),
            np.asarray(A.to_host(scale)), np.asarray(A.to_host(zero_point)))


def _as_given(value, host):
    """torch's early return hands back its own tensor: a device array as
    given, anything else as the numpy array read from it."""
    return value if A.is_cupy_array(value) else host


def _lsq_grads(dY, x, s, zb, qmin, qmax, gf, axis, func):
    """Per-element LSQ gradients (torch.md 5), torch's CPU kernel as compiled
    (FMA contraction); cupy input runs quantcore_gpu's ``lsq_grads`` (its
    twin in lsq.cu) on the device:

        xq = int64(rint(fmaf(x, inv, zb)))            x86 conversion
        in = qmin <= xq <= qmax                        int64 compare
        d  = f32(clamp(xq) - zb)   (exact int64 difference per tensor;
                                    float32(q) - zb per channel, float zb)
        dX = dY * in
        dS = in ? f32(f32(f32(dY * fmaf(d, s, -x)) * inv) * gf)
                : f32(f32(dY * f32(q_bound - zb)) * gf)
        dZ = in ? 0 : f32(f32(f32(-dY) * s) * gf)
    """
    if A.is_cupy_array(dY) or A.is_cupy_array(x):
        return _lsq_grads_device(dY, x, s, zb, qmin, qmax, gf, axis)
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


def _lsq_grads_device(dY, x, s, zb, qmin, qmax, gf, axis):
    """:func:`_lsq_grads` on the device: (dX, dS, dZ) as cupy arrays of x's shape."""
    xp = A.array_module(x if A.is_cupy_array(x) else dY)
    shape = x.shape
    g, xa = (xp.ascontiguousarray(xp.asarray(v, dtype=F32)).reshape(-1) for v in (dY, x))
    dX, dS, dZ = (xp.empty_like(xa) for _ in range(3))
    C = 1 if axis is None else shape[axis]
    inner = 1 if axis is None else int(np.prod(shape[axis + 1:], dtype=np.int64))
    A.gpu_kernels("fake_quantize_learnable_backward").lsq_grads(
        g, xa, dX, dS, dZ, C, inner, np.asarray(s).astype(F32), zb, qmin, qmax, gf,
        axis is None)
    return dX.reshape(shape), dS.reshape(shape), dZ.reshape(shape)


def _lsq_sums(terms, axis):
    """torch's sums of an LSQ term vector, in float64 in numpy's pairwise
    order (on the terms' device), rounded once to float32: over everything
    (``axis`` None: shape [1]; a 1-D x per channel: shape []) or over every
    dimension but ``axis`` (shape [C])."""
    xp = A.array_module(terms)
    if axis is None or terms.ndim == 1:
        total = A.astype_exact(A.sum_rows(terms.reshape(1, -1), np.float64), F32)
        return total if axis is None else total.reshape(())
    order = (axis,) + _lsq_sum_axes(terms.ndim, axis)
    rows = xp.ascontiguousarray(terms.transpose(order)).reshape(terms.shape[axis], -1)
    return A.astype_exact(A.sum_rows(rows, np.float64), F32)


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

    summed to shape [1] (in float64 in numpy's pairwise order, rounded once;
    ``quantcore.torch`` sums with torch's own reduction instead).  Cupy
    input is computed on its device (``scale[0]`` and ``zero_point[0]`` are
    read, as torch reads them).  Empty x returns ``(x, scale,
    zero_point)`` (torch's bug).
    """
    dX, dS, dZ, summed = _lsq_terms_per_tensor(grad, x, scale, zero_point, quant_min,
                                               quant_max, grad_factor)
    if summed:
        return dX, dS, dZ
    return dX, _lsq_sums(dS, None), _lsq_sums(dZ, None)


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
    g, xa, sa, za = _tensor_args(grad, x, scale, zero_point)
    _lsq_f32([("dY", g), ("X", xa), ("scale", sa), ("zero_point", za)])
    if g.size != xa.size:
        raise RuntimeValueError("`X` and `dY` are not the same size")
    if not (qmin <= 0 and qmax >= 0):
        raise RuntimeValueError("`quant_min` should be less than or         equal to "
                                "`quant_max`, and the quantization range should include 0.")
    if not qmin <= zb <= qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    if xa.size == 0:
        return xa, _as_given(scale, sa), _as_given(zero_point, za), True
    if g.shape != xa.shape:   # torch's TensorIterator broadcasts X and dY
        try:
            shape = np.broadcast_shapes(g.shape, xa.shape)
        except ValueError as exc:
            raise RuntimeValueError(f"{func}: X {xa.shape} and dY {g.shape} do not "
                                    "broadcast") from exc
        xp = A.array_module(xa if A.is_cupy_array(xa) else g)
        g, xa = xp.broadcast_to(g, shape), xp.broadcast_to(xa, shape)
    return _lsq_grads(g, xa, np.array([float(s)]), np.array([float(zb)]), qmin, qmax,
                      grad_factor, None, func) + (False,)


def fake_quantize_learnable_per_channel_affine_backward(grad, x, scale, zero_point, axis,
                                                        quant_min, quant_max, grad_factor=1.0):
    """``torch.ops.aten._fake_quantize_learnable_per_channel_affine_backward``
    -> ``(dX, dScale[C], dZeroPoint[C])``; zero point ``clamp(rint(zp))``
    (float), otherwise the per-tensor formulas per channel, summed over the
    non-axis dimensions (a 1-D x sums everything: 0-d results; float64
    sums in numpy's pairwise order per channel, rounded once).  Cupy input
    is computed on its device (the per-channel scale and zero point are
    read)."""
    dX, dS, dZ, summed = _lsq_terms_per_channel(grad, x, scale, zero_point, axis, quant_min,
                                                quant_max, grad_factor)
    if summed:
        return dX, dS, dZ
    axis = _int_arg(axis, "axis", "fake_quantize_learnable_per_channel_affine_backward")
    return dX, _lsq_sums(dS, axis), _lsq_sums(dZ, axis)


def _lsq_sum_axes(ndim, axis):
    """The dimensions the per-channel LSQ backward sums over (all but axis)."""
    return tuple(d for d in range(ndim) if d != axis)


def _lsq_terms_per_channel(grad, x, scale, zero_point, axis, quant_min, quant_max,
                           grad_factor=1.0):
    """The per-channel LSQ backward before its sums, as
    :func:`_lsq_terms_per_tensor` (checks in torch's order)."""
    func = "fake_quantize_learnable_per_channel_affine_backward"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    g, xa, sa, za = _tensor_args(grad, x, scale, zero_point)
    zr = _rounded_zero_points(za, qmin, qmax)
    _lsq_f32([("dY_", g), ("X_", xa), ("scale_", sa), ("zero_point_", za)])
    if g.shape != xa.shape:
        raise RuntimeValueError("`X` and `dY` are not the same size")
    if not (qmin <= 0 and qmax >= 0):
        raise RuntimeValueError("Expecting `quant_min` <= 0 and `quant_max` >= 0")
    axis = _check_channel_qparams(sa, za, xa, axis, func)
    if zr.size == 0:
        raise RuntimeValueError("aminmax(): cannot compute aminmax over an empty dimension as "
                                "the operation has no identity.")
    if np.isnan(zr).any() or zr.min() < qmin or zr.max() > qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    if not 0 <= axis < xa.ndim:
        raise RuntimeValueError("`axis` must be between 0 and number of dimensions of input")
    if xa.size == 0:
        return xa, _as_given(scale, sa), _as_given(zero_point, za), True
    return _lsq_grads(g, xa, sa.astype(np.float64), zr.astype(np.float64), qmin, qmax,
                      grad_factor, axis, func) + (False,)

