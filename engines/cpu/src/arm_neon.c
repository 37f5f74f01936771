/* AArch64 variants: NEON (every ARMv8-A, Kunpeng 920 included) and, with HS_DOTPROD, the
 * ARMv8.2 SDOT instruction (Kunpeng 920 has it). Compiled with -march=armv8-a or
 * -march=armv8.2-a+dotprod. */
#include <arm_neon.h>

#include "kernels.h"

#ifdef HS_DOTPROD
#define HS_KERNEL_NAME "dotprod"
#define HS_KERNEL_GETTER hs_kernels_dotprod
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

static void quantize_act(const float *x, block_q8a *y, int n) {
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

static float dot_f16(int n, const hs_fp16 *w, const float *x) {
    float32x4_t acc = vdupq_n_f32(0);
    int j = 0;
    for (; j + 4 <= n; j += 4)
        acc = vfmaq_f32(acc, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + j))), vld1q_f32(x + j));
    float sum = vaddvq_f32(acc);
    for (; j < n; j++) sum += hs_f16(w[j]) * x[j];
    return sum;
}

static float dot_f32(int n, const float *w, const float *x) {
    float32x4_t acc = vdupq_n_f32(0);
    int j = 0;
    for (; j + 4 <= n; j += 4) acc = vfmaq_f32(acc, vld1q_f32(w + j), vld1q_f32(x + j));
    float sum = vaddvq_f32(acc);
    for (; j < n; j++) sum += w[j] * x[j];
    return sum;
}

static void axpy_f16(int n, float a, const hs_fp16 *x, float *y) {
    int j = 0;
    for (; j + 4 <= n; j += 4)
        vst1q_f32(y + j, vfmaq_n_f32(vld1q_f32(y + j),
                                     vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + j))), a));
    for (; j < n; j++) y[j] += a * hs_f16(x[j]);
}

static void to_f16(int n, const float *x, hs_fp16 *y) { /* FPCR's default: nearest even */
    int j = 0;
    for (; j + 4 <= n; j += 4) vst1_u16(y + j, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + j))));
    for (; j < n; j++) y[j] = hs_fp32_to_fp16(x[j]);
}

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

static const hs_kernels table = {
    .name = HS_KERNEL_NAME,
    .quantize_act = quantize_act,
    .dot_q4_0 = dot_q4_0,
    .dot_q4_1 = dot_q4_1,
    .dot_q8_0 = dot_q8_0,
    .dot_f16 = dot_f16,
    .dot_f32 = dot_f32,
    .axpy_f16 = axpy_f16,
    .to_f16 = to_f16,
    .gemm_q4_0 = gemm_q4_0,
    .gemm_q4_1 = gemm_q4_1,
    .gemm_q8_0 = gemm_q8_0,
};

const hs_kernels *HS_KERNEL_GETTER(void) { return &table; }
