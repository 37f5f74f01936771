/* Standalone kernel test, no Python needed: every variant of this architecture that the CPU
 * grants against the reference, with the same tolerances as tests/unit/test_cpu_kernels.py, and
 * the pinned pool's threaded product against the single-threaded one. Run natively
 * (tests/e2e/test_native_kernels.py, and first on the device machine: device_cpu_bench.sh) and
 * cross-built for aarch64 under qemu-user (tests/e2e/test_arm_kernels.py).
 *
 * Output: a FAIL line per failed check; per variant of the architecture "variant NAME: N checks,
 * M failed" or "variant NAME: skipped (not granted by this CPU)" (AMX, say, where the CPU or the
 * kernel does not grant its tile state), so that a variant never passes by not running; then
 * "variants: ...; selected: ..." and "P passed, F failed, S skipped". Exit status 1 on a failure. */
#define _GNU_SOURCE /* sched_getaffinity's CPU_* macros */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kernels.h"
#include "model.h"
#include "threadpool.h"

#if defined(__x86_64__)
static const char *const names[] = {"reference", "avx2", "avx512vnni", "amx"};
#elif defined(__aarch64__)
static const char *const names[] = {"reference", "neon", "dotprod", "i8mm"};
#else
static const char *const names[] = {"reference"};
#endif
enum { NAMES = sizeof names / sizeof names[0] };
static int passed, failed, passed_by[NAMES], failed_by[NAMES];

static void check(int ok, const char *what, const char *variant) {
    int v = 0;
    while (v < NAMES - 1 && strcmp(names[v], variant) != 0) v++;
    if (ok) {
        passed++;
        passed_by[v]++;
    } else {
        failed++;
        failed_by[v]++;
        printf("FAIL %s [%s]\n", what, variant);
    }
}

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((float)((*s >> 8) & 0xffff) / 32768.0f) - 1.0f;
}

/* The larger error of two, a NaN kept once seen (fmaxf would drop it): an unwritten or
 * non-finite output then fails the check it feeds. */
static float worse(float worst, float e) { return e > worst || e != e ? e : worst; }

/* count cached K and V rows of hd random fp16 values in [-1, 1), and pointers to each row. */
static void random_kv(hs_fp16 *k, hs_fp16 *v, int count, int hd, const hs_fp16 **kp,
                      const hs_fp16 **vp, unsigned *seed) {
    for (int p = 0; p < count; p++) {
        for (int d = 0; d < hd; d++) {
            k[p * hd + d] = hs_fp32_to_fp16(frand(seed));
            v[p * hd + d] = hs_fp32_to_fp16(frand(seed));
        }
        kp[p] = k + p * hd;
        vp[p] = v + p * hd;
    }
}

/* attend_f16 of a variant against the reference: head widths with and without a SIMD tail (68
 * and 66), one to eight query heads, positions past one internal span (64), continued from a
 * first call as the engine continues over spans, scores close together and far apart. */
static void test_attend(const hs_kernels *k, const hs_kernels *ref, unsigned *seed) {
    enum { HD = 68, COUNT = 150, G = 8 };
    static hs_fp16 kv[2][COUNT][HD];
    static float q[G * HD];
    const hs_fp16 *kp[COUNT], *vp[COUNT];
    random_kv(&kv[0][0][0], &kv[1][0][0], COUNT, HD, kp, vp, seed);
    for (int i = 0; i < G * HD; i++) q[i] = 2.0f * frand(seed);
    const int widths[2] = {68, 66}, groups[3] = {1, 3, 8};
    const float scales[2] = {0.125f, 8.0f}; /* the second: scores hundreds apart, exp underflows */
    int ok = 1;
    for (int si = 0; si < 2; si++)
    for (int wi = 0; wi < 2; wi++)
        for (int gi = 0; gi < 3; gi++) {
            const int hd = widths[wi], ng = groups[gi];
            const float scale = scales[si];
            float m1[G], l1[G], a1[G * HD] = {0}, m2[G], l2[G], a2[G * HD] = {0};
            for (int g = 0; g < ng; g++) m1[g] = m2[g] = -INFINITY, l1[g] = l2[g] = 0.0f;
            /* 100 positions, then 50 more: the running max and sum carry over */
            k->attend_f16(hd, ng, scale, q, kp, vp, 100, m1, l1, a1);
            k->attend_f16(hd, ng, scale, q, kp + 100, vp + 100, COUNT - 100, m1, l1, a1);
            ref->attend_f16(hd, ng, scale, q, kp, vp, COUNT, m2, l2, a2);
            for (int g = 0; g < ng; g++) {
                ok &= fabsf(m1[g] - m2[g]) <= 1e-4f * (fabsf(m2[g]) + 1.0f);
                ok &= fabsf(l1[g] - l2[g]) <= 1e-4f * l2[g];
                for (int d = 0; d < hd; d++) /* outputs: weighted means of values in [-1, 1] */
                    ok &= fabsf(a1[g * hd + d] / l1[g] - a2[g * hd + d] / l2[g]) <= 1e-4f;
            }
        }
    check(ok, "attend_f16", k->name);
}

/* The arithmetic attend_f16 is held to (attend.h's loops; the exact KV hand-off's prefill
 * engine repeats it), one query row, stated in scalar C: per 64-position span, each score an
 * 8-lane fused dot over the head reduced as ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)), scaled;
 * the running max, the old state rescaled by expf(m - max), the weights expf(s - max) summed in
 * position order; acc += w * v fused, position by position. hd a multiple of 8. */
