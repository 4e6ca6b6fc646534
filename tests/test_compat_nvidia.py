"""quantcore.compat.nvidia: NVIDIA pytorch_quantization semantics.

Every vector of the project's NVIDIA / Horizon specification sections 1-4 is a test here; the
randomized cases compare against the float32 emulation below, written from
the spec independently of quantcore's kernels, and (``test_live_*``, skipped
without torch / scipy) against PQ's CPU code paths written with torch ops:
``_tensor_quant``, the histogram collection with ``histc`` / ``linspace`` /
``arange`` growth over several batches, and the percentile / entropy
(scipy's KL) / mse searches.
"""
import logging

import numpy as np
import pytest
try:
    import yaml
except ImportError:  # PyYAML is an optional extra of quantcore.compat.nvidia
    yaml = None
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.compat import nvidia as nv
from quantcore.compat.nvidia import (HistogramCalibrator, MaxCalibrator, QuantDescriptor,
                                     ScaledQuantDescriptor, TensorQuantizer,
                                     fake_affine_tensor_quant, fake_affine_tensor_quant_backward,
                                     fake_tensor_quant, fake_tensor_quant_backward, tensor_quant)
from reference import assert_bits_equal

F32 = np.float32
needs_yaml = pytest.mark.skipif(yaml is None, reason="PyYAML (the 'nvidia' extra) not installed")


# --------------------------------------------------------------- reference
def ref_tensor_quant(x, amax, num_bits=8, unsigned=False, narrow_range=True, dtype=F32):
    """PQ's _tensor_quant emulated in ``dtype``: one rounding per operation."""
    t = np.dtype(dtype).type
    x = np.asarray(x, dtype=dtype)
    a = np.asarray(amax, dtype=dtype)
    max_bound = t(2.0 ** (num_bits - 1 + int(unsigned)) - 1.0)
    min_bound = t(0) if unsigned else (-max_bound if narrow_range else -max_bound - t(1))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = np.asarray(max_bound / a, dtype=dtype)
        tiny = a <= t(2.0 ** -24)
        scale = np.where(tiny, t(0), scale).astype(dtype)
        prod = np.asarray(x * scale, dtype=dtype)
        q = np.rint(prod)
        q = np.where(q < min_bound, min_bound, np.where(q > max_bound, max_bound, q)).astype(dtype)
        scale = np.where(tiny, t(1), scale).astype(dtype)
        fake = np.asarray(q / scale, dtype=dtype)
    return q, scale, fake


def ref_affine(x, lo, hi, num_bits=8):
    x = np.asarray(x, F32)
    lo, hi = F32(lo), F32(hi)
    step = F32(F32(hi - lo) / F32(2.0 ** num_bits - 1))
    min_bound, max_bound = F32(-2.0 ** (num_bits - 1)), F32(2.0 ** (num_bits - 1) - 1)
    qz = F32(np.rint(F32(lo / step)) - min_bound)
    q = (np.rint((x / step).astype(F32)) - qz).astype(F32)
    q = np.clip(q, min_bound, max_bound).astype(F32)
    return ((q + qz).astype(F32) * step).astype(F32)


assert_bits = assert_bits_equal  # (NaN lanes: both NaN)


# ------------------------------------------------------- spec §2 vectors
X_SPEC = np.array([-1.5, -1.0, -0.003937, -0.0039371, 0.5 / 127, 1.5 / 127, 2.5 / 127, 0.3, 1.0,
                   1.2, -1.2], dtype=F32)


def test_spec_narrow_true():
    q, scale = tensor_quant(X_SPEC, F32(1.0))
    assert q.tolist() == [-127, -127, 0, -1, 0, 2, 2, 38, 127, 127, -127]
    assert np.signbit(q[2])  # -0.003937 rounds to -0.0
    assert scale.dtype == F32 and scale.shape == () and float(scale) == 127.0
    fake = fake_tensor_quant(X_SPEC, F32(1.0))
    assert float(fake[7]) == 0.29921260476112366
    assert_bits(fake, (q / F32(127)).astype(F32))


def test_spec_narrow_false():
    q, _ = tensor_quant(X_SPEC, F32(1.0), narrow_range=False)
    assert q.tolist() == [-128, -127, 0, -1, 0, 2, 2, 38, 127, 127, -128]
    fake = fake_tensor_quant(X_SPEC, F32(1.0), narrow_range=False)
    assert float(fake[0]) == -1.0078740119934082


def test_spec_ties_to_even():
    x = np.array([0.5, 1.5, 2.5, -2.5, 126.5, -127.5], F32)
    q, scale = tensor_quant(x, F32(127), narrow_range=False)
    assert float(scale) == 1.0
    assert q.tolist() == [0, 2, 2, -2, 126, -128]


def test_spec_unsigned():
    x = np.array([0, 0.5, 1, 2, 127.5 / 255], F32)
    q, scale = tensor_quant(x, F32(1), unsigned=True)
    assert q.tolist() == [0, 128, 255, 255, 128] and float(scale) == 255.0
    fake = fake_tensor_quant(x, F32(1), unsigned=True)
    assert fake.tolist() == [0, 0.501960813999176, 1, 1, 0.501960813999176]


