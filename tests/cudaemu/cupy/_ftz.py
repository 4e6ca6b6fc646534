"""CuPy's own kernels flush float32 subnormals: the fake's model of it.

Real CuPy 13.x compiles every built-in operation on data (ufuncs such as
``+``, ``<``, ``cupy.abs``, ``cupy.maximum``; ``astype`` / casting copies;
reductions such as ``sum`` / ``max``) as an ElementwiseKernel or
ReductionKernel through ``cupy._core.core.compile_with_cache``, and that path
ends in ``cupy/cuda/compiler.py`` ``_compile_with_cache_cuda``, which appends
``-ftz=true`` (see ../README.md for the lines).  So on a GPU every float32
operand of such an operation that is subnormal is read as a zero of its sign,
and every float32 result that would be subnormal is written as one.

What real CuPy does not flush is left alone here too: copies and selects
(``copy``, ``astype`` to the same dtype, ``cupy.where``, ``concatenate`` of
one dtype, ``fill``, indexing), bit operations (``signbit``, ``copysign``,
``view``), integer and float16 / float64 arithmetic, and host data converted
by numpy before the upload (``cupy.asarray(numpy_array, dtype=...)``).  The
reductions that CuPy may hand to its precompiled CUB library (built by nvcc
without ``-ftz``) are flushed all the same: whether CUB or a JIT reduction
kernel runs depends on layout and ``CUPY_ACCELERATORS``, so code must not
rely on either.

``ENABLED[0] = False`` turns the model off (the self-test shows a flushed
result that differs).  ``record()`` collects the float32 built-in
operations of a block of code, with the quantcore source line that asked for
each, for tests that prove a data path uses none.  With
``CUDAEMU_FTZ_LOG=file`` every such operation of the process is tallied by
calling site and written to ``file`` (appended, tab-separated) at exit.
"""
import atexit
import contextlib
import os
import sys

import numpy as np

from . import _cvt

#: the model is on unless a self-test turns it off to show that it matters
ENABLED = [True]
#: while recording: a list of (operation, largest float32 operand size, site)
_RECORDS = []
_RECORDING = [0]
_HERE = os.path.dirname(os.path.abspath(__file__))
_LOG_PATH = os.environ.get("CUDAEMU_FTZ_LOG")
#: (operation, site) -> [calls, largest float32 operand size], with CUDAEMU_FTZ_LOG
_LOG = {}

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_EXP = np.uint32(0x7F800000)
_SIGN = np.uint32(0x80000000)


def flush(a):
    """`a` with float32 subnormals replaced by zeros of their sign (a new
    array only where something flushes); other dtypes and objects as given."""
    if not ENABLED[0]:
        return a
    if isinstance(a, np.ndarray) and a.dtype == _F32:
        bits = a.view(np.uint32)
        sub = ((bits & _EXP) == 0) & ((bits & ~_SIGN) != 0)
        if sub.any():
            return np.where(sub, bits & _SIGN, bits).astype(np.uint32).view(np.float32)
        return a
    if isinstance(a, np.float32):
        return flush(np.asarray(a))[()]
    return a


def _is_f32(v):
    return isinstance(v, (np.ndarray, np.float32)) and np.asarray(v).dtype == _F32


def _site():
    """file:line of the first caller outside this fake package."""
    f = sys._getframe(2)
    while f is not None and (os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _HERE
                             or os.sep + "numpy" + os.sep in f.f_code.co_filename):
        f = f.f_back
    return "?" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


def note(op, operands, results=()):
    """Record a float32 built-in operation (while recording)."""
    if not (_RECORDING[0] or _LOG_PATH):
        return
    sizes = [np.asarray(v).size for v in (*operands, *results) if _is_f32(v)]
    if not sizes:
        return
    site = _site()
    if _RECORDING[0]:
        _RECORDS.append((op, max(sizes), site))
    if _LOG_PATH:
        e = _LOG.setdefault((op, site), [0, 0])
        e[0] += 1
        e[1] = max(e[1], max(sizes))


def _write_log():
    if _LOG_PATH and _LOG:
        with open(_LOG_PATH, "a") as f:
            for (op, site), (n, size) in sorted(_LOG.items(), key=lambda kv: kv[0][1]):
                f.write(f"{site}\t{op}\t{n}\t{size}\n")


atexit.register(_write_log)


def inputs(op, args):
    """The operands of a flushing operation, float32 ones flushed."""
    note(op, args)
    return [flush(a) for a in args]


def result(res):
    """A flushing operation's result(s), float32 ones flushed."""
    if isinstance(res, tuple):
        return tuple(flush(r) for r in res)
    return flush(res)


def cast(a, dtype, op="astype"):
    """``a.astype(dtype)`` as CuPy's casting copy does it on the device:
    between float32 and float64 (``cvt.ftz``) a float32 subnormal, operand
    or result, flushes."""
    dtype = np.dtype(dtype)
    if a.dtype.kind == "f" and dtype.kind in "iu":
        return _cvt.float_to_int(a, dtype)   # the device's conversion, not x86's
    with np.errstate(all="ignore"):
        if {a.dtype, dtype} != {_F32, _F64}:
            # the same dtype is a copy; from float32 to an integer, bool or
            # float16 a subnormal becomes a zero of its sign either way, and
            # no other source makes a float32 subnormal: nothing to model
            return a.astype(dtype)
        res = flush(flush(a).astype(dtype))
        note(op, [a], [res])
        return res


@contextlib.contextmanager
def record():
    """Collect the float32 built-in operations run inside the block: yields
    the list of (operation, largest float32 operand size, calling site)."""
    start = len(_RECORDS)
    out = []
    _RECORDING[0] += 1
    try:
        yield out
    finally:
        _RECORDING[0] -= 1
        out.extend(_RECORDS[start:])
        if not _RECORDING[0]:
            del _RECORDS[:]
