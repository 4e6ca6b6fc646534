"""Calibrators: max and histogram statistics turned into a clipping range.

Two families, on numpy or cupy arrays (no SciPy, no PyTorch at run time):

* :class:`MaxCalibrator` and :class:`HistogramCalibrator` reproduce NVIDIA
  ``pytorch_quantization`` (PQ) calibrators bit for bit on float32, including
  the float32 rules of ``torch.histc``, ``torch.linspace`` and ``torch.arange``
  that PQ's default ``torch_hist=True`` path depends on
  (the project's NVIDIA / Horizon specification section 3).
* :class:`TorchHistogram` is the statistics half of PyTorch's
  ``torch.ao.quantization.HistogramObserver`` (the project's PyTorch specification section 2): the
  running histogram with its re-binning on range growth, and the greedy L2
  ("NormMinimization") search for the clipping range.  Turning the range into
  ``(scale, zero_point)`` is left to ``quantcore.qparams``.

Every statistic is data: ``state_dict()`` returns numpy arrays and plain
Python scalars only, ``load_state_dict()`` restores it exactly, and ``merge``
combines two calibrators that saw different data (exactly, where the
statistic allows it).

Thread safety: a calibrator may be shared between threads.  ``collect``,
``compute_amax``, ``merge`` and the state methods hold a per-instance lock
(``quantcore._locks``), so concurrent calls run one at a time: counts over a
fixed range and maxima are then the serial result bit for bit, whatever the
interleaving; a histogram whose range grows is the serial result of the
order in which the calls took the lock.

The float32 models of PyTorch CPU primitives these use (histc, linspace,
arange, the cascade sum) are in :mod:`quantcore.torch_numerics`.

cupy input is reduced and binned on the device: the batch never leaves it.
What crosses to the host, where the frameworks synchronise too (PQ's
``torch.min(x) < 0`` / ``x.max()`` / ``histc(max=...)``, torch's
HistogramObserver's ``.item()`` calls):

* MaxCalibrator: the amax stays a device array; one byte per ``collect``
  (whether it holds NaN, to raise).
* HistogramCalibrator, TorchHistogram: the batch's min and max (8 bytes)
  and its histogram counts (``bins`` values: the statistics, the bin edges
  and the threshold searches live on the host); the torch_hist=False first
  batch also reads the range it bins (8 bytes), and an input holding +-inf
  (TorchHistogram drops those values) its finite range.
"""
from .histogram import (HistogramCalibrator, _entropy_divergence, _entropy_screen,  # noqa: F401
                        _kl_divergence)
from .max_calibrator import MaxCalibrator
from .torch_histogram import TorchHistogram

__all__ = ["MaxCalibrator", "HistogramCalibrator", "TorchHistogram"]
