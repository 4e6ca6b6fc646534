/*
 * qparams.cu -- the qparams schemes of qc_qparams.h on the GPU: statistics
 * already on the device (an observer's state, a compat layer's min / max
 * tensors) become scale / zero point / fake-quant parameters there, with no
 * host synchronisation.  One thread per channel; out[j * C + c] as doubles,
 * as the CPU's qc_qparams_run writes them.
 */
#include "qc_qparams.h"

template <template <typename> class S, typename T>
__global__ void qc_qparams(const T *__restrict__ a, const T *__restrict__ b,
                           unsigned long long C, double qmin, double qmax, double eps,
                           int num_bits, int flags, double *out) {
  const QcQpArgs g = {qmin, qmax, eps, num_bits, flags};
  for (unsigned long long c = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; c < C;
       c += (unsigned long long)gridDim.x * blockDim.x)
    S<T>::apply(a[c], b ? b[c] : (T)0, g, out + c, (qc_i64)C);
}
