/* Linear layers on GGUF's quantized weights, kept in GGUF's own block layout.
 *
 * y[n, rows] = x[n, cols] @ W[rows, cols]^T with W in Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K or Q6_K (Q5_0
 * and Q5_K in portable code only: the loader interleaves them for qlinear_x16.c). The activations
 * are quantized per block of 32 (one fp32 scale per block, so an outlier only coarsens its own block)
 * to 16 bits, not llama.cpp's 8: on SmolLM2 8-bit activations moved the logits by up to 1.2 (of ~30)
 * and changed greedy tokens within a few steps, 16-bit ones by 0.01. It costs little: an AVX2 8-bit
 * dot product takes two multiplies per 32 values (maddubs, then madd to widen), and a 16-bit one
 * takes two madd_epi16 as well. Every block's integer sum is scaled and accumulated in fp32. Decode
 * steps are memory-bound, and these weights are 4.5-8.5 bits instead of fp32's 32. From a few rows
 * on, a second path dequantizes panels of weight rows into L1 and multiplies them in fp32 tiles
 * (the panel path, below).
 *
 * Plain C with no Python API, loaded with ctypes (which releases the GIL during a call). The AVX2
 * kernels are compiled per function (target attribute) and chosen at run time, with a portable
 * scalar version of each for other CPUs and as the reference in tests. Output rows are split over the
 * thread pool of thread_pool.c.
 */
#include "gemm_tile.h"
#include "half.h"
#include "isa.h"
#include "quant_blocks.h"
#include "thread_pool.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- types ------------------------------------------------------------------------------------ */

int64_t block_elems(int type) { return (type == T_Q4_K || type == T_Q5_K || type == T_Q6_K) ? QKK : QK; }

int64_t block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return sizeof(block_q4_0);
    case T_Q4_1: return sizeof(block_q4_1);
    case T_Q5_0: return sizeof(block_q5_0);
    case T_Q8_0: return sizeof(block_q8_0);
    case T_Q4_K: return sizeof(block_q4_K);
    case T_Q5_K: return sizeof(block_q5_K);
    case T_Q6_K: return sizeof(block_q6_K);
    default: return 0;
    }
}

int qlin_type_supported(int type) { return block_bytes(type) > 0; }

/* GGUF block `blk`: element i's stored integer (Q6_K's still +32, Q8_0's signed) */
int gguf_block_quant(int type, const uint8_t *blk, int i) { return gguf_block_quant_inline(type, blk, i); }

/* ---- scalar kernels (any CPU; the tests' second reference) ------------------------------------ */

