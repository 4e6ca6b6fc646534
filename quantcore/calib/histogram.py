"""Calibrators: max and histogram statistics turned into a clipping range.

Two families, on numpy or cupy arrays (no SciPy, no PyTorch at run time):

* :class:`MaxCalibrator` and :class:`HistogramCalibrator` reproduce NVIDIA
  ``pytorch_quantization`` (PQ) calibrators bit for bit on float32, including
  the float32 rules of ``torch.histc``, ``torch.linspace`` and ``torch.arange``
  that PQ's default ``torch_hist=True`` path depends on
  (the project's NVIDIA / Horizon specification section 3).
* :class:`TorchHistogram` is the statistics half of PyTorch's
  ``torch.ao.quantization.HistogramObserver`` (the project's PyTorch specification section 2): the
  running histogram with its re-binning on range growth, and the greedy L2
  ("NormMinimization") search for the clipping range.  Turning the range into
  ``(scale, zero_point)`` is left to ``quantcore.qparams``.

Every statistic is data: ``state_dict()`` returns numpy arrays and plain
Python scalars only, ``load_state_dict()`` restores it exactly, and ``merge``
combines two calibrators that saw different data (exactly, where the
statistic allows it).

The float32 models of PyTorch CPU primitives these use (histc, linspace,
arange, the cascade sum) are in :mod:`quantcore.torch_numerics`.

cupy input is reduced and binned on the device: the batch never leaves it.
What crosses to the host, where the frameworks synchronise too (PQ's
``torch.min(x) < 0`` / ``x.max()`` / ``histc(max=...)``, torch's
HistogramObserver's ``.item()`` calls):

* MaxCalibrator: the amax stays a device array; one byte per ``collect``
  (whether it holds NaN, to raise).
* HistogramCalibrator, TorchHistogram: the batch's min and max (8 bytes)
  and its histogram counts (``bins`` values: the statistics, the bin edges
  and the threshold searches live on the host); the torch_hist=False first
  batch also reads the range it bins (8 bytes), and an input holding +-inf
  (TorchHistogram drops those values) its finite range.
"""
import bisect
import math
import numbers

import numpy as np

from . import _arrays as A
from . import qparams as Q
from . import torch_numerics as TN
from ._cpu.threads import PARALLEL_THRESHOLD
from ._warn import warn
from .observers import store_into

__all__ = ["MaxCalibrator", "HistogramCalibrator", "TorchHistogram"]

_f32 = np.float32


# ----------------------------------------------------------------- helpers
def _check_int(value, name, func, low=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{func}: {name} must be an int, got {value!r}")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{func}: {name} must be >= {low}, got {value}")
    return value


def _check_merge_partner(self, other, cls, attr, what, func):
    """A calibrator's ``merge`` takes only a ``cls`` whose ``attr`` equals
    its own (TypeError / ValueError saying which and both values)."""
    if not isinstance(other, cls):
        raise TypeError(f"{func}: other must be a {cls.__name__}, got {type(other).__name__}")
    mine, theirs = getattr(self, attr), getattr(other, attr)
    if theirs != mine:
        raise ValueError(f"{func}: {what} ({mine!r} vs {theirs!r})")


def _check_num_bits(num_bits, func):
    nb = _check_int(num_bits, "num_bits", func)
    if not 2 <= nb <= 16:
        raise ValueError(f"{func}: num_bits must be in 2..16, got {nb}")
    return nb


def _as_f32_input(x, func):
    """x as a C-contiguous float32 array (float16 / float64 are converted);
    cupy input stays on the device."""
    arr = A.as_float_array(x, "x", func)
    if A.is_cupy_array(arr):
        return A.array_module(arr).ascontiguousarray(arr, dtype=_f32)
    return np.require(arr, _f32, ["C", "A"])  # (aligned: the kernels need it)


