/*
 * qc_qparams.h -- the quantization-parameter schemes of quantcore.qparams:
 * statistics (min / max, amax, ...) of one channel -> scale, zero point and
 * the parameters the fake-quant families read.  Shared by the CPU extension
 * (qparams_run in qc_kernels.h) and the GPU (quantcore_gpu/cuda/qparams.cu),
 * so a compat layer can compute its qparams where its tensors live, with no
 * host synchronisation.
 *
 * A scheme is a struct template over the input type T:
 *   enum { NOUT = k };  the number of outputs, written to out[j * C + c] as
 *                       doubles (exact for every float32 value and int32)
 *   static void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C);
 * and one line in QC_QP_SCHEMES.  Each computes in the precision its
 * docstring (quantcore/qparams.py) gives, one rounding per operation, in the
 * order written; x86's float -> int conversions are written out portably.
 */
#ifndef QC_QPARAMS_H
#define QC_QPARAMS_H

#include "qc_elementwise.h"

/* The uniform arguments of every scheme. */
struct QcQpArgs {
  double qmin, qmax, eps;
  int num_bits, flags;
};

/* flags */
#define QC_QP_UNSIGNED 1          /* amax: an unsigned grid */
#define QC_QP_PRESERVE_SPARSITY 2 /* fused: symmetric_quant */
#define QC_QP_HALF_AWAY 4         /* oneflow affine: zero point rounded half away */
#define QC_QP_SYMMETRIC 8         /* oneflow: the symmetric scheme */
#define QC_QP_CAMBRICON 16        /* oneflow: the cambricon formula */

/* NaN-propagating max(a, b) of np.maximum: a NaN argument is the result
 * (a's first); a when a >= b. */
QC_HD float qc_np_maximum_f32(float a, float b) { return (a >= b || a != a) ? a : b; }

/* floor(log2(v)) of a float32 v as a double, exact (the exponent of v):
 * -inf for 0, NaN for NaN, inf for inf; negative v has no logarithm (NaN). */
QC_HD double qc_floor_log2_f32(float v) {
  if (v != v || v < 0.0f) return qc_nan(0.0);
  if (v == 0.0f) return -qc_inf(0.0);
  if (v == qc_inf(0.0f)) return qc_inf(0.0);
  int e;
  frexp((double)v, &e); /* v = m * 2**e, 0.5 <= m < 1 */
  return (double)(e - 1);
}

/* affine_qparams: PyTorch's observer form (qc_affine_qparams_f32).
 * out: scale, zero point. */
template <typename T> struct QcQpAffine {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    float s;
    qc_i64 z;
    qc_affine_qparams_f32((float)a, (float)b, (qc_i64)g.qmin, (qc_i64)g.qmax, (float)g.eps, &s,
                          &z);
    out[0] = s;
    out[C] = (double)z;
  }
};

/* symmetric_qparams' scale (qc_symmetric_scale_f32). out: scale. */
template <typename T> struct QcQpSymmetric {
  enum { NOUT = 1 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64) {
    out[0] = qc_symmetric_scale_f32((float)a, (float)b, (qc_i64)g.qmin, (qc_i64)g.qmax,
                                    (float)g.eps);
  }
};

/* float_qparams (torch per_channel_affine_float_qparams), float32:
 *   scale = f32(mx - mn) / f32(qmax - qmin); scale = scale if scale > eps else 1
 *   zp    = -mn / scale
 * out: scale, zero point (a float). */
template <typename T> struct QcQpFloat {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    const float mn = (float)a, mx = (float)b;
    float s = (mx - mn) / (float)(g.qmax - g.qmin);
    s = (s > (float)g.eps) ? s : 1.0f;
    out[0] = s;
    out[C] = -mn / s;
  }
};

