"""quantcore against NumPy, PyTorch and the np.copyto roofline.

Run: ``make bench`` (JSON in bench/results/latest.json, then the summary).
In CI these run once each as tests (``--benchmark-disable``): nothing here
asserts a time.
"""
import itertools
import os

import numpy as np
import pytest

import quantcore as qc
from benchutil import SIZES, Rotating, annotate, make_input, size_id, torch_or_skip

IMPLS_QC = ["quantcore-1t", "quantcore-all"]
SCALE, ZP, QMIN, QMAX = np.float32(0.02), 3, -128, 127


def set_threads(threads, impl):
    threads(1 if impl == "quantcore-1t" else os.cpu_count() or 1)


def rotating_inputs(n, shape=None):
    return Rotating(lambda k: make_input(n, seed=k, shape=shape), 4 * n)


def torch_inputs(xs):
    """``(torch, next_tensor)``: ``next_tensor()`` returns torch views of
    ``xs``'s copies in turn, as ``xs.next()`` returns the arrays (skips
    without torch)."""
    torch = torch_or_skip()
    return torch, itertools.cycle([torch.from_numpy(x) for x in xs.items]).__next__


# ----------------------------------------------------------------- roofline
@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("op", ["fake_quant", "minmax", "fake_quantize_forward", "backward",
                                "minmax_channels_CK", "minmax_channels_NCHW",
                                "fake_quant_channels", "histogram_collect"])
def test_roofline_copyto(benchmark, op, n):
    xs = rotating_inputs(n)
    out = np.empty(n, np.float32)
    annotate(benchmark, op, n, "np.copyto", 8 * n)
    benchmark(lambda: np.copyto(out, xs.next()))


# --------------------------------------------------------------- fake quant
def numpy_fake_quant(x, scale, zp, qmin, qmax):
    """The obvious vectorised NumPy composite (torch's formula)."""
    inv = np.float32(1) / scale
    q = np.clip(np.rint(x * inv) + np.float32(zp), qmin, qmax)
    return ((q - np.float32(zp)) * scale).astype(np.float32)


@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS_QC + ["numpy", "torch"])
def test_fake_quant(benchmark, threads, impl, n):
    xs = rotating_inputs(n)
    out = np.empty(n, np.float32)
    annotate(benchmark, "fake_quant", n, impl, 8 * n)
    if impl == "numpy":
        benchmark(lambda: numpy_fake_quant(xs.next(), SCALE, ZP, QMIN, QMAX))
    elif impl == "torch":
        torch, next_tensor = torch_inputs(xs)
        benchmark(lambda: torch.fake_quantize_per_tensor_affine(
            next_tensor(), float(SCALE), ZP, QMIN, QMAX))
    else:
        set_threads(threads, impl)
        benchmark(lambda: qc.fake_quant(xs.next(), SCALE, ZP, QMIN, QMAX, out=out))


@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS_QC + ["numpy", "torch"])
def test_fake_quant_channels(benchmark, threads, impl, n):
    C = 64
    shape = (C, n // C)
    xs = rotating_inputs(n, shape)
    scale = np.linspace(0.01, 0.05, C).astype(np.float32)
    zp = np.zeros(C, np.int32)
    out = np.empty(shape, np.float32)
    annotate(benchmark, "fake_quant_channels", n, impl, 8 * n)
    if impl == "numpy":
        s, z = scale[:, None], zp[:, None].astype(np.float32)
        benchmark(lambda: numpy_fake_quant(xs.next(), s, z, QMIN, QMAX))
    elif impl == "torch":
        torch, next_tensor = torch_inputs(xs)
        st, zt = torch.from_numpy(scale), torch.from_numpy(zp)
        benchmark(lambda: torch.fake_quantize_per_channel_affine(
            next_tensor(), st, zt, 0, QMIN, QMAX))
    else:
        set_threads(threads, impl)
        benchmark(lambda: qc.fake_quant(xs.next(), scale, zp, QMIN, QMAX, axis=0, out=out))


# ------------------------------------------------------------------- minmax
@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS_QC + ["numpy", "torch"])
def test_minmax(benchmark, threads, impl, n):
    xs = rotating_inputs(n)
    annotate(benchmark, "minmax", n, impl, 4 * n)
    if impl == "numpy":
        benchmark(lambda: (lambda x: (x.min(), x.max()))(xs.next()))
    elif impl == "torch":
        torch, next_tensor = torch_inputs(xs)
        benchmark(lambda: torch.aminmax(next_tensor()))
    else:
        set_threads(threads, impl)
        benchmark(lambda: qc.minmax(xs.next()))


