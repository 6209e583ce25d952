/*
 * blas.cpp - cuBLAS / cuBLASLt for cudasim: a reference GEMM behind NVIDIA's real declarations.
 *
 * Every product is  D = epilogue(alpha * op(A) op(B) + beta * C)  in column-major storage:
 * op(A) is m x k, op(B) is k x n, C and D are m x n; element (i, j) of a matrix with leading
 * dimension ld is at [i + j * ld] (+ batch * stride). Products are accumulated in double, the
 * result rounded once to fp32 (what an fp32-accumulating kernel would hold), the epilogue is
 * applied in fp32, then the value is rounded (round-to-nearest-even) to the output type. When
 * beta == 0, C is not read (BLAS convention: NaN in C does not propagate). C may alias D.
 *
 * Epilogues (cuBLASLt documentation semantics):
 *   BIAS        D = alpha*AB + beta*C + bias[i]          bias: length m (rows of D), broadcast
 *                                                        over columns
 *   GELU(_BIAS) D = gelu(... [+ bias[i]])                 gelu: tanh approximation
 *   GELU_AUX(_BIAS)  additionally aux[i + j*aux_ld] = the GELU input (pre-activation)
 *   DGELU       D = (alpha*AB + beta*C) * gelu'(aux[i + j*aux_ld])
 *   DGELU_BGRAD as DGELU, and bias[i] = sum over j of D[i, j] (length m)
 *   BGRADA      bias[i] = sum over the k dimension of op(A)[i, l]   (length m)
 *   BGRADB      bias[j] = sum over the k dimension of op(B)[l, j]   (length n)
 * Bias gradients are unscaled sums (alpha does not apply), accumulated in double.
 * Data types: CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F for A/B/C/D/bias/aux; scale type fp32;
 * compute types CUBLAS_COMPUTE_32F (+ _FAST_TF32, _FAST_16BF, _FAST_16F accepted as fp32).
 * Anything else prints what is unsupported and exits with CUDASIM_ERROR_EXIT.
 *
 * Algorithms: every algorithm computes the same product. The heuristic returns
 * min(requested, $CUDASIM_LT_ALGOS) candidates (default 1); candidate i has CONFIG_ID i (data[0])
 * and a marker in data[1], so cublasLtMatmulAlgoCheck and cublasLtMatmul refuse an algorithm that
 * no heuristic of this library returned (as a stale cache file's would be). $CUDASIM_LT_SLOW_ALGO=i
 * makes candidate i sleep 20 ms per call: the tuning test's slow candidate.
 */
#include "cudasim.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdarg>
#include <cstdlib>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

[[noreturn]] __attribute__((format(printf, 1, 2))) void unsupported(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "cudasim cuBLAS ERROR: unsupported: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n  HINT: extend test/cudasim/blas.cpp if the project needs this.\n");
    va_end(ap);
    _exit(CUDASIM_ERROR_EXIT);
}

size_t type_size(int t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: case CUDA_R_16F: return 2;
    default: unsupported("data type %d (only CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F)", t);
    }
}

float load(int t, const void *p, int64_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return __half2float(((const __half *)p)[i]);
    }
}

void store(int t, void *p, int64_t i, float v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = v; break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v); break;
    default: ((__half *)p)[i] = __float2half(v); break;
    }
}

