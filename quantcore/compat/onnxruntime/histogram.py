"""``np_histogram``, the streaming :class:`HistogramCollector` and the
threshold searches (entropy, percentile, distribution)."""
import warnings

import numpy as np

from ..._cpu import _hist as H
from ..._cpu import _kernels as K
from ..._locks import Locked, locked
from .executor import _threads
from .qtypes import _F32, _F64, _require_numpy
from .tables import TensorData


# ------------------------------------------------------------- histogram
def _is_f32_scalar(v):
    return isinstance(v, (np.floating, np.ndarray)) and np.asarray(v).dtype == np.float32 and \
        np.ndim(v) == 0


def _minmax_f32(flat):
    """(nanmin, nanmax, has_nan, has_zero) of a contiguous float32 array as
    numpy computes them: NaN for an all-NaN array, numpy's own sign for a
    zero when both -0.0 and +0.0 occur; ``has_zero``: a +-0.0 occurs."""
    lo, hi, flags = K.minmax(flat, _threads(flat.shape[0]))
    has_nan = bool(flags & 1)
    both_zeros = (flags & 6) == 6
    if lo > hi:  # non-empty and all NaN
        return _F32(np.nan), _F32(np.nan), True, False
    lo, hi = _F32(lo), _F32(hi)
    if lo == 0:
        lo = np.nanmin(flat) if both_zeros else (_F32(-0.0) if flags & 2 else _F32(0.0))
    if hi == 0:
        hi = np.nanmax(flat) if both_zeros else (_F32(0.0) if flags & 4 else _F32(-0.0))
    return lo, hi, has_nan, bool(flags & 6)


def _absmin_f32(flat, lo, hi, has_nan, has_zero):
    """``np.abs(flat).min()`` (float32) of a non-empty float32 array from
    what :func:`_minmax_f32` gave for it: NaN when it holds a NaN; ``|lo|``
    when no value is below zero, ``|hi|`` when none is above; 0 when it
    crosses zero and holds a zero; only otherwise a pass over the values."""
    if has_nan:
        return _F32(np.nan)
    if lo >= 0 or hi <= 0:
        return _F32(abs(lo) if lo >= 0 else abs(hi))
    return _F32(0.0) if has_zero else _F32(H.absmin_f32(flat, _threads(flat.shape[0])))


def _flat(a):
    a = np.asarray(a)
    if a.dtype == np.float32:
        flags = a.flags
        if flags.c_contiguous and flags.aligned:   # (np.require costs microseconds)
            return a.reshape(-1)
        return np.require(a, _F32, ["C", "A"]).reshape(-1)
    return a.reshape(-1)


def _outer_edges(a, range_, absolute):
    """numpy's ``_get_outer_edges`` (range checks, autodetection, +-0.5)."""
    if range_ is not None:
        first, last = range_
        if first > last:
            raise ValueError("max must be larger than min in range parameter.")
        if not (np.isfinite(first) and np.isfinite(last)):
            raise ValueError(f"supplied range of [{first}, {last}] is not finite")
    elif a.size == 0:
        first, last = 0, 1
    else:
        lo, hi, has_nan, has_zero = _minmax_f32(a)
        if absolute:
            first = _absmin_f32(a, lo, hi, has_nan, has_zero)
            last = _F32(np.nan) if has_nan else max(abs(lo), abs(hi))
        else:
            first, last = (_F32(np.nan), _F32(np.nan)) if has_nan else (lo, hi)
        if not (np.isfinite(first) and np.isfinite(last)):
            raise ValueError(f"autodetected range of [{first}, {last}] is not finite")
    if first == last:
        first, last = first - 0.5, last + 0.5
    return first, last


def np_histogram(a, bins, range=None, *, absolute=False):  # noqa: A002 - numpy's name
    """``numpy.histogram(a, bins, range)`` (of ``|a|`` with ``absolute``),
    counts (int64) and edges bit for bit, in one pass for float32 data.

    ``bins`` an int: numpy's uniform path (``np.linspace`` edges, the float32
    estimate and its two corrections, ``qc_np_histogram.h``); an array of
    non-decreasing edges: bin ``i`` counts ``e[i] <= v < e[i+1]`` (the last
    bin also ``v == e[n]``).  NaN and values outside the edges are not
    counted.  Data other than float32, and float32 data with a range whose
    ends are not float32, go to ``numpy.histogram`` itself.  The errors
    are numpy's (non-finite range, non-monotonic edges, too many bins).
    """
    a = _flat(_require_numpy(a, "a", "np_histogram"))
    if a.dtype != np.float32:
        return np.histogram(np.absolute(a) if absolute else a, bins, range)
    return _count_f32(a, _f32_binning(bins, range, absolute, a), bins, range, absolute)


