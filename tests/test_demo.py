"""The main job: deterministic, and quantization behaves as expected."""
import pytest

pytest.importorskip("sklearn")

from quantcore.demo import run_demo  # noqa: E402


def test_demo_is_deterministic_and_accurate(capsys):
    a = run_demo(seed=0, plot_path=None, epochs=12, qat_epochs=3)
    b = run_demo(seed=0, plot_path=None, epochs=12, qat_epochs=3)
    assert a == b
    assert a["float32"] > 0.9
    assert a["PTQ int8"] >= a["float32"] - 0.02
    assert a["QAT int4"] > 0.85
    out = capsys.readouterr().out
    assert "PTQ int4" in out and "QAT int4" in out
