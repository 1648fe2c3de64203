/* The fp32 register tile under the quantized linear layers' panel path (qlinear.c): up to TILE_A x
 * TILE_W dot products of activation rows with weight rows that a panel has just dequantized into L1. */
#ifndef GEMM_TILE_H
#define GEMM_TILE_H
#include <stdint.h>

#define TILE_A 4  /* activation rows */
#define TILE_W 3  /* weight rows */

/* out[a * TILE_W + r] = sum over k < len of x[a * ldx + k] * w[r * ldw + k], for a < na <= TILE_A and
 * r < nw <= TILE_W; len a multiple of 8 */
void gemm_tile(const float *x, int64_t ldx, int na, const float *w, int64_t ldw, int nw, int64_t len, float *out);

#endif
