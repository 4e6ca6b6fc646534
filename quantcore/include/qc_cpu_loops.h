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
 * The units quantcore/_cpu/qc_loops_*.cpp include the headers of the
 * families they own (qc_families.h, qc_format_families.h, qc_groups.h,
 * qc_mx.h), then this header, and define the entry points of qc_kernels.h
 * that they own (QC_DEFINE_* / QC_LOOPS_* below); each is compiled once per
 * build (QC_SIMD_LEVEL 2 / 3 / 4: baseline, x86-64-v3, x86-64-v4), into
 * that build's namespace QC_LOOPS_NS.  Same source, same flags
 * (-ffp-contract=off): the same bits.  The loops over the Ops need only
 * their declarations (qc_registry.h); those of the group and block-scaled
 * recipes are compiled where their header is included (QC_GROUPS_H,
 * QC_MX_H), so that no unit includes a family header it does not run and
 * an edit of one rebuilds only the units that do.
 */
#include "qc_kernels.h"
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

/* ----------------------------------------------- the families by their id */

/* The Op templates of an X(name, Op) list of qc_families.h, in id order,
 * as a type: QcOps<QC_EW_FAMILIES(QC_X_OP) QcOpsEnd>. */
template <template <typename> class... Ops> struct QcOps {};
template <typename T> struct QcOpsEnd {};
#define QC_X_OP(name, Op) Op,
typedef QcOps<QC_EW_FAMILIES(QC_X_OP) QcOpsEnd> QcEwOps;
typedef QcOps<QC_ENCODE_FAMILIES(QC_X_OP) QcOpsEnd> QcEncodeOps;
typedef QcOps<QC_DECODE_FAMILIES(QC_X_OP) QcOpsEnd> QcDecodeOps;
#undef QC_X_OP

/* f(code pointer) with the family's code type of `code_bytes` bytes
 * (Op::CODE_BYTES says which exist; any other is ignored). */
template <class Op, typename F> static inline void with_codes(void *codes, int code_bytes, F f) {
  if ((Op::CODE_BYTES & 1) && code_bytes == 1) f((unsigned char *)codes);
  if ((Op::CODE_BYTES & 2) && code_bytes == 2) f((unsigned short *)codes);
}

/* QcOpAt<List, id>::type<T>: the Op of id `id` in a QcOps list. */
template <class List, int I> struct QcOpAt;
template <template <typename> class Op, template <typename> class... Rest>
struct QcOpAt<QcOps<Op, Rest...>, 0> {
  template <typename T> using type = Op<T>;
};
template <template <typename> class Op, template <typename> class... Rest, int I>
struct QcOpAt<QcOps<Op, Rest...>, I> : QcOpAt<QcOps<Rest...>, I - 1> {};

/* The loops by family id F: elementwise (QC_EW_*) x -> y and the mask;
 * encode (QC_ENC_*) x -> codes of `code_bytes` bytes; decode (QC_DEC_*)
 * codes -> y.  The block form covers n contiguous elements of channel c,
 * the rowvec form `rows` rows of C elements; (u0, u1, mode) are the
 * family's uniform parameters. */
template <int F, typename T>
void ew_block(const T *x, T *y, unsigned char *mask, qc_i64 n, const T *params, qc_i64 C,
              qc_i64 c, T u0, T u1, int mode) {
  typedef typename QcOpAt<QcEwOps, F>::template type<T> Op;
  ew_block_op(Op{u0, u1, mode}, x, y, mask, n, params, C, c);
}

template <int F, typename T>
void ew_rowvec(const T *x, T *y, unsigned char *mask, qc_i64 rows, qc_i64 C, const T *params,
               T u0, T u1, int mode) {
  typedef typename QcOpAt<QcEwOps, F>::template type<T> Op;
  ew_rowvec_op(Op{u0, u1, mode}, x, y, mask, rows, C, params);
}

template <int F, typename T>
void enc_block(const T *x, void *codes, int code_bytes, qc_i64 n, const T *params, qc_i64 C,
               qc_i64 c, T u0, T u1, int mode) {
  typedef typename QcOpAt<QcEncodeOps, F>::template type<T> Op;
  with_codes<Op>(codes, code_bytes, [&](auto *q) {
    ew_block_op(Op{u0, u1, mode}, x, q, (unsigned char *)0, n, params, C, c);
  });
}

template <int F, typename T>
void enc_rowvec(const T *x, void *codes, int code_bytes, qc_i64 rows, qc_i64 C, const T *params,
                T u0, T u1, int mode) {
  typedef typename QcOpAt<QcEncodeOps, F>::template type<T> Op;
  with_codes<Op>(codes, code_bytes, [&](auto *q) {
    ew_rowvec_op(Op{u0, u1, mode}, x, q, (unsigned char *)0, rows, C, params);
  });
}

