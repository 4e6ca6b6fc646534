"""Bad-input matrix over the core API, FakeQuantize and every compat layer.

Every case gets either a clear exception (type AND message checked) or a
documented result (checked: equal to the clean-input result, or the value
the layer's non-finite policy gives; see docs/NONFINITE.md and the compat
module docstrings).  No case may crash, hang, modify its input or write
outside its output (``test_no_writes_outside_out``).

Categories (issue 9): dtype (int, bool, complex, object, big-endian), empty,
0-d, non-contiguous, Fortran order, read-only input, read-only out, out of
wrong shape / dtype, aliasing out, NaN / +-inf in data, NaN / +-inf in
qparams, scale <= 0, qmin >= qmax, bits out of range, axis out of range,
channel mismatch, lists and scalars.
"""
import collections
import os
import warnings

import numpy as np
import pytest

import quantcore as qc
from quantcore.compat import horizon as hz
from quantcore.compat import mindspore as ms
from quantcore.compat import nvidia as nv
from quantcore.compat import oneflow as of
from quantcore.compat import tensorflow as tf
from quantcore.compat import torch as tq

from reference import bits_equal

F32 = np.float32
X = np.linspace(-1, 1, 24, dtype=F32).reshape(2, 3, 4)
XNAN = X.copy()
XNAN[0, 0, :3] = (np.nan, np.inf, -np.inf)


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _noncontig(a):
    """A strided view holding the values of ``a`` (same shape)."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


VARIANTS = {  # name -> (variant of X, same values as X?)
    "big-endian": lambda: X.astype(">f4"),
    "non-contiguous": lambda: _noncontig(X),
    "Fortran order": lambda: np.asfortranarray(X),
    "read-only input": lambda: _readonly(X),
}

Case = collections.namedtuple("Case", "layer category call exc message check")
CASES = []


def raises(layer, category, call, exc, message):
    CASES.append(Case(layer, category, call, exc, message, None))


def result(layer, category, call, check):
    """A documented result: ``check(value)`` must hold."""
    CASES.append(Case(layer, category, call, None, None, check))


def same_as_clean(layer, fn, variants=VARIANTS, clean=X):
    """Layout / byte order / read-only do not change the result."""
    for category, make in variants.items():
        result(layer, category, lambda make=make: (fn(make()), fn(clean.copy())),
               lambda pair: _all_bits_equal(pair[0], pair[1]))


def _all_bits_equal(a, b):
    if isinstance(a, tuple):
        return all(_all_bits_equal(u, v) for u, v in zip(a, b))
    return bits_equal(np.asarray(a), np.asarray(b))


def _float32_values(expected, dtype=F32):
    expected = np.asarray(expected, dtype)
    return lambda y: np.asarray(y).dtype == dtype and np.array_equal(
        np.asarray(y).ravel()[:expected.size], expected, equal_nan=True)


# ------------------------------------------------------------------- core
CORE = "core"
fq8 = lambda x, **kw: qc.fake_quant(x, 0.1, 0, -128, 127, **kw)  # noqa: E731
for dtype, name in ((np.int32, "int32"), (np.bool_, "bool"), (np.complex64, "complex64"),
                    (object, "object")):
    raises(CORE, "dtype", lambda dtype=dtype: fq8(X.astype(dtype)), TypeError,
           f"fake_quant: x must have a floating dtype (float16, float32 or float64), got {name}")
raises(CORE, "dtype", lambda: qc.minmax(X.astype(np.uint8)), TypeError,
       "minmax: x must have a floating dtype")
same_as_clean(CORE, fq8)
same_as_clean(CORE, lambda x: qc.minmax(x, axis=1), {"Fortran order": VARIANTS["Fortran order"],
                                                      "non-contiguous": VARIANTS["non-contiguous"]})
result(CORE, "empty", lambda: fq8(np.zeros((0, 3), F32)),
       lambda y: y.shape == (0, 3) and y.dtype == F32)
result(CORE, "empty", lambda: qc.minmax(np.zeros((0, 3), F32), axis=1),
       lambda r: np.all(r[0] == np.inf) and np.all(r[1] == -np.inf) and r[0].shape == (3,))
result(CORE, "0-d", lambda: fq8(np.array(0.26, F32)), _float32_values([0.3]))
result(CORE, "0-d", lambda: qc.minmax(np.array(2.5, F32)),
       lambda r: r[0].shape == () and float(r[0]) == float(r[1]) == 2.5)
raises(CORE, "0-d", lambda: qc.minmax(np.array(2.5, F32), axis=0), ValueError,
       "minmax: axis 0 is out of range for an array of ndim 0")
raises(CORE, "read-only out", lambda: fq8(X, out=_readonly(X)), ValueError,
       "fake_quant: out is read-only")
raises(CORE, "out shape", lambda: fq8(X, out=np.empty((2, 3), F32)), ValueError,
       "fake_quant: out has shape (2, 3), expected (2, 3, 4)")
raises(CORE, "out dtype", lambda: fq8(X, out=np.empty(X.shape, np.float64)), TypeError,
       "fake_quant: out has dtype float64, expected float32")
raises(CORE, "out dtype", lambda: qc.ste_backward(X, X > 0, out=np.empty(X.shape, np.int32)),
       TypeError, "ste_backward: out has dtype int32")


def _aliased(shift):
    buf = np.linspace(-2, 2, 30, dtype=F32)
    x = buf[:24]
    expect = fq8(x.copy())
    return fq8(x, out=buf[shift:shift + 24]), expect


result(CORE, "aliasing out", lambda: _aliased(0), lambda r: bits_equal(*r))   # in place
result(CORE, "aliasing out", lambda: _aliased(3), lambda r: bits_equal(*r))   # overlap
result(CORE, "NaN/inf data", lambda: fq8(XNAN),  # NONFINITE.md: propagate, clamp
       _float32_values([np.nan, 12.7, -12.8]))
result(CORE, "NaN/inf data", lambda: fq8(XNAN, nonfinite="nan_to_qmin"),
       _float32_values([-12.8, 12.7, -12.8]))
result(CORE, "NaN/inf data", lambda: qc.minmax(XNAN),
       lambda r: np.isnan(r[0]) and np.isnan(r[1]))
result(CORE, "NaN/inf data", lambda: qc.minmax(XNAN, nan_policy="omit"),
       lambda r: r[0] == -np.inf and r[1] == np.inf)
for bad in (np.nan, np.inf, -np.inf, 0.0, -0.5):
    raises(CORE, "NaN/inf qparams" if not np.isfinite(bad) else "scale <= 0",
           lambda bad=bad: qc.fake_quant(X, bad, 0, -128, 127), ValueError,
           "fake_quant: scale must be finite and > 0")
raises(CORE, "NaN/inf qparams", lambda: qc.fake_quant(X, 0.1, np.inf, -128, 127), ValueError,
       "zero_point")
raises(CORE, "NaN/inf qparams", lambda: qc.fake_quant_amax(X, np.nan), ValueError,
       "fake_quant_amax: amax must be finite and >= 0")
raises(CORE, "qmin >= qmax", lambda: qc.fake_quant(X, 0.1, 0, 5, 5), ValueError,
       "fake_quant: quant_min must be < quant_max, got quant_min=5, quant_max=5")
raises(CORE, "bits", lambda: qc.fake_quant_amax(X, 1.0, 17), ValueError,
       "fake_quant_amax: num_bits must be in 2..16, got 17")
raises(CORE, "bits", lambda: qc.quantize(X, 0.1, 0, 0, 255, dtype=np.int8), ValueError,
       "cannot hold")
raises(CORE, "axis", lambda: qc.fake_quant(X, 0.1, 0, -128, 127, axis=3), ValueError,
       "fake_quant: axis 3 is out of range for an array of ndim 3")
raises(CORE, "axis", lambda: qc.minmax(X, axis=-4), ValueError, "axis -4 is out of range")
raises(CORE, "channels", lambda: qc.fake_quant(X, [0.1, 0.2], 0, -128, 127, axis=1), ValueError,
       "fake_quant: scale must be a 1-D array of 3 values (x.shape[axis]), got shape (2,)")
raises(CORE, "channels", lambda: qc.ste_backward(X, np.ones((3, 4), bool)), ValueError,
       "ste_backward: mask has shape (3, 4)")
result(CORE, "lists and scalars", lambda: (fq8([[0.26, -0.04]]), fq8(np.array([[0.26, -0.04]]))),
       lambda pair: bits_equal(*pair))  # Python floats are float64, as numpy reads them
result(CORE, "lists and scalars", lambda: (fq8(0.26), fq8(np.float64(0.26))),
       lambda pair: bits_equal(*pair))
raises(CORE, "lists and scalars", lambda: fq8([0.1, "a"]), TypeError,
       "fake_quant: x must have a floating dtype")
raises(CORE, "lists and scalars", lambda: fq8([[0.1], [0.1, 0.2]]), TypeError,
       "fake_quant: x must be a float array, got list")

raises(CORE, "C overflow", lambda: qc.fake_quant(X, 0.1, 0, 2 ** 70, 2 ** 71), ValueError,
       "fake_quant: quant_min must fit a 64-bit integer, got an integer of 71 bits")
raises(CORE, "C overflow", lambda: qc.fake_quant(X, 0.1, 0, -(2 ** 1100), 127), ValueError,
       "fake_quant: quant_min must fit a 64-bit integer")
raises(CORE, "C overflow", lambda: qc.fake_quant(X, 0.1, 0, -128, 1e300), ValueError,
       "fake_quant: quant_max must fit a 64-bit integer")
raises(CORE, "names", lambda: qc.fake_quant(X, 0.1, 0, -128, 127, rounding=["half_even"]),
       ValueError, "fake_quant: rounding must be one of")
raises(CORE, "names", lambda: qc.minmax(X, nan_policy=["omit"]), ValueError,
       "minmax: nan_policy must be 'propagate' or 'omit'")


def _broadcast_reduced_in_place():
    """A stride-0 (broadcast) input is reduced without a copy of its repeats
    (np.broadcast_to(1.5, 2**31) would otherwise copy 8 GiB)."""
    import tracemalloc
    x = np.broadcast_to(F32(1.5), 2 ** 24)
    x2 = np.broadcast_to(np.arange(3, dtype=F32)[:, None], (3, 2 ** 22))
    tracemalloc.start()
    try:
        r = qc.minmax(x), qc.minmax(x2, axis=0), qc.MinMaxObserver(axis=0)(x2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 ** 20, peak
    return (float(r[0][0]) == float(r[0][1]) == 1.5 and r[1][0].tolist() == [0, 1, 2]
            and r[1][1].tolist() == [0, 1, 2])


result(CORE, "non-contiguous", _broadcast_reduced_in_place, bool)

# ---------------------------------------------------------------- formats
FMT = "formats"
W = np.linspace(-2, 2, 128, dtype=F32).reshape(4, 32)
raises(FMT, "C overflow", lambda: qc.group_quantize(W, group_size=2 ** 70), ValueError,
       "group_quantize: group_size must fit a 64-bit integer")
raises(FMT, "C overflow", lambda: qc.mx_fake_quant(W, "e2m1", block_size=2 ** 70), ValueError,
       "mx_fake_quant: block_size must fit a 64-bit integer")
raises(FMT, "C overflow", lambda: qc.unpack_int4(np.zeros(4, np.uint8), 2 ** 64), ValueError,
       "unpack_int4: n must fit a 64-bit integer")
raises(FMT, "C overflow", lambda: qc.group_quantize(W, 8, 32, recipe="torchao",
                                                    quant_min=-(2 ** 70)), ValueError,
       "quant_min must fit a 64-bit integer")
result(FMT, "C overflow", lambda: qc.group_quantize(W, group_size=2 ** 62)[1].shape,
       lambda shape: shape == (4, 1))  # one (shorter) group per row
raises(FMT, "names", lambda: qc.group_quantize(W, recipe=["onnx"]), ValueError,
       "group_quantize: recipe must be one of")
raises(FMT, "names", lambda: qc.mx_fake_quant(W, ["e2m1"]), ValueError, "mx_fake_quant")
raises(FMT, "names", lambda: qc.fp8_fake_quant(W, 1.0, ["e4m3fn"]), ValueError,
       "fp8_fake_quant")
raises(FMT, "names", lambda: qc.nvfp4_fake_quant(W, recipe={"modelopt": 1}), ValueError,
       "nvfp4_fake_quant: recipe must be one of")
result(FMT, "empty", lambda: [a.shape for a in qc.group_quantize(np.zeros((4, 0), F32))],
       lambda shapes: shapes == [(4, 0), (4, 0), (4, 0)])
result(FMT, "empty", lambda: [a.shape for a in qc.group_quantize(np.zeros((0, 64), F32),
                                                                   group_size=32)],
       lambda shapes: shapes == [(0, 64), (0, 2), (0, 2)])
result(FMT, "empty", lambda: qc.mx_fake_quant(np.zeros((0, 32), F32), "e4m3").shape,
       lambda shape: shape == (0, 32))
raises(FMT, "0-d", lambda: qc.unpack_int4(np.uint8(3), 1), ValueError,
       "unpack_int4: packed must have at least one dimension")
raises(FMT, "0-d", lambda: qc.group_quantize(np.float32(1)), ValueError,
       "group_quantize: w must have at least one dimension")
raises(FMT, "dtype", lambda: qc.unpack_int4(np.zeros(4, np.uint16), 2), TypeError,
       "unpack_int4: packed must be uint8 / int8 bytes, got uint16")
for b in (0, 1, 9, 33):
    raises(FMT, "bits", lambda b=b: qc.group_dequantize(
        np.zeros((4, 32), np.uint8), np.ones((4, 1), F32), np.zeros((4, 1), F32), 32,
        recipe="tinygemm", bits=b), ValueError, f"group_dequantize: bits must be in 2..8, got {b}")
for g in (0, -1, np.nan, np.inf):
    raises(FMT, "NaN/inf qparams" if not np.isfinite(g) else "scale <= 0",
           lambda g=g: qc.nvfp4_fake_quant(W, global_scale=g), ValueError,
           "nvfp4_fake_quant: global_scale must be finite and > 0")
for a in (np.inf, np.nan, -1.0):
    raises(FMT, "NaN/inf qparams" if not np.isfinite(a) else "scale <= 0",
           lambda a=a: qc.fp8_fake_quant(W, amax=a), ValueError,
           "fp8_fake_quant: amax must be >= 0 and finite")
result(FMT, "scale <= 0", lambda: qc.nvfp4_fake_quant(np.zeros((2, 16), F32)),
       lambda y: y.shape == (2, 16))  # the computed default g of a zero x is 0: allowed


def _block_aliased(fn, n, shift):
    buf = np.random.default_rng(0).standard_normal(n + shift).astype(F32)
    expect = fn(buf[shift:].copy(), None)
    return fn(buf[shift:], buf[:n]), expect


for name, fn, n in (("mx", lambda x, o: qc.mx_fake_quant(x, "e2m1", out=o), 128),
                    ("nvfp4", lambda x, o: qc.nvfp4_fake_quant(x, out=o), 64)):
    for shift in (0, 1, 5):
        result(FMT, "aliasing out", lambda fn=fn, n=n, shift=shift: _block_aliased(fn, n, shift),
               lambda r: bits_equal(*r))

# ----------------------------------------------------------- FakeQuantize
FQ = "FakeQuantize"


def _fq(x, **kw):
    fq = qc.FakeQuantize(qc.MinMaxObserver(), -128, 127)
    return fq(x, **kw)


raises(FQ, "dtype", lambda: _fq(X.astype(np.int64)), TypeError,
       "FakeQuantize.forward: x must have a floating dtype (float16, float32 or float64), "
       "got int64")
raises(FQ, "dtype", lambda: _fq(X.astype(np.complex128)), TypeError, "got complex128")
raises(FQ, "dtype", lambda: _fq(X.astype(bool)), TypeError, "got bool")
same_as_clean(FQ, _fq)
result(FQ, "empty", lambda: _fq(np.zeros((0, 4), F32)), lambda y: y.shape == (0, 4))
result(FQ, "0-d", lambda: _fq(np.array(0.5, F32)), lambda y: y.shape == () and y == 0.5)
raises(FQ, "read-only out", lambda: _fq(X, out=_readonly(X)), ValueError,
       "FakeQuantize.forward: out is read-only")
raises(FQ, "out shape", lambda: _fq(X, out=np.empty(3, F32)), ValueError,
       "FakeQuantize.forward: out has shape (3,)")
raises(FQ, "out dtype", lambda: _fq(X, out=np.empty(X.shape, np.float16)), TypeError,
       "FakeQuantize.forward: out has dtype float16, expected float32")


def _fq_in_place():
    x = X.copy()
    y = _fq(x, out=x)
    return y is x and bits_equal(x, _fq(X.copy()))


result(FQ, "aliasing out", _fq_in_place, bool)


def _fq_nan_batch():
    fq = qc.FakeQuantize(qc.MinMaxObserver(), -128, 127)
    fq(X)
    scale = fq.scale.copy()
    with pytest.warns(RuntimeWarning, match="NaN or inf was skipped"):
        y = fq(XNAN)
    return (bits_equal(fq.scale, scale) and fq.observer.nonfinite_batches == 1
            and np.isnan(y.flat[0]))


result(FQ, "NaN/inf data", _fq_nan_batch, bool)


def _fq_with_scale(scale, zero_point=0):
    fq = qc.FakeQuantize(qc.MinMaxObserver(), -128, 127).eval()
    fq.scale = np.array([scale], F32)
    fq.zero_point = zero_point
    return fq(X)


raises(FQ, "scale <= 0", lambda: _fq_with_scale(0.0), ValueError,
       "scale must be finite and > 0")
raises(FQ, "NaN/inf qparams", lambda: _fq_with_scale(np.nan), ValueError,
       "scale must be finite and > 0")
raises(FQ, "NaN/inf qparams", lambda: _fq_with_scale(np.inf), ValueError,
       "scale must be finite and > 0")
raises(FQ, "NaN/inf qparams", lambda: _fq_with_scale(0.1, 1000), ValueError,
       "zero_point must lie in")
raises(FQ, "NaN/inf qparams", lambda: _fq_with_scale(0.1, 2.5), ValueError,
       "zero_point must be integral")
raises(FQ, "qmin >= qmax", lambda: qc.FakeQuantize(quant_min=3, quant_max=3), ValueError,
       "FakeQuantize: quant_min must be < quant_max")
raises(FQ, "C overflow", lambda: qc.FakeQuantize(quant_min=0, quant_max=2 ** 64), ValueError,
       "FakeQuantize: quant_max must fit a 64-bit integer")
for eps in (-1.0, np.nan, np.inf):
    raises(FQ, "NaN/inf qparams", lambda eps=eps: qc.FakeQuantize(eps=eps), ValueError,
           "FakeQuantize: eps must be finite and >= 0")
raises(FQ, "NaN/inf qparams", lambda: qc.MomentumMinMaxObserver(momentum=np.nan), ValueError,
       "MomentumMinMaxObserver: momentum must be in [0, 1]")
raises(FQ, "NaN/inf qparams", lambda: qc.EMAMinMaxObserver(min_init=-np.inf), ValueError,
       "EMAMinMaxObserver: min_init / max_init must be finite with min_init <= max_init")
raises(FQ, "qmin >= qmax", lambda: qc.EMAMinMaxObserver(min_init=1.0, max_init=0.0), ValueError,
       "min_init <= max_init")
raises(FQ, "C overflow", lambda: qc.GroupFakeQuantize(group_size=2 ** 64), ValueError,
       "GroupFakeQuantize: group_size must fit a 64-bit integer")
raises(FQ, "bits", lambda: qc.GroupFakeQuantize(group_size=0), ValueError,
       "GroupFakeQuantize: group_size must be >= 1, got 0")
raises(FQ, "names", lambda: qc.FakeQuantize(eps="0.1"), TypeError,
       "FakeQuantize: eps must be a real number")
raises(FQ, "names", lambda: qc.FakeQuantize(rounding=["half_even"]), ValueError,
       "FakeQuantize: rounding must be one of")
raises(FQ, "axis", lambda: qc.FakeQuantize(qc.MinMaxObserver(axis=5), axis=5)(X), ValueError,
       "axis 5 is out of range for an array of ndim 3")
raises(FQ, "channels", lambda: qc.FakeQuantize(qc.MinMaxObserver(), axis=1), ValueError,
       "FakeQuantize: axis=1 but the observer has axis=None")


def _fq_backward_shape():
    fq = qc.FakeQuantize()
    fq(X)
    return fq.backward(np.ones(5, F32))


raises(FQ, "channels", _fq_backward_shape, ValueError,
       "FakeQuantize.backward: grad_output has shape (5,), the last forward had (2, 3, 4)")
result(FQ, "lists and scalars", lambda: _fq([0.5, -0.25]),
       lambda y: y.dtype == np.float64 and y.shape == (2,))

# ------------------------------------------------------------------ torch
TORCH = "compat.torch"
pt = lambda x: tq.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127)  # noqa: E731
pc = lambda x, s=np.full(3, 0.1, F32), z=np.zeros(3, np.int32), axis=1: \
    tq.fake_quantize_per_channel_affine(x, s, z, axis, -128, 127)  # noqa: E731
raises(TORCH, "dtype", lambda: pt(X.astype(np.int32)), NotImplementedError,  # as torch
       "\"fake_quantize_tensor_cachemask_kernel_type_handling\" not implemented for 'Int'")
raises(TORCH, "dtype", lambda: pc(X.astype(np.complex64)), TypeError,
       "fake_quantize_per_channel_affine: x must have a floating dtype")
raises(TORCH, "dtype", lambda: tq.MinMaxObserver()(X.astype(object)), TypeError,
       "MinMaxObserver.forward: x must have a floating dtype")
same_as_clean(TORCH, pt)
same_as_clean(TORCH, pc, {"Fortran order": VARIANTS["Fortran order"]})
result(TORCH, "empty", lambda: pt(np.zeros((0, 2), F32)), lambda y: y.shape == (0, 2))
raises(TORCH, "0-d", lambda: pc(np.array(0.5, F32)), IndexError,  # torch's error
       "Dimension specified as 1 but tensor has no dimensions")
result(TORCH, "NaN/inf data", lambda: pt(XNAN),  # per tensor: NaN and -inf -> qmin
       _float32_values([-12.8, 12.7, -12.8]))
result(TORCH, "NaN/inf data", lambda: pc(XNAN),  # per channel: all three -> qmin
       _float32_values([-12.8, -12.8, -12.8]))
result(TORCH, "NaN/inf qparams", lambda: tq.fake_quantize_per_tensor_affine(X, np.nan, 0, -128,
                                                                             127),
       lambda y: np.isnan(y).all())  # torch has no scale check
result(TORCH, "scale <= 0", lambda: tq.fake_quantize_per_tensor_affine(X, 0.0, 0, -128, 127),
       lambda y: not np.any(y))  # scale 0: +-0 outputs, as torch
raises(TORCH, "qmin >= qmax", lambda: tq.fake_quantize_per_tensor_affine(X, 0.1, 0, 127, -128),
       ValueError,
       "`quant_min` should be less than or         equal to `quant_max`.")  # torch's text
raises(TORCH, "bits", lambda: tq.MinMaxObserver(dtype="qint8", quant_min=-1000, quant_max=1000),
       ValueError, "quantization range should be positive and not exceed the maximum bit range")
raises(TORCH, "bits", lambda: tq.MinMaxObserver(dtype="qint3"), ValueError,
       "Default Observer only works for")
raises(TORCH, "axis", lambda: pc(X, axis=3), IndexError,  # torch's error
       "Dimension out of range (expected to be in range of [-3, 2], but got 3)")
raises(TORCH, "channels", lambda: pc(X, s=np.full(2, 0.1, F32), z=np.zeros(2, np.int32)),
       ValueError, "dimensions of scale and zero-point are not consistent with input tensor")
def _torch_channel_change():
    obs = tq.PerChannelMinMaxObserver(ch_axis=1)
    obs(X)
    obs(X[:, :2])


raises(TORCH, "channels", _torch_channel_change, ValueError,
       "the batch has 2 channels, the observer 3")
result(TORCH, "lists and scalars", lambda: (pt([0.26, 1.0]), pt(np.array([0.26, 1.0]))),
       lambda pair: bits_equal(*pair))

# -------------------------------------------------------------- mindspore
MS = "compat.mindspore"


def ms_fq(x, **kw):
    return ms.FakeQuantWithMinMaxObserver(**kw).set_train(True)(x)


MS_PREFIX = "For 'FakeQuantWithMinMaxObserver', "
result(MS, "dtype", lambda: (ms_fq(X.astype(np.int32)), ms_fq(X.astype(np.int32).astype(F32))),
       lambda pair: bits_equal(*pair))  # documented: non-float input becomes float32
same_as_clean(MS, ms_fq)
result(MS, "empty", lambda: ms_fq(np.zeros((0, 3), F32)), lambda y: y.shape == (0, 3))
result(MS, "0-d", lambda: ms_fq(np.array(0.5, F32)), lambda y: y.shape == ())


def _ms_nan_batch():
    cell = ms.FakeQuantWithMinMaxObserver(ema=True).set_train(True)
    cell(X)
    minq = cell.minq.copy()
    with pytest.warns(RuntimeWarning, match="NaN"):
        y = cell(XNAN)
    return bits_equal(cell.minq, minq) and np.isnan(y.flat[0])


result(MS, "NaN/inf data", _ms_nan_batch, bool)
result(MS, "scale <= 0", lambda: ms_fq(np.zeros((2, 3), F32)),  # degenerate range: 0 output
       lambda y: np.array_equal(y, np.zeros((2, 3), F32)))
raises(MS, "NaN/inf qparams", lambda: ms_fq(X, min_init=float("nan")), ms.MindSporeArgumentError,
       MS_PREFIX + "the 'max_init' should be greater than 'min_init'")
raises(MS, "qmin >= qmax", lambda: ms_fq(X, min_init=1, max_init=-1), ValueError,
       MS_PREFIX + "the 'max_init' should be greater than 'min_init', but got 'max_init': -1")
raises(MS, "bits", lambda: ms_fq(X, quant_dtype=9), TypeError,
       MS_PREFIX + "'quant_dtype' should be a QuantDtype, but got 9.")
raises(MS, "axis", lambda: ms_fq(X, per_channel=True, channel_axis=5, num_channels=3),
       ValueError, MS_PREFIX + "'channel_axis' (5) is out of range for an input of rank 3.")
raises(MS, "channels", lambda: ms_fq(X, per_channel=True, channel_axis=1, num_channels=5),
       ValueError, MS_PREFIX + "'num_channels' (5) should be equal to x.shape[1] = 3.")
raises(MS, "channels", lambda: ms.FakeQuantWithMinMaxObserver().backward(np.ones(3, F32), X),
       ValueError, "'dout' and 'x' should have one shape, but got (3,) and (2, 3, 4)")
result(MS, "lists and scalars", lambda: ms_fq([0.25, 1.0]), lambda y: y.dtype == F32)
raises(MS, "lists and scalars", lambda: ms_fq("abc"), TypeError,
       MS_PREFIX + "the input should be a float tensor, got str")
raises(MS, "dtype", lambda: ms_fq(X.astype(np.complex64)), TypeError,
       MS_PREFIX + "the input should be a float tensor, got ndarray of complex64")
raises(MS, "lists and scalars", lambda: ms_fq(None), TypeError,
       MS_PREFIX + "the input should be a float tensor, got NoneType")

# ------------------------------------------------------------- tensorflow
TF = "compat.tensorflow"
args = tf.fake_quant_with_min_max_args
per_ch = lambda x, n=4: tf.fake_quant_with_min_max_vars_per_channel(  # noqa: E731
    x, np.full(n, -1, F32), np.full(n, 1, F32))
result(TF, "dtype", lambda: (args(X.astype(np.int32)), args(X.astype(np.int32).astype(F32))),
       lambda pair: bits_equal(*pair))  # as TF's wrapper: converted to float32
raises(TF, "dtype", lambda: args(X.astype(np.complex64)), TypeError,
       "FakeQuantWithMinMaxArgs: cannot convert ndarray of complex64 to a float32 tensor")
same_as_clean(TF, args)
result(TF, "empty", lambda: args(np.zeros((0, 3), F32)), lambda y: y.shape == (0, 3))
raises(TF, "0-d", lambda: per_ch(np.array(0.5, F32)), ValueError,
       "Shape must be at least rank 1 but is rank 0")
result(TF, "NaN/inf data", lambda: args(XNAN),  # NaN stays, inf clamped to the nudged range
       _float32_values([np.nan, 5.9764705, -6.0235295]))
result(TF, "NaN/inf qparams", lambda: tf.fake_quant_with_min_max_vars(X, F32(np.nan), F32(1)),
       lambda y: np.isnan(y).all())  # as TF
result(TF, "scale <= 0", lambda: tf.fake_quant_with_min_max_vars(X, F32(0.5), F32(0.5)),
       lambda y: np.isnan(y).all())  # documented: min == max != 0 gives NaN, as TF
raises(TF, "bits", lambda: args(X, num_bits=17), ValueError,
       "num_bits must be between 2 and 16, inclusive")
raises(TF, "qmin >= qmax", lambda: args(X, min=1.0, max=-1.0), ValueError,
       "min has to be smaller than max, was: 1 >= -1")
raises(TF, "channels", lambda: per_ch(X, 3), ValueError, "min has incorrect size, expected 4 was 3")
raises(TF, "channels", lambda: tf.fake_quant_with_min_max_args_gradient(np.ones(3, F32), X),
       ValueError, "must have the same size and shape")
result(TF, "lists and scalars", lambda: args([0.26, 1]), lambda y: y.dtype == F32)
raises(TF, "lists and scalars", lambda: args(None), TypeError,
       "FakeQuantWithMinMaxArgs: cannot convert NoneType to a float32 tensor")

# ---------------------------------------------------------------- oneflow
OF = "compat.oneflow"
S1, Z1 = np.array([0.01], F32), np.array([0], np.int32)
of_fq = lambda x, s=S1, z=Z1: of.FakeQuantization()(x, s, z)  # noqa: E731
same_as_clean(OF, of_fq)
same_as_clean(OF, lambda x: of.MinMaxObserver()(x), {"Fortran order": VARIANTS["Fortran order"]})
result(OF, "empty", lambda: of_fq(np.zeros((0, 3), F32)), lambda y: y.shape == (0, 3))
result(OF, "0-d", lambda: of_fq(np.array(0.5, F32)), lambda y: y.shape == ())
result(OF, "NaN/inf data", lambda: of_fq(XNAN),  # "NaN is not clamped"
       _float32_values([np.nan, 1.27, -1.28]))
result(OF, "NaN/inf qparams", lambda: of_fq(X, np.array([np.nan], F32)),
       lambda y: np.isnan(y).all())  # scales are used as given
result(OF, "scale <= 0", lambda: of_fq(X, np.array([0.0], F32)),  # used as given: +-0 or NaN
       lambda y: np.all((y == 0) | np.isnan(y)))
raises(OF, "bits", lambda: of.MinMaxObserver(quantization_bit=1), ValueError,
       "MinMaxObserver: quantization_bit must be in [2, 8], got 1")
raises(OF, "bits", lambda: of.FakeQuantization(quantization_formula="tf"), ValueError,
       "quantization_formula must be 'google' or 'cambricon', got 'tf'")
raises(OF, "channels", lambda: of_fq(X, np.full(5, 0.1, F32), np.zeros(5, np.int32)), ValueError,
       "FakeQuantization: scale has 5 values; per-channel quantization needs x.shape[0] of them")
raises(OF, "dtype", lambda: of.MovingAverageMinMaxObserver()(X, "a"), TypeError,
       "current_train_step must be an integer tensor of one element, got 'a'")
result(OF, "lists and scalars", lambda: of_fq([0.26, 1.0], [0.1], [0]), lambda y: y.dtype == F32)
raises(OF, "dtype", lambda: of_fq(X.astype(np.complex64)), TypeError,
       "FakeQuantization: input must be a float tensor, got ndarray of complex64")
raises(OF, "lists and scalars", lambda: of_fq(None), TypeError,
       "FakeQuantization: input must be a float tensor, got NoneType")

# ----------------------------------------------------------------- nvidia
NV = "compat.nvidia"
ftq = nv.fake_tensor_quant
raises(NV, "dtype", lambda: ftq(X.astype(np.int32), 1.0), TypeError,
       "fake_tensor_quant: inputs must have a floating dtype (float16, float32 or float64), "
       "got int32")
raises(NV, "dtype", lambda: nv.TensorQuantizer()(X.astype(bool)), TypeError,
       "TensorQuantizer: inputs must have a floating dtype")
same_as_clean(NV, lambda x: ftq(x, 1.0))
raises(NV, "empty", lambda: nv.MaxCalibrator().collect(np.zeros((0, 3), F32)), ValueError,
       "MaxCalibrator.collect: x is empty")
result(NV, "0-d", lambda: ftq(np.array(0.5, F32), 1.0), lambda y: y.shape == ())
result(NV, "NaN/inf qparams", lambda: ftq(X, np.nan), lambda y: np.isnan(y).all())  # as PQ
result(NV, "NaN/inf data", lambda: ftq(XNAN, 1.0),  # NaN through clamp(rint(x * scale))
       _float32_values([np.nan, 1.0, -1.0]))
raises(NV, "NaN/inf data", lambda: nv.MaxCalibrator().collect(XNAN), ValueError,
       "MaxCalibrator.collect: x contains NaN")
raises(NV, "NaN/inf data", lambda: nv.HistogramCalibrator().collect(np.array([1, np.inf], F32)),
       ValueError, "HistogramCalibrator.collect: x contains NaN or inf")
raises(NV, "scale <= 0", lambda: ftq(X, -1.0), ValueError, "Negative values in amax")
raises(NV, "bits", lambda: ftq(X, 1.0, num_bits=1), ValueError,
       "fake_tensor_quant: num_bits must be in 2..16, got 1")
raises(NV, "channels", lambda: ftq(X, np.ones((1, 5, 1), F32)), ValueError,
       "fake_tensor_quant: amax of shape (1, 5, 1) does not broadcast against inputs of "
       "shape (2, 3, 4)")
raises(NV, "dtype", lambda: ftq(X, 1.0, unsigned=True), TypeError,
       "Negative values encountered in unsigned quantization.")
raises(NV, "lists and scalars", lambda: ftq(X, "a"), TypeError,
       "fake_tensor_quant: amax must be a float or an array of floats, got str")
result(NV, "lists and scalars", lambda: ftq([0.5, -0.25], 1.0), lambda y: y.shape == (2,))

# ---------------------------------------------------------------- horizon
HZ = "compat.horizon"
raises(HZ, "dtype", lambda: hz.FakeQuantize()(X.astype(np.int16)), TypeError,
       "FakeQuantize.forward: x must have a floating dtype (float16, float32 or float64), "
       "got int16")
raises(HZ, "dtype", lambda: hz.MovingAverageMinMaxObserver()(X.astype(np.complex64)), TypeError,
       "MovingAverageMinMaxObserver.update: x must have a floating dtype")
same_as_clean(HZ, lambda x: hz.FakeQuantize()(x))


def _hz_in_place_read_only():
    x = _readonly(X)
    y = hz.FakeQuantize(in_place=True)(x)
    return bits_equal(x, X) and bits_equal(y, hz.FakeQuantize()(X.copy()))


result(HZ, "read-only input", _hz_in_place_read_only, bool)  # in_place falls back to a copy
result(HZ, "empty", lambda: hz.FakeQuantize()(np.zeros((0, 3), F32)),
       lambda y: y.shape == (0, 3))
result(HZ, "0-d", lambda: hz.FakeQuantize()(np.array(0.5, F32)), lambda y: y.shape == ())


def _hz_nan():
    fq = hz.FakeQuantize()
    y = fq(XNAN)
    return np.isnan(fq.activation_post_process.min_val) and np.isnan(y).all()


result(HZ, "NaN/inf data", _hz_nan, bool)  # Horizon keeps NaN (nan_policy="propagate")
raises(HZ, "bits", lambda: hz.MovingAverageMinMaxObserver(dtype="qint3"), ValueError,
       "MovingAverageMinMaxObserver: unsupported dtype 'qint3'")
raises(HZ, "qmin >= qmax", lambda: hz.MovingAverageMinMaxObserver(quant_min=5, quant_max=-5),
       ValueError, "Used-specified quantization range must include 0, got [5, -5]")
raises(HZ, "axis", lambda: hz.FakeQuantize(observer=hz.MovingAveragePerChannelMinMaxObserver,
                                           ch_axis=5)(X), ValueError,
       "axis 5 is out of range for an array of ndim 3")
raises(HZ, "channels", lambda: hz.FakeQuantize(observer=hz.MovingAveragePerChannelMinMaxObserver,
                                               ch_axis=1, channel_len=3).set_qparams([0.1, 0.2]),
       ValueError, "mismatched shape when set scale (2,) vs (3,), please check channel_len")
raises(HZ, "NaN/inf qparams", lambda: hz.MovingAverageMinMaxObserver(averaging_constant=np.nan),
       ValueError, "averaging_constant must be in (0, 1]")
raises(HZ, "lists and scalars", lambda: hz.QuantRoundMode.set("up"), ValueError,
       "QuantRoundMode.set: mode must be 'bpu_round' or 'half_to_even', got 'up'")
result(HZ, "lists and scalars", lambda: hz.FakeQuantize()([0.5, -0.25]),
       lambda y: y.shape == (2,))


# ------------------------------------------------------------------ tests
def _params():
    out = []
    for k, case in enumerate(CASES):
        call = case.call
        marks = ()
        if hasattr(call, "values"):  # a pytest.param carrying an xfail mark
            call, marks = call.values[0], call.marks
        out.append(pytest.param(case._replace(call=call), marks=marks,
                                id=f"{k}-{case.layer}-{case.category}".replace(" ", "_")))
    return out


@pytest.mark.parametrize("case", _params())
def test_bad_input(case):
    before = X.copy(), XNAN.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warnings are checked where they are the result
        if case.exc is not None:
            with pytest.raises(case.exc) as info:
                case.call()
            assert case.message in str(info.value), str(info.value)
        else:
            assert case.check(case.call())
    assert bits_equal(X, before[0]) and bits_equal(XNAN, before[1])  # inputs never modified


LAYERS = [CORE, FMT, FQ, TORCH, MS, TF, OF, NV, HZ]
CATEGORIES = ["dtype", "big-endian", "empty", "0-d", "non-contiguous", "Fortran order",
              "read-only input", "read-only out", "out shape", "out dtype", "aliasing out",
              "NaN/inf data", "NaN/inf qparams", "scale <= 0", "qmin >= qmax", "bits", "axis",
              "channels", "lists and scalars", "C overflow", "names"]


def test_matrix_covers_every_layer_and_category():
    by_layer = collections.Counter(c.layer for c in CASES)
    assert set(by_layer) == set(LAYERS) and len(CASES) >= 30
    assert all(by_layer[layer] >= 10 for layer in LAYERS), by_layer
    assert set(c.category for c in CASES) == set(CATEGORIES)
    compat = [c for c in CASES if c.layer.startswith("compat.")]
    for category in ("dtype", "empty", "non-contiguous", "Fortran order", "read-only input",
                     "NaN/inf data", "lists and scalars"):
        assert {c.layer for c in compat if c.category == category} == \
            {layer for layer in LAYERS if layer.startswith("compat.")}, category


# ------------------------------------------- nothing written outside `out`
SENTINEL = F32(-7.25)


def _padded(shape, dtype=F32):
    """(buffer, view): ``view`` of ``shape`` inside a sentinel-filled buffer,
    with a gap between rows, so a write outside it is visible."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    buf = np.full((rows + 2, cols + 3), SENTINEL, dtype)
    return buf, buf[1:1 + rows, 1:1 + cols]


