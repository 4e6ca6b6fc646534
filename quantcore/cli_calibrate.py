"""``quantcore calibrate``: the qparams of the tensors of files, by a
method (min/max, moving average, the histogram methods), with a table of
each tensor's range, qparams and error, optionally written as JSON and
plotted (cli_plot.py).  The statistics helpers (:func:`method_range`,
:func:`error_stats`, :func:`sqnr_db`) are public through
:mod:`quantcore.cli`.
"""
import argparse
import json
import math
import os
import sys
import warnings

import numpy as np

from . import ops
from . import qparams as Q
from .cli_common import (add_quiet, add_tensors, formatter, int_in, list_checked,
                         match_tensors, print_notes, print_table, real_in, say, short_list)
from ._files import atomic_write
from .cli_files import CliError, check_writable, one_line, write_or_fail

METHODS = ("minmax", "moving_average", "percentile", "entropy", "mse")


HIST_METHODS = ("percentile", "entropy", "mse")


#: --rounding: every rounding mode of the library (qc_elementwise.h QC_ROUNDING_MODES)
ROUNDING = tuple(ops.ROUNDING)


#: moving_average splits a tensor into at most this many batches
MAX_BATCHES = 16


#: the progress bar (on a terminal) appears when a run lasts longer than this (seconds)
PROGRESS_DELAY = 1.0


#: defaults of the histogram methods
DEFAULT_BINS = 2048


DEFAULT_PERCENTILE = 99.99


#: entropy warns below this many values per histogram bin
MIN_VALUES_PER_BIN = 16


class Skip(Exception):
    """A tensor this run cannot calibrate: left out with a note.  Tensors
    with the same ``reason`` share one note, each with its ``detail``."""

    def __init__(self, reason, detail=""):
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason, self.detail = reason, detail


class Scheme:
    """The integer grid of a run: bits, range, symmetric or affine, rounding."""

    def __init__(self, bits, signed, symmetric, rounding="half_even"):
        self.bits, self.signed, self.symmetric, self.rounding = bits, signed, symmetric, rounding
        self.qmin, self.qmax = quant_range(bits, signed)

    def qparams(self, lo, hi):
        fn = Q.symmetric_qparams if self.symmetric else Q.affine_qparams
        return fn(lo, hi, self.qmin, self.qmax)

    def describe(self):
        return (f"{self.bits} bits [{self.qmin}, {self.qmax}], "
                f"{'symmetric' if self.symmetric else 'affine'}, rounding {self.rounding}")


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


class Histograms:
    """The histograms of one tensor, each collected once and shared by every
    method that reads it: NVIDIA's ``|x|`` histogram (percentile, entropy,
    mse) and a signed one over ``[-max|x|, max|x|]`` (affine percentile)."""

    def __init__(self, x, bins):
        self.finite = x[np.isfinite(x)].reshape(-1)
        self.bins = bins
        self._abs = {}
        self._signed = None

    def calibrator(self, bits, unsigned):
        """A HistogramCalibrator of ``|x|`` for these bits and sign."""
        from .calib import HistogramCalibrator
        key = (bits, unsigned)
        if key not in self._abs:
            cal = HistogramCalibrator(bits, None, unsigned, num_bins=self.bins)
            if self._abs:  # the same histogram: copy the collected state
                cal.load_state_dict(next(iter(self._abs.values())).state_dict())
            else:
                cal.collect(self.finite)
            self._abs[key] = cal
        return self._abs[key]

    def signed(self):
        """(counts, float32 edges) over [-t, t], t = max|x|, as onnxruntime's
        HistogramCollector bins a tensor in one collect call."""
        if self._signed is None:
            t = np.float32(np.max(np.abs(self.finite)))   # float32: float32 edges, as ORT
            self._signed = np.histogram(self.finite, self.bins, range=(-t, t))
        return self._signed


