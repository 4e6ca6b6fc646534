"""quantcore.onnx on a Dask cluster (quantcore/onnx/cluster.py): a real
LocalCluster of 2 worker processes; the model quantize(..., client=) writes
is ORT's quantize_static's on one machine over the partitions' batches in
order, bit for bit; a worker killed mid-task is replaced and the result is
the same; a partition that kills every worker is named; no worker leaves a
file in its temporary folder."""
import functools
import os
import signal
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
distributed = pytest.importorskip("distributed")

from quantcore import onnx as qonnx  # noqa: E402
from ort_vectors import same_bits  # noqa: E402
from test_onnx import (REAL_MODELS, Reader, _initializers, _wheel_model,  # noqa: E402, F401
                       batch_model_path, spec_model)

F32 = np.float32


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(client, the workers' temporary folder): 2 processes, one thread
    each; a task may see one worker die and is retried (allowed-failures 1)."""
    import cloudpickle
    import dask
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    tmp = tmp_path_factory.mktemp("worker_tmp")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)     # the worker processes' tempfile folder
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
            cluster = distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                local_directory=str(tmp_path_factory.mktemp("dask")))
            client = distributed.Client(cluster)
            try:
                yield client, tmp
            finally:
                client.close()
                cluster.close()
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old
    left = sorted(set(os.listdir(tmp)) - FOREIGN)
    assert not left, f"a worker left a file in its temporary folder: {left}"


#: what the worker processes' libraries leave in their temporary folder
#: (jaxlib's session file, imported by the workers; dask's scratch folder)
FOREIGN = {".ses", "dask-scratch-space"}


@pytest.fixture(scope="module")
def model_n(batch_model_path):  # noqa: F811 (the fixture imported above)
    """test_onnx's spec model with a free batch dimension."""
    return batch_model_path


def _feeds(rows=(2, 2, 2, 2, 2, 2, 2), seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(rows):
        x = (rng.standard_normal((n, 3, 5, 5)) * (i + 1)).astype(F32)
        if i == 2:
            x[0, 0, 0, :2] = [-0.0, 0.0]
        out.append({"x": x})
    return out


def _partitions(feeds, folder):
    """Uneven partitions of every kind: a list of feeds, a per-batch .npz,
    a folder of .npz feeds, a reader factory, one empty list."""
    folder.mkdir(exist_ok=True)
    np.savez(folder / "p1.npz", **{f"{i}/x": f["x"] for i, f in enumerate(feeds[1:3])})
    (folder / "p2").mkdir(exist_ok=True)
    for i, f in enumerate(feeds[3:5]):
        np.savez(folder / "p2" / f"{i:03d}.npz", **f)
    return [feeds[:1], str(folder / "p1.npz"), str(folder / "p2"), [],
            functools.partial(list, feeds[5:])]


def _same_models(a, b):
    x, y = _initializers(a), _initializers(b)
    assert sorted(x) == sorted(y)
    for k in x:
        assert same_bits(x[k], y[k]), k


CASES = [("MinMax", {}, None), ("MinMax", {"CalibMovingAverage": True,
                                           "CalibMaxIntermediateOutputs": 3}, None),
         ("MinMax", {"CalibStridedMinMax": 7, "CalibMovingAverage": True}, None),
         ("MinMax", {}, (2, 1, 3, 2, 1, 2, 2)),       # batches of other shapes
         ("Entropy", {}, None), ("Percentile", {}, None),
         ("Distribution", {}, None),
         # strided histogram methods: each call grows the histograms of the calls before
         ("Entropy", {"CalibStridedMinMax": 1}, None),
         ("Percentile", {"CalibStridedMinMax": 2}, (2,) * 8),
         ("Distribution", {"CalibStridedMinMax": 4}, (2,) * 8)]


@pytest.mark.parametrize("method,extra,rows", CASES)
def test_cluster_model_is_quantize_statics_on_one_machine(method, extra, rows, cluster,
                                                          model_n, tmp_path):
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static
    client, _ = cluster
    feeds = _feeds(rows or (2,) * 7)   # (growing ranges: later calls widen the histograms)
    kw = {}
    if method == "Distribution":
        kw = dict(activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN)
    ours, theirs = str(tmp_path / "qc.onnx"), str(tmp_path / "ort.onnx")
    res = qonnx.quantize(model_n, ours, _partitions(feeds, tmp_path / "data"),
                         calibrate_method=method, extra_options=dict(extra), client=client, **kw)
    assert res.batches == len(feeds)
    quantize_static(model_n, theirs, Reader(feeds), calibrate_method=CalibrationMethod[method],
                    extra_options=dict(extra), **kw)
    _same_models(ours, theirs)
    if method == "Percentile":   # the histograms themselves, with the counts
        here = qonnx.calibrate(model_n, feeds, "percentile")
        there = qonnx.calibrate(model_n, _partitions(feeds, tmp_path / "data"), "percentile",
                                client=client)
        for k, td in here.tensors_range.items():
            for attr in td._attrs:
                assert same_bits(np.asarray(getattr(td, attr)),
                                 np.asarray(getattr(there.tensors_range[k], attr))), (k, attr)


def test_cluster_real_model(cluster, tmp_path):
    """silero-vad (a recurrent state, a 0-d sample rate), Percentile and
    moving-average MinMax, in 3 partitions against quantize_static."""
    from onnxruntime.quantization import CalibrationMethod, quantize_static
    client, _ = cluster
    (package, relative), make = REAL_MODELS["silero_vad"]
    path = _wheel_model(package, relative)
    feeds = make(path)
    parts = [feeds[:1], feeds[1:3], feeds[3:]]
    for method, extra in (("Percentile", {}), ("MinMax", {"CalibMovingAverage": True})):
        ours, theirs = str(tmp_path / f"qc{method}.onnx"), str(tmp_path / f"ort{method}.onnx")
        qonnx.quantize(path, ours, parts, calibrate_method=method, extra_options=extra,
                       client=client)
        quantize_static(path, theirs, Reader(feeds), calibrate_method=CalibrationMethod[method],
                        extra_options=extra)
        _same_models(ours, theirs)


def test_partition_of_another_shape_fails_as_ort(cluster, model_n):
    """One call stacks the batches: a partition whose tensors have another
    shape fails with ORT's stacking error (ORT: numpy's inhomogeneous
    shape); a bad feed names its partition."""
    client, _ = cluster
    feeds = _feeds((2, 2, 3))
    with pytest.raises(ValueError, match="inhomogeneous shape"):
        qonnx.calibrate(model_n, [feeds[:2], feeds[2:]], "entropy", client=client)
    with pytest.raises(ValueError, match="partition 1.*'y'"):
        qonnx.calibrate(model_n, [feeds[:1], [{"y": feeds[0]["x"]}]], client=client)


def _killer(marker, feeds, always=False):
    """A reader factory that kills its worker process (the first time, or
    every time)."""
    if always or not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    return feeds


def test_killed_worker(cluster, model_n, tmp_path):
    """A worker killed mid-task: Dask runs the task again on a live worker
    and the result is the one without the fault; a partition that kills
    its worker every time is a RuntimeError naming it."""
    client, _ = cluster
    feeds = _feeds()
    want = qonnx.calibrate(model_n, feeds, "percentile").tensors_range
    parts = [feeds[:3], functools.partial(_killer, str(tmp_path / "once"), feeds[3:])]
    got = qonnx.calibrate(model_n, parts, "percentile", client=client).tensors_range
    for k, td in want.items():
        for attr in td._attrs:
            assert same_bits(np.asarray(getattr(td, attr)),
                             np.asarray(getattr(got[k], attr))), (k, attr)
    # (alone: Dask counts a death against every task queued on that worker)
    parts = [functools.partial(_killer, str(tmp_path / "always"), feeds[3:], True)]
    with pytest.raises(RuntimeError, match="partition 0: its worker died"):
        qonnx.calibrate(model_n, parts, "minmax", client=client)
    client.wait_for_workers(2, timeout=60)


@pytest.mark.parametrize("layout", ["arrays", "folder"])
def test_cli_dask_is_one_machines_model(layout, cluster, model_n, tmp_path, capsys):
    """``quantcore onnx quantize --dask ADDRESS``: --data split into
    partitions the workers read (an .npz of arrays in batches of 2, or a
    folder of feeds), the model the same as without --dask."""
    from quantcore.cli import main
    client, _ = cluster
    feeds = _feeds()
    if layout == "arrays":
        data = tmp_path / "calib.npz"
        np.savez(data, x=np.concatenate([f["x"] for f in feeds]))
    else:
        data = tmp_path / "feeds"
        data.mkdir()
        for i, f in enumerate(feeds):
            np.savez(data / f"{i:03d}.npz", **f)
    outs = []
    for dask in (None, client.scheduler.address):
        out = tmp_path / f"q{len(outs)}.onnx"
        args = ["onnx", "quantize", model_n, "--data", str(data), "--method", "percentile",
                "--batch-size", "2", "-o", str(out), "-q"] + (["--dask", dask] if dask else [])
        assert main(args) == 0, capsys.readouterr().out
        outs.append(str(out))
    _same_models(*outs)
    assert main(["onnx", "calibrate", model_n, "--data", str(data), "--dask", "local:0",
                 "-o", str(tmp_path / "c.json")]) == 2
    assert "local:N takes a number of worker processes" in capsys.readouterr().err


def test_no_worker_left_is_an_error_not_a_hang(model_n, monkeypatch):
    """A cluster with no worker (every one gone, none joining): Dask waits
    forever; the run fails after NO_WORKERS_S naming the partition and the
    scheduler."""
    from quantcore.onnx import cluster as qcluster
    monkeypatch.setattr(qcluster, "NO_WORKERS_S", 1.0)
    monkeypatch.setattr(qcluster, "_POLL_S", 0.2)
    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        with pytest.raises(RuntimeError, match=r"partition 0: the Dask cluster at .* has had "
                                               r"no worker for 1 s"):
            qonnx.calibrate(model_n, [_feeds()[:3]], "minmax", client=client)
