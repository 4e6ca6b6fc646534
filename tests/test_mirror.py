"""The --mirror-cupy harness (tests/mirror.py) catches what it is there to
catch: a device result with other bits, a result left on the host, an
in-place update missed on the device, an object's state that drifts, and a
device-only exception; and it passes a faithful twin."""
import types

import numpy as np
import pytest

import mirror
import quantcore_gpu

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON))]


def _module(**members):
    module = types.ModuleType("quantcore.compat.fake_for_mirror")
    for name, member in members.items():
        if isinstance(member, type):
            member.__module__ = module.__name__
        setattr(module, name, member)
    module.__all__ = list(members)
    return module


def _mirrored(module):
    namespace = {}
    patches = mirror.install([module], cp, namespace)
    return patches


def _run(module, call):
    patches = _mirrored(module)
    try:
        return call()
    finally:
        mirror.uninstall(patches)


X = np.linspace(-1, 1, 7, dtype=np.float32)


def test_a_faithful_function_passes():
    m = _module(double=lambda x: x * np.float32(2))
    assert np.array_equal(_run(m, lambda: m.double(X)), X * 2)


@pytest.mark.parametrize("bad, message", [
    (lambda x: x * np.float32(2) + (0 if isinstance(x, np.ndarray) else np.float32(1e-7)),
     "bits differ"),
    (lambda x: x * np.float32(2) if isinstance(x, np.ndarray) else (x * 2).get(),
     "cupy gave ndarray"),
    (lambda x: x.sum() if isinstance(x, np.ndarray) else x.reshape(-1)[:1].sum(), " vs "),
])
def test_a_device_result_that_differs_fails(bad, message):
    m = _module(f=bad)
    with pytest.raises(mirror.MirrorMismatch, match=message):
        _run(m, lambda: m.f(X))


def test_a_missed_in_place_update_fails():
    def scale_in_place(x):
        if isinstance(x, np.ndarray):
            x *= 2
        return None
    m = _module(f=scale_in_place)
    with pytest.raises(mirror.MirrorMismatch, match="updated in place"):
        _run(m, lambda: m.f(X.copy()))


def test_a_device_only_exception_fails():
    def host_only(x):
        if not isinstance(x, np.ndarray):
            raise TypeError("no device path")
        return x
    m = _module(f=host_only)
    with pytest.raises(mirror.MirrorMismatch, match="cupy raised TypeError"):
        _run(m, lambda: m.f(X))


def test_object_state_that_drifts_fails_and_a_faithful_one_passes():
    class Running:
        def __init__(self, drift):
            self.total = np.zeros(1, np.float32)
            self.drift = drift

        def update(self, x):
            xp = cp if isinstance(x, cp.ndarray) else np
            self.total = xp.asarray(self.total) + x.sum()
            if self.drift and xp is cp:
                self.total = self.total + np.float32(1)
            return None

    m = _module(Running=Running)

    def steps(drift):
        r = m.Running(drift)
        r.update(X)
        r.update(X)

    _run(m, lambda: steps(False))
    with pytest.raises(mirror.MirrorMismatch, match="state total differs"):
        _run(m, lambda: steps(True))
