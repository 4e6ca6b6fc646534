"""ORT's calibrators (``calibrate.py``): MinMax, Entropy, Percentile,
Distribution, and ``create_calibrator``."""
import numbers
import warnings

import numpy as np

from ..._cpu import _kernels as K
from ..._cpu.threads import PARALLEL_THRESHOLD
from ..._locks import Locked, locked
from .executor import INLINE_VALUES, _map_tensors, _threads
from .histogram import HistogramCollector, _flat
from .qtypes import CalibrationMethod, _require_numpy
from .tables import TensorData, TensorsData


# ------------------------------------------------------------ calibrators
def iter_batches(data, func="collect_data"):
    """Batches (dicts ``{name: array}``) of ``data``: an ORT
    ``CalibrationDataReader`` (``get_next()`` until it returns a falsy value),
    an iterable of dicts, or a callable returning one."""
    if callable(data) and not hasattr(data, "get_next"):
        data = data()
    if hasattr(data, "get_next"):
        while True:
            batch = data.get_next()
            if not batch:
                return
            yield _check_batch(batch, func)
            del batch   # (not held while the reader makes the next one)
    else:
        try:
            it = iter(data)
        except TypeError:
            raise TypeError(f"{func}: expected a CalibrationDataReader (get_next()), an iterable "
                            f"of {{name: array}} dicts or a callable returning one, got "
                            f"{type(data).__name__}") from None
        for batch in it:
            if not batch:
                return
            yield _check_batch(batch, func)
            del batch


def _check_batch(batch, func):
    if not isinstance(batch, dict):
        raise TypeError(f"{func}: a batch must be a dict {{tensor name: array}}, got "
                        f"{type(batch).__name__}")
    for name, x in batch.items():
        _require_numpy(x, f"batch[{name!r}]", func)
    return batch


def _second_pass(data, func):
    """A fresh iterable over ``data`` for a second pass, or a TypeError."""
    if callable(data) and not hasattr(data, "get_next"):
        return data
    if hasattr(data, "get_next"):
        if not hasattr(data, "rewind"):
            raise TypeError(f"{func}: passes=2 reads the data twice; this reader has no "
                            "rewind(): pass a list of batches, a callable returning a fresh "
                            "iterable, or a reader with rewind()")
        return data
    if iter(data) is data:
        raise TypeError(f"{func}: passes=2 reads the data twice; an iterator can be read once: "
                        "pass a list of batches or a callable returning a fresh iterable")
    return data


_F32_F64 = (np.dtype(np.float32), np.dtype(np.float64))


def _finish_minmax(lo, hi, flags, sizes):
    """ORT's ReduceMin / ReduceMax with NaN skipped (module doc #9) from
    ``K.minmax_many``'s vectors, in place: a zero extreme is -0.0 when one
    was seen for the minimum (-0.0 < +0.0), +0.0 for the maximum; a
    non-empty all-NaN tensor gives NaN.  Returns the mask of tensors holding
    NaN."""
    zero = lo == 0
    lo[zero] = np.where(flags[zero] & 2, -0.0, 0.0)
    zero = hi == 0
    hi[zero] = np.where(flags[zero] & 4, 0.0, -0.0)
    nan = (flags & 1).astype(bool)
    if nan.any():
        dead = nan & (lo > hi) & (np.asarray(sizes) > 0)
        lo[dead] = hi[dead] = np.nan
    return nan


