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


#: torch dtype name -> default (qmin, qmax) and whether ``reduce_range`` halves it
_TORCH_DEFAULT_RANGES = {
    "qint8": ((-128, 127), (-64, 63)), "int8": ((-128, 127), (-64, 63)),
    "quint8": ((0, 255), (0, 127)), "uint8": ((0, 255), (0, 127)),
    "qint32": ((-2 ** 31, 2 ** 31 - 1),) * 2, "int32": ((-2 ** 31, 2 ** 31 - 1),) * 2,
    "uint16": ((0, 2 ** 16 - 1),) * 2, "int16": ((-2 ** 15, 2 ** 15 - 1),) * 2,
}


def _torch_dtype_name(dtype):
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a torch dtype name such as 'quint8', got {dtype!r}")
    return dtype[6:] if dtype.startswith("torch.") else dtype


def torch_quant_range(dtype="quint8", reduce_range=False, quant_min=None, quant_max=None):
    """The integer range a PyTorch observer uses (torch.md section 1.1).

    ``torch.ao.quantization.utils.validate_qmin_qmax`` and
    ``calculate_qmin_qmax``: a custom range is used only when *both*
    ``quant_min`` and ``quant_max`` are given; it must contain 0, have
    ``quant_min < quant_max`` and (qint8 / int8) at most 256 values,
    (qint32 / int32) at most ``2**32``; ``reduce_range`` then floors both
    ends by 2.  Otherwise the dtype's default range, halved by
    ``reduce_range`` for the 8-bit types only; any other dtype (quint4x2,
    float8) gives ``(0, 15)``.

    Parameters
    ----------
    dtype : str
        A torch dtype name (``"quint8"``, ``"torch.qint8"``, ...).

    Returns
    -------
    (quant_min, quant_max, customized) : (int, int, bool)

    Raises
    ------
    ValueError
        A custom range that torch refuses (torch raises AssertionError),
        with torch's message.
    """
    name = _torch_dtype_name(dtype)
    if quant_min is None or quant_max is None:
        full, reduced = _TORCH_DEFAULT_RANGES.get(name, ((0, 15), (0, 15)))
        qmin, qmax = reduced if reduce_range else full
        return qmin, qmax, False
    for arg, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"torch_quant_range: {arg} must be an int, got {value!r}")
    qmin, qmax = int(quant_min), int(quant_max)
    if not qmin <= 0 <= qmax:
        raise ValueError("Used-specified quantization range must include 0. "
                         f"(got quant_min={qmin}, quant_max={qmax})")
    if qmin >= qmax:
        raise ValueError("qmin must be strictly less than qmax for user-specified quantization "
                         f"range. (got quant_min={qmin}, quant_max={qmax})")
    n = qmax - qmin + 1
    if name in ("qint8", "int8") and not 0 < n <= 256:
        raise ValueError("quantization range should be positive and not exceed the maximum bit "
                         f"range (=256). (got quant_min={qmin}, quant_max={qmax})")
    if name in ("qint32", "int32") and not 0 < n <= 2 ** 32:
        raise ValueError("quantization range should be positive and not exceed the maximum bit "
                         f"range (=4294967296). (got quant_min={qmin}, quant_max={qmax})")
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    return qmin, qmax, True


def torch_symmetric_zero_point(dtype, quant_min, quant_max, customized):
    """The zero point of PyTorch's symmetric observer qparams (torch.md 1.4).

    quint8 / uint8: ``(qmin + qmax) // 2`` with a custom range, else 128
    (even with ``reduce_range``, whose range (0, 127) then does not contain
    it: torch's quirk); uint16: 32768; every other dtype: 0.

    Returns
    -------
    int
    """
    name = _torch_dtype_name(dtype)
    if name in ("quint8", "uint8"):
        return (int(quant_min) + int(quant_max)) // 2 if customized else 128
    if name == "uint16":
        return 2 ** 15
    return 0


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


# ------------------------------------------------ MindSpore / OneFlow helpers
def symmetric_range(min_val, max_val):
    """MindSpore's symmetric range, taken before nudging, float32.

    ::

        M = max(max, -min);   range = [-M, M]

    (MindSpore's GPU kernel writes it as ``(-max, max) if |min| < max else
    (min, -min)``, which is the same.)  NaN propagates.

    Parameters
    ----------
    min_val, max_val : float or array_like
        One value per tensor or one per channel.

    Returns
    -------
    (min float32[C], max float32[C])
    """
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    with np.errstate(invalid="ignore"):
        m = np.maximum(mx, -mn).astype(F32)
    return (-m).astype(F32), m


