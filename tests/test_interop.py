"""DLPack interop: torch tensors in, torch tensors out, no copies."""
import numpy as np
import pytest

import quantcore as qc

torch = pytest.importorskip("torch")


def test_functions_return_the_callers_type_without_copies():
    t = torch.randn(6, 7)
    y = qc.fake_quant(t, 0.1, 0, -128, 127)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert torch.equal(y, torch.fake_quantize_per_tensor_affine(t, 0.1, 0, -128, 127))
    out = torch.empty(6, 7)
    res = qc.fake_quant(t, 0.1, 0, -128, 127, out=out)
    assert res.data_ptr() == out.data_ptr() and torch.equal(out, y)
    # in place on the tensor's own memory
    u = t.clone()
    qc.fake_quant(u, 0.1, 0, -128, 127, out=u)
    assert torch.equal(u, y)
    y2, mask = qc.fake_quant_with_mask(t, torch.full((7,), 0.1), torch.zeros(7), -8, 7, axis=1)
    assert mask.dtype == torch.bool and y2.shape == t.shape
    lo, hi = qc.minmax(t, axis=0)  # per channel along axis 0: one value per row
    assert torch.equal(lo, t.min(dim=1).values) and torch.equal(hi, t.max(dim=1).values)
    g = qc.ste_backward(torch.ones(6, 7), mask)
    assert torch.equal(g, mask.float())
    q = qc.quantize(t, 0.1, 0, -128, 127)
    assert q.dtype == torch.int8


def test_stateful_classes_accept_tensors():
    t = torch.randn(3, 4)
    fq = qc.FakeQuantize()
    y = fq(t)
    assert isinstance(y, torch.Tensor)
    assert isinstance(fq.backward(torch.ones(3, 4)), torch.Tensor)
    obs = qc.MinMaxObserver()
    assert obs(t) is t
    assert float(obs.min_val) == float(t.min())


def test_non_cpu_dlpack_arrays_are_refused():
    class OnGpu:
        def __dlpack__(self, **kw):
            raise AssertionError("must not be exported")

        def __dlpack_device__(self):
            return (8, 0)  # kDLMetal

    with pytest.raises(NotImplementedError, match="not supported"):
        qc.fake_quant(OnGpu(), 0.1, 0, 0, 255)


def test_lists_and_scalars_still_work():
    assert qc.fake_quant([0.26], 0.1, 0, -128, 127).tolist() == [0.30000000000000004]
    assert np.asarray(qc.minmax(3.0)).tolist() == [3.0, 3.0]
