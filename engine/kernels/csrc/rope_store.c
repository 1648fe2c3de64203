/* A decode step's rotary embedding and KV-cache write, in one pass over the fused q/k/v projection.
 *
 * In torch this is ten small ops a layer (a cast, roll, multiply and addcmul for the rotation, a
 * split, and a cast and index_copy_ per cache), ~30 us at any batch size on a Zen 4 core, 1 ms of
 * a SmolLM2 decode step. Here each token's row of qkv is read once: its query heads are rotated
 * into q_out, its key heads rotated and its value heads copied into their cache slot (fp32 or fp16).
 * Rotation: Hugging Face's rotate-half, x * cos + roll(x, D/2) * ssin, with the first half of ssin
 * negated (engine/attention/rope.py's tables).
 */
#include "half.h"
#include "isa.h"

#include <stdint.h>
#include <string.h>

/* IEEE float -> half, rounded to nearest even (as F16C's _cvtps_ph with rounding mode 0) */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, mant = x & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));  /* inf, nan */
    const int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);                           /* overflow: inf */
    uint32_t h, rem, halfway;
    if (e <= 0) {                                                             /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        const int shift = 14 - e;
        const uint32_t m = mant | 0x800000;
        h = m >> shift;
        rem = m & ((1u << shift) - 1);
        halfway = 1u << (shift - 1);
    } else {
        h = ((uint32_t)e << 10) | (mant >> 13);
        rem = mant & 0x1fff;
        halfway = 0x1000;
    }
    if (rem > halfway || (rem == halfway && (h & 1))) h++;  /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

typedef struct {
    int64_t heads, kv_heads, d;
    const float *cos, *ssin;  /* this token's rows */
} rope_row;

static void rotate_scalar(const rope_row *r, const float *x, float *y) {
    const int64_t half = r->d / 2;
    for (int64_t i = 0; i < r->d; i++) y[i] = x[i] * r->cos[i] + x[i < half ? i + half : i - half] * r->ssin[i];
}

static void store_scalar(const float *x, void *cache, int64_t offset, int64_t len, int fp16) {
    if (!fp16) { memcpy((float *)cache + offset, x, (size_t)len * sizeof(float)); return; }
    for (int64_t i = 0; i < len; i++) ((uint16_t *)cache)[offset + i] = float_to_half(x[i]);
}

#ifdef QL_X86
/* D a multiple of 16 (whole vectors in each half) */
AVX2 static void rotate_avx2(const rope_row *r, const float *x, float *y) {
    const int64_t half = r->d / 2;
    for (int64_t i = 0; i < r->d; i += 8) {
        const int64_t j = i < half ? i + half : i - half;
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(r->cos + i),
                                                _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_loadu_ps(r->ssin + i))));
    }
}

AVX2 static void store_avx2(const float *x, void *cache, int64_t offset, int64_t len, int fp16) {
    if (!fp16) { memcpy((float *)cache + offset, x, (size_t)len * sizeof(float)); return; }
    uint16_t *out = (uint16_t *)cache + offset;
    for (int64_t i = 0; i < len; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
}
#endif

static void rotate(const rope_row *r, const float *x, float *y) {
#ifdef QL_X86
    if (use_avx2() && r->d % 16 == 0) { rotate_avx2(r, x, y); return; }
#endif
    rotate_scalar(r, x, y);
}

static void store(const float *x, void *cache, int64_t offset, int64_t len, int fp16) {
#ifdef QL_X86
    if (use_avx2() && len % 8 == 0) { store_avx2(x, cache, offset, len, fp16); return; }
#endif
    store_scalar(x, cache, offset, len, fp16);
}

/* For token t < n: q_out[t] = rotated query heads of qkv[t]; k_cache[slots[t]] = its rotated key heads,
 * v_cache[slots[t]] = its value heads. qkv: [n, (heads + 2 kv_heads) * d] fp32 (row stride ld);
 * cos, ssin: [n, d]; caches: [*, kv_heads, d], fp16 where fp16 is set, else fp32. Returns 0, or -1
 * where d is odd or too large. */
int rope_store(const float *qkv, int64_t ld, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float *cos,
               const float *ssin, float *q_out, const int64_t *slots, void *k_cache, void *v_cache, int fp16) {
    enum { MAX_ROW = 8192 };
    if (d % 2 || kv_heads * d > MAX_ROW) return -1;
    float k_rot[MAX_ROW];
    for (int64_t t = 0; t < n; t++) {
        const rope_row r = {heads, kv_heads, d, cos + t * d, ssin + t * d};
        const float *x = qkv + t * ld, *k = x + heads * d, *v = k + kv_heads * d;
        for (int64_t h = 0; h < heads; h++) rotate(&r, x + h * d, q_out + (t * heads + h) * d);
        for (int64_t h = 0; h < kv_heads; h++) rotate(&r, k + h * d, k_rot + h * d);
        store(k_rot, k_cache, slots[t] * kv_heads * d, kv_heads * d, fp16);
        store(v, v_cache, slots[t] * kv_heads * d, kv_heads * d, fp16);
    }
    return 0;
}
