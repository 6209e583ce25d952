/*
 * cast.cuh - conversions between the storage type and fp32 (parameters to and from the host
 * views, master weights). to T rounds to nearest even. Shapes: dst, src (n).
 */
#ifndef LLMC_CUDA_CAST_CUH
#define LLMC_CUDA_CAST_CUH

#include "llmc/cuda/common.cuh"

template <class Dst, class Src>
static __global__ void cast_kernel(Dst *dst, const Src *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_float<Dst>(to_float(src[i]));
}

/* E elements per thread, E = 16 bytes of the narrower type: the wider side moves two packs
 * (fp32 <-> bf16/fp16: 8 elements, 32 bytes in, 16 out); the last thread also does the tail. */
template <class Dst, class Src>
static __global__ void cast_kernel16(Dst *dst, const Src *src, size_t n) {
    constexpr int E = 16 / (int)(sizeof(Dst) < sizeof(Src) ? sizeof(Dst) : sizeof(Src));
    constexpr int PS = Pack16<Src>::size, PD = Pack16<Dst>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * E;
    if (i + E <= n) {
        Pack16<Src> s[E / PS];
        Pack16<Dst> d[E / PD];
#pragma unroll
        for (int p = 0; p < E / PS; p++) s[p] = load16(src + i + p * PS);
#pragma unroll
        for (int k = 0; k < E; k++) d[k / PD].v[k % PD] = from_float<Dst>(to_float(s[k / PS].v[k % PS]));
#pragma unroll
        for (int p = 0; p < E / PD; p++) store16(dst + i + p * PD, d[p]);
    } else {
        for (; i < n; i++) dst[i] = from_float<Dst>(to_float(src[i]));
    }
}

template <class Dst, class Src>
void cast_copy(Dst *dst, const Src *src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    constexpr int E = 16 / (int)(sizeof(Dst) < sizeof(Src) ? sizeof(Dst) : sizeof(Src));
    if (aligned16(dst) && aligned16(src))
        cast_kernel16<<<ceil_div((long long)ceil_div((long long)n, E), block), block, 0, stream>>>(dst, src, n);
    else
        cast_kernel<<<ceil_div((long long)n, block), block, 0, stream>>>(dst, src, n);
    kernelCheck();
}

#endif
