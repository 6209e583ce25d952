#include "llmc/cpu/matmul.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "llmc/core/check.h"

#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

/* Copies op(X) (rows x cols, row-major) into a dense buffer. */
static float *pack(int trans, int rows, int cols, const float *X, int ld) {
    float *p = (float *)mallocCheck((size_t)rows * cols * sizeof(float), "sgemm packing");
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) p[(size_t)r * cols + c] = trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
    return p;
}

void llmc_sgemm_fallback(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    float *a = pack(trans_a, M, K, A, lda); /* (M, K) */
    float *b = pack(trans_b, K, N, B, ldb); /* (K, N) */
    enum { KB = 256, NB = 512 };
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        float acc[NB];
        for (int j0 = 0; j0 < N; j0 += NB) {
            int nj = N - j0 < NB ? N - j0 : NB;
            for (int j = 0; j < nj; j++) acc[j] = 0.0f;
            for (int k0 = 0; k0 < K; k0 += KB) {
                int k1 = k0 + KB < K ? k0 + KB : K;
                for (int k = k0; k < k1; k++) {
                    float aik = a[(size_t)i * K + k];
                    const float *bk = b + (size_t)k * N + j0;
                    for (int j = 0; j < nj; j++) acc[j] += aik * bk[j];
                }
            }
            for (int j = 0; j < nj; j++)
                c[j0 + j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * c[j0 + j]);
        }
    }
    free(a);
    free(b);
}

void llmc_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc) {
#if LLMC_USE_OPENBLAS
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    llmc_sgemm_fallback(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

const char *llmc_sgemm_backend(void) { return LLMC_USE_OPENBLAS ? "OpenBLAS" : "built-in blocked sgemm"; }

/* ---- the sgemm's own memory, for the plan ------------------------------------------------- */
#if LLMC_USE_OPENBLAS
/* OpenBLAS (0.3.x) packs, for C(M,N) += op(A)(M,K) op(B)(K,N) (row-major), a panel of op(A)'s
 * rows, K' x M floats, into a buffer it mapped at start-up (only the pages it touches count):
 * K' = K up to its block depth Q, K/2 (rounded up to 8) below 2Q, else Q. Its one-thread driver
 * packs a K' x N block instead when N is at most a family's bound. Each thread also holds a
 * block of op(B): the first about first_kib, every other about more_kib. Measured with OpenBLAS
 * 0.3.21 on this project's machine (VmRSS around sgemm calls of growing M, N, K and thread
 * counts, each family forced with OPENBLAS_CORETYPE); an unlisted family is priced at the most. */
typedef struct {
    const char *core;
    size_t q, one_thread_n, first_kib, more_kib;
} BlasFamily;
static const BlasFamily BLAS_FAMILIES[] = {
    {"Haswell", 320, 320, 528, 385},    {"Zen", 320, 320, 528, 385},         {"SkylakeX", 448, 448, 1040, 495},
    {"Cooperlake", 320, 640, 992, 367}, {"Sandybridge", 384, 768, 1272, 412},
};
static const BlasFamily BLAS_UNLISTED = {"", 448, 320, 1272, 495};

static const BlasFamily *blas_family(void) {
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof BLAS_FAMILIES / sizeof BLAS_FAMILIES[0]; i++)
        if (strcasecmp(core, BLAS_FAMILIES[i].core) == 0) return &BLAS_FAMILIES[i];
    return &BLAS_UNLISTED;
}

static size_t blas_call_bytes(size_t M, size_t N, size_t K, const BlasFamily *f, int threads) {
    const size_t Q = f->q, k = K >= 2 * Q ? Q : K > Q ? (K / 2 + 7) / 8 * 8 : K;
    return k * (threads == 1 && N <= f->one_thread_n ? N : M) * sizeof(float);
}

size_t matmul_blas_buffer_bytes(size_t N, const size_t (*layers)[2], int num_layers) {
    const BlasFamily *f = blas_family();
    const int threads = openblas_get_num_threads();
    size_t most = 0;
    for (int i = 0; i < num_layers; i++) {
        size_t OC = layers[i][0], C = layers[i][1];
        size_t calls[3][3] = {{N, OC, C}, {N, C, OC}, {OC, C, N}}; /* forward, dinp, dweight (M, N, K) */
        for (int j = 0; j < 3; j++) {
            size_t b = blas_call_bytes(calls[j][0], calls[j][1], calls[j][2], f, threads);
            if (b > most) most = b;
        }
    }
    return most + (f->first_kib + (size_t)(threads > 1 ? threads - 1 : 0) * f->more_kib) * 1024;
}
#else
size_t matmul_blas_buffer_bytes(size_t N, const size_t (*layers)[2], int num_layers) {
    size_t most = 0; /* llmc_sgemm_fallback packs op(A) (M,K) and op(B) (K,N) */
    for (int i = 0; i < num_layers; i++) {
        size_t OC = layers[i][0], C = layers[i][1];
        size_t calls[3][3] = {{N, OC, C}, {N, C, OC}, {OC, C, N}};
        for (int j = 0; j < 3; j++) {
            size_t b = (calls[j][0] * calls[j][2] + calls[j][2] * calls[j][1]) * sizeof(float);
            if (b > most) most = b;
        }
    }
    return most;
}
#endif

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC) {
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
    }
    llmc_sgemm(0, 1, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    llmc_sgemm(0, 0, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);   /* (N,OC) @ (OC,C) */
    if (dweight) llmc_sgemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C); /* (OC,N) @ (N,C) */
    if (!dbias) return;
    /* Each thread owns a block of output channels and sums rows in order: deterministic. */
    enum { OB = 64 };
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < OC; o0 += OB) {
        int o1 = o0 + OB < OC ? o0 + OB : OC;
        float acc[OB] = {0};
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * OC;
            for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
        }
        for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
}
