"""Calibration across Dask workers, bit for bit one machine's.

:func:`calibrate` with ``client=`` (a ``distributed.Client``) takes the
calibration data as **partitions**, in order: each a ``.npz`` file (per-batch
``INDEX/INPUT`` arrays, or input arrays: one feed), a folder of ``.npz``
feeds (sorted by name), a list of such files, a list of feeds
(``{input: array}``), a callable returning a reader or an iterable of feeds
(called on the worker: a reader factory), or a tuple ``(npz path, start,
stop)``: batches ``start:stop`` of a per-batch ``.npz``; or a
``dask.bag.Bag`` of feeds (one partition per bag partition).  Paths must be
readable by the workers (a shared filesystem).  Each partition is one task:
its worker runs the model in its own ONNX Runtime session (made once per
worker process and model) and returns mergeable statistics; the client
merges them in partition order and computes the ranges ORT's calibrator
would compute over the concatenated batches, with ORT's grouping of the
batches into ``collect_data`` calls:

* MinMax (every option: ``symmetric``, ``moving_average``,
  ``averaging_constant``, ``max_intermediate_outputs``, ``strided``): each
  batch's ``(nanmin, nanmax)`` per tensor (ORT's ReduceMin / ReduceMax, NaN
  skipped), kept as rows in batch order; the client hands the rows, in
  order, to the same :class:`~quantcore.compat.onnxruntime.MinMaxCalibrater`
  one machine uses (each row taken as that batch's reduction; the default
  single call gets the ``(B, T)`` matrices it would stack, at once), so
  ``nanmean`` over the batches of a call (moving average), the EMA across
  calls and the grouping are one machine's.  ``B x T x 2`` values per
  partition of ``B`` batches and ``T`` tensors.
* Entropy, Percentile, Distribution (ORT's single call): two rounds.  First
  each partition's range statistics per tensor (size, dtype, shape, nanmin,
  nanmax, NaN, min ``|x|``: ORT's checks of the stacking included), merged
  in order; the client decides every tensor's bins from the merged range
  (``HistogramCollector.checked_plans``: numpy's checks in ORT's order).
  Then each partition counts its values into those bins and the counts are
  summed (integers: exact in any order) in a tree of tasks; the client
  finishes the histograms as the one-machine call does.  The model runs
  twice over each partition; the counts travel once per tree node (``T x
  bins`` int64).  Entropy with ORT's default bins in :func:`quantize`
  (``histograms=False``) needs the ranges only: one round.

Batches are numbered in partition order, and ORT's errors are raised for the
concatenated data (a partition whose tensors differ in shape from the
others': ORT's stacking ValueError).  An error in a partition is a
ValueError naming it; a worker that dies mid-task is replaced and the task
retried by Dask (the scheduler's ``allowed-failures``), and a partition that
kills its workers every time is a RuntimeError naming it (Dask counts a
death against every task queued on that worker: a partition waiting there
can be the one named).  Workers write no
file.  quantcore's own methods run on one machine only (ValueError).

``strided=k`` (``CalibStridedMinMax``) with a histogram method: every ``k``
batches of the concatenated data are one ORT call, each updating the
histograms of the calls before it.  Round 1 returns each batch's range
statistics; the client merges each call's and decides every call's bins in
order (they depend on the earlier calls' bins and ranges, not on their
counts); round 2 counts each batch in its call's bins, and the client
finishes the calls in order with the summed counts.
"""
import hashlib
import os
import pickle
import threading
import uuid

import numpy as np

from ..compat import onnxruntime as O
from ..compat.onnxruntime.calibrators import _CallRanges
from ..compat.onnxruntime.histogram import _nan_aware, _Plan
from .calibration import (ORT_METHODS, CalibrationResult, _collect_strided, _method_name,
                          _strided, make_calibrator)
from .calibration import calibrate as _calibrate_here
from .readers import _feeds
from .session import FeedChecker, _one_line, _session, load_model, select_tensors

#: counts of this many partitions are summed by one task
SPLIT_EVERY = 8
#: seconds a run waits while the cluster has no worker at all before it
#: fails (Dask itself waits forever for a worker to join)
NO_WORKERS_S = 120.0
_POLL_S = 2.0


