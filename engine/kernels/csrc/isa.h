/* Which code the CPU kernels run: the AVX2/FMA/F16C versions where the CPU has them, else portable
 * scalar C (also the tests' second reference, which they force with qlin_set_isa(ISA_SCALAR)); the
 * kernels on interleaved weights (qlinear_x16.c) also have an AVX-512 VNNI version. */
#ifndef ISA_H
#define ISA_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QL_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")))
#define AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c"), always_inline))

/* the sum and the largest of a vector's eight lanes */
AVX2_INLINE static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_INLINE static inline float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x in [-88, 88] (clamped), Cephes' expf: 2^k * p(r), r = x - k ln 2, relative error ~1e-7; for the
 * softmax of paged attention and the SiLU of the decode layer */
AVX2_INLINE static inline __m256 exp_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.f)), _mm256_set1_ps(88.f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);   /* ln 2 in two parts: exact k ln 2 */
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_k));
}
#endif

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };  /* AVX512: F, BW and VNNI */
/* the level in use; use_*: 1 while that level's kernels are in use */
int isa_level(void);
int use_avx2(void);
int use_avx512(void);
/* exported: the best level this CPU runs */
int qlin_cpu_isa(void);
/* exported: use level `want`, or the best this CPU has below it (tests force each); returns the level now in use */
int qlin_set_isa(int want);

#endif