static void quantize_a16_scalar(const float *x, block_a16 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += QK) {
        float amax = 0.f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / A_MAX, id = d > 0.f ? 1.f / d : 0.f;
        int sum = 0;
        for (int i = 0; i < QK; i++) {
            int q = (int)nearbyintf(x[i] * id);
            y[b].qs[i] = (int16_t)q;
            sum += q;
        }
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

/* one weight row (nb32 blocks of 32 along cols) times one activation row */
static float dot_scalar(int type, const uint8_t *w, const block_a16 *a, int64_t nb32) {
    float acc = 0.f;
    if (type == T_Q4_0 || type == T_Q4_1) {
        const int64_t bytes = block_bytes(type);
        for (int64_t b = 0; b < nb32; b++) {
            const uint8_t *blk = w + b * bytes;
            const uint8_t *qs = type == T_Q4_0 ? ((const block_q4_0 *)blk)->qs : ((const block_q4_1 *)blk)->qs;
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += (qs[i] & 0xF) * a[b].qs[i] + (qs[i] >> 4) * a[b].qs[i + 16];
            float d = half_to_float(*(const uint16_t *)blk);
            acc += d * a[b].d * (float)sum;
            acc += type == T_Q4_0 ? -8.f * d * a[b].s : half_to_float(((const block_q4_1 *)blk)->m) * a[b].s;
        }
    } else if (type == T_Q5_0) {  /* (q - 16) d */
        for (int64_t b = 0; b < nb32; b++) {
            const uint8_t *blk = w + b * sizeof(block_q5_0);
            int sum = 0;
            for (int i = 0; i < QK; i++) sum += gguf_block_quant(type, blk, i) * a[b].qs[i];
            float d = half_to_float(*(const uint16_t *)blk);
            acc += d * a[b].d * (float)sum - 16.f * d * a[b].s;
        }
    } else if (type == T_Q5_K) {  /* d sc q - dmin m per sub-block of 32 */
        const block_q5_K *x = (const block_q5_K *)w;
        for (int64_t s = 0; s < nb32 / 8; s++, a += 8) {
            uint8_t sc[8], m[8];
            q4k_scales(x[s].scales, sc, m);
            float d = half_to_float(x[s].d), dmin = half_to_float(x[s].dmin);
            for (int j = 0; j < 8; j++) {
                int sum = 0;
                for (int i = 0; i < QK; i++) sum += gguf_block_quant(type, (const uint8_t *)&x[s], 32 * j + i) * a[j].qs[i];
                acc += d * sc[j] * a[j].d * (float)sum - dmin * m[j] * a[j].s;
            }
        }
    } else if (type == T_Q8_0) {
        const block_q8_0 *x = (const block_q8_0 *)w;
        for (int64_t b = 0; b < nb32; b++) {
            int sum = 0;
            for (int i = 0; i < QK; i++) sum += x[b].qs[i] * a[b].qs[i];
            acc += half_to_float(x[b].d) * a[b].d * (float)sum;
        }
    } else if (type == T_Q4_K) {
        const block_q4_K *x = (const block_q4_K *)w;
        for (int64_t s = 0; s < nb32 / 8; s++, a += 8) {
            uint8_t sc[8], m[8];
            q4k_scales(x[s].scales, sc, m);
            float d = half_to_float(x[s].d), dmin = half_to_float(x[s].dmin);
            for (int j = 0; j < 8; j++) {
                const uint8_t *qs = x[s].qs + 32 * (j / 2);
                int sum = 0;
                for (int i = 0; i < QK; i++) sum += ((j & 1) ? qs[i] >> 4 : qs[i] & 0xF) * a[j].qs[i];
                acc += d * sc[j] * a[j].d * (float)sum - dmin * m[j] * a[j].s;
            }
        }
    } else if (type == T_Q6_K) {
        const block_q6_K *x = (const block_q6_K *)w;
        for (int64_t s = 0; s < nb32 / 8; s++) {
            float d = half_to_float(x[s].d);
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = x[s].ql + 64 * half, *qh = x[s].qh + 32 * half;
                const int8_t *sc = x[s].scales + 8 * half;
                for (int g = 0; g < 4; g++, a++) {
                    int sums[2] = {0, 0};
                    for (int l = 0; l < QK; l++) {
                        int lo = (g & 1) ? ql[l + 32] : ql[l];
                        lo = (g & 2) ? lo >> 4 : lo & 0xF;
                        int q = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
                        sums[l / 16] += q * a->qs[l];
                    }
                    acc += d * a->d * (float)(sc[2 * g] * (int64_t)sums[0] + sc[2 * g + 1] * (int64_t)sums[1]);
                }
            }
        }
    }
    return acc;
}

