/* AArch64 variants: NEON (every ARMv8-A, Kunpeng 920 included); with HS_DOTPROD the ARMv8.2
 * SDOT instruction (Kunpeng 920 has it); with HS_I8MM as well, batched products through the
 * ARMv8.6 SMMLA 2x2 int8 matrix multiply (Kunpeng 920B, Neoverse N2/V1). Compiled with
 * -march=armv8-a, -march=armv8.2-a+dotprod or -march=armv8.2-a+dotprod+i8mm. */
#include <arm_neon.h>

#include "gguf_layout.h"

#if defined(HS_I8MM)
#define HS_KERNEL_NAME "i8mm"
#define HS_KERNEL_GETTER hs_kernels_i8mm
#elif defined(HS_DOTPROD)
#define HS_KERNEL_NAME "dotprod"
#define HS_KERNEL_GETTER hs_kernels_dotprod
#endif
#ifdef HS_DOTPROD
static inline int32x4_t dot16(int32x4_t acc, int8x16_t x, int8x16_t y) {
    return vdotq_s32(acc, x, y);
}
#else
#define HS_KERNEL_NAME "neon"
#define HS_KERNEL_GETTER hs_kernels_neon
static inline int32x4_t dot16(int32x4_t acc, int8x16_t x, int8x16_t y) {
    const int16x8_t lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
    const int16x8_t hi = vmull_high_s8(x, y);
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}
#endif

static void quantize_act(const float *x, void *out, int n) {
    block_q8a *y = out;
    for (int b = 0; b < n / HS_QK; b++) {
        const float *v = x + b * HS_QK;
        float32x4_t f[8], amax = vdupq_n_f32(0.0f);
        for (int j = 0; j < 8; j++) {
            f[j] = vld1q_f32(v + 4 * j);
            amax = vmaxq_f32(amax, vabsq_f32(f[j]));
        }
        const float max = vmaxvq_f32(amax);
        const float d = max / 127.0f, id = max != 0.0f ? 127.0f / max : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < 8; j++) {
            const int32x4_t q = vcvtnq_s32_f32(vmulq_n_f32(f[j], id));
            sum += vaddvq_s32(q);
            y[b].qs[4 * j + 0] = (int8_t)vgetq_lane_s32(q, 0);
            y[b].qs[4 * j + 1] = (int8_t)vgetq_lane_s32(q, 1);
            y[b].qs[4 * j + 2] = (int8_t)vgetq_lane_s32(q, 2);
            y[b].qs[4 * j + 3] = (int8_t)vgetq_lane_s32(q, 3);
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

static void dot_q4_0(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                     float *out) {
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int b = 0; b < nb; b++) {
        const int8x16_t y0 = vld1q_s8(a[b].qs), y1 = vld1q_s8(a[b].qs + 16);
        for (int r = 0; r < nrows; r++) {
            const block_q4_0 *x = (const block_q4_0 *)((const char *)w + r * stride) + b;
            const uint8x16_t raw = vld1q_u8(x->qs);
            const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, mask)), eight);
            const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight);
            const int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, y0), hi, y1);
            acc[r] = vmlaq_n_f32(acc[r], vcvtq_f32_s32(p), hs_f16(x->d) * a[b].d);
        }
    }
    for (int r = 0; r < nrows; r++) out[r] = vaddvq_f32(acc[r]);
}

static void dot_q4_1(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                     float *out) {
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    float mins[4] = {0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        const int8x16_t y0 = vld1q_s8(a[b].qs), y1 = vld1q_s8(a[b].qs + 16);
        for (int r = 0; r < nrows; r++) {
            const block_q4_1 *x = (const block_q4_1 *)((const char *)w + r * stride) + b;
            const uint8x16_t raw = vld1q_u8(x->qs);
            const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, mask));
            const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
            const int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, y0), hi, y1);
            acc[r] = vmlaq_n_f32(acc[r], vcvtq_f32_s32(p), hs_f16(x->d) * a[b].d);
            mins[r] += hs_f16(x->m) * a[b].s;
        }
    }
    for (int r = 0; r < nrows; r++) out[r] = vaddvq_f32(acc[r]) + mins[r];
}

