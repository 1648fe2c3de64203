/* The library's exported entry points that other kernels chain (decode_layer.c); each is documented
 * where it is defined. */
#ifndef KERNELS_H
#define KERNELS_H
#include <stdint.h>

int qlin_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                int64_t ldy);
int qlin_x16_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                    int64_t ldy, int int8);
int rope_store(const float *qkv, int64_t ld, int64_t n, int64_t heads, int64_t kv_heads, int64_t d, const float *cos,
               const float *ssin, float *q_out, const int64_t *slots, void *k_cache, void *v_cache, int fp16);
int paged_decode_attention(const float *q, const void *k_cache, const void *v_cache, int kv_fp16,
                           const int32_t *block_tables, const int32_t *seq_lens, float *out, int64_t seqs, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale);
int add_rms_norm(float *h, const float *delta, const float *w, float *y, int64_t n, int64_t d, float eps);
#endif
