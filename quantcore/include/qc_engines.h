/*
 * qc_engines.h -- the per-element rules of the engine checkpoint writers
 * (quantcore/engines: compressed-tensors' and ModelOpt's weights), for the
 * CPU module quantcore/_cpu/_engines.pyx and its GPU twin
 * quantcore_gpu/cuda/engines.cu.  The scales are formed in Python
 * (quantcore/engines/compressed_tensors.py, modelopt.py); these are the
 * loops over the elements, reading the stored BF16 / F32 bits as they are
 * (no float32 copy of the weight).  The element rules (qc_eng_fp8,
 * qc_eng_e2m1, qc_eng_index, qc_eng_int_code, qc_eng_group_minmax) are host and device
 * code; the row loops (after #ifndef __CUDACC__) the CPU's:
 *
 *   qc_bf16_value(b)   the float32 value of BF16 bits b (b << 16)
 *   qc_round_bf16(v)   v rounded to nearest even to BF16, as float32
 *                      (bits + 0x7FFF + bit 16, the low 16 bits cleared:
 *                      compressed_tensors._round_bf16, the same rule; v
 *                      finite or +-inf)
 *   qc_eng_fp8(x, s, r)  e4m3fn code, satfinite, of f32(x / s), rounded to
 *                      BF16 first when r (compressed-tensors' r_D(x / s) of
 *                      a BF16 weight; ModelOpt's FP8 per tensor)
 *   qc_eng_absmax_*    max |x| of a row, on the bits (NaN when one is there)
 *   qc_eng_group_absmax_rows  the same of each group of a row
 *   qc_eng_fp8_row     qc_eng_fp8 over a row, by a table of the encode of
 *                      every BF16 value (qc_eng_fp8_table, qc_eng_fp8_index)
 *   qc_eng_e2m1(v)     compressed-tensors' cast_to_fp4 of v as a 4-bit code
 *                      (compressed_tensors.e2m1_codes, its thresholds _E2M1_UP)
 *   qc_eng_fp4_rows    qc_eng_e2m1 codes of x / d (d per group), packed
 *   qc_eng_nvfp4_scale NVFP4's e4m3 scale code and divisor of a group's amax
 *                      (compressed-tensors' and ModelOpt's recipes)
 *   qc_eng_group_minmax_rows  min and max of each group (NaN when one is there)
 *   qc_eng_int_rows    integer group codes clip(rint(r(r(x / s) + z))) (W8A16,
 *                      W4A16_ASYM: compressed_tensors.int_group's last step)
 *
 * Numerical contract of qc_core.h: one rounding per operation, in the order
 * written, no contraction.
 */
#ifndef QC_ENGINES_H
#define QC_ENGINES_H

#include "qc_formats.h"

QC_HD float qc_bf16_value(unsigned short b) { return qc_from_bits((unsigned)b << 16); }
QC_HD float qc_eng_value(unsigned short b) { return qc_bf16_value(b); }
QC_HD float qc_eng_value(float x) { return x; }

QC_HD float qc_round_bf16(float v) {
  unsigned b = qc_bits(v);
  b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  return qc_from_bits(b);
}

QC_HD unsigned char qc_eng_fp8(float x, float s, int round_bf16) {
  float v = x / s;
  if (round_bf16) v = qc_round_bf16(v);
  return (unsigned char)qc_mf_encode(v, QC_FMT_E4M3FN, QC_F8_SATFINITE);
}

#if !defined(__CUDACC__) && (defined(_OPENMP) || defined(QC_HAVE_OMP_SIMD))
#define QC_ENG_SIMD _Pragma("omp simd")
#define QC_ENG_SIMD_MAX _Pragma("omp simd reduction(max : m)")
#define QC_ENG_SIMD_MINMAX \
  _Pragma("omp simd reduction(min : mn) reduction(max : mx) reduction(| : nan)")
#else
#define QC_ENG_SIMD
#define QC_ENG_SIMD_MAX
#define QC_ENG_SIMD_MINMAX
#endif

