/* RMSNorm with the residual add before it, in one pass per row, fp32.
 *
 * torch's CPU rms_norm is a composite of six ops (pow, mean, add, rsqrt, two multiplies), ~25 us
 * per call for one 576-float row; a decoder layer runs two, each after a residual add, so at a
 * batch-1 decode on SmolLM2 the 61 norms of a step cost ~1.8 ms of its ~17. Here a row is read
 * once for the add and its sum of squares and once more for the scaled output. Rows go to the
 * thread pool only in large steps: one row is well under a microsecond, less than a hand-off.
 */
#include "isa.h"
#include "thread_pool.h"

#include <math.h>
#include <stdint.h>

typedef struct {
    float *h;            /* [n, d] the residual stream; h += delta first where delta is given */
    const float *delta;  /* [n, d] or NULL */
    const float *w;      /* [d] */
    float *y;            /* [n, d] */
    int64_t n, d;
    float eps;
} norm_job;

static void norm_row_scalar(const norm_job *j, int64_t r) {
    float *h = j->h + r * j->d, *y = j->y + r * j->d;
    const float *delta = j->delta ? j->delta + r * j->d : NULL;
    float ss = 0.f;
    for (int64_t i = 0; i < j->d; i++) {
        if (delta) h[i] += delta[i];
        ss += h[i] * h[i];
    }
    const float inv = 1.f / sqrtf(ss / (float)j->d + j->eps);
    for (int64_t i = 0; i < j->d; i++) y[i] = h[i] * inv * j->w[i];
}

#ifdef QL_X86
AVX2 static void norm_row_avx2(const norm_job *j, int64_t r) {
    float *h = j->h + r * j->d, *y = j->y + r * j->d;
    const float *delta = j->delta ? j->delta + r * j->d : NULL;
    __m256 ss0 = _mm256_setzero_ps(), ss1 = _mm256_setzero_ps();  /* two chains: FMA latency */
    int64_t i = 0;
    for (; i + 16 <= j->d; i += 16) {
        __m256 a = _mm256_loadu_ps(h + i), b = _mm256_loadu_ps(h + i + 8);
        if (delta) {
            a = _mm256_add_ps(a, _mm256_loadu_ps(delta + i));
            b = _mm256_add_ps(b, _mm256_loadu_ps(delta + i + 8));
            _mm256_storeu_ps(h + i, a);
            _mm256_storeu_ps(h + i + 8, b);
        }
        ss0 = _mm256_fmadd_ps(a, a, ss0);
        ss1 = _mm256_fmadd_ps(b, b, ss1);
    }
    float ss = hsum_ps(_mm256_add_ps(ss0, ss1));
    for (; i < j->d; i++) {
        if (delta) h[i] += delta[i];
        ss += h[i] * h[i];
    }
    const float inv = 1.f / sqrtf(ss / (float)j->d + j->eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= j->d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(h + i), vinv), _mm256_loadu_ps(j->w + i)));
    for (; i < j->d; i++) y[i] = h[i] * inv * j->w[i];
}
#endif

static void norm_task(void *p, int64_t chunk, int64_t nchunks) {
    const norm_job *j = p;
    int64_t lo, hi;
    chunk_range(j->n, chunk, nchunks, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
#ifdef QL_X86
        if (use_avx2()) { norm_row_avx2(j, r); continue; }
#endif
        norm_row_scalar(j, r);
    }
}

/* y = RMSNorm(h) * w over rows of d floats, after h += delta where delta is not NULL (h, y and delta
 * contiguous; y may be h). Returns 0. */
int add_rms_norm(float *h, const float *delta, const float *w, float *y, int64_t n, int64_t d, float eps) {
    norm_job job = {h, delta, w, y, n, d, eps};
    const int64_t chunks = num_chunks(n, 64);  /* ~64 rows (~10 us) a chunk at least */
    if (chunks <= 1) {
        norm_task(&job, 0, 1);
        return 0;
    }
    pool_lock();
    pool_parallel(norm_task, &job, chunks);
    pool_unlock();
    return 0;
}
