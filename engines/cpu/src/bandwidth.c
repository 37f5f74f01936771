/* STREAM-style read bandwidth on the pool's pinned threads: each thread first-touches, then
 * repeatedly sums, its own slice of a buffer much larger than the last-level cache. The figure
 * the decode roofline (bandwidth / weight bytes per token) is computed from, over memory
 * allocated like the weights (huge pages where the kernel allows them). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "threadpool.h"

typedef struct { uint64_t *buf; size_t words; volatile uint64_t sink[256]; int touch; } bw_ctx;

static void bw_task(void *p, int ith, int nth) {
    bw_ctx *c = p;
    int b, e;
    hs_split((int)(c->words / 64), 1, ith, nth, &b, &e);
    uint64_t *w = c->buf + (size_t)b * 64;
    const size_t n = (size_t)(e - b) * 64;
    if (c->touch) {
        memset(w, 1, n * 8);
        return;
    }
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i += 4) { s0 += w[i]; s1 += w[i + 1]; s2 += w[i + 2]; s3 += w[i + 3]; }
    c->sink[ith & 255] = s0 + s1 + s2 + s3;
}

double hs_read_bandwidth(hs_pool *pool, size_t bytes, int repeats) {
    bw_ctx c = {0};
    c.words = bytes / 8 / 64 * 64;
    c.buf = hs_alloc_large(c.words * 8); /* the pages the weights are on */
    if (!c.buf) return -1.0;
    c.touch = 1;
    hs_pool_run(pool, bw_task, &c);
    c.touch = 0;
    hs_pool_run(pool, bw_task, &c); /* warm */
    double best = 0.0;
    for (int r = 0; r < repeats; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        hs_pool_run(pool, bw_task, &c);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        const double gbs = (double)(c.words * 8) / s / 1e9;
        if (gbs > best) best = gbs;
    }
    free(c.buf);
    return best;
}
