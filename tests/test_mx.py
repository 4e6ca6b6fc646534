"""quantcore.mx (MX and NVFP4, the formats specification §4-5) against
every vector of its sections 4-5 (tests/data/formats_vectors.json) bit for bit (torchao's ``to_mx``
for every element type x scale mode, microxcaling's ``_quantize_mx``,
torchao's and modelopt's NVFP4), the float64 NumPy references of the
spec's formulas (tests/reference.py) on random and edge inputs, the
log2 rounding tables at their boundaries, special blocks, any axis and a
ragged last block, and the argument checks."""
import json
import os
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import quantcore as qc
from quantcore import mx
from quantcore._cpu import _kernels as K
from reference import (assert_bits_equal, ref_mx_codes, ref_mx_fake_quant, ref_mx_scale,
                       ref_nvfp4)

ml_dtypes = pytest.importorskip("ml_dtypes")

_HERE = os.path.dirname(os.path.abspath(__file__))
# the specification's vectors, recorded by running the references (copied here)
with open(os.path.join(_HERE, "data", "formats_vectors.json")) as _fh:
    VEC = json.load(_fh)

ELEM = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "fp6_e2m3": "e2m3", "fp6_e3m2": "e3m2",
        "fp4_e2m1": "e2m1", "int8": "int8"}
MODES = ("floor", "ceil", "even", "rceil", "rceil_exact", "floor_log2")


def hexf(values):
    return np.array([int(v, 16) for v in values], np.uint32).view(np.float32)


def inp(key):
    i = VEC["inputs"][key]
    return hexf(i["x"]).reshape(i["shape"])


def cases(key):
    return [pytest.param(c, id=f"{key}{i}-{c.get('elem', '')}-"
                         f"{c.get('mode', c.get('round', ''))}") for i, c in enumerate(VEC[key])]


def ints(a):
    return np.asarray(a).astype(np.int64).reshape(-1)


def zero_of(elem):
    """What dequantization adds to the fake-quant value: int8 codes hold no
    -0 (a negative value rounding to zero dequantises to +0), the float
    elements do."""
    return np.float32(0) if elem == "int8" else np.float32(-0.0)


def unpack_rows(packed, k):
    """FP4 codes of packed rows (low nibble first)."""
    p = np.asarray(packed).astype(np.int64)
    return np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)[:, :k]


# ------------------------------------------------------- the spec vectors
@pytest.mark.parametrize("case", cases("mx_torchao"))
def test_torchao_vectors(case):
    """torchao to_mx / to_dtype: scales, element codes (FP4 packed) and the
    dequantised values, bit for bit, through compat='torchao'; the
    'exact ceil' codes of the rceil cases through scale_mode='rceil_exact'."""
    x, elem, mode = inp(case["x"]), ELEM[case["elem"]], case["mode"]
    s, q = qc.mx_quantize(x, elem, scale_mode=mode, compat="torchao")
    assert np.array_equal(ints(s), case["scale_e8m0"])
    assert np.array_equal(ints(q), case["elem_codes"])
    y_ref = hexf(case["dequant"]).reshape(x.shape)
    assert_bits_equal(qc.mx_dequantize(s, q, elem), y_ref)
    assert_bits_equal(qc.mx_fake_quant(x, elem, scale_mode=mode, compat="torchao"), y_ref)
    exact = next((v for k, v in case.items() if k.startswith("scale_e8m0_exact_ceil")), None)
    if exact is not None:
        s2, _ = qc.mx_quantize(x, elem, scale_mode="rceil_exact")
        assert np.array_equal(ints(s2), exact)


@pytest.mark.parametrize("case", cases("mx_microxcaling"))
def test_microxcaling_vectors(case):
    """microxcaling _quantize_mx (round 'nearest' = half away, 'even' =
    RNE), bit for bit, and quantize + dequantize giving the same bits."""
    x, elem = inp(case["x"]), ELEM[case["elem"]]
    rounding = "half_away" if case["round"] == "nearest" else "rne"
    y_ref = hexf(case["y"]).reshape(x.shape)
    y = qc.mx_fake_quant(x, elem, compat="microxcaling", elem_rounding=rounding)
    assert np.array_equal(y.view(np.uint32), y_ref.view(np.uint32))
    s, q = qc.mx_quantize(x, elem, compat="microxcaling", elem_rounding=rounding)
    assert_bits_equal(qc.mx_dequantize(s, q, elem), y_ref + zero_of(elem))


