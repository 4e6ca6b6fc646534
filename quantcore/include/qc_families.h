/*
 * qc_families.h -- the elementwise families of qc_elementwise.h's formulas
 * (affine, nudged, amax), each Op declared once for the CPU loops
 * (quantcore/_cpu/qc_loops_affine.cpp) and the GPU kernel
 * (quantcore_gpu/cuda/fake_quant.cu).
 *
 * The Op protocol, the lists of every family and their ids are in
 * qc_registry.h; the families over qc_formats.h (fp8 fake quant, encode /
 * decode) in qc_format_families.h, so that an edit here rebuilds the loops
 * of these three families only.
 */
#ifndef QC_FAMILIES_H
#define QC_FAMILIES_H

#include "qc_elementwise.h"
#include "qc_registry.h"

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

#endif /* QC_FAMILIES_H */
