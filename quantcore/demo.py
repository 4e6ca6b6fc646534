"""The README's main job: quantize small NumPy networks on real data.

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
(matplotlib, when installed).

3. With onnx and onnxruntime (the ``demo`` extra): a small conv net
   (:class:`ConvNet`) trained in NumPy is written as ONNX with
   ``onnx.helper``, calibrated by every method of :mod:`quantcore.onnx`
   and, for ONNX Runtime's four methods, by ORT's own calibrators on the
   same model and reader (time, peak traced memory, identical ranges), and
   quantized by ORT's ``quantize_static``; the table shows each quantized
   model's test accuracy.

Deterministic accuracies for a given seed; offline (the digits ship with
scikit-learn); about ten seconds on 2 cores.
"""
import contextlib
import os
import time

import numpy as np

import quantcore as qc

F32 = np.float32


def _digits():
    """scikit-learn's digits ``(x, y)``, as ``load_digits(return_X_y=True)``
    gives them: read from the file it ships (``datasets/data/digits.csv.gz``,
    64 pixel columns then the label), found without importing scikit-learn
    (whose import, SciPy's included, is 3 s of the demo); ``load_digits``
    itself where the file is not there."""
    import importlib.util
    spec = importlib.util.find_spec("sklearn")
    if spec is None:    # make demo installs it; the CLI: one line, exit 2
        raise ImportError("quantcore demo needs scikit-learn: pip install "
                          "'quantcore-fakequant[demo]'")
    for folder in spec.submodule_search_locations or ():
        path = os.path.join(folder, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            table = np.loadtxt(path, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits
    return load_digits(return_X_y=True)


def load_data(seed):
    """(x_train, y_train, x_test, y_test), pixels scaled to [0, 1]."""
    x, y = _digits()
    x = (x / 16.0).astype(F32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.75 * len(x))
    tr, te = order[:n_train], order[n_train:]
    return x[tr], y[tr], x[te], y[te]


class Adam:
    """``params`` (name -> float32 array) trained with Adam."""

    def __init__(self, params):
        self.params = params
        self.adam = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
        self.t = 0

    def copy(self):
        """The same parameters (copied), a fresh optimizer state."""
        other = self.__class__.__new__(self.__class__)
        Adam.__init__(other, {k: v.copy() for k, v in self.params.items()})
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


def he_normal(rng, shape, fan_in):
    return (rng.normal(size=shape) * np.sqrt(2.0 / fan_in)).astype(F32)


class MLP(Adam):
    """64-128-10 ReLU network with manual forward/backward and Adam."""

    def __init__(self, rng, sizes=(64, 128, 10)):
        params = {}
        for k, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            params[f"W{k}"] = he_normal(rng, (fan_in, fan_out), fan_in)
            params[f"b{k}"] = np.zeros(fan_out, F32)
        super().__init__(params)


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


def run_demo(seed=0, plot_path="quantcore_demo.png", epochs=40, qat_epochs=15, onnx=True):
    """Train, quantize, print the accuracy table; returns the accuracies.
    ``onnx``: then :func:`run_onnx_demo` (when onnx and onnxruntime are
    installed); its test accuracies under ``"onnx"``."""
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

    build = qc.build_info()
    print(f"quantcore {qc.__version__} demo: 64-128-10 MLP on scikit-learn digits "
          f"({len(x_tr)} train / {len(x_te)} test, seed {seed}; OpenMP "
          f"{'on' if build['openmp'] else 'off'})")
    if build.get("quick_units"):
        print("(make demo's quick build: the loops whose speed the demo does not show are "
              "compiled at -O1, same results, slower; make install compiles them in full)")
    print(f"{'model':<12}{'test accuracy':>15}")
    for name, acc in results.items():
        print(f"{name:<12}{100 * acc:>14.2f}%")
    if plot_path:
        _plot(float_curve, qat_curve, plot_path)
    if onnx:
        try:
            import onnx as _  # noqa: F401
            import onnxruntime as _  # noqa: F401,F811
        except ImportError:
            print("(onnx / onnxruntime not installed: no ONNX part; "
                  "pip install 'quantcore-fakequant[demo]')")
        else:
            rows = run_onnx_demo(x_tr, y_tr, x_te, y_te, seed)
            results["onnx"] = {k: v if k == "float" else v["quantized_accuracy"]
                               for k, v in rows.items()}
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return results


# ------------------------------------------------------------------ ONNX part
class ConvNet(Adam):
    """Conv 3x3 (1 -> ``channels``, padding 1) -> ReLU -> AveragePool 2x2 ->
    Flatten (channel-major, as ONNX's) -> Gemm -> ReLU -> Gemm (10 logits),
    in NumPy: the convolution is a product of the 3x3 patches of every
    pixel, ``(N, 64, 9) @ (9, channels)``."""

    def __init__(self, rng, channels=8, hidden=32):
        flat = channels * 16
        super().__init__({
            "conv_w": he_normal(rng, (9, channels), 9), "conv_b": np.zeros(channels, F32),
            "fc1_w": he_normal(rng, (flat, hidden), flat), "fc1_b": np.zeros(hidden, F32),
            "fc2_w": he_normal(rng, (hidden, 10), hidden), "fc2_b": np.zeros(10, F32)})

    @staticmethod
    def patches(x):
        """(N, 64, 9): the zero-padded 3x3 neighbourhood of every pixel of
        the 8x8 images ``x`` (N, 64), row-major as ONNX's Conv weights."""
        img = np.pad(x.reshape(-1, 8, 8), ((0, 0), (1, 1), (1, 1)))
        return np.lib.stride_tricks.sliding_window_view(img, (3, 3), axis=(1, 2)).reshape(-1, 64, 9)

    def forward(self, x):
        """Logits and the cache of :meth:`backward`."""
        p = self.params
        cols = self.patches(x)
        pre = cols @ p["conv_w"] + p["conv_b"]                     # (N, 64 pixels, C)
        n, c = len(x), pre.shape[2]
        pooled = np.maximum(pre, 0).reshape(n, 4, 2, 4, 2, c).mean(axis=(2, 4))
        flat = pooled.transpose(0, 3, 1, 2).reshape(n, -1)         # (N, C * 16)
        h_pre = flat @ p["fc1_w"] + p["fc1_b"]
        h = np.maximum(h_pre, 0)
        return h @ p["fc2_w"] + p["fc2_b"], (cols, pre, flat, h_pre, h)

    def backward(self, cache, dlogits):
        cols, pre, flat, h_pre, h = cache
        p = self.params
        n, c = len(dlogits), pre.shape[2]
        g = {"fc2_w": h.T @ dlogits, "fc2_b": dlogits.sum(axis=0)}
        dh = (dlogits @ p["fc2_w"].T) * (h_pre > 0)
        g["fc1_w"], g["fc1_b"] = flat.T @ dh, dh.sum(axis=0)
        dpool = (dh @ p["fc1_w"].T).reshape(n, c, 4, 4).transpose(0, 2, 3, 1) / 4
        dpre = np.repeat(np.repeat(dpool, 2, axis=1), 2, axis=2).reshape(n, 64, c) * (pre > 0)
        g["conv_w"] = np.einsum("npk,npc->kc", cols, dpre)
        g["conv_b"] = dpre.sum(axis=(0, 1))
        return {k: v.astype(F32) for k, v in g.items()}

    def fit(self, x, y, epochs, lr, rng, batch=64):
        for _ in range(epochs):
            order = rng.permutation(len(x))
            for start in range(0, len(x), batch):
                idx = order[start:start + batch]
                logits, cache = self.forward(x[idx])
                self.step(self.backward(cache, softmax_xent(logits, y[idx])[1]), lr)

    def accuracy(self, x, y):
        return float((self.forward(x)[0].argmax(axis=1) == y).mean())

    def to_onnx(self):
        """The trained network as an ONNX model (onnx.helper, opset 19:
        float 8 QDQ needs it), input ``x`` (N, 1, 8, 8), output ``logits``."""
        from onnx import TensorProto, helper, numpy_helper
        p = self.params
        weights = {"conv_w": p["conv_w"].T.reshape(-1, 1, 3, 3), "conv_b": p["conv_b"],
                   "fc1_w": p["fc1_w"], "fc1_b": p["fc1_b"],
                   "fc2_w": p["fc2_w"], "fc2_b": p["fc2_b"]}
        node = helper.make_node
        nodes = [node("Conv", ["x", "conv_w", "conv_b"], ["conv"], kernel_shape=[3, 3],
                      pads=[1, 1, 1, 1]),
                 node("Relu", ["conv"], ["conv_relu"]),
                 node("AveragePool", ["conv_relu"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
                 node("Flatten", ["pool"], ["flat"], axis=1),
                 node("Gemm", ["flat", "fc1_w", "fc1_b"], ["fc1"]),
                 node("Relu", ["fc1"], ["fc1_relu"]),
                 node("Gemm", ["fc1_relu", "fc2_w", "fc2_b"], ["logits"])]
        graph = helper.make_graph(
            nodes, "digits_convnet",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
            [numpy_helper.from_array(np.ascontiguousarray(v, F32), k) for k, v in weights.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def save_convnet(directory, seed=0, epochs=20):
    """Train :class:`ConvNet` as :func:`run_onnx_demo` does (same data split,
    seed and epochs) and write ``convnet.onnx`` and ``convnet_data.npz`` in
    ``directory`` (created if missing): the npz holds ``x`` (the test images,
    float32 (N, 1, 8, 8), named after the model's input) and ``labels`` (their
    int64 digits), what ``quantcore compare MODEL --data NPZ`` takes.
    Returns the two paths."""
    import os
    import onnx
    os.makedirs(directory, exist_ok=True)   # fails (OSError) before the training
    x_tr, y_tr, x_te, y_te = load_data(seed)
    rng = np.random.default_rng(seed)
    net = ConvNet(rng)
    net.fit(x_tr, y_tr, epochs, 1e-2, rng)
    model_path = os.path.join(directory, "convnet.onnx")
    data_path = os.path.join(directory, "convnet_data.npz")
    from ._files import atomic_path
    with atomic_path(model_path) as temporary:      # (a previous file survives a failure)
        onnx.save(net.to_onnx(), temporary)
    with atomic_path(data_path) as temporary:
        np.savez(temporary, x=x_te.reshape(-1, 1, 8, 8).astype(F32),
                 labels=np.asarray(y_te, np.int64))
    return model_path, data_path


#: quantize_static's types per method (Distribution is ORT's float 8 calibrator)
QUANT_TYPES = {"distribution": ("QFLOAT8E4M3FN", "QFLOAT8E4M3FN")}
#: NVIDIA's entropy / mse try every bin as the clip point (in Python): a 512-bin
#: histogram instead of 2048 keeps the demo short
DEMO_OPTIONS = {"nvidia_entropy": {"num_bins": 512}, "nvidia_mse": {"num_bins": 512}}


#: timed runs of each side (alternated, the median printed): the first call
#: of a process pays for imports and ORT's first session, so one run each,
#: ours first, showed quantcore slower than it is
TIMED_RUNS = 5


def _measure(*fns, runs=TIMED_RUNS):
    """For each of ``fns``: (result, seconds, peak bytes): the median of
    ``runs`` timed calls, the functions alternated (one call of each, then
    again), and the tracemalloc peak of one more call (numpy's and Python's
    allocations)."""
    import statistics
    import tracemalloc
    times = [[] for _ in fns]
    results = [None] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            results[i] = fn()
            times[i].append(time.perf_counter() - t0)
    rows = []
    for fn, result, seconds in zip(fns, results, times):
        tracemalloc.start()
        try:
            fn()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        rows.append((result, statistics.median(seconds), peak))
    return rows


def _ort_calibrate(model_path, reader, method, op_types, workdir):
    """ORT's own calibrator, as quantize_static runs it (one collect_data
    call over the whole reader); its progress prints are swallowed."""
    import io
    import os
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
    from .compat import onnxruntime as O
    reader.rewind()
    with contextlib.redirect_stdout(io.StringIO()):
        cal = create_calibrator(model_path, op_types,
                                augmented_model_path=os.path.join(workdir, "augmented.onnx"),
                                calibrate_method=CalibrationMethod[O._method_of(method).name])
        cal.collect_data(reader)
        return cal.compute_data()


def _same_ranges(ours, theirs):
    """Every tensor's lowest / highest (and Distribution's avg / std) equal bit for bit."""
    if set(ours.keys()) != set(theirs.keys()):
        return False
    for name, td in theirs.items():
        for key in ("lowest", "highest", "avg", "std"):
            try:
                want = np.atleast_1d(getattr(td, key))
            except AttributeError:
                continue
            got = np.atleast_1d(getattr(ours[name], key))
            if got.dtype != want.dtype or not np.array_equal(got.view(np.uint8),
                                                             want.view(np.uint8)):
                return False
    return True


def run_onnx_demo(x_tr, y_tr, x_te, y_te, seed=0, epochs=20, batch_size=32):
    """Train :class:`ConvNet`, write it as ONNX, calibrate it with every
    method of :mod:`quantcore.onnx` (ORT's methods: the default call, one
    collect_data over the reader as quantize_static makes it) next to ORT's own calibrators on the
    same model and reader, quantize with ORT's quantize_static and print the
    test accuracies, calibration times and peak traced memory.  Returns
    ``{method: row}`` (row: ``quantized_accuracy``, ``seconds``,
    ``peak_bytes``, and for ORT's methods ``ort_seconds``, ``ort_peak_bytes``,
    ``same_ranges``), plus ``"float"``: the float model's test accuracy."""
    import os
    import tempfile
    import onnx
    from . import onnx as qonnx

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    net = ConvNet(rng)
    net.fit(x_tr, y_tr, epochs, 1e-2, rng)
    numpy_acc = net.accuracy(x_te, y_te)
    # whole batches: ORT's single collect_data call stacks them (equal shapes)
    n_calib = len(x_tr) // batch_size * batch_size
    calib = qonnx.NpzReader({"x": x_tr[:n_calib].reshape(-1, 1, 8, 8)}, batch_size)
    test = qonnx.NpzReader({"x": x_te.reshape(-1, 1, 8, 8)}, 256)
    op_types = qonnx.quantizable_op_types()
    rows = {}
    from .cli_common import quiet_ort
    with tempfile.TemporaryDirectory(prefix="quantcore_demo_") as workdir, quiet_ort():
        model_path = os.path.join(workdir, "convnet.onnx")
        onnx.save(net.to_onnx(), model_path)
        for method in qonnx.METHODS:
            ort_exact = method in qonnx.ORT_METHODS

            def ours():
                calib.rewind()
                # ORT's methods: the default call (one collect_data over the
                # reader, as quantize_static); quantcore's: one call per batch
                return qonnx.calibrate(model_path, calib, method,
                                       passes=None if ort_exact else 1,
                                       options=DEMO_OPTIONS.get(method),
                                       op_types_to_calibrate=op_types)
            if ort_exact:   # both sides, alternated
                (res, seconds, peak), (theirs, ort_seconds, ort_peak) = _measure(
                    ours, lambda: _ort_calibrate(model_path, calib, method, op_types, workdir))
                row = {"seconds": seconds, "peak_bytes": peak, "ort_seconds": ort_seconds,
                       "ort_peak_bytes": ort_peak,
                       "same_ranges": _same_ranges(res.tensors_range, theirs)}
            else:
                [(res, seconds, peak)] = _measure(ours)
                row = {"seconds": seconds, "peak_bytes": peak}
            act_type, weight_type = QUANT_TYPES.get(method, ("QUInt8", "QInt8"))
            qdq_path = os.path.join(workdir, f"convnet.{method}.qdq.onnx")
            qonnx.quantize(model_path, qdq_path, tensors_range=res.tensors_range,
                           activation_type=act_type, weight_type=weight_type)
            ev = qonnx.evaluate(model_path, qdq_path, test, labels=y_te)
            rows["float"] = ev["accuracy"][0]
            row["quantized_accuracy"] = ev["accuracy"][1]
            row["format"] = "fp8" if act_type.startswith("QFLOAT8") else "int8"
            if row["format"] == "fp8":   # the same ranges, ORT's ReLU removal undone
                kept = os.path.join(workdir, f"convnet.{method}.relu.qdq.onnx")
                qonnx.quantize(model_path, kept, tensors_range=res.tensors_range,
                               activation_type=act_type, weight_type=weight_type,
                               extra_options={"QDQKeepRemovableActivations": True})
                row["relu_kept_accuracy"] = _accuracy_keeping_relu(kept, x_te, y_te)
            rows[method] = row

    print(f"\nONNX: a conv net (Conv 3x3 x8 - Relu - AveragePool - Gemm 128x32 - Relu - Gemm) "
          f"trained in NumPy, written with onnx.helper, calibrated on {n_calib} training "
          f"images ({len(calib)} batches of {batch_size}), quantized by ONNX Runtime's "
          f"quantize_static (QDQ)")
    print(f"float32 test accuracy: {100 * rows['float']:.2f}% in ONNX Runtime "
          f"({100 * numpy_acc:.2f}% in NumPy)")
    print(f"calibration time (median of {TIMED_RUNS} runs, the two sides alternated) and peak "
          "traced memory (tracemalloc: numpy + Python), quantcore and ORT's own calibrator on "
          "the same model and reader; ORT's methods: each side's default call")
    print(f"{'method':<32}{'test acc':>9}{'quantcore':>22}{'ORT 1.32':>22}  ranges")
    for method in qonnx.METHODS:
        row = rows[method]
        ours = f"{row['seconds']:.3f} s {row['peak_bytes'] / 2**20:6.2f} MiB"
        theirs = (f"{row['ort_seconds']:.3f} s {row['ort_peak_bytes'] / 2**20:6.2f} MiB"
                  if "ort_seconds" in row else "-")
        same = ("identical" if row["same_ranges"] else "DIFFERENT") if "same_ranges" in row else ""
        label = (f"{method} ({row['format']}{'*' if 'relu_kept_accuracy' in row else ''}"
                 f"{', 512 bins' if method in DEMO_OPTIONS else ''})")
        print(f"{label:<32}{100 * row['quantized_accuracy']:>8.2f}%{ours:>22}{theirs:>22}  {same}")
    slower = [m for m in qonnx.ORT_METHODS if rows[m]["seconds"] > rows[m]["ort_seconds"]]
    if slower:
        print(SLOWER_NOTE.format(methods=", ".join(slower)))
    for method in qonnx.METHODS:
        if "relu_kept_accuracy" in rows[method]:
            print(FP8_NOTE.format(method=method,
                                  acc=100 * rows[method]["relu_kept_accuracy"]))
    print(f"(ONNX part: {time.perf_counter() - t0:.1f} s)")
    return rows


#: why a row can show quantcore slower than ORT on this model
SLOWER_NOTE = (
    "({methods}: slower here. This model's activations are a few hundred KiB per call:\n"
    "  both sides spend their time in ONNX Runtime's session and a few kernel calls per\n"
    "  tensor, where a busy machine's scheduling moves a run by more than the difference;\n"
    "  bench/results/ort-e2e-2core.md times whole quantize calls on larger models.)")
#: why ORT's FP8 row is low (checked on ORT 1.32: onnx.reference gives the
#: same accuracy for the model as written; ORT_ENABLE_BASIC keeps the ReLUs)
FP8_NOTE = (
    "* {method} (fp8): the low accuracy is ONNX Runtime's removal of the ReLUs, not FP8's\n"
    "  precision. quantize_static drops each ReLU in front of a QuantizeLinear, and the\n"
    "  session's Relu + QuantizeLinear fusion does it again: both assume the quantized type\n"
    "  clips negative values (uint8 with zero point 0 does); FP8 is symmetric and keeps them.\n"
    "  With the ReLUs kept (QDQKeepRemovableActivations, session at ORT_ENABLE_BASIC), the\n"
    "  same ranges give {acc:.2f}%.")


def _accuracy_keeping_relu(qdq_path, x, y):
    """Test accuracy of a QDQ model in an ORT session without the extended
    graph optimizations (whose Relu + QuantizeLinear fusion drops ReLUs)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(qdq_path, opts, providers=["CPUExecutionProvider"])
    logits = sess.run(None, {"x": x.reshape(-1, 1, 8, 8)})[0]
    return float((logits.argmax(axis=1) == y).mean())


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
    from ._files import atomic_path
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=90)
    print(f"training curves saved to {path}")
