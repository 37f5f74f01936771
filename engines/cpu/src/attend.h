/* Decode-style attention of the query heads that share one KV head, over cached fp16 rows, with
 * an online softmax (running max and sum, as flash-decoding keeps them): each cached K and V row
 * is converted once for the whole group instead of once per query head. Included by each kernel
 * variant after it defines its two row primitives:
 *   dots_f16(hd, k, q, ng, out)    out[g] = q[g] . k for the ng query rows q (hd floats apart)
 *   axpys_f16(hd, v, w, ng, acc)   acc[g] += w[g] * v for the ng accumulators (hd floats apart)
 * or, defining HS_AXPYS_SPAN instead, axpys_span_f16: the same over a span's positions.
 */
#ifndef HS_ATTEND_H
#define HS_ATTEND_H

#include <math.h>

#include "kernels.h"

/* One query row's online-softmax step over a span's n scores (stride apart in s): scale them,
 * raise the running max m, rescale the running sum l and the accumulator acc (hd floats) to it,
 * turn the scores into their weights exp(score - max), add them to l in order. x86_common.h's
 * rows_span takes the same step for its rows. */
static inline void softmax_step(int hd, float *s, int stride, int n, float scale, float *m,
                                float *l, float *acc) {
    float max = *m;
    for (int p = 0; p < n; p++) {
        s[p * stride] *= scale;
        if (s[p * stride] > max) max = s[p * stride];
    }
    const float rescale = expf(*m - max); /* 0 on the first span (m = -inf) */
    if (rescale != 1.0f) {
        *l *= rescale;
        for (int d = 0; d < hd; d++) acc[d] *= rescale;
    }
    float sum = 0.0f;
#ifdef HS_EXPS /* the variant's glibc-exact vector expf (x86_common.h, AVX-512) */
    float e[HS_ATTN_SPAN];
    for (int p = 0; p < n; p++) e[p] = s[p * stride] - max;
    exps(e, n);
    for (int p = 0; p < n; p++) {
        s[p * stride] = e[p];
        sum += e[p];
    }
#else
    for (int p = 0; p < n; p++) {
        const float e = expf(s[p * stride] - max);
        s[p * stride] = e;
        sum += e;
    }
#endif
    *l += sum;
    *m = max;
}

static void attend_f16(int hd, int ng, float scale, const float *q, const hs_fp16 *const *k,
                       const hs_fp16 *const *v, int count, float *m, float *l, float *acc) {
    float s[HS_ATTN_SPAN * HS_ATTN_GROUP]; /* [position][head] */
    for (int p0 = 0; p0 < count; p0 += HS_ATTN_SPAN) {
        const int n = count - p0 < HS_ATTN_SPAN ? count - p0 : HS_ATTN_SPAN;
        for (int p = 0; p < n; p++) dots_f16(hd, k[p0 + p], q, ng, s + p * ng);
        for (int g = 0; g < ng; g++)
            softmax_step(hd, s + g, ng, n, scale, m + g, l + g, acc + (size_t)g * hd);
#ifdef HS_AXPYS_SPAN /* the variant's own loop over the span (x86_common.h) */
        axpys_span_f16(hd, v + p0, s, n, ng, acc);
#else
        for (int p = 0; p < n; p++) axpys_f16(hd, v[p0 + p], s + p * ng, ng, acc);
#endif
    }
}

#endif
