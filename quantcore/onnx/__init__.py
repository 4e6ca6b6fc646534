"""Calibrate and quantize a real ONNX model with ONNX Runtime, streaming.

:func:`quantize` is a drop-in for ONNX Runtime 1.32's ``quantize_static``:
the same parameters, in the same order, with the same defaults
(:data:`QUANTIZE_DEFAULTS`, checked against ORT's signature by the tests)::

    calibration_data_reader=None, quant_format=QDQ,
    op_types_to_quantize=None (ORT's QOperator + QDQ registries),
    per_channel=False, reduce_range=False,
    activation_type=QInt8, weight_type=QInt8, nodes_to_quantize=None,
    nodes_to_exclude=None, use_external_data_format=False,
    calibrate_method=MinMax, calibration_providers=None,
    extra_options=None, calibration_cache_path=None

quantcore computes the activation ranges ORT's calibrator would compute on
the same reader, bit for bit, and hands them to ORT's own quantizer through
its documented calibration cache (``TensorsData`` -> JSON ->
``quantize_static(..., calibration_data_reader=None,
calibration_cache_path=...)``), so the quantized model is written by ORT.
Every ``extra_options`` key is ORT's and means what it means there; the
``Calib*`` keys configure the calibrator as in ORT (``CalibStridedMinMax``,
``CalibMovingAverage``, ``CalibMovingAverageConstant``,
``CalibMaxIntermediateOutputs`` -- with ORT 1.32's loss of every full group
of buffered batches, see :mod:`quantcore.compat.onnxruntime` surprise 8 --,
``CalibTensorRangeSymmetric``, ``CalibPercentile``).  A calibration cache
that exists is used as ORT uses it (no calibration).  ``SmoothQuant``
(which transforms the model with the reader) is handed to ORT whole.

:func:`calibrate` runs the model with onnxruntime on a data reader (ORT's
``CalibrationDataReader`` protocol -- ``get_next()`` until it returns
``None`` -- or any iterable of ``{input name: array}`` feeds, or a callable
returning one), takes the activations ORT would calibrate (every float
input / output of the nodes of ``op_types_to_calibrate``, as ORT's
``select_tensors_to_calibrate`` picks them) as outputs of the same session,
and feeds each batch straight into a calibrator: the ORT-exact ones of
:mod:`quantcore.compat.onnxruntime` (``minmax``, ``entropy``,
``percentile``, ``distribution``) or quantcore's others
(``torch_histogram``: PyTorch's HistogramObserver search;
``nvidia_entropy`` / ``nvidia_mse`` / ``nvidia_percentile``: NVIDIA's
histogram calibrator).  No batch is kept.

How the batches are grouped into ORT ``collect_data`` calls (ORT's results
depend on it):

* default (``strided=None``): the whole reader is **one call**, as
  ``quantize_static`` without ``CalibStridedMinMax``.  MinMax keeps one
  ``(lo, hi)`` per batch: one pass.  The histogram methods need the range of
  the whole call before they count.  ``replay="auto"`` (default) reads the
  data once, holding the values in memory up to :data:`BUFFER_BYTES`
  (4 MiB: a small model's whole call); past that, it either appends them to
  a temporary file (spill) and counts from it, or -- a replayable reader (a
  list, a callable returning a fresh iterable, a reader with ``rewind()``,
  an iterable that is not its own iterator) whose model computes the values
  faster than the disk would write and read them back
  (:data:`SPILL_BYTES_PER_SECOND`) -- drops them and reads the data again
  (rerun).  A reader that cannot be replayed is never read twice.
  ``replay="spill"`` always spills past the buffer; ``replay="rerun"`` is
  :mod:`quantcore.compat.onnxruntime`'s two passes, batch by batch.  The
  range statistics of a tensor under ``SMALL_TENSOR`` values are taken once
  per chunk of batches (:data:`CHUNK_BYTES`: the per-tensor cost of a model
  of many small tensors is paid per chunk, not per batch), larger ones batch
  by batch.  The results are the same, bit for bit
  (``CalibrationResult.replay`` says which way was taken: ``"memory"``,
  ``"spill"`` or ``"rerun"``).
* ``strided=k`` (ORT's ``CalibStridedMinMax=k``): every ``k`` consecutive
  batches are one call (``k`` batches of activations are buffered);
  ``strided=1`` is one call per batch, in one pass, nothing buffered.
  The number of batches must be a multiple of ``k`` (ORT's error).

``passes`` is the older name: ``passes=1`` is ``strided=1``, ``passes=2``
the default.

By default (``parallel=True``) onnxruntime runs batch ``i + 1`` in a
background thread while the tensors of batch ``i`` are reduced by a pool of
threads, one per usable core, each kernel on one thread (the inference and
the kernels release the GIL; ORT's pool threads are told not to spin
between runs).  The result does not depend on it.

Feeds are checked before the model runs: an unknown or missing input name,
a dtype other than the input's (float64 for a float input included), a rank
or a fixed dimension other than the model's is a ValueError naming the
input, the batch and what was expected; a file that is not an ONNX model,
and any error onnxruntime raises, is a one-line ValueError naming the model.

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
import shutil
import tempfile
import threading
import time
import tracemalloc

import numpy as np

from ..compat import onnxruntime as O

__all__ = ["METHODS", "ORT_METHODS", "QUANTIZE_DEFAULTS", "CalibrationResult", "select_tensors",
           "calibrate", "quantize", "quantizable_op_types", "evaluate", "sqnr_db", "NpzReader",
           "SpooledReader"]

ORT_METHODS = ("minmax", "entropy", "percentile", "distribution")
QUANTCORE_METHODS = ("torch_histogram", "nvidia_entropy", "nvidia_mse", "nvidia_percentile")
METHODS = ORT_METHODS + QUANTCORE_METHODS
REPLAYS = ("auto", "rerun", "spill")

#: quantize_static's defaults (ORT 1.32), which :func:`quantize` shares
QUANTIZE_DEFAULTS = {
    "calibration_data_reader": None, "quant_format": O.QuantFormat.QDQ,
    "op_types_to_quantize": None, "per_channel": False, "reduce_range": False,
    "activation_type": O.QuantType.QInt8, "weight_type": O.QuantType.QInt8,
    "nodes_to_quantize": None, "nodes_to_exclude": None, "use_external_data_format": False,
    "calibrate_method": O.CalibrationMethod.MinMax, "calibration_providers": None,
    "extra_options": None, "calibration_cache_path": None,
}

#: quantize_static's extra_options that configure the calibrator (ORT's mapping)
CALIB_OPTION_KEYS = {"CalibTensorRangeSymmetric": "symmetric",
                     "CalibMovingAverage": "moving_average",
                     "CalibMovingAverageConstant": "averaging_constant",
                     "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
                     "CalibPercentile": "percentile"}

#: auto replay: spill when a batch's activations are written and read back
#: (this many bytes per second, both ways) faster than the model computes them
SPILL_BYTES_PER_SECOND = 2.5e8

#: onnxruntime's input types as numpy dtypes (the feeds are checked against them)
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
               "tensor(double)": "float64", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
               "tensor(int16)": "int16", "tensor(uint16)": "uint16", "tensor(int32)": "int32",
               "tensor(uint32)": "uint32", "tensor(int64)": "int64", "tensor(uint64)": "uint64",
               "tensor(bool)": "bool"}


def _onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - the onnx extra installs both
        raise ImportError("quantcore.onnx needs onnx and onnxruntime "
                          "(pip install 'quantcore-fakequant[onnx]')") from exc
    return onnx, onnxruntime


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _is_ort_error(exc):
    return type(exc).__module__.startswith(("onnxruntime", "onnx", "google.protobuf"))


def _label(model):
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else "the model"


def load_model(model):
    """A shape-inferred ModelProto of a path or a ModelProto (as ORT loads it);
    a file that is not an ONNX model is a ValueError naming it."""
    onnx, _ = _onnx()
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"{os.fspath(model)}: no such ONNX model file")
        try:
            model = onnx.load(os.fspath(model))
        except Exception as exc:  # protobuf's DecodeError, onnx's own errors
            raise ValueError(f"{os.fspath(model)}: not an ONNX model ({_one_line(exc)})") from None
        if not model.graph.node and not model.graph.input:
            raise ValueError("not an ONNX model (no graph)")
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception as exc:
        raise ValueError(f"the model fails ONNX shape inference: {_one_line(exc)}") from None


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
    # every calibrated tensor is an output: ORT's arena would keep a run's
    # worth of them allocated on top of the batches being reduced
    opts.enable_cpu_mem_arena = False
    return _ort_session(aug.SerializeToString(), opts, providers, "the model")


def _ort_session(src, opts, providers, label):
    _, ort = _onnx()
    try:
        return ort.InferenceSession(src, sess_options=opts,
                                    providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:
        if _is_ort_error(exc):
            raise ValueError(f"{label}: onnxruntime cannot load it: {_one_line(exc)}") from None
        raise


class FeedChecker:
    """Checks a feed against a session's inputs before it runs: the names,
    the dtypes (onnxruntime's input type), the ranks and the fixed
    dimensions; a ValueError names the input, the batch and what was
    expected.  ``run(feed, index)`` runs the session on a checked feed and
    turns onnxruntime's own errors into one-line ValueErrors."""

    def __init__(self, sess, outputs=None):
        self.sess = sess
        self.outputs = outputs
        self.inputs = {i.name: (i.type, i.shape) for i in sess.get_inputs()}

    def check(self, feed, index):
        where = f"batch {index}"
        if not isinstance(feed, dict):
            raise TypeError(f"{where}: a feed must be a dict {{input name: array}}, got "
                            f"{type(feed).__name__}")
        unknown = [n for n in feed if n not in self.inputs]
        missing = [n for n in self.inputs if n not in feed]
        if unknown or missing:
            raise ValueError(
                f"{where}: " + "; ".join(
                    ([f"the model has no input {', '.join(map(repr, unknown))}"] if unknown
                     else []) +
                    ([f"no array for model input {', '.join(map(repr, missing))}"] if missing
                     else [])) + f" (the model's inputs: {', '.join(self.inputs)})")
        for name, x in feed.items():
            otype, shape = self.inputs[name]
            if not isinstance(x, np.ndarray):
                raise TypeError(f"input {name!r} of {where}: expected a numpy array, got "
                                f"{type(x).__name__}")
            want = _ORT_DTYPES.get(otype)
            if want is not None and x.dtype != np.dtype(want):
                raise ValueError(f"input {name!r} of {where}: expected {want} ({otype}), got "
                                 f"{x.dtype}")
            if shape is not None and len(shape) != x.ndim:
                raise ValueError(f"input {name!r} of {where}: expected {len(shape)} dimensions "
                                 f"{_shape_text(shape)}, got shape {x.shape}")
            for axis, (want_dim, dim) in enumerate(zip(shape or (), x.shape)):
                if isinstance(want_dim, int) and want_dim >= 0 and want_dim != dim:
                    raise ValueError(f"input {name!r} of {where}: expected shape "
                                     f"{_shape_text(shape)}, got {x.shape} (axis {axis})")
        return feed

    def run(self, feed, index):
        self.check(feed, index)
        try:
            return self.sess.run(self.outputs, feed)
        except Exception as exc:
            if _is_ort_error(exc):
                raise ValueError(f"batch {index}: onnxruntime failed: {_one_line(exc)}") from None
            raise


def _shape_text(shape):
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in shape) + "]"


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