def test_spec_4bit():
    x = np.array([-1, -0.9, 0.07, 0.5, 1], F32)
    q, _ = tensor_quant(x, F32(1), num_bits=4, narrow_range=False)
    assert q.tolist() == [-7, -6, 0, 4, 7]


@pytest.mark.parametrize("amax", [0.0, 2.0 ** -24, 1e-8])
def test_spec_tiny_amax(amax):
    x = np.array([-1.0, 0.5, 3.0], F32)
    q, scale = tensor_quant(x, F32(amax))
    assert (q == 0).all() and float(scale) == 1.0
    assert (fake_tensor_quant(x, F32(amax)) == 0).all()


def test_spec_amax_just_above_eps():
    amax = F32(2.0 ** -24 * (1 + 1e-7))
    _, scale = tensor_quant(np.array([1e-9], F32), amax)
    assert float(scale) == 2130706176.0


def test_spec_per_channel():
    w = (np.arange(-6, 6, dtype=F32) / 4).reshape(3, 4)
    amax = np.array([[0.5], [1], [2]], F32)
    q, scale = tensor_quant(w, amax)
    assert scale.shape == (3, 1) and scale.ravel().tolist() == [254, 127, 63.5]
    assert q.tolist() == [[-127] * 4, [-64, -32, 0, 32], [32, 48, 64, 79]]
    fake = fake_tensor_quant(w, amax)
    assert fake[2].tolist() == [0.5039370059967041, 0.7559055089950562, 1.0078740119934082,
                                1.2440944910049438]
    assert np.isclose(fake[2], [0.50393700599, 0.75590550899, 1.00787401199,
                                1.24409449100], rtol=0, atol=1e-10).all()


def test_spec_gradient():
    x = np.array([-1.5, -1, -0.99, 0, 1, 1.0001, 2], F32)
    g = fake_tensor_quant_backward(np.ones_like(x), x, F32(1))
    assert g.tolist() == [0, 1, 1, 1, 1, 0, 0]
    # a select as PQ's torch.where: +0.0 and NaN blocked where |x| > amax
    g = fake_tensor_quant_backward(-np.ones_like(x) * np.array([1, 1, 1, 1, 1, np.nan, 1], F32),
                                   x, F32(1))
    assert_bits(g, np.array([0, -1, -1, -1, -1, 0, 0], F32))
    g = fake_affine_tensor_quant_backward(np.array([-1.0, np.nan, -2.0], F32),
                                          np.array([-3.0, 5.0, 0.5], F32), F32(-1), F32(1))
    assert_bits(g, np.array([0, 0, -2], F32))


def test_errors():
    with pytest.raises(TypeError, match="^Negative values encountered in unsigned quantization.$"):
        fake_tensor_quant(np.array([-1.0, 1.0], F32), F32(1), unsigned=True)
    with pytest.raises(ValueError, match="^Negative values in amax$"):
        tensor_quant(np.array([1.0], F32), np.array([1.0, -1.0], F32))
    # PQ checks unsigned first
    with pytest.raises(TypeError):
        fake_tensor_quant(np.array([-1.0], F32), F32(-1), unsigned=True)
    with pytest.raises(ValueError, match="num_bits"):
        fake_tensor_quant(np.ones(2, F32), F32(1), num_bits=17)
    with pytest.raises(ValueError, match="broadcast"):
        fake_tensor_quant(np.ones((3, 4), F32), np.ones((2, 1), F32))


def test_fp16_scale_too_large():
    with pytest.raises(ValueError, match="scale is too large for FP16"):
        tensor_quant(np.ones(3, np.float16), F32(1e-3))


# --------------------------------------------------- randomized vs reference
def _random_case(rng):
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(s) for s in rng.integers(1, 6, size=ndim))
    num_bits = int(rng.integers(2, 17))
    unsigned = bool(rng.integers(0, 2))
    narrow = bool(rng.integers(0, 2))
    kind = rng.integers(0, 4)
    if kind == 0:                                   # per tensor
        amax_shape = ()
    elif kind == 1:                                 # keep-dims per channel
        amax_shape = [1] * ndim
        ax = int(rng.integers(0, ndim))
        amax_shape[ax] = shape[ax]
        amax_shape = tuple(amax_shape)
    elif kind == 2:                                 # trailing (C,)
        amax_shape = (shape[-1],)
    else:                                           # several non-1 axes
        amax_shape = tuple(s if rng.integers(0, 2) else 1 for s in shape)
    amax = (rng.random(amax_shape) * 4).astype(F32)
    amax = np.where(rng.random(amax_shape) < 0.1, F32(2.0 ** -25), amax).astype(F32)
    scale = (F32(2.0 ** (num_bits - 1 + unsigned) - 1) / np.maximum(amax, F32(1e-3))).astype(F32)
    x = (rng.standard_normal(shape) * 2).astype(F32)
    # a third of the values sit exactly on .5 ties of x * scale
    k = rng.integers(-40, 40, size=shape).astype(F32) + F32(0.5)
    ties = (k / np.broadcast_to(scale, shape)).astype(F32)
    x = np.where(rng.random(shape) < 0.3, ties, x).astype(F32)
    if unsigned:
        x = np.abs(x)
    return x, amax, num_bits, unsigned, narrow


