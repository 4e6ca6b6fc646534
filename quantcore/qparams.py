"""Pure functions from statistics to quantization parameters.

Every function works elementwise on 1-D arrays (one value per tensor, or
one per channel), so per-tensor and per-channel share one code path.  All
arithmetic is float32 (numpy float32 scalars / arrays, one rounding per
operation, in the order the framework specs give) unless a docstring says
otherwise.
"""
import numpy as np

from ._cpu import _kernels

F32 = np.float32


def _f32(a):
    return np.asarray(a, dtype=F32)


def _round_half_away(v):
    """Ties away from zero, exact in float32 (C ``roundf``)."""
    a = np.abs(v)
    r = np.floor(a)
    r = np.where(a - r >= F32(0.5), r + F32(1), r).astype(v.dtype)
    return np.copysign(r, v)


#: torch.finfo(torch.float32).eps, the default lower bound of a scale
F32_EPS = float(np.finfo(np.float32).eps)

_INT32_MIN = -(2 ** 31)


def affine_qparams(min_val, max_val, quant_min, quant_max, eps=F32_EPS):
    """Affine (asymmetric) scale and zero point, PyTorch observer form.

    All float32, true division (torch.md §1.4)::

        min_neg = min(min_val, 0);  max_pos = max(max_val, 0)
        scale   = max((max_pos - min_neg) / f32(qmax - qmin), eps)
        zp      = clamp(qmin - int32(rint(min_neg / scale)), qmin, qmax)

    The int32 conversion and subtraction behave as on x86-64: NaN / inf
    ratios convert to INT32_MIN and the subtraction wraps.  NaN statistics
    propagate into the scale.  There is no special case for ``min == max``.
    The formula is ``qc_affine_qparams_f32`` in ``qc_elementwise.h``.

    Returns
    -------
    (scale float32[C], zero_point int64[C])
    """
    mn, mx = _stats(min_val, max_val)
    return _kernels.affine_qparams(mn, mx, int(quant_min), int(quant_max), float(F32(eps)))


def symmetric_qparams(min_val, max_val, quant_min, quant_max, eps=F32_EPS, zero_point=None):
    """Symmetric scale, PyTorch observer form (also Horizon's)::

        amax  = max(-min(min_val, 0), max(max_val, 0))
        scale = max(amax / f32((qmax - qmin) / 2), eps)       (float32)

    The divisor is the half range, e.g. 127.5 for [-128, 127].  The zero
    point is ``zero_point`` when given, else 0 for a signed range and
    ``(qmin + qmax + 1) // 2`` (128 for [0, 255]) for an unsigned one.
    The formula is ``qc_symmetric_scale_f32`` in ``qc_elementwise.h``.

    Returns
    -------
    (scale float32[C], zero_point int64[C])
    """
    mn, mx = _stats(min_val, max_val)
    scale = _kernels.symmetric_scale(mn, mx, int(quant_min), int(quant_max), float(F32(eps)))
    if zero_point is None:
        zero_point = symmetric_zero_point(quant_min, quant_max)
    return scale, np.full(scale.shape, zero_point, dtype=np.int64)


def symmetric_zero_point(quant_min, quant_max):
    """Default symmetric zero point: 0 for a signed range, else the middle
    ``(qmin + qmax + 1) // 2`` (128 for [0, 255])."""
    return 0 if quant_min < 0 else (quant_min + quant_max + 1) // 2


def _stats(min_val, max_val):
    mn = np.ascontiguousarray(np.asarray(min_val, dtype=F32).reshape(-1))
    mx = np.ascontiguousarray(np.asarray(max_val, dtype=F32).reshape(-1))
    if mn.shape != mx.shape:
        raise ValueError(f"min_val and max_val must have one shape, got {mn.shape} and {mx.shape}")
    return mn, mx


def float_qparams(min_val, max_val, quant_min, quant_max, eps=F32_EPS):
    """Per-channel float qparams (PyTorch ``per_channel_affine_float_qparams``)::

        scale = (max - min) / f32(qmax - qmin);  scale = scale if scale > eps else 1
        zp    = -min / scale          (float32, not rounded; no 0-inclusion)

    Returns
    -------
    (scale float32[C], zero_point float32[C])
    """
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = ((mx - mn).astype(F32) / F32(quant_max - quant_min)).astype(F32)
        scale = np.where(scale > F32(eps), scale, F32(1)).astype(F32)
        zp = (-mn / scale).astype(F32)
    return scale, zp


