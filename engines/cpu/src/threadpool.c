#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spins before a worker sleeps: long enough to bridge the gaps between the tasks of one step. */
#define SPINS_BEFORE_SLEEP 200000

struct hs_pool {
    int n;
    pthread_t *threads;
    atomic_uint generation;   /* bumped for every task */
    atomic_int pending;       /* workers still running the current task */
    atomic_int sleepers;
    atomic_int stop;
    hs_task task;
    void *ctx;
    pthread_mutex_t lock;
    pthread_cond_t wake;
};

typedef struct { hs_pool *pool; int ith; int cpu; } worker_arg;

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void *worker(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    hs_pool *pool = arg.pool;
    pin(arg.cpu);
    unsigned seen = 0; /* generation at creation: a task posted before this thread ran is not missed */
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool->generation, memory_order_acquire) == seen &&
               !atomic_load(&pool->stop)) {
            if (++spins < SPINS_BEFORE_SLEEP) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&pool->lock);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->wake, &pool->lock);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->lock);
            spins = 0;
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = atomic_load(&pool->generation);
        pool->task(pool->ctx, arg.ith, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

hs_pool *hs_pool_create(int n, const int *cpus, int pin_caller) {
    if (n < 1) return NULL;
    hs_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n = n;
    pool->threads = calloc((size_t)n, sizeof(pthread_t));
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    if (pin_caller && cpus) pin(cpus[0]);
    for (int i = 1; i < n; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        *arg = (worker_arg){pool, i, cpus ? cpus[i] : -1};
        if (pthread_create(&pool->threads[i], NULL, worker, arg) != 0) {
            free(arg);
            pool->n = i;
            hs_pool_destroy(pool);
            return NULL;
        }
    }
    return pool;
}

void hs_pool_run(hs_pool *pool, hs_task task, void *ctx) {
    if (pool->n == 1) {
        task(ctx, 0, 1);
        return;
    }
    pool->task = task;
    pool->ctx = ctx;
    atomic_store(&pool->pending, pool->n - 1);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_seq_cst);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
    }
    task(ctx, 0, pool->n);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) CPU_RELAX();
}

int hs_pool_size(const hs_pool *pool) { return pool->n; }

void hs_pool_destroy(hs_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->wake);
    free(pool->threads);
    free(pool);
}
