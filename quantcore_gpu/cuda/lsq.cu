/*
 * lsq.cu -- the per-element terms of torch's learnable (LSQ) fake-quant
 * backward, the GPU twin of quantcore/compat/torch/lsq.py's _lsq_grads
 * (torch's CPU kernel as compiled, with its FMA contractions; the emulator
 * tests compare the two bit for bit):
 *
 *   inv = 1 / s                                   (float32 division)
 *   xq  = int64(rint(fmaf(x, inv, float(zb))))    x86 conversion: NaN, inf
 *                                                 and out-of-range -> INT64_MIN
 *   in  = qmin <= xq <= qmax,  q = clamp(xq, qmin, qmax)
 *   d   = float(q - zb)        per tensor (zb an integer: int64 difference)
 *       = float(q) - float(zb) per channel (float zero points)
 *   dX  = dY * in
 *   dS  = in ? ((dY * fmaf(d, s, -x)) * inv) * gf
 *            : (dY * (xq < qmin ? d_small : d_big)) * gf
 *   dZ  = in ? 0 : ((-dY) * s) * gf
 *
 * every product rounded to float32 (compiled with --fmad=false; the two
 * fmaf calls are torch's contractions).  d_small / d_big are the d of
 * qmin / qmax.  Element i is in channel (i / inner) % C (C = inner = 1 per
 * tensor); scale and zb hold one value per channel.
 */

__device__ inline long long qc_x86_int64(float v) {
  // cvttss2si: anything outside [-2**63, 2**63), NaN included, gives INT64_MIN
  if (!(v >= -9223372036854775808.0f && v < 9223372036854775808.0f))
    return (long long)(1ull << 63);
  return (long long)v;
}

template <typename I>
__global__ void qc_lsq_grads(const float *dy, const float *x, float *dx, float *ds, float *dz,
                             I n, I C, I inner, const float *__restrict__ scale,
                             const double *__restrict__ zb, long long qmin, long long qmax,
                             float gf, int integer_zero_point) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
    const I c = (i / inner) % C;
    const float s = scale[c];
    const float inv = 1.0f / s;
    const float z32 = (float)zb[c];
    const float xv = x[i], g = dy[i];
    const long long xq = qc_x86_int64(rintf(fmaf(xv, inv, z32)));
    const bool in = xq >= qmin && xq <= qmax;
    const long long q = xq < qmin ? qmin : (xq > qmax ? qmax : xq);
    float d, d_small, d_big;
    if (integer_zero_point) {  // int64 differences, wrapping as numpy's
      const unsigned long long zi = (unsigned long long)(long long)zb[c];
      d = (float)(long long)((unsigned long long)q - zi);
      d_small = (float)(long long)((unsigned long long)qmin - zi);
      d_big = (float)(long long)((unsigned long long)qmax - zi);
    } else {
      d = (float)q - z32;
      d_small = (float)qmin - z32;
      d_big = (float)qmax - z32;
    }
    dx[i] = g * (in ? 1.0f : 0.0f);
    if (in) {
      ds[i] = ((g * fmaf(d, s, -xv)) * inv) * gf;
      dz[i] = 0.0f;
    } else {
      ds[i] = (g * (xq < qmin ? d_small : d_big)) * gf;
      dz[i] = ((-g) * s) * gf;
    }
  }
}
