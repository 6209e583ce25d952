/*
 * common.cuh - what every CUDA op shares: the check macros, the device context, the storage
 * types and the one place that turns the run-time precision into a template argument.
 *
 * Storage types: every kernel is a template on T, the type tensors are stored in
 * (float, __nv_bfloat16 or __half). Arithmetic is always fp32 (to_float / from_float at the
 * loads and stores); statistics (LayerNorm mean/rstd, attention logsumexp, losses), AdamW
 * moments, master weights and norms are always fp32.
 *
 * Errors: cudaCheck / cublasCheck / kernelCheck report the failing statement, function, file
 * and line through llmc_check_failed (llmc/core/check.h, the generator every *Check macro uses) and
 * end with a HINT. Bad sizes handed to a launcher are programming errors of the caller and are
 * reported the same way by llmcCheck; they are never compiled out.
 */
#ifndef LLMC_CUDA_COMMON_CUH
#define LLMC_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"

/* ---- check macros ------------------------------------------------------------------------ */
#define LLMC_CUDA_HINT "HINT: run under compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel"

#define cudaCheck(stmt)                                                                               \
    do {                                                                                              \
        cudaError_t llmc_err_ = (stmt);                                                               \
        if (llmc_err_ != cudaSuccess)                                                                 \
            llmc_check_failed(#stmt, cudaGetErrorString(llmc_err_), LLMC_CUDA_HINT, __func__, __FILE__, \
                              __LINE__);                                                              \
    } while (0)

/* After a kernel launch: reports launch-configuration errors (and earlier asynchronous ones). */
#define kernelCheck() cudaCheck(cudaGetLastError())

#include "llmc/cuda/devalloc.cuh" /* (after cudaCheck, which it uses) */

inline const char *llmc_cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED (no usable GPU or driver?)";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED (out of device memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (bad size, leading dimension or alignment)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (this type/epilogue/layout combination)";
    default: return "unknown cuBLAS status";
    }
}

#define cublasCheck(stmt)                                                                              \
    do {                                                                                               \
        cublasStatus_t llmc_st_ = (stmt);                                                              \
        if (llmc_st_ != CUBLAS_STATUS_SUCCESS)                                                         \
            llmc_check_failed(#stmt, llmc_cublas_status_name(llmc_st_),                                \
                              "HINT: check the matmul shapes and pointer alignment (16 bytes); "       \
                              "CUBLASLT_LOG_LEVEL=5 prints what cuBLASLt rejected",                    \
                              __func__, __FILE__, __LINE__);                                           \
    } while (0)

/* ---- storage types ------------------------------------------------------------------------ */
typedef enum { PRECISION_FP32, PRECISION_BF16, PRECISION_FP16 } Precision;

/* "fp32" | "bf16" | "fp16" -> Precision; returns -1 for anything else. */
inline int precision_parse(const char *s) {
    if (strcmp(s, "fp32") == 0) return PRECISION_FP32;
    if (strcmp(s, "bf16") == 0) return PRECISION_BF16;
    if (strcmp(s, "fp16") == 0) return PRECISION_FP16;
    return -1;
}
inline const char *precision_name(Precision p) {
    return p == PRECISION_FP32 ? "fp32" : p == PRECISION_BF16 ? "bf16" : "fp16";
}
inline size_t precision_bytes(Precision p) { return p == PRECISION_FP32 ? 4 : 2; }

/* The one dispatch point from the run-time precision to the storage type: calls
 * fn(T{}) with T = float, __nv_bfloat16 or __half. */
template <class Fn> inline void with_storage_type(Precision p, Fn &&fn) {
    switch (p) {
    case PRECISION_FP32: fn(float{}); break;
    case PRECISION_BF16: fn(__nv_bfloat16{}); break;
    case PRECISION_FP16: fn(__half{}); break;
    }
}

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }

/* Round to nearest even into the storage type. */
template <class T> __host__ __device__ inline T from_float(float x);
template <> __host__ __device__ inline float from_float<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __host__ __device__ inline __half from_float<__half>(float x) { return __float2half(x); }

template <class T> struct StorageInfo;
template <> struct StorageInfo<float> {
    static constexpr cudaDataType_t cuda_type = CUDA_R_32F;
    static constexpr const char *name = "fp32";
};
template <> struct StorageInfo<__nv_bfloat16> {
    static constexpr cudaDataType_t cuda_type = CUDA_R_16BF;
    static constexpr const char *name = "bf16";
};
template <> struct StorageInfo<__half> {
    static constexpr cudaDataType_t cuda_type = CUDA_R_16F;
    static constexpr const char *name = "fp16";
};

