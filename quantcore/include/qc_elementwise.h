/*
 * qc_elementwise.h -- the one definition of every per-element formula.
 *
 * Included by the CPU extension (C++) and by the CUDA sources of
 * quantcore_gpu, so both back ends compute the same bits by construction.
 * Each formula is a function template over the compute type T (float or
 * double): one body, instantiated wherever it is used.
 *
 * Numerical contract (docs/ARCHITECTURE.md): every operation rounds once,
 * in the order written; no contraction into FMAs (see qc_core.h).
 */
#ifndef QC_ELEMENTWISE_H
#define QC_ELEMENTWISE_H

#include "qc_core.h"

/* ------------------------------------------------------------------------
 * Mode bits of the affine recipe (qc_fq_affine_*).  The Python layer builds
 * the mode word once per call; CPU loops specialise on it at compile time.
 * ---------------------------------------------------------------------- */
/* rounding of the scaled value (2 bits) */
#define QC_ROUND_HALF_EVEN 0 /* rint: ties to even (default FE_TONEAREST)  */
#define QC_ROUND_HALF_UP 1   /* floor(v + 0.5), the "+0.5 then floor" form  */
#define QC_ROUND_HALF_AWAY 2 /* round(): ties away from zero              */
#define QC_ROUND_MASK 3
/* The rounding modes by name, X(name, id): the one list.  The extension
 * exports it (ROUNDING_MODES); ops.ROUNDING, the CLI's --rounding and the
 * tests' parameter lists are derived from it.  A new mode: its id above,
 * its line here, its case in qc_round_by below. */
#define QC_ROUNDING_MODES(X)                                                   \
  X(half_even, QC_ROUND_HALF_EVEN)                                             \
  X(half_up, QC_ROUND_HALF_UP)                                                 \
  X(half_away, QC_ROUND_HALF_AWAY)
/* zero point added before rounding (float zero point) instead of after */
#define QC_ZP_BEFORE 4
/* v = x / scale instead of v = x * inv_scale */
#define QC_DIVIDE 8
/* dequantise in double: y = T((double(q) - double(zp)) * double(scale)) */
#define QC_DEQUANT_WIDE 16
/* non-finite policy (2 bits at 32): what q becomes when q_f is NaN/inf */
#define QC_NF_PROPAGATE 0   /* NaN stays NaN; +-inf clamp to qmax / qmin   */
#define QC_NF_NAN_TO_QMIN 32 /* NaN -> qmin; +-inf clamp (torch per tensor) */
#define QC_NF_INT64 64       /* q = int64(q_f) as on x86: NaN, +-inf and
                                 |q_f| >= 2**63 -> qmin (torch per channel) */
#define QC_NF_MASK 96
/* return q itself (quantize) instead of the dequantised value */
#define QC_OUTPUT_Q 128
/* no zero point at all: q_f = round(v), y = q * scale (keeps -0.0; OneFlow
   symmetric / cambricon) */
#define QC_NO_ZERO_POINT 256
/* with QC_ZP_BEFORE: q_f = round(fma(x, inv, zp)), one rounding (torch's
   per-channel float-zero-point kernel is compiled with FMA contraction) */
#define QC_FMA_ZP 512
/* dequantise in float32 whatever T is: y = T(f32(f32(q - zp) * f32(scale)))
   (torch per tensor on float64 input) */
#define QC_DEQUANT_NARROW 1024
/* with QC_ZP_BEFORE: round x * inv + zp to float32 before rounding it to an
   integer (torch per channel, float64 input, float zero point: lrintf) */
#define QC_ROUND_F32 2048
#define QC_AFFINE_MODES 4096 /* number of distinct mode words */

/* Mode bits of the nudged recipe (TensorFlow / MindSpore). */
#define QC_NUDGED_DIVIDE 1 /* t = (xc - nmin) / scale instead of * inv     */
#define QC_NUDGED_TF 2     /* y = floor(t - qz + 0.5) * scale (current TF);
                              else y = floor(t + 0.5) * scale + nmin (MS)  */
#define QC_NUDGED_MODES 4

