/*
 * convert.cu -- the few array operations quantcore's Python code needs on
 * device data, compiled with the project's options instead of CuPy's.
 *
 * CuPy compiles its own operations (astype, +, *, /, ...) with -ftz=true
 * (cupy/cuda/compiler.py), so there a float32 subnormal operand or result
 * becomes a zero of its sign; numpy keeps it.  These kernels do the same
 * operations with gradual underflow (--ftz=false), one IEEE rounding each,
 * so device results equal numpy's bit for bit:
 *
 *   qc_convert:    y[i] = To(x[i])                      (numpy's astype)
 *   qc_channel_op: y[i] = a[i] OP b[(i / inner) % C]    OP: 0 a - b, 1 a * b,
 *                                                       2 a / b, 3 b / a
 *
 * Contiguous 1-D arrays; b broadcasts per channel (C = 1: one value; b
 * NULL: the scalar b0).
 * y may alias a.
 */

template <typename From, typename To, typename I>
__global__ void qc_convert(const From *x, To *y, I n) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step)
    y[i] = (To)x[i];
}

template <typename T, typename I>
__global__ void qc_channel_op(const T *a, const T *__restrict__ b, T b0, T *y, I n, I C,
                              I inner, int op) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
    const T u = a[i];
    const T v = b == nullptr ? b0 : b[C == 1 ? (I)0 : (i / inner) % C];
    T r;
    switch (op) {
      case 0: r = u - v; break;
      case 1: r = u * v; break;
      case 2: r = u / v; break;
      default: r = v / u; break;
    }
    y[i] = r;
  }
}
