"""Every module quantcore_gpu loads, built by the real toolchain, read by NVIDIA's tools: no GPU.

    python -m quantcore_gpu.toolchain_check [--cc 90 --cc 80 ...] [--keep DIR] [-v]

Needs real CuPy (``cupy-cuda12x``), NVRTC (``nvidia-cuda-nvrtc-cu12``) and
NVIDIA's ``nvdisasm`` / ``cuobjdump`` (the ``nvidia-cuda-nvdisasm`` and
``nvidia-cuda-cuobjdump`` wheels, or on ``PATH`` / ``$CUDA_HOME/bin``); no
driver or device: CuPy's device lookup is stubbed to each compute
capability (:func:`stub_device`).  For each one, every group of every
source (``_runtime.SOURCES``, both index widths) goes through the
project's own compile and cache code (``_runtime.module_entry``: CuPy's
``compile_using_nvrtc``, :func:`cache.whole_image`, the disk cache in a
fresh folder), and:

- the cached file (what ``RawModule(path=)`` hands the driver) is exactly
  the cubin NVRTC produced (read with ``nvrtcGetCUBIN`` from CuPy's own
  program handle: CuPy's ``getCUBIN`` returns one byte less) and covers
  its ELF extent;
- ``nvdisasm`` and ``cuobjdump -sass`` accept it;
- its SASS has no ``MUFU.EX2 / LG2 / SIN / COS / SQRT`` (approximations;
  IEEE division and square root use ``MUFU.RCP`` / ``MUFU.RSQ`` seeds that
  their refinement makes exact).  SASS ``.FTZ`` is not a finding: ptxas
  writes it in sequences of its own whose result it cannot change
  (``FSETP.NEU.FTZ`` of a NaN test, ``F2I.FTZ`` in integer division,
  ``FADD.FTZ`` in the IEEE division's scaling: 0 / 24-384 per module with
  NVRTC 12.9 and no ``.ftz`` in the PTX), and ``FFMA`` likewise (the
  division's Newton steps);
- the PTX NVRTC made on the way (``nvrtcGetPTX`` of the same program) has
  no ``.ftz``, no ``.approx`` and no ``fma.rn`` unless a file the source
  includes writes an explicit ``fma`` / ``fmaf`` (with ``--fmad=false``
  NVRTC contracts nothing; ptxas keeps PTX's separate ``mul`` / ``add``).

Exit status 0: all passed; 1: a check failed; 2: a tool is missing.
"""
import argparse
import ctypes
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from . import _runtime, cache
from . import compile_check as cc_

#: compute capabilities checked by default (NVRTC 12.9 builds cubins for each)
DEFAULT_CC = ("90", "80", "100")
#: SASS opcodes that are approximations
SASS_BANNED = re.compile(r"\bMUFU\.(EX2|LG2|SIN|COS|SQRT)\b")
#: PTX that is an approximation, a flush or a contraction
PTX_BANNED = re.compile(r"\.ftz\b|\.approx\b|\bfma\.rn\b")
_EXPLICIT_FMA = re.compile(r"\b(fmaf?|qc_fma|__fmaf?_rn|__fma_rn)\s*\(")


class ToolMissing(RuntimeError):
    """CuPy, NVRTC or an NVIDIA tool is not installed."""


