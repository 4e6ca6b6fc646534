/*
 * qc_families.h -- the elementwise kernel families, each declared once.
 *
 * A family maps every element x of a tensor to (y, mask) through a formula
 * of qc_elementwise.h with its channel's parameters.  The CPU loops
 * (qc_cpu_loops.h) and the GPU kernel (quantcore_gpu/cuda/fake_quant.cu)
 * are generic over the family's Op:
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
 * QC_EW_FAMILIES lists them: adding a family is its formula (in
 * qc_elementwise.h), its Op here with one line in the list, and the Python
 * call that validates the arguments and passes the parameters.  The
 * extension (family ids, CPU entry points) and quantcore_gpu.kernels (the
 * CUDA instantiations, read from this file) follow from the list.
 */
#ifndef QC_FAMILIES_H
#define QC_FAMILIES_H

#include "qc_elementwise.h"
#include "qc_formats.h"

/* A compile-time int (what the CPU loops specialise on). */
template <int V> struct QcInt {
  static const int value = V;
};

/* The affine mode bits the CPU loops make compile-time constants; the
 * zero-point placement (after / before / none) and multiply-or-divide stay
 * selects inside the loop body, which vectorise. */
#define QC_AFFINE_STATIC_BITS                                                                  \
  (QC_ROUND_MASK | QC_NF_MASK | QC_DEQUANT_WIDE | QC_DEQUANT_NARROW | QC_OUTPUT_Q | QC_FMA_ZP | \
   QC_ROUND_F32)

/* affine: p = {scale, 1 / scale, zero point}; u0, u1 = qmin, qmax */
template <typename T> struct QcAffineOp {
  enum { NP = 3, STATIC_BITS = QC_AFFINE_STATIC_BITS };
  T qmin, qmax;
  int mode;
  QC_HDM T operator()(T x, const T *p, qc_i64 ps, int m, unsigned char *mask) const {
    return qc_fq_affine(x, p[0], p[ps], p[2 * ps], qmin, qmax, m, mask);
  }
#ifndef __CUDACC__ /* (the CPU loops only) */
  /* the combinations in use get a loop each (fake quant: rounding x
   * non-finite policy; quantize; torch's wide / narrow dequantisation);
   * any other runs the same loop with these bits at run time */
  template <class F> static void dispatch(int mode, F f) {
    switch (mode & QC_AFFINE_STATIC_BITS) {
    case 0: f(QcInt<0>()); break;
    case 1: f(QcInt<1>()); break;
    case 2: f(QcInt<2>()); break;
    case 32: f(QcInt<32>()); break;
    case 33: f(QcInt<33>()); break;
    case 34: f(QcInt<34>()); break;
    case 64: f(QcInt<64>()); break;
    case 65: f(QcInt<65>()); break;
    case 66: f(QcInt<66>()); break;
    case 128: f(QcInt<128>()); break;
    case 160: f(QcInt<160>()); break;
    case 161: f(QcInt<161>()); break;
    case 162: f(QcInt<162>()); break;
    case 192: f(QcInt<192>()); break;
    case 80: f(QcInt<80>()); break;
    case 1056: f(QcInt<1056>()); break;
    default: f(QcInt<-1>()); break; /* -1: every bit at run time */
    }
  }
#endif
};

/* nudged (TensorFlow / MindSpore): p = {nmin, nmax, scale, 1 / scale, qz} */
template <typename T> struct QcNudgedOp {
  enum { NP = 5, STATIC_BITS = QC_NUDGED_MODES - 1 };
  T unused0, unused1;
  int mode;
  QC_HDM T operator()(T x, const T *p, qc_i64 ps, int m, unsigned char *mask) const {
    return qc_fq_nudged(x, p[0], p[ps], p[2 * ps], p[3 * ps], p[4 * ps], m, mask);
  }
#ifndef __CUDACC__
  template <class F> static void dispatch(int mode, F f) {
    switch (mode & STATIC_BITS) {
    case 0: f(QcInt<0>()); break;
    case 1: f(QcInt<1>()); break;
    case 2: f(QcInt<2>()); break;
    default: f(QcInt<3>()); break;
    }
  }
#endif
};

