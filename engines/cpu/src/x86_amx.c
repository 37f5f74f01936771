/* AVX-512 VNNI + AMX-INT8 (Sapphire Rapids and later): the avx512vnni variant - same packed
 * weights and activations, same 4x4 register tiles for small batches - with batched products of
 * 16 or more activation rows on the tile unit.
 *
 * One `tdpbusd` multiplies 16 weight rows by 16 activation rows over a block of 32 elements (u8 x
 * s8 into int32); the 16 x 16 result is scaled per block on the vector unit (offset correction,
 * convert, weight x activation scale, FMA) into float accumulators, while the tile unit already
 * multiplies the next block (two C tiles alternate). Weights: each block of a 16-row strip is
 * copied into a 16 x 32 scratch tile first (q4_0/q4_1 nibbles unpacked, q8_0's packed halves
 * joined). Activations: each block's 16 columns are gathered once per call into the tile layout
 * (four int8 per int32 lane, one lane per column), with each column's scale and offset
 * correction. */
#define HS_AMX 1
#include "x86_avx512.c"

#include <stdlib.h>

#define AMX_N 16 /* activation rows (columns of the tile) */
#define AMX_M 16 /* weight rows */

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* One block of 16 activation rows in tile layout. */
typedef struct {
    int32_t lo[4][16];   /* with hi, the 8-row B tile: row k holds elements 4k..4k+3 of each column */
    int32_t hi[4][16];   /* elements 16..31 */
    float d[16];         /* each column's block scale */
    int32_t off[16];     /* offset correction: -8 (q4_0) or -128 (q8_0) x the block's sum */
    float s[16];         /* d x sum (q4_1's minimum term) */
} amx_block;

/* Tiles 0, 1: C (16 x 16 int32) of even and odd blocks; 2, 3: their weights (16 rows x 32 u8:
 * the block's elements 0..15 then 16..31); 4, 5: their activations (8 rows x 16 columns x 4). Two
 * blocks in flight: the tile unit multiplies one while the vector unit scales the other. */
static void configure_tiles(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) {
        c.rows[t] = AMX_M; c.colsb[t] = AMX_N * 4;
        c.rows[2 + t] = AMX_M; c.colsb[2 + t] = HS_QK;
        c.rows[4 + t] = HS_QK / 4; c.colsb[4 + t] = AMX_N * 4;
    }
    _tile_loadconfig(&c);
}

/* The blocks of AMX_N activation rows, gathered into tile layout. */
static void gather_blocks(int kind, int nb, const char *a, size_t astride, amx_block *out) {
    const int ng = (nb + GROUP - 1) / GROUP;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                              12, 13, 14, 15),
                                            _mm512_set1_epi32((int)astride));
    for (int b = 0; b < nb; b++) {
        const int g = b / GROUP, j = b % GROUP;
        const char *base = a + (size_t)g * sizeof(act_group);
        amx_block *o = out + b;
        for (int k = 0; k < 4; k++) {
            _mm512_store_si512(o->lo[k], _mm512_i32gather_epi32(rows, base + offsetof(act_group, lo) + 16 * j + 4 * k, 1));
            _mm512_store_si512(o->hi[k], _mm512_i32gather_epi32(rows, base + offsetof(act_group, hi) + 16 * j + 4 * k, 1));
        }
        _mm512_store_ps(o->d, _mm512_i32gather_ps(rows, base + offsetof(act_group, d) + 16 * j, 1));
        __m512i off = _mm512_setzero_si512();
        for (int l = 0; l < 4; l++) /* off4 holds -8 x each lane's sum; a block has four lanes */
            off = _mm512_add_epi32(off, _mm512_i32gather_epi32(rows, base + offsetof(act_group, off4) + 4 * (4 * j + l), 1));
        if (kind == Q8_0) off = _mm512_slli_epi32(off, 4);
        _mm512_store_si512(o->off, kind == Q4_1 ? _mm512_setzero_si512() : off);
        const char *sums = (const char *)act_sums((const act_group *)a, ng, g) + 4 * j;
        _mm512_store_ps(o->s, _mm512_i32gather_ps(rows, sums, 1));
    }
}

