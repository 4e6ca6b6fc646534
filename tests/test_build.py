"""The build: OpenMP, flags, SIMD baseline, header constants."""
import os
import re
from pathlib import Path

import pytest

import quantcore as qc
from quantcore import ops

INCLUDE = Path(qc.__file__).parent / "include"


def test_build_info_keys():
    info = qc.build_info()
    for key in ("openmp", "compiler", "cflags", "simd_baseline", "cython_version",
                "max_threads", "parallel_threshold"):
        assert key in info
    assert "-ffp-contract=off" in info["cflags"]
    for bad in ("-ffast-math", "-ffinite-math-only", "-march=native", "-Ofast"):
        assert bad not in info["cflags"]


@pytest.mark.skipif(os.environ.get("QUANTCORE_NO_OPENMP", "") not in ("", "0"),
                    reason="serial build requested")
def test_openmp_is_really_compiled_in():
    info = qc.build_info()
    assert info["openmp"] is True
    assert "-fopenmp" in info["cflags"]


_OMP_PROBE = """
import os, sys
import numpy as np
import quantcore as qc
from quantcore._cpu import _kernels
assert qc.__file__.startswith(sys.argv[1]), qc.__file__
tasks = lambda: len(os.listdir("/proc/self/task"))
before = tasks()
qc.set_num_threads(2)
qc.fake_quant(np.ones(1 << 20, np.float32), 0.1, 0, -128, 127)
print(_kernels.openmp_enabled(), _kernels.omp_max_threads(), before, tasks())
"""


@pytest.mark.skipif(os.environ.get("QUANTCORE_NO_OPENMP", "") not in ("", "0"),
                    reason="serial build requested")
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_openmp_runtime_is_live():
    """At run time, not just in the build flags: the extension reads
    OMP_NUM_THREADS through a real OpenMP runtime (the serial shim answers
    1), and a 2-thread kernel call starts an OpenMP worker thread."""
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS="3", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    root = str(Path(qc.__file__).parent)
    res = subprocess.run([sys.executable, "-c", _OMP_PROBE, root], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    enabled, max_threads, before, after = res.stdout.split()
    assert enabled == "True"
    assert int(max_threads) == 3, "omp_get_max_threads() ignores OMP_NUM_THREADS"
    assert int(after) > int(before), "a 2-thread kernel call started no thread"


def test_simd_baseline_vectorises_rounding():
    import platform
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert qc.build_info()["simd_baseline"] == "x86-64-v2"


def _defines(path):
    text = path.read_text()
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"#define\s+QC_(\w+)\s+(\d+)\b", text)}


def test_python_mode_bits_mirror_the_header():
    d = {}
    for header in INCLUDE.glob("*.h"):
        d.update(_defines(header))
    mirror = {
        "ROUND_HALF_EVEN": ops.ROUND_HALF_EVEN, "ROUND_HALF_UP": ops.ROUND_HALF_UP,
        "ROUND_HALF_AWAY": ops.ROUND_HALF_AWAY, "ZP_BEFORE": ops.ZP_BEFORE,
        "DIVIDE": ops.DIVIDE, "DEQUANT_WIDE": ops.DEQUANT_WIDE,
        "NF_PROPAGATE": ops.NF_PROPAGATE, "NF_NAN_TO_QMIN": ops.NF_NAN_TO_QMIN,
        "NF_INT64": ops.NF_INT64, "OUTPUT_Q": ops.OUTPUT_Q, "NO_ZERO_POINT": ops.NO_ZERO_POINT,
        "FMA_ZP": ops.FMA_ZP, "DEQUANT_NARROW": ops.DEQUANT_NARROW, "ROUND_F32": ops.ROUND_F32,
        "NUDGED_DIVIDE": ops.NUDGED_DIVIDE, "NUDGED_TF": ops.NUDGED_TF,
        "MM_NAN": ops.MM_NAN, "MM_NEGZERO": ops.MM_NEGZERO, "MM_POSZERO": ops.MM_POSZERO,
    }
    for name, value in mirror.items():
        assert d[name] == value, name


