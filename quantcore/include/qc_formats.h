/*
 * qc_formats.h -- the low-precision formats of the project's formats specification, each
 * rule once, for the CPU extension and the CUDA sources:
 *
 *   qc_mf_encode / qc_mf_decode   float -> minifloat code and back, generic
 *                  over the format (exponent bits, mantissa bits, bias,
 *                  Inf / NaN encoding), the overflow policy and the NaN
 *                  encoding (§1): FP8 e4m3fn, e5m2, e4m3fnuz, e5m2fnuz and
 *                  the FP6 / FP4 element types of MX
 *   qc_fp8_fake    the scaled FP8 fake quant of modelopt / torchao and the
 *                  ONNX FP8 QDQ pair (§2, §3)
 *   qc_int_code / qc_int_value   ONNX QuantizeLinear / DequantizeLinear
 *                  with integer outputs (§6.2)
 *
 * The group recipes of the LLM weight formats (QcGroup*) are in qc_groups.h,
 * which includes this header (not the other way round).
 *
 * Codes are the raw bits of the value as an unsigned integer (minifloats:
 * the low 1 + ebits + mbits bits; integers: two's complement in the code
 * width).  Numerical contract of qc_core.h: one rounding per operation, in
 * the order written, no contraction.
 */
#ifndef QC_FORMATS_H
#define QC_FORMATS_H

#include "qc_elementwise.h"

/* ------------------------------------------------------------------------
 * Minifloat formats
 * ---------------------------------------------------------------------- */
/* Inf / NaN encoding of a format */
#define QC_MF_IEEE 0   /* top exponent reserved: Inf (mantissa 0), NaN (e5m2)       */
#define QC_MF_FN 1     /* no Inf; NaN = every exponent and mantissa bit set (e4m3fn) */
#define QC_MF_FNUZ 2   /* no Inf, no -0; NaN = the sign-only code (AMD's fnuz types) */
#define QC_MF_FINITE 3 /* every code finite (the FP6 / FP4 elements of MX)          */

/* Format ids: the low bits of a family's mode word (QC_FMT_MASK). */
#define QC_FMT_E4M3FN 0
#define QC_FMT_E5M2 1
#define QC_FMT_E4M3FNUZ 2
#define QC_FMT_E5M2FNUZ 3
#define QC_FMT_E2M3FN 4 /* FP6 */
#define QC_FMT_E3M2FN 5 /* FP6 */
#define QC_FMT_E2M1FN 6 /* FP4 */
#define QC_FMT_COUNT 7
#define QC_FMT_MASK 15

/* Overflow policy of the cast (§1.2): what a finite value beyond the largest
 * finite code, or +-Inf, becomes.
 *   SATFINITE  +-max (ONNX saturate=1, CUDA __NV_SATFINITE)
 *   NONSAT     IEEE: +-Inf; FN: NaN with the sign; FNUZ: NaN (ml_dtypes,
 *              ONNX saturate=0, CUDA __NV_NOSAT)
 *   TORCH      FN: +-max; IEEE: +-Inf; FNUZ: NaN (torch 2.13 CPU)
 * Formats without Inf and NaN (QC_MF_FINITE) saturate under every policy. */
#define QC_F8_SATFINITE 0
#define QC_F8_NONSAT 16
#define QC_F8_TORCH 32
#define QC_F8_POLICY_MASK 48
/* NaN of an IEEE format: mantissa MSB only (0x7E|s for e5m2, ml_dtypes /
 * ONNX) instead of every mantissa bit (0x7F|s, torch); of a FINITE format
 * (no NaN code, ONNX FLOAT4E2M1): the zero of the opposite sign, as ml_dtypes'
 * cast gives it, instead of the signed zero */
#define QC_F8_NAN_MLDTYPES 64

struct QcMinifloat {
  int ebits, mbits, bias, kind;
};

