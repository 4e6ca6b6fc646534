"""The functional API's fast path (contiguous float32 / float64 numpy
arrays, per tensor, scalar qparams) and its general path give the same bits,
and every case the fast path declines still works through the general one."""
import numpy as np
import pytest

import quantcore as qc
from quantcore import _arrays as A
from quantcore.ops import ROUNDING
from reference import assert_same_bytes

RNG = np.random.default_rng(7)


def data(dtype, n=3000):
    x = (RNG.normal(size=n) * 4).astype(dtype)
    x[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.5 * 0.25, 2.5 * 0.25]  # ties at scale 0.25
    return x


def general(x):
    """The same values through the general path (a Fortran-ordered 2-D
    view is not taken by the fast path)."""
    return np.asfortranarray(x.reshape(2, -1))


same = assert_same_bytes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", list(ROUNDING))  # every mode of the extension's table
@pytest.mark.parametrize("zero_point_add", ["after_rounding", "before_rounding"])
def test_fake_quant_fast_equals_general(dtype, rounding, zero_point_add):
    x = data(dtype)
    kw = dict(rounding=rounding, zero_point_add=zero_point_add)
    assert A.fast_flat(x) is not None and A.fast_flat(general(x)) is None
    fast = qc.fake_quant(x, 0.25, 3, -128, 127, **kw)
    slow = qc.fake_quant(general(x), 0.25, 3, -128, 127, **kw)
    same(fast, slow.ravel())
    fm, mm = qc.fake_quant_with_mask(x, 0.25, 3, -128, 127, **kw)
    sm, smm = qc.fake_quant_with_mask(general(x), 0.25, 3, -128, 127, **kw)
    same(fm, sm.ravel())
    same(mm, smm.ravel())
    assert mm.dtype == np.bool_
    _, m8 = qc.fake_quant_with_mask(x, 0.25, 3, -128, 127, mask_dtype=np.uint8, **kw)
    assert m8.dtype == np.uint8 and np.array_equal(m8, mm)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fake_quant_out_cases(dtype):
    x = data(dtype)
    expect = qc.fake_quant(x, 0.25, 3, -128, 127)
    out = np.empty_like(x)
    assert qc.fake_quant(x, 0.25, 3, -128, 127, out=out) is out
    same(out, expect)
    y = x.copy()  # in place
    assert qc.fake_quant(y, 0.25, 3, -128, 127, out=y) is y
    same(y, expect)
    # out overlapping x with an offset: declined by the fast path, still right
    buf = np.concatenate([x, x[:1]])
    res = qc.fake_quant(buf[1:], 0.25, 3, -128, 127, out=buf[:-1])
    same(res, qc.fake_quant(np.concatenate([x[1:], x[:1]]), 0.25, 3, -128, 127))
    # read-only out and wrong-dtype out get the general path's messages
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        qc.fake_quant(x, 0.25, 3, -128, 127, out=ro)
    with pytest.raises(TypeError, match="out has dtype"):
        qc.fake_quant(x, 0.25, 3, -128, 127, out=np.empty(x.shape, np.float16))


def test_fast_path_validation_messages():
    x = data(np.float32)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        qc.fake_quant(x, 0.0, 0, -128, 127)
    with pytest.raises(ValueError, match="too small"):
        qc.fake_quant(x, 1e-40, 0, -128, 127)
    with pytest.raises(ValueError, match=r"zero_point must lie in \[quant_min, quant_max\]"):
        qc.fake_quant(x, 0.1, 300, -128, 127)
    with pytest.raises(ValueError, match="zero_point must be integral"):
        qc.fake_quant(x, 0.1, 0.5, -128, 127)
    with pytest.raises(ValueError, match="quant_min must be < quant_max"):
        qc.fake_quant(x, 0.1, 0, 5, 5)
    with pytest.raises(ValueError, match="rounding must be one of"):
        qc.fake_quant(x, 0.1, 0, -128, 127, rounding="nearest")
    with pytest.raises(ValueError, match="rounding must be one of"):
        qc.fake_quant(x, 0.1, 0, -128, 127, rounding=["unhashable"])
    with pytest.raises(TypeError, match="quant_min must be an integer"):
        qc.fake_quant(x, 0.1, 0, True, 127)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nan_policy", ["propagate", "omit"])
