"""quantcore.compat.torch against live PyTorch 2.13 CPU (the oracle).

Every comparison is on bit patterns (NaN == NaN); gradient sums of the LSQ
backward to a few float32 ulp of the summed magnitudes.  Random cases are
batched: one call covers hundreds of channels / elements.
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.ao.quantization import fake_quantize as tfq  # noqa: E402
from torch.ao.quantization import observer as tob  # noqa: E402

import reference as ref  # noqa: E402
from quantcore.compat import torch as T  # noqa: E402

F32 = np.float32
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")]

DTYPES = ["quint8", "qint8", "qint32", "quint4x2", "int8", "uint8", "int16", "uint16", "int32"]
TD = {d: getattr(torch, d) for d in DTYPES}
PER_TENSOR = ["per_tensor_affine", "per_tensor_symmetric"]
PER_CHANNEL = ["per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"]


def tq(name):
    return getattr(torch, name)


def tt(a):
    """A torch copy (resizable storage, unlike torch.from_numpy)."""
    return torch.from_numpy(np.array(a, copy=True)).clone()


def npy(t):
    # a copy: .numpy() on the tensor itself would make its storage non-resizable
    return t.detach().clone().numpy()


def same(a, b, msg=""):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{msg}: shape {a.shape} vs {b.shape}"
    assert a.dtype == b.dtype, f"{msg}: dtype {a.dtype} vs {b.dtype}"
    if a.dtype.kind == "f":
        ref.assert_bits_equal(a, b, msg)
    else:
        assert np.array_equal(a, b), f"{msg}: {a[a != b][:5]} vs {b[a != b][:5]}"


def same_value(a, b, msg=""):
    """Equal values (+0 == -0, NaN == NaN): observer state."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, msg
    assert np.array_equal(a, b, equal_nan=True), f"{msg}: {a} vs {b}"


def nasty(rng, n, scale=1.0):
    """Random floats with ties-ish values, tiny / huge values, zeros, NaN, inf."""
    kind = rng.integers(0, 10, n)
    x = rng.standard_normal(n) * scale
    x = np.where(kind == 0, np.round(x * 4) / 4, x)
    x = np.where(kind == 1, rng.standard_normal(n) * 1e-6, x)
    x = np.where(kind == 2, rng.standard_normal(n) * 1e4, x)
    x = np.where(kind == 3, 0.0, x)
    return x.astype(F32)


def sprinkle(rng, x, p=0.01):
    x = x.copy()
    flat = x.reshape(-1)
    for v in (np.nan, np.inf, -np.inf):
        idx = rng.random(flat.size) < p
        flat[idx] = v
    return x