class _Spill:
    """Batches of arrays appended to one temporary file (raw bytes, no
    pickle) and read back in order, one batch at a time."""

    def __init__(self, directory=None):
        fd, self.path = tempfile.mkstemp(prefix="quantcore_onnx_", suffix=".spill",
                                         dir=directory)
        self.file = os.fdopen(fd, "wb")
        self.index = []
        self.nbytes = 0

    def write(self, batch):
        entry = []
        for name, a in batch.items():
            a = np.asarray(a)
            if not a.flags.c_contiguous:   # (np.ascontiguousarray makes 0-d arrays 1-d)
                a = a.copy(order="C")
            entry.append((name, a.dtype, a.shape))
            if a.size:
                self.file.write(memoryview(a.reshape(-1)).cast("B"))
            self.nbytes += a.nbytes
        self.index.append(entry)

    def write_parts(self, chunk):
        """{name: pieces}: each name's pieces (1-d, one dtype) as one array."""
        entry = []
        for name, parts in chunk.items():
            entry.append((name, parts[0].dtype, (sum(p.size for p in parts),)))
            for p in parts:
                if p.size:
                    self.file.write(memoryview(np.ascontiguousarray(p)).cast("B"))
                self.nbytes += p.nbytes
        self.index.append(entry)

    def read(self):
        self.file.close()
        with open(self.path, "rb") as f:
            for entry in self.index:
                batch = {}
                for name, dtype, shape in entry:
                    a = np.empty(shape, dtype)
                    if a.size and f.readinto(memoryview(a.reshape(-1)).cast("B")) != a.nbytes:
                        raise OSError(f"{self.path}: the spilled activations were cut short")
                    batch[name] = a
                yield batch

    def close(self):
        self.file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class SpooledReader:
    """Any reader made replayable: the feeds of ``data`` (a
    CalibrationDataReader, an iterable of feeds, a callable returning one)
    are copied to a temporary file as they are first read (raw bytes, no
    pickle; memory: one feed), and every later iteration reads them back
    from it.  ``close()`` (or the end of a ``with`` block) removes the file."""

    def __init__(self, data, directory=None):
        self.data = data
        self.directory = directory
        self._spill = None
        self.batches = None

    def __iter__(self):
        if self.batches is not None:
            yield from self._spill.read()
            return
        self.close()
        self._spill = _Spill(self.directory)
        n = 0
        for feed in O.iter_batches(self.data, "reader"):
            self._spill.write(feed)
            n += 1
            yield feed
        self.batches = n

    def __len__(self):
        if self.batches is None:
            raise TypeError("SpooledReader: the length is known once the data was read")
        return self.batches

    def close(self):
        if self._spill is not None:
            self._spill.close()
        self._spill, self.batches = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def replayable(data):
    """True when ``data`` can be read twice: a callable returning a fresh
    iterable, a reader with ``rewind()``, or an iterable that is not its own
    iterator (a list, a :class:`NpzReader`, a :class:`SpooledReader`)."""
    if callable(data) and not hasattr(data, "get_next"):
        return True
    if hasattr(data, "get_next"):
        return hasattr(data, "rewind")
    try:
        return iter(data) is not data
    except TypeError:
        return False


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


