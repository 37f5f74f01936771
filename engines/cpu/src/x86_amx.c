/* AVX-512 VNNI + AMX (Sapphire Rapids and later): the avx512vnni variant - same packed weights
 * and activations, same register tiles for one to a few activation rows - with the products
 * of more activation rows on the tile unit, two ways (model.c picks by the number of rows):
 *
 * int8 (wide8_*, from HS_WIDE8_MIN rows): one tdpbssd multiplies 16 weight rows by 16 activation
 * rows over a block of 32 elements (s8 x s8 into int32); a q4_0/q8_0 weight has a scale per
 * block, so the 16 x 16 result leaves the tile after every block to be scaled on the vector unit
 * (convert, weight x activation scale, FMA) into float accumulators, while the tile unit
 * multiplies the next block (two C tiles alternate). Weights: each block of a 16-row strip is
 * copied into a 16 x 32 scratch tile first, signed (q4_0's nibbles - 8, q4's looked up in a
 * byte table by vpermb, AVX512-VBMI; q8_0's packed halves joined and their + 128 taken off,
 * q4_1's nibbles as they are), and each group of 16 blocks'
 * scales of the 16 rows converted once, when its quants are; activations: each block's 16
 * columns gathered once per call into the tile layout, every group of 16 before the first
 * strip, so that a strip meets them all while in cache. The integer sums are the same as u8
 * weights' with the activation sums' offset taken off after (tdpbusd, which this used before),
 * so the results have the same bits; without that add and the weight scales' 16-row gather per
 * block, the 1.1B's 32-sequence decode step ran 12-22 % faster on the 16-core host, the 8B
 * q4_0's 18 % (docs/benchmarks.md, the sixth session of 2026-11-28).
 * Measured on the 16-core host (tests/bench/amx_products.sh, before the three-deep pipeline in
 * strip): 110-160 ns a block and thread, in cache or not, against about 100 vector operations
 * (30-50 ns) of unpacking and scaling - the blocks waited on their data going from vector stores
 * to tile loads and from tile stores to vector loads; hence the pipeline. Each strip's rows are
 * prefetched WIDE8_AHEAD bytes ahead (sixteen streams: 156 -> 126 ns a block at 16 rows, q8_0).
 * Unpacking each strip row once per group instead, into a layout the tile loads read directly,
 * kept every bit but was slower at model level: as two 16-element products a block (the tile
 * work doubled) and as one (docs/benchmarks.md, ninth round; tests/bench/dropped/).
 *
 * bf16 (wide, from HETEROSERVE_WIDE_MIN rows, a prefill chunk): each weight strip is dequantized
 * to bf16 (value x scale) once per call, however many activation rows it then meets, and the tile
 * unit sums over K in fp32 tiles (tdpbf16ps: 16 x 16 x 32 products per instruction) that the
 * vector unit touches only at the end. Activations are the floats rounded to bf16: 8 significant
 * bits per element, against an int8 step of max|block| / 127 in the other kernels. Tiles: 0-3 C
 * (fp32 16 x 16: weight rows 0-15 / 16-31 of the strip x activation group 0 / 1 of the pair), 4-5
 * A (16 weight rows x 32 bf16 of one chunk of K), 6-7 B (one chunk of one activation group: 16
 * rows of element pairs x 16 activation rows, wide_pack's layout): 32 weight rows x 32 activation
 * rows per pass, each tile loaded serving two products. K is walked in blocks of KBLOCK chunks of
 * 32: the strip's dequantized block (64 KiB) and the activations' block stay in L2 while the
 * strips and activation pairs pass over them; C tiles are parked in a per-thread buffer between
 * blocks.
 *
 * And attend_rows: the attention of a prefill chunk, several query rows per K/V row, on the tile
 * unit too. */
#define HS_AMX 1
#include "x86_avx512.c"
#ifdef HS_AMX_EMULATE /* the kernel test's build for CPUs without AMX: engines/cpu/tests */
#include "amx_emulate.h"
#endif

#include <stdlib.h>

#define KBLOCK 32        /* chunks (of HS_QK elements) per K block */
#define STRIP 32         /* weight rows per pass: two A tiles */
#define TILE_BYTES 1024  /* one tile: 16 rows x 64 bytes */

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* ---- int8 tile products (tdpbusd) of 16 to a few tens of activation rows ------------------ */

#define AMX_N 16 /* activation rows (columns of the tile) */
#define AMX_M 16 /* weight rows */
/* How far ahead in each of a strip's 16 weight rows the quants are prefetched (bytes). Sixteen
 * rows read 16-32 bytes a block each are sixteen streams, more than the hardware prefetchers
 * follow; without this every block's rows waited on memory. */
#ifndef WIDE8_AHEAD
#define WIDE8_AHEAD 256
#endif
/* A measurement aid (tests/bench/amx_products.sh DEFS=...), 0 in the engine: a build with bit 1
 * leaves out the scaling of each block's 16 x 16 result (DRAIN), 2 the unpacking of the weights
 * after the first two blocks (block_rows, which also reads them from memory; the scaling still
 * reads their scales), 4 the tile unit's work (loads, product, store); its results are wrong,
 * its time is what the rest costs - provided the compiler kept the rest, which objdump shows
 * (GCC 12, -O3: the unpacking's permutes and stores, the scaling's loads of c, converts and
 * FMAs are all in the builds docs/benchmarks.md measured). */
#ifndef WIDE8_SKIP
#define WIDE8_SKIP 0
#endif

