"""``make gpu-check``: prove the GPU path on a machine with an NVIDIA GPU.

    python bench/gpu_check.py [--out bench/results/gpu-<device>.md] [--dry-run]
                              [--skip-tests] [--skip-bench]

Steps (each timed; the report says what ran and what failed):

1. the environment: device, compute capability, SMs, driver and runtime
   versions, CuPy and NVRTC versions, torch (CUDA) when installed;
2. the compile: every module compiled cold into an empty cache folder (a
   fresh process, ``kernels.warm_up`` with the 64-bit groups too), then
   loaded warm from it in another fresh process;
3. probes, each against the CPU extension bit for bit: subnormals
   (``minmax`` of [2**-140, 1, 3], ``histc`` of subnormals, an MX block near
   2**-130, fake quant of subnormals), NaN codes (FP8 e4m3fn / e5m2 and MX
   elements of +-NaN), streams (reductions from 4 threads at once, each
   on its own non-blocking stream, then on per-thread default streams in
   a fresh process);
4. the whole GPU test suite (``pytest -m gpu tests``);
5. the GPU benchmarks (bench/test_bench_gpu.py: quantcore against a cupy
   device copy and torch CUDA) summarised by bench/summary.py.

Writes a Markdown report (default ``bench/results/gpu-<device>.md``) and
exits 1 when a probe or a test failed.  ``--dry-run``: on any cupy (the
CUDA emulator in CI) with small sizes, the compile of two sources only,
and steps 4 and 5 only printed: it checks this script, not the GPU.
Planned time on an H100 host with 16 cores: compile cold about 1-2 min,
probes seconds, tests 2-4 min, benchmarks 1-2 min.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WARM_UP = """
import json, sys
from quantcore_gpu import kernels as K
sources = json.loads(sys.argv[1]) or None
log = K.warm_up(index64=sources is None, sources=sources)
print(json.dumps([[s, g, how, sec] for _, s, g, how, sec in log]))
"""

STREAMS_PTDS = """
import json, threading, numpy as np, cupy as cp
from quantcore_gpu import kernels as K
data = [np.random.default_rng(i).normal(size=200000).astype(np.float32) for i in range(4)]
bad = []
def work(i):
    x = cp.asarray(data[i])
    for _ in range(20):
        lo, hi, _ = K.minmax(x)
        if (lo.get(), hi.get()) != (data[i].min(), data[i].max()):
            bad.append(i)
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"ptr": cp.cuda.get_current_stream().ptr, "bad": len(bad)}))
"""


def slug(name):
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "device"


def environment(cp):
    """{name: value} of the machine."""
    rt = cp.cuda.runtime
    dev = rt.getDevice()
    props = rt.getDeviceProperties(dev)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    info = {"device": name, "compute capability": str(cp.cuda.Device(dev).compute_capability),
            "SMs": int(cp.cuda.Device(dev).attributes["MultiProcessorCount"]),
            "CuPy": cp.__version__, "NVRTC": ".".join(map(str, cp.cuda.nvrtc.getVersion())),
            "python": platform.python_version(), "host CPUs": os.cpu_count()}
    for what, fn in (("driver", "driverGetVersion"), ("runtime", "runtimeGetVersion")):
        try:
            v = int(getattr(rt, fn)())
            info[f"CUDA {what}"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception as exc:   # (the emulator has none)
            info[f"CUDA {what}"] = f"unknown ({type(exc).__name__})"
    try:
        import torch
        info["torch"] = torch.__version__ + (" (CUDA)" if torch.cuda.is_available() else
                                             " (no CUDA)")
    except ImportError:
        info["torch"] = "not installed"
    return info


def run_py(code, env=None, args=()):
    """Run python code in a fresh process; (seconds, stdout's last line
    parsed as JSON)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


