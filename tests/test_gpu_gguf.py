"""CPU vs GPU for the GGUF block types (issue 39): ``gguf_quantize`` /
``gguf_dequantize`` on cupy input (``quantcore_gpu/cuda/gguf.cu``, a row a
thread over the row quantizers of ``include/qc_gguf.h``) against numpy
input, which tests/test_gguf.py pins to llama.cpp's own C code: every type,
with and without an importance matrix, on normal, heavy-tailed, scaled,
subnormal, all-zero and non-finite rows, 32- and 64-bit indices; the
blocks read back on the device.  The same bytes but the sign of a NaN that
an invalid operation made (:func:`assert_same_blocks`).

Needs cupy and a CUDA device, or the CUDA emulator (``make gpu-emu-test``).
"""
import numpy as np
import pytest

from quantcore import gguf as G
from reference import gpu_cupy, to_numpy

cp = gpu_cupy()

pytestmark = pytest.mark.gpu

NAMES = [t[0] for t in G.TYPES]


def rows(kind, n, seed=0):
    """3 rows of ``n`` float32 of one kind (the CPU tests' kinds)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, n)).astype(np.float32)
    if kind == "heavy":
        x = rng.standard_t(1.5, (3, n)).astype(np.float32)
    elif kind == "scaled":
        x *= np.float32(10.0) ** rng.integers(-30, 30, (3, 1)).astype(np.float32)
    elif kind == "subnormal":
        x = (x * np.float32(1e-39)).astype(np.float32)
    elif kind == "zero":
        x[:] = 0
        x[::2, 5] = -0.0
    elif kind == "pow2":     # block maxima exact powers of two (MXFP4's floor(log2))
        x = np.float32(2.0) ** rng.integers(-140, 120, (3, n)).astype(np.float32)
        x *= rng.choice(np.float32([-1, 1]), (3, n))
    elif kind == "nonfinite":
        x[0, 3] = np.nan
        x[1, 7] = np.inf
        x[2] = np.nan
    return x


def assert_same_blocks(cpu, gpu, name, shape, what):
    """The GPU's blocks are the CPU's bytes, but for one documented case
    (docs/FORMATS.md, "GGUF on the GPU"): an fp16 field holding a NaN that
    an invalid operation made (inf - inf, 0 / 0) is 0xFE00 on x86 (its
    default NaN is negative) and 0x7E00 on the device (CUDA's NaN is
    0x7FFFFFFF); only in rows whose values read back hold a NaN."""
    cpu = np.frombuffer(cpu, np.uint8)
    diff = np.nonzero(cpu != gpu)[0]
    if diff.size == 0:
        return
    assert (cpu[diff] == 0xFE).all() and (gpu[diff] == 0x7E).all(), what
    assert (diff % 2 == 1).all() and (cpu[diff - 1] == 0).all(), what  # (high bytes of 0xFE00)
    rows_with_nan = np.isnan(G.gguf_dequantize(cpu.tobytes(), name, shape)).any(axis=-1)
    row_bytes = G.gguf_row_bytes(name, shape[-1])
    assert rows_with_nan[diff // row_bytes].all(), what


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["normal", "heavy", "scaled", "subnormal", "zero", "pow2",
                                  "nonfinite"])
def test_quantize_and_dequantize_match_the_cpu(name, kind, index64):
    bs, _ = G.gguf_block(name)
    x = rows(kind, 2 * max(bs, 256), seed=NAMES.index(name))
    weights = [None]
    if name not in ("Q8_0", "MXFP4"):  # (ggml takes no imatrix for these)
        weights.append(np.random.default_rng(7).random(x.shape[1]).astype(np.float32))
    for qw in weights:
        ref = G.gguf_quantize(x, name, imatrix=qw)
        got = G.gguf_quantize(cp.asarray(x), name,
                              imatrix=None if qw is None else cp.asarray(qw))
        assert isinstance(got, cp.ndarray) and got.dtype == np.uint8
        assert_same_blocks(ref, to_numpy(got), name, x.shape, (name, kind, qw is not None))
        back = G.gguf_dequantize(got, name, x.shape)
        assert isinstance(back, cp.ndarray)
        assert np.array_equal(to_numpy(back), G.gguf_dequantize(ref, name, x.shape),
                              equal_nan=True)


def test_bad_input_named():
    with pytest.raises(TypeError, match="w: expected float32, got float64"):
        G.gguf_quantize(cp.zeros((2, 256)), "Q4_K")
    with pytest.raises(ValueError, match="imatrix: expected one weight per column"):
        G.gguf_quantize(cp.zeros((2, 256), np.float32), "Q4_K",
                        imatrix=cp.ones(128, np.float32))
    with pytest.raises(TypeError, match="data: expected a uint8 cupy array"):
        G.gguf_dequantize(cp.zeros(144, np.float32), "Q4_K", (1, 256))
    with pytest.raises(ValueError, match="data: 100 bytes, expected 144"):
        G.gguf_dequantize(cp.zeros(100, np.uint8), "Q4_K", (1, 256))


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q8_0"])
def test_gguf_file_on_the_gpu_is_the_cpus(tmp_path, mix):
    """``write_gguf(..., device="gpu")`` (``quantcore quantize --format gguf
    --device gpu``) writes the CPU's file, byte for byte."""
    pytest.importorskip("gguf")
    from test_gguf_file import PRE, _tiny
    from quantcore.engines import gguf_file as GF
    src = _tiny("llama", tmp_path / "llama")
    for device in ("cpu", "gpu"):
        GF.write_gguf(src, tmp_path / f"{device}.gguf", mix, tokenizer_pre=PRE, device=device)
    assert (tmp_path / "cpu.gguf").read_bytes() == (tmp_path / "gpu.gguf").read_bytes()
