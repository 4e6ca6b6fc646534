"""The ``quantcore`` command line: calibrate tensors in files, apply saved
qparams, run the demo.

    quantcore calibrate weights.safetensors acts.npz -o qparams.json
    quantcore calibrate w.npy --method entropy --bits 4 --plot hist.png
    quantcore fake-quant w.npy --qparams qparams.json -o w_fq.npy
    quantcore demo

Errors (a bad file, a missing tensor, a bad option, an unwritable output)
print one line on stderr and exit with status 2; an unexpected internal
error prints one line and exits with status 1 (``QUANTCORE_DEBUG=1`` shows
its traceback).  Never a traceback otherwise.
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np

from . import qparams as Q

METHODS = ("minmax", "moving_average", "percentile", "entropy", "mse")
HIST_METHODS = ("percentile", "entropy", "mse")
ROUNDING = ("half_even", "half_up", "half_away")

#: moving_average splits a tensor into at most this many batches
MAX_BATCHES = 16
#: the progress bar appears when a run lasts longer than this (seconds)
PROGRESS_DELAY = 1.0
#: --plot draws at most this many tensors
MAX_PLOTS = 16


class CliError(Exception):
    """A user error: reported as one line, exit status 2."""


def _one_line(text):
    return " ".join(str(text).split())


# -------------------------------------------------------------------- files
def load_tensors(path, floats_only=True):
    """{name: array} from a .npy, .npz or .safetensors file.  With
    ``floats_only`` integer and bool tensors are left out (they are not
    quantized); a file without any floating-point tensor is an error."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory, expected a .npy, .npz or .safetensors file")
    base = os.path.splitext(os.path.basename(path))[0]
    try:
        if path.endswith(".npy"):
            tensors = {base: np.load(path, allow_pickle=False)}
        elif path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as npz:
                if not hasattr(npz, "files"):
                    raise CliError(f"{path}: not an .npz archive")
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
        raise CliError(f"{path}: cannot read: {_one_line(exc)}") from exc
    floats = {name: arr for name, arr in tensors.items() if arr.dtype.kind == "f"}
    if not floats:
        kinds = sorted({str(arr.dtype) for arr in tensors.values()})
        raise CliError(f"{path}: no floating-point tensors (found {', '.join(kinds) or 'none'})")
    return floats if floats_only else tensors


def save_tensors(tensors, path):
    if path.endswith(".npy"):
        if len(tensors) != 1:
            raise CliError(f"{path}: .npy holds one tensor, got {len(tensors)}; use .npz")
        writer = lambda: np.save(path, next(iter(tensors.values())))  # noqa: E731
    elif path.endswith(".npz"):
        writer = lambda: np.savez(path, **tensors)  # noqa: E731
    elif path.endswith(".safetensors"):
        try:
            from safetensors.numpy import save_file
        except ImportError:
            raise CliError("writing .safetensors needs the safetensors package") from None
        writer = lambda: save_file({k: np.ascontiguousarray(v)  # noqa: E731
                                    for k, v in tensors.items()}, path)
    else:
        raise CliError(f"{path}: unknown output type (expected .npy, .npz or .safetensors)")
    _write(path, writer)


def _write(path, writer):
    try:
        writer()
    except OSError as exc:
        raise CliError(f"{path}: cannot write: {exc.strerror or _one_line(exc)}") from None


