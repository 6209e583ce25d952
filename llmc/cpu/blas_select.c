#include "llmc/cpu/blas_select.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "llmc/core/check.h"
#include "llmc/cpu/matmul.h"

#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

CpuFeatures cpu_features_detect(void) {
    CpuFeatures f = {0};
#if defined(__x86_64__) || defined(__i386__)
    /* __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 registers */
    __builtin_cpu_init();
    f.avx = __builtin_cpu_supports("avx") != 0;
    f.avx2 = __builtin_cpu_supports("avx2") != 0;
    f.fma = __builtin_cpu_supports("fma") != 0;
    f.avx512f = __builtin_cpu_supports("avx512f") != 0;
    f.avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    f.avx512dq = __builtin_cpu_supports("avx512dq") != 0;
    f.avx512vl = __builtin_cpu_supports("avx512vl") != 0;
    f.avx512cd = __builtin_cpu_supports("avx512cd") != 0;
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16") != 0;
    f.amd = __builtin_cpu_is("amd") != 0;
#endif
    return f;
}

const char *blas_coretype_for(const CpuFeatures *f) {
    int skx = f->avx512f && f->avx512cd && f->avx512bw && f->avx512dq && f->avx512vl && f->avx2 && f->fma;
    if (skx) return f->avx512bf16 ? "Cooperlake" : "SkylakeX";
    if (f->avx2 && f->fma) return f->amd ? "Zen" : "Haswell";
    if (f->avx) return "Sandybridge";
    return NULL;
}

/* OpenBLAS's x86-64 kernel families, lowest first; names within one level are equivalent here. */
static const char *const LEVELS[][6] = {
    {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom"},
    {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator", NULL},
    {"Haswell", "Zen", NULL},
    {"SkylakeX", NULL},
    {"Cooperlake", NULL},
    {"SapphireRapids", NULL},
};
enum { NUM_LEVELS = sizeof LEVELS / sizeof LEVELS[0] };

/* 1-based level of a core name, 0 if unknown. Also SSE-era AMD names count as level 1. */
static int level_of(const char *name) {
    static const char *const old_amd[] = {"Opteron", "Opteron_SSE3", "Barcelona", "Bobcat", "Athlon", "Nano"};
    if (!name) return 0;
    for (int l = 0; l < NUM_LEVELS; l++)
        for (int i = 0; i < 6 && LEVELS[l][i]; i++)
            if (strcasecmp(name, LEVELS[l][i]) == 0) return l + 1;
    for (size_t i = 0; i < sizeof old_amd / sizeof old_amd[0]; i++)
        if (strcasecmp(name, old_amd[i]) == 0) return 1;
    return 0;
}

const char *blas_coretype_below(const char *name) {
    /* the fallback chain of the names blas_coretype_for returns */
    static const char *const chain[][2] = {
        {"Cooperlake", "SkylakeX"}, {"SkylakeX", "Haswell"}, {"Zen", "Sandybridge"},
        {"Haswell", "Sandybridge"}, {"Sandybridge", NULL},
    };
    for (size_t i = 0; name && i < sizeof chain / sizeof chain[0]; i++)
        if (strcasecmp(name, chain[i][0]) == 0) return chain[i][1];
    return NULL;
}

int blas_should_switch(const char *current, const char *best) {
    int cur = level_of(current), want = level_of(best);
    return cur > 0 && want > 0 && cur < want;
}

/* One product op(A)(M,K) @ op(B)(K,N) through llmc_sgemm against double sums, with the
 * standard fp32 bound: |c - ref| <= 8 K eps sum_k |a_ik b_kj| (eps = 2^-24; 8 leaves room for
 * blocked summation orders), plus a tiny absolute floor. */
static int check_product(SgemmFn sgemm, int ta, int tb, int M, int N, int K, char *err, size_t errlen) {
    float *A = (float *)mallocCheck((size_t)M * K * sizeof(float), "BLAS self-check");
    float *B = (float *)mallocCheck((size_t)K * N * sizeof(float), "BLAS self-check");
    float *C = (float *)mallocCheck((size_t)M * N * sizeof(float), "BLAS self-check");
    unsigned s = 12345u;
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    const int lda = ta ? M : K, ldb = tb ? K : N;
    sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
    int ok = 1;
    for (int i = 0; i < M && ok; i++) {
        for (int j = 0; j < N && ok; j++) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                ref += a * b;
                mag += fabs(a * b);
            }
            double tol = 8.0 * K * ldexp(1.0, -24) * mag + 1e-30;
            if (!(fabs(C[(size_t)i * N + j] - ref) <= tol)) {
                snprintf(err, errlen, "sgemm %c%c %dx%dx%d: C[%d][%d] = %.9g, expected %.9g", ta ? 'T' : 'N',
                         tb ? 'T' : 'N', M, N, K, i, j, (double)C[(size_t)i * N + j], ref);
                ok = 0;
            }
        }
    }
    free(A);
    free(B);
    free(C);
    return ok;
}

