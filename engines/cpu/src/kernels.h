/* The kernel table: one reference implementation of every op (ref.c) is the truth; ISA variants
 * override entries and are tested against it. Kernels know nothing of threads or models. */
#ifndef HS_KERNELS_H
#define HS_KERNELS_H

#include "blocks.h"

/* The quantized products, in the variant's weight and activation layouts: `nrows` weight rows
 * (`wstride` bytes apart) against `ncols` activation rows (`astride` bytes apart):
 * out[c * ostride + r] = sum_j w[r][j] * a[c][j], for nrows of 1..4 and ncols of 1..4 (1..8
 * where the variant's mm_cols is 8). */
typedef void (*hs_mm_fn)(int nb, const void *w, size_t wstride, int nrows, const void *a,
                         size_t astride, int ncols, float *out, size_t ostride);

/* Rows of this many blocks (HS_QK elements each) or more are wide: model.c gives a one-token
 * product one of them at a time (tile_rows: one forward stream per thread), and the x86
 * register tiles keep 4 x 2 tiles for them where narrower rows with 4 activation rows take
 * 2 x 4 (TILE_COLS; the amx variant takes 2 x 4 at every width). Both lines measured on the
 * 2-core VM: docs/benchmarks.md. */
#define HS_WIDE_ROW_BLOCKS 32

/* Products of 16 or more activation rows on a matrix unit in int8 (AMX tiles): nrows weight rows
 * x ncols activation rows of mm_*'s layouts, any sizes. Returns how many leading activation rows
 * it computed (a multiple of its tile width, possibly 0); the caller computes the rest with mm_*.
 * `a` NULL: the same activation rows as this thread's previous call (same nb and ncols), not
 * converted again - for a caller that takes a product's weight rows in several pieces (model.c's
 * work stealing); 0 where that call computed none. */
typedef int (*hs_wide8_fn)(int nb, const void *w, size_t wstride, int nrows, const void *a,
                           size_t astride, int ncols, float *out, size_t ostride);

/* Products of many activation rows on a matrix unit (AMX-BF16): see wide_* in hs_kernels. */
#define HS_WIDE_ROWS 16 /* activation rows per packed group */
typedef int (*hs_wide_fn)(int type, int cols, const void *w, size_t wstride, int nrows,
                           const void *act, int n, float *out, size_t ostride);