def range_for(dtype, rng):
    """(quant_min, quant_max) choices: default or a custom range for dtype."""
    lo, hi, _ = T._IINFO[dtype]
    opts = [(None, None)]
    if dtype in ("qint8", "int8"):
        opts += [(-127, 127), (-8, 7), (-128, 127)]
    elif dtype in ("quint8", "uint8"):
        opts += [(0, 15), (0, 1000), (0, 255)]
    elif dtype in ("qint32", "int32"):
        opts += [(-1000, 1000)]
    elif dtype == "quint4x2":
        opts += [(0, 15)]
    else:
        opts += [(lo // 4, hi // 4 if lo < 0 else hi)]
    return opts


# ===================================================================== spec
SPEC_X = np.array([-1, 0.5, 2], F32)


@pytest.mark.parametrize("kw,scale,zp,zdt", [
    (dict(), 0.011764706, 85, np.int32),
    (dict(dtype="qint8"), 0.011764706, -43, np.int32),
    (dict(dtype="qint8", qscheme="per_tensor_symmetric"), 0.015686275, 0, np.int64),
    (dict(dtype="quint8", qscheme="per_tensor_symmetric"), 0.015686275, 128, np.int64),
    (dict(qscheme="per_tensor_symmetric", quant_min=0, quant_max=15), 0.26666668, 7, np.int64),
    (dict(reduce_range=True), 0.023622047, 42, np.int32),
    (dict(dtype="qint8", reduce_range=True), 0.023622047, -22, np.int32),
    (dict(dtype="qint32"), 1.1920929e-07, -2139095040, np.int32),
    (dict(dtype="int16", qscheme="per_tensor_symmetric"), 6.103609e-05, 0, np.int64),
    (dict(dtype="uint16", qscheme="per_tensor_symmetric"), 6.103609e-05, 32768, np.int64),
    (dict(dtype="uint16"), 4.5777066e-05, 21845, np.int32),
    (dict(dtype="quint4x2"), 0.2, 5, np.int32),
    (dict(dtype="uint8", qscheme="per_tensor_symmetric", reduce_range=True), 0.031496063, 128,
     np.int64),
])
def test_spec_minmax_vectors(kw, scale, zp, zdt):
    obs = T.MinMaxObserver(**kw)
    assert obs(SPEC_X) is SPEC_X
    s, z = obs.calculate_qparams()
    assert s.dtype == F32 and s.shape == (1,) and z.dtype == zdt and z.shape == (1,)
    assert s[0] == F32(scale) and z[0] == zp


def test_spec_other_vectors():
    def qp(x, **kw):
        o = T.MinMaxObserver(**kw)
        o(np.array(x, F32))
        return o.calculate_qparams()
    assert qp([1, 3])[1][0] == 0 and qp([-3, -1])[1][0] == 255
    s, z = qp([-300, 1e-3])
    assert s[0] == F32(1.1764746) and z[0] == 255
    s, z = qp([-0.625, 1.875], quant_min=0, quant_max=10)
    assert s[0] == F32(0.25) and z[0] == 2
    s, z = qp([5, 5])
    assert s[0] == F32(5 / 255) and z[0] == 0
    s, z = qp([0, 0])
    assert s[0] == F32(np.finfo(F32).eps) and z[0] == 0
    s, z = qp([0, 1e-3], dtype="qint8", qscheme="per_tensor_symmetric", quant_min=-127,
              quant_max=127, eps=2 ** -12)
    assert s[0] == F32(0.00024414062) and z[0] == 0
    o = T.PerChannelMinMaxObserver(ch_axis=1, dtype="qint8", qscheme="per_channel_symmetric")
    o(np.array([[[-1, 2], [.5, .25]], [[3, -4], [0, 0]]], F32))
    s, z = o.calculate_qparams()
    same(s, np.array([0.03137255, 0.003921569], F32))
    same(z, np.array([0, 0], np.int64))
    rows = np.array([[1, 2, 3], [-1, .5, .5], [2, 2, 2]], F32)
    for dt, es, ez in [("quint8", [0.007843138, 0.005882353, 1.0], [-127.49999237, 170.0, -2.0]),
                       ("quint4x2", [0.13333334, 0.1, 1.0], [-7.4999995, 10.0, -2.0])]:
        o = T.PerChannelMinMaxObserver(dtype=dt, qscheme="per_channel_affine_float_qparams")
        o(rows)
        s, z = o.calculate_qparams()
        same(s, np.array(es, F32))
        same(z, np.array(ez, F32))
    o = T.MovingAverageMinMaxObserver(0.5)
    for a in ([-1, 1], [-3, 2], [.5, .7]):
        o(np.array(a, F32))
    assert o.min_val == F32(-0.75) and o.max_val == F32(1.1)
    s, z = o.calculate_qparams()
    assert s[0] == F32(0.0072549023) and z[0] == 103


def test_spec_kernel_vectors():
    f = T.fake_quantize_per_tensor_affine
    s = float(F32(0.00214854861))
    assert f(np.array([0.273939937], F32), s, 0, 0, 255)[0] == F32(0.27501422)
    same(f(np.array([-2.5, -1.5, -.5, .5, 1.5, 2.5], F32), 1.0, 1, -128, 127),
         np.array([-2, -2, 0, 0, 2, 2], F32))
    same(f(np.array([-10, 10, 300], F32), 1.0, 0, 0, 255), np.array([0, 10, 255], F32))
    out, mask = T.fake_quantize_per_tensor_affine_cachemask(
        np.array([np.nan, np.inf, -np.inf, 1], F32), 0.5, 3, 0, 255)
    same(out, np.array([-1.5, 126, -1.5, 1], F32))
    same(mask, np.array([0, 0, 0, 1], bool))
    same(f(np.array([1, -1, 0], F32), 0.0, 0, -128, 127), np.array([0.0, -0.0, -0.0], F32))
    out = f(np.array([.3, .7, 100], np.float16), 0.1, 0, 0, 255)
    same(out, np.array([0.300048828125, 0.7001953125, 25.5], np.float16))
    # tensor-qparams overload: zp truncated, not range checked
    same(f(np.array([1.0], F32), np.array([1.0], F32), np.array([300.0], F32), 0, 255),
         np.array([-45.0], F32))
    fc = T.fake_quantize_per_channel_affine
    same(fc(np.array([[np.nan, np.inf, -np.inf, 1]], F32), np.array([.5], F32),
            np.array([3], np.int32), 0, 0, 255), np.array([[-1.5, -1.5, -1.5, 1]], F32))
    same(fc(np.array([[-2.5, -1.5, -.5, .5, 1.5, 2.5]], F32), np.array([1], F32),
            np.array([1], F32), 0, -128, 127), np.array([[-3, -1, -1, 1, 1, 3]], F32))
    same(fc(np.array([[0, .25, 1, -.2]], F32), np.array([.5], F32), np.array([.3], F32), 0,
            0, 255), np.array([[-0.15, 0.35, 0.85, -0.15]], F32))


def test_spec_lsq_vectors():
    x = np.array([-3, -.6, 0, .4, 1.26, 1.3, 5], F32)
    dy = np.arange(1, 8, dtype=F32)
    s, z = np.array([.5], F32), np.array([2.0], F32)
    y = T.fake_quantize_learnable_per_tensor_affine(x, s, z, 0, 4)
    same(y, np.array([-1, -.5, 0, .5, 1, 1, 1], F32))
    dx, ds, dz = T.fake_quantize_learnable_per_tensor_affine_backward(dy, x, s, z, 0, 4)
    same(dx, np.array([0, 2, 3, 4, 0, 0, 0], F32))
    assert abs(ds[0] - 35.2) < 1e-4 and dz[0] == F32(-9.5)
    dx, ds, dz = T.fake_quantize_learnable_per_tensor_affine_backward(dy, x, s, z, 0, 4, .25)
    assert abs(ds[0] - 8.8) < 1e-4 and dz[0] == F32(-2.375)
    x = np.array([[-3, .4, 5, .26], [1, 2, 100, -.5]], F32)
    dy = np.arange(1, 9, dtype=F32).reshape(2, 4)
    s, z = np.array([.5, 1], F32), np.array([2.5, 1.5], F32)
    same(T.fake_quantize_learnable_per_channel_affine(x, s, z, 0, 0, 4),
         np.array([[-1, .5, 1, .5], [1, 2, 2, 0]], F32))
    dx, ds, dz = T.fake_quantize_learnable_per_channel_affine_backward(dy, x, s, z, 0, 0, 4)
    same(dx, np.array([[0, 2, 0, 4], [5, 6, 0, 8]], F32))
    np.testing.assert_allclose(ds, [6.32, 18], rtol=1e-5)
    same(dz, np.array([-2, -7], F32))
    # empty-input bug: the "gradients" are the inputs
    e = np.zeros((0,), F32)
    dx, ds, dz = T.fake_quantize_learnable_per_tensor_affine_backward(e, e, np.array([.5], F32),
                                                                      np.array([2.], F32), 0, 4)
    assert ds[0] == F32(.5) and dz[0] == F32(2.0)


def test_spec_fused_vectors():
    def run(x, qmin, qmax, sym, rmin=np.inf, rmax=-np.inf, c=0.01):
        mn, mx = np.array(rmin, F32), np.array(rmax, F32)
        s, z = np.array([1.0], F32), np.array([0], np.int32)
        out = T.fused_moving_avg_obs_fake_quant(np.array(x, F32), np.array([1]), np.array([1]),
                                                mn, mx, s, z, c, qmin, qmax, -1, False, sym)
        return out, s[0], z[0]
    out, s, z = run([-1, .5, 2], -128, 127, True)
    assert s == F32(2 / 127) and z == 0
    same(out, np.array([-1.007874, 0.503937, 2.0], F32))
    assert run([-1, .5, 2], -127, 127, True)[1] == F32(0.015810031)
    assert run([.5, 2], -128, 127, True)[1:] == (F32(0.007843138), -128)
    assert run([-.5, -2], -128, 127, True)[2] == 127
    assert run([0, 0], -128, 127, True)[1:] == (F32(0.1), 127)
    assert run([0, 1e-6], 0, 255, False)[1] == F32(6.1e-5)
    assert run([-3, 2], 0, 255, False, -1, 1, 0.5)[1:] == (F32(0.01372549), 146)
    _, s, z = run([np.nan, 1], 0, 255, False)
    assert np.isnan(s) and z == -2 ** 31
    assert run([-1, .5, 2], 0, 255, False)[1:] == (F32(0.011764706), 85)


# ================================================================ observers
def _torch_obs(cls_name, **kw):
    kw = dict(kw)
    for k in ("dtype", "qscheme"):
        if k in kw:
            kw[k] = tq(kw[k])
    return getattr(tob, cls_name)(**kw)


def _configs(per_channel, rng):
    out = []
    for dt in DTYPES:
        for qs in (PER_CHANNEL if per_channel else PER_TENSOR):
            for rr in (False, True):
                for qmin, qmax in range_for(dt, rng):
                    out.append(dict(dtype=dt, qscheme=qs, reduce_range=rr, quant_min=qmin,
                                    quant_max=qmax))
    return out


def _construct_both(cls_name, kw):
    """(ours, theirs) or (exc type, exc type) when construction fails."""
    ours = theirs = None
    oe = te = None
    try:
        theirs = _torch_obs(cls_name, **kw)
    except Exception as e:  # noqa: BLE001
        te = e
    try:
        ours = getattr(T, cls_name)(**kw)
    except Exception as e:  # noqa: BLE001
        oe = e
    assert (oe is None) == (te is None), f"{cls_name}{kw}: ours {oe!r}, torch {te!r}"
    if oe is not None:
        assert _exc_matches(oe, te), f"{cls_name}{kw}: ours {oe!r}, torch {te!r}"
        return None, None
    return ours, theirs


def _exc_matches(ours, theirs):
    """torch's exception class kept (``except RuntimeError`` catches what it
    catches with torch); AssertionError / RuntimeError are also ValueError or
    TypeError (quantcore's convention, compat/_errors.py)."""
    if isinstance(theirs, (AssertionError, RuntimeError)) and \
            not isinstance(theirs, NotImplementedError):
        if not isinstance(ours, (ValueError, TypeError)):
            return False
    return isinstance(ours, type(theirs))


def _compare_qparams(ours, theirs, msg):
    oe = te = None
    try:
        so, zo = ours.calculate_qparams()
    except Exception as e:  # noqa: BLE001
        oe = e
    try:
        st, zt = theirs.calculate_qparams()
    except Exception as e:  # noqa: BLE001
        te = e
    assert (oe is None) == (te is None), f"{msg}: ours {oe!r}, torch {te!r}"
    if oe is not None:
        assert _exc_matches(oe, te)
        return 0
    same(so, npy(st), msg + " scale")
    if zo.dtype == np.float32:
        # float_qparams: -min/scale, whose sign of zero follows the min's signed
        # zero (quantcore orders -0.0 < +0.0; documented)
        assert zo.dtype == npy(zt).dtype
        same_value(zo, npy(zt), msg + " zero_point")
    else:
        same(zo, npy(zt), msg + " zero_point")
    return so.size


def test_per_tensor_observers_random():
    rng = np.random.default_rng(1)
    n = 0
    for kw in _configs(False, rng):
        for cls in ("MinMaxObserver", "MovingAverageMinMaxObserver"):
            extra = {"averaging_constant": float(rng.choice([0.01, 0.5, 1.0]))} \
                if cls.startswith("Moving") else {}
            ours, theirs = _construct_both(cls, {**kw, **extra})
            if ours is None:
                continue
            _compare_qparams(ours, theirs, f"{cls}{kw} empty")
            for step in range(5):
                x = nasty(rng, int(rng.integers(1, 40)), float(rng.choice([1e-3, 1, 100])))
                if rng.random() < 0.1:
                    x = sprinkle(rng, x, 0.05)
                if rng.random() < 0.05:
                    x = x.astype(np.float64)
                assert ours(x) is x
                theirs(tt(x))
                same_value(ours.min_val, npy(theirs.min_val), f"{cls}{kw} min")
                same_value(ours.max_val, npy(theirs.max_val), f"{cls}{kw} max")
                n += _compare_qparams(ours, theirs, f"{cls}{kw} step {step}")
            ours.reset_min_max_vals()
            theirs.reset_min_max_vals()
            n += _compare_qparams(ours, theirs, f"{cls}{kw} reset")
    assert n >= 1000


def test_per_channel_observers_random():
    rng = np.random.default_rng(2)
    n = 0
    for kw in _configs(True, rng):
        for cls in ("PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"):
            ndim = int(rng.integers(2, 4))
            shape = tuple(int(v) for v in rng.integers(1, 6, ndim))
            ch_axis = int(rng.integers(-ndim, ndim))
            shape = list(shape)
            shape[ch_axis] = 40
            extra = {"ch_axis": ch_axis}
            if cls.startswith("Moving"):
                extra["averaging_constant"] = float(rng.choice([0.01, 0.5, 1.0]))
            ours, theirs = _construct_both(cls, {**kw, **extra})
            if ours is None:
                continue
            _compare_qparams(ours, theirs, f"{cls}{kw} empty")
            for step in range(3):
                mags = 10.0 ** rng.uniform(-7, 3, shape[ch_axis])
                bshape = [1] * ndim
                bshape[ch_axis] = shape[ch_axis]
                x = (nasty(rng, int(np.prod(shape))).reshape(shape) * mags.reshape(bshape)
                     ).astype(F32)
                if rng.random() < 0.2:
                    x = sprinkle(rng, x, 0.002)
                ours(x)
                theirs(tt(x))
                same_value(ours.min_val, npy(theirs.min_val), f"{cls}{kw} min")
                same_value(ours.max_val, npy(theirs.max_val), f"{cls}{kw} max")
                n += _compare_qparams(ours, theirs, f"{cls}{kw} step {step}")
    assert n >= 1000


def test_observer_constructor_errors_and_warnings():
    bad = [
        ("MinMaxObserver", dict(qscheme="per_channel_affine")),
        ("MinMaxObserver", dict(quant_min=1, quant_max=10)),
        ("MinMaxObserver", dict(quant_min=5, quant_max=5)),
        ("MinMaxObserver", dict(quant_min=0, quant_max=0)),
        ("MinMaxObserver", dict(dtype="qint8", quant_min=-200, quant_max=100)),
        ("MinMaxObserver", dict(qscheme="per_tensor_symmetric", reduce_range=True)),
        ("MovingAverageMinMaxObserver", dict(is_dynamic=True)),
        ("PerChannelMinMaxObserver", dict(is_dynamic=True)),
        ("PerChannelMinMaxObserver", dict(qscheme="per_tensor_affine")),
        ("PerChannelMinMaxObserver", dict(qscheme="per_channel_symmetric", reduce_range=True)),
        ("MovingAveragePerChannelMinMaxObserver", dict(is_dynamic=True)),
        ("HistogramObserver", dict(is_dynamic=True)),
        ("HistogramObserver", dict(qscheme="per_channel_affine")),
    ]
    for cls, kw in bad:
        with pytest.raises(Exception) as oe:
            getattr(T, cls)(**kw)
        with pytest.raises(Exception) as te:
            _torch_obs(cls, **kw)
        assert _exc_matches(oe.value, te.value), (cls, kw, oe.value, te.value)
    # accepted: a single custom end is ignored; quint8 (0, 1000); uint8 symmetric reduce_range
    assert (T.MinMaxObserver(quant_min=3).quant_min, T.MinMaxObserver(quant_max=3).quant_max) \
        == (0, 255)
    assert T.MinMaxObserver(quant_min=0, quant_max=1000).quant_max == 1000
    T.MinMaxObserver(dtype="uint8", qscheme="per_tensor_symmetric", reduce_range=True)
    T.MovingAverageMinMaxObserver(averaging_constant=1, is_dynamic=True)
    assert T.MinMaxObserver(dtype="torch.qint8").dtype == "qint8"
    with pytest.raises(ValueError):
        T.MinMaxObserver(dtype="float32")
    with pytest.raises(ValueError):
        T.MinMaxObserver(qscheme="per_tensor_weird")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        T.MinMaxObserver(reduce_range=True)
        tob.MinMaxObserver(reduce_range=True)
    assert len(w) == 2 and str(w[0].message) == str(w[1].message)
    assert w[0].category is w[1].category is UserWarning
    for qmin, qmax in [(0, 255), (-127, 127), (-128, 127), (0, 15)]:
        o = T.MinMaxObserver(dtype="qint8", quant_min=qmin, quant_max=qmax, reduce_range=True)
        t = tob.MinMaxObserver(dtype=torch.qint8, quant_min=qmin, quant_max=qmax,
                               reduce_range=True)
        assert (o.quant_min, o.quant_max) == (t.quant_min, t.quant_max)


def test_observer_runtime_quirks():
    # invalid state: min > max raises (also +inf with a finite max); NaN never trips it
    for mn, mx in [(3.0, 1.0), (np.inf, 1.0), (np.nan, 1.0), (np.inf, -np.inf)]:
        o, t = T.MinMaxObserver(), tob.MinMaxObserver()
        o.load_state_dict({"eps": np.array([2 ** -23], F32), "min_val": np.array(mn, F32),
                           "max_val": np.array(mx, F32)})
        t.load_state_dict({"eps": torch.tensor([2 ** -23]), "min_val": torch.tensor(mn),
                           "max_val": torch.tensor(mx)})
        _compare_qparams(o, t, f"state {mn}, {mx}")
    # one-sided infinite moving-average state goes NaN, as torch
    o, t = T.MovingAverageMinMaxObserver(), tob.MovingAverageMinMaxObserver()
    for m in (o, t):
        m.load_state_dict({"eps": np.array([2 ** -23], F32) if m is o else torch.tensor([2 ** -23]),
                           "min_val": np.array(np.inf, F32) if m is o else torch.tensor(np.inf),
                           "max_val": np.array(1.0, F32) if m is o else torch.tensor(1.0)})
    x = np.array([-1, 2], F32)
    o(x)
    t(tt(x))
    same_value(o.min_val, npy(t.min_val))
    same_value(o.max_val, npy(t.max_val))
    # c = 1 is not memoryless
    o = T.MovingAverageMinMaxObserver(averaging_constant=1)
    o(np.array([1e20, 1e20], F32))
    o(np.array([1.0, 2.0], F32))
    assert o.min_val == 0.0
    # empty input changes nothing; per channel needs ndim >= 2; changed C raises
    o = T.MinMaxObserver()
    o(np.zeros((0, 3), F32))
    assert o.min_val == np.inf
    p = T.PerChannelMinMaxObserver()
    with pytest.raises(IndexError):
        p(np.ones(3, F32))
    with pytest.raises(IndexError):
        tob.PerChannelMinMaxObserver()(torch.ones(3))
    with pytest.raises(IndexError):
        T.PerChannelMinMaxObserver(ch_axis=3)(np.ones((2, 2), F32))
    p(np.ones((3, 2), F32))
    with pytest.raises(ValueError):
        p(np.ones((4, 2), F32))
    # integer input is read as float32
    o = T.MinMaxObserver()
    o(np.array([-3, 7], np.int64))
    assert (o.min_val, o.max_val) == (-3, 7)


def test_observer_state_dict_and_with_args():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(F32)
    for cls, kw in [("MinMaxObserver", {}), ("MovingAverageMinMaxObserver",
                                             {"averaging_constant": 0.3}),
                    ("PerChannelMinMaxObserver", {"ch_axis": 1}),
                    ("MovingAveragePerChannelMinMaxObserver", {"ch_axis": -1})]:
        t = _torch_obs(cls, **kw)
        t(tt(x))
        t(tt(x * 2 - 1))
        sd = {k: npy(v) for k, v in t.state_dict().items()}
        o = getattr(T, cls)(**kw)
        assert set(o.state_dict()) == set(sd)
        o.load_state_dict(sd)
        _compare_qparams(o, t, cls)
        # continue both from the loaded state
        o(x + 1)
        t(tt(x + 1))
        _compare_qparams(o, t, cls + " after load")
        # ours -> torch
        t2 = _torch_obs(cls, **kw)
        t2.load_state_dict({k: tt(v) for k, v in o.state_dict().items()})
        _compare_qparams(o, t2, cls + " to torch")
        with pytest.raises(ValueError):
            o.load_state_dict({"min_val": sd["min_val"]})
        o.load_state_dict({"min_val": sd["min_val"], "max_val": sd["max_val"]}, strict=False)
    # a .npz file round trip by key name
    import io
    o = T.MinMaxObserver()
    o(x)
    buf = io.BytesIO()
    np.savez(buf, **o.state_dict())
    buf.seek(0)
    o2 = T.MinMaxObserver()
    o2.load_state_dict(dict(np.load(buf)))
    same(o2.calculate_qparams()[0], o.calculate_qparams()[0])
    with pytest.raises(ValueError):
        T.MinMaxObserver().load_state_dict({"eps": np.ones(1, F32), "min_val": np.ones(1, F32),
                                            "max_val": np.ones(1, F32)})
    # with_args: chainable, later keywords win, new instance each call
    b = T.MinMaxObserver.with_args(dtype="qint8").with_args(qscheme="per_tensor_symmetric")
    a1, a2 = b(), b()
    assert a1 is not a2 and a1.dtype == "qint8" and a1.qscheme == "per_tensor_symmetric"
    assert b(dtype="quint8").dtype == "quint8"
    counter = iter(range(100))
    c = T.FixedQParamsObserver.with_callable_args(scale=lambda: float(next(counter)) + 1) \
        .with_args(zero_point=3)
    assert c().scale[0] == 1 and c().scale[0] == 2 and c().zero_point[0] == 3


def test_fixed_qparams_observer():
    o = T.default_fixed_qparams_range_neg1to1_observer()
    s, z = o.calculate_qparams()
    assert s.dtype == F32 and z.dtype == np.int32 and s[0] == 2 / 256 and z[0] == 128
    x = np.ones(3, F32)
    assert o(x) is x
    assert set(o.state_dict()) == {"scale", "zero_point"}
    with pytest.raises(NotImplementedError):
        T.FixedQParamsObserver(0.1, 0, is_dynamic=True)
    fq = T.default_fixed_qparams_range_0to1_fake_quant()
    tfq_ = tfq.default_fixed_qparams_range_0to1_fake_quant()
    xx = np.linspace(-0.5, 1.5, 101).astype(F32)
    same(fq(xx), npy(tfq_(tt(xx))))
    assert fq.scale is fq.activation_post_process.scale
    assert set(fq.state_dict()) == set(tfq_.state_dict())


def test_histogram_observer():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(3000).astype(F32)
    x[0] = 20
    for kw in [dict(), dict(dtype="qint8", qscheme="per_tensor_symmetric"),
               dict(quant_min=0, quant_max=127), dict(bins=256, reduce_range=True)]:
        o = T.HistogramObserver(**kw)
        t = _torch_obs("HistogramObserver", **kw)
        _compare_qparams(o, t, f"hist {kw} empty")
        for k, xs in enumerate([x, x * 0.5 + 1, np.array([np.inf, 1.0, -2.0], F32), x * 3]):
            o(xs)
            t(tt(xs))
            same_value(o.min_val, npy(t.min_val), f"hist {kw} min {k}")
            same_value(o.max_val, npy(t.max_val), f"hist {kw} max {k}")
        np.testing.assert_allclose(o.histogram, npy(t.histogram), rtol=1e-6, atol=1e-3)
        _compare_qparams(o, t, f"hist {kw}")
    assert set(T.HistogramObserver().state_dict()) == set(tob.HistogramObserver().state_dict())


# ========================================================== fake-quant kernels
def _tensor_case(rng, n):
    qmin, qmax = [(0, 255), (-128, 127), (0, 15), (-2 ** 31, 2 ** 31 - 1), (0, 4), (-1, 1),
                  (0, 65535), (-32768, 32767), (3, 3)][int(rng.integers(0, 9))]
    scale = float(10.0 ** rng.uniform(-6, 2))
    if rng.random() < 0.05:
        scale = float(rng.choice([0.0, -scale]))
    zp = int(rng.integers(max(qmin, -2 ** 24), min(qmax, 2 ** 24) + 1))
    span = (qmax - qmin + 10) * abs(scale if scale else 1.0)
    x = rng.uniform(-span, span, n)
    k = rng.integers(0, 4, n)
    ties = (np.round(x / (scale or 1)) + 0.5) * scale
    x = np.where(k == 0, ties, x)
    x = sprinkle(rng, x.astype(F32), 0.01)
    return x, scale, zp, qmin, qmax


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_fake_quantize_per_tensor_random(dtype):
    rng = np.random.default_rng(10)
    n = 0
    for _ in range(60):
        x, scale, zp, qmin, qmax = _tensor_case(rng, 200)
        x = x.astype(dtype)
        out, mask = T.fake_quantize_per_tensor_affine_cachemask(x, scale, zp, qmin, qmax)
        to, tm = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(tt(x), scale, zp,
                                                                          qmin, qmax)
        same(out, npy(to), f"s={scale} zp={zp} [{qmin},{qmax}]")
        same(mask, npy(tm), "mask")
        same(T.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax), npy(to))
        # tensor-qparams overload with a float zero point (truncated)
        zf = F32(zp + rng.uniform(-0.9, 0.9))
        out2 = T.fake_quantize_per_tensor_affine(x, np.array([scale], F32),
                                                 np.array([zf], F32), qmin, qmax)
        to2 = torch.fake_quantize_per_tensor_affine(tt(x), torch.tensor([scale]),
                                                    torch.tensor([zf]), qmin, qmax)
        same(out2, npy(to2), "tensor qparams")
        n += x.size
    assert n >= 1000


def _channel_case(rng):
    ndim = int(rng.integers(1, 4))
    shape = [int(v) for v in rng.integers(1, 5, ndim)]
    axis = int(rng.integers(0, ndim))
    C = shape[axis] = int(rng.integers(1, 9))
    # int32 ranges: see test_compat_torch_core_gaps.py
    qmin, qmax = [(0, 255), (-128, 127), (0, 15), (-32768, 32767), (0, 4)][
        int(rng.integers(0, 5))]
    scale = (10.0 ** rng.uniform(-5, 1, C)).astype(F32)
    float_zp = rng.random() < 0.5
    if not float_zp:
        zp = rng.integers(max(qmin, -2 ** 24), min(qmax, 2 ** 24) + 1, C).astype(np.int32)
    else:
        # float zero point: torch's kernel fuses x * inv + zp (FMA), the core
        # rounds twice; away from ties and with small ranges they agree (see
        # test_fake_quantize_per_channel_float_zp_fma)
        qmin, qmax = (0, 255) if qmin >= 0 else (-128, 127)
        zp = rng.uniform(qmin - 2, qmax + 2, C).astype(F32)
        if rng.random() < 0.3:
            zp = np.round(zp).astype(F32)
    bshape = [1] * ndim
    bshape[axis] = C
    x = rng.uniform(-1, 1, shape) * (qmax - qmin + 8) * scale.reshape(bshape)
    k = rng.integers(0 if not float_zp else 1, 3, shape)
    ties = (np.round(x / scale.reshape(bshape)) + 0.5) * scale.reshape(bshape)
    x = sprinkle(rng, np.where(k == 0, ties, x).astype(F32), 0.02)
    return x, scale, zp, axis, qmin, qmax


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_fake_quantize_per_channel_random(dtype):
    rng = np.random.default_rng(11)
    n = 0
    for _ in range(300):
        x, scale, zp, axis, qmin, qmax = _channel_case(rng)
        x = x.astype(dtype)
        out, mask = T.fake_quantize_per_channel_affine_cachemask(x, scale, zp, axis, qmin, qmax)
        to, tm = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
            tt(x), tt(scale), tt(zp), axis, qmin, qmax)
        same(out, npy(to), f"axis={axis} zp={zp} [{qmin},{qmax}]")
        same(mask, npy(tm), "mask")
        n += x.size
    assert n >= 1000


