"""quantcore.mx live against torchao's CPU paths (torchao is in the test
extras; its MX / NVFP4 prototypes are pure torch on the CPU): ``to_mx`` /
``to_dtype`` for every element type and scale mode through
``compat="torchao"``, and ``nvfp4_quantize`` with and without a per-tensor
scale, bit for bit on random and special input.  microxcaling is not on
PyPI (its vectors are in tests/test_mx.py); modelopt's NVFP4 path needs
its CUDA extension for fake quant (its export path's vectors are in
tests/test_mx.py as well)."""
import numpy as np
import pytest

import quantcore as qc
from reference import assert_bits_equal

torch = pytest.importorskip("torch")
mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
from torchao.prototype.mx_formats import constants as AOC  # noqa: E402
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize  # noqa: E402

AO_ELEM = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
           "e2m3": AOC.DTYPE_FP6_E2M3, "e3m2": AOC.DTYPE_FP6_E3M2,
           "e2m1": torch.float4_e2m1fn_x2}


def inputs(seed):
    """4 rows x 96: normal, wide-range, tiny (code-0 blocks) and specials."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[1] *= np.float32(2.0) ** rng.integers(-20, 20, 96).astype(np.float32)
    x[2] *= np.float32(2.0 ** -128)
    x[3, :32] = 0.0
    x[3, 5] = -0.0
    x[3, 40] = np.inf
    x[3, 70] = -np.inf
    x[4, 33] = np.nan
    x[5] *= np.float32(2.0 ** 100)
    return x


def codes_of(t):
    t = t.contiguous()
    return t.view(torch.uint8).numpy() if t.element_size() == 1 else t.numpy()


@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("elem", sorted(AO_ELEM))
def test_to_mx_live(elem, mode):
    x = inputs(hash((elem, mode)) % 1000)
    s_ao, d_ao = mx_tensor.to_mx(torch.from_numpy(x), AO_ELEM[elem], 32,
                                 ScaleCalculationMode(mode))
    y_ao = mx_tensor.to_dtype(d_ao, s_ao, AO_ELEM[elem], 32, torch.float32).numpy()
    s, q = qc.mx_quantize(x, elem, scale_mode=mode, compat="torchao")
    assert np.array_equal(s, codes_of(s_ao).reshape(s.shape))
    assert np.array_equal(q.view(np.uint8), codes_of(d_ao))  # (NaN blocks' codes too)
    assert_bits_equal(qc.mx_fake_quant(x, elem, scale_mode=mode, compat="torchao"), y_ao)
    assert_bits_equal(qc.mx_dequantize(s, q, elem), y_ao)


@pytest.mark.parametrize("g", [None, 0.0123, 3.0])
def test_nvfp4_live(g):
    x = inputs(7)[[0, 1, 2, 5]] * np.float32(0.001)
    x[0, 3] = -0.0
    gt = None if g is None else torch.tensor(g, dtype=torch.float32)
    s_ao, d_ao = nvfp4_quantize(torch.from_numpy(x), 16, gt)
    q, s, _ = qc.nvfp4_quantize(x, None if g is None else np.float32(g), recipe="torchao")
    assert np.array_equal(s, codes_of(s_ao))
    assert np.array_equal(q, codes_of(d_ao))


@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("elem", sorted(AO_ELEM))
def test_to_mx_live_nan_blocks_with_infinities(elem, mode):
    """A block holding a NaN and +-Inf (issue 27): torchao on the CPU codes
    +-Inf (and a -NaN) with the NaN code's sign bit set in the floor / ceil /
    even modes (x86's NaN of Inf * 0), a +NaN without it; rceil keeps them
    positive."""
    x = np.random.default_rng(3).standard_normal((3, 64)).astype(np.float32)
    x[0, [3, 7, 9, 11]] = [np.nan, np.inf, -np.inf, -np.nan]
    x[1, [40, 41]] = [-np.nan, np.inf]
    x[2, [0, 63]] = [np.nan, -np.inf]
    s_ao, d_ao = mx_tensor.to_mx(torch.from_numpy(x), AO_ELEM[elem], 32,
                                 ScaleCalculationMode(mode))
    s, q = qc.mx_quantize(x, elem, scale_mode=mode, compat="torchao")
    assert np.array_equal(s, codes_of(s_ao).reshape(s.shape))
    assert np.array_equal(q.view(np.uint8), codes_of(d_ao))


@pytest.mark.parametrize("g", [None, 0.5])
def test_nvfp4_live_nan_block(g):
    """torchao codes every element of an NVFP4 block holding a NaN 0x4."""
    x = np.random.default_rng(5).standard_normal((2, 32)).astype(np.float32)
    x[0, [3, 5, 6]] = [np.nan, np.inf, -np.nan]
    x[1, 20] = -np.nan
    gt = None if g is None else torch.tensor(g, dtype=torch.float32)
    s_ao, d_ao = nvfp4_quantize(torch.from_numpy(x), 16, gt)
    q, s, _ = qc.nvfp4_quantize(x, None if g is None else np.float32(g), recipe="torchao")
    assert np.array_equal(s, codes_of(s_ao))
    assert np.array_equal(q, codes_of(d_ao))
    assert (q[0, :8] == 0x44).all() and (q[1, 8:16] == 0x44).all()
