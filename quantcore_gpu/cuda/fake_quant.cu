/*
 * fake_quant.cu -- elementwise GPU kernels of quantcore: affine, nudged and
 * amax fake quantization (per tensor and per channel) and the
 * straight-through backward.
 *
 * No formula lives here: every element goes through the one definition in
 * qc_elementwise.h (the CPU extension uses the same header), compiled with
 * --fmad=false so that no multiply-add is contracted.  The kernels only
 * decide which element gets which parameters.
 *
 * Layout: x, y (and the optional uint8 mask) are C-contiguous 1-D arrays of
 * n elements.  Per-channel kernels see them as the C-ordered view
 * (outer, C, inner); element e belongs to channel (e / inner) % C.  Each
 * thread tracks (e % inner, channel) incrementally, so the grid-stride loop
 * does no division per element.
 *
 * Template parameters:
 *   T  float | double                 the compute dtype
 *   I  unsigned int | unsigned long long
 *        the index type; the host picks 64 bits when n >= 2**31
 *   PC (qc_fq_affine_dev only) per channel (true) or per tensor (false)
 *
 * Grid-stride loops; 16-byte vector loads / stores (float4, double2) when x
 * and y are 16-byte aligned and the mask is aligned to the vector width,
 * with a scalar loop for the tail (or the whole array when unaligned).
 * y may alias x.
 */
#include "qc_elementwise.h"

/* ------------------------------------------------------------ helpers */

template <typename T> struct QcVec;
template <> struct QcVec<float> {
  typedef float4 type;          /* 16 bytes of x / y */
  typedef unsigned int mtype;   /* the matching 4 mask bytes */
  enum { V = 4 };
};
template <> struct QcVec<double> {
  typedef double2 type;
  typedef unsigned short mtype;
  enum { V = 2 };
};

/* Overloads that pick the _f32 / _f64 formula by the argument type. */
__device__ __forceinline__ float qc_affine(float x, float s, float inv, float zp, float qmin,
                                           float qmax, int mode, unsigned char *m) {
  return qc_fq_affine_f32(x, s, inv, zp, qmin, qmax, mode, m);
}
__device__ __forceinline__ double qc_affine(double x, double s, double inv, double zp,
                                            double qmin, double qmax, int mode,
                                            unsigned char *m) {
  return qc_fq_affine_f64(x, s, inv, zp, qmin, qmax, mode, m);
}
__device__ __forceinline__ float qc_nudged(float x, float nmin, float nmax, float s, float inv,
                                           float qz, int mode, unsigned char *m) {
  return qc_fq_nudged_f32(x, nmin, nmax, s, inv, qz, mode, m);
}
__device__ __forceinline__ double qc_nudged(double x, double nmin, double nmax, double s,
                                            double inv, double qz, int mode,
                                            unsigned char *m) {
  return qc_fq_nudged_f64(x, nmin, nmax, s, inv, qz, mode, m);
}
__device__ __forceinline__ float qc_amax(float x, float mult, float div, float lo, float hi,
                                         float amax, unsigned char *m) {
  return qc_fq_amax_f32(x, mult, div, lo, hi, amax, m);
}
__device__ __forceinline__ double qc_amax(double x, double mult, double div, double lo,
                                          double hi, double amax, unsigned char *m) {
  return qc_fq_amax_f64(x, mult, div, lo, hi, amax, m);
}
__device__ __forceinline__ float qc_ste(float g, unsigned char m) { return qc_ste_f32(g, m); }
__device__ __forceinline__ double qc_ste(double g, unsigned char m) { return qc_ste_f64(g, m); }

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
  typedef typename QcVec<T>::type VT;
  typedef typename QcVec<T>::mtype MT;
  const int V = QcVec<T>::V;
  const I tid = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  const I nthr = (I)gridDim.x * (I)blockDim.x;
  I start = 0;
  const unsigned long long addr = (unsigned long long)x | (unsigned long long)y;
  if ((addr & 15ull) == 0 && ((unsigned long long)mask & (unsigned long long)(V - 1)) == 0) {
    const I nv = n / (I)V;
    QcChan<I> ch;
    if (PC) ch.init(tid * (I)V, inner, C, nthr * (I)V);
    for (I v = tid; v < nv; v += nthr) {
      union { VT v; T a[V]; } in, out;
      union { MT w; unsigned char b[V]; } mk;
      QcChan<I> cc = ch;
      in.v = reinterpret_cast<const VT *>(x)[v];
#pragma unroll
      for (int k = 0; k < V; k++) {
        out.a[k] = f(in.a[k], PC ? cc.c : (I)0, &mk.b[k]);
        if (PC) cc.next1();
      }
      reinterpret_cast<VT *>(y)[v] = out.v;
      if (mask) reinterpret_cast<MT *>(mask)[v] = mk.w;
      if (PC) ch.advance();
    }
    start = nv * (I)V;
  }
  QcChan<I> ch;
  if (PC) ch.init(start + tid, inner, C, nthr);
  for (I i = start + tid; i < n; i += nthr) {
    unsigned char m;
    T r = f(x[i], PC ? ch.c : (I)0, &m);
    y[i] = r;
    if (mask) mask[i] = m;
    if (PC) ch.advance();
  }
}