def two_sided_percentile(hist, edges, lo, hi, percentile):
    """onnxruntime's percentile range of a signed histogram (symmetric=False)::

        cdf = cumsum(hist / sum(hist));  c = (100 - percentile) / 200
        range = (edges[searchsorted(cdf, c)], edges[searchsorted(cdf, 1 - c)])

    each end clipped to the observed ``[lo, hi]``: ``(100 - percentile) / 2``
    percent of the values are cut from each tail.
    """
    cdf = np.cumsum(hist / hist.sum())
    cut = (100.0 - percentile) / 200.0
    left = edges[min(int(np.searchsorted(cdf, cut)), len(edges) - 1)]
    right = edges[min(int(np.searchsorted(cdf, 1.0 - cut)), len(edges) - 1)]
    return np.float32(max(left, lo)), np.float32(min(right, hi))


def method_range(x, method, scheme, *, axis=None, percentile=DEFAULT_PERCENTILE,
                 bins=DEFAULT_BINS, averaging_constant=0.01, histograms=None, on_batch=None):
    """(lo, hi) float32 arrays: the range one calibration method gives ``x``.

    Parameters
    ----------
    x : float32 ndarray with at least one finite value (NaN values are
        ignored, +-inf only by the histogram methods).
    method : one of :data:`METHODS`
        minmax: ``quantcore.minmax`` (NaN omitted).  moving_average:
        ``MovingAverageMinMaxObserver(averaging_constant)`` over up to
        MAX_BATCHES slices (batches holding NaN skipped).  percentile,
        entropy, mse: per tensor, on the finite values.  Symmetric:
        ``(-amax, amax)`` with NVIDIA's ``HistogramCalibrator`` amax of
        ``|x|`` (``bins`` bins; ``percentile``: the left edge of the bin
        where the cdf reaches it).  Affine: percentile cuts
        ``(100 - percentile) / 2`` percent from each tail of the signed
        histogram (:func:`two_sided_percentile`); entropy and mse search one
        amax, so they calibrate ``[0, amax]`` (NVIDIA's unsigned search) for
        a tensor without negative values and raise :class:`Skip` otherwise.
    scheme : :class:`Scheme` (bits and symmetric are read).
    axis : channel axis (minmax, moving_average) or None.
    histograms : :class:`Histograms` of ``x`` to share between calls.
    on_batch : called after each moving_average batch (the progress bar).
    """
    import quantcore as qc
    if method == "minmax":
        return qc.minmax(x, axis=axis, nan_policy="omit")
    if method == "moving_average":
        obs = qc.MovingAverageMinMaxObserver(averaging_constant, axis=axis)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # skipped NaN batches: counted
            for batch in _batches(x, axis):
                obs(batch)
                if on_batch:
                    on_batch()
        if not obs.num_batches:
            raise Skip(f"every moving_average batch holds a NaN ({obs.nonfinite_batches} "
                       "batches skipped)")
        return obs.min_val, obs.max_val
    if method not in HIST_METHODS:
        raise ValueError(f"unknown method {method!r}")
    if axis is not None:
        raise Skip(f"{method} is per tensor only")
    hists = histograms or Histograms(x, bins)
    data = hists.finite
    lo, hi = np.float32(data.min()), np.float32(data.max())
    if method == "percentile" and not scheme.symmetric:
        return two_sided_percentile(*hists.signed(), lo, hi, percentile)
    one_sided = not scheme.symmetric     # entropy / mse on [0, amax]
    if one_sided and lo < 0:
        raise Skip(f"negative values: {method} searches one amax on |x|, so with --affine it "
                   "calibrates [0, amax] (tensors without negative values); use --symmetric "
                   "(the default) or --method minmax / percentile for these",
                   f"min {float(lo):.4g}")
    cal = hists.calibrator(scheme.bits, one_sided)
    kwargs = {"percentile": percentile} if method == "percentile" else {}
    amax = np.float32(cal.compute_amax(method, **kwargs))
    return (np.float32(0) if one_sided else -amax), amax


