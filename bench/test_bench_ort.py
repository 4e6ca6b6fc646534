"""ONNX Runtime's calibrators vs quantcore's on the same activation stream.

The spec's anchor (spec/onnxruntime.md section 17): a model with input
``x[n]`` and a chain of 19 ``Add`` (20 calibrated float32 tensors), ``B``
batches, ORT's ``create_calibrator`` defaults, one ``collect_data`` call;
quantcore: ``quantcore.onnx.calibrate(..., passes=2)``, the same single-call
result (the ranges are asserted identical) in constant memory.  Both run the
model with onnxruntime; each side is timed once per round, end to end
(session, inference, statistics, thresholds).

Sizes: ``QC_ORT_BENCH_FULL=1`` runs the spec's 20 tensors x 50 batches x
1 Mi values (3.8 GiB of activations); by default 20 x 8 x 64 Ki (CI).  The
speed-up (ORT time / quantcore time, measured in the same run) is in
``extra_info["speedup_vs_ort"]``; :func:`test_peak_memory` measures each
side's peak RSS in a fresh subprocess.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FULL = os.environ.get("QC_ORT_BENCH_FULL") == "1"
N, BATCHES, TENSORS = (1 << 20, 50, 20) if FULL else (1 << 16, 8, 20)
METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")


def chain_model(path, n=N, tensors=TENSORS):
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits = [], []
    prev = "x"
    for i in range(tensors - 1):
        c = f"c{i}"
        inits.append(numpy_helper.from_array(np.array([0.01 * (i + 1)], np.float32), c))
        out = f"t{i}" if i < tensors - 2 else "y"
        nodes.append(helper.make_node("Add", [prev, c], [out]))
        prev = out
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


class Reader:
    """Batches generated on the fly (seeded), re-readable (rewind)."""

    def __init__(self, n=N, batches=BATCHES):
        self.n, self.batches = n, batches
        self.rewind()

    def rewind(self):
        self.i = 0

    def get_next(self):
        if self.i >= self.batches:
            return None
        rng = np.random.default_rng(self.i)
        self.i += 1
        return {"x": (rng.standard_normal(self.n) * (1 + 0.1 * self.i)).astype(np.float32)}


def run_ort(model, method):
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        cal = create_calibrator(model, augmented_model_path=os.path.join(d, "aug.onnx"),
                                calibrate_method=CalibrationMethod[method])
        cal.collect_data(Reader())
        td = cal.compute_data()
        return time.perf_counter() - t0, {k: (float(np.asarray(v.lowest).ravel()[0]),
                                              float(np.asarray(v.highest).ravel()[0]))
                                          for k, v in td.items()}


def run_quantcore(model, method):
    from quantcore import onnx as qonnx
    t0 = time.perf_counter()
    res = qonnx.calibrate(model, Reader(), method.lower(), passes=2)
    return time.perf_counter() - t0, res.ranges()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return chain_model(str(tmp_path_factory.mktemp("ort") / "chain.onnx"))


@pytest.mark.parametrize("method", METHODS)
def test_calibrators_vs_ort(benchmark, model, method, capsys):
    """quantcore's timing under pytest-benchmark, ORT's measured in the same
    run; identical ranges (ORT-exact mode)."""
    import io
    import contextlib
    with contextlib.redirect_stdout(io.StringIO()):  # ORT's calibrators print progress
        ort_s, ort_ranges = run_ort(model, method)
    qc_ranges = {}

    def target():
        s, r = run_quantcore(model, method)
        qc_ranges.update(r)
        return s
    benchmark.pedantic(target, rounds=1, iterations=1)
    qc_s = benchmark.stats.stats.median if benchmark.stats is not None else run_quantcore(model, method)[0]
    assert qc_ranges == ort_ranges
    benchmark.group = f"ort_calibration {TENSORS}x{BATCHES}x{N}"
    benchmark.extra_info.update({"op": "ort_calibration", "method": method, "size": N * BATCHES,
                                 "impl": "quantcore", "ort_seconds": ort_s,
                                 "speedup_vs_ort": ort_s / qc_s if qc_s else None})


PEAK_SCRIPT = r"""
import json, resource, sys, io, contextlib
sys.path.insert(0, {bench!r})
import test_bench_ort as B
side, method, model = sys.argv[1:4]
with contextlib.redirect_stdout(io.StringIO()):
    seconds, _ = (B.run_ort if side == "ort" else B.run_quantcore)(model, method)
print(json.dumps({{"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


@pytest.mark.parametrize("method", ["Entropy", "Percentile"])
def test_peak_memory(model, method, benchmark):
    """Peak RSS of each side in a fresh process (the histogram methods: ORT
    keeps every batch; quantcore one batch of activations)."""
    out = {}
    script = PEAK_SCRIPT.format(bench=os.path.dirname(os.path.abspath(__file__)))
    for side in ("ort", "quantcore"):
        res = subprocess.run([sys.executable, "-c", script, side, method, model],
                             capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, QC_ORT_BENCH_FULL="1" if FULL else "0"))
        assert res.returncode == 0, res.stderr[-2000:]
        out[side] = json.loads(res.stdout.strip().splitlines()[-1])
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.group = f"ort_peak_memory {TENSORS}x{BATCHES}x{N}"
    benchmark.extra_info.update({"op": "ort_peak_memory", "method": method,
                                 "ort_peak_rss_mib": out["ort"]["peak_rss_mib"],
                                 "quantcore_peak_rss_mib": out["quantcore"]["peak_rss_mib"],
                                 "ort_seconds": out["ort"]["seconds"],
                                 "quantcore_seconds": out["quantcore"]["seconds"]})
    # activations the model produces: ORT holds them all, quantcore one batch
    activations_mib = TENSORS * BATCHES * N * 4 / 2**20
    assert out["quantcore"]["peak_rss_mib"] < out["ort"]["peak_rss_mib"] or activations_mib < 200