@pytest.mark.parametrize("n", [0, 1, 5000, 70000])
def test_minmax_fast_equals_general(dtype, nan_policy, n):
    x = (RNG.normal(size=n) * 3).astype(dtype)
    if n > 10:
        x[[3, n // 2]] = [np.nan, -0.0]
    lo, hi = qc.minmax(x, nan_policy=nan_policy)
    strided = np.repeat(x, 2)[::2]
    assert A.fast_flat(strided) is None or n <= 1
    glo, ghi = qc.minmax(strided, nan_policy=nan_policy)
    assert lo.shape == () and lo.dtype == dtype and hi.dtype == dtype
    same(lo, glo)
    same(hi, ghi)
    if n == 0:
        assert lo == np.inf and hi == -np.inf


def test_minmax_signed_zero_and_nan_omit():
    x = np.array([0.0, -0.0, 0.0], np.float32)
    lo, hi = qc.minmax(x)
    assert np.signbit(lo) and not np.signbit(hi)
    x = np.array([np.nan, 1.0, -2.0], np.float32)
    assert np.isnan(qc.minmax(x)[0])
    assert qc.minmax(x, nan_policy="omit") == (np.float32(-2.0), np.float32(1.0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_dtype", [np.bool_, np.uint8])
def test_ste_fast_equals_general(dtype, mask_dtype):
    g = data(dtype)
    mask = (RNG.random(g.size) > 0.3).astype(mask_dtype)
    with np.errstate(invalid="ignore"):  # inf * 0
        expect = g * mask.astype(dtype)
    same(qc.ste_backward(g, mask), expect)
    out = np.empty_like(g)
    assert qc.ste_backward(g, mask, out=out) is out
    same(out, expect)
    same(qc.ste_backward(general(g), np.asfortranarray(mask.reshape(2, -1))).ravel(),
         expect)
    packed = np.packbits(mask.astype(bool), bitorder="little")
    same(qc.ste_backward(g, packed), expect)


def unaligned(values):
    """A float32 array whose data starts one byte off alignment (as buffers
    received from a network or mapped from a file can)."""
    buf = np.zeros(values.nbytes + 1, np.uint8)
    arr = np.frombuffer(buf.data, dtype=values.dtype, count=values.size, offset=1)
    arr = arr.reshape(values.shape)
    arr[...] = values
    assert not arr.flags.aligned
    return arr


@pytest.mark.filterwarnings("ignore:.*was skipped:RuntimeWarning")
def test_unaligned_inputs_and_outputs():
    from quantcore import calib
    x = data(np.float32, 70000)
    ux = unaligned(x)
    same(qc.minmax(ux)[0], qc.minmax(x)[0])
    same(qc.minmax(ux.reshape(7, -1), axis=0)[1], qc.minmax(x.reshape(7, -1), axis=0)[1])
    expect = qc.fake_quant(x, 0.25, 3, -128, 127)
    same(qc.fake_quant(ux, 0.25, 3, -128, 127), expect)
    uout = unaligned(np.zeros_like(x))
    assert qc.fake_quant(x, 0.25, 3, -128, 127, out=uout) is uout
    same(uout, expect)
    mask = x > 0
    same(qc.ste_backward(ux, mask), qc.ste_backward(x, mask))
    fq_a, fq_u = qc.FakeQuantize(qc.MinMaxObserver()), qc.FakeQuantize(qc.MinMaxObserver())
    same(fq_u(ux), fq_a(x))
    ha, hu = calib.HistogramCalibrator(8, None, False), calib.HistogramCalibrator(8, None, False)
    ha.collect(np.nan_to_num(x, posinf=0, neginf=0, nan=0))
    hu.collect(unaligned(np.nan_to_num(x, posinf=0, neginf=0, nan=0)))
    same(hu.hist, ha.hist)
    ta, tu = calib.TorchHistogram(), calib.TorchHistogram()
    ta.collect(x[6:])
    tu.collect(unaligned(x[6:]))
    same(tu.histogram, ta.histogram)


def test_device_rule_is_declared_by_the_observer_class():
    """FakeQuantize's fused and device steps run an observer whose class
    declares a DEVICE_RULE (not a closed list of classes); a subclass that
    does not declare one runs the general path; the same bits either way."""
    from quantcore.fake_quantize import _device_rule

    class Sub(qc.MinMaxObserver):
        pass

    class Declared(qc.MinMaxObserver):
        DEVICE_RULE = "minmax"

    assert _device_rule(qc.MinMaxObserver()) == "minmax"
    assert _device_rule(qc.MovingAverageMinMaxObserver()) == "moving_average"
    assert _device_rule(Sub()) is None and _device_rule(qc.EMAMinMaxObserver()) is None
    assert _device_rule(Declared()) == "minmax"
    rng = np.random.default_rng(3)
    fqs = [qc.FakeQuantize(cls(), -128, 127) for cls in (qc.MinMaxObserver, Sub, Declared)]
    for _ in range(3):
        x = (rng.standard_normal(4096) * 3).astype(np.float32)
        ys = [fq(x) for fq in fqs]
        assert all(np.array_equal(ys[0].view(np.uint32), y.view(np.uint32)) for y in ys[1:])
    assert [fq._fused_ready() for fq in fqs] == [True, False, True]
