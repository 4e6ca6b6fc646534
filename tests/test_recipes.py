"""Every core recipe against the float64 reference in tests/reference.py,
bit for bit, on hypothesis-generated inputs (ties, out-of-range values, NaN,
+-inf, -0.0, empty and 0-d arrays, float16/32/64, any channel axis)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import quantcore as qc
from quantcore.qparams import nudge_mindspore, nudge_tensorflow

from reference import RECIPE_EXAMPLES
import reference as ref

DTYPES = [np.float32, np.float64, np.float16]
RANGES = [(0, 255), (-128, 127), (-127, 127), (0, 15), (-8, 7), (-32768, 32767), (0, 1),
          (1, 255), (-2 ** 31, 2 ** 31 - 1)]

special = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 0.5, -0.5, 1.5, -2.5, 1e30,
                           -1e30, 3.4e38])
values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.integers(-1200, 1200).map(lambda k: k / 2.0),   # ties for power-of-two scales
    st.integers(-1200, 1200).map(lambda k: k / 8.0),
    special,
)
scales = st.one_of(st.sampled_from([1.0, 0.5, 0.25, 2.0, 0.1, 1 / 3]),
                   st.floats(2.0 ** -10, 100.0, width=32))


@st.composite
def shapes(draw, min_dims=0):
    ndim = draw(st.integers(min_dims, 4))
    return tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))


@st.composite
def float_arrays(draw, shape, dtype):
    x = draw(arrays(np.float64, shape, elements=values))
    with np.errstate(over="ignore"):
        return x.astype(dtype)


def broadcast(param, shape, axis):
    if axis is None:
        return np.float64(param[0])
    s = [1] * len(shape)
    s[axis] = -1
    return np.asarray(param, np.float64).reshape(s)


def expected_dtype_result(res, dtype):
    with np.errstate(over="ignore"):
        return res.astype(dtype)


@st.composite
def affine_cases(draw, per_channel):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(shapes(min_dims=1 if per_channel else 0))
    axis = draw(st.integers(0, len(shape) - 1)) if per_channel else None
    C = shape[axis] if per_channel else 1
    qmin, qmax = draw(st.sampled_from(RANGES))
    zp_add = draw(st.sampled_from(["after_rounding", "before_rounding", "none"]))
    scale = np.array(draw(st.lists(scales, min_size=C, max_size=C)), np.float64)
    if zp_add == "none":
        zp = np.zeros(C)
    elif zp_add == "after_rounding":
        lo, hi = max(qmin, -300), min(qmax, 300)
        zp = np.array(draw(st.lists(st.integers(lo, hi), min_size=C, max_size=C)), np.float64)
    else:
        zp = np.array(draw(st.lists(st.floats(-300, 300, width=32), min_size=C, max_size=C)),
                      np.float64)
    opts = dict(
        rounding=draw(st.sampled_from(["half_even", "half_up", "half_away"])),
        zero_point_add=zp_add,
        scale_op=draw(st.sampled_from(["mul_inverse", "div"])),
        nonfinite=draw(st.sampled_from(["propagate", "nan_to_qmin", "int64"])),
    )
    x = draw(float_arrays(shape, dtype))
    return x, scale, zp, qmin, qmax, axis, opts


def check_affine(case):
    x, scale, zp, qmin, qmax, axis, opts = case
    out, mask = qc.fake_quant_with_mask(x, scale if axis is not None else scale[0],
                                        zp if axis is not None else zp[0], qmin, qmax,
                                        axis=axis, **opts)
    exp, exp_mask = ref.affine(x.astype(np.float64), broadcast(scale, x.shape, axis),
                               broadcast(zp, x.shape, axis), qmin, qmax, dtype=x.dtype, **opts)
    ref.assert_bits_equal(out, expected_dtype_result(exp, x.dtype), str(opts))
    assert mask.dtype == np.bool_ and np.array_equal(mask, exp_mask)
    plain = qc.fake_quant(x, scale if axis is not None else scale[0],
                          zp if axis is not None else zp[0], qmin, qmax, axis=axis, **opts)
    ref.assert_bits_equal(plain, out)


@settings(max_examples=RECIPE_EXAMPLES)
@given(affine_cases(per_channel=False))
def test_affine_per_tensor(case):
    check_affine(case)


@settings(max_examples=RECIPE_EXAMPLES)
@given(affine_cases(per_channel=True))
def test_affine_per_channel(case):
    check_affine(case)


@settings(max_examples=RECIPE_EXAMPLES)
@given(affine_cases(per_channel=False))
def test_quantize_dequantize(case):
    x, scale, zp, qmin, qmax, axis, opts = case
    opts = {k: v for k, v in opts.items() if k != "nonfinite"}
    q = qc.quantize(x, scale[0], zp[0], qmin, qmax, **opts)
    exp_q, _ = ref.affine(x.astype(np.float64), scale[0], zp[0], qmin, qmax, dtype=x.dtype,
                          nonfinite="nan_to_qmin", output_q=True, **opts)
    assert q.dtype.kind in "iu"
    assert np.array_equal(q, np.clip(exp_q, qmin, qmax).astype(q.dtype))
    if x.dtype == np.float32 and opts["zero_point_add"] == "after_rounding" and qmax - qmin < 2 ** 24:
        # dequantize(quantize(x)) == fake_quant(x) where the fake quant is finite
        fq = qc.fake_quant(x, scale[0], zp[0], qmin, qmax, nonfinite="nan_to_qmin", **opts)
        ref.assert_bits_equal(qc.dequantize(q, scale[0], zp[0]), fq)


@st.composite
def nudged_cases(draw, per_channel):
    shape = draw(shapes(min_dims=1 if per_channel else 0))
    axis = draw(st.integers(0, len(shape) - 1)) if per_channel else None
    C = shape[axis] if per_channel else 1
    num_bits = draw(st.integers(2, 16))
    narrow = draw(st.booleans())
    qmin, qmax = (1 if narrow else 0), 2 ** num_bits - 1
    mins = np.array(draw(st.lists(st.floats(-10, 0, width=32), min_size=C, max_size=C)))
    spans = np.array(draw(st.lists(st.floats(2.0 ** -7, 20, width=32), min_size=C, max_size=C)))
    maxs = (mins.astype(np.float32) + spans.astype(np.float32)).astype(np.float32)
    formula = draw(st.sampled_from(["tensorflow", "mindspore"]))
    scale_op = draw(st.sampled_from(["mul_inverse", "div"]))
    dtype = draw(st.sampled_from(DTYPES))
    x = draw(float_arrays(shape, dtype))
    return x, mins, maxs, qmin, qmax, axis, formula, scale_op


@settings(max_examples=RECIPE_EXAMPLES)
@given(nudged_cases(per_channel=False))
def test_nudged_per_tensor(case):
    check_nudged(case)


@settings(max_examples=RECIPE_EXAMPLES)
@given(nudged_cases(per_channel=True))
def test_nudged_per_channel(case):
    check_nudged(case)


def check_nudged(case):
    x, mins, maxs, qmin, qmax, axis, formula, scale_op = case
    if formula == "tensorflow":
        nmin, nmax, s, inv, qz = nudge_tensorflow(mins, maxs, qmin, qmax)
    else:
        nmin, nmax, s = nudge_mindspore(mins, maxs, qmin, qmax)
        inv = (np.float32(1) / s).astype(np.float32)
        qz = np.zeros_like(s)
    def arg(a):
        return a if axis is not None else a[0]
    out, mask = qc.fake_quant_nudged(x, arg(nmin), arg(nmax), arg(s), inv_scale=arg(inv),
                                     quant_zero=arg(qz), formula=formula, scale_op=scale_op,
                                     axis=axis, return_mask=True)
    b = [broadcast(a, x.shape, axis) for a in (nmin, nmax, s, inv, qz)]
    exp, exp_mask = ref.nudged(x.astype(np.float64), *b, formula, scale_op, dtype=x.dtype)
    ref.assert_bits_equal(out, expected_dtype_result(exp, x.dtype), f"{formula} {scale_op}")
    assert np.array_equal(mask, exp_mask)


@st.composite
def amax_cases(draw, per_channel):
    shape = draw(shapes(min_dims=1 if per_channel else 0))
    axis = draw(st.integers(0, len(shape) - 1)) if per_channel else None
    C = shape[axis] if per_channel else 1
    amax = np.array(draw(st.lists(st.one_of(st.floats(0, 100, width=32),
                                            st.sampled_from([0.0, 2.0 ** -24, 1e-8, 1.0, 127.0])),
                                  min_size=C, max_size=C)))
    num_bits = draw(st.integers(2, 16))
    unsigned = draw(st.booleans())
    narrow = draw(st.booleans())
    dtype = draw(st.sampled_from(DTYPES))
    x = draw(float_arrays(shape, dtype))
    if unsigned:
        x = np.abs(x)
    return x, amax, num_bits, unsigned, narrow, axis


@settings(max_examples=RECIPE_EXAMPLES)
@given(st.booleans().flatmap(lambda pc: amax_cases(per_channel=pc)))
def test_amax(case):
    x, amax, num_bits, unsigned, narrow, axis = case
    out, mask = qc.fake_quant_amax(x, amax if axis is not None else amax[0], num_bits,
                                   unsigned=unsigned, narrow_range=narrow, axis=axis,
                                   return_mask=True)
    exp, exp_mask = ref.amax_fq(x.astype(np.float64), broadcast(amax, x.shape, axis), num_bits,
                                unsigned, narrow, dtype=x.dtype)
    ref.assert_bits_equal(out, expected_dtype_result(exp, x.dtype))
    assert np.array_equal(mask, exp_mask)


@settings(max_examples=RECIPE_EXAMPLES)
@given(st.sampled_from(DTYPES).flatmap(lambda dt: shapes().flatmap(
    lambda shp: st.tuples(float_arrays(shp, dt),
                          st.none() if len(shp) == 0 else st.integers(0, len(shp) - 1),
                          st.sampled_from(["propagate", "omit"])))))
def test_minmax(case):
    x, axis, nan_policy = case
    lo, hi = qc.minmax(x, axis=axis, nan_policy=nan_policy)
    elo, ehi = ref.minmax(x, axis=axis, nan_policy=nan_policy)
    ref.assert_bits_equal(lo, elo, "min")
    ref.assert_bits_equal(hi, ehi, "max")


@settings(max_examples=RECIPE_EXAMPLES)
@given(st.sampled_from(DTYPES).flatmap(lambda dt: shapes().flatmap(
    lambda shp: st.tuples(float_arrays(shp, dt), arrays(np.bool_, shp), st.booleans()))))
def test_ste_backward(case):
    g, mask, packed = case
    m = np.packbits(mask.ravel(), bitorder="little") if packed else mask
    out = qc.ste_backward(g, m)
    with np.errstate(invalid="ignore"):
        exp = (g.astype(np.float64) * mask).astype(g.dtype)
    ref.assert_bits_equal(out, exp)
