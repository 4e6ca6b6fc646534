# The SIMD build of a module whose loops are built per SIMD level
# (qc_builds.h): _kernels' choice at import (QUANTCORE_SIMD caps it), and a
# switch for the tests, which compare the builds bit for bit.  Included by
# _engines.pyx and _hist.pyx.
cdef extern from "qc_builds.h":
    int qc_simd_level "qc::simd_level"
    int qc_select_simd "qc::select_simd"(int max_level)

#: the builds of the loops by SIMD level (_kernels' names)
_SIMD_LEVELS = {"baseline": 2, "x86-64-v3": 3, "x86-64-v4": 4}


def select_simd(name):
    """Run the loops of the build ``name`` ("baseline", "x86-64-v3",
    "x86-64-v4"), or the best one this CPU has below it; returns the build
    in use.  _kernels' choice at import (QUANTCORE_SIMD caps it) is this
    module's too; for tests, which compare the builds bit for bit."""
    if name not in _SIMD_LEVELS:
        raise ValueError(f"SIMD build {name!r}: expected one of {list(_SIMD_LEVELS)}")
    qc_select_simd(_SIMD_LEVELS[name])
    return simd_variant()


def simd_variant():
    """The build of the loops in use (:func:`select_simd`)."""
    return {v: k for k, v in _SIMD_LEVELS.items()}[qc_simd_level]


from quantcore._cpu._kernels import simd_variant as _kernels_variant  # noqa: E402

select_simd(_kernels_variant())
