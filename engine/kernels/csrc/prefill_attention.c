/* Causal attention of a prefill chunk's queries over its keys (context and chunk), in fp32.
 *
 * torch's CPU SDPA (its flash kernel) ran a 512-token chunk of Qwen2.5-0.5B's 14 heads at ~95 GFLOP/s on
 * 2 Zen 5 cores, a fifth of a 512-token prefill there. Here each task is one query head and a block of 16
 * queries, flash-style: per block of 16 keys, the 16 x 16 scores in 16 registers (one FMA per query and
 * dimension against a row of the keys transposed once per KV head), an online softmax per query, and the
 * weighted values added into the block's output rows. Blocks of keys no query of the block sees are skipped.
 *
 * Layout: q and out [n, heads, head_dim] (row stride q_ld / out_ld floats); keys and values of KV head h,
 * key j at k + h * k_hs + j * k_js (the same for v); query i sits at position q_pos0 + i, key j at k_pos0 + j,
 * and sees the keys at positions <= its own, and > its own - window where window > 0. The query heads of KV
 * head h are h * group ... + group. AVX-512 F where the CPU has it, portable C elsewhere (the tests' second
 * reference); the engine calls it only where the AVX-512 code runs.
 */
#include "isa.h"
#include "quant_blocks.h"
#include "thread_pool.h"

#include <math.h>
#include <stdint.h>

#define QB 16        /* queries per task */
#define KB 16        /* keys per block: one register of scores per query */
#define MAX_DIM 256

typedef struct {
    const float *q, *k, *v;
    float *out;
    float *kt;       /* keys transposed: [kv_heads][head_dim][keys padded to KB] */
    int64_t n, keys, heads, kv_heads, dim, q_ld, out_ld, k_hs, k_js, v_hs, v_js, q_pos0, k_pos0, window, padded;
    float scale;
} prefill_job;

/* the keys query i sees: [first, last] (last < first: none) */
static void visible_keys(const prefill_job *j, int64_t i, int64_t *first, int64_t *last) {
    const int64_t pos = j->q_pos0 + i;
    *last = pos - j->k_pos0 < j->keys - 1 ? pos - j->k_pos0 : j->keys - 1;
    *first = j->window > 0 && pos - j->window + 1 - j->k_pos0 > 0 ? pos - j->window + 1 - j->k_pos0 : 0;
}

/* ---- portable code: one query at a time, two passes (max, then exp and sums) ------------------------ */

static void attend_row_scalar(const prefill_job *j, int64_t i, int64_t h, float *scores) {
    const int64_t kvh = h / (j->heads / j->kv_heads), d = j->dim;
    const float *q = j->q + i * j->q_ld + h * d;
    float *out = j->out + i * j->out_ld + h * d;
    int64_t first, last;
    visible_keys(j, i, &first, &last);
    float mx = -INFINITY, sum = 0.f;
    for (int64_t t = first; t <= last; t++) {
        const float *k = j->k + kvh * j->k_hs + t * j->k_js;
        float s = 0.f;
        for (int64_t c = 0; c < d; c++) s += q[c] * k[c];
        scores[t - first] = s * j->scale;
        mx = scores[t - first] > mx ? scores[t - first] : mx;
    }
    for (int64_t c = 0; c < d; c++) out[c] = 0.f;
    for (int64_t t = first; t <= last; t++) {
        const float p = expf(scores[t - first] - mx);
        const float *v = j->v + kvh * j->v_hs + t * j->v_js;
        sum += p;
        for (int64_t c = 0; c < d; c++) out[c] += p * v[c];
    }
    for (int64_t c = 0; c < d; c++) out[c] = sum > 0.f ? out[c] / sum : 0.f;
}

