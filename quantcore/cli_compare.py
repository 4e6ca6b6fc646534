"""``quantcore compare``: the command line of :mod:`quantcore.compare` (its
table for every float tensor of a file or an ONNX model, and the plot)."""
import numpy as np

from .compare import (DEFAULT, F32, RECIPES, Undefined, compare,
                      model_tensors, qdq_accuracy, table)

def add_parser(sub, formatter=None):
    """Register ``quantcore compare`` on an argparse sub-parsers object."""
    from .cli_common import add_tensors
    kw = {"formatter_class": formatter} if formatter else {}
    p = sub.add_parser(
        "compare", help="one tensor through every framework's 8-bit recipe: where they differ",
        description="Turn each float tensor's min / max (amax for the symmetric recipes) into "
                    "each framework's 8-bit per-tensor qparams and fake quantization (through "
                    "quantcore's compat layers) and print, per recipe: scale, zero point, the "
                    "share of integer codes that differ from the reference recipe, the largest "
                    "code difference, the largest output difference, the SQNR, and the declared "
                    "conventions in which the recipe differs from the reference (the causes).",
        **kw)
    p.add_argument("file", metavar="FILE",
                   help="input .npy, .npz or .safetensors, or an .onnx model with --data")
    p.add_argument("--data", metavar="NPZ",
                   help="an .onnx FILE: an .npz of arrays named after the model's inputs, run "
                        "once by ONNX Runtime; its weights and the activations ORT calibrates "
                        "are compared")
    p.add_argument("--recipes", nargs="+", metavar="R", choices=list(RECIPES),
                   help=f"the recipes (default: {' '.join(DEFAULT)}; also: "
                        f"{' '.join(n for n in RECIPES if n not in DEFAULT)})")
    p.add_argument("--reference", default="torch_affine", choices=list(RECIPES), metavar="R",
                   help="the recipe the others are compared with (default torch_affine)")
    add_tensors(p, "compare only these tensors")
    p.add_argument("--plot", metavar="PNG",
                   help="also write an image: the share of codes that differ from the "
                        "reference, tensors x recipes, and the values whose code flips "
                        "(needs matplotlib)")
    p.add_argument("--tables", action="store_true",
                   help=f"every tensor's table (default: the tables up to {TABLES_MAX} tensors, "
                        "one summary line per tensor above)")
    p.set_defaults(run=run_command)
    return p


#: above this many tensors ``compare`` prints one line per tensor unless --tables
TABLES_MAX = 8
#: a run longer than this (seconds) reports its progress on stderr
PROGRESS_AFTER_S = 1.0


class _Progress:
    """``compare: N / M tensors`` on stderr once the run is past
    :data:`PROGRESS_AFTER_S`, then at most every 5 s (any stderr: a log
    shows it too); nothing for a short run."""

    def __init__(self, total):
        import time
        self.total, self.clock = total, time.monotonic
        self.start = self.last = self.clock()

    def __call__(self, done):
        now = self.clock()
        if now - self.start >= PROGRESS_AFTER_S and (self.last == self.start
                                                     or now - self.last >= 5):
            import sys
            print(f"compare: {done} / {self.total} tensors, {now - self.start:.0f} s",
                  file=sys.stderr, flush=True)
            self.last = now


def _summary_row(name, shape, result):
    """One tensor's summary: the recipes whose codes all agree with the
    reference, and the one that differs most."""
    rows = [r for r in result.rows if not r.undefined]
    same = sum(r.mismatch == 0 for r in rows)
    worst = max(rows, key=lambda r: (r.mismatch, r.max_abs_diff), default=None)
    most = "-" if worst is None or worst.mismatch == 0 else \
        f"{worst.name} {100 * worst.mismatch:.2f}%"
    return (name, "x".join(map(str, shape)), f"{same} / {len(result.rows)}", most)


def run_command(args):
    """``quantcore compare``: the table of every float tensor of the file
    (an ONNX model's: without ONNX Runtime's warnings)."""
    if not args.file.endswith(".onnx"):
        return _run(args)
    from .cli_common import quiet_ort
    with quiet_ort():
        return _run(args)


def _run(args):
    from .cli_common import match_tensors, print_table
    from .cli_files import CliError, check_writable
    if args.plot:
        from .cli_plot import check_matplotlib
        check_matplotlib()
        check_writable(args.plot, "--plot")
    entries = _command_tensors(args)
    if args.tensors:
        keep = set(match_tensors([name for name, _, _ in entries], args.tensors))
        entries = [e for e in entries if e[0] in keep]
    done, summary = [], []
    tables = args.tables or len(entries) <= TABLES_MAX
    progress = _Progress(len(entries))
    for i, (name, shape, load) in enumerate(entries):
        progress(i)
        if load is None:
            print(f"{name}: skipped (dtype {shape}, not floating point)")
            continue
        with np.errstate(over="ignore"):
            x = np.asarray(load()).astype(F32)
        if x.size == 0 or not np.isfinite(x).all():
            why = "empty" if x.size == 0 else "holds NaN or inf (as float32)"
            print(f"{name}: skipped ({why})")
            continue
        try:
            result = compare(x, args.recipes or DEFAULT, args.reference, keep_arrays=False)
        except Undefined as exc:
            print(f"{name}: skipped ({exc})")
            continue
        done.append((name, result, load))
        if not tables:
            summary.append(_summary_row(name, shape, result))
            continue
        head, rows, notes = table(result)
        print(f"{name}  shape {list(shape)}  min {x.min():.6g}  max {x.max():.6g}  "
              f"reference {args.reference}")
        print_table(head, rows)
        for note in notes:
            print(f"  {note}")
        print()
    if not done:
        raise CliError(f"{args.file}: no tensor could be compared (see the notes above)")
    if summary:
        print(f"{len(summary)} tensors against {args.reference} (--tables: each tensor's "
              f"table; --tensors: some of them)")
        print_table(("tensor", "shape", "same codes", "most different"), summary)
    if args.file.endswith(".onnx"):
        _print_accuracy(args)
    if args.plot:
        from .cli_files import write_path_or_fail
        write_path_or_fail(args.plot, lambda temporary: plot_mismatch(
            [(n, c) for n, c, _ in done], temporary, _details(done, args)))
        print(f"wrote {args.plot}")
    return 0