static void exact_attend(int hd, float scale, const float *q, const hs_fp16 *const *k,
                         const hs_fp16 *const *v, int count, float *m, float *l, float *acc) {
    for (int p0 = 0; p0 < count; p0 += 64) {
        const int n = count - p0 < 64 ? count - p0 : 64;
        float s[64], max = *m, sum = 0.0f;
        for (int p = 0; p < n; p++) {
            float a[8] = {0};
            for (int j = 0; j < hd; j += 8)
                for (int t = 0; t < 8; t++)
                    a[t] = fmaf(hs_fp16_to_fp32(k[p0 + p][j + t]), q[j + t], a[t]);
            s[p] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
            s[p] *= scale;
            if (s[p] > max) max = s[p];
        }
        const float rescale = expf(*m - max);
        if (rescale != 1.0f) {
            *l *= rescale;
            for (int d = 0; d < hd; d++) acc[d] *= rescale;
        }
        for (int p = 0; p < n; p++) {
            s[p] = expf(s[p] - max);
            sum += s[p];
        }
        *l += sum;
        *m = max;
        for (int p = 0; p < n; p++)
            for (int d = 0; d < hd; d++) acc[d] = fmaf(s[p], hs_fp16_to_fp32(v[p0 + p][d]), acc[d]);
    }
}

/* A variant that promises attend.h's bits (attend_exact): its attend_f16 (1 to 8 heads)
 * and/or attend_rows (1 to 16 rows whose limits fall anywhere in 1..count: inside and across the
 * 64-position spans, rows that stop spans early, limits out of row order; packed in two steps)
 * against exact_attend, every bit of m, l and acc: head widths 32 to 128, contexts of 1 to 256
 * positions, the state carried in from an earlier span or fresh, scores close and far apart. */
static void test_attend_exact(const hs_kernels *k, unsigned *seed) {
    enum { HD = 128, COUNT = 256, R = HS_ATTN_ROWS };
    static hs_fp16 kv[2][COUNT][HD];
    static float q[R][HD], acc[R][HD], want[R][HD];
    const hs_fp16 *kp[COUNT], *vp[COUNT];
    random_kv(&kv[0][0][0], &kv[1][0][0], COUNT, HD, kp, vp, seed);
    /* rows: x86's V tiles take them as evenly as they go, 4 at most (5: 2 + 3, 15: 3 + 4 x 3) */
    const int widths[3] = {32, 64, 128}, rows[6] = {1, 3, 5, 8, 15, R}, counts[5] = {1, 8, 63, 150, COUNT};
    const float scales[2] = {0.125f, 8.0f};
    int ok_f16 = 1, ok_rows = 1;
    for (int si = 0; si < 2; si++)
    for (int wi = 0; wi < 3; wi++)
    for (int ri = 0; ri < 6; ri++)
    for (int ci = 0; ci < 5; ci++)
    for (int carry = 0; carry < 2; carry++)
    for (int rows_call = 0; rows_call < 2; rows_call++) {
        const int hd = widths[wi], nq = rows[ri], count = counts[ci];
        if (rows_call ? !(k->attend_exact & HS_EXACT_ROWS)
                      : !(k->attend_exact & HS_EXACT_F16) || nq > HS_ATTN_GROUP)
            continue;
        const float *qs[R];
        float *as[R], m[R], l[R], m2[R], l2[R];
        int lim[R];
        for (int r = 0; r < nq; r++) {
            for (int d = 0; d < hd; d++) {
                q[r][d] = 2.0f * frand(seed);
                acc[r][d] = want[r][d] = carry ? frand(seed) : 0.0f;
            }
            qs[r] = q[r], as[r] = acc[r];
            m[r] = m2[r] = carry ? 2.0f * frand(seed) : -INFINITY;
            l[r] = l2[r] = carry ? 1.5f + frand(seed) : 0.0f;
            lim[r] = !rows_call || r == nq / 2 ? count
                   : 1 + (int)((frand(seed) + 1.0f) * 0.5f * (float)(count - 1));
        }
        if (rows_call) {
            const size_t bytes = (k->attend_bytes(hd, count) + 63) / 64 * 64;
            void *buf = aligned_alloc(64, bytes);
            memset(buf, 0xff, bytes); /* NaN fp16 wherever the packing leaves a hole */
            k->attend_pack(hd, kp, vp, 0, count > 40 ? 40 : count, buf);
            if (count > 40) k->attend_pack(hd, kp, vp, 40, count, buf);
            k->attend_rows(hd, nq, scales[si], qs, lim, buf, count, m, l, as);
            free(buf);
        } else { /* attend_f16's rows are hd floats apart */
            static float qg[HS_ATTN_GROUP * HD], ag[HS_ATTN_GROUP * HD];
            for (int r = 0; r < nq; r++) {
                memcpy(qg + r * hd, q[r], sizeof(float) * (size_t)hd);
                memcpy(ag + r * hd, acc[r], sizeof(float) * (size_t)hd);
            }
            k->attend_f16(hd, nq, scales[si], qg, kp, vp, count, m, l, ag);
            for (int r = 0; r < nq; r++) memcpy(acc[r], ag + r * hd, sizeof(float) * (size_t)hd);
        }
        int ok = 1;
        for (int r = 0; r < nq; r++) {
            exact_attend(hd, scales[si], q[r], kp, vp, lim[r], &m2[r], &l2[r], want[r]);
            ok &= memcmp(&m[r], &m2[r], sizeof(float)) == 0 && memcmp(&l[r], &l2[r], sizeof(float)) == 0;
            ok &= memcmp(acc[r], want[r], sizeof(float) * (size_t)hd) == 0;
        }
        if (rows_call) ok_rows &= ok;
        else ok_f16 &= ok;
    }
    if (k->attend_exact & HS_EXACT_F16) check(ok_f16, "attend_f16: attend.h's bits", k->name);
    if (k->attend_exact & HS_EXACT_ROWS) check(ok_rows, "attend_rows: attend.h's bits", k->name);
}

