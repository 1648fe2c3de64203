/* Linear layers on Q4_0, Q4_1 and Q8_0 weights interleaved in groups of 16 rows (the "x16" layout).
 *
 * In GGUF's layout a weight row's blocks lie one after the other, so a dot product runs along a row:
 * each block's 32 products are summed across vector lanes and scaled on their own, ~8 cycles a block
 * on a Zen 4 core, more than reading its 20 bytes takes. Here the lanes run across 16 rows instead:
 * one AVX-512 VNNI vpdpwssd multiplies a pair of activations (broadcast) by the same pair of columns
 * in 16 rows and accumulates 16 row sums, so a block of 32 columns is 16 such instructions per 16
 * rows, its scales are one vector load, and no lane is ever summed across. The bytes are GGUF's own
 * (the same count for every type), moved at load time by qlin_x16_repack:
 *
 *   per group of 16 rows, per block of 32 columns ("group block", 16 x the type's block bytes):
 *     uint16 d[16]                     fp16 scales, one per row
 *     uint16 m[16]                     Q4_1 only: fp16 offsets (Q4_0's offset is -8 d)
 *     Q4_0/Q4_1: uint8 q[16][16]       [pair p][row]: column 2p in the low nibble, 2p + 1 in the high
 *     Q8_0:      int8  q[16][16][2]    [pair p][row][column 2p, 2p + 1]
 *
 * Activations are quantized per block of 32 to 16 bits as in qlinear.c. Where the CPU lacks AVX-512
 * VNNI, AVX2 code computes the same sums with vpmaddwd on two halves of 8 rows, and portable scalar
 * code where it lacks AVX2 too.
 */
#include "half.h"
#include "isa.h"
#include "quant_blocks.h"
#include "thread_pool.h"

#include <string.h>

#define G 16      /* rows per group */
#define NA_X16 8  /* activation rows per pass over a group's weights */

typedef struct {
    int q4, q41;        /* 4-bit (Q4_0/Q4_1); with fp16 offsets (Q4_1) */
    int64_t gbb, qoff;  /* bytes per group block; offset of its quants */
} x16_format;

int qlin_x16_supported(int type) { return type == T_Q4_0 || type == T_Q4_1 || type == T_Q8_0; }

static x16_format format_of(int type) {
    x16_format f = {type != T_Q8_0, type == T_Q4_1, G * block_bytes(type), 0};
    f.qoff = f.q41 ? 4 * G : 2 * G;
    return f;
}

/* 0, or the same error codes as qlin_matmul, -4 for rows that are not whole groups */
static int check_shape(int type, int64_t rows, int64_t cols) {
    if (!qlin_x16_supported(type)) return -1;
    if (cols % QK) return -2;
    if (rows % G) return -4;
    return 0;
}

/* ---- portable code: the layout spelled out (repacking, dequantization, reference sums) --------- */

/* the integer weight of column 2p + h of row `lane` in group block gb */
static int x16_quant(const x16_format *f, const uint8_t *gb, int lane, int p, int h) {
    if (!f->q4) return ((const int8_t *)(gb + f->qoff))[(p * G + lane) * 2 + h];
    uint8_t v = gb[f->qoff + p * G + lane];
    return h ? v >> 4 : v & 0xF;
}

static void x16_scales(const x16_format *f, const uint8_t *gb, int lane, float *d, float *m) {
    *d = half_to_float(((const uint16_t *)gb)[lane]);
    *m = f->q41 ? half_to_float(((const uint16_t *)gb)[G + lane]) : f->q4 ? -8.f * *d : 0.f;
}

/* GGUF rows -> interleaved groups; out holds rows x row bytes, like w */
int qlin_x16_repack(int type, const uint8_t *w, int64_t rows, int64_t cols, uint8_t *out) {
    int rc = check_shape(type, rows, cols);
    if (rc) return rc;
    const x16_format f = format_of(type);
    const int64_t nb = cols / QK, bb = block_bytes(type), row_bytes = nb * bb;
    memset(out, 0, (size_t)(rows * row_bytes));
    for (int64_t g = 0; g < rows / G; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *gb = out + (g * nb + b) * f.gbb;
            for (int r = 0; r < G; r++) {
                const uint8_t *src = w + (g * G + r) * row_bytes + b * bb;
                memcpy(gb + 2 * r, src, 2);                                      /* d */
                if (f.q41) memcpy(gb + 2 * G + 2 * r, src + 2, 2);               /* m */
                for (int i = 0; i < QK; i++) {
                    const int p = i / 2, h = i % 2;
                    if (f.q4) {
                        const uint8_t *qs = src + (f.q41 ? 4 : 2);  /* element i: low nibble of byte i, high of i - 16 */
                        const uint8_t q = i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4;
                        gb[f.qoff + p * G + r] |= (uint8_t)(q << (4 * h));
                    } else {
                        gb[f.qoff + (p * G + r) * 2 + h] = src[2 + i];
                    }
                }
            }
        }
    return 0;
}

