"""quantcore.torch: outputs and ``.grad`` bit-equal to torch's own autograd
of the same ops and modules on the same inputs (torch 2.13 CPU)."""
import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.ao.quantization import fake_quantize as tfq  # noqa: E402
from torch.ao.quantization import observer as tob  # noqa: E402

import quantcore.torch as QT  # noqa: E402

from reference import assert_bits_equal  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Please use quant_min and quant_max:UserWarning")


def same(a, b, msg=""):
    """Tensors (or None) with the same dtype, shape and bits."""
    assert (a is None) == (b is None), msg
    if a is None:
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (msg, a.dtype, b.dtype, a.shape, b.shape)
    assert_bits_equal(a.detach().numpy(), b.detach().numpy(), msg)


def nasty(rng, shape, scale):
    """Values around the grid (ties), beyond the range, and specials."""
    x = (rng.integers(-300, 300, size=shape) * 0.5 * scale).astype(np.float32)
    x += (rng.random(shape) < 0.5) * rng.normal(size=shape).astype(np.float32) * scale
    flat = x.reshape(-1)
    flat[:: 97] = np.nan
    flat[5 :: 101] = np.inf
    flat[7 :: 103] = -np.inf
    flat[11 :: 89] = -0.0
    return x


def grads(rng, shape):
    g = rng.normal(size=shape).astype(np.float32)
    g.reshape(-1)[3 :: 53] = np.nan  # NaN * 0 stays NaN where the mask is 0
    return torch.from_numpy(g)


def run_both(ours, theirs, inputs, g):
    """Forward + backward(g) of the same leaf copies through both; returns
    ((y, grads...) ours, (y, grads...) torch)."""
    results = []
    for fn in (ours, theirs):
        leaves = [t.detach().clone().requires_grad_(t.dtype.is_floating_point) for t in inputs]
        y = fn(*leaves)
        y.backward(g)
        results.append((y,) + tuple(t.grad for t in leaves))
    return results


# ------------------------------------------------------------ STE ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_per_tensor_matches_torch_autograd(dtype):
    rng = np.random.default_rng(1)
    for k, (qmin, qmax) in enumerate([(0, 255), (-128, 127), (-2 ** 31, 2 ** 31 - 1)]):
        scale = float(2.0 ** -k * 0.037)
        zp = int(rng.integers(qmin, qmax)) if qmax < 2 ** 20 else 12345
        x = torch.from_numpy(nasty(rng, (33, 17), scale)).to(dtype)
        g = grads(rng, x.shape).to(dtype)
        for tensor_qparams in (False, True):
            s, z = (torch.tensor([scale]), torch.tensor([zp], dtype=torch.int32)) \
                if tensor_qparams else (scale, zp)
            ours, theirs = run_both(
                lambda v: QT.fake_quantize_per_tensor_affine(v, s, z, qmin, qmax),
                lambda v: torch.fake_quantize_per_tensor_affine(v, s, z, qmin, qmax), [x], g)
            same(ours[0], theirs[0], f"out {dtype} {qmin}")
            same(ours[1], theirs[1], f"grad {dtype} {qmin}")


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("zp_dtype", [torch.int32, torch.float32])
def test_per_channel_matches_torch_autograd(axis, zp_dtype):
    rng = np.random.default_rng(2 + axis)
    shape = (5, 6, 7)
    c = shape[axis]
    scale = torch.from_numpy((rng.random(c) * 0.1 + 0.01).astype(np.float32))
    zp = torch.from_numpy(rng.integers(-20, 20, size=c)).to(zp_dtype)
    x = torch.from_numpy(nasty(rng, shape, 0.05))
    g = grads(rng, shape)
    ours, theirs = run_both(
        lambda v: QT.fake_quantize_per_channel_affine(v, scale, zp, axis, -128, 127),
        lambda v: torch.fake_quantize_per_channel_affine(v, scale, zp, axis, -128, 127), [x], g)
    same(ours[0], theirs[0], "out")
    same(ours[1], theirs[1], "grad")


# ------------------------------------------------------------ LSQ ops
@pytest.mark.parametrize("shape,transpose", [((40, 30), False), ((300, 200), False),
                                             ((64, 48), True)])
