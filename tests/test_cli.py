"""The command line: calibrate, fake-quant, --help, progress bar, plot, and
errors as one line with a non-zero status (never a traceback)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import quantcore as qc
from quantcore import cli
from quantcore.cli import main

ROOT = Path(__file__).resolve().parent.parent


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
    for column in ("shape", "range", "scale", "zero point", "max |err|"):
        assert column in out
    saved = json.loads(q.read_text())
    lo, hi = qc.minmax(files["w"])
    s, z = qc.qparams.affine_qparams(lo, hi, -128, 127)
    assert saved["weight"]["scale"] == s.tolist() and saved["weight"]["zero_point"] == z.tolist()
    dst = tmp_path / "fq.npz"
    assert main(["fake-quant", str(files["npz"]), "--qparams", str(q), "-o", str(dst)]) == 0
    with np.load(dst) as npz:
        assert np.array_equal(npz["weight"], qc.fake_quant(files["w"], s[0], z[0], -128, 127))
        assert np.array_equal(npz["steps"], np.arange(3))  # not float: copied unchanged


def test_table_numbers(files, capsys):
    """The table's SQNR and max error are those of the fake-quantized tensor."""
    assert main(["calibrate", str(files["npy"]), "-q", "--bits", "4", "--symmetric"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("act")][0]
    lo, hi = qc.minmax(files["a"])
    s, z = qc.qparams.symmetric_qparams(lo, hi, -8, 7)
    y = qc.fake_quant(files["a"], s[0], z[0], -8, 7).astype(np.float64)
    x = files["a"].astype(np.float64)
    sqnr = 10 * np.log10(np.sum(x ** 2) / np.sum((x - y) ** 2))
    fields = row.split()
    assert fields[-2] == f"{sqnr:.2f}" and float(fields[-1]) == pytest.approx(
        np.max(np.abs(x - y)), rel=1e-3)
    assert f"{s[0]:.6g}" in row and f"[{float(lo):.4g}, {float(hi):.4g}]" in row
    assert fields[1:3] == ["(32,", "64)"]


def test_per_channel_round_trip_safetensors(files, tmp_path, capsys):
    q = tmp_path / "q.json"
    assert main(["calibrate", str(files["st"]), "--per-channel", "--axis", "0",
                 "--unsigned", "--rounding", "half_up", "-q", "-o", str(q)]) == 0
    entry = json.loads(q.read_text())["weight"]
    assert entry["axis"] == 0 and len(entry["scale"]) == 16 and entry["quant_min"] == 0
    dst = tmp_path / "w.safetensors"
    assert main(["fake-quant", str(files["st"]), "--qparams", str(q), "-o", str(dst)]) == 0
    from safetensors.numpy import load_file
    lo, hi = qc.minmax(files["w"], axis=0)
    s, z = qc.qparams.affine_qparams(lo, hi, 0, 255)
    expect = qc.fake_quant(files["w"], s, z, 0, 255, axis=0, rounding="half_up")
    assert np.array_equal(load_file(str(dst))["weight"], expect)


@pytest.mark.parametrize("argv", [
    ["--method", "entropy", "--bits", "4", "--symmetric"],
    ["--method", "percentile", "--unsigned"],
    ["--method", "mse"],
    ["--method", "moving_average", "--per-channel", "--axis", "0"],
    ["--method", "moving-average", "--averaging-constant", "0.5"],
    ["--per-channel", "--axis", "-1", "--rounding", "half_up"],
    ["--rounding", "half_away", "--bits", "16", "--affine"],
    ["--tensors", "weight"],
])
def test_calibrate_methods(files, argv, capsys):
    assert main(["calibrate", str(files["st"]), "-q"] + argv) == 0
    assert "weight" in capsys.readouterr().out


def test_several_files_and_tensor_selection(files, tmp_path, capsys):
    q = tmp_path / "q.json"
    assert main(["calibrate", str(files["npz"]), str(files["npy"]), "-q", "-o", str(q),
                 "--tensors", "model.npz:weight", "act"]) == 0
    assert sorted(json.loads(q.read_text())) == ["act.npy:act", "model.npz:weight"]
    out = tmp_path / "act_fq.npy"
    assert main(["fake-quant", str(files["npy"]), "--qparams", str(q), "-o", str(out)]) == 0
    assert np.load(out).shape == files["a"].shape


def test_nan_values_are_ignored_and_counted(tmp_path, capsys):
    x = np.linspace(-1, 1, 200, dtype=np.float32)
    x[::50] = np.nan
    np.save(tmp_path / "n.npy", x)
    for method in ("minmax", "moving_average", "entropy"):
        assert main(["calibrate", str(tmp_path / "n.npy"), "-q", "--method", method]) == 0
        out = capsys.readouterr().out
        assert "note: n: 4 NaN value(s) ignored" in out and " nan " not in out


def test_inf_is_handled_by_histogram_methods(tmp_path, capsys):
    x = np.linspace(-1, 1, 200, dtype=np.float32)
    x[3] = np.inf
    np.save(tmp_path / "i.npy", x)
    assert main(["calibrate", str(tmp_path / "i.npy"), "-q", "--method", "percentile"]) == 0
    assert main(["calibrate", str(tmp_path / "i.npy"), "-q"]) == 2
    assert "use --method percentile, entropy or mse" in capsys.readouterr().err


def test_plot(files, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "h.png"
    assert main(["calibrate", str(files["npy"]), "--plot", str(png), "-q"]) == 0
    assert png.stat().st_size > 1000
    ranges = cli._clipping_ranges("act", files["a"], -128, 127, cli.build_parser().parse_args(
        ["calibrate", "x.npy"]))
    assert sorted(ranges) == sorted(cli.METHODS)
    lo, hi = qc.minmax(files["a"])
    s, z = qc.qparams.affine_qparams(lo, hi, -128, 127)
    assert ranges["minmax"] == pytest.approx(((-128 - z[0]) * s[0], (127 - z[0]) * s[0]))


def test_progress_bar(tmp_path, capsys):
    pytest.importorskip("tqdm")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "many.npz", **{f"t{k}": rng.normal(size=(40, 5)).astype(np.float32)
                                       for k in range(3)})
    assert main(["calibrate", str(tmp_path / "many.npz"), "--progress",
                 "--method", "moving_average"]) == 0
    err = capsys.readouterr().err
    # 3 tensors x (16 moving-average batches + 1 fake-quant pass)
    assert "calibrating" in err and "51/51" in err and "batch" in err
    assert main(["calibrate", str(tmp_path / "many.npz")]) == 0  # short run: no bar
    assert "calibrating" not in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "many.npz"), "-q"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [[], ["--help"], ["calibrate", "--help"],
                                  ["fake-quant", "--help"], ["demo", "--help"]])
