"""Float64 NumPy references for the core recipes, written independently of
the kernels.

A float32 operation is emulated by computing it exactly-or-once in float64
and rounding the result to float32 (``r32``).  For +, -, *, / of float32
operands this gives the correctly rounded float32 result (53 >= 2*24 + 2,
so the double rounding is innocuous).  float64 recipes are computed in
float64 directly.  Inputs are float64 arrays holding values of the
compute dtype.
"""
import importlib
import os

import numpy as np

#: examples per recipe property test: 500 by default (CI: about 30 recipe x
#: mode tests, each against the float64 reference); QC_HYPOTHESIS_EXAMPLES=5000
#: for a deeper run, lower for a quick one
RECIPE_EXAMPLES = int(os.environ.get("QC_HYPOTHESIS_EXAMPLES", "500"))


def rounder(dtype):
    """Rounding of one operation's result to the compute dtype."""
    if np.dtype(dtype) == np.float64:
        return lambda a: np.asarray(a, dtype=np.float64)
    return lambda a: np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def round_half_away(v):
    a = np.abs(v)
    r = np.floor(a)
    r = r + (a - r >= 0.5)
    return np.copysign(r, v)


def round_value(v, rounding, rnd):
    if rounding == "half_even":
        return np.rint(v)
    if rounding == "half_up":
        return np.floor(rnd(v + 0.5))
    if rounding == "half_away":
        return round_half_away(v)
    raise ValueError(f"no reference for rounding {rounding!r}: add it here (every mode of "
                     "quantcore.ops.ROUNDING is tested against this function)")