class _CallRanges:
    """The per-batch ``(lo, hi)`` of one ORT call, by tensor: ``add(name,
    lo, hi)`` one tensor's arrays; ``add_row(names, dtypes, lo, hi)`` a
    whole batch as two float64 vectors (exact), kept as rows while the
    batches have the same tensors.  ``items()`` gives each tensor's
    ``(mins, maxs)``: what ``np.asarray`` makes of the list of its
    per-batch arrays, the same array either way (``(B, 1)`` for scalars)."""

    def __init__(self):
        self.lists = {}
        self.rows = None    # (names, dtypes, [lo rows], [hi rows])

    def __bool__(self):
        return bool(self.lists) or self.rows is not None

    def add(self, name, lo, hi):
        self._rows_to_lists()
        mins, maxs = self.lists.setdefault(name, ([], []))
        mins.append(lo)
        maxs.append(hi)

    def add_row(self, names, dtypes, lo, hi):
        if self.lists or self.rows is not None and self.rows[:2] != (names, dtypes):
            self._rows_to_lists()       # (other tensors than the rows': one array each)
            for i, (name, dtype) in enumerate(zip(names, dtypes)):
                self.add(name, lo[i:i + 1].astype(dtype), hi[i:i + 1].astype(dtype))
            return
        if self.rows is None:
            self.rows = (names, dtypes, [], [])
        self.rows[2].append(lo)
        self.rows[3].append(hi)

    def _columns(self):
        names, dtypes, los, his = self.rows
        lo, hi = np.stack(los), np.stack(his)
        for i, (name, dtype) in enumerate(zip(names, dtypes)):
            yield name, (np.ascontiguousarray(lo[:, i:i + 1], dtype=dtype),
                         np.ascontiguousarray(hi[:, i:i + 1], dtype=dtype))

    def _rows_to_lists(self):
        if self.rows is None:
            return
        columns, self.rows = list(self._columns()), None
        for name, (mins, maxs) in columns:
            old = self.lists.setdefault(name, ([], []))
            old[0].extend(mins)
            old[1].extend(maxs)

    def items(self):
        if self.rows is not None and not self.lists:
            return list(self._columns())
        self._rows_to_lists()
        return list(self.lists.items())