def _keep_up(state, like):
    """``state`` on the side (host / device) of ``like``: the statistics
    follow the data (small copies)."""
    if A.is_cupy_array(like) and not A.is_cupy_array(state):
        return A.array_module(like).asarray(state)
    if not A.is_cupy_array(like) and A.is_cupy_array(state):
        return state.get()
    return state


def _device_amax(arr, keep, work):
    """``abs(arr).max(axis=<all but keep>, keepdims=True)`` of a cupy array
    in the compute dtype ``work``, on the device: per kept index, the
    finished (min, max) of one reduction, then ``max(|min|, |max|)`` (NaN
    where a NaN was seen)."""
    from .ops import _finish_minmax, _minmax_flags
    xp = A.array_module(arr)
    red = tuple(d for d in range(arr.ndim) if d not in keep)
    if not red:  # every axis kept: |x| itself
        return xp.abs(arr).astype(work)
    shape = tuple(arr.shape[d] if d in keep else 1 for d in range(arr.ndim))
    if not keep:
        flat, axis = arr, None
    elif len(keep) == 1:
        flat, axis = arr, keep[0]
    else:  # the kept axes first, in order: one channel per kept index
        flat = xp.ascontiguousarray(arr.transpose(keep + red)).reshape(
            math.prod(arr.shape[d] for d in keep), -1)
        axis = 0
    lo, hi, flags = _minmax_flags(flat, axis, "MaxCalibrator.collect")
    lo, hi = _finish_minmax(lo, hi, flags)
    alo, ahi = xp.abs(lo), xp.abs(hi)
    return xp.where(alo >= ahi, alo, ahi).astype(work).reshape(shape)


def _max_into(amax, local):
    """``maximum(amax, local)`` of NaN-free non-negative arrays, in place on
    the device (a select: no ufunc's signed-zero / NaN rule is involved)."""
    xp = A.array_module(amax)
    xp.copyto(amax, xp.where(local > amax, local, amax))
    return amax


