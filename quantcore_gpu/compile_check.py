"""Compile every CUDA source of quantcore_gpu with NVRTC, without a GPU.

    python -m quantcore_gpu.compile_check [--arch compute_90 ...] [-v]

Each ``cuda/*.cu`` is compiled to PTX with every template instantiation
that ``quantcore_gpu.kernels`` launches (its name expressions) and exactly
the options the runtime uses (``kernels.compile_options()``: no
flush-to-zero, IEEE division and square root, ``--fmad=false``,
``-std=c++17``, ``-I quantcore/include``), for each architecture.  PTX needs no driver and
no device, so this runs on any Linux machine with NVRTC: the
``nvidia-cuda-nvrtc-cu12`` wheel (``pip install nvidia-cuda-nvrtc-cu12``)
or a CUDA toolkit.  The library is loaded with ctypes; set
``QC_NVRTC_LIBRARY`` to a libnvrtc path to choose one.

Exit status: 0 all compiled, 1 a compile error (the NVRTC log is printed),
2 NVRTC could not be loaded.
"""
import argparse
import ctypes
import ctypes.util
import glob
import importlib.util
import os
import sys
import time

from . import kernels

#: architectures compiled by default: Turing (the oldest NVRTC 12.9 targets
#: without a deprecation warning), Ampere, Hopper
DEFAULT_ARCHS = ("compute_75", "compute_80", "compute_90")

NVRTC_SUCCESS = 0
#: what cupy.cuda.compiler.compile_using_nvrtc adds to the runtime's options
#: (NVRTC 12 on; besides the architecture)
CUPY_ADDS = ("--device-as-default-execution-space",)


class NvrtcUnavailable(RuntimeError):
    """libnvrtc could not be found or loaded."""


def _candidates():
    env = os.environ.get("QC_NVRTC_LIBRARY")
    if env:
        yield env
    # the nvidia-cuda-nvrtc-cu12 / -cu13 wheels: nvidia/cuda_nvrtc/lib/libnvrtc.so.*
    for pkg in ("nvidia.cuda_nvrtc", "nvidia.cu13"):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                for pat in ("lib/libnvrtc.so.*", "lib/libnvrtc.so", "bin/nvrtc64_*.dll"):
                    for path in sorted(glob.glob(os.path.join(loc, pat))):
                        if "builtins" not in path and ".alt." not in path:
                            yield path
    for root in filter(None, (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                              "/usr/local/cuda")):
        for path in sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*"))):
            if "builtins" not in path and ".alt." not in path:
                yield path
    found = ctypes.util.find_library("nvrtc")
    if found:
        yield found
    yield "libnvrtc.so.12"
    yield "libnvrtc.so"


def load_nvrtc():
    """(ctypes library, path) of the first libnvrtc that loads."""
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
            continue
        _declare(lib)
        return lib, path
    raise NvrtcUnavailable("libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12, or set "
                           "QC_NVRTC_LIBRARY); tried: " + "; ".join(errors or ["nothing"]))


def _declare(lib):
    c = ctypes
    p = c.c_void_p
    lib.nvrtcGetErrorString.restype = c.c_char_p
    lib.nvrtcGetErrorString.argtypes = [c.c_int]
    lib.nvrtcVersion.argtypes = [c.POINTER(c.c_int), c.POINTER(c.c_int)]
    lib.nvrtcCreateProgram.argtypes = [c.POINTER(p), c.c_char_p, c.c_char_p, c.c_int,
                                       c.POINTER(c.c_char_p), c.POINTER(c.c_char_p)]
    lib.nvrtcDestroyProgram.argtypes = [c.POINTER(p)]
    lib.nvrtcAddNameExpression.argtypes = [p, c.c_char_p]
    lib.nvrtcCompileProgram.argtypes = [p, c.c_int, c.POINTER(c.c_char_p)]
    lib.nvrtcGetProgramLogSize.argtypes = [p, c.POINTER(c.c_size_t)]
    lib.nvrtcGetProgramLog.argtypes = [p, c.c_char_p]
    lib.nvrtcGetPTXSize.argtypes = [p, c.POINTER(c.c_size_t)]
    lib.nvrtcGetPTX.argtypes = [p, c.c_char_p]
    lib.nvrtcGetLoweredName.argtypes = [p, c.c_char_p, c.POINTER(c.c_char_p)]
    lib.nvrtcGetCUBINSize.argtypes = [p, c.POINTER(c.c_size_t)]
    lib.nvrtcGetCUBIN.argtypes = [p, c.c_char_p]


def nvrtc_version(lib):
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


class CompileResult:
    def __init__(self, source, arch, ok, log, ptx_size=0, lowered=None, seconds=0.0):
        self.source, self.arch, self.ok, self.log = source, arch, ok, log
        self.ptx_size, self.lowered, self.seconds = ptx_size, lowered or {}, seconds
        self.ptx = self.cubin = None


