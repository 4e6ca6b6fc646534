"""The statistics half of PyTorch's HistogramObserver (see quantcore.calib)."""
import bisect
import math

import numpy as np

from .. import _arrays as A
from .._locks import Locked, locked, locked_with_other
from .. import qparams as Q
from .. import torch_numerics as TN
from .._warn import warn
from ..observers import store_into
from ._common import (_as_f32_input, _check_int, _check_keys, _check_merge_partner, _f32)


# ----------------------------------------------------------- TorchHistogram
class TorchHistogram(Locked):
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

    @locked
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

    @locked
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

    @locked
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

    @locked
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
    @locked_with_other
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

    @locked
    def state_dict(self):
        """``{"histogram": float32 array, "min_val": float, "max_val": float}``."""
        return {"histogram": self.histogram.copy(), "min_val": float(self.min_val),
                "max_val": float(self.max_val)}

    @locked
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
