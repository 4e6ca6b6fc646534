"""GPU twins of ``quantcore/_cpu/_kernels.pyx``: CuPy RawModule launches.

Every function named like a CPU kernel entry point takes the same
parameters, with C-contiguous 1-D cupy arrays where the CPU takes numpy
arrays (numpy parameter arrays are copied to the device), and computes
bit-identical results on the current device and stream.  ``nthreads`` is
accepted and ignored.  Differences:

- ``minmax`` returns 0-d cupy arrays (lo, hi, flags) instead of Python
  scalars (no host synchronisation); ``minmax_channels`` returns cupy
  arrays.  As on the CPU they are unfinished; ``minmax_finish`` (or
  ``finish=`` of :func:`minmax_device`) applies the NaN / signed-zero rule,
  after which the results equal the CPU's bit for bit.
- :func:`observe` + :func:`ew` with the state's ``qp`` are the fused
  FakeQuantize forward: the reduction's last block updates the observer
  state and writes scale / zero point to device memory, and the fake-quant
  kernel reads them there.  Two launches, no host synchronisation.

Sources are ``cuda/*.cu`` beside this module; they ``#include`` the headers
of ``quantcore/include`` (``qc_families.h``: the elementwise families,
whose list this module reads to instantiate the generic kernel for each).
Each source's kernels are compiled in two modules (32-bit index and
64-bit index; the second on first need) with exactly
:func:`compile_options` (no flush-to-zero, IEEE division and square root,
``--fmad=false``; never ``--use_fast_math``) by NVRTC into a binary for
the device's architecture, kept in the on-disk cache of
:mod:`quantcore_gpu.cache` and loaded with ``cupy.RawModule(path=...)``:
never through ``RawModule(code=...)``, which appends ``-ftz=true``.
Launch arguments are numpy scalars of the kernel's parameter types.

Importing this module does not import cupy.
"""
import functools
import importlib.util
import os
import re
import threading
import time

import numpy as np

from . import cache as _cache

__all__ = [
    "SOURCES", "FAMILIES", "FAMILY_PARAMS", "compile_options", "include_dir", "cuda_dir",
    "minmax", "minmax_channels", "minmax_finish", "minmax_device",
    "ew", "ew_tensor", "fq_affine_exact", "ste", "histc_f32", "histogram_f32", "qparams",
    "QP_SCHEMES", "ObserverState", "observe",
    "ENCODE_FAMILIES", "DECODE_FAMILIES", "GROUP_RECIPES", "encode", "decode", "encode_groups",
    "decode_groups", "group_quant", "BLOCK_RECIPES", "block_scaled_quant",
    "numpy_row_sums", "numpy_column_sums", "lsq_grads", "module_groups", "module_fields",
    "warm_up", "MODULE_LOG",
]

# --------------------------------------------------------------- sources

_FLOATS = ("float", "double")
_INDEX = ("unsigned int", "unsigned long long")


def _listed(header, macro, field):
    """[(name, struct, struct's enum ``field``)] in id order, as the X-macro
    ``macro`` of ``header`` lists them (the one declaration)."""
    with open(os.path.join(include_dir(), header), encoding="utf-8") as fh:
        text = fh.read()
    block = text[text.index(f"#define {macro}(X)"):]
    block = block[:block.index("\n\n")]
    entries = re.findall(r"X\((\w+), (\w+)\)", block)
    values = dict(re.findall(r"struct (\w+) \{\s*enum \{ " + field + r" = (\d+)", text))
    return [(name, struct, int(values[struct])) for name, struct in entries]


def _families():
    """[(name, Op struct, NP)] of the elementwise families (QC_EW_FAMILIES
    in qc_families.h)."""
    return _listed("qc_families.h", "QC_EW_FAMILIES", "NP")


def _schemes():
    """[(name, Scheme struct, NOUT)] of the qparams schemes (QC_QP_SCHEMES
    in qc_qparams.h)."""
    return _listed("qc_qparams.h", "QC_QP_SCHEMES", "NOUT")


def _names(families):
    ops = [op for _, op, _ in families]
    fq = []
    for t in _FLOATS:
        for i in _INDEX:
            for op in ops:
                for pc in ("false", "true"):
                    fq.append(f"qc_ew<{op}, {t}, {i}, {pc}>")
            fq.append(f"qc_ste<{t}, {i}>")
    mm = []
    for t in _FLOATS:
        for i in _INDEX:
            mm.append(f"qc_minmax_rows<{t}, {i}>")
            mm.append(f"qc_minmax_cols<{t}, {i}>")
            mm.append(f"qc_minmax_chan<{t}, {i}>")
        mm.append(f"qc_minmax_finish_all<{t}>")
    hist = tuple(f"{k}<{i}>" for k in ("qc_histc", "qc_hist_edges") for i in _INDEX)
    exact = tuple(f"qc_affine_exact<{t}, {i}>" for t in _FLOATS for i in _INDEX)
    qp = tuple(f"qc_qparams<{scheme}, {t}>" for _, scheme, _ in _schemes() for t in _FLOATS)
    red = tuple(f"qc_pw_leaves<{acc}, float, {i}>" for acc in _FLOATS for i in _INDEX) + \
        tuple(f"qc_pw_level<{acc}, {i}>" for acc in _FLOATS for i in _INDEX) + \
        tuple(f"qc_column_sums<float, {i}>" for i in _INDEX)
    return {"fake_quant.cu": tuple(fq), "minmax.cu": tuple(mm), "histogram.cu": hist,
            "qparams.cu": qp, "exact.cu": exact, "reduce.cu": red,
            "lsq.cu": tuple(f"qc_lsq_grads<{i}>" for i in _INDEX)}


#: NVRTC options besides the include directory: the numerical contract,
#: each stated (no flush-to-zero of float32 subnormals, IEEE-rounded
#: division and square root, no contraction of a * b + c into FMA), never
#: --use_fast_math.  The modules are compiled with exactly these (plus the
#: architecture): see ``_compile``.
BASE_OPTIONS = ("--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false",
                "-std=c++17")

_THREADS = 256        # threads per block of every kernel
_MM_THREADS = 256     # QC_MM_THREADS in minmax.cu
#: per-channel reductions with at most this many values per channel (and
#: inner > 1) use qc_minmax_chan: a thread group per channel instead of a
#: block (or more) per channel
_MM_CHAN_WORK = 2048
_VEC = {np.dtype(np.float32): 4, np.dtype(np.float64): 2}
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

#: tests set this to run the 64-bit index instantiations on small arrays
FORCE_INDEX64 = False


