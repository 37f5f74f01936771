/* A thread pool pinned to an explicit CPU list. The caller is thread 0; workers spin briefly
 * between tasks (a decode step runs a few hundred of them) and sleep when idle. */
#ifndef HS_THREADPOOL_H
#define HS_THREADPOOL_H

typedef struct hs_pool hs_pool;
typedef void (*hs_task)(void *ctx, int ith, int nth);

/* n threads; cpus (n entries) pins thread i to cpus[i], or NULL for no pinning. Thread 0 is the
 * caller of hs_pool_run, pinned to cpus[0] only when pin_caller is set. Returns NULL on error. */
hs_pool *hs_pool_create(int n, const int *cpus, int pin_caller);
void hs_pool_run(hs_pool *pool, hs_task task, void *ctx);
int hs_pool_size(const hs_pool *pool);
void hs_pool_destroy(hs_pool *pool);

/* [begin, end) of `total` items for thread ith of nth, in multiples of `tile`. */
static inline void hs_split(int total, int tile, int ith, int nth, int *begin, int *end) {
    const int tiles = (total + tile - 1) / tile;
    const int t0 = (int)((long long)tiles * ith / nth), t1 = (int)((long long)tiles * (ith + 1) / nth);
    *begin = t0 * tile < total ? t0 * tile : total;
    *end = t1 * tile < total ? t1 * tile : total;
}

#endif
