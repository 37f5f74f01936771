/* What one hs_pool_run costs (a benchmark, not a test): N threads pinned to CPUs 0..N-1 run
 * a task R times; printed: ns a run, median of 5 rounds, for an empty task and for one in which
 * each thread writes a cache line of its own (what a task's end makes the next one wait on).
 * A decode step runs about ten pool tasks a layer: on a 22-layer model, 220 runs a step.
 *
 *     gcc -O2 -Iengines/cpu/src tests/bench/pool_run.c engines/cpu/src/threadpool.c \
 *         -lpthread -o pool_run && ./pool_run N [R]
 *
 * Before/after a change to threadpool.c: build this against both versions of the file and
 * alternate the two programs (docs/benchmarks.md has the figures of the per-thread done lines).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "threadpool.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void empty(void *ctx, int ith, int nth) { (void)ctx, (void)ith, (void)nth; }

static void touch(void *ctx, int ith, int nth) {
    (void)nth;
    volatile long *lines = ctx;
    lines[ith * 8] += 1;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2 || atoi(argv[1]) < 1 || (argc > 2 && atoi(argv[2]) < 1)) {
        fprintf(stderr, "usage: %s THREADS [RUNS] (both 1 or more)\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[1]), runs = argc > 2 ? atoi(argv[2]) : 100000;
    int *cpus = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) cpus[i] = i;
    hs_pool *pool = hs_pool_create(n, cpus, 1);
    if (!pool) {
        fprintf(stderr, "%s: could not create a pool of %d threads\n", argv[0], n);
        return 1;
    }
    long *lines = aligned_alloc(64, sizeof(long) * 8 * (size_t)n);
    memset(lines, 0, sizeof(long) * 8 * (size_t)n);
    const char *names[2] = {"empty", "touch"};
    for (int k = 0; k < 2; k++) {
        double round[5];
        for (int r = 0; r < 5; r++) {
            const double t0 = now();
            for (int i = 0; i < runs; i++) hs_pool_run(pool, k ? touch : empty, lines);
            round[r] = (now() - t0) / runs * 1e9;
        }
        qsort(round, 5, sizeof round[0], cmp);
        printf("pool_run %s threads=%d: %.0f ns a run (median of 5 rounds of %d; %.0f-%.0f)\n",
               names[k], n, round[2], runs, round[0], round[4]);
    }
    hs_pool_destroy(pool);
    return 0;
}
