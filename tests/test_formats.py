"""quantcore.formats against the specification's vectors (tests/data/formats_vectors.json,
sections 1-3 and 6: every list case) and live against ml_dtypes, torch CPU
casts and onnx.reference on random and edge inputs."""
import json
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quantcore as qc
from quantcore import formats as F
from reference import assert_bits_equal

ml_dtypes = pytest.importorskip("ml_dtypes")

_HERE = os.path.dirname(os.path.abspath(__file__))
# the specification's vectors, recorded by running the references (copied here)
with open(os.path.join(_HERE, "data", "formats_vectors.json")) as _fh:
    VEC = json.load(_fh)

#: ml_dtypes' dtype of every FP8 format of the table (formats._common.MINIFLOATS)
ML = {name: getattr(ml_dtypes, "float8_" + name) for name in F.FP8_FORMATS}


def hexf(values):
    return np.array([int(v, 16) for v in values], np.uint32).view(np.float32)


def inp(key):
    i = VEC["inputs"][key]
    return hexf(i["x"]).reshape(i["shape"])


def cases(key, pred=lambda c: True):
    if VEC is None:
        return []
    return [pytest.param(c, id=f"{key}{i}") for i, c in enumerate(VEC[key]) if pred(c)]


def ints_equal(a, b):
    assert np.array_equal(np.asarray(a).astype(np.int64).reshape(-1),
                          np.asarray(b).astype(np.int64).reshape(-1)), (a, b)


def edge_inputs():
    """float32 edges of every FP8 format: signed zeros, Inf, NaN, float32
    subnormals, each format's subnormal / normal boundaries and their ties,
    the overflow thresholds, and random bit patterns."""
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 2.0 ** -149, -(2.0 ** -140), 1.0, -1.0]
    for k in range(-20, 17):
        for m in (1.0, 1.0625, 1.125, 1.1875, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, 1.9375):
            v += [m * 2.0 ** k, -m * 2.0 ** k]
    v += [448, 464, 465, 479, 480, 496, 512, 240, 247, 248, 256, 57344, 61439, 61440, 65536,
          1e10, 3.4e38]
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.array(v, np.float32), -np.array(v, np.float32),
                           bits.view(np.float32)])


# ---------------------------------------------------------------- header
def test_python_mirrors_of_the_header_constants():
    include = os.path.join(os.path.dirname(qc.__file__), "include")
    text = "".join(open(os.path.join(include, h)).read() for h in ("qc_formats.h", "qc_groups.h"))
    consts = dict((k, int(v)) for k, v in re.findall(r"#define (QC_\w+) (\d+)", text))
    for name, fid in F.FP8_FORMATS.items():
        assert consts[f"QC_FMT_{name.upper()}"] == fid
    assert F.OVERFLOW == {"satfinite": consts["QC_F8_SATFINITE"], "nonsat": consts["QC_F8_NONSAT"],
                          "torch": consts["QC_F8_TORCH"]}
    assert F.NAN_ENCODING["ml_dtypes"] == consts["QC_F8_NAN_MLDTYPES"]
    for py, c in (("F8_SCALE_MUL", "QC_F8_SCALE_MUL"), ("F8_SCALE_DIV", "QC_F8_SCALE_DIV"),
                  ("F8_DEQ_MUL", "QC_F8_DEQ_MUL"), ("F8_DEQ_DIV", "QC_F8_DEQ_DIV"),
                  ("F8_MASK_AMAX", "QC_F8_MASK_AMAX"), ("F8_PLUS_ZERO", "QC_F8_PLUS_ZERO"),
                  ("INT_SIGNED", "QC_INT_SIGNED"),
                  ("INT_WRAP32", "QC_INT_WRAP32"), ("INT_ADD_FLOAT", "QC_INT_ADD_FLOAT"),
                  ("GRP_SYMMETRIC", "QC_GRP_SYMMETRIC"), ("GRP_HQQ_OWN", "QC_GRP_HQQ_OWN"),
                  ("GRP_F16_SCALE", "QC_GRP_F16_SCALE")):
        assert getattr(F, py) == consts[c], py
    assert set(F.GROUP_RECIPES) == {"onnx", "onnx_numpy", "torchao", "tinygemm", "hqq", "awq",
                                    "gptq", "hqq_ort"}


