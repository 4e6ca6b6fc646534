"""cudaemu: RawModule / RawKernel that compile CUDA C++ with g++ and the
cudaemu.h prelude and run the kernels on the CPU (see ../cudaemu.h).

Environment:
  CUDAEMU_CACHE     build cache folder (default: build/ beside cudaemu.h)
  CUDAEMU_CXX       compiler (g++)
  CUDAEMU_OPT       optimisation flags (-O2)
  CUDAEMU_SANITIZE  e.g. "undefined,float-cast-overflow" or "address,undefined"
  CUDAEMU_ARGCHECK  1 (default): an argument whose type differs from the kernel
                    parameter's is an error (CuPy would pass its bytes silently)
  and the runtime's CUDAEMU_BLOCK_ORDER / _THREAD_ORDER / _SEED /
  _SHARED_POISON / _STRICT / _STACK_KB (see cudaemu.h).
"""
import ctypes
import hashlib
import os
import re
import subprocess
import threading

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELUDE = os.path.join(HERE, "cudaemu.h")
CACHE = os.environ.get("CUDAEMU_CACHE", os.path.join(HERE, "build"))

#: launches per name expression, for the report
LAUNCHES = {}
COMPILES = []
#: bytes copied between "device" and host memory, by direction: tests count
#: what crosses (``get``, ``asnumpy``, ``item``, ``float(a)``, ... to the host;
#: ``asarray`` / ``array`` of host data, assignment of host values to the
#: device), as a profiler would on a real GPU.  Kernel arguments are not
#: transfers.
TRANSFERS = {"to_host": 0, "to_device": 0, "to_host_calls": 0, "to_device_calls": 0}


def count_transfer(direction, nbytes):
    TRANSFERS[direction] += int(nbytes)
    TRANSFERS[direction + "_calls"] += 1


class CompileException(Exception):
    pass


class CUDADriverError(RuntimeError):
    pass


class LaunchArgumentError(TypeError):
    """An argument whose bytes would not be the kernel parameter's (CuPy
    passes them unchecked: a wrong size reads garbage or the low bytes)."""


#: the NVRTC version and device architecture the fake cupy reports when it
#: assembles CuPy's options (an H100 with CUDA 12.8)
NVRTC_VERSION = (12, 8)
ARCH = "90"
#: stands in for CuPy's header folder (cupy/_core/include); need not exist
CUPY_INCLUDE = os.path.join(HERE, "cupy_include")


def cupy_rawmodule_options(options, *, jitify=False, enable_cooperative_groups=False):
    """The NVRTC options real CuPy 13.x compiles ``RawModule(code=...,
    options=options)`` with (read in CuPy 13.6's sources):

    - ``cupy/_core/core.pyx`` ``assemble_cupy_compiler_options``:
      ``--std=c++11`` appended when no ``-std=c++`` option is given; its
      three CCCL include folders first, its own include folder last (and
      ``-I$CUDA_PATH/include`` where a CUDA root exists: none here);
    - ``cupy/cuda/compiler.py`` ``_compile_with_cache_cuda``:
      ``-ftz=true`` appended after the caller's options (NVRTC honours the
      last ``-ftz``, so the caller cannot turn it off), ``--device-c`` with
      cooperative groups, ``--device-debug --generate-line-info`` with
      CUPY_CUDA_COMPILE_WITH_DEBUG=1, ``-DCUPY_USE_JITIFY`` with jitify;
    - ``compile_using_nvrtc``: ``-arch=sm_XX`` of the device, and
      ``--device-as-default-execution-space`` with NVRTC 12+.
    """
    opts = tuple(options)
    if not any("-std=c++" in o for o in opts):
        opts += ("--std=c++11",)
    inc = CUPY_INCLUDE
    opts = (f"-I{inc}/cupy/_cccl/cub", f"-I{inc}/cupy/_cccl/thrust",
            f"-I{inc}/cupy/_cccl/libcudacxx") + opts + (f"-I{inc}",)
    opts += ("-ftz=true",)
    if enable_cooperative_groups:
        opts += ("--device-c",)
    if os.environ.get("CUPY_CUDA_COMPILE_WITH_DEBUG", "") == "1":
        opts += ("--device-debug", "--generate-line-info")
    if jitify:
        opts += ("-DCUPY_USE_JITIFY",)
    opts += (f"-arch=sm_{ARCH}",)
    if NVRTC_VERSION[0] >= 12:
        opts += ("--device-as-default-execution-space",)
    return opts