def test_gil_is_released_during_kernels():
    """Another Python thread runs bytecode while a kernel is running.

    Structural, not a timing target: thread B records when it runs; if the
    kernel held the GIL, no record could fall inside the kernel call.
    """
    import threading
    import time

    import numpy as np
    x = np.random.default_rng(0).normal(size=1 << 23).astype(np.float32)
    stamps, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    qc.set_num_threads(1)
    t = threading.Thread(target=ticker)
    t.start()
    try:
        time.sleep(0.01)
        windows = []
        for _ in range(3):
            t0 = time.perf_counter()
            qc.fake_quant(x, 0.01, 0, -128, 127, rounding="half_away", scale_op="div")
            windows.append((t0, time.perf_counter()))
    finally:
        stop.set()
        t.join()
        qc.set_num_threads(None)
    inside = sum(1 for a, b in windows for s_ in stamps
                 if a + (b - a) * 0.2 < s_ < b - (b - a) * 0.2)
    assert inside > 0, "no other Python thread ran during a kernel: the GIL was not released"


ROOT = Path(__file__).resolve().parent.parent


def test_license_file_and_spdx_field():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"          # an SPDX expression (PEP 639)
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text       # the full text


def test_wheel_carries_no_extension_sources():
    """The wheel's package data: the headers (quantcore_gpu compiles its CUDA
    sources with them) and the .cu files, not the Cython / C++ sources."""
    tomllib = pytest.importorskip("tomllib")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["include-package-data"] is False
    data = tool["package-data"]
    assert data["quantcore"] == ["include/*.h"]
    assert data["quantcore_gpu"] == ["cuda/*.cu"]


def test_every_family_has_its_loops():
    """Each QC_EW_FAMILIES entry is instantiated in exactly one loop unit
    (qc_kernels.h), and each other list of families / recipes in one unit."""
    from quantcore._cpu import _kernels as K
    units = {p.name: p.read_text() for p in (ROOT / "quantcore" / "_cpu").glob("qc_loops_*.cpp")}
    assert sorted(units) == sorted(_UNIT_NEVER)
    for name in K.FAMILIES:
        owners = [u for u, text in units.items() if f"QC_LOOPS_EW({name})" in text]
        assert len(owners) == 1, (name, owners)
    for lines in ("QC_ENCODE_FAMILIES(QC_LOOPS_ENC)", "QC_DECODE_FAMILIES(QC_LOOPS_DEC)",
                  "QC_GROUP_RECIPES(QC_LOOPS_GROUP)", "QC_BLOCK_RECIPES(QC_LOOPS_BLOCK)"):
        assert sum(lines in text for text in units.values()) == 1, lines


#: loop unit -> the family headers it must not include (an edit of one of
#: them must not rebuild the unit: docs/ARCHITECTURE.md, "five units")
_UNIT_NEVER = {
    "qc_loops_affine.cpp": {"qc_formats.h", "qc_format_families.h", "qc_groups.h", "qc_mx.h"},
    "qc_loops_fp8.cpp": {"qc_families.h", "qc_groups.h", "qc_mx.h"},
    "qc_loops_codes.cpp": {"qc_families.h", "qc_groups.h", "qc_mx.h"},
    "qc_loops_groups.cpp": {"qc_families.h", "qc_format_families.h", "qc_mx.h"},
    "qc_loops_mx.cpp": {"qc_families.h", "qc_format_families.h", "qc_groups.h"},
}