def test_format_table_and_the_allow_lists_derived_from_it():
    """One table of minifloat formats (formats._common.MINIFLOATS) against
    the header and ml_dtypes; each consumer's allow-list is exactly its role
    in the table, and the functions accept exactly their list (a list
    edited by hand, or a consumer reading another's list, fails here)."""
    import ml_dtypes
    from quantcore.formats import mx
    text = open(os.path.join(os.path.dirname(qc.__file__), "include", "qc_formats.h")).read()
    consts = dict((k, int(v)) for k, v in re.findall(r"#define (QC_\w+) (\d+)", text))
    assert consts["QC_FMT_COUNT"] == len(F.MINIFLOATS) == F._common.FMT_COUNT
    for name, (fid, fmax, roles) in F.MINIFLOATS.items():
        assert consts[f"QC_FMT_{name.upper()}"] == fid, name
        width = 1 + int(name[1]) + int(name[3])  # sign, exponent and mantissa bits
        assert fmax == float(ml_dtypes.finfo(getattr(ml_dtypes, f"float{width}_{name}")).max)
        assert set(roles) <= {"cast", "onnx", "mx", "onnx_fp4"}, name
    assert sorted(i for i, _, _ in F.MINIFLOATS.values()) == list(range(len(F.MINIFLOATS)))
    assert F.FP8_FORMATS == F.formats_for("cast")
    assert F.ONNX_FP8_FORMATS == F.formats_for("onnx")
    assert F.ONNX_FP4_FORMATS == F.formats_for("onnx_fp4")
    assert F.FP8_MAX == {n: F.MINIFLOATS[n][1] for n in F.FP8_FORMATS}
    assert mx.MX_ELEMENTS == {**{n.removesuffix("fn"): i for n, i in F.formats_for("mx").items()},
                              "int8": consts["QC_FMT_COUNT"]}
    x = np.array([0.5, -1.0], np.float32)
    for name in F.MINIFLOATS:
        for role, call in (("cast", lambda: qc.cast_fp8(x, name)),
                           ("onnx", lambda: qc.quantize_linear(x, 1.0, output="float8_" + name)),
                           ("onnx", lambda: qc.dequantize_linear(np.zeros(2, np.uint8), 1.0,
                                                                 input="float8_" + name)),
                           ("onnx_fp4", lambda: qc.quantize_linear(x, 1.0,
                                                                   output="float4_" + name)),
                           ("onnx_fp4", lambda: qc.dequantize_linear(
                               np.zeros(2, np.uint8), 1.0, input="float4_" + name)),
                           ("mx", lambda: qc.mx_fake_quant(x, name.removesuffix("fn"),
                                                           block_size=2))):
            if role in F.MINIFLOATS[name][2]:
                call()
            else:
                with pytest.raises(ValueError):
                    call()


# ------------------------------------------------------- §1 vectors: casts
_POLICIES = {"ml_dtypes": dict(overflow="nonsat", nan="ml_dtypes"),
             "torch": dict(overflow="torch", nan="sign"),
             "onnx_ref_cast_sat1": dict(overflow="satfinite", nan="ml_dtypes"),
             "onnx_ref_cast_sat0": dict(overflow="nonsat", nan="ml_dtypes"),
             "ort_cast_sat1": dict(overflow="satfinite", nan="ml_dtypes")}


@pytest.mark.parametrize("case", cases("fp8_cast"))
def test_fp8_cast_vectors(case):
    x = hexf(case["x"])
    fmt = case["format"]
    for ref, kw in _POLICIES.items():
        got = qc.cast_fp8(x, fmt, **kw)
        _codes_equal(got, case["codes"][ref], fmt, f"{fmt} {ref}")
    # ORT saturate=0: equal outside its two documented bug bands (§1.3)
    got = qc.cast_fp8(x, fmt, overflow="nonsat", nan="ml_dtypes")
    a = np.abs(x)
    bug = (fmt == "e4m3fn") & (a >= 480) & (a < 496) | (fmt == "e5m2") & (a >= 61440) & \
        (a < 65536)
    _codes_equal(got[~bug], np.array(case["codes"]["ort_cast_sat0"], object)[~bug], fmt, "ort0")
    assert bug.any() == (fmt in ("e4m3fn", "e5m2"))
    # torch 2.11 on CUDA (gpu_observed): not saturating, NaN 0x7F|s
    obs = [c for c in VEC["gpu_observed"]["fp8_cast"] if c["format"] == fmt][0]
    _codes_equal(qc.cast_fp8(x, fmt, overflow="nonsat"), obs["torch_cuda"], fmt, "torch_cuda")