/* ---- the device context (everything a launcher may need besides its tensors) -------------- */
struct LtPlanCache; /* lt_plans.cuh */
typedef struct {
    int device;
    cudaDeviceProp props;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace;        /* cuBLASLt scratch */
    size_t lt_workspace_bytes;
    int allow_tf32;            /* fp32 matmuls may use TF32 (-f 1) */
    /* cuBLASLt plans (lt_plans.cuh): candidates timed per new matmul shape (--matmul-algos;
     * 1 = the heuristic's first), the file the choices are kept in ('' = none), and the plans,
     * created on the first matmul and freed by cuda_context_free through lt_plans_free. */
    int lt_algos;
    FILE *lt_log;              /* where each tuned shape's choice is printed; NULL = nowhere */
    char lt_cache_path[4096];
    struct LtPlanCache *lt_plans;
    void (*lt_plans_free)(struct LtPlanCache *);
    /* every device allocation of llmc/cuda (devalloc.cuh); a pointer, so that a const context still allocates */
    DevAlloc *alloc;
} CudaContext;

enum { LLMC_LT_DEFAULT_ALGOS = 8 };

enum { LLMC_CUBLASLT_WORKSPACE = 32 << 20 };

/* Dies with a clear message when no usable GPU exists. */
inline void cuda_require_device(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        llmc_die("no usable CUDA GPU: %s (./train_gpt needs an NVIDIA GPU and driver; use ./train_gpt_cpu on a CPU)",
                 cudaGetErrorString(e));
    if (count < 1) llmc_die("no CUDA GPU found (./train_gpt needs one; use ./train_gpt_cpu on a CPU)");
}

inline void cuda_context_init(CudaContext *ctx, int device, int allow_tf32) {
    memset(ctx, 0, sizeof *ctx);
    ctx->device = device;
    ctx->allow_tf32 = allow_tf32;
    ctx->lt_algos = LLMC_LT_DEFAULT_ALGOS;
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(&ctx->props, device));
    cudaCheck(cudaStreamCreate(&ctx->stream));
    cublasCheck(cublasLtCreate(&ctx->lt));
    ctx->alloc = (DevAlloc *)mallocCheck(sizeof *ctx->alloc, "the device allocator");
    devalloc_init(ctx->alloc);
    ctx->lt_workspace_bytes = LLMC_CUBLASLT_WORKSPACE;
    ctx->lt_workspace = devalloc_malloc(ctx->alloc, MEM_WORKSPACE, ctx->lt_workspace_bytes);
}

inline void cuda_context_free(CudaContext *ctx) {
    if (ctx->lt_plans) ctx->lt_plans_free(ctx->lt_plans);
    devalloc_free(ctx->alloc, ctx->lt_workspace);
    devalloc_destroy(ctx->alloc);
    free(ctx->alloc);
    cublasCheck(cublasLtDestroy(ctx->lt));
    cudaCheck(cudaStreamDestroy(ctx->stream));
    memset(ctx, 0, sizeof *ctx);
}

/* ---- small device helpers ------------------------------------------------------------------ */
inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

/* ---- 16-byte packs for the memory-bound kernels ---------------------------------------------
 * A Pack16<T> is 16 bytes of T (8 bf16/fp16 or 4 floats) moved by one 128-bit load or store
 * (LDG.E.128 / STG.E.128: a warp moves 512 contiguous bytes per instruction instead of 64 with
 * 2-byte accesses). The pointer must be 16-byte aligned: hosts check aligned16() and launch the
 * element-per-thread form otherwise. load16/store16 go through L2 only (ld/st.global.cg), which
 * is coherent, so an output may alias an input that the same thread read first.
 * test/test_sass.sh checks that these kernels compile to 128-bit accesses. */
template <class T> struct alignas(16) Pack16 {
    static constexpr int size = 16 / (int)sizeof(T);
    T v[size];
};
inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
template <class T> __device__ inline Pack16<T> load16(const T *p) {
    const int4 bits = __ldcg(reinterpret_cast<const int4 *>(p));
    Pack16<T> r;
    memcpy(&r, &bits, sizeof bits);
    return r;
}
template <class T> __device__ inline void store16(T *p, const Pack16<T> &x) {
    int4 bits;
    memcpy(&bits, &x, sizeof bits);
    __stcg(reinterpret_cast<int4 *>(p), bits);
}

/* A pack as floats (x = p), added to floats (x += p), and floats rounded back into a pack. */
template <class T> __device__ inline void pack_to_floats(float (&x)[Pack16<T>::size], const Pack16<T> &p) {
#pragma unroll
    for (int k = 0; k < Pack16<T>::size; k++) x[k] = to_float(p.v[k]);
}
template <class T> __device__ inline void pack_add_to_floats(float (&x)[Pack16<T>::size], const Pack16<T> &p) {
#pragma unroll
    for (int k = 0; k < Pack16<T>::size; k++) x[k] += to_float(p.v[k]);
}
template <class T> __device__ inline Pack16<T> floats_to_pack(const float (&x)[Pack16<T>::size]) {
    Pack16<T> p;
#pragma unroll
    for (int k = 0; k < Pack16<T>::size; k++) p.v[k] = from_float<T>(x[k]);
    return p;
}

