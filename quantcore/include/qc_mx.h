/*
 * qc_mx.h -- block-scaled formats of the formats specification §4-5, each rule
 * once, for the CPU extension and the CUDA sources:
 *
 *   QcBlockMx     OCP microscaling (MX): blocks sharing an E8M0 scale, the
 *                 elements e4m3 / e5m2 / e2m3 / e3m2 / e2m1 / int8 (§4)
 *   QcBlockNvfp4  NVFP4: e2m1 elements, an e4m3 block scale and a float32
 *                 global scale, modelopt's and torchao's recipes (§5)
 *
 * A block recipe is an aggregate {elem, mode, p0, p1} with
 *   void block(float amax, QcBlockQ *b) const   the block's scale code and
 *                         factors from its amax (NaN when it holds a NaN)
 *   float value(float x, const QcBlockQ &b) const   the element's rounded
 *                         value on the element grid (NaN possible)
 *   unsigned code(float r) const   the element code of a value() result
 *   float fake(float r, const QcBlockQ &b) const    the dequantised value
 * run by the block driver (qc_cpu_loops.h block_scaled_op, formats.cu
 * qc_block_scaled).  Numerical contract of qc_core.h: one rounding per
 * operation, in the order written, no contraction.
 */
#ifndef QC_MX_H
#define QC_MX_H

#include "qc_formats.h"
#include "qc_registry.h" /* QcInt, qc_dispatch_among, QC_BLOCK_RECIPES */

/* MX element ids: the minifloat ids of qc_formats.h (QC_FMT_E4M3FN,
 * QC_FMT_E5M2, QC_FMT_E2M3FN, QC_FMT_E3M2FN, QC_FMT_E2M1FN) and MXINT8, the
 * first id after them: the same id space, so it follows the format list
 * (a format added there moves it; formats/mx.py derives it the same way) */
#define QC_MX_INT8 QC_FMT_COUNT

/* MX mode word: the scale rule (§4.2) in the low bits, then flags */
#define QC_MX_FLOOR 0
#define QC_MX_CEIL 1
#define QC_MX_EVEN 2
#define QC_MX_RCEIL 3
#define QC_MX_RCEIL_EXACT 4
#define QC_MX_FLOOR_LOG2 5
#define QC_MX_SCALE_MASK 7
#define QC_MX_HALF_AWAY 8  /* element rounding ties away from zero (else to even) */
#define QC_MX_TORCHAO 16   /* torchao's quirks (§4.3) */
#define QC_MX_MXS 32       /* microxcaling's element rule (§4.3 MXS) */
#define QC_MX_INT8_FULL 64 /* MXINT8 codes down to -128 (else -127) */

/* NVFP4 mode word */
#define QC_NV_TORCHAO 1     /* torchao's recipe (else modelopt's) */
#define QC_NV_NO_GLOBAL 2   /* torchao without a per-tensor scale */

/* One block's scale code and factors. */
struct QcBlockQ {
  float qmul;      /* the quantize factor (or divisor, by the recipe)    */
  float deq;       /* the dequantize factor (NaN for a NaN block)        */
  unsigned scode;  /* the stored block scale code (E8M0 or e4m3 bits)    */
};

/* A block's amax from its finished min / max (qc_minmax_finish): NaN when
 * the block holds a NaN, else max(|lo|, |hi|) (+0 for zeros). */
QC_HD float qc_block_amax(float lo, float hi) {
  const float a = lo < 0.0f ? -lo : lo + 0.0f, b = hi < 0.0f ? -hi : hi + 0.0f;
  return lo != lo ? lo : (a > b ? a : b);
}

/* The shared exponent emax_elem of an MX element type (§4.1). */
QC_HD int qc_mx_emax(int elem) {
  switch (elem) {
  case QC_FMT_E4M3FN: return 8;
  case QC_FMT_E5M2: return 15;
  case QC_FMT_E3M2FN: return 4;
  case QC_MX_INT8: return 0;
  default: return 2; /* e2m3, e2m1 */
  }
}

