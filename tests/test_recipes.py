"""Every core recipe against the float64 reference in tests/reference.py,
bit for bit, on hypothesis-generated inputs (ties, out-of-range values, NaN,
+-inf, -0.0, empty and 0-d arrays, float16/32/64, any channel axis, and any
memory layout: C, Fortran, strided, negative strides, unaligned).

One test per recipe: the affine family once per mode (rounding x where the
zero point goes x multiply-or-divide) per tensor and per channel, the
nudged family once per formula and layout, and so on.  Each runs
``RECIPE_EXAMPLES`` (500 under ``make test``; ``QC_HYPOTHESIS_EXAMPLES``
sets it: more for a deep run, fewer for a quick one) valid examples, and
asserts that it did.
"""
import itertools
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import quantcore as qc
from quantcore import ops
from quantcore.qparams import nudge_mindspore, nudge_tensorflow

from reference import RECIPE_EXAMPLES
import reference as ref

DTYPES = [np.float32, np.float64, np.float16]
RANGES = [(0, 255), (-128, 127), (-127, 127), (0, 15), (-8, 7), (-32768, 32767), (0, 1),
          (1, 255), (-2 ** 31, 2 ** 31 - 1)]
#: every rounding mode (the extension's table, qc_elementwise.h QC_ROUNDING_MODES)
ROUNDINGS = list(ops.ROUNDING)
# "after_rounding": integer zero point added to round(v); "before_rounding":
# float zero point added before rounding; "none": symmetric, no zero point
ZERO_POINT_ADDS = ["after_rounding", "before_rounding", "none"]
SCALE_OPS = ["mul_inverse", "div"]
AFFINE_MODES = list(itertools.product(ROUNDINGS, ZERO_POINT_ADDS, SCALE_OPS))

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


def run_examples(strategy, check):
    """Run ``check`` on RECIPE_EXAMPLES hypothesis examples of ``strategy``
    and return how many examples actually ran (each test asserts it)."""
    count = [0]

    @settings(max_examples=RECIPE_EXAMPLES)
    @given(strategy)
    def run(case):
        check(case)
        count[0] += 1

    run()
    return count[0]


def assert_ran(n):
    assert n >= RECIPE_EXAMPLES, f"only {n} of {RECIPE_EXAMPLES} examples ran"


@st.composite
def shapes(draw, min_dims=0):
    ndim = draw(st.integers(min_dims, 4))
    return tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))


@st.composite
def float_arrays(draw, shape, dtype):
    x = draw(arrays(np.float64, shape, elements=values))
    with np.errstate(over="ignore"):
        return draw(layouts(x.astype(dtype)))


LAYOUTS = ["C", "F", "step2", "reversed", "unaligned"]


@st.composite
def layouts(draw, x):
    """The same values in another memory layout: C order, Fortran order, a
    step-2 view, a view with negative strides, or an unaligned buffer."""
    kind = draw(st.sampled_from(LAYOUTS))
    if x.ndim == 0 or kind == "C":
        return x
    if kind == "F":
        return np.asfortranarray(x)
    if kind == "step2":
        return np.repeat(x, 2, axis=-1)[..., ::2]
    if kind == "reversed":
        return np.flip(np.flip(x).copy())
    buf = np.zeros(x.nbytes + 1, np.uint8)
    y = np.frombuffer(buf.data, x.dtype, x.size, offset=1).reshape(x.shape)
    y[...] = x
    return y


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
def per_tensor_param(draw, value):
    """A per-tensor parameter in one of the forms the API accepts."""
    form = draw(st.sampled_from(["float", "np64", "np32", "0d", "list"]))
    if form == "float":
        return float(value)
    if form == "np64":
        return np.float64(value)
    if form == "np32" and float(np.float32(value)) == float(value):
        return np.float32(value)
    if form == "0d":
        return np.array(value)
    return [float(value)]


@st.composite
def affine_cases(draw, per_channel, zp_add, qrange=None):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(shapes(min_dims=1 if per_channel else 0))
    axis = draw(st.integers(0, len(shape) - 1)) if per_channel else None
    C = shape[axis] if per_channel else 1
    qmin, qmax = qrange or draw(st.sampled_from(RANGES))
    scale = np.array(draw(st.lists(scales, min_size=C, max_size=C)), np.float64)
    if zp_add == "none":
        zp = np.zeros(C)
    elif zp_add == "after_rounding":
        lo, hi = max(qmin, -300), min(qmax, 300)
        zp = np.array(draw(st.lists(st.integers(lo, hi), min_size=C, max_size=C)), np.float64)
    else:
        zp = np.array(draw(st.lists(st.floats(-300, 300, width=32), min_size=C, max_size=C)),
                      np.float64)
    x = draw(float_arrays(shape, dtype))
    if per_channel:
        args = (scale, zp)
    else:
        args = (draw(per_tensor_param(scale[0])), draw(per_tensor_param(zp[0])))
    return x, scale, zp, args, qmin, qmax, axis