def _local_flips(c):
    """The largest share of flipped codes among recipes on the reference's
    grid (at most half the codes differ)."""
    return max([r.mismatch for r in c.rows if not r.undefined and r.mismatch <= 0.5] or [0])


def _details(done, args):
    """The DETAILED tensors of ``done`` with the most local flips, compared
    again with their arrays kept (for the plot's detail panels)."""
    ranked = sorted((d for d in done if _local_flips(d[1]) > 0), key=lambda d: -_local_flips(d[1]))
    out = []
    for name, c, load in ranked[:DETAILED]:
        x = np.asarray(load()).astype(F32).reshape(-1)
        out.append((name, x, compare(x, [r.name for r in c.rows], c.reference)))
    return out


def _command_tensors(args):
    """``[(name, shape, load)]`` of the command's input (``load`` None for a
    tensor that is not floating point; ``shape`` is then its dtype)."""
    from .cli_common import list_checked
    from .cli_files import CliError
    if args.file.endswith(".onnx"):
        if not args.data:
            raise CliError(f"{args.file}: an ONNX model needs --data NPZ (its inputs)")
        from .cli_common import check_input
        check_input(args.file, ".onnx")
        check_input(args.data, ".npz")
        with np.load(args.data, allow_pickle=False) as npz:
            feeds = {k: npz[k] for k in npz.files if k != "labels"}
        return [(n, a.shape, lambda a=a: a) for n, a in model_tensors(args.file, feeds)]
    if args.data:
        raise CliError("--data: only with an .onnx FILE")
    return [(e.name, e.shape, e.load) if e.is_float else (e.name, e.dtype, None)
            for e in list_checked(args.file)]


def _print_accuracy(args):
    """The accuracies of :func:`qdq_accuracy` when --data holds 'labels'."""
    with np.load(args.data, allow_pickle=False) as npz:
        if "labels" not in npz.files:
            return
        feeds = {k: npz[k] for k in npz.files if k != "labels"}
        labels = npz["labels"]
    acc = qdq_accuracy(args.file, feeds, labels, args.recipes or DEFAULT)
    print(f"accuracy on --data ({labels.size} labels), every tensor through ORT's "
          f"QuantizeLinear / DequantizeLinear with each recipe's qparams: "
          f"float {100 * acc.pop('float'):.2f}%")
    for name, (a, left) in acc.items():
        more = f"  ({len(left)} tensor(s) left in float: {', '.join(left)})" if left else ""
        print(f"  {name:<20} {100 * a:6.2f}%{more}")


#: tensors drawn on the detail panels of --plot
DETAILED = 4


def plot_mismatch(results, path, details=()):
    """Write ``path`` (an image): a heat map of ``results`` (``[(tensor
    name, Comparison)]``; one row per tensor, one column per recipe, the
    cell's colour and text the percentage of integer codes that differ from
    the reference, its SQNR below it), then one panel per ``details`` entry
    (``(name, x, Comparison with arrays)``): the histogram of ``x`` over the
    elements whose code flips, one outline per recipe on the reference's
    grid (codes differing on at most half the elements), labelled with the
    recipe's declared causes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r.name for r in results[0][1].rows]
    share = np.array([[c.row(n).mismatch * 100 for n in names] for _, c in results])
    heights = [0.5 * len(results) + 2.5] + [3.0] * len(details)
    fig = plt.figure(figsize=(max(1.2 * len(names) + 3, 9), sum(heights)))
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)
    ax = axes[0, 0]
    ax.imshow(np.nan_to_num(share, nan=0.0), cmap="Reds", vmin=0, vmax=100, aspect="auto")
    for i, (_, c) in enumerate(results):
        for j, n in enumerate(names):
            row = c.row(n)
            text = "no result" if row.undefined else f"{share[i, j]:.1f}%\n{row.sqnr_db:.1f} dB"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if share[i, j] > 60 else "black")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(results)), [t for t, _ in results])
    ax.set_title(f"integer codes that differ from {results[0][1].reference} (and SQNR)")
    for (tensor, x, c), (ax,) in zip(details, axes[1:]):
        ref = c.row(c.reference)
        bins = np.linspace(c.min, c.max, 61) if c.max > c.min else 10
        for row in c.rows:
            if row.undefined or not 0 < row.mismatch <= 0.5:
                continue
            flips = x[row.q != ref.q]
            ax.hist(flips, bins=bins, histtype="step",
                    label=f"{row.name} ({flips.size}): {', '.join(row.causes)}")
        ax.set_title(f"{tensor}: values whose code differs from {c.reference}", fontsize=9)
        ax.set_xlabel("value")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
