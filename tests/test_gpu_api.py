"""The core API and FakeQuantize with cupy arrays: cupy in, cupy out, the
same bits as the CPU path.  Skips without cupy and a CUDA device (CI); run
on a GPU machine.  (The compat layers' cupy identity tests are in
test_cupy_compat.py, which runs them on real cupy too when a GPU is there.)"""
import numpy as np
import pytest

import quantcore as qc
import quantcore_gpu

from reference import bits_equal

cp = pytest.importorskip("cupy")
ok, reason = quantcore_gpu.can_use()
pytestmark = pytest.mark.skipif(not ok, reason=reason)

rng = np.random.default_rng(7)
X = rng.normal(0, 3, size=(6, 33, 70)).astype(np.float32)
X.reshape(-1)[::97] = np.nan
X.reshape(-1)[5::101] = np.inf
X.reshape(-1)[7::103] = -0.0
X.reshape(-1)[11::13] = np.round(X.reshape(-1)[11::13] * 2) / 2


def same(gpu, cpu):
    if isinstance(cpu, tuple):
        return all(same(g, c) for g, c in zip(gpu, cpu))
    assert isinstance(gpu, cp.ndarray), type(gpu)
    return bits_equal(cp.asnumpy(gpu), np.asarray(cpu))


CALLS = {
    "minmax": lambda x: qc.minmax(x),
    "minmax_axis1": lambda x: qc.minmax(x, axis=1),
    "minmax_omit": lambda x: qc.minmax(x, axis=2, nan_policy="omit"),
    "fake_quant": lambda x: qc.fake_quant(x, 0.05, 3, -128, 127, rounding="half_up"),
    "fake_quant_axis1": lambda x: qc.fake_quant(x, np.linspace(0.01, 0.1, 33), 0, -8, 7,
                                                axis=1),
    "with_mask": lambda x: qc.fake_quant_with_mask(x, 0.05, 0, 0, 255),
    "quantize": lambda x: qc.quantize(x, 0.05, 0, -128, 127),
    "nudged": lambda x: qc.fake_quant_nudged(x, *qc.qparams.nudge_tensorflow(-2, 2, 0, 255)[:3]),
    "amax": lambda x: qc.fake_quant_amax(x, 2.0, 4, axis=None),
    "amax_axis2": lambda x: qc.fake_quant_amax(x, np.linspace(0.5, 3, 70), 8, axis=2),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_public_functions_gpu_equals_cpu(name, layout):
    x = {"C": X, "F": np.asfortranarray(X), "strided": X[:, ::2, :]}[layout]
    assert same(CALLS[name](cp.asarray(x)), CALLS[name](x))


def test_ste_backward_and_out():
    _, mask = qc.fake_quant_with_mask(X, 0.05, 0, 0, 255)
    g = np.ones_like(X)
    assert same(qc.ste_backward(cp.asarray(g), cp.asarray(mask)), qc.ste_backward(g, mask))
    packed = np.packbits(mask.ravel(), bitorder="little")
    assert same(qc.ste_backward(cp.asarray(g), cp.asarray(packed)), qc.ste_backward(g, mask))
    out = cp.empty(X.shape, cp.float32)
    res = qc.fake_quant(cp.asarray(X), 0.05, 0, -128, 127, out=out)
    assert res is out and same(out, qc.fake_quant(X, 0.05, 0, -128, 127))


@pytest.mark.parametrize("axis,symmetric", [(None, False), (None, True), (1, True), (2, False)])
@pytest.mark.parametrize("kind", ["ma", "minmax"])
def test_fake_quantize_on_device_equals_cpu(axis, symmetric, kind):
    def make():
        obs = (qc.MovingAverageMinMaxObserver(0.1, axis=axis) if kind == "ma"
               else qc.MinMaxObserver(axis=axis))
        return qc.FakeQuantize(obs, -128, 127, symmetric=symmetric, axis=axis)
    gpu, cpu = make(), make()
    for step in range(5):
        x = (rng.normal(size=X.shape) * (1 + step)).astype(np.float32)
        if step == 2:
            x[0, 0, 0] = np.nan
        with pytest.warns(RuntimeWarning) if step == 2 else _nullcontext():
            yc = cpu(x)
        assert same(gpu(cp.asarray(x)), yc), step
        assert same(gpu.backward(cp.ones(x.shape, cp.float32)), cpu.backward(np.ones_like(x)))
    assert bits_equal(gpu.scale, cpu.scale) and np.array_equal(gpu.zero_point, cpu.zero_point)
    assert bits_equal(gpu.observer.min_val, cpu.observer.min_val)
    assert gpu.observer.num_batches == cpu.observer.num_batches
    assert gpu.observer.nonfinite_batches == cpu.observer.nonfinite_batches


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_torch_cuda_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    t = torch.randn(64, 33, device="cuda")
    y = qc.fake_quant(t, 0.05, 0, -128, 127)
    assert isinstance(y, torch.Tensor) and y.is_cuda
    assert torch.equal(y.cpu(), qc.fake_quant(t.cpu(), 0.05, 0, -128, 127))