def test_learnable_per_tensor_matches_torch_autograd(shape, transpose):
    """dX, dScale and dZeroPoint bit for bit, also for 60 000 elements
    (torch's multi-threaded sum) and a transposed (non-contiguous) x."""
    rng = np.random.default_rng(3)
    for qmin, qmax, gf in ((0, 255, 1.0), (-128, 127, 0.37)):
        x = torch.from_numpy(rng.normal(size=shape).astype(np.float32) * 3)
        if transpose:
            x = x.t()
        x.reshape(-1)[::37] = 0.0625  # ties
        scale = torch.tensor([0.0625])
        zp = torch.tensor([float(rng.integers(qmin, qmax)) + 0.3])
        g = torch.from_numpy(rng.normal(size=x.shape).astype(np.float32))
        ours, theirs = run_both(
            lambda v, s, z: QT.fake_quantize_learnable_per_tensor_affine(v, s, z, qmin, qmax,
                                                                         gf),
            lambda v, s, z: torch._fake_quantize_learnable_per_tensor_affine(v, s, z, qmin,
                                                                            qmax, gf),
            [x, scale, zp], g)
        for name, a, b in zip(("out", "dX", "dScale", "dZeroPoint"), ours, theirs):
            same(a, b, f"{name} {shape} {qmin}")


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_learnable_per_channel_matches_torch_autograd(axis):
    rng = np.random.default_rng(4 + axis)
    shape = (6, 40, 9)
    c = shape[axis]
    x = torch.from_numpy(rng.normal(size=shape).astype(np.float32) * 2)
    scale = torch.from_numpy((rng.random(c) * 0.05 + 0.01).astype(np.float32))
    zp = torch.from_numpy(rng.integers(-5, 5, size=c).astype(np.float32) + 0.4)
    g = torch.from_numpy(rng.normal(size=shape).astype(np.float32))
    ours, theirs = run_both(
        lambda v, s, z: QT.fake_quantize_learnable_per_channel_affine(v, s, z, axis, -128, 127,
                                                                      0.5),
        lambda v, s, z: torch._fake_quantize_learnable_per_channel_affine(v, s, z, axis, -128,
                                                                         127, 0.5),
        [x, scale, zp], g)
    for name, a, b in zip(("out", "dX", "dScale", "dZeroPoint"), ours, theirs):
        same(a, b, f"{name} axis={axis}")


def test_errors_are_torchs():
    x = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError):
        torch.fake_quantize_per_tensor_affine(x, 0.1, 0, 5, 3)
    with pytest.raises(RuntimeError):
        QT.fake_quantize_per_tensor_affine(x, 0.1, 0, 5, 3)


# ------------------------------------------------------------ modules
MODULES = [
    ("FakeQuantize", lambda m: m.FakeQuantize()),
    ("FakeQuantize per channel, torch observer class", lambda m: m.FakeQuantize(
        observer=tob.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=1)),
    ("default_weight_fake_quant", lambda m: (
        m.FakeQuantize.with_args(observer=tob.MovingAverageMinMaxObserver, quant_min=-128,
                                 quant_max=127, dtype=torch.qint8,
                                 qscheme=torch.per_tensor_symmetric) if m is QT
        else tfq.default_weight_fake_quant)()),
    ("torch observer partial", lambda m: m.FakeQuantize(
        observer=tob.MovingAverageMinMaxObserver.with_args(averaging_constant=0.5),
        quant_min=0, quant_max=127)),
    ("histogram observer (own class)", lambda m: m.FakeQuantize(
        observer=(QT.HistogramObserver if m is QT else tob.HistogramObserver).with_args(bins=64),
        quant_min=0, quant_max=255)),
    ("FusedMovingAvgObsFakeQuantize", lambda m: m.FusedMovingAvgObsFakeQuantize()),
    ("FusedMovingAvgObsFakeQuantize per channel", lambda m: m.FusedMovingAvgObsFakeQuantize(
        observer=tob.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0)),
    ("FixedQParamsFakeQuantize", lambda m: m.FixedQParamsFakeQuantize(
        (QT.FixedQParamsObserver if m is QT else tob.FixedQParamsObserver).with_args(
            scale=1 / 64, zero_point=128))),
]


def _torch_module():
    class M:
        FakeQuantize = tfq.FakeQuantize
        FusedMovingAvgObsFakeQuantize = tfq.FusedMovingAvgObsFakeQuantize
        FixedQParamsFakeQuantize = tfq.FixedQParamsFakeQuantize
    return M


