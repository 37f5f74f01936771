/* AVX-512 VNNI variant (F, BW, VL, VNNI): a packed weight layout read 128 values at a time.
 *
 * Weights (converted once at load, same bytes per row as GGUF):
 *   q4_0 / q4_1  all blocks' nibbles (16 bytes each, GGUF nibble order), then the fp16 scales
 *                (then q4_1's fp16 minimums). 64 bytes = four blocks: the low nibbles are their
 *                elements 0..15, the high nibbles 16..31.
 *   q8_0         per group of four blocks: elements 0..15 of each block, then 16..31 of each,
 *                stored unsigned (x + 128) for vpdpbusd; then the fp16 scales.
 * Activations (quantize_packed): per group of four blocks an hs_act_group, so that int32 lane k
 * of a vpdpbusd over (lo, hi) only sums products of block k / 4 and one float multiply applies
 * both scales. Unsigned weights are corrected by starting the int32 sums at -8 (q4_0) or -128
 * (q8_0) times the activations feeding each lane; q4_1's minimum adds m * d * sum(block).
 * A partial last group is read with masked loads against zero-padded activations. */
#include <math.h>
#include <string.h>

#include "x86_common.h"

#define GROUP 4
#define PF_HINT _MM_HINT_T1 /* into L2: leaves the L1 fill buffers to the demand loads */
#define PREFETCH 8192        /* bytes ahead of what a weight row's product reads: its quants and,
                              * a line every eight groups, its scales (without those, a ninth of
                              * a q4_0 row's lines came in on demand) */

/* An activation row: ng groups (what every product reads), then each group's q8_0 offsets
 * (int32[16]) and q4_1 block sums (float[4]), kept apart so that they cost the q4_0 products no
 * cache space. */
typedef struct {
    int8_t lo[64];     /* elements 0..15 of the group's blocks, block after block */
    int8_t hi[64];     /* elements 16..31 */
    float d[16];       /* scale of block k / 4 in lane k */
    int32_t off4[16];  /* -8 x the sum of the eight activations lane k multiplies */
} act_group;
HS_STATIC_ASSERT(sizeof(act_group) == 256, "activation groups stay 64-byte aligned");

static inline int32_t *act_off8(const act_group *row, int ng, int g) {
    return (int32_t *)(row + ng) + 16 * g; /* -128 x the same sums as off4 */
}
static inline float *act_sums(const act_group *row, int ng, int g) {
    return (float *)(act_off8(row, ng, ng)) + 4 * g; /* d x sum of each block */
}

static size_t act_bytes(int n) {
    const size_t ng = (size_t)(n / HS_QK + GROUP - 1) / GROUP;
    return ng * sizeof(act_group) + ng * 64 + (ng * 16 + 63) / 64 * 64;
}

static void quantize_packed(const float *x, void *out, int n) {
    act_group *g = out;
    const int nb = n / HS_QK, ng = (nb + GROUP - 1) / GROUP;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int b = 0; b < nb; b++) {
        act_group *G = g + b / GROUP;
        const int j = b % GROUP;
        float d;
        int sum;
        const __m256i q = quantize_block(x + b * HS_QK, &d, &sum);
        _mm_store_si128((__m128i *)(G->lo + 16 * j), _mm256_castsi256_si128(q));
        _mm_store_si128((__m128i *)(G->hi + 16 * j), _mm256_extracti128_si256(q, 1));
        const __m256i s8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
        const __m128i lanes = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        _mm_store_si128((__m128i *)(G->off4 + 4 * j), _mm_mullo_epi32(lanes, _mm_set1_epi32(-8)));
        _mm_store_si128((__m128i *)(act_off8(g, ng, b / GROUP) + 4 * j),
                        _mm_mullo_epi32(lanes, _mm_set1_epi32(-128)));
        _mm_store_ps(G->d + 4 * j, _mm_set1_ps(d));
        act_sums(g, ng, b / GROUP)[j] = d * (float)sum;
    }
    for (int b = nb; b % GROUP; b++) { /* zero the rest of a partial last group */
        act_group *G = g + b / GROUP;
        const int j = b % GROUP;
        memset(G->lo + 16 * j, 0, 16);
        memset(G->hi + 16 * j, 0, 16);
        memset(G->d + 4 * j, 0, 16);
        memset(G->off4 + 4 * j, 0, 16);
        memset(act_off8(g, ng, b / GROUP) + 4 * j, 0, 16);
        act_sums(g, ng, b / GROUP)[j] = 0.0f;
    }
}