_EMPTY_F32 = np.zeros(0, _F32)


def _f32_binning(bins, range_, absolute, a=_EMPTY_F32):
    """np_histogram's bins for float32 data, numpy's errors included:
    ``("uniform", edges, first, last)`` (``bins`` an int), ``("edges",
    edges, edges as float64)`` (an array), or ``("numpy",)`` where
    ``numpy.histogram`` takes the call (range ends that are not float32
    scalars, edges neither float32 nor float64, fewer than two edges).  The
    data ``a`` enters only with an int ``bins`` and no ``range_`` (the
    range is then its own): otherwise the bins are the same for every
    piece of data."""
    if np.ndim(bins) == 0:
        n = int(bins)
        if n < 1:
            raise ValueError("`bins` must be positive, when an integer")
        first, last = _outer_edges(a if range_ is None else _EMPTY_F32, range_, absolute)
        if range_ is not None and not (_is_f32_scalar(first) and _is_f32_scalar(last)):
            return ("numpy",)
        bin_type = np.result_type(first, last, _EMPTY_F32)
        edges = np.linspace(first, last, n + 1, endpoint=True, dtype=bin_type)
        if np.any(edges[:-1] >= edges[1:]):
            raise ValueError(f"Too many bins for data range. Cannot create {n} finite-sized bins.")
        if bin_type != np.float32:  # pragma: no cover - float32 data, float32 ends
            return ("numpy",)
        return ("uniform", edges, float(first), float(last))
    edges = np.asarray(bins)
    if np.any(edges[:-1] > edges[1:]):
        raise ValueError("`bins` must increase monotonically, when an array")
    if edges.dtype not in (np.float32, np.float64) or edges.size < 2:
        return ("numpy",)
    return ("edges", edges, np.ascontiguousarray(edges, dtype=_F64))


def _count_f32(flat, binning, bins, range_, absolute, margin=None):
    """(counts, edges) of the flat float32 array ``flat`` binned as
    ``binning`` (:func:`_f32_binning`; ``margin``: the uniform kernel's, when
    already known)."""
    kind, *args = binning
    if kind == "numpy":
        return np.histogram(np.absolute(flat) if absolute else flat, bins, range_)
    nthreads = _threads(flat.shape[0])
    if kind == "uniform":
        edges, first, last = args
        return H.hist_uniform_f32(flat, edges, first, last, absolute, nthreads, margin), edges
    edges, wide = args
    return H.hist_edges_f32(flat, wide, absolute, nthreads), edges


class _CallStats:
    """Range statistics of one ``collect_data`` call, batch by batch: what
    ORT computes on the stacked, flattened data of the call."""

    def __init__(self, absolute):
        self.absolute = absolute
        self.size = 0
        self.dtype = None
        self.min = self.max = None      # nanmin / nanmax (NaN when all NaN)
        self.any_nan = False
        self.absmin = None              # min |x| (NaN propagating), first abs call only

    def add(self, a, need_absmin=False, shape=None):
        if shape is not None:
            if getattr(self, "shape", shape) != shape:
                raise ValueError(
                    "setting an array element with a sequence. The requested array has an "
                    "inhomogeneous shape after 1 dimensions. (ORT stacks the batches of one "
                    f"collect_data call: shapes {self.shape} and {shape}; one call per batch, "
                    "CalibStridedMinMax=1 / strided=1, takes them)")
            self.shape = shape
        if self.dtype is not None and a.dtype != self.dtype:
            raise ValueError(f"The calibration expects only one element type but got "
                             f"{ {self.dtype, a.dtype} }")
        self.dtype = a.dtype
        if a.size == 0:
            return False
        self.size += a.size
        if a.dtype == np.float32:
            lo, hi, has_nan, has_zero = _minmax_f32(a)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: NaN, as in ORT
                lo, hi = np.nanmin(a), np.nanmax(a)
            has_nan = bool(np.isnan(a).any())
        self.any_nan |= has_nan
        self.min = lo if self.min is None else _nan_aware(min, self.min, lo)
        self.max = hi if self.max is None else _nan_aware(max, self.max, hi)
        if need_absmin:
            am = (_absmin_f32(a, lo, hi, has_nan, has_zero) if a.dtype == np.float32
                  else np.absolute(a).min())
            self.absmin = am if self.absmin is None else (
                am if am != am     # (NaN; np.isnan costs microseconds on a scalar)
                else (self.absmin if self.absmin != self.absmin else min(self.absmin, am)))
        return has_nan

    def signed(self):
        """(min, max) as ORT holds them: 0-d zeros for an empty call."""
        if self.size == 0:
            dt = self.dtype or np.dtype(_F32)
            return np.array(0, dtype=dt), np.array(0, dtype=dt)
        return self.min, self.max


