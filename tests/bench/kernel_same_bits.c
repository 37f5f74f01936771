/* Writes one x86 variant's quantized products to a file, so that two builds of a kernel source
 * (before and after a change that should not move a bit) can be compared byte for byte: see
 * kernel_same_bits.sh. For each type (q4_0, q4_1, q8_0) and a few shapes, random weight rows
 * (fp16 scales kept in range) and activation rows through pack_row and quantize_act, then the
 * register tiles (mm_*, 1..4 weight rows x 1..mm_cols activation rows) and, where the variant
 * has them, the int8 tiles (wide8_*, the rows they return as done, and that count).
 *
 *     kernel_same_bits VARIANT OUT.bin      (VARIANT: avx2, avx512vnni or amx, by
 *                                            kernel_same_bits.sh the file's own)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static unsigned state = 12345;
static unsigned rnd(void) {
    state = state * 1103515245u + 12345u;
    return state >> 8;
}

static void *zalloc(size_t n) { /* 64-byte aligned, zeroed, padded for the kernels' tails */
    void *p = aligned_alloc(64, (n + 127) / 64 * 64);
    if (!p) exit(3);
    memset(p, 0, (n + 127) / 64 * 64);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s avx2|avx512vnni|amx OUT.bin\n", argv[0]);
        return 2;
    }
    /* by name, through dispatch.c: where the CPU lacks the variant's ISA it is NULL, and amx
     * asks the kernel for the tile data (emulated tiles need no permission) */
    const hs_kernels *k = hs_kernels_by_name(argv[1]);
    if (!k || !strcmp(argv[1], "reference")) {
        fprintf(stderr, "variant %s: unknown, or not available on this CPU\n", argv[1]);
        return 2;
    }
    FILE *f = fopen(argv[2], "wb");
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    const int types[3] = {HS_Q4_0, HS_Q4_1, HS_Q8_0};
    /* blocks a row, weight rows, activation rows: whole and partial tiles, short and long rows */
    const int shapes[][3] = {{64, 48, 32}, {17, 36, 16}, {176, 16, 48}, {33, 20, 40}, {32, 4, 8}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    long written = 0;
    for (int t = 0; t < 3; t++) {
        const hs_mm_fn mm = t == 0 ? k->mm_q4_0 : t == 1 ? k->mm_q4_1 : k->mm_q8_0;
        const hs_wide8_fn wide8 = t == 0 ? k->wide8_q4_0 : t == 1 ? k->wide8_q4_1 : k->wide8_q8_0;
        const int mm_cols = k->mm_cols ? k->mm_cols : 4;
        for (int sh = 0; sh < nshapes; sh++) {
            const int nb = shapes[sh][0], nrows = shapes[sh][1], ncols = shapes[sh][2];
            const int cols = nb * HS_QK;
            const size_t rb = hs_row_bytes(types[t], cols), bs = rb / (size_t)nb;
            unsigned char *src = zalloc(rb), *w = zalloc(rb * (size_t)nrows);
            for (int r = 0; r < nrows; r++) {
                for (size_t i = 0; i < rb; i++) src[i] = (unsigned char)rnd();
                for (int b = 0; b < nb; b++) { /* fp16 scales of moderate size (and q4_1's min) */
                    unsigned short h = (unsigned short)(0x2000 | (rnd() & 0x3ff));
                    memcpy(src + (size_t)b * bs, &h, 2);
                    if (types[t] == HS_Q4_1) {
                        h = (unsigned short)(0xa000 | (rnd() & 0x3ff));
                        memcpy(src + (size_t)b * bs + 2, &h, 2);
                    }
                }
                if (k->pack_row) k->pack_row(types[t], src, w + (size_t)r * rb, cols);
                else memcpy(w + (size_t)r * rb, src, rb);
            }
            const size_t ab = k->act_bytes(cols);
            unsigned char *a = zalloc(ab * (size_t)ncols);
            float *x = zalloc(sizeof(float) * (size_t)cols);
            for (int c = 0; c < ncols; c++) {
                for (int i = 0; i < cols; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 250.0f;
                k->quantize_act(x, a + (size_t)c * ab, cols);
            }
            float *out = zalloc(sizeof(float) * (size_t)nrows * ncols);
            for (int r0 = 0; r0 < nrows; r0 += 4) /* the register tiles, tile by tile */
                for (int c0 = 0; c0 < ncols; c0 += mm_cols) {
                    const int nr = nrows - r0 < 4 ? nrows - r0 : 4;
                    const int nc = ncols - c0 < mm_cols ? ncols - c0 : mm_cols;
                    mm(nb, w + (size_t)r0 * rb, rb, nr, a + (size_t)c0 * ab, ab, nc,
                       out + (size_t)c0 * nrows + r0, (size_t)nrows);
                }
            fwrite(out, sizeof(float), (size_t)nrows * ncols, f);
            written += nrows * ncols;
            if (wide8) {
                memset(out, 0, sizeof(float) * (size_t)nrows * ncols);
                const int done = wide8(nb, w, rb, nrows, a, ab, ncols, out, (size_t)nrows);
                fwrite(&done, sizeof done, 1, f);
                fwrite(out, sizeof(float), (size_t)nrows * ncols, f);
                written += (long)nrows * done;
            }
            free(src), free(w), free(a), free(x), free(out);
        }
    }
    fclose(f);
    printf("%s: %ld products written\n", k->name, written);
    return 0;
}