WRITERS = {
    "fake_quant": lambda x, out: qc.fake_quant(x, 0.1, 0, -128, 127, out=out),
    "fake_quant per channel": lambda x, out: qc.fake_quant(x, np.linspace(.05, .2, 7), 0, -8, 7,
                                                           axis=1, out=out),
    "fake_quant_with_mask": lambda x, out: qc.fake_quant_with_mask(x, 0.1, 0, 0, 255, out=out),
    "fake_quant_amax": lambda x, out: qc.fake_quant_amax(x, 1.0, out=out),
    "fake_quant_nudged": lambda x, out: qc.fake_quant_nudged(x, -1.0, 1.0, F32(2 / 255),
                                                             out=out),
    "ste_backward": lambda x, out: qc.ste_backward(x, x > 0, out=out),
    "FakeQuantize": lambda x, out: qc.FakeQuantize(qc.MinMaxObserver(), -128, 127)(x, out=out),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_no_writes_outside_out(name, layout):
    """``out`` as a strided window into a larger buffer (and x in C, Fortran
    or strided layout): exactly the window is written, nothing around it."""
    x = np.random.default_rng(0).normal(size=(5, 7)).astype(F32)
    if layout == "F":
        x = np.asfortranarray(x)
    elif layout == "strided":
        x = _noncontig(x)
    buf, out = _padded((5, 7))
    mask = np.ones(buf.shape, bool)
    mask[1:-1, 1:-2] = False
    expect = WRITERS[name](x.copy(), None)
    got = WRITERS[name](x, out)
    got = got[0] if isinstance(got, tuple) else got
    assert got is out
    assert bits_equal(out, expect[0] if isinstance(expect, tuple) else expect)
    assert np.all(buf[mask] == SENTINEL)


# ----------------------------------------- the CLI handed hostile files
# Think like an attacker handing a command a checkpoint: every file below
# is refused by every command that reads it, in one line, exit status 2,
# naming what is wrong; never a traceback, "internal error", a hang or an
# allocation the file's own bytes do not back.
def _st(header=None, data=b"", raw=None, length=None):
    import json
    import struct
    blob = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(blob) if length is None else length) + blob + data


