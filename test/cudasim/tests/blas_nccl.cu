// blas_nccl.cu - cudasim self-test: the cuBLASLt / cuBLAS emulation against small products
// worked out by hand from the documented semantics (column-major, op(A) m x k, op(B) k x n,
// D = epilogue(alpha*op(A)op(B) + beta*C)), and single-rank NCCL collectives.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include "test/testing.h"

static cublasLtHandle_t lt;

static float* dev(const float* h, int n) {
    float* d;
    cudaMalloc(&d, n * sizeof(float));
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}
static void host(float* h, const float* d, int n) { cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost); }

// GELU (tanh form) and its derivative, from their textbook definitions
static float gelu_ref(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); }
static float gelu_grad_ref(float x) {
    float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 3.0f * 0.044715f * x * x);
}

struct LtCall {
    int m, n, k, ta, tb, lda, ldb, ldd;
    cudaDataType_t ab_type, d_type;
    cublasLtEpilogue_t epi;
    void *bias, *aux;
    int aux_ld, batch;
    long long sa, sb, sd;
};

static void lt_matmul(const LtCall& c, const void* A, const void* B, void* D, float alpha, float beta) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi);
    if (c.bias) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof c.bias);
    if (c.aux) {
        int64_t ld = c.aux_ld;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof c.aux);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatrixLayoutCreate(&la, c.ab_type, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.lda);
    cublasLtMatrixLayoutCreate(&lb, c.ab_type, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.ldb);
    cublasLtMatrixLayoutCreate(&lc, c.d_type, c.m, c.n, c.ldd);
    cublasLtMatrixLayoutCreate(&ld, c.d_type, c.m, c.n, c.ldd);
    if (c.batch > 1) {
        int32_t b = c.batch;
        int64_t strides[3] = {c.sa, c.sb, c.sd};
        cublasLtMatrixLayout_t ls[4] = {la, lb, lc, ld};
        for (int i = 0; i < 4; i++) {
            cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b);
            cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i < 3 ? i : 2], sizeof(int64_t));
        }
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = 1 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t heur;
    int got = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &heur, &got);
    cublasStatus_t st = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, lc, D, ld, &heur.algo, nullptr, 0, 0);
    if (st != CUBLAS_STATUS_SUCCESS || got != 1) printf("FAIL: cublasLtMatmul status %d, %d algos\n", (int)st, got);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
}

static LtCall base(int m, int n, int k) {
    LtCall c = {m, n, k, 0, 0, m, k, m, CUDA_R_32F, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, 1, 0, 0, 0};
    return c;
}