static void dequantize_row_scalar(int type, const uint8_t *w, float *y, int64_t cols) {
    const int64_t nb = cols / block_elems(type), bytes = block_bytes(type);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        if (type == T_Q4_0 || type == T_Q4_1) {
            const uint8_t *qs = type == T_Q4_0 ? ((const block_q4_0 *)blk)->qs : ((const block_q4_1 *)blk)->qs;
            float d = half_to_float(*(const uint16_t *)blk);
            float m = type == T_Q4_0 ? -8.f * d : half_to_float(((const block_q4_1 *)blk)->m);
            for (int i = 0; i < 16; i++) {
                y[i] = (qs[i] & 0xF) * d + m;
                y[i + 16] = (qs[i] >> 4) * d + m;
            }
            y += QK;
        } else if (type == T_Q5_0) {
            float d = half_to_float(*(const uint16_t *)blk);
            for (int i = 0; i < QK; i++) y[i] = (float)(gguf_block_quant(type, blk, i) - 16) * d;
            y += QK;
        } else if (type == T_Q5_K) {
            const block_q5_K *x = (const block_q5_K *)blk;
            uint8_t sc[8], m[8];
            q4k_scales(x->scales, sc, m);
            float d = half_to_float(x->d), dmin = half_to_float(x->dmin);
            for (int i = 0; i < QKK; i++) y[i] = d * sc[i / 32] * (float)gguf_block_quant(type, blk, i) - dmin * m[i / 32];
            y += QKK;
        } else if (type == T_Q8_0) {
            const block_q8_0 *x = (const block_q8_0 *)blk;
            float d = half_to_float(x->d);
            for (int i = 0; i < QK; i++) y[i] = x->qs[i] * d;
            y += QK;
        } else if (type == T_Q4_K) {
            const block_q4_K *x = (const block_q4_K *)blk;
            uint8_t sc[8], m[8];
            q4k_scales(x->scales, sc, m);
            float d = half_to_float(x->d), dmin = half_to_float(x->dmin);
            for (int j = 0; j < 8; j++, y += QK) {
                const uint8_t *qs = x->qs + 32 * (j / 2);
                for (int i = 0; i < QK; i++) y[i] = d * sc[j] * ((j & 1) ? qs[i] >> 4 : qs[i] & 0xF) - dmin * m[j];
            }
        } else if (type == T_Q6_K) {
            const block_q6_K *x = (const block_q6_K *)blk;
            float d = half_to_float(x->d);
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
                const int8_t *sc = x->scales + 8 * half;
                for (int g = 0; g < 4; g++, y += QK)
                    for (int l = 0; l < QK; l++) {
                        int lo = (g & 1) ? ql[l + 32] : ql[l];
                        lo = (g & 2) ? lo >> 4 : lo & 0xF;
                        y[l] = d * sc[2 * g + l / 16] * (float)((lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32);
                    }
            }
        }
    }
}

/* ---- AVX2 kernels ------------------------------------------------------------------------------ */
#ifdef QL_X86

AVX2 static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

AVX2 static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* 16 bytes of nibbles -> 32 bytes: low nibbles first (elements 0..15), then high (16..31) */
AVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* a block's 32 weights as int16: w[0] elements 0..15, w[1] elements 16..31 */
typedef struct { __m256i w[2]; } w16;

AVX2_INLINE static inline w16 widen_s8(__m256i v) {
    return (w16){{_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1))}};
}

/* 16 bytes of nibbles -> int16: lo = low nibbles, hi = high nibbles, in byte order */
AVX2_INLINE static inline void nibbles16(const uint8_t *qs, __m256i *lo, __m256i *hi) {
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
    *lo = _mm256_and_si256(b, _mm256_set1_epi16(0x0F));
    *hi = _mm256_srli_epi16(b, 4);
}

/* w . x over one block -> 8 int32 lanes (|w| <= 4064, |x| <= 32767: no lane can overflow) */
AVX2_INLINE static inline __m256i dot_w16(w16 w, const int16_t *x) {
    return _mm256_add_epi32(_mm256_madd_epi16(w.w[0], _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(w.w[1], _mm256_loadu_si256((const __m256i *)(x + 16))));
}

AVX2 static void quantize_a16_avx2(const float *x, block_a16 *y, int64_t nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++, x += QK) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                    _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / A_MAX, id = d > 0.f ? 1.f / d : 0.f;
        __m256 mul = _mm256_set1_ps(id);
        const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), rnd));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), rnd));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), rnd));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), rnd));
        int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        /* packs works per 128-bit lane: restore element order with a permute */
        __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8);
        __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i2, i3), 0xD8);
        _mm256_storeu_si256((__m256i *)y[b].qs, p0);
        _mm256_storeu_si256((__m256i *)(y[b].qs + 16), p1);
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

/* Each microkernel: one weight row against NA (1..4) activation rows (stride nb32 blocks), so a
 * weight block is unpacked once per NA rows. Even and odd blocks go to separate accumulators: with
 * one chain, a single row waits on the FMA latency (~5 cycles) every block. */
#define NA_MAX 4

typedef struct { __m256 v[2][NA_MAX]; float off[2][NA_MAX]; } accs;

