"""Four places where torch 2.13's fake quantization needs more than the core
kernel's ordinary modes, with the exact recipe torch follows.  They were
gaps of quantcore.compat.torch; the core now implements each (the exact-
integer kernel qc_fq_affine_exact, the QC_ROUND_F32 mode, the integer q of
QC_NF_INT64, and torch's histc rules).

Each has (1) a numpy model of what torch 2.13 CPU computes, checked against
live torch here, and (2) a test comparing quantcore with torch; the
matching flags of test_compat_torch_random.py are on.

Recipes:

1. int32-size ranges (``INT32_EXACT``): torch clamps q and forms ``q - zp``
   with exact integers (int64 / double); the core holds q, zp and the bounds
   in the compute dtype, where float32 cannot hold ``2**31 - 1`` or zero
   points beyond ``2**24``.
2. float64 input, float zero point, per channel (``F64_FLOAT_ZP_EXACT``):
   torch rounds ``x * inv + zp`` to float32 before ``lrintf``.
3. Per channel, float zero point equal to 0 (``SIGNED_ZERO_Q_EXACT``):
   torch's integer q has no signed zero; the core's float q can be -0.0.
4. ``torch.histc`` (``HISTC_EXACT``): a single-valued range is widened by at
   least one float32 ulp, and a value whose bin position overflows is
   counted in bin 0.
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.ao.quantization import observer as tob  # noqa: E402

from quantcore.compat import torch as T  # noqa: E402
from test_compat_torch import F32, npy, same, tt  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

I32 = (-2 ** 31, 2 ** 31 - 1)
INT32_RANGES = [I32, (0, 2 ** 31 - 1), (-2 ** 31, 0)]


# ====================================================== torch's recipes
def x86_int64(v):
    """``static_cast<int64_t>(v)`` / ``lrintf`` result on x86-64: NaN, inf
    and values outside the int64 range give INT64_MIN."""
    v = np.asarray(v, np.float64)
    ok = np.isfinite(v) & (v >= -2.0 ** 63) & (v < 2.0 ** 63)
    return np.where(ok, np.where(ok, v, 0).astype(np.int64), np.int64(-2 ** 63))


def model_per_tensor(x, scale, zp, qmin, qmax):
    """torch 2.13 CPU ``fake_quantize_per_tensor_affine_cachemask``.

    T = float32 (float16 input upcast) or float64::

        s = f32(scale); inv = f32(1 / s)
        qf = T(zp) + rint(T(x) * T(inv))      (zp rounded to T, added after rint)
        mask = T(qmin) <= qf <= T(qmax)       (bounds rounded to T!)
        q = int64(fmin(fmax(double(qf), qmin), qmax))    exact bounds; NaN -> qmin
        y = f32(f32(q - zp) * s)              exact integer difference, then float32
        out = y cast to x's dtype
    """
    s = F32(scale)
    with np.errstate(all="ignore"):
        inv = F32(F32(1) / s)
        if x.dtype == np.float64:
            qf = np.float64(zp) + np.rint(x * np.float64(inv))
            mask = (np.float64(qmin) <= qf) & (qf <= np.float64(qmax))
        else:
            xf = x.astype(F32)
            qf = (F32(zp) + np.rint((xf * inv).astype(F32))).astype(F32)
            mask = (F32(qmin) <= qf) & (qf <= F32(qmax))
        q = np.fmin(np.fmax(qf.astype(np.float64), float(qmin)), float(qmax)).astype(np.int64)
        y = ((q - np.int64(zp)).astype(F32) * s).astype(F32)
    return y.astype(x.dtype), mask


def model_per_channel(x, scale, zp, axis, qmin, qmax):
    """torch 2.13 CPU ``fake_quantize_per_channel_affine_cachemask``.

    Per element, ``s = scale[c]`` (float32), ``inv = f32(1 / s)``::

        int32 zp:   v  = T(zp) + rint(T(x) * T(inv))          (T as per tensor)
                    qi = int64(v)                              (x86: INT64_MIN)
        float zp:   v  = fmaf(x, inv, zp)      float32 x, float32 zp (FMA)
                    v  = f32(f32(x * inv) + zp)  float32 x, float16 zp (no FMA)
                    v  = f32(fma(x, inv, zp))  float64 x: double, then ROUNDED TO FLOAT32
                    qi = lrintf(v)             half-even, x86: INT64_MIN
        mask = qmin <= qi <= qmax             exact integers
        q    = clamp(qi, qmin, qmax)           exact integers (no -0.0)
        out  = T_x((double(q) - double(zp)) * double(s))
    """
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    s = scale.astype(F32).reshape(shape)
    with np.errstate(all="ignore"):
        inv = (F32(1) / s).astype(F32)
        if zp.dtype.kind in "iu":
            z = zp.astype(np.int64).reshape(shape)
            if x.dtype == np.float64:
                v = z.astype(np.float64) + np.rint(x * inv.astype(np.float64))
            else:
                xf = x.astype(F32)
                v = (z.astype(F32) + np.rint((xf * inv).astype(F32))).astype(F32)
            zd = z.astype(np.float64)
        else:
            zd = zp.astype(np.float64).reshape(shape)
            p = x.astype(np.float64) * inv.astype(np.float64)      # exact for float32 x
            if x.dtype == np.float64 or zp.dtype == np.float16:
                if zp.dtype == np.float16 and x.dtype != np.float64:
                    v = (p.astype(F32) + zd.astype(F32)).astype(F32)
                else:
                    v = (p + zd).astype(F32)
            else:
                v = _fmaf(x.astype(F32), inv, zd.astype(F32))
            v = np.rint(v)
        qi = x86_int64(v)
        mask = (qi >= qmin) & (qi <= qmax)
        q = np.clip(qi, qmin, qmax)
        out = ((q.astype(np.float64) - zd) * s.astype(np.float64)).astype(x.dtype)
    return out, mask


def _fmaf(a, b, c):
    """Correctly rounded float32 fma (exact product in float64, exact sum by
    TwoSum, round to odd, then to float32)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    fix = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def model_histc(x, bins, lo, hi):
    """torch 2.13 CPU ``torch.histc(x, bins, min=lo, max=hi)`` on float32 x.

        lo == hi: lo, hi = data min / max; if still equal:
            lo = min(double(nextafter_f32(f32(lo), -inf)), lo - 1)
            hi = max(double(nextafter_f32(f32(hi), +inf)), hi + 1)
        edges = linspace(f32(lo), f32(hi), bins + 1) in float32
        f32(hi - lo) == inf: the edges are NaN and every value is skipped
        kept: l <= x <= h;  t = f32(f32(f32(x - l) * bins) / f32(h - l))
        bin = trunc(t), bins - 1 when t == bins; t inf / NaN -> bin 0 (the
        INT64_MIN index wraps to element 0)
    """
    lo, hi = float(lo), float(hi)
    if lo == hi and x.size:
        lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        lo = min(float(np.nextafter(F32(lo), F32(-np.inf))), lo - 1.0)
        hi = max(float(np.nextafter(F32(hi), F32(np.inf))), hi + 1.0)
    l32, h32 = F32(lo), F32(hi)
    with np.errstate(all="ignore"):
        if not np.isfinite(F32(h32 - l32)):
            return np.zeros(bins, F32)
        sel = x[(x >= l32) & (x <= h32)]
        t = ((sel - l32).astype(F32) * F32(bins)).astype(F32) / F32(h32 - l32)
    fin = np.isfinite(t)
    pos = np.where(fin, np.trunc(np.where(fin, t, 0)), 0).astype(np.int64)
    pos[pos >= bins] = bins - 1
    return np.bincount(pos, minlength=bins)[:bins].astype(F32)


