#define _GNU_SOURCE
#include "threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* Every wait in the pool (a worker for the next task, the caller for the workers to finish)
 * spins for a bounded time, then parks on a futex.
 *
 * Why spin: a decode step runs a few hundred tasks of a few microseconds each. On cores of its
 * own a spinning waiter sees the store it waits for within ~100 ns, a parked one is woken in
 * microseconds (tens in a VM, where waking an idle vCPU goes through the hypervisor).
 * Why park: when another process shares the cores, the thread waited for may be descheduled for a
 * whole time slice (milliseconds). A waiter that spins through it burns its own core's time for
 * nothing, and the scheduler charges that time to the engine, so its threads, not the busy
 * process, wait for the CPU next; two spinning threads that each take turns with a busy process
 * stall each other for whole slices (20.6 tok/s where 1 thread made 90, in the issue).
 * How long: the waits of a decode step are bimodal, under ~100 us while the other thread runs,
 * milliseconds (a slice) once it was descheduled. 200 us covers the first kind and most gaps
 * between two decode steps in a tight loop (60-250 us), so that on exclusive cores the threads
 * rarely park; on shared cores it wastes at most 200 us per wait that lasts a slice. Measured on
 * 2 cores (tests/bench/cpu_engine_shared_cores.py): 50 us lost a quarter with a busy process on
 * every core, 100-1000 us did as well as 200.
 * The bound is in time, not iterations: a `pause` takes 10 to 140 cycles depending on the CPU. */
#define DEFAULT_SPIN_NS 200000

struct hs_pool {
    int n;
    pthread_t *threads;
    long long spin_ns; /* how long a waiter spins before it parks */
    /* Written by the caller for every task, read by the workers: the futex word they park on. */
    _Alignas(64) atomic_uint generation; /* bumped for every task (and to stop) */
    atomic_int sleepers;                 /* workers parked (or about to) on `generation` */
    atomic_int stop;
    hs_task task;
    void *ctx;
    /* Written by the workers, read by the caller: the futex word the caller parks on. */
    _Alignas(64) atomic_uint wakes;      /* bumped by the worker the parked caller waits for */
    atomic_int caller_parked;            /* the worker the parked caller waits for (0: none) */
    struct done_line *done;              /* [n]: the generation each worker last finished */
};

/* Each worker says it has finished a task in a cache line of its own, which the caller reads:
 * with one shared counter instead, the workers' decrements queued for that line one after
 * another, and a run of an empty task on 16 threads took 1.8 us (tests/bench/pool_run.c). */
struct done_line {
    _Alignas(64) atomic_uint generation;
};

typedef struct { hs_pool *pool; int ith; int cpu; } worker_arg;

static void pin(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

/* The kernel compares *word with `expected` under its own lock and sleeps only if they are still
 * equal, so a change (and its wake-up) between our last load and this call is never lost. */
static void futex_wait(void *word, int expected) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(void *word, int count) {
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spins while *word == value, at most spin_ns; returns the last value read. The clock is read
 * every 16 pauses. */
static unsigned spin_while_equal(atomic_uint *word, unsigned value, long long spin_ns) {
    unsigned v = atomic_load_explicit(word, memory_order_acquire);
    if (v != value || spin_ns <= 0) return v;
    const long long until = now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 16; i++) {
            CPU_RELAX();
            if ((v = atomic_load_explicit(word, memory_order_acquire)) != value) return v;
        }
        if (now_ns() >= until) return v;
    }
}

/* The first worker from `from` on that has not finished generation gen (pool->n: none),
 * spinning at most spin_ns for it and those after it (each worker's line read once it is the
 * first one left). */
static int first_busy(hs_pool *pool, int from, unsigned gen, long long spin_ns) {
    int i = from;
    long long until = -1;
    for (;;) {
        while (i < pool->n &&
               atomic_load_explicit(&pool->done[i].generation, memory_order_acquire) == gen)
            i++;
        if (i == pool->n || spin_ns <= 0) return i;
        if (until < 0) until = now_ns() + spin_ns;
        int k = 0;
        for (; k < 16; k++) {
            CPU_RELAX();
            if (atomic_load_explicit(&pool->done[i].generation, memory_order_acquire) == gen) break;
        }
        if (k == 16 && now_ns() >= until) return i; /* (the clock only after 16 pauses) */
    }
}