def clipping_range(scale, zero_point, qmin, qmax):
    """The float range [(qmin - zp) * scale, (qmax - zp) * scale] per channel."""
    s = np.asarray(scale, np.float64)
    z = np.asarray(zero_point, np.float64)
    return (qmin - z) * s, (qmax - z) * s


def error_stats(x, y, chunk=1 << 20):
    """(SQNR in dB, max |x - y|) over the finite values of ``x``, in float64:
    ``10 log10(sum x^2 / sum (x - y)^2)``; computed in chunks, so a large
    tensor needs no float64 copy of itself."""
    xs, ys = np.reshape(x, -1), np.reshape(y, -1)
    signal = noise = worst = 0.0
    for k in range(0, xs.size, chunk):
        x64, y64 = xs[k:k + chunk].astype(np.float64), ys[k:k + chunk].astype(np.float64)
        ok = np.isfinite(x64)
        if not ok.all():
            x64, y64 = x64[ok], y64[ok]
        d = x64 - y64
        signal += float(np.sum(x64 ** 2))
        noise += float(np.sum(d ** 2))
        worst = max(worst, float(np.max(np.abs(d)))) if d.size else worst
    if noise == 0:
        return float("inf"), worst
    return (10 * math.log10(signal / noise) if signal else float("-inf")), worst


def sqnr_db(x, y):
    """The SQNR of :func:`error_stats`."""
    return error_stats(x, y)[0]


def quantize_with(arr, lo, hi, scheme, axis):
    """(scale, zero_point, fake-quantized arr) for the range (lo, hi); the
    fake quantization runs on the stored dtype, as ``fake-quant`` applies it."""
    import quantcore as qc
    scale, zp = scheme.qparams(lo, hi)
    per_tensor = axis is None
    y = qc.fake_quant(arr, scale[0] if per_tensor else scale, zp[0] if per_tensor else zp,
                      scheme.qmin, scheme.qmax, axis=axis, rounding=scheme.rounding)
    return scale, zp, y


class _Work:
    """One selected tensor of one file."""

    def __init__(self, key, entry):
        self.key, self.entry = key, entry


def _gather(files):
    """[_Work] of every tensor of the files (keys are FILE:name with several
    files)."""
    work, seen = [], {}
    for path in files:
        for entry in list_checked(path):
            key = entry.name if len(files) == 1 else f"{os.path.basename(path)}:{entry.name}"
            if key in seen:
                raise CliError(f"tensor {key!r} is in both {seen[key]} and {path}; rename a file")
            seen[key] = path
            work.append(_Work(key, entry))
    return work


def _select(work, patterns, weights_only, per_channel, per_channel_1d, notes):
    """The tensors this run calibrates; the others go to ``notes``."""
    if patterns:   # the name, or FILE:name with several files
        keys = set(match_tensors([w.key for w in work], patterns, [w.entry.name for w in work]))
        work = [w for w in work if w.key in keys]
    left = {"not floating point": [], "1-D or scalar (--weights-only)": [],
            "1-D or scalar (--per-channel)": []}  # reason: keys
    chosen = []
    for w in work:
        e = w.entry
        if not e.is_float and not e.problem:
            left["not floating point"].append(f"{w.key} ({e.dtype})")
        elif weights_only and e.ndim < 2:
            left["1-D or scalar (--weights-only)"].append(w.key)
        elif per_channel and e.ndim < 2 and not per_channel_1d:
            left["1-D or scalar (--per-channel)"].append(w.key)
        else:
            chosen.append(w)
    why = {"not floating point": "",
           "1-D or scalar (--weights-only)": " (biases, norm weights, scalars)",
           "1-D or scalar (--per-channel)": " (biases, norm weights: per channel they would get "
                                            "one scale per value; --per-channel-1d includes them)"}
    for reason, keys in left.items():
        if keys:
            notes.append(f"left out {len(keys)} tensor(s), {reason}{why[reason]}: "
                         f"{short_list(keys)}")
    return chosen


