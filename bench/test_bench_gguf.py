"""GGUF block types (issue 39): gguf_quantize against llama.cpp's own
quantize_<type> (ggml-quants.c built without FMA contraction,
tests/ggml_oracle.py) on the same rows, on 1 and 2 threads (ggml's on 2
threads: the rows split in two halves, one ctypes call per thread, as
llama-quantize splits a tensor's rows into chunks per thread), and against
np.copyto of the input (the memory roofline), in one run.

A (512, 4096) float32 weight (2 Mi values, 8 MiB; 32 rows when run as a
test, ``--benchmark-disable``); the K-quants with and without an importance
matrix.  Run: ``pytest bench/test_bench_gguf.py
--benchmark-only``; in CI once each as a test (nothing asserts a time).
"""
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import quantcore as qc
from benchutil import annotate
from quantcore import gguf as G

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests"))
import ggml_oracle  # noqa: E402

K = 4096
CASES = [(t[0], False) for t in G.TYPES] + [(t[0], True) for t in G.TYPES if t[2] == 256]
IMPLS = ["quantcore-1t", "quantcore-2t", "ggml-1t", "ggml-2t"]


@pytest.fixture(scope="module")
def w(pytestconfig):
    rows = 32 if pytestconfig.getoption("benchmark_disable") else 512
    return np.random.default_rng(0).standard_normal((rows, K)).astype(np.float32)


@pytest.fixture(scope="module")
def imatrix():
    return (np.random.default_rng(1).random(K).astype(np.float32) * 4) + 0.01


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(2) as ex:
        yield ex


def _op(name, imx):
    return f"gguf_{name}" + ("_imatrix" if imx else "")


@pytest.mark.parametrize("case", CASES, ids=[_op(*c) for c in CASES])
def test_gguf_roofline_copyto(benchmark, case, w):
    out = np.empty_like(w)
    annotate(benchmark, _op(*case), w.size, "np.copyto", 8 * w.size)
    benchmark(lambda: np.copyto(out, w))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=[_op(*c) for c in CASES])
def test_gguf_quantize(benchmark, threads, pool, impl, case, w, imatrix):
    name, imx = case
    qw = imatrix if imx else None
    rb = G.gguf_row_bytes(name, K)
    rows = w.shape[0]
    annotate(benchmark, _op(name, imx), w.size, impl, 4 * w.size + rows * rb)
    if impl.startswith("ggml"):
        o = ggml_oracle.get()
        if o is None:
            pytest.skip("the ggml oracle could not be built")
        if impl == "ggml-1t":
            benchmark(lambda: o.quantize(name, w, qw, rb))
        else:
            halves = (w[:rows // 2], w[rows // 2:])
            benchmark(lambda: b"".join(pool.map(lambda h: o.quantize(name, h, qw, rb), halves)))
        return
    threads(1 if impl == "quantcore-1t" else 2)
    benchmark(lambda: qc.gguf_quantize(w, name, imatrix=qw))
