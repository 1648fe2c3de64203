/* fp32 dot-product tiles (see gemm_tile.h). Four activation rows by three weight rows: twelve
 * accumulators, so twelve independent FMA chains cover the FMA latency (~5 cycles at two a cycle:
 * ten in flight), and seven loads feed twelve FMAs, within the two loads a cycle of these cores;
 * with the three weight vectors and one activation vector that is all sixteen AVX2 registers. */
#include "gemm_tile.h"

#include "isa.h"

static void tile_scalar(const float *x, int64_t ldx, int na, const float *w, int64_t ldw, int nw, int64_t len,
                        float *out) {
    for (int a = 0; a < na; a++)
        for (int r = 0; r < nw; r++) {
            float acc = 0.f;
            for (int64_t k = 0; k < len; k++) acc += x[a * ldx + k] * w[r * ldw + k];
            out[a * TILE_W + r] = acc;
        }
}

#ifdef QL_X86
/* na and nw are constants where this is inlined, so the loops unroll and the tile stays in registers */
AVX2_INLINE static inline void tile_avx2(const float *x, int64_t ldx, int na, const float *w, int64_t ldw, int nw,
                                         int64_t len, float *out) {
    __m256 acc[TILE_A][TILE_W];
    for (int a = 0; a < na; a++)
        for (int r = 0; r < nw; r++) acc[a][r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < len; k += 8) {
        __m256 wv[TILE_W];
        for (int r = 0; r < nw; r++) wv[r] = _mm256_loadu_ps(w + r * ldw + k);
        for (int a = 0; a < na; a++) {
            __m256 xv = _mm256_loadu_ps(x + a * ldx + k);
            for (int r = 0; r < nw; r++) acc[a][r] = _mm256_fmadd_ps(xv, wv[r], acc[a][r]);
        }
    }
    for (int a = 0; a < na; a++)
        for (int r = 0; r < nw; r++) out[a * TILE_W + r] = hsum_ps(acc[a][r]);
}

#define TILE_CASE(NA, NW) \
    case (NA) * 4 + (NW): tile_avx2(x, ldx, NA, w, ldw, NW, len, out); return;

AVX2 static void tile_dispatch(const float *x, int64_t ldx, int na, const float *w, int64_t ldw, int nw, int64_t len,
                               float *out) {
    switch (na * 4 + nw) {
    TILE_CASE(1, 1) TILE_CASE(1, 2) TILE_CASE(1, 3)
    TILE_CASE(2, 1) TILE_CASE(2, 2) TILE_CASE(2, 3)
    TILE_CASE(3, 1) TILE_CASE(3, 2) TILE_CASE(3, 3)
    TILE_CASE(4, 1) TILE_CASE(4, 2) TILE_CASE(4, 3)
    }
}
#endif

void gemm_tile(const float *x, int64_t ldx, int na, const float *w, int64_t ldw, int nw, int64_t len, float *out) {
#ifdef QL_X86
    if (use_avx2()) {
        tile_dispatch(x, ldx, na, w, ldw, nw, len, out);
        return;
    }
#endif
    tile_scalar(x, ldx, na, w, ldw, nw, len, out);
}