def _check_values(x, method):
    """Skip when no range can be computed; the number of NaN values."""
    finite = np.isfinite(x)
    if not finite.any():
        raise Skip("no finite values")
    f32_max = float(np.finfo(np.float32).max)
    if x.dtype.itemsize > 4 and np.abs(x[finite]).max() > f32_max:  # float64: would become inf
        raise Skip(f"values beyond float32's range (max |x| = {np.abs(x[finite]).max():.4g} > "
                   f"{f32_max:.4g}); quantcore computes in float32")
    if method in ("minmax", "moving_average") and np.isinf(x).any():
        raise Skip(f"+-inf values, so the {method} range is infinite (--method percentile, "
                   "entropy or mse use the finite values only)")
    return int(np.isnan(x).sum())


def _axis_of(x, args):
    if not args.per_channel:
        return None
    if x.ndim == 0:
        raise Skip("a scalar cannot be quantized per channel")
    if not -x.ndim <= args.axis < x.ndim:
        raise Skip(f"--axis {args.axis} is out of range", f"shape {x.shape}")
    return args.axis % x.ndim


def _method_options(args):
    return dict(percentile=args.percentile, bins=args.bins,
                averaging_constant=args.averaging_constant)


def _calibrate_one(w, args, scheme, bar):
    """(row, qparams entry, plot data or None, notes, sparse-entropy loss or
    None) of one tensor; Skip when it cannot be calibrated."""
    arr = w.entry.load()
    if arr.size == 0:
        raise Skip("empty", f"shape {arr.shape}")
    nans = _check_values(arr, args.method)
    x = np.asarray(arr, dtype=np.float32)
    axis = _axis_of(x, args)
    hists = Histograms(x, args.bins) if (args.method in HIST_METHODS or args.plot) else None
    lo, hi = method_range(x, args.method, scheme, axis=axis, histograms=hists,
                          on_batch=lambda: bar.update(1), **_method_options(args))
    if args.method != "moving_average":
        bar.update(1)
    scale, zp, y = quantize_with(arr, lo, hi, scheme, axis)
    bar.update(1)
    sqnr, err = error_stats(arr, y)
    notes = []
    if nans:
        notes.append(f"{w.key}: {nans} NaN value(s) ignored")
    if w.entry.widened:
        notes.append(f"{w.key}: {w.entry.dtype} read as float32 (exact)")
    sparse = None
    if args.method == "entropy" and hists.finite.size < MIN_VALUES_PER_BIN * args.bins:
        data = hists.finite
        _, _, y_mm = quantize_with(arr, data.min(), data.max(), scheme, None)
        sqnr_mm = sqnr_db(arr, y_mm)
        if sqnr < sqnr_mm - 1:   # it did clip too much
            sparse = f"{w.key} ({data.size} values: {sqnr:.1f} dB, minmax {sqnr_mm:.1f})"
    entry = {"scale": scale.tolist(), "zero_point": zp.tolist(), "quant_min": scheme.qmin,
             "quant_max": scheme.qmax, "axis": axis, "rounding": scheme.rounding,
             "method": args.method, "symmetric": scheme.symmetric, "shape": list(arr.shape)}
    c_lo, c_hi = clipping_range(scale, zp, scheme.qmin, scheme.qmax)
    row = (w.key, arr.shape, float(c_lo.min()), float(c_hi.max()), scale, zp, sqnr, err)
    plot = _plot_data(w.key, arr, x, hists, scheme, args, (lo, hi, sqnr)) if args.plot else None
    return row, entry, plot, notes, sparse