const float kSqrt2OverPi = 0.7978845608028654f;
float gelu(float x) {
    float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
float gelu_grad(float x) {
    float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

struct Operand {
    const void *p;
    int type;
    int64_t ld, stride;
};

/* What the epilogue does, decoded from cublasLtEpilogue_t. */
struct Epilogue {
    bool bias = false, gelu = false, aux_out = false, dgelu = false, bgrad_d = false;
    bool bgrad_a = false, bgrad_b = false;
    void *bias_ptr = nullptr;
    int bias_type = -1;
    void *aux = nullptr;
    int aux_type = -1;
    int64_t aux_ld = 0;
};

/* op(X) as `rows` contiguous rows of k doubles (exact: every supported type widens exactly):
 * element (r, l) of op(X) is at off + r * rs + l * ls. */
std::vector<double> pack_rows(const Operand &X, int64_t off, int64_t rows, int64_t k, int64_t rs, int64_t ls) {
    std::vector<double> out((size_t)(rows * k));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t l = 0; l < k; l++) out[(size_t)(r * k + l)] = load(X.type, X.p, off + r * rs + l * ls);
    return out;
}

/* The reference GEMM shared by every entry point. Each element's products are summed in
 * double in the order l = 0, 1, ..., k-1 (one accumulator per element, so the result does not
 * depend on the blocking below, which only interleaves independent elements and splits rows of
 * D over threads; the bias gradient of D sums each row's elements in column order). */
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, Operand A, Operand B,
          float beta, Operand C, void *D, int d_type, int64_t ldd, int64_t d_stride, int batch,
          const Epilogue &ep) {
    std::vector<double> bgrad;
    for (int b = 0; b < batch; b++) {
        const void *c = C.p;
        int64_t ao = b * A.stride, bo = b * B.stride, co = b * C.stride, dof = b * d_stride;
        if (ep.bgrad_a || ep.bgrad_d) bgrad.assign(m, 0.0);
        if (ep.bgrad_b) bgrad.assign(n, 0.0);
        /* op(A) row i and op(B) column j, each k contiguous doubles */
        const std::vector<double> Ar = pack_rows(A, ao, m, k, ta ? A.ld : 1, ta ? 1 : A.ld);
        const std::vector<double> Bc = pack_rows(B, bo, n, k, tb ? 1 : B.ld, tb ? B.ld : 1);
        const int64_t IB = 8; /* rows of D computed together: 8 independent sums in flight */
        auto rows = [&](int64_t i_begin, int64_t i_end) {
            for (int64_t i0 = i_begin; i0 < i_end; i0 += IB) {
                const int64_t ni = std::min(IB, i_end - i0);
                for (int64_t j = 0; j < n; j++) {
                    const double *y = &Bc[(size_t)(j * k)];
                    double acc[IB] = {0, 0, 0, 0, 0, 0, 0, 0};
                    if (ni == IB) {
                        const double *x = &Ar[(size_t)(i0 * k)];
                        for (int64_t l = 0; l < k; l++)
                            for (int64_t r = 0; r < IB; r++) acc[r] += x[r * k + l] * y[l];
                    } else {
                        for (int64_t r = 0; r < ni; r++) {
                            const double *x = &Ar[(size_t)((i0 + r) * k)];
                            for (int64_t l = 0; l < k; l++) acc[r] += x[l] * y[l];
                        }
                    }
                    for (int64_t r = 0; r < ni; r++) {
                        const int64_t i = i0 + r;
                        float v = (float)((double)alpha * acc[r]);
                        if (beta != 0.0f) v = (float)((double)v + (double)beta * load(C.type, c, co + i + j * C.ld));
                        if (ep.bias) v += load(ep.bias_type, ep.bias_ptr, i);
                        if (ep.aux_out) store(ep.aux_type, ep.aux, i + j * ep.aux_ld, v);
                        if (ep.gelu) v = gelu(v);
                        if (ep.dgelu) v = v * gelu_grad(load(ep.aux_type, ep.aux, i + j * ep.aux_ld));
                        if (ep.bgrad_d) bgrad[i] += v;
                        store(d_type, D, dof + i + j * ldd, v);
                    }
                }
            }
        };
        /* large products: rows of D split over threads in blocks of IB (each element is still
         * one thread's ordered sum, so the result is the same for any thread count) */
        const int64_t work = m * n * k;
        unsigned nt = std::thread::hardware_concurrency();
        nt = std::max(1u, std::min(nt, 8u));
        const int64_t blocks = (m + IB - 1) / IB;
        if (work < (int64_t)1 << 22 || nt == 1 || blocks < 2) {
            rows(0, m);
        } else {
            nt = (unsigned)std::min<int64_t>(nt, blocks);
            std::vector<std::thread> pool;
            for (unsigned t = 0; t < nt; t++) {
                const int64_t lo = std::min(m, blocks * t / nt * IB), hi = std::min(m, blocks * (t + 1) / nt * IB);
                if (lo < hi) pool.emplace_back(rows, lo, hi);
            }
            for (auto &th : pool) th.join();
        }
        if (ep.bgrad_a)
            for (int64_t i = 0; i < m; i++)
                for (int64_t l = 0; l < k; l++) bgrad[i] += Ar[(size_t)(i * k + l)];
        if (ep.bgrad_b)
            for (int64_t j = 0; j < n; j++)
                for (int64_t l = 0; l < k; l++) bgrad[j] += Bc[(size_t)(j * k + l)];
        for (size_t i = 0; i < bgrad.size(); i++) store(ep.bias_type, ep.bias_ptr, (int64_t)i, (float)bgrad[i]);
    }
}