AVX2_INLINE static inline void accs_zero(accs *c) {
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < NA_MAX; j++) {
            c->v[k][j] = _mm256_setzero_ps();
            c->off[k][j] = 0.f;
        }
}

AVX2_INLINE static inline void accs_out(const accs *c, int na, float *out) {
    for (int j = 0; j < na; j++) out[j] = hsum_ps(_mm256_add_ps(c->v[0][j], c->v[1][j])) + c->off[0][j] + c->off[1][j];
}

/* Q4_0 / Q4_1 block b into chain k: d * (q . y) * dy + m * sum(y) * dy */
AVX2_INLINE static inline void q4_block(int type, const uint8_t *blk, const block_a16 *a, int64_t nb32, int na,
                                        accs *c, int k) {
    const int q41 = type == T_Q4_1;
    w16 q;  /* elements 0..15 are the low nibbles, 16..31 the high ones */
    nibbles16(q41 ? ((const block_q4_1 *)blk)->qs : ((const block_q4_0 *)blk)->qs, &q.w[0], &q.w[1]);
    float d = f16(*(const uint16_t *)blk);
    float m = q41 ? f16(((const block_q4_1 *)blk)->m) : -8.f * d;  /* Q4_0 stores q - 8 */
    for (int j = 0; j < na; j++) {
        const block_a16 *ab = a + j * nb32;
        __m256i p = dot_w16(q, ab->qs);
        c->v[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab->d), _mm256_cvtepi32_ps(p), c->v[k][j]);
        c->off[k][j] += m * ab->s;
    }
}

AVX2_INLINE static inline void dot_q4_avx2(int type, const uint8_t *w, const block_a16 *a, int64_t nb32, int na,
                                           float *out) {
    accs c;
    accs_zero(&c);
    const int64_t bytes = block_bytes(type);
    int64_t b = 0;
    for (; b + 1 < nb32; b += 2) {
        q4_block(type, w + b * bytes, a + b, nb32, na, &c, 0);
        q4_block(type, w + (b + 1) * bytes, a + b + 1, nb32, na, &c, 1);
    }
    if (b < nb32) q4_block(type, w + b * bytes, a + b, nb32, na, &c, 0);
    accs_out(&c, na, out);
}

AVX2_INLINE static inline void q8_block(const block_q8_0 *x, const block_a16 *a, int64_t nb32, int na, accs *c,
                                        int k) {
    w16 q = widen_s8(_mm256_loadu_si256((const __m256i *)x->qs));
    float d = f16(x->d);
    for (int j = 0; j < na; j++) {
        const block_a16 *ab = a + j * nb32;
        c->v[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab->d), _mm256_cvtepi32_ps(dot_w16(q, ab->qs)), c->v[k][j]);
    }
}

AVX2_INLINE static inline void dot_q8_0_avx2(const uint8_t *w, const block_a16 *a, int64_t nb32, int na, float *out) {
    accs c;
    accs_zero(&c);
    const block_q8_0 *x = (const block_q8_0 *)w;
    int64_t b = 0;
    for (; b + 1 < nb32; b += 2) {
        q8_block(x + b, a + b, nb32, na, &c, 0);
        q8_block(x + b + 1, a + b + 1, nb32, na, &c, 1);
    }
    if (b < nb32) q8_block(x + b, a + b, nb32, na, &c, 0);
    accs_out(&c, na, out);
}