/* attend_pack + attend_rows against the reference's attend_f16, row by row: head widths of 64
 * and 128, 3 to 16 rows each attending its own number of positions (1 to 150: partial 32-position
 * blocks, rows that stop early; packed in two steps), scores close together and hundreds apart.
 * amx computes the scores from bf16 hi + lo parts and P V in bf16. The row maximum's bound is
 * derived, not measured, relative to sum_d |scale q_d k_d| (the score with every term
 * positive), bf16's unit roundoff being 2^-8 and fp32's 2^-24:
 * - q x scale: one rounding on each side (2^-24 each);
 * - q's hi + lo split leaves at most 2^-8 x 2^-8 = 2^-16 of q; the fp16 keys split exactly;
 * - the tiles sum hi hi + hi lo + lo hi and drop lo lo: at most 2^-16 more;
 * - bf16 x bf16 products are exact in fp32; the tiles' fp32 sums of 3 hd of them add at most
 *   3 hd 2^-24, the reference's dot of hd (products and sums rounded, no FMA) gamma_hd, about
 *   hd 2^-24; the spare hd 2^-24 covers the second-order terms (lo up to 2^-8 (1 + 2^-8) of q,
 *   the tiles' sums relative to their own slightly larger terms, gamma's 1 / (1 - n u)).
 * So 2^-15 + (5 hd + 2) 2^-24 of it. A split that drops q's or k's low part errs by about 2^-9.
 * The sum and the outputs keep measured bounds (sum within 1.4e-4 relative, outputs, weighted
 * means of values in [-1, 1], within 2.4e-3): 5e-4 and 4e-3. A NaN anywhere fails (worse()). */
static void test_attend_rows(const hs_kernels *k, const hs_kernels *ref, unsigned *seed) {
    enum { HD = 128, COUNT = 150, R = HS_ATTN_ROWS };
    static hs_fp16 kv[2][COUNT][HD];
    static float q[R][HD], acc[R][HD];
    const hs_fp16 *kp[COUNT], *vp[COUNT];
    random_kv(&kv[0][0][0], &kv[1][0][0], COUNT, HD, kp, vp, seed);
    const int widths[2] = {64, 128}, rows[3] = {3, 12, R}, counts[3] = {1, 17, COUNT};
    const float scales[2] = {0.125f, 8.0f};
    float worst[3] = {0}; /* max score (a fraction of its bound), sum, output */
    for (int si = 0; si < 2; si++)
    for (int wi = 0; wi < 2; wi++)
    for (int ri = 0; ri < 3; ri++)
    for (int ci = 0; ci < 3; ci++) {
        const int hd = widths[wi], nq = rows[ri], count = counts[ci];
        const float *qs[R];
        float *as[R], m[R], l[R];
        int lim[R];
        for (int r = 0; r < nq; r++) {
            for (int d = 0; d < hd; d++) q[r][d] = 2.0f * frand(seed), acc[r][d] = 0.0f;
            qs[r] = q[r], as[r] = acc[r], m[r] = -INFINITY, l[r] = 0.0f;
            lim[r] = r == 0 ? count : 1 + (int)((frand(seed) + 1.0f) * 0.5f * (float)(count - 1));
        }
        /* packed in two steps where the context grows past 40 positions, as the engine does */
        void *buf = aligned_alloc(64, (k->attend_bytes(hd, count) + 63) / 64 * 64);
        k->attend_pack(hd, kp, vp, 0, count > 40 ? 40 : count, buf);
        if (count > 40) k->attend_pack(hd, kp, vp, 40, count, buf);
        k->attend_rows(hd, nq, scales[si], qs, lim, buf, count, m, l, as);
        free(buf);
        for (int r = 0; r < nq; r++) {
            float m2 = -INFINITY, l2 = 0.0f, a2[HD] = {0};
            ref->attend_f16(hd, 1, scales[si], q[r], kp, vp, lim[r], &m2, &l2, a2);
            double terms = 0; /* the largest sum_d |scale q_d k_d| over the row's positions */
            for (int p = 0; p < lim[r]; p++) {
                double t = 0;
                for (int d = 0; d < hd; d++) t += fabs((double)q[r][d] * hs_fp16_to_fp32(kp[p][d]));
                terms = fmax(terms, t * fabsf(scales[si]));
            }
            const double bound = terms * (ldexp(1, -15) + (5.0 * hd + 2) * ldexp(1, -24));
            worst[0] = worse(worst[0], (float)(fabs((double)m[r] - m2) / bound));
            worst[1] = worse(worst[1], fabsf(l[r] - l2) / l2);
            for (int d = 0; d < hd; d++)
                worst[2] = worse(worst[2], fabsf(acc[r][d] / l[r] - a2[d] / l2));
        }
    }
    if (getenv("HS_KT_VERBOSE")) printf("attend_rows worst: score %g sum %g out %g\n", worst[0], worst[1], worst[2]);
    check(worst[0] <= 1.0f && worst[1] <= 5e-4f && worst[2] <= 4e-3f, "attend_rows", k->name);
}

/* The matrix-unit products (k->wide: bf16 weights and activations, fp32 sums) of weights of
 * `type` against the float product of the dequantized weights: their error must be below that
 * of the reference's 8-bit activations (measured: about half of it, rms and worst), every output
 * finite. Shapes: partial weight strips (36, 50 rows), partial activation pairs and groups (50,
 * 130 rows), one K block (544 columns) and several (3104: 97 chunks, four blocks). */
/* rows x cols weights w as `type` rows (hs_row_bytes apart, malloc'd): q8_0 and q4_0 quantized
 * from w, q4_1 with random nibbles, scales and minimums (drawn from seed). */
static char *quantized_rows(int type, const float *w, int rows, int cols, unsigned *seed) {
    const size_t rb = hs_row_bytes(type, cols);
    char *q = malloc(rb * rows);
    for (int r = 0; r < rows; r++) {
        if (type == HS_Q8_0) hs_quantize_row_q8_0(w + r * cols, (block_q8_0 *)(q + r * rb), cols);
        if (type == HS_Q4_0) hs_quantize_row_q4_0(w + r * cols, (block_q4_0 *)(q + r * rb), cols);
        if (type == HS_Q4_1) {
            block_q4_1 *b = (block_q4_1 *)(q + r * rb);
            for (int j = 0; j < cols / HS_QK; j++) {
                b[j].d = hs_fp32_to_fp16(0.05f + 0.05f * frand(seed));
                b[j].m = hs_fp32_to_fp16(-0.4f + 0.2f * frand(seed));
                for (int e = 0; e < HS_QK / 2; e++) b[j].qs[e] = (uint8_t)(*seed = *seed * 1103515245u + 12345u) >> 3;
            }
        }
    }
    return q;
}

