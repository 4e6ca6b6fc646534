"""quantcore: framework-free quantization observers and fake quantization
for NumPy (CPU, Cython + OpenMP) and CuPy (GPU) arrays, bit-exact with the
frameworks' own kernels.

The public API is listed in ``__all__``; the framework layers live in
``quantcore.compat.<framework>``.
"""
from . import _signals  # noqa: F401  (first: the quantcore command's Ctrl-C while importing)
from ._arrays import backend_of
from ._cpu import get_num_threads, set_num_threads
from .ops import (dequantize, fake_quant, fake_quant_amax, fake_quant_nudged,
                  fake_quant_with_mask, minmax, quantize, ste_backward)
from .observers import (EMAMinMaxObserver, MinMaxObserver, MomentumMinMaxObserver,
                        MovingAverageMinMaxObserver)
from .fake_quantize import FakeQuantize
from .state import load_state, save_state
from . import qparams
from .formats import (cast_fp8, dequantize_linear, fp8_decode, fp8_dequantize, fp8_fake_cast,
                      fp8_fake_quant, fp8_quantize, group_dequantize, group_fake_quant,
                      group_quantize, pack_int4, quantize_linear, unpack_int4)
from .formats.observers import (AmaxObserver, FP8FakeQuantize, GroupFakeQuantize,
                                GroupMinMaxObserver)
from .formats.mx import (mx_dequantize, mx_fake_quant, mx_quantize, nvfp4_dequantize,
                         nvfp4_fake_quant, nvfp4_quantize)
from . import formats, mx  # (quantcore.mx is quantcore.formats.mx)
from .gguf import gguf_dequantize, gguf_quantize

__version__ = "0.1.0"

__all__ = [
    "minmax", "fake_quant", "fake_quant_with_mask", "quantize", "dequantize",
    "fake_quant_nudged", "fake_quant_amax", "ste_backward",
    "set_num_threads", "get_num_threads", "backend_of", "build_info", "__version__",
    "MinMaxObserver", "MovingAverageMinMaxObserver", "EMAMinMaxObserver",
    "MomentumMinMaxObserver", "FakeQuantize", "save_state", "load_state", "qparams",
    # low-precision formats (quantcore.formats, quantcore.formats_observers)
    "formats", "cast_fp8", "fp8_decode", "fp8_fake_cast", "fp8_fake_quant", "fp8_quantize",
    "fp8_dequantize", "quantize_linear", "dequantize_linear", "group_quantize",
    "group_dequantize", "group_fake_quant", "pack_int4", "unpack_int4", "AmaxObserver",
    "GroupMinMaxObserver", "FP8FakeQuantize", "GroupFakeQuantize",
    # block-scaled formats (quantcore.mx, also in quantcore.formats)
    "mx", "mx_quantize", "mx_dequantize", "mx_fake_quant", "nvfp4_quantize", "nvfp4_dequantize",
    "nvfp4_fake_quant",
    # llama.cpp's GGUF block types (quantcore.gguf)
    "gguf_quantize", "gguf_dequantize",
]


def build_info():
    """How the CPU extension was built, and what it can use now.

    Returns
    -------
    dict with keys ``openmp`` (bool: compiled with OpenMP), ``compiler``,
    ``compiler_version``, ``cflags``, ``ldflags``, ``simd_baseline``
    (``"x86-64-v2"`` or ``"baseline"``), ``simd_runtime_variants`` (the
    builds of the loops chosen at run time: ``["x86-64-v3 (AVX2 + FMA)",
    "x86-64-v4 (AVX-512)"]`` on x86-64), ``simd_in_use`` (``"x86-64-v4"``,
    ``"x86-64-v3"`` or ``"baseline"``: the best build the CPU has;
    ``QUANTCORE_SIMD=baseline`` or ``x86-64-v3`` caps it), ``quick_units``
    (the units compiled at -O1 by ``make demo``'s quick build: same results,
    slower; empty after ``make install``), ``cython_version``,
    ``numpy_build_version``, ``max_threads`` and ``parallel_threshold``.
    """
    from ._cpu import BUILD_CONFIG, _kernels
    from ._cpu.threads import PARALLEL_THRESHOLD

    info = dict(BUILD_CONFIG)
    info["openmp"] = _kernels.openmp_enabled()
    info["simd_in_use"] = _kernels.simd_variant()
    info["max_threads"] = get_num_threads()
    info["parallel_threshold"] = PARALLEL_THRESHOLD
    return info
