"""CPU vs GPU for the block-scaled formats (qc_block_scaled of
quantcore_gpu/cuda/formats.cu, the recipes of include/qc_mx.h): the kernel
entry point with the CPU twin's arguments, and the public functions of
quantcore.mx on cupy arrays, bit for bit, on edge and random input with
ragged last blocks -- every MX element type, every scale mode, both
roundings, the torchao / microxcaling compat modes, both NVFP4 recipes.

Needs cupy and a CUDA device, or the CUDA emulator (``make gpu-emu-test``).
NaN lanes compare as "both NaN".
"""
import numpy as np
import pytest

import quantcore as qc
from quantcore import mx
from quantcore._cpu import _kernels as K
from quantcore_gpu import kernels as G
from reference import assert_bits_equal, gpu_cupy

cp = gpu_cupy()

pytestmark = pytest.mark.gpu


def edge_rows(rows=6, k=70, seed=0):
    """rows of k float32: specials (NaN, +-Inf, -0, subnormals, a zero row,
    a subnormal-amax row) and block-scaled random magnitudes."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, k)) * np.float32(2.0) **
         rng.integers(-30, 30, (rows, 1))).astype(np.float32)
    x[0, :6] = [np.nan, np.inf, -0.0, 2.0 ** -149, 448, 464]
    x[1, k // 2 + 1] = -np.inf
    x[2] = 0.0
    x[2, 5] = -0.0
    x[3] = (rng.standard_normal(k) * 2.0 ** -130).astype(np.float32)
    return x


def test_recipe_lists_match_the_cpu_extension():
    assert G.BLOCK_RECIPES == K.BLOCK_RECIPES == {"mx": 0, "nvfp4": 1}


MX_CASES = [(e, m, 0) for e in (0, 1, 4, 5, 6, 7) for m in range(6)] + [
    (6, 0, mx.MX_HALF_AWAY), (7, 1, mx.MX_HALF_AWAY | mx.MX_INT8_FULL),
    (0, 0, mx.MX_TORCHAO), (5, 3, mx.MX_TORCHAO), (6, 3, mx.MX_TORCHAO),
    (4, 5, mx.MX_MXS | mx.MX_HALF_AWAY), (7, 5, mx.MX_MXS)]
NV_CASES = [("nvfp4", 6, 0, 0.75 * 6, 0.75), ("nvfp4", 6, mx.NV_TORCHAO, 0.01, 100.0),
            ("nvfp4", 6, mx.NV_TORCHAO | mx.NV_NO_GLOBAL, 1.0, 1.0)]


@pytest.mark.parametrize("case", [("mx", e, m, 0.0, 0.0) for e, m, f in MX_CASES
                                  for m in [m | f]] + NV_CASES,
                         ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_block_scaled_matches_cpu(case):
    recipe, elem, mode, p0, p1 = case
    rows, k, bs = 6, 70, 16 if recipe == "nvfp4" else 32
    x = edge_rows(rows, k, seed=elem + mode).reshape(-1)
    nb = rows * -(-k // bs)
    outs = {}
    for name, mod, xs, mk in (("cpu", K, x, np.empty), ("gpu", G, cp.asarray(x), cp.empty)):
        sc, codes, y = mk(nb, np.uint8), mk(x.size, np.uint8), mk(x.size, np.float32)
        extra = (1,) if mod is K else ()
        mod.block_scaled_quant(mod.BLOCK_RECIPES[recipe], xs, sc, codes, y, rows, k, bs, elem,
                               mode, p0, p1, *extra)
        outs[name] = [a if isinstance(a, np.ndarray) else a.get() for a in (sc, codes, y)]
    for a, b in zip(outs["gpu"], outs["cpu"]):
        assert_bits_equal(a, b)


def test_block_scaled_optional_outputs_and_errors():
    x = edge_rows(4, 64)[:2].reshape(-1)
    sc = cp.empty(4, np.uint8)
    G.block_scaled_quant(0, cp.asarray(x), sc, None, None, 2, 64, 32, 0, 0, 0.0, 0.0)
    s, _ = qc.mx_quantize(x.reshape(2, 64), "e4m3")
    assert np.array_equal(sc.get().reshape(2, 2), s)
    with pytest.raises(ValueError, match="unknown recipe"):
        G.block_scaled_quant(9, cp.asarray(x), sc, None, None, 2, 64, 32, 0, 0, 0.0, 0.0)
    with pytest.raises(ValueError, match="do not fit"):
        G.block_scaled_quant(0, cp.asarray(x), sc, None, None, 3, 64, 32, 0, 0, 0.0, 0.0)


@pytest.mark.parametrize("kw", [dict(elem="e2m1", axis=0, block_size=4),
                                dict(elem="int8", scale_mode="rceil_exact"),
                                dict(elem="e4m3", compat="torchao", scale_mode="rceil"),
                                dict(elem="e3m2", compat="microxcaling")],
                         ids=lambda kw: "-".join(map(str, kw.values())))
def test_public_mx_on_cupy(kw):
    x = edge_rows(6, 37, seed=5)
    elem = kw.pop("elem")
    s, q = qc.mx_quantize(x, elem, **kw)
    sg, qg = qc.mx_quantize(cp.asarray(x), elem, **kw)
    assert isinstance(qg, cp.ndarray)
    assert np.array_equal(sg.get(), s) and np.array_equal(qg.get(), q)
    assert_bits_equal(qc.mx_fake_quant(cp.asarray(x), elem, **kw),
                      qc.mx_fake_quant(x, elem, **kw))
    length = x.shape[kw.get("axis", -1)] if elem == "e2m1" else None
    dq = dict(axis=kw.get("axis", -1), block_size=kw.get("block_size", 32), length=length)
    assert_bits_equal(qc.mx_dequantize(sg, qg, elem, **dq), qc.mx_dequantize(s, q, elem, **dq))


@pytest.mark.parametrize("recipe,g", [("modelopt", None), ("torchao", None),
                                      ("torchao", np.float32(0.02))])
def test_public_nvfp4_on_cupy(recipe, g):
    x = edge_rows(4, 40, seed=9)
    x[0, 0] = 1.0  # (no NaN: modelopt's global scale would be NaN)
    q, s, g_out = qc.nvfp4_quantize(x, g, recipe=recipe)
    qg, sg, gg = qc.nvfp4_quantize(cp.asarray(x), g, recipe=recipe)
    assert np.array_equal(qg.get(), q) and np.array_equal(sg.get(), s)
    assert_bits_equal(qc.nvfp4_fake_quant(cp.asarray(x), g, recipe=recipe),
                      qc.nvfp4_fake_quant(x, g, recipe=recipe))
    assert_bits_equal(qc.nvfp4_dequantize(qg, sg, gg, recipe=recipe, length=40),
                      qc.nvfp4_dequantize(q, s, g_out, recipe=recipe, length=40))


@pytest.mark.parametrize("shift", [0, 1, 5])
def test_block_scaled_out_overlapping_x_on_cupy(shift):
    """``out`` overlapping ``x`` by a few elements: written through a
    temporary (as numpy input is), so the result is that of a separate out."""
    for fn, n in ((lambda a, o: qc.mx_fake_quant(a, "e2m1", out=o), 128),
                  (lambda a, o: qc.nvfp4_fake_quant(a, out=o), 64)):
        buf = cp.asarray(np.random.default_rng(shift).standard_normal(n + shift)
                         .astype(np.float32))
        expect = fn(buf[shift:].copy(), None)
        got = fn(buf[shift:], buf[:n])
        assert_bits_equal(got, expect)


def test_broadcast_input_reduced_on_cupy():
    """A stride-0 cupy input is reduced from one element per repeat (the
    same values as its copy)."""
    x = cp.broadcast_to(cp.arange(3, dtype=cp.float32)[:, None], (3, 4096))
    lo, hi = qc.minmax(x, axis=0)
    assert lo.get().tolist() == [0, 1, 2] and hi.get().tolist() == [0, 1, 2]
    obs = qc.MinMaxObserver(axis=0)
    obs(x)
    assert_bits_equal(obs.max_val, np.arange(3, dtype=np.float32))