class MinMaxCalibrater(Locked):
    """ORT's ``MinMaxCalibrater`` on batches of arrays (no model).

    Each batch is reduced at once to its per-tensor ``nanmin`` / ``nanmax``
    (``per_channel``: per channel of axis 1; a batch whose tensors are all
    C-contiguous float32 / float64, reduced in this thread -- no executor, or
    under INLINE_VALUES values --: one kernel call for all of them);
    ``collect_data(batches)`` is one ORT call: ``nanmin`` / ``nanmax`` over the
    call's batches (``moving_average``: ``nanmean``), ``symmetric`` -> ``(-m,
    m)``, merged with earlier calls by ``min`` / ``max`` or the float32 EMA
    ``old + c (new - old)``. Memory: one ``(C,)`` pair per batch of a call.

    Options beyond ORT's: ``ema_per_batch`` (every batch one EMA step);
    ``ort_bug_max_intermediate`` (ORT's loss of every ``k``-th batch group;
    by default every ``k`` batches are merged as one call, as ORT 1.17 did).
    ``tensors``: the names to calibrate (default: every name in the batches);
    ``executor``: a :func:`tensor_executor` reducing the tensors of a batch
    in parallel (None: one after the other).
    """

    method = CalibrationMethod.MinMax

    def __init__(self, symmetric=False, moving_average=False, averaging_constant=0.01,
                 max_intermediate_outputs=None, per_channel=False, *, tensors=None,
                 ema_per_batch=False, ort_bug_max_intermediate=False, executor=None):
        if not 0 <= averaging_constant <= 1:
            raise ValueError("Invalid averaging constant, which should not be < 0 or > 1.")
        if max_intermediate_outputs is not None and (
                isinstance(max_intermediate_outputs, bool) or
                not isinstance(max_intermediate_outputs, numbers.Integral) or
                max_intermediate_outputs < 1):
            raise ValueError(f"max_intermediate_outputs must be a positive int or None, got "
                             f"{max_intermediate_outputs!r}")
        self.symmetric = bool(symmetric)
        self.moving_average = bool(moving_average)
        self.averaging_constant = averaging_constant
        self.max_intermediate_outputs = max_intermediate_outputs
        self.per_channel = bool(per_channel)
        self.tensors = None if tensors is None else list(tensors)
        self.ema_per_batch = bool(ema_per_batch)
        self.ort_bug_max_intermediate = bool(ort_bug_max_intermediate)
        self.executor = executor
        self.calibrate_tensors_range = None
        self.nan_batches = {}

    def _reduce(self, name, x):
        """ORT's ReduceMin / ReduceMax of one batch, NaN skipped (module doc #9)."""
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise TypeError(f"tensor {name!r}: calibrated tensors are float16 / float32, "
                            f"got {x.dtype}")
        if self.per_channel and x.ndim >= 2:
            from ... import ops
            lo, hi = ops.minmax(x, axis=1, nan_policy="omit")
            nan = lo > hi  # empty or all-NaN channels
            if x.size and nan.any():
                lo, hi = lo.copy(), hi.copy()
                lo[nan] = hi[nan] = np.nan
                self.nan_batches[name] = self.nan_batches.get(name, 0) + 1
            return lo.reshape(-1), hi.reshape(-1)
        flat = np.ascontiguousarray(x).reshape(-1)
        if flat.dtype in _F32_F64:
            lo, hi, flags = K.minmax_many([flat], _threads(flat.shape[0]), PARALLEL_THRESHOLD)
            nan = bool(_finish_minmax(lo, hi, flags, [flat.size])[0])
            lo, hi = lo[0], hi[0]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                nan = bool(np.isnan(flat).any())
                lo = np.nanmin(flat) if flat.size else np.inf
                hi = np.nanmax(flat) if flat.size else -np.inf
            if nan and flat.size and lo > hi:
                lo = hi = np.nan
        if nan:
            self.nan_batches[name] = self.nan_batches.get(name, 0) + 1
        return np.array([lo], dtype=x.dtype), np.array([hi], dtype=x.dtype)

    def _select(self, batch):
        if self.tensors is None:
            return batch.items()
        missing = [t for t in self.tensors if t not in batch]
        if missing:
            raise KeyError(f"collect_data: the batch has no tensor {missing[0]!r} "
                           f"(it has {', '.join(map(repr, batch))})")
        return ((t, batch[t]) for t in self.tensors)

    @locked
    def collect(self, batch):
        """One ORT ``collect_data`` call with this one batch."""
        self.collect_data([batch])

    @locked
    def collect_data(self, data):
        """One ORT ``collect_data`` call over the batches of ``data`` (a
        CalibrationDataReader, an iterable of dicts or a callable)."""
        k = self.max_intermediate_outputs
        call, buffered = _CallRanges(), 0
        for batch in iter_batches(data):
            items = list(self._select(batch))
            del batch
            if not self._reduce_batch(items, call):
                ranges = _map_tensors(self.executor, lambda item: self._reduce(*item), items,
                                      values=sum(np.size(x) for _, x in items))
                for (name, _), (lo, hi) in zip(items, ranges):
                    call.add(name, lo, hi)
            del items   # (no batch held while the next one is made)
            buffered += 1
            if self.ema_per_batch or (k is not None and buffered == k):
                if not (k is not None and buffered == k and self.ort_bug_max_intermediate):
                    self._finish_call(call)
                call, buffered = _CallRanges(), 0
        if not call and self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        if call:
            self._finish_call(call)

    def _reduce_batch(self, items, call):
        """:meth:`_reduce` of every tensor of a batch in one kernel call
        (``K.minmax_many``), added to ``call`` as one row of ranges; False
        (nothing done) unless every tensor is a C-contiguous float32 /
        float64 array, not per channel, and the batch is reduced in this
        thread (no executor, or fewer than INLINE_VALUES values).  The same
        values as :meth:`_reduce`'s, NaN batches counted alike."""
        if self.per_channel or not items:
            return False
        flats, sizes = [], []
        for _, x in items:
            if type(x) is not np.ndarray or x.dtype not in _F32_F64 or \
                    not x.flags.c_contiguous or not x.flags.aligned:
                return False
            flats.append(x.reshape(-1))
            sizes.append(x.size)
        total = sum(sizes)
        if self.executor is not None and total >= INLINE_VALUES:
            return False
        lo, hi, flags = K.minmax_many(flats, _threads(max(sizes, default=0)), PARALLEL_THRESHOLD)
        for i in np.flatnonzero(_finish_minmax(lo, hi, flags, sizes)):
            name = items[i][0]
            self.nan_batches[name] = self.nan_batches.get(name, 0) + 1
        call.add_row(tuple(name for name, _ in items), tuple(f.dtype for f in flats), lo, hi)
        return True

    def _finish_call(self, call):
        new = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN batches: NaN, as in ORT
            for name, (mins, maxs) in call.items():
                if self.moving_average:
                    lo = np.nanmean(mins, axis=0)
                    hi = np.nanmean(maxs, axis=0)
                else:
                    lo = np.nanmin(mins, axis=0)
                    hi = np.nanmax(maxs, axis=0)
                if self.symmetric:
                    m = np.nanmax([np.abs(lo), np.abs(hi)], axis=0)
                    lo, hi = -m, m
                new[name] = (lo, hi)
        old = self.calibrate_tensors_range
        if old:
            for name, (lo, hi) in list(new.items()):
                if name not in old:
                    continue
                olo, ohi = old[name]
                if self.moving_average:
                    lo = olo + self.averaging_constant * (lo - olo)
                    hi = ohi + self.averaging_constant * (hi - ohi)
                elif np.size(lo) == 1:
                    lo, hi = min(olo, lo), max(ohi, hi)
                else:  # ORT fails here (truth value of an array); merged channel-wise
                    lo, hi = np.fmin(olo, lo), np.fmax(ohi, hi)
                new[name] = (lo, hi)
            merged = dict(old)
            merged.update(new)
            new = merged
        self.calibrate_tensors_range = new

    @locked
    def compute_data(self):
        """:class:`TensorsData`: float32 ``(C,)`` arrays ``lowest`` / ``highest``."""
        if self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        return TensorsData(CalibrationMethod.MinMax, {
            k: TensorData(lowest=lo, highest=hi) for k, (lo, hi) in
            self.calibrate_tensors_range.items()})


