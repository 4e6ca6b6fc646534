"""quantcore.compare: every cause on a tensor where only that convention
differs, the table's numbers against direct compat-layer computations, and
live torch / TensorFlow."""
import numpy as np
import pytest

from quantcore import compare as C
from quantcore import qparams as Q
from quantcore.compat import nvidia, onnxruntime as ort
from quantcore.compat import tensorflow as tfq
from quantcore.compat.torch import fake_quantize_per_tensor_affine

F32 = np.float32


def _normal(n=4096, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(F32)


def _ties():
    """amax 63.75: every symmetric 8-bit step is 63.75 / 127.5 = 0.5 exactly,
    so k / 4 (k odd) is a tie of x / scale."""
    return np.concatenate([[-63.75, 63.75], np.arange(-41, 43, 2) / 4]).astype(F32)


def _near_ties(seed=1):
    """Values within a few ulp of the ties of x / scale (scale = 3 / 127.5),
    where x * f32(1 / scale) and x / scale round differently."""
    s = F32(F32(3.0) / F32(127.5))
    k = np.arange(-120, 120) + 0.5
    base = (k * np.float64(s)).astype(F32)
    ulps = np.random.default_rng(seed).integers(-3, 4, base.size)
    near = np.nextafter(base, np.where(ulps > 0, np.inf, -np.inf).astype(F32))
    return np.concatenate([[-3.0, 3.0], base, near]).astype(F32)


def test_rounding_is_the_only_cause_and_flips_exactly_the_ties():
    x = _ties()
    r = C.compare(x, ["horizon", "horizon_even"], reference="horizon")
    row = r.row("horizon_even")
    assert row.causes == ("rounding",)
    assert row.step == 0.5 == r.row("horizon").step
    t = x.astype(np.float64) / 0.5
    up, even = np.clip(np.floor(t + 0.5), -128, 127), np.clip(np.rint(t), -128, 127)
    assert np.array_equal(r.row("horizon").q, up) and np.array_equal(row.q, even)
    assert row.mismatch == np.mean(up != even) > 0.4 and row.max_code_diff == 1


def test_apply_scale_is_the_only_cause_multiply_by_reciprocal_vs_divide():
    x = _near_ties()
    r = C.compare(x, ["torch_symmetric", "horizon_even"], reference="torch_symmetric")
    row = r.row("horizon_even")
    assert row.causes == ("apply_scale",)
    s = F32(r.row("torch_symmetric").step)
    assert s == F32(row.step) == F32(F32(3.0) / F32(127.5))
    mul = np.clip(np.rint(x * (F32(1) / s)), -128, 127)      # float32 arithmetic
    div = np.clip(np.rint(x / s), -128, 127)
    assert np.array_equal(r.row("torch_symmetric").q, mul) and np.array_equal(row.q, div)
    assert (mul != div).any() and row.mismatch == np.mean(mul != div)


def test_int_range_is_the_only_cause_tf_narrow_range():
    x = _normal()
    r = C.compare(x, ["tf", "tf_narrow"], reference="tf")
    row = r.row("tf_narrow")
    assert row.causes == ("int_range",)
    assert row.step > r.row("tf").step and row.mismatch > 0.05
    assert row.q.min() >= 1


def test_dequantize_is_the_only_cause_tf_vs_mindspore():
    x = _normal()
    r = C.compare(x, ["tf", "mindspore"], reference="tf")
    row = r.row("mindspore")
    assert row.causes == ("dequantize",)
    assert row.mismatch == 0 and row.max_code_diff == 0       # the same codes ...
    assert 0 < row.max_abs_diff < 1e-5                        # ... other float outputs


def test_scale_formula_is_the_only_cause_oneflow_vs_horizon():
    x = _normal()
    r = C.compare(x, ["horizon_even", "oneflow_symmetric"], reference="horizon_even")
    row = r.row("oneflow_symmetric")
    assert row.causes == ("scale_formula",)
    amax = F32(max(-x.min(), x.max()))
    assert F32(row.step) == F32(amax / F32(127))
    assert F32(r.row("horizon_even").step) == F32(amax / F32(127.5))
    assert row.mismatch > 0


def test_scale_arithmetic_is_the_only_cause_and_can_have_no_effect():
    # m / 127 in float64 then float32 is m / 127 correctly rounded: no effect
    x = _normal()
    r = C.compare(x, ["horizon_even_narrow", "ort_int8_symmetric"],
                  reference="horizon_even_narrow")
    row = r.row("ort_int8_symmetric")
    assert row.causes == ("scale_arithmetic",)
    assert row.mismatch == 0 and row.max_abs_diff == 0
    assert "causes of ort_int8_symmetric: scale_arithmetic (no effect here)" in C.table(r)[2]


def test_scale_arithmetic_changes_the_affine_scale():
    # ORT subtracts max - min in float64, torch in float32
    lo, hi = F32(-5.4408135), F32(9.351374)
    x = np.linspace(lo, hi, 1001).astype(F32)
    x[0], x[-1] = lo, hi
    r = C.compare(x, ["torch_affine", "ort_uint8"])
    row = r.row("ort_uint8")
    assert row.causes == ("scale_arithmetic", "apply_scale")
    assert row.step == float(F32((np.float64(hi) - np.float64(lo)) / 255))
    assert r.row("torch_affine").step == float(F32(F32(hi - lo) / F32(255)))
    assert row.step != r.row("torch_affine").step


def test_zero_in_range_all_positive_tensor():
    x = (np.abs(_normal()) + F32(1.0)).astype(F32)
    r = C.compare(x, ["torch_affine", "oneflow_affine"])
    row = r.row("oneflow_affine")
    assert row.causes == ("zero_in_range", "apply_scale", "zero_point_add")
    assert r.row("torch_affine").zero_point == 0 and row.zero_point < 0
    assert row.step < r.row("torch_affine").step and row.mismatch > 0.9


ROUNDING = {"half_even": np.rint, "half_up": lambda t: np.floor(t + 0.5),
            "half_away": lambda t: np.sign(t) * np.floor(np.abs(t) + 0.5)}


def test_declared_rounding_and_range_are_the_behaviour():
    # a range of +-63.75 or +-63.5 gives every recipe a step of exactly 0.5: each
    # x = k / 4 (k odd) is then a tie, rounded as the recipe declares
    checked = []
    for name, recipe in C.RECIPES.items():
        for amax in (63.75, 63.5):
            k = np.arange(-255, 256, 2)
            x = np.concatenate([[-amax, amax], k[np.abs(k) < 4 * amax] / 4]).astype(F32)
            row = C.compare(x, [name], reference=name).row(name)
            if row.step == 0.5:
                break
        else:
            continue
        qmin, qmax = recipe.conventions["int_range"]
        expect = ROUNDING[recipe.conventions["rounding"]](x / 0.5) + row.zero_point
        assert np.array_equal(row.q, np.clip(expect, qmin, qmax)), name
        checked.append(name)
    assert len(checked) == len(C.RECIPES), sorted(set(C.RECIPES) - set(checked))


def test_declared_zero_in_range_is_the_behaviour():
    # min 1, max 3: a widened range gives a step of 3 / n, an unwidened one 2 / n
    x = np.linspace(1, 3, 101).astype(F32)
    checked = 0
    for name, recipe in C.RECIPES.items():
        widened = recipe.conventions["zero_in_range"]
        if widened is None:
            continue
        qmin, qmax = recipe.conventions["int_range"]
        step = C.compare(x, [name], reference=name).row(name).step
        # (the declaration's meaning, not bits: the recipes' arithmetic differs)
        assert step == pytest.approx((3.0 if widened else 2.0) / (qmax - qmin), rel=1e-6), name
        checked += 1
    assert checked == 6


def test_causes_are_the_declared_fields_that_differ():
    for a in C.RECIPES:
        for b in C.RECIPES:
            ca, cb = C.RECIPES[a].conventions, C.RECIPES[b].conventions
            expect = tuple(f for f in C.FIELDS if None not in (ca[f], cb[f]) and ca[f] != cb[f])
            assert C.causes(a, b) == expect == C.causes(b, a)
        assert C.causes(a, a) == ()
    assert C.causes("tf", "oneflow_affine") == (
        "zero_point", "zero_point_rounding", "rounding", "apply_scale", "clamp")


def test_numbers_against_the_compat_layers():
    x = _normal(5000, seed=3)
    lo, hi = F32(x.min()), F32(x.max())
    r = C.compare(x, C.RECIPES, reference="torch_affine")
    assert r.min == lo and r.max == hi
    # torch affine: the observer's formula, the functional op
    scale, zp = Q.affine_qparams(np.array([lo]), np.array([hi]), 0, 255)
    y_torch = fake_quantize_per_tensor_affine(x, float(scale[0]), int(zp[0]), 0, 255)
    q_torch = np.rint(y_torch.astype(np.float64) / float(scale[0])) + int(zp[0])
    assert np.array_equal(r.row("torch_affine").y, y_torch)
    # TF, NVIDIA, ORT directly
    assert np.array_equal(r.row("tf").y, tfq.fake_quant_with_min_max_vars(x, lo, hi))
    amax = F32(max(-lo, hi))
    q_nv, _ = nvidia.tensor_quant(x, amax)
    assert np.array_equal(r.row("nvidia").q, q_nv)
    assert np.array_equal(r.row("nvidia").y, nvidia.fake_tensor_quant(x, amax))
    qmin, qmax = ort.get_qmin_qmax_for_qType(ort.QuantType.QUInt8)
    zp_o, s_o = ort.compute_scale_zp(lo, hi, qmin, qmax)
    q_o = ort.quantize_linear(x, s_o, zp_o)
    assert np.array_equal(r.row("ort_uint8").q, q_o)
    assert np.array_equal(r.row("ort_uint8").y, ort.dequantize_linear(q_o, s_o, zp_o))
    for row in r.rows:
        d = np.abs(row.q - q_torch)
        assert row.mismatch == np.mean(d != 0) and row.max_code_diff == d.max()
        assert row.max_abs_diff == np.abs(row.y.astype(np.float64) - y_torch).max()
        err = np.sum((x.astype(np.float64) - row.y) ** 2)
        assert row.sqnr_db == 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / err)
        # every code is the recipe's own integer in its range
        assert C.RECIPES[row.name].conventions["int_range"][0] <= row.q.min()
        assert row.q.max() <= C.RECIPES[row.name].conventions["int_range"][1]
        assert np.array_equal(row.y, (row.q - row.zero_point) * row.step) or \
            np.abs(row.y - (row.q - row.zero_point) * row.step).max() < 1e-6


