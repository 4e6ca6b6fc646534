/*
 * reduce.cu -- sums in NumPy's order, so that a device sum equals the CPU
 * path's ``numpy.sum`` bit for bit.
 *
 * NumPy sums a contiguous row of n values (``a.sum()``, ``a.sum(axis=-1)``,
 * with the accumulator type of the input: no cast) as ``0 + pairwise(a, n)``:
 *
 *   pairwise(a, n) = n < 8:     ((0 + a[0]) + a[1]) + ...            in order
 *                    n <= 128:  eight running sums r[j] += a[i + j] over the
 *                               first n - n % 8 values, then
 *                               ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)),
 *                               then the last n % 8 values in order
 *                    otherwise: pairwise(a, h) + pairwise(a + h, n - h),
 *                               h = n / 2 rounded down to a multiple of 8
 *
 * A sum over the leading axis of a (rows, d) array, d > 1, is a running sum
 * per column: ``out[c] = ((0 + a[0, c]) + a[1, c]) + ...``.
 *
 * The pairwise tree depends on n only.  On the device a block sums a
 * subtree of at most QC_PW_SUB levels from shared memory (qc_pw_subtrees:
 * coalesced loads, 8 threads a leaf); a row whose tree is deeper has one
 * such block per node at depth split = depth - QC_PW_SUB, and qc_pw_top adds
 * the levels above in one block per row: two launches at most.  Nodes are
 * named by their path from the root (a 1 bit: right child); a leaf above
 * the depth asked for stands at its all-left path.
 *
 * T: the input type; Acc: the accumulator (float, or double for a float32
 * input NumPy sums after ``astype(float64)``).  Additions only: nothing to
 * contract.
 */

template <typename I>
__device__ inline I qc_pw_half(I n) {
  const I h = n / 2;
  return h - h % 8;
}

/* The node at `depth` levels below the root of a row of n along `path`
 * (most significant of the `depth` bits first): its offset and length, and
 * false when a leaf above that depth ends the path (no node there: the
 * remaining bits are not all 0) or when the node is a leaf already summed
 * above (`internal_only`). */
template <typename I>
__device__ inline bool qc_pw_node(I n, int depth, unsigned long long path, bool internal_only,
                                  I *off, I *len) {
  I o = 0, m = n;
  for (int k = 0; k < depth; ++k) {
    if (m <= 128) {
      if (internal_only) return false;
      *off = o;
      *len = m;
      return (path & ((1ull << (depth - k)) - 1)) == 0;
    }
    const I h = qc_pw_half(m);
    if ((path >> (depth - 1 - k)) & 1ull) {
      o += h;
      m -= h;
    } else {
      m = h;
    }
  }
  *off = o;
  *len = m;
  return !(internal_only && m <= 128);
}

#define QC_PW_SUB 5                        /* tree levels one block sums */
#define QC_PW_LEAVES (1 << QC_PW_SUB)       /* leaves of such a subtree: 32 */
#define QC_PW_THREADS (QC_PW_LEAVES * 8)    /* 8 threads a leaf: 256 */
#define QC_PW_SPAN (128 << QC_PW_SUB)       /* values of such a subtree, at most */

/* One block per node at depth `split` of a row's tree (rows << split
 * nodes; a path that ends early at a leaf above that depth has no node):
 * the block sums the node's subtree, at most QC_PW_SUB levels deep, so at
 * most QC_PW_SPAN values (a node of more than 128 << k values is more than
 * k levels deep).
 *  1. The node's values are staged in shared memory, consecutive threads
 *     reading consecutive addresses (coalesced).
 *  2. Each leaf (<= 128 values, slot = its path below the node, a leaf
 *     above the deepest level at its all-left path) is summed by 8 threads
 *     as NumPy does: thread j runs the partial sum r[j] += a[i + j] over
 *     the first n - n % 8 values; its first thread combines
 *     ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) and adds the last
 *     n % 8 values in order (a leaf of n < 8: ((0 + a[0]) + a[1]) + ...).
 *  3. The subtree's levels add their children's sums, deepest first, in
 *     shared memory.
 * The node's sum goes to slots[row << split | path], or, when split == 0
 * (the whole row is the subtree), out[row] = 0 + sum. */