/* oneflow_qparams, float32 (flags: QC_QP_CAMBRICON, QC_QP_SYMMETRIC,
 * QC_QP_HALF_AWAY); amax = np.maximum(|hi|, |lo|):
 *   cambricon: scale = floor(log2(amax)) - (b - 2)  (an exponent), zp 0
 *   symmetric: scale = amax / f32(2**(b-1) - 1), zp 0
 *   affine:    scale = f32(hi - lo) / f32(2**b - 1), zp = -round(lo / scale)
 *              (ties to even, or away from zero with QC_QP_HALF_AWAY)
 * out: scale, zero point (a float). */
template <typename T> struct QcQpOneflow {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    const float lo = (float)a, hi = (float)b;
    const int nb = g.num_bits;
    if (g.flags & (QC_QP_CAMBRICON | QC_QP_SYMMETRIC)) {
      const float amax = qc_np_maximum_f32(fabsf(hi), fabsf(lo));
      if (g.flags & QC_QP_CAMBRICON)
        out[0] = (float)(qc_floor_log2_f32(amax) - (double)(nb - 2));
      else
        out[0] = amax / (float)((1ll << (nb - 1)) - 1);
      out[C] = 0.0;
      return;
    }
    const float s = (hi - lo) / (float)((1ll << nb) - 1);
    const float ratio = lo / s;
    const float r = (g.flags & QC_QP_HALF_AWAY) ? qc_round(ratio) : qc_rint(ratio);
    out[0] = s;
    out[C] = -r;
  }
};

/* amax_multiplier, in T: mult = max_bound / amax with max_bound =
 * 2**(b - 1 + unsigned) - 1; where amax <= 2**-24, mult = 0 and div = 1,
 * else div = mult.  out: mult, div. */
template <typename T> struct QcQpAmax {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T, const QcQpArgs &g, double *out, qc_i64 C) {
    const int uns = (g.flags & QC_QP_UNSIGNED) ? 1 : 0;
    const T max_bound = (T)((1ll << (g.num_bits - 1 + uns)) - 1);
    const T mult = max_bound / a;
    const bool tiny = a <= (T)5.9604644775390625e-08; /* 2**-24 */
    out[0] = tiny ? (T)0 : mult;
    out[C] = tiny ? (T)1 : mult;
  }
};

/* nudge_tensorflow, float32 (qmin, qmax as float32):
 *   scale = f32(mx - mn) / (qmax - qmin);  inv = (qmax - qmin) / f32(mx - mn)
 *   zpm   = qmin - f32(mn / scale)
 *   nzp   = qmin if zpm < qmin, qmax if zpm > qmax, else round_half_away(zpm)
 *   nmin  = (qmin - nzp) * scale;  nmax = (qmax - nzp) * scale
 *   qz    = floor(f32(-nmin * inv) + 0.5)
 * out: nudged min, nudged max, scale, inv, quant zero (the nudged family's
 * parameters, in its order). */
template <typename T> struct QcQpNudgeTf {
  enum { NOUT = 5 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    const float mn = (float)a, mx = (float)b, qmin = (float)g.qmin, qmax = (float)g.qmax;
    const float span = mx - mn;
    const float s = span / (qmax - qmin);
    const float inv = (qmax - qmin) / span;
    const float zpm = qmin - mn / s;
    const float nzp = zpm < qmin ? qmin : (zpm > qmax ? qmax : qc_round(zpm));
    const float nmin = (qmin - nzp) * s;
    out[0] = nmin;
    out[C] = (qmax - nzp) * s;
    out[2 * C] = s;
    out[3 * C] = inv;
    out[4 * C] = floorf(-nmin * inv + 0.5f);
  }
};

/* nudge_mindspore (Ascend rule), float32:
 *   scale = f32(mx - mn) / (qmax - qmin);  zpm = qmin - f32(mn / scale)
 *   nzp   = floor(clamp(zpm, qmin, qmax) + 0.5)   (NaN passes)
 *   nmin  = (qmin - nzp) * scale;  nmax = (qmax - nzp) * scale
 * out: nudged min, nudged max, scale. */