/* One block of 16 activation rows in tile layout. */
typedef struct {
    int32_t lo[4][16];   /* with hi, the 8-row B tile: row k holds elements 4k..4k+3 of each column */
    int32_t hi[4][16];   /* elements 16..31 */
    float d[16];         /* each column's block scale */
    float s[16];         /* d x sum (q4_1's minimum term) */
} amx_block;

/* Tiles 0, 1: C (16 x 16 int32) of even and odd blocks; 2, 3: their weights (16 rows x 32 u8:
 * the block's elements 0..15 then 16..31); 4, 5: their activations (8 rows x 16 columns x 4). Two
 * blocks in flight: the tile unit multiplies one while the vector unit scales the other. */
static void configure_tiles_i8(void) {
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
static void gather_blocks(int nb, const char *a, size_t astride, amx_block *out) {
    const int ng = (nb + GROUP - 1) / GROUP;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                              12, 13, 14, 15),
                                            _mm512_set1_epi32((int)astride));
    for (int b = 0; b < nb; b++) {
        const int g = b / GROUP, j = b % GROUP;
        const char *base = a + (size_t)g * sizeof(act_group);
        amx_block *o = out + b;
        for (int k = 0; k < 4; k++) {
            _mm512_store_si512(o->lo[k], _mm512_i32gather_epi32(rows, base + offsetof(act_group, lo) + 64 * k + 4 * j, 1));
            _mm512_store_si512(o->hi[k], _mm512_i32gather_epi32(rows, base + offsetof(act_group, hi) + 64 * k + 4 * j, 1));
        }
        _mm512_store_ps(o->d, _mm512_i32gather_ps(rows, base + offsetof(act_group, d) + 4 * j, 1));
        const char *sums = (const char *)act_sums((const act_group *)a, ng, g) + 4 * j;
        _mm512_store_ps(o->s, _mm512_i32gather_ps(rows, sums, 1));
    }
}

/* Group g's blocks of the strip's 16 weight rows (rows past `rows` repeat the first), each
 * block's bytes together again: per row, a q4 block's 16 nibble bytes (or a q8_0 block's 16 low
 * then, 256 bytes on, 16 high elements) at grp + row * 256 (512) + (j % 4) * 64 + (j / 4) * 16.
 * The packed layout keeps a block's bytes in 4-byte pieces, one per chunk; a 4 x 16 transpose of
 * the chunks brings them together, a group at a time instead of a block at a time. */
static void group_rows(int kind, const uint8_t *w, size_t wstride, int rows, int nb, int g,
                       uint8_t *grp, float (*dw)[GROUP], float (*mw)[GROUP]) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    const int t = nb - g * GROUP < GROUP ? nb - g * GROUP : GROUP;
    const __mmask64 qm = t == GROUP ? ~(__mmask64)0 : (((__mmask64)1 << (4 * t)) - 1);
    const __mmask16 sm = (__mmask16)((1u << t) - 1);
    for (int r = 0; r < AMX_M; r++) {
        const uint8_t *q = w + (size_t)(r < rows ? r : 0) * wstride + (size_t)g * GROUP * qbytes;
        /* the group's scales (and q4_1's minimums) of the row, fp16 after its quants */
        const uint8_t *sc = w + (size_t)(r < rows ? r : 0) * wstride + (size_t)nb * qbytes + 2 * (size_t)g * GROUP;
        _mm512_store_ps(dw[r], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(sm, sc)));
        if (kind == Q4_1)
            _mm512_store_ps(mw[r], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(sm, sc + 2 * (size_t)nb)));
        for (int half = 0; half < (kind == Q8_0 ? 2 : 1); half++) {
            __m512i c[4];
            for (int k = 0; k < 4; k++)
                c[k] = _mm512_maskz_loadu_epi8(qm, q + (kind == Q8_0 ? q8_lo(t, k) + half * q8_hi(t)
                                                                    : (size_t)k * 4 * t));
            const __m512i t0 = _mm512_unpacklo_epi32(c[0], c[1]), t1 = _mm512_unpackhi_epi32(c[0], c[1]);
            const __m512i t2 = _mm512_unpacklo_epi32(c[2], c[3]), t3 = _mm512_unpackhi_epi32(c[2], c[3]);
            uint8_t *o = grp + (size_t)r * AMX_M * qbytes + (size_t)half * 256;
            _mm512_store_si512(o, _mm512_unpacklo_epi64(t0, t2));        /* blocks 0, 4, 8, 12 */
            _mm512_store_si512(o + 64, _mm512_unpackhi_epi64(t0, t2));   /* 1, 5, 9, 13 */
            _mm512_store_si512(o + 128, _mm512_unpacklo_epi64(t1, t3));  /* 2, 6, 10, 14 */
            _mm512_store_si512(o + 192, _mm512_unpackhi_epi64(t1, t3));  /* 3, 7, 11, 15 */
        }
    }
}

/* Block b of the strip's 16 weight rows as a 16 x 32 u8 tile (elements 0..15, then 16..31), from
 * its group's rows (group_rows, refilled at each group's first block: blocks come in order). */
