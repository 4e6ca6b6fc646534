"""The command line: calibrate (methods, schemes, selection, notes), the
plot, fake-quant, the file readers, --help, progress bar, and errors as
one line with a non-zero status (never a traceback).

Oracles: quantcore's own qparams / calibrators for the table and the JSON,
NVIDIA's HistogramCalibrator for the symmetric histogram methods, live
onnxruntime (HistogramCollector) for the two-sided percentile, the
safetensors package, torch and ml_dtypes for the file formats.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import quantcore as qc
from quantcore import cli, cli_calibrate, cli_common
from quantcore.calib import HistogramCalibrator
from quantcore.cli import main
from quantcore.cli_files import list_tensors, save_tensors

ROOT = Path(__file__).resolve().parent.parent
f32 = np.float32


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    w = (rng.laplace(size=(16, 8, 3, 3)) * 0.1).astype(f32)
    a = np.maximum(rng.normal(size=(32, 64)), 0).astype(f32)
    np.save(tmp_path / "act.npy", a)
    np.savez(tmp_path / "model.npz", weight=w, steps=np.arange(3))
    paths = {"npy": tmp_path / "act.npy", "npz": tmp_path / "model.npz", "w": w, "a": a}
    save_tensors({"weight": w}, str(tmp_path / "model.safetensors"))
    paths["st"] = tmp_path / "model.safetensors"
    return paths


def checkpoint(path, rng=None):
    """A small transformer-shaped safetensors file: 2-D weights, 1-D biases
    and norms, a heavy-tailed and a skewed tensor, plus tensors the CLI
    cannot calibrate (empty, int64, all inf)."""
    rng = rng or np.random.default_rng(1)
    t = {"embed.weight": (rng.normal(size=(50, 16)) * 0.02).astype(f32)}
    for b in range(2):
        t[f"blocks.{b}.attn.q.weight"] = (rng.normal(size=(16, 16)) / 4).astype(f32)
        t[f"blocks.{b}.attn.q.bias"] = (rng.normal(size=16) * 0.01).astype(f32)
        t[f"blocks.{b}.ln.weight"] = (1 + rng.normal(size=16) * 0.05).astype(f32)
        t[f"blocks.{b}.mlp.weight"] = (rng.standard_t(3, size=(64, 16)) / 4).astype(f32)
    skew = (rng.normal(size=(32, 16)) * 0.5).astype(f32)
    skew[0, :2] = [-10.66, 1.74]
    t["head.skewed.weight"] = np.clip(skew, -10.66, 1.74)
    t["empty.weight"] = np.zeros((0, 4), f32)
    t["position_ids"] = np.arange(8)
    t["allinf.weight"] = np.full((2, 2), np.inf, f32)
    save_tensors(t, str(path))
    return t


def run_json(capsys, tmp_path, *argv):
    q = tmp_path / "q.json"
    assert main(["calibrate", *map(str, argv), "-o", str(q)]) == 0
    return json.loads(q.read_text()), capsys.readouterr().out


# ------------------------------------------------------------ calibrate
def test_calibrate_and_apply_round_trip(files, tmp_path, capsys):
    """Default: symmetric signed 8-bit minmax, as torch's weight observer."""
    saved, out = run_json(capsys, tmp_path, files["npz"])
    assert "weight" in out and "SQNR" in out and "steps (int64)" in out
    for column in ("shape", "range", "scale", "zero point", "max |err|"):
        assert column in out
    lo, hi = qc.minmax(files["w"])
    s, z = qc.qparams.symmetric_qparams(lo, hi, -128, 127)
    assert saved["weight"]["scale"] == s.tolist() and saved["weight"]["zero_point"] == [0]
    assert saved["weight"]["symmetric"] is True
    dst = tmp_path / "fq.npz"
    assert main(["fake-quant", str(files["npz"]), "--qparams", str(tmp_path / "q.json"),
                 "-o", str(dst)]) == 0
    with np.load(dst) as npz:
        assert np.array_equal(npz["weight"], qc.fake_quant(files["w"], s[0], z[0], -128, 127))
        assert np.array_equal(npz["steps"], np.arange(3))  # not float: copied unchanged


