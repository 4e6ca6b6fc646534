"""The calibration session: :func:`calibrate` runs the model over a data
reader and feeds each batch into a calibrator (ORT's, exact, or
quantcore's), grouping the batches into ORT ``collect_data`` calls as ORT
does; one call over the whole reader is taken in bounded memory (held, spilled
to a temporary file, or the data read again: ``_one_call``).  The package's
docstring describes the choices."""
import contextlib
import os
import time
import tracemalloc

import numpy as np

from ..compat import onnxruntime as O
from ..compat.onnxruntime.histogram import _flat
from .readers import _Spill, _feeds, _prefetch, replayable
from .session import FeedChecker, _session, load_model, select_tensors

ORT_METHODS = ("minmax", "entropy", "percentile", "distribution")
QUANTCORE_METHODS = ("torch_histogram", "nvidia_entropy", "nvidia_mse", "nvidia_percentile")
METHODS = ORT_METHODS + QUANTCORE_METHODS
REPLAYS = ("auto", "rerun", "spill")

#: auto replay: spill when a batch's activations are written and read back
#: (this many bytes per second, both ways) faster than the model computes them
#: (measured: 9 MiB written in 4.4 ms and gathered back in 2 ms, a file in the
#: page cache on a 2-core VM: 1.4e9; a third of it leaves room for a slower disk)
SPILL_BYTES_PER_SECOND = 5e8


class CalibrationResult:
    """What :func:`calibrate` returns: ``tensors_range`` (an ORT-style
    :class:`~quantcore.compat.onnxruntime.TensorsData`), ``batches`` seen,
    ``nan_batches`` ({tensor: batches holding NaN}), ``seconds``,
    ``peak_bytes`` (tracemalloc peak of Python allocations, when measured),
    ``inference_seconds`` (in onnxruntime's ``run``), ``replay`` (how the
    second pass was read: ``"rerun"``, ``"spill"`` or None for one pass)."""

    def __init__(self, tensors_range, batches, nan_batches, seconds, peak_bytes=None, *,
                 inference_seconds=None, replay=None):
        self.tensors_range = tensors_range
        self.batches = batches
        self.nan_batches = dict(nan_batches)
        self.seconds = seconds
        self.peak_bytes = peak_bytes
        self.inference_seconds = inference_seconds
        self.replay = replay

    def ranges(self):
        """{tensor: (lowest, highest)} as Python floats."""
        return {k: (float(np.asarray(v.lowest).reshape(-1)[0]),
                    float(np.asarray(v.highest).reshape(-1)[0]))
                for k, v in self.tensors_range.items()}
class _QuantcoreCalibrater:
    """quantcore's non-ORT calibrators behind the same collect / compute
    interface; ranges as TensorsData(MinMax) (ORT consumes them as MinMax
    ranges).  NaN values are left out (and counted); NVIDIA's symmetric amax
    is clipped to the observed min / max."""

    def __init__(self, method, options, tensors):
        from .. import calib
        self.method_name, self.options, self.tensors = method, dict(options), tensors
        self.nan_batches = {}
        self.batches = 0
        self._new = {
            "torch_histogram": lambda: calib.TorchHistogram(
                bins=self.options.get("num_bins", 2048)),
            "nvidia_entropy": lambda: calib.HistogramCalibrator(
                num_bins=self.options.get("num_bins", 2048), unsigned=False, torch_hist=True),
        }
        self._new["nvidia_mse"] = self._new["nvidia_percentile"] = self._new["nvidia_entropy"]
        self.state = {}
        self.observed = {}

    def collect_data(self, data):
        for batch in O.iter_batches(data):
            for name in self.tensors:
                x = np.asarray(batch[name])
                if np.isnan(x).any():
                    self.nan_batches[name] = self.nan_batches.get(name, 0) + 1
                    x = x[~np.isnan(x)]
                if x.size:
                    self.state.setdefault(name, self._new[self.method_name]()).collect(x)
                    lo, hi = float(x.min()), float(x.max())
                    old = self.observed.get(name, (lo, hi))
                    self.observed[name] = (min(old[0], lo), max(old[1], hi))
            self.batches += 1
        if not self.state:
            raise ValueError("No data is collected.")

    def compute_data(self):
        out = {}
        for name, st in self.state.items():
            if self.method_name == "torch_histogram":
                lo, hi = st.non_linear_param_search()
                lo, hi = np.float32(lo), np.float32(hi)
            else:
                kind = self.method_name.split("_", 1)[1]
                kw = ({"percentile": self.options.get("percentile", 99.99)}
                      if kind == "percentile" else {})
                amax = np.float32(np.asarray(st.compute_amax(kind, **kw)).reshape(()))
                # NVIDIA's amax is symmetric; clipped to the observed range, as
                # ORT clips its percentile (a ReLU output keeps lowest 0, so
                # ORT's removal of the ReLU stays correct)
                seen_lo, seen_hi = self.observed[name]
                lo = max(-amax, np.float32(seen_lo))
                hi = min(amax, np.float32(seen_hi))
            out[name] = O.TensorData(lowest=np.array([lo], np.float32),
                                     highest=np.array([hi], np.float32))
        return O.TensorsData(O.CalibrationMethod.MinMax, out)