def compile_cold_warm(sources, folder):
    """(cold, warm): (seconds, module log) of two fresh processes sharing
    the cache folder ``folder`` (empty at first)."""
    env = dict(os.environ, QUANTCORE_KERNEL_CACHE=folder)
    arg = (json.dumps(sources),)
    cold = run_py(WARM_UP, env, arg)
    warm = run_py(WARM_UP, env, arg)
    return cold, warm


# ------------------------------------------------------------------ probes

def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.kind == "f" else a


def same(cpu, gpu):
    """Bit equality (any NaN equals any NaN: payloads are not part of the
    contract); ``gpu`` a cupy or numpy array."""
    gpu = gpu.get() if hasattr(gpu, "get") else np.asarray(gpu)
    cpu = np.asarray(cpu)
    if cpu.shape != gpu.shape or cpu.dtype != gpu.dtype:
        return False
    if cpu.dtype.kind == "f":
        nan = np.isnan(cpu)
        return bool(np.array_equal(nan, np.isnan(gpu)) and
                    np.array_equal(_bits(cpu)[~nan], _bits(gpu)[~nan]))
    return bool(np.array_equal(cpu, gpu))


def probes(cp):
    """[(probe, ok, detail)]: the GPU path against the CPU's, bit for bit."""
    import quantcore as qc
    from quantcore import formats as F
    from quantcore import mx
    from quantcore.torch_numerics import histc_f32
    out = []

    def probe(name, cpu_fn, gpu_fn, detail=""):
        try:
            ok = all(same(c, g) for c, g in zip(_tuple(cpu_fn()), _tuple(gpu_fn())))
            out.append((name, ok, detail))
        except Exception as exc:
            out.append((name, False, f"{type(exc).__name__}: {exc}"))

    tiny = np.array([2.0 ** -140, 1, 3], np.float32)
    probe("subnormal: minmax([2**-140, 1, 3]) keeps 2**-140", lambda: qc.minmax(tiny),
          lambda: qc.minmax(cp.asarray(tiny)), "flush-to-zero would give lo = 0")
    sub = (np.arange(-64, 64, dtype=np.float32) * np.float32(2.0 ** -133))
    probe("subnormal: fake_quant of subnormals (scale 2**-126)",
          lambda: qc.fake_quant(sub, np.float32(2.0 ** -126), 0, -128, 127),
          lambda: qc.fake_quant(cp.asarray(sub), np.float32(2.0 ** -126), 0, -128, 127))
    probe("subnormal: histc counts of subnormals",
          lambda: histc_f32(sub, 16, float(sub.min()), float(sub.max())),
          lambda: histc_f32(cp.asarray(sub), 16, float(sub.min()), float(sub.max())))
    near = (np.linspace(1, 2, 32) * 2.0 ** -130).astype(np.float32)
    probe("subnormal: MX e4m3 block near 2**-130", lambda: mx.mx_fake_quant(near, "e4m3"),
          lambda: mx.mx_fake_quant(cp.asarray(near), "e4m3"), "all zeros under flush-to-zero")
    nans = np.array([np.nan, -np.nan, 1.5, -2.0, np.inf, -np.inf, 0.0, -0.0], np.float32)
    for fmt in ("e4m3fn", "e5m2"):
        probe(f"NaN: {fmt} cast of +-NaN", lambda f=fmt: F.cast_fp8(nans, f),
              lambda f=fmt: F.cast_fp8(cp.asarray(nans), f))
    probe("NaN: e4m3fn scaled codes of +-NaN (fp8_quantize, amax 4)",
          lambda: F.fp8_quantize(nans, np.float32(4)),
          lambda: F.fp8_quantize(cp.asarray(nans), np.float32(4)),
          "CUDA arithmetic returns the positive canonical NaN")
    block = np.concatenate([nans, np.linspace(-3, 3, 24).astype(np.float32)])
    for elem in ("e4m3", "e5m2"):
        probe(f"NaN: MX {elem} elements with +-NaN", lambda e=elem: mx.mx_quantize(block, e),
              lambda e=elem: mx.mx_quantize(cp.asarray(block), e))
    out.append(stream_probe(cp))
    return out


