/* Linear layers on GGUF weights interleaved in groups of 16 rows (the "x16" layout): Q4_0, Q4_1, Q5_0,
 * Q8_0 and the K-quants Q4_K, Q5_K and Q6_K.
 *
 * In GGUF's layout a weight row's blocks lie one after the other, so a dot product runs along a row:
 * each block's 32 products are summed across vector lanes and scaled on their own, ~8 cycles a block
 * on a Zen 4 core, more than reading its 20 bytes takes. Here the lanes run across 16 rows instead:
 * one AVX-512 VNNI vpdpwssd multiplies a pair of activations (broadcast) by the same pair of columns
 * in 16 rows and accumulates 16 row sums, so 32 columns are 16 such instructions per 16 rows, their
 * scales are one vector load, and no lane is ever summed across. qlin_x16_repack moves GGUF's bits at
 * load time (nothing is dequantized): per group of 16 rows, per block of the type's columns (32, or 256
 * for the K-quants; a "group block"), fields of 16 lanes, one per row:
 *
 *     uint16 d[16]            fp16 scales (a K-quant's super-block scale)
 *     uint16 m[16]            Q4_1: fp16 offsets; Q4_K/Q5_K: fp16 dmin (Q4_0's offset is -8 d)
 *     uint8  sc[n][16]        K-quants: sub-block scales, unpacked from 6 bits (Q4_K/Q5_K, one per 32
 *                             columns) or int8 (Q6_K, one per 16 columns)
 *     uint8  mn[8][16]        Q4_K/Q5_K: sub-block mins, unpacked from 6 bits
 *     4, 5 and 6 bits (Q4_0, Q4_1, Q4_K; Q5_0, Q5_K; Q6_K), per sub-block of 32 columns:
 *         uint8 q[4][16][4]    the low 4 bits in chunks of 8 columns: byte i of row r in chunk m holds
 *                              column 8m + i in its low nibble, 8m + 4 + i in its high one
 *         uint8 qh[hb][16][4]  5 and 6 bits: the hb = bits - 4 high bits; a 64-byte vector covers
 *                              k = 4 / hb chunks, byte i of row r holding, for chunk m (m' = m % k),
 *                              column 8m + i's in field 2m' and 8m + 4 + i's in field 2m' + 1 (fields
 *                              of hb bits from bit 0). Beside its sub-block's nibbles, so that a decode
 *                              step reads one stream: with all high bits after all nibbles, the two
 *                              streams of a K-quant's group block read from memory at half the rate.
 *     8 bits (Q8_0):                     int8  q[pairs][16][2]
 *
 * So a weight is (q - bias) * scale + offset: scale d (times the sub-block's sc for K-quants), bias 16
 * for Q5_0 and 32 for Q6_K (GGUF's unsigned integers, kept), offset -8 d for Q4_0, m for Q4_1, -dmin mn
 * for Q4_K/Q5_K, none for the others. The bytes are GGUF's own count except Q4_K's and Q5_K's, whose 12
 * bytes of packed 6-bit scales and mins per row take 16 (+2.8%, +2.3%; INTERLEAVED_BLOCK_BYTES in
 * quantized_linear.py). 5- and 6-bit weights were once widened to int8 (+55% bytes for Q5_0, +30% for
 * Q6_K) because unpacking them to 16 bits cost more than the bytes saved; on the byte products below a
 * chunk's high bits take one shift and one vpternlogd each, and a decode step streams GGUF's bytes.
 *
 * Activations are quantized per block of 32 to 16 bits as in qlinear.c. 4- to 6-bit weights meet them as bytes:
 * a 64-byte chunk is 16 rows x 8 columns, whose low nibbles (one AND) are 16 rows x 4 columns with a
 * row's 4 weights in one 32-bit lane, the operand of vpdpbusd (4 byte products per lane). A 16-bit
 * activation x = 256 hi + lo (hi signed, lo unsigned) takes two: vpdpbusd(w as u8, hi as s8) and
 * vpdpbusd(lo as u8, w as s8), exact in int32 (w < 64). That is a third of the instructions of widening each
 * pair of nibbles to 16 bits for vpdpwssd (8-bit weights still take that path): a batch-1 decode step,
 * bound by unpacking instructions rather than memory on 2 cores, runs in about half the time. Where the
 * CPU lacks AVX-512 VNNI, AVX2 code computes the same sums with vpmaddwd on two halves of 8 rows, and
 * portable scalar code where it lacks AVX2 too.
 */
#include "half.h"
#include "isa.h"
#include "quant_blocks.h"
#include "thread_pool.h"

#include <math.h>
#include <string.h>

#define G 16      /* rows per group */

/* a 16-bit activation block split into bytes, x = 256 hi + lo (the byte-product VNNI kernel's operands);
 * sh: the sums of its two halves of 16, d x sum(qs) (Q6_K's bias meets 16-column scales) */
typedef struct { float d, s, sh[2]; uint8_t lo[32]; int8_t hi[32]; } block_a8x2;
#define NA_X16 8  /* activation rows per pass over a group's weights */

/* Software prefetch PREFETCH_AHEAD bytes ahead of the weight stream. On a 2-core Xeon (AMX, AVX-512 FP16;
 * in a VM) a batch-1 step read DRAM at 13 GB/s for Q4_K without it and 18 with it (torch's sum: 20;
 * benchmarks/x16_kernels.py, docs/cpu_kernels.md): the hardware prefetchers alone keep too few lines in
 * flight there. 4 KB and 1 KB ahead measured alike; a group's stream is contiguous, so lines past its end
 * are the next group's (or harmless: a prefetch never faults). -DPREFETCH_AHEAD=0 builds without. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4096
#endif
#define prefetch_ahead(p, bytes)                                                                   \
    for (int off_ = 0; PREFETCH_AHEAD > 0 && off_ < (bytes); off_ += 64)                            \
        _mm_prefetch((const char *)(p) + PREFETCH_AHEAD + off_, _MM_HINT_T0)

typedef struct {
    int type, be, bits;  /* columns per group block (32 or 256); bits per stored quant: 4, 5, 6 or 8 */
    int bias;            /* GGUF's unsigned integers' zero: 16 for Q5_0, 32 for Q6_K */
    int nsc, mins;       /* sub-scales per row and group block (0, 8 or 16); Q4_K/Q5_K's per-sub-block mins */
    int has_m;           /* a second fp16 per row: Q4_1's offset, or a K-quant's dmin */
    int64_t off_m, off_sc, off_mn, off_q, gbb;  /* field offsets; bytes per group block */
    int64_t sbb;         /* bytes of quants per sub-block of 32 columns (16 rows): 64 x bits */
} x16_format;

int qlin_x16_supported(int type) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q8_0: case T_Q4_K: case T_Q5_K: case T_Q6_K: return 1;
    default: return 0;
    }
}

