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

#ifdef __AVX512VNNI__
static void *vnni_chains(void *out) {
    const __m512i b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(-5);
    __m512i a0 = _mm512_set1_epi32(0), a1 = _mm512_set1_epi32(1), a2 = _mm512_set1_epi32(2),
            a3 = _mm512_set1_epi32(3), a4 = _mm512_set1_epi32(4), a5 = _mm512_set1_epi32(5),
            a6 = _mm512_set1_epi32(6), a7 = _mm512_set1_epi32(7), a8 = _mm512_set1_epi32(8),
            a9 = _mm512_set1_epi32(9), a10 = _mm512_set1_epi32(10), a11 = _mm512_set1_epi32(11);
    for (long n = 0; n < STEPS; n++) {
        a0 = _mm512_dpbusd_epi32(a0, b, c), a1 = _mm512_dpbusd_epi32(a1, b, c);
        a2 = _mm512_dpbusd_epi32(a2, b, c), a3 = _mm512_dpbusd_epi32(a3, b, c);
        a4 = _mm512_dpbusd_epi32(a4, b, c), a5 = _mm512_dpbusd_epi32(a5, b, c);
        a6 = _mm512_dpbusd_epi32(a6, b, c), a7 = _mm512_dpbusd_epi32(a7, b, c);
        a8 = _mm512_dpbusd_epi32(a8, b, c), a9 = _mm512_dpbusd_epi32(a9, b, c);
        a10 = _mm512_dpbusd_epi32(a10, b, c), a11 = _mm512_dpbusd_epi32(a11, b, c);
    }
    const __m512i s = _mm512_add_epi32(
        _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                         _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7))),
        _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
    *(float *)out = (float)_mm512_reduce_add_epi32(s);
    return NULL;
}
#endif

static void *chains(void *out) {
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2),
           a3 = _mm256_set1_ps(3), a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5),
           a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7), a8 = _mm256_set1_ps(8),
           a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    for (long n = 0; n < STEPS; n++) {
        a0 = _mm256_fmadd_ps(a0, b, c), a1 = _mm256_fmadd_ps(a1, b, c);
        a2 = _mm256_fmadd_ps(a2, b, c), a3 = _mm256_fmadd_ps(a3, b, c);
        a4 = _mm256_fmadd_ps(a4, b, c), a5 = _mm256_fmadd_ps(a5, b, c);
        a6 = _mm256_fmadd_ps(a6, b, c), a7 = _mm256_fmadd_ps(a7, b, c);
        a8 = _mm256_fmadd_ps(a8, b, c), a9 = _mm256_fmadd_ps(a9, b, c);
        a10 = _mm256_fmadd_ps(a10, b, c), a11 = _mm256_fmadd_ps(a11, b, c);
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                   _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    *(float *)out = _mm256_cvtss_f32(_mm256_add_ps(
        s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))));
    return NULL;
}

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
