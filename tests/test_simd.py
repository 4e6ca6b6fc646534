"""The builds of the CPU loops (baseline x86-64-v2, and the x86-64-v3 /
AVX2 + FMA and x86-64-v4 / AVX-512 builds chosen at run time) give the same
bits on every recipe and mode.

The rest of the suite runs on the build the machine selects; this file runs
each kernel family under every build that this CPU can run, on inputs full
of ties, out-of-range values, NaN, +-inf, signed zeros and subnormals, in
every layout the loops have (per tensor, per channel with inner > 1, per
channel along the last axis).
"""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import quantcore as qc
from quantcore import ops, torch_numerics
from quantcore._cpu import _kernels as K
from quantcore.compat import torch as T
from reference import assert_bits_equal, assert_same_bytes, ref_mx_fake_quant, ref_nvfp4

pytestmark = pytest.mark.skipif(not K.simd_v3_built(), reason="no AVX2 build on this platform")


def runnable_builds():
    """The builds compiled in that this CPU can run (selecting a build the
    CPU lacks falls back to a lower one)."""
    original = K.simd_variant()
    try:
        return [b for b in K.simd_builds() if K.select_simd(b) == b]
    finally:
        K.select_simd(original)


def test_every_compiled_build_is_exercised_or_said_not_to_be():
    """A build this CPU cannot run (the x86-64-v4 loops on an AVX2-only CPU)
    is compiled but never checked here: the run says so in its skip
    summary (pytest -ra), naming the build, instead of passing silently."""
    idle = [b for b in K.simd_builds() if b not in runnable_builds()]
    if idle:
        pytest.skip(f"the {', '.join(idle)} loops were compiled but NOT exercised: this CPU "
                    f"cannot run them (checked only on a CPU that has them)")


@pytest.fixture(scope="module")
def both():
    """Run a function under each build this CPU can run (at least the
    baseline and one other); restore the automatic choice."""
    builds = runnable_builds()
    if len(builds) < 2:
        pytest.skip("this CPU has no AVX2 + FMA")
    original = K.simd_variant()

    def run(f):
        results = []
        for b in builds:
            assert K.select_simd(b) == b
            results.append(f())
        return results
    yield run
    K.select_simd(original)


def same(first, *others):
    """Every build's result is byte for byte the baseline's."""
    for other in others:
        assert_same_bytes(first, other)


def data(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 30
    flat = x.reshape(-1)
    k = flat.size // 4
    flat[:k] = rng.integers(-600, 600, k) / 4.0                        # ties at 0.25 / 0.5
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, 1e30]
    flat[k:k + len(special)] = special
    with np.errstate(over="ignore"):
        return x.astype(dtype)


