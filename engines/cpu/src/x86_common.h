/* Pieces shared by the x86 variants (each .c is compiled with its own -m flags, so these are
 * static inline and instantiated per variant): horizontal sums, activation quantization of one
 * block, fp16/fp32 dot products and the grouped fp16 products of attention. */
#ifndef HS_X86_COMMON_H
#define HS_X86_COMMON_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* One block of 32 floats quantized (quantize_block) into the packed variants' activation
 * chunks: elements 4k..4k+3 to lo + k * chunk + 4j, elements 16 + 4k.. to hi + k * chunk + 4j
 * (lane j of chunk k; chunk: 64 bytes in avx512vnni's groups of 16 blocks, 32 in avx2's of 8). */
static inline void quantize_block_chunks(const float *v, int8_t *lo, int8_t *hi, size_t chunk,
                                         int j, float *d_out, int *sum_out) {
    _Alignas(32) int32_t q[8];
    _mm256_store_si256((__m256i *)q, quantize_block(v, d_out, sum_out));
    for (int k = 0; k < 4; k++) {
        memcpy(lo + (size_t)k * chunk + 4 * j, &q[k], 4);
        memcpy(hi + (size_t)k * chunk + 4 * j, &q[4 + k], 4);
    }
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

/* acc[g] += w[p * ng + g] * v[p] over n positions in order, with each 8-lane slice of
 * the ng accumulators held in registers across the positions instead of loaded and stored at
 * every one: each element gets the same fused multiply-adds in the same order, so the same bits
 * (the exact hand-off's prefill engine repeats this arithmetic: prefill/exact.py). */
#define HS_AXPYS_SPAN 1
static inline void axpys_span_f16(int hd, const hs_fp16 *const *v, const float *w, int n, int ng,
                                  float *acc) {
    int j = 0;
    for (; j + 8 <= hd; j += 8) {
        __m256 a[HS_ATTN_GROUP];
        for (int g = 0; g < ng; g++) a[g] = _mm256_loadu_ps(acc + (size_t)g * hd + j);
        for (int p = 0; p < n; p++) {
            const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v[p] + j)));
            for (int g = 0; g < ng; g++)
                a[g] = _mm256_fmadd_ps(_mm256_set1_ps(w[p * ng + g]), vv, a[g]);
        }
        for (int g = 0; g < ng; g++) _mm256_storeu_ps(acc + (size_t)g * hd + j, a[g]);
    }
    for (; j < hd; j++)
        for (int p = 0; p < n; p++)
            for (int g = 0; g < ng; g++) acc[(size_t)g * hd + j] += w[p * ng + g] * hs_f16(v[p][j]);
}

/* Lanes 0..n-1 set (all ones), the rest clear: a partial vector's mask for the AVX2 masked
 * loads and stores. */
static inline __m256i first_lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* glibc's expf, bit for bit, 8 at a time: the attention's softmax calls it once per position
 * and head, and the exact hand-off's prefill engine repeats glibc's algorithm
 * (prefill/exact.py), so the vector form must give its very bits. The algorithm of glibc >= 2.28
 * (sysdeps/ieee754/flt-32/e_expf.c) as its FMA build computes it - the ifunc every AVX2 host
 * takes: in double, k = round(x * 32/ln 2) by fma(32/ln 2, x, 1.5 * 2^52), r = fma(32/ln 2, x,
 * -k), 2^(k/32) from a 32-entry table (AVX-512: looked up by two two-register permutes; AVX2: two
 * 4-lane gathers, the 8 lanes in two halves of 4 doubles) with k >> 5 added to the exponent, a
 * cubic in r in three fused steps, rounded to float once. x beyond the float range: 0, +inf, NaN
 * as glibc returns them. Checked against the C library's expf over every float
 * (tests/expf_check.c, built once with each variant's flags). The avx2 variant called the C
 * library's expf one score at a time until 2026-12-07 (docs/benchmarks.md, seventeenth round). */
#define HS_EXPS 1
static const uint64_t hs_exp2f_tab[32] = { /* bits of 2^(i/32) minus i << 47 (glibc's table) */
    0x3ff0000000000000ULL, 0x3fefd9b0d3158574ULL, 0x3fefb5586cf9890fULL, 0x3fef9301d0125b51ULL,
    0x3fef72b83c7d517bULL, 0x3fef54873168b9aaULL, 0x3fef387a6e756238ULL, 0x3fef1e9df51fdee1ULL,
    0x3fef06fe0a31b715ULL, 0x3feef1a7373aa9cbULL, 0x3feedea64c123422ULL, 0x3feece086061892dULL,
    0x3feebfdad5362a27ULL, 0x3feeb42b569d4f82ULL, 0x3feeab07dd485429ULL, 0x3feea47eb03a5585ULL,
    0x3feea09e667f3bcdULL, 0x3fee9f75e8ec5f74ULL, 0x3feea11473eb0187ULL, 0x3feea589994cce13ULL,
    0x3feeace5422aa0dbULL, 0x3feeb737b0cdc5e5ULL, 0x3feec49182a3f090ULL, 0x3feed503b23e255dULL,
    0x3feee89f995ad3adULL, 0x3feeff76f2fb5e47ULL, 0x3fef199bdd85529cULL, 0x3fef3720dcef9069ULL,
    0x3fef5818dcfba487ULL, 0x3fef7c97337b9b5fULL, 0x3fefa4afa2a490daULL, 0x3fefd0765b6e4540ULL,
};

/* out where x is in expf's normal range; beyond it 0 (below), +inf (above) and x + x (NaN). */
static inline __m256 expf8_ranges(__m256 x, __m256 out) {
    out = _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ));
    out = _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(0x1.62e42ep6f), _CMP_GT_OQ));
    return _mm256_blendv_ps(out, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

#ifdef __AVX512F__
static inline __m256 expf8(__m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d invln2n = _mm512_set1_pd(0x1.71547652b82fep+0 * 32);
    const __m512d shift = _mm512_set1_pd(0x1.8p+52);
    const __m512d kd0 = _mm512_fmadd_pd(invln2n, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kd0);
    const __m512d kd = _mm512_sub_pd(kd0, shift);
    const __m512d r = _mm512_fmsub_pd(invln2n, xd, kd);
    const __m512i *tab = (const __m512i *)hs_exp2f_tab;
    const __m512i lo = _mm512_permutex2var_epi64(_mm512_loadu_si512(tab), ki, _mm512_loadu_si512(tab + 1));
    const __m512i hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(tab + 2), ki, _mm512_loadu_si512(tab + 3));
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));
    const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                      _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    y = _mm512_mul_pd(y, _mm512_castsi512_pd(t));
    return expf8_ranges(x, _mm512_cvtpd_ps(y));
}

