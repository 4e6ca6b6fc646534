"""Build of quantcore's Cython + OpenMP CPU extensions.

Flags are part of correctness (ARCHITECTURE.md, "Numerical contract"):
``-O3 -ffp-contract=off -fno-trapping-math`` always; never ``-ffast-math`` /
``-ffinite-math-only`` / ``-march=native`` by default.  On x86-64 the
baseline is ``-march=x86-64-v2`` (SSE4.1 ``roundps`` vectorises rounding)
when the compiler accepts it, else the plain baseline; the loops are built a
second time for AVX2 + FMA (``qc_loops_v3.c``), used at run time on CPUs
that have them (``QUANTCORE_SIMD=baseline`` keeps the baseline).

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
from Cython.Build import cythonize
from setuptools import Extension, setup

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
    static float twice(float x) { __m256 v = _mm256_set1_ps(x); return _mm256_cvtss_f32(_mm256_add_ps(v, v)); }
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
              "-std=gnu99"] + simd
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


CFLAGS, LDFLAGS, OPENMP, BASELINE = build_flags()
V3 = simd_v3()
write_build_config(CFLAGS, LDFLAGS, OPENMP, BASELINE, V3)

# _kernels: the Cython module, plus (x86-64) the loops built again for AVX2 +
# FMA in qc_loops_v3.c, chosen at run time by include/qc_dispatch.h
V3_SOURCES = [os.path.join("quantcore", "_cpu", "qc_loops_v3.c")] if V3 else []
V3_MACROS = [("QC_HAVE_V3", "1")] if V3 else []
extensions = [
    Extension(
        "quantcore._cpu._kernels",
        [os.path.join("quantcore", "_cpu", "_kernels.pyx")] + V3_SOURCES,
        include_dirs=[INCLUDE, numpy.get_include()],
        # rebuild when a shared header changes (setuptools does not see #includes)
        depends=sorted(glob.glob(os.path.join(INCLUDE, "*.h"))),
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")] + V3_MACROS,
    ),
    # _hist: numpy.histogram's bins (onnxruntime's calibrators), same flags
    Extension(
        "quantcore._cpu._hist",
        [os.path.join("quantcore", "_cpu", "_hist.pyx")],
        include_dirs=[INCLUDE, numpy.get_include()],
        depends=[os.path.join(INCLUDE, "qc_np_histogram.h")],
        extra_compile_args=CFLAGS,
        extra_link_args=LDFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)
