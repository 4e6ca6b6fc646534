"""quantcore.onnx.quantize hands its ranges to ORT's quantize_static in
memory (quantcore/onnx/handoff.py): no calibration cache is written unless
the user names one, no text format on the way, the same model as ORT's
default call; a named cache is ORT's JSON, written by one encoder call."""
import json
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from quantcore import onnx as qonnx  # noqa: E402
from quantcore.compat import onnxruntime as O  # noqa: E402
from ort_vectors import same_bits  # noqa: E402
from test_onnx import Reader, _initializers, batch_model_path, spec_model  # noqa: E402, F401

F32 = np.float32


@pytest.fixture(scope="module")
def spec_n(batch_model_path):  # noqa: F811 (the fixture imported above)
    """test_onnx's spec model with a free batch dimension."""
    return batch_model_path


def _feeds(n=3):
    rng = np.random.default_rng(7)
    return [{"x": (rng.standard_normal((2, 3, 5, 5)) * (i + 1)).astype(F32)} for i in range(n)]


def _no_json(*args, **kwargs):
    raise AssertionError("a JSON encoder ran on the way to ORT")


@pytest.mark.parametrize("method,extra", [("Distribution", {}), ("Percentile", {}),
                                          ("MinMax", {"CalibStridedMinMax": 1})])
def test_no_cache_no_json_same_model_as_quantize_static(method, extra, spec_n, tmp_path,
                                                        monkeypatch):
    """Without calibration_cache_path nothing is encoded as JSON and no file
    but the model is written (the old path wrote a JSON cache in a temporary
    folder and made ORT read it back); the model is ORT's default call's,
    byte for byte."""
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static
    kw = {}
    if method == "Distribution":    # ORT: float 8 only
        kw = dict(activation_type=QuantType.QFLOAT8E4M3FN, weight_type=QuantType.QFLOAT8E4M3FN)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with monkeypatch.context() as m:
        m.setattr(json, "dump", _no_json)
        m.setattr(json, "dumps", _no_json)
        m.setattr(O, "save_tensors_data", _no_json)
        qonnx.quantize(spec_n, str(out_dir / "qc.onnx"), _feeds(),
                       calibrate_method=method, extra_options=dict(extra), **kw)
    assert sorted(p.name for p in out_dir.iterdir()) == ["qc.onnx"]
    theirs = str(tmp_path / "ort.onnx")
    quantize_static(spec_n, theirs, Reader(_feeds()),
                    calibrate_method=CalibrationMethod[method], extra_options=dict(extra), **kw)
    a, b = _initializers(str(out_dir / "qc.onnx")), _initializers(theirs)
    assert sorted(a) == sorted(b)
    for k in a:
        assert same_bits(a[k], b[k]), k
    with open(out_dir / "qc.onnx", "rb") as fa, open(theirs, "rb") as fb:
        assert fa.read() == fb.read()     # (ORT's quantizer with handoff's fast paths)


def test_ort_called_directly_keeps_its_own_calibrator(spec_n, tmp_path):
    """After quantcore's handoff (and from another thread), ORT's own
    quantize_static still calibrates with ORT's calibrator: the same model as
    quantcore's."""
    from onnxruntime.quantization import quantize_static
    ours = str(tmp_path / "qc.onnx")
    qonnx.quantize(spec_n, ours, _feeds())
    errors = []

    def theirs(path):
        try:
            quantize_static(spec_n, path, Reader(_feeds()))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    t = threading.Thread(target=theirs, args=(str(tmp_path / "t.onnx"),))
    t.start()
    t.join()
    theirs(str(tmp_path / "ort.onnx"))
    assert not errors
    a = _initializers(ours)
    for other in ("t.onnx", "ort.onnx"):
        b = _initializers(str(tmp_path / other))
        assert sorted(a) == sorted(b)
        assert all(same_bits(a[k], b[k]) for k in a)


