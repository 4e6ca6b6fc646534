"""The main job: deterministic, quantization behaves as expected, QAT really
runs through FakeQuantize's straight-through backward."""
import re
import time

import numpy as np
import pytest

pytest.importorskip("sklearn")

import quantcore as qc  # noqa: E402
from quantcore import demo  # noqa: E402
from quantcore.cli import main  # noqa: E402


def test_demo_is_deterministic_and_accurate(capsys):
    a = demo.run_demo(seed=0, plot_path=None, epochs=12, qat_epochs=3)
    b = demo.run_demo(seed=0, plot_path=None, epochs=12, qat_epochs=3)
    assert a == b
    assert demo.run_demo(seed=1, plot_path=None, epochs=12, qat_epochs=3) != a
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
    demo.run_demo(seed=0, plot_path=None, epochs=2, qat_epochs=1)
    steps = -(-1347 // 64)  # minibatches in one QAT epoch
    # hidden activation, W1 and W2 at every QAT step; nothing else calls backward
    assert len(backwards) == 3 * steps
    assert all(masked for masked, _ in backwards)
    assert any(clipped for _, clipped in backwards)  # the STE mask zeroes some gradients
    assert len(forwards) > 4 * steps  # input, hidden, W1, W2 in every QAT forward


def test_full_demo_through_the_cli(tmp_path, capsys):
    """`quantcore demo` as `make demo` runs it: the table, the plot, under a
    minute (it takes a few seconds), and QAT int4 at least as good as PTQ int4."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "curves.png"
    t0 = time.perf_counter()
    assert main(["demo", "--plot", str(png)]) == 0
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    acc = {name: float(v) for name, v in
           re.findall(r"^(float32|PTQ int8|PTQ int4|QAT int4)\s+([\d.]+)%$", out, flags=re.M)}
    assert list(acc) == ["float32", "PTQ int8", "PTQ int4", "QAT int4"]
    assert acc["float32"] > 97 and acc["PTQ int8"] >= acc["float32"] - 1
    assert acc["QAT int4"] >= acc["PTQ int4"]
    assert png.stat().st_size > 10_000
    assert elapsed < 60
