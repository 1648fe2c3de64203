/* Decode attention read in place from a paged KV cache, in fp32.
 *
 * A decode step's attention reads every cached key and value of every running sequence once; for a
 * chat batch that is more bytes than the model's quantized weights (16 sequences of 500 tokens:
 * 368 MB of SmolLM2's fp32 KV against 96 MB of weights). Gathering them into a padded buffer for
 * SDPA, as the torch backend does, reads them, writes them and reads them again, padded to the
 * longest sequence. Here each (sequence, KV head) reads its keys and values where they lie, block
 * by block: one pass for the scores of the query heads sharing that KV head, an exact softmax
 * (max-subtracted, vectorized exp), one pass for the weighted values.
 *
 * Layout (the engine's): cache [slots, kv_heads, head_dim] per layer, slot = block * block_size +
 * offset, in fp32 or fp16 (half the bytes to read, converted eight at a time with F16C; the
 * arithmetic is fp32 either way); q and out [seqs, heads, head_dim] in fp32; the query heads of KV
 * head h are h * group ... + group.
 */
#include "half.h"
#include "isa.h"
#include "thread_pool.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    const float *q;
    const void *k_cache, *v_cache;  /* fp32, or fp16 where kv_fp16 */
    const int32_t *block_tables;  /* [seqs, max_blocks] */
    const int32_t *seq_lens;      /* [seqs] keys each sequence attends to */
    float *out;
    int64_t seqs, heads, kv_heads, head_dim, block_size, max_blocks;
    float scale;
    int kv_fp16;
    atomic_int failed;  /* a thread could not get its work buffer: the call fails */
} attn_job;

/* a per-thread work buffer (each pool thread keeps its own), grown to at least `bytes` */
static char *work_buffer(int64_t bytes) {
    static __thread char *buf = NULL;
    static __thread int64_t cap = 0;
    if (bytes > cap) {
        char *grown = realloc(buf, (size_t)bytes);
        if (!grown) return NULL;
        buf = grown;
        cap = bytes;
    }
    return buf;
}

/* the cache row (element offset) of each of the n keys, walking the block table once: both the
 * key pass and the value pass read them, and no key pays a division */
static void key_rows(const attn_job *j, const int32_t *table, int64_t n, int64_t kvh, int64_t *rows) {
    for (int64_t t0 = 0, b = 0; t0 < n; t0 += j->block_size, b++) {
        const int64_t slot = (int64_t)table[b] * j->block_size;
        const int64_t end = n - t0 < j->block_size ? n - t0 : j->block_size;
        for (int64_t i = 0; i < end; i++) rows[t0 + i] = ((slot + i) * j->kv_heads + kvh) * j->head_dim;
    }
}

/* softmax of each of the group's score rows in place, unnormalized: inv_sum[g] = 1 / the row's sum */
static void softmax_scalar(float *s, int64_t n, int64_t group, float *inv_sum) {
    for (int64_t g = 0; g < group; g++, s += n) {
        float m = -INFINITY, l = 0.f;
        for (int64_t t = 0; t < n; t++) m = fmaxf(m, s[t]);
        for (int64_t t = 0; t < n; t++) l += s[t] = expf(s[t] - m);
        inv_sum[g] = 1.f / l;
    }
}

/* element i of the cache row at `row` */
static inline float cache_at(const attn_job *j, const void *cache, int64_t row, int64_t i) {
    return j->kv_fp16 ? half_to_float(((const uint16_t *)cache)[row + i]) : ((const float *)cache)[row + i];
}

static void attend_scalar(const attn_job *j, int64_t seq, int64_t kvh, const int64_t *rows, float *s) {
    const int64_t d = j->head_dim, group = j->heads / j->kv_heads, n = j->seq_lens[seq];
    const float *q = j->q + (seq * j->heads + kvh * group) * d;
    float *out = j->out + (seq * j->heads + kvh * group) * d, inv_sum[64];
    for (int64_t t = 0; t < n; t++) {
        const int64_t k = rows[t];
        for (int64_t g = 0; g < group; g++) {
            float dot = 0.f;
            for (int64_t i = 0; i < d; i++) dot += q[g * d + i] * cache_at(j, j->k_cache, k, i);
            s[g * n + t] = dot * j->scale;
        }
    }
    softmax_scalar(s, n, group, inv_sum);
    for (int64_t i = 0; i < group * d; i++) out[i] = 0.f;
    for (int64_t t = 0; t < n; t++) {
        const int64_t v = rows[t];
        for (int64_t g = 0; g < group; g++)
            for (int64_t i = 0; i < d; i++) out[g * d + i] += s[g * n + t] * cache_at(j, j->v_cache, v, i);
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < d; i++) out[g * d + i] *= inv_sum[g];
}