def _feeds(data):
    """Feeds of ``data``: a CalibrationDataReader, an iterable of dicts, or a
    callable returning one; a reader with ``rewind()`` is rewound first."""
    if hasattr(data, "rewind"):
        data.rewind()
    return O.iter_batches(data, "calibrate")


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
              measure_memory=False, parallel=True, spill_dir=None):
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
    method = _method_name(method)
    strided = _strided(strided, passes)
    if replay not in REPLAYS:
        raise ValueError(f"replay must be one of {', '.join(REPLAYS)}, got {replay!r}")
    if (options or {}).get("per_channel"):
        raise ValueError("per-channel activation ranges cannot be consumed by ORT's quantizer "
                         "(ORT surprise 10): use quantcore.compat.onnxruntime.MinMaxCalibrater "
                         "directly for per-channel statistics")
    two_pass = strided is None and method in ORT_METHODS and method != "minmax"
    can_rerun = replayable(data)
    if two_pass and replay == "rerun" and not can_rerun:
        O._second_pass(data, "calibrate")  # the TypeError saying why
    if measure_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    state = {"inference": 0.0, "batches": 0, "how": None}
    try:
        m = load_model(model)
        tensors, infos = select_tensors(m, op_types_to_calibrate)
        if not tensors:
            raise ValueError("the model has no float tensor to calibrate")
        sess = _session(m, tensors, infos, providers)
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

        def activations():
            for batch in _prefetch(model_runs) if parallel else model_runs():
                if on_batch is not None:
                    on_batch()
                yield batch

        def keep_spilling(nbytes):
            """auto: rerun rather than spill when the model is faster than the disk."""
            return replay == "spill" or not can_rerun or \
                nbytes / SPILL_BYTES_PER_SECOND < state["inference"]

        pool = O.tensor_executor() if parallel else contextlib.nullcontext()
        threads = O.kernel_threads(1) if parallel else contextlib.nullcontext()
        with pool as executor, threads:
            cal = make_calibrator(method, options, passes=1 if strided else 2, tensors=tensors,
                                  executor=executor)
            if strided and strided > 1 or strided and method == "minmax":
                _collect_strided(cal, activations(), strided, method)
            elif not two_pass:
                cal.collect_data(activations())
            elif replay == "rerun":
                cal.collect_data(activations)   # ORT's streaming two passes, batch by batch
                state["how"] = "rerun"
            else:
                state["how"] = _one_call(cal, activations, BUFFER_BYTES, spill_dir, executor,
                                         keep_spilling)
        td = cal.compute_data()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] if measure_memory else None
    finally:
        if measure_memory:
            tracemalloc.stop()
    return CalibrationResult(td, state["batches"], getattr(cal, "nan_batches", {}), seconds, peak,
                             inference_seconds=state["inference"], replay=state["how"])