def make_calibrator(method="minmax", options=None, *, passes=1, tensors=None, executor=None):
    """A calibrator by name: ORT's ``create_calibrator`` options for the ORT
    methods (``num_bins``, ``percentile``, ``symmetric``, ...), ``passes``;
    ``executor`` (ORT methods) reduces the tensors of a batch in parallel."""
    options = dict(options or {})
    if method in ORT_METHODS:
        kw = {"tensors": tensors, "executor": executor}
        if method != "minmax":
            kw["passes"] = passes
        else:
            for key in ("ema_per_batch", "ort_bug_max_intermediate"):
                if key in options:
                    kw[key] = options.pop(key)
        return O.create_calibrator(method, options, **kw)
    if method in QUANTCORE_METHODS:
        return _QuantcoreCalibrater(method, options, tensors)
    raise ValueError(f"unknown calibration method {method!r} (choose from {', '.join(METHODS)})")


def _method_name(method, what="method"):
    """A method of :data:`METHODS` from its name or a CalibrationMethod (ORT's or compat's)."""
    if isinstance(method, str) and method.lower() in METHODS:
        return method.lower()
    try:
        return O._method_of(method).name.lower()
    except ValueError:
        raise ValueError(f"unknown calibration {what} {method!r} (choose from "
                         f"{', '.join(METHODS)} or a CalibrationMethod)") from None


def _strided(strided, passes):
    if passes is not None and passes not in (1, 2):
        raise ValueError(f"passes must be 1 (= strided=1) or 2 (one call, the default), "
                         f"got {passes!r}")
    if strided is not None and (isinstance(strided, bool) or not isinstance(strided, int) or
                                strided < 1):
        raise ValueError(f"strided (CalibStridedMinMax) must be a positive int or None, "
                         f"got {strided!r}")
    if passes == 1:
        if strided not in (None, 1):
            raise ValueError(f"passes=1 is strided=1; got strided={strided!r} too")
        return 1
    if passes == 2 and strided is not None:
        raise ValueError(f"passes=2 is one call over the whole reader; got strided={strided!r} "
                         "too")
    return strided