def _header_closure(cxx, source):
    """The project headers a C++ source includes, directly or not (the
    compiler's own dependency list, -MM)."""
    import subprocess
    res = subprocess.run([cxx, "-std=c++17", "-MM", f"-I{INCLUDE}", str(source)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    deps = res.stdout.replace("\\\n", " ").split(":", 1)[1].split()
    return {Path(d).name for d in deps if Path(d).parent == INCLUDE}


def test_each_unit_includes_only_the_headers_of_what_it_runs(tmp_path):
    """The rebuild an edit costs: a loop unit includes its own families'
    headers only, and the Cython module's unit (every header that
    _kernels.pyx / .pxd / .pxi name) the family ids, not the Ops or the
    formats' formulas; qc_tables.cpp (compiled once) holds the tables that
    need the Ops."""
    import shutil
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    cpu = ROOT / "quantcore" / "_cpu"
    for unit, never in _UNIT_NEVER.items():
        closure = _header_closure(cxx, cpu / unit)
        assert "qc_cpu_loops.h" in closure and "qc_registry.h" in closure, unit
        assert not closure & never, (unit, closure & never)
    assert "qc_mx.h" in _header_closure(cxx, cpu / "qc_loops_mx.cpp")
    assert "qc_groups.h" in _header_closure(cxx, cpu / "qc_loops_groups.cpp")
    # the tables (compiled once) need no group recipe: an edit of qc_groups.h
    # rebuilds the groups loops only
    assert "qc_groups.h" not in _header_closure(cxx, cpu / "qc_tables.cpp")
    # the engine writers' row loops (one unit per SIMD build, _engines):
    # qc_engines.h and what it needs, no other family's loops or formulas
    closure = _header_closure(cxx, cpu / "qc_eng_loops.cpp")
    assert {"qc_engines.h", "qc_eng_builds.h"} <= closure
    assert not closure & {"qc_groups.h", "qc_mx.h", "qc_families.h", "qc_format_families.h",
                          "qc_cpu_loops.h", "qc_gguf.h"}, closure
    # numpy.histogram's counting loops (one unit per SIMD build, _hist): its
    # bin rule and the builds' dispatch only
    assert _header_closure(cxx, cpu / "qc_hist_loops.cpp") == {
        "qc_np_histogram.h", "qc_hist_builds.h", "qc_builds.h"}
    named = set()
    for path in sorted(cpu.glob("_kernels*.p*")):
        named |= set(re.findall(r'(?:cdef extern from|#include) "(qc_\w+\.h)"',
                                path.read_text()))
    assert {"qc_registry.h", "qc_kernels.h", "qc_qparams.h"} <= named
    probe = tmp_path / "cython_unit.cpp"
    probe.write_text("".join(f'#include "{h}"\n' for h in sorted(named)))
    closure = _header_closure(cxx, probe)
    assert not closure & {"qc_formats.h", "qc_groups.h", "qc_mx.h", "qc_families.h",
                          "qc_format_families.h", "qc_cpu_loops.h"}, closure


def _setup_module():
    """setup.py's functions, without its setup() call."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("qc_setup_under_test", ROOT / "setup.py")
    src = (ROOT / "setup.py").read_text().split("\nsetup(")[0]  # (not the setup() call)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = str(ROOT / "setup.py")
    exec(compile(src, str(ROOT / "setup.py"), "exec"), mod.__dict__)
    return mod


def test_build_cache_tracks_the_inputs(tmp_path):
    """setup.py's object cache: the key changes with the command and with the
    content of any file the dependency list names."""
    mod = _setup_module()
    a, b = tmp_path / "a b.h", tmp_path / "c.cpp"
    a.write_text("1")
    b.write_text("2")
    dep = tmp_path / "o.d"
    dep.write_text(f"o.o: {str(b)} \\\n {str(a).replace(' ', chr(92) + ' ')}\n")
    assert mod._inputs(str(dep)) == [str(b), str(a)]
    k0 = mod._key(["cc", "-O3"], str(dep))
    assert mod._key(["cc", "-O2"], str(dep)) != k0
    a.write_text("3")
    assert mod._key(["cc", "-O3"], str(dep)) != k0


def test_build_cache_keeps_the_versions_a_branch_switch_needs(tmp_path, monkeypatch):
    """setup.py's object store: an edit undone (or a branch switched back)
    finds its object built before instead of compiling it again; a source
    never built is compiled; at most STORE_KEEP versions are kept."""
    import shutil
    import types
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    mod = _setup_module()
    log = tmp_path / "calls"
    wrapper = tmp_path / "cc.sh"
    wrapper.write_text(f'#!/bin/sh\necho x >> "{log}"\nexec {cc} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("QUANTCORE_CCACHE", "0")
    monkeypatch.setattr(mod, "OBJ_DIR", str(tmp_path / "obj"))
    compiler = types.SimpleNamespace(compiler_so=[str(wrapper), "-fPIC"], include_dirs=[])
    ext = types.SimpleNamespace(include_dirs=[str(tmp_path)], extra_compile_args=["-O1"])
    source, header = tmp_path / "u.c", tmp_path / "h.h"
    source.write_text('#include "h.h"\nint f(void) { return V; }\n')
    obj = str(tmp_path / "obj" / "u.o")
    job = (ext, str(source), obj, [], [])

    def build(value):
        header.write_text(f"#define V {value}\n")
        before = log.read_text().count("x") if log.exists() else 0
        mod._compile_all(compiler, [job])
        return log.read_text().count("x") - before

    assert build(1) == 1
    assert build(1) == 0                  # up to date
    first = (tmp_path / "obj" / "u.o").read_bytes()
    assert build(2) == 1                  # an edit
    assert build(1) == 0                  # undone: the stored object, not a compile
    assert (tmp_path / "obj" / "u.o").read_bytes() == first
    assert build(2) == 0
    for value in (3, 4, 5):
        assert build(value) == 1
    assert len(list((tmp_path / "obj" / "store").glob("u.*.o"))) == mod.STORE_KEEP
    assert build(1) == 1                  # the oldest version dropped


def test_demo_build_compiles_only_the_units_whose_speed_it_does_not_show_at_O1(monkeypatch):
    """QUANTCORE_BUILD=demo (make demo): the units of DEMO_QUICK_UNITS get
    -O1 last (after the -O3 of the flags), the others nothing; unset or
    "full" none; another value stops the build naming the variable; every
    name in DEMO_QUICK_UNITS is a unit that exists (a loop unit or an
    extension's source), none of them the units whose speed the demo
    shows."""
    mod = _setup_module()
    monkeypatch.delenv("QUANTCORE_BUILD", raising=False)
    assert mod.quick_units() == ()
    monkeypatch.setenv("QUANTCORE_BUILD", "full")
    assert mod.quick_units() == ()
    monkeypatch.setenv("QUANTCORE_BUILD", "demo")
    assert mod.quick_units() == mod.DEMO_QUICK_UNITS
    monkeypatch.setenv("QUANTCORE_BUILD", "fast")
    with pytest.raises(SystemExit, match="QUANTCORE_BUILD='fast'"):
        mod.quick_units()
    units = {mod._unit(u) for us in mod.SIMD_UNITS.values() for u in us}
    units |= {mod._unit(src) for ext in mod.extensions for src in ext.sources}
    assert set(mod.DEMO_QUICK_UNITS) <= units
    # the demo times calibrations: the observers of the extension's own unit
    # and the histograms
    assert not {"_kernels", "_hist"} & set(mod.DEMO_QUICK_UNITS)
    jobs = [(None, "quantcore/_cpu/qc_loops_mx.cpp", "mx.o", [], ["-march=x86-64-v3"]),
            (None, "quantcore/_cpu/_hist.cpp", "hist.o", [], [])]
    assert [job[4] for job in mod._quick_jobs(jobs, mod.DEMO_QUICK_UNITS)] == [
        ["-march=x86-64-v3", "-O1"], []]
    assert mod._quick_jobs(jobs, ()) == jobs
