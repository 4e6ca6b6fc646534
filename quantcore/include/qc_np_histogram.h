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

#endif /* QC_NP_HISTOGRAM_H */
