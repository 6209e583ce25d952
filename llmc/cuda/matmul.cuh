/*
 * matmul.cuh - linear layers on cuBLASLt (CUDA twin of llmc/cpu/matmul.h), weights in (out, in)
 * layout, all matrices row-major in memory.
 *
 * forward:  out = inp @ weight^T + bias                        (overwrites; bias may be NULL)
 * forward_gelu: pre_gelu = inp @ weight^T + bias; out = gelu(pre_gelu)   (cuBLASLt GELU_AUX_BIAS)
 * backward: dinp = dout @ weight                               (overwrites)
 *           dweight += dout^T @ inp;  dbias += sum_rows(dout)  (accumulate; dbias may be NULL)
 * backward_dgelu: as backward, but dinp = (dout @ weight) * gelu'(pre_gelu), pre_gelu being
 *           the pre-activation whose GELU was this layer's input (cuBLASLt DGELU epilogue);
 *           this replaces matmul_backward + gelu_backward of the layer below.
 * Shapes: inp, dinp (N, C); weight, dweight (OC, C); bias, dbias (OC); out, dout (N, OC);
 *         pre_gelu (N, OC) for forward_gelu, (N, C) for backward_dgelu.
 *
 * Precision: T in {float, bf16, fp16} for A, B, C, D and bias; accumulation and scaling are
 * always fp32 (CUBLAS_COMPUTE_32F), TF32 only when ctx->allow_tf32 and T is float.
 * cuBLASLt's GELU is the same tanh approximation as gelu.cuh but not bit-identical to it.
 * The bias gradient: in bf16/fp16 from the dweight product's epilogue (CUBLASLT_EPILOGUE_BGRADB:
 * cuBLASLt sums dout's rows while it reads them for dweight, into OC values of T at the start of
 * `scratch`, which one small kernel adds to dbias: dout is not read a second time); in fp32 (the
 * tight reference) our own deterministic column sum: fixed chunks of MM_ROWS_PER_CHUNK rows into
 * `scratch` (matmul_backward_scratch_floats(N, OC) floats), then an ordered sum.
 *
 * cuBLASLt is column-major: a row-major (R, K) matrix is a column-major (K, R) one, so
 * out^T (OC, N) = weight^T-as-stored (C, OC)^T @ inp^T (C, N), i.e. m = OC, n = N, k = C.
 */
#ifndef LLMC_CUDA_MATMUL_CUH
#define LLMC_CUDA_MATMUL_CUH

#include "llmc/cuda/common.cuh"
#include "llmc/cuda/lt_plans.cuh"

enum { MM_ROWS_PER_CHUNK = 256 };

/* The largest power of two (<= 256) that divides the address: what cuBLASLt's heuristic may assume. */
inline uint32_t lt_pointer_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && (a % align) != 0) align >>= 1;
    return align;
}

/* D (m, n, ld ldd) = op(A) @ op(B) + beta * D, column-major, with an epilogue, through the
 * shape's plan (lt_plans.cuh: descriptors built and the algorithm chosen on the shape's first call).
 * aux: the GELU pre-activation (m, n, ld ldaux) for GELU_AUX* and DGELU* epilogues. */
inline void lt_matmul(const CudaContext *ctx, cudaDataType_t type, int transa, int transb, int m, int n, int k,
                      const void *A, int lda, const void *B, int ldb, void *D, int ldd, float beta,
                      cublasLtEpilogue_t epilogue, const void *bias, void *aux, int ldaux) {
    /* filling the plan cache does not change what the context means: it stays const to callers */
    CudaContext *mctx = const_cast<CudaContext *>(ctx);
    LtKey key;
    memset(&key, 0, sizeof key);
    key.type = (int)type;
    key.compute = (int)(type == CUDA_R_32F && ctx->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
    key.transa = transa, key.transb = transb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.epilogue = (int)epilogue;
    key.has_bias = bias != NULL, key.ldaux = aux ? ldaux : 0;
    key.align_a = (int)lt_pointer_alignment(A), key.align_b = (int)lt_pointer_alignment(B);
    key.align_d = (int)lt_pointer_alignment(D);
    LtArgs x = {A, B, bias, D, aux, beta};
    LtPlan *p = lt_plan_for(mctx, &key, &x);
    cublasCheck(lt_run(ctx, p, &p->algo, &x));
}

/* Partial column sums of dout (N, OC) over chunks of rows: block (32, 8), grid (ceil(OC/32), chunks). */
template <class T>
static __global__ void bias_grad_partial_kernel(float *partial, const T *dout, int N, int OC) {
    __shared__ float s[8][33];
    int o = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    int r0 = chunk * MM_ROWS_PER_CHUNK, r1 = min(r0 + (int)MM_ROWS_PER_CHUNK, N);
    float acc = 0.0f;
    if (o < OC)
        for (int i = r0 + (int)threadIdx.y; i < r1; i += 8) acc += to_float(dout[(size_t)i * OC + o]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < OC) {
        float sum = 0.0f;
        for (int k = 0; k < 8; k++) sum += s[k][threadIdx.x];
        partial[(size_t)chunk * OC + o] = sum;
    }
}

template <class T>
static __global__ void bias_grad_finish_kernel(T *dbias, const float *partial, int chunks, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float sum = 0.0f;
    for (int k = 0; k < chunks; k++) sum += partial[(size_t)k * OC + o];
    dbias[o] = from_float<T>(to_float(dbias[o]) + sum);
}

/* dbias += bgrad (OC values of T, from the BGRADB epilogue). */
template <class T>
static __global__ void bias_grad_add_kernel(T *dbias, const T *bgrad, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o < OC) dbias[o] = from_float<T>(to_float(dbias[o]) + to_float(bgrad[o]));
}