def cuda_dir():
    """The folder of the .cu sources."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda")


def include_dir():
    """quantcore/include, located without importing quantcore (so that the
    compile check needs no built extension)."""
    spec = importlib.util.find_spec("quantcore")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("quantcore_gpu: the quantcore package (for include/qc_elementwise.h) "
                           "cannot be found")
    return os.path.join(list(spec.submodule_search_locations)[0], "include")


def read_source(name):
    with open(os.path.join(cuda_dir(), name), encoding="utf-8") as fh:
        return fh.read()


_FAMILY_LIST = _families()
#: every .cu source and the template instantiations (name expressions) used
SOURCES = _names(_FAMILY_LIST)


def _format_lists():
    """The encode / decode families [(name, Op, NP, CODE_BYTES)] and the group
    recipes [(name, struct)] of qc_families.h (QC_ENCODE_FAMILIES,
    QC_DECODE_FAMILIES, QC_GROUP_RECIPES), in id order."""
    with open(os.path.join(include_dir(), "qc_families.h"), encoding="utf-8") as fh:
        text = fh.read()
    info = {op: (int(np_), int(cb)) for op, np_, cb in re.findall(
        r"struct (\w+) \{\s*enum \{ NP = (\d+), STATIC_BITS = [^,]+,\s*CODE_BYTES = (\d+) \}",
        text)}

    def listed(macro):
        block = text[text.index(f"#define {macro}(X)"):]
        return re.findall(r"X\((\w+), (\w+)\)", block[:block.index("\n\n")])
    enc = [(n, op) + info[op] for n, op in listed("QC_ENCODE_FAMILIES")]
    dec = [(n, op) + info[op] for n, op in listed("QC_DECODE_FAMILIES")]
    return enc, dec, listed("QC_GROUP_RECIPES")


_ENC_LIST, _DEC_LIST, _RECIPE_LIST = _format_lists()
_CODE_TYPES = {1: "unsigned char", 2: "unsigned short"}


def _format_names():
    names = []
    for kernel, families in (("qc_enc", _ENC_LIST), ("qc_dec", _DEC_LIST)):
        for _, op, _, cb in families:
            for t in _FLOATS:
                for width, q in _CODE_TYPES.items():
                    if cb & width:
                        for i in _INDEX:
                            for layout in (0, 1, 2):
                                names.append(f"{kernel}<{op}, {t}, {q}, {i}, {layout}>")
    for _, rec in _RECIPE_LIST:
        for i in _INDEX:
            names.append(f"qc_group<{rec}, {i}>")
    return tuple(names)




def _block_recipes():
    """The block-scaled recipes [(name, struct)] of qc_families.h
    (QC_BLOCK_RECIPES), in id order."""
    with open(os.path.join(include_dir(), "qc_families.h"), encoding="utf-8") as fh:
        text = fh.read()
    block = text[text.index("#define QC_BLOCK_RECIPES(X)"):]
    return re.findall(r"X\((\w+), (\w+)\)", block[:block.index("\n\n")])


_BLOCK_LIST = _block_recipes()
SOURCES["formats.cu"] = _format_names() + tuple(
    f"qc_block_scaled<{rec}, {i}>" for _, rec in _BLOCK_LIST for i in _INDEX)
#: block-scaled recipe name -> id (the CPU extension's BLOCK_RECIPES)
BLOCK_RECIPES = {name: i for i, (name, _) in enumerate(_BLOCK_LIST)}
#: encode / decode family name -> id and group recipe name -> id (the CPU
#: extension's ids: the same lists)
ENCODE_FAMILIES = {name: i for i, (name, *_) in enumerate(_ENC_LIST)}
DECODE_FAMILIES = {name: i for i, (name, *_) in enumerate(_DEC_LIST)}
GROUP_RECIPES = {name: i for i, (name, _) in enumerate(_RECIPE_LIST)}
#: elementwise family name -> id (the CPU extension's ids: the same list)
FAMILIES = {name: i for i, (name, _, _) in enumerate(_FAMILY_LIST)}
#: family name -> number of per-channel parameters
FAMILY_PARAMS = {name: n for name, _, n in _FAMILY_LIST}
_SCHEME_LIST = _schemes()
#: qparams scheme name -> (id, number of outputs): the CPU extension's
QP_SCHEMES = {name: (i, n) for i, (name, _, n) in enumerate(_SCHEME_LIST)}


def compile_options():
    """The NVRTC options of every source (the compile adds the architecture)."""
    return tuple(BASE_OPTIONS) + (f"-I{include_dir()}",)


_INDEX64 = "unsigned long long"


def module_groups(source):
    """{group: name expressions} of a source: "i32" (32-bit index and no
    index) and "i64" (64-bit index; compiled on first need)."""
    names = SOURCES[source]
    groups = {"i32": tuple(n for n in names if _INDEX64 not in n),
              "i64": tuple(n for n in names if _INDEX64 in n)}
    return {g: v for g, v in groups.items() if v}


# ------------------------------------------------------- module factory

_lock = threading.Lock()
_modules = {}     # (device id, source, group) -> (cupy.RawModule, {name: lowered name})
_module_locks = {}  # (device id, source, group) -> threading.Lock
_functions = {}   # (device id, name expression) -> cupy.RawKernel
_device_info = {}  # device id -> SM count
_local = threading.local()   # .counters: (device id, stream ptr) -> uint32[1] device counter
#: every module this process obtained, in order: (device id, source, group,
#: "compiled" or "loaded", seconds from the request to the loaded module)
MODULE_LOG = []


def _cupy():
    import cupy
    return cupy


def _device_id():
    return _cupy().cuda.runtime.getDevice()


def _target():
    """What the binary depends on besides the sources and options: the
    compiler (NVRTC, the version CuPy loaded), the current device's compute
    capability (CuPy compiles for ``sm_<cc>``, or ``compute_<cc>`` PTX
    beyond the NVRTC's newest architecture or with CUPY_COMPILE_WITH_PTX)."""
    cp = _cupy()
    return {"compiler": "nvrtc", "nvrtc": [int(v) for v in cp.cuda.nvrtc.getVersion()],
            "cc": str(cp.cuda.Device().compute_capability),
            "ptx": os.environ.get("CUPY_COMPILE_WITH_PTX", "0").lower() in ("1", "true", "yes",
                                                                          "on")}


def module_fields(source, group, target):
    """The cache-key fields of one module (see :mod:`quantcore_gpu.cache`)."""
    inc = f"-I{include_dir()}"
    return {"source": source, "group": group,
            "files": _cache.closure(source, read_source(source), (cuda_dir(), include_dir())),
            "options": ["-I<quantcore/include>" if o == inc else o for o in compile_options()],
            "names": list(module_groups(source)[group]), "target": target}


def _compile(source, names):
    """NVRTC through ``cupy.cuda.compiler.compile_using_nvrtc``: exactly
    :func:`compile_options` plus the architecture (``-arch=sm_<cc>``) and
    ``--device-as-default-execution-space`` (CuPy's additions on that path;
    no ``-ftz``, unlike ``RawModule(code=...)``).  (binary, {name: lowered})."""
    from cupy.cuda import compiler
    binary, mapping = compiler.compile_using_nvrtc(
        read_source(source), compile_options(), filename=source, name_expressions=names)
    return bytes(binary), dict(mapping)


def _load(entry):
    """``cupy.RawModule(path=...)`` of a cache entry's binary, loaded now."""
    mod = _cupy().RawModule(path=entry.path)
    mod.get_function(next(iter(entry.lowered.values())))   # (the driver loads it here)
    return mod


def _module(source, group):
    """(module, lowered names) of one group of a source on the current
    device: from the in-process table, else the disk cache, else compiled
    (and cached).  One lock per module: different modules can compile at
    once (NVRTC runs without the GIL)."""
    cp = _cupy()
    key = (_device_id(), source, group)
    found = _modules.get(key)
    if found is None:
        with _lock:
            lock = _module_locks.setdefault(key, threading.Lock())
        with lock:
            found = _modules.get(key)
            if found is None:
                t0 = time.perf_counter()
                fields = module_fields(source, group, _target())
                names = module_groups(source)[group]
                entry = _cache.get_module(fields, names, lambda: _compile(source, names))
                try:
                    mod = _load(entry)
                except cp.cuda.driver.CUDADriverError:
                    if entry.compiled:
                        raise
                    # an entry the driver refuses (e.g. written for another driver) is a miss
                    _cache.REJECTED.append((_cache.key_of(fields), "the driver refused it"))
                    entry = _cache.get_module(fields, names, lambda: _compile(source, names),
                                              force=True)
                    mod = _load(entry)
                MODULE_LOG.append((key[0], source, group,
                                   "compiled" if entry.compiled else "loaded",
                                   time.perf_counter() - t0))
                found = _modules[key] = (mod, entry.lowered)
    return found


def _function(source, name):
    key = (_device_id(), name)
    fn = _functions.get(key)
    if fn is None:
        mod, lowered = _module(source, "i64" if _INDEX64 in name else "i32")
        if name not in lowered:
            raise KeyError(f"quantcore_gpu: {name!r} is not a kernel of {source}")
        fn = mod.get_function(lowered[name])
        _functions[key] = fn
    return fn


def warm_up(index64=False, sources=None, workers=None):
    """Obtain every module of the current device now (from the disk cache
    or compiled, ``workers`` at a time: default one per CPU, at most 8),
    the 64-bit-index groups too when ``index64``; ``sources``: a subset of
    ``SOURCES``.  Returns the new ``MODULE_LOG`` records."""
    from concurrent.futures import ThreadPoolExecutor
    cp = _cupy()
    dev = _device_id()
    todo = [(s, g) for s in sorted(sources or SOURCES) for g in module_groups(s)
            if g == "i32" or index64]

    def get(item):
        with cp.cuda.Device(dev):
            return _module(*item)
    start = len(MODULE_LOG)
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(get, todo))
    return MODULE_LOG[start:]


