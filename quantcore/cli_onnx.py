"""``quantcore onnx quantize``: ONNX Runtime's ``quantize_static`` from the
command line, calibrated by quantcore (the ranges ORT's calibrator would
compute, bit for bit) and written by ORT's own quantizer.

    quantcore onnx quantize model.onnx --data calib.npz -o model.qdq.onnx
    quantcore onnx quantize vad.onnx --data calib.npz --batch-axis state=1 -o vad.qdq.onnx
    quantcore onnx quantize model.onnx --reader my_data:Reader --reader-arg root=imgs -o q.onnx
    quantcore onnx calibrate model.onnx --data calib.npz -o ranges.json   # ORT's cache only
    quantcore onnx quantize model.onnx --calibration-cache ranges.json -o q.onnx

Every default is ``quantize_static``'s (ORT 1.32): QDQ, activations and
weights QInt8, MinMax, the whole reader one calibration call.  Options:
``--op-types-to-quantize`` / ``--nodes-to-quantize`` / ``--nodes-to-exclude``
(ORT's node selection), ``--extra KEY=VALUE`` (any ``extra_options`` key,
typed as ORT types it: :data:`EXTRA_OPTION_TYPES`), ``--per-channel``,
``--reduce-range``, ``--activation-type``, ``--weight-type``,
``--quant-format``, ``--calibration-cache`` (used when it exists, written
otherwise: ORT's ``calibration_cache_path``).

The calibration data, one of:

* ``--data FILE.npz`` of arrays named after the model's inputs, split into
  batches of ``--batch-size`` rows along each input's batch axis: axis 0, or
  where the model's shape puts the symbolic dimension that is axis 0 of
  another input (a recurrent state ``[2, batch, 128]``: axis 1), or
  ``--batch-axis NAME=AXIS`` / ``NAME=none`` (not batched: the same array in
  every batch; a 0-d array never is).  ``labels`` (one class per row) adds
  an accuracy line.
* ``--data FILE.npz`` of per-batch feeds: arrays named ``INDEX/INPUT``
  (``0/input``, ``0/state``, ``1/input``, ...), each batch as given
  (``labels``: one class per row of every batch, in order).
* ``--data FOLDER`` of ``.npz`` files, one feed per file (sorted by name;
  a ``labels`` array in a file: that batch's classes).
* ``--reader MODULE:NAME`` (a module or a ``.py`` file): an ORT
  ``CalibrationDataReader`` class or a callable, called with the
  ``--reader-arg KEY=VALUE`` keywords (JSON values, else strings), or such a
  reader object; its feeds are spooled to a temporary file as they are read,
  so any reader can be replayed.

``onnx calibrate`` takes the same model, data and calibration options and
writes ORT's calibration cache (the TensorsData JSON that ``quantize_static``
reads as ``calibration_cache_path``) instead of a model.

The report: a summary of the calibration (``--ranges``: each calibrated
tensor's range), the SQNR of the quantized model's outputs against the
float model's on the calibration data (with a hint where it is under
:data:`POOR_SQNR_DB`), and the accuracy (float / quantized) when labels are
given.
"""
import importlib
import importlib.util
import json
import os
import sys

import numpy as np

from ._files import refuse_same_file

QUANT_TYPES = ("QInt8", "QUInt8", "QInt16", "QUInt16", "QInt4", "QUInt4", "QFLOAT8E4M3FN")