def test_table_numbers(files, capsys):
    """The table's SQNR and max error are those of the fake-quantized tensor."""
    assert main(["calibrate", str(files["npy"]), "--bits", "4", "--affine"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("act")][0]
    lo, hi = qc.minmax(files["a"])
    s, z = qc.qparams.affine_qparams(lo, hi, -8, 7)
    y = qc.fake_quant(files["a"], s[0], z[0], -8, 7).astype(np.float64)
    x = files["a"].astype(np.float64)
    sqnr = 10 * np.log10(np.sum(x ** 2) / np.sum((x - y) ** 2))
    fields = row.split()
    assert fields[-2] == f"{sqnr:.2f}" and float(fields[-1]) == pytest.approx(
        np.max(np.abs(x - y)), rel=1e-3)
    # the range column is the clipping range of the qparams, not the data's
    c_lo, c_hi = (-8 - float(z[0])) * float(s[0]), (7 - float(z[0])) * float(s[0])
    assert f"{s[0]:.6g}" in row and f"[{c_lo:.4g}, {c_hi:.4g}]" in row
    assert fields[1] == "32x64"


def test_per_channel_round_trip_safetensors(files, tmp_path, capsys):
    saved, _ = run_json(capsys, tmp_path, files["st"], "--per-channel", "--axis", "0",
                        "--unsigned", "--affine", "--rounding", "half_up")
    entry = saved["weight"]
    assert entry["axis"] == 0 and len(entry["scale"]) == 16 and entry["quant_min"] == 0
    dst = tmp_path / "w.safetensors"
    assert main(["fake-quant", str(files["st"]), "--qparams", str(tmp_path / "q.json"),
                 "-o", str(dst)]) == 0
    lo, hi = qc.minmax(files["w"], axis=0)
    s, z = qc.qparams.affine_qparams(lo, hi, 0, 255)
    expect = qc.fake_quant(files["w"], s, z, 0, 255, axis=0, rounding="half_up")
    from safetensors.numpy import load_file
    assert np.array_equal(load_file(str(dst))["weight"], expect)


@pytest.mark.parametrize("argv", [
    ["--method", "entropy", "--bits", "4"],
    ["--method", "percentile", "--unsigned", "--percentile", "99.9", "--bins", "512"],
    ["--method", "percentile", "--affine"],
    ["--method", "mse", "--bins", "256"],
    ["--method", "moving_average", "--per-channel", "--axis", "0"],
    ["--method", "moving-average", "--averaging-constant", "0.5"],
    ["--per-channel", "--axis", "-1", "--rounding", "half_up"],
    ["--rounding", "half_away", "--bits", "16", "--affine"],
    ["--tensors", "weight"],
])
def test_calibrate_methods(files, argv, capsys):
    assert main(["calibrate", str(files["st"])] + argv) == 0
    assert "weight" in capsys.readouterr().out


def hist_amax(x, method, bits=8, unsigned=False, bins=2048, **kw):
    c = HistogramCalibrator(bits, None, unsigned, num_bins=bins)
    c.collect(x[np.isfinite(x)])
    return c.compute_amax(method, **kw)


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse"])
def test_symmetric_histogram_methods_are_nvidias(files, tmp_path, capsys, method):
    """Symmetric: (-amax, amax) with NVIDIA's amax of |x|, --bins and
    --percentile passed through."""
    kw = {"percentile": 99.0} if method == "percentile" else {}
    saved, _ = run_json(capsys, tmp_path, files["st"], "--method", method, "--bins", "512",
                        *(["--percentile", "99"] if kw else []))
    amax = hist_amax(files["w"], method, bins=512, **kw)
    s, z = qc.qparams.symmetric_qparams(-amax, amax, -128, 127)
    assert saved["weight"]["scale"] == s.tolist() and saved["weight"]["zero_point"] == [0]


def test_affine_percentile_is_onnxruntimes_two_sided_range(tmp_path, capsys):
    """--affine percentile cuts (100 - p) / 2 percent from each tail, as
    onnxruntime's HistogramCollector with symmetric=False (live)."""
    calibrate = pytest.importorskip("onnxruntime.quantization.calibrate")
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_t(3, 3000), -np.abs(rng.normal(size=40)) * 30])
    x = x.astype(f32)
    np.save(tmp_path / "x.npy", x)
    for p, bins in ((99.9, 2048), (99.0, 128), (90.0, 512)):
        hc = calibrate.HistogramCollector(method="percentile", symmetric=False, num_bins=bins,
                                          num_quantized_bins=128, percentile=p, scenario="same")
        hc.collect({"x": [x]})
        lo, hi = hc.compute_collection_result()["x"][:2]
        saved, _ = run_json(capsys, tmp_path, tmp_path / "x.npy", "--method", "percentile",
                            "--affine", "--percentile", str(p), "--bins", str(bins))
        s, z = qc.qparams.affine_qparams(lo, hi, -128, 127)
        assert (saved["x"]["scale"], saved["x"]["zero_point"]) == (s.tolist(), z.tolist())


def test_affine_is_honoured_by_the_histogram_methods(tmp_path, capsys):
    """Skewed weights (silero-like [-10.66, 1.74]): the affine percentile
    beats the symmetric one; entropy / mse calibrate [0, amax] with NVIDIA's
    unsigned search on a tensor without negative values and leave out (with
    a note) one with negative values."""
    rng = np.random.default_rng(5)
    skew = np.clip(rng.normal(-1, 1.5, size=(64, 32)), -10.66, 1.74).astype(f32)
    relu = np.abs(rng.normal(size=(64, 32))).astype(f32)
    np.savez(tmp_path / "m.npz", skew=skew, relu=relu)

    def sqnr(method, *extra):
        assert main(["calibrate", str(tmp_path / "m.npz"), "--method", method,
                     "--tensors", "skew", *extra]) == 0
        row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("skew")][0]
        return float(row.split()[-2])
    assert sqnr("percentile", "--affine") > sqnr("percentile") + 2
    assert sqnr("minmax", "--affine") > sqnr("minmax") + 2
    for method in ("entropy", "mse"):
        saved, out = run_json(capsys, tmp_path, tmp_path / "m.npz", "--method", method,
                              "--affine")
        assert list(saved) == ["relu"]
        assert "left out 1 tensor(s), negative values" in out and "skew (min " in out
        amax = hist_amax(relu, method, unsigned=True)
        s, z = qc.qparams.affine_qparams(f32(0), amax, -128, 127)
        assert (saved["relu"]["scale"], saved["relu"]["zero_point"]) == (s.tolist(), [-128])


