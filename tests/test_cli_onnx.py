"""``quantcore onnx quantize``: ORT's quantize_static with its defaults and
options from the command line (each option checked against ORT writing the
model itself), every data layout, the report, one-line errors."""
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static  # noqa: E402

from quantcore import cli_onnx  # noqa: E402
from quantcore.cli import main  # noqa: E402
from ort_vectors import same_bits  # noqa: E402
from test_onnx import E2E, Reader, dec, spec_model  # noqa: E402


def _batches():
    return [{"x": dec(b)} for b in E2E["batches"]]


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(spec_model(), str(model))
    x = np.concatenate([b["x"] for b in _batches()])
    data = tmp_path / "calib.npz"
    np.savez(data, x=x, labels=np.argmax(x.reshape(len(x), -1)[:, :5], axis=1))
    return model, data, tmp_path


def _initializers(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def _same_model(a, b):
    """Same initializers (bit for bit), same nodes, same outputs on the data."""
    ia, ib = _initializers(a), _initializers(b)
    assert sorted(ia) == sorted(ib)
    for k in ia:
        assert same_bits(ia[k], ib[k]), k
    na, nb = onnx.load(str(a)).graph.node, onnx.load(str(b)).graph.node
    assert [(n.op_type, n.domain, list(n.input)) for n in na] == \
        [(n.op_type, n.domain, list(n.input)) for n in nb]
    sa = ort.InferenceSession(str(a), providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(str(b), providers=["CPUExecutionProvider"])
    for feed in _batches():
        for ya, yb in zip(sa.run(None, feed), sb.run(None, feed)):
            assert same_bits(ya, yb)


@pytest.mark.parametrize("method", ["entropy", "minmax", "percentile"])
def test_quantize_writes_the_model_and_the_report(files, method, capsys):
    model, data, tmp = files
    out = tmp / "q.onnx"
    rc = main(["onnx", "quantize", str(model), "--data", str(data), "--method", method,
               "-o", str(out), "--batch-size", "2", "--per-channel",
               "--cache", str(tmp / "c.json"), "--tensorrt-table", str(tmp / "trt"), "-q",
               "--ranges"])
    text = capsys.readouterr().out
    assert rc == 0, text
    q = onnx.load(str(out))
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)
    assert re.search(r"^conv_out\s+-?[\d.]+\s+[\d.]+$", text, flags=re.M)
    db = float(re.search(r"SQNR y: ([\d.]+) dB", text).group(1))
    assert db > 5  # a tiny random model: ~13 dB
    assert re.search(r"accuracy: float [\d.]+%  quantized [\d.]+%", text)
    assert (tmp / "c.json").is_file() and (tmp / "trt" / "calibration.cache").is_file()
    # ORT's calibration_cache_path: an existing cache is used, not recomputed
    assert main(["onnx", "quantize", str(model), "--data", str(data), "--method", method,
                 "-o", str(tmp / "q2.onnx"), "--batch-size", "2", "--per-channel",
                 "--cache", str(tmp / "c.json"), "-q"]) == 0
    assert "used the ranges of" in capsys.readouterr().out
    _same_model(out, tmp / "q2.onnx")


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_calibrate_writes_the_cache_quantize_reads(files, method, capsys, monkeypatch):
    """``onnx calibrate`` writes ORT's calibration cache: ``onnx quantize
    --calibration-cache`` with it writes the model that calibrating in the
    same call writes; the report is a summary unless ``--ranges``."""
    model, data, tmp = files
    cache = tmp / "ranges.json"
    assert main(["onnx", "calibrate", str(model), "--data", str(data), "--method", method,
                 "--batch-size", "2", "-o", str(cache), "-q"]) == 0
    text = capsys.readouterr().out
    assert cache.is_file() and "widest range:" in text and "--calibration-cache" in text
    assert not re.search(r"^conv_out\s+-?[\d.]+\s+[\d.]+$", text, flags=re.M)
    assert main(["onnx", "quantize", str(model), "--data", str(data), "--method", method,
                 "--batch-size", "2", "--cache", str(cache), "-o", str(tmp / "a.onnx"),
                 "-q"]) == 0
    assert "used the ranges of" in capsys.readouterr().out
    assert main(["onnx", "quantize", str(model), "--data", str(data), "--method", method,
                 "--batch-size", "2", "-o", str(tmp / "b.onnx"), "-q"]) == 0
    text = capsys.readouterr().out
    _same_model(tmp / "a.onnx", tmp / "b.onnx")
    db = float(re.search(r"SQNR y: ([\d.]+) dB", text).group(1))
    assert ("hint: output SQNR under" in text) == (db < cli_onnx.POOR_SQNR_DB)
    # under the bar the report suggests what helps
    monkeypatch.setattr(cli_onnx, "POOR_SQNR_DB", db + 1)
    assert main(["onnx", "quantize", str(model), "--data", str(data), "--method", method,
                 "--batch-size", "2", "--cache", str(cache), "-o", str(tmp / "c.onnx"),
                 "-q"]) == 0
    text = capsys.readouterr().out
    assert f"hint: output SQNR under {db + 1:g} dB (y)" in text and "--per-channel" in text
    assert main(["onnx", "calibrate", str(model), "--data", str(data)]) == 2   # no -o
    assert "-o/--output" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile"])
def test_the_defaults_are_quantize_statics(files, method):
    """No option but the method: the model quantize_static writes with its
    defaults (QInt8 activations, one calibration call)."""
    model, data, tmp = files
    assert main(["onnx", "quantize", str(model), "--data", str(data), "--batch-size", "2",
                 "--method", method.lower(), "-o", str(tmp / "qc.onnx"), "-q"]) == 0
    quantize_static(str(model), str(tmp / "ort.onnx"), Reader(_batches()),
                    calibrate_method=CalibrationMethod[method])
    _same_model(tmp / "qc.onnx", tmp / "ort.onnx")
    zps = [v for k, v in _initializers(tmp / "qc.onnx").items() if k.endswith("zero_point")]
    assert any(z.dtype == np.int8 for z in zps) and not any(z.dtype == np.uint8 for z in zps)


# every extra_options key of ORT 1.32, a value, and the CLI options it needs
EXTRA_CASES = [
    ("ActivationSymmetric=true", []), ("ActivationRestrictedAsymmetric=true",
                                       ["--activation-type", "QUInt8"]),
    ("WeightSymmetric=false", []), ("EnableSubgraph=true", []),
    ("ForceQuantizeNoInputCheck=true", []), ("MatMulConstBOnly=true", []),
    ("AddQDQPairToWeight=true", []), ("OpTypesToExcludeOutputQuantization=Conv,Add", []),
    ("DedicatedQDQPair=true", []),
    ('QDQOpTypePerChannelSupportToAxis={"MatMul": 1}', ["--per-channel"]),
    ("CalibTensorRangeSymmetric=true", []), ("CalibStridedMinMax=2", []),
    ("CalibStridedMinMax=1", ["--method", "entropy"]),
    ("CalibMovingAverage=true", []), ("CalibMovingAverageConstant=0.5", []),
    ("CalibMaxIntermediateOutputs=3", []),
    ("CalibPercentile=99.5", ["--method", "percentile"]),
    ("SmoothQuantAlpha=0.3", []), ("SmoothQuantFolding=false", []),
    ("UseQDQContribOps=true", []), ("MinimumRealRange=0.5", []),
    ('TensorQuantOverrides={"relu_out": [{"scale": 0.05, "zero_point": 3}]}', []),
    ('TensorQuantOverrides={"W": [{"symmetric": true, "reduce_range": true}]}', []),
    ("QDQKeepRemovableActivations=true", []),
    ("QDQDisableWeightAdjustForInt32Bias=true", []), ("QuantizeBias=false", []),
    ("DefaultTensorType=FLOAT", []), ("BlockSize=32", ["--op-types-to-quantize", "MatMul"]),
    ("extra.Sigmoid.nnapi=true", []),
]


def test_every_extra_options_key_is_tested():
    keys = {c.split("=", 1)[0] for c, _ in EXTRA_CASES} | {"SmoothQuant"}
    assert keys == set(cli_onnx.EXTRA_OPTION_TYPES)
    doc = quantize_static.__doc__
    documented = set(re.findall(r"^\s{16}([A-Z][A-Za-z0-9]+) =", doc, flags=re.M))
    assert documented <= keys, documented - keys


@pytest.mark.parametrize("case,options", EXTRA_CASES, ids=[c for c, _ in EXTRA_CASES])
def test_extra_options_as_ort_takes_them(case, options, files):
    """--extra KEY=VALUE == quantize_static(extra_options={KEY: typed VALUE})."""
    model, data, tmp = files
    extra = cli_onnx.parse_extra([case], "QUInt8" if "QUInt8" in options else "QInt8")
    assert main(["onnx", "quantize", str(model), "--data", str(data), "--batch-size", "2",
                 "-o", str(tmp / "qc.onnx"), "-q", "--extra", case, *options]) == 0
    kw = {"per_channel": "--per-channel" in options, "extra_options": extra}
    if "--op-types-to-quantize" in options:
        kw["op_types_to_quantize"] = options[1].split(",")
    if "--activation-type" in options:
        kw["activation_type"] = QuantType.QUInt8
    if "--method" in options:
        kw["calibrate_method"] = CalibrationMethod[options[1].capitalize()]
    quantize_static(str(model), str(tmp / "ort.onnx"), Reader(_batches()), **kw)
    _same_model(tmp / "qc.onnx", tmp / "ort.onnx")


def test_extra_values_are_typed_as_ort_types_them(files, capsys):
    parse = cli_onnx.parse_extra
    assert parse(["CalibStridedMinMax=none", "ActivationSymmetric=False",
                  "CalibMovingAverageConstant=0.25", "OpTypesToExcludeOutputQuantization=Conv"]) \
        == {"CalibStridedMinMax": None, "ActivationSymmetric": False,
            "CalibMovingAverageConstant": 0.25, "OpTypesToExcludeOutputQuantization": ["Conv"]}
    assert parse(["DefaultTensorType=FLOAT16"]) == {"DefaultTensorType": TensorProto.FLOAT16}
    ov = parse(['TensorQuantOverrides={"x": [{"quant_type": "QUInt8", "zero_point": 7, '
                '"scale": 0.5}]}'])["TensorQuantOverrides"]["x"][0]
    assert ov["quant_type"] is QuantType.QUInt8 and ov["zero_point"].dtype == np.uint8
    assert ov["scale"].dtype == np.float32
    model, data, tmp = files
    for bad, why in [("Bogus=1", "not an extra_options key"),
                     ("ActivationSymmetric=maybe", "expected true or false"),
                     ("CalibStridedMinMax=two", "expected an int or none"),
                     ("TensorQuantOverrides=[1]", "expected a JSON object"),
                     ("ActivationSymmetric", "expected KEY=VALUE"),
                     ("SmoothQuant=true", "SmoothQuant")]:
        assert main(["onnx", "quantize", str(model), "--data", str(data), "-o",
                     str(tmp / "q.onnx"), "--batch-size", "2", "-q", "--extra", bad]) == 2, bad
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("flag,value", [("--op-types-to-quantize", "Conv,MatMul"),
                                        ("--nodes-to-quantize", "n0,n4"),
                                        ("--nodes-to-exclude", "n0")])
def test_node_selection_as_ort(flag, value, tmp_path):
    m = spec_model()
    for i, n in enumerate(m.graph.node):
        n.name = f"n{i}"
    model = tmp_path / "named.onnx"
    onnx.save(m, str(model))
    x = np.concatenate([b["x"] for b in _batches()])
    np.savez(tmp_path / "d.npz", x=x)
    assert main(["onnx", "quantize", str(model), "--data", str(tmp_path / "d.npz"),
                 "--batch-size", "2", "-o", str(tmp_path / "qc.onnx"), "-q", flag, value]) == 0
    key = flag[2:].replace("-", "_")
    quantize_static(str(model), str(tmp_path / "ort.onnx"), Reader(_batches()),
                    **{key: value.split(",")})
    _same_model(tmp_path / "qc.onnx", tmp_path / "ort.onnx")
    # the selection changed the model
    quantize_static(str(model), str(tmp_path / "all.onnx"), Reader(_batches()))
    assert len(onnx.load(str(tmp_path / "all.onnx")).graph.node) != \
        len(onnx.load(str(tmp_path / "qc.onnx")).graph.node)


def _recurrent_model(path):
    """x [N, 8], a state [2, N, 8] (batch axis 1) and a 0-d int64 rate:
    y = relu(x + mean(2 state)), the new state 2 state."""
    N = "N"
    nodes = [helper.make_node("Mul", ["state", "two"], ["state_n"]),
             helper.make_node("ReduceMean", ["state_n"], ["sm"], axes=[0], keepdims=0),
             helper.make_node("Add", ["x", "sm"], ["h"]),
             helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["h", "srf"], ["hs"]),
             helper.make_node("Relu", ["hs"], ["y"])]
    g = helper.make_graph(
        nodes, "rec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 8]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, N, 8]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, 8]),
         helper.make_tensor_value_info("state_n", TensorProto.FLOAT, [2, N, 8])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(path))
    return path