static void dot_q8_0(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                     float *out) {
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int b = 0; b < nb; b++) {
        const int8x16_t y0 = vld1q_s8(a[b].qs), y1 = vld1q_s8(a[b].qs + 16);
        for (int r = 0; r < nrows; r++) {
            const block_q8_0 *x = (const block_q8_0 *)((const char *)w + r * stride) + b;
            const int32x4_t p = dot16(dot16(vdupq_n_s32(0), vld1q_s8(x->qs), y0),
                                      vld1q_s8(x->qs + 16), y1);
            acc[r] = vmlaq_n_f32(acc[r], vcvtq_f32_s32(p), hs_f16(x->d) * a[b].d);
        }
    }
    for (int r = 0; r < nrows; r++) out[r] = vaddvq_f32(acc[r]);
}

/* Products with fp16 rows: each row converted once for ng float rows (attend.h's primitives,
 * grouped-query attention); the single dot is their ng = 1 case. */
static inline void dots_f16(int hd, const hs_fp16 *k, const float *q, int ng, float *out) {
    float32x4_t a[HS_ATTN_GROUP];
    for (int g = 0; g < ng; g++) a[g] = vdupq_n_f32(0);
    int j = 0;
    for (; j + 4 <= hd; j += 4) {
        const float32x4_t kv = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(k + j)));
        for (int g = 0; g < ng; g++) a[g] = vfmaq_f32(a[g], kv, vld1q_f32(q + (size_t)g * hd + j));
    }
    for (int g = 0; g < ng; g++) {
        float sum = vaddvq_f32(a[g]);
        for (int t = j; t < hd; t++) sum += hs_f16(k[t]) * q[(size_t)g * hd + t];
        out[g] = sum;
    }
}

static inline void axpys_f16(int hd, const hs_fp16 *v, const float *w, int ng, float *acc) {
    int j = 0;
    for (; j + 4 <= hd; j += 4) {
        const float32x4_t vv = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(v + j)));
        for (int g = 0; g < ng; g++) {
            float *y = acc + (size_t)g * hd + j;
            vst1q_f32(y, vfmaq_n_f32(vld1q_f32(y), vv, w[g]));
        }
    }
    for (; j < hd; j++)
        for (int g = 0; g < ng; g++) acc[(size_t)g * hd + j] += w[g] * hs_f16(v[j]);
}

static float dot_f16(int n, const hs_fp16 *w, const float *x) {
    float out;
    dots_f16(n, w, x, 1, &out);
    return out;
}

static float dot_f32(int n, const float *w, const float *x) {
    float32x4_t acc = vdupq_n_f32(0);
    int j = 0;
    for (; j + 4 <= n; j += 4) acc = vfmaq_f32(acc, vld1q_f32(w + j), vld1q_f32(x + j));
    float sum = vaddvq_f32(acc);
    for (; j < n; j++) sum += w[j] * x[j];
    return sum;
}

static void to_f16(int n, const float *x, hs_fp16 *y) { /* FPCR's default: nearest even */
    int j = 0;
    for (; j + 4 <= n; j += 4) vst1_u16(y + j, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + j))));
    for (; j < n; j++) y[j] = hs_fp32_to_fp16(x[j]);
}

#include "attend.h"

#ifndef HS_I8MM /* i8mm's batched products are its SMMLA tiles, below */
/* Batched products: each weight block is unpacked once for up to four activations. */
static void gemm_q4_0(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                      float *out) {
    const block_q4_0 *x = w;
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int b = 0; b < nb; b++) {
        const uint8x16_t raw = vld1q_u8(x[b].qs);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, mask)), eight);
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight);
        const float dw = hs_f16(x[b].d);
        for (int c = 0; c < ncols; c++) {
            const block_q8a *y = a + c * astride + b;
            const int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(y->qs)), hi,
                                      vld1q_s8(y->qs + 16));
            acc[c] = vmlaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * y->d);
        }
    }
    for (int c = 0; c < ncols; c++) out[c] = vaddvq_f32(acc[c]);
}

