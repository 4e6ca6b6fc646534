"""``quantcore onnx quantize``: calibrate an ONNX model with quantcore and
quantize it with ONNX Runtime's own quantize_static.

    quantcore onnx quantize model.onnx --data calib.npz --method entropy -o model.qdq.onnx

``--data`` is an .npz whose arrays are named after the model's inputs
(optionally ``labels``: one class per row, for the accuracy line), split
into batches of ``--batch-size`` rows.  The report prints each calibrated
tensor's range, the SQNR of the quantized model's outputs against the float
model's on the calibration data, and the accuracy (float / quantized) when
labels are given.  Option names follow ORT's (``--activation-type QUInt8``,
``--weight-type QInt8``, ``--per-channel``, ``--activation-symmetric`` =
``ActivationSymmetric``, ``--weight-symmetric`` = ``WeightSymmetric``, ...).
"""
import os
import sys

import numpy as np

QUANT_TYPES = ("QInt8", "QUInt8", "QInt16", "QUInt16", "QInt4", "QUInt4", "QFLOAT8E4M3FN")


def add_parser(sub, formatter=None):
    """Register ``onnx`` (with its ``quantize`` command) on the CLI's subparsers."""
    from . import onnx as qonnx
    kw = {"formatter_class": formatter} if formatter else {}
    p = sub.add_parser("onnx", help="calibrate and quantize an ONNX model (ONNX Runtime)",
                       description="ONNX models: quantcore calibrates, ONNX Runtime quantizes.",
                       **kw)
    osub = p.add_subparsers(dest="onnx_command", metavar="COMMAND")
    q = osub.add_parser("quantize", help="calibrate on --data and write a QDQ model", **kw)
    q.add_argument("model", help="float ONNX model")
    q.add_argument("--data", required=True, metavar="NPZ",
                   help="calibration inputs: arrays named after the model inputs (+ 'labels')")
    q.add_argument("-o", "--output", required=True, help="quantized model to write")
    q.add_argument("--method", default="minmax", choices=qonnx.METHODS)
    q.add_argument("--passes", type=int, default=1, choices=(1, 2),
                   help="1: one ORT collect call per batch (one pass); 2: ORT's single call "
                        "over all batches (two passes)")
    q.add_argument("--batch-size", type=int, default=1, help="rows per batch (default 1)")
    q.add_argument("--num-bins", type=int,
                   help="histogram bins (entropy / percentile / distribution)")
    q.add_argument("--num-quantized-bins", type=int, help="entropy: quantized bins")
    q.add_argument("--percentile", type=float, help="percentile: the percentile (default 99.999)")
    q.add_argument("--per-channel", action="store_true", help="per-channel weights")
    q.add_argument("--reduce-range", action="store_true", help="ORT's reduce_range (weights)")
    q.add_argument("--activation-type", default="QUInt8", choices=QUANT_TYPES)
    q.add_argument("--weight-type", default="QInt8", choices=QUANT_TYPES)
    q.add_argument("--quant-format", default="QDQ", choices=("QDQ", "QOperator"))
    q.add_argument("--activation-symmetric", action="store_true", help="ORT's ActivationSymmetric")
    q.add_argument("--weight-symmetric", choices=("true", "false"),
                   help="ORT's WeightSymmetric (default: ORT's per type)")
    q.add_argument("--calib-tensor-range-symmetric", action="store_true",
                   help="ORT's CalibTensorRangeSymmetric")
    q.add_argument("--cache", metavar="JSON", help="also keep the calibration cache here")
    q.add_argument("--tensorrt-table", metavar="DIR", help="write TensorRT calibration files")
    q.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run)
    return p


def _progress(total, quiet):
    """A tqdm bar over batches, only on a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="calibrating", unit="batch", file=sys.stderr, leave=False)


def error(message):
    """Stop with the CLI's one-line error message (exit status 2)."""
    from .cli_files import CliError
    raise CliError(message)


def run(args):
    """Run ``quantcore onnx ...``; returns the exit status."""
    if getattr(args, "onnx_command", None) != "quantize":
        error("quantcore onnx: expected a command: quantize")
    from . import onnx as qonnx
    if not os.path.isfile(args.model):
        error(f"{args.model}: no such file")
    if not os.path.isfile(args.data):
        error(f"{args.data}: no such file")
    with np.load(args.data, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    labels = arrays.pop("labels", None)
    import onnxruntime as ort
    inputs = [i.name for i in ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
              .get_inputs()]
    missing = [n for n in inputs if n not in arrays]
    if missing:
        error(f"{args.data}: no array for model input(s) {', '.join(missing)} "
              f"(it has {', '.join(arrays) or 'none'})")
    if args.batch_size < 1:
        error(f"--batch-size must be >= 1, got {args.batch_size}")
    reader = qonnx.NpzReader({n: arrays[n] for n in inputs}, args.batch_size)
    options = {k: v for k, v in (("num_bins", args.num_bins),
                                 ("num_quantized_bins", args.num_quantized_bins),
                                 ("percentile", args.percentile)) if v is not None}
    extra = {}
    if args.activation_symmetric:
        extra["ActivationSymmetric"] = True
    if args.weight_symmetric:
        extra["WeightSymmetric"] = args.weight_symmetric == "true"
    if args.calib_tensor_range_symmetric:
        extra["CalibTensorRangeSymmetric"] = True
    bar = _progress(len(reader) * args.passes, args.quiet)
    try:
        res = qonnx.quantize(args.model, args.output, reader, method=args.method,
                             passes=args.passes,
                             calibration_options=options, per_channel=args.per_channel,
                             reduce_range=args.reduce_range, activation_type=args.activation_type,
                             weight_type=args.weight_type, quant_format=args.quant_format,
                             extra_options=extra, cache_path=args.cache,
                             tensorrt_table=args.tensorrt_table,
                             on_batch=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    print(f"calibrated {len(res.tensors_range)} tensor(s) on {len(reader)} batch(es) with "
          f"{args.method} (passes={args.passes}) in {res.seconds:.2f} s; wrote {args.output}")
    print(f"{'tensor':<32}{'lowest':>14}{'highest':>14}")
    for name, (lo, hi) in res.ranges().items():
        print(f"{name:<32}{lo:>14.6g}{hi:>14.6g}")
    for name, n in res.nan_batches.items():
        print(f"warning: {name}: NaN in {n} batch(es) (left out of the range)")
    ev = qonnx.evaluate(args.model, args.output, reader,
                        labels=labels.reshape(-1) if labels is not None else None)
    for name, db in ev["sqnr_db"].items():
        print(f"SQNR {name}: {db:.2f} dB (quantized vs float outputs, calibration data)")
    if ev["accuracy"] is not None:
        f, q = ev["accuracy"]
        print(f"accuracy: float {100 * f:.2f}%  quantized {100 * q:.2f}%")
    return 0
