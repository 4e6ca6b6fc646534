/*
 * qc_cpu_loops.h -- the CPU extension's per-chunk loops over the formulas
 * of qc_elementwise.h / qc_minmax.h and the families of qc_families.h.
 *
 * The Cython scheduler (_kernels.pyx) splits an array into work units and
 * hands each unit to one of these routines inside a `prange`; they hold no
 * formula of their own.  Two layouts exist for a C-ordered (outer, C,
 * inner) view:
 *   - block  (inner > 1, or per tensor): a contiguous run of one channel,
 *     whose parameters are loaded once;
 *   - rowvec (inner == 1): rows of C elements, one value of every channel,
 *     parameters read as arrays.
 * Per-channel parameters come as NP arrays of C values (params[j * C + c]).
 *
 * This header is compiled twice, into the namespace QC_LOOPS_NS::loops
 * that the including file chooses (qc_base: the extension's baseline
 * flags, quantcore/_cpu/qc_loops_base.cpp; qc_v3: AVX2 + FMA,
 * quantcore/_cpu/qc_loops_v3.cpp), and qc_kernels.h exports and dispatches
 * the entry points of QC_CPU_ENTRIES.  Same source, same flags
 * (-ffp-contract=off): the same bits.
 */
#ifndef QC_LOOPS_NS
#error "define QC_LOOPS_NS (qc_base or qc_v3) before including qc_cpu_loops.h"
#endif

#include "qc_families.h"
#include "qc_minmax.h"

#if defined(_OPENMP) || defined(QC_HAVE_OMP_SIMD)
#define QC_PRAGMA(x) _Pragma(#x)
#define QC_SIMD QC_PRAGMA(omp simd)
#define QC_SIMD_MINMAX                                                                         \
  QC_PRAGMA(omp simd reduction(min : lo) reduction(max : hi) reduction(| : fl))
#else
#define QC_SIMD
#define QC_SIMD_MINMAX
#endif