/* The format of id `fmt` (QC_FMT_*).  A constant id folds to constants. */
QC_HD QcMinifloat qc_minifloat(int fmt) {
  QcMinifloat f;
  switch (fmt) {
  case QC_FMT_E5M2: f.ebits = 5; f.mbits = 2; f.bias = 15; f.kind = QC_MF_IEEE; break;
  case QC_FMT_E4M3FNUZ: f.ebits = 4; f.mbits = 3; f.bias = 8; f.kind = QC_MF_FNUZ; break;
  case QC_FMT_E5M2FNUZ: f.ebits = 5; f.mbits = 2; f.bias = 16; f.kind = QC_MF_FNUZ; break;
  case QC_FMT_E2M3FN: f.ebits = 2; f.mbits = 3; f.bias = 1; f.kind = QC_MF_FINITE; break;
  case QC_FMT_E3M2FN: f.ebits = 3; f.mbits = 2; f.bias = 3; f.kind = QC_MF_FINITE; break;
  case QC_FMT_E2M1FN: f.ebits = 2; f.mbits = 1; f.bias = 1; f.kind = QC_MF_FINITE; break;
  default: f.ebits = 4; f.mbits = 3; f.bias = 7; f.kind = QC_MF_FN; break;
  }
  return f;
}

/* The magnitude code of the largest finite value. */
QC_HD int qc_mf_max_code(QcMinifloat f) {
  const int all = (1 << (f.ebits + f.mbits)) - 1;
  if (f.kind == QC_MF_IEEE) return (((1 << f.ebits) - 1) << f.mbits) - 1;
  if (f.kind == QC_MF_FN) return all - 1;
  return all;
}

/* The float value of a power of two 2**e (|e| < 127), exact. */
QC_HD float qc_pow2f(int e) { return qc_from_bits((unsigned)(e + 127) << 23); }

/* The IEEE layout of the source type T of a cast. */
template <typename T> struct QcIeee;
template <> struct QcIeee<float> {
  typedef unsigned U;
  typedef int I; /* signed compares of sign-cleared bits (AVX2 has no unsigned ones) */
  enum { MBITS = 23, BIAS = 127, WIDTH = 32 };
};
template <> struct QcIeee<double> {
  typedef qc_u64 U;
  typedef qc_i64 I;
  enum { MBITS = 52, BIAS = 1023, WIDTH = 64 };
};

/* The rounding of a T value to the grid of format f, shared by the encode
 * and the fake cast (one rule, two outputs):
 *   normal range  the magnitude bits a with S = MBITS_T - mbits mantissa
 *                 bits dropped, ties to even (a carry renormalises): the T
 *                 bits of the rounded magnitude (low S bits zero)
 *   below the min normal   the number of min-subnormal steps,
 *                 rint(|x| * 2**(bias - 1 + mbits)) (the product is exact;
 *                 the tie with the min normal goes to it) */
template <typename T>
QC_HD typename QcIeee<T>::U qc_mf_round_normal(typename QcIeee<T>::U a, int S) {
  typedef typename QcIeee<T>::U U;
  return ((a + (((U)1 << (S - 1)) - 1) + ((a >> S) & 1)) >> S) << S;
}
template <typename T> QC_HD T qc_mf_sub_scale(QcMinifloat f) {
  return (T)qc_pow2f(f.bias - 1 + f.mbits);
}

/* The codes of NaN and of an overflow (a finite value beyond the largest
 * finite code, or +-Inf) for sign bit `sign` (already shifted to bit
 * ebits + mbits), by the policy and NaN encoding of `mode`. */
QC_HD void qc_mf_specials(QcMinifloat f, int mode, int sign, int *nan_code, int *over_code) {
  const int sbit = f.ebits + f.mbits;
  const int maxc = qc_mf_max_code(f);
  const int all = (1 << sbit) - 1;
  const int inf_code = ((1 << f.ebits) - 1) << f.mbits;
  const int policy = mode & QC_F8_POLICY_MASK;
  if (f.kind == QC_MF_FN) {
    *nan_code = sign | all;
    *over_code = sign | (policy == QC_F8_NONSAT ? all : maxc);
  } else if (f.kind == QC_MF_IEEE) {
    *nan_code = sign | inf_code |
                ((mode & QC_F8_NAN_MLDTYPES) ? 1 << (f.mbits - 1) : (1 << f.mbits) - 1);
    *over_code = sign | (policy == QC_F8_SATFINITE ? maxc : inf_code);
  } else if (f.kind == QC_MF_FNUZ) {
    *nan_code = 1 << sbit;
    *over_code = policy == QC_F8_SATFINITE ? (sign | maxc) : *nan_code;
  } else { /* FINITE: no NaN code; ml_dtypes' cast gives the zero of the other sign */
    *nan_code = (mode & QC_F8_NAN_MLDTYPES) ? (sign ^ (1 << sbit)) : sign;
    *over_code = sign | maxc;
  }
}

