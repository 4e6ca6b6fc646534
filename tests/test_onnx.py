"""quantcore.onnx end to end: the spec's model (Conv -> Relu -> GAP -> Flatten
-> MatMul -> Add) calibrated by quantcore and quantized by ORT's own
quantize_static through the calibration cache, against the 20 recorded
quantize_static runs of tests/data/onnxruntime_vectors.json (end_to_end) and
against live onnxruntime's own calibration."""
import functools
import os
import tempfile

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import CalibrationDataReader  # noqa: E402

from quantcore import onnx as qonnx  # noqa: E402
from quantcore.compat import onnxruntime as O  # noqa: E402
from ort_vectors import V, dec, same_bits  # noqa: E402

E2E = V["end_to_end"]
F32 = np.float32


def spec_model():
    init = {k: dec(v) for k, v in E2E["initializers"].items()}
    nodes = [
        helper.make_node("Conv", ["x", "W", "Bc"], ["conv_out"]),
        helper.make_node("Relu", ["conv_out"], ["relu_out"]),
        helper.make_node("GlobalAveragePool", ["relu_out"], ["gap_out"]),
        helper.make_node("Flatten", ["gap_out"], ["flat_out"]),
        helper.make_node("MatMul", ["flat_out", "W2"], ["mm_out"]),
        helper.make_node("Add", ["mm_out", "B2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "spec", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [numpy_helper.from_array(v, k) for k, v in init.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class Reader(CalibrationDataReader):
    def __init__(self, batches):
        self.batches = batches
        self.set_range(0, len(batches))

    def __len__(self):
        return len(self.batches)

    def set_range(self, start_index, end_index):
        self.it = iter(self.batches[start_index:end_index])

    def rewind(self):
        self.set_range(0, len(self.batches))

    def get_next(self):
        return next(self.it, None)


def batches():
    return [{"x": dec(b)} for b in E2E["batches"]]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "spec.onnx"
    onnx.save(spec_model(), str(path))
    # the recorded model: its float output on batch 0 (to float32 rounding: ORT's
    # Conv accumulates in a CPU-dependent order, the spec's machine had AVX2 only)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    y = session.run(None, batches()[0])[0]
    np.testing.assert_allclose(y, dec(E2E["float_y_batch0"]), rtol=1e-5, atol=1e-6)
    return str(path)


def _kwargs(cfg):
    kw = dict(cfg["kwargs"])
    method = kw.pop("calibrate_method", "CalibrationMethod.MinMax").split(".")[-1]
    extra = {}
    for k, v in cfg["extra_options"].items():
        if k == "TensorQuantOverrides":
            v = {t: [{kk: (dec(vv) if isinstance(vv, dict) else vv) for kk, vv in ov.items()}
                     for ov in lst] for t, lst in v.items()}
        extra[k] = v
    return method, kw, extra


def _config_run(cfg, model_path, out):
    method, kw, extra = _kwargs(cfg)
    return qonnx.quantize(
        model_path, out, Reader(batches()), calibrate_method=method.lower(),
        per_channel=kw.get("per_channel", False), reduce_range=kw.get("reduce_range", False),
        activation_type=kw["activation_type"], weight_type=kw["weight_type"],
        quant_format=kw["quant_format"], op_types_to_quantize=kw.get("op_types_to_quantize"),
        extra_options=extra)


def _ort_run(cfg, model_path, out):
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    method, kw, extra = _kwargs(cfg)
    quantize_static(model_path, out, Reader(batches()), calibrate_method=CalibrationMethod[method],
                    quant_format=QuantFormat[kw["quant_format"]],
                    activation_type=QuantType[kw["activation_type"]],
                    weight_type=QuantType[kw["weight_type"]],
                    per_channel=kw.get("per_channel", False),
                    reduce_range=kw.get("reduce_range", False),
                    op_types_to_quantize=kw.get("op_types_to_quantize"), extra_options=extra)


def _activations(model_path, reader):
    """The calibrated tensors of the spec model on a reader's batches."""
    m = qonnx.load_model(model_path)
    tensors, infos = qonnx.select_tensors(m)
    sess = qonnx._session(m, tensors, infos, None)
    names = [o.name for o in sess.get_outputs()]
    for feed in iter(reader.get_next, None):
        yield {n: v for n, v in zip(names, sess.run(names, feed)) if n in tensors}


def _initializers(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


@pytest.mark.parametrize("name", sorted(E2E["configs"]))
def test_end_to_end_configs(name, model_path, tmp_path):
    """Every recorded quantize_static configuration: ORT's quantizer fed with
    quantcore's ranges (through the cache) writes the model ORT's own
    calibration writes here, initializer for initializer and output for
    output; the ranges are the recorded ones (the input's bit for bit, the
    Conv-derived ones to float32 rounding: see model_path)."""
    cfg = E2E["configs"][name]
    ours, theirs = str(tmp_path / "qc.onnx"), str(tmp_path / "ort.onnx")
    res = _config_run(cfg, model_path, ours)
    _ort_run(cfg, model_path, theirs)
    a, b = _initializers(ours), _initializers(theirs)
    assert sorted(a) == sorted(b)
    for k in a:
        assert same_bits(a[k], b[k]), k
    assert set(cfg["initializers"]) <= set(a)
    ya = ort.InferenceSession(ours, providers=["CPUExecutionProvider"]).run(None, batches()[0])[0]
    yb = ort.InferenceSession(theirs, providers=["CPUExecutionProvider"]).run(None, batches()[0])[0]
    assert same_bits(ya, yb)
    rec = cfg["tensors_range"]["data"]
    if name == "qdq_u8s8_strided":
        # recorded with a reader whose set_range honoured only the start: the
        # calls read batches [0, 1, 2, 3] and [2, 3]
        class StartOnly(Reader):
            def set_range(self, start_index, end_index):
                self.it = iter(self.batches[start_index:])
        cal = qonnx.make_calibrator("minmax", {"moving_average": True})
        for r in (StartOnly(batches()), StartOnly(batches()[2:])):
            cal.collect_data(_activations(model_path, r))
        res = qonnx.CalibrationResult(cal.compute_data(), 4, {}, 0.0)
    got = res.tensors_range
    assert sorted(got.keys()) == sorted(rec)
    for t, exp in rec.items():
        for key in ("lowest", "highest", "avg", "std"):
            if key in exp:
                g, e = np.asarray(getattr(got[t], key)), dec(exp[key])
                if t == "x":
                    assert same_bits(g, e), (t, key)
                else:
                    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"{t} {key}")


@pytest.mark.parametrize("method,extra", [
    ("MinMax", {}), ("Entropy", {}), ("Percentile", {}), ("Distribution", {}),
    ("Entropy", {"num_bins": 512, "num_quantized_bins": 128}),
    ("Percentile", {"percentile": 99.0, "symmetric": False}),
    ("MinMax", {"moving_average": True, "symmetric": True}),
])
@pytest.mark.parametrize("per_batch", [False, True])
def test_live_ort_calibration_on_random_data(method, extra, per_batch, model_path):
    """quantcore.onnx.calibrate == ORT's create_calibrator on the same model
    and fresh random data, called once (the default) or once per batch
    (strided=1, ORT's CalibStridedMinMax=1)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    rng = np.random.default_rng(hash((method, per_batch, str(extra))) % 2**32)
    data = [{"x": (rng.standard_normal((2, 3, 5, 5)) * rng.uniform(0.1, 5)).astype(F32)}
            for _ in range(5)]
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        cal = create_calibrator(model_path, augmented_model_path=f"{d}/aug.onnx",
                                calibrate_method=CalibrationMethod[method], extra_options=extra)
        if per_batch:
            for b in data:
                cal.collect_data(Reader([b]))
        else:
            cal.collect_data(Reader(data))
        ref = cal.compute_data()
    res = qonnx.calibrate(model_path, Reader(data), method.lower(), options=dict(extra),
                          strided=1 if per_batch else None)
    assert sorted(res.tensors_range.keys()) == sorted(ref.keys())
    for t in ref.keys():
        for key in ("lowest", "highest", "avg", "std"):
            if hasattr(ref[t], key):
                assert same_bits(np.asarray(getattr(res.tensors_range[t], key)),
                                 np.asarray(getattr(ref[t], key))), (t, key)
        if method in ("Entropy", "Distribution"):
            key = "hist" if hasattr(ref[t], "hist") else None
            assert np.array_equal(res.tensors_range[t].hist, ref[t].hist)


def test_tensorrt_table_and_cache_files(model_path, tmp_path):
    res = qonnx.quantize(model_path, str(tmp_path / "q.onnx"), batches(),
                         calibration_cache_path=str(tmp_path / "cache.json"),
                         tensorrt_table=str(tmp_path / "trt"))
    back = O.load_tensors_data(tmp_path / "cache.json")
    assert sorted(back.keys()) == sorted(res.tensors_range.keys())
    cache_text = (tmp_path / "trt" / "calibration.cache").read_text()
    lines = dict(line.split() for line in cache_text.splitlines())
    for t, (lo, hi) in res.ranges().items():
        assert float(lines[t]) == max(abs(lo), abs(hi))  # the correct amax, not max(hi, lo)


def _one_node_model(path, op="Relu"):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("method", qonnx.ORT_METHODS)
def test_bad_data_gets_a_clear_result_or_error(method, tmp_path):
    path = _one_node_model(str(tmp_path / "relu.onnx"))
    zeros = [{"x": np.zeros((4, 8), F32)}]
    res = qonnx.calibrate(path, zeros, method)
    for t, (lo, hi) in res.ranges().items():
        assert lo <= 0 <= hi or (lo, hi) == (0.0, 0.0) or method == "distribution", (t, lo, hi)
        if method != "distribution":
            assert (abs(lo), abs(hi)) == (0.0, 0.0)
    const = [{"x": np.full((4, 8), 2.5, F32)}]
    res = qonnx.calibrate(path, const, method)
    assert res.ranges()["x"][1] == 2.5
    with pytest.raises(ValueError, match="No data is collected"):
        qonnx.calibrate(path, [], method)
    nan = np.ones((4, 8), F32)
    nan[1, 2] = np.nan
    if method == "percentile":  # ORT: |x| histogram of a first call with NaN fails
        with pytest.raises(ValueError, match=r"autodetected range of \[nan, nan\] is not finite"):
            qonnx.calibrate(path, [{"x": nan}, {"x": -nan}], method)
    else:
        res = qonnx.calibrate(path, [{"x": nan}, {"x": -nan}], method)
        assert res.nan_batches["x"] == 2
        lo, hi = res.ranges()["x"]
        assert np.isfinite(lo) and np.isfinite(hi)
    if method in ("entropy", "distribution", "percentile"):
        all_nan = [{"x": np.full((4, 8), np.nan, F32)}]
        with pytest.raises(ValueError, match="not finite"):
            qonnx.calibrate(path, all_nan, method)


# ----------------------------------------- Entropy with one candidate window
@pytest.mark.parametrize("bins,nq", [(128, 128), (129, 128), (128, 129), (255, 254), (1, 1),
                                     (2, 3), (9999, 9998)])
def test_single_entropy_window_is_orts_search(bins, nq):
    """num_bins // 2 == num_quantized_bins // 2: ORT's KL search has one
    window, the shortcut's threshold is live ORT's on histograms of every
    kind (sparse, one bin, all zeros, huge counts); other sizes search."""
    from ort_vectors import live_entropy_threshold
    assert O._single_entropy_window(bins, nq)
    assert not O._single_entropy_window(128, 64) and not O._single_entropy_window(10001, 10000)
    rng = np.random.default_rng(bins * 1000 + nq)
    edges = np.linspace(F32(-3), F32(3), bins + 1, dtype=F32)
    hists = [rng.integers(0, 50, bins), np.zeros(bins, np.int64),
             np.where(rng.random(bins) < 0.9, 0, rng.integers(1, 9, bins)),
             rng.integers(0, 2**40, bins)]
    one = np.zeros(bins, np.int64)
    one[bins // 3] = 7
    hists.append(one)
    for hist in hists:
        for lo, hi in ((F32(-2.5), F32(3)), (F32(-3), F32(1)), (F32(0), F32(0))):
            state = (hist.astype(np.int64), edges, lo, hi, F32(3))
            got = O.get_entropy_threshold(state, nq)
            (want_lo, want_hi), _ = live_entropy_threshold(state, nq)
            assert same_bits(np.asarray(got[0]), np.asarray(want_lo))
            assert same_bits(np.asarray(got[1]), np.asarray(want_hi))


@pytest.mark.parametrize("extra", [{}, {"num_bins": 129, "num_quantized_bins": 128},
                                   {"num_bins": 512, "num_quantized_bins": 128}])
def test_entropy_ranges_without_counts_are_orts(extra, model_path):
    """calibrate(histograms=False) with Entropy: one read where ORT's search
    has one window (the defaults), ORT's ranges bit for bit, no counts;
    otherwise (512 bins) the counts are taken as with histograms=True."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    rng = np.random.default_rng(len(extra) + extra.get("num_bins", 0))
    data = [{"x": (rng.standard_normal((2, 3, 5, 5)) * rng.uniform(0.1, 5)).astype(F32)}
            for _ in range(6)]
    with tempfile.TemporaryDirectory() as d:
        cal = create_calibrator(model_path, augmented_model_path=f"{d}/aug.onnx",
                                calibrate_method=CalibrationMethod.Entropy, extra_options=extra)
        cal.collect_data(Reader(data))
        ref = cal.compute_data()
    reads = []

    def counted():      # a replayable reader that counts its reads
        reads.append(1)
        return iter(data)
    one_window = extra.get("num_bins", 128) // 2 == 64
    for replay in ("auto", "rerun", "spill"):
        reads.clear()
        res = qonnx.calibrate(model_path, counted, "entropy", options=dict(extra),
                              histograms=False, replay=replay)
        assert len(reads) == (1 if one_window or replay != "rerun" else 2)
        assert sorted(res.tensors_range.keys()) == sorted(ref.keys())
        for t in ref.keys():
            for key in ("lowest", "highest"):
                assert same_bits(np.asarray(getattr(res.tensors_range[t], key)),
                                 np.asarray(getattr(ref[t], key))), (t, key)
            assert hasattr(res.tensors_range[t], "hist") == (not one_window)
        assert res.replay is None if one_window else res.replay is not None
    assert res.batches == len(data)
    # a reader that cannot be replayed: "rerun" needs no second read without counts
    if one_window:
        res = qonnx.calibrate(model_path, _OneShot(data), "entropy", options=dict(extra),
                              histograms=False, replay="rerun")
        assert res.batches == len(data) and res.replay is None
    else:
        with pytest.raises(TypeError):
            qonnx.calibrate(model_path, _OneShot(data), "entropy", options=dict(extra),
                            histograms=False, replay="rerun")


def test_entropy_ranges_without_counts_keep_orts_errors(tmp_path):
    """The bins are checked as np.histogram checks them, values or not:
    an infinite value (range not finite) and a range too narrow for 128
    bins fail as ORT does; NaN batches are counted."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    path = _one_node_model(str(tmp_path / "relu.onnx"))
    inf = np.ones((4, 8), F32)
    inf[0, 0] = np.inf
    tiny = np.full((4, 8), F32(1e-44))
    for feeds, match in (([{"x": inf}], "not finite"), ([{"x": tiny}], "Too many bins")):
        with tempfile.TemporaryDirectory() as d:
            cal = create_calibrator(path, augmented_model_path=f"{d}/aug.onnx",
                                    calibrate_method=CalibrationMethod.Entropy)
            with pytest.raises(ValueError, match=match):
                cal.collect_data(Reader(feeds))
        with pytest.raises(ValueError, match=match):
            qonnx.calibrate(path, feeds, "entropy", histograms=False)
    nan = np.ones((4, 8), F32)
    nan[1, 2] = np.nan
    res = qonnx.calibrate(path, [{"x": nan}, {"x": -nan}], "entropy", histograms=False)
    assert res.nan_batches["x"] == 2 and res.ranges()["x"] == (-1.0, 1.0)


@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_one_call_is_the_same_rerun_spilled_or_from_a_one_shot_reader(method, model_path,
                                                                      monkeypatch, tmp_path):
    """The default single call needs the range of the whole reader first: the
    values held in memory, spilled to a file, or the data read again (ORT's
    streaming two passes, or by chunks); a reader that cannot be replayed is
    never read twice.  The ranges and histograms are the same, bit for bit,
    NaN batches counted alike; replay="rerun" of a one-shot reader says why
    not."""
    # the spill files go to this test's own temporary folder (another
    # quantcore process's spill file in the system one is not this test's)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rng = np.random.default_rng(11)
    data = [{"x": (rng.standard_normal((2, 3, 5, 5)) * (i + 1)).astype(F32)} for i in range(5)]
    data[3]["x"][0, 1, 2, 2] = np.nan
    if method == "percentile":    # |x| of a call with NaN: ORT's error
        data[3]["x"][0, 1, 2, 2] = 0.25
    ref = qonnx.calibrate(model_path, data, method, replay="rerun")
    results = {"rerun": ref}
    results["memory"] = qonnx.calibrate(model_path, data, method)
    results["one-shot memory"] = qonnx.calibrate(model_path, iter(data), method)
    # chunks of one batch, a buffer of one chunk; small tensors joined or not
    # (the constants live in the calibration module)
    cal_mod = qonnx.calibration
    monkeypatch.setattr(cal_mod, "CHUNK_BYTES", 1)
    monkeypatch.setattr(cal_mod, "BUFFER_BYTES", 1)
    for small in (1 << 15, 0):
        monkeypatch.setattr(cal_mod, "SMALL_TENSOR", small)
        results[f"spill {small}"] = qonnx.calibrate(model_path, data, method, replay="spill")
        results[f"one-shot spill {small}"] = qonnx.calibrate(model_path, iter(data), method)
        monkeypatch.setattr(cal_mod, "SPILL_BYTES_PER_SECOND", 1e-3)   # the disk is slow: rerun
        results[f"chunked rerun {small}"] = qonnx.calibrate(model_path, data, method,
                                                            parallel=small == 0)
        monkeypatch.setattr(cal_mod, "SPILL_BYTES_PER_SECOND", 1e30)
    monkeypatch.setattr(cal_mod, "CHUNK_BYTES", 4000)   # chunks of two batches
    results["two-batch chunks"] = qonnx.calibrate(model_path, iter(data), method)
    # a spilled tensor gathered a piece at a time (its range, then its
    # counts: two reads of the file) or two chunks at a time
    for gather in (1, 1200):
        monkeypatch.setattr(cal_mod, "GATHER_BYTES", gather)
        results[f"gathered spill {gather}"] = qonnx.calibrate(model_path, data, method,
                                                              replay="spill")
    for key, res in results.items():
        assert res.replay == key.split()[-2 if key[-1].isdigit() else -1].replace(
            "chunks", "spill"), (key, res.replay)
        _same_result(res, ref)
    assert ref.nan_batches.get("x", 0) == (0 if method == "percentile" else 1)
    with pytest.raises(TypeError, match="reads the data twice"):
        qonnx.calibrate(model_path, iter(data), method, replay="rerun")
    assert qonnx.calibrate(model_path, lambda: iter(data), method).batches == 5
    assert tempfile.gettempdir() == str(tmp_path)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".spill")]
    legacy = qonnx.calibrate(model_path, data, method, passes=1)
    _same_result(legacy, qonnx.calibrate(model_path, data, method, strided=1))


def test_spooled_reader_replays_any_reader(model_path):
    class OneShot:
        def __init__(self):
            self.it = iter(batches())

        def get_next(self):
            return next(self.it, None)

    with qonnx.SpooledReader(OneShot()) as r:
        first = list(r)
        second = list(r)
        assert len(r) == 4 and qonnx.replayable(r)
    assert all(same_bits(a["x"], b["x"]) for a, b in zip(first, second))
    assert not qonnx.replayable(OneShot()) and qonnx.replayable(batches())


def test_quantcore_methods_quantize(model_path, tmp_path):
    for method in qonnx.QUANTCORE_METHODS:
        out = str(tmp_path / f"{method}.onnx")
        # 256 bins: NVIDIA's entropy / mse try every bin (2048: 30 s here)
        res = qonnx.quantize(model_path, out, batches(), calibrate_method=method,
                             calibration_options={"num_bins": 256})
        for t, (lo, hi) in res.ranges().items():
            assert np.isfinite(lo) and np.isfinite(hi) and lo <= hi, (method, t)
        ev = qonnx.evaluate(model_path, out, batches())
        assert ev["sqnr_db"]["y"] > 10, (method, ev)


def _same_result(a, b):
    assert sorted(a.tensors_range.keys()) == sorted(b.tensors_range.keys())
    for t in a.tensors_range.keys():
        x, y = a.tensors_range[t], b.tensors_range[t]
        for key in ("lowest", "highest", "avg", "std", "hist", "hist_edges"):
            if hasattr(y, key):
                assert same_bits(np.asarray(getattr(x, key)), np.asarray(getattr(y, key))), (t, key)
    assert (a.batches, a.nan_batches) == (b.batches, b.nan_batches)


@pytest.fixture(scope="module")
def batch_model_path(tmp_path_factory):
    """The spec model with a free batch dimension."""
    m = spec_model()
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    path = str(tmp_path_factory.mktemp("m") / "spec_n.onnx")
    onnx.save(m, path)
    return path


def test_first_error_is_orts_in_every_replay(tmp_path):
    """Two tensors that fail np.histogram in different ways (too many bins
    for a range one float32 ulp wide; a NaN range): ORT raises for the first
    tensor it stacks, and so does every replay, whether it reduces tensor by
    tensor (kept, spilled) or takes all ranges before any count (rerun)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["nx"]),
             helper.make_node("Sqrt", ["nx"], ["b"])]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in ("a", "b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["N", 4])], vi,
                          value_info=[helper.make_tensor_value_info("nx", TensorProto.FLOAT,
                                                                    ["N", 4])])
    path = str(tmp_path / "order.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              path)
    x = np.array([[1.0, np.nextafter(F32(1), F32(2)), -1.0, 1.0]], F32)
    data = [{"x": x}, {"x": x}]
    cal = create_calibrator(path, augmented_model_path=str(tmp_path / "aug.onnx"),
                            calibrate_method=CalibrationMethod.Percentile)
    with pytest.raises(ValueError, match="Too many bins"):
        cal.collect_data(Reader(data))
    for replay in qonnx.REPLAYS:
        with pytest.raises(ValueError, match="Too many bins"):
            qonnx.calibrate(path, data, "percentile", replay=replay)


def test_no_inference_thread_outlives_a_failed_call(batch_model_path):
    """A call that fails mid-way in the calling thread (a batch of another
    shape: ORT's stacking error) or in the reader: the error is raised, and
    while it (and its traceback) is still held, no inference thread is left
    running."""
    import threading

    def feeds():
        for i in range(6):
            if i == 3:
                raise RuntimeError("reader broke")
            yield {"x": np.ones((2, 3, 5, 5), F32)}
    shapes = [{"x": np.ones((n, 3, 5, 5), F32)} for n in (2, 2, 3, 2, 2, 2)]
    for data, method, error in [(shapes, "entropy", "inhomogeneous"),
                                (feeds, "minmax", "reader broke")]:
        with pytest.raises((ValueError, RuntimeError), match=error) as info:
            qonnx.calibrate(batch_model_path, data, method, parallel=True)
        assert info.value is not None
        assert not [t for t in threading.enumerate() if t.name == "quantcore-onnx-inference"]


def test_spill_gather_reads_past_short_reads(tmp_path, monkeypatch):
    """One read returns at most about 2 GiB on Linux: _Spill.gather reads a
    piece until it is whole (here every read returns at most 7 bytes)."""
    from quantcore.onnx import readers
    real_preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, offset: real_preadv(
        fd, [memoryview(bufs[0])[:7]], offset))
    spill = readers._Spill(str(tmp_path))
    assert os.listdir(tmp_path) == []     # (the spill file has no name)
    a = np.arange(100, dtype=F32)
    spill.write_parts({"t": [a[:60], a[60:]]}, 1)
    spill.write_parts({"t": [np.arange(5, dtype=F32)]}, 3)
    got = list(spill.gather("t", 1 << 20))
    assert len(got) == 1 and got[0][0] == 5
    assert np.array_equal(got[0][1], np.concatenate([a, np.arange(5, dtype=F32)]))
    assert [b for b, _ in spill.gather("t", 240)] == [1, 4]     # 240 B, then 160 + 20 B
    spill.close()


def test_parallel_auto_threads_small_batches_reduced_as_they_come(batch_model_path,
                                                                  monkeypatch):
    """parallel=None (default): the inference thread for MinMax / strided
    calls whose first batch is under THREAD_BATCH_BYTES, not for a large
    batch nor for the histogram methods' single call; no thread pool.  The
    same result as parallel=False and True."""
    cal_mod = qonnx.calibration
    threaded, pools = [], []
    real_prefetch, real_pool = cal_mod._prefetch, O.tensor_executor
    monkeypatch.setattr(cal_mod, "_prefetch", lambda f: threaded.append(1) or real_prefetch(f))
    monkeypatch.setattr(O, "tensor_executor", lambda *a: pools.append(1) or real_pool(*a))
    rng = np.random.default_rng(2)
    small = [{"x": rng.standard_normal((2, 3, 5, 5)).astype(F32)} for _ in range(4)]
    large = [{"x": rng.standard_normal((4000, 3, 5, 5)).astype(F32)} for _ in range(3)]
    for data, method, strided, thread in [(small, "minmax", None, True),
                                          (small, "entropy", 1, True),
                                          (small, "distribution", None, False),
                                          (large, "minmax", None, False)]:
        threaded.clear()
        pools.clear()
        auto = qonnx.calibrate(batch_model_path, data, method, strided=strided)
        assert bool(threaded) == thread and not pools, (method, strided)
        for parallel in (False, True):
            _same_result(auto, qonnx.calibrate(batch_model_path, data, method, strided=strided,
                                               parallel=parallel))
        assert threaded and pools     # (parallel=True: both)
    with pytest.raises(TypeError, match="parallel must be"):
        qonnx.calibrate(batch_model_path, small, "minmax", parallel=1)


@pytest.mark.parametrize("method", ["Entropy", "Distribution"])
def test_batches_of_other_shapes_in_one_call_are_orts_error(method, batch_model_path,
                                                            monkeypatch):
    """ORT stacks the batches of one call: a batch of another size is its
    ValueError (live ORT), in every replay and also past the first chunk
    (quantcore looks at a batch's shapes only when they change); one call
    per batch (strided=1) takes them, as ORT does."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    rng = np.random.default_rng(8)
    data = [{"x": rng.standard_normal((n, 3, 5, 5)).astype(F32)} for n in (2, 2, 2, 3, 2)]
    with tempfile.TemporaryDirectory() as d:
        cal = create_calibrator(batch_model_path, augmented_model_path=f"{d}/aug.onnx",
                                calibrate_method=CalibrationMethod[method])
        with pytest.raises(ValueError, match="inhomogeneous shape"):
            cal.collect_data(Reader(data))
            cal.compute_data()
    monkeypatch.setattr(qonnx.calibration, "CHUNK_BYTES", 1)
    for replay in ("auto", "spill", "rerun"):
        with pytest.raises(ValueError, match="inhomogeneous shape"):
            qonnx.calibrate(batch_model_path, data, method.lower(), replay=replay)
    assert qonnx.calibrate(batch_model_path, data, method.lower(), strided=1).batches == 5


@pytest.mark.parametrize("method,strided", [(m, k) for m in qonnx.ORT_METHODS for k in (1, None)]
                         + [("torch_histogram", None), ("nvidia_percentile", None)])
def test_parallel_calibration_is_the_sequential_one(method, strided, batch_model_path):
    """parallel=True (inference one batch ahead in a thread, tensors reduced
    by a thread pool) gives what one batch at a time gives, bit for bit, on
    batches large enough for the kernels' parallel paths, NaN included."""
    rng = np.random.default_rng(5)
    data = [{"x": (rng.standard_normal((1400, 3, 5, 5)) * (i + 1)).astype(F32)} for i in range(4)]
    data[2]["x"][7, 1, 2, 3] = np.nan
    opts = {"num_bins": 256} if method in qonnx.QUANTCORE_METHODS else None
    # (quantcore's own methods reduce in the calling thread: only the
    # inference thread differs for them)
    if method == "percentile":       # |x| of a first call with NaN: ORT's error, both ways
        data[2]["x"][7, 1, 2, 3] = 0.5
    par = qonnx.calibrate(batch_model_path, data, method, strided=strided, options=opts,
                          parallel=True)
    seq = qonnx.calibrate(batch_model_path, data, method, strided=strided, options=opts,
                          parallel=False)
    _same_result(par, seq)


class _Counted:
    alive = 0
    most = 0

    def __init__(self):
        _Counted.alive += 1
        _Counted.most = max(_Counted.most, _Counted.alive)

    def __del__(self):
        _Counted.alive -= 1


def test_prefetch_reads_one_batch_ahead_at_most():
    """A fast producer and a slow consumer: the producer waits (no unbounded
    read-ahead); the consumer's previous item is still bound while it asks
    for the next, so three exist for a moment."""
    import time
    made = []

    def produce():
        for i in range(12):
            made.append(i)
            yield _Counted()

    seen = 0
    for item in qonnx._prefetch(produce):
        time.sleep(0.01)
        assert len(made) <= seen + 2
        seen += 1
    assert seen == 12 and _Counted.most <= 3


def test_prefetch_raises_the_readers_error_and_stops_its_thread(model_path):
    import threading

    class Broken:
        def __init__(self):
            self.n = 0

        def get_next(self):
            self.n += 1
            if self.n == 3:
                raise OSError("disk gone")
            return batches()[0]

    with pytest.raises(OSError, match="disk gone"):
        qonnx.calibrate(model_path, Broken(), "entropy")
    gen = qonnx._prefetch(lambda: iter(range(100)))
    assert next(gen) == 0
    gen.close()
    assert not [t for t in threading.enumerate() if t.name == "quantcore-onnx-inference"]


def test_quantize_has_quantize_statics_parameters_and_defaults():
    """quantize takes quantize_static's parameters in its order, with its
    defaults (read from the installed ORT); QUANTIZE_DEFAULTS lists them."""
    import inspect

    from onnxruntime.quantization import quantize_static
    theirs = inspect.signature(quantize_static).parameters
    ours = inspect.signature(qonnx.quantize).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    for name, p in theirs.items():
        q = ours[name]
        assert q.kind == p.kind, name
        if p.default is inspect.Parameter.empty:
            assert q.default is inspect.Parameter.empty, name
            continue
        # enums: quantcore's compat twins of ORT's, compared by name
        assert getattr(q.default, "name", q.default) == getattr(p.default, "name", p.default), name
        assert type(q.default).__name__ == type(p.default).__name__, name
        assert qonnx.QUANTIZE_DEFAULTS[name] is q.default
    assert set(qonnx.QUANTIZE_DEFAULTS) == {n for n, p in theirs.items()
                                            if p.default is not inspect.Parameter.empty}
    assert all(ours[n].kind == inspect.Parameter.KEYWORD_ONLY for n in list(ours)[len(theirs):])
    # the module docstring and quantize's list them
    for name, value in qonnx.QUANTIZE_DEFAULTS.items():
        text = f"{name}={getattr(value, 'name', value)}"
        assert text in " ".join(qonnx.__doc__.split()), text


@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile", "Distribution"])
def test_default_call_is_quantize_statics_default_call(method, batch_model_path, tmp_path):
    """quantize(model, out, reader) with nothing else == quantize_static's
    default call: same initializers, same outputs, bit for bit (a reader
    that cannot be replayed, as ORT's usually are)."""
    from onnxruntime.quantization import CalibrationMethod, quantize_static
    rng = np.random.default_rng(3)
    data = [{"x": (rng.standard_normal((3, 3, 5, 5)) * (i + 1)).astype(F32)} for i in range(4)]

    class OneShot:
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    ours, theirs = str(tmp_path / "qc.onnx"), str(tmp_path / "ort.onnx")
    kw = {} if method == "MinMax" else {"calibrate_method": CalibrationMethod[method]}
    if method == "Distribution":   # ORT: float 8 only
        kw.update(activation_type="QFLOAT8E4M3FN", weight_type="QFLOAT8E4M3FN")
        from onnxruntime.quantization import QuantType
        ort_kw = dict(kw, activation_type=QuantType.QFLOAT8E4M3FN,
                      weight_type=QuantType.QFLOAT8E4M3FN)
    else:
        ort_kw = kw
    qonnx.quantize(batch_model_path, ours, OneShot(), **kw)
    quantize_static(batch_model_path, theirs, OneShot(), **ort_kw)
    a, b = _initializers(ours), _initializers(theirs)
    assert sorted(a) == sorted(b)
    for k in a:
        assert same_bits(a[k], b[k]), k
    sa = ort.InferenceSession(ours, providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(theirs, providers=["CPUExecutionProvider"])
    for feed in data:
        assert same_bits(sa.run(None, feed)[0], sb.run(None, feed)[0])


# ---------------------------------------------------------------- real models
# Models the project did not build, from PyPI wheels (the `test` extra):
# silero-vad's recurrent voice activity detector (a state input whose batch
# axis is 1, a 0-d sample rate) and RapidOCR's PP-OCRv4 text detector,
# recognizer and direction classifier.

@functools.lru_cache(maxsize=None)
def _wheel_model(package, relative):
    """A copy, in this run's own temporary folder, of the .onnx file a wheel
    ships (found without importing the package, which would import torch /
    OpenCV); a skip when it is not installed.

    Never the installed file itself: ORT's quantize_static writes
    ``<model>-inferred.onnx`` beside the model it is given and deletes it,
    so two test runs at once (make test's lanes) calibrating the same
    installed model delete each other's file (seen: FileNotFoundError in
    test_cluster_real_model while test-bench ran)."""
    import importlib.util
    import shutil
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        pytest.skip(f"{package} is not installed (pip install '.[test]')")
    path = os.path.join(os.path.dirname(spec.origin), relative)
    assert os.path.isfile(path), path
    folder = os.path.join(tempfile.gettempdir(), "wheel-models", package)
    os.makedirs(folder, exist_ok=True)
    return shutil.copy(path, folder)


def vad_feeds(path, batches=4, rows=3, seed=0):
    """Speech-like 512-sample chunks at 16 kHz, the state carried by the
    float model from chunk to chunk (as the model is used)."""
    rng = np.random.default_rng(seed)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    t = np.arange(512 * batches) / 16000
    state = np.zeros((2, rows, 128), F32)
    feeds = []
    for b in range(batches):
        f0 = rng.uniform(90, 250, (rows, 1))
        seg = t[b * 512:(b + 1) * 512]
        x = (0.3 * np.sin(2 * np.pi * f0 * seg) * (1 + np.sin(2 * np.pi * 3 * seg))
             + 0.02 * rng.standard_normal((rows, 512))).astype(F32)
        feed = {"input": x, "state": state, "sr": np.array(16000, np.int64)}
        feeds.append(feed)
        state = sess.run(None, feed)[1]
    return feeds


def ocr_feeds(batches=3, h=64, w=96, seed=0):
    """Dark strokes on light paper, normalized as PP-OCR does ((x / 255 - 0.5) / 0.5)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(batches):
        img = np.full((h, w, 3), 235.0) + rng.normal(0, 6, (h, w, 3))
        for _ in range(6):
            y0, x0 = rng.integers(4, h - 12), rng.integers(4, w - 30)
            img[y0:y0 + rng.integers(3, 8), x0:x0 + rng.integers(8, 28)] = rng.uniform(10, 60)
        x = ((np.clip(img, 0, 255) / 255 - 0.5) / 0.5).astype(F32)
        feeds.append({"x": x.transpose(2, 0, 1)[None].copy()})
    return feeds


REAL_MODELS = {
    "silero_vad": (("silero_vad", "data/silero_vad_16k_op15.onnx"), vad_feeds),
    "ppocr_det": (("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"),
                  lambda path: ocr_feeds()),
    # the text-line recognizer (48 px high, a 6625-class softmax per column;
    # ORT's default int8 costs it most of its output SQNR) and the 0/180
    # degree classifier, text lines as RapidOCR crops them
    "ppocr_rec": (("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"),
                  lambda path: ocr_feeds(2, 48, 160)),
    "ppocr_cls": (("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
                  lambda path: ocr_feeds(3, 48, 192)),
}


class _OneShot:
    """An ORT-style reader that cannot be replayed."""

    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


#: the (model, method) pairs of make test: every method on silero-vad and the
#: detector; one each on the recognizer (its quantize_static call alone is
#: ~15 s on 2 cores) and the classifier; the rest with --runslow
_FAST_REAL = {("ppocr_rec", "MinMax"), ("ppocr_cls", "Entropy")}
REAL_CASES = [pytest.param(name, method, marks=() if name in ("silero_vad", "ppocr_det")
                           or (name, method) in _FAST_REAL else pytest.mark.slow)
              for name in sorted(REAL_MODELS) for method in ("MinMax", "Entropy", "Percentile")]


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # ORT's
@pytest.mark.parametrize("name, method", REAL_CASES)
def test_real_models_from_wheels_equal_quantize_static(name, method, tmp_path):
    """quantize() with ORT's defaults == quantize_static's default call on a
    real model: the same file, byte for byte (the same graph: ORT's
    quantizer ran with handoff's indexed renames and lookups), hence the
    same initializers and outputs, bit for bit."""
    from onnxruntime.quantization import CalibrationMethod, quantize_static
    (package, relative), make = REAL_MODELS[name]
    path = _wheel_model(package, relative)
    feeds = make(path)
    ours, theirs = str(tmp_path / "qc.onnx"), str(tmp_path / "ort.onnx")
    res = qonnx.quantize(path, ours, _OneShot(feeds), calibrate_method=method)
    quantize_static(path, theirs, _OneShot(feeds), calibrate_method=CalibrationMethod[method])
    a, b = _initializers(ours), _initializers(theirs)
    assert sorted(a) == sorted(b)
    for k in a:
        assert same_bits(a[k], b[k]), k
    with open(ours, "rb") as fa, open(theirs, "rb") as fb:
        assert fa.read() == fb.read()
    assert len(res.tensors_range) > 30
    sa = ort.InferenceSession(ours, providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(theirs, providers=["CPUExecutionProvider"])
    for feed in feeds[:2]:
        for ya, yb in zip(sa.run(None, feed), sb.run(None, feed)):
            assert same_bits(ya, yb)


def test_real_detector_percentile_per_batch(tmp_path):
    """CalibStridedMinMax=1 with Percentile on the PP-OCR detector (empty
    float constants: ORT's surprise 18) calibrates every tensor."""
    path = _wheel_model("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")
    res = qonnx.calibrate(path, ocr_feeds(2, 64, 64), "percentile", strided=1)
    assert all(np.isfinite(lo) and np.isfinite(hi) for lo, hi in res.ranges().values())
