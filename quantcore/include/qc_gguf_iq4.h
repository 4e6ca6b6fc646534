// GGUF 4-bit table types: IQ4_NL (blocks of 32) and IQ4_XS
// (super-blocks of 256, 8 groups of 32 with 6-bit scales), codes indexing
// ggml's table kvalues_iq4nl.  Included by qc_gguf.h (its helpers); one
// row of n values per call; as ggml's quantize_iq4_nl / quantize_iq4_xs
// (ntry 7, with or without an imatrix); and MXFP4 (E2M1 codes, E8M0 scales).
#ifndef QC_GGUF_IQ4_H
#define QC_GGUF_IQ4_H

QC_GG_TABLE int8_t qc_gg_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// the index of the table value nearest to x (the upper of a tie: the
// comparison is strict), by bisection as ggml's best_index_int8 (a NaN
// goes to the last index)
QC_GG_FN int qc_gg_iq4_index(float x) {
    const int8_t *v = qc_gg_iq4_values;
    if (x <= (float)v[0]) return 0;
    if (x >= (float)v[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < (float)v[mav]) mu = mav; else ml = mav;
    }
    return x - (float)v[mu - 1] < (float)v[mu] - x ? mu - 1 : mu;
}

// L[j] = qc_gg_iq4_index(id * x[j]), j < n (a multiple of 4)
QC_GG_FN void qc_gg_iq4_indices(const float *x, float id, uint8_t *L, int n);

#ifdef QC_GG_SSE
// qc_gg_iq4_index as a count of thresholds: t[m] (m < 15) is the least
// float x with !(x - v[m] < v[m + 1] - x), the comparison's own float
// rounding (x - v[m] and v[m + 1] - x are monotone in x, so the comparison
// flips once between v[m] and v[m + 1]); the bisection's index of x is the
// number of t[m] <= x (x <= v[0]: none, x >= v[15]: all), NaN its 15
struct qc_gg_iq4_cuts { float t[15]; };

QC_GG_FN bool qc_gg_iq4_upper(float x, int m) {
    return !(x - (float)qc_gg_iq4_values[m] < (float)qc_gg_iq4_values[m + 1] - x);
}

QC_GG_FN const float *qc_gg_iq4_thresholds() {
    static const qc_gg_iq4_cuts cuts = [] {
        qc_gg_iq4_cuts c;
        for (int m = 0; m < 15; ++m) {
            float x = 0.5f * ((float)qc_gg_iq4_values[m] + (float)qc_gg_iq4_values[m + 1]);
            while (qc_gg_iq4_upper(nextafterf(x, -INFINITY), m)) x = nextafterf(x, -INFINITY);
            while (!qc_gg_iq4_upper(x, m)) x = nextafterf(x, INFINITY);
            c.t[m] = x;
        }
        return c;
    }();
    return cuts.t;
}

QC_GG_FN __m128i qc_gg_iq4_index_ps(__m128 x, const float *t) {
    __m128i count = _mm_setzero_si128();
    for (int m = 0; m < 15; ++m)
        count = _mm_sub_epi32(count, _mm_castps_si128(_mm_cmpge_ps(x, _mm_set1_ps(t[m]))));
    return _mm_blendv_epi8(count, _mm_set1_epi32(15), _mm_castps_si128(_mm_cmpunord_ps(x, x)));
}

// kvalues[index] per lane as float (the table's bytes by pshufb, sign-extended)
QC_GG_FN __m128 qc_gg_iq4_value_ps(__m128i index) {
    const __m128i table = _mm_loadu_si128((const __m128i *)qc_gg_iq4_values);
    const __m128i b = _mm_shuffle_epi8(table, _mm_or_si128(index, _mm_set1_epi32((int)0x80808000u)));
    return _mm_cvtepi32_ps(_mm_srai_epi32(_mm_slli_epi32(b, 24), 24));
}