def test_keep_arrays_false_gives_the_same_numbers():
    x = _normal(3000, seed=4)
    kept, lean = C.compare(x, C.RECIPES), C.compare(x, C.RECIPES, keep_arrays=False)
    for a, b in zip(kept.rows, lean.rows):
        assert b.q is None and b.y is None
        assert (a.name, a.step, a.zero_point, a.mismatch, a.max_code_diff, a.max_abs_diff,
                a.sqnr_db, a.causes) == (b.name, b.step, b.zero_point, b.mismatch,
                                         b.max_code_diff, b.max_abs_diff, b.sqnr_db, b.causes)


def test_live_torch_and_tensorflow():
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    x = np.concatenate([_normal(2000, seed=5), _ties() / 20]).astype(F32)
    r = C.compare(x, C.DEFAULT)
    t = torch.from_numpy(x)
    for name, dtype, qscheme, qmin, qmax in (
            ("torch_affine", torch.quint8, torch.per_tensor_affine, 0, 255),
            ("torch_symmetric", torch.qint8, torch.per_tensor_symmetric, -128, 127)):
        obs = torch.ao.quantization.MinMaxObserver(dtype=dtype, qscheme=qscheme)
        obs(t)
        s, z = obs.calculate_qparams()
        assert r.row(name).step == float(s) and r.row(name).zero_point == int(z)
        y = torch.fake_quantize_per_tensor_affine(t, float(s), int(z), qmin, qmax).numpy()
        assert np.array_equal(r.row(name).y, y)
    for name, narrow in (("tf", False), ("tf_narrow", True)):
        y = tf.quantization.fake_quant_with_min_max_vars(
            tf.constant(x), tf.constant(x.min()), tf.constant(x.max()), num_bits=8,
            narrow_range=narrow).numpy()
        assert np.array_equal(r.row(name).y, y)


