/* One register tile of the avx512vnni products (2 weight rows x 4 activation rows, the tile
 * model.c's narrow rows take in batched steps and prefill) called over and over on the same
 * data, so that weights and activations stay in L1: what the tile's own instructions cost,
 * apart from memory. Built by tests/bench/tile_in_l1.sh against a wrapper object that includes
 * a version of x86_avx512.c and exports its `tile` as t24 (q8_0) and t24q4 (q4_0); the wrapper
 * also supplies that version's kernel table, so weights and activations are packed as that
 * version packs them.
 * Usage: tile_in_l1 TYPE(q8_0|q4_0) COLS -> one line: "COLS ns" (the best of 7 passes of 10^6
 * calls, ns a call). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

void t24(int nb, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os);
void t24q4(int nb, const void *w, size_t ws, const void *a, size_t as, float *out, size_t os);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "q8_0") != 0 && strcmp(argv[1], "q4_0") != 0)) {
        fprintf(stderr, "usage: %s q8_0|q4_0 COLS\n", argv[0]);
        return 2;
    }
    const int q8 = strcmp(argv[1], "q8_0") == 0, type = q8 ? HS_Q8_0 : HS_Q4_0;
    const int cols = atoi(argv[2]), nb = cols / HS_QK;
    if (cols < HS_QK || cols % HS_QK) {
        fprintf(stderr, "%s: COLS must be a positive multiple of %d\n", argv[0], HS_QK);
        return 2;
    }
    const hs_kernels *k = hs_kernels_by_name("avx512vnni");
    if (!k) {
        fprintf(stderr, "%s: this CPU does not grant AVX-512 VNNI\n", argv[0]);
        return 1;
    }
    const size_t rb = hs_row_bytes(type, cols), as = k->act_bytes(cols);
    float *x = malloc(sizeof(float) * cols);
    unsigned char *raw = malloc(rb * 2), *w = aligned_alloc(64, (rb * 2 + 63) / 64 * 64);
    char *a = aligned_alloc(64, (as * 4 + 63) / 64 * 64);
    srand(1);
    for (int r = 0; r < 2; r++) {
        for (int c = 0; c < cols; c++) x[c] = (float)rand() / RAND_MAX - 0.5f;
        if (q8)
            hs_quantize_row_q8_0(x, (block_q8_0 *)(raw + r * rb), cols);
        else
            hs_quantize_row_q4_0(x, (block_q4_0 *)(raw + r * rb), cols);
        k->pack_row(type, raw + r * rb, w + r * rb, cols);
    }
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < cols; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
        k->quantize_act(x, a + c * as, cols);
    }
    float out[8];
    double best = 1e9;
    for (int pass = 0; pass < 7; pass++) {
        const double t0 = now();
        for (int i = 0; i < 1000000; i++) {
            (q8 ? t24 : t24q4)(nb, w, rb, a, as, out, 2);
            __asm__ volatile("" ::: "memory");
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%d %.2f\n", cols, best * 1e3); /* s per 10^6 calls x 1e3 = ns a call */
    return 0;
}
