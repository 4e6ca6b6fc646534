/*
 * qc_np_histogram.h -- the bin of one value as numpy.histogram computes it.
 *
 * Self-contained: plain C99 that also compiles as CUDA C++ (static inline
 * functions, no globals, no libc beyond <math.h>).  Used by the CPU module
 * quantcore/_cpu/_hist.pyx; onnxruntime's calibrators call np.histogram, and
 * quantcore.compat.onnxruntime reproduces their counts with these formulas.
 *
 * Numerical contract: every float operation rounds once in the order
 * written; the build uses -ffp-contract=off (no FMA contraction).
 *
 * 1. Integer bin count and a range (numpy 2.x, `_histograms_impl.py`): the
 *    "uniform bins" path.  With `first`, `last` the range (float32), `n` the
 *    bin count and `edges` = np.linspace(first, last, n + 1) in float32:
 *      x is dropped unless first <= x <= last (NaN is dropped);
 *      f   = f32(f32(f32(x - first) / f32(last - first)) * f32(n));
 *      i   = (int64) f, and i == n becomes n - 1;
 *      i  -= 1 if x <  edges[i];
 *      i  += 1 if x >= edges[i + 1] and i != n - 1.
 *    One estimate, one correction each way, exactly as numpy does it (the
 *    corrections compare in float32 against the float32 edges).
 *
 * 2. Explicit, non-decreasing edges (the sort + searchsorted path):
 *    bin i counts e[i] <= x < e[i + 1], the last bin also x == e[n]; values
 *    below e[0], above e[n], and NaN are dropped.  With duplicate edges the
 *    bin is the largest i with e[i] <= x (what numpy's difference of
 *    searchsorted counts gives).  Comparisons are in double: a float32 x is
 *    exact in double, so float32 edges compare as numpy compares them in
 *    float32 and float64 edges as numpy compares in float64.
 *
 * 3. The CPU counting loops over many values (not in CUDA code):
 *    quantcore/_cpu/qc_hist_loops.cpp compiles them once per SIMD build
 *    (qc_hist_builds.h), _hist.pyx runs them on each thread's share.
 */
#ifndef QC_NP_HISTOGRAM_H
#define QC_NP_HISTOGRAM_H

#include <stdint.h>

#ifdef __CUDACC__
#define QC_NPH_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#if defined(__GNUC__)
#define QC_NPH_HD static inline __attribute__((always_inline))
#else
#define QC_NPH_HD static inline
#endif
#endif

/* numpy's float32 estimate f32(f32(f32(x - first) / denom) * fn) of the
 * bin of x (step 1; no branch, so a loop of it vectorises).  `denom` =
 * f32(last - first), `fn` = f32(n). */
QC_NPH_HD float qc_np_hist_uniform_estimate_f32(float x, float first, float denom, float fn) {
  return ((x - first) / denom) * fn;
}

/* numpy's integer bin of a counted value from its estimate `f` (0 <= f <=
 * n): the truncation, clamped to [0, n - 1] (numpy: index n -> n - 1).
 * Selects only, so a loop of it vectorises; int32 (n < 2**31). */
QC_NPH_HD int32_t qc_np_hist_uniform_index_f32(float f, int32_t n) {
  int32_t i = (int32_t)f;
  i = i > n - 1 ? n - 1 : i;
  return i < 0 ? 0 : i;
}

/* The bin of a counted value straight from its estimate `f` when f lies
 * more than `margin` (a fraction of a bin) inside a bin, else -1.  With
 * margin at least twice the error of f plus the distance of the float32
 * edges from their exact positions (both in bins), numpy's corrections
 * cannot fire there (_hist.pyx computes it per call).  Vectorises. */
QC_NPH_HD int32_t qc_np_hist_uniform_sure_index_f32(float f, float margin) {
  int32_t i = (int32_t)f;
  float frac = f - (float)i;     /* exact: 0 <= f < 2**24 */
  return (frac > margin) & (frac < 1.0f - margin) ? i : -1;
}