def _last_bool(opt, names):
    """True / False when `opt` is one of `names` with =true / =false, else None."""
    name, _, value = opt.partition("=")
    if name in names and value in ("true", "false"):
        return value == "true"
    return None


def emulator_flags(options):
    """The g++ flags and defines that compile a module as NVRTC would with
    `options` (NVRTC honours the last of repeated options):

    - ``-ftz=true|false`` (``--ftz``): the last one sets ``-DCUDAEMU_FTZ``
      (float32 flush to zero in cudaemu_float.h); NVRTC's default is false;
    - ``--fmad=false`` must be the last ``--fmad`` (NVRTC contracts a * b + c
      into FMAs by default, and which ones cannot be reproduced);
    - ``-std=c++NN``: g++'s (at least c++17, which the prelude needs);
      ``-I`` / ``--include-path``, ``-D`` / ``-U`` pass through;
    - accepted without effect on the host code: the architecture, IEEE
      division / square root (``--prec-div=true``, ``--prec-sqrt=true``),
      ``--device-as-default-execution-space``, ``--device-c``, debug info;
    - refused: every option that changes the device's numerics in a way the
      host cannot reproduce (``--use_fast_math``, ``--prec-div=false``, ...)
      and any option not listed here.
    """
    flags, fmad, ftz, std = [], True, False, 17
    for opt in options:
        if _last_bool(opt, ("--fmad", "-fmad")) is not None:
            fmad = _last_bool(opt, ("--fmad", "-fmad"))
        elif _last_bool(opt, ("--ftz", "-ftz")) is not None:
            ftz = _last_bool(opt, ("--ftz", "-ftz"))
        elif re.fullmatch(r"-?-std=c\+\+\d\d", opt):
            std = max(17, int(opt[-2:]))
        elif opt.startswith(("-I", "-D", "-U")):
            flags.append(opt)
        elif opt.startswith("--include-path="):
            flags.append("-I" + opt.split("=", 1)[1])
        elif re.fullmatch(r"-?-(gpu-architecture|arch)=\S+", opt):
            pass
        elif opt in ("--prec-div=true", "-prec-div=true", "--prec-sqrt=true", "-prec-sqrt=true",
                     "--device-as-default-execution-space", "-default-device", "--device-c",
                     "-dc", "--device-debug", "-G", "--generate-line-info", "-lineinfo"):
            pass
        else:
            raise CompileException(
                f"cudaemu: NVRTC option {opt!r} is not emulated (it may change the device's "
                "numerics, e.g. --use_fast_math, --fmad=true, --prec-div=false)")
    if fmad:
        raise CompileException(
            "cudaemu: without --fmad=false NVRTC contracts a*b+c into FMAs (its default); the "
            "host cannot reproduce which ones, so this module cannot be emulated bit for bit")
    return [f"-std=c++{std}", f"-DCUDAEMU_FTZ={int(ftz)}"] + flags


def _launch_bounds(code):
    """{kernel base name: launch-bounds expression}"""
    out = {}
    for m in re.finditer(r"__launch_bounds__\s*\(((?:[^()]|\([^()]*\))*)\)\s*(\w+)\s*\(", code):
        out[m.group(2)] = m.group(1).split(",")[0].strip()
    return out