template <int F, typename T>
void dec_block(const void *codes, int code_bytes, T *y, qc_i64 n, const T *params, qc_i64 C,
               qc_i64 c, T u0, T u1, int mode) {
  typedef typename QcOpAt<QcDecodeOps, F>::template type<T> Op;
  with_codes<Op>((void *)codes, code_bytes, [&](auto *q) {
    ew_block_op(Op{u0, u1, mode}, q, y, (unsigned char *)0, n, params, C, c);
  });
}

template <int F, typename T>
void dec_rowvec(const void *codes, int code_bytes, T *y, qc_i64 rows, qc_i64 C, const T *params,
                T u0, T u1, int mode) {
  typedef typename QcOpAt<QcDecodeOps, F>::template type<T> Op;
  with_codes<Op>((void *)codes, code_bytes, [&](auto *q) {
    ew_rowvec_op(Op{u0, u1, mode}, q, y, (unsigned char *)0, rows, C, params);
  });
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

/* The loops of the entries by recipe id (QC_CPU_FAMILY_ENTRIES_F32),
 * declared for every unit, defined below in the units that include the
 * recipes' header. */
#define QC_DECLARE_LOOP(entry, list, prefix, params, args) template <int F> void entry params;
QC_CPU_FAMILY_ENTRIES_F32(QC_DECLARE_LOOP)
#undef QC_DECLARE_LOOP

#ifdef QC_GROUPS_H
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

/* Recipe F (QC_GRP_*), with the recipe's {qmin, qmax, mode}. */
template <int F>
void group_blocks(const float *x, unsigned char *codes, float *y, unsigned char *mask,
                  float *scale, float *zp, qc_i64 b0, qc_i64 nb, qc_i64 K, qc_i64 g, float qmin,
                  float qmax, int mode) {
#define QC_GRP_IF(name, R)                                                                     \
  if constexpr (F == QC_GRP_##name)                                                            \
    group_blocks_op(R{qmin, qmax, mode}, x, codes, y, mask, scale, zp, b0, nb, K, g);
  QC_GROUP_RECIPES(QC_GRP_IF)
#undef QC_GRP_IF
}
#endif /* QC_GROUPS_H */

#ifdef QC_MX_H
/* ------------------------------------------------- block-scaled formats */

/* max |x| of n floats with NaN propagation, as the integer max of the
 * sign-cleared bits (every NaN's bits exceed Inf's): one pmaxud per vector;
 * a NaN gives one of the NaNs. */
static inline float block_amax(const float *x, qc_i64 n) {
  unsigned m = 0u;
  QC_PRAGMA(omp simd reduction(max : m))
  for (qc_i64 i = 0; i < n; i++) {
    const unsigned u = qc_bits(x[i]) & 0x7fffffffu;
    m = u > m ? u : m;
  }
  return qc_from_bits(m);
}

/* One block's element codes / fake-quant values (each when not NULL). */
template <class R>
static inline __attribute__((always_inline)) void block_elements(
    const R &rec, const float *xb, unsigned char *__restrict__ cb, float *__restrict__ yb,
    const QcBlockQ &bq, qc_i64 n) {
  if (cb) {
    QC_SIMD for (qc_i64 i = 0; i < n; i++) cb[i] = (unsigned char)rec.code(rec.value(xb[i], bq));
  }
  if (yb) {
    QC_SIMD for (qc_i64 i = 0; i < n; i++) yb[i] = rec.fake(rec.value(xb[i], bq), bq);
  }
}

#define QC_BLK_BATCH 64

/* R::block of m blocks from their amaxes (one vectorised loop across
 * them), the scale codes into scodes when not NULL. */
template <class R>
static inline __attribute__((always_inline)) void block_scales(const R &rec, const float *amax,
                                                               float *qmul, float *deq,
                                                               unsigned *scode,
                                                               unsigned char *scodes, int m) {
  QC_SIMD for (int t = 0; t < m; t++) {
    QcBlockQ bq;
    rec.block(amax[t], &bq);
    qmul[t] = bq.qmul;
    deq[t] = bq.deq;
    scode[t] = bq.scode;
  }
  if (scodes)
    for (int t = 0; t < m; t++) scodes[t] = (unsigned char)scode[t];
}

/* The recipe with the element format E and mode bits M as constants
 * (R::dispatch; -1: at run time), so that the element loops vectorise. */
template <class R, int E, int M> static inline R block_recipe(const R &rec_rt) {
  return R{E < 0 ? rec_rt.elem : E,
           M < 0 ? rec_rt.mode : ((rec_rt.mode & ~(int)R::STATIC_BITS) | M), rec_rt.p0,
           rec_rt.p1};
}

/* block_scaled_op when every block is G long (K a multiple of G): block b
 * is x[b * G, (b + 1) * G), contiguous across rows.  G a constant (MX: 32,
 * NVFP4: 16): the amax, element and store loops are one or two vectors a
 * block, with no test per block, so the compiler keeps the recipe's
 * constants in registers across the batch. */
template <int G, class R, int E, int M>
QC_LOOP_BODY static void block_scaled_full(const R rec_rt, const float *x,
                                           unsigned char *scodes, unsigned char *codes,
                                           float *y, qc_i64 b0, qc_i64 nb) {
  const R rec = block_recipe<R, E, M>(rec_rt);
  float amax[QC_BLK_BATCH], qmul[QC_BLK_BATCH], deq[QC_BLK_BATCH];
  unsigned scode[QC_BLK_BATCH];
  for (qc_i64 b = b0; b < b0 + nb; b += QC_BLK_BATCH) {
    const int m = (int)(b0 + nb - b < QC_BLK_BATCH ? b0 + nb - b : QC_BLK_BATCH);
    const float *xb = x + b * G;
    for (int t = 0; t < m; t++) amax[t] = block_amax(xb + t * G, G);
    block_scales(rec, amax, qmul, deq, scode, scodes ? scodes + b : 0, m);
    if (codes) {
      unsigned char *__restrict__ cb = codes + b * G;
      for (int t = 0; t < m; t++) {
        const QcBlockQ bq = {qmul[t], deq[t], scode[t]};
        QC_SIMD for (int i = 0; i < G; i++)
          cb[t * G + i] = (unsigned char)rec.code(rec.value(xb[t * G + i], bq));
      }
    }
    if (y) {
      float *__restrict__ yb = y + b * G;
      for (int t = 0; t < m; t++) {
        const QcBlockQ bq = {qmul[t], deq[t], scode[t]};
        QC_SIMD for (int i = 0; i < G; i++)
          yb[t * G + i] = rec.fake(rec.value(xb[t * G + i], bq), bq);
      }
    }
  }
}

/* Block recipe R (qc_mx.h) over the blocks [b0, b0 + nb) of rows of K
 * elements cut into blocks of g (the last of a row may be shorter), in
 * row-major block order, a batch of QC_BLK_BATCH blocks at a time: the
 * blocks' amaxes (block_amax), R::block of each (one vectorised loop across
 * the batch: the scale codes into scodes), then per element the code
 * (codes, one byte each) and the fake-quant value (y), each when not NULL. */
template <class R, int E, int M>
static inline void block_scaled_op(const R &rec_rt, const float *x, unsigned char *scodes,
                                   unsigned char *codes, float *y, qc_i64 b0, qc_i64 nb,
                                   qc_i64 K, qc_i64 g) {
  if (K % g == 0 && (g == 32 || g == 16)) {
    if (g == 32) block_scaled_full<32, R, E, M>(rec_rt, x, scodes, codes, y, b0, nb);
    else block_scaled_full<16, R, E, M>(rec_rt, x, scodes, codes, y, b0, nb);
    return;
  }
  const R rec = block_recipe<R, E, M>(rec_rt);
  const qc_i64 ng = (K + g - 1) / g;
  qc_i64 r = b0 / ng, j = b0 - (b0 / ng) * ng; /* the block's row and index in it */
  float amax[QC_BLK_BATCH], qmul[QC_BLK_BATCH], deq[QC_BLK_BATCH];
  unsigned scode[QC_BLK_BATCH];
  qc_i64 start[QC_BLK_BATCH], len[QC_BLK_BATCH];
  for (qc_i64 b = b0; b < b0 + nb; b += QC_BLK_BATCH) {
    const int m = (int)(b0 + nb - b < QC_BLK_BATCH ? b0 + nb - b : QC_BLK_BATCH);
    for (int t = 0; t < m; t++) {
      start[t] = r * K + j * g;
      const qc_i64 n = K - j * g < g ? K - j * g : g;
      len[t] = n;
      const float *xb = x + start[t];
      /* (the block sizes of MX and NVFP4 as constant trip counts) */
      amax[t] = n == 32 ? block_amax(xb, 32) : (n == 16 ? block_amax(xb, 16)
                                                         : block_amax(xb, n));
      if (++j == ng) {
        j = 0;
        r++;
      }
    }
    block_scales(rec, amax, qmul, deq, scode, scodes ? scodes + b : 0, m);
    for (int t = 0; t < m; t++) {
      const QcBlockQ bq = {qmul[t], deq[t], scode[t]};
      const float *xb = x + start[t];
      unsigned char *cb = codes ? codes + start[t] : 0;
      float *yb = y ? y + start[t] : 0;
      if (len[t] == 32) block_elements(rec, xb, cb, yb, bq, 32);
      else if (len[t] == 16) block_elements(rec, xb, cb, yb, bq, 16);
      else block_elements(rec, xb, cb, yb, bq, len[t]);
    }
  }
}

/* Recipe F (QC_BLK_*), with the recipe's {elem, mode, p0, p1}. */
template <int F>
void block_scaled(const float *x, unsigned char *scodes, unsigned char *codes, float *y,
                  qc_i64 b0, qc_i64 nb, qc_i64 K, qc_i64 g, int elem, int mode, float p0,
                  float p1) {
#define QC_BLK_IF(name, R)                                                                     \
  if constexpr (F == QC_BLK_##name)                                                            \
    R::dispatch(elem, mode, [&](auto e, auto m) {                                              \
      block_scaled_op<R, decltype(e)::value, decltype(m)::value>(R{elem, mode, p0, p1}, x,     \
                                                                  scodes, codes, y, b0, nb, K, g); \
    });
  QC_BLOCK_RECIPES(QC_BLK_IF)
#undef QC_BLK_IF
}
#endif /* QC_MX_H */

} /* namespace loops */

/* ------------------------------------------ the entry points of a unit */

/* Every entry point of QC_CPU_ENTRIES / QC_CPU_ENTRIES_F32 (the loops
 * that are not per family), with Entries<float> / <double> instantiated:
 * in one unit (qc_loops_affine.cpp). */
#define QC_DEFINE_ENTRY(name, params, args)                                                    \
  template <typename T> void Entries<T>::name params { loops::name args; }
#define QC_DEFINE_ENTRY_F32(name, params, args)                                                \
  void EntriesF32::name params { loops::name args; }
#define QC_DEFINE_COMMON_ENTRIES                                                               \
  namespace QC_LOOPS_NS {                                                                      \
  QC_CPU_ENTRIES(QC_DEFINE_ENTRY)                                                              \
  QC_CPU_ENTRIES_F32(QC_DEFINE_ENTRY_F32)                                                      \
  template struct Entries<float>;                                                              \
  template struct Entries<double>;                                                             \
  }

/* The run() of every entry by family (their definitions; a unit
 * instantiates those of the families it owns with the QC_LOOPS_* lines
 * below). */
#define QC_DEFINE_FAMILY_ENTRY(entry, list, prefix, params, args)                             \
  template <typename T, int F> void entry<T, F>::run params { loops::entry<F> args; }
QC_CPU_FAMILY_ENTRIES(QC_DEFINE_FAMILY_ENTRY)
QC_CPU_FAMILY_ENTRIES_F32(QC_DEFINE_FAMILY_ENTRY)
#undef QC_DEFINE_FAMILY_ENTRY

} /* namespace QC_LOOPS_NS */

/* The loops of elementwise family `name` (QC_EW_FAMILIES), in float and
 * double, block and rowvec. */
#define QC_LOOPS_EW(name)                                                                      \
  template struct QC_LOOPS_NS::ew_block<float, QC_EW_##name>;                                  \
  template struct QC_LOOPS_NS::ew_block<double, QC_EW_##name>;                                 \
  template struct QC_LOOPS_NS::ew_rowvec<float, QC_EW_##name>;                                 \
  template struct QC_LOOPS_NS::ew_rowvec<double, QC_EW_##name>;

/* The same for an encode / decode family (X callbacks of
 * QC_ENCODE_FAMILIES / QC_DECODE_FAMILIES), a group recipe
 * (QC_GROUP_RECIPES) and a block recipe (QC_BLOCK_RECIPES). */
#define QC_LOOPS_ENC(name, Op)                                                                 \
  template struct QC_LOOPS_NS::enc_block<float, QC_ENC_##name>;                                \
  template struct QC_LOOPS_NS::enc_block<double, QC_ENC_##name>;                               \
  template struct QC_LOOPS_NS::enc_rowvec<float, QC_ENC_##name>;                               \
  template struct QC_LOOPS_NS::enc_rowvec<double, QC_ENC_##name>;
#define QC_LOOPS_DEC(name, Op)                                                                 \
  template struct QC_LOOPS_NS::dec_block<float, QC_DEC_##name>;                                \
  template struct QC_LOOPS_NS::dec_block<double, QC_DEC_##name>;                               \
  template struct QC_LOOPS_NS::dec_rowvec<float, QC_DEC_##name>;                               \
  template struct QC_LOOPS_NS::dec_rowvec<double, QC_DEC_##name>;
#define QC_LOOPS_GROUP(name, R) template struct QC_LOOPS_NS::group_blocks<float, QC_GRP_##name>;
#define QC_LOOPS_BLOCK(name, R) template struct QC_LOOPS_NS::block_scaled<float, QC_BLK_##name>;
