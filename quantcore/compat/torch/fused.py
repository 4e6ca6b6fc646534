"""``torch.fused_moving_avg_obs_fake_quant``."""

import types

import numpy as np

from ... import _arrays as A
from ... import observers as _obs
from ... import ops as _ops
from ... import qparams as Q
from .._errors import RuntimeTypeError, RuntimeValueError
from .functional import (
    _dim_size,
    _fq_input,
    _int_arg,
    _item_float,
    _item_int,
    _per_tensor_tensor_qparams,
    _torch_dtype_name,
    fake_quantize_per_channel_affine_cachemask,
)

F32 = np.float32


def _rows(arr, ch_axis):
    """``arr`` as torch's per-row fake quant sees it: channel ``ch_axis``
    first, the rest flattened into rows (a 2-D input as it is)."""
    y = arr
    if arr.ndim != 2:
        perm = list(range(arr.ndim))
        perm[ch_axis], perm[0] = 0, ch_axis
        y = arr.transpose(perm)
        if y.ndim < 2:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-max(y.ndim, 1)}, {max(y.ndim, 1) - 1}], but got 1)")
        y = y.reshape(y.shape[0], -1)
    return y


def _need_f32(arr, what="self"):
    """torch's ``data_ptr<float>()`` on a non-float32 tensor."""
    if arr.dtype != np.float32:
        raise RuntimeTypeError(
            f"expected scalar type Float but found {_torch_dtype_name(arr.dtype)}")


def _check_row_observe(rows, rmin, rmax, ch_axis, func):
    """torch's checks before a per-row running min / max update of ``rows``
    (the ``_rows`` view of x)."""
    if ch_axis != 0:
        raise RuntimeValueError(
            "Per-channel FakeQuant in fused_moving_avg_obs_fake_quant is "
            "only supported on axis == 0")
    _need_f32(rows)
    _need_f32(rmin)
    _need_f32(rmax)
    if rmin.size < rows.shape[0] or rmax.size < rows.shape[0]:
        raise ValueError(f"{func}: running_min / running_max have {rmin.size} values, "
                         f"x has {rows.shape[0]} rows")


def _check_tensor_observe(arr, rmin, rmax, func):
    """torch's checks before a per-tensor running min / max update."""
    _need_f32(arr)
    _need_f32(rmin)
    _need_f32(rmax)
    if rmin.size == 0 or rmax.size == 0:
        raise ValueError(f"{func}: running_min / running_max are empty (torch writes out "
                         "of bounds)")


def _check_0d(s_arr, z_arr):
    """torch indexes scale / zero_point: a 0-d one raises."""
    if s_arr.ndim == 0 or z_arr.ndim == 0:
        raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python "
                         "or `tensor.item<T>()` in C++ to convert a 0-dim tensor to a "
                         "number")


