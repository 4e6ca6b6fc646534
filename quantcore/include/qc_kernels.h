/*
 * qc_kernels.h -- the CPU extension's entry points into the loops of
 * qc_cpu_loops.h, each declared once, for float and double, and chosen at
 * run time among the SIMD builds of the same source (qc_base, qc_v3, qc_v4:
 * qc_builds.h); tests/test_simd.py checks that they give the same bits on
 * every family.  qc::select_simd() is called once when the extension is
 * imported (QUANTCORE_SIMD=baseline / x86-64-v3 caps the level).
 *
 * The loops are split by family into translation units (quantcore/_cpu/
 * qc_loops_*.cpp, each compiled once per build, QC_SIMD_LEVEL = 2, 3 or 4),
 * so that an edit of one family's header rebuilds only its own loops: the
 * entries of an elementwise / encode / decode family or a group / block
 * recipe are one struct per family (ew_block<T, QC_EW_affine>, ...),
 * defined in the unit that owns the family; qc::ew_block(family, ...) picks
 * it by id.  This header needs the ids only (qc_registry.h), not the
 * families' formulas: the extension's own unit (_kernels.pyx) does not
 * include qc_formats.h / qc_groups.h / qc_mx.h / the Ops, nor is rebuilt by
 * their edits.
 *
 * The extension calls qc::<entry>(...) (quantcore/_cpu/_kernels.pxd): a
 * template over the compute type, deduced from the arguments.
 */
#ifndef QC_KERNELS_H
#define QC_KERNELS_H

#include "qc_builds.h"
#include "qc_registry.h"

/* X(name, parameters, arguments) for every entry point that is not per
 * family, with T the compute type (float or double). */
#define QC_CPU_ENTRIES(X)                                                                      \
  X(affine_exact_range,                                                                        \
    (const T *x, T *y, unsigned char *mask, qc_i64 start, qc_i64 n, qc_i64 C, qc_i64 inner,    \
     const T *s, const T *inv, const double *zp, double qmin, double qmax, int mode),          \
    (x, y, mask, start, n, C, inner, s, inv, zp, qmin, qmax, mode))                            \
  X(ste_block, (const T *g, const unsigned char *mask, T *y, qc_i64 n), (g, mask, y, n))      \
  X(minmax_block, (const T *x, qc_i64 n, T *lo, T *hi, unsigned char *flags),                  \
    (x, n, lo, hi, flags))                                                                     \
  X(minmax_rowvec, (const T *x, qc_i64 rows, qc_i64 C, T *lo, T *hi, unsigned char *flags),   \
    (x, rows, C, lo, hi, flags))

/* The same for entry points that exist in float only. */
#define QC_CPU_ENTRIES_F32(X)                                                                  \
  X(histc_block,                                                                               \
    (const float *x, qc_i64 n, float lo, float hi, int bins, int absolute, int skip_zeros,     \
     qc_i64 *counts),                                                                          \
    (x, n, lo, hi, bins, absolute, skip_zeros, counts))

/* X(entry, family list, id prefix, parameters, arguments) for the entry
 * points by family id (the family id is their first parameter, left out
 * here): one member <entry>_<family> per family of the list. */
#define QC_CPU_FAMILY_ENTRIES(X)                                                               \
  X(ew_block, QC_EW_FAMILIES, QC_EW_,                                                          \
    (const T *x, T *y, unsigned char *mask, qc_i64 n, const T *params, qc_i64 C, qc_i64 c,     \
     T u0, T u1, int mode),                                                                    \
    (x, y, mask, n, params, C, c, u0, u1, mode))                                               \
  X(ew_rowvec, QC_EW_FAMILIES, QC_EW_,                                                         \
    (const T *x, T *y, unsigned char *mask, qc_i64 rows, qc_i64 C, const T *params, T u0,      \
     T u1, int mode),                                                                          \
    (x, y, mask, rows, C, params, u0, u1, mode))                                               \
  X(enc_block, QC_ENCODE_FAMILIES, QC_ENC_,                                                    \
    (const T *x, void *codes, int code_bytes, qc_i64 n, const T *params, qc_i64 C, qc_i64 c,   \
     T u0, T u1, int mode),                                                                    \
    (x, codes, code_bytes, n, params, C, c, u0, u1, mode))                                     \
  X(enc_rowvec, QC_ENCODE_FAMILIES, QC_ENC_,                                                   \
    (const T *x, void *codes, int code_bytes, qc_i64 rows, qc_i64 C, const T *params, T u0,    \
     T u1, int mode),                                                                          \
    (x, codes, code_bytes, rows, C, params, u0, u1, mode))                                     \
  X(dec_block, QC_DECODE_FAMILIES, QC_DEC_,                                                    \
    (const void *codes, int code_bytes, T *y, qc_i64 n, const T *params, qc_i64 C, qc_i64 c,   \
     T u0, T u1, int mode),                                                                    \
    (codes, code_bytes, y, n, params, C, c, u0, u1, mode))                                     \
  X(dec_rowvec, QC_DECODE_FAMILIES, QC_DEC_,                                                   \
    (const void *codes, int code_bytes, T *y, qc_i64 rows, qc_i64 C, const T *params, T u0,    \
     T u1, int mode),                                                                          \
    (codes, code_bytes, y, rows, C, params, u0, u1, mode))

/* The same in float only (T is float): the group recipes (qc_groups.h) and
 * the block-scaled recipes (qc_mx.h). */