static x16_format format_of(int type) {
    /* the block's columns spelled out (not block_elems): with a constant type the format folds to constants */
    x16_format f = {type, (type == T_Q4_K || type == T_Q5_K || type == T_Q6_K) ? 256 : 32, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    f.bits = type == T_Q8_0 ? 8 : (type == T_Q5_0 || type == T_Q5_K) ? 5 : type == T_Q6_K ? 6 : 4;
    f.bias = type == T_Q5_0 ? 16 : type == T_Q6_K ? 32 : 0;
    f.nsc = (type == T_Q4_K || type == T_Q5_K) ? 8 : type == T_Q6_K ? 16 : 0;
    f.mins = type == T_Q4_K || type == T_Q5_K;
    f.has_m = type == T_Q4_1 || f.mins;
    f.off_m = 2 * G;
    f.off_sc = f.off_m + (f.has_m ? 2 * G : 0);
    f.off_mn = f.off_sc + f.nsc * G;
    f.off_q = f.off_mn + (f.mins ? 8 * G : 0);
    f.sbb = 64 * f.bits;
    f.gbb = f.off_q + (int64_t)f.be * G * f.bits / 8;
    return f;
}

/* bytes of one interleaved row of `cols` columns (0: type unsupported or cols not whole blocks) */
int64_t qlin_x16_row_bytes(int type, int64_t cols) {
    if (!qlin_x16_supported(type) || cols % block_elems(type)) return 0;
    return cols / block_elems(type) * format_of(type).gbb / G;
}

/* 0, or the same error codes as qlin_matmul, -4 for rows that are not whole groups */
static int check_shape(int type, int64_t rows, int64_t cols) {
    if (!qlin_x16_supported(type)) return -1;
    if (cols % block_elems(type)) return -2;
    if (rows % G) return -4;
    return 0;
}

/* ---- portable code: the layout spelled out (repacking, dequantization, reference sums) --------- */

/* 4 bits: the byte holding column c of row `lane` (chunks of 8 columns, 4 bytes a row; c % 8 >= 4 high) */
static inline int64_t nibble_byte(const x16_format *f, int lane, int c) {
    return c / 32 * f->sbb + (c % 32 / 8) * 4 * G + lane * 4 + c % 4;
}

/* 5 and 6 bits: the byte holding column c's high bits, and their place in it */
static inline int64_t high_byte(const x16_format *f, int lane, int c) {
    const int k = 4 / (f->bits - 4);
    return c / 32 * f->sbb + 4 * 4 * G + (c % 32 / 8 / k) * 4 * G + lane * 4 + c % 4;
}
static inline int high_shift(const x16_format *f, int c) {
    const int k = 4 / (f->bits - 4);
    return (f->bits - 4) * (2 * (c / 8 % k) + (c % 8 >= 4));
}

/* the stored integer (GGUF's, bias not taken off) of column c of row `lane` in group block gb */
static inline int x16_quant(const x16_format *f, const uint8_t *gb, int lane, int c) {
    const uint8_t *q = gb + f->off_q;
    if (f->bits == 8) return ((const int8_t *)q)[(c / 2 * G + lane) * 2 + c % 2];
    const uint8_t v = q[nibble_byte(f, lane, c)];
    const int low = c % 8 < 4 ? v & 0xF : v >> 4;
    if (f->bits == 4) return low;
    const int high = (q[high_byte(f, lane, c)] >> high_shift(f, c)) & ((1 << (f->bits - 4)) - 1);
    return low | high << 4;
}

/* the integer weight (q - bias, before scale and offset) */
static inline int x16_value(const x16_format *f, const uint8_t *gb, int lane, int c) {
    return x16_quant(f, gb, lane, c) - f->bias;
}

/* a sum of q x activations needs the offset term too (the types with an offset or min; the 16-bit
 * kernels' weights have their bias taken off) */
static int has_offset(const x16_format *f) { return f->bits == 4 || f->mins; }

static inline float x16_d(const uint8_t *gb, int lane) { return half_to_float(((const uint16_t *)gb)[lane]); }

/* the scale of column c of row `lane` */
static inline float x16_scale(const x16_format *f, const uint8_t *gb, int lane, int c) {
    const float d = x16_d(gb, lane);
    if (f->nsc == 8) return d * gb[f->off_sc + c / 32 * G + lane];
    if (f->nsc == 16) return d * ((const int8_t *)gb)[f->off_sc + c / 16 * G + lane];
    return d;
}

/* the offset of column c of row `lane` */
static inline float x16_offset(const x16_format *f, const uint8_t *gb, int lane, int c) {
    const float m = f->has_m ? half_to_float(((const uint16_t *)(gb + f->off_m))[lane]) : 0.f;
    switch (f->type) {
    case T_Q4_0: return -8.f * x16_d(gb, lane);
    case T_Q4_1: return m;
    case T_Q4_K: case T_Q5_K: return -m * gb[f->off_mn + c / 32 * G + lane];
    default: return 0.f;
    }
}

/* element c's integer (GGUF's) into the group block */
static inline __attribute__((always_inline)) void x16_put(const x16_format *f, uint8_t *gb, int lane, int c, int v) {
    uint8_t *q = gb + f->off_q;
    if (f->bits == 8) {
        ((int8_t *)q)[(c / 2 * G + lane) * 2 + c % 2] = (int8_t)v;
        return;
    }
    q[nibble_byte(f, lane, c)] |= (uint8_t)((v & 0xF) << (c % 8 < 4 ? 0 : 4));
    if (f->bits > 4) q[high_byte(f, lane, c)] |= (uint8_t)((v >> 4) << high_shift(f, c));
}

/* one row's GGUF block into lane `lane` of a group block: scales, then quants */
static inline __attribute__((always_inline)) void repack_block(const x16_format *f, const uint8_t *src, uint8_t *gb, int lane) {
    const int t = f->type;
    memcpy(gb + 2 * lane, src + (t == T_Q6_K ? 208 : 0), 2);              /* d */
    if (f->has_m) memcpy(gb + f->off_m + 2 * lane, src + 2, 2);           /* Q4_1's m, a K-quant's dmin */
    if (f->mins) {
        uint8_t sc[8], mn[8];
        q4k_scales(src + 4, sc, mn);
        for (int j = 0; j < 8; j++) {
            gb[f->off_sc + j * G + lane] = sc[j];
            gb[f->off_mn + j * G + lane] = mn[j];
        }
    }
    if (t == T_Q6_K)
        for (int j = 0; j < 16; j++) gb[f->off_sc + j * G + lane] = src[192 + j];
    for (int c = 0; c < f->be; c++) x16_put(f, gb, lane, c, gguf_block_quant_inline(t, src, c));
}

typedef struct {
    x16_format f;
    const uint8_t *w;
    int64_t groups, nb, bb;
    uint8_t *out;
} x16_repack_job;

/* groups lo..hi-1; always inlined with a constant type, so that each type's loop is its own code */
static inline __attribute__((always_inline)) void repack_groups(int type, const x16_repack_job *j, int64_t lo,
                                                                int64_t hi) {
    const x16_format f = format_of(type);
    const int64_t row_bytes = j->nb * j->bb;
    uint8_t *out = j->out + lo * j->nb * f.gbb;
    memset(out, 0, (size_t)((hi - lo) * j->nb * f.gbb));
    for (int64_t g = lo; g < hi; g++)
        for (int64_t b = 0; b < j->nb; b++, out += f.gbb)
            for (int r = 0; r < G; r++)
                repack_block(&f, j->w + (g * G + r) * row_bytes + b * j->bb, out, r);
}

static void repack_groups_task(void *p, int64_t chunk, int64_t nchunks) {
    const x16_repack_job *j = p;
    int64_t lo, hi;
    chunk_range(j->groups, chunk, nchunks, &lo, &hi);
    switch (j->f.type) {
    case T_Q4_0: repack_groups(T_Q4_0, j, lo, hi); break;
    case T_Q4_1: repack_groups(T_Q4_1, j, lo, hi); break;
    case T_Q5_0: repack_groups(T_Q5_0, j, lo, hi); break;
    case T_Q8_0: repack_groups(T_Q8_0, j, lo, hi); break;
    case T_Q4_K: repack_groups(T_Q4_K, j, lo, hi); break;
    case T_Q5_K: repack_groups(T_Q5_K, j, lo, hi); break;
    default: repack_groups(T_Q6_K, j, lo, hi); break;
    }
}

/* GGUF rows -> interleaved groups; out holds rows x qlin_x16_row_bytes(type, cols). Over the pool: a 1.5B
 * model's 1.1 GB took 13 s of its start on one core. */
int qlin_x16_repack(int type, const uint8_t *w, int64_t rows, int64_t cols, uint8_t *out) {
    int rc = check_shape(type, rows, cols);
    if (rc) return rc;
    const x16_format f = format_of(type);
    x16_repack_job job = {f, w, rows / G, cols / f.be, block_bytes(type), out};
    pool_lock();
    pool_parallel(repack_groups_task, &job, num_chunks(job.groups, 16));
    pool_unlock();
    return 0;
}

static void dequantize_row_x16(const x16_format *f, const uint8_t *w, int64_t nb, int64_t row, float *y) {
    const int lane = (int)(row % G);
    for (int64_t b = 0; b < nb; b++, y += f->be) {
        const uint8_t *gb = w + ((row / G) * nb + b) * f->gbb;
        for (int c = 0; c < f->be; c++)
            y[c] = (float)x16_value(f, gb, lane, c) * x16_scale(f, gb, lane, c) + x16_offset(f, gb, lane, c);
    }
}

/* out[j * G + lane] = row (group, lane) . activation row j, for j < na (a: nb32 blocks of 32 per row) */
static void group_dot_scalar(const x16_format *f, const uint8_t *gw, const block_a16 *a, int64_t nb32, int na,
                             float *out) {
    for (int j = 0; j < na; j++)
        for (int lane = 0; lane < G; lane++) {
            float acc = 0.f;
            for (int64_t k = 0; k < nb32; k++) {  /* block k of 32 columns: two halves with their own scale */
                const uint8_t *gb = gw + k * QK / f->be * f->gbb;
                const int c0 = (int)(k * QK % f->be);
                const block_a16 *ab = a + j * nb32 + k;
                int sum[2] = {0, 0};
                for (int i = 0; i < QK; i++) sum[i / 16] += x16_value(f, gb, lane, c0 + i) * ab->qs[i];
                acc += ab->d * (x16_scale(f, gb, lane, c0) * (float)sum[0] + x16_scale(f, gb, lane, c0 + 16) * (float)sum[1]);
                acc += x16_offset(f, gb, lane, c0) * ab->s;
            }
            out[j * G + lane] = acc;
        }
}

/* ---- AVX-512 VNNI ------------------------------------------------------------------------------ */
#ifdef QL_X86

AVX512_INLINE static inline __m512i bytes_to_lanes(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* 8-bit weights: 16 rows x columns 2p, 2p + 1 as int16 pairs in 32-bit lanes (the vpdpwssd operand) */
AVX512_INLINE static inline __m512i pair_weights(const x16_format *f, const uint8_t *gb, int p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(gb + f->off_q + 32 * p)));
}