def _generated(code, name_expressions, name="module"):
    lb = _launch_bounds(code)
    names = list(name_expressions)
    sig_cases, launch_cases = [], []
    for i, expr in enumerate(names):
        base = expr.split("<")[0].strip()
        bound = f"(unsigned long long)({lb[base]})" if base in lb else "0ull"
        sig_cases.append(f"    case {i}: s = ::cudaemu::signature(&{expr}); break;")
        launch_cases.append(
            f"    case {i}: return ::cudaemu::launch(\"{expr}\", {bound}, &{expr}, grid, block, args);")
    return "\n".join([
        f'#include "{PRELUDE}"',
        f'#line 1 "{name}.cu"',
        code,
        '#line 1 "cudaemu_generated.cpp"',
        f"CUDAEMU_API int cudaemu_num_kernels() {{ return {len(names)}; }}",
        "CUDAEMU_API const char *cudaemu_signature(int i) {",
        "  static std::string s;",
        "  switch (i) {",
        *sig_cases,
        "    default: return nullptr;",
        "  }",
        "  return s.c_str();",
        "}",
        "CUDAEMU_API int cudaemu_launch(int i, const unsigned *grid, const unsigned *block, "
        "void **args) {",
        "  switch (i) {",
        *launch_cases,
        "    default: return -1;",
        "  }",
        "}",
        "",
    ])


def _include_digest(flags):
    h = hashlib.sha256()
    for f in flags:
        if f.startswith("-I") and os.path.isdir(f[2:]):
            for name in sorted(os.listdir(f[2:])):
                p = os.path.join(f[2:], name)
                if os.path.isfile(p) and name.endswith((".h", ".cuh", ".hpp")):
                    with open(p, "rb") as fh:
                        h.update(name.encode() + b"\0" + fh.read())
    return h.hexdigest()


