"""Float32 models of PyTorch CPU primitives (torch 2.13, x86-64): every
place where quantcore reproduces how torch computes, rather than what, in
one module.  Used by the calibrators (:mod:`quantcore.calib`: PyTorch's
HistogramObserver and NVIDIA's torch-histogram calibrator) and by
:mod:`quantcore.compat.torch`; each is checked against torch in the tests.

Float32 models of PyTorch CPU primitives (torch 2.13, x86-64), used here and
checked against torch in tests/test_calib.py:

``histc(x, nb, lo, hi)``
    ``lo == hi`` is replaced by the data's min / max, and if still equal by
    ``lo - 1, hi + 1`` (in double).  With ``l = f32(lo)``, ``h = f32(hi)``:
    ``b = trunc(f32(f32(f32(x - l) * nb) / f32(h - l)))``, ``b == nb`` counts
    in bin ``nb - 1``; values outside ``[l, h]`` and NaN are dropped.
``linspace(a, b, n)``
    ``step = f32(f32(b - a) / (n - 1))``; ``e_i = f32(a + step * i)`` for
    ``i < n // 2`` and ``e_i = f32(b - step * (n - 1 - i))`` otherwise, each
    rounded once (the kernel is compiled with FMA contraction).
``arange(0, end, w)``
    ``n = ceil(end / w)`` in double; in blocks of 16 (two 8-lane vectors):
    ``base = f32(w * i0)`` and lane ``k`` is ``f32(base + k * w)`` in double;
    the tail (``n % 16`` values) is ``f32(w * i)``.  Exact while
    ``n <= 32768`` (above that torch splits the work across threads and the
    block alignment depends on its thread count).
``sum`` (float32)
    torch's cascade sum: 8-lane float32 vectors, 4 interleaved accumulators,
    4 levels of chunked partial sums (see :func:`_torch_sum_f32`).
``cumsum`` (float32)
    accumulated in double, each prefix rounded to float32.
``fmaf(a, b, c)``
    one rounding of ``a * b + c`` (the kernels torch compiles with FMA
    contraction): :func:`fma_f32`.
integer conversions
    ``static_cast<int64_t>`` / ``<int32_t>`` of a float on x86: NaN, +-inf
    and values out of range give the type's minimum (:func:`x86_int64`,
    :func:`x86_int32`).
"""
import math

import numpy as np

from . import _arrays as A
from ._cpu import _kernels as K
from ._cpu.threads import effective_n_threads

_f32 = np.float32


def round_f32(hi, lo):
    """float32 rounding of the exact value ``hi + lo`` (float64 arrays, ``lo``
    the error term of a TwoSum), correctly rounded: round to odd in double,
    then to float32."""
    hi = np.asarray(hi, dtype=np.float64)
    lo = np.asarray(lo, dtype=np.float64)
    bits = hi.view(np.int64)
    fix = (lo != 0) & ((bits & 1) == 0) & np.isfinite(hi)
    if fix.any():
        hi = hi.copy()
        hi[fix] = np.nextafter(hi[fix], np.where(lo[fix] > 0, np.inf, -np.inf))
    return hi.astype(_f32)


def fma_f32(a, b, c):
    """``f32(a * b + c)`` rounded once, for float32-representable inputs.

    ``a * b`` is exact in double (24 + 24 bits); the sum's rounding error is
    recovered with TwoSum, so the result is the correctly rounded FMA.
    """
    p = np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    return round_f32(s, err)


def linspace_f32(start, end, steps):
    """``torch.linspace(start, end, steps)`` in float32, as torch CPU computes
    it (see the module docstring)."""
    a, b = _f32(start), _f32(end)
    if steps == 1:
        return np.array([a], dtype=_f32)
    step = _f32(_f32(b - a) / _f32(steps - 1))
    i = np.arange(steps, dtype=np.float64)
    half = steps // 2
    first = fma_f32(step, i[:half], a)
    second = fma_f32(-step, (steps - 1) - i[half:], b)
    return np.concatenate([first, second]).astype(_f32)


