"""Performance tracking over saved pytest-benchmark runs of bench/.

Every benchmark at one size is set against ``np.copyto`` (GPU:
``cupy.copyto``) of the same number of float32 elements measured in the
same run::

    ratio = median time of the implementation / median time of the copy

(the copies of one size pooled: :func:`rooflines`), so the machine's
speed and much of its momentary load cancel, and runs of different days
(or builds) compare.  A run's CPU kind (:func:`cpu_kind`:
model, widest SIMD, core count) names its reference ``ref-<kind>.json``
under ``bench/results/``; a check compares a new run's ratios with the
reference of its own kind only.

Usage::

    python bench/track.py check [--ref REF.json] [--storage DIR] [-- PYTEST ARGS]
    python bench/track.py compare REF.json NEW.json
    python bench/track.py history [--storage DIR] [--out bench/results/history]
    python bench/track.py reference RUN.json       (store RUN as its kind's reference)

``check`` runs the benchmarks (saved into the storage like ``make bench``),
compares, re-runs the benchmarks that moved (with the copies of their
sizes) ``--reruns`` times, and exits 1 when a ratio's lower median over the
attempts is more than ``--tolerance`` (10%) worse than the reference.
"""
import argparse
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

from summary import size_name, slim

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
STORAGE = os.path.join(HERE, "runs")
TOLERANCE = 0.10
#: the implementations of each group that are the copy roofline
ROOFLINES = ("np.copyto", "cupy.copyto")
#: implementations that are quantcore's own code (a check fails only on these;
#: the others - NumPy, torch, ml_dtypes, ... - are shown for context)
OURS = ("quantcore", "quantcore-1t", "quantcore-all", "quantcore-gpu", "compat", "core")
#: SIMD feature flags worth recording (cpuinfo / /proc/cpuinfo names)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
              "avx512vl", "avx512_bf16", "avx512_fp16", "avx512vnni", "avx512_vnni", "amx_tile",
              "asimd", "sve")


# ---------------------------------------------------------------- machine
def simd_level(flags):
    """The widest vector ISA in ``flags``: 'avx512', 'avx2', 'neon', 'sve'
    or 'baseline'."""
    flags = set(flags)
    for level, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("sve", "sve"),
                        ("neon", "asimd")):
        if flag in flags:
            return level
    return "baseline"


def cpu_kind(brand, flags, cores):
    """A file-name-safe name for a kind of machine, e.g. ``amd-epyc-avx512-2c``:
    the CPU model without trademarks, clock or generic words, its widest
    SIMD and its core count (the ratios of the all-threads runs depend on
    all three)."""
    name = re.sub(r"\((r|tm)\)|@.*$|\bcpu\b|\bprocessor\b|\d+-core", " ", (brand or "").lower())
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown-cpu"
    return f"{name}-{simd_level(flags)}-{cores}c"


def _proc_cpu():
    """(brand, flags) of the first CPU in /proc/cpuinfo ('', [] elsewhere)."""
    brand, flags = "", []
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not brand:
                    brand = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    return brand or platform.processor(), flags


def quantcore_info(machine_info=None, commit_info=None):
    """What a run's numbers depend on beyond pytest-benchmark's own
    ``machine_info``: the CPU kind, model and SIMD flags, the thread counts,
    the extension's build variant in use and its build, the commit and the
    load average (the machine may be shared)."""
    import quantcore as qc
    cpu = (machine_info or {}).get("cpu", {})
    brand, flags = cpu.get("brand_raw"), cpu.get("flags")
    if not brand or not flags:
        pbrand, pflags = _proc_cpu()
        brand, flags = brand or pbrand, flags or pflags
    cores = cpu.get("count") or os.cpu_count() or 1
    build = qc.build_info()
    info = {
        "cpu_kind": cpu_kind(brand, flags, cores),
        "cpu_brand": brand,
        "cpu_simd": simd_level(flags),
        "cpu_simd_flags": sorted(f for f in set(flags) if f in SIMD_FLAGS),
        "cpu_count": cores,
        "threads": qc.get_num_threads(),
        "simd_variant": build.get("simd_in_use"),
        "simd_runtime_variants": build.get("simd_runtime_variants"),
        "simd_baseline": build.get("simd_baseline"),
        "QUANTCORE_SIMD": os.environ.get("QUANTCORE_SIMD"),
        "openmp": build.get("openmp"),
        "parallel_threshold": build.get("parallel_threshold"),
        "compiler": f"{build.get('compiler', '?')} {build.get('compiler_version', '')}".strip(),
        "numpy": __import__("numpy").__version__,
    }
    if commit_info:
        info["commit"] = commit_info.get("id")
        info["dirty"] = commit_info.get("dirty")
    if hasattr(os, "getloadavg"):
        info["loadavg"] = [round(v, 2) for v in os.getloadavg()]
    return info