static inline void block_rows(int kind, const uint8_t *w, size_t wstride, int rows, int nb, int b,
                              uint8_t *grp, float (*dw)[AMX_M][GROUP], float (*mw)[AMX_M][GROUP],
                              uint8_t *a) {
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    /* q8_0: qword order [row0 lo, row0 hi, row1 lo, row1 hi] from 4 rows' lo and hi halves */
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    /* q4: two rows' 16 bytes each twice, [row0, row0, row1, row1]; the second and fourth 16
     * bytes shifted right by 4 in 16-bit words (each byte's high nibble to bits 0-3, the next
     * byte's low nibble to bits 4-7), then every byte looked up by its bits 0-5 (vpermb) in a
     * table that repeats every 16 entries: the nibble, less 8 for q4_0. So [row0 elements 0..15,
     * 16..31, row1 0..15, 16..31], signed, in three vector operations a row pair. */
    const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL,
                                                   0, 0, 0x0004000400040004LL, 0x0004000400040004LL);
    const __m512i values = _mm512_broadcast_i32x4(
        kind == Q4_0 ? _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                     : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const size_t qbytes = kind == Q8_0 ? 32 : 16, row_bytes = AMX_M * qbytes;
    const int j = b % GROUP;
    if (j == 0) group_rows(kind, w, wstride, rows, nb, b / GROUP, grp, dw[(b / GROUP) & 1], mw[(b / GROUP) & 1]);
    const uint8_t *at = grp + (size_t)(j % 4) * 64 + (size_t)(j / 4) * 16;
    for (int r = 0; r < AMX_M; r += 4) {
        /* four blocks' quants: 64 bytes (q4) or 128 (q8) a row, as far ahead in blocks for both
         * (a group of 16: all of the next group's lines are in by its first block) */
        if (WIDE8_AHEAD && b % 4 == 0)
            for (int i = 0; i < 4; i++) {
                const char *p = (const char *)w + (size_t)(r + i < rows ? r + i : 0) * wstride
                              + (size_t)b * qbytes + WIDE8_AHEAD * (qbytes / 16);
                _mm_prefetch(p, PF_HINT);
                if (kind == Q8_0) _mm_prefetch(p + 64, PF_HINT);
            }
        /* signed, as tdpbssd takes them: q4_0's nibbles - 8, q8_0's stored q + 128 back to q
         * (q4_1's 0..15 are both) */
        if (kind == Q8_0) {
            __m512i lo = _mm512_castsi128_si512(_mm_load_si128((const __m128i *)(at + r * row_bytes)));
            __m512i hi = _mm512_castsi128_si512(_mm_load_si128((const __m128i *)(at + r * row_bytes + 256)));
            for (int i = 1; i < 4; i++) {
                const uint8_t *p = at + (size_t)(r + i) * row_bytes;
                lo = _mm512_inserti32x4(lo, _mm_load_si128((const __m128i *)p), i);
                hi = _mm512_inserti32x4(hi, _mm_load_si128((const __m128i *)(p + 256)), i);
            }
            const __m512i x0 = _mm512_permutex2var_epi64(lo, first, hi);
            const __m512i x1 = _mm512_permutex2var_epi64(lo, second, hi);
            _mm512_store_si512(a + r * 32, _mm512_xor_si512(x0, sign));
            _mm512_store_si512(a + r * 32 + 64, _mm512_xor_si512(x1, sign));
        } else {
            for (int h = 0; h < 4; h += 2) {
                const uint8_t *p = at + (size_t)(r + h) * row_bytes;
                const __m512i twice = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)p))),
                    _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(p + row_bytes))), 1);
                _mm512_store_si512(a + (r + h) * 32,
                                   _mm512_permutexvar_epi8(_mm512_srlv_epi16(twice, nibble_shift), values));
            }
        }
    }
}

/* 16 weight rows (fewer at the end: `rows`) x AMX_N activation rows over all blocks. */
static inline __attribute__((always_inline)) void strip(int kind, int nb, const uint8_t *w,
                                                        size_t wstride, int rows,
                                                        const amx_block *y, float *out,
                                                        size_t ostride) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    __m512 acc[AMX_M];
    for (int r = 0; r < AMX_M; r++) acc[r] = _mm512_setzero_ps();
    _Alignas(64) int32_t c[2][AMX_M][AMX_N];
    _Alignas(64) uint8_t a[4][AMX_M * HS_QK];
    _Alignas(64) uint8_t grp[AMX_M * GROUP * 32]; /* group_rows' */
    /* the rows' scales (and minimums) of the last two groups group_rows met, by group parity:
     * block b is scaled three steps after its group's quants were unpacked */
    _Alignas(64) float dw[2][AMX_M][GROUP], mw[2][AMX_M][GROUP];
#define DRAIN(buf, b)                                                                           \
    do {                                                                                       \
        const float (*dwb)[GROUP] = dw[((b) / GROUP) & 1], (*mwb)[GROUP] = mw[((b) / GROUP) & 1]; \
        const int jb = (b) % GROUP;                                                            \
        const __m512 yd = _mm512_load_ps(y[(b)].d), ys = _mm512_load_ps(y[(b)].s);             \
        for (int r = 0; r < AMX_M; r++) {                                                      \
            const __m512 v = _mm512_cvtepi32_ps(_mm512_load_si512(c[buf][r]));                 \
            acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(yd, _mm512_set1_ps(dwb[r][jb])), acc[r]); \
            if (kind == Q4_1) acc[r] = _mm512_fmadd_ps(ys, _mm512_set1_ps(mwb[r][jb]), acc[r]); \
        }                                                                                      \
    } while (0)
    /* A pipeline three blocks deep, so that no data goes from a store straight to a load of
     * the other unit (a tile load of just-stored scratch, a vector load of a just-stored tile
     * waits for the stores to drain; in-order that was most of a block's time): in the step of
     * block b, unpack block b + 2 (vector), store C of block b (its product was issued a step
     * earlier), issue block b + 1's product (its scratch written a step earlier), then scale the
     * C stored in the previous step. Tiles 0/1: C, 2/3: weights, 4/5: activations, by parity
     * (P: block b's, N: block b + 1's; literal numbers, as the tile intrinsics require). */