/* The packed x86 products' arithmetic (avx512vnni, and amx's register tiles under model.c's
 * WIDE8_MIN rows), which the exact KV hand-off repeats (prefill/exact.py): block b = 16 g + j of
 * a row is lane j of group g; its integer product (exact, however a kernel sums it) is
 * converted, times the activation's scale (rounded), then fused with the weight's scale into
 * lane j, group after group (q4_1: its minimum term fused after each); a lane past the row's
 * last block adds +0; then the 16 lanes are summed by _mm512_reduce_add_ps's tree (GCC's: lane
 * i + lane i + 8, then i + 4, then (0 + 2) + (1 + 3)). One weight row (GGUF blocks) x one
 * activation row (block_q8a, the reference's quantization: the same as the packed one). */
static float exact_packed_dot(int type, const char *row, int nb, const block_q8a *a) {
    float lane[16] = {0};
    for (int g = 0; g * 16 < nb; g++)
        for (int j = 0; j < 16; j++) {
            const int b = 16 * g + j;
            if (b >= nb) {
                lane[j] += 0.0f;
                continue;
            }
            int isum = 0;
            float dw, mw = 0.0f;
            if (type == HS_Q8_0) {
                const block_q8_0 *w = (const block_q8_0 *)row + b;
                for (int e = 0; e < HS_QK; e++) isum += w->qs[e] * a[b].qs[e];
                dw = hs_fp16_to_fp32(w->d);
            } else {
                const uint8_t *qs = type == HS_Q4_0 ? ((const block_q4_0 *)row)[b].qs
                                                    : ((const block_q4_1 *)row)[b].qs;
                const int bias = type == HS_Q4_0 ? 8 : 0;
                for (int e = 0; e < HS_QK / 2; e++)
                    isum += ((qs[e] & 0xf) - bias) * a[b].qs[e] + ((qs[e] >> 4) - bias) * a[b].qs[e + 16];
                if (type == HS_Q4_0) {
                    dw = hs_fp16_to_fp32(((const block_q4_0 *)row)[b].d);
                } else {
                    dw = hs_fp16_to_fp32(((const block_q4_1 *)row)[b].d);
                    mw = hs_fp16_to_fp32(((const block_q4_1 *)row)[b].m);
                }
            }
            const float x = (float)isum * a[b].d;
            lane[j] = fmaf(x, dw, lane[j]);
            if (type == HS_Q4_1) lane[j] = fmaf(mw, a[b].s, lane[j]);
        }
    float h[8], q[4];
    for (int i = 0; i < 8; i++) h[i] = lane[i] + lane[i + 8];
    for (int i = 0; i < 4; i++) q[i] = h[i] + h[i + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

static void test_wide(const hs_kernels *k, hs_pool *pool, unsigned *seed) {
    const int shapes[][3] = {{36, 544, 50}, {50, 3104, 130}, {16, 1056, 64}};
    const int types[] = {HS_Q8_0, HS_Q4_0, HS_Q4_1};
    for (int si = 0; si < 3; si++) {
        const int rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
        if (n < hs_wide_min_rows()) continue;
        float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
        float *exact = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
        float *viaref = malloc(sizeof(float) * n * rows), *deq = malloc(sizeof(float) * cols);
        for (int i = 0; i < rows * cols; i++) w[i] = frand(seed);
        for (int i = 0; i < n * cols; i++) x[i] = frand(seed);
        for (int ti = 0; ti < 3; ti++) {
            const int type = types[ti];
            const size_t rb = hs_row_bytes(type, cols);
            char *q = quantized_rows(type, w, rows, cols, seed);
            double scale = 0;
            for (int r = 0; r < rows; r++) {
                hs_dequantize_row(type, q + r * rb, deq, cols);
                for (int c = 0; c < n; c++) {
                    double sum = 0;
                    for (int j = 0; j < cols; j++) sum += (double)deq[j] * x[c * cols + j];
                    exact[c * rows + r] = (float)sum;
                    scale = fmax(scale, fabs(sum));
                }
            }
            hs_mat mat = {type, rows, cols, rb, q};
            hs_matmul(pool, k, 0, &mat, n, x, got);
            hs_matmul(pool, &hs_kernels_ref, 0, &mat, n, x, viaref);
            double rms = 0, rms_ref = 0, worst = 0, worst_ref = 0;
            int finite = 1;
            for (int i = 0; i < n * rows; i++) {
                const double a = fabs(got[i] - exact[i]), b = fabs(viaref[i] - exact[i]);
                finite &= isfinite(got[i]);
                rms += a * a, rms_ref += b * b;
                worst = fmax(worst, a), worst_ref = fmax(worst_ref, b);
            }
            char what[96];
            snprintf(what, sizeof what, "wide product type %d, %d x %d x %d", type, rows, cols, n);
            check(finite && rms < rms_ref && worst < worst_ref, what, k->name);
            free(q);
        }
        free(w); free(x); free(exact); free(got); free(viaref); free(deq);
    }
}

/* Products of rows whose last group of 16 blocks (the packed x86 layout's) is partial in
 * other ways than main's 17 blocks (16 + 1, the one-vector tail): 18 blocks (16 + 2,
 * SmolLM2's), 22 (16 + 6: masked loads with q8_0's chunks side by side) and 29 (16 + 13),
 * narrow rows (2 x 4 register tiles), 37 (32 + 5: wide rows, 4 x 2 tiles; amx's 2 x 4), and
 * amx's 1 x 8 tiles in spans of 4 groups from 64 blocks on: 70 (a span, then a partial group of
 * 6 alone), 100 (a span, then 2 groups and the one-vector tail of 4), 130 (two spans, then the
 * tail of 2 alone) and 200 (three spans, then a partial group of 8), at 1, 6, 8, 13 and 21
 * activation rows (amx: 8 is 1 x 8 tiles from 64 blocks on and 4 + 4 under, 13 that and then
 * 4 + 1, 21 the int8 tile unit's 16 (HS_WIDE8_MIN) and then 4 + 1 on the register tiles),
 * against the reference with main's tolerance; and avx512vnni, and amx under HS_WIDE8_MIN rows
 * (all on the register tiles), against every bit of the packed arithmetic. */
static void test_partial_groups(hs_pool *const pools[2], unsigned *seed) {
    enum { N = 21 };
    const int widths[] = {18 * HS_QK, 22 * HS_QK, 29 * HS_QK, 37 * HS_QK, 70 * HS_QK,
                          100 * HS_QK, 130 * HS_QK, 200 * HS_QK};
    const int types[] = {HS_Q8_0, HS_Q4_0, HS_Q4_1};
    /* 36-39 weight rows on one thread (the last product has 4, 3, 2 or 1 rows) and on three
     * (split by 4 for narrow rows, by 1 for wide ones): every register tile shape, against 1-8
     * activation rows a product */
    for (int pi = 0; pi < 2; pi++)
    for (int ri = 0; ri < 4; ri++)
    for (int wi = 0; wi < 8; wi++) {
        hs_pool *pool = pools[pi];
        const int cols = widths[wi], R = 36 + ri;
        float *w = malloc(sizeof(float) * R * cols), *x = malloc(sizeof(float) * N * cols);
        float *expect = malloc(sizeof(float) * N * R), *got = malloc(sizeof(float) * N * R);
        for (int i = 0; i < R * cols; i++) w[i] = frand(seed);
        for (int i = 0; i < N * cols; i++) x[i] = frand(seed);
        for (int ti = 0; ti < 3; ti++) {
            const int type = types[ti];
            const size_t rb = hs_row_bytes(type, cols);
            char *q = quantized_rows(type, w, R, cols, seed);
            hs_mat mat = {type, R, cols, rb, q};
            for (int v = 0; v < NAMES; v++) {
                const hs_kernels *k = hs_kernels_by_name(names[v]);
                if (!k) continue;
                const int batches[] = {1, 6, 8, 13, N};
                for (int bi = 0; bi < 5; bi++) {
                    const int n = batches[bi];
                    if (k->wide && n >= hs_wide_min_rows()) continue;
                    hs_matmul(pool, &hs_kernels_ref, 1, &mat, n, x, expect);
                    memset(got, 0xff, sizeof(float) * N * R); /* NaN: an output left unwritten fails */
                    hs_matmul(pool, k, 0, &mat, n, x, got);
                    float scale = 0, worst = 0;
                    for (int i = 0; i < n * R; i++) scale = fmaxf(scale, fabsf(expect[i]));
                    for (int i = 0; i < n * R; i++)
                        worst = worse(worst, fabsf(got[i] - expect[i]) / (1e-4f * scale + 1e-4f * fabsf(expect[i])));
                    char what[96];
                    snprintf(what, sizeof what, "matmul type %d, %d x %d blocks, %d rows", type, R,
                             cols / HS_QK, n);
                    check(worst <= 1.0f, what, k->name);
                    if (strcmp(k->name, "avx512vnni") == 0 ||
                        (strcmp(k->name, "amx") == 0 && n < HS_WIDE8_MIN)) {
                        /* every bit of the packed arithmetic (exact_packed_dot) */
                        const int nb = cols / HS_QK;
                        block_q8a *a = malloc(sizeof(block_q8a) * nb);
                        int same = 1;
                        for (int c = 0; c < n; c++) {
                            hs_kernels_ref.quantize_act(x + (size_t)c * cols, a, cols);
                            for (int r = 0; r < R; r++) {
                                const float e = exact_packed_dot(type, q + r * rb, nb, a);
                                same &= memcmp(&e, &got[c * R + r], sizeof e) == 0;
                            }
                        }
                        free(a);
                        snprintf(what, sizeof what, "matmul type %d, %d x %d blocks, %d rows: "
                                 "the packed arithmetic's bits", type, R, cols / HS_QK, n);
                        check(same, what, k->name);
                    }
                }
            }
            free(q);
        }
        free(w); free(x); free(expect); free(got);
    }
}

/* The int8 tile products (wide8_*) of a matrix taken in pieces, as model.c's work stealing
 * takes them: the first call converts the activation rows, the later ones pass NULL and use
 * that conversion - every bit the same as one call over all the rows (20 weight rows: a strip
 * of 16 and one of 4 taken last; 37 activation rows: two groups of 16, the 5 left to the
 * caller). A NULL call whose thread converted fewer rows than it asks for computes none. */
static void test_wide8_pieces(unsigned *seed) {
    enum { R = 52, N = 37, COLS = 18 * HS_QK };
    const int types[] = {HS_Q8_0, HS_Q4_0, HS_Q4_1};
    for (int v = 0; v < NAMES; v++) {
        const hs_kernels *k = hs_kernels_by_name(names[v]);
        if (!k || !k->wide8_q4_0) continue;
        float *w = malloc(sizeof(float) * R * COLS), *x = malloc(sizeof(float) * N * COLS);
        for (int i = 0; i < R * COLS; i++) w[i] = frand(seed);
        for (int i = 0; i < N * COLS; i++) x[i] = frand(seed);
        const size_t as = k->act_bytes(COLS);
        char *a = aligned_alloc(64, (as * N + 63) / 64 * 64);
        for (int c = 0; c < N; c++) k->quantize_act(x + (size_t)c * COLS, a + (size_t)c * as, COLS);
        for (int ti = 0; ti < 3; ti++) {
            const int type = types[ti], nb = COLS / HS_QK;
            const size_t rb = hs_row_bytes(type, COLS);
            char *q = quantized_rows(type, w, R, COLS, seed), *packed = malloc(rb * R);
            for (int r = 0; r < R; r++)
                if (k->pack_row) k->pack_row(type, q + r * rb, packed + r * rb, COLS);
                else memcpy(packed + r * rb, q + r * rb, rb);
            hs_wide8_fn f = type == HS_Q4_0 ? k->wide8_q4_0 : type == HS_Q4_1 ? k->wide8_q4_1
                          : k->wide8_q8_0;
            float whole[N * R], pieces[N * R];
            memset(whole, 0xff, sizeof whole);
            memset(pieces, 0xff, sizeof pieces);
            const int done = f(nb, packed, rb, R, a, as, N, whole, R);
            /* rows 32-51 first (converting), then 0-15 and 16-31 on that conversion */
            const int d0 = f(nb, packed + 32 * rb, rb, 20, a, as, N, pieces + 32, R);
            const int d1 = f(nb, packed, rb, 16, NULL, 0, N, pieces, R);
            const int d2 = f(nb, packed + 16 * rb, rb, 16, NULL, 0, N, pieces + 16, R);
            int same = done == 32 && d0 == done && d1 == done && d2 == done;
            for (int c = 0; same && c < done; c++)
                same &= memcmp(whole + c * R, pieces + c * R, sizeof(float) * R) == 0;
            char what[96];
            snprintf(what, sizeof what, "wide8 type %d in pieces (the activations converted once)", type);
            check(same, what, k->name);
            /* more rows of activations than the last conversion held: none computed */
            const int more = f(nb * 2, packed, rb / 2, 16, NULL, 0, N, pieces, R);
            snprintf(what, sizeof what, "wide8 type %d: NULL past the last conversion", type);
            check(more == 0, what, k->name);
            free(q);
            free(packed);
        }
        free(w); free(x); free(a);
    }
}

/* The pool (threadpool.c): every run reaches every thread once, and what its threads wrote is
 * seen by the caller when hs_pool_run returns; with the default spin and with none
 * (HETEROSERVE_POOL_SPIN_US=0: every wait parks on a futex, the caller's and the workers'), and
 * with one thread in some runs slow enough (0.2-2 ms) that the caller stops spinning and parks.
 * A lost wake-up hangs the test (the e2e test's timeout fails it); a worker that says it is
 * done before its task ran fails the check or crashes it. */
typedef struct {
    int run, writes[8 * 16];
} pool_probe;

static void pool_probe_task(void *p, int ith, int nth) {
    pool_probe *t = p;
    if (t->run % 7 == 3 && ith == t->run % nth) { /* a slow thread: the caller's spin runs out */
        struct timespec d = {0, 200000L * (1 + t->run % 10)};
        nanosleep(&d, NULL);
    }
    t->writes[ith * 16] = t->run; /* a line each: what the caller checks after the run */
}

static void test_pool(void) {
    const char *set = getenv("HETEROSERVE_POOL_SPIN_US");
    char *user = set ? strdup(set) : NULL; /* the caller's setting, put back after */
    for (int spin = 0; spin < 2; spin++) {
        if (spin == 0) setenv("HETEROSERVE_POOL_SPIN_US", "0", 1);
        else unsetenv("HETEROSERVE_POOL_SPIN_US");
        hs_pool *pool = hs_pool_create(8, NULL, 0);
        check(pool != NULL, "pool: 8 threads created", "reference");
        if (!pool) continue;
        pool_probe probe;
        memset(&probe, 0, sizeof probe);
        int missed = 0;
        for (int run = 1; run <= 400; run++) {
            probe.run = run;
            hs_pool_run(pool, pool_probe_task, &probe);
            for (int i = 0; i < 8; i++) missed += probe.writes[i * 16] != run;
        }
        hs_pool_destroy(pool);
        check(missed == 0, spin ? "pool: 400 runs on 8 threads, default spin"
                                : "pool: 400 runs on 8 threads, every wait parked", "reference");
    }
    if (user) setenv("HETEROSERVE_POOL_SPIN_US", user, 1);
    else unsetenv("HETEROSERVE_POOL_SPIN_US");
    free(user);
}

/* The pool's long spin (threadpool.c), counted by hs_pool_parks over gaps between two tasks, the
 * caller pinned to one CPU and the worker to another:
 * - with the defaults, a worker whose core nobody else wants spins through 1 ms gaps (longer than
 *   the 200 us spin) instead of parking, and parks in each of them without the long spin
 *   (HETEROSERVE_POOL_SPIN_ALONE_US=0); gaps in which something else took the worker's core (its
 *   involuntary switches, recorded by its task, grew over it or the gap before) may park either
 *   way and are left out;
 * - beside a busy thread pinned to the worker's CPU, with a 50 ms long spin and 10 ms gaps, the
 *   worker parks once the busy thread has taken its core (a time slice of a few ms), where a long
 *   spin blind to it would sit through every gap. */
enum { SPIN_GAPS = 40 };

typedef struct {
    int run;
    long preempted[SPIN_GAPS + 1]; /* the worker's involuntary switches, recorded in each run */
} spin_probe;

static void spin_probe_task(void *p, int ith, int nth) {
    (void)nth;
    spin_probe *t = p;
    struct rusage ru;
    if (ith == 1 && getrusage(RUSAGE_THREAD, &ru) == 0) t->preempted[t->run] = ru.ru_nivcsw;
}

typedef struct {
    int cpu;
    volatile int stop;
} busy_arg;

static void *busy_loop(void *p) { /* pinned to its CPU until told to stop */
    busy_arg *b = p;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(b->cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
    while (!b->stop) {
    }
    return NULL;
}

static void test_pool_spin_alone(void) {
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) < 2) {
        printf("pool long spin: not checked (one CPU)\n");
        return;
    }
    int cpus[2], k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &mine)) cpus[k++] = c;
    static const char *const vars[2] = {"HETEROSERVE_POOL_SPIN_US", "HETEROSERVE_POOL_SPIN_ALONE_US"};
    static const struct {
        const char *spin, *alone; /* NULL: unset (the default) */
        long gap_ns;
        int busy;
        const char *what;
    } cases[] = {
        {"200", "0", 1000000L, 0, "without the long spin"},
        {NULL, NULL, 1000000L, 0, "with the long spin (the defaults)"},
        {"200", "50000", 10000000L, 1, "beside a busy thread, a 50 ms long spin"},
    };
    char *user[2];
    for (int i = 0; i < 2; i++) user[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
    for (int c = 0; c < 3; c++) {
        const char *values[2] = {cases[c].spin, cases[c].alone};
        for (int i = 0; i < 2; i++) {
            if (values[i]) setenv(vars[i], values[i], 1);
            else unsetenv(vars[i]);
        }
        busy_arg busy = {cpus[1], 0};
        pthread_t busy_thread;
        if (cases[c].busy && pthread_create(&busy_thread, NULL, busy_loop, &busy) != 0) continue;
        hs_pool *pool = hs_pool_create(2, cpus, 1);
        check(pool != NULL, "pool: 2 pinned threads created", "reference");
        int calm = 0, calm_parked = 0, parked = 0;
        if (pool) {
            spin_probe probe;
            memset(&probe, 0, sizeof probe);
            hs_pool_run(pool, spin_probe_task, &probe);
            for (int run = 1; run <= SPIN_GAPS; run++) {
                const unsigned long long before = hs_pool_parks(pool);
                struct timespec gap = {0, cases[c].gap_ns};
                nanosleep(&gap, NULL);
                probe.run = run;
                hs_pool_run(pool, spin_probe_task, &probe);
                const int p = hs_pool_parks(pool) != before;
                parked += p;
                /* the pool compares with what the worker saw when its previous wait's spin ran
             * out, in the gap before: calm means no switch over both gaps */
            if (run >= 2 && probe.preempted[run] == probe.preempted[run - 2]) {
                    calm++;
                    calm_parked += p;
                }
            }
            hs_pool_destroy(pool);
        }
        if (cases[c].busy) {
            busy.stop = 1;
            pthread_join(busy_thread, NULL);
        }
        if (!pool) continue;
        printf("pool %s: parked in %d of %d gaps (%d of the %d in which the worker had its core)\n",
               cases[c].what, parked, SPIN_GAPS, calm_parked, calm);
        if (cases[c].busy) {
            check(parked >= SPIN_GAPS / 2, "pool: a worker whose core another thread took parks",
                  "reference");
        } else if (calm < SPIN_GAPS / 4) {
            printf("pool %s: not checked (the worker's core was taken in %d gaps of %d)\n",
                   cases[c].what, SPIN_GAPS - calm, SPIN_GAPS);
        } else if (cases[c].alone) {
            check(calm_parked >= calm - 2, "pool: without the long spin a worker parks in 1 ms gaps",
                  "reference");
        } else {
            check(calm_parked <= 2, "pool: a worker alone on its core spins through 1 ms gaps",
                  "reference");
        }
    }
    for (int i = 0; i < 2; i++) {
        if (user[i]) setenv(vars[i], user[i], 1);
        else unsetenv(vars[i]);
        free(user[i]);
    }
    sched_setaffinity(0, sizeof mine, &mine); /* hs_pool_create pinned this thread */
}

