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
/* observer mode: a rule (mode & QC_OBS_RULE) and flags */
#define QC_OBS_NONE 0
#define QC_OBS_MINMAX 1     /* running min / max (NaN-propagating, -0.0 < +0.0) */
#define QC_OBS_MOVING_AVG 2 /* m = m + c * (batch - m), first batch m = batch */
#define QC_OBS_EMA 3        /* m = f32(f32(m * d) + f32(batch * c)), no first-batch rule */
#define QC_OBS_MOMENTUM 4   /* m = batch where m == 0, else f32(f32(m * d) + f32(batch * c)) */
#define QC_OBS_RULE 7
/* flag: NaN enters the state ("propagate"); otherwise a batch with a NaN or
 * +-inf in any channel leaves the state alone and is counted */
#define QC_OBS_PROPAGATE 8
#define QC_OBS_INCLUDE_ZERO 16   /* EMA: then min(m, 0) / max(m, 0), numpy's scalar rule */
#define QC_OBS_FROM_ZERO 32      /* EMA: every batch starts from m = 0 (no memory) */
#define QC_OBS_ABSMAX 64         /* MOMENTUM: the statistic is max(|lo|, |hi|), in both */
#define QC_OBS_FIRST_IF_EMPTY 128 /* the first batch is where the state is (+inf, -inf)
                                     (torch's rule), not where no batch was counted */
#define QC_OBS_INF_RESETS 256    /* MOVING_AVG: a side at +-inf takes the batch
                                    (torch's fused op) */

/* qparams formula (qscheme) */
#define QC_QS_NONE 0
#define QC_QS_AFFINE 1    /* qparams.affine_qparams */
#define QC_QS_SYMMETRIC 2 /* qparams.symmetric_qparams */

/* f32(f32(m * d) + f32(b * c)): the EMA / momentum average (no FMA). */
QC_HD float qc_ema_f32(float m, float b, float d, float c) {
  const float md = m * d, bc = b * c;
  return md + bc;
}

/* np.minimum(v, 0) / np.maximum(v, 0) as numpy computes them: NaN
 * propagates, and between equal values (-0.0 vs +0.0) the second argument
 * wins, so -0.0 becomes +0.0. */
QC_HD float qc_np_min0_f32(float v) { return (v < 0.0f || v != v) ? v : 0.0f; }
QC_HD float qc_np_max0_f32(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

/* One side of the momentum average: the batch where the state is 0. */
QC_HD float qc_momentum_f32(float m, float b, float d, float c) {
  return m == 0.0f ? b : qc_ema_f32(m, b, d, c);
}

/* The observer's new state (*smin, *smax) from a finished batch statistic
 * (blo, bhi) by `mode` (QC_OBS_*): c and d as the rules above (MOVING_AVG
 * uses c).  `first` (the first batch: the state is the batch itself) is
 * used by MINMAX and MOVING_AVG only; a caller with QC_OBS_FIRST_IF_EMPTY
 * passes it from the state's values (qc_obs_first). */
QC_HD void qc_observe_update(int mode, bool first, float c, float d, float blo, float bhi,
                             float *smin, float *smax) {
  const int rule = mode & QC_OBS_RULE;
  if (rule == QC_OBS_EMA) {
    const float m0 = (mode & QC_OBS_FROM_ZERO) ? 0.0f : *smin;
    const float m1 = (mode & QC_OBS_FROM_ZERO) ? 0.0f : *smax;
    float mn = qc_ema_f32(m0, blo, d, c), mx = qc_ema_f32(m1, bhi, d, c);
    if (mode & QC_OBS_INCLUDE_ZERO) {
      mn = qc_np_min0_f32(mn);
      mx = qc_np_max0_f32(mx);
    }
    *smin = mn;
    *smax = mx;
  } else if (rule == QC_OBS_MOMENTUM) {
    if (mode & QC_OBS_ABSMAX) {
      const float al = fabsf(blo), ah = fabsf(bhi);
      const float a = (ah >= al || ah != ah) ? ah : al; /* np.maximum(|hi|, |lo|) */
      const float m = qc_momentum_f32(*smax, a, d, c);
      *smin = m;
      *smax = m;
    } else {
      *smin = qc_momentum_f32(*smin, blo, d, c);
      *smax = qc_momentum_f32(*smax, bhi, d, c);
    }
  } else if (first) {
    *smin = blo;
    *smax = bhi;
  } else if (rule == QC_OBS_MINMAX) {
    *smin = qc_running_min_f32(*smin, blo);
    *smax = qc_running_max_f32(*smax, bhi);
  } else if (mode & QC_OBS_INF_RESETS) {
    *smin = isinf(*smin) ? blo : qc_ma_update_f32(*smin, blo, c);
    *smax = isinf(*smax) ? bhi : qc_ma_update_f32(*smax, bhi, c);
  } else {
    *smin = qc_ma_update_f32(*smin, blo, c);
    *smax = qc_ma_update_f32(*smax, bhi, c);
  }
}

/* Whether a batch is the first for a state (smin, smax) that has seen
 * `batches` batches: by the count, or with QC_OBS_FIRST_IF_EMPTY by the
 * values (+inf, -inf). */
QC_HD bool qc_obs_first(int mode, long long batches, float smin, float smax) {
  if (mode & QC_OBS_FIRST_IF_EMPTY) return smin == qc_inf(0.0f) && smax == -qc_inf(0.0f);
  return batches == 0;
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