int blas_self_check_sgemm(SgemmFn sgemm, char *err, size_t errlen) {
    /* the three forms matmul_forward/backward use, at sizes off every kernel's block multiple */
    static const int cases[][5] = {{0, 1, 67, 45, 130}, {0, 0, 33, 129, 70}, {1, 0, 70, 37, 101}, {0, 1, 1, 200, 64}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!check_product(sgemm, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], err, errlen))
            return 0;
    return 1;
}

int blas_self_check(char *err, size_t errlen) { return blas_self_check_sgemm(llmc_sgemm, err, errlen); }

#if LLMC_USE_OPENBLAS
/* Re-executes this program with OPENBLAS_CORETYPE = core (our choice, marked as ours). Returns
 * only if exec failed; the variables are then removed again (they were ours). */
static void reexec_with(char **argv, const char *core, const char *detected) {
    fflush(stdout);
    fflush(stderr);
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("LLMC_BLAS_CORETYPE", core, 1);
    setenv("LLMC_BLAS_DETECTED", detected, 1);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("LLMC_BLAS_CORETYPE");
    unsetenv("LLMC_BLAS_DETECTED");
}
#endif

void blas_choose_kernels(char **argv, char *desc, size_t len) {
#if !LLMC_USE_OPENBLAS
    (void)argv;
    snprintf(desc, len, "%s", llmc_sgemm_backend());
#else
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *ours = getenv("LLMC_BLAS_CORETYPE");
    const char *detected = getenv("LLMC_BLAS_DETECTED");
    const char *core = openblas_get_corename();
    char err[256];
    int ok = blas_self_check(err, sizeof err);
    if (user && !(ours && strcmp(user, ours) == 0)) { /* the user's choice, never changed */
        snprintf(desc, len, "OpenBLAS %s kernels (OPENBLAS_CORETYPE=%s set by the user)", core, user);
        if (!ok) fprintf(stderr, "warning: OpenBLAS %s kernels failed llmc's self-check: %s\n", core, err);
        return;
    }
    if (ours && strcmp(ours, "-") != 0) { /* re-executed with our choice */
        if (ok) {
            snprintf(desc, len, "OpenBLAS %s kernels (chosen by llmc from the CPU's features; OpenBLAS detected %s)",
                     core, detected ? detected : "?");
            return;
        }
        const char *lower = blas_coretype_below(ours);
        fprintf(stderr, "warning: OpenBLAS %s kernels failed llmc's self-check (%s); trying %s\n", core, err,
                lower ? lower : "OpenBLAS's own choice");
        if (lower) reexec_with(argv, lower, detected ? detected : "?");
        fflush(stderr);
        unsetenv("OPENBLAS_CORETYPE");
        setenv("LLMC_BLAS_CORETYPE", "-", 1);
        execv("/proc/self/exe", argv);
        llmc_die("cannot re-execute '%s' to change the OpenBLAS kernels", argv[0]);
    }
    if (!ours) {
        CpuFeatures f = cpu_features_detect();
        const char *best = blas_coretype_for(&f);
        if (best && blas_should_switch(core, best)) reexec_with(argv, best, core);
    }
    snprintf(desc, len, "OpenBLAS %s kernels (OpenBLAS's own choice)", core);
    if (!ok) llmc_die("OpenBLAS %s kernels compute wrong results (%s); set OPENBLAS_CORETYPE to another core type",
                      core, err);
#endif
}