def compile_source(lib, name, code, options, name_expressions, arch):
    """Compile one source to PTX (and, for a real architecture ``sm_XX``,
    a cubin); a CompileResult with ``ptx`` text and ``cubin`` bytes (never
    raises on a compile error)."""
    c = ctypes
    t0 = time.perf_counter()
    prog = c.c_void_p()

    def err(status, what):
        return f"{what}: {lib.nvrtcGetErrorString(status).decode()} ({status})"

    status = lib.nvrtcCreateProgram(c.byref(prog), code.encode(), name.encode(), 0, None, None)
    if status != NVRTC_SUCCESS:
        return CompileResult(name, arch, False, err(status, "nvrtcCreateProgram"))
    try:
        for expr in name_expressions:
            status = lib.nvrtcAddNameExpression(prog, expr.encode())
            if status != NVRTC_SUCCESS:
                return CompileResult(name, arch, False,
                                     err(status, f"nvrtcAddNameExpression {expr}"))
        opts = [o.encode() for o in options] + [f"--gpu-architecture={arch}".encode()]
        arr = (c.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = c.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, c.byref(size))
        buf = c.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace").strip()
        if status != NVRTC_SUCCESS:
            return CompileResult(name, arch, False,
                                 err(status, "nvrtcCompileProgram") + ("\n" + log if log else ""),
                                 seconds=time.perf_counter() - t0)
        lowered = {}
        for expr in name_expressions:
            out = c.c_char_p()
            status = lib.nvrtcGetLoweredName(prog, expr.encode(), c.byref(out))
            if status != NVRTC_SUCCESS or not out.value:
                return CompileResult(name, arch, False, err(status, f"nvrtcGetLoweredName {expr}"))
            lowered[expr] = out.value.decode()
        ptx_size = c.c_size_t()
        lib.nvrtcGetPTXSize(prog, c.byref(ptx_size))
        ptx = c.create_string_buffer(ptx_size.value)
        lib.nvrtcGetPTX(prog, ptx)
        text = ptx.value.decode(errors="replace")
        missing = [e for e, m in lowered.items() if f".entry {m}" not in text]
        if missing:
            return CompileResult(name, arch, False, "kernels missing from the PTX: "
                                 + ", ".join(missing), seconds=time.perf_counter() - t0)
        res = CompileResult(name, arch, True, log, ptx_size.value, lowered)
        res.ptx = text
        if arch.startswith("sm_"):
            size = c.c_size_t()
            lib.nvrtcGetCUBINSize(prog, c.byref(size))
            cubin = c.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, cubin)
            res.cubin = cubin.raw[:size.value]
        res.seconds = time.perf_counter() - t0
        return res
    finally:
        lib.nvrtcDestroyProgram(c.byref(prog))


def check_all(archs=DEFAULT_ARCHS, lib=None, werror=False):
    """Compile every source for every arch; a list of CompileResult.  With
    ``werror`` a compile log that mentions a warning fails too."""
    if lib is None:
        lib, _ = load_nvrtc()
    options = kernels.compile_options() + CUPY_ADDS
    results = []
    for source, names in sorted(kernels.SOURCES.items()):
        code = kernels.read_source(source)
        for arch in archs:
            r = compile_source(lib, source, code, options, names, arch)
            if werror and r.ok and "warning" in r.log:
                r.ok = False
            results.append(r)
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m quantcore_gpu.compile_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", action="append",
                    help=f"virtual architecture(s) (default: {' '.join(DEFAULT_ARCHS)})")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the lowered names")
    ap.add_argument("--werror", action="store_true", help="fail on a compile warning too")
    args = ap.parse_args(argv)
    try:
        lib, path = load_nvrtc()
    except NvrtcUnavailable as exc:
        print(f"compile_check: {exc}", file=sys.stderr)
        return 2
    major, minor = nvrtc_version(lib)
    print(f"compile_check: NVRTC {major}.{minor} from {path}")
    t0 = time.perf_counter()
    results = check_all(tuple(args.arch or DEFAULT_ARCHS), lib, args.werror)
    failed = 0
    for r in results:
        n = len(kernels.SOURCES[r.source])
        if r.ok:
            print(f"  ok   {r.source} [{r.arch}] {n} kernels, {r.ptx_size} bytes of PTX, "
                  f"{r.seconds:.1f} s")
            if r.log:
                print("       NVRTC log:\n" + r.log)
            if args.verbose:
                for expr, mangled in r.lowered.items():
                    print(f"       {expr} -> {mangled}")
        else:
            failed += 1
            print(f"  FAIL {r.source} [{r.arch}]\n{r.log}")
    print(f"compile_check: {len(results) - failed} of {len(results)} compiled in "
          f"{time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
