"""numpy / cupy parity of the public API, as a rule: every case runs once
with numpy arrays and once with cupy arrays (a real GPU, or the CUDA
emulator of ``tests/cudaemu`` under ``make gpu-emu-test``), and the results
must be cupy arrays with the numpy run's bits (raw bits everywhere; NaN
lanes NaN in both).  Each case runs with the 32- and 64-bit index
instantiations and with a 1-SM and a 132-SM launch shape.
"""
import warnings

import numpy as np
import pytest

import quantcore as qc
from quantcore import ops
import quantcore_gpu
from quantcore.observers import ObserverBase
from reference import assert_bits_equal

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON))]


def _data():
    rng = np.random.default_rng(2024)
    x = rng.normal(0, 3, size=(5, 17, 23)).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97] = np.nan
    flat[5::101] = np.inf
    flat[6::103] = -np.inf
    flat[7::89] = -0.0
    flat[8::91] = 0.0
    flat[11::13] = np.round(flat[11::13] * 20) / 20 + 0.025   # ties of scale 0.05
    flat[3::57] = 1e30
    flat[4::59] = np.float32(2.0 ** -140)                      # subnormal
    return x


X = _data()
LAYOUTS = {
    "C": lambda a: a,
    "F": np.asfortranarray,
    "strided": lambda a: a[:, ::2, :],
    "reversed": lambda a: a[::-1, :, ::-1],
}


def _ch(x, axis):
    return x.shape[axis]


def _scales(n, lo=0.01, hi=0.2):
    return np.linspace(lo, hi, n).astype(np.float32)


# name -> f(xp, x): the public call, given the array module and the input
CASES = {
    "minmax": lambda xp, x: qc.minmax(x),
    "minmax_axis0": lambda xp, x: qc.minmax(x, axis=0),
    "minmax_axis1": lambda xp, x: qc.minmax(x, axis=1),
    "minmax_axis2_omit": lambda xp, x: qc.minmax(x, axis=2, nan_policy="omit"),
    "minmax_omit": lambda xp, x: qc.minmax(x, nan_policy="omit"),
    "fake_quant": lambda xp, x: qc.fake_quant(x, 0.05, 3, -128, 127),
    "fake_quant_half_away_div": lambda xp, x: qc.fake_quant(
        x, 0.05, 0, 0, 255, rounding="half_away", scale_op="div"),
    "fake_quant_zp_before": lambda xp, x: qc.fake_quant(
        x, 0.07, 2.5, -128, 127, zero_point_add="before_rounding"),
    "fake_quant_nan_to_qmin": lambda xp, x: qc.fake_quant(x, 0.05, 0, -8, 7,
                                                          nonfinite="nan_to_qmin"),
    "fake_quant_int64": lambda xp, x: qc.fake_quant(x, 0.05, 0, -8, 7, nonfinite="int64"),
    "fake_quant_axis1": lambda xp, x: qc.fake_quant(
        x, xp.asarray(_scales(_ch(x, 1))), 0, -8, 7, axis=1),
    "fake_quant_axis2_zp": lambda xp, x: qc.fake_quant(
        x, xp.asarray(_scales(_ch(x, 2))), xp.asarray(np.arange(_ch(x, 2)) % 5), 0, 255, axis=2),
    "fake_quant_axis0_scalar": lambda xp, x: qc.fake_quant(x, 0.1, 1, -128, 127, axis=0),
    "with_mask": lambda xp, x: qc.fake_quant_with_mask(x, 0.05, 0, 0, 255),
    "with_mask_axis1": lambda xp, x: qc.fake_quant_with_mask(
        x, xp.asarray(_scales(_ch(x, 1))), 0, -128, 127, axis=1),
    "quantize": lambda xp, x: qc.quantize(x, 0.05, 0, -128, 127),
    "quantize_axis2": lambda xp, x: qc.quantize(
        x, xp.asarray(_scales(_ch(x, 2))), 0, 0, 15, axis=2),
    "dequantize": lambda xp, x: qc.dequantize(
        qc.quantize(x, 0.05, 0, -128, 127), 0.05, 0),
    "nudged": lambda xp, x: qc.fake_quant_nudged(
        x, *qc.qparams.nudge_tensorflow(-2, 2, 0, 255)[:3]),
    "nudged_axis1": lambda xp, x: qc.fake_quant_nudged(
        x, *[xp.asarray(p) for p in qc.qparams.nudge_tensorflow(
            -_scales(_ch(x, 1), 1, 4), _scales(_ch(x, 1), 1, 3), 0, 255)[:3]], axis=1),
    "amax": lambda xp, x: qc.fake_quant_amax(x, 2.0, 4),
    "amax_unsigned": lambda xp, x: qc.fake_quant_amax(abs(x), 2.0, 8, unsigned=True),
    "amax_axis2": lambda xp, x: qc.fake_quant_amax(
        x, xp.asarray(_scales(_ch(x, 2), 0.5, 3)), 8, axis=2),
    "ste_backward": lambda xp, x: qc.ste_backward(
        xp.ones(x.shape, x.dtype), qc.fake_quant_with_mask(x, 0.05, 0, 0, 255)[1]),
    "ste_backward_packed": lambda xp, x: qc.ste_backward(
        xp.ones(x.shape, x.dtype), xp.packbits(
            qc.fake_quant_with_mask(x, 0.05, 0, 0, 255)[1].ravel(), bitorder="little")),
    "out_given": lambda xp, x: _returns_out(
        xp, lambda out: qc.fake_quant(x, 0.05, 0, -128, 127, out=out), xp.empty_like(x)),
    "out_is_x": lambda xp, x: _returns_out(
        xp, lambda out: qc.fake_quant(out, 0.05, 0, -128, 127, out=out), x.copy()),
    "mask_out_axis0": lambda xp, x: qc.fake_quant_with_mask(
        x, xp.asarray(_scales(_ch(x, 0))), 0, -128, 127, axis=0, out=xp.empty_like(x)),
}