def test_random_against_reference():
    rng = np.random.default_rng(2024)
    for _ in range(300):
        x, amax, nb, unsigned, narrow = _random_case(rng)
        q_ref, s_ref, f_ref = ref_tensor_quant(x, amax, nb, unsigned, narrow)
        q, s = tensor_quant(x, amax, nb, unsigned, narrow)
        assert_bits(q, q_ref)
        assert_bits(s, s_ref)
        assert_bits(fake_tensor_quant(x, amax, nb, unsigned, narrow), f_ref)
        g = rng.standard_normal(f_ref.shape).astype(F32)
        # PQ's torch.where(|x| <= amax, g, 0): +0.0 where blocked
        expect = np.where(np.abs(x) <= amax, g, F32(0))
        assert_bits(fake_tensor_quant_backward(g, x, amax), expect)


@settings(max_examples=150)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=40),
       st.floats(0, 1e3, width=32), st.integers(2, 16), st.booleans())
def test_hypothesis_per_tensor(values, amax, num_bits, narrow):
    x = np.array(values, F32)
    _, _, f_ref = ref_tensor_quant(x, F32(amax), num_bits, False, narrow)
    assert_bits(fake_tensor_quant(x, F32(amax), num_bits, False, narrow), f_ref)


def test_float16_computed_in_float32():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(500).astype(np.float16)
    _, _, f_ref = ref_tensor_quant(x.astype(F32), F32(0.7))
    out = fake_tensor_quant(x, F32(0.7))
    assert out.dtype == np.float16
    assert_bits(out, f_ref.astype(np.float16))
    assert float(fake_tensor_quant(np.array([0.5], np.float16), F32(0.7))[0]) == 0.50146484375


def test_float64_computed_in_float64():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 5))
    amax = np.array([[0.5], [1.0], [2.0], [3.0]])
    q_ref, s_ref, f_ref = ref_tensor_quant(x, amax, dtype=np.float64)
    q, s = tensor_quant(x, amax)
    assert_bits(q, q_ref)
    assert_bits(s, s_ref)
    assert_bits(fake_tensor_quant(x, amax), f_ref)


def test_nan_and_inf_inputs():
    x = np.array([np.nan, np.inf, -np.inf, 0.5], F32)
    q_ref, _, f_ref = ref_tensor_quant(x, F32(1))
    assert_bits(fake_tensor_quant(x, F32(1)), f_ref)
    assert_bits(tensor_quant(x, F32(1))[0], q_ref)
    assert fake_tensor_quant_backward(np.ones(4, F32), x, F32(1)).tolist() == [0, 0, 0, 1]


def test_amax_broadcast_bigger_than_input():
    x = np.array([0.25, -0.5], F32)
    amax = np.array([[1.0], [0.5]], F32)
    q_ref, s_ref, f_ref = ref_tensor_quant(x, amax)
    assert_bits(fake_tensor_quant(x, amax), f_ref)
    assert_bits(tensor_quant(x, amax)[0], q_ref)


def test_fake_affine_against_reference():
    rng = np.random.default_rng(3)
    for _ in range(100):
        nb = int(rng.integers(2, 9))
        lo = F32(-rng.random() * 3)
        hi = F32(rng.random() * 3 + 0.01)
        x = (rng.standard_normal(50) * 2).astype(F32)
        step = F32(F32(hi - lo) / F32(2.0 ** nb - 1))
        x[:10] = ((rng.integers(-20, 20, 10) + F32(0.5)) * step).astype(F32)
        assert_bits(fake_affine_tensor_quant(x, lo, hi, nb), ref_affine(x, lo, hi, nb))
        g = rng.standard_normal(50).astype(F32)
        assert_bits(fake_affine_tensor_quant_backward(g, x, lo, hi),
                    np.where((x >= lo) & (x <= hi), g, F32(0)))


def test_fake_affine_rejects_per_channel_range():
    with pytest.raises(ValueError, match="single values"):
        fake_affine_tensor_quant(np.ones(3, F32), np.zeros(2, F32), np.ones(2, F32))


# ------------------------------------------------------ §1 descriptor
def test_descriptor_defaults_and_properties():
    d = QuantDescriptor()
    assert QuantDescriptor is ScaledQuantDescriptor
    assert (d.num_bits, d.name, d.fake_quant, d.axis, d.amax, d.learn_amax, d.scale_amax,
            d.calib_method, d.unsigned, d.narrow_range) == (8, None, True, None, None, False,
                                                            None, "max", False, False)
    assert d.dict() == {"num_bits": 8, "name": None}
    for name in ("num_bits", "name", "fake_quant", "axis", "amax", "learn_amax", "scale_amax",
                 "calib_method", "unsigned", "narrow_range"):
        with pytest.raises(AttributeError):
            setattr(d, name, 1)


SPEC_DESC = dict(num_bits=4, name="w", fake_quant=False, axis=(0,), amax=[1.0, 2.5],
                 scale_amax=2.0, unsigned=True)


def test_descriptor_spec_example():
    d = QuantDescriptor(**SPEC_DESC)
    assert d.dict() == {"num_bits": 4, "name": "w", "fake_quant": False, "axis": (0,),
                        "amax": [1.0, 2.5], "scale_amax": 2.0, "unsigned": True}


