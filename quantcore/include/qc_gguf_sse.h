// GGUF legacy blocks (Q8_0, Q4/5_0, Q4/5_1 without imatrix), 4 lanes of
// SSE4.1 (x86-64-v2, the project's x86 baseline).  Included by
// qc_gguf_legacy.h; each qc_gg_*_sse quantizes one block of 32 values and
// returns false, writing nothing, for a block whose result the scalar loop
// alone fixes: a NaN (ggml's MAX / `<` keep or drop it by position), and
// for Q4/5_1 a zero min or max (which zero's sign ggml keeps is the first
// one's).  Otherwise every float operation is the scalar loop's, in its
// order, per lane: the same bits (tests/test_gguf.py, against ggml's C).
#ifndef QC_GGUF_SSE_H
#define QC_GGUF_SSE_H

#if defined(__SSE4_1__) && !defined(__CUDACC__)
#include <smmintrin.h>
#define QC_GG_SSE 1

static inline __m128i qc_gg_abs_bits(__m128 v) {
    return _mm_and_si128(_mm_castps_si128(v), _mm_set1_epi32(0x7FFFFFFF));
}

// the largest |x| of 8 vectors as float bits: as unsigned integers |x|'s
// bits order as the values do, and a NaN's lie above +inf's (0x7F800000),
// so one unsigned max gives the maximum and whether a NaN is there
static inline uint32_t qc_gg_absmax_bits(const __m128 *v) {
    __m128i m = qc_gg_abs_bits(v[0]);
    for (int k = 1; k < 8; ++k) m = _mm_max_epu32(m, qc_gg_abs_bits(v[k]));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

static inline bool qc_gg_has_nan(uint32_t absmax_bits) { return absmax_bits > 0x7F800000u; }

// trunc32(roundf(p)) per lane (roundf: half away from zero) as
// trunc32(p + copysign(0.5 - 2^-25, p)): for finite p = m + f (0 <= f < 1,
// round to nearest even), f < 0.5 leaves the sum below m + 1 (it is at
// most half a unit in the last place from the float below m + 1), f >= 0.5
// takes it to m + 1 or above (m + 1 - 2^-25 is within half the spacing
// below m + 1, and a tie there goes to m + 1, the even one); p >= 2^23 is
// an integer and the sum rounds back to it; inf and NaN stay as they are
static inline __m128i qc_gg_round_trunc32(__m128 p) {
    const __m128 sign = _mm_and_ps(p, _mm_castsi128_ps(_mm_set1_epi32((int)0x80000000u)));
    return _mm_cvttps_epi32(_mm_add_ps(p, _mm_or_ps(sign, _mm_set1_ps(0.49999997f))));
}

// cvttps2dq is qc_gg_trunc32 per lane (NaN / out of range: INT32_MIN);
// (int8_t) of its low byte, sign-extended back to 32 bits
static inline __m128i qc_gg_to_i8_epi32(__m128 f) {
    return _mm_srai_epi32(_mm_slli_epi32(_mm_cvttps_epi32(f), 24), 24);
}

// qc_gg_nearest per lane: f + 1.5 * 2^23, the low mantissa bits
static inline __m128i qc_gg_nearest_epi32(__m128 f) {
    const __m128 g = _mm_add_ps(f, _mm_set1_ps(12582912.f));
    return _mm_sub_epi32(_mm_and_si128(_mm_castps_si128(g), _mm_set1_epi32(0x007fffff)),
                         _mm_set1_epi32(0x00400000));
}

// the low byte of each of 16 int32 lanes (4 vectors), in order
static inline __m128i qc_gg_low_bytes(const __m128i *q) {
    const __m128i lo = _mm_set1_epi32(0xFF);
    const __m128i a = _mm_packus_epi32(_mm_and_si128(q[0], lo), _mm_and_si128(q[1], lo));
    const __m128i b = _mm_packus_epi32(_mm_and_si128(q[2], lo), _mm_and_si128(q[3], lo));
    return _mm_packus_epi16(a, b);
}

// a block's 32 codes (first half q0 = q[0..3], second half q1 = q[4..7]):
// the low nibbles at y[off + j] = q0[j] | q1[j] << 4, and (Q5) bit 4 of
// each code in the 32-bit qh at y + qh_at (bit j: q0[j], bit 16 + j: q1[j])
static inline void qc_gg_pack_nibbles_sse(const __m128i *q, uint8_t *y, int off, int qh_at) {
    const __m128i b0 = qc_gg_low_bytes(q), b1 = qc_gg_low_bytes(q + 4);
    const __m128i nib = _mm_set1_epi8(0x0F);
    // the low nibbles <= 0x0F: a 16-bit shift by 4 carries nothing across bytes
    const __m128i packed = _mm_or_si128(_mm_and_si128(b0, nib),
                                        _mm_slli_epi16(_mm_and_si128(b1, nib), 4));
    _mm_storeu_si128((__m128i *)(y + off), packed);
    if (qh_at >= 0) {  // bit 4 to bit 7 of its byte (what crosses bytes lands in bits 0-2)
        const uint32_t qh = (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(b0, 3)) |
                            (uint32_t)_mm_movemask_epi8(_mm_slli_epi16(b1, 3)) << 16;
        memcpy(y + qh_at, &qh, 4);
    }
}

// d to its 4 lanes at d + h and, at id + h, 1 / d per lane, 0 where d is 0
// (the scalar `d ? 1.0f / d : 0.0f`, the same correctly rounded division)
static inline void qc_gg_store_d_id(__m128 dv, float *d, float *id, int h) {
    _mm_storeu_ps(d + h, dv);
    _mm_storeu_ps(id + h, _mm_andnot_ps(_mm_cmpeq_ps(dv, _mm_setzero_ps()),
                                        _mm_div_ps(_mm_set1_ps(1.0f), dv)));
}

static inline void qc_gg_load32(const float *x, __m128 *v) {
    for (int k = 0; k < 8; ++k) v[k] = _mm_loadu_ps(x + 4 * k);
}

// Q8_0: y[2 + j] = (int8_t)trunc32(roundf(x[j] * id))
static inline bool qc_gg_q8_0_sse(const float *x, uint8_t *y) {
    __m128 v[8];
    qc_gg_load32(x, v);
    const uint32_t amax_bits = qc_gg_absmax_bits(v);
    if (qc_gg_has_nan(amax_bits)) return false;
    const float d = qc_gg_float(amax_bits) / 127;
    const float id = d ? 1.0f / d : 0.0f;
    qc_gg_wr16(y, qc_gg_fp16(d));
    const __m128 vid = _mm_set1_ps(id);
    __m128i q[8];
    for (int k = 0; k < 8; ++k) q[k] = qc_gg_round_trunc32(_mm_mul_ps(v[k], vid));
    // amax and id finite: |x * id| <= amax * id <= 127 (1 + 2^-22), every
    // code in [-127, 127], and signed saturation keeps each as it is
    if (amax_bits < 0x7F800000u && id <= 3.402823466e+38f) {
        for (int h = 0; h < 2; ++h)
            _mm_storeu_si128((__m128i *)(y + 2 + 16 * h),
                             _mm_packs_epi16(_mm_packs_epi32(q[4 * h], q[4 * h + 1]),
                                             _mm_packs_epi32(q[4 * h + 2], q[4 * h + 3])));
        return true;
    }
    _mm_storeu_si128((__m128i *)(y + 2), qc_gg_low_bytes(q));
    _mm_storeu_si128((__m128i *)(y + 18), qc_gg_low_bytes(q + 4));
    return true;
}

// qc_gg_signed_max of nv vectors v (x's 4 nv values): the first value
// whose |x| bits equal the largest (0 when every |x| is 0); false for a
// NaN (which ggml's `<` skips: the scalar loop)
static inline bool qc_gg_signed_max_sse(const float *x, const __m128 *v, int nv,
                                        uint32_t amax_bits, float *max) {
    if (qc_gg_has_nan(amax_bits)) return false;
    *max = 0;
    if (!amax_bits) return true;
    const __m128i target = _mm_set1_epi32((int)amax_bits);
    uint32_t hits = 0;  // (all the lanes' hits, then the first: no early exit to mispredict)
    for (int k = 0; k < nv; ++k)
        hits |= (uint32_t)_mm_movemask_ps(
                    _mm_castsi128_ps(_mm_cmpeq_epi32(qc_gg_abs_bits(v[k]), target))) << (4 * k);
    *max = x[__builtin_ctz(hits)];
    return true;
}

// qc_gg_signed_max of n values, n a multiple of 4 up to 32
static inline bool qc_gg_signed_max_n_sse(const float *x, int n, float *max) {
    __m128 v[8];
    __m128i m = _mm_setzero_si128();
    for (int k = 0; k < n / 4; ++k) {
        v[k] = _mm_loadu_ps(x + 4 * k);
        m = _mm_max_epu32(m, qc_gg_abs_bits(v[k]));
    }
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    return qc_gg_signed_max_sse(x, v, n / 4, (uint32_t)_mm_cvtsi128_si32(m), max);
}

// Q4_0 / Q5_0 of nb <= 8 blocks at x (written at y): qc_gg_signed_max of
// each block first, then every block's d = max / -8 (-16) and id = 1 / d
// (0 where d is 0) as vectors (the same correctly rounded divisions; one
// block at a time, each waited on two divisions in a row), then each
// block's q = min(qmax, (int8_t)trunc32(x * id + half)).  ok[k] is false
// for a block with a NaN: nothing written, the scalar loop's (the caller).
template <int BITS>
static inline void qc_gg_q_0_sse(const float *x, uint8_t *y, int nb, bool *ok) {
    const int B = BITS == 4 ? 18 : 22;
    float max[8] = {0, 0, 0, 0, 0, 0, 0, 0}, d[8], id[8];
    for (int k = 0; k < nb; ++k) {
        __m128 v[8];
        qc_gg_load32(x + 32 * k, v);
        ok[k] = qc_gg_signed_max_sse(x + 32 * k, v, 8, qc_gg_absmax_bits(v), &max[k]);
    }
    const __m128 div = _mm_set1_ps(BITS == 4 ? -8.0f : -16.0f);
    for (int h = 0; h < 8; h += 4)
        qc_gg_store_d_id(_mm_div_ps(_mm_loadu_ps(max + h), div), d, id, h);
    const __m128 half = _mm_set1_ps(BITS == 4 ? 8.5f : 16.5f);
    const __m128i qmax = _mm_set1_epi32(BITS == 4 ? 15 : 31);
    for (int k = 0; k < nb; ++k) {
        if (!ok[k]) continue;
        const float *xb = x + 32 * k;
        uint8_t *yb = y + B * k;
        qc_gg_wr16(yb, qc_gg_fp16(d[k]));
        const __m128 vid = _mm_set1_ps(id[k]);
        __m128i q[8];
        for (int j = 0; j < 8; ++j)
            q[j] = _mm_min_epi32(qmax, qc_gg_to_i8_epi32(_mm_add_ps(
                                           _mm_mul_ps(_mm_loadu_ps(xb + 4 * j), vid), half)));
        qc_gg_pack_nibbles_sse(q, yb, BITS == 4 ? 2 : 6, BITS == 4 ? -1 : 2);
    }
}

// Q4_1 / Q5_1 of nb <= 8 blocks at x (written at y), as qc_gg_q_0_sse:
// each block's min / max from +-FLT_MAX (as ggml's `<` / `>` loop), then
// every block's d = (max - min) / 15 (31) and id = 1 / d (0 where d is 0)
// as vectors, then each block's q = (int8_t)trunc32((x - min) * id + 0.5)
// (Q4_1: at most 15).  ok[k] is false for a block with a NaN or a zero min
// or max (which zero's sign ggml keeps is the first one's): nothing
// written, the scalar loop's (the caller).
template <int BITS>
static inline void qc_gg_q_1_sse(const float *x, uint8_t *y, int nb, bool *ok) {
    const int B = BITS == 4 ? 20 : 24;
    float min[8] = {0, 0, 0, 0, 0, 0, 0, 0}, max[8] = {0, 0, 0, 0, 0, 0, 0, 0}, d[8], id[8];
    for (int k = 0; k < nb; ++k) {
        __m128 v[8];
        qc_gg_load32(x + 32 * k, v);
        ok[k] = false;
        if (qc_gg_has_nan(qc_gg_absmax_bits(v))) continue;
        __m128 lo = _mm_set1_ps(3.402823466e+38f), hi = _mm_set1_ps(-3.402823466e+38f);
        for (int j = 0; j < 8; ++j) { lo = _mm_min_ps(lo, v[j]); hi = _mm_max_ps(hi, v[j]); }
        lo = _mm_min_ps(lo, _mm_shuffle_ps(lo, lo, 0x4E));
        lo = _mm_min_ps(lo, _mm_shuffle_ps(lo, lo, 0xB1));
        hi = _mm_max_ps(hi, _mm_shuffle_ps(hi, hi, 0x4E));
        hi = _mm_max_ps(hi, _mm_shuffle_ps(hi, hi, 0xB1));
        min[k] = _mm_cvtss_f32(lo);
        max[k] = _mm_cvtss_f32(hi);
        ok[k] = min[k] != 0 && max[k] != 0;
    }
    const __m128 div = _mm_set1_ps(BITS == 4 ? 15.0f : 31.0f);
    for (int h = 0; h < 8; h += 4)
        qc_gg_store_d_id(_mm_div_ps(_mm_sub_ps(_mm_loadu_ps(max + h), _mm_loadu_ps(min + h)), div),
                         d, id, h);
    const __m128 half = _mm_set1_ps(0.5f);
    for (int k = 0; k < nb; ++k) {
        if (!ok[k]) continue;
        const float *xb = x + 32 * k;
        uint8_t *yb = y + B * k;
        qc_gg_wr16(yb, qc_gg_fp16(d[k]));
        qc_gg_wr16(yb + 2, qc_gg_fp16(min[k]));
        const __m128 vid = _mm_set1_ps(id[k]), vmin = _mm_set1_ps(min[k]);
        __m128i q[8];
        for (int j = 0; j < 8; ++j) {
            q[j] = qc_gg_to_i8_epi32(
                _mm_add_ps(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(xb + 4 * j), vmin), vid), half));
            if (BITS == 4) q[j] = _mm_min_epi32(_mm_set1_epi32(15), q[j]);
        }
        qc_gg_pack_nibbles_sse(q, yb, BITS == 4 ? 4 : 8, BITS == 4 ? -1 : 4);
    }
}

