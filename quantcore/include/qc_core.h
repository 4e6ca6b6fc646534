/*
 * qc_core.h -- what every quantcore header needs, on the CPU (C++ compiled
 * into the Cython extension) and on the GPU (CUDA C++, NVRTC or the CUDA
 * emulator of tests/cudaemu):
 *
 *   QC_HD          the qualifiers of a formula callable on both (host: static,
 *                  always inlined, so that a loop over it vectorises; device:
 *                  __host__ __device__ __forceinline__); QC_HDM the same for
 *                  member functions
 *   qc_i64, qc_u64 64-bit integers
 *   qc_floor, qc_rint, qc_round, qc_fma   float / double overloads of the
 *                  libm functions, so that a formula is written once for T
 *   qc_bits        the bit pattern of a float / double (qc_from_bits: back)
 *   qc_inf, qc_nan +inf and the quiet NaN of T
 *   qc_exp2i       2**e in T for an integer e, from its bits (exact)
 *
 * Numerical contract (docs/ARCHITECTURE.md): no -ffast-math; the CPU build
 * uses -ffp-contract=off and the GPU build --fmad=false, so `a * b + c` is
 * never fused into an FMA; an explicit qc_fma is the correctly rounded fma.
 */
#ifndef QC_CORE_H
#define QC_CORE_H

#ifdef __CUDACC__
#define QC_HD __host__ __device__ __forceinline__
#define QC_HDM __host__ __device__ __forceinline__
typedef long long qc_i64;
typedef unsigned long long qc_u64;
#else
#include <math.h>
#include <stdint.h>
#include <string.h>
#define QC_HD static inline __attribute__((always_inline))
#define QC_HDM inline __attribute__((always_inline))
typedef int64_t qc_i64;
typedef uint64_t qc_u64;
#endif

QC_HD float qc_floor(float v) { return floorf(v); }
QC_HD double qc_floor(double v) { return floor(v); }
QC_HD float qc_rint(float v) { return rintf(v); }  /* ties to even (FE_TONEAREST) */
QC_HD double qc_rint(double v) { return rint(v); }
QC_HD float qc_round(float v) { return roundf(v); } /* ties away from zero */
QC_HD double qc_round(double v) { return round(v); }
QC_HD float qc_fma(float a, float b, float c) { return fmaf(a, b, c); }
QC_HD double qc_fma(double a, double b, double c) { return fma(a, b, c); }

/* The bit pattern of a float / double (qc_bits) and the float / double of a
 * bit pattern (qc_from_bits, the inverse): CUDA's intrinsics, or a memcpy
 * of the same size on the host (no aliasing rule broken; compiled to a
 * register move). */
#ifdef __CUDACC__
QC_HD unsigned qc_bits(float v) { return __float_as_uint(v); }
QC_HD qc_u64 qc_bits(double v) { return (qc_u64)__double_as_longlong(v); }
QC_HD float qc_from_bits(unsigned b) { return __uint_as_float(b); }
QC_HD double qc_from_bits(qc_u64 b) { return __longlong_as_double((long long)b); }
#else
template <typename To, typename From> QC_HD To qc_bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From), "qc_bit_cast: the sizes differ");
  To u;
  memcpy(&u, &v, sizeof u);
  return u;
}
QC_HD unsigned qc_bits(float v) { return qc_bit_cast<unsigned>(v); }
QC_HD qc_u64 qc_bits(double v) { return qc_bit_cast<qc_u64>(v); }
QC_HD float qc_from_bits(unsigned b) { return qc_bit_cast<float>(b); }
QC_HD double qc_from_bits(qc_u64 b) { return qc_bit_cast<double>(b); }
#endif

/* +inf and the quiet NaN 0x7fc00000 / 0x7ff8000000000000 of T (by overload:
 * qc_inf(T())), from their bits (NVRTC has no <math.h> macros). */
QC_HD float qc_inf(float) { return qc_from_bits(0x7f800000u); }
QC_HD double qc_inf(double) { return qc_from_bits((qc_u64)0x7ff0000000000000ull); }
QC_HD float qc_nan(float) { return qc_from_bits(0x7fc00000u); }
QC_HD double qc_nan(double) { return qc_from_bits((qc_u64)0x7ff8000000000000ull); }

/* 2**e in T (by overload: qc_exp2i(T(), e)) for any int e, built from its
 * bits: the normal power for e in [-126, 127] / [-1022, 1023], the
 * subnormal one down to 2**-149 / 2**-1074, 0 below (2**-150 is a tie
 * with 0 that rounds to even, as ldexp), +inf above.  Exactly ldexp(1, e),
 * which NVRTC compiles to the approximate ex2.approx.ftz.f32 (SASS
 * MUFU.EX2) for float: no library call, every shift within the width. */
QC_HD float qc_exp2i(float, int e) {
  if (e > 127) return qc_inf(0.0f);
  if (e >= -126) return qc_from_bits((unsigned)(e + 127) << 23);
  if (e >= -149) return qc_from_bits(1u << (e + 149));
  return qc_from_bits(0u);
}
QC_HD double qc_exp2i(double, int e) {
  if (e > 1023) return qc_inf(0.0);
  if (e >= -1022) return qc_from_bits((qc_u64)(e + 1023) << 52);
  if (e >= -1074) return qc_from_bits((qc_u64)1 << (e + 1074));
  return qc_from_bits((qc_u64)0);
}

/* Callbacks for the X(name, Type) lists of qc_families.h and qc_qparams.h
 * (one entry per id, in id order): the name as a string, and the Type's
 * (at float) NP (parameter count), CODE_BYTES (code widths) or NOUT
 * (output count), for the tables the extension and kernels.py read. */
#define QC_X_NAME(name, Type) #name,
#define QC_X_NP(name, Type) (int)Type<float>::NP,
#define QC_X_CODE_BYTES(name, Type) (int)Type<float>::CODE_BYTES,
#define QC_X_NOUT(name, Type) (int)Type<float>::NOUT,

/* The bit pattern of -0.0 in T's width. */
template <typename T> struct QcNegZero;
template <> struct QcNegZero<float> { static const unsigned bits = 0x80000000u; };
template <> struct QcNegZero<double> { static const qc_u64 bits = 0x8000000000000000ull; };

#endif /* QC_CORE_H */