#: ORT 1.32 quantize_static's extra_options and how their values are typed
EXTRA_OPTION_TYPES = {
    "extra.Sigmoid.nnapi": "bool", "ActivationSymmetric": "bool",
    "ActivationRestrictedAsymmetric": "bool", "WeightSymmetric": "bool",
    "EnableSubgraph": "bool", "ForceQuantizeNoInputCheck": "bool", "MatMulConstBOnly": "bool",
    "AddQDQPairToWeight": "bool", "OpTypesToExcludeOutputQuantization": "list",
    "DedicatedQDQPair": "bool", "QDQOpTypePerChannelSupportToAxis": "axes",
    "CalibTensorRangeSymmetric": "bool", "CalibStridedMinMax": "int?",
    "CalibMovingAverage": "bool", "CalibMovingAverageConstant": "float",
    "CalibMaxIntermediateOutputs": "int?", "CalibPercentile": "float", "SmoothQuant": "bool",
    "SmoothQuantAlpha": "float", "SmoothQuantFolding": "bool", "UseQDQContribOps": "bool",
    "MinimumRealRange": "float?", "TensorQuantOverrides": "overrides",
    "QDQKeepRemovableActivations": "bool", "QDQDisableWeightAdjustForInt32Bias": "bool",
    "QuantizeBias": "bool", "DefaultTensorType": "tensortype", "BlockSize": "int",
}
_TYPE_TEXT = {"bool": "true or false", "int?": "an int or none", "int": "an int",
              "float": "a number", "float?": "a number or none",
              "list": "op types separated by commas", "axes": "a JSON object {op type: axis}",
              "overrides": "a JSON object {tensor: [{key: value}, ...]}",
              "tensortype": "an ONNX TensorProto type (FLOAT, 1, ...)"}


def add_parser(sub, formatter=None):
    """Register ``onnx`` (its ``quantize`` and ``calibrate`` commands) on the
    CLI's subparsers."""
    kw = {"formatter_class": formatter} if formatter else {}
    p = sub.add_parser("onnx", help="calibrate and quantize an ONNX model (ONNX Runtime)",
                       description="ONNX models: quantcore calibrates, ONNX Runtime quantizes.",
                       **kw)
    osub = p.add_subparsers(dest="onnx_command", metavar="COMMAND")
    q = osub.add_parser("quantize", help="ORT's quantize_static: calibrate and write a model",
                        description="ORT's quantize_static with its defaults; quantcore "
                                    "calibrates (python -m pydoc quantcore.cli_onnx).", **kw)
    _calibration_arguments(q, "quantized model to write")
    q.add_argument("--per-channel", action="store_true", help="per-channel weights")
    q.add_argument("--reduce-range", action="store_true", help="ORT's reduce_range (weights)")
    q.add_argument("--weight-type", default="QInt8", choices=QUANT_TYPES)
    q.add_argument("--quant-format", default="QDQ", choices=("QDQ", "QOperator"))
    q.add_argument("--nodes-to-quantize", metavar="NODES",
                   help="only these node names, separated by commas")
    q.add_argument("--nodes-to-exclude", metavar="NODES",
                   help="not these node names, separated by commas")
    q.add_argument("--weight-symmetric", choices=("true", "false"),
                   help="= --extra WeightSymmetric=...")
    q.add_argument("--use-external-data-format", action="store_true",
                   help="ORT's use_external_data_format (models over 2 GB)")
    q.add_argument("--calibration-cache", "--cache", dest="cache", metavar="JSON",
                   help="ORT's calibration_cache_path: used when it exists, written otherwise "
                        "(`quantcore onnx calibrate` writes one)")
    c = osub.add_parser("calibrate", help="calibrate only: write ORT's calibration cache",
                        description="The ranges (and histograms) quantize_static's calibrator "
                                    "computes, written as ORT's calibration cache JSON, which "
                                    "`quantcore onnx quantize --calibration-cache` and ORT's "
                                    "quantize_static(calibration_cache_path=...) read.", **kw)
    _calibration_arguments(c, "calibration cache to write (ORT's TensorsData JSON)")
    p.set_defaults(run=run)
    return p


