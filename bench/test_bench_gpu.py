"""quantcore's GPU path against a device-to-device copy and torch CUDA.

Skips without cupy and a usable CUDA device (CI).  On a GPU machine:
``make gpu-test`` (or ``QC_BENCH_GPU_SIZES=1 pytest bench/test_bench_gpu.py
--benchmark-only --benchmark-json=...``).  Every timed call ends with a
device synchronisation, so the wall time covers the kernels.  Operation
names start with ``gpu_``; the roofline is ``cupy.copyto`` of the same
array (``bench/summary.py`` reads either roofline).
"""
import numpy as np
import pytest

import quantcore as qc
from benchutil import MI, annotate, size_id

cp = pytest.importorskip("cupy")


def _gpu_or_skip():
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(reason)


GPU_SIZES = [MI, 16 * MI, 256 * MI]
IMPLS = ["quantcore-gpu", "torch-cuda"]
SCALE, ZP, QMIN, QMAX = np.float32(0.02), 3, -128, 127


def device_input(n, seed=0):
    return cp.asarray(np.random.default_rng(seed).normal(size=n).astype(np.float32))


def synced(f):
    """f, then a device synchronisation (the timed unit)."""
    sync = cp.cuda.Device().synchronize

    def call():
        f()
        sync()
    return call


def torch_cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("op", ["gpu_fake_quant", "gpu_minmax", "gpu_fake_quantize_forward",
                                "gpu_compat_fake_quantize_step", "gpu_histogram_collect",
                                "gpu_minmax_per_channel", "gpu_mx_fake_quant",
                                "gpu_nvfp4_fake_quant"])
def test_gpu_roofline_copy(benchmark, op, n):
    _gpu_or_skip()
    x = device_input(n)
    out = cp.empty_like(x)
    annotate(benchmark, op, n, "cupy.copyto", 8 * n)
    benchmark(synced(lambda: cp.copyto(out, x)))


def _bench_against_torch(benchmark, impl, n, op, bytes_per_element, quantcore_call,
                         torch_call):
    """Time one call on a device array of n float32: ``quantcore_call(x)``
    makes the quantcore call, or for impl "torch-cuda" ``torch_call(torch,
    t)`` torch's on ``t``, a torch view of the same memory."""
    _gpu_or_skip()
    x = device_input(n)
    annotate(benchmark, op, n, impl, bytes_per_element * n)
    if impl == "torch-cuda":
        torch = torch_cuda_or_skip()
        call = torch_call(torch, torch.from_dlpack(x))
    else:
        call = quantcore_call(x)
    benchmark(synced(call))


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_fake_quant(benchmark, impl, n):
    def quantcore_call(x):
        out = cp.empty_like(x)
        return lambda: qc.fake_quant(x, SCALE, ZP, QMIN, QMAX, out=out)
    _bench_against_torch(
        benchmark, impl, n, "gpu_fake_quant", 8, quantcore_call,
        lambda torch, t: lambda: torch.fake_quantize_per_tensor_affine(t, float(SCALE), ZP,
                                                                       QMIN, QMAX))


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_minmax(benchmark, impl, n):
    _bench_against_torch(benchmark, impl, n, "gpu_minmax", 4,
                         lambda x: lambda: qc.minmax(x),
                         lambda torch, t: lambda: torch.aminmax(t))


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_fake_quantize_forward(benchmark, impl, n):
    """Observe + qparams + fake quant: quantcore's two launches with the
    qparams kept on the device, against torch's CUDA FakeQuantize module."""
    _fake_quantize_step(benchmark, impl, n, "gpu_fake_quantize_forward", qc.FakeQuantize)


