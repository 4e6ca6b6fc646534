/*
 * gguf.cu -- llama.cpp's GGUF block types on the GPU: the row quantizers
 * and dequantizers of include/qc_gguf.h (the CPU's: ggml's scalar order,
 * the same bytes), one row a thread in grid-stride loops; the CPU twin is
 * quantcore/_cpu/_gguf.pyx.  Rows are independent (a row's imatrix weights
 * and sigma^2 are its own), so the bytes do not depend on the launch.
 *
 *   qc_gg_rows_k<ID, I>   y[r] = the blocks of row r of x (rows x n float32),
 *                         row_bytes each; qw: the imatrix (n) or NULL
 *   qc_gg_dq_rows_k<I>    x[r] = row r of y dequantized (type id at run time)
 */
#include "qc_gguf.h"

template <int ID, typename I>
__global__ void qc_gg_rows_k(const float *x, const float *qw, unsigned char *y, I rows, I n,
                             I row_bytes) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I r = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; r < rows; r += step)
    qc_gg_quantize_row<ID>(x + r * n, qw, y + r * row_bytes, (int64_t)n);
}

template <typename I>
__global__ void qc_gg_dq_rows_k(int id, const unsigned char *y, float *x, I rows, I n,
                                I row_bytes) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I r = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; r < rows; r += step)
    qc_gg_dequantize(id, y + r * row_bytes, x + r * n, (int64_t)n);
}
