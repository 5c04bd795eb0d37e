/* Streams 512 MB of q4 group blocks (256 weight bytes + 32 scale bytes each) through one copy of
 * a tile's inner loop, lifted from Numba's assembly of engine/kernels/qgroup.py (loop1.s: the
 * 1-row tile, loop5.s: the 5-row verify tile), on one core; prints GB/s of weights + scales and
 * ns per block. Activations, corrections and dx stay in L1 (as in the kernel); the weights and
 * scales come from DRAM on 2 MB pages, prefetched by the loop's own prefetcht1. Built and run
 * by run.sh; figures in docs/kernels.md ("The verify tile against DRAM"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

void run(long groups, char *weights, char *scales, char *small);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)512 << 20;
    long groups = (bytes - 16384) / 16384; /* 64 blocks of 256 bytes a group */
    char *w = aligned_alloc(1 << 21, bytes), *s = aligned_alloc(1 << 21, bytes / 8);
    char *small = aligned_alloc(4096, 1 << 20);
    madvise(w, bytes, MADV_HUGEPAGE);
    madvise(s, bytes / 8, MADV_HUGEPAGE);
    memset(w, 1, bytes);
    memset(s, 0, bytes / 8);
    memset(small, 0, 1 << 20);
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    for (int r = 0; r < reps; r++) {
        double t = now();
        run(groups, w, s, small);
        double dt = now() - t;
        printf("%.2f GB/s, %.2f ns/block\n", groups * 16384.0 * 1.125 / dt / 1e9,
               dt / (groups * 64.0) * 1e9);
    }
    return 0;
}
