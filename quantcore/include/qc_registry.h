/*
 * qc_registry.h -- every kernel family and recipe by name and id, and the
 * protocol their Ops follow; no formula (an edit of a family's header does
 * not touch the units that only need the ids).
 *
 * A family maps every element x of a tensor to (y, mask), a code or a
 * value through a formula with its channel's parameters.  Its Op is defined
 * next to its formulas: qc_families.h (affine, nudged, amax: the formulas
 * of qc_elementwise.h), qc_format_families.h (fp8 fake quant, the encode /
 * decode families: qc_formats.h); the recipes are those of qc_groups.h
 * (group) and qc_mx.h (block-scaled).  The CPU loops (qc_cpu_loops.h) and
 * the GPU kernels (quantcore_gpu/cuda/fake_quant.cu, formats.cu) are
 * generic over the family's Op:
 *
 *   template <typename T> struct Op {
 *     enum { NP = k };         k per-channel parameters, laid out as NP
 *                              arrays of C values: params[j * C + c]
 *     enum { STATIC_BITS = b }; the mode bits the CPU loops make
 *                              compile-time constants
 *     T u0, u1; int mode;      the uniform parameters (aggregate order)
 *     T operator()(T x, const T *p, qc_i64 ps, int mode, unsigned char *mask)
 *                              y and *mask of x, with parameter j at p[j * ps]
 *     template <class F> static void dispatch(int mode, F f);   (host only)
 *                              calls f(QcInt<CM>()) with CM = mode &
 *                              STATIC_BITS when a loop exists for it, else
 *                              f(QcInt<-1>()) (every bit at run time)
 *   };
 *
 * The X lists below name them: adding a family is its formula, its Op
 * with one line in its list here, and the Python call that validates the
 * arguments and passes the parameters.  The extension (family ids, CPU
 * entry points, the tables FAMILIES, ENCODE_FAMILIES, ... and TYPE_NAMES)
 * and quantcore_gpu's CUDA instantiations (named from those tables, no
 * header text read) follow from the lists.
 */
#ifndef QC_REGISTRY_H
#define QC_REGISTRY_H

#include "qc_core.h"

/* A compile-time int (what the CPU loops specialise on). */
template <int V> struct QcInt {
  static const int value = V;
};

#ifndef __CUDACC__ /* (the CPU loops only) */
/* f(QcInt<V>()) for the first V of the list equal to `bits`, else
 * f(QcInt<-1>()) (every bit at run time): the mode words that get a CPU loop
 * of their own.  (The loop-invariant selects of a mode bit left at run time
 * can keep GCC from vectorising a loop: list the combinations in use.) */
template <int... V> struct QcAmong;
template <> struct QcAmong<> {
  template <class F> static void run(int, F f) { f(QcInt<-1>()); }
};
template <int V0, int... V> struct QcAmong<V0, V...> {
  template <class F> static void run(int bits, F f) {
    if (bits == V0) f(QcInt<V0>());
    else QcAmong<V...>::run(bits, f);
  }
};
template <int... V, class F> static inline void qc_dispatch_among(int bits, F f) {
  QcAmong<V...>::run(bits, f);
}
#endif

/* The mode a loop specialised on CM passes to the Op: CM's bits as
 * constants, the rest of `mode` at run time (CM = -1: all at run time). */
template <class Op, int CM> QC_HD int qc_loop_mode(int mode) {
  return CM < 0 ? mode : ((mode & ~(int)Op::STATIC_BITS) | CM);
}

/* X(name, Op) for every elementwise family (x -> y and the mask). */
#define QC_EW_FAMILIES(X)                                                      \
  X(affine, QcAffineOp)                                                        \
  X(nudged, QcNudgedOp)                                                        \
  X(amax, QcAmaxOp)                                                            \
  X(fp8, QcFp8FakeOp)

/* X(name, Op) for every encode / decode family: declared like the
 * elementwise families (NP, STATIC_BITS, the aggregate {u0, u1, mode},
 * dispatch) with CODE_BYTES: the code widths the family writes / reads
 * (1: one-byte codes, 2: two-byte codes, 3: both).  An encode Op returns
 * the code (an unsigned) of x; a decode Op takes the code and returns y.
 * The same generic loops (qc_cpu_loops.h) and one generic CUDA kernel per
 * kind (quantcore_gpu/cuda/formats.cu) run them. */