typedef struct {
    const char *name;
    /* Activations: quantize_act writes one row of n values in the variant's layout, act_bytes(n)
     * bytes (a 64-byte multiple where the variant needs aligned rows). */
    size_t (*act_bytes)(int n);
    void (*quantize_act)(const float *x, void *y, int n);
    /* Weights: pack_row converts a quantized GGUF row once at load into the variant's layout
     * (same bytes per row) and unpack_row converts it back (the embedding lookup); both NULL
     * where the variant reads the GGUF layout as it is. */
    void (*pack_row)(int type, const void *src, void *dst, int cols);
    void (*unpack_row)(int type, const void *src, void *dst, int cols);
    hs_mm_fn mm_q4_0, mm_q4_1, mm_q8_0;
    int mm_cols; /* the most activation rows mm_* take a call: 8, or 4 where 0 */
    hs_wide8_fn wide8_q4_0, wide8_q4_1, wide8_q8_0; /* optional */
    /* Optional: products of many activation rows on a matrix unit, in bf16 with fp32 sums.
     * Activations come as floats: wide_pack writes `rows` (0..HS_WIDE_ROWS) rows of x, `cols`
     * floats apart, as one group of HS_WIDE_ROWS rows (the rest zero) in wide_group_bytes(cols)
     * bytes. wide multiplies nrows weight rows of `type` (pack_row's layout, wstride bytes apart;
     * each weight is dequantized to bf16, value x scale rounded to nearest even) by n activation
     * rows held as consecutive groups, an even number of them (ceil(n / 32) * 2, padding rows
     * zero): out[c * ostride + r] for c < n. Returns 0, or -1 (nothing computed) when its
     * scratch could not be allocated. */
    size_t (*wide_group_bytes)(int cols);
    void (*wide_pack)(const float *x, int cols, int rows, void *dst);
    hs_wide_fn wide;
    float (*dot_f16)(int n, const hs_fp16 *w, const float *x);
    float (*dot_f32)(int n, const float *w, const float *x);
    /* fp32 -> fp16, round to nearest even: K/V rows into the cache. */
    void (*to_f16)(int n, const float *x, hs_fp16 *y);
    /* Attention of ng (1..HS_ATTN_GROUP) query heads that share one KV head (q: ng rows of hd)
     * over `count` cached positions, K row k[p] and V row v[p] (hd fp16 each), as an online
     * softmax: with s = scale * q[g] . k[p], m[g] the running max of s and l[g] the running sum
     * of exp(s - m[g]), acc[g] (hd floats) accumulates exp(s - m[g]) * v[p] and is rescaled
     * whenever m[g] grows. Start from m = -inf, l = 0, acc = 0; the result is acc[g] / l[g]. */
    void (*attend_f16)(int hd, int ng, float scale, const float *q, const hs_fp16 *const *k,
                       const hs_fp16 *const *v, int count, float *m, float *l, float *acc);
    /* Optional: gate[j] = gate[j] / (1 + expf(-gate[j])) * up[j] for j < n, bit for bit as
     * model.c's scalar loop (glibc's expf), which serves where it is absent. */
    void (*swiglu)(size_t n, float *gate, const float *up);
    /* Optional: the same formula with a faster exp whose bits differ, for steps of 16 tokens
     * or more (model.c's SWIGLU_VECTOR_MIN, HS_WIDE8_MIN: those whose products differ from
     * avx512vnni's anyway). */
    void (*swiglu_wide)(size_t n, float *gate, const float *up);
    /* Optional, together: the attention of a prefill chunk, several tokens' heads per K/V row.
     * attend_pack converts positions [from, count) of one KV head's cached rows (k[p], v[p]: hd
     * fp16 each) into the variant's layout in buf, attend_bytes(hd, count) bytes (what was
     * packed before `from` is kept: a growing context is packed once). attend_rows: nq
     * (1..HS_ATTN_ROWS) query rows q[r] that share that KV head, row r attending the first
     * lim[r] (1 <= lim[r] <= count) of the `count` packed positions: the online softmax of
     * attend_f16, m[r], l[r] and acc[r] (hd floats) per row. hd a multiple of 32, at most
     * HS_ATTN_HD. */
    size_t (*attend_bytes)(int hd, int count);
    void (*attend_pack)(int hd, const hs_fp16 *const *k, const hs_fp16 *const *v, int from,
                        int count, void *buf);
    void (*attend_rows)(int hd, int nq, float scale, const float *const *q, const int *lim,
                        const void *buf, int count, float *m, float *l, float *const *acc);
    /* Which of the attention kernels compute attend.h's arithmetic bit for bit (the exact KV
     * hand-off relies on it): HS_EXACT_F16 (attend_f16), HS_EXACT_ROWS (attend_rows, each row as
     * attend_f16 would; amx's tile attend_rows has its own arithmetic). The kernel test holds
     * them to a scalar statement of it. */
    int attend_exact;
} hs_kernels;

#define HS_EXACT_F16 1
#define HS_EXACT_ROWS 2

#define HS_ATTN_ROWS 16  /* query rows per attend_rows call */
#define HS_ATTN_HD 256   /* widest head attend_rows takes */
#define HS_ATTN_GROUP 8 /* query heads per attend_f16 call */
#define HS_ATTN_SPAN 64 /* positions scored at once inside it */

extern const hs_kernels hs_kernels_ref;
const hs_kernels *hs_kernels_avx2(void);    /* NULL when not compiled in */
const hs_kernels *hs_kernels_avx512(void);
const hs_kernels *hs_kernels_amx(void);
const hs_kernels *hs_kernels_neon(void);
const hs_kernels *hs_kernels_dotprod(void);
const hs_kernels *hs_kernels_i8mm(void);

/* The best variant this CPU runs (or the one named by HETEROSERVE_KERNELS). */
const hs_kernels *hs_kernels_select(void);
const hs_kernels *hs_kernels_by_name(const char *name);
/* Comma-separated names of the variants this CPU supports, best last. */
const char *hs_kernels_available(void);

/* Reference conversions, shared by every variant. */
void hs_quantize_row_q8_0(const float *x, block_q8_0 *y, int n);
void hs_quantize_row_q4_0(const float *x, block_q4_0 *y, int n);
void hs_dequantize_row(int type, const void *x, float *y, int n);

#endif
