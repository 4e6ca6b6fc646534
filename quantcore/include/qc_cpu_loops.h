/*
 * qc_cpu_loops.h -- contiguous block loops over the formulas of
 * qc_elementwise.h, for the CPU extension only.
 *
 * The Cython modules split an array into blocks and hand each block to one
 * of these functions inside a `prange`; these loops hold no formula of their
 * own.  Two layouts exist for per-channel work on a C-ordered (outer, C,
 * inner) view:
 *   - inner > 1: each row of `inner` elements has one channel, and the
 *     per-tensor block function is called with that channel's parameters;
 *   - inner == 1 ("rowvec"): a row of C elements holds one value of every
 *     channel, and the loop reads the parameters as arrays.
 *
 * The mode word is split: the bits in QC_STATIC_BITS are made compile-time
 * constants by a switch over the combinations in use (so the loops vectorise
 * without per-element branches); the zero-point placement and
 * multiply-or-divide bits become selects inside the loop.
 */
#ifndef QC_CPU_LOOPS_H
#define QC_CPU_LOOPS_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#include "qc_elementwise.h"

#if defined(__GNUC__)
#define QC_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define QC_ALWAYS_INLINE static inline
#endif

#if defined(_OPENMP) || defined(QC_HAVE_OMP_SIMD)
#define QC_PRAGMA(x) _Pragma(#x)
#define QC_SIMD QC_PRAGMA(omp simd)
#define QC_SIMD_MINMAX                                                         \
  QC_PRAGMA(omp simd reduction(min : lo) reduction(max : hi)                   \
                reduction(| : nan, negz, posz))
#else
#define QC_SIMD
#define QC_SIMD_MINMAX
#endif

/* Flags of a min/max reduction, OR-combined across partial results. */
#define QC_MM_NAN 1     /* a NaN was seen                     */
#define QC_MM_NEGZERO 2 /* -0.0 was seen                      */
#define QC_MM_POSZERO 4 /* +0.0 was seen                      */

/* Switch over the compile-time part (rounding x non-finite) of an affine
 * mode, calling BODY(constant_mode) in each case. */
#define QC_AFFINE_DISPATCH(mode, BODY)                                         \
  switch ((mode) & QC_STATIC_BITS) {                                           \
  /* fake quant: rounding x non-finite policy */                               \
  case 0: BODY(0); break;                                                      \
  case 1: BODY(1); break;                                                      \
  case 2: BODY(2); break;                                                      \
  case 32: BODY(32); break;                                                    \
  case 33: BODY(33); break;                                                    \
  case 34: BODY(34); break;                                                    \
  case 64: BODY(64); break;                                                    \
  case 65: BODY(65); break;                                                    \
  case 66: BODY(66); break;                                                    \
  /* quantize (q out, NaN -> qmin) */                                          \
  case 160: BODY(160); break;                                                  \
  case 161: BODY(161); break;                                                  \
  case 162: BODY(162); break;                                                  \
  case 128: BODY(128); break;                                                  \
  case 192: BODY(192); break;                                                  \
  /* torch: per channel int zero point (wide), float64 per tensor (narrow) */ \
  case 80: BODY(80); break;                                                    \
  case 1056: BODY(1056); break;                                                \
  default: /* any other combination (the FMA'd zero point and the float32   \
              rounding among them): the same loop with these bits at run   \
              time, not vectorised */                                          \
    BODY((mode) & QC_STATIC_BITS); break;                                      \
  }

/* The mode bits the dispatch makes compile-time constants; the zero-point
 * placement (after / before / none) and multiply-or-divide stay selects
 * inside the loop body, which vectorise. */
#define QC_STATIC_BITS                                                         \
  (QC_ROUND_MASK | QC_NF_MASK | QC_DEQUANT_WIDE | QC_DEQUANT_NARROW | QC_OUTPUT_Q | QC_FMA_ZP | \
   QC_ROUND_F32)

