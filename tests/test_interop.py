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


# ------------------------------------------------------------- zero copy
def _peak_numpy_bytes(call):
    """Peak traced allocation during ``call()`` (numpy reports its buffers
    to tracemalloc; torch's allocator does not, so a hidden numpy copy of a
    torch tensor shows up here)."""
    import tracemalloc
    call()  # warm-up: lazy imports, caches
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_no_copies_of_torch_inputs_and_outputs():
    n = 1 << 21  # 8 MiB of float32
    t = torch.randn(n)
    o = torch.empty(n)
    mib = 1 << 20
    # in and out= viewed in place: nothing the size of the data is allocated
    assert _peak_numpy_bytes(lambda: qc.fake_quant(t, 0.1, 0, -128, 127, out=o)) < mib
    assert _peak_numpy_bytes(lambda: qc.minmax(t)) < mib
    assert _peak_numpy_bytes(lambda: qc.minmax(t.view(64, -1), axis=0)) < mib
    assert _peak_numpy_bytes(lambda: qc.ste_backward(t, t > 0, out=o)) < mib
    # a new result: exactly one output buffer, handed to torch without a copy
    assert _peak_numpy_bytes(lambda: qc.fake_quant(t, 0.1, 0, -128, 127)) < t.nbytes + mib
    # a non-contiguous view is copied once to C order (documented), not more
    tt = t.view(1024, -1).T
    assert _peak_numpy_bytes(lambda: qc.fake_quant(tt, 0.1, 0, -128, 127)) < 2 * t.nbytes + mib


def test_results_share_memory_with_the_callers_tensors():
    t = torch.randn(5, 8)
    out = torch.empty(5, 8)
    y = qc.fake_quant(t, 0.1, 0, -128, 127, out=out)
    assert y.data_ptr() == out.data_ptr()
    out.zero_()  # writing through the returned tensor's memory
    assert torch.count_nonzero(y) == 0
    # a FakeQuantize that does not quantize returns the input itself (a view)
    fq = qc.FakeQuantize()
    fq.disable_fake_quant()
    same = fq(t)
    assert isinstance(same, torch.Tensor) and same.data_ptr() == t.data_ptr()
    # a fresh result is a new, writable tensor that does not alias the input
    before = t.clone()
    y = qc.fake_quant(t, 0.1, 0, -128, 127)
    assert y.data_ptr() != t.data_ptr()
    y.add_(100)
    assert torch.equal(t, before)
    # in place: out is the input
    u = t.clone()
    ptr = u.data_ptr()
    assert qc.fake_quant(u, 0.1, 0, -128, 127, out=u).data_ptr() == ptr
    assert torch.equal(u, torch.fake_quantize_per_tensor_affine(t, 0.1, 0, -128, 127))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_dtypes_and_layouts_round_trip(dtype):
    t = torch.randn(6, 10, dtype=dtype)
    for x in (t, t.T, t[:, ::3], t.unsqueeze(0).expand(2, 6, 10)):
        y = qc.fake_quant(x, 0.05, 0, -128, 127)
        assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == x.shape
        ref = qc.fake_quant(x.numpy(), 0.05, 0, -128, 127)
        assert np.array_equal(y.numpy(), ref)
    lo, hi = qc.minmax(t, axis=1)
    assert isinstance(lo, torch.Tensor) and lo.shape == (10,) and lo.dtype == dtype


def test_tensor_parameters_and_scalars():
    t = torch.randn(4, 3)
    s = torch.tensor([0.1, 0.2, 0.3])
    z = torch.tensor([0, 1, -1], dtype=torch.int32)
    y = qc.fake_quant(t, s, z, -128, 127, axis=1)
    assert torch.equal(y, torch.fake_quantize_per_channel_affine(t, s, z, 1, -128, 127))
    y0 = qc.fake_quant(torch.tensor(0.26), 0.1, 0, -128, 127)
    assert isinstance(y0, torch.Tensor) and y0.shape == () and float(y0) == pytest.approx(0.3)


def test_tensors_that_cannot_be_viewed_give_clear_errors():
    with pytest.raises(TypeError, match="floating dtype"):
        qc.fake_quant(torch.arange(4), 0.1, 0, -128, 127)
    with pytest.raises(TypeError, match="out has dtype float64"):
        qc.fake_quant(torch.randn(3), 0.1, 0, -128, 127, out=torch.empty(3, dtype=torch.float64))
    # a tensor that requires grad is read detached (quantcore.torch has autograd)
    y = qc.fake_quant(torch.randn(3, requires_grad=True), 0.1, 0, -128, 127)
    assert isinstance(y, torch.Tensor) and not y.requires_grad


def test_bfloat16_is_refused_with_its_name():
    with pytest.raises(TypeError, match="bfloat16"):
        qc.fake_quant(torch.randn(3).bfloat16(), 0.1, 0, -128, 127)


@pytest.mark.parametrize("value,dtype,shape", [
    (0.26, np.float64, ()),                 # Python float
    (3, np.float64, ()),                    # Python int, read as a number
    (np.float32(0.26), np.float32, ()),     # numpy scalar keeps its dtype
    (np.float16(0.26), np.float16, ()),
    ([0.26, 1.0], np.float64, (2,)),        # list
    ((0.26, 1.0), np.float64, (2,)),        # tuple
    ([[1, 2], [3, 4]], np.float64, (2, 2)),  # nested list of ints
    ([], np.float64, (0,)),                 # empty list
])
def test_numpy_array_likes(value, dtype, shape):
    y = qc.fake_quant(value, 0.1, 0, -128, 127)
    assert isinstance(y, np.ndarray) and y.dtype == dtype and y.shape == shape
    assert np.array_equal(y, qc.fake_quant(np.asarray(value, dtype), 0.1, 0, -128, 127))
    lo, hi = qc.minmax(value)
    assert lo.dtype == dtype


@pytest.mark.parametrize("value,error", [
    ([1.0, "a"], "floating dtype"),
    ([[1.0], [1.0, 2.0]], "must be a float array"),
    (np.int32(3), "floating dtype"),
    (None, "floating dtype"),
    (1 + 2j, "floating dtype"),
])
def test_bad_array_likes(value, error):
    with pytest.raises(TypeError, match=error):
        qc.fake_quant(value, 0.1, 0, -128, 127)


def test_public_functions_show_their_own_parameters():
    """The interop decorators keep each public function's signature
    (``__signature__``, read even where ``__wrapped__`` is not followed) and
    are typed to return their argument's type, so that help(), IDEs and type
    checkers see ``fake_quant(x, scale, zero_point, ...)``, not
    ``(x, *args, **kwargs)``."""
    import inspect
    import typing

    from quantcore import _arrays
    checked = 0
    for name in qc.__all__:
        f = getattr(qc, name)
        if not inspect.isfunction(f) or not hasattr(f, "__wrapped__"):
            continue
        own = inspect.signature(inspect.unwrap(f))
        assert inspect.signature(f, follow_wrapped=False) == own, name
        assert len(own.parameters) > 1 or name in ("backend_of",), name
        checked += 1
    assert checked >= 10   # fake_quant, quantize, nvfp4_quantize, group_quantize, ...
    assert "zero_point" in inspect.signature(qc.fake_quant, follow_wrapped=False).parameters
    for deco in (_arrays.interop, _arrays.interop_method):
        hints = typing.get_type_hints(deco)
        assert hints["return"] is hints["func" if deco is _arrays.interop else "method"]