#define STEP(b, P, N, NA, NB)                                                                   \
    do {                                                                                       \
        if (!(WIDE8_SKIP & 2) && (b) + 2 < nb)                                                 \
            block_rows(kind, w, wstride, rows, nb, (b) + 2, grp, dw, mw, a[((b) + 2) & 3]);    \
        if (!(WIDE8_SKIP & 4)) _tile_stored(P, c[P], AMX_N * 4);                               \
        if (!(WIDE8_SKIP & 4) && (b) + 1 < nb) {                                               \
            _tile_loadd(NA, a[((b) + 1) & 3], HS_QK);                                          \
            _tile_loadd(NB, y[(b) + 1].lo, AMX_N * 4);                                         \
            _tile_zero(N);                                                                     \
            _tile_dpbssd(N, NA, NB);                                                           \
        }                                                                                      \
        if (!(WIDE8_SKIP & 1) && (b) >= 1) DRAIN(N, (b) - 1);                                  \
    } while (0)
    if (WIDE8_SKIP) { /* what the left-out steps would have written: defined, if meaningless */
        memset(a, 0, sizeof a);
        memset(c, 0, sizeof c);
    }
    block_rows(kind, w, wstride, rows, nb, 0, grp, dw, mw, a[0]);
    if (nb > 1) block_rows(kind, w, wstride, rows, nb, 1, grp, dw, mw, a[1]);
    _tile_loadd(2, a[0], HS_QK);
    _tile_loadd(4, y[0].lo, AMX_N * 4);
    _tile_zero(0);
    _tile_dpbssd(0, 2, 4);
    for (int b = 0; b < nb; b += 2) {
        STEP(b, 0, 1, 3, 5);
        if (b + 1 < nb) STEP(b + 1, 1, 0, 2, 4);
    }
    if (!(WIDE8_SKIP & 1)) DRAIN((nb - 1) & 1, nb - 1);
#undef STEP
#undef DRAIN
    /* (acc is indexed by a variable here, so GCC keeps it in memory: each block's FMAs load and
     * store its rows. Kept in registers instead it was not faster: docs/benchmarks.md, tenth
     * round; tests/bench/dropped/wide8-register-accumulators.patch) */
    /* Out, one activation row (16 consecutive floats of out) at a time: row by row instead,
     * each weight row's 16 values went to 16 lines ostride apart, and where ostride is a multiple
     * of 1024 floats (4 KiB: the 1024-, 2048- and 49152-row matrices of SmolLM2-sized models)
     * those lines share one L1 set of 12 ways, so each of the 256 stores missed L1 (a 2048 x 576
     * q8_0 matrix at 16 rows: 122 ns a block against 61 for 2560 rows, tests/bench/amx_products.sh) */
    _Alignas(64) float v[AMX_M][AMX_N];
    for (int r = 0; r < rows; r++) _mm512_store_ps(v[r], acc[r]);
    const __m512i column = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(AMX_N));
    const __mmask16 mask = rows >= AMX_M ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
    for (int n = 0; n < AMX_N; n++)
        _mm512_mask_storeu_ps(out + (size_t)n * ostride, mask,
                              _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, column,
                                                       &v[0][n], 4));
}

/* Per-thread scratch for the gathered activation blocks (pool threads live as long as the
 * process; the buffer grows to the widest input seen). */
static __thread amx_block *scratch;
static __thread size_t scratch_blocks;

static inline __attribute__((always_inline)) int wide8(int kind, int nb, const void *w,
                                                      size_t wstride, int nrows, const void *a,
                                                      size_t astride, int ncols, float *out,
                                                      size_t ostride) {
    const int done = ncols / AMX_N * AMX_N, groups = done / AMX_N;
    if (!done) return 0;
    const size_t need = (size_t)nb * (size_t)groups;
    if (need > scratch_blocks) {
        if (!a) return 0; /* (a NULL: the rows this thread's last call gathered, hs_wide8_fn) */
        free(scratch);
        if (posix_memalign((void **)&scratch, 64, sizeof(amx_block) * need) != 0) {
            scratch = NULL;
            scratch_blocks = 0;
            return 0;
        }
        scratch_blocks = need;
    }
    configure_tiles_i8();
    /* Every group of AMX_N activation rows gathered first, then each weight strip meets all of
     * them in turn while it is still in L1/L2 (the matrix is read from memory once). */
    for (int c = 0; a && c < groups; c++)
        gather_blocks(nb, (const char *)a + (size_t)c * AMX_N * astride, astride,
                      scratch + (size_t)c * nb);
    const size_t qbytes = kind == Q8_0 ? 32 : 16, tail = (size_t)nb * (kind == Q4_1 ? 4 : 2);
    for (int r = 0; r < nrows; r += AMX_M) {
        const uint8_t *rows = (const uint8_t *)w + (size_t)r * wstride;
        if (WIDE8_AHEAD) /* the next strip's scales (and minimums) and first quants, into L2 */
            for (int i = 0; i < AMX_M; i++) {
                const char *next = (const char *)rows + (size_t)(AMX_M + i) * wstride;
                for (size_t at = 0; at < tail; at += 64)
                    _mm_prefetch(next + (size_t)nb * qbytes + at, PF_HINT);
                for (size_t at = 0; at < WIDE8_AHEAD * (qbytes / 16); at += 64)
                    _mm_prefetch(next + at, PF_HINT);
            }
        for (int c = 0; c < groups; c++)
            strip(kind, nb, rows, wstride, nrows - r < AMX_M ? nrows - r : AMX_M,
                  scratch + (size_t)c * nb, out + (size_t)c * AMX_N * ostride + r, ostride);
    }
    _tile_release();
    return done;
}