#define QC_DEFINE_LOOPS(T, SFX, UINT, NEGZERO_BITS)                            \
                                                                               \
  /* Affine fake quant of n contiguous elements with one set of qparams.      \
   * mask may be NULL. */                                                      \
  QC_ALWAYS_INLINE void qc_affine_block_impl_##SFX(                            \
      const T *x, T *y, unsigned char *restrict mask, int64_t n,      \
      T s, T inv, T zp, T qmin, T qmax, int cmode, int mode) {                 \
    int64_t i;                                                                 \
    int full = (mode & ~QC_STATIC_BITS) | cmode;                               \
    if (mask) {                                                                \
      QC_SIMD for (i = 0; i < n; i++)                                          \
        y[i] = qc_fq_affine_##SFX(x[i], s, inv, zp, qmin, qmax, full, &mask[i]); \
    } else {                                                                   \
      QC_SIMD for (i = 0; i < n; i++) {                                        \
        unsigned char m;                                                       \
        y[i] = qc_fq_affine_##SFX(x[i], s, inv, zp, qmin, qmax, full, &m);    \
      }                                                                        \
    }                                                                          \
  }                                                                            \
  static void qc_affine_block_##SFX(const T *x, T *y, unsigned char *mask,     \
                                    int64_t n, T s, T inv, T zp, T qmin,       \
                                    T qmax, int mode) {                        \
    _QC_AFFINE_BLOCK_CASES_##SFX(mode)                                         \
  }                                                                            \
                                                                               \
  /* qc_fq_affine_exact over elements [start, start + n) of a C-ordered      \
   * (outer, C, inner) view, element i in channel (i / inner) % C (C = 1,     \
   * inner = size per tensor).  mask may be NULL.  A plain loop: the exact   \
   * variant serves the rare int32-size ranges. */                            \
  static void qc_affine_exact_range_##SFX(                                     \
      const T *x, T *y, unsigned char *mask, int64_t start, int64_t n,         \
      int64_t C, int64_t inner, const T *s, const T *inv, const double *zp,    \
      double qmin, double qmax, int mode) {                                    \
    int64_t i;                                                                 \
    for (i = start; i < start + n; i++) {                                      \
      int64_t c = (i / inner) % C;                                             \
      unsigned char m;                                                         \
      y[i] = qc_fq_affine_exact_##SFX(x[i], s[c], inv[c], zp[c], qmin, qmax,   \
                                      mode, &m);                               \
      if (mask) mask[i] = m;                                                   \
    }                                                                          \
  }                                                                            \
                                                                               \
  /* Affine fake quant of `rows` rows of C elements; channel c uses           \
   * s[c], inv[c], zp[c]. */                                                   \
  QC_ALWAYS_INLINE void qc_affine_rowvec_impl_##SFX(                           \
      const T *x, T *y, unsigned char *restrict mask, int64_t rows,   \
      int64_t C, const T *restrict s, const T *restrict inv,                   \
      const T *restrict zp, T qmin, T qmax, int cmode, int mode) {             \
    int64_t r, c;                                                              \
    int full = (mode & ~QC_STATIC_BITS) | cmode;                               \
    for (r = 0; r < rows; r++) {                                               \
      const T *xr = x + r * C;                                                 \
      T *yr = y + r * C;                                                       \
      if (mask) {                                                              \
        unsigned char *mr = mask + r * C;                                      \
        QC_SIMD for (c = 0; c < C; c++)                                        \
          yr[c] = qc_fq_affine_##SFX(xr[c], s[c], inv[c], zp[c], qmin, qmax,   \
                                     full, &mr[c]);                            \
      } else {                                                                 \
        QC_SIMD for (c = 0; c < C; c++) {                                      \
          unsigned char m;                                                     \
          yr[c] = qc_fq_affine_##SFX(xr[c], s[c], inv[c], zp[c], qmin, qmax,   \
                                     full, &m);                                \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  }                                                                            \
  static void qc_affine_rowvec_##SFX(const T *x, T *y, unsigned char *mask,    \
                                     int64_t rows, int64_t C, const T *s,      \
                                     const T *inv, const T *zp, T qmin,        \
                                     T qmax, int mode) {                       \
    _QC_AFFINE_ROWVEC_CASES_##SFX(mode)                                        \
  }                                                                            \
                                                                               \
  /* Nudged fake quant (TF / MindSpore) of n contiguous elements. */           \
  QC_ALWAYS_INLINE void qc_nudged_block_impl_##SFX(                            \
      const T *x, T *y, unsigned char *restrict mask, int64_t n,      \
      T nmin, T nmax, T s, T inv, T qz, int cmode) {                           \
    int64_t i;                                                                 \
    if (mask) {                                                                \
      QC_SIMD for (i = 0; i < n; i++)                                          \
        y[i] = qc_fq_nudged_##SFX(x[i], nmin, nmax, s, inv, qz, cmode, &mask[i]); \
    } else {                                                                   \
      QC_SIMD for (i = 0; i < n; i++) {                                        \
        unsigned char m;                                                       \
        y[i] = qc_fq_nudged_##SFX(x[i], nmin, nmax, s, inv, qz, cmode, &m);   \
      }                                                                        \
    }                                                                          \
  }                                                                            \
  static void qc_nudged_block_##SFX(const T *x, T *y, unsigned char *mask,     \
                                    int64_t n, T nmin, T nmax, T s, T inv,     \
                                    T qz, int mode) {                          \
    switch (mode & 3) {                                                        \
    case 0: qc_nudged_block_impl_##SFX(x, y, mask, n, nmin, nmax, s, inv, qz, 0); break; \
    case 1: qc_nudged_block_impl_##SFX(x, y, mask, n, nmin, nmax, s, inv, qz, 1); break; \
    case 2: qc_nudged_block_impl_##SFX(x, y, mask, n, nmin, nmax, s, inv, qz, 2); break; \
    default: qc_nudged_block_impl_##SFX(x, y, mask, n, nmin, nmax, s, inv, qz, 3); break; \
    }                                                                          \
  }                                                                            \
  static void qc_nudged_rowvec_##SFX(const T *x, T *y, unsigned char *mask,    \
                                     int64_t rows, int64_t C, const T *nmin,   \
                                     const T *nmax, const T *s, const T *inv,  \
                                     const T *qz, int mode) {                  \
    int64_t r, c;                                                              \
    for (r = 0; r < rows; r++) {                                               \
      unsigned char m;                                                         \
      for (c = 0; c < C; c++) {                                                \
        y[r * C + c] = qc_fq_nudged_##SFX(x[r * C + c], nmin[c], nmax[c], s[c], \
                                          inv[c], qz[c], mode, &m);            \
        if (mask) mask[r * C + c] = m;                                         \
      }                                                                        \
    }                                                                          \
  }                                                                            \
                                                                               \
  /* amax fake quant (NVIDIA) of n contiguous elements. */                     \
  static void qc_amax_block_##SFX(const T *x, T *y,                   \
                                  unsigned char *restrict mask, int64_t n,     \
                                  T mult, T div, T lo, T hi, T amax) {         \
    int64_t i;                                                                 \
    if (mask) {                                                                \
      QC_SIMD for (i = 0; i < n; i++)                                          \
        y[i] = qc_fq_amax_##SFX(x[i], mult, div, lo, hi, amax, &mask[i]);      \
    } else {                                                                   \
      QC_SIMD for (i = 0; i < n; i++) {                                        \
        unsigned char m;                                                       \
        y[i] = qc_fq_amax_##SFX(x[i], mult, div, lo, hi, amax, &m);            \
      }                                                                        \
    }                                                                          \
  }                                                                            \
  static void qc_amax_rowvec_##SFX(const T *x, T *y, unsigned char *mask,      \
                                   int64_t rows, int64_t C, const T *mult,     \
                                   const T *div, T lo, T hi, const T *amax) {  \
    int64_t r, c;                                                              \
    for (r = 0; r < rows; r++) {                                               \
      unsigned char m;                                                         \
      for (c = 0; c < C; c++) {                                                \
        y[r * C + c] = qc_fq_amax_##SFX(x[r * C + c], mult[c], div[c], lo, hi, \
                                        amax[c], &m);                          \
        if (mask) mask[r * C + c] = m;                                         \
      }                                                                        \
    }                                                                          \
  }                                                                            \
                                                                               \
  /* Straight-through backward of n contiguous elements: y = g * mask. */      \
  static void qc_ste_block_##SFX(const T *g,                                   \
                                 const unsigned char *restrict mask, T *y,     \
                                 int64_t n) {                                  \
    int64_t i;                                                                 \
    QC_SIMD for (i = 0; i < n; i++) y[i] = qc_ste_##SFX(g[i], mask[i]);        \
  }                                                                            \
                                                                               \
  /* One-pass min/max of n contiguous elements, NaN-skipping, with flags.     \
   * The sign of a zero result is fixed by qc_minmax_finish_##SFX so that     \
   * the result does not depend on the order of the reduction. */             \
  static void qc_minmax_block_##SFX(const T *restrict x, int64_t n, T *out_lo, \
                                    T *out_hi, unsigned char *out_flags) {     \
    T lo = (T)INFINITY, hi = (T)-INFINITY;                                     \
    int nan = 0, negz = 0, posz = 0;                                           \
    int64_t i;                                                                 \
    const UINT *bits = (const UINT *)(const void *)x;                          \
    QC_SIMD_MINMAX for (i = 0; i < n; i++) {                                   \
      T v = x[i];                                                              \
      UINT b = bits[i];                                                        \
      lo = (v < lo) ? v : lo;                                                  \
      hi = (v > hi) ? v : hi;                                                  \
      nan |= (v != v);                                                         \
      negz |= (b == (UINT)NEGZERO_BITS);                                       \
      posz |= (b == (UINT)0);                                                  \
    }                                                                          \
    *out_lo = lo;                                                              \
    *out_hi = hi;                                                              \
    *out_flags = (unsigned char)((nan ? QC_MM_NAN : 0) |                       \
                                 (negz ? QC_MM_NEGZERO : 0) |                  \
                                 (posz ? QC_MM_POSZERO : 0));                  \
  }                                                                            \
  /* Fold a partial (lo, hi, flags) into an accumulator. */                    \
  static inline void qc_minmax_fold_##SFX(T *lo, T *hi, unsigned char *flags,  \
                                          T plo, T phi, unsigned char pflags) { \
    *lo = (plo < *lo) ? plo : *lo;                                             \
    *hi = (phi > *hi) ? phi : *hi;                                             \
    *flags |= pflags;                                                          \
  }                                                                            \
  /* Rows of C elements: fold each element into lo[c], hi[c], flags[c]. */    \
  static void qc_minmax_rowvec_##SFX(const T *x, int64_t rows, int64_t C,      \
                                     T *lo, T *hi, unsigned char *flags) {     \
    int64_t r, c;                                                              \
    const UINT *bits = (const UINT *)(const void *)x;                          \
    for (r = 0; r < rows; r++) {                                               \
      const T *xr = x + r * C;                                                 \
      const UINT *br = bits + r * C;                                           \
      QC_SIMD for (c = 0; c < C; c++) {                                        \
        T v = xr[c];                                                           \
        UINT b = br[c];                                                        \
        lo[c] = (v < lo[c]) ? v : lo[c];                                       \
        hi[c] = (v > hi[c]) ? v : hi[c];                                       \
        flags[c] |= (unsigned char)(((v != v) ? QC_MM_NAN : 0) |               \
                                    ((b == (UINT)NEGZERO_BITS) ? QC_MM_NEGZERO : 0) | \
                                    ((b == (UINT)0) ? QC_MM_POSZERO : 0));     \
      }                                                                        \
    }                                                                          \
  }                                                                            \
  /* Final result: NaN if any NaN was seen; a zero min is -0.0 if -0.0 was    \
   * seen, a zero max is +0.0 if +0.0 was seen (so -0.0 < +0.0). */          \
  static inline void qc_minmax_finish_##SFX(T *lo, T *hi, unsigned char flags) { \
    if (flags & QC_MM_NAN) {                                                   \
      *lo = (T)NAN;                                                            \
      *hi = (T)NAN;                                                            \
      return;                                                                  \
    }                                                                          \
    if (*lo == 0) *lo = (flags & QC_MM_NEGZERO) ? (T)-0.0 : (T)0.0;            \
    if (*hi == 0) *hi = (flags & QC_MM_POSZERO) ? (T)0.0 : (T)-0.0;            \
  }

