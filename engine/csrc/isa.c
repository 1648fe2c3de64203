/* The CPU kernels' choice of code (see isa.h). */
#include "isa.h"

static int g_isa = -1;  /* 0 scalar, 1 avx2; -1 not yet detected */

static int cpu_has_avx2(void) {
#ifdef QL_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

int qlin_cpu_avx2(void) { return cpu_has_avx2(); }

int use_avx2(void) {
    if (g_isa < 0) g_isa = cpu_has_avx2();
    return g_isa;
}

int qlin_set_isa(int want) {
    g_isa = want && cpu_has_avx2();
    return g_isa;
}