@needs_yaml
def test_descriptor_spec_example_yaml():
    d = QuantDescriptor(**SPEC_DESC)
    assert d.to_yaml() == ("amax:\n- 1.0\n- 2.5\naxis:\n- 0\nfake_quant: false\nname: w\n"
                           "num_bits: 4\nscale_amax: 2.0\nunsigned: true\n")
    back = QuantDescriptor.from_yaml(d.to_yaml())
    assert back.dict() == d.dict()
    assert back.amax.dtype == F32 and back.amax.tolist() == [1.0, 2.5]


def test_descriptor_str():
    d = QuantDescriptor(name="n", amax=1.0, learn_amax=True, scale_amax=2.0, unsigned=True)
    assert str(d) == ("n: (unsigned 8bit fake axis= per-tensor amax=1.0 full_range learn_amax "
                      "scale_amax=2.0)")
    assert str(QuantDescriptor()).startswith("QuantDescriptor(")
    assert (str(QuantDescriptor(fake_quant=False, axis=(0,)))
            == "QuantDescriptor(8bit real axis=(0,))")


def test_descriptor_amax_storage():
    d = QuantDescriptor(amax=0.1)
    assert d.amax.dtype == F32 and d.amax.shape == ()
    assert d.dict()["amax"] == 0.10000000149011612
    assert QuantDescriptor(amax=np.array([1.0, 2.0])).amax.dtype == F32
    with pytest.raises(TypeError, match="^amax must be float, list or ndarray, not <class 'int'>$"):
        QuantDescriptor(amax=1)


def test_descriptor_num_bits_validation(caplog):
    with pytest.raises(ValueError, match=r"^num_bits must be > 0, not -1\.$"):
        QuantDescriptor(num_bits=-1)
    for bad in (8.0, [4, 3], (5, 2)):
        with pytest.raises(TypeError, match=r"^num_bits must be a postive integer or tuple "
                                            r"\(4,3\), not <class '\w+'>\.$"):
            QuantDescriptor(num_bits=bad)
    assert QuantDescriptor(num_bits=True).num_bits is True
    assert QuantDescriptor(num_bits=(4, 3)).num_bits == (4, 3)
    with caplog.at_level(logging.ERROR, logger="quantcore.compat.nvidia"):
        assert QuantDescriptor(num_bits=0).num_bits == 0
    assert "num_bits is 0" in caplog.text


def test_descriptor_other_validation():
    with pytest.raises(TypeError, match="^name must be a string or None, not <class 'int'>.$"):
        QuantDescriptor(name=3)
    with pytest.raises(TypeError, match="^axis is ignored and must be None when learn_amax is "
                                        "true, got <class 'tuple'>.$"):
        QuantDescriptor(learn_amax=True, axis=(0,))
    with pytest.raises(TypeError, match=r"^Unused keys: dict_keys\(\['foo'\]\)$"):
        QuantDescriptor(foo=1)
    assert QuantDescriptor(axis="x").axis == "x"               # axis is not checked
    assert QuantDescriptor(calib_method="bogus").calib_method == "bogus"
    assert QuantDescriptor(axis=(0)).axis == 0


def test_descriptor_eq():
    assert QuantDescriptor(amax=1.0, axis=(0,)) == QuantDescriptor(amax=1.0, axis=(0,))
    assert not QuantDescriptor(num_bits=4) == QuantDescriptor(num_bits=8)
    assert QuantDescriptor(narrow_range=True) != QuantDescriptor()
    with pytest.raises(ValueError):
        QuantDescriptor(amax=[1.0, 2.0]) == QuantDescriptor(amax=[1.0, 2.0])


@needs_yaml
def test_yaml_special_cases():
    with pytest.raises(TypeError, match="'int' object is not iterable"):
        QuantDescriptor(axis=0).to_yaml()
    text = QuantDescriptor(num_bits=(4, 3)).to_yaml()
    assert "!!python/tuple" in text
    with pytest.raises(yaml.constructor.ConstructorError):
        QuantDescriptor.from_yaml(text)
    # calib_method and narrow_range are not serialized: a round trip resets them
    d = QuantDescriptor(calib_method="histogram", narrow_range=True, amax=2.0)
    back = QuantDescriptor.from_yaml(d.to_yaml())
    assert back.calib_method == "max" and back.narrow_range is False
    assert float(back.amax) == 2.0 and back.amax.shape == ()
    assert QuantDescriptor.from_yaml(QuantDescriptor().to_yaml()) == QuantDescriptor()


@needs_yaml
def test_yaml_random_round_trips():
    rng = np.random.default_rng(11)
    for _ in range(60):
        kw = {}
        if rng.random() < 0.5:
            kw["fake_quant"] = False
        if rng.random() < 0.5:
            kw["unsigned"] = True
        if rng.random() < 0.4:
            kw["scale_amax"] = float(rng.random() * 4)
        if rng.random() < 0.3:
            kw["learn_amax"] = True
        elif rng.random() < 0.5:
            kw["axis"] = tuple(int(a) for a in rng.choice(4, size=int(rng.integers(1, 3)),
                                                          replace=False))
        r = rng.random()
        if r < 0.3:
            kw["amax"] = float(rng.random() * 10)
        elif r < 0.6:
            kw["amax"] = [float(v) for v in rng.random(int(rng.integers(1, 5))) * 10]
        name = None if rng.random() < 0.3 else f"q{int(rng.integers(100))}"
        d = QuantDescriptor(num_bits=int(rng.integers(1, 17)), name=name, **kw)
        text = d.to_yaml()
        assert list(yaml.safe_load(text)) == sorted(d.dict())
        back = QuantDescriptor.from_yaml(text)
        assert back.dict() == d.dict()
        assert back.to_yaml() == text
        if d.amax is not None:
            assert_bits(back.amax, d.amax)


