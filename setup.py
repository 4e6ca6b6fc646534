"""Build of quantcore's Cython + OpenMP CPU extensions.

Flags are part of correctness (ARCHITECTURE.md, "Numerical contract"):
``-O3 -ffp-contract=off -fno-trapping-math`` always; never ``-ffast-math`` /
``-ffinite-math-only`` / ``-march=native`` by default.  On x86-64 the
baseline is ``-march=x86-64-v2`` (SSE4.1 ``roundps`` vectorises rounding)
when the compiler accepts it, else the plain baseline; the loops are built a
second time for AVX2 + FMA (``qc_loops_v3.cpp``), used at run time on CPUs
that have them (``QUANTCORE_SIMD=baseline`` keeps the baseline).

The extension is C++17 (the kernels are templates shared with the CUDA
sources).  Nothing is probed or written when this file is imported: the
compiler probes, the build configuration (``quantcore/_cpu/_build_config.py``)
and the Cython translation happen in the ``build_ext`` command.

Environment:
  QUANTCORE_NO_OPENMP=1   force the serial build
  QUANTCORE_CFLAGS="..."  extra compiler flags, appended last
  QUANTCORE_LDFLAGS="..." extra linker flags (e.g. -fsanitize=address)
"""
import glob
import os
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


V3_PROBE = textwrap.dedent(
    """
    #pragma GCC target("avx2,fma")
    #include <immintrin.h>
    static float twice(float x) {
        __m256 v = _mm256_set1_ps(x);
        return _mm256_cvtss_f32(_mm256_add_ps(v, v));
    }
    int main(void) {
        __builtin_cpu_init();
        return (__builtin_cpu_supports("avx2") ? 0 : 0) + (twice(1.0f) == 2.0f ? 0 : 1);
    }
    """
)


def simd_v3():
    """True where the loops can also be built for AVX2 + FMA, chosen at run
    time (x86-64 with a GCC / Clang that takes the target pragma)."""
    machine = platform.machine().lower()
    return machine in ("x86_64", "amd64") and _try_compile(V3_PROBE, [])


def build_flags():
    omp = openmp_flags()
    simd, baseline = simd_flags()
    # -fno-trapping-math: the code never reads floating-point exception flags;
    # it lets GCC vectorise floor() (roundps) and the branch-free selects.
    # It changes no result (unlike -ffast-math / -ffinite-math-only).
    cflags = ["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fno-strict-aliasing",
              "-std=c++17"] + simd
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


def write_build_config(cflags, ldflags, openmp, baseline, v3):
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
        "simd_runtime_variants": ["x86-64-v3 (AVX2 + FMA)"] if v3 else [],
        "cython_version": Cython.__version__,
        "numpy_build_version": numpy.__version__,
    }
    path = os.path.join(HERE, "quantcore", "_cpu", "_build_config.py")
    with open(path, "w") as fh:
        fh.write("# Written by setup.py at build time; do not edit.\n")
        fh.write(f"BUILD_CONFIG = {config!r}\n")


CPU = os.path.join("quantcore", "_cpu")


class BuildExt(build_ext):
    """Translate the Cython sources, probe the compiler, set the flags and
    write the build configuration, at build time only."""

    def finalize_options(self):
        from Cython.Build import cythonize

        self.distribution.ext_modules[:] = cythonize(
            self.distribution.ext_modules,
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
        v3 = simd_v3()
        write_build_config(cflags, ldflags, openmp, baseline, v3)
        for ext in self.extensions:
            ext.extra_compile_args = cflags
            ext.extra_link_args = ldflags
            if v3 and ext.name == "quantcore._cpu._kernels":
                # the loops again for AVX2 + FMA, chosen at run time (qc_kernels.h)
                ext.sources.append(os.path.join(CPU, "qc_loops_v3.cpp"))
                ext.define_macros.append(("QC_HAVE_V3", "1"))
        _compile_in_parallel(self.compiler)
        super().build_extensions()


def _compile_in_parallel(compiler):
    """Compile an extension's source files at the same time, one job per
    core (setuptools compiles them one after another; the kernels' three
    translation units each take about a minute).  The objects and the
    command lines are setuptools' own (``_setup_compile`` / ``_compile``)."""
    from concurrent.futures import ThreadPoolExecutor

    def compile_all(sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                    extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max(1, min(len(objects), os.cpu_count() or 1))) as pool:
            list(pool.map(one, objects))  # (re-raises the first compile error)
        return objects

    compiler.compile = compile_all


extensions = [
    Extension(
        "quantcore._cpu._kernels",
        [os.path.join(CPU, "_kernels.pyx"), os.path.join(CPU, "qc_loops_base.cpp")],
        include_dirs=[INCLUDE, numpy.get_include()],
        # rebuild when a shared header changes (setuptools does not see #includes)
        depends=sorted(glob.glob(os.path.join(INCLUDE, "*.h")) +
                       [os.path.join(CPU, "_kernels.pxd"), os.path.join(CPU, "_shares.pxd"),
                        os.path.join(CPU, "qc_loops_v3.cpp")]),
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
    # _hist: numpy.histogram's bins (onnxruntime's calibrators), same flags
    Extension(
        "quantcore._cpu._hist",
        [os.path.join(CPU, "_hist.pyx")],
        include_dirs=[INCLUDE, numpy.get_include()],
        depends=[os.path.join(INCLUDE, "qc_np_histogram.h"), os.path.join(CPU, "_shares.pxd")],
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
]

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