/* ------------------------------------------------------------ functors */

/* The affine mode word, hidden from the optimiser at each use: otherwise
 * NVVM unswitches the loops on every mode bit and emits 2**k copies of
 * them (over 200 KB of PTX per kernel).  The branches on the mode are
 * uniform across the grid, so they cost a few instructions per element
 * and no divergence. */
__device__ __forceinline__ int qc_opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

template <typename T> struct QcAffineT {
  T s, inv, zp, qmin, qmax;
  int mode;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I, unsigned char *m) const {
    return qc_affine(x, s, inv, zp, qmin, qmax, qc_opaque(mode), m);
  }
};

template <typename T> struct QcAffineC {
  const T *__restrict__ s;
  const T *__restrict__ inv;
  const T *__restrict__ zp;
  T qmin, qmax;
  int mode;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I c, unsigned char *m) const {
    return qc_affine(x, s[c], inv[c], zp[c], qmin, qmax, qc_opaque(mode), m);
  }
};

template <typename T> struct QcNudgedT {
  T nmin, nmax, s, inv, qz;
  int mode;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I, unsigned char *m) const {
    return qc_nudged(x, nmin, nmax, s, inv, qz, mode, m);
  }
};

template <typename T> struct QcNudgedC {
  const T *__restrict__ nmin;
  const T *__restrict__ nmax;
  const T *__restrict__ s;
  const T *__restrict__ inv;
  const T *__restrict__ qz;
  int mode;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I c, unsigned char *m) const {
    return qc_nudged(x, nmin[c], nmax[c], s[c], inv[c], qz[c], mode, m);
  }
};

template <typename T> struct QcAmaxT {
  T mult, div, lo, hi, amax;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I, unsigned char *m) const {
    return qc_amax(x, mult, div, lo, hi, amax, m);
  }
};

template <typename T> struct QcAmaxC {
  const T *__restrict__ mult;
  const T *__restrict__ div;
  const T *__restrict__ amax;
  T lo, hi;
  template <typename I>
  __device__ __forceinline__ T operator()(T x, I c, unsigned char *m) const {
    return qc_amax(x, mult[c], div[c], lo, hi, amax[c], m);
  }
};

/* ------------------------------------------------------------- kernels */

/* Per-tensor affine fake quant (qc_fq_affine); mask may be NULL. */
template <typename T, typename I>
__global__ void qc_fq_affine_t(const T *x, T *y, unsigned char *mask, I n, T s, T inv, T zp,
                               T qmin, T qmax, int mode) {
  QcAffineT<T> f = {s, inv, zp, qmin, qmax, mode};
  qc_ew_drive<T, I, false>(x, y, mask, n, (I)1, n, f);
}

/* Per-channel affine fake quant of the (n / (C * inner), C, inner) view. */
template <typename T, typename I>
__global__ void qc_fq_affine_c(const T *x, T *y, unsigned char *mask, I n, I C, I inner,
                               const T *__restrict__ s, const T *__restrict__ inv,
                               const T *__restrict__ zp, T qmin, T qmax, int mode) {
  QcAffineC<T> f = {s, inv, zp, qmin, qmax, mode};
  qc_ew_drive<T, I, true>(x, y, mask, n, C, inner, f);
}

