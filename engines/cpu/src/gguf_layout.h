/* For variants that read weights in the GGUF layout as they are (reference, neon, dotprod,
 * i8mm): activations as block_q8a rows, and hs_mm_fn products built from the variant's two
 * kernels - a multi-row dot (NRC weight rows against one activation row) and, optionally, a
 * batched gemm (one weight row against up to four activation rows, each weight block unpacked
 * once for all of them). */
#ifndef HS_GGUF_LAYOUT_H
#define HS_GGUF_LAYOUT_H

#include "kernels.h"

typedef void (*hs_dot_fn)(int nb, const void *w, size_t stride, int nrows, const block_q8a *a,
                          float *out);
typedef void (*hs_gemm_fn)(int nb, const void *w, const block_q8a *a, size_t astride, int ncols,
                           float *out);

static inline size_t gguf_act_bytes(int n) { return (size_t)(n / HS_QK) * sizeof(block_q8a); }

static inline void gguf_mm(hs_dot_fn dot, hs_gemm_fn gemm, int nb, const void *w, size_t wstride,
                           int nrows, const void *a, size_t astride, int ncols, float *out,
                           size_t ostride) {
    float tmp[4];
    if (ncols == 1 || !gemm) {
        for (int c = 0; c < ncols; c++) {
            dot(nb, w, wstride, nrows, (const block_q8a *)((const char *)a + (size_t)c * astride), tmp);
            for (int r = 0; r < nrows; r++) out[(size_t)c * ostride + r] = tmp[r];
        }
        return;
    }
    for (int r = 0; r < nrows; r++) {
        gemm(nb, (const char *)w + (size_t)r * wstride, a, astride / sizeof(block_q8a), ncols, tmp);
        for (int c = 0; c < ncols; c++) out[(size_t)c * ostride + r] = tmp[c];
    }
}

#define GGUF_MM(NAME, DOT, GEMM)                                                                 \
    static void NAME(int nb, const void *w, size_t ws, int nrows, const void *a, size_t as,      \
                     int ncols, float *out, size_t os) {                                         \
        gguf_mm(DOT, GEMM, nb, w, ws, nrows, a, as, ncols, out, os);                             \
    }

/* The table of a GGUF-layout variant whose functions carry these names (the aarch64
 * variants); `GETTER` returns it. GGUF_LAYOUT_EXTRA: entries a variant adds
 * (defined before this file is included; none by default). */
#ifndef GGUF_LAYOUT_EXTRA
#define GGUF_LAYOUT_EXTRA
#endif
#ifndef GGUF_ATTEND_F16 /* the variant's attend_f16: attend.h's unless it names its own */
#define GGUF_ATTEND_F16 attend_f16
#endif
#define GGUF_LAYOUT_TABLE(NAME, GETTER)                                                          \
    static const hs_kernels table = {                                                           \
        .name = NAME, .act_bytes = gguf_act_bytes, .quantize_act = quantize_act,                 \
        .mm_q4_0 = mm_q4_0, .mm_q4_1 = mm_q4_1, .mm_q8_0 = mm_q8_0, .dot_f16 = dot_f16,           \
        .dot_f32 = dot_f32, .to_f16 = to_f16,                                                    \
        .attend_f16 = GGUF_ATTEND_F16, GGUF_LAYOUT_EXTRA                                         \
    };                                                                                           \
    const hs_kernels *GETTER(void) { return &table; }

#endif