inline size_t matmul_backward_scratch_floats(int N, int OC) { return (size_t)ceil_div(N, MM_ROWS_PER_CHUNK) * OC; }

static inline void matmul_check_sizes(const char *what, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) llmc_check_failed(what, "N, C and OC must be positive", "HINT: a caller bug", __func__, __FILE__, __LINE__);
}

template <class T>
void matmul_forward(T *out, const T *inp, const T *weight, const T *bias, int N, int C, int OC, const CudaContext *ctx) {
    matmul_check_sizes("matmul_forward", N, C, OC);
    lt_matmul(ctx, StorageInfo<T>::cuda_type, 1, 0, OC, N, C, weight, C, inp, C, out, OC, 0.0f,
              bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, 0);
}

template <class T>
void matmul_forward_gelu(T *out, T *pre_gelu, const T *inp, const T *weight, const T *bias, int N, int C, int OC,
                         const CudaContext *ctx) {
    matmul_check_sizes("matmul_forward_gelu", N, C, OC);
    llmcCheck(OC % 8 == 0 && bias != NULL, "matmul_forward_gelu: the GELU epilogue needs OC % 8 == 0 and a bias");
    lt_matmul(ctx, StorageInfo<T>::cuda_type, 1, 0, OC, N, C, weight, C, inp, C, out, OC, 0.0f,
              CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_gelu, OC);
}

template <class T>
static void matmul_backward_impl(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight,
                                 const T *pre_gelu, int N, int C, int OC, float *scratch, const CudaContext *ctx) {
    const cudaDataType_t type = StorageInfo<T>::cuda_type;
    /* dinp (C, N col-major) = weight-as-stored (C, OC) @ dout (OC, N) [* gelu'(pre_gelu)] */
    lt_matmul(ctx, type, 0, 0, C, N, OC, weight, C, dout, OC, dinp, C, 0.0f,
              pre_gelu ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, NULL, (void *)pre_gelu, C);
    /* dweight (C, OC col-major) += inp (C, N) @ dout^T (N, OC); in 16-bit, with the bias
     * gradient, sum over N of dout^T's rows (the product's k dimension), from the epilogue */
    if (dbias && sizeof(T) == 2) {
        T *bgrad = (T *)scratch; /* OC values of T fit in the OC floats of scratch */
        lt_matmul(ctx, type, 0, 1, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f, CUBLASLT_EPILOGUE_BGRADB, bgrad, NULL, 0);
        bias_grad_add_kernel<<<ceil_div(OC, 256), 256, 0, ctx->stream>>>(dbias, bgrad, OC);
        kernelCheck();
        return;
    }
    lt_matmul(ctx, type, 0, 1, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0);
    if (!dbias) return;
    int chunks = ceil_div(N, MM_ROWS_PER_CHUNK);
    /* the chunks are grid.y, which a GPU caps at 65535 (N up to 16.7M rows) */
    llmcCheck(chunks <= 65535, "matmul_backward: N / MM_ROWS_PER_CHUNK exceeds the 65535 grid rows");
    bias_grad_partial_kernel<<<dim3(ceil_div(OC, 32), chunks), dim3(32, 8), 0, ctx->stream>>>(scratch, dout, N, OC);
    kernelCheck();
    bias_grad_finish_kernel<<<ceil_div(OC, 256), 256, 0, ctx->stream>>>(dbias, scratch, chunks, OC);
    kernelCheck();
}

/* scratch: matmul_backward_scratch_floats(N, OC) floats when dbias != NULL (else unused). */
template <class T>
void matmul_backward(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight, int N, int C, int OC,
                     float *scratch, const CudaContext *ctx) {
    matmul_check_sizes("matmul_backward", N, C, OC);
    llmcCheck(dbias == NULL || scratch != NULL, "matmul_backward: the bias gradient needs scratch");
    matmul_backward_impl(dinp, dweight, dbias, dout, inp, weight, (const T *)NULL, N, C, OC, scratch, ctx);
}

template <class T>
void matmul_backward_dgelu(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight,
                           const T *pre_gelu, int N, int C, int OC, float *scratch, const CudaContext *ctx) {
    matmul_check_sizes("matmul_backward_dgelu", N, C, OC);
    llmcCheck(C % 8 == 0 && pre_gelu != NULL, "matmul_backward_dgelu: the DGELU epilogue needs C % 8 == 0");
    llmcCheck(dbias == NULL || scratch != NULL, "matmul_backward_dgelu: the bias gradient needs scratch");
    matmul_backward_impl(dinp, dweight, dbias, dout, inp, weight, pre_gelu, N, C, OC, scratch, ctx);
}

#endif
