/* The kernel table: one reference implementation of every op (ref.c) is the truth; ISA variants
 * override entries and are tested against it. Kernels know nothing of threads or models. */
#ifndef HS_KERNELS_H
#define HS_KERNELS_H

#include "blocks.h"

/* Dot products of `nrows` weight rows (each `nb` blocks, rows `stride` bytes apart) with one
 * quantized activation row: out[r] = sum_j w[r][j] * a[j]. nrows is 1, 2 or 4 (NRC tiling). */
typedef void (*hs_dot_fn)(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                          float *out);

/* One weight row against `ncols` (1..4) activation rows `astride` blocks apart: each weight
 * block is unpacked once for all of them (batched decode and prefill). NULL: loop the dot. */
typedef void (*hs_gemm_fn)(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                           float *out);

/* Products over a variant's own packed layout: `nrows` packed weight rows (`wstride` bytes apart)
 * against `ncols` packed activation rows (`astride` bytes apart):
 * out[c * ostride + r] = sum_j w[r][j] * a[c][j], for nrows and ncols of 1..4. */
typedef void (*hs_mm_fn)(int nb, const void *w, size_t wstride, int nrows, const void *a,
                         size_t astride, int ncols, float *out, size_t ostride);

/* Products of many activation rows at once (AMX tiles): nrows weight rows x ncols activation
 * rows of mm_*'s layouts, any sizes. Returns how many leading activation rows it computed (a
 * multiple of its tile width, possibly 0); the caller computes the rest with mm_*. */
typedef int (*hs_wide_fn)(int nb, const void *w, size_t wstride, int nrows, const void *a,
                          size_t astride, int ncols, float *out, size_t ostride);

typedef struct {
    const char *name;
    void (*quantize_act)(const float *x, block_q8a *y, int n);
    hs_dot_fn dot_q4_0, dot_q4_1, dot_q8_0;
    float (*dot_f16)(int n, const hs_fp16 *w, const float *x);
    float (*dot_f32)(int n, const float *w, const float *x);
    /* y[j] += a * x[j] over fp16 x: the attention's weighted sum of cached V rows. */
    void (*axpy_f16)(int n, float a, const hs_fp16 *x, float *y);
    /* fp32 -> fp16, round to nearest even: K/V rows into the cache. */
    void (*to_f16)(int n, const float *x, hs_fp16 *y);
    hs_gemm_fn gemm_q4_0, gemm_q4_1, gemm_q8_0;
    /* Optional packed layout (NULL: weights stay in the GGUF layout and dot/gemm read them).
     * When set, quantized weight rows are converted once at load by pack_row (same row bytes)
     * and read by mm_*, against activations quantized by quantize_packed into act_bytes(n)
     * bytes per row (64-byte multiple). */
    size_t (*act_bytes)(int n);
    void (*quantize_packed)(const float *x, void *y, int n);
    void (*pack_row)(int type, const void *src, void *dst, int cols);
    void (*unpack_row)(int type, const void *src, void *dst, int cols);
    hs_mm_fn mm_q4_0, mm_q4_1, mm_q8_0;
    hs_wide_fn wide_q4_0, wide_q4_1, wide_q8_0; /* optional */
} hs_kernels;

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