def _codes_equal(got, want, fmt, what):
    """Codes equal; a reference entry "nan" (ORT re-encoded from its float
    output) only needs a NaN code."""
    want = list(want)
    nan = np.array([w == "nan" for w in want])
    ints = np.array([0 if w == "nan" else w for w in want], np.int64)
    assert np.array_equal(got[~nan].astype(np.int64), ints[~nan]), what
    assert np.isnan(qc.fp8_decode(got[nan], fmt)).all(), what


@pytest.mark.parametrize("fmt", list(F.FP8_FORMATS))
def test_fp8_decode_vectors(fmt):
    codes = np.arange(256, dtype=np.uint8)
    got = qc.fp8_decode(codes, fmt)
    # the spec's vectors where it has the format (the four of its §1), else
    # ml_dtypes' own decode of the 256 codes
    refs = {k: hexf(v) for k, v in VEC["fp8_decode"][fmt].items()} if fmt in VEC["fp8_decode"] \
        else {"ml_dtypes": codes.view(ML[fmt]).astype(np.float32)}
    for ref in ("ml_dtypes", "torch"):
        if ref in refs:
            assert_bits_equal(got, refs[ref], ref)
    # the NaN encoding of the decode: 0x7FC00000 with the code's sign
    nan = np.isnan(got)
    signs = (codes[nan] >> 7).astype(np.uint32) << 31
    assert np.array_equal(got[nan].view(np.uint32), np.uint32(0x7FC00000) | signs)


@pytest.mark.parametrize("case", cases("fp8_cast", lambda c: c["format"] in ("e4m3fn", "e5m2")))
def test_fp8_cast_matches_the_gpu_intrinsics_observed(case):
    """cuda_cvt_satfinite / nosat (H100) = our satfinite / nonsat for every
    non-NaN input (the intrinsic drops the NaN sign, §1.4)."""
    obs = [c for c in VEC["gpu_observed"]["fp8_cast"] if c["format"] == case["format"]]
    x = hexf(case["x"])
    ok = ~np.isnan(x)
    for key, policy in (("cuda_cvt_satfinite", "satfinite"), ("cuda_cvt_nosat", "nonsat")):
        got = qc.cast_fp8(x, case["format"], overflow=policy)
        assert np.array_equal(got[ok], np.array(obs[0][key], np.uint8)[ok]), key
    assert_bits_equal(qc.fp8_decode(np.arange(256, dtype=np.uint8), case["format"]),
                      hexf(obs[0]["cuda_decode_all_codes"]))


