"""A fake ``cupy`` for cudaemu: "device" arrays in 256-byte-aligned host
memory, kernels from RawModule compiled with g++ and run on the CPU.

Only what quantcore and its GPU tests use, and only API that real CuPy has
(checked against cupy's sources): like cupy, an ndarray refuses implicit
conversion to numpy (``__array__`` raises), has ``flags`` with
c_contiguous / f_contiguous / owndata only, and binary operations with
numpy arrays raise.  CuPy's own kernels (operators, ufuncs, casts,
reductions) flush float32 subnormals as real CuPy's ``-ftz=true`` does
(``_ftz.py``).  New (``empty``) device memory is filled with a poison
byte (CUDAEMU_MEM_POISON, default 0xff: NaN for floats).  Kernels run
synchronously at launch.
"""
import builtins
import ctypes
import operator
import os
import weakref

import numpy as np

from . import cuda, _ftz
from ._emu import RawModule, LAUNCHES, COMPILES, TRANSFERS, count_transfer  # noqa: F401

__version__ = "0.0.0+cudaemu"

float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
bool_, dtype, newaxis, inf, nan = np.bool_, np.dtype, np.newaxis, np.inf, np.nan

_libc = ctypes.CDLL(None)
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_POISON = int(os.environ.get("CUDAEMU_MEM_POISON", "0xff"), 0)
ALLOCATED = [0]


def _alloc(nbytes, poison=True):
    """A uint8 numpy array over exactly `nbytes` of fresh 256-byte-aligned
    memory (posix_memalign: exact bounds under AddressSanitizer)."""
    p = ctypes.c_void_p()
    if _libc.posix_memalign(ctypes.byref(p), 256, builtins.max(1, nbytes)) != 0:
        raise MemoryError("cudaemu: out of memory")
    raw = (ctypes.c_uint8 * builtins.max(1, nbytes)).from_address(p.value)
    weakref.finalize(raw, _libc.free, p.value)
    buf = np.frombuffer(raw, np.uint8, count=nbytes)
    if poison and _POISON >= 0:
        buf.fill(_POISON)
    ALLOCATED[0] += nbytes
    return buf


def _new(shape, dt, order="C", poison=True):
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    dt = np.dtype(dt)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    buf = _alloc(n, poison)
    order = "F" if order == "F" else "C"
    return np.ndarray(shape, dt, buffer=buf, order=order)


class _MemoryPointer:
    def __init__(self, ptr):
        self.ptr = ptr
        self.device_id = 0


class _Flags:
    """cupy's Flags: c_contiguous, f_contiguous, owndata (no 'aligned')."""

    def __init__(self, c, f, own, aligned=None):
        self.c_contiguous, self.f_contiguous, self.owndata = c, f, own

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]


def _unwrap(x, what="argument"):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)} (cudaemu: a numpy array as a cupy {what})")
    if isinstance(x, (tuple, list)) and builtins.any(isinstance(v, (ndarray, np.ndarray)) for v in x):
        return type(x)(_unwrap(v, what) for v in x)
    return x


def _to_device(res, order="K"):
    """A fresh device array holding the numpy result `res` (0-d for scalars)."""
    res = np.asarray(res)
    out = _new(res.shape, res.dtype, "F" if (order == "K" and res.ndim > 1 and
                                             res.flags.f_contiguous and not res.flags.c_contiguous)
               else ("F" if order == "F" else "C"), poison=False)
    np.copyto(out, res)
    return ndarray._wrap(out)


