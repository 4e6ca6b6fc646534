"""ONNX Runtime's calibrators vs quantcore's on the same activation stream.

The spec's anchor (the project's ONNX Runtime specification section 17): a model with input
``x[n]`` and a chain of 19 ``Add`` (20 calibrated float32 tensors), ``B``
batches, ORT's ``create_calibrator`` defaults, one ``collect_data`` call;
quantcore: ``quantcore.onnx.calibrate(...)`` with its defaults, the same
single-call result (the ranges are asserted identical) in bounded memory.  Both run the
model with onnxruntime on the same reader; each side is timed once, end to
end (session, inference, statistics, thresholds).  The bare model runs
(read every batch, infer once: what any calibrator pays) are timed in the
same run, so the report has the speed-up of the total and of the
calibration overhead (total minus the bare runs; quantcore's overhead
includes its second inference pass where it reads the data twice).

Real models from PyPI wheels (:func:`test_real_model_vs_ort`): silero-vad's
recurrent voice activity detector (many tensors of about a thousand values:
the per-batch, per-tensor overhead is the cost) and RapidOCR's PP-OCRv4 text
detector (649 tensors, large activations), each against ORT's calibrator,
the model's own inference and the augmented model's (every calibrated
tensor an output, graph optimizations off: what an exact calibrator runs),
in the same run, best of ``REPEATS``; peak memory in fresh processes.

Sizes: ``QC_ORT_BENCH_FULL=1`` runs the spec's 20 tensors x 50 batches x
1 Mi values (3.8 GiB of activations); by default 20 x 8 x 64 Ki (CI).
:func:`test_peak_memory` measures the peak RSS each side adds, each in a
fresh process.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from benchutil import FeedReader, wheel_model

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
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


class Reader:
    """``batches`` float32 batches of ``n`` values, re-readable (``rewind``):
    batch ``i`` is a fixed normal sample rolled by ``i`` positions and scaled
    by ``1 + 0.1 (i + 1)`` (every batch different, each range wider), made
    in about a millisecond per 1 Mi values so that the reader costs both
    sides little (quantcore may read it twice).  Build it
    outside the timed region."""

    def __init__(self, n=N, batches=BATCHES):
        self.n, self.batches = n, batches
        self.base = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        self.rewind()

    def rewind(self):
        self.i = 0

    def get_next(self):
        if self.i >= self.batches:
            return None
        self.i += 1
        x = np.roll(self.base, self.i * 7919)
        x *= np.float32(1 + 0.1 * self.i)
        return {"x": x}


def run_ort(model, method, reader=None):
    """ORT's own calibrator, one collect_data call (quantize_static's way)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    reader = reader or Reader()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        cal = create_calibrator(model, augmented_model_path=os.path.join(d, "aug.onnx"),
                                calibrate_method=CalibrationMethod[method])
        cal.collect_data(reader)
        td = cal.compute_data()
        return time.perf_counter() - t0, {k: (float(np.asarray(v.lowest).ravel()[0]),
                                              float(np.asarray(v.highest).ravel()[0]))
                                          for k, v in td.items()}


def run_quantcore(model, method, reader=None):
    """quantcore.onnx.calibrate with its defaults (ORT's single call)."""
    from quantcore import onnx as qonnx
    reader = reader or Reader()
    t0 = time.perf_counter()
    res = qonnx.calibrate(model, reader, method.lower())
    return time.perf_counter() - t0, res.ranges()


def run_model_only(model, reader=None):
    """What any calibrator pays: read every batch and run the model once
    with every calibrated tensor as an output (quantcore.onnx's session)."""
    from quantcore import onnx as qonnx
    reader = reader or Reader()
    t0 = time.perf_counter()
    m = qonnx.load_model(model)
    tensors, infos = qonnx.select_tensors(m)
    sess = qonnx._session(m, tensors, infos, None)
    names = [o.name for o in sess.get_outputs()]
    for feed in iter(reader.get_next, None):
        sess.run(names, feed)
    return time.perf_counter() - t0


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return chain_model(str(tmp_path_factory.mktemp("ort") / "chain.onnx"))


def cpu_seconds():
    """User + system CPU time of this process, every thread included."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def quiet(fn, *args):
    """fn(*args) without ORT calibrators' progress prints."""
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