def _check_writable(path, option):
    """Fail before a long run when an output cannot be created."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{option} {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise CliError(f"{option} {path}: is a directory")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{option} {path}: folder {folder} is not writable")


# ------------------------------------------------------------- calibration
def quant_range(bits, signed):
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)


def _n_batches(shape, axis):
    """How many batches ``_batches`` makes of an array of this shape."""
    shape = shape or (1,)
    batch_axis = 0 if (axis != 0 or len(shape) < 2) else len(shape) - 1
    return min(MAX_BATCHES, max(shape[batch_axis], 1))


def _batches(x, axis):
    """The moving_average batches of ``x``: up to MAX_BATCHES slices along
    axis 0 (along the last axis when axis 0 holds the channels)."""
    x = x.reshape(x.shape or (1,))
    batch_axis = 0 if (axis != 0 or x.ndim < 2) else x.ndim - 1
    return np.array_split(x, _n_batches(x.shape, axis), axis=batch_axis)


def method_range(x, method, bits, unsigned_hist, axis=None, averaging_constant=0.01,
                 on_batch=None):
    """(min, max) statistics of ``x`` for one calibration method.

    NaN values are ignored: minmax omits them, moving_average skips the
    batches that hold one (the observer's ``nan_policy="skip"``), the
    histogram methods (percentile, entropy, mse: NVIDIA's histogram
    calibrator, per tensor) see only the finite values.  ``on_batch`` is
    called after each batch (the progress bar).
    """
    import quantcore as qc
    if method == "minmax":
        lo, hi = qc.minmax(x, axis=axis, nan_policy="omit")
    elif method == "moving_average":
        obs = qc.MovingAverageMinMaxObserver(averaging_constant, axis=axis)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # skipped NaN batches: counted
            for batch in _batches(x, axis):
                obs(batch)
                if on_batch:
                    on_batch()
        if not obs.num_batches:
            raise CliError(f"every moving_average batch holds a NaN ({obs.nonfinite_batches} "
                           "batches skipped)")
        lo, hi = obs.min_val, obs.max_val
    else:
        from .calib import HistogramCalibrator
        data = x[np.isfinite(x)]
        cal = HistogramCalibrator(bits, None, unsigned_hist)
        cal.collect(data)
        kwargs = {"percentile": 99.99} if method == "percentile" else {}
        amax = np.float32(cal.compute_amax(method, **kwargs))
        lo = -amax if (data < 0).any() else np.float32(0)
        lo, hi = np.asarray(lo, np.float32), np.asarray(amax, np.float32)
    if on_batch and method != "moving_average":
        on_batch()
    return lo, hi


def choose_qparams(lo, hi, qmin, qmax, symmetric):
    fn = Q.symmetric_qparams if symmetric else Q.affine_qparams
    return fn(lo, hi, qmin, qmax)


def clipping_range(scale, zero_point, qmin, qmax):
    """The float range [(qmin - zp) * scale, (qmax - zp) * scale] per channel."""
    s = np.asarray(scale, np.float64)
    z = np.asarray(zero_point, np.float64)
    return (qmin - z) * s, (qmax - z) * s


def sqnr_db(x, y):
    """10 log10(sum x^2 / sum (x - y)^2) in float64, finite values only."""
    ok = np.isfinite(x)
    x64, y64 = x[ok].astype(np.float64), y[ok].astype(np.float64)
    noise = float(np.sum((x64 - y64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(x64 ** 2)) / noise)


def _check_finite(key, x, method):
    """Clear errors for tensors whose statistics cannot be finite."""
    finite = np.isfinite(x)
    if not finite.any():
        raise CliError(f"{key}: no finite values to calibrate")
    if method in ("minmax", "moving_average") and np.isinf(x).any():
        raise CliError(f"{key}: holds +-inf, so its {method} range is infinite; use "
                       "--method percentile, entropy or mse (they use the finite values only)")
    return int(np.isnan(x).sum())


def _resolve_axis(key, x, args):
    if not args.per_channel:
        return None
    if x.ndim == 0:
        raise CliError(f"{key}: a scalar cannot be quantized per channel")
    if not -x.ndim <= args.axis < x.ndim:
        raise CliError(f"{key}: --axis {args.axis} is out of range for shape {x.shape}")
    return args.axis % x.ndim


def calibrate(args):
    import quantcore as qc
    qmin, qmax = quant_range(args.bits, args.signed)
    if args.per_channel and args.method in HIST_METHODS:
        raise CliError(f"--method {args.method} is per tensor only; use minmax or "
                       "moving_average with --per-channel")
    for path, option in ((args.output, "-o"), (args.plot, "--plot")):
        if path:
            _check_writable(path, option)
    files = list(args.files)
    work, seen = [], {}
    for path in files:
        for name, arr in load_tensors(path).items():
            key = name if len(files) == 1 else f"{os.path.basename(path)}:{name}"
            if key in seen:
                raise CliError(f"tensor {key!r} is in both {seen[key]} and {path}; rename a file")
            seen[key] = path
            work.append((key, name, arr))
    if args.tensors:
        wanted = set(args.tensors)
        missing = wanted - {name for _, name, _ in work} - {key for key, _, _ in work}
        if missing:
            known = ", ".join(key for key, _, _ in work[:10])
            raise CliError(f"tensor(s) not found: {', '.join(sorted(missing))} (the files hold "
                           f"{known}{', ...' if len(work) > 10 else ''})")
        work = [w for w in work if w[0] in wanted or w[1] in wanted]

    results, rows, plots = {}, [], []
    steps = [(_n_batches(arr.shape, args.axis % arr.ndim if args.per_channel and arr.ndim
                         else None) if args.method == "moving_average" else 1) + 1
             for _, _, arr in work]
    with _progress(sum(steps), args) as bar:
        for key, _, arr in work:
            bar.set_postfix_str(key[-30:], refresh=False)
            if arr.size == 0:
                raise CliError(f"{key}: empty tensor (shape {arr.shape})")
            nans = _check_finite(key, arr, args.method)
            x = np.asarray(arr, dtype=np.float32)
            axis = _resolve_axis(key, x, args)
            try:
                lo, hi = method_range(x, args.method, args.bits, not args.signed, axis,
                                      args.averaging_constant, on_batch=lambda: bar.update(1))
            except CliError as exc:
                raise CliError(f"{key}: {exc}") from None
            scale, zp = choose_qparams(lo, hi, qmin, qmax, args.symmetric)
            per_tensor = axis is None
            # the error is measured as `fake-quant` will apply it: on the stored dtype
            y = qc.fake_quant(arr, scale[0] if per_tensor else scale,
                              zp[0] if per_tensor else zp, qmin, qmax, axis=axis,
                              rounding=args.rounding)
            bar.update(1)
            finite = np.isfinite(arr)
            err = float(np.max(np.abs(arr[finite].astype(np.float64) - y[finite])))
            results[key] = {"scale": scale.tolist(), "zero_point": zp.tolist(),
                            "quant_min": qmin, "quant_max": qmax, "axis": axis,
                            "rounding": args.rounding, "method": args.method,
                            "symmetric": args.symmetric, "shape": list(arr.shape)}
            rows.append((key, arr.shape, float(x[np.isfinite(x)].min()),
                         float(x[np.isfinite(x)].max()), scale, zp, sqnr_db(arr, y), err, nans))
            if args.plot and len(plots) < MAX_PLOTS:
                plots.append((key, x, _clipping_ranges(key, x, qmin, qmax, args)))
    _print_table(rows, qmin, qmax, args)
    if args.output:
        def dump():
            with open(args.output, "w") as fh:
                json.dump(results, fh, indent=1)
        _write(args.output, dump)
        print(f"qparams written to {args.output}")
    if args.plot:
        _plot(plots, args.plot, len(work), args)
    return 0


def _clipping_ranges(key, x, qmin, qmax, args):
    """{method: (lo, hi)} per-tensor clipping range of every method that can
    calibrate ``x`` (with this run's bits, sign and scheme)."""
    ranges = {}
    for method in METHODS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lo, hi = method_range(x, method, args.bits, not args.signed,
                                      averaging_constant=args.averaging_constant)
        except (CliError, ValueError):
            continue  # e.g. +-inf for minmax: that method has no finite range
        scale, zp = choose_qparams(lo, hi, qmin, qmax, args.symmetric)
        c_lo, c_hi = clipping_range(scale, zp, qmin, qmax)
        ranges[method] = (float(c_lo[0]), float(c_hi[0]))
    return ranges


class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s, refresh=True):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _progress(total, args):
    """A tqdm bar over the run's batches (each tensor's statistic batches
    plus its fake-quant pass), on stderr.  It appears only once the run has
    lasted PROGRESS_DELAY seconds (``--progress``: at once; ``-q``: never)."""
    if args.quiet:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="calibrating", unit="batch", file=sys.stderr,
                delay=0 if args.progress else PROGRESS_DELAY, leave=bool(args.progress))


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
    notes = []
    for key, shape, lo, hi, scale, zp, sqnr, err, nans in rows:
        print(f"{key[:27]:<28}{str(tuple(shape))[:17]:<18}{f'[{lo:.4g}, {hi:.4g}]':<24}"
              f"{_fmt(scale, '.6g'):<26}{_fmt(zp, 'd'):<12}{sqnr:>9.2f}{err:>12.4g}")
        if nans:
            notes.append(f"{key}: {nans} NaN value(s) ignored")
    for note in notes:
        print(f"note: {note}")