/* x[i] = expf(x[i]) for i < n, as glibc's expf. */
static inline void exps(float *x, int n) {
    for (int i = 0; i < n; i += 8) {
        const __mmask8 m = n - i >= 8 ? 0xff : (__mmask8)((1u << (n - i)) - 1);
        _mm256_mask_storeu_ps(x + i, m, expf8(_mm256_maskz_loadu_ps(m, x + i)));
    }
}
#else
/* The same steps on 4 doubles (x converted from float), up to the rounding to float. */
static inline __m256d expf4_pd(__m256d xd) {
    const __m256d invln2n = _mm256_set1_pd(0x1.71547652b82fep+0 * 32);
    const __m256d shift = _mm256_set1_pd(0x1.8p+52);
    const __m256d kd0 = _mm256_fmadd_pd(invln2n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd0);
    const __m256d kd = _mm256_sub_pd(kd0, shift);
    const __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
    /* the gather written out, its index held in ymm1: qemu-user 7.2 (Debian 12's, which the
     * e2e test's AVX2-only CPU runs on) reads an index in ymm4 as no index (as a plain SIB's
     * 100b), every lane then loading table entry 0 (ymm12 and the others read right); GCC's own
     * choice had put it there in one inlined copy (docs/benchmarks.md, eighteenth round) */
    register __m256i ix __asm__("ymm1") = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    __m256i t, all = _mm256_set1_epi64x(-1);
    __asm__("vpgatherqq %[all], (%[tab], %[ix], 8), %[t]"
            : [t] "=&x"(t), [all] "+x"(all)
            : [tab] "r"(hs_exp2f_tab), [ix] "x"(ix)
            : "memory");
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                      _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_mul_pd(y, _mm256_castsi256_pd(t));
}

