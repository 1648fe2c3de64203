/* tests/csrc/pool_stress.c as a program, for a ThreadSanitizer build (tests/test_thread_pool.py): a
 * sanitizer runtime in a library ctypes loads into Python needs the interpreter preloaded with it, a
 * program does not. Exits 1 when a unit of work ran other than once; TSan exits 66 on a data race. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int64_t pool_stress(int rounds, int small, int large);

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    const int64_t wrong = pool_stress(rounds, 2, 40);
    printf("%lld units ran other than once\n", (long long)wrong);
    return wrong != 0;
}