template <typename Acc, typename T, typename I>
__global__ void __launch_bounds__(QC_PW_THREADS)
qc_pw_subtrees(const T *x, Acc *slots, Acc *out, I rows, I n, int split) {
  __shared__ T sx[QC_PW_SPAN];
  __shared__ Acc part[QC_PW_LEAVES][8];
  __shared__ Acc sums[QC_PW_LEAVES];
  const unsigned tid = threadIdx.x, leaf = tid >> 3, j = tid & 7;
  const unsigned long long per_row = 1ull << split;
  const unsigned long long nodes = (unsigned long long)rows * per_row;
  for (unsigned long long t = blockIdx.x; t < nodes; t += gridDim.x) {  /* block-uniform */
    const unsigned long long path = t & (per_row - 1);
    I off, len;
    if (!qc_pw_node<I>(n, split, path, false, &off, &len)) continue;
    const T *src = x + (I)(t >> split) * n + off;
    for (I i = (I)tid; i < len; i += (I)QC_PW_THREADS) sx[i] = src[i];
    __syncthreads();
    I loff, llen;
    const bool has = qc_pw_node<I>(len, QC_PW_SUB, leaf, false, &loff, &llen);
    const I body = has ? llen - llen % 8 : (I)0;
    if (has && llen >= 8) {
      Acc r = (Acc)sx[loff + j];
      for (I i = (I)8 + (I)j; i < body; i += 8) r += (Acc)sx[loff + i];
      part[leaf][j] = r;
    }
    __syncthreads();
    if (has && j == 0) {
      Acc res;
      I i = 0;
      if (llen < 8) {
        res = (Acc)0;
      } else {
        const Acc *r = part[leaf];
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        i = body;
      }
      for (; i < llen; ++i) res += (Acc)sx[loff + i];
      sums[leaf] = res;
    }
    __syncthreads();
    for (int level = QC_PW_SUB - 1; level >= 0; --level) {
      I o, m;
      if (tid < (1u << level) && qc_pw_node<I>(len, level, tid, true, &o, &m)) {
        const unsigned left = tid << (QC_PW_SUB - level);
        sums[left] = sums[left] + sums[left | (1u << (QC_PW_SUB - level - 1))];
      }
      __syncthreads();
    }
    if (tid == 0) {
      if (split == 0) out[t] = (Acc)0 + sums[0];
      else slots[t] = sums[0];
    }
    __syncthreads();  /* the shared arrays are reused by the next node */
  }
}

/* The levels above `split`: one block per row adds, level by level
 * (deepest first, a barrier between levels), each internal node's right
 * child's slot into its own (its left child's) slot; then out[row] =
 * 0 + the root.  Slots hold the nodes at depth `split` (qc_pw_subtrees)
 * at their path, a leaf above that depth at its all-left path. */
template <typename Acc, typename I>
__global__ void __launch_bounds__(QC_PW_THREADS)
qc_pw_top(Acc *slots, Acc *out, I rows, I n, int split) {
  for (unsigned long long row = blockIdx.x; row < (unsigned long long)rows;
       row += gridDim.x) {  /* block-uniform */
    Acc *s = slots + (row << split);
    for (int level = split - 1; level >= 0; --level) {
      for (unsigned long long p = threadIdx.x; p < (1ull << level); p += blockDim.x) {
        I o, m;
        if (qc_pw_node<I>(n, level, p, true, &o, &m)) {
          const unsigned long long left = p << (split - level);
          s[left] = s[left] + s[left | (1ull << (split - level - 1))];
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[row] = (Acc)0 + s[0];
    __syncthreads();
  }
}

/* out[c] = ((0 + x[0, c]) + x[1, c]) + ... over the rows of a C-ordered
 * (rows, d) array: NumPy's sum over the leading axis. */
template <typename T, typename I>
__global__ void qc_column_sums(const T *x, T *out, I rows, I d) {
  const I step = (I)gridDim.x * (I)blockDim.x;
  for (I c = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; c < d; c += step) {
    T s = (T)0;
    for (I r = 0; r < rows; ++r) s += x[r * d + c];
    out[c] = s;
  }
}
