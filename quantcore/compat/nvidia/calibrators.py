"""PQ's ``calib`` package: ``MaxCalibrator`` (PQ's shape-change error) and
``HistogramCalibrator`` (quantcore.calib's, PQ's already)."""
from ... import calib as _calib


# ----------------------------------------------------------- calibrators
class MaxCalibrator(_calib.MaxCalibrator):
    """PQ's ``MaxCalibrator(num_bits, axis, unsigned, track_amax=False)``:
    :class:`quantcore.calib.MaxCalibrator` with PQ's shape-change error
    (``RuntimeError("amax shape changed!")``); ``num_bits`` is not used by
    the statistic and stored unchecked."""

    def __init__(self, num_bits=8, axis=None, unsigned=False, track_amax=False):
        super().__init__(8, axis, unsigned, track_amax)
        self._num_bits = num_bits

    def collect(self, x):
        """Update the running amax with ``max |x|`` over the reduced axes (a
        cupy x on the device: the amax stays a device array; one byte, the
        NaN check, is read)."""
        try:
            super().collect(x)
        except ValueError as exc:
            if "amax shape changed" in str(exc):
                raise RuntimeError("amax shape changed!") from exc
            raise


HistogramCalibrator = _calib.HistogramCalibrator