/* One warp's share of a row of npacks packs at src, in registers: lane l holds packs l, l + 32,
 * ..., x[k] = pack l + 32 k as floats, zeros past npacks (K >= ceil(npacks / 32)). */
template <class T, int K>
__device__ inline void load_row16(float (&x)[K][Pack16<T>::size], const T *src, int npacks, int lane) {
    constexpr int P = Pack16<T>::size;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int p = lane + 32 * k;
        Pack16<T> a;
        if (p < npacks) a = load16(src + (size_t)p * P);
#pragma unroll
        for (int j = 0; j < P; j++) x[k][j] = p < npacks ? to_float(a.v[j]) : 0.0f;
    }
}

/* Sum over the 32 lanes of a warp, butterfly order: every lane gets the same bits. */
__device__ inline float warp_sum(float x) {
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}
__device__ inline float warp_max(float x) {
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

/* Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024): warps reduce, then warp 0
 * reduces the warp results in a fixed order; every thread returns the total. `shared` holds
 * 32 floats. Deterministic. Must be called by all threads of the block. */
__device__ inline float block_sum(float x, float *shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    x = warp_sum(x);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    float y = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(y);
}
__device__ inline float block_max(float x, float *shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    float y = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(y);
}

/* One row of a fused norm backward on one warp (LayerNorm with CENTER, RMSNorm without): lane l
 * takes packs l, l + 32, ... of dout and inp at base; w: its weight packs (load_row16); m, s: the
 * row's mean (unused without CENTER) and rstd. xh = (x - m) s (RMSNorm: x s), dn = w dy;
 * dinp += s (dn - mean(dn) - xh mean(dn xh)) (RMSNorm: without mean(dn)); the lane's partials
 * aw += dy xh (dweight) and, with CENTER, ab += dy (dbias; RMSNorm passes aw and it is not touched). */
template <bool CENTER, class T, int K>
__device__ inline void norm_backward_row(T *dinp, const T *dout, const T *inp, size_t base,
                                         const float (&w)[K][Pack16<T>::size], float m, float s, int npacks, int C,
                                         float (&aw)[K][Pack16<T>::size], float (&ab)[K][Pack16<T>::size]) {
    constexpr int P = Pack16<T>::size;
    const int lane = threadIdx.x % 32;
    float dy[K][P], xh[K][P], sd = 0.0f, sdx = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int p = lane + 32 * k;
        if (p >= npacks) continue;
        const Pack16<T> a = load16(dout + base + (size_t)p * P), b = load16(inp + base + (size_t)p * P);
#pragma unroll
        for (int j = 0; j < P; j++) {
            dy[k][j] = to_float(a.v[j]);
            if constexpr (CENTER) xh[k][j] = (to_float(b.v[j]) - m) * s;
            else xh[k][j] = to_float(b.v[j]) * s;
            const float dnorm = w[k][j] * dy[k][j];
            if constexpr (CENTER) sd += dnorm;
            sdx += dnorm * xh[k][j];
        }
    }
    if constexpr (CENTER) sd = warp_sum(sd) / (float)C;
    sdx = warp_sum(sdx) / (float)C;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int p = lane + 32 * k;
        if (p >= npacks) continue;
        Pack16<T> d = load16(dinp + base + (size_t)p * P);
#pragma unroll
        for (int j = 0; j < P; j++) {
            float g;
            if constexpr (CENTER) g = s * (w[k][j] * dy[k][j] - sd - xh[k][j] * sdx);
            else g = s * (w[k][j] * dy[k][j] - xh[k][j] * sdx);
            d.v[j] = from_float<T>(to_float(d.v[j]) + g);
            aw[k][j] += dy[k][j] * xh[k][j];
            if constexpr (CENTER) ab[k][j] += dy[k][j];
        }
        store16(dinp + base + (size_t)p * P, d);
    }
}

/* The warps of a block add their lanes' per-pack partial sums a (lane l: packs l, l + 32, ..., as
 * load_row16 holds them) into acc (C floats of shared memory) one warp after another, a fixed
 * order (deterministic), then the block writes acc to out (C floats). Must be called by all threads
 * of the block; WARPS = blockDim.x / 32. The fused norm backwards' weight/bias partials. */
template <int K, int P, int WARPS>
__device__ inline void block_sum_lane_packs(float *acc, float *out, const float (&a)[K][P], int npacks, int C) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < C; i += blockDim.x) acc[i] = 0.0f;
    __syncthreads();
    for (int turn = 0; turn < WARPS; turn++) {
        if (warp == turn) {
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int p = lane + 32 * k;
                if (p >= npacks) continue;
#pragma unroll
                for (int j = 0; j < P; j++) acc[p * P + j] += a[k][j];
            }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < C; i += blockDim.x) out[i] = acc[i];
}

#endif