def _sm_count():
    dev = _device_id()
    n = _device_info.get(dev)
    if n is None:
        n = int(_cupy().cuda.Device(dev).attributes["MultiProcessorCount"])
        _device_info[dev] = n
    return n


def _counter():
    """A zeroed uint32 counter for the reductions launched by this thread
    on the current device and stream; the last block of each reduction
    leaves it at 0 again.  Per thread as well as per stream: with
    CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 every thread's default stream has
    the same ``ptr``, but the threads' launches run concurrently."""
    cp = _cupy()
    counters = getattr(_local, "counters", None)
    if counters is None:
        counters = _local.counters = {}
    key = (_device_id(), cp.cuda.get_current_stream().ptr)
    c = counters.get(key)
    if c is None:
        c = counters[key] = cp.zeros(1, dtype=np.uint32)
    return c


def _index(n):
    """(ctype, numpy type) of the index: 64-bit when n >= 2**31."""
    if FORCE_INDEX64 or n >= 2 ** 31:
        return "unsigned long long", np.uint64
    return "unsigned int", np.uint32


def _grid(n):
    """Blocks of a grid-stride launch over n threads' worth of work (at
    most 32 blocks per SM)."""
    return max(1, min(-(-n // _THREADS), _sm_count() * 8 * 4))


def _ew_grid(n, dtype):
    """Blocks of a grid-stride elementwise launch (``_VEC`` values a thread
    at a time)."""
    return _grid(-(-n // _VEC[dtype]))


def _dt(a):
    return np.dtype(a.dtype)


def _check(x, name="x"):
    cp = _cupy()
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"quantcore_gpu: {name} must be a cupy.ndarray, got {type(x).__name__}")
    if x.ndim != 1 or not x.flags.c_contiguous:
        raise ValueError(f"quantcore_gpu: {name} must be a C-contiguous 1-D array, got shape "
                         f"{x.shape} strides {x.strides}")
    return x


def _param(p, dtype):
    """Parameters as a contiguous device array of dtype (host arrays are
    copied to the device; device arrays of dtype are used in place)."""
    cp = _cupy()
    return cp.ascontiguousarray(cp.asarray(p, dtype=dtype)).reshape(-1)


def _mask_arg(mask):
    """None / empty mask -> NULL, as the CPU's _base()."""
    if mask is None or mask.size == 0:
        return None
    return _check(mask, "mask")


def _launch_ew(kernel, dtype, n, args):
    """A grid-stride launch of `kernel` (a template over <T, I>) on n
    elements; _Idx arguments become the index type."""
    ct, it = _index(n)
    fn = _function("fake_quant.cu", f"{kernel}<{_CTYPE[dtype]}, {ct}>")
    fn((_ew_grid(n, dtype),), (_THREADS,), tuple(it(a) if isinstance(a, _Idx) else a
                                                   for a in args))


class _Idx(int):
    """An index argument: converted to the index type of the launch."""


# ------------------------------------------------------------ min / max

class _Last:
    """The last-block arguments of the reduction kernels (QC_MM_LAST_PARAMS)."""

    def __init__(self, dtype):
        self.T = dtype.type
        self.out_lo = self.out_hi = self.out_fl = None
        self.finish_mode = 0
        self.st_min = self.st_max = self.st_cnt = None
        self.obs_mode = 0
        self.avg_c = self.avg_d = 0.0
        self.qscheme = 0
        self.eps = 0.0
        self.qmin = self.qmax = self.sym_zp = 0
        self.q_scale = self.q_zp = self.qp = None

    def args(self):
        return (self.out_lo, self.out_hi, self.out_fl, np.int32(self.finish_mode),
                self.st_min, self.st_max, self.st_cnt, np.int32(self.obs_mode),
                np.float32(self.avg_c), np.float32(self.avg_d), np.int32(self.qscheme),
                np.float32(self.eps),
                np.int64(self.qmin), np.int64(self.qmax),
                np.int64(self.sym_zp), self.q_scale, self.q_zp, self.qp)


def _reduce(x, outer, C, inner, last, counter=None):
    """Launch the one-pass reduction of the (outer, C, inner) view of x with
    last-block arguments ``last``.  Requires x.size > 0 and C > 0."""
    cp = _cupy()
    dtype = _dt(x)
    n = int(x.size)
    if C == 1:
        outer, inner = 1, n
    counter = _counter() if counter is None else counter
    target = _sm_count() * 8
    ct, it = _index(n)
    T = _CTYPE[dtype]
    if C > 1 and inner > 1 and outer * inner <= _MM_CHAN_WORK:
        work = outer * inner
        lanes = 1
        while lanes < 32 and lanes * 16 < work:   # ~16 values or more per thread
            lanes *= 2
        groups = _MM_THREADS // lanes
        grid = max(1, min(-(-C // groups), target * 4))
        part = C
        fn = _function("minmax.cu", f"qc_minmax_chan<{T}, {ct}>")
        head = (x, it(outer), it(C), it(inner), np.uint32(lanes))
    elif inner == 1 and C > 1:
        tw = min(C, _MM_THREADS)
        nt = -(-C // tw)
        lanes = _MM_THREADS // tw
        g = max(1, min(-(-target // nt), -(-outer // (lanes * 4)), 65535))
        part = g * C
        fn = _function("minmax.cu", f"qc_minmax_cols<{T}, {ct}>")
        head = (x, it(outer), it(C), np.uint32(tw), np.uint32(nt), np.uint32(g))
        grid = nt * g
    else:
        work = outer * inner
        max_p = max(1, -(-work // (_MM_THREADS * _VEC[dtype] * 4)))
        p = max(1, min(-(-target // C), max_p, 4096))
        part = C * p
        fn = _function("minmax.cu", f"qc_minmax_rows<{T}, {ct}>")
        head = (x, it(outer), it(C), it(inner), np.uint32(p))
        grid = C * p
    plo = cp.empty(part, dtype=dtype)
    phi = cp.empty(part, dtype=dtype)
    pfl = cp.empty(part, dtype=np.uint8)
    fn((grid,), (_MM_THREADS,), head + (plo, phi, pfl, counter) + last.args())


def minmax_device(x, outer, C, inner, out_lo, out_hi, out_flags=None, finish=0):
    """Per-channel (lo, hi, flags) of the (outer, C, inner) view into device
    arrays in one launch; ``finish``: 0 raw, 1 the NaN / signed-zero rule,
    2 the rule with NaNs omitted (``nan_policy="omit"``).  Per tensor:
    outer = 1, C = 1, inner = x.size."""
    _check(x)
    dtype = _dt(x)
    if x.size == 0 or C == 0:
        if C:
            out_lo.fill(np.inf)
            out_hi.fill(-np.inf)
            if out_flags is not None:
                out_flags.fill(0)
        return
    last = _Last(dtype)
    last.out_lo, last.out_hi, last.out_fl = out_lo, out_hi, out_flags
    last.finish_mode = int(finish)
    _reduce(x, int(outer), int(C), int(inner), last)


def minmax(x, nthreads=None):
    """Per-tensor (min, max, flags) in one pass, unfinished (see the CPU
    kernel); 0-d cupy arrays.  Empty x gives (+inf, -inf, 0)."""
    cp = _cupy()
    _check(x)
    dtype = _dt(x)
    lo = cp.full(1, np.inf, dtype=dtype)
    hi = cp.full(1, -np.inf, dtype=dtype)
    fl = cp.zeros(1, dtype=np.uint8)
    if x.size:
        minmax_device(x, 1, 1, x.size, lo, hi, fl)
    return lo.reshape(()), hi.reshape(()), fl.reshape(())


def minmax_channels(x, outer, C, inner, nthreads=None):
    """Per-channel (min[C], max[C], flags[C]) of the (outer, C, inner) view."""
    cp = _cupy()
    _check(x)
    dtype = _dt(x)
    C = int(C)
    lo = cp.full(C, np.inf, dtype=dtype)
    hi = cp.full(C, -np.inf, dtype=dtype)
    fl = cp.zeros(C, dtype=np.uint8)
    if x.size and C:
        minmax_device(x, outer, C, inner, lo, hi, fl)
    return lo, hi, fl


def minmax_finish(lo, hi, flags):
    """In place on device arrays: the NaN / signed-zero rule."""
    cp = _cupy()
    lo = lo.reshape(-1)
    hi = hi.reshape(-1)
    fl = cp.ascontiguousarray(cp.asarray(flags, dtype=np.uint8)).reshape(-1)
    n = int(lo.size)
    if n == 0:
        return
    fn = _function("minmax.cu", f"qc_minmax_finish_all<{_CTYPE[_dt(lo)]}>")
    fn((max(1, min(-(-n // _THREADS), 1024)),), (_THREADS,), (lo, hi, fl, np.uint64(n)))


# -------------------------------------------------------------- elementwise

def _ew_launch(family, x, y, mask, C, inner, params, p, u0, u1, mode):
    _check(x)
    _check(y, "y")
    n = int(x.size)
    if n == 0:
        return
    if not 0 <= int(family) < len(_FAMILY_LIST):
        raise ValueError(f"ew: unknown family {family}")
    dtype = _dt(x)
    T = dtype.type
    op = _FAMILY_LIST[int(family)][1]
    C = int(C)
    ct, it = _index(n)
    pc = "true" if C > 1 else "false"
    fn = _function("fake_quant.cu", f"qc_ew<{op}, {_CTYPE[dtype]}, {ct}, {pc}>")
    fn((_ew_grid(n, dtype),), (_THREADS,),
       (x, y, _mask_arg(mask), it(n), it(C), it(inner), params, *(T(v) for v in p), T(u0), T(u1),
        np.int32(mode)))


def ew(family, x, y, mask, outer, C, inner, params, u0, u1, mode, nthreads=None):
    """Elementwise family ``family`` (``FAMILIES``) over the (outer, C,
    inner) view of x into y (may alias x), as the CPU's ``ew``: params holds
    the family's NP parameters as NP arrays of C values (``params[j * C +
    c]``), a device array (read there: e.g. ``ObserverState.qp``, written by
    :func:`observe`) or a host array (copied to the device)."""
    nparams = _FAMILY_LIST[int(family)][2] * int(C) if 0 <= int(family) < len(_FAMILY_LIST) \
        else 0
    params = _param(params, _dt(x))
    if params.size < nparams:
        raise ValueError(f"ew: expected {nparams} parameters, got {params.size}")
    _ew_launch(family, x, y, mask, C, inner, params, (0.0,) * 5, u0, u1, mode)


def ew_tensor(family, x, y, mask, p0, p1, p2, p3, p4, u0, u1, mode, nthreads=None):
    """:func:`ew` per tensor with the parameters as launch arguments (no
    copy to the device)."""
    _ew_launch(family, x, y, mask, 1, int(x.size), None, (p0, p1, p2, p3, p4), u0, u1, mode)


def fq_affine_exact(x, y, mask, C, inner, scale, inv, zp, qmin, qmax, mode, nthreads=None):
    """PyTorch's affine fake quant with exact integer zero points and range
    (qc_fq_affine_exact) over the C-ordered (outer, C, inner) view of x, as
    the CPU's ``fq_affine_exact``: scale / inv of x's dtype and zp float64,
    C values each (device arrays used in place, host ones copied)."""
    _check(x)
    _check(y, "y")
    n = int(x.size)
    C, inner = int(C), int(inner)
    if n == 0:
        return
    if C < 1 or inner < 1:
        raise ValueError("fq_affine_exact: C and inner must be >= 1, with C parameters each")
    dtype = _dt(x)
    s, iv, z = _param(scale, dtype), _param(inv, dtype), _param(zp, np.float64)
    if s.size < C or iv.size < C or z.size < C:
        raise ValueError("fq_affine_exact: C and inner must be >= 1, with C parameters each")
    ct, it = _index(n)
    fn = _function("exact.cu", f"qc_affine_exact<{_CTYPE[dtype]}, {ct}>")
    fn((_ew_grid(n, dtype),), (_THREADS,), (x, y, _mask_arg(mask), it(n), it(C), it(inner), s, iv,
                                            z, np.float64(qmin), np.float64(qmax),
                                            np.int32(mode)))


# ----------------------------------------------------------------- backward

def ste(grad, mask, y, nthreads=None):
    """Straight-through backward y = grad * mask (y may alias grad)."""
    _check(grad, "grad")
    _check(mask, "mask")
    _check(y, "y")
    n = int(grad.size)
    if n == 0:
        return
    dtype = _dt(grad)
    _launch_ew("qc_ste", dtype, n, (grad, mask, y, _Idx(n)))


# ------------------------------------------------------- sums in numpy's order

_PW_LEAF = 128   # numpy's PW_BLOCKSIZE: rows up to this long are one leaf


@functools.lru_cache(maxsize=256)
def _pairwise_depth(n):
    """Levels of numpy's pairwise tree over n values (0: one leaf)."""
    if n <= _PW_LEAF:
        return 0
    half = n // 2 - (n // 2) % 8
    return 1 + max(_pairwise_depth(half), _pairwise_depth(n - half))


def numpy_row_sums(x, acc_dtype=np.float32):
    """The sums of the rows of a C-contiguous float32 device array of shape
    (rows, n), in ``acc_dtype`` (float32 or float64), bit-equal to numpy's
    ``x.sum(axis=-1)`` (float32) or ``x.astype(np.float64).sum(axis=-1)``
    (float64) on the host: ``0 + pairwise(row)`` with numpy's pairwise tree
    (see reduce.cu).  Returns a device array of shape (rows,)."""
    cp = _cupy()
    acc = np.dtype(acc_dtype)
    if x.ndim != 2 or not x.flags.c_contiguous or x.dtype != np.float32:
        raise ValueError(f"numpy_row_sums: expected a C-contiguous 2-D float32 array, got "
                         f"{x.dtype}{x.shape}")
    if acc not in _CTYPE:
        raise ValueError(f"numpy_row_sums: acc_dtype must be float32 or float64, got {acc}")
    rows, n = (int(v) for v in x.shape)
    out = cp.zeros(rows, dtype=acc)
    if rows == 0 or n == 0:
        return out
    depth = _pairwise_depth(n)
    ct, it = _index(x.size)
    slots = cp.empty(rows << depth, dtype=acc)
    acc_t = _CTYPE[acc]
    leaves = _function("reduce.cu", f"qc_pw_leaves<{acc_t}, float, {ct}>")
    leaves((_grid(rows << depth),), (_THREADS,), (x, slots, it(rows), it(n), np.int32(depth)))
    level = _function("reduce.cu", f"qc_pw_level<{acc_t}, {ct}>")
    for k in range(max(depth - 1, 0), -1, -1):
        level((_grid(rows << k),), (_THREADS,),
              (slots, out, it(rows), it(n), np.int32(depth), np.int32(k)))
    return out


def numpy_column_sums(x):
    """The float32 sums over the leading axis of a C-contiguous float32
    device array of shape (rows, d), bit-equal to numpy's ``x.sum(axis=0)``
    for d > 1: a running sum per column from +0 (for d == 1 numpy sums the
    column pairwise: use :func:`numpy_row_sums` on ``x.reshape(1, -1)``)."""
    cp = _cupy()
    if x.ndim != 2 or not x.flags.c_contiguous or x.dtype != np.float32:
        raise ValueError(f"numpy_column_sums: expected a C-contiguous 2-D float32 array, got "
                         f"{x.dtype}{x.shape}")
    rows, d = (int(v) for v in x.shape)
    out = cp.zeros(d, dtype=np.float32)
    if d:
        ct, it = _index(x.size)
        fn = _function("reduce.cu", f"qc_column_sums<float, {ct}>")
        fn((_grid(d),), (_THREADS,), (x, out, it(rows), it(d)))
    return out


# ------------------------------------------------------- LSQ backward terms

def lsq_grads(dy, x, dx, ds, dz, C, inner, scale, zb, qmin, qmax, grad_factor,
              integer_zero_point):
    """The per-element terms of torch's learnable fake-quant backward
    (lsq.cu) of C-contiguous 1-D float32 device arrays ``dy`` and ``x``
    into ``dx`` / ``ds`` / ``dz``: element i in channel (i / inner) % C,
    ``scale`` float32[C] and ``zb`` float64[C] (host or device; an integer
    zero point per tensor when ``integer_zero_point``)."""
    arrays = {"dy": dy, "x": x, "dx": dx, "ds": ds, "dz": dz}
    for name, a in arrays.items():
        _check(a, name)
        if a.dtype != np.float32 or a.size != x.size:
            raise ValueError(f"lsq_grads: {name} must be float32[{x.size}], got "
                             f"{a.dtype}[{a.size}]")
    s, z = _param(scale, np.float32), _param(zb, np.float64)
    if s.size != C or z.size != C or C < 1 or int(inner) < 1:
        raise ValueError(f"lsq_grads: {C} channels of {inner} values need scale and zb of "
                         f"size {C}, got {s.size} and {z.size}")
    n = int(x.size)
    if n == 0:
        return
    ct, it = _index(n)
    fn = _function("lsq.cu", f"qc_lsq_grads<{ct}>")
    fn((_grid(n),), (_THREADS,), (dy, x, dx, ds, dz, it(n), it(C), it(inner), s, z,
                                  np.int64(qmin), np.int64(qmax), np.float32(grad_factor),
                                  np.int32(bool(integer_zero_point))))


# ------------------------------------------------------------------ qparams

def qparams(scheme, a, b, qmin, qmax, eps, num_bits, flags):
    """Scheme ``scheme`` (``QP_SCHEMES``) over the C channels of device
    arrays a (and b, or None), as the CPU's ``qparams``: float64[NOUT, C] on
    the device, output j at row j."""
    cp = _cupy()
    scheme = int(scheme)
    if not 0 <= scheme < len(_SCHEME_LIST):
        raise ValueError(f"qparams: unknown scheme {scheme}")
    _check(a, "a")
    dtype = _dt(a)
    C = int(a.size)
    if b is not None:
        _check(b, "b")
        if _dt(b) != dtype or b.size != C:
            raise ValueError(f"qparams: the inputs differ: {dtype}[{C}] and {_dt(b)}[{b.size}]")
    _, name, nout = _SCHEME_LIST[scheme]
    out = cp.empty((nout, C), dtype=np.float64)
    if C:
        fn = _function("qparams.cu", f"qc_qparams<{name}, {_CTYPE[dtype]}>")
        fn((max(1, min(-(-C // _THREADS), 1024)),), (_THREADS,),
           (a, b, np.uint64(C), np.float64(qmin), np.float64(qmax), np.float64(eps),
            np.int32(num_bits), np.int32(flags), out))
    return out


# ---------------------------------------------------------------- histogram

_HIST_THREADS = 256   # QC_HIST_THREADS in histogram.cu


def histc_f32(x, bins, lo, hi, absolute, skip_zeros, nthreads=None):
    """``torch.histc`` counts (int64[bins], on the device) of a C-contiguous
    float32 device array over [lo, hi] (chosen by the caller as torch
    chooses them), as the CPU's ``histc_f32``: qc_histc_bin_f32 per value,
    |x| when ``absolute``, zeros skipped when ``skip_zeros``."""
    cp = _cupy()
    _check(x)
    if x.dtype != np.float32:
        raise ValueError(f"histc_f32: expected a float32 array, got {x.dtype}")
    bins = int(bins)
    if bins < 1:
        raise ValueError(f"histc_f32: bins must be >= 1, got {bins}")
    if not lo <= hi:
        raise ValueError(f"histc_f32: need lo <= hi, got [{lo}, {hi}]")
    counts = cp.zeros(bins, dtype=np.uint64)
    n = int(x.size)
    if n:
        ct, it = _index(n)
        grid = _hist_grid(n)
        fn = _function("histogram.cu", f"qc_histc<{ct}>")
        fn((grid,), (_HIST_THREADS,), (x, it(n), np.float32(lo), np.float32(hi), np.int32(bins),
                                       np.int32(bool(absolute)), np.int32(bool(skip_zeros)),
                                       counts))
    return counts.view(np.int64)


def _hist_grid(n):
    """Blocks of a histogram launch: enough to fill the device; each block's
    shared counts stay < 2**31."""
    return max(1, min(-(-n // _HIST_THREADS), _sm_count() * 8), -(-n // 2 ** 31))


def histogram_f32(x, edges, uniform, absolute=False, skip_zeros=False):
    """``numpy.histogram`` counts (int64[len(edges) - 1], on the device) of
    a C-contiguous float32 device array: ``|x|`` when ``absolute``, zeros
    left out when ``skip_zeros``.  ``edges``: float32 or float64 bin edges
    (host or device; compared in float64 as numpy does; the caller makes
    them as numpy does, and checks them);
    ``uniform``: the bins of ``np.histogram(x, bins=len(edges) - 1)``
    (edges from the data's range), else those of ``np.histogram(x,
    bins=edges)`` (see qc_hist_edges in histogram.cu)."""
    cp = _cupy()
    _check(x)
    if x.dtype != np.float32:
        raise ValueError(f"histogram_f32: expected a float32 array, got {x.dtype}")
    e = _param(edges, np.float64)
    bins = int(e.size) - 1
    if bins < 1:
        raise ValueError(f"histogram_f32: need at least 2 edges, got {e.size}")
    counts = cp.zeros(bins, dtype=np.uint64)
    n = int(x.size)
    if n:
        host = np.asarray(edges) if not isinstance(edges, cp.ndarray) else None
        if uniform and host is None:
            raise ValueError("histogram_f32: the uniform rule needs host edges")
        if uniform and host.dtype != np.float32:
            raise ValueError("histogram_f32: the uniform rule takes float32 edges")
        first = np.float32(host[0]) if uniform else np.float32(0)
        denom = np.float32(host[-1] - host[0]) if uniform else np.float32(1)
        ct, it = _index(n)
        fn = _function("histogram.cu", f"qc_hist_edges<{ct}>")
        fn((_hist_grid(n),), (_HIST_THREADS,),
           (x, it(n), e, np.int32(bins), np.int32(bool(uniform)), first, denom,
            np.int32(bool(absolute)), np.int32(bool(skip_zeros)), counts))
    return counts.view(np.int64)


# ---------------------------------------------- fused observer + qparams

#: observer rules and flags of qc_minmax.h (QC_OBS_*; tests check them
#: against the CPU extension's)
_OBSERVERS = {"none": 0, "minmax": 1, "moving_average": 2, "ema": 3, "momentum": 4}
OBS_FLAGS = {"propagate": 8, "include_zero": 16, "from_zero": 32, "absmax": 64,
             "first_if_empty": 128, "inf_resets": 256}
_QSCHEMES = {None: 0, "affine": 1, "symmetric": 2}


class ObserverState:
    """Device-resident observer state and qparams of one FakeQuantize.

    Attributes (cupy arrays on the device they were made on):

    - ``min_val``, ``max_val``: float32[C] statistics
    - ``counts``: int64[2] = (num_batches, nonfinite_batches)
    - ``scale`` (float32[C]), ``zero_point`` (int64[C]): the qparams
    - ``qp``: the compute dtype [scale, 1 / scale, zero_point] x C read by
      :func:`ew` (family "affine")
    - ``counter``: the reduction's uint32 counter (0 between launches)

    Per tensor C = 1.  Use one state from one stream at a time.
    """

    def __init__(self, channels, compute_dtype=np.float32):
        cp = _cupy()
        c = int(channels)
        self.channels = c
        self.dtype = np.dtype(compute_dtype)
        self.min_val = cp.full(c, np.inf, dtype=np.float32)
        self.max_val = cp.full(c, -np.inf, dtype=np.float32)
        self.counts = cp.zeros(2, dtype=np.int64)
        self.scale = cp.ones(c, dtype=np.float32)
        self.zero_point = cp.zeros(c, dtype=np.int64)
        self.qp = cp.concatenate([cp.ones(c, self.dtype), cp.ones(c, self.dtype),
                                  cp.zeros(c, self.dtype)])
        self.counter = cp.zeros(1, dtype=np.uint32)

    def set_qparams(self, scale, zero_point):
        """Load host qparams (e.g. from a state dict) into scale / zero_point / qp."""
        cp = _cupy()
        s = np.asarray(scale, dtype=np.float32).reshape(-1)
        z = np.asarray(zero_point, dtype=np.int64).reshape(-1)
        T = self.dtype.type
        sw = s.astype(self.dtype)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = (T(1) / sw).astype(self.dtype)
        self.scale[...] = cp.asarray(s)
        self.zero_point[...] = cp.asarray(z)
        self.qp[...] = cp.asarray(np.concatenate([sw, inv,
                                                  z.astype(np.float64).astype(self.dtype)]))


def observe(x, outer, C, inner, state, *, observer="moving_average", averaging_constant=0.01,
            decay=0.0, flags=(), nan_policy="skip", qscheme="affine", quant_min=0,
            quant_max=255, eps=float(np.finfo(np.float32).eps), zero_point=None, out_lo=None,
            out_hi=None, out_flags=None, finish=1):
    """One launch: batch min/max of x's (outer, C, inner) view, the observer
    update of ``state`` and its qparams, all in the last block.

    observer: a rule of qc_observe_update (qc_minmax.h): "minmax" (running
    min / max), "moving_average" (``m = m + c * (batch - m)``, first batch
    ``m = batch``), "ema" (``m = f32(f32(m * d) + f32(batch * c))``),
    "momentum" (the same where ``m != 0``, else the batch) or "none"; ``c``
    is ``averaging_constant`` and ``d`` is ``decay`` (float32 values).
    flags: names of ``OBS_FLAGS`` ("include_zero", "from_zero", "absmax",
    "first_if_empty", "inf_resets"; see qc_minmax.h).
    nan_policy: "skip" (a batch with a NaN or +-inf in any channel leaves the
    state unchanged and counts in ``state.counts[1]``) or "propagate".
    "raise" needs the host: use quantcore's synchronous path for it.
    qscheme: "affine" (qparams.affine_qparams), "symmetric"
    (qparams.symmetric_qparams; ``zero_point`` as there) or None (then the
    state needs only ``min_val``, ``max_val``, ``counts``, ``counter`` and
    ``channels``).
    Optionally also writes the batch (lo, hi, flags) to ``out_*``.
    An empty x changes nothing (no launch).
    """
    _check(x)
    if x.size == 0 or C == 0:
        return
    dtype = _dt(x)
    if observer not in _OBSERVERS:
        raise ValueError(f"observe: observer must be one of {sorted(_OBSERVERS)}, got {observer!r}")
    if nan_policy not in ("skip", "propagate"):
        raise ValueError(f"observe: nan_policy must be 'skip' or 'propagate' on the device, got "
                         f"{nan_policy!r}")
    if qscheme not in _QSCHEMES:
        raise ValueError(f"observe: qscheme must be 'affine', 'symmetric' or None, got {qscheme!r}")
    unknown = set(flags) - set(OBS_FLAGS)
    if unknown:
        raise ValueError(f"observe: unknown flags {sorted(unknown)}; known: {sorted(OBS_FLAGS)}")
    if state.channels != int(C):
        raise ValueError(f"observe: the state has {state.channels} channels, x {C}")
    if qscheme is not None and state.dtype != dtype:
        raise ValueError(f"observe: the state's qparams are {state.dtype}, x is {dtype}")
    qmin, qmax = int(quant_min), int(quant_max)
    last = _Last(dtype)
    last.out_lo, last.out_hi, last.out_fl = out_lo, out_hi, out_flags
    last.finish_mode = int(finish)
    last.st_min, last.st_max, last.st_cnt = state.min_val, state.max_val, state.counts
    mode = _OBSERVERS[observer] | (OBS_FLAGS["propagate"] if nan_policy == "propagate" else 0)
    for name in flags:
        mode |= OBS_FLAGS[name]
    last.obs_mode = mode
    last.avg_c = np.float32(averaging_constant)
    last.avg_d = np.float32(decay)
    last.qscheme = _QSCHEMES[qscheme]
    last.eps = np.float32(eps)
    if qscheme == "symmetric":
        if zero_point is None:
            zero_point = 0 if qmin < 0 else (qmin + qmax + 1) // 2
        last.sym_zp = int(zero_point)
    last.qmin, last.qmax = qmin, qmax
    if qscheme is not None:
        last.q_scale, last.q_zp, last.qp = state.scale, state.zero_point, state.qp
    _reduce(x, int(outer), int(C), int(inner), last, counter=state.counter)


# ------------------------------------------------ codes and group recipes

_FMT_THREADS = 256   # QC_FMT_THREADS in formats.cu


def _code_launch(enc, family, x, codes, n_rows, a, b, c, layout, params, u0, u1, mode, func):
    """One launch of qc_enc / qc_dec: x is the float side, codes the integer
    side, both C-contiguous 1-D of one size."""
    _check(x)
    _check(codes, "codes")
    families = _ENC_LIST if enc else _DEC_LIST
    if not 0 <= int(family) < len(families):
        raise ValueError(f"{func}: unknown family {family}")
    _, op, nparam, cbytes = families[int(family)]
    width = codes.dtype.itemsize
    if codes.dtype.kind not in "iu" or not cbytes & width or codes.size != x.size:
        raise ValueError(f"{func}: expected an integer code array of {x.size} elements with a "
                         "width the family supports")
    n = int(x.size)
    if n == 0:
        return
    dtype = _dt(x)
    T = dtype.type
    params = _param(params, dtype)
    count = n_rows
    if params.size < nparam * count:
        raise ValueError(f"{func}: expected {nparam * count} parameters, got {params.size}")
    ct, it = _index(n)
    kernel = "qc_enc" if enc else "qc_dec"
    fn = _function("formats.cu",
                   f"{kernel}<{op}, {_CTYPE[dtype]}, {_CODE_TYPES[width]}, {ct}, {layout}>")
    grid = max(1, min(-(-n // _FMT_THREADS), _sm_count() * 8 * 4))
    codes = codes.view(np.uint8 if width == 1 else np.uint16)  # (the kernels' code types)
    head = (x, codes) if enc else (codes, x)
    fn((grid,), (_FMT_THREADS,), head + (it(n), it(a), it(b), it(c), it(count), params, T(u0),
                                         T(u1), np.int32(mode)))


def _view_args(n, outer, C, inner, func):
    if int(outer) * int(C) * int(inner) != n:
        raise ValueError(f"{func}: the view ({outer}, {C}, {inner}) does not have {n} elements")
    return (int(C), (int(inner), int(C), 0, 1)) if int(C) > 1 else (1, (1, 1, 0, 0))


def encode(family, x, codes, outer, C, inner, params, u0, u1, mode, nthreads=None):
    """The CPU's ``encode``: encode family `family` (``ENCODE_FAMILIES``) over
    the (outer, C, inner) view of x into codes (cupy integer arrays)."""
    count, (a, b, c, layout) = _view_args(int(x.size), outer, C, inner, "encode")
    _code_launch(True, family, x, codes, count, a, b, c, layout, params, u0, u1, mode, "encode")


def decode(family, codes, y, outer, C, inner, params, u0, u1, mode, nthreads=None):
    """The CPU's ``decode``: codes into y over the (outer, C, inner) view."""
    count, (a, b, c, layout) = _view_args(int(y.size), outer, C, inner, "decode")
    _code_launch(False, family, y, codes, count, a, b, c, layout, params, u0, u1, mode, "decode")


def _group_args(n, rows, K, g, func):
    rows, K, g = int(rows), int(K), int(g)
    if g < 1 or rows * K != n:
        raise ValueError(f"{func}: {rows} rows of {K} in groups of {g} do not fit {n} elements")
    ng = -(-K // g)
    return rows * ng, K, g, ng


def encode_groups(family, x, codes, rows, K, g, params, u0, u1, mode, nthreads=None):
    """The CPU's ``encode_groups``: one parameter set per group of g
    consecutive elements of each row of K."""
    count, K, g, ng = _group_args(int(x.size), rows, K, g, "encode_groups")
    _code_launch(True, family, x, codes, count, K, g, ng, 2, params, u0, u1, mode,
                 "encode_groups")


def decode_groups(family, codes, y, rows, K, g, params, u0, u1, mode, nthreads=None):
    """The CPU's ``decode_groups``."""
    count, K, g, ng = _group_args(int(y.size), rows, K, g, "decode_groups")
    _code_launch(False, family, y, codes, count, K, g, ng, 2, params, u0, u1, mode,
                 "decode_groups")


def group_quant(recipe, x, codes, y, mask, scale, zp, rows, K, g, qmin, qmax, mode,
                nthreads=None):
    """The CPU's ``group_quant``: recipe `recipe` (``GROUP_RECIPES``) over
    rows of K float32 values in groups of g; writes scale / zp (float32 per
    group) and codes (uint8) / y (float32) / mask (uint8) when not None."""
    launch = _warp_per_group_launch(
        "qc_group", _RECIPE_LIST, recipe, x, rows, K, g,
        (("codes", codes, False), ("y", y, False), ("mask", mask, False),
         ("scale", scale, True), ("zp", zp, True)), "group_quant")
    if launch is not None:
        fn, grid, it, K, g = launch
        fn((grid,), (_FMT_THREADS,), (x, codes, y, mask, scale, zp, it(int(rows)), it(K), it(g),
                                      np.float32(qmin), np.float32(qmax), np.int32(mode)))


def _warp_per_group_launch(kernel, recipe_list, recipe, x, rows, K, g, outputs, func):
    """The checks and the launch shape of a one-warp-per-group kernel of
    formats.cu (``kernel<recipe's struct, index type>``) over rows of K
    float32 values in groups of g; ``outputs``: (name, array or None,
    per group (else per element)).  (kernel function, grid, index type, K,
    g), or None when x is empty."""
    _check(x)
    if x.dtype != np.float32:
        raise ValueError(f"{func}: expected float32, got {x.dtype}")
    if not 0 <= int(recipe) < len(recipe_list):
        raise ValueError(f"{func}: unknown recipe {recipe}")
    n = int(x.size)
    count, K, g, _ = _group_args(n, rows, K, g, func)
    for name, a, per_group in outputs:
        size = count if per_group else n
        if a is not None and (_check(a, name).size != size):
            raise ValueError(f"{func}: {name} must have {size} elements")
    if n == 0:
        return None
    ct, it = _index(n)
    fn = _function("formats.cu", f"{kernel}<{recipe_list[int(recipe)][1]}, {ct}>")
    warps = _FMT_THREADS // 32
    return fn, max(1, min(-(-count // warps), _sm_count() * 8 * 4)), it, K, g


def block_scaled_quant(recipe, x, scodes, codes, y, rows, K, g, elem, mode, p0, p1,
                       nthreads=None, scale_from=None):
    """The CPU's ``block_scaled_quant``: recipe `recipe` (``BLOCK_RECIPES``:
    MX, NVFP4) over rows of K float32 values in blocks of g; writes scodes
    (uint8 per block) and codes (uint8) / y (float32) when not None.
    ``scale_from``: (range, div, mul, gout) to take ``p1 = gs = f32(amax /
    div)`` and ``p0 = f32(mul * gs)`` from the device instead, amax from
    ``range`` (float32[2]: x's finished min and max; +NaN when either is
    NaN), ``gs`` also written to ``gout`` (float32[1] or None)."""
    launch = _warp_per_group_launch(
        "qc_block_scaled", _BLOCK_LIST, recipe, x, rows, K, g,
        (("scodes", scodes, True), ("codes", codes, False), ("y", y, False)),
        "block_scaled_quant")
    if launch is not None:
        fn, grid, it, K, g = launch
        rng, div, mul, gout = scale_from if scale_from is not None else (None, 1.0, 1.0, None)
        if rng is not None:
            _check(rng, "range")
            if rng.dtype != np.float32 or rng.size != 2:
                raise ValueError("block_scaled_quant: range must be float32[2]")
            p0 = p1 = 0.0
        fn((grid,), (_FMT_THREADS,), (x, scodes, codes, y, it(int(rows)), it(K), it(g),
                                      np.int32(elem), np.int32(mode), np.float32(p0),
                                      np.float32(p1), rng, np.float32(div), np.float32(mul),
                                      gout))