# int32-range kernels: see test_compat_torch_core_gaps.py


def test_fake_quantize_per_channel_float_zp_fma():
    x = np.array([[-112.011734]], F32)
    s, z = np.array([0.0058686365], F32), np.array([23491.0], F32)
    out = T.fake_quantize_per_channel_affine(x, s, z, 0, -32768, 32767)
    to = torch.fake_quantize_per_channel_affine(tt(x), tt(s), tt(z), 0, -32768, 32767)
    same(out, npy(to))


def test_fake_quantize_errors():
    x = np.ones((2, 3), F32)
    f, fc = T.fake_quantize_per_tensor_affine, T.fake_quantize_per_channel_affine
    cases = [
        (lambda: f(x, 1.0, 0, 5, 4), lambda: torch.fake_quantize_per_tensor_affine(
            tt(x), 1.0, 0, 5, 4)),
        (lambda: f(x, 1.0, 300, 0, 255), lambda: torch.fake_quantize_per_tensor_affine(
            tt(x), 1.0, 300, 0, 255)),
        (lambda: fc(x, np.ones(3, F32), np.zeros(3, np.int64), 1, 0, 255),
         lambda: torch.fake_quantize_per_channel_affine(tt(x), torch.ones(3),
                                                        torch.zeros(3, dtype=torch.long), 1, 0,
                                                        255)),
        (lambda: fc(x, np.ones(3, F32), np.zeros(3, np.int32), -1, 0, 255),
         lambda: torch.fake_quantize_per_channel_affine(tt(x), torch.ones(3),
                                                        torch.zeros(3, dtype=torch.int), -1, 0,
                                                        255)),
        (lambda: fc(x, np.ones(2, F32), np.zeros(2, np.int32), 1, 0, 255),
         lambda: torch.fake_quantize_per_channel_affine(tt(x), torch.ones(2),
                                                        torch.zeros(2, dtype=torch.int), 1, 0,
                                                        255)),
        (lambda: fc(x, np.ones(3, F32), np.full(3, 300, np.int32), 1, 0, 255),
         lambda: torch.fake_quantize_per_channel_affine(tt(x), torch.ones(3),
                                                        torch.full((3,), 300, dtype=torch.int),
                                                        1, 0, 255)),
        (lambda: fc(x, np.ones(3), np.zeros(3, np.int32), 1, 0, 255),
         lambda: torch.fake_quantize_per_channel_affine(tt(x), torch.ones(3, dtype=torch.double),
                                                        torch.zeros(3, dtype=torch.int), 1, 0,
                                                        255)),
        (lambda: T.fake_quantize_learnable_per_tensor_affine_backward(
            x, x, np.ones(1, F32), np.zeros(1, F32), 1, 5),
         lambda: torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
            tt(x), tt(x), torch.ones(1), torch.zeros(1), 1, 5)),
        (lambda: T.fake_quantize_learnable_per_tensor_affine_backward(
            x.astype(np.float64), x.astype(np.float64), np.ones(1, F32), np.zeros(1, F32), 0, 5),
         lambda: torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
            tt(x).double(), tt(x).double(), torch.ones(1), torch.zeros(1), 0, 5)),
        (lambda: T.fused_moving_avg_obs_fake_quant(
            x.astype(np.float64), np.ones(1), np.ones(1), np.array(np.inf, F32),
            np.array(-np.inf, F32), np.ones(1, F32), np.zeros(1, np.int32), .01, 0, 255, -1),
         lambda: torch.fused_moving_avg_obs_fake_quant(
            tt(x).double(), torch.ones(1, dtype=torch.long), torch.ones(1, dtype=torch.long),
            torch.tensor(np.inf), torch.tensor(-np.inf), torch.ones(1),
            torch.zeros(1, dtype=torch.int), .01, 0, 255, -1)),
    ]
    for ours, theirs in cases:
        with pytest.raises(Exception) as te:
            theirs()
        with pytest.raises(Exception) as oe:
            ours()
        assert _exc_matches(oe.value, te.value), (oe.value, te.value)