# ------------------------------------------------------------ MaxCalibrator
class MaxCalibrator:
    """Running absolute maximum, NVIDIA ``pytorch_quantization`` style.

    Parameters
    ----------
    num_bits : int, default 8
        Kept for the quantizer that uses the amax (2..16).
    axis : None, int or tuple of ints
        None: one amax per tensor (a 0-d array).  Otherwise the axes that are
        *kept*: every other axis is reduced and the result keeps its
        dimensions, e.g. ``axis=0`` on (2, 2) gives shape (2, 1) and
        ``axis=(1,)`` on (2, 3, 4) gives (1, 3, 1).  A result of one element
        is squeezed to 0-d.  Negative axes count from the end.
    unsigned : bool, default False
    track_amax : bool, default False
        Keep a copy of every batch's amax in ``amaxs``.

    Notes
    -----
    ``collect(x)`` computes ``local = max(|x|)`` over the reduced axes and
    then ``amax = maximum(amax, local)`` elementwise.  float16 and float32
    input give a float32 amax, float64 a float64 amax.  A NaN in ``x``
    raises ValueError and leaves the state unchanged (PQ would store NaN);
    +-inf gives an inf amax, as in PQ.
    """

    def __init__(self, num_bits=8, axis=None, unsigned=False, track_amax=False):
        func = "MaxCalibrator"
        self._num_bits = _check_num_bits(num_bits, func)
        if axis is not None:
            axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
            for a in axes:
                _check_int(a, "axis", func)
            if len(set(axes)) != len(axes):
                raise ValueError(f"{func}: axis has repeated entries: {axis!r}")
            axis = tuple(int(a) for a in axes)
        self._axis = axis
        self._unsigned = bool(unsigned)
        self._track_amax = bool(track_amax)
        self._amax = None
        self.amaxs = []

    num_bits = property(lambda self: self._num_bits)
    axis = property(lambda self: self._axis)
    unsigned = property(lambda self: self._unsigned)

    def _reduce(self, arr, func):
        if self._axis is None:
            keep = ()
        else:
            keep = []
            for a in self._axis:
                if not -arr.ndim <= a < arr.ndim:
                    raise ValueError(f"{func}: axis {a} is out of range for an array of "
                                     f"ndim {arr.ndim}")
                keep.append(a % arr.ndim)
            keep = tuple(sorted(keep))
        if arr.size == 0:
            raise ValueError(f"{func}: x is empty")
        work = A.compute_dtype(arr.dtype)
        if A.is_cupy_array(arr):
            local = _device_amax(arr, keep, work)
            nan = bool(A.array_module(arr).isnan(local).any())  # (a one-byte read)
        elif not keep:
            local = np.asarray(np.abs(arr).max().astype(work))
            nan = bool(np.isnan(local).any())
        else:
            red = tuple(d for d in range(arr.ndim) if d not in keep)
            local = np.abs(arr).max(axis=red, keepdims=True).astype(work)
            nan = bool(np.isnan(local).any())
        if nan:
            raise ValueError(f"{func}: x contains NaN")
        if local.size == 1:
            local = local.reshape(())
        return local

    def collect(self, x):
        """Update the running amax with the abs-max of ``x``.

        Raises
        ------
        ValueError
            NaN in ``x``, an empty ``x``, an axis out of range, or an amax
            whose shape differs from the one collected before
            ("amax shape changed").
        """
        func = "MaxCalibrator.collect"
        arr = A.as_float_array(x, "x", func)
        local = self._reduce(arr, func)
        if self._amax is None:
            self._amax = local.copy()
        else:
            if local.shape != self._amax.shape:
                raise ValueError(f"{func}: amax shape changed! got {local.shape}, collected "
                                 f"{self._amax.shape} before")
            self._amax = _keep_up(self._amax, local)
            if isinstance(local, np.ndarray):
                np.maximum(self._amax, local, out=self._amax)  # in place, as PQ's copy_
            else:
                _max_into(self._amax, local)
        if self._track_amax:
            self.amaxs.append(local.copy())

    def compute_amax(self):
        """The collected amax (a copy), or None before any ``collect``."""
        return None if self._amax is None else self._amax.copy()

    def reset(self):
        """Forget everything collected."""
        self._amax = None
        self.amaxs = []

    def merge(self, other):
        """Fold in another calibrator's statistics: ``amax = maximum(a, b)``.

        Exact: merging calibrators that saw disjoint chunks gives the amax of
        a single pass over all of them.
        """
        func = "MaxCalibrator.merge"
        _check_merge_partner(self, other, MaxCalibrator, "_axis", "axis differs", func)
        if other._amax is None:
            return self
        if self._amax is None:
            self._amax = other._amax.copy()
        else:
            if other._amax.shape != self._amax.shape:
                raise ValueError(f"{func}: amax shapes differ ({self._amax.shape} vs "
                                 f"{other._amax.shape})")
            theirs = _keep_up(other._amax, self._amax)
            self._amax = np.maximum(self._amax, theirs) if isinstance(theirs, np.ndarray) \
                else _max_into(self._amax.copy(), theirs)
        if self._track_amax:
            self.amaxs.extend(a.copy() for a in other.amaxs)
        return self

    def state_dict(self):
        """``{"collected": bool, "amax": ndarray}`` (amax is an empty float32
        array when nothing was collected)."""
        amax = np.zeros((0,), _f32) if self._amax is None else self._amax.copy()
        return {"collected": self._amax is not None, "amax": amax}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""
        func = "MaxCalibrator.load_state_dict"
        _check_keys(state, ("collected", "amax"), func)
        if not state["collected"]:
            self._amax = None
            return
        amax = A.array_module(state["amax"]).array(state["amax"], copy=True)
        if amax.dtype.kind != "f":
            raise TypeError(f"{func}: amax must be a float array, got {amax.dtype}")
        self._amax = amax

    def __repr__(self):
        return (f"MaxCalibrator(num_bits={self._num_bits}, axis={self._axis!r}, "
                f"unsigned={self._unsigned}, track_amax={self._track_amax})")