/* the 16 rows' scales for columns of sub-block s (half h of it for Q6_K's 16-column scales): d x sc */
AVX512_INLINE static inline __m512 scales_avx512(const x16_format *f, const uint8_t *gb, __m512 d, int s, int h) {
    if (f->nsc == 8) return _mm512_mul_ps(d, _mm512_cvtepi32_ps(bytes_to_lanes(gb + f->off_sc + 16 * s)));
    if (f->nsc == 16)
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                    _mm_loadu_si128((const __m128i *)(gb + f->off_sc + 16 * (2 * s + h))))));
    return d;
}

/* the 16 rows' offsets for sub-block s (times each activation block's sum), for has_offset types and Q5_0 */
AVX512_INLINE static inline __m512 offsets_avx512(const x16_format *f, const uint8_t *gb, __m512 d, int s) {
    switch (f->type) {
    case T_Q4_0: return _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
    case T_Q5_0: return _mm512_mul_ps(d, _mm512_set1_ps(-16.f));   /* its bias */
    case T_Q4_1: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + f->off_m)));
    default: {  /* Q4_K/Q5_K: -dmin * mn */
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + f->off_m)));
        return _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(),
                                                                       bytes_to_lanes(gb + f->off_mn + 16 * s))));
    }
    }
}

/* shift each 16-bit lane left by n bits (right where n < 0); n is a constant in every caller */
AVX512_INLINE static inline __m512i shift_epi16(__m512i v, int n) {
    return n > 0 ? _mm512_slli_epi16(v, (unsigned)n) : n < 0 ? _mm512_srli_epi16(v, (unsigned)-n) : v;
}

/* w | the high bits of field `field` of the high vector h moved to bits 4.. (5 and 6 bits): one shift and
 * one vpternlogd (w | (shifted & mask)); bits a 16-bit shift carries over from the next byte are masked */
AVX512_INLINE static inline __m512i with_high(__m512i w, __m512i h, int hb, int field) {
    const __m512i mask = _mm512_set1_epi8((char)(((1 << hb) - 1) << 4));
    return _mm512_ternarylogic_epi32(w, shift_epi16(h, 4 - hb * field), mask, 0xF8);
}

/* as group_dot_scalar for 4-, 5- and 6-bit types on split activations (vpdpbusd, see the top), na <= NA_X16,
 * for ng (1 or 2) groups at once, the second gstride bytes after the first; group g's row j goes to
 * out[(g * NA_X16 + j) * G]. With two groups each broadcast activation word feeds two vpdpbusd instead of one
 * (pairs_of_groups says where that pays) */
