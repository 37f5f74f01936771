/* The attention's vector expf (x86_common.h: expf8, built with AVX-512 as expf_check and with
 * AVX2 alone as expf_check_avx2, two forms of the same steps) against
 * the C library's expf, bit for bit, over every float bit pattern with a stride (all of them with
 * the argument "all"): the exact hand-off's prefill engine repeats glibc's expf (prefill/exact.py),
 * so the vector form must not differ from it in any bit. Prints the count checked and mismatches;
 * exit status 1 on a mismatch. Built by tests/e2e/test_native_kernels.py (x86-64 only). */
#include <stdio.h>
#include <string.h>

#include "x86_common.h"

static unsigned long bad;

static void compare(const float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) {
        const float want = expf(x[i]);
        if (isnan(want) && isnan(y[i])) continue;
        if (memcmp(&want, &y[i], sizeof want)) {
            if (bad++ < 5) printf("MISMATCH x=%a: expf %a, vector %a\n", x[i], want, y[i]);
        }
    }
}

int main(int argc, char **argv) {
    const uint64_t stride = argc > 1 && !strcmp(argv[1], "all") ? 8 : 8 * 61;
    unsigned long checked = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += stride) {
        uint32_t bits[8];
        float x[8], y[8];
        for (int i = 0; i < 8; i++) bits[i] = (uint32_t)(u + (uint64_t)i);
        memcpy(x, bits, sizeof x);
        _mm256_storeu_ps(y, expf8(_mm256_loadu_ps(x)));
        compare(x, y, 8);
        /* exps over a span with a tail (5 of 8) */
        memcpy(y, x, sizeof x);
        exps(y, 5);
        compare(x, y, 5);
        checked += 8;
    }
    printf("checked %lu floats: %lu mismatches\n", checked, bad);
    return bad != 0;
}
