"""The functional API: validate, allocate ``out``, pick the back end, call a
kernel.

Every per-element formula lives in ``include/qc_elementwise.h``; this module
only turns arguments into the kernels' parameters.  Each public function has
an unchecked twin (``_affine``, ``_nudged``, ``_amax``) that the compat layers
call with framework-specific parameters (a zero or negative scale in torch,
for example) after doing their own framework's validation.

Precision: float32 input is computed in float32, float64 in float64, and
float16 in float32 with the result rounded back to float16 once.

The package: ``_base`` (mode tables, min / max, the elementwise plumbing),
``affine``, ``nudged_amax``; every name is reachable here as before.
"""
from ._base import (DEQUANT_NARROW, DEQUANT_WIDE, DIVIDE, FMA_ZP, MM_NAN, MM_NEGZERO,  # noqa: F401
                    MM_POSZERO, NF_INT64, NF_NAN_TO_QMIN, NF_PROPAGATE, NONFINITE,  # noqa: F401
                    NO_ZERO_POINT, NUDGED_DIVIDE, NUDGED_FORMULA, NUDGED_TF, OUTPUT_Q,  # noqa: F401
                    ROUNDING, ROUND_F32, ROUND_HALF_AWAY, ROUND_HALF_EVEN,  # noqa: F401
                    ROUND_HALF_UP, SCALE_OP, ZERO_POINT_ADD, ZP_BEFORE, _FAMILIES,  # noqa: F401
                    _MODE_CACHE, _affine_mode_cached, _channel_args, _choice,  # noqa: F401
                    _device_params, _ew, _finish_minmax, _minmax_device,  # noqa: F401
                    _minmax_flags, _outputs, _results, _vector, affine_mode, minmax)  # noqa: F401
from .affine import (_AFFINE, _AMAX, _MASK_DTYPES, _MAX_F, _MAX_W, _NUDGED, _REALS,  # noqa: F401
                     _TINY, _TINY_F, _affine, _affine_channels_fast, _affine_exact,  # noqa: F401
                     _affine_fast, _affine_params, _check_scalar_qparams,  # noqa: F401
                     _check_zero_point, _device_param, _int_dtype_for, _scale_inverse,  # noqa: F401
                     check_scales, check_zero_points, dequantize, fake_quant,  # noqa: F401
                     fake_quant_with_mask, quantize)  # noqa: F401
from .nudged_amax import (_amax, _amax_fast, _nudged, _nudged_fast, fake_quant_amax,  # noqa: F401
                          fake_quant_nudged, ste_backward)  # noqa: F401

__all__ = [
    "minmax", "fake_quant", "fake_quant_with_mask", "quantize", "dequantize",
    "fake_quant_nudged", "fake_quant_amax", "ste_backward",
]