def test_predefined_descriptors():
    assert nv.QUANT_DESC_8BIT_PER_TENSOR == QuantDescriptor(num_bits=8)
    assert nv.QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned is True
    for name in ("CONV1D", "CONV2D", "CONV3D"):
        assert getattr(nv, f"QUANT_DESC_8BIT_{name}_WEIGHT_PER_CHANNEL").axis == 0
    assert nv.QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW.axis == 0
    for name in ("CONVTRANSPOSE1D", "CONVTRANSPOSE2D", "CONVTRANSPOSE3D"):
        assert getattr(nv, f"QUANT_DESC_8BIT_{name}_WEIGHT_PER_CHANNEL").axis == 1


# ----------------------------------------------------- §3 calibrators
def _calib_batches():
    k = (np.arange(200) * 37) % 101 - 50
    b1 = (k.astype(np.float64) ** 3 / 50 ** 3 * 1.25).astype(F32)
    b2 = np.array([2.0, -0.25, 0.1, 0.0], F32)
    return b1, b2


def test_spec_histogram_calibrator():
    b1, b2 = _calib_batches()
    calib = HistogramCalibrator(4, None, False, num_bins=32)
    calib.collect(b1)
    assert float(calib.bin_edges[-1]) == 1.25
    assert calib.hist.tolist() == [61, 16, 12, 7, 8, 8, 8, 4, 4, 4, 8, 4, 4, 0, 4, 4, 4, 4, 4,
                                   0, 4, 4, 0, 4, 4, 0, 4, 0, 4, 0, 4, 4]
    calib.collect(b2)
    assert calib.num_bins == 52 and len(calib.bin_edges) == 53
    assert float(calib.bin_edges[-1]) == 2.03125
    h = calib.hist
    assert h[:8].tolist() == [62, 16, 13, 7, 8, 8, 9, 4] and h[51] == 1
    assert float(calib.compute_amax("percentile", percentile=90)) == 0.9375
    assert float(calib.compute_amax("percentile", percentile=99.99)) == 1.9921875
    assert float(calib.compute_amax("entropy", start_bin=8)) == 1.25
    assert float(calib.compute_amax("mse", start_bin=8)) == 1.66015625
    with pytest.raises(TypeError, match="Unknown calibration method"):
        calib.compute_amax("bogus")
    with pytest.raises(ValueError, match="Invalid percentile"):
        calib.compute_amax("percentile", percentile=101)


def test_spec_max_calibrator():
    b1, b2 = _calib_batches()
    calib = MaxCalibrator(4, None, False)
    assert calib.compute_amax() is None
    calib.collect(b1)
    calib.collect(b2)
    amax = calib.compute_amax()
    assert amax.shape == () and float(amax) == 2.0


def test_max_calibrator_axes_and_shape_change():
    rng = np.random.default_rng(1)
    c = MaxCalibrator(8, 0, False, track_amax=True)
    batches = [rng.standard_normal((2, 2)).astype(F32) for _ in range(3)]
    for b in batches:
        c.collect(b)
    expect = np.max([np.abs(b).max(axis=1, keepdims=True) for b in batches], axis=0)
    assert c.compute_amax().shape == (2, 1)
    assert_bits(c.compute_amax(), expect.astype(F32))
    assert len(c.amaxs) == 3
    with pytest.raises(RuntimeError, match="^amax shape changed!$"):
        c.collect(np.ones((3, 2), F32))
    c3 = MaxCalibrator(8, (1,), False)
    c3.collect(np.ones((2, 3, 4), F32))
    assert c3.compute_amax().shape == (1, 3, 1)
    c.reset()
    assert c.compute_amax() is None
    assert MaxCalibrator(num_bits=(4, 3)).num_bits == (4, 3)


def test_histogram_calibrator_axis_not_supported():
    with pytest.raises(NotImplementedError, match="only supports per tensor scaling"):
        HistogramCalibrator(8, 0, False)


def test_calibration_through_tensor_quantizer():
    b1, b2 = _calib_batches()
    tq = TensorQuantizer(QuantDescriptor(num_bits=4, calib_method="histogram"))
    assert isinstance(tq._calibrator, HistogramCalibrator) and tq._calibrator.num_bins == 2048
    tq._calibrator = HistogramCalibrator(4, None, False, num_bins=32)  # the spec's bins
    tq.disable_quant()
    tq.enable_calib()
    assert tq(b1) is not None
    tq(b2)
    tq.load_calib_amax("percentile", percentile=99.99)
    assert float(tq.amax) == 1.9921875
    tq.load_calib_amax("mse", start_bin=8)
    assert float(tq.amax) == 1.66015625
    tq.disable_calib()
    tq.enable_quant()
    x = np.array([-2.0, 0.4, 1.0], F32)
    assert_bits(tq(x), ref_tensor_quant(x, F32(1.66015625), 4, narrow_range=False)[2])

    tqm = TensorQuantizer(QuantDescriptor(axis=(0,)), if_quant=False, if_calib=True)
    w = np.array([[1.0, -3.0], [0.5, 0.25]], F32)
    tqm(w)
    tqm(w * F32(0.5))
    tqm.load_calib_amax()
    assert tqm.amax.shape == (2, 1) and tqm.amax.ravel().tolist() == [3.0, 0.5]


