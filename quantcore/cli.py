"""The ``quantcore`` command line: calibrate tensors in files, apply saved
qparams, quantize a checkpoint's weights (and read it back), run the demo.

    quantcore calibrate model.safetensors -o qparams.json
    quantcore calibrate model.safetensors --weights-only --method mse --bits 4 --plot mse.png
    quantcore fake-quant model.safetensors --qparams qparams.json -o model_fq.safetensors
    quantcore quantize model.safetensors --format int4 -o q.safetensors   (cli_quantize.py)
    quantcore dequantize q.safetensors -o back.safetensors
    quantcore demo

The commands live in their own modules: ``calibrate`` in cli_calibrate.py,
``quantize`` / ``dequantize`` in cli_quantize.py, ``onnx`` in cli_onnx.py;
``fake-quant``, ``demo``, ``info`` and the parser here.  They share their
option names and meanings (``--tensors`` globs, ``-q``), their input checks
(``check_input``, ``open_safetensors``) and their note and table printing
(``print_notes``, ``print_table``) through cli_common.py; an ImportError of
an optional package becomes one line naming the ``quantcore-fakequant``
extra that installs it (``cli_common.EXTRAS``), status 2.

Exit status: 0 when something was done; 2 for a user error (a bad file or
option, an unwritable output, nothing left to calibrate), printed as one
line on stderr; 1 for an unexpected internal error, also one line
(``QUANTCORE_DEBUG=1`` shows its traceback).  A tensor that cannot be
calibrated (not floating point, empty, no finite values, ...) is left out
with a note; the run fails only when no tensor is left.

Commands register themselves: ``_add_<command>(sub)`` adds a sub-parser to
the ``sub`` of :func:`build_parser` and sets ``run=function``; the function
takes the parsed arguments, returns the exit status and raises
:class:`CliError` for user errors.  A new command is one such function and
one line in :func:`build_parser`.
"""
import argparse
import json
import os
import sys

import numpy as np

from .cli_calibrate import (METHODS, ROUNDING, Histograms, Scheme, _add_calibrate,  # noqa: F401
                            calibrate, error_stats, method_range, sqnr_db)
from .cli_common import (EXTRAS, Parser, formatter, install_hint, list_checked,  # noqa: F401
                         missing_extra)
from .cli_files import (CliError, check_writable, one_line, safetensors_metadata,
                        save_tensors)

__all__ = ["main", "build_parser", "CliError", "METHODS", "method_range", "error_stats",
           "sqnr_db"]