def _calibration_arguments(p, output_help):
    """The arguments ``onnx quantize`` and ``onnx calibrate`` share: the
    model, its data, the calibration method and its options."""
    from . import onnx as qonnx
    p.add_argument("model", help="float ONNX model")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="NPZ|DIR",
                     help="calibration inputs: an .npz of arrays named after the model inputs "
                          "(+ 'labels'), an .npz of per-batch feeds 'INDEX/INPUT', or a folder "
                          "of .npz feeds")
    src.add_argument("--reader", metavar="MODULE:NAME",
                     help="an ORT CalibrationDataReader class / callable / object")
    p.add_argument("--reader-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument of --reader (JSON value, else a string)")
    p.add_argument("-o", "--output", required=True, help=output_help)
    p.add_argument("--dask", metavar="ADDRESS|local:N",
                   help="calibrate on a Dask cluster: a scheduler's address, or local:N for N "
                        "worker processes on this machine (--data split into partitions; the "
                        "workers read its files); the same model as on one machine")
    p.add_argument("--method", "--calibrate-method", dest="method", default="minmax",
                   choices=qonnx.METHODS, help="calibration method (default minmax, ORT's)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="rows per batch of an arrays .npz (default 1)")
    p.add_argument("--batch-axis", action="append", default=[], metavar="INPUT=AXIS",
                   help="an input's batch axis in an arrays .npz (an int, or none: not batched)")
    p.add_argument("--replay", default="auto", choices=qonnx.REPLAYS,
                   help="histogram methods: read the data again (rerun), from spilled "
                        "activations (spill), or the faster (auto)")
    p.add_argument("--num-bins", type=int,
                   help="histogram bins (entropy / percentile / distribution; ORT's default)")
    p.add_argument("--num-quantized-bins", type=int, help="entropy: quantized bins")
    p.add_argument("--percentile", type=float, help="percentile: the percentile (99.999)")
    p.add_argument("--activation-type", default="QInt8", choices=QUANT_TYPES)
    p.add_argument("--op-types-to-quantize", metavar="OPS",
                   help="op types to quantize, separated by commas (default: ORT's)")
    p.add_argument("--extra", action="append", default=[], metavar="KEY=VALUE",
                   help="an ORT extra_options entry (e.g. ActivationSymmetric=true, "
                        "CalibStridedMinMax=1, CalibMovingAverage=true)")
    p.add_argument("--activation-symmetric", action="store_true",
                   help="= --extra ActivationSymmetric=true")
    p.add_argument("--calib-tensor-range-symmetric", action="store_true",
                   help="= --extra CalibTensorRangeSymmetric=true")
    p.add_argument("--tensorrt-table", metavar="DIR", help="write TensorRT calibration files")
    p.add_argument("--ranges", action="store_true",
                   help="print every calibrated tensor's range (default: a summary)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _progress(quiet):
    """A tqdm bar over model runs, only on a terminal."""
    from .cli_common import progress_bars
    make = progress_bars(quiet)
    return None if make is None else make(desc="calibrating", unit="batch")


def error(message):
    """Stop with the CLI's one-line error message (exit status 2)."""
    from .cli_files import CliError
    raise CliError(message)


def _bool(text, what):
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    error(f"{what}: expected true or false, got {text!r}")


def _json(text, what, expect):
    try:
        value = json.loads(text)
    except ValueError as exc:
        error(f"{what}: expected {expect}: {exc}")
    return value


def parse_extra(items, activation_type="QInt8"):
    """``--extra KEY=VALUE`` entries as ORT's typed ``extra_options``."""
    from onnxruntime.quantization import QuantType
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            error(f"--extra {item!r}: expected KEY=VALUE")
        kind = EXTRA_OPTION_TYPES.get(key)
        if kind is None:
            error(f"--extra {key}: not an extra_options key of ORT's quantize_static (known: "
                  f"{', '.join(EXTRA_OPTION_TYPES)})")
        what = f"--extra {key}"
        try:
            out[key] = _typed(kind, text, what, QuantType, activation_type)
        except ValueError as exc:
            error(f"{what}: expected {_TYPE_TEXT[kind]}, got {text!r} ({exc})")
    return out


def _typed(kind, text, what, quant_type, activation_type):
    if kind == "bool":
        return _bool(text, what)
    if kind.endswith("?") and text.strip().lower() in ("none", "null", ""):
        return None
    if kind in ("int", "int?"):
        return int(text)
    if kind in ("float", "float?"):
        return float(text)
    if kind == "list":
        return [t.strip() for t in text.split(",") if t.strip()]
    if kind == "tensortype":
        import onnx
        name = text.strip().upper()
        if name in onnx.TensorProto.DataType.keys():
            return int(onnx.TensorProto.DataType.Value(name))
        return int(text)
    value = _json(text, what, _TYPE_TEXT[kind])
    if kind == "axes":
        if not isinstance(value, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            raise ValueError("a JSON object of int axes")
        return value
    if not isinstance(value, dict) or not all(
            isinstance(v, list) and all(isinstance(o, dict) for o in v) for v in value.values()):
        raise ValueError("a JSON object of lists of objects")
    return {t: [_override(o, quant_type, activation_type) for o in v] for t, v in value.items()}


def _override(o, quant_type, activation_type):
    """A TensorQuantOverrides entry typed as ORT takes it: QuantType
    members, a float32 scale, a zero point of the quantized type."""
    from .compat.onnxruntime import np_dtype
    o = dict(o)
    if "convert" in o:
        o["convert"] = _override(o["convert"], quant_type, activation_type)
    if "quant_type" in o:
        if o["quant_type"] not in quant_type.__members__:
            raise ValueError(f"quant_type {o['quant_type']!r} is not one of "
                             f"{', '.join(quant_type.__members__)}")
        o["quant_type"] = quant_type[o["quant_type"]]
    if "scale" in o:
        o["scale"] = np.array(o["scale"], np.float32)
    if "zero_point" in o:
        qt = getattr(o.get("quant_type"), "name", None) or activation_type
        o["zero_point"] = np.array(o["zero_point"], np_dtype(qt))
    return o


def _names(text):
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _batch_axes(items):
    axes = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            error(f"--batch-axis {item!r}: expected INPUT=AXIS (an int or none)")
        t = text.strip().lower()
        if t in ("none", "null", "-"):
            axes[name.strip()] = None
            continue
        try:
            axes[name.strip()] = int(t)
        except ValueError:
            error(f"--batch-axis {name}: expected an int axis or none, got {text!r}")
    return axes


def default_batch_axes(model_inputs, arrays):
    """Each array's batch axis: where the model's declared shape puts the
    symbolic dimension that is axis 0 of another input (a recurrent state
    ``[2, batch, 128]``: 1), else 0; a 0-d array, or an input the model
    declares 0-d, is not batched (None)."""
    shapes = {i.name: i.shape for i in model_inputs}
    symbols = [s[0] for s in shapes.values() if s and isinstance(s[0], str) and s[0]]
    axes = {}
    for name, a in arrays.items():
        shape = shapes.get(name)
        if np.ndim(a) == 0 or shape == []:
            axes[name] = None
            continue
        axes[name] = 0
        if shape and len(shape) == np.ndim(a):
            for i, d in enumerate(shape):
                if isinstance(d, str) and d in symbols:
                    axes[name] = i
                    break
    return axes


class FeedFiles:
    """Per-batch feeds: the batches of an .npz of ``INDEX/INPUT`` arrays or
    of a folder of .npz files (sorted by name), read one batch at a time;
    ``labels`` entries are taken out (:meth:`labels`)."""

    def __init__(self, path):
        self.path = path
        if os.path.isdir(path):
            self.files = sorted(os.path.join(path, f) for f in os.listdir(path)
                                if f.endswith(".npz"))
            if not self.files:
                error(f"{path}: a data folder holds .npz files of feeds; there is none")
            self.keys = None
        else:
            self.files = None
            with _open_npz(path) as npz:
                groups = {}
                for key in npz.files:
                    if key == "labels":
                        continue
                    index, _, name = key.partition("/")
                    try:
                        groups.setdefault(int(index), []).append((name, key))
                    except ValueError:
                        error(f"{path}: array {key!r}: per-batch feeds are named INDEX/INPUT")
            self.keys = [groups[i] for i in sorted(groups)]

    def __len__(self):
        return len(self.files) if self.files is not None else len(self.keys)

    def _batches(self):
        if self.files is not None:
            for f in self.files:
                with _open_npz(f) as npz:
                    yield {k: npz[k] for k in npz.files}
        else:
            with _open_npz(self.path) as npz:
                if "labels" in npz.files:
                    yield {"labels": npz["labels"]}   # (labels only: no feed)
                for group in self.keys:
                    yield {name: npz[key] for name, key in group}

    def __iter__(self):
        for feed in self._batches():
            feed.pop("labels", None)
            if feed:
                yield feed

    def labels(self):
        labels = [np.asarray(f["labels"]).reshape(-1) for f in self._batches() if "labels" in f]
        return np.concatenate(labels) if labels else None


def _open_npz(path):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        error(f"{path}: not a readable .npz file ({' '.join(str(exc).split())})")


def _load_reader(spec, reader_args):
    """The object of ``--reader MODULE:NAME`` (called with the keywords)."""
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        error(f"--reader {spec!r}: expected MODULE:NAME (a module or a .py file)")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            if not os.path.isfile(mod_name):
                error(f"--reader {spec}: {mod_name}: no such file")
            s = importlib.util.spec_from_file_location("quantcore_cli_reader", mod_name)
            module = importlib.util.module_from_spec(s)
            s.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(mod_name)
    except ImportError as exc:
        error(f"--reader {spec}: cannot import {mod_name}: {exc}")
    obj = getattr(module, attr, None)
    if obj is None:
        error(f"--reader {spec}: {mod_name} has no {attr!r}")
    kwargs = {}
    for item in reader_args:
        key, eq, text = item.partition("=")
        if not eq:
            error(f"--reader-arg {item!r}: expected KEY=VALUE")
        try:
            kwargs[key.strip()] = json.loads(text)
        except ValueError:
            kwargs[key.strip()] = text
    if hasattr(obj, "get_next") and not isinstance(obj, type):
        if kwargs:
            error(f"--reader {spec} is a reader object: it takes no --reader-arg")
        return obj
    if not callable(obj):
        error(f"--reader {spec}: expected a reader class, a callable or a reader object")
    try:
        return obj(**kwargs)
    except TypeError as exc:
        error(f"--reader {spec}: cannot be called with {kwargs or 'no arguments'}: {exc}")


def _data(args, model_inputs):
    """(reader, labels, rows or None) of --data / --reader."""
    from . import onnx as qonnx
    if args.reader:
        return qonnx.SpooledReader(_load_reader(args.reader, args.reader_arg)), None, None
    if not os.path.exists(args.data):
        error(f"{args.data}: no such file or folder")
    if os.path.isdir(args.data):
        feeds = FeedFiles(args.data)
        return feeds, feeds.labels(), None
    with _open_npz(args.data) as npz:
        names = list(npz.files)
        per_batch = names and all("/" in n for n in names if n != "labels")
        arrays = None if per_batch else {k: npz[k] for k in names}
    if per_batch:
        feeds = FeedFiles(args.data)
        return feeds, feeds.labels(), None
    labels = arrays.pop("labels", None)
    inputs = [i.name for i in model_inputs]
    missing = [n for n in inputs if n not in arrays]
    if missing:
        error(f"{args.data}: no array for model input(s) {', '.join(missing)} "
              f"(it has {', '.join(arrays) or 'none'})")
    if args.batch_size < 1:
        error(f"--batch-size must be >= 1, got {args.batch_size}")
    arrays = {n: arrays[n] for n in inputs}
    axes = default_batch_axes(model_inputs, arrays)
    given = _batch_axes(args.batch_axis)
    unknown = [n for n in given if n not in arrays]
    if unknown:
        error(f"--batch-axis {unknown[0]}: the model has no such input (its inputs: "
              f"{', '.join(inputs)})")
    axes.update(given)
    try:
        reader = qonnx.NpzReader(arrays, args.batch_size, axes)
    except ValueError as exc:
        error(f"{args.data}: {exc} (set an input's batch axis with --batch-axis INPUT=AXIS, "
              f"or INPUT=none for one that is not batched)")
    return reader, labels, reader.rows


def run(args):
    """Run ``quantcore onnx quantize`` or ``quantcore onnx calibrate``;
    returns the exit status."""
    command = getattr(args, "onnx_command", None)
    if command not in ("quantize", "calibrate"):
        error("quantcore onnx: expected a command: quantize or calibrate")
    from . import onnx as qonnx
    if not os.path.isfile(args.model):
        error(f"{args.model}: no such file")
    try:   # the output is none of the inputs, by any path (links included)
        refuse_same_file(args.output, [args.model, getattr(args, "data", None),
                                       getattr(args, "cache", None)], "-o")
    except ValueError as exc:
        error(str(exc))
    qonnx.load_model(args.model)      # not an ONNX model: one line
    sess = qonnx._ort_session(args.model, None, None, args.model)
    reader, labels, rows = _data(args, sess.get_inputs())
    if labels is not None:
        labels = labels.reshape(-1)
        if rows is not None and len(labels) != rows:
            error(f"{args.data}: {len(labels)} label(s) for {rows} row(s): 'labels' holds one "
                  f"class per row")
    options = {k: v for k, v in (("num_bins", args.num_bins),
                                 ("num_quantized_bins", args.num_quantized_bins),
                                 ("percentile", args.percentile)) if v is not None}
    extra = {}
    if args.activation_symmetric:
        extra["ActivationSymmetric"] = True
    if getattr(args, "weight_symmetric", None):
        extra["WeightSymmetric"] = args.weight_symmetric == "true"
    if args.calib_tensor_range_symmetric:
        extra["CalibTensorRangeSymmetric"] = True
    extra.update(parse_extra(args.extra, args.activation_type))
    from .cli_common import quiet_ort
    args.client = cluster = None
    try:
        if getattr(args, "dask", None):
            args.client, cluster, args.partitions = _dask(args, qonnx, reader)
        with quiet_ort():
            if command == "calibrate":
                return _calibrate(args, qonnx, reader, options, extra)
            return _quantize(args, qonnx, reader, labels, options, extra)
    finally:
        if isinstance(reader, qonnx.SpooledReader):
            reader.close()
        if args.client is not None:
            args.client.close()
        if cluster is not None:
            cluster.close()


def _dask(args, qonnx, reader):
    """(client, LocalCluster or None, partitions) of ``--dask``: --data
    split into 4 partitions per worker."""
    from .onnx import cluster as C
    if args.reader:
        error("--dask takes --data (a file or folder the workers read), not --reader")
    try:
        import distributed  # noqa: F401
    except ImportError:
        error("--dask needs dask.distributed: pip install 'dask[distributed]'")
    try:
        client, cluster = C.cluster_client(args.dask)
    except ValueError as exc:
        error(str(exc))
    except OSError as exc:
        error(f"--dask {args.dask}: cannot reach the scheduler ({exc})")
    workers = max(1, len(client.scheduler_info()["workers"]))
    axes = reader.axes if isinstance(reader, qonnx.NpzReader) else None
    return client, cluster, C.partitions_of(args.data, 4 * workers,
                                            batch_size=args.batch_size, batch_axes=axes)


def _calibrate(args, qonnx, reader, options, extra):
    """``onnx calibrate``: ``quantize_static``'s calibration (its method,
    options and op types), written as ORT's calibration cache."""
    from .compat import onnxruntime as O
    from .onnx.static import _calibrator_options
    opts = _calibrator_options(args.method, extra)
    opts.update(options)
    bar = _progress(args.quiet)
    try:
        res = qonnx.calibrate(
            args.model, reader if args.client is None else args.partitions, args.method,
            client=args.client, options=opts,
            strided=extra.get("CalibStridedMinMax") or None, replay=args.replay,
            op_types_to_calibrate=_names(args.op_types_to_quantize)
            or qonnx.quantizable_op_types(),
            on_batch=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    O.save_tensors_data(res.tensors_range, args.output)
    if args.tensorrt_table:
        os.makedirs(args.tensorrt_table, exist_ok=True)
        O.write_calibration_table(res.tensors_range, args.tensorrt_table, absmax=True)
    _report_ranges(args, res, extra)
    print(f"`quantcore onnx quantize {args.model} --calibration-cache {args.output} ...` "
          "quantizes with these ranges")
    return 0


def _report_ranges(args, res, extra):
    """One summary line of a calibration; every tensor's range with
    ``--ranges``; the NaN warnings."""
    how = {"rerun": ", data read twice", "spill": ", activations spilled"}.get(res.replay, "")
    stride = extra.get("CalibStridedMinMax")
    calls = f"one call per {stride} batch(es)" if stride else "one call"
    print(f"calibrated {len(res.tensors_range)} tensor(s) on {res.batches} batch(es) with "
          f"{args.method} ({calls}{how}) in {res.seconds:.2f} s; wrote {args.output}")
    ranges = res.ranges()
    if args.ranges:
        print(f"{'tensor':<32}{'lowest':>14}{'highest':>14}")
        for name, (lo, hi) in ranges.items():
            print(f"{name:<32}{lo:>14.6g}{hi:>14.6g}")
    elif ranges:
        widest = max(ranges, key=lambda n: float(ranges[n][1]) - float(ranges[n][0]))
        lo, hi = ranges[widest]
        print(f"widest range: {widest} [{lo:.6g}, {hi:.6g}] (--ranges prints every tensor's)")
    for name, n in res.nan_batches.items():
        print(f"warning: {name}: NaN in {n} batch(es) (left out of the range)")


#: below this output SQNR (dB) the report suggests what usually helps
POOR_SQNR_DB = 20.0


def _quantize(args, qonnx, reader, labels, options, extra):
    """``onnx quantize``: ``quantize_static`` calibrated by quantcore, then
    the quantized model's outputs against the float model's."""
    bar = _progress(args.quiet)
    try:
        res = qonnx.quantize(
            args.model, args.output, reader if args.client is None else args.partitions,
            client=args.client, quant_format=args.quant_format,
            op_types_to_quantize=_names(args.op_types_to_quantize),
            per_channel=args.per_channel, reduce_range=args.reduce_range,
            activation_type=args.activation_type, weight_type=args.weight_type,
            nodes_to_quantize=_names(args.nodes_to_quantize),
            nodes_to_exclude=_names(args.nodes_to_exclude),
            use_external_data_format=args.use_external_data_format,
            calibrate_method=args.method, extra_options=extra,
            calibration_cache_path=args.cache, calibration_options=options,
            replay=args.replay, tensorrt_table=args.tensorrt_table,
            on_batch=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    if res is None:
        print(f"used the ranges of {args.cache}; wrote {args.output}")
    else:
        _report_ranges(args, res, extra)
    ev = qonnx.evaluate(args.model, args.output, reader, labels=labels)
    for name, db in ev["sqnr_db"].items():
        print(f"SQNR {name}: {db:.2f} dB (quantized vs float outputs, calibration data)")
    if ev["accuracy"] is not None:
        f, q = ev["accuracy"]
        print(f"accuracy: float {100 * f:.2f}%  quantized {100 * q:.2f}%")
    poor = [name for name, db in ev["sqnr_db"].items() if not db >= POOR_SQNR_DB]
    if poor:
        print(f"hint: output SQNR under {POOR_SQNR_DB:g} dB ({', '.join(poor)}): try "
              "--per-channel, --activation-type QUInt8, --method entropy or percentile, or "
              "--nodes-to-exclude for the layers that lose most (`quantcore compare` shows them)")
    return 0
