/* AVX-512 VNNI variant (F, BW, VL, VNNI): a packed weight layout in which each int32 lane of a
 * vpdpbusd sums one block.
 *
 * Weights (converted once at load, same bytes per row as GGUF), in groups of 16 blocks (fewer
 * in a partial last group of t blocks: everything below with 16 read as t):
 *   q4_0 / q4_1  four chunks of 64 bytes, chunk k holding bytes 4k..4k+3 of each block's 16
 *                nibble bytes (GGUF order: byte e is element e low, e + 16 high) block after
 *                block; then all blocks' fp16 scales (then q4_1's fp16 minimums).
 *   q8_0         eight chunks of 64 bytes, holding elements 4k..4k+3 and 16 + 4k..16 + 4k + 3
 *                of each block in the order k = 0 low, 0 high, 1 low, ... (a group of up to 4
 *                blocks: all four low chunks, then the high ones), stored unsigned (x + 128)
 *                for vpdpbusd; then the fp16 scales.
 * Activations (quantize_packed): per group of 16 blocks an act_group whose chunk k, lane j holds
 * the four activations that meet lane j of weight chunk k (lo: elements 4k..4k+3 of block j,
 * hi: 16 + 4k..), so that after eight vpdpbusd lane j is block j's integer product and one
 * convert, one multiply and one FMA scale the 16 blocks. Unsigned weights are corrected by
 * starting the sums at -8 (q4_0) or -128 (q8_0) times the block's activation sum; q4_1's
 * minimum adds m * d * sum(block). A partial last group is read with masked loads against
 * zero-padded activations. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "x86_common.h"

#define GROUP 16
/* (PF_HINT, PF_EVERY and PREFETCH can be set from outside for measurements:
 * tests/bench/amx_products.sh DEFS) */
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1 /* into L2: leaves the L1 fill buffers to the demand loads */
#endif
#ifndef PF_EVERY
#define PF_EVERY 1 /* a register tile prefetches for every PF_EVERY-th chunk of a weight group */
#endif
#ifndef PREFETCH
#define PREFETCH 8192        /* bytes ahead of what a weight row's product reads: its quants and,
                              * a line every two groups, its scales (without those, a ninth of
                              * a q4_0 row's lines came in on demand) */
#endif
/* A measurement aid (amx_products.sh DEFS=...), 0 in the engine: with bit 1 the register tiles
 * add each group's integer sums into the accumulators as they are (one integer add a pair)
 * instead of converting and scaling them (three float steps), so that a build measures what
 * the rest of a tile costs. Its results are wrong. */
#ifndef REGTILE_SKIP
#define REGTILE_SKIP 0
#endif

/* An activation row: ng groups (what every product reads), then each group's q4_1 block sums
 * (float[16]), kept apart so that they cost the other products no cache space, then act_tail's
 * 128 bytes. */
typedef struct {
    int8_t lo[4][64];  /* chunk k, lane j: elements 4k..4k+3 of block j */
    int8_t hi[4][64];  /* elements 16 + 4k..16 + 4k + 3 */
    float d[16];       /* block j's scale in lane j */
    int32_t off4[16];  /* -8 x block j's sum (x 16 for q8_0's -128) */
} act_group;
HS_STATIC_ASSERT(sizeof(act_group) == 640, "activation groups stay 64-byte aligned");

static inline float *act_sums(const act_group *row, int ng, int g) {
    return (float *)(row + ng) + 16 * g; /* d x sum of each block */
}
/* A partial last group of t <= 4 blocks again, for tail_step: 64 bytes whose lane kt + j is
 * lo[k]'s lane j, then 64 the same of hi (zero past 4t lanes). */
static inline int8_t *act_tail(const act_group *row, int ng) {
    return (int8_t *)act_sums(row, ng, ng);
}

static size_t act_bytes(int n) {
    const size_t ng = (size_t)(n / HS_QK + GROUP - 1) / GROUP;
    return ng * sizeof(act_group) + ng * 64 + 128;
}

static inline void store32(void *p, int v) { memcpy(p, &v, 4); }
static inline int load32(const void *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}

static void quantize_packed(const float *x, void *out, int n) {
    act_group *g = out;
    const int nb = n / HS_QK, ng = (nb + GROUP - 1) / GROUP;
    for (int b = 0; b < nb; b++) {
        act_group *G = g + b / GROUP;
        const int j = b % GROUP;
        float d;
        int sum;
        quantize_block_chunks(x + b * HS_QK, G->lo[0], G->hi[0], sizeof G->lo[0], j, &d, &sum);
        G->d[j] = d;
        G->off4[j] = -8 * sum;
        act_sums(g, ng, b / GROUP)[j] = d * (float)sum;
    }
    for (int b = nb; b % GROUP; b++) { /* zero the rest of a partial last group */
        act_group *G = g + b / GROUP;
        const int j = b % GROUP;
        for (int k = 0; k < 4; k++) {
            store32(G->lo[k] + 4 * j, 0);
            store32(G->hi[k] + 4 * j, 0);
        }
        G->d[j] = 0.0f;
        G->off4[j] = 0;
        act_sums(g, ng, b / GROUP)[j] = 0.0f;
    }
    const int t = nb % GROUP;
    int8_t *tail = act_tail(g, ng);
    memset(tail, 0, 128);
    if (t && t <= 4)
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < t; j++) {
                memcpy(tail + 4 * (k * t + j), g[ng - 1].lo[k] + 4 * j, 4);
                memcpy(tail + 64 + 4 * (k * t + j), g[ng - 1].hi[k] + 4 * j, 4);
            }
}