# ------------------------------------------------------------------ worker side
_SESSIONS = {}
_SESSIONS_LOCK = threading.Lock()


def _worker_session(job):
    """(FeedChecker, output names) of the job's model on this worker, made
    once per worker process (the last model only)."""
    key = (job["model_key"], tuple(job["tensors"]), tuple(job["providers"] or ()))
    with _SESSIONS_LOCK:
        if key not in _SESSIONS:
            _SESSIONS.clear()
            model = job["model"]
            if isinstance(model, bytes):
                import onnx
                model = onnx.load_from_string(model)
            m = load_model(model)
            tensors, infos = select_tensors(m, job["op_types"])
            if tensors != job["tensors"]:
                raise ValueError("the worker's model has other calibrated tensors than the "
                                 "client's (a different file at the same path?)")
            sess = _session(m, tensors, infos, job["providers"])
            _SESSIONS[key] = sess
        sess = _SESSIONS[key]
    names = [o.name for o in sess.get_outputs()]
    return FeedChecker(sess, names), names


def _npz_feeds(path, start=None, stop=None):
    """Feeds of one .npz: per-batch ``INDEX/INPUT`` arrays (batches
    ``start:stop``), or input arrays (one feed); ``labels`` left out."""
    with np.load(path, allow_pickle=False) as npz:
        keys = [k for k in npz.files if k != "labels"]
        if keys and all("/" in k for k in keys):
            groups = {}
            for k in keys:
                index, _, name = k.partition("/")
                groups.setdefault(int(index), []).append((name, k))
            order = sorted(groups)[start:stop]
            return [{name: npz[k] for name, k in groups[i]} for i in order]
        return [{k: npz[k] for k in keys}]


def _partition_feeds(spec):
    """The feeds (an iterable) of one partition, on the worker."""
    if isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[0], (str, os.PathLike)):
        path, start, stop = spec
        return _npz_feeds(path, start, stop)
    if isinstance(spec, (str, os.PathLike)):
        if os.path.isdir(spec):
            spec = sorted(os.path.join(spec, f) for f in os.listdir(spec) if f.endswith(".npz"))
        else:
            return _npz_feeds(spec)
    if isinstance(spec, (list, tuple)) and all(isinstance(s, (str, os.PathLike)) for s in spec):
        return (feed for path in spec for feed in _npz_feeds(path))
    return spec     # feeds, a reader, a callable returning one


def _label(index, spec):
    if isinstance(spec, (str, os.PathLike)):
        return f"partition {index} ({os.fspath(spec)})"
    if isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[0], (str, os.PathLike)):
        return f"partition {index} ({os.fspath(spec[0])} batches {spec[1]}:{spec[2]})"
    return f"partition {index}"


def _activations(job, spec):
    runner, names = _worker_session(job)
    wanted = set(job["tensors"])
    for i, feed in enumerate(_feeds(_partition_feeds(spec))):
        out = runner.run(feed, i)
        batch = {n: v for n, v in zip(names, out) if n in wanted}
        del out, feed
        yield batch
        del batch


def _minmax_rows(job, spec):
    """Each batch's (nanmin, nanmax) per tensor, as MinMaxCalibrater reduces
    it: ({tensor: (lo (B,), hi (B,))} in the tensor's dtype, nan_batches, B)."""
    cal = O.MinMaxCalibrater(tensors=job["tensors"])
    call, n = _CallRanges(), 0
    for batch in _activations(job, spec):
        items = list(cal._select(batch))
        del batch
        if not cal._reduce_batch(items, call):
            for name, x in items:
                call.add(name, *cal._reduce(name, x))
        del items
        n += 1
    rows = {name: (np.asarray(lo).reshape(-1), np.asarray(hi).reshape(-1))
            for name, (lo, hi) in call.items()} if n else {}
    return rows, cal.nan_batches, n


