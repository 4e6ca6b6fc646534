/*
 * qc_groups.h -- the group recipes of LLM weight quantization (§6.2 of the
 * formats specification), each rule once, for the CPU loops
 * (quantcore/_cpu/qc_loops_groups.cpp) and the GPU kernel qc_group
 * (quantcore_gpu/cuda/formats.cu):
 *
 *   QcGroup*       the per-group qparams and quantize / dequantize rules of
 *                  ORT MatMulNBits ("onnx"), torchao, tinygemm, HQQ, AWQ,
 *                  GPTQ; their names and ids are QC_GROUP_RECIPES
 *                  (qc_registry.h)
 *   qc_group_q     one element of a group: the clamped q and its mask
 *
 * It includes qc_formats.h (the recipes use its qc_pow2f); qc_formats.h,
 * the minifloat codec behind the fp8, code and MX loops, does not include
 * it, so that an edit here rebuilds the group loops only.  Numerical
 * contract of qc_core.h: one rounding per operation, in the order written,
 * no contraction.
 */
#ifndef QC_GROUPS_H
#define QC_GROUPS_H

#include "qc_formats.h"

/* ------------------------------------------------------------------------
 * Group recipes of LLM weight quantization (§6.2).  Each recipe is an aggregate {qmin, qmax, mode} (the caller's integer range and QC_GRP_*)
 * with
 *   void qparams(float mn, float mx, QcGroupQ *g)   the group's parameters from
 *                         its finished min / max (qc_minmax_finish)
 *   float qf(float x, const QcGroupQ &g)            the rounded value before the
 *                         clamp to [qmin, qmax] (a NaN x gives NaN)
 *   float dq(float q, const QcGroupQ &g)            dequantise a clamped q
 * mn0 / mx0 below are min(mn, 0) / max(mx, 0).  Division by a constant is
 * true division, as the references compute it on the CPU.
 * ---------------------------------------------------------------------- */
#define QC_GRP_SYMMETRIC 1
#define QC_GRP_HQQ_OWN 2 /* QcGroupHqq: HQQ's own Quantizer.quantize (else ORT's port) */
#define QC_GRP_F16_SCALE 4 /* QcGroupOrt: a float16 scale (MLAS's float16 weights) */

/* x rounded to the nearest float16 value (ties to even; a magnitude that
 * rounds to 2**16 or more: +-Inf; NaN kept), as a float. */
QC_HD float qc_round_f16(float x) {
  const unsigned u = qc_bits(x), a = u & 0x7fffffffu, s = u & 0x80000000u;
  /* normal range (>= 2**-14): 13 mantissa bits dropped, ties to even */
  const unsigned rn = ((a + 0xfffu + ((a >> 13) & 1u)) >> 13) << 13;
  /* below: a multiple of 2**-24 (both products exact) */
  const float sub = qc_rint(qc_from_bits(a < 0x38800000u ? a : 0u) * 16777216.0f) *
                    (1.0f / 16777216.0f);
  const unsigned mag = a < 0x38800000u ? qc_bits(sub) : (rn >= 0x47800000u ? 0x7f800000u : rn);
  return a > 0x7f800000u ? x : qc_from_bits(mag | s);
}

/* One group's parameters: the stored scale and zero point (a float zero
 * point for tinygemm, an integer value otherwise), and what the quantize
 * step multiplies by / adds. */
struct QcGroupQ {
  float scale, zp, mul, add;
};

/* ORT MatMulNBits (q4_dq.cpp): asymmetric s = (mx0 - mn0) / qmax,
 * zp = RNA(clamp(0 - mn0 / s)) (mn0 when s == 0); symmetric: m = the
 * signed value of largest magnitude (ties: mn), s = -m / zp with the fixed
 * zp = (qmax + 1) / 2 (negative when m > 0).  QC_GRP_F16_SCALE (float16
 * weights): s = f16(s) after zp.  r = 1 / s (0 when s == 0);
 * q = RNA((x * r) + zp); dequant (q - zp) * s. */