/* q8_0's chunks in a group of t blocks: for t > 4 those of elements 4k.. and 16 + 4k.. side by
 * side (k = 0..3: a product reads its lines in order), for t <= 4 all of 0..15 then all of
 * 16..31 (tail_step reads each half as one vector). Where chunk k of the low half starts (in
 * chunks of 4t bytes), and how far its high-half partner lies. */
static inline size_t q8_lo(int t, int k) { return (size_t)(t > 4 ? 2 * k : k) * 4 * t; }
static inline size_t q8_hi(int t) { return (size_t)(t > 4 ? 1 : 4) * 4 * t; }

/* Where block b's bytes lie in a packed row: its first 4-byte piece (q4: 4 pieces, one per chunk;
 * q8_0: 4 of elements 0..15, 4 of 16..31), the distance between a half's pieces and (q8_0) from
 * the low half's first to the high half's. */
static inline const uint8_t *block_piece(const uint8_t *qs, size_t qbytes, int nb, int b,
                                         size_t *stride, size_t *hi) {
    const int g = b / GROUP, j = b % GROUP, t = nb - g * GROUP < GROUP ? nb - g * GROUP : GROUP;
    *stride = qbytes == 32 ? q8_lo(t, 1) : (size_t)t * 4;
    *hi = q8_hi(t);
    return qs + (size_t)g * GROUP * qbytes + (size_t)j * 4;
}

/* Four 4-byte pieces `stride` apart as one 16-byte vector (a q4 block's bytes, or half a q8_0
 * block). */
static inline __m128i block_pieces(const uint8_t *p, size_t stride) {
    return _mm_setr_epi32(load32(p), load32(p + stride), load32(p + 2 * stride),
                          load32(p + 3 * stride));
}

static void pack_row(int type, const void *src, void *dst, int cols) {
    const int nb = cols / HS_QK;
    uint8_t *qs = dst;
    const size_t qbytes = type == HS_Q8_0 ? 32 : 16;
    hs_fp16 *d = (hs_fp16 *)(qs + (size_t)nb * qbytes), *m = d + nb;
    for (int b = 0; b < nb; b++) {
        size_t stride, hi;
        uint8_t *p = (uint8_t *)block_piece(qs, qbytes, nb, b, &stride, &hi);
        if (type == HS_Q8_0) {
            const block_q8_0 *x = (const block_q8_0 *)src + b;
            for (int e = 0; e < HS_QK; e++)
                p[(e / 16) * hi + (size_t)(e % 16 / 4) * stride + e % 4] = (uint8_t)(x->qs[e] ^ 0x80);
            d[b] = x->d;
        } else {
            const uint8_t *q = type == HS_Q4_0 ? ((const block_q4_0 *)src + b)->qs
                                               : ((const block_q4_1 *)src + b)->qs;
            for (int k = 0; k < 4; k++) memcpy(p + (size_t)k * stride, q + 4 * k, 4);
            if (type == HS_Q4_0) {
                d[b] = ((const block_q4_0 *)src + b)->d;
            } else {
                d[b] = ((const block_q4_1 *)src + b)->d;
                m[b] = ((const block_q4_1 *)src + b)->m;
            }
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
        size_t stride, hi;
        const uint8_t *p = block_piece(qs, qbytes, nb, b, &stride, &hi);
        if (type == HS_Q8_0) {
            block_q8_0 *x = (block_q8_0 *)dst + b;
            for (int e = 0; e < HS_QK; e++)
                x->qs[e] = (int8_t)(p[(e / 16) * hi + (size_t)(e % 16 / 4) * stride + e % 4] ^ 0x80);
            x->d = d[b];
        } else if (type == HS_Q4_0) {
            block_q4_0 *x = (block_q4_0 *)dst + b;
            for (int k = 0; k < 4; k++) memcpy(x->qs + 4 * k, p + (size_t)k * stride, 4);
            x->d = d[b];
        } else {
            block_q4_1 *x = (block_q4_1 *)dst + b;
            for (int k = 0; k < 4; k++) memcpy(x->qs + 4 * k, p + (size_t)k * stride, 4);
            x->d = d[b];
            x->m = m[b];
        }
    }
}

enum { Q4_0, Q4_1, Q8_0 };

/* The most activation rows a register tile takes: 8 in the amx variant (its 1 x 8 tiles,
 * mm_cols 8), 4 elsewhere (avx512vnni's products take at most 4 a call). */
#ifdef HS_AMX
#define TILE_MAX_C 8
#else
#define TILE_MAX_C 4
#endif

/* Where a group's integer sums start: the unsigned weights' correction, -8 (q4_0) or -128
 * (q8_0: 16 x off4) times each block's activation sum; none for q4_1 (its minimum is a float
 * step). */
static inline __attribute__((always_inline)) __m512i start_offsets(const int kind,
                                                                   const act_group *g) {
    if (kind == Q4_1) return _mm512_setzero_si512();
    const __m512i off4 = _mm512_load_si512(g->off4);
    return kind == Q8_0 ? _mm512_slli_epi32(off4, 4) : off4;
}

/* The float part of a group of t blocks: per pair and lane (block) j,
 * acc = fma(cvt(s) * d_act, d_weight, acc), q4_1's acc = fma(m, d_act * sum, acc) after it;
 * lanes past t meet zero scales (masked loads, zero-padded activations) and add +0. */
static inline __attribute__((always_inline)) void scale_step(
    const int kind, const int R, const int C, int g, int t, int nb, const uint8_t *w,
    size_t wstride, const act_group *a, size_t astride, __m512i s[4][TILE_MAX_C],
    __m512 acc[4][TILE_MAX_C]) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const int ng = (nb + GROUP - 1) / GROUP;
    const __mmask16 dm = (__mmask16)((1u << t) - 1);
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + (size_t)r * wstride;
        const hs_fp16 *d = (const hs_fp16 *)(row + (size_t)nb * qbytes) + (size_t)g * GROUP;
        if (g % 2 == 0) { /* the scales' (and minimums') next line, as far ahead */
            _mm_prefetch((const char *)d + PREFETCH, PF_HINT);
            if (kind == Q4_1) _mm_prefetch((const char *)(d + nb) + PREFETCH, PF_HINT);
        }
        const __m512 dw = _mm512_cvtph_ps(t == GROUP ? _mm256_loadu_si256((const __m256i *)d)
                                                     : _mm256_maskz_loadu_epi16(dm, d));
        __m512 mw = _mm512_setzero_ps();
        if (kind == Q4_1)
            mw = _mm512_cvtph_ps(t == GROUP ? _mm256_loadu_si256((const __m256i *)(d + nb))
                                            : _mm256_maskz_loadu_epi16(dm, d + nb));
        for (int c = 0; c < C; c++) {
            const act_group *arow = (const act_group *)((const char *)a + (size_t)c * astride);
            if (REGTILE_SKIP & 1) {
                acc[r][c] = _mm512_castsi512_ps(
                    _mm512_add_epi32(_mm512_castps_si512(acc[r][c]), s[r][c]));
                continue;
            }
            acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[r][c]),
                                                      _mm512_load_ps(arow[g].d)),
                                        dw, acc[r][c]);
            if (kind == Q4_1)
                acc[r][c] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(act_sums(arow, ng, g)), acc[r][c]);
        }
    }
}