def _nan_aware(pick, old, new):
    """nanmin / nanmax of two partial results (NaN only when both are; ``x !=
    x``: NaN, without np.isnan's microseconds on a scalar)."""
    if old != old:
        return new
    if new != new:
        return old
    return pick(old, new)


class _Plan:
    """How one call's values are binned: ``bins`` (int, with ``range``) or
    explicit ``edges``; ``absolute`` for |x|."""

    def __init__(self, bins, range_=None, absolute=False):
        self.bins, self.range, self.absolute = bins, range_, absolute
        self.counts = None
        self.edges = None
        self._binning = None    # float32 data: np_histogram's bins, worked out once
        self._margin = None     # (and the uniform kernel's margin)
        # the same bins for every piece: a range, or explicit edges
        self._fixed_bins = range_ is not None or np.ndim(bins) != 0

    def add(self, a):
        flat = _flat(a)
        if self._fixed_bins and flat.dtype == np.float32:
            counts, edges = self._add_f32(flat)
        else:
            counts, edges = np_histogram(a, self.bins, self.range, absolute=self.absolute)
        if self.counts is None:
            self.counts = counts
        else:
            self.counts += counts   # (its own array: the first piece's fresh counts)
        self.edges = edges
        return self

    def _add_f32(self, flat):
        """np_histogram(flat, bins, range) of float32 data, its bins (edges,
        checks, the kernel's margin) worked out on the first piece only (a
        histogram counted batch by batch: the same call each time)."""
        if self._binning is None:
            self._binning = _f32_binning(self.bins, self.range, self.absolute)
            if self._binning[0] == "uniform":
                self._margin = H.sure_margin(*self._binning[1:])
        return _count_f32(flat, self._binning, self.bins, self.range, self.absolute,
                          self._margin)

    def result(self, dtype):
        if self.counts is None:  # a call without batches: numpy on no data
            self.add(np.zeros(0, dtype=dtype))
        return self.counts, self.edges