def _range_stats(job, spec):
    """The range statistics of the partition's batches per tensor (the
    one-call streaming calibrator's first pass): ({tensor: _CallStats},
    {tensor: NaN batches}, batches)."""
    cal = make_calibrator(job["method"], job["options"], passes=2, tensors=job["tensors"])
    col = cal.collector
    stats, nans, n = {}, {}, 0
    for batch in _activations(job, spec):
        items = cal._arrays(batch)
        del batch
        for name, a, shape in items:
            st = stats.get(name)
            if st is None:
                st = stats[name] = col.new_stats(name)
            if st.add(a, need_absmin=cal._need_absmin(name), shape=shape):
                nans[name] = nans.get(name, 0) + 1
        del items
        n += 1
    return stats, nans, n


def _batch_stats(job, spec):
    """strided: each batch's range statistics per tensor (min |x| too, for
    symmetric Percentile): ([{tensor: _CallStats}], batches)."""
    cal = make_calibrator(job["method"], job["options"], passes=1, tensors=job["tensors"])
    col, out = cal.collector, []
    for batch in _activations(job, spec):
        stats = {}
        for name, a, shape in cal._arrays(batch):
            stats[name] = col.new_stats(name)
            stats[name].add(a, need_absmin=col.absolute, shape=shape)
        del batch
        out.append(stats)
    return out, len(out)


def _call_counts(job, spec, plans, first, batches):
    """strided: the partition's counts per call, ``plans[j]`` the bins of
    call ``j`` ({tensor: plan}), batch ``i`` of the partition in call
    ``(first + i) // k``: {call: {tensor: counts}}."""
    cal = make_calibrator(job["method"], job["options"], passes=1, tensors=job["tensors"])
    k, out, n = job["strided"], {}, 0
    for batch in _activations(job, spec):
        j = (first + n) // k
        mine = out.setdefault(j, {})
        for name, a, _ in cal._arrays(batch):
            p = plans[j][name]
            c = _Plan(p.bins, p.range, p.absolute).add(a).counts
            mine[name] = c if name not in mine else mine[name] + c
        del batch
        n += 1
    if n != batches:
        raise ValueError(f"read {n} batch(es), {batches} the first time (a partition must "
                         "give the same batches each time it is read)")
    return out


def _counts(job, spec, plans, batches):
    """The partition's counts in the merged bins: {tensor: int64 counts}."""
    cal = make_calibrator(job["method"], job["options"], passes=2, tensors=job["tensors"])
    mine = {name: _Plan(p.bins, p.range, p.absolute) for name, p in plans.items()}
    n = 0
    for batch in _activations(job, spec):
        for name, a, _ in cal._arrays(batch):
            mine[name].add(a)
        del batch
        n += 1
    if n != batches:
        raise ValueError(f"read {n} batch(es), {batches} the first time (a partition must "
                         "give the same batches each time it is read)")
    return {name: p.counts for name, p in mine.items() if p.counts is not None}


def _same(obj):
    return obj


class _Packed:
    """A task's result, or a plan sent to the tasks, as one pickled byte
    string.  Dask sends a dict of numpy arrays as one frame per array (with
    a header each); the detector's MinMax rows or counts are 649-1298 small
    arrays, and sent as they are one result took about 0.1 s to gather on
    this 2-core machine, longer than computing it.  One byte string is one
    frame."""

    __slots__ = ("data",)

    def __init__(self, value):
        self.data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def value(self):
        return pickle.loads(self.data)


def _unpacked(value):
    return value.value() if isinstance(value, _Packed) else value


def _add_counts(*parts):
    out = {}
    for part in map(_unpacked, parts):
        for name, c in part.items():
            out[name] = c if name not in out else out[name] + c
    return _Packed(out)


def _task(kind, job, index, spec, *args):
    """One partition's task (``kind``: minmax, ranges, counts); an error is a
    ValueError naming the partition."""
    fn = {"minmax": _minmax_rows, "ranges": _range_stats, "counts": _counts,
          "batch_stats": _batch_stats, "call_counts": _call_counts}[kind]
    try:
        return _Packed(fn(job, spec, *map(_unpacked, args)))
    except (ValueError, TypeError, KeyError, OSError) as exc:
        raise ValueError(f"{_label(index, spec)}: {_one_line(exc)}") from None


