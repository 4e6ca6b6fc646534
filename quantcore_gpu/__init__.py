"""quantcore_gpu: CuPy RawKernel twins of quantcore's CPU kernels.

Not implemented yet: ``quantcore`` raises NotImplementedError for cupy
arrays.  The kernels will ``#include`` ``quantcore/include/qc_elementwise.h``
so CPU and GPU share every per-element formula.
"""


def can_use():
    """(ok, reason): whether the GPU path can be used in this process."""
    return False, "quantcore_gpu kernels are not implemented yet"
