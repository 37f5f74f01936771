/* attend_f16 alone on one thread: a decode token's attention over a long context read straight
 * from a KV cache (as model.c's attention phase calls it: GROUP query heads of one KV head, 256
 * positions a call, and for each 256 positions every KV head in turn, as its decode items run
 * span by span), the rows STRIDE fp16s apart (a cached position's width: kvd = KV heads x head
 * dim, STRIDE / 64 KV heads) in a buffer of POSITIONS positions, far larger than the caches,
 * walked in order. STRIDE 64 is the layout a cache kept KV head by KV head would give.
 * Prints one line: TAG, variant, shape, ns per (KV head, position) and per (query row,
 * position) pair, a check value. Built and run by attend_rows.sh (DECODE=...).
 * Usage: attend_decode TAG VARIANT GROUP STRIDE POSITIONS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

enum { HD = 64, CALL = 256 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s TAG VARIANT GROUP STRIDE POSITIONS\n", argv[0]);
        return 2;
    }
    const hs_kernels *k = hs_kernels_by_name(argv[2]);
    const int group = atoi(argv[3]), stride = atoi(argv[4]);
    const size_t total = (size_t)atol(argv[5]);
    if (!k) {
        fprintf(stderr, "%s: variant '%s' is not granted here\n", argv[0], argv[2]);
        return 2;
    }
    if (group < 1 || group > HS_ATTN_GROUP || stride < HD || stride % HD || total < CALL) {
        fprintf(stderr, "%s: GROUP 1..%d, STRIDE a multiple of %d, POSITIONS >= %d\n", argv[0],
                HS_ATTN_GROUP, HD, CALL);
        return 2;
    }
    /* 64-byte aligned, as the engine's cache (hs_alloc_large): malloc's 16-byte offset put each
     * 128-byte row across three cache lines, and its timings (one KV head of three) read 62-64
     * ns a position where the same walk over aligned rows takes 27-33 (docs/benchmarks.md,
     * nineteenth round) */
    const size_t bytes = (sizeof(hs_fp16) * total * stride + 63) / 64 * 64;
    hs_fp16 *K = aligned_alloc(64, bytes), *V = aligned_alloc(64, bytes);
    if (!K || !V) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    for (size_t i = 0; i < total * stride; i++) {
        K[i] = hs_fp32_to_fp16((float)(i * 7 % 13) / 13.0f - 0.5f);
        V[i] = hs_fp32_to_fp16((float)(i * 5 % 11) / 11.0f - 0.5f);
    }
    float q[HS_ATTN_GROUP * HD], acc[HS_ATTN_GROUP * HD], m[HS_ATTN_GROUP], l[HS_ATTN_GROUP];
    for (int i = 0; i < HS_ATTN_GROUP * HD; i++) q[i] = (float)(i % 9) / 9.0f - 0.5f;
    const hs_fp16 *kp[CALL], *vp[CALL];
    double check = 0;
    long positions = 0;
    const double t0 = now();
    while (now() - t0 < 2.0) /* the whole buffer, in order, as often as 2 s allow */
        for (size_t base = 0; base + CALL <= total; base += CALL) {
            for (int h = 0; h < stride / HD; h++) {
                for (int j = 0; j < CALL; j++)
                    kp[j] = K + (base + j) * stride + h * HD, vp[j] = V + (base + j) * stride + h * HD;
                for (int g = 0; g < group; g++) m[g] = -INFINITY, l[g] = 0.0f;
                memset(acc, 0, sizeof acc);
                k->attend_f16(HD, group, 0.125f, q, kp, vp, CALL, m, l, acc);
                positions += CALL;
                check += acc[0] / l[0];
            }
        }
    const double dt = now() - t0;
    printf("| %s | %s | %d x %d, stride %d, %zu positions | %.1f | %.2f | %.6g |\n", argv[1],
           argv[2], group, HD, stride, total, dt / positions * 1e9, dt / positions / group * 1e9,
           check / positions * CALL);
    return 0;
}
