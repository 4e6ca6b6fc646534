// GGUF legacy block types (32 values a block): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1.
// Included by qc_gguf.h (its helpers); one row of n values per call.
#ifndef QC_GGUF_LEGACY_H
#define QC_GGUF_LEGACY_H

// ggml's `amax = MAX(amax, fabsf(x[j]))` over 32 values, in order.  Without
// a NaN every order gives the same maximum (the values are >= +0), so 8
// lanes (vectorised) and their fold; with one, ggml's order (a NaN is taken
// by the ternary and dropped at the next value), one value at a time.
QC_GG_FN float qc_gg_amax32(const float *x) {
    float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int nan = 0;
    for (int j = 0; j < 32; j += 8)
        for (int k = 0; k < 8; ++k) {
            const float v = fabsf(x[j + k]);
            nan |= v != v;
            m[k] = m[k] > v ? m[k] : v;
        }
    float amax = 0;
    if (nan) {
        for (int j = 0; j < 32; ++j) amax = qc_gg_maxf(amax, fabsf(x[j]));
        return amax;
    }
    for (int k = 0; k < 8; ++k) amax = qc_gg_maxf(amax, m[k]);
    return amax;
}

// Q8_0: d = amax / 127 (fp16), q = round(x / d) in int8.  34 bytes: d, qs[32]
QC_GG_FN void qc_gg_q8_0(const float *x, const float *, uint8_t *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; ++b, x += 32, y += 34) {
        if (QC_GG_TRY_SSE(qc_gg_q8_0_sse(x, y))) continue;
        const float amax = qc_gg_amax32(x);
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        qc_gg_wr16(y, qc_gg_fp16(d));
        for (int j = 0; j < 32; ++j) y[2 + j] = (uint8_t)qc_gg_to_i8(roundf(x[j] * id));
    }
}

// a block's 32 codes q: the low nibbles at y[off + j] = q[j] | q[16 + j] << 4
// and (qh_at >= 0: Q5) bit 4 of each code in the 32-bit qh at y + qh_at
// (bit j: q[j], bit 16 + j: q[16 + j]); qc_gg_pack_nibbles_sse's scalar twin
QC_GG_FN void qc_gg_pack_nibbles(const uint8_t *q, uint8_t *y, int off, int qh_at) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const uint8_t q0 = q[j], q1 = q[16 + j];
        y[off + j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
        qh |= ((q0 & 0x10u) >> 4) << j;
        qh |= ((q1 & 0x10u) >> 4) << (j + 16);
    }
    if (qh_at >= 0) memcpy(y + qh_at, &qh, 4);
}

// Q4_0 / Q5_0 without imatrix, one block: d = max / -8 (-16),
// q = min(15 (31), trunc(x / d + 8.5 (16.5)))
template <int BITS>
QC_GG_FN void qc_gg_q_0_block(const float *x, uint8_t *y) {
    const int off = BITS == 4 ? 2 : 6;
    const float half = BITS == 4 ? 8.5f : 16.5f;
    const int qmax = BITS == 4 ? 15 : 31;
    const float d = qc_gg_signed_max(x, 32) / (BITS == 4 ? -8 : -16);
    const float id = d ? 1.0f / d : 0.0f;
    qc_gg_wr16(y, qc_gg_fp16(d));
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) q[j] = (uint8_t)qc_gg_min(qmax, qc_gg_to_i8(x[j] * id + half));
    qc_gg_pack_nibbles(q, y, off, BITS == 4 ? -1 : 2);
}

// Q4_0 / Q5_0 without imatrix: the blocks of a row (on x86, 8 at a time
// by the SSE lanes, a block with a NaN by the scalar loop)
template <int BITS>
QC_GG_FN void qc_gg_q_0_ref(const float *x, uint8_t *y, int64_t n) {
    const int B = BITS == 4 ? 18 : 22;
#ifdef QC_GG_SSE
    qc_gg_blocks_sse<B, qc_gg_q_0_sse<BITS>, qc_gg_q_0_block<BITS>>(x, y, n);
#else
    for (int64_t b = 0; b < n / 32; ++b, x += 32, y += B) qc_gg_q_0_block<BITS>(x, y);
#endif
}

// Q4_1 / Q5_1 without imatrix, one block: d = (max - min) / 15 (31),
// m = min, q = trunc((x - min) / d + 0.5) (Q4_1: at most 15)
template <int BITS>
QC_GG_FN void qc_gg_q_1_block(const float *x, uint8_t *y) {
    const int off = BITS == 4 ? 4 : 8;
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int j = 0; j < 32; ++j) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / (BITS == 4 ? 15 : 31);
    const float id = d ? 1.0f / d : 0.0f;
    qc_gg_wr16(y, qc_gg_fp16(d));
    qc_gg_wr16(y + 2, qc_gg_fp16(min));
    uint8_t q[32];
    for (int j = 0; j < 32; ++j) {
        const int8_t a = qc_gg_to_i8((x[j] - min) * id + 0.5f);
        q[j] = BITS == 4 ? (uint8_t)qc_gg_min(15, a) : (uint8_t)a;
    }
    qc_gg_pack_nibbles(q, y, off, BITS == 4 ? -1 : 4);
}