int main(void) {
    cublasLtCreate(&lt);
    // A = [[1,2,3],[4,5,6]] (2x3), B = [[7,8],[9,10],[11,12]] (3x2): AB = [[58,64],[139,154]]
    const float A[6] = {1, 4, 2, 5, 3, 6}, B[6] = {7, 9, 11, 8, 10, 12};
    {
        float *dA = dev(A, 6), *dB = dev(B, 6), z[4] = {0, 0, 0, 0}, *dD = dev(z, 4), got[4];
        lt_matmul(base(2, 2, 3), dA, dB, dD, 1.0f, 0.0f);
        host(got, dD, 4);
        const float want[4] = {58, 139, 64, 154};
        test_close("cublasLt: 2x3 by 3x2, NN", got, want, 4, 0, 0);
    }
    {   // same product from transposed storage, ld > rows, alpha 2, beta 0.5 with C aliasing D
        const float At[8] = {1, 2, 3, -99, 4, 5, 6, -99};  // A^T (3x2), lda 4
        const float Bt[9] = {7, 8, -99, 9, 10, -99, 11, 12, -99};  // B^T (2x3), ldb 3
        const float C[6] = {1, 2, -7, 3, 4, -7};  // ldd 3; row 2 is padding that must stay -7
        float *dA = dev(At, 8), *dB = dev(Bt, 9), *dD = dev(C, 6), got[6];
        LtCall c = base(2, 2, 3);
        c.ta = c.tb = 1, c.lda = 4, c.ldb = 3, c.ldd = 3;
        lt_matmul(c, dA, dB, dD, 2.0f, 0.5f);
        host(got, dD, 6);
        const float want[6] = {116.5f, 279, -7, 129.5f, 310, -7};
        test_close("cublasLt: TT, lda/ldb/ldd > rows, alpha 2, beta 0.5, C aliases D", got, want, 6, 0, 0);
    }
    {   // GELU_AUX_BIAS: pre = AB + bias (bias over rows), aux = pre (ld 8), D = gelu(pre)
        const float a[2] = {1, -1}, b[2] = {0.5f, 2}, bias[2] = {0.5f, 1};
        float z[16], *dA = dev(a, 2), *dB = dev(b, 2), *dBias = dev(bias, 2), *dD = dev(z, 4), *dAux;
        for (int i = 0; i < 16; i++) z[i] = -5;
        dAux = dev(z, 16);
        LtCall c = base(2, 2, 1);
        c.epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS, c.bias = dBias, c.aux = dAux, c.aux_ld = 8;
        lt_matmul(c, dA, dB, dD, 1.0f, 0.0f);
        float got[4], aux[16];
        host(got, dD, 4);
        host(aux, dAux, 16);
        const float pre[4] = {1.0f, 0.5f, 2.5f, -1.0f};
        float want[4], want_aux[16];
        for (int i = 0; i < 4; i++) want[i] = gelu_ref(pre[i]);
        for (int i = 0; i < 16; i++) want_aux[i] = -5;
        want_aux[0] = 1.0f, want_aux[1] = 0.5f, want_aux[8] = 2.5f, want_aux[9] = -1.0f;
        test_close("cublasLt: GELU_AUX_BIAS output", got, want, 4, 1e-6, 1e-6);
        test_close("cublasLt: GELU_AUX_BIAS aux holds the pre-GELU values at ld 8", aux, want_aux, 16, 0, 0);
        // same call with GELU_BIAS and BIAS only
        c.epi = CUBLASLT_EPILOGUE_GELU_BIAS, c.aux = nullptr;
        lt_matmul(c, dA, dB, dD, 1.0f, 0.0f);
        host(got, dD, 4);
        test_close("cublasLt: GELU_BIAS", got, want, 4, 1e-6, 1e-6);
        c.epi = CUBLASLT_EPILOGUE_BIAS;
        lt_matmul(c, dA, dB, dD, 1.0f, 0.0f);
        host(got, dD, 4);
        test_close("cublasLt: BIAS broadcast over columns", got, pre, 4, 0, 0);
    }
    {   // BIAS with bf16 A/B/D: 1 + 3/256 rounds (RNE) to 1 + 4/256 in bf16, 2 + 3/256 to 2 + 4/256
        __nv_bfloat16 a[2] = {__float2bfloat16(1.0f), __float2bfloat16(1.0f)};
        __nv_bfloat16 b[3] = {__float2bfloat16(1.0f), __float2bfloat16(2.0f), __float2bfloat16(3.0f)};
        __nv_bfloat16 bias[2] = {__float2bfloat16(3.0f / 256), __float2bfloat16(0.0f)};
        __nv_bfloat16 *dA, *dB, *dBias, *dD;
        cudaMalloc(&dA, sizeof a), cudaMalloc(&dB, sizeof b), cudaMalloc(&dBias, sizeof bias), cudaMalloc(&dD, 6 * 2);
        cudaMemcpy(dA, a, sizeof a, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, b, sizeof b, cudaMemcpyHostToDevice);
        cudaMemcpy(dBias, bias, sizeof bias, cudaMemcpyHostToDevice);
        LtCall c = base(2, 3, 1);
        c.ab_type = c.d_type = CUDA_R_16BF, c.epi = CUBLASLT_EPILOGUE_BIAS, c.bias = dBias;
        lt_matmul(c, dA, dB, dD, 1.0f, 0.0f);
        __nv_bfloat16 d[6];
        cudaMemcpy(d, dD, sizeof d, cudaMemcpyDeviceToHost);
        float got[6], want[6] = {1.015625f, 1, 2.015625f, 2, 3.015625f, 3};
        for (int i = 0; i < 6; i++) got[i] = __bfloat162float(d[i]);
        test_close("cublasLt: bf16 in/out with bf16 bias, RNE rounding of D", got, want, 6, 0, 0);
    }
    {   // DGELU: D = AB * gelu'(aux); DGELU_BGRAD also bias[i] = sum_j D[i][j]
        const float a[1] = {2}, b[2] = {1, -1};
        float auxh[16] = {0.5f, 0, 0, 0, 0, 0, 0, 0, 1.5f}, z[2] = {0, 0};
        float *dA = dev(a, 1), *dB = dev(b, 2), *dAux = dev(auxh, 16), *dD = dev(z, 2), got[2];
        LtCall c = base(1, 2, 1);
        c.epi = CUBLASLT_EPILOGUE_DGELU, c.aux = dAux, c.aux_ld = 8;
        lt_matmul(c, dA, dB, dD, 1.0f, 0.0f);
        host(got, dD, 2);
        float want[2] = {2.0f * gelu_grad_ref(0.5f), -2.0f * gelu_grad_ref(1.5f)};
        test_close("cublasLt: DGELU", got, want, 2, 1e-6, 1e-6);

        const float a2[2] = {1, -1}, b2[2] = {0.5f, 2}, zero16[16] = {0};
        float *dA2 = dev(a2, 2), *dB2 = dev(b2, 2), *dAux2 = dev(zero16, 16), *dD2 = dev(zero16, 4), *dBias = dev(zero16, 2);
        LtCall c2 = base(2, 2, 1);
        c2.epi = CUBLASLT_EPILOGUE_DGELU_BGRAD, c2.aux = dAux2, c2.aux_ld = 8, c2.bias = dBias;
        lt_matmul(c2, dA2, dB2, dD2, 1.0f, 0.0f);
        float d[4], bg[2];
        host(d, dD2, 4);
        host(bg, dBias, 2);
        const float want_d[4] = {0.25f, -0.25f, 1.0f, -1.0f}, want_bg[2] = {1.25f, -1.25f};  // gelu'(0) = 0.5
        test_close("cublasLt: DGELU_BGRAD output", d, want_d, 4, 0, 0);
        test_close("cublasLt: DGELU_BGRAD bias gradient = row sums of D (length m)", bg, want_bg, 2, 0, 0);
    }
    {   // BGRADB: bias[j] = sum over k of op(B)[l][j] (length n); BGRADA: bias[i] = sum over k of op(A)[i][l]
        const float I2[4] = {1, 0, 0, 1}, Bm[6] = {1, 4, 2, 5, 3, 6}, Am[4] = {1, 3, 2, 4}, z[6] = {0};
        float *dI = dev(I2, 4), *dB = dev(Bm, 6), *dA = dev(Am, 4), *dD = dev(z, 6), *dBias = dev(z, 3), got[6], bg[3];
        LtCall c = base(2, 3, 2);
        c.epi = CUBLASLT_EPILOGUE_BGRADB, c.bias = dBias;
        lt_matmul(c, dI, dB, dD, 1.0f, 0.0f);
        host(got, dD, 6);
        host(bg, dBias, 3);
        const float want_bg[3] = {5, 7, 9};
        test_close("cublasLt: BGRADB output D = I*B", got, Bm, 6, 0, 0);
        test_close("cublasLt: BGRADB bias = column sums of B over k (length n)", bg, want_bg, 3, 0, 0);
        LtCall c2 = base(2, 2, 2);
        c2.epi = CUBLASLT_EPILOGUE_BGRADA, c2.bias = dBias;
        lt_matmul(c2, dA, dI, dD, 1.0f, 0.0f);
        host(bg, dBias, 2);
        const float want_a[2] = {3, 7};
        test_close("cublasLt: BGRADA bias = row sums of A over k (length m)", bg, want_a, 2, 0, 0);
    }
    {   // batched: [1 2]·[3 4]^T = 11 and [5 6]·[7 8]^T = 83
        const float a[4] = {1, 2, 5, 6}, b[4] = {3, 4, 7, 8}, z[2] = {0, 0};
        float *dA = dev(a, 4), *dB = dev(b, 4), *dD = dev(z, 2), got[2];
        LtCall c = base(1, 1, 2);
        c.batch = 2, c.sa = 2, c.sb = 2, c.sd = 1;
        lt_matmul(c, dA, dB, dD, 1.0f, 0.0f);
        host(got, dD, 2);
        const float want[2] = {11, 83};
        test_close("cublasLt: strided batch of 2", got, want, 2, 0, 0);
        cublasHandle_t h;
        cublasCreate(&h);
        cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);
        float one = 1.0f, zero = 0.0f, half = 0.5f;
        cudaMemcpy(dD, z, sizeof z, cudaMemcpyHostToDevice);
        cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &one, dA, 1, 2, dB, 2, 2, &zero, dD, 1, 1, 2);
        host(got, dD, 2);
        test_close("cublas: SgemmStridedBatched", got, want, 2, 0, 0);
        cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &half, dA, CUDA_R_32F, 1, 2, dB, CUDA_R_32F, 2, 2, &one, dD,
                                   CUDA_R_32F, 1, 1, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        host(got, dD, 2);
        const float want2[2] = {16.5f, 124.5f};
        test_close("cublas: GemmStridedBatchedEx alpha 0.5 beta 1", got, want2, 2, 0, 0);
        float *dA6 = dev(A, 6), *dB6 = dev(B, 6), *dC = dev(z, 2), c4[4];
        float* dC4;
        cudaMalloc(&dC4, 16);
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, dA6, 2, dB6, 3, &zero, dC4, 2);
        host(c4, dC4, 4);
        const float want4[4] = {58, 139, 64, 154};
        test_close("cublas: Sgemm 2x3 by 3x2", c4, want4, 4, 0, 0);
        (void)dC;
        cublasDestroy(h);
    }
    {   // NCCL with one rank: every collective is a copy
        ncclUniqueId id;
        ncclComm_t comm;
        ncclGetUniqueId(&id);
        ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
        const float x[4] = {1, 2, 3, 4}, z[4] = {0};
        float *send = dev(x, 4), *recv = dev(z, 4), got[4];
        ncclGroupStart();
        ncclAllReduce(send, recv, 4, ncclFloat, ncclSum, comm, 0);
        ncclGroupEnd();
        host(got, recv, 4);
        test_close("nccl: single-rank AllReduce", got, x, 4, 0, 0);
        cudaMemset(recv, 0, 16);
        ncclAllGather(send, recv, 4, ncclFloat, comm, 0);
        ncclReduceScatter(send, recv, 4, ncclFloat, ncclAvg, comm, 0);
        host(got, recv, 4);
        test_close("nccl: single-rank AllGather / ReduceScatter", got, x, 4, 0, 0);
        ncclComm_t c2;
        test_report(r == ncclSuccess && ncclCommInitRank(&c2, 2, id, 2) == ncclInvalidArgument && ncclCommDestroy(comm) == ncclSuccess,
                    "nccl: init, rank outside 0..nranks-1 refused, destroy", "%s", ncclGetErrorString(r));
    }
    cublasLtDestroy(lt);
    return test_exit_code();
}
