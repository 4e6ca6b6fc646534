"""The command line: calibrate, fake-quant, errors as one line."""
import json
import subprocess
import sys

import numpy as np
import pytest

import quantcore as qc
from quantcore.cli import main


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    w = (rng.laplace(size=(16, 8, 3, 3)) * 0.1).astype(np.float32)
    a = np.maximum(rng.normal(size=(32, 64)), 0).astype(np.float32)
    np.save(tmp_path / "act.npy", a)
    np.savez(tmp_path / "model.npz", weight=w, steps=np.arange(3))
    paths = {"npy": tmp_path / "act.npy", "npz": tmp_path / "model.npz", "w": w, "a": a}
    st = pytest.importorskip("safetensors.numpy")
    st.save_file({"weight": w}, str(tmp_path / "model.safetensors"))
    paths["st"] = tmp_path / "model.safetensors"
    return paths


def test_calibrate_and_apply_round_trip(files, tmp_path, capsys):
    q = tmp_path / "q.json"
    assert main(["calibrate", str(files["npz"]), "-o", str(q), "-q"]) == 0
    out = capsys.readouterr().out
    assert "weight" in out and "SQNR" in out and "steps" not in out
    saved = json.loads(q.read_text())
    lo, hi = qc.minmax(files["w"])
    s, z = qc.qparams.affine_qparams(lo, hi, -128, 127)
    assert saved["weight"]["scale"] == s.tolist() and saved["weight"]["zero_point"] == z.tolist()
    dst = tmp_path / "fq.npz"
    assert main(["fake-quant", str(files["npz"]), "--qparams", str(q), "-o", str(dst)]) == 0
    with np.load(dst) as npz:
        assert np.array_equal(npz["weight"], qc.fake_quant(files["w"], s[0], z[0], -128, 127))


@pytest.mark.parametrize("argv", [
    ["--method", "entropy", "--bits", "4", "--symmetric"],
    ["--method", "percentile", "--unsigned"],
    ["--method", "mse"],
    ["--method", "moving_average", "--per-channel", "--axis", "0"],
    ["--per-channel", "--axis", "-1", "--rounding", "half_up"],
])
def test_calibrate_methods(files, argv, capsys):
    assert main(["calibrate", str(files["st"]), "-q"] + argv) == 0
    assert "weight" in capsys.readouterr().out


def test_plot(files, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "h.png"
    assert main(["calibrate", str(files["npy"]), "--plot", str(png), "-q"]) == 0
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("argv,fragment", [
    (["calibrate", "missing.npy"], "no such file"),
    (["calibrate", "{npz}", "--tensors", "nope"], "not found"),
    (["calibrate", "{npz}", "--bits", "1"], "--bits must be in 2..16"),
    (["calibrate", "{npz}", "--per-channel", "--axis", "9"], "out of range"),
    (["calibrate", "{npz}", "--per-channel", "--method", "entropy"], "per tensor only"),
    (["calibrate", "{bad}"], "cannot read"),
    (["calibrate", "{txt}"], "unknown file type"),
    (["fake-quant", "{npz}", "--qparams", "{bad}", "-o", "x.npz"], "cannot read qparams"),
])
def test_errors_are_one_line(files, tmp_path, capsys, argv, fragment):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not numpy")
    txt = tmp_path / "a.txt"
    txt.write_text("x")
    argv = [a.format(npz=files["npz"], bad=bad, txt=txt) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_module_entry_point_help():
    res = subprocess.run([sys.executable, "-m", "quantcore", "--help"], capture_output=True,
                         text=True)
    assert res.returncode == 0 and "calibrate" in res.stdout and "fake-quant" in res.stdout
