"""The backward entry points that sum over the tensor, on the device for
cupy input: TF's ``fake_quant_with_min_max_*_gradient`` (float32 sums in
numpy's order), torch's ``_fake_quantize_learnable_*_backward`` (the LSQ
terms of lsq.cu, float64 sums in numpy's order) and NVIDIA's ``Clip``.
Each call is run on numpy and on cupy input, with the same bits, on inputs
long enough for numpy's pairwise tree to have several levels; a 1e5-element
call moves no tensor-sized data between host and device."""
import numpy as np
import pytest

import quantcore_gpu
from reference import assert_bits_equal, to_numpy

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON))]

F32 = np.float32


def _data(seed, shape, scale=3.0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * scale).astype(F32)
    g = (rng.normal(size=shape) * np.exp2(rng.integers(-6, 6, shape))).astype(F32)
    flat = x.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    g.reshape(-1)[5] = np.nan
    return x, g


def same_both_ways(call, *arrays):
    """``call`` on numpy arrays and on their cupy copies: every result of the
    cupy call is a cupy array with the numpy call's bits."""
    host = call(*arrays)
    dev = call(*(cp.asarray(a) if isinstance(a, np.ndarray) else a for a in arrays))
    host = host if isinstance(host, tuple) else (host,)
    dev = dev if isinstance(dev, tuple) else (dev,)
    assert len(host) == len(dev)
    for h, d in zip(host, dev):
        assert isinstance(d, cp.ndarray), type(d)
        assert d.shape == np.shape(h) and d.dtype == np.asarray(h).dtype
        assert_bits_equal(to_numpy(d), np.asarray(h))


# ------------------------------------------------------------ TensorFlow
@pytest.mark.parametrize("shape", [(7,), (3000, 7), (20001,), (250, 40, 1)])
def test_tensorflow_gradients_on_the_device(shape):
    from quantcore.compat import tensorflow as tf
    x, g = _data(1, shape)
    d = shape[-1]
    same_both_ways(lambda g, x: tf.fake_quant_with_min_max_args_gradient(g, x, -2.5, 4.0), g, x)
    for mn, mx in ((F32(-2.5), F32(4.0)), (F32(0), F32(0)), (F32(-1e-3), F32(0.2))):
        same_both_ways(lambda g, x, mn, mx: tf.fake_quant_with_min_max_vars_gradient(
            g, x, mn, mx, num_bits=5), g, x, np.asarray(mn), np.asarray(mx))
        # host min / max with device tensors
        same_both_ways(lambda g, x: tf.fake_quant_with_min_max_vars_gradient(g, x, mn, mx),
                       g, x)
    cmn = np.linspace(-3, -0.5, d).astype(F32)
    cmx = np.linspace(0.5, 6, d).astype(F32)
    cmn[::3], cmx[::3] = 0, 0  # channels with min == max == 0
    same_both_ways(lambda g, x, a, b: tf.fake_quant_with_min_max_vars_per_channel_gradient(
        g, x, a, b, narrow_range=True), g, x, cmn, cmx)


def test_tensorflow_gradient_sums_are_numpy_pairwise():
    """The test can fail: d_min over 20001 values in another order (a
    running sum) gives other bits."""
    from quantcore.compat import tensorflow as tf
    x, g = _data(2, (20001,), scale=10.0)
    x[:4], g[5] = -20.0, 1.0  # finite: NaN * 0 would make the sum NaN
    x[np.abs(x + 1) < 0.01] = 0  # (the nudged min is -1.0039)
    _, dmin, _ = tf.fake_quant_with_min_max_vars_gradient(cp.asarray(g), cp.asarray(x),
                                                          cp.asarray(F32(-1)), cp.asarray(F32(1)))
    below = np.where(x < -1, g, F32(0))
    running = F32(0)
    for v in below:
        running = F32(running + v)
    assert running != np.sum(below, dtype=F32)
    assert_bits_equal(dmin.get(), np.sum(below, dtype=F32, initial=F32(0)))


# ------------------------------------------------------------ torch LSQ
@pytest.mark.parametrize("qmin, qmax", [(0, 255), (-128, 127), (-2 ** 31, 2 ** 31 - 1)])
@pytest.mark.parametrize("gf", [1.0, 0.25])
def test_learnable_per_tensor_backward_on_the_device(qmin, qmax, gf):
    from quantcore.compat import torch as T
    x, g = _data(3, (40, 257))
    if qmin < -1000:
        x = x * F32(1e9)
    for s, z in ((0.05, 2.4), (0.013, 251.7), (1e-8, 0.5)):
        scale, zp = np.array([s], F32), np.array([min(z, qmax)], F32)
        same_both_ways(lambda x, s_, z_: T.fake_quantize_learnable_per_tensor_affine(
            x, s_, z_, qmin, qmax, gf), x, scale, zp)
        same_both_ways(lambda g, x, s_, z_: T.fake_quantize_learnable_per_tensor_affine_backward(
            g, x, s_, z_, qmin, qmax, gf), g, x, scale, zp)
    # dY of another shape of the same size, broadcast against X (torch's TensorIterator)
    same_both_ways(lambda g, x: T.fake_quantize_learnable_per_tensor_affine_backward(
        g, x, np.array([0.05], F32), np.array([3.0], F32), qmin, qmax), g[None], x)


