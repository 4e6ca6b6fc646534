"""PyTorch 2.13 ``torch.ao.quantization`` on numpy and cupy arrays.

Observers, fake-quantize modules and the fake-quant functions of
``torch.ao.quantization`` as plain Python classes, bit for bit with torch
2.13.0+cpu on x86-64.  Torch dtypes and qschemes are given as strings
(``"quint8"``, ``"torch.per_channel_symmetric"``) or as torch's own
objects; exceptions keep torch's type (also a ``ValueError`` /
``TypeError``) and text; state is shared like torch's buffers.  Every torch
quirk reproduced, and those consciously not, with the tests that show each:
``docs/compat_torch.md``.

The package is split like torch's own files: :mod:`.observer`,
:mod:`.fake_quantize`, :mod:`.functional` (the fake-quant ops), :mod:`.lsq`
(learnable fake quant), :mod:`.fused` (``fused_moving_avg_obs_fake_quant``),
:mod:`.defaults` (the predefined partials); :mod:`._common` holds the
dtypes, ranges, ``with_args`` and the module base.  How torch computes
(float32 histc, linspace, cascade sums, FMA, x86 integer conversions) is
modelled in :mod:`quantcore.torch_numerics`.

cupy input: everything computes on the device (the observers, the
fake-quant ops, the LSQ functions and their backward, the fused op and the
FakeQuantize modules); what crosses to the host, and where, is listed in
``docs/compat_torch.md``.
"""
from .defaults import *  # noqa: F401,F403
from .defaults import __all__ as _defaults_all
from .fake_quantize import (
                            FakeQuantize,
                            FixedQParamsFakeQuantize,
                            FusedMovingAvgObsFakeQuantize,
                            disable_fake_quant,
                            disable_observer,
                            enable_fake_quant,
                            enable_observer,
)
from .functional import (
                            fake_quantize_per_channel_affine,
                            fake_quantize_per_channel_affine_cachemask,
                            fake_quantize_per_tensor_affine,
                            fake_quantize_per_tensor_affine_cachemask,
)
from .fused import fused_moving_avg_obs_fake_quant
from .lsq import (
                            fake_quantize_learnable_per_channel_affine,
                            fake_quantize_learnable_per_channel_affine_backward,
                            fake_quantize_learnable_per_tensor_affine,
                            fake_quantize_learnable_per_tensor_affine_backward,
)
from .observer import (
                            FixedQParamsObserver,
                            HistogramObserver,
                            MinMaxObserver,
                            MovingAverageMinMaxObserver,
                            MovingAveragePerChannelMinMaxObserver,
                            PerChannelMinMaxObserver,
)

__all__ = [
    "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver", "HistogramObserver", "FixedQParamsObserver",
    "FakeQuantize", "FixedQParamsFakeQuantize", "FusedMovingAvgObsFakeQuantize",
    "fake_quantize_per_tensor_affine", "fake_quantize_per_tensor_affine_cachemask",
    "fake_quantize_per_channel_affine", "fake_quantize_per_channel_affine_cachemask",
    "fake_quantize_learnable_per_tensor_affine",
    "fake_quantize_learnable_per_tensor_affine_backward",
    "fake_quantize_learnable_per_channel_affine",
    "fake_quantize_learnable_per_channel_affine_backward",
    "fused_moving_avg_obs_fake_quant",
    "enable_fake_quant", "disable_fake_quant", "enable_observer", "disable_observer",
] + list(_defaults_all)