QC_GG_FN void qc_gg_iq4_indices(const float *x, float id, uint8_t *L, int n) {
    const float *t = qc_gg_iq4_thresholds();
    const __m128 vid = _mm_set1_ps(id);
    for (int j = 0; j < n; j += 4) {
        const __m128i k = qc_gg_iq4_index_ps(_mm_mul_ps(vid, _mm_loadu_ps(x + j)), t);
        const __m128i b = _mm_shuffle_epi8(k, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1,
                                                             -1, -1, -1, -1, -1, -1));
        const int four = _mm_cvtsi128_si32(b);
        memcpy(L + j, &four, 4);
    }
}

// the 15 candidate scales of quantize_row_iq4_nl_impl (itry = -ntry..ntry),
// 4 a pass, one per lane: they depend on each other only through best, so
// the lanes are taken in the scalar loop's order; per lane the sums run
// over j in the scalar order: the same bits
QC_GG_FN void qc_gg_iq4_search_sse(const float *xb, const float *w, float max, int ntry,
                                        float *d_io, float *best_io) {
    const float *t = qc_gg_iq4_thresholds();
    float d = *d_io, best = *best_io;
    for (int p = -ntry; p <= ntry; p += 4) {
        const __m128 itry = _mm_cvtepi32_ps(_mm_add_epi32(_mm_set1_epi32(p + qc_gg_iq4_values[0]),
                                                          _mm_setr_epi32(0, 1, 2, 3)));
        const __m128 id = _mm_div_ps(itry, _mm_set1_ps(max));
        __m128 sumqx = _mm_setzero_ps(), sumq2 = _mm_setzero_ps();
        for (int j = 0; j < 32; ++j) {
            const __m128 xj = _mm_set1_ps(xb[j]);
            const __m128 q = qc_gg_iq4_value_ps(qc_gg_iq4_index_ps(_mm_mul_ps(id, xj), t));
            const __m128 wq = _mm_mul_ps(_mm_set1_ps(w[j]), q);
            sumqx = _mm_add_ps(sumqx, _mm_mul_ps(wq, xj));
            sumq2 = _mm_add_ps(sumq2, _mm_mul_ps(wq, q));
        }
        float sx[4], s2[4];
        _mm_storeu_ps(sx, sumqx);
        _mm_storeu_ps(s2, sumq2);
        for (int k = 0; k < 4 && p + k <= ntry; ++k)
            if (s2[k] > 0 && sx[k] * sx[k] > best * s2[k]) { d = sx[k] / s2[k]; best = d * sx[k]; }
    }
    *d_io = d; *best_io = best;
}
#else
QC_GG_FN void qc_gg_iq4_indices(const float *x, float id, uint8_t *L, int n) {
    for (int j = 0; j < n; ++j) L[j] = (uint8_t)qc_gg_iq4_index(id * x[j]);
}
#endif

