/*
 * qc_kernels.h -- the CPU extension's entry points into the loops of
 * qc_cpu_loops.h, each declared once, for float and double, and chosen at
 * run time between two builds of the same source:
 *
 *   qc_base   the loops compiled with the extension's flags (x86-64-v2:
 *             SSE4.1 roundps), always present (quantcore/_cpu/qc_loops_base.cpp);
 *   qc_v3     the same loops compiled for AVX2 + FMA (quantcore/_cpu/
 *             qc_loops_v3.cpp, only on x86-64 with GCC / Clang: QC_HAVE_V3),
 *             used when the CPU has them.
 *
 * Both are the same formulas with the same flags (-ffp-contract=off: no
 * contraction; an explicit qc_fma is the correctly rounded fma either way),
 * so they give the same bits; tests/test_simd.py checks it on every family.
 * qc::select_simd() is called once when the extension is imported (the
 * QUANTCORE_SIMD=baseline environment variable keeps the baseline).
 *
 * The extension calls qc::<entry>(...) (quantcore/_cpu/qc_kernels.pxd): a
 * template over the compute type, deduced from the arguments.
 */
#ifndef QC_KERNELS_H
#define QC_KERNELS_H

#include "qc_core.h"

/* X(name, parameters, arguments) for every entry point, with T the compute
 * type (float or double). */
#define QC_CPU_ENTRIES(X)                                                                      \
  X(ew_block,                                                                                  \
    (int family, const T *x, T *y, unsigned char *mask, qc_i64 n, const T *params, qc_i64 C,  \
     qc_i64 c, T u0, T u1, int mode),                                                          \
    (family, x, y, mask, n, params, C, c, u0, u1, mode))                                       \
  X(ew_rowvec,                                                                                 \
    (int family, const T *x, T *y, unsigned char *mask, qc_i64 rows, qc_i64 C,                 \
     const T *params, T u0, T u1, int mode),                                                   \
    (family, x, y, mask, rows, C, params, u0, u1, mode))                                       \
  X(affine_exact_range,                                                                        \
    (const T *x, T *y, unsigned char *mask, qc_i64 start, qc_i64 n, qc_i64 C, qc_i64 inner,    \
     const T *s, const T *inv, const double *zp, double qmin, double qmax, int mode),          \
    (x, y, mask, start, n, C, inner, s, inv, zp, qmin, qmax, mode))                            \
  X(ste_block, (const T *g, const unsigned char *mask, T *y, qc_i64 n), (g, mask, y, n))      \
  X(minmax_block, (const T *x, qc_i64 n, T *lo, T *hi, unsigned char *flags),                  \
    (x, n, lo, hi, flags))                                                                     \
  X(minmax_rowvec, (const T *x, qc_i64 rows, qc_i64 C, T *lo, T *hi, unsigned char *flags),   \
    (x, rows, C, lo, hi, flags))                                                               \
  X(enc_block,                                                                                 \
    (int family, const T *x, void *codes, int code_bytes, qc_i64 n, const T *params, qc_i64 C, \
     qc_i64 c, T u0, T u1, int mode),                                                          \
    (family, x, codes, code_bytes, n, params, C, c, u0, u1, mode))                             \
  X(enc_rowvec,                                                                                \
    (int family, const T *x, void *codes, int code_bytes, qc_i64 rows, qc_i64 C,               \
     const T *params, T u0, T u1, int mode),                                                   \
    (family, x, codes, code_bytes, rows, C, params, u0, u1, mode))                             \
  X(dec_block,                                                                                 \
    (int family, const void *codes, int code_bytes, T *y, qc_i64 n, const T *params, qc_i64 C, \
     qc_i64 c, T u0, T u1, int mode),                                                          \
    (family, codes, code_bytes, y, n, params, C, c, u0, u1, mode))                             \
  X(dec_rowvec,                                                                                \
    (int family, const void *codes, int code_bytes, T *y, qc_i64 rows, qc_i64 C,               \
     const T *params, T u0, T u1, int mode),                                                   \
    (family, codes, code_bytes, y, rows, C, params, u0, u1, mode))