AVX512_INLINE static inline void group_dot_nib_avx512(int type, const uint8_t *gw, int64_t gstride, int ng,
                                                      const block_a8x2 *a, int64_t nb32, int na, int wide, float *out) {
    const x16_format f = format_of(type);
    const int subs = f.be / QK, halves = f.nsc == 16 ? 2 : 1, hb = f.bits - 4, k = hb ? 4 / hb : 1;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512 acc[2][NA_X16];
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < na; j++) acc[g][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb32 / subs; b++) {
        const uint8_t *gb[2];
        __m512 d[2];
        for (int g = 0; g < ng; g++) {
            gb[g] = gw + g * gstride + b * f.gbb;
            prefetch_ahead(gb[g], f.gbb);
            d[g] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb[g]));
        }
        for (int s = 0; s < subs; s++) {
            const block_a8x2 *ab = a + b * subs + s;  /* activation row j's block: ab[j * nb32] */
            for (int hc = 0; hc < halves; hc++) {    /* Q6_K: columns 0-15 and 16-31 have their own scales */
                __m512i hi[2][NA_X16], lo[2][NA_X16];
                for (int g = 0; g < ng; g++)
                    for (int j = 0; j < na; j++) hi[g][j] = lo[g][j] = _mm512_setzero_si512();
                for (int m = hc * 4 / halves; m < (hc + 1) * 4 / halves; m++) {  /* chunks of 8 columns */
                    __m512i w0[2], w1[2];
                    for (int g = 0; g < ng; g++) {
                        const uint8_t *q = gb[g] + f.off_q + s * f.sbb;
                        const __m512i v = _mm512_loadu_si512(q + 64 * m);
                        w0[g] = _mm512_and_si512(v, nib);
                        w1[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                        if (hb) {
                            const __m512i h = _mm512_loadu_si512(q + 256 + 64 * (m / k));
                            w0[g] = with_high(w0[g], h, hb, 2 * (m % k));
                            w1[g] = with_high(w1[g], h, hb, 2 * (m % k) + 1);
                        }
                    }
                    for (int j = 0; j < na; j++) {
                        int32_t h0, h1, l0, l1;
                        memcpy(&h0, ab[j * nb32].hi + 8 * m, 4);
                        memcpy(&h1, ab[j * nb32].hi + 8 * m + 4, 4);
                        const __m512i bh0 = _mm512_set1_epi32(h0), bh1 = _mm512_set1_epi32(h1);
                        for (int g = 0; g < ng; g++)
                            hi[g][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(hi[g][j], w0[g], bh0), w1[g], bh1);
                        if (!wide) continue;
                        memcpy(&l0, ab[j * nb32].lo + 8 * m, 4);
                        memcpy(&l1, ab[j * nb32].lo + 8 * m + 4, 4);
                        const __m512i bl0 = _mm512_set1_epi32(l0), bl1 = _mm512_set1_epi32(l1);
                        for (int g = 0; g < ng; g++)
                            lo[g][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(lo[g][j], bl0, w0[g]), bl1, w1[g]);
                    }
                }
                for (int g = 0; g < ng; g++) {
                    const __m512 scale = scales_avx512(&f, gb[g], d[g], s, hc);
                    const __m512 bias = _mm512_mul_ps(scale, _mm512_set1_ps((float)-f.bias));
                    for (int j = 0; j < na; j++) {
                        const __m512i sum = wide ? _mm512_add_epi32(_mm512_slli_epi32(hi[g][j], 8), lo[g][j]) : hi[g][j];
                        acc[g][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                                    _mm512_mul_ps(scale, _mm512_set1_ps(ab[j * nb32].d)), acc[g][j]);
                        if (halves == 2)   /* Q6_K's bias, per half: -32 scale x the half's activation sum */
                            acc[g][j] = _mm512_fmadd_ps(bias, _mm512_set1_ps(ab[j * nb32].sh[hc]), acc[g][j]);
                    }
                }
            }
            if (halves == 1 && (f.bias || has_offset(&f)))
                for (int g = 0; g < ng; g++) {
                    const __m512 m = offsets_avx512(&f, gb[g], d[g], s);
                    for (int j = 0; j < na; j++)
                        acc[g][j] = _mm512_fmadd_ps(m, _mm512_set1_ps(ab[j * nb32].s), acc[g][j]);
                }
        }
    }
    for (int g = 0; g < ng; g++)
        for (int j = 0; j < na; j++) _mm512_storeu_ps(out + (g * NA_X16 + j) * G, acc[g][j]);
}

/* as group_dot_scalar for Q8_0 (int8 weights, no sub-scales or offsets: int16 pairs on vpdpwssd), na <=
 * NA_X16; na is a constant in each caller (FOR_NA_Q8), so the accumulators stay in registers */
AVX512_INLINE static inline void group_dot_q8_avx512(const uint8_t *gw, const block_a16 *a, int64_t nb32, int na,
                                                     float *out) {
    const x16_format f = format_of(T_Q8_0);
    __m512 acc[NA_X16];
    for (int j = 0; j < na; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb32; b++) {
        const uint8_t *gb = gw + b * f.gbb;
        prefetch_ahead(gb, f.gbb);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        const block_a16 *ab = a + b;  /* activation row j's block: ab[j * nb32] */
        __m512i sums[NA_X16];
        for (int j = 0; j < na; j++) sums[j] = _mm512_setzero_si512();
        for (int p = 0; p < QK / 2; p++) {
            const __m512i wp = pair_weights(&f, gb, p);
            for (int j = 0; j < na; j++) {
                int32_t xp;  /* activations 2p and 2p + 1, broadcast */
                memcpy(&xp, ab[j * nb32].qs + 2 * p, 4);
                sums[j] = _mm512_dpwssd_epi32(sums[j], wp, _mm512_set1_epi32(xp));
            }
        }
        for (int j = 0; j < na; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[j]), _mm512_mul_ps(d, _mm512_set1_ps(ab[j * nb32].d)),
                                     acc[j]);
    }
    for (int j = 0; j < na; j++) _mm512_storeu_ps(out + j * G, acc[j]);
}

#define FOR_NA_Q8                                                                   \
    switch (na) {                                                                  \
    case 1: group_dot_q8_avx512(gw, a, nb32, 1, out); break;                       \
    case 2: group_dot_q8_avx512(gw, a, nb32, 2, out); break;                       \
    case 3: group_dot_q8_avx512(gw, a, nb32, 3, out); break;                       \
    case 4: group_dot_q8_avx512(gw, a, nb32, 4, out); break;                       \
    case 5: group_dot_q8_avx512(gw, a, nb32, 5, out); break;                       \
    case 6: group_dot_q8_avx512(gw, a, nb32, 6, out); break;                       \
    case 7: group_dot_q8_avx512(gw, a, nb32, 7, out); break;                       \
    default: group_dot_q8_avx512(gw, a, nb32, 8, out); break;                      \
    }

