"""``quantcore onnx quantize``: a QDQ model written by ORT, the report, one-line errors."""
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from quantcore.cli import main  # noqa: E402
from test_onnx import E2E, dec, spec_model  # noqa: E402


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(spec_model(), str(model))
    x = np.concatenate([dec(b) for b in E2E["batches"]])
    data = tmp_path / "calib.npz"
    np.savez(data, x=x, labels=np.argmax(x.reshape(len(x), -1)[:, :5], axis=1))
    return model, data, tmp_path


@pytest.mark.parametrize("method", ["entropy", "minmax", "percentile"])
def test_quantize_writes_the_model_and_the_report(files, method, capsys):
    model, data, tmp = files
    out = tmp / "q.onnx"
    rc = main(["onnx", "quantize", str(model), "--data", str(data), "--method", method,
               "-o", str(out), "--batch-size", "2", "--per-channel", "--passes", "2",
               "--cache", str(tmp / "c.json"), "--tensorrt-table", str(tmp / "trt"), "-q"])
    text = capsys.readouterr().out
    assert rc == 0, text
    q = onnx.load(str(out))
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)
    assert re.search(r"^conv_out\s+-?[\d.]+\s+[\d.]+$", text, flags=re.M)
    db = float(re.search(r"SQNR y: ([\d.]+) dB", text).group(1))
    assert db > 5  # a tiny random model: ~13 dB
    assert re.search(r"accuracy: float [\d.]+%  quantized [\d.]+%", text)
    assert (tmp / "c.json").is_file() and (tmp / "trt" / "calibration.cache").is_file()


def test_errors_are_one_line(files, capsys):
    model, data, tmp = files
    np.savez(tmp / "bad.npz", y=np.zeros(3, np.float32))
    assert main(["onnx", "quantize", str(model), "--data", str(tmp / "bad.npz"), "-o",
                 str(tmp / "q.onnx")]) == 2
    err = capsys.readouterr().err
    assert "no array for model input(s) x" in err and len(err.strip().splitlines()) == 1
    assert main(["onnx", "quantize", str(tmp / "none.onnx"), "--data", str(data), "-o", "q"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["onnx", "quantize", str(model), "--data", str(data), "-o", "q",
                 "--method", "bogus"]) == 2