/* The same for entry points that exist in float only. */
#define QC_CPU_ENTRIES_F32(X)                                                                  \
  X(histc_block,                                                                               \
    (const float *x, qc_i64 n, float lo, float hi, int bins, int absolute, int skip_zeros,     \
     qc_i64 *counts),                                                                          \
    (x, n, lo, hi, bins, absolute, skip_zeros, counts))                                        \
  X(group_blocks,                                                                              \
    (int recipe, const float *x, unsigned char *codes, float *y, unsigned char *mask,          \
     float *scale, float *zp, qc_i64 b0, qc_i64 nb, qc_i64 K, qc_i64 g, float qmin,            \
     float qmax, int mode),                                                                    \
    (recipe, x, codes, y, mask, scale, zp, b0, nb, K, g, qmin, qmax, mode))

#define QC_DECLARE_ENTRY(name, params, args) static void name params;
#define QC_DECLARE_BUILD(ns)                                                                   \
  namespace ns {                                                                               \
  template <typename T> struct Entries { QC_CPU_ENTRIES(QC_DECLARE_ENTRY) };                   \
  struct EntriesF32 { QC_CPU_ENTRIES_F32(QC_DECLARE_ENTRY) };                                  \
  extern template struct Entries<float>;                                                       \
  extern template struct Entries<double>;                                                      \
  }
QC_DECLARE_BUILD(qc_base)
#ifdef QC_HAVE_V3
QC_DECLARE_BUILD(qc_v3)
#endif
#undef QC_DECLARE_BUILD
#undef QC_DECLARE_ENTRY

/* Definitions of one build's entries (in qc_loops_base.cpp / qc_loops_v3.cpp,
 * after qc_cpu_loops.h with QC_LOOPS_NS set to the build's namespace). */
#define QC_DEFINE_ENTRY(name, params, args)                                                    \
  template <typename T> void QC_LOOPS_NS::Entries<T>::name params { QC_LOOPS_NS::loops::name args; }
#define QC_DEFINE_ENTRY_F32(name, params, args)                                                \
  void QC_LOOPS_NS::EntriesF32::name params { QC_LOOPS_NS::loops::name args; }
#define QC_DEFINE_BUILD                                                                        \
  QC_CPU_ENTRIES(QC_DEFINE_ENTRY)                                                              \
  QC_CPU_ENTRIES_F32(QC_DEFINE_ENTRY_F32)                                                      \
  template struct QC_LOOPS_NS::Entries<float>;                                                 \
  template struct QC_LOOPS_NS::Entries<double>;

namespace qc {

/* 1 while the AVX2 + FMA build runs (set by select_simd). */
inline int simd_v3 = 0;

/* Use the v3 build when allowed and the CPU (and OS) support AVX2 and FMA;
 * returns whether it is used. */
inline int select_simd(int allow) {
#ifdef QC_HAVE_V3
  __builtin_cpu_init();
  simd_v3 = allow && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  (void)allow;
  simd_v3 = 0;
#endif
  return simd_v3;
}

inline int simd_v3_built() {
#ifdef QC_HAVE_V3
  return 1;
#else
  return 0;
#endif
}

#ifdef QC_HAVE_V3
#define QC_PICK(Entries, name, args)                                                           \
  if (simd_v3)                                                                                 \
    qc_v3::Entries::name args;                                                                 \
  else                                                                                         \
    qc_base::Entries::name args;
#else
#define QC_PICK(Entries, name, args) qc_base::Entries::name args;
#endif
#define QC_DISPATCH(name, params, args)                                                        \
  template <typename T> inline void name params { QC_PICK(Entries<T>, name, args) }
#define QC_DISPATCH_F32(name, params, args)                                                    \
  inline void name params { QC_PICK(EntriesF32, name, args) }
QC_CPU_ENTRIES(QC_DISPATCH)
QC_CPU_ENTRIES_F32(QC_DISPATCH_F32)
#undef QC_DISPATCH
#undef QC_DISPATCH_F32
#undef QC_PICK

} /* namespace qc */

#endif /* QC_KERNELS_H */
