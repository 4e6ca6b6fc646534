"""``quantcore calibrate --plot``: which method suits which tensor.

The first page is the summary: every tensor's SQNR under every method (a
table coloured by the distance to the tensor's best method, the best ones
framed, the run's method marked; more than SUMMARY_ROWS tensors continue on
further pages) and, beside it, the methods ranked by how many tensors they
win and by their mean SQNR loss to the best.  Methods within TIE_DB of the
best SQNR are all best (ties are no one's: no method is preferred; a tie
counts as a win for each).  The following pages show the tensors where the
run's method loses most to the best one (at most MAX_DETAILED, and only
tensors where it does lose); where it loses nowhere, the page says so and
shows the tensors where the methods differ most.  Each tensor's histogram
sits over a strip with one row per method, its clipping range as a bar and
its SQNR in the row label, the run's method drawn bold and its range
shaded on the histogram, so ranges that coincide stay visible and no
legend covers the data.

One file per path: a ``.pdf`` path gets one document with a page each, a
``.png`` path one image with the pages stacked top to bottom.
"""
import numpy as np

from .cli_files import CliError, write_path_or_fail

#: summary rows and tensor panels per page; tensors with a page of their own
SUMMARY_ROWS = 40
TENSORS_PER_PAGE = 5
MAX_DETAILED = 10
#: the summary's colours run from 0 (best) to this many dB below the best
LOSS_SCALE = 6.0
#: SQNRs this close (dB) to the best are tied with it
TIE_DB = 0.01
DPI = 80
COLORS = {"minmax": "#1f77b4", "moving_average": "#9467bd", "percentile": "#2ca02c",
          "entropy": "#d62728", "mse": "#ff7f0e"}
#: the colour of a run's per-channel result (its own column)
RUN_COLOR = "#000000"


class TensorPlot:
    """What the plot shows of one tensor.

    Parameters
    ----------
    key, shape : the tensor's name and shape.
    counts, edges : histogram of its finite values.
    methods : {method: (lo, hi, sqnr_db)} per-tensor clipping range and SQNR
        of each method, or {method: reason} when the method does not apply.
    chosen : (lo, hi, sqnr_db, per_channel) of the run's own result (per
        channel: the span of the channels' ranges).
    """

    def __init__(self, key, shape, counts, edges, methods, chosen):
        self.key, self.shape, self.counts, self.edges = key, shape, counts, edges
        self.methods, self.chosen = methods, chosen

    def sqnr(self, method):
        value = self.methods.get(method)
        return value[2] if isinstance(value, tuple) else None

    def loss(self):
        """(dB the run's result is below the best method, SQNR spread of
        the methods): what makes a tensor worth a detailed look."""
        scores = [s for m in self.methods if (s := self.sqnr(m)) is not None
                  and np.isfinite(s)]
        if not scores:
            return (0.0, 0.0)
        run = self.chosen[2] if np.isfinite(self.chosen[2]) else max(scores)
        return (max(scores) - run, max(scores) - min(scores))

    def best(self):
        """The methods of highest SQNR, all those within TIE_DB of it (a
        tuple, in the plot's method order; empty when none applies)."""
        scored = {m: s for m in self.methods if (s := self.sqnr(m)) is not None
                  and not np.isnan(s)}
        if not scored:
            return ()
        top = max(scored.values())
        return tuple(m for m, s in scored.items() if s == top or s >= top - TIE_DB)


def check_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from .cli_common import install_hint
        raise CliError(f"--plot needs matplotlib: {install_hint('matplotlib')}") from None


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _loss_to_best(plots, methods):
    """dB below each tensor's best method, rows x methods (NaN: n/a)."""
    loss = np.full((len(plots), len(methods)), np.nan)
    for r, p in enumerate(plots):
        scores = [p.sqnr(m) for m in methods]
        finite = [s for s in scores if s is not None and np.isfinite(s)]
        best = max(finite) if finite else None
        for c, s in enumerate(scores):
            if s is None:
                continue
            if np.isinf(s) and s > 0:
                loss[r, c] = 0.0          # exact: nothing to lose
            elif best is not None:
                loss[r, c] = best - s if np.isfinite(s) else 60.0
    return loss