def _cxx_flags():
    opt = os.environ.get("CUDAEMU_OPT", "-O2").split()
    flags = opt + ["-g", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
                   "-fno-strict-aliasing", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
                   "-fno-gnu-unique", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function",
                   "-Wno-unused-variable"]
    # a shift count outside [0, width) is a launch error (cudaemu.h: PTX
    # clamps the count, x86 masks it); the prelude's handlers (hidden, bound
    # inside the module) report it in place of UBSan's runtime
    flags += ["-fsanitize=shift-exponent"]
    san = os.environ.get("CUDAEMU_SANITIZE", "")
    if san:
        flags += [f"-fsanitize={san}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    return flags


_build_lock = threading.Lock()


def build(code, options, name_expressions, name="module"):
    """Compile to a shared library (cached); returns its path."""
    opt_flags = emulator_flags(options)
    src = _generated(code, name_expressions, name)
    cxx = os.environ.get("CUDAEMU_CXX", "g++")
    flags = _cxx_flags() + opt_flags
    prelude = b""
    for h in sorted(os.listdir(HERE)):
        if h.startswith("cudaemu") and h.endswith(".h"):
            with open(os.path.join(HERE, h), "rb") as fh:
                prelude += h.encode() + b"\0" + fh.read()
    key = hashlib.sha256(b"\0".join([src.encode(), prelude, " ".join([cxx] + flags).encode(),
                                     _include_digest(opt_flags).encode()])).hexdigest()[:24]
    os.makedirs(CACHE, exist_ok=True)
    so = os.path.join(CACHE, f"{name}-{key}.so")
    with _build_lock:
        if not os.path.exists(so):
            cpp = os.path.join(CACHE, f"{name}-{key}.cpp")
            with open(cpp, "w") as fh:
                fh.write(src)
            tmp = so + f".{os.getpid()}.tmp"
            proc = subprocess.run([cxx] + flags + ["-o", tmp, cpp], capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileException(f"cudaemu: g++ failed for {name}:\n{proc.stderr[-20000:]}")
            os.replace(tmp, so)
            COMPILES.append((name, proc.stderr.strip()))
    return so


def _shared_symbols(so):
    """(address in the file, size, name) of every function-local static
    object of the kernel code -- the __shared__ variables -- from the symbol
    table: writable sections only, not the C++ library's or cudaemu's own."""
    out = subprocess.run(["objdump", "-t", "-C", so], capture_output=True, text=True,
                         check=True).stdout
    syms, anchor = {}, None
    for line in out.splitlines():
        if "\t" not in line:
            continue
        left, right = line.split("\t", 1)
        lparts, rparts = left.split(), right.split(None, 1)
        if len(lparts) < 3 or len(rparts) != 2:
            continue
        addr, section, (size, name) = int(lparts[0], 16), lparts[-1], rparts
        if name.strip() == "cudaemu_num_kernels":
            anchor = addr
        # the enclosing function, without template arguments (a kernel's
        # may name cudaemu::fp<float>, the float of the kernel source)
        scope = name.split("(")[0]
        while re.search(r"<[^<>]*>", scope):
            scope = re.sub(r"<[^<>]*>", "", scope)
        if ("::" in name.rsplit(")", 1)[-1] and section.startswith((".bss", ".data"))
                and " O " in left + " " and not name.startswith("guard variable")
                and not scope.strip().startswith(("std::", "cudaemu", "__gnu_cxx"))):
            syms[addr] = (int(size, 16), name.strip())
    return anchor, sorted((a, n, nm) for a, (n, nm) in syms.items())


class Module:
    """A loaded kernel library."""

    def __init__(self, code, options, name_expressions, name):
        self.path = build(code, options, name_expressions, name)
        self.lib = ctypes.CDLL(self.path)
        self.lib.cudaemu_signature.restype = ctypes.c_char_p
        self.lib.cudaemu_last_error.restype = ctypes.c_char_p
        self.lib.cudaemu_launch.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint),
                                            ctypes.POINTER(ctypes.c_uint),
                                            ctypes.POINTER(ctypes.c_void_p)]
        self.names = list(name_expressions)
        self.signatures = {n: self.lib.cudaemu_signature(i).decode()
                           for i, n in enumerate(self.names)}
        anchor, syms = _shared_symbols(self.path)
        base = ctypes.cast(self.lib.cudaemu_num_kernels, ctypes.c_void_p).value - anchor
        self.shared = [(s, v, n) for v, n, s in syms]
        addrs = (ctypes.c_size_t * len(syms))(*[base + v for v, _, _ in syms])
        sizes = (ctypes.c_size_t * len(syms))(*[n for _, n, _ in syms])
        self.lib.cudaemu_register_shared(addrs, sizes, len(syms))

    def stats(self):
        buf = (ctypes.c_ulonglong * 5)()
        self.lib.cudaemu_stats(buf)
        return dict(zip(("launches", "blocks", "threads", "barriers", "collectives"), buf))


# ------------------------------------------------------- argument marshalling

def _scalar_bytes(x, ndarray_type):
    """(type code, bytes) of one launch argument, by CuPy's rules
    (cupy/cuda/function.pyx _pointer, cupy/_core/_scalar.pyx CScalar)."""
    if x is None:
        return "*", (0).to_bytes(8, "little")
    if isinstance(x, ndarray_type):
        return "*" + x.dtype.str[1:] if x.dtype.kind != "b" else "*b1", \
            int(x.data.ptr).to_bytes(8, "little")
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise TypeError(
                f"You are trying to pass a numpy.ndarray of shape {x.shape} as a kernel parameter. "
                "Only numpy.ndarrays of size one can be passed by value. If you meant to pass a "
                "pointer to __global__ memory, you need to pass a cupy.ndarray instead.")
        return x.dtype.str[1:], x.tobytes()
    t = type(x)
    if t is bool:
        v = np.bool_(x)
    elif t is float:
        v = np.float64(x)
    elif t is int:
        v = np.uint64(x) if x >= 0x8000000000000000 else np.int64(x)
    elif isinstance(x, np.generic):
        v = x
    else:
        raise TypeError(f"Unsupported type {t}")
    code = "b1" if v.dtype.kind == "b" else v.dtype.str[1:]
    return code, v.tobytes()