#: the single call's activations kept in memory before they go to a spill file
#: (or the data is read again)
BUFFER_BYTES = 4 << 20


#: tensors smaller than this (values) are reduced once per chunk (their
#: pieces joined), larger ones batch by batch
SMALL_TENSOR = 1 << 15
#: the batches of one chunk hold at least this many bytes (the last one less)
CHUNK_BYTES = 1 << 20


def _chunks(cal, batches, on_batch_items, executor, reduce_small):
    """``batches`` grouped into chunks of at least :data:`CHUNK_BYTES`:
    each batch's items go to ``on_batch_items`` (batch by batch: the large
    tensors); each chunk is yielded as ``(batches, {name: pieces})`` with the
    pieces of every small tensor joined into one array first handed to
    ``reduce_small(name, array, pieces)`` (on ``executor``)."""
    pieces, held, n = {}, 0, 0
    for batch in batches:
        items = cal._arrays(batch)
        del batch
        on_batch_items(items)
        for name, a, _ in items:
            pieces.setdefault(name, []).append(a)
            held += a.nbytes
        n += 1
        del items
        if held >= CHUNK_BYTES:
            yield n, _join_small(pieces, executor, reduce_small)
            pieces, held, n = {}, 0, 0
    if n:
        yield n, _join_small(pieces, executor, reduce_small)


