"""PQ's ``nn/modules/tensor_quantizer.py`` and ``clip.py``: ``TensorQuantizer``
(calibration, fake / real quantization, learned amax, NaN handling) and
its ``Clip`` stage."""
import logging

import numpy as np

from ... import _arrays as A
from ... import calib as _calib
from ..._locks import Locked, locked
from .calibrators import HistogramCalibrator, MaxCalibrator
from .tensor_quant import QuantDescriptor, fake_tensor_quant, tensor_quant

F32 = np.float32
_log = logging.getLogger(__name__)


# -------------------------------------------------------- TensorQuantizer
def _settable(attr):
    """A property reading and writing ``attr`` as given (PQ's plain
    getter / setter pairs)."""
    return property(lambda self: getattr(self, attr),
                    lambda self, value: setattr(self, attr, value))


class Clip:
    """PQ's ``Clip`` stage, forward only: ``max(min(x, clip_value_max),
    clip_value_min)`` (NaN propagates).  Learnable values must be scalars."""

    def __init__(self, clip_value_min, clip_value_max, learn_min=False, learn_max=False):
        for value, learn in ((clip_value_min, learn_min), (clip_value_max, learn_max)):
            if learn and not isinstance(value, float) and np.size(value) != 1:
                raise ValueError("clip_value_min/clip_value_max must be scalar for initilizing "
                                 "learnable range.")
        self.clip_value_min = np.array(clip_value_min, dtype=F32)
        self.clip_value_max = np.array(clip_value_max, dtype=F32)
        self.learn_min = bool(learn_min)
        self.learn_max = bool(learn_max)

    def __call__(self, inputs):
        return self.forward(inputs)

    def forward(self, inputs):
        """``max(min(x, clip_value_max), clip_value_min)`` on x's device (the
        two clip values are copied there)."""
        x = A.as_float_array(inputs, "inputs", "Clip")
        xp = A.array_module(x)
        hi = xp.asarray(self.clip_value_max.astype(x.dtype))
        lo = xp.asarray(self.clip_value_min.astype(x.dtype))
        if xp is np:
            return np.maximum(np.minimum(x, hi), lo)
        # numpy's minimum / maximum (a NaN of x or of the bound wins, ties
        # give the bound) as selects on exact comparisons, for scalar and
        # broadcast bounds alike: CuPy's would flush float32 subnormals
        out = xp.where(xp.isnan(x) | A.compare_exact(x, "<", hi), x, hi)
        return xp.where(xp.isnan(out) | A.compare_exact(out, ">", lo), out, lo)

    def __repr__(self):
        return f"Clip(min={self.clip_value_min}, max={self.clip_value_max})"


