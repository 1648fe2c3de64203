/* The CPU kernels' choice of code (see isa.h). */
#include "isa.h"

static int g_isa = -1;  /* ISA_* level in use; -1 not yet detected */

/* the best level this CPU runs */
int qlin_cpu_isa(void) {
#ifdef QL_X86
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
        return ISA_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
        return ISA_AVX512;
    return ISA_AVX2;
#else
    return ISA_SCALAR;
#endif
}

int isa_level(void) {
    if (g_isa < 0) g_isa = qlin_cpu_isa();
    return g_isa;
}

int use_avx2(void) { return isa_level() >= ISA_AVX2; }

int use_avx512(void) { return isa_level() >= ISA_AVX512; }

int qlin_set_isa(int want) {
    int best = qlin_cpu_isa();
    g_isa = want < ISA_SCALAR ? ISA_SCALAR : want > best ? best : want;
    return g_isa;
}
