"""Measure where 2 threads start to beat 1 (sets PARALLEL_THRESHOLD).

Usage: python bench/threshold.py   (prints median times; run on a quiet machine)
"""
import time

import numpy as np

import quantcore as qc
from quantcore._cpu import threads


def median_time(f, reps=400):
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main():
    saved = threads.PARALLEL_THRESHOLD
    threads.PARALLEL_THRESHOLD = 0  # let the thread count through at every size
    try:
        print(f"{'elements':>9} {'op':<11} {'1 thread us':>12} {'2 threads us':>13} {'ratio':>6}")
        for n in (1 << 12, 1 << 13, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18):
            x = np.random.default_rng(0).normal(size=n).astype(np.float32)
            out = np.empty_like(x)
            ops = {"fake_quant": lambda: qc.fake_quant(x, 0.02, 0, -128, 127, out=out),
                   "minmax": lambda: qc.minmax(x)}
            for name, f in ops.items():
                t = []
                for k in (1, 2):
                    qc.set_num_threads(k)
                    t.append(median_time(f))
                print(f"{n:>9} {name:<11} {t[0] * 1e6:>12.1f} {t[1] * 1e6:>13.1f} "
                      f"{t[0] / t[1]:>6.2f}")
    finally:
        threads.PARALLEL_THRESHOLD = saved
        qc.set_num_threads(None)


if __name__ == "__main__":
    main()
