"""Array plumbing shared by the functional API: back-end choice, input
conversion, memory layout, ``out=`` handling and argument validation.

Nothing here computes a quantization formula; see ``ops.py`` and
``include/qc_elementwise.h``.
"""
import functools
import inspect
import math
import numbers
import typing

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


#: type -> whether it is cupy's (a per-call check on every CPU path: cached)
_CUPY_TYPES = {np.ndarray: False}


def is_cupy_array(x):
    """True for a cupy.ndarray, checked without importing cupy."""
    t = type(x)
    try:
        return _CUPY_TYPES[t]
    except KeyError:
        found = _CUPY_TYPES[t] = t.__module__.split(".")[0] == "cupy"
        return found


def backend_of(x):
    """Name the back end that handles ``x``: ``"cpu"`` or ``"gpu"``.

    numpy arrays, Python scalars and lists go to the CPU; cupy arrays to the
    GPU.
    """
    if isinstance(x, np.ndarray):
        return "cpu"
    if is_cupy_array(x):
        return "gpu"
    if hasattr(x, "__cuda_array_interface__"):
        return "gpu"
    return "cpu"


def _framework_of(x):
    """Top-level module of a DLPack-exporting array type (torch, jax, ...)."""
    return type(x).__module__.split(".")[0]


def _from_dlpack(x):
    """A zero-copy view of a DLPack array: numpy for CPU memory, cupy for
    CUDA memory (the GPU path; NotImplementedError with the reason when it
    cannot run here).  A torch tensor that requires grad is read through
    ``detach()`` (as torch's observers read their input); results carry no
    autograd history -- ``quantcore.torch`` has the differentiable versions."""
    if getattr(x, "requires_grad", False):
        x = x.detach()
    device = getattr(x, "__dlpack_device__", lambda: (1, 0))()
    if device[0] in (1, 3):  # kDLCPU, kDLCUDAHost
        try:
            return np.from_dlpack(x)
        except RuntimeError as exc:  # numpy's "Unsupported dtype in DLTensor."
            raise TypeError(f"quantcore: {type(x).__name__} of dtype "
                            f"{getattr(x, 'dtype', '?')} has no numpy equivalent ({exc}); "
                            "convert it to float16, float32 or float64 first") from None
    if device[0] in (2, 13):  # kDLCUDA, kDLCUDAManaged
        gpu_kernels("interop")
        import cupy
        return cupy.from_dlpack(x)
    raise NotImplementedError(
        f"quantcore: {type(x).__name__} on DLPack device type {device[0]} is not supported "
        "(CPU and CUDA memory are)")


def _to_framework(result, framework):
    """Hand numpy / cupy results back as the caller's array type, zero-copy."""
    if isinstance(result, tuple):
        return tuple(_to_framework(r, framework) for r in result)
    if not (isinstance(result, np.ndarray) or is_cupy_array(result)):
        return result
    if framework == "torch":
        import torch
        if isinstance(result, np.ndarray) and result.dtype == np.bool_:
            return torch.from_numpy(result)
        return torch.from_dlpack(result)
    if framework in ("jax", "jaxlib"):
        import jax.numpy as jnp
        return jnp.from_dlpack(result)
    return result


#: the type of a wrapped function: the decorators below return their
#: argument's type, so that static readers (IDEs, type checkers, jedi) see the
#: public functions' own parameters
_Func = typing.TypeVar("_Func", bound=typing.Callable[..., typing.Any])


def _same_signature(wrapper, func):
    """``wrapper`` with ``func``'s name, docstring and signature
    (``__signature__`` too, so that ``help()`` and ``inspect`` show the real
    parameters even where ``__wrapped__`` is not followed)."""
    wrapper = functools.wraps(func)(wrapper)
    wrapper.__signature__ = inspect.signature(func)
    return wrapper


def interop(func: _Func) -> _Func:
    """Let a functional-API entry take any ``__dlpack__`` array (torch
    tensors, jax arrays) as its first argument: it is viewed as numpy (CPU)
    or cupy (CUDA) without a copy (``out=`` too), and array results come back
    as the same type."""
    def wrapper(x, *args, **kwargs):
        if type(x) is np.ndarray or isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__") \
                or is_cupy_array(x):
            return func(x, *args, **kwargs)
        framework = _framework_of(x)
        for key in ("out", "mask_out"):
            if hasattr(kwargs.get(key), "__dlpack__") and not isinstance(kwargs[key], np.ndarray):
                kwargs[key] = _from_dlpack(kwargs[key])
        args = tuple(_from_dlpack(a) if hasattr(a, "__dlpack__") and not isinstance(a, np.ndarray)
                     else a for a in args)
        return _to_framework(func(_from_dlpack(x), *args, **kwargs), framework)
    return _same_signature(wrapper, func)


