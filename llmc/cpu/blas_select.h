/*
 * blas_select.h (CPU) - which OpenBLAS kernels the CPU programs run, chosen from the CPU's
 * features when the user has not chosen.
 *
 * Why: Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernels from the CPU model number. A VM that
 * hides the model (an AVX-512 Xeon reported as "Intel Xeon Processor") gets the Prescott (SSE3)
 * kernels, about 3x slower. OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads, so
 * blas_choose_kernels re-executes the program with OPENBLAS_CORETYPE set to the best kernels the
 * CPU's feature flags allow, checks them against a naive product, and falls back one level at a
 * time if they compute wrong. A user's OPENBLAS_CORETYPE is never changed.
 *
 * Environment markers between the original process and its re-execution (ours, not the
 * user's): LLMC_BLAS_CORETYPE = the value llmc put in OPENBLAS_CORETYPE ("-": llmc gave up
 * choosing; OpenBLAS's own choice stands), LLMC_BLAS_DETECTED = what OpenBLAS had picked itself.
 */
#ifndef LLMC_CPU_BLAS_SELECT_H
#define LLMC_CPU_BLAS_SELECT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU features the choice depends on (as the OS enables them). */
typedef struct {
    int avx, avx2, fma;
    int avx512f, avx512bw, avx512dq, avx512vl, avx512cd, avx512bf16;
    int amd;
} CpuFeatures;

/* The features of this CPU. */
CpuFeatures cpu_features_detect(void);

/* The best OpenBLAS core type for these features: Cooperlake (AVX-512 F/CD/BW/DQ/VL + BF16),
 * SkylakeX (AVX-512 F/CD/BW/DQ/VL), Zen (AMD, AVX2 + FMA), Haswell (AVX2 + FMA), Sandybridge
 * (AVX); NULL when none applies (OpenBLAS's own choice stands). */
const char *blas_coretype_for(const CpuFeatures *f);

/* The next lower core type to try when `name`'s kernels fail the self-check, or NULL. */
const char *blas_coretype_below(const char *name);

/* 1 if OpenBLAS's current core `current` is a lower kernel family than `best`, so that switching
 * to `best` helps; 0 if it is the same, higher, or unknown (then it is left alone). Names are
 * compared without regard to case. */
int blas_should_switch(const char *current, const char *best);

/* Runs a few sgemm products (the shapes and transposes the CPU matmul uses, with edge-case
 * sizes) against a double-precision naive product. Returns 1 if all agree within the fp32
 * rounding bound; otherwise 0, with what differed in err. Without OpenBLAS: 1. */
int blas_self_check(char *err, size_t errlen);
/* The same check of any sgemm with llmc_sgemm's contract (tests pass a wrong one). */
typedef void (*SgemmFn)(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc);
int blas_self_check_sgemm(SgemmFn sgemm, char *err, size_t errlen);

/* Call first in main(), before any output: may re-execute the program (see above). Writes a
 * one-line account of the kernels in use and why into desc, e.g.
 * "OpenBLAS Cooperlake kernels (chosen by llmc from the CPU's features; OpenBLAS detected Prescott)". */
void blas_choose_kernels(char **argv, char *desc, size_t len);

#ifdef __cplusplus
}
#endif
#endif