static int wide8_q4_0(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,
                     int ncols, float *out, size_t os) {
    return wide8(Q4_0, nb, w, ws, nrows, a, as, ncols, out, os);
}
static int wide8_q4_1(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,
                     int ncols, float *out, size_t os) {
    return wide8(Q4_1, nb, w, ws, nrows, a, as, ncols, out, os);
}
static int wide8_q8_0(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,
                     int ncols, float *out, size_t os) {
    return wide8(Q8_0, nb, w, ws, nrows, a, as, ncols, out, os);
}

/* ---- bf16 tile products (tdpbf16ps) of many activation rows ------------------------------ */

static void configure_tiles(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* 16 x 16 32-bit elements: lane j of r[i] goes to lane i of r[j]. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* r[i + j], lane L: column 4L + j of rows i..i+3 */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* 32 floats -> 32 bf16 (round to nearest even), element order kept: lo is elements 0..15. */
static inline __m512i bf16x32(__m512 lo, __m512 hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

static size_t wide_group_bytes(int cols) { return (size_t)(cols / HS_QK) * TILE_BYTES; }

/* One group of 16 activation rows: per chunk of 32 elements a B tile, row k holding elements
 * (2k, 2k+1) of each of the 16 rows (rows past `rows` zero). */
static void wide_pack(const float *x, int cols, int rows, void *dst) {
    const int nck = cols / HS_QK;
    for (int ck = 0; ck < nck; ck++) {
        __m512i r[16];
        for (int t = 0; t < 16; t++) {
            const float *p = x + (size_t)t * cols + (size_t)ck * HS_QK;
            r[t] = t < rows ? bf16x32(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16))
                            : _mm512_setzero_si512();
        }
        transpose16(r);
        char *tile = (char *)dst + (size_t)ck * TILE_BYTES;
        for (int k = 0; k < 16; k++) _mm512_store_si512(tile + 64 * k, r[k]);
    }
}

/* Block b of a packed weight row as 32 floats (lo: elements 0..15, hi: 16..31). */
static inline void dequant_block(int kind, int nb, const uint8_t *row, int b, __m512 *lo,
                                 __m512 *hi) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    __m128i ql, qh;
    float d, bias;
    size_t stride, half;
    const uint8_t *p = block_piece(row, kind == Q8_0 ? 32 : 16, nb, b, &stride, &half);
    if (kind == Q8_0) { /* elements 0..15, then 16..31, stored as x + 128 */
        ql = block_pieces(p, stride);
        qh = block_pieces(p + half, stride);
        d = _cvtsh_ss(((const hs_fp16 *)(row + (size_t)nb * 32))[b]);
        bias = -128.0f * d;
    } else {
        const __m128i raw = block_pieces(p, stride);
        ql = _mm_and_si128(raw, low4);
        qh = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
        const hs_fp16 *s = (const hs_fp16 *)(row + (size_t)nb * 16);
        d = _cvtsh_ss(s[b]);
        bias = kind == Q4_1 ? _cvtsh_ss(s[nb + b]) : -8.0f * d;
    }
    const __m512 vd = _mm512_set1_ps(d), vb = _mm512_set1_ps(bias);
    *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ql)), vd, vb);
    *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(qh)), vd, vb);
}

/* Chunks [ck0, ck1) of the strip's weight rows [0, rows) as bf16 A tiles: chunk c at
 * wt + (c - ck0) * 2 tiles, rows 0-15 then 16-31; rows past `rows` zero. The next strip's same
 * chunks are prefetched meanwhile: they are what the next strip reads. */
static void dequant_strip(int kind, int nb, const uint8_t *w, size_t wstride, int rows,
                          int more, int ck0, int ck1, char *wt) {
    const size_t qbytes = kind == Q8_0 ? 32 : 16;
    for (int r = 0; r < STRIP; r++) {
        char *dst = wt + (size_t)r * 64;
        if (r >= rows) {
            for (int b = ck0; b < ck1; b++)
                _mm512_store_si512(dst + (size_t)(b - ck0) * 2 * TILE_BYTES, _mm512_setzero_si512());
            continue;
        }
        const uint8_t *row = w + (size_t)r * wstride;
        if (r < more) {
            const char *next = (const char *)row + STRIP * wstride;
            for (size_t at = (size_t)ck0 * qbytes; at < (size_t)ck1 * qbytes; at += 64)
                _mm_prefetch(next + at, _MM_HINT_T0);
            _mm_prefetch(next + (size_t)nb * qbytes + 2 * (size_t)ck0, _MM_HINT_T0);
        }
        for (int b = ck0; b < ck1; b++) {
            __m512 lo, hi;
            dequant_block(kind, nb, row, b, &lo, &hi);
            _mm512_store_si512(dst + (size_t)(b - ck0) * 2 * TILE_BYTES, bf16x32(lo, hi));
        }
    }
}

