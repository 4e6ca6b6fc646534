"""End to end against ONNX Runtime: ``quantcore.onnx.quantize`` vs ORT's
``quantize_static``, timed from the call to the written model.

Each case is a model and a calibration set: the demo's conv net (the digits
training images, batches of 32), silero-vad (speech-like chunks, the state
carried) and RapidOCR's PP-OCRv4 text detector with 1, 4 and 16 images.
For every method's default call (``calibrate_method=M`` and nothing else;
Distribution with float 8 types, the only ones ORT quantizes it to) both
sides get the same kind of reader (ORT's protocol, ``rewind()`` available),
one fresh per call, and write their model into their own folder; the models
are asserted identical (every initializer, bit for bit).  The model's own
inference over the same feeds (ORT's default session) is timed beside them:
the floor of any calibrator that runs it.  The three run alternated, in the
same process, ``REPEATS`` rounds; the report takes the median of each.

``QC_ORT_E2E_FULL=1`` runs the recorded sizes (detector images 320 x 320,
1, 4 and 16 of them, silero 256 chunks; 3 rounds); by default small sizes
(one image of 64 x 64) and one round (CI).
``QC_ORT_E2E_MD=path`` appends each row as a markdown table line.
"""
import os
import statistics
import tempfile
import time

import numpy as np
import pytest

from benchutil import FeedReader, wheel_model

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FULL = os.environ.get("QC_ORT_E2E_FULL") == "1"
REPEATS = int(os.environ.get("QC_ORT_E2E_REPEATS", 3 if FULL else 1))
METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")
DET_SIDE = 320 if FULL else 64
# (CI runs each case once as a test: one detector size there, ~5 s a method)
CASES = ((("demo", None), ("silero_vad", 256), ("ppocr_det", 1), ("ppocr_det", 4),
          ("ppocr_det", 16)) if FULL else (("demo", None), ("silero_vad", 8), ("ppocr_det", 1)))


_MODELS = {}


def case_model(name, size, folder):
    """(model path, feeds) of a case (a skip when its wheel is missing)."""
    key = (name, size)
    if key in _MODELS:
        return _MODELS[key]
    if name == "demo":
        from quantcore import demo
        path, _ = demo.save_convnet(folder)
        x_tr = demo.load_data(0)[0]
        n = len(x_tr) // 32 * 32
        x = x_tr[:n].reshape(-1, 1, 8, 8).astype(np.float32)
        feeds = [{"x": x[i:i + 32]} for i in range(0, n, 32)]
    else:
        path, feeds = wheel_model(name, size, 1 if name == "silero_vad" else DET_SIDE)
    _MODELS[key] = path, feeds
    return path, feeds


def _types(method):
    from onnxruntime.quantization import QuantType
    if method == "Distribution":
        return {"activation_type": QuantType.QFLOAT8E4M3FN,
                "weight_type": QuantType.QFLOAT8E4M3FN}
    return {}


def run_ort(path, feeds, method, out):
    from onnxruntime.quantization import CalibrationMethod, quantize_static
    t0 = time.perf_counter()
    quantize_static(path, out, FeedReader(feeds), calibrate_method=CalibrationMethod[method],
                    **_types(method))
    return time.perf_counter() - t0


def run_quantcore(path, feeds, method, out):
    from quantcore import onnx as qonnx
    t0 = time.perf_counter()
    res = qonnx.quantize(path, out, FeedReader(feeds), calibrate_method=method,
                         **_types(method))
    return time.perf_counter() - t0, res.replay


def run_model(path, feeds):
    """The model's own inference over the feeds (session made, then every
    batch run once)."""
    import onnxruntime as ort
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for feed in feeds:
        sess.run(None, feed)
    return time.perf_counter() - t0


def _initializers(path):
    from onnx import numpy_helper
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def _same_model(a, b):
    x, y = _initializers(a), _initializers(b)
    return sorted(x) == sorted(y) and all(
        x[k].dtype == y[k].dtype and x[k].shape == y[k].shape and
        x[k].tobytes() == y[k].tobytes() for k in x)


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="qc_bench_e2e_") as d:
        yield d


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name,size", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_quantize_vs_quantize_static(benchmark, workdir, name, size, method):
    """quantize vs quantize_static end to end, alternated, median of
    REPEATS; the written models identical."""
    from quantcore.cli_common import quiet_ort
    path, feeds = case_model(name, size, workdir)
    times = {"ort": [], "quantcore": [], "model": []}
    replay = None
    with quiet_ort():
        for r in range(REPEATS):
            ort_out = os.path.join(workdir, f"ort_{r}.onnx")
            qc_out = os.path.join(workdir, f"qc_{r}.onnx")
            order = ("ort", "quantcore", "model") if r % 2 == 0 else ("quantcore", "ort", "model")
            for side in order:
                if side == "ort":
                    times["ort"].append(run_ort(path, feeds, method, ort_out))
                elif side == "quantcore":
                    s, replay = run_quantcore(path, feeds, method, qc_out)
                    times["quantcore"].append(s)
                else:
                    times["model"].append(run_model(path, feeds))
            assert _same_model(qc_out, ort_out), (name, method)
    med = {k: statistics.median(v) for k, v in times.items()}
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.group = f"ort_e2e {name} {size}"
    benchmark.extra_info.update({
        "op": "ort_e2e", "model": name, "size": size, "method": method, "repeats": REPEATS,
        "ort_seconds": med["ort"], "quantcore_seconds": med["quantcore"],
        "model_seconds": med["model"], "speedup_vs_ort": med["ort"] / med["quantcore"],
        "replay": replay, "ort_all": times["ort"], "quantcore_all": times["quantcore"],
        "load": os.getloadavg()})
    md = os.environ.get("QC_ORT_E2E_MD")
    if md:
        label = {"demo": f"demo conv net (digits, {len(feeds)} x 32)",
                 "silero_vad": f"silero-vad ({size} chunks)",
                 "ppocr_det": f"PP-OCR det ({size} x {DET_SIDE}^2)"}[name]
        with open(md, "a") as f:
            f.write(f"| {label} | {method} | {med['ort']:.3f} | {med['quantcore']:.3f} | "
                    f"{med['ort'] / med['quantcore']:.2f}x | {med['model']:.3f} | "
                    f"{replay or '-'} | {', '.join(f'{t:.2f}' for t in times['ort'])} / "
                    f"{', '.join(f'{t:.2f}' for t in times['quantcore'])} | "
                    f"{os.getloadavg()[0]:.1f} |\n")