#define _QC_AFFINE_BLOCK_BODY_f32(CM)                                          \
  qc_affine_block_impl_f32(x, y, mask, n, s, inv, zp, qmin, qmax, CM, mode)
#define _QC_AFFINE_BLOCK_BODY_f64(CM)                                          \
  qc_affine_block_impl_f64(x, y, mask, n, s, inv, zp, qmin, qmax, CM, mode)
#define _QC_AFFINE_ROWVEC_BODY_f32(CM)                                         \
  qc_affine_rowvec_impl_f32(x, y, mask, rows, C, s, inv, zp, qmin, qmax, CM, mode)
#define _QC_AFFINE_ROWVEC_BODY_f64(CM)                                         \
  qc_affine_rowvec_impl_f64(x, y, mask, rows, C, s, inv, zp, qmin, qmax, CM, mode)
#define _QC_AFFINE_BLOCK_CASES_f32(mode) QC_AFFINE_DISPATCH(mode, _QC_AFFINE_BLOCK_BODY_f32)
#define _QC_AFFINE_BLOCK_CASES_f64(mode) QC_AFFINE_DISPATCH(mode, _QC_AFFINE_BLOCK_BODY_f64)
#define _QC_AFFINE_ROWVEC_CASES_f32(mode) QC_AFFINE_DISPATCH(mode, _QC_AFFINE_ROWVEC_BODY_f32)
#define _QC_AFFINE_ROWVEC_CASES_f64(mode) QC_AFFINE_DISPATCH(mode, _QC_AFFINE_ROWVEC_BODY_f64)