def _join_small(pieces, executor, reduce_small):
    def join(name):
        parts = pieces[name]
        a = parts[0] if len(parts) == 1 else np.concatenate(parts)
        reduce_small(name, a, parts)
        pieces[name] = [a]   # (one thread per tensor)
    O._map_tensors(executor, join, [k for k, v in pieces.items() if v[0].size < SMALL_TENSOR])
    return pieces


def _one_call(cal, read, buffer_bytes, spill_dir, executor, keep_spilling):
    """One ORT ``collect_data`` call of the histogram calibrator ``cal`` over
    the batches of ``read()``, in bounded memory.

    First pass: the range statistics of the call, a large tensor's batch by
    batch as it comes (while the model runs the next batch), the small
    tensors' once per chunk of batches (their pieces joined: the per-call
    cost of many small tensors is paid per chunk, not per batch).  The
    values are kept in memory up to ``buffer_bytes``; past it, either
    appended to a spill file chunk by chunk (``keep_spilling(bytes)`` true)
    or dropped, and ``read()`` is called again for the second pass.  Second
    pass: every tensor counted over the range of the whole call, chunk by
    chunk.  The state is the streaming two-pass call's (``collect_data``
    with ``passes=2``): ORT's stacking checks per batch, range statistics
    and counts that do not depend on how the values are grouped.  Returns
    ``"memory"``, ``"spill"`` or ``"rerun"``."""
    col = cal.collector
    stats, nans = {}, {}
    kept, held, spill, mode = [], 0, None, "memory"

    def note_nan(name, parts):
        nans[name] = nans.get(name, 0) + sum(bool(np.isnan(p).any()) for p in parts)

    def add_range(name, a, parts):
        if stats[name].add(a, need_absmin=cal._need_absmin(name)):
            note_nan(name, parts)

    def first_pass_items(items):
        large = []
        for name, a, shape in items:
            st = stats.get(name)
            if st is None:
                st = stats[name] = col.new_stats(name)
            st.add(a[:0], shape=shape)      # ORT's stacking: one shape, one dtype
            if a.size >= SMALL_TENSOR:
                large.append((name, a, [a]))
        O._map_tensors(executor, lambda item: add_range(*item), large)

    n = 0
    try:
        for count, chunk in _chunks(cal, read(), first_pass_items, executor, add_range):
            n += count
            if mode == "rerun":
                continue
            held += sum(a.nbytes for parts in chunk.values() for a in parts)
            kept.append(chunk)
            if mode == "memory" and held > buffer_bytes:
                if keep_spilling(held):
                    mode, spill = "spill", _Spill(spill_dir)
                else:
                    mode = "rerun"
            if mode == "spill":
                for c in kept:
                    spill.write_parts(c)
            if mode != "memory":
                kept, chunk = [], None
        if not stats:
            raise ValueError("No data is collected.")
        plans = {name: col.plan(name, st) for name, st in stats.items()}

        def count_parts(item):
            name, parts = item
            for a in parts:
                plans[name].add(a)

        def counted(source):
            for chunk in source:
                O._map_tensors(executor, count_parts, list(chunk.items()))

        if mode == "memory":
            counted(kept)
            del kept
        elif mode == "spill":
            counted({k: [v] for k, v in c.items()} for c in spill.read())
        else:
            def count_large(items):
                O._map_tensors(executor, lambda it: plans[it[0]].add(it[1]),
                               [(name, a) for name, a, _ in items if a.size >= SMALL_TENSOR])

            def count_small(name, a, parts):
                plans[name].add(a)

            for _, _ in _chunks(cal, read(), count_large, executor, count_small):
                pass
    finally:
        if spill is not None:
            spill.close()
    for name, st in stats.items():
        if name in nans:
            cal.nan_batches[name] = cal.nan_batches.get(name, 0) + nans[name]
        col.finish(name, st, plans[name])
    cal.batches += n
    return mode