/* numpy's two corrections of index `i` of a counted value x against the
 * float32 edges (n + 1 values): one down when x < edges[i], one up when
 * x >= edges[i + 1] and i is not the last bin. */
QC_NPH_HD int64_t qc_np_hist_uniform_correct_f32(float x, int64_t i, int64_t n, const float *edges) {
  if (x < edges[i]) i -= 1;
  if (i < 0) i = 0;              /* cannot happen for x >= first = edges[0]; kept safe */
  if (i != n - 1 && x >= edges[i + 1]) i += 1;
  return i;
}

/* numpy.histogram(a, n, range=(first, last)) bin of a float32 value, or -1
 * when it is not counted (NaN, out of range): the three steps above. */
QC_NPH_HD int64_t qc_np_hist_uniform_bin_f32(float x, float first, float last, float denom,
                                             float fn, int64_t n, const float *edges) {
  if (!(x >= first && x <= last)) return -1;
  float f = qc_np_hist_uniform_estimate_f32(x, first, denom, fn);
  return qc_np_hist_uniform_correct_f32(x, qc_np_hist_uniform_index_f32(f, (int32_t)n), n, edges);
}

/* numpy.histogram(a, bins=edges) bin of a float32 value among the n bins of
 * the non-decreasing float64 `edges` (n + 1 values), or -1.  `guess` is any
 * starting index in [0, n - 1]; the walk makes the result exact whatever it
 * is (a close guess makes it O(1)). */
QC_NPH_HD int64_t qc_np_hist_edges_bin(double x, const double *edges, int64_t n, int64_t guess) {
  if (!(x >= edges[0] && x <= edges[n])) return -1;
  if (x == edges[n]) return n - 1;
  int64_t i = guess < 0 ? 0 : (guess > n - 1 ? n - 1 : guess);
  while (i > 0 && x < edges[i]) i -= 1;
  while (i < n - 1 && x >= edges[i + 1]) i += 1;
  return i;
}

#ifndef __CUDACC__
/* Values per round of qc_np_hist_uniform_count_f32 (their bins on the
 * stack) and its interleaved histograms (a power of two). */
#define QC_NPH_CHUNK 256
#define QC_NPH_SUB 4

/* Count `cnt` float32 values (|x| with `absolute`) as numpy.histogram(x, n,
 * range=(first, last)) does (rule 1; `denom` = f32(last - first), `fn` =
 * f32(n), `edges` numpy's float32 edges) into QC_NPH_SUB interleaved
 * histograms of n + 1 int64 bins at `counts` (the bins of value k go to
 * histogram k % QC_NPH_SUB, so consecutive values of one bin do not wait
 * on each other's increment; bin n takes the values not counted, so that
 * skipping them is not a branch).  Per round of QC_NPH_CHUNK values, in a
 * branch-free loop that vectorises: each value's bin straight from numpy's
 * float32 estimate where that lies more than `margin` inside a bin,
 * `zero_bin` (numpy's bin of 0, or -1 when 0 is not counted) for a zero
 * (often an edge: (-t, t) in an even number of bins; a ReLU's output is
 * half zeros), n when it is not counted (NaN, out of range), else -1.
 * Only a round with a -1 (a value near an edge) is walked again, to give
 * those values numpy's corrections; then the counts. */