AVX2_INLINE static inline void dot_q4_K_avx2(const uint8_t *w, const block_a16 *a, int64_t nb32, int na, float *out) {
    accs c;
    accs_zero(&c);
    const block_q4_K *x = (const block_q4_K *)w;
    for (int64_t s = 0; s < nb32 / 8; s++) {
        uint8_t sc[8], m[8];
        q4k_scales(x[s].scales, sc, m);
        float d = f16(x[s].d), dmin = f16(x[s].dmin);
        for (int p = 0; p < 4; p++) {  /* 32 bytes: sub-block 2p in low nibbles, 2p+1 in high */
            /* 32 bytes: sub-block 2p in the low nibbles, 2p+1 in the high ones */
            w16 q[2];
            nibbles16(x[s].qs + 32 * p, &q[0].w[0], &q[1].w[0]);
            nibbles16(x[s].qs + 32 * p + 16, &q[0].w[1], &q[1].w[1]);
            for (int k = 0; k < 2; k++) {
                float dk = d * sc[2 * p + k], mk = dmin * m[2 * p + k];
                for (int j = 0; j < na; j++) {
                    const block_a16 *ab = a + j * nb32 + 8 * s + 2 * p + k;
                    __m256i pr = dot_w16(q[k], ab->qs);
                    c.v[k][j] = _mm256_fmadd_ps(_mm256_set1_ps(dk * ab->d), _mm256_cvtepi32_ps(pr), c.v[k][j]);
                    c.off[k][j] -= mk * ab->s;
                }
            }
        }
    }
    accs_out(&c, na, out);
}

AVX2_INLINE static inline void dot_q6_K_avx2(const uint8_t *w, const block_a16 *a, int64_t nb32, int na, float *out) {
    accs c;
    accs_zero(&c);
    const block_q6_K *x = (const block_q6_K *)w;
    const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int64_t s = 0; s < nb32 / 8; s++) {
        float d = f16(x[s].d);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = x[s].ql + 64 * half, *qh = x[s].qh + 32 * half;
            const int8_t *sc = x[s].scales + 8 * half;
            __m256i la = _mm256_loadu_si256((const __m256i *)ql), lb = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4] = {  /* unsigned 6-bit values of the 4 groups of 32 */
                _mm256_or_si256(_mm256_and_si256(la, lo4), _mm256_and_si256(_mm256_slli_epi16(h, 4), hi2)),
                _mm256_or_si256(_mm256_and_si256(lb, lo4), _mm256_and_si256(_mm256_slli_epi16(h, 2), hi2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), lo4), _mm256_and_si256(h, hi2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), lo4),
                                _mm256_and_si256(_mm256_srli_epi16(h, 2), hi2)),
            };
            for (int g = 0; g < 4; g++) {
                /* (q - 32) * scale in int16 (|.| <= 32 * 128), each half of 16 with its own scale */
                w16 qs = widen_s8(_mm256_sub_epi8(q[g], k32));
                qs.w[0] = _mm256_mullo_epi16(qs.w[0], _mm256_set1_epi16(sc[2 * g]));
                qs.w[1] = _mm256_mullo_epi16(qs.w[1], _mm256_set1_epi16(sc[2 * g + 1]));
                for (int j = 0; j < na; j++) {
                    const block_a16 *ab = a + j * nb32 + 8 * s + 4 * half + g;
                    __m256 f = _mm256_cvtepi32_ps(dot_w16(qs, ab->qs));
                    c.v[g & 1][j] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab->d), f, c.v[g & 1][j]);
                }
            }
        }
    }
    accs_out(&c, na, out);
}

/* 32 int8 values -> 32 floats: y = v * scale + offset, scale_lo for elements 0..15, scale_hi for 16..31 */
AVX2_INLINE static inline void store32(__m256i v, float *y, __m256 scale_lo, __m256 scale_hi, __m256 offset) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    _mm256_storeu_ps(y, _mm256_fmadd_ps(f0, scale_lo, offset));
    _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(f1, scale_lo, offset));
    _mm256_storeu_ps(y + 16, _mm256_fmadd_ps(f2, scale_hi, offset));
    _mm256_storeu_ps(y + 24, _mm256_fmadd_ps(f3, scale_hi, offset));
}