def test_help(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "usage: quantcore" in out
    if argv[:1] == ["calibrate"]:
        for option in ("--method", "--bits", "--unsigned", "--symmetric", "--per-channel",
                       "--axis", "--rounding", "--plot", "-o JSON"):
            assert option in out
    if not argv or argv == ["--help"]:
        assert "calibrate" in out and "fake-quant" in out and "examples:" in out


def _bad_files(tmp_path):
    p = {}
    p["bad"] = tmp_path / "bad.npy"
    p["bad"].write_bytes(b"not numpy")
    p["txt"] = tmp_path / "a.txt"
    p["txt"].write_text("x")
    p["badnpz"] = tmp_path / "bad.npz"
    p["badnpz"].write_bytes(b"PK\x03\x04garbage")
    p["badst"] = tmp_path / "bad.safetensors"
    p["badst"].write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    p["trunc"] = tmp_path / "trunc.npy"
    np.save(p["trunc"], np.ones(100, np.float32))
    p["trunc"].write_bytes(p["trunc"].read_bytes()[:100])
    np.save(tmp_path / "ints.npy", np.arange(5))
    p["ints"] = tmp_path / "ints.npy"
    np.save(tmp_path / "cplx.npy", np.ones(3, np.complex64))
    p["cplx"] = tmp_path / "cplx.npy"
    np.save(tmp_path / "obj.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    p["obj"] = tmp_path / "obj.npy"
    np.save(tmp_path / "empty.npy", np.zeros((0, 3), np.float32))
    p["empty"] = tmp_path / "empty.npy"
    np.save(tmp_path / "allnan.npy", np.full(4, np.nan, np.float32))
    p["allnan"] = tmp_path / "allnan.npy"
    np.save(tmp_path / "inf.npy", np.array([1, -np.inf], np.float32))
    p["inf"] = tmp_path / "inf.npy"
    np.save(tmp_path / "scalar.npy", np.float32(3))
    p["scalar"] = tmp_path / "scalar.npy"
    sub = tmp_path / "sub"
    sub.mkdir()
    np.save(sub / "act.npy", np.ones(3, np.float32))
    p["act2"] = sub / "act.npy"
    p["folder"] = tmp_path / "folder.npy"
    p["folder"].mkdir()
    qparams = {
        "q_list": [1, 2],
        "q_str": {"act": "x"},
        "q_badscale": {"act": {"scale": ["a"], "zero_point": [0], "quant_min": 0,
                               "quant_max": 255}},
        "q_noscale": {"act": {"zero_point": [0], "quant_min": 0, "quant_max": 255}},
        "q_empty": {"act": {"scale": [], "zero_point": [], "quant_min": 0, "quant_max": 255}},
        "q_axis": {"act": {"scale": [0.1], "zero_point": [0], "quant_min": 0,
                           "quant_max": 255, "axis": "0"}},
        "q_axis9": {"act": {"scale": [0.1] * 3, "zero_point": [0] * 3, "quant_min": 0,
                            "quant_max": 255, "axis": 9}},
        "q_channels": {"act": {"scale": [0.1] * 3, "zero_point": [0] * 3, "quant_min": 0,
                               "quant_max": 255, "axis": 0}},
        "q_two": {"act": {"scale": [0.1, 0.2], "zero_point": [0, 0], "quant_min": 0,
                          "quant_max": 255}},
        "q_rounding": {"act": {"scale": [0.1], "zero_point": [0], "quant_min": 0,
                               "quant_max": 255, "rounding": "up"}},
        "q_qmin": {"act": {"scale": [0.1], "zero_point": [0], "quant_min": 0.5,
                           "quant_max": 255}},
        "q_range": {"act": {"scale": [0.1], "zero_point": [0], "quant_min": 9,
                            "quant_max": 2}},
        "q_neg": {"act": {"scale": [-0.1], "zero_point": [0], "quant_min": 0,
                          "quant_max": 255}},
        "q_zp": {"act": {"scale": [0.1], "zero_point": [300], "quant_min": 0,
                         "quant_max": 255}},
        "q_shape": {"act": {"scale": [0.1], "zero_point": [0], "quant_min": 0,
                            "quant_max": 255, "shape": [2, 2]}},
        "q_other": {"weight": {"scale": [0.1], "zero_point": [0], "quant_min": 0,
                               "quant_max": 255}},
    }
    for name, doc in qparams.items():
        p[name] = tmp_path / f"{name}.json"
        p[name].write_text(json.dumps(doc))
    p["q_nan"] = tmp_path / "q_nan.json"
    p["q_nan"].write_text('{"act": {"scale": [NaN], "zero_point": [0], "quant_min": 0, '
                          '"quant_max": 255}}')
    p["q_broken"] = tmp_path / "q_broken.json"
    p["q_broken"].write_text('{"act": ')
    return p


CAL = ["calibrate"]
FQ = ["fake-quant", "{npy}", "-o", "{tmp}/out.npy", "--qparams"]
ERRORS = [
    # bad options (argparse): one line too
    (["calibrate"], "required: FILE"),
    (["frobnicate"], "invalid choice"),
    (CAL + ["{npz}", "--method", "kmeans"], "invalid choice 'kmeans'"),
    (CAL + ["{npz}", "--bits", "1"], "--bits: must be in 2..16, got 1"),
    (CAL + ["{npz}", "--bits", "17"], "must be in 2..16"),
    (CAL + ["{npz}", "--bits", "eight"], "expected an integer"),
    (CAL + ["{npz}", "--averaging-constant", "0"], "must be in (0, 1]"),
    (CAL + ["{npz}", "--rounding", "up"], "invalid choice"),
    (CAL + ["{npz}", "--signed", "--unsigned"], "not allowed with"),
    (CAL + ["{npz}", "--axis", "x"], "invalid int value"),
    (["fake-quant", "{npz}", "-o", "x.npz"], "required: --qparams"),
    # bad files
    (CAL + ["missing.npy"], "no such file"),
    (CAL + ["{bad}"], "cannot read"),
    (CAL + ["{trunc}"], "cannot read"),
    (CAL + ["{badnpz}"], "cannot read: File is not a zip file"),
    (CAL + ["{badst}"], "cannot read"),
    (CAL + ["{obj}"], "cannot read: Object arrays cannot be loaded"),
    (CAL + ["{txt}"], "unknown file type"),
    (CAL + ["{folder}"], "is a directory"),
    (CAL + ["{ints}"], "no floating-point tensors (found int64)"),
    (CAL + ["{cplx}"], "no floating-point tensors (found complex64)"),
    # bad tensors
    (CAL + ["{empty}"], "empty tensor"),
    (CAL + ["{allnan}"], "no finite values"),
    (CAL + ["{inf}"], "holds +-inf"),
    (CAL + ["{inf}", "--method", "moving_average"], "holds +-inf"),
    (CAL + ["{scalar}", "--per-channel"], "a scalar cannot be quantized per channel"),
    (CAL + ["{npz}", "--tensors", "nope"], "tensor(s) not found: nope"),
    (CAL + ["{npz}", "--per-channel", "--axis", "9"], "--axis 9 is out of range"),
    (CAL + ["{npz}", "--per-channel", "--method", "entropy"], "per tensor only"),
    (CAL + ["{npy}", "{act2}"], "is in both"),
    # unwritable outputs (checked before the run)
    (CAL + ["{npz}", "-o", "/nonexistent/q.json"], "does not exist"),
    (CAL + ["{npz}", "--plot", "/nonexistent/h.png"], "does not exist"),
    (CAL + ["{npz}", "-o", "{tmp}"], "is a directory"),
    (FQ + ["{q_other}", "-o", "/nonexistent/x.npy"], "does not exist"),
    (["fake-quant", "{npy}", "--qparams", "{q_other}", "-o", "{tmp}/x.txt"],
     "unknown output type"),
    # bad qparams files
    (FQ + ["missing.json"], "cannot read qparams"),
    (FQ + ["{q_broken}"], "cannot read qparams"),
    (FQ + ["{q_list}"], "expected an object of tensor name"),
    (FQ + ["{q_str}"], "expected an object, got str"),
    (FQ + ["{q_badscale}"], "scale must be a non-empty list of numbers"),
    (FQ + ["{q_noscale}"], "missing scale"),
    (FQ + ["{q_empty}"], "non-empty list"),
    (FQ + ["{q_axis}"], "axis must be an integer or null"),
    (FQ + ["{q_axis9}"], "axis 9 is out of range"),
    (FQ + ["{q_channels}"], "scale must be a 1-D array of 32 values"),
    (FQ + ["{q_two}"], "needs one scale and one zero point"),
    (FQ + ["{q_rounding}"], "rounding must be one of"),
    (FQ + ["{q_qmin}"], "quant_min must be an integer"),
    (FQ + ["{q_range}"], "quant_min must be < quant_max"),
    (FQ + ["{q_neg}"], "scale must be finite and > 0"),
    (FQ + ["{q_nan}"], "scale must be finite and > 0"),
    (FQ + ["{q_zp}"], "zero_point must lie in"),
    (FQ + ["{q_shape}"], "calibrated for shape (2, 2)"),
    (FQ + ["{q_other}"], "holds qparams for none of the floating-point tensors"),
    (["fake-quant", "{npy}", "--qparams", "{q_other}", "-o", "{tmp}/o.npy", "--strict"],
     "no qparams for tensor 'act'"),
]


@pytest.mark.parametrize("argv,fragment", ERRORS, ids=[str(k) for k in range(len(ERRORS))])
def test_errors_are_one_line(files, tmp_path, capsys, argv, fragment):
    paths = {k: str(v) for k, v in _bad_files(tmp_path).items()}
    paths.update(npz=str(files["npz"]), npy=str(files["npy"]), tmp=str(tmp_path))
    argv = [a.format(**paths) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert fragment in err, err
    assert err.count("\n") == 1 and err.startswith("quantcore") and "Traceback" not in err
    assert "error:" in err


def test_internal_errors_are_one_line(files, monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("something\nbroke")
    monkeypatch.setattr(cli, "calibrate", boom)
    monkeypatch.delenv("QUANTCORE_DEBUG", raising=False)
    assert main(["calibrate", str(files["npy"])]) == 1
    err = capsys.readouterr().err
    assert err == ("quantcore: internal error: RuntimeError: something broke "
                   "(QUANTCORE_DEBUG=1 shows the traceback)\n")
    monkeypatch.setenv("QUANTCORE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["calibrate", str(files["npy"])])


def _run(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("QUANTCORE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "quantcore", *argv], capture_output=True,
                          text=True, env=env, cwd=str(ROOT))


def test_module_entry_point(files, tmp_path):
    res = _run("--help")
    assert res.returncode == 0 and "calibrate" in res.stdout and "fake-quant" in res.stdout
    res = _run("calibrate", str(files["npy"]), "-q")
    assert res.returncode == 0 and "act" in res.stdout
    for argv in (["calibrate", str(tmp_path / "nope.npy")], ["calibrate", "--bits", "0", "x"],
                 ["fake-quant", str(files["npy"]), "--qparams", str(files["npy"]), "-o",
                  str(tmp_path / "o.npy")]):
        res = _run(*argv)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert "Traceback" not in res.stderr