def find_tool(name):
    """The path of NVIDIA's ``name`` (nvdisasm, cuobjdump): the pip wheels'
    ``nvidia/cu13/bin`` / ``nvidia/cuda_<name>/bin``, ``PATH``,
    ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec else []
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "*", "bin", name))):
            if os.access(path, os.X_OK):
                return path
    found = shutil.which(name)
    if found:
        return found
    for root in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        path = os.path.join(root, "bin", name)
        if os.access(path, os.X_OK):
            return path
    raise ToolMissing(f"{name} not found (pip install nvidia-cuda-{name}, or a CUDA toolkit)")


def stub_device(cc):
    """Make real CuPy believe the current device has compute capability
    ``cc`` without a driver: ``cupy.cuda.Device`` gives ``cc`` and the
    compiler's memoized per-device architecture choice is replaced by its
    own undecorated body (``__wrapped__``) over a stubbed ``_get_arch``
    (CuPy's rule: ``min(cc, NVRTC's newest)``)."""
    import cupy
    from cupy.cuda import compiler

    class Device:
        compute_capability = str(cc)

        def __init__(self, *args):
            pass

    cupy.cuda.Device = Device
    newest = getattr(compiler, "_get_max_compute_capability", lambda: cc)()
    compiler._get_arch = lambda: min(str(cc), str(newest), key=int)
    chooser = compiler._get_arch_for_options_for_nvrtc
    compiler._get_arch_for_options_for_nvrtc = getattr(chooser, "__wrapped__", chooser)


class _Spy:
    """Wraps CuPy's ``nvrtc.getCUBIN``: before CuPy reads the cubin, the
    same program's whole cubin and PTX are read through ctypes from the
    libnvrtc CuPy loaded (one process, one library: the handle is shared)."""

    def __init__(self):
        from cupy_backends.cuda.libs import nvrtc
        self.nvrtc, self.real = nvrtc, nvrtc.getCUBIN
        self.lib = None
        self.seen = []    # (whole cubin, PTX text, CuPy's bytes)

    def __enter__(self):
        self.nvrtc.getCUBIN = self
        return self

    def __exit__(self, *exc):
        self.nvrtc.getCUBIN = self.real

    def _library(self):
        if self.lib is None:
            info = _runtime._nvrtc_library()
            paths = [line.split(None, 5)[-1].strip() for line in open("/proc/self/maps")
                     if info and line.rstrip().endswith(info[0])]
            if not paths:
                raise ToolMissing("the libnvrtc CuPy loaded is not a mapped file")
            self.lib = ctypes.CDLL(paths[0])
            cc_._declare(self.lib)
        return self.lib

    def __call__(self, prog):
        lib, c = self._library(), ctypes
        handle = c.c_void_p(prog)
        size = c.c_size_t()
        lib.nvrtcGetCUBINSize(handle, c.byref(size))
        buf = c.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(handle, buf)
        lib.nvrtcGetPTXSize(handle, c.byref(size))
        ptx = c.create_string_buffer(size.value)
        lib.nvrtcGetPTX(handle, ptx)
        got = self.real(prog)
        self.seen.append((buf.raw, ptx.value.decode(errors="replace"), bytes(got)))
        return got


def device_texts(source):
    """{file name: text without comments} of the device source ``source``
    and every header it includes (:func:`cache.closure`, searched in
    ``_runtime.cuda_dir()`` then ``_runtime.include_dir()``)."""
    dirs = (_runtime.cuda_dir(), _runtime.include_dir())
    out = {}
    for name in cache.closure(source, _runtime.read_source(source), dirs):
        for folder in dirs:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as fh:
                    out[name] = re.sub(r"/\*.*?\*/|//[^\n]*", "", fh.read(), flags=re.S)
                break
    return out


def _explicit_fma(source):
    """True when the source or a header it includes writes an fma call."""
    return any(_EXPLICIT_FMA.search(text) for text in device_texts(source).values())


def _tool(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr.strip()


def check_module(source, group, tools, fma_ok):
    """[problem, ...] of one module on the stubbed device, and its stats."""
    problems, stats = [], {}
    with _Spy() as spy:
        entry = _runtime.module_entry(source, group)
    stats["seconds"] = entry.seconds
    with open(entry.path, "rb") as fh:
        data = fh.read()
    stats["bytes"] = len(data)
    if not spy.seen:
        return ["compiled nowhere (the cache folder was not fresh)"], stats
    whole, ptx, cupys = spy.seen[-1]
    if data != whole:
        problems.append(f"the cached image ({len(data)} bytes) is not NVRTC's cubin "
                        f"({len(whole)} bytes; CuPy returned {len(cupys)})")
    extent = cache.elf_extent(data)
    if extent != len(data):
        problems.append(f"{len(data)} bytes against an ELF extent of {extent}")
    rc, sass, err = _tool([tools["nvdisasm"], entry.path])
    if rc:
        problems.append(f"nvdisasm refused it: {err[-300:]}")
    rc2, dump, err2 = _tool([tools["cuobjdump"], "-sass", entry.path])
    if rc2:
        problems.append(f"cuobjdump refused it: {err2[-300:]}")
    for text, what, banned in ((sass + dump, "SASS", SASS_BANNED), (ptx, "PTX", PTX_BANNED)):
        hits = {}
        for m in banned.finditer(text):
            hits[m.group(0)] = hits.get(m.group(0), 0) + 1
        if what == "PTX" and fma_ok:
            hits.pop("fma.rn", None)
        if hits:
            problems.append(f"{what}: " + ", ".join(f"{k} x{v}" for k, v in sorted(hits.items())))
    stats["fma.rn"] = len(re.findall(r"\bfma\.rn\b", ptx))
    return problems, stats


def run(ccs=DEFAULT_CC, keep=None, verbose=False, out=print):
    """Check every module for each compute capability; the number of failed
    modules (see the module docstring)."""
    try:
        import cupy
        tools = {t: find_tool(t) for t in ("nvdisasm", "cuobjdump")}
    except ImportError as exc:
        raise ToolMissing(f"cupy: {exc}") from None
    folder = keep or tempfile.mkdtemp(prefix="qc-toolchain-")
    os.environ["QUANTCORE_KERNEL_CACHE"] = folder
    out(f"toolchain_check: CuPy {cupy.__version__}, NVRTC "
        f"{'.'.join(map(str, cupy.cuda.nvrtc.getVersion()))}, {tools['nvdisasm']}")
    fma_ok = {s: _explicit_fma(s) for s in _runtime.SOURCES}
    failed = 0
    t_all = time.perf_counter()
    for cc in ccs:
        stub_device(cc)
        t0 = time.perf_counter()
        n = 0
        for source in sorted(_runtime.SOURCES):
            for group in _runtime.module_groups(source):
                n += 1
                problems, stats = check_module(source, group, tools, fma_ok[source])
                failed += bool(problems)
                line = (f"  {'FAIL' if problems else 'ok  '} sm_{cc} {source} {group}: "
                        f"{stats.get('bytes', 0)} bytes, {stats.get('seconds', 0):.1f} s, "
                        f"fma.rn {stats.get('fma.rn', 0)}")
                if problems or verbose:
                    out(line + "".join("\n      " + p for p in problems))
        out(f"toolchain_check: sm_{cc}: {n} modules in {time.perf_counter() - t0:.1f} s")
    out(f"toolchain_check: {failed} failed, {time.perf_counter() - t_all:.1f} s in all")
    if keep is None:
        shutil.rmtree(folder, ignore_errors=True)
    return failed


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m quantcore_gpu.toolchain_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", action="append", help=f"compute capability (default: "
                    f"{' '.join(DEFAULT_CC)})")
    ap.add_argument("--keep", help="the cache folder to use and keep (default: a temporary one)")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line for every module")
    args = ap.parse_args(argv)
    try:
        failed = run(tuple(args.cc or DEFAULT_CC), args.keep, args.verbose)
    except ToolMissing as exc:
        print(f"toolchain_check: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
