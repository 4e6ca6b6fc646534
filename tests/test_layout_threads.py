"""Same bits with 1 and 2 threads, for C / Fortran / strided / read-only
inputs, with and without ``out=`` (aliasing included), on arrays large
enough to be split across threads."""
import numpy as np
import pytest

import quantcore as qc
from quantcore._cpu import threads as qc_threads

from reference import assert_bits_equal


def big(rng, shape, dtype=np.float32):
    x = rng.normal(0, 3, size=shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::997] = np.nan
    flat[5::1009] = np.inf
    flat[7::1013] = -0.0
    flat[11::101] = np.round(flat[11::101] * 2) / 2  # ties
    return x


SHAPE = (8, 33, 40, 31)  # 327 360 elements > threshold, odd inner sizes


def variants(x):
    yield "C", x
    yield "F", np.asfortranarray(x)
    yield "strided", np.ascontiguousarray(np.repeat(x, 2, axis=-1))[..., ::2]
    ro = x.copy()
    ro.flags.writeable = False
    yield "readonly", ro


def _per(axis, x, per_tensor, per_channel):
    return per_tensor if axis is None else per_channel(x.shape[axis])


def _nudged(x, axis, formula, scale_op):
    lo = _per(axis, x, -2.0, lambda c: -np.linspace(0.5, 3, c))
    hi = _per(axis, x, 3.0, lambda c: np.linspace(1, 4, c))
    if formula == "tensorflow":
        nmin, nmax, s, inv, qz = qc.qparams.nudge_tensorflow(lo, hi, 0, 255)
    else:
        nmin, nmax, s = qc.qparams.nudge_mindspore(lo, hi, 1, 255)
        inv = qz = None
    one = (lambda a: a[0]) if axis is None else (lambda a: a)
    out, mask = qc.fake_quant_nudged(x, one(nmin), one(nmax), one(s),
                                     inv_scale=None if inv is None else one(inv),
                                     quant_zero=None if qz is None else one(qz),
                                     formula=formula, scale_op=scale_op, axis=axis,
                                     return_mask=True)
    return np.stack([out, mask.astype(out.dtype)])