def _fused(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
           averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant,
           symmetric_quant):
    """The fused op as a pure function, in torch's order of steps and checks
    (``fused_moving_avg_obs_fake_quant_cpu``).  Returns ``(out, mask,
    running_min, running_max, scale, zero_point)``: new arrays for the
    state that torch changes, the arguments themselves otherwise.  Nothing
    is written here, so a failing call leaves the state as it was (torch may
    have updated part of it before raising).

    One path for numpy and cupy x: a cupy x stays on the device (the
    running update by one observe launch, :func:`_observe`; the qparams
    formed there).  Device reads: observer_on / fake_quant_on when they are
    device arrays (8 bytes each), per tensor a running value that is not a
    float32 [1] (torch's ``.item()``) and the new qparams for the fake-quant
    call (8 bytes), per row the int32 zero points (C values; torch's range
    check reads them)."""
    func = "fused_moving_avg_obs_fake_quant"
    arr = _fq_input(x, func)
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    ch_axis = _int_arg(ch_axis, "ch_axis", func)
    xp = A.array_module(arr)
    if xp is np:
        for name, v in (("running_min", running_min), ("running_max", running_max),
                        ("scale", scale), ("zero_point", zero_point)):
            if A.is_cupy_array(v):
                raise TypeError(f"{func}: x is a host array but {name} is a cupy array; "
                                "pass x on the state's device")
    # (a cupy x: state given on the host is copied to the device)
    rmin, rmax, s_arr, z_arr = (
        v if xp is not np and A.is_cupy_array(v) else xp.asarray(np.asarray(v))
        for v in (running_min, running_max, scale, zero_point))
    if arr.size == 0:
        return arr.copy(), xp.ones(arr.shape, np.bool_), rmin, rmax, s_arr, z_arr
    if not ch_axis < arr.ndim:
        raise RuntimeValueError("Error in fused_moving_avg_obs_fake_quant_cpu: ch_axis must be < "
                                "self.dim()")
    observe = _item_int(observer_on, "observer_on", func)
    c = F32(averaging_const)
    if per_row_fake_quant:
        y = _rows(arr, ch_axis)
        size = _dim_size(arr, ch_axis)
        if rmin.size == 0:
            # torch resizes all four buffers; the new scale / zero_point
            # elements are uninitialized memory there, copies of the first
            # (or 1.0 / 0) here (the small arrays are resized on the host)
            rmin = xp.full(size, np.inf, F32)
            rmax = xp.full(size, -np.inf, F32)
            s_host, z_host = A.to_host(s_arr), A.to_host(z_arr)
            s_arr = xp.asarray(np.resize(s_host if s_host.size else np.ones(1, s_host.dtype),
                                         size))
            z_arr = xp.asarray(np.resize(z_host if z_host.size else np.zeros(1, z_host.dtype),
                                         size))
        if observe:
            _check_row_observe(y, rmin, rmax, ch_axis, func)
            rmin, rmax = _observe(y, True, rmin, rmax, c)
    elif observe:
        _check_tensor_observe(arr, rmin, rmax, func)
        rmin, rmax = _observe(arr, False, rmin, rmax, c)
    if not _item_int(fake_quant_on, "fake_quant_on", func):
        return arr.copy(), xp.ones(arr.shape, np.bool_), rmin, rmax, s_arr, z_arr
    if per_row_fake_quant:
        _need_f32(rmin)
        _need_f32(rmax)
        n = rmin.size
        _check_0d(s_arr, z_arr)
        for name, t in (("scale", s_arr), ("zero_point", z_arr)):
            if t.shape[0] < n:
                raise IndexError(f"select(): index {t.shape[0]} out of range for tensor of "
                                 f"size [{t.shape[0]}] at dimension 0")
        sc, zp = Q.choose_qparams_fused(rmin, rmax[:n], qmin, qmax, bool(symmetric_quant))
        s_arr, z_arr = s_arr.copy(), z_arr.copy()
        with np.errstate(invalid="ignore", over="ignore"):
            s_arr[:n] = sc.reshape(s_arr[:n].shape[:1] + (1,) * (s_arr.ndim - 1))
            z_arr[:n] = zp.astype(np.int32).reshape(z_arr[:n].shape[:1] + (1,) *
                                                    (z_arr.ndim - 1))
        out, mask = fake_quantize_per_channel_affine_cachemask(arr, s_arr, z_arr, ch_axis,
                                                               qmin, qmax)
        return out, mask, rmin, rmax, s_arr, z_arr
    lo, hi = (_running_value(v, name, func, xp)
              for v, name in ((rmin, "running_min"), (rmax, "running_max")))
    sc, zp = Q.choose_qparams_fused(lo, hi, qmin, qmax, bool(symmetric_quant))
    _check_0d(s_arr, z_arr)
    if s_arr.shape[0] == 0 or z_arr.shape[0] == 0:
        raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
    s_arr, z_arr = s_arr.copy(), z_arr.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        s_arr[0] = sc[0]
        z_arr[0] = zp[0].astype(np.int32)
    out, mask = _per_tensor_tensor_qparams(arr, s_arr, z_arr, qmin, qmax)
    return out, mask, rmin, rmax, s_arr, z_arr


def _running_value(v, name, func, xp):
    """The one running value of a side as a float32 [1] array for the
    per-tensor qparams: torch's ``.item()`` (checked, rounded to float32) on
    the host; on the device a float32 [1] array is used as it is (no read),
    another is read and checked as on the host."""
    if xp is not np and v.dtype == F32 and v.size == 1:
        return v.reshape(1)
    return xp.asarray(np.array([_item_float(v, name, func)], F32))


def _observe(src, per_row, rmin, rmax, c):
    """torch's fused running update by ``src``: per row (``src`` the 2-D
    ``_rows`` view, one running value a row) or per tensor (one value).
    Returns new arrays.  numpy: the min / max of ``src``, then
    :func:`_moving_average`.  cupy: one observe launch, the moving-average
    rule with torch's per-side reset ("inf_resets") in the reduction's last
    block."""
    if not A.is_cupy_array(src):
        if per_row:
            cur_min, cur_max = _ops.minmax(src, axis=0)
        else:
            cur_min, cur_max = (v.reshape(1) for v in _ops.minmax(src))
        return _moving_average(rmin, rmax, cur_min, cur_max, c)
    from quantcore_gpu import kernels as G
    xp = A.array_module(src)
    channels = src.shape[0] if per_row else 1
    new_min, new_max = rmin.copy(), rmax.copy()
    st = types.SimpleNamespace(channels=channels, dtype=None,
                               counts=xp.asarray(np.array([1, 0], np.int64)),
                               counter=xp.zeros(1, dtype=np.uint32),
                               min_val=new_min.reshape(-1)[:channels],
                               max_val=new_max.reshape(-1)[:channels])
    G.observe(xp.ascontiguousarray(src).reshape(-1), 1, channels, src.size // channels, st,
              observer="moving_average", averaging_constant=float(c), flags=("inf_resets",),
              nan_policy="propagate", qscheme=None)
    return new_min, new_max


