/* How many vpdpbusd a cycle one core retires: 12 independent accumulators (the latency, 5
 * cycles, allows 2.4 a cycle), 512- and 256-bit, register sources or a dword broadcast from
 * memory ({1to16}, the form the grouped q4 kernels use). The clock is a chain of dependent
 * 64-bit imul (3 cycles each), timed around the dots.
 *
 *     gcc -O2 -march=native docs/microbench/dot_rate.c -o /tmp/dot_rate && /tmp/dot_rate
 *
 * Needs AVX-512 VNNI and AVX-VNNI (Sapphire Rapids and later). Figures: docs/kernels.md. */
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int words[16];

__attribute__((noinline)) static long imul_chain(long n) {
    long a = 1, m = 3;
    for (long i = 0; i < n; i++)
        __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0" : "+r"(a) : "r"(m));
    return a;
}

#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                "xmm10", "xmm11", "xmm12", "xmm13"
#define REG12(W) DOT(W, 0) DOT(W, 1) DOT(W, 2) DOT(W, 3) DOT(W, 4) DOT(W, 5) DOT(W, 6) \
                 DOT(W, 7) DOT(W, 8) DOT(W, 9) DOT(W, 10) DOT(W, 11)

#define DOT(W, i) "vpdpbusd %%" #W "mm12, %%" #W "mm13, %%" #W "mm" #i "\n\t"
__attribute__((noinline)) static void zmm_reg(long n) {
    for (long i = 0; i < n; i++) __asm__ volatile(REG12(z) ::: CLOBBER);
}
__attribute__((noinline)) static void ymm_reg(long n) {
    for (long i = 0; i < n; i++) __asm__ volatile(REG12(y) ::: CLOBBER);
}
#undef DOT
#define DOT(W, i) "vpdpbusd " #i "*4(%0)%{1to16%}, %%zmm13, %%zmm" #i "\n\t"
__attribute__((noinline)) static void zmm_bcast(long n) {
    for (long i = 0; i < n; i++) __asm__ volatile(REG12(z) ::"r"(words) : CLOBBER);
}
#undef DOT
#define DOT(W, i) "vpdpbusd " #i "*4(%0)%{1to8%}, %%ymm13, %%ymm" #i "\n\t"
__attribute__((noinline)) static void ymm_bcast(long n) {
    for (long i = 0; i < n; i++) __asm__ volatile(REG12(y) ::"r"(words) : CLOBBER);
}

int main(void) {
    const long dots = 120000000;
    void (*kinds[])(long) = {zmm_reg, zmm_bcast, ymm_reg, ymm_bcast};
    const char *names[] = {"zmm registers", "zmm {1to16}", "ymm registers", "ymm {1to8}"};
    for (int round = 0; round < 3; round++) {
        double t = now();
        imul_chain(dots / 4);
        double ghz = 3.0 * dots / (now() - t) / 1e9;
        printf("clock %.2f GHz;", ghz);
        for (int k = 0; k < 4; k++) {
            t = now();
            kinds[k](dots / 12);
            printf(" %s %.2f", names[k], dots / (now() - t) / 1e9 / ghz);
        }
        printf(" vpdpbusd a cycle\n");
    }
    return 0;
}