static void dequantize_row_x16(const x16_format *f, const uint8_t *w, int64_t nb, int64_t row, float *y) {
    const int lane = (int)(row % G);
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const uint8_t *gb = w + ((row / G) * nb + b) * f->gbb;
        float d, m;
        x16_scales(f, gb, lane, &d, &m);
        for (int i = 0; i < QK; i++) y[i] = (float)x16_quant(f, gb, lane, i / 2, i % 2) * d + m;
    }
}

/* out[j * G + lane] = row (group, lane) . activation row j, for j < na */
static void group_dot_scalar(const x16_format *f, const uint8_t *gw, const block_a16 *a, int64_t nb, int na,
                             float *out) {
    for (int j = 0; j < na; j++)
        for (int lane = 0; lane < G; lane++) {
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *gb = gw + b * f->gbb;
                const block_a16 *ab = a + j * nb + b;
                int sum = 0;
                for (int i = 0; i < QK; i++) sum += x16_quant(f, gb, lane, i / 2, i % 2) * ab->qs[i];
                float d, m;
                x16_scales(f, gb, lane, &d, &m);
                acc += d * ab->d * (float)sum + m * ab->s;
            }
            out[j * G + lane] = acc;
        }
}

/* ---- AVX-512 VNNI ------------------------------------------------------------------------------ */
#ifdef QL_X86

/* 16 rows x one pair of columns as int16 pairs in 32-bit lanes (the vpdpwssd operand) */
AVX512_INLINE static inline __m512i pair_weights(int q4, const uint8_t *q, int p) {
    if (!q4) return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * p)));
    /* byte v -> lane (v & 15) | (v >> 4) << 16: (t | t << 12) & 0x000F000F in one ternary-logic op */
    __m512i t = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * p)));
    return _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(t, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
}

/* as group_dot_scalar, na <= NA_X16; type and na are constants in each caller (FOR_TYPE_NA), so the
 * branches fold and the accumulators stay in registers */
AVX512_INLINE static inline void group_dot_avx512(int type, const uint8_t *gw, const block_a16 *a, int64_t nb,
                                                  int na, float *out) {
    const x16_format f = format_of(type);
    __m512 acc[NA_X16];
    for (int j = 0; j < na; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = gw + b * f.gbb, *q = gb + f.qoff;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        __m512i sums[NA_X16];
        for (int j = 0; j < na; j++) sums[j] = _mm512_setzero_si512();
        for (int p = 0; p < QK / 2; p++) {
            const __m512i wp = pair_weights(f.q4, q, p);
            for (int j = 0; j < na; j++) {
                int32_t xp;  /* activations 2p and 2p + 1, broadcast */
                memcpy(&xp, a[j * nb + b].qs + 2 * p, 4);
                sums[j] = _mm512_dpwssd_epi32(sums[j], wp, _mm512_set1_epi32(xp));
            }
        }
        for (int j = 0; j < na; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[j]), _mm512_mul_ps(d, _mm512_set1_ps(a[j * nb + b].d)),
                                     acc[j]);
        if (f.q4) {
            const __m512 m = f.q41 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 2 * G)))
                                   : _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
            for (int j = 0; j < na; j++) acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[j * nb + b].s), acc[j]);
        }
    }
    for (int j = 0; j < na; j++) _mm512_storeu_ps(out + j * G, acc[j]);
}

