/* AVX2 + FMA + F16C variant (compiled with -mavx2 -mfma -mf16c; run only when the CPU has them):
 * the AVX2 form of x86_avx512.c's packed weight layout, in which each int32 lane of a vector
 * sums one block - groups of 8 blocks (one ymm of int32 lanes) instead of 16.
 *
 * Weights (converted once at load, same bytes per row as GGUF), in groups of 8 blocks (t in a
 * partial last group: everything below with 8 read as t):
 *   q4_0 / q4_1  four chunks of 32 bytes, chunk k holding bytes 4k..4k+3 of each block's 16
 *                nibble bytes (GGUF order: byte e is element e low, e + 16 high), block after
 *                block; then all blocks' fp16 scales (then q4_1's fp16 minimums).
 *   q8_0         eight chunks of 32 bytes, chunk 2k + h holding elements 16h + 4k..16h + 4k + 3
 *                of each block (signed, as in GGUF); then the fp16 scales.
 * Activations (quantize_packed): per group an act_group whose chunk k, lane j holds the four
 * activations that meet lane j of weight chunk k (lo: elements 4k..4k+3 of block j, hi:
 * 16 + 4k..), the blocks' scales, q4_0's offsets and q4_1's d x sum; a partial last group is
 * zero past its blocks.
 *
 * Products, per group of 8 blocks and pair (weight row, activation row):
 *   q4    vpmaddubsw of the unsigned nibbles (0..15) with the activations (-127..127): each int16
 *         is at most 2 x 15 x 127 = 3810 in size, so the eight of a group (4 chunks x low and
 *         high nibbles) add in int16 (30480 at most, no overflow) before one vpmaddwd makes
 *         lane j block j's integer product; q4_0 then adds -8 x the block's activation sum.
 *   q8_0  per chunk the sign trick, vpmaddubsw(|w|, sign(y, w)) (at most 2 x 128 x 127 = 32512:
 *         no saturation), and one vpmaddwd into the int32 sums.
 * Then one convert, one multiply (the activation scales) and one FMA (the weight scales); q4_1 a
 * second FMA (its minimums times d x sum). The GGUF-layout form this replaces spent 8 vector
 * instructions on every block of every pair (docs/benchmarks.md, fourteenth round); GCC 12's
 * loops for 4 activation rows take 3.3 (q4_0) and 6.3 (q8_0) a block and pair, the weight
 * unpacking and loop included (gcc -S, fifteenth round; 3.4 and 6.4 with the prefetches of the
 * seventeenth).
 * Tiles: one weight row x up to 4 activation rows, each weight chunk loaded and unpacked once for
 * all of them, the activation chunks read as memory operands; a partial last group of 1 or 2
 * blocks as one or two vectors (tail_step). Every pair gets the same operations in the same
 * order whatever the tile, so results do not depend on the batch. */
#include <math.h>
#include <string.h>

#include "x86_common.h"

#define GROUP 8
#define Q4_0_OFFSET 8 /* a q4_0 weight is its nibble minus this */
/* Bytes ahead of what a weight row's product reads that group_step fetches into L2 (its quants
 * every 64 bytes and its scales' line, 16 bytes a group): without it a one-token step on the
 * 1.1B read its weights at 44 % of the memory's rate on a Zen 3 (docs/benchmarks.md, seventeenth
 * round; 0 leaves it out, for measurements). */
#ifndef PREFETCH
#define PREFETCH 8192
#endif

typedef struct {
    int8_t lo[4][32]; /* chunk k, lane j: elements 4k..4k+3 of block j */
    int8_t hi[4][32]; /* elements 16 + 4k..16 + 4k + 3 */
    float d[8];       /* block j's scale in lane j */
    int32_t off[8];   /* -Q4_0_OFFSET x block j's sum */
    float ms[8];      /* block j's d x sum (q4_1's minimums) */
} act_group;
HS_STATIC_ASSERT(sizeof(act_group) % 32 == 0, "activation groups stay 32-byte aligned");