class ndarray:  # noqa: N801 - cupy's name
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("cudaemu: ndarray(memptr=/strides=) is not emulated")
        self._a = _new(shape, dtype, order)
        self._base = None

    @classmethod
    def _wrap(cls, a, base=None):
        obj = cls.__new__(cls)
        obj._a = a
        obj._base = base
        return obj

    def _view(self, a):
        return ndarray._wrap(a, self if self._base is None else self._base)

    # -- attributes --------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    base = property(lambda self: self._base)
    data = property(lambda self: _MemoryPointer(self._a.__array_interface__["data"][0]))
    device = property(lambda self: cuda.Device(0))

    @property
    def flags(self):
        return _Flags(self._a.flags.c_contiguous, self._a.flags.f_contiguous, self._base is None,
                      self._a.flags.aligned)

    @property
    def T(self):
        return self._view(self._a.T)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.data.ptr, False),
                "strides": None if self._a.flags.c_contiguous else self.strides}

    # -- conversions -------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def get(self, stream=None, order="C", out=None, blocking=True):
        count_transfer("to_host", self.nbytes)
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order, copy=True)

    def item(self):
        count_transfer("to_host", self.nbytes)
        return self._a.item()

    def tolist(self):
        count_transfer("to_host", self.nbytes)
        return self._a.tolist()

    def __int__(self):
        return int(self.get())

    def __float__(self):
        return float(self.get())

    def __bool__(self):
        return bool(self.get())

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        count_transfer("to_host", self.nbytes)
        return f"cudaemu.ndarray({self._a!r})"

    # -- views and copies --------------------------------------------------
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        res = self._a.reshape(shape, order=order)
        return self._view(res) if np.may_share_memory(res, self._a) else _to_device(res)

    def ravel(self, order="C"):
        return self.reshape(-1, order=order)

    def flatten(self, order="C"):
        return _to_device(self._a.flatten(order))

    def transpose(self, *axes):
        return self._view(self._a.transpose(*axes))

    def swapaxes(self, a, b):
        return self._view(self._a.swapaxes(a, b))

    def squeeze(self, axis=None):
        return self._view(self._a.squeeze(axis))

    def view(self, dtype=None):
        return self._view(self._a.view(dtype) if dtype is not None else self._a.view())

    def copy(self, order="C"):
        return _to_device(self._a, order)

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        dt = np.dtype(dtype)
        if not copy and dt == self.dtype:
            return self
        if dt == self.dtype:
            return _to_device(self._a.astype(dt, order=order), order)
        src = self._a if order in ("K", "A") else np.asarray(self._a, order=order)
        return _to_device(_ftz.cast(src, dt), order)

    def fill(self, value):
        self._a.fill(value)

    def __getitem__(self, key):
        k = _unwrap(key, "index")
        if not isinstance(k, tuple):
            k = (k,)
        if Ellipsis not in k:
            k = k + (Ellipsis,)  # a 0-d view instead of a numpy scalar
        res = self._a[k]
        return self._view(res) if np.may_share_memory(res, self._a) else _to_device(res)

    def __setitem__(self, key, value):
        if not isinstance(value, ndarray):
            count_transfer("to_device", np.asarray(value).nbytes)
        k = _unwrap(key, "index")
        v = _unwrap(value, "value")
        if isinstance(value, ndarray) and value.dtype != self.dtype:
            v = _ftz.cast(v, self.dtype, "setitem")  # CuPy's casting copy
        self._a[k] = v

    # -- reductions ------------------------------------------------------
    def _reduce(name):
        def f(self, axis=None, dtype=None, out=None, keepdims=False):
            kw = {"axis": axis, "keepdims": keepdims}
            if dtype is not None:
                kw["dtype"] = dtype
            (a,) = _ftz.inputs(name, [self._a])
            with np.errstate(all="ignore"):
                return _to_device(_ftz.result(getattr(a, name)(**kw)))
        f.__name__ = name
        return f

    all, any, sum = _reduce("all"), _reduce("any"), _reduce("sum")
    min, max, prod, mean = _reduce("min"), _reduce("max"), _reduce("prod"), _reduce("mean")
    del _reduce

    # -- numpy protocol --------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        import cupy
        fn = getattr(cupy, ufunc.__name__, None)
        if method != "__call__" or fn is None:
            return NotImplemented
        out = kwargs.get("out")
        if isinstance(out, tuple):  # numpy hands `out` over as a tuple; CuPy takes one array
            if len(out) != 1:
                return NotImplemented
            kwargs["out"] = out[0]
        return fn(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        import cupy
        fn = getattr(cupy, func.__name__, None)
        if fn is None or fn is func or func.__module__.split(".")[1:] not in ([], ["_core"]):
            return NotImplemented
        return fn(*args, **kwargs)


def _binop(op, reflected=False):
    def f(self, other):
        a, o = _ftz.inputs(op.__name__, [self._a, _unwrap(other, "operand")])
        with np.errstate(all="ignore"):
            return _to_device(_ftz.result(op(o, a) if reflected else op(a, o)))
    return f


for _name, _op in (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv),
                   ("mod", operator.mod), ("pow", operator.pow), ("and", operator.and_),
                   ("or", operator.or_), ("xor", operator.xor), ("lshift", operator.lshift),
                   ("rshift", operator.rshift)):
    setattr(ndarray, f"__{_name}__", _binop(_op))
    setattr(ndarray, f"__r{_name}__", _binop(_op, True))