#define NA_NIB 4   /* activation rows a pass over one group's weights: two integer sums a row, in registers */
#define NA_PAIR 4  /* the same over two groups' (3 measured slower) */
#define FOR_NA_NIB(T, N, NG)                                                       \
    switch (N) {                                                                   \
    case 1: group_dot_nib_avx512(T, gw, gstride, NG, a8, nb32, 1, 1, out); break;  \
    case 2: group_dot_nib_avx512(T, gw, gstride, NG, a8, nb32, 2, 1, out); break;  \
    case 3: group_dot_nib_avx512(T, gw, gstride, NG, a8, nb32, 3, 1, out); break;  \
    default: group_dot_nib_avx512(T, gw, gstride, NG, a8, nb32, 4, 1, out); break; \
    }

/* int8 activations: one integer sum a row, so a pass takes all NA_X16 rows (a group's unpacked weights
 * serve twice as many rows) */
#define FOR_NA_NIB8(T, N)                                                          \
    switch (N) {                                                                   \
    case 1: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 1, 0, out); break;        \
    case 2: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 2, 0, out); break;        \
    case 3: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 3, 0, out); break;        \
    case 4: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 4, 0, out); break;        \
    case 5: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 5, 0, out); break;        \
    case 6: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 6, 0, out); break;        \
    case 7: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 7, 0, out); break;        \
    default: group_dot_nib_avx512(T, gw, 0, 1, a8, nb32, 8, 0, out); break;       \
    }

AVX512 static void group_dot_vnni_a8(int type, const uint8_t *gw, const block_a8x2 *a8, int64_t nb32, int na,
                                     float *out) {
    switch (type) {
    case T_Q4_0: FOR_NA_NIB8(T_Q4_0, na); break;
    case T_Q4_1: FOR_NA_NIB8(T_Q4_1, na); break;
    case T_Q5_0: FOR_NA_NIB8(T_Q5_0, na); break;
    case T_Q4_K: FOR_NA_NIB8(T_Q4_K, na); break;
    case T_Q5_K: FOR_NA_NIB8(T_Q5_K, na); break;
    default: FOR_NA_NIB8(T_Q6_K, na); break;
    }
}

/* ng (1 or 2) groups, gstride bytes apart (two for the 4-bit types only: pairs_of_groups), group g's rows at
 * out + g * NA_X16 * G */
AVX512 static void group_dot_vnni(int type, const uint8_t *gw, int64_t gstride, int ng, const block_a16 *a,
                                  const block_a8x2 *a8, int64_t nb32, int na, float *out) {
    if (type == T_Q8_0) {
        FOR_NA_Q8;
        return;
    }
    const int pass = ng == 2 ? NA_PAIR : NA_NIB;
    for (int c = 0; c < na; c += pass, a8 += pass * nb32, out += pass * G) {
        const int n = na - c < pass ? na - c : pass;
        if (ng == 2) {
            switch (type) {
            case T_Q4_0: FOR_NA_NIB(T_Q4_0, n, 2); break;
            case T_Q4_1: FOR_NA_NIB(T_Q4_1, n, 2); break;
            default: FOR_NA_NIB(T_Q4_K, n, 2); break;
            }
            continue;
        }
        switch (type) {
        case T_Q4_0: FOR_NA_NIB(T_Q4_0, n, 1); break;
        case T_Q4_1: FOR_NA_NIB(T_Q4_1, n, 1); break;
        case T_Q5_0: FOR_NA_NIB(T_Q5_0, n, 1); break;
        case T_Q4_K: FOR_NA_NIB(T_Q4_K, n, 1); break;
        case T_Q5_K: FOR_NA_NIB(T_Q5_K, n, 1); break;
        default: FOR_NA_NIB(T_Q6_K, n, 1); break;
        }
    }
}

/* ---- AVX2 -------------------------------------------------------------------------------------- */

#define NA_AVX2 4  /* activation rows per pass here: 2 x NA_AVX2 integer sums, 2 weight vectors in 16 ymm */

/* 16 rows x columns 2p, 2p + 1 as int16 pairs in 32-bit lanes (bias taken off), rows 0-7 in w[0] and 8-15 in w[1] */
AVX2_INLINE static inline void pair_weights_avx2(const x16_format *f, const uint8_t *gb, int p, __m256i w[2]) {
    const uint8_t *q = gb + f->off_q;
    if (f->bits == 8) {
        w[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 32 * p)));
        w[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 32 * p + 16)));
        return;
    }
    /* columns 2p and 2p + 1 are nibbles of bytes i and i + 1 of each row's 4 in chunk m of sub-block
     * p / 16: shifted to bits 0-3 and 8-11 of the row's lane, then the second moved to 16-19 */
    const uint8_t *sq = q + p / 16 * f->sbb;
    const int m = p % 16 / 4, i = 2 * p % 8, shift = 8 * (i % 4) + (i < 4 ? 0 : 4);
    const __m256i nib = _mm256_set1_epi32(0xF), nib16 = _mm256_set1_epi32(0xF0000);
    for (int h = 0; h < 2; h++) {
        const __m256i t = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(sq + 64 * m + 32 * h)), shift);
        w[h] = _mm256_or_si256(_mm256_and_si256(t, nib), _mm256_and_si256(_mm256_slli_epi32(t, 8), nib16));
    }
    if (f->bits == 4) return;
    /* 5 and 6 bits: the high bits of both columns the same way, to bits 4.. of each 16-bit half */
    const int hb = f->bits - 4, k = 4 / hb, field = 2 * (m % k) + (i >= 4);
    const __m256i mask = _mm256_set1_epi32((1 << hb) - 1), mask16 = _mm256_set1_epi32(((1 << hb) - 1) << 16);
    for (int h = 0; h < 2; h++) {
        const __m256i t = _mm256_srli_epi32(
            _mm256_loadu_si256((const __m256i *)(sq + 256 + 64 * (m / k) + 32 * h)), 8 * (i % 4) + hb * field);
        const __m256i high = _mm256_or_si256(_mm256_and_si256(t, mask), _mm256_and_si256(_mm256_slli_epi32(t, 8), mask16));
        w[h] = _mm256_sub_epi16(_mm256_or_si256(w[h], _mm256_slli_epi32(high, 4)), _mm256_set1_epi16((short)f->bias));
    }
}

AVX2_INLINE static inline __m256 half_lanes(const uint8_t *p, int h) {  /* 8 fp16 of 16, half h */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + h));
}

AVX2_INLINE static inline __m256i bytes8_to_lanes(const uint8_t *p, int is_signed) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)p);
    return is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

/* rows 8h..8h+7's offsets for sub-block s (as offsets_avx512) */
AVX2_INLINE static inline __m256 offsets_avx2(const x16_format *f, const uint8_t *gb, __m256 d, int s, int h) {
    switch (f->type) {
    case T_Q4_0: return _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
    case T_Q4_1: return half_lanes(gb + f->off_m, h);
    default:
        return _mm256_mul_ps(half_lanes(gb + f->off_m, h),
                             _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(),
                                                                 bytes8_to_lanes(gb + f->off_mn + 16 * s + 8 * h, 0))));
    }
}

