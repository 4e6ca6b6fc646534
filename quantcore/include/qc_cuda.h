/*
 * qc_cuda.h -- device-side helpers shared by the kernels of
 * quantcore_gpu/cuda (CUDA only: NVRTC or the CUDA emulator of
 * tests/cudaemu; the CPU extension does not include it):
 *
 *   qc_opaque        an int hidden from the optimiser (the mode word)
 *   qc_grid_thread   this thread's index in the grid / the grid's thread
 *   qc_grid_threads  count: a grid-stride loop runs i = qc_grid_thread<I>(),
 *                    i += qc_grid_threads<I>()
 *   QcVec<T>         16-byte vector loads of T (float4, double2) and the
 *                    matching mask word; qc_vec_ok says when they apply
 *   qc_mm_warp_fold  the (lo, hi, flags) of QcMinMax folded across lanes
 */
#ifndef QC_CUDA_H
#define QC_CUDA_H

#ifndef __CUDACC__
#error "qc_cuda.h is for the CUDA sources (quantcore_gpu/cuda/*.cu) only"
#endif

#include "qc_minmax.h"

/* The mode word, hidden from the optimiser at each use: otherwise NVVM
 * unswitches the loops on every mode bit and emits 2**k copies of them
 * (over 200 KB of PTX per kernel).  The branches on the mode are uniform
 * across the grid, so they cost a few instructions per element and no
 * divergence. */
__device__ __forceinline__ int qc_opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

/* This thread's index in the (1-D) grid, and the number of threads in it. */
template <typename I> __device__ __forceinline__ I qc_grid_thread() {
  return (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
}
template <typename I> __device__ __forceinline__ I qc_grid_threads() {
  return (I)gridDim.x * (I)blockDim.x;
}

/* 16-byte vector loads / stores of T: `type` holds V values (`lanes` gives
 * them by index), `mtype` the V one-byte mask values of the same elements
 * (`mlanes`). */
template <typename T> struct QcVecTypes;
template <> struct QcVecTypes<float> { typedef float4 type; typedef unsigned int mtype; };
template <> struct QcVecTypes<double> { typedef double2 type; typedef unsigned short mtype; };
template <typename T> struct QcVec {
  typedef typename QcVecTypes<T>::type type;
  typedef typename QcVecTypes<T>::mtype mtype;
  enum { V = sizeof(type) / sizeof(T) };
  static_assert(sizeof(type) == 16 && sizeof(mtype) == V, "QcVec: 16 bytes, a mask byte a value");
  union lanes { type v; T a[V]; };
  union mlanes { mtype w; unsigned char b[V]; };
};

/* Whether arrays of T at x and y (16-byte aligned) and a mask of one byte
 * per element at `mask` (aligned to V bytes) may be read / written by
 * QcVec<T> vectors from their first element; NULL pointers pass. */
template <typename T>
__device__ __forceinline__ bool qc_vec_ok(const void *x, const void *y = 0,
                                          const void *mask = 0) {
  const unsigned long long addr = (unsigned long long)x | (unsigned long long)y;
  return (addr & 15ull) == 0 &&
         ((unsigned long long)mask & (unsigned long long)(QcVec<T>::V - 1)) == 0;
}

/* Fold the (lo, hi, flags) of each segment of `width` lanes (a power of two
 * <= 32) of the warp into the segment's first lane, shuffling down (every
 * lane of the warp must call it). */
template <typename T>
__device__ __forceinline__ void qc_mm_warp_fold(QcMinMax<T> &a, unsigned width = 32u) {
#pragma unroll
  for (unsigned off = width / 2; off > 0; off >>= 1) {
    const T olo = __shfl_down_sync(0xffffffffu, a.lo, off, width);
    const T ohi = __shfl_down_sync(0xffffffffu, a.hi, off, width);
    const unsigned ofl = __shfl_down_sync(0xffffffffu, a.fl, off, width);
    a.fold(olo, ohi, ofl);
  }
}

#endif /* QC_CUDA_H */