/* A chunk of a group of t blocks: whole groups load without a mask, a partial last group's
 * past its 4t bytes reads zeros. */
static inline __attribute__((always_inline)) __m512i load_chunk(const int t, __mmask64 qm, const uint8_t *p) {
    return t == GROUP ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(qm, p);
}

/* Chunk k of one weight row's group of t blocks (at q), as the two vectors vpdpbusd takes: q8_0's
 * low and high halves (elements 4k.. and 16 + 4k..), q4's low and high nibbles. */
static inline __attribute__((always_inline)) void weight_chunk(const int kind, const int t,
                                                               __mmask64 qm, const uint8_t *q,
                                                               int k, __m512i *wl, __m512i *wh) {
    if (kind == Q8_0) {
        const uint8_t *lo = q + q8_lo(t, k), *hi = lo + q8_hi(t);
        /* the stream runs ahead of the hardware prefetcher's reach between tiles */
        _mm_prefetch((const char *)lo + PREFETCH, PF_HINT);
        _mm_prefetch((const char *)hi + PREFETCH, PF_HINT);
        *wl = load_chunk(t, qm, lo);
        *wh = load_chunk(t, qm, hi);
    } else {
        const uint8_t *p = q + (size_t)k * 4 * t;
        if (k % PF_EVERY == 0) _mm_prefetch((const char *)p + PREFETCH, PF_HINT);
        const __m512i raw = load_chunk(t, qm, p), low4 = _mm512_set1_epi8(0x0f);
        *wl = _mm512_and_si512(raw, low4);
        *wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    }
}

/* One group of t blocks (t == GROUP, a constant, for all but a partial last group: whole groups
 * load without masks) of R weight rows x C activation rows into the tile's accumulators: chunk
 * by chunk, the C activation chunks loaded once for the R weight rows and each weight chunk
 * unpacked once for the C activation rows (the 16-block integer sums held in registers), then
 * per pair one convert, one multiply and one FMA (q4_1: a second FMA, its minimums). */
