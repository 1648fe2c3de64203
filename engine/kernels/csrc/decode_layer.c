/* One decoder layer of a pure decode step in a single call: the chain of the library's kernels that
 * the model's Python code otherwise runs op by op.
 *
 * After the weights moved to 4-bit kernels, a SmolLM2 decode step at batch 1 spent as long in the
 * ~15 Python-level calls of each layer (module dispatch, argument checks, ctypes, torch's small ops)
 * as in its matmuls. Here a layer is: fused q/k/v projection, rotary embedding and KV-cache write,
 * paged attention, output projection, residual add + norm, gate/up projection, SiLU(gate) * up, down
 * projection, residual add + the next norm. Every step of it is a kernel the Python path also runs
 * (same code, same results), except SiLU * up, which is new here.
 */
#include "isa.h"
#include "kernels.h"
#include "thread_pool.h"

#include <math.h>
#include <stdint.h>

typedef struct {
    int type, interleaved;   /* GGML type; rows interleaved by qlin_x16_repack */
    const uint8_t *w;
    int64_t rows, cols;
} qmatrix;

/* a projection: up to 3 row blocks of its output (a fused q/k/v or gate/up whose parts differ in type, as
 * in a Q4_K_M file's Q6_K v beside Q4_K q and k), plus an optional bias */
#define MAX_PARTS 3
typedef struct {
    qmatrix part[MAX_PARTS];
    int nparts;
    const float *bias;       /* [rows] or NULL */
    int64_t rows;            /* the parts' rows together */
} qproj;

typedef struct {
    qproj qkv, o, gate_up, down;
    const float *post_norm;  /* post_attention_layernorm weight */
    const float *next_norm;  /* the next layer's input_layernorm weight (the model's final norm after the last) */
    float eps;
    int64_t hidden, heads, kv_heads, head_dim, inter;
} layer_params;

typedef struct {
    int64_t n;                       /* decodes, one token each */
    const float *cos, *ssin;         /* [n, head_dim] */
    const int64_t *slots;            /* [n] cache slot of each new token */
    const int32_t *tables, *lens;    /* [n, width] block tables, [n] keys attended */
    int64_t block_size, width;
    float scale;
    int kv_fp16;
    float *qkv, *q, *attn, *proj, *gate_up, *act;  /* scratch: [n, qkv rows], [n, heads * head_dim] x2,
                                                      [n, hidden], [n, 2 inter], [n, inter] */
    int int8;                        /* qlin_x16_matmul's int8 activations (1) or 16-bit (0) */
} decode_step;

/* y [n, rows] = x @ W^T (+ bias) */
static int matmul(const qproj *p, const float *x, int64_t n, float *y, int int8) {
    int64_t col0 = 0;
    for (int k = 0; k < p->nparts; k++) {
        const qmatrix *m = &p->part[k];
        const int rc = m->interleaved ? qlin_x16_matmul(m->type, m->w, m->rows, m->cols, x, n, y + col0, p->rows, int8)
                                      : qlin_matmul(m->type, m->w, m->rows, m->cols, x, n, y + col0, p->rows);
        if (rc) return rc;
        col0 += m->rows;
    }
    if (p->bias)
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < p->rows; i++) y[r * p->rows + i] += p->bias[i];
    return 0;
}

/* ---- SiLU(gate) * up: x / (1 + e^-x) ----------------------------------------------------------- */

static void silu_mul_scalar(const float *gate, const float *up, float *y, int64_t len) {
    for (int64_t i = 0; i < len; i++) y[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

#ifdef QL_X86
AVX2 static void silu_mul_avx2(const float *gate, const float *up, float *y, int64_t len) {
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)),
                                              _mm256_loadu_ps(up + i)));
    }
    silu_mul_scalar(gate + i, up + i, y + i, len - i);
}
#endif

typedef struct {
    const float *gu;
    int64_t n, inter;
    float *y;
} silu_job;

static void silu_task(void *arg, int64_t chunk, int64_t nchunks) {
    const silu_job *j = arg;
    int64_t lo, hi;
    chunk_range(j->n, chunk, nchunks, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *gate = j->gu + r * 2 * j->inter, *up = gate + j->inter;
#ifdef QL_X86
        if (use_avx2()) { silu_mul_avx2(gate, up, j->y + r * j->inter, j->inter); continue; }
#endif
        silu_mul_scalar(gate, up, j->y + r * j->inter, j->inter);
    }
}

/* y[r, :] = SiLU(gu[r, :inter]) * gu[r, inter:] for r < n; exported for the tests */
void silu_mul(const float *gu, int64_t n, int64_t inter, float *y) {
    silu_job job = {gu, n, inter, y};
    const int64_t chunks = num_chunks(n, 1 + 16383 / inter);  /* ~16K values (~10 us) a chunk at least */
    if (chunks <= 1) { silu_task(&job, 0, 1); return; }
    pool_lock();
    pool_parallel(silu_task, &job, chunks);
    pool_unlock();
}

/* ---- the layer ----------------------------------------------------------------------------------- */

/* h [n, hidden]: the residual stream, updated in place; x [n, hidden]: this layer's normed input on
 * entry, the next norm of h on return. Returns 0 or the first failing kernel's code (tagged by
 * stage: -100 x stage + code). */
int decode_layer(const layer_params *p, const decode_step *s, float *h, float *x, void *k_cache, void *v_cache) {
    const int64_t n = s->n;
    int rc;
#define STAGE(k, call) if ((rc = (call)) != 0) return -100 * (k) + rc
    STAGE(1, matmul(&p->qkv, x, n, s->qkv, s->int8));
    STAGE(2, rope_store(s->qkv, p->qkv.rows, n, p->heads, p->kv_heads, p->head_dim, s->cos, s->ssin, s->q, s->slots,
                        k_cache, v_cache, s->kv_fp16));
    STAGE(3, paged_decode_attention(s->q, k_cache, v_cache, s->kv_fp16, s->tables, s->lens, s->attn, n, p->heads,
                                    p->kv_heads, p->head_dim, s->block_size, s->width, s->scale));
    STAGE(4, matmul(&p->o, s->attn, n, s->proj, s->int8));
    add_rms_norm(h, s->proj, p->post_norm, x, n, p->hidden, p->eps);
    STAGE(5, matmul(&p->gate_up, x, n, s->gate_up, s->int8));
    silu_mul(s->gate_up, n, p->inter, s->act);
    STAGE(6, matmul(&p->down, s->act, n, s->proj, s->int8));
    add_rms_norm(h, s->proj, p->next_norm, x, n, p->hidden, p->eps);
#undef STAGE
    return 0;
}
