/* Test harness for engine/kernels/csrc/thread_pool.c (tests/test_thread_pool.py): jobs of few and many
 * chunks in turn, each unit of work counting how often it ran; every unit must run once per job. */
#include <stdatomic.h>
#include <stdint.h>

#include "thread_pool.h"

#define MAX_UNITS 4096

typedef struct {
    atomic_int *counts;
    int64_t units;
} count_job;

static atomic_int counts[MAX_UNITS];

static void count_task(void *p, int64_t chunk, int64_t nchunks) {
    const count_job *j = p;
    int64_t lo, hi;
    chunk_range(j->units, chunk, nchunks, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&j->counts[i], 1);
}

/* `rounds` times a job of `small` chunks, then one of `large`; returns the units that ran other than once */
int64_t pool_stress(int rounds, int small, int large) {
    if (large > MAX_UNITS) return -1;
    qlin_init_threads(2);
    int64_t wrong = 0;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
            const int n = k ? large : small;
            for (int i = 0; i < n; i++) atomic_store(&counts[i], 0);
            count_job job = {counts, n};
            pool_lock();
            pool_parallel(count_task, &job, n);
            pool_unlock();
            for (int i = 0; i < n; i++) wrong += atomic_load(&counts[i]) != 1;
            /* a varying pause between jobs, so a late worker wakes at every point of the next publication */
            for (volatile int i = 0; i < (r * 7919) % 4096; i++) {}
        }
    return wrong;
}
