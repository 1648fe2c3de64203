/* A small persistent thread pool shared by the CPU kernels (its own pthreads, not OpenMP: a second
 * OpenMP runtime next to torch's would spin against it). One job at a time: a kernel takes the pool
 * with pool_lock, runs one or more pool_parallel jobs, then pool_unlock. */
#ifndef THREAD_POOL_H
#define THREAD_POOL_H
#include <stdint.h>

typedef void (*task_fn)(void *arg, int64_t chunk, int64_t nchunks);

void pool_lock(void);
void pool_unlock(void);
/* run fn on chunks 0..nchunks-1, spread over the pool; the caller holds the lock */
void pool_parallel(task_fn fn, void *arg, int64_t nchunks);
/* [lo, hi) of `total` units that chunk `chunk` of `nchunks` covers */
void chunk_range(int64_t total, int64_t chunk, int64_t nchunks, int64_t *lo, int64_t *hi);
/* the pool's threads, the caller included (1 before qlin_init_threads) */
int pool_threads(void);
/* chunks for `total` units of work: ~`grain` units each, at least one */
int64_t num_chunks(int64_t total, int64_t grain);

/* exported to Python: start the pool once with n threads (the caller is one); returns its size */
int qlin_init_threads(int n);
/* exported: send spinning workers to sleep at once (before torch's own threads take the cores) */
void qlin_park(void);

#endif