/* compressed-tensors' cast_to_fp4 of v (compressed_tensors.e2m1_codes): the
 * magnitude code counts the thresholds of _E2M1_UP that |v| passes (> 0.25,
 * >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5), i.e. |v| rounded to nearest
 * even on e2m1's grid 0, 0.5, 1, 1.5, 2, 3, 4, 6 (every tie goes to the even
 * code), saturating at 6; on the bits A of a = |v|:
 *   a < 1   rint(2a), the grid's step 0.5 there: bits(a + 2^22) - bits(2^22)
 *           (the float addition rounds to a multiple of 2^22's ulp, 0.5);
 *   a >= 1  a rounded to nearest even to one mantissa bit, as its exponent
 *           and that bit: (A + 0x1FFFFF + bit 22 of A) >> 22, less 252 (the
 *           code of 1.0, bits >> 22 = 254, is 2);
 * then min(code, 7) (inf: 7), the sign in bit 3 when v < 0 (-0 and NaN:
 * 0).  Checked against e2m1_codes on every BF16 value and a float32 ulp
 * either side of every threshold and grid value (test_engines_fast).
 * Signed 32-bit integer steps and one float addition: they vectorise on
 * every x86-64 level (a chain of 7 compares does not, well). */
QC_HD unsigned qc_eng_e2m1(float v) {
  const int b = (int)qc_bits(v), ab = b & 0x7FFFFFFF;
  const int below1 = (int)qc_bits(qc_from_bits((unsigned)ab) + 4194304.0f) - 0x4A800000;
  const int from1 = ((ab + 0x1FFFFF + ((ab >> 22) & 1)) >> 22) - 252;
  int c = ab < 0x3F800000 ? below1 : from1;
  c = c < 7 ? c : 7;
  c |= b < 0 && ab != 0 ? 8 : 0;
  return ab > 0x7F800000 ? 0u : (unsigned)c;
}

/* The BF16 bits whose table entry is qc_eng_fp8(x, s, r) (qc_eng_index of
 * v = x / s; the same index would serve any code whose rule rounds to
 * nearest on a grid of at most 6 significant bits):
 *   r  the bits of qc_round_bf16(v): the entry is the code of that value;
 *   !r v rounded to odd to BF16 (truncated, the last bit set when a dropped
 *      bit is set): BF16's 8 significant bits are at least e4m3's 4 + 2, so
 *      rounding that to nearest even on e4m3's grid (normal or subnormal)
 *      gives v rounded to it (round-to-odd, Boldo & Melquiond 2008); the
 *      saturation sees the same side of 448 (exact in BF16). */