/* A 16 x 16 C tile (weight row m, activation row t at c[16 m + t]) into out[t * ostride + m]
 * for the valid rows and activation rows. */
static inline void put_tile(const float *c, float *out, size_t ostride, int rows, int acts) {
    if (rows <= 0 || acts <= 0) return;
    __m512i r[16];
    for (int m = 0; m < 16; m++) r[m] = _mm512_load_si512(c + 16 * m);
    transpose16(r);
    const __mmask16 mask = rows >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1);
    for (int t = 0; t < acts && t < 16; t++)
        _mm512_mask_storeu_ps(out + (size_t)t * ostride, mask, _mm512_castsi512_ps(r[t]));
}

/* Per-thread scratch (pool threads live as long as the process): one K block of a dequantized
 * strip, and the C tiles parked between K blocks (grown to the largest call seen). */
static __thread char *strip_buf;
static __thread float *c_buf;
static __thread size_t c_floats;

static int wide(int type, int cols, const void *w, size_t wstride, int nrows, const void *act,
                int n, float *out, size_t ostride) {
    const int kind = type == HS_Q4_0 ? Q4_0 : type == HS_Q4_1 ? Q4_1 : Q8_0;
    const int nck = cols / HS_QK, pairs = (n + 31) / 32, strips = (nrows + STRIP - 1) / STRIP;
    const int nkb = (nck + KBLOCK - 1) / KBLOCK;
    const size_t group = wide_group_bytes(cols), parked = nkb > 1 ? (size_t)strips * pairs * 1024 : 0;
    if (!strip_buf && posix_memalign((void **)&strip_buf, 64, (size_t)KBLOCK * 2 * TILE_BYTES) != 0) {
        strip_buf = NULL;
        return -1;
    }
    if (parked > c_floats) {
        free(c_buf);
        if (posix_memalign((void **)&c_buf, 64, parked * sizeof(float)) != 0) {
            c_buf = NULL;
            c_floats = 0;
            return -1;
        }
        c_floats = parked;
    }
    _Alignas(64) float c[4][256];
    configure_tiles();
    for (int kb = 0; kb < nkb; kb++) {
        const int ck0 = kb * KBLOCK, ck1 = nck - ck0 < KBLOCK ? nck : ck0 + KBLOCK;
        for (int s = 0; s < strips; s++) {
            const int r0 = s * STRIP, rows = nrows - r0 < STRIP ? nrows - r0 : STRIP;
            dequant_strip(kind, nck, (const uint8_t *)w + (size_t)r0 * wstride, wstride, rows,
                          nrows - r0 - STRIP, ck0, ck1, strip_buf);
            for (int p = 0; p < pairs; p++) {
                float *cb = c_buf + ((size_t)s * pairs + p) * 1024;
                if (kb == 0) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                } else {
                    _tile_loadd(0, cb, 64);
                    _tile_loadd(1, cb + 256, 64);
                    _tile_loadd(2, cb + 512, 64);
                    _tile_loadd(3, cb + 768, 64);
                }
                const char *b0 = (const char *)act + (size_t)(2 * p) * group, *b1 = b0 + group;
                for (int ck = ck0; ck < ck1; ck++) {
                    const char *a = strip_buf + (size_t)(ck - ck0) * 2 * TILE_BYTES;
                    _tile_loadd(4, a, 64);
                    _tile_loadd(5, a + TILE_BYTES, 64);
                    _tile_loadd(6, b0 + (size_t)ck * TILE_BYTES, 64);
                    _tile_loadd(7, b1 + (size_t)ck * TILE_BYTES, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                if (kb + 1 < nkb) {
                    _tile_stored(0, cb, 64);
                    _tile_stored(1, cb + 256, 64);
                    _tile_stored(2, cb + 512, 64);
                    _tile_stored(3, cb + 768, 64);
                    continue;
                }
                _tile_stored(0, c[0], 64);
                _tile_stored(1, c[1], 64);
                _tile_stored(2, c[2], 64);
                _tile_stored(3, c[3], 64);
                const int t0 = 32 * p;
                float *o = out + (size_t)t0 * ostride + r0;
                put_tile(c[0], o, ostride, rows, n - t0);
                put_tile(c[1], o + 16 * ostride, ostride, rows, n - t0 - 16);
                put_tile(c[2], o + 16, ostride, rows - 16, n - t0);
                put_tile(c[3], o + 16 * ostride + 16, ostride, rows - 16, n - t0 - 16);
            }
        }
    }
    _tile_release();
    return 0;
}

/* ---- attention of a prefill chunk: several query rows per K/V row ------------------------- */

/* e^x for 16 floats (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial in r,
 * then 2^n by scalef; relative error about 1e-7). x = -inf (or below about -104) gives 0. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* 16 floats -> bf16 (nearest even) in the low half, and back to floats. */
static inline __m512 bf16_back(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 32 floats as bf16 hi + lo words (hi = bf16(x), lo = bf16(x - hi): 16 significant bits together),
 * element order kept (see bf16x32). */
static inline void split32(__m512 x0, __m512 x1, __m512i *hi, __m512i *lo) {
    *hi = bf16x32(x0, x1);
    const __m512 r0 = _mm512_sub_ps(x0, bf16_back(_mm512_castsi512_si256(*hi)));
    const __m512 r1 = _mm512_sub_ps(x1, bf16_back(_mm512_extracti64x4_epi64(*hi, 1)));
    *lo = bf16x32(r0, r1);
}

/* Attention on the tile unit, positions 32 at a time. attend_pack converts K and V once into tile
 * layouts: K split into bf16 hi + lo parts (16 significant bits together, as fp16 K holds 11),
 * transposed into B tiles per 16 positions and 32 dimensions; V as bf16 pairs of positions per
 * 16 dimensions. attend_rows then, per block of 32 positions: scores S = Qh Kh + Qh Kl + Ql Kh
 * in fp32 tiles (Q scaled, split the same way), the online softmax on the vector unit (exp16),
 * P (bf16, in [0, 1]) times V into fresh C tiles added to each row's rescaled accumulator.
 * Tiles: 0-1 S of positions 0-15 / 16-31 (later one 16-dimension part of P V), 2-3 Q hi / lo of
 * a 32-dimension chunk, 4-7 K hi / lo of the two position halves (later 4: P, 5: a V part). */
static size_t block_bytes(int hd) { return (size_t)(hd / 32) * 4 * TILE_BYTES + (size_t)(hd / 16) * TILE_BYTES; }

static size_t attend_bytes(int hd, int count) { return (size_t)(count + 31) / 32 * block_bytes(hd); }

/* Block layout: K hi [chunk][half], K lo [chunk][half], V [16-dim part] (tiles). */
static void attend_pack(int hd, const hs_fp16 *const *k, const hs_fp16 *const *v, int from,
                        int count, void *buf) {
    const int nc = hd / 32;
    const __m512i pairs = _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003,
                                            0x00240004, 0x00250005, 0x00260006, 0x00270007,
                                            0x00280008, 0x00290009, 0x002a000a, 0x002b000b,
                                            0x002c000c, 0x002d000d, 0x002e000e, 0x002f000f);
    for (int p0 = from / 32 * 32; p0 < count; p0 += 32) {
        const int np = count - p0 < 32 ? count - p0 : 32;
        char *blk = (char *)buf + (size_t)(p0 / 32) * block_bytes(hd);
        char *khi = blk, *klo = blk + (size_t)nc * 2 * TILE_BYTES, *vt = blk + (size_t)nc * 4 * TILE_BYTES;
        for (int half = 0; half < 2; half++)
            for (int c = 0; c < nc; c++) {
                __m512i th[16], tl[16];
                for (int p = 0; p < 16; p++) {
                    if (16 * half + p < np) {
                        const __m512i raw = _mm512_loadu_si512(k[p0 + 16 * half + p] + 32 * c);
                        split32(_mm512_cvtph_ps(_mm512_castsi512_si256(raw)),
                                _mm512_cvtph_ps(_mm512_extracti64x4_epi64(raw, 1)), &th[p], &tl[p]);
                    } else {
                        th[p] = tl[p] = _mm512_setzero_si512();
                    }
                }
                transpose16(th);
                transpose16(tl);
                char *h = khi + (size_t)(2 * c + half) * TILE_BYTES, *lo = klo + (size_t)(2 * c + half) * TILE_BYTES;
                for (int j = 0; j < 16; j++) {
                    _mm512_store_si512(h + 64 * j, th[j]);
                    _mm512_store_si512(lo + 64 * j, tl[j]);
                }
            }
        for (int pp = 0; pp < 16; pp++) /* V: positions 2pp, 2pp + 1 interleaved per dimension */
            for (int d = 0; d < hd; d += 16) {
                __m512i row = _mm512_setzero_si512();
                if (2 * pp < np) {
                    const __m256i a = (__m256i)_mm512_cvtneps_pbh(_mm512_cvtph_ps(
                        _mm256_loadu_si256((const __m256i *)(v[p0 + 2 * pp] + d))));
                    const __m256i b = 2 * pp + 1 < np
                        ? (__m256i)_mm512_cvtneps_pbh(_mm512_cvtph_ps(
                              _mm256_loadu_si256((const __m256i *)(v[p0 + 2 * pp + 1] + d))))
                        : _mm256_setzero_si256();
                    row = _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), pairs,
                                                    _mm512_castsi256_si512(b));
                }
                _mm512_store_si512(vt + (size_t)(d / 16) * TILE_BYTES + 64 * pp, row);
            }
    }
}