def test_every_data_layout_feeds_a_recurrent_model(tmp_path, capsys):
    """A state input whose batch axis is 1 and a 0-d input: an arrays .npz
    (axes from the model's symbolic dimension), per-batch feeds in one .npz,
    a folder of .npz feeds, and --reader (an ORT CalibrationDataReader in a
    .py file, and a one-shot reader): all give ORT's model on those feeds."""
    model = _recurrent_model(tmp_path / "rec.onnx")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 8)).astype(np.float32)
    state = rng.standard_normal((2, 12, 8)).astype(np.float32)
    sr = np.array(16, np.int64)
    feeds = [{"x": x[i:i + 4], "state": state[:, i:i + 4], "sr": sr} for i in range(0, 12, 4)]
    quantize_static(str(model), str(tmp_path / "ort.onnx"), Reader(feeds),
                    calibrate_method=CalibrationMethod.Entropy)
    np.savez(tmp_path / "arrays.npz", x=x, state=state, sr=sr)
    labels = np.argmax(x, axis=1) % 8
    np.savez(tmp_path / "feeds.npz", labels=labels, **{f"{i}/{k}": v for i, f in enumerate(feeds)
                                                       for k, v in f.items()})
    (tmp_path / "dir").mkdir()
    for i, f in enumerate(feeds):
        np.savez(tmp_path / "dir" / f"{i:03d}.npz", **f)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "state.npy", state)
    (tmp_path / "my_reader.py").write_text(
        "import numpy as np\n"
        "from onnxruntime.quantization import CalibrationDataReader\n"
        "class Calib(CalibrationDataReader):\n"
        "    def __init__(self, root, rows=4):\n"
        "        x, s = np.load(root + '/x.npy'), np.load(root + '/state.npy')\n"
        "        self.it = iter([{'x': x[i:i + rows], 'state': s[:, i:i + rows],\n"
        "                         'sr': np.array(16, np.int64)} for i in range(0, 12, rows)])\n"
        "    def get_next(self):\n"
        "        return next(self.it, None)\n")
    sources = [["--data", str(tmp_path / "arrays.npz"), "--batch-size", "4"],
               ["--data", str(tmp_path / "arrays.npz"), "--batch-size", "4",
                "--batch-axis", "state=1", "--batch-axis", "sr=none"],
               ["--data", str(tmp_path / "feeds.npz")], ["--data", str(tmp_path / "dir")],
               ["--reader", f"{tmp_path / 'my_reader.py'}:Calib", "--reader-arg",
                f"root={tmp_path}", "--reader-arg", "rows=4"]]
    for i, src in enumerate(sources):
        out = tmp_path / f"qc{i}.onnx"
        assert main(["onnx", "quantize", str(model), *src, "--method", "entropy", "-o",
                     str(out), "-q"]) == 0, src
        assert ("accuracy:" in capsys.readouterr().out) == (i == 2), src
        ia, ib = _initializers(out), _initializers(tmp_path / "ort.onnx")
        assert sorted(ia) == sorted(ib) and all(same_bits(ia[k], ib[k]) for k in ia), src