#define FOR_NA(T)                                                                  \
    switch (na) {                                                                  \
    case 1: group_dot_avx512(T, gw, a, nb, 1, out); break;                         \
    case 2: group_dot_avx512(T, gw, a, nb, 2, out); break;                         \
    case 3: group_dot_avx512(T, gw, a, nb, 3, out); break;                         \
    case 4: group_dot_avx512(T, gw, a, nb, 4, out); break;                         \
    case 5: group_dot_avx512(T, gw, a, nb, 5, out); break;                         \
    case 6: group_dot_avx512(T, gw, a, nb, 6, out); break;                         \
    case 7: group_dot_avx512(T, gw, a, nb, 7, out); break;                         \
    default: group_dot_avx512(T, gw, a, nb, 8, out); break;                        \
    }

AVX512 static void group_dot_vnni(int type, const uint8_t *gw, const block_a16 *a, int64_t nb, int na, float *out) {
    switch (type) {
    case T_Q4_0: FOR_NA(T_Q4_0); break;
    case T_Q4_1: FOR_NA(T_Q4_1); break;
    default: FOR_NA(T_Q8_0); break;
    }
}

/* ---- AVX2 -------------------------------------------------------------------------------------- */

#define NA_AVX2 4  /* activation rows per pass here: 2 x NA_AVX2 integer sums, 2 weight vectors in 16 ymm */

/* 16 rows x one pair of columns as int16 pairs in 32-bit lanes, rows 0-7 in w[0] and 8-15 in w[1] */
AVX2_INLINE static inline void pair_weights_avx2(int q4, const uint8_t *q, int p, __m256i w[2]) {
    if (!q4) {
        w[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 32 * p)));
        w[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 32 * p + 16)));
        return;
    }
    /* byte r -> bytes (low nibble, high nibble) side by side, then widened: lane r = lo | hi << 16 */
    const __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * p)), nib = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_and_si128(v, nib), hi = _mm_and_si128(_mm_srli_epi16(v, 4), nib);
    w[0] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi));
    w[1] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(lo, hi));
}

/* as group_dot_scalar, na <= NA_AVX2 (a constant in each caller): vpmaddwd and an add where VNNI has one
 * vpdpwssd, each 16-row sum in two halves */
AVX2_INLINE static inline void group_dot_avx2_na(int type, const uint8_t *gw, const block_a16 *a, int64_t nb,
                                                 int na, float *out) {
    const x16_format f = format_of(type);
    __m256 acc[NA_AVX2][2];
    for (int j = 0; j < na; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = gw + b * f.gbb, *q = gb + f.qoff;
        __m256i sums[NA_AVX2][2];
        for (int j = 0; j < na; j++) sums[j][0] = sums[j][1] = _mm256_setzero_si256();
        for (int p = 0; p < QK / 2; p++) {
            __m256i wp[2];
            pair_weights_avx2(f.q4, q, p, wp);
            for (int j = 0; j < na; j++) {
                int32_t xp;  /* activations 2p and 2p + 1, broadcast */
                memcpy(&xp, a[j * nb + b].qs + 2 * p, 4);
                const __m256i x = _mm256_set1_epi32(xp);
                sums[j][0] = _mm256_add_epi32(sums[j][0], _mm256_madd_epi16(wp[0], x));
                sums[j][1] = _mm256_add_epi32(sums[j][1], _mm256_madd_epi16(wp[1], x));
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb + h));
            __m256 m = _mm256_setzero_ps();
            if (f.q4)
                m = f.q41 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 2 * G) + h))
                          : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
            for (int j = 0; j < na; j++) {
                const block_a16 *ab = a + j * nb + b;
                acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[j][h]), _mm256_mul_ps(d, _mm256_set1_ps(ab->d)),
                                            acc[j][h]);
                if (f.q4) acc[j][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(ab->s), acc[j][h]);
            }
        }
    }
    for (int j = 0; j < na; j++) {
        _mm256_storeu_ps(out + j * G, acc[j][0]);
        _mm256_storeu_ps(out + j * G + 8, acc[j][1]);
    }
}

#define FOR_NA_AVX2(T, N)                                                          \
    switch (N) {                                                                   \
    case 1: group_dot_avx2_na(T, gw, a, nb, 1, out); break;                        \
    case 2: group_dot_avx2_na(T, gw, a, nb, 2, out); break;                        \
    case 3: group_dot_avx2_na(T, gw, a, nb, 3, out); break;                        \
    default: group_dot_avx2_na(T, gw, a, nb, 4, out); break;                       \
    }

