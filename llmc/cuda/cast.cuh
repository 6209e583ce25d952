/*
 * cast.cuh - conversions between the storage type and fp32 (parameters to and from the host
 * views, master weights). to T rounds to nearest even. Shapes: dst, src (n).
 */
#ifndef LLMC_CUDA_CAST_CUH
#define LLMC_CUDA_CAST_CUH

#include "common.cuh"

template <class Dst, class Src>
static __global__ void cast_kernel(Dst *dst, const Src *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_float<Dst>(to_float(src[i]));
}

template <class Dst, class Src>
void cast_copy(Dst *dst, const Src *src, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    const int block = 256;
    cast_kernel<<<ceil_div((long long)n, block), block, 0, stream>>>(dst, src, n);
    kernelCheck();
}

#endif
