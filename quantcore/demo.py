"""The README's main job: quantize a small NumPy MLP on real data.

scikit-learn's bundled ``load_digits`` (8x8 handwritten digits, no
download) is split 75/25 with a fixed seed.  A 64-128-10 ReLU MLP is
trained in float32 with plain NumPy, then

1. post-training quantized to int8 and to int4: weights per output channel,
   symmetric, from :class:`quantcore.MinMaxObserver`; activations (the
   input and the hidden layer) per tensor, affine unsigned, calibrated on
   the training set;
2. quantization-aware trained at int4 from the float weights with
   :class:`quantcore.FakeQuantize` on weights and activations, gradients
   through the straight-through estimator (``FakeQuantize.backward``).

It prints the accuracy table and saves the training curves as a PNG
(matplotlib, when installed).  Deterministic for a given seed; a few
seconds on 2 cores.
"""
import time

import numpy as np

import quantcore as qc

F32 = np.float32


def load_data(seed):
    """(x_train, y_train, x_test, y_test), pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - make demo installs it
        raise SystemExit("quantcore demo needs scikit-learn (pip install 'quantcore[demo]')") from exc
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(F32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.75 * len(x))
    tr, te = order[:n_train], order[n_train:]
    return x[tr], y[tr], x[te], y[te]


class MLP:
    """64-128-10 ReLU network with manual forward/backward and Adam."""

    def __init__(self, rng, sizes=(64, 128, 10)):
        self.params = {}
        for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            self.params[f"W{k}"] = (rng.normal(size=(fan_in, fan_out)) *
                                    np.sqrt(2.0 / fan_in)).astype(F32)
            self.params[f"b{k}"] = np.zeros(fan_out, F32)
        self.adam = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in self.params.items()}
        self.t = 0

    def copy(self):
        other = MLP.__new__(MLP)
        other.params = {k: v.copy() for k, v in self.params.items()}
        other.adam = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in self.params.items()}
        other.t = 0
        return other

    def step(self, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.t += 1
        for k, g in grads.items():
            m, v = self.adam[k]
            m *= beta1
            m += (1 - beta1) * g
            v *= beta2
            v += (1 - beta2) * g * g
            mhat = m / (1 - beta1 ** self.t)
            vhat = v / (1 - beta2 ** self.t)
            self.params[k] -= (lr * mhat / (np.sqrt(vhat) + eps)).astype(F32)


def softmax_xent(logits, y):
    """(mean loss, d loss / d logits)."""
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
    d = p
    d[np.arange(n), y] -= 1
    return loss, (d / n).astype(F32)


class Quantizers:
    """FakeQuantize on the input, the hidden activation and both weights.

    Weights: per output channel (axis 1 of a (in, out) matrix), symmetric,
    range [-2**(b-1), 2**(b-1) - 1], observed afresh at every forward (also
    when evaluating: the qparams are those of the current weights, as when
    the model is exported).  Activations: per tensor, affine unsigned
    [0, 2**b - 1], moving average while training, frozen in ``eval()``.
    """

    def __init__(self, bits, averaging_constant=0.01):
        wmin, wmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        amax = 2 ** bits - 1
        self.w = {k: qc.FakeQuantize(qc.MinMaxObserver(axis=1), wmin, wmax, symmetric=True,
                                     axis=1) for k in ("W1", "W2")}
        self.a = {k: qc.FakeQuantize(qc.MovingAverageMinMaxObserver(averaging_constant),
                                     0, amax) for k in ("x", "h")}

    def weight(self, name, w):
        self.w[name].observer.reset()  # weights: the current min / max
        return self.w[name](w)

    def train(self):
        for fq in self.a.values():
            fq.train()

    def eval(self):
        """Freeze the activation qparams (weights are always observed)."""
        for fq in self.a.values():
            fq.eval()


def forward(net, x, quant=None):
    """Logits and the cache needed by ``backward``."""
    p = net.params
    if quant is not None:
        x = quant.a["x"](x)
        w1, w2 = quant.weight("W1", p["W1"]), quant.weight("W2", p["W2"])
    else:
        w1, w2 = p["W1"], p["W2"]
    pre = x @ w1 + p["b1"]
    h = np.maximum(pre, 0)
    hq = quant.a["h"](h) if quant is not None else h
    logits = hq @ w2 + p["b2"]
    return logits, (x, pre, hq, w1, w2)


def backward(net, cache, dlogits, quant=None):
    x, pre, hq, w1, w2 = cache
    grads = {"W2": hq.T @ dlogits, "b2": dlogits.sum(axis=0)}
    dh = dlogits @ w2.T
    if quant is not None:
        dh = quant.a["h"].backward(dh)
    dpre = dh * (pre > 0)
    grads["W1"] = x.T @ dpre
    grads["b1"] = dpre.sum(axis=0)
    if quant is not None:  # straight-through estimator on the weights
        grads["W1"] = quant.w["W1"].backward(grads["W1"])
        grads["W2"] = quant.w["W2"].backward(grads["W2"])
    return {k: v.astype(F32) for k, v in grads.items()}


def accuracy(net, x, y, quant=None):
    logits, _ = forward(net, x, quant)
    return float((logits.argmax(axis=1) == y).mean())


def train(net, x, y, x_test, y_test, epochs, lr, rng, quant=None, batch=64):
    """Minibatch Adam; returns per-epoch (loss, test accuracy)."""
    curve = []
    for _ in range(epochs):
        order = rng.permutation(len(x))
        losses = []
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            if quant is not None:
                quant.train()
            logits, cache = forward(net, x[idx], quant)
            loss, dlogits = softmax_xent(logits, y[idx])
            net.step(backward(net, cache, dlogits, quant), lr)
            losses.append(loss)
        if quant is not None:
            quant.eval()
        curve.append((float(np.mean(losses)), accuracy(net, x_test, y_test, quant)))
    return curve


def post_training_quantize(net, x_cal, bits):
    """Calibrate activation observers on x_cal; weights from their min/max."""
    quant = Quantizers(bits, averaging_constant=1.0)
    for fq in quant.a.values():
        fq.observer = qc.MinMaxObserver()
        fq.disable_fake_quant()
    forward(net, x_cal, quant)          # calibration pass: observe only
    for fq in quant.a.values():
        fq.enable_fake_quant()
    quant.eval()
    return quant


def run_demo(seed=0, plot_path="quantcore_demo.png", epochs=40, qat_epochs=15):
    """Train, quantize, print the accuracy table; returns the accuracies."""
    t0 = time.perf_counter()
    x_tr, y_tr, x_te, y_te = load_data(seed)
    rng = np.random.default_rng(seed)
    net = MLP(rng)
    float_curve = train(net, x_tr, y_tr, x_te, y_te, epochs, 3e-3, rng)
    results = {"float32": accuracy(net, x_te, y_te)}
    for bits in (8, 4):
        quant = post_training_quantize(net, x_tr, bits)
        results[f"PTQ int{bits}"] = accuracy(net, x_te, y_te, quant)
    qat_net = net.copy()
    quant = Quantizers(4)
    qat_curve = train(qat_net, x_tr, y_tr, x_te, y_te, qat_epochs, 1e-3, rng, quant)
    results["QAT int4"] = accuracy(qat_net, x_te, y_te, quant)

    print(f"quantcore {qc.__version__} demo: 64-128-10 MLP on scikit-learn digits "
          f"({len(x_tr)} train / {len(x_te)} test, seed {seed}; OpenMP "
          f"{'on' if qc.build_info()['openmp'] else 'off'})")
    print(f"{'model':<12}{'test accuracy':>15}")
    for name, acc in results.items():
        print(f"{name:<12}{100 * acc:>14.2f}%")
    if plot_path:
        _plot(float_curve, qat_curve, plot_path)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return results


def _plot(float_curve, qat_curve, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no training-curve plot)")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    n = len(float_curve)
    ax1.plot(range(1, n + 1), [c[0] for c in float_curve], label="float32")
    ax1.plot(range(n + 1, n + len(qat_curve) + 1), [c[0] for c in qat_curve], label="QAT int4")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss")
    ax1.set_yscale("log")
    ax1.legend()
    ax2.plot(range(1, n + 1), [100 * c[1] for c in float_curve], label="float32")
    ax2.plot(range(n + 1, n + len(qat_curve) + 1), [100 * c[1] for c in qat_curve],
             label="QAT int4")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy (%)")
    ax2.legend()
    fig.suptitle("quantcore demo: digits MLP, float training then int4 QAT")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"training curves saved to {path}")
