/*
 * formats.cu -- the GPU kernels of the low-precision formats: one generic
 * kernel per kind, instantiated for every family of qc_registry.h's lists by
 * quantcore_gpu/kernels.py (which reads the lists):
 *
 *   qc_enc<Op, T, Q, I, L>   encode families (QC_ENCODE_FAMILIES): x -> codes
 *   qc_dec<Op, T, Q, I, L>   decode families (QC_DECODE_FAMILIES): codes -> y
 *   qc_group<R, I>           group quantization by a recipe of
 *                            QC_GROUP_RECIPES: per group min / max, qparams,
 *                            codes / fake-quant values / mask
 *
 * No formula lives here: the per-element rules are those of qc_formats.h
 * through the families' Ops and the group recipes of qc_groups.h (the CPU extension runs the same), compiled with
 * --fmad=false.  T: float | double; Q: the code type (unsigned char |
 * unsigned short); I: the index type (unsigned int | unsigned long long,
 * 64 bits when n >= 2**31).
 *
 * Parameter layouts (L), element i of the C-contiguous 1-D arrays:
 *   0  per tensor            parameter 0
 *   1  per channel           (i / a) % b of the (outer, C = b, inner = a) view
 *   2  per group             (i / a) * c + (i % a) / b: rows of a = K
 *                            elements, groups of b, c = ceil(K / b) per row
 * Each family's NP parameters come as NP arrays (params[j * P + p], P the
 * parameter count of the layout).
 */
#include "qc_cuda.h"
#include "qc_format_families.h"
#include "qc_groups.h"
#include "qc_mx.h"
#include "qc_minmax.h"

#define QC_FMT_THREADS 256 /* blockDim.x of every kernel here (kernels.py) */

/* The parameter index of element i in layout L. */
template <int L, typename I> __device__ __forceinline__ I qc_param_index(I i, I a, I b, I c) {
  if (L == 1) return (i / a) % b;
  if (L == 2) return (i / a) * c + (i % a) / b;
  return 0;
}

/* Code family op over `in` into `out` (encode: T -> Q codes; decode: Q
 * codes -> T, the code passed as an unsigned), grid-stride; element i
 * takes its parameters at params + qc_param_index<L>(i, a, b, c), np_stride
 * apart.  The mode word goes in hidden from the optimiser (qc_opaque: no
 * per-mode-bit copies of the loop). */
template <int L, class OpT, typename In, typename Out, typename I, typename T>
__device__ __forceinline__ void qc_code_drive(const OpT &op, const In *in, Out *out, I n, I a,
                                              I b, I c, I np_stride,
                                              const T *__restrict__ params) {
  const int m = qc_opaque(op.mode);
  const I nthr = qc_grid_threads<I>();
  for (I i = qc_grid_thread<I>(); i < n; i += nthr) {
    unsigned char k;
    out[i] = (Out)op(in[i], params + qc_param_index<L>(i, a, b, c), (qc_i64)np_stride, m, &k);
  }
}

/* Encode family Op over x into codes. */
template <template <typename> class Op, typename T, typename Q, typename I, int L>
__global__ void qc_enc(const T *x, Q *codes, I n, I a, I b, I c, I np_stride,
                       const T *__restrict__ params, T u0, T u1, int mode) {
  qc_code_drive<L>(Op<T>{u0, u1, mode}, x, codes, n, a, b, c, np_stride, params);
}

/* Decode family Op over codes into y. */
template <template <typename> class Op, typename T, typename Q, typename I, int L>
__global__ void qc_dec(const Q *codes, T *y, I n, I a, I b, I c, I np_stride,
                       const T *__restrict__ params, T u0, T u1, int mode) {
  qc_code_drive<L>(Op<T>{u0, u1, mode}, codes, y, n, a, b, c, np_stride, params);
}

/* The finished (lo, hi) of x[0, n) (qc_minmax.h's NaN / signed-zero rule)
 * in every lane of a warp: each lane folds a stride of the values, the
 * shuffles fold the lanes. */
template <typename I>
__device__ __forceinline__ void qc_warp_range(const float *x, I n, unsigned lane, float *lo,
                                              float *hi) {
  QcMinMax<float> mm;
  mm.init();
  for (I i = lane; i < n; i += 32) mm.add(x[i]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float olo = __shfl_xor_sync(0xffffffffu, mm.lo, off);
    const float ohi = __shfl_xor_sync(0xffffffffu, mm.hi, off);
    const unsigned ofl = __shfl_xor_sync(0xffffffffu, mm.fl, off);
    mm.fold(olo, ohi, ofl);
  }
  *lo = mm.lo;
  *hi = mm.hi;
  qc_minmax_finish(lo, hi, mm.fl);
}

