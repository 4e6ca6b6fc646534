/*
 * qc_minmax.h -- the min / max reduction and the observer step built on it,
 * shared by the CPU loops (qc_cpu_loops.h, the extension's fused
 * FakeQuantize step) and the GPU reductions (quantcore_gpu/cuda/minmax.cu).
 *
 * A reduction keeps (lo, hi, flags): lo / hi skip NaN (comparisons are
 * false for NaN) and the flags record NaN, -0.0 and +0.0.  The finish rule
 * makes the result NaN when a NaN was seen and fixes the sign of a zero
 * result from the flags (-0.0 < +0.0), so the finished result does not
 * depend on the order of the reduction: bit-identical on every back end,
 * whatever the thread count or launch shape.
 */
#ifndef QC_MINMAX_H
#define QC_MINMAX_H

#include "qc_elementwise.h"

/* Flags of a min/max reduction, OR-combined across partial results. */
#define QC_MM_NAN 1     /* a NaN was seen  */
#define QC_MM_NEGZERO 2 /* -0.0 was seen   */
#define QC_MM_POSZERO 4 /* +0.0 was seen   */

/* The flags of one value. */
template <typename T> QC_HD unsigned qc_mm_flags(T v) {
  const auto b = qc_bits(v);
  return (v != v ? (unsigned)QC_MM_NAN : 0u) |
         (b == QcNegZero<T>::bits ? (unsigned)QC_MM_NEGZERO : 0u) |
         (b == 0 ? (unsigned)QC_MM_POSZERO : 0u);
}

/* NaN-skipping running minimum / maximum of a reduction. */
template <typename T> QC_HD T qc_mm_min(T lo, T v) { return (v < lo) ? v : lo; }
template <typename T> QC_HD T qc_mm_max(T hi, T v) { return (v > hi) ? v : hi; }

/* A partial result (lo, hi, flags). */
template <typename T> struct QcMinMax {
  T lo, hi;
  unsigned fl;
  QC_HDM void init() {
    lo = qc_inf(T());
    hi = -qc_inf(T());
    fl = 0u;
  }
  QC_HDM void add(T v) {
    lo = qc_mm_min(lo, v);
    hi = qc_mm_max(hi, v);
    fl |= qc_mm_flags(v);
  }
  QC_HDM void fold(T plo, T phi, unsigned pfl) {
    lo = qc_mm_min(lo, plo);
    hi = qc_mm_max(hi, phi);
    fl |= pfl;
  }
};

/* Fold a partial result (plo, phi, pfl) into (*lo, *hi, *fl). */
template <typename T>
QC_HD void qc_mm_fold(T *lo, T *hi, unsigned char *fl, T plo, T phi, unsigned char pfl) {
  *lo = qc_mm_min(*lo, plo);
  *hi = qc_mm_max(*hi, phi);
  *fl = (unsigned char)(*fl | pfl);
}

/* Final result: NaN if any NaN was seen; a zero min is -0.0 if -0.0 was
 * seen, a zero max is +0.0 if +0.0 was seen (so -0.0 < +0.0). */
template <typename T> QC_HD void qc_minmax_finish(T *lo, T *hi, unsigned flags) {
  if (flags & QC_MM_NAN) {
    *lo = qc_nan(T());
    *hi = qc_nan(T());
    return;
  }
  if (*lo == (T)0) *lo = (flags & QC_MM_NEGZERO) ? (T)-0.0 : (T)0.0;
  if (*hi == (T)0) *hi = (flags & QC_MM_POSZERO) ? (T)0.0 : (T)-0.0;
}

/* True when a finished batch statistic is non-finite (a NaN, or a min / max
 * at infinity): an observer skips, refuses or propagates such a batch. */
template <typename T> QC_HD bool qc_mm_nonfinite(T lo, T hi, unsigned flags) {
  return (flags & QC_MM_NAN) || isinf(lo) || isinf(hi);
}

/* ------------------------------------------------------------------------
 * The observer step of FakeQuantize (quantcore/observers.py and
 * quantcore/qparams.py in float32), per channel.
 * ---------------------------------------------------------------------- */
/* observer rule (obs_mode & 3) */
#define QC_OBS_NONE 0
#define QC_OBS_MINMAX 1     /* running min / max (NaN-propagating, -0.0 < +0.0) */
#define QC_OBS_MOVING_AVG 2 /* m = m + c * (batch - m), first batch m = batch */
/* obs_mode bit: NaN enters the state ("propagate"); otherwise a batch with a
 * NaN or +-inf in any channel leaves the state alone and is counted */
#define QC_OBS_PROPAGATE 4

/* qparams formula (qscheme) */
#define QC_QS_NONE 0
#define QC_QS_AFFINE 1    /* qparams.affine_qparams */
#define QC_QS_SYMMETRIC 2 /* qparams.symmetric_qparams */

/* The observer's new state (*smin, *smax) from a finished batch statistic
 * (blo, bhi): the batch itself when `first`, else by `rule`. */
QC_HD void qc_observe_update(int rule, bool first, float avg_c, float blo, float bhi,
                             float *smin, float *smax) {
  if (first) {
    *smin = blo;
    *smax = bhi;
  } else if (rule == QC_OBS_MINMAX) {
    *smin = qc_running_min_f32(*smin, blo);
    *smax = qc_running_max_f32(*smax, bhi);
  } else {
    *smin = qc_ma_update_f32(*smin, blo, avg_c);
    *smax = qc_ma_update_f32(*smax, bhi, avg_c);
  }
}

/* (scale, zero point) of one channel's (mn, mx) by `qscheme`; the
 * symmetric zero point is `sym_zp`. */
QC_HD void qc_qparams(float mn, float mx, int qscheme, float eps, qc_i64 qmin, qc_i64 qmax,
                      qc_i64 sym_zp, float *scale_out, qc_i64 *zp_out) {
  if (qscheme == QC_QS_SYMMETRIC) {
    *scale_out = qc_symmetric_scale_f32(mn, mx, qmin, qmax, eps);
    *zp_out = sym_zp;
    return;
  }
  qc_affine_qparams_f32(mn, mx, qmin, qmax, eps, scale_out, zp_out);
}

#endif /* QC_MINMAX_H */