for _name, _op in (("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt),
                   ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge)):
    setattr(ndarray, f"__{_name}__", _binop(_op))
ndarray.__neg__ = lambda self: _to_device(_ftz.result(-_ftz.inputs("neg", [self._a])[0]))
ndarray.__invert__ = lambda self: _to_device(~self._a)
ndarray.__abs__ = lambda self: _to_device(  # (cupy.abs shadows abs here)
    _ftz.result(builtins.abs(_ftz.inputs("abs", [self._a])[0])))
ndarray.__hash__ = None


# ------------------------------------------------------------- creation

def empty(shape, dtype=float, order="C"):
    return ndarray._wrap(_new(shape, dtype, order))


def zeros(shape, dtype=float, order="C"):
    a = _new(shape, dtype, order, poison=False)
    a.fill(0)
    return ndarray._wrap(a)


def ones(shape, dtype=float, order="C"):
    a = _new(shape, dtype, order, poison=False)
    a.fill(1)
    return ndarray._wrap(a)


def full(shape, fill_value, dtype=None, order="C"):
    a = _new(shape, dtype if dtype is not None else np.asarray(fill_value).dtype, order,
             poison=False)
    a.fill(fill_value)
    return ndarray._wrap(a)


def _like_order(a, order):
    if order == "K" or order == "A":
        return "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    return order


def empty_like(a, dtype=None, order="K", subok=None, shape=None):
    return empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype,
                 _like_order(a, order))


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return zeros(a.shape if shape is None else shape, a.dtype if dtype is None else dtype,
                 _like_order(a, order))


def ones_like(a, dtype=None, order="K", subok=None, shape=None):
    return ones(a.shape if shape is None else shape, a.dtype if dtype is None else dtype,
                _like_order(a, order))


def full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    return full(a.shape if shape is None else shape, fill_value,
                a.dtype if dtype is None else dtype, _like_order(a, order))


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False):
    if isinstance(obj, ndarray):
        src = obj._a
        if not copy and (dtype is None or np.dtype(dtype) == obj.dtype) and ndmin <= obj.ndim:
            return obj
        if dtype is not None and np.dtype(dtype) != obj.dtype:
            src = _ftz.cast(src, dtype, "array")  # a casting copy on the device
    else:
        src = np.asarray(obj)  # host data: numpy arrays, lists, scalars
        count_transfer("to_device", src.nbytes)
    with np.errstate(all="ignore"):
        res = np.array(src, dtype=dtype, copy=True, order=order, ndmin=ndmin)
    return _to_device(res, order if order in ("C", "F") else "K")


def asarray(a, dtype=None, order=None, blocking=False):
    return array(a, dtype=dtype, copy=False, order=order or "K")


def ascontiguousarray(a, dtype=None):
    if isinstance(a, ndarray) and a.flags.c_contiguous and (dtype is None or
                                                             np.dtype(dtype) == a.dtype):
        return a
    return array(a, dtype=dtype, order="C")


def asfortranarray(a, dtype=None):
    if isinstance(a, ndarray) and a.flags.f_contiguous and (dtype is None or
                                                             np.dtype(dtype) == a.dtype):
        return a
    return array(a, dtype=dtype, order="F")


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args):
    import cupy
    return cupy if builtins.any(isinstance(a, ndarray) for a in args) else np


def copyto(dst, src, casting="same_kind", where=None):
    if not isinstance(src, ndarray):
        count_transfer("to_device", np.asarray(src).nbytes)
    if isinstance(src, np.ndarray):
        if src.size != 1:
            raise ValueError("non-scalar numpy.ndarray cannot be used for copyto")
        src = src.squeeze()[()]
    w = None if where is None else _unwrap(where)
    src = _unwrap(src)
    if isinstance(src, np.ndarray) and src.dtype != dst.dtype:
        src = _ftz.cast(src, dst.dtype, "copyto")  # CuPy's casting copy
    np.copyto(dst._a, src, casting=casting, where=True if w is None else w)