/* Encode x into the minifloat format `fmt` with round-half-to-even at the
 * format's precision (spec §1.2), the overflow policy and NaN encoding of
 * `mode` (QC_F8_*):
 *   normal range  qc_mf_round_normal, rebiased to the format's exponent
 *   below the min normal   the step count of qc_mf_sub_scale (subnormal T
 *                 inputs round to (signed) zero)
 *   beyond the max finite code, or +-Inf   the policy (qc_mf_specials)
 *   NaN           FN: 0x7F|s; IEEE: exponent ones + mantissa ones (or its
 *                 MSB with QC_F8_NAN_MLDTYPES) | s; FNUZ: 0x80; FINITE: s
 *                 (with QC_F8_NAN_MLDTYPES the opposite sign, as ml_dtypes)
 *   the sign      bit (ebits + mbits); FNUZ has no -0: a zero result is 0
 * Branch-free (selects), so a loop over it vectorises. */
template <typename T> QC_HD unsigned qc_mf_encode(T x, int fmt, int mode) {
  typedef typename QcIeee<T>::U U;
  const QcMinifloat f = qc_minifloat(fmt);
  const int S = (int)QcIeee<T>::MBITS - f.mbits;
  const int sbit = f.ebits + f.mbits;
  typedef typename QcIeee<T>::I I;
  const U u = qc_bits(x);
  const I a = (I)(u & ~((U)1 << (QcIeee<T>::WIDTH - 1))); /* |x| bits, >= 0 */
  const I inf_bits = (I)(((U)((QcIeee<T>::BIAS << 1) | 1)) << QcIeee<T>::MBITS);
  const I min_normal = (I)((U)(QcIeee<T>::BIAS - f.bias + 1) << QcIeee<T>::MBITS);
  const int sign = (int)(u >> (QcIeee<T>::WIDTH - 1)) << sbit;
  /* normal range: the rounded magnitude's exponent and mantissa, rebiased
   * (a NaN's bits clamped to Inf + 1 first, so the rounding cannot carry
   * into the sign bit; the result is small: an int) */
  const I a_c = a < inf_bits + 1 ? a : inf_bits + 1;
  const int code_n = (int)(qc_mf_round_normal<T>((U)a_c, S) >> S) -
                     ((QcIeee<T>::BIAS - f.bias) << f.mbits);
  /* below the min normal: the number of min-subnormal steps */
  const int is_sub = a < min_normal;
  const T ax = qc_from_bits(is_sub ? (U)a : (U)0); /* |x| below the min normal */
  const int code_s = (int)qc_rint(ax * qc_mf_sub_scale<T>(f));
  const int mag = is_sub ? code_s : code_n;
  int nan_code, over_code;
  qc_mf_specials(f, mode, sign, &nan_code, &over_code);
  const int fin_code = (f.kind == QC_MF_FNUZ && mag == 0) ? 0 : (sign | mag);
  const int code = mag > qc_mf_max_code(f) ? over_code : fin_code; /* +-Inf: mag > maxc */
  return (unsigned)(a > inf_bits ? nan_code : code);
}

/* The float32 value of code `code` of format `fmt` (exact for every non-NaN
 * code); NaN codes give 0x7FC00000 with the code's sign bit. */