# ================================================================ LSQ
def _close_sum(ours, terms_abs, theirs, msg):
    tol = 16 * np.finfo(F32).eps * np.maximum(terms_abs, np.finfo(F32).tiny) + 1e-30
    assert np.all(np.abs(ours.astype(np.float64) - npy(theirs).astype(np.float64)) <= tol) \
        or np.array_equal(ours, npy(theirs), equal_nan=True), f"{msg}: {ours} vs {npy(theirs)}"


def test_learnable_per_tensor_random():
    rng = np.random.default_rng(20)
    n = 0
    for _ in range(40):
        x, scale, _, qmin, qmax = _tensor_case(rng, 100)
        scale = abs(scale) or 0.5
        if not qmin <= 0 <= qmax:
            qmin, qmax = 0, 255
        x = np.nan_to_num(x, nan=0.0, posinf=1e3, neginf=-1e3).astype(F32)
        s = np.array([scale], F32)
        z = np.array([rng.uniform(qmin - 3, qmax + 3)], F32)
        if rng.random() < 0.3:
            z = np.round(z * 2) / 2
        gf = float(rng.choice([1.0, 0.25]))
        same(T.fake_quantize_learnable_per_tensor_affine(x, s, z, qmin, qmax, gf),
             npy(torch._fake_quantize_learnable_per_tensor_affine(tt(x), tt(s), tt(z), qmin,
                                                                  qmax, gf)))
        dy = rng.standard_normal(x.shape).astype(F32)
        dx, ds, dz = T.fake_quantize_learnable_per_tensor_affine_backward(dy, x, s, z, qmin,
                                                                          qmax, gf)
        tdx, tds, tdz = torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
            tt(dy), tt(x), tt(s), tt(z), qmin, qmax, gf)
        same(dx, npy(tdx), "dX")
        mag = np.abs(dy).sum() * (abs(qmax) + abs(qmin) + 2 + scale * 4)
        _close_sum(ds, mag, tds, "dScale")
        _close_sum(dz, mag, tdz, "dZeroPoint")
        n += x.size
    assert n >= 1000