def _summary_page(plt, plots, rows, methods, chosen, scheme_text, first, caption):
    n = len(rows)
    height = max(1.6 + 0.24 * n, 2.4 + 0.45 * len(methods))
    fig = plt.figure(figsize=(12, height), dpi=DPI)
    table = fig.add_axes([0.30, 0.9 / height, 0.42, 1 - 2.0 / height])
    loss = _loss_to_best(plots, methods)[rows]
    shown = np.where(np.isnan(loss), np.nan, np.minimum(loss, LOSS_SCALE))
    cmap = plt.get_cmap("RdYlGn_r").with_extremes(bad="#dddddd")
    table.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=0, vmax=LOSS_SCALE, aspect="auto")
    for r, row in enumerate(rows):
        p = plots[row]
        best = p.best()
        for c, m in enumerate(methods):
            s = p.sqnr(m)
            text = "n/a" if s is None else ("inf" if np.isinf(s) and s > 0 else f"{s:.1f}")
            weight = "bold" if m in best else "normal"
            table.text(c, r, text, ha="center", va="center", fontsize=8, fontweight=weight)
            if m in best:
                table.add_patch(plt.Rectangle((c - 0.48, r - 0.45), 0.96, 0.9, fill=False,
                                              lw=1.6, ec="black"))
    table.set_xticks(range(len(methods)))
    table.set_xticklabels([f"{m}\n(this run)" if m == chosen else m for m in methods],
                          fontsize=8)
    for label, m in zip(table.get_xticklabels(), methods):
        if m == chosen:
            label.set_fontweight("bold")
    table.xaxis.tick_top()
    table.set_yticks(range(n))
    table.set_yticklabels([_short(plots[row].key, 44) for row in rows], fontsize=8)
    table.set_xlabel(f"SQNR in dB (colour: 0 to {LOSS_SCALE:g}+ dB below the tensor's best "
                     f"method; framed: best, ties within {TIE_DB:g} dB all framed; grey: n/a)",
                     fontsize=8)
    fig.text(0.01, 1 - 0.35 / height,
             f"Which method, for which tensor: {scheme_text}"
             + ("" if first else " (continued)"), fontsize=11, fontweight="bold", va="top")
    if first:
        _ranking(fig, plots, methods, chosen, height)
        fig.text(0.01, 0.08 / height, f"Ranking: tensors won (a tie counts for each), mean "
                 f"dB below each tensor's best.  {caption[0].upper()}{caption[1:]} "
                 "(--tensors selects others).", fontsize=8, va="bottom")
    return fig


def _detailed(plots, chosen):
    """(the tensors the detail pages show, what they are): where the run's
    method loses most to the best method, at most MAX_DETAILED, only those
    where it loses; where it loses nowhere, the widest SQNR spreads."""
    losing = sorted((k for k, p in enumerate(plots) if p.loss()[0] > TIE_DB),
                    key=lambda k: (-plots[k].loss()[0], k))
    if losing:
        shown = losing[:MAX_DETAILED]
        return ([plots[k] for k in shown],
                f"next: the {len(shown)} tensor(s) where {chosen} loses most to the best "
                f"method (it loses on {len(losing)} of {len(plots)})")
    spread = sorted(range(len(plots)), key=lambda k: (-plots[k].loss()[1], k))[:MAX_DETAILED]
    return ([plots[k] for k in spread],
            f"{chosen} is best or tied (within {TIE_DB:g} dB) on every tensor; next: the "
            f"{len(spread)} tensor(s) where the methods differ most")


def _ranking(fig, plots, methods, chosen, height):
    """Methods ranked by the tensors they win, with the mean loss to the best."""
    loss = _loss_to_best(plots, methods)
    wins = np.array([sum(1 for p in plots if m in p.best()) for m in methods])
    mean_loss = np.array([np.nanmean(col) if np.isfinite(col).any() else np.nan
                          for col in loss.T])
    order = sorted(range(len(methods)), key=lambda k: (-wins[k], np.nan_to_num(mean_loss[k],
                                                                               nan=1e9)))
    ax = fig.add_axes([0.84, (height - 1.1 - 0.4 * len(methods)) / height, 0.13,
                       0.4 * len(methods) / height])
    ys = np.arange(len(order))
    ax.barh(ys, wins[order], color=[COLORS.get(methods[k], RUN_COLOR) for k in order])
    ax.set_yticks(ys)
    ax.set_yticklabels([methods[k] for k in order], fontsize=8)
    for label, k in zip(ax.get_yticklabels(), order):
        if methods[k] == chosen:
            label.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_xlabel("tensors won", fontsize=8)
    ax.set_xlim(0, max(1, wins.max()) * 2.4)
    ax.tick_params(labelsize=8)
    for y, k in zip(ys, order):
        text = "n/a" if np.isnan(mean_loss[k]) else f"mean -{mean_loss[k]:.1f} dB"
        ax.text(wins[k], y, f" {wins[k]}  ({text})", va="center", fontsize=7)
    ax.set_title(f"ranking over all {len(plots)} tensors", fontsize=9)


def _short(text, n):
    return text if len(text) <= n else ".." + text[-(n - 2):]


