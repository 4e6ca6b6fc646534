"""The GPU back end's machinery (quantcore_gpu.kernels is its entry points):
the instantiations each .cu source is compiled with, named from the CPU
extension's tables (the headers' X-macro lists as compiled: no header text
is read); the NVRTC compile with :func:`compile_options` into the on-disk
cache (:mod:`quantcore_gpu.cache`) and the per-device module and function
caches; the launch geometry and argument helpers.

Importing this module does not import cupy.
"""
import importlib.util
import os
import threading
import time

import numpy as np

from . import cache as _cache


# --------------------------------------------------------------- sources

_FLOATS = ("float", "double")
_INDEX = ("unsigned int", "unsigned long long")


def _tables():
    """The CPU extension's tables of every X-macro list (as the compiler read
    the headers: names, ids, parameter counts and the C++ type of each entry,
    ``TYPE_NAMES``), from which the instantiations below are named."""
    from quantcore._cpu import _kernels
    return _kernels


def _families():
    """[(name, Op struct, NP)] of the elementwise families (QC_EW_FAMILIES
    in qc_registry.h), in id order."""
    K = _tables()
    return [(n, K.TYPE_NAMES["ew"][n], K.FAMILY_PARAMS[n]) for n in K.FAMILIES]


def _schemes():
    """[(name, Scheme struct, NOUT)] of the qparams schemes (QC_QP_SCHEMES
    in qc_qparams.h), in id order."""
    K = _tables()
    return [(n, K.TYPE_NAMES["qparams"][n], nout) for n, (_, nout) in K.QP_SCHEMES.items()]


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
    red = tuple(f"qc_pw_subtrees<{acc}, float, {i}>" for acc in _FLOATS for i in _INDEX) + \
        tuple(f"qc_pw_top<{acc}, {i}>" for acc in _FLOATS for i in _INDEX) + \
        tuple(f"qc_column_sums<float, {i}>" for i in _INDEX)
    return {"fake_quant.cu": tuple(fq), "minmax.cu": tuple(mm), "histogram.cu": hist,
            "qparams.cu": qp, "exact.cu": exact, "reduce.cu": red,
            "lsq.cu": tuple(f"qc_lsq_grads<{i}>" for i in _INDEX),
            "convert.cu": tuple(f"qc_convert<{f}, {t}, {i}>" for f in _FLOATS for t in _FLOATS
                                if f != t for i in _INDEX) +
            tuple(f"qc_channel_op<{t}, {i}>" for t in _FLOATS for i in _INDEX)}


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
    """quantcore/include (the headers the .cu sources include)."""
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
    recipes [(name, struct)] of qc_registry.h (QC_ENCODE_FAMILIES,
    QC_DECODE_FAMILIES, QC_GROUP_RECIPES), in id order."""
    K = _tables()
    enc, dec = ([(n, K.TYPE_NAMES[kind][n]) + K.CODE_FAMILY_INFO[kind][n] for n in ids]
                for kind, ids in (("encode", K.ENCODE_FAMILIES), ("decode", K.DECODE_FAMILIES)))
    return enc, dec, [(n, K.TYPE_NAMES["group"][n]) for n in K.GROUP_RECIPES]


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
    """The block-scaled recipes [(name, struct)] of qc_registry.h
    (QC_BLOCK_RECIPES), in id order."""
    K = _tables()
    return [(n, K.TYPE_NAMES["block"][n]) for n in K.BLOCK_RECIPES]


_BLOCK_LIST = _block_recipes()
SOURCES["formats.cu"] = _format_names() + tuple(
    f"qc_block_scaled<{rec}, {i}>" for _, rec in _BLOCK_LIST for i in _INDEX)
#: the engine writers' stored types (BF16 bits, float32) and packings (engines.cu)
ENGINE_TYPES = ("unsigned short", "float")
ENGINE_PACKS = (0, 4, 8)
SOURCES["engines.cu"] = tuple(
    f"{k}<{r}, {x}, {i}>" for k in ("qc_eng_fp8_k", "qc_eng_fp4_k") for r in (0, 1)
    for x in ENGINE_TYPES for i in _INDEX) + tuple(
    f"qc_eng_int_k<{r}, {p}, {x}, {i}>" for r in (0, 1) for p in ENGINE_PACKS
    for x in ENGINE_TYPES for i in _INDEX) + tuple(
    f"qc_eng_group_minmax_k<{x}, {i}>" for x in ENGINE_TYPES for i in _INDEX)
def _gguf_ids():
    """The ggml type ids of the GGUF quantizers (QC_GGUF_TYPES in qc_gguf.h,
    as the CPU module _gguf compiled it)."""
    from quantcore._cpu import _gguf
    return _gguf.QUANTIZE_IDS


SOURCES["gguf.cu"] = tuple(f"qc_gg_rows_k<{t}, {i}>" for t in _gguf_ids() for i in _INDEX) + \
    tuple(f"qc_gg_dq_rows_k<{i}>" for i in _INDEX)
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


def _nvrtc_library():
    """[file name, size, mtime in ns] of the libnvrtc this process mapped
    (Linux ``/proc/self/maps``; NVRTC reports only major.minor, and a
    12.9.41 -> 12.9.86 upgrade must not reuse a binary), or None where it
    cannot be seen (another OS, or an NVRTC that is not a mapped file)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {line.split(None, 5)[-1].strip() for line in fh if "libnvrtc" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith("libnvrtc") and "builtins" not in name and os.path.isfile(path):
            st = os.stat(path)
            return [name, st.st_size, st.st_mtime_ns]
    return None


def cupy_added_options(cc):
    """(options, binary kind) that ``cupy.cuda.compiler.compile_using_nvrtc``
    appends to the caller's for the current device of compute capability
    ``cc`` (its ``_compile``: the architecture option CuPy chose with
    ``_get_arch_for_options_for_nvrtc`` -- ``-arch=sm_<cc>`` for a cubin, or
    ``-arch=compute_<cc>`` PTX beyond NVRTC's newest architecture or with
    CUPY_COMPILE_WITH_PTX --, then ``--device-as-default-execution-space``
    and, for NVRTC 12.8+ with CUPY_NVRTC_USE_PCH, ``--pch``).  CuPy's own
    helpers are asked where it has them (13.x, 14.x)."""
    from cupy.cuda import compiler
    chooser = getattr(compiler, "_get_arch_for_options_for_nvrtc", None)
    if chooser is not None:
        arch_opt, kind = chooser()
    else:
        ptx = os.environ.get("CUPY_COMPILE_WITH_PTX", "0").lower() in ("1", "true", "yes", "on")
        arch_opt, kind = (f"-arch=compute_{cc}", "ptx") if ptx else (f"-arch=sm_{cc}", "cubin")
    opts = [arch_opt, "--device-as-default-execution-space"]
    major, minor = (int(v) for v in _cupy().cuda.nvrtc.getVersion())
    if getattr(compiler, "_use_pch", False) and (major, minor) >= (12, 8):
        opts.append("--pch")
    return opts, kind


def _target():
    """What the binary depends on besides the sources and options: the
    compiler (NVRTC, the version CuPy loaded and its library file), CuPy
    (its version and the options it adds on this path), the current
    device's compute capability and the target CuPy chose for it
    (:func:`cupy_added_options`)."""
    cp = _cupy()
    cc = str(cp.cuda.Device().compute_capability)
    adds, kind = cupy_added_options(cc)
    return {"compiler": "nvrtc", "nvrtc": [int(v) for v in cp.cuda.nvrtc.getVersion()],
            "nvrtc_library": _nvrtc_library(), "cupy": str(getattr(cp, "__version__", "?")),
            "cupy_adds": adds, "kind": kind, "cc": cc}


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
    # CuPy's getCUBIN returns NVRTC's cubin one byte short: the file the
    # driver reads must be the whole image (cache.whole_image)
    return _cache.whole_image(binary), dict(mapping)


def module_entry(source, group, force=False):
    """The cache Entry (a whole image the driver can load from its
    ``path``) of one group of a source for the current device: from the
    disk cache, else compiled through CuPy (:func:`_compile`) and stored;
    ``force``: compile even when an entry is there.  What :func:`_module`
    loads, and what the toolchain check (``quantcore_gpu.toolchain_check``)
    hands to NVIDIA's tools.  ``entry.key`` is its cache key."""
    fields = module_fields(source, group, _target())
    names = module_groups(source)[group]
    return _cache.get_module(fields, names, lambda: _compile(source, names), force=force)


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
                entry = module_entry(source, group)
                try:
                    mod = _load(entry)
                except cp.cuda.driver.CUDADriverError:
                    if entry.compiled:
                        raise
                    # an entry the driver refuses (e.g. written for another driver) is a miss
                    _cache.REJECTED.append((entry.key, "the driver refused it"))
                    entry = module_entry(source, group, force=True)
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
    copied to the device; device arrays of dtype are used in place; device
    arrays of another float dtype converted by :func:`convert`)."""
    cp = _cupy()
    if isinstance(p, cp.ndarray):
        return cp.ascontiguousarray(convert(p, dtype)).reshape(-1)
    return cp.ascontiguousarray(cp.asarray(p, dtype=dtype)).reshape(-1)


def convert(x, dtype):
    """``x.astype(dtype)`` of a device array, bit-equal to numpy's: float32
    <-> float64 runs ``qc_convert`` (convert.cu: no flush of float32
    subnormals, which CuPy's own casting kernel would do); other pairs cannot
    meet a float32 subnormal on either side and use CuPy's ``astype``.  The
    result is C-contiguous, or ``x`` itself when it has ``dtype`` already."""
    cp = _cupy()
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if x.dtype not in _CTYPE or dtype not in _CTYPE:
        return x.astype(dtype)
    src = cp.ascontiguousarray(x).reshape(-1)  # a same-dtype copy where needed: no arithmetic
    y = cp.empty(x.shape, dtype=dtype)
    n = int(src.size)
    if n:
        ct, it = _index(n)
        fn = _function("convert.cu", f"qc_convert<{_CTYPE[x.dtype]}, {_CTYPE[dtype]}, {ct}>")
        fn((_grid(n),), (_THREADS,), (src, y.reshape(-1), it(n)))
    return y


CHANNEL_OPS = {"subtract": 0, "multiply": 1, "divide": 2, "rdivide": 3}


def channel_op(op, a, b, C=1, inner=None, out=None):
    """``y[i] = a[i] OP b[(i / inner) % C]`` (OP: ``CHANNEL_OPS``; "rdivide"
    is ``b / a``) of a float32 / float64 device array ``a`` (any shape; the
    C-ordered flat index) and ``b`` (C values, host or device, converted to
    a's dtype; a host scalar is a kernel argument), each result rounded
    once with gradual underflow (convert.cu), as numpy's ufunc of the
    broadcast operands.  ``out`` (C-contiguous, a's shape and dtype) may be
    ``a``; returns the result."""
    cp = _cupy()
    dt = np.dtype(a.dtype)
    if dt not in _CTYPE or op not in CHANNEL_OPS:
        raise ValueError(f"channel_op: float32 / float64 input and an op of {sorted(CHANNEL_OPS)}"
                         f" expected, got {dt} and {op!r}")
    src = cp.ascontiguousarray(a)
    y = out if out is not None else cp.empty(a.shape, dtype=dt)
    if not y.flags.c_contiguous or y.shape != a.shape or y.dtype != dt:
        raise ValueError("channel_op: out must be C-contiguous with a's shape and dtype")
    T = dt.type
    if isinstance(b, cp.ndarray) or np.ndim(b):
        bv, b0 = _param(b, dt), T(0)
    else:  # a host scalar: a kernel argument (numpy's rounding to T), not a transfer
        with np.errstate(over="ignore"):
            bv, b0 = None, T(b)
    n = int(src.size)
    C = int(C)
    inner = n if inner is None else int(inner)
    if (bv.size if bv is not None else 1) != C or C < 1 or inner < 1:
        raise ValueError(f"channel_op: {C} channels of {inner} values need b of size {C}")
    if n:
        ct, it = _index(n)
        fn = _function("convert.cu", f"qc_channel_op<{_CTYPE[dt]}, {ct}>")
        fn((_grid(n),), (_THREADS,), (src.reshape(-1), bv, b0, y.reshape(-1), it(n), it(C),
                                      it(inner), np.int32(CHANNEL_OPS[op])))
    return y


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


