"""Calibrate and quantize a real ONNX model with ONNX Runtime, streaming.

:func:`calibrate` runs the model with onnxruntime on a data reader (ORT's
``CalibrationDataReader`` protocol -- ``get_next()`` until it returns
``None`` -- or any iterable of ``{input name: array}`` feeds), takes the
activations ORT would calibrate (every float input / output of the nodes of
``op_types_to_calibrate``, as ORT's ``select_tensors_to_calibrate`` picks
them) as outputs of the same session, and feeds each batch straight into a
calibrator: the ORT-exact ones of :mod:`quantcore.compat.onnxruntime`
(``minmax``, ``entropy``, ``percentile``, ``distribution``) or quantcore's
others (``torch_histogram``: PyTorch's HistogramObserver search;
``nvidia_entropy`` / ``nvidia_mse`` / ``nvidia_percentile``: NVIDIA's
histogram calibrator).  No batch is kept: memory is at most two batches of
activations plus the statistics (``O(tensors x bins)``).

By default (``parallel=True``) onnxruntime runs batch ``i + 1`` in a
background thread while the tensors of batch ``i`` are reduced by a pool of
threads, one per usable core, each kernel on one thread (the inference and
the kernels release the GIL; ORT's pool threads are told not to spin
between runs).  The result does not depend on it.

:func:`quantize` hands the ranges to ORT's own quantizer through its
documented calibration cache (``TensorsData`` -> JSON ->
``quantize_static(..., calibration_data_reader=None,
calibration_cache_path=...)``), so the QDQ model is written by ORT, and can
write a TensorRT calibration table with the correct ``amax = max(|lo|,
|hi|)`` (ORT writes ``max(hi, lo)``).

Semantics of ``passes`` (ORT-exact methods): 1 -- every batch is one ORT
``collect_data`` call (one pass over the reader); 2 -- the whole reader is
one call, ORT's default ``quantize_static`` result (the reader is read
twice: a list, a callable returning a fresh iterable, or a reader with
``rewind()``).  MinMax is exact for the whole reader in one pass.

Bad data gets a clear result: NaN activations are counted and reported
(``CalibrationResult.nan_batches``; the ranges ignore NaN as ORT's
``nanmin`` does; ORT's histogram methods fail on an all-NaN batch and so
does this module, naming the tensor); a constant or all-zero tensor gets the
range ORT gives it (a degenerate range quantizes with scale 1 / zero point
0, as in ORT); an empty reader raises ``ValueError("No data is collected.")``.
"""
import contextlib
import os
import queue
import tempfile
import threading
import time
import tracemalloc

import numpy as np

from .compat import onnxruntime as O

__all__ = ["METHODS", "ORT_METHODS", "CalibrationResult", "select_tensors", "calibrate",
           "quantize", "quantizable_op_types", "evaluate", "sqnr_db", "NpzReader"]

ORT_METHODS = ("minmax", "entropy", "percentile", "distribution")
QUANTCORE_METHODS = ("torch_histogram", "nvidia_entropy", "nvidia_mse", "nvidia_percentile")
METHODS = ORT_METHODS + QUANTCORE_METHODS

#: quantize_static's extra_options that configure the calibrator (ORT's mapping)
CALIB_OPTION_KEYS = {"CalibTensorRangeSymmetric": "symmetric",
                     "CalibMovingAverage": "moving_average",
                     "CalibMovingAverageConstant": "averaging_constant",
                     "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
                     "CalibPercentile": "percentile"}


def _onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - the onnx extra installs both
        raise ImportError("quantcore.onnx needs onnx and onnxruntime "
                          "(pip install 'quantcore-fakequant[onnx]')") from exc
    return onnx, onnxruntime


def load_model(model):
    """A shape-inferred ModelProto of a path or a ModelProto (as ORT loads it)."""
    onnx, _ = _onnx()
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"{model}: no such ONNX model file")
        model = onnx.load(os.fspath(model))
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    return onnx.shape_inference.infer_shapes(model)


def select_tensors(model, op_types_to_calibrate=None):
    """The tensors ORT calibrates: inputs and outputs of the nodes (of
    ``op_types_to_calibrate``, default all) known to value_info / the graph's
    inputs / outputs as FLOAT or FLOAT16, initializers excluded.  Sorted."""
    onnx, _ = _onnx()
    g = model.graph
    infos = {vi.name: vi for vi in g.value_info}
    infos.update({o.name: o for o in g.output})
    infos.update({i.name: i for i in g.input})
    inits = {i.name for i in g.initializer}
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    out = set()
    for node in g.node:
        if op_types_to_calibrate and node.op_type not in op_types_to_calibrate:
            continue
        for name in list(node.input) + list(node.output):
            vi = infos.get(name)
            if vi is not None and vi.type.HasField("tensor_type") and \
                    vi.type.tensor_type.elem_type in float_types and name not in inits:
                out.add(name)
    return sorted(out), infos


