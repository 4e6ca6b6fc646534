"""The switches of every FakeQuantize-like class, once: fake quant and
observer on / off, training / inference.

``fake_quant_enabled`` / ``observer_enabled`` are plain bools on the core
:class:`quantcore.FakeQuantize`, and flag buffers (element 0 of an integer
array, shared like torch's buffers) on the framework layers' modules; both
are set here.  torch's switches return None, the others ``self`` (for
chaining): ``_SWITCHES_RETURN_SELF``.
"""
import numpy as np


class TrainEval:
    """``train(mode=True)`` / ``eval()``: the ``training`` flag; both return
    ``self``, as torch's modules."""

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)


class Switches(TrainEval):
    """``enable_fake_quant`` / ``disable_fake_quant`` / ``enable_observer`` /
    ``disable_observer``, and ``train`` / ``eval``."""

    _SWITCHES_RETURN_SELF = True

    def _set_switch(self, name, enabled):
        flag = getattr(self, name, None)
        if isinstance(flag, np.ndarray) or type(flag).__module__.startswith("cupy"):
            flag[0] = 1 if enabled else 0  # (a flag buffer, on the host or a device)
        else:
            setattr(self, name, bool(enabled))
        return self if self._SWITCHES_RETURN_SELF else None

    def enable_fake_quant(self, enabled=True):
        return self._set_switch("fake_quant_enabled", enabled)

    def disable_fake_quant(self):
        return self.enable_fake_quant(False)

    def enable_observer(self, enabled=True):
        return self._set_switch("observer_enabled", enabled)

    def disable_observer(self):
        return self.enable_observer(False)