def _t(dtype="F32", shape=(1,), offsets=(0, 4)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def _npy(header, data=b""):
    """A .npy file with a forged header dict (version 1.0)."""
    import struct
    text = header.encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


def _npz(members):
    import io
    import zipfile
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (duplicate names are the point)
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data in members:
                zf.writestr(name, data)
    return buf.getvalue()


_GOOD_NPY = _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                 np.array([0.5, -1.0], F32).tobytes())
HOSTILE_FILES = {  # name -> (file name, bytes, message fragment)
    # header bounds and the JSON text
    "st length 2**64-1": ("m.safetensors", _st({}, length=2 ** 64 - 1), "header length"),
    "st length past the file": ("m.safetensors", _st({}, length=64), "header length"),
    "st empty file": ("m.safetensors", b"", "shorter than its 8-byte header"),
    "st not JSON": ("m.safetensors", _st(raw=b"{nope"), "header is not JSON"),
    "st NaN constant": ("m.safetensors", _st(raw=b'{"__metadata__": {"a": NaN}}'), "not JSON"),
    "st two objects": ("m.safetensors", _st(raw=b"{}{}"), "not JSON"),
    "st deep nesting": ("m.safetensors", _st(raw=b'{"a":' + b"[" * 50000 + b"]" * 50000 + b"}"),
                        "levels deep"),
    "st top-level list": ("m.safetensors", _st(raw=b"[]"), "not a JSON object"),
    "st invalid utf-8": ("m.safetensors", _st(raw=b'{"\xc3\x28": 1}'), "not JSON"),
    "st lone surrogate": ("m.safetensors", _st(raw=b'{"\\udc80": {"dtype": "F32", "shape": [0],'
                                                   b' "data_offsets": [0, 0]}}'),
                          "not valid Unicode"),
    # names and fields
    "st duplicate name": ("m.safetensors",
                          _st(raw=b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
                                  b' "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
                              data=bytes(4)), "'w' appears twice"),
    "st unknown field": ("m.safetensors", _st({"w": {**_t(), "device": "cuda"}}, bytes(4)),
                         "unknown ['device']"),
    "st missing field": ("m.safetensors", _st({"w": {"dtype": "F32", "shape": [0]}}),
                         "missing ['data_offsets']"),
    "st unknown dtype": ("m.safetensors", _st({"w": _t("F128")}, bytes(4)), "dtype 'F128'"),
    "st dtype list": ("m.safetensors", _st({"w": _t(["F32"])}, bytes(4)), "dtype ['F32']"),
    "st float shape": ("m.safetensors", _st({"w": _t(shape=[2.5], offsets=[0, 8])}, bytes(8)),
                       "holds 2.5, not an integer"),
    "st string shape": ("m.safetensors", _st({"w": _t(shape=["2"], offsets=[0, 8])}, bytes(8)),
                        "holds '2', not an integer"),
    "st bool shape": ("m.safetensors", _st({"w": _t(shape=[True])}, bytes(4)),
                      "holds True, not an integer"),
    "st negative dim": ("m.safetensors", _st({"w": _t(shape=[-2, 2], offsets=[0, 0])}),
                        "negative dimension"),
    "st 2**64 dim": ("m.safetensors", _st({"w": _t(shape=[0, 2 ** 64], offsets=[0, 0])}),
                     "too large"),
    "st 2**62 x 4 dims": ("m.safetensors", _st({"w": _t(shape=[0, 2 ** 62, 4],
                                                          offsets=[0, 0])}), "too large"),
    "st float offsets": ("m.safetensors", _st({"w": _t(offsets=[0.0, 4.0])}, bytes(4)),
                         "'w': data_offsets must be two integers"),
    "st string offsets": ("m.safetensors", _st({"w": _t(offsets=["0", "4"])}, bytes(4)),
                          "'w': data_offsets must be two integers"),
    "st negative offsets": ("m.safetensors", _st({"w": _t(offsets=[-4, 0])}, bytes(4)),
                            "'w': data_offsets must be two integers >= 0"),
    "st metadata list": ("m.safetensors", _st({"__metadata__": ["a"]}), "__metadata__"),
    "st metadata int value": ("m.safetensors", _st({"__metadata__": {"a": 1}}),
                              "__metadata__['a'] must be a string"),
    # where the bytes lie
    "st overlap": ("m.safetensors", _st({"a": _t(shape=[2], offsets=[0, 8]),
                                         "b": _t(shape=[2], offsets=[4, 12])}, bytes(12)),
                   "overlaps"),
    "st aliased": ("m.safetensors", _st({"a": _t(), "b": _t()}, bytes(4)), "overlaps"),
    "st gap": ("m.safetensors", _st({"a": _t(offsets=[4, 8])}, bytes(8)), "unused"),
    "st trailing bytes": ("m.safetensors", _st({"a": _t()}, bytes(12)),
                          "the data section holds 12"),
    "st past the end": ("m.safetensors", _st({"a": _t(shape=[4], offsets=[0, 16])}, bytes(4)),
                        "beyond its 4 data bytes"),
    "st wrong byte count": ("m.safetensors", _st({"a": _t(shape=[2], offsets=[0, 4])}, bytes(4)),
                            "takes 8"),
    # .npy / .npz
    "npy truncated header": ("w.npy", _GOOD_NPY[:20], "not a .npy array"),
    "npy unterminated header": ("w.npy", _npy("{'descr': '<f4', 'shape': (2,"), "not a .npy array"),
    "npy huge shape": ("w.npy", _npy("{'descr': '<f4', 'fortran_order': False, "
                                     "'shape': (1099511627776,), }", bytes(8)),
                       "holds 8 bytes of data"),
    "npy version 9": ("w.npy", b"\x93NUMPY\x09\x00" + _GOOD_NPY[8:], "not a .npy array"),
    "npz not a zip": ("a.npz", _GOOD_NPY, "not a zip archive"),
    "npz duplicate member": ("a.npz", _npz([("w.npy", _GOOD_NPY), ("w.npy", _GOOD_NPY)]),
                             "appear twice"),
    "npz forged member": ("a.npz", _npz([("w.npy", _npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", bytes(8)))]),
        "holds 8 bytes of data"),
    "npz truncated member": ("a.npz", _npz([("w.npy", _GOOD_NPY[:20])]), "not a .npy array"),
}


def _hostile_path(tmp_path, name):
    fname, data, _ = HOSTILE_FILES[name]
    path = tmp_path / fname
    path.write_bytes(data)
    return str(path)


def _cli(argv, capsys):
    from quantcore.cli import main
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def _assert_refused(code, err, fragment):
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("quantcore: error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    assert fragment in err, err


def _commands(path, tmp_path):
    qp = tmp_path / "qp.json"
    qp.write_text('{"w": {"scale": [0.1], "zero_point": [0], "quant_min": 0, "quant_max": 255}}')
    out = str(tmp_path / ("out" + os.path.splitext(path)[1]))
    cmds = {"calibrate": ["calibrate", path],
            "fake-quant": ["fake-quant", path, "--qparams", str(qp), "-o", out]}
    if path.endswith(".safetensors"):
        cmds["quantize"] = ["quantize", path, "--format", "int4", "-o", out]
    return cmds


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_cli_refuses_hostile_files(tmp_path, capsys, name):
    path = _hostile_path(tmp_path, name)
    for command, argv in _commands(path, tmp_path).items():
        code, err = _cli(argv, capsys)
        _assert_refused(code, err, HOSTILE_FILES[name][2])


@pytest.mark.parametrize("kind", ["directory", "fifo", "device link", "missing"])
def test_cli_refuses_what_is_not_a_regular_file(tmp_path, capsys, kind):
    path = tmp_path / "m.safetensors"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(path)  # open() would block for ever
    elif kind == "device link":
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero here")
        os.symlink("/dev/zero", path)
    fragment = {"directory": "is a directory", "missing": "no such file"}.get(
        kind, "not a regular file")
    for argv in _commands(str(path), tmp_path).values():
        _assert_refused(*_cli(argv, capsys), fragment)
    if kind != "missing":  # nor is it a state file
        with pytest.raises(ValueError, match="not a regular file"):
            qc.load_state(str(path))


HOSTILE_QPARAMS = {  # the --qparams JSON of fake-quant -> message fragment
    "quant_min of 400 digits": ('{"w": {"scale": [0.1], "zero_point": [0], "quant_min": '
                                + "9" * 400 + ', "quant_max": 255}}', "quant_min"),
    "quant_max 2**70": ('{"w": {"scale": [0.1], "zero_point": [0], "quant_min": 0, '
                        f'"quant_max": {2 ** 70}}}}}', "quant_max must fit a 64-bit integer"),
    "NaN scale": ('{"w": {"scale": [NaN], "zero_point": [0], "quant_min": 0, "quant_max": 255}}',
                  "scale"),
    "huge scale literal": ('{"w": {"scale": [1e999], "zero_point": [0], "quant_min": 0, '
                           '"quant_max": 255}}', "scale"),
    "zero point out of range": ('{"w": {"scale": [0.1], "zero_point": [300], "quant_min": 0, '
                                '"quant_max": 255}}', "zero_point"),
    "deep nesting": ('{"w": ' + "[" * 50000 + "]" * 50000 + "}", "qparams"),
    "scale strings": ('{"w": {"scale": ["0.1"], "zero_point": [0], "quant_min": 0, '
                      '"quant_max": 255}}', "scale must be a non-empty list of numbers"),
    "not an object": ("[1, 2]", "expected an object"),
    "truncated": ('{"w": {"scale": [0.1', "cannot read qparams"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_QPARAMS))
def test_cli_refuses_hostile_qparams(tmp_path, capsys, name):
    data = tmp_path / "w.npy"
    np.save(data, np.linspace(-1, 1, 8, dtype=F32))
    qp = tmp_path / "qp.json"
    text, fragment = HOSTILE_QPARAMS[name]
    qp.write_text(text)
    code, err = _cli(["fake-quant", str(data), "--qparams", str(qp), "-o",
                      str(tmp_path / "o.npy")], capsys)
    _assert_refused(code, err, fragment)