def test_entropy_warns_on_sparse_histograms(tmp_path, capsys):
    """A 48-value weight with two outliers: entropy clips them (1.6 dB, the
    issue's case); warned, with both SQNRs.  A dense tensor, and a sparse
    one where entropy keeps the range, are not."""
    def small(seed):
        x = (np.random.default_rng(seed).normal(size=(6, 8)) * 0.1).astype(f32)
        x[0, 0], x[3, 5] = 2.0, -1.5
        return x
    np.savez(tmp_path / "t.npz", small=small(7), lucky=small(6),
             big=np.random.default_rng(6).normal(size=(256, 256)).astype(f32))
    assert main(["calibrate", str(tmp_path / "t.npz"), "--method", "entropy"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100     # wrapped
    warning = [para for para in out.replace("\n    ", " ").splitlines()
               if para.startswith("warning: entropy")]
    assert len(warning) == 1 and "on 1 tensor(s)" in warning[0]
    assert "small (48 values: 1.6 dB, minmax 38.3)" in warning[0]
    assert "prefer mse or minmax" in warning[0]


def test_moving_average_warns_about_static_weights(files, capsys):
    assert main(["calibrate", str(files["npz"]), "--method", "moving_average"]) == 0
    assert "warning: moving_average averages the ranges of successive batches" in \
        capsys.readouterr().out
    assert main(["calibrate", str(files["npz"])]) == 0
    assert "warning" not in capsys.readouterr().out


def test_per_channel_leaves_out_1d_tensors_unless_asked(tmp_path, capsys):
    t = checkpoint(tmp_path / "c.safetensors")
    saved, out = run_json(capsys, tmp_path, tmp_path / "c.safetensors", "--per-channel")
    assert not any(k.endswith(("bias", "ln.weight")) for k in saved)
    assert "left out 4 tensor(s), 1-D or scalar (--per-channel)" in out
    assert len(saved["blocks.0.mlp.weight"]["scale"]) == 64
    saved, out = run_json(capsys, tmp_path, tmp_path / "c.safetensors", "--per-channel",
                          "--per-channel-1d")
    assert len(saved["blocks.1.attn.q.bias"]["scale"]) == 16
    assert t["blocks.1.attn.q.bias"].shape == (16,)


def test_tensor_globs_and_weights_only(tmp_path, capsys):
    checkpoint(tmp_path / "c.safetensors")
    path = tmp_path / "c.safetensors"
    saved, _ = run_json(capsys, tmp_path, path, "--tensors", "blocks.*.weight")
    assert sorted(saved) == ["blocks.0.attn.q.weight", "blocks.0.ln.weight",
                             "blocks.0.mlp.weight", "blocks.1.attn.q.weight",
                             "blocks.1.ln.weight", "blocks.1.mlp.weight"]
    saved, out = run_json(capsys, tmp_path, path, "--weights-only")
    assert sorted(saved) == ["blocks.0.attn.q.weight", "blocks.0.mlp.weight",
                             "blocks.1.attn.q.weight", "blocks.1.mlp.weight", "embed.weight",
                             "head.skewed.weight"]
    assert "1-D or scalar (--weights-only)" in out
    saved, _ = run_json(capsys, tmp_path, path, "--weights-only", "--tensors", "*mlp*",
                        "head.*")
    assert sorted(saved) == ["blocks.0.mlp.weight", "blocks.1.mlp.weight",
                             "head.skewed.weight"]
    saved, _ = run_json(capsys, tmp_path, path, "--tensors", "embed.weight")
    assert list(saved) == ["embed.weight"]


def test_uncalibratable_tensors_are_left_out_with_notes(tmp_path, capsys):
    """Empty, non-float, all-inf, bfloat16 and float8 tensors in one file:
    the rest is calibrated (status 0); bf16 / fp8 are read exactly."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    rng = np.random.default_rng(2)
    w = torch.from_numpy(rng.normal(size=(8, 8)).astype(f32))
    save_file({"w": w, "bf16": w.to(torch.bfloat16), "fp8": w.to(torch.float8_e4m3fn),
               "e5m2": w.to(torch.float8_e5m2), "empty": torch.zeros(0, 3),
               "ids": torch.arange(4), "inf": torch.full((2,), float("inf"))},
              str(tmp_path / "mixed.safetensors"))
    saved, out = run_json(capsys, tmp_path, tmp_path / "mixed.safetensors")
    assert sorted(saved) == ["bf16", "e5m2", "fp8", "w"]
    assert "left out 1 tensor(s), not floating point: ids (int64)" in out
    assert "left out 1 tensor(s), empty: empty (shape (0, 3))" in out
    assert "left out 1 tensor(s), no finite values: inf" in out
    assert "note: bf16: BF16 read as float32 (exact)" in out
    for name, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn),
                        ("e5m2", torch.float8_e5m2)):
        exact = w.to(dtype).float().numpy()
        lo, hi = qc.minmax(exact)
        assert saved[name]["scale"] == qc.qparams.symmetric_qparams(lo, hi, -128,
                                                                     127)[0].tolist()
    assert main(["calibrate", str(tmp_path / "mixed.safetensors"), "--tensors",
                 "empty", "ids", "inf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quantcore: error: nothing calibrated: left out 1 tensor(s), not "
                          "floating point: ids (int64); left out 1 tensor(s), empty: ")
    assert err.count("\n") == 1


def test_float8_without_ml_dtypes_is_a_note(tmp_path, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    save_file({"w": torch.ones(4), "fp8": torch.ones(4, dtype=torch.float8_e4m3fn)},
              str(tmp_path / "f8.safetensors"))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    saved, out = run_json(capsys, tmp_path, tmp_path / "f8.safetensors")
    out = " ".join(out.split())   # (notes are wrapped)
    assert list(saved) == ["w"]
    assert "left out 1 tensor(s), F8_E4M3 values need the ml_dtypes package to be read " \
           "(pip install ml_dtypes): fp8" in out


def test_nan_values_are_ignored_and_counted(tmp_path, capsys):
    x = np.linspace(-1, 1, 200, dtype=f32)
    x[::50] = np.nan
    np.save(tmp_path / "n.npy", x)
    for method in ("minmax", "moving_average", "entropy"):
        assert main(["calibrate", str(tmp_path / "n.npy"), "--method", method]) == 0
        out = capsys.readouterr().out
        assert "note: n: 4 NaN value(s) ignored" in out and " nan " not in out


def test_inf_is_handled_by_histogram_methods(tmp_path, capsys):
    x = np.linspace(-1, 1, 200, dtype=f32)
    x[3] = np.inf
    np.save(tmp_path / "i.npy", x)
    assert main(["calibrate", str(tmp_path / "i.npy"), "--method", "percentile"]) == 0
    assert main(["calibrate", str(tmp_path / "i.npy")]) == 2
    assert "--method percentile, entropy or mse use the finite values" in \
        capsys.readouterr().err


# ------------------------------------------------------------------ plot
def test_plot_data(files, tmp_path):
    """Each method's range and SQNR on the plot is the per-tensor result of
    that method under the run's scheme."""
    args = cli.build_parser().parse_args(["calibrate", "x.npy", "--plot", "p.png", "--affine"])
    scheme = cli.Scheme(8, True, False)
    x = files["a"]
    plot = cli_calibrate._plot_data("act", x, x, cli.Histograms(x, 2048), scheme, args,
                          (*qc.minmax(x), 40.0))
    assert sorted(plot.methods) == sorted(cli.METHODS)
    lo, hi = qc.minmax(x)
    s, z = qc.qparams.affine_qparams(lo, hi, -128, 127)
    c_lo, c_hi, sqnr = plot.methods["minmax"]
    assert (c_lo, c_hi) == pytest.approx(((-128 - z[0]) * s[0], (127 - z[0]) * s[0]))
    assert sqnr == pytest.approx(cli.sqnr_db(x, qc.fake_quant(x, s[0], z[0], -128, 127)))
    assert plot.counts.sum() == x.size
    assert plot.best() and set(plot.best()) <= set(cli.METHODS)


def test_plot_pages_cover_every_tensor(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from quantcore import cli_plot
    monkeypatch.setattr(cli_plot, "SUMMARY_ROWS", 6)    # (small pages: a fast test)
    monkeypatch.setattr(cli_plot, "MAX_DETAILED", 3)
    monkeypatch.setattr(cli_plot, "TENSORS_PER_PAGE", 2)
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "many.npz", **{f"t{k:02d}": rng.standard_t(2 + k % 5, size=(40, 30))
                                       .astype(f32) for k in range(8)})
    png = tmp_path / "h.png"
    assert main(["calibrate", str(tmp_path / "many.npz"), "--plot", str(png),
                 "--method", "mse", "--bins", "256"]) == 0
    out = capsys.readouterr().out
    # 8 tensors: two summary pages (6 rows each), then at most 3 tensors on 2 pages,
    # all stacked in the one file asked for
    assert f"plot written to {png}\n" in out
    assert sorted(os.listdir(tmp_path)) == ["h.png", "many.npz"]   # no h_2.png beside it
    import matplotlib.image
    image = matplotlib.image.imread(str(png))
    assert image.shape[1] == 12 * cli_plot.DPI
    assert image.shape[0] > 2 * (1.6 + 0.24 * 6) * cli_plot.DPI   # more than two pages tall
    pdf = tmp_path / "h.pdf"
    assert main(["calibrate", str(tmp_path / "many.npz"), "--plot", str(pdf),
                 "--tensors", "t0[0-2]", "--bins", "256"]) == 0
    assert pdf.read_bytes()[:5] == b"%PDF-" and f"plot written to {pdf}\n" in \
        capsys.readouterr().out


def test_plot_detail_pages_pick_the_tensors_where_the_method_loses_most():
    from quantcore.cli_plot import MAX_DETAILED, TensorPlot, _detailed
    edges = np.linspace(-1, 1, 5)
    plots = [TensorPlot(f"t{k}", (4,), np.ones(4), edges,
                        {"minmax": (-1, 1, 30.0), "mse": (-1, 1, 30.0 + k)}, (-1, 1, 30.0, False))
             for k in range(12)]
    assert plots[5].loss() == (5.0, 5.0) and plots[5].best() == ("mse",)
    assert plots[0].best() == ("minmax", "mse")          # a tie: both, no preference
    shown, caption = _detailed(plots, "minmax")
    assert [p.key for p in shown] == [f"t{k}" for k in range(11, 11 - MAX_DETAILED, -1)]
    assert "where minmax loses most" in caption and "loses on 11 of 12" in caption
    # mse wins or ties everywhere: no page claims it loses
    mse_run = [TensorPlot(p.key, p.shape, p.counts, p.edges, p.methods,
                          (-1, 1, p.sqnr("mse"), False)) for p in plots[:4]]
    shown, caption = _detailed(mse_run, "mse")
    assert "mse is best or tied" in caption and "loses" not in caption
    assert [p.key for p in shown] == ["t3", "t2", "t1", "t0"]   # the widest spread first
    # only the tensors where it loses, however few
    shown, caption = _detailed(plots[:3], "minmax")
    assert [p.key for p in shown] == ["t2", "t1"] and "loses on 2 of 3" in caption


# --------------------------------------------------------- progress bar
def test_progress_bar_only_on_a_terminal(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tqdm")
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "many.npz", **{f"t{k}": rng.normal(size=(40, 5)).astype(f32)
                                       for k in range(3)})
    argv = ["calibrate", str(tmp_path / "many.npz"), "--method", "moving_average"]
    assert main(argv) == 0            # stderr is not a terminal here: no bar
    assert capsys.readouterr().err == ""
    assert main(argv + ["--progress"]) == 0
    err = capsys.readouterr().err
    # 3 tensors x (16 moving-average batches + 1 fake-quant pass)
    assert "calibrating" in err and "51/51" in err and "step" in err
    monkeypatch.setattr(cli_calibrate, "_is_terminal", lambda stream: True)
    monkeypatch.setattr(cli_calibrate, "PROGRESS_DELAY", 0)
    assert main(argv) == 0
    assert "calibrating" in capsys.readouterr().err
    assert main(argv + ["-q"]) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- help
@pytest.mark.parametrize("argv", [["--help"], ["calibrate", "--help"],
                                  ["fake-quant", "--help"], ["demo", "--help"]])
def test_help(argv, capsys):
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "usage: quantcore" in out
    if argv[:1] == ["calibrate"]:
        for option in ("--method", "--bits", "--unsigned", "--symmetric", "--per-channel",
                       "--axis", "--rounding", "--plot", "-o JSON", "--percentile P",
                       "--bins N", "--tensors PATTERN", "--weights-only", "--per-channel-1d"):
            assert option in out
        assert "(default: torch's and onnxruntime's weight scheme)" in out
        assert "The defaults suit weights: 8-bit signed symmetric" in out
    if argv == ["--help"]:
        assert "calibrate" in out and "fake-quant" in out and "examples:" in out


def test_no_command_prints_usage_and_fails(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("usage: quantcore")
    assert "calibrate" in captured.err


# ---------------------------------------------------------------- files
def test_safetensors_reader_and_writer_match_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(8)
    tensors = {"a": rng.normal(size=(3, 5)).astype(f32), "b": np.arange(7, dtype=np.int16),
               "c": rng.normal(size=4), "d": np.array([True, False]),
               "e": np.zeros((0, 2), np.float16), "f": rng.normal(size=(2, 3)).astype(np.float16).T}
    save_tensors(tensors, str(tmp_path / "ours.safetensors"), {"format": "pt"})
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    assert sorted(theirs) == sorted(tensors)
    for name, value in tensors.items():
        assert theirs[name].dtype == value.dtype and np.array_equal(theirs[name], value)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "ours.safetensors"), "np") as fh:
        assert fh.metadata() == {"format": "pt"}
    st.save_file(tensors | {"f": np.ascontiguousarray(tensors["f"])},
                 str(tmp_path / "theirs.safetensors"))
    entries = {e.name: e for e in list_tensors(str(tmp_path / "theirs.safetensors"))}
    for name, value in tensors.items():
        got = entries[name].load()
        assert got.dtype == value.dtype and np.array_equal(got, value)
        assert entries[name].shape == value.shape and entries[name].is_float == (
            value.dtype.kind == "f")
    # 0-d tensors (the safetensors package's numpy API turns them into shape (1,))
    save_tensors({"s": np.array(2.5, f32)}, str(tmp_path / "s.safetensors"))
    (entry,) = list_tensors(str(tmp_path / "s.safetensors"))
    assert entry.shape == () and entry.load().shape == () and entry.load() == f32(2.5)


def test_fake_quant_keeps_metadata_and_writes_widened_tensors_as_float32(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    w = torch.linspace(-1, 1, 64).reshape(8, 8)
    save_file({"w": w.to(torch.bfloat16), "b": torch.ones(3)}, str(tmp_path / "m.safetensors"),
              metadata={"source": "test"})
    assert main(["calibrate", str(tmp_path / "m.safetensors"), "-o",
                 str(tmp_path / "q.json"), "--tensors", "w"]) == 0
    assert main(["fake-quant", str(tmp_path / "m.safetensors"), "--qparams",
                 str(tmp_path / "q.json"), "-o", str(tmp_path / "o.safetensors")]) == 0
    assert "note: w: BF16 written as float32" in capsys.readouterr().out
    from safetensors import safe_open
    with safe_open(str(tmp_path / "o.safetensors"), "np") as fh:
        assert fh.metadata() == {"source": "test"}
        assert fh.get_tensor("w").dtype == f32 and np.array_equal(fh.get_tensor("b"), np.ones(3))


# --------------------------------------------------------------- errors
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
    p["junkst"] = tmp_path / "junk.safetensors"
    p["junkst"].write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    p["shortst"] = tmp_path / "short.safetensors"
    p["shortst"].write_bytes(b"\x01\x02")
    p["entryst"] = tmp_path / "entry.safetensors"
    header = b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,99]}}'
    p["entryst"].write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    p["trunc"] = tmp_path / "trunc.npy"
    np.save(p["trunc"], np.ones(100, f32))
    p["trunc"].write_bytes(p["trunc"].read_bytes()[:200])
    p["badheader"] = tmp_path / "badheader.npy"
    p["badheader"].write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': 1}    ")
    np.save(tmp_path / "ints.npy", np.arange(5))
    p["ints"] = tmp_path / "ints.npy"
    np.save(tmp_path / "cplx.npy", np.ones(3, np.complex64))
    p["cplx"] = tmp_path / "cplx.npy"
    np.save(tmp_path / "obj.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    p["obj"] = tmp_path / "obj.npy"
    np.savez(tmp_path / "objz.npz", o=np.array([1, "a"], dtype=object))
    p["objz"] = tmp_path / "objz.npz"
    np.save(tmp_path / "empty.npy", np.zeros((0, 3), f32))
    p["empty"] = tmp_path / "empty.npy"
    np.save(tmp_path / "allnan.npy", np.full(4, np.nan, f32))
    p["allnan"] = tmp_path / "allnan.npy"
    np.save(tmp_path / "inf.npy", np.array([1, -np.inf], f32))
    p["inf"] = tmp_path / "inf.npy"
    np.save(tmp_path / "scalar.npy", f32(3))
    p["scalar"] = tmp_path / "scalar.npy"
    sub = tmp_path / "sub"
    sub.mkdir()
    np.save(sub / "act.npy", np.ones(3, f32))
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
    (CAL + ["{npz}", "--percentile", "0"], "--percentile: must be in (0, 100], got 0"),
    (CAL + ["{npz}", "--percentile", "101"], "must be in (0, 100]"),
    (CAL + ["{npz}", "--bins", "8"], "--bins: must be in 16..65536, got 8"),
    (CAL + ["{npz}", "--rounding", "up"], "invalid choice"),
    (CAL + ["{npz}", "--signed", "--unsigned"], "not allowed with"),
    (CAL + ["{npz}", "--symmetric", "--affine"], "not allowed with"),
    (CAL + ["{npz}", "--axis", "x"], "invalid int value"),
    (["fake-quant", "{npz}", "-o", "x.npz"], "required: --qparams"),
    # bad files (never numpy's advice to unpickle)
    (CAL + ["missing.npy"], "no such file"),
    (CAL + ["{bad}"], "bad.npy: not a .npy file (no NumPy header)"),
    (CAL + ["{badheader}"], "not a .npy array"),
    (CAL + ["{trunc}"], "cannot read: the file holds 72 bytes of data, shape (100,) needs 400"),
    (CAL + ["{badnpz}"], "bad.npz: not an .npz file (not a zip archive)"),
    (CAL + ["{badst}"], "not a safetensors file (header length 16 does not fit"),
    (CAL + ["{junkst}"], "not a safetensors file (header is not JSON"),
    (CAL + ["{shortst}"], "not a safetensors file (shorter than its 8-byte header)"),
    (CAL + ["{entryst}"], "'x': data_offsets [0, 99] span 99 bytes"),  # as quantize refuses it
    (CAL + ["{obj}"], "holds Python objects (dtype object), which are never unpickled"),
    (CAL + ["{objz}"], "holds Python objects (dtype object)"),
    (CAL + ["{txt}"], "unknown file type"),
    (CAL + ["{folder}"], "is a directory"),
    (CAL + ["{ints}"], "nothing calibrated: left out 1 tensor(s), not floating point: ints"),
    (CAL + ["{cplx}"], "dtype complex64 is not a real number type"),
    # bad tensors: left out, and nothing left
    (CAL + ["{empty}"], "nothing calibrated: left out 1 tensor(s), empty: empty (shape (0, 3))"),
    (CAL + ["{allnan}"], "no finite values"),
    (CAL + ["{inf}"], "+-inf values"),
    (CAL + ["{inf}", "--method", "moving_average"], "+-inf values"),
    (CAL + ["{scalar}", "--per-channel"], "1-D or scalar (--per-channel)"),
    (CAL + ["{npz}", "--tensors", "nope", "w*"], "--tensors: nothing matches nope"),
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
    err, everything = captured.err, captured.out + captured.err
    assert fragment in everything, everything
    assert err.count("\n") == 1 and err.startswith("quantcore") and "Traceback" not in err
    assert "error:" in err and "allow_pickle" not in everything


def test_internal_errors_are_one_line(files, monkeypatch, capsys):
    def boom(path):
        raise RuntimeError("something\nbroke")
    monkeypatch.setattr(cli_common, "list_tensors", boom)
    monkeypatch.delenv("QUANTCORE_DEBUG", raising=False)
    argv = ["calibrate", str(files["npy"])]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == ("quantcore: internal error: RuntimeError: something broke "
                   "(QUANTCORE_DEBUG=1 shows the traceback)\n")
    monkeypatch.setenv("QUANTCORE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(argv)


def test_float64_beyond_float32_is_left_out_with_the_reason(tmp_path, capsys):
    """A float64 tensor whose values overflow float32 is left out naming
    that, without a numpy overflow warning or a blamed scale."""
    np.savez(tmp_path / "m.npz", big=np.array([1e39, 1.0] * 10), ok=np.arange(20.0))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["calibrate", str(tmp_path / "m.npz")]) == 0
        out = capsys.readouterr()
        assert "values beyond float32's range (max |x| = 1e+39" in " ".join(
            (out.out + out.err).split())
        np.save(tmp_path / "big.npy", np.array([1e300, -2.0]))
        assert main(["calibrate", str(tmp_path / "big.npy")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "1e+300" in err and "scale" not in err


def test_out_of_memory_is_a_user_error(files, monkeypatch, capsys):
    """A tensor larger than the memory (MemoryError) is one line, status 2,
    not an internal error."""
    def too_big(path):
        raise MemoryError("Unable to allocate 8.00 GiB for an array")
    monkeypatch.setattr(cli_common, "list_tensors", too_big)
    monkeypatch.delenv("QUANTCORE_DEBUG", raising=False)
    assert main(["calibrate", str(files["npy"])]) == 2
    err = capsys.readouterr().err
    assert err == ("quantcore: error: out of memory (Unable to allocate 8.00 GiB for an array): "
                   "a tensor or batch is larger than the memory available\n")


def _run(*argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("QUANTCORE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "quantcore", *argv], capture_output=True,
                          text=True, env=env, cwd=str(ROOT))


def test_module_entry_point(files, tmp_path):
    res = _run("--help")
    assert res.returncode == 0 and "calibrate" in res.stdout and "fake-quant" in res.stdout
    res = _run("calibrate", str(files["npy"]))
    assert res.returncode == 0 and "act" in res.stdout and res.stderr == ""  # no bar in a pipe
    res = _run()
    assert res.returncode == 2 and res.stderr.startswith("usage: quantcore")
    for argv in (["calibrate", str(tmp_path / "nope.npy")], ["calibrate", "--bits", "0", "x"],
                 ["fake-quant", str(files["npy"]), "--qparams", str(files["npy"]), "-o",
                  str(tmp_path / "o.npy")]):
        res = _run(*argv)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert "Traceback" not in res.stderr


# ------------------------------------------------------------------ quantize
def _cnn_checkpoint(path):
    """A conv net + a linear head as torch names them: conv kernels, BatchNorm
    statistics, an embedding, biases, a linear weight whose input dimension
    (200) is not a multiple of 128."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from quantcore.checkpoints import SafetensorsWriter
    rng = np.random.default_rng(3)
    bf = ml_dtypes.bfloat16
    t = {"conv1.weight": rng.normal(size=(32, 16, 3, 3)).astype(bf),
         "bn1.weight": (1 + rng.normal(size=32) * 0.1).astype(f32),
         "bn1.running_mean": rng.normal(size=32).astype(f32),
         "bn1.running_var": rng.random(32).astype(f32),
         "bn1.num_batches_tracked": np.array(7, np.int64),
         "tok_embeddings.weight": rng.normal(size=(100, 256)).astype(bf),
         "fc.weight": rng.normal(size=(64, 256)).astype(bf),
         "fc.bias": rng.normal(size=64).astype(bf),
         "head.weight": rng.normal(size=(10, 200)).astype(bf)}
    with SafetensorsWriter(str(path), [(k, v.dtype, v.shape) for k, v in t.items()],
                           {"origin": "test"}) as w:
        for k, v in t.items():
            w.write(k, v)
    return t


def _quantize(capsys, *argv):
    code = main(["quantize", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_quantize_defaults_touch_linear_weights_only(tmp_path, capsys):
    from quantcore import formats as F
    from quantcore.checkpoints import SafetensorsReader
    t = _cnn_checkpoint(tmp_path / "m.safetensors")
    code, out, err = _quantize(capsys, tmp_path / "m.safetensors", "-o",
                               tmp_path / "q.safetensors")
    assert code == 0, err
    text = " ".join(out.split())
    assert max(map(len, out.splitlines())) <= 100
    with SafetensorsReader(str(tmp_path / "q.safetensors")) as r:
        for name in ("conv1.weight", "bn1.weight", "bn1.running_mean", "bn1.running_var",
                     "bn1.num_batches_tracked", "tok_embeddings.weight", "fc.bias"):
            want = np.asarray(t[name]).reshape(-1).view(np.uint8)
            assert np.array_equal(np.asarray(r.raw(name)), want), name   # copied as is
        assert set(n for n in r if n.endswith(".qweight")) == {"fc.weight.qweight",
                                                                "head.weight.qweight"}
        # groups along the input dimension (the last of a Linear weight (out, in))
        w = t["head.weight"].astype(f32)
        q, s, z = F.group_quantize(w, 4, 128, recipe="onnx")
        assert np.array_equal(np.asarray(r["head.weight.qweight"]), F.pack_int4(q))
        assert np.array_equal(np.asarray(r["head.weight.scales"]), s)
        assert r.metadata["origin"] == "test" and r.metadata["symmetric"] == "false"
    for fragment in ("BatchNorm statistics", "bn1.running_mean", "convolution kernels",
                     "conv1.weight", "embeddings", "tok_embeddings.weight", "fc.bias",
                     "head.weight (K=200)", "--tensors quantizes them"):
        assert fragment in text, fragment
    # the size line: whole file and the quantized tensors alone, bits per weight
    n_w = 64 * 256 + 10 * 200
    q_out = (64 * 128 + 64 * 2 * 4 + 64 * 2) + (10 * 100 + 10 * 2 * 4 + 10 * 2)
    assert f"{8 * q_out / n_w:.2f} bits per weight" in text and f"over {n_w} weights" in text
    assert "SQNR over the quantized tensors only" in text
    row = [ln for ln in out.splitlines() if ln.startswith("fc.weight ")][0].split()
    assert row[1] == "64x256" and row[3] == f"{8 * (64 * 128 + 64 * 2 * 5) / (64 * 256):.2f}"


def test_quantize_named_conv_groups_run_along_its_flattened_input(tmp_path, capsys):
    from quantcore import formats as F
    from quantcore.checkpoints import SafetensorsReader
    t = _cnn_checkpoint(tmp_path / "m.safetensors")
    code, out, err = _quantize(capsys, tmp_path / "m.safetensors", "--tensors", "conv*",
                               "--group-size", "16", "--format", "int8", "--symmetric",
                               "--recipe", "awq", "-o", tmp_path / "q.safetensors")
    assert code == 0, err
    w = t["conv1.weight"].astype(f32).reshape(32, 16 * 9)
    q, s, _ = F.group_quantize(w, 8, 16, symmetric=True, recipe="awq")
    with SafetensorsReader(str(tmp_path / "q.safetensors")) as r:
        assert np.array_equal(np.asarray(r["conv1.weight.qweight"]), q)
        assert np.array_equal(np.asarray(r["conv1.weight.scales"]), s)
        assert "conv1.weight.zero_points" not in r and "fc.weight" in r
    # groups of 16 int8 values + a float32 scale per group: 10 bits per weight, more
    # than BF16's 16? no: less; with groups of 2 they would grow, and a warning says so
    code, out, err = _quantize(capsys, tmp_path / "m.safetensors", "--tensors", "conv*",
                               "--group-size", "2", "--format", "int8",
                               "-o", tmp_path / "q2.safetensors")
    assert code == 0 and "warning: 1 tensor(s) did not get smaller" in " ".join(out.split())
    # a named tensor whose group does not fit is refused (awq has no short last group)
    code, out, err = _quantize(capsys, tmp_path / "m.safetensors", "--tensors", "head.*",
                               "--recipe", "awq", "-o", tmp_path / "q3.safetensors")
    assert code == 2 and "input dimension 200 is not a multiple of --group-size 128" in err


@pytest.mark.parametrize("argv, fragment", [
    (["--format", "fp8", "--group-size", "64"], "--group-size applies to --format int4 / int8"),
    (["--format", "mxfp4", "--recipe", "awq"], "--recipe applies to --format int4 / int8"),
    (["--format", "nvfp4", "--symmetric"], "--symmetric / --affine applies"),
    (["--recipe", "tinygemm", "--symmetric"], "asymmetric only"),
    (["--tensors", "nope*"], "--tensors: nothing matches nope*"),
    (["--tensors", "bn1.num*"], "is not a non-empty float tensor"),
])
def test_quantize_refuses_options_that_do_not_apply(tmp_path, capsys, argv, fragment):
    _cnn_checkpoint(tmp_path / "m.safetensors")
    code, out, err = _quantize(capsys, tmp_path / "m.safetensors", "-o",
                               tmp_path / "q.safetensors", *argv)
    assert code == 2 and fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "q.safetensors").exists()


@pytest.mark.parametrize("argv", [[], ["--symmetric"], ["--format", "int8", "--recipe",
                                                         "tinygemm", "--group-size", "16"],
                                  ["--recipe", "awq", "--symmetric", "--group-size", "8"],
                                  ["--format", "fp8"], ["--format", "mxfp4"],
                                  ["--format", "mxfp8"], ["--format", "nvfp4"]])
def test_quantize_output_loads_back_to_float(tmp_path, capsys, argv):
    """dequantize / load_dequantized give back every quantized tensor in its
    shape, equal bit for bit to the library's own dequantization (so the
    SQNR the quantize run printed is that of the file), the rest as stored."""
    from quantcore import formats as F
    from quantcore import mx
    from quantcore.checkpoints import SafetensorsReader
    from quantcore.cli_quantize import load_dequantized
    t = _cnn_checkpoint(tmp_path / "m.safetensors")
    code, out, err = _quantize(capsys, tmp_path / "m.safetensors", "--tensors", "conv*",
                               "fc.weight", "-o", tmp_path / "q.safetensors", *argv)
    assert code == 0, err
    assert main(["dequantize", str(tmp_path / "q.safetensors"), "-o",
                 str(tmp_path / "back.safetensors")]) == 0
    assert "2 dequantized to float32, 7 copied" in capsys.readouterr().out
    back = load_dequantized(str(tmp_path / "q.safetensors"))
    assert list(back) == list(t)
    with SafetensorsReader(str(tmp_path / "back.safetensors")) as r:
        assert list(r) == list(t) and r.metadata["origin"] == "test"
        for name in t:
            assert np.array_equal(np.asarray(r[name]).reshape(-1).view(np.uint8),
                                  np.asarray(back[name]).reshape(-1).view(np.uint8)), name
    fmt = argv[argv.index("--format") + 1] if "--format" in argv else "int4"
    for name in ("conv1.weight", "fc.weight", "fc.bias"):
        x = t[name].astype(f32)
        if name == "fc.bias":
            assert np.array_equal(back[name].view(np.uint8), t[name].view(np.uint8))
            continue
        m = x.reshape(x.shape[0], -1)
        if fmt == "fp8":
            codes, s = F.fp8_quantize(m, axis=0)
            want = F.fp8_dequantize(codes, s, axis=0)
        elif fmt == "nvfp4":
            want = mx.nvfp4_fake_quant(m)
        elif fmt.startswith("mx"):
            want = mx.mx_fake_quant(m, "e2m1" if fmt == "mxfp4" else "e4m3")
        else:
            bits = 4 if fmt == "int4" else 8
            g = int(argv[argv.index("--group-size") + 1]) if "--group-size" in argv else 128
            recipe = argv[argv.index("--recipe") + 1] if "--recipe" in argv else "onnx"
            want = F.group_fake_quant(m, bits, g, symmetric="--symmetric" in argv,
                                      recipe=recipe)
        got = back[name]
        assert got.shape == x.shape and got.dtype == f32
        assert np.array_equal(got.reshape(m.shape).view(np.uint32), want.view(np.uint32)), name
        row = [ln for ln in out.splitlines() if ln.startswith(name + " ")][0].split()
        assert float(row[4]) == pytest.approx(cli.sqnr_db(x, got), abs=0.006)


def test_quantize_quiet_keeps_the_summary(tmp_path, capsys):
    _cnn_checkpoint(tmp_path / "m.safetensors")
    code, out, _ = _quantize(capsys, tmp_path / "m.safetensors", "-q", "-o",
                             tmp_path / "q.safetensors")
    assert code == 0 and "SQNR dB" not in out and "bits per weight" in out
    assert main(["calibrate", str(tmp_path / "m.safetensors"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "SQNR dB" not in out and out.startswith("calibrated 8 tensor(s)")


def test_dequantize_refuses_other_files(tmp_path, capsys):
    _cnn_checkpoint(tmp_path / "m.safetensors")
    assert main(["dequantize", str(tmp_path / "m.safetensors"), "-o",
                 str(tmp_path / "b.safetensors")]) == 2
    assert "not written by 'quantcore quantize'" in capsys.readouterr().err


# ------------------------------------- calibrate and quantize: the same story
def _truncated(tmp_path):
    path = tmp_path / "cut.safetensors"
    save_tensors({"w": np.ones((8, 128), f32), "v": np.ones((4, 128), f32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    return path


@pytest.mark.parametrize("make, fragment", [
    (_truncated, "'v' lies outside the file"),
    (lambda p: (p / "d.safetensors").mkdir() or p / "d.safetensors", "is a directory"),
    (lambda p: p / "none.safetensors", "no such file"),
])
def test_calibrate_quantize_and_fake_quant_refuse_bad_inputs_alike(tmp_path, capsys, make,
                                                                     fragment):
    path = make(tmp_path)
    (tmp_path / "q.json").write_text("{}")
    for argv in (["calibrate", str(path)],
                 ["quantize", str(path), "-o", str(tmp_path / "q.safetensors")],
                 ["fake-quant", str(path), "--qparams", str(tmp_path / "q.json"), "-o",
                  str(tmp_path / "fq.safetensors")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1, (argv, err)


def test_tensors_globs_in_both_commands(tmp_path, capsys):
    _cnn_checkpoint(tmp_path / "m.safetensors")
    assert main(["calibrate", str(tmp_path / "m.safetensors"), "--tensors", "fc.*"]) == 0
    out = capsys.readouterr().out
    assert "fc.weight" in out and "fc.bias" in out and "conv1" not in out
    code, out, _ = _quantize(capsys, tmp_path / "m.safetensors", "--tensors", "fc.*", "-o",
                             tmp_path / "q.safetensors")
    assert code == 0 and "fc.weight " in out and "fc.bias " in out and "conv1" not in out
    for cmd in (["calibrate"], ["quantize", "-o", str(tmp_path / "x.safetensors")]):
        assert main(cmd + [str(tmp_path / "m.safetensors"), "--tensors", "zz*"]) == 2
        assert "--tensors: nothing matches zz*" in capsys.readouterr().err


def test_version_and_missing_extras(monkeypatch, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"quantcore-fakequant {qc.__version__}"
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    assert main(["demo", "--plot", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'quantcore-fakequant[demo]'" in err

    def needs_tqdm(args):
        raise ModuleNotFoundError("No module named 'tqdm'", name="tqdm")
    monkeypatch.setattr(cli_calibrate, "calibrate", needs_tqdm)
    assert main(["calibrate", "x.npy"]) == 2
    assert capsys.readouterr().err == ("quantcore: error: this needs the optional package tqdm: "
                                       "pip install 'quantcore-fakequant[cli]'\n")
    assert cli.missing_extra(ModuleNotFoundError("x", name="matplotlib")).endswith(
        "pip install 'quantcore-fakequant[cli]'")
    assert cli.missing_extra(ModuleNotFoundError("x", name="onnxruntime.quantization")) \
        .endswith("pip install 'quantcore-fakequant[onnx]'")


def test_quantize_tensors_matches_every_tensor_whatever_the_path_length(tmp_path, capsys,
                                                                        monkeypatch):
    """``quantize --tensors`` selects every matching tensor: the input path
    (here 13 characters, fewer than the 16 tensors) once stood where the
    list of aliases belongs, so tensors past its length were never matched."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    names = [f"conv{i}.weight" for i in range(1, 17)]
    save_tensors({n: rng.normal(size=(8, 4, 3, 3)).astype(np.float32) for n in names},
                 "c.safetensors")
    assert main(["quantize", "c.safetensors", "--format", "fp8", "--tensors", "conv*.weight",
                 "-o", "q.safetensors"]) == 0
    out = {e.name for e in list_tensors("q.safetensors")}
    assert all(f"{n}.qweight" in out for n in names), sorted(out)
    capsys.readouterr()
    assert main(["quantize", "c.safetensors", "--format", "fp8", "--tensors", "conv16.weight",
                 "-o", "q2.safetensors"]) == 0
    assert "conv16.weight.qweight" in {e.name for e in list_tensors("q2.safetensors")}
    with pytest.raises(TypeError, match="one alias per key"):
        cli_common.match_tensors(names, ["*"], "c.safetensors")


def test_quantize_says_when_most_bytes_are_copied(tmp_path, capsys):
    """A conv net's kernels (3+ dimensions) are copied by default: one
    headline line says how much of the file that is and which option
    quantizes them; BatchNorm statistics get no --tensors hint (it refuses
    their int64 counter)."""
    rng = np.random.default_rng(4)
    t = {f"conv{i}.weight": rng.normal(size=(16, 16, 3, 3)).astype(np.float32)
         for i in range(4)}
    t["fc.weight"] = rng.normal(size=(8, 32)).astype(np.float32)
    t["bn.running_mean"] = np.zeros(16, np.float32)
    t["bn.num_batches_tracked"] = np.array(3, np.int64)
    save_tensors(t, str(tmp_path / "conv.safetensors"))
    assert main(["quantize", str(tmp_path / "conv.safetensors"), "--format", "fp8",
                 "-o", str(tmp_path / "q.safetensors")]) == 0
    text = capsys.readouterr()
    text = (text.out + text.err).replace("\n    ", " ")   # the wrapped lines joined
    line = [ln for ln in text.splitlines() if "of the input's bytes were copied" in ln]
    assert len(line) == 1 and "convolution kernels" in line[0] and "--tensors" in line[0], text
    bn = [ln for ln in text.splitlines() if "BatchNorm" in ln]
    assert bn and all("--tensors quantizes" not in ln for ln in bn), text
    # a linear checkpoint: no such line
    save_tensors({"fc.weight": t["fc.weight"]}, str(tmp_path / "fc.safetensors"))
    assert main(["quantize", str(tmp_path / "fc.safetensors"), "--format", "fp8",
                 "-o", str(tmp_path / "q2.safetensors")]) == 0
    text = capsys.readouterr()
    assert "bytes were copied" not in text.out + text.err