@pytest.mark.parametrize("case", cases("nvfp4"))
def test_nvfp4_vectors(case):
    x = inp(case["x"])
    if case["ref"].startswith("torchao"):
        recipe, g = "torchao", case["per_tensor_scale"]
        g = None if g is None else hexf([g])[0]
    else:
        recipe, g = "modelopt", None
    q, s, g_out = qc.nvfp4_quantize(x, g, recipe=recipe)
    if recipe == "modelopt":
        assert g_out.view(np.uint32) == int(case["weights_scaling_factor_2"], 16)
    assert np.array_equal(ints(s), case["block_scale_e4m3"])
    assert np.array_equal(ints(q), case["packed"])
    y_ref = hexf(case["dequant"]).reshape(x.shape)
    assert np.array_equal(qc.nvfp4_dequantize(q, s, g_out, recipe=recipe).view(np.uint32),
                          y_ref.view(np.uint32))
    assert np.array_equal(qc.nvfp4_fake_quant(x, g, recipe=recipe).view(np.uint32),
                          y_ref.view(np.uint32))


def test_fp4_encoders_vector():
    """The e2m1 encoders of torchao (sign kept: -0 -> 0x8) and modelopt
    (sign from v < 0: -0 -> 0x0) on the spec's special inputs with |x| <= 6:
    each in a block [x, 6, 0, ...] whose scales are exactly 1 (torchao
    without a global scale: s8 = e4m3(6 / 6); modelopt with g = 1:
    s8 = e4m3(6 / 6)), so the element is encoded as given.  (NaN and the
    saturating lanes are covered by the vectors above and the references.)"""
    fe = VEC["fp4_encode"]
    x = inp(fe["x"]).reshape(-1)
    lanes = np.nonzero(np.abs(x) <= 6)[0]
    rows = np.zeros((lanes.size, 16), np.float32)
    rows[:, 0] = x[lanes]
    rows[:, 1] = 6
    for recipe, g, key in (("torchao", None, "torchao_f32_to_f4_unpacked"),
                           ("modelopt", np.float32(1), "modelopt__cast_fp4")):
        q, s, _ = qc.nvfp4_quantize(rows, g, recipe=recipe)
        assert (qc.fp8_decode(s, "e4m3fn") == 1).all()
        assert np.array_equal(unpack_rows(q, 16)[:, 0], np.array(fe[key])[lanes]), recipe