def _session(model, tensors, infos, providers):
    """An InferenceSession whose outputs are the calibrated tensors (graph
    optimizations off, as ORT's calibrator)."""
    onnx, ort = _onnx()
    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    present = {o.name for o in aug.graph.output}
    for name in tensors:
        if name not in present:
            aug.graph.output.append(infos[name])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # ORT's pool threads spin after each run by default, holding the cores
    # that quantcore's statistics need while the next batch runs
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(aug.SerializeToString(), sess_options=opts,
                                providers=providers or ["CPUExecutionProvider"])


def _prefetch(produce):
    """Iterate over the generator ``produce()`` run in a background thread
    one item ahead: the model runs on batch ``i + 1`` while the caller
    reduces batch ``i`` (onnxruntime and the kernels release the GIL), never
    further ahead (batch ``i + 2`` is begun once the caller asks for
    ``i + 1``); an exception in ``produce`` is raised here; closing this
    generator stops the thread."""
    items = queue.SimpleQueue()
    # item i + 1 is made once the caller asked for item i (it is done with i - 1)
    made_ahead = threading.Semaphore(1)
    stop = threading.Event()

    def run():
        try:
            for item in produce():
                items.put((True, item))
                del item
                while not made_ahead.acquire(timeout=0.05):
                    if stop.is_set():
                        return
        except BaseException as exc:   # handed to the consumer, raised there
            items.put((False, exc))
        else:
            items.put((False, None))

    worker = threading.Thread(target=run, name="quantcore-onnx-inference", daemon=True)
    worker.start()
    try:
        while True:
            ok, item = items.get()
            if not ok:
                if item is not None:
                    raise item
                return
            yield item
            del item
            made_ahead.release()
    finally:
        stop.set()
        worker.join()


class CalibrationResult:
    """What :func:`calibrate` returns: ``tensors_range`` (an ORT-style
    :class:`~quantcore.compat.onnxruntime.TensorsData`), ``batches`` seen,
    ``nan_batches`` ({tensor: batches holding NaN}), ``seconds`` and
    ``peak_bytes`` (tracemalloc peak of Python allocations, when measured)."""

    def __init__(self, tensors_range, batches, nan_batches, seconds, peak_bytes=None):
        self.tensors_range = tensors_range
        self.batches = batches
        self.nan_batches = dict(nan_batches)
        self.seconds = seconds
        self.peak_bytes = peak_bytes

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
        from . import calib
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


def _feeds(data):
    """Feeds of ``data``: a CalibrationDataReader, an iterable of dicts, or a
    callable returning one; a reader with ``rewind()`` is rewound first."""
    if hasattr(data, "rewind"):
        data.rewind()
    return O.iter_batches(data, "calibrate")


def calibrate(model, data, method="minmax", *, options=None, passes=1, op_types_to_calibrate=None,
              providers=None, on_batch=None, measure_memory=False, strided=None, parallel=True):
    """Calibrate the activations of ``model`` on ``data``, streaming.

    Parameters
    ----------
    model : path or onnx.ModelProto
    data : CalibrationDataReader, iterable of {input name: array}, or a callable
        returning a fresh iterable
    method : one of :data:`METHODS`
    options : dict
        The calibrator's options (ORT's ``create_calibrator`` extra_options:
        ``num_bins``, ``num_quantized_bins``, ``percentile``, ``symmetric``,
        ``moving_average``, ``averaging_constant``, ``scenario``, ...).
    passes : {1, 2}
        ORT-exact histogram methods: 1 -- one ORT call per batch; 2 -- one
        call for the whole reader (ORT's default result; reads it twice).
    strided : int or None
        ORT's ``CalibStridedMinMax``: groups of ``strided`` batches, each one
        ORT call (buffered: ``strided`` batches of activations at a time).
    on_batch : callable or None
        Called with no argument after each model run (a progress bar).
    measure_memory : bool
        Record the tracemalloc peak in the result (slower).
    parallel : bool
        True: onnxruntime runs batch ``i + 1`` in a background thread while
        the tensors of batch ``i`` are reduced in parallel by a pool of
        threads (one per usable core), each kernel on one thread (at most two
        batches of activations exist); False: one batch at a time in the
        calling thread, the kernels on quantcore's threads
        (``quantcore.set_num_threads``).  The result is the same.

    Returns
    -------
    CalibrationResult
    """
    if method not in METHODS:
        raise ValueError(
            f"unknown calibration method {method!r} (choose from {', '.join(METHODS)})")
    if passes not in (1, 2):
        raise ValueError(f"passes must be 1 or 2, got {passes!r}")
    if (options or {}).get("per_channel"):
        raise ValueError("per-channel activation ranges cannot be consumed by ORT's quantizer "
                         "(ORT surprise 10): use quantcore.compat.onnxruntime.MinMaxCalibrater "
                         "directly for per-channel statistics")
    if measure_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        m = load_model(model)
        tensors, infos = select_tensors(m, op_types_to_calibrate)
        if not tensors:
            raise ValueError("the model has no float tensor to calibrate")
        sess = _session(m, tensors, infos, providers)
        names = [o.name for o in sess.get_outputs()]
        wanted = set(tensors)

        def model_runs():   # in _prefetch's inference thread when parallel
            for feed in _feeds(data):
                yield {n: v for n, v in zip(names, sess.run(names, feed)) if n in wanted}

        def activations():
            for batch in _prefetch(model_runs) if parallel else model_runs():
                if on_batch is not None:
                    on_batch()
                yield batch

        if passes == 2 and method in ORT_METHODS:
            O._second_pass(data, "calibrate")  # refuse one-shot readers before running
        pool = O.tensor_executor() if parallel else contextlib.nullcontext()
        threads = O.kernel_threads(1) if parallel else contextlib.nullcontext()
        with pool as executor, threads:
            cal = make_calibrator(method, options, passes=passes, tensors=tensors,
                                  executor=executor)
            if strided:
                _collect_strided(cal, activations(), int(strided), method)
            else:
                cal.collect_data(activations if passes == 2 else activations())
        td = cal.compute_data()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else None
    finally:
        if measure_memory:
            tracemalloc.stop()
    return CalibrationResult(td, getattr(cal, "batches", None), getattr(cal, "nan_batches", {}),
                             seconds, peak)


