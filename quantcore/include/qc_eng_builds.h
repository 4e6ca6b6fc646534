/*
 * qc_eng_builds.h -- the engine writers' row loops (the CPU part of
 * qc_engines.h) chosen at run time among the builds of
 * quantcore/_cpu/qc_eng_loops.cpp (qc_builds.h): the unit is compiled once
 * per SIMD level, each entry eng_<loop> of a build running qc_eng_<loop> of
 * qc_engines.h; the same source and flags (-ffp-contract=off), the same
 * bits (tests/test_simd.py).  qc::select_simd picks the build, in this
 * extension's own qc::simd_level (_engines.pyx follows _kernels' choice).
 * _engines.pyx calls qc_run_eng_<loop>(...), the entry of the build in use.
 */
#ifndef QC_ENG_BUILDS_H
#define QC_ENG_BUILDS_H

#include <stdint.h>

#include "qc_builds.h"

/* X(return type, entry, parameters, arguments): the row loops of qc_engines.h */
#define QC_ENG_ENTRIES(X)                                                                      \
  X(float, eng_absmax_bf16, (const uint16_t *x, int64_t n), (x, n))                            \
  X(float, eng_absmax_f32, (const uint32_t *x, int64_t n), (x, n))                             \
  X(void, eng_fp8_row,                                                                         \
    (const uint8_t *t, const void *x, int bf16, uint8_t *q, int64_t n, float s, int r),        \
    (t, x, bf16, q, n, s, r))                                                                  \
  X(void, eng_fp4_rows,                                                                        \
    (const void *x, int bf16, uint8_t *q, int64_t n, const float *d, int gshift, int r),       \
    (x, bf16, q, n, d, gshift, r))                                                             \
  X(void, eng_group_absmax_rows, (const void *x, int bf16, int64_t n, int gshift, float *out), \
    (x, bf16, n, gshift, out))                                                                 \
  X(void, eng_nvfp4_scales,                                                                    \
    (const float *amax, int64_t n, float g, int recipe, uint8_t *codes, float *divisors),      \
    (amax, n, g, recipe, codes, divisors))                                                     \
  X(void, eng_group_minmax_rows,                                                               \
    (const void *x, int bf16, int64_t n, int gshift, float *lo, float *hi),                    \
    (x, bf16, n, gshift, lo, hi))                                                              \
  X(void, eng_int_rows,                                                                        \
    (const void *x, int bf16, uint8_t *q, int64_t n, const float *s, const float *z,           \
     int gshift, float qmin, float qmax, int r, int pack),                                     \
    (x, bf16, q, n, s, z, gshift, qmin, qmax, r, pack))

QC_BUILDS(QC_ENG_ENTRIES)

#endif /* QC_ENG_BUILDS_H */
