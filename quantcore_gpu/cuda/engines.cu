/*
 * engines.cu -- the engine checkpoint writers' element loops on the GPU,
 * twins of quantcore/_cpu/_engines.pyx's row loops: the element rules of
 * qc_engines.h, one thread per element (or per packed pair, or per group)
 * in grid-stride loops over C-contiguous rows of `cols` values, X the
 * stored type (unsigned short: BF16 bits; float: float32 values), R the
 * BF16 rounding of the quotient:
 *
 *   qc_eng_fp8_k          q[i] = qc_eng_fp8(x[i], s[row or 0], R)
 *   qc_eng_fp4_k          q[i / 2] = e(x[i] / d[group]) | e(x[i + 1] / ...) << 4,
 *                         e the e2m1 code qc_eng_e2m1 (of the quotient
 *                         rounded to BF16 when R)
 *   qc_eng_int_k<P>       qc_eng_int_code<R>(x[i], s[group], z[group]) as
 *                         int8 (P = 0), + 128 (P = 8), or + 8 two a byte,
 *                         element 2i in the low nibble (P = 4)
 *   qc_eng_group_minmax_k qc_eng_group_minmax of each group
 *
 * Groups are 2^gshift consecutive values of a row (cols a multiple).
 */
#include "qc_engines.h"

#define QC_ENG_LOOP(i, n)                                                                       \
  for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x, step_ = (I)gridDim.x *           \
                                                                (I)blockDim.x;                 \
       i < (n); i += step_)

template <int R, typename X, typename I>
__global__ void qc_eng_fp8_k(const X *x, unsigned char *q, I n, I cols, const float *s,
                             int per_row) {
  QC_ENG_LOOP(i, n) q[i] = qc_eng_fp8(qc_eng_value(x[i]), s[per_row ? i / cols : (I)0], R);
}

/* the divisor of element i's group (2^gshift values of a row of cols) */
template <typename I>
__device__ __forceinline__ I qc_eng_group_of(I i, I cols, int gshift) {
  const I row = i / cols;
  return row * (cols >> gshift) + ((i - row * cols) >> gshift);
}

template <int R> __device__ __forceinline__ unsigned qc_eng_e2m1_of(float v) {
  return qc_eng_e2m1(R ? qc_round_bf16(v) : v);
}

template <int R, typename X, typename I>
__global__ void qc_eng_fp4_k(const X *x, unsigned char *q, I npairs, I cols, const float *d,
                             int gshift) {
  QC_ENG_LOOP(p, npairs) {
    const float dk = d[qc_eng_group_of(2 * p, cols, gshift)];
    const unsigned c0 = qc_eng_e2m1_of<R>(qc_eng_value(x[2 * p]) / dk);
    const unsigned c1 = qc_eng_e2m1_of<R>(qc_eng_value(x[2 * p + 1]) / dk);
    q[p] = (unsigned char)(c0 | (c1 << 4));
  }
}

template <int R, typename X, typename I>
__device__ __forceinline__ int qc_eng_int_at(const X *x, I i, I cols, const float *s,
                                             const float *z, int gshift, float qmin,
                                             float qmax) {
  const I k = qc_eng_group_of(i, cols, gshift);
  return qc_eng_int_code<R>(qc_eng_value(x[i]), s[k], z[k], qmin, qmax);
}

template <int R, int P, typename X, typename I>
__global__ void qc_eng_int_k(const X *x, unsigned char *q, I nout, I cols, const float *s,
                             const float *z, int gshift, float qmin, float qmax) {
  QC_ENG_LOOP(o, nout) {
    if (P == 4) {
      const int c0 = qc_eng_int_at<R>(x, 2 * o, cols, s, z, gshift, qmin, qmax);
      const int c1 = qc_eng_int_at<R>(x, 2 * o + 1, cols, s, z, gshift, qmin, qmax);
      q[o] = (unsigned char)((c0 + 8) | ((c1 + 8) << 4));
    } else {
      const int c = qc_eng_int_at<R>(x, o, cols, s, z, gshift, qmin, qmax);
      q[o] = (unsigned char)(P == 8 ? c + 128 : c);
    }
  }
}

template <typename X, typename I>
__global__ void qc_eng_group_minmax_k(const X *x, I ngroups, int gshift, float *lo, float *hi) {
  QC_ENG_LOOP(k, ngroups) qc_eng_group_minmax(x + (k << gshift), (qc_i64)1 << gshift, lo + k, hi + k);
}
