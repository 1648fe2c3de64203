/* GGUF's quantized blocks and the kernels' 16-bit activation blocks, shared by qlinear.c (GGUF's own
 * layout) and qlinear_x16.c (rows interleaved in groups of 16). */
#ifndef QUANT_BLOCKS_H
#define QUANT_BLOCKS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };
#define QK 32
#define QKK 256

typedef struct { uint16_t d; uint8_t qs[16]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0;
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } block_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } block_q6_K;
/* a quantized activation block: x ~ d * qs, s = d * sum(qs) (for the weights' offsets and mins) */
typedef struct { float d, s; int16_t qs[32]; } block_a16;
#define A_MAX 32767.f

_Static_assert(sizeof(block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K");

int64_t block_elems(int type);
int64_t block_bytes(int type);
int qlin_type_supported(int type);
/* element i of a GGUF block as stored: Q4_x/Q4_K 0..15, Q5_x 0..31, Q6_K 0..63 (before its -32), Q8_0 signed */
int gguf_block_quant(int type, const uint8_t *blk, int i);

/* inline, so that a caller with a constant type (the x16 repack) gets that type's code alone */
static inline int gguf_block_quant_inline(int type, const uint8_t *blk, int i) {
    const int l = i % 32, j = i / 32;  /* within a K-quant: sub-block j, element l */
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        const uint8_t *qs = blk + (type == T_Q4_1 ? 4 : 2);
        return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4;
    }
    case T_Q5_0: {
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        const uint8_t *qs = blk + 6;
        return (i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4) | ((qh >> i) & 1) << 4;
    }
    case T_Q8_0: return ((const int8_t *)blk)[2 + i];
    case T_Q4_K: case T_Q5_K: {
        const uint8_t *qs = blk + (type == T_Q5_K ? 48 : 16), *qh = blk + 16;
        const int lo = j & 1 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 0xF;
        return type == T_Q5_K ? lo | ((qh[l] >> j) & 1) << 4 : lo;
    }
    default: {  /* Q6_K: halves of 128, groups g of 32 */
        const int h = i / 128, g = (i % 128) / 32;
        const uint8_t ql = blk[64 * h + l + (g & 1) * 32], qh = blk[128 + 32 * h + l];
        return ((g & 2) ? ql >> 4 : ql & 0xF) | ((qh >> (2 * g)) & 3) << 4;
    }
    }
}

/* Q4_K/Q5_K pack 8 six-bit scales and 8 six-bit mins in 12 bytes (llama.cpp's get_scale_min_k4) */
static inline void q4k_scales(const uint8_t *q, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
}
/* x (nb blocks of 32 floats) -> 16-bit blocks, with the best code the CPU runs */
void quantize_a16(const float *x, block_a16 *y, int64_t nb);
/* *buf grown (realloc) to at least `bytes`, *cap its size; NULL where it could not grow (a buffer reused
 * across calls: its caller holds the pool lock) */
void *grow_scratch(void **buf, size_t *cap, size_t bytes);
/* the calling job's activation blocks: a buffer reused across calls (the caller holds the pool lock) */
block_a16 *scratch_a16(int64_t blocks);
/* the n rows of x (nb blocks of 32 floats each) quantized over the pool into scratch_a16; NULL where it
 * could not grow (the caller holds the pool lock) */
block_a16 *quantize_rows_a16(const float *x, int64_t n, int64_t nb);
#endif
