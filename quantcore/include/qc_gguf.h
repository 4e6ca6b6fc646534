// GGUF block types (llama.cpp's ggml quantization), bit for bit with ggml's
// C reference built without FMA contraction (docs/FORMATS.md, "GGUF").
//
// Each type quantizes one row of n floats (n a multiple of its block size)
// into n / block blocks, as ggml's quantize_<type>(src, dst, nrow, n, qw)
// does for one row: without an importance matrix qw the reference path
// (quantize_row_<type>_ref), with one the weighted search.  Every float
// operation is float32 in ggml's order (the build has -ffp-contract=off and
// no -ffast-math); float -> small int conversions that C leaves undefined
// out of range (the legacy types' (int8_t)(x + 8.5f), Q8_0's roundf) are
// written as x86's cvttss2si (NaN or out of range: INT32_MIN) and a
// truncation to the low byte, which is what ggml's x86-64 build does.
//
// The helpers (nearest_int, the per-group searches) follow the facts of
// ggml's algorithm: see the numpydoc of quantcore.gguf for the formulas.
#ifndef QC_GGUF_H
#define QC_GGUF_H

// Host code, and device code (quantcore_gpu/cuda/gguf.cu: a row a thread).
// NVRTC has no C library headers: the fixed-width types and INT32_MIN here.
#ifdef __CUDACC__
#if !defined(INT8_MAX)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#endif
#ifndef INT32_MIN
#define INT32_MIN (-2147483647 - 1)
#endif
#define QC_GG_FN static __device__ inline
#define QC_GG_TABLE static __device__ const
#else
#include <math.h>
#include <stdint.h>
#include <string.h>
#define QC_GG_FN static inline
#define QC_GG_TABLE static const
#endif

#define QC_GG_QK_K 256
#define QC_GG_EPS 1e-15f

// ---------------------------------------------------------------- scalars
QC_GG_FN uint32_t qc_gg_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
QC_GG_FN float qc_gg_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// IEEE binary16 from float32, round to nearest even; NaN -> sign | 0x7E00
// (ggml's GGML_FP32_TO_FP16 on a build without F16C)
QC_GG_FN uint16_t qc_gg_fp16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = qc_gg_bits(f), shl1 = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1 & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = qc_gg_float((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = qc_gg_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1 > 0xFF000000u ? 0x7E00u : nonsign));
}

// float32 from binary16 (exact)
QC_GG_FN float qc_gg_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) return qc_gg_float(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1.0p-24f;
        return sign ? -v : v;
    }
    return qc_gg_float(sign | ((e + 112) << 23) | (m << 13));
}

QC_GG_FN uint16_t qc_gg_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
QC_GG_FN void qc_gg_wr16(uint8_t *p, uint16_t v) { p[0] = v & 0xFF; p[1] = v >> 8; }

// nearest_int: float + 1.5 * 2**23, the low mantissa bits (ties to even).
// A NaN on x86 keeps its payload through the sum: 0 for the default NaN an
// invalid operation makes and for numpy's nan; the device's NaN result is
// 0x7FFFFFFF whatever the operands, so there a NaN gives that 0 outright.
QC_GG_FN int qc_gg_nearest(float f) {
#ifdef __CUDACC__
    if (f != f) return 0;
#endif
    uint32_t i = qc_gg_bits(f + 12582912.f);
    return (int)(i & 0x007fffffu) - 0x00400000;
}

// x86-64's float -> int32 truncation (cvttss2si): NaN / out of range -> INT32_MIN
QC_GG_FN int32_t qc_gg_trunc32(float f) {
    const bool ok = f > -2147483904.0f && f < 2147483648.0f;  // (false for NaN)
    const int32_t v = (int32_t)(ok ? f : 0.0f);               // branch-free: vectorises
    return ok ? v : INT32_MIN;
}
QC_GG_FN int8_t qc_gg_to_i8(float f) { return (int8_t)(uint8_t)(uint32_t)qc_gg_trunc32(f); }

QC_GG_FN int qc_gg_min(int a, int b) { return a < b ? a : b; }
QC_GG_FN int qc_gg_max(int a, int b) { return a > b ? a : b; }
QC_GG_FN float qc_gg_maxf(float a, float b) { return a > b ? a : b; }  // ggml's MAX

#include "qc_gguf_sse.h"  // SSE4.1 lanes (x86-64): legacy blocks, the qkx search