def run_info(doc):
    """The ``quantcore`` block of a run (older runs: derived from pytest-
    benchmark's ``machine_info``, without the build variant)."""
    info = doc.get("machine_info", {}).get("quantcore")
    if info:
        return info
    cpu = doc.get("machine_info", {}).get("cpu", {})
    flags = cpu.get("flags", [])
    return {"cpu_kind": cpu_kind(cpu.get("brand_raw"), flags, cpu.get("count", 0)),
            "cpu_brand": cpu.get("brand_raw"), "cpu_simd": simd_level(flags),
            "simd_variant": None, "threads": None,
            "commit": doc.get("commit_info", {}).get("id")}


# ----------------------------------------------------------------- ratios
def load(path):
    with open(path) as fh:
        return json.load(fh)


def _entries(doc):
    """(op, size, impl, median, fullname) of each benchmark with those keys
    (the ONNX Runtime peak-memory entries have no size)."""
    for b in doc.get("benchmarks", []):
        info = b.get("extra_info", {})
        if {"op", "size", "impl"} <= info.keys():
            yield info["op"], info["size"], info["impl"], b["stats"]["median"], b["fullname"]


def rooflines(doc):
    """``{size: (roofline, [fullnames])}``: the median of the medians of the
    run's copy benchmarks of ``size`` elements (each operation's group has
    its own ``np.copyto`` of the same array size; at 1 Ki their medians
    differ by up to 20% with where their arrays happen to lie, so they are
    pooled)."""
    found = defaultdict(list)
    for _, size, impl, median, fullname in _entries(doc):
        if impl in ROOFLINES and median > 0:
            found[size].append((median, fullname))
    return {size: (statistics.median(m for m, _ in runs), sorted(f for _, f in runs))
            for size, runs in found.items()}


def ratios(doc):
    """``{(op, size, impl): (ratio, fullname)}`` of a run: each benchmark's
    median over the copy roofline of its size in the same run
    (:func:`rooflines`).  Sizes without a copy benchmark in the run (the
    ONNX Runtime end-to-end runs; the compat overheads when the 1 Ki copies
    did not run) have no ratio."""
    roofs = rooflines(doc)
    return {(op, size, impl): (median / roofs[size][0], fullname)
            for op, size, impl, median, fullname in _entries(doc)
            if impl not in ROOFLINES and size in roofs}


# ------------------------------------------------------------- comparison
#: a size's copy yardstick counts as moved when at least this many other
#: implementations of that size (NumPy, torch, ml_dtypes, ...) have ratios in
#: both runs: their median change is then the yardstick's
MIN_FOREIGN = 2
#: the implementations timed on one thread and on all threads
ONE_THREAD, ALL_THREADS = "quantcore-1t", "quantcore-all"


def yardstick_drift(r, n, ours=OURS):
    """``{size: factor}``: how far the copy yardstick of each size moved
    between two runs' ratios ``r`` and ``n`` (:func:`ratios`), seen in the
    implementations that are not quantcore's: the median of their
    ``new / ref`` ratios (1 with fewer than :data:`MIN_FOREIGN`).  At 1 Ki
    the copy takes well under a microsecond and its median moves by 15-20%
    between runs with where the arrays lie: NumPy's, torch's and
    quantcore's ratios then all move together, and that is the yardstick's
    move, not the code's."""
    moved = defaultdict(list)
    for key, (ratio, _) in r.items():
        impl = key[2]
        if impl not in ours and key in n and ratio > 0:
            moved[key[1]].append(n[key][0] / ratio)
    return {size: statistics.median(v) if len(v) >= MIN_FOREIGN else 1.0
            for size, v in moved.items()}