@pytest.mark.parametrize("shape, axis", [((4, 3000), 0), ((6, 8, 50), 1), ((30, 2, 9), 2),
                                         ((5000,), 0)])
def test_learnable_per_channel_backward_on_the_device(shape, axis):
    from quantcore.compat import torch as T
    x, g = _data(4, shape)
    C = shape[axis]
    scale = np.linspace(0.01, 0.2, C).astype(F32)
    zp = np.linspace(-3.6, 140.2, C).astype(F32)
    for qmin, qmax, gf in ((0, 255, 1.0), (-128, 127, 0.5)):
        z = np.clip(zp, qmin, qmax).astype(F32)
        same_both_ways(lambda g, x, s_, z_: T.fake_quantize_learnable_per_channel_affine_backward(
            g, x, s_, z_, axis, qmin, qmax, gf), g, x, scale, z)
        same_both_ways(lambda x, s_, z_: T.fake_quantize_learnable_per_channel_affine(
            x, s_, z_, axis, qmin, qmax, gf), x, scale, z)


def test_learnable_backward_of_empty_input_returns_the_given_arrays():
    from quantcore.compat import torch as T
    e = cp.zeros((0, 3), F32)
    s, z = cp.asarray(np.array([0.5], F32)), cp.asarray(np.array([1.0], F32))
    dx, ds, dz = T.fake_quantize_learnable_per_tensor_affine_backward(e, e, s, z, 0, 255)
    assert dx is e and ds is s and dz is z


# ------------------------------------------------------------ NVIDIA Clip
def test_nvidia_clip_on_the_device():
    from quantcore.compat import nvidia as nv
    x, _ = _data(5, (300, 7))
    for lo, hi in ((-1.5, 2.0), (0.0, 0.0), (np.float32(-1), np.float32(np.inf))):
        same_both_ways(lambda x: nv.Clip(lo, hi)(x), x)
        same_both_ways(lambda x: nv.Clip(lo, hi).forward(x.astype(np.float64)), x)


# ------------------------------------------------------------ traffic
N = 100_000


def moved(step):
    """(bytes to the host, bytes to the device) while ``step()`` runs."""
    before = dict(cp.TRANSFERS)
    step()
    return (cp.TRANSFERS["to_host"] - before["to_host"],
            cp.TRANSFERS["to_device"] - before["to_device"])


@pytest.mark.skipif(not hasattr(cp, "TRANSFERS"),
                    reason="needs the CUDA emulator's transfer counters")
def test_gradients_move_no_tensor():
    """Only scalars and per-channel values cross: TF's gradients with device
    min / max move nothing but kernel arguments; the LSQ backward reads
    scale[0] / zero_point[0] (per channel: the C values) as torch does."""
    from quantcore.compat import nvidia as nv
    from quantcore.compat import tensorflow as tf
    from quantcore.compat import torch as T
    x, g = (cp.asarray(a) for a in _data(6, (10, N // 10)))
    mn, mx = cp.asarray(F32(-2)), cp.asarray(F32(3))
    cmn = cp.asarray(np.full(N // 10, -1.0, F32))
    cmx = cp.asarray(np.full(N // 10, 2.0, F32))
    s1, z1 = cp.asarray(np.array([0.05], F32)), cp.asarray(np.array([3.0], F32))
    sc = cp.asarray(np.linspace(0.01, 0.1, 10).astype(F32))
    zc = cp.asarray(np.linspace(0, 9, 10).astype(F32))
    limit = 64 + 16 * (N // 10)  # the per-channel values of the widest call, and scalars
    assert limit < N * 4 // 2
    for call in (lambda: tf.fake_quant_with_min_max_args_gradient(g, x, -2.0, 3.0),
                 lambda: tf.fake_quant_with_min_max_vars_gradient(g, x, mn, mx),
                 lambda: tf.fake_quant_with_min_max_vars_per_channel_gradient(g, x, cmn, cmx),
                 lambda: T.fake_quantize_learnable_per_tensor_affine_backward(g, x, s1, z1, 0,
                                                                              255),
                 lambda: T.fake_quantize_learnable_per_channel_affine_backward(g, x, sc, zc, 0,
                                                                               0, 255),
                 lambda: nv.Clip(-1.0, 1.0)(x)):
        to_host, to_device = moved(call)
        assert to_host <= limit and to_device <= limit, (to_host, to_device)
    assert moved(lambda: tf.fake_quant_with_min_max_vars_gradient(g, x, mn, mx))[0] == 0