static void gemm_q4_1(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                      float *out) {
    const block_q4_1 *x = w;
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    float mins[4] = {0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        const uint8x16_t raw = vld1q_u8(x[b].qs);
        const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, mask));
        const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
        const float dw = hs_f16(x[b].d), mw = hs_f16(x[b].m);
        for (int c = 0; c < ncols; c++) {
            const block_q8a *y = a + c * astride + b;
            const int32x4_t p = dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(y->qs)), hi,
                                      vld1q_s8(y->qs + 16));
            acc[c] = vmlaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * y->d);
            mins[c] += mw * y->s;
        }
    }
    for (int c = 0; c < ncols; c++) out[c] = vaddvq_f32(acc[c]) + mins[c];
}

static void gemm_q8_0(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                      float *out) {
    const block_q8_0 *x = w;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    for (int b = 0; b < nb; b++) {
        const int8x16_t x0 = vld1q_s8(x[b].qs), x1 = vld1q_s8(x[b].qs + 16);
        const float dw = hs_f16(x[b].d);
        for (int c = 0; c < ncols; c++) {
            const block_q8a *y = a + c * astride + b;
            const int32x4_t p = dot16(dot16(vdupq_n_s32(0), x0, vld1q_s8(y->qs)), x1,
                                      vld1q_s8(y->qs + 16));
            acc[c] = vmlaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * y->d);
        }
    }
    for (int c = 0; c < ncols; c++) out[c] = vaddvq_f32(acc[c]);
}

GGUF_MM(mm_q4_0, dot_q4_0, gemm_q4_0)
GGUF_MM(mm_q4_1, dot_q4_1, gemm_q4_1)
GGUF_MM(mm_q8_0, dot_q8_0, gemm_q8_0)
#else
/* SMMLA multiplies a 2x8 by an 8x2 int8 matrix into 2x2 int32: two weight rows against two
 * activation rows, eight elements at a time. Weights stay in the GGUF layout and activations
 * in block_q8a; a tile of up to 4 x 4 runs as 2 x 2 sub-tiles, an odd row
 * or column computed twice and dropped. */
enum { Q4_0, Q4_1, Q8_0 };

/* The block's 32 weights as signed int8 (lo: elements 0..15, hi: 16..31) and its scale/min. */
static inline void weights(int kind, const char *row, int b, int8x16_t *lo, int8x16_t *hi,
                           float *d, float *m) {
    if (kind == Q8_0) {
        const block_q8_0 *x = (const block_q8_0 *)row + b;
        *lo = vld1q_s8(x->qs);
        *hi = vld1q_s8(x->qs + 16);
        *d = hs_f16(x->d);
        *m = 0.0f;
        return;
    }
    const uint8_t *qs = kind == Q4_0 ? ((const block_q4_0 *)row + b)->qs : ((const block_q4_1 *)row + b)->qs;
    const uint8x16_t raw = vld1q_u8(qs);
    const int8x16_t off = vdupq_n_s8(kind == Q4_0 ? 8 : 0);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), off);
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), off);
    if (kind == Q4_0) {
        *d = hs_f16(((const block_q4_0 *)row + b)->d);
        *m = 0.0f;
    } else {
        *d = hs_f16(((const block_q4_1 *)row + b)->d);
        *m = hs_f16(((const block_q4_1 *)row + b)->m);
    }
}