# ============================================================= inputs
def int32_case(rng, n=64):
    qmin, qmax = INT32_RANGES[int(rng.integers(0, len(INT32_RANGES)))]
    zp = int(rng.integers(qmin, qmax + 1)) if rng.random() < 0.7 else \
        int(rng.choice([qmin, qmax, qmax - 128, qmin + 128, 2 ** 24 + 1, 0]))
    zp = min(max(zp, qmin), qmax)
    s = float(10.0 ** rng.uniform(-3, 3))
    x = (rng.uniform(-1, 1, n) * 2.0 ** rng.uniform(0, 33) * s).astype(F32)
    x[:4] = [np.nan, np.inf, -np.inf, 0]
    # values whose q lands on 2**31 - 1, 2**31, -2**31 and beyond
    x[4:8] = ((np.array([2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 200]) - zp) * F32(s)
              ).astype(F32)
    return x, s, zp, qmin, qmax


def bits(a):
    a = np.asarray(a)
    return a.view(np.uint64 if a.itemsize == 8 else np.uint32 if a.itemsize == 4
                  else np.uint16)


# ======================================================= models vs torch
def test_models_match_torch_int32_ranges():
    """The recipes above are torch's: 0 mismatches on random int32-range cases
    (per tensor float32/float64/float16, per channel int32/float32/float16
    zero points, float32/float64 input)."""
    rng = np.random.default_rng(300)
    for case in range(400):
        x, s, zp, qmin, qmax = int32_case(rng)
        for dt in (F32, np.float64, np.float16):
            if dt == np.float16:
                xx = np.clip(np.nan_to_num(x, nan=0), -6e4, 6e4).astype(dt)
            else:
                xx = x.astype(dt)
            o, m = model_per_tensor(xx, s, zp, qmin, qmax)
            to, tm = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
                tt(xx), s, zp, qmin, qmax)
            assert np.array_equal(bits(o), bits(npy(to))) and np.array_equal(m, npy(tm)), \
                (case, dt, s, zp)
        C = 3
        S = (10.0 ** rng.uniform(-3, 3, C)).astype(F32)
        Z = np.array([min(max(int(rng.integers(qmin, qmax + 1)), qmin), qmax) for _ in range(C)],
                     np.int32)
        X = (rng.uniform(-1, 1, (C, 40)) * 2.0 ** rng.uniform(0, 33, (C, 1)) * S[:, None]
             ).astype(F32)
        X[:, :3] = [np.nan, np.inf, -np.inf]
        X[:, 3:7] = ((np.array([2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 200])[None, :]
                      - Z[:, None].astype(np.int64)) * S[:, None]).astype(F32)
        for dt in (F32, np.float64):
            XX = X.astype(dt)
            zps = [Z, (Z.astype(np.float64) + rng.uniform(-0.5, 0.5, C)).astype(F32)]
            for zz in zps:
                o, m = model_per_channel(XX, S, zz, 0, qmin, qmax)
                to, tm = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
                    tt(XX), tt(S), tt(zz), 0, qmin, qmax)
                assert np.array_equal(bits(o), bits(npy(to))) and \
                    np.array_equal(m, npy(tm)), (case, dt, zz.dtype, S, zz)


