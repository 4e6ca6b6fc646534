"""CPU vs GPU for the formats kernels (quantcore_gpu/cuda/formats.cu and the
fp8 elementwise family): each GPU entry point of ``quantcore_gpu.kernels``
is called with the CPU twin's parameters on the same edge and random input
and must give its bits -- every encode / decode family and mode in use,
every layout (per tensor, per channel incl. inner == 1, per group with a
short last group), every group recipe, 32- and 64-bit indices, 1- and
132-SM launch shapes.

Needs cupy and a CUDA device, or the CUDA emulator (``make gpu-emu-test``).
NaN lanes compare as "both NaN".
"""
import numpy as np
import pytest

from quantcore import formats as F
from quantcore._cpu import _kernels as K
from quantcore_gpu import kernels as G
from reference import assert_bits_equal, gpu_cupy

cp = gpu_cupy()

pytestmark = pytest.mark.gpu



@pytest.fixture(params=[1, 132], ids=["1sm", "132sm"])
def sm_count(request, monkeypatch):
    monkeypatch.setitem(G._device_info, G._device_id(), request.param)
    return request.param


def edge_x(n=3000, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    v = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 465, 480, 57344, 61440,
                  2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.0 ** -149, 3.4e38, 1.0625, 1.1875],
                 np.float32)
    x = np.concatenate([v, -v, rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32), (rng.standard_normal(n) * 60).astype(np.float32)])
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(dtype)


def test_family_lists_match_the_cpu_extension():
    assert G.ENCODE_FAMILIES == K.ENCODE_FAMILIES
    assert G.DECODE_FAMILIES == K.DECODE_FAMILIES
    assert G.GROUP_RECIPES == K.GROUP_RECIPES
    assert G.FAMILIES == K.FAMILIES and "fp8" in G.FAMILIES


# (family, mode, params builder, u0, u1, code dtype)
ENC_CASES = [("fp8", f | p, 0, 0, np.uint8) for f in range(4) for p in (0, 16, 32)] + [
    ("fp8", 1 | 64 | 256, 0, 0, np.uint8),      # QuantizeLinear: x / s, ml_dtypes NaN
    ("fp8", 0 | 128, 0, 0, np.uint8),           # fp8_quantize: x * s
    ("int", 8, -128, 127, np.int8), ("int", 8 | 64, -128, 127, np.int8),
    ("int", 8, 0, 15, np.uint8), ("int", 16, -32768, 32767, np.int16),
    ("int", 16 | 64, 0, 65535, np.uint16)]


def _params(family, C, dtype, dec=False):
    rng = np.random.default_rng(C)
    s = rng.uniform(0.3, 3.0, C).astype(dtype)
    if family == "fp8":
        return s
    z = rng.integers(-3, 4, C).astype(dtype)
    return np.concatenate([s, z, rng.uniform(-1, 1, C).astype(dtype)] if dec else [s, z])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ENC_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{np.dtype(c[4]).name}")
@pytest.mark.parametrize("layout", ["tensor", "axis0", "axis_last"])
def test_encode_matches_cpu(case, layout, dtype, index64, sm_count):
    family, mode, u0, u1, cdt = case
    x = edge_x(dtype=dtype)[:6000]
    outer, C, inner = {"tensor": (1, 1, x.size), "axis0": (1, 6, 1000),
                       "axis_last": (1000, 6, 1)}[layout]
    p = _params(family, C, dtype)
    want = np.empty(x.size, cdt)
    K.encode(K.ENCODE_FAMILIES[family], x, want, outer, C, inner, p, u0, u1, mode, 1)
    got = cp.empty(x.size, cdt)
    G.encode(G.ENCODE_FAMILIES[family], cp.asarray(x), got, outer, C, inner, cp.asarray(p),
             u0, u1, mode)
    assert np.array_equal(got.get(), want)


DEC_CASES = [("fp8", f | d, np.uint8) for f in range(4) for d in (0, 512)] + [
    ("fp8", 1024, np.uint8), ("int", 8, np.uint8), ("int", 8 | 32, np.int8),
    ("int", 16 | 32, np.int16), ("int", 8 | 128, np.uint8), ("int", 4 | 32, np.int8)]