// The blocks of a row of n values, B bytes each: on x86 8 at a time by
// LANES (qc_gg_q_0_sse / qc_gg_q_1_sse), a block they leave by BLOCK (the
// scalar loop of one block)
template <int B, void (*LANES)(const float *, uint8_t *, int, bool *),
          void (*BLOCK)(const float *, uint8_t *)>
static inline void qc_gg_blocks_sse(const float *x, uint8_t *y, int64_t n) {
    for (int64_t left = n / 32; left > 0;) {
        const int nb = left < 8 ? (int)left : 8;
        bool ok[8];
        LANES(x, y, nb, ok);
        for (int k = 0; k < nb; ++k)
            if (!ok[k]) BLOCK(x + 32 * k, y + B * k);
        left -= nb, x += 32 * nb, y += B * nb;
    }
}

// make_qkx2/3_quants' candidate loop (qc_gg_qkx after its first pass), 4
// candidates a pass, one per lane.  A candidate is = 0..nstep depends on the
// one before only through min, which changes when one is taken: so the
// lanes of a pass share the min it starts with, the lanes are then taken in
// order as the scalar loop takes them (D > 0 and cur < best), and after a
// take the next pass starts at the candidate after it (the later lanes,
// computed with the old min, are dropped).  Each lane's sums run over i in
// the scalar loop's order with its operations: the same bits.  About 2.7
// of 21 candidates are taken per Q4_K group, so ~8 passes instead of 21.
static inline void qc_gg_qkx_search_sse(int n, int nmax, const float *x, const float *w,
                                        uint8_t *L, float rmin, float rdelta, int nstep,
                                        bool mad, float sum_w, float sum_x, float max,
                                        float *min_io, float *scale_io, float *best_io) {
    float min = *min_io, scale = *scale_io, best = *best_io;
    float wv[32];
    for (int i = 0; i < n; ++i) wv[i] = w ? w[i] : x[i] * x[i];
    const __m128i lo = _mm_setzero_si128(), hi = _mm_set1_epi32(nmax);
    const __m128i lane = _mm_set_epi32(3, 2, 1, 0);
    __m128 lf[32];  // each lane's codes as floats
    int is0 = 0;
    while (is0 <= nstep) {
        const __m128 isf = _mm_cvtepi32_ps(_mm_add_epi32(_mm_set1_epi32(is0), lane));
        const __m128 iscale = _mm_div_ps(
            _mm_add_ps(_mm_add_ps(_mm_set1_ps(rmin), _mm_mul_ps(_mm_set1_ps(rdelta), isf)),
                       _mm_set1_ps((float)nmax)),
            _mm_set1_ps(max - min));
        __m128 sum_l = _mm_setzero_ps(), sum_l2 = _mm_setzero_ps(), sum_xl = _mm_setzero_ps();
        for (int i = 0; i < n; ++i) {
            const __m128i l = _mm_max_epi32(lo, _mm_min_epi32(hi, qc_gg_nearest_epi32(
                _mm_mul_ps(iscale, _mm_set1_ps(x[i] - min)))));
            lf[i] = _mm_cvtepi32_ps(l);
            const __m128 wl = _mm_mul_ps(_mm_set1_ps(wv[i]), lf[i]);
            sum_l = _mm_add_ps(sum_l, wl);
            sum_l2 = _mm_add_ps(sum_l2, _mm_mul_ps(wl, lf[i]));
            sum_xl = _mm_add_ps(sum_xl, _mm_mul_ps(wl, _mm_set1_ps(x[i])));
        }
        const __m128 sw = _mm_set1_ps(sum_w), sx = _mm_set1_ps(sum_x);
        const __m128 D = _mm_sub_ps(_mm_mul_ps(sw, sum_l2), _mm_mul_ps(sum_l, sum_l));
        __m128 this_scale = _mm_div_ps(_mm_sub_ps(_mm_mul_ps(sw, sum_xl), _mm_mul_ps(sx, sum_l)), D);
        __m128 this_min = _mm_div_ps(_mm_sub_ps(_mm_mul_ps(sum_l2, sx), _mm_mul_ps(sum_l, sum_xl)), D);
        const __m128 pos = _mm_cmpgt_ps(this_min, _mm_setzero_ps());
        this_min = _mm_andnot_ps(pos, this_min);
        this_scale = _mm_blendv_ps(this_scale, _mm_div_ps(sum_xl, sum_l2), pos);
        __m128 cur = _mm_setzero_ps();
        const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF));
        for (int i = 0; i < n; ++i) {
            __m128 diff = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(this_scale, lf[i]), this_min),
                                     _mm_set1_ps(x[i]));
            diff = mad ? _mm_and_ps(diff, absmask) : _mm_mul_ps(diff, diff);
            cur = _mm_add_ps(cur, _mm_mul_ps(_mm_set1_ps(wv[i]), diff));
        }
        float Dk[4], curk[4], sk[4], mk[4];
        _mm_storeu_ps(Dk, D); _mm_storeu_ps(curk, cur);
        _mm_storeu_ps(sk, this_scale); _mm_storeu_ps(mk, this_min);
        int next = is0 + 4;
        for (int k = 0; k < 4 && is0 + k <= nstep; ++k) {
            if (Dk[k] > 0 && curk[k] < best) {
                for (int i = 0; i < n; ++i) {
                    float c[4];
                    _mm_storeu_ps(c, lf[i]);
                    L[i] = (uint8_t)(int)c[k];
                }
                best = curk[k]; scale = sk[k]; min = mk[k];
                next = is0 + k + 1;
                break;
            }
        }
        is0 = next;
    }
    *min_io = min; *scale_io = scale; *best_io = best;
}

