/* common_lab.h - what the kernel lab programs in dev/cuda share: strict size flags, the device
 * and its peak numbers, random inputs rounded to the storage type, checks against the CPU
 * reference (test/testing.h's PASS:/FAIL: protocol) and cudaEvent timing.
 *
 * Each lab program #includes the real llmc/cuda header it studies (never a copy) and its
 * llmc/cpu twin, checks the kernel against the twin at GPT-2 124M-like shapes (or the sizes
 * given as flags), then times it. It exits non-zero if any check failed.
 * Build: make cuda-lab (nvcc, build/dev/cuda/NAME) or make build/cudasim/dev/cuda/NAME (the
 * cudasim harness, test/cudasim/README.md). `--small` picks shapes that run through the
 * harness in seconds; timings there are CPU wall-clock and say so.
 *
 * Inputs: generated once in fp32 and rounded to bf16 in place (lab_upload<bf16>), so the same
 * CPU reference serves the bf16 and the fp32 run of a kernel (bf16 values are exact in fp32).
 */
#ifndef LLMC_DEV_CUDA_COMMON_LAB_H
#define LLMC_DEV_CUDA_COMMON_LAB_H
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/cuda/common.cuh"
#include "llmc/core/rng.h"
#include "test/testing.h"

/* ---- flags: --small, --reps N, --NAME N for each size, --help -------------------------- */
typedef struct {
    const char *name; /* flag --name */
    int *value;       /* holds the default (GPT-2 124M-like) on entry */
    int small;        /* the value under --small */
    const char *help;
} LabSize;

typedef struct {
    int small; /* --small given */
    int reps;  /* timed repeats (default 20, 2 under --small) */
} LabOptions;

static inline int lab_parse_positive(const char *flag, const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v <= 0 || v > 0x7fffffff)
        llmc_die("%s needs a positive integer, got '%s'", flag, s);
    return (int)v;
}

static inline void lab_usage(const char *prog, const char *what, const LabSize *sizes, int n) {
    printf("usage: %s [--small] [--reps N] [--NAME N ...]\n%s\n", prog, what);
    printf("  --small      small shapes (the cudasim harness runs them in seconds)\n");
    printf("  --reps N     timed repeats (default 20; 2 with --small)\n");
    for (int i = 0; i < n; i++)
        printf("  --%-10s %s (default %d, --small %d)\n", sizes[i].name, sizes[i].help, *sizes[i].value, sizes[i].small);
}

/* Two passes: --small first (so explicit sizes override it wherever they appear), then the
 * rest. Unknown flags and malformed numbers are errors. */
static inline void lab_parse(int argc, char **argv, const char *what, LabSize *sizes, int n, LabOptions *opt) {
    opt->small = 0;
    opt->reps = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            lab_usage(argv[0], what, sizes, n);
            exit(0);
        }
        if (strcmp(argv[i], "--small") == 0) opt->small = 1;
    }
    if (opt->small)
        for (int k = 0; k < n; k++) *sizes[k].value = sizes[k].small;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0) continue;
        if (strncmp(argv[i], "--", 2) != 0) llmc_die("unexpected argument '%s' (try %s --help)", argv[i], argv[0]);
        int *target = strcmp(argv[i], "--reps") == 0 ? &opt->reps : NULL;
        for (int k = 0; k < n && !target; k++)
            if (strcmp(argv[i] + 2, sizes[k].name) == 0) target = sizes[k].value;
        if (!target) llmc_die("unknown flag '%s' (try %s --help)", argv[i], argv[0]);
        if (i + 1 >= argc) llmc_die("%s needs a value", argv[i]);
        *target = lab_parse_positive(argv[i], argv[i + 1]);
        i++;
    }
    if (opt->reps == 0) opt->reps = opt->small ? 2 : 20;
}

/* ---- the device and its peaks ----------------------------------------------------------- */
typedef struct {
    char name[256];
    double hbm_gbs;     /* peak memory bandwidth, GB/s (0: unknown) */
    double bf16_tflops; /* dense bf16 tensor-core peak (0: unknown) */
    double fp32_tflops; /* fp32 CUDA-core peak, no TF32 (0: unknown) */
    int simulated;      /* the cudasim harness: timings are CPU wall-clock */
} LabDevice;

