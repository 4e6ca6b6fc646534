"""NVIDIA ``pytorch_quantization`` (PQ v2.2.1) on NumPy arrays.

The descriptor, the quantization functions, the calibrators and
``TensorQuantizer`` of ``pytorch_quantization`` with PQ's names, argument
order, defaults and error messages (the project's NVIDIA / Horizon specification sections 1-4).
This layer only translates arguments: every element goes through
:func:`quantcore.ops._amax` (the shared ``qc_fq_amax`` formula),
:func:`quantcore.ops._affine` and :func:`quantcore.ops._nudged` (its range
mask, for the backward's select); statistics come from
:mod:`quantcore.calib`; scales from :mod:`quantcore.qparams`.

>>> import numpy as np
>>> from quantcore.compat.nvidia import fake_tensor_quant, tensor_quant
>>> x = np.array([-1.5, 0.3, 1.0], dtype=np.float32)
>>> q, scale = tensor_quant(x, np.float32(1.0))
>>> q, scale
(array([-127.,   38.,  127.], dtype=float32), array(127., dtype=float32))
>>> float(fake_tensor_quant(x, np.float32(1.0))[1])
0.29921260476112366

Decisions (the specification's decisions, "NVIDIA pytorch_quantization")
------------------------------------------------------------
- The CPU path is the reference: ``fake_tensor_quant`` computes
  ``q = clamp(rint(x * scale), min_bound, max_bound)`` with the multiplier
  ``scale = max_bound / amax`` and returns ``q / scale`` (a division).
  ``narrow_range`` is honoured everywhere (PQ's CUDA launch bug, which
  always clamps signed values to ``[-max_bound, max_bound]``, is not
  reproduced).  ``amax <= 2**-24`` gives zeros and scale 1.
- float16 input is computed in float32 and cast to float16 once at the end
  (as modelopt).  PQ divides in float16 by a float16-rounded scale; about
  20% of random float16 values differ from PQ by one float16 ulp.
- ``ScaledQuantDescriptor.dict()`` / ``to_yaml()`` produce PQ's output
  exactly (sorted keys, ``calib_method`` and ``narrow_range`` not written);
  ``from_yaml`` uses ``yaml.safe_load``.  PyYAML is an optional dependency
  of this module only and is imported when ``to_yaml`` / ``from_yaml`` run.
- ``HistogramCalibrator`` (``torch_hist=True``) reproduces torch's
  ``histc`` / ``linspace`` / ``arange`` rules; entropy needs no SciPy.

Further behaviour choices
-------------------------
- Arrays: ``inputs`` is a float16/32/64 array (or a Python scalar / list);
  ``amax`` may be a Python float, a list or an array.  A Python float or
  list amax is read as float32 (``torch.tensor`` would give float32); amax
  is computed in the compute dtype of the input (float32 for float16 and
  float32 input, float64 for float64 input).  PQ computes the scale of
  float64 input in the amax's dtype (float32 for a float32 amax) and
  multiplies in float64; quantcore computes it in float64 (results can
  differ at rare ties).
- Broadcasting: ``amax`` broadcasts NumPy-style, as in PQ.  One element is
  per tensor; a keep-dims amax with one non-1 dimension (``(C, 1, 1, 1)``,
  ``(1, C, 1, 1)``, ``(C,)`` against the last axis) maps to the core's
  per-channel kernel along that axis; any other broadcast (several non-1
  dimensions) runs the same kernel with one amax per element.  The result
  has the broadcast shape.
- Errors: PQ's messages and types: ``TypeError("Negative values encountered
  in unsigned quantization.")`` (checked first), ``ValueError("Negative values
  in amax")``.  ``num_bits`` must be an int in 2..16 (ValueError), an amax
  that does not broadcast raises ValueError (torch: RuntimeError).
- ``tensor_quant`` returns ``q`` as floats of the input dtype and the final
  scale (1 where ``amax <= 2**-24``) of amax's shape.  The core's amax
  kernel divides by ``scale`` at the end, so ``q`` is recovered exactly as
  ``rint(y * scale)`` (see :func:`_q_of`).  float16 input: ``q`` is cast
  to float16, and a scale above 65504 raises PQ's ValueError.
- Backward functions: ``fake_tensor_quant_backward(grad_outputs, inputs,
  amax)`` passes the gradient where ``|x| <= amax`` (inclusive, NaN input
  blocks it) and ``fake_affine_tensor_quant_backward`` where
  ``min_range <= x <= max_range``.  As PQ's ``torch.where(mask, grad, 0)``
  this is a select: the zero elsewhere is ``+0.0`` and a NaN gradient
  there gives 0.
- ``fake_affine_tensor_quant`` is per tensor (``min_range`` / ``max_range``
  one value each, as PQ documents); its step and zero are
  :func:`quantcore.qparams.pq_affine_qparams` in the compute dtype of the
  input.  For float16 input PQ computes in float16 (0-d tensors do not
  promote); quantcore in float32.
- Calibrators: :class:`HistogramCalibrator` is
  :class:`quantcore.calib.HistogramCalibrator`; :class:`MaxCalibrator` wraps
  :class:`quantcore.calib.MaxCalibrator` so that a shape change raises PQ's
  ``RuntimeError("amax shape changed!")`` and ``num_bits`` (unused by the
  max statistic) is stored unchecked, as PQ.  NaN input raises ValueError
  in both (PQ stores NaN / fails in ``histc``).  Results are numpy arrays
  (0-d per tensor, keep-dims per channel).
- ``TensorQuantizer``: state lives in numpy arrays (``_amax`` float32, or
  the float dtype of an ndarray given to the ``amax`` setter).  The dynamic
  amax is a :class:`quantcore.calib.MaxCalibrator` reduction (NaN input
  raises ValueError; PQ would produce NaN).  ``scale_amax`` multiplies amax
  in amax's dtype.  Messages that PQ logs are sent to the ``logging``
  logger of this module.  Not supported: E4M3 (``num_bits=(4, 3)``:
  NotImplementedError on the quantize step), ONNX export /
  ``use_fb_fake_quant``, ``_pre_quant_scale``, state-dict loading hooks,
  and learning amax: ``learn_amax`` creates the :class:`Clip` stage and its
  forward (``max(min(x, clip_max), clip_min)``, NumPy, exact) runs, but there
  is no autograd, so the clip values never change (the PACT gradient
  ``gx = g*[min < x < max]``, ``gmax = sum(g*[x >= max])``,
  ``gmin = sum(g*[x <= min])`` is not provided).
- Axes (``axis`` of the descriptor, ``MaxCalibrator`` and the dynamic amax
  of ``TensorQuantizer``): one rule everywhere, the seed page's (PQ 2.1):
  the axes that keep their own amax, each in ``[-rank, rank)``; a negative
  axis counts from the end (``axis=(-1,)`` is per channel along the last
  axis) and an axis outside that range raises ValueError.  PQ 2.1's code
  compares ``i in axis`` for ``i in range(rank)``, so there a negative or
  out-of-range axis matches no dimension and the amax silently becomes per
  tensor; that is not reproduced.
- Predefined descriptors follow PQ HEAD: weights ``axis=(0)``, ConvTranspose
  weights ``axis=(1)`` (PQ before TRT 10.9 and modelopt used 0).
"""
# PQ's own files: tensor_quant (the descriptor, the functions), calibrators,
# tensor_quantizer (TensorQuantizer, Clip).  Every name is re-exported here.
from .calibrators import HistogramCalibrator, MaxCalibrator  # noqa: F401
from .tensor_quant import (QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,  # noqa: F401
                           QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
                           QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
                           QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
                           QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
                           QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
                           QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW, QUANT_DESC_8BIT_PER_TENSOR,
                           QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR, QuantDescriptor,
                           ScaledQuantDescriptor, fake_affine_tensor_quant,
                           fake_affine_tensor_quant_backward, fake_tensor_quant,
                           fake_tensor_quant_backward, tensor_quant)
from .tensor_quantizer import Clip, TensorQuantizer  # noqa: F401

__all__ = [
    "ScaledQuantDescriptor", "QuantDescriptor",
    "QUANT_DESC_8BIT_PER_TENSOR", "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL", "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
    "tensor_quant", "fake_tensor_quant", "fake_tensor_quant_backward",
    "fake_affine_tensor_quant", "fake_affine_tensor_quant_backward",
    "MaxCalibrator", "HistogramCalibrator", "TensorQuantizer", "Clip",
]
