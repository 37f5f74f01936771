/* AVX2 + FMA + F16C variants (compiled with -mavx2 -mfma -mf16c; run only when the CPU has them).
 * Signed int8 products use the sign trick: maddubs(|x|, sign(y, x)) == x*y summed in pairs. */
#include <immintrin.h>
#include <math.h>

#include "kernels.h"

#ifndef HS_KERNEL_NAME
#define HS_KERNEL_NAME "avx2"
#define HS_KERNEL_GETTER hs_kernels_avx2
#endif

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#ifdef HS_VNNI
/* AVX512-VNNI (VL): u8 x s8 dot products accumulate straight into int32, no saturation. */
static inline __m256 mul_sum_i8(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
}
static inline __m256 mul_sum_u8_i8(__m256i ux, __m256i y) {
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, y));
}
#else
static inline __m256 mul_sum_i8(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
    const __m256i dot = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}
static inline __m256 mul_sum_u8_i8(__m256i ux, __m256i y) {
    const __m256i dot = _mm256_maddubs_epi16(ux, y);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}
#endif

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high (16..31). */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    return _mm256_set_m128i(hi, lo);
}

static void quantize_act(const float *x, block_q8a *y, int n) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < n / HS_QK; b++) {
        const float *v = x + b * HS_QK;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
        __m256 amax = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign_mask, v0), _mm256_andnot_ps(sign_mask, v1)),
            _mm256_max_ps(_mm256_andnot_ps(sign_mask, v2), _mm256_andnot_ps(sign_mask, v3)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float max = _mm_cvtss_f32(m4);
        const float d = max / 127.0f, id = max != 0.0f ? 127.0f / max : 0.0f;
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
        i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[b].qs, i0);
        y[b].d = d;
        y[b].s = d * (float)_mm_cvtsi128_si32(s4);
    }
}

#define ROWS_LOOP(BODY)                                                                       \
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),          \
                     _mm256_setzero_ps()};                                                    \
    for (int b = 0; b < nb; b++) {                                                            \
        const __m256i qy = _mm256_loadu_si256((const __m256i *)a[b].qs);                      \
        for (int r = 0; r < nrows; r++) { BODY }                                              \
    }                                                                                         \
    for (int r = 0; r < nrows; r++) out[r] = hsum_ps(acc[r]);

static void dot_q4_0(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                     float *out) {
    ROWS_LOOP({
        const block_q4_0 *x = (const block_q4_0 *)((const char *)w + r * stride) + b;
        const __m256i qx = _mm256_sub_epi8(unpack_nibbles(x->qs), _mm256_set1_epi8(8));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(hs_f16(x->d) * a[b].d), mul_sum_i8(qx, qy), acc[r]);
    })
}

static void dot_q4_1(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                     float *out) {
    float mins[4] = {0, 0, 0, 0};
    ROWS_LOOP({
        const block_q4_1 *x = (const block_q4_1 *)((const char *)w + r * stride) + b;
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(hs_f16(x->d) * a[b].d),
                                 mul_sum_u8_i8(unpack_nibbles(x->qs), qy), acc[r]);
        mins[r] += hs_f16(x->m) * a[b].s;
    })
    for (int r = 0; r < nrows; r++) out[r] += mins[r];
}

static void dot_q8_0(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                     float *out) {
    ROWS_LOOP({
        const block_q8_0 *x = (const block_q8_0 *)((const char *)w + r * stride) + b;
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(hs_f16(x->d) * a[b].d), mul_sum_i8(qx, qy), acc[r]);
    })
}

static float dot_f16(int n, const hs_fp16 *w, const float *x) {
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j))),
                              _mm256_loadu_ps(x + j), acc);
    float sum = hsum_ps(acc);
    for (; j < n; j++) sum += hs_f16(w[j]) * x[j];
    return sum;
}

static float dot_f32(int n, const float *w, const float *x) {
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), acc);
    float sum = hsum_ps(acc);
    for (; j < n; j++) sum += w[j] * x[j];
    return sum;
}

static void axpy_f16(int n, float a, const hs_fp16 *x, float *y) {
    const __m256 va = _mm256_set1_ps(a);
    int j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + j))),
                                                _mm256_loadu_ps(y + j)));
    for (; j < n; j++) y[j] += a * hs_f16(x[j]);
}

/* Batched products: the weight block is unpacked once, then used for up to four activations. */
static void gemm_q4_0(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                      float *out) {
    const block_q4_0 *x = w;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const __m256i qx = _mm256_sub_epi8(unpack_nibbles(x[b].qs), _mm256_set1_epi8(8));
        const float dw = hs_f16(x[b].d);
        for (int c = 0; c < ncols; c++) {
            const block_q8a *y = a + c * astride + b;
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y->d), mul_sum_i8(qx, qy), acc[c]);
        }
    }
    for (int c = 0; c < ncols; c++) out[c] = hsum_ps(acc[c]);
}

static void gemm_q4_1(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                      float *out) {
    const block_q4_1 *x = w;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    float mins[4] = {0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        const __m256i ux = unpack_nibbles(x[b].qs);
        const float dw = hs_f16(x[b].d), mw = hs_f16(x[b].m);
        for (int c = 0; c < ncols; c++) {
            const block_q8a *y = a + c * astride + b;
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y->d), mul_sum_u8_i8(ux, qy), acc[c]);
            mins[c] += mw * y->s;
        }
    }
    for (int c = 0; c < ncols; c++) out[c] = hsum_ps(acc[c]) + mins[c];
}

static void gemm_q8_0(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                      float *out) {
    const block_q8_0 *x = w;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const float dw = hs_f16(x[b].d);
        for (int c = 0; c < ncols; c++) {
            const block_q8a *y = a + c * astride + b;
            const __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y->d), mul_sum_i8(qx, qy), acc[c]);
        }
    }
    for (int c = 0; c < ncols; c++) out[c] = hsum_ps(acc[c]);
}

static const hs_kernels table = {HS_KERNEL_NAME, quantize_act, dot_q4_0, dot_q4_1, dot_q8_0,
                                 dot_f16, dot_f32, axpy_f16, gemm_q4_0, gemm_q4_1, gemm_q8_0};

const hs_kernels *HS_KERNEL_GETTER(void) { return &table; }
