/*
 * qc_dispatch.h -- the CPU extension's entry points into the loops of
 * qc_cpu_loops.h, chosen at run time between two builds of the same source:
 *
 *   baseline  the loops compiled with the extension's flags (x86-64-v2:
 *             SSE4.1 roundps), always present;
 *   v3        the same loops compiled for AVX2 + FMA (quantcore/_cpu/
 *             qc_loops_v3.c, only on x86-64 with GCC / Clang, QC_HAVE_V3),
 *             used when the CPU has them.
 *
 * Both are the same formulas with the same flags (-ffp-contract=off: no
 * contraction; an explicit fma() is the correctly rounded fma either way),
 * so they give the same bits; tests/test_simd.py checks it on every recipe.
 * qc_simd_select() is called once when the extension is imported (the
 * QUANTCORE_SIMD=baseline environment variable keeps the baseline).
 */
#ifndef QC_DISPATCH_H
#define QC_DISPATCH_H

#include "qc_cpu_loops.h"

/* X(name, parameters, arguments) for every dispatched loop entry point. */
#define QC_LOOP_ENTRIES(X)                                                     \
  X(qc_affine_block_f32,                                                       \
    (const float *x, float *y, unsigned char *mask, int64_t n, float s,        \
     float inv, float zp, float qmin, float qmax, int mode),                   \
    (x, y, mask, n, s, inv, zp, qmin, qmax, mode))                             \
  X(qc_affine_block_f64,                                                       \
    (const double *x, double *y, unsigned char *mask, int64_t n, double s,     \
     double inv, double zp, double qmin, double qmax, int mode),               \
    (x, y, mask, n, s, inv, zp, qmin, qmax, mode))                             \
  X(qc_affine_rowvec_f32,                                                      \
    (const float *x, float *y, unsigned char *mask, int64_t rows, int64_t C,   \
     const float *s, const float *inv, const float *zp, float qmin,            \
     float qmax, int mode),                                                    \
    (x, y, mask, rows, C, s, inv, zp, qmin, qmax, mode))                       \
  X(qc_affine_rowvec_f64,                                                      \
    (const double *x, double *y, unsigned char *mask, int64_t rows,            \
     int64_t C, const double *s, const double *inv, const double *zp,          \
     double qmin, double qmax, int mode),                                      \
    (x, y, mask, rows, C, s, inv, zp, qmin, qmax, mode))                       \
  X(qc_affine_exact_range_f32,                                                 \
    (const float *x, float *y, unsigned char *mask, int64_t start, int64_t n,  \
     int64_t C, int64_t inner, const float *s, const float *inv,               \
     const double *zp, double qmin, double qmax, int mode),                    \
    (x, y, mask, start, n, C, inner, s, inv, zp, qmin, qmax, mode))            \
  X(qc_affine_exact_range_f64,                                                 \
    (const double *x, double *y, unsigned char *mask, int64_t start,           \
     int64_t n, int64_t C, int64_t inner, const double *s, const double *inv,  \
     const double *zp, double qmin, double qmax, int mode),                    \
    (x, y, mask, start, n, C, inner, s, inv, zp, qmin, qmax, mode))            \
  X(qc_nudged_block_f32,                                                       \
    (const float *x, float *y, unsigned char *mask, int64_t n, float nmin,     \
     float nmax, float s, float inv, float qz, int mode),                      \
    (x, y, mask, n, nmin, nmax, s, inv, qz, mode))                             \
  X(qc_nudged_block_f64,                                                       \
    (const double *x, double *y, unsigned char *mask, int64_t n, double nmin,  \
     double nmax, double s, double inv, double qz, int mode),                  \
    (x, y, mask, n, nmin, nmax, s, inv, qz, mode))                             \
  X(qc_nudged_rowvec_f32,                                                      \
    (const float *x, float *y, unsigned char *mask, int64_t rows, int64_t C,   \
     const float *nmin, const float *nmax, const float *s, const float *inv,   \
     const float *qz, int mode),                                               \
    (x, y, mask, rows, C, nmin, nmax, s, inv, qz, mode))                       \
  X(qc_nudged_rowvec_f64,                                                      \
    (const double *x, double *y, unsigned char *mask, int64_t rows,            \
     int64_t C, const double *nmin, const double *nmax, const double *s,       \
     const double *inv, const double *qz, int mode),                           \
    (x, y, mask, rows, C, nmin, nmax, s, inv, qz, mode))                       \
  X(qc_amax_block_f32,                                                         \
    (const float *x, float *y, unsigned char *mask, int64_t n, float mult,     \
     float div, float lo, float hi, float amax),                               \
    (x, y, mask, n, mult, div, lo, hi, amax))                                  \
  X(qc_amax_block_f64,                                                         \
    (const double *x, double *y, unsigned char *mask, int64_t n, double mult,  \
     double div, double lo, double hi, double amax),                           \
    (x, y, mask, n, mult, div, lo, hi, amax))                                  \
  X(qc_amax_rowvec_f32,                                                        \
    (const float *x, float *y, unsigned char *mask, int64_t rows, int64_t C,   \
     const float *mult, const float *div, float lo, float hi,                  \
     const float *amax),                                                       \
    (x, y, mask, rows, C, mult, div, lo, hi, amax))                            \
  X(qc_amax_rowvec_f64,                                                        \
    (const double *x, double *y, unsigned char *mask, int64_t rows,            \
     int64_t C, const double *mult, const double *div, double lo, double hi,   \
     const double *amax),                                                      \
    (x, y, mask, rows, C, mult, div, lo, hi, amax))                            \
  X(qc_ste_block_f32,                                                          \
    (const float *g, const unsigned char *mask, float *y, int64_t n),          \
    (g, mask, y, n))                                                           \
  X(qc_ste_block_f64,                                                          \
    (const double *g, const unsigned char *mask, double *y, int64_t n),        \
    (g, mask, y, n))                                                           \
  X(qc_minmax_block_f32,                                                       \
    (const float *x, int64_t n, float *lo, float *hi, unsigned char *flags),   \
    (x, n, lo, hi, flags))                                                     \
  X(qc_minmax_block_f64,                                                       \
    (const double *x, int64_t n, double *lo, double *hi,                       \
     unsigned char *flags),                                                    \
    (x, n, lo, hi, flags))                                                     \
  X(qc_minmax_rowvec_f32,                                                      \
    (const float *x, int64_t rows, int64_t C, float *lo, float *hi,            \
     unsigned char *flags),                                                    \
    (x, rows, C, lo, hi, flags))                                               \
  X(qc_minmax_rowvec_f64,                                                      \
    (const double *x, int64_t rows, int64_t C, double *lo, double *hi,         \
     unsigned char *flags),                                                    \
    (x, rows, C, lo, hi, flags))                                               \
  X(qc_histc_block_f32,                                                        \
    (const float *x, int64_t n, float lo, float hi, int bins, int absolute,    \
     int skip_zeros, int64_t *counts),                                         \
    (x, n, lo, hi, bins, absolute, skip_zeros, counts))