template <typename T> struct QcQpNudgeMs {
  enum { NOUT = 3 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    const float mn = (float)a, mx = (float)b, qmin = (float)g.qmin, qmax = (float)g.qmax;
    const float s = (mx - mn) / (qmax - qmin);
    const float zpm = qmin - mn / s;
    const float nzp = floorf(qc_clamp(zpm, qmin, qmax) + 0.5f);
    out[0] = (qmin - nzp) * s;
    out[C] = (qmax - nzp) * s;
    out[2 * C] = s;
  }
};

/* pq_affine_qparams (NVIDIA fake_affine_tensor_quant), in T:
 *   step = (hi - lo) / T(2**b - 1);  quant_zero = rint(lo / step) + T(2**(b - 1))
 * out: step, quant zero. */
template <typename T> struct QcQpPqAffine {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    const T step = (b - a) / (T)((1ll << g.num_bits) - 1);
    out[0] = step;
    out[C] = qc_rint(a / step) + (T)(1ll << (g.num_bits - 1));
  }
};

/* cambricon_step: 2**int32(shift) in T, int32() truncating toward zero with
 * x86's INT32_MIN for NaN, +-inf and values outside int32 (the step then
 * underflows to 0).  out: step. */
template <typename T> struct QcQpCambriconStep {
  enum { NOUT = 1 };
  static QC_HDM void apply(T a, T, const QcQpArgs &, double *out, qc_i64) {
    const double v = (double)a;
    const bool ok = (v - v == 0.0) && v > -2147483649.0 && v < 2147483648.0;
    double e = ok ? trunc(v) : -2147483648.0;
    e = e < -2000.0 ? -2000.0 : (e > 2000.0 ? 2000.0 : e); /* past any float's range */
    out[0] = (double)qc_exp2i(T(), (int)e); /* exact bits: ldexpf is ex2.approx on NVRTC */
  }
};

/* choose_qparams_fused: PyTorch's ChooseQuantizationParams as the fused
 * moving-average observer uses it (see quantcore/qparams.py for the
 * formula), with torch's int32 arithmetic on the range (x86: wrapping,
 * truncating division).  out: scale (float32), zero point. */
QC_HD qc_i64 qc_i32_wrap(qc_i64 v) { return (qc_i64)(int)(unsigned int)(unsigned long long)v; }
QC_HD qc_i64 qc_i32_half(qc_i64 v) { return v >= 0 ? v / 2 : -((-v) / 2); }
QC_HD qc_i64 qc_i32_abs(qc_i64 v) { return v == -2147483648ll ? v : (v < 0 ? -v : v); }

template <typename T> struct QcQpFused {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &g, double *out, qc_i64 C) {
    float mn = (float)a, mx = (float)b;
    const qc_i64 qmin = qc_i32_wrap((qc_i64)g.qmin), qmax = qc_i32_wrap((qc_i64)g.qmax);
    const qc_i64 d = qc_i32_wrap(qmax - qmin);
    const bool preserve = (g.flags & QC_QP_PRESERVE_SPARSITY) != 0;
    const float small_thr = 6.1e-5f;
    if (preserve && mn < 0.0f && mx > 0.0f) {
      const qc_i64 sqmin = qc_i32_wrap(-(qc_i32_half(d) + 1)), sqmax = qc_i32_half(d);
      const float ms = qc_np_maximum_f32(fabsf(mn / (float)sqmin), fabsf(mx / (float)sqmax));
      mn = (float)((double)ms * (double)sqmin);
      mx = (float)((double)ms * (double)sqmax);
    }
    mn = (mn <= 0.0f || mn != mn) ? mn : 0.0f; /* np.minimum(mn, 0) */
    mx = (mx >= 0.0f || mx != mx) ? mx : 0.0f; /* np.maximum(mx, 0) */
    double scale = ((double)mx - (double)mn) / (double)d;
    const float s32 = (float)scale;
    if (s32 == 0.0f || isinf(1.0f / s32)) scale = 0.1;
    if (scale < (double)small_thr) {
      const float amp = small_thr / (float)scale;
      const float span = small_thr * (float)d;
      if (mn == 0.0f) {
        mx = span;
      } else if (mx == 0.0f) {
        mn = -span;
      } else {
        mn = mn * amp;
        mx = mx * amp;
      }
      scale = (double)small_thr;
    }
    const float sf = (float)scale;
    const double s64 = (double)sf, rmin = (double)mn / s64, rmax = (double)mx / s64;
    double z = ((double)qc_i32_abs(qmin) + fabs(rmin) < (double)qc_i32_abs(qmax) + fabs(rmax))
                   ? (double)qmin - rmin
                   : (double)qmax - rmax;
    if (preserve && mn < 0.0f && mx > 0.0f) z = (double)qc_i32_wrap(qmin + qmax) / 2.0;
    double zr = z < (double)qmin ? (double)qmin : (z > (double)qmax ? (double)qmax : rint(z));
    if (!(zr - zr == 0.0)) zr = -2147483648.0; /* x86: NaN -> INT32_MIN */
    out[0] = sf;
    out[C] = zr;
  }
};