def _collect_strided(cal, batches, k, method):
    group, n = [], 0
    for batch in batches:
        group.append(batch)
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


def quantizable_op_types():
    """The op types ORT's quantize_static quantizes (and calibrates) by
    default: its QOperator and QDQ registries."""
    _onnx()
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def _calibrator_options(method, extra_options):
    """The calibrator options quantize_static derives from its extra_options
    (the Calib* keys; those the method's calibrator does not take are
    ignored, as ORT's create_calibrator ignores them)."""
    calib = {}
    for k, v in (extra_options or {}).items():
        if k in CALIB_OPTION_KEYS:
            calib[CALIB_OPTION_KEYS[k]] = v
    if method not in ORT_METHODS:
        return {k: v for k, v in calib.items() if k == "percentile"}
    known = O.EXTRA_OPTIONS[O._method_of(method)]
    calib = {k: v for k, v in calib.items() if k in known}
    if calib.get("max_intermediate_outputs") is not None:
        calib["ort_bug_max_intermediate"] = True   # ORT 1.32 drops every full group
    return calib


def _enum_name(value, enum, what):
    """The member name of ORT's enum ``enum`` for a member (ORT's or
    compat's) or a name."""
    name = getattr(value, "name", value)
    if not isinstance(name, str) or name not in enum.__members__:
        raise ValueError(f"{what} must be one of {', '.join(enum.__members__)}, got {value!r}")
    return enum[name]


