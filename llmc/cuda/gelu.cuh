/*
 * gelu.cuh - GELU, tanh approximation (CUDA twin of llmc/cpu/gelu.h).
 * forward:  out = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)            (overwrites)
 * backward: dinp = dout * [0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3*0.044715 x^2)]
 *           with u = k (x + 0.044715 x^3)                                            (overwrites)
 * Shapes: out, inp, dinp, dout (N). Elementwise; out may alias inp, dinp may alias dout.
 * gelu_value is also what the recompute (-r >= 1) uses, so the recomputed output is
 * bit-identical to the forward's.
 */
#ifndef LLMC_CUDA_GELU_CUH
#define LLMC_CUDA_GELU_CUH

#include "llmc/cuda/common.cuh"

#define LLMC_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

__device__ inline float gelu_value(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(LLMC_GELU_SCALE * (x + cube)));
}

__device__ inline float gelu_derivative(float x) {
    float cube = 0.044715f * x * x * x;
    float th = tanhf(LLMC_GELU_SCALE * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * LLMC_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* One element per thread: the form for unaligned pointers. */
template <class T>
static __global__ void gelu_forward_kernel(T *out, const T *inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = from_float<T>(gelu_value(to_float(inp[i])));
}

template <class T>
static __global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) dinp[i] = from_float<T>(gelu_derivative(to_float(inp[i])) * to_float(dout[i]));
}

/* One 16-byte pack per thread (16-byte aligned pointers); the last thread also does the tail. */
template <class T>
static __global__ void gelu_forward_kernel16(T *out, const T *inp, size_t N) {
    constexpr int P = Pack16<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i + P <= N) {
        Pack16<T> x = load16(inp + i), y;
#pragma unroll
        for (int k = 0; k < P; k++) y.v[k] = from_float<T>(gelu_value(to_float(x.v[k])));
        store16(out + i, y);
    } else {
        for (; i < N; i++) out[i] = from_float<T>(gelu_value(to_float(inp[i])));
    }
}

template <class T>
static __global__ void gelu_backward_kernel16(T *dinp, const T *inp, const T *dout, size_t N) {
    constexpr int P = Pack16<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i + P <= N) {
        Pack16<T> x = load16(inp + i), d = load16(dout + i), y;
#pragma unroll
        for (int k = 0; k < P; k++) y.v[k] = from_float<T>(gelu_derivative(to_float(x.v[k])) * to_float(d.v[k]));
        store16(dinp + i, y);
    } else {
        for (; i < N; i++) dinp[i] = from_float<T>(gelu_derivative(to_float(inp[i])) * to_float(dout[i]));
    }
}

template <class T>
void gelu_forward(T *out, const T *inp, size_t N, cudaStream_t stream) {
    llmcCheck(N > 0, "gelu_forward: N must be positive");
    const int block = 256;
    if (aligned16(out) && aligned16(inp))
        gelu_forward_kernel16<<<ceil_div((long long)ceil_div((long long)N, Pack16<T>::size), block), block, 0, stream>>>(out, inp, N);
    else
        gelu_forward_kernel<<<ceil_div((long long)N, block), block, 0, stream>>>(out, inp, N);
    kernelCheck();
}

template <class T>
void gelu_backward(T *dinp, const T *inp, const T *dout, size_t N, cudaStream_t stream) {
    llmcCheck(N > 0, "gelu_backward: N must be positive");
    const int block = 256;
    if (aligned16(dinp) && aligned16(inp) && aligned16(dout))
        gelu_backward_kernel16<<<ceil_div((long long)ceil_div((long long)N, Pack16<T>::size), block), block, 0, stream>>>(dinp, inp, dout, N);
    else
        gelu_backward_kernel<<<ceil_div((long long)N, block), block, 0, stream>>>(dinp, inp, dout, N);
    kernelCheck();
}

#endif