OPS = {
    "fake_quant": lambda x, axis: qc.fake_quant(
        x, _per(axis, x, 0.05, lambda c: np.linspace(0.01, 0.2, c)),
        _per(axis, x, 3, lambda c: np.arange(c) % 7), -128, 127, axis=axis,
        rounding="half_up"),
    "fake_quant_float_zp_div": lambda x, axis: qc.fake_quant(
        x, _per(axis, x, 0.07, lambda c: np.linspace(0.03, 0.3, c)),
        _per(axis, x, 0.3, lambda c: np.linspace(-2.5, 3.5, c)), 0, 255, axis=axis,
        rounding="half_away", zero_point_add="before_rounding", scale_op="div",
        nonfinite="int64"),
    "fake_quant_no_zp": lambda x, axis: qc.fake_quant(
        x, _per(axis, x, 0.5, lambda c: np.full(c, 0.5)), 0, -8, 7, axis=axis,
        zero_point_add="none", nonfinite="nan_to_qmin"),
    "fake_quant_mask": lambda x, axis: qc.fake_quant_with_mask(
        x, 0.05 if axis is None else np.full(x.shape[axis], 0.07), 0 if axis is None else
        np.zeros(x.shape[axis]), -8, 7, axis=axis)[1],
    "quantize": lambda x, axis: qc.quantize(
        x, _per(axis, x, 0.1, lambda c: np.linspace(0.05, 0.5, c)),
        _per(axis, x, 100, lambda c: np.arange(c) % 200), 0, 255, axis=axis,
        rounding="half_away"),
    "minmax": lambda x, axis: np.stack(qc.minmax(x, axis=axis)),
    "minmax_omit": lambda x, axis: np.stack(qc.minmax(x, axis=axis, nan_policy="omit")),
    "amax": lambda x, axis: qc.fake_quant_amax(
        x, 2.0 if axis is None else np.linspace(0.5, 4, x.shape[axis]), 4, axis=axis),
    "amax_mask": lambda x, axis: qc.fake_quant_amax(
        x, 2.0 if axis is None else np.linspace(0.5, 4, x.shape[axis]), 8, narrow_range=False,
        axis=axis, return_mask=True)[1],
    "nudged_tf": lambda x, axis: _nudged(x, axis, "tensorflow", "mul_inverse"),
    "nudged_ms": lambda x, axis: _nudged(x, axis, "mindspore", "div"),
    "ste_backward": lambda x, axis: qc.ste_backward(x, np.asarray(x) > 0.5),
    "ste_backward_packed": lambda x, axis: qc.ste_backward(
        x, np.packbits((np.asarray(x) > 0.5).ravel(), bitorder="little")),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("axis", [None, 0, 1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_threads_and_layouts_agree(op, axis, dtype, rng, threads):
    x = big(rng, SHAPE, dtype)
    assert x.size > qc_threads.PARALLEL_THRESHOLD
    threads(1)
    expected = OPS[op](x, axis)
    threads(2)
    for name, xv in variants(x):
        got = OPS[op](xv, axis)
        assert_bits_equal(np.asarray(got), np.asarray(expected), f"{op} axis={axis} {name}")


@pytest.mark.parametrize("axis", [None, 2])
def test_out_and_aliasing(axis, rng, threads):
    threads(2)
    x = big(rng, SHAPE)
    scale = 0.1 if axis is None else np.linspace(0.05, 0.5, x.shape[axis])
    expected = qc.fake_quant(x, scale, 0, -128, 127, axis=axis)
    out = np.empty_like(x)
    res = qc.fake_quant(x, scale, 0, -128, 127, axis=axis, out=out)
    assert res is out
    assert_bits_equal(out, expected)
    # in place
    y = x.copy()
    res = qc.fake_quant(y, scale, 0, -128, 127, axis=axis, out=y)
    assert res is y
    assert_bits_equal(y, expected)
    # Fortran-ordered out for a C input, and a strided out
    outf = np.empty(x.shape, np.float32, order="F")
    assert_bits_equal(qc.fake_quant(x, scale, 0, -128, 127, axis=axis, out=outf), expected)
    base = np.zeros(x.shape[:-1] + (x.shape[-1] * 2,), np.float32)
    outs = base[..., ::2]
    qc.fake_quant(x, scale, 0, -128, 127, axis=axis, out=outs)
    assert_bits_equal(outs, expected)
    assert not base[..., 1::2].any(), "wrote outside out"
    # partial overlap: out is a shifted view of the input buffer
    buf = np.concatenate([x.reshape(-1), np.zeros(1, np.float32)])
    src = buf[1:].reshape(x.shape)
    src[...] = x
    dst = buf[:-1].reshape(x.shape)
    qc.fake_quant(src, scale, 0, -128, 127, axis=axis, out=dst)
    assert_bits_equal(dst, expected)


def test_mask_out_and_ste_roundtrip(rng):
    x = big(rng, (300, 400))
    mask_out = np.empty(x.shape, np.bool_)
    out, mask = qc.fake_quant_with_mask(x, 0.02, 0, -128, 127, mask_out=mask_out)
    assert mask is mask_out
    g = rng.normal(size=x.shape).astype(np.float32)
    packed = np.packbits(mask.ravel(), bitorder="little")
    assert_bits_equal(qc.ste_backward(g, packed), qc.ste_backward(g, mask))
    assert_bits_equal(qc.ste_backward(np.asfortranarray(g), np.asfortranarray(mask)),
                      (g * mask).astype(np.float32))
    m8 = mask.view(np.uint8)
    assert_bits_equal(qc.ste_backward(g[:, ::2], m8[:, ::2]), (g[:, ::2] * mask[:, ::2]))


def test_float16_and_float64_dtypes(rng):
    x = rng.normal(size=(70000,))
    for dt in (np.float16, np.float32, np.float64):
        y = qc.fake_quant(x.astype(dt), 0.1, 0, -128, 127)
        assert y.dtype == dt
        lo, hi = qc.minmax(x.astype(dt))
        assert lo.dtype == dt and hi.dtype == dt


def test_zero_d_and_empty():
    y = qc.fake_quant(np.float32(0.26), 0.1, 0, -128, 127)
    assert y.shape == () and y.dtype == np.float32
    assert float(y) == np.float32(np.float32(3) * np.float32(0.1))
    e = np.empty((0, 3), np.float32)
    assert qc.fake_quant(e, 0.1, 0, 0, 255).shape == (0, 3)
    lo, hi = qc.minmax(e)
    assert lo == np.inf and hi == -np.inf
    lo, hi = qc.minmax(e, axis=1)
    assert lo.shape == (3,) and np.all(lo == np.inf)
    lo, hi = qc.minmax(e, axis=0)
    assert lo.shape == (0,)


def test_lists_and_scalars():
    y = qc.fake_quant([0.26, -1.0], 0.1, 0, -128, 127)
    assert y.dtype == np.float64 and y.tolist() == [0.30000000000000004, -1.0]
    assert qc.fake_quant(1, 0.5, 0, -128, 127) == 1.0
    assert qc.backend_of([1.0]) == "cpu"
    assert qc.backend_of(np.zeros(2)) == "cpu"


def test_thread_count_api(monkeypatch):
    qc.set_num_threads(1)
    assert qc.get_num_threads() == 1
    qc.set_num_threads(None)
    assert qc.get_num_threads() >= 1
    with pytest.raises(ValueError):
        qc.set_num_threads(0)
    with pytest.raises(TypeError):
        qc.set_num_threads(1.5)


def test_threadpoolctl_limits_are_honoured():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not qc.build_info()["openmp"]:
        pytest.skip("serial build")
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert qc.get_num_threads() == 1


# every function that takes out=: fresh, aliasing the input, Fortran-ordered
# and strided outputs give the bits of the out=None call, with 2 threads
OUT_OPS = {
    "fake_quant": lambda x, axis, out: qc.fake_quant(
        x, _per(axis, x, 0.05, lambda c: np.linspace(0.01, 0.2, c)), 0, -128, 127, axis=axis,
        scale_op="div", rounding="half_away", out=out),
    "fake_quant_with_mask": lambda x, axis, out: qc.fake_quant_with_mask(
        x, _per(axis, x, 0.05, lambda c: np.linspace(0.01, 0.2, c)),
        _per(axis, x, 0.25, lambda c: np.linspace(-3, 3, c)), 0, 255, axis=axis,
        zero_point_add="before_rounding", out=out)[0],
    "fake_quant_nudged": lambda x, axis, out: qc.fake_quant_nudged(
        x, *(a if axis is not None else a[0] for a in qc.qparams.nudge_tensorflow(
            _per(axis, x, -1.0, lambda c: -np.linspace(0.5, 3, c)),
            _per(axis, x, 2.0, lambda c: np.linspace(1, 4, c)), 0, 255)[:3]),
        axis=axis, scale_op="div", out=out),
    "fake_quant_amax": lambda x, axis, out: qc.fake_quant_amax(
        x, _per(axis, x, 2.0, lambda c: np.linspace(0.5, 4, c)), 6, axis=axis, out=out),
    "ste_backward": lambda x, axis, out: qc.ste_backward(x, np.asarray(x) > 0, out=out),
}


@pytest.mark.parametrize("op", sorted(OUT_OPS))
@pytest.mark.parametrize("axis", [None, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_out_for_every_op(op, axis, dtype, rng, threads):
    threads(2)
    f = OUT_OPS[op]
    x = big(rng, SHAPE, dtype)
    expected = f(x, axis, None)
    assert expected.dtype == dtype and expected.shape == x.shape
    out = np.empty_like(x)
    assert f(x, axis, out) is out
    assert_bits_equal(out, expected, "fresh out")
    y = x.copy()
    assert f(y, axis, y) is y
    assert_bits_equal(y, expected, "out is x")
    outf = np.empty(x.shape, dtype, order="F")
    assert f(x, axis, outf) is outf
    assert_bits_equal(outf, expected, "Fortran out")
    base = np.zeros(x.shape[:-1] + (x.shape[-1] * 2,), dtype)
    outs = base[..., ::2]
    f(x, axis, outs)
    assert_bits_equal(outs, expected, "strided out")
    assert not base[..., 1::2].any(), "wrote outside out"


@pytest.mark.parametrize("op", sorted(OPS))
def test_float16_is_float32_rounded_once(op, rng):
    """Documented: float16 input is computed in float32 and the result is
    rounded to float16 once (masks / integers: the float32 ones)."""
    x16 = big(rng, (70, 50), np.float16)
    got = np.asarray(OPS[op](x16, 1))
    ref32 = np.asarray(OPS[op](x16.astype(np.float32), 1))
    if ref32.dtype == np.float32:
        ref32 = ref32.astype(np.float16)
    assert_bits_equal(got, ref32)


def test_float64_is_computed_in_float64():
    """Documented: float64 input is computed in float64 (not float32)."""
    x = np.array([0.3, 1 / 3, 2.0 ** -30 + 1], np.float64)
    assert qc.fake_quant(x, 0.1, 0, -128, 127).tolist() == \
        (np.rint(x * (1 / 0.1)) * 0.1).tolist()
    assert qc.fake_quant(x, 0.1, 0, -128, 127)[0] != float(np.float32(3) * np.float32(0.1))
    lo, hi = qc.minmax(x)
    assert hi == 2.0 ** -30 + 1 and lo.dtype == np.float64
