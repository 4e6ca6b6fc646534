# cython: language_level=3
"""numpy.histogram's counts of float32 data, bit for bit, in one pass.

onnxruntime's histogram calibrators call ``np.histogram`` (numpy 2.x); the
per-element rules are in ``quantcore/include/qc_np_histogram.h``:

* :func:`hist_uniform_f32` -- ``np.histogram(a, n, range=(first, last))``
  (numpy's float32 estimate of the bin and its two corrections against the
  float32 edges ``np.linspace(first, last, n + 1)``);
* :func:`hist_edges_f32` -- ``np.histogram(a, bins=edges)`` for explicit,
  non-decreasing edges (numpy's sort + searchsorted path, without sorting);
* :func:`absmin_f32` -- ``np.abs(a).min()`` with numpy's NaN propagation.

Each thread counts a contiguous share of the data into its own int64
histogram (``_shares.pxd``, the schedule ``histc_f32`` of ``_kernels.pyx``
uses too); the shares are added at the end, so the counts do not depend on
the thread count.  ``absolute`` bins ``|x|`` without a temporary array.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from libc.math cimport fabsf
from libc.string cimport memcpy

from quantcore._cpu._shares cimport run_shares, share_threads

cdef extern from "qc_np_histogram.h":
    float qc_np_hist_uniform_estimate_f32(float x, float first, float denom,
                                          float fn) noexcept nogil
    int32_t qc_np_hist_uniform_sure_index_f32(float f, float margin) noexcept nogil
    int64_t qc_np_hist_uniform_bin_f32(float x, float first, float last, float denom, float fn,
                                       int64_t n, const float *edges) noexcept nogil
    int32_t qc_np_hist_uniform_index_f32(float f, int32_t n) noexcept nogil
    int64_t qc_np_hist_uniform_correct_f32(float x, int64_t i, int64_t n,
                                           const float *edges) noexcept nogil
    int64_t qc_np_hist_edges_bin(double x, const double *edges, int64_t n,
                                 int64_t guess) noexcept nogil

cnp.import_array()

cdef enum:
    CHUNK = 256   # values per estimate / count round (three buffers on the stack)
    SUB = 4       # interleaved histograms per thread (a power of two)
    LANES = 16    # running minima of absmin_f32


cdef void _uniform_block(const float *xp, int64_t cnt, float first, float last, float denom,
                         float fn, int64_t n, const float *edges, float margin, int32_t zero_bin,
                         bint absolute, int64_t *counts) noexcept nogil:
    """Count ``cnt`` values into ``counts``: SUB interleaved histograms of
    ``n + 1`` bins (consecutive values of one bin do not wait on each
    other's increment; the last bin takes the values that are not counted,
    so that skipping them is not a branch).  Per chunk of CHUNK values, in a
    branch-free loop that vectorises: numpy's float32 estimate of each
    value's bin, and the bin itself where the estimate is more than
    ``margin`` inside it (-1: it may need numpy's corrections; ``n``: not
    counted), and ``zero_bin`` for a zero (often an edge: (-t, t) in an even
    number of bins; a ReLU's output is half zeros).  Then one value at a
    time: count, or correct and count (values near an edge)."""
    cdef float absvals[CHUNK]
    cdef float est[CHUNK]
    cdef int32_t idx[CHUNK]
    cdef const float *vals
    cdef int64_t base = 0, m, k
    cdef int32_t n32 = <int32_t>n, i
    cdef float v
    cdef int64_t *sub[SUB]
    for k in range(SUB):
        sub[k] = counts + k * (n + 1)
    while base < cnt:
        m = cnt - base
        if m > CHUNK:
            m = CHUNK
        vals = xp + base
        if absolute:
            for k in range(m):
                absvals[k] = fabsf(vals[k])
            vals = absvals
        for k in range(m):
            v = vals[k]
            est[k] = qc_np_hist_uniform_estimate_f32(v, first, denom, fn)
            i = qc_np_hist_uniform_sure_index_f32(est[k], margin)
            i = zero_bin if v == 0 else i
            idx[k] = i if (v >= first) & (v <= last) else n32
        for k in range(m):
            i = idx[k]
            if i < 0:
                i = <int32_t>qc_np_hist_uniform_correct_f32(
                    vals[k], qc_np_hist_uniform_index_f32(est[k], n32), n, edges)
            sub[k & (SUB - 1)][i] += 1
        base += m


cdef struct UniformArgs:
    float first, last, denom, fn, margin
    int64_t n
    const float *edges
    int32_t zero_bin
    bint absolute
    int64_t *counts      # thread t's SUB histograms at counts + t * SUB * (n + 1)


cdef void _uniform_share(const float *xp, int64_t cnt, int t, void *ctx) noexcept nogil:
    """_uniform_block on thread t's share (run_shares)."""
    cdef const UniformArgs *a = <const UniformArgs *>ctx
    _uniform_block(xp, cnt, a.first, a.last, a.denom, a.fn, a.n, a.edges, a.margin, a.zero_bin,
                   a.absolute, a.counts + t * SUB * (a.n + 1))


cdef float _sure_margin(cnp.ndarray edges, float first, float last, int64_t n):
    """The margin of qc_np_hist_uniform_sure_index_f32 for numpy's edges of
    (first, last, n), in bins: twice (the error of numpy's estimate,
    ``4.01 n 2**-24`` relative to the exact position ``n (x - first) /
    (last - first)`` -- four float32 roundings -- plus ``n 2**-149 / width``
    for a subnormal ``x - first``, plus the largest distance of a float32
    edge from ``first + i width / n``, plus float64's error of that).  0.5
    (no value is sure) when it would be wider or ``n > 2**24``."""
    cdef double width = <double>last - <double>first      # exact in float64
    cdef double scale = max(abs(<double>first), abs(<double>last))
    if n > 16777216 or not width > 0:
        return 0.5
    ideal = <double>first + np.arange(n + 1, dtype=np.float64) * (width / n)
    edge_error = float(np.max(np.abs(edges.astype(np.float64) - ideal))) * n / width
    margin = 2.0 * (4.01 * n * 2.0 ** -24 + n * 2.0 ** -149 / width + edge_error +
                    8 * scale * 2.0 ** -52 * n / width)
    return <float>min(margin, 0.5)


cdef void _edges_block(const float *xp, int64_t cnt, const double *edges, int64_t n,
                       double inv_width, bint absolute, int64_t *counts) noexcept nogil:
    cdef int64_t k, b, guess
    cdef double v, g
    for k in range(cnt):
        v = fabsf(xp[k]) if absolute else xp[k]
        g = (v - edges[0]) * inv_width   # a starting point only; the walk is exact
        if g >= 0 and g < n:
            guess = <int64_t>g
        else:
            guess = 0 if not g >= 0 else n - 1
        b = qc_np_hist_edges_bin(v, edges, n, guess)
        if b >= 0:
            counts[b] += 1


cdef struct EdgesArgs:
    const double *edges
    int64_t n
    double inv_width
    bint absolute
    int64_t *counts      # thread t's histogram at counts + t * n


cdef void _edges_share(const float *xp, int64_t cnt, int t, void *ctx) noexcept nogil:
    """_edges_block on thread t's share (run_shares)."""
    cdef const EdgesArgs *a = <const EdgesArgs *>ctx
    _edges_block(xp, cnt, a.edges, a.n, a.inv_width, a.absolute, a.counts + t * a.n)


cdef _check_x(cnp.ndarray x, str func):
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT32 or not cnp.PyArray_ISCARRAY_RO(x):
        raise ValueError(f"{func}: expected an aligned C-contiguous float32 array")


cdef int64_t _check_bins(cnp.ndarray x, cnp.ndarray edges, int edges_type, str func) except -1:
    """The number of bins of ``edges`` (a C-contiguous array of
    ``edges_type``, at least 2 edges) for the float32 data ``x``."""
    _check_x(x, func)
    if cnp.PyArray_TYPE(edges) != edges_type or not cnp.PyArray_ISCARRAY_RO(edges):
        raise ValueError(f"{func}: edges must be a C-contiguous "
                         f"{cnp.PyArray_DescrFromType(edges_type)} array")
    cdef int64_t n = cnp.PyArray_SIZE(edges) - 1
    if n < 1:
        raise ValueError(f"{func}: need at least 2 edges, got {n + 1}")
    return n


def sure_margin(cnp.ndarray edges, float first, float last):
    """The margin :func:`hist_uniform_f32` uses for these float32 edges of
    ``(first, last)`` (computed once for a histogram counted in pieces)."""
    _check_bins(edges, edges, cnp.NPY_FLOAT32, "sure_margin")
    return _sure_margin(edges, first, last, cnp.PyArray_SIZE(edges) - 1)


def hist_uniform_f32(cnp.ndarray x, cnp.ndarray edges, float first, float last, bint absolute,
                     int nthreads, margin=None):
    """``np.histogram(x, n, range=(first, last))`` counts (int64[n]) of the
    float32 values of ``x`` (``|x|`` with ``absolute``); ``edges`` are the
    float32 ``np.linspace(first, last, n + 1)`` numpy builds for that call;
    ``margin`` :func:`sure_margin`'s for them (None: computed here)."""
    cdef int64_t n = _check_bins(x, edges, cnp.NPY_FLOAT32, "hist_uniform_f32")
    if n > 2147483646:
        raise ValueError(f"hist_uniform_f32: at most 2**31 - 2 bins, got {n}")
    cdef int64_t size = cnp.PyArray_SIZE(x)
    cdef int nt = share_threads(size, nthreads)
    cdef UniformArgs a
    a.first, a.last, a.n = first, last, n
    a.denom = last - first
    a.fn = <float>n
    a.edges = <const float *>cnp.PyArray_DATA(edges)
    a.margin = _sure_margin(edges, first, last, n) if margin is None else <float>margin
    a.zero_bin = <int32_t>qc_np_hist_uniform_bin_f32(0.0, first, last, a.denom, a.fn, n, a.edges)
    a.absolute = absolute
    parts_a = np.zeros((nt * SUB, n + 1), dtype=np.int64)   # column n: values not counted
    cdef int64_t[:, ::1] parts = parts_a
    a.counts = &parts[0, 0]
    with nogil:
        run_shares(_uniform_share, <const float *>cnp.PyArray_DATA(x), size, nt, &a)
    return parts_a[:, :n].sum(axis=0)


def hist_edges_f32(cnp.ndarray x, cnp.ndarray edges, bint absolute, int nthreads):
    """``np.histogram(x, bins=edges)`` counts (int64[len(edges) - 1]) of the
    float32 values of ``x`` (``|x|`` with ``absolute``) for non-decreasing
    float64 ``edges`` (float32 edges are passed widened: exact)."""
    cdef int64_t n = _check_bins(x, edges, cnp.NPY_FLOAT64, "hist_edges_f32")
    cdef EdgesArgs a
    a.edges = <const double *>cnp.PyArray_DATA(edges)
    a.n = n
    cdef double span = a.edges[n] - a.edges[0]
    a.inv_width = n / span if span > 0 else 0.0
    a.absolute = absolute
    cdef int64_t size = cnp.PyArray_SIZE(x)
    cdef int nt = share_threads(size, nthreads)
    parts_a = np.zeros((nt, n), dtype=np.int64)
    cdef int64_t[:, ::1] parts = parts_a
    a.counts = &parts[0, 0]
    with nogil:
        run_shares(_edges_share, <const float *>cnp.PyArray_DATA(x), size, nt, &a)
    return parts_a.sum(axis=0) if nt > 1 else parts_a[0]


def absmin_f32(cnp.ndarray x):
    """``np.abs(x).min()`` of a non-empty float32 array as a Python float:
    NaN when x holds a NaN (numpy's minimum propagates it).  On the bit
    patterns: ``|x|`` is the pattern without its sign bit, and for those
    (non-negative int32) the integer order is the float order, NaNs above
    +inf; LANES running integer minima (of ``|x|``) and maxima (a NaN when
    above ``0x7f800000``) side by side, a loop the compiler vectorises."""
    _check_x(x, "absmin_f32")
    cdef int64_t size = cnp.PyArray_SIZE(x), k, j, body
    if size == 0:
        raise ValueError("absmin_f32: empty array")
    cdef const int32_t *xp = <const int32_t *>cnp.PyArray_DATA(x)
    cdef int32_t low[LANES]
    cdef int32_t high[LANES]
    cdef int32_t m = 0x7fffffff, h = 0, v
    cdef float result
    with nogil:
        for j in range(LANES):
            low[j] = 0x7fffffff
            high[j] = 0
        body = size - size % LANES
        k = 0
        while k < body:
            for j in range(LANES):
                v = xp[k + j] & 0x7fffffff
                low[j] = v if v < low[j] else low[j]
                high[j] = v if v > high[j] else high[j]
            k += LANES
        for j in range(LANES):
            m = low[j] if low[j] < m else m
            h = high[j] if high[j] > h else h
        for k in range(body, size):
            v = xp[k] & 0x7fffffff
            m = v if v < m else m
            h = v if v > h else h
        memcpy(&result, &m, sizeof(float))
    return float("nan") if h > 0x7f800000 else float(result)
