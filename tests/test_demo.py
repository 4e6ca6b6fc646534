"""The main job: deterministic, quantization behaves as expected, QAT really
runs through FakeQuantize's straight-through backward; the ONNX part writes
the NumPy conv net as an ONNX model that computes what NumPy computes, and
calibrates it with every quantcore.onnx method, ORT's four giving ranges
identical to ORT's own calibrators in less traced memory."""
import re

import numpy as np
import pytest

pytest.importorskip("sklearn")

import quantcore as qc  # noqa: E402
from quantcore import demo  # noqa: E402
from quantcore.cli import main  # noqa: E402


def test_demo_is_deterministic_and_accurate(capsys):
    a = demo.run_demo(seed=0, plot_path=None, epochs=12, qat_epochs=3, onnx=False)
    b = demo.run_demo(seed=0, plot_path=None, epochs=12, qat_epochs=3, onnx=False)
    assert a == b
    assert demo.run_demo(seed=1, plot_path=None, epochs=12, qat_epochs=3, onnx=False) != a
    assert a["float32"] > 0.9
    assert a["PTQ int8"] >= a["float32"] - 0.02
    assert a["QAT int4"] > 0.85
    out = capsys.readouterr().out
    assert "PTQ int4" in out and "QAT int4" in out


def test_qat_uses_fake_quantize_and_the_ste_backward(monkeypatch):
    forwards, backwards = [], []
    forward, backward = qc.FakeQuantize.forward, qc.FakeQuantize.backward

    def counting_forward(self, x, out=None):
        forwards.append(self)
        return forward(self, x, out)

    def counting_backward(self, grad, out=None):
        masked = self.mask is not None  # the last forward quantized: grad * mask
        g = backward(self, grad, out)
        backwards.append((masked, bool(np.any(g != grad))))
        return g

    monkeypatch.setattr(qc.FakeQuantize, "forward", counting_forward)
    monkeypatch.setattr(qc.FakeQuantize, "__call__", counting_forward)
    monkeypatch.setattr(qc.FakeQuantize, "backward", counting_backward)
    demo.run_demo(seed=0, plot_path=None, epochs=2, qat_epochs=1, onnx=False)
    steps = -(-1347 // 64)  # minibatches in one QAT epoch
    # hidden activation, W1 and W2 at every QAT step; nothing else calls backward
    assert len(backwards) == 3 * steps
    assert all(masked for masked, _ in backwards)
    assert any(clipped for _, clipped in backwards)  # the STE mask zeroes some gradients
    assert len(forwards) > 4 * steps  # input, hidden, W1, W2 in every QAT forward


def test_conv_net_gradients_and_onnx_export():
    """ConvNet.backward is the gradient of the loss (central differences in
    float64 on a few weights), and its ONNX model computes its logits."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    net = demo.ConvNet(rng, channels=4, hidden=8)
    net.params = {k: v.astype(np.float64) for k, v in net.params.items()}
    x, y = rng.random((5, 64)), rng.integers(0, 10, 5)

    def loss():
        return demo.softmax_xent(net.forward(x)[0], y)[0]
    logits, cache = net.forward(x)
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    p[np.arange(5), y] -= 1
    grads = net.backward(cache, p / 5)
    for name in ("conv_w", "conv_b", "fc1_w", "fc2_b"):
        w = net.params[name].reshape(-1)
        for k in rng.choice(w.size, 3, replace=False):
            w[k] += 1e-6
            up = loss()
            w[k] -= 2e-6
            down = loss()
            w[k] += 1e-6
            assert abs((up - down) / 2e-6 - grads[name].reshape(-1)[k]) < 1e-4, name
    net = demo.ConvNet(rng)
    x = rng.random((7, 64)).astype(np.float32)
    model = net.to_onnx()
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x.reshape(-1, 1, 8, 8)})[0]
    np.testing.assert_allclose(got, net.forward(x)[0], rtol=1e-4, atol=1e-5)


def test_same_ranges_sees_one_bit():
    from quantcore.compat import onnxruntime as O
    td = O.TensorsData(O.CalibrationMethod.MinMax, {
        "t": O.TensorData(lowest=np.array([-1.0], np.float32),
                          highest=np.array([2.0], np.float32))})
    other = O.TensorsData(O.CalibrationMethod.MinMax, {
        "t": O.TensorData(lowest=np.array([-1.0], np.float32),
                          highest=np.nextafter(np.array([2.0], np.float32), np.float32(3)))})
    assert demo._same_ranges(td, td)
    assert not demo._same_ranges(td, other)
    assert not demo._same_ranges(td, O.TensorsData(O.CalibrationMethod.MinMax, {}))


def test_full_demo_through_the_cli(tmp_path, capsys):
    """`quantcore demo` as `make demo` runs it: the table, the plot, QAT int4
    at least as good as PTQ int4; the ONNX table: every method, ORT's four
    with ranges identical to ORT's own calibrators, the histogram ones in
    less traced memory than ORT's, int8 within a point of float."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("onnxruntime")
    png = tmp_path / "curves.png"
    assert main(["demo", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    acc = {name: float(v) for name, v in
           re.findall(r"^(float32|PTQ int8|PTQ int4|QAT int4)\s+([\d.]+)%$", out, flags=re.M)}
    assert list(acc) == ["float32", "PTQ int8", "PTQ int4", "QAT int4"]
    assert acc["float32"] > 97 and acc["PTQ int8"] >= acc["float32"] - 1
    assert acc["QAT int4"] >= acc["PTQ int4"]
    assert png.stat().st_size > 10_000
    from quantcore import onnx as qonnx
    float_acc = float(re.search(r"^float32 test accuracy: ([\d.]+)% in ONNX Runtime", out, re.M)[1])
    assert float_acc > 95
    rows = {m: line for m in qonnx.METHODS
            for line in re.findall(rf"^{m} \(.*$", out, flags=re.M)}
    assert list(rows) == list(qonnx.METHODS)
    number = r"([\d.]+)"
    for method, line in rows.items():
        acc = float(re.search(rf"\) +{number}%", line)[1])
        if "int8" in line:
            assert acc >= float_acc - 1, line
        mib = [float(v) for v in re.findall(rf"{number} MiB", line)]
        if method in qonnx.ORT_METHODS:
            assert line.endswith("identical"), line
            if method != "minmax":   # ORT keeps every batch's activations
                assert mib[0] < mib[1], line
    # the FP8 row is explained: with ORT's ReLU removal undone, FP8 is within 2 points
    kept = re.search(r"^  same ranges give ([\d.]+)%\.$", out, flags=re.M)
    assert "(fp8*)" in rows["distribution"] and kept, out
    assert float(kept[1]) >= float_acc - 2


def test_save_writes_the_conv_net_and_data_that_compare_takes(tmp_path, capsys):
    """``quantcore demo --save DIR``: the ONNX model and an npz named after
    its input plus ``labels``; ``quantcore compare`` runs on them, a row per
    recipe in every table and an accuracy line per recipe."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from quantcore.compare import DEFAULT
    out_dir = tmp_path / "demo_out"
    assert main(["demo", "--save", str(out_dir)]) == 0
    model_path, data_path = out_dir / "convnet.onnx", out_dir / "convnet_data.npz"
    assert f"wrote {model_path}" in capsys.readouterr().out
    model = onnx.load(str(model_path))
    onnx.checker.check_model(model)
    with np.load(data_path, allow_pickle=False) as npz:
        assert sorted(npz.files) == sorted([i.name for i in model.graph.input] + ["labels"])
        x, labels = npz["x"], npz["labels"]
    assert x.dtype == np.float32 and x.shape[1:] == (1, 8, 8) and labels.shape == (len(x),)
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    float_acc = float((sess.run(None, {"x": x})[0].argmax(axis=1) == labels).mean())
    assert float_acc > 0.9   # the trained net, its own test images

    assert main(["compare", str(model_path), "--data", str(data_path), "--tables"]) == 0
    out = capsys.readouterr().out
    tables = out.split("\naccuracy on --data")[0]
    for name in ("conv_w", "fc1_w", "fc2_w", "x", "fc1_relu", "logits"):
        assert re.search(rf"^{name}  shape ", tables, re.M), name
    n_tables = len(re.findall(r"^\S+  shape \[", tables, re.M))
    for recipe in DEFAULT:
        assert len(re.findall(rf"^{recipe}\s+\S", tables, re.M)) == n_tables, recipe
    accuracy = out.split("\naccuracy on --data")[1]
    assert f"float {100 * float_acc:.2f}%" in accuracy
    for recipe in DEFAULT:
        assert re.search(rf"^  {recipe}\s+\d+\.\d\d%$", accuracy, re.M), recipe


def test_save_onto_a_file_is_one_line_exit_2(tmp_path, capsys):
    pytest.importorskip("onnx")
    (tmp_path / "taken").write_text("")
    assert main(["demo", "--save", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_digits_read_from_the_file_are_load_digits():
    """The digits the demo reads from scikit-learn's file (without importing
    it) are load_digits(return_X_y=True)'s, values and dtypes."""
    from sklearn.datasets import load_digits
    x, y = demo._digits()
    ref_x, ref_y = load_digits(return_X_y=True)
    assert x.dtype == ref_x.dtype and y.dtype == ref_y.dtype
    assert np.array_equal(x, ref_x) and np.array_equal(y, ref_y)
