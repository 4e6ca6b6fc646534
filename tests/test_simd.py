"""The two builds of the CPU loops (baseline x86-64-v2 and the AVX2 + FMA
build chosen at run time) give the same bits on every recipe and mode.

The rest of the suite runs on the build the machine selects; this file runs
each kernel family under both, on inputs full of ties, out-of-range values,
NaN, +-inf, signed zeros and subnormals, in every layout the loops have
(per tensor, per channel with inner > 1, per channel along the last axis).
"""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import quantcore as qc
from quantcore import torch_numerics
from quantcore._cpu import _kernels as K
from quantcore.compat import torch as T
from reference import assert_same_bytes

pytestmark = pytest.mark.skipif(not K.simd_v3_built(), reason="no AVX2 build on this platform")


@pytest.fixture(scope="module")
def both():
    """Run a function under each build; restore the automatic choice."""
    def run(f):
        results = []
        for allow in (False, True):
            K.select_simd(allow)
            results.append(f())
        return results
    original = K.simd_variant() != "baseline"
    if not K.select_simd(True).startswith("x86-64-v3"):
        K.select_simd(original)
        pytest.skip("this CPU has no AVX2 + FMA")
    yield run
    K.select_simd(original)


same = assert_same_bytes


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
            ["half_even", "half_up", "half_away"], ["after_rounding", "before_rounding", "none"],
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


def test_the_environment_variable_keeps_the_baseline():
    env = dict(os.environ, QUANTCORE_SIMD="baseline")
    code = ("from quantcore._cpu import _kernels as K; import quantcore as qc; "
            "print(K.simd_variant(), qc.build_info()['simd_in_use'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["baseline", "baseline"]


def test_build_info_names_the_build_in_use():
    info = qc.build_info()
    assert info["simd_in_use"] == K.simd_variant()
    assert info["simd_runtime_variants"] == ["x86-64-v3 (AVX2 + FMA)"]
