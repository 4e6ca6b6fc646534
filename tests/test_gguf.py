"""GGUF block types (issue 39): gguf_quantize / gguf_dequantize bit for bit
against llama.cpp's own C code (ggml-quants.c of the llama-cpp-python sdist,
compiled without FMA contraction: tests/ggml_oracle.py) and against gguf-py's
numpy quantizers / dequantizers (a second, independent oracle)."""
import os
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quantcore as qc
from quantcore import gguf as G
from quantcore._cpu import _gguf
from reference import oracle

sys.path.insert(0, os.path.dirname(__file__))
import ggml_oracle  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = [t[0] for t in G.TYPES]
#: the types gguf-py 0.19 quantizes itself (the others: dequantize only)
GGUF_PY_QUANTIZERS = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}


@pytest.fixture(scope="module")
def ggml():
    o = ggml_oracle.get()
    if o is None:
        pytest.skip("the ggml oracle could not be built (no network / compiler)")
    return o


@pytest.fixture(scope="module")
def gguf_py():
    return oracle("gguf")


def _rows(kind, rows, n, rng):
    x = rng.standard_normal((rows, n)).astype(np.float32)
    if kind == "heavy":      # Student t, 1.5 degrees of freedom: outliers per block
        x = rng.standard_t(1.5, (rows, n)).astype(np.float32)
    elif kind == "scaled":   # rows of very different magnitudes
        x *= np.float32(10.0) ** rng.integers(-30, 30, (rows, 1)).astype(np.float32)
    elif kind == "constant":
        x[:] = np.float32(0.37)
        x[1::2] = np.float32(-2.5)
    elif kind == "subnormal":
        x = (x * np.float32(1e-39)).astype(np.float32)
    elif kind == "zero":
        x[:] = 0
        x[::2, 5] = -0.0
    elif kind == "nonfinite":
        x[0, 3] = np.nan
        x[1 % rows, 7] = np.inf
        x[2 % rows, 40 % n] = -np.inf
        x[3 % rows] = np.nan
    elif kind == "sparse":   # a few non-zeros in zero blocks (all-zero groups)
        x *= rng.random((rows, n)) < 0.02
    return x


def _blocks_differ(a, b, bb):
    a = np.frombuffer(a, np.uint8).reshape(-1, bb)
    b = np.frombuffer(b, np.uint8).reshape(-1, bb)
    return int((a != b).any(axis=1).sum())


KINDS = ["normal", "heavy", "scaled", "constant", "subnormal", "zero", "nonfinite", "sparse"]