static inline void qc_np_hist_uniform_count_f32(const float *xp, int64_t cnt, float first,
                                                float last, float denom, float fn, int64_t n,
                                                const float *edges, float margin,
                                                int32_t zero_bin, int absolute,
                                                int64_t *counts) {
  int32_t bins[QC_NPH_CHUNK];
  int32_t n32 = (int32_t)n;
  int64_t *c0 = counts, *c1 = c0 + (n + 1), *c2 = c1 + (n + 1), *c3 = c2 + (n + 1);
  for (int64_t base = 0; base < cnt; base += QC_NPH_CHUNK) {
    int64_t m = cnt - base < QC_NPH_CHUNK ? cnt - base : QC_NPH_CHUNK, k;
    const float *vals = xp + base;
    int32_t unsure = 0;
    for (k = 0; k < m; k++) {
      float v = absolute ? fabsf(vals[k]) : vals[k];
      int32_t i = qc_np_hist_uniform_sure_index_f32(
          qc_np_hist_uniform_estimate_f32(v, first, denom, fn), margin);
      i = v == 0 ? zero_bin : i;
      i = (v >= first) & (v <= last) ? i : n32;
      bins[k] = i;
      unsure |= i;
    }
    if (unsure < 0) {
      for (k = 0; k < m; k++) {
        if (bins[k] < 0) {
          float v = absolute ? fabsf(vals[k]) : vals[k];
          float f = qc_np_hist_uniform_estimate_f32(v, first, denom, fn);
          bins[k] = (int32_t)qc_np_hist_uniform_correct_f32(
              v, qc_np_hist_uniform_index_f32(f, n32), n, edges);
        }
      }
    }
    for (k = 0; k + QC_NPH_SUB <= m; k += QC_NPH_SUB) {
      c0[bins[k]] += 1;
      c1[bins[k + 1]] += 1;
      c2[bins[k + 2]] += 1;
      c3[bins[k + 3]] += 1;
    }
    for (; k < m; k++) c0[bins[k]] += 1;
  }
}

/* Count `cnt` float32 values (|x| with `absolute`) among the n bins of the
 * non-decreasing float64 `edges` (rule 2) into `counts` (n int64 bins);
 * `inv_width` = n / (edges[n] - edges[0]) (0 when that is not positive)
 * places the walk's start. */
static inline void qc_np_hist_edges_count_f32(const float *xp, int64_t cnt, const double *edges,
                                              int64_t n, double inv_width, int absolute,
                                              int64_t *counts) {
  for (int64_t k = 0; k < cnt; k++) {
    double v = absolute ? fabsf(xp[k]) : xp[k];
    double g = (v - edges[0]) * inv_width;  /* a starting point only; the walk is exact */
    int64_t guess = g >= 0 && g < n ? (int64_t)g : (g >= 0 ? n - 1 : 0);
    int64_t b = qc_np_hist_edges_bin(v, edges, n, guess);
    if (b >= 0) counts[b] += 1;
  }
}
/* The least and the greatest float32 bit pattern without its sign bit
 * (|x|'s pattern: for those, non-negative int32, the integer order is the
 * float order, NaNs above +inf) of `cnt` values, into out[0] and out[1]
 * (0x7fffffff and 0 for none): min |x| and whether a NaN occurs (out[1] >
 * 0x7f800000).  QC_NPH_LANES running minima and maxima side by side, a loop
 * that vectorises. */
#define QC_NPH_LANES 16
static inline void qc_np_abs_bits_range(const uint32_t *xp, int64_t cnt, int32_t *out) {
  int32_t low[QC_NPH_LANES], high[QC_NPH_LANES];
  int32_t m = 0x7fffffff, h = 0;
  int64_t body = cnt - cnt % QC_NPH_LANES, k;
  int j;
  for (j = 0; j < QC_NPH_LANES; j++) {
    low[j] = 0x7fffffff;
    high[j] = 0;
  }
  for (k = 0; k < body; k += QC_NPH_LANES) {
    for (j = 0; j < QC_NPH_LANES; j++) {
      int32_t v = (int32_t)(xp[k + j] & 0x7fffffffu);
      low[j] = v < low[j] ? v : low[j];
      high[j] = v > high[j] ? v : high[j];
    }
  }
  for (j = 0; j < QC_NPH_LANES; j++) {
    m = low[j] < m ? low[j] : m;
    h = high[j] > h ? high[j] : h;
  }
  for (k = body; k < cnt; k++) {
    int32_t v = (int32_t)(xp[k] & 0x7fffffffu);
    m = v < m ? v : m;
    h = v > h ? v : h;
  }
  out[0] = m;
  out[1] = h;
}
#endif /* !__CUDACC__ */

#endif /* QC_NP_HISTOGRAM_H */