def _check_keys(state, keys, func):
    if not isinstance(state, dict):
        raise TypeError(f"{func}: state must be a dict, got {type(state).__name__}")
    missing = [k for k in keys if k not in state]
    extra = [k for k in state if k not in keys]
    if missing or extra:
        raise ValueError(f"{func}: state keys do not match: missing {missing}, "
                         f"unexpected {extra}")


# ------------------------------------------------------ HistogramCalibrator
class HistogramCalibrator:
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

    def reset(self):
        """Forget everything collected."""
        self._num_bins = self._init_bins
        self._hist = None
        self._edges = None

    # -------------------------------------------------------------- collect
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
        from .ops import fake_quant_amax
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

    def state_dict(self):
        """``{"num_bins": int, "collected": bool, "hist": ndarray,
        "bin_edges": ndarray}`` (empty arrays before any collect)."""
        empty = np.zeros((0,), _f32)
        return {"num_bins": self._num_bins, "collected": self._hist is not None,
                "hist": empty if self._hist is None else self._hist.copy(),
                "bin_edges": empty if self._edges is None else self._edges.copy()}

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


# ----------------------------------------------------------- TorchHistogram
class TorchHistogram:
    """The statistics of PyTorch's ``HistogramObserver`` (torch 2.13 CPU),
    bit-exact on float32.

    Parameters
    ----------
    bins : int, default 2048
    upsample_rate : int, default 16

    Attributes
    ----------
    histogram : float32 array of ``bins`` counts
    min_val, max_val : 0-d float32 arrays (``+inf`` / ``-inf`` before any data)

    The three arrays are updated in place (``collect``, ``merge``, ``reset``,
    ``load_state_dict``), as torch updates the observer's buffers: a
    reference taken once sees every later update.

    Notes
    -----
    ``collect(x)`` (x is read as float32):

    * +-inf values are dropped with the warning "torch.inf detected in input
      tensor, ignoring input"; NaN raises ValueError (torch would store a
      NaN range).  Empty input is ignored.
    * First batch: ``histogram = histc(x, bins, min(x), max(x))``.
    * Later batches, with ``lo = min(min_val, min(x))``,
      ``hi = max(max_val, max(x))`` and ``h = histc(x, bins, lo, hi)``:
      unchanged range: ``histogram += h``.  Otherwise the old histogram is
      re-binned onto ``[lo, hi]`` and added to ``h``: an old single-valued
      range puts ``sum(histogram)`` in the bin of ``min_val``; else every old
      bin is split into ``upsample_rate`` pieces of ``count / rate`` whose
      midpoints ``linspace(min_val, max_val, bins*rate + 1)[:-1] +
      0.5 * (max_val - min_val) / (bins*rate)`` are bucketed into
      ``linspace(lo, hi, bins + 1)`` (``searchsorted(side="right") - 1``,
      clamped to ``[0, bins-1]``) and accumulated in float32 in order.

    :meth:`non_linear_param_search` is the greedy L2 search (see there).
    """

    def __init__(self, bins=2048, upsample_rate=16):
        func = "TorchHistogram"
        self.bins = _check_int(bins, "bins", func, low=1)
        self.upsample_rate = _check_int(upsample_rate, "upsample_rate", func, low=1)
        self.reset()

    def reset(self):
        """Back to the empty state."""
        self._store(np.zeros(self.bins, dtype=_f32), np.inf, -np.inf)

    def _store(self, histogram, min_val=None, max_val=None):
        """Write the state into its arrays in place (``None``: unchanged)."""
        store_into(self, "histogram", histogram, _f32)
        if min_val is not None:
            store_into(self, "min_val", np.reshape(min_val, ()), _f32)
            store_into(self, "max_val", np.reshape(max_val, ()), _f32)

    @property
    def initialized(self):
        return not (self.min_val == np.inf or self.max_val == -np.inf)

    def collect(self, x):
        """Add ``x`` to the running histogram; returns ``x``."""
        func = "TorchHistogram.collect"
        arr = _as_f32_input(x, func).reshape(-1)
        if arr.size == 0:
            return x
        x_min, x_max = TN.finished_range(arr)
        if x_min != x_min:
            raise ValueError(f"{func}: x contains NaN")
        if math.isinf(x_min) or math.isinf(x_max):
            warn("torch.inf detected in input tensor, ignoring input", UserWarning)
            if isinstance(arr, np.ndarray):
                arr = arr[np.isfinite(arr)]
            else:  # on the device the infinities become NaN, which histc skips
                xp = A.array_module(arr)
                arr = xp.where(xp.isinf(arr), _f32(np.nan), arr)
            x_min, x_max = TN.finished_range(arr, omit_nan=True)
            if x_min > x_max:  # nothing finite
                return x
        x_min, x_max = _f32(x_min), _f32(x_max)
        if not self.initialized:
            self._store(A.to_host(TN.histc_f32(arr, self.bins, float(x_min), float(x_max))),
                        x_min, x_max)
            return x
        cur_min, cur_max = _f32(self.min_val), _f32(self.max_val)
        new_min, new_max = min(cur_min, x_min), max(cur_max, x_max)
        update = A.to_host(TN.histc_f32(arr, self.bins, float(new_min), float(new_max)))
        if new_min == cur_min and new_max == cur_max:
            self._store(self.histogram + update)
            return x
        if cur_min == cur_max:
            mass = TN.sum_f32(self.histogram)
            old = (TN.histc_f32(np.array([cur_min], _f32), self.bins, float(new_min),
                                   float(new_max)) * mass).astype(_f32)
        else:
            old = self._upscale(self.histogram, cur_min, cur_max, new_min, new_max)
        self._store(update + old, new_min, new_max)
        return x

    def _upscale(self, hist, orig_min, orig_max, new_min, new_max):
        rate = self.upsample_rate
        n_fine = self.bins * rate
        fine = (np.repeat(hist, rate) / _f32(rate)).astype(_f32)
        bin_size = _f32(_f32(orig_max - orig_min) / _f32(n_fine))
        mids = (TN.linspace_f32(orig_min, orig_max, n_fine + 1)[:-1]
                + _f32(_f32(0.5) * bin_size)).astype(_f32)
        bounds = TN.linspace_f32(new_min, new_max, self.bins + 1)
        idx = np.searchsorted(bounds, mids, side="right") - 1
        np.clip(idx, 0, self.bins - 1, out=idx)
        out = np.zeros(self.bins, dtype=_f32)
        np.add.at(out, idx, fine)              # float32, in order, as bincount
        return out

    # ---------------------------------------------------------- L2 search
    def _quantization_error(self, start, end, dst_nbins):
        """L2 error of quantizing bins [start, end] onto ``dst_nbins`` levels,
        torch's float32 formula (uniform density within a source bin).

        IEEE arithmetic as torch's: ranges near the float32 limits overflow
        to inf (and inf - inf to NaN), tiny ones divide to inf, without
        numpy's RuntimeWarnings (torch prints nothing; the results agree)."""
        with np.errstate(all="ignore"):
            return self._quantization_error_f32(start, end, dst_nbins)

    def _quantization_error_f32(self, start, end, dst_nbins):
        nb = self.bins
        bin_width = (float(self.max_val) - float(self.min_val)) / nb
        dst_w = bin_width * (end - start + 1) / dst_nbins
        if dst_w == 0.0:
            return 0.0
        bw32, dw32 = _f32(bin_width), _f32(dst_w)
        half32 = _f32(dst_w / 2)
        src = np.arange(nb, dtype=np.int64)
        begin = ((src - start).astype(_f32) * bw32).astype(_f32)
        end_ = (begin + bw32).astype(_f32)
        dob = np.clip(np.floor_divide(begin, dw32), _f32(0), _f32(dst_nbins - 1)).astype(_f32)
        dob_center = ((dob + _f32(0.5)).astype(_f32) * dw32).astype(_f32)
        doe = np.clip(np.floor_divide(end_, dw32), _f32(0), _f32(dst_nbins - 1)).astype(_f32)
        density = (self.histogram / bw32).astype(_f32)

        def l2(b, e, dens):
            cube_e = ((e * e).astype(_f32) * e).astype(_f32)
            cube_b = ((b * b).astype(_f32) * b).astype(_f32)
            return (dens * ((cube_e - cube_b).astype(_f32) / _f32(3)).astype(_f32)).astype(_f32)

        norm = np.zeros(nb, dtype=_f32)
        delta_begin = (begin - dob_center).astype(_f32)
        norm = (norm + l2(delta_begin, np.full(nb, half32, _f32), density)).astype(_f32)
        inner = ((doe - dob).astype(_f32) - _f32(1)).astype(_f32)
        full = l2(_f32(-dst_w / 2), _f32(dst_w / 2), density)
        norm = (norm + (inner * full).astype(_f32)).astype(_f32)
        doe_center = ((doe * dw32).astype(_f32) + half32).astype(_f32)
        delta_end = (end_ - doe_center).astype(_f32)
        norm = (norm + l2(_f32(-dst_w / 2), delta_end, density)).astype(_f32)
        return float(TN.sum_f32(norm))

    def non_linear_param_search(self, dst_nbins=256):
        """Greedy L2 search for the clipping range (caffe2 NormMinimization).

        With ``total = sum(histogram)``, ``cs = cumsum(histogram)`` (float32),
        ``alpha = 0``, ``beta = 1``, ``start = 0``, ``end = bins - 1``: each
        step moves ``alpha`` up or ``beta`` down by ``1e-5``; ``l`` is the
        first bin in ``[start, end)`` with ``cs >= f32(alpha' * total)`` and
        ``r`` the last bin in ``(start, end]`` with ``cs <= f32(beta' * total)``;
        the side that moves more (``l - start > end - r``, else the end side)
        is taken.  Each new ``[start, end]`` is scored by the L2 error of
        mapping it onto ``dst_nbins`` uniform bins, a uniform density within
        each source bin contributing ``density * (b**3 - a**3) / 3`` per
        piece; the search stops when the error increases.

        Returns
        -------
        (new_min, new_max) : float32
            ``min_val + bw * start`` and ``min_val + bw * (end + 1)`` with
            ``bw = f32(f32(max_val - min_val) / bins)``.
        """
        func = "TorchHistogram.non_linear_param_search"
        dst_nbins = _check_int(dst_nbins, "dst_nbins", func, low=1)
        if not self.initialized:
            raise ValueError(f"{func}: no data collected")
        nb = self.bins
        with np.errstate(all="ignore"):  # (see _quantization_error)
            bw32 = _f32(_f32(self.max_val - self.min_val) / _f32(nb))
        total = float(TN.sum_f32(self.histogram))
        csum = TN.cumsum_f32(self.histogram).tolist()    # exact float32 values
        stepsize = 1e-5
        alpha, beta = 0.0, 1.0
        start, end = 0, nb - 1
        norm_min = math.inf
        while alpha < beta:
            next_alpha = alpha + stepsize
            next_beta = beta - stepsize
            # torch compares a float32 tensor with a Python float in float32
            a32 = float(_f32(next_alpha * total))
            b32 = float(_f32(next_beta * total))
            # first bin lo in [start, end] with csum[lo] >= a32 (csum is non-decreasing)
            lo = min(max(bisect.bisect_left(csum, a32), start), max(end, start))
            # last bin hi in [start, end] with csum[hi] <= b32
            hi = max(min(bisect.bisect_right(csum, b32) - 1, end), start)
            next_start, next_end = start, end
            if (lo - start) > (end - hi):
                next_start = lo
                alpha = next_alpha
            else:
                next_end = hi
                beta = next_beta
            if next_start == start and next_end == end:
                continue
            norm = self._quantization_error(next_start, next_end, dst_nbins)
            if norm > norm_min:
                break
            norm_min = norm
            start, end = next_start, next_end
        with np.errstate(all="ignore"):
            new_min = _f32(self.min_val + _f32(bw32 * _f32(start)))
            new_max = _f32(self.min_val + _f32(bw32 * _f32(end + 1)))
        return new_min, new_max

    def calculate_qparams(self, quant_min=0, quant_max=255, symmetric=False, eps=Q.F32_EPS,
                          dst_nbins=256, zero_point=None):
        """``(scale, zero_point)`` as ``HistogramObserver.calculate_qparams``.

        The clipping range of :meth:`non_linear_param_search` (``dst_nbins``:
        256 for torch's 8-bit dtypes, whatever the range) through
        :func:`quantcore.qparams.affine_qparams`, or
        :func:`~quantcore.qparams.symmetric_qparams` (``zero_point`` as
        there).  Before any data: ``(1.0, 0)`` with a warning, as torch.

        Returns
        -------
        (scale float32[1], zero_point int64[1])
        """
        if not self.initialized:
            warn("TorchHistogram: no data collected yet; returning scale 1.0, zero point 0",
                 RuntimeWarning)
            return np.ones(1, _f32), np.zeros(1, np.int64)
        lo, hi = self.non_linear_param_search(dst_nbins)
        if symmetric:
            return Q.symmetric_qparams(lo, hi, quant_min, quant_max, eps, zero_point=zero_point)
        return Q.affine_qparams(lo, hi, quant_min, quant_max, eps)

    # ------------------------------------------------------ merge and state
    def merge(self, other):
        """Add another ``TorchHistogram``'s counts; the bin edges must be equal.

        Equal edges means the same ``bins`` and the same ``min_val`` /
        ``max_val`` (e.g. partial histograms of chunks that all contain the
        global extremes); the counts are then added in float32, which is
        exact while every bin holds at most ``2**24``, so merging equals one
        histogram over all the data.  A different range raises ValueError:
        re-binning is lossy and order dependent, so it is not done here.
        """
        func = "TorchHistogram.merge"
        _check_merge_partner(self, other, TorchHistogram, "bins", "bins differ", func)
        if not other.initialized:
            return self
        if not self.initialized:
            self._store(other.histogram, other.min_val, other.max_val)
            return self
        if self.min_val != other.min_val or self.max_val != other.max_val:
            raise ValueError(f"{func}: histograms have different bin edges (range "
                             f"[{float(self.min_val)}, {float(self.max_val)}] vs "
                             f"[{float(other.min_val)}, {float(other.max_val)}]); only equal "
                             "edges can be merged")
        self._store(self.histogram + other.histogram)
        return self

    def state_dict(self):
        """``{"histogram": float32 array, "min_val": float, "max_val": float}``."""
        return {"histogram": self.histogram.copy(), "min_val": float(self.min_val),
                "max_val": float(self.max_val)}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""
        func = "TorchHistogram.load_state_dict"
        _check_keys(state, ("histogram", "min_val", "max_val"), func)
        hist = np.array(A.to_host(state["histogram"]), dtype=_f32, copy=True)
        if hist.shape != (self.bins,):
            raise ValueError(f"{func}: histogram has shape {hist.shape}, expected "
                             f"({self.bins},)")
        self._store(hist, _f32(A.to_host(state["min_val"])), _f32(A.to_host(state["max_val"])))

    def __repr__(self):
        return f"TorchHistogram(bins={self.bins}, upsample_rate={self.upsample_rate})"

