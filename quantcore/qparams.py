"""Pure functions from statistics to quantization parameters.

Every function works elementwise on 1-D arrays (one value per tensor, or
one per channel), so per-tensor and per-channel share one code path.  All
arithmetic is float32 (one rounding per operation, in the order the
framework specs give) unless a docstring says otherwise.

The formulas are the schemes of ``quantcore/include/qc_qparams.h``, run by
the CPU extension for numpy input and by ``quantcore_gpu`` for cupy input
(the statistics stay on the device and so do the results: no host
synchronisation).  The integer ranges and zero-point rules of the
frameworks are plain Python.
"""
import numpy as np

from . import _arrays as A
from ._cpu import _kernels

F32 = np.float32

#: scheme flags of qc_qparams.h
_UNSIGNED, _PRESERVE_SPARSITY, _HALF_AWAY, _SYMMETRIC, _CAMBRICON = 1, 2, 4, 8, 16


#: the schemes of qc_qparams.h that shift a 64-bit integer by num_bits
#: (``1 << num_bits``, ``1 << (num_bits - 1 + unsigned)``)
_SHIFT_SCHEMES = ("oneflow", "amax", "pq_affine")
#: num_bits those schemes accept: every shift count in [0, 62], so that
#: ``(1 << k) - 1`` is an int64 (a count outside the type's width is masked
#: by x86 and clamped by PTX: CPU and GPU would differ)
NUM_BITS_RANGE = (1, 62)


def _check_num_bits(num_bits):
    """``num_bits`` as an int, or ValueError naming it."""
    lo, hi = NUM_BITS_RANGE
    try:
        nb = int(num_bits)
    except (TypeError, ValueError):
        nb = None
    if nb is None or nb != num_bits or isinstance(num_bits, bool) or not lo <= nb <= hi:
        raise ValueError(f"num_bits must be an integer in {lo}..{hi}, got {num_bits!r}")
    return nb


def _scheme(name, a, b=None, dtype=F32, *, quant_min=0, quant_max=0, eps=0.0, num_bits=0,
            flags=0):
    """The outputs (rows of float64[NOUT, C]) of scheme ``name`` of
    qc_qparams.h over the channels of ``a`` (and ``b``), computed in
    ``dtype``'s precision where the scheme follows its input, on the back end
    of the inputs (numpy -> CPU, cupy -> GPU)."""
    if name in _SHIFT_SCHEMES:
        num_bits = _check_num_bits(num_bits)
    on_gpu = A.is_cupy_array(a) or A.is_cupy_array(b)
    xp = A.array_module(a if A.is_cupy_array(a) else b) if on_gpu else np
    def conv(v):  # (a device array through the project's cast: no flush to zero)
        return A.astype_exact(v, dtype) if A.is_cupy_array(v) else xp.asarray(v, dtype=dtype)

    with np.errstate(over="ignore"):  # a statistic beyond dtype's range is +-inf there
        a = xp.ascontiguousarray(conv(a).reshape(-1))
        if b is not None:
            b = xp.ascontiguousarray(conv(b).reshape(-1))
    if b is not None and b.shape != a.shape:
        raise ValueError(f"min_val and max_val must have one shape, got {a.shape} and "
                         f"{b.shape}")
    kernels = A.gpu_kernels("qparams") if on_gpu else _kernels
    return kernels.qparams(kernels.QP_SCHEMES[name][0], a, b, float(quant_min), float(quant_max),
                           float(eps), int(num_bits), int(flags))


#: torch.finfo(torch.float32).eps, the default lower bound of a scale
F32_EPS = float(np.finfo(np.float32).eps)



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
    out = _scheme("affine", min_val, max_val, quant_min=quant_min, quant_max=quant_max,
                  eps=float(F32(eps)))
    return A.astype_exact(out[0], F32), out[1].astype(np.int64)


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
    scale = A.astype_exact(_scheme("symmetric", min_val, max_val, quant_min=quant_min,
                                   quant_max=quant_max, eps=float(F32(eps)))[0], F32)
    if zero_point is None:
        zero_point = symmetric_zero_point(quant_min, quant_max)
    return scale, A.array_module(scale).full(scale.shape, zero_point, dtype=np.int64)


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