QC_HD unsigned qc_eng_index(float v, int r) {
  const unsigned b = qc_bits(v);
  return r ? (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16
           : (b >> 16) | (unsigned)((b & 0xFFFFu) != 0u);
}

/* The integer code of x in a group with scale s and zero point z (an
 * integer, 0 when symmetric): v = x / s, rounded to BF16 when R; v + z,
 * rounded to BF16 when R; then rint (nearest even) and clipped to [qmin,
 * qmax] (inf: an end).  compressed_tensors.int_group's numpy steps, one
 * rounding each. */
template <int R> QC_HD signed char qc_eng_int_code(float x, float s, float z, float qmin,
                                                  float qmax) {
  float v = x / s;
  if (R) v = qc_round_bf16(v);
  v = v + z;
  if (R) v = qc_round_bf16(v);
  v = qc_rint(v);
  v = v < qmin ? qmin : v;
  v = v > qmax ? qmax : v;
  return (signed char)v;
}

/* NVFP4's scale of a group from its absmax and the fused set's global scale
 * g, by recipe K:
 *   K = 0, 1  compressed-tensors' NVFP4A16 (compressed_tensors.nvfp4, its
 *             module docstring): s = amax / 6, rounded to BF16 when K = 1;
 *             the e4m3fn code c = e4m3(g * s) (the code of 0.125 where that
 *             is 0: g * s >= 0); the divisor decode(c) / g;
 *   K = 2     ModelOpt's W4A16_NVFP4 (modelopt.nvfp4): s = amax / f32(6 g)
 *             (1 where 0), clipped to [2^-9, 448]; c = e4m3(s); the divisor
 *             decode(c) * g (g: weight_scale_2);
 * e4m3 satfinite, nearest even (qc_mf_encode).  Returns the divisor of the
 * group's values, the code in *code. */
template <int K> QC_HD float qc_eng_nvfp4_scale(float amax, float g, unsigned char *code) {
  float s = K == 2 ? amax / (6.0f * g) : amax / 6.0f;
  if (K == 1) s = qc_round_bf16(s);
  if (K == 2) {
    s = s == 0.0f ? 1.0f : s;
    s = s < 0.001953125f ? 0.001953125f : s > 448.0f ? 448.0f : s;
  } else {
    s = g * s;
  }
  unsigned c = qc_mf_encode(s, QC_FMT_E4M3FN, QC_F8_SATFINITE);
  if (K != 2 && c == 0u) c = qc_mf_encode(0.125f, QC_FMT_E4M3FN, QC_F8_SATFINITE);
  *code = (unsigned char)c;
  const float d = qc_mf_decode(c, QC_FMT_E4M3FN);
  return K == 2 ? d * g : d / g;
}

/* min and max of the g values of a group (both NaN when one is NaN; +-inf
 * as they are).  Of +0 and -0 either may be kept: the GPU scans in order,
 * the CPU in SIMD lanes (6x faster than a scan that keeps the first); the
 * writers' scales and zero points do not depend on a zero's sign
 * (compressed_tensors.int_group: max(hi, 0) - min(lo, 0), qmin - lo / s). */
template <class X> QC_HD void qc_eng_group_minmax(const X *x, qc_i64 g, float *lo, float *hi) {
  float mn = qc_eng_value(x[0]), mx = mn;
  int nan = 0;
  QC_ENG_SIMD_MINMAX for (qc_i64 j = 0; j < g; j++) {
    const float v = qc_eng_value(x[j]);
    nan |= v != v;
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  *lo = nan ? qc_from_bits(0x7FC00000u) : mn;
  *hi = nan ? qc_from_bits(0x7FC00000u) : mx;
}

#ifndef __CUDACC__
#include <type_traits>

/* max |x| of n values as the largest of their bits with the sign cleared
 * (non-negative floats order as their bits); a NaN's bits exceed inf's:
 * NaN when one is there (else inf when one is there).  BF16: uint16 bits;
 * float32: uint32 bits. */
static inline float qc_eng_absmax_bf16(const uint16_t *x, int64_t n) {
  unsigned m = 0;
  QC_ENG_SIMD_MAX for (int64_t j = 0; j < n; j++) {
    const unsigned a = x[j] & 0x7FFFu;
    m = a > m ? a : m;
  }
  return qc_bf16_value((uint16_t)(m > 0x7F80u ? 0x7FC0u : m));
}

static inline float qc_eng_absmax_f32(const uint32_t *x, int64_t n) {
  unsigned m = 0;
  QC_ENG_SIMD_MAX for (int64_t j = 0; j < n; j++) {
    const unsigned a = x[j] & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return qc_from_bits(m > 0x7F800000u ? 0x7FC00000u : m);
}

/* max |x| of each group of 2^gshift values of a row of n (qc_eng_absmax_*
 * of each group), on the bits B (uint16_t: BF16, uint32_t: float32): with
 * L lanes, L running maxima over the group's values j mod L, then the
 * largest of them (a loop over one short group would be shorter than a
 * wide vector and not vectorise; 8 lanes do at every level); L = 1: a
 * plain scan (groups of 2 or 4). */
template <int L, class B> static inline void qc_eng_group_absmax_row(const B *x, int64_t n,
                                                                     int gshift, float *out) {
  const B mask = sizeof(B) == 2 ? (B)0x7FFFu : (B)0x7FFFFFFFu;
  const int64_t g = (int64_t)1 << gshift;
  for (int64_t k = 0; k < n >> gshift; k++) {
    const B *xk = x + (k << gshift);
    B lane[L] = {0};
    for (int64_t c = 0; c < g; c += L)
      for (int l = 0; l < L; l++) {
        const B a = (B)(xk[c + l] & mask);
        lane[l] = a > lane[l] ? a : lane[l];
      }
    B m = 0;
    for (int l = 0; l < L; l++) m = lane[l] > m ? lane[l] : m;
    out[k] = sizeof(B) == 2 ? qc_bf16_value((uint16_t)(m > 0x7F80u ? 0x7FC0u : m))
                            : qc_from_bits(m > 0x7F800000u ? 0x7FC00000u : (unsigned)m);
  }
}

template <class B> static inline void qc_eng_group_absmax_row_b(const B *x, int64_t n, int gshift,
                                                                float *out) {
  if (gshift >= 3) qc_eng_group_absmax_row<8>(x, n, gshift, out);
  else qc_eng_group_absmax_row<1>(x, n, gshift, out);
}

static inline void qc_eng_group_absmax_rows(const void *x, int bf16, int64_t n, int gshift,
                                            float *out) {
  if (bf16) qc_eng_group_absmax_row_b((const uint16_t *)x, n, gshift, out);
  else qc_eng_group_absmax_row_b((const uint32_t *)x, n, gshift, out);
}

/* qc_eng_nvfp4_scale<recipe> of n group maxima */
static inline void qc_eng_nvfp4_scales(const float *amax, int64_t n, float g, int recipe,
                                       uint8_t *codes, float *divisors) {
  if (recipe == 2)
    for (int64_t k = 0; k < n; k++) divisors[k] = qc_eng_nvfp4_scale<2>(amax[k], g, codes + k);
  else if (recipe == 1)
    for (int64_t k = 0; k < n; k++) divisors[k] = qc_eng_nvfp4_scale<1>(amax[k], g, codes + k);
  else
    for (int64_t k = 0; k < n; k++) divisors[k] = qc_eng_nvfp4_scale<0>(amax[k], g, codes + k);
}

/* The e4m3fn code (satfinite) of every BF16 value: t[b] = qc_mf_encode of
 * qc_bf16_value(b), the table of the one encode rule. */
static inline void qc_eng_fp8_table(uint8_t *t) {
  for (unsigned b = 0; b < 65536u; b++)
    t[b] = (uint8_t)qc_mf_encode(qc_bf16_value((uint16_t)b), QC_FMT_E4M3FN, QC_F8_SATFINITE);
}

static inline unsigned qc_eng_fp8_index(float x, float s, int r) { return qc_eng_index(x / s, r); }

/* qc_eng_fp8 over a row by the table, BF16 bits or float32 values */
/* (in pieces of 256: the indices in a vectorised loop, then the lookups) */
template <int R, class X> static inline void qc_eng_fp8_row_x(const uint8_t *t, const X *x,
                                                              uint8_t *q, int64_t n, float s) {
  uint16_t idx[256];
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    const int64_t m = n - j0 < 256 ? n - j0 : 256;
    QC_ENG_SIMD for (int64_t j = 0; j < m; j++)
      idx[j] = (uint16_t)qc_eng_fp8_index(qc_eng_value(x[j0 + j]), s, R);
    for (int64_t j = 0; j < m; j++) q[j0 + j] = t[idx[j]];
  }
}

/* f(std::integral_constant<int, R>, const X *x) for a row stored as BF16
 * bits (X = uint16_t) or float32 values, with the rounding flag r as R:
 * the four instances of a row loop, chosen once */
template <class F> static inline void qc_eng_by_input(const void *x, int bf16, int r, F f) {
  using R0 = std::integral_constant<int, 0>;
  using R1 = std::integral_constant<int, 1>;
  if (bf16) {
    if (r) f(R1(), (const uint16_t *)x);
    else f(R0(), (const uint16_t *)x);
  } else {
    if (r) f(R1(), (const float *)x);
    else f(R0(), (const float *)x);
  }
}

/* m (even) 4-bit codes c[j] ^ flip (codes in 0..15 after the xor) packed two
 * a byte, element 2i in the low nibble: a pair is a little-endian 16-bit
 * word, both nibbles at once (vectorised) */
static inline void qc_eng_pack4(const uint8_t *c, uint8_t *q, int64_t m, unsigned flip) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (int64_t j = 0; j + 1 < m; j += 2)
    q[j >> 1] = (uint8_t)(((c[j] ^ flip) & 15u) | (((c[j + 1] ^ flip) & 15u) << 4));
#else
  const uint16_t flip2 = (uint16_t)(flip | (flip << 8));
  QC_ENG_SIMD for (int64_t j = 0; j < m / 2; j++) {
    uint16_t w;
    memcpy(&w, c + 2 * j, 2);
    w = (uint16_t)((w ^ flip2) & 0x0F0Fu);
    q[j] = (uint8_t)(w | (w >> 4));
  }
#endif
}

/* the quotients v[j] = x[j] / d[j >> gshift] of m values of a row (rounded to
 * BF16 when R), through dv, the divisor of each value: every loop runs over
 * the m values (a loop over one group's 2^gshift values of the narrow type is
 * shorter than a wide vector and would not vectorise) */
template <int R, class X> static inline void qc_eng_quotients(const X *x, const float *d,
                                                              int gshift, int64_t m,
                                                              float *dv, float *v) {
  const int64_t g = (int64_t)1 << gshift;
  for (int64_t k0 = 0; k0 < m; k0 += g) {
    const float dk = d[k0 >> gshift];
    const int64_t e = k0 + g < m ? k0 + g : m;
    QC_ENG_SIMD for (int64_t j = k0; j < e; j++) dv[j] = dk;
  }
  QC_ENG_SIMD for (int64_t j = 0; j < m; j++) {
    const float q = qc_eng_value(x[j]) / dv[j];
    v[j] = R ? qc_round_bf16(q) : q;
  }
}

/* qc_eng_e2m1 codes of x / d (rounded to BF16 when R) of a row in groups of
 * 2^gshift values sharing the divisor d[group], packed two a byte
 * (qc_eng_pack4); n even.  In pieces of 256 values (a multiple of the
 * group, or less), each loop vectorised. */
template <int R, class X> static inline void qc_eng_fp4_row(const X *x, uint8_t *q, int64_t n,
                                                            const float *d, int gshift) {
  float dv[256], v[256];
  uint8_t c[256];
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    const int64_t m = n - j0 < 256 ? n - j0 : 256;
    qc_eng_quotients<R>(x + j0, d + (j0 >> gshift), gshift, m, dv, v);
    QC_ENG_SIMD for (int64_t j = 0; j < m; j++) c[j] = (uint8_t)qc_eng_e2m1(v[j]);
    qc_eng_pack4(c, q + (j0 >> 1), m, 0u);
  }
}

