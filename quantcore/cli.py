"""The ``quantcore`` command line: calibrate tensors in files, apply saved
qparams, run the demo.

    quantcore calibrate weights.safetensors acts.npz -o qparams.json
    quantcore calibrate w.npy --method entropy --bits 4 --plot hist.png
    quantcore fake-quant w.npy --qparams qparams.json -o w_fq.npy
    quantcore demo

Errors (a bad file, a missing tensor, a bad option) print one line on
stderr and exit with status 2; no traceback.
"""
import argparse
import json
import os
import sys

import numpy as np

from . import qparams as Q

METHODS = ("minmax", "moving_average", "percentile", "entropy", "mse")
HIST_METHODS = ("percentile", "entropy", "mse")


class CliError(Exception):
    """A user error: reported as one line, exit status 2."""


# -------------------------------------------------------------------- files
def load_tensors(path):
    """{name: float array} from a .npy, .npz or .safetensors file."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    base = os.path.splitext(os.path.basename(path))[0]
    try:
        if path.endswith(".npy"):
            tensors = {base: np.load(path, allow_pickle=False)}
        elif path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as npz:
                tensors = {k: npz[k] for k in npz.files}
        elif path.endswith(".safetensors"):
            try:
                from safetensors.numpy import load_file
            except ImportError:
                raise CliError("reading .safetensors needs the safetensors package "
                               "(pip install 'quantcore[cli]')") from None
            tensors = load_file(path)
        else:
            raise CliError(f"{path}: unknown file type (expected .npy, .npz or .safetensors)")
    except CliError:
        raise
    except Exception as exc:  # any reader error becomes one clear line
        raise CliError(f"{path}: cannot read: {exc}") from exc
    out = {}
    for name, arr in tensors.items():
        if arr.dtype.kind != "f":
            continue  # integer / bool tensors are not quantized
        out[name] = arr
    if not out:
        raise CliError(f"{path}: no floating-point tensors")
    return out


def save_tensors(tensors, path):
    if path.endswith(".npy"):
        if len(tensors) != 1:
            raise CliError(f"{path}: .npy holds one tensor, got {len(tensors)}; use .npz")
        np.save(path, next(iter(tensors.values())))
    elif path.endswith(".npz"):
        np.savez(path, **tensors)
    elif path.endswith(".safetensors"):
        try:
            from safetensors.numpy import save_file
        except ImportError:
            raise CliError("writing .safetensors needs the safetensors package") from None
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path)
    else:
        raise CliError(f"{path}: unknown output type (expected .npy, .npz or .safetensors)")


# ------------------------------------------------------------- calibration
def quant_range(bits, signed):
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)


#: moving_average splits a tensor into at most this many batches
MAX_BATCHES = 16


def method_range(x, method, bits, unsigned_hist, axis=None, averaging_constant=0.01):
    """(min, max) statistics of ``x`` for one calibration method.

    moving_average feeds the tensor to a MovingAverageMinMaxObserver in up
    to 16 batches along axis 0 (along the last axis when axis 0 holds the
    channels).
    """
    import quantcore as qc
    if method == "minmax":
        return qc.minmax(x, axis=axis, nan_policy="omit")
    if method == "moving_average":
        obs = qc.MovingAverageMinMaxObserver(averaging_constant, axis=axis)
        batch_axis = 0 if (axis != 0 or x.ndim < 2) else x.ndim - 1
        n = x.shape[batch_axis] if x.ndim else 1
        for batch in np.array_split(x.reshape(x.shape or (1,)), min(MAX_BATCHES, max(n, 1)),
                                    axis=batch_axis):
            obs(batch)
        return obs.min_val, obs.max_val
    from .calib import HistogramCalibrator
    cal = HistogramCalibrator(bits, None, unsigned_hist)
    data = x[np.isfinite(x)]
    cal.collect(data)
    kwargs = {"percentile": 99.99} if method == "percentile" else {}
    amax = np.float32(cal.compute_amax(method, **kwargs))
    lo = -amax if (data < 0).any() else np.float32(0)
    return np.asarray(lo, np.float32), np.asarray(amax, np.float32)


def choose_qparams(lo, hi, qmin, qmax, symmetric):
    fn = Q.symmetric_qparams if symmetric else Q.affine_qparams
    return fn(lo, hi, qmin, qmax)


def sqnr_db(x, y):
    """10 log10(sum x^2 / sum (x - y)^2) in float64, finite values only."""
    ok = np.isfinite(x)
    x64, y64 = x[ok].astype(np.float64), y[ok].astype(np.float64)
    noise = float(np.sum((x64 - y64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(x64 ** 2)) / noise)


def calibrate(args):
    import quantcore as qc
    qmin, qmax = quant_range(args.bits, args.signed)
    files = list(args.files)
    results, rows, plots = {}, [], []
    work = [(path, name, arr) for path in files for name, arr in load_tensors(path).items()]
    if args.tensors:
        wanted = set(args.tensors)
        missing = wanted - {name for _, name, _ in work}
        if missing:
            raise CliError(f"tensor(s) not found: {', '.join(sorted(missing))}")
        work = [w for w in work if w[1] in wanted]
    progress = _progress(work, "calibrating", args.quiet)
    for path, name, arr in progress:
        x = np.asarray(arr, dtype=np.float32)
        if x.size == 0:
            raise CliError(f"{name}: empty tensor")
        axis = None
        if args.per_channel:
            if x.ndim == 0:
                raise CliError(f"{name}: a scalar cannot be quantized per channel")
            axis = args.axis % x.ndim if -x.ndim <= args.axis < x.ndim else None
            if axis is None:
                raise CliError(f"{name}: --axis {args.axis} is out of range for shape {x.shape}")
            if args.method in HIST_METHODS:
                raise CliError(f"--method {args.method} is per tensor only; use minmax or "
                               "moving_average with --per-channel")
        lo, hi = method_range(x, args.method, args.bits, not args.signed, axis,
                              args.averaging_constant)
        scale, zp = choose_qparams(lo, hi, qmin, qmax, args.symmetric)
        y = qc.fake_quant(x, scale if axis is not None else scale[0],
                          zp if axis is not None else zp[0], qmin, qmax, axis=axis,
                          rounding=args.rounding)
        key = name if len(files) == 1 else f"{os.path.basename(path)}:{name}"
        finite = x[np.isfinite(x)]
        err = float(np.max(np.abs(finite - y[np.isfinite(x)]))) if finite.size else float("nan")
        results[key] = {"scale": scale.tolist(), "zero_point": zp.tolist(),
                        "quant_min": qmin, "quant_max": qmax, "axis": axis,
                        "rounding": args.rounding, "method": args.method,
                        "symmetric": args.symmetric, "shape": list(x.shape)}
        rows.append((key, x.shape, float(finite.min()) if finite.size else float("nan"),
                     float(finite.max()) if finite.size else float("nan"), scale, zp,
                     sqnr_db(x, y), err))
        if args.plot:
            plots.append((key, x, {m: method_range(x, m, args.bits, not args.signed)
                                   for m in METHODS if x.size > 1}))
    _print_table(rows, qmin, qmax, args)
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(results, fh, indent=1)
        print(f"qparams written to {args.output}")
    if args.plot:
        _plot(plots, args.plot)
    return 0


def _progress(items, desc, quiet):
    if quiet or len(items) < 8:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="tensor", file=sys.stderr)


def _fmt(values, spec):
    values = np.asarray(values).reshape(-1)
    if values.size == 1:
        return format(values[0].item(), spec)
    return f"{format(values.min().item(), spec)}..{format(values.max().item(), spec)}"


def _print_table(rows, qmin, qmax, args):
    print(f"method {args.method}, {args.bits} bits [{qmin}, {qmax}], "
          f"{'symmetric' if args.symmetric else 'affine'}, "
          f"{'per channel axis ' + str(args.axis) if args.per_channel else 'per tensor'}, "
          f"rounding {args.rounding}")
    header = (f"{'tensor':<28}{'shape':<18}{'range':<24}{'scale':<26}{'zero point':<12}"
              f"{'SQNR dB':>9}{'max |err|':>12}")
    print(header)
    print("-" * len(header))
    for key, shape, lo, hi, scale, zp, sqnr, err in rows:
        print(f"{key[:27]:<28}{str(tuple(shape))[:17]:<18}{f'[{lo:.4g}, {hi:.4g}]':<24}"
              f"{_fmt(scale, '.6g'):<26}{_fmt(zp, 'd'):<12}{sqnr:>9.2f}{err:>12.4g}")


def _plot(plots, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib (pip install matplotlib)") from None
    n = len(plots)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.8 * n), squeeze=False)
    colors = dict(zip(METHODS, ["C1", "C2", "C3", "C4", "C5"]))
    for ax, (key, x, ranges) in zip(axes[:, 0], plots):
        finite = x[np.isfinite(x)].ravel()
        ax.hist(finite, bins=200, color="0.6", log=True)
        for method, (lo, hi) in ranges.items():
            for v in (float(np.min(lo)), float(np.max(hi))):
                ax.axvline(v, color=colors[method], lw=1, label=method if v == float(np.max(hi))
                           else None)
        ax.set_title(f"{key}: values and each method's clipping range")
        ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot written to {path}")


# --------------------------------------------------------------- fake quant
def fake_quant_files(args):
    import quantcore as qc
    try:
        with open(args.qparams) as fh:
            saved = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"{args.qparams}: cannot read qparams: {exc}") from None
    tensors = load_tensors(args.file)
    out = {}
    for name, arr in tensors.items():
        entry = saved.get(name) or saved.get(f"{os.path.basename(args.file)}:{name}")
        if entry is None:
            if args.strict:
                raise CliError(f"{args.qparams}: no qparams for tensor {name!r}")
            out[name] = arr
            continue
        try:
            axis = entry.get("axis")
            scale, zp = np.asarray(entry["scale"]), np.asarray(entry["zero_point"])
            out[name] = qc.fake_quant(arr, scale if axis is not None else scale[0],
                                      zp if axis is not None else zp[0], entry["quant_min"],
                                      entry["quant_max"], axis=axis,
                                      rounding=entry.get("rounding", "half_even"))
        except (KeyError, TypeError, ValueError) as exc:
            raise CliError(f"{name}: bad qparams entry: {exc}") from None
    save_tensors(out, args.output)
    print(f"wrote {len(out)} tensor(s) to {args.output}")
    return 0


# ------------------------------------------------------------------ parser
def build_parser():
    parser = argparse.ArgumentParser(
        prog="quantcore",
        description="Framework-free quantization observers and fake quantization "
                    "(bit-exact with PyTorch, MindSpore, OneFlow, NVIDIA, Horizon, TensorFlow).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    cal = sub.add_parser("calibrate", help="compute qparams for the tensors in .npy / .npz / "
                                           ".safetensors files",
                         description="Calibrate every floating-point tensor in the files and "
                                     "print range, scale, zero point, SQNR and max error after "
                                     "fake quantization.")
    cal.add_argument("files", nargs="+", metavar="FILE")
    cal.add_argument("--method", choices=METHODS, default="minmax",
                     help="statistic: minmax (default), moving_average (batches along axis 0), "
                          "percentile (99.99), entropy or mse (NVIDIA histogram calibrator)")
    cal.add_argument("--averaging-constant", type=float, default=0.01,
                     help="moving_average: weight of a new batch (default 0.01, as torch)")
    cal.add_argument("--bits", type=int, default=8, help="integer bits, 2..16 (default 8)")
    sign = cal.add_mutually_exclusive_group()
    sign.add_argument("--signed", dest="signed", action="store_true", default=True,
                      help="signed integer range (default)")
    sign.add_argument("--unsigned", dest="signed", action="store_false",
                      help="unsigned integer range [0, 2**bits - 1]")
    sch = cal.add_mutually_exclusive_group()
    sch.add_argument("--symmetric", dest="symmetric", action="store_true", default=False)
    sch.add_argument("--affine", dest="symmetric", action="store_false",
                     help="affine scheme (default)")
    cal.add_argument("--per-channel", action="store_true", help="one scale per channel")
    cal.add_argument("--axis", type=int, default=0, help="channel axis (default 0)")
    cal.add_argument("--rounding", choices=("half_even", "half_up", "half_away"),
                     default="half_even")
    cal.add_argument("--tensors", nargs="+", metavar="NAME", help="only these tensors")
    cal.add_argument("-o", "--output", metavar="JSON", help="write qparams to this JSON file")
    cal.add_argument("--plot", metavar="PNG", help="histograms with each method's clipping range")
    cal.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    fq = sub.add_parser("fake-quant", help="apply saved qparams to the tensors of a file")
    fq.add_argument("file", metavar="FILE")
    fq.add_argument("--qparams", required=True, metavar="JSON", help="from 'calibrate -o'")
    fq.add_argument("-o", "--output", required=True, metavar="OUT",
                    help=".npy, .npz or .safetensors")
    fq.add_argument("--strict", action="store_true",
                    help="fail when a tensor has no qparams (default: copy it unchanged)")

    demo = sub.add_parser("demo", help="train, post-training quantize and QAT a NumPy MLP "
                                       "on scikit-learn's digits (the main job)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--plot", default="quantcore_demo.png",
                      help="where to save the training curves ('' for none)")
    sub.add_parser("info", help="print how the extension was built")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "calibrate":
            if not 2 <= args.bits <= 16:
                raise CliError(f"--bits must be in 2..16, got {args.bits}")
            return calibrate(args)
        if args.command == "fake-quant":
            return fake_quant_files(args)
        if args.command == "demo":
            from .demo import run_demo
            run_demo(seed=args.seed, plot_path=args.plot)
            return 0
        if args.command == "info":
            import quantcore
            for key, value in quantcore.build_info().items():
                print(f"{key:20s} {value}")
            return 0
        parser.print_help()
        return 0
    except CliError as exc:
        print(f"quantcore: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        print(f"quantcore: error: {exc}", file=sys.stderr)
        return 2
