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
#include <sys/resource.h>
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
 * The bound is in time, not iterations: a `pause` takes 10 to 140 cycles depending on the CPU.
 *
 * Unless nobody else wants the core: when the 200 us run out and no other thread has taken this
 * thread's CPU since it last looked (its involuntary context switches, getrusage RUSAGE_THREAD,
 * have not grown), the waiter spins on, up to 5 ms from the wait's start
 * (HETEROSERVE_POOL_SPIN_ALONE_US), looking again every 100 us and parking as soon as they have
 * grown. On a core of its own a spin costs nobody anything, while parking costs a wake-up, and on
 * a host that steals time from its vCPUs a wake-up can take hundreds of microseconds. There the
 * hypervisor, not the guest, takes the CPUs away: the guest's scheduler sees no other thread and
 * switches nothing. The nineteenth round's host (docs/benchmarks.md) ran some processes several
 * times slower for their whole life, every pool run of a one-token step about 0.7 ms against 0.01
 * (the hand-offs, not the work); llama.cpp's OpenMP barrier, which spins about 300,000 pauses
 * before it sleeps, held its rate there. The likely loop: a worker woken late makes the others'
 * 200 us run out, so they park too and the next run waits for their wake-ups. A busy process on
 * the same core takes it from the spinner at the latest when the spinner's time slice ends (a few
 * ms), and a wait that finds the switches grown parks after 200 us as before. Measured by
 * tests/bench/cpu_engine_shared_cores.py (both kinds of load) and cpu_engine_spin_ab.py (the
 * stolen share beside each process); kernel_test.c's test_pool_spin_alone counts the parks. */
#define DEFAULT_SPIN_NS 200000
#define DEFAULT_SPIN_ALONE_NS 5000000
#define ALONE_CHECK_NS 100000 /* how often a long spin looks at its switches again */

struct hs_pool {
    int n;
    pthread_t *threads;
    long long spin_ns;       /* how long a waiter spins before it parks */
    long long spin_alone_ns; /* ... or, while its core is its own, at most (0: spin_ns) */
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
    _Alignas(64) atomic_ullong parks;    /* waits that ended parked (workers' and the caller's) */
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

/* This thread's involuntary context switches when it last looked (-1: never). */
static _Thread_local long seen_preemptions = -1;

/* Whether no other thread has taken this thread's CPU since it last asked (the first call, and a
 * failed getrusage, say it has). */
static int core_to_itself(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
    const int alone = ru.ru_nivcsw == seen_preemptions;
    seen_preemptions = ru.ru_nivcsw;
    return alone;
}

/* A wait's spin: `until` the short spin's end, then, while the core is this thread's alone, the
 * long spin's (checked every ALONE_CHECK_NS). */
typedef struct {
    long long start, until, check;
    int alone; /* in the long spin */
} spin_clock;

static void spin_start(spin_clock *c, long long now, long long spin_ns) {
    c->start = now;
    c->until = c->check = now + spin_ns;
    c->alone = 0;
}

/* Whether to spin on at time t: until the short spin's end, then through the long spin while
 * the core stays this thread's own. */
static int spin_on(const hs_pool *pool, spin_clock *c, long long t) {
    if (t < c->until) {
        if (!c->alone || t < c->check) return 1;
        if (!core_to_itself()) return 0; /* someone took the core during the long spin: park */
        c->check = t + ALONE_CHECK_NS;
        return 1;
    }
    if (c->alone || pool->spin_alone_ns <= pool->spin_ns || !core_to_itself()) return 0;
    c->alone = 1;
    c->until = c->start + pool->spin_alone_ns;
    c->check = t + ALONE_CHECK_NS;
    return t < c->until;
}

/* Spins while *word == value (see spin_on for how long); returns the last value read. The clock is
 * read every 16 pauses. */
static unsigned spin_while_equal(const hs_pool *pool, atomic_uint *word, unsigned value) {
    unsigned v = atomic_load_explicit(word, memory_order_acquire);
    if (v != value || pool->spin_ns <= 0) return v;
    spin_clock c;
    spin_start(&c, now_ns(), pool->spin_ns);
    for (;;) {
        for (int i = 0; i < 16; i++) {
            CPU_RELAX();
            if ((v = atomic_load_explicit(word, memory_order_acquire)) != value) return v;
        }
        if (!spin_on(pool, &c, now_ns())) return v;
    }
}

/* The first worker from `from` on that has not finished generation gen (pool->n: none),
 * spinning for it and those after it (each worker's line read once it is the first one left) as
 * spin_on says, or not at all without `spin`. */
static int first_busy(hs_pool *pool, int from, unsigned gen, int spin) {
    int i = from;
    int started = 0;
    spin_clock c;
    for (;;) {
        while (i < pool->n &&
               atomic_load_explicit(&pool->done[i].generation, memory_order_acquire) == gen)
            i++;
        if (i == pool->n || !spin || pool->spin_ns <= 0) return i;
        if (!started) {
            spin_start(&c, now_ns(), pool->spin_ns);
            started = 1;
        }
        int k = 0;
        for (; k < 16; k++) {
            CPU_RELAX();
            if (atomic_load_explicit(&pool->done[i].generation, memory_order_acquire) == gen) break;
        }
        if (k == 16 && !spin_on(pool, &c, now_ns())) return i; /* (the clock only after 16 pauses) */
    }
}

static void *worker(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    hs_pool *pool = arg.pool;
    pin(arg.cpu);
    core_to_itself(); /* the switches so far: the first long spin compares with these */
    unsigned seen = 0; /* generation at creation: a task posted before this thread ran is not missed */
    for (;;) {
        unsigned gen = spin_while_equal(pool, &pool->generation, seen);
        if (gen == seen) {
            atomic_fetch_add_explicit(&pool->parks, 1, memory_order_relaxed);
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

/* A spin in microseconds from the environment: HETEROSERVE_POOL_SPIN_US, how long a waiting
 * thread spins before it parks (0 parks at once; 10000 spins about as the pool did before it
 * parked: its workers slept after some milliseconds, its caller never), and
 * HETEROSERVE_POOL_SPIN_ALONE_US, how long it spins at most while no other thread wants its core
 * (a value not above the first, 0 included, spins only the first). Unset, empty or not a number:
 * the default. */
static long long spin_ns_from_env(const char *name, long long fallback) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end;
    const double us = strtod(s, &end);
    if (end == s || us < 0) return fallback;
    return us > 1e9 ? (long long)1e15 : (long long)(us * 1000.0);
}

hs_pool *hs_pool_create(int n, const int *cpus, int pin_caller) {
    if (n < 1) return NULL;
    hs_pool *pool = aligned_alloc(64, (sizeof(hs_pool) + 63) / 64 * 64);
    if (!pool) return NULL;
    memset(pool, 0, sizeof *pool);
    pool->n = n;
    pool->spin_ns = spin_ns_from_env("HETEROSERVE_POOL_SPIN_US", DEFAULT_SPIN_NS);
    pool->spin_alone_ns = spin_ns_from_env("HETEROSERVE_POOL_SPIN_ALONE_US", DEFAULT_SPIN_ALONE_NS);
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
    int busy = first_busy(pool, 1, gen, 1);
    if (busy == pool->n) return;
    atomic_fetch_add_explicit(&pool->parks, 1, memory_order_relaxed);
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

unsigned long long hs_pool_parks(const hs_pool *pool) {
    return atomic_load_explicit(&pool->parks, memory_order_relaxed);
}

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