static inline __attribute__((always_inline)) void group_step(
    const int kind, const int R, const int C, int g, const int t, int nb, const uint8_t *w,
    size_t wstride, const act_group *a, size_t astride, __m512 acc[4][TILE_MAX_C]) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const __mmask64 qm = t == GROUP ? ~(__mmask64)0 : (((__mmask64)1 << (4 * t)) - 1);
    const act_group *y[TILE_MAX_C];
    for (int c = 0; c < C; c++)
        y[c] = (const act_group *)((const char *)a + (size_t)c * astride) + g;
    __m512i s[4][TILE_MAX_C];
    for (int c = 0; c < C; c++) {
        const __m512i off = start_offsets(kind, y[c]);
        for (int r = 0; r < R; r++) s[r][c] = off;
    }
    /* each weight row's chunk used as soon as it is loaded (fewer registers live). q4 in R x 2
     * and R x 1 tiles unpacked all R rows' chunks first until a model-level A/B
     * (cpu_engine_profile --baseline, 2-core VM, 5 processes per build) put this order level or
     * ahead: the 1.1B's prefill +8 %, SmolLM2 q4_0's batch 1 +7.5 % (its 4 x 1 tiles); level
     * on the AMX host (docs/benchmarks.md) */
    for (int k = 0; k < 4; k++) {
        if (C > 4) { /* 1 x 8 (TILES' only R for it): each weight chunk for all C rows, each
                      * activation chunk read where it is used (16 would not fit the registers) */
            for (int r = 0; r < R; r++) {
                __m512i wl, wh;
                weight_chunk(kind, t, qm, w + (size_t)r * wstride + (size_t)g * GROUP * qbytes,
                             k, &wl, &wh);
                for (int c = 0; c < C; c++)
                    s[r][c] = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(s[r][c], wl, _mm512_load_si512(y[c]->lo[k])), wh,
                        _mm512_load_si512(y[c]->hi[k]));
            }
            continue;
        }
        __m512i ylo[4], yhi[4];
        for (int c = 0; c < C; c++)
            ylo[c] = _mm512_load_si512(y[c]->lo[k]), yhi[c] = _mm512_load_si512(y[c]->hi[k]);
        for (int r = 0; r < R; r++) {
            __m512i wl, wh;
            weight_chunk(kind, t, qm, w + (size_t)r * wstride + (size_t)g * GROUP * qbytes, k,
                         &wl, &wh);
            for (int c = 0; c < C; c++)
                s[r][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s[r][c], wl, ylo[c]), wh,
                                              yhi[c]);
        }
    }
    scale_step(kind, R, C, g, t, nb, w, wstride, a, astride, s, acc);
}

/* A partial last group of at most 4 blocks: its weight chunks lie together (16t bytes for q4,
 * the 16t of elements 0..15 then the 16t of 16..31 for q8_0) and are read as one vector whose
 * lane kt + j holds chunk k of block j; the activations' tail copy (act_tail) matches it. Two
 * vpdpbusd, then the four lanes of each block are added (exact integers, any order) into lane j:
 * the same sums as group_step's, for a quarter of its vpdpbusd. Lanes past t hold partial sums
 * that meet zero scales. */
static inline __attribute__((always_inline)) void tail_step(
    const int kind, const int R, const int C, int g, int t, int nb, const uint8_t *w,
    size_t wstride, const act_group *a, size_t astride, __m512 acc[4][TILE_MAX_C]) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const int ng = (nb + GROUP - 1) / GROUP;
    const __m512i low4 = _mm512_set1_epi8(0x0f), lane = _mm512_setr_epi32(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i down2 = _mm512_add_epi32(lane, _mm512_set1_epi32(2 * t)),
                  down1 = _mm512_add_epi32(lane, _mm512_set1_epi32(t)); /* (mod 16) */
    const __mmask64 qm = t == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * t)) - 1);
    __m512i wl[4], wh[4], s[4][TILE_MAX_C];
    for (int r = 0; r < R; r++) {
        const uint8_t *q = w + (size_t)r * wstride + (size_t)g * GROUP * qbytes;
        _mm_prefetch((const char *)q + PREFETCH, PF_HINT); /* as group_step's (a row's last lines) */
        if (kind == Q8_0) _mm_prefetch((const char *)q + PREFETCH + 64, PF_HINT);
        if (kind == Q8_0) {
            wl[r] = _mm512_maskz_loadu_epi8(qm, q);
            wh[r] = _mm512_maskz_loadu_epi8(qm, q + (size_t)16 * t);
        } else {
            const __m512i raw = _mm512_maskz_loadu_epi8(qm, q);
            wl[r] = _mm512_and_si512(raw, low4);
            wh[r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
    }
    for (int c = 0; c < C; c++) {
        const act_group *arow = (const act_group *)((const char *)a + (size_t)c * astride);
        const int8_t *tail = act_tail(arow, ng);
        const __m512i ylo = _mm512_load_si512(tail), yhi = _mm512_load_si512(tail + 64);
        const __m512i off = start_offsets(kind, &arow[g]);
        for (int r = 0; r < R; r++) {
            __m512i v = _mm512_dpbusd_epi32(off, wl[r], ylo);
            v = _mm512_dpbusd_epi32(v, wh[r], yhi);
            v = _mm512_add_epi32(v, _mm512_permutexvar_epi32(down2, v)); /* chunks k and k + 2 */
            s[r][c] = _mm512_add_epi32(v, _mm512_permutexvar_epi32(down1, v)); /* then k + 1 */
        }
    }
    scale_step(kind, R, C, g, t, nb, w, wstride, a, astride, s, acc);
}

/* The sums of 8 vectors at once, each by _mm512_reduce_add_ps's own tree (GCC's: lane i + lane
 * i + 8, then i + 4, then (0 + 2) + (1 + 3)), so the same bits for under half the operations:
 * v[r + 4c] sums into lane 4c + r of the result (r < 4, c < 2). Its first step written apart:
 * lo[i] and hi[i] hold v[2i]'s and v[2i + 1]'s lanes 0..7 and 8..15 (lo[i]'s lanes 0..7 are
 * v[2i]'s 0..7, its 8..15 v[2i + 1]'s 0..7), which tail2_2x4 finishes first. */
static inline void reduce8x16_halves(const __m512 v[8], __m512 lo[4], __m512 hi[4]) {
    for (int i = 0; i < 4; i++) {
        lo[i] = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44);
        hi[i] = _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee);
    }
}
static inline __m256 reduce8x16_rest(const __m512 lo[4], const __m512 hi[4]) {
    __m512 h[4], q[2];
    for (int i = 0; i < 4; i++) h[i] = _mm512_add_ps(lo[i], hi[i]);
    for (int i = 0; i < 2; i++)
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xdd));
    const __m512 p = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], 0x44),
                                   _mm512_shuffle_ps(q[0], q[1], 0xee));
    /* lane 4a + b (b < 2) now holds v[a + 4b] */
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(p, p, 0x88), _mm512_shuffle_ps(p, p, 0xdd));
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), sums));
}
static inline __m256 reduce8x16(const __m512 v[8]) {
    __m512 lo[4], hi[4];
    reduce8x16_halves(v, lo, hi);
    return reduce8x16_rest(lo, hi);
}