def npz_batches(path, batch_size=1, batch_axes=None, start=0, stop=None):
    """Batches ``start:stop`` of an .npz of input arrays split as
    :class:`~quantcore.onnx.NpzReader` splits them (``labels`` left out): a
    partition's reader factory (``functools.partial`` of this)."""
    from .readers import NpzReader
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "labels"}
    reader = NpzReader(arrays, batch_size, batch_axes)
    reader.set_range(start, len(reader) if stop is None else stop)
    return reader


def partitions_of(path, parts, *, batch_size=1, batch_axes=None):
    """About ``parts`` partitions of the calibration data at ``path``, in
    order: a folder of .npz feeds (contiguous groups of its sorted files), an
    .npz of per-batch feeds (ranges of its batches), or an .npz of input
    arrays (ranges of the batches ``NpzReader(arrays, batch_size,
    batch_axes)`` makes).  Each partition names the file(s) it reads: the
    workers read them (a shared filesystem)."""
    import functools
    path = os.path.abspath(os.fspath(path))
    parts = max(1, int(parts))
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".npz"))
        return [files[a:b] for a, b in _ranges(len(files), parts)]
    with np.load(path, allow_pickle=False) as npz:
        keys = [k for k in npz.files if k != "labels"]
        per_batch = keys and all("/" in k for k in keys)
        if not per_batch:
            arrays = {k: npz[k] for k in keys}
    if per_batch:
        n = len({k.partition("/")[0] for k in keys})
        return [(path, a, b) for a, b in _ranges(n, parts)]
    from .readers import NpzReader
    n = len(NpzReader(arrays, batch_size, batch_axes))
    return [functools.partial(npz_batches, path, batch_size, batch_axes, a, b)
            for a, b in _ranges(n, parts)]


def _ranges(n, parts):
    """``min(n, parts)`` contiguous (start, stop) ranges covering ``range(n)``."""
    k = max(1, min(n, parts))
    edges = [n * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def cluster_client(spec):
    """(client, cluster or None) of the CLI's ``--dask``: ``local:N`` a
    LocalCluster of N worker processes (one thread each), else a scheduler
    address."""
    import distributed
    if spec.startswith("local:"):
        try:
            n = int(spec[len("local:"):])
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"--dask {spec!r}: local:N takes a number of worker processes >= 1")
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        return distributed.Client(cluster), cluster
    return distributed.Client(spec), None


# ------------------------------------------------------------------ client side
def _merge_stats(into, other):
    """Fold the range statistics ``other`` (later batches) into ``into``, as
    ``_CallStats.add`` folds batches one after another."""
    if getattr(other, "shape", None) is not None:
        into.add(np.zeros(0, other.dtype or np.float32), shape=other.shape)
    elif other.dtype is not None:
        into.add(np.zeros(0, other.dtype))
    if not other.size:
        return
    into.size += other.size
    into.any_nan |= other.any_nan
    into.min = other.min if into.min is None else _nan_aware(min, into.min, other.min)
    into.max = other.max if into.max is None else _nan_aware(max, into.max, other.max)
    if other.absmin is not None:
        if into.absmin is None or np.isnan(other.absmin):
            into.absmin = other.absmin
        elif not np.isnan(into.absmin):
            into.absmin = min(into.absmin, other.absmin)


