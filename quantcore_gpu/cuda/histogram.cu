/*
 * histogram.cu -- torch.histc counts on the GPU: the bin of every value by
 * qc_histc_bin_f32 (qc_elementwise.h, the CPU kernel's formula), counted
 * with integer atomics, so the counts are exact and do not depend on the
 * launch shape or the order of the atomics.
 *
 * Each block counts into a histogram in shared memory when the bins fit
 * (QC_HIST_SMEM of them), then adds it to the global int64 counts; more
 * bins are counted in global memory directly.  |x| is binned when
 * `absolute`, zeros are left out when `skip_zeros`, NaN and values outside
 * [lo, hi] are not counted.  The range itself (torch's choice and widening
 * rules) is chosen on the host, as on the CPU path.
 */
#include "qc_cuda.h"
#include "qc_elementwise.h"

#define QC_HIST_THREADS 256
#define QC_HIST_SMEM 4096 /* bins counted in shared memory */

/* Count the bin bin_of(v) (an int; < 0: not counted) of every value
 * v = |x[i]| (`absolute`) or x[i], i < n, into counts[bins], grid-stride:
 * into a block histogram in shared memory when the bins fit
 * (QC_HIST_SMEM), added to counts at the end; into counts directly
 * otherwise.  Integer atomics: exact whatever the launch shape. */
template <typename I, typename F>
__device__ __forceinline__ void qc_hist_count(const float *__restrict__ x, I n, int bins,
                                              int absolute, unsigned long long *counts,
                                              const F &bin_of) {
  __shared__ unsigned int s_counts[QC_HIST_SMEM];
  const bool in_shared = bins <= QC_HIST_SMEM;
  if (in_shared)
    for (int b = threadIdx.x; b < bins; b += blockDim.x) s_counts[b] = 0u;
  __syncthreads();
  const I step = qc_grid_threads<I>();
  for (I i = qc_grid_thread<I>(); i < n; i += step) {
    const int b = bin_of(absolute ? fabsf(x[i]) : x[i]);
    if (b < 0) continue;
    if (in_shared)
      atomicAdd(&s_counts[b], 1u);
    else
      atomicAdd(&counts[b], 1ull);
  }
  __syncthreads();
  if (in_shared)
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
      if (s_counts[b]) atomicAdd(&counts[b], (unsigned long long)s_counts[b]);
}

/* torch.histc: the bin of qc_histc_bin_f32, zeros left out when
 * `skip_zeros`. */
template <typename I>
__global__ void __launch_bounds__(QC_HIST_THREADS)
qc_histc(const float *__restrict__ x, I n, float lo, float hi, int bins, int absolute,
         int skip_zeros, unsigned long long *counts) {
  const float fbins = (float)bins;
  qc_hist_count(x, n, bins, absolute, counts, [&](float v) {
    return (skip_zeros && v == 0.0f) ? -1 : qc_histc_bin_f32(v, lo, hi, fbins, bins);
  });
}

/* numpy.histogram's counts of |x| (`absolute`) or x, zeros left out when
 * `skip_zeros`: the bins are edges[0..bins] (non-decreasing, in device
 * memory, as float64: numpy compares float32 data with float64 edges in
 * float64, and float32 edges are exact in it); values outside
 * [edges[0], edges[bins]] (and NaN) are not counted.  Two rules, each
 * numpy's own:
 *   uniform   np.histogram(x, bins=n): the bin of v estimated as
 *             k = int(f32(f32(v - first) / denom) * f32(n)), k == n -> n - 1,
 *             then moved down one if v < edges[k] and up one if
 *             v >= edges[k + 1] (and k != n - 1); first = edges[0] and
 *             denom = f32(edges[n] - edges[0]) as numpy computes them;
 *   edges     np.histogram(x, bins=edges): the bin of v is the last k with
 *             edges[k] <= v (a binary search), v == edges[n] in the last
 *             bin -- numpy's cumulative counting (searchsorted) per value.
 * Counted with integer atomics: exact whatever the launch shape. */
template <typename I>
__global__ void __launch_bounds__(QC_HIST_THREADS)
qc_hist_edges(const float *__restrict__ x, I n, const double *__restrict__ edges, int bins,
              int uniform, float first, float denom, int absolute, int skip_zeros,
              unsigned long long *counts) {
  const double lo = edges[0], hi = edges[bins];
  const float fbins = (float)bins;
  qc_hist_count(x, n, bins, absolute, counts, [&](float v) {
    const double vd = v; /* exact */
    if ((skip_zeros && v == 0.0f) || !(vd >= lo && vd <= hi)) return -1;
    int k;
    if (uniform) {
      const float f = ((v - first) / denom) * fbins;
      k = (int)f;
      if (k == bins) k--;
      if (vd < edges[k]) k--;
      if (vd >= edges[k + 1] && k != bins - 1) k++;
    } else {
      int a = 0, b = bins + 1; /* the number of edges <= v */
      while (a < b) {
        const int mid = (a + b) >> 1;
        if (edges[mid] <= vd)
          a = mid + 1;
        else
          b = mid;
      }
      k = a - 1 < bins ? a - 1 : bins - 1;
    }
    return k;
  });
}
