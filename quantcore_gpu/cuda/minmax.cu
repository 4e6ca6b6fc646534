/*
 * minmax.cu -- one-launch min/max reductions of quantcore, per tensor and per
 * channel, with the flags of qc_cpu_loops.h, and the fused observer +
 * qparams step of FakeQuantize.
 *
 * Two stages in one launch: every block reduces its share to one partial
 * (lo, hi, flags) in global memory, then increments a counter; the block
 * that sees the counter reach gridDim.x - 1 ("the last block") folds the
 * partials of each channel, writes the results and resets the counter to 0
 * so that the next launch on the stream can use it without a memset.
 *
 * The reduction, its flags, the finish rule, the observer update and the
 * qparams are those of qc_minmax.h, which the CPU uses too: lo / hi skip
 * NaN, the flags record NaN, -0.0 and +0.0, and the finished result does
 * not depend on the order of the reduction, so it is bit-identical to the
 * CPU's and deterministic.  The unfinished lo / hi may hold either zero
 * when both occur (the CPU's may too).
 *
 * Layouts of the C-contiguous input, per channel the C-ordered
 * (outer, C, inner) view (per tensor: outer = 1, C = 1, inner = n):
 *   qc_minmax_rows  channel c is `outer` rows of `inner` contiguous values;
 *                   P blocks per channel; partial index c * P + p.
 *   qc_minmax_cols  inner == 1: an (outer, C) matrix; a block reads whole
 *                   row segments (coalesced) for a tile of columns; G row
 *                   groups; partial index g * C + c.
 *   qc_minmax_chan  inner > 1 with little work per channel (outer * inner
 *                   <= QC_MM_CHAN_WORK of kernels.py): a group of up to 32
 *                   threads per channel, one partial per channel.
 *
 * Last-block outputs (any pointer may be NULL):
 *   out_lo, out_hi, out_fl    per channel, finished by finish_mode:
 *                             0 raw, 1 finish, 2 finish ignoring NaN
 *   observer state            st_min, st_max (float32[C]),
 *                             st_cnt = {num_batches, nonfinite_batches} (int64),
 *                             updated by obs_mode (QC_OBS_*) with the
 *                             constants avg_c, avg_d
 *   qparams                   q_scale (float32[C]), q_zp (int64[C]) and
 *                             qp = [scale, 1 / scale, zp] (T[3C]) for
 *                             qc_fq_affine_dev in fake_quant.cu
 * See QC_OBS_* and QC_QS_* in qc_minmax.h for the observer and qparams
 * rules; they are those of quantcore/observers.py and quantcore/qparams.py
 * in float32.
 */
#include "qc_cuda.h"
#include "qc_minmax.h"

#define QC_MM_THREADS 256 /* blockDim.x of the reduction kernels */

/* ------------------------------------------------------------ helpers */

/* Block-wide fold; the result is valid in thread 0.  All threads of the
 * block must call it (it synchronises). */
