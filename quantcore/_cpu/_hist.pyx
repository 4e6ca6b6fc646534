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
histograms (``_shares.pxd``, the schedule ``histc_f32`` of ``_kernels.pyx``
uses too) with the counting loops of ``qc_np_histogram.h``, built once per
SIMD level (``qc_hist_loops.cpp``; the build in use is _kernels', see
:func:`select_simd`); the shares are added at the end, so the counts do not
depend on the thread count.  ``absolute`` bins ``|x|`` without a temporary
array.
"""
import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcpy

from quantcore._cpu._shares cimport run_shares, share_threads

cdef extern from "qc_np_histogram.h":
    int64_t qc_np_hist_uniform_bin_f32(float x, float first, float last, float denom, float fn,
                                       int64_t n, const float *edges) noexcept nogil
    enum: QC_NPH_SUB    # interleaved histograms per thread

cdef extern from "qc_hist_builds.h":
    void qc_run_np_hist_uniform_count_f32(
        const float *x, int64_t cnt, float first, float last, float denom, float fn, int64_t n,
        const float *edges, float margin, int32_t zero_bin, int absolute,
        int64_t *counts) noexcept nogil
    void qc_run_np_hist_edges_count_f32(const float *x, int64_t cnt, const double *edges,
                                        int64_t n, double inv_width, int absolute,
                                        int64_t *counts) noexcept nogil
    void qc_run_np_abs_bits_range(const uint32_t *x, int64_t cnt, int32_t *out) noexcept nogil

cnp.import_array()

include "_simd_follow.pxi"


cdef struct UniformArgs:
    float first, last, denom, fn, margin
    int64_t n
    const float *edges
    int32_t zero_bin
    bint absolute
    int64_t *counts      # thread t's histograms at counts + t * QC_NPH_SUB * (n + 1)


cdef void _uniform_share(const float *xp, int64_t cnt, int t, void *ctx) noexcept nogil:
    """The uniform counting loop on thread t's share (run_shares)."""
    cdef const UniformArgs *a = <const UniformArgs *>ctx
    qc_run_np_hist_uniform_count_f32(xp, cnt, a.first, a.last, a.denom, a.fn, a.n, a.edges,
                                     a.margin, a.zero_bin, a.absolute,
                                     a.counts + t * QC_NPH_SUB * (a.n + 1))


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


cdef struct EdgesArgs:
    const double *edges
    int64_t n
    double inv_width
    bint absolute
    int64_t *counts      # thread t's histogram at counts + t * n


cdef void _edges_share(const float *xp, int64_t cnt, int t, void *ctx) noexcept nogil:
    """The edges counting loop on thread t's share (run_shares)."""
    cdef const EdgesArgs *a = <const EdgesArgs *>ctx
    qc_run_np_hist_edges_count_f32(xp, cnt, a.edges, a.n, a.inv_width, a.absolute,
                                   a.counts + t * a.n)


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
    parts_a = np.zeros((nt * QC_NPH_SUB, n + 1), dtype=np.int64)   # column n: values not counted
    out = np.empty(n, dtype=np.int64)
    a.counts = <int64_t *>cnp.PyArray_DATA(parts_a)
    cdef int64_t *o = <int64_t *>cnp.PyArray_DATA(out)
    cdef int64_t i, r
    with nogil:
        run_shares(_uniform_share, <const float *>cnp.PyArray_DATA(x), size, nt, &a)
        for i in range(n):     # the histograms added (no numpy call: this is per tensor)
            o[i] = a.counts[i]
        for r in range(1, nt * QC_NPH_SUB):
            for i in range(n):
                o[i] += a.counts[r * (n + 1) + i]
    return out


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


cdef void _abs_bits_share(const float *xp, int64_t cnt, int t, void *ctx) noexcept nogil:
    """qc_np_abs_bits_range on thread t's share (run_shares), into its pair."""
    qc_run_np_abs_bits_range(<const uint32_t *>xp, cnt, <int32_t *>ctx + 2 * t)


def absmin_f32(cnp.ndarray x, int nthreads=1):
    """``np.abs(x).min()`` of a non-empty float32 array as a Python float:
    NaN when x holds a NaN (numpy's minimum propagates it).  On the bit
    patterns (``qc_np_abs_bits_range``: ``|x|`` is the pattern without its
    sign bit, and for those the integer order is the float order, NaNs
    above +inf), each of ``nthreads`` threads over its share."""
    _check_x(x, "absmin_f32")
    cdef int64_t size = cnp.PyArray_SIZE(x)
    if size == 0:
        raise ValueError("absmin_f32: empty array")
    cdef int nt = share_threads(size, nthreads)
    cdef int32_t[::1] ranges = np.zeros(2 * nt, dtype=np.int32)
    cdef int32_t m = 0x7fffffff, h = 0
    cdef int t
    cdef float result
    with nogil:
        run_shares(_abs_bits_share, <const float *>cnp.PyArray_DATA(x), size, nt, &ranges[0])
        for t in range(nt):
            m = ranges[2 * t] if ranges[2 * t] < m else m
            h = ranges[2 * t + 1] if ranges[2 * t + 1] > h else h
        memcpy(&result, &m, sizeof(float))
    return float("nan") if h > 0x7f800000 else float(result)
