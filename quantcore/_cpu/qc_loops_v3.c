/*
 * The loops of qc_cpu_loops.h compiled for x86-64 with AVX2 and FMA, and
 * exported as <name>_v3 for the run-time choice of qc_dispatch.h.  Same
 * source and flags as the baseline build (-ffp-contract=off: nothing is
 * contracted into an FMA), so the same bits; setup.py adds this file only
 * where the compiler takes the target pragma (QC_HAVE_V3).
 */
#ifdef QC_HAVE_V3

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#define QC_LOOPS_V3_SOURCE
#include "qc_dispatch.h"

#define QC_EXPORT_V3(name, params, args) void name##_v3 params { name args; }
QC_LOOP_ENTRIES(QC_EXPORT_V3)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif /* QC_HAVE_V3 */