# every rounding mode the library has (ops.ROUNDING, from the extension's
# table): a new mode gets GPU parity coverage with no edit here
CASES.update({f"fake_quant_{r}": (lambda r: lambda xp, x: qc.fake_quant(
    x, 0.05, 3, -128, 127, rounding=r))(r) for r in ops.ROUNDING})


# the low-precision formats (quantcore.formats)
CASES.update({
    "cast_fp8": lambda xp, x: qc.cast_fp8(x),
    "cast_fp8_e5m2_nonsat": lambda xp, x: qc.cast_fp8(x, "e5m2", overflow="nonsat",
                                                      nan="ml_dtypes"),
    "fp8_decode_fnuz": lambda xp, x: qc.fp8_decode(qc.cast_fp8(x, "e4m3fnuz"), "e4m3fnuz"),
    "fp8_fake_cast_mask": lambda xp, x: qc.fp8_fake_cast(x, "e5m2", return_mask=True),
    "fp8_fake_quant_modelopt": lambda xp, x: qc.fp8_fake_quant(x, 3.0, return_mask=True),
    "fp8_fake_quant_torchao_axis0": lambda xp, x: qc.fp8_fake_quant(
        xp.nan_to_num(x), recipe="torchao", pow2=True, axis=0),
    "fp8_quantize_axis2": lambda xp, x: qc.fp8_quantize(xp.nan_to_num(x), axis=2),
    "quantize_linear_int8": lambda xp, x: qc.quantize_linear(x, 0.05, np.int8(3)),
    "quantize_linear_fp8_axis1": lambda xp, x: qc.quantize_linear(
        x, _scales(_ch(x, 1)), axis=1, output="float8_e4m3fn"),
    "qdq_linear_int4_blocked": lambda xp, x: qc.dequantize_linear(qc.quantize_linear(
        x, np.full(x.shape[:2] + (3,), 0.25, np.float32), axis=2, block_size=8, output="int4"),
        np.full(x.shape[:2] + (3,), 0.25, np.float32), axis=2, block_size=8, input="int4"),
    "group_quantize_onnx": lambda xp, x: qc.group_quantize(xp.nan_to_num(x), 4, 8),
    "group_quantize_onnx_f16": lambda xp, x: qc.group_quantize(
        xp.nan_to_num(x).astype(np.float16), 4, 8),
    "group_quantize_torchao_sym_axis0": lambda xp, x: qc.group_quantize(
        xp.nan_to_num(x), 4, 5, axis=0, recipe="torchao", symmetric=True),
    "group_fake_quant_awq_axis0": lambda xp, x: qc.group_fake_quant(
        xp.nan_to_num(x), 4, 5, axis=0, recipe="awq", return_mask=True),
    "group_dequantize_tinygemm": lambda xp, x: qc.group_dequantize(
        *qc.group_quantize(xp.nan_to_num(x), 4, 5, axis=0, recipe="tinygemm"), 5, axis=0,
        recipe="tinygemm"),
    "pack_int4": lambda xp, x: qc.pack_int4(qc.group_quantize(xp.nan_to_num(x), 4, 8)[0]),
    # block-scaled formats (quantcore.mx)
    "mx_quantize_e2m1_axis1": lambda xp, x: qc.mx_quantize(x, "e2m1", axis=1, block_size=4),
    "mx_fake_quant_int8_rceil": lambda xp, x: qc.mx_fake_quant(x, "int8", block_size=8,
                                                              scale_mode="rceil"),
    "nvfp4_quantize_torchao": lambda xp, x: qc.nvfp4_quantize(x, recipe="torchao")[:2],
    # torchao's special blocks: +-Inf and a -NaN beside a NaN (issue 27)
    "mx_quantize_torchao_nan_inf_block": lambda xp, x: qc.mx_quantize(
        _nan_inf_block(xp, x), "e2m3", block_size=8, compat="torchao"),
    "mx_quantize_torchao_nan_inf_block_e2m1": lambda xp, x: qc.mx_quantize(
        _nan_inf_block(xp, x), "e2m1", block_size=8, compat="torchao", scale_mode="even"),
    "nvfp4_quantize_torchao_nan_block": lambda xp, x: qc.nvfp4_quantize(
        _nan_inf_block(xp, x), recipe="torchao")[:2],
    # ONNX FLOAT4E2M1 (NaN codes by ml_dtypes' rule, -0 -> +0 with a zero point)
    "quantize_linear_fp4": lambda xp, x: qc.quantize_linear(x, 0.25, output="float4_e2m1fn"),
    "quantize_linear_fp4_zp_axis1": lambda xp, x: qc.quantize_linear(
        x, _scales(_ch(x, 1)), np.zeros(_ch(x, 1), __import__("ml_dtypes").float4_e2m1fn),
        axis=1),
    "qdq_linear_uint2_blocked": lambda xp, x: qc.dequantize_linear(qc.quantize_linear(
        x, np.full(x.shape[:2] + (3,), 0.25, np.float32), axis=2, block_size=8, output="uint2"),
        np.full(x.shape[:2] + (3,), 0.25, np.float32), axis=2, block_size=8, input="uint2"),
    "group_quantize_hqq_axis0": lambda xp, x: qc.group_quantize(xp.nan_to_num(x), 4, 5, axis=0,
                                                               recipe="hqq"),
    "nvfp4_fake_quant_modelopt": lambda xp, x: qc.nvfp4_fake_quant(xp.nan_to_num(x)),
})
# every FP8 format of the table (formats.FP8_FORMATS): a new format gets its
# encode / decode parity case with no edit here
CASES.update({f"fp8_cast_decode_{f}": (lambda f: lambda xp, x: qc.fp8_decode(
    qc.cast_fp8(x, f, overflow="nonsat", nan="ml_dtypes"), f))(f) for f in qc.formats.FP8_FORMATS})


