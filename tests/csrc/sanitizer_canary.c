/* Two bugs on purpose, for .ci/sanitize to prove before it trusts a green run that its build and
 * environment catch them: a heap read one past the end (AddressSanitizer) and a signed overflow
 * (UndefinedBehaviorSanitizer, fatal under -fno-sanitize-recover=all). Never part of the library. */
#include <stdint.h>
#include <stdlib.h>

int canary_read_past_end(int n) {
    volatile int *a = malloc((size_t)n * sizeof(int));
    int s = a[n];
    free((void *)a);
    return s;
}

int canary_signed_overflow(int x) { return x + INT32_MAX; }