/* The largest element value (int8: 127 / 64). */
QC_HD float qc_mx_elem_max(int elem) {
  return elem == QC_MX_INT8 ? 1.984375f : qc_mf_max(elem);
}

/* floor(L(v)) and ceil(L(v)) of v > 0 finite, L = RN32(log2), by the
 * per-binade counts of spec §4.2: v = 2**e (1 + f / 2**23) (float32
 * subnormals normalised),
 *   floor: e + 1 iff f >= 2**23 - n_floor_up(e), else e
 *   ceil:  e iff f <= n_ceil_down(e), else e + 1
 * with n depending on m = e >= 0 ? e : -e - 1 only (n_floor_up =
 * floor(2**(bitlength(m) - 1) ln 2), n_ceil_down one binade lower).  Exact
 * for v >= 2**-127 (the spec's tables and their continuation to e = -127,
 * the same count as e = -126); below, the result is <= -127, which every use
 * clamps to -127. */
QC_HD void qc_f32_exp_frac(float v, int *e, int *f) {
  const unsigned b = qc_bits(v);
  const int sub = (b & 0x7f800000u) == 0u;
  const float vn = sub ? v * qc_pow2f(64) : v; /* exact */
  const unsigned bn = qc_bits(vn);
  *e = (int)((bn >> 23) & 0xffu) - 127 - (sub ? 64 : 0);
  *f = (int)(bn & 0x7fffffu);
}
QC_HD int qc_log2_n_floor_up(int e) {
  const int m = e >= 0 ? e : -e - 1;
  return (m >= 2) + (m >= 4) + 3 * (m >= 8) + 6 * (m >= 16) + 11 * (m >= 32) + 22 * (m >= 64) +
         44 * (m >= 128);
}
QC_HD int qc_log2_n_ceil_down(int e) {
  const int m = e >= 0 ? e : -e - 1;
  return (m >= 4) + (m >= 8) + 3 * (m >= 16) + 6 * (m >= 32) + 11 * (m >= 64) + 22 * (m >= 128);
}
QC_HD int qc_floor_log2_rn32(float v) {
  int e, f;
  qc_f32_exp_frac(v, &e, &f);
  return e + (f >= (1 << 23) - qc_log2_n_floor_up(e));
}
QC_HD int qc_ceil_log2_rn32(float v) {
  int e, f;
  qc_f32_exp_frac(v, &e, &f);
  return e + (f > qc_log2_n_ceil_down(e));
}

/* The E8M0 value 2**(code - 127) (code 0: the subnormal 2**-127; 255: NaN)
 * and the reciprocal 2**(127 - code) (exact: 2**127 and 2**-127 are
 * float32 values). */
QC_HD float qc_e8m0_value(unsigned code) {
  return code == 255u ? qc_from_bits(0x7fc00000u)
                      : (code == 0u ? qc_from_bits(0x00400000u) : qc_from_bits(code << 23));
}
QC_HD float qc_e8m0_recip(unsigned code) {
  return code == 254u ? qc_from_bits(0x00400000u) : qc_from_bits((254u - code) << 23);
}

/* The E8M0 scale code of a block with amax `amax` (>= 0 or NaN) for element
 * type `elem` by the rule of `mode` (spec §4.2):
 *   floor        E(b) - emax
 *   ceil         E(b) + (mantissa != 0) - emax
 *   even         E((b + 2**(22 - mbits)) & 0xFF800000) - emax
 *     (these three: clamp(e, -127, 128) + 127; a NaN amax gives 255)
 *   rceil        ceil(L(d)), d = amax / max_elem; rceil_exact: the exact
 *     ceil(log2 d);  NaN d -> 255, Inf d -> 254, else clamp(., -127, 127) + 127
 *   floor_log2   floor(L(amax)) (amax 0 -> 2**-126) - emax; > 127 (an Inf
 *     amax) or NaN -> 255, < -127 -> -127
 * E(b) is the biased exponent field minus 127 (-127 for zero / subnormals). */