# --------------------------------------------------------- the log2 tables
def test_log2_tables_at_their_boundaries():
    """floor / ceil of torch's float32 log2 (§4.2) through floor_log2 and
    rceil scale codes, at both sides of every binade's threshold (the
    float64-log2 reference decides) and against the spec's tables."""
    t = VEC["log2_rounding_tables"]
    vals = []
    for e in range(-127, 128):
        for f in (0, 1, 2, 5, 11, 22, 23, 44, 45, (1 << 23) - 45, (1 << 23) - 44,
                  (1 << 23) - 23, (1 << 23) - 22, (1 << 23) - 11, (1 << 23) - 5,
                  (1 << 23) - 2, (1 << 23) - 1):
            bits = ((e + 127) << 23 | f) if e > -127 else (f >> 1 | 1 << 22)
            vals.append(bits)
    v = np.array(vals, np.uint32).view(np.float32)
    assert t["matches_rn32_of_float64_log2"]  # the reference's float64 log2 is the tables
    # int8 (emax 0): the floor_log2 code is floor(L(amax)) + 127 directly
    x = np.zeros((v.size, 32), np.float32)
    x[:, 0] = v
    s, _ = qc.mx_quantize(x, "int8", scale_mode="floor_log2")
    assert np.array_equal(ints(s), ref_mx_scale(v, "int8", "floor_log2"))
    for elem in ("e4m3", "e2m1", "int8"):
        # amax with f32(amax / max_elem) = v where one exists (rceil's d at
        # the thresholds), else the nearest
        emax_v = np.float32(mx_elem_max(elem))
        with np.errstate(over="ignore"):
            am0 = (v.astype(np.float64) * float(emax_v)).astype(np.float32)
        am = am0.copy()
        for k in (-2, -1, 1, 2):
            cand = (am0.view(np.uint32).astype(np.int64) + k).astype(np.uint32).view(np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                hit = (cand / emax_v == v) & (am / emax_v != v) & np.isfinite(cand)
            am = np.where(hit, cand, am)
        am = np.where(np.isfinite(am), am, 0).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            assert (am / emax_v == v).mean() > 0.8
        xe = np.zeros((v.size, 32), np.float32)
        xe[:, 0] = am
        for mode in ("rceil", "rceil_exact", "floor", "ceil", "even"):
            s, _ = qc.mx_quantize(xe, elem, scale_mode=mode)
            assert np.array_equal(ints(s), ref_mx_scale(am, elem, mode)), (elem, mode)


def mx_elem_max(elem):
    return {"e4m3": 448.0, "e5m2": 57344.0, "e2m3": 7.5, "e3m2": 28.0, "e2m1": 6.0,
            "int8": 127 / 64}[elem]


# ------------------------------------------------- random vs the reference
def _check_mx(x, elem, mode, rounding, compat, bs, axis=-1, int8_min=-127):
    kw = dict(block_size=bs, scale_mode=mode, elem_rounding=rounding, compat=compat, axis=axis)
    if elem == "int8":
        kw["int8_min"] = int8_min
    s, q = qc.mx_quantize(x, elem, **kw)
    y = qc.mx_fake_quant(x, elem, **kw)
    x2 = np.moveaxis(x, axis, -1)
    shp = x2.shape
    x2 = x2.reshape(-1, shp[-1])
    code, r, y_ref = ref_mx_fake_quant(x2, elem, bs, mode, rounding == "half_away", compat,
                                       int8_min)
    assert np.array_equal(ints(np.moveaxis(s, axis, -1)), code.reshape(-1))
    assert_bits_equal(np.moveaxis(y, axis, -1).reshape(x2.shape), y_ref)
    qm = np.moveaxis(q, axis, -1)
    qm = qm.reshape(-1, qm.shape[-1])
    got = unpack_rows(qm, shp[-1]) if elem == "e2m1" else qm.astype(np.int64) & 0xFF
    assert np.array_equal(got, ref_mx_codes(r, elem, compat))
    length = shp[-1] if elem == "e2m1" else None
    assert_bits_equal(qc.mx_dequantize(s, q, elem, block_size=bs, axis=axis, length=length),
                      y + zero_of(elem))


_F32_ANY = st.floats(width=32, allow_nan=True, allow_infinity=True)
_F32_SMALL = st.floats(min_value=-1e4, max_value=1e4, width=32)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), elem=st.sampled_from(sorted(mx.MX_ELEMENTS)),
       mode=st.sampled_from(MODES), rounding=st.sampled_from(["rne", "half_away"]),
       bs=st.sampled_from([1, 3, 16, 32]))
def test_mx_random_vs_reference(data, elem, mode, rounding, bs):
    """Random shapes (ragged last blocks), values (every float32 incl.
    NaN / Inf / subnormals, or a narrow range with block-scaled magnitudes),
    element types, scale modes and roundings vs the float64 reference."""
    k = data.draw(st.integers(1, 70))
    rows = data.draw(st.integers(1, 3))
    elems = data.draw(st.sampled_from([_F32_ANY, _F32_SMALL]))
    x = data.draw(hnp.arrays(np.float32, (rows, k), elements=elems))
    with np.errstate(over="ignore"):
        x = x * np.float32(2.0) ** np.float32(data.draw(st.integers(-140, 100)))
    _check_mx(x, elem, mode, rounding, None, bs)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), elem=st.sampled_from(["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"]),
       mode=st.sampled_from(["floor", "ceil", "even", "rceil"]))
def test_mx_torchao_random_vs_reference(data, elem, mode):
    x = data.draw(hnp.arrays(np.float32, (2, 40), elements=_F32_ANY))
    with np.errstate(over="ignore"):
        x = x * np.float32(2.0) ** np.float32(data.draw(st.integers(-140, 10)))
    _check_mx(x, elem, mode, "rne", "torchao", 32)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), elem=st.sampled_from(sorted(mx.MX_ELEMENTS)),
       rounding=st.sampled_from(["rne", "half_away"]))
def test_mx_microxcaling_random_vs_reference(data, elem, rounding):
    x = data.draw(hnp.arrays(np.float32, (2, 33), elements=_F32_ANY))
    _check_mx(x, elem, "floor_log2", rounding, "microxcaling", 32)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), recipe=st.sampled_from(["modelopt", "torchao"]))