static void pack_row(int type, const void *src, void *dst, int cols) {
    const int nb = cols / HS_QK;
    uint8_t *qs = dst;
    if (type == HS_Q4_0 || type == HS_Q4_1) {
        hs_fp16 *d = (hs_fp16 *)(qs + (size_t)nb * 16), *m = d + nb;
        for (int b = 0; b < nb; b++) {
            if (type == HS_Q4_0) {
                const block_q4_0 *x = (const block_q4_0 *)src + b;
                memcpy(qs + b * 16, x->qs, 16);
                d[b] = x->d;
            } else {
                const block_q4_1 *x = (const block_q4_1 *)src + b;
                memcpy(qs + b * 16, x->qs, 16);
                d[b] = x->d;
                m[b] = x->m;
            }
        }
    } else if (type == HS_Q8_0) {
        hs_fp16 *d = (hs_fp16 *)(qs + (size_t)nb * 32);
        for (int g = 0; g * GROUP < nb; g++) {
            const int t = nb - g * GROUP < GROUP ? nb - g * GROUP : GROUP;
            uint8_t *lo = qs + (size_t)g * GROUP * 32, *hi = lo + t * 16;
            for (int j = 0; j < t; j++) {
                const block_q8_0 *x = (const block_q8_0 *)src + g * GROUP + j;
                for (int e = 0; e < 16; e++) {
                    lo[j * 16 + e] = (uint8_t)(x->qs[e] ^ 0x80);
                    hi[j * 16 + e] = (uint8_t)(x->qs[16 + e] ^ 0x80);
                }
                d[g * GROUP + j] = x->d;
            }
        }
    }
}

/* The inverse of pack_row (the embedding lookup reads rows back in the GGUF layout). */
static void unpack_row(int type, const void *src, void *dst, int cols) {
    const int nb = cols / HS_QK;
    const uint8_t *qs = src;
    if (type == HS_Q4_0 || type == HS_Q4_1) {
        const hs_fp16 *d = (const hs_fp16 *)(qs + (size_t)nb * 16), *m = d + nb;
        for (int b = 0; b < nb; b++) {
            if (type == HS_Q4_0) {
                block_q4_0 *x = (block_q4_0 *)dst + b;
                memcpy(x->qs, qs + b * 16, 16);
                x->d = d[b];
            } else {
                block_q4_1 *x = (block_q4_1 *)dst + b;
                memcpy(x->qs, qs + b * 16, 16);
                x->d = d[b];
                x->m = m[b];
            }
        }
    } else if (type == HS_Q8_0) {
        const hs_fp16 *d = (const hs_fp16 *)(qs + (size_t)nb * 32);
        for (int g = 0; g * GROUP < nb; g++) {
            const int t = nb - g * GROUP < GROUP ? nb - g * GROUP : GROUP;
            const uint8_t *lo = qs + (size_t)g * GROUP * 32, *hi = lo + t * 16;
            for (int j = 0; j < t; j++) {
                block_q8_0 *x = (block_q8_0 *)dst + g * GROUP + j;
                for (int e = 0; e < 16; e++) {
                    x->qs[e] = (int8_t)(lo[j * 16 + e] ^ 0x80);
                    x->qs[16 + e] = (int8_t)(hi[j * 16 + e] ^ 0x80);
                }
                x->d = d[g * GROUP + j];
            }
        }
    }
}

/* The four scales of a group (fewer in a partial one), each spread over its four int32 lanes. */
static inline __m512 group_scales(const hs_fp16 *d, __mmask8 m, int whole) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m128 d4 = _mm_cvtph_ps(whole ? _mm_loadl_epi64((const __m128i *)d)
                                         : _mm_maskz_loadu_epi16(m, d));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d4));
}

enum { Q4_0, Q4_1, Q8_0 };

/* One group of t blocks (t == GROUP, a constant, for all but a partial last group: whole groups
 * load without masks) of R weight rows x C activation rows into the tile's accumulators. */
static inline __attribute__((always_inline)) void group_step(
    const int kind, const int R, const int C, int g, const int t, int nb, const uint8_t *w,
    size_t wstride, const act_group *a, size_t astride, __m512 acc[4][4], __m128 mins[4][4]) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const int ng = (nb + GROUP - 1) / GROUP;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __mmask64 qm = t == GROUP ? ~(__mmask64)0 : (((__mmask64)1 << (16 * t)) - 1);
    const __mmask8 dm = (__mmask8)((1u << t) - 1);
    __m512i wl[4], wh[4];
    __m512 dw[4];
    __m128 mw[4];
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + (size_t)r * wstride;
        const hs_fp16 *d = (const hs_fp16 *)(row + (size_t)nb * qbytes);
        if (kind == Q8_0) {
            const uint8_t *q = row + (size_t)g * GROUP * 32;
            _mm_prefetch((const char *)q + PREFETCH, PF_HINT);
            _mm_prefetch((const char *)q + PREFETCH + 64, PF_HINT);
            wl[r] = t == GROUP ? _mm512_loadu_si512(q) : _mm512_maskz_loadu_epi8(qm, q);
            wh[r] = t == GROUP ? _mm512_loadu_si512(q + 64) : _mm512_maskz_loadu_epi8(qm, q + t * 16);
        } else {
            /* the stream runs ahead of the hardware prefetcher's reach between tiles */
            const uint8_t *q = row + (size_t)g * GROUP * 16;
            _mm_prefetch((const char *)q + PREFETCH, PF_HINT);
            const __m512i raw = t == GROUP ? _mm512_loadu_si512(q) : _mm512_maskz_loadu_epi8(qm, q);
            wl[r] = _mm512_and_si512(raw, low4);
            wh[r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
        if (g % 8 == 0) { /* the scales' (and minimums') next line, as far ahead */
            _mm_prefetch((const char *)(d + g * GROUP) + PREFETCH, PF_HINT);
            if (kind == Q4_1)
                _mm_prefetch((const char *)(d + nb + g * GROUP) + PREFETCH, PF_HINT);
        }
        dw[r] = group_scales(d + g * GROUP, dm, t == GROUP);
        if (kind == Q4_1)
            mw[r] = _mm_cvtph_ps(t == GROUP ? _mm_loadl_epi64((const __m128i *)(d + nb + g * GROUP))
                                            : _mm_maskz_loadu_epi16(dm, d + nb + g * GROUP));
    }
    for (int c = 0; c < C; c++) {
        const act_group *arow = (const act_group *)((const char *)a + (size_t)c * astride);
        const act_group *y = arow + g;
        const __m512i ylo = _mm512_load_si512(y->lo), yhi = _mm512_load_si512(y->hi);
        const __m512 yd = _mm512_load_ps(y->d);
        for (int r = 0; r < R; r++) {
            __m512i s = kind == Q4_0 ? _mm512_load_si512(y->off4)
                      : kind == Q8_0 ? _mm512_load_si512(act_off8(arow, ng, g))
                                     : _mm512_setzero_si512();
            s = _mm512_dpbusd_epi32(s, wl[r], ylo);
            s = _mm512_dpbusd_epi32(s, wh[r], yhi);
            acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), yd), dw[r],
                                        acc[r][c]);
            if (kind == Q4_1)
                mins[r][c] = _mm_fmadd_ps(mw[r], _mm_load_ps(act_sums(arow, ng, g)),
                                          mins[r][c]);
        }
    }
}

