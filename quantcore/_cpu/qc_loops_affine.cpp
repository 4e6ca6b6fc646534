/*
 * The CPU loops of the elementwise families affine, nudged and amax
 * (qc_elementwise.h), and the loops that are not per family (min / max,
 * straight-through, the exact affine kernel, torch.histc, the group
 * recipes), for one build (setup.py compiles every qc_loops_*.cpp once per
 * SIMD level: qc_kernels.h).  An elementwise family added to
 * QC_EW_FAMILIES gets its QC_LOOPS_EW line here or in qc_loops_fp8.cpp.
 */
#define QC_NO_BLOCK_RECIPES
#include "qc_cpu_loops.h"

QC_DEFINE_COMMON_ENTRIES
QC_LOOPS_EW(affine)
QC_LOOPS_EW(nudged)
QC_LOOPS_EW(amax)