def test_nvfp4_random_vs_reference(data, recipe):
    k = data.draw(st.integers(1, 50))
    elems = data.draw(st.sampled_from([_F32_ANY, _F32_SMALL]))
    x = data.draw(hnp.arrays(np.float32, (2, k), elements=elems))
    g = data.draw(st.sampled_from([None, "pos"]))
    if g == "pos":
        g = np.float32(data.draw(st.floats(2.0 ** -20, 16.0, width=32)))
    s_ref, c_ref, y_ref = ref_nvfp4(x, g, recipe)
    q, s, g_out = qc.nvfp4_quantize(x, g, recipe=recipe)
    assert np.array_equal(ints(s), s_ref.reshape(-1))
    assert np.array_equal(unpack_rows(q, k), c_ref)
    assert_bits_equal(qc.nvfp4_fake_quant(x, g, recipe=recipe), y_ref)
    assert_bits_equal(qc.nvfp4_dequantize(q, s, g_out, recipe=recipe, length=k), y_ref)


# ---------------------------------------------------------- special blocks
def test_nvfp4_modelopt_keeps_the_sign_of_a_negative_code_times_zero():
    """modelopt's +0 is the code 0x8's value only: a negative code times a
    zero factor stays -0 (hypothesis found a block of -6.7e-44, whose
    global scale underflows to 0; the dequantize once made it +0)."""
    x = np.full((2, 1), -6.7e-44, np.float32)
    s_ref, c_ref, y_ref = ref_nvfp4(x, None, "modelopt")
    q, s, g = qc.nvfp4_quantize(x, recipe="modelopt")
    assert g == 0 and (c_ref == 15).all() and np.signbit(y_ref).all()
    assert_bits_equal(qc.nvfp4_dequantize(q, s, g, recipe="modelopt", length=1), y_ref)
    zero_code = np.array([[0x88]], np.uint8)  # two 0x8 codes: +0 for modelopt, -0 for torchao
    one = np.array([[0x38]], np.uint8)  # e4m3 1.0
    assert not np.signbit(qc.nvfp4_dequantize(zero_code, one, recipe="modelopt")).any()
    assert np.signbit(qc.nvfp4_dequantize(zero_code, one, recipe="torchao")).all()


def test_special_blocks():
    """NaN / Inf inside a block, an all-zero block (-0 kept), a subnormal
    amax, per recipe (spec §4.5)."""
    x = np.zeros((4, 32), np.float32)
    x[0, :] = np.linspace(-1, 1, 32)
    x[0, 3] = np.nan
    x[1, :] = np.linspace(-1, 1, 32)
    x[1, 5] = -np.inf
    x[2, 7] = -0.0
    x[3, :16] = np.float32(2.0 ** -136) * np.arange(0, 32, 2)  # amax 30 * 2**-136
    s, q = qc.mx_quantize(x, "e4m3")
    assert s[0, 0] == 255 and s[1, 0] == 128 - 8 + 127 and s[2, 0] == 0 and s[3, 0] == 0
    y = qc.mx_fake_quant(x, "e4m3")
    assert np.isnan(y[0]).all()
    # the Inf element saturates to -448 (code 0xFE), times 2**120: -Inf in float32
    assert q[1, 5] == 0xFE and y[1, 5] == -np.inf and (y[1, np.arange(32) != 5] == 0).all()
    assert q[2, 7] == 0x80 and (q[2] & 0x7F == 0).all()
    assert_bits_equal(y[3], x[3])  # subnormal amax: exact 2**-127 scaling (no torchao halving)
    y_ao = qc.mx_fake_quant(x, "e4m3", compat="torchao")
    assert_bits_equal(y_ao[3], (x[3] / 2).astype(np.float32))  # torchao: halved
    assert_bits_equal(y_ao, ref_mx_fake_quant(x, "e4m3", compat="torchao")[2])
    y_mxs = qc.mx_fake_quant(x, "e4m3", compat="microxcaling")
    assert np.isnan(y_mxs[1]).all()  # microxcaling: an Inf block is NaN
    assert y_mxs[2, 7].view(np.uint32) == 0  # and -0 -> +0
    q4, s4, g = qc.nvfp4_quantize(x, recipe="modelopt")
    assert np.isnan(g)  # (the tensor holds a NaN)
    q4, s4, _ = qc.nvfp4_quantize(np.zeros((1, 16), np.float32), None, recipe="torchao")
    assert s4[0, 0] == 0x08  # all-zero block: s8 = 2**-6