/* R weight rows x C activation rows, all constants after inlining: the accumulators live in
 * registers. Per group and pair: two vpdpbusd, one convert, one multiply, one FMA. */
static inline __attribute__((always_inline)) void tile(const int kind, const int R, const int C,
                                                       int nb, const uint8_t *w, size_t wstride,
                                                       const act_group *a, size_t astride,
                                                       float *out, size_t ostride) {
    __m512 acc[4][4];
    __m128 mins[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            acc[r][c] = _mm512_setzero_ps();
            mins[r][c] = _mm_setzero_ps();
        }
    const int ng = (nb + GROUP - 1) / GROUP, full = nb / GROUP;
    for (int g = 0; g < full; g++)
        group_step(kind, R, C, g, GROUP, nb, w, wstride, a, astride, acc, mins);
    if (full < ng)
        group_step(kind, R, C, full, nb - full * GROUP, nb, w, wstride, a, astride, acc, mins);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float v = _mm512_reduce_add_ps(acc[r][c]);
            if (kind == Q4_1) {
                __m128 m = mins[r][c];
                m = _mm_add_ps(m, _mm_movehl_ps(m, m));
                v += _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
            }
            out[(size_t)c * ostride + r] = v;
        }
}

#define TILE_COLS(KIND, R)                                                                      \
    switch (ncols) {                                                                           \
    case 1: tile(KIND, R, 1, nb, w, wstride, y, astride, out, ostride); return;                     \
    case 2: tile(KIND, R, 2, nb, w, wstride, y, astride, out, ostride); return;                     \
    case 3: tile(KIND, R, 3, nb, w, wstride, y, astride, out, ostride); return;                     \
    default: tile(KIND, R, 4, nb, w, wstride, y, astride, out, ostride); return;                    \
    }

/* Up to 4 x 4 tiles: each activation group loaded from L2 serves four weight rows, each weight
 * group unpacked once serves four activation rows. */
#define TILES(KIND, NAME)                                                                       \
    static void NAME(int nb, const void *w, size_t wstride, int nrows, const void *a,          \
                     size_t astride, int ncols, float *out, size_t ostride) {                  \
        const act_group *y = a;                                                                \
        switch (nrows) {                                                                       \
        case 1: TILE_COLS(KIND, 1)                                                             \
        case 2: TILE_COLS(KIND, 2)                                                             \
        case 3: TILE_COLS(KIND, 3)                                                             \
        default: TILE_COLS(KIND, 4)                                                            \
        }                                                                                      \
    }

TILES(Q4_0, mm_q4_0)
TILES(Q4_1, mm_q4_1)
TILES(Q8_0, mm_q8_0)

/* The table's entries; x86_amx.c includes this file and adds its tile-unit products. */
#define AVX512_KERNELS                                                                          \
    .dot_f16 = dot_f16, .dot_f32 = dot_f32, .to_f16 = to_f16,                                 \
    .attend_f16 = attend_f16_rows,                                                               \
    .act_bytes = act_bytes, .quantize_act = quantize_packed,                                     \
    .pack_row = pack_row, .unpack_row = unpack_row, .mm_q4_0 = mm_q4_0, .mm_q4_1 = mm_q4_1,     \
    .mm_q8_0 = mm_q8_0

#ifndef HS_AMX
static const hs_kernels table = {.name = "avx512vnni", AVX512_KERNELS, HS_ROWS_KERNELS};

const hs_kernels *hs_kernels_avx512(void) { return &table; }
#endif