void check_compute(int compute, int scale) {
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32 &&
        compute != CUBLAS_COMPUTE_32F_FAST_16BF && compute != CUBLAS_COMPUTE_32F_FAST_16F &&
        compute != CUBLAS_COMPUTE_32F_PEDANTIC)
        unsupported("compute type %d (only CUBLAS_COMPUTE_32F and its _FAST_ variants)", compute);
    if (scale != CUDA_R_32F) unsupported("scale type %d (only CUDA_R_32F)", scale);
}

/* ---- cuBLASLt objects --------------------------------------------------------------------- */
const int kDescMagic = 0x4c744d44, kLayoutMagic = 0x4c744c59, kPrefMagic = 0x4c745046;

struct MatmulDesc {
    int magic = kDescMagic;
    int compute, scale;
    int transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
    unsigned epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void *bias = nullptr;
    int bias_type = -1, aux_type = -1;
    void *aux = nullptr;
    int64_t aux_ld = 0, bias_batch_stride = 0, aux_batch_stride = 0;
};
struct Layout {
    int magic = kLayoutMagic;
    int type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch = 1;
    int64_t stride = 0;
};
struct Pref {
    int magic = kPrefMagic;
};

template <class T> T get_attr(const void *buf, size_t size, const char *what) {
    if (size != sizeof(T)) unsupported("attribute %s given %zu bytes, expected %zu", what, size, sizeof(T));
    T v;
    memcpy(&v, buf, sizeof v);
    return v;
}

MatmulDesc *desc_of(cublasLtMatmulDesc_t d) {
    MatmulDesc *p = (MatmulDesc *)d;
    if (!p || p->magic != kDescMagic) unsupported("a cublasLtMatmulDesc_t not created by cublasLtMatmulDescCreate");
    return p;
}
Layout *layout_of(cublasLtMatrixLayout_t l) {
    Layout *p = (Layout *)l;
    if (!p || p->magic != kLayoutMagic) unsupported("a cublasLtMatrixLayout_t not created by cublasLtMatrixLayoutCreate");
    return p;
}

