"""torch's ``test_observers_preserve_buffers``, ported.

Where it comes from: PyTorch's ``test/quantization/core/test_workflow_module.py``
(``TestObserver.test_observers_preserve_buffers``): each observer is built,
the ids of its buffers taken, five ``torch.rand((4, 4, 4))`` batches
observed, and the ids must be unchanged ("observers only modify buffers in
place": nn.DataParallel depends on it).  Here the batches are random numpy
arrays fed to quantcore.compat.torch and to live torch alike; beyond the
ids, the values must agree bit for bit with torch's, and references to the
buffers taken before the first forward (a state dict's, a list's) must hold
the final statistics, as torch's do.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tq = pytest.importorskip("torch.ao.quantization")

from quantcore.compat import torch as qct  # noqa: E402

_OBSERVERS = ["MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
              "MovingAveragePerChannelMinMaxObserver", "HistogramObserver"]


def _buffer_ids(module, names):
    return [id(getattr(module, n)) for n in names]


@pytest.mark.parametrize("name", _OBSERVERS)
def test_observers_preserve_buffers(name):
    ours = getattr(qct, name)(dtype="qint8")
    theirs = getattr(tq, name)(dtype=torch.qint8)
    names = list(dict(theirs.named_buffers()))
    assert set(names) <= set(ours._BUFFERS)
    ids_before = _buffer_ids(ours, names)
    held = [getattr(ours, n) for n in names]            # references taken before
    state = ours.state_dict()
    torch_held = [getattr(theirs, n) for n in names]
    rng = np.random.default_rng(7)
    for _ in range(5):
        x = rng.random((4, 4, 4), dtype=np.float32)
        ours.forward(x)
        theirs(torch.from_numpy(x.copy()))
    assert _buffer_ids(ours, names) == ids_before, f"{name}: buffers must be modified in place"
    # torch's own buffers are the same objects too (the property the test pins)
    assert all(a is getattr(theirs, n) for a, n in zip(torch_held, names))
    for n, ref in zip(names, held):
        want = getattr(theirs, n).detach().numpy()
        got = np.asarray(getattr(ours, n))
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32),
                                                          want.view(np.uint32)), n
        assert ref is getattr(ours, n) and np.array_equal(np.asarray(ref), want), n
        assert np.array_equal(np.asarray(state[n]), want), n


def test_per_channel_buffers_grow_in_place_from_empty():
    obs = qct.PerChannelMinMaxObserver(ch_axis=1)
    mn, mx = obs.min_val, obs.max_val
    assert mn.shape == (0,) and mx.shape == (0,)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 5
    obs.forward(x)
    assert obs.min_val is mn and obs.max_val is mx
    assert np.array_equal(mn, x.min(axis=(0, 2))) and np.array_equal(mx, x.max(axis=(0, 2)))
    # reset rebinds new empty buffers, as torch's reset_min_max_vals does
    obs.reset_min_max_vals()
    assert obs.min_val.shape == (0,) and obs.min_val is not mn