def _compatible(param, code, value):
    """Does an argument of `code` give the parameter `param` its intended value?"""
    if param.startswith("*"):
        if not code.startswith("*"):
            return False
        if code == "*":  # None: NULL
            return True
        want = param[2:] if param.startswith("*c") else param[1:]
        return want == code[1:] or want == "v"
    return param == code


class Kernel:
    """cupy.RawKernel stand-in: kernel(grid, block, args, shared_mem=0, stream=None)."""

    def __init__(self, module, index, name):
        self.module, self.index, self.name = module, index, name
        self.signature = module.signatures[name].split(",") if module.signatures[name] else []
        self.__name__ = name

    def __call__(self, grid, block, args, shared_mem=0, stream=None,
                 enable_cooperative_groups=False):
        from . import ndarray
        if shared_mem:
            raise CUDADriverError("cudaemu: dynamic shared memory is not emulated")
        grid = tuple(max(1, int(g)) for g in (tuple(grid) + (1, 1))[:3])
        block = tuple(max(1, int(b)) for b in (tuple(block) + (1, 1))[:3])
        args = tuple(args)
        packed = [_scalar_bytes(a, ndarray) for a in args]
        if len(packed) != len(self.signature):
            raise LaunchArgumentError(f"{self.name}: {len(packed)} arguments for "
                                      f"{len(self.signature)} parameters ({self.signature})")
        if os.environ.get("CUDAEMU_ARGCHECK", "1") != "0":
            for i, ((code, _), param) in enumerate(zip(packed, self.signature)):
                if not _compatible(param, code, args[i]):
                    raise LaunchArgumentError(
                        f"{self.name}: argument {i} is {code} ({type(args[i]).__name__}) but the "
                        f"parameter is {param}")
        # the driver copies sizeof(parameter) bytes from each pointer: pad
        # so that a too-small argument reads zeros here instead of garbage
        bufs = [ctypes.create_string_buffer(b + bytes(16), len(b) + 16) for _, b in packed]
        argv = (ctypes.c_void_p * max(1, len(bufs)))(*[ctypes.addressof(b) for b in bufs])
        g = (ctypes.c_uint * 3)(*grid)
        b = (ctypes.c_uint * 3)(*block)
        rc = self.module.lib.cudaemu_launch(self.index, g, b, argv)
        LAUNCHES[self.name] = LAUNCHES.get(self.name, 0) + 1
        if rc != 0:
            raise CUDADriverError("cudaemu: " + self.module.lib.cudaemu_last_error().decode())


class RawModule:
    """cupy.RawModule(code=..., options=..., name_expressions=...)."""

    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc",
                 translate_cucomplex=False, enable_cooperative_groups=False,
                 name_expressions=None, jitify=None):
        if code is None:
            raise CompileException("cudaemu: only RawModule(code=...) is emulated")
        if not name_expressions:
            raise CompileException("cudaemu: name_expressions are required (extern \"C\" "
                                   "kernels are not emulated)")
        self.code, self.options = code, tuple(options)
        self._jitify, self._coop = jitify, enable_cooperative_groups
        self.name_expressions = tuple(name_expressions)
        self._mod = None
        m = re.search(r"/\*\s*\n?\s*\*?\s*(\w+\.cu)", code)
        self._name = m.group(1).replace(".cu", "") if m else "module"

    @property
    def module(self):
        if self._mod is None:
            # what real CuPy compiles: the caller's options plus its own
            # (-ftz=true last among them)
            self._mod = Module(self.code, cupy_rawmodule_options(
                self.options, jitify=bool(self._jitify),
                enable_cooperative_groups=self._coop), self.name_expressions, self._name)
        return self._mod

    def compile(self, log_stream=None):
        self.module

    def get_function(self, name):
        mod = self.module
        if name not in mod.signatures:
            raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name!r} is "
                                  "not one of the name expressions)")
        return Kernel(mod, mod.names.index(name), name)