#ifndef QC_LOOPS_V3_SOURCE

#ifdef QC_HAVE_V3
#define QC_DECLARE_V3(name, params, args) void name##_v3 params;
QC_LOOP_ENTRIES(QC_DECLARE_V3)
#undef QC_DECLARE_V3
#endif

/* 1 while the AVX2 + FMA build runs (set by qc_simd_select). */
static int qc_simd_v3 = 0;

/* Use the v3 build when allowed and the CPU (and OS) support AVX2 and FMA;
 * returns whether it is used. */
static int qc_simd_select(int allow) {
#ifdef QC_HAVE_V3
  __builtin_cpu_init();
  qc_simd_v3 = allow && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  (void)allow;
  qc_simd_v3 = 0;
#endif
  return qc_simd_v3;
}

static int qc_simd_v3_built(void) {
#ifdef QC_HAVE_V3
  return 1;
#else
  return 0;
#endif
}

/* qcd_<name>: the dispatcher the extension calls. */
#ifdef QC_HAVE_V3
#define QC_DISPATCHER(name, params, args)                                      \
  static inline void qcd_##name params {                                       \
    if (qc_simd_v3) name##_v3 args; else name args;                            \
  }
#else
#define QC_DISPATCHER(name, params, args)                                      \
  static inline void qcd_##name params { name args; }
#endif
QC_LOOP_ENTRIES(QC_DISPATCHER)
#undef QC_DISPATCHER

#endif /* QC_LOOPS_V3_SOURCE */
#endif /* QC_DISPATCH_H */