def test_learnable_per_channel_random():
    rng = np.random.default_rng(21)
    n = 0
    for _ in range(150):
        x, scale, zp, axis, qmin, qmax = _channel_case(rng)
        if not qmin <= 0 <= qmax:
            qmin, qmax = 0, 255
        x = np.nan_to_num(x, nan=0.0, posinf=1e3, neginf=-1e3).astype(F32)
        z = zp.astype(F32)
        same(T.fake_quantize_learnable_per_channel_affine(x, scale, z, axis, qmin, qmax),
             npy(torch._fake_quantize_learnable_per_channel_affine(tt(x), tt(scale), tt(z), axis,
                                                                   qmin, qmax)))
        dy = rng.standard_normal(x.shape).astype(F32)
        dx, ds, dz = T.fake_quantize_learnable_per_channel_affine_backward(
            dy, x, scale, z, axis, qmin, qmax)
        tdx, tds, tdz = torch.ops.aten._fake_quantize_learnable_per_channel_affine_backward(
            tt(dy), tt(x), tt(scale), tt(z), axis, qmin, qmax)
        same(dx, npy(tdx), "dX")
        other = tuple(d for d in range(x.ndim) if d != axis)
        mag = np.abs(dy).sum(axis=other) * (abs(qmax) + abs(qmin) + 2 + scale * 4)
        if x.ndim == 1:
            mag = mag.sum()
        _close_sum(ds, mag, tds, "dScale")
        _close_sum(dz, mag, tdz, "dZeroPoint")
        n += x.size
    assert n >= 1000


