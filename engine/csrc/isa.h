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