def test_named_cache_is_orts_json_in_one_encoder_call(tmp_path, monkeypatch):
    """save_tensors_data: ORT's load_tensors_data reads back every value bit
    for bit (signed zeros, inf, NaN, float16, int counts), and the text is
    made by one json.dumps call, never json.dump's value-by-value encoder."""
    from onnxruntime.quantization.calibrate import load_tensors_data
    edges = np.array([-0.0, 0.1, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], F32)
    td = O.TensorsData(O.CalibrationMethod.Distribution, {
        "a": O.TensorData(lowest=np.array(-0.0, F32), highest=np.array([0.1], F32),
                          hist=np.arange(6, dtype=np.int64), hist_edges=edges,
                          avg=np.float32(0.25), std=np.array(1.5, np.float16)),
        "b": O.TensorData(lowest=np.array([-1.5], F32), highest=np.array([2.5], F32))})
    monkeypatch.setattr(json, "dump", _no_json)
    O.save_tensors_data(td, tmp_path / "c.json")
    back = load_tensors_data(tmp_path / "c.json")
    assert back.calibration_method.name == "Distribution"
    for name, v in td.items():
        for attr in v._attrs:
            want, got = np.asarray(getattr(v, attr)), np.asarray(getattr(back[name], attr))
            assert got.dtype == want.dtype and same_bits(got, want), (name, attr)
    assert json.loads((tmp_path / "c.json").read_text())["smooth_quant"] is False


@pytest.mark.parametrize("load,one_thread", [(64.0, True), (0.0, False)])
def test_busy_cores_run_the_kernels_on_one_thread(load, one_thread, spec_n, monkeypatch):
    """parallel=None: while other work holds the cores (load average >= the
    usable cores) the calibration's kernels run on one thread (an OpenMP
    team would wait for its threads), else quantcore's setting; the same
    ranges either way."""
    import contextlib
    import os

    from quantcore.onnx import calibration
    want = qonnx.calibrate(spec_n, _feeds(), "percentile", parallel=False).tensors_range
    seen = []

    @contextlib.contextmanager
    def spy(n):
        seen.append(n)
        with real(n):
            yield
    real = O.kernel_threads
    monkeypatch.setattr(O, "kernel_threads", spy)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert calibration.cores_busy() is one_thread
    got = qonnx.calibrate(spec_n, _feeds(), "percentile").tensors_range
    assert seen == ([1] if one_thread else [])
    for k, td in want.items():
        for attr in td._attrs:
            assert same_bits(np.asarray(getattr(td, attr)), np.asarray(getattr(got[k], attr)))


