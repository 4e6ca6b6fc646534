/*
 * exact.cu -- PyTorch's affine fake quant with its integer steps done
 * exactly (qc_fq_affine_exact of qc_elementwise.h: zero points and ranges of
 * int32 size, beyond what float32 holds), the GPU twin of the CPU's
 * fq_affine_exact.  The formula lives in the header; this is a plain
 * grid-stride loop over the C-ordered (outer, C, inner) view, element i in
 * channel (i / inner) % C (a division per element: this recipe is rare).
 * y may alias x.
 */
#include "qc_elementwise.h"

template <typename T, typename I>
__global__ void qc_affine_exact(const T *x, T *y, unsigned char *mask, I n, I C, I inner,
                                const T *__restrict__ scale, const T *__restrict__ inv,
                                const double *__restrict__ zp, double qmin, double qmax,
                                int mode) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
    const I c = (i / inner) % C;
    unsigned char m;
    const T r = qc_fq_affine_exact(x[i], scale[c], inv[c], zp[c], qmin, qmax, mode, &m);
    y[i] = r;
    if (mask) mask[i] = m;
  }
}