AVX2 static void dequantize_row_avx2(int type, const uint8_t *w, float *y, int64_t cols) {
    const int64_t nb = cols / block_elems(type), bytes = block_bytes(type);
    const __m256 zero = _mm256_setzero_ps();
    const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        if (type == T_Q4_0 || type == T_Q4_1) {
            const int q41 = type == T_Q4_1;
            float d = f16(*(const uint16_t *)blk);
            __m256 dv = _mm256_set1_ps(d);
            __m256 mv = _mm256_set1_ps(q41 ? f16(((const block_q4_1 *)blk)->m) : -8.f * d);
            store32(nibbles32(q41 ? ((const block_q4_1 *)blk)->qs : ((const block_q4_0 *)blk)->qs), y, dv, dv, mv);
            y += QK;
        } else if (type == T_Q8_0) {
            const block_q8_0 *x = (const block_q8_0 *)blk;
            __m256 dv = _mm256_set1_ps(f16(x->d));
            store32(_mm256_loadu_si256((const __m256i *)x->qs), y, dv, dv, zero);
            y += QK;
        } else if (type == T_Q4_K) {
            const block_q4_K *x = (const block_q4_K *)blk;
            uint8_t sc[8], m[8];
            q4k_scales(x->scales, sc, m);
            float d = f16(x->d), dmin = f16(x->dmin);
            for (int p = 0; p < 4; p++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * p));
                __m256i q[2] = {_mm256_and_si256(raw, lo4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4)};
                for (int k = 0; k < 2; k++, y += QK) {
                    __m256 dv = _mm256_set1_ps(d * sc[2 * p + k]);
                    store32(q[k], y, dv, dv, _mm256_set1_ps(-dmin * m[2 * p + k]));
                }
            }
        } else if (type == T_Q6_K) {
            const block_q6_K *x = (const block_q6_K *)blk;
            float d = f16(x->d);
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = x->ql + 64 * half, *qh = x->qh + 32 * half;
                const int8_t *sc = x->scales + 8 * half;
                __m256i la = _mm256_loadu_si256((const __m256i *)ql);
                __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 32));
                __m256i h = _mm256_loadu_si256((const __m256i *)qh);
                __m256i q[4] = {
                    _mm256_or_si256(_mm256_and_si256(la, lo4), _mm256_and_si256(_mm256_slli_epi16(h, 4), hi2)),
                    _mm256_or_si256(_mm256_and_si256(lb, lo4), _mm256_and_si256(_mm256_slli_epi16(h, 2), hi2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), lo4), _mm256_and_si256(h, hi2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), lo4),
                                    _mm256_and_si256(_mm256_srli_epi16(h, 2), hi2)),
                };
                for (int g = 0; g < 4; g++, y += QK)
                    store32(_mm256_sub_epi8(q[g], k32), y, _mm256_set1_ps(d * sc[2 * g]),
                            _mm256_set1_ps(d * sc[2 * g + 1]), zero);
            }
        }
    }
}

/* na as a constant in each case, so the accumulators stay in registers */
#define FOR_NA(call)                                  \
    switch (na) {                                     \
    case 1: { const int na = 1; call; } break;        \
    case 2: { const int na = 2; call; } break;        \
    case 3: { const int na = 3; call; } break;        \
    default: { const int na = 4; call; } break;       \
    }

AVX2 static void dot_avx2(int type, const uint8_t *w, const block_a16 *a, int64_t nb32, int na, float *out) {
    switch (type) {
    case T_Q4_0: FOR_NA(dot_q4_avx2(T_Q4_0, w, a, nb32, na, out)); break;
    case T_Q4_1: FOR_NA(dot_q4_avx2(T_Q4_1, w, a, nb32, na, out)); break;
    case T_Q8_0: FOR_NA(dot_q8_0_avx2(w, a, nb32, na, out)); break;
    case T_Q4_K: FOR_NA(dot_q4_K_avx2(w, a, nb32, na, out)); break;
    case T_Q6_K: FOR_NA(dot_q6_K_avx2(w, a, nb32, na, out)); break;
    }
}
#endif /* QL_X86 */

/* ---- dispatch: ISA (isa.c) -------------------------------------------------------------------- */

void quantize_a16(const float *x, block_a16 *y, int64_t nb) {
#ifdef QL_X86
    if (use_avx2()) { quantize_a16_avx2(x, y, nb); return; }
#endif
    quantize_a16_scalar(x, y, nb);
}

/* Q5_0/Q5_K run on interleaved rows (qlinear_x16.c); in GGUF's layout only the portable code has them */
static int has_avx2_rows(int type) { return type != T_Q5_0 && type != T_Q5_K; }