/* A partial last group of t <= 2 blocks again, for tail_step, after the groups: q8_0's 64 bytes
 * whose lane pt + j holds piece p (lo[p / 2] for even p, hi[p / 2] for odd) of block j, then
 * q4's 32 of lo[k] in lane kt + j and 32 of hi[k] (zero past them). */
#define TAIL_BYTES 128
static inline int8_t *act_tail(const act_group *row, int ng) { return (int8_t *)(row + ng); }

static size_t act_bytes(int n) {
    return (size_t)((n / HS_QK + GROUP - 1) / GROUP) * sizeof(act_group) + TAIL_BYTES;
}

static void quantize_packed(const float *x, void *out, int n) {
    act_group *g = out;
    const int nb = n / HS_QK, ng = (nb + GROUP - 1) / GROUP;
    memset(g + nb / GROUP, 0, (size_t)(ng - nb / GROUP) * sizeof *g); /* a partial last group */
    for (int b = 0; b < nb; b++) {
        act_group *G = g + b / GROUP;
        const int j = b % GROUP;
        float d;
        int sum;
        quantize_block_chunks(x + b * HS_QK, G->lo[0], G->hi[0], sizeof G->lo[0], j, &d, &sum);
        G->d[j] = d;
        G->off[j] = -Q4_0_OFFSET * sum;
        G->ms[j] = d * (float)sum;
    }
    const int t = nb % GROUP;
    int8_t *tail = act_tail(g, ng);
    memset(tail, 0, TAIL_BYTES);
    if (t && t <= 2)
        for (int j = 0; j < t; j++)
            for (int k = 0; k < 4; k++) {
                const act_group *G = g + ng - 1;
                memcpy(tail + 4 * ((2 * k) * t + j), G->lo[k] + 4 * j, 4);
                memcpy(tail + 4 * ((2 * k + 1) * t + j), G->hi[k] + 4 * j, 4);
                memcpy(tail + 64 + 4 * (k * t + j), G->lo[k] + 4 * j, 4);
                memcpy(tail + 96 + 4 * (k * t + j), G->hi[k] + 4 * j, 4);
            }
}

/* Where piece p of block b lies in a packed row's quants (q4: p = 0..3, bytes 4p..4p+3 of the
 * block's nibble bytes; q8_0: p = 2k + h, elements 16h + 4k..16h + 4k + 3). */
static inline size_t piece_at(int nb, int b, int p, size_t qbytes) {
    const int g = b / GROUP, t = nb - g * GROUP < GROUP ? nb - g * GROUP : GROUP;
    return (size_t)g * GROUP * qbytes + (size_t)p * 4 * t + (size_t)(b % GROUP) * 4;
}

static void pack_row(int type, const void *src, void *dst, int cols) {
    const int nb = cols / HS_QK;
    uint8_t *qs = dst;
    const size_t qbytes = type == HS_Q8_0 ? 32 : 16;
    hs_fp16 *d = (hs_fp16 *)(qs + (size_t)nb * qbytes), *m = d + nb;
    for (int b = 0; b < nb; b++) {
        if (type == HS_Q8_0) {
            const block_q8_0 *x = (const block_q8_0 *)src + b;
            for (int p = 0; p < 8; p++)
                memcpy(qs + piece_at(nb, b, p, qbytes), x->qs + 16 * (p % 2) + 4 * (p / 2), 4);
            d[b] = x->d;
        } else if (type == HS_Q4_0) {
            const block_q4_0 *x = (const block_q4_0 *)src + b;
            for (int p = 0; p < 4; p++) memcpy(qs + piece_at(nb, b, p, qbytes), x->qs + 4 * p, 4);
            d[b] = x->d;
        } else {
            const block_q4_1 *x = (const block_q4_1 *)src + b;
            for (int p = 0; p < 4; p++) memcpy(qs + piece_at(nb, b, p, qbytes), x->qs + 4 * p, 4);
            d[b] = x->d;
            m[b] = x->m;
        }
    }
}