def _tuple(v):
    return v if isinstance(v, tuple) else (v,)


def stream_probe(cp):
    """Reductions from 4 threads at once, each on its own stream."""
    import quantcore as qc
    data = [np.random.default_rng(i).normal(size=100_000).astype(np.float32) for i in range(4)]
    bad = []

    def work(i):
        with cp.cuda.Stream(non_blocking=True) as s:
            x = cp.asarray(data[i])
            for _ in range(10):
                lo, hi = qc.minmax(x)
                s.synchronize()
                if (lo.get(), hi.get()) != (data[i].min(), data[i].max()):
                    bad.append(i)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    name = "streams: minmax from 4 threads on 4 streams at once"
    if bad:
        return name, False, f"{len(bad)} wrong results"
    try:
        _, res = run_py(STREAMS_PTDS, dict(os.environ, CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1"))
    except RuntimeError as exc:
        return name, False, str(exc)[-500:]
    return (name + "; then on per-thread default streams", res["bad"] == 0,
            f"per-thread default stream ptr {res['ptr']}, {res['bad']} wrong results")


# ---------------------------------------------------------- tests, benchmarks

def run_step(cmd, dry_run, env=None):
    """(seconds, return code, last lines) of a command (None when dry)."""
    if dry_run:
        return None
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return time.perf_counter() - t0, proc.returncode, tail


#: issue 33's targets, as ratios measured in the same run: an elementwise
#: kernel over 256 Mi float32 moves the bytes of a copy, so it should reach
#: this fraction of the device copy's bandwidth (copy time / its time)
ELEMENTWISE_TARGET = 0.85
ELEMENTWISE_OPS = ("gpu_fake_quant",)


def targets(bench_json):
    """[(name, ratio, target, ok)] from a pytest-benchmark JSON: each
    elementwise op's bandwidth as a fraction of ``cupy.copyto``'s at the
    same size (the largest size measured).  The launch and synchronisation
    targets of a FakeQuantize step are tests (tests/test_device_traffic.py:
    at most 2 launches, nothing crossing), run with the suite."""
    best = {}
    for b in bench_json.get("benchmarks", []):
        info = b.get("extra_info", {})
        key = (info.get("op"), info.get("size"), info.get("impl"))
        best[key] = b["stats"]["median"]
    rows = []
    for op in ELEMENTWISE_OPS:
        sizes = sorted(n for (o, n, impl) in best if o == op and impl == "quantcore-gpu"
                       and (op, n, "cupy.copyto") in best)
        if not sizes:
            continue
        n = sizes[-1]
        ratio = best[(op, n, "cupy.copyto")] / best[(op, n, "quantcore-gpu")]
        rows.append((f"{op} at {n // (1 << 20)} Mi: fraction of copy bandwidth", ratio,
                     ELEMENTWISE_TARGET, ratio >= ELEMENTWISE_TARGET))
    return rows


def report(info, cold, warm, probe_rows, tests, bench, bench_md, dry_run, target_rows=()):
    """The Markdown report (a string)."""
    lines = [f"# quantcore GPU check: {info['device']}", ""]
    if dry_run:
        lines += ["**Dry run** (not a GPU measurement: `--dry-run`).", ""]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in info.items()] + [""]
    lines += ["## Compile", ""]
    for label, (seconds, log) in (("cold (empty cache)", cold), ("warm (cache filled)", warm)):
        how = sorted({row[2] for row in log})
        lines.append(f"- {label}: {seconds:.1f} s for {len(log)} modules "
                     f"({', '.join(how)}); slowest: " +
                     ", ".join(f"{s} {g} {sec:.1f} s" for s, g, _, sec in
                               sorted(log, key=lambda r: -r[3])[:3]))
    lines += ["", "## Probes (GPU against the CPU, bit for bit)", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {name}" + (f" ({d})" if d else "")
              for name, ok, d in probe_rows]
    for title, step in (("GPU test suite", tests), ("Benchmarks", bench)):
        lines += ["", f"## {title}", ""]
        if step is None:
            lines.append("not run (dry run)")
        else:
            seconds, rc, tail = step
            lines += [f"exit status {rc} after {seconds:.0f} s", "", "```", tail, "```"]
    if target_rows:
        lines += ["", "## Targets (ratios in the same run)", ""]
        lines += [f"- {'PASS' if ok else 'MISS'}: {name} {ratio:.2f} (target >= {target})"
                  for name, ratio, target, ok in target_rows]
    if bench_md:
        lines += ["", bench_md]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="report path (default bench/results/gpu-<device>.md)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the script on any cupy (the emulator): small, no tests/bench")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args(argv)
    try:
        import cupy as cp

        import quantcore_gpu
    except ImportError as exc:
        print(f"gpu-check: cupy is not importable ({exc})", file=sys.stderr)
        return 2
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        print(f"gpu-check: no usable GPU: {reason}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    info = environment(cp)
    for k, v in info.items():
        print(f"{k}: {v}")
    with tempfile.TemporaryDirectory(prefix="qc-gpu-check-") as folder:
        # the cold compile's cache serves the probes, the tests and the benchmarks
        saved = os.environ.get("QUANTCORE_KERNEL_CACHE")
        os.environ["QUANTCORE_KERNEL_CACHE"] = folder
        try:
            return _check(args, cp, info, folder, t_start)
        finally:
            if saved is None:
                os.environ.pop("QUANTCORE_KERNEL_CACHE", None)
            else:
                os.environ["QUANTCORE_KERNEL_CACHE"] = saved


def _check(args, cp, info, folder, t_start):
    sources = ["minmax.cu", "lsq.cu"] if args.dry_run else []
    cold, warm = compile_cold_warm(sources, folder)
    print(f"compile: cold {cold[0]:.1f} s, warm {warm[0]:.1f} s")
    probe_rows = probes(cp)
    for name, ok_, detail in probe_rows:
        print(f"{'PASS' if ok_ else 'FAIL'} {name} {detail}")
    py = sys.executable
    tests = None if args.skip_tests else run_step(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests"], args.dry_run)
    bench, bench_md, target_rows = None, "", []
    if not args.skip_bench:
        with tempfile.TemporaryDirectory() as tmp:
            js = os.path.join(tmp, "gpu.json")
            bench = run_step([py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "bench/test_bench_gpu.py", "--benchmark-only",
                              "--benchmark-min-rounds=5", "--benchmark-max-time=0.5",
                              f"--benchmark-json={js}"], args.dry_run,
                             dict(os.environ, QC_BENCH_GPU_SIZES="1"))
            if bench is not None and os.path.exists(js):
                proc = subprocess.run([py, "bench/summary.py", js], cwd=ROOT,
                                      capture_output=True, text=True)
                bench_md = proc.stdout
                with open(js) as fh:
                    target_rows = targets(json.load(fh))
    for title, step in (("tests", tests), ("benchmarks", bench)):
        print(f"{title}: " + ("not run" if step is None else f"exit {step[1]}, {step[0]:.0f} s"))
    for name, ratio, target, ok_ in target_rows:
        print(f"{'PASS' if ok_ else 'MISS'} {name} {ratio:.2f} (target >= {target})")
    text = report(info, cold, warm, probe_rows, tests, bench, bench_md, args.dry_run,
                  target_rows)
    out = args.out or os.path.join(ROOT, "bench", "results", f"gpu-{slug(info['device'])}.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        fh.write(text + f"\n(total {time.perf_counter() - t_start:.0f} s)\n")
    print(f"gpu-check: wrote {out}")
    failed = not all(r[1] for r in probe_rows) or any(
        s is not None and s[1] != 0 for s in (tests, bench))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