@pytest.mark.parametrize("method", METHODS)
def test_calibrators_vs_ort(benchmark, model, method):
    """quantcore's timing under pytest-benchmark, ORT's and the bare model
    runs (read + infer once: what any calibrator pays) measured in the same
    run on the same reader; identical ranges (ORT-exact mode).  Reported:
    the speed-up of the total and of the calibration overhead (total minus
    the bare model runs) and the CPU time of each side (every thread: a
    measure that a busy machine disturbs less than the wall time)."""
    reader = Reader()
    run_model_only(model, reader)        # onnxruntime's first session in the process is slower
    reader.rewind()
    model_s = run_model_only(model, reader)
    reader.rewind()
    cpu = cpu_seconds()
    ort_s, ort_ranges = quiet(run_ort, model, method, reader)
    ort_cpu = cpu_seconds() - cpu
    qc = {}

    def target():
        reader.rewind()
        cpu = cpu_seconds()
        qc["seconds"], qc["ranges"] = run_quantcore(model, method, reader)
        qc["cpu"] = cpu_seconds() - cpu
    benchmark.pedantic(target, rounds=1, iterations=1)
    assert qc["ranges"] == ort_ranges
    qc_s = qc["seconds"]
    benchmark.group = f"ort_calibration {TENSORS}x{BATCHES}x{N}"
    benchmark.extra_info.update({
        "op": "ort_calibration", "method": method, "size": N * BATCHES * TENSORS,
        "impl": "quantcore", "quantcore_seconds": qc_s, "ort_seconds": ort_s,
        "model_runs_seconds": model_s, "speedup_vs_ort": ort_s / qc_s,
        "ort_cpu_seconds": ort_cpu, "quantcore_cpu_seconds": qc["cpu"],
        "overhead_speedup_vs_ort": ((ort_s - model_s) / (qc_s - model_s)
                                    if qc_s > model_s else None)})


PEAK_SCRIPT = r"""
import contextlib, io, json, re, sys
sys.path.insert(0, {bench!r})
import test_bench_ort as B
import onnx, onnxruntime.quantization.calibrate  # what either side imports
from quantcore import onnx as qonnx


def status():
    text = open("/proc/self/status").read()
    return {{k: int(re.search(k + r":\s+(\d+) kB", text).group(1)) / 1024
             for k in ("VmRSS", "VmHWM")}}


side, method, kind, model = sys.argv[1:5]
if kind == "chain":
    args = (model, method, B.Reader())
    onnx.load(model)
    run = B.run_ort if side == "ort" else B.run_quantcore
else:      # a real model by name: (path, feeds, op types)
    path, feeds, ops = B.real_model(model)
    args = (path, feeds, ops, method)
    run = B.run_ort_real if side == "ort" else B.run_quantcore_real
with open("/proc/self/clear_refs", "w") as fh:  # peak RSS := current RSS
    fh.write("5")
before = status()["VmRSS"]
with contextlib.redirect_stdout(io.StringIO()):
    seconds, _ = run(*args)
peak = status()["VmHWM"]
print(json.dumps({{"seconds": seconds, "rss_before_mib": before, "peak_rss_mib": peak}}))
"""


def peak_rss(side, method, model, kind="chain"):
    """A fresh process imports everything, builds the reader (``kind``
    "chain": the spec's model at ``model``; "real": the real model named
    ``model`` and its feeds), resets its peak RSS (Linux
    ``/proc/self/clear_refs``: the imports peak higher than a small
    calibration) and calibrates with ``side``: ``{"rss_before_mib",
    "peak_rss_mib", "seconds"}``."""
    script = PEAK_SCRIPT.format(bench=os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", script, side, method, kind, model],
                         capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, QC_ORT_BENCH_FULL="1" if FULL else "0"))
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the peak-RSS reset needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("method", ["Entropy", "Percentile"])
def test_peak_memory(model, method, benchmark):
    """Peak RSS during the calibration, each side in its own process, above
    what the process held before it (the histogram methods: ORT keeps every
    batch's activations, quantcore at most two batches)."""
    ort = peak_rss("ort", method, model)
    qc = peak_rss("quantcore", method, model)
    ort_added = ort["peak_rss_mib"] - ort["rss_before_mib"]
    qc_added = qc["peak_rss_mib"] - qc["rss_before_mib"]
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.group = f"ort_peak_memory {TENSORS}x{BATCHES}x{N}"
    benchmark.extra_info.update({
        "op": "ort_peak_memory", "method": method,
        "ort_added_peak_mib": ort_added, "quantcore_added_peak_mib": qc_added,
        "ort_process_peak_mib": ort["peak_rss_mib"],
        "quantcore_process_peak_mib": qc["peak_rss_mib"],
        "ort_seconds": ort["seconds"], "quantcore_seconds": qc["seconds"]})
    batch_mib = TENSORS * N * 4 / 2**20          # one batch of every calibrated tensor
    assert ort_added >= batch_mib * BATCHES      # ORT holds every batch
    assert qc_added <= 4 * batch_mib + 48        # constant: a few batches, not all
    assert qc_added < ort_added
    if FULL:
        assert qc["peak_rss_mib"] <= 512         # the target, whole process



# ------------------------------------------------------------ real models
REPEATS = 2 if FULL else 1
REAL_SIZES = {"silero_vad": (256, 1) if FULL else (16, 1),       # batches, rows
              "ppocr_det": (24, 320) if FULL else (2, 64)}      # batches, image side


def real_model(name):
    """(path, feeds, op types) of a real model, or a skip when its wheel is
    not installed (the `test` extra installs both)."""
    from quantcore import onnx as qonnx
    path, feeds = wheel_model(name, *REAL_SIZES[name])
    return path, feeds, qonnx.quantizable_op_types()


