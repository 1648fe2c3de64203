/* Which code the CPU kernels run: the AVX2/FMA/F16C versions where the CPU has them, else portable
 * scalar C (also the tests' second reference, which they force with qlin_set_isa(0)). */
#ifndef ISA_H
#define ISA_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QL_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline))
#endif

/* 1 while the AVX2 kernels are in use */
int use_avx2(void);
/* exported: 1 if the AVX2 kernels run on this CPU */
int qlin_cpu_avx2(void);
/* exported: force the scalar kernels (0) or the best this CPU has (1); returns the ISA now in use */
int qlin_set_isa(int want);

#endif
