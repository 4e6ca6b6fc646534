"""A stand-in for cupy, for testing without a GPU how quantcore's
framework layers treat cupy arrays (``quantcore._arrays.stage_cupy``).

``ndarray`` wraps host memory but behaves like a device array where it
matters: it refuses implicit conversion to numpy (``__array__`` raises, as
cupy's does), so any code path that would hand it to numpy unstaged fails
loudly; data moves only through ``get()``, ``asarray`` and ``copyto``.
"""
import contextlib
import types

import numpy as np


class ndarray:  # noqa: N801 - cupy's name
    __module__ = "cupy"

    def __init__(self, data):
        self._data = np.array(data, copy=True)
        self.device = contextlib.nullcontext()

    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)

    def get(self):
        return self._data.copy()

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (fake cupy)")

    def __len__(self):
        return len(self._data)

    def __repr__(self):
        return f"fake_cupy.ndarray({self._data!r})"


def asarray(value):
    return value if isinstance(value, ndarray) else ndarray(np.asarray(value))


def asnumpy(value):
    return value.get() if isinstance(value, ndarray) else np.asarray(value)


def copyto(dst, src):
    np.copyto(dst._data, src._data if isinstance(src, ndarray) else src)


def module():
    """The fake as a module object, to put in ``sys.modules["cupy"]``."""
    mod = types.ModuleType("cupy")
    mod.ndarray, mod.asarray, mod.asnumpy, mod.copyto = ndarray, asarray, asnumpy, copyto
    return mod