def _external_data_model(folder, source):
    """``source`` saved in ``folder`` with its initializers in one external
    data file (every tensor, whatever its size)."""
    folder.mkdir()
    path = str(folder / "model.onnx")
    onnx.save(onnx.load(source), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.weights", size_threshold=0)
    return path


def _inference_spy(written, watched=None):
    """onnx's infer_shapes_path, recording each output path in ``written``
    (and, with ``watched``, the folder's listing after each call)."""
    infer = onnx.shape_inference.infer_shapes_path

    def spy(model_path, output_path="", *args, **kwargs):
        written.append(str(output_path))
        infer(model_path, output_path, *args, **kwargs)
        if watched is not None:
            written.append(sorted(p.name for p in watched.iterdir()))
    return spy


@pytest.mark.parametrize("call", ["default", "cached"])
def test_nothing_is_written_beside_the_users_model(call, spec_n, tmp_path, monkeypatch):
    """ORT's quantize_static writes ``<model>-inferred.onnx`` beside the
    model it is given (quant_utils.load_model_with_shape_infer): two runs on
    one model delete each other's file, a read-only folder fails.  Through
    quantcore (ranges handed over, a cache read by ORT; SmoothQuant, which
    needs neural-compressor, goes through the same ort_quantize_static) the
    model's folder sees no
    write, its external data is read from there, and the model is ORT's own
    call's, bit for bit."""
    from onnxruntime.quantization import CalibrationMethod, quantize_static
    src = tmp_path / "src"
    path = _external_data_model(src, spec_n)
    before = sorted(p.name for p in src.iterdir())
    written = []
    kw = {}
    if call == "cached":
        kw["calibration_cache_path"] = str(tmp_path / "ranges.json")
        qonnx.quantize(path, str(tmp_path / "first.onnx"), _feeds(), **kw)
    with monkeypatch.context() as m:
        m.setattr(onnx.shape_inference, "infer_shapes_path", _inference_spy(written, src))
        qonnx.quantize(path, str(tmp_path / "qc.onnx"), _feeds(), **kw)
    assert written, "ORT's shape inference did not run"
    assert not [w for w in written if isinstance(w, str) and w.startswith(str(src))], written
    assert all(w == before for w in written if isinstance(w, list)), written
    assert sorted(p.name for p in src.iterdir()) == before
    # ORT's own call (it writes beside its copy of the model)
    mirror = tmp_path / "ort"
    ort_path = _external_data_model(mirror, spec_n)
    quantize_static(ort_path, str(tmp_path / "ort.onnx"), Reader(_feeds()),
                    calibrate_method=CalibrationMethod.MinMax, **kw)
    a, b = _initializers(str(tmp_path / "qc.onnx")), _initializers(str(tmp_path / "ort.onnx"))
    assert sorted(a) == sorted(b) and len(a) > 2
    for k in a:
        assert same_bits(a[k], b[k]), k


def test_ort_called_directly_still_infers_beside_the_model(spec_n, tmp_path, monkeypatch):
    """The private inference is in quantcore's calls only: ORT's own
    quantize_static, after quantcore installed its names, behaves as ORT
    ships it."""
    from onnxruntime.quantization import quantize_static
    qonnx.quantize(spec_n, str(tmp_path / "qc.onnx"), _feeds())     # installs the names
    path = _external_data_model(tmp_path / "src", spec_n)
    written = []
    with monkeypatch.context() as m:
        m.setattr(onnx.shape_inference, "infer_shapes_path", _inference_spy(written))
        quantize_static(path, str(tmp_path / "ort.onnx"), Reader(_feeds()))
    assert set(written) == {str(tmp_path / "src" / "model-inferred.onnx")}


def test_quantizer_renames_inputs_as_ort_does_only_faster(spec_n, tmp_path, monkeypatch):
    """Inside quantcore's call ORT's QDQ quantizer renames the consumers'
    inputs with handoff._replace_input_fast (only the nodes that read the
    name visited); each rename leaves the graph as ORT's own method does
    (checked call by call on a copy), and ORT called directly keeps its
    own."""
    from onnxruntime.quantization import quantize_static
    from onnxruntime.quantization.onnx_model import ONNXModel
    from quantcore.onnx import handoff
    qonnx.quantize(spec_n, str(tmp_path / "warm.onnx"), _feeds())   # installs the names
    assert ONNXModel.replace_input_of_all_nodes is handoff._replace_input_fast
    original = handoff._ORIGINAL_REPLACE[0]
    renames = []

    def checked(self, old, new):
        theirs = onnx.ModelProto()
        theirs.CopyFrom(self.model)
        handoff._replace_input_fast(self, old, new)
        original(ONNXModel(theirs), old, new)
        renames.append((old, getattr(handoff._STATE, "inside", False)))
        assert self.model.SerializeToString() == theirs.SerializeToString(), old

    with monkeypatch.context() as m:
        m.setattr(ONNXModel, "replace_input_of_all_nodes", checked)
        qonnx.quantize(spec_n, str(tmp_path / "qc.onnx"), _feeds())
        assert renames and all(inside for _, inside in renames)
        renames.clear()
        quantize_static(spec_n, str(tmp_path / "ort.onnx"), Reader(_feeds()))
        assert renames and not any(inside for _, inside in renames)
    a, b = _initializers(str(tmp_path / "qc.onnx")), _initializers(str(tmp_path / "ort.onnx"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert same_bits(a[k], b[k]), k


_NAMES = ("a", "b", "c", "d", "a_DequantizeLinear_Output", "b_DequantizeLinear_Output")


def _node_graph(inputs_per_node):
    """A ModelProto of Sum nodes reading the given input names (names need
    not be produced: only the inputs matter here)."""
    from onnx import helper
    nodes = [helper.make_node("Sum", list(ins), [f"out{i}"], name=f"n{i}")
             for i, ins in enumerate(inputs_per_node)]
    return helper.make_model(helper.make_graph(nodes, "g", [], []))


_inputs = st.lists(st.sampled_from(_NAMES), min_size=0, max_size=4)
_ops = st.one_of(
    st.tuples(st.just("all"), st.sampled_from(_NAMES), st.sampled_from(_NAMES)),
    st.tuples(st.just("node"), st.integers(0, 40), st.sampled_from(_NAMES),
              st.sampled_from(_NAMES)),
    st.tuples(st.just("nodes"), st.sampled_from(_NAMES), st.sampled_from(_NAMES),
              st.sets(st.integers(0, 40), max_size=3)),
    st.tuples(st.just("add"), _inputs),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("reorder"), st.integers(0, 2 ** 32)),
    st.tuples(st.just("new_model"),))


def _apply(op, model, onnx_model_cls, replace_all):
    """One graph change through ORT's ONNXModel API: ``replace_all`` is the
    replace_input_of_all_nodes to use, ``onnx_model_cls.replace_node_input``
    the per-node rename."""
    import random

    from onnx import helper
    graph = model.graph
    m = onnx_model_cls(model)
    kind = op[0]
    if kind == "all":
        replace_all(m, op[1], op[2])
    elif kind == "node" and len(graph.node):
        onnx_model_cls.replace_node_input(graph.node[op[1] % len(graph.node)], op[2], op[3])
    elif kind == "nodes" and len(graph.node):
        names = {graph.node[i % len(graph.node)].name for i in op[3]}
        m.replace_input_of_nodes(op[1], op[2], names)
    elif kind == "add":
        m.add_node(helper.make_node("Sum", list(op[1]), ["o"], name=f"x{len(graph.node)}"))
    elif kind == "remove" and len(graph.node):
        m.remove_node(graph.node[op[1] % len(graph.node)])
    elif kind == "reorder":
        nodes = list(graph.node)
        random.Random(op[1]).shuffle(nodes)
        copies = [onnx.NodeProto() for _ in nodes]
        for c, n in zip(copies, nodes):
            c.CopyFrom(n)
        graph.ClearField("node")
        graph.node.extend(copies)


@settings(max_examples=300, deadline=None)
@given(start=st.lists(_inputs, min_size=0, max_size=12),
                  ops=st.lists(st.tuples(_ops, st.sampled_from(_NAMES), st.sampled_from(_NAMES)),
                               max_size=25))
def test_input_index_follows_every_graph_change(start, ops):
    """handoff's name -> readers index (_Readers) against ORT's own full
    scan: the same graph after every rename, whatever nodes were added,
    removed, reordered or renamed through ORT's other methods in between
    (each change made to two copies: ours inside a quantcore call, ORT's
    originals outside), each change followed by a rename of all readers."""
    from onnxruntime.quantization.onnx_model import ONNXModel
    from quantcore.onnx import handoff
    handoff._install()
    assert handoff._ORIGINAL_REPLACE, "the fast rename is not installed over this ORT"
    ours, theirs = _node_graph(start), _node_graph(start)
    original_node_replace = staticmethod(handoff._ORIGINAL_NODE_REPLACE[0])

    class TheirModel(ONNXModel):    # ORT's own methods, as shipped
        replace_node_input = original_node_replace

    with handoff._inside_quantcore_call():
        for change, old, new in ops:
            for op in (change, ("all", old, new)):
                if op[0] == "new_model":    # the graph's content replaced whole
                    for model in (ours, theirs):
                        inputs = [list(n.input) for n in model.graph.node]
                        model.graph.CopyFrom(_node_graph(inputs).graph)
                    continue
                _apply(op, ours, ONNXModel, ONNXModel.replace_input_of_all_nodes)
                _apply(op, theirs, TheirModel, handoff._ORIGINAL_REPLACE[0])
                assert ours.SerializeToString() == theirs.SerializeToString(), op


_init_ops = st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(_NAMES), max_size=3)),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("swap"), st.tuples(st.integers(0, 40), st.sampled_from(_NAMES))),
    st.tuples(st.just("reorder"), st.integers(0, 2 ** 32)),
    st.tuples(st.just("rename"), st.integers(0, 40)),
    st.tuples(st.just("model"), st.lists(st.sampled_from(_NAMES), max_size=3)))


