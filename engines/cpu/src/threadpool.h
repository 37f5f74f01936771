/* A thread pool pinned to an explicit CPU list. The caller is thread 0. A waiting thread (a worker
 * between tasks, the caller for the workers) spins briefly, enough to bridge the gaps between the
 * few hundred tasks of a decode step, then parks on a futex, so that an engine sharing its cores
 * with a busy process does not burn the time slices of the threads it waits for; while no other
 * thread has taken its core, it spins longer before it parks (threadpool.c says why).
 * Read by hs_pool_create, in microseconds: HETEROSERVE_POOL_SPIN_US, the spin (default 200; 0:
 * park at once; 10000: about the pool before it parked, whose caller never parked), and
 * HETEROSERVE_POOL_SPIN_ALONE_US, the spin while the core is the thread's own (default 5000; 0 or
 * anything not above the first: the first only). */
#ifndef HS_THREADPOOL_H
#define HS_THREADPOOL_H

typedef struct hs_pool hs_pool;
typedef void (*hs_task)(void *ctx, int ith, int nth);

/* n threads; cpus (n entries) pins thread i to cpus[i], or NULL for no pinning. Thread 0 is the
 * caller of hs_pool_run, pinned to cpus[0] only when pin_caller is set. Returns NULL on error. */
hs_pool *hs_pool_create(int n, const int *cpus, int pin_caller);
void hs_pool_run(hs_pool *pool, hs_task task, void *ctx);
int hs_pool_size(const hs_pool *pool);
/* How many waits have ended parked on a futex so far (the workers' for a task, the caller's for
 * the workers). */
unsigned long long hs_pool_parks(const hs_pool *pool);
void hs_pool_destroy(hs_pool *pool);

/* [begin, end) of `total` items for thread ith of nth, in multiples of `tile`. */
static inline void hs_split(int total, int tile, int ith, int nth, int *begin, int *end) {
    const int tiles = (total + tile - 1) / tile;
    const int t0 = (int)((long long)tiles * ith / nth), t1 = (int)((long long)tiles * (ith + 1) / nth);
    *begin = t0 * tile < total ? t0 * tile : total;
    *end = t1 * tile < total ? t1 * tile : total;
}

#endif