def _replay_minmax(cal, parts, strided):
    """One machine's MinMaxCalibrater fed the rows, in order."""
    names = list(cal.tensors)
    if not strided and cal.max_intermediate_outputs is None and not cal.ema_per_batch:
        # one call: its rows as the (B, T) matrices collect_data would stack
        los = [np.stack([rows[n][0] for n in names], axis=1).astype(np.float64)
               for rows, _, n in parts if n]
        his = [np.stack([rows[n][1] for n in names], axis=1).astype(np.float64)
               for rows, _, n in parts if n]
        dtypes = tuple(next(rows[n][0].dtype for rows, _, b in parts if b) for n in names)
        call = _CallRanges()
        call.rows = (tuple(names), dtypes, list(np.concatenate(los)), list(np.concatenate(his)))
        cal._finish_call(call)     # (cal is this call's own: no other thread)
        return

    def reduce_batch(items, call):     # each item (name, [lo, hi]): the batch's reduction
        lo = np.array([x[0] for _, x in items], np.float64)
        hi = np.array([x[1] for _, x in items], np.float64)
        call.add_row(tuple(n for n, _ in items), tuple(x.dtype for _, x in items), lo, hi)
        return True
    cal._reduce_batch = reduce_batch

    def batches():
        for rows, _, n in parts:
            for b in range(n):
                yield {name: np.array([rows[name][0][b], rows[name][1][b]],
                                      rows[name][0].dtype) for name in names}
    if strided:
        _collect_strided(cal, batches(), strided, "minmax")
    else:
        cal.collect_data(batches())


def _model_source(model):
    """(what the workers load, a key naming it): a path as it is (the
    workers read the file), an onnx.ModelProto as its bytes."""
    if isinstance(model, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(model))
        st = os.stat(path)
        return path, f"{path}:{st.st_size}:{st.st_mtime_ns}"
    data = model.SerializeToString()
    return data, hashlib.sha1(data).hexdigest()


def _partitions(client, data):
    """The list of partitions (a dask Bag: futures of its partitions' lists)."""
    if hasattr(data, "to_delayed") and hasattr(data, "npartitions"):
        return client.compute(data.to_delayed())
    if isinstance(data, (str, os.PathLike)) or hasattr(data, "get_next") or \
            not hasattr(data, "__len__"):
        raise TypeError("client=: the data must be a list of partitions (.npz files or "
                        "folders, lists of feeds, reader factories) or a dask Bag, got "
                        f"{type(data).__name__}")
    return list(data)


def _died(index, spec):
    return RuntimeError(f"{_label(index, spec)}: its worker died every time it ran it (Dask's "
                        "allowed-failures); nothing was calibrated")


def _result(future, index, spec):
    """``future.result()``, polled: a cluster left with no worker at all
    for :data:`NO_WORKERS_S` seconds (every worker gone and none joining) is
    a RuntimeError naming the partition and the scheduler, not a wait that
    never ends."""
    import time
    idle_since = None
    while True:
        try:
            return future.result(timeout=_POLL_S)
        except TimeoutError:
            pass
        if future.client.nthreads():
            idle_since = None
            continue
        now = time.monotonic()
        idle_since = now if idle_since is None else idle_since
        if now - idle_since >= NO_WORKERS_S:
            raise RuntimeError(
                f"{_label(index, spec)}: the Dask cluster at "
                f"{future.client.scheduler.address} has had no worker for "
                f"{NO_WORKERS_S:g} s (every worker gone, none joining); nothing was "
                "calibrated")


def _gather(futures, specs):
    """The futures' results in order; a task whose workers all died is a
    RuntimeError naming its partition (the others are cancelled), and so is
    a cluster left with no worker (:func:`_result`)."""
    from distributed import KilledWorker
    out = []
    try:
        for i, f in enumerate(futures):
            try:
                out.append(_unpacked(_result(f, i, specs[i])))
            except KilledWorker:
                raise _died(i, specs[i]) from None
    finally:
        for f in futures:
            f.cancel()
    return out