# ================================================================ fused op
def test_fused_op_random():
    rng = np.random.default_rng(30)
    n = 0
    for trial in range(120):
        per_row = bool(rng.random() < 0.5)
        sym = bool(rng.random() < 0.5)
        qmin, qmax = [(0, 255), (-128, 127), (-127, 127), (0, 15), (-2 ** 31, 2 ** 31 - 1)][
            int(rng.integers(0, 5))]
        if per_row and qmin == -2 ** 31:
            qmin, qmax = -32768, 32767   # int32: see test_compat_torch_core_gaps.py
        c = float(rng.choice([0.01, 0.5, 1.0]))
        shape = [int(v) for v in rng.integers(1, 6, 3)]
        axis = 0 if per_row else -1   # torch: per-row fake quant only on axis 0
        if per_row:
            shape[axis] = 16
        C = shape[axis] if per_row else 1
        ours = [np.array([], F32) if per_row else np.array(np.inf, F32),
                np.array([], F32) if per_row else np.array(-np.inf, F32),
                np.array([1.0], F32), np.array([0], np.int32)]
        theirs = [tt(a.copy()) for a in ours]
        for step in range(4):
            mag = float(10.0 ** rng.uniform(-7, 3))
            x = (nasty(rng, int(np.prod(shape))).reshape(shape) * mag).astype(F32)
            kind = rng.random()
            if kind < 0.1:
                x = sprinkle(rng, x, 0.01)
            elif kind < 0.2:
                x = np.abs(x)
            elif kind < 0.25:
                x = np.zeros_like(x)
            obs_on = np.array([int(rng.random() < 0.85)], np.int64)
            fq_on = np.array([int(rng.random() < 0.85)], np.int64)
            oe = te = None
            try:
                out = T.fused_moving_avg_obs_fake_quant(x, obs_on, fq_on, *ours, c, qmin, qmax,
                                                        axis, per_row, sym)
            except Exception as e:  # noqa: BLE001
                oe = e
            try:
                to = torch.fused_moving_avg_obs_fake_quant(tt(x), tt(obs_on), tt(fq_on),
                                                           *theirs, c, qmin, qmax, axis,
                                                           per_row, sym)
            except Exception as e:  # noqa: BLE001
                te = e
            assert (oe is None) == (te is None), (oe, te)
            if oe is not None:   # e.g. a NaN statistic per row: zero point out of range
                assert _exc_matches(oe, te)
                break
            msg = f"trial {trial} step {step} per_row={per_row} sym={sym} [{qmin},{qmax}]"
            same(out, npy(to), msg + " out")
            if per_row and step == 0 and not fq_on[0]:
                # torch resized scale / zero_point to [C] without writing them
                # (uninitialized memory): take its values to continue
                ours[2], ours[3] = npy(theirs[2]), npy(theirs[3])
            for a, b, name in zip(ours, theirs, ("min", "max", "scale", "zp")):
                if name in ("min", "max"):
                    same_value(a, npy(b), f"{msg} {name}")
                else:
                    same(a, npy(b), f"{msg} {name}")
            n += C
    assert n >= 400