int main(void) {
    /* 544 columns: 17 blocks, a partial group for the packed x86 layout (and an odd count for
     * amx's int8 tile pipeline); 1, 3, 6, 21 and 40 activation rows: the one-row products, an
     * odd column, a second column tile, five 4-row tiles with one row left over (amx: a group
     * of 16 on the int8 tile unit, from HS_WIDE8_MIN, and 4 + 1), and two groups of 16 with 8 left
     * (on a variant with a matrix unit, from hs_wide_min_rows() rows on, test_wide's instead);
     * 36 weight rows: nine 4-row tiles, two full 16-row strips and a partial one. */
    enum { ROWS = 36, COLS = 544, N = 40 };
    unsigned seed = 42;
    float *w = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * N * COLS);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = frand(&seed);
    /* the rows past the first 21 from a seed of their own: the later tests' data (their bounds
     * come from measured errors) stays what it was before those rows were added */
    unsigned more = 7;
    for (int i = 0; i < N * COLS; i++) x[i] = frand(i < 21 * COLS ? &seed : &more);
    block_q8_0 *w8 = malloc(sizeof(block_q8_0) * ROWS * COLS / HS_QK);
    block_q4_0 *w4 = malloc(sizeof(block_q4_0) * ROWS * COLS / HS_QK);
    block_q4_1 *w41 = malloc(sizeof(block_q4_1) * ROWS * COLS / HS_QK);
    for (int r = 0; r < ROWS; r++) {
        hs_quantize_row_q8_0(w + r * COLS, w8 + r * COLS / HS_QK, COLS);
        hs_quantize_row_q4_0(w + r * COLS, w4 + r * COLS / HS_QK, COLS);
    }
    for (int b = 0; b < ROWS * COLS / HS_QK; b++) { /* q4_1: random nibbles, scale and minimum */
        w41[b].d = hs_fp32_to_fp16(0.05f + 0.05f * frand(&seed));
        w41[b].m = hs_fp32_to_fp16(-0.4f + 0.2f * frand(&seed));
        for (int j = 0; j < HS_QK / 2; j++) w41[b].qs[j] = (uint8_t)(seed = seed * 1103515245u + 12345u) >> 3;
    }
    /* q4_0 and q8_0 dequantize back close to the floats. */
    float row[COLS];
    hs_dequantize_row(HS_Q8_0, w8, row, COLS);
    float err = 0;
    for (int j = 0; j < COLS; j++) err = fmaxf(err, fabsf(row[j] - w[j]));
    check(err < 1.0f / 127 + 1e-3f, "q8_0 round trip", "reference");

    test_pool();
    test_pool_spin_alone();
    unsigned pieces_seed = 11; /* (its own: the later tests' data stays as it was) */
    test_wide8_pieces(&pieces_seed);
    hs_pool *one = hs_pool_create(1, NULL, 0), *three = hs_pool_create(3, NULL, 0);
    const hs_kernels *ref = &hs_kernels_ref;
    const int types[] = {HS_Q8_0, HS_Q4_0, HS_Q4_1}, batches[] = {1, 3, 6, 21, N};
    const char *what[] = {"matmul q8_0", "matmul q4_0", "matmul q4_1"};
    void *datas[] = {w8, w4, w41};
    for (int t = 0; t < 3; t++) {
        hs_mat mat = {types[t], ROWS, COLS, hs_row_bytes(types[t], COLS), datas[t]};
        float expect[N * ROWS], got[N * ROWS];
        for (int v = 0; v < NAMES; v++) {
            const hs_kernels *k = hs_kernels_by_name(names[v]);
            if (!k) continue;
            for (int bi = 0; bi < 5; bi++) {
                const int n = batches[bi];
                if (k->wide && n >= hs_wide_min_rows()) continue; /* test_wide's, below */
                hs_matmul(one, ref, 1, &mat, n, x, expect);
                float scale = 0;
                for (int i = 0; i < n * ROWS; i++) scale = fmaxf(scale, fabsf(expect[i]));
                for (int nrc = 1; nrc <= 4; nrc *= 2) {
                    memset(got, 0xff, sizeof got); /* NaN: an output left unwritten fails */
                    hs_matmul(three, k, nrc, &mat, n, x, got);
                    float worst = 0;
                    for (int i = 0; i < n * ROWS; i++)
                        worst = worse(worst, fabsf(got[i] - expect[i]) / (1e-4f * scale + 1e-4f * fabsf(expect[i])));
                    check(worst <= 1.0f, what[t], k->name);
                }
            }
        }
        for (int v = 0; v < NAMES; v++) {
            const hs_kernels *k = hs_kernels_by_name(names[v]);
            if (!k || t) continue;
            hs_fp16 h16[COLS], r16[COLS];
            k->to_f16(COLS, w, h16);
            ref->to_f16(COLS, w, r16);
            check(memcmp(h16, r16, sizeof h16) == 0, "to_f16", k->name);
            hs_fp16 h[COLS];
            for (int j = 0; j < COLS; j++) h[j] = hs_fp32_to_fp16(w[j]);
            const float a = k->dot_f16(COLS, h, x), b = ref->dot_f16(COLS, h, x);
            check(fabsf(a - b) <= 1e-3f * (fabsf(b) + 1.0f), "dot_f16", k->name);
            /* One cached position: the output is its V row, every element of it. Its weight is
             * exp(0) = 1 and fp16 -> fp32 is exact, so only the kernel's exp may be off, by a
             * few ulp: 1e-6 relative to each element. */
            float y[COLS] = {0}, m = -INFINITY, l = 0;
            const hs_fp16 *row = h;
            k->attend_f16(COLS, 1, 0.1f, x, &row, &row, 1, &m, &l, y);
            int same = fabsf(l - 1.0f) <= 1e-6f;
            for (int j = 0; j < COLS; j++) {
                const float v = hs_fp16_to_fp32(h[j]);
                same &= fabsf(y[j] / l - v) <= 1e-6f * fabsf(v);
            }
            check(same, "attend_f16: one V row", k->name);
            test_attend(k, ref, &seed);
            if (k->wide) test_wide(k, three, &seed);
            if (k->attend_rows) test_attend_rows(k, ref, &seed);
            if (k->attend_exact) test_attend_exact(k, &seed);
            /* against the scalar formula: gates from -40 to 40 and beyond expf's range, a tail
             * of 7; swiglu bit for bit (the exact hand-off's), swiglu_wide within 1e-5 (its own
             * draws: the tests after it see the same data whichever entries a variant has) */
            unsigned sw_seed = 97;
            for (int wide = 0; wide < 2; wide++) {
                void (*fn)(size_t, float *, const float *) = wide ? k->swiglu_wide : k->swiglu;
                if (!fn) continue;
                enum { SN = 1031 };
                float g[SN], u[SN], want[SN], worst = 0;
                for (int j = 0; j < SN; j++) {
                    g[j] = (j % 97 == 5 ? 4000.0f : 40.0f) * frand(&sw_seed), u[j] = frand(&sw_seed);
                    if (j % 101 == 7) /* signed zeros, infinities, NaN, expf's denormal results */
                        g[j] = (const float[]){-0.0f, 0.0f, INFINITY, -INFINITY, NAN, 95.0f,
                                               -95.0f, 88.5f, 103.0f, -100.0f}[j / 101 % 10];
                    want[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
                }
                fn(SN, g, u);
                int same = 1;
                for (int j = 0; j < SN; j++) {
                    if (isfinite(want[j]))
                        worst = worse(worst, fabsf(g[j] - want[j]) / (fabsf(want[j]) + 1e-30f));
                    else /* inf and NaN as the formula's */
                        worst = worse(worst, isnan(want[j]) ? (isnan(g[j]) ? 0.0f : NAN)
                                                            : (g[j] == want[j] ? 0.0f : NAN));
                    same &= !memcmp(&g[j], &want[j], sizeof(float));
                }
                if (wide) check(worst <= 1e-5f, "swiglu_wide", k->name);
                else check(same, "swiglu: the scalar loop's bits", k->name);
            }
        }
    }
    test_partial_groups((hs_pool *const[2]){one, three}, &seed);
    int skipped = 0;
    for (int v = 0; v < NAMES; v++) {
        if (hs_kernels_by_name(names[v])) {
            printf("variant %s: %d checks, %d failed\n", names[v], passed_by[v] + failed_by[v],
                   failed_by[v]);
        } else {
            printf("variant %s: skipped (not granted by this CPU)\n", names[v]);
            skipped++;
        }
    }
    printf("variants: %s; selected: %s\n", hs_kernels_available(), hs_kernels_select()->name);
    hs_pool_destroy(one);
    hs_pool_destroy(three);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