/* One warp per group of g consecutive values along rows of K (the last
 * group of a row may be shorter), grid-stride over the rows * ceil(K / g)
 * groups, row-major: body(group index, offset of its first value, its
 * length) runs in every lane of the group's warp. */
template <typename I, typename F>
__device__ __forceinline__ void qc_warp_per_group(I rows, I K, I g, const F &body) {
  const I ng = (K + g - 1) / g;
  const I ngroups = rows * ng;
  const I warps = (I)gridDim.x * (I)(blockDim.x >> 5);
  for (I grp = (I)blockIdx.x * (I)(blockDim.x >> 5) + (I)(threadIdx.x >> 5); grp < ngroups;
       grp += warps) {
    const I r = grp / ng, j = grp - r * ng;
    const I n = K - j * g < g ? K - j * g : g;
    body(grp, r * K + j * g, n);
  }
}

/* Group quantization by recipe R: one warp per group (grid-stride over the
 * rows * ceil(K / g) groups, row-major).  The lanes reduce the group's
 * (lo, hi, flags) (qc_minmax.h), fold them with butterfly shuffles so that
 * every lane holds the same finished min / max, compute the recipe's
 * qparams, and quantize the group's elements (coalesced).  Outputs as the
 * CPU's group_blocks: scale / zp per group, codes, y, mask (each may be
 * NULL). */
template <class R, typename I>
__global__ void qc_group(const float *x, unsigned char *codes, float *y, unsigned char *mask,
                         float *scale, float *zp, I rows, I K, I g, float qmin, float qmax,
                         int mode) {
  const R rec = {qmin, qmax, qc_opaque(mode)};
  const unsigned lane = threadIdx.x & 31u;
  qc_warp_per_group(rows, K, g, [&](I grp, I start, I n) {
    float lo, hi;
    qc_warp_range(x + start, n, lane, &lo, &hi);
    QcGroupQ gq;
    rec.qparams(lo, hi, &gq);
    if (lane == 0) {
      if (scale) scale[grp] = gq.scale;
      if (zp) zp[grp] = gq.zp;
    }
    for (I i = lane; i < n; i += 32) {
      unsigned char k;
      const float q = qc_group_q(rec, x[start + i], gq, &k);
      if (codes) codes[start + i] = (unsigned char)(int)q;
      if (y) y[start + i] = rec.dq(q, gq);
      if (mask) mask[start + i] = k;
    }
  });
}

/* Block-scaled quantization by recipe R (qc_mx.h: MX, NVFP4): one warp per
 * block, as qc_group (grid-stride over rows * ceil(K / g) blocks): the
 * lanes fold the block's (lo, hi, flags) into its amax (qc_block_amax), R's
 * block() gives the scale code and factors, then the elements' codes and
 * fake-quant values.  Outputs as the CPU's block_scaled: scodes per block,
 * codes and y per element (each may be NULL).  ``range`` (may be NULL):
 * p0 / p1 from the device instead (NVFP4 modelopt's default global scale,
 * with no host synchronisation; also written to ``gout`` when not NULL). */
template <class R, typename I>
__global__ void qc_block_scaled(const float *x, unsigned char *scodes, unsigned char *codes,
                                float *y, I rows, I K, I g, int elem, int mode, float p0,
                                float p1, const float *range, float rdiv, float rmul,
                                float *gout) {
  if (range) { /* a per-tensor scale from x's finished (min, max) on the device:
                * gs = f32(amax / rdiv) (amax: +NaN if either is NaN, else
                * max(|lo|, |hi|)), p0 = f32(rmul * gs), p1 = gs */
    const float lo = range[0], hi = range[1];
    const float a = lo < 0.0f ? -lo : lo, b = hi < 0.0f ? -hi : hi;
    const float gs = (lo != lo || hi != hi) ? nanf("") : (a > b ? a : b) / rdiv;
    p0 = rmul * gs;
    p1 = gs;
    if (gout && blockIdx.x == 0 && threadIdx.x == 0) *gout = gs;
  }
  const R rec = {elem, qc_opaque(mode), p0, p1};
  const unsigned lane = threadIdx.x & 31u;
  qc_warp_per_group(rows, K, g, [&](I blk, I start, I n) {
    float lo, hi;
    qc_warp_range(x + start, n, lane, &lo, &hi);
    QcBlockQ bq;
    rec.block(qc_block_amax(lo, hi), &bq);
    if (lane == 0 && scodes) scodes[blk] = (unsigned char)bq.scode;
    for (I i = lane; i < n; i += 32) {
      const float v = rec.value(x[start + i], bq);
      if (codes) codes[start + i] = (unsigned char)rec.code(v);
      if (y) y[start + i] = rec.fake(v, bq);
    }
  });
}