struct QcGroupOrt {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    if (mode & QC_GRP_SYMMETRIC) {
      const float am = mn < 0.0f ? -mn : mn, bm = mx < 0.0f ? -mx : mx;
      const float m = bm > am ? mx : mn;
      g->zp = (qmax + 1.0f) / 2.0f;
      g->scale = -m / g->zp;
    } else {
      const float mn0 = qc_min0_f32(mn), mx0 = qc_max0_f32(mx);
      g->scale = (mx0 - mn0) / qmax;
      const float zf = g->scale != 0.0f ? 0.0f - mn0 / g->scale : mn0;
      g->zp = zf < 0.0f ? 0.0f : (zf > qmax ? qmax : qc_round(zf));
    }
    /* float16 weights: the zero point from the float scale, which is then
     * stored as float16 and quantizes (MLAS's BlockwiseQuantizer<MLFloat16>) */
    g->scale = (mode & QC_GRP_F16_SCALE) ? qc_round_f16(g->scale) : g->scale;
    g->mul = g->scale != 0.0f ? 1.0f / g->scale : 0.0f;
    g->add = g->zp;
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_round(x * g.mul + g.add); }
  QC_HDM float dq(float q, const QcGroupQ &g) const { return (q - g.zp) * g.scale; }
};

/* ORT's numpy weight quantizer (DefaultWeightOnlyQuantizer.quant_slice_*):
 * the scales and zero points of QcGroupOrt, then q = rint(x / s) + zp
 * (true division, ties to even); symmetric codes are signed [qmin, qmax]
 * with zero point 0 (the unsigned ones minus 2**(bits-1)). */
struct QcGroupOrtNumpy {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    const QcGroupOrt ort = {0.0f, qmax - qmin, mode};
    ort.qparams(mn, mx, g);
    g->zp = (mode & QC_GRP_SYMMETRIC) ? 0.0f : g->zp;
    g->mul = g->scale;
    g->add = g->zp;
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_rint(x / g.mul) + g.add; }
  QC_HDM float dq(float q, const QcGroupQ &g) const { return ((q + 0.0f) - g.zp) * g.scale; }
};

/* torchao affine (choose_qparams_affine / quantize_affine): symmetric
 * s = max(max(-mn0, mx0) / ((qmax - qmin) / 2), eps), zp = int((qmax + qmin
 * + 1) / 2); asymmetric s = max((mx0 - mn0) / (qmax - qmin), eps),
 * zp = clamp(qmin - rint(mn0 / s)).  q = rint(x * (1 / s)) + zp; dequant
 * f32(int(q) - zp) * s (the codes are integers: -0 becomes +0).
 * eps = 2**-126. */
struct QcGroupTorchao {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    const float eps = qc_pow2f(-126);
    const float mn0 = qc_min0_f32(mn), mx0 = qc_max0_f32(mx);
    if (mode & QC_GRP_SYMMETRIC) {
      const float neg = -mn0;
      const float amax = (neg > mx0 || neg != neg) ? neg : mx0;
      g->scale = qc_at_least_f32(amax / ((qmax - qmin) / 2.0f), eps);
      g->zp = (float)(int)((qmax + qmin + 1.0f) / 2.0f); /* Python int(): toward zero */
    } else {
      g->scale = qc_at_least_f32((mx0 - mn0) / (qmax - qmin), eps);
      g->zp = qc_clamp(qmin - qc_rint(mn0 / g->scale), qmin, qmax);
    }
    g->mul = 1.0f / g->scale;
    g->add = g->zp;
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_rint(x * g.mul) + g.add; }
  QC_HDM float dq(float q, const QcGroupQ &g) const { return ((q + 0.0f) - g.zp) * g.scale; }
};

/* torchao tinygemm (float zero point): no zero in the range;
 * s = max((mx - mn) / qmax, 1e-6), mid = (qmax + 1) / 2,
 * zero = mn + s * mid (stored), q = rint((x - (zero - s * mid)) / s);
 * dequant (q - mid) * s + zero. */
struct QcGroupTinygemm {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    const float mid = (qmax + 1.0f) / 2.0f;
    g->scale = qc_at_least_f32((mx - mn) / qmax, 1e-6f);
    g->zp = mn + g->scale * mid;
    g->mul = g->scale;
    g->add = g->zp - g->scale * mid; /* the group minimum, rounded */
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_rint((x - g.add) / g.mul); }
  QC_HDM float dq(float q, const QcGroupQ &g) const {
    return ((q + 0.0f) - (qmax + 1.0f) / 2.0f) * g.scale + g.zp;
  }
};

/* HQQ initialisation, optimize=False.
 * ORT's port (recipe "hqq_ort"): d = mx - mn (0 -> qmax),
 *   si = min(f32(1 / d) * qmax, 2e4), z = rint(-mn * si) (stored zero point),
 * HQQ's own Quantizer.quantize (QC_GRP_HQQ_OWN, recipe "hqq", round_zero=False):
 *   si = clamp(f32(1 / d) * qmax, max=2e4) (torch's qmax / d; a constant
 *   group: 1 / 0 = inf -> 2e4, stored scale 1/2e4; NaN stays NaN as torch's
 *   clamp), z = -mn * si (a float, not rounded);
 * both: q = rint(x * si + z); stored scale 1 / si; dequant (q - z) * scale. */