// ------------------------------------------------------ per-group searches
// the value of largest magnitude, the first of equal magnitudes (a NaN is
// never taken; 0 when every |x| is 0)
QC_GG_FN float qc_gg_signed_max(const float *x, int n) {
    float amax = 0, max = 0;
#ifdef QC_GG_SSE
    if (n % 4 == 0 && n <= 32 && qc_gg_signed_max_n_sse(x, n, &max)) return max;
#endif
    for (int j = 0; j < n; ++j)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    return max;
}

// make_qx_quants: symmetric codes L in [0, 2 nmax), scale by weighted least
// squares over 19 candidate inverse scales (rmse_type 1; qw: weights or x^2)
QC_GG_FN float qc_gg_qx(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    const float max = qc_gg_signed_max(x, n);
    if (fabsf(max) < QC_GG_EPS) { for (int i = 0; i < n; ++i) L[i] = 0; return 0.f; }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = qc_gg_nearest(iscale * x[i]);
        l = qc_gg_max(-nmax, qc_gg_min(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
#ifdef QC_GG_SSE
    qc_gg_qx_search_sse(n, nmax, x, L, qw, max, &scale, &best);
#else
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = qc_gg_nearest(iscale * x[i]);
            l = qc_gg_max(-nmax, qc_gg_min(nmax - 1, l));
            float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = qc_gg_nearest(iscale * x[i]);
                L[i] = (int8_t)(nmax + qc_gg_max(-nmax, qc_gg_min(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
#endif
    return scale;
}

// make_q3_quants (do_rmse): codes in [-nmax, nmax), then up to 5 rounds of
// one-code moves that raise sumlx^2 / suml2 (weights x^2); L stored + nmax
QC_GG_FN float qc_gg_q3(int n, int nmax, const float *x, int8_t *L) {
    const float max = qc_gg_signed_max(x, n);
    if (fabsf(max) < QC_GG_EPS) { for (int i = 0; i < n; ++i) L[i] = 0; return 0.f; }
    float iscale = (float)(-nmax) / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = qc_gg_nearest(iscale * x[i]);
        l = qc_gg_max(-nmax, qc_gg_min(nmax - 1, l));
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
#ifdef QC_GG_SSE
    qc_gg_q3_moves_sse(n, nmax, x, L, &sumlx, &suml2);
#else
    for (int itry = 0; itry < 5; ++itry) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                int nl = qc_gg_nearest(x[i] * sl2 / slx);
                nl = qc_gg_max(-nmax, qc_gg_min(nmax - 1, nl));
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl; sumlx = slx; suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
#endif
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// make_qkx2_quants / make_qkx3_quants (one body: w == NULL means x^2
// weights): asymmetric codes in [0, nmax] with a min <= 0; nstep + 1
// candidate scales, each refit by weighted least squares (scale, min), the
// best by weighted squared (or absolute, mad) error
QC_GG_FN float qc_gg_qkx(int n, int nmax, const float *x, const float *w, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta,
                              int nstep, bool mad, bool le) {
    float min = x[0], max = x[0];
    float sum_w = w ? w[0] : x[0] * x[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float wi = w ? w[i] : x[i] * x[i];
        sum_w += wi;
        sum_x += wi * x[i];
    }
    if (min > 0) min = 0;
    if (le ? max <= min : max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; ++i) {
        int l = qc_gg_nearest(iscale * (x[i] - min));
        L[i] = (uint8_t)qc_gg_max(0, qc_gg_min(nmax, l));
        float diff = scale * (float)L[i] + min - x[i];
        diff = mad ? fabsf(diff) : diff * diff;
        float wi = w ? w[i] : x[i] * x[i];
        best += wi * diff;
    }
    if (nstep < 1) { *the_min = -min; return scale; }
#ifdef QC_GG_SSE
    qc_gg_qkx_search_sse(n, nmax, x, w, L, rmin, rdelta, nstep, mad, sum_w, sum_x, max, &min,
                         &scale, &best);  // (Laux: the scalar loop's scratch only)
#else
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = qc_gg_nearest(iscale * (x[i] - min));
            l = qc_gg_max(0, qc_gg_min(nmax, l));
            Laux[i] = (uint8_t)l;
            float wi = w ? w[i] : x[i] * x[i];
            sum_l += wi * (float)l;
            sum_l2 += wi * (float)l * (float)l;
            sum_xl += wi * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) { this_min = 0; this_scale = sum_xl / sum_l2; }
            float cur = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = mad ? fabsf(diff) : diff * diff;
                float wi = w ? w[i] : x[i] * x[i];
                cur += wi * diff;
            }
            if (cur < best) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best = cur; scale = this_scale; min = this_min;
            }
        }
    }
#endif
    *the_min = -min;
    return scale;
}

// make_qp_quants: positive codes in [0, nmax] for the sub-block scales of
// the weighted K-quants (8 candidate inverse scales, then 5 rounds of moves)
QC_GG_FN float qc_gg_qp(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = qc_gg_maxf(max, x[i]);
    if (max < QC_GG_EPS) { for (int i = 0; i < n; ++i) L[i] = 0; return 0.f; }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)qc_gg_nearest(iscale * x[i]);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * (float)L[i];
        best += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        float iscale_is = (0.1f * (float)is + (float)nmax) / max;
        float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = qc_gg_min(nmax, qc_gg_nearest(iscale_is * x[i]));
            float diff = x[i] - scale_is * (float)l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best) { best = mse; iscale = iscale_is; }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = qc_gg_min(nmax, qc_gg_nearest(iscale * x[i]));
        L[i] = (uint8_t)l;
        sumlx += qw[i] * x[i] * (float)l;
        suml2 += qw[i] * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = qw[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            if (slx > 0 && sl2 > 0) {
                int nl = qc_gg_min(nmax, qc_gg_nearest(x[i] * sl2 / slx));
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)nl; sumlx = slx; suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// the sum of squares of a row (the weighted paths' sigma^2)
QC_GG_FN float qc_gg_sumsq(const float *x, int64_t n) {
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

#include "qc_gguf_legacy.h"
#include "qc_gguf_k.h"
#include "qc_gguf_iq4.h"

// ---------------------------------------------------------------- registry
// Every type with its ggml type id (gguf-py's GGMLQuantizationType), its
// row quantizer and its dequantizer; quantcore.gguf.TYPES holds the names
// and block sizes (tests/test_gguf.py checks the two lists agree).
#define QC_GGUF_TYPES(X)                  \
    X(8, qc_gg_q8_0, qc_gg_dq_legacy)     \
    X(2, qc_gg_q4_0, qc_gg_dq_legacy)     \
    X(3, qc_gg_q4_1, qc_gg_dq_legacy)     \
    X(6, qc_gg_q5_0, qc_gg_dq_legacy)     \
    X(7, qc_gg_q5_1, qc_gg_dq_legacy)     \
    X(14, qc_gg_q6_k, qc_gg_dq_k)         \
    X(12, qc_gg_q4_k, qc_gg_dq_k)         \
    X(13, qc_gg_q5_k, qc_gg_dq_k)         \
    X(11, qc_gg_q3_k, qc_gg_dq_k)         \
    X(10, qc_gg_q2_k, qc_gg_dq_k)         \
    X(20, qc_gg_iq4_nl, qc_gg_dq_iq4)     \
    X(23, qc_gg_iq4_xs, qc_gg_dq_iq4)     \
    X(39, qc_gg_mxfp4, qc_gg_dq_mxfp4)

#ifndef __CUDACC__
typedef void (*qc_gg_row_fn)(const float *x, const float *qw, uint8_t *y, int64_t n);

// the row quantizer of a type id (NULL: none)
QC_GG_FN qc_gg_row_fn qc_gg_quantizer(int id) {
#define QC_GG_Q(ID, Q, D) if (id == ID) return Q;
    QC_GGUF_TYPES(QC_GG_Q)
#undef QC_GG_Q
    return nullptr;
}
#endif

// the row quantizer of type id ID, called (the GPU kernels' form: one
// instantiation per type, no function pointer)
template <int ID>
QC_GG_FN void qc_gg_quantize_row(const float *x, const float *qw, uint8_t *y, int64_t n) {
#define QC_GG_R(ID_, Q, D) if (ID == ID_) { Q(x, qw, y, n); return; }
    QC_GGUF_TYPES(QC_GG_R)
#undef QC_GG_R
}

// dequantize one row of n values of type id (false: unknown id)
QC_GG_FN bool qc_gg_dequantize(int id, const uint8_t *y, float *x, int64_t n) {
#define QC_GG_D(ID, Q, D) if (id == ID) { D(id, y, x, n); return true; }
    QC_GGUF_TYPES(QC_GG_D)
#undef QC_GG_D
    return false;
}

#endif