/* symmetric_range (MindSpore, before nudging): MindSpore's kernel form
 * (-max, max) if |min| < max else (min, -min), i.e. M = max if |min| < max
 * else -min (so the signs of zero are the kernel's); a NaN max propagates.
 * out: -M, M. */
template <typename T> struct QcQpSymRange {
  enum { NOUT = 2 };
  static QC_HDM void apply(T a, T b, const QcQpArgs &, double *out, qc_i64 C) {
    const float mn = (float)a, mx = (float)b;
    const float m = (mx != mx) ? mx : ((fabsf(mn) < mx) ? mx : -mn);
    out[0] = -m;
    out[C] = m;
  }
};

/* X(name, Scheme) for every scheme.  (quantcore_gpu/kernels.py reads the
 * X(...) lines: keep one entry per line.) */
#define QC_QP_SCHEMES(X)                                                       \
  X(affine, QcQpAffine)                                                        \
  X(symmetric, QcQpSymmetric)                                                  \
  X(float, QcQpFloat)                                                          \
  X(oneflow, QcQpOneflow)                                                      \
  X(amax, QcQpAmax)                                                            \
  X(nudge_tf, QcQpNudgeTf)                                                     \
  X(nudge_ms, QcQpNudgeMs)                                                     \
  X(pq_affine, QcQpPqAffine)                                                   \
  X(cambricon_step, QcQpCambriconStep)                                         \
  X(fused, QcQpFused)                                                          \
  X(symmetric_range, QcQpSymRange)

/* scheme ids QC_QP_affine, ... (QC_QP_COUNT), names and output counts */
#define QC_QP_ID(name, S) QC_QP_##name,
enum { QC_QP_SCHEMES(QC_QP_ID) QC_QP_COUNT };
#undef QC_QP_ID
static const char *const qc_qp_scheme_names[] = {QC_QP_SCHEMES(QC_X_NAME)};
static const int qc_qp_scheme_nout[] = {QC_QP_SCHEMES(QC_X_NOUT)};

#ifndef __CUDACC__
/* Scheme `scheme` over C channels (b may be NULL: schemes of one input),
 * on the CPU (the GPU's twin is qc_qparams in qparams.cu). */
template <typename T>
static void qc_qparams_run(int scheme, const T *a, const T *b, qc_i64 C, QcQpArgs g,
                           double *out) {
  switch (scheme) {
#define QC_QP_CASE(name, S)                                                                    \
  case QC_QP_##name:                                                                           \
    for (qc_i64 c = 0; c < C; c++) S<T>::apply(a[c], b ? b[c] : (T)0, g, out + c, C);          \
    break;
    QC_QP_SCHEMES(QC_QP_CASE)
#undef QC_QP_CASE
  }
}
#endif

#endif /* QC_QPARAMS_H */
