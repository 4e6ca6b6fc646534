/*
 * The loops of qc_cpu_loops.h compiled for x86-64 with AVX2 and FMA,
 * exported as qc_v3::Entries for the run-time choice of qc_kernels.h.
 * Same source and flags as the baseline build (-ffp-contract=off: nothing
 * is contracted into an FMA), so the same bits; setup.py adds this file
 * only where the compiler takes the target pragma (QC_HAVE_V3).
 */
#ifdef QC_HAVE_V3

#include "qc_core.h" /* the C library headers, outside the target region */

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#define QC_LOOPS_NS qc_v3
#include "qc_cpu_loops.h"
#include "qc_kernels.h"

QC_DEFINE_BUILD

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* QC_HAVE_V3 */