/* Round v by rule `rounding` (QC_ROUND_*). */
template <typename T> QC_HD T qc_round_by(T v, int rounding) {
  if (rounding == QC_ROUND_HALF_UP) return qc_floor(v + (T)0.5);
  if (rounding == QC_ROUND_HALF_AWAY) return qc_round(v);
  return qc_rint(v);
}

/* Clamp with comparisons; NaN passes through unchanged. */
template <typename T> QC_HD T qc_clamp(T v, T lo, T hi) {
  T t = (v < lo) ? lo : v;
  return (t > hi) ? hi : t;
}

/* The rounded, zero-point-shifted value q_f of the affine recipe:
 *   v   = x * inv            (x / scale with QC_DIVIDE)
 *   q_f = round(v) + zp      (round(v + zp) with QC_ZP_BEFORE, FMA'd with
 *                            QC_FMA_ZP, the sum rounded to float32 first
 *                            with QC_ROUND_F32; round(v) with
 *                            QC_NO_ZERO_POINT)
 * One rounding whatever the placement: the zero point is added to v
 * (before) or to round(v) (after) through selects of cheap adds, so a
 * vectorised loop never computes the other placements' roundings. */
template <typename T> QC_HD T qc_affine_qf(T x, T scale, T inv, T zp, int mode) {
  const int before = (mode & QC_ZP_BEFORE) && !(mode & QC_NO_ZERO_POINT);
  const int after = !(mode & (QC_ZP_BEFORE | QC_NO_ZERO_POINT));
  T v = (mode & QC_DIVIDE) ? x / scale : x * inv;
  T w = before ? ((mode & QC_FMA_ZP) ? qc_fma(x, inv, zp) : v + zp) : v;
  w = (before && (mode & QC_ROUND_F32)) ? (T)(float)w : w;
  const T r = qc_round_by(w, mode & QC_ROUND_MASK);
  return after ? r + zp : r;
}

/* Affine fake quantization of one element.
 *   q_f  = qc_affine_qf(x, ...)
 *   q    = clamp(q_f, qmin, qmax), non-finite q_f per QC_NF_* (QC_NF_INT64:
 *          an integer, so never -0.0)
 *   y    = (q - zp) * scale  (in double with QC_DEQUANT_WIDE; q * scale
 *                             with QC_NO_ZERO_POINT; y = q with QC_OUTPUT_Q)
 *   mask = qmin <= q_f <= qmax   (false for NaN / inf) */
template <typename T>
QC_HD T qc_fq_affine(T x, T scale, T inv, T zp, T qmin, T qmax, int mode, unsigned char *mask) {
  const T qf = qc_affine_qf(x, scale, inv, zp, mode);
  T q;
  *mask = (unsigned char)((qf >= qmin) & (qf <= qmax));
  if ((mode & QC_NF_MASK) == QC_NF_NAN_TO_QMIN) {
    q = (qf > qmin) ? qf : qmin;
    q = (q < qmax) ? q : qmax;
  } else if ((mode & QC_NF_MASK) == QC_NF_INT64) {
    /* what cvttsd2si gives outside int64, before the clamp; + 0 makes -0.0
     * the integer 0 */
    q = (qf > (T)-9223372036854775808.0 && qf < (T)9223372036854775808.0) ? qf : qmin;
    q = (q > qmin) ? q : qmin;
    q = ((q < qmax) ? q : qmax) + (T)0;
  } else {
    q = qc_clamp(qf, qmin, qmax);
  }
  if (mode & QC_OUTPUT_Q) return q;
  if (mode & QC_NO_ZERO_POINT) {
    if (mode & QC_DEQUANT_WIDE) return (T)((double)q * (double)scale);
    return q * scale;
  }
  if (mode & QC_DEQUANT_WIDE) return (T)(((double)q - (double)zp) * (double)scale);
  if (mode & QC_DEQUANT_NARROW) return (T)((float)((double)q - (double)zp) * (float)scale);
  return (q - zp) * scale;
}