def compare(ref, new, tolerance=TOLERANCE, ours=OURS):
    """Rows ``(op, size, impl, ref_ratio, new_ratio, change, status)`` for
    every ratio either run has, sorted by op, size, impl.  ``change`` is
    ``(new / ref) / drift - 1`` (positive: slower relative to the copy),
    with ``drift`` the move of the size's copy yardstick
    (:func:`yardstick_drift`).  ``status``: 'REGRESSION' (one of ``ours``
    more than ``tolerance`` worse), 'parallel' (an all-threads ratio that
    much worse while the same operation's one-thread ratio is not: the
    kernel did not change, the second core's availability did; a shared
    2-vCPU VM moves it by up to 70% on an idle guest), 'slower' (another
    implementation that much worse: context, not a failure), 'faster'
    (more than ``tolerance`` better), 'ok', 'new' (no reference ratio) or
    'missing' (not in the new run)."""
    r, n = ratios(ref), ratios(new)
    drift = yardstick_drift(r, n, ours)
    changes = {key: (n[key][0] / r[key][0]) / drift.get(key[1], 1.0) - 1.0
               for key in set(r) & set(n)}
    rows = []
    for key in sorted(set(r) | set(n), key=lambda k: (k[0], k[1], k[2])):
        op, size, impl = key
        a = r[key][0] if key in r else None
        b = n[key][0] if key in n else None
        if a is None:
            rows.append((op, size, impl, None, b, None, "new"))
            continue
        if b is None:
            rows.append((op, size, impl, a, None, None, "missing"))
            continue
        change = changes[key]
        one_thread = changes.get((op, size, ONE_THREAD))
        if change > tolerance:
            status = "REGRESSION" if impl in ours else "slower"
            if impl == ALL_THREADS and one_thread is not None and one_thread <= tolerance:
                status = "parallel"
        elif change < -tolerance:
            status = "faster"
        else:
            status = "ok"
        rows.append((op, size, impl, a, b, change, status))
    return rows


def regressions(rows):
    return [row for row in rows if row[6] == "REGRESSION"]


def moved_table(rows, show=("REGRESSION", "parallel", "slower", "faster")):
    """Markdown table of the rows whose status is in ``show``."""
    lines = ["| operation | size | implementation | reference / copy | this run / copy | change "
             "| status |", "|---|---|---|---|---|---|---|"]
    for op, size, impl, a, b, change, status in rows:
        if status not in show:
            continue
        lines.append(f"| {op} | {size_name(size)} | {impl} | "
                     f"{'-' if a is None else f'{a:.3f}'} | {'-' if b is None else f'{b:.3f}'} | "
                     f"{'-' if change is None else f'{change:+.1%}'} | {status} |")
    return "\n".join(lines) if len(lines) > 2 else "(nothing moved by more than the tolerance)"


def header(doc, label):
    info = run_info(doc)
    commit = (info.get("commit") or doc.get("commit_info", {}).get("id") or "?")[:8]
    dirty = " (uncommitted changes)" if doc.get("commit_info", {}).get("dirty") else ""
    return (f"{label}: commit {commit}{dirty}, {doc.get('datetime', '?')[:16]}, "
            f"{info.get('cpu_kind')} ({info.get('cpu_brand')}), build variant "
            f"{info.get('simd_variant') or '?'}, {info.get('threads') or '?'} threads, "
            f"load average {info.get('loadavg', '?')}")


def mismatches(ref, new):
    """What differs between two runs' conditions beyond the code: CPU kind,
    build variant, thread count (a comparison across these measures the
    machine, not the commit)."""
    a, b = run_info(ref), run_info(new)
    out = [f"{key}: reference {a.get(key)!r}, this run {b.get(key)!r}"
           for key in ("cpu_kind", "simd_variant", "threads")
           if a.get(key) is not None and b.get(key) is not None and a.get(key) != b.get(key)]
    for label, info in (("reference", a), ("this run", b)):
        load, cores = info.get("loadavg"), info.get("cpu_count")
        if load and cores and load[0] > cores:
            out.append(f"{label}: load average {load[0]} on {cores} cores: its all-threads "
                       "timings wait for CPUs (re-record / re-run on a quiet machine)")
    return out