SHAPES = [(5000,), (6, 7, 333), (70000,), (333, 17)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_affine_every_mode(both, dtype, shape):
    x = data(dtype, shape, 1)
    C = shape[-1]
    s_c = np.linspace(0.05, 0.5, C)
    for rounding, zpa, sop, nf in itertools.product(
            list(ops.ROUNDING), ["after_rounding", "before_rounding", "none"],
            ["mul_inverse", "div"], ["propagate", "nan_to_qmin", "int64"]):
        kw = dict(rounding=rounding, zero_point_add=zpa, scale_op=sop, nonfinite=nf)
        zp = 0 if zpa == "none" else (3 if zpa == "after_rounding" else 2.5)
        r = both(lambda: (qc.fake_quant_with_mask(x, 0.25, zp, -128, 127, **kw),
                          qc.fake_quant_with_mask(x, s_c, zp, -128, 127, axis=x.ndim - 1, **kw),
                          qc.quantize(x, 0.25, zp, -128, 127, rounding=rounding,
                                      zero_point_add=zpa, scale_op=sop)))
        same(*r)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_modes_and_exact_kernel(both, dtype):
    x = data(dtype, (6, 7, 333), 2)
    s = np.linspace(0.01, 0.2, 7).astype(np.float32)
    for zp in (np.arange(7, dtype=np.int32), np.linspace(-3, 3, 7).astype(np.float32),
               np.linspace(-3, 3, 7).astype(np.float16)):
        same(*both(lambda: T.fake_quantize_per_channel_affine_cachemask(x, s, zp, 1, -128, 127)))
        same(*both(lambda: T.fake_quantize_per_channel_affine_cachemask(
            np.moveaxis(x, 1, -1).copy(), s, zp, 2, -128, 127)))
    # int32 ranges: the exact-integer kernel
    zp32 = np.full(7, 2 ** 31 - 100, np.int32)
    same(*both(lambda: T.fake_quantize_per_channel_affine_cachemask(x, s, zp32, 1, -2 ** 31,
                                                                    2 ** 31 - 1)))
    same(*both(lambda: T.fake_quantize_per_tensor_affine_cachemask(x, 0.5, -2139548205,
                                                                   -2 ** 31, 2 ** 31 - 1)))
    same(*both(lambda: T.fake_quantize_per_tensor_affine_cachemask(x, 0.05, 7, 0, 255)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_nudged_amax_ste(both, dtype, shape):
    x = data(dtype, shape, 3)
    C = shape[-1]
    ax = x.ndim - 1
    nmin, nmax = -np.linspace(1, 3, C), np.linspace(2, 5, C)
    for formula in ("tensorflow", "mindspore"):
        for sop in ("mul_inverse", "div"):
            same(*both(lambda: (
                qc.fake_quant_nudged(x, -2.0, 3.0, 5 / 255, formula=formula, scale_op=sop,
                                     return_mask=True),
                qc.fake_quant_nudged(x, nmin, nmax, (nmax - nmin) / 255, formula=formula,
                                     scale_op=sop, axis=ax, return_mask=True))))
    with np.errstate(invalid="ignore"):
        absx = np.nan_to_num(np.abs(x), nan=0.0, posinf=0.0)
    for unsigned, narrow in itertools.product([False, True], [False, True]):
        xx = absx if unsigned else np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        same(*both(lambda: (
            qc.fake_quant_amax(xx, 20.0, 6, unsigned=unsigned, narrow_range=narrow,
                               return_mask=True),
            qc.fake_quant_amax(xx, np.linspace(1, 30, C), 4, unsigned=unsigned,
                               narrow_range=narrow, axis=ax, return_mask=True))))
    mask = np.random.default_rng(4).random(shape) > 0.4
    same(*both(lambda: qc.ste_backward(x, mask)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES + [(3, 70001)])
def test_minmax_and_signed_zeros(both, dtype, shape):
    x = data(dtype, shape, 5)
    clean = np.where(np.isnan(x), 0, x).astype(dtype)
    zeros = np.zeros(shape, dtype)
    zeros.reshape(-1)[::3] = -0.0
    for arr in (x, clean, zeros, -zeros):
        for policy in ("propagate", "omit"):
            same(*both(lambda: [qc.minmax(arr, nan_policy=policy)] +
                       [qc.minmax(arr, axis=a, nan_policy=policy) for a in range(arr.ndim)]))


def test_histograms_and_fused_step(both):
    x = np.abs(data(np.float32, (200000,), 6))
    x = np.where(np.isfinite(x), x, 1.0).astype(np.float32)
    for lo, hi, bins in ((0.0, 30.0, 2048), (0.0, 3e38, 7), (0.5, 0.5000001, 16)):
        same(*both(lambda: K.histc_f32(x, bins, lo, hi, False, False, 2)))
    same(*both(lambda: torch_numerics.histc_f32(x - 15, 2048, 0.0, 0.0, absolute=True,
                                             skip_zeros=True)))

    def steps():
        fq = qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.1), -128, 127)
        out = [fq(data(np.float32, (70000,), k)) for k in range(4)]
        return out, fq.scale, fq.zero_point
    with pytest.warns(RuntimeWarning):  # the inputs hold NaN: those batches are skipped
        same(*both(steps))


def test_numpy_histogram_counting_loops(both):
    """onnxruntime's np.histogram counts (_hist: its own builds of
    qc_hist_loops.cpp, switched with _kernels') equal numpy's in every
    build: uniform bins over a range and over the data (values on and
    beside every edge, zeros on an edge, NaN, infinities, |x|), and
    explicit edges; 1 and 2 threads, and lengths that leave a partial
    round and a partial group of interleaved histograms; and min |x|."""
    from quantcore._cpu import _hist as H
    from quantcore.compat.onnxruntime.histogram import np_histogram
    x = data(np.float32, (70001,), 12)
    edges = np.linspace(-3.0, 3.0, 129, dtype=np.float32)
    near = np.concatenate([np.nextafter(edges, -np.inf), edges, np.nextafter(edges, np.inf),
                           np.zeros(1000, np.float32)]).astype(np.float32)
    cases = [(x, 2048, None, False), (x, 128, (-50.0, 50.0), False), (x, 33, None, True),
             (near, 128, (-3.0, 3.0), False), (near, 2048, None, True),
             (near[:259], 7, None, False),
             (x, np.array([-40.0, -1.0, 0.0, 0.0, 2.5, 1e30]), None, True)]

    # (a range taken from the data: its finite values below 1e6)
    cases = [(a[np.abs(a) < 1e6] if rng is None and np.ndim(bins) == 0 else a, bins, rng,
              absolute) for a, bins, rng, absolute in cases]

    def counts():
        return [np_histogram(a, bins, rng, absolute=absolute)[0]
                for a, bins, rng, absolute in cases] + [H.absmin_f32(x, 2), H.absmin_f32(near)]

    want = [np.histogram(np.abs(a) if absolute else a, bins, rng)[0]
            for a, bins, rng, absolute in cases] + [np.nan, 0.0]
    original = H.simd_variant()
    try:
        for got in both(lambda: (H.select_simd(K.simd_variant()), counts())[1]):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)   # (NaN equal to NaN)
    finally:
        H.select_simd(original)


@pytest.mark.parametrize("cap", ["baseline", "x86-64-v3"])
def test_the_environment_variable_caps_the_build(cap):
    env = dict(os.environ, QUANTCORE_SIMD=cap)
    code = ("from quantcore._cpu import _kernels as K; import quantcore as qc; "
            "print(K.simd_variant(), qc.build_info()['simd_in_use'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    want = cap if cap in runnable_builds() else "baseline"
    assert out == [want, want]


def test_build_info_names_the_build_in_use():
    info = qc.build_info()
    assert info["simd_in_use"] == K.simd_variant()
    names = [v.split()[0] for v in info["simd_runtime_variants"]]
    assert ["baseline"] + names == K.simd_builds()
    # a plain build makes every level the compiler takes (the x86-64-v4 one
    # needs GCC 12 / Clang 16)
    assert "x86-64-v3" in names
    assert K.simd_variant() == runnable_builds()[-1]


def test_select_simd_refuses_an_unknown_build():
    with pytest.raises(ValueError, match="level"):
        K.select_simd("avx9")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_and_integer_codes(both, dtype, shape):
    """The fp8 family (fake casts, fake quant of every recipe), the encode
    and decode families (cast_fp8, fp8_decode, ONNX Q / DQ to int and FP8
    codes, per tensor and per channel along either layout)."""
    from quantcore import formats as F
    x = data(dtype, shape, 7)
    ax = x.ndim - 1
    C = shape[-1]
    amax_c = np.linspace(5, 400, C)
    for fmt in F.FP8_FORMATS:
        for overflow in ("satfinite", "nonsat"):
            same(*both(lambda: (F.cast_fp8(x, fmt, overflow=overflow),
                                F.fp8_fake_cast(x, fmt, overflow=overflow))))
        for recipe in ("modelopt", "torchao"):
            if fmt not in {"modelopt": ("e4m3fn",), "torchao": ("e4m3fn", "e5m2")}[recipe]:
                continue  # (the formats each recipe takes)
            pow2 = recipe == "torchao"
            same(*both(lambda: (
                F.fp8_fake_quant(x, 100.0, fmt, recipe=recipe, return_mask=True),
                F.fp8_fake_quant(x, amax_c, fmt, recipe=recipe, axis=ax),
                F.fp8_fake_quant(x, 3.0, fmt, recipe=recipe, pow2=pow2),
                F.fp8_quantize(x, amax_c, fmt, recipe=recipe, axis=ax))))
            q8 = F.fp8_quantize(x, 100.0, fmt, recipe=recipe)
            same(*both(lambda: F.fp8_dequantize(q8[0], q8[1], fmt, recipe=recipe)))
        codes = F.cast_fp8(x, fmt)
        same(*both(lambda: F.fp8_decode(codes, fmt, dtype=dtype)))
    xf = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
    s_c = np.linspace(0.05, 0.5, C).astype(np.float32)
    for zp in (np.int8(3), np.uint8(130), np.int16(-7), np.uint16(40000)):
        q = both(lambda: (qc.quantize_linear(xf, np.float32(0.25), zp),
                          qc.quantize_linear(xf, s_c, np.full(C, zp), axis=ax)))
        same(*q)
        same(*both(lambda: (qc.dequantize_linear(q[0][0], np.float32(0.25), zp),
                            qc.dequantize_linear(q[0][1], s_c, np.full(C, zp), axis=ax))))


@pytest.mark.parametrize("recipe", ["onnx", "onnx_numpy", "torchao", "tinygemm", "hqq", "awq",
                                    "gptq"])
def test_group_recipes(both, recipe):
    from quantcore import formats as F
    assert recipe in F.GROUP_RECIPES
    w = data(np.float32, (24, 384), 8)
    w = np.nan_to_num(w, nan=0.0, posinf=1e3, neginf=-1e3).astype(np.float32)
    groups = ((4, 32, False), (4, 64, True), (8, 128, False))
    if recipe.startswith("onnx"):
        groups += ((3, 100, False),)  # (a shorter last group)
    for bits, g, sym in groups:
        try:
            F.group_qrange(bits, recipe, symmetric=sym)
        except ValueError:
            continue  # (a recipe that has no such range)
        same(*both(lambda: (F.group_quantize(w, bits, g, recipe=recipe, symmetric=sym),
                            F.group_fake_quant(w, bits, g, recipe=recipe, symmetric=sym))))


def test_block_scaled_recipes(both):
    from quantcore import mx
    x = data(np.float32, (40, 256), 9)
    xf = np.nan_to_num(x)
    for e in sorted(mx.MX_ELEMENTS):
        for kw in (dict(), dict(elem_rounding="half_away", scale_mode="rceil"),
                   dict(compat="microxcaling"), dict(compat="torchao", scale_mode="even")):
            if e == "int8" and kw.get("compat") == "torchao":
                continue  # (torchao has no MX int8)
            same(*both(lambda: (qc.mx_fake_quant(x, e, **kw), qc.mx_quantize(x, e, **kw))))
    for r in ("modelopt", "torchao"):
        same(*both(lambda: (qc.nvfp4_fake_quant(xf, recipe=r),
                            qc.nvfp4_fake_quant(xf[:, :200], recipe=r))))
    # the block driver's two paths: full blocks (K a multiple of 16 / 32:
    # contiguous, constant trip counts) and the general one (a shorter last
    # block) give the same bits on the blocks they share, in every build
    g = np.float32(0.01)
    for pairs in both(lambda: [
            (f(xf[:, :224]), f(xf[:, :232])[:, :224])
            for f in (lambda a: qc.mx_fake_quant(a, "e4m3"),
                      lambda a: qc.mx_quantize(a, "e2m1", scale_mode="rceil")[1][:, :112],
                      lambda a: qc.nvfp4_fake_quant(a, g, recipe="torchao"))]):
        for full, part in pairs:
            assert_same_bytes(full, np.ascontiguousarray(part))


def test_engine_row_loops(both):
    """The engine writers' row loops (_engines, qc_eng_loops.cpp: its own
    builds, switched with _kernels') on BF16 bits and float32 values full
    of ties, specials and signed zeros."""
    from quantcore._cpu import _engines as E
    x = data(np.float32, (24, 256), 11)
    b = (x.view(np.uint32) >> 16).astype(np.uint16)
    s = np.geomspace(1e-3, 1e3, 24).astype(np.float32)
    d = np.geomspace(1e-2, 1e2, 24 * 16).astype(np.float32).reshape(24, 16)
    z = np.rint(np.linspace(-8, 7, 24 * 2)).astype(np.float32).reshape(24, 2)
    z8 = np.rint(np.linspace(-8, 7, 24 * 8)).astype(np.float32).reshape(24, 8)

    def loops():
        out = []
        for w in (b, x):
            for nt in (1, 2):
                out += [E.absmax_rows(w, nt), E.group_absmax_rows(w, 16, nt),
                        *E.group_minmax_rows(w, 32, nt),
                        *E.nvfp4_scales(np.abs(np.nan_to_num(x)), 0.37, "compressed-tensors-bf16",
                                        nt),
                        *E.nvfp4_scales(np.abs(np.nan_to_num(x)), 0.37, "modelopt", nt)]
                for r in (True, False):
                    out += [E.fp8_rows(w, s, r, nt), E.fp4_rows(w, d, 16, r, nt),
                            E.int_rows(w, d[:, :2].copy(), z, 128, -8, 7, r, nt, 4),
                            E.int_rows(w, d[:, :2].copy(), z, 128, -128, 127, r, nt, 0),
                            # (a group shorter than a vector: the spread-scale loop)
                            E.int_rows(w, d[:, :8].copy(), z8, 32, -8, 7, r, nt, 4),
                            E.int_rows(w, d[:, :8].copy(), z8, 32, -128, 127, r, nt, 0)]
        return out

    original = E.simd_variant()
    try:
        same(*both(lambda: (E.select_simd(K.simd_variant()), loops())[1]))
    finally:
        E.select_simd(original)


def binade_sweep():
    """float32 values in every binade (every exponent field, float32
    subnormals, +-Inf, NaN) with the mantissas where rounding to 1, 2 or 3
    mantissa bits (e2m1, e3m2 / e5m2, e4m3 / e2m3) changes: just below,
    at and just above each tie, with the kept last bit even and odd, and
    the carries into the next binade; both signs."""
    mant = [0, 1, 0x7FFFFF, 0x400000, 0x3FFFFF]
    for s in (20, 21, 22):
        half = 1 << (s - 1)
        for kept in (0, 1, 2, 3):
            base = kept << s
            mant += [base + half - 1, base + half, base + half + 1]
        mant += [(1 << 23) - half, (1 << 23) - half - 1]
    mant = np.unique(np.array(mant, np.int64) & 0x7FFFFF)
    exps = np.arange(0, 256, dtype=np.int64)
    bits = (exps[:, None] << 23 | mant[None, :]).reshape(-1)
    bits = np.concatenate([bits, bits | (1 << 31)]).astype(np.uint32)
    return bits.view(np.float32)


def test_grid_rounding_in_every_binade(both):
    """The rounding to a minifloat grid by one float addition (qc_mf_fake of
    qc_formats.h, qc_mx_round of qc_mx.h) on every binade and every tie of
    the 1-, 2- and 3-bit grids, under every build: the FP8 fake cast against
    the decoded codes of the integer encoder (float32 and float64), MX
    fake quant against the reference, in blocks of mixed scales and in
    blocks whose scale is 1 (amax pinned), NVFP4 against the reference."""
    from quantcore import formats as F
    from quantcore import mx
    x = binade_sweep()
    for fmt in F.FP8_FORMATS:
        for overflow in F.OVERFLOW:
            codes = F.cast_fp8(x, fmt, overflow=overflow)
            want = F.fp8_decode(codes, fmt)
            for y in both(lambda: F.fp8_fake_cast(x, fmt, overflow=overflow)):
                assert_bits_equal(y, want)
    x64 = x[~np.isnan(x)].astype(np.float64)
    want64 = F.fp8_decode(F.cast_fp8(x64, "e4m3fn"), "e4m3fn", dtype=np.float64)
    for y in both(lambda: F.fp8_fake_cast(x64, "e4m3fn")):
        assert_bits_equal(y, want64)
    rng = np.random.default_rng(3)
    mixed = rng.permutation(x)[: x.size // 32 * 32].reshape(-1, 32)
    for elem in sorted(mx.MX_ELEMENTS):
        if elem == "int8":
            continue
        emax = {"e4m3": 8, "e5m2": 15, "e2m3": 2, "e3m2": 4, "e2m1": 2}[elem]
        small = x[np.abs(x) < 2.0 ** (emax + 1)]
        pinned = np.concatenate([[np.float32(2.0 ** emax)], small]).astype(np.float32)[None, :]
        got = {}
        for rounding in ("rne", "half_away"):
            for row, bs in ((mixed, 32), (pinned, pinned.shape[1])):
                with np.errstate(invalid="ignore"):  # (the reference's NaN casts)
                    code, _, want = ref_mx_fake_quant(row, elem, bs, "floor",
                                                      rounding == "half_away")
                for y in both(lambda: qc.mx_fake_quant(row, elem, block_size=bs,
                                                       elem_rounding=rounding)):
                    assert_bits_equal(y, want)
            assert code[0, 0] == 127  # (the pinned block's scale is 1)
            got[rounding] = y
        assert not np.array_equal(got["rne"], got["half_away"])  # (ties are in it)
    finite = np.nan_to_num(mixed, nan=1.0, posinf=3e38, neginf=-3e38)
    for recipe in ("modelopt", "torchao"):
        g = np.float32(0.5) if recipe == "torchao" else None
        want = ref_nvfp4(finite, g, recipe)[2]
        for y in both(lambda: qc.nvfp4_fake_quant(finite, g, recipe=recipe)):
            assert_bits_equal(y, want)


def test_no_build_contracts_an_fma(both):
    """q = round(x * inv + zp) with x * inv rounded first (the default) and
    not (fma_zp: an explicit fma), on inputs where the two give different
    integers: every build gives the baseline's q in both modes, and the
    baseline's is what the mode says (x86-64-v2 has no FMA instruction; a
    build that contracted x * inv + zp into one would give the fma's q in
    the first mode).  The inputs: x * inv just above m + 0.25, rounded to
    m + 0.25 exactly, so that with zp = -999.75 the two-step sum is a tie
    (to even) and the one-step sum is above it."""
    s = np.float32(0.37)
    inv = np.float32(1) / s
    zp = np.float32(-999.75)
    t = np.arange(1000, 2000, dtype=np.float32) + np.float32(0.25)
    x0 = (t / inv).astype(np.float32)
    steps = np.arange(-6, 7).astype(np.int32)
    x = (x0.view(np.int32)[:, None] + steps).reshape(-1).view(np.float32)
    exact = x.astype(np.float64) * np.float64(inv)             # x * inv, exactly
    two = (x * inv).astype(np.float32) + zp                    # rounded, then added
    one = (exact + np.float64(zp)).astype(np.float32)          # rounded once (the fma)
    pick = np.rint(two) != np.rint(one)
    x, two, one = x[pick], two[pick], one[pick]
    assert x.size > 50, "no input tells the roundings apart"

    def run(mode):
        q = np.empty_like(x)
        K.ew_tensor(K.FAMILIES["affine"], x, q, None, s, inv, zp, 0, 0, -5000, 5000, mode, 1)
        return q
    for fma_zp in (False, True):
        mode = ops.affine_mode(zero_point_add="before_rounding", fma_zero_point=fma_zp,
                               output_q=True)
        r = both(lambda: run(mode))
        same(*r)
        assert np.array_equal(r[0], np.rint(one if fma_zp else two))