def check_affine(case, opts):
    x, scale, zp, args, qmin, qmax, axis = case
    out, mask = qc.fake_quant_with_mask(x, *args, qmin, qmax, axis=axis, **opts)
    exp, exp_mask = ref.affine(x.astype(np.float64), broadcast(scale, x.shape, axis),
                               broadcast(zp, x.shape, axis), qmin, qmax, dtype=x.dtype, **opts)
    ref.assert_bits_equal(out, expected_dtype_result(exp, x.dtype), str(opts))
    assert mask.dtype == np.bool_ and np.array_equal(mask, exp_mask)
    plain = qc.fake_quant(x, *args, qmin, qmax, axis=axis, **opts)
    ref.assert_bits_equal(plain, out)


def affine_test(per_channel, rounding, zero_point_add, scale_op):
    strategy = st.tuples(affine_cases(per_channel, zero_point_add),
                         st.sampled_from(["propagate", "nan_to_qmin", "int64"]))

    def check(case):
        check_affine(case[0], dict(rounding=rounding, zero_point_add=zero_point_add,
                                   scale_op=scale_op, nonfinite=case[1]))

    assert_ran(run_examples(strategy, check))


@pytest.mark.parametrize("rounding,zero_point_add,scale_op", AFFINE_MODES)
def test_affine_per_tensor(rounding, zero_point_add, scale_op):
    affine_test(False, rounding, zero_point_add, scale_op)


@pytest.mark.parametrize("rounding,zero_point_add,scale_op", AFFINE_MODES)
def test_affine_per_channel(rounding, zero_point_add, scale_op):
    affine_test(True, rounding, zero_point_add, scale_op)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_quantize(rounding):
    """quantize: the same q as fake_quant, NaN -> quant_min, as integers;
    dequantize(quantize(x)) == fake_quant(x) where q is exact in float32."""
    strategy = st.sampled_from(ZERO_POINT_ADDS).flatmap(lambda zpa: st.tuples(
        st.just(zpa), st.sampled_from(SCALE_OPS), st.booleans().flatmap(
            lambda pc: affine_cases(pc, zpa))))

    def check(case):
        zpa, scale_op, (x, scale, zp, args, qmin, qmax, axis) = case
        opts = dict(rounding=rounding, zero_point_add=zpa, scale_op=scale_op)
        q = qc.quantize(x, *args, qmin, qmax, axis=axis, **opts)
        exp_q, _ = ref.affine(x.astype(np.float64), broadcast(scale, x.shape, axis),
                              broadcast(zp, x.shape, axis), qmin, qmax, dtype=x.dtype,
                              nonfinite="nan_to_qmin", output_q=True, **opts)
        assert q.dtype.kind in "iu" and q.shape == x.shape
        info = np.iinfo(q.dtype)
        assert info.min <= qmin and qmax <= info.max
        assert np.array_equal(q, np.clip(exp_q, qmin, qmax).astype(q.dtype))
        if x.dtype == np.float32 and zpa == "after_rounding" and qmax - qmin < 2 ** 24:
            fq = qc.fake_quant(x, *args, qmin, qmax, axis=axis, nonfinite="nan_to_qmin", **opts)
            ref.assert_bits_equal(qc.dequantize(q, *args, axis=axis), fq)

    assert_ran(run_examples(strategy, check))


@st.composite
def dequantize_cases(draw):
    per_channel = draw(st.booleans())
    shape = draw(shapes(min_dims=1 if per_channel else 0))
    axis = draw(st.integers(0, len(shape) - 1)) if per_channel else None
    C = shape[axis] if per_channel else 1
    qmin, qmax = draw(st.sampled_from(RANGES))
    int_dtype = draw(st.sampled_from([np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                      np.int64]).filter(
        lambda d: np.iinfo(d).min <= qmin and qmax <= np.iinfo(d).max))
    q = draw(arrays(int_dtype, shape, elements=st.integers(qmin, qmax)))
    scale = np.array(draw(st.lists(scales, min_size=C, max_size=C)), np.float64)
    zp = np.array(draw(st.lists(st.one_of(st.integers(-300, 300).map(float),
                                          st.floats(-300, 300, width=32)),
                                min_size=C, max_size=C)), np.float64)
    dtype = draw(st.sampled_from(DTYPES))
    return q, scale, zp, axis, dtype


def test_dequantize():
    """``(q - zero_point) * scale`` in the requested dtype, one rounding per
    operation (float16 arithmetic is exactly float32-then-round)."""
    def check(case):
        q, scale, zp, axis, dtype = case
        args = (scale, zp) if axis is not None else (scale[0], zp[0])
        with np.errstate(over="ignore"):   # int32 values beyond float16
            out = qc.dequantize(q, *args, axis=axis, dtype=dtype)

        def rnd(a):
            with np.errstate(over="ignore"):
                return np.asarray(a, np.float64).astype(dtype).astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            exp = rnd(rnd(rnd(q.astype(np.float64)) - rnd(broadcast(zp, q.shape, axis)))
                      * rnd(broadcast(scale, q.shape, axis)))
        ref.assert_bits_equal(out, expected_dtype_result(exp, dtype))

    assert_ran(run_examples(dequantize_cases(), check))


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
    scale_op = draw(st.sampled_from(SCALE_OPS))
    dtype = draw(st.sampled_from(DTYPES))
    x = draw(float_arrays(shape, dtype))
    return x, mins, maxs, qmin, qmax, axis, scale_op