# --------------------------------------------------------------- fake quant
def _entry_params(name, entry, arr):
    """(scale, zero_point, qmin, qmax, axis, rounding) of one qparams entry,
    checked; CliError naming the problem otherwise."""
    def bad(why):
        return CliError(f"{name}: bad qparams entry: {why}")
    if not isinstance(entry, dict):
        raise bad(f"expected an object, got {type(entry).__name__}")
    missing = [k for k in ("scale", "zero_point", "quant_min", "quant_max") if k not in entry]
    if missing:
        raise bad(f"missing {', '.join(missing)}")
    values = {}
    for key in ("scale", "zero_point"):
        v = entry[key]
        v = [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        if not isinstance(v, list) or not v or not all(
                isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
            raise bad(f"{key} must be a non-empty list of numbers, got {str(entry[key])[:40]}")
        values[key] = np.asarray(v, np.float64)
    for key in ("quant_min", "quant_max"):
        if not isinstance(entry[key], int) or isinstance(entry[key], bool):
            raise bad(f"{key} must be an integer, got {entry[key]!r}")
    axis = entry.get("axis")
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise bad(f"axis must be an integer or null, got {axis!r}")
    shape = entry.get("shape")
    if shape is not None and list(shape) != list(arr.shape):
        raise bad(f"calibrated for shape {tuple(shape)}, the tensor has shape {arr.shape}")
    scale, zp = values["scale"], values["zero_point"]
    if axis is None:
        if scale.size != 1 or zp.size != 1:
            raise bad(f"per tensor (axis null) needs one scale and one zero point, got "
                      f"{scale.size} and {zp.size}")
        scale, zp = scale[0], zp[0]
    return scale, zp, entry["quant_min"], entry["quant_max"], axis, \
        entry.get("rounding", "half_even")


def fake_quant_files(args):
    import quantcore as qc
    try:
        with open(args.qparams, encoding="utf-8") as fh:
            saved = json.load(fh)
    except (OSError, ValueError, RecursionError) as exc:
        raise CliError(f"{args.qparams}: cannot read qparams: {one_line(exc)}") from None
    if not isinstance(saved, dict):
        raise CliError(f"{args.qparams}: expected an object of tensor name -> qparams (as "
                       f"written by 'quantcore calibrate -o'), got {type(saved).__name__}")
    check_writable(args.output, "-o", [args.file, args.qparams])
    if not args.output.endswith((".npy", ".npz", ".safetensors")):
        raise CliError(f"{args.output}: unknown output type (expected .npy, .npz or "
                       ".safetensors)")
    entries = list_checked(args.file)
    out, applied, notes = {}, 0, []
    for e in entries:
        key = f"{os.path.basename(args.file)}:{e.name}"
        qp = saved[e.name] if e.name in saved else saved.get(key)
        if e.problem:
            if qp is not None:
                raise CliError(f"{e.name}: {e.problem}")
            notes.append(f"{e.name} left out of the output: {e.problem}")
            continue
        if qp is not None and not e.is_float:
            raise CliError(f"{e.name}: has qparams but dtype {e.dtype}; only floating-point "
                           "tensors are fake-quantized")
        if qp is None and args.strict and e.is_float:
            raise CliError(f"{args.qparams}: no qparams for tensor {e.name!r}")
        arr = e.load()
        if e.widened:
            notes.append(f"{e.name}: {e.dtype} written as float32")
        if qp is None:
            out[e.name] = arr
            continue
        scale, zp, qmin, qmax, axis, rounding = _entry_params(e.name, qp, arr)
        try:
            out[e.name] = qc.fake_quant(arr, scale, zp, qmin, qmax, axis=axis, rounding=rounding)
        except (TypeError, ValueError) as exc:
            raise CliError(f"{e.name}: bad qparams entry: {one_line(exc)}") from None
        applied += 1
    if not applied:
        raise CliError(f"{args.qparams}: holds qparams for none of the floating-point tensors "
                       f"of {args.file} ({', '.join(e.name for e in entries[:10])})")
    meta = safetensors_metadata(args.file) if args.file.endswith(".safetensors") else None
    save_tensors(out, args.output, meta)
    print(f"wrote {len(out)} tensor(s) to {args.output} ({applied} fake-quantized, "
          f"{len(out) - applied} copied)")
    for note in notes:
        print(f"note: {note}")
    return 0


# ------------------------------------------------------------------ parser
EXAMPLES = """examples:
  quantcore calibrate model.safetensors -o qparams.json
  quantcore calibrate model.safetensors --weights-only --per-channel -o qparams.json
  quantcore calibrate w.npy --method mse --bits 4 --plot w.png
  quantcore calibrate acts.npz --method percentile --percentile 99.9 --affine
  quantcore calibrate model.npz --tensors 'blocks.*.weight' 'head.*'
  quantcore fake-quant model.safetensors --qparams qparams.json -o model_fq.safetensors
  quantcore quantize model.safetensors --format int4 --group-size 128 -o q.safetensors
  quantcore dequantize q.safetensors -o back.safetensors
  quantcore demo

Errors are one line on stderr, exit status 2."""


def _add_fake_quant(sub):
    fq = sub.add_parser("fake-quant", help="apply saved qparams to the tensors of a file",
                        description="Fake-quantize the tensors of FILE with the qparams "
                                    "written by 'quantcore calibrate -o' and save them to OUT "
                                    "(tensors without qparams are copied unchanged).")
    fq.set_defaults(run=fake_quant_files)
    fq.add_argument("file", metavar="FILE", help=".npy, .npz or .safetensors")
    fq.add_argument("--qparams", required=True, metavar="JSON", help="from 'calibrate -o'")
    fq.add_argument("-o", "--output", required=True, metavar="OUT",
                    help=".npy, .npz or .safetensors")
    fq.add_argument("--strict", action="store_true",
                    help="fail when a tensor has no qparams (default: copy it unchanged)")


def _run_demo(args):
    if args.save is not None:
        from .demo import save_convnet
        for path in save_convnet(args.save, seed=args.seed):
            print(f"wrote {path}")
        return 0
    if args.plot:
        check_writable(args.plot, "--plot")
    from .demo import run_demo
    run_demo(seed=args.seed, plot_path=args.plot)
    return 0


def _add_demo(sub):
    demo = sub.add_parser("demo", help="train, post-training quantize and QAT a NumPy MLP "
                                       "on scikit-learn's digits, and quantize a conv net as "
                                       "ONNX next to ONNX Runtime's calibrators (the main job)")
    demo.set_defaults(run=_run_demo)
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--plot", default="quantcore_demo.png",
                      help="where to save the training curves ('' for none)")
    demo.add_argument("--save", metavar="DIR",
                      help="only train the ONNX part's conv net and write DIR/convnet.onnx and "
                           "DIR/convnet_data.npz (test images 'x' and 'labels'), for "
                           "quantcore compare")


def _run_info(args):
    import quantcore
    for key, value in quantcore.build_info().items():
        print(f"{key:20s} {value}")
    return 0


def _add_info(sub):
    sub.add_parser("info", help="print how the extension was built").set_defaults(run=_run_info)


def build_parser():
    import quantcore
    parser = Parser(
        prog="quantcore",
        description="Framework-free quantization observers and fake quantization,\n"
                    "bit-exact with PyTorch, MindSpore, OneFlow, NVIDIA, Horizon and "
                    "TensorFlow.",
        epilog=EXAMPLES, formatter_class=formatter(argparse.RawDescriptionHelpFormatter))
    parser.add_argument("--version", action="version",
                        version=f"quantcore-fakequant {quantcore.__version__}")
    sub = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND",
                                help="quantcore COMMAND --help for its options")
    _add_calibrate(sub)
    _add_fake_quant(sub)
    _add_demo(sub)
    _add_info(sub)
    from .cli_quantize import add_parser as add_quantize  # (quantcore/cli_quantize.py)
    add_quantize(sub, formatter(argparse.HelpFormatter))
    from .cli_onnx import add_parser as add_onnx  # (quantcore/cli_onnx.py)
    add_onnx(sub, formatter(argparse.HelpFormatter))
    from .cli_compare import add_parser as add_compare  # (quantcore/cli_compare.py)
    add_compare(sub, formatter(argparse.HelpFormatter))
    from .engines.cli import add_convert_parser  # (quantcore/engines/cli.py)
    add_convert_parser(sub, formatter(argparse.HelpFormatter))
    return parser


def main(argv=None):
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # option errors: one line, status 2
    except SystemExit as exc:  # --help (0) or a bad option (2): returned, not raised
        return exc.code
    if getattr(args, "run", None) is None:  # no command: the usage, status 2
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except (CliError, ValueError, TypeError, OSError) as exc:
        print(f"quantcore: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:   # an optional dependency: name the extra that installs it
        print(f"quantcore: error: {missing_extra(exc)}", file=sys.stderr)
        return 2
    except MemoryError as exc:   # a tensor or batch larger than this machine's memory
        detail = f" ({one_line(exc)})" if str(exc) else ""
        print(f"quantcore: error: out of memory{detail}: a tensor or batch is larger than "
              "the memory available", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quantcore: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback
        if os.environ.get("QUANTCORE_DEBUG"):
            raise
        print(f"quantcore: internal error: {type(exc).__name__}: {one_line(exc)} "
              "(QUANTCORE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