def _collect_strided(cal, batches, k, method):
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == k:
            _collect_group(cal, group, method)
            group = []
    if group:
        raise ValueError(f"Total data size is not divisible by stride size ({k}).")


def _collect_group(cal, group, method):
    if method == "minmax" or method not in ORT_METHODS:
        cal.collect_data(group)
    else:
        cal.collector.collect({n: [b[n] for b in group] for n in group[0]})
        cal.batches += len(group)


def quantizable_op_types():
    """The op types ORT's quantize_static quantizes (and calibrates) by
    default: its QOperator and QDQ registries."""
    _onnx()
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def _ort_extra_options(extra_options):
    """(calibrator options, the rest) of quantize_static's extra_options."""
    calib, rest = {}, {}
    for k, v in (extra_options or {}).items():
        if k in CALIB_OPTION_KEYS:
            calib[CALIB_OPTION_KEYS[k]] = v
        else:
            rest[k] = v
    return calib, rest


def quantize(model, output, data=None, *, method="minmax", tensors_range=None, passes=1,
             calibration_options=None, per_channel=False, reduce_range=False,
             activation_type="QUInt8", weight_type="QInt8", quant_format="QDQ",
             op_types_to_quantize=None, nodes_to_quantize=None, nodes_to_exclude=None,
             extra_options=None, cache_path=None, tensorrt_table=None, providers=None,
             on_batch=None):
    """Calibrate ``model`` on ``data`` with quantcore and let ORT's
    ``quantize_static`` write the quantized model to ``output``.

    ``extra_options`` are quantize_static's (``ActivationSymmetric``,
    ``WeightSymmetric``, ``CalibTensorRangeSymmetric``, ``CalibPercentile``,
    ``CalibStridedMinMax``, ...; the Calib* ones configure the calibrator as
    in ORT); ``calibration_options`` the calibrator's own (``num_bins``,
    ``num_quantized_bins``, ``scenario``: what quantize_static cannot set).
    ``tensors_range`` skips calibration.  The ranges go to ORT through the
    JSON cache at ``cache_path`` (a temporary file by default);
    ``tensorrt_table`` (a folder) also gets ORT's TensorRT files with the
    correct ``amax``.  Returns the :class:`CalibrationResult` (None when
    ``tensors_range`` was given).
    """
    onnx, _ = _onnx()
    from onnxruntime.quantization import quantize_static

    calib_opts, ort_extra = _ort_extra_options(extra_options)
    calib_opts.update(calibration_options or {})
    strided = ort_extra.get("CalibStridedMinMax")
    if not op_types_to_quantize:
        op_types_to_quantize = quantizable_op_types()
    result = None
    if tensors_range is None:
        if data is None:
            raise ValueError("quantize: give data to calibrate on, or tensors_range")
        if method in QUANTCORE_METHODS:
            calib_opts = {k: v for k, v in calib_opts.items() if k in ("num_bins", "percentile")}
        result = calibrate(model, data, method, options=calib_opts, passes=passes,
                           op_types_to_calibrate=op_types_to_quantize, providers=providers,
                           on_batch=on_batch, strided=strided)
        tensors_range = result.tensors_range
    model_path = model
    tmpdir = tempfile.mkdtemp(prefix="quantcore_onnx_")
    try:
        if not isinstance(model, (str, os.PathLike)):
            model_path = os.path.join(tmpdir, "model.onnx")
            onnx.save(model, model_path)
        cache = cache_path or os.path.join(tmpdir, "calibration.json")
        O.save_tensors_data(tensors_range, cache)
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
        quantize_static(
            model_path, output, None, calibration_cache_path=cache,
            calibrate_method=CalibrationMethod[tensors_range.calibration_method.name],
            quant_format=QuantFormat[str(quant_format)], op_types_to_quantize=op_types_to_quantize,
            per_channel=per_channel, reduce_range=reduce_range,
            activation_type=QuantType[str(activation_type)],
            weight_type=QuantType[str(weight_type)],
            nodes_to_quantize=nodes_to_quantize, nodes_to_exclude=nodes_to_exclude,
            extra_options=dict(extra_options or {}))
        if tensorrt_table:
            os.makedirs(tensorrt_table, exist_ok=True)
            O.write_calibration_table(tensors_range, tensorrt_table, absmax=True)
    finally:
        for f in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, f))
        os.rmdir(tmpdir)
    return result