def check_nudged(case, formula):
    x, mins, maxs, qmin, qmax, axis, scale_op = case
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


@pytest.mark.parametrize("formula", ["tensorflow", "mindspore"])
def test_nudged_per_tensor(formula):
    assert_ran(run_examples(nudged_cases(per_channel=False), lambda c: check_nudged(c, formula)))


@pytest.mark.parametrize("formula", ["tensorflow", "mindspore"])
def test_nudged_per_channel(formula):
    assert_ran(run_examples(nudged_cases(per_channel=True), lambda c: check_nudged(c, formula)))


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


def check_amax(case):
    x, amax, num_bits, unsigned, narrow, axis = case
    out, mask = qc.fake_quant_amax(x, amax if axis is not None else amax[0], num_bits,
                                   unsigned=unsigned, narrow_range=narrow, axis=axis,
                                   return_mask=True)
    exp, exp_mask = ref.amax_fq(x.astype(np.float64), broadcast(amax, x.shape, axis), num_bits,
                                unsigned, narrow, dtype=x.dtype)
    ref.assert_bits_equal(out, expected_dtype_result(exp, x.dtype))
    assert np.array_equal(mask, exp_mask)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_amax(per_channel):
    assert_ran(run_examples(amax_cases(per_channel), check_amax))


def check_minmax(case):
    x, axis, nan_policy = case
    lo, hi = qc.minmax(x, axis=axis, nan_policy=nan_policy)
    elo, ehi = ref.minmax(x, axis=axis, nan_policy=nan_policy)
    ref.assert_bits_equal(lo, elo, "min")
    ref.assert_bits_equal(hi, ehi, "max")


def test_minmax_per_tensor():
    strategy = st.sampled_from(DTYPES).flatmap(lambda dt: shapes().flatmap(
        lambda shp: st.tuples(float_arrays(shp, dt), st.none(),
                              st.sampled_from(["propagate", "omit"]))))
    assert_ran(run_examples(strategy, check_minmax))


def test_minmax_per_channel():
    strategy = st.sampled_from(DTYPES).flatmap(lambda dt: shapes(min_dims=1).flatmap(
        lambda shp: st.tuples(float_arrays(shp, dt), st.integers(0, len(shp) - 1),
                              st.sampled_from(["propagate", "omit"]))))
    assert_ran(run_examples(strategy, check_minmax))


def test_ste_backward():
    strategy = st.sampled_from(DTYPES).flatmap(lambda dt: shapes().flatmap(
        lambda shp: st.tuples(float_arrays(shp, dt), arrays(np.bool_, shp),
                              st.sampled_from(["bool", "uint8", "packed"]))))

    def check(case):
        g, mask, form = case
        m = {"bool": mask, "uint8": mask.astype(np.uint8),
             "packed": np.packbits(mask.ravel(), bitorder="little")}[form]
        out = qc.ste_backward(g, m)
        with np.errstate(invalid="ignore"):
            exp = (g.astype(np.float64) * mask).astype(g.dtype)
        ref.assert_bits_equal(out, exp)

    assert_ran(run_examples(strategy, check))


def test_rounding_lists_are_the_header_table():
    """One list of rounding modes (qc_elementwise.h QC_ROUNDING_MODES, as
    the extension exports it): ops, the CLI's --rounding choices and this
    file's parameters are it, and every mode has a float64 reference."""
    import re
    from quantcore import cli, cli_calibrate
    from quantcore._cpu import _kernels as K
    text = open(os.path.join(os.path.dirname(qc.__file__), "include",
                             "qc_elementwise.h")).read()
    block = text[text.index("#define QC_ROUNDING_MODES(X)"):]
    block = block[:block.index("\n\n")]
    assert [n for n, _ in re.findall(r"X\((\w+), (\w+)\)", block)] == list(K.ROUNDING_MODES)
    assert ops.ROUNDING == K.ROUNDING_MODES and list(ops.ROUNDING) == ROUNDINGS
    assert cli_calibrate.ROUNDING == tuple(ops.ROUNDING)
    action = [a for a in cli.build_parser()._subparsers._group_actions[0].choices[
        "calibrate"]._actions if a.dest == "rounding"][0]
    assert tuple(action.choices) == tuple(ops.ROUNDING)
    v = np.array([-2.5, -0.5, 0.5, 1.5], np.float64)
    for r in ops.ROUNDING:
        want = ref.round_value(v, r, lambda a: a)
        got = qc.fake_quant(v, 1.0, 0, -128, 127, rounding=r)
        assert np.array_equal(got, want), r
