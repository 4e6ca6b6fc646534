"""float32 subnormals on the GPU path: CuPy's own operations flush them.

Real CuPy compiles its built-in operations (astype, arithmetic, comparisons,
abs, reductions) with ``-ftz=true`` (cupy/cuda/compiler.py), so a float32
subnormal that goes through one is read or written as a zero of its sign;
numpy keeps it.  The fake cupy of tests/cudaemu models that rule
(tests/cudaemu/cupy/_ftz.py).  Here every public entry point whose Python
code works on cupy data runs on subnormal-rich input and must give the CPU's
bits, and -- with the fake's instrumentation -- must not run any float32 CuPy
built-in on a data-sized array at all (its data goes through the project's
kernels, compiled with --ftz=false, or through integer operations on the
bits).
"""
import importlib

import numpy as np
import pytest

import quantcore as qc
from quantcore import qparams as Q
from quantcore import torch_numerics as TN
from quantcore.calib import MaxCalibrator
from quantcore.compat import tensorflow as TF
from quantcore.compat.nvidia.tensor_quantizer import Clip
from reference import assert_bits_equal, gpu_cupy

NQ = importlib.import_module("quantcore.compat.nvidia.tensor_quant")
cp = gpu_cupy()
pytestmark = pytest.mark.gpu

ROWS, K = 8, 512
N = ROWS * K
TINY = [2.0 ** -149, -2.0 ** -149, 2.0 ** -140, -2.0 ** -140, 2.0 ** -127, -2.0 ** -127,
        2.0 ** -126 - 2.0 ** -149, 1e-40, -1e-40, 0.0, -0.0]


def _data(seed=7):
    """(8, 512) float32: normal values with every fourth one a subnormal,
    one row all subnormal (its statistics are subnormal too)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ROWS, K)) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[::4] = np.array(TINY, np.float32)[rng.integers(0, len(TINY), flat[::4].size)]
    x[5] = (rng.standard_normal(K) * 2.0 ** -135).astype(np.float32)
    x[6] = np.abs(x[6]) * np.float32(2.0 ** -140)   # non-negative, tiny
    return x


X = _data()
Q8 = ((np.arange(N) * 37) % 256 - 128).astype(np.int8).reshape(ROWS, K)
SCALES = np.array([2.0 ** -130, 2.0 ** -140, 1e-3, 2.0 ** -127, 0.5, 2.0 ** -149, 3e-39, 1.0],
                  np.float32)
#: scales fake_quant takes (normal, with a finite reciprocal), some with a
#: subnormal reciprocal
FQ_SCALES = np.array([2.0 ** -126, 2.0 ** 127, 1e-3, 3e38, 0.5, 2.0 ** -100, 1e-20, 1.0],
                     np.float32)


def _amax(xp, x):
    c = MaxCalibrator(axis=0)
    c.collect(x)
    c.collect(x * np.float32(1) if xp is np else x)
    return c.compute_amax()


def _tf_grad(xp, x):
    g = xp.asarray(np.linspace(-1, 1, N, dtype=np.float32).reshape(ROWS, K))
    return TF.fake_quant_with_min_max_vars_gradient(
        g, x, xp.asarray(np.float32(0.0)), xp.asarray(np.float32(6.0)))


def _nvfp4(xp, x):
    codes = xp.asarray(((np.arange(ROWS * K // 2) * 29) % 256).astype(np.uint8)
                       .reshape(ROWS, K // 2))
    scales = xp.asarray(((np.arange(ROWS * K // 16) * 7) % 127).astype(np.uint8)
                        .reshape(ROWS, K // 16))
    return qc.nvfp4_dequantize(codes, scales, np.float32(2.0 ** -118), recipe="modelopt")


# name -> f(xp, x): a public call whose Python code handles device data
CASES = {
    "dequantize_tiny_scale": lambda xp, x: qc.dequantize(xp.asarray(Q8), 2.0 ** -140, 3),
    "dequantize_per_channel": lambda xp, x: qc.dequantize(
        xp.asarray(Q8), xp.asarray(SCALES), xp.asarray(np.arange(ROWS) - 4), axis=0),
    "fake_quant_device_qparams": lambda xp, x: qc.fake_quant(
        x, xp.asarray(FQ_SCALES), xp.asarray(np.zeros(ROWS, np.int64)), -128, 127, axis=0),
    "quantize_int32_range": lambda xp, x: qc.quantize(
        x, xp.asarray(FQ_SCALES), xp.asarray(np.zeros(ROWS, np.int64)), -2 ** 31, 2 ** 31 - 1,
        axis=0),
    "max_calibrator": _amax,
    "abs_range": lambda xp, x: TN.abs_range(x, True, True),
    "nvidia_clip": lambda xp, x: Clip(-1.0, 1.0)(x),
    "nvidia_clip_tiny_bounds": lambda xp, x: Clip(-2.0 ** -141, 2.0 ** -141)(x),
    "nvidia_fake_tensor_quant": lambda xp, x: NQ.fake_tensor_quant(
        x, xp.asarray(np.float32(2.0 ** -131)), 8),
    "tf_gradient": _tf_grad,
    "mx_dequantize_int8": lambda xp, x: qc.mx_dequantize(
        xp.asarray((np.arange(ROWS * K // 32) % 12).astype(np.uint8).reshape(ROWS, K // 32)),
        xp.asarray(Q8), "int8"),
    "nvfp4_dequantize_global_scale": _nvfp4,
    "affine_qparams": lambda xp, x: Q.affine_qparams(
        xp.asarray(X.min(axis=1)), xp.asarray(X.max(axis=1)), -128, 127),
}


def _flat(res):
    if isinstance(res, (tuple, list)):
        return [r for item in res for r in _flat(item)]
    return [res]


@pytest.mark.parametrize("name", sorted(CASES))
def test_subnormal_data_gives_the_cpus_bits_without_cupy_builtins(name):
    from cupy import _ftz
    want = _flat(CASES[name](np, X.copy()))
    with _ftz.record() as rec:
        got = _flat(CASES[name](cp, cp.asarray(X)))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_bits_equal(g, w, f"{name} output {i}")
    data_sized = [r for r in rec if r[1] >= N]
    assert not data_sized, f"float32 CuPy built-ins on data: {data_sized}"


@pytest.mark.parametrize("check", ["fake_quant_amax", "tensor_quant"])
def test_a_negative_subnormal_is_negative_on_both_back_ends(check):
    """unsigned quantization refuses x < 0: -2**-140 < 0 holds on the
    device as on the CPU (a CuPy comparison would read it as -0)."""
    x = np.array([1.0, -2.0 ** -140, 0.5], np.float32)
    for xp in (np, cp):
        with pytest.raises((ValueError, TypeError), match="egative"):
            if check == "tensor_quant":
                NQ.fake_tensor_quant(xp.asarray(x), xp.asarray(np.float32(1.0)), 8,
                                     unsigned=True)
            else:
                qc.fake_quant_amax(xp.asarray(x), 1.0, 8, unsigned=True)


def test_the_cases_meet_subnormals_that_a_flush_would_change():
    """The input is the kind the rule bites on: with the fake's rule on, a
    CuPy product of the data differs from numpy's (so the cases above would
    see a flush if their data went through one)."""
    d = cp.asarray(X)
    assert not np.array_equal((d * np.float32(1)).get().view(np.uint32),
                              (X * np.float32(1)).view(np.uint32))