def test_models_match_torch_float_zero_points():
    """Per channel float zero points at small ranges: float16 zero points are
    not fused, float64 input rounds to float32 before lrintf, and a zero
    point of 0 never gives -0.0."""
    rng = np.random.default_rng(301)
    for case in range(300):
        C = 4
        S = np.where(rng.random(C) < 0.5, 2.0 ** rng.integers(-8, 3, C),
                     10.0 ** rng.uniform(-4, 1, C)).astype(F32)
        Z = np.where(rng.random(C) < 0.3, 0.0, np.round(rng.uniform(-10, 260, C) * 4) / 4)
        X = ((rng.integers(-20, 280, (C, 32)) - Z[:, None] + rng.choice(
            [0.5, -0.5, 0.25, 1e-9, -1e-9, 0.0], (C, 32))) * S[:, None])
        X[:, :2] = [-0.0, -0.1 * S[0]]
        for zdt in (F32, np.float16):
            for xdt in (F32, np.float64):
                zz, XX = Z.astype(zdt), X.astype(xdt)
                o, m = model_per_channel(XX, S, zz, 0, -128, 255)
                to, tm = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
                    tt(XX), tt(S), tt(zz), 0, -128, 255)
                assert np.array_equal(bits(o), bits(npy(to))) and \
                    np.array_equal(m, npy(tm)), (case, zdt, xdt)


def test_histc_model_matches_torch():
    rng = np.random.default_rng(302)
    for case in range(600):
        if case % 2:
            v = F32(10.0 ** rng.uniform(-3, 38.5) * rng.choice([-1, 1]))
            x, lo, hi = np.array([v, v], F32), float(v), float(v)
        else:
            lo = -float(F32(10.0 ** rng.uniform(0, 38.5)))
            hi = float(F32(10.0 ** rng.uniform(-3, 38.2) * rng.choice([-1, 1])))
            if hi <= lo:
                continue
            x = np.concatenate([rng.uniform(lo, hi, 20), [lo, hi]]).astype(F32)
        b = int(rng.choice([7, 8, 16, 2048]))
        same(model_histc(x, b, lo, hi), npy(torch.histc(tt(x), b, min=lo, max=hi)),
             f"case {case} [{lo}, {hi}] bins={b}")


