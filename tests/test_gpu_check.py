"""bench/gpu_check.py (``make gpu-check``): its dry run on the CUDA
emulator (every step but the test suite and the benchmarks, small), and
its report writer without a device."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import gpu_check  # noqa: E402


def test_report_lists_every_step():
    info = {"device": "NVIDIA H100 80GB HBM3", "CuPy": "13.6.0", "NVRTC": "12.9"}
    cold = (61.0, [["minmax.cu", "i32", "compiled", 20.0], ["lsq.cu", "i64", "compiled", 1.0]])
    warm = (1.5, [["minmax.cu", "i32", "loaded", 0.1], ["lsq.cu", "i64", "loaded", 0.0]])
    text = gpu_check.report(info, cold, warm, [("p1", True, ""), ("p2", False, "why")],
                            (100.0, 0, "1 passed"), None, "| table |", False)
    assert text.startswith("# quantcore GPU check: NVIDIA H100 80GB HBM3")
    for part in ("| CuPy | 13.6.0 |", "cold (empty cache): 61.0 s for 2 modules (compiled)",
                 "warm (cache filled): 1.5 s for 2 modules (loaded)", "- PASS: p1",
                 "- FAIL: p2 (why)", "exit status 0 after 100 s", "not run", "| table |"):
        assert part in text, part
    assert gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


@pytest.mark.gpu
def test_dry_run_on_the_emulator(tmp_path, capsys):
    pytest.importorskip("cupy")
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(reason)
    out = tmp_path / "gpu.md"
    rc = gpu_check.main(["--dry-run", "--out", str(out)])
    text = out.read_text()
    printed = capsys.readouterr().out
    assert rc == 0, text
    assert "**Dry run**" in text and "FAIL" not in text
    assert "cold (empty cache)" in text and "(compiled)" in text and "(loaded)" in text
    assert "streams:" in text and "subnormal:" in text and "NaN:" in text
    assert "compile: cold" in printed


def test_without_a_gpu_it_says_so_in_one_line():
    import importlib.util
    import subprocess
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is importable here")
    script = os.path.join(os.path.dirname(gpu_check.__file__), "gpu_check.py")
    proc = subprocess.run([sys.executable, script, "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpu-check: ")
    assert "Traceback" not in proc.stderr


def test_targets_are_ratios_to_the_copy_in_the_same_run():
    """The elementwise bandwidth target reads the largest size that has both
    quantcore's time and the copy's, and says PASS / MISS against 0.85."""
    def bench(op, n, impl, median):
        return {"extra_info": {"op": op, "size": n, "impl": impl}, "stats": {"median": median}}
    mi = 1 << 20
    data = {"benchmarks": [bench("gpu_fake_quant", mi, "quantcore-gpu", 9.0),
                           bench("gpu_fake_quant", mi, "cupy.copyto", 1.0),
                           bench("gpu_fake_quant", 256 * mi, "quantcore-gpu", 1.0),
                           bench("gpu_fake_quant", 256 * mi, "cupy.copyto", 0.9),
                           bench("gpu_fake_quant", 256 * mi, "torch-cuda", 0.1)]}
    (name, ratio, target, ok), = gpu_check.targets(data)
    assert "256 Mi" in name and ratio == pytest.approx(0.9) and target == 0.85 and ok
    data["benchmarks"][3]["stats"]["median"] = 0.5
    assert not gpu_check.targets(data)[0][3]
    assert gpu_check.targets({"benchmarks": []}) == []
    text = gpu_check.report({"device": "d"}, (1.0, []), (1.0, []), [], None, None, "", False,
                            gpu_check.targets(data))
    assert "- MISS: gpu_fake_quant at 256 Mi: fraction of copy bandwidth 0.50" in text