@pytest.mark.parametrize("case", range(len(MODULES)), ids=[m[0] for m in MODULES])
def test_modules_train_like_torch(case):
    """A Linear followed by the fake-quantize module, a few SGD steps with
    the switches toggled: outputs, gradients, weights and state dicts equal
    torch's module, bit for bit."""
    name, make = MODULES[case]
    torch.manual_seed(case)
    models = []
    for m in (QT, _torch_module()):
        torch.manual_seed(case)
        models.append(torch.nn.Sequential(torch.nn.Linear(12, 6), make(m)))
    ours, theirs = models
    assert isinstance(ours[1], tfq.FakeQuantizeBase)
    opts = [torch.optim.SGD(mod.parameters(), lr=0.1) for mod in models]
    rng = np.random.default_rng(case)
    for step in range(5):
        if step == 2:
            for mod in models:
                mod.apply(torch.ao.quantization.disable_observer)
        if step == 3:
            for mod in models:
                mod.apply(torch.ao.quantization.disable_fake_quant)
        if step == 4:
            for mod in models:
                mod.apply(torch.ao.quantization.enable_fake_quant)
        x = torch.from_numpy(rng.normal(size=(9, 12)).astype(np.float32) * (step + 1))
        outs = []
        for mod, opt in zip(models, opts):
            opt.zero_grad()
            y = mod(x)
            (y * torch.arange(6.0)).sum().backward()
            outs.append((y, mod[0].weight.grad.clone()))
            opt.step()
        same(outs[0][0], outs[1][0], f"{name} step {step} output")
        same(outs[0][1], outs[1][1], f"{name} step {step} weight grad")
    sd_o, sd_t = ours.state_dict(), theirs.state_dict()
    assert list(sd_o) == list(sd_t) and sd_o._metadata == sd_t._metadata
    for key in sd_t:
        same(sd_o[key], sd_t[key], f"{name} {key}")
    # torch's state dict loads into ours and back
    fresh = torch.nn.Sequential(torch.nn.Linear(12, 6), make(QT))
    fresh.load_state_dict(theirs.state_dict())
    for key, value in fresh.state_dict().items():
        same(value, sd_t[key], f"{name} loaded {key}")


def test_module_state_is_shared_and_loads_in_place():
    fq = QT.FakeQuantize()
    x = torch.randn(20)
    fq(x)
    scale, sd = fq.scale, fq.state_dict()
    assert scale.data_ptr() == sd["scale"].data_ptr() == fq.impl.scale.ctypes.data
    fq(x * 3)
    assert_bits_equal(scale.numpy(), fq.impl.scale)  # the held tensor sees the update
    plain = {k: v.clone() * 2 if v.is_floating_point() else v.clone() for k, v in sd.items()}
    plain["activation_post_process.eps"] = torch.tensor([0.5])
    ref = tfq.FakeQuantize()
    ref.load_state_dict(plain)
    fq.load_state_dict(plain)  # a plain dict: version-less observer, eps reset as in torch
    same(fq.activation_post_process.eps, ref.activation_post_process.eps)
    assert float(fq.activation_post_process.eps) != 0.5
    same(scale, ref.scale)  # loaded into the held memory
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fq.load_state_dict({**plain, "extra": torch.zeros(1)})
    with pytest.raises(RuntimeError, match="Missing key"):
        fq.load_state_dict({k: v for k, v in plain.items() if k != "scale"})


def test_observer_modules():
    rng = np.random.default_rng(9)
    for cls, kw in (("MinMaxObserver", {}), ("PerChannelMinMaxObserver", {"ch_axis": 1}),
                    ("HistogramObserver", {"bins": 64})):
        ours, theirs = getattr(QT, cls)(**kw), getattr(tob, cls)(**kw)
        for _ in range(3):
            x = torch.from_numpy(rng.normal(size=(7, 5)).astype(np.float32)).requires_grad_()
            assert ours(x) is x
            theirs(x)
        for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams()):
            same(a, b, cls)
        same(ours.min_val, theirs.min_val, cls)


def test_module_copies_continue_identically():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), QT.FakeQuantize())
    x = torch.randn(5, 4)
    model(x).sum().backward()
    for copier in (copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))):
        clone = copier(model)
        a, b = model(x * 2), clone(x * 2)
        same(a, b)
        same(model[1].scale, clone[1].scale)
        assert clone[1].impl is not model[1].impl
