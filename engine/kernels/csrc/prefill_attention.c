/* Causal attention of a prefill chunk's queries over its keys (context and chunk), in fp32.
 *
 * torch's CPU SDPA (its flash kernel) ran a 512-token chunk of Qwen2.5-0.5B's 14 heads at ~95 GFLOP/s on
 * 2 Zen 5 cores, a fifth of a 512-token prefill there. Here each task is one query head and a block of 16
 * queries, flash-style: per block of 16 keys, the 16 x 16 scores in 16 registers of one key each, the 16
 * queries in the lanes (one FMA per key and dimension against the queries transposed), an online softmax
 * lane-wise, and the weighted values added into the block's output, held transposed. Blocks of keys no query
 * of the block sees are skipped. (A first version kept one query a register, against keys transposed per KV
 * head: its softmax needed two horizontal reductions and a scalar exp per query and block, as many
 * instructions as the FMAs.)
 *
 * Layout: q and out [n, heads, head_dim] (row stride q_ld / out_ld floats); keys and values of KV head h,
 * key j at k + h * k_hs + j * k_js (the same for v); query i sits at position q_pos0 + i, key j at k_pos0 + j,
 * and sees the keys at positions <= its own, and > its own - window where window > 0. The query heads of KV
 * head h are h * group ... + group. AVX-512 F where the CPU has it, portable C elsewhere (the tests' second
 * reference); the engine calls it only where the AVX-512 code runs.
 */
#include "isa.h"
#include "thread_pool.h"

#include <math.h>
#include <stdint.h>

#define QB 16        /* queries per task */
#define KB 16        /* keys per block: one register of scores per query */
#define MAX_DIM 256

typedef struct {
    const float *q, *k, *v;
    float *out;
    int64_t n, keys, heads, kv_heads, dim, q_ld, out_ld, k_hs, k_js, v_hs, v_js, q_pos0, k_pos0, window;
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
/* e^x on 16 lanes for x in [-88, 88] (clamped; NaN reads -88): isa.h's exp_ps, its 2^k by scalef */
AVX512_INLINE static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.f)), _mm512_set1_ps(88.f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);   /* ln 2 in two parts, as exp_ps */
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, k);
}

/* queries i0 .. i0 + QB - 1 (those < n) of head h, one query a lane: a block's 16 x 16 scores are 16
 * registers of one key each, so the online softmax is lane-wise (no horizontal reductions); the queries and
 * the output are held transposed, [dim][QB]. Keys past the end are read at the last key and weighted 0. */
AVX512 static void attend_block_avx512(const prefill_job *j, int64_t i0, int64_t h) {
    const int64_t kvh = h / (j->heads / j->kv_heads), d = j->dim;
    const int rows = j->n - i0 < QB ? (int)(j->n - i0) : QB;
    float qt[MAX_DIM][QB] __attribute__((aligned(64)));
    float acc[MAX_DIM][QB] __attribute__((aligned(64)));
    int32_t first[QB] __attribute__((aligned(64))), last[QB] __attribute__((aligned(64)));
    int64_t lo = INT64_MAX, hi = -1;
    for (int r = 0; r < QB; r++) {
        int64_t f = INT32_MAX, t = -1;                                 /* lanes past the chunk see no key */
        if (r < rows) visible_keys(j, i0 + r, &f, &t);
        if (f <= t) lo = f < lo ? f : lo, hi = t > hi ? t : hi;
        first[r] = (int32_t)f, last[r] = (int32_t)t;
        for (int64_t c = 0; c < d; c++) {
            qt[c][r] = r < rows ? j->q[(i0 + r) * j->q_ld + h * d + c] * j->scale : 0.f;
            acc[c][r] = 0.f;
        }
    }
    const __m512i vfirst = _mm512_load_si512(first), vlast = _mm512_load_si512(last);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m = ninf, l = _mm512_setzero_ps();
    for (int64_t kb = lo / KB * KB; kb <= hi; kb += KB) {
        const float *kp[KB], *vp[KB];
        for (int t = 0; t < KB; t++) {
            const int64_t key = kb + t < j->keys ? kb + t : j->keys - 1;
            kp[t] = j->k + kvh * j->k_hs + key * j->k_js;
            vp[t] = j->v + kvh * j->v_hs + key * j->v_js;
        }
        __m512 s[KB];
        for (int t = 0; t < KB; t++) s[t] = _mm512_setzero_ps();
        for (int64_t c = 0; c < d; c++) {
            const __m512 qc = _mm512_load_ps(qt[c]);
            for (int t = 0; t < KB; t++) s[t] = _mm512_fmadd_ps(qc, _mm512_set1_ps(kp[t][c]), s[t]);
        }
        __mmask16 seen[KB];
        __m512 mblock = ninf;
        for (int t = 0; t < KB; t++) {
            const __m512i key = _mm512_set1_epi32((int32_t)(kb + t));
            seen[t] = _mm512_cmple_epi32_mask(vfirst, key) & _mm512_cmple_epi32_mask(key, vlast);
            s[t] = _mm512_mask_mov_ps(ninf, seen[t], s[t]);
            mblock = _mm512_max_ps(mblock, s[t]);
        }
        const __m512 mnew = _mm512_max_ps(m, mblock);
        const __m512 alpha = exp512(_mm512_sub_ps(m, mnew));          /* ~0 where nothing was seen before */
        l = _mm512_mul_ps(l, alpha);
        for (int t = 0; t < KB; t++) {
            s[t] = _mm512_maskz_mov_ps(seen[t], exp512(_mm512_sub_ps(s[t], mnew)));
            l = _mm512_add_ps(l, s[t]);
        }
        m = mnew;
        for (int64_t c = 0; c < d; c++) {
            __m512 o = _mm512_mul_ps(_mm512_load_ps(acc[c]), alpha);
            for (int t = 0; t < KB; t++) o = _mm512_fmadd_ps(s[t], _mm512_set1_ps(vp[t][c]), o);
            _mm512_store_ps(acc[c], o);
        }
    }
    float inv[QB] __attribute__((aligned(64)));
    const __mmask16 any = _mm512_cmp_ps_mask(l, _mm512_setzero_ps(), _CMP_GT_OQ);
    _mm512_store_ps(inv, _mm512_maskz_div_ps(any, _mm512_set1_ps(1.f), l));
    for (int r = 0; r < rows; r++) {
        float *out = j->out + (i0 + r) * j->out_ld + h * d;
        for (int64_t c = 0; c < d; c++) out[c] = acc[c][r] * inv[r];
    }
}
#endif

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
 * multiple of kv_heads, more than 16384 keys) */
int prefill_attention(const float *q, int64_t q_ld, const float *k, int64_t k_hs, int64_t k_js, const float *v,
                      int64_t v_hs, int64_t v_js, float *out, int64_t out_ld, int64_t n, int64_t keys, int64_t heads,
                      int64_t kv_heads, int64_t dim, int64_t q_pos0, int64_t k_pos0, int64_t window, float scale) {
    if (dim % 16 || dim > MAX_DIM || kv_heads < 1 || heads % kv_heads || keys > (1 << 14)) return -1;
    if (n <= 0 || keys <= 0) return 0;
    prefill_job job = {q, k, v, out, n, keys, heads, kv_heads, dim, q_ld, out_ld, k_hs, k_js, v_hs, v_js,
                       q_pos0, k_pos0, window, scale};
    pool_lock();
    pool_parallel(attend_task, &job, heads * ((n + QB - 1) / QB));
    pool_unlock();
    return 0;
}
