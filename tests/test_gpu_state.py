"""FakeQuantize keeps one state whether its batches are numpy or cupy
arrays: qparams set through the setters, batch counts and statistics
observed on either back end carry over to the other, in any order.

Runs on a GPU, or on the CUDA emulator (``make gpu-emu-test``); skipped
otherwise.
"""
import warnings

import numpy as np
import pytest

import quantcore as qc
import quantcore_gpu
from reference import assert_bits_equal, to_numpy

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON))]


def pm(v, xp=np):
    return xp.asarray(np.array([-v, v], np.float32))


def test_setter_qparams_are_used_on_the_device():
    """scale 0.05, zero point 10 set by hand, observer disabled: x = -3
    quantizes to qmin = 0 -> (0 - 10) * 0.05 = -0.5 on both back ends."""
    def make():
        fq = qc.FakeQuantize(qc.MinMaxObserver(), 0, 255)
        fq.disable_observer()
        fq.scale = 0.05
        fq.zero_point = 10
        return fq
    x = np.array([-3.0, 0.0, 1.0], np.float32)
    cpu, gpu = make(), make()
    y_cpu = cpu(x)
    y_gpu = gpu(cp.asarray(x))
    assert y_cpu[0] == np.float32(-0.5)
    assert_bits_equal(y_gpu, y_cpu)


def test_setters_after_device_forwards_take_effect():
    fq = qc.FakeQuantize(qc.MinMaxObserver(), 0, 255)
    fq(cp.asarray(np.linspace(-1, 1, 50, dtype=np.float32)))
    fq.disable_observer()
    fq.scale = 0.25
    fq.zero_point = 3
    y = fq(cp.asarray(np.array([1.0, -0.1], np.float32)))
    assert to_numpy(y).tolist() == [1.0, 0.0]
    assert float(fq.scale[0]) == 0.25 and int(fq.zero_point[0]) == 3


def test_skipped_batches_before_the_first_are_kept():
    """nonfinite_batches counted on the host survive the move to the device."""
    fq = qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.5), 0, 255)
    with pytest.warns(RuntimeWarning, match="NaN or inf"):
        fq(np.array([np.nan, 1.0], np.float32))
    fq(pm(1.0, cp))
    assert fq.observer.nonfinite_batches == 1
    assert fq.observer.num_batches == 1


@pytest.mark.parametrize("kind", ["fake_quantize", "fake_quantize_per_channel"])
def test_alternating_numpy_and_cupy_batches(kind):
    """MovingAverageMinMaxObserver(0.5) fed +-1 (cupy), +-4 (numpy), +-2
    (cupy): min = -1, then -2.5, then -2.25 after three batches, on both
    back ends, and the same outputs as an all-numpy run."""
    def make():
        if kind == "fake_quantize":
            return qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.5), -128, 127)
        return qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.5, axis=0), -128, 127, axis=0)
    mixed, host = make(), make()
    for v, xp in ((1.0, cp), (4.0, np), (2.0, cp), (3.0, np), (0.5, np), (8.0, cp)):
        x = np.array([[-v, v], [-v / 2, v / 2]], np.float32)
        assert_bits_equal(mixed(xp.asarray(x)), host(x), f"batch +-{v}")
        if v == 2.0:
            assert mixed.observer.num_batches == 3
            assert np.all(to_numpy(mixed.observer.min_val) == np.float32(-2.25) *
                          (np.array([1.0, 0.5], np.float32) if kind.endswith("channel") else 1))
    for name in ("min_val", "max_val"):
        assert_bits_equal(getattr(mixed.observer, name), getattr(host.observer, name), name)
    assert_bits_equal(mixed.scale, host.scale, "scale")
    assert np.array_equal(mixed.zero_point, host.zero_point)


def test_observer_changed_directly_between_device_forwards():
    """A change made to the observer itself (not through FakeQuantize) is
    what the next device forward starts from."""
    fq = qc.FakeQuantize(qc.MinMaxObserver(), 0, 255)
    fq(pm(1.0, cp))
    fq.observer.reset()
    fq(pm(0.5, cp))
    assert float(fq.observer.max_val) == 0.5 and fq.observer.num_batches == 1
    ref = qc.FakeQuantize(qc.MinMaxObserver(), 0, 255)
    ref(pm(0.5))
    assert_bits_equal(fq.scale, ref.scale)


def test_load_state_dict_between_device_forwards():
    src = qc.FakeQuantize(qc.MinMaxObserver(), 0, 255)
    src(pm(3.0))
    fq = qc.FakeQuantize(qc.MinMaxObserver(), 0, 255)
    fq(pm(1.0, cp))
    fq.load_state_dict(src.state_dict())
    fq.disable_observer()
    x = np.linspace(-3, 3, 11, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_bits_equal(fq(cp.asarray(x)), src.disable_observer()(x))


def test_channel_count_errors_match_the_host_path():
    """The device path raises the host path's errors, word for word."""
    def run(xp):
        fq = qc.FakeQuantize(qc.MinMaxObserver(axis=1), -128, 127, axis=1)
        fq(xp.asarray(np.ones((2, 3), np.float32)))
        with pytest.raises(ValueError) as err:
            fq(xp.asarray(np.ones((2, 4), np.float32)))
        return str(err.value)
    assert run(cp) == run(np)

    def run_qparams(xp):
        fq = qc.FakeQuantize(qc.MinMaxObserver(axis=1), -128, 127, axis=1)
        fq.disable_observer()
        fq.scale = np.full(3, 0.1)
        fq.zero_point = np.zeros(3)
        with pytest.raises(ValueError) as err:
            fq(xp.asarray(np.ones((2, 4), np.float32)))
        return str(err.value)
    assert run_qparams(cp) == run_qparams(np)