# ============================================== quantcore vs torch
def test_fake_quantize_large_integer_zero_point():
    x = np.array([1e3, -5e3, 7.0], F32)
    zp = -2139548205
    out = T.fake_quantize_per_tensor_affine(x, 2.1172052852051544, zp, -2 ** 31, 2 ** 31 - 1)
    to = torch.fake_quantize_per_tensor_affine(tt(x), 2.1172052852051544, zp, -2 ** 31,
                                               2 ** 31 - 1)
    same(out, npy(to), "per tensor")
    out = T.fake_quantize_per_channel_affine(x[None], np.array([2.0], F32),
                                             np.array([zp], np.int32), 0, -2 ** 31, 2 ** 31 - 1)
    to = torch.fake_quantize_per_channel_affine(tt(x[None]), torch.tensor([2.0]),
                                                torch.tensor([zp], dtype=torch.int), 0,
                                                -2 ** 31, 2 ** 31 - 1)
    same(out, npy(to), "per channel")


def test_fake_quantize_per_channel_int32_clamp():
    x = np.array([[1e10, 3.0]], F32)
    # zp = 2**31 - 128 is exact in float32, so only the clamp bound differs
    for zp in (np.array([2 ** 31 - 128], np.int32), np.array([2 ** 31 - 128], F32)):
        out = T.fake_quantize_per_channel_affine(x, np.array([1.0], F32), zp, 0, -2 ** 31,
                                                 2 ** 31 - 1)
        to = torch.fake_quantize_per_channel_affine(tt(x), torch.tensor([1.0]), tt(zp), 0,
                                                    -2 ** 31, 2 ** 31 - 1)
        same(out, npy(to), str(zp.dtype))


def test_fake_quantize_per_channel_int32_mask():
    # q = 2**31 exactly: torch's int64 mask is False (> 2**31 - 1), float32's True
    x = np.array([[2.0 ** 31]], F32)
    _, mask = T.fake_quantize_per_channel_affine_cachemask(
        x, np.array([1.0], F32), np.array([0], np.int32), 0, -2 ** 31, 2 ** 31 - 1)
    _, tm = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
        tt(x), torch.tensor([1.0]), torch.tensor([0], dtype=torch.int), 0, -2 ** 31,
        2 ** 31 - 1)
    same(mask, npy(tm))


def test_int32_ranges_random():
    rng = np.random.default_rng(310)
    for case in range(200):
        x, s, zp, qmin, qmax = int32_case(rng, 32)
        same(T.fake_quantize_per_tensor_affine_cachemask(x, s, zp, qmin, qmax)[0],
             model_per_tensor(x, s, zp, qmin, qmax)[0], f"case {case} per tensor")
        z = np.array([zp], np.int32)
        out, mask = T.fake_quantize_per_channel_affine_cachemask(
            x[None], np.array([s], F32), z, 0, qmin, qmax)
        ro, rm = model_per_channel(x[None], np.array([s], F32), z, 0, qmin, qmax)
        same(out, ro, f"case {case} per channel")
        same(mask, rm, f"case {case} per channel mask")


def test_per_channel_float64_input_float_zero_point():
    x = np.array([[2.25 - 1e-12, 3.25 - 1e-12, 2.25 + 1e-12]], np.float64)
    for zdt in (F32, np.float16):
        z = np.array([0.25], zdt)
        out = T.fake_quantize_per_channel_affine(x, np.array([1.0], F32), z, 0, 0, 255)
        to = torch.fake_quantize_per_channel_affine(tt(x), torch.tensor([1.0]), tt(z), 0, 0,
                                                    255)
        same(out, npy(to), str(zdt))       # torch: [1.75, 3.75, 1.75]


def test_per_channel_float_zero_point_zero_sign():
    x = np.array([[-0.1, -0.0, 0.3, -0.6]], F32)
    out = T.fake_quantize_per_channel_affine(x, np.array([1.0], F32), np.array([0.0], F32), 0,
                                             -128, 127)
    to = torch.fake_quantize_per_channel_affine(tt(x), torch.tensor([1.0]), torch.tensor([0.0]),
                                                0, -128, 127)
    same(out, npy(to))                     # torch: [0, 0, 0, -1], quantcore [-0, 0, 0, -1]


def test_histogram_observer_single_large_value():
    x = np.array([1e30, 1e30], F32)
    o, t = T.HistogramObserver(bins=8), tob.HistogramObserver(bins=8)
    o(x)
    t(tt(x))
    same(o.histogram, npy(t.histogram))    # torch: the middle bin


def test_histogram_observer_overflowing_bin_position():
    x = np.array([-3e38, -1e-3, -5e-3, 1.0], F32)
    o, t = T.HistogramObserver(bins=16), tob.HistogramObserver(bins=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o(x)
        t(tt(x))
    same(o.histogram, npy(t.histogram))    # torch: [4, 0, ..., 0]