@pytest.mark.parametrize("imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_bytes_equal_ggml(ggml, name, kind, imatrix):
    """Every type, every kind of row, with and without an importance matrix:
    the bytes of ggml's quantize_<type> (the path llama-quantize takes)."""
    bs, bb = G.gguf_block(name)
    rng = np.random.default_rng(zlib.crc32(f"{name} {kind} {imatrix}".encode()))
    for nblocks in ((1, 3) if bs == 256 else (1, 8, 9)):
        n = bs * nblocks
        x = _rows(kind, 5, n, rng)
        qw = (rng.random(n).astype(np.float32) * 3) if imatrix else None
        if qw is not None:
            qw[rng.random(n) < 0.1] = 0  # unused columns
        ours = qc.gguf_quantize(x, name, imatrix=qw)
        ref = ggml.quantize(name, x, qw, row_bytes=G.gguf_row_bytes(name, n))
        assert ours == ref, (f"{name} {kind} n={n}: "
                             f"{_blocks_differ(ours, ref, bb)} blocks differ")
        # dequantize: ggml's dequantize_row_<type>, bit for bit (NaN payloads too)
        back = qc.gguf_dequantize(ours, name, x.shape)
        assert np.array_equal(back.view(np.uint32),
                              ggml.dequantize(name, ref, x.size).reshape(x.shape).view(np.uint32))


finite = st.floats(-1e4, 1e4, width=32, allow_subnormal=True)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("name", NAMES)
def test_random_rows_equal_ggml(ggml, name, data):
    bs, _ = G.gguf_block(name)
    n = bs * data.draw(st.integers(1, 2))
    vals = data.draw(st.lists(finite, min_size=n, max_size=n))
    scale = data.draw(st.sampled_from([1.0, 1e-6, 1e6, 1e-30]))
    x = (np.array(vals, np.float32) * np.float32(scale)).reshape(1, n)
    qw = None
    if data.draw(st.booleans()):
        qw = np.array(data.draw(st.lists(st.floats(0, 100, width=32), min_size=n, max_size=n)),
                      np.float32)
    assert qc.gguf_quantize(x, name, qw) == ggml.quantize(name, x, qw,
                                                          G.gguf_row_bytes(name, n))


#: values whose blocks hit the SSE4.1 lanes' edges (qc_gguf_sse.h): exact
#: .5 ties of x * id (amax 127: Q8_0's id is 1), one magnitude with both
#: signs (Q4/5_0's first largest), zeros of both signs (Q4/5_1's min / max
#: sign: the scalar loop), NaN and infinities (the scalar loop), subnormals
EDGE_VALUES = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 63.5, -63.5, 126.5, 127.0, -127.0,
               3.0, -3.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1"])
def test_legacy_edge_blocks_equal_ggml(ggml, name, data):
    """Blocks of tie, sign and special values, most of them finite: the SSE4.1
    lanes and the scalar fallback give ggml's bytes, block for block."""
    blocks = data.draw(st.integers(1, 12))    # (the lanes take 8 blocks at a time)
    weights = [1] * (len(EDGE_VALUES) - 3) + [data.draw(st.sampled_from([0, 0, 1]))] * 3
    pool = [v for v, k in zip(EDGE_VALUES, weights) for _ in range(k)]
    vals = data.draw(st.lists(st.sampled_from(pool), min_size=32 * blocks, max_size=32 * blocks))
    scale = data.draw(st.sampled_from([1.0, 2.0 ** -20, 2.0 ** 20]))
    x = (np.array(vals, np.float32) * np.float32(scale)).reshape(1, -1)
    sign = data.draw(st.sampled_from(["mixed", "nonnegative", "nonpositive"]))
    if sign != "mixed":  # zeros keep their signs: a zero min or max of both signs
        x = np.where(x == 0, x, np.abs(x) if sign == "nonnegative" else -np.abs(x))
    assert qc.gguf_quantize(x, name) == ggml.quantize(name, x, None,
                                                      G.gguf_row_bytes(name, x.shape[1]))


def test_iq4_index_threshold_count_is_the_bisection():
    """IQ4's table index: the row loops' threshold count (qc_gguf_iq4.h,
    SSE4.1) equals ggml's bisection on 64 float32 ulps either side of every
    midpoint and table value, both zeros, infinities, NaN and random floats
    of every exponent (checked once over all 2^32 floats when written)."""
    table = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                     np.float32)
    pts = np.concatenate([table, (table[:-1] + table[1:]) / 2]).astype(np.float32)
    bits = pts.view(np.int32)[:, None] + np.arange(-64, 65, dtype=np.int32)[None, :]
    near = np.where(pts[:, None] == 0, np.float32(0), bits.view(np.float32)).ravel()
    rng = np.random.default_rng(5)
    rand = rng.integers(0, 2**32, 40000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([near, rand, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45,
                                              3e38], np.float32)]).astype(np.float32)
    x = np.resize(x, (x.size + 3) // 4 * 4)
    scalar, lanes = _gguf.iq4_index_pairs(x)
    assert np.array_equal(scalar, lanes), x[scalar != lanes][:8]


@pytest.mark.parametrize("name", NAMES)
def test_gguf_py(gguf_py, name):
    """gguf-py's numpy quantizer (where it has one) gives our bytes, and its
    dequantizer our values (every type)."""
    bs, _ = G.gguf_block(name)
    qt = getattr(gguf_py.GGMLQuantizationType, name)
    x = np.random.default_rng(1).standard_t(3, (6, 2 * 256)).astype(np.float32)
    ours = qc.gguf_quantize(x, name)
    if name in GGUF_PY_QUANTIZERS:
        assert gguf_py.quants.quantize(x, qt).tobytes() == ours
    raw = np.frombuffer(ours, np.uint8).reshape(6, -1)
    theirs = gguf_py.quants.dequantize(raw, qt)
    assert np.array_equal(theirs.astype(np.float32), qc.gguf_dequantize(ours, name, x.shape))


def test_types_table(gguf_py):
    """TYPES against gguf-py's ids and block sizes, the extension's list of
    quantizers, and docs/FORMATS.md's GGUF section (one line per type)."""
    for name, tid, bs, bb in G.TYPES:
        qt = getattr(gguf_py.GGMLQuantizationType, name)
        assert int(qt) == tid
        assert gguf_py.GGML_QUANT_SIZES[qt] == (bs, bb)
    assert sorted(_gguf.QUANTIZE_IDS) == sorted(t[1] for t in G.TYPES)
    assert G.GGUF_TYPES == tuple(NAMES)
    text = open(os.path.join(ROOT, "docs", "FORMATS.md"), encoding="utf-8").read()
    section = text[text.index("## GGUF"):]
    for name, _, bs, bb in G.TYPES:
        assert f"| {name} | {bs} | {bb} |" in section, name


def test_threads_layouts_and_shapes(ggml):
    """Rows are independent: any thread count, any layout (Fortran, strided,
    3-D) gives the bytes of the C-contiguous 2-D rows."""
    x = np.random.default_rng(2).standard_normal((3, 40, 512)).astype(np.float32)
    ref = ggml.quantize("Q4_K", x.reshape(-1, 512), None, G.gguf_row_bytes("Q4_K", 512))
    for n in (1, 2, 3):
        qc.set_num_threads(n)
        try:
            assert qc.gguf_quantize(x, "q4_k") == ref
        finally:
            qc.set_num_threads(None)
    f = np.asfortranarray(x[0])
    assert qc.gguf_quantize(f, "Q8_0") == qc.gguf_quantize(np.ascontiguousarray(f), "Q8_0")
    wide = np.zeros((4, 1024), np.float32)
    wide[:, ::2] = x[0, :4]
    assert qc.gguf_quantize(wide[:, ::2], "Q6_K") == qc.gguf_quantize(x[0, :4], "Q6_K")
    out = qc.gguf_dequantize(ref, "Q4_K", x.shape)
    assert out.shape == x.shape and out.dtype == np.float32
    empty = np.zeros((0, 256), np.float32)
    assert qc.gguf_quantize(empty, "Q2_K") == b""
    assert qc.gguf_dequantize(b"", "Q2_K", (0, 256)).shape == (0, 256)


def test_bad_input():
    x = np.zeros((2, 96), np.float32)
    with pytest.raises(ValueError, match=r"w: row length 96 .* Q4_K's block size 256"):
        qc.gguf_quantize(x, "Q4_K")
    with pytest.raises(ValueError, match=r"w: row length 30 .* Q8_0's block size 32"):
        qc.gguf_quantize(np.zeros(30, np.float32), "Q8_0")
    with pytest.raises(TypeError, match="w: expected float32, got float64"):
        qc.gguf_quantize(x.astype(np.float64), "Q8_0")
    with pytest.raises(ValueError, match="w: expected at least one axis"):
        qc.gguf_quantize(np.float32(1), "Q8_0")
    with pytest.raises(ValueError, match=r"type: expected one of .*'Q9_9'"):
        qc.gguf_quantize(x, "Q9_9")
    with pytest.raises(ValueError, match=r"imatrix: expected one weight per column \(96,\)"):
        qc.gguf_quantize(x, "Q4_0", imatrix=np.ones(95, np.float32))
    with pytest.raises(ValueError, match=r"imatrix: .* got shape \(2, 96\)"):
        qc.gguf_quantize(x, "Q4_0", imatrix=np.ones((2, 96), np.float32))
    with pytest.raises(TypeError, match="imatrix: expected float32"):
        qc.gguf_quantize(x, "Q4_0", imatrix=np.ones(96))
    data = qc.gguf_quantize(x, "Q8_0")
    with pytest.raises(ValueError, match=r"data: 203 bytes, expected 204 for Q8_0"):
        qc.gguf_dequantize(data[:-1], "Q8_0", (2, 96))
    with pytest.raises(ValueError, match=r"shape: row length 48 .* Q8_0's block size 32"):
        qc.gguf_dequantize(data, "Q8_0", (4, 48))
    with pytest.raises(ValueError, match="shape: expected a tuple of non-negative ints"):
        qc.gguf_dequantize(data, "Q8_0", ())


def test_floor_log2_bits_is_libms():
    """MXFP4's scale exponent floorf(log2f(amax)): the headers compute it
    from the bits and a table of where log2f rounds up to the next integer
    (``qc_gg_floor_log2``: CPU and GPU); here it equals the host's libm
    (ggml's x86-64 build: glibc) on the 64 floats on each side of every
    power of two (normal and subnormal: where log2f can round up, at most
    44 floats below), and on random floats; a table entry off by one
    fails."""
    p = np.arange(1, 255, dtype=np.uint32) << np.uint32(23)
    sub = np.uint32(1) << np.arange(0, 23, dtype=np.uint32)
    around = (np.concatenate([p, sub, [np.uint32(0x7F800000)]])[:, None].astype(np.int64) +
              np.arange(-64, 65)[None, :]).reshape(-1)
    rnd = np.random.default_rng(0).integers(1, 0x7F800000, 200_000)
    bits = np.unique(np.concatenate([around, rnd]))
    bits = bits[(bits > 0) & (bits < 0x7F800000)].astype(np.uint32)
    host, table = _gguf.floor_log2_pairs(bits.view(np.float32))
    assert np.array_equal(host, table), bits[host != table][:5]
