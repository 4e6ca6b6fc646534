"""Build of quantcore's Cython + OpenMP CPU extensions.

Flags are part of correctness (ARCHITECTURE.md, "Numerical contract"):
``-O3 -ffp-contract=off -fno-trapping-math`` always; never ``-ffast-math`` /
``-ffinite-math-only`` / ``-march=native`` by default.  On x86-64 the
baseline is ``-march=x86-64-v2`` (SSE4.1 ``roundps`` vectorises rounding)
when the compiler accepts it, else the plain baseline; the loops
(``quantcore/_cpu/qc_loops_*.cpp``, one unit per group of families) are
built again for ``x86-64-v3`` (AVX2 + FMA) and ``x86-64-v4`` (AVX-512), the
best one the CPU has chosen at run time (``QUANTCORE_SIMD=baseline`` keeps
the baseline).

Each unit includes only the headers of what it runs: a loop unit its
families' headers, ``qc_tables.cpp`` the Ops (the parameter counts and code
widths the extension exports), and the Cython module's unit the family ids
(``qc_registry.h``), not the formulas.  So an edit of ``qc_formats.h``
rebuilds the fp8, codes, groups and mx loops and ``qc_tables.cpp``, one of
``qc_groups.h`` the groups loops only, one of ``qc_families.h`` the affine
loops and ``qc_tables.cpp``, one of ``qc_mx.h`` the mx loops
(docs/ARCHITECTURE.md, "Three CPU builds, five units").

The extension is C++17 (the kernels are templates shared with the CUDA
sources).  Nothing is probed or written when this file is imported: the
compiler probes, the build configuration (``quantcore/_cpu/_build_config.py``)
and the Cython translation happen in the ``build_ext`` command.

Every object is compiled at once, one job per core, and kept in
``build/qc_obj`` with the list of files it was made from (``-MMD``) and a
hash of their contents and of the command: a later build (an editable
reinstall, ``build_ext --inplace``) recompiles only the units whose sources,
headers or flags changed.  ``ccache`` is used when it is on the PATH.

Environment:
  QUANTCORE_NO_OPENMP=1   force the serial build
  QUANTCORE_SIMD_BUILDS=baseline
                          build the baseline loops only (a faster first
                          build: ``make demo``); a comma list of
                          baseline, x86-64-v3, x86-64-v4 picks the builds
  QUANTCORE_BUILD=demo    ``make demo``'s build: the units whose speed the
                          demo does not show (DEMO_QUICK_UNITS) at -O1, a
                          tenth to a quarter of their
                          compile time, same bits, slower; a later build
                          without it compiles them again at -O3
  QUANTCORE_CFLAGS="..."  extra compiler flags, appended last
  QUANTCORE_LDFLAGS="..." extra linker flags (e.g. -fsanitize=address)
  QUANTCORE_CCACHE=0      do not use ccache even when it is present
"""
import glob
import hashlib
import json
import os
import re
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import warnings

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join("quantcore", "include")
FORBIDDEN = ("-ffast-math", "-ffinite-math-only", "-Ofast", "-funsafe-math-optimizations")

OMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        printf("%d\\n", n > 0 && omp_get_max_threads() > 0);
        return 0;
    }
    """
)


def _compiler():
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def _try_compile(source, flags, run=False):
    """Compile (and optionally run) a probe program; True on success."""
    tmp = tempfile.mkdtemp(prefix="qc_probe_")
    try:
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as fh:
            fh.write(source)
        cmd = _compiler() + flags + [src, "-o", exe] + flags
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            return False
        if run:
            out = subprocess.run([exe], capture_output=True, text=True)
            return out.returncode == 0 and out.stdout.strip() == "1"
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def openmp_flags():
    """OpenMP compile/link flags, or None for the serial build."""
    if os.environ.get("QUANTCORE_NO_OPENMP", "") not in ("", "0"):
        print("quantcore: QUANTCORE_NO_OPENMP set: building serially", file=sys.stderr)
        return None
    if _try_compile(OMP_PROBE, ["-fopenmp"], run=True):
        return ["-fopenmp"]
    banner = "*" * 72
    msg = (f"\n{banner}\nquantcore: the compiler cannot build and run an OpenMP program.\n"
           "Building the SERIAL fallback: every kernel will use one thread.\n"
           f"Install an OpenMP runtime (e.g. libgomp / libomp) and rebuild.\n{banner}\n")
    warnings.warn(msg)
    print(msg, file=sys.stderr)
    return None


def simd_flags():
    """(flags, baseline name): x86-64-v2 where the compiler takes it."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64") and _try_compile("int main(void){return 0;}\n",
                                                        ["-march=x86-64-v2"]):
        return ["-march=x86-64-v2"], "x86-64-v2"
    return [], "baseline"