def arange_f32(end, step):
    """``torch.arange(0, end, step)`` in float32 (``end``, ``step`` > 0 read
    as doubles), with torch CPU's block-of-16 rule (module docstring)."""
    end, step = float(end), float(step)
    n = int(math.ceil(end / step))
    out = np.empty(n, dtype=_f32)
    nblk = (n // 16) * 16
    if nblk:
        i0 = np.arange(0, nblk, 8, dtype=np.float64)
        base = (step * i0).astype(_f32).astype(np.float64)       # exact product
        lanes = base[:, None] + np.arange(8, dtype=np.float64)[None, :] * step
        out[:nblk] = lanes.astype(_f32).reshape(-1)               # exact sums
    out[nblk:] = (step * np.arange(nblk, n, dtype=np.float64)).astype(_f32)
    return out


def histc_f32(x, bins, lo, hi, *, absolute=False, skip_zeros=False):
    """``torch.histc(v, bins, min=lo, max=hi)`` of the float32 values ``v``
    of ``x`` (``|x|`` when ``absolute``, zeros left out when ``skip_zeros``):
    float32 counts, in one pass of the C kernel (see the module docstring
    for the binning rule).

    The range as torch chooses it: ``lo == hi`` takes v's min and max; if
    those are equal too, the range is widened to at least one float32 step
    each way (``lo = min(f32 step down, lo - 1)``, ``hi`` alike).

    A cupy ``x`` is counted on the device
    (:func:`quantcore_gpu.kernels.histc_f32`, the same binning formula) and
    the counts come back as a float32 cupy array; only the range of ``v``
    is read to the host, where ``lo == hi`` asks for it.
    """
    lo, hi = float(lo), float(hi)
    on_device = not isinstance(x, np.ndarray)
    if lo == hi and x.size and on_device:
        v_lo, v_hi = abs_range(x.astype(_f32, copy=False).reshape(-1), absolute, skip_zeros)
        if v_lo <= v_hi:
            lo, hi = v_lo, v_hi
    elif lo == hi and x.size:
        v = np.abs(x) if absolute else x
        v = v[v != 0] if skip_zeros else v
        if v.size:
            lo, hi = float(np.min(v)), float(np.max(v))
    if lo == hi:
        lo = min(float(np.nextafter(_f32(lo), _F32_LOWEST)), lo - 1.0)
        hi = max(float(np.nextafter(_f32(hi), _F32_HIGHEST)), hi + 1.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"histc: range of [{lo}, {hi}] is not finite")
    if not lo < hi:
        raise ValueError(f"histc: max must be larger than min, got [{lo}, {hi}]")
    l32, h32 = _f32(lo), _f32(hi)
    if on_device:
        from quantcore_gpu import kernels as G
        x = x.astype(_f32, copy=False)
        flat = A.array_module(x).ascontiguousarray(x).reshape(-1)
        return G.histc_f32(flat, int(bins), float(l32), float(h32), bool(absolute),
                           bool(skip_zeros)).astype(_f32)
    x = np.require(x, _f32, ["C", "A"]).reshape(-1)
    counts = K.histc_f32(x, int(bins), float(l32), float(h32), bool(absolute),
                         bool(skip_zeros), effective_n_threads(x.shape[0]))
    return counts.astype(_f32)


_F32_LOWEST, _F32_HIGHEST = _f32(np.finfo(_f32).min), _f32(np.finfo(_f32).max)


def finished_range(arr, omit_nan=False):
    """(min, max) of a non-empty contiguous float32 array as Python floats,
    after quantcore's NaN / signed-zero rule (NaN propagates unless
    ``omit_nan``; an array of NaNs only then gives (inf, -inf)); for cupy
    input one reduction on the device and an 8-byte read."""
    if isinstance(arr, np.ndarray):
        lo, hi = K.minmax_finished(arr.reshape(-1), effective_n_threads(arr.size), omit_nan)
        return float(lo), float(hi)
    G = A.gpu_kernels("calib")
    out = A.array_module(arr).empty(2, dtype=_f32)
    G.minmax_device(arr.reshape(-1), 1, 1, arr.size, out[0:1], out[1:2],
                    finish=2 if omit_nan else 1)
    lo, hi = out.get()
    return float(lo), float(hi)


def abs_range(arr, absolute, skip_zeros):
    """(min, max) of the values a histogram bins: ``|arr|`` when
    ``absolute``, zeros left out when ``skip_zeros``, NaN left out
    ((inf, -inf) when none is left)."""
    xp = A.array_module(arr)
    v = A.abs_exact(arr) if absolute else arr
    if skip_zeros:
        v = xp.where(A.compare_exact(v, "==", 0.0), _f32(np.nan), v)
    return finished_range(v, omit_nan=True)


def _ceil_log2(x):
    return 1 if x <= 2 else int(x - 1).bit_length()


def _multi_row_sum(rows):
    """torch's multi_row_sum over axis 0 of ``rows`` (float32, any trailing
    shape): 4 levels of chunked partial sums."""
    size = rows.shape[0]
    num_levels = 4
    level_power = max(4, _ceil_log2(size) // num_levels) if size else 4
    level_step = 1 << level_power
    level_mask = level_step - 1
    acc = np.zeros((num_levels,) + rows.shape[1:], dtype=_f32)
    i = 0
    while i + level_step <= size:
        for _ in range(level_step):
            acc[0] = acc[0] + rows[i]
            i += 1
        for j in range(1, num_levels):
            acc[j] = acc[j] + acc[j - 1]
            acc[j - 1] = 0
            if i & (level_mask << (j * level_power)):
                break
    while i < size:
        acc[0] = acc[0] + rows[i]
        i += 1
    for j in range(1, num_levels):
        acc[0] = acc[0] + acc[j]
    return acc[0]


def _row_sum(data):
    """torch's row_sum: 4 interleaved accumulators, then the tail, then the
    partials in order.  ``data`` has shape (n, ...) float32."""
    n = data.shape[0]
    n_ilp = n // 4
    partial = _multi_row_sum(data[:n_ilp * 4].reshape((n_ilp, 4) + data.shape[1:]))
    partial = partial.copy()
    for i in range(n_ilp * 4, n):
        partial[0] = partial[0] + data[i]
    for k in range(1, 4):
        partial[0] = partial[0] + partial[k]
    return partial[0]


def sum_f32(x, vec=8):
    """``torch.sum`` of a contiguous 1-D float32 array on x86-64 AVX2
    (torch's ``cascade_sum``; exact model of the summation order for arrays
    small enough not to be split across threads, i.e. < 32768 values)."""
    x = np.ascontiguousarray(x, dtype=_f32).reshape(-1)
    n = x.shape[0]
    if n < vec:
        return _f32(_row_sum(x)) if n else _f32(0)
    nvec = n // vec
    lanes = _row_sum(x[:nvec * vec].reshape(nvec, vec))
    acc = _f32(0)
    for v in x[nvec * vec:]:
        acc = _f32(acc + v)
    for v in lanes:
        acc = _f32(acc + v)
    return acc


def sum_f32_columns(cols, vec=8):
    """:func:`sum_f32` of every column of the 2-D float32 array ``cols`` at
    once: the same float32 additions in the same order, each one done for all
    columns in one NumPy operation.  Returns a float32 array of
    ``cols.shape[1]`` sums."""
    cols = np.ascontiguousarray(cols, dtype=_f32)
    n, count = cols.shape
    if n < vec:
        return _row_sum(cols).astype(_f32) if n else np.zeros(count, _f32)
    nvec = n // vec
    lanes = _row_sum(cols[:nvec * vec].reshape(nvec, vec, count))
    acc = np.zeros(count, _f32)
    for v in cols[nvec * vec:]:
        acc = acc + v
    for v in lanes:
        acc = acc + v
    return acc


def cumsum_f32(x):
    """``torch.cumsum`` of float32 on CPU: double accumulator, float32 out."""
    return np.cumsum(np.asarray(x, dtype=np.float64)).astype(_f32)


def x86_int64(v):
    """``static_cast<int64_t>(float)`` on x86: NaN, inf and values outside
    the int64 range give INT64_MIN."""
    v = np.asarray(v, np.float64)
    ok = np.isfinite(v) & (v >= -2.0 ** 63) & (v < 2.0 ** 63)
    return np.where(ok, np.where(ok, v, 0).astype(np.int64), np.int64(-2 ** 63))


def x86_int32(z):
    """``.to(torch.int)`` on x86: NaN, inf and out-of-range values -> INT32_MIN."""
    z = np.asarray(z, np.float64)
    ok = np.isfinite(z) & (z > -2.0 ** 31 - 1) & (z < 2.0 ** 31)
    return np.where(ok, np.trunc(np.where(ok, z, 0)), -2.0 ** 31).astype(np.int32)