def _plot_data(key, arr, x, hists, scheme, args, chosen):
    """What the plot shows of one tensor: a histogram of its finite values
    and, for every method, its per-tensor clipping range and SQNR (or why
    it has none), plus the run's own result."""
    from .cli_plot import TensorPlot
    methods = {}
    for method in METHODS:
        try:
            if method in ("minmax", "moving_average") and np.isinf(x).any():
                raise Skip("+-inf values")
            lo, hi = method_range(x, method, scheme, histograms=hists, **_method_options(args))
        except (Skip, ValueError) as exc:
            methods[method] = str(exc)
            continue
        scale, zp, y = quantize_with(arr, lo, hi, scheme, None)
        c_lo, c_hi = clipping_range(scale, zp, scheme.qmin, scheme.qmax)
        methods[method] = (float(c_lo[0]), float(c_hi[0]), sqnr_db(arr, y))
    lo, hi, sqnr = chosen
    s, z = scheme.qparams(lo, hi)
    c_lo, c_hi = clipping_range(s, z, scheme.qmin, scheme.qmax)
    if args.per_channel:  # the run's own result is a column of its own
        methods[_run_label(args)] = (float(c_lo.min()), float(c_hi.max()), sqnr)
    counts, edges = np.histogram(hists.finite, bins=120)
    return TensorPlot(key, tuple(arr.shape), counts, edges, methods,
                      (float(c_lo.min()), float(c_hi.max()), sqnr, args.per_channel))


def _run_label(args):
    return f"{args.method} per channel" if args.per_channel else args.method


def calibrate(args):
    scheme = Scheme(args.bits, args.signed, args.symmetric, args.rounding)
    if args.per_channel and args.method in HIST_METHODS:
        raise CliError(f"--method {args.method} is per tensor only; use minmax or "
                       "moving_average with --per-channel")
    for path, option in ((args.output, "-o"), (args.plot, "--plot")):
        if path:
            check_writable(path, option, args.files)
    if args.plot:
        if not args.plot.lower().endswith((".png", ".pdf")):
            raise CliError(f"--plot {args.plot}: expected a .png (one image) or .pdf (one page "
                           "per part) path")
        from .cli_plot import check_matplotlib
        check_matplotlib()
    notes = []
    if args.method == "moving_average":
        notes.append("warning: moving_average averages the ranges of successive batches of "
                     "activations; on a static weight tensor it only averages the ranges of "
                     f"{MAX_BATCHES} slices of it, which under-estimates its range: use minmax "
                     "for weights")
    work = _select(_gather(args.files), args.tensors, args.weights_only, args.per_channel,
                   args.per_channel_1d, notes)
    results, rows, plots, skipped, sparse = {}, [], [], {}, []
    steps = sum((_n_batches(w.entry.shape, args.axis % w.entry.ndim if args.per_channel
                            and w.entry.ndim and -w.entry.ndim <= args.axis < w.entry.ndim
                            else None) if args.method == "moving_average" else 1) + 1
                for w in work)
    with _progress(steps, args) as bar:
        for w in work:
            bar.set_postfix_str(w.key[-30:], refresh=False)
            try:
                row, entry, plot, tensor_notes, loss = _calibrate_one(w, args, scheme, bar)
            except Skip as exc:
                skipped.setdefault(exc.reason, []).append(
                    f"{w.key} ({exc.detail})" if exc.detail else w.key)
                continue
            except (CliError, ValueError) as exc:   # unreadable values, a failed check
                skipped.setdefault(one_line(exc), []).append(w.key)
                continue
            if loss:
                sparse.append(loss)
            rows.append(row)
            results[w.key] = entry
            notes.extend(tensor_notes)
            if plot is not None:
                plots.append(plot)
    if sparse:
        notes.append(
            f"warning: entropy lost more than 1 dB to minmax on {len(sparse)} tensor(s) with "
            f"fewer than {MIN_VALUES_PER_BIN} values per histogram bin: "
            + short_list(sparse, 4) + ". TensorRT's KL search needs a dense histogram (many "
            "activation samples); on small tensors it can clip most values: prefer mse or "
            "minmax there, or fewer --bins")
    for reason, keys in skipped.items():
        notes.append(f"left out {len(keys)} tensor(s), {reason}: {short_list(keys)}")
    if not rows:   # the notes on what was left out become the error
        left = [n for n in notes if n.startswith("left out")]
        print_notes([n for n in notes if n not in left])
        raise CliError(f"nothing calibrated: {'; '.join(left) or 'no tensor selected'}")
    _print_table(rows, scheme, args)
    print_notes(notes)
    if args.output:
        def dump():
            with atomic_write(args.output, text=True) as fh:
                json.dump(results, fh, indent=1)
        write_or_fail(args.output, dump)
        print(f"qparams written to {args.output}")
    if args.plot:
        from .cli_plot import plot_calibration
        granularity = (f"; methods per tensor, this run per channel (axis {args.axis})"
                       if args.per_channel else ", per tensor")
        written = plot_calibration(plots, args.plot, _run_label(args),
                                   scheme.describe() + granularity)
        print(f"plot written to {', '.join(written)}")
    return 0


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
    """A tqdm bar over the run's steps (each tensor's statistic batches plus
    its fake-quant pass) on stderr, only when stderr is a terminal (or with
    ``--progress``) and only once the run has lasted PROGRESS_DELAY seconds
    (``--progress``: at once; ``-q``: never)."""
    if args.quiet or not (args.progress or _is_terminal(sys.stderr)):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc="calibrating", unit="step", file=sys.stderr,
                delay=0 if args.progress else PROGRESS_DELAY, leave=bool(args.progress))