struct QcGroupHqq {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    if (mode & QC_GRP_HQQ_OWN) {
      float si = (1.0f / (mx - mn)) * qmax; /* torch's scalar / tensor: reciprocal, times */
      si = (si > 2e4f) ? 2e4f : si;
      g->zp = -mn * si;
      g->scale = 1.0f / si;
      g->mul = si;
      g->add = g->zp;
      return;
    }
    float d = mx - mn;
    d = d == 0.0f ? qmax : d;
    float si = (1.0f / d) * qmax;
    si = si < 2e4f ? si : 2e4f;
    g->zp = qc_rint(-mn * si);
    g->scale = 1.0f / si;
    g->mul = si;
    g->add = g->zp;
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_rint(x * g.mul + g.add); }
  QC_HDM float dq(float q, const QcGroupQ &g) const { return ((q + 0.0f) - g.zp) * g.scale; }
};

/* AWQ pseudo_quantize_tensor: zero_point=True (asymmetric, no zero in the
 * range): s = max(mx - mn, 1e-5) / qmax, z = clamp(-rint(mn / s), qmin,
 * qmax); zero_point=False (symmetric): s = max(max(|mn|, |mx|), 1e-5) /
 * qmax, z = 0.  q = rint(x / s) + z; y = (q - z) * s, in float (keeps -0). */
struct QcGroupAwq {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    if (mode & QC_GRP_SYMMETRIC) {
      const float am = mn < 0.0f ? -mn : mn, bm = mx < 0.0f ? -mx : mx;
      const float amax = (am > bm || am != am) ? am : bm;
      g->scale = qc_at_least_f32(amax, 1e-5f) / qmax;
      g->zp = 0.0f;
    } else {
      g->scale = qc_at_least_f32(mx - mn, 1e-5f) / qmax;
      g->zp = qc_clamp(-qc_rint(mn / g->scale), qmin, qmax);
    }
    g->mul = g->scale;
    g->add = g->zp;
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_rint(x / g.mul) + g.add; }
  QC_HDM float dq(float q, const QcGroupQ &g) const { return (q - g.zp) * g.scale; }
};

/* GPTQ Quantizer.find_params + quantize (no error feedback): zero in the
 * range; symmetric: mx0 = max(|mn0|, mx0), and mn0 = -mx0 only when
 * mn0 < 0; both zero -> (-1, 1); s = (mx0 - mn0) / qmax,
 * z = symmetric ? (qmax + 1) / 2 : rint(-mn0 / s); q = rint(x / s) + z;
 * y = s * (q - z), in float. */
struct QcGroupGptq {
  float qmin, qmax;
  int mode;
  QC_HDM void qparams(float mn, float mx, QcGroupQ *g) const {
    float lo = qc_min0_f32(mn), hi = qc_max0_f32(mx);
    if (mode & QC_GRP_SYMMETRIC) {
      const float al = lo < 0.0f ? -lo : lo;
      hi = (al > hi || al != al) ? al : hi;
      lo = lo < 0.0f ? -hi : lo;
    }
    const int both_zero = (lo == 0.0f) & (hi == 0.0f);
    lo = both_zero ? (float)-1 : lo;
    hi = both_zero ? 1.0f : hi;
    g->scale = (hi - lo) / qmax;
    g->zp = (mode & QC_GRP_SYMMETRIC) ? (qmax + 1.0f) / 2.0f : qc_rint(-lo / g->scale);
    g->mul = g->scale;
    g->add = g->zp;
  }
  QC_HDM float qf(float x, const QcGroupQ &g) const { return qc_rint(x / g.mul) + g.add; }
  QC_HDM float dq(float q, const QcGroupQ &g) const { return g.scale * (q - g.zp); }
};

/* Quantize one element of a group with recipe `rec`: q = clamp(qf) (a NaN
 * x gives qmin), mask = qmin <= qf <= qmax; returns q. */
template <class R>
QC_HD float qc_group_q(const R &rec, float x, const QcGroupQ &g, unsigned char *mask) {
  const float qf = rec.qf(x, g);
  *mask = (unsigned char)((qf >= rec.qmin) & (qf <= rec.qmax));
  float q = (qf > rec.qmin) ? qf : rec.qmin; /* NaN -> qmin */
  return (q < rec.qmax) ? q : rec.qmax;
}

#endif /* QC_GROUPS_H */