/* Block b of the strip's 16 weight rows as a 16 x 32 u8 tile (elements 0..15, then 16..31). */
static inline void block_rows(int kind, const uint8_t *w, size_t wstride, int rows, int nb, int b,
                              uint8_t *a) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    /* qword order [row0 lo, row0 hi, row1 lo, row1 hi] from 4 rows' lo and hi halves */
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const int g = b / GROUP, j = b % GROUP, t = nb - g * GROUP < GROUP ? nb - g * GROUP : GROUP;
    for (int r = 0; r < AMX_M; r += 4) {
        const uint8_t *q[4];
        for (int i = 0; i < 4; i++) /* rows past the end repeat the first: computed, dropped */
            q[i] = w + (size_t)(r + i < rows ? r + i : 0) * wstride;
        __m512i lo, hi;
        if (kind == Q8_0) { /* packed halves, already unsigned */
            const size_t at = (size_t)g * GROUP * 32 + (size_t)j * 16, at_hi = at + (size_t)t * 16;
            lo = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q[0] + at)));
            hi = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q[0] + at_hi)));
            for (int i = 1; i < 4; i++) {
                lo = _mm512_inserti32x4(lo, _mm_loadu_si128((const __m128i *)(q[i] + at)), i);
                hi = _mm512_inserti32x4(hi, _mm_loadu_si128((const __m128i *)(q[i] + at_hi)), i);
            }
        } else {
            const size_t at = (size_t)b * 16;
            __m512i raw = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q[0] + at)));
            for (int i = 1; i < 4; i++)
                raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(q[i] + at)), i);
            lo = _mm512_and_si512(raw, low4);
            hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
        _mm512_store_si512(a + r * 32, _mm512_permutex2var_epi64(lo, first, hi));
        _mm512_store_si512(a + r * 32 + 64, _mm512_permutex2var_epi64(lo, second, hi));
    }
}

/* Multiplies block b into tile C (TC), with its weights in tile TA and activations in TB. */
#define ISSUE(TC, TA, TB, b, scratch)                                                           \
    do {                                                                                       \
        block_rows(kind, w, wstride, rows, nb, (b), (scratch));                                \
        _tile_loadd(TA, (scratch), HS_QK);                                                     \
        _tile_loadd(TB, y[(b)].lo, AMX_N * 4);                                                 \
        _tile_zero(TC);                                                                        \
        _tile_dpbusd(TC, TA, TB);                                                              \
    } while (0)

/* 16 weight rows (fewer at the end: `rows`) x AMX_N activation rows over all blocks. */
static inline __attribute__((always_inline)) void strip(int kind, int nb, const uint8_t *w,
                                                        size_t wstride, int rows,
                                                        const amx_block *y, float *out,
                                                        size_t ostride) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    __m512 acc[AMX_M];
    for (int r = 0; r < AMX_M; r++) acc[r] = _mm512_setzero_ps();
    _Alignas(64) int32_t c[AMX_M][AMX_N];
    _Alignas(64) uint8_t a0[AMX_M * HS_QK], a1[AMX_M * HS_QK];
    _Alignas(64) float dw[AMX_M], mw[AMX_M];
    /* byte offsets of the strip's rows; rows past the end read the first (results dropped) */
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i index = _mm512_maskz_mullo_epi32(_mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(rows)),
                                                   lane, _mm512_set1_epi32((int)wstride));