/* Data-sheet peaks by device name (SXM parts unless the name says PCIe). */
static inline LabDevice lab_device_init(void) {
    cuda_require_device();
    cudaDeviceProp p;
    cudaCheck(cudaGetDeviceProperties(&p, 0));
    LabDevice d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", p.name);
    d.simulated = strncmp(d.name, "cudasim", 7) == 0;
    if (strstr(d.name, "H200")) d.hbm_gbs = 4800, d.bf16_tflops = 989, d.fp32_tflops = 67;
    else if (strstr(d.name, "H100") && strstr(d.name, "PCIe")) d.hbm_gbs = 2000, d.bf16_tflops = 756, d.fp32_tflops = 51;
    else if (strstr(d.name, "H100")) d.hbm_gbs = 3350, d.bf16_tflops = 989, d.fp32_tflops = 67;
    printf("device: %s", d.name);
    if (d.hbm_gbs > 0) printf(" (peaks: %.2f TB/s HBM, %.0f TFLOP/s bf16 dense, %.0f TFLOP/s fp32)", d.hbm_gbs / 1e3, d.bf16_tflops, d.fp32_tflops);
    else printf(" (unknown peak)");
    printf("%s\n", d.simulated ? " -- cudasim: timings are CPU wall-clock, meaningless" : "");
    return d;
}

/* What a lab's main starts with: the device, the flags and the seeded generator of its inputs. */
typedef struct {
    LabDevice dev;
    LabOptions opt;
    Rng rng;
} Lab;

/* The start of a lab's main (`auto [dev, opt, r] = lab_begin(...)`): parses the flags into sizes
 * and opt (lab_parse), finds the device (lab_device_init prints it), prints the setup line "NAME
 * lab: SIZE=value ..., seed S, R timed repeats" (NAME: the program's file name) and seeds rng. */
static inline Lab lab_begin(int argc, char **argv, const char *what, LabSize *sizes, int n, uint64_t seed) {
    Lab lab;
    lab_parse(argc, argv, what, sizes, n, &lab.opt);
    lab.dev = lab_device_init();
    const char *slash = strrchr(argv[0], '/');
    printf("%s lab:", slash ? slash + 1 : argv[0]);
    for (int i = 0; i < n; i++) printf(" %s=%d", sizes[i].name, *sizes[i].value);
    printf(", seed %llu, %d timed repeats\n", (unsigned long long)seed, lab.opt.reps);
    rng_seed(&lab.rng, seed);
    return lab;
}

/* lab_begin for a lab of one op, dev/cuda/OP.cu (file: its __FILE__): "Checks and times
 * llmc/cuda/OP.cuh against llmc/cpu/OP.h.", with as many sizes as the array has. */
template <int N> static inline Lab lab_begin_op(int argc, char **argv, const char *file, LabSize (&sizes)[N], uint64_t seed) {
    static char what[256];
    const char *slash = strrchr(file, '/'), *stem = slash ? slash + 1 : file, *dot = strrchr(stem, '.');
    const int len = dot ? (int)(dot - stem) : (int)strlen(stem);
    snprintf(what, sizeof what, "Checks and times llmc/cuda/%.*s.cuh against llmc/cpu/%.*s.h.", len, stem, len, stem);
    return lab_begin(argc, argv, what, sizes, N, seed);
}

/* "TIME what: 0.123 ms, 456 GB/s (12% of peak)". bytes: what the kernel must read + write. */
static inline void lab_report_bandwidth(const LabDevice *d, const char *what, double bytes, float ms) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("TIME %-34s %9.4f ms %9.1f GB/s", what, ms, gbs);
    if (d->hbm_gbs > 0) printf("  (%.1f%% of %s peak %.2f TB/s)", 100.0 * gbs / d->hbm_gbs, d->name, d->hbm_gbs / 1e3);
    else printf("  (unknown peak)");
    printf("%s\n", d->simulated ? " [cudasim]" : "");
}

/* "TIME what: 0.123 ms, 456 TFLOP/s (12% of peak)"; peak_tflops 0: unknown. */
static inline void lab_report_flops(const LabDevice *d, const char *what, double flops, float ms, double peak_tflops) {
    double tf = flops / (ms * 1e-3) / 1e12;
    printf("TIME %-34s %9.4f ms %9.2f TFLOP/s", what, ms, tf);
    if (peak_tflops > 0) printf("  (%.1f%% of %s peak %.0f TFLOP/s)", 100.0 * tf / peak_tflops, d->name, peak_tflops);
    else printf("  (unknown peak)");
    printf("%s\n", d->simulated ? " [cudasim]" : "");
}