def calibrate(model, data, method="minmax", *, options=None, strided=None, passes=None,
              replay="auto", op_types_to_calibrate=None, providers=None, on_batch=None,
              measure_memory=False, parallel=None, spill_dir=None, histograms=True):
    """Calibrate the activations of ``model`` on ``data``, streaming.

    Parameters
    ----------
    model : path or onnx.ModelProto
    data : CalibrationDataReader, iterable of {input name: array}, or a callable
        returning a fresh iterable
    method : one of :data:`METHODS` or a CalibrationMethod (default MinMax, ORT's)
    options : dict
        The calibrator's options (ORT's ``create_calibrator`` extra_options:
        ``num_bins``, ``num_quantized_bins``, ``percentile``, ``symmetric``,
        ``moving_average``, ``averaging_constant``, ``max_intermediate_outputs``,
        ``scenario``, ...; ORT's defaults).
    strided : int or None
        ORT's ``CalibStridedMinMax``: None (default) -- the whole reader is
        one ORT ``collect_data`` call (``quantize_static``'s default); ``k``
        -- every ``k`` batches are one call (``k = 1``: one call per batch,
        one pass, nothing buffered).
    passes : {None, 1, 2}
        The older name: 1 is ``strided=1``, 2 the default.
    replay : {"auto", "rerun", "spill"}
        How the histogram methods get the values of a single call after its
        range (module docstring): held in memory up to a buffer, then
        spilled to a temporary file (in ``spill_dir``, default the
        system's) or read again, whichever is faster (``auto``); always
        spilled (``spill``); or the data read twice, batch by batch
        (``rerun``).  A reader that cannot be replayed is read once.  Same
        result.
    op_types_to_calibrate : list of str or None
        The op types whose tensors are calibrated (None: every node's).
    providers : list or None
        onnxruntime's execution providers (default CPU).
    on_batch : callable or None
        Called with no argument after each model run (a progress bar).
    measure_memory : bool
        Record the tracemalloc peak in the result (slower).
    parallel : bool or None
        True: onnxruntime runs batch ``i + 1`` in a background thread while the
        calling thread takes batch ``i``, and a pool of threads (one per usable
        core) reduces the tensors -- of a batch as it comes, or of the single
        call's kept or spilled values after the model ran --, each kernel on
        one thread (fewer than 64 Ki values in the calling thread); False: one
        batch at a time in the calling thread, the kernels on quantcore's
        threads (``quantcore.set_num_threads``). None (default): no pool; the
        inference thread only where each batch is reduced as it comes (MinMax,
        ``strided``, quantcore's methods) and the first batch's calibrated
        tensors hold less than :data:`THREAD_BATCH_BYTES` (many small tensors:
        the per-tensor Python overlaps the next run). Measured on 2 cores: a
        large batch's kernels and onnxruntime's pool then compete for the cores
        (the PP-OCR detector's MinMax 0.75 s serial, 0.84-0.92 s with the
        thread and pool), and the histogram methods' single call reduces tensor
        by tensor after the model ran (silero-vad 0.067-0.070 s serial,
        0.08-0.09 s threaded), while silero-vad's MinMax took 0.055 s threaded,
        0.066 s serial. With None the kernels also run on one thread while
        other work holds the cores (:func:`cores_busy`). The result is the
        same.
    histograms : bool
        False: where the histogram method's range does not depend on the
        counts -- Entropy over one call whose KL search has one candidate
        window (:func:`~quantcore.compat.onnxruntime._single_entropy_window`:
        ORT's defaults, 128 bins and 128 quantized bins; the range is then
        the call's ``(nanmin, nanmax)``) -- the values are not counted: one
        read of the data, and each TensorData holds ``lowest`` / ``highest``
        only (no ``hist`` / ``bins``).  The ranges, and the model
        :func:`quantize` makes from them, are the same bit for bit (ORT's
        errors too: the range and the bins are checked as ``np.histogram``
        checks them).  True (default): ORT's TensorsData with the counts.

    Returns
    -------
    CalibrationResult
    """
    method = _method_name(method)
    strided = _strided(strided, passes)
    if replay not in REPLAYS:
        raise ValueError(f"replay must be one of {', '.join(REPLAYS)}, got {replay!r}")
    if (options or {}).get("per_channel"):
        raise ValueError("per-channel activation ranges cannot be consumed by ORT's quantizer "
                         "(ORT surprise 10): use quantcore.compat.onnxruntime.MinMaxCalibrater "
                         "directly for per-channel statistics")
    if parallel is not None:
        if not isinstance(parallel, (bool, np.bool_)):
            raise TypeError(f"parallel must be True, False or None (auto), got {parallel!r}")
        parallel = bool(parallel)
    two_pass = strided is None and method in ORT_METHODS and method != "minmax"
    can_rerun = replayable(data)
    if two_pass and replay == "rerun" and not can_rerun and (histograms or method != "entropy"):
        O._second_pass(data, "calibrate")  # the TypeError saying why
    if measure_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    state = {"inference": 0.0, "batches": 0, "how": None}
    prefetching = []
    try:
        m = load_model(model)
        tensors, infos = select_tensors(m, op_types_to_calibrate)
        if not tensors:
            raise ValueError("the model has no float tensor to calibrate")
        sess = _session(m, tensors, infos, providers)
        del m, infos    # the model's protobuf (a few of its size): the session has its own
        names = [o.name for o in sess.get_outputs()]
        runner = FeedChecker(sess, names)
        wanted = set(tensors)

        def model_runs():   # in _prefetch's inference thread when parallel
            state["batches"] = 0
            for i, feed in enumerate(_feeds(data)):
                t = time.perf_counter()
                out = runner.run(feed, i)
                state["inference"] += time.perf_counter() - t
                state["batches"] += 1
                batch = {n: v for n, v in zip(names, out) if n in wanted}
                del out
                yield batch
                del batch   # (not held while the model runs the next one)

        def activations():
            runs, thread = model_runs(), parallel
            if thread is None:      # auto: decided on the first batch
                first = next(runs, None)
                if first is None:
                    return
                if on_batch is not None:
                    on_batch()
                thread = not two_pass and \
                    sum(np.asarray(a).nbytes for a in first.values()) < THREAD_BATCH_BYTES
                yield first
                del first
            source = runs
            if thread:
                source = _prefetch(lambda: runs)
                prefetching.append(source)  # (closed on the way out: its thread stops)
            for batch in source:
                if on_batch is not None:
                    on_batch()
                yield batch
                del batch

        def keep_spilling(nbytes):
            """auto: rerun rather than spill when the model is faster than the disk."""
            return replay == "spill" or not can_rerun or \
                nbytes / SPILL_BYTES_PER_SECOND < state["inference"]

        pool = O.tensor_executor() if parallel is True else contextlib.nullcontext()
        threads = O.kernel_threads(1) if parallel is True or \
            parallel is None and cores_busy() else contextlib.nullcontext()
        with pool as executor, threads:
            cal = make_calibrator(method, options, passes=1 if strided else 2, tensors=tensors,
                                  executor=executor)
            counts = histograms or not (two_pass and method == "entropy" and
                                        O._single_entropy_window(cal.collector.num_bins,
                                                                 cal.collector.num_quantized_bins))
            if strided and strided > 1 or strided and method == "minmax":
                _collect_strided(cal, activations(), strided, method)
            elif not two_pass:
                cal.collect_data(activations())
            elif replay == "rerun" and counts:
                if not can_rerun:           # (Entropy without counts over other bins)
                    O._second_pass(data, "calibrate")
                cal.collect_data(activations)   # ORT's streaming two passes, batch by batch
                state["how"] = "rerun"
            else:
                state["how"] = _one_call(cal, activations, BUFFER_BYTES, spill_dir, executor,
                                         keep_spilling, counts=counts)
        td = cal.compute_data()
        if state["how"] == "ranges":
            state["how"] = None     # one read; the counts (zeros) are not ORT's: left out
            td = O.TensorsData(td.calibration_method,
                               {k: O.TensorData(lowest=v.lowest, highest=v.highest)
                                for k, v in td.items()})
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else None
    finally:
        for gen in prefetching:     # an exception's traceback must not keep a thread alive
            gen.close()
        if measure_memory:
            tracemalloc.stop()
    return CalibrationResult(td, state["batches"], getattr(cal, "nan_batches", {}), seconds, peak,
                             inference_seconds=state["inference"], replay=state["how"])