/* The inverse of pack_row (the embedding lookup reads rows back in the GGUF layout). */
static void unpack_row(int type, const void *src, void *dst, int cols) {
    const int nb = cols / HS_QK;
    const uint8_t *qs = src;
    const size_t qbytes = type == HS_Q8_0 ? 32 : 16;
    const hs_fp16 *d = (const hs_fp16 *)(qs + (size_t)nb * qbytes), *m = d + nb;
    for (int b = 0; b < nb; b++) {
        if (type == HS_Q8_0) {
            block_q8_0 *x = (block_q8_0 *)dst + b;
            for (int p = 0; p < 8; p++)
                memcpy(x->qs + 16 * (p % 2) + 4 * (p / 2), qs + piece_at(nb, b, p, qbytes), 4);
            x->d = d[b];
        } else if (type == HS_Q4_0) {
            block_q4_0 *x = (block_q4_0 *)dst + b;
            for (int p = 0; p < 4; p++) memcpy(x->qs + 4 * p, qs + piece_at(nb, b, p, qbytes), 4);
            x->d = d[b];
        } else {
            block_q4_1 *x = (block_q4_1 *)dst + b;
            for (int p = 0; p < 4; p++) memcpy(x->qs + 4 * p, qs + piece_at(nb, b, p, qbytes), 4);
            x->d = d[b];
            x->m = m[b];
        }
    }
}

enum { Q4_0, Q4_1, Q8_0 };

/* A chunk of a group of t blocks: whole groups load without a mask, a partial last group's
 * lanes past t read zeros. */
static inline __attribute__((always_inline)) __m256i load_chunk(const int t, __m256i lanes,
                                                                const uint8_t *p) {
    return t == GROUP ? _mm256_loadu_si256((const __m256i *)p)
                      : _mm256_maskload_epi32((const int *)p, lanes);
}

/* t fp16 values as 8 floats (zero past t). */
static inline __attribute__((always_inline)) __m256 load_scales(const int t, const hs_fp16 *p) {
    if (t == GROUP) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    _Alignas(16) hs_fp16 v[GROUP] = {0};
    memcpy(v, p, sizeof(hs_fp16) * (size_t)t);
    return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)v));
}

/* The float part of group g (t blocks) for C pairs: acc += cvt(s) x the activations' scales x
 * the weights' (q4_1: + its minimums x d x sum); lanes past t meet zero scales. */
static inline __attribute__((always_inline)) void scale_step(
    const int kind, const int C, const int t, int g, const hs_fp16 *d, const hs_fp16 *m,
    const act_group *const *y, const __m256i s[4], __m256 acc[4]) {
    const __m256 dw = load_scales(t, d + (size_t)g * GROUP);
    const __m256 mw = kind == Q4_1 ? load_scales(t, m + (size_t)g * GROUP) : _mm256_setzero_ps();
    for (int c = 0; c < C; c++) {
        acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[c]), _mm256_loadu_ps(y[c][g].d)),
                                 dw, acc[c]);
        if (kind == Q4_1) acc[c] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(y[c][g].ms), acc[c]);
    }
}

/* Group g (t blocks; t == GROUP, a constant, for all but a partial last group) of one weight row
 * (its quants at q, its scales and minimums at d and m) against C activation rows, into acc. */
