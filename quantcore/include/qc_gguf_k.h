// GGUF K-quants (super-blocks of 256 values): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
// Included by qc_gguf.h (its helpers); one row of n values per call; qw the
// row's importance weights (one per column) or NULL.
#ifndef QC_GGUF_K_H
#define QC_GGUF_K_H

// the 2-bit codes of 256 values, 4 to a byte (value j + 32 k at bits 2k)
QC_GG_FN void qc_gg_pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QC_GG_QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

// Q2_K (84 bytes: scales[16] (4-bit scale | 4-bit min << 4), qs[64], d, dmin)
// x = d * sc * q - dmin * m, q in [0, 3], 16 groups of 16
QC_GG_FN void qc_gg_q2_k(const float *x, const float *qw, uint8_t *y, int64_t n) {
    uint8_t L[QC_GG_QK_K], Laux[16], Ls[16], Lm[16];
    float w[16], mins[16], scales[16], sw[16];
    for (int64_t b = 0; b < n / QC_GG_QK_K; ++b, x += QC_GG_QK_K, y += 84) {
        float dm, mm;
        if (!qw) {
            float max_scale = 0, max_min = 0;
            for (int j = 0; j < 16; ++j) {
                for (int l = 0; l < 16; ++l) w[l] = fabsf(x[16 * j + l]);
                scales[j] = qc_gg_qkx(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f,
                                      0.1f, 15, true, false);
                if (scales[j] > max_scale) max_scale = scales[j];
                if (mins[j] > max_min) max_min = mins[j];
            }
            if (max_scale > 0) {
                float iscale = 15.f / max_scale;
                for (int j = 0; j < 16; ++j) y[j] = (uint8_t)qc_gg_nearest(iscale * scales[j]);
                qc_gg_wr16(y + 80, qc_gg_fp16(max_scale / 15.f));
            } else {
                for (int j = 0; j < 16; ++j) y[j] = 0;
                qc_gg_wr16(y + 80, qc_gg_fp16(0.f));
            }
            if (max_min > 0) {
                float iscale = 15.f / max_min;
                for (int j = 0; j < 16; ++j)
                    y[j] = (uint8_t)(y[j] | (qc_gg_nearest(iscale * mins[j]) << 4));
                qc_gg_wr16(y + 82, qc_gg_fp16(max_min / 15.f));
            } else {
                qc_gg_wr16(y + 82, qc_gg_fp16(0.f));
            }
        } else {
            const float *q = qw + b * QC_GG_QK_K;
            const float sigma2 = qc_gg_sumsq(x, QC_GG_QK_K) / QC_GG_QK_K;
            for (int j = 0; j < 16; ++j) {
                for (int l = 0; l < 16; ++l)
                    w[l] = q[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
                sw[j] = 0;
                for (int l = 0; l < 16; ++l) sw[j] += w[l];
                scales[j] = qc_gg_qkx(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.9f,
                                      0.05f, 36, false, true);
            }
            dm = qc_gg_qp(16, 15, scales, Ls, sw);
            mm = qc_gg_qp(16, 15, mins, Lm, sw);
            qc_gg_wr16(y + 80, qc_gg_fp16(dm));
            qc_gg_wr16(y + 82, qc_gg_fp16(mm));
            for (int j = 0; j < 16; ++j) y[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        }
        dm = qc_gg_half(qc_gg_rd16(y + 80));
        mm = qc_gg_half(qc_gg_rd16(y + 82));
        for (int j = 0; j < 16; ++j) {
            const float d = dm * (float)(y[j] & 0xF);
            if (!d) continue;
            const float m = mm * (float)(y[j] >> 4);
            for (int i = 0; i < 16; ++i)
                L[16 * j + i] = (uint8_t)qc_gg_max(0, qc_gg_min(3, qc_gg_nearest((x[16 * j + i] + m) / d)));
        }
        qc_gg_pack2(L, y + 16);
    }
}

// Q3_K (110 bytes: hmask[32], qs[64], scales[12] (6-bit, biased by 32), d)
// x = d * (sc - 32) * (q - 4), q in [0, 7], 16 groups of 16
QC_GG_FN int qc_gg_q3_scale(const uint8_t *s, int j) {
    int sc = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    return (int8_t)((sc | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
}

QC_GG_FN void qc_gg_q3_k(const float *x, const float *qw, uint8_t *y, int64_t n) {
    int8_t L[QC_GG_QK_K], Ls[16];
    float scales[16], w[16], sw[16];
    for (int64_t b = 0; b < n / QC_GG_QK_K; ++b, x += QC_GG_QK_K, y += 110) {
        uint8_t *sc = y + 96;
        memset(sc, 0, 12);
        if (!qw) {
            float max_scale = 0, amax = 0;
            for (int j = 0; j < 16; ++j) {
                scales[j] = qc_gg_q3(16, 4, x + 16 * j, L + 16 * j);
                float a = fabsf(scales[j]);
                if (a > amax) { amax = a; max_scale = scales[j]; }
            }
            if (max_scale) {
                float iscale = -32.f / max_scale;
                for (int j = 0; j < 16; ++j) {
                    int8_t l = (int8_t)qc_gg_nearest(iscale * scales[j]);
                    Ls[j] = (int8_t)(qc_gg_max(-32, qc_gg_min(31, l)) + 32);
                }
                qc_gg_wr16(y + 108, qc_gg_fp16(1 / iscale));
            } else {
                for (int j = 0; j < 16; ++j) Ls[j] = -1;  // (scales stay 0)
                qc_gg_wr16(y + 108, qc_gg_fp16(0.f));
            }
        } else {
            const float *q = qw + b * QC_GG_QK_K;
            const float sigma2 = 2 * qc_gg_sumsq(x, QC_GG_QK_K) / QC_GG_QK_K;
            for (int j = 0; j < 16; ++j) {
                for (int l = 0; l < 16; ++l)
                    w[l] = q[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
                float s = 0;
                for (int l = 0; l < 16; ++l) s += w[l];
                sw[j] = s;
                scales[j] = qc_gg_qx(16, 4, x + 16 * j, L + 16 * j, w);
            }
            qc_gg_wr16(y + 108, qc_gg_fp16(qc_gg_qx(16, 32, scales, Ls, sw)));
        }
        for (int j = 0; j < 16; ++j) {
            if (Ls[j] < 0) break;
            int l = Ls[j];
            if (j < 8) sc[j] = (uint8_t)(l & 0xF); else sc[j - 8] = (uint8_t)(sc[j - 8] | ((l & 0xF) << 4));
            l >>= 4;
            sc[j % 4 + 8] = (uint8_t)(sc[j % 4 + 8] | (l << (2 * (j / 4))));
        }
        const float dall = qc_gg_half(qc_gg_rd16(y + 108));
        for (int j = 0; j < 16; ++j) {
            const float d = dall * (float)qc_gg_q3_scale(sc, j);
            if (!d) continue;
            for (int i = 0; i < 16; ++i)
                L[16 * j + i] = (int8_t)(qc_gg_max(-4, qc_gg_min(3, qc_gg_nearest(x[16 * j + i] / d))) + 4);
        }
        uint8_t *hm = y;
        memset(hm, 0, 32);
        uint8_t U[QC_GG_QK_K];
        for (int k = 0; k < 8; ++k)  // (branch-free, 32 bytes a row: vectorises)
            for (int j = 0; j < 32; ++j) {
                const int high = L[32 * k + j] > 3;
                hm[j] = (uint8_t)(hm[j] | (high << k));
                U[32 * k + j] = (uint8_t)(L[32 * k + j] - 4 * high);
            }
        qc_gg_pack2(U, y + 32);
    }
}

// the 6-bit scale and min of group j of Q4_K / Q5_K's 12 scale bytes
QC_GG_FN void qc_gg_k4_get(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

QC_GG_FN void qc_gg_k4_put(int j, uint8_t ls, uint8_t lm, uint8_t *s) {
    if (j < 4) { s[j] = ls; s[j + 4] = lm; }
    else {
        s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] = (uint8_t)(s[j - 4] | ((ls >> 4) << 6));
        s[j - 0] = (uint8_t)(s[j - 0] | ((lm >> 4) << 6));
    }
}

// Q4_K / Q5_K (144 / 176 bytes: d, dmin, scales[12], [qh[32]], qs[128])
// x = d * sc * q - dmin * m, q in [0, 15 (31)], 8 groups of 32
template <int BITS>
QC_GG_FN void qc_gg_q45_k(const float *x, const float *qw, uint8_t *y, int64_t n) {
    const int nmax = BITS == 4 ? 15 : 31, B = BITS == 4 ? 144 : 176;
    uint8_t L[QC_GG_QK_K], Laux[32], Ls[8], Lm[8];
    float w[32], mins[8], scales[8], sw[8];
    for (int64_t b = 0; b < n / QC_GG_QK_K; ++b, x += QC_GG_QK_K, y += B) {
        uint8_t *s = y + 4;
        if (!qw) {
            float max_scale = 0, max_min = 0;
            for (int j = 0; j < 8; ++j) {
                float sum_x2 = 0;
                for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
                float av_x = sqrtf(sum_x2 / 32);
                for (int l = 0; l < 32; ++l) w[l] = av_x + fabsf(x[32 * j + l]);
                scales[j] = qc_gg_qkx(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux,
                                      BITS == 4 ? -1.f : -0.5f, 0.1f, BITS == 4 ? 20 : 15,
                                      false, false);
                if (scales[j] > max_scale) max_scale = scales[j];
                if (mins[j] > max_min) max_min = mins[j];
            }
            float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
            float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
            for (int j = 0; j < 8; ++j) {
                uint8_t ls = (uint8_t)qc_gg_nearest(inv_scale * scales[j]);
                uint8_t lm = (uint8_t)qc_gg_nearest(inv_min * mins[j]);
                qc_gg_k4_put(j, ls < 63 ? ls : 63, lm < 63 ? lm : 63, s);
            }
            qc_gg_wr16(y, qc_gg_fp16(max_scale / 63.f));
            qc_gg_wr16(y + 2, qc_gg_fp16(max_min / 63.f));
        } else {
            const float *q = qw + b * QC_GG_QK_K;
            const float sigma2 = 2 * qc_gg_sumsq(x, QC_GG_QK_K) / QC_GG_QK_K;
            for (int j = 0; j < 8; ++j) {
                for (int l = 0; l < 32; ++l)
                    w[l] = q[32 * j + l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
                float sumw = 0;
                for (int l = 0; l < 32; ++l) sumw += w[l];
                sw[j] = sumw;
                scales[j] = qc_gg_qkx(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -0.9f,
                                      0.05f, 36, false, true);
            }
            float d_block = qc_gg_qp(8, 63, scales, Ls, sw);
            float m_block = qc_gg_qp(8, 63, mins, Lm, sw);
            for (int j = 0; j < 8; ++j) {
                uint8_t ls = Ls[j], lm = Lm[j];
                if (BITS == 5) { ls = ls < 63 ? ls : 63; lm = lm < 63 ? lm : 63; }
                qc_gg_k4_put(j, ls, lm, s);
            }
            qc_gg_wr16(y, qc_gg_fp16(d_block));
            qc_gg_wr16(y + 2, qc_gg_fp16(m_block));
        }
        const float dd = qc_gg_half(qc_gg_rd16(y)), dmin = qc_gg_half(qc_gg_rd16(y + 2));
        for (int j = 0; j < 8; ++j) {
            uint8_t sc, m;
            qc_gg_k4_get(j, s, &sc, &m);
            const float d = dd * (float)sc;
            if (!d) continue;
            const float dm = dmin * (float)m;
            for (int i = 0; i < 32; ++i)
                L[32 * j + i] = (uint8_t)qc_gg_max(0, qc_gg_min(nmax, qc_gg_nearest((x[32 * j + i] + dm) / d)));
        }
        if (BITS == 4) {
            uint8_t *qs = y + 16;
            for (int j = 0; j < QC_GG_QK_K; j += 64, qs += 32)
                for (int l = 0; l < 32; ++l) qs[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        } else {
            uint8_t *qh = y + 16, *ql = y + 48;
            memset(qh, 0, 32);
            uint8_t m1 = 1, m2 = 2;
            for (int k = 0; k < QC_GG_QK_K; k += 64, ql += 32) {
                for (int j = 0; j < 32; ++j) {
                    int l1 = L[k + j], l2 = L[k + j + 32];
                    if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
                    if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
                    ql[j] = (uint8_t)(l1 | (l2 << 4));
                }
                m1 = (uint8_t)(m1 << 2); m2 = (uint8_t)(m2 << 2);
            }
        }
    }
}

QC_GG_FN void qc_gg_q4_k(const float *x, const float *qw, uint8_t *y, int64_t n) {
    qc_gg_q45_k<4>(x, qw, y, n);
}
QC_GG_FN void qc_gg_q5_k(const float *x, const float *qw, uint8_t *y, int64_t n) {
    qc_gg_q45_k<5>(x, qw, y, n);
}

// Q6_K (210 bytes: ql[128], qh[64], scales[16] (int8), d)
// x = d * sc * (q - 32), q in [0, 63], 16 groups of 16
QC_GG_FN void qc_gg_q6_k(const float *x, const float *qw, uint8_t *y, int64_t n) {
    int8_t L[QC_GG_QK_K];
    float scales[16];
    for (int64_t b = 0; b < n / QC_GG_QK_K; ++b, x += QC_GG_QK_K, y += 210) {
        float max_scale = 0, max_abs = 0;
        for (int j = 0; j < 16; ++j) {
            const float *w = qw ? qw + b * QC_GG_QK_K + 16 * j : nullptr;
            scales[j] = qc_gg_qx(16, 32, x + 16 * j, L + 16 * j, w);
            const float a = fabsf(scales[j]);
            if (a > max_abs) { max_abs = a; max_scale = scales[j]; }
        }
        if (max_abs < QC_GG_EPS) {
            memset(y, 0, 210);
            continue;
        }
        const float iscale = -128.f / max_scale;
        qc_gg_wr16(y + 208, qc_gg_fp16(1 / iscale));
        int8_t *sc = (int8_t *)(y + 192);
        for (int j = 0; j < 16; ++j) sc[j] = (int8_t)qc_gg_min(127, qc_gg_nearest(iscale * scales[j]));
        const float dd = qc_gg_half(qc_gg_rd16(y + 208));
        for (int j = 0; j < 16; ++j) {
            const float d = dd * (float)sc[j];
            if (!d) continue;
            for (int i = 0; i < 16; ++i)
                L[16 * j + i] = (int8_t)(qc_gg_max(-32, qc_gg_min(31, qc_gg_nearest(x[16 * j + i] / d))) + 32);
        }
        uint8_t *ql = y, *qh = y + 128;
        for (int j = 0; j < QC_GG_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t a = L[j + l] & 0xF, c = L[j + l + 32] & 0xF;
                const uint8_t e = L[j + l + 64] & 0xF, f = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(a | (e << 4));
                ql[l + 32] = (uint8_t)(c | (f << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

// ------------------------------------------------------------ dequantize
QC_GG_FN void qc_gg_dq_k(int type, const uint8_t *y, float *x, int64_t n) {
    for (int64_t b = 0; b < n / QC_GG_QK_K; ++b) {
        if (type == 10) {  // Q2_K
            const float d = qc_gg_half(qc_gg_rd16(y + 80)), mn = qc_gg_half(qc_gg_rd16(y + 82));
            for (int j = 0; j < 16; ++j) {
                const float dl = d * (float)(y[j] & 0xF), ml = mn * (float)(y[j] >> 4);
                for (int l = 0; l < 16; ++l) {
                    const int v = 16 * j + l;  // value v: byte 16 + 32 (v / 128) + v % 32
                    const int q = (y[16 + 32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
                    x[v] = dl * (float)q - ml;
                }
            }
            y += 84;
        } else if (type == 11) {  // Q3_K
            const float dall = qc_gg_half(qc_gg_rd16(y + 108));
            for (int j = 0; j < 16; ++j) {
                const float dl = dall * (float)qc_gg_q3_scale(y + 96, j);
                for (int l = 0; l < 16; ++l) {
                    const int v = 16 * j + l;
                    const int q = (y[32 + 32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
                    const int h = (y[v % 32] >> (v / 32)) & 1;
                    x[v] = dl * (float)(q - (h ? 0 : 4));
                }
            }
            y += 110;
        } else if (type == 12 || type == 13) {  // Q4_K, Q5_K
            const bool five = type == 13;
            const float d = qc_gg_half(qc_gg_rd16(y)), mn = qc_gg_half(qc_gg_rd16(y + 2));
            const uint8_t *qs = y + (five ? 48 : 16), *qh = y + 16;
            for (int j = 0; j < 8; ++j) {
                uint8_t sc, m;
                qc_gg_k4_get(j, y + 4, &sc, &m);
                const float dl = d * (float)sc, ml = mn * (float)m;
                for (int l = 0; l < 32; ++l) {
                    int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
                    if (five && (qh[l] >> j) & 1) q += 16;
                    x[32 * j + l] = dl * (float)q - ml;
                }
            }
            y += five ? 176 : 144;
        } else {  // Q6_K
            const float d = qc_gg_half(qc_gg_rd16(y + 208));
            const int8_t *sc = (const int8_t *)(y + 192);
            for (int v = 0; v < QC_GG_QK_K; ++v) {
                const int h = v / 128, r = v % 128, k = r / 32, l = r % 32;
                const int lo = (y[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xF;
                const int hi = (y[128 + 32 * h + l] >> (2 * k)) & 3;
                x[v] = d * (float)sc[8 * h + l / 16 + 2 * k] * (float)((lo | (hi << 4)) - 32);
            }
            y += 210;
        }
        x += QC_GG_QK_K;
    }
}

#endif