def float_qparams(min_val, max_val, quant_min, quant_max, eps=F32_EPS):
    """Per-channel float qparams (PyTorch ``per_channel_affine_float_qparams``)::

        scale = (max - min) / f32(qmax - qmin);  scale = scale if scale > eps else 1
        zp    = -min / scale          (float32, not rounded; no 0-inclusion)

    Returns
    -------
    (scale float32[C], zero_point float32[C])
    """
    out = _scheme("float", min_val, max_val, quant_min=quant_min, quant_max=quant_max,
                  eps=float(F32(eps)))
    return A.astype_exact(out[0], F32), A.astype_exact(out[1], F32)


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
    flags = (_CAMBRICON if formula == "cambricon" else 0) | \
        (_SYMMETRIC if scheme == "symmetric" else 0) | \
        (_HALF_AWAY if zp_rounding != "half_even" else 0)
    out = _scheme("oneflow", min_val, max_val, num_bits=num_bits, flags=flags)
    return A.astype_exact(out[0], F32), A.astype_exact(out[1], F32)


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
    dtype = A.compute_dtype(amax.dtype) if hasattr(amax, "dtype") else np.dtype(np.float64)
    out = _scheme("amax", amax, None, dtype, num_bits=num_bits,
                  flags=_UNSIGNED if unsigned else 0)
    return A.astype_exact(out[0], dtype), A.astype_exact(out[1], dtype)


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
    out = _scheme("nudge_tf", min_val, max_val, quant_min=quant_min, quant_max=quant_max)
    return tuple(A.astype_exact(row, F32) for row in out)


def nudge_mindspore(min_val, max_val, quant_min, quant_max):
    """MindSpore's nudged range (Ascend rule, the specification's decisions), float32.

    ::

        scale = (max - min) / (qmax - qmin)
        zpm   = qmin - min / scale
        nzp   = floor(clamp(zpm, qmin, qmax) + 0.5)
        nudged_min = (qmin - nzp) * scale;  nudged_max = (qmax - nzp) * scale

    Returns
    -------
    (nudged_min, nudged_max, scale) : float32 arrays.
    """
    out = _scheme("nudge_ms", min_val, max_val, quant_min=quant_min, quant_max=quant_max)
    return tuple(A.astype_exact(row, F32) for row in out)


# ------------------------------------------------ MindSpore / OneFlow helpers
def symmetric_range(min_val, max_val):
    """MindSpore's symmetric range, taken before nudging, float32.

    ::

        range = (-max, max) if |min| < max else (min, -min)

    MindSpore's GPU kernel's form: ``[-M, M]`` with ``M = max(max, -min)``,
    the signs of zero as the kernel leaves them (``np.maximum`` would pick
    them by its SIMD lane).  A NaN min or max propagates.

    Parameters
    ----------
    min_val, max_val : float or array_like
        One value per tensor or one per channel.

    Returns
    -------
    (min float32[C], max float32[C])
    """
    out = _scheme("symmetric_range", min_val, max_val)
    return A.astype_exact(out[0], F32), A.astype_exact(out[1], F32)


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
    dtype = np.dtype(dtype)
    return A.astype_exact(_scheme("cambricon_step", shift, None, dtype)[0], dtype)


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
    out = _scheme("fused", min_val, max_val, quant_min=quant_min, quant_max=quant_max,
                  flags=_PRESERVE_SPARSITY if preserve_sparsity else 0)
    return A.astype_exact(out[0], F32), out[1].astype(np.int64)


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
    dtype = np.dtype(dtype)
    out = _scheme("pq_affine", min_range, max_range, dtype, num_bits=num_bits)
    return A.astype_exact(out[0], dtype), A.astype_exact(out[1], dtype)


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
    s = np.asarray(A.to_host(scale), dtype=F32).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.clip(np.floor((-np.log2(s)).astype(F32)), F32(1), F32(14)).astype(F32)
    return (F32(1) / np.exp2(e).astype(F32)).astype(F32)