QC_HD float qc_mf_decode(unsigned code, int fmt) {
  const QcMinifloat f = qc_minifloat(fmt);
  const int sbit = f.ebits + f.mbits;
  const unsigned s = (code >> sbit) & 1u;
  const unsigned mag = code & ((1u << sbit) - 1u);
  const int e = (int)(mag >> f.mbits);
  const unsigned m = mag & ((1u << f.mbits) - 1u);
  /* Inf / NaN as all-ones / all-zeros masks (integer arithmetic, not
   * boolean selects: GCC vectorises the loops around it) */
  const unsigned inf_code = ((1u << f.ebits) - 1u) << f.mbits;
  unsigned nan_m = 0u, inf_m = 0u;
  if (f.kind == QC_MF_FN) nan_m = 0u - (unsigned)(mag == (1u << sbit) - 1u);
  else if (f.kind == QC_MF_IEEE) {
    nan_m = 0u - (unsigned)(mag > inf_code);
    inf_m = 0u - (unsigned)(mag == inf_code);
  } else if (f.kind == QC_MF_FNUZ)
    nan_m = 0u - (unsigned)((code & ((2u << sbit) - 1u)) == (1u << sbit));
  /* e == 0: m * 2**(1 - bias - mbits), exact; else the float32 bits */
  const unsigned normal = ((unsigned)(e - f.bias + 127) << 23) | (m << (23 - f.mbits));
  const float sub = (float)m * qc_pow2f(1 - f.bias - f.mbits);
  const unsigned sub_m = 0u - (unsigned)(e == 0);
  unsigned b = (qc_bits(sub) & sub_m) | (normal & ~sub_m);
  b = (b & ~inf_m) | (0x7f800000u & inf_m);
  b = (b & ~nan_m) | (0x7fc00000u & nan_m);
  return qc_from_bits(b | (s << 31));
}

/* The largest finite value of format `fmt`. */
QC_HD float qc_mf_max(int fmt) { return qc_mf_decode((unsigned)qc_mf_max_code(qc_minifloat(fmt)), fmt); }

/* qc_mf_decode(qc_mf_encode(x, fmt, mode), fmt) in T, computed in the value
 * domain by the same rounding (qc_mf_round_normal, qc_mf_sub_scale: by one
 * addition, below) and the decoded special codes (qc_mf_specials): no
 * rebias and no decode per element.  tests/test_formats.py checks it equals the composition. */
template <typename T> QC_HD T qc_mf_fake(T x, int fmt, int mode) {
  typedef typename QcIeee<T>::U U;
  const QcMinifloat f = qc_minifloat(fmt);
  const int S = (int)QcIeee<T>::MBITS - f.mbits;
  typedef typename QcIeee<T>::I I;
  const U sign_bit = (U)1 << (QcIeee<T>::WIDTH - 1);
  const U u = qc_bits(x);
  const I a = (I)(u & ~sign_bit);
  const I inf_bits = (I)(((U)((QcIeee<T>::BIAS << 1) | 1)) << QcIeee<T>::MBITS);
  const I min_normal = (I)((U)(QcIeee<T>::BIAS - f.bias + 1) << QcIeee<T>::MBITS);
  const T fmax = (T)qc_mf_max(fmt);
  /* The rounding of qc_mf_round_normal and qc_mf_sub_scale by one addition
   * in T (ties to even, no rint): with e = max(E(|x|), the min normal's
   * exponent), m = 2**(e + S) has the grid step 2**(e - mbits) as its ulp
   * and |x| < 2**(e + 1) <= m, so |x| + m is m plus |x| rounded to the grid
   * (a carry into the next binade included) and subtracting m is exact.
   * |x| is clamped first to the power of two above fmax (Inf and NaN too),
   * which rounds to itself: every special rounds above fmax. */
  const I exp_mask = inf_bits;
  const I clamp = ((I)qc_bits(fmax) & exp_mask) + ((I)1 << QcIeee<T>::MBITS);
  const I a_c = a < clamp ? a : clamp;
  const I eb = a_c & exp_mask;
  const T m = qc_from_bits((U)((eb > min_normal ? eb : min_normal) + ((I)S << QcIeee<T>::MBITS)));
  const U mag = qc_bits((qc_from_bits((U)a_c) + m) - m);
  /* (single comparisons and selects of values, no boolean arithmetic: GCC
   * vectorises the loops around it) */
  const int special = (I)mag > (I)qc_bits(fmax); /* overflow, +-Inf or NaN */
  int nan_p, over_p, nan_n, over_n;
  qc_mf_specials(f, mode, 0, &nan_p, &over_p);
  qc_mf_specials(f, mode, 1 << (f.ebits + f.mbits), &nan_n, &over_n);
  const int neg = (u & sign_bit) != 0;
  const T s_nan = neg ? (T)qc_mf_decode((unsigned)nan_n, fmt) : (T)qc_mf_decode((unsigned)nan_p, fmt);
  const T s_over = neg ? (T)qc_mf_decode((unsigned)over_n, fmt)
                       : (T)qc_mf_decode((unsigned)over_p, fmt);
  const U signed_mag = mag | (u & sign_bit);
  const U out = (f.kind == QC_MF_FNUZ) ? (mag == 0 ? (U)0 : signed_mag) : signed_mag;
  return special ? (a > inf_bits ? s_nan : s_over) : qc_from_bits(out);
}

