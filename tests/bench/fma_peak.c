/* The vector unit's 8-lane FMA rate, the bound attend_rows.sh compares the attention against:
 * 12 independent FMA chains per thread (more than latency x throughput on current x86 cores),
 * on 1 thread and then on THREADS threads at once. Prints one line per thread count. Built and
 * run by attend_rows.sh. Built with AVX-512 VNNI (amx_products.sh) it also measures the 512-bit
 * vpdpbusd rate the same way (12 chains a thread): the bound of the products' register tiles,
 * whose every 64 int8 products are one vpdpbusd. Usage: fma_peak THREADS */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define STEPS 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A thread's twelve independent chains of STEP on vectors of type T (a0..a11 named, so that
 * they stay in registers), started at SET(0..11), summed by ADD at the end and stored as a float
 * (so that none is optimized away). */
#define CHAINS(NAME, T, SET, STEP, ADD, TO_FLOAT)                                                \
    static void *NAME(void *out) {                                                               \
        T a0 = SET(0), a1 = SET(1), a2 = SET(2), a3 = SET(3), a4 = SET(4), a5 = SET(5),          \
          a6 = SET(6), a7 = SET(7), a8 = SET(8), a9 = SET(9), a10 = SET(10), a11 = SET(11);      \
        for (long n = 0; n < STEPS; n++) {                                                       \
            a0 = STEP(a0), a1 = STEP(a1), a2 = STEP(a2), a3 = STEP(a3);                          \
            a4 = STEP(a4), a5 = STEP(a5), a6 = STEP(a6), a7 = STEP(a7);                          \
            a8 = STEP(a8), a9 = STEP(a9), a10 = STEP(a10), a11 = STEP(a11);                      \
        }                                                                                        \
        const T s = ADD(ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7))),       \
                        ADD(ADD(a8, a9), ADD(a10, a11)));                                        \
        *(float *)out = TO_FLOAT(s);                                                             \
        return NULL;                                                                             \
    }

/* 8-lane FMAs: a = a * 0.999 + 0.001 */
#define FMA_SET(i) _mm256_set1_ps((float)(i))
#define FMA_STEP(x) _mm256_fmadd_ps(x, _mm256_set1_ps(0.999f), _mm256_set1_ps(0.001f))
#define FMA_FLOAT(x) _mm256_cvtss_f32(x)
CHAINS(chains, __m256, FMA_SET, FMA_STEP, _mm256_add_ps, FMA_FLOAT)

#ifdef __AVX512VNNI__
/* 512-bit vpdpbusd: a += 3 x -5 in every byte pair (u8 x s8, four a lane) */
#define VNNI_SET(i) _mm512_set1_epi32(i)
#define VNNI_STEP(x) _mm512_dpbusd_epi32(x, _mm512_set1_epi8(3), _mm512_set1_epi8(-5))
#define VNNI_FLOAT(x) ((float)_mm512_reduce_add_epi32(x))
CHAINS(vnni_chains, __m512i, VNNI_SET, VNNI_STEP, _mm512_add_epi32, VNNI_FLOAT)
#endif

/* fn on 1 thread and then on `most` threads at once, a line each. */
static void peak(void *(*fn)(void *), const char *name, const char *unit, int most) {
    pthread_t t[256];
    float out[256];
    for (int n = 1; n <= most; n = n == most ? most + 1 : most) {
        const double t0 = now();
        for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, fn, &out[i]);
        for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
        const double dt = now() - t0;
        printf("%s peak: %d thread(s), %.2f G %s a second (%.2f a thread; check %g)\n", name, n,
               (double)n * STEPS * 12 / dt / 1e9, unit, (double)STEPS * 12 / dt / 1e9, out[0]);
    }
}

int main(int argc, char **argv) {
    const int most = argc == 2 ? atoi(argv[1]) : 0;
    if (most < 1 || most > 256) {
        fprintf(stderr, "usage: %s THREADS (1..256)\n", argv[0]);
        return 2;
    }
    peak(chains, "FMA", "8-lane FMAs", most);
#ifdef __AVX512VNNI__
    peak(vnni_chains, "VNNI", "512-bit vpdpbusd", most);
#endif
    return 0;
}
