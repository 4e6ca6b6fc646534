"""bench/track.py (make bench-check / bench-history) on synthetic runs: the
ratio machinery, the comparison and its tolerance, the best-of-reruns
merge, the check's exit codes, the history table and plot, the reference
files and the CPU kind names.  No time is measured or asserted here."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import track  # noqa: E402

AMD = {"brand_raw": "AMD EPYC", "count": 2, "flags": ["sse4_2", "avx2", "avx512f", "fma"]}


def bench(op, size, impl, median, test="test_x"):
    return {"fullname": f"bench/test_bench_ops.py::{test}[{impl}-{op}-{size}]",
            "extra_info": {"op": op, "size": size, "impl": impl, "bytes": 8 * size},
            "stats": {"median": median, "mean": median, "min": median}}


def run(times, commit="a" * 40, when="2026-11-27T10:00:00", cpu=AMD, variant="x86-64-v3",
        threads=2, dirty=False):
    """A pytest-benchmark-like run: ``times`` maps (op, size, impl) to a
    median; the quantcore block as bench/conftest.py writes it."""
    return {"datetime": when,
            "commit_info": {"id": commit, "dirty": dirty},
            "machine_info": {"cpu": cpu, "quantcore": {
                "cpu_kind": track.cpu_kind(cpu["brand_raw"], cpu["flags"], cpu["count"]),
                "cpu_brand": cpu["brand_raw"], "simd_variant": variant, "threads": threads,
                "commit": commit}},
            "benchmarks": [bench(op, size, impl, t) for (op, size, impl), t in times.items()]}


BASE = {("fake_quant", 1024, "np.copyto"): 1e-6, ("fake_quant", 1024, "quantcore-all"): 4e-6,
        ("fake_quant", 1024, "torch"): 8e-6, ("minmax", 1 << 20, "np.copyto"): 100e-6,
        ("minmax", 1 << 20, "quantcore-1t"): 50e-6}


def with_times(**changes):
    """BASE with some medians multiplied: key 'op__size__impl' -> factor."""
    times = dict(BASE)
    for name, factor in changes.items():
        op, size, impl = name.split("__")
        impl = "np.copyto" if impl == "np_copyto" else impl.replace("_", "-")
        key = (op, int(size), impl)
        times[key] = times[key] * factor
    return times


def status(rows, op, impl):
    return next(r[6] for r in rows if r[0] == op and r[2] == impl)


# ------------------------------------------------------------- CPU kinds
@pytest.mark.parametrize("brand, flags, cores, kind", [
    ("AMD EPYC", ["avx2", "avx512f"], 2, "amd-epyc-avx512-2c"),
    ("Intel(R) Xeon(R) Processor", ["avx2", "avx512f"], 2, "intel-xeon-avx512-2c"),
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", ["sse4_2", "avx2"], 6,
     "intel-core-i7-8700-avx2-6c"),
    ("AMD Ryzen 9 7950X 16-Core Processor", ["avx2", "avx512f"], 32,
     "amd-ryzen-9-7950x-avx512-32c"),
    ("", ["sse2"], 1, "unknown-cpu-baseline-1c"),
    ("Neoverse-N1", ["fp", "asimd"], 4, "neoverse-n1-neon-4c"),
])
def test_cpu_kind_names(brand, flags, cores, kind):
    assert track.cpu_kind(brand, flags, cores) == kind


def test_run_info_of_an_old_run_derives_the_kind():
    doc = run(BASE)
    del doc["machine_info"]["quantcore"]
    info = track.run_info(doc)
    assert info["cpu_kind"] == "amd-epyc-avx512-2c" and info["simd_variant"] is None


def test_quantcore_info_names_the_variant_in_use_and_the_threads():
    import quantcore as qc
    from quantcore._cpu import _kernels
    info = track.quantcore_info({"cpu": AMD}, {"id": "c" * 40, "dirty": False})
    assert info["simd_variant"] == _kernels.simd_variant()
    assert info["threads"] == qc.get_num_threads()
    assert info["cpu_kind"] == "amd-epyc-avx512-2c" and info["commit"] == "c" * 40
    assert "avx512f" in info["cpu_simd_flags"] and info["cpu_simd"] == "avx512"


# ----------------------------------------------------------------- ratios
def test_ratios_are_over_the_copy_of_the_same_group():
    r = track.ratios(run(BASE))
    assert r[("fake_quant", 1024, "quantcore-all")][0] == pytest.approx(4.0)
    assert r[("minmax", 1 << 20, "quantcore-1t")][0] == pytest.approx(0.5)
    assert not any(k[2] == "np.copyto" for k in r)


def test_the_copies_of_one_size_are_pooled_by_their_median():
    times = dict(BASE)
    times[("minmax", 1024, "np.copyto")] = 1.2e-6
    times[("backward", 1024, "np.copyto")] = 3e-6
    times[("compat_torch_x", 1024, "compat")] = 6e-6  # a group without its own copy
    doc = run(times)
    size, (roof, names) = 1024, track.rooflines(doc)[1024]
    assert roof == pytest.approx(1.2e-6) and len(names) == 3
    r = track.ratios(doc)
    assert r[("fake_quant", size, "quantcore-all")][0] == pytest.approx(4 / 1.2)
    assert r[("compat_torch_x", size, "compat")][0] == pytest.approx(5.0)


def test_sizes_without_a_roofline_have_no_ratio():
    doc = run({("compat_x", 1024, "compat"): 5e-6, ("compat_x", 1024, "core"): 4e-6})
    for info in ({"op": "ort_calibration", "size": 1024, "impl": "quantcore"},
                 {"op": "ort_peak_memory", "method": "MinMax"}):  # (as test_bench_ort)
        doc["benchmarks"].append({"fullname": "ort", "extra_info": info,
                                  "stats": {"median": 1.0}})
    assert track.ratios(doc) == {}


def test_gpu_runs_use_cupy_copyto():
    doc = run({("fake_quant", 1024, "cupy.copyto"): 2e-6,
               ("fake_quant", 1024, "quantcore-gpu"): 3e-6})
    assert track.ratios(doc)[("fake_quant", 1024, "quantcore-gpu")][0] == pytest.approx(1.5)


# ------------------------------------------------------------- comparison
def test_identical_runs_and_a_slower_machine_pass():
    ref = run(BASE)
    slower = run({k: 3 * t for k, t in BASE.items()})  # every time x3: the ratios stay
    for new in (run(BASE), slower):
        rows = track.compare(ref, new)
        assert track.regressions(rows) == []
        assert {r[6] for r in rows} == {"ok"}


def test_more_than_the_tolerance_worse_is_a_regression():
    rows = track.compare(run(BASE), run(with_times(fake_quant__1024__quantcore_all=1.11)))
    assert status(rows, "fake_quant", "quantcore-all") == "REGRESSION"
    (row,) = track.regressions(rows)
    assert row[5] == pytest.approx(0.11)
    table = track.moved_table(rows)
    assert "| fake_quant | 1Ki | quantcore-all | 4.000 | 4.440 | +11.0% | REGRESSION |" in table


def test_within_the_tolerance_passes_and_the_tolerance_is_a_parameter():
    new = run(with_times(fake_quant__1024__quantcore_all=1.09))
    assert track.regressions(track.compare(run(BASE), new)) == []
    assert len(track.regressions(track.compare(run(BASE), new, tolerance=0.05))) == 1


def test_a_slower_copy_is_not_a_faster_quantcore():
    # the copy 20% slower, quantcore the same: its ratio improves (faster)
    rows = track.compare(run(BASE), run(with_times(fake_quant__1024__np_copyto=1.2)))
    assert status(rows, "fake_quant", "quantcore-all") == "faster"
    # quantcore and the copy both 20% slower: unchanged
    rows = track.compare(run(BASE), run(with_times(fake_quant__1024__np_copyto=1.2,
                                                   fake_quant__1024__quantcore_all=1.2)))
    assert status(rows, "fake_quant", "quantcore-all") == "ok"


def test_other_implementations_moving_do_not_fail():
    rows = track.compare(run(BASE), run(with_times(fake_quant__1024__torch=2.0)))
    assert status(rows, "fake_quant", "torch") == "slower"
    assert track.regressions(rows) == []


def _with_numpy(times):
    """``times`` with a NumPy row at 1 Ki (two other implementations there:
    enough to see the copy yardstick move)."""
    out = dict(times)
    out.setdefault(("fake_quant", 1024, "numpy"), 6e-6)
    return out


def test_a_yardstick_that_moved_for_everyone_is_not_a_regression():
    # the 1 Ki copy 15% faster in the new run: NumPy's, torch's and
    # quantcore's ratios all +17.6%; relative to the others quantcore is level
    ref = run(_with_numpy(BASE))
    new = run(_with_numpy({k: t / 1.15 if k == ("fake_quant", 1024, "np.copyto") else t
                           for k, t in BASE.items()}))
    rows = track.compare(ref, new)
    assert status(rows, "fake_quant", "quantcore-all") == "ok"
    assert status(rows, "fake_quant", "torch") == "ok"
    assert track.regressions(rows) == []
    assert "copy yardstick of 1Ki moved by -13.0%" in track.report(ref, new, rows)
    # quantcore alone 20% slower on top of it: still a regression, by 20%
    new_times = _with_numpy({k: t / 1.15 if k == ("fake_quant", 1024, "np.copyto") else t
                             for k, t in BASE.items()})
    new_times[("fake_quant", 1024, "quantcore-all")] *= 1.2
    rows = track.compare(ref, run(new_times))
    (row,) = track.regressions(rows)
    assert row[2] == "quantcore-all" and row[5] == pytest.approx(0.2)


def test_one_other_implementation_does_not_move_the_yardstick():
    rows = track.compare(run(BASE), run(with_times(fake_quant__1024__torch=1.3,
                                                   fake_quant__1024__quantcore_all=1.3)))
    assert status(rows, "fake_quant", "quantcore-all") == "REGRESSION"


def test_all_threads_worse_with_one_thread_level_is_parallel_not_a_failure():
    times = dict(BASE)
    times[("minmax", 1 << 20, "quantcore-all")] = 30e-6
    ref = run(times)
    slow_all = dict(times)
    slow_all[("minmax", 1 << 20, "quantcore-all")] = 45e-6      # the second core was busy
    rows = track.compare(ref, run(slow_all))
    assert status(rows, "minmax", "quantcore-all") == "parallel"
    assert track.regressions(rows) == []
    assert "| parallel |" in track.moved_table(rows)
    both = dict(slow_all)
    both[("minmax", 1 << 20, "quantcore-1t")] = 60e-6           # the kernel itself slower
    rows = track.compare(ref, run(both))
    assert {r[2] for r in track.regressions(rows)} == {"quantcore-1t", "quantcore-all"}


def test_new_and_missing_benchmarks_are_listed_not_failed():
    new = dict(BASE)
    del new[("minmax", 1 << 20, "quantcore-1t")]
    new[("backward", 1024, "np.copyto")] = 1e-6
    new[("backward", 1024, "quantcore-all")] = 2e-6
    rows = track.compare(run(BASE), run(new))
    assert status(rows, "minmax", "quantcore-1t") == "missing"
    assert status(rows, "backward", "quantcore-all") == "new"
    assert track.regressions(rows) == []


def test_report_warns_when_the_conditions_differ():
    ref, new = run(BASE), run(BASE, variant="baseline", threads=1)
    text = track.report(ref, new, track.compare(ref, new))
    assert "WARNING: simd_variant: reference 'x86-64-v3', this run 'baseline'" in text
    assert "WARNING: threads" in text and "load average" not in text.split("\n", 2)[2]
    new["machine_info"]["quantcore"].update(loadavg=[9.5, 9.0, 8.0], cpu_count=2)
    assert "WARNING: this run: load average 9.5 on 2 cores" in \
        track.report(ref, new, track.compare(ref, new))
    assert "nothing moved" in text


SLOW_FQ = with_times(fake_quant__1024__quantcore_all=1.5)


def test_merge_attempts_takes_each_ratios_lower_median():
    ref = run(BASE)
    first = run(with_times(fake_quant__1024__quantcore_all=1.5, minmax__1048576__quantcore_1t=1.5))
    # the re-runs: only the two moved benchmarks with their rooflines; fake_quant
    # is back to normal (on a 2x slower machine), minmax still 50% worse
    rerun = run({("fake_quant", 1024, "np.copyto"): 2e-6,
                 ("fake_quant", 1024, "quantcore-all"): 8e-6,
                 ("minmax", 1 << 20, "np.copyto"): 100e-6,
                 ("minmax", 1 << 20, "quantcore-1t"): 76e-6})
    rows = track.compare(ref, track.merge_attempts([first, rerun, rerun]))
    assert status(rows, "fake_quant", "quantcore-all") == "ok"
    assert status(rows, "minmax", "quantcore-1t") == "REGRESSION"
    assert status(rows, "fake_quant", "torch") == "ok"  # (only in the first attempt)
    # slow in two attempts of three: still a regression, whichever two
    for attempts in ([first, first, rerun], [first, rerun, first]):
        rows = track.compare(ref, track.merge_attempts(attempts))
        assert status(rows, "fake_quant", "quantcore-all") == "REGRESSION"


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_compare_command_exit_codes(tmp_path, capsys):
    ref = write(tmp_path, "ref.json", run(BASE))
    same = write(tmp_path, "same.json", run(BASE))
    worse = write(tmp_path, "worse.json", run(with_times(minmax__1048576__quantcore_1t=1.3)))
    assert track.main(["compare", ref, same]) == 0
    assert track.main(["compare", ref, worse]) == 1
    assert "| minmax | 1Mi | quantcore-1t | 0.500 | 0.650 | +30.0% | REGRESSION |" in \
        capsys.readouterr().out


@pytest.fixture
def fake_runs(monkeypatch, tmp_path):
    """bench-check with the benchmark runs replaced: each call of
    run_pytest writes the next of the queued documents and records its
    arguments."""
    queue, calls = [], []

    def fake(args, json_path, save=None):
        calls.append((list(args), save))
        with open(json_path, "w") as fh:
            json.dump(queue.pop(0), fh)
    monkeypatch.setattr(track, "run_pytest", fake)
    return queue, calls


def test_check_reruns_what_moved_and_passes_when_it_recovers(fake_runs, tmp_path):
    queue, calls = fake_runs
    ref = write(tmp_path, "ref.json", run(BASE))
    queue += [run(SLOW_FQ), run(BASE), run(BASE)]
    assert track.main(["check", "--ref", ref, "--storage", str(tmp_path / "runs")]) == 0
    assert calls[0] == ([], str(tmp_path / "runs"))  # the full run is saved
    assert len(calls) == 3
    rerun_ids, save = calls[1]
    assert save is None and sorted(rerun_ids) == sorted(
        [bench("fake_quant", 1024, "quantcore-all", 0)["fullname"],
         bench("fake_quant", 1024, "np.copyto", 0)["fullname"]])


@pytest.mark.parametrize("attempts", [(SLOW_FQ, SLOW_FQ, BASE), (SLOW_FQ, BASE, SLOW_FQ)])
def test_check_fails_when_two_attempts_of_three_are_slow(fake_runs, tmp_path, capsys, attempts):
    queue, calls = fake_runs
    ref = write(tmp_path, "ref.json", run(BASE))
    queue += [run(t) for t in attempts]
    assert track.main(["check", "--ref", ref]) == 1
    assert len(calls) == 3
    out = capsys.readouterr().out
    assert "FAILED: 1 ratio(s) more than 10% worse" in out and "+50.0% | REGRESSION" in out


def test_check_without_reruns_decides_on_the_first_run(fake_runs, tmp_path):
    queue, calls = fake_runs
    ref = write(tmp_path, "ref.json", run(BASE))
    queue.append(run(SLOW_FQ))
    assert track.main(["check", "--ref", ref, "--reruns", "0"]) == 1
    queue.append(run(BASE))
    assert track.main(["check", "--ref", ref, "--reruns", "0"]) == 0
    assert len(calls) == 2


def test_check_without_a_reference_of_this_kind(fake_runs, tmp_path, capsys):
    """No reference for the CPU kind bench-check runs on: it says so, and how
    to record one, before running the suite (which takes minutes)."""
    queue, calls = fake_runs
    queue.append(run(BASE))
    here = track.quantcore_info()["cpu_kind"]
    assert track.main(["check", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"no reference for this CPU kind ({here})" in err and "make bench-reference" in err
    assert calls == []
    # a reference of this machine's kind, but the run names the CPU otherwise
    # (amd-epyc-avx512-2c) and there is none of that kind: said after the run
    if here != "amd-epyc-avx512-2c":
        write(tmp_path, f"ref-{here}.json", run(BASE))
        assert track.main(["check", "--results", str(tmp_path)]) == 2
        assert "no reference for this CPU kind (amd-epyc-avx512-2c)" in capsys.readouterr().err
        assert len(calls) == 1


# --------------------------------------------------- reference and history
def test_reference_is_named_by_the_kind_and_slim(tmp_path):
    doc = run(BASE)
    doc["benchmarks"][0]["stats"]["data"] = [1e-6] * 100
    path = track.store_reference(write(tmp_path, "run.json", doc), str(tmp_path))
    assert os.path.basename(path) == "ref-amd-epyc-avx512-2c.json"
    stored = json.loads(open(path).read())
    assert "data" not in stored["benchmarks"][0]["stats"]
    assert track.ratios(stored) == track.ratios(doc)


def test_reference_of_several_runs_takes_each_ratios_median(tmp_path):
    paths = [write(tmp_path, f"run{i}.json",
                   run(with_times(minmax__1048576__quantcore_1t=f), when=f"2026-11-27T1{i}:00"))
             for i, f in enumerate((1.0, 1.3, 1.1))]
    path = track.store_reference(paths, str(tmp_path))
    stored = json.loads(open(path).read())
    assert track.ratios(stored)[("minmax", 1 << 20, "quantcore-1t")][0] == pytest.approx(0.55)
    assert len(stored["reference_of"]) == 3
    other = write(tmp_path, "v4.json", run(BASE, variant="x86-64-v4"))
    with pytest.raises(SystemExit, match="simd_variant"):
        track.store_reference([paths[0], other], str(tmp_path))


def test_history_orders_runs_by_time_and_keeps_one_kind():
    intel = dict(AMD, brand_raw="Intel(R) Xeon(R) Processor")
    docs = [run(with_times(fake_quant__1024__quantcore_all=0.5), commit="b" * 40,
                when="2026-11-27T12:00:00", dirty=True),
            run(BASE, commit="a" * 40, when="2026-11-26T12:00:00"),
            run(BASE, commit="c" * 40, cpu=intel),
            run(BASE, commit="a" * 40, when="2026-11-26T12:00:01")]  # (its reference copy)
    columns, table = track.history(docs, "amd-epyc-avx512-2c")
    assert [c[0] for c in columns] == ["aaaaaaa 11-26 12:00", "bbbbbbb+ 11-27 12:00"]
    assert table[("fake_quant", 1024, "quantcore-all")] == pytest.approx([4.0, 2.0])
    assert ("fake_quant", 1024, "torch") not in table  # quantcore's own only
    md = track.history_markdown(columns, table)
    assert "| fake_quant | 1Ki | quantcore-all | 4.000 | 2.000 |" in md


def test_history_command_writes_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    storage, results = tmp_path / "runs" / "Linux-CPython", tmp_path / "results"
    storage.mkdir(parents=True)
    results.mkdir()
    write(storage, "0001_a.json", run(BASE, commit="a" * 40, when="2026-11-26T12:00:00"))
    write(storage, "0002_b.json", run(with_times(minmax__1048576__quantcore_1t=1.2),
                                      commit="b" * 40, when="2026-11-27T12:00:00"))
    out = str(results / "history")
    assert track.main(["history", "--storage", str(tmp_path / "runs"), "--results",
                       str(results), "--out", out]) == 0
    md = open(out + ".md").read()
    assert "## amd-epyc-avx512-2c" in md and "| minmax | 1Mi | quantcore-1t | 0.500 | 0.600 |" in md
    assert open(out + "-amd-epyc-avx512-2c.png", "rb").read(4) == b"\x89PNG"


def test_a_saved_run_records_the_quantcore_block(tmp_path):
    """bench/conftest.py's hook on a real (tiny) saved run: one roofline
    benchmark, a few rounds; only the saved metadata is checked."""
    root = os.path.dirname(BENCH)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "bench/test_bench_ops.py", "-k", "test_roofline_copyto and fake_quant- and 1Ki",
           "--benchmark-only", "--benchmark-autosave", "--benchmark-max-time=0.001",
           "--benchmark-min-rounds=1", f"--benchmark-storage=file://{tmp_path}"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (saved,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    info = json.loads(open(saved).read())["machine_info"]["quantcore"]
    for key in ("cpu_kind", "cpu_simd_flags", "threads", "simd_variant", "commit"):
        assert key in info