def calibrate_on(client, model, partitions, method="minmax", *, options=None, strided=None,
                 passes=None, op_types_to_calibrate=None, providers=None, histograms=True):
    """:func:`quantcore.onnx.calibrate` over ``partitions`` on the Dask
    ``client``'s workers (module docstring): the same CalibrationResult
    (``tensors_range``, ``batches``, ``nan_batches``) as one machine's call on
    the partitions' batches in order; ``replay`` is None (the data is read
    again) and ``inference_seconds`` None."""
    import time
    method = _method_name(method)
    strided = _strided(strided, passes)
    if method not in ORT_METHODS:
        raise ValueError(f"client=: {method} (quantcore's method) runs on one machine only; "
                         f"the cluster takes {', '.join(ORT_METHODS)}")
    if (options or {}).get("per_channel"):
        raise ValueError("per-channel activation ranges cannot be consumed by ORT's quantizer "
                         "(ORT surprise 10)")
    t0 = time.perf_counter()
    m = load_model(model)
    tensors, _ = select_tensors(m, op_types_to_calibrate)
    if not tensors:
        raise ValueError("the model has no float tensor to calibrate")
    source, key = _model_source(model)
    del m
    specs = _partitions(client, partitions)
    opts = dict(options or {})
    cal = make_calibrator(method, opts, passes=2, tensors=tensors)   # (the options checked)
    job = {"model": source, "model_key": key, "tensors": tensors, "providers": providers,
           "op_types": op_types_to_calibrate, "method": method, "options": opts,
           "strided": strided}
    run = uuid.uuid4().hex[:8]
    # (a task's result, not scattered data: recomputed if its holder dies)
    job_f = client.submit(_same, job, pure=False, key=f"quantcore-onnx-job-{run}")

    def submit(kind, *extra):
        return [client.submit(_task, kind, job_f, i, spec, *extra, pure=False,
                              key=f"quantcore-onnx-{kind}-{i}-{run}")
                for i, spec in enumerate(specs)]

    if method == "minmax":
        parts = _gather(submit("minmax"), specs)
        total = sum(n for _, _, n in parts)
        nan_batches = _sum_counts(p[1] for p in parts)
        if total:
            _replay_minmax(cal, parts, strided)
        elif strided:
            raise ValueError("No data is collected.")
        else:
            cal.collect_data([])    # ORT's error
        td = cal.compute_data()
        return CalibrationResult(td, total, nan_batches, time.perf_counter() - t0)
    if strided:
        return _strided_histograms(client, cal, job_f, specs, strided, submit, run, t0)
    parts = _gather(submit("ranges"), specs)
    col = cal.collector
    stats = {}
    for part_stats, _, _ in parts:
        for name, st in part_stats.items():
            if name not in stats:
                stats[name] = col.new_stats(name)
            _merge_stats(stats[name], st)
    if not stats:
        raise ValueError("No data is collected.")
    total = sum(n for _, _, n in parts)
    nan_batches = _sum_counts(p[1] for p in parts)
    plans = col.checked_plans(stats)
    counts = histograms or not (method == "entropy" and
                                O._single_entropy_window(col.num_bins, col.num_quantized_bins))
    if counts:
        plans_f = client.submit(_same, _Packed(plans), pure=False,
                                key=f"quantcore-onnx-plans-{run}")
        futures = [client.submit(_task, "counts", job_f, i, spec, plans_f, parts[i][2],
                                 pure=False, key=f"quantcore-onnx-counts-{i}-{run}")
                   for i, spec in enumerate(specs)]
        summed = _summed(client, futures, specs, run)
        for name, c in summed.items():
            plans[name].counts = plans[name].counts + c
    for name, st in stats.items():
        col.finish(name, st, plans[name])
    cal.batches = total
    cal.nan_batches = dict(nan_batches)
    td = cal.compute_data()
    if not counts:      # (the counts are not ORT's: left out)
        td = O.TensorsData(td.calibration_method,
                           {k: O.TensorData(lowest=v.lowest, highest=v.highest)
                            for k, v in td.items()})
    return CalibrationResult(td, total, nan_batches, time.perf_counter() - t0)