#ifdef QL_X86

/* lanes 0-3 = the sums of a, b, c and d's eight lanes */
AVX2_INLINE static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

AVX2 static void softmax_avx2(float *s, int64_t n, int64_t group, float *inv_sum) {
    for (int64_t g = 0; g < group; g++, s += n) {
        int64_t t = 0;
        __m256 mv = _mm256_set1_ps(-INFINITY);
        for (; t + 8 <= n; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + t));
        float m = hmax_ps(mv);
        for (; t < n; t++) m = fmaxf(m, s[t]);
        __m256 sum = _mm256_setzero_ps(), mb = _mm256_set1_ps(m);
        for (t = 0; t + 8 <= n; t += 8) {
            __m256 p = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t), mb));
            _mm256_storeu_ps(s + t, p);
            sum = _mm256_add_ps(sum, p);
        }
        float l = hsum_ps(sum);
        for (; t < n; t++) l += s[t] = expf(s[t] - m);
        inv_sum[g] = 1.f / l;
    }
}

/* eight cache elements from `row` + i as floats; fp16 is a constant where this is inlined */
AVX2_INLINE static inline __m256 load8(const void *cache, int64_t row, int64_t i, int fp16) {
    if (fp16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)cache + row + i)));
    return _mm256_loadu_ps((const float *)cache + row + i);
}

/* Register tiles: G query heads x 4 keys of scores, G heads x 8C dimensions of output (G <= 3,
 * C <= 4: at most twelve accumulators), so that each cached element is loaded and converted once
 * for all the heads sharing it, not once per head. */

/* scores of keys t..t+3 (cache rows k[0..3]) for query heads g0..g0+G-1 */
AVX2_INLINE static inline void scores_tile(const attn_job *j, const float *q, const int64_t *k, int64_t n,
                                           int64_t t, int64_t g0, float *s, int fp16, const int G) {
    __m256 acc[3][4];
    for (int g = 0; g < G; g++)
        for (int r = 0; r < 4; r++) acc[g][r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < j->head_dim; i += 8)
        for (int r = 0; r < 4; r++) {
            const __m256 kv = load8(j->k_cache, k[r], i, fp16);
            for (int g = 0; g < G; g++)
                acc[g][r] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + (g0 + g) * j->head_dim + i), acc[g][r]);
        }
    const __m128 scale = _mm_set1_ps(j->scale);
    for (int g = 0; g < G; g++)
        _mm_storeu_ps(s + (g0 + g) * n + t, _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), scale));
}

/* the score of one key (cache row k) for query heads g0..g0+G-1: the keys after the last tile of four */
AVX2_INLINE static inline void score_one(const attn_job *j, const float *q, int64_t k, int64_t n, int64_t t,
                                         int64_t g0, float *s, int fp16, const int G) {
    __m256 acc[3];
    for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
    for (int64_t i = 0; i < j->head_dim; i += 8) {
        const __m256 kv = load8(j->k_cache, k, i, fp16);
        for (int g = 0; g < G; g++)
            acc[g] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q + (g0 + g) * j->head_dim + i), acc[g]);
    }
    for (int g = 0; g < G; g++) s[(g0 + g) * n + t] = hsum_ps(acc[g]) * j->scale;
}

AVX2_INLINE static inline void scores_heads(const attn_job *j, const float *q, const int64_t *rows, int64_t n,
                                            int64_t g0, float *s, int fp16, const int G) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) scores_tile(j, q, rows + t, n, t, g0, s, fp16, G);
    for (; t < n; t++) score_one(j, q, rows[t], n, t, g0, s, fp16, G);
}

/* out[g][i0..i0+8C) for heads g0..g0+G-1 = sum over keys of p[g][t] v_t, times 1 / the row's sum */
AVX2_INLINE static inline void values_tile(const attn_job *j, const int64_t *rows, int64_t n, const float *p,
                                           int64_t g0, int64_t i0, const float *inv_sum, float *out, int fp16,
                                           const int G, const int C) {
    __m256 acc[3][4];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < C; c++) acc[g][c] = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; t++) {
        __m256 pg[3];
        for (int g = 0; g < G; g++) pg[g] = _mm256_broadcast_ss(p + (g0 + g) * n + t);
        for (int c = 0; c < C; c++) {
            const __m256 vv = load8(j->v_cache, rows[t], i0 + 8 * c, fp16);
            for (int g = 0; g < G; g++) acc[g][c] = _mm256_fmadd_ps(pg[g], vv, acc[g][c]);
        }
    }
    for (int g = 0; g < G; g++) {
        const __m256 inv = _mm256_set1_ps(inv_sum[g0 + g]);
        for (int c = 0; c < C; c++)
            _mm256_storeu_ps(out + (g0 + g) * j->head_dim + i0 + 8 * c, _mm256_mul_ps(acc[g][c], inv));
    }
}