#ifdef QL_X86
/* e^x on 16 lanes: isa.h's exp_ps on each half */
AVX512_INLINE static inline __m512 exp512(__m512 x) {
    const __m256 lo = exp_ps(_mm512_castps512_ps256(x));
    const __m256 hi = exp_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

/* queries i0 .. i0 + QB - 1 (those < n) of head h */
AVX512 static void attend_block_avx512(const prefill_job *j, int64_t i0, int64_t h) {
    const int64_t kvh = h / (j->heads / j->kv_heads), d = j->dim;
    const int rows = j->n - i0 < QB ? (int)(j->n - i0) : QB;
    float qs[QB][MAX_DIM] __attribute__((aligned(64)));
    float acc[QB][MAX_DIM] __attribute__((aligned(64)));
    float m[QB], l[QB], p[KB] __attribute__((aligned(64)));
    int64_t first[QB], last[QB], lo = INT64_MAX, hi = -1;
    for (int r = 0; r < QB; r++) {
        for (int64_t c = 0; c < d; c++) {
            qs[r][c] = r < rows ? j->q[(i0 + r) * j->q_ld + h * d + c] * j->scale : 0.f;
            acc[r][c] = 0.f;
        }
        m[r] = -INFINITY;
        l[r] = 0.f;
        if (r < rows) visible_keys(j, i0 + r, &first[r], &last[r]);
        else first[r] = 0, last[r] = -1;
        if (first[r] <= last[r]) {
            lo = first[r] < lo ? first[r] : lo;
            hi = last[r] > hi ? last[r] : hi;
        }
    }
    const float *kt = j->kt + kvh * d * j->padded;
    for (int64_t kb = lo / KB * KB; kb <= hi; kb += KB) {
        __m512 s[QB];
        for (int r = 0; r < QB; r++) s[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < d; c++) {
            const __m512 krow = _mm512_loadu_ps(kt + c * j->padded + kb);
            for (int r = 0; r < QB; r++) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(qs[r][c]), krow, s[r]);
        }
        const int nk = j->keys - kb < KB ? (int)(j->keys - kb) : KB;
        for (int r = 0; r < rows; r++) {
            const int64_t a = first[r] > kb ? first[r] - kb : 0, b = last[r] - kb + 1 < nk ? last[r] - kb + 1 : nk;
            if (a >= b) continue;                                   /* no key of this block for this query */
            const __mmask16 seen = (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
            const __m512 sr = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), seen, s[r]);
            const float mnew = fmaxf(m[r], _mm512_reduce_max_ps(sr));
            const float alpha = expf(m[r] - mnew);                  /* 0 on the first block seen */
            const __m512 pr = _mm512_maskz_mov_ps(seen, exp512(_mm512_sub_ps(sr, _mm512_set1_ps(mnew))));
            _mm512_store_ps(p, pr);
            l[r] = l[r] * alpha + _mm512_reduce_add_ps(pr);
            m[r] = mnew;
            for (int64_t c = 0; c < d; c += 16) {
                __m512 o = _mm512_mul_ps(_mm512_load_ps(&acc[r][c]), _mm512_set1_ps(alpha));
                for (int64_t t = a; t < b; t++)
                    o = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), _mm512_loadu_ps(j->v + kvh * j->v_hs + (kb + t) * j->v_js + c), o);
                _mm512_store_ps(&acc[r][c], o);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float *out = j->out + (i0 + r) * j->out_ld + h * d;
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        for (int64_t c = 0; c < d; c++) out[c] = acc[r][c] * inv;
    }
}
#endif

static void transpose_task(void *arg, int64_t chunk, int64_t nchunks) {
    const prefill_job *j = arg;
    int64_t lo, hi;
    chunk_range(j->kv_heads, chunk, nchunks, &lo, &hi);
    for (int64_t h = lo; h < hi; h++) {
        float *kt = j->kt + h * j->dim * j->padded;
        for (int64_t c = 0; c < j->dim; c++)
            for (int64_t t = 0; t < j->padded; t++)
                kt[c * j->padded + t] = t < j->keys ? j->k[h * j->k_hs + t * j->k_js + c] : 0.f;
    }
}

static void attend_task(void *arg, int64_t chunk, int64_t nchunks) {
    const prefill_job *j = arg;
    const int64_t blocks = (j->n + QB - 1) / QB;
    int64_t lo, hi;
    chunk_range(j->heads * blocks, chunk, nchunks, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) {
        const int64_t h = task % j->heads, i0 = task / j->heads * QB;
#ifdef QL_X86
        if (use_avx512()) { attend_block_avx512(j, i0, h); continue; }
#endif
        float scores[1 << 14];   /* the portable code's keys a query: checked by the caller */
        for (int64_t i = i0; i < i0 + QB && i < j->n; i++) attend_row_scalar(j, i, h, scores);
    }
}

/* 0, or -1: a shape this kernel does not take (head_dim not a multiple of 16 up to MAX_DIM, heads not a
 * multiple of kv_heads, more than 16384 keys); -3: no memory for the transposed keys */
int prefill_attention(const float *q, int64_t q_ld, const float *k, int64_t k_hs, int64_t k_js, const float *v,
                      int64_t v_hs, int64_t v_js, float *out, int64_t out_ld, int64_t n, int64_t keys, int64_t heads,
                      int64_t kv_heads, int64_t dim, int64_t q_pos0, int64_t k_pos0, int64_t window, float scale) {
    if (dim % 16 || dim > MAX_DIM || kv_heads < 1 || heads % kv_heads || keys > (1 << 14)) return -1;
    if (n <= 0 || keys <= 0) return 0;
    static void *buf = NULL;
    static size_t cap = 0;
    const int64_t padded = (keys + KB - 1) / KB * KB;
    prefill_job job = {q, k, v, out, NULL, n, keys, heads, kv_heads, dim, q_ld, out_ld, k_hs, k_js, v_hs, v_js,
                       q_pos0, k_pos0, window, padded, scale};
    pool_lock();
    job.kt = grow_scratch(&buf, &cap, (size_t)(kv_heads * dim * padded) * sizeof(float));
    if (!job.kt) { pool_unlock(); return -3; }
    pool_parallel(transpose_task, &job, kv_heads);
    pool_parallel(attend_task, &job, heads * ((n + QB - 1) / QB));
    pool_unlock();
    return 0;
}