class _HistogramCalibrater(Locked):
    """Streaming twin of ORT's ``HistogramCalibrater`` (module docstring:
    ``passes=1`` -- one ORT call per batch; ``passes=2`` -- one ORT call per
    ``collect_data``).  ``executor``: a :func:`tensor_executor` reducing the
    tensors of a batch in parallel (the result does not depend on it)."""

    method = None
    _name = None

    def __init__(self, *, symmetric, num_bins, num_quantized_bins, percentile, scenario,
                 passes, tensors, executor):
        if passes not in (1, 2):
            raise ValueError(f"passes must be 1 (one ORT call per batch) or 2 (one ORT call per "
                             f"collect_data), got {passes!r}")
        for name, v in (("num_bins", num_bins), ("num_quantized_bins", num_quantized_bins)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.collector = HistogramCollector(self._name, symmetric, int(num_bins),
                                            int(num_quantized_bins), percentile, scenario)
        self.passes = passes
        self.tensors = None if tensors is None else list(tensors)
        self.executor = executor
        self.nan_batches = {}
        self.batches = 0

    symmetric = property(lambda self: self.collector.symmetric)
    num_bins = property(lambda self: self.collector.num_bins)

    def _select(self, batch):
        return MinMaxCalibrater._select(self, batch)

    def _arrays(self, batch):
        return [(name, _flat(x), np.shape(x)) for name, x in self._select(batch)]

    def _need_absmin(self, name):
        """Symmetric Percentile: min |x| is the first call's lower edge."""
        return self.collector.absolute and name not in self.collector.histogram_dict

    def _collect_tensor(self, item):
        name, a, _ = item
        col = self.collector
        stats = col.new_stats(name)
        stats.add(a, need_absmin=self._need_absmin(name))
        self._note_nan(name, stats.any_nan)
        col.finish(name, stats, col.plan(name, stats).add(a))

    @locked
    def collect(self, batch):
        """One ORT ``collect_data`` call with this one batch (one pass)."""
        items = self._arrays(_check_batch(batch, "collect"))
        _map_tensors(self.executor, self._collect_tensor, items,
                     values=sum(a.size for _, a, _ in items))
        self.batches += 1

    def _note_nan(self, name, nan):
        if nan:
            self.nan_batches[name] = self.nan_batches.get(name, 0) + 1

    @locked
    def collect_data(self, data):
        """``passes=1``: :meth:`collect` for every batch.  ``passes=2``: one ORT
        call over all the batches (the data is read twice)."""
        if self.passes == 1:
            n = self.batches
            for batch in iter_batches(data):
                self.collect(batch)
                del batch
            if self.batches == n and not self.collector.histogram_dict:
                raise ValueError("No data is collected.")
            return
        again = _second_pass(data, "collect_data")
        col = self.collector
        stats = {}
        nans = {}

        def add_range(item):
            name, a, shape = item
            if stats[name].add(a, need_absmin=self._need_absmin(name), shape=shape):
                nans[name] = nans.get(name, 0) + 1   # one thread per tensor

        for batch in iter_batches(data):
            items = self._arrays(batch)
            del batch
            for name, _, _ in items:
                stats.setdefault(name, col.new_stats(name))
            _map_tensors(self.executor, add_range, items, values=sum(a.size for _, a, _ in items))
            del items   # (no batch held while the next one is made)
        if not stats:
            raise ValueError("No data is collected.")
        plans = col.checked_plans(stats)
        if hasattr(again, "rewind"):
            again.rewind()
        for batch in iter_batches(again):
            items = [item for item in self._arrays(batch) if item[0] in plans]
            del batch
            _map_tensors(self.executor, lambda item: plans[item[0]].add(item[1]), items,
                         values=sum(a.size for _, a, _ in items))
            del items
            self.batches += 1
        for name, st in stats.items():
            if name in nans:
                self.nan_batches[name] = self.nan_batches.get(name, 0) + nans[name]
            col.finish(name, st, plans[name])

    @locked
    def compute_data(self):
        return TensorsData(self.method, self.collector.compute_collection_result())


class EntropyCalibrater(_HistogramCalibrater):
    """ORT's ``EntropyCalibrater`` (KL divergence, :func:`get_entropy_threshold`).
    ORT's defaults ``num_bins = num_quantized_bins = 128`` give one candidate,
    i.e. MinMax over each call (surprise 1)."""

    method = CalibrationMethod.Entropy
    _name = "entropy"

    def __init__(self, num_bins=128, num_quantized_bins=128, symmetric=False, *, passes=1,
                 tensors=None, executor=None):
        super().__init__(symmetric=symmetric, num_bins=num_bins,
                         num_quantized_bins=num_quantized_bins, percentile=99.999,
                         scenario="same", passes=passes, tensors=tensors, executor=executor)


class PercentileCalibrater(_HistogramCalibrater):
    """ORT's ``PercentileCalibrater`` (:meth:`HistogramCollector.compute_percentile`);
    ``symmetric=True`` (ORT's default) bins ``|x|``."""

    method = CalibrationMethod.Percentile
    _name = "percentile"

    def __init__(self, num_bins=2048, percentile=99.999, symmetric=True, *, passes=1,
                 tensors=None, executor=None):
        if not 0 <= percentile <= 100:
            raise ValueError(f"Invalid percentile. Must be in range 0 <= percentile <= 100, "
                             f"got {percentile!r}")
        super().__init__(symmetric=symmetric, num_bins=num_bins, num_quantized_bins=128,
                         percentile=percentile, scenario="same", passes=passes, tensors=tensors,
                         executor=executor)


class DistributionCalibrater(_HistogramCalibrater):
    """ORT's ``DistributionCalibrater`` (float 8: mean and std of the
    histogram, :meth:`HistogramCollector.compute_distribution`)."""

    method = CalibrationMethod.Distribution
    _name = "distribution"

    def __init__(self, num_bins=2048, scenario="same", *, passes=1, tensors=None, executor=None):
        if scenario not in ("same", "p3"):
            raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
        super().__init__(symmetric=False, num_bins=num_bins, num_quantized_bins=128,
                         percentile=99.999, scenario=scenario, passes=passes, tensors=tensors,
                         executor=executor)


def _method_of(method):
    if isinstance(method, CalibrationMethod):
        return method
    if type(method).__name__ == "CalibrationMethod" and hasattr(method, "name"):
        return CalibrationMethod[method.name]
    if isinstance(method, str):
        for m in CalibrationMethod:
            if m.name.lower() == method.lower():
                return m
    raise ValueError(f"Unsupported calibration method {method!r} (choose from "
                     f"{', '.join(m.name for m in CalibrationMethod)})")


#: create_calibrator's extra_options per method, with ORT's defaults
EXTRA_OPTIONS = {
    CalibrationMethod.MinMax: {"symmetric": False, "moving_average": False,
                               "averaging_constant": 0.01, "max_intermediate_outputs": None,
                               "per_channel": False},
    CalibrationMethod.Entropy: {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128},
    CalibrationMethod.Percentile: {"symmetric": True, "num_bins": 2048, "percentile": 99.999},
    CalibrationMethod.Distribution: {"num_bins": 2048, "scenario": "same"},
}


def create_calibrator(calibrate_method=CalibrationMethod.MinMax, extra_options=None, **kwargs):
    """The calibrator ORT's ``create_calibrator`` would build, with the same
    ``extra_options`` keys and defaults (unknown keys are refused); ``kwargs``
    pass quantcore's own options (``passes``, ``tensors``, ...)."""
    method = _method_of(calibrate_method)
    opts = dict(EXTRA_OPTIONS[method])
    unknown = sorted(set(extra_options or {}) - set(opts))
    if unknown:
        raise ValueError(f"create_calibrator: unknown extra_options {unknown} for {method.name} "
                         f"(known: {sorted(opts)})")
    opts.update(extra_options or {})
    cls = {CalibrationMethod.MinMax: MinMaxCalibrater,
           CalibrationMethod.Entropy: EntropyCalibrater,
           CalibrationMethod.Percentile: PercentileCalibrater,
           CalibrationMethod.Distribution: DistributionCalibrater}[method]
    return cls(**opts, **kwargs)