def cambricon_step(shift, dtype=np.float32):
    """OneFlow's cambricon step ``2**int32(shift)`` (an exact power of two).

    ``shift`` is the exponent returned by :func:`oneflow_qparams` with
    ``formula="cambricon"``.  The float -> int32 conversion truncates toward
    zero; NaN, +-inf and values outside int32 become ``INT32_MIN`` (x86), so
    the step underflows to 0.  Large exponents overflow to inf.

    Parameters
    ----------
    shift : float or array_like
    dtype : float dtype of the result (float32 default)

    Returns
    -------
    ndarray of ``dtype``, shape of ``shift`` flattened to 1-D.
    """
    v = np.asarray(shift, dtype=np.float64).reshape(-1)
    ok = np.isfinite(v) & (v > -2.0 ** 31 - 1) & (v < 2.0 ** 31)
    e = np.where(ok, np.trunc(np.where(ok, v, 0.0)), _INT32_MIN)
    e = np.clip(e, -2000, 2000).astype(np.int32)  # beyond float64's range either way
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(np.dtype(dtype).type(1), e).astype(dtype)


# ------------------------------------------------------ torch fused op
def choose_qparams_fused(min_val, max_val, quant_min, quant_max, preserve_sparsity=False):
    """PyTorch's ``quant_utils::ChooseQuantizationParams`` as used by
    ``torch.fused_moving_avg_obs_fake_quant`` (torch.md section 6), elementwise.

    Parameters
    ----------
    min_val, max_val : array_like of float32
        Running statistics, one value per tensor or per channel.
    quant_min, quant_max : int
        The integer range.
    preserve_sparsity : bool, default False
        True for symmetric quantization (``symmetric_quant``).

    Returns
    -------
    scale : float32 ndarray [C]
    zero_point : int64 ndarray [C]

    Notes
    -----
    With ``mn, mx`` float32 and ``d = qmax - qmin``::

        if preserve_sparsity and mn < 0 < mx:
            sqmin = -(d // 2 + 1);  sqmax = d // 2
            ms = max(|f32(mn / sqmin)|, |f32(mx / sqmax)|)        (float32)
            mn = f32(double(ms) * sqmin);  mx = f32(double(ms) * sqmax)
        mn = min(mn, 0);  mx = max(mx, 0)
        scale = (double(mx) - mn) / d                             (double)
        if f32(scale) == 0 or f32(1) / f32(scale) is inf:  scale = 0.1
        if scale < f32(6.1e-5):
            a = f32(f32(6.1e-5) / f32(scale));  scale = f32(6.1e-5)
            mn == 0: mx = f32(6.1e-5) * d;   mx == 0: mn = -f32(6.1e-5) * d
            else:    mn = f32(mn * a);  mx = f32(mx * a)
        scale = f32(scale)
        zmin = qmin - mn / scale;  zmax = qmax - mx / scale      (double)
        z = zmin if |qmin| + |mn / scale| < |qmax| + |mx / scale| else zmax
        if preserve_sparsity and mn < 0 < mx:  z = (qmin + qmax) / 2
        zp = qmin if z < qmin, qmax if z > qmax, else nearbyint(z)
             (NaN -> INT32_MIN, the x86 conversion)

    Differences from the observer formulas: symmetric divides by ``d / 2``
    rounded down (127 for qint8, not 127.5); symmetric on one-signed data is
    affine; all zeros give scale 0.1.

    The integer arithmetic is torch's int32 (x86): ``qmin``, ``qmax`` and
    ``d = qmax - qmin`` wrap (the int32 range gives ``d = -1``), integer
    division truncates toward zero and ``|INT32_MIN| == INT32_MIN``.
    """
    mn = np.array(min_val, dtype=F32).reshape(-1)
    mx = np.array(max_val, dtype=F32).reshape(-1)

    def i32(v):
        return int((int(v) + 2 ** 31) % 2 ** 32 - 2 ** 31)

    def half(v):                       # C integer division by 2
        return v // 2 if v >= 0 else -((-v) // 2)

    qmin, qmax = i32(quant_min), i32(quant_max)
    d = i32(qmax - qmin)
    abs_qmin = qmin if qmin == _INT32_MIN else abs(qmin)
    abs_qmax = qmax if qmax == _INT32_MIN else abs(qmax)
    small_thr = F32(6.1e-5)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if preserve_sparsity:
            sym = (mn < 0) & (mx > 0)
            sqmin, sqmax = i32(-(half(d) + 1)), half(d)
            ms = np.maximum(np.abs((mn / F32(sqmin)).astype(F32)),
                            np.abs((mx / F32(sqmax)).astype(F32))).astype(F32)
            mn = np.where(sym, (ms.astype(np.float64) * sqmin).astype(F32), mn).astype(F32)
            mx = np.where(sym, (ms.astype(np.float64) * sqmax).astype(F32), mx).astype(F32)
        mn = np.minimum(mn, F32(0)).astype(F32)
        mx = np.maximum(mx, F32(0)).astype(F32)
        scale = (mx.astype(np.float64) - mn.astype(np.float64)) / float(d)
        s32 = scale.astype(F32)
        scale = np.where((s32 == 0) | np.isinf(F32(1) / s32), 0.1, scale)
        small = scale < float(small_thr)
        amp = (small_thr / scale.astype(F32)).astype(F32)
        span = (small_thr * F32(d)).astype(F32)
        mn_s = np.where(mn == 0, mn, np.where(mx == 0, -span, (mn * amp).astype(F32)))
        mx_s = np.where(mn == 0, span, np.where(mx == 0, mx, (mx * amp).astype(F32)))
        mn = np.where(small, mn_s, mn).astype(F32)
        mx = np.where(small, mx_s, mx).astype(F32)
        scale = np.where(small, float(small_thr), scale).astype(F32)
        s64 = scale.astype(np.float64)
        rmin = mn.astype(np.float64) / s64
        rmax = mx.astype(np.float64) / s64
        z = np.where(abs_qmin + np.abs(rmin) < abs_qmax + np.abs(rmax), qmin - rmin,
                     qmax - rmax)
        if preserve_sparsity:
            z = np.where((mn < 0) & (mx > 0), i32(qmin + qmax) / 2.0, z)
        zr = np.where(z < qmin, qmin, np.where(z > qmax, qmax, np.rint(z)))
        ok = np.isfinite(zr)
        zp = np.where(ok, zr, float(_INT32_MIN)).astype(np.int64)
    return scale, zp