def _nan_inf_block(xp, x):
    """x with +NaN, +-Inf and -NaN at the start of the last axis's first block."""
    y = x.copy()
    y[..., :4] = xp.asarray(np.array([np.nan, np.inf, -np.inf, -np.nan], np.float32))
    return y


def _returns_out(xp, call, out):
    """call(out), checking that the result is ``out`` itself."""
    res = call(out)
    assert res is out
    return res


def _same(gpu, cpu, what):
    if isinstance(cpu, tuple):
        assert isinstance(gpu, tuple) and len(gpu) == len(cpu), what
        for i, (g, c) in enumerate(zip(gpu, cpu)):
            _same(g, c, f"{what}[{i}]")
        return
    assert isinstance(gpu, cp.ndarray), f"{what}: {type(gpu).__name__} from cupy input"
    assert isinstance(cpu, np.ndarray), f"{what}: {type(cpu).__name__} from numpy input"
    assert_bits_equal(gpu, cpu, what)


@pytest.fixture(params=[1, 132], ids=["1sm", "132sm"])
def sm_count(request, monkeypatch):
    """Launch shapes for a 1-SM and a 132-SM (H100) device."""
    from quantcore_gpu import kernels as G
    monkeypatch.setitem(G._device_info, G._device_id(), request.param)
    return request.param



@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_public_api_parity(name, layout, index64, sm_count):
    x = LAYOUTS[layout](X)
    case = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = case(np, x)
        got = case(cp, cp.asarray(x))
    _same(got, expected, f"{name} [{layout}]")


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("name", ["minmax_axis1", "fake_quant", "fake_quant_axis1", "with_mask",
                                  "quantize", "nudged", "amax_axis2"])
def test_public_api_parity_other_dtypes(name, dtype, sm_count):
    with np.errstate(over="ignore"):   # 1e30 is inf in float16: a case of its own
        x = X.astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = CASES[name](np, x)
        got = CASES[name](cp, cp.asarray(x))
    _same(got, expected, f"{name} {np.dtype(dtype).name}")


