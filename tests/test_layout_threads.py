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


OPS = {
    "fake_quant": lambda x, axis: qc.fake_quant(
        x, 0.05 if axis is None else np.linspace(0.01, 0.2, x.shape[axis]),
        3 if axis is None else np.arange(x.shape[axis]) % 7, -128, 127, axis=axis,
        rounding="half_up"),
    "fake_quant_mask": lambda x, axis: qc.fake_quant_with_mask(
        x, 0.05 if axis is None else np.full(x.shape[axis], 0.07), 0 if axis is None else
        np.zeros(x.shape[axis]), -8, 7, axis=axis)[1],
    "minmax": lambda x, axis: np.stack(qc.minmax(x, axis=axis)),
    "amax": lambda x, axis: qc.fake_quant_amax(
        x, 2.0 if axis is None else np.linspace(0.5, 4, x.shape[axis]), 4, axis=axis),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("axis", [None, 0, 1, 3])
def test_threads_and_layouts_agree(op, axis, rng, threads):
    x = big(rng, SHAPE)
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
