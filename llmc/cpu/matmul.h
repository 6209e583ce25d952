/* matmul: a linear layer with weights in (out, in) layout.
 * forward:  out = inp @ weight^T + bias            (overwrites out; bias may be NULL)
 * backward: dinp = dout @ weight (overwrites); dweight += dout^T @ inp; dbias += sum_rows(dout)
 *           (the parameter gradients accumulate; dweight, dbias may be NULL: a frozen weight)
 * Shapes: inp, dinp (N, C); weight, dweight (OC, C); bias, dbias (OC); out, dout (N, OC).
 * Matmuls go through llmc_sgemm: OpenBLAS when built with it, else our blocked loop. */
#ifndef LLMC_CPU_MATMUL_H
#define LLMC_CPU_MATMUL_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Row-major C(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) + beta * C, like cblas_sgemm(RowMajor). */
void llmc_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc);
/* The built-in fallback, always compiled so tests can compare it with OpenBLAS. */
void llmc_sgemm_fallback(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc);
const char *llmc_sgemm_backend(void);

/* The memory the sgemm takes for itself at its largest call, for a model whose linear layers are
 * layers[i] = {OC, C} (out, in) applied to N rows: OpenBLAS's packing buffer (the part its level-3
 * driver touches: see matmul.c), or the fallback's packed copies. The plan's blas_packing class. */
size_t matmul_blas_buffer_bytes(size_t N, const size_t (*layers)[2], int num_layers);

void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC);
void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC);
#ifdef __cplusplus
}
#endif
#endif
