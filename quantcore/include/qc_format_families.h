/*
 * qc_format_families.h -- the families over the formulas of qc_formats.h,
 * each Op declared once for the CPU loops (quantcore/_cpu/qc_loops_fp8.cpp,
 * qc_loops_codes.cpp) and the GPU kernels (quantcore_gpu/cuda/
 * fake_quant.cu, formats.cu): the elementwise fp8 family (FP8 fake quant /
 * fake cast) and the encode / decode families (FP8 and integer codes).
 * The protocol and the lists: qc_registry.h.
 */
#ifndef QC_FORMAT_FAMILIES_H
#define QC_FORMAT_FAMILIES_H

#include "qc_formats.h"
#include "qc_registry.h"

#ifndef __CUDACC__
/* The four FP8 formats under each overflow policy, and e5m2 with the
 * ml_dtypes NaN (the only format it changes: quantcore.formats drops the bit
 * for the others) -- fake casts and cast_fp8. */
#define QC_FP8_CASTS 0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 65, 81, 97
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

#endif /* QC_FORMAT_FAMILIES_H */
