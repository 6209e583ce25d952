/*
 * test_blas_select.c - choosing OpenBLAS kernels (llmc/cpu/blas_select.h): the choice from CPU
 * features on synthetic feature sets (no dependence on this machine), the fallback chain, when
 * a switch helps, and the self-check on the real library (and that it catches a wrong product).
 */
#include <stdio.h>
#include <string.h>

#include "llmc/cpu/blas_select.h"
#include "llmc/cpu/matmul.h"
#include "test/testing.h"

/* llmc_sgemm with one wrong element: the last row's last column is off by one ulp-scale step */
static void sgemm_off_by_a_bit(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                               int ldb, float beta, float *C, int ldc) {
    llmc_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    C[(size_t)(M - 1) * ldc + N - 1] += 1e-3f;
}

/* llmc_sgemm that ignores the last k (a kernel's missed tail) */
static void sgemm_short_k(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                          int ldb, float beta, float *C, int ldc) {
    llmc_sgemm(ta, tb, M, N, K - 1, alpha, A, lda, B, ldb, beta, C, ldc);
}

static int same(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

int main(void) {
    const CpuFeatures none = {0};
    const CpuFeatures sse = {0};
    const CpuFeatures snb = {.avx = 1};
    const CpuFeatures hsw = {.avx = 1, .avx2 = 1, .fma = 1};
    const CpuFeatures zen = {.avx = 1, .avx2 = 1, .fma = 1, .amd = 1};
    const CpuFeatures skx = {.avx = 1, .avx2 = 1, .fma = 1, .avx512f = 1, .avx512bw = 1, .avx512dq = 1,
                             .avx512vl = 1, .avx512cd = 1};
    CpuFeatures cpx = skx, spr_vm = skx, knl = hsw, zen4 = skx, no_vl = skx;
    cpx.avx512bf16 = 1;
    spr_vm.avx512bf16 = 1; /* the Xeon VM this was found on: AVX-512 with BF16, model hidden */
    knl.avx512f = 1, knl.avx512cd = 1; /* Knights Landing: AVX-512 F/CD without BW/DQ/VL */
    zen4.avx512bf16 = 1, zen4.amd = 1;
    no_vl.avx512vl = 0;
    struct {
        const char *name;
        const CpuFeatures *f;
        const char *want;
    } cases[] = {
        {"no vector features", &none, NULL}, {"SSE only", &sse, NULL}, {"AVX", &snb, "Sandybridge"},
        {"AVX2+FMA (Intel)", &hsw, "Haswell"}, {"AVX2+FMA (AMD)", &zen, "Zen"},
        {"AVX-512 F/CD/BW/DQ/VL", &skx, "SkylakeX"}, {"AVX-512 + BF16", &cpx, "Cooperlake"},
        {"AVX-512 + BF16 (Xeon VM)", &spr_vm, "Cooperlake"}, {"AVX-512 F/CD only (KNL)", &knl, "Haswell"},
        {"AVX-512 + BF16 (AMD Zen 4)", &zen4, "Cooperlake"}, {"AVX-512 without VL", &no_vl, "Haswell"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = blas_coretype_for(cases[i].f);
        char name[128];
        snprintf(name, sizeof name, "coretype for %s is %s", cases[i].name, cases[i].want ? cases[i].want : "none");
        test_report(same(got, cases[i].want), name, "got %s", got ? got : "none");
    }
    test_report(same(blas_coretype_below("Cooperlake"), "SkylakeX") && same(blas_coretype_below("SkylakeX"), "Haswell") &&
                    same(blas_coretype_below("Haswell"), "Sandybridge") && same(blas_coretype_below("Zen"), "Sandybridge") &&
                    same(blas_coretype_below("Sandybridge"), NULL) && same(blas_coretype_below("Bogus"), NULL),
                "fallback chain Cooperlake > SkylakeX > Haswell/Zen > Sandybridge > OpenBLAS's own", "");
    test_report(blas_should_switch("Prescott", "Cooperlake") && blas_should_switch("Haswell", "SkylakeX") &&
                    blas_should_switch("Nehalem", "Sandybridge") && blas_should_switch("Barcelona", "Zen"),
                "switch from a lower kernel family", "");
    test_report(!blas_should_switch("Cooperlake", "Cooperlake") && !blas_should_switch("COOPERLAKE", "Cooperlake") &&
                    !blas_should_switch("SapphireRapids", "Cooperlake") && !blas_should_switch("Zen", "Haswell") &&
                    !blas_should_switch("SomeFutureCore", "SkylakeX") && !blas_should_switch("Prescott", NULL),
                "no switch to the same, a lower or an unknown family", "");

    CpuFeatures here = cpu_features_detect();
    const char *best = blas_coretype_for(&here);
    printf("this CPU: avx %d avx2 %d fma %d avx512 f/bw/dq/vl/cd %d/%d/%d/%d/%d bf16 %d amd %d -> %s\n", here.avx,
           here.avx2, here.fma, here.avx512f, here.avx512bw, here.avx512dq, here.avx512vl, here.avx512cd,
           here.avx512bf16, here.amd, best ? best : "none");
    char err[256] = "";
    test_report(blas_self_check(err, sizeof err), "sgemm self-check passes on this machine's BLAS", "%s", err);
    test_report(blas_self_check_sgemm(llmc_sgemm_fallback, err, sizeof err), "sgemm self-check passes the built-in sgemm",
                "%s", err);
    test_report(!blas_self_check_sgemm(sgemm_off_by_a_bit, err, sizeof err) && strstr(err, "expected"),
                "sgemm self-check catches one element off by 1e-3", "");
    test_report(!blas_self_check_sgemm(sgemm_short_k, err, sizeof err), "sgemm self-check catches a dropped k", "");
    printf("BEST_CORETYPE %s\n", best ? best : "none");
    return test_exit_code();
}