# ------------------------------------------------------ live: ml_dtypes, torch
@pytest.mark.parametrize("fmt", list(F.FP8_FORMATS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_cast_live_against_ml_dtypes(fmt, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        x = edge_inputs().astype(dtype)
        want = x.astype(ML[fmt]).view(np.uint8)
    got = qc.cast_fp8(x, fmt, overflow="nonsat", nan="ml_dtypes")
    assert np.array_equal(got, want), x[got != want][:8]
    # decode: ml_dtypes' float32 values, NaN as NaN
    assert_bits_equal(qc.fp8_decode(got, fmt), want.view(ML[fmt]).astype(np.float32))
    assert_bits_equal(qc.fp8_decode(want.view(ML[fmt])), want.view(ML[fmt]).astype(np.float32))


@pytest.mark.parametrize("fmt", list(F.FP8_FORMATS))
def test_cast_live_against_torch(fmt):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_" + fmt):
        pytest.skip(f"torch has no float8_{fmt}")
    x = edge_inputs()
    want = torch.from_numpy(x).to(getattr(torch, "float8_" + fmt)).view(torch.uint8).numpy()
    got = qc.cast_fp8(x, fmt, overflow="torch", nan="sign")
    assert np.array_equal(got, want), (x[got != want][:8], got[got != want][:8])
    dec = torch.from_numpy(want).view(getattr(torch, "float8_" + fmt)).float().numpy()
    assert_bits_equal(qc.fp8_decode(got, fmt), dec)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1,
                max_size=64), st.sampled_from(list(F.FP8_FORMATS)))
def test_cast_hypothesis_matches_ml_dtypes_and_the_satfinite_rule(values, fmt):
    x = np.array(values, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(ML[fmt]).view(np.uint8)
        # ONNX saturate=1: clip to +-max, NaN passes, then ml_dtypes (spec §1.3)
        sat = np.where(np.isnan(x), x, np.clip(x, -F.FP8_MAX[fmt], F.FP8_MAX[fmt]))
        want_sat = sat.astype(np.float32).astype(ML[fmt]).view(np.uint8)
    assert np.array_equal(qc.cast_fp8(x, fmt, overflow="nonsat", nan="ml_dtypes"), want)
    assert np.array_equal(qc.cast_fp8(x, fmt, nan="ml_dtypes"), want_sat)


def test_fake_cast_is_decode_of_cast_and_its_mask():
    x = edge_inputs()
    for fmt in F.FP8_FORMATS:
        for overflow in F.OVERFLOW:
            y, m = qc.fp8_fake_cast(x, fmt, overflow=overflow, return_mask=True)
            assert_bits_equal(y, qc.fp8_decode(qc.cast_fp8(x, fmt, overflow=overflow), fmt))
            assert np.array_equal(m, np.abs(x) <= F.FP8_MAX[fmt])
    with np.errstate(invalid="ignore"):  # (NaN payloads of the float64 copy)
        x64 = x.astype(np.float64)
    y64 = qc.fp8_fake_cast(x64)
    assert y64.dtype == np.float64
    assert_bits_equal(y64.astype(np.float32), qc.fp8_fake_cast(x))


# --------------------------------------------------- §2 vectors: ONNX FP8 QDQ
@pytest.mark.parametrize("case", cases("onnx_qdq_fp8"))
def test_onnx_qdq_fp8_vectors(case):
    x = inp(case["x"])
    s = hexf([case["scale"]])[0]
    t = "float8_" + case["format"]
    q = qc.quantize_linear(x, s, output=t, saturate=bool(case["saturate"]))
    assert np.array_equal(q, case["onnx_ref"]["y_codes"])
    dq = qc.dequantize_linear(q, s, input=t)
    assert_bits_equal(dq, hexf(case["onnx_ref"]["dq"]))
    ort = hexf(case["ort"]["dq"])
    bug = (case["format"] == "e4m3fn") & (case["saturate"] == 0) & \
        (np.abs(x / s) >= 480) & (np.abs(x / s) < 496)      # ORT's band (§2: x = 960 -> 896)
    assert_bits_equal(dq[~bug], ort[~bug])


# ------------------------------------------------- §3 vectors: modelopt, torchao
@pytest.mark.parametrize("case", cases("modelopt_fp8"))
def test_modelopt_fp8_vectors(case):
    x = inp(case["x"])
    per_row = isinstance(case["amax"], list)
    amax = hexf(case["amax"]) if per_row else hexf([case["amax"]])[0]
    axis = 0 if per_row else None
    y, mask = qc.fp8_fake_quant(x, amax, axis=axis, return_mask=True)
    assert_bits_equal(y, hexf(case["y"]).reshape(x.shape))
    if not per_row:
        s = F.fp8_scale(amax)
        assert s.view(np.uint32) == int(case["scale_448_over_amax"], 16)
        assert (np.float32(1) / s).view(np.uint32) == int(case["inv_scale"], 16)
        assert np.array_equal(mask, np.abs(x) <= amax)
    if case["case"].startswith("amax=max"):  # amax=None computes reduce_amax
        assert_bits_equal(qc.fp8_fake_quant(x), y)


@pytest.mark.parametrize("case", cases("torchao_float8", lambda c: "x" in c))
def test_torchao_float8_vectors(case):
    x = inp(case["x"])
    axis = None if case["granularity"] == "tensorwise" else 0
    kw = dict(fmt=case["float8_dtype"], recipe="torchao",
              pow2=case["round_scales_to_power_of_2"], axis=axis)
    codes, s = qc.fp8_quantize(x, **kw)
    assert_bits_equal(np.atleast_1d(s), hexf(case["scale"]))
    assert np.array_equal(codes.reshape(-1), case["data_codes"])
    dq = qc.fp8_dequantize(codes, s, case["float8_dtype"], recipe="torchao", axis=axis)
    assert_bits_equal(dq.reshape(-1), hexf(case["dequant"]))
    assert_bits_equal(qc.fp8_fake_quant(x, **kw).reshape(-1), hexf(case["dequant"]))


@pytest.mark.parametrize("case", cases("torchao_float8", lambda c: c.get("case") ==
                                       "amax_to_scale"))
def test_torchao_amax_to_scale_vectors(case):
    s = F.fp8_scale(hexf(case["amax"]), case["float8_dtype"], recipe="torchao",
                    pow2=case["round_scales_to_power_of_2"])
    assert_bits_equal(s, hexf(case["scale"]))


def test_torchao_pow2_probe_and_log2_table():
    probe = [c for c in VEC["torchao_float8"] if c.get("case", "").startswith("_round")][0]
    s = hexf(probe["s"])
    assert_bits_equal(F.pow2_scale_torch(s), hexf(probe["torch"]))
    exact = np.exp2(np.floor(np.log2(s.astype(np.float64)))).astype(np.float32)
    assert int((F.pow2_scale_torch(s) != exact).sum()) == probe["n_differ"]
    tab = VEC["log2_rounding_tables"]
    assert (tab["e_from"], tab["e_to"]) == (-126, 127)
    assert F.N_FLOOR_UP.tolist() == tab["n_floor_up"]


def test_pow2_scale_live_against_torch_log2():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    e = rng.integers(-120, 120, 20000)
    f = (1 << 23) - rng.integers(0, 64, 20000)
    s = ((e + 127) << 23 | f).astype(np.uint32).view(np.float32)
    s = np.concatenate([s, np.float32([0, 1, 2, 0.5, np.nan])])
    want = torch.exp2(torch.floor(torch.log2(torch.from_numpy(s)))).numpy()
    assert_bits_equal(F.pow2_scale_torch(s), want)


def test_modelopt_fake_quant_live_against_torch_formula():
    """The modelopt eager formula executed in torch (spec §3.1) on random data."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((8, 33)) * rng.uniform(0.01, 100, (8, 1))).astype(np.float32)
    x[0, :4] = [np.inf, -np.inf, np.nan, -0.0]
    amax = np.abs(x[:, 4:]).max(axis=1).astype(np.float32)
    t = torch.from_numpy(x)
    a = torch.from_numpy(amax).reshape(-1, 1)
    s = 448.0 / torch.where(a <= 2 ** -24, torch.ones_like(a), a)
    q = torch.clamp(t * s, -448, 448).to(torch.float8_e4m3fn).float()
    want = (q * (1.0 / s)).numpy()
    assert_bits_equal(qc.fp8_fake_quant(x, amax, axis=0), want)


# ---------------------------------------------- §6 vectors: ONNX integer, groups
def _w():
    return inp("int_w")


@pytest.mark.parametrize("case", cases("int_block", lambda c: c["ref"].startswith(
    "onnx QuantizeLinear/")))
def test_onnx_blocked_int_vectors(case):
    t = case["type"].lower()
    s = hexf(case["scale"]).reshape(4, -1)
    z = np.array(case["zero_point"]).reshape(4, -1).astype(F.INT_TYPES[t][2])
    q = qc.quantize_linear(_w(), s, z, axis=1, block_size=32, output=t)
    ints_equal(q, case["onnx_ref_q"])
    if case["ort_q"]:
        ints_equal(q, case["ort_q"])
    dq = qc.dequantize_linear(q, s, z, axis=1, block_size=32, input=t)
    assert_bits_equal(dq.reshape(-1), hexf(case["onnx_ref_dq"]))
    assert_bits_equal(dq.reshape(-1), hexf(case["ort_dq"]))
    if case["onnx_raw_data_packed"]:
        ints_equal(qc.pack_int4(q.reshape(-1)), case["onnx_raw_data_packed"])


@pytest.mark.parametrize("case", cases("int_block", lambda c: "special" in c["ref"]))
def test_onnx_special_value_vectors(case):
    t = case["type"].lower()
    x = inp(case["x"])
    s = hexf([case["scale"]])[0]
    z = np.array(case["zero_point"], F.INT_TYPES[t][2])
    for compat, key in (("onnx_reference", "onnx_ref"), (None, "ort")):
        q = qc.quantize_linear(x, s, z, output=t, compat=compat)
        if case[key + "_q"] is not None:
            ints_equal(q, case[key + "_q"])
        assert_bits_equal(qc.dequantize_linear(q, s, z, input=t), hexf(case[key + "_dq"]))


@pytest.mark.parametrize("case", cases("int_block", lambda c: "MatMulNBits" in c["ref"]))
def test_ort_matmulnbits_vectors(case):
    bits, g, sym = case["bits"], case["block_size"], case["is_symmetric"]
    q, s, z = qc.group_quantize(_w(), bits, g, symmetric=sym)
    packed = qc.pack_int4(q) if bits == 4 else q
    assert list(packed.reshape(4, -1, packed.shape[-1] * g // 64 if bits == 4 else g).shape) \
        == case["packed_shape"]
    ints_equal(packed, case["packed"])
    assert_bits_equal(s.reshape(-1), hexf(case["scales"]))
    if sym:  # the kernel's implicit zero point; ORT writes zeros it never reads
        assert (z == 1 << (bits - 1)).all()
    else:
        ints_equal(qc.pack_int4(z) if bits == 4 else z, case["zero_points_packed"])
    # MatMulNBits dequantisation (q - zp) * s
    y = qc.group_dequantize(q, s, z, g)
    assert_bits_equal(y, ((q.astype(np.float32) - np.repeat(z, g, 1).astype(np.float32))
                          * np.repeat(s, g, 1)).astype(np.float32))


@pytest.mark.parametrize("case", cases("int_block", lambda c: "QDQ" in c["ref"]))
def test_ort_qdq_vectors(case):
    q, s, z = qc.group_quantize(_w(), 4, case["block_size"], symmetric=case["is_symmetric"])
    qt = q.T.astype(np.int16) - (8 if case["is_symmetric"] else 0)
    ints_equal(qc.pack_int4(qt.reshape(-1).astype(np.int8)), case["packed"])
    assert_bits_equal(s.T.reshape(-1), hexf(case["scales"]))
    if not case["is_symmetric"]:
        ints_equal(qc.pack_int4(z.T.reshape(-1)), case["zero_points_packed"])


@pytest.mark.parametrize("case", cases("int_block", lambda c: "DefaultWeightOnly" in c["ref"]))
def test_ort_numpy_helper_vectors(case):
    sym = "quant_slice_symmetric" in case["ref"]
    q, s, z = qc.group_quantize(_w(), 4, 32, recipe="onnx_numpy", symmetric=sym)
    ints_equal(q, case["q"])
    assert_bits_equal(s.reshape(-1), hexf(case["scale"]))
    if case["zero_point"] is not None:
        ints_equal(z, case["zero_point"])


@pytest.mark.parametrize("case", cases("int_block", lambda c: c["ref"].startswith("torchao")))
def test_torchao_group_vectors(case):
    g = case["group"]
    if "tinygemm" in case["ref"]:
        q, s, z = qc.group_quantize(_w(), 4, g, recipe="tinygemm")
        ints_equal(q, case["q"])
        assert_bits_equal(s.reshape(-1), hexf(case["scale"]))
        assert_bits_equal(z.reshape(-1), hexf(case["zero_float"]))
        # tinygemm dequantisation (q - 8) * s + zero, in float32 steps
        y = qc.group_dequantize(q, s, z, g, recipe="tinygemm")
        rs, rz = np.repeat(s, g, 1), np.repeat(z, g, 1)
        assert_bits_equal(y, ((q.astype(np.float32) - 8) * rs + rz).astype(np.float32))
        return
    kw = dict(symmetric=case["mapping"] == "SYMMETRIC", recipe="torchao",
              quant_min=case["quant_min"], quant_max=case["quant_max"])
    q, s, z = qc.group_quantize(_w(), 4, g, **kw)
    ints_equal(q, case["q"])
    assert_bits_equal(s.reshape(-1), hexf(case["scale"]))
    ints_equal(z, case["zero_point"])
    assert_bits_equal(qc.group_dequantize(q, s, z, g, recipe="torchao").reshape(-1),
                      hexf(case["dq"]))
    assert_bits_equal(qc.group_fake_quant(_w(), 4, g, **kw).reshape(-1), hexf(case["dq"]))


@pytest.mark.parametrize("case", cases("int_block", lambda c: "HQQ" in c["ref"]))
def test_hqq_vectors(case):
    # (the spec's HQQ vectors are ORT's port: recipe hqq_ort)
    q, s, z = qc.group_quantize(_w(), case["bits"], case["group"], recipe="hqq_ort")
    ints_equal(q, case["q"])
    assert_bits_equal(s.reshape(-1), hexf(case["scale"]))
    assert_bits_equal(z.reshape(-1), hexf(case["zero"]))


@pytest.mark.parametrize("case", cases("int_block", lambda c: c["ref"].startswith("formula")))
def test_awq_gptq_vectors(case):
    rec = "awq" if "awq" in case["ref"] else "gptq"
    sym = (not case["zero_point"]) if rec == "awq" else case["sym"]
    q, s, z = qc.group_quantize(_w(), case["bits"], case["group"], recipe=rec, symmetric=sym)
    ints_equal(q, case["q"])
    assert_bits_equal(s.reshape(-1), hexf(case["scale"]))
    # zero points compare as values: the reference's float -0.0 is the integer 0
    assert np.array_equal(z.reshape(-1).astype(np.float32), hexf(case["zero"]))
    y, mask = qc.group_fake_quant(_w(), case["bits"], case["group"], recipe=rec,
                                  symmetric=sym, return_mask=True)
    assert_bits_equal(y.reshape(-1), hexf(case["dq"]))
    assert mask.dtype == np.bool_ and mask.shape == _w().shape


def test_int4_packing_vectors():
    pk = VEC["int4_packing"]
    ints_equal(qc.pack_int4(np.array([1, -2, 7], np.int8)), pk["onnx_int4_[1,-2,7]"])
    ints_equal(qc.pack_int4(np.array([1, 14, 7], np.uint8)), pk["onnx_uint4_[1,14,7]"])


# --------------------------------------------------------- live: onnx.reference
def _onnx_run(op, inputs, attrs, out_type=None):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in zip(names, inputs)]
    out = helper.make_tensor_value_info("y", out_type or TensorProto.UNDEFINED, None)
    model = helper.make_model(helper.make_graph([node], "g", vi, [out]),
                              opset_imports=[helper.make_opsetid("", 21)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


def _random_x(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    flat[::17] = np.round(flat[::17] * 2) / 2   # ties of scale 0.5
    flat[3] = -0.0
    return x


@pytest.mark.parametrize("t", ["int8", "uint8", "int16", "uint16", "int4", "uint4"])
@pytest.mark.parametrize("how", ["tensor", "axis", "block"])
def test_quantize_linear_live_against_onnx_reference(t, how):
    x = _random_x((6, 40), 5)
    qmin, qmax, container = F.INT_TYPES[t]
    rng = np.random.default_rng(1)
    shape = {"tensor": (), "axis": (40,), "block": (6, 3)}[how]
    s = rng.uniform(0.3, 0.7, shape).astype(np.float32)
    z = rng.integers(max(qmin, -3), min(qmax, 3) + 1, shape).astype(container)
    attrs = {"axis": 1} | ({"block_size": 16} if how == "block" else {})
    onnx = pytest.importorskip("onnx")
    elem = {"int4": onnx.TensorProto.INT4, "uint4": onnx.TensorProto.UINT4}.get(t)
    zin = z
    if elem is not None:  # onnx wants int4 zero points as its own dtype
        import ml_dtypes as mld
        zin = z.astype(mld.int4 if t == "int4" else mld.uint4)
    want = _onnx_run("QuantizeLinear", [x, s, zin], attrs)
    got = qc.quantize_linear(x, s, z, axis=1, block_size=16 if how == "block" else 0, output=t,
                             compat="onnx_reference")
    ints_equal(got, want.astype(np.int64))
    want_dq = _onnx_run("DequantizeLinear", [want, s, zin], attrs)
    got_dq = qc.dequantize_linear(got, s, z, axis=1, block_size=16 if how == "block" else 0,
                                  input=t)
    assert_bits_equal(got_dq, want_dq.astype(np.float32))


@pytest.mark.parametrize("fmt", list(F.FP8_FORMATS))
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_linear_fp8_live_against_onnx_reference(fmt, saturate):
    x = np.concatenate([edge_inputs()[:400], _random_x((200,), 2) * 100])
    s = np.float32(0.75)
    z = np.zeros((), ML[fmt])
    want = _onnx_run("QuantizeLinear", [x, np.array(s), z], {"saturate": saturate})
    got = qc.quantize_linear(x, s, z, saturate=bool(saturate))
    ints_equal(got, want.view(np.uint8))
    want_dq = _onnx_run("DequantizeLinear", [want, np.array(s), z], {})
    assert_bits_equal(qc.dequantize_linear(got, s, input="float8_" + fmt), want_dq)


# ---------------------------------------------------------- group invariants
@pytest.mark.parametrize("recipe", ["onnx", "onnx_numpy", "torchao", "tinygemm", "hqq", "awq",
                                    "gptq"])
def test_group_axis_layouts_agree(recipe):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    sym = recipe not in ("tinygemm", "hqq")
    ref = qc.group_quantize(w, 4, 16, recipe=recipe, symmetric=sym)
    for got, want in zip(qc.group_quantize(np.asfortranarray(w.T), 4, 16, axis=0,
                                           recipe=recipe, symmetric=sym), ref):
        assert np.array_equal(got.T, want)
    y = qc.group_fake_quant(w, 4, 16, recipe=recipe, symmetric=sym)
    q, s, z = ref
    yd = qc.group_dequantize(q, s, z, 16, recipe=recipe)
    if recipe not in ("awq", "gptq"):  # (AWQ / GPTQ keep the sign of a zero q in float)
        assert_bits_equal(y, yd)
    else:
        assert np.array_equal(y, yd)


def test_onnx_group_allows_a_short_last_group_and_threads_agree():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 100_003)).astype(np.float32)
    q, s, z = qc.group_quantize(w, 4, 128)
    assert s.shape == (3, 782)
    before = qc.get_num_threads()
    qc.set_num_threads(1)
    try:
        q1, s1, z1 = qc.group_quantize(w, 4, 128)
    finally:
        qc.set_num_threads(before)
    assert np.array_equal(q, q1) and np.array_equal(s, s1) and np.array_equal(z, z1)
    # the short last group by the formula on its own
    qs, ss, zs = qc.group_quantize(w[:, 100_000 - 32:], 4, 128)
    assert_bits_equal(s[:, -1], ss[:, -1])


def test_pack_unpack_roundtrip_and_orders():
    rng = np.random.default_rng(0)
    q = rng.integers(-8, 8, (5, 7)).astype(np.int8)
    for order in ("low_first", "high_first"):
        p = qc.pack_int4(q, order=order)
        assert p.shape == (5, 4)
        assert np.array_equal(qc.unpack_int4(p, 7, signed=True, order=order), q)
    u = q.astype(np.int16) + 8
    p = qc.pack_int4(u.astype(np.uint8), order="high_first")
    assert p[0, 0] == (u[0, 0] << 4 | u[0, 1])
    with pytest.raises(ValueError, match="4 bits"):
        qc.pack_int4(np.array([16], np.uint8))


# ------------------------------------------------------------------ errors
def test_bad_arguments_raise_clear_errors():
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="fmt must be one of"):
        qc.cast_fp8(x, "e3m4")
    with pytest.raises(ValueError, match="overflow must be one of"):
        qc.cast_fp8(x, overflow="clip")
    with pytest.raises(TypeError, match="floating dtype"):
        qc.cast_fp8(np.ones(3, np.int32))
    with pytest.raises(ValueError, match="fmt is required"):
        qc.fp8_decode(np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="fmt='e4m3fn' only"):
        qc.fp8_fake_quant(x, 1.0, "e5m2")
    with pytest.raises(ValueError, match="amax must be >= 0"):
        qc.fp8_fake_quant(x, -1.0)
    with pytest.raises(ValueError, match="output must be one of"):
        qc.quantize_linear(x, 1.0, output="int3")
    with pytest.raises(ValueError, match="finite and nonzero"):
        qc.quantize_linear(x, 0.0)
    with pytest.raises(ValueError, match="zero_point must be integers"):
        qc.quantize_linear(x, 1.0, np.array(9, np.int8), output="int4")
    with pytest.raises(ValueError, match="FP8 zero point must be 0"):
        qc.dequantize_linear(np.zeros(3, np.uint8), 1.0, np.float32(1), input="float8_e4m3fn")
    with pytest.raises(ValueError, match="block_size=4 the scale must have shape"):
        qc.quantize_linear(np.ones((2, 8), np.float32), np.ones((2, 3)), axis=1, block_size=4)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        qc.group_quantize(np.ones((2, 10), np.float32), 4, 4, recipe="awq")
    with pytest.raises(ValueError, match="asymmetric only"):
        qc.group_quantize(np.ones((2, 8), np.float32), 4, 4, recipe="hqq", symmetric=True)
    with pytest.raises(ValueError, match="bits must be in 2..8"):
        qc.group_quantize(np.ones((2, 8), np.float32), 9, 4)
    with pytest.raises(ValueError, match="torchao options"):
        qc.group_quantize(np.ones((2, 8), np.float32), 4, 4, quant_min=0)
    with pytest.raises(ValueError, match="recipe must be one of"):
        qc.group_quantize(np.ones((2, 8), np.float32), 4, 4, recipe="nf4")


def test_nonfinite_group_is_documented_result():
    w = np.ones((2, 8), np.float32)
    w[0, 1] = np.nan
    q, s, z = qc.group_quantize(w, 4, 4)
    assert np.isnan(s[0, 0]) and z[0, 0] == 0 and (q[0, :4] == 0).all()
    assert np.isfinite(s[0, 1]) and np.isfinite(s[1]).all()


def test_torch_tensors_round_trip_through_dlpack():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-500, 500, 64)
    codes = qc.cast_fp8(t)
    assert isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8
    want = t.to(torch.float8_e4m3fn).view(torch.uint8)   # torch 2.13 saturates e4m3fn
    assert torch.equal(codes, want)
