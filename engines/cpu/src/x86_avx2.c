/* AVX2 + FMA + F16C variants (compiled with -mavx2 -mfma -mf16c; run only when the CPU has them).
 * Signed int8 products use the sign trick: maddubs(|x|, sign(y, x)) == x*y summed in pairs. */
#include <math.h>

/* x86_common.h's attention on many rows at once, attend.h's bits */
#define GGUF_LAYOUT_EXTRA HS_ROWS_KERNELS
#define GGUF_ATTEND_F16 attend_f16_rows
#include "gguf_layout.h"
#include "x86_common.h"

static inline __m256 mul_sum_i8(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
    const __m256i dot = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}
static inline __m256 mul_sum_u8_i8(__m256i ux, __m256i y) {
    const __m256i dot = _mm256_maddubs_epi16(ux, y);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, _mm256_set1_epi16(1)));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high (16..31). */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    return _mm256_set_m128i(hi, lo);
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

GGUF_MM(mm_q4_0, dot_q4_0, gemm_q4_0)
GGUF_MM(mm_q4_1, dot_q4_1, gemm_q4_1)
GGUF_MM(mm_q8_0, dot_q8_0, gemm_q8_0)

GGUF_LAYOUT_TABLE("avx2", hs_kernels_avx2)