static void dequantize_row(int type, const uint8_t *w, float *y, int64_t cols) {
#ifdef QL_X86
    if (use_avx2() && has_avx2_rows(type)) { dequantize_row_avx2(type, w, y, cols); return; }
#endif
    dequantize_row_scalar(type, w, y, cols);
}

static void dot_rows(int type, const uint8_t *w, const block_a16 *a, int64_t nb32, int na, float *out) {
#ifdef QL_X86
    if (use_avx2() && has_avx2_rows(type)) { dot_avx2(type, w, a, nb32, na, out); return; }
#endif
    for (int j = 0; j < na; j++) out[j] = dot_scalar(type, w, a + j * nb32, nb32);
}

/* ---- matmul ------------------------------------------------------------------------------------ */

typedef struct {
    int type;
    const uint8_t *w;
    int64_t rows, row_bytes, nb32, n, ldy;
    const float *x;
    block_a16 *a;
    float *y;
} mm_job;

typedef struct {
    const float *x;
    block_a16 *a;
    int64_t n, nb;
} quantize_job;

static void quantize_task(void *p, int64_t chunk, int64_t nchunks) {
    quantize_job *j = p;
    int64_t lo, hi;
    chunk_range(j->n, chunk, nchunks, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) quantize_a16(j->x + r * j->nb * QK, j->a + r * j->nb, j->nb);
}

block_a16 *quantize_rows_a16(const float *x, int64_t n, int64_t nb) {
    quantize_job job = {x, scratch_a16(n * nb), n, nb};
    if (job.a) pool_parallel(quantize_task, &job, num_chunks(n, 16));
    return job.a;
}

static void matmul_task(void *p, int64_t chunk, int64_t nchunks) {
    mm_job *j = p;
    int64_t lo, hi;
    chunk_range(j->rows, chunk, nchunks, &lo, &hi);
    float out[NA_MAX];
    for (int64_t r = lo; r < hi; r++) {
        const uint8_t *wr = j->w + r * j->row_bytes;
        for (int64_t c = 0; c < j->n; c += NA_MAX) {
            int na = j->n - c < NA_MAX ? (int)(j->n - c) : NA_MAX;
            dot_rows(j->type, wr, j->a + c * j->nb32, j->nb32, na, out);
            for (int t = 0; t < na; t++) j->y[(c + t) * j->ldy + r] = out[t];
        }
    }
}

void *grow_scratch(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        void *grown = realloc(*buf, bytes);
        if (!grown) return NULL;
        *buf = grown;
        *cap = bytes;
    }
    return *buf;
}

block_a16 *scratch_a16(int64_t blocks) {
    static void *buf = NULL;
    static size_t cap = 0;
    return grow_scratch(&buf, &cap, (size_t)blocks * sizeof(block_a16));
}

/* ---- panel path: fp32 tiles on weights dequantized a panel at a time --------------------------- */
/* From a few activation rows on, the 16-bit dot products cost more than dequantizing: each weight
 * block is unpacked once per four rows there, and every row's block sum is converted and scaled.
 * The panel path dequantizes TILE_W weight rows (up to PANEL_COLS columns) into an L1 buffer, once
 * for all activation rows, and multiplies them in fp32 tiles: exact fp32 products, as the dense
 * path's, without writing a dense copy of the matrix to memory. */
#define PANEL_COLS 1024  /* a multiple of every type's block (256 for the K-quants) */

static int g_panel_rows = 8;  /* steps of at least this many rows take the panel path */

/* exported: steps of at least `rows` rows take the panel path (tests force either path) */
void qlin_set_panel_rows(int rows) { g_panel_rows = rows < 1 ? 1 : rows; }

/* columns per panel: all of them up to PANEL_COLS, else 512 at a time (a multiple of every block) */
static int64_t panel_cols(int64_t cols) { return cols <= PANEL_COLS ? cols : 512; }

static void panel_store(mm_job *j, int64_t a0, int na, int64_t r0, int nw, int first, const float *out) {
    for (int a = 0; a < na; a++)
        for (int r = 0; r < nw; r++) {
            float *y = j->y + (a0 + a) * j->ldy + r0 + r;
            *y = first ? out[a * TILE_W + r] : *y + out[a * TILE_W + r];
        }
}