static inline __m256 expf8(__m256 x) {
    const __m128 lo = _mm256_cvtpd_ps(expf4_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    const __m128 hi = _mm256_cvtpd_ps(expf4_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    return expf8_ranges(x, _mm256_set_m128(hi, lo));
}

/* x[i] = expf(x[i]) for i < n, as glibc's expf. */
static inline void exps(float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, expf8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i m = first_lanes(n - i);
        _mm256_maskstore_ps(x + i, m, expf8(_mm256_maskload_ps(x + i, m)));
    }
}
#endif

/* model.c's SwiGLU loop, gate[j] = gate[j] / (1 + expf(-gate[j])) * up[j], 8 at a time (both
 * x86 vector variants): expf8 is glibc's expf bit for bit (tests/expf_check.c) and the other
 * steps are single IEEE operations, so the loop's very bits (the exact hand-off's SwiGLU; the
 * kernel test holds it to them). avx2 had gone without it in the seventeenth round, when it
 * failed that check under qemu-x86_64 -cpu max: qemu 7.2 read the gather's index register ymm4
 * as none (expf4_pd above; docs/benchmarks.md, eighteenth round). */
static inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = expf8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static inline void swiglu(size_t n, float *gate, const float *up) {
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(gate + j, swiglu8(_mm256_loadu_ps(gate + j), _mm256_loadu_ps(up + j)));
    if (j < n) {
        const __m256i m = first_lanes((int)(n - j));
        _mm256_maskstore_ps(gate + j, m, swiglu8(_mm256_maskload_ps(gate + j, m),
                                                 _mm256_maskload_ps(up + j, m)));
    }
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

/* ---- attention over a 64-position span, many rows at once (attend_f16, attend_rows) --------
 * The arithmetic that attend.h's attend_f16 defines (and the exact KV hand-off's prefill engine,
 * prefill/exact.py, repeats), laid out so that many independent chains run side by side: token
 * by token with a few heads (3 for SmolLM2), the FMA unit would wait on 8-deep dot chains and
 * 64-deep accumulate chains. Every row still gets the same operations in the same order, so the
 * same bits as attend.h's loops:
 * - scores: each (row, position) dot as dots_f16 computes it, 8-lane FMAs over the head, then
 *   its horizontal sum ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)) (hsum_ps), done for 8
 *   positions at once by a transpose that adds the very same pairs, or (AVX-512's packed
 *   layout, rows_dots16t) for 16 positions at once with a position to a lane;
 * - per 64-position span, row r's first nr[r] positions: scale, running max, rescale, exps and
 *   the sum in position order;
 * - acc[r] += w * v per position in order, each 8-lane slice in a register (axpys_span_f16),
 *   several rows and slices at once up to the tile's shortest row, then each row's own rest.
 * Used by attend_f16 (decode: one token's heads, hd a multiple of 32) and by attend_rows (a
 * prefill chunk's block of up to HS_ATTN_ROWS rows: several tokens' heads that share a KV head,
 * each K and V row loaded once for all of them; its packed layout is the cached rows copied
 * together, a 64-position block's K then its V, K transposed on AVX-512: rows_pack below). The
 * kernel test checks both against a scalar
 * statement of this arithmetic, bit for bit. */
#ifdef __AVX512F__
#define ROWS_TILE 3 /* rows whose scores of 8 (16) positions are accumulated at once (32 registers) */
#ifndef AXPY_ROWS /* (tests/bench/attend_rows.sh DEFS=-DAXPY_ROWS=5: level; 6: slower) */
#define AXPY_ROWS 4 /* rows x 4 slices of 8 accumulated at once */
#endif
#else
#define ROWS_TILE 1
#define AXPY_ROWS 2
#endif

/* Elements j..j+7 of a K or V row as floats: an fp16 row converted (exactly), or a row the
 * packed layout already holds in float (HS_ROWS_F32: the same values). */
static inline __attribute__((always_inline)) __m256 load8(const int f32, const void *row, int j) {
    return f32 ? _mm256_loadu_ps((const float *)row + j)
               : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const hs_fp16 *)row + j)));
}

/* The horizontal sums of eight vectors (hsum_ps each, the same additions), in one vector. */
static inline __m256 hsum8_ps(const __m256 *a) {
    __m256 t[4];
    for (int i = 0; i < 4; i++) /* [a_i 0+4, 1+5, 2+6, 3+7 | a_i+4 the same] */
        t[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20),
                             _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
    /* [a0: (0+4)+(2+6), (1+5)+(3+7), a1: the same | a4, a5] and [a2, a3 | a6, a7] */
    const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xee));
    const __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xee));
    return _mm256_add_ps(_mm256_shuffle_ps(u0, u1, 0x88), _mm256_shuffle_ps(u0, u1, 0xdd));
}

/* Scores of rows q[0..R) against the 8 K rows k8: s[r][s0 .. s0 + 8). */
static inline __attribute__((always_inline)) void rows_dots8(int R, int hd, const float *const *q,
                                                             const int f32, const void *const *k8,
                                                             float (*s)[HS_ATTN_SPAN], int s0) {
    __m256 a[ROWS_TILE][8];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 8; i++) a[r][i] = _mm256_setzero_ps();
    for (int j = 0; j < hd; j += 8) {
        __m256 qv[ROWS_TILE];
        for (int r = 0; r < R; r++) qv[r] = _mm256_loadu_ps(q[r] + j);
        for (int i = 0; i < 8; i++) {
            const __m256 k = load8(f32, k8[i], j);
            for (int r = 0; r < R; r++) a[r][i] = _mm256_fmadd_ps(k, qv[r], a[r][i]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(s[r] + s0, hsum8_ps(a[r]));
}

#ifdef __AVX512F__
/* Scores of rows q[0..R) against 16 positions whose K rows the packed layout holds transposed
 * (kt[d * 16 + i]: element d of position i's K row, as float): s[r][s0 .. s0 + 16), the very
 * arithmetic of rows_dots8, one position to a lane. Accumulator c of a row sums the products of
 * elements c, c + 8, c + 16, ... in order (the 8-lane dot's lane c), and the 8 accumulators are
 * added as hsum_ps adds lanes: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)). Against rows_dots8 it
 * needs no horizontal sums, and each FMA takes 16 positions at once. */
static inline __attribute__((always_inline)) void rows_dots16t(int R, int hd, const float *const *q,
                                                               const float *kt,
                                                               float (*s)[HS_ATTN_SPAN], int s0) {
    __m512 a[ROWS_TILE][8];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 8; c++) a[r][c] = _mm512_setzero_ps();
    for (int j = 0; j < hd; j += 8)
        for (int c = 0; c < 8; c++) {
            __m512 k = _mm512_load_ps(kt + (size_t)(j + c) * 16);
            /* in a register for the R rows: GCC otherwise folds the load into each FMA and
             * broadcasts q apart, 2 loads an FMA; so it takes q as the FMA's broadcast operand
             * (without it 3.95 against 3.21 ns a row-position: tests/bench/dropped/
             * rows-dots16t-folded.patch) */
            __asm__("" : "+v"(k));
            for (int r = 0; r < R; r++)
                a[r][c] = _mm512_fmadd_ps(k, _mm512_set1_ps(q[r][j + c]), a[r][c]);
        }
    for (int r = 0; r < R; r++) {
        const __m512 lo = _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][4]), _mm512_add_ps(a[r][2], a[r][6]));
        const __m512 hi = _mm512_add_ps(_mm512_add_ps(a[r][1], a[r][5]), _mm512_add_ps(a[r][3], a[r][7]));
        _mm512_storeu_ps(s[r] + s0, _mm512_add_ps(lo, hi));
    }
}
#endif