static inline __attribute__((always_inline)) void group_step(
    const int kind, const int C, const int t, int g, const uint8_t *q, const hs_fp16 *d,
    const hs_fp16 *m, const act_group *const *y, __m256 acc[4]) {
    const __m256i lanes = first_lanes(t);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[4];
    if (PREFETCH) { /* (every group, a line every 4: no branch, the loop one basic block) */
        _mm_prefetch((const char *)(d + (size_t)g * GROUP) + PREFETCH, _MM_HINT_T1);
        if (kind == Q4_1) _mm_prefetch((const char *)(m + (size_t)g * GROUP) + PREFETCH, _MM_HINT_T1);
    }
    if (kind == Q8_0) {
        for (int c = 0; c < C; c++) s[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) {
            if (PREFETCH && p % 2 == 0)
                _mm_prefetch((const char *)q + (size_t)p * 4 * t + PREFETCH, _MM_HINT_T1);
            const __m256i wv = load_chunk(t, lanes, q + (size_t)p * 4 * t);
            const __m256i aw = _mm256_sign_epi8(wv, wv);
            for (int c = 0; c < C; c++) {
                const int8_t *ya = (p % 2 ? y[c][g].hi : y[c][g].lo)[p / 2];
                const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)ya), wv);
                s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones));
                /* the sum as it stands, in a register: GCC would otherwise reassociate the
                 * chain into a tree that computes all 8C products first and spills them */
                __asm__("" : "+x"(s[c]));
            }
        }
    } else {
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        __m256i h[4];
        for (int k = 0; k < 4; k++) {
            if (PREFETCH && k % 2 == 0)
                _mm_prefetch((const char *)q + (size_t)k * 4 * t + PREFETCH, _MM_HINT_T1);
            const __m256i raw = load_chunk(t, lanes, q + (size_t)k * 4 * t);
            const __m256i wl = _mm256_and_si256(raw, low4),
                          wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
            /* (saturating adds, which never saturate here: GCC reassociates plain ones into
             * trees that compute all 8C products first and spill them) */
            for (int c = 0; c < C; c++) {
                const __m256i v = _mm256_adds_epi16(
                    _mm256_maddubs_epi16(wl, _mm256_loadu_si256((const __m256i *)y[c][g].lo[k])),
                    _mm256_maddubs_epi16(wh, _mm256_loadu_si256((const __m256i *)y[c][g].hi[k])));
                h[c] = k ? _mm256_adds_epi16(h[c], v) : v;
            }
        }
        for (int c = 0; c < C; c++) {
            s[c] = _mm256_madd_epi16(h[c], ones);
            if (kind == Q4_0)
                s[c] = _mm256_add_epi32(s[c], _mm256_loadu_si256((const __m256i *)y[c][g].off));
        }
    }
    scale_step(kind, C, t, g, d, m, y, s, acc);
}

/* A partial last group of t <= 2 blocks (t a constant): its weight pieces lie together (16t
 * bytes for q4, 32t for q8_0) and are read as one or two vectors whose lane pt + j holds piece p
 * of block j; the activations' tail copy (act_tail) matches it. The int32 lanes of each block
 * are then added (exact integers, any order) into lane j: the same sums as group_step's, for a
 * quarter (q4) or an eighth (q8_0) of its multiplies. Lanes past t hold partial sums that meet
 * zero scales. */
static inline __attribute__((always_inline)) void tail_step(
    const int kind, const int C, const int t, int g, const uint8_t *q, const hs_fp16 *d,
    const hs_fp16 *m, const act_group *const *y, const int8_t *const *tail, __m256 acc[4]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[4];
    if (kind == Q8_0) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)q);
        const __m256i w1 = t == 2 ? _mm256_loadu_si256((const __m256i *)(q + 32))
                                  : _mm256_setzero_si256();
        const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
        for (int c = 0; c < C; c++) {
            s[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(
                       _mm256_loadu_si256((const __m256i *)tail[c]), w0)), ones);
            if (t == 2)
                s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(
                           a1, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(tail[c] + 32)),
                                                w1)), ones));
        }
    } else {
        const __m256i low4 = _mm256_set1_epi8(0x0f);
        const __m256i raw = t == 2 ? _mm256_loadu_si256((const __m256i *)q)
                                   : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)q));
        const __m256i wl = _mm256_and_si256(raw, low4),
                      wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        for (int c = 0; c < C; c++)
            s[c] = _mm256_madd_epi16(_mm256_add_epi16(
                _mm256_maddubs_epi16(wl, _mm256_loadu_si256((const __m256i *)(tail[c] + 64))),
                _mm256_maddubs_epi16(wh, _mm256_loadu_si256((const __m256i *)(tail[c] + 96)))),
                ones);
    }
    for (int c = 0; c < C; c++) {
        __m256i v = _mm256_add_epi32(s[c], _mm256_permute2x128_si256(s[c], s[c], 1));
        v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0x4e));
        if (t == 1) v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0xb1));
        if (kind == Q4_0) v = _mm256_add_epi32(v, _mm256_loadu_si256((const __m256i *)y[c][g].off));
        s[c] = v;
    }
    scale_step(kind, C, t, g, d, m, y, s, acc);
}