QC_HD unsigned qc_mx_scale_code(float amax, int elem, int mode) {
  /* every rule's candidate, then selects (no branches: the CPU driver runs
   * it vectorised across a batch of blocks) */
  const int emax = qc_mx_emax(elem);
  const int rule = mode & QC_MX_SCALE_MASK;
  const unsigned b = qc_bits(amax);
  const int nan = amax != amax;
  const float fmax = 3.4028234663852886e38f;
  /* floor / ceil / even: the exponent field of amax (rounded for even) */
  const int mbits = elem == QC_MX_INT8 ? 6 : qc_minifloat(elem).mbits;
  const unsigned bb = rule == QC_MX_EVEN ? (b + (1u << (22 - mbits))) & 0xff800000u : b;
  int ef = (int)((bb >> 23) & 0xffu) - 127 - emax + (rule == QC_MX_CEIL && (b & 0x7fffffu) != 0u);
  ef = ef < -127 ? -127 : (ef > 128 ? 128 : ef);
  /* rceil / rceil_exact: ceil(log2 d) of d = amax / max_elem */
  const float d = amax / qc_mx_elem_max(elem);
  const float dd = d > 0.0f && d <= fmax ? d : 1.0f; /* (the specials are selected below) */
  int ed, fd;
  qc_f32_exp_frac(dd, &ed, &fd);
  int er = ed + (rule == QC_MX_RCEIL ? fd > qc_log2_n_ceil_down(ed) : fd != 0);
  er = er < -127 ? -127 : (er > 127 ? 127 : er);
  const unsigned cr = d > fmax ? 254u : (d == 0.0f ? 0u : (unsigned)(er + 127));
  /* floor_log2: floor(L(amax or 2**-126)) - emax; Inf -> NaN */
  const float a1 = amax == 0.0f ? qc_pow2f(-126) : (amax <= fmax ? amax : 1.0f);
  const int el = qc_floor_log2_rn32(a1) - emax;
  const unsigned cl = amax > fmax || el > 127 ? 255u : (unsigned)((el < -127 ? -127 : el) + 127);
  const unsigned code = (rule == QC_MX_RCEIL || rule == QC_MX_RCEIL_EXACT)
                            ? cr
                            : (rule == QC_MX_FLOOR_LOG2 ? cl : (unsigned)(ef + 127));
  return nan ? 255u : code;
}

/* v rounded to the grid of MX element type `elem` (ties to even, or away
 * from zero with QC_MX_HALF_AWAY), saturating at +-max (+-Inf too); NaN
 * stays NaN, the sign is kept (-0 too):
 *   minifloats  normal range: the float32 mantissa cut to mbits; below the
 *               min normal: steps of the min subnormal
 *   int8        rint / round(v * 64) clamped to [-127 (-128), 127], / 64 */
QC_HD float qc_mx_round(float v, int elem, int mode) {
  const int away = mode & QC_MX_HALF_AWAY;
  if (elem == QC_MX_INT8) {
    const float t = v * 64.0f;
    const float r = away ? qc_round(t) : qc_rint(t);
    const float lo = (mode & QC_MX_INT8_FULL) ? -128.0f : -127.0f;
    const float c = r < lo ? lo : (r > 127.0f ? 127.0f : r); /* NaN -> NaN */
    return c * 0.015625f; /* / 64, exact */
  }
  const QcMinifloat f = qc_minifloat(elem);
  const int S = 23 - f.mbits;
  const unsigned u = qc_bits(v);
  const unsigned a = u & 0x7fffffffu;
  const unsigned min_normal = (unsigned)(127 - f.bias + 1) << 23;
  const unsigned maxb = qc_bits(qc_mf_max(elem));
  unsigned mag;
  if (away) {
    const unsigned a_c = a < 0x7f800000u ? a : 0x7f800000u; /* Inf / NaN: no carry */
    const unsigned rn = ((a_c + (1u << (S - 1))) >> S) << S;
    const int is_sub = a < min_normal;
    const float ax = qc_from_bits(is_sub ? a : 0u);
    const float t = ax * qc_mf_sub_scale<float>(f); /* exact */
    const float rs = qc_round(t) * qc_pow2f(1 - f.bias - f.mbits); /* / sc, exact */
    mag = is_sub ? qc_bits(rs) : rn;
  } else {
    /* ties to even by one float32 addition (no branch, no rint): with
     * e = max(E(|v|), the min normal's exponent), m = 2**(e + S) has the
     * grid step 2**(e - mbits) as its ulp and |v| < 2**(e + 1) <= m, so the
     * sum |v| + m is m plus |v| rounded to the grid (RNE; a carry into the
     * next binade included) and subtracting m is exact: the same as the
     * mantissa cut of the normal range and the min-subnormal steps below
     * it.  |v| is clamped first to the power of two above the largest
     * value (Inf and NaN too; NaN is returned below), which rounds to
     * itself and then saturates */
    const unsigned clamp = (maxb & 0x7f800000u) + 0x00800000u;
    const unsigned a_c = a < clamp ? a : clamp;
    const unsigned eb = a_c & 0x7f800000u;
    const float m = qc_from_bits((eb > min_normal ? eb : min_normal) + ((unsigned)S << 23));
    mag = qc_bits((qc_from_bits(a_c) + m) - m);
  }
  const unsigned out = (mag > maxb ? maxb : mag) | (u & 0x80000000u);
  return a > 0x7f800000u ? v : qc_from_bits(out);
}