/* PyTorch's affine fake quant with its integer steps done exactly: the zero
 * point and the range come as exact integers in double (int32-size ranges,
 * zero points beyond 2**24, which float32 cannot hold).  q_f as in
 * qc_affine_qf with the zero point rounded to T, then
 *   QC_NF_INT64 (per channel): q_i = int64(q_f) (x86: NaN, inf, out of
 *     range -> INT64_MIN);  mask = qmin <= q_i <= qmax;
 *     y = T((clamp(q_i) - zp) * double(scale))
 *   otherwise (per tensor): mask = T(qmin) <= q_f <= T(qmax) (the bounds
 *     rounded to T, as torch);  q = fmin(fmax(double(q_f), qmin), qmax)
 *     (NaN -> qmin);  y = T(f32(f32(q - zp) * f32(scale)))
 * For zero points and bounds exact in T this gives the bits of
 * qc_fq_affine with torch's modes; it is the slower, exact variant. */
template <typename T>
QC_HD T qc_fq_affine_exact(T x, T scale, T inv, double zp, double qmin, double qmax, int mode,
                           unsigned char *mask) {
  const T qf = qc_affine_qf(x, scale, inv, (T)zp, mode);
  double q;
  if ((mode & QC_NF_MASK) == QC_NF_INT64) {
    q = (qf > (T)-9223372036854775808.0 && qf < (T)9223372036854775808.0)
            ? (double)qf : -9223372036854775808.0;
    *mask = (unsigned char)((q >= qmin) & (q <= qmax));
    q = (q > qmin) ? q : qmin;
    q = ((q < qmax) ? q : qmax) + 0.0;
    return (T)((q - zp) * (double)scale);
  }
  *mask = (unsigned char)((qf >= (T)qmin) & (qf <= (T)qmax));
  q = ((double)qf > qmin) ? (double)qf : qmin;
  q = (q < qmax) ? q : qmax;
  return (T)((float)(q - zp) * (float)scale);
}

/* Nudged fake quantization (TensorFlow, MindSpore) of one element.
 *   xc = clamp x to [nmin, nmax] (NaN passes)
 *   t  = (xc - nmin) * inv   ((xc - nmin) / scale with QC_NUDGED_DIVIDE)
 *   TF: y = floor((t - qz) + 0.5) * scale
 *   MS: y = floor(t + 0.5) * scale + nmin
 *   mask = nmin <= x <= nmax */
template <typename T>
QC_HD T qc_fq_nudged(T x, T nmin, T nmax, T scale, T inv, T qz, int mode, unsigned char *mask) {
  T xc = (nmax < x) ? nmax : x;
  xc = (xc < nmin) ? nmin : xc;
  *mask = (unsigned char)((x >= nmin) & (x <= nmax));
  const T cs = xc - nmin;
  const T t = (mode & QC_NUDGED_DIVIDE) ? cs / scale : cs * inv;
  if (mode & QC_NUDGED_TF) return qc_floor((t - qz) + (T)0.5) * scale;
  return qc_floor(t + (T)0.5) * scale + nmin;
}

/* amax fake quantization (NVIDIA) of one element.
 *   q = clamp(rint(x * mult), lo, hi)  (NaN passes),  y = q / div
 *   mult = max_bound / amax and div = mult, or mult = 0 and div = 1 when
 *   amax <= 2**-24 (the caller decides);  mask = |x| <= amax */
template <typename T>
QC_HD T qc_fq_amax(T x, T mult, T div, T lo, T hi, T amax, unsigned char *mask) {
  const T q = qc_clamp(qc_rint(x * mult), lo, hi);
  *mask = (unsigned char)((x >= -amax) & (x <= amax));
  return q / div;
}

/* Straight-through estimator: grad * mask (NaN * 0 stays NaN). */
template <typename T> QC_HD T qc_ste(T grad, unsigned char mask) { return grad * (T)mask; }


/* ------------------------------------------------------------------------
 * Scalar statistics -> qparams formulas (float32), shared by the CPU kernels,
 * quantcore.qparams and the GPU's last-block computation.
 * ---------------------------------------------------------------------- */

/* Moving average in PyTorch's form: m + c * (x - m), one rounding each. */
QC_HD float qc_ma_update_f32(float m, float x, float c) { return m + c * (x - m); }