class HistogramCollector(Locked):
    """ORT's ``HistogramCollector`` (Entropy, Percentile, Distribution).

    ``collect(name_to_arr)`` is one ``collect_data`` call: each value an
    array or a list of the call's batches (as if stacked).  The state per
    tensor is ORT's: ``(hist, hist_edges, min, max, threshold)`` for values,
    ``(hist, hist_edges, min, max)`` for ``|x|`` (symmetric Percentile).

    Values (``collect_value``): ``t = max(|nanmin|, |nanmax|)``; the first call
    bins over ``(-t, t)``; a later call with ``t <= t_old`` bins over the old
    range and adds; ``t_old == 0`` bins over ``(-t, t)`` and adds by index;
    otherwise the histogram grows by ``k = int((t - t_old) // stride + 1)``
    bins each side, ``stride = f32(2 t_old / N)``, ``t_new = f32(k stride + t_old)``.
    Absolute values: the first call bins ``|x|`` over ``(min|x|, max|x|)``; a
    later call with a larger ``max|x|`` appends ``np.arange(E[-1] + w, amax + w,
    w)`` (float64) edges; counts against the edges, old counts added by index,
    edges stored as float32.
    """

    def __init__(self, method, symmetric, num_bins, num_quantized_bins, percentile, scenario):
        if method not in ("entropy", "percentile", "distribution"):
            raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")
        self.histogram_dict = {}
        self.method = method
        self.symmetric = symmetric
        self.num_bins = num_bins
        self.num_quantized_bins = num_quantized_bins
        self.percentile = percentile
        self.scenario = scenario

    @property
    def absolute(self):
        """Percentile with symmetric=True bins |x| (ORT's collect_absolute_value)."""
        return self.method == "percentile" and bool(self.symmetric)

    def get_histogram_dict(self):
        return self.histogram_dict

    @locked
    def collect(self, name_to_arr):
        """One ORT ``collect`` call."""
        for tensor, data in name_to_arr.items():
            originals = [np.asarray(_require_numpy(d, tensor, "collect")) for d in
                         (data if isinstance(data, (list, tuple)) else [data])]
            arrays = [_flat(d) for d in originals]
            stats = self.new_stats(tensor)
            for a, d in zip(arrays, originals):
                stats.add(a, need_absmin=self.absolute and tensor not in self.histogram_dict,
                          shape=d.shape)
            plan = self.plan(tensor, stats)
            for a in arrays:
                plan.add(a)
            self.finish(tensor, stats, plan)

    # the three steps of a call (the streaming calibrators run them over batches)
    def new_stats(self, tensor):
        return _CallStats(self.absolute)

    def plan(self, tensor, stats):
        """The binning of this call, decided from its range statistics."""
        old = self.histogram_dict.get(tensor)
        if self.absolute:
            if old is None:
                if stats.size == 0:
                    return _Plan(self.num_bins, None, True)
                first, last = stats.absmin, (
                    stats.dtype.type(np.nan) if stats.any_nan else
                    max(abs(stats.min), abs(stats.max)))
                if not (np.isfinite(first) and np.isfinite(last)):
                    raise ValueError(f"autodetected range of [{first}, {last}] is not finite")
                if first == last:
                    first, last = first - 0.5, last + 0.5
                return _Plan(self.num_bins, (first, last), True)
            edges = old[1]
            if stats.size == 0:   # ORT: np.nanmax of nothing fails (surprise 18)
                return _Plan(edges, None, True)
            amax = stats.dtype.type(np.nan) if np.isnan(stats.min) else max(abs(stats.min),
                                                                           abs(stats.max))
            if amax > edges[-1]:
                width = edges[1] - edges[0]
                new_edges = np.arange(edges[-1] + width, amax + width, width)
                edges = np.hstack((edges, new_edges))
            return _Plan(edges, None, True)
        mn, mx = stats.signed()
        threshold = np.array(max(abs(mn), abs(mx)), dtype=stats.dtype or _F32)
        stats.threshold = threshold
        if old is None:
            return _Plan(self.num_bins, (-threshold, threshold))
        old_hist, _, _, _, old_threshold = old
        if threshold <= old_threshold:
            return _Plan(len(old_hist), (-old_threshold, old_threshold))
        if old_threshold == 0:
            return _Plan(len(old_hist), (-threshold, threshold))
        old_stride = 2 * old_threshold / len(old_hist)
        half = int((threshold - old_threshold) // old_stride + 1)
        new_threshold = half * old_stride + old_threshold
        plan = _Plan(len(old_hist) + 2 * half, (-new_threshold, new_threshold))
        plan.half, plan.new_threshold = half, new_threshold
        return plan

    def checked_plans(self, stats):
        """{tensor: plan} of every tensor of ``stats`` ({tensor: range
        statistics}), each checked as np.histogram checks its range and
        bins, in order, before any value is counted: the first error is the
        one ORT raises stacking the tensors one by one."""
        plans = {}
        for tensor, st in stats.items():
            plans[tensor] = self.plan(tensor, st)
            plans[tensor].add(np.zeros(0, st.dtype or _F32))
        return plans

    def finish(self, tensor, stats, plan):
        """Merge the call's counts into the state (ORT's update rules)."""
        dtype = stats.dtype or np.dtype(_F32)
        hist, edges = plan.result(dtype)
        old = self.histogram_dict.get(tensor)
        mn, mx = stats.signed()
        if self.absolute:
            edges = edges.astype(dtype)
            if old is not None and stats.size == 0:
                return   # an empty later call adds nothing (surprise 18)
            if old is None:
                self.histogram_dict[tensor] = (hist, edges, mn, mx)
            else:
                hist = hist.copy()
                hist[:len(old[0])] += old[0]
                self.histogram_dict[tensor] = (hist, edges, min(old[2], mn), max(old[3], mx))
            return
        threshold = stats.threshold
        if old is None:
            self.histogram_dict[tensor] = (hist, edges, mn, mx, threshold)
            return
        old_hist, old_edges, old_min, old_max, old_threshold = old
        if threshold <= old_threshold:
            state = (hist + old_hist, old_edges, old_threshold)
        elif old_threshold == 0:
            state = (hist + old_hist, edges, threshold)
        else:
            hist = hist.copy()
            hist[plan.half:len(hist) - plan.half] += old_hist
            state = (hist, edges, plan.new_threshold)
        self.histogram_dict[tensor] = (state[0], state[1], min(old_min, mn), max(old_max, mx),
                                       state[2])

    # --------------------------------------------------------- results
    @locked
    def compute_collection_result(self):
        if not self.histogram_dict:
            raise ValueError("Histogram has not been collected. Please run collect() first.")
        if self.method == "entropy":
            return self.compute_entropy()
        if self.method == "percentile":
            return self.compute_percentile()
        return self.compute_distribution()

    def compute_percentile(self):
        """``cdf = cumsum(H / sum H)``; symmetric ``(-E[i], E[i])``, ``i =
        searchsorted(cdf, p/100)``; else ``(E[searchsorted(cdf, c)],
        E[searchsorted(cdf, 1 - c)])``, ``c = (100 - p) / 200``; clipped to the
        signed min / max; ``(lo, hi, H[0], H[1])``."""
        if self.percentile < 0 or self.percentile > 100:
            raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
        out = {}
        for tensor, histogram in self.histogram_dict.items():
            hist, edges = histogram[0], histogram[1]
            with np.errstate(invalid="ignore", divide="ignore"):
                cdf = np.cumsum(hist / hist.sum())
            if self.symmetric:
                idx = np.searchsorted(cdf, self.percentile / 100.0)
                thr = (-np.array(edges[idx], dtype=edges.dtype),
                       np.array(edges[idx], dtype=edges.dtype))
            else:
                cut = (100.0 - self.percentile) / 200.0
                thr = (np.array(edges[np.searchsorted(cdf, cut)], dtype=edges.dtype),
                       np.array(edges[np.searchsorted(cdf, 1.0 - cut)], dtype=edges.dtype))
            out[tensor] = (*_clip_to(thr, histogram[2], histogram[3]), *hist[:2])
        return out

    def compute_entropy(self):
        out = {}
        for tensor, histogram in self.histogram_dict.items():
            out[tensor] = (*get_entropy_threshold(histogram, self.num_quantized_bins),
                           *histogram[:2])
        return out

    def compute_distribution(self):
        """Mean and standard deviation of the histogram (bin centres
        ``f32(f32(E[:-1] + E[1:]) * 0.5)``, ``p3``: centres ``|v|**(1/3) sign(v)``
        in float32), float64 sums, rounded to float32; range ``(min E, max E)``."""
        if self.num_bins < 512:
            raise ValueError("Invalid num_bins. Must be in range 512 <= num_bins.")
        if self.scenario not in ("same", "p3"):
            raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
        out = {}
        for tensor, histogram in self.histogram_dict.items():
            hist, edges = histogram[0], histogram[1]
            avg, std = _avg_std(hist, edges, 1 if self.scenario == "same" else 1.0 / 3.0)
            out[tensor] = TensorData(avg=avg, std=std, hist=hist, hist_edges=edges,
                                     lowest=edges.min(), highest=edges.max())
        return out


def _clip_to(thr, mn, mx):
    """ORT's final clip of a threshold pair to the observed min / max."""
    if thr[0] < mn:
        thr = (mn, thr[1])
    if thr[1] > mx:
        thr = (thr[0], mx)
    return thr


def _avg_std(hist, edges, power):
    values = (edges[:-1] + edges[1:]) * 0.5
    with np.errstate(invalid="ignore", divide="ignore"):
        if power != 1:
            fact = np.abs(values) / values
            fact[np.isnan(fact)] = 1
            fact[np.isinf(fact)] = 1
            values = np.abs(values) ** power * fact
        avg = (hist * values).sum() / hist.sum()
        std = ((hist * values ** 2).sum() / hist.sum() - avg ** 2) ** 0.5
    return np.array(avg, dtype=edges.dtype), np.array(std, dtype=edges.dtype)


def smooth_distribution(p, eps=0.0001):
    """ORT's smoothing: zeros become ``f32(eps)``, the others lose
    ``f32(eps * n_zeros / n_nonzeros)``; None when every entry is 0."""
    is_zeros = (p == 0).astype(_F32)
    is_nonzeros = (p != 0).astype(_F32)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = eps * float(n_zeros) / float(n_nonzeros)
    if not eps1 < 1.0:
        raise ValueError(f"smooth_distribution: n_zeros={n_zeros}, n_nonzeros={n_nonzeros}, "
                         f"eps1={eps1} (ORT asserts eps1 < 1)")
    hist = p.astype(_F32)
    hist += eps * is_zeros + (-eps1) * is_nonzeros
    if (hist <= 0).sum():
        raise ValueError("smooth_distribution: a smoothed entry is <= 0 (ORT asserts they are not)")
    return hist


def entropy(pk, qk):
    """ORT's own KL divergence in float32: ``p/sum p``, ``q/sum q``,
    ``sum(p log(p/q))`` with every term lacking ``p > 0 and q > 0`` set to +inf."""
    pk = np.asarray(pk).astype(_F32)
    pk = 1.0 * pk / np.sum(pk, axis=0, keepdims=True)
    qk = np.asarray(qk).astype(_F32)
    pk, qk = np.broadcast_arrays(pk, qk)
    qk = 1.0 * qk / np.sum(qk, axis=0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.empty(pk.shape, dtype=pk.dtype)
        res[:] = pk[:] * np.log(pk[:] / qk[:])
    res[(pk == 0) & (qk >= 0)] = 0
    res[~((pk > 0) & (qk > 0))] = np.inf
    return np.sum(res, axis=0).astype(pk.dtype)


def entropy_kl(hist, num_quantized_bins, dtype=_F32):
    """KL divergence of every candidate window (ORT's ``get_entropy_threshold``
    loop, float64 array; each entry ORT's float32 value) and the windows'
    ``(start, end)`` edge indices.  The integer bookkeeping is vectorised
    (cumulative sums, reshapes); ``p``, ``q`` and the KL are the same numpy
    float32 operations on the same arrays as ORT's, so the values are equal."""
    n = hist.size
    z, h = n // 2, num_quantized_bins // 2
    Q = num_quantized_bins
    count = z - h + 1
    if count < 1 or Q < 1:
        raise ValueError(f"entropy: num_bins ({n}) must be >= num_quantized_bins ({Q}) "
                         "(ORT fails with 'attempt to get argmin of an empty sequence')")
    cum = np.concatenate([[0], np.cumsum(hist)])
    total = cum[-1]
    kl = np.zeros(count)
    windows = []
    for i in range(h, z + 1):
        start, end = z - i, min(z + i + 1, n)
        windows.append((start, end))
        sliced = hist[start:end]
        p = sliced.copy()
        p[0] += cum[start]
        p[-1] += total - cum[end]
        m = sliced.size // Q
        qbins = sliced[:Q * m].reshape(Q, m).sum(axis=1)
        qbins[-1] += sliced[Q * m:].sum()
        norm = (p[:Q * m] != 0).reshape(Q, m).sum(axis=1)
        q = np.zeros(p.size, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q[:Q * m] = np.repeat(np.where(norm != 0, qbins / norm, 0.0), m)
        ps, qs = smooth_distribution(p), smooth_distribution(q)
        kl[i - h] = np.inf if ps is None or qs is None else np.array(entropy(ps, qs), dtype=dtype)
    return kl, windows


#: ORT's ``smooth_distribution`` asserts ``eps * n_zeros / n_nonzeros < 1``
#: (``eps = 1e-4``): a window of at most this many bins cannot fail it
_SMOOTH_SAFE_BINS = 10000


def _single_entropy_window(num_bins, num_quantized_bins):
    """True when ORT's KL search has one candidate window only --
    ``num_bins // 2 == num_quantized_bins // 2`` (ORT's defaults: 128 bins,
    128 quantized bins) -- and none of its assertions can fail on it
    (``num_bins <= 10000``): its threshold is then ``(E[0], E[n])``
    clipped to the observed min / max, the call's own range, whatever the
    counts (:func:`get_entropy_threshold` skips the KL divergence)."""
    return (num_bins // 2 == num_quantized_bins // 2 and num_quantized_bins >= 1 and
            1 <= num_bins <= _SMOOTH_SAFE_BINS)


def get_entropy_threshold(histogram, num_quantized_bins):
    """ORT's KL threshold: the window with the smallest KL (first minimum),
    ``(E[start], E[end])`` clipped to the observed min / max.

    With one candidate window (:func:`_single_entropy_window`) ORT's argmin
    of one KL value picks it whatever the value (inf, NaN): the window
    ``(0, min(2 h + 1, n))`` = ``(0, n)``, ``h = Q // 2 = n // 2``, is
    taken without computing it."""
    hist, edges = histogram[0], histogram[1]
    if _single_entropy_window(hist.size, num_quantized_bins):
        start, end = 0, min(hist.size // 2 + num_quantized_bins // 2 + 1, hist.size)
    else:
        kl, windows = entropy_kl(hist, num_quantized_bins, edges.dtype)
        start, end = windows[int(np.argmin(kl))]
    return _clip_to((edges[start], edges[end]), histogram[2], histogram[3])