AVX2_INLINE static inline void values_heads(const attn_job *j, const int64_t *rows, int64_t n, const float *p,
                                            int64_t g0, const float *inv_sum, float *out, int fp16, const int G) {
    int64_t i = 0;
    for (; i + 32 <= j->head_dim; i += 32) values_tile(j, rows, n, p, g0, i, inv_sum, out, fp16, G, 4);
    switch ((j->head_dim - i) / 8) {  /* head_dim is a multiple of 8 here */
        case 3: values_tile(j, rows, n, p, g0, i, inv_sum, out, fp16, G, 3); break;
        case 2: values_tile(j, rows, n, p, g0, i, inv_sum, out, fp16, G, 2); break;
        case 1: values_tile(j, rows, n, p, g0, i, inv_sum, out, fp16, G, 1); break;
        default: break;
    }
}

AVX2_INLINE static inline void attend_avx2_as(const attn_job *j, int64_t seq, int64_t kvh, const int64_t *rows,
                                              float *s, int fp16) {
    const int64_t d = j->head_dim, group = j->heads / j->kv_heads, n = j->seq_lens[seq];
    const float *q = j->q + (seq * j->heads + kvh * group) * d;
    float *out = j->out + (seq * j->heads + kvh * group) * d, inv_sum[64];
    /* the group's heads three at a time, then the one or two left */
    int64_t g = 0;
    for (; g + 3 <= group; g += 3) scores_heads(j, q, rows, n, g, s, fp16, 3);
    if (group - g == 2) scores_heads(j, q, rows, n, g, s, fp16, 2);
    if (group - g == 1) scores_heads(j, q, rows, n, g, s, fp16, 1);
    softmax_avx2(s, n, group, inv_sum);
    for (g = 0; g + 3 <= group; g += 3) values_heads(j, rows, n, s, g, inv_sum, out, fp16, 3);
    if (group - g == 2) values_heads(j, rows, n, s, g, inv_sum, out, fp16, 2);
    if (group - g == 1) values_heads(j, rows, n, s, g, inv_sum, out, fp16, 1);
}

AVX2 static void attend_avx2(const attn_job *j, int64_t seq, int64_t kvh, const int64_t *rows, float *s) {
    if (j->kv_fp16) attend_avx2_as(j, seq, kvh, rows, s, 1);
    else attend_avx2_as(j, seq, kvh, rows, s, 0);
}
#endif /* QL_X86 */

static void attend_task(void *p, int64_t chunk, int64_t nchunks) {
    attn_job *j = p;
    int64_t lo, hi;
    chunk_range(j->seqs * j->kv_heads, chunk, nchunks, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int64_t seq = item / j->kv_heads, kvh = item % j->kv_heads;
        const int64_t n = j->seq_lens[seq], group = j->heads / j->kv_heads;
        char *work = work_buffer(n * (int64_t)sizeof(int64_t) + group * n * (int64_t)sizeof(float));
        if (!work) {
            atomic_store(&j->failed, 1);
            return;
        }
        int64_t *rows = (int64_t *)work;                  /* malloc's alignment, then the scores */
        float *s = (float *)(work + n * sizeof(int64_t));
        key_rows(j, j->block_tables + seq * j->max_blocks, n, kvh, rows);
#ifdef QL_X86
        if (use_avx2() && j->head_dim % 8 == 0) { attend_avx2(j, seq, kvh, rows, s); continue; }
#endif
        attend_scalar(j, seq, kvh, rows, s);
    }
}

/* out[s, h, :] = softmax(q[s, h, :] . K_s^T * scale) V_s for every decode sequence s, reading K_s and
 * V_s (the first seq_lens[s] positions of its block table) from the paged caches (fp16 where kv_fp16).
 * Returns 0, -1 for a group of more than 64 query heads per KV head or heads not a multiple of
 * kv_heads, -2 for a sequence with no key, -3 out of memory. */
int paged_decode_attention(const float *q, const void *k_cache, const void *v_cache, int kv_fp16,
                           const int32_t *block_tables, const int32_t *seq_lens, float *out, int64_t seqs, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale) {
    if (kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > 64) return -1;
    for (int64_t i = 0; i < seqs; i++)
        if (seq_lens[i] <= 0) return -2;
    attn_job job = {q, k_cache, v_cache, block_tables, seq_lens, out, seqs, heads, kv_heads, head_dim,
                    block_size, max_blocks, scale, kv_fp16, 0};
    pool_lock();
    pool_parallel(attend_task, &job, seqs * kv_heads);
    pool_unlock();
    return atomic_load(&job.failed) ? -3 : 0;
}