/* Running minimum / maximum of an observer statistic m with a batch's v:
 * NaN-propagating like np.minimum / np.maximum (a NaN argument is the
 * result, m's first), with -0.0 < +0.0 as inside quantcore.minmax, so that
 * a running statistic does not depend on how the data was split. */
QC_HD float qc_running_min_f32(float m, float v) {
  if (m != m) return m;
  if (v != v || v < m || (v == m && signbit(v))) return v;
  return m;
}
QC_HD float qc_running_max_f32(float m, float v) {
  if (m != m) return m;
  if (v != v || v > m || (v == m && !signbit(v))) return v;
  return m;
}

/* NaN-propagating min(v, 0) / max(v, 0), as torch.min / torch.max. */
QC_HD float qc_min0_f32(float v) { return (v < 0.0f || v != v) ? v : 0.0f; }
QC_HD float qc_max0_f32(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }
/* NaN-propagating max(v, eps). */
QC_HD float qc_at_least_f32(float v, float eps) { return (v > eps || v != v) ? v : eps; }

/* Affine (scale, zero point), PyTorch observer form:
 *   scale = max((max(mx,0) - min(mn,0)) / f32(qmax - qmin), eps)
 *   zp    = clamp(qmin - int32(rint(min(mn,0) / scale)), qmin, qmax)
 * where int32() is x86's conversion (NaN, inf, out of range -> INT32_MIN)
 * and the subtraction wraps in int32, written out portably. */
QC_HD void qc_affine_qparams_f32(float mn, float mx, qc_i64 qmin, qc_i64 qmax, float eps,
                                 float *scale, qc_i64 *zp) {
  float min_neg = qc_min0_f32(mn), max_pos = qc_max0_f32(mx);
  float s = qc_at_least_f32((max_pos - min_neg) / (float)(qmax - qmin), eps);
  float r = rintf(min_neg / s);
  qc_i64 conv = (r >= -2147483648.0f && r < 2147483648.0f) ? (qc_i64)r
                                                             : (qc_i64)(-2147483647 - 1);
  qc_i64 z = qmin - conv;
  z = (qc_i64)(int)(unsigned int)(unsigned long long)z; /* int32 wrap */
  z = z < qmin ? qmin : (z > qmax ? qmax : z);
  *scale = s;
  *zp = z;
}

/* Symmetric scale, PyTorch observer form (also Horizon's):
 *   scale = max(max(-min(mn,0), max(mx,0)) / f32((qmax - qmin) / 2), eps) */
QC_HD float qc_symmetric_scale_f32(float mn, float mx, qc_i64 qmin, qc_i64 qmax, float eps) {
  float neg = -qc_min0_f32(mn), pos = qc_max0_f32(mx);
  float amax = (neg > pos || neg != neg) ? neg : pos;
  return qc_at_least_f32(amax / (float)((double)(qmax - qmin) / 2.0), eps);
}

/* torch.histc's bin of v among `bins` equal-width bins over [lo, hi]
 * (float32, torch's CPU linear-interpolation rule):
 *   t = f32(f32(f32(v - lo) * f32(bins)) / f32(hi - lo)),  pos = trunc(t),
 * the top edge (pos == bins) counted in the last bin; -1 (not counted) when
 * v is NaN or outside [lo, hi], and for every v when hi - lo overflows
 * (torch's edges are then NaN).  A non-finite t (the product overflows, or
 * lo == hi) is bin 0: torch's int64 conversion gives INT64_MIN there, and
 * that index lands on bin 0.  Out-of-range v is replaced by lo before the
 * arithmetic and no non-finite t is ever converted to int (branch-free: the
 * CPU loop vectorises it). */
QC_HD int qc_histc_bin_f32(float v, float lo, float hi, float fbins, int bins) {
  float width = hi - lo;
  int inside = (v >= lo) & (v <= hi) & (width - width == 0.0f);
  float vc = inside ? v : lo;
  float t = ((vc - lo) * fbins) / width;
  int pos = (t - t == 0.0f) ? (int)t : 0;
  pos = pos < bins ? pos : bins - 1;
  return inside ? pos : -1;
}

#endif /* QC_ELEMENTWISE_H */