#: the run-time SIMD builds of the loops beyond the baseline: level ->
#: (name, -march flag, description)
SIMD_LEVELS = {3: ("x86-64-v3", "-march=x86-64-v3", "x86-64-v3 (AVX2 + FMA)"),
               4: ("x86-64-v4", "-march=x86-64-v4", "x86-64-v4 (AVX-512)")}

CPU_PROBE = textwrap.dedent(
    """
    int main(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("x86-64-v3") + __builtin_cpu_supports("x86-64-v4") < 0;
    }
    """
)


def simd_levels():
    """The run-time builds of the loops: the levels of SIMD_LEVELS that the
    compiler takes (x86-64 only; each needs -march=x86-64-vN and
    __builtin_cpu_supports("x86-64-vN"), GCC 12 / Clang 16), less those that
    QUANTCORE_SIMD_BUILDS leaves out."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return []
    wanted = os.environ.get("QUANTCORE_SIMD_BUILDS", "").strip().lower()
    names = {n.strip() for n in wanted.split(",") if n.strip()}
    known = {"baseline"} | {name for name, _, _ in SIMD_LEVELS.values()}
    if names - known:
        sys.exit(f"quantcore: QUANTCORE_SIMD_BUILDS={wanted!r}: expected a comma list of "
                 f"{sorted(known)}")
    return [level for level, (name, march, _) in sorted(SIMD_LEVELS.items())
            if (not names or name in names) and _try_compile(CPU_PROBE, [march])]


def quick_units():
    """The units compiled at -O1: DEMO_QUICK_UNITS when QUANTCORE_BUILD is
    ``demo``, none when it is unset or ``full``."""
    build = os.environ.get("QUANTCORE_BUILD", "").strip().lower()
    if build not in ("", "full", "demo"):
        sys.exit(f"quantcore: QUANTCORE_BUILD={build!r}: expected 'demo' or 'full'")
    return DEMO_QUICK_UNITS if build == "demo" else ()


def build_flags():
    omp = openmp_flags()
    simd, baseline = simd_flags()
    # -fno-trapping-math: the code never reads floating-point exception flags;
    # it lets GCC vectorise floor() (roundps) and the branch-free selects.
    # It changes no result (unlike -ffast-math / -ffinite-math-only).
    # -g0: no debug information (Python's own CFLAGS ask for -g: a third of
    # the compile time and 3x the size); QUANTCORE_CFLAGS=-g brings it back.
    cflags = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fno-strict-aliasing",
              "-std=c++17", "-g0"] + simd
    if omp:
        cflags += omp
    elif _try_compile("int main(void){return 0;}\n", ["-fopenmp-simd"]):
        cflags += ["-fopenmp-simd", "-DQC_HAVE_OMP_SIMD"]
    user = shlex.split(os.environ.get("QUANTCORE_CFLAGS", ""))
    bad = [f for f in user if f in FORBIDDEN or f.startswith("-march=native")]
    if bad:
        print(f"quantcore: warning: QUANTCORE_CFLAGS has {bad}: results may not be "
              "bit-exact", file=sys.stderr)
    cflags += user
    ldflags = list(omp or []) + shlex.split(os.environ.get("QUANTCORE_LDFLAGS", ""))
    return cflags, ldflags, bool(omp), baseline


def write_build_config(cflags, ldflags, openmp, baseline, levels, quick):
    import Cython

    cc = _compiler()
    try:
        version = subprocess.run(cc + ["--version"], capture_output=True,
                                 text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = "unknown"
    config = {
        "openmp": openmp,
        "compiler": " ".join(cc),
        "compiler_version": version,
        "cflags": cflags,
        "ldflags": ldflags,
        "simd_baseline": baseline,
        "simd_runtime_variants": [SIMD_LEVELS[level][2] for level in levels],
        "quick_units": list(quick),
        "cython_version": Cython.__version__,
        "numpy_build_version": numpy.__version__,
    }
    path = os.path.join(HERE, "quantcore", "_cpu", "_build_config.py")
    with open(path, "w") as fh:
        fh.write("# Written by setup.py at build time; do not edit.\n")
        fh.write(f"BUILD_CONFIG = {config!r}\n")


CPU = os.path.join("quantcore", "_cpu")
#: the units of the loops, each compiled once per SIMD build (qc_kernels.h)
LOOP_UNITS = sorted(glob.glob(os.path.join(CPU, "qc_loops_*.cpp")))
#: the units compiled once per SIMD level (the build in use chosen at run
#: time: qc_builds.h), by extension
SIMD_UNITS = {"quantcore._cpu._kernels": LOOP_UNITS,
              "quantcore._cpu._engines": [os.path.join(CPU, "qc_eng_loops.cpp")],
              "quantcore._cpu._hist": [os.path.join(CPU, "qc_hist_loops.cpp")]}
OBJ_DIR = os.path.join("build", "qc_obj")
#: the units whose speed ``make demo`` does not show: the loops it does not
#: run (the MX / NVFP4, code, FP8 and group loops; the GGUF and
#: engine-checkpoint modules) and the affine loops, which it runs on a small
#: MLP's arrays without timing them (its timed calibrations run the observer
#: and histogram kernels of _kernels / _hist).  QUANTCORE_BUILD=demo compiles
#: them at -O1: qc_loops_mx.cpp 18 CPU-s instead of 66 here, qc_loops_affine
#: 3.5 instead of 32 (GCC's loop unswitching at -O3, ARCHITECTURE).  The flags
#: add no reassociation or contraction at any level (-ffp-contract=off, no
#: -ffast-math), so -O1 gives the same bits: only the speed differs.
DEMO_QUICK_UNITS = ("qc_loops_affine", "qc_loops_mx", "qc_loops_codes", "qc_loops_fp8",
                    "qc_loops_groups", "_gguf", "_engines", "qc_eng_loops")
#: the versions of each object kept in OBJ_DIR/store, by key (a branch switch
#: or an edit undone finds its object there instead of compiling it again)
STORE_KEEP = 3


class BuildExt(build_ext):
    """Translate the Cython sources, probe the compiler, set the flags and
    write the build configuration, at build time only; compile every object
    of every extension at once (one job per core), each only when its
    sources, headers or command changed."""

    def finalize_options(self):
        from Cython.Build import cythonize

        self.distribution.ext_modules[:] = cythonize(
            self.distribution.ext_modules,
            nthreads=min(len(self.distribution.ext_modules), os.cpu_count() or 1),
            compiler_directives={
                "language_level": 3,
                "boundscheck": False,
                "wraparound": False,
                "cdivision": True,
                "initializedcheck": False,
            },
        )
        super().finalize_options()

    def build_extensions(self):
        cflags, ldflags, openmp, baseline = build_flags()
        levels = simd_levels()
        quick = quick_units()
        write_build_config(cflags, ldflags, openmp, baseline, levels, quick)
        jobs = []  # (extension, source, object, macros, extra flags)
        for ext in self.extensions:
            ext.extra_compile_args = cflags
            ext.extra_link_args = ldflags
            macros = list(ext.define_macros)
            if ext.name in SIMD_UNITS:
                # the loops: each unit once per build, in the build's namespace
                for unit in SIMD_UNITS[ext.name]:
                    for level in [2] + levels:
                        march = [SIMD_LEVELS[level][1]] if level in SIMD_LEVELS else []
                        obj = os.path.join(OBJ_DIR, f"{_unit(unit)}.v{level}.o")
                        jobs.append((ext, unit, obj, macros + [("QC_SIMD_LEVEL", str(level))],
                                     march))
                # the dispatcher (qc_kernels.h) calls the builds made
                macros += [(f"QC_HAVE_V{level}", "1") for level in levels]
            for src in ext.sources:
                obj = os.path.join(OBJ_DIR, _unit(src) + ".o")
                jobs.append((ext, src, obj, macros, []))
        _compile_all(self.compiler, _quick_jobs(jobs, quick))
        for ext in self.extensions:
            ext.extra_objects = [job[2] for job in jobs if job[0] is ext]
        # setuptools links them (its own compile step has nothing left to do);
        # always, as the objects are up to date but may be newer than the .so
        self.compiler.compile = lambda sources, *args, **kwargs: []
        self.force = True
        super().build_extensions()


def _unit(src):
    """The name of a source without its folder and extension."""
    return os.path.splitext(os.path.basename(src))[0]


def _quick_jobs(jobs, quick):
    """`jobs` with -O1 last (it wins over the -O3 of cflags) in the extra
    flags of the jobs whose unit is in `quick`."""
    return [job[:4] + (job[4] + ["-O1"],) if _unit(job[1]) in quick else job for job in jobs]


def _command(compiler, ext, src, obj, macros, extra):
    """The compiler command line of one object (setuptools' compiler and
    Python's flags, the macros, the extension's include directories)."""
    from setuptools._distutils.ccompiler import gen_preprocess_options

    pp_opts = gen_preprocess_options(macros, ext.include_dirs + compiler.include_dirs)
    cmd = list(compiler.compiler_so) + pp_opts + ["-c", src, "-o", obj]
    return cmd + list(ext.extra_compile_args) + extra


def _inputs(depfile):
    """The files an object was made from, as its -MMD file lists them."""
    with open(depfile, encoding="utf-8") as fh:
        text = fh.read().replace("\\\n", " ")
    return [p.replace("\\ ", " ") for p in re.split(r"(?<!\\)\s+", text.split(":", 1)[1]) if p]


def _key(cmd, depfile):
    """A hash of the command and of the contents of every input file."""
    h = hashlib.sha256(json.dumps(cmd).encode())
    for path in _inputs(depfile):
        h.update(path.encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def _stored(obj):
    """The stored versions of ``obj``: (key, object path), newest first."""
    store = os.path.join(os.path.dirname(obj), "store")
    name = os.path.basename(obj)[:-2]
    found = glob.glob(os.path.join(store, glob.escape(name) + ".*.o"))
    found.sort(key=os.path.getmtime, reverse=True)
    return [(path[len(os.path.join(store, name)) + 1:-2], path) for path in found]


def _store(obj, key):
    """Keep a copy of ``obj`` and its dependency list under its key, the
    :data:`STORE_KEEP` newest versions of each object."""
    store = os.path.join(os.path.dirname(obj), "store")
    os.makedirs(store, exist_ok=True)
    base = os.path.join(store, os.path.basename(obj)[:-2] + "." + key)
    for src, dst in ((obj + ".d", base + ".d"), (obj, base + ".o")):
        shutil.copyfile(src, dst + ".tmp")
        os.replace(dst + ".tmp", dst)
    for _, old in _stored(obj)[STORE_KEEP:]:
        for path in (old, old[:-2] + ".d"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _restore(cmd, obj):
    """Put back a stored version of ``obj`` whose key, worked out again from
    its own dependency list and the files' contents now, is the one it was
    stored under (same command, same inputs): True when one was."""
    for key, path in _stored(obj):
        try:
            if _key(cmd, path[:-2] + ".d") != key:
                continue
            for src, dst in ((path[:-2] + ".d", obj + ".d"), (path, obj)):
                shutil.copyfile(src, dst + ".tmp")
                os.replace(dst + ".tmp", dst)
        except OSError:
            continue
        os.utime(path)
        with open(obj + ".key", "w") as fh:
            fh.write(key)
        return True
    return False


def _compile_all(compiler, jobs):
    """Compile the objects of `jobs` that are not up to date, one job per
    core (setuptools compiles one source after another, one extension after
    another), with ccache in front when it is present."""
    from concurrent.futures import ThreadPoolExecutor

    ccache = shutil.which("ccache") if os.environ.get("QUANTCORE_CCACHE", "1") != "0" else None
    os.makedirs(OBJ_DIR, exist_ok=True)

    def one(job):
        ext, src, obj, macros, extra = job
        cmd = _command(compiler, ext, src, obj, macros, extra)
        stamp = obj + ".key"
        try:
            with open(stamp) as fh:
                if os.path.exists(obj) and fh.read() == _key(cmd, obj + ".d"):
                    return obj
        except OSError:
            pass
        if _restore(cmd, obj):
            print(f"quantcore: {obj} as built before (build/qc_obj/store)", file=sys.stderr)
            return obj
        print(f"quantcore: compiling {obj}", file=sys.stderr)
        res = subprocess.run(([ccache] if ccache else []) + cmd + ["-MMD", "-MF", obj + ".d"])
        if res.returncode:
            raise RuntimeError(f"quantcore: compiling {src} failed: {shlex.join(cmd)}")
        key = _key(cmd, obj + ".d")
        with open(stamp, "w") as fh:
            fh.write(key)
        _store(obj, key)
        return obj

    # the longest first (the loop units), so that the cores stay busy
    # (the -O1 units of a demo build last: they are the short ones)
    order = sorted(jobs, key=lambda j: ("-O1" in j[4], j[1] not in LOOP_UNITS, -len(j[4])))
    with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        return list(pool.map(one, order))  # (re-raises the first compile error)


extensions = [
    Extension(
        "quantcore._cpu._kernels",
        # (qc_tables.cpp: the tables that need the families' Ops, compiled once)
        [os.path.join(CPU, "_kernels.pyx"), os.path.join(CPU, "qc_tables.cpp")],
        include_dirs=[INCLUDE, numpy.get_include()],
        # rebuild when a shared header changes (setuptools does not see #includes)
        depends=sorted(glob.glob(os.path.join(INCLUDE, "*.h")) +
                       glob.glob(os.path.join(CPU, "_kernels_*.pxi")) +
                       [os.path.join(CPU, "_kernels.pxd"), os.path.join(CPU, "_shares.pxd")] +
                       LOOP_UNITS + [os.path.join(CPU, "qc_tables.cpp")]),
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
    # _hist: numpy.histogram's bins (onnxruntime's calibrators), same flags
    Extension(
        "quantcore._cpu._hist",
        [os.path.join(CPU, "_hist.pyx")],
        include_dirs=[INCLUDE, numpy.get_include()],
        depends=[os.path.join(INCLUDE, h)
                 for h in ("qc_np_histogram.h", "qc_hist_builds.h", "qc_builds.h")] +
                [os.path.join(CPU, f) for f in ("_shares.pxd", "_simd_follow.pxi")],
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
    # _gguf: llama.cpp's GGUF block types (qc_gguf*.h), same flags
    Extension(
        "quantcore._cpu._gguf",
        [os.path.join(CPU, "_gguf.pyx")],
        include_dirs=[INCLUDE, numpy.get_include()],
        depends=sorted(glob.glob(os.path.join(INCLUDE, "qc_gguf*.h"))),
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
    # _engines: the engine checkpoint writers' FP8 loops (qc_engines.h), same flags
    Extension(
        "quantcore._cpu._engines",
        [os.path.join(CPU, "_engines.pyx")],
        include_dirs=[INCLUDE, numpy.get_include()],
        depends=sorted(glob.glob(os.path.join(INCLUDE, "*.h"))) +
        [os.path.join(CPU, "_simd_follow.pxi")],
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
]

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