static void panel_task(void *p, int64_t chunk, int64_t nchunks) {
    mm_job *j = p;
    const int64_t cols = j->nb32 * QK, step = panel_cols(cols);
    const int64_t be = block_elems(j->type), bb = block_bytes(j->type);
    float panel[TILE_W * PANEL_COLS], out[TILE_A * TILE_W];
    int64_t lo, hi;
    chunk_range((j->rows + TILE_W - 1) / TILE_W, chunk, nchunks, &lo, &hi);
    for (int64_t r0 = lo * TILE_W; r0 < hi * TILE_W && r0 < j->rows; r0 += TILE_W) {
        const int nw = j->rows - r0 < TILE_W ? (int)(j->rows - r0) : TILE_W;
        for (int64_t c0 = 0; c0 < cols; c0 += step) {
            const int64_t len = cols - c0 < step ? cols - c0 : step;
            for (int r = 0; r < nw; r++)
                dequantize_row(j->type, j->w + (r0 + r) * j->row_bytes + c0 / be * bb, panel + r * step, len);
            for (int64_t a0 = 0; a0 < j->n; a0 += TILE_A) {
                const int na = j->n - a0 < TILE_A ? (int)(j->n - a0) : TILE_A;
                gemm_tile(j->x + a0 * cols + c0, cols, na, panel, step, nw, len, out);
                panel_store(j, a0, na, r0, nw, c0 == 0, out);
            }
        }
    }
}

/* y[i, r] (row stride ldy) = sum_k x[i, k] * W[r, k] for i < n, r < rows.
 * W: rows x row_bytes of GGUF blocks of `type`; x: n x cols fp32, contiguous.
 * Returns 0, -1 for an unsupported type, -2 for cols not a multiple of the block, -3 out of memory. */
int qlin_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                int64_t ldy) {
    if (!qlin_type_supported(type)) return -1;
    if (cols % block_elems(type) != 0) return -2;
    if (n <= 0 || rows <= 0) return 0;  /* e.g. an LM head in a step that samples nothing */
    mm_job job = {type, w, rows, cols / block_elems(type) * block_bytes(type), cols / QK, n, ldy, x, NULL, y};
    pool_lock();
    if (n >= g_panel_rows) {
        /* panels of ~64K products each: a few microseconds, well above the cost of a hand-off */
        pool_parallel(panel_task, &job, num_chunks((rows + TILE_W - 1) / TILE_W, 1 + 65535 / (n * cols * TILE_W)));
        pool_unlock();
        return 0;
    }
    job.a = quantize_rows_a16(x, n, job.nb32);
    if (!job.a) { pool_unlock(); return -3; }
    /* chunks of ~16K weight-activation products (a few microseconds): below that the hand-off costs more */
    pool_parallel(matmul_task, &job, num_chunks(rows, 1 + (16384 - 1) / (n * cols)));
    pool_unlock();
    return 0;
}

typedef struct {
    int type;
    const uint8_t *w;
    int64_t rows, row_bytes, cols, ldy;
    const int64_t *ids;
    float *y;
} dq_job;

static void dequantize_task(void *p, int64_t chunk, int64_t nchunks) {
    dq_job *j = p;
    int64_t lo, hi;
    chunk_range(j->rows, chunk, nchunks, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t src = j->ids ? j->ids[r] : r;
        dequantize_row(j->type, j->w + src * j->row_bytes, j->y + r * j->ldy, j->cols);
    }
}

/* y[r, :] (row stride ldy) = W[ids[r], :] dequantized to fp32 (ids NULL: every row in order) */
int qlin_dequantize(int type, const uint8_t *w, int64_t rows, int64_t cols, const int64_t *ids, float *y,
                    int64_t ldy) {
    if (!qlin_type_supported(type)) return -1;
    if (cols % block_elems(type) != 0) return -2;
    dq_job job = {type, w, rows, cols / block_elems(type) * block_bytes(type), cols, ldy, ids, y};
    pool_lock();
    pool_parallel(dequantize_task, &job, num_chunks(rows, 1 + 65535 / cols));
    pool_unlock();
    return 0;
}
