/*
 * residual.cuh - out = inp1 + inp2, rounded to T (CUDA twin of llmc/cpu/residual.h).
 * Shapes: out, inp1, inp2 (N); out may alias inp1. The model uses the fused form in
 * layernorm.cuh (fused_residual_layernorm_forward); this one is kept for tests and the lab.
 */
#ifndef LLMC_CUDA_RESIDUAL_CUH
#define LLMC_CUDA_RESIDUAL_CUH

#include "llmc/cuda/common.cuh"

template <class T>
static __global__ void residual_forward_kernel(T *out, const T *inp1, const T *inp2, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = from_float<T>(to_float(inp1[i]) + to_float(inp2[i]));
}

/* One 16-byte pack per thread (common.cuh); the last thread also does the tail. */
template <class T>
static __global__ void residual_forward_kernel16(T *out, const T *inp1, const T *inp2, size_t N) {
    constexpr int P = Pack16<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i + P <= N) {
        Pack16<T> a = load16(inp1 + i), b = load16(inp2 + i), y;
#pragma unroll
        for (int k = 0; k < P; k++) y.v[k] = from_float<T>(to_float(a.v[k]) + to_float(b.v[k]));
        store16(out + i, y);
    } else {
        for (; i < N; i++) out[i] = from_float<T>(to_float(inp1[i]) + to_float(inp2[i]));
    }
}

template <class T>
void residual_forward(T *out, const T *inp1, const T *inp2, size_t N, cudaStream_t stream) {
    llmcCheck(N > 0, "residual_forward: N must be positive");
    const int block = 256;
    if (aligned16(out) && aligned16(inp1) && aligned16(inp2))
        residual_forward_kernel16<<<ceil_div((long long)ceil_div((long long)N, Pack16<T>::size), block), block, 0, stream>>>(out, inp1, inp2, N);
    else
        residual_forward_kernel<<<ceil_div((long long)N, block), block, 0, stream>>>(out, inp1, inp2, N);
    kernelCheck();
}

#endif