/* Affine fake quant with the qparams read from device memory, as written by
 * the fused observer (minmax.cu, qc_minmax_rows / qc_minmax_cols):
 * qp = [scale[C], inv[C], zero_point[C]] in T; C = 1 per tensor (PC false).
 * No host synchronisation between the observer and this kernel. */
template <typename T, typename I, bool PC>
__global__ void qc_fq_affine_dev(const T *x, T *y, unsigned char *mask, I n, I C, I inner,
                                 const T *__restrict__ qp, T qmin, T qmax, int mode) {
  if (PC) {
    QcAffineC<T> f = {qp, qp + C, qp + 2 * C, qmin, qmax, mode};
    qc_ew_drive<T, I, true>(x, y, mask, n, C, inner, f);
  } else {
    QcAffineT<T> f = {qp[0], qp[1], qp[2], qmin, qmax, mode};
    qc_ew_drive<T, I, false>(x, y, mask, n, (I)1, n, f);
  }
}

/* Per-tensor nudged fake quant (qc_fq_nudged). */
template <typename T, typename I>
__global__ void qc_fq_nudged_t(const T *x, T *y, unsigned char *mask, I n, T nmin, T nmax,
                               T s, T inv, T qz, int mode) {
  QcNudgedT<T> f = {nmin, nmax, s, inv, qz, mode};
  qc_ew_drive<T, I, false>(x, y, mask, n, (I)1, n, f);
}

/* Per-channel nudged fake quant. */
template <typename T, typename I>
__global__ void qc_fq_nudged_c(const T *x, T *y, unsigned char *mask, I n, I C, I inner,
                               const T *__restrict__ nmin, const T *__restrict__ nmax,
                               const T *__restrict__ s, const T *__restrict__ inv,
                               const T *__restrict__ qz, int mode) {
  QcNudgedC<T> f = {nmin, nmax, s, inv, qz, mode};
  qc_ew_drive<T, I, true>(x, y, mask, n, C, inner, f);
}

/* Per-tensor amax fake quant (qc_fq_amax). */
template <typename T, typename I>
__global__ void qc_fq_amax_t(const T *x, T *y, unsigned char *mask, I n, T mult, T div, T lo,
                             T hi, T amax) {
  QcAmaxT<T> f = {mult, div, lo, hi, amax};
  qc_ew_drive<T, I, false>(x, y, mask, n, (I)1, n, f);
}

/* Per-channel amax fake quant. */
template <typename T, typename I>
__global__ void qc_fq_amax_c(const T *x, T *y, unsigned char *mask, I n, I C, I inner,
                             const T *__restrict__ mult, const T *__restrict__ div, T lo, T hi,
                             const T *__restrict__ amax) {
  QcAmaxC<T> f = {mult, div, amax, lo, hi};
  qc_ew_drive<T, I, true>(x, y, mask, n, C, inner, f);
}

/* Straight-through backward y = grad * mask (qc_ste); y may alias grad. */
template <typename T, typename I>
__global__ void qc_ste(const T *g, const unsigned char *__restrict__ mask, T *y, I n) {
  typedef typename QcVec<T>::type VT;
  typedef typename QcVec<T>::mtype MT;
  const int V = QcVec<T>::V;
  const I tid = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
  const I nthr = (I)gridDim.x * (I)blockDim.x;
  I start = 0;
  const unsigned long long addr = (unsigned long long)g | (unsigned long long)y;
  if ((addr & 15ull) == 0 && ((unsigned long long)mask & (unsigned long long)(V - 1)) == 0) {
    const I nv = n / (I)V;
    for (I v = tid; v < nv; v += nthr) {
      union { VT v; T a[V]; } in, out;
      union { MT w; unsigned char b[V]; } mk;
      in.v = reinterpret_cast<const VT *>(g)[v];
      mk.w = reinterpret_cast<const MT *>(mask)[v];
#pragma unroll
      for (int k = 0; k < V; k++) out.a[k] = qc_ste(in.a[k], mk.b[k]);
      reinterpret_cast<VT *>(y)[v] = out.v;
    }
    start = nv * (I)V;
  }
  for (I i = start + tid; i < n; i += nthr) y[i] = qc_ste(g[i], mask[i]);
}