@pytest.mark.parametrize("observer", ["minmax", "moving_average"])
@pytest.mark.parametrize("axis", [None, 1, 2])
@pytest.mark.parametrize("symmetric", [False, True])
def test_fake_quantize_parity(observer, axis, symmetric, index64, sm_count):
    """A training run of FakeQuantize (with a skipped NaN batch, a switch
    to eval and a backward) on numpy and on cupy batches."""
    def make():
        obs = (qc.MinMaxObserver(axis=axis) if observer == "minmax"
               else qc.MovingAverageMinMaxObserver(0.25, axis=axis))
        return qc.FakeQuantize(obs, -128, 127, symmetric=symmetric, axis=axis)
    host, dev = make(), make()
    rng = np.random.default_rng(5)
    for step in range(5):
        x = (rng.normal(size=(4, 9, 6)) * (1 + step)).astype(np.float32)
        if step == 2:
            x[1, 2, 3] = np.nan
        if step == 4:
            host.eval()
            dev.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = host(x)
        got = dev(cp.asarray(x))
        _same(got, expected, f"step {step}")
        g = rng.normal(size=x.shape).astype(np.float32)
        _same(dev.backward(cp.asarray(g)), host.backward(g), f"backward {step}")
    assert_bits_equal(dev.scale, host.scale)
    assert np.array_equal(dev.zero_point, host.zero_point)
    for name in ("min_val", "max_val"):
        assert_bits_equal(getattr(dev.observer, name), getattr(host.observer, name), name)
    assert (dev.observer.num_batches, dev.observer.nonfinite_batches) == \
        (host.observer.num_batches, host.observer.nonfinite_batches)


#: every observer class of quantcore.observers (its registry: a new class
#: gets its parity case without an edit here)
OBSERVERS = sorted(ObserverBase.REGISTRY)


@pytest.mark.parametrize("cls", OBSERVERS)
@pytest.mark.parametrize("axis", [None, 0])
def test_observer_parity(cls, axis):
    kwargs = {"num_channels": 6} if cls == "EMAMinMaxObserver" and axis is not None else {}
    host = ObserverBase.REGISTRY[cls](axis=axis, **kwargs)
    dev = ObserverBase.REGISTRY[cls](axis=axis, **kwargs)
    rng = np.random.default_rng(3)
    for step in range(3):
        x = rng.normal(size=(6, 10)).astype(np.float32) * (step + 1)
        host.update(x)
        dev.update(cp.asarray(x))
    for name in ("min_val", "max_val"):
        assert_bits_equal(getattr(dev, name), getattr(host, name), name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for a, b in zip(dev.calculate_qparams(-128, 127), host.calculate_qparams(-128, 127)):
            assert_bits_equal(a, b)


def test_torch_cuda_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    t = torch.randn(64, 33, device="cuda")
    y = qc.fake_quant(t, 0.05, 0, -128, 127)
    assert isinstance(y, torch.Tensor) and y.is_cuda
    assert torch.equal(y.cpu(), qc.fake_quant(t.cpu(), 0.05, 0, -128, 127))


def test_errors_are_the_host_paths_word_for_word():
    """Bad input on the device gets the CPU path's error, type and text."""
    calls = [
        lambda xp, x: qc.fake_quant(x, 0.0, 0, -128, 127),
        lambda xp, x: qc.fake_quant(x, 0.1, 300, -128, 127),
        lambda xp, x: qc.fake_quant(x, 0.1, 0, 5, 5),
        lambda xp, x: qc.fake_quant(x, xp.asarray(np.ones(3)), 0, -128, 127, axis=1),
        lambda xp, x: qc.fake_quant(x, 0.1, 0, -128, 127, axis=7),
        lambda xp, x: qc.fake_quant(x, 0.1, 0, -128, 127, rounding="nearest"),
        lambda xp, x: qc.fake_quant(x, 0.1, 0, -128, 127, out=xp.empty((2, 2), np.float32)),
        lambda xp, x: qc.fake_quant(x, 0.1, 0, -128, 127, out=xp.empty(x.shape, np.float64)),
        lambda xp, x: qc.fake_quant(xp.zeros(x.shape, np.int32), 0.1, 0, -128, 127),
        lambda xp, x: qc.minmax(x, nan_policy="drop"),
        lambda xp, x: qc.fake_quant_amax(x, -1.0, 8),
        lambda xp, x: qc.ste_backward(x, xp.ones(3, np.uint8)),
        lambda xp, x: qc.dequantize(x, -0.1, 0),
        lambda xp, x: qc.dequantize(x.astype(np.complex64), 0.1, 0),
    ]
    for i, call in enumerate(calls):
        errors = []
        for xp in (np, cp):
            with pytest.raises((TypeError, ValueError)) as err:
                call(xp, xp.asarray(X))
            errors.append((type(err.value), str(err.value)))
        assert errors[0] == errors[1], f"call {i}: {errors}"
