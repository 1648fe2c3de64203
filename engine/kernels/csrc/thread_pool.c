/* The CPU kernels' thread pool (see thread_pool.h). */
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

/* A job is cut into chunks that every thread, the caller included, claims one at a time: when a
 * worker is descheduled (2 cores shared with torch and other processes) the caller simply does its
 * share instead of spinning on it. A claim is a CAS on one word holding the job's generation, its
 * number of chunks and the next chunk, so a worker that wakes after its job ended can never take a
 * chunk of the next one, nor a chunk past the end of its own: it reads the bound from the same word
 * it claims on. (Reading the count apart from the word let a worker delayed between seeing a new
 * generation and reading the count take the next job's count as its own and claim a chunk of a job
 * that had ended: that chunk ran twice or on a finished job's arguments, which crashed the daemon.) */

#define MAX_THREADS 64
#define SPIN_ITERS 4000  /* ~100 us of pause before a worker sleeps: a step's matmuls come that close */
#define CHUNK_BITS 20    /* the claim word: generation (24 bits) | chunks (20) | next chunk (20) */
#define MAX_CHUNKS ((1 << CHUNK_BITS) - 1)
#define CHUNK_MASK ((uint64_t)MAX_CHUNKS)
#define GEN_MASK 0xffffffu

static struct {
    int nth;  /* threads including the caller; 0 until started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;         /* bumped to publish a job */
    atomic_int park;         /* set: spinning workers go to sleep now (torch's threads want the cores) */
    atomic_uint_fast64_t claim;  /* gen (24 bits) << 40 | chunks << 20 | next chunk */
    atomic_int_fast64_t done;    /* chunks finished */
    task_fn fn;
    void *arg;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time uses the pool */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline uint64_t claim_word(unsigned gen, int64_t nchunks) {
    return (uint64_t)(gen & GEN_MASK) << (2 * CHUNK_BITS) | (uint64_t)nchunks << CHUNK_BITS;
}

/* claim and run chunks of job `gen` until none is left. A successful claim of a chunk below the
 * count keeps the job from finishing, so fn and arg are still that job's when read after it. */
static void run_chunks(unsigned gen) {
    uint_fast64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        const int64_t next = (int64_t)(c & CHUNK_MASK), total = (int64_t)(c >> CHUNK_BITS & CHUNK_MASK);
        if ((unsigned)(c >> (2 * CHUNK_BITS)) != (gen & GEN_MASK) || next >= total) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        pool.fn(pool.arg, next, total);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

static void *worker(void *unused) {
    (void)unused;
    unsigned seen = atomic_load(&pool.gen);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERS && !atomic_load_explicit(&pool.park, memory_order_relaxed)) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool.mu);
            while (atomic_load(&pool.gen) == seen) pthread_cond_wait(&pool.cv, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
#ifdef POOL_TEST_DELAY  /* tests/test_thread_pool.py: a worker slow to start its job (descheduled) */
        for (volatile int i = 0; i < POOL_TEST_DELAY; i++) {}
#endif
        run_chunks(g);
    }
    return NULL;
}

/* a forked child has no workers: start again from one thread */
static void after_fork_child(void) {
    pool.nth = 0;
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.cv, NULL);
    pthread_mutex_init(&call_mu, NULL);
}

int qlin_init_threads(int n) {
    pthread_mutex_lock(&call_mu);
    if (pool.nth == 0) {
        static int registered = 0;
        if (!registered) registered = pthread_atfork(NULL, NULL, after_fork_child) == 0;
        n = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
        pool.nth = 1;
        for (int i = 1; i < n; i++) {
            pthread_t th;
            if (pthread_create(&th, NULL, worker, NULL) != 0) break;
            pthread_detach(th);
            pool.nth = i + 1;
        }
    }
    int nth = pool.nth;
    pthread_mutex_unlock(&call_mu);
    return nth;
}

void qlin_park(void) { atomic_store_explicit(&pool.park, 1, memory_order_relaxed); }

void pool_parallel(task_fn fn, void *arg, int64_t nchunks) {
    if (pool.nth <= 1 || nchunks <= 1) {
        for (int64_t i = 0; i < nchunks; i++) fn(arg, i, nchunks);
        return;
    }
    if (nchunks > MAX_CHUNKS) nchunks = MAX_CHUNKS;  /* tasks split their work by chunk_range: any count works */
    unsigned gen = atomic_load(&pool.gen) + 1;
    atomic_store_explicit(&pool.park, 0, memory_order_relaxed);
    pool.fn = fn;
    pool.arg = arg;
    atomic_store(&pool.done, 0);
#ifdef POOL_TEST_DELAY  /* ... and a caller descheduled while it publishes a job */
    for (volatile int i = 0; i < POOL_TEST_DELAY / 4; i++) {}
#endif
    atomic_store_explicit(&pool.claim, claim_word(gen, nchunks), memory_order_release);
    pthread_mutex_lock(&pool.mu);
    atomic_store_explicit(&pool.gen, gen, memory_order_release);
    pthread_cond_broadcast(&pool.cv);
    pthread_mutex_unlock(&pool.mu);
    run_chunks(gen);
    /* only chunks a worker claimed are left: wait, yielding the core if that worker is not running */
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < nchunks; spins++) {
        if (spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
}

void chunk_range(int64_t total, int64_t chunk, int64_t nchunks, int64_t *lo, int64_t *hi) {
    *lo = total * chunk / nchunks;
    *hi = total * (chunk + 1) / nchunks;
}

int pool_threads(void) { return pool.nth < 1 ? 1 : pool.nth; }

int64_t num_chunks(int64_t total, int64_t grain) {
    int64_t n = total / grain;
    return n < 1 ? 1 : n > total ? total : n;
}

void pool_lock(void) { pthread_mutex_lock(&call_mu); }

void pool_unlock(void) { pthread_mutex_unlock(&call_mu); }