/* One weight row x C activation rows (both constants after inlining): out[c * ostride]. */
static inline __attribute__((always_inline)) void tile(const int kind, const int C, int nb,
                                                       const uint8_t *w, const void *a,
                                                       size_t astride, float *out,
                                                       size_t ostride) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const hs_fp16 *d = (const hs_fp16 *)(w + (size_t)nb * qbytes), *m = d + nb;
    const act_group *y[4];
    __m256 acc[4];
    for (int c = 0; c < C; c++) {
        y[c] = (const act_group *)((const char *)a + (size_t)c * astride);
        acc[c] = _mm256_setzero_ps();
    }
    const int full = nb / GROUP, ng = (nb + GROUP - 1) / GROUP, rest = nb - full * GROUP;
    for (int g = 0; g < full; g++)
        group_step(kind, C, GROUP, g, w + (size_t)g * GROUP * qbytes, d, m, y, acc);
    const uint8_t *q = w + (size_t)full * GROUP * qbytes;
    const int8_t *tail[4];
    for (int c = 0; c < C; c++) tail[c] = act_tail(y[c], ng);
    if (rest == 1) tail_step(kind, C, 1, full, q, d, m, y, tail, acc);
    else if (rest == 2) tail_step(kind, C, 2, full, q, d, m, y, tail, acc);
    else if (rest) group_step(kind, C, rest, full, q, d, m, y, acc);
    for (int c = 0; c < C; c++) out[(size_t)c * ostride] = hsum_ps(acc[c]);
}

/* Up to 4 weight rows x up to 4 activation rows: each weight row in a tile of all the
 * activation rows. */
#define TILES(KIND, NAME)                                                                       \
    static void NAME(int nb, const void *w, size_t wstride, int nrows, const void *a,          \
                     size_t astride, int ncols, float *out, size_t ostride) {                  \
        for (int r = 0; r < nrows; r++) {                                                      \
            const uint8_t *row = (const uint8_t *)w + (size_t)r * wstride;                     \
            switch (ncols) {                                                                   \
            case 1: tile(KIND, 1, nb, row, a, astride, out + r, ostride); break;               \
            case 2: tile(KIND, 2, nb, row, a, astride, out + r, ostride); break;               \
            case 3: tile(KIND, 3, nb, row, a, astride, out + r, ostride); break;               \
            default: tile(KIND, 4, nb, row, a, astride, out + r, ostride); break;              \
            }                                                                                  \
        }                                                                                      \
    }

TILES(Q4_0, mm_q4_0)
TILES(Q4_1, mm_q4_1)
TILES(Q8_0, mm_q8_0)

static const hs_kernels table = {
    .name = "avx2", .act_bytes = act_bytes, .quantize_act = quantize_packed,
    .pack_row = pack_row, .unpack_row = unpack_row, .mm_q4_0 = mm_q4_0, .mm_q4_1 = mm_q4_1,
    .mm_q8_0 = mm_q8_0, .dot_f16 = dot_f16, .dot_f32 = dot_f32, .to_f16 = to_f16,
    .attend_f16 = attend_f16_rows, .swiglu = swiglu, HS_ROWS_KERNELS};

const hs_kernels *hs_kernels_avx2(void) { return &table; }
