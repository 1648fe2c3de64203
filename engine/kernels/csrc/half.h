/* IEEE half -> float in portable C (the AVX2 code converts eight at a time with F16C instead). */
#ifndef HALF_H
#define HALF_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        float f = ldexpf((float)mant, -24);  /* zero or subnormal */
        return sign ? -f : f;
    }
    bits = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