/* ------------------------------------------------------------------------
 * Scaled FP8 fake quant and the FP8 QDQ pair (§2, §3).  Mode bits besides
 * the format and QC_F8_* above:
 * ---------------------------------------------------------------------- */
#define QC_F8_SCALE_MUL 128   /* v = x * p0                       */
#define QC_F8_SCALE_DIV 256   /* v = x / p0 (else v = x)          */
#define QC_F8_DEQ_MUL 512     /* y = decode(q) * p1               */
#define QC_F8_DEQ_DIV 1024    /* y = decode(q) / p1 (else decode) */
#define QC_F8_MASK_AMAX 2048  /* mask = -p2 <= x <= p2 (else |v| <= max finite) */
#define QC_F8_PLUS_ZERO 4096  /* v = -0 -> +0 (v + 0.0: onnx.reference adds an FP4 zero
                                 point of 0 before the cast); NaN kept as is */

/* r = x * s or x / s with the NaN the CPU references give it, on every
 * platform: when r is NaN, a NaN scale s (it poisons the whole tensor or
 * channel; torch's x * s with a 0-d scale keeps the scale's NaN when both
 * are NaN), else a NaN x, else the default NaN of an invalid operation
 * (0 * Inf, Inf / Inf, 0 / 0) on x86, which is negative (0xFFC00000); r
 * itself otherwise.  CUDA returns the canonical NaN 0x7FFFFFFF instead, so
 * without this a code that carries the sign of r (FP8) would depend on the
 * device (docs/NONFINITE.md).  Selects and bit patterns only. */
template <typename T> QC_HD T qc_scaled_nan(T x, T s, T r) {
  const T dflt = qc_from_bits(qc_bits(qc_nan(T())) | QcNegZero<T>::bits);
  const T n = (s != s) ? s : ((x != x) ? x : dflt);
  return (r != r) ? n : r;
}

/* The scaled value v of x (QC_F8_SCALE_*), its NaN by qc_scaled_nan; a
 * zero made +0 with QC_F8_PLUS_ZERO. */
template <typename T> QC_HD T qc_f8_scaled(T x, T s, int mode) {
  const T prod = x * s, quot = x / s; /* both, then selects: a loop stays vectorisable */
  const T v = (mode & QC_F8_SCALE_MUL) ? prod : ((mode & QC_F8_SCALE_DIV) ? quot : x);
  const T w = qc_scaled_nan(x, (mode & (QC_F8_SCALE_MUL | QC_F8_SCALE_DIV)) ? s : x, v);
  return ((mode & QC_F8_PLUS_ZERO) && w == (T)0) ? (T)0 : w; /* a select, not an add */
}

/* The dequantised value of a decoded d (QC_F8_DEQ_*): d, d * s or d / s,
 * its NaN by qc_scaled_nan. */
template <typename T> QC_HD T qc_f8_dequant(T d, T s, int mode) {
  const T prod = d * s, quot = d / s;
  const T y = (mode & QC_F8_DEQ_MUL) ? prod : ((mode & QC_F8_DEQ_DIV) ? quot : d);
  return qc_scaled_nan(d, (mode & (QC_F8_DEQ_MUL | QC_F8_DEQ_DIV)) ? s : d, y);
}

/* FP8 fake quantization of one element:
 *   v    = x, x * p0 or x / p0                       (QC_F8_SCALE_*)
 *   q    = qc_mf_encode(v)    (with "satfinite" this is modelopt's and
 *                              torchao's clamp(v, -max, max) then cast)
 *   y    = decode(q), decode(q) * p1 or decode(q) / p1   (QC_F8_DEQ_*;
 *          decode(q) by qc_mf_fake)
 *   mask = -p2 <= x <= p2 (QC_F8_MASK_AMAX, modelopt's |x| <= amax) or
 *          |v| <= max finite;  false for NaN
 * modelopt: p0 = f32(f32(1 / a) * 448), p1 = f32(1 / p0), MUL / MUL;
 * torchao: p0 = its scale, p1 = p0, MUL / DIV; ONNX QDQ: DIV / MUL with
 * p0 = p1 = the scale. */