def _fake_quantize_step(benchmark, impl, n, op, make_quantcore_module):
    """One forward of a FakeQuantize module (``make_quantcore_module()``, or
    torch's own CUDA FakeQuantize for impl "torch-cuda") on a device array."""
    def torch_call(torch, t):
        fq = torch.ao.quantization.FakeQuantize().cuda()

        def torch_forward():
            with torch.no_grad():
                return fq(t)
        return torch_forward

    def quantcore_call(x):
        fq = make_quantcore_module()
        return lambda: fq(x)
    _bench_against_torch(benchmark, impl, n, op, 9, quantcore_call, torch_call)


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_compat_fake_quantize_step(benchmark, impl, n):
    """One training step of compat.torch's FakeQuantize (moving-average
    observer, per tensor) on a device array, against torch's own CUDA
    FakeQuantize module."""
    from quantcore.compat import torch as T
    _fake_quantize_step(benchmark, impl, n, "gpu_compat_fake_quantize_step", T.FakeQuantize)


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_histogram_collect(benchmark, impl, n):
    """torch.histc of 2048 bins over the batch's range (HistogramObserver's
    collection: the range, then the counts), against torch.histc on CUDA."""
    def torch_call(torch, t):
        def torch_hist():
            lo, hi = torch.aminmax(t)
            return torch.histc(t, 2048, float(lo), float(hi))
        return torch_hist

    def quantcore_call(x):
        from quantcore_gpu import kernels as G

        def qc_hist():
            lo, hi = qc.minmax(x)
            return G.histc_f32(x, 2048, float(lo), float(hi), False, False)
        return qc_hist
    _bench_against_torch(benchmark, impl, n, "gpu_histogram_collect", 4, quantcore_call,
                         torch_call)


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_minmax_per_channel(benchmark, impl, n):
    """Per-channel min / max of a (1024, n / 1024) weight along axis 0,
    against torch.aminmax(dim=1)."""
    _bench_against_torch(benchmark, impl, n, "gpu_minmax_per_channel", 4,
                         lambda x: lambda: qc.minmax(x.reshape(1024, -1), axis=0),
                         lambda torch, t: lambda: torch.aminmax(t.view(1024, -1), dim=1))


@pytest.mark.parametrize("n", GPU_SIZES, ids=size_id)
@pytest.mark.parametrize("op", ["gpu_mx_fake_quant", "gpu_nvfp4_fake_quant"])
def test_gpu_block_scaled_fake_quant(benchmark, op, n):
    """MX (e4m3 elements, blocks of 32) and NVFP4 (modelopt, with a global
    scale) fake quant; torch has no CUDA op for either."""
    from quantcore import mx
    _gpu_or_skip()
    x = device_input(n)
    out = cp.empty_like(x)
    annotate(benchmark, op, n, "quantcore-gpu", 8 * n)
    if op == "gpu_mx_fake_quant":
        call = lambda: mx.mx_fake_quant(x, "e4m3")  # noqa: E731
    else:
        gs = np.float32(1.0)
        call = lambda: mx.nvfp4_fake_quant(x, gs, out=out)  # noqa: E731
    benchmark(synced(call))


@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("impl", ["quantcore-gpu", "quantcore-cpu"])
def test_gpu_gguf_quantize(benchmark, impl, gtype):
    """GGUF blocks of a 4096 x 4096 float32 weight (issue 39; a row a
    thread on the device) against the same call on the host's threads."""
    from quantcore import gguf_quantize
    _gpu_or_skip()
    n = 16 * MI
    x = device_input(n).reshape(4096, 4096)
    annotate(benchmark, f"gpu_gguf_quantize_{gtype.lower()}", n, impl, 4 * n)
    if impl == "quantcore-cpu":
        host = cp.asnumpy(x)
        benchmark(lambda: gguf_quantize(host, gtype))
    else:
        benchmark(synced(lambda: gguf_quantize(x, gtype)))


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "NVFP4A16", "W4A16"])
@pytest.mark.parametrize("impl", ["quantcore-gpu", "quantcore-cpu"])
def test_gpu_engines_quantize(benchmark, impl, scheme):
    """A 4096 x 4096 BF16 weight (its stored bits) into compressed-tensors'
    tensors (issue 45; ``compressed_tensors.quantize_tensor``: statistics on
    the host, codes on the device) against the host's loops."""
    from quantcore.engines import compressed_tensors as CT
    _gpu_or_skip()
    n = 16 * MI
    x = (device_input(n).view(np.uint32) >> 16).astype(np.uint16).reshape(4096, 4096)
    g = np.float32(1.0)
    annotate(benchmark, f"gpu_engines_{scheme.lower()}", n, impl, 2 * n)
    if impl == "quantcore-cpu":
        host = cp.asnumpy(x)
        benchmark(lambda: CT.quantize_tensor(host, "BF16", scheme, 128, g, "w"))
    else:
        benchmark(synced(lambda: CT.quantize_tensor(x, "BF16", scheme, 128, g, "w")))