/* torchao's FP6 / FP4 code of +NaN (its bit routine treats the NaN bits as
 * a normal number): e2m3 12, e3m2 14, e2m1 3 (spec §4.3); FP8 0x7F. */
QC_HD unsigned qc_mx_torchao_nan_code(int elem) {
  return elem == QC_FMT_E2M3FN ? 12u : (elem == QC_FMT_E3M2FN ? 14u : (elem == QC_FMT_E2M1FN ? 3u : 0x7fu));
}

/* MX (spec §4), elements `elem`, mode QC_MX_*:
 *   block    code = qc_mx_scale_code(amax); deq = 2**(code - 127) (NaN for 255)
 *            qmul = 2**(127 - code) (exact division by the scale); torchao
 *            (floor / ceil / even): 1 / max(2**(code - 127), 2**-126) (0 for
 *            255); torchao rceil: 1 for code 0, NaN for 255; quantcore's
 *            default: NaN for 255
 *   value    qc_mx_round(x * qmul); microxcaling: a zero x * qmul gives +0
 *   code     the element's bits (int8: two's complement); NaN: FP8 0x7F,
 *            FP6 / FP4 0 (the sign-only code; torchao: 12 / 14 / 3, with the
 *            sign bit of the NaN: a -NaN, or +-Inf * 0 in a floor / ceil /
 *            even NaN block), int8 0
 *   fake     value * deq */