def _strided_histograms(client, cal, job_f, specs, k, submit, run, t0):
    """``strided=k`` with a histogram method: every ``k`` batches one ORT
    call.  Round 1: each batch's range statistics; the client merges each
    call's, then decides every call's bins in order (a call's bins depend
    on the earlier calls' bins and ranges only: the state is advanced with
    zero counts).  Round 2: each partition counts its batches in their
    call's bins; the client sums them per call and finishes the calls in
    order with the counts, as one machine does."""
    import time
    parts = _gather(submit("batch_stats"), specs)
    sizes = [n for _, n in parts]
    batches = [st for part, _ in parts for st in part]
    del parts
    total = len(batches)
    if not total:
        raise ValueError("No data is collected.")
    if total % k:
        raise ValueError(f"Total data size ({total}) is not divisible by stride size ({k}).")
    col = cal.collector
    calls, plans, nan_batches = [], [], {}
    for j in range(0, total, k):    # every call's bins, in ORT's order (zero counts)
        stats, mine = {}, {}
        for name in batches[j]:     # a tensor's batches merged, its bins, its state
            st = stats[name] = col.new_stats(name)
            for per_batch in batches[j:j + k]:
                _merge_stats(st, per_batch[name])
                if k == 1 and per_batch[name].any_nan:
                    nan_batches[name] = nan_batches.get(name, 0) + 1
            mine[name] = col.plan(name, st)
            mine[name].add(np.zeros(0, st.dtype or np.float32))
            col.finish(name, st, mine[name])
        calls.append(stats)
        plans.append(mine)
    del batches
    col.histogram_dict = {}
    plans_f = client.submit(_same, _Packed(plans), pure=False,
                            key=f"quantcore-onnx-plans-{run}")
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    futures = [client.submit(_task, "call_counts", job_f, i, spec, plans_f, int(firsts[i]),
                             sizes[i], pure=False, key=f"quantcore-onnx-counts-{i}-{run}")
               for i, spec in enumerate(specs)]
    summed = _gather(futures, specs)
    for j, (stats, mine) in enumerate(zip(calls, plans)):
        for name, st in stats.items():
            counts = [part[j][name] for part in summed if j in part and name in part[j]]
            plan = mine[name]
            plan.counts = sum(counts[1:], counts[0]) if counts else plan.counts
            col.finish(name, st, plan)
    cal.batches = total
    cal.nan_batches = dict(nan_batches)
    return CalibrationResult(cal.compute_data(), total, nan_batches, time.perf_counter() - t0)


def _tree(client, futures, run):
    """The counts of every partition summed by a tree of tasks
    (:data:`SPLIT_EVERY` at a time): one future."""
    level = 0
    while len(futures) > 1:
        futures = [client.submit(_add_counts, *futures[i:i + SPLIT_EVERY], pure=False,
                                 key=f"quantcore-onnx-sum-{level}-{i}-{run}")
                   for i in range(0, len(futures), SPLIT_EVERY)]
        level += 1
    return futures


def _summed(client, futures, specs, run):
    """The partitions' counts summed (:func:`_tree`); a failed partition is
    named (its own error, or a RuntimeError when its workers died)."""
    from distributed import KilledWorker
    if not futures:
        return {}
    top = _tree(client, futures, run)
    try:
        return _unpacked(top[0].result())
    except KilledWorker:
        for i, f in enumerate(futures):
            if f.status == "error":
                raise _died(i, specs[i]) from None
        raise
    finally:
        for f in futures + top:
            f.cancel()


def _sum_counts(dicts):
    out = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def calibrate(model, data, method="minmax", *, client=None, **kwargs):
    """:func:`quantcore.onnx.calibration.calibrate` (the parameters after
    ``method``, its docstring), or with ``client`` (a ``distributed.Client``)
    :func:`calibrate_on` over the partitions ``data`` on its workers (the
    options it takes: ``options``, ``strided``, ``passes``,
    ``op_types_to_calibrate``, ``providers``, ``histograms``)."""
    if client is None:
        return _calibrate_here(model, data, method, **kwargs)
    taken = {"options", "strided", "passes", "op_types_to_calibrate", "providers", "histograms"}
    ignored = {"replay", "parallel", "on_batch"}
    unknown = sorted(set(kwargs) - taken - ignored)
    if unknown:
        raise TypeError(f"calibrate(client=...): {', '.join(unknown)} is not taken on a cluster")
    return calibrate_on(client, model, data, method,
                        **{k: v for k, v in kwargs.items() if k in taken})


calibrate.__doc__ = (_calibrate_here.__doc__ or "") + """
    client : distributed.Client or None
        Calibrate on its workers (quantcore.onnx.cluster): ``data`` is then a
        list of partitions; the same result.
"""
