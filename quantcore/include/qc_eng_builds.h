/*
 * qc_eng_builds.h -- the engine writers' row loops (the CPU part of
 * qc_engines.h) chosen at run time among the builds of
 * quantcore/_cpu/qc_eng_loops.cpp, as _kernels' loops are (qc_kernels.h):
 * the unit is compiled once per SIMD level into the namespaces qc_base,
 * qc_v3 (x86-64-v3: AVX2 + FMA) and qc_v4 (x86-64-v4: AVX-512) as
 * eng_<entry>; the same source and flags (-ffp-contract=off), the same
 * bits (tests/test_simd.py).  qc::select_simd picks the build, in this
 * extension's own qc::simd_level (_engines.pyx follows _kernels' choice).
 * _engines.pyx calls qc_eng_run_<entry>(...), the entry of the build in use.
 */
#ifndef QC_ENG_BUILDS_H
#define QC_ENG_BUILDS_H

#include <stdint.h>

#include "qc_kernels.h"

/* X(return type, entry, parameters, arguments): the row loops of qc_engines.h */
#define QC_ENG_ENTRIES(X)                                                                      \
  X(float, absmax_bf16, (const uint16_t *x, int64_t n), (x, n))                                \
  X(float, absmax_f32, (const uint32_t *x, int64_t n), (x, n))                                 \
  X(void, fp8_row,                                                                             \
    (const uint8_t *t, const void *x, int bf16, uint8_t *q, int64_t n, float s, int r),        \
    (t, x, bf16, q, n, s, r))                                                                  \
  X(void, fp4_rows,                                                                            \
    (const void *x, int bf16, uint8_t *q, int64_t n, const float *d, int gshift, int r),       \
    (x, bf16, q, n, d, gshift, r))                                                             \
  X(void, group_absmax_rows, (const void *x, int bf16, int64_t n, int gshift, float *out),      \
    (x, bf16, n, gshift, out))                                                                 \
  X(void, nvfp4_scales,                                                                        \
    (const float *amax, int64_t n, float g, int recipe, uint8_t *codes, float *divisors),      \
    (amax, n, g, recipe, codes, divisors))                                                     \
  X(void, group_minmax_rows,                                                                   \
    (const void *x, int bf16, int64_t n, int gshift, float *lo, float *hi),                    \
    (x, bf16, n, gshift, lo, hi))                                                              \
  X(void, int_rows,                                                                            \
    (const void *x, int bf16, uint8_t *q, int64_t n, const float *s, const float *z,           \
     int gshift, float qmin, float qmax, int r, int pack),                                     \
    (x, bf16, q, n, s, z, gshift, qmin, qmax, r, pack))

#define QC_ENG_DECLARE(ret, name, params, args) ret eng_##name params;
namespace qc_base {
QC_ENG_ENTRIES(QC_ENG_DECLARE)
}
#if defined(QC_HAVE_V3) || QC_SIMD_LEVEL == 3
namespace qc_v3 {
QC_ENG_ENTRIES(QC_ENG_DECLARE)
}
#endif
#if defined(QC_HAVE_V4) || QC_SIMD_LEVEL == 4
namespace qc_v4 {
QC_ENG_ENTRIES(QC_ENG_DECLARE)
}
#endif
#undef QC_ENG_DECLARE

/* qc_eng_run_<entry>(...): the entry of the build in use */
#define QC_ENG_RUN(ret, name, params, args)                                                    \
  inline ret qc_eng_run_##name params {                                                        \
    switch (qc::simd_level) {                                                                  \
      QC_IF_V4(case 4: return qc_v4::eng_##name args;)                                         \
      QC_IF_V3(case 3: return qc_v3::eng_##name args;)                                         \
    default: return qc_base::eng_##name args;                                                  \
    }                                                                                          \
  }
QC_ENG_ENTRIES(QC_ENG_RUN)
#undef QC_ENG_RUN

#endif /* QC_ENG_BUILDS_H */
