"""The embedded default job: calibrate and fake-quantize realistic tensors.

A conv-like weight tensor (heavy-tailed, per output channel scales) and a
post-ReLU activation batch are generated from a fixed seed; each is
observed with ``quantcore.minmax``, given int8 / uint8 qparams, fake
quantized per tensor and per channel, and the SQNR is printed.
"""
import numpy as np

import quantcore as qc


def sqnr_db(x, y):
    """Signal-to-quantization-noise ratio 10*log10(sum x^2 / sum (x-y)^2)."""
    x64, err = x.astype(np.float64), x.astype(np.float64) - y.astype(np.float64)
    noise = float(np.sum(err * err))
    return float("inf") if noise == 0 else 10.0 * np.log10(float(np.sum(x64 * x64)) / noise)


def _affine_qparams(lo, hi, qmin, qmax):
    """Affine (scale, zero point) covering [min(lo, 0), max(hi, 0)]."""
    lo = np.minimum(lo, 0).astype(np.float32)
    hi = np.maximum(hi, 0).astype(np.float32)
    scale = np.maximum((hi - lo) / np.float32(qmax - qmin), np.finfo(np.float32).eps)
    scale = scale.astype(np.float32)
    zp = np.clip(qmin - np.rint(lo / scale), qmin, qmax)
    return scale, zp


def _symmetric_qparams(lo, hi, qmin, qmax):
    """Symmetric (scale, 0) with scale = max|range| / ((qmax - qmin) / 2)."""
    amax = np.maximum(-np.minimum(lo, 0), np.maximum(hi, 0)).astype(np.float32)
    scale = np.maximum(amax / np.float32((qmax - qmin) / 2), np.finfo(np.float32).eps)
    return scale.astype(np.float32), np.zeros_like(scale)


def run_demo(seed=0):
    rng = np.random.default_rng(seed)
    channel_scale = rng.uniform(0.02, 0.3, size=(64, 1, 1, 1)).astype(np.float32)
    weight = (rng.laplace(size=(64, 32, 3, 3)) * channel_scale).astype(np.float32)
    act = np.maximum(rng.normal(0.3, 1.0, size=(16, 32, 28, 28)), 0).astype(np.float32)
    print(f"quantcore {qc.__version__}  (OpenMP: {qc.build_info()['openmp']}, "
          f"threads: {qc.get_num_threads()})")
    print(f"{'tensor':<26}{'scheme':<30}{'scale':>12}{'zero pt':>9}{'SQNR dB':>9}")
    rows = []
    lo, hi = qc.minmax(weight)
    s, z = _symmetric_qparams(lo, hi, -128, 127)
    rows.append(("weight (64,32,3,3)", "int8 symmetric per tensor", s, z,
                 qc.fake_quant(weight, s, z, -128, 127), weight))
    lo, hi = qc.minmax(weight, axis=0)
    s, z = _symmetric_qparams(lo, hi, -128, 127)
    rows.append(("weight (64,32,3,3)", "int8 symmetric per channel 0", s, z,
                 qc.fake_quant(weight, s, z, -128, 127, axis=0), weight))
    lo, hi = qc.minmax(act)
    s, z = _affine_qparams(lo, hi, 0, 255)
    rows.append(("activation (16,32,28,28)", "uint8 affine per tensor", s, z,
                 qc.fake_quant(act, s, z, 0, 255), act))
    lo, hi = qc.minmax(act, axis=1)
    s, z = _affine_qparams(lo, hi, 0, 255)
    rows.append(("activation (16,32,28,28)", "uint8 affine per channel 1", s, z,
                 qc.fake_quant(act, s, z, 0, 255, axis=1), act))
    for name, scheme, s, z, y, x in rows:
        s, z = np.reshape(s, -1), np.reshape(z, -1)
        s_txt = f"{float(s[0]):.6g}" if s.size == 1 else f"{float(s.min()):.3g}..{float(s.max()):.3g}"
        z_txt = f"{int(z[0])}" if z.size == 1 else f"{int(z.min())}..{int(z.max())}"
        print(f"{name:<26}{scheme:<30}{s_txt:>12}{z_txt:>9}{sqnr_db(x, y):>9.2f}")
