"""HQQ's own initialisation (recipe "hqq") and ORT's port (recipe "hqq_ort").

Where it comes from: mobiusml/hqq ``hqq/core/quantize.py``,
``Quantizer.quantize`` with ``optimize=False`` (its rule for the inverse
scale ``clamp(max_v / (max - min), max=2e4)``, the float zero point
``-min * scale``, ``round(W * scale + zero).clamp(0, max_v)`` and the stored
scale ``1 / scale``).  The live package is used when it is installed, always
under ``make test`` (hqq 0.2.6, the last release with this rule, runs on the
CPU with ``bitpack=False``); the same rule written with
torch float32 operations always runs (torch computes ``max_v / d`` as
``reciprocal(d) * max_v``).  ORT's port keeps the spec's vectors
(tests/test_formats.py ``test_hqq_vectors``).
"""
import numpy as np
import pytest

import quantcore as qc
from reference import oracle

torch = pytest.importorskip("torch")


def _weights(rows=6, k=64, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, k)) * rng.choice([1e-3, 0.05, 1.0], (rows, 1)))
    w = w.astype(np.float32)
    w[1, :16] = 0.25          # a constant group: HQQ's scale 1/2e4, zero -5000
    w[2, 16:32] = 0.0         # a constant zero group
    w[3, :16] = -3.0
    w[4, 32:48] = np.linspace(0, 1e-4, 16, dtype=np.float32)  # tiny range: si clamped
    return w


def _hqq_rule_torch(w, bits, g):
    """HQQ's Quantizer.quantize (optimize=False, axis=1 groups), in torch float32."""
    W = torch.from_numpy(w).float().reshape(-1, g)
    mn = W.min(axis=1, keepdim=True)[0]
    mx = W.max(axis=1, keepdim=True)[0]
    max_v = round(2 ** bits - 1)
    scale = (max_v / (mx - mn)).clamp(max=2e4)
    zero = -mn * scale
    q = torch.round(W * scale + zero).clamp(0, max_v)
    shape = (w.shape[0], w.shape[1] // g)
    return (q.reshape(w.shape).numpy(), (1.0 / scale).reshape(shape).numpy(),
            zero.reshape(shape).numpy())


def _bits_equal(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (a, b)


@pytest.mark.parametrize("bits, g", [(4, 16), (2, 16), (8, 32), (3, 64)])
def test_hqq_is_hqqs_own_rule(bits, g):
    w = _weights()
    q, s, z = qc.group_quantize(w, bits, g, recipe="hqq")
    rq, rs, rz = _hqq_rule_torch(w, bits, g)
    assert np.array_equal(q.astype(np.float32), rq)
    _bits_equal(s, rs)
    _bits_equal(z, rz)
    # dequantisation: (q - zero) * scale, HQQ's Quantizer.dequantize in float32
    y = qc.group_dequantize(q, s, z, g, recipe="hqq")
    want = ((torch.from_numpy(rq).reshape(-1, g) - torch.from_numpy(rz).reshape(-1, 1))
            * torch.from_numpy(rs).reshape(-1, 1)).reshape(w.shape).numpy()
    _bits_equal(y, want)
    _bits_equal(qc.group_fake_quant(w, bits, g, recipe="hqq"), want)


def test_hqq_constant_group():
    w = _weights()
    _, s, z = qc.group_quantize(w, 4, 16, recipe="hqq")
    assert s[1, 0] == np.float32(1 / np.float32(2e4)) and z[1, 0] == -5000
    assert s[2, 1] == np.float32(1 / np.float32(2e4)) and z[2, 1] == 0
    # ORT's port: the range of a constant group becomes qmax (inverse scale 1)
    _, s2, z2 = qc.group_quantize(w, 4, 16, recipe="hqq_ort")
    assert s2[1, 0] == 1 and z2[1, 0] == 0


@pytest.mark.parametrize("bits, g", [(4, 16), (2, 32), (8, 64)])
def test_hqq_against_the_live_package(bits, g):
    hq = oracle("hqq.core.quantize")     # hqq==0.2.6, the test extra (docs/FORMATS.md)
    w = _weights(seed=bits)
    W_q, meta = hq.Quantizer.quantize(torch.from_numpy(w), nbits=bits, group_size=g, axis=1,
                                      optimize=False, bitpack=False, device="cpu")
    q, s, z = qc.group_quantize(w, bits, g, recipe="hqq")
    assert np.array_equal(q.astype(np.float32), W_q.float().numpy().reshape(w.shape))
    _bits_equal(s.reshape(-1), meta["scale"].float().numpy().reshape(-1))
    _bits_equal(z.reshape(-1), meta["zero"].float().numpy().reshape(-1))
