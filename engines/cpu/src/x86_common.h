/* Pieces shared by the x86 variants (each .c is compiled with its own -m flags, so these are
 * static inline and instantiated per variant): horizontal sums, activation quantization of one
 * block, fp16/fp32 dot products and the grouped fp16 products of attention. */
#ifndef HS_X86_COMMON_H
#define HS_X86_COMMON_H

#include <immintrin.h>

#include "kernels.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One block of 32 floats -> 32 int8 in element order (the ymm), scale d = max|x| / 127 and the
 * sum of the int8 values. */
static inline __m256i quantize_block(const float *v, float *d_out, int *sum_out) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
    __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
    __m256 amax = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(sign_mask, v0), _mm256_andnot_ps(sign_mask, v1)),
        _mm256_max_ps(_mm256_andnot_ps(sign_mask, v2), _mm256_andnot_ps(sign_mask, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max = _mm_cvtss_f32(m4);
    const float id = max != 0.0f ? 127.0f / max : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), rnd));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), rnd));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), rnd));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), rnd));
    const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    *d_out = max / 127.0f;
    *sum_out = _mm_cvtsi128_si32(s4);
    return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Activations as block_q8a rows (the GGUF-layout variants' format). */
static inline void quantize_act(const float *x, void *out, int n) {
    block_q8a *y = out;
    for (int b = 0; b < n / HS_QK; b++) {
        float d;
        int sum;
        _mm256_storeu_si256((__m256i *)y[b].qs, quantize_block(x + b * HS_QK, &d, &sum));
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

/* Products with fp16 rows: each row converted once for ng float rows (attend.h's primitives,
 * grouped-query attention); the single dot is their ng = 1 case. */
static inline void dots_f16(int hd, const hs_fp16 *k, const float *q, int ng, float *out) {
    __m256 a[HS_ATTN_GROUP];
    for (int g = 0; g < ng; g++) a[g] = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= hd; j += 8) {
        const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + j)));
        for (int g = 0; g < ng; g++)
            a[g] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + (size_t)g * hd + j), a[g]);
    }
    for (int g = 0; g < ng; g++) {
        float sum = hsum_ps(a[g]);
        for (int t = j; t < hd; t++) sum += hs_f16(k[t]) * q[(size_t)g * hd + t];
        out[g] = sum;
    }
}

static inline void axpys_f16(int hd, const hs_fp16 *v, const float *w, int ng, float *acc) {
    int j = 0;
    for (; j + 8 <= hd; j += 8) {
        const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + j)));
        for (int g = 0; g < ng; g++) {
            float *y = acc + (size_t)g * hd + j;
            _mm256_storeu_ps(y, _mm256_fmadd_ps(_mm256_set1_ps(w[g]), vv, _mm256_loadu_ps(y)));
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
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), acc);
    float sum = hsum_ps(acc);
    for (; j < n; j++) sum += w[j] * x[j];
    return sum;
}

static void to_f16(int n, const float *x, hs_fp16 *y) {
    int j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(y + j), _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < n; j++) y[j] = hs_fp32_to_fp16(x[j]);
}

#include "attend.h"

#endif