static void attend_rows(int hd, int nq, float scale, const float *const *q, const int *lim,
                        const void *buf, int count, float *m, float *l, float *const *acc) {
    enum { NC = HS_ATTN_HD / 32 };
    _Alignas(64) uint8_t qt[2][NC][TILE_BYTES]; /* Q hi, lo: 16 rows x 32 bf16 per chunk */
    _Alignas(64) uint16_t pb[16][32];            /* P: 16 rows x 32 positions, bf16 */
    _Alignas(64) float s[2][16][16], o[16][16], rescale[16];
    const int nc = hd / 32;
    const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int c = 0; c < nc; c++)
        for (int r = 0; r < 16; r++) {
            __m512i h = _mm512_setzero_si512(), lo = h;
            if (r < nq)
                split32(_mm512_mul_ps(_mm512_loadu_ps(q[r] + 32 * c), vscale),
                        _mm512_mul_ps(_mm512_loadu_ps(q[r] + 32 * c + 16), vscale), &h, &lo);
            _mm512_store_si512(qt[0][c] + 64 * r, h);
            _mm512_store_si512(qt[1][c] + 64 * r, lo);
        }
    configure_tiles();
    for (int p0 = 0; p0 < count; p0 += 32) {
        const int np = count - p0 < 32 ? count - p0 : 32;
        int live = 0;
        for (int r = 0; r < nq; r++) live |= lim[r] > p0;
        if (!live) break; /* lim[r] <= count: no later block has any either */
        const char *blk = (const char *)buf + (size_t)(p0 / 32) * block_bytes(hd);
        const char *khi = blk, *klo = blk + (size_t)nc * 2 * TILE_BYTES, *vt = blk + (size_t)nc * 4 * TILE_BYTES;
        _tile_zero(0);
        _tile_zero(1);
        for (int c = 0; c < nc; c++) {
            _tile_loadd(2, qt[0][c], 64);
            _tile_loadd(3, qt[1][c], 64);
            _tile_loadd(4, khi + (size_t)(2 * c) * TILE_BYTES, 64);
            _tile_loadd(5, khi + (size_t)(2 * c + 1) * TILE_BYTES, 64);
            _tile_loadd(6, klo + (size_t)(2 * c) * TILE_BYTES, 64);
            _tile_loadd(7, klo + (size_t)(2 * c + 1) * TILE_BYTES, 64);
            _tile_dpbf16ps(0, 2, 4);
            _tile_dpbf16ps(1, 2, 5);
            _tile_dpbf16ps(0, 3, 4);
            _tile_dpbf16ps(1, 3, 5);
            _tile_dpbf16ps(0, 2, 6);
            _tile_dpbf16ps(1, 2, 7);
        }
        _tile_stored(0, s[0], 64);
        _tile_stored(1, s[1], 64);
        /* each row's new running max, then all rows' rescale factors in one exp16 */
        _Alignas(64) float before[16], after[16];
        for (int r = 0; r < 16; r++) {
            before[r] = after[r] = 0.0f;
            if (r >= nq || lim[r] <= p0) continue;
            const int valid = lim[r] - p0 < np ? lim[r] - p0 : np;
            const __mmask16 m0 = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1);
            const __mmask16 m1 = valid <= 16 ? 0 : (__mmask16)((1u << (valid - 16)) - 1);
            const float top = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_mask_mov_ps(ninf, m0, _mm512_load_ps(s[0][r])),
                              _mm512_mask_mov_ps(ninf, m1, _mm512_load_ps(s[1][r]))));
            before[r] = m[r]; /* -inf on the first block: its factor is 0 */
            after[r] = m[r] = top > m[r] ? top : m[r];
        }
        _mm512_store_ps(rescale, exp16(_mm512_sub_ps(_mm512_load_ps(before), _mm512_load_ps(after))));
        for (int r = 0; r < 16; r++) {
            if (r >= nq || lim[r] <= p0) {
                _mm512_store_si512(pb[r], _mm512_setzero_si512());
                continue;
            }
            const int valid = lim[r] - p0 < np ? lim[r] - p0 : np;
            const __mmask16 m0 = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1);
            const __mmask16 m1 = valid <= 16 ? 0 : (__mmask16)((1u << (valid - 16)) - 1);
            const __m512 max = _mm512_set1_ps(after[r]);
            const __m512 e0 = _mm512_maskz_mov_ps(m0, exp16(_mm512_sub_ps(_mm512_load_ps(s[0][r]), max)));
            const __m512 e1 = _mm512_maskz_mov_ps(m1, exp16(_mm512_sub_ps(_mm512_load_ps(s[1][r]), max)));
            l[r] = l[r] * rescale[r] + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
            _mm512_store_si512(pb[r], bf16x32(e0, e1));
        }
        _tile_loadd(4, pb, 64);
        for (int d = 0; d < hd; d += 16) {
            _tile_zero(0);
            _tile_loadd(5, vt + (size_t)(d / 16) * TILE_BYTES, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_stored(0, o, 64);
            for (int r = 0; r < nq; r++) {
                if (lim[r] <= p0) continue;
                float *a = acc[r] + d;
                _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_loadu_ps(a), _mm512_set1_ps(rescale[r]),
                                                    _mm512_load_ps(o[r])));
            }
        }
    }
    _tile_release();
}