template <typename T>
QC_HD T qc_fp8_fake(T x, T p0, T p1, T p2, int mode, unsigned char *mask) {
  const int fmt = mode & QC_FMT_MASK;
  const T v = qc_f8_scaled(x, p0, mode);
  const T d = qc_mf_fake(v, fmt, mode);
  const T fmax = (T)qc_mf_max(fmt);
  const int in_amax = (x >= -p2) & (x <= p2), in_range = (v >= -fmax) & (v <= fmax);
  *mask = (unsigned char)((mode & QC_F8_MASK_AMAX) ? in_amax : in_range);
  return qc_f8_dequant(d, p1, mode);
}

/* ------------------------------------------------------------------------
 * Integer codes: ONNX QuantizeLinear / DequantizeLinear (§6.2)
 * ---------------------------------------------------------------------- */
/* the code width (bits of the integer type) in bits 0..4 of the int modes */
#define QC_INT_WIDTH_MASK 31
#define QC_INT_SIGNED 32      /* two's complement codes (decode sign-extends) */
#define QC_INT_WRAP32 64      /* onnx.reference: int32(rint(v)) + zp in int32 */
#define QC_INT_ADD_FLOAT 128  /* decode: y = (q - zp) * s + p2 (tinygemm's float zero point) */

/* x86's float -> int32 conversion: NaN, +-Inf and values outside int32
 * give INT32_MIN (numpy's astype(int32), cvttss2si). */
template <typename T> QC_HD qc_i64 qc_i32_x86(T r) {
  return (r >= (T)-2147483648.0 && r < (T)2147483648.0) ? (qc_i64)r : (qc_i64)(-2147483647 - 1);
}

/* Wrap an integer to int32 (two's complement). */
QC_HD qc_i64 qc_wrap_i32(qc_i64 v) { return (qc_i64)(int)(unsigned int)(unsigned long long)v; }

/* The integer q of ONNX QuantizeLinear for x with (scale, zero point) and the
 * range [qmin, qmax], as an exact value in T:
 *   default (ORT):   q = clamp(rint(x / s) + zp, qmin, qmax), NaN -> qmin
 *   QC_INT_WRAP32:   q = clamp(int32(rint(x / s)) + zp wrapped to int32)
 *                    (onnx.reference: NaN, +Inf and |v| >= 2**31 give INT32_MIN) */
template <typename T> QC_HD T qc_int_quant(T x, T s, T zp, T qmin, T qmax, int mode) {
  if (mode & QC_INT_WRAP32) {
    const qc_i64 z = qc_wrap_i32(qc_i32_x86(qc_rint(x / s)) + (qc_i64)zp);
    return (T)(z < (qc_i64)qmin ? (qc_i64)qmin : (z > (qc_i64)qmax ? (qc_i64)qmax : z));
  }
  unsigned char m; /* (the reciprocal argument is unused with QC_DIVIDE) */
  return qc_fq_affine(x, s, s, zp, qmin, qmax,
                      QC_DIVIDE | QC_OUTPUT_Q | QC_NF_NAN_TO_QMIN, &m);
}

/* The code (two's complement in `width` bits) of an integer value q. */
template <typename T> QC_HD unsigned qc_int_code(T q, int width) {
  return (unsigned)(int)q & ((1u << width) - 1u);
}

/* The integer value of a code of `width` bits (sign-extended when signed). */
QC_HD int qc_int_of_code(unsigned code, int width, int is_signed) {
  const int sh = 32 - width;
  return is_signed ? (int)(code << sh) >> sh : (int)code;
}

/* DequantizeLinear of an integer code: y = (T(q) - zp) * s, plus p2 after
 * with QC_INT_ADD_FLOAT (tinygemm: (q - 8) * s + zero_float). */
template <typename T> QC_HD T qc_int_dequant(unsigned code, T s, T zp, T add, int mode) {
  const T q = (T)qc_int_of_code(code, mode & QC_INT_WIDTH_MASK, mode & QC_INT_SIGNED);
  const T y = (q - zp) * s;
  return (mode & QC_INT_ADD_FLOAT) ? y + add : y;
}

#endif /* QC_FORMATS_H */