static inline void qc_eng_fp4_rows(const void *x, int bf16, uint8_t *q, int64_t n,
                                   const float *d, int gshift, int r) {
  qc_eng_by_input(x, bf16, r, [&](auto R, const auto *xp) {
    qc_eng_fp4_row<decltype(R)::value>(xp, q, n, d, gshift);
  });
}

/* qc_eng_group_minmax of each group of 2^gshift values of a row */
static inline void qc_eng_group_minmax_rows(const void *x, int bf16, int64_t n, int gshift,
                                            float *lo, float *hi) {
  const int64_t g = (int64_t)1 << gshift;
  for (int64_t k = 0; k < n >> gshift; k++) {
    if (bf16) qc_eng_group_minmax((const uint16_t *)x + k * g, g, lo + k, hi + k);
    else qc_eng_group_minmax((const float *)x + k * g, g, lo + k, hi + k);
  }
}

/* a row's codes: P = 0, int8 codes; P = 4 / 8, the codes + 2^(P-1) as
 * compressed-tensors packs them (pack_to_int32's bit stream: 4 bits, two a
 * byte, element 2i in the low nibble; 8 bits, one a byte); in pieces of at
 * most 256 values of one group (the codes in a vectorised loop, then the
 * packing) */
template <int R, int P, class X> static inline void qc_eng_int_row(const X *x, uint8_t *q,
                                                                  int64_t n, const float *s,
                                                                  const float *z, int gshift,
                                                                  float qmin, float qmax) {
  const int64_t g = (int64_t)1 << gshift;
  int8_t c[256];
  float sv[256], zv[256];
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    const int64_t m = n - j0 < 256 ? n - j0 : 256;
    if (g >= 64) {
      for (int64_t k0 = 0; k0 < m; k0 += g) { /* (256: a multiple of the group, or less) */
        const float sk = s[(j0 + k0) >> gshift], zk = z[(j0 + k0) >> gshift];
        const int64_t e = k0 + g < m ? k0 + g : m;
        QC_ENG_SIMD for (int64_t j = k0; j < e; j++)
          c[j] = qc_eng_int_code<R>(qc_eng_value(x[j0 + j]), sk, zk, qmin, qmax);
      }
    } else { /* a group shorter than a vector (of int8 codes at AVX-512): the
              * group's scale and zero spread over the piece, one loop */
      for (int64_t k0 = 0; k0 < m; k0 += g) {
        const float sk = s[(j0 + k0) >> gshift], zk = z[(j0 + k0) >> gshift];
        const int64_t e = k0 + g < m ? k0 + g : m;
        for (int64_t j = k0; j < e; j++) {
          sv[j] = sk;
          zv[j] = zk;
        }
      }
      QC_ENG_SIMD for (int64_t j = 0; j < m; j++)
        c[j] = qc_eng_int_code<R>(qc_eng_value(x[j0 + j]), sv[j], zv[j], qmin, qmax);
    }
    if (P == 4) { /* (c + 8) & 15 = (c & 15) ^ 8 for codes in [-8, 7] */
      qc_eng_pack4((const uint8_t *)c, q + (j0 >> 1), m, 8u);
    } else {
      for (int64_t j = 0; j < m; j++) q[j0 + j] = (uint8_t)(P == 8 ? c[j] + 128 : c[j]);
    }
  }
}

