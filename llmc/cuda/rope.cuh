/*
 * rope.cuh - rotary position embedding (Llama's convention; CUDA twin of llmc/cpu/rope.h),
 * applied in place to the q and k heads of a packed qkv tensor (NH query heads, NKV key heads,
 * then NKV value heads, left alone: grouped-query attention when NKV < NH).
 * forward:  (x0, x1) <- (x0 cos - x1 sin, x0 sin + x1 cos) for channel pairs (2i, 2i+1) of a head
 * backward: the transpose rotation (angle -a) on the gradient, in place.
 * freqs (T, HS/2, 2) fp32: cos and sin of t * inv_freq[i], computed on the host by the CPU's
 * rope_freqs (rope_theta, Llama 3.1 scaling) and copied over by rope_freqs_to_device, so both
 * backends rotate by the same angles.
 * Shapes: qkv, dqkv (B, T, (NH + 2 NKV) HS), HS even.
 * One 16-byte pack of a head per thread (common.cuh's Pack16; P/2 pairs) when HS is a whole
 * number of packs and qkv is 16-byte aligned; one pair per thread otherwise.
 */
#ifndef LLMC_CUDA_ROPE_CUH
#define LLMC_CUDA_ROPE_CUH

#include <stdlib.h>

#include "llmc/core/check.h"
#include "llmc/cpu/rope.h"
#include "llmc/cuda/common.cuh"

/* Rotates one pair by the angle whose (cos, sin) is cs, times sign. */
__device__ inline void rope_pair(float *x0, float *x1, const float *cs, float sign) {
    const float c = cs[0], s = sign * cs[1], a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = a * s + b * c;
}

/* One pair (2i, 2i+1) of one q or k head per thread. */
template <class T>
static __global__ void rope_rotate_kernel(T *qkv, const float *freqs, int B, int T_, int NH, int NKV, int HS, float sign) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, half = HS / 2, heads = NH + NKV;
    if (idx >= (size_t)B * T_ * heads * half) return;
    const size_t i = idx % half, h = idx / half % heads, bt = idx / half / heads;
    T *x = qkv + bt * (size_t)(NH + 2 * NKV) * HS + h * HS + 2 * i;
    float a = to_float(x[0]), b = to_float(x[1]);
    rope_pair(&a, &b, freqs + (size_t)(bt % T_) * HS + 2 * i, sign);
    x[0] = from_float<T>(a);
    x[1] = from_float<T>(b);
}

/* One 16-byte pack (P/2 pairs) of one q or k head per thread: HS % P == 0, qkv 16-byte aligned
 * (then freqs' rows, HS floats, are too). */
template <class T>
static __global__ void rope_rotate_kernel16(T *qkv, const float *freqs, int B, int T_, int NH, int NKV, int HS, float sign) {
    constexpr int P = Pack16<T>::size;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, packs = HS / P, heads = NH + NKV;
    if (idx >= (size_t)B * T_ * heads * packs) return;
    const size_t p = idx % packs, h = idx / packs % heads, bt = idx / packs / heads;
    T *x = qkv + bt * (size_t)(NH + 2 * NKV) * HS + h * HS + p * P;
    const float *fr = freqs + (size_t)(bt % T_) * HS + p * P;
    Pack16<T> v = load16(x);
#pragma unroll
    for (int q = 0; q < P; q += 4) { /* four floats of freqs (two pairs) per 16-byte load */
        const Pack16<float> cs = load16(fr + q);
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
            float a = to_float(v.v[q + j]), b = to_float(v.v[q + j + 1]);
            rope_pair(&a, &b, cs.v + j, sign);
            v.v[q + j] = from_float<T>(a);
            v.v[q + j + 1] = from_float<T>(b);
        }
    }
    store16(x, v);
}

/* freqs_dev: T * HS floats of device memory, filled with the CPU's rope_freqs. */
inline void rope_freqs_to_device(float *freqs_dev, int T, int HS, const RopeConfig *rc) {
    llmcCheck(T > 0 && HS > 0 && HS % 2 == 0, "rope_freqs_to_device: T must be positive and HS positive and even");
    const size_t bytes = (size_t)T * HS * sizeof(float);
    float *h = (float *)mallocCheck(bytes, "rope frequencies");
    rope_freqs(h, T, HS, rc);
    cudaCheck(cudaMemcpy(freqs_dev, h, bytes, cudaMemcpyHostToDevice));
    free(h);
}

template <class T>
static void rope_rotate(T *qkv, const float *freqs, int B, int T_, int NH, int NKV, int HS, float sign, cudaStream_t stream) {
    llmcCheck(B > 0 && T_ > 0 && NH > 0 && NKV > 0 && NKV <= NH && NH % NKV == 0,
              "rope: B, T, NH, NKV must be positive, NKV dividing NH");
    llmcCheck(HS > 0 && HS % 2 == 0, "rope: the head size must be positive and even");
    constexpr int P = Pack16<T>::size;
    const int block = 256;
    const long long pairs = (long long)B * T_ * (NH + NKV) * (HS / 2);
    if (HS % P == 0 && aligned16(qkv) && aligned16(freqs))
        rope_rotate_kernel16<<<ceil_div(pairs / (P / 2), block), block, 0, stream>>>(qkv, freqs, B, T_, NH, NKV, HS, sign);
    else
        rope_rotate_kernel<<<ceil_div(pairs, block), block, 0, stream>>>(qkv, freqs, B, T_, NH, NKV, HS, sign);
    kernelCheck();
}

template <class T>
void rope_forward(T *qkv, const float *freqs, int B, int T_, int NH, int NKV, int HS, cudaStream_t stream) {
    rope_rotate(qkv, freqs, B, T_, NH, NKV, HS, 1.0f, stream);
}

template <class T>
void rope_backward(T *dqkv, const float *freqs, int B, int T_, int NH, int NKV, int HS, cudaStream_t stream) {
    rope_rotate(dqkv, freqs, B, T_, NH, NKV, HS, -1.0f, stream);
}

#endif