struct QcBlockMx {
  int elem, mode;
  float p0, p1;
  /* the mode bits the element loops read (the scale rule is per block) */
  enum { STATIC_BITS = QC_MX_HALF_AWAY | QC_MX_TORCHAO | QC_MX_MXS | QC_MX_INT8_FULL };
#ifndef __CUDACC__
  /* f(QcInt<elem>, QcInt<mode & STATIC_BITS>) for the combinations in use
   * (a loop each, with the element format folded to constants), else
   * f(QcInt<-1>, QcInt<-1>) (everything at run time) */
  template <class F> static void dispatch(int elem, int mode, F f) {
    const int bits = mode & STATIC_BITS;
    switch (elem) {
#define QC_MX_ELEM_CASE(E)                                                                      \
  case E:                                                                                      \
    qc_dispatch_among<0, QC_MX_HALF_AWAY, QC_MX_TORCHAO, QC_MX_MXS,                           \
                      QC_MX_MXS | QC_MX_HALF_AWAY>(bits, [&](auto m) { f(QcInt<E>(), m); });   \
    break;
      QC_MX_ELEM_CASE(QC_FMT_E4M3FN)
      QC_MX_ELEM_CASE(QC_FMT_E5M2)
      QC_MX_ELEM_CASE(QC_FMT_E2M3FN)
      QC_MX_ELEM_CASE(QC_FMT_E3M2FN)
      QC_MX_ELEM_CASE(QC_FMT_E2M1FN)
#undef QC_MX_ELEM_CASE
    case QC_MX_INT8:
      qc_dispatch_among<0, QC_MX_HALF_AWAY, QC_MX_MXS | QC_MX_HALF_AWAY, QC_MX_INT8_FULL,
                        QC_MX_INT8_FULL | QC_MX_HALF_AWAY>(
          bits, [&](auto m) { f(QcInt<QC_MX_INT8>(), m); });
      break;
    default: f(QcInt<-1>(), QcInt<-1>());
    }
  }
#endif
  QC_HDM void block(float amax, QcBlockQ *b) const {
    const unsigned code = qc_mx_scale_code(amax, elem, mode);
    const float nan = qc_from_bits(0x7fc00000u);
    const float q = code == 255u ? nan : qc_e8m0_recip(code);
    const int ao = (mode & QC_MX_TORCHAO) != 0;
    const int ao_rceil = ao && (mode & QC_MX_SCALE_MASK) == QC_MX_RCEIL;
    const float q_ao = ao_rceil ? (code == 0u ? 1.0f : q)
                                : (code == 255u ? 0.0f : (code == 0u ? qc_pow2f(126) : q));
    const float qmul = ao ? q_ao : q; /* (selects: vectorised across blocks) */
    b->scode = code;
    b->qmul = qmul;
    b->deq = qc_e8m0_value(code);
  }
  QC_HDM float value(float x, const QcBlockQ &b) const {
    const float v = x * b.qmul;
    const float r = qc_mx_round(v, elem, mode);
    /* torchao's NaN, made explicitly (so that the GPU gives the same): in a
     * NaN block floor / ceil / even multiply by 0, and on x86 a NaN x keeps
     * its sign, +-Inf * 0 is the default NaN (sign bit set); rceil multiplies
     * by its (positive) NaN scale, which x86 returns */
    const unsigned ao_sign = x != x ? (qc_bits(x) & 0x80000000u) : 0x80000000u;
    const unsigned ao_nan = 0x7fc00000u | (b.qmul == 0.0f ? ao_sign : 0u);
    const float r_ao = ((mode & QC_MX_TORCHAO) && r != r) ? qc_from_bits(ao_nan) : r;
    return ((mode & QC_MX_MXS) && v == 0.0f) ? 0.0f : r_ao; /* sign(+-0) * ... = +0 */
  }
  QC_HDM unsigned code(float r) const {
    /* (selects, no early return: the CPU loop vectorises) */
    const unsigned nan_code = elem == QC_MX_INT8 ? 0u
                              : (mode & QC_MX_TORCHAO) ? qc_mx_torchao_nan_code(elem)
                              : (f_kind() == QC_MF_FINITE ? 0u : 0x7fu);
    const float rf = r == r ? r : 0.0f;
    const unsigned c = elem == QC_MX_INT8 ? (unsigned)(int)(rf * 64.0f) & 0xffu
                                          : qc_mf_encode(rf, elem, QC_F8_SATFINITE);
    /* torchao's bit routine keeps a NaN's sign bit (value() sets it) */
    const unsigned sbit = elem == QC_MX_INT8 ? 0u : 1u << (f_ebits() + f_mbits());
    const unsigned nan_s = ((mode & QC_MX_TORCHAO) && (qc_bits(r) >> 31)) ? sbit : 0u;
    return r == r ? c : (nan_code | nan_s);
  }
  /* (a NaN r is returned as it is: NaN * NaN would pick an operand by the
   * instruction the compiler chose, which differs between the SIMD builds) */
  QC_HDM float fake(float r, const QcBlockQ &b) const { return r != r ? r : r * b.deq; }
  QC_HDM int f_kind() const { return qc_minifloat(elem).kind; }
  QC_HDM int f_ebits() const { return qc_minifloat(elem).ebits; }
  QC_HDM int f_mbits() const { return qc_minifloat(elem).mbits; }
};

/* The e2m1 code of an already rounded, saturated value r: sign | magnitude
 * code; NaN by the recipe (modelopt: +6 = 0x7, torchao: 0x3). */