// Q4_1 / Q5_1 without imatrix: the blocks of a row (as qc_gg_q_0_ref)
template <int BITS>
QC_GG_FN void qc_gg_q_1_ref(const float *x, uint8_t *y, int64_t n) {
    const int B = BITS == 4 ? 20 : 24;
#ifdef QC_GG_SSE
    qc_gg_blocks_sse<B, qc_gg_q_1_sse<BITS>, qc_gg_q_1_block<BITS>>(x, y, n);
#else
    for (int64_t b = 0; b < n / 32; ++b, x += 32, y += B) qc_gg_q_1_block<BITS>(x, y);
#endif
}

// weights of the imatrix paths: qw * sqrt(sigma2 + x^2)
QC_GG_FN void qc_gg_weights(const float *x, const float *qw, float sigma2, float *w, int n) {
    for (int j = 0; j < n; ++j) w[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
}

// Q4_0 / Q5_0 with imatrix: make_qx_quants(32, 8 (16)) with those weights
template <int BITS>
QC_GG_FN void qc_gg_q_0_w(const float *x, const float *qw, uint8_t *y, int64_t n) {
    const int B = BITS == 4 ? 18 : 22, off = BITS == 4 ? 2 : 6;
    const float sigma2 = qc_gg_sumsq(x, n) / (float)n;
    float w[32];
    int8_t L[32];
    for (int64_t b = 0; b < n / 32; ++b, x += 32, qw += 32, y += B) {
        qc_gg_weights(x, qw, sigma2, w, 32);
        qc_gg_wr16(y, qc_gg_fp16(qc_gg_qx(32, BITS == 4 ? 8 : 16, x, L, w)));
        qc_gg_pack_nibbles((const uint8_t *)L, y, off, BITS == 4 ? -1 : 2);
    }
}

// Q4_1 / Q5_1 with imatrix: make_qkx3_quants(32, 15 (31), -0.9, 0.05, 36)
template <int BITS>
QC_GG_FN void qc_gg_q_1_w(const float *x, const float *qw, uint8_t *y, int64_t n) {
    const int B = BITS == 4 ? 20 : 24, off = BITS == 4 ? 4 : 8;
    const float sigma2 = qc_gg_sumsq(x, n) / (float)n;
    float w[32];
    uint8_t L[32], Laux[32];
    for (int64_t b = 0; b < n / 32; ++b, x += 32, qw += 32, y += B) {
        qc_gg_weights(x, qw, sigma2, w, 32);
        float min;
        float d = qc_gg_qkx(32, BITS == 4 ? 15 : 31, x, w, L, &min, Laux, -0.9f, 0.05f, 36,
                            false, true);
        qc_gg_wr16(y, qc_gg_fp16(d));
        qc_gg_wr16(y + 2, qc_gg_fp16(-min));
        qc_gg_pack_nibbles(L, y, off, BITS == 4 ? -1 : 4);
    }
}

QC_GG_FN void qc_gg_q4_0(const float *x, const float *qw, uint8_t *y, int64_t n) {
    if (qw) qc_gg_q_0_w<4>(x, qw, y, n); else qc_gg_q_0_ref<4>(x, y, n);
}
QC_GG_FN void qc_gg_q5_0(const float *x, const float *qw, uint8_t *y, int64_t n) {
    if (qw) qc_gg_q_0_w<5>(x, qw, y, n); else qc_gg_q_0_ref<5>(x, y, n);
}
QC_GG_FN void qc_gg_q4_1(const float *x, const float *qw, uint8_t *y, int64_t n) {
    if (qw) qc_gg_q_1_w<4>(x, qw, y, n); else qc_gg_q_1_ref<4>(x, y, n);
}
QC_GG_FN void qc_gg_q5_1(const float *x, const float *qw, uint8_t *y, int64_t n) {
    if (qw) qc_gg_q_1_w<5>(x, qw, y, n); else qc_gg_q_1_ref<5>(x, y, n);
}

// ------------------------------------------------------------ dequantize
QC_GG_FN void qc_gg_dq_legacy(int type, const uint8_t *y, float *x, int64_t n) {
    for (int64_t b = 0; b < n / 32; ++b, x += 32) {
        const float d = qc_gg_half(qc_gg_rd16(y));
        if (type == 8) {  // Q8_0
            for (int j = 0; j < 32; ++j) x[j] = (float)(int8_t)y[2 + j] * d;
            y += 34;
            continue;
        }
        const bool one = type == 3 || type == 7;   // Q4_1, Q5_1: a min
        const bool five = type == 6 || type == 7;  // Q5_0, Q5_1: a high bit
        const float m = one ? qc_gg_half(qc_gg_rd16(y + 2)) : 0.f;
        uint32_t qh = 0;
        if (five) memcpy(&qh, y + (one ? 4 : 2), 4);
        const uint8_t *qs = y + (one ? 4 : 2) + (five ? 4 : 0);
        const int zero = one ? 0 : (five ? 16 : 8);
        for (int j = 0; j < 16; ++j) {
            int q0 = (qs[j] & 0x0F) | (five ? (int)(((qh >> j) & 1) << 4) : 0);
            int q1 = (qs[j] >> 4) | (five ? (int)(((qh >> (j + 16)) & 1) << 4) : 0);
            if (one) {
                x[j] = (float)q0 * d + m;
                x[16 + j] = (float)q1 * d + m;
            } else {
                x[j] = (float)(q0 - zero) * d;
                x[16 + j] = (float)(q1 - zero) * d;
            }
        }
        y += (one ? 4 : 2) + (five ? 4 : 0) + 16;
    }
}

#endif
