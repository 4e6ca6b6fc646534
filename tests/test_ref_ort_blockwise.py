"""ORT's blockwise int4 quantization of float16 weights, live.

Where it comes from: onnxruntime's ``quantize_matmul_4bits`` (the C++ MLAS
``BlockwiseQuantizer`` that ``MatMulNBitsQuantizer`` calls; its
``test_quantize_blockwise_4bits`` unit test compares it with a numpy model
on float16 and float32 weights).  Here the live function quantizes random
float32 and float16 weights, asymmetric and symmetric, and
``group_quantize(recipe="onnx")`` must give its codes, zero points and
scales bit for bit: for float16 weights ORT stores a float16 scale and
quantizes with it (``QC_GRP_F16_SCALE``).
"""
import numpy as np
import pytest

import quantcore as qc

pybind = pytest.importorskip("onnxruntime.capi._pybind_state")


def _ort(w, bs, symmetric):
    """(codes [cols, rows], scales [cols, k_blocks], zero points) of ORT."""
    rows, cols = w.shape
    kb = -(-rows // bs)
    packed = np.zeros((cols, kb, bs // 2), np.uint8)
    zp = np.zeros((cols, (kb + 1) // 2), np.uint8)
    sc = np.zeros((cols, kb), w.dtype)
    pybind.quantize_matmul_4bits(packed, w, sc, zp, bs, cols, rows, symmetric)
    q = np.stack([packed & 15, packed >> 4], -1).reshape(cols, kb * bs)[:, :rows]
    z = np.stack([zp & 15, zp >> 4], -1).reshape(cols, -1)[:, :kb]
    return q, sc, z


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bs", [16, 32, 128])
def test_quantize_matmul_4bits_live(dtype, symmetric, bs):
    rng = np.random.default_rng(bs + 7 * symmetric)
    rows, cols = 256, 40
    w = (rng.standard_normal((rows, cols)) * rng.choice([1e-5, 1e-3, 0.05, 2.0, 300.0], cols))
    w = w.astype(dtype)
    w[:bs, 0] = 0.25                      # a constant block
    q_ort, s_ort, z_ort = _ort(w, bs, symmetric)
    q, s, z = qc.group_quantize(w.T, 4, bs, symmetric=symmetric)
    assert np.array_equal(q, q_ort), int((q != q_ort).sum())
    assert np.array_equal(s.astype(dtype).astype(np.float32), s)   # exact in the dtype
    assert np.array_equal(s.astype(dtype).view(np.uint16 if dtype == np.float16 else np.uint32),
                          s_ort.view(np.uint16 if dtype == np.float16 else np.uint32))
    if not symmetric:
        assert np.array_equal(z, z_ort)