def test_min_equal_max_gives_rows_without_result():
    x = np.full(5, 1.5, F32)
    r = C.compare(x, C.DEFAULT)
    for name in ("tf", "tf_narrow", "mindspore", "oneflow_affine"):
        row = r.row(name)
        assert row.undefined and row.q is None and np.isnan(row.mismatch)
        assert f"{name}: no result here: " in "\n".join(C.table(r)[2])
    assert "max_init" in r.row("mindspore").undefined    # MindSpore's own refusal
    for name in ("torch_affine", "nvidia", "ort_uint8"):
        assert r.row(name).undefined is None and np.array_equal(r.row(name).y, x)
    with pytest.raises(C.Undefined, match="reference: recipe tf has no result"):
        C.compare(x, reference="tf")


def test_bad_input():
    with pytest.raises(TypeError, match="x: expected a float32"):
        C.compare(np.zeros(3))
    with pytest.raises(ValueError, match="x: expected at least one"):
        C.compare(np.zeros(0, F32))
    with pytest.raises(ValueError, match="x: expected finite"):
        C.compare(np.array([1, np.nan], F32))
    with pytest.raises(ValueError, match="recipe: unknown recipe 'jax'"):
        C.compare(_normal(), ["torch_affine", "jax"])
    with pytest.raises(ValueError, match="recipes: expected at least one"):
        C.compare(_normal(), [])