def cores_busy():
    """True when other work holds the cores: the 1-minute load average is
    above the usable cores (a calibration alone keeps it at most about the
    cores: the model's runs and a kernel's team).  ``parallel=None`` then runs the kernels on one
    thread: an OpenMP team waits for each of its threads to be scheduled, a
    wait that costs more than the kernel saves (measured on a 2-core VM at
    load 2.9-3.6: the PP-OCR detector's calibration with 4 images, Percentile
    1.58-1.81 s with one-thread kernels against 2.73-4.44 s with teams of 2,
    MinMax 0.46-0.61 s against 0.67-1.22 s; a profile at load ~6 spent 13 s
    in kernel calls whose work is under a second).  The result does not
    depend on it."""
    try:
        load = os.getloadavg()[0]
    except OSError:     # pragma: no cover - no load average on this system
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return load > cores


#: parallel=None: the inference thread when the first batch's calibrated
#: tensors hold fewer bytes than this
THREAD_BATCH_BYTES = 1 << 20

#: the single call's activations kept in memory before they go to a spill file
#: (or the data is read again)
BUFFER_BYTES = 1 << 20


#: tensors smaller than this (values) are reduced once per chunk (their
#: pieces joined), larger ones batch by batch
SMALL_TENSOR = 1 << 15
#: the batches of one chunk hold at least this many bytes (the last one less)
CHUNK_BYTES = 1 << 20