template <typename T> __device__ __forceinline__ QcMinMax<T> qc_mm_block_reduce(QcMinMax<T> a) {
  __shared__ T s_lo[32];
  __shared__ T s_hi[32];
  __shared__ unsigned s_fl[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const unsigned nwarps = (blockDim.x + 31u) >> 5;
  qc_mm_warp_fold(a);
  if (lane == 0) {
    s_lo[warp] = a.lo;
    s_hi[warp] = a.hi;
    s_fl[warp] = a.fl;
  }
  __syncthreads();
  if (warp == 0) {
    QcMinMax<T> b;
    b.init();
    if (lane < nwarps) b.fold(s_lo[lane], s_hi[lane], s_fl[lane]);
    qc_mm_warp_fold(b);
    a = b;
  }
  __syncthreads();
  return a;
}

/* Arguments of the last block. */
template <typename T> struct QcMMLast {
  T *out_lo;
  T *out_hi;
  unsigned char *out_fl;
  int finish_mode;
  float *st_min;
  float *st_max;
  long long *st_cnt;
  int obs_mode;
  float avg_c, avg_d;
  int qscheme;
  float eps;
  long long qmin, qmax, sym_zp;
  float *q_scale;
  long long *q_zp;
  T *qp;
};

/* The last block: fold the K partials of each channel c (at
 * part[c * sc + k * sk]), then write the outputs of QcMMLast. */
template <typename T>
__device__ void qc_mm_last_block(T *part_lo, T *part_hi, unsigned char *part_fl,
                                 unsigned long long K, unsigned long long sc,
                                 unsigned long long sk, unsigned long long C,
                                 const QcMMLast<T> &a, unsigned int *counter) {
  volatile T *vlo = part_lo;
  volatile T *vhi = part_hi;
  volatile unsigned char *vfl = part_fl;
  const unsigned long long tid = threadIdx.x, bd = blockDim.x;
  /* phase 1: fold each channel's partials into its slot k = 0 */
  if (C <= 4) {
    /* few channels: the whole block folds one channel at a time */
    for (unsigned long long c = 0; c < C; c++) {
      QcMinMax<T> acc;
      acc.init();
      for (unsigned long long k = tid; k < K; k += bd)
        acc.fold(vlo[c * sc + k * sk], vhi[c * sc + k * sk], vfl[c * sc + k * sk]);
      acc = qc_mm_block_reduce(acc);
      if (tid == 0) {
        vlo[c * sc] = acc.lo;
        vhi[c * sc] = acc.hi;
        vfl[c * sc] = (unsigned char)acc.fl;
      }
    }
  } else {
    for (unsigned long long c = tid; c < C; c += bd) {
      QcMinMax<T> acc;
      acc.init();
      for (unsigned long long k = 0; k < K; k++)
        acc.fold(vlo[c * sc + k * sk], vhi[c * sc + k * sk], vfl[c * sc + k * sk]);
      vlo[c * sc] = acc.lo;
      vhi[c * sc] = acc.hi;
      vfl[c * sc] = (unsigned char)acc.fl;
    }
  }
  __syncthreads();
  /* phase 2: outputs; a non-finite batch (a NaN, or an infinite min / max,
   * in any channel) matters to the observer, as on the CPU */
  int local_bad = 0;
  for (unsigned long long c = tid; c < C; c += bd)
    local_bad |= qc_mm_nonfinite((T)vlo[c * sc], (T)vhi[c * sc], vfl[c * sc]);
  const int any_bad = __syncthreads_or(local_bad);
  const int obs = a.obs_mode & QC_OBS_RULE;
  const bool skip = obs != QC_OBS_NONE && any_bad && !(a.obs_mode & QC_OBS_PROPAGATE);
  const long long nb = (obs != QC_OBS_NONE) ? a.st_cnt[0] : 0;
  for (unsigned long long c = tid; c < C; c += bd) {
    T lo = vlo[c * sc], hi = vhi[c * sc];
    const unsigned fl = vfl[c * sc];
    if (a.out_lo) {
      T rlo = lo, rhi = hi;
      if (a.finish_mode)
        qc_minmax_finish(&rlo, &rhi, a.finish_mode == 2 ? (fl & ~(unsigned)QC_MM_NAN) : fl);
      a.out_lo[c] = rlo;
      a.out_hi[c] = rhi;
      if (a.out_fl) a.out_fl[c] = (unsigned char)fl;
    }
    if (obs == QC_OBS_NONE) continue;
    float smin, smax;
    if (!skip) {
      T flo = lo, fhi = hi;
      qc_minmax_finish(&flo, &fhi, fl);
      smin = a.st_min[c];
      smax = a.st_max[c];
      qc_observe_update(a.obs_mode, qc_obs_first(a.obs_mode, nb, smin, smax), a.avg_c, a.avg_d,
                        (float)flo, (float)fhi, &smin, &smax);
      a.st_min[c] = smin;
      a.st_max[c] = smax;
    } else {
      smin = a.st_min[c];
      smax = a.st_max[c];
    }
    if (a.qscheme != QC_QS_NONE && (nb > 0 || !skip)) {
      float scale;
      long long zp;
      qc_qparams(smin, smax, a.qscheme, a.eps, a.qmin, a.qmax, a.sym_zp, &scale, &zp);
      if (a.q_scale) a.q_scale[c] = scale;
      if (a.q_zp) a.q_zp[c] = zp;
      if (a.qp) {
        const T s = (T)scale;
        a.qp[c] = s;
        a.qp[C + c] = (T)1 / s;
        a.qp[2 * C + c] = (T)zp;
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    if (obs != QC_OBS_NONE) {
      if (skip)
        a.st_cnt[1] += 1;
      else
        a.st_cnt[0] += 1;
    }
    *counter = 0u; /* ready for the next launch on this stream */
  }
}

/* Count this block as done; true in every thread of the last block. */
__device__ __forceinline__ bool qc_mm_is_last(unsigned int *counter) {
  __shared__ bool s_last;
  if (threadIdx.x == 0) {
    /* this block's partial before the count: covers thread 0's own writes
     * only (a fence orders the calling thread's writes), so every other
     * thread that wrote a partial fences itself before the __syncthreads
     * that precedes this call (_cols, _chan) */
    __threadfence();
    const unsigned int t = atomicAdd(counter, 1u);
    s_last = (t == gridDim.x - 1u);
  }
  __syncthreads();
  if (s_last) __threadfence(); /* everyone's partials after the count */
  return s_last;
}

#define QC_MM_LAST_PARAMS                                                                  \
  T *out_lo, T *out_hi, unsigned char *out_fl, int finish_mode, float *st_min,             \
      float *st_max, long long *st_cnt, int obs_mode, float avg_c, float avg_d, int qscheme, \
      float eps, long long qmin, long long qmax, long long sym_zp, float *q_scale,          \
      long long *q_zp, T *qp

#define QC_MM_LAST_ARGS                                                                 \
  {out_lo, out_hi, out_fl, finish_mode, st_min, st_max, st_cnt, obs_mode, avg_c, avg_d, \
   qscheme, eps, qmin, qmax, sym_zp, q_scale, q_zp, qp}

/* ------------------------------------------------------------- kernels */

/* Rows layout: grid = C * P blocks of QC_MM_THREADS; block b reduces part
 * p = b % P of channel c = b / P.  Per tensor: outer = 1, C = 1, inner = n.
 * part_* hold C * P partials; counter is 0 on entry and on exit. */
template <typename T, typename I>
__global__ void __launch_bounds__(QC_MM_THREADS)
qc_minmax_rows(const T *__restrict__ x, I outer, I C, I inner, unsigned int P, T *part_lo,
               T *part_hi, unsigned char *part_fl, unsigned int *counter,
               QC_MM_LAST_PARAMS) {
  typedef typename QcVec<T>::type VT;
  const int V = QcVec<T>::V;
  const I c = (I)(blockIdx.x / P), p = (I)(blockIdx.x % P);
  const I tid = (I)threadIdx.x, bd = (I)blockDim.x;
  const I step = (I)P * bd;
  QcMinMax<T> acc;
  acc.init();
  if (outer == 1) {
    /* one contiguous segment per channel */
    const T *base = x + c * inner;
    I start = 0;
    if (qc_vec_ok<T>(base)) {
      const I nv = inner / (I)V;
      const VT *vb = reinterpret_cast<const VT *>(base);
      for (I v = p * bd + tid; v < nv; v += step) {
        typename QcVec<T>::lanes u;
        u.v = vb[v];
#pragma unroll
        for (int k = 0; k < V; k++) acc.add(u.a[k]);
      }
      start = nv * (I)V;
    }
    for (I i = start + p * bd + tid; i < inner; i += step) acc.add(base[i]);
  } else {
    /* j runs over the outer * inner values of the channel: (o, r) = divmod(j, inner) */
    const I total = outer * inner;
    I j = p * bd + tid;
    if (j < total) {
      I o = j / inner, r = j - o * inner;
      const I so = step / inner, sr = step - so * inner;
      for (; j < total; j += step) {
        acc.add(x[(o * C + c) * inner + r]);
        r += sr;
        o += so;
        if (r >= inner) {
          r -= inner;
          o += 1;
        }
      }
    }
  }
  acc = qc_mm_block_reduce(acc);
  if (threadIdx.x == 0) {
    part_lo[blockIdx.x] = acc.lo;
    part_hi[blockIdx.x] = acc.hi;
    part_fl[blockIdx.x] = (unsigned char)acc.fl;
  }
  if (!qc_mm_is_last(counter)) return;
  const QcMMLast<T> last = QC_MM_LAST_ARGS;
  qc_mm_last_block<T>(part_lo, part_hi, part_fl, P, P, 1ull, (unsigned long long)C, last,
                      counter);
}

/* Columns layout (inner == 1): x is (rows, C).  Column tile width TW
 * (min(C, QC_MM_THREADS)), NT = ceil(C / TW) tiles, G row groups:
 * grid = NT * G blocks of QC_MM_THREADS.  Thread t of a block reads column
 * tile * TW + t % TW of the rows g * L + t / TW + k * G * L
 * (L = QC_MM_THREADS / TW lanes), so a warp reads contiguous memory.
 * part_* hold G * C partials. */
template <typename T, typename I>
__global__ void __launch_bounds__(QC_MM_THREADS)
qc_minmax_cols(const T *__restrict__ x, I rows, I C, unsigned int TW, unsigned int NT,
               unsigned int G, T *part_lo, T *part_hi, unsigned char *part_fl,
               unsigned int *counter, QC_MM_LAST_PARAMS) {
  __shared__ T s_lo[QC_MM_THREADS];
  __shared__ T s_hi[QC_MM_THREADS];
  __shared__ unsigned char s_fl[QC_MM_THREADS];
  const unsigned tile = blockIdx.x % NT, g = blockIdx.x / NT;
  const unsigned L = QC_MM_THREADS / TW;
  const unsigned lane = threadIdx.x / TW, colin = threadIdx.x - lane * TW;
  const I col = (I)tile * (I)TW + (I)colin;
  QcMinMax<T> acc;
  acc.init();
  if (lane < L && col < C) {
    const I rstep = (I)G * (I)L;
    for (I r = (I)g * (I)L + (I)lane; r < rows; r += rstep) acc.add(x[r * C + col]);
  }
  s_lo[threadIdx.x] = acc.lo;
  s_hi[threadIdx.x] = acc.hi;
  s_fl[threadIdx.x] = (unsigned char)acc.fl;
  __syncthreads();
  if (lane == 0 && col < C) {
    for (unsigned l = 1; l < L; l++)
      acc.fold(s_lo[l * TW + colin], s_hi[l * TW + colin], s_fl[l * TW + colin]);
    const unsigned long long k = (unsigned long long)g * (unsigned long long)C + col;
    part_lo[k] = acc.lo;
    part_hi[k] = acc.hi;
    part_fl[k] = (unsigned char)acc.fl;
    __threadfence();
  }
  __syncthreads();
  if (!qc_mm_is_last(counter)) return;
  const QcMMLast<T> last = QC_MM_LAST_ARGS;
  qc_mm_last_block<T>(part_lo, part_hi, part_fl, G, 1ull, (unsigned long long)C,
                      (unsigned long long)C, last, counter);
}

/* Channel-group layout, for many channels of little work each (inner > 1,
 * outer * inner small): a group of LANES threads (a power of two <= 32)
 * reduces one channel -- its outer * inner values, j = lane, lane + LANES,
 * ... -- and folds with shuffles within the group; a block holds
 * QC_MM_THREADS / LANES groups and strides over the channels.  One partial
 * per channel (part_*[c]), so the last block folds K = 1. */
template <typename T, typename I>
__global__ void __launch_bounds__(QC_MM_THREADS)
qc_minmax_chan(const T *__restrict__ x, I outer, I C, I inner, unsigned int LANES,
               T *part_lo, T *part_hi, unsigned char *part_fl, unsigned int *counter,
               QC_MM_LAST_PARAMS) {
  const unsigned lane = threadIdx.x % LANES, group = threadIdx.x / LANES;
  const I groups = (I)(QC_MM_THREADS / LANES);
  const I work = outer * inner;
  /* the loop bound is uniform across the block: every thread takes part in
   * every shuffle */
  for (I base = (I)blockIdx.x * groups; base < C; base += (I)gridDim.x * groups) {
    const I c = base + (I)group;
    QcMinMax<T> acc;
    acc.init();
    if (c < C) {
      for (I j = lane; j < work; j += LANES) {
        const I o = j / inner, r = j - o * inner;
        acc.add(x[(o * C + c) * inner + r]);
      }
    }
    qc_mm_warp_fold(acc, LANES);
    if (lane == 0 && c < C) {
      part_lo[c] = acc.lo;
      part_hi[c] = acc.hi;
      part_fl[c] = (unsigned char)acc.fl;
      __threadfence(); /* this writer's partial before the block is counted (as _cols) */
    }
  }
  __syncthreads();
  if (!qc_mm_is_last(counter)) return;
  const QcMMLast<T> last = QC_MM_LAST_ARGS;
  qc_mm_last_block<T>(part_lo, part_hi, part_fl, 1ull, 1ull, 1ull, (unsigned long long)C, last,
                      counter);
}

/* In place: qc_minmax_finish on n (lo, hi, flags) triples. */
template <typename T>
__global__ void qc_minmax_finish_all(T *lo, T *hi, const unsigned char *__restrict__ fl,
                                 unsigned long long n) {
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    T a = lo[i], b = hi[i];
    qc_minmax_finish(&a, &b, fl[i]);
    lo[i] = a;
    hi[i] = b;
  }
}