/* amax (NVIDIA): p = {mult, div, amax}; u0, u1 = lo, hi */
template <typename T> struct QcAmaxOp {
  enum { NP = 3, STATIC_BITS = 0 };
  T lo, hi;
  int mode;
  QC_HDM T operator()(T x, const T *p, qc_i64 ps, int, unsigned char *mask) const {
    return qc_fq_amax(x, p[0], p[ps], lo, hi, p[2 * ps], mask);
  }
#ifndef __CUDACC__
  template <class F> static void dispatch(int, F f) { f(QcInt<0>()); }
#endif
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

/* The four FP8 formats under each overflow policy, and e5m2 with the
 * ml_dtypes NaN (the only format it changes: quantcore.formats drops the bit
 * for the others) -- fake casts and cast_fp8. */
#define QC_FP8_CASTS 0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 65, 81, 97
#endif

/* the block-scaled recipes (their CPU dispatch uses QcInt / qc_dispatch_among;
 * the CPU loops that do not run them leave them out: QC_NO_BLOCK_RECIPES) */
#ifndef QC_NO_BLOCK_RECIPES
#include "qc_mx.h"
#endif

/* fp8 (FP8 fake quant / fake cast, qc_fp8_fake): p = {p0: quantize
 * factor, p1: dequantize factor, p2: amax of the mask}; mode = format |
 * QC_F8_* */
template <typename T> struct QcFp8FakeOp {
  /* every mode bit (QC_F8_PLUS_ZERO included: left at run time, its test of
   * v == 0 cost the FP8 fake-quant loops half their speed) */
  enum { NP = 3, STATIC_BITS = (QC_F8_PLUS_ZERO << 1) - 1 };
  T unused0, unused1;
  int mode;
  QC_HDM T operator()(T x, const T *p, qc_i64 ps, int m, unsigned char *mask) const {
    return qc_fp8_fake(x, p[0], p[ps], p[2 * ps], m, mask);
  }
#ifndef __CUDACC__
  /* fake casts; modelopt (e4m3fn, x * s, q * (1 / s), |x| <= amax);
   * torchao (e4m3fn / e5m2, x * s, q / s) */
  template <class F> static void dispatch(int mode, F f) {
    qc_dispatch_among<QC_FP8_CASTS, 2688, 1152, 1153>(mode & STATIC_BITS, f);
  }
#endif
};

/* The mode a loop specialised on CM passes to the Op: CM's bits as
 * constants, the rest of `mode` at run time (CM = -1: all at run time). */
template <class Op, int CM> QC_HD int qc_loop_mode(int mode) {
  return CM < 0 ? mode : ((mode & ~(int)Op::STATIC_BITS) | CM);
}

/* X(name, Op) for every elementwise family.  The extension exports the list
 * as compiled (FAMILIES); quantcore_gpu names its instantiations from that
 * table, no header text is read. */
#define QC_EW_FAMILIES(X)                                                      \
  X(affine, QcAffineOp)                                                        \
  X(nudged, QcNudgedOp)                                                        \
  X(amax, QcAmaxOp)                                                            \
  X(fp8, QcFp8FakeOp)

/* family ids: QC_EW_affine, ... (QC_EW_COUNT of them), their names and
 * parameter counts (the X callbacks QC_X_*: qc_core.h) */
#define QC_EW_ID(name, Op) QC_EW_##name,
enum { QC_EW_FAMILIES(QC_EW_ID) QC_EW_COUNT };
#undef QC_EW_ID
static const char *const qc_ew_family_names[] = {QC_EW_FAMILIES(QC_X_NAME)};
static const int qc_ew_family_np[] = {QC_EW_FAMILIES(QC_X_NP)};

/* ------------------------------------------------------------------------
 * Code families: encode (T -> code) and decode (code -> T), declared like
 * the elementwise families (NP, STATIC_BITS, the aggregate {u0, u1, mode},
 * dispatch) with CODE_BYTES: the code widths the family writes / reads
 * (1: one-byte codes, 2: two-byte codes, 3: both).  An encode Op returns
 * the code (an unsigned) of x; a decode Op takes the code and returns y.
 * The same generic loops (qc_cpu_loops.h) and one generic CUDA kernel per
 * kind (quantcore_gpu/cuda/formats.cu) run them.
 * ---------------------------------------------------------------------- */

/* fp8 encode: code = qc_mf_encode(v) of v = x, x * p0 or x / p0
 * (QC_F8_SCALE_*): cast_fp8 and ONNX QuantizeLinear to FP8 */
template <typename T> struct QcFp8EncodeOp {
  enum { NP = 1, STATIC_BITS = 511, CODE_BYTES = 1 };
  T unused0, unused1;
  int mode;
  QC_HDM unsigned operator()(T x, const T *p, qc_i64, int m, unsigned char *) const {
    return qc_mf_encode(qc_f8_scaled(x, p[0], m), m & QC_FMT_MASK, m);
  }
#ifndef __CUDACC__
  /* casts; ONNX QuantizeLinear (x / s, ml_dtypes NaN, satfinite / nonsat);
   * fp8_quantize (e4m3fn / e5m2, x * s) */
  template <class F> static void dispatch(int mode, F f) {
    qc_dispatch_among<QC_FP8_CASTS, 320, 321, 322, 323, 336, 337, 338, 339, 128, 129>(
        mode & STATIC_BITS, f);
  }
#endif
};

/* int encode (ONNX QuantizeLinear, qc_int_quant): p = {scale, zero point};
 * u0, u1 = qmin, qmax; mode = code width | QC_INT_* */
template <typename T> struct QcIntEncodeOp {
  enum { NP = 2, STATIC_BITS = QC_INT_WRAP32, CODE_BYTES = 3 };
  T qmin, qmax;
  int mode;
  QC_HDM unsigned operator()(T x, const T *p, qc_i64 ps, int m, unsigned char *) const {
    return qc_int_code(qc_int_quant(x, p[0], p[ps], qmin, qmax, m), m & QC_INT_WIDTH_MASK);
  }
#ifndef __CUDACC__
  template <class F> static void dispatch(int mode, F f) {
    if (mode & QC_INT_WRAP32) f(QcInt<QC_INT_WRAP32>());
    else f(QcInt<0>());
  }
#endif
};

/* fp8 decode (ONNX DequantizeLinear from FP8): y = decode(code), times or
 * divided by p0 (QC_F8_DEQ_*) */
template <typename T> struct QcFp8DecodeOp {
  enum { NP = 1, STATIC_BITS = QC_FMT_MASK | QC_F8_DEQ_MUL | QC_F8_DEQ_DIV, CODE_BYTES = 1 };
  T unused0, unused1;
  int mode;
  QC_HDM T operator()(unsigned code, const T *p, qc_i64, int m, unsigned char *) const {
    return qc_f8_dequant((T)qc_mf_decode(code, m & QC_FMT_MASK), p[0], m);
  }
#ifndef __CUDACC__
  /* decode; ONNX DequantizeLinear (* s); modelopt (* s) / torchao (/ s);
   * MX / NVFP4 elements (e2m3, e3m2, e2m1) * their block's scale */
  template <class F> static void dispatch(int mode, F f) {
    qc_dispatch_among<0, 1, 2, 3, 512, 513, 514, 515, 1024, 1025, 516, 517, 518>(
        mode & STATIC_BITS, f);
  }
#endif
};

/* int decode (ONNX DequantizeLinear, qc_int_dequant): p = {scale, zero
 * point, float zero point added after (QC_INT_ADD_FLOAT)}; mode = code
 * width | QC_INT_* */
template <typename T> struct QcIntDecodeOp {
  enum { NP = 3, STATIC_BITS = QC_INT_WIDTH_MASK | QC_INT_SIGNED | QC_INT_ADD_FLOAT,
         CODE_BYTES = 3 };
  T unused0, unused1;
  int mode;
  QC_HDM T operator()(unsigned code, const T *p, qc_i64 ps, int m, unsigned char *) const {
    return qc_int_dequant(code, p[0], p[ps], p[2 * ps], m);
  }
#ifndef __CUDACC__
  template <class F> static void dispatch(int mode, F f) {
    qc_dispatch_among<8, 40, 16, 48, 136, 168>(mode & STATIC_BITS, f);
  }
#endif
};

/* X(name, Op) for every encode / decode family (exported by the extension
 * as ENCODE_FAMILIES / DECODE_FAMILIES; quantcore_gpu names from there). */
#define QC_ENCODE_FAMILIES(X)                                                  \
  X(fp8, QcFp8EncodeOp)                                                        \
  X(int, QcIntEncodeOp)

#define QC_DECODE_FAMILIES(X)                                                  \
  X(fp8, QcFp8DecodeOp)                                                        \
  X(int, QcIntDecodeOp)

/* X(name, Recipe) for every group recipe of qc_formats.h (read by
 * quantcore_gpu/kernels.py as well). */
#define QC_GROUP_RECIPES(X)                                                    \
  X(onnx, QcGroupOrt)                                                          \
  X(onnx_numpy, QcGroupOrtNumpy)                                               \
  X(torchao, QcGroupTorchao)                                                   \
  X(tinygemm, QcGroupTinygemm)                                                 \
  X(hqq, QcGroupHqq)                                                           \
  X(awq, QcGroupAwq)                                                           \
  X(gptq, QcGroupGptq)

/* X(name, Recipe) for every block-scaled recipe of qc_mx.h (read by
 * quantcore_gpu/kernels.py as well). */
#define QC_BLOCK_RECIPES(X)                                                    \
  X(mx, QcBlockMx)                                                             \
  X(nvfp4, QcBlockNvfp4)

#define QC_BLK_ID(name, R) QC_BLK_##name,
enum { QC_BLOCK_RECIPES(QC_BLK_ID) QC_BLK_COUNT };
#undef QC_BLK_ID
static const char *const qc_block_recipe_names[] = {QC_BLOCK_RECIPES(QC_X_NAME)};

/* ids QC_ENC_<name>, QC_DEC_<name>, QC_GRP_<name>, the names, parameter
 * counts and code widths */
#define QC_ENC_ID(name, Op) QC_ENC_##name,
enum { QC_ENCODE_FAMILIES(QC_ENC_ID) QC_ENC_COUNT };
#undef QC_ENC_ID
#define QC_DEC_ID(name, Op) QC_DEC_##name,
enum { QC_DECODE_FAMILIES(QC_DEC_ID) QC_DEC_COUNT };
#undef QC_DEC_ID
#define QC_GRP_ID(name, R) QC_GRP_##name,
enum { QC_GROUP_RECIPES(QC_GRP_ID) QC_GRP_COUNT };
#undef QC_GRP_ID
static const char *const qc_encode_family_names[] = {QC_ENCODE_FAMILIES(QC_X_NAME)};
static const char *const qc_decode_family_names[] = {QC_DECODE_FAMILIES(QC_X_NAME)};
static const char *const qc_group_recipe_names[] = {QC_GROUP_RECIPES(QC_X_NAME)};
static const int qc_encode_family_np[] = {QC_ENCODE_FAMILIES(QC_X_NP)};
static const int qc_decode_family_np[] = {QC_DECODE_FAMILIES(QC_X_NP)};
static const int qc_encode_family_bytes[] = {QC_ENCODE_FAMILIES(QC_X_CODE_BYTES)};
static const int qc_decode_family_bytes[] = {QC_DECODE_FAMILIES(QC_X_CODE_BYTES)};

#endif /* QC_FAMILIES_H */