def _chunks(cal, batches, on_layout, on_large, executor, reduce_small):
    """``batches`` grouped into chunks of at least :data:`CHUNK_BYTES`.

    Each batch's arrays are looked at once per tensor only when their
    layout (shapes, dtypes) differs from the previous batch's:
    ``on_layout(items)`` then sees every ``(name, values, shape)`` (the
    stacking checks).  The large tensors' ``(name, values, shape)`` go to
    ``on_large(items)`` batch by batch; the small ones are held, and each
    chunk is yielded as ``(batches, {name: pieces})`` with the pieces of
    every small tensor joined into one 1-d array first handed to
    ``reduce_small(name, array, pieces)`` (on ``executor``).  The per-batch
    cost is a few list operations, whatever the number of tensors."""
    names = cal.tensors
    layout, small, large = None, [], []
    pieces, held, n = None, 0, 0
    for batch in batches:
        if names is None:
            names = list(batch)
        arrays = [x for _, x in cal._select(batch)] if layout is None else \
            [batch[name] for name in names]
        del batch
        now = [(getattr(x, "shape", None), getattr(x, "dtype", None)) for x in arrays]
        if now != layout:
            on_layout(cal._arrays(dict(zip(names, arrays))))
            layout = now
            small = [i for i, a in enumerate(arrays) if a.size < SMALL_TENSOR]
            large = [i for i, a in enumerate(arrays) if a.size >= SMALL_TENSOR]
            batch_bytes = sum(a.nbytes for a in arrays)
        if pieces is None:
            pieces = [[] for _ in names]
        if large:
            on_large([(names[i], _flat(arrays[i]), layout[i][0]) for i in large])
        for part, a in zip(pieces, arrays):
            part.append(a)
        held += batch_bytes
        n += 1
        del arrays
        if held >= CHUNK_BYTES:
            yield n, _join_small(names, pieces, small, executor, reduce_small)
            pieces, held, n = None, 0, 0
    if n:
        yield n, _join_small(names, pieces, small, executor, reduce_small)


def _join_small(names, pieces, small, executor, reduce_small):
    """{name: pieces}: each small tensor's pieces (one shape and dtype, the
    layout checked) joined into one 1-d array and handed to
    ``reduce_small(name, array, pieces)``; a large one's pieces as 1-d
    views."""
    chunk = {}

    def join(i):
        parts = pieces[i]
        if len(parts) == 1:
            a = _flat(parts[0])
        elif parts[0].ndim == 0:
            a = np.array(parts)
        else:
            a = np.concatenate(parts).reshape(-1)
        reduce_small(names[i], a, parts)
        chunk[names[i]] = [a]   # (one thread per tensor)
        pieces[i] = None        # the batches' arrays go as their copy comes
    batches = len(pieces[0]) if pieces else 0
    joined = set(small)
    for i, name in enumerate(names):
        if i not in joined:
            chunk[name] = [_flat(a) for a in pieces[i]]
    O._map_tensors(executor, join, small, values=batches * sum(pieces[i][0].size for i in small))
    return {name: chunk[name] for name in names}