/* How the decode attention (attend_f16_rows) fetches the next span's K and V rows ahead; both
 * can be defined from outside for measurements (tests/bench/attend_rows.sh DECODE=... DEFS=...).
 * ATTN_PF_HINT: into L2 (on one VM thread L1 read 71-72 against 75-78 ns a position, level
 * within that script's spread; docs/benchmarks.md, the sixth round);
 * ATTN_PF 0: none. The row loops below are written out where they are used: a build with one
 * shared row helper lost most of the gain (the 1.1B's attention at 2048 positions 6.2 against
 * 10.4-12.5 ms a token), which the compiler's choices, not the operations, explain. */
#ifndef ATTN_PF_HINT
#define ATTN_PF_HINT _MM_HINT_T1
#endif
#ifndef ATTN_PF
#define ATTN_PF 1
#endif

/* acc[r][0..hd) += w[r][p] * v[p] for positions [from, to) in order, R rows at once. */
static inline __attribute__((always_inline)) void rows_axpys(int R, int hd, const int f32,
                                                             const void *const *v, int from,
                                                             int to, const float (*w)[HS_ATTN_SPAN],
                                                             float *const *acc,
                                                             const hs_fp16 *const *pf, int npf) {
    for (int j = 0; j < hd; j += 32) {
        __m256 a[AXPY_ROWS][4];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++) a[r][c] = _mm256_loadu_ps(acc[r] + j + 8 * c);
        for (int p = from; p < to; p++) {
            if (j == 0 && p < npf) /* a row to fetch ahead a position (rows_span's next span) */
                for (int b = 0; b < hd * (int)sizeof(hs_fp16); b += 64)
                    _mm_prefetch((const char *)pf[p] + b, ATTN_PF_HINT);
            __m256 vv[4];
            for (int c = 0; c < 4; c++)
                vv[c] = load8(f32, v[p], j + 8 * c);
            for (int r = 0; r < R; r++) {
                const __m256 wr = _mm256_set1_ps(w[r][p]);
                for (int c = 0; c < 4; c++) a[r][c] = _mm256_fmadd_ps(wr, vv[c], a[r][c]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(acc[r] + j + 8 * c, a[r][c]);
    }
}

/* 8 x 8 transpose: t[i] lane j <- t[j] lane i. */
static inline void transpose8_ps(__m256 t[8]) {
    __m256 a[8], b[8];
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm256_unpacklo_ps(t[2 * i], t[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_ps(t[2 * i], t[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {
            b[4 * i + 2 * h] = _mm256_shuffle_ps(a[4 * i + h], a[4 * i + 2 + h], 0x44);
            b[4 * i + 2 * h + 1] = _mm256_shuffle_ps(a[4 * i + h], a[4 * i + 2 + h], 0xee);
        }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(b[i], b[4 + i], 0x20);
        t[4 + i] = _mm256_permute2f128_ps(b[i], b[4 + i], 0x31);
    }
}

/* attend.h's softmax_step for up to 8 rows at once, row r (r < R) over its first nr[r] scores
 * s[r][0..): each row in its own lane, position after position, so that every row gets the very
 * operations of softmax_step in its order (the scale, `s > max ? s : max`, expf of m - max,
 * the rescale of l and acc, e = expf(s - max), the sum in position order, l += sum) while the 8
 * sums' chains run side by side instead of one row's 64-deep chain at a time. Rows with no
 * score are left as they are. Scores past a row's nr[r] are overwritten but never read. */
/* softmax_rows8's lanes of rows still inside their scores at position p (lim[r] > p), and its
 * two masked steps: AVX-512's mask registers, AVX2's blends of the same results. */
#ifdef __AVX512F__
typedef __mmask8 lanes8;
static inline lanes8 lanes_below(__m256i lim, int p) {
    return _mm256_cmpgt_epi32_mask(lim, _mm256_set1_epi32(p));
}
static inline __m256 max_in(__m256 max, lanes8 in, __m256 v) {
    return _mm256_mask_max_ps(max, in, v, max); /* vmaxps: v > max ? v : max */
}
static inline __m256 add_in(__m256 sum, lanes8 in, __m256 e) {
    return _mm256_mask_add_ps(sum, in, sum, e);
}
#else
typedef __m256 lanes8;
static inline lanes8 lanes_below(__m256i lim, int p) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, _mm256_set1_epi32(p)));
}
static inline __m256 max_in(__m256 max, lanes8 in, __m256 v) {
    return _mm256_blendv_ps(max, _mm256_max_ps(v, max), in);
}
static inline __m256 add_in(__m256 sum, lanes8 in, __m256 e) {
    return _mm256_blendv_ps(sum, _mm256_add_ps(sum, e), in);
}
#endif

static inline void softmax_rows8(int hd, int R, const int *nr, float scale,
                                 float (*s)[HS_ATTN_SPAN], float *m, float *l, float *const *acc) {
    _Alignas(32) float st[HS_ATTN_SPAN][8]; /* [position][row] */
    _Alignas(32) int lim[8] = {0};
    _Alignas(32) float m0[8], l0[8], rs[8];
    int n = 0;
    for (int r = 0; r < R; r++) {
        lim[r] = nr[r], m0[r] = m[r], l0[r] = l[r];
        n = nr[r] > n ? nr[r] : n;
    }
    for (int r = R; r < 8; r++) m0[r] = 0.0f, l0[r] = 0.0f;
    const __m256i limv = _mm256_load_si256((const __m256i *)lim);
    const __m256 scalev = _mm256_set1_ps(scale);
    __m256 maxv = _mm256_load_ps(m0);
    for (int p0 = 0; p0 < n; p0 += 8) {
        __m256 t[8];
        for (int r = 0; r < 8; r++) t[r] = r < R ? _mm256_load_ps(s[r] + p0) : _mm256_setzero_ps();
        transpose8_ps(t);
        for (int i = 0; i < 8 && p0 + i < n; i++) {
            const __m256 v = _mm256_mul_ps(t[i], scalev);
            maxv = max_in(maxv, lanes_below(limv, p0 + i), v);
            _mm256_store_ps(st[p0 + i], v);
        }
    }
    const __m256 rescale = expf8(_mm256_sub_ps(_mm256_load_ps(m0), maxv));
    _mm256_store_ps(rs, rescale);
    __m256 sum = _mm256_setzero_ps();
    for (int p = 0; p < n; p++) {
        const __m256 e = expf8(_mm256_sub_ps(_mm256_load_ps(st[p]), maxv));
        sum = add_in(sum, lanes_below(limv, p), e);
        _mm256_store_ps(st[p], e);
    }
    _Alignas(32) float lv[8], mv[8];
    /* l * 1.0f is l: the unconditional multiply equals softmax_step's skipped one */
    __m256 lr = _mm256_mul_ps(_mm256_load_ps(l0), rescale);
    __asm__("" : "+x"(lr)); /* rounded apart, as softmax_step's two statements (no contraction) */
    _mm256_store_ps(lv, _mm256_add_ps(lr, sum));
    _mm256_store_ps(mv, maxv);
    for (int r = 0; r < R; r++) {
        if (nr[r] <= 0) continue;
        if (rs[r] != 1.0f)
            for (int d = 0; d < hd; d++) acc[r][d] *= rs[r];
        l[r] = lv[r], m[r] = mv[r];
    }
    for (int p0 = 0; p0 < n; p0 += 8) { /* the weights back into s[r][p] */
        __m256 t[8];
        for (int i = 0; i < 8; i++) t[i] = _mm256_load_ps(st[p0 + i]); /* p0 + i < 64 */
        transpose8_ps(t);
        for (int r = 0; r < R; r++) _mm256_store_ps(s[r] + p0, t[r]);
    }
}

/* Every cache line of rows [from, to) of k and v, fetched ahead. */
static inline void prefetch_rows(int hd, const hs_fp16 *const *k, const hs_fp16 *const *v, int from,
                                 int to) {
    for (int p = from; p < to; p++)
        for (int b = 0; b < hd * (int)sizeof(hs_fp16); b += 64) {
            _mm_prefetch((const char *)k[p] + b, ATTN_PF_HINT);
            _mm_prefetch((const char *)v[p] + b, ATTN_PF_HINT);
        }
}

/* One span of n (<= HS_ATTN_SPAN) positions, K rows k[p] and V rows v[p], for rows [first, last)
 * of which row r takes the first nr[r] (rows with none are left as they are). hd a multiple of
 * 32, at most HS_ATTN_HD. The next span's next_n rows (next_k, next_v) are fetched ahead while
 * it runs; inlined into each caller, so that a prefill chunk's (NULL, 0) compiles the fetching
 * out (left in as run-time checks it cost attend_rows 5 %: tests/bench/attend_rows.sh). */
static inline __attribute__((always_inline)) void rows_span(int hd, int first, int last, const int *nr, float scale,
                             const float *const *q, const int f32, const void *const *k,
                             const float *kt, const void *const *v, int n, float *m, float *l,
                             float *const *acc,
                             float (*s)[HS_ATTN_SPAN], const hs_fp16 *const *next_k,
                             const hs_fp16 *const *next_v, int next_n) {
    static const float zero_row[HS_ATTN_HD]; /* the scores past n of the last 8: never used */
    for (int r0 = first; r0 < last; r0 += ROWS_TILE) {
        const int R = last - r0 < ROWS_TILE ? last - r0 : ROWS_TILE;
        int most = 0;
        for (int r = r0; r < r0 + R; r++) most = nr[r] > most ? nr[r] : most;
#ifdef __AVX512F__
        if (kt) { /* the packed layout's transposed K: 16 positions a step */
            for (int p = 0; p < most; p += 16) {
                const float *k16 = kt + (size_t)p * hd;
                if (R == 3) rows_dots16t(3, hd, q + r0, k16, s + r0, p);
                else if (R == 2) rows_dots16t(2, hd, q + r0, k16, s + r0, p);
                else rows_dots16t(1, hd, q + r0, k16, s + r0, p);
            }
            continue;
        }
#endif
        for (int p = 0; p < most; p += 8) {
            if (r0 == first) /* the next span's K rows, 8 a step, during the first scores */
                for (int i = p; i < p + 8 && i < next_n; i++)
                    for (int b = 0; b < hd * (int)sizeof(hs_fp16); b += 64)
                        _mm_prefetch((const char *)next_k[i] + b, ATTN_PF_HINT);
            const void *k8[8];
            for (int i = 0; i < 8; i++) k8[i] = p + i < n ? k[p + i] : zero_row;
#if ROWS_TILE == 3
            if (R == 3) rows_dots8(3, hd, q + r0, f32, k8, s + r0, p);
            else if (R == 2) rows_dots8(2, hd, q + r0, f32, k8, s + r0, p);
            else
#endif
            rows_dots8(1, hd, q + r0, f32, k8, s + r0, p);
        }
    }
    /* attend.h's softmax step, 8 rows at once; 3 rows or fewer (SmolLM2's one-token heads per
     * KV head) row by row, where an 8-lane exp per position would do more work than it saves */
    for (int r0 = first; r0 < last; r0 += 8) {
        const int R = last - r0 < 8 ? last - r0 : 8;
        if (R >= 4)
            softmax_rows8(hd, R, nr + r0, scale, s + r0, m + r0, l + r0, acc + r0);
        else
            for (int r = r0; r < r0 + R; r++)
                if (nr[r] > 0) softmax_step(hd, s[r], 1, nr[r], scale, m + r, l + r, acc[r]);
    }
    const float (*w)[HS_ATTN_SPAN] = (const float (*)[HS_ATTN_SPAN])s;
    /* the rows in tiles of at most AXPY_ROWS, as even as they go (15: 3 + 4 + 4 + 4, not
     * 4 + 4 + 4 and then 3 single rows, each converting every V row again for one row) */
    const int tiles = (last - first + AXPY_ROWS - 1) / AXPY_ROWS;
    for (int t = 0, r0 = first; t < tiles; t++) {
        const int R = (last - r0) / (tiles - t);
        /* the first tile fetches the next span's V rows ahead, one a position */
        const hs_fp16 *const *pv = t == 0 ? next_v : NULL;
        const int npv = t == 0 ? next_n : 0;
        int common = n;
        for (int r = r0; r < r0 + R; r++) common = nr[r] < common ? nr[r] : common;
        if (common < 0) common = 0;
        switch (R) {
#if AXPY_ROWS > 2
#if AXPY_ROWS > 4
#if AXPY_ROWS > 5
        case 6: rows_axpys(6, hd, f32, v, 0, common, w + r0, acc + r0, pv, npv); break;
#endif
        case 5: rows_axpys(5, hd, f32, v, 0, common, w + r0, acc + r0, pv, npv); break;
#endif
        case 4: rows_axpys(4, hd, f32, v, 0, common, w + r0, acc + r0, pv, npv); break;
        case 3: rows_axpys(3, hd, f32, v, 0, common, w + r0, acc + r0, pv, npv); break;
#endif
        case 2: rows_axpys(2, hd, f32, v, 0, common, w + r0, acc + r0, pv, npv); break;
        default: rows_axpys(1, hd, f32, v, 0, common, w + r0, acc + r0, pv, npv); break;
        }
        for (int r = r0; r < r0 + R; r++)
            if (nr[r] > common) rows_axpys(1, hd, f32, v, common, nr[r], w + r, acc + r, NULL, 0);
        r0 += R;
    }
}

/* attend_f16 (kernels.h) of hd a multiple of 32 up to HS_ATTN_HD on rows_span, attend.h's loops
 * otherwise: the same bits either way. A decode token's K and V rows come from the cache, one
 * KV head's rows a whole cached position apart (kvd fp16s: a few rows to a 4 KiB page, so the
 * hardware's page-bound streams hardly follow them); each span fetches the next span's rows
 * ahead while it computes, K during the first row tile's scores, V during the first axpy
 * tile (at 2048 positions on the VM the attention had waited on those loads for most of its
 * time: a perf profile put half of rows_span's samples on the two loads that miss;
 * docs/benchmarks.md, the sixth round, has the timings). */
static void attend_f16_rows(int hd, int ng, float scale, const float *q, const hs_fp16 *const *k,
                            const hs_fp16 *const *v, int count, float *m, float *l, float *acc) {
    if (hd % 32 || hd > HS_ATTN_HD) {
        attend_f16(hd, ng, scale, q, k, v, count, m, l, acc);
        return;
    }
    _Alignas(32) float s[HS_ATTN_GROUP][HS_ATTN_SPAN];
    const float *qs[HS_ATTN_GROUP];
    float *as[HS_ATTN_GROUP];
    int nr[HS_ATTN_GROUP];
    for (int g = 0; g < ng; g++) qs[g] = q + (size_t)g * hd, as[g] = acc + (size_t)g * hd;
    for (int p0 = 0; p0 < count; p0 += HS_ATTN_SPAN) {
        const int n = count - p0 < HS_ATTN_SPAN ? count - p0 : HS_ATTN_SPAN;
        const int next = ATTN_PF ? (count - p0 - n < HS_ATTN_SPAN ? count - p0 - n : HS_ATTN_SPAN) : 0;
        if (ATTN_PF && p0 == 0) prefetch_rows(hd, k, v, 0, n);
        for (int g = 0; g < ng; g++) nr[g] = n;
        rows_span(hd, 0, ng, nr, scale, qs, 0, (const void *const *)(k + p0), NULL,
                  (const void *const *)(v + p0), n, m, l, as, s, k + p0 + n, v + p0 + n,
                  next);
    }
}

/* The packed layout's element: HS_ROWS_F32 1 holds K and V as floats, converted once by
 * rows_pack for every row and span that reads them (the exact conversion: the same values, the
 * same bits); 0 copies the fp16 rows, each converted where it is read. The avx2 variant packs
 * floats: with 16 registers its scores take one row at a time (ROWS_TILE 1), so every K element
 * was converted once per row, in a slot the FMAs need. Against fp16 packing the gain was not
 * separated from a Zen 3 VM's noise (tests/bench/attend_rows.sh DEFS=-DHS_ROWS_F32=0: 7 %
 * faster at 3 heads per KV head, 15 % slower at 8, in one run; docs/benchmarks.md, seventeenth
 * round). The AVX-512 variants keep V in fp16, converted once per 4 rows (the weighted sum),
 * and K as floats, transposed (HS_ROWS_KT below). */
#ifndef HS_ROWS_F32
#ifdef __AVX512F__
#define HS_ROWS_F32 0
#else
#define HS_ROWS_F32 1
#endif
#endif
#if HS_ROWS_F32
typedef float rows_elem;
#else
typedef hs_fp16 rows_elem;
#endif

/* HS_ROWS_KT 1 (the AVX-512 variants): the packed layout holds K transposed, 16 positions at a
 * time, as floats (rows_dots16t's operand: each K element converted once for all rows, and a
 * position's 8 partial sums in one lane instead of summed across lanes by shuffles). One thread
 * of a Zen 4 VM: 3.29 against 3.53 ns a row-position at 256 positions, 3.37 / 3.22 against
 * 3.48 / 3.69 at 2048 (3 / 8 heads per KV head), than fp16 rows scored 8 positions at once
 * (tests/bench/attend_rows.sh BASE=7428509, the layout before, medians of 5; -DHS_ROWS_KT=0
 * builds it; docs/benchmarks.md, eighteenth round). V stays rows_elem rows. 0 (avx2): K rows
 * as V's. */
#ifndef HS_ROWS_KT
#ifdef __AVX512F__
#define HS_ROWS_KT 1
#else
#define HS_ROWS_KT 0
#endif
#endif

/* Positions in blocks of HS_ATTN_SPAN (rows_span's span): a block's K (its rows one after
 * another, or with HS_ROWS_KT its 16-position transposed pieces), then its V rows (K and V of
 * a position side by side put a span's rows 4 hd bytes apart in float: 8 positions to the same
 * L1 sets). */
static inline size_t rows_kbytes(int hd) {
    return (size_t)HS_ATTN_SPAN * (size_t)hd * (HS_ROWS_KT ? sizeof(float) : sizeof(rows_elem));
}
static inline size_t rows_block(int hd) {
    return rows_kbytes(hd) + (size_t)HS_ATTN_SPAN * (size_t)hd * sizeof(rows_elem);
}

static inline size_t rows_bytes(int hd, int count) {
    return (size_t)(count + HS_ATTN_SPAN - 1) / HS_ATTN_SPAN * rows_block(hd);
}

/* Position p's V row (v = 1) or K row (v = 0, without HS_ROWS_KT). */
static inline rows_elem *rows_at(const void *buf, int hd, int p, int v) {
    char *block = (char *)buf + (size_t)(p / HS_ATTN_SPAN) * rows_block(hd);
    return (rows_elem *)(block + (v ? rows_kbytes(hd) : 0)) + (size_t)(p % HS_ATTN_SPAN) * hd;
}

/* HS_ROWS_KT: the transposed piece of the 16 positions from p (a multiple of 16) on. A block's
 * pieces follow one another (16 hd floats each), so the piece of positions p0 + i .. p0 + i + 15
 * of the block from p0 lies i hd floats on (rows_span's kt + p hd). */
static inline float *rows_kt(const void *buf, int hd, int p) {
    return (float *)((char *)buf + (size_t)(p / HS_ATTN_SPAN) * rows_block(hd)) +
           (size_t)(p % HS_ATTN_SPAN) * hd;
}

static inline void rows_pack(int hd, const hs_fp16 *const *k, const hs_fp16 *const *v, int from,
                             int count, void *buf) {
#if HS_ROWS_KT /* K: whole pieces of 16 positions by 8 x 8 transposes, the rest one by one */
    for (int p = from; p < count;) {
        if (p % 16 == 0 && p + 16 <= count) {
            float *kt = rows_kt(buf, hd, p);
            for (int j = 0; j < hd; j += 8)
                for (int h = 0; h < 16; h += 8) {
                    __m256 t[8];
                    for (int i = 0; i < 8; i++) t[i] = load8(0, k[p + h + i], j);
                    transpose8_ps(t); /* t[c]: element j + c of positions p + h .. p + h + 7 */
                    for (int c = 0; c < 8; c++) _mm256_storeu_ps(kt + (size_t)(j + c) * 16 + h, t[c]);
                }
            p += 16;
            continue;
        }
        float *kt = rows_kt(buf, hd, p / 16 * 16) + p % 16;
        _Alignas(32) float row[HS_ATTN_HD];
        for (int j = 0; j < hd; j += 8) _mm256_store_ps(row + j, load8(0, k[p], j));
        for (int d = 0; d < hd; d++) kt[(size_t)d * 16] = row[d];
        p++;
    }
#endif
    for (int p = from; p < count; p++) {
        rows_elem *vb = rows_at(buf, hd, p, 1);
#if !HS_ROWS_KT
        rows_elem *kb = rows_at(buf, hd, p, 0);
#endif
#if HS_ROWS_F32
        for (int j = 0; j < hd; j += 8) {
#if !HS_ROWS_KT
            _mm256_storeu_ps(kb + j, load8(0, k[p], j));
#endif
            _mm256_storeu_ps(vb + j, load8(0, v[p], j));
        }
#else
#if !HS_ROWS_KT
        memcpy(kb, k[p], sizeof(hs_fp16) * (size_t)hd);
#endif
        memcpy(vb, v[p], sizeof(hs_fp16) * (size_t)hd);
#endif
    }
#if HS_ROWS_KT /* the rest of the last piece: scored (never used), so zeros rather than garbage */
    for (int p = count; p % 16; p++) {
        float *kt = rows_kt(buf, hd, p / 16 * 16) + p % 16;
        for (int d = 0; d < hd; d++) kt[(size_t)d * 16] = 0.0f;
    }
#endif
}

/* attend_rows (kernels.h): row r attends the first lim[r] packed positions. */
static inline void rows_attend(int hd, int nq, float scale, const float *const *q, const int *lim,
                               const void *buf, int count, float *m, float *l, float *const *acc) {
    const void *k[HS_ATTN_SPAN], *v[HS_ATTN_SPAN];
    _Alignas(32) float s[HS_ATTN_ROWS][HS_ATTN_SPAN];
    for (int p0 = 0; p0 < count; p0 += HS_ATTN_SPAN) {
        const int n = count - p0 < HS_ATTN_SPAN ? count - p0 : HS_ATTN_SPAN;
        int nr[HS_ATTN_ROWS], first = nq, last = 0; /* rows [first, last) see this span */
        for (int r = 0; r < nq; r++) {
            nr[r] = lim[r] - p0 < n ? lim[r] - p0 : n;
            if (nr[r] > 0 && r < first) first = r;
            if (nr[r] > 0) last = r + 1;
        }
        if (first >= last) break; /* lim[r] <= count: no later span has any */
        for (int p = 0; p < n; p++) {
#if !HS_ROWS_KT
            k[p] = rows_at(buf, hd, p0 + p, 0);
#endif
            v[p] = rows_at(buf, hd, p0 + p, 1);
        }
        rows_span(hd, first, last, nr, scale, q, HS_ROWS_F32, HS_ROWS_KT ? NULL : k,
                  HS_ROWS_KT ? rows_kt(buf, hd, p0) : NULL, v, n, m, l, acc, s, NULL, NULL, 0);
    }
}

/* Table entries of a variant that takes them (HS_ATTN_ROWS_EXACT: attend_f16's bits). */
#define HS_ROWS_KERNELS                                                                          \
    .attend_bytes = rows_bytes, .attend_pack = rows_pack, .attend_rows = rows_attend,            \
    .attend_exact = HS_EXACT_F16 | HS_EXACT_ROWS

#endif