def sqnr_db(reference, other):
    """Signal-to-quantization-noise ratio ``10 log10(sum r^2 / sum (r - o)^2)``
    in float64 (inf when equal)."""
    r = np.asarray(reference, dtype=np.float64)
    noise = np.sum((r - np.asarray(other, dtype=np.float64)) ** 2)
    signal = np.sum(r ** 2)
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf")


def evaluate(float_model, quant_model, data, labels=None, providers=None):
    """Outputs of both models on ``data`` (one pass each batch): ``{"sqnr_db":
    {output: dB}, "accuracy": (float, quantized) or None}``; accuracy is the
    argmax of the first output over its last axis against ``labels`` (one
    label per row, in batch order)."""
    _, ort = _onnx()
    sessions = []
    for m in (float_model, quant_model):
        src = m if isinstance(m, (str, os.PathLike)) else m.SerializeToString()
        sessions.append(ort.InferenceSession(src, providers=providers or ["CPUExecutionProvider"]))
    names = [o.name for o in sessions[0].get_outputs()]
    sig = {n: 0.0 for n in names}
    noise = {n: 0.0 for n in names}
    correct, seen = [0, 0], 0
    for feed in _feeds(data):
        ref = sessions[0].run(names, feed)
        out = sessions[1].run(names, feed)
        for n, r, o in zip(names, ref, out):
            r64, o64 = np.asarray(r, np.float64), np.asarray(o, np.float64)
            sig[n] += float(np.sum(r64 ** 2))
            noise[n] += float(np.sum((r64 - o64) ** 2))
        if labels is not None:
            rows = ref[0].shape[0]
            lab = np.asarray(labels)[seen:seen + rows]
            correct[0] += int(np.sum(np.argmax(ref[0], axis=-1) == lab))
            correct[1] += int(np.sum(np.argmax(out[0], axis=-1) == lab))
            seen += rows
    db = {n: (float("inf") if noise[n] == 0 else float(10 * np.log10(sig[n] / noise[n])))
          for n in names}
    acc = (correct[0] / seen, correct[1] / seen) if labels is not None and seen else None
    return {"sqnr_db": db, "accuracy": acc}


class NpzReader:
    """A CalibrationDataReader over arrays: ``inputs`` {input name: array}
    split into batches of ``batch_size`` rows along axis 0; ``rewind()``
    starts again, ``len()`` is the number of batches, ``set_range`` as ORT's."""

    def __init__(self, inputs, batch_size=1):
        if not inputs:
            raise ValueError("NpzReader: no input arrays")
        sizes = {k: np.shape(v)[0] if np.ndim(v) else 1 for k, v in inputs.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"NpzReader: the inputs have different numbers of rows: {sizes}")
        if batch_size < 1:
            raise ValueError(f"NpzReader: batch_size must be >= 1, got {batch_size}")
        self.inputs = inputs
        self.rows = next(iter(sizes.values()))
        self.batch_size = int(batch_size)
        self.start, self.end = 0, len(self)
        self.pos = self.start

    def __len__(self):
        return -(-self.rows // self.batch_size)

    def set_range(self, start_index, end_index):
        self.start, self.end = start_index, end_index
        self.pos = start_index

    def rewind(self):
        self.pos = self.start

    def get_next(self):
        if self.pos >= self.end:
            return None
        lo = self.pos * self.batch_size
        self.pos += 1
        return {k: v[lo:lo + self.batch_size] for k, v in self.inputs.items()}

    def __iter__(self):
        self.rewind()
        while True:
            b = self.get_next()
            if b is None:
                return
            yield b