#define QC_CPU_FAMILY_ENTRIES_F32(X)                                                           \
  X(group_blocks, QC_GROUP_RECIPES, QC_GRP_,                                                   \
    (const float *x, unsigned char *codes, float *y, unsigned char *mask, float *scale,        \
     float *zp, qc_i64 b0, qc_i64 nb, qc_i64 K, qc_i64 g, float qmin, float qmax, int mode),   \
    (x, codes, y, mask, scale, zp, b0, nb, K, g, qmin, qmax, mode))                            \
  X(block_scaled, QC_BLOCK_RECIPES, QC_BLK_,                                                   \
    (const float *x, unsigned char *scodes, unsigned char *codes, float *y, qc_i64 b0,         \
     qc_i64 nb, qc_i64 K, qc_i64 g, int elem, int mode, float p0, float p1),                   \
    (x, scodes, codes, y, b0, nb, K, g, elem, mode, p0, p1))

#define QC_UNPAREN(...) __VA_ARGS__

/* The families' parameter counts (NP) and code widths (CODE_BYTES), by id:
 * the extension's tables (FAMILY_PARAMS, CODE_FAMILY_INFO), defined from
 * the Ops in quantcore/_cpu/qc_tables.cpp. */
extern const int qc_ew_family_np[QC_EW_COUNT];
extern const int qc_encode_family_np[QC_ENC_COUNT];
extern const int qc_decode_family_np[QC_DEC_COUNT];
extern const int qc_encode_family_bytes[QC_ENC_COUNT];
extern const int qc_decode_family_bytes[QC_DEC_COUNT];

/* One build's entry points, in its namespace (qc_base, qc_v3, qc_v4):
 * Entries<T>::<entry>, EntriesF32::<entry>, and for an entry by family the
 * struct <entry><T, family id>::run.  The units of qc_loops_*.cpp define
 * them (QC_DEFINE_* of qc_cpu_loops.h) and explicitly instantiate the
 * ones they own: an explicit instantiation of Entries<T> instantiates the
 * members defined in that unit, and only those. */
#define QC_DECLARE_ENTRY(name, params, args) static void name params;
#define QC_DECLARE_FAMILY_ENTRY(entry, list, prefix, params, args)                            \
  template <typename T, int F> struct entry {                                                  \
    static void run params;                                                                    \
  };
#define QC_DECLARE_BUILD(ns)                                                                   \
  namespace ns {                                                                               \
  template <typename T> struct Entries { QC_CPU_ENTRIES(QC_DECLARE_ENTRY) };                   \
  struct EntriesF32 { QC_CPU_ENTRIES_F32(QC_DECLARE_ENTRY) };                                  \
  QC_CPU_FAMILY_ENTRIES(QC_DECLARE_FAMILY_ENTRY)                                               \
  QC_CPU_FAMILY_ENTRIES_F32(QC_DECLARE_FAMILY_ENTRY)                                           \
  }
QC_DECLARE_BUILD(qc_base)
#if defined(QC_HAVE_V3) || QC_SIMD_LEVEL == 3
QC_DECLARE_BUILD(qc_v3)
#endif
#if defined(QC_HAVE_V4) || QC_SIMD_LEVEL == 4
QC_DECLARE_BUILD(qc_v4)
#endif
#undef QC_DECLARE_BUILD
#undef QC_DECLARE_FAMILY_ENTRY
#undef QC_DECLARE_ENTRY

namespace qc {

/* CALL(ns, ...) in the namespace of the build in use */
#define QC_PICK(CALL, ...)                                                                     \
  switch (simd_level) {                                                                        \
    QC_IF_V4(case 4: CALL(qc_v4, __VA_ARGS__); break;)                                         \
    QC_IF_V3(case 3: CALL(qc_v3, __VA_ARGS__); break;)                                         \
  default: CALL(qc_base, __VA_ARGS__); break;                                                  \
  }

/* E<T, id>::run(a...) for the family of id `id` < N (an id out of range
 * does nothing: the callers validate it). */
template <template <typename, int> class E, typename T, int F, int N, typename... A>
inline void by_id(int id, A... a) {
  if constexpr (F < N) {
    if (id == F) E<T, F>::run(a...);
    else by_id<E, T, F + 1, N>(id, a...);
  }
}

#define QC_CALL_ENTRY(ns, Entries, name, args) ns::Entries::name args
#define QC_CALL_BY_ID(ns, T, entry, count, args) by_id<ns::entry, T, 0, count>(family, QC_UNPAREN args)
#define QC_DISPATCH(name, params, args)                                                        \
  template <typename T> inline void name params { QC_PICK(QC_CALL_ENTRY, Entries<T>, name, args) }
#define QC_DISPATCH_F32(name, params, args)                                                    \
  inline void name params { QC_PICK(QC_CALL_ENTRY, EntriesF32, name, args) }
#define QC_DISPATCH_FAMILY(entry, list, prefix, params, args)                                 \
  template <typename T> inline void entry(int family, QC_UNPAREN params) {                    \
    QC_PICK(QC_CALL_BY_ID, T, entry, prefix##COUNT, args)                                      \
  }
#define QC_DISPATCH_FAMILY_F32(entry, list, prefix, params, args)                             \
  inline void entry(int family, QC_UNPAREN params) {                                           \
    QC_PICK(QC_CALL_BY_ID, float, entry, prefix##COUNT, args)                                  \
  }
QC_CPU_ENTRIES(QC_DISPATCH)
QC_CPU_ENTRIES_F32(QC_DISPATCH_F32)
QC_CPU_FAMILY_ENTRIES(QC_DISPATCH_FAMILY)
QC_CPU_FAMILY_ENTRIES_F32(QC_DISPATCH_FAMILY_F32)
#undef QC_DISPATCH
#undef QC_DISPATCH_F32
#undef QC_DISPATCH_FAMILY
#undef QC_DISPATCH_FAMILY_F32
#undef QC_CALL_ENTRY
#undef QC_CALL_BY_ID
#undef QC_PICK

} /* namespace qc */

#endif /* QC_KERNELS_H */
