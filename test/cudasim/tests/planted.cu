// planted.cu - kernels with one deliberate bug each, selected by argv[1]. Run by
// test/cudasim/planted_bugs.py, which expects each to be stopped by cudasim with a report
// naming the kernel, block and thread. On a real GPU these are hangs, garbage or crashes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdio.h>
#include <string.h>

#include "llmc/cuda/ptx.cuh"

__global__ void early_return_barrier_kernel(float* out) {
    if (threadIdx.x == 5) return;  // BUG: thread 5 skips the barrier below
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void divergent_barrier_kernel(float* out) {
    if (threadIdx.x < 16) {
        out[threadIdx.x] = 1.0f;
        __syncthreads();  // BUG: two different barriers in divergent branches
    } else {
        __syncthreads();
    }
}

__global__ void shfl_exited_lane_kernel(float* out) {
    int lane = threadIdx.x % 32;
    if (lane == 7) return;  // BUG: lane 7 leaves, yet the full mask names it
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
}

__global__ void shfl_partial_warp_kernel(float* out) {
    float v = (float)threadIdx.x;
    v += __shfl_down_sync(0xffffffffu, v, 1);  // BUG: with 48 threads, warp 1 has 16 lanes
    out[threadIdx.x] = v;
}

__global__ void shfl_mismatch_kernel(float* out) {
    int lane = threadIdx.x % 32;
    if (lane < 16) out[lane] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    else out[lane] = (float)__ballot_sync(0xffffffffu, 1);  // BUG: different primitive, same mask
}

__global__ void barrier_vs_shuffle_deadlock_kernel(float* out) {
    if (threadIdx.x == 0) __syncthreads();  // BUG: lane 0 waits here ...
    else out[threadIdx.x] = __shfl_sync(0xffffffffu, 2.0f, 0);  // ... while the others need it here
}

__global__ void shared_oob_kernel(float* out) {
    __shared__ float buf[32];
    buf[threadIdx.x + 1] = (float)threadIdx.x;  // BUG: thread 31 writes buf[32]
    __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x];
}

__global__ void global_oob_write_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    (void)n;  // BUG: no `if (i < n)` guard
    out[i] = 1.0f;
}

__global__ void global_oob_read_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i + 1];  // BUG: reads one past the end
}

__global__ void read_kernel(float* out, const float* in) { out[threadIdx.x] = in[threadIdx.x]; }

__global__ void misaligned_float4_kernel(float* out, const float* in) {
    float4 v = __ldcs(reinterpret_cast<const float4*>(in + threadIdx.x));  // BUG: in + 1 is not 16-aligned
    out[threadIdx.x] = v.x;
}

// warp matrix misuse: wmma needs 32-byte aligned pointers, 16-byte multiples as leading
// dimensions and whole warps
__global__ void wmma_misuse_kernel(float* out, const __half* in, int shift, unsigned ldm) {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> a;
    nvcuda::wmma::load_matrix_sync(a, in + shift, ldm);  // BUG (per mode): see main
    out[threadIdx.x] = __half2float(a.x[0]);
}

// PTX misuse (llmc/cuda/ptx.cuh): ldmatrix rows must be 16-byte aligned; mma.sync and ldmatrix
// need all 32 lanes; cp.async needs 16-byte aligned addresses and a wait before the thread exits
__global__ void ptx_misuse_kernel(float* out, const float* in, int mode) {
    __shared__ __align__(16) unsigned short s[8 * 16];
    __shared__ __align__(16) float f[4 * 64];
    s[threadIdx.x] = 0;
    __syncthreads();
    if (mode == 0) {
        unsigned r[1];
        ptx_ldmatrix<1, false>(r, s + (threadIdx.x % 8) * 16 + (threadIdx.x == 3));  // BUG: lane 3's row + 2 bytes
        out[threadIdx.x] = (float)r[0];
    } else if (mode == 1) {
        unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
        float acc[4] = {0, 0, 0, 0};
        ptx_mma_m16n8k16<__half>(acc, a, b);  // BUG (16-thread block): not a whole warp
        out[threadIdx.x] = acc[0];
    } else if (mode == 2) {
        ptx_cp_async16(&f[threadIdx.x * 4], in + 1);  // BUG: the source is 4 bytes off 16
        ptx_cp_async_commit();
        ptx_cp_async_wait<0>();
    } else {
        ptx_cp_async16(&f[threadIdx.x * 4], in);  // BUG: no wait before returning
        ptx_cp_async_commit();
    }
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    float *out, *in;
    cudaMalloc(&out, 64 * sizeof(float));  // 256 bytes: ends exactly at the guard page
    cudaMalloc(&in, 64 * sizeof(float));
    cudaMemset(in, 0, 64 * sizeof(float));
    if (!strcmp(mode, "early_return_barrier")) early_return_barrier_kernel<<<2, 64>>>(out);
    else if (!strcmp(mode, "divergent_barrier")) divergent_barrier_kernel<<<1, 32>>>(out);
    else if (!strcmp(mode, "shfl_exited_lane")) shfl_exited_lane_kernel<<<1, 32>>>(out);
    else if (!strcmp(mode, "shfl_partial_warp")) shfl_partial_warp_kernel<<<1, 48>>>(out);
    else if (!strcmp(mode, "shfl_mismatch")) shfl_mismatch_kernel<<<1, 32>>>(out);
    else if (!strcmp(mode, "barrier_vs_shuffle")) barrier_vs_shuffle_deadlock_kernel<<<1, 32>>>(out);
    else if (!strcmp(mode, "shared_oob")) shared_oob_kernel<<<3, 32>>>(out);
    else if (!strcmp(mode, "global_oob_write")) global_oob_write_kernel<<<3, 32>>>(out, 64);
    else if (!strcmp(mode, "global_oob_write_canary")) {
        float* small;
        cudaMalloc(&small, 10 * sizeof(float));  // 40 bytes: the overrun lands in the canary zone
        global_oob_write_kernel<<<1, 11>>>(small, 10);
    } else if (!strcmp(mode, "global_oob_read")) global_oob_read_kernel<<<2, 32>>>(out, in, 64);
    else if (!strcmp(mode, "use_after_free")) {
        cudaFree(in);
        read_kernel<<<1, 32>>>(out, in);  // BUG: in was freed
    } else if (!strcmp(mode, "misaligned_float4")) misaligned_float4_kernel<<<1, 4>>>(out, in + 1);
    else if (!strcmp(mode, "wmma_misaligned")) wmma_misuse_kernel<<<1, 32>>>(out, (const __half*)in, 8, 16);
    else if (!strcmp(mode, "wmma_bad_ldm")) wmma_misuse_kernel<<<1, 32>>>(out, (const __half*)in, 0, 12);
    else if (!strcmp(mode, "wmma_partial_warp")) wmma_misuse_kernel<<<1, 16>>>(out, (const __half*)in, 0, 16);
    else if (!strcmp(mode, "ldmatrix_misaligned")) ptx_misuse_kernel<<<1, 32>>>(out, in, 0);
    else if (!strcmp(mode, "mma_partial_warp")) ptx_misuse_kernel<<<1, 16>>>(out, in, 1);
    else if (!strcmp(mode, "cp_async_misaligned")) ptx_misuse_kernel<<<1, 32>>>(out, in, 2);
    else if (!strcmp(mode, "cp_async_no_wait")) ptx_misuse_kernel<<<1, 32>>>(out, in, 3);
    else {
        printf("usage: planted MODE\n");
        return 2;
    }
    cudaDeviceSynchronize();
    printf("planted bug '%s' was NOT detected\n", mode);
    return 0;
}
