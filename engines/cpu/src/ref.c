/* Reference kernels: plain C, the truth every ISA variant is tested against. */
#include <math.h>
#include <string.h>

#include "gguf_layout.h"

float hs_fp16_table[1 << 16];

float hs_fp16_to_fp32(hs_fp16 h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

hs_fp16 hs_fp32_to_fp16(float f) { /* round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (hs_fp16)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (hs_fp16)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (hs_fp16)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (hs_fp16)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (hs_fp16)half;
}

__attribute__((constructor)) static void hs_init_fp16_table(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) hs_fp16_table[i] = hs_fp16_to_fp32((hs_fp16)i);
}

static void quantize_act_ref(const float *x, void *out, int n) {
    block_q8a *y = out;
    for (int b = 0; b < n / HS_QK; b++) {
        const float *v = x + b * HS_QK;
        float amax = 0.0f;
        for (int j = 0; j < HS_QK; j++) amax = fmaxf(amax, fabsf(v[j]));
        /* the SIMD variants' arithmetic: 127 / max and round half to even */
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < HS_QK; j++) {
            const int q = (int)nearbyintf(v[j] * id);
            y[b].qs[j] = (int8_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

static void dot_q4_0_ref(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                         float *out) {
    for (int r = 0; r < nrows; r++) {
        const block_q4_0 *x = (const block_q4_0 *)((const char *)w + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            int acc = 0;
            for (int j = 0; j < HS_QK / 2; j++) {
                acc += ((x[b].qs[j] & 0x0f) - 8) * a[b].qs[j];
                acc += ((x[b].qs[j] >> 4) - 8) * a[b].qs[j + HS_QK / 2];
            }
            sum += (float)acc * hs_f16(x[b].d) * a[b].d;
        }
        out[r] = sum;
    }
}

static void dot_q4_1_ref(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                         float *out) {
    for (int r = 0; r < nrows; r++) {
        const block_q4_1 *x = (const block_q4_1 *)((const char *)w + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            int acc = 0;
            for (int j = 0; j < HS_QK / 2; j++) {
                acc += (x[b].qs[j] & 0x0f) * a[b].qs[j];
                acc += (x[b].qs[j] >> 4) * a[b].qs[j + HS_QK / 2];
            }
            sum += (float)acc * hs_f16(x[b].d) * a[b].d + hs_f16(x[b].m) * a[b].s;
        }
        out[r] = sum;
    }
}

static void dot_q8_0_ref(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                         float *out) {
    for (int r = 0; r < nrows; r++) {
        const block_q8_0 *x = (const block_q8_0 *)((const char *)w + r * stride);
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) {
            int acc = 0;
            for (int j = 0; j < HS_QK; j++) acc += x[b].qs[j] * a[b].qs[j];
            sum += (float)acc * hs_f16(x[b].d) * a[b].d;
        }
        out[r] = sum;
    }
}

static float dot_f16_ref(int n, const hs_fp16 *w, const float *x) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += hs_f16(w[j]) * x[j];
    return sum;
}

static float dot_f32_ref(int n, const float *w, const float *x) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += w[j] * x[j];
    return sum;
}

static void axpy_f16_ref(int n, float a, const hs_fp16 *x, float *y) {
    for (int j = 0; j < n; j++) y[j] += a * hs_f16(x[j]);
}

static void to_f16_ref(int n, const float *x, hs_fp16 *y) {
    for (int j = 0; j < n; j++) y[j] = hs_fp32_to_fp16(x[j]);
}

static void dots_f16(int hd, const hs_fp16 *k, const float *q, int ng, float *out) {
    for (int g = 0; g < ng; g++) out[g] = dot_f16_ref(hd, k, q + (size_t)g * hd);
}

static void axpys_f16(int hd, const hs_fp16 *v, const float *w, int ng, float *acc) {
    for (int g = 0; g < ng; g++) axpy_f16_ref(hd, w[g], v, acc + (size_t)g * hd);
}

#include "attend.h"

GGUF_MM(mm_q4_0_ref, dot_q4_0_ref, NULL)
GGUF_MM(mm_q4_1_ref, dot_q4_1_ref, NULL)
GGUF_MM(mm_q8_0_ref, dot_q8_0_ref, NULL)

const hs_kernels hs_kernels_ref = { /* no batched forms: the plain loops are the truth */
    .name = "reference",
    .act_bytes = gguf_act_bytes,
    .quantize_act = quantize_act_ref,
    .mm_q4_0 = mm_q4_0_ref,
    .mm_q4_1 = mm_q4_1_ref,
    .mm_q8_0 = mm_q8_0_ref,
    .dot_f16 = dot_f16_ref,
    .dot_f32 = dot_f32_ref,
    .to_f16 = to_f16_ref,
    .attend_f16 = attend_f16,
};

void hs_quantize_row_q8_0(const float *x, block_q8_0 *y, int n) {
    for (int b = 0; b < n / HS_QK; b++) {
        float amax = 0.0f;
        for (int j = 0; j < HS_QK; j++) amax = fmaxf(amax, fabsf(x[b * HS_QK + j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = hs_fp32_to_fp16(d);
        for (int j = 0; j < HS_QK; j++) y[b].qs[j] = (int8_t)roundf(x[b * HS_QK + j] * id);
    }
}

void hs_quantize_row_q4_0(const float *x, block_q4_0 *y, int n) { /* as ggml: signed max */
    for (int b = 0; b < n / HS_QK; b++) {
        const float *v = x + b * HS_QK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < HS_QK; j++)
            if (fabsf(v[j]) > amax) { amax = fabsf(v[j]); max = v[j]; }
        const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = hs_fp32_to_fp16(d);
        for (int j = 0; j < HS_QK / 2; j++) {
            int lo = (int)(v[j] * id + 8.5f), hi = (int)(v[j + HS_QK / 2] * id + 8.5f);
            lo = lo > 15 ? 15 : lo; hi = hi > 15 ? 15 : hi;
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void hs_dequantize_row(int type, const void *x, float *y, int n) {
    switch (type) {
    case HS_F32: memcpy(y, x, (size_t)n * 4); break;
    case HS_F16:
        for (int j = 0; j < n; j++) y[j] = hs_f16(((const hs_fp16 *)x)[j]);
        break;
    case HS_Q4_0:
        for (int b = 0; b < n / HS_QK; b++) {
            const block_q4_0 *q = (const block_q4_0 *)x + b;
            const float d = hs_f16(q->d);
            for (int j = 0; j < HS_QK / 2; j++) {
                y[b * HS_QK + j] = ((q->qs[j] & 0x0f) - 8) * d;
                y[b * HS_QK + j + HS_QK / 2] = ((q->qs[j] >> 4) - 8) * d;
            }
        }
        break;
    case HS_Q4_1:
        for (int b = 0; b < n / HS_QK; b++) {
            const block_q4_1 *q = (const block_q4_1 *)x + b;
            const float d = hs_f16(q->d), m = hs_f16(q->m);
            for (int j = 0; j < HS_QK / 2; j++) {
                y[b * HS_QK + j] = (q->qs[j] & 0x0f) * d + m;
                y[b * HS_QK + j + HS_QK / 2] = (q->qs[j] >> 4) * d + m;
            }
        }
        break;
    case HS_Q8_0:
        for (int b = 0; b < n / HS_QK; b++) {
            const block_q8_0 *q = (const block_q8_0 *)x + b;
            const float d = hs_f16(q->d);
            for (int j = 0; j < HS_QK; j++) y[b * HS_QK + j] = q->qs[j] * d;
        }
        break;
    }
}