// one super-block of `sbs` values in groups of 32 (sbs == 32: IQ4_NL)
QC_GG_FN void qc_gg_iq4_super(int sbs, const float *x, const float *qw, uint8_t *dh,
                                   uint8_t *q4, uint8_t *scales_h, uint8_t *scales_l) {
    const int8_t *values = qc_gg_iq4_values;
    const int ntry = 7, nb = sbs / 32;
    float scales[8], w[32];
    uint8_t L[QC_GG_QK_K];
    float sigma2 = 0;
    for (int j = 0; j < sbs; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / (float)sbs;
    memset(q4, 0, sbs / 2);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nb; ++ib) {
        const float *xb = x + 32 * ib;
        uint8_t *Lb = L + 32 * ib;
        for (int j = 0; j < 32; ++j)
            w[j] = qw ? qw[32 * ib + j] * sqrtf(sigma2 + xb[j] * xb[j]) : xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
            float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        if (amax < QC_GG_EPS) { scales[ib] = 0; continue; }
        float d = -max / (float)values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        qc_gg_iq4_indices(xb, id, Lb, 32);
        for (int j = 0; j < 32; ++j) {
            float q = (float)values[Lb[j]];
            sumqx += w[j] * q * xb[j];
            sumq2 += w[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
#ifdef QC_GG_SSE
        qc_gg_iq4_search_sse(xb, w, max, ntry, &d, &best);
#else
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (float)(itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                float q = (float)values[qc_gg_iq4_index(id * xb[j])];
                sumqx += w[j] * q * xb[j];
                sumq2 += w[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) { d = sumqx / sumq2; best = d * sumqx; }
        }
#endif
        scales[ib] = d;
        if (fabsf(d) > amax_scale) { amax_scale = fabsf(d); max_scale = d; }
    }
    if (nb > 1) {
        uint16_t sh = 0;
        const float d = -max_scale / 32;
        qc_gg_wr16(dh, qc_gg_fp16(d));
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nb; ++ib) {
            int l = qc_gg_max(-32, qc_gg_min(31, qc_gg_nearest(id * scales[ib])));
            const float dl = d * (float)l;
            const float idl = dl ? 1 / dl : 0.f;
            qc_gg_iq4_indices(x + 32 * ib, idl, L + 32 * ib, 32);
            l += 32;
            if (ib % 2 == 0) scales_l[ib / 2] = (uint8_t)(l & 0xF);
            else scales_l[ib / 2] = (uint8_t)(scales_l[ib / 2] | ((l & 0xF) << 4));
            sh = (uint16_t)(sh | ((l >> 4) << (2 * (ib % 8))));
        }
        qc_gg_wr16(scales_h, sh);
    } else {
        qc_gg_wr16(dh, qc_gg_fp16(scales[0]));
        const float id = scales[0] ? 1 / scales[0] : 0;
        qc_gg_iq4_indices(x, id, L, sbs);
    }
    for (int i = 0; i < sbs / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

// IQ4_NL (18 bytes: d, qs[16]); x = d * kvalues[q]
QC_GG_FN void qc_gg_iq4_nl(const float *x, const float *qw, uint8_t *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; ++b)
        qc_gg_iq4_super(32, x + 32 * b, qw ? qw + 32 * b : nullptr, y + 18 * b, y + 18 * b + 2,
                        nullptr, nullptr);
}

// IQ4_XS (136 bytes: d, scales_h u16, scales_l[4], qs[128]);
// x = d * (sc - 32) * kvalues[q]
QC_GG_FN void qc_gg_iq4_xs(const float *x, const float *qw, uint8_t *y, int64_t n) {
    for (int64_t b = 0; b < n / QC_GG_QK_K; ++b, y += 136)
        qc_gg_iq4_super(QC_GG_QK_K, x + QC_GG_QK_K * b, qw ? qw + QC_GG_QK_K * b : nullptr, y,
                        y + 8, y + 2, y + 4);
}

QC_GG_FN void qc_gg_dq_iq4(int type, const uint8_t *y, float *x, int64_t n) {
    const bool xs = type == 23;
    const int sbs = xs ? QC_GG_QK_K : 32;
    for (int64_t b = 0; b < n / sbs; ++b, x += sbs) {
        const float d = qc_gg_half(qc_gg_rd16(y));
        const uint8_t *qs = y + (xs ? 8 : 2);
        const uint16_t sh = xs ? qc_gg_rd16(y + 2) : 0;
        for (int ib = 0; ib < sbs / 32; ++ib, qs += 16) {
            float dl = d;
            if (xs) {
                const int ls = ((y[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
                dl = d * (float)(ls - 32);
            }
            for (int j = 0; j < 16; ++j) {
                x[32 * ib + j] = dl * (float)qc_gg_iq4_values[qs[j] & 0xF];
                x[32 * ib + j + 16] = dl * (float)qc_gg_iq4_values[qs[j] >> 4];
            }
        }
        y += xs ? 136 : 18;
    }
}

// ------------------------------------------------------------------ MXFP4
// MXFP4 (17 bytes: e (E8M0), qs[16]); codes index the doubled E2M1 values
// K2 = {0, 1, 2, 3, 4, 6, 8, 12, -0, -1, ...}; x = 2^(e - 128) * K2[q].
// e = floor(log2(amax)) - 2 + 127 (0 for amax 0; float -> uint8 as x86),
// q = the first index of least |K2[q] * 2^(e - 128) - x|.  The imatrix is
// ignored (as ggml's quantize_mxfp4).
QC_GG_TABLE int8_t qc_gg_fp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// ggml's E8M0 -> float halved: 2^(e - 128) (e < 2: the subnormals)
QC_GG_FN float qc_gg_e8m0_half(uint8_t e) {
    return qc_gg_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

// The count of floats below 2^k whose log2f rounds up to k, k = -148 ..
// 128 (glibc's log2f: equal on every positive float to the exact log2
// rounded to float, checked outside CI; a row per 24 k)
QC_GG_TABLE uint8_t qc_gg_log2_up[277] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 5, 11, 11, 22, 44,
    44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44,
    44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44,
    44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22,
    22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 11, 11, 11,
    11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 5, 5, 5, 5, 5, 5, 5, 5, 2, 2, 2,
    2, 1, 1, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 5, 5, 11, 11, 11,
    11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 11, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22,
    22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 44, 44, 44,
    44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44,
    44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44,
    44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44, 44,
};

// ggml's MXFP4 scale exponent floorf(log2f(a)) for a > 0 (inf: inf), as
// its x86-64 build gives it (glibc's log2f), from the bits with no libm (the
// device has no such log2f; the CPU takes the same form): the exponent of
// a, plus one for the qc_gg_log2_up floats just below the next power of
// two.  tests/test_gguf.py compares it with the host's libm around every
// power of two, where every difference would be.
QC_GG_FN float qc_gg_floor_log2(float a) {
    const uint32_t b = qc_gg_bits(a);
    if (b >= 0x7F800000u) return a;
    int e = (int)(b >> 23) - 127;  // floor(log2(a)): the exponent, or for a subnormal
    if (b < 0x800000u) {           // the position of its top bit
        e = -150;
        for (uint32_t t = b; t; t >>= 1) ++e;
    }
    const int k = e + 1;
    const uint32_t next = k >= -126 ? (uint32_t)(k + 127) << 23 : 1u << (k + 149);
    return (float)(b >= next - qc_gg_log2_up[k + 148] ? k : e);
}

QC_GG_FN void qc_gg_mxfp4(const float *x, const float *, uint8_t *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; ++b, x += 32, y += 17) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const uint8_t e = amax > 0.0f ? (uint8_t)qc_gg_to_i8(qc_gg_floor_log2(amax) - 2 + 127) : 0;
        const float d = qc_gg_e8m0_half(e);
        y[0] = e;
        uint8_t q[32];
        for (int j = 0; j < 32; ++j) {
            int best = 0;
            float best_err = fabsf((float)qc_gg_fp4_values[0] * d - x[j]);
            for (int i = 1; i < 16; ++i) {
                const float err = fabsf((float)qc_gg_fp4_values[i] * d - x[j]);
                if (err < best_err) { best = i; best_err = err; }
            }
            q[j] = (uint8_t)best;
        }
        for (int j = 0; j < 16; ++j) y[1 + j] = (uint8_t)(q[j] | (q[16 + j] << 4));
    }
}

QC_GG_FN void qc_gg_dq_mxfp4(int, const uint8_t *y, float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; ++b, x += 32, y += 17) {
        const float d = qc_gg_e8m0_half(y[0]);
        for (int j = 0; j < 16; ++j) {
            x[j] = (float)qc_gg_fp4_values[y[1 + j] & 0x0F] * d;
            x[16 + j] = (float)qc_gg_fp4_values[y[1 + j] >> 4] * d;
        }
    }
}

#endif