def test_fused_module_and_fake_quantize_modules():
    rng = np.random.default_rng(40)
    factories = ["default_fake_quant", "default_weight_fake_quant", "default_dynamic_fake_quant",
                 "default_per_channel_weight_fake_quant", "default_embedding_fake_quant",
                 "default_embedding_fake_quant_4bit", "default_fused_act_fake_quant",
                 "default_fused_wt_fake_quant", "default_fused_per_channel_wt_fake_quant",
                 "fused_wt_fake_quant_range_neg_127_to_127",
                 "fused_per_channel_wt_fake_quant_range_neg_127_to_127",
                 "default_fixed_qparams_range_neg1to1_fake_quant"]
    n = 0
    for name in factories:
        ours, theirs = getattr(T, name)(), getattr(tfq, name)()
        assert set(ours.state_dict()) == set(theirs.state_dict()), name
        for k, v in theirs.state_dict().items():
            assert ours.state_dict()[k].dtype == npy(v).dtype, (name, k)
        assert (ours.quant_min, ours.quant_max, ours.ch_axis, ours.is_per_channel) == \
            (theirs.quant_min, theirs.quant_max, theirs.ch_axis, theirs.is_per_channel), name
        for step in range(6):
            x = (rng.standard_normal((6, 5)) * 10.0 ** rng.uniform(-3, 2)).astype(F32)
            if step == 2:
                ours.disable_fake_quant()
                theirs.disable_fake_quant()
            if step == 3:
                ours.enable_fake_quant()
                theirs.enable_fake_quant()
                ours.disable_observer()
                theirs.disable_observer()
            if step == 4:
                ours.enable_observer(True)
                theirs.enable_observer(True)
            xt = tt(x).requires_grad_(True)
            out = ours(x)
            to = theirs(xt)
            msg = f"{name} step {step}"
            same(out, npy(to), msg + " out")
            same(ours.scale, npy(theirs.scale), msg + " scale")
            same(ours.zero_point, npy(theirs.zero_point), msg + " zp")
            g = rng.standard_normal(x.shape).astype(F32)
            if to.requires_grad:
                (to * tt(g)).sum().backward()
                same(ours.backward(g), npy(xt.grad), msg + " grad")
            n += x.size
        # state dict round trip into a fresh module, then one more step on both
        sd = {k: npy(v) for k, v in theirs.state_dict().items()}
        fresh = getattr(T, name)()
        fresh.load_state_dict(sd)
        x = rng.standard_normal((6, 5)).astype(F32)
        same(fresh(x), npy(theirs(tt(x))), name + " after load")
    assert n >= 1000


def test_fake_quantize_module_quirks():
    # range checks with iinfo of the dtype; observer may change the range afterwards
    with pytest.raises(ValueError):
        T.FakeQuantize(quant_min=10, quant_max=5)
    with pytest.raises(ValueError):
        T.FakeQuantize(quant_min=-1, quant_max=255)
    with pytest.raises(ValueError):
        T.FakeQuantize(quant_min=0, quant_max=256)
    with pytest.raises(ValueError):
        T.FakeQuantize(observer=T.MovingAverageMinMaxObserver.with_args(dtype="qint8"),
                       quant_min=0, quant_max=255)
    assert T.default_fake_quant().quant_max == 127
    with pytest.raises(ValueError):
        T.FusedMovingAvgObsFakeQuantize(observer=T.MinMaxObserver)
    # uint8 symmetric reduce_range: zp 128 outside (0, 127), used unchecked
    kw = dict(dtype="uint8", qscheme="per_tensor_symmetric", reduce_range=True)
    o = T.FakeQuantize(**kw)
    t = tfq.FakeQuantize(dtype=torch.uint8, qscheme=torch.per_tensor_symmetric,
                         reduce_range=True)
    x = np.array([-1, 2], F32)
    same(o(x), npy(t(tt(x))))
    # empty input: defaults copied (warning), empty output
    o, t = T.FakeQuantize(), tfq.FakeQuantize()
    e = np.zeros((0,), F32)
    same(o(e), npy(t(tt(e))))
    same(o.scale, npy(t.scale))
    # negative ch_axis: per-channel FakeQuantize fails in forward, as torch
    o = T.FakeQuantize(observer=T.MovingAveragePerChannelMinMaxObserver, ch_axis=-1)
    with pytest.raises(ValueError):
        o(np.ones((2, 3), F32))
    flags = T.FusedMovingAvgObsFakeQuantize()
    assert flags.fake_quant_enabled.dtype == np.int64
    assert T.FakeQuantize().fake_quant_enabled.dtype == np.uint8