def test_any_axis_and_ragged_blocks():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 37, 3)) * 4).astype(np.float32)
    for axis in (0, 1, 2, -2):
        _check_mx(x, "e2m1", "floor", "rne", None, 8, axis=axis)
        _check_mx(x, "int8", "rceil_exact", "half_away", None, 32, axis=axis, int8_min=-128)
    s, q = qc.mx_quantize(x, "e2m1", axis=1, block_size=8)
    assert s.shape == (5, 5, 3) and q.shape == (5, 19, 3)


def test_dtypes_and_empty():
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    y = qc.mx_fake_quant(x, "e3m2")
    assert_bits_equal(qc.mx_fake_quant(x.astype(np.float16), "e3m2"), y)
    assert_bits_equal(qc.mx_fake_quant(x.astype(np.float64), "e3m2"), y)
    assert_bits_equal(qc.mx_fake_quant(x.astype(ml_dtypes.bfloat16), "e3m2"),
                      qc.mx_fake_quant(x.astype(ml_dtypes.bfloat16).astype(np.float32), "e3m2"))
    s, q = qc.mx_quantize(np.zeros((0, 32), np.float32), "e4m3")
    assert s.shape == (0, 1) and q.shape == (0, 32)


def test_bad_arguments():
    x = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="elem must be one of"):
        qc.mx_quantize(x, "e4m4")
    with pytest.raises(ValueError, match="scale_mode must be one of"):
        qc.mx_quantize(x, "e4m3", scale_mode="round")
    with pytest.raises(ValueError, match="elem_rounding"):
        qc.mx_fake_quant(x, "e4m3", elem_rounding="down")
    with pytest.raises(ValueError, match="compat must be one of"):
        qc.mx_quantize(x, "e4m3", compat="modelopt")
    with pytest.raises(ValueError, match="no int8 elements"):
        qc.mx_quantize(x, "int8", compat="torchao")
    with pytest.raises(ValueError, match="floor_log2"):
        qc.mx_quantize(x, "e4m3", compat="microxcaling", scale_mode="floor")
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        qc.mx_quantize(x, "e4m3", block_size=0)
    with pytest.raises(ValueError, match="at least one dimension"):
        qc.mx_quantize(np.float32(1), "e4m3")
    with pytest.raises(ValueError, match="int8_min"):
        qc.mx_quantize(x, "int8", int8_min=-129)
    s, q = qc.mx_quantize(x, "e2m1")
    with pytest.raises(ValueError, match="blocks of 32"):
        qc.mx_dequantize(s[:, :0], q, "e2m1")
    with pytest.raises(TypeError, match="one byte each"):
        qc.mx_dequantize(s, q.astype(np.int16), "e2m1")
    with pytest.raises(ValueError, match="recipe must be one of"):
        qc.nvfp4_quantize(x, recipe="cutlass")
    with pytest.raises(ValueError, match="global_scale must be one value"):
        qc.nvfp4_fake_quant(x, np.ones(2, np.float32))


def test_ids_match_the_header():
    """The Python mirrors of qc_mx.h's ids and mode bits."""
    path = os.path.join(os.path.dirname(qc.__file__), "include", "qc_mx.h")
    text = open(path, encoding="utf-8").read()
    defs = {k: int(v) for k, v in re.findall(r"#define (QC_\w+) (\d+)", text)}
    assert {k[len("QC_MX_"):].lower(): v for k, v in defs.items()
            if k[len("QC_MX_"):].lower() in mx.MX_SCALE_MODES} == mx.MX_SCALE_MODES
    assert (defs["QC_MX_HALF_AWAY"], defs["QC_MX_TORCHAO"], defs["QC_MX_MXS"],
            defs["QC_MX_INT8_FULL"]) == (mx.MX_HALF_AWAY, mx.MX_TORCHAO, mx.MX_MXS,
                                          mx.MX_INT8_FULL)
    assert (defs["QC_NV_TORCHAO"], defs["QC_NV_NO_GLOBAL"]) == (mx.NV_TORCHAO, mx.NV_NO_GLOBAL)
    from quantcore import formats as F
    # int8 takes the first id after the minifloats' (qc_formats.h's count)
    assert re.search(r"#define QC_MX_INT8 QC_FMT_COUNT\b", text)
    assert mx.MX_ELEMENTS["int8"] == F._common.FMT_COUNT
    assert all(mx.MX_ELEMENTS[e] == i for e, i in (("e4m3", 0), ("e5m2", 1)))
    assert F.FP8_FORMATS["e4m3fn"] == 0 and F.FP8_FORMATS["e5m2"] == 1