/* 8-byte halves of two 16-byte vectors interleaved as SMMLA's 2x8 operands. */
static inline int8x16_t zip_lo(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
static inline int8x16_t zip_hi(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

/* Rows r0, r1 x activation columns (c0, c1), (c2, c3): up to two 2 x 2 sub-tiles per block. */
static inline __attribute__((always_inline)) void pair_tile(int kind, int nb, const char *w0,
                                                            const char *w1, const block_q8a **y,
                                                            int npairs, float32x4_t *acc,
                                                            float32x4_t *mins) {
    for (int b = 0; b < nb; b++) {
        int8x16_t lo0, hi0, lo1, hi1;
        float d0, d1, m0, m1;
        weights(kind, w0, b, &lo0, &hi0, &d0, &m0);
        weights(kind, w1, b, &lo1, &hi1, &d1, &m1);
        const int8x16_t a0 = zip_lo(lo0, lo1), a1 = zip_hi(lo0, lo1);
        const int8x16_t a2 = zip_lo(hi0, hi1), a3 = zip_hi(hi0, hi1);
        const float dw[4] = {d0, d0, d1, d1}, mw[4] = {m0, m0, m1, m1};
        for (int p = 0; p < npairs; p++) {
            const block_q8a *ya = y[2 * p] + b, *yb = y[2 * p + 1] + b;
            const int8x16_t ya0 = vld1q_s8(ya->qs), ya1 = vld1q_s8(ya->qs + 16);
            const int8x16_t yb0 = vld1q_s8(yb->qs), yb1 = vld1q_s8(yb->qs + 16);
            int32x4_t s = vmmlaq_s32(vdupq_n_s32(0), a0, zip_lo(ya0, yb0));
            s = vmmlaq_s32(s, a1, zip_hi(ya0, yb0));
            s = vmmlaq_s32(s, a2, zip_lo(ya1, yb1));
            s = vmmlaq_s32(s, a3, zip_hi(ya1, yb1));
            const float dy[4] = {ya->d, yb->d, ya->d, yb->d};
            acc[p] = vfmaq_f32(acc[p], vcvtq_f32_s32(s), vmulq_f32(vld1q_f32(dw), vld1q_f32(dy)));
            if (kind == Q4_1) {
                const float sy[4] = {ya->s, yb->s, ya->s, yb->s};
                mins[p] = vfmaq_f32(mins[p], vld1q_f32(mw), vld1q_f32(sy));
            }
        }
    }
}

static inline __attribute__((always_inline)) void mm(int kind, int nb, const void *w,
                                                     size_t wstride, int nrows, const void *a,
                                                     size_t astride, int ncols, float *out,
                                                     size_t ostride) {
    if (ncols == 1) { /* one activation row: SDOT, NRC rows at a time */
        gguf_mm(kind == Q4_0 ? dot_q4_0 : kind == Q4_1 ? dot_q4_1 : dot_q8_0, NULL, nb, w, wstride,
                nrows, a, astride, 1, out, ostride);
        return;
    }
    const block_q8a *y[4];
    for (int c = 0; c < 4; c++) /* an odd last column repeats the one before */
        y[c] = (const block_q8a *)((const char *)a + (size_t)(c < ncols ? c : ncols - 1) * astride);
    const int npairs = (ncols + 1) / 2;
    for (int r = 0; r < nrows; r += 2) {
        const char *w0 = (const char *)w + (size_t)r * wstride;
        const char *w1 = r + 1 < nrows ? w0 + wstride : w0;
        float32x4_t acc[2] = {vdupq_n_f32(0), vdupq_n_f32(0)}, mins[2] = {acc[0], acc[1]};
        if (npairs == 1)
            pair_tile(kind, nb, w0, w1, y, 1, acc, mins);
        else
            pair_tile(kind, nb, w0, w1, y, 2, acc, mins);
        for (int p = 0; p < npairs; p++) {
            float v[4];
            vst1q_f32(v, kind == Q4_1 ? vaddq_f32(acc[p], mins[p]) : acc[p]);
            /* v = [r c, r c+1, r+1 c, r+1 c+1] */
            for (int i = 0; i < 4; i++) {
                const int rr = r + i / 2, cc = 2 * p + i % 2;
                if (rr < nrows && cc < ncols) out[(size_t)cc * ostride + rr] = v[i];
            }
        }
    }
}

#define MM(KIND, NAME)                                                                         \
    static void NAME(int nb, const void *w, size_t wstride, int nrows, const void *a,         \
                     size_t astride, int ncols, float *out, size_t ostride) {                 \
        mm(KIND, nb, w, wstride, nrows, a, astride, ncols, out, ostride);                     \
    }
MM(Q4_0, mm_q4_0)
MM(Q4_1, mm_q4_1)
MM(Q8_0, mm_q8_0)
#endif

GGUF_LAYOUT_TABLE(HS_KERNEL_NAME, HS_KERNEL_GETTER)