/* ---- tensors ---------------------------------------------------------------------------- */
static inline float *lab_host_floats(size_t n) { return (float *)mallocCheck(n * sizeof(float), "lab host floats"); }

static inline float *lab_host_normal(Rng *r, size_t n, float mean, float std) {
    float *h = lab_host_floats(n);
    rng_normal(r, h, n, mean, std);
    return h;
}

template <class T> static T *lab_alloc(size_t n) {
    T *d;
    cudaCheck(cudaMalloc(&d, n * sizeof(T)));
    return d;
}

/* cudaFree of every device pointer given. */
template <class... P> static void lab_free(P... p) {
    void *ptrs[] = {(void *)p...};
    for (void *q : ptrs) cudaCheck(cudaFree(q));
}

/* Rounds h[0..n) to T in place (round to nearest even, the toolkit's host conversion). */
template <class T> static void lab_round(float *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = to_float(from_float<T>(h[i]));
}

/* lab_host_normal rounded to bf16 in place: inputs that the bf16 and the fp32 run store exactly. */
static inline float *lab_bf16_normal(Rng *r, size_t n, float mean, float std) {
    float *h = lab_host_normal(r, n, mean, std);
    lab_round<__nv_bfloat16>(h, n);
    return h;
}

/* Rounds h[0..n) to T in place (so the CPU reference sees the stored values) and uploads it. */
template <class T> static T *lab_upload(float *h, size_t n) {
    T *tmp = (T *)mallocCheck(n * sizeof(T), "lab upload staging");
    for (size_t i = 0; i < n; i++) h[i] = to_float(tmp[i] = from_float<T>(h[i]));
    T *d = lab_alloc<T>(n);
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(T), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

/* Device T (n) -> new host fp32 array. */
template <class T> static float *lab_download(const T *d, size_t n) {
    T *tmp = (T *)mallocCheck(n * sizeof(T), "lab download staging");
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(T), cudaMemcpyDeviceToHost));
    float *h = lab_host_floats(n);
    for (size_t i = 0; i < n; i++) h[i] = to_float(tmp[i]);
    free(tmp);
    return h;
}

/* One PASS/FAIL line: every element within atol + rtol * |ref|; NaN/Inf always fail. */
template <class T>
static inline int lab_check(const char *name, const T *d, const float *ref, size_t n, double atol, double rtol) {
    float *got = lab_download(d, n);
    int ok = test_close(name, got, ref, n, atol, rtol);
    free(got);
    return ok;
}

/* A tolerance |got - ref| <= atol + rtol |ref|, and the pick by storage type (the lab runs
 * fp32 and bf16; fp16 is covered by test/test_cuda_ops.cu). */
typedef struct {
    double atol, rtol;
} LabTol;
template <class T> static LabTol lab_tol(LabTol fp32, LabTol bf16) { return sizeof(T) == 4 ? fp32 : bf16; }

template <class T> static int lab_check(const char *name, const T *d, const float *ref, size_t n, LabTol tol) {
    return lab_check(name, d, ref, n, tol.atol, tol.rtol);
}

/* The relative spacing of T's values (an upper bound on one ulp / |x| for normal x): a GPU
 * result rounded to T may sit one ulp from the rounded CPU value when the two fp32 results
 * straddle a rounding boundary. */
template <class T> static double lab_ulp(void);
template <> inline double lab_ulp<float>(void) { return 0x1p-23; }
template <> inline double lab_ulp<__nv_bfloat16>(void) { return 0x1p-7; }
template <> inline double lab_ulp<__half>(void) { return 0x1p-10; }

/* Root mean square of ref (the scale for absolute tolerances of sums that can cancel). */
static inline double lab_rms(const float *ref, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)ref[i] * ref[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

/* Mean milliseconds of fn() over `reps` runs after one warmup, timed with events on stream. */
template <class F> static float lab_time_ms(F fn, int reps, cudaStream_t stream = 0) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    fn();
    cudaCheck(cudaEventRecord(a, stream));
    for (int i = 0; i < reps; i++) fn();
    cudaCheck(cudaEventRecord(b, stream));
    cudaCheck(cudaEventSynchronize(b));
    float ms;
    cudaCheck(cudaEventElapsedTime(&ms, a, b));
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    return ms / reps;
}
#endif