# ============================================== quirks found in the audit
def test_quirk_plain_state_dict_resets_eps():
    """A state dict without torch's version metadata (a plain dict, an .npz
    or safetensors file) is a version-1 checkpoint: observer eps is reset to
    finfo(float32).eps.  The dict state_dict() returns carries the versions."""
    o, t = T.MinMaxObserver(eps=2 ** -12), tob.MinMaxObserver(eps=2 ** -12)
    sd_o, sd_t = o.state_dict(), t.state_dict()
    assert sd_o._metadata == dict(sd_t._metadata)
    for plain in (dict(sd_o), {k: npy(v) for k, v in sd_t.items()}):
        o2, t2 = T.MinMaxObserver(eps=2 ** -12), tob.MinMaxObserver(eps=2 ** -12)
        o2.load_state_dict(plain)
        t2.load_state_dict({k: tt(v) for k, v in plain.items()})
        assert o2.eps[0] == npy(t2.eps)[0] == F32(2 ** -23)
    o2 = T.MinMaxObserver(eps=2 ** -12)
    o2.load_state_dict(sd_o)
    assert o2.eps[0] == F32(2 ** -12)
    # the eps key is not even required then (torch injects it)
    o2.load_state_dict({"min_val": np.array(np.inf, F32), "max_val": np.array(-np.inf, F32)})
    f = T.default_fused_wt_fake_quant()
    assert set(f.state_dict()._metadata) == set(tfq.default_fused_wt_fake_quant()
                                                .state_dict()._metadata)


def test_quirk_tensor_qparams_item_conversions():
    """The tensor-qparams overload reads scale.item() as float32 and
    zero_point.item() as int32, both checked, the zero point truncated."""
    x = np.array([1.0, -2.0, 7.5], F32)
    for s, z in [(np.array([0.5], F32), np.array([1.7], F32)),
                 (np.array([0.5], F32), np.array([-1.7], F32)),
                 (np.array([0.5], F32), np.array([2.9999999999])),       # float64: 2, not 3
                 (np.array([0.5]), np.array([3], np.int64))]:
        same(T.fake_quantize_per_tensor_affine(x, s, z, 0, 255),
             npy(torch.fake_quantize_per_tensor_affine(tt(x), tt(s), tt(z), 0, 255)), str(z))
    for s, z in [(np.array([0.5], F32), np.array([3e9])),
                 (np.array([0.5], F32), np.array([2147483647.5])),
                 (np.array([0.5], F32), np.array([np.nan], F32)),
                 (np.array([3.5e38]), np.array([0], np.int32)),
                 (np.array([0.5, 1.0], F32), np.array([0], np.int32))]:
        with pytest.raises(RuntimeError):
            torch.fake_quantize_per_tensor_affine(tt(x), tt(s), tt(z), 0, 255)
        with pytest.raises(ValueError):
            T.fake_quantize_per_tensor_affine(x, s, z, 0, 255)


def test_quirk_half_zero_point_is_not_fused():
    """Per channel, a float32 zero point is added with an FMA, a float16 one
    is not: the two round a near-tie differently (torch 2.13 CPU)."""
    x = np.array([[-1.7703315, -1.963849]], F32)
    s = np.array([5.6950394e-05], F32)
    outs = []
    for zdt in (F32, np.float16):
        z = np.array([34660], zdt)
        out = T.fake_quantize_per_channel_affine(x, s, z, 0, 0, 65535)
        same(out, npy(torch.fake_quantize_per_channel_affine(tt(x), tt(s), tt(z), 0, 0, 65535)),
             str(zdt))
        outs.append(out)
    assert not np.array_equal(outs[0], outs[1])


def test_quirk_fused_float64_only_without_observer():
    x = np.linspace(-1, 2, 7)
    for obs_on in (0, 1):
        ours = [np.array(-1.0, F32), np.array(2.0, F32), np.ones(1, F32), np.zeros(1, np.int32)]
        theirs = [tt(a) for a in ours]
        args = (np.array([obs_on]), np.array([1]))
        if obs_on:
            with pytest.raises(RuntimeError):
                torch.fused_moving_avg_obs_fake_quant(tt(x), *map(tt, args), *theirs, .01, 0,
                                                      255, -1)
            with pytest.raises(TypeError):
                T.fused_moving_avg_obs_fake_quant(x, *args, *ours, .01, 0, 255, -1)
        else:
            same(T.fused_moving_avg_obs_fake_quant(x, *args, *ours, .01, 0, 255, -1),
                 npy(torch.fused_moving_avg_obs_fake_quant(tt(x), *map(tt, args), *theirs, .01,
                                                           0, 255, -1)))
            same(ours[2], npy(theirs[2]))


def test_quirk_integer_inputs():
    """Integer input: observers read it as float32, HistogramObserver and the
    fake-quant kernels raise NotImplementedError (no integer kernel)."""
    xi = np.array([-3, 7, 1], np.int32)
    o, t = T.MinMaxObserver(), tob.MinMaxObserver()
    o(xi)
    t(tt(xi))
    same_value(o.min_val, npy(t.min_val))
    for ours, theirs in [
            (lambda: T.HistogramObserver()(xi), lambda: tob.HistogramObserver()(tt(xi))),
            (lambda: T.fake_quantize_per_tensor_affine(xi, 1.0, 0, 0, 255),
             lambda: torch.fake_quantize_per_tensor_affine(tt(xi), 1.0, 0, 0, 255)),
            (lambda: T.fake_quantize_per_channel_affine(xi[None], np.ones(1, F32),
                                                        np.zeros(1, np.int32), 0, 0, 255),
             lambda: torch.fake_quantize_per_channel_affine(
                 tt(xi[None]), torch.ones(1), torch.zeros(1, dtype=torch.int), 0, 0, 255))]:
        with pytest.raises(NotImplementedError):
            theirs()
        with pytest.raises(NotImplementedError):
            ours()


def test_quirk_lsq_backward_broadcasts_x_and_dy():
    x = np.linspace(-1, 3, 6, dtype=F32).reshape(1, 6)
    dy = np.arange(6, dtype=F32)
    s, z = np.array([0.5], F32), np.array([1.0], F32)
    o = T.fake_quantize_learnable_per_tensor_affine_backward(dy, x, s, z, 0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward(
            tt(dy), tt(x), tt(s), tt(z), 0, 4)
    same(o[0], npy(t[0]))
    with pytest.raises(ValueError):
        T.fake_quantize_learnable_per_tensor_affine_backward(dy.reshape(2, 3), x.reshape(3, 2),
                                                             s, z, 0, 4)