def _tensor_panel(fig, box, p, methods, chosen):
    from matplotlib.ticker import NullLocator
    """Histogram over a range strip, inside ``box`` = (left, bottom, width, height)."""
    left, bottom, width, height = box
    strip_h = height * 0.42
    hist = fig.add_axes([left, bottom + strip_h, width, height - strip_h - 0.018])
    strip = fig.add_axes([left, bottom, width, strip_h])
    hist.stairs(p.counts, p.edges, fill=True, color="0.55")
    if p.counts.max() > 50:
        hist.set_yscale("log")
        hist.set_ylim(0.7, None)
    hist.yaxis.set_minor_locator(NullLocator())   # (minor log ticks cost most of the draw)
    hist.set_xticks([])
    hist.set_ylabel("count", fontsize=8)
    hist.tick_params(labelsize=7)
    lo, hi, sqnr, per_channel = p.chosen
    hist.axvspan(lo, hi, color=COLORS.get(chosen, RUN_COLOR), alpha=0.12, lw=0)
    best = p.best()
    title = f"{p.key}  {p.shape}   this run: {chosen}, {sqnr:.1f} dB"
    if best and chosen not in best:
        title += (f"   best: {', '.join(best)}{' (tied)' if len(best) > 1 else ''}, "
                  f"{p.sqnr(best[0]):.1f} dB")
    hist.set_title(title, fontsize=9, loc="left")
    spans = [p.edges[0], p.edges[-1]]
    labels = []
    for row, m in enumerate(methods):
        value = p.methods.get(m)
        mark = " (best)" if m in best else ""
        if not isinstance(value, tuple):
            labels.append(f"{m}: n/a")
            strip.text(0.5, row, str(value)[:70], transform=strip.get_yaxis_transform(),
                       ha="center", va="center", fontsize=6, color="0.4")
            continue
        r_lo, r_hi, s = value
        spans += [r_lo, r_hi]
        bold = m == chosen
        color = COLORS.get(m, RUN_COLOR)
        strip.plot([r_lo, r_hi], [row, row], color=color, lw=4 if bold else 2.2,
                   solid_capstyle="butt")
        strip.plot([r_lo, r_hi], [row, row], "|", color=color, ms=9 if bold else 7, mew=1.5)
        text = "inf" if np.isinf(s) and s > 0 else f"{s:.1f}"
        labels.append(f"{m}  {text} dB{mark}")
    strip.set_yticks(range(len(methods)))
    strip.set_yticklabels(labels, fontsize=7)
    for label, m in zip(strip.get_yticklabels(), methods):
        label.set_color(COLORS.get(m, RUN_COLOR))
        if m == chosen:
            label.set_fontweight("bold")
    strip.set_ylim(len(methods) - 0.4, -0.6)
    strip.set_xlabel("value (bars: each method's clipping range; shaded above: this run's)",
                     fontsize=7)
    strip.tick_params(labelsize=7)
    strip.grid(axis="x", color="0.9")
    lo_all, hi_all = min(spans), max(spans)
    pad = 0.03 * (hi_all - lo_all or 1.0)
    hist.set_xlim(lo_all - pad, hi_all + pad)
    strip.set_xlim(lo_all - pad, hi_all + pad)


def _tensor_page(plt, plots, methods, chosen, caption):
    per_page = len(plots)
    height = 0.6 + 3.1 * per_page
    fig = plt.figure(figsize=(12, height), dpi=DPI)
    fig.text(0.01, 1 - 0.25 / height, caption, fontsize=9, va="top")
    for k, p in enumerate(plots):
        bottom = (height - 0.45 - 3.1 * (k + 1) + 0.55) / height
        _tensor_panel(fig, (0.24, bottom, 0.72, 2.35 / height), p, methods, chosen)
    return fig


def plot_calibration(plots, path, chosen, scheme_text):
    """Write the pages for ``plots`` (list of :class:`TensorPlot`) to the
    one file ``path`` (``.pdf``: a page each; otherwise one image, the
    pages stacked); returns ``[path]``."""
    plt = _pyplot()
    methods = list(COLORS) + sorted({m for p in plots for m in p.methods} - set(COLORS))
    detailed, caption = _detailed(plots, chosen)
    pages = []
    for start in range(0, max(len(plots), 1), SUMMARY_ROWS):
        rows = list(range(start, min(start + SUMMARY_ROWS, len(plots))))
        pages.append(lambda rows=rows, first=(start == 0): _summary_page(
            plt, plots, rows, methods, chosen, scheme_text, first, caption))
    n_tensor_pages = -(-len(detailed) // TENSORS_PER_PAGE)
    for k in range(n_tensor_pages):
        chunk = detailed[k * TENSORS_PER_PAGE:(k + 1) * TENSORS_PER_PAGE]
        text = caption.replace("next: the", "the", 1) + \
            (f" (part {k + 1} of {n_tensor_pages})" if n_tensor_pages > 1 else "")
        pages.append(lambda chunk=chunk, text=text: _tensor_page(plt, chunk, methods, chosen,
                                                                 text))
    if path.lower().endswith(".pdf"):
        from matplotlib.backends.backend_pdf import PdfPages

        def write_pdf(temporary):
            with PdfPages(temporary) as pdf:
                for make in pages:
                    fig = make()
                    pdf.savefig(fig)
                    plt.close(fig)
        write_path_or_fail(path, write_pdf)
        return [path]
    images = []
    for make in pages:   # each page rendered, then stacked into the one image
        fig = make()
        fig.canvas.draw()
        images.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
        plt.close(fig)
    width = max(im.shape[1] for im in images)
    rule = np.full((3, width, 3), 160, np.uint8)
    stacked = np.concatenate([part for im in images for part in (
        np.pad(im, ((0, 0), (0, width - im.shape[1]), (0, 0)), constant_values=255), rule)][:-1])
    write_path_or_fail(path, lambda temporary: plt.imsave(temporary, stacked, format="png"))
    return [path]