def _plot(plots, path, n_tensors, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CliError("--plot needs matplotlib (pip install matplotlib)") from None
    n = len(plots)
    fig, axes = plt.subplots(n, 1, figsize=(8, 2.8 * n), squeeze=False)
    colors = dict(zip(METHODS, ["C1", "C2", "C3", "C4", "C5"]))
    styles = dict(zip(METHODS, ["-", "--", "-.", ":", (0, (5, 1))]))
    for ax, (key, x, ranges) in zip(axes[:, 0], plots):
        finite = x[np.isfinite(x)].ravel()
        ax.hist(finite, bins=200, color="0.6", log=True)
        for method, (lo, hi) in ranges.items():
            for k, v in enumerate((lo, hi)):
                ax.axvline(v, color=colors[method], ls=styles[method], lw=1.2,
                           label=f"{method} [{lo:.3g}, {hi:.3g}]" if k else None)
        ax.set_title(f"{key}: values and each method's clipping range "
                     f"({args.bits}-bit {'symmetric' if args.symmetric else 'affine'})",
                     fontsize=9)
        ax.legend(fontsize=7, ncol=3)
    if n < n_tensors:
        fig.suptitle(f"first {n} of {n_tensors} tensors", fontsize=9)
    fig.tight_layout()
    _write(path, lambda: fig.savefig(path, dpi=90))
    plt.close(fig)
    print(f"plot written to {path}")


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
        raise CliError(f"{args.qparams}: cannot read qparams: {_one_line(exc)}") from None
    if not isinstance(saved, dict):
        raise CliError(f"{args.qparams}: expected an object of tensor name -> qparams (as "
                       f"written by 'quantcore calibrate -o'), got {type(saved).__name__}")
    _check_writable(args.output, "-o")
    if not args.output.endswith((".npy", ".npz", ".safetensors")):
        raise CliError(f"{args.output}: unknown output type (expected .npy, .npz or "
                       ".safetensors)")
    tensors = load_tensors(args.file, floats_only=False)
    out, applied = {}, 0
    for name, arr in tensors.items():
        key = f"{os.path.basename(args.file)}:{name}"
        entry = saved[name] if name in saved else saved.get(key)
        if arr.dtype.kind != "f":  # integer / bool tensors are kept as they are
            if entry is not None:
                raise CliError(f"{name}: has qparams but dtype {arr.dtype}; only floating-point "
                               "tensors are fake-quantized")
            out[name] = arr
            continue
        if entry is None:
            if args.strict:
                raise CliError(f"{args.qparams}: no qparams for tensor {name!r}")
            out[name] = arr
            continue
        scale, zp, qmin, qmax, axis, rounding = _entry_params(name, entry, arr)
        try:
            out[name] = qc.fake_quant(arr, scale, zp, qmin, qmax, axis=axis, rounding=rounding)
        except (TypeError, ValueError) as exc:
            raise CliError(f"{name}: bad qparams entry: {_one_line(exc)}") from None
        applied += 1
    if not applied:
        raise CliError(f"{args.qparams}: holds qparams for none of the floating-point tensors "
                       f"of {args.file} ({', '.join(list(tensors)[:10])})")
    save_tensors(out, args.output)
    print(f"wrote {len(out)} tensor(s) to {args.output} ({applied} fake-quantized, "
          f"{len(out) - applied} copied)")
    return 0


# ------------------------------------------------------------------ parser
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')\n")


def _method(value):
    name = value.replace("-", "_")
    if name not in METHODS:
        raise argparse.ArgumentTypeError(f"invalid choice {value!r} (choose from "
                                         f"{', '.join(METHODS)})")
    return name


def _int_in(lo, hi):
    def parse(value):
        try:
            v = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {v}")
        return v
    return parse


def _fraction(value):
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return v


EXAMPLES = """examples:
  quantcore calibrate model.safetensors -o qparams.json
  quantcore calibrate w.npy --method entropy --bits 4 --symmetric --plot w.png
  quantcore calibrate conv.npz --per-channel --axis 0 --unsigned
  quantcore fake-quant model.safetensors --qparams qparams.json -o model_fq.safetensors
  quantcore demo

Errors are one line on stderr, exit status 2."""


def _formatter(base):
    """``base`` with room for the command names in the help's first column
    (argparse under-counts the indented sub-command names)."""
    class Formatter(base):
        def __init__(self, prog):
            super().__init__(prog, max_help_position=26, width=92)
            self._action_max_length = 14
    return Formatter


def build_parser():
    parser = _Parser(
        prog="quantcore",
        description="Framework-free quantization observers and fake quantization,\n"
                    "bit-exact with PyTorch, MindSpore, OneFlow, NVIDIA, Horizon and "
                    "TensorFlow.",
        epilog=EXAMPLES, formatter_class=_formatter(argparse.RawDescriptionHelpFormatter))
    sub = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND",
                                help="quantcore COMMAND --help for its options")

    cal = sub.add_parser(
        "calibrate", help="compute qparams for the tensors of .npy / .npz / .safetensors files",
        description="Calibrate every floating-point tensor of the files: print its shape, "
                    "range, scale, zero point, and the SQNR and max abs error after fake "
                    "quantization; optionally write the qparams as JSON (for 'quantcore "
                    "fake-quant') and plot each tensor's histogram with every method's "
                    "clipping range.  NaN values are ignored (and counted).",
        formatter_class=_formatter(argparse.HelpFormatter))
    cal.add_argument("files", nargs="+", metavar="FILE", help=".npy, .npz or .safetensors")
    opts = cal.add_argument_group("statistic")
    opts.add_argument("--method", type=_method, default="minmax", metavar="METHOD",
                      help="minmax; moving_average (MovingAverageMinMaxObserver over up to "
                           f"{MAX_BATCHES} batches along axis 0); percentile (99.99), entropy "
                           "or mse (NVIDIA histogram calibrator, per tensor only); default minmax")
    opts.add_argument("--averaging-constant", type=_fraction, default=0.01, metavar="C",
                      help="moving_average: weight of a new batch, in (0, 1] (default 0.01)")
    qopts = cal.add_argument_group("quantization")
    qopts.add_argument("--bits", type=_int_in(2, 16), default=8, help="integer bits, 2..16 (default 8)")
    sign = qopts.add_mutually_exclusive_group()
    sign.add_argument("--signed", dest="signed", action="store_true", default=True,
                      help="signed range [-2**(bits-1), 2**(bits-1) - 1] (default)")
    sign.add_argument("--unsigned", dest="signed", action="store_false",
                      help="unsigned range [0, 2**bits - 1]")
    sch = qopts.add_mutually_exclusive_group()
    sch.add_argument("--symmetric", dest="symmetric", action="store_true", default=False,
                     help="symmetric scheme (fixed zero point)")
    sch.add_argument("--affine", dest="symmetric", action="store_false",
                     help="affine scheme, zero point from the range (default)")
    qopts.add_argument("--per-channel", action="store_true",
                       help="one scale / zero point per channel (minmax, moving_average)")
    qopts.add_argument("--axis", type=int, default=0, help="channel axis with --per-channel (default 0)")
    qopts.add_argument("--rounding", choices=ROUNDING, default="half_even",
                       help="rounding of the fake quantization (default half_even)")
    out = cal.add_argument_group("input and output")
    out.add_argument("--tensors", nargs="+", metavar="NAME",
                     help="only these tensors (name, or FILE:name with several files)")
    out.add_argument("-o", "--output", metavar="JSON", help="write the qparams to this file")
    out.add_argument("--plot", metavar="PNG",
                     help="histograms with each method's clipping range (needs matplotlib)")
    bar = out.add_mutually_exclusive_group()
    bar.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    bar.add_argument("--progress", action="store_true",
                     help=f"show the progress bar at once (default: after {PROGRESS_DELAY:g} s)")

    fq = sub.add_parser("fake-quant", help="apply saved qparams to the tensors of a file",
                        description="Fake-quantize the tensors of FILE with the qparams "
                                    "written by 'quantcore calibrate -o' and save them to OUT "
                                    "(tensors without qparams are copied unchanged).")
    fq.add_argument("file", metavar="FILE", help=".npy, .npz or .safetensors")
    fq.add_argument("--qparams", required=True, metavar="JSON", help="from 'calibrate -o'")
    fq.add_argument("-o", "--output", required=True, metavar="OUT",
                    help=".npy, .npz or .safetensors")
    fq.add_argument("--strict", action="store_true",
                    help="fail when a tensor has no qparams (default: copy it unchanged)")

    demo = sub.add_parser("demo", help="train, post-training quantize and QAT a NumPy MLP "
                                       "on scikit-learn's digits, and quantize a conv net as "
                                       "ONNX next to ONNX Runtime's calibrators (the main job)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--plot", default="quantcore_demo.png",
                      help="where to save the training curves ('' for none)")
    sub.add_parser("info", help="print how the extension was built")
    from .cli_onnx import add_parser as add_onnx_parser
    add_onnx_parser(sub)
    return parser


def _run(args, parser):
    if args.command == "calibrate":
        return calibrate(args)
    if args.command == "fake-quant":
        return fake_quant_files(args)
    if args.command == "demo":
        if args.plot:
            _check_writable(args.plot, "--plot")
        from .demo import run_demo
        run_demo(seed=args.seed, plot_path=args.plot)
        return 0
    if args.command == "onnx":
        from .cli_onnx import run as run_onnx

        def error(message):
            raise CliError(message)
        return run_onnx(args, error)
    if args.command == "info":
        import quantcore
        for key, value in quantcore.build_info().items():
            print(f"{key:20s} {value}")
        return 0
    parser.print_help()
    return 0


def main(argv=None):
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # option errors: one line, status 2
    except SystemExit as exc:  # --help (0) or a bad option (2): returned, not raised
        return exc.code
    try:
        return _run(args, parser)
    except CliError as exc:
        print(f"quantcore: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as exc:
        print(f"quantcore: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quantcore: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback
        if os.environ.get("QUANTCORE_DEBUG"):
            raise
        print(f"quantcore: internal error: {type(exc).__name__}: {_one_line(exc)} "
              "(QUANTCORE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
