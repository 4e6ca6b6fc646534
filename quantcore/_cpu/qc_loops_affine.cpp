/*
 * The CPU loops of the elementwise families affine, nudged and amax
 * (qc_families.h over qc_elementwise.h), and the loops that are not per
 * family (min / max, straight-through, the exact affine kernel,
 * torch.histc), for one build (setup.py compiles every qc_loops_*.cpp once
 * per SIMD level: qc_kernels.h).  A unit includes the headers of the
 * families it owns, then qc_cpu_loops.h: this one not qc_formats.h nor
 * qc_mx.h, whose edits do not rebuild it.  An elementwise family added to
 * QC_EW_FAMILIES gets its QC_LOOPS_EW line here or in qc_loops_fp8.cpp.
 */
#include "qc_families.h"
#include "qc_cpu_loops.h"

QC_DEFINE_COMMON_ENTRIES
QC_LOOPS_EW(affine)
QC_LOOPS_EW(nudged)
QC_LOOPS_EW(amax)