// make_qx_quants' 18 candidates (is = -9..9 but 0: qc_gg_qx after its
// first pass), 4 a pass, one per lane: a candidate depends on the ones
// before only through best, so every lane is computed and the lanes are
// then taken in the scalar loop's order (suml2 > 0 and sumlx^2 > best
// suml2).  Per lane the sums run over i in the scalar order: the same bits.
static inline void qc_gg_qx_search_sse(int n, int nmax, const float *x, int8_t *L,
                                       const float *qw, float max, float *scale_io,
                                       float *best_io) {
    float scale = *scale_io, best = *best_io;
    const __m128i lo = _mm_set1_epi32(-nmax), hi = _mm_set1_epi32(nmax - 1);
    static const int order[20] = {-9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                  9, 9};  // (the last two: padding lanes, never taken)
    __m128i lc[32];
    for (int p = 0; p < 18; p += 4) {
        const __m128 isf = _mm_cvtepi32_ps(_mm_loadu_si128((const __m128i *)(order + p)));
        const __m128 iscale = _mm_div_ps(
            _mm_xor_ps(_mm_add_ps(_mm_set1_ps((float)nmax), _mm_mul_ps(_mm_set1_ps(0.1f), isf)),
                       _mm_set1_ps(-0.0f)),
            _mm_set1_ps(max));
        __m128 sumlx = _mm_setzero_ps(), suml2 = _mm_setzero_ps();
        for (int i = 0; i < n; ++i) {
            const __m128i l = _mm_max_epi32(lo, _mm_min_epi32(hi, qc_gg_nearest_epi32(
                _mm_mul_ps(iscale, _mm_set1_ps(x[i])))));
            lc[i] = l;
            const __m128 lf = _mm_cvtepi32_ps(l);
            const __m128 w = _mm_set1_ps(qw ? qw[i] : x[i] * x[i]);
            sumlx = _mm_add_ps(sumlx, _mm_mul_ps(_mm_mul_ps(w, _mm_set1_ps(x[i])), lf));
            suml2 = _mm_add_ps(suml2, _mm_mul_ps(_mm_mul_ps(w, lf), lf));
        }
        float slx[4], sl2[4];
        _mm_storeu_ps(slx, sumlx);
        _mm_storeu_ps(sl2, suml2);
        for (int k = 0; k < 4 && p + k < 18; ++k) {
            if (sl2[k] > 0 && slx[k] * slx[k] > best * sl2[k]) {
                for (int i = 0; i < n; ++i) {
                    int c[4];
                    _mm_storeu_si128((__m128i *)c, lc[i]);
                    L[i] = (int8_t)(nmax + c[k]);
                }
                scale = slx[k] / sl2[k];
                best = scale * slx[k];
            }
        }
    }
    *scale_io = scale; *best_io = best;
}