def _one_call(cal, read, buffer_bytes, spill_dir, executor, keep_spilling, counts=True):
    """One ORT ``collect_data`` call of the histogram calibrator ``cal`` over
    the batches of ``read()``, in bounded memory.

    The batches come in chunks (:func:`_chunks`), each tensor's values of a
    chunk joined.  They are kept in memory up to ``buffer_bytes``; past it,
    either appended to a spill file chunk by chunk (``keep_spilling(bytes)``
    true) or dropped, and ``read()`` is called again.

    - Kept or spilled (``"memory"``, ``"spill"``): nothing is reduced while
      the model runs.  Then each tensor in turn, as ORT stacks it: its
      values gathered from every chunk (up to :data:`GATHER_BYTES` at a
      time), its range statistics, its binning, its counts: one kernel call
      each for a small model's tensor, whatever the number of batches.
    - Read again (``"rerun"``): the first read takes the range statistics, a
      large tensor's batch by batch as it comes, the small tensors' once per
      chunk; every tensor's range and bins are then checked in ORT's order,
      and the second read counts every tensor over the range of the whole
      call.

    The state is the streaming two-pass call's (``collect_data`` with
    ``passes=2``): ORT's stacking checks per batch, range statistics and
    counts that do not depend on how the values are grouped.  Returns the
    mode; ``counts=False``: the first read only, each histogram binned over
    no value (numpy's checks of the range and bins, its edges; zero counts),
    ``"ranges"``."""
    col = cal.collector
    stats, nans = {}, {}
    kept, held, spill = [], 0, None
    mode = "memory" if counts else "ranges"

    def add_range(name, a, batches):
        """Range statistics of ``a``: ``batches`` batches of ``name``, one after another."""
        if stats[name].add(a, need_absmin=cal._need_absmin(name)) and a.size:
            rows = np.isnan(a.reshape(batches, -1)).any(axis=1)
            nans[name] = nans.get(name, 0) + int(np.count_nonzero(rows))

    def reducing():     # (read at each call: the mode changes between chunks)
        return mode in ("rerun", "ranges")

    def check_layout(items):
        for name, a, shape in items:
            st = stats.get(name)
            if st is None:
                st = stats[name] = col.new_stats(name)
            st.add(a[:0], shape=shape)      # ORT's stacking: one shape, one dtype

    def first_read_large(items):
        if reducing():
            O._map_tensors(executor, lambda item: add_range(item[0], item[1], 1), items)

    def first_read_small(name, a, parts):
        if reducing():
            add_range(name, a, len(parts))

    def reduce_chunk(batches, chunk):
        for name, parts in chunk.items():
            for a in parts:     # (a large tensor's parts are its batches)
                add_range(name, a, batches if len(parts) == 1 else 1)

    n = 0
    try:
        for count, chunk in _chunks(cal, read(), check_layout, first_read_large, executor,
                                    first_read_small):
            n += count
            if reducing():
                del chunk       # (not held while the model runs the next batch)
                continue
            if spill is not None:
                spill.write_parts(chunk, count)
                del chunk
                continue
            kept.append((count, chunk))
            held += sum(a.nbytes for parts in chunk.values() for a in parts)
            if held > buffer_bytes:
                if keep_spilling(held):
                    mode, spill = "spill", _Spill(spill_dir)
                else:
                    mode = "rerun"
                while kept:     # (popped: no chunk outlives its turn)
                    batches, held_chunk = kept.pop(0)
                    if spill is not None:
                        spill.write_parts(held_chunk, batches)
                    else:
                        reduce_chunk(batches, held_chunk)
                    del held_chunk
            del chunk
        if not stats:
            raise ValueError("No data is collected.")
        if reducing():
            plans = col.checked_plans(stats)
            if mode == "rerun":
                def count_large(items):
                    O._map_tensors(executor, lambda it: plans[it[0]].add(it[1]), items)

                def count_small(name, a, parts):
                    plans[name].add(a)

                for done in _chunks(cal, read(), check_layout, count_large, executor,
                                    count_small):
                    del done
        else:
            if spill is None:
                def groups(name):
                    return _gather_kept(kept, name)
            else:
                def groups(name):
                    return spill.gather(name, GATHER_BYTES)

            def settle(name):
                """A tensor as ORT stacks it: its range, then its counts
                (gathered twice when it is more than one group)."""
                held_group, k = None, 0
                for k, (batches, a) in enumerate(groups(name), 1):
                    add_range(name, a, batches)
                    held_group = a if k == 1 else None
                plan = col.plan(name, stats[name])
                for a in [held_group] if k == 1 else (a for _, a in groups(name)):
                    plan.add(a)
                return plan

            names = list(stats)
            plans = dict(zip(names, O._map_tensors(executor, settle, names,
                                                   values=(spill.nbytes if spill else held) // 4)))
    finally:
        if spill is not None:
            spill.close()
    for name, st in stats.items():
        if name in nans:
            cal.nan_batches[name] = cal.nan_batches.get(name, 0) + nans[name]
        col.finish(name, st, plans[name])
    cal.batches += n
    return mode


#: a kept or spilled tensor's values are gathered this many bytes at a time
GATHER_BYTES = 1 << 22


def _gather_kept(kept, name):
    """(batches, values) of tensor ``name`` over the kept chunks: one array
    (they hold at most BUFFER_BYTES, under GATHER_BYTES)."""
    parts = [(batches if len(c[name]) == 1 else 1, a) for batches, c in kept for a in c[name]]
    if len(parts) == 1:
        return parts
    return [(sum(b for b, _ in parts), np.concatenate([a for _, a in parts]))]


def _collect_strided(cal, batches, k, method):
    group, n = [], 0
    for batch in batches:
        group.append(batch)
        del batch   # (held by the group only)
        n += 1
        if len(group) == k:
            _collect_group(cal, group, method)
            group = []
    if group or not n:
        if not n:
            raise ValueError("No data is collected.")
        raise ValueError(f"Total data size ({n}) is not divisible by stride size ({k}).")


def _collect_group(cal, group, method):
    if method == "minmax" or method not in ORT_METHODS:
        cal.collect_data(group)
    elif len(group) == 1:
        cal.collect(group[0])
    else:
        cal.collector.collect({n: [b[n] for b in group] for n in group[0]})
        cal.batches += len(group)