/* as group_dot_scalar, na <= NA_AVX2 (a constant in each caller): vpmaddwd and an add where VNNI has one
 * vpdpwssd, each 16-row sum in two halves */
AVX2_INLINE static inline void group_dot_avx2_na(int type, const uint8_t *gw, const block_a16 *a, int64_t nb32,
                                                 int na, float *out) {
    const x16_format f = format_of(type);
    const int subs = f.be / QK, halves = f.nsc == 16 ? 2 : 1, pairs = QK / 2 / halves;
    __m256 acc[NA_AVX2][2];
    for (int j = 0; j < na; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb32 / subs; b++) {
        const uint8_t *gb = gw + b * f.gbb;
        prefetch_ahead(gb, f.gbb);
        for (int s = 0; s < subs; s++) {
            const block_a16 *ab = a + b * subs + s;
            for (int hc = 0; hc < halves; hc++) {  /* Q6_K: columns 0-15 and 16-31 have their own scales */
                __m256i sums[NA_AVX2][2];
                for (int j = 0; j < na; j++) sums[j][0] = sums[j][1] = _mm256_setzero_si256();
                for (int p = hc * pairs; p < (hc + 1) * pairs; p++) {
                    __m256i wp[2];
                    pair_weights_avx2(&f, gb, 16 * s + p, wp);
                    for (int j = 0; j < na; j++) {
                        int32_t xp;  /* activations 2p and 2p + 1, broadcast */
                        memcpy(&xp, ab[j * nb32].qs + 2 * p, 4);
                        const __m256i x = _mm256_set1_epi32(xp);
                        sums[j][0] = _mm256_add_epi32(sums[j][0], _mm256_madd_epi16(wp[0], x));
                        sums[j][1] = _mm256_add_epi32(sums[j][1], _mm256_madd_epi16(wp[1], x));
                    }
                }
                for (int h = 0; h < 2; h++) {
                    __m256 scale = half_lanes(gb, h);
                    if (f.nsc == 8)
                        scale = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(bytes8_to_lanes(gb + f.off_sc + 16 * s + 8 * h, 0)));
                    if (f.nsc == 16)
                        scale = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(
                                                         bytes8_to_lanes(gb + f.off_sc + 16 * (2 * s + hc) + 8 * h, 1)));
                    for (int j = 0; j < na; j++)
                        acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[j][h]),
                                                    _mm256_mul_ps(scale, _mm256_set1_ps(ab[j * nb32].d)), acc[j][h]);
                }
            }
            if (has_offset(&f))
                for (int h = 0; h < 2; h++) {
                    const __m256 m = offsets_avx2(&f, gb, half_lanes(gb, h), s, h);
                    for (int j = 0; j < na; j++)
                        acc[j][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(ab[j * nb32].s), acc[j][h]);
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
    case 1: group_dot_avx2_na(T, gw, a, nb32, 1, out); break;                      \
    case 2: group_dot_avx2_na(T, gw, a, nb32, 2, out); break;                      \
    case 3: group_dot_avx2_na(T, gw, a, nb32, 3, out); break;                      \
    default: group_dot_avx2_na(T, gw, a, nb32, 4, out); break;                     \
    }

/* na <= NA_X16 in passes of NA_AVX2 rows; a group's weights are read again from L1/L2 in the second */
AVX2 static void group_dot_avx2(int type, const uint8_t *gw, const block_a16 *a, int64_t nb32, int na, float *out) {
    for (int c = 0; c < na; c += NA_AVX2, a += NA_AVX2 * nb32, out += NA_AVX2 * G) {
        const int n = na - c < NA_AVX2 ? na - c : NA_AVX2;
        switch (type) {
        case T_Q4_0: FOR_NA_AVX2(T_Q4_0, n); break;
        case T_Q4_1: FOR_NA_AVX2(T_Q4_1, n); break;
        case T_Q5_0: FOR_NA_AVX2(T_Q5_0, n); break;
        case T_Q8_0: FOR_NA_AVX2(T_Q8_0, n); break;
        case T_Q4_K: FOR_NA_AVX2(T_Q4_K, n); break;
        case T_Q5_K: FOR_NA_AVX2(T_Q5_K, n); break;
        default: FOR_NA_AVX2(T_Q6_K, n); break;
        }
    }
}
#endif /* QL_X86 */

/* ng groups (2: pairs_of_groups only), gstride bytes apart, group g's rows at out + g * NA_X16 * G */
static void group_dot(int type, const uint8_t *gw, int64_t gstride, int ng, const block_a16 *a, const block_a8x2 *a8,
                      int64_t nb32, int na, float *out) {
#ifdef QL_X86
    if (!a) { group_dot_vnni_a8(type, gw, a8, nb32, na, out); return; }   /* int8 activations (AVX-512 only) */
    if (use_avx512()) { group_dot_vnni(type, gw, gstride, ng, a, a8, nb32, na, out); return; }
    if (use_avx2()) { group_dot_avx2(type, gw, a, nb32, na, out); return; }
#endif
    const x16_format f = format_of(type);
    group_dot_scalar(&f, gw, a, nb32, na, out);
}

/* ---- matmul and dequantization over the thread pool ------------------------------------------- */

typedef struct {
    int type;
    const uint8_t *w;
    int64_t groups, group_bytes, nb32, n, ldy;
    block_a16 *a;     /* 16-bit activations; NULL where a8 holds int8 ones */
    block_a8x2 *a8;   /* 16-bit activations split into bytes (4- to 6-bit types on AVX-512 VNNI), int8 ones
                         (their `hi`: int8 asked for) or NULL */
    float *y;
} x16_job;

/* the split activations' buffer, reused across calls (the caller holds the pool lock) */
static block_a8x2 *scratch_a8x2(int64_t blocks) {
    static void *buf = NULL;
    static size_t cap = 0;
    return grow_scratch(&buf, &cap, (size_t)blocks * sizeof(block_a8x2));
}

/* x = 256 hi + lo for each 16-bit activation (hi signed, lo unsigned) */
static void split_a16(const block_a16 *a, block_a8x2 *b, int64_t blocks) {
    for (int64_t k = 0; k < blocks; k++) {
        int32_t half[2] = {0, 0};
        b[k].d = a[k].d;
        b[k].s = a[k].s;
        for (int i = 0; i < QK; i++) {
            b[k].lo[i] = (uint8_t)(a[k].qs[i] & 0xFF);
            b[k].hi[i] = (int8_t)(a[k].qs[i] >> 8);
            half[i / 16] += a[k].qs[i];
        }
        b[k].sh[0] = a[k].d * (float)half[0];
        b[k].sh[1] = a[k].d * (float)half[1];
    }
}