@pytest.mark.skipif(not K.simd_v3_built(), reason="no AVX2 build on this platform")
def test_both_cpu_builds_give_the_same_bits():
    """The baseline (x86-64-v2) and AVX2 builds of the block driver agree on
    every element type, rounding, compat mode and NVFP4 recipe (the rest of
    the file runs on the build the machine selects)."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 2 ** 32, (8, 100), dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, (rng.standard_normal((8, 100)) * 3).astype(np.float32)])
    calls = [lambda e=e, kw=kw: qc.mx_fake_quant(x, e, **kw)
             for e in sorted(mx.MX_ELEMENTS)
             for kw in (dict(), dict(elem_rounding="half_away", scale_mode="rceil"),
                        dict(compat="microxcaling"))] + \
        [lambda e=e: qc.mx_quantize(x, e, compat="torchao", scale_mode="even")[1]
         for e in ("e4m3", "e2m1")] + \
        [lambda r=r: qc.nvfp4_fake_quant(np.nan_to_num(x), recipe=r)
         for r in ("modelopt", "torchao")]
    original = K.simd_variant() != "baseline"
    if K.select_simd(True) == "baseline":
        K.select_simd(original)
        pytest.skip("this CPU has no AVX2 + FMA")
    try:
        results = []
        for allow in (False, True):
            K.select_simd(allow)
            results.append([c() for c in calls])
    finally:
        K.select_simd(original)
    for a, b in zip(*results):
        assert_bits_equal(a, b)


def test_out_argument():
    """out= of the fake quants: written in place along the last axis, copied
    for another axis, x itself allowed; a wrong dtype / shape is refused."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((6, 48)) * 3).astype(np.float32)
    want = qc.mx_fake_quant(x, "e2m1")
    out = np.empty_like(x)
    assert qc.mx_fake_quant(x, "e2m1", out=out) is out
    assert_bits_equal(out, want)
    out0 = np.empty_like(x)
    assert qc.mx_fake_quant(x, "e5m2", axis=0, block_size=4, out=out0) is out0
    assert_bits_equal(out0, qc.mx_fake_quant(x, "e5m2", axis=0, block_size=4))
    xc = x.copy()
    assert qc.nvfp4_fake_quant(xc, np.float32(0.01), out=xc) is xc
    assert_bits_equal(xc, qc.nvfp4_fake_quant(x, np.float32(0.01)))
    with pytest.raises(TypeError, match="dtype"):
        qc.mx_fake_quant(x, "e2m1", out=np.empty(x.shape, np.float64))
    with pytest.raises(ValueError, match="shape"):
        qc.nvfp4_fake_quant(x, out=np.empty((6, 47), np.float32))


@pytest.mark.parametrize("elem", sorted(mx.MX_ELEMENTS))
def test_ties_on_every_element_grid(elem):
    """Every midpoint between neighbouring values of the element grid (and
    its negative), in a block whose scale is 1 (amax pinned to 2**emax), for
    both roundings vs the reference: ties to even and ties away from zero
    must differ on them (random input hardly ever holds a tie)."""
    from reference import MX_ELEMS
    _, mbits, _, vmax, emax = MX_ELEMS[elem]
    if elem == "int8":
        grid = np.arange(0, 128) / 64.0
    else:
        dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
              "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
              "e2m1": ml_dtypes.float4_e2m1fn}[elem]
        vals = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)))
        grid = vals[np.isfinite(vals) & (vals <= vmax)]
    mid = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)
    mid = mid[mid < 2.0 ** emax]  # (below the pinned amax)
    row = np.concatenate([[2.0 ** emax], mid, -mid]).astype(np.float32)[None, :]
    results = {}
    for rounding in ("rne", "half_away"):
        y = qc.mx_fake_quant(row, elem, block_size=row.shape[1], elem_rounding=rounding)
        code, _, y_ref = ref_mx_fake_quant(row, elem, row.shape[1], "floor",
                                           rounding == "half_away")
        assert code[0, 0] == 127
        assert_bits_equal(y, y_ref)
        results[rounding] = y
    assert not np.array_equal(results["rne"], results["half_away"])
