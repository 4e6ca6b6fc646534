"""The engine writers' fast FP8 loops (quantcore/_cpu/_engines.pyx,
include/qc_engines.h) against the formulas they replace, bit for bit:
``cast_fp8(round_to(x / s, BF16))`` (compressed-tensors FP8_DYNAMIC,
ModelOpt FP8 per tensor) and ``cast_fp8(x / s)`` (ModelOpt FP8 per
channel), on float32 values and on stored BF16 bits; every BF16 value;
values on and beside e4m3's ties, its subnormals and its saturation; the
row amax with NaN / inf; the directory writer's refusal of NaN / inf in
the bits path, by name."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore import formats as F
from quantcore._cpu import _engines as E
from quantcore.checkpoints import SafetensorsReader, SafetensorsWriter
from quantcore.engines import compressed_tensors as CT
from quantcore.engines import modelopt as MO

F32 = np.float32


def _reference(x, s, rnd):
    """The numpy formulas (quantcore.formats' cast; compressed_tensors.round_to)."""
    with np.errstate(over="ignore"):
        v = (x / (s[:, None] if s.size > 1 else s[0])).astype(F32)
    if rnd:
        v = CT.round_to(v, "BF16")
    return F.cast_fp8(v, "e4m3fn", overflow="satfinite")


def _bits(x):
    """The BF16 bits of float32 values exact in BF16."""
    return (np.ascontiguousarray(x, F32).view(np.uint32) >> 16).astype(np.uint16)


def _tricky():
    """e4m3fn's grid points, their midpoints and a float32 ulp either side,
    both signs, over the subnormals, the normals and past 448 / 464."""
    grid = np.unique(np.abs(F.fp8_decode(np.arange(256, dtype=np.uint8), "e4m3fn")))
    grid = grid[np.isfinite(grid)].astype(F32)
    mids = ((grid[1:] + grid[:-1]) / 2).astype(F32)
    pts = np.concatenate([grid, mids, [F32(464), F32(480), F32(1e6), F32(2.0 ** -10),
                                       F32(2.0 ** -11), F32(1e-30), F32(1e-40)]]).astype(F32)
    near = np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(0))])
    return np.concatenate([near, -near]).astype(F32)


@pytest.mark.parametrize("rnd", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_ties_subnormals_and_saturation(rnd, nthreads):
    v = _tricky()
    v = v[: v.size // 8 * 8].reshape(8, -1)
    s = np.ones(1, F32)
    assert np.array_equal(E.fp8_rows(v, s, rnd, nthreads), _reference(v, s, rnd))


@pytest.mark.parametrize("rnd", [True, False])
def test_every_bf16_value(rnd):
    b = np.arange(65536, dtype=np.uint32)
    rows = b[(b & 0x7F80) != 0x7F80].astype(np.uint16).reshape(-1, 256)  # the finite ones
    xr = (rows.astype(np.uint32) << 16).view(F32)
    for s in (F32(1), F32(0.0078125), F32(3.1e-5), F32(1.7e3), F32(0.3)):
        sv = np.full(1, s, F32)
        ref = _reference(xr, sv, rnd)
        assert np.array_equal(E.fp8_rows(rows, sv, rnd, 1), ref)
        assert np.array_equal(E.fp8_rows(xr, sv, rnd, 2), ref)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 700), log_spread=st.integers(-30, 30),
       seed=st.integers(0, 2**32 - 1), bf16=st.booleans(), rnd=st.booleans(),
       per_row=st.booleans())
def test_rows_match_the_numpy_formulas(rows, cols, log_spread, seed, bf16, rnd, per_row):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 2.0 ** log_spread).astype(F32)
    if bf16:
        x = CT.round_to(x, "BF16")
    a = np.abs(x).max(axis=1)
    s = (np.maximum(a, F32(1e-30)) / F32(rng.choice([448, 400, 1]))).astype(F32)
    s = s if per_row else s[:1]
    ref = _reference(x, s, rnd)
    assert np.array_equal(E.fp8_rows(x, s, rnd, 1), ref)
    assert np.array_equal(E.fp8_rows(x, s, rnd, 2), ref)
    if bf16:
        assert np.array_equal(E.fp8_rows(_bits(x), s, rnd, 2), ref)


def test_the_scalar_rule_is_the_table_loop():
    v = _tricky()
    for rnd in (True, False):
        want = _reference(v.reshape(1, -1), np.ones(1, F32), rnd).reshape(-1)
        assert [E.fp8_scalar(float(t), 1.0, rnd) for t in v] == want.tolist()


