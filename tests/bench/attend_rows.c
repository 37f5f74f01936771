/* attend_rows alone on one thread: a prefill's attention, token blocks of HS_ATTN_ROWS / GROUP
 * tokens x GROUP query heads against one KV head (as model.c's attention phase calls it), the
 * context growing from 1 to POSITIONS. Prints one line: TAG, variant, shape, the best of REPS
 * passes in ms and in ns per (query row, position) pair. Built and run by attend_rows.sh.
 * Usage: attend_rows TAG VARIANT HD GROUP POSITIONS REPS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float unit(unsigned *seed) { /* uniform in [-1, 1) */
    *seed = *seed * 1103515245u + 12345u;
    return (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s TAG VARIANT HD GROUP POSITIONS REPS\n", argv[0]);
        return 2;
    }
    const hs_kernels *k = hs_kernels_by_name(argv[2]);
    const int hd = atoi(argv[3]), group = atoi(argv[4]), T = atoi(argv[5]), reps = atoi(argv[6]);
    if (!k || !k->attend_rows) {
        fprintf(stderr, "%s: variant '%s' is not granted here or has no attend_rows\n", argv[0], argv[2]);
        return 2;
    }
    if (hd % 32 || hd > HS_ATTN_HD || group < 1 || group > HS_ATTN_ROWS || T < 1 || reps < 1) {
        fprintf(stderr, "%s: HD a multiple of 32 up to %d, GROUP 1..%d, POSITIONS and REPS >= 1\n",
                argv[0], HS_ATTN_HD, HS_ATTN_ROWS);
        return 2;
    }
    const int per = HS_ATTN_ROWS / group; /* tokens per call */
    unsigned seed = 42;
    float *x = malloc(sizeof(float) * (size_t)T * hd), *q = malloc(sizeof(float) * (size_t)T * group * hd);
    hs_fp16 *K = malloc(sizeof(hs_fp16) * (size_t)T * hd), *V = malloc(sizeof(hs_fp16) * (size_t)T * hd);
    const hs_fp16 **kr = malloc(sizeof(*kr) * (size_t)T), **vr = malloc(sizeof(*vr) * (size_t)T);
    float *acc = malloc(sizeof(float) * (size_t)T * group * hd);
    float *m = malloc(sizeof(float) * (size_t)T * group), *l = malloc(sizeof(float) * (size_t)T * group);
    /* 64-byte aligned, as model.c allocates its packed rows */
    void *buf = aligned_alloc(64, (k->attend_bytes(hd, T) + 63) / 64 * 64);
    for (int i = 0; i < T * hd; i++) x[i] = unit(&seed);
    k->to_f16(T * hd, x, K);
    for (int i = 0; i < T * hd; i++) x[i] = unit(&seed);
    k->to_f16(T * hd, x, V);
    for (int i = 0; i < T * group * hd; i++) q[i] = unit(&seed);
    for (int p = 0; p < T; p++) kr[p] = K + (size_t)p * hd, vr[p] = V + (size_t)p * hd;
    k->attend_pack(hd, kr, vr, 0, T, buf);
    double best = INFINITY;
    for (int rep = 0; rep < reps; rep++) {
        for (int i = 0; i < T * group; i++) m[i] = -INFINITY, l[i] = 0.0f;
        memset(acc, 0, sizeof(float) * (size_t)T * group * hd);
        const double t0 = now();
        for (int t0k = 0; t0k < T; t0k += per) {
            const float *qs[HS_ATTN_ROWS];
            float *as[HS_ATTN_ROWS];
            int lim[HS_ATTN_ROWS], nq = 0;
            for (int t = t0k; t < T && t < t0k + per; t++)
                for (int g = 0; g < group; g++, nq++) {
                    qs[nq] = q + ((size_t)t * group + g) * hd;
                    as[nq] = acc + ((size_t)t * group + g) * hd;
                    lim[nq] = t + 1; /* causal: token t sees positions 0..t */
                }
            const int count = t0k + per < T ? t0k + per : T;
            k->attend_rows(hd, nq, 1.0f / sqrtf((float)hd), qs, lim, buf, count,
                           m + (size_t)t0k * group, l + (size_t)t0k * group, as);
        }
        const double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    double check = 0; /* the outputs, so that nothing is optimized away (and a quick sanity look) */
    for (int i = 0; i < T * group; i++) check += acc[(size_t)i * hd] / l[i];
    const double pairs = (double)T * (T + 1) / 2 * group;
    printf("| %s | %s | %d | %d | %d | %.2f | %.3f | %.6g |\n", argv[1], k->name, hd, group, T,
           best * 1e3, best / pairs * 1e9, check);
    return 0;
}
