"""Summarise a pytest-benchmark JSON of bench/: per operation and size, the
median time of each implementation, its ratio to the np.copyto roofline of
the same bytes, and quantcore's speed-up over NumPy and PyTorch; writes a
Markdown table (stdout and ``<json>.md``) and a PNG of GB/s against size.

Usage: python bench/summary.py bench/results/latest.json [--png out.png]
"""
import argparse
import json
import sys
from collections import defaultdict


def load(path):
    with open(path) as fh:
        doc = json.load(fh)
    rows = defaultdict(dict)  # (op, size) -> impl -> (median s, bytes)
    for b in doc["benchmarks"]:
        info = b.get("extra_info", {})
        if "op" not in info:
            continue
        rows[(info["op"], info["size"])][info["impl"]] = (b["stats"]["median"], info["bytes"])
    return doc, rows


def size_name(n):
    return f"{n >> 20}Mi" if n >= 1 << 20 else f"{n >> 10}Ki"


def table(rows):
    lines = ["| operation | size | quantcore (all threads) | 1 thread | / np.copyto | "
             "x NumPy | x torch | 2t vs 1t |",
             "|---|---|---|---|---|---|---|---|"]
    for (op, n) in sorted(rows, key=lambda k: (k[0], k[1])):
        impls = rows[(op, n)]
        best = impls.get("quantcore-all") or impls.get("quantcore")
        if best is None:
            continue
        t = best[0]
        one = impls.get("quantcore-1t", (None,))[0]

        def ratio(key, inverse=False):
            if key not in impls:
                return "-"
            return f"{impls[key][0] / t:.2f}" if not inverse else f"{t / impls[key][0]:.2f}"
        lines.append(
            f"| {op} | {size_name(n)} | {t * 1e6:.1f} us | "
            f"{'-' if one is None else f'{one * 1e6:.1f} us'} | {ratio('np.copyto', True)} | "
            f"{ratio('numpy')} | {ratio('torch')} | "
            f"{'-' if one is None else f'{one / t:.2f}'} |")
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    ops = sorted({op for op, _ in rows})
    ncol = 3
    nrow = (len(ops) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 3.5 * nrow), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        sizes = sorted(n for o, n in rows if o == op)
        impls = sorted({i for n in sizes for i in rows[(op, n)]})
        for impl in impls:
            pts = [(n, rows[(op, n)][impl][1] / rows[(op, n)][impl][0] / 1e9)
                   for n in sizes if impl in rows[(op, n)]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("float32 elements")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--png", default=None, help="plot path (default: <json>.png)")
    args = parser.parse_args(argv)
    doc, rows = load(args.json)
    machine = doc.get("machine_info", {})
    header = (f"Machine: {machine.get('cpu', {}).get('brand_raw', '?')}, "
              f"{machine.get('cpu', {}).get('count', '?')} cores; medians; "
              "'/ np.copyto' = quantcore time / copy time of the same array")
    text = header + "\n\n" + table(rows)
    print(text)
    with open(args.json.rsplit(".", 1)[0] + ".md", "w") as fh:
        fh.write(text + "\n")
    plot(rows, args.png or args.json.rsplit(".", 1)[0] + ".png")


if __name__ == "__main__":
    main()