@pytest.mark.parametrize("case", DEC_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("layout", ["tensor", "axis0", "groups"])
def test_decode_matches_cpu(case, layout, index64, sm_count):
    family, mode, cdt = case
    rng = np.random.default_rng(2)
    info = np.iinfo(cdt)
    codes = rng.integers(info.min, info.max + 1, 4000).astype(cdt)
    if mode & 31 == 4:
        codes = (codes % 8).astype(cdt)
    want = np.empty(codes.size, np.float32)
    got = cp.empty(codes.size, np.float32)
    if layout == "groups":  # rows of 100 in groups of 32 (a short last one)
        p = _params(family, 40 * 4, np.float32, dec=True)
        K.decode_groups(K.DECODE_FAMILIES[family], codes, want, 40, 100, 32, p, 0, 0, mode, 1)
        G.decode_groups(G.DECODE_FAMILIES[family], cp.asarray(codes), got, 40, 100, 32,
                        cp.asarray(p), 0, 0, mode)
    else:
        outer, C, inner = (1, 1, codes.size) if layout == "tensor" else (1, 8, 500)
        p = _params(family, C, np.float32, dec=True)
        K.decode(K.DECODE_FAMILIES[family], codes, want, outer, C, inner, p, 0, 0, mode, 1)
        G.decode(G.DECODE_FAMILIES[family], cp.asarray(codes), got, outer, C, inner,
                 cp.asarray(p), 0, 0, mode)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("mode", [0, 1, 2688, 1153, 2 | 16])
def test_fp8_fake_family_matches_cpu(mode, index64, sm_count):
    x = edge_x()
    p = np.array([2.5, 0.4, 3.0], np.float32)
    want = np.empty_like(x)
    wmask = np.empty(x.size, np.uint8)
    K.ew_tensor(K.FAMILIES["fp8"], x, want, wmask, *p, 0, 0, 0, 0, mode, 1)
    got = cp.empty(x.size, np.float32)
    gmask = cp.empty(x.size, np.uint8)
    G.ew_tensor(G.FAMILIES["fp8"], cp.asarray(x), got, gmask, *p, 0, 0, 0, 0, mode)
    assert_bits_equal(got, want)
    assert np.array_equal(gmask.get(), wmask)


ASYMMETRIC_ONLY = ("tinygemm", "hqq")


# (sym is the mode word: QC_GRP_SYMMETRIC, QC_GRP_HQQ_OWN (HQQ's own rule), QC_GRP_F16_SCALE)
@pytest.mark.parametrize("recipe, sym", [(r, s) for r in K.GROUP_RECIPES for s in (0, 1)
                                         if not (s and r in ASYMMETRIC_ONLY)] +
                         [("hqq", F.GRP_HQQ_OWN), ("onnx", F.GRP_F16_SCALE),
                          ("onnx", F.GRP_F16_SCALE | F.GRP_SYMMETRIC)])
@pytest.mark.parametrize("g", [1, 32, 48, 200])
def test_group_quant_matches_cpu(recipe, sym, g, index64, sm_count):
    rows, k = 7, 160   # g = 48 and 200 leave a short (or the only) last group
    rng = np.random.default_rng(g)
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 10, (rows, 1))).astype(np.float32)
    x[0, :3] = [np.nan, np.inf, -0.0]
    x[1, :] = 0.0
    x = x.reshape(-1)
    qmin, qmax = F.group_qrange(4, recipe, bool(sym & F.GRP_SYMMETRIC))
    ng = -(-k // g)
    outs = {}
    for name, mod, xs, mk in (("cpu", K, x, np.empty), ("gpu", G, cp.asarray(x), cp.empty)):
        codes, y, mask = mk(x.size, np.uint8), mk(x.size, np.float32), mk(x.size, np.uint8)
        scale, zp = mk(rows * ng, np.float32), mk(rows * ng, np.float32)
        recipes = K.GROUP_RECIPES if mod is K else G.GROUP_RECIPES
        extra = (1,) if mod is K else ()
        mod.group_quant(recipes[recipe], xs, codes, y, mask, scale, zp, rows, k, g, qmin, qmax,
                        sym, *extra)
        outs[name] = [a if isinstance(a, np.ndarray) else a.get()
                      for a in (codes, y, mask, scale, zp)]
    for a, b in zip(outs["gpu"], outs["cpu"]):
        assert_bits_equal(a, b)


def test_group_quant_optional_outputs(sm_count):
    x = np.random.default_rng(1).standard_normal(640).astype(np.float32)
    scale, zp = cp.empty(20, np.float32), cp.empty(20, np.float32)
    codes = cp.empty(640, np.uint8)
    G.group_quant(G.GROUP_RECIPES["onnx"], cp.asarray(x), codes, None, None, scale, zp, 5, 128,
                  32, 0, 15, 0)
    q, s, z = F.group_quantize(x.reshape(5, 128), 4, 32)
    assert np.array_equal(codes.get().reshape(5, 128), q)
    assert_bits_equal(scale.get().reshape(5, 4), s)


def test_bad_arguments_are_refused():
    x = cp.zeros(8, np.float32)
    with pytest.raises(ValueError, match="unknown family"):
        G.encode(7, x, cp.zeros(8, np.uint8), 1, 1, 8, cp.ones(1, np.float32), 0, 0, 0)
    with pytest.raises(ValueError, match="width the family supports"):
        G.encode(G.ENCODE_FAMILIES["fp8"], x, cp.zeros(8, np.uint16), 1, 1, 8,
                 cp.ones(1, np.float32), 0, 0, 0)
    with pytest.raises(ValueError, match="do not fit"):
        G.group_quant(0, x, None, None, None, cp.zeros(1, np.float32), cp.zeros(1, np.float32),
                      3, 4, 2, 0, 15, 0)
