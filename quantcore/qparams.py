"""Pure functions from statistics to quantization parameters.

Every function works elementwise on 1-D arrays (one value per tensor, or
one per channel), so per-tensor and per-channel share one code path.  All
arithmetic is float32 (numpy float32 scalars / arrays, one rounding per
operation, in the order the framework specs give) unless a docstring says
otherwise.
"""
import numpy as np

F32 = np.float32


def _f32(a):
    return np.asarray(a, dtype=F32)


def _round_half_away(v):
    """Ties away from zero, exact in float32 (C ``roundf``)."""
    a = np.abs(v)
    r = np.floor(a)
    r = np.where(a - r >= F32(0.5), r + F32(1), r).astype(v.dtype)
    return np.copysign(r, v)


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
