"""quantcore_gpu: CuPy RawKernel twins of quantcore's CPU kernels.

The CUDA sources in ``cuda/`` ``#include`` ``quantcore/include/qc_elementwise.h``,
so the CPU and GPU paths share every per-element formula and give the same
bits.  :mod:`quantcore_gpu.kernels` mirrors the entry points of
``quantcore._cpu._kernels`` for cupy arrays; :mod:`quantcore_gpu.compile_check`
compiles every source with NVRTC without a GPU (``python -m
quantcore_gpu.compile_check``).

Importing this package does not import cupy; :func:`can_use` says whether
the GPU path can run here.
"""

__all__ = ["can_use"]

_cache = {}


def can_use():
    """(ok, reason): whether the GPU path can be used in this process.

    ``ok`` is True when cupy imports and sees at least one CUDA device; then
    ``reason`` names the device.  Otherwise ``reason`` says what is missing.
    The answer is cached once it is positive (devices do not go away).
    """
    if "ok" in _cache:
        return _cache["ok"]
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return False, f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        return False, f"cupy sees no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "cupy sees no CUDA device"
    try:
        dev = cupy.cuda.runtime.getDevice()
        name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception as exc:
        return False, f"the CUDA device cannot be queried ({type(exc).__name__}: {exc})"
    result = (True, f"device {dev}: {name} ({count} device(s), cupy {cupy.__version__})")
    _cache["ok"] = result
    return result
