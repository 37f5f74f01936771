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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* attend_f16 of a variant against the reference: head widths with and without a SIMD tail (68
 * and 66), one to eight query heads, positions past one internal span (64), continued from a
 * first call as the engine continues over spans, scores close together and far apart. */
static void test_attend(const hs_kernels *k, const hs_kernels *ref, unsigned *seed) {
    enum { HD = 68, COUNT = 150, G = 8 };
    static hs_fp16 kv[2][COUNT][HD];
    static float q[G * HD];
    const hs_fp16 *kp[COUNT], *vp[COUNT];
    for (int p = 0; p < COUNT; p++) {
        for (int d = 0; d < HD; d++) {
            kv[0][p][d] = hs_fp32_to_fp16(frand(seed));
            kv[1][p][d] = hs_fp32_to_fp16(frand(seed));
        }
        kp[p] = kv[0][p];
        vp[p] = kv[1][p];
    }
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

int main(void) {
    /* 544 columns: 17 blocks, a partial group for the packed x86 layout; 1, 3, 6 and 21
     * activation rows: the one-row products, an odd column, a second column tile, and a 16-row
     * tile-unit (AMX) product with five rows left over; 36 weight rows: two 16-row strips and a
     * partial one. */
    enum { ROWS = 36, COLS = 544, N = 21 };
    unsigned seed = 42;
    float *w = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * N * COLS);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = frand(&seed);
    for (int i = 0; i < N * COLS; i++) x[i] = frand(&seed);
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

    hs_pool *one = hs_pool_create(1, NULL, 0), *three = hs_pool_create(3, NULL, 0);
    const hs_kernels *ref = &hs_kernels_ref;
    const int types[] = {HS_Q8_0, HS_Q4_0, HS_Q4_1}, batches[] = {1, 3, 6, N};
    const char *what[] = {"matmul q8_0", "matmul q4_0", "matmul q4_1"};
    void *datas[] = {w8, w4, w41};
    for (int t = 0; t < 3; t++) {
        hs_mat mat = {types[t], ROWS, COLS, hs_row_bytes(types[t], COLS), datas[t]};
        float expect[N * ROWS], got[N * ROWS];
        for (int v = 0; v < NAMES; v++) {
            const hs_kernels *k = hs_kernels_by_name(names[v]);
            if (!k) continue;
            for (int bi = 0; bi < 4; bi++) {
                const int n = batches[bi];
                hs_matmul(one, ref, 1, &mat, n, x, expect);
                float scale = 0;
                for (int i = 0; i < n * ROWS; i++) scale = fmaxf(scale, fabsf(expect[i]));
                for (int nrc = 1; nrc <= 4; nrc *= 2) {
                    hs_matmul(three, k, nrc, &mat, n, x, got);
                    float worst = 0;
                    for (int i = 0; i < n * ROWS; i++)
                        worst = fmaxf(worst, fabsf(got[i] - expect[i]) / (1e-4f * scale + 1e-4f * fabsf(expect[i])));
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
        }
    }
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