/* p[0], p[1] in every pair of lanes (one broadcast load; memcpy: p is a float array) */
static inline __m512 pair_everywhere(const float *p) {
    double two;
    memcpy(&two, p, sizeof two);
    return _mm512_castpd_ps(_mm512_set1_pd(two));
}

/* A partial last group of 2 blocks (SmolLM2's 576-column rows: 16 + 2) in a 2 x 4 tile, the 8
 * pairs at once: the integer sums before the row's groups (tail2_2x4_sums), the float step
 * after the first step of the tile's sums (tail2_2x4_scale). tail_step spends per pair two
 * vpdpbusd, two permutes, two adds and a whole 512-bit scaling step on 2 lanes: on the 2-core
 * Zen 4 a 576-column q8_0 product (16 activation rows, in cache: tests/bench/amx_products.c)
 * took 0.31-0.36 ms with it, 0.22 with the tail left out (wrong sums), and 0.33 with a 256-bit
 * form of tail_step whose float step ran on 128 bits; with this, in its own tile body (tile),
 * 0.28 (q4_0 0.27-0.29 against 0.32-0.34). Here:
 * - Integers: a weight row's 64 bytes of the tail (q8_0: elements 0..15 of both blocks, then
 *   16..31; q4: the 32 bytes unpacked into low nibbles, high nibbles) are one vector whose lane
 *   l holds a chunk of block l % 2, as is an activation row's (act_tail's two halves); one
 *   vpdpbusd a pair (started at the activation row's offsets, lanes 0 and 1), then the 8 pairs'
 *   16-lane vectors are added down together, three steps of two shuffles and an add on two
 *   vectors at a time, into one vector: lane 4q + 2h + j holds pair q + 4h's block j (exact
 *   integers, any order).
 * - Floats, the same operations on the same lanes as scale_step's (convert, multiply by the
 *   activation scale, FMA with the weight scale into the accumulator; q4_1's minimum FMA after
 *   it): applied to reduce8x16's first step, lo[i], whose lanes 0, 1 and 8, 9 are the
 *   accumulators' lanes 0, 1 of pairs 2i and 2i + 1 (weight rows 0 and 1 of activation row i)
 *   before they are added to anything, with a mask: the other lanes are untouched, as the
 *   zero scales past t leave them in scale_step. */