QC_HD unsigned qc_e2m1_code(float r, unsigned nan_code) {
  const unsigned c = qc_mf_encode(r == r ? r : 0.0f, QC_FMT_E2M1FN, QC_F8_SATFINITE);
  return r == r ? c : nan_code;
}

/* NVFP4 (spec §5), mode QC_NV_*, the global scale g:
 *   modelopt  (p0 = RN32(6 g), p1 = g)  bs = amax / p0 (0 -> 1);
 *             s8 = e4m3(clamp(bs, 2**-9, 448)); sg = f32(s8) * g;
 *             value = e2m1(x / sg) (sign from v < 0: -0 -> +0, NaN -> +6)
 *   torchao   (p0 = g, p1 = RN32(1 / g)) b = amax / 6;
 *             s8 = e4m3(clamp(b / g, 2**-6, 448)); r = p1 / f32(s8)
 *             (no global scale: clamp(b, ...), r = 1 / f32(s8));
 *             value = e2m1(clamp(x * r, -6, 6)) (sign kept; NaN -> 0x4: every
 *             element of a NaN block, as torchao on the CPU codes them)
 *   fake      value * f32(s8 * g) (torchao: g * f32(s8); without g: f32(s8));
 *             modelopt's code 0x8 is +0 */
struct QcBlockNvfp4 {
  int elem, mode;
  float p0, p1;
  enum { STATIC_BITS = QC_NV_TORCHAO | QC_NV_NO_GLOBAL };
#ifndef __CUDACC__
  template <class F> static void dispatch(int, int mode, F f) {
    qc_dispatch_among<0, QC_NV_TORCHAO, QC_NV_TORCHAO | QC_NV_NO_GLOBAL>(
        mode & STATIC_BITS, [&](auto m) { f(QcInt<QC_FMT_E2M1FN>(), m); });
  }
#endif
  QC_HDM void block(float amax, QcBlockQ *b) const {
    float s;
    if (mode & QC_NV_TORCHAO) {
      const float bq = amax / 6.0f;
      const float pre = (mode & QC_NV_NO_GLOBAL) ? bq : bq / p0;
      s = qc_clamp<float>(pre, qc_pow2f(-6), 448.0f);
    } else {
      float bs = amax / p0;
      bs = bs == 0.0f ? 1.0f : bs;
      s = qc_clamp<float>(bs, qc_pow2f(-9), 448.0f);
    }
    s = s == s ? s : qc_from_bits(0x7fc00000u); /* (torch.clamp keeps NaN) */
    b->scode = qc_mf_encode(s, QC_FMT_E4M3FN, QC_F8_SATFINITE);
    const float s8 = qc_mf_decode(b->scode, QC_FMT_E4M3FN);
    if (mode & QC_NV_TORCHAO) {
      const int ng = mode & QC_NV_NO_GLOBAL;
      b->qmul = ng ? 1.0f / s8 : p1 / s8;
      b->deq = ng ? s8 : p0 * s8;
    } else {
      b->qmul = s8 * p1;
      b->deq = b->qmul;
    }
  }
  QC_HDM float value(float x, const QcBlockQ &b) const {
    if (mode & QC_NV_TORCHAO) {
      const float v = x * b.qmul;
      return qc_mx_round(v, QC_FMT_E2M1FN, 0);
    }
    const float v = x / b.qmul;
    const float r = qc_mx_round(v, QC_FMT_E2M1FN, 0);
    return v != v ? 6.0f : (v == 0.0f ? 0.0f : r); /* sign = (v < 0): -0 -> +0, NaN -> +6 */
  }
  QC_HDM unsigned code(float r) const {
    return qc_e2m1_code(r, (mode & QC_NV_TORCHAO) ? 4u : 7u);
  }
  /* (modelopt's value table holds +0 for the code 0x8) */
  QC_HDM float fake(float r, const QcBlockQ &b) const {
    return ((mode & QC_NV_TORCHAO) ? r : r + 0.0f) * b.deq;
  }
};

#endif /* QC_MX_H */
