"""Low-precision formats, on numpy (CPU) and cupy (GPU): FP8 casts and fake
quant (:mod:`.fp8`), ONNX QuantizeLinear / DequantizeLinear
(:mod:`.onnx_qdq`), integer group quantization of LLM weights and int4
packing (:mod:`.groups`), the block-scaled MX and NVFP4 formats
(:mod:`.mx`, also :mod:`quantcore.mx`) and their observers
(:mod:`.observers`, also :mod:`quantcore.formats_observers`).

Exact semantics: the project's formats specification (docs/FORMATS.md).
Every per-element rule is one template of ``include/qc_formats.h`` /
``qc_mx.h`` run by the CPU extension and the CUDA kernels alike; these
modules validate arguments, compute the per-tensor / per-channel scales (a
few values) and lay the data out.  The minifloat formats are one table,
``_common.MINIFLOATS``; the casts (:data:`FP8_FORMATS`), the ONNX types
(:data:`ONNX_FP8_FORMATS`) and the MX elements (``mx.MX_ELEMENTS``) each
derive their own allow-list from it.

Codes are returned as integers: FP8 codes as uint8 (the raw bits; view them
as an ``ml_dtypes`` float8 dtype on the CPU if wanted), integer codes as
int8 / uint8 / int16 / uint16 values (int4 / uint4 / int2 / uint2 unpacked,
one per byte; :func:`pack_int4` packs them two per byte).
"""
from ._common import (F8_DEQ_DIV, F8_DEQ_MUL, F8_MASK_AMAX, F8_PLUS_ZERO,  # noqa: F401
                      F8_SCALE_DIV, F8_SCALE_MUL, FP8_FORMATS, FP8_MAX, GRP_F16_SCALE,
                      GRP_HQQ_OWN, GRP_SYMMETRIC, INT_ADD_FLOAT, INT_SIGNED, INT_TYPES,
                      INT_WRAP32, MINIFLOATS, NAN_ENCODING,
                      ONNX_FP4_FORMATS, ONNX_FP8_FORMATS, OVERFLOW, _float_input, formats_for)
from .fp8 import (N_FLOOR_UP, cast_fp8, fp8_decode, fp8_dequantize, fp8_fake_cast,  # noqa: F401
                  fp8_fake_quant, fp8_quantize, fp8_scale, pow2_scale_torch)
from .groups import (GROUP_RECIPES, group_dequantize, group_fake_quant, group_qrange,  # noqa: F401
                     group_quantize, pack_int4, unpack_int4)
from .mx import (mx_dequantize, mx_fake_quant, mx_quantize, nvfp4_dequantize,  # noqa: F401
                 nvfp4_fake_quant, nvfp4_quantize)
from .onnx_qdq import dequantize_linear, quantize_linear  # noqa: F401

__all__ = [
    "FP8_FORMATS", "cast_fp8", "fp8_decode", "fp8_fake_cast", "fp8_scale", "fp8_fake_quant",
    "fp8_quantize", "fp8_dequantize", "quantize_linear", "dequantize_linear",
    "group_quantize", "group_dequantize", "group_fake_quant", "group_qrange",
    "pack_int4", "unpack_int4", "pow2_scale_torch",
    # block-scaled formats (quantcore.formats.mx, also quantcore.mx)
    "mx_quantize", "mx_dequantize", "mx_fake_quant", "nvfp4_quantize", "nvfp4_dequantize",
    "nvfp4_fake_quant",
]
