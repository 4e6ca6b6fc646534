/*
 * fake_quant.cu -- the elementwise GPU kernels of quantcore: every family of
 * QC_EW_FAMILIES (qc_registry.h: affine, nudged, amax of qc_families.h,
 * fp8 of qc_format_families.h) through one generic kernel,
 * and the straight-through backward.
 *
 * No formula lives here: every element goes through the one definition in
 * qc_elementwise.h by its family's Op (the CPU extension uses the same
 * headers), compiled with --fmad=false so that no multiply-add is
 * contracted.  The kernels only decide which element gets which parameters.
 *
 * Layout: x, y (and the optional uint8 mask) are C-contiguous 1-D arrays of
 * n elements.  Per-channel kernels see them as the C-ordered view
 * (outer, C, inner); element e belongs to channel (e / inner) % C.  Each
 * thread tracks (e % inner, channel) incrementally, so the grid-stride loop
 * does no division per element.
 *
 * Template parameters of qc_ew:
 *   Op  an elementwise family (QcAffineOp, ...)
 *   T   float | double                 the compute dtype
 *   I   unsigned int | unsigned long long
 *        the index type; the host picks 64 bits when n >= 2**31
 *   PC  per channel (true) or per tensor (false)
 *
 * Grid-stride loops; 16-byte vector loads / stores (float4, double2) when x
 * and y are 16-byte aligned and the mask is aligned to the vector width,
 * with a scalar loop for the tail (or the whole array when unaligned).
 * y may alias x.
 */
#include "qc_cuda.h"
#include "qc_families.h"
#include "qc_format_families.h"

/* ------------------------------------------------------------ helpers */

/* Position of element e in the (outer, C, inner) view: r = e % inner and
 * c = (e / inner) % C, advanced without division. */
template <typename I> struct QcChan {
  I r, c, inner, C, dr, dc;
  /* start at element e; `step` elements per advance() */
  __device__ __forceinline__ void init(I e, I inner_, I C_, I step) {
    inner = inner_;
    C = C_;
    I q = e / inner;
    r = e - q * inner;
    c = q % C;
    I sq = step / inner;
    dr = step - sq * inner;
    dc = sq % C;
  }
  /* one element forward */
  __device__ __forceinline__ void next1() {
    if (++r == inner) {
      r = 0;
      if (++c == C) c = 0;
    }
  }
  /* `step` elements forward */
  __device__ __forceinline__ void advance() {
    I carry = 0;
    r += dr;
    if (r >= inner) {
      r -= inner;
      carry = 1;
    }
    c += dc + carry; /* < 2C */
    if (c >= C) c -= C;
  }
};

/* Apply f(x_e, channel_e, &mask_e) to every element: grid-stride, vector
 * loads when aligned, scalar tail.  C / inner are used only when PC. */
template <typename T, typename I, bool PC, typename F>
__device__ __forceinline__ void qc_ew_drive(const T *x, T *y, unsigned char *mask, I n, I C,
                                            I inner, const F &f) {
  typedef QcVec<T> Vec;
  const I tid = qc_grid_thread<I>(), nthr = qc_grid_threads<I>();
  const I nv = qc_vec_ok<T>(x, y, mask) ? n / (I)Vec::V : (I)0; /* vectors, then the tail */
  QcChan<I> vch;
  if (PC) vch.init(tid * (I)Vec::V, inner, C, nthr * (I)Vec::V);
  for (I v = tid; v < nv; v += nthr) {
    typename Vec::lanes in, out;
    typename Vec::mlanes mk;
    QcChan<I> cc = vch;
    in.v = reinterpret_cast<const typename Vec::type *>(x)[v];
#pragma unroll
    for (int k = 0; k < Vec::V; k++) {
      out.a[k] = f(in.a[k], PC ? cc.c : (I)0, &mk.b[k]);
      if (PC) cc.next1();
    }
    reinterpret_cast<typename Vec::type *>(y)[v] = out.v;
    if (mask) reinterpret_cast<typename Vec::mtype *>(mask)[v] = mk.w;
    if (PC) vch.advance();
  }
  QcChan<I> ch;
  if (PC) ch.init(nv * (I)Vec::V + tid, inner, C, nthr);
  for (I i = nv * (I)Vec::V + tid; i < n; i += nthr) {
    unsigned char m;
    T r = f(x[i], PC ? ch.c : (I)0, &m);
    y[i] = r;
    if (mask) mask[i] = m;
    if (PC) ch.advance();
  }
}

/* ------------------------------------------------------------- kernels */

/* Per channel: channel c's parameters at params[j * C + c]. */
template <class OpT, typename T> struct QcEwChannels {
  OpT op;
  const T *__restrict__ params;
  qc_i64 C;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I c, unsigned char *m) const {
    return op(x, params + c, C, qc_opaque(op.mode), m);
  }
};

/* Per tensor: the parameters in registers. */
template <class OpT, typename T> struct QcEwTensor {
  OpT op;
  T p[5];
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I, unsigned char *m) const {
    return op(x, p, 1, qc_opaque(op.mode), m);
  }
};

/* Family Op over x into y (and the mask): per channel (PC) with the
 * parameters in device memory, params[j * C + c]; per tensor with them in
 * device memory (params[j], as written by the fused observer of minmax.cu:
 * no host synchronisation between the two) or, when params is NULL, as the
 * arguments p0..p4.  (u0, u1, mode): the family's uniform parameters. */
template <template <typename> class Op, typename T, typename I, bool PC>
__global__ void qc_ew(const T *x, T *y, unsigned char *mask, I n, I C, I inner,
                      const T *__restrict__ params, T p0, T p1, T p2, T p3, T p4, T u0, T u1,
                      int mode) {
  const Op<T> op = {u0, u1, mode};
  if (PC) {
    const QcEwChannels<Op<T>, T> f = {op, params, (qc_i64)C};
    qc_ew_drive<T, I, true>(x, y, mask, n, C, inner, f);
  } else {
    QcEwTensor<Op<T>, T> f = {op, {p0, p1, p2, p3, p4}};
    if (params)
      for (int j = 0; j < (int)Op<T>::NP; j++) f.p[j] = params[j];
    qc_ew_drive<T, I, false>(x, y, mask, n, (I)1, n, f);
  }
}

/* Straight-through backward y = grad * mask (qc_ste); y may alias grad. */
template <typename T, typename I>
__global__ void qc_ste(const T *g, const unsigned char *__restrict__ mask, T *y, I n) {
  typedef QcVec<T> Vec;
  const I tid = qc_grid_thread<I>(), nthr = qc_grid_threads<I>();
  const I nv = qc_vec_ok<T>(g, y, mask) ? n / (I)Vec::V : (I)0; /* vectors, then the tail */
  for (I v = tid; v < nv; v += nthr) {
    typename Vec::lanes in, out;
    typename Vec::mlanes mk;
    in.v = reinterpret_cast<const typename Vec::type *>(g)[v];
    mk.w = reinterpret_cast<const typename Vec::mtype *>(mask)[v];
#pragma unroll
    for (int k = 0; k < Vec::V; k++) out.a[k] = qc_ste(in.a[k], mk.b[k]);
    reinterpret_cast<typename Vec::type *>(y)[v] = out.v;
  }
  for (I i = nv * (I)Vec::V + tid; i < n; i += nthr) y[i] = qc_ste(g[i], mask[i]);
}
