"""How thin the framework layers are: each compat call at 1 Ki elements
against the core call it maps to and, where the framework is installed, the
framework's own op.

Target (issue 16): every compat call within 2x of its core call, and never
slower than the framework's own op.  ``bench/summary.py --compat`` prints
the ratios of a run; nothing here asserts a time.
"""
import numpy as np
import pytest

import quantcore as qc
from benchutil import KI, annotate

N = KI
RNG = np.random.default_rng(0)
X = RNG.normal(size=(16, 64)).astype(np.float32)   # 1 Ki elements, 16 channels on axis 0
SCALES = np.linspace(0.01, 0.05, 16).astype(np.float32)
ZPS = np.zeros(16, np.int32)


def _torch():
    return pytest.importorskip("torch")


def _tf():
    return pytest.importorskip("tensorflow")


def _cases():
    """name -> {impl: factory returning a zero-argument callable}."""
    from quantcore.compat import horizon as hz
    from quantcore.compat import mindspore as ms
    from quantcore.compat import nvidia as nv
    from quantcore.compat import oneflow as of
    from quantcore.compat import tensorflow as tfq
    from quantcore.compat import torch as T

    # the cheapest core call computing the same thing: the framework's
    # nudged range (computed once here) as scalars, so that the core's
    # per-tensor fast path runs
    tf_min, tf_max, tf_scale, tf_inv, tf_zero = (
        v[0] for v in qc.qparams.nudge_tensorflow(np.float32(-1.5), np.float32(2.0), 0, 255))
    ms_min, ms_max, ms_scale = (
        v[0] for v in qc.qparams.nudge_mindspore(np.float32(-6), np.float32(6), 0, 255))

    def torch_tensor():
        return _torch().from_numpy(X)

    cases = {
        "torch_fake_quantize_per_tensor_affine": {
            "compat": lambda: lambda: T.fake_quantize_per_tensor_affine(X, 0.05, 3, 0, 255),
            "core": lambda: lambda: qc.fake_quant(X, 0.05, 3, 0, 255),
            "framework": lambda: (lambda t: lambda: _torch().fake_quantize_per_tensor_affine(
                t, 0.05, 3, 0, 255))(torch_tensor()),
        },
        "torch_fake_quantize_per_channel_affine": {
            "compat": lambda: lambda: T.fake_quantize_per_channel_affine(X, SCALES, ZPS, 0,
                                                                         -128, 127),
            "core": lambda: lambda: qc.fake_quant(X, SCALES, ZPS, -128, 127, axis=0),
            "framework": lambda: (lambda t, s, z: lambda: _torch().fake_quantize_per_channel_affine(
                t, s, z, 0, -128, 127))(torch_tensor(), _torch().from_numpy(SCALES),
                                        _torch().from_numpy(ZPS)),
        },
        "torch_FakeQuantize": {
            "compat": lambda: (lambda fq: lambda: fq(X))(T.FakeQuantize()),
            "core": lambda: (lambda fq: lambda: fq(X))(qc.FakeQuantize()),
            "framework": lambda: (lambda fq, t: lambda: fq(t))(
                _torch().ao.quantization.FakeQuantize(), torch_tensor()),
        },
        "torch_MinMaxObserver": {
            "compat": lambda: (lambda o: lambda: o(X))(T.MinMaxObserver()),
            "core": lambda: (lambda o: lambda: o(X))(qc.MinMaxObserver()),
            "framework": lambda: (lambda o, t: lambda: o(t))(
                _torch().ao.quantization.MinMaxObserver(), torch_tensor()),
        },
        "tf_fake_quant_with_min_max_args": {
            "compat": lambda: lambda: tfq.fake_quant_with_min_max_args(X, -1.5, 2.0),
            "core": lambda: lambda: qc.fake_quant_nudged(X, tf_min, tf_max, tf_scale,
                                                         inv_scale=tf_inv, quant_zero=tf_zero),
            "framework": lambda: (
                lambda tf, t: lambda: tf.quantization.fake_quant_with_min_max_args(
                    t, -1.5, 2.0))(_tf(), _tf().constant(X)),
        },
        "tf_fake_quant_with_min_max_vars": {
            "compat": lambda: lambda: tfq.fake_quant_with_min_max_vars(
                X, np.float32(-1.5), np.float32(2.0)),
            "core": lambda: lambda: qc.fake_quant_nudged(X, tf_min, tf_max, tf_scale,
                                                         inv_scale=tf_inv, quant_zero=tf_zero,
                                                         scale_op="div"),
            "framework": lambda: (
                lambda tf, t: lambda: tf.quantization.fake_quant_with_min_max_vars(
                    t, -1.5, 2.0))(_tf(), _tf().constant(X)),
        },
        "nvidia_fake_tensor_quant": {
            "compat": lambda: lambda: nv.fake_tensor_quant(X, np.float32(2.5)),
            "core": lambda: lambda: qc.fake_quant_amax(X, 2.5, 8),
        },
        "mindspore_FakeQuantWithMinMaxObserver": {
            "compat": lambda: (lambda fq: lambda: fq(X))(ms.FakeQuantWithMinMaxObserver()),
            "core": lambda: lambda: qc.fake_quant_nudged(
                X, ms_min, ms_max, ms_scale, inv_scale=ms_scale, quant_zero=0.0,
                formula="mindspore", scale_op="div"),
        },
        "oneflow_FakeQuantization": {
            "compat": lambda: (lambda fq, s, z: lambda: fq(X, s, z))(
                of.FakeQuantization(), np.array([0.02], np.float32), np.array([0], np.float32)),
            "core": lambda: lambda: qc.fake_quant(X, np.float32(0.02), 0, -128, 127,
                                                  zero_point_add="none", scale_op="div"),
        },
        "horizon_FakeQuantize": {
            "compat": lambda: (lambda fq: lambda: fq(X))(hz.FakeQuantize()),
            "core": lambda: (lambda fq: lambda: fq(X))(
                qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.01), -128, 127, symmetric=True)),
        },
    }
    return cases


CASES = sorted(_cases())


@pytest.mark.parametrize("impl", ["compat", "core", "framework"])
@pytest.mark.parametrize("name", CASES)
def test_compat_overhead(benchmark, name, impl):
    factories = _cases()[name]
    if impl not in factories:
        pytest.skip(f"{name}: no {impl} implementation")
    call = factories[impl]()
    call()  # warm-up (first-call caches, module imports)
    annotate(benchmark, f"compat_{name}", N, impl, 8 * N)
    benchmark(call)
