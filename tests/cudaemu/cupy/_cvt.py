"""CuPy's float -> integer casts as the device does them.

CuPy casts (``astype``, ``copyto``, setitem, ``concatenate``) run an
elementwise kernel whose body is a C++ assignment ``out0 = in0`` compiled by
NVRTC, so a float -> integer cast is the device's conversion, not numpy's
(x86's): NVRTC 12.9 emits ``cvt.rzi.{s,u}{32,64}.f{32,64}`` (PTX ISA, *cvt*:
a float-to-integer result is clamped to the destination register's range,
NaN gives 0) and an 8- / 16-bit destination keeps the low bits of the
32-bit conversion of its signedness (``st.u8`` / ``st.u16``).  numpy gives
INT_MIN for NaN and out-of-range values and wraps a negative value into an
unsigned type (``-1.5`` -> uint8 255; the device: 0).  cudaemu_float.h has
the same rule for kernel code.
"""
import numpy as np


def float_to_int(a, dtype):
    """``a.astype(dtype)`` for a floating ``a`` and an integer ``dtype``, by
    the device's rule: truncate toward zero, NaN -> 0, clamp to the 32-bit
    (64-bit for 8-byte types) range of dtype's signedness, then keep dtype's
    low bits."""
    dtype = np.dtype(dtype)
    bits = 64 if dtype.itemsize == 8 else 32
    wide = np.dtype(f"{dtype.kind}{bits // 8}")
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if dtype.kind == "i" else (0, 2 ** bits - 1)
    with np.errstate(all="ignore"):
        t = np.trunc(np.asarray(a, np.float64))   # exact for float16 / float32
        low, high = t <= float(lo), t >= float(hi)  # float(hi) may round up: >= is exact
        inside = np.where(np.isnan(t) | low | high, 0.0, t).astype(wide)
    res = np.where(low, wide.type(lo), np.where(high, wide.type(hi), inside)).astype(wide)
    return res.astype(dtype)      # numpy's integer narrowing keeps the low bits