# ------------------------------------------------ §4 TensorQuantizer
def test_spec_tensor_quantizer_example():
    tq = TensorQuantizer(QuantDescriptor(amax=1.0))
    out = tq(np.array([-2, -1, 0.3, 1], F32))
    assert out.tolist() == [-1.0078740119934082, -1.0, 0.29921260476112366, 1.0]
    assert tq.amax.dtype == F32 and float(tq.amax) == 1.0


def test_real_quant_is_always_narrow():
    tq = TensorQuantizer(QuantDescriptor(amax=1.0, fake_quant=False, narrow_range=False))
    assert tq._scale is None
    q = tq(np.array([-2, -1, 0.3, 1], F32))
    assert q.tolist() == [-127, -127, 38, 127]
    assert float(tq.scale) == 127.0


def test_dynamic_amax():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4)).astype(F32)
    tq = TensorQuantizer()
    assert tq.amax is None
    assert_bits(tq(x), ref_tensor_quant(x, np.abs(x).max(), narrow_range=False)[2])
    tqc = TensorQuantizer(QuantDescriptor(axis=(0,)))
    amax = np.abs(x).max(axis=1, keepdims=True)
    assert_bits(tqc(x), ref_tensor_quant(x, amax, narrow_range=False)[2])
    # negative axes count from the end, as in MaxCalibrator (the seed page's
    # range [-rank, rank)): axis=(-1,) keeps one amax per column
    for axis in ((-1,), -1, (1,)):
        tqn = TensorQuantizer(QuantDescriptor(axis=axis))
        amax = np.abs(x).max(axis=0, keepdims=True)
        assert_bits(tqn(x), ref_tensor_quant(x, amax, narrow_range=False)[2])
        calib = MaxCalibrator(axis=axis)
        calib.collect(x)
        assert_bits(calib.compute_amax(), amax)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        TensorQuantizer(QuantDescriptor(axis=(2,)))(x)
    with pytest.raises(ValueError, match="axis -3 is out of range"):
        MaxCalibrator(axis=-3).collect(x)
    # scale_amax
    tqs = TensorQuantizer(QuantDescriptor(scale_amax=0.5))
    assert_bits(tqs(x), ref_tensor_quant(x, np.abs(x).max() * F32(0.5), narrow_range=False)[2])
    assert tq.amax is None  # dynamic amax is never stored


def test_switches():
    x = np.array([-2.0, 0.3], F32)
    tq = TensorQuantizer(QuantDescriptor(amax=1.0))
    tq.disable()
    assert tq(x) is x
    tq.enable()
    tq.disable_quant()
    assert_bits(tq(x), x)
    tq.enable_quant()
    assert tq(x).tolist()[0] == -1.0078740119934082
    with pytest.raises(ValueError, match="^learn_amax is False. Cannot enable clip.$"):
        tq.enable_clip()
    tq2 = TensorQuantizer(QuantDescriptor(), disabled=True)
    assert tq2(x) is x
    assert "disabled" in repr(tq2)


def test_load_calib_amax_errors():
    tq = TensorQuantizer(QuantDescriptor(calib_method="bogus"))
    with pytest.raises(RuntimeError, match="^Calibrator not created.$"):
        tq.load_calib_amax()
    with pytest.raises(AttributeError):
        tq.enable_calib()
    tq = TensorQuantizer()
    with pytest.raises(RuntimeError, match="Calibrator returned None"):
        tq.load_calib_amax()
    tq.load_calib_amax(strict=False)
    assert np.isnan(tq.amax) and tq.amax.shape == ()
    with pytest.raises(NotImplementedError):
        TensorQuantizer(QuantDescriptor(axis=0, calib_method="histogram"))


def test_amax_setter():
    tq = TensorQuantizer()
    tq.amax = None
    assert tq.amax is None
    tq.amax = [1.0, 2.0]
    assert tq.amax.dtype == F32 and tq.amax.tolist() == [1.0, 2.0]
    buf = tq.amax
    tq.amax = [3.0, 4.0]
    assert buf.tolist() == [3.0, 4.0]  # copied into the buffer
    with pytest.raises(RuntimeError, match="^Changing shape when setting amax is not allowed.$"):
        tq.amax = 1.0
    assert TensorQuantizer(QuantDescriptor(amax=2.0)).step_size == F32(2.0) / F32(127)