def test_row_amax_on_bits_and_values():
    x = np.array([[0.5, -3.0, 2.0], [-0.0, 0.0, -0.0], [1.0, np.inf, 2.0], [np.nan, 1.0, -np.inf],
                  [-np.inf, 1.0, 2.0]], F32)
    for w, nt in ((x, 1), (x, 2), (_bits(x), 1), (_bits(x), 2)):
        a = E.absmax_rows(np.ascontiguousarray(w), nt)
        assert a[:2].tolist() == [3.0, 0.0] and np.signbit(a[1]) == False  # noqa: E712
        assert a[2] == np.inf and np.isnan(a[3]) and a[4] == np.inf
    with pytest.raises(ValueError, match="tensor 'w' holds NaN or inf"):
        CT.row_absmax(x, "w")


@pytest.mark.parametrize("group", [2, 4, 8, 16, 32, 64])
def test_group_amax_on_bits_and_values(group):
    """group_absmax_rows is absmax_rows of each group (NaN over inf, -0 as
    0), on stored bits and float32 values, at 1 and 2 threads; groups
    shorter and longer than its 8 lanes."""
    x = CT.round_to(np.random.default_rng(group).standard_normal((5, 128)).astype(F32), "BF16")
    x[0, :6] = [-0.0, 0.0, -0.0, -0.0, 0.0, -0.0]
    x[0, 64:] = -0.0
    x[1, 5], x[2, 70], x[3, 1], x[3, 127] = np.inf, -np.inf, np.nan, np.inf
    x[4, 9] = 2.0 ** -130
    for w in (x, _bits(x)):
        ref = E.absmax_rows(np.ascontiguousarray(w).reshape(-1, group), 1).reshape(5, -1)
        for nt in (1, 2):
            got = E.group_absmax_rows(w, group, nt)
            assert got.view(np.uint32).tolist() == ref.view(np.uint32).tolist()
    with pytest.raises(ValueError, match="tensor 'w' holds NaN or inf"):
        CT.group_absmax(x, 16, "w")


@pytest.mark.parametrize("dt", ["BF16", "F16", "F32"])
def test_fp8_weights_equal_the_numpy_path(dt):
    """compressed-tensors' and ModelOpt's FP8 weights (the fast loops) equal
    the numpy formulas they replaced, per dtype."""
    x = CT.round_to((np.random.default_rng(3).standard_normal((40, 96)) * 0.05).astype(F32), dt)
    x[3] = 0
    s = CT._scale(np.abs(x).max(axis=1), 448, dt)
    with np.errstate(over="ignore"):
        v = CT.round_to((x / s[:, None]).astype(F32), dt)
    q, s2 = CT.fp8_channel(x, dt)
    assert np.array_equal(q, F.cast_fp8(v, "e4m3fn", overflow="satfinite"))
    assert np.array_equal(s, s2)
    if dt == "BF16":
        assert np.array_equal(CT.fp8_channel(_bits(x), dt)[0], q)
    q, s = MO.fp8_channel(x, dt)
    assert np.array_equal(q, F.cast_fp8((x / s[:, None]).astype(F32), "e4m3fn",
                                        overflow="satfinite"))
    q, s = MO.fp8_tensor(x, dt)
    assert np.array_equal(q, F.cast_fp8(CT.round_to((x / s).astype(F32), dt), "e4m3fn",
                                        overflow="satfinite"))


@pytest.mark.parametrize("fmt,scheme", [("compressed-tensors", "FP8_DYNAMIC"),
                                        ("compressed-tensors", "W8A16"),
                                        ("compressed-tensors", "W4A16_ASYM"),
                                        ("modelopt", "FP8_PER_CHANNEL_PER_TOKEN")])
def test_nan_or_inf_weights_are_refused_by_name_on_the_bits_path(tmp_path, fmt, scheme):
    from quantcore import engines
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    bad = "model.layers.0.mlp.up_proj.weight"
    names = ["model.layers.0.self_attn.o_proj.weight", bad]
    x = np.ones((16, 32), F32)
    with SafetensorsWriter(src / "model.safetensors", [(n, "BF16", (16, 32)) for n in names]) as w:
        w.write(names[0], _bits(x))
        y = _bits(x)
        y[2, 5] = 0x7FC0  # NaN
        w.write(bad, y)
    with SafetensorsReader(src / "model.safetensors") as r:
        assert r.info(bad) == ("BF16", (16, 32))
    with pytest.raises(ValueError, match=f"tensor {bad!r} holds NaN or inf"):
        engines.quantize_model(src, tmp_path / "out", scheme, fmt=fmt,
                               **({"group_size": 32} if scheme in ("W8A16", "W4A16_ASYM") else {}))
    assert sorted(os.listdir(tmp_path)) == ["src"]