static inline __attribute__((always_inline)) __m512 tail2_2x4_sums(
    const int kind, int g, int nb, const uint8_t *w, size_t wstride, const act_group *a,
    size_t astride) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const int ng = (nb + GROUP - 1) / GROUP;
    __m512i wv[2];
    for (int r = 0; r < 2; r++) {
        const uint8_t *row = w + (size_t)r * wstride, *q = row + (size_t)g * GROUP * qbytes;
        _mm_prefetch((const char *)q + PREFETCH, PF_HINT); /* as tail_step's */
        if (kind == Q8_0) {
            _mm_prefetch((const char *)q + PREFETCH + 64, PF_HINT);
            wv[r] = _mm512_loadu_si512(q);
        } else { /* the 32 bytes twice: low nibbles in lanes 0..7, high ones in 8..15 */
            const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q)),
                          shift = _mm512_inserti64x4(_mm512_setzero_si512(),
                                                     _mm256_set1_epi16(4), 1);
            wv[r] = _mm512_and_si512(_mm512_srlv_epi16(raw, shift), _mm512_set1_epi8(0x0f));
        }
    }
    __m512i v[8]; /* pair r + 2c */
    for (int c = 0; c < 4; c++) {
        const act_group *arow = (const act_group *)((const char *)a + (size_t)c * astride);
        const int8_t *tail = act_tail(arow, ng);
        const __m512i y = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_load_si256((const __m256i *)tail)),
            _mm256_load_si256((const __m256i *)(tail + 64)), 1);
        const __m512i off = start_offsets(kind, &arow[g]);
        for (int r = 0; r < 2; r++) v[r + 2 * c] = _mm512_dpbusd_epi32(off, wv[r], y);
    }
    __m512i h[4], x[2];
    for (int i = 0; i < 4; i++) /* pair 2i in 128-bit blocks 0, 1, pair 2i + 1 in 2, 3 */
        h[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0x44),
                                _mm512_shuffle_i32x4(v[2 * i], v[2 * i + 1], 0xee));
    for (int m = 0; m < 2; m++) /* pair 4m + b in block b */
        x[m] = _mm512_add_epi32(_mm512_shuffle_i32x4(h[2 * m], h[2 * m + 1], 0x88),
                                _mm512_shuffle_i32x4(h[2 * m], h[2 * m + 1], 0xdd));
    /* lane 4q + 2h + j: pair q + 4h, block j */
    return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_unpacklo_epi64(x[0], x[1]),
                                               _mm512_unpackhi_epi64(x[0], x[1])));
}
static inline __attribute__((always_inline)) void tail2_2x4_scale(
    const int kind, int g, int nb, const uint8_t *w, size_t wstride, const act_group *a,
    size_t astride, const __m512 f, __m512 lo[4]) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const int ng = (nb + GROUP - 1) / GROUP;
    __m256i dw16 = _mm256_setzero_si256(), mw16 = _mm256_setzero_si256();
    for (int r = 0; r < 2; r++) { /* the two scales in lanes 8r, 8r + 1 (q4_1's minimums alike) */
        const hs_fp16 *d = (const hs_fp16 *)(w + (size_t)r * wstride + (size_t)nb * qbytes) +
                           (size_t)g * GROUP;
        dw16 = _mm256_mask_loadu_epi16(dw16, (__mmask16)(3u << 8 * r), d - 8 * r);
        if (kind == Q4_1)
            mw16 = _mm256_mask_loadu_epi16(mw16, (__mmask16)(3u << 8 * r), d + nb - 8 * r);
    }
    const __m512 dw = _mm512_cvtph_ps(dw16);
    const __m512 mw = kind == Q4_1 ? _mm512_cvtph_ps(mw16) : _mm512_setzero_ps();
    const __mmask16 lanes = 0x0303;
    for (int i = 0; i < 4; i++) {
        /* pair 2i (f's lanes 4q + 2h + j, q = 2i % 4, h = 2i / 4) into lanes 0, 1, pair
         * 2i + 1 (q + 1: 4 lanes on) into 8, 9 */
        const int p0 = 4 * (2 * i % 4) + 2 * (2 * i / 4);
        const __m512 prod = _mm512_permutexvar_ps(
            _mm512_setr_epi32(p0, p0 + 1, 0, 0, 0, 0, 0, 0, p0 + 4, p0 + 5, 0, 0, 0, 0, 0, 0), f);
        const act_group *arow = (const act_group *)((const char *)a + (size_t)i * astride);
        const __m512 da = pair_everywhere(arow[g].d);
        lo[i] = _mm512_mask3_fmadd_ps(_mm512_mul_ps(prod, da), dw, lo[i], lanes);
        if (kind == Q4_1) {
            const __m512 sums = pair_everywhere(act_sums(arow, ng, g));
            lo[i] = _mm512_mask3_fmadd_ps(mw, sums, lo[i], lanes);
        }
    }
}

/* Groups g0..g1 - 1 of R weight rows x C activation rows into acc (the row's partial last
 * group where g1 is its group count); all but g0, g1 constants after inlining. Per group of 16
 * blocks and pair: eight vpdpbusd, one convert, one multiply, one FMA. */
static inline __attribute__((always_inline)) void tile_groups(
    const int kind, const int R, const int C, int g0, int g1, int nb, const uint8_t *w,
    size_t wstride, const act_group *a, size_t astride, __m512 acc[4][TILE_MAX_C]) {
    const int ng = (nb + GROUP - 1) / GROUP, full = nb / GROUP;
    for (int g = g0; g < (g1 < full ? g1 : full); g++)
        group_step(kind, R, C, g, GROUP, nb, w, wstride, a, astride, acc);
    if (g1 < ng || full == ng) return;
    if (nb - full * GROUP <= 4)
        tail_step(kind, R, C, full, nb - full * GROUP, nb, w, wstride, a, astride, acc);
    else
        group_step(kind, R, C, full, nb - full * GROUP, nb, w, wstride, a, astride, acc);
}

/* How a row's partial last group is taken (tile_body's TK): a 2 x 4 tile's 2 blocks by
 * tail2_2x4; any other by tail_step (at most 4 blocks) or group_step with masks, if there is
 * one. */
enum { TAIL_PACKED, TAIL_OTHER };

/* R weight rows x C activation rows, all constants after inlining, TK the row's kind of partial
 * last group. Per group of 16 blocks and pair: eight vpdpbusd, one convert, one multiply, one
 * FMA. (tile_groups over 0..ng in effect; written out because calling it changes GCC 12's
 * avx512vnni code, which the VM's figures measured.) */