def test_cli(tmp_path, capsys):
    from quantcore.cli import main
    path = tmp_path / "t.npz"
    np.savez(path, w=_ties(), n=np.arange(3), bad=np.array([np.inf], F32),
             flat=np.zeros(4, F32))
    assert main(["compare", str(path), "--recipes", "horizon", "horizon_even",
                 "--reference", "horizon"]) == 0
    out = capsys.readouterr().out
    assert "horizon_even" in out and "causes of horizon_even: rounding\n" in out
    assert "n: skipped (dtype int64" in out and "bad: skipped (holds NaN or inf" in out
    assert main(["compare", str(path), "--tensors", "flat", "--reference", "tf"]) == 2
    captured = capsys.readouterr()
    assert "flat: skipped (reference: recipe tf has no result" in captured.out
    assert "no tensor could be compared" in captured.err
    np.save(tmp_path / "i.npy", np.arange(4))
    for argv, msg in ((["compare", str(tmp_path / "i.npy")], "no tensor could be compared"),
                      (["compare", str(tmp_path / "no.npz")], "no such file"),
                      (["compare", str(path), "--recipes", "jax"], "invalid choice")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


def test_cli_summarises_many_tensors_and_reports_progress(tmp_path, capsys, monkeypatch):
    """Above TABLES_MAX tensors: one summary line per tensor (a real model's
    activations made 13,463 lines), every table with --tables; a run past
    PROGRESS_AFTER_S says how far it is on stderr."""
    from quantcore import cli_compare
    from quantcore.cli import main
    path = tmp_path / "many.npz"
    np.savez(path, **{f"t{i}": _normal(256, seed=i) for i in range(cli_compare.TABLES_MAX + 1)})
    assert main(["compare", str(path), "--recipes", "tf", "--reference", "torch_affine"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "  shape [" not in out.out and len(lines) == cli_compare.TABLES_MAX + 4, out.out
    assert lines[0].startswith(f"{cli_compare.TABLES_MAX + 1} tensors against torch_affine")
    row = [ln for ln in lines if ln.startswith("t3 ")][0].split()
    r = C.compare(_normal(256, seed=3), ["tf"], "torch_affine")
    same = sum(x.mismatch == 0 for x in r.rows if not x.undefined)
    assert row[1:5] == ["256", str(same), "/", str(len(r.rows))], row
    assert out.err == ""                                       # a short run: no progress
    monkeypatch.setattr(cli_compare, "PROGRESS_AFTER_S", -1.0)
    assert main(["compare", str(path), "--tables", "--recipes", "tf"]) == 0
    out = capsys.readouterr()
    assert out.out.count("  shape [256]") == cli_compare.TABLES_MAX + 1
    assert out.err.startswith("compare: 0 / 9 tensors")


def test_cli_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from quantcore.cli import main
    path = tmp_path / "t.npz"
    np.savez(path, a=_normal(500), b=_ties())
    png = tmp_path / "m.png"
    assert main(["compare", str(path), "--plot", str(png), "--recipes", "tf", "nvidia"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in capsys.readouterr().out
    # the detail panels: the tensor whose codes flip (b: the ties), again with arrays
    from quantcore.cli_compare import _details
    done = [(n, C.compare(x, ["horizon", "horizon_even"], "horizon"), lambda x=x: x)
            for n, x in (("a", _normal(500)), ("b", _ties()))]
    ((name, x, c),) = [d for d in _details(done, None) if d[0] == "b"]
    assert c.row("horizon_even").q is not None and np.array_equal(x, _ties())
    assert main(["compare", str(path), "--plot", str(png), "--recipes", "horizon_even",
                 "--reference", "horizon"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(path), "--plot", str(tmp_path / "no" / "m.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _tiny_model(path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(7).standard_normal((8, 4)).astype(F32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w


def test_onnx_model_weights_and_activations(tmp_path, capsys):
    ort_rt = pytest.importorskip("onnxruntime")
    model = tmp_path / "tiny.onnx"
    w = _tiny_model(model)
    x = _normal(64 * 8, seed=9).reshape(64, 8)
    tensors = dict(C.model_tensors(model, {"x": x}))
    assert sorted(tensors) == ["h", "w", "x", "y"]
    assert np.array_equal(tensors["w"], w) and np.array_equal(tensors["x"], x)
    y = ort_rt.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    assert np.array_equal(tensors["y"], y)
    np.savez(tmp_path / "data.npz", x=x)
    from quantcore.cli import main
    assert main(["compare", str(model), "--data", str(tmp_path / "data.npz"),
                 "--recipes", "tf", "ort_uint8"]) == 0
    out = capsys.readouterr().out
    for name in ("w", "x", "h", "y"):
        assert f"\n{name}  shape " in "\n" + out
    r = C.compare(y, ["tf", "ort_uint8"])
    assert f"{100 * r.row('tf').mismatch:.2f}%" in out.split("\ny  shape")[1]
    np.savez(tmp_path / "bad.npz", z=x)
    for argv, msg in ((["compare", str(model)], "needs --data"),
                      (["compare", str(model), "--data", str(tmp_path / "bad.npz")],
                       "no array for the model input(s) x"),
                      (["compare", str(tmp_path / "bad.npz"), "--data", str(model)],
                       "--data: only with an .onnx FILE")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


def test_onnx_accuracy_through_qdq(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    model = tmp_path / "tiny.onnx"
    w = _tiny_model(model)
    x = _normal(200 * 8, seed=11).reshape(200, 8)
    labels = np.argmax(np.maximum(x @ w, 0), axis=-1)
    acc = C.qdq_accuracy(model, {"x": x}, labels, ["ort_uint8", "torch_symmetric"])
    assert acc["float"] == 1.0
    # ort_uint8 by hand: QDQ of x, w and h, each with ORT's qparams of its float values
    def qdq(a, stats):
        qmin, qmax = ort.get_qmin_qmax_for_qType(ort.QuantType.QUInt8)
        zp, s = ort.compute_scale_zp(F32(stats.min()), F32(stats.max()), qmin, qmax)
        return ort.dequantize_linear(ort.quantize_linear(a, s, zp), s, zp)
    h = qdq(x, x) @ qdq(w, w)     # (float32 matmul: ORT's and numpy's sum orders may differ)
    y = np.maximum(qdq(h.astype(F32), x @ w), 0)
    expect = float(np.mean(np.argmax(y, axis=-1) == labels))
    # (one label of slack: a near-tie of the logits may go either way between sum orders)
    assert abs(acc["ort_uint8"][0] - expect) <= 1 / 200 and acc["ort_uint8"][1] == []
    assert acc["ort_uint8"][0] < 1.0
    assert 0.5 < acc["torch_symmetric"][0] <= 1.0
    np.savez(tmp_path / "data.npz", x=x, labels=labels)
    from quantcore.cli import main
    assert main(["compare", str(model), "--data", str(tmp_path / "data.npz"),
                 "--recipes", "ort_uint8", "torch_symmetric"]) == 0
    out = capsys.readouterr().out
    assert "accuracy on --data (200 labels)" in out and "float 100.00%" in out
    assert f"ort_uint8{' ' * 12}{100 * acc['ort_uint8'][0]:6.2f}%" in out
