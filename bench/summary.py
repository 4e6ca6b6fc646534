"""Summarise a pytest-benchmark JSON of bench/: per operation and size, the
median time of each implementation, its ratio to the np.copyto roofline of
the same bytes, and quantcore's speed-up over NumPy and PyTorch; writes a
Markdown table (stdout and ``<json>.md``) and a PNG of GB/s against size.

Usage: python bench/summary.py bench/results/latest.json [--png out.png]
       [--slim bench/results/cpu-2core.json] [--readme README.md]

``--slim`` writes a copy of the JSON without the per-round timings (the
statistics stay), small enough to commit; ``--readme`` puts the table and
the target checks between the README's ``bench-table`` markers.
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
        if "op" not in info or "bytes" not in info:  # (ONNX Runtime runs: own tables)
            continue
        rows[(info["op"], info["size"])][info["impl"]] = (b["stats"]["median"], info["bytes"])
    return doc, rows


def size_name(n):
    return f"{n >> 20}Mi" if n >= 1 << 20 else f"{n >> 10}Ki" if n >= 1 << 10 else str(n)


def _first(impls, *keys):
    """The first of ``keys`` that ``impls`` holds (CPU and GPU runs name
    quantcore, the copy roofline and torch differently), or None."""
    return next((k for k in keys if k in impls), None)


def table(rows):
    """Markdown table; on a GPU run, 'all threads' is the GPU path, the
    roofline cupy.copyto and torch torch-cuda."""
    lines = ["| operation | size | quantcore (all threads) | 1 thread | / copy | "
             "x NumPy | x torch | 2t vs 1t |",
             "|---|---|---|---|---|---|---|---|"]
    for (op, n) in sorted(rows, key=lambda k: (k[0], k[1])):
        impls = rows[(op, n)]
        main = _first(impls, "quantcore-all", "quantcore", "quantcore-gpu")
        if main is None:
            continue
        best = impls[main]
        t = best[0]
        one = impls.get("quantcore-1t", (None,))[0]

        def ratio(key, inverse=False):
            if key is None or key not in impls:
                return "-"
            return f"{impls[key][0] / t:.2f}" if not inverse else f"{t / impls[key][0]:.2f}"
        lines.append(
            f"| {op} | {size_name(n)} | {t * 1e6:.1f} us | "
            f"{'-' if one is None else f'{one * 1e6:.1f} us'} | "
            f"{ratio(_first(impls, 'np.copyto', 'cupy.copyto'), True)} | "
            f"{ratio('numpy')} | {ratio(_first(impls, 'torch', 'torch-cuda'))} | "
            f"{'-' if one is None else f'{one / t:.2f}'} |")
    return "\n".join(lines)


def targets(rows):
    """Check issue 7's performance targets against one run: list of
    (what, measured, bound, met[, roofline ceiling])."""
    big, small = 16 << 20, 1 << 10

    def t(op, n, impl):
        impls = rows.get((op, n), {})
        key = impl if impl in impls else ("quantcore" if impl == "quantcore-all" else impl)
        return impls.get(key, (None,))[0]

    checks = []

    def ratio(what, num, den, bound, at_most, ceiling=None):
        if num is None or den is None:
            return
        value = num / den
        check = (what, f"{value:.2f}", f"{'<=' if at_most else '>='} {bound}",
                 value <= bound if at_most else value >= bound)
        checks.append(check if ceiling is None else check + (f"{ceiling:.2f}",))
    for op, bound in (("fake_quant", 1.3), ("minmax", 0.8), ("fake_quantize_forward", 2.0)):
        ratio(f"{op} 16Mi / np.copyto", t(op, big, "quantcore-all"), t(op, big, "np.copyto"),
              bound, True)
    copy = t("fake_quantize_forward", big, "np.copyto")
    for impl, name, bound in (("torch", "torch FakeQuantize", 15),
                              ("numpy", "the NumPy composite", 8)):
        other = t("fake_quantize_forward", big, impl)
        # a forward reads x and writes y at least: np.copyto's traffic, so
        # no forward can beat `other` by more than other / copy
        ceiling = other / copy if other is not None and copy is not None else None
        ratio(f"fake_quantize_forward 16Mi: speed-up over {name}", other,
              t("fake_quantize_forward", big, "quantcore-all"), bound, False, ceiling)
    fwd = t("fake_quantize_forward", small, "quantcore-all")
    if fwd is not None:
        checks.append(("fake_quantize_forward 1Ki", f"{fwd * 1e6:.1f} us", "<= 10 us",
                       fwd <= 10e-6))
    return checks


def compat_table(rows):
    """Markdown table of bench/test_bench_compat.py: each framework layer's
    call at 1 Ki elements against the core call it maps to and the
    framework's own op (issue 16: compat <= 2x core, and <= the framework)."""
    lines = ["| compat call | compat | core | compat / core | framework | compat / framework |",
             "|---|---|---|---|---|---|"]
    for (op, n) in sorted(k for k in rows if k[0].startswith("compat_")):
        impls = rows[(op, n)]
        if "compat" not in impls:
            continue
        c = impls["compat"][0]

        def cell(key):
            return f"{impls[key][0] * 1e6:.1f} us" if key in impls else "-"

        def rel(key):
            return f"{c / impls[key][0]:.2f}" if key in impls else "-"
        lines.append(f"| {op[len('compat_'):]} | {c * 1e6:.1f} us | {cell('core')} | "
                     f"{rel('core')} | {cell('framework')} | {rel('framework')} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def targets_table(checks):
    """Markdown table of the checks; a speed-up check carries the largest
    speed-up the memory roofline allows (the other implementation's time /
    np.copyto's time of the same array)."""
    lines = ["| target | measured | bound | met | roofline allows |", "|---|---|---|---|---|"]
    for check in checks:
        what, value, bound, met = check[:4]
        ceiling = check[4] if len(check) > 4 else "-"
        lines.append(f"| {what} | {value} | {bound} | {'yes' if met else 'NO'} | {ceiling} |")
    return "\n".join(lines)


def slim(doc, path):
    """Write ``doc`` without the per-round timings."""
    out = dict(doc)
    out["benchmarks"] = [dict(b, stats={k: v for k, v in b["stats"].items() if k != "data"})
                         for b in doc["benchmarks"]]
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"wrote {path}")