@settings(max_examples=300, deadline=None)
@given(start=st.lists(st.sampled_from(_NAMES), max_size=8),
                  ops=st.lists(st.tuples(_init_ops, st.sampled_from(_NAMES + ("zz",))),
                               max_size=25))
def test_initializer_index_follows_every_list_change(start, ops):
    """handoff's name -> first initializer (_FirstByName), through
    find_by_name and ONNXModel.get_initializer inside a quantcore call,
    against ORT's own functions after every change of the list (added,
    possibly under a name already there; removed; one removed and one
    added; reordered as copies; one renamed in place away from its name;
    added through ORT's add_initializer) - the same item, by identity."""
    import random

    from onnx import TensorProto, helper
    from onnxruntime.quantization import quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel
    from quantcore.onnx import handoff
    handoff._install()
    assert handoff._ORIGINAL_FIND, "the fast lookups are not installed over this ORT"
    their_find, their_get = handoff._ORIGINAL_FIND
    assert quant_utils.find_by_name is handoff._find_by_name_fast

    def tensor(name, i):
        return helper.make_tensor(name, TensorProto.FLOAT, [], [float(i)])

    model = helper.make_model(helper.make_graph(
        [], "g", [], [], initializer=[tensor(n, i) for i, n in enumerate(start)]))
    inits, m = model.graph.initializer, ONNXModel(model)
    with handoff._inside_quantcore_call():
        for step, ((kind, arg), probe) in enumerate(ops):
            if kind == "add":
                inits.extend([tensor(n, step) for n in arg])
            elif kind == "remove" and len(inits):
                inits.remove(inits[arg % len(inits)])
            elif kind == "swap" and len(inits):   # one removed, one added: the same length
                inits.remove(inits[arg[0] % len(inits)])
                inits.extend([tensor(arg[1], step)])
            elif kind == "reorder":
                items = [TensorProto() for _ in inits]
                for copy, item in zip(items, inits):
                    copy.CopyFrom(item)
                random.Random(arg).shuffle(items)
                model.graph.ClearField("initializer")   # (a new field object: the old one
                inits = model.graph.initializer         # keeps the old items, detached)
                inits.extend(items)
            elif kind == "rename" and len(inits):   # in place, to a name no one looks up
                inits[arg % len(inits)].name = f"renamed{step}"
            elif kind == "model":
                for n in arg:
                    m.add_initializer(tensor(n, step))
            for name in set(_NAMES) | {probe}:
                assert quant_utils.find_by_name(name, inits) is their_find(name, inits), name
                assert m.get_initializer(name) is their_get(m, name), name
            assert quant_utils.find_by_name(probe, list(inits)) is their_find(probe, inits)