def quantize(model_input, model_output, calibration_data_reader=None,
             quant_format=O.QuantFormat.QDQ, op_types_to_quantize=None, per_channel=False,
             reduce_range=False, activation_type=O.QuantType.QInt8,
             weight_type=O.QuantType.QInt8, nodes_to_quantize=None, nodes_to_exclude=None,
             use_external_data_format=False, calibrate_method=O.CalibrationMethod.MinMax,
             calibration_providers=None, extra_options=None, calibration_cache_path=None, *,
             tensors_range=None, calibration_options=None, replay="auto", tensorrt_table=None,
             on_batch=None, parallel=True):
    """ONNX Runtime's ``quantize_static``, calibrated by quantcore.

    The parameters before ``*`` are ``quantize_static``'s, in its order, with
    its defaults (ORT 1.32; :data:`QUANTIZE_DEFAULTS`): ``quant_format``
    QDQ, ``op_types_to_quantize`` None (ORT's registries),
    ``per_channel`` False, ``reduce_range`` False, ``activation_type``
    QInt8, ``weight_type`` QInt8, ``nodes_to_quantize`` /
    ``nodes_to_exclude`` None, ``use_external_data_format`` False,
    ``calibrate_method`` MinMax, ``calibration_providers`` None (CPU),
    ``extra_options`` None, ``calibration_cache_path`` None.  Enums may be
    ORT's, :mod:`quantcore.compat.onnxruntime`'s or their names;
    ``calibrate_method`` may also name one of quantcore's methods
    (:data:`METHODS`).  With the defaults the result is ORT's default
    call's, bit for bit: the whole reader is one calibration call (module
    docstring), whatever the reader.

    Parameters
    ----------
    tensors_range : TensorsData or None
        Ranges to use (no calibration).
    calibration_options : dict or None
        The calibrator's own options that quantize_static cannot set
        (``num_bins``, ``num_quantized_bins``, ``scenario``, ...).
    replay : {"auto", "rerun", "spill"}
        :func:`calibrate`'s.
    tensorrt_table : path or None
        A folder that also gets ORT's TensorRT calibration files with the
        correct ``amax = max(|lowest|, |highest|)`` (ORT writes
        ``max(highest, lowest)``).
    on_batch, parallel
        :func:`calibrate`'s.

    Returns
    -------
    CalibrationResult or None
        None when no calibration ran (``tensors_range`` given, or an existing
        calibration cache).
    """
    onnx, _ = _onnx()
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    method = _method_name(calibrate_method, "method")
    ort_kw = dict(
        quant_format=_enum_name(quant_format, QuantFormat, "quant_format"),
        op_types_to_quantize=op_types_to_quantize, per_channel=per_channel,
        reduce_range=reduce_range,
        activation_type=_enum_name(activation_type, QuantType, "activation_type"),
        weight_type=_enum_name(weight_type, QuantType, "weight_type"),
        nodes_to_quantize=nodes_to_quantize, nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=use_external_data_format,
        calibration_providers=calibration_providers, extra_options=extra_options)
    extra = dict(extra_options or {})
    if extra.get("SmoothQuant", False):  # ORT transforms the model with the reader itself
        method = CalibrationMethod[_ort_method(method)]
        try:
            quantize_static(model_input, model_output, calibration_data_reader,
                            calibrate_method=method,
                            calibration_cache_path=calibration_cache_path, **ort_kw)
        except (RuntimeError, ImportError) as exc:  # ORT's: neural-compressor is missing
            raise ValueError(f"SmoothQuant (ORT's, run by ORT): {_one_line(exc)}") from None
        return None
    cached = calibration_cache_path is not None and os.path.isfile(calibration_cache_path)
    result = None
    if tensors_range is None and not cached:
        if calibration_data_reader is None:
            raise ValueError("quantize: give a calibration_data_reader, tensors_range or an "
                             "existing calibration_cache_path")
        opts = _calibrator_options(method, extra)
        opts.update(calibration_options or {})
        result = calibrate(model_input, calibration_data_reader, method, options=opts,
                           strided=extra.get("CalibStridedMinMax") or None, replay=replay,
                           op_types_to_calibrate=op_types_to_quantize or quantizable_op_types(),
                           providers=calibration_providers, on_batch=on_batch,
                           parallel=parallel)
        tensors_range = result.tensors_range
    tmpdir = tempfile.mkdtemp(prefix="quantcore_onnx_")
    try:
        if cached:
            cache = calibration_cache_path
            tensors_range = O.load_tensors_data(cache)
        else:
            cache = calibration_cache_path or os.path.join(tmpdir, "calibration.json")
            O.save_tensors_data(tensors_range, cache)
        try:
            quantize_static(model_input, model_output, None, calibration_cache_path=cache,
                            calibrate_method=CalibrationMethod[
                                tensors_range.calibration_method.name], **ort_kw)
        except (ValueError, TypeError, OSError):
            raise
        except Exception as exc:  # ORT's quantizer: NotImplementedError, AssertionError, ...
            raise ValueError(f"{_label(model_input)}: onnxruntime's quantizer failed: "
                             f"{type(exc).__name__}: {_one_line(exc)}") from None
        if tensorrt_table:
            os.makedirs(tensorrt_table, exist_ok=True)
            O.write_calibration_table(tensors_range, tensorrt_table, absmax=True)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return result