def test_learn_amax_clip_forward():
    tq = TensorQuantizer(QuantDescriptor(amax=1.0, learn_amax=True))
    assert tq._if_clip
    x = np.array([-2.0, -1.0, 0.3, 1.5], F32)
    out = tq(x)
    assert_bits(out, ref_tensor_quant(np.clip(x, -1, 1), F32(1), narrow_range=False)[2])
    tq.disable_quant()
    assert tq(x).tolist() == [-1.0, -1.0, np.float32(0.3), 1.0]
    tq.disable_clip()
    assert_bits(tq(x), x)
    with pytest.raises(ValueError, match="must be scalar"):
        TensorQuantizer(QuantDescriptor(amax=[1.0, 2.0], learn_amax=True))
    tq_default = TensorQuantizer(QuantDescriptor(learn_amax=True))
    assert float(tq_default.clip.clip_value_max) == 1.0


def test_e4m3_not_supported():
    tq = TensorQuantizer(QuantDescriptor(num_bits=(4, 3)))
    with pytest.raises(NotImplementedError, match="E4M3"):
        tq(np.ones(3, F32))


# ----------------------------------------------------------------- module
def test_module_doctests():
    import doctest
    res = doctest.testmod(nv, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


@needs_yaml
def test_yaml_is_imported_lazily():
    import subprocess
    import sys
    code = ("import sys, quantcore.compat.nvidia as nv; assert 'yaml' not in sys.modules; "
            "nv.QuantDescriptor().to_yaml(); assert 'yaml' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_pyyaml_only_yaml_methods_fail():
    import subprocess
    import sys
    code = ("import sys; sys.modules['yaml'] = None\n"
            "import numpy as np, quantcore.compat.nvidia as nv\n"
            "d = nv.QuantDescriptor(amax=1.0)\n"
            "assert d.dict() == {'num_bits': 8, 'name': None, 'amax': 1.0}\n"
            "assert nv.fake_tensor_quant(np.float32([0.5]), np.float32(1))[0] > 0\n"
            "for call in (d.to_yaml, lambda: nv.QuantDescriptor.from_yaml('num_bits: 8')):\n"
            "    try:\n"
            "        call()\n"
            "    except ImportError as exc:\n"
            "        assert 'PyYAML' in str(exc), exc\n"
            "    else:\n"
            "        raise AssertionError('no ImportError')\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------- live torch / scipy oracles
# PQ's CPU code paths written here with torch (and scipy for the entropy's
# KL, as PQ); skipped without torch / scipy.
@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def pq_tensor_quant_torch(torch, x, amax, num_bits=8, unsigned=False, narrow_range=True):
    """PQ's legacy ``_tensor_quant`` (spec §2 steps 1-8) with torch float32
    ops: ``(q, scale, fake)`` as numpy."""
    xt = torch.from_numpy(np.ascontiguousarray(x))
    at = torch.from_numpy(np.array(amax, dtype=F32))
    max_bound = torch.tensor(2.0 ** (num_bits - 1 + int(unsigned)) - 1.0)
    if unsigned:
        min_bound = torch.tensor(0.0)
    elif narrow_range:
        min_bound = -max_bound
    else:
        min_bound = -max_bound - 1
    scale = max_bound / at
    eps = torch.tensor(2.0 ** -24)
    tiny = at <= eps
    scale = torch.where(tiny, torch.zeros_like(scale), scale)
    q = torch.clamp(torch.round(xt * scale), min_bound, max_bound)
    scale = torch.where(tiny, torch.ones_like(scale), scale)
    return q.numpy(), scale.numpy(), (q / scale).numpy()


def test_live_torch_tensor_quant(torch):
    rng = np.random.default_rng(99)
    for _ in range(200):
        x, amax, nb, unsigned, narrow = _random_case(rng)
        q_t, s_t, f_t = pq_tensor_quant_torch(torch, x, amax, nb, unsigned, narrow)
        q, s = tensor_quant(x, amax, nb, unsigned, narrow)
        assert_bits(q, q_t.astype(F32))
        assert_bits(s, s_t.reshape(s.shape))
        assert_bits(fake_tensor_quant(x, amax, nb, unsigned, narrow), f_t)
        # clipped STE, PQ's torch.where(|x| <= amax, g, zero), bit for bit
        g = rng.standard_normal(f_t.shape).astype(F32)
        g[rng.random(g.shape) < 0.05] = np.nan
        xt, gt = torch.from_numpy(np.abs(x)), torch.from_numpy(g)
        g_t = torch.where(xt <= torch.from_numpy(amax), gt, gt.new_zeros(1)).numpy()
        assert_bits(fake_tensor_quant_backward(g, x, amax), g_t)
    # float16 input: modelopt's order (float32 math, one cast at the end)
    x16 = (rng.standard_normal(300) * 2).astype(np.float16)
    _, _, f_t = pq_tensor_quant_torch(torch, x16.astype(F32), F32(0.7))
    assert_bits(fake_tensor_quant(x16, F32(0.7)), f_t.astype(np.float16))


def pq_hist_collect_torch(torch, batches, num_bins, skip_zeros):
    """PQ's ``HistogramCalibrator.collect`` (torch_hist=True) with torch ops."""
    hist = edges = None
    for b in batches:
        x = torch.from_numpy(b)
        if x.min() < 0:
            x = x.abs()
        x = x.float()
        if skip_zeros:
            x = x[x != 0]
        xm = x.max()
        if hist is None:
            hist = torch.histc(x, bins=num_bins, min=0, max=xm.item())
            edges = torch.linspace(0, xm.item(), num_bins + 1)
            continue
        if xm > edges[-1]:
            w = edges[1] - edges[0]
            num_bins = int(torch.ceil(xm / w).item())
            edges = torch.arange(0, xm + w, w)
        h = torch.histc(x, bins=num_bins, min=0, max=edges[-1].item())
        h[:hist.numel()] += hist
        hist = h
    return hist.int().numpy(), edges.numpy(), num_bins


def ref_percentile(hist, edges, p):
    cdf = np.cumsum(hist / hist.sum())
    return edges[np.searchsorted(cdf, p / 100)]


def ref_entropy(hist, edges, num_bits, unsigned, stride, start_bin):
    """TensorRT-style KL search (spec §3), with scipy's KL."""
    from scipy.stats import entropy
    bins = hist.astype(np.int64).copy()
    bins[0] = bins[1]
    total = bins.sum()
    nq = 2 ** (num_bits - 1 + int(unsigned))
    divergences = []
    for i in range(start_bin, len(bins) + 1, stride):
        group = np.digitize(np.arange(i), np.linspace(0, i, nq + 1)) - 1
        head = bins[:i]
        full = head != 0
        gsum = np.zeros(nq + 1)
        gcnt = np.zeros(nq + 1)
        np.add.at(gsum, group[full], head[full])
        np.add.at(gcnt, group[full], 1)
        q = np.where(full, gsum[group] / np.maximum(gcnt[group], 1), 0.0)
        p = head.copy()
        p[-1] += bins[i:].sum()
        assert round(q.sum() + bins[i:].sum()) == total and round(p.sum()) == total
        divergences.append(entropy(p, q))
    divergences = np.array(divergences)
    k = len(divergences) - 1 - int(np.argmin(divergences[::-1]))
    return edges[k * stride + start_bin]


def ref_mse(torch, hist, edges, num_bits, unsigned, stride, start_bin):
    counts = torch.from_numpy(hist).float()
    e = torch.from_numpy(edges).float()
    centers = (e[1:] + e[:-1]) / 2
    mses, args = [], []
    for i in range(start_bin, len(centers), stride):
        _, _, qc = pq_tensor_quant_torch(torch, centers.numpy(), centers[i].numpy(), num_bits,
                                         unsigned, True)
        mses.append(((torch.from_numpy(qc) - centers) ** 2 * counts).mean().item())
        args.append(i)
    return centers[args[int(np.argmin(np.array(mses, dtype=F32)))]].numpy()


@pytest.mark.parametrize("seed", range(24))
def test_live_histogram_calibrator_multi_batch(torch, seed):
    """Random multi-batch collections (growth, skip_zeros, unsigned, 4..8
    bits) against PQ's collect in torch and the three amax searches."""
    pytest.importorskip("scipy")
    rng = np.random.default_rng(300 + seed)
    num_bins = int(rng.choice([16, 32, 64, 128]))
    nb = int(rng.integers(4, 9))
    unsigned = bool(rng.integers(2))
    skip_zeros = bool(rng.integers(2))
    batches = []
    for _ in range(int(rng.integers(2, 5))):
        b = (rng.standard_normal(int(rng.integers(20, 300))) * rng.uniform(0.2, 3)).astype(F32)
        b[rng.random(b.size) < 0.1] = 0
        b[0] = F32(rng.uniform(0.1, 4))  # some nonzero value in every batch
        if unsigned:
            b = np.abs(b)
        batches.append(b)
    calib = HistogramCalibrator(nb, None, unsigned, num_bins=num_bins, skip_zeros=skip_zeros)
    for b in batches:
        calib.collect(b)
    hist, edges, nbins = pq_hist_collect_torch(torch, batches, num_bins, skip_zeros)
    assert calib.num_bins == nbins
    assert np.array_equal(calib.hist, hist)
    assert_bits(np.asarray(calib.bin_edges, F32), edges)
    for p in (50.0, 90.0, 99.0, 99.99, 100.0):
        amax = calib.compute_amax("percentile", percentile=p)
        assert amax.shape == () and amax.dtype == F32
        assert_bits(amax, ref_percentile(hist, edges, p))
    stride = int(rng.integers(1, 4))
    start_bin = int(rng.integers(2, num_bins // 2 + 1))
    assert_bits(calib.compute_amax("entropy", stride=stride, start_bin=start_bin),
                ref_entropy(hist, edges, nb, unsigned, stride, start_bin))
    assert_bits(calib.compute_amax("mse", stride=stride, start_bin=start_bin),
                ref_mse(torch, hist, edges, nb, unsigned, stride, start_bin))


def test_entropy_needs_no_scipy():
    import subprocess
    import sys
    code = ("import sys; sys.modules['scipy'] = None\n"
            "import numpy as np\n"
            "from quantcore.compat.nvidia import HistogramCalibrator\n"
            "k = (np.arange(200) * 37) % 101 - 50\n"
            "c = HistogramCalibrator(4, None, False, num_bins=32)\n"
            "c.collect((k.astype(np.float64) ** 3 / 50 ** 3 * 1.25).astype(np.float32))\n"
            "c.collect(np.array([2.0, -0.25, 0.1, 0.0], np.float32))\n"
            "assert float(c.compute_amax('entropy', start_bin=8)) == 1.25\n")
    subprocess.run([sys.executable, "-c", code], check=True)