template <int P> static inline void qc_eng_int_rows_p(const void *x, int bf16, uint8_t *q,
                                                      int64_t n, const float *s, const float *z,
                                                      int gshift, float qmin, float qmax, int r) {
  qc_eng_by_input(x, bf16, r, [&](auto R, const auto *xp) {
    qc_eng_int_row<decltype(R)::value, P>(xp, q, n, s, z, gshift, qmin, qmax);
  });
}

static inline void qc_eng_int_rows(const void *x, int bf16, uint8_t *q, int64_t n,
                                   const float *s, const float *z, int gshift, float qmin,
                                   float qmax, int r, int pack) {
  if (pack == 4) qc_eng_int_rows_p<4>(x, bf16, q, n, s, z, gshift, qmin, qmax, r);
  else if (pack == 8) qc_eng_int_rows_p<8>(x, bf16, q, n, s, z, gshift, qmin, qmax, r);
  else qc_eng_int_rows_p<0>(x, bf16, q, n, s, z, gshift, qmin, qmax, r);
}

static inline void qc_eng_fp8_row(const uint8_t *t, const void *x, int bf16, uint8_t *q,
                                  int64_t n, float s, int r) {
  qc_eng_by_input(x, bf16, r, [&](auto R, const auto *xp) {
    qc_eng_fp8_row_x<decltype(R)::value>(t, xp, q, n, s);
  });
}
#endif

#endif /* QC_ENGINES_H */