def _ort_method(method):
    if method not in ORT_METHODS:
        raise ValueError(f"SmoothQuant runs ORT's own calibration: calibrate_method must be one "
                         f"of {', '.join(ORT_METHODS)}, got {method!r}")
    return O._method_of(method).name


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
    label per row of the first output, in batch order: a ValueError when the
    counts differ)."""
    sessions = []
    for m in (float_model, quant_model):
        src = os.fspath(m) if isinstance(m, (str, os.PathLike)) else m.SerializeToString()
        sessions.append(FeedChecker(_ort_session(src, None, providers, _label(m))))
    names = [o.name for o in sessions[0].sess.get_outputs()]
    sessions[0].outputs = sessions[1].outputs = names
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
    sig = {n: 0.0 for n in names}
    noise = {n: 0.0 for n in names}
    correct, seen = [0, 0], 0
    for i, feed in enumerate(_feeds(data)):
        ref = sessions[0].run(feed, i)
        out = sessions[1].run(feed, i)
        for n, r, o in zip(names, ref, out):
            r64, o64 = np.asarray(r, np.float64), np.asarray(o, np.float64)
            sig[n] += float(np.sum(r64 ** 2))
            noise[n] += float(np.sum((r64 - o64) ** 2))
        if labels is not None:
            rows = int(np.prod(ref[0].shape[:-1])) if ref[0].ndim else 1
            if seen + rows > len(labels):
                raise ValueError(f"labels: {len(labels)} label(s) for more rows than that "
                                 f"(batch {i} ends at row {seen + rows}): one label per row")
            lab = labels[seen:seen + rows].reshape(ref[0].shape[:-1])
            correct[0] += int(np.sum(np.argmax(ref[0], axis=-1) == lab))
            correct[1] += int(np.sum(np.argmax(out[0], axis=-1) == lab))
            seen += rows
    if labels is not None and seen != len(labels):
        raise ValueError(f"labels: {len(labels)} label(s) for {seen} row(s): one label per row")
    db = {n: (float("inf") if noise[n] == 0 else float(10 * np.log10(sig[n] / noise[n])))
          for n in names}
    acc = (correct[0] / seen, correct[1] / seen) if labels is not None and seen else None
    return {"sqnr_db": db, "accuracy": acc}


class NpzReader:
    """A CalibrationDataReader over arrays: ``inputs`` {input name: array}
    split into batches of ``batch_size`` rows along each input's batch axis
    (``batch_axes`` {input name: axis or None}, default 0; None, and every
    0-d array: not batched, the whole array in every batch, e.g. a sample
    rate).  ``rewind()`` starts again, ``len()`` is the number of batches,
    ``set_range`` as ORT's."""

    def __init__(self, inputs, batch_size=1, batch_axes=None):
        if not inputs:
            raise ValueError("NpzReader: no input arrays")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
                batch_size < 1:
            raise ValueError(f"NpzReader: batch_size must be an int >= 1, got {batch_size!r}")
        batch_axes = dict(batch_axes or {})
        unknown = sorted(set(batch_axes) - set(inputs))
        if unknown:
            raise ValueError(f"NpzReader: batch_axes names no input {', '.join(unknown)} "
                             f"(inputs: {', '.join(inputs)})")
        self.axes = {}
        for k, v in inputs.items():
            axis = batch_axes.get(k, 0 if np.ndim(v) else None)
            if axis is not None:
                if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                        not -np.ndim(v) <= axis < np.ndim(v):
                    raise ValueError(f"NpzReader: batch axis of {k!r} must be an axis of its "
                                     f"shape {np.shape(v)} or None, got {axis!r}")
                axis = int(axis) % np.ndim(v)
            self.axes[k] = axis
        sizes = {k: np.shape(v)[a] for k, v in inputs.items()
                 if (a := self.axes[k]) is not None}
        if not sizes:
            raise ValueError("NpzReader: no input is batched (every batch axis is None)")
        if len(set(sizes.values())) != 1:
            raise ValueError(f"NpzReader: the batched inputs have different numbers of rows "
                             f"along their batch axes {self._axes_text()}: {sizes}")
        self.inputs = inputs
        self.rows = next(iter(sizes.values()))
        self.batch_size = int(batch_size)
        self.start, self.end = 0, len(self)
        self.pos = self.start

    def _axes_text(self):
        return "{" + ", ".join(f"{k}: {a}" for k, a in self.axes.items()) + "}"

    def __len__(self):
        return -(-self.rows // self.batch_size)

    def set_range(self, start_index, end_index):
        self.start, self.end = start_index, min(end_index, len(self))
        self.pos = start_index

    def rewind(self):
        self.pos = self.start

    def get_next(self):
        if self.pos >= self.end:
            return None
        lo = self.pos * self.batch_size
        self.pos += 1
        sl = slice(lo, lo + self.batch_size)
        return {k: v if (a := self.axes[k]) is None else v[(slice(None),) * a + (sl,)]
                for k, v in self.inputs.items()}

    def __iter__(self):
        self.rewind()
        while True:
            b = self.get_next()
            if b is None:
                return
            yield b