// make_q3_quants' rounds of one-code moves (qc_gg_q3 after its first
// pass; n <= 16, codes L in [-nmax, nmax)), 4 values a pass: each lane's
// proposal (slx > 0 and a new code nl) is computed from the sums the pass
// starts with, the proposals are then judged in the scalar loop's order,
// and after a move is taken the next pass starts at the value after it (a
// proposal depends on the values before it only through the sums, which
// change only when a move is taken).  The same operations as the scalar
// loop, in its order: the same bits.
static inline void qc_gg_q3_moves_sse(int n, int nmax, const float *x, int8_t *L,
                                      float *sumlx_io, float *suml2_io) {
    float sumlx = *sumlx_io, suml2 = *suml2_io;
    float xs[20] = {0}, lf[20] = {0};
    for (int i = 0; i < n; ++i) { xs[i] = x[i]; lf[i] = (float)L[i]; }
    const __m128i lo = _mm_set1_epi32(-nmax), hi = _mm_set1_epi32(nmax - 1);
    for (int itry = 0; itry < 5; ++itry) {
        int changed = 0, i = 0;
        while (i < n) {
            const __m128 xv = _mm_loadu_ps(xs + i), l = _mm_loadu_ps(lf + i);
            const __m128 wx = _mm_mul_ps(_mm_mul_ps(xv, xv), xv);
            const __m128 w = _mm_mul_ps(xv, xv);
            const __m128 slx = _mm_sub_ps(_mm_set1_ps(sumlx), _mm_mul_ps(wx, l));
            const __m128 sl2 = _mm_sub_ps(_mm_set1_ps(suml2), _mm_mul_ps(_mm_mul_ps(w, l), l));
            const __m128i nl = _mm_max_epi32(lo, _mm_min_epi32(hi, qc_gg_nearest_epi32(
                _mm_div_ps(_mm_mul_ps(xv, sl2), slx))));
            const __m128 nlf = _mm_cvtepi32_ps(nl);
            int todo = _mm_movemask_ps(_mm_and_ps(_mm_cmpgt_ps(slx, _mm_setzero_ps()),
                                                  _mm_cmpneq_ps(nlf, l)));
            if (n - i < 4) todo &= (1 << (n - i)) - 1;
            int next = i + 4;
            if (todo) {
                float wk[4], xk[4], sx[4], s2[4], nk[4];
                _mm_storeu_ps(wk, w); _mm_storeu_ps(xk, xv); _mm_storeu_ps(sx, slx);
                _mm_storeu_ps(s2, sl2); _mm_storeu_ps(nk, nlf);
                for (int k = 0; k < 4; ++k) {
                    if (!(todo >> k & 1)) continue;
                    const float nslx = sx[k] + wk[k] * xk[k] * nk[k];
                    const float nsl2 = s2[k] + wk[k] * nk[k] * nk[k];
                    if (nsl2 > 0 && nslx * nslx * suml2 > sumlx * sumlx * nsl2) {
                        lf[i + k] = nk[k]; L[i + k] = (int8_t)nk[k];
                        sumlx = nslx; suml2 = nsl2;
                        ++changed;
                        next = i + k + 1;
                        break;
                    }
                }
            }
            i = next;
        }
        if (!changed) break;
    }
    *sumlx_io = sumlx; *suml2_io = suml2;
}

#define QC_GG_TRY_SSE(call) (call)
#else
#define QC_GG_TRY_SSE(call) false
#endif

#endif