/* gate[j] = silu(gate[j]) * up[j] = gate[j] / (1 + e^-gate[j]) * up[j], 16 at a time. */
static void swiglu_wide(size_t n, float *gate, const float *up) {
    size_t j = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= n; j += 16) {
        const __m512 g = _mm512_loadu_ps(gate + j);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(gate + j, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)),
                                                 _mm512_loadu_ps(up + j)));
    }
    for (; j < n; j++) gate[j] = gate[j] / (1.0f + expf(-gate[j])) * up[j];
}

static const hs_kernels table = {
    .name = "amx",
    AVX512_KERNELS,
    .mm_cols = 8, /* 1 x 8 register tiles for 8 activation rows (x86_avx512.c's TILES) */
    .attend_exact = HS_EXACT_F16, /* attend_f16 (decode) is avx512vnni's; attend_rows its own */
    .wide8_q4_0 = wide8_q4_0,
    .wide8_q4_1 = wide8_q4_1,
    .wide8_q8_0 = wide8_q8_0,
    .wide_group_bytes = wide_group_bytes,
    .wide_pack = wide_pack,
    .wide = wide,
    .swiglu_wide = swiglu_wide,
    .attend_bytes = attend_bytes,
    .attend_pack = attend_pack,
    .attend_rows = attend_rows,
};

const hs_kernels *hs_kernels_amx(void) { return &table; }
