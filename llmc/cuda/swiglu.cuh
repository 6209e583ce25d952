/*
 * swiglu.cuh - SwiGLU, Llama's MLP nonlinearity (CUDA twin of llmc/cpu/swiglu.h), on a packed
 * [gate | up] tensor.
 * forward:  out = silu(gate) * up, silu(x) = x * sigmoid(x)                          (overwrites)
 * backward: dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))
 *           dup = dout * silu(gate)                                                    (overwrites)
 * Shapes: inp, dinp (N, 2F) with gate in columns [0, F) and up in [F, 2F); out, dout (N, F).
 * The formulas are the CPU's, term for term. One 16-byte pack of out per thread (common.cuh's
 * Pack16) when F is a whole number of packs (so no pack straddles gate and up) and the pointers
 * are 16-byte aligned; one element per thread otherwise.
 */
#ifndef LLMC_CUDA_SWIGLU_CUH
#define LLMC_CUDA_SWIGLU_CUH

#include "llmc/cuda/common.cuh"

__device__ inline float swiglu_value(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

/* (dgate, dup) for one element */
__device__ inline float2 swiglu_grad(float gate, float up, float d) {
    const float sig = 1.0f / (1.0f + expf(-gate)), silu = gate * sig;
    return make_float2(d * up * sig * (1.0f + gate * (1.0f - sig)), d * silu);
}

/* element i of out (N, F) reads inp at row * 2F + col (gate) and + F (up) */
__device__ inline size_t swiglu_gate_at(size_t i, int F) { return i / F * 2 * F + i % F; }

template <class T>
static __global__ void swiglu_forward_kernel(T *out, const T *inp, int N, int F) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    const size_t g = swiglu_gate_at(i, F);
    out[i] = from_float<T>(swiglu_value(to_float(inp[g]), to_float(inp[g + F])));
}

template <class T>
static __global__ void swiglu_backward_kernel(T *dinp, const T *inp, const T *dout, int N, int F) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    const size_t g = swiglu_gate_at(i, F);
    const float2 d = swiglu_grad(to_float(inp[g]), to_float(inp[g + F]), to_float(dout[i]));
    dinp[g] = from_float<T>(d.x);
    dinp[g + F] = from_float<T>(d.y);
}

/* One 16-byte pack of out per thread (F % P == 0, aligned pointers). */
template <class T>
static __global__ void swiglu_forward_kernel16(T *out, const T *inp, int N, int F) {
    constexpr int P = Pack16<T>::size;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= (size_t)N * F) return;
    const size_t g = swiglu_gate_at(i, F);
    const Pack16<T> a = load16(inp + g), b = load16(inp + g + F);
    Pack16<T> y;
#pragma unroll
    for (int k = 0; k < P; k++) y.v[k] = from_float<T>(swiglu_value(to_float(a.v[k]), to_float(b.v[k])));
    store16(out + i, y);
}

template <class T>
static __global__ void swiglu_backward_kernel16(T *dinp, const T *inp, const T *dout, int N, int F) {
    constexpr int P = Pack16<T>::size;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= (size_t)N * F) return;
    const size_t g = swiglu_gate_at(i, F);
    const Pack16<T> a = load16(inp + g), b = load16(inp + g + F), d = load16(dout + i);
    Pack16<T> dg, du;
#pragma unroll
    for (int k = 0; k < P; k++) {
        const float2 r = swiglu_grad(to_float(a.v[k]), to_float(b.v[k]), to_float(d.v[k]));
        dg.v[k] = from_float<T>(r.x);
        du.v[k] = from_float<T>(r.y);
    }
    store16(dinp + g, dg);
    store16(dinp + g + F, du);
}

template <class T> inline bool swiglu_packable(int F, const void *a, const void *b, const void *c) {
    return F % Pack16<T>::size == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

template <class T>
void swiglu_forward(T *out, const T *inp, int N, int F, cudaStream_t stream) {
    llmcCheck(N > 0 && F > 0, "swiglu_forward: N and F must be positive");
    const int block = 256;
    const long long n = (long long)N * F;
    if (swiglu_packable<T>(F, out, inp, inp))
        swiglu_forward_kernel16<<<ceil_div(n / Pack16<T>::size, block), block, 0, stream>>>(out, inp, N, F);
    else
        swiglu_forward_kernel<<<ceil_div(n, block), block, 0, stream>>>(out, inp, N, F);
    kernelCheck();
}

template <class T>
void swiglu_backward(T *dinp, const T *inp, const T *dout, int N, int F, cudaStream_t stream) {
    llmcCheck(N > 0 && F > 0, "swiglu_backward: N and F must be positive");
    const int block = 256;
    const long long n = (long long)N * F;
    if (swiglu_packable<T>(F, dinp, inp, dout))
        swiglu_backward_kernel16<<<ceil_div(n / Pack16<T>::size, block), block, 0, stream>>>(dinp, inp, dout, N, F);
    else
        swiglu_backward_kernel<<<ceil_div(n, block), block, 0, stream>>>(dinp, inp, dout, N, F);
    kernelCheck();
}

#endif
