"""The code of a NaN is the same on the CPU and the GPU, and the CPU
references' (issue 33): a scaled FP8 code takes the sign of the NaN that
torch on x86 gives ``x * s`` / ``x / s`` (a NaN scale, else a NaN x, else
the negative default NaN of 0 * Inf), not the sign of the device's arithmetic
(CUDA returns the canonical NaN 0x7FFFFFFF, which would give 0x7F where the
CPU gives 0xFF).  The oracles are torch 2.13 CPU (modelopt's and torchao's
``(x * s).clamp(-max, max).to(float8)``) and ml_dtypes (ONNX
QuantizeLinear's ``(x / s).astype(float8)``).

On the CUDA emulator (``make gpu-emu-test``) the kernels run with CUDA's
canonical-NaN rule (tests/cudaemu/cudaemu_float.h), so these tests fail
there without the fix in ``qc_formats.h`` (``qc_scaled_nan``).
"""
import ml_dtypes
import numpy as np
import pytest
import torch

from quantcore import formats as F
from quantcore import mx as MX
from reference import assert_bits_equal, gpu_cupy

cp = gpu_cupy()

pytestmark = pytest.mark.gpu

F32 = np.float32
NEG_NAN = np.array([0xFFC00000], np.uint32).view(F32)[0]
POS_NAN = np.array([0x7FC00000], np.uint32).view(F32)[0]
FMAX = {"e4m3fn": 448.0, "e5m2": 57344.0}
TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _x(dtype=F32):
    """-NaN, +NaN and finite values, the NaNs at several vector lanes."""
    x = np.linspace(-3, 3, 37).astype(dtype)
    x[[0, 5, 17, 36]] = NEG_NAN
    x[[2, 9]] = POS_NAN
    return x


def _torch_codes(x, s, fmt):
    """torch CPU: (x * s).clamp(-max, max).to(float8) (modelopt, torchao)."""
    t = torch.from_numpy(np.asarray(x, F32)) * torch.tensor(s, dtype=torch.float32)
    t = t.clamp(-FMAX[fmt], FMAX[fmt]).to(TORCH_FP8[fmt])
    return t.view(torch.uint8).numpy()


def _both(fn, x, *args, **kw):
    """fn on numpy and on cupy input: (CPU result, GPU result on the host)."""
    cpu = fn(x, *args, **kw)
    gpu = fn(cp.asarray(x), *args, **kw)
    return cpu, gpu


@pytest.mark.parametrize("recipe,fmt", [("modelopt", "e4m3fn"), ("torchao", "e4m3fn"),
                                        ("torchao", "e5m2")])
def test_fp8_quantize_nan_codes_match_torch_cpu(recipe, fmt):
    x = _x()
    (cq, cs), (gq, gs) = _both(F.fp8_quantize, x, 3.0, fmt, recipe=recipe)
    want = _torch_codes(x, float(cs), fmt)
    assert want[0] == 0xFF and want[2] == 0x7F  # the sign of the input NaN
    assert_bits_equal(cq, want, "CPU vs torch")
    assert_bits_equal(gq, want, "GPU vs torch")


def test_fp8_quantize_nan_of_an_invalid_product_is_x86s():
    """torchao on x holding +-Inf: amax = Inf, s = 0, so +-Inf * 0 is NaN:
    x86's default NaN is negative (0xFF), a GPU's canonical NaN positive.
    (A given amax of Inf is refused; one computed from x is the recipe's.)"""
    x = np.array([np.inf, -np.inf, 1.0, -2.0], F32)
    (cq, cs), (gq, _) = _both(F.fp8_quantize, x, None, "e4m3fn", recipe="torchao")
    assert float(cs) == 0.0
    want = _torch_codes(x, 0.0, "e4m3fn")
    assert want.tolist() == [0xFF, 0xFF, 0x00, 0x80]
    assert_bits_equal(cq, want, "CPU vs torch")
    assert_bits_equal(gq, want, "GPU vs torch")


def test_fp8_quantize_nan_amax_gives_positive_nan_codes():
    """A NaN in x makes amax and the scale NaN (+NaN): every code is the
    scale's NaN, the -NaN inputs' too (torch's x * s with a 0-d scale)."""
    x = _x()
    (cq, cs), (gq, _) = _both(F.fp8_quantize, x, None, "e4m3fn", recipe="modelopt")
    assert np.isnan(float(cs))
    want = _torch_codes(x, float(cs), "e4m3fn")
    assert (want == 0x7F).all()
    assert_bits_equal(cq, want, "CPU vs torch")
    assert_bits_equal(gq, want, "GPU vs torch")


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantize_linear_fp8_nan_codes_match_ml_dtypes(fmt, dtype):
    x = _x(dtype)
    cpu, gpu = _both(F.quantize_linear, x, dtype(0.75), output=fmt)
    ref = (x / dtype(0.75)).astype(getattr(ml_dtypes, fmt)).view(np.uint8)
    assert ref[0] >= 0x80 and ref[2] < 0x80
    assert_bits_equal(cpu, ref, "CPU vs ml_dtypes")
    assert_bits_equal(gpu, ref, "GPU vs ml_dtypes")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cast_fp8_keeps_the_nan_sign(dtype):
    x = _x(dtype)
    cpu, gpu = _both(F.cast_fp8, x, "e4m3fn")
    assert cpu[0] == 0xFF and cpu[2] == 0x7F
    assert_bits_equal(gpu, cpu, "GPU vs CPU")


def test_fp8_fake_quant_nan_lanes_and_mx_codes_agree():
    x = _x()
    for recipe in ("modelopt", "torchao"):
        cpu, gpu = _both(F.fp8_fake_quant, x, 3.0, recipe=recipe)
        assert_bits_equal(gpu, cpu, f"fake quant {recipe}")  # (NaN lanes: both NaN)
    x64 = np.resize(x, 64)
    for elem in ("e4m3", "e5m2", "e2m1"):
        cpu, gpu = _both(MX.mx_quantize, x64, elem)
        for c, g in zip(cpu, gpu):
            assert_bits_equal(g, c, f"mx {elem}")