def interop_method(method: _Func) -> _Func:
    """``interop`` for methods whose first argument after self is the array."""
    def wrapper(self, x, *args, **kwargs):
        if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__") or is_cupy_array(x):
            return method(self, x, *args, **kwargs)
        return interop(functools.partial(method, self))(x, *args, **kwargs)
    return _same_signature(wrapper, method)


def is_aligned(a):
    """True when every element of ``a`` lies at a multiple of its item size.

    numpy records this in ``flags.aligned``; cupy's ``flags`` has only
    ``c_contiguous``, ``f_contiguous`` and ``owndata``, so for a device
    array the data pointer and strides are checked directly (CuPy's
    allocations are 256-byte aligned, but a view through ``view(dtype)`` of
    an offset byte buffer need not be)."""
    if isinstance(a, np.ndarray):
        return a.flags.aligned
    size = a.dtype.itemsize
    return a.data.ptr % size == 0 and all(s % size == 0 for s in a.strides)


def is_writeable(a):
    """``flags.writeable`` for numpy; device arrays are always writeable
    (cupy has no read-only arrays)."""
    return a.flags.writeable if isinstance(a, np.ndarray) else True


def array_module(x):
    """numpy, or cupy for a cupy array (imported only then)."""
    if is_cupy_array(x):
        import cupy
        return cupy
    return np


def gpu_kernels(func):
    """The GPU kernel module, or NotImplementedError saying why it cannot run."""
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        raise NotImplementedError(f"quantcore.{func}: got a cupy array but the GPU path cannot "
                                  f"run here: {reason}")
    from quantcore_gpu import kernels
    return kernels


# -- float32 device data without CuPy's flush to zero ----------------------
# CuPy compiles its own operations (astype, arithmetic, comparisons, abs, ...)
# with -ftz=true: a float32 subnormal operand or result is read / written as
# a zero of its sign on the GPU, where numpy keeps it.  On cupy arrays these
# helpers give numpy's results: casts and arithmetic through the project's
# kernels (quantcore_gpu convert.cu), comparisons and abs on the bits (integer
# operations, which nothing flushes).  numpy arrays take the plain operation.

_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
        "==": np.equal, "!=": np.not_equal}


def astype_exact(a, dtype):
    """``a.astype(dtype)`` (a new array), on the GPU without CuPy's flush of
    float32 subnormals (C-contiguous there)."""
    if is_cupy_array(a):
        if a.dtype == np.dtype(dtype):
            return a.copy()
        return gpu_kernels("astype").convert(a, dtype)
    return a.astype(dtype)


def abs_exact(a):
    """``abs(a)``; a float32 cupy array by clearing the sign bits (numpy's
    fabs, NaN included), so a subnormal stays one."""
    if is_cupy_array(a) and a.dtype == np.float32:
        return (a.view(np.uint32) & np.uint32(0x7FFFFFFF)).view(np.float32)
    return array_module(a).abs(a)