#define QC_ENCODE_FAMILIES(X)                                                  \
  X(fp8, QcFp8EncodeOp)                                                        \
  X(int, QcIntEncodeOp)

#define QC_DECODE_FAMILIES(X)                                                  \
  X(fp8, QcFp8DecodeOp)                                                        \
  X(int, QcIntDecodeOp)

/* X(name, Recipe) for every group recipe of qc_groups.h. */
#define QC_GROUP_RECIPES(X)                                                    \
  X(onnx, QcGroupOrt)                                                          \
  X(onnx_numpy, QcGroupOrtNumpy)                                               \
  X(torchao, QcGroupTorchao)                                                   \
  X(tinygemm, QcGroupTinygemm)                                                 \
  X(hqq, QcGroupHqq)                                                           \
  X(awq, QcGroupAwq)                                                           \
  X(gptq, QcGroupGptq)

/* X(name, Recipe) for every block-scaled recipe of qc_mx.h. */
#define QC_BLOCK_RECIPES(X)                                                    \
  X(mx, QcBlockMx)                                                             \
  X(nvfp4, QcBlockNvfp4)

/* Every Op and recipe declared (the loops name them all in their id
 * tables; each is defined in its own header). */
#define QC_X_DECLARE_OP(name, Op) template <typename T> struct Op;
#define QC_X_DECLARE_RECIPE(name, R) struct R;
QC_EW_FAMILIES(QC_X_DECLARE_OP)
QC_ENCODE_FAMILIES(QC_X_DECLARE_OP)
QC_DECODE_FAMILIES(QC_X_DECLARE_OP)
QC_GROUP_RECIPES(QC_X_DECLARE_RECIPE)
QC_BLOCK_RECIPES(QC_X_DECLARE_RECIPE)
#undef QC_X_DECLARE_OP
#undef QC_X_DECLARE_RECIPE

/* ids QC_EW_<name>, QC_ENC_<name>, QC_DEC_<name>, QC_GRP_<name>,
 * QC_BLK_<name> (QC_EW_COUNT, ... of them) and their names (the X
 * callbacks QC_X_*: qc_core.h).  The parameter counts and code widths
 * need the Ops: the extension's tables (qc_kernels.h). */
#define QC_EW_ID(name, Op) QC_EW_##name,
#define QC_ENC_ID(name, Op) QC_ENC_##name,
#define QC_DEC_ID(name, Op) QC_DEC_##name,
#define QC_GRP_ID(name, R) QC_GRP_##name,
#define QC_BLK_ID(name, R) QC_BLK_##name,
enum { QC_EW_FAMILIES(QC_EW_ID) QC_EW_COUNT };
enum { QC_ENCODE_FAMILIES(QC_ENC_ID) QC_ENC_COUNT };
enum { QC_DECODE_FAMILIES(QC_DEC_ID) QC_DEC_COUNT };
enum { QC_GROUP_RECIPES(QC_GRP_ID) QC_GRP_COUNT };
enum { QC_BLOCK_RECIPES(QC_BLK_ID) QC_BLK_COUNT };
#undef QC_EW_ID
#undef QC_ENC_ID
#undef QC_DEC_ID
#undef QC_GRP_ID
#undef QC_BLK_ID
static const char *const qc_ew_family_names[] = {QC_EW_FAMILIES(QC_X_NAME)};
static const char *const qc_encode_family_names[] = {QC_ENCODE_FAMILIES(QC_X_NAME)};
static const char *const qc_decode_family_names[] = {QC_DECODE_FAMILIES(QC_X_NAME)};
static const char *const qc_group_recipe_names[] = {QC_GROUP_RECIPES(QC_X_NAME)};
static const char *const qc_block_recipe_names[] = {QC_BLOCK_RECIPES(QC_X_NAME)};

#endif /* QC_REGISTRY_H */