#define DRAIN(TC, b)                                                                            \
    do {                                                                                       \
        _tile_stored(TC, c, AMX_N * 4);                                                        \
        const uint8_t *scales = w + (size_t)nb * qbytes + 2 * (size_t)(b);                     \
        _mm512_store_ps(dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(                              \
                                _mm512_i32gather_epi32(index, scales, 1))));                    \
        if (kind == Q4_1)                                                                      \
            _mm512_store_ps(mw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(                          \
                                    _mm512_i32gather_epi32(index, scales + 2 * (size_t)nb, 1)))); \
        const __m512 yd = _mm512_load_ps(y[(b)].d), ys = _mm512_load_ps(y[(b)].s);             \
        const __m512i off = _mm512_load_si512(y[(b)].off);                                     \
        for (int r = 0; r < AMX_M; r++) {                                                      \
            const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512(c[r]), off)); \
            acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(yd, _mm512_set1_ps(dw[r])), acc[r]);     \
            if (kind == Q4_1) acc[r] = _mm512_fmadd_ps(ys, _mm512_set1_ps(mw[r]), acc[r]);     \
        }                                                                                      \
    } while (0)
    ISSUE(0, 2, 4, 0, a0);
    for (int b = 0; b < nb; b += 2) {
        if (b + 1 < nb) ISSUE(1, 3, 5, b + 1, a1);
        DRAIN(0, b);
        if (b + 2 < nb) ISSUE(0, 2, 4, b + 2, a0);
        if (b + 1 < nb) DRAIN(1, b + 1);
    }
#undef DRAIN
    for (int r = 0; r < rows; r++) {
        _Alignas(64) float v[AMX_N];
        _mm512_store_ps(v, acc[r]);
        for (int n = 0; n < AMX_N; n++) out[(size_t)n * ostride + r] = v[n];
    }
}

/* Per-thread scratch for the gathered activation blocks (pool threads live as long as the
 * process; the buffer grows to the widest input seen). */
static __thread amx_block *scratch;
static __thread size_t scratch_blocks;

static inline __attribute__((always_inline)) int wide(int kind, int nb, const void *w,
                                                      size_t wstride, int nrows, const void *a,
                                                      size_t astride, int ncols, float *out,
                                                      size_t ostride) {
    const int done = ncols / AMX_N * AMX_N;
    if (!done) return 0;
    if ((size_t)nb > scratch_blocks) {
        free(scratch);
        if (posix_memalign((void **)&scratch, 64, sizeof(amx_block) * (size_t)nb) != 0) {
            scratch = NULL;
            scratch_blocks = 0;
            return 0;
        }
        scratch_blocks = (size_t)nb;
    }
    configure_tiles();
    for (int c0 = 0; c0 < done; c0 += AMX_N) {
        gather_blocks(kind, nb, (const char *)a + (size_t)c0 * astride, astride, scratch);
        for (int r = 0; r < nrows; r += AMX_M) {
            const uint8_t *rows = (const uint8_t *)w + (size_t)r * wstride;
            _mm_prefetch((const char *)rows + AMX_M * wstride, PF_HINT);
            strip(kind, nb, rows, wstride, nrows - r < AMX_M ? nrows - r : AMX_M, scratch,
                  out + (size_t)c0 * ostride + r, ostride);
        }
    }
    _tile_release();
    return done;
}

static int wide_q4_0(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,
                     int ncols, float *out, size_t os) {
    return wide(Q4_0, nb, w, ws, nrows, a, as, ncols, out, os);
}
static int wide_q4_1(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,
                     int ncols, float *out, size_t os) {
    return wide(Q4_1, nb, w, ws, nrows, a, as, ncols, out, os);
}
static int wide_q8_0(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,
                     int ncols, float *out, size_t os) {
    return wide(Q8_0, nb, w, ws, nrows, a, as, ncols, out, os);
}

static const hs_kernels table = {
    .name = "amx",
    AVX512_KERNELS,
    .wide_q4_0 = wide_q4_0,
    .wide_q4_1 = wide_q4_1,
    .wide_q8_0 = wide_q8_0,
};

const hs_kernels *hs_kernels_amx(void) { return &table; }