namespace QC_LOOPS_NS {
namespace loops {

/* ------------------------------------------------------------ elementwise */

/* NP parameter values, passed by value (a copy in registers). */
template <typename T, int NP> struct QcParamValues {
  T v[NP];
};

/* The loops below take the Op and the parameters by value and the mode as
 * a compile-time part CM: locals that no store to y or the mask can alias,
 * so the compiler keeps them in registers, hoists every test of the mode
 * out of the loop and vectorises it.  Each is a function of its own
 * (QC_LOOP_BODY, not inlined into the dispatcher): GCC stops if-converting
 * the loops once many are inlined into one body (the fp8 family dispatches
 * on 15 modes).  In / Out: T for the elementwise families; T / a code type
 * for the encode families, the other way round for the decode families. */
#define QC_LOOP_BODY __attribute__((noinline))

template <int CM, class Op, typename In, typename Out, typename T>
QC_LOOP_BODY static void ew_block_loop(const Op op, const In *x, Out *y, unsigned char *mask,
                                       qc_i64 n, const QcParamValues<T, Op::NP> p) {
  const int m = qc_loop_mode<Op, CM>(op.mode);
  if (mask) {
    QC_SIMD for (qc_i64 i = 0; i < n; i++) y[i] = (Out)op(x[i], p.v, 1, m, &mask[i]);
  } else {
    QC_SIMD for (qc_i64 i = 0; i < n; i++) {
      unsigned char k;
      y[i] = (Out)op(x[i], p.v, 1, m, &k);
    }
  }
}

template <int CM, class Op, typename In, typename Out, typename T>
QC_LOOP_BODY static void ew_rowvec_loop(const Op op, const In *x, Out *y, unsigned char *mask,
                                        qc_i64 rows, qc_i64 C, const T *params) {
  const int m = qc_loop_mode<Op, CM>(op.mode);
  for (qc_i64 r = 0; r < rows; r++) {
    const In *xr = x + r * C;
    Out *yr = y + r * C;
    if (mask) {
      unsigned char *mr = mask + r * C;
      QC_SIMD for (qc_i64 c = 0; c < C; c++) yr[c] = (Out)op(xr[c], params + c, C, m, &mr[c]);
    } else {
      QC_SIMD for (qc_i64 c = 0; c < C; c++) {
        unsigned char k;
        yr[c] = (Out)op(xr[c], params + c, C, m, &k);
      }
    }
  }
}

/* Family Op over n contiguous elements of channel c (mask may be NULL). */
template <class Op, typename In, typename Out, typename T>
static inline void ew_block_op(const Op op, const In *x, Out *y, unsigned char *mask, qc_i64 n,
                               const T *params, qc_i64 C, qc_i64 c) {
  QcParamValues<T, Op::NP> p;
  for (int j = 0; j < Op::NP; j++) p.v[j] = params[j * C + c];
  Op::dispatch(op.mode, [=](auto cm) {
    ew_block_loop<decltype(cm)::value>(op, x, y, mask, n, p);
  });
}

/* Family Op over `rows` rows of C elements; element c of a row uses
 * channel c's parameters. */
template <class Op, typename In, typename Out, typename T>
static inline void ew_rowvec_op(const Op op, const In *x, Out *y, unsigned char *mask,
                                qc_i64 rows, qc_i64 C, const T *params) {
  Op::dispatch(op.mode, [=](auto cm) {
    ew_rowvec_loop<decltype(cm)::value>(op, x, y, mask, rows, C, params);
  });
}

/* By family id (QC_EW_*): the block / rowvec loop of that family's Op with
 * uniform parameters (u0, u1, mode). */
template <typename T>
void ew_block(int family, const T *x, T *y, unsigned char *mask, qc_i64 n, const T *params,
              qc_i64 C, qc_i64 c, T u0, T u1, int mode) {
  switch (family) {
#define QC_EW_CASE(name, Op)                                                                   \
  case QC_EW_##name: ew_block_op(Op<T>{u0, u1, mode}, x, y, mask, n, params, C, c); break;
    QC_EW_FAMILIES(QC_EW_CASE)
#undef QC_EW_CASE
  }
}

template <typename T>
void ew_rowvec(int family, const T *x, T *y, unsigned char *mask, qc_i64 rows, qc_i64 C,
               const T *params, T u0, T u1, int mode) {
  switch (family) {
#define QC_EW_CASE(name, Op)                                                                   \
  case QC_EW_##name: ew_rowvec_op(Op<T>{u0, u1, mode}, x, y, mask, rows, C, params); break;
    QC_EW_FAMILIES(QC_EW_CASE)
#undef QC_EW_CASE
  }
}

/* ------------------------------------------------------- encode / decode */

/* f(code pointer) with the family's code type of `code_bytes` bytes
 * (Op::CODE_BYTES says which exist; any other is ignored). */
template <class Op, typename F> static inline void with_codes(void *codes, int code_bytes, F f) {
  if ((Op::CODE_BYTES & 1) && code_bytes == 1) f((unsigned char *)codes);
  if ((Op::CODE_BYTES & 2) && code_bytes == 2) f((unsigned short *)codes);
}

/* Encode family `family` (QC_ENC_*) over n contiguous elements of channel c
 * into codes of `code_bytes` bytes, and over `rows` rows of C elements. */
template <typename T>
void enc_block(int family, const T *x, void *codes, int code_bytes, qc_i64 n, const T *params,
               qc_i64 C, qc_i64 c, T u0, T u1, int mode) {
  switch (family) {
#define QC_ENC_CASE(name, Op)                                                                  \
  case QC_ENC_##name:                                                                          \
    with_codes<Op<T>>(codes, code_bytes, [&](auto *q) {                                        \
      ew_block_op(Op<T>{u0, u1, mode}, x, q, (unsigned char *)0, n, params, C, c);             \
    });                                                                                        \
    break;
    QC_ENCODE_FAMILIES(QC_ENC_CASE)
#undef QC_ENC_CASE
  }
}

template <typename T>
void enc_rowvec(int family, const T *x, void *codes, int code_bytes, qc_i64 rows, qc_i64 C,
                const T *params, T u0, T u1, int mode) {
  switch (family) {
#define QC_ENC_CASE(name, Op)                                                                  \
  case QC_ENC_##name:                                                                          \
    with_codes<Op<T>>(codes, code_bytes, [&](auto *q) {                                        \
      ew_rowvec_op(Op<T>{u0, u1, mode}, x, q, (unsigned char *)0, rows, C, params);            \
    });                                                                                        \
    break;
    QC_ENCODE_FAMILIES(QC_ENC_CASE)
#undef QC_ENC_CASE
  }
}

/* Decode family `family` (QC_DEC_*): the same from codes into y. */
template <typename T>
void dec_block(int family, const void *codes, int code_bytes, T *y, qc_i64 n, const T *params,
               qc_i64 C, qc_i64 c, T u0, T u1, int mode) {
  switch (family) {
#define QC_DEC_CASE(name, Op)                                                                  \
  case QC_DEC_##name:                                                                          \
    with_codes<Op<T>>((void *)codes, code_bytes, [&](auto *q) {                                \
      ew_block_op(Op<T>{u0, u1, mode}, q, y, (unsigned char *)0, n, params, C, c);             \
    });                                                                                        \
    break;
    QC_DECODE_FAMILIES(QC_DEC_CASE)
#undef QC_DEC_CASE
  }
}

template <typename T>
void dec_rowvec(int family, const void *codes, int code_bytes, T *y, qc_i64 rows, qc_i64 C,
                const T *params, T u0, T u1, int mode) {
  switch (family) {
#define QC_DEC_CASE(name, Op)                                                                  \
  case QC_DEC_##name:                                                                          \
    with_codes<Op<T>>((void *)codes, code_bytes, [&](auto *q) {                                \
      ew_rowvec_op(Op<T>{u0, u1, mode}, q, y, (unsigned char *)0, rows, C, params);            \
    });                                                                                        \
    break;
    QC_DECODE_FAMILIES(QC_DEC_CASE)
#undef QC_DEC_CASE
  }
}

/* qc_fq_affine_exact over elements [start, start + n) of a C-ordered
 * (outer, C, inner) view, element i in channel (i / inner) % C (C = 1,
 * inner = size per tensor).  mask may be NULL.  A plain loop: the exact
 * variant serves the rare int32-size ranges. */
template <typename T>
void affine_exact_range(const T *x, T *y, unsigned char *mask, qc_i64 start, qc_i64 n, qc_i64 C,
                        qc_i64 inner, const T *s, const T *inv, const double *zp, double qmin,
                        double qmax, int mode) {
  for (qc_i64 i = start; i < start + n; i++) {
    const qc_i64 c = (i / inner) % C;
    unsigned char m;
    y[i] = qc_fq_affine_exact(x[i], s[c], inv[c], zp[c], qmin, qmax, mode, &m);
    if (mask) mask[i] = m;
  }
}

/* Straight-through backward of n contiguous elements: y = grad * mask. */
template <typename T>
void ste_block(const T *g, const unsigned char *mask, T *y, qc_i64 n) {
  QC_SIMD for (qc_i64 i = 0; i < n; i++) y[i] = qc_ste(g[i], mask[i]);
}

/* --------------------------------------------------------------- min/max */

/* (lo, hi, flags) of n contiguous values, NaN-skipping (QcMinMax in
 * vectorisable form: one reduction variable per part). */
template <typename T>
void minmax_block(const T *x, qc_i64 n, T *lo_out, T *hi_out, unsigned char *flags) {
  T lo = qc_inf(T()), hi = -qc_inf(T());
  unsigned fl = 0u;
  QC_SIMD_MINMAX for (qc_i64 i = 0; i < n; i++) {
    const T v = x[i];
    lo = qc_mm_min(lo, v);
    hi = qc_mm_max(hi, v);
    fl |= qc_mm_flags(v);
  }
  *lo_out = lo;
  *hi_out = hi;
  *flags = (unsigned char)fl;
}

/* Per-channel (lo, hi, flags)[C] of `rows` rows of C values, folded into
 * lo / hi / flags (which the caller initialises). */
template <typename T>
void minmax_rowvec(const T *x, qc_i64 rows, qc_i64 C, T *lo, T *hi, unsigned char *flags) {
  for (qc_i64 r = 0; r < rows; r++) {
    const T *xr = x + r * C;
    QC_SIMD for (qc_i64 c = 0; c < C; c++) {
      const T v = xr[c];
      lo[c] = qc_mm_min(lo[c], v);
      hi[c] = qc_mm_max(hi[c], v);
      flags[c] |= (unsigned char)qc_mm_flags(v);
    }
  }
}

/* ------------------------------------------------------------- histogram */

/* torch.histc counts of n contiguous floats over [lo, hi] (qc_histc_bin_f32)
 * added to counts[bins]; |v| is binned when `absolute`, zeros are skipped
 * when `skip_zeros`.  Bins are computed a chunk at a time (vectorised), then
 * counted into two interleaved sub-histograms (counts and counts + bins, so
 * consecutive increments of one bin do not wait on each other); the caller
 * adds the second to the first. */
#define QC_HISTC_CHUNK 512
static inline void histc_block(const float *__restrict__ x, qc_i64 n, float lo, float hi,
                               int bins, int absolute, int skip_zeros,
                               qc_i64 *__restrict__ counts) {
  int idx[QC_HISTC_CHUNK];
  const float fbins = (float)bins;
  qc_i64 *__restrict__ counts2 = counts + bins;
  for (qc_i64 base = 0; base < n; base += QC_HISTC_CHUNK) {
    const qc_i64 m = n - base < QC_HISTC_CHUNK ? n - base : QC_HISTC_CHUNK;
    const float *xb = x + base;
    QC_SIMD for (qc_i64 j = 0; j < m; j++) {
      const float v = absolute ? fabsf(xb[j]) : xb[j];
      const int b = qc_histc_bin_f32(v, lo, hi, fbins, bins);
      idx[j] = (skip_zeros && v == 0.0f) ? -1 : b;
    }
    qc_i64 j = 0;
    for (; j + 1 < m; j += 2) {
      const int b0 = idx[j], b1 = idx[j + 1];
      if (b0 >= 0) counts[b0]++;
      if (b1 >= 0) counts2[b1]++;
    }
    if (j < m && idx[j] >= 0) counts[idx[j]]++;
  }
}

/* ------------------------------------------------------ group quantization */

/* Recipe R over the groups [b0, b0 + nb) of rows of K elements cut into
 * groups of g (the last of a row may be shorter), in row-major group order:
 * each group's min / max (finished), its qparams (scale[b], zp[b]), then
 * per element q = qc_group_q: codes (q as a two's complement byte), y
 * (R::dq(q), the fake-quant value) and mask, each when not NULL. */
template <class R>
static inline void group_blocks_op(const R &rec, const float *x, unsigned char *codes, float *y,
                                   unsigned char *mask, float *scale, float *zp, qc_i64 b0,
                                   qc_i64 nb, qc_i64 K, qc_i64 g) {
  const qc_i64 ng = (K + g - 1) / g;
  for (qc_i64 b = b0; b < b0 + nb; b++) {
    const qc_i64 r = b / ng, j = b - (b / ng) * ng;
    const qc_i64 start = r * K + j * g;
    const qc_i64 n = K - j * g < g ? K - j * g : g;
    const float *xb = x + start;
    float lo, hi;
    unsigned char fl;
    minmax_block(xb, n, &lo, &hi, &fl);
    qc_minmax_finish(&lo, &hi, fl);
    QcGroupQ gq;
    rec.qparams(lo, hi, &gq);
    if (scale) scale[b] = gq.scale;
    if (zp) zp[b] = gq.zp;
    if (codes) {
      unsigned char *__restrict__ cb = codes + start;
      QC_SIMD for (qc_i64 i = 0; i < n; i++) {
        unsigned char k;
        cb[i] = (unsigned char)(int)qc_group_q(rec, xb[i], gq, &k);
      }
    }
    if (y) {
      float *yb = y + start;
      if (mask) {
        unsigned char *__restrict__ mb = mask + start;
        QC_SIMD for (qc_i64 i = 0; i < n; i++) yb[i] = rec.dq(qc_group_q(rec, xb[i], gq, &mb[i]), gq);
      } else {
        QC_SIMD for (qc_i64 i = 0; i < n; i++) {
          unsigned char k;
          yb[i] = rec.dq(qc_group_q(rec, xb[i], gq, &k), gq);
        }
      }
    }
  }
}

/* By recipe id (QC_GRP_*), with the recipe's {qmin, qmax, mode}. */
static inline void group_blocks(int recipe, const float *x, unsigned char *codes, float *y,
                                unsigned char *mask, float *scale, float *zp, qc_i64 b0, qc_i64 nb,
                                qc_i64 K, qc_i64 g, float qmin, float qmax, int mode) {
  switch (recipe) {
#define QC_GRP_CASE(name, R)                                                                   \
  case QC_GRP_##name: group_blocks_op(R{qmin, qmax, mode}, x, codes, y, mask, scale, zp, b0, nb, K, g); break;
    QC_GROUP_RECIPES(QC_GRP_CASE)
#undef QC_GRP_CASE
  }
}

} /* namespace loops */
} /* namespace QC_LOOPS_NS */
