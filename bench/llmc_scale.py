"""quantcore against llm-compressor's data-free path at a size where the
fixed costs do not hide the work (issue 45: >= 10x faster at <= 1/4 of its
memory), end to end, in one process, with a copy of the same files beside.

Run in llm-compressor's venv (``make llmc-check`` builds it)::

    PYTHONPATH=$PWD .venv-llmc/bin/python bench/llmc_scale.py [--hidden 2048] \
        [--out bench/results/llmc-2core.md]

A random Llama in BF16 (hidden 2048, intermediate 5632, 6 blocks, vocab
16000: 336M parameters, 672 MB) is written once under --work.  Both tools
are warmed on tests/tiny_models' Llama first (imports, first-call costs);
then, per scheme, llm-compressor (``tests/test_llmc.run_llmc``: load,
``oneshot``, ``save_pretrained``) and quantcore (its command line,
``run_quantcore``) each quantize it, timed from the call to the files on
disk, with the growth of the process's RSS during the call
(``test_llmc._measured``).  The copy and the copy + fsync of the source
files (``bench/test_bench_engines._copy``) bound what any writer can do
here: llm-compressor's ``save_pretrained`` does not fsync; quantcore's
output is fsync-ed and renamed into place.
"""
import argparse
import os
import platform
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "bench")]

SCHEMES = ("FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "NVFP4A16")


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), else the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--work", default="/tmp/quantcore-llmc-scale")
    ap.add_argument("--out", default=None, help="write the table here (markdown)")
    args = ap.parse_args(argv)
    import test_llmc as L
    from test_bench_engines import _copy
    src = os.path.join(args.work, f"llama-{args.hidden}")
    if not os.path.exists(src):  # (6 blocks, 16 heads, vocab 16000, N(0, 0.02))
        L._wide_llama(src, hidden=args.hidden, blocks=6, heads=16, vocab=16000, std=0.02)
    tiny, out = os.path.join(args.work, "tiny"), os.path.join(args.work, "out")
    if not os.path.exists(tiny):
        L.tiny_model("llama", tiny)
    for run in (L.run_llmc, L.run_quantcore):
        shutil.rmtree(out, ignore_errors=True)
        run(tiny, out, "FP8_DYNAMIC")
    rows = []
    shutil.rmtree(out, ignore_errors=True)
    _copy(src, out, False)  # (the source in the page cache, as for the runs below)
    for fsync in (False, True):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        _copy(src, out, fsync)
        rows.append(("copy" + (" + fsync" if fsync else ""), time.perf_counter() - t0, None))
    for scheme in SCHEMES:
        for name, run in (("llm-compressor", L.run_llmc), ("quantcore", L.run_quantcore)):
            shutil.rmtree(out, ignore_errors=True)
            seconds, mb = L._measured(lambda: run(src, out, scheme))  # noqa: B023
            rows.append((f"{scheme} {name}", seconds, mb))
            print(f"{scheme:12s} {name:15s} {seconds:7.2f} s  RSS +{mb:6.0f} MB", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    import llmcompressor
    by = {r[0]: r for r in rows}
    lines = [f"# quantcore vs llm-compressor {llmcompressor.__version__} (data-free), "
             f"{folder_bytes(src) / 1e6:.0f} MB BF16 Llama",
             "",
             f"`bench/llmc_scale.py --hidden {args.hidden}` on {cpu_model()}"
             f", {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}.  Copy: "
             f"{by['copy'][1]:.2f} s, copy + fsync: {by['copy + fsync'][1]:.2f} s "
             "(the same files).",
             "",
             "| scheme | llm-compressor s | RSS + MB | quantcore s | RSS + MB | speed-up "
             "| memory |",
             "|---|---|---|---|---|---|---|"]
    for scheme in SCHEMES:
        _, lt, lm = by[f"{scheme} llm-compressor"]
        _, qt, qm = by[f"{scheme} quantcore"]
        lines.append(f"| {scheme} | {lt:.2f} | {lm:.0f} | {qt:.2f} | {qm:.0f} | "
                     f"{lt / qt:.1f}x | 1/{lm / max(qm, 1):.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
