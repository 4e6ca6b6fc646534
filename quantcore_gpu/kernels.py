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
of ``quantcore/include``.  The generic kernels are instantiated for every
entry of the headers' tables as the CPU extension exports them
(:mod:`quantcore_gpu._runtime`: the compile and module caches; the code
families' launches are in :mod:`quantcore_gpu.format_kernels`).
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

import numpy as np

from ._runtime import (BLOCK_RECIPES, DECODE_FAMILIES, ENCODE_FAMILIES, FAMILIES, FAMILY_PARAMS,
                       GROUP_RECIPES, MODULE_LOG, QP_SCHEMES, SOURCES, _CTYPE, _FAMILY_LIST, _Idx,
                       _MM_CHAN_WORK, _MM_THREADS, _SCHEME_LIST, _THREADS, _VEC, _check, _counter,
                       _cupy, _dt, _ew_grid, _function, _grid, _index, _launch_ew, _mask_arg,
                       _param, _sm_count, compile_options, cuda_dir, include_dir, module_fields,
                       module_groups, warm_up)
from ._runtime import CHANNEL_OPS, channel_op, convert  # noqa: F401  (exported)
from ._runtime import _device_id, _device_info, _module, read_source  # noqa: F401  (tests)
from .format_kernels import (block_scaled_quant, decode, decode_groups, encode, encode_groups,
                             group_quant)

__all__ = [
    "SOURCES", "FAMILIES", "FAMILY_PARAMS", "compile_options", "include_dir", "cuda_dir",
    "minmax", "minmax_channels", "minmax_finish", "minmax_device",
    "ew", "ew_tensor", "fq_affine_exact", "ste", "histc_f32", "histogram_f32", "qparams",
    "QP_SCHEMES", "ObserverState", "observe",
    "ENCODE_FAMILIES", "DECODE_FAMILIES", "GROUP_RECIPES", "encode", "decode", "encode_groups",
    "decode_groups", "group_quant", "BLOCK_RECIPES", "block_scaled_quant",
    "numpy_row_sums", "numpy_column_sums", "lsq_grads", "module_groups", "module_fields",
    "warm_up", "MODULE_LOG", "convert", "channel_op", "CHANNEL_OPS",
]


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
_PW_SUB = 5      # QC_PW_SUB of reduce.cu: tree levels one block sums


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
    (see reduce.cu: one launch; two where the tree is more than 5 levels deep,
    rows of about 4096 values and more).
    Returns a device array of shape (rows,)."""
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
    split = max(_pairwise_depth(n) - _PW_SUB, 0)
    ct, it = _index(x.size)
    slots = cp.empty(rows << split, dtype=acc) if split else None
    acc_t = _CTYPE[acc]
    blocks = _sm_count() * 8  # (16 KiB of shared memory a block)
    sub = _function("reduce.cu", f"qc_pw_subtrees<{acc_t}, float, {ct}>")
    sub((max(1, min(rows << split, blocks)),), (_THREADS,),
        (x, slots, out, it(rows), it(n), np.int32(split)))
    if split:
        top = _function("reduce.cu", f"qc_pw_top<{acc_t}, {ct}>")
        top((max(1, min(rows, blocks)),), (_THREADS,),
            (slots, out, it(rows), it(n), np.int32(split)))
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