def test_errors_are_one_line(files, capsys, tmp_path):
    model, data, tmp = files

    def fails(args, *words):
        assert main(["onnx", "quantize", *args, "-o", str(tmp / "q.onnx"), "-q"]) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        for w in words:
            assert w in err, (w, err)

    np.savez(tmp / "bad.npz", y=np.zeros(3, np.float32))
    fails([str(model), "--data", str(tmp / "bad.npz")], "no array for model input(s) x")
    fails([str(tmp / "none.onnx"), "--data", str(data)], "no such file")
    (tmp / "junk.onnx").write_bytes(b"this is not a model\x00\xff" * 10)
    fails([str(tmp / "junk.onnx"), "--data", str(data)], "junk.onnx", "not an ONNX model")
    x = np.concatenate([b["x"] for b in _batches()])
    np.savez(tmp / "f64.npz", x=x.astype(np.float64))
    fails([str(model), "--data", str(tmp / "f64.npz"), "--batch-size", "2"],
          "input 'x'", "expected float32", "float64")
    np.savez(tmp / "shape.npz", x=x[:, :2])
    fails([str(model), "--data", str(tmp / "shape.npz"), "--batch-size", "2"],
          "input 'x'", "expected shape [2, 3, 5, 5]")
    np.savez(tmp / "feeds.npz", **{"0/y": x[:2]})
    fails([str(model), "--data", str(tmp / "feeds.npz")], "no input 'y'", "inputs: x")
    # issue 26: 3 labels for 8 rows is refused, not an accuracy
    np.savez(tmp / "labels.npz", x=x, labels=np.arange(3))
    fails([str(model), "--data", str(tmp / "labels.npz"), "--batch-size", "2"],
          "3 label(s) for 8 row(s)")
    rec = _recurrent_model(tmp / "rec.onnx")
    np.savez(tmp / "rec.npz", x=np.zeros((4, 8), np.float32),
             state=np.zeros((2, 4, 8), np.float32), sr=np.array(1, np.int64))
    fails([str(rec), "--data", str(tmp / "rec.npz"), "--batch-axis", "state=0"],
          "different numbers of rows", "--batch-axis")
    fails([str(rec), "--data", str(tmp / "rec.npz"), "--batch-axis", "z=0"], "no such input")
    fails([str(model), "--reader", "no_such_module_qc:R"], "cannot import no_such_module_qc")
    fails([str(model), "--reader", "nocolon"], "expected MODULE:NAME")
    assert main(["onnx", "quantize", str(model), "--data", str(data), "-o", "q",
                 "--method", "bogus"]) == 2


def test_evaluate_refuses_labels_that_do_not_match_the_rows(files):
    from quantcore import onnx as qonnx
    model, _, tmp = files
    quantize_static(str(model), str(tmp / "q.onnx"), Reader(_batches()))
    with pytest.raises(ValueError, match=r"3 label\(s\)"):
        qonnx.evaluate(str(model), str(tmp / "q.onnx"), _batches(), labels=np.arange(3))
    with pytest.raises(ValueError, match=r"9 label\(s\) for 8 row\(s\)"):
        qonnx.evaluate(str(model), str(tmp / "q.onnx"), _batches(), labels=np.arange(9))