typedef struct {
    const block_a16 *a;
    block_a8x2 *b;
    int64_t blocks;
} split_job;

#ifdef QL_X86
AVX512 static void split_a16_avx512(const block_a16 *a, block_a8x2 *b, int64_t blocks) {
    const __m512i ones = _mm512_set1_epi16(1);
    for (int64_t k = 0; k < blocks; k++) {
        const __m512i v = _mm512_loadu_si512(a[k].qs);
        _mm256_storeu_si256((__m256i *)b[k].lo, _mm512_cvtepi16_epi8(v));   /* the low bytes, as they are */
        _mm256_storeu_si256((__m256i *)b[k].hi, _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
        const __m512i pairs = _mm512_madd_epi16(v, ones);                  /* 16 sums of 2: halves of 8 */
        b[k].d = a[k].d;
        b[k].s = a[k].s;
        b[k].sh[0] = a[k].d * (float)_mm512_mask_reduce_add_epi32(0x00FF, pairs);
        b[k].sh[1] = a[k].d * (float)_mm512_mask_reduce_add_epi32(0xFF00, pairs);
    }
}
#endif

static void split_task(void *p, int64_t chunk, int64_t nchunks) {
    const split_job *j = p;
    int64_t lo, hi;
    chunk_range(j->blocks, chunk, nchunks, &lo, &hi);
#ifdef QL_X86
    if (use_avx512()) { split_a16_avx512(j->a + lo, j->b + lo, hi - lo); return; }
#endif
    split_a16(j->a + lo, j->b + lo, hi - lo);
}

/* split_a16 over the pool: a 512-row prefill step's activations are ~10K blocks, a millisecond on one core */
static void split_rows_a16(const block_a16 *a, block_a8x2 *b, int64_t blocks) {
    split_job job = {a, b, blocks};
    pool_parallel(split_task, &job, num_chunks(blocks, 256));
}

/* ---- int8 activations for large steps ---------------------------------------------------------- */

/* Where the caller asks (engine_config.py's kernel_activations=int8), activations are quantized to int8 per
 * block of 32 (d = max|x| / 127, llama.cpp's Q8_0 activations) instead of 16 bits: one vpdpbusd a weight byte
 * instead of two, and a group's unpacked weights serve 8 rows a pass instead of 4, for the 4- to 6-bit types
 * on AVX-512 VNNI (elsewhere, and for Q8_0, the 16-bit code runs). Steps of several rows are bound by those
 * instructions, and run ~1.6x faster (a prefill; a batch-1 decode step of a large model is bound by reading
 * the weights instead, and gains little). The price: a model's greedy tokens leave fp32's sooner than with 16
 * bits (docs/cpu_kernels.md), hence not the default. */
#define A8_MAX 127.f

/* one block of 32 activations into b->hi as int8, with d, s and the halves' sums as split_a16 sets them */
static void quantize_a8_scalar(const float *x, block_a8x2 *b) {
    float amax = 0.f;
    for (int i = 0; i < QK; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float d = amax / A8_MAX, id = d > 0.f ? 1.f / d : 0.f;
    int32_t half[2] = {0, 0};
    for (int i = 0; i < QK; i++) {
        const int q = (int)nearbyintf(x[i] * id);   /* half to even, as the AVX-512 code rounds */
        b->hi[i] = (int8_t)q;
        half[i / 16] += q;
    }
    b->d = d;
    b->sh[0] = d * (float)half[0];
    b->sh[1] = d * (float)half[1];
    b->s = b->sh[0] + b->sh[1];
}

#ifdef QL_X86
AVX512 static void quantize_a8_avx512(const float *x, block_a8x2 *b) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / A8_MAX, id = d > 0.f ? 1.f / d : 0.f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)));   /* rounds half to even */
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i *)b->hi, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(b->hi + 16), _mm512_cvtepi32_epi8(q1));
    b->d = d;
    b->sh[0] = d * (float)_mm512_reduce_add_epi32(q0);
    b->sh[1] = d * (float)_mm512_reduce_add_epi32(q1);
    b->s = b->sh[0] + b->sh[1];
}
#endif

typedef struct {
    const float *x;
    block_a8x2 *b;
    int64_t blocks;
} a8_job;

static void quantize_a8_task(void *p, int64_t chunk, int64_t nchunks) {
    const a8_job *j = p;
    int64_t lo, hi;
    chunk_range(j->blocks, chunk, nchunks, &lo, &hi);
    for (int64_t k = lo; k < hi; k++) {
#ifdef QL_X86
        if (use_avx512()) { quantize_a8_avx512(j->x + k * QK, j->b + k); continue; }
#endif
        quantize_a8_scalar(j->x + k * QK, j->b + k);
    }
}

/* the n rows of x (nb32 blocks each) as int8 blocks, over the pool, into the split activations' buffer */
static block_a8x2 *quantize_rows_a8(const float *x, int64_t n, int64_t nb32) {
    a8_job job = {x, scratch_a8x2(n * nb32), n * nb32};
    if (job.b) pool_parallel(quantize_a8_task, &job, num_chunks(job.blocks, 256));
    return job.b;
}

/* Two groups a pass where the 16-bit activations are split into bytes (AVX-512 VNNI), the weights have 4 bits
 * and a step has several rows: each broadcast activation word then feeds two vpdpbusd (group_dot_nib_avx512).
 * With one broadcast load a vpdpbusd, a 512-row step's matmuls ran ~5.3 G of them a second a core on a 2-core
 * Zen 5, bound by the broadcasts; two groups made Q4_0's steps faster, and 5- and 6-bit types' slower in scratch
 * runs (their high bits double each group's registers). A
 * batch-1 decode step, bound by reading the weights, keeps one group a pass. */
static int pairs_of_groups(const x16_job *j) { return j->a && j->a8 && j->n > 1 && format_of(j->type).bits == 4; }

static void groups_task(void *p, int64_t chunk, int64_t nchunks) {
    x16_job *j = p;
    int64_t lo, hi;
    chunk_range(j->groups, chunk, nchunks, &lo, &hi);
    float out[2 * NA_X16 * G];
    const int pairs = pairs_of_groups(j);
    for (int64_t g = lo; g < hi;) {
        const int ng = pairs && g + 1 < hi ? 2 : 1;
        for (int64_t c = 0; c < j->n; c += NA_X16) {
            const int na = j->n - c < NA_X16 ? (int)(j->n - c) : NA_X16;
            group_dot(j->type, j->w + g * j->group_bytes, j->group_bytes, ng, j->a ? j->a + c * j->nb32 : NULL,
                      j->a8 ? j->a8 + c * j->nb32 : NULL, j->nb32, na, out);
            for (int k = 0; k < ng; k++)
                for (int t = 0; t < na; t++)
                    memcpy(j->y + (c + t) * j->ldy + (g + k) * G, out + (k * NA_X16 + t) * G, G * sizeof(float));
        }
        g += ng;
    }
}

