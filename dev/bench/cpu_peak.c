/*
 * cpu_peak.c - measures this CPU's fp32 peak: independent chains of vector FMAs on every core
 * (the widest vectors -march=native allows), so the "fraction of peak" that `make bench`
 * prints is against what this machine really does, turbo included, not a datasheet.
 * The best of several short runs counts (a busy or throttled VM only ever makes one slower).
 * Prints one line: "PEAK gflops=<all cores> per_core=<one core> lanes=<floats per vector>".
 */
#include <stdio.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));
enum { CHAINS = 12, ITERS = 5000000 }; /* CHAINS: the accumulators in spin() */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float spin(float seed) {
    vec a, b;
    for (int i = 0; i < LANES; i++) a[i] = 0.999999f, b[i] = seed * 1e-7f;
    /* twelve named accumulators so they stay in registers: FMA latency x throughput */
    vec x0 = a, x1 = a * 2, x2 = a * 3, x3 = a * 4, x4 = a * 5, x5 = a * 6;
    vec x6 = a * 7, x7 = a * 8, x8 = a * 9, x9 = a * 10, x10 = a * 11, x11 = a * 12;
    for (int it = 0; it < ITERS; it++) {
        x0 = x0 * a + b; x1 = x1 * a + b; x2 = x2 * a + b; x3 = x3 * a + b;
        x4 = x4 * a + b; x5 = x5 * a + b; x6 = x6 * a + b; x7 = x7 * a + b;
        x8 = x8 * a + b; x9 = x9 * a + b; x10 = x10 * a + b; x11 = x11 * a + b;
    }
    vec t = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += t[i];
    return s;
}

/* The best of a few short runs: a shared or throttled VM only ever makes a run slower. */
static double best_of(int threads, int runs);

static double run(int threads) {
    volatile float sink = 0.0f;
    double t0 = now();
#pragma omp parallel num_threads(threads)
    {
        float s = spin(1.0f);
#pragma omp atomic
        sink += s;
    }
    double secs = now() - t0;
    (void)sink;
    return 2.0 * LANES * CHAINS * (double)ITERS * threads / secs / 1e9;
}

static double best_of(int threads, int runs) {
    double best = 0.0;
    for (int i = 0; i < runs; i++) {
        double g = run(threads);
        if (g > best) best = g;
    }
    return best;
}

int main(void) {
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_max_threads();
#endif
    double one = best_of(1, 3), all = best_of(cores, 5);
    printf("PEAK gflops=%.1f per_core=%.1f lanes=%d cores=%d\n", all, one, LANES, cores);
    return 0;
}