def run_ort_real(path, feeds, ops, method):
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        cal = create_calibrator(path, ops, augmented_model_path=os.path.join(d, "aug.onnx"),
                                calibrate_method=CalibrationMethod[method])
        cal.collect_data(FeedReader(feeds))
        td = cal.compute_data()
        return time.perf_counter() - t0, td


def run_quantcore_real(path, feeds, ops, method, **kw):
    from quantcore import onnx as qonnx
    t0 = time.perf_counter()
    res = qonnx.calibrate(path, FeedReader(feeds), method.lower(), op_types_to_calibrate=ops,
                          **kw)
    return time.perf_counter() - t0, res


def inference_seconds(path, feeds, ops, augmented):
    """The model's own inference over the feeds (ORT's defaults), or the
    augmented model's (every calibrated tensor an output, optimizations off)."""
    import onnxruntime as ort

    from quantcore import onnx as qonnx
    if augmented:
        m = qonnx.load_model(path)
        tensors, infos = qonnx.select_tensors(m, ops)
        sess = qonnx._session(m, tensors, infos, None)
    else:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess.run(None, feeds[0])
    t0 = time.perf_counter()
    for feed in feeds:
        sess.run(None, feed)
    return time.perf_counter() - t0


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", ["silero_vad", "ppocr_det"])
def test_real_model_vs_ort(benchmark, name, method):
    """A real model: ORT's calibrator, quantcore's (its defaults: ORT's
    single call), the model's own inference and the augmented model's, each
    the best of REPEATS in the same run; identical ranges asserted.  Entropy
    also with ``histograms=False`` (what ``quantize`` runs: the ranges
    without the counts, one read with ORT's default bins)."""
    path, feeds, ops = real_model(name)
    best = {"ort": np.inf, "quantcore": np.inf, "model": np.inf, "augmented": np.inf,
            "ranges": np.inf}
    for _ in range(REPEATS):
        s, td = quiet(run_ort_real, path, feeds, ops, method)
        best["ort"] = min(best["ort"], s)
        s, res = run_quantcore_real(path, feeds, ops, method)
        best["quantcore"] = min(best["quantcore"], s)
        if method == "Entropy":
            s, ranges = run_quantcore_real(path, feeds, ops, method, histograms=False)
            best["ranges"] = min(best["ranges"], s)
            assert ranges.ranges() == res.ranges()
        best["model"] = min(best["model"], inference_seconds(path, feeds, ops, False))
        best["augmented"] = min(best["augmented"], inference_seconds(path, feeds, ops, True))
    assert sorted(res.tensors_range.keys()) == sorted(td.keys())
    for k in td.keys():
        for key in ("lowest", "highest"):
            # equal values (a zero's sign is ReduceMin's choice in ORT: surprise 9)
            a, b = np.asarray(getattr(res.tensors_range[k], key)), np.asarray(getattr(td[k], key))
            assert np.array_equal(a, b, equal_nan=True), (k, key)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    batches, size = REAL_SIZES[name]
    benchmark.group = f"ort_real {name} {batches}x{size}"
    benchmark.extra_info.update({
        "op": "ort_real", "model": name, "method": method, "tensors": len(td.keys()),
        "batches": batches, "size": size, "ort_seconds": best["ort"],
        "quantcore_seconds": best["quantcore"], "model_seconds": best["model"],
        "augmented_model_seconds": best["augmented"], "replay": res.replay,
        "quantcore_ranges_only_seconds": (best["ranges"] if method == "Entropy" else None),
        "speedup_vs_ort": best["ort"] / best["quantcore"],
        "vs_augmented_inference": best["quantcore"] / best["augmented"]})


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the peak-RSS reset needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile"] if FULL else ["Entropy"])
@pytest.mark.parametrize("name", ["silero_vad", "ppocr_det"])
def test_real_model_peak_memory(benchmark, name, method):
    """Peak RSS each side adds while calibrating a real model, each in a
    fresh process (the feeds made before the reset)."""
    real_model(name)    # the skip when the wheel is missing
    out = {side: peak_rss(side, method, name, "real") for side in ("ort", "quantcore")}
    added = {k: v["peak_rss_mib"] - v["rss_before_mib"] for k, v in out.items()}
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    batches, size = REAL_SIZES[name]
    benchmark.group = f"ort_real_peak_memory {name} {batches}x{size}"
    benchmark.extra_info.update({
        "op": "ort_real_peak_memory", "model": name, "method": method,
        "ort_added_peak_mib": added["ort"], "quantcore_added_peak_mib": added["quantcore"],
        "ort_process_peak_mib": out["ort"]["peak_rss_mib"],
        "quantcore_process_peak_mib": out["quantcore"]["peak_rss_mib"]})
    if FULL and name == "ppocr_det" and method != "MinMax":
        # ORT holds every batch's activations (GiB), quantcore a buffer and a
        # batch or two (small sizes: both are fixed costs, nothing to compare)
        assert added["quantcore"] <= added["ort"] / 4