def _is_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt(values, spec):
    values = np.asarray(values).reshape(-1)
    if values.size == 1 or values.min() == values.max():
        return format(values[0].item(), spec)
    return f"{format(values.min().item(), spec)}..{format(values.max().item(), spec)}"


def _print_table(rows, scheme, args):
    granularity = (f"per channel (axis {args.axis})" if args.per_channel else "per tensor")
    say(f"calibrated {len(rows)} tensor(s): method {args.method}, {scheme.describe()}, "
        f"{granularity}")
    if args.quiet:
        return
    say("clip range: [(qmin - zero point) * scale, (qmax - zero point) * scale], what the "
        "qparams represent" + (" (per channel: the lowest and the highest end)"
                               if args.per_channel else ""))
    print_table(("tensor", "shape", "clip range", "scale", "zero point", "SQNR dB",
                 "max |err|"),
                [(key, "x".join(map(str, shape)) or "scalar", f"[{lo:.4g}, {hi:.4g}]",
                  _fmt(scale, ".6g"), _fmt(zp, "d"), f"{sqnr:.2f}", f"{err:.4g}")
                 for key, shape, lo, hi, scale, zp, sqnr, err in rows], left=3)


def _method(value):
    name = value.replace("-", "_")
    if name not in METHODS:
        raise argparse.ArgumentTypeError(f"invalid choice {value!r} (choose from "
                                         f"{', '.join(METHODS)})")
    return name


