"""quantcore.onnx.calibrate on a Dask LocalCluster: wall time with 1 and 2
worker processes (one thread each) against one machine's call, bytes each
partition sends and receives, peak memory per worker.

The model is RapidOCR's PP-OCRv4 text detector (649 calibrated tensors);
the data ``IMAGES`` images in ``PARTS`` partitions of lists of feeds.  Each
configuration starts a fresh LocalCluster (its start is not timed), runs
the call once to make each worker's session, then ``REPEATS`` timed calls
(median).  Bytes: the pickled size of a partition's task arguments (to the
scheduler: the job -- model path, tensor names, options -- goes once, as a
task result the workers fetch) and of what one partition's task returns
(round 1: MinMax rows or range statistics; round 2: the counts, summed in a
tree of tasks on the workers, so the client gets one), measured by running
the same task function here.  Peak memory: each worker process's VmHWM.

``QC_CLUSTER_BENCH_FULL=1``: 8 images of 320 x 320 in 8 partitions, 3
rounds; default (CI): 2 images of 64 x 64, one round.
``QC_CLUSTER_BENCH_MD=path`` appends each row as a markdown table line.
"""
import os
import pickle
import statistics
import sys
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
distributed = pytest.importorskip("distributed")

FULL = os.environ.get("QC_CLUSTER_BENCH_FULL") == "1"
IMAGES, SIDE, PARTS = (8, 320, 8) if FULL else (2, 64, 2)
REPEATS = 3 if FULL else 1


def _detector():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    import test_onnx as T
    (package, relative), _ = T.REAL_MODELS["ppocr_det"]
    return T._wheel_model(package, relative), T.ocr_feeds(IMAGES, SIDE, SIDE)


def _peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _bytes(method, path, parts):
    """(task arguments, round-1 result, round-2 result) bytes of partition 0."""
    from quantcore import onnx as qonnx
    from quantcore.onnx import cluster as C
    m = qonnx.load_model(path)
    tensors, _ = qonnx.select_tensors(m, qonnx.quantizable_op_types())
    job = {"model": path, "model_key": "k", "tensors": tensors, "providers": None,
           "op_types": qonnx.quantizable_op_types(), "method": method.lower(), "options": {}}
    args = len(pickle.dumps(("ranges", None, 0, parts[0])))
    if method == "MinMax":
        return args, len(pickle.dumps(C._task("minmax", job, 0, parts[0]))), 0
    ranges = C._task("ranges", job, 0, parts[0])     # (a _Packed: what Dask sends)
    stats, nans, n = ranges.value()
    cal = qonnx.make_calibrator(method.lower(), {}, passes=2, tensors=tensors)
    plans = cal.collector.checked_plans(stats)
    counts = C._task("counts", job, 0, parts[0], plans, n)
    return args, len(pickle.dumps(ranges)), len(pickle.dumps(counts))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("method", ["MinMax", "Percentile"])
def test_cluster_scaling(benchmark, method, tmp_path):
    from quantcore import onnx as qonnx
    path, feeds = _detector()
    parts = [list(p) for p in np.array_split(np.array(feeds, dtype=object), PARTS)]
    ops = qonnx.quantizable_op_types()
    rows = {}
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        want = qonnx.calibrate(path, feeds, method.lower(), op_types_to_calibrate=ops)
        times.append(time.perf_counter() - t0)
    rows["one machine"] = (statistics.median(times), _peak_rss_mib(), None)
    for workers in (1, 2):
        with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                      dashboard_address=None,
                                      local_directory=str(tmp_path)) as cluster, \
                distributed.Client(cluster) as client:
            qonnx.calibrate(path, parts, method.lower(), op_types_to_calibrate=ops,
                            client=client)       # (each worker's session made)
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                got = qonnx.calibrate(path, parts, method.lower(), op_types_to_calibrate=ops,
                                      client=client)
                times.append(time.perf_counter() - t0)
            assert got.ranges() == want.ranges()
            peaks = client.run(_peak_rss_mib)
            rows[f"{workers} worker(s)"] = (statistics.median(times), max(peaks.values()),
                                            sorted(peaks.values()))
    args, first, second = _bytes(method, path, parts)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.group = f"onnx_cluster {IMAGES}x{SIDE}"
    benchmark.extra_info.update({"op": "onnx_cluster", "method": method, "images": IMAGES,
                                 "side": SIDE, "partitions": PARTS,
                                 "rows": {k: list(v[:2]) for k, v in rows.items()},
                                 "task_bytes": args, "round1_bytes": first,
                                 "round2_bytes": second, "load": os.getloadavg()})
    md = os.environ.get("QC_CLUSTER_BENCH_MD")
    if md:
        with open(md, "a") as f:
            for label, (seconds, peak, peaks) in rows.items():
                f.write(f"| {method} | {label} | {seconds:.2f} s | "
                        f"{rows['one machine'][0] / seconds:.2f}x | "
                        f"{peak:.0f} MiB{' (process)' if peaks is None else ''} | "
                        f"{args} / {first} / {second} | {os.getloadavg()[0]:.1f} |\n")