def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    arrs = [_unwrap(a) for a in tup]
    to = np.dtype(dtype) if dtype is not None else np.result_type(*arrs)
    arrs = [_ftz.cast(a, to, "concatenate") if a.dtype != to else a for a in arrs]
    res = np.concatenate(arrs, axis=axis, dtype=dtype, casting=casting)
    if out is not None:
        np.copyto(out._a, res)
        return out
    return _to_device(res)


def may_share_memory(a, b, max_work=None):
    return np.may_share_memory(_unwrap(a), _unwrap(b))


def shares_memory(a, b, max_work=None):
    return np.shares_memory(_unwrap(a), _unwrap(b))


def broadcast_to(a, shape):
    return a._view(np.broadcast_to(a._a, shape))


def _compute(name, ftz=True):
    fn = getattr(np, name)

    def f(*args, **kwargs):
        out = kwargs.pop("out", None)
        args = [_unwrap(a) for a in args]
        kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        if ftz:  # a CuPy ElementwiseKernel / ReductionKernel: -ftz=true
            args = _ftz.inputs(name, args)
            kwargs = dict(zip(kwargs, _ftz.inputs(name, list(kwargs.values()))))
        with np.errstate(all="ignore"):
            res = fn(*args, **kwargs)
        if ftz:
            res = _ftz.result(res)
        if out is not None:
            if not isinstance(out, ndarray):
                raise TypeError(f"Output must be a cupy.ndarray, got {type(out)}")
            # CuPy's ufuncs cast into `out` by the "same_kind" rule, like numpy's
            np.copyto(out._a, res, casting=kwargs.get("casting", "same_kind"))
            return out
        if isinstance(res, tuple):
            return tuple(_to_device(r) for r in res)
        return _to_device(res)
    f.__name__ = name
    return f


# functions that real CuPy has too, computed by numpy on the host copy.  Those
# CuPy runs as arithmetic / comparisons in its own (-ftz=true) kernels flush
# float32 subnormals (_ftz.py); copies, selects, bit operations and the
# precompiled sort do not, and isnan / isinf / isfinite / rint give the same
# result on a flushed operand (not modelled).
_NO_FTZ = ("packbits", "unpackbits", "where", "isnan", "isinf", "isfinite", "rint", "arange", "linspace", "nan_to_num",
           "signbit", "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "stack",
           "atleast_1d", "sort", "copysign")
for _name in ("packbits", "unpackbits", "clip", "where", "isnan", "isinf", "isfinite", "abs",
              "absolute", "minimum", "maximum", "fmin", "fmax", "array_equal", "all", "any",
              "arange", "linspace", "nan_to_num", "sum", "prod", "nonzero", "flatnonzero",
              "count_nonzero", "signbit", "logical_and", "logical_or", "logical_not", "add",
              "subtract", "multiply", "divide", "true_divide", "negative", "floor", "rint",
              "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
              "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "sqrt", "round", "around",
              "amin", "amax", "nanmin", "nanmax", "stack", "atleast_1d", "unique", "sort",
              "argmin", "argmax", "cumsum", "diff", "copysign", "nextafter"):
    globals()[_name] = _compute(_name, _name not in _NO_FTZ)
min, max = amin, amax  # noqa: A001  (cupy.min / cupy.max)


def from_dlpack(x, *, device=None, copy=None):
    raise NotImplementedError("cudaemu: DLPack exchange is not emulated")


# RawModule(path=...) (binaries from cuda.compiler.compile_using_nvrtc) besides code=
from ._binary import RawModule, NVRTC_COMPILES  # noqa: E402,F401,F811


def __getattr__(name):
    """A name the fake does not define: real CuPy API it does not implement
    (NotImplementedError naming it, so that a test never mistakes the fake's
    gap for CuPy's), or a name real CuPy does not have (AttributeError)."""
    from ._real_api import NAMES, VERSION
    if name in NAMES:
        raise NotImplementedError(
            f"cupy.{name} is real CuPy API the emulator does not implement: add it to "
            "tests/cudaemu/cupy with CuPy's semantics (read CuPy's source; the device's "
            "float rules), or use what the fake has")
    raise AttributeError(f"module 'cupy' has no attribute {name!r} (real CuPy {VERSION} "
                         "has none either)")