static void *worker(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    hs_pool *pool = arg.pool;
    pin(arg.cpu);
    unsigned seen = 0; /* generation at creation: a task posted before this thread ran is not missed */
    for (;;) {
        unsigned gen = spin_while_equal(&pool->generation, seen, pool->spin_ns);
        if (gen == seen) {
            /* Announce, then re-check: the poster bumps `generation` before it reads `sleepers`
             * (both seq_cst), so either it sees us and wakes us, or we see its new generation. */
            atomic_fetch_add(&pool->sleepers, 1);
            while ((gen = atomic_load(&pool->generation)) == seen) futex_wait(&pool->generation, (int)seen);
            atomic_fetch_sub(&pool->sleepers, 1);
        }
        seen = gen;
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) return NULL;
        pool->task(pool->ctx, arg.ith, pool->n);
        /* Done, then wake the caller if it parked waiting for this worker (the same
         * announce/re-check pairing: it names the worker in caller_parked before it reads
         * `wakes` and that worker's line again, so either it sees the line or the worker sees
         * its name). One wake-up a parked wait, not one a worker. Both announcements are
         * read-modify-writes, as the sleepers' is: a seq_cst store followed by a load of
         * another word is ordered on the hardware (x86 compiles the store as xchg, aarch64's
         * stlr/ldar are ordered), but qemu-user's aarch64 on an x86 host let the load pass the
         * store, and the caller slept on a worker that had seen no name (a pool_run of 8
         * threads with HETEROSERVE_POOL_SPIN_US=0 hung 1 time in 5; the kernel test under
         * qemu once in CI). */
        atomic_exchange(&pool->done[arg.ith].generation, gen);
        if (atomic_load(&pool->caller_parked) == arg.ith) {
            atomic_fetch_add(&pool->wakes, 1);
            futex_wake(&pool->wakes, 1);
        }
    }
}

/* HETEROSERVE_POOL_SPIN_US: how long a waiting thread spins before it parks, in microseconds;
 * 0 parks at once; 10000 spins about as the pool did before it parked (its workers slept after
 * some milliseconds, its caller never). */
static long long spin_ns_from_env(void) {
    const char *s = getenv("HETEROSERVE_POOL_SPIN_US");
    if (!s || !*s) return DEFAULT_SPIN_NS;
    char *end;
    const double us = strtod(s, &end);
    if (end == s || us < 0) return DEFAULT_SPIN_NS;
    return us > 1e9 ? (long long)1e15 : (long long)(us * 1000.0);
}

hs_pool *hs_pool_create(int n, const int *cpus, int pin_caller) {
    if (n < 1) return NULL;
    hs_pool *pool = aligned_alloc(64, (sizeof(hs_pool) + 63) / 64 * 64);
    if (!pool) return NULL;
    memset(pool, 0, sizeof *pool);
    pool->n = n;
    pool->spin_ns = spin_ns_from_env();
    pool->threads = calloc((size_t)n, sizeof(pthread_t));
    pool->done = aligned_alloc(64, sizeof(struct done_line) * (size_t)n);
    if (!pool->threads || !pool->done) {
        free(pool->threads);
        free(pool->done);
        free(pool);
        return NULL;
    }
    memset(pool->done, 0, sizeof(struct done_line) * (size_t)n);
    if (pin_caller && cpus) pin(cpus[0]);
    for (int i = 1; i < n; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) *arg = (worker_arg){pool, i, cpus ? cpus[i] : -1};
        if (!arg || pthread_create(&pool->threads[i], NULL, worker, arg) != 0) {
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
    const unsigned gen = atomic_fetch_add(&pool->generation, 1) + 1;
    if (atomic_load(&pool->sleepers) > 0) futex_wake(&pool->generation, INT_MAX);
    task(ctx, 0, pool->n);
    int busy = first_busy(pool, 1, gen, pool->spin_ns);
    if (busy == pool->n) return;
    for (;;) { /* parked, one worker at a time: named, then its line checked again */
        atomic_exchange(&pool->caller_parked, busy); /* an RMW: see the worker's */
        const unsigned wakes = atomic_load(&pool->wakes);
        if (atomic_load(&pool->done[busy].generation) != gen) futex_wait(&pool->wakes, (int)wakes);
        busy = first_busy(pool, busy, gen, 0);
        if (busy == pool->n) break;
    }
    atomic_store(&pool->caller_parked, 0);
}

int hs_pool_size(const hs_pool *pool) { return pool->n; }

void hs_pool_destroy(hs_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->generation, 1);
    futex_wake(&pool->generation, INT_MAX);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool->done);
    free(pool);
}