/* Chunks of at least ~32K weight-activation products (a few microseconds, above the cost of a hand-off)
 * and CHUNK_BYTES of weights, but 4 a thread at least where there are groups enough. Where chunks were
 * as small as the products allow (2 groups at one row), the threads took turns along the matrix and a
 * decode step read its weights at ~23 GB/s; in runs of 256 KB each core streams on its own, at ~30 on a
 * 2-core Zen 4 (all of a 1.5B Q4_K_M's matmuls: 39 -> 34 ms, as llama.cpp's whole step). */
#define CHUNK_BYTES (256 << 10)
static int64_t matmul_chunks(const x16_job *job, int64_t n, int64_t cols) {
    int64_t grain = 1 + 32767 / (n * cols * G);
    if (grain < CHUNK_BYTES / job->group_bytes) grain = CHUNK_BYTES / job->group_bytes;
    const int64_t least = 4 * pool_threads();
    if (job->groups / grain < least) grain = job->groups / least;
    return num_chunks(job->groups, grain < 1 ? 1 : grain);
}

/* y[i, r] (row stride ldy) = sum_k x[i, k] * W[r, k] for i < n, r < rows; W interleaved by qlin_x16_repack;
 * int8: int8 activations where the type and CPU have them (above), else 16-bit */
int qlin_x16_matmul(int type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                    int64_t ldy, int int8) {
    int rc = check_shape(type, rows, cols);
    if (rc) return rc;
    if (n <= 0 || rows <= 0) return 0;
    x16_job job = {type, w, rows / G, qlin_x16_row_bytes(type, cols) * G, cols / QK, n, ldy, NULL, NULL, y};
    const int bytes = use_avx512() && type != T_Q8_0;   /* 4- to 6-bit types on vpdpbusd: activations as bytes */
    pool_lock();
    if (int8 && bytes) {
        job.a8 = quantize_rows_a8(x, n, job.nb32);
    } else {
        job.a = quantize_rows_a16(x, n, job.nb32);
        if (job.a && bytes) {
            job.a8 = scratch_a8x2(n * job.nb32);
            if (job.a8) split_rows_a16(job.a, job.a8, n * job.nb32);
            else job.a = NULL;
        }
    }
    if (!job.a && !job.a8) { pool_unlock(); return -3; }
    pool_parallel(groups_task, &job, matmul_chunks(&job, n, cols));
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

/* lanes lane0..lane1-1 of group `group` (rows of y, stride ldy), every column; inlined with a constant type:
 * each row's scale and offset once per 16 columns (the finest K-quant sub-block, Q6_K's) and each weight one
 * extraction, where dequantize_row_x16 decodes the format for every weight (~12 ns a weight, a 1.5B model's
 * gate/up in 0.33 s: the dense path's whole cost once its GEMM runs on AMX). */
static inline __attribute__((always_inline)) void dequantize_group(int type, const uint8_t *w, int64_t nb, int64_t group,
                                                                   int lane0, int lane1, float *y, int64_t ldy) {
    const x16_format f = format_of(type);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = w + (group * nb + b) * f.gbb;
        for (int lane = lane0; lane < lane1; lane++) {
            float *yr = y + (lane - lane0) * ldy + b * f.be;
            for (int c0 = 0; c0 < f.be; c0 += 16) {
                const float scale = x16_scale(&f, gb, lane, c0), offset = x16_offset(&f, gb, lane, c0);
                if (f.bits == 8) {
                    for (int c = c0; c < c0 + 16; c++) yr[c] = (float)x16_value(&f, gb, lane, c) * scale + offset;
                    continue;
                }
                /* chunks of 8 columns: 4 bytes of this row, low nibbles columns 0-3, high ones 4-7 */
                for (int c = c0; c < c0 + 16; c += 8) {
                    const uint8_t *nib = gb + f.off_q + nibble_byte(&f, lane, c);
                    int v[8];
                    for (int i = 0; i < 4; i++) v[i] = nib[i] & 0xF, v[4 + i] = nib[i] >> 4;
                    if (f.bits > 4) {
                        const uint8_t *hb = gb + f.off_q + high_byte(&f, lane, c);
                        const int mask = (1 << (f.bits - 4)) - 1, lo_shift = high_shift(&f, c), hi_shift = high_shift(&f, c + 4);
                        for (int i = 0; i < 4; i++)
                            v[i] |= (hb[i] >> lo_shift & mask) << 4, v[4 + i] |= (hb[i] >> hi_shift & mask) << 4;
                    }
                    for (int i = 0; i < 8; i++) yr[c + i] = (float)(v[i] - f.bias) * scale + offset;
                }
            }
        }
    }
}

/* rows lo..hi-1 of the job (contiguous from row0), a group's run of rows at a time */
static inline __attribute__((always_inline)) void dequantize_span(int type, const x16_dq_job *j, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi;) {
        const int64_t row = j->row0 + i;
        const int lane0 = (int)(row % G);
        const int64_t run = hi - i < G - lane0 ? hi - i : G - lane0;
        dequantize_group(type, j->w, j->nb, row / G, lane0, lane0 + (int)run, j->y + i * j->ldy, j->ldy);
        i += run;
    }
}

static void dequantize_rows_task(void *p, int64_t chunk, int64_t nchunks) {
    x16_dq_job *j = p;
    int64_t lo, hi;
    chunk_range(j->n, chunk, nchunks, &lo, &hi);
    if (j->ids) {   /* embedding lookups: a few scattered rows */
        for (int64_t i = lo; i < hi; i++) dequantize_row_x16(&j->f, j->w, j->nb, j->ids[i], j->y + i * j->ldy);
        return;
    }
    switch (j->f.type) {
    case T_Q4_0: dequantize_span(T_Q4_0, j, lo, hi); break;
    case T_Q4_1: dequantize_span(T_Q4_1, j, lo, hi); break;
    case T_Q5_0: dequantize_span(T_Q5_0, j, lo, hi); break;
    case T_Q8_0: dequantize_span(T_Q8_0, j, lo, hi); break;
    case T_Q4_K: dequantize_span(T_Q4_K, j, lo, hi); break;
    case T_Q5_K: dequantize_span(T_Q5_K, j, lo, hi); break;
    default: dequantize_span(T_Q6_K, j, lo, hi); break;
    }
}

/* y[i, :] (row stride ldy) = row ids[i] of W (ids NULL: row row0 + i) in fp32, for i < n */
int qlin_x16_dequantize(int type, const uint8_t *w, int64_t cols, const int64_t *ids, int64_t row0, int64_t n,
                        float *y, int64_t ldy) {
    int rc = check_shape(type, 0, cols);
    if (rc) return rc;
    x16_dq_job job = {format_of(type), w, cols / block_elems(type), row0, n, ldy, ids, y};
    pool_lock();
    pool_parallel(dequantize_rows_task, &job, num_chunks(n, 1 + 65535 / cols));
    pool_unlock();
    return 0;
}