static inline __attribute__((always_inline)) void tile_body(
    const int kind, const int R, const int C, const int TK, int nb, const uint8_t *w,
    size_t wstride, const act_group *a, size_t astride, float *out, size_t ostride) {
    __m512 acc[4][TILE_MAX_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    const int full = nb / GROUP, t = nb - full * GROUP;
    /* a 2 x 4 tile's 2-block tail: its integer sums before the groups, its float step after
     * the first step of the sums (tail2_2x4_sums, tail2_2x4_scale) */
    __m512 tail_sums = _mm512_setzero_ps();
    if (TK == TAIL_PACKED) tail_sums = tail2_2x4_sums(kind, full, nb, w, wstride, a, astride);
    for (int g = 0; g < full; g++)
        group_step(kind, R, C, g, GROUP, nb, w, wstride, a, astride, acc);
    if (TK == TAIL_OTHER && t > 0 && t <= 4)
        tail_step(kind, R, C, full, t, nb, w, wstride, a, astride, acc);
    else if (TK == TAIL_OTHER && t > 0)
        group_step(kind, R, C, full, t, nb, w, wstride, a, astride, acc);
    if (R * C == 8) { /* 4 x 2 or 2 x 4: lane r + R c of the sums holds pair (r, c) */
        __m512 v[8], lo[4], hi[4];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) v[r + R * c] = acc[r][c];
        reduce8x16_halves(v, lo, hi);
        if (TK == TAIL_PACKED)
            tail2_2x4_scale(kind, full, nb, w, wstride, a, astride, tail_sums, lo);
        const __m256 sums = reduce8x16_rest(lo, hi);
        if (R == 4) {
            _mm_storeu_ps(out, _mm256_castps256_ps128(sums));
            _mm_storeu_ps(out + ostride, _mm256_extractf128_ps(sums, 1));
        } else {
            const __m128 lo = _mm256_castps256_ps128(sums), hi = _mm256_extractf128_ps(sums, 1);
            _mm_storel_pi((__m64 *)out, lo);
            _mm_storeh_pi((__m64 *)(out + ostride), lo);
            _mm_storel_pi((__m64 *)(out + 2 * ostride), hi);
            _mm_storeh_pi((__m64 *)(out + 3 * ostride), hi);
        }
        return;
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[(size_t)c * ostride + r] = _mm512_reduce_add_ps(acc[r][c]);
}

/* tile_body with a 2 x 4 tile's 2-block tail (tail2_2x4) in a body of its own, so that GCC
 * allocates its registers for that tail alone: in the body with tail_step and the masked group
 * it kept the accumulators on the stack through the groups. One 2 x 4 tile of 576 q8_0 columns
 * over and over in L1 (2-core Zen 4, best of 7 processes, tests/bench/tile_in_l1.sh): 45.7 ns
 * with tail_step, 39.1 like this, 33 with no tail at all. Every other row keeps the one body
 * with the other tails: a body for rows without a tail too made 512-column tiles 7 % faster but
 * those of 17, 19, 20 and 23 blocks 13-20 % slower. */
static inline __attribute__((always_inline)) void tile(const int kind, const int R, const int C,
                                                       int nb, const uint8_t *w, size_t wstride,
                                                       const act_group *a, size_t astride,
                                                       float *out, size_t ostride) {
    const int t = nb % GROUP;
    if (R == 2 && C == 4 && t == 2)
        tile_body(kind, R, C, TAIL_PACKED, nb, w, wstride, a, astride, out, ostride);
    else
        tile_body(kind, R, C, TAIL_OTHER, nb, w, wstride, a, astride, out, ostride);
}

#ifndef TILE_1X8_GROUPS
#define TILE_1X8_GROUPS 4
#endif
/* nrows (at most 4) weight rows x 8 activation rows in 1 x 8 tiles, the row cut into spans of
 * TILE_1X8_GROUPS groups: each span's eight activation chunks (40 bytes a block each, q4_1 44)
 * stay in L1 while every weight row meets them, the accumulators kept between spans (the
 * same groups in the same order: the same bits as whole rows). */
static inline __attribute__((always_inline)) void tiles_1x8(const int kind, int nb,
                                                            const uint8_t *w, size_t wstride,
                                                            int nrows, const act_group *a,
                                                            size_t astride, float *out,
                                                            size_t ostride) {
    const int ng = (nb + GROUP - 1) / GROUP;
    __m512 acc[4][TILE_MAX_C];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < TILE_MAX_C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int g0 = 0; g0 < ng; g0 += TILE_1X8_GROUPS) {
        const int g1 = ng - g0 < TILE_1X8_GROUPS ? ng : g0 + TILE_1X8_GROUPS;
        for (int r = 0; r < nrows; r++)
            tile_groups(kind, 1, TILE_MAX_C, g0, g1, nb, w + (size_t)r * wstride, wstride, a,
                        astride, acc + r);
    }
    for (int r = 0; r < nrows; r++) { /* lane c of the sums holds activation row c's */
        _Alignas(32) float lane[8];
        _mm256_store_ps(lane, reduce8x16(acc[r]));
        for (int c = 0; c < 8; c++) out[(size_t)c * ostride + r] = lane[c];
    }
}