_ARITH = {"subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "rdivide": lambda a, b: np.divide(b, a)}


def channel_arith(op, a, b, axis=None):
    """``a OP b`` (op: "subtract", "multiply", "divide"; "rdivide" is
    ``b / a``) of a float array
    ``a`` and ``b``: one value (``axis`` None) or ``a.shape[axis]`` values
    along ``axis``, in a's dtype, one rounding each.  On a float32 / float64
    cupy array it runs the project's kernel (convert.cu), so float32
    subnormals survive as in numpy."""
    if is_cupy_array(a) and a.dtype in (np.float32, np.float64):
        C = 1 if axis is None else a.shape[axis]
        inner = None if axis is None else math.prod(a.shape[axis + 1:])
        return gpu_kernels(op).channel_op(op, a, b, C, inner)
    xp = array_module(a)
    bb = xp.asarray(b, dtype=a.dtype)
    if axis is not None:
        bb = bb.reshape([-1 if d == axis else 1 for d in range(a.ndim)])
    with np.errstate(all="ignore"):
        return _ARITH[op](a, bb.reshape(()) if axis is None else bb)


def _f32_keys(a, xp):
    """(ordered int32 keys, NaN mask) of float32 values: -x has key -key(x),
    both zeros key 0."""
    bits = a.view(np.int32)
    mag = bits & np.int32(0x7FFFFFFF)
    return xp.where(bits < 0, -mag, mag), mag > np.int32(0x7F800000)


def compare_exact(a, op, b):
    """``a OP b`` (op: "<", "<=", ">", ">=", "==", "!=") with IEEE's
    result.  Where a float32 cupy array meets float32 values (or a Python
    number, compared as float32, as numpy 2 does) the comparison runs on
    integer keys of the bits; anything else is the plain comparison."""
    xp = array_module(a if is_cupy_array(a) else b)
    if xp is np:
        return _CMP[op](a, b)
    bf = b if is_cupy_array(b) else np.asarray(b, dtype=np.float32 if isinstance(
        b, (int, float)) else None)
    if not (a.dtype == np.float32 and bf.dtype == np.float32):
        return _CMP[op](a, b)
    ka, na = _f32_keys(a, xp)
    if op == "!=":
        return ~compare_exact(a, "==", b)
    if is_cupy_array(bf):
        kb, nb = _f32_keys(bf, xp)
        return _CMP[op](ka, kb) & ~na & ~nb
    if bf.ndim:  # host values broadcast against device data: compare on the host's terms
        return _CMP[op](a, b)
    kb, nb = _f32_keys(bf, np)  # a host scalar: its key is a kernel argument, not a transfer
    res = _CMP[op](ka, kb[()])
    return xp.zeros(res.shape, dtype=bool) if bool(nb) else res & ~na


def sum_rows(a, acc=np.float32):
    """Sums of the rows of a 2-D float32 array ``a`` in ``acc`` (float32 or
    float64), in numpy's order on either device: ``0 + pairwise(row)``,
    what ``a.astype(acc).sum(axis=-1)`` gives on the host (the device twin
    is ``quantcore_gpu.kernels.numpy_row_sums``).  A cupy array is summed on
    its device (a device array of shape (rows,) comes back)."""
    if is_cupy_array(a):
        xp = array_module(a)
        return gpu_kernels("sum_rows").numpy_row_sums(xp.ascontiguousarray(a), acc)
    return a.astype(acc, copy=False).sum(axis=-1)


def sum_leading(a):
    """The float32 sums over the leading axis of a 2-D float32 array ``a``
    (rows, d), in numpy's order on either device: what ``a.sum(axis=0)``
    gives on the host (a running sum per column for d > 1, pairwise for
    d == 1)."""
    if not is_cupy_array(a):
        return np.sum(a, axis=0, dtype=np.float32, initial=np.float32(0))
    xp = array_module(a)
    if a.shape[1] == 1:
        return sum_rows(a.reshape(1, -1))
    return gpu_kernels("sum_leading").numpy_column_sums(xp.ascontiguousarray(a))


def kernels_for(arr, func):
    """The kernel module for ``arr``: the CPU extension or quantcore_gpu."""
    if isinstance(arr, np.ndarray):
        from ._cpu import _kernels
        return _kernels
    return gpu_kernels(func)


def require_cpu(x, func):
    """Raise NotImplementedError for GPU arrays of other libraries than
    cupy (``__cuda_array_interface__`` without being a cupy array)."""
    if backend_of(x) == "gpu" and not is_cupy_array(x):
        raise NotImplementedError(
            f"quantcore.{func}: {type(x).__name__} GPU arrays are supported through cupy; "
            "wrap it with cupy.asarray")


def to_host(value):
    """A cupy parameter array as numpy (a small synchronous copy)."""
    return value.get() if is_cupy_array(value) else value


def shape_of(value):
    """The shape of an array of either device, or of what numpy makes of
    ``value`` (``numpy.shape`` does not take a cupy array everywhere)."""
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def copy_into(dest, value):
    """``dest[...] = value`` in place (unsafe casting), for a ``dest`` and a
    ``value`` on either device: a device value is read into a host ``dest``
    (a few numbers: state), a host value copied to a device ``dest``."""
    if isinstance(dest, np.ndarray):
        np.copyto(dest, to_host(value), casting="unsafe")
    else:
        dest[...] = array_module(dest).asarray(value).astype(dest.dtype, copy=False)


def as_float_array(x, name, func):
    """``x`` as a native-byte-order floating numpy array.

    Accepts numpy arrays, Python scalars and (nested) lists (Python numbers
    become float64, as in numpy; numpy integer scalars and arrays are
    rejected like any non-float array).  float16,
    float32 and float64 are accepted; anything else raises TypeError.
    A big-endian array is converted to native byte order (a copy).
    """
    require_cpu(x, func)
    if is_cupy_array(x):
        gpu_kernels(func)  # NotImplementedError with the reason when it cannot run
        arr = x
    elif isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{func}: {name} must be a float array, got {type(x).__name__}") from exc
        if arr.dtype.kind in "iub" and not isinstance(x, np.generic):
            # Python ints / lists of ints: float64, as numpy reads Python floats
            arr = arr.astype(np.float64)
    if arr.dtype.kind != "f" or arr.dtype.newbyteorder("=") not in FLOAT_DTYPES:
        raise TypeError(
            f"{func}: {name} must have a floating dtype (float16, float32 or float64), "
            f"got {arr.dtype}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


_FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def fast_flat(x):
    """The flat view of ``x`` when it is a native, aligned, C-contiguous
    float32 / float64 numpy array -- the common case, which the functional
    API serves without its layout machinery (the per-call cost matters for
    small arrays) -- else None."""
    if type(x) is np.ndarray and x.flags.c_contiguous and x.flags.aligned and \
            x.dtype in _FAST_DTYPES:
        return x.reshape(-1)
    return None


def fast_out(x, out):
    """(result, flat view) for the output of a fast-path call on ``x``: a
    new array, or ``out`` when it is a writable, aligned, C-contiguous numpy
    array of x's shape and dtype that is x itself or shares no memory with
    it.  None otherwise: the general path then validates ``out`` and handles
    it (with its error messages)."""
    if out is None:
        res = np.empty_like(x)
        return res, res.reshape(-1)
    if type(out) is np.ndarray and out.dtype == x.dtype and out.shape == x.shape and \
            out.flags.c_contiguous and out.flags.writeable and out.flags.aligned and \
            (out is x or not np.may_share_memory(out, x)):
        return out, out.reshape(-1)
    return None


def describe(x):
    """A short description of a value for error messages: its type, and its
    dtype when it has one (``ndarray of complex64``)."""
    dtype = getattr(x, "dtype", None)
    return type(x).__name__ + (f" of {dtype}" if dtype is not None else "")


def as_real_float(x, name, func):
    """``x`` as a native float array for the framework layers: float arrays
    keep their dtype (float16 / float32 / float64); other real input (lists,
    scalars, integer or bool arrays) becomes float32.  None when ``x`` holds
    no real numbers (complex, object, None, strings): the caller raises its
    framework's TypeError."""
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return as_float_array(x, name, func)
    if is_cupy_array(x):  # (on the device: correctly rounded casts)
        if x.dtype.kind == "f":
            return as_float_array(x, name, func)
        return x.astype(np.float32) if x.dtype.kind in "biu" else None
    require_cpu(x, func)
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):
        return None
    if arr.dtype.kind not in "biuf":
        return None
    return arr.astype(np.float32)


def compute_dtype(dtype):
    """The dtype a recipe computes in: float16 is computed in float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def normalize_axis(axis, ndim, func):
    """``axis`` as a non-negative int, or None; clear errors otherwise."""
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"{func}: axis must be an int or None, got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{func}: axis {axis} is out of range for an array of ndim {ndim}")
    return axis % ndim


def collapse_repeats(arr, keep=None):
    """A view of ``arr`` with every stride-0 axis (a broadcast repeat) except
    ``keep`` cut to one element: the same set of values, for reductions that
    see only the set (min / max).  ``np.broadcast_to(1.5, 2**31)`` is then
    reduced from one element, not copied to 8 GiB first."""
    if arr.size <= 1 or 0 not in arr.strides:
        return arr
    index = tuple(slice(0, 1) if stride == 0 and i != keep else slice(None)
                  for i, stride in enumerate(arr.strides))
    return arr[index]


class Layout:
    """A contiguous 1-D view of an array and how channels lie in it.

    C-ordered arrays are used as they are; Fortran-ordered arrays are seen
    through their transpose (also C-ordered, axis mirrored); anything else is
    copied once to C order.
    """

    __slots__ = ("flat", "order", "shape", "xp")

    def __init__(self, arr, dtype):
        self.shape = arr.shape
        self.xp = array_module(arr)
        if arr.dtype != dtype:
            arr = arr.astype(dtype, order="K")
        aligned = is_aligned(arr)
        if arr.flags.c_contiguous and aligned:
            self.order = "C"
            self.flat = arr.reshape(-1)
        elif arr.flags.f_contiguous and aligned:
            self.order = "F"
            self.flat = arr.T.reshape(-1)
        else:  # (an unaligned buffer, from a network or file, is copied too)
            self.order = "C"
            self.flat = arr.copy(order="C").reshape(-1)

    def channels(self, axis):
        """(outer, C, inner) of the flat view for channel axis ``axis``."""
        shape = self.shape if self.order == "C" else self.shape[::-1]
        if self.order == "F":
            axis = len(shape) - 1 - axis
        outer = math.prod(shape[:axis])  # Python ints: exact, and no numpy call overhead
        inner = math.prod(shape[axis + 1:])
        return outer, int(shape[axis]), inner

    def empty(self, dtype):
        """A new array of this shape and layout, and its flat view."""
        res = self.xp.empty(self.shape, dtype=dtype, order=self.order)
        return res, (res.reshape(-1) if self.order == "C" else res.T.reshape(-1))

    def flat_of(self, arr):
        """The flat view of ``arr`` in this layout, or None if it has none
        (an unaligned ``arr`` has none: the kernels need aligned data)."""
        if not is_aligned(arr):
            return None
        if self.order == "C" and arr.flags.c_contiguous:
            return arr.reshape(-1)
        if self.order == "F" and arr.flags.f_contiguous:
            return arr.T.reshape(-1)
        return None


def check_out(out, shape, dtype, func, name="out", xp=np):
    """Validate a user-supplied output array (of the input's array type)."""
    if not isinstance(out, xp.ndarray) or (xp is np) != isinstance(out, np.ndarray):
        kind = "cupy" if xp is not np else "numpy"
        raise TypeError(f"{func}: {name} must be a {kind} array like x, got "
                        f"{type(out).__name__}")
    if out.shape != tuple(shape):
        raise ValueError(f"{func}: {name} has shape {out.shape}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{func}: {name} has dtype {out.dtype}, expected {dtype}")
    if not is_writeable(out):
        raise ValueError(f"{func}: {name} is read-only")


class Output:
    """Where a kernel writes: the user's ``out`` directly when its layout,
    dtype and aliasing allow it, else a temporary copied back by ``finish``.

    ``work_dtype`` is what the kernel writes (uint8 for masks; a bool output
    is written through a uint8 view of the same bytes).
    """

    __slots__ = ("result", "flat", "_copy_to")

    def __init__(self, layout, src, out, out_dtype, work_dtype, func, name="out"):
        self._copy_to = None
        if out is not None:
            xp = layout.xp
            check_out(out, layout.shape, out_dtype, func, name, xp)
            flat = None
            if _writes_as(out.dtype, work_dtype):
                flat = layout.flat_of(out.view(work_dtype))
            if flat is not None and can_write_into(out, src):
                self.result, self.flat = out, flat
                return
            self._copy_to = out
        self.result, self.flat = layout.empty(work_dtype)

    def finish(self, out_dtype):
        """The array to return, in ``out_dtype``."""
        if self._copy_to is None and self.result.dtype == out_dtype:
            return self.result
        # float32 -> float16 overflows to +-inf: that is the documented result
        with np.errstate(over="ignore"):
            if self._copy_to is not None:
                res = self.result
                if is_cupy_array(res):  # (CuPy's casting copy would flush float32 subnormals)
                    res = astype_exact(res, self._copy_to.dtype)
                array_module(self._copy_to).copyto(self._copy_to, res, casting="unsafe")
                return self._copy_to
            if _writes_as(out_dtype, self.result.dtype):
                return self.result.view(out_dtype)
            return astype_exact(self.result, out_dtype)


def _writes_as(dtype, work_dtype):
    """True when an array of ``dtype`` can be written as ``work_dtype``."""
    dtype, work_dtype = np.dtype(dtype), np.dtype(work_dtype)
    return dtype == work_dtype or (dtype == np.bool_ and work_dtype == np.uint8)


def data_pointer(a):
    """Address of the first element of a numpy or cupy array."""
    return a.data.ptr if is_cupy_array(a) else a.__array_interface__["data"][0]


def can_write_into(out, src):
    """True when a kernel may write ``out`` while it reads ``src``: disjoint
    memory, or the very same elements (each read before it is written)."""
    return not array_module(out).may_share_memory(out, src) or _same_memory(out, src)


def _same_memory(a, b):
    """True when a and b are the same elements in the same order."""
    return (data_pointer(a) == data_pointer(b) and a.shape == b.shape
            and a.strides == b.strides and a.dtype.itemsize == b.dtype.itemsize)


INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1


def _int64(v, name, func):
    """``v`` unless it overflows the 64-bit integers the kernels take."""
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{func}: {name} must fit a 64-bit integer, got an integer of "
                         f"{v.bit_length()} bits")
    return v


def as_int(value, name, func):
    """An integral Python int, within int64, from an int-like or integral
    float (ValueError beyond int64: the kernels take C integers)."""
    if type(value) is int:
        return _int64(value, name, func)
    if isinstance(value, bool):
        raise TypeError(f"{func}: {name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return _int64(int(value), name, func)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return _int64(int(value), name, func)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
        return as_int(value.reshape(-1)[0].item(), name, func)
    raise TypeError(f"{func}: {name} must be an integer, got {value!r:.80}")


def check_eps(eps, func):
    """``eps`` as a float, finite and >= 0."""
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (numbers.Real, np.ndarray)) \
            or np.ndim(eps) != 0:
        raise TypeError(f"{func}: eps must be a real number, got {eps!r:.80}")
    e = float(eps)
    if not (math.isfinite(e) and e >= 0):
        raise ValueError(f"{func}: eps must be finite and >= 0, got {e}")
    return e


def check_range(quant_min, quant_max, func):
    """(qmin, qmax) as ints with qmin < qmax."""
    qmin = as_int(quant_min, "quant_min", func)
    qmax = as_int(quant_max, "quant_max", func)
    if qmin >= qmax:
        raise ValueError(f"{func}: quant_min must be < quant_max, got quant_min={qmin}, "
                         f"quant_max={qmax}")
    return qmin, qmax


def param_array(value, name, func, channels):
    """A quantization parameter as a float64 1-D array.

    Per tensor (``channels is None``) it must hold one value; per channel it
    must be a scalar (broadcast to every channel) or a 1-D array of
    ``channels`` values.
    """
    value = to_host(value)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{func}: {name} must be a real number or array, got {value!r}") from exc
    if np.asarray(value).dtype.kind not in "iufb":
        raise TypeError(f"{func}: {name} must be real, got dtype {np.asarray(value).dtype}")
    return param_shape(arr, name, func, channels,
                       lambda a: np.full(channels, a, dtype=np.float64))


def param_shape(arr, name, func, channels, broadcast):
    """``arr`` in a parameter's shape: one value per tensor (``channels is
    None``) as shape (1,); per channel a scalar through ``broadcast`` or a
    1-D array of ``channels`` values (numpy or cupy; no copy of its own)."""
    if channels is None:
        if arr.size != 1:
            raise ValueError(f"{func}: {name} must be a single value for per-tensor "
                             f"quantization (axis=None), got shape {arr.shape}")
        return arr.reshape(1)
    if arr.ndim == 0:
        return broadcast(arr)
    if arr.ndim != 1 or arr.shape[0] != channels:
        raise ValueError(f"{func}: {name} must be a 1-D array of {channels} values "
                         f"(x.shape[axis]), got shape {arr.shape}")
    return arr


def check_scale(scale, func, name="scale"):
    """Scales must be finite and > 0."""
    bad = ~(np.isfinite(scale) & (scale > 0))
    if bad.any():
        raise ValueError(f"{func}: {name} must be finite and > 0, got "
                         f"{scale[bad][:4].tolist()}{' ...' if bad.sum() > 4 else ''}")