/* The end of a Create: the handle is the object. */
template <class H, class T> cublasStatus_t hand_out(H *handle, T *p) {
    *handle = (H)p;
    return CUBLAS_STATUS_SUCCESS;
}
/* A Destroy: the magic cleared first, so that a use after it is reported, not undefined. */
template <class T> cublasStatus_t destroy(T *p) {
    p->magic = 0;
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t) new int(1);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete (int *)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    check_compute(compute, scale);
    MatmulDesc *p = new MatmulDesc;
    p->compute = compute, p->scale = scale;
    return hand_out(d, p);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { return destroy(desc_of(d)); }

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    MatmulDesc *p = desc_of(d);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: p->transa = get_attr<int32_t>(buf, size, "TRANSA"); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: p->transb = get_attr<int32_t>(buf, size, "TRANSB"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: p->epilogue = get_attr<uint32_t>(buf, size, "EPILOGUE"); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: p->bias = get_attr<void *>(buf, size, "BIAS_POINTER"); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: p->bias_type = get_attr<int32_t>(buf, size, "BIAS_DATA_TYPE"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: p->aux = get_attr<void *>(buf, size, "EPILOGUE_AUX_POINTER"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: p->aux_ld = get_attr<int64_t>(buf, size, "EPILOGUE_AUX_LD"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: p->aux_type = get_attr<int32_t>(buf, size, "EPILOGUE_AUX_DATA_TYPE"); break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: p->bias_batch_stride = get_attr<int64_t>(buf, size, "BIAS_BATCH_STRIDE"); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: p->aux_batch_stride = get_attr<int64_t>(buf, size, "AUX_BATCH_STRIDE"); break;
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: p->compute = get_attr<int32_t>(buf, size, "COMPUTE_TYPE"); check_compute(p->compute, p->scale); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: p->scale = get_attr<int32_t>(buf, size, "SCALE_TYPE"); check_compute(p->compute, p->scale); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        if (get_attr<int32_t>(buf, size, "POINTER_MODE") != CUBLASLT_POINTER_MODE_HOST)
            unsupported("POINTER_MODE other than CUBLASLT_POINTER_MODE_HOST");
        break;
    case CUBLASLT_MATMUL_DESC_TRANSC:
        if (get_attr<int32_t>(buf, size, "TRANSC") != CUBLAS_OP_N) unsupported("TRANSC != CUBLAS_OP_N");
        break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: break; /* fp8 hint; accumulation is exact here */
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: break;
    default: unsupported("cublasLtMatmulDescSetAttribute attribute %d", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    type_size(type);
    if (ld < (int64_t)(rows ? rows : 1)) unsupported("matrix layout with ld %lld < rows %llu", (long long)ld, (unsigned long long)rows);
    Layout *p = new Layout;
    p->type = type, p->rows = rows, p->cols = cols, p->ld = ld;
    return hand_out(l, p);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { return destroy(layout_of(l)); }
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size) {
    Layout *p = layout_of(l);
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: p->batch = get_attr<int32_t>(buf, size, "BATCH_COUNT"); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: p->stride = get_attr<int64_t>(buf, size, "STRIDED_BATCH_OFFSET"); break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
        if (get_attr<int32_t>(buf, size, "ORDER") != CUBLASLT_ORDER_COL) unsupported("matrix order other than CUBLASLT_ORDER_COL");
        break;
    default: unsupported("cublasLtMatrixLayoutSetAttribute attribute %d", (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    *pref = (cublasLtMatmulPreference_t) new Pref;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete (Pref *)pref;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *, size_t) {
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: case CUBLASLT_MATMUL_PREF_IMPL_MASK:
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        return CUBLAS_STATUS_SUCCESS; /* search hints: there is one algorithm */
    default: unsupported("cublasLtMatmulPreferenceSetAttribute attribute %d", (int)attr);
    }
}

namespace {

const uint64_t SIM_ALGO_MARKER = 0x6c6c6d6373696dULL; /* "llmcsim" */
int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}
int sim_algo_count() { return env_int("CUDASIM_LT_ALGOS", 1) < 1 ? 1 : env_int("CUDASIM_LT_ALGOS", 1); }
bool sim_algo_valid(const cublasLtMatmulAlgo_t *algo) {
    return algo->data[1] == SIM_ALGO_MARKER && algo->data[0] < (uint64_t)sim_algo_count();
}

} // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
    desc_of(d), layout_of(a), layout_of(b), layout_of(c), layout_of(dd);
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    int n = std::min(requested, sim_algo_count());
    for (int i = 0; i < n; i++) {
        memset(&results[i], 0, sizeof results[i]);
        results[i].algo.data[0] = (uint64_t)i;
        results[i].algo.data[1] = SIM_ALGO_MARKER;
        results[i].workspaceSize = 0;
        results[i].state = CUBLAS_STATUS_SUCCESS;
        results[i].wavesCount = 1.0f;
    }
    *returned = n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                       const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *result) {
    desc_of(d), layout_of(a), layout_of(b), layout_of(c), layout_of(dd);
    if (!algo || !sim_algo_valid(algo)) return CUBLAS_STATUS_INVALID_VALUE;
    memset(result, 0, sizeof *result);
    result->algo = *algo;
    result->state = CUBLAS_STATUS_SUCCESS;
    result->wavesCount = 1.0f;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void *buf, size_t size, size_t *written) {
    if (attr != CUBLASLT_ALGO_CONFIG_ID) unsupported("cublasLtMatmulAlgoConfigGetAttribute attribute %d", (int)attr);
    if (written) *written = sizeof(int);
    if (size < sizeof(int)) return CUBLAS_STATUS_INVALID_VALUE;
    int id = (int)algo->data[0];
    memcpy(buf, &id, sizeof id);
    return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *, size_t,
                              cudaStream_t stream) {
    if (algo && !sim_algo_valid(algo)) return CUBLAS_STATUS_INVALID_VALUE;
    switch (cudasim::detail::capture_action(stream, "cublasLtMatmul", __FILE__, __LINE__)) {
    case cudasim::detail::CAPTURE_REFUSED: return CUBLAS_STATUS_EXECUTION_FAILED;
    case cudasim::detail::CAPTURE_RECORD: {
        /* a graph node holds the descriptors, layouts, algorithm and scalars as they are now */
        MatmulDesc d = *desc_of(desc);
        Layout a = *layout_of(Adesc), b = *layout_of(Bdesc), c = *layout_of(Cdesc), dl = *layout_of(Ddesc);
        float fa = *(const float *)alpha, fb = *(const float *)beta;
        cublasLtMatmulAlgo_t al;
        if (algo) al = *algo;
        const bool has_algo = algo != nullptr;
        cudasim::detail::capture_record([=]() mutable {
            cublasLtMatmul(nullptr, (cublasLtMatmulDesc_t)&d, &fa, A, (cublasLtMatrixLayout_t)&a, B, (cublasLtMatrixLayout_t)&b,
                           &fb, C, (cublasLtMatrixLayout_t)&c, D, (cublasLtMatrixLayout_t)&dl, has_algo ? &al : nullptr,
                           nullptr, 0, stream);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    case cudasim::detail::CAPTURE_EXECUTE: break;
    }
    if (algo && (int)algo->data[0] == env_int("CUDASIM_LT_SLOW_ALGO", -1)) usleep(20000);
    MatmulDesc *p = desc_of(desc);
    Layout *la = layout_of(Adesc), *lb = layout_of(Bdesc), *lc = layout_of(Cdesc), *ld = layout_of(Ddesc);
    bool ta = p->transa == CUBLAS_OP_T, tb = p->transb == CUBLAS_OP_T;
    if ((p->transa != CUBLAS_OP_N && !ta) || (p->transb != CUBLAS_OP_N && !tb)) unsupported("conjugate transpose");
    uint64_t m = ld->rows, n = ld->cols;
    uint64_t k = ta ? la->rows : la->cols;
    if ((ta ? la->cols : la->rows) != m || (tb ? lb->cols : lb->rows) != k || (tb ? lb->rows : lb->cols) != n ||
        lc->rows != m || lc->cols != n)
        unsupported("inconsistent shapes: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
                    (unsigned long long)(ta ? la->cols : la->rows), (unsigned long long)k,
                    (unsigned long long)(tb ? lb->cols : lb->rows), (unsigned long long)(tb ? lb->rows : lb->cols),
                    (unsigned long long)lc->rows, (unsigned long long)lc->cols, (unsigned long long)m, (unsigned long long)n);
    if (lc->type != ld->type) unsupported("C type %d != D type %d", lc->type, ld->type);
    int batch = ld->batch;
    if (la->batch != batch || lb->batch != batch || lc->batch != batch)
        unsupported("batch counts differ: A %d, B %d, C %d, D %d", la->batch, lb->batch, lc->batch, batch);
    Epilogue ep;
    switch (p->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: break;
    case CUBLASLT_EPILOGUE_BIAS: ep.bias = true; break;
    case CUBLASLT_EPILOGUE_GELU: ep.gelu = true; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: ep.gelu = ep.bias = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: ep.gelu = ep.aux_out = true; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: ep.gelu = ep.aux_out = ep.bias = true; break;
    case CUBLASLT_EPILOGUE_DGELU: ep.dgelu = true; break;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: ep.dgelu = ep.bgrad_d = true; break;
    case CUBLASLT_EPILOGUE_BGRADA: ep.bgrad_a = true; break;
    case CUBLASLT_EPILOGUE_BGRADB: ep.bgrad_b = true; break;
    default: unsupported("epilogue %u", p->epilogue);
    }
    bool uses_bias = ep.bias || ep.bgrad_a || ep.bgrad_b || ep.bgrad_d;
    bool uses_aux = ep.aux_out || ep.dgelu;
    if (uses_bias && !p->bias) unsupported("epilogue %u without CUBLASLT_MATMUL_DESC_BIAS_POINTER", p->epilogue);
    if (uses_aux && !p->aux) unsupported("epilogue %u without CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", p->epilogue);
    if (uses_aux && (p->aux_ld < (int64_t)m || p->aux_ld % 8))
        unsupported("EPILOGUE_AUX_LD %lld: must be >= rows of D (%llu) and divisible by 8", (long long)p->aux_ld, (unsigned long long)m);
    if (batch > 1 && p->epilogue != CUBLASLT_EPILOGUE_DEFAULT) unsupported("epilogue %u with batch count %d", p->epilogue, batch);
    ep.bias_ptr = p->bias;
    ep.bias_type = p->bias_type < 0 ? ld->type : p->bias_type;
    ep.aux = p->aux;
    ep.aux_type = p->aux_type < 0 ? ld->type : p->aux_type;
    ep.aux_ld = p->aux_ld;
    if (uses_bias) type_size(ep.bias_type);
    if (uses_aux) type_size(ep.aux_type);
    float fa = *(const float *)alpha, fb = *(const float *)beta;
    gemm(ta, tb, (int64_t)m, (int64_t)n, (int64_t)k, fa, Operand{A, la->type, la->ld, la->stride},
         Operand{B, lb->type, lb->ld, lb->stride}, fb, Operand{C, lc->type, lc->ld, lc->stride}, D, ld->type,
         ld->ld, ld->stride, batch, ep);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- classic cuBLAS --------------------------------------------------------------------------- */
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = (cublasHandle_t) new int(2);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    delete (int *)h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(other)";
    }
}

static bool op_t(cublasOperation_t op) {
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) unsupported("cublasOperation_t %d", (int)op);
    return op == CUBLAS_OP_T;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m,
                                          int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                                          long long strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t) {
    if (cudasim::detail::capture_active()) unsupported("classic cuBLAS during stream capture (not emulated: use cublasLt)");
    check_compute(computeType, CUDA_R_32F);
    type_size(Atype), type_size(Btype), type_size(Ctype);
    bool ta = op_t(transa), tb = op_t(transb);
    if (lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
    Epilogue none;
    gemm(ta, tb, m, n, k, *(const float *)alpha, Operand{A, Atype, lda, strideA}, Operand{B, Btype, ldb, strideB},
         *(const float *)beta, Operand{C, Ctype, ldc, strideC}, C, Ctype, ldc, strideC, batchCount, none);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(h, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                                      Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m,
                                         int n, int k, const float *alpha, const float *A, int lda, long long strideA,
                                         const float *B, int ldb, long long strideB, const float *beta, float *C,
                                         int ldc, long long strideC, int batchCount) {
    return cublasGemmStridedBatchedEx(h, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B, CUDA_R_32F,
                                      ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                              const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc) {
    return cublasSgemmStridedBatched(h, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

} /* extern "C" */
