/*
 * qc_hist_builds.h -- numpy.histogram's counting loops (qc_np_histogram.h,
 * rule 3) chosen at run time among the builds of quantcore/_cpu/
 * qc_hist_loops.cpp (qc_builds.h): the unit is compiled once per SIMD
 * level; the same source and flags (-ffp-contract=off), the same counts
 * (tests/test_simd.py).  _hist.pyx calls qc_run_<loop>(...), the entry of
 * the build in use (its own qc::simd_level, following _kernels' choice).
 */
#ifndef QC_HIST_BUILDS_H
#define QC_HIST_BUILDS_H

#include <stdint.h>

#include "qc_builds.h"

/* X(return type, entry, parameters, arguments): the loops of qc_np_histogram.h */
#define QC_HIST_ENTRIES(X)                                                                     \
  X(void, np_hist_uniform_count_f32,                                                           \
    (const float *x, int64_t cnt, float first, float last, float denom, float fn, int64_t n,   \
     const float *edges, float margin, int32_t zero_bin, int absolute, int64_t *counts),       \
    (x, cnt, first, last, denom, fn, n, edges, margin, zero_bin, absolute, counts))            \
  X(void, np_hist_edges_count_f32,                                                             \
    (const float *x, int64_t cnt, const double *edges, int64_t n, double inv_width,            \
     int absolute, int64_t *counts),                                                           \
    (x, cnt, edges, n, inv_width, absolute, counts))                                           \
  X(void, np_abs_bits_range, (const uint32_t *x, int64_t cnt, int32_t *out), (x, cnt, out))

QC_BUILDS(QC_HIST_ENTRIES)

#endif /* QC_HIST_BUILDS_H */
