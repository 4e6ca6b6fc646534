"""NVIDIA pytorch_quantization's HistogramCalibrator and its threshold
searches (entropy, mse, percentile; see quantcore.calib)."""
import math
import numbers

import numpy as np

from .. import _arrays as A
from .._locks import Locked, locked, locked_with_other
from .. import torch_numerics as TN
from .._cpu.threads import PARALLEL_THRESHOLD
from .._warn import warn
from ._common import (_as_f32_input, _check_int, _check_keys, _check_merge_partner, _check_num_bits,
                      _f32)


# ------------------------------------------------------ HistogramCalibrator
class HistogramCalibrator(Locked):
    """Histogram of ``|x|`` with percentile, entropy (KL) and MSE amax,
    bit-exact with NVIDIA ``pytorch_quantization`` (spec section 3).

    Parameters
    ----------
    num_bits : int, default 8
    axis : None
        Only per-tensor histograms exist; anything else raises
        NotImplementedError.
    unsigned : bool, default False
    num_bins : int, default 2048
        Bins of the first batch's histogram.
    grow_method : ignored
        Deprecated in PQ; a non-None value gives a DeprecationWarning.
    skip_zeros : bool, default False
        Drop exact zeros (after ``abs``) before histogramming.
    torch_hist : bool, default True
        True: PQ's torch path (float32 counts)::

            first batch:  hist  = histc(|x|, num_bins, 0, xm),  xm = max|x|
                          edges = linspace(0, xm, num_bins + 1)
            later batch:  if xm > edges[-1]:
                              w = f32(edges[1] - edges[0])
                              num_bins = ceil(f32(xm / w))
                              edges = arange(0, f32(xm + w), w)
                          h = histc(|x|, num_bins, 0, edges[-1])
                          h[:len(hist)] += hist;  hist = h

        (old counts are added by index, not re-binned; ``histc``,
        ``linspace`` and ``arange`` follow torch CPU's float32 rules, see the
        module docstring).  False: PQ's numpy path, ``np.histogram`` over
        ``[min, max]`` for the first batch and growth by appending
        ``np.arange(e[-1] + w, xm + w, w)`` to the edges.

    Notes
    -----
    NaN or +-inf in ``x`` raise ValueError (PQ fails inside ``histc`` too);
    the state is unchanged.  An all-zero first batch is stored as PQ stores
    it (all edges 0); a later batch then raises ValueError (PQ: a division
    by a zero bin width).
    """

    def __init__(self, num_bits=8, axis=None, unsigned=False, num_bins=2048, grow_method=None,
                 skip_zeros=False, torch_hist=True):
        func = "HistogramCalibrator"
        self._num_bits = _check_num_bits(num_bits, func)
        if axis is not None:
            raise NotImplementedError(
                f"{func}: Calibrator histogram collection only supports per tensor scaling "
                f"(axis must be None, got {axis!r})")
        if grow_method is not None:
            warn(f"{func}: grow_method is deprecated and ignored", DeprecationWarning)
        self._axis = None
        self._unsigned = bool(unsigned)
        self._init_bins = _check_int(num_bins, "num_bins", func, low=1)
        self._skip_zeros = bool(skip_zeros)
        self._torch_hist = bool(torch_hist)
        self.reset()

    num_bits = property(lambda self: self._num_bits)
    unsigned = property(lambda self: self._unsigned)
    torch_hist = property(lambda self: self._torch_hist)

    @property
    def num_bins(self):
        """Current number of bins (grows with the data range)."""
        return self._num_bins

    @property
    def hist(self):
        """The histogram counts (a copy), or None before any collect."""
        return None if self._hist is None else self._hist.copy()

    @property
    def bin_edges(self):
        """The bin edges (a copy), or None before any collect."""
        return None if self._edges is None else self._edges.copy()

    @locked
    def reset(self):
        """Forget everything collected."""
        self._num_bins = self._init_bins
        self._hist = None
        self._edges = None

    # -------------------------------------------------------------- collect
    @locked
    def collect(self, x):
        """Add ``|x|`` to the histogram (growing its range if needed)."""
        func = "HistogramCalibrator.collect"
        arr = _as_f32_input(x, func).reshape(-1)
        if arr.size == 0:
            raise ValueError(f"{func}: x is empty")
        lo, hi = TN.finished_range(arr)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"{func}: x contains NaN or inf")
        xm = _f32(max(-lo, hi))  # max |x|, also of the non-zero values when there are any
        if self._skip_zeros and xm == 0:
            raise ValueError(f"{func}: x is empty (after skip_zeros)")
        if self._torch_hist:
            self._collect_torch(arr, xm, lo < 0, func)
            return
        if not isinstance(arr, np.ndarray):
            self._collect_numpy_device(arr, lo, hi, xm, func)
            return
        arr = np.abs(arr) if lo < 0 else arr
        self._collect_numpy(arr[arr != 0] if self._skip_zeros else arr, func)

    def _collect_torch(self, x, xm, absolute, func):
        """Bin |x| (``absolute``: x has negative values), x's max |x| = xm."""
        kw = dict(absolute=absolute, skip_zeros=self._skip_zeros)
        if self._hist is None:
            self._hist = A.to_host(TN.histc_f32(x, self._num_bins, 0.0, float(xm), **kw))
            self._edges = TN.linspace_f32(0.0, xm, self._num_bins + 1)
            return
        edges, num_bins = self._edges, self._num_bins
        if xm > edges[-1]:
            w = _f32(edges[1] - edges[0])
            if w <= 0:
                raise ValueError(f"{func}: cannot grow a histogram whose bin width is 0 "
                                 "(the first batch was all zeros)")
            num_bins = int(math.ceil(_f32(xm / w)))
            edges = TN.arange_f32(_f32(xm + w), w)
        h = A.to_host(TN.histc_f32(x, num_bins, 0.0, float(edges[-1]), **kw))
        n = min(len(self._hist), len(h))
        h[:n] = (h[:n] + self._hist[:n]).astype(_f32)
        self._hist, self._edges, self._num_bins = h, edges, num_bins

    def _collect_numpy(self, x, func):
        if self._hist is None:
            self._hist, self._edges = np.histogram(x, bins=self._num_bins)
            return
        edges = self._grown_edges(np.max(x))
        h, edges = np.histogram(x, bins=edges)
        h[:len(self._hist)] += self._hist
        self._hist, self._edges = h, edges

    def _grown_edges(self, xm):
        """The edges, grown by PQ's numpy rule to hold ``xm``."""
        edges = self._edges
        if xm > edges[-1]:
            w = edges[1] - edges[0]
            edges = np.hstack((edges, np.arange(edges[-1] + w, xm + w, w)))
        return edges

    def _collect_numpy_device(self, x, lo, hi, xm, func):
        """:meth:`_collect_numpy` of a cupy batch with range [lo, hi]: the
        edges as numpy makes them (from the binned values' range, or grown),
        the counts by numpy's rules on the device
        (:func:`quantcore_gpu.kernels.histogram_f32`)."""
        G = A.gpu_kernels(func)
        absolute, skip = lo < 0, self._skip_zeros
        if self._hist is None:
            if absolute or skip:
                lo, hi = TN.abs_range(x, absolute, skip)
            # np.histogram(values, bins=n) takes its edges from the values'
            # range alone: the same edges (and errors) from that range
            edges = np.histogram(np.array([lo, hi], _f32), bins=self._num_bins)[1]
            counts = G.histogram_f32(x, edges, True, absolute, skip)
            self._hist, self._edges = counts.get(), edges
            return
        edges = np.histogram(np.zeros(0, _f32), bins=self._grown_edges(xm))[1]  # (checked)
        h = G.histogram_f32(x, edges, False, absolute, skip).get()
        h[:len(self._hist)] += self._hist
        self._hist, self._edges = h, edges

    # -------------------------------------------------------------- compute
    @locked
    def compute_amax(self, method, *, stride=1, start_bin=128, percentile=99.99):
        """The amax chosen from the histogram.

        Parameters
        ----------
        method : {"percentile", "entropy", "mse"}
        stride, start_bin : int
            Candidate bins ``range(start_bin, n, stride)`` for entropy and mse.
        percentile : float
            In ``[0, 100]``, for "percentile".

        Returns
        -------
        0-d float32 array, or None before any collect.

        Notes
        -----
        The counts are read as int64 and the edges as float32.

        percentile::

            cdf  = cumsum(hist / sum(hist))               (float64)
            amax = edges[searchsorted(cdf, percentile / 100, side="left")]

        (the left edge of the bin where the cdf crosses).

        entropy (TensorRT KL calibration), ``nq = 2**(num_bits - 1 + unsigned)``,
        ``bins = hist`` with ``bins[0] = bins[1]``, for each candidate ``i`` in
        ``range(start_bin, len(bins) + 1, stride)``::

            g(j)  = digitize(j, linspace(0, i, nq + 1)) - 1 = floor(j * nq / i)
            Q[j]  = mean of the nonempty bins[:i] of group g(j)   (0 if bins[j] == 0)
            P     = bins[:i];  P[i-1] += sum(bins[i:])
            KL(i) = sum_j p_j * ln(p_j / q_j),  p = P / sum(P), q = Q / sum(Q)

        with ``0 ln(0/q) = 0`` and ``p ln(p/0) = inf`` (as
        ``scipy.stats.entropy``).  ``round(sum(Q) + sum(bins[i:]))`` and
        ``round(sum(P))`` must equal ``sum(bins)`` (else RuntimeError "Count
        mismatch!").  amax = ``edges[i*]`` with ``i*`` the *last* candidate of
        minimal KL.  The stored histogram is not modified (PQ's numpy path
        writes ``bins[0] = bins[1]`` into it; that side effect is not
        reproduced).

        mse, ``c = f32((edges[1:] + edges[:-1]) / 2)``, for each candidate
        ``i`` in ``range(start_bin, len(c), stride)``::

            qc     = fake_quant_amax(c, c[i], num_bits, unsigned, narrow_range=True)
            mse(i) = f32(sum_f32((qc - c)**2 * counts) / len(c))

        (float32 throughout, the sum in torch CPU's order); amax = ``c[i*]``
        with ``i*`` the *first* candidate of minimal mse.
        """
        func = "HistogramCalibrator.compute_amax"
        if method not in ("percentile", "entropy", "mse"):
            raise TypeError(f"Unknown calibration method {method}")
        stride = _check_int(stride, "stride", func, low=1)
        start_bin = _check_int(start_bin, "start_bin", func, low=0)
        if method == "percentile":
            if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real):
                raise TypeError(f"{func}: percentile must be a real number, got {percentile!r}")
            if not 0 <= percentile <= 100:
                raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100."
                                 f" (got {percentile!r})")
        if self._hist is None:
            return None
        hist = self._hist.astype(np.int64)
        edges = np.asarray(self._edges, dtype=_f32)
        if method == "percentile":
            return self._percentile(hist, edges, percentile)
        if method == "entropy":
            return self._entropy(hist, edges, stride, start_bin, func)
        return self._mse(hist, edges, stride, start_bin, func)

    @staticmethod
    def _percentile(hist, edges, percentile):
        total = hist.sum()
        cdf = np.cumsum(hist / total)
        idx = np.searchsorted(cdf, percentile / 100)
        return np.asarray(edges[idx], dtype=_f32)

    def _entropy(self, hist, edges, stride, start_bin, func):
        bins = hist.copy()
        if len(bins) < 2:
            raise ValueError(f"{func}: entropy needs at least 2 bins, got {len(bins)}")
        bins[0] = bins[1]
        total = int(np.sum(bins))
        nq = 1 << (self._num_bits - 1 + int(self._unsigned))
        stop = len(bins)
        candidates = list(range(start_bin, stop + 1, stride))
        if not candidates:
            raise ValueError(f"{func}: no candidate bins: start_bin={start_bin} is beyond the "
                             f"{stop} histogram bins")
        # the candidates whose KL can be the minimum (all of them when the
        # screen does not apply), evaluated exactly; the last minimum wins
        keep = _entropy_screen(bins, candidates, nq, total)
        best_k, best = None, None
        for k in (range(len(candidates)) if keep is None else keep):
            kl = _entropy_divergence(bins, candidates[k], nq, total)
            if best is None or kl <= best:
                best_k, best = k, kl
        return np.asarray(edges[best_k * stride + start_bin], dtype=_f32)

    def _mse(self, hist, edges, stride, start_bin, func):
        from ..ops import fake_quant_amax
        centers = ((edges[1:] + edges[:-1]) / _f32(2)).astype(_f32)
        counts = hist.astype(_f32)
        if len(counts) != len(centers):
            raise ValueError(f"{func}: mse needs one count per bin, got {len(counts)} counts "
                             f"for {len(centers)} bins (PQ fails to broadcast here too)")
        candidates = range(start_bin, len(centers), stride)
        if not len(candidates):
            raise ValueError(f"{func}: no candidate bins: start_bin={start_bin} is beyond the "
                             f"{len(centers)} histogram bins")
        n = _f32(len(centers))
        amaxs = centers[np.asarray(candidates)]
        mses = np.empty(len(amaxs), dtype=_f32)
        # every candidate at once, in blocks of about 2**20 values: one column
        # per candidate, quantized per column (axis 1) with its amax; float32
        # arithmetic throughout (float32 operands give float32 results).  The
        # columns are quantized in groups below the threading threshold: many
        # small single-threaded calls beat a thread team that a busy machine
        # keeps waiting (2 cores shared: 6x slower)
        block = max(1, (1 << 20) // len(centers))
        group = max(1, (PARALLEL_THRESHOLD - 1) // len(centers))
        for k in range(0, len(amaxs), block):
            amax = amaxs[k:k + block]
            qc = np.empty((len(centers), len(amax)), dtype=_f32)
            for j in range(0, len(amax), group):
                part = amax[j:j + group]
                grid = np.broadcast_to(centers[:, None], (len(centers), len(part)))
                qc[:, j:j + group] = fake_quant_amax(grid, part, self._num_bits,
                                                     unsigned=self._unsigned,
                                                     narrow_range=True, axis=1)
            err = np.subtract(qc, centers[:, None], out=qc)        # (qc - c)**2 * counts,
            np.multiply(err, err, out=err)                         # in place
            np.multiply(err, counts[:, None], out=err)
            mses[k:k + block] = TN.sum_f32_columns(err) / n
        best = candidates[int(np.argmin(mses))]
        return np.asarray(centers[best], dtype=_f32)

    # ------------------------------------------------------ merge and state
    @locked_with_other
    def merge(self, other):
        """Add another calibrator's histogram; the bin edges must be equal."""
        func = "HistogramCalibrator.merge"
        _check_merge_partner(self, other, HistogramCalibrator, "_torch_hist",
                             "torch_hist differs", func)
        if other._hist is None:
            return self
        if self._hist is None:
            self._hist, self._edges = other._hist.copy(), other._edges.copy()
            self._num_bins = other._num_bins
            return self
        if (self._edges.shape != other._edges.shape or self._hist.shape != other._hist.shape
                or not np.array_equal(self._edges, other._edges)):
            raise ValueError(f"{func}: histograms have different bin edges ({len(self._edges)} "
                             f"edges up to {self._edges[-1]} vs {len(other._edges)} up to "
                             f"{other._edges[-1]}); only equal edges can be merged")
        self._hist = (self._hist + other._hist).astype(self._hist.dtype)
        return self

    @locked
    def state_dict(self):
        """``{"num_bins": int, "collected": bool, "hist": ndarray,
        "bin_edges": ndarray}`` (empty arrays before any collect)."""
        empty = np.zeros((0,), _f32)
        return {"num_bins": self._num_bins, "collected": self._hist is not None,
                "hist": empty if self._hist is None else self._hist.copy(),
                "bin_edges": empty if self._edges is None else self._edges.copy()}

    @locked
    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""
        func = "HistogramCalibrator.load_state_dict"
        _check_keys(state, ("num_bins", "collected", "hist", "bin_edges"), func)
        num_bins = _check_int(state["num_bins"], "num_bins", func, low=1)
        if not state["collected"]:
            self._num_bins, self._hist, self._edges = num_bins, None, None
            return
        hist = np.array(A.to_host(state["hist"]), copy=True)  # (host state; device values
        edges = np.array(A.to_host(state["bin_edges"]), copy=True)  # are copied)
        if hist.ndim != 1 or edges.ndim != 1 or len(edges) < 2:
            raise ValueError(f"{func}: hist and bin_edges must be 1-D (got shapes {hist.shape}"
                             f" and {edges.shape})")
        self._num_bins, self._hist, self._edges = num_bins, hist, edges

    def __repr__(self):
        return (f"HistogramCalibrator(num_bits={self._num_bits}, axis=None, "
                f"unsigned={self._unsigned}, num_bins={self._num_bins}, "
                f"skip_zeros={self._skip_zeros}, torch_hist={self._torch_hist})")


def _kl_divergence(p, q):
    """``scipy.stats.entropy(p, q)``: both normalised, natural log,
    ``sum(rel_entr(p, q))`` with ``rel_entr(0, y>=0) = 0`` and
    ``rel_entr(x>0, 0) = inf``."""
    with np.errstate(invalid="ignore", divide="ignore"):  # an all-zero q gives inf below
        p = 1.0 * p / np.sum(p)
        q = 1.0 * q / np.sum(q)
    out = np.zeros_like(p)
    pos = (p > 0) & (q > 0)
    out[pos] = p[pos] * np.log(p[pos] / q[pos])
    out[(p > 0) & ~(q > 0)] = np.inf
    out[(p < 0) | (q < 0)] = np.inf
    return float(np.sum(out))


def _entropy_divergence(bins, i, nq, total):
    """KL(i) of one entropy candidate, PQ's float64 computation (see
    :meth:`HistogramCalibrator.compute_amax`); RuntimeError "Count
    mismatch!" as PQ when the redistributed counts do not add up."""
    space = np.linspace(0, i, num=nq + 1)
    groups = np.digitize(np.arange(i), space) - 1
    head = bins[:i]
    nonempty = head != 0
    g = groups[nonempty]
    gsum = np.bincount(g, weights=head[nonempty].astype(np.float64), minlength=nq + 1)
    gcnt = np.bincount(g, minlength=nq + 1)
    q = np.zeros(i, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        q[nonempty] = (gsum / gcnt)[g]
    outliers = int(np.sum(bins[i:]))
    p = np.array(head)
    if i > 0:
        p[-1] += outliers
    total_new = float(np.sum(q)) + outliers
    total_old = int(np.sum(p))
    if round(total_new) != total or round(total_old) != total:
        raise RuntimeError(f"Count mismatch! total_counts_new={total_new}, "
                           f"total_counts_old={total_old}, total_data={total}")
    return _kl_divergence(p, q)


_U64 = 2.0 ** -53     # unit roundoff of float64


def _entropy_screen(bins, candidates, nq, total, block=1 << 18):
    """Indices of the entropy candidates whose KL can be the minimum, or
    None when this screen does not apply (then all are evaluated).

    :func:`_entropy_divergence` costs O(i) NumPy calls per candidate.  Here
    every candidate's KL is estimated at once from per-group sums: with
    ``p_j = P_j / T`` and ``q_j`` constant (``qg``) over the nonempty bins
    of a group ``g`` holding probability mass ``m_g``, a finite KL is
    exactly::

        KL(i) = sum_j p_j ln p_j - sum_g m_g ln qg_g + ln(sum_j q_j)

    The estimate and PQ's evaluation each differ from that real number by
    at most a few (n + nq) float64 roundings of the magnitudes involved
    (``bound`` below, with a 64x margin over the error analysis: numbers of
    additions, 1-ulp divisions, logs of <= 8 ulp); a candidate is kept
    unless its estimate minus the bound exceeds some candidate's estimate
    plus the bound.  PQ's minimum (and every candidate tied with it) is
    then always kept, so evaluating the kept ones exactly and taking the
    last minimum gives PQ's result, bit for bit.  KL = inf (mass past the
    last bin while that bin is empty) is known exactly.

    Not applied (None) for: no data, negative counts, more quantized levels
    than bins (the per-group arrays would outgrow the histogram), candidate
    0 (PQ's count check always fails there), or counts so large that the
    count check could fail by rounding (every candidate has to go through
    it then).
    """
    n = len(bins)
    if total <= 0 or bool((bins < 0).any()) or nq > n or 4 * (n + 2) * _U64 * total >= 0.5 \
            or candidates[0] == 0:
        return None
    cand = np.asarray(candidates, dtype=np.int64)
    mass_upto = np.concatenate(([0], np.cumsum(bins)))             # mass of bins[:j]
    count_upto = np.concatenate(([0], np.cumsum(bins != 0)))       # nonempty bins[:j]
    with np.errstate(divide="ignore", invalid="ignore"):
        pj = bins / total
        h = np.where(bins > 0, pj * np.log(pj), 0.0)              # p ln p <= 0
    h_upto = np.concatenate(([0.0], np.cumsum(h)))
    est = np.empty(len(cand))
    bound = np.zeros(len(cand))
    levels = np.arange(nq + 1, dtype=np.float64)
    rows = max(1, block // (nq + 1))
    # (rows of candidates known to be inf compute logs of 0: replaced below)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k0 in range(0, len(cand), rows):
            i = cand[k0:k0 + rows]
            # np.linspace(0, i, nq + 1) as PQ computes it: k * (i / nq), the end
            # exactly i; bin j is in group g when ceil(edge_g) <= j < ceil(edge_g+1)
            edge = levels[None, :] * (i / nq)[:, None]
            edge[:, -1] = i
            first = np.ceil(edge).astype(np.int64)
            mass = np.diff(mass_upto[first], axis=1)
            count = np.diff(count_upto[first], axis=1)
            used = count > 0
            qg = np.where(used, mass / count, 0.0)                 # q_j of the group
            log_qg = np.where(used, np.log(qg), 0.0)
            last = i - 1
            outliers = total - mass_upto[i]
            tail_full = bins[last] > 0
            # the outliers go to bin i - 1, in the group of that bin
            g_last = np.maximum((first[:, :-1] <= last[:, None]).sum(axis=1) - 1, 0)
            mass = mass.astype(np.float64)
            mass[np.arange(len(i)), g_last] += np.where(tail_full, outliers, 0)
            m = mass / total
            t2 = np.sum(m * log_qg, axis=1)
            t2_abs = np.sum(m * np.abs(log_qg), axis=1)
            log_s = np.log(np.sum(count * qg, axis=1))
            p_last = (bins[last] + outliers) / total
            h_last = np.where(tail_full, p_last * np.log(p_last), 0.0)
            t1 = h_upto[last] + h_last
            kl = t1 - t2 + log_s
            size = 1 + (-h_upto[last]) + np.abs(h_last) + t2_abs + np.abs(log_s) + np.abs(t1) \
                + np.abs(t2)
            b = 64 * (n + nq + 16) * _U64 * size
            infinite = ~tail_full & (outliers > 0)
            est[k0:k0 + rows] = np.where(infinite, np.inf, kl)
            bound[k0:k0 + rows] = np.where(infinite, 0.0, b)
    return np.flatnonzero(est - bound <= np.min(est + bound))