/* na <= NA_X16 in passes of NA_AVX2 rows; a group's weights are read again from L1/L2 in the second */
AVX2 static void group_dot_avx2(int type, const uint8_t *gw, const block_a16 *a, int64_t nb, int na, float *out) {
    for (int c = 0; c < na; c += NA_AVX2, a += NA_AVX2 * nb, out += NA_AVX2 * G) {
        const int n = na - c < NA_AVX2 ? na - c : NA_AVX2;
        switch (type) {
        case T_Q4_0: FOR_NA_AVX2(T_Q4_0, n); break;
        case T_Q4_1: FOR_NA_AVX2(T_Q4_1, n); break;
        default: FOR_NA_AVX2(T_Q8_0, n); break;
        }
    }
}
#endif /* QL_X86 */

static void group_dot(int type, const uint8_t *gw, const block_a16 *a, int64_t nb, int na, float *out) {
#ifdef QL_X86
    if (use_avx512()) { group_dot_vnni(type, gw, a, nb, na, out); return; }
    if (use_avx2()) { group_dot_avx2(type, gw, a, nb, na, out); return; }
#endif
    const x16_format f = format_of(type);
    group_dot_scalar(&f, gw, a, nb, na, out);
}

/* ---- matmul and dequantization over the thread pool ------------------------------------------- */

typedef struct {
    int type;
    int64_t gbb;
    const uint8_t *w;
    int64_t groups, nb, n, ldy;
    block_a16 *a;
    float *y;
} x16_job;

static void groups_task(void *p, int64_t chunk, int64_t nchunks) {
    x16_job *j = p;
    int64_t lo, hi;
    chunk_range(j->groups, chunk, nchunks, &lo, &hi);
    float out[NA_X16 * G];
    for (int64_t g = lo; g < hi; g++)
        for (int64_t c = 0; c < j->n; c += NA_X16) {
            const int na = j->n - c < NA_X16 ? (int)(j->n - c) : NA_X16;
            group_dot(j->type, j->w + g * j->nb * j->gbb, j->a + c * j->nb, j->nb, na, out);
            for (int t = 0; t < na; t++) memcpy(j->y + (c + t) * j->ldy + g * G, out + t * G, G * sizeof(float));
        }
}

/* y[i, r] (row stride ldy) = sum_k x[i, k] * W[r, k] for i < n, r < rows; W interleaved by qlin_x16_repack */
int qlin_x16_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                    int64_t ldy) {
    int rc = check_shape(type, rows, cols);
    if (rc) return rc;
    if (n <= 0 || rows <= 0) return 0;
    x16_job job = {type, format_of(type).gbb, w, rows / G, cols / QK, n, ldy, NULL, y};
    pool_lock();
    job.a = quantize_rows_a16(x, n, job.nb);
    if (!job.a) { pool_unlock(); return -3; }
    /* chunks of ~32K weight-activation products: a few microseconds, above the cost of a hand-off */
    pool_parallel(groups_task, &job, num_chunks(job.groups, 1 + 32767 / (n * cols * G)));
    pool_unlock();
    return 0;
}

typedef struct {
    x16_format f;
    const uint8_t *w;
    int64_t nb, row0, n, ldy;
    const int64_t *ids;
    float *y;
} x16_dq_job;

static void dequantize_rows_task(void *p, int64_t chunk, int64_t nchunks) {
    x16_dq_job *j = p;
    int64_t lo, hi;
    chunk_range(j->n, chunk, nchunks, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        dequantize_row_x16(&j->f, j->w, j->nb, j->ids ? j->ids[i] : j->row0 + i, j->y + i * j->ldy);
}

/* y[i, :] (row stride ldy) = row ids[i] of W (ids NULL: row row0 + i) in fp32, for i < n */
int qlin_x16_dequantize(int type, const uint8_t *w, int64_t cols, const int64_t *ids, int64_t row0, int64_t n,
                        float *y, int64_t ldy) {
    int rc = check_shape(type, 0, cols);
    if (rc) return rc;
    x16_dq_job job = {format_of(type), w, cols / QK, row0, n, ldy, ids, y};
    pool_lock();
    pool_parallel(dequantize_rows_task, &job, num_chunks(n, 1 + 65535 / cols));
    pool_unlock();
    return 0;
}