MARK_START, MARK_END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"


def update_readme(path, text):
    """Replace the text between the README's bench-table markers."""
    with open(path) as fh:
        readme = fh.read()
    start, end = readme.find(MARK_START), readme.find(MARK_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no {MARK_START} ... {MARK_END} block")
    readme = readme[:start + len(MARK_START)] + "\n" + text + "\n" + readme[end:]
    with open(path, "w") as fh:
        fh.write(readme)
    print(f"updated {path}")


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    ops = sorted({op for op, _ in rows if not op.startswith("compat_")})
    if not ops:  # (a run of the compat benchmarks only: nothing to plot)
        return
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
    parser.add_argument("--slim", default=None, help="write the JSON without per-round data")
    parser.add_argument("--readme", default=None, help="README to put the table into")
    args = parser.parse_args(argv)
    doc, rows = load(args.json)
    machine = doc.get("machine_info", {})
    qc_info = machine.get("quantcore", {})  # (bench/conftest.py; older runs lack it)
    kind = (f" (CPU kind {qc_info['cpu_kind']}, SIMD flags "
            f"{'/'.join(qc_info.get('cpu_simd_flags', [])) or '-'}, build variant "
            f"{qc_info.get('simd_variant')}, {qc_info.get('threads')} threads, load average "
            f"{qc_info.get('loadavg', '?')})") if qc_info else ""
    header = (f"Machine: {machine.get('cpu', {}).get('brand_raw', '?')}, "
              f"{machine.get('cpu', {}).get('count', '?')} cores{kind}; medians of one run "
              f"({doc.get('datetime', '?')[:10]}, commit "
              f"{doc.get('commit_info', {}).get('id', '?')[:8]}); '/ copy' = quantcore "
              "time / time of np.copyto (GPU: cupy.copyto) of the same array; "
              "'x NumPy', 'x torch' = speed-up; "
              "'2t vs 1t' = 1-thread time / 2-thread time (below 64 Ki elements both "
              "run on one thread, so it shows run-to-run noise there)")
    text = header + "\n\n" + table(rows) + "\n\nTargets (issue 7):\n\n" + \
        targets_table(targets(rows))
    compat = compat_table(rows)
    if compat:
        text += "\n\nFramework layers at 1 Ki elements (issue 16):\n\n" + compat
    print(text)
    base = args.json.rsplit(".", 1)[0]
    with open(base + ".md", "w") as fh:
        fh.write(text + "\n")
    plot(rows, args.png or base + ".png")
    if args.slim:
        slim(doc, args.slim)
    if args.readme:
        update_readme(args.readme, text)


if __name__ == "__main__":
    main()