def report(ref, new, rows, tolerance=TOLERANCE, compared=None):
    """The comparison as text: both runs, condition mismatches, the copy
    yardsticks that moved, counts and the table of what moved.  ``rows``
    came from comparing ``ref`` with ``compared`` (default ``new``: the
    merged attempts of a check, whose first run ``new`` is)."""
    counts = defaultdict(int)
    for row in rows:
        counts[row[6]] += 1
    lines = [header(ref, "reference"), header(new, "this run")]
    lines += [f"WARNING: {m}" for m in mismatches(ref, new)]
    drift = yardstick_drift(ratios(ref), ratios(new if compared is None else compared))
    for size, factor in sorted(drift.items()):
        if abs(factor - 1.0) > tolerance / 2:
            lines.append(f"note: the copy yardstick of {size_name(size)} moved by "
                         f"{1 / factor - 1:+.1%} (the other implementations' ratios by "
                         f"{factor - 1:+.1%}): changes at that size are relative to them")
    lines.append(f"ratios compared: {sum(counts.values())} ("
                 + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"); tolerance "
                 f"{tolerance:.0%} on quantcore's own implementations ({', '.join(OURS)})")
    lines += ["", moved_table(rows)]
    return "\n".join(lines)


def merge_attempts(docs):
    """One run whose every ratio is the lower median of its attempts among
    ``docs`` (the first is the full run, the others re-runs of the
    benchmarks that moved, with their rooflines): with three attempts a
    ratio counts as slow when it was slow in two, with two when it was slow
    in both, so one preempted attempt neither fails nor passes a check.
    Returned as a run document whose copy roofline of each size is 1 (so a
    benchmark's ratio is its median)."""
    seen = defaultdict(list)
    for doc in docs:
        for key, (ratio, fullname) in ratios(doc).items():
            seen[key].append((ratio, fullname))
    benchmarks = []
    for (op, size, impl), attempts in seen.items():
        ratio, fullname = sorted(attempts)[(len(attempts) - 1) // 2]
        benchmarks.append({"fullname": fullname, "stats": {"median": ratio},
                           "extra_info": {"op": op, "size": size, "impl": impl}})
    for size in {k[1] for k in seen}:
        benchmarks.append({"fullname": f"roofline {size}", "stats": {"median": 1.0},
                           "extra_info": {"op": "copy", "size": size, "impl": ROOFLINES[0]}})
    out = {k: v for k, v in docs[0].items() if k != "benchmarks"}
    out["benchmarks"] = benchmarks
    return out


# -------------------------------------------------------------- reference
def reference_path(kind, results=RESULTS):
    return os.path.join(results, f"ref-{kind}.json")


def store_reference(run_paths, results=RESULTS):
    """Write the run at ``run_paths`` (one path, or several runs of one CPU
    kind, build variant and thread count: then each ratio is the median of
    the runs', :func:`merge_attempts`) without its per-round timings as
    ``ref-<its cpu kind>.json`` under ``results``; its path.  A single
    quiet run still carries its own noise: on the 2-core VM a memory-bound
    ratio (minmax at 16 Mi) measured 0.52 in one quiet run and 0.55-0.60 in
    three others of the same kernels, so record three."""
    if isinstance(run_paths, str):
        run_paths = [run_paths]
    docs = [load(p) for p in run_paths]
    first = run_info(docs[0])
    for path, doc in zip(run_paths[1:], docs[1:]):
        info = run_info(doc)
        for key in ("cpu_kind", "simd_variant", "threads"):
            if info.get(key) != first.get(key):
                raise SystemExit(f"bench-reference: {path}: {key} {info.get(key)!r} differs "
                                 f"from {run_paths[0]}'s {first.get(key)!r}")
    doc = docs[0] if len(docs) == 1 else merge_attempts(docs)
    if len(docs) > 1:
        doc["reference_of"] = [{"commit": run_info(d).get("commit"), "datetime": d.get("datetime"),
                                "loadavg": run_info(d).get("loadavg")} for d in docs]
    path = reference_path(first["cpu_kind"], results)
    slim(doc, path)
    return path


# ---------------------------------------------------------------- history
def stored_runs(storage=STORAGE, results=RESULTS):
    """Paths of every saved run (the storage's machine folders) and of the
    references under ``results``."""
    paths = glob.glob(os.path.join(storage, "**", "*.json"), recursive=True)
    paths += glob.glob(os.path.join(results, "ref-*.json"))
    return sorted(set(paths))


def history(docs, kind=None):
    """``(columns, table)`` of the ratios of each (op, size, impl) of
    quantcore's own implementations across runs in time order:
    ``columns`` are ``(label, doc)`` (label: short commit, '+' when the
    tree was dirty, and the date), ``table`` maps a key to a list of
    ratios (None where a run lacks it).  ``kind`` keeps runs of one CPU
    kind only (ratios of different machines do not compare)."""
    docs = [d for d in docs if kind is None or run_info(d)["cpu_kind"] == kind]
    docs.sort(key=lambda d: d.get("datetime", ""))
    columns, seen = [], set()
    for d in docs:
        commit = (d.get("commit_info", {}).get("id") or "?")[:7]
        label = f"{commit}{'+' if d.get('commit_info', {}).get('dirty') else ''} " \
            f"{d.get('datetime', '?')[5:16].replace('T', ' ')}"
        # a reference is also a saved run (its --benchmark-json twin, stamped
        # a moment apart): the same commit and timings
        stamp = (commit, tuple(sorted((b["fullname"], b["stats"].get("median"))
                                      for b in d.get("benchmarks", []))))
        if stamp in seen:
            continue
        seen.add(stamp)
        columns.append((label, d))
    table = defaultdict(lambda: [None] * len(columns))
    for j, (_, d) in enumerate(columns):
        for key, (ratio, _) in ratios(d).items():
            if key[2] in OURS:
                table[key][j] = ratio
    return columns, dict(table)


def history_markdown(columns, table):
    head = "| operation | size | implementation | " + " | ".join(c[0] for c in columns) + " |"
    lines = [head, "|---|---|---|" + "---|" * len(columns)]
    for key in sorted(table, key=lambda k: (k[0], k[1], k[2])):
        op, size, impl = key
        cells = ["-" if v is None else f"{v:.3f}" for v in table[key]]
        lines.append(f"| {op} | {size_name(size)} | {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def history_plot(columns, table, path, title):
    """One panel per operation: each (size, implementation)'s ratio against
    the run index (x labels: commits)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = sorted({k[0] for k in table})
    ncol = 3
    nrow = max(1, (len(ops) + ncol - 1) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.5 * ncol, 3.6 * nrow), squeeze=False)
    xs = list(range(len(columns)))
    for ax, op in zip(axes.flat, ops):
        for key in sorted((k for k in table if k[0] == op), key=lambda k: (k[1], k[2])):
            pts = [(x, v) for x, v in zip(xs, table[key]) if v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    label=f"{size_name(key[1])} {key[2]}")
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_ylabel("time / np.copyto", fontsize=8)
        ax.set_xticks(xs)
        ax.set_xticklabels([c[0].split()[0] for c in columns], rotation=60, fontsize=6)
        ax.legend(fontsize=5, ncol=2)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (3.6 * nrow)))  # (room for the title)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -------------------------------------------------------------------- CLI
def run_pytest(args, json_path, save=None):
    """Run the benchmarks; ``save``: the pytest-benchmark storage to save
    the run into (as ``make bench``)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--benchmark-only",
           f"--benchmark-json={json_path}"]
    if save:
        cmd += ["--benchmark-autosave", f"--benchmark-storage=file://{save}"]
    cmd += list(args) or [os.path.relpath(HERE, ROOT)]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc not in (0, 5):  # (5: nothing collected, e.g. a -k that matches no rerun)
        raise SystemExit(f"bench-check: the benchmark run failed (pytest exit {rc})")


def _no_reference(kind, ref_path):
    """bench-check's message when ``ref_path`` (this CPU kind's reference)
    is missing; exit status 2."""
    print(f"bench-check: no reference for this CPU kind ({kind}): {ref_path} is missing. "
          f"Record one on a quiet machine of this kind: `make bench` two or three times, then "
          f"`make bench-reference BENCH_REF_RUNS=\"bench/runs/<the saved runs>.json\"` (the "
          f"median of the runs; bench/README.md), and commit it", file=sys.stderr)
    return 2


def cmd_check(args):
    # the reference is looked for before the suite runs (it takes minutes)
    kind = quantcore_info()["cpu_kind"]
    ref_path = args.ref or reference_path(kind, args.results)
    if not os.path.exists(ref_path):
        return _no_reference(kind, ref_path)
    tmp = tempfile.mkdtemp(prefix="qc-bench-check-")
    first = os.path.join(tmp, "run.json")
    run_pytest(args.pytest_args, first, save=args.storage)
    docs = [load(first)]
    run_kind = run_info(docs[0])["cpu_kind"]
    if run_kind != kind and not args.ref:   # pytest-benchmark named the CPU otherwise
        kind, ref_path = run_kind, reference_path(run_kind, args.results)
        if not os.path.exists(ref_path):
            return _no_reference(kind, ref_path)
    ref = load(ref_path)
    compared = docs[0]
    rows = compare(ref, compared, args.tolerance)
    bad = regressions(rows)
    if bad and args.reruns > 0:
        roofs = rooflines(docs[0])
        ids = sorted({fullname for key, (_, fullname) in ratios(docs[0]).items()
                      if key in {r[:3] for r in bad}}
                     | {f for size in {r[1] for r in bad} for f in roofs[size][1]})
        for attempt in range(args.reruns):
            print(f"bench-check: {len(bad)} ratio(s) more than {args.tolerance:.0%} worse; "
                  f"re-running them (attempt {attempt + 2} of {args.reruns + 1})", flush=True)
            again = os.path.join(tmp, f"rerun{attempt}.json")
            run_pytest(ids, again)
            docs.append(load(again))
        compared = merge_attempts(docs)
        rows = compare(ref, compared, args.tolerance)
    print(report(ref, docs[0], rows, args.tolerance, compared=compared))
    bad = regressions(rows)
    if bad:
        print(f"\nbench-check: FAILED: {len(bad)} ratio(s) more than {args.tolerance:.0%} "
              f"worse than {os.path.relpath(ref_path, ROOT)} (lower median of {len(docs)} "
              "attempt(s))")
        return 1
    print(f"\nbench-check: passed against {os.path.relpath(ref_path, ROOT)}")
    return 0


def cmd_compare(args):
    ref, new = load(args.ref), load(args.new)
    rows = compare(ref, new, args.tolerance)
    print(report(ref, new, rows, args.tolerance))
    return 1 if regressions(rows) else 0


def cmd_history(args):
    docs = [load(p) for p in stored_runs(args.storage, args.results)]
    kinds = sorted({run_info(d)["cpu_kind"] for d in docs})
    if not docs:
        print("bench-history: no stored runs (make bench saves one)", file=sys.stderr)
        return 2
    text = []
    for kind in kinds:
        columns, table = history(docs, kind)
        text += [f"## {kind}", "",
                 "Each cell: median time / median np.copyto time of the same size in the same "
                 "run (lower is faster); runs by commit ('+': uncommitted changes) and date.",
                 "", history_markdown(columns, table), ""]
        png = f"{args.out}-{kind}.png"
        try:
            history_plot(columns, table, png, f"{kind}: time / np.copyto by run")
            text += [f"Plot: `{os.path.relpath(png, ROOT)}`", ""]
            print(f"wrote {png}")
        except ImportError:
            print("matplotlib not installed: no plot", file=sys.stderr)
    with open(args.out + ".md", "w") as fh:
        fh.write("# Benchmark history\n\n" + "\n".join(text))
    print(f"wrote {args.out}.md ({len(docs)} runs, kinds: {', '.join(kinds)})")
    return 0


def cmd_reference(args):
    store_reference(args.run, args.results)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check", help="run the benchmarks and compare with the reference")
    p.add_argument("--ref", default=None, help="reference run (default: of this CPU kind)")
    p.add_argument("--storage", default=STORAGE, help="pytest-benchmark storage to save into")
    p.add_argument("--results", default=RESULTS, help="where the references are")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    p.add_argument("--reruns", type=int, default=2, help="re-runs of what moved")
    p.add_argument("pytest_args", nargs="*", help="after --: test paths / pytest options")
    p = sub.add_parser("compare", help="compare two saved runs")
    p.add_argument("ref")
    p.add_argument("new")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    p = sub.add_parser("history", help="Markdown table and plot of the ratios by run")
    p.add_argument("--storage", default=STORAGE)
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=os.path.join(RESULTS, "history"))
    p = sub.add_parser("reference", help="store a run (or the median of several runs) as its "
                       "CPU kind's reference")
    p.add_argument("run", nargs="+")
    p.add_argument("--results", default=RESULTS)
    args = parser.parse_args(argv)
    return {"check": cmd_check, "compare": cmd_compare, "history": cmd_history,
            "reference": cmd_reference}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