def _moving_average(rmin, rmax, cur_min, cur_max, c):
    """torch's fused update of the first ``len(cur)`` running values:
    ``r = cur if isinf(r) else f32(r + f32(c * f32(cur - r)))`` per side
    (the moving average of :mod:`quantcore.observers`, then the per-side
    reset)."""
    n = cur_min.size
    core = _obs.MovingAverageMinMaxObserver(0.5, axis=None, nan_policy="propagate")
    core.averaging_constant = float(c)
    rmin, rmax = rmin.copy(), rmax.copy()
    fmin, fmax = rmin.reshape(-1), rmax.reshape(-1)
    old_min, old_max = fmin[:n].copy(), fmax[:n].copy()
    core.min_val, core.max_val = old_min, old_max
    avg_min, avg_max = core._combine(cur_min.astype(F32).reshape(-1),
                                     cur_max.astype(F32).reshape(-1), False)
    fmin[:n] = np.where(np.isinf(old_min), cur_min.reshape(-1), np.asarray(avg_min).reshape(-1))
    fmax[:n] = np.where(np.isinf(old_max), cur_max.reshape(-1), np.asarray(avg_max).reshape(-1))
    return rmin, rmax


def fused_moving_avg_obs_fake_quant(x, observer_on, fake_quant_on, running_min, running_max,
                                    scale, zero_point, averaging_const, quant_min, quant_max,
                                    ch_axis, per_row_fake_quant=False, symmetric_quant=False):
    """``torch.fused_moving_avg_obs_fake_quant``: updates ``running_min``,
    ``running_max``, ``scale`` and ``zero_point`` in place and returns the
    fake-quantized x.

    Observer on (float32 x and running buffers only): per side
    ``r = cur if isinf(r) else f32(r + f32(f32(c) * f32(cur - r)))``.
    Fake quant on: ``(scale, zp) = choose_qparams_fused(r_min, r_max, ...)``
    (:func:`quantcore.qparams.choose_qparams_fused`), stored, then the
    per-tensor (tensor-qparams) or per-channel kernel.  Fake quant off: a
    copy of x, scale / zero_point untouched.  Per row, empty running buffers
    resize all four arrays to [C] (their arrays must own their data for
    that).  An empty x returns a copy and changes nothing.
    """
    state = (running_min, running_max, scale, zero_point)
    device = A.is_cupy_array(x)  # (cupy x: the state must be cupy arrays, updated on the device)
    for name, a in zip(("running_min", "running_max", "scale", "zero_point"), state):
        if device and not A.is_cupy_array(a):
            raise TypeError(f"fused_moving_avg_obs_fake_quant: {name} must be a cupy array "
                            "for a cupy x (it is updated in place)")
        if not device and not isinstance(a, np.ndarray):
            raise TypeError(f"fused_moving_avg_obs_fake_quant: {name} must be a numpy array "
                            "(it is updated in place)")
    res = _fused(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                 averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant,
                 symmetric_quant)
    for name, target, value in zip(("running_min", "running_max", "scale", "zero_point"),
                                   state, res[2:]):
        if value is not target:
            _write_back(target, value, name)
    return res[0]


def _write_back(target, value, name):
    if A.is_cupy_array(target):  # (a device array cannot be resized in place)
        if target.size != value.size:
            raise ValueError(f"fused_moving_avg_obs_fake_quant: {name} has {target.size} "
                             f"values and must be resized to {value.size}; pass a cupy array "
                             "of that size")
        target[...] = value.reshape(target.shape)
        return
    if target.size != value.size:
        try:
            target.resize(value.shape, refcheck=False)
        except ValueError as exc:
            raise ValueError(f"fused_moving_avg_obs_fake_quant: {name} has {target.size} "
                             f"values and must be resized to {value.size}; pass an array "
                             "that owns its data") from exc
    if target.shape != value.shape:
        target.shape = value.shape
    np.copyto(target, value, casting="unsafe")