class TensorQuantizer(Locked):
    """PQ's ``TensorQuantizer``: calibration, clipping and (fake) quantization
    of one tensor, configured by a :class:`QuantDescriptor`.

    ``tq(x)``, in order: disabled -> return x; calibration on -> the
    calibrator collects x; clip on -> ``out = clip(x)``; quant on -> amax
    (the ``_amax`` buffer, else the dynamic ``max |x|`` over the axes not in
    ``axis``, times ``scale_amax``; with ``learn_amax`` the clip range) and
    :func:`fake_tensor_quant` with the descriptor's ``narrow_range``, or
    :func:`tensor_quant` (always narrow, PQ does not pass narrow_range) for
    real quantization, which stores ``scale``.

    See the module docstring for what is not supported.
    """

    def __init__(self, quant_desc=QuantDescriptor(), disabled=False, if_quant=True,
                 if_clip=False, if_calib=False):
        self._num_bits = quant_desc.num_bits
        self._fake_quant = quant_desc.fake_quant
        self._axis = quant_desc.axis
        self._scale_amax = quant_desc.scale_amax
        self._learn_amax = quant_desc.learn_amax
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range

        self._scale = None if not quant_desc.fake_quant else 1.0
        self._disabled = disabled
        self._if_quant = if_quant
        self._if_clip = False
        self._if_calib = if_calib

        if quant_desc.amax is not None:
            self._amax = np.array(quant_desc.amax, dtype=F32)

        if self._learn_amax:
            init_amax = quant_desc.amax if quant_desc.amax is not None else 1.0
            self.clip = Clip(-init_amax, init_amax, learn_min=True, learn_max=True)
            self.enable_clip()
        if if_clip:
            self.enable_clip()

        if quant_desc.calib_method == "histogram":
            _log.info("Creating histogram calibrator")
            self._calibrator = HistogramCalibrator(num_bits=self._num_bits, axis=self._axis,
                                                   unsigned=self._unsigned)
        elif quant_desc.calib_method == "max":
            _log.info("Creating Max calibrator")
            self._calibrator = MaxCalibrator(num_bits=self._num_bits, axis=self._axis,
                                             unsigned=self._unsigned)
        # any other calib_method leaves _calibrator unset (AttributeError later), as PQ

    # ----------------------------------------------------------- properties
    num_bits = _settable("_num_bits")
    unsigned = _settable("_unsigned")
    narrow_range = _settable("_narrow_range")

    @property
    def scale(self):
        if self._fake_quant:
            _log.error("Fake quantize mode doesn't use scale explicitly!")
        if self._scale is None:
            _log.critical("Accessing scale before quantizing any tensor!")
        return self._scale

    @property
    def amax(self):
        """The amax buffer, or None (dynamic amax)."""
        return getattr(self, "_amax", None)

    @amax.setter
    def amax(self, value):
        if value is None:
            _log.error("Setting amax no None is meaningless.")
            return
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            new = np.array(value)
        else:
            new = np.array(value, dtype=F32)
        if not hasattr(self, "_amax"):
            self._amax = new
        else:
            if self._amax.shape != new.shape:
                raise RuntimeError("Changing shape when setting amax is not allowed.")
            np.copyto(self._amax, new, casting="unsafe")

    @property
    def step_size(self):
        if not hasattr(self, "_amax"):
            _log.error("step_size is undefined under dynamic amax mode!")
            return None
        return self._amax / (2.0 ** (self._num_bits - 1 + int(self._unsigned)) - 1.0)

    axis = property(lambda self: self._axis)
    fake_quant = property(lambda self: self._fake_quant)

    # ------------------------------------------------------------- switches
    def disable(self):
        """Bypass the module."""
        self._disabled = True

    def enable(self):
        self._disabled = False

    def disable_clip(self):
        """Disable the clip stage."""
        self._if_clip = False

    def enable_clip(self):
        """Enable the clip stage (needs ``learn_amax``)."""
        _log.warning("Enable `clip` stage for amax learning.")
        if not self._learn_amax:
            raise ValueError("learn_amax is False. Cannot enable clip.")
        self._if_clip = True

    def disable_calib(self):
        self._if_calib = False

    def enable_calib(self):
        if self._calibrator is None:
            raise ValueError("Calibrator was not created, cannot enable calibration.")
        self._if_calib = True

    def disable_quant(self):
        self._if_quant = False

    def enable_quant(self):
        self._if_quant = True

    # ------------------------------------------------------------- amax
    def load_calib_amax(self, *args, **kwargs):
        """Set the amax buffer from the calibrator's ``compute_amax(*args,
        **kwargs)`` (``strict=True`` keyword: a None result raises
        RuntimeError; with ``strict=False`` amax becomes NaN)."""
        strict = kwargs.pop("strict", True)
        if getattr(self, "_calibrator", None) is None:
            raise RuntimeError("Calibrator not created.")
        calib_amax = self._calibrator.compute_amax(*args, **kwargs)
        if calib_amax is None:
            err_msg = ("Calibrator returned None. This usually happens when calibrator hasn't "
                       "seen any tensor.")
            if not strict:
                _log.warning(err_msg)
                _log.warning("Set amax to NaN!")
                calib_amax = np.array(np.nan, dtype=F32)
            else:
                raise RuntimeError(err_msg + " Passing 'strict=False' to `load_calib_amax()` "
                                   "will ignore the error.")
        calib_amax = np.asarray(A.to_host(calib_amax))  # (a device amax: C values read)
        if not hasattr(self, "_amax"):
            self._amax = calib_amax.copy()
        else:
            try:
                np.copyto(self._amax, calib_amax, casting="unsafe")
            except ValueError as exc:
                raise RuntimeError(f"cannot copy a calibrated amax of shape {calib_amax.shape} "
                                   f"into the amax buffer of shape {self._amax.shape}") from exc

    def init_learn_amax(self):
        """Initialize the learned range from the fixed amax."""
        if self._learn_amax is False:
            raise RuntimeError("Called init_learn_amax with learn_amax=False.")
        amax = np.asarray(self._amax)
        init = amax.max() if amax.size != 1 else amax.reshape(())
        self.clip.clip_value_min = np.array(-init, dtype=F32)
        self.clip.clip_value_max = np.array(init, dtype=F32)

    def _get_amax(self, inputs):
        if hasattr(self, "_amax"):
            amax = self._amax
        else:
            # the calibrator's axis rule (module docstring, "Axes")
            reducer = _calib.MaxCalibrator(axis=self._axis)
            reducer.collect(inputs)
            amax = reducer.compute_amax()
        if A.is_cupy_array(amax):  # (a dynamic amax of cupy inputs: on the device)
            if self._scale_amax is not None:
                amax = A.channel_arith("multiply", amax, amax.dtype.type(self._scale_amax))
            return amax if amax.dtype in (np.float32, np.float64) else amax.astype(F32)
        if self._scale_amax is not None:
            amax = np.asarray(amax)
            amax = (amax * amax.dtype.type(self._scale_amax)).astype(amax.dtype)
        amax = np.asarray(amax)
        if amax.dtype not in (np.float32, np.float64):
            amax = amax.astype(F32)
        return amax

    # -------------------------------------------------------------- forward
    def _quant_forward(self, inputs):
        if self._num_bits == (4, 3):
            raise NotImplementedError("TensorQuantizer: E4M3 (num_bits=(4, 3)) is not "
                                      "supported by quantcore")
        if self._learn_amax:
            inputs = self.clip(inputs)
            amax = np.maximum(-self.clip.clip_value_min, self.clip.clip_value_max)
        else:
            amax = self._get_amax(inputs)
        if self._fake_quant:
            return fake_tensor_quant(inputs, amax, self._num_bits, self._unsigned,
                                     self._narrow_range)
        outputs, self._scale = tensor_quant(inputs, amax, self._num_bits, self._unsigned)
        return outputs

    @locked
    def __call__(self, inputs):
        return self.forward(inputs)

    def forward(self, inputs):
        """Calibrate / clip / quantize ``inputs`` as the switches say.  cupy
        inputs are calibrated and quantized on the device (a fixed amax is
        copied down, C values; the Clip stage of learn_amax too)."""
        if self._disabled:
            return inputs
        inputs = A.as_float_array(inputs, "inputs", "TensorQuantizer")
        outputs = inputs
        if self._if_calib:
            if self._calibrator is None:
                raise RuntimeError("Calibrator was not created.")
            self._calibrator.collect(inputs)
        if self._if_clip:
            if not self._learn_amax:
                raise RuntimeError("Clip without learning amax is not implemented.")
            outputs = self.clip(inputs)
        if self._if_quant:
            outputs = self._quant_forward(inputs)
        return outputs

    # ----------------------------------------------------------------- repr
    def _short_amax(self, fmt=".4f"):
        if not hasattr(self, "_amax"):
            return "dynamic"
        if self._amax.size == 1:
            return "{:{fmt}}".format(float(self._amax.reshape(-1)[0]), fmt=fmt)
        return "[{:{fmt}}, {:{fmt}}]({})".format(float(self._amax.min()), float(self._amax.max()),
                                                 self._amax.size, fmt=fmt)

    def extra_repr(self):
        if self._disabled:
            return "disabled"
        s = "{}{}bit".format("unsigned " if self._unsigned else "", self._num_bits)
        s += " narrow" if self._narrow_range else ""
        s += " fake" if self._fake_quant else ""
        s += " axis={}".format(self._axis) if self._axis is not None else " per-tensor"
        s += " amax={}".format(self._short_amax())
        s += " *{}".format(self._scale_amax) if self._scale_amax else ""
        s += " learned" if self._learn_amax else ""
        calibrator = getattr(self, "_calibrator", None)
        s += " calibrator={}".format(type(calibrator).__name__) if calibrator is not None else ""
        s += " scale={}".format(self._scale) if self._scale is not None else ""
        s += " quant" if self._if_quant else ""
        s += " clip" if self._if_clip else ""
        s += " calib" if self._if_calib else ""
        return s

    def __repr__(self):
        return f"TensorQuantizer({self.extra_repr()})"
