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
 * The pairwise tree depends on n only.  On the device every leaf (a node of
 * at most 128 values) is summed by one thread (qc_pw_leaves), then each level
 * of the tree adds its two children, deepest level first (qc_pw_level, one
 * launch per level); the root lands in slot 0 of its row.  Slots are indexed
 * by the path from the root (a 1 bit: right child), ``depth`` bits per row;
 * a leaf above the deepest level keeps the slot of its all-left path.
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

/* NumPy's pairwise sum of a leaf (n <= 128), from +0 for n < 8. */
template <typename Acc, typename T, typename I>
__device__ inline Acc qc_pw_leaf(const T *a, I n) {
  if (n < 8) {
    Acc r = (Acc)0;
    for (I i = 0; i < n; ++i) r += (Acc)a[i];
    return r;
  }
  Acc r[8];
  for (int j = 0; j < 8; ++j) r[j] = (Acc)a[j];
  I i = 8;
  for (; i < n - n % 8; i += 8)
    for (int j = 0; j < 8; ++j) r[j] += (Acc)a[i + j];
  Acc res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < n; ++i) res += (Acc)a[i];
  return res;
}

/* slots[row << depth | path] = the leaf sum at that path, for every leaf of
 * every row (rows x 2**depth threads; paths that end early write nothing). */
template <typename Acc, typename T, typename I>
__global__ void qc_pw_leaves(const T *x, Acc *slots, I rows, I n, int depth) {
  const unsigned long long per_row = 1ull << depth;
  const unsigned long long total = (unsigned long long)rows * per_row;
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
       t < total; t += step) {
    const unsigned long long path = t & (per_row - 1);
    I off, len;
    if (qc_pw_node<I>(n, depth, path, false, &off, &len))
      slots[t] = qc_pw_leaf<Acc, T, I>(x + (I)(t >> depth) * n + off, len);
  }
}

/* One level of the tree: every internal node at `level` adds its right
 * child's slot into its own (its left child's) slot.  When level == 0 the
 * row's total goes to out[row] as 0 + root. */
template <typename Acc, typename I>
__global__ void qc_pw_level(Acc *slots, Acc *out, I rows, I n, int depth, int level) {
  const unsigned long long per_row = 1ull << level;
  const unsigned long long total = (unsigned long long)rows * per_row;
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
       t < total; t += step) {
    const unsigned long long row = t >> level, path = t & (per_row - 1);
    Acc *row_slots = slots + (row << depth);
    I off, len;
    if (qc_pw_node<I>(n, level, path, true, &off, &len)) {
      const unsigned long long left = path << (depth - level);
      const unsigned long long right = left | (1ull << (depth - level - 1));
      row_slots[left] = row_slots[left] + row_slots[right];
    }
    if (level == 0) out[row] = (Acc)0 + row_slots[0];
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