def compute_of(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def affine(x, scale, zp, qmin, qmax, rounding="half_even", zero_point_add="after_rounding",
           scale_op="mul_inverse", nonfinite="propagate", dtype=np.float32, output_q=False):
    """Reference affine fake quant; scale / zp broadcast against x."""
    cdt = compute_of(dtype)
    rnd = rounder(cdt)
    with np.errstate(all="ignore"):
        x = rnd(np.asarray(x, np.float64))
        s = rnd(scale)
        z = rnd(zp)
        inv = rnd(1.0 / s)
        v = rnd(x / s) if scale_op == "div" else rnd(x * inv)
        if zero_point_add == "none":
            qf = round_value(v, rounding, rnd)
        elif zero_point_add == "before_rounding":
            qf = round_value(rnd(v + z), rounding, rnd)
        else:
            qf = rnd(round_value(v, rounding, rnd) + z)
        # the range ends are values of the compute dtype too: an int32 range
        # in float32 clamps at f32(2**31 - 1) == 2**31 (quantize clamps again
        # exactly before its integer conversion)
        qmin, qmax = rnd(qmin), rnd(qmax)
        mask = (qf >= qmin) & (qf <= qmax)
        if nonfinite == "propagate":
            q = np.where(qf < qmin, qmin, np.where(qf > qmax, qmax, qf))
        else:
            # fmax/fmin-style clamp: NaN -> qmin; a zero q_f equal to qmin
            # becomes qmin itself (+0.0), as an integer conversion would
            if nonfinite == "int64":
                qf = np.where((qf > -2.0 ** 63) & (qf < 2.0 ** 63), qf, qmin)
            q = np.where(qf > qmin, qf, qmin)
            q = np.where(q < qmax, q, qmax)
            if nonfinite == "int64":
                q = q + 0.0  # an int64 q has no -0.0
        if output_q:
            return q, mask
        out = rnd(q * s) if zero_point_add == "none" else rnd(rnd(q - z) * s)
    return out, mask


def nudged(x, nmin, nmax, scale, inv, qz, formula, scale_op, dtype=np.float32):
    cdt = compute_of(dtype)
    rnd = rounder(cdt)
    with np.errstate(all="ignore"):
        x = rnd(np.asarray(x, np.float64))
        nmin, nmax, s, inv, qz = (rnd(a) for a in (nmin, nmax, scale, inv, qz))
        mask = (x >= nmin) & (x <= nmax)
        xc = np.where(nmax < x, nmax, x)
        xc = np.where(xc < nmin, nmin, xc)
        cs = rnd(xc - nmin)
        t = rnd(cs / s) if scale_op == "div" else rnd(cs * inv)
        if formula == "tensorflow":
            out = rnd(np.floor(rnd(rnd(t - qz) + 0.5)) * s)
        else:
            out = rnd(rnd(np.floor(rnd(t + 0.5)) * s) + nmin)
    return out, mask


def amax_fq(x, amax, num_bits, unsigned, narrow_range, dtype=np.float32):
    cdt = compute_of(dtype)
    rnd = rounder(cdt)
    with np.errstate(all="ignore"):
        x = rnd(np.asarray(x, np.float64))
        amax = rnd(amax)
        max_bound = 2.0 ** (num_bits - 1 + int(unsigned)) - 1
        min_bound = 0.0 if unsigned else (-max_bound if narrow_range else -max_bound - 1)
        mult = rnd(max_bound / amax)
        tiny = amax <= 2.0 ** -24
        mult = np.where(tiny, 0.0, mult)
        div = np.where(tiny, 1.0, mult)
        q = np.rint(rnd(x * mult))
        q = np.where(q < min_bound, min_bound, np.where(q > max_bound, max_bound, q))
        out = rnd(q / div)
        mask = np.abs(x) <= amax
    return out, mask


def minmax(x, axis=None, nan_policy="propagate"):
    """min / max with NaN and signed-zero rules (-0.0 < +0.0)."""
    x = np.asarray(x)
    if axis is None:
        flat = x.reshape(1, -1)
    else:
        flat = np.moveaxis(x, axis, 0)
        flat = flat.reshape(x.shape[axis], int(np.prod(flat.shape[1:], dtype=np.int64)))
    los, his = [], []
    for row in flat:
        nan = np.isnan(row).any()
        vals = row[~np.isnan(row)]
        if nan and nan_policy == "propagate":
            los.append(np.nan)
            his.append(np.nan)
            continue
        if vals.size == 0:
            los.append(np.inf)
            his.append(-np.inf)
            continue
        lo, hi = vals.min(), vals.max()
        if lo == 0:
            lo = -0.0 if np.any((vals == 0) & np.signbit(vals)) else 0.0
        if hi == 0:
            hi = 0.0 if np.any((vals == 0) & ~np.signbit(vals)) else -0.0
        los.append(lo)
        his.append(hi)
    lo = np.array(los, dtype=x.dtype)
    hi = np.array(his, dtype=x.dtype)
    if axis is None:
        return lo.reshape(()), hi.reshape(())
    return lo, hi


def gpu_cupy():
    """cupy on a usable device (a GPU, or the CUDA emulator of ``make
    gpu-emu-test``); otherwise the calling test module is skipped."""
    import pytest
    cp = pytest.importorskip("cupy")
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(f"no usable GPU: {reason}", allow_module_level=True)
    return cp


def to_numpy(a):
    """A numpy copy of a cupy array (``.get()``: the only way device data
    reaches the host), anything else through ``numpy.asarray``."""
    if type(a).__module__.split(".")[0] == "cupy":
        return a.get()
    return np.asarray(a)


def bits_equal(a, b):
    """Bit-pattern equality of two arrays (numpy or cupy): raw bits
    everywhere except NaN lanes, which must be NaN in both (CUDA's float
    operations return the NaN 0x7fffffff, x86's 0x7fc00000 with an
    operand-dependent sign: payloads are not part of the contract)."""
    a, b = to_numpy(a), to_numpy(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    ia = a.view(np.dtype(f"u{a.dtype.itemsize}"))
    ib = b.view(np.dtype(f"u{b.dtype.itemsize}"))
    return bool(np.array_equal(ia[~nan_a], ib[~nan_b]))


def spec_f32(values):
    """A float32 array from a specification vector: its numbers, with the
    strings ("nan", "inf", "-0.0", ...) read by ``np.float32``."""
    return np.array([np.float32(s) if isinstance(s, str) else s for s in np.ravel(values)],
                    dtype=np.float32).reshape(np.shape(values))


def assert_spec_bits(actual, expected):
    """``actual`` is bit for bit the specification vector ``expected``
    (NaN lanes: both NaN)."""
    assert_bits_equal(np.asarray(actual), spec_f32(expected))


def assert_same_bytes(a, b):
    """Same dtype, shape and bytes (NaN payloads included): for two CPU
    computations that must be identical, e.g. two SIMD builds or two code
    paths of one kernel; sequences compare element by element."""
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert_same_bytes(u, v)
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert np.array_equal(np.ascontiguousarray(a).reshape(-1).view(np.uint8),
                          np.ascontiguousarray(b).reshape(-1).view(np.uint8))


def assert_bits_equal(actual, expected, msg=""):
    """Fail with the first mismatches unless ``bits_equal(actual, expected)``."""
    if not bits_equal(actual, expected):
        a, e = np.atleast_1d(to_numpy(actual)), np.atleast_1d(to_numpy(expected))
        diff = ""
        if a.shape == e.shape:
            ia = a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype == e.dtype else a
            ie = e.view(np.dtype(f"u{e.dtype.itemsize}")) if a.dtype == e.dtype else e
            bad = np.nonzero((ia != ie) & ~(np.isnan(a) & np.isnan(e)))
            diff = f" first mismatches at {[tuple(int(i) for i in t) for t in zip(*bad)][:5]}: " \
                   f"got {a[bad][:5]}, expected {e[bad][:5]}"
        raise AssertionError(f"bit patterns differ {msg}: {a.dtype}{a.shape} vs "
                             f"{e.dtype}{e.shape}{diff}")


# ----------------------------------------------------------- qparams schemes
# The numpy formulas of quantcore.qparams as they were written before they
# moved into quantcore/include/qc_qparams.h (kept as independent references:
# tests/test_qparams_schemes.py compares the kernels with them).
F32 = np.float32
F32_EPS = float(np.finfo(np.float32).eps)
_INT32_MIN = -(2 ** 31)


def _f32(a):
    return np.asarray(a, dtype=F32)


def round_half_away_f(v):
    """Round half away from zero in v's own dtype (each operation rounds to
    it: float32 in, float32 out)."""
    a = np.abs(v)
    r = np.floor(a)
    r = np.where(a - r >= F32(0.5), r + F32(1), r).astype(v.dtype)
    return np.copysign(r, v)


def ref_float_qparams(min_val, max_val, quant_min, quant_max, eps=F32_EPS):
    """numpy reference of quantcore.qparams.float_qparams."""
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = ((mx - mn).astype(F32) / F32(quant_max - quant_min)).astype(F32)
        scale = np.where(scale > F32(eps), scale, F32(1)).astype(F32)
        zp = (-mn / scale).astype(F32)
    return scale, zp


def ref_oneflow_qparams(min_val, max_val, num_bits, scheme="symmetric", formula="google",
                    zp_rounding="half_even"):
    """numpy reference of quantcore.qparams.oneflow_qparams."""
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
        rounded = np.rint(ratio) if zp_rounding == "half_even" else round_half_away_f(ratio)
        return scale, (-rounded).astype(F32)


def ref_amax_multiplier(amax, num_bits, unsigned):
    """numpy reference of quantcore.qparams.amax_multiplier."""
    amax = np.asarray(amax)
    dtype = amax.dtype
    max_bound = dtype.type(2 ** (num_bits - 1 + int(unsigned)) - 1)
    with np.errstate(divide="ignore", over="ignore"):
        mult = (max_bound / amax).astype(dtype)
    tiny = amax <= dtype.type(2.0 ** -24)
    mult = np.where(tiny, dtype.type(0), mult).astype(dtype)
    div = np.where(tiny, dtype.type(1), mult).astype(dtype)
    return mult, div


def ref_nudge_tensorflow(min_val, max_val, quant_min, quant_max):
    """numpy reference of quantcore.qparams.nudge_tensorflow."""
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    qmin, qmax = F32(quant_min), F32(quant_max)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        span = (mx - mn).astype(F32)
        scale = (span / (qmax - qmin)).astype(F32)
        inv = ((qmax - qmin) / span).astype(F32)
        zpm = (qmin - (mn / scale).astype(F32)).astype(F32)
        nzp = np.where(zpm < qmin, qmin, np.where(zpm > qmax, qmax, round_half_away_f(zpm)))
        nzp = nzp.astype(F32)
        nmin = ((qmin - nzp) * scale).astype(F32)
        nmax = ((qmax - nzp) * scale).astype(F32)
        qz = np.floor(((-nmin * inv).astype(F32) + F32(0.5)).astype(F32)).astype(F32)
    return nmin, nmax, scale, inv, qz


def ref_nudge_mindspore(min_val, max_val, quant_min, quant_max):
    """numpy reference of quantcore.qparams.nudge_mindspore."""
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    qmin, qmax = F32(quant_min), F32(quant_max)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = ((mx - mn).astype(F32) / (qmax - qmin)).astype(F32)
        zpm = (qmin - (mn / scale).astype(F32)).astype(F32)
        nzp = np.floor((np.clip(zpm, qmin, qmax) + F32(0.5)).astype(F32)).astype(F32)
        nmin = ((qmin - nzp) * scale).astype(F32)
        nmax = ((qmax - nzp) * scale).astype(F32)
    return nmin, nmax, scale


def ref_symmetric_range(min_val, max_val):
    """numpy reference of quantcore.qparams.symmetric_range (MindSpore's
    kernel form: (-max, max) if |min| < max else (min, -min))."""
    mn, mx = _f32(min_val).reshape(-1), _f32(max_val).reshape(-1)
    with np.errstate(invalid="ignore"):
        m = np.where(np.isnan(mx), mx, np.where(np.abs(mn) < mx, mx, -mn)).astype(F32)
    return (-m).astype(F32), m


def ref_cambricon_step(shift, dtype=np.float32):
    """numpy reference of quantcore.qparams.cambricon_step."""
    v = np.asarray(shift, dtype=np.float64).reshape(-1)
    ok = np.isfinite(v) & (v > -2.0 ** 31 - 1) & (v < 2.0 ** 31)
    e = np.where(ok, np.trunc(np.where(ok, v, 0.0)), _INT32_MIN)
    e = np.clip(e, -2000, 2000).astype(np.int32)  # beyond float64's range either way
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(np.dtype(dtype).type(1), e).astype(dtype)


def ref_choose_qparams_fused(min_val, max_val, quant_min, quant_max, preserve_sparsity=False):
    """numpy reference of quantcore.qparams.choose_qparams_fused."""
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


def ref_pq_affine_qparams(min_range, max_range, num_bits, dtype=np.float32):
    """numpy reference of quantcore.qparams.pq_affine_qparams."""
    t = np.dtype(dtype).type
    lo = np.asarray(min_range, dtype=dtype).reshape(-1)
    hi = np.asarray(max_range, dtype=dtype).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        step = ((hi - lo).astype(dtype) / t(2.0 ** num_bits - 1)).astype(dtype)
        qzero = (np.rint((lo / step).astype(dtype)) + t(2.0 ** (num_bits - 1))).astype(dtype)
    return step, qzero


# ------------------------------------------------- MX and NVFP4 (spec §4-5)
# Written from the spec's formulas in float64 (every float32 operation is
# computed exactly in float64 and rounded once), with numpy's float64 log2
# rounded to float32 for torch's float32 log2 (spec §4.2: the same floor /
# ceil for every probed input) and np.frexp for exact exponents; element
# codes through ml_dtypes.
#: element: (ebits, mbits, bias, max, emax); int8: 6 fraction bits, 127 / 64
MX_ELEMS = {"e4m3": (4, 3, 7, 448.0, 8), "e5m2": (5, 2, 15, 57344.0, 15),
            "e2m3": (2, 3, 1, 7.5, 2), "e3m2": (3, 2, 3, 28.0, 4),
            "e2m1": (2, 1, 1, 6.0, 2), "int8": (0, 6, 0, 127 / 64, 0)}


def r32(v):
    return np.asarray(v, np.float64).astype(F32)


def _exp_field(a32):
    return ((a32.view(np.uint32).astype(np.int64) >> 23) & 0xFF) - 127


def _log2_f32(v):
    """torch's float32 log2, as RN32(float64 log2)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log2(np.asarray(v, np.float64)).astype(F32).astype(np.float64)


def ref_mx_scale(amax, elem, scale_mode):
    """E8M0 codes (int64) of float32 block amaxes (spec §4.2)."""
    amax = np.asarray(amax, F32)
    _, mbits, _, emax_v, emax = MX_ELEMS[elem]
    nan = np.isnan(amax)
    b = amax.view(np.uint32).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if scale_mode in ("floor", "ceil", "even"):
            if scale_mode == "even":
                b = (b + (1 << (22 - mbits))) & 0xFF800000
            e = ((b >> 23) & 0xFF) - 127 - emax
            if scale_mode == "ceil":
                e = e + ((b & 0x7FFFFF) != 0)
            return np.where(nan, 255, np.clip(e, -127, 128) + 127)
        if scale_mode in ("rceil", "rceil_exact"):
            d = r32(amax.astype(np.float64) / emax_v)
            if scale_mode == "rceil":
                c = np.ceil(_log2_f32(d))
            else:
                m, ex = np.frexp(d.astype(np.float64))
                c = np.where(m == 0.5, ex - 1, ex).astype(np.float64)
                c = np.where(d == 0, -np.inf, c)
            c = np.clip(np.where(np.isfinite(c), c, -1000), -127, 127) + 127
            return np.where(np.isnan(d), 255, np.where(np.isinf(d), 254, c)).astype(np.int64)
        if scale_mode == "floor_log2":
            a = np.where(amax == 0, F32(2.0 ** -126), amax)
            e = np.floor(_log2_f32(a)) - emax
            bad = nan | ~np.isfinite(e) | (e > 127)
            return np.where(bad, 255, np.maximum(np.where(bad, 0, e), -127) + 127).astype(np.int64)
    raise ValueError(scale_mode)


def ref_elem_round(v, elem, half_away=False, int8_min=-127):
    """v (float64 holding float32 values) on the element grid, saturating;
    NaN stays NaN, signs kept (exact, float64)."""
    v = np.asarray(v, np.float64)
    ebits, mbits, bias, vmax, _ = MX_ELEMS[elem]
    rnd = (lambda t: np.floor(t + 0.5)) if half_away else np.rint
    a = np.abs(v)
    with np.errstate(invalid="ignore", over="ignore"):
        if elem == "int8":
            q = np.clip(np.sign(v) * rnd(a * 64), int8_min, 127)
            q = np.where(v == 0, v, q)  # (keep the sign of zero)
            return np.copysign(q / 64, v)
        _, ex = np.frexp(np.where(np.isfinite(a) & (a > 0), a, 1.0))
        p = np.maximum(ex - 1, 1 - bias)          # the element exponent (min normal's below)
        step = np.ldexp(1.0, p - mbits)
        r = np.minimum(rnd(np.where(np.isfinite(a), a, 0) / step) * step, vmax)
        r = np.where(np.isinf(a), vmax, r)
        return np.where(np.isnan(v), np.nan, np.copysign(r, v))


def _blocks(x2, bs):
    rows, k = x2.shape
    nb = -(-k // bs)
    pad = np.zeros((rows, nb * bs), F32)
    pad[:, :k] = x2
    return pad.reshape(rows, nb, bs), k


def ref_mx_fake_quant(x2, elem, bs=32, scale_mode="floor", half_away=False, compat=None,
                      int8_min=-127):
    """(scale codes [rows, nb], element values [rows, K] before the scale,
    y float32 [rows, K]) of MX over the last axis of x2 (spec §4.2-4.3)."""
    blk, k = _blocks(np.asarray(x2, F32), bs)
    amax = np.max(np.abs(blk), axis=-1)
    code = ref_mx_scale(amax, elem, scale_mode)
    c = code[..., None]
    X = np.ldexp(1.0, (c - 127).astype(np.int64))
    xb = blk.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if compat == "torchao" and scale_mode == "rceil":
            rcp = np.where(c == 0, 1.0, 1.0 / X)
            v = r32(xb * np.where(c == 255, np.nan, rcp))
        elif compat == "torchao":
            v = r32(xb / np.where(c == 255, np.inf, np.maximum(X, 2.0 ** -126)))
        else:
            v = r32(xb / np.where(c == 255, np.nan, X))
        r = ref_elem_round(v.astype(np.float64), elem, half_away, int8_min)
        if compat == "torchao":  # the NaN's sign (x86): a NaN x's; Inf * 0 sets it; rceil: +
            neg = (np.signbit(xb) | ~np.isnan(xb)) & (c == 255) & (scale_mode != "rceil")
            r = np.where(np.isnan(r), np.where(neg, -np.nan, np.nan), r)
        if compat == "microxcaling":
            r = np.where(v == 0, 0.0, r)
        y = r32(r * np.where(c == 255, np.nan, X))
    rows = x2.shape[0]
    return code, r.reshape(rows, -1)[:, :k], y.reshape(rows, -1)[:, :k]


def ref_mx_codes(r, elem, compat=None):
    """Element codes (int64) of rounded element values r (NaN: torchao's
    codes with compat, else FP8 0x7F and 0 for the rest)."""
    import ml_dtypes
    r = np.asarray(r, np.float64)
    nan = np.isnan(r)
    if elem == "int8":
        return np.where(nan, 0, np.nan_to_num(r) * 64).astype(np.int64) & 0xFF
    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
          "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
          "e2m1": ml_dtypes.float4_e2m1fn}[elem]
    codes = np.where(nan, 0, r).astype(dt).view(np.uint8).astype(np.int64)
    nan_code = {"e2m3": 12, "e3m2": 14, "e2m1": 3}.get(elem, 0x7F) if compat == "torchao" else \
        (0x7F if elem in ("e4m3", "e5m2") else 0)
    if compat == "torchao":  # torchao's bit routine keeps the NaN's sign bit
        sbit = {"e2m3": 0x20, "e3m2": 0x20, "e2m1": 0x8}.get(elem, 0x80)
        nan_code = np.where(np.signbit(r), nan_code | sbit, nan_code)
    return np.where(nan, nan_code, codes)


def ref_nvfp4(x2, g=None, recipe="modelopt"):
    """(block scale codes, e2m1 codes, y) of NVFP4 over the last axis of x2
    (spec §5.1 / §5.2); modelopt's g defaults to f32(amax / 2688)."""
    import ml_dtypes
    x2 = np.asarray(x2, F32)
    blk, k = _blocks(x2, 16)
    bamax = np.max(np.abs(blk), axis=-1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if recipe == "modelopt":
            if g is None:
                g = r32(np.max(np.abs(x2)).astype(np.float64) / 2688)
            g = np.float64(F32(g))
            bs = r32(bamax / np.float64(r32(6 * g))).astype(np.float64)
            bs = np.where(bs == 0, 1.0, bs)
            s = np.where(np.isnan(bs), np.nan, np.clip(bs, 2.0 ** -9, 448))
        else:
            b = r32(bamax / 6).astype(np.float64)
            pre = b if g is None else r32(b / np.float64(F32(g))).astype(np.float64)
            s = np.where(np.isnan(pre), np.nan, np.clip(pre, 2.0 ** -6, 448))
        s8c = r32(s).astype(ml_dtypes.float8_e4m3fn)
        s8 = s8c.astype(np.float64)[..., None]
        xb = blk.astype(np.float64)
        if recipe == "modelopt":
            sg = r32(s8 * np.float64(g)).astype(np.float64)
            v = r32(xb / sg).astype(np.float64)
            r = ref_elem_round(v, "e2m1")
            r = np.where(np.isnan(v), 6.0, np.where(v == 0, 0.0, r))
            y = r32((r + 0.0) * sg)
        else:
            rr = r32(1.0 / s8) if g is None else r32(np.float64(r32(1 / np.float64(F32(g)))) / s8)
            v = r32(xb * rr).astype(np.float64)
            r = ref_elem_round(v, "e2m1")
            y = r32(r * (s8 if g is None else r32(np.float64(F32(g)) * s8)))
    nan_code = 7 if recipe == "modelopt" else 4  # (torchao: every element of a NaN block)
    codes = np.where(np.isnan(r), nan_code,
                     ref_mx_codes(np.where(np.isnan(r), 0, r), "e2m1"))
    rows = x2.shape[0]
    return (s8c.view(np.uint8).astype(np.int64), codes.reshape(rows, -1)[:, :k],
            y.reshape(rows, -1)[:, :k])


def oracle(module):
    """Import a live reference package: skip the test where it is missing,
    except under ``make test`` (``QC_REQUIRE_ORACLES=1``: the test extra
    installs it, and a check that skips there checks nothing)."""
    import pytest
    if os.environ.get("QC_REQUIRE_ORACLES") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)