/* Up to 4 weight rows x 8 activation rows a call (mm_cols: 8 in the amx variant, 4 in
 * avx512vnni, whose callers pass at most 4). Eight activation rows on rows of TILE_1X8_FROM
 * blocks or more take 1 x 8 tiles (tiles_1x8: spans of 64 blocks), each weight chunk unpacked
 * once for all eight and the eight rows' chunks read from L1 (a span's are 20-22 KiB); other
 * rows, and 5-7 activation rows, four and then the rest. On the AMX host (one-host A/Bs,
 * docs/benchmarks.md, the sessions of 2026-11-28) whole-row 1 x 8 tiles made the 8B's
 * 128-block gate/up phase 11 % faster at 8 sequences on one machine and 10 % slower on
 * another, the 1.1B's 64-block one 8 % faster, its 176-block down projection 15 % slower; in
 * spans of 64 blocks, against 2 x 4 tiles, 8 sequences ran 12 % (8B q4_0) and 5 % (1.1B)
 * faster, 12 sequences 8 % (1.1B), the down projections 16 % (448 blocks) and 4 % (176)
 * faster; spans of 32 blocks were 2-11 % slower than spans of 64. Rows under 64 blocks were
 * not measured on the host (on the VM's Zen 4, 1 x 8 made a 48-block down projection 14-33 %
 * slower), so they keep 2 x 4. Eight pairs at most fit the 32 registers (each holds an integer
 * sum and an accumulator through a group). Narrow rows (under
 * HS_WIDE_ROW_BLOCKS, the line of model.c's tile_rows) with 4 activation rows take 2 x 4
 * tiles, each weight chunk unpacked once serving four activation rows and each activation chunk
 * loaded once two weight rows; the rest 4 x 2 (R x 1 for one token). Same bits either way. On
 * the 2-core VM the 2 x 4 tiles (with q8_0's chunks used as loaded) made SmolLM2's 576-column
 * phases up to 20 % faster in the model (q4_0: 10-20 % at 512- and 2048-token prefill, level at
 * 256; q8_0 14-20 %), but wider rows slower: its 1536-column down projection 16-26 %, the
 * 1.1B's prefill and 16-sequence decode 13-15 %
 * (cpu_engine_profile --baseline, docs/benchmarks.md, fifth round). The amx variant (Intel
 * hosts) takes 2 x 4 tiles at every width instead: on the 16-core AMX host, where 16 activation
 * rows or more go to the tile unit, they made 8 sequences 7 % (8B q4_0) and 9 % (1.1B) faster,
 * 4 sequences level (+4 %, -2 %), batch 1 untouched (docs/benchmarks.md, the third session
 * of 2026-11-28). TILE_2X4_BELOW: the rows (in blocks) under which 2 x 4 tiles are taken. */
#ifndef TILE_2X4_BELOW
#ifdef HS_AMX
#define TILE_2X4_BELOW INT_MAX
#else
#define TILE_2X4_BELOW HS_WIDE_ROW_BLOCKS
#endif
#endif
#ifndef TILE_1X8_FROM
#define TILE_1X8_FROM 64
#endif
#define TILE_COLS(KIND, R)                                                                      \
    switch (ncols) {                                                                           \
    case 1: tile(KIND, R, 1, nb, w, wstride, y, astride, out, ostride); return;                     \
    case 2: tile(KIND, R, 2, nb, w, wstride, y, astride, out, ostride); return;                     \
    case 3:                                                                                    \
        tile(KIND, R, 2, nb, w, wstride, y, astride, out, ostride);                                 \
        tile(KIND, R, 1, nb, w, wstride, (const act_group *)((const char *)y + 2 * astride),    \
             astride, out + 2 * ostride, ostride);                                             \
        return;                                                                                \
    default:                                                                                   \
        if ((R == 4 || R == 2) && nb < TILE_2X4_BELOW) {                                       \
            tile(KIND, 2, 4, nb, w, wstride, y, astride, out, ostride);                        \
            if (R == 4)                                                                        \
                tile(KIND, 2, 4, nb, w + 2 * wstride, wstride, y, astride, out + 2, ostride);  \
            return;                                                                            \
        }                                                                                      \
        tile(KIND, R, 2, nb, w, wstride, y, astride, out, ostride);                                 \
        tile(KIND, R, 2, nb, w, wstride, (const act_group *)((const char *)y + 2 * astride),    \
             astride, out + 2 * ostride, ostride);                                             \
        return;                                                                                \
    }

#define TILES(KIND, NAME)                                                                       \
    static void NAME(int nb, const void *w, size_t wstride, int nrows, const void *a,          \
                     size_t astride, int ncols, float *out, size_t ostride) {                  \
        const act_group *y = a;                                                                \
        if (TILE_MAX_C == 8 && ncols == 8 && nb >= TILE_1X8_FROM) {                            \
            tiles_1x8(KIND, nb, w, wstride, nrows, y, astride, out, ostride);                  \
            return;                                                                            \
        }                                                                                      \
        if (TILE_MAX_C > 4 && ncols > 4) { /* 5-7, or 8 on narrower rows: 4, the rest */       \
            NAME(nb, w, wstride, nrows, a, astride, 4, out, ostride);                          \
            NAME(nb, w, wstride, nrows, (const char *)a + 4 * astride, astride, ncols - 4,     \
                 out + 4 * ostride, ostride);                                                  \
            return;                                                                            \
        }                                                                                      \
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
    .attend_f16 = attend_f16_rows, .swiglu = swiglu,                                             \
    .act_bytes = act_bytes, .quantize_act = quantize_packed,                                     \
    .pack_row = pack_row, .unpack_row = unpack_row, .mm_q4_0 = mm_q4_0, .mm_q4_1 = mm_q4_1,     \
    .mm_q8_0 = mm_q8_0

#ifndef HS_AMX
static const hs_kernels table = {.name = "avx512vnni", AVX512_KERNELS, HS_ROWS_KERNELS};

const hs_kernels *hs_kernels_avx512(void) { return &table; }
#endif