@settings(max_examples=300, deadline=None)
@given(codes=st.binary(max_size=64),
                  data_type=st.sampled_from(("FLOAT8E4M3FN", "FLOAT8E5M2", "UINT8", "FLOAT")),
                  raw=st.booleans(), test=st.sampled_from((None, "gain", "end")))
def test_float8_nan_check_as_ort(codes, data_type, raw, test):
    """handoff's _check_init_fast (numpy over the raw bytes) inside a
    quantcore call == ORT's ONNXModel._check_init: the same initializer
    returned, or the same ValueError (a float8 e4m3fn code & 127 == 127)."""
    from onnx import TensorProto
    from onnxruntime.quantization.onnx_model import ONNXModel
    from quantcore.onnx import handoff
    handoff._install()
    assert ONNXModel._check_init is handoff._check_init_fast
    init = TensorProto(name="w", data_type=getattr(TensorProto, data_type), dims=[len(codes)])
    if raw:
        init.raw_data = codes
    else:
        init.int32_data.extend(codes)
    m = ONNXModel(onnx.ModelProto())

    def outcome(check):
        try:
            return check(m, init, test) is init
        except ValueError as e:
            return str(e)

    theirs = outcome(handoff._ORIGINAL_CHECK[0])
    with handoff._inside_quantcore_call():
        assert outcome(ONNXModel._check_init) == theirs
    assert theirs in (True, "Initializer 'w' has nan.")