def _add_calibrate(sub):
    cal = sub.add_parser(
        "calibrate", help="compute qparams for the tensors of .npy / .npz / .safetensors files",
        description="Calibrate the floating-point tensors of the files: print each one's shape, "
                    "range, scale, zero point, and the SQNR and max abs error after fake "
                    "quantization; optionally write the qparams as JSON (for 'quantcore "
                    "fake-quant') and plot which method suits which tensor.  NaN values are "
                    "ignored (and counted); tensors that cannot be calibrated are left out with "
                    "a note.  The defaults suit weights: 8-bit signed symmetric per tensor, as "
                    "torch's and onnxruntime's weight observers; use --affine (and --unsigned) "
                    "for activations.  (quantize's int4 / int8 groups default to affine, as ORT "
                    "MatMulNBits and torchao: small groups are seldom centred on 0.)",
        formatter_class=formatter(argparse.HelpFormatter))
    cal.set_defaults(run=calibrate)
    cal.add_argument("files", nargs="+", metavar="FILE", help=".npy, .npz or .safetensors")
    opts = cal.add_argument_group("statistic")
    opts.add_argument("--method", type=_method, default="minmax", metavar="METHOD",
                      help="minmax (default); moving_average (MovingAverageMinMaxObserver over "
                           f"{MAX_BATCHES} slices: meant for activation batches, it "
                           "under-estimates a weight's range); percentile, entropy, mse "
                           "(histogram methods, per tensor only: NVIDIA's calibrator on |x| "
                           "when symmetric; with --affine percentile cuts each tail, entropy "
                           "and mse give [0, amax] and leave out tensors with negative values)")
    opts.add_argument("--percentile", type=real_in(0, 100), default=DEFAULT_PERCENTILE,
                      metavar="P", help=f"percentile: the share of values kept, in (0, 100] "
                                        f"(default {DEFAULT_PERCENTILE:g})")
    opts.add_argument("--bins", type=int_in(16, 1 << 16), default=DEFAULT_BINS, metavar="N",
                      help=f"histogram bins of percentile, entropy, mse (default {DEFAULT_BINS})")
    opts.add_argument("--averaging-constant", type=real_in(0, 1), default=0.01, metavar="C",
                      help="moving_average: weight of a new batch, in (0, 1] (default 0.01)")
    qopts = cal.add_argument_group("quantization")
    qopts.add_argument("--bits", type=int_in(2, 16), default=8,
                       help="integer bits, 2..16 (default 8)")
    sign = qopts.add_mutually_exclusive_group()
    sign.add_argument("--signed", dest="signed", action="store_true", default=True,
                      help="signed range [-2**(bits-1), 2**(bits-1) - 1] (default)")
    sign.add_argument("--unsigned", dest="signed", action="store_false",
                      help="unsigned range [0, 2**bits - 1]")
    sch = qopts.add_mutually_exclusive_group()
    sch.add_argument("--symmetric", dest="symmetric", action="store_true", default=True,
                     help="symmetric: zero point 0 (signed) or the middle (unsigned), scale "
                          "from max|x| (default: torch's and onnxruntime's weight scheme)")
    sch.add_argument("--affine", dest="symmetric", action="store_false",
                     help="affine: zero point from the range (activations)")
    qopts.add_argument("--per-channel", action="store_true",
                       help="one scale / zero point per channel (minmax, moving_average); "
                            "tensors of fewer than 2 dimensions are left out")
    qopts.add_argument("--axis", type=int, default=0,
                       help="channel axis with --per-channel (default 0)")
    qopts.add_argument("--per-channel-1d", action="store_true",
                       help="with --per-channel, also 1-D tensors (one scale per value)")
    qopts.add_argument("--rounding", choices=ROUNDING, default="half_even",
                       help="rounding of the fake quantization (default half_even)")
    sel = cal.add_argument_group("tensors")
    add_tensors(sel, "only tensors whose name (or FILE:name) matches one of these globs")
    sel.add_argument("--weights-only", action="store_true",
                     help="only tensors of 2 or more dimensions (matrices, convolution kernels, "
                          "embeddings): leaves out 1-D biases, norm weights and scalars")
    out = cal.add_argument_group("output")
    out.add_argument("-o", "--output", metavar="JSON", help="write the qparams to this file")
    out.add_argument("--plot", metavar="PNG",
                     help="plot which method suits which tensor: an SQNR summary of every "
                          "tensor and method, then each tensor's histogram with every method's "
                          "range (one .png image of stacked pages, or a .pdf of pages; needs "
                          "matplotlib)")
    bar = out.add_mutually_exclusive_group()
    add_quiet(bar)
    bar.add_argument("--progress", action="store_true",
                     help="show the progress bar at once, also when stderr is not a terminal "
                          f"(default: on a terminal, after {PROGRESS_DELAY:g} s)")