/* torch.histc counts of n contiguous floats over [lo, hi] (qc_histc_bin_f32)
 * added to counts[bins]; |v| is binned when `absolute`, zeros are skipped
 * when `skip_zeros`.  Bins are computed a chunk at a time (vectorised), then
 * counted into two interleaved sub-histograms (counts and counts + bins, so
 * consecutive increments of one bin do not wait on each other); the caller
 * adds the second to the first. */
#define QC_HISTC_CHUNK 512
static void qc_histc_block_f32(const float *restrict x, int64_t n, float lo, float hi,
                               int bins, int absolute, int skip_zeros,
                               int64_t *restrict counts) {
  int idx[QC_HISTC_CHUNK];
  float fbins = (float)bins;
  int64_t *restrict counts2 = counts + bins;
  int64_t base, j;
  for (base = 0; base < n; base += QC_HISTC_CHUNK) {
    int64_t m = n - base < QC_HISTC_CHUNK ? n - base : QC_HISTC_CHUNK;
    const float *xb = x + base;
    QC_SIMD for (j = 0; j < m; j++) {
      float v = absolute ? fabsf(xb[j]) : xb[j];
      int b = qc_histc_bin_f32(v, lo, hi, fbins, bins);
      idx[j] = (skip_zeros && v == 0.0f) ? -1 : b;
    }
    for (j = 0; j + 1 < m; j += 2) {
      int b0 = idx[j], b1 = idx[j + 1];
      if (b0 >= 0) counts[b0]++;
      if (b1 >= 0) counts2[b1]++;
    }
    if (j < m && idx[j] >= 0) counts[idx[j]]++;
  }
}

QC_DEFINE_LOOPS(float, f32, uint32_t, 0x80000000u)
QC_DEFINE_LOOPS(double, f64, uint64_t, 0x8000000000000000ull)

#endif /* QC_CPU_LOOPS_H */