def oneflow_qparams(min_val, max_val, num_bits, scheme="symmetric", formula="google",
                    zp_rounding="half_even"):
    """OneFlow's scale and zero point (spec §3.2 / §3.3), float32.

    google, symmetric: ``scale = max(|hi|, |lo|) / f32(2**(b-1) - 1)``, zp 0.
    google, affine:    ``scale = (hi - lo) / f32(2**b - 1)``,
                       ``zp = -round(lo / scale)`` with ties to even
                       (MinMaxObserver) or away from zero (moving average);
                       no 0-inclusion clamp.
    cambricon:         ``scale = floor(log2(max(|hi|, |lo|))) - (b - 2)``
                       (an exponent, not a scale), zp 0.

    Returns
    -------
    (scale float32[C], zero_point float32[C])
    """
    lo, hi = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if formula == "cambricon":
            amax = np.maximum(np.abs(hi), np.abs(lo)).astype(F32)
            scale = (np.floor(np.log2(amax.astype(np.float64))) - (num_bits - 2)).astype(F32)
            return scale, np.zeros_like(scale)
        if scheme == "symmetric":
            amax = np.maximum(np.abs(hi), np.abs(lo)).astype(F32)
            scale = (amax / F32(2 ** (num_bits - 1) - 1)).astype(F32)
            return scale, np.zeros_like(scale)
        scale = ((hi - lo).astype(F32) / F32(2 ** num_bits - 1)).astype(F32)
        ratio = (lo / scale).astype(F32)
        rounded = np.rint(ratio) if zp_rounding == "half_even" else _round_half_away(ratio)
        return scale, (-rounded).astype(F32)


# -------------------------------------------------------------- amax family
def amax_bounds(num_bits, unsigned, narrow_range):
    """(min_bound, max_bound) of NVIDIA's symmetric integer grid, as floats.

    ``max_bound = 2**(num_bits - 1 + unsigned) - 1``; ``min_bound`` is 0
    (unsigned), ``-max_bound`` (narrow_range) or ``-max_bound - 1``.
    """
    max_bound = float(2 ** (num_bits - 1 + int(unsigned)) - 1)
    if unsigned:
        return 0.0, max_bound
    return (-max_bound if narrow_range else -max_bound - 1.0), max_bound


def amax_multiplier(amax, num_bits, unsigned):
    """(mult, divisor) for amax fake quant, in amax's float dtype.

    ``mult = max_bound / amax`` (one rounding); where ``amax <= 2**-24``
    the multiplier is 0 and the divisor 1 (outputs become zero), else the
    divisor is ``mult`` itself.
    """
    amax = np.asarray(amax)
    dtype = amax.dtype
    max_bound = dtype.type(2 ** (num_bits - 1 + int(unsigned)) - 1)
    with np.errstate(divide="ignore", over="ignore"):
        mult = (max_bound / amax).astype(dtype)
    tiny = amax <= dtype.type(2.0 ** -24)
    mult = np.where(tiny, dtype.type(0), mult).astype(dtype)
    div = np.where(tiny, dtype.type(1), mult).astype(dtype)
    return mult, div


# ------------------------------------------------------------ nudged family
def nudge_tensorflow(min_val, max_val, quant_min, quant_max):
    """TensorFlow's nudged range, all float32 (spec §2.2).

    ::

        scale = (max - min) / (qmax - qmin)
        inv   = (qmax - qmin) / (max - min)       (separate division)
        zpm   = qmin - min / scale
        nzp   = qmin if zpm < qmin, qmax if zpm > qmax, else round_half_away(zpm)
        nudged_min = (qmin - nzp) * scale;  nudged_max = (qmax - nzp) * scale
        quant_zero = floor(-nudged_min * inv + 0.5)

    Returns
    -------
    (nudged_min, nudged_max, scale, inv, quant_zero) : float32 arrays.
    """
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    qmin, qmax = F32(quant_min), F32(quant_max)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = (mx - mn).astype(F32)
        scale = (span / (qmax - qmin)).astype(F32)
        inv = ((qmax - qmin) / span).astype(F32)
        zpm = (qmin - (mn / scale).astype(F32)).astype(F32)
        nzp = np.where(zpm < qmin, qmin, np.where(zpm > qmax, qmax, _round_half_away(zpm)))
        nzp = nzp.astype(F32)
        nmin = ((qmin - nzp) * scale).astype(F32)
        nmax = ((qmax - nzp) * scale).astype(F32)
        qz = np.floor(((-nmin * inv).astype(F32) + F32(0.5)).astype(F32)).astype(F32)
    return nmin, nmax, scale, inv, qz


def nudge_mindspore(min_val, max_val, quant_min, quant_max):
    """MindSpore's nudged range (Ascend rule, DECISIONS.md), float32.

    ::

        scale = (max - min) / (qmax - qmin)
        zpm   = qmin - min / scale
        nzp   = floor(clamp(zpm, qmin, qmax) + 0.5)
        nudged_min = (qmin - nzp) * scale;  nudged_max = (qmax - nzp) * scale

    Returns
    -------
    (nudged_min, nudged_max, scale) : float32 arrays.
    """
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    qmin, qmax = F32(quant_min), F32(quant_max)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = ((mx - mn).astype(F32) / (qmax - qmin)).astype(F32)
        zpm = (qmin - (mn / scale).astype(F32)).astype(F32)
        nzp = np.floor((np.clip(zpm, qmin, qmax) + F32(0.5)).astype(F32)).astype(F32)
        nmin = ((qmin - nzp) * scale).astype(F32)
        nmax = ((qmax - nzp) * scale).astype(F32)
    return nmin, nmax, scale