# ------------------------------------------------ NVIDIA affine, Horizon pow2
def pq_affine_qparams(min_range, max_range, num_bits, dtype=np.float32):
    """Step and zero of NVIDIA ``fake_affine_tensor_quant`` (gemmlowp style).

    In ``dtype`` (float32 default; one rounding per operation)::

        step       = (max_range - min_range) / (2**num_bits - 1)
        quant_zero = round_half_even(min_range / step) + 2**(num_bits - 1)

    The fake quant is then ``clamp(round(x / step) - quant_zero,
    -2**(n-1), 2**(n-1) - 1)``, dequantized as ``(q + quant_zero) * step``,
    i.e. the affine recipe with ``zero_point = -quant_zero`` and division by
    ``step``.  ``min_range == max_range`` gives step 0 (no check, as PQ).

    Parameters
    ----------
    min_range, max_range : float or array_like
        One value per tensor (or per channel).
    num_bits : int
    dtype : float dtype of the computation.

    Returns
    -------
    (step, quant_zero) : 1-D arrays of ``dtype``.
    """
    t = np.dtype(dtype).type
    lo = np.asarray(min_range, dtype=dtype).reshape(-1)
    hi = np.asarray(max_range, dtype=dtype).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        step = ((hi - lo).astype(dtype) / t(2.0 ** num_bits - 1)).astype(dtype)
        qzero = (np.rint((lo / step).astype(dtype)) + t(2.0 ** (num_bits - 1))).astype(dtype)
    return step, qzero


def horizon_pow2_scale(scale):
    """Horizon's power-of-two scale (BERNOULLI march), float32::

        scale = 1 / 2**clamp(floor(-log2(scale)), 1, 14)

    ``log2`` is NumPy's float32 ``log2`` (torch's float32 ``log2`` may
    differ by one ulp, which moves the floor only for scales within about
    ``2**-22`` relative of a power of two).

    Returns
    -------
    float32 ndarray, the shape of ``scale`` flattened to 1-D.
    """
    s = np.asarray(scale, dtype=F32).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.clip(np.floor((-np.log2(s)).astype(F32)), F32(1), F32(14)).astype(F32)
    return (F32(1) / np.exp2(e).astype(F32)).astype(F32)