def _fp4_reference(x, d, group, rnd):
    rows, k = x.shape
    with np.errstate(over="ignore"):
        v = (x.reshape(rows, k // group, group) / d[..., None]).astype(F32)
    if rnd:
        v = CT.round_to(v, "BF16")
    return F.pack_int4(CT.e2m1_codes(v).reshape(rows, k))


def _e2m1_tricky():
    """compressed-tensors' e2m1 thresholds and grid, a float32 ulp either
    side, both signs, zeros, tiny and huge values (a multiple of 32)."""
    pts = np.array([e for e, _ in CT._E2M1_UP] + list(CT.E2M1_VALUES) + [7, 1e-30, 1e30],
                   F32)
    near = np.concatenate([pts, np.nextafter(pts, F32(np.inf)), np.nextafter(pts, F32(0))])
    v = np.concatenate([near, -near, [F32(-0.0)]]).astype(F32)
    return np.resize(v, (v.size + 31) // 32 * 32)


@pytest.mark.parametrize("rnd", [True, False])
@pytest.mark.parametrize("group", [16, 32])
def test_fp4_rows_ties_and_every_bf16_value(rnd, group):
    v = _e2m1_tricky().reshape(1, -1)
    d = np.ones((1, v.shape[1] // group), F32)
    for nt in (1, 2):
        assert np.array_equal(E.fp4_rows(v, d, group, rnd, nt), _fp4_reference(v, d, group, rnd))
    b = np.arange(65536, dtype=np.uint32)
    rows = b[(b & 0x7F80) != 0x7F80].astype(np.uint16).reshape(-1, 256)
    xr = (rows.astype(np.uint32) << 16).view(F32)
    d = np.random.default_rng(1).choice(np.array([1, 0.5, 3e-3, 7.25, 1e-20, 3e20], F32),
                                        (rows.shape[0], 256 // group)).astype(F32)
    ref = _fp4_reference(xr, d, group, rnd)
    assert np.array_equal(E.fp4_rows(rows, d, group, rnd, 1), ref)
    assert np.array_equal(E.fp4_rows(xr, d, group, rnd, 2), ref)


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from(["BF16", "F16", "F32"]), rows=st.integers(1, 7),
       groups=st.integers(1, 9), log_spread=st.integers(-12, 10), seed=st.integers(0, 2**32 - 1))
def test_fp4_weights_equal_the_numpy_path(dt, rows, groups, log_spread, seed):
    """NVFP4A16's and MXFP4's weights (the e2m1 loop) equal the numpy
    formulas they replaced."""
    rng = np.random.default_rng(seed)
    x = CT.round_to((rng.standard_normal((rows, 32 * groups)) * 2.0 ** log_spread).astype(F32),
                    dt)
    g = CT.nvfp4_global_scale(np.abs(x).max(), dt)
    packed, scodes, t = CT.nvfp4(x, dt, g)
    assert np.array_equal(packed, _fp4_reference(x, t, 16, False))
    if dt == "BF16":
        assert np.array_equal(CT.nvfp4(_bits(x), dt, g)[0], packed)
    packed, e = CT.mxfp4(x, dt)
    _, s = CT.mx_exponents(np.abs(x.reshape(rows, groups, 32)).max(axis=-1), dt)
    with np.errstate(over="ignore"):
        v = CT.round_to((x.reshape(rows, groups, 32) / s[..., None]).astype(F32), dt)
    assert np.array_equal(packed, F.pack_int4(CT.e2m1_codes(v).reshape(x.shape)))
    if dt == "BF16":
        assert np.array_equal(CT.mxfp4(_bits(x), dt)[0], packed)


@settings(max_examples=30, deadline=None)
@given(log_spread=st.integers(-30, 30), seed=st.integers(0, 2**32 - 1),
       rnd=st.booleans())
def test_nvfp4_scales_equal_the_numpy_steps(log_spread, seed, rnd):
    """_engines.nvfp4_scales (qc_eng_nvfp4_scale) equals the numpy steps:
    NVFP4A16's (BF16 / F32; its F16 path's steps with BF16 / no rounding):
    r(amax / 6), e4m3(g * s) satfinite, 0.125's code where 0, decode / g;
    and ModelOpt's W4A16_NVFP4;
    on maxima spread over 2^+-30 with zeros, ties of BF16 and huge values
    past 448 * 6 / g."""
    rng = np.random.default_rng(seed)
    a = (np.abs(rng.standard_normal((7, 130))) * 2.0 ** log_spread).astype(F32)
    a[0, :4] = [0, 2.0 ** -149, 1e30, 3e38]
    a[1, :3] = (np.float32([1.5, 3.0, 0.75]) * 6).astype(F32)
    g = CT.nvfp4_global_scale(np.float32(np.median(a)), "BF16")
    s = np.divide(a, F32(6), dtype=F32)
    if rnd:
        s = CT.round_to(s, "BF16")
    with np.errstate(over="ignore"):
        codes = F.cast_fp8(np.multiply(g, s, dtype=F32), "e4m3fn")
    codes[codes == 0] = F.cast_fp8(np.float32([0.125]), "e4m3fn")[0]
    t = np.divide(F.fp8_decode(codes, "e4m3fn"), g, dtype=F32)
    recipe = "compressed-tensors-bf16" if rnd else "compressed-tensors"
    # ModelOpt's (modelopt.nvfp4 before the C loop): amax / f32(6 g), 1 where
    # 0, clipped to [2^-9, 448], e4m3, decode * g
    bs = np.divide(a, F32(F32(6) * g[0]), dtype=F32)
    bs[bs == 0] = 1
    mo_codes = F.cast_fp8(np.clip(bs, F32(2.0 ** -9), F32(448)), "e4m3fn")
    mo_t = np.multiply(F.fp8_decode(mo_codes, "e4m3fn"), g[0], dtype=F32)
    for nt in (1, 2):
        got_codes, got_t = E.nvfp4_scales(a, float(g[0]), recipe, nt)
        assert np.array_equal(got_codes, codes) and np.array_equal(got_t, t)
        got_codes, got_t = E.nvfp4_scales(a, float(g[0]), "modelopt", nt)
        assert np.array_equal(got_codes, mo_codes) and np.array_equal(got_t, mo_t)


@pytest.mark.parametrize("dt", ["BF16", "F32", "F16"])
def test_w4a16_words_equal_the_numpy_path(dt):
    """W4A16's packed words (the int4 code loop) equal pack_int32 of the
    numpy int_group's codes: on every BF16 / F16 value (BF16: and its stored bits), and on the
    rounding ties k + 0.5 and a float32 ulp either side (F32)."""
    b = np.arange(65536, dtype=np.uint32)
    x = (b[(b & 0x7F80) != 0x7F80] << 16).view(F32).reshape(-1, 256)
    if dt == "F16":  # every finite F16 value
        h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        x = h[(h & 0x7C00) != 0x7C00].view(np.float16).astype(F32).reshape(-1, 256)
    if dt == "F32":
        ties = np.arange(-7, 7, dtype=F32) + F32(0.5)
        near = np.concatenate([ties, np.nextafter(ties, F32(np.inf)),
                               np.nextafter(ties, F32(-np.inf))])
        x = np.resize(near, (4, 64)).astype(F32)
        x[:, 0] = F32(7.5)  # amax 7.5: s = 1, so x / s = x, on and beside the ties
    x = CT.round_to(x, dt)
    for group in (32, 64, 128):
        if x.shape[1] % group:
            continue
        want_q, want_s, _ = CT.int_group(np.array(x), dt, 4, group, loops=False)
        packed, s, _ = CT.int_group(x, dt, 4, group, packed=True)
        assert np.array_equal(packed, CT.pack_int32(want_q, 4)) and np.array_equal(s, want_s)
        if dt == "BF16":
            assert np.array_equal(CT.int_group(_bits(x), dt, 4, group, packed=True)[0], packed)


def _int_ties(bits):
    """The rounding ties k + 0.5 of a b-bit code range (and past its ends), a
    float32 ulp either side, zeros of both signs; amax at the top: s = 1."""
    top = (1 << (bits - 1)) - 0.5
    ties = np.arange(-top - 1, top + 1, dtype=F32)
    near = np.concatenate([ties, np.nextafter(ties, F32(np.inf)), np.nextafter(ties, F32(-np.inf)),
                           [F32(0), F32(-0.0)]])
    x = np.resize(near, (4, 256)).astype(F32)
    x[:, 0] = F32(top)
    return x


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from(["BF16", "F32"]), bits=st.sampled_from([4, 8]),
       symmetric=st.booleans(), rows=st.integers(1, 7), groups=st.integers(1, 5),
       group=st.sampled_from([32, 64, 128]), log_spread=st.integers(-30, 20),
       seed=st.integers(0, 2**32 - 1), shift=st.floats(-3, 3), kind=st.sampled_from(
           ["normal", "ties", "zero group", "one sign"]))
def test_int_group_loops_equal_the_numpy_path(dt, bits, symmetric, rows, groups, group,
                                              log_spread, seed, shift, kind):
    """W8A16 / W4A16_ASYM (and W4A16's codes): the loops of qc_engines.h
    (group min / max or amax, then clip(rint(r(r(x / s) + z)))) on float32
    values and on stored BF16 bits give int_group's numpy formulas' codes,
    scales and zero points (ties, an all-zero group: the eps scale and the
    NaN zero point, a group of one sign: the zero point at an end)."""
    rng = np.random.default_rng(seed)
    x = ((rng.standard_normal((rows, group * groups)) + shift) * 2.0 ** log_spread).astype(F32)
    if kind == "ties":
        x = np.resize(_int_ties(bits), (rows, group * groups)).astype(F32)
    elif kind == "zero group":
        x[0, :group] = 0
    elif kind == "one sign":
        x[-1, :group] = np.abs(x[-1, :group])
    x = CT.round_to(x, dt)
    want = CT.int_group(x, dt, bits, group, symmetric, loops=False)
    got = [CT.int_group(x, dt, bits, group, symmetric)]
    if dt == "BF16":
        got.append(CT.int_group(_bits(x), dt, bits, group, symmetric))
    for g in got:
        for a, b in zip(g, want):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    words = CT.int_group(_bits(x) if dt == "BF16" else x, dt, bits, group, symmetric,
                         packed=True)[0]
    assert words.dtype == np.dtype("<i4") and np.array_equal(words, CT.pack_int32(want[0], bits))


def test_int_rows_every_bf16_value():
    """int_rows' codes of every finite BF16 value (BF16 rounding of x / s and
    of v + z; 4- and 8-bit ranges, zero points 0 and -3) equal the numpy
    steps; and group_minmax_rows' NaN / inf / -0 on bits and on values."""
    b = np.arange(65536, dtype=np.uint32)
    bits16 = b[(b & 0x7F80) != 0x7F80].astype(np.uint16).reshape(-1, 256)
    x = (bits16.astype(np.uint32) << 16).view(F32)
    rng = np.random.default_rng(3)
    s = rng.choice(np.array([1, 0.5, 3e-3, 7.25, 1e-20, 3e20], F32), (x.shape[0], 8)).astype(F32)
    for qmin, qmax in ((-8, 7), (-128, 127)):
        for z0 in (0, -3):
            z = np.full(s.shape, F32(z0))
            with np.errstate(over="ignore"):
                v = CT.round_to((x.reshape(-1, 8, 32) / s[..., None]).astype(F32), "BF16")
                v = CT.round_to((v + z[..., None]).astype(F32), "BF16")
            want = np.clip(np.rint(v), qmin, qmax).astype(np.int8).reshape(x.shape)
            for src, nt in ((bits16, 1), (x, 2)):
                assert np.array_equal(E.int_rows(src, s, z, 32, qmin, qmax, True, nt), want)
    y = np.array([[1, -0.0, np.inf, 2, np.nan, 1, -np.inf, 0]], F32)
    lo, hi = E.group_minmax_rows(y, 2, 1)
    assert np.array_equal(lo, np.array([[-0.0, 2, np.nan, -np.inf]], F32), equal_nan=True)
    assert np.array_equal(hi, np.array([[1, np.inf, np.nan, 0]], F32), equal_nan=True)
    y = np.where(np.isfinite(y), y, F32(3))
    assert all(np.array_equal(a, b) for a, b in zip(E.group_minmax_rows(_bits(y), 4, 2),
                                                    E.group_minmax_rows(y, 4, 1)))
    with pytest.raises(ValueError, match="group 3"):
        E.int_rows(x, s, s, 3, -8, 7, True, 1)