@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("layout", ["CK", "NCHW"])
@pytest.mark.parametrize("impl", IMPLS_QC + ["numpy", "torch"])
def test_minmax_channels(benchmark, threads, impl, layout, n):
    if layout == "CK":
        shape, axis = (64, n // 64), 0
    else:
        batch = max(n // (32 * 16 * 16), 1)
        shape, axis = (batch, 32, 16, n // (32 * 16 * batch)), 1
    xs = rotating_inputs(n, shape)
    op = f"minmax_channels_{layout}"
    annotate(benchmark, op, n, impl, 4 * n)
    other = tuple(a for a in range(len(shape)) if a != axis)
    if impl == "numpy":
        benchmark(lambda: (lambda x: (x.min(axis=other), x.max(axis=other)))(xs.next()))
    elif impl == "torch":
        torch, next_tensor = torch_inputs(xs)

        def torch_minmax():
            t = next_tensor()
            flat = t.transpose(0, axis).flatten(1)
            return torch.aminmax(flat, dim=1)
        benchmark(torch_minmax)
    else:
        set_threads(threads, impl)
        benchmark(lambda: qc.minmax(xs.next(), axis=axis))


# ------------------------------------------------- FakeQuantize and backward
@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS_QC + ["numpy", "torch"])
def test_fake_quantize_forward(benchmark, threads, impl, n):
    xs = rotating_inputs(n)
    annotate(benchmark, "fake_quantize_forward", n, impl, 9 * n)
    if impl == "numpy":
        state = {}

        def numpy_forward():
            x = xs.next()
            lo, hi = x.min(), x.max()
            if not state:
                state.update(lo=lo, hi=hi)
            else:
                state["lo"] = np.float32(state["lo"] + np.float32(0.01) * (lo - state["lo"]))
                state["hi"] = np.float32(state["hi"] + np.float32(0.01) * (hi - state["hi"]))
            mn, mx = min(state["lo"], np.float32(0)), max(state["hi"], np.float32(0))
            scale = max(np.float32((mx - mn) / np.float32(255)), np.float32(2 ** -23))
            zp = int(np.clip(-np.rint(mn / scale), 0, 255))
            inv = np.float32(1) / scale
            qf = np.rint(x * inv) + np.float32(zp)
            mask = (qf >= 0) & (qf <= 255)
            return (np.clip(qf, 0, 255) - np.float32(zp)) * scale, mask
        benchmark(numpy_forward)
    elif impl == "torch":
        torch, next_tensor = torch_inputs(xs)
        fq = torch.ao.quantization.FakeQuantize()

        def torch_forward():
            with torch.no_grad():
                return fq(next_tensor())
        benchmark(torch_forward)
    else:  # into a reused output, as the fake_quant benchmark (out=)
        set_threads(threads, impl)
        fq = qc.FakeQuantize()
        out = np.empty(n, np.float32)
        benchmark(lambda: fq(xs.next(), out=out))


@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("impl", IMPLS_QC + ["numpy"])
def test_backward(benchmark, threads, impl, n):
    gs = rotating_inputs(n)
    mask = make_input(n, seed=99) > -1.5
    out = np.empty(n, np.float32)
    annotate(benchmark, "backward", n, impl, 9 * n)
    if impl == "numpy":
        benchmark(lambda: gs.next() * mask)
    else:
        set_threads(threads, impl)
        benchmark(lambda: qc.ste_backward(gs.next(), mask, out=out))


@pytest.mark.parametrize("n", SIZES, ids=size_id)
@pytest.mark.parametrize("impl", ["quantcore", "numpy", "torch"])
def test_histogram_collect(benchmark, impl, n):
    calib = pytest.importorskip("quantcore.calib")
    xs = rotating_inputs(n)
    annotate(benchmark, "histogram_collect", n, impl, 4 * n)
    if impl == "numpy":
        benchmark(lambda: (lambda x: np.histogram(np.abs(x), bins=2048))(xs.next()))
    elif impl == "torch":
        torch, next_tensor = torch_inputs(xs)

        def torch_hist():
            t = next_tensor().abs()
            return torch.histc(t, 2048, 0, float(t.max()))
        benchmark(torch_hist)
    else:
        cal = calib.HistogramCalibrator(8, None, False)
        benchmark(lambda: cal.collect(xs.next()))
