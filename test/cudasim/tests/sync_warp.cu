// sync_warp.cu - cudasim self-test: block reductions with __syncthreads and shared memory,
// every warp shuffle variant (with widths and sub-warp masks), votes, __syncthreads_count,
// cooperative groups, atomics under contention and dynamic shared memory.
// Plain CUDA: `make cudasim-nvcc-check` compiles it with nvcc -arch=sm_90 as well.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include "test/testing.h"

namespace cg = cooperative_groups;

#define CHECK_CUDA(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            printf("FAIL: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

// out[blockIdx.x] = sum of in[block's slice]; shared-memory tree, blockDim.x a power of two.
__global__ void block_reduce_tree_kernel(const float* in, float* out, int n) {
    __shared__ float buf[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}

// One int per thread per check; see the host side for the expected values.
enum { W_IDX, W_IDX8, W_SCAN, W_DOWN, W_DOWN_EDGE, W_XOR, W_BALLOT, W_ANY, W_ALL, W_COUNT_BAR,
       W_HALVES, W_CG_SUM, W_CG_MAX, W_CG_META, W_TILE8, W_BF16, W_HALF, W_DOUBLE, W_LL, W_REDUCE_ADD,
       W_NCHECK };

__global__ void warp_primitives_kernel(int* out) {
    const unsigned full = 0xffffffffu;
    int t = threadIdx.x, lane = t % 32;
    int* o = out + t * W_NCHECK;
    o[W_IDX] = __shfl_sync(full, lane * 10, 3);
    o[W_IDX8] = __shfl_sync(full, lane, 2, 8);
    int x = lane + 1;
    for (int d = 1; d < 32; d *= 2) {
        int y = __shfl_up_sync(full, x, d);
        if (lane >= d) x += y;
    }
    o[W_SCAN] = x;
    int s = lane;
    for (int d = 16; d > 0; d /= 2) s += __shfl_down_sync(full, s, d);
    o[W_DOWN] = s;
    o[W_DOWN_EDGE] = __shfl_down_sync(full, lane + 100, 1);
    float f = (float)lane;
    for (int m = 16; m > 0; m /= 2) f += __shfl_xor_sync(full, f, m);
    o[W_XOR] = (int)f;
    o[W_BALLOT] = (int)__ballot_sync(full, lane % 3 == 0);
    o[W_ANY] = __any_sync(full, lane == 5);
    o[W_ALL] = __all_sync(full, lane < 31) * 10 + __all_sync(full, 1);
    o[W_COUNT_BAR] = __syncthreads_count(t % 4 == 0);
    if (lane < 16) o[W_HALVES] = __shfl_xor_sync(0x0000ffffu, lane, 1);
    else o[W_HALVES] = __shfl_sync(0xffff0000u, lane, 31);
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    o[W_CG_SUM] = (int)cg::reduce(warp, (float)lane, cg::plus<float>());
    o[W_CG_MAX] = cg::reduce(warp, (lane * 7) % 32, cg::greater<int>());
    o[W_CG_META] = (int)(warp.meta_group_rank() * 100 + warp.thread_rank());
    cg::thread_block_tile<8> tile = cg::tiled_partition<8>(block);
    o[W_TILE8] = cg::reduce(tile, (int)tile.thread_rank(), cg::plus<int>()) * 100 + tile.shfl((int)lane, 7);
    __nv_bfloat16 b = __float2bfloat16((float)lane);
    o[W_BF16] = (int)__bfloat162float(__shfl_xor_sync(full, b, 1));
    __half h = __float2half((float)lane);
    o[W_HALF] = (int)__half2float(__shfl_down_sync(full, h, 2, 16));
    double dd = lane * 0.5;
    o[W_DOUBLE] = (int)(2.0 * __shfl_sync(full, dd, 31 - lane));
    long long ll = (long long)lane << 40;
    o[W_LL] = (int)(__shfl_up_sync(full, ll, 4) >> 40);
    o[W_REDUCE_ADD] = (int)__reduce_add_sync(full, (unsigned)lane);
}

__global__ void atomics_kernel(int* count, float* fsum, int* imax, unsigned long long* ull,
                               float* fmax_cas, int* block_counts) {
    __shared__ int local;
    if (threadIdx.x == 0) local = 0;
    __syncthreads();
    int gid = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(fsum, 0.5f);
    atomicMax(imax, (gid * 37) % 1000);
    atomicAdd(ull, 1ull << 33);
    atomicAdd(&local, 2);
    // float max through an atomicCAS loop, the classic idiom
    float v = (float)((gid * 13) % 517);
    int* addr = (int*)fmax_cas;
    int old = *addr, assumed;
    do {
        assumed = old;
        if (__int_as_float(assumed) >= v) break;
        old = atomicCAS(addr, assumed, __float_as_int(v));
    } while (old != assumed);
    __syncthreads();
    if (threadIdx.x == 0) block_counts[blockIdx.x] = atomicExch(&local, -1);
}

// Reverses each block's slice through dynamic shared memory (n floats of smem per block).
__global__ void reverse_dynamic_smem_kernel(const float* in, float* out) {
    extern __shared__ float tile[];
    int base = blockIdx.x * blockDim.x;
    tile[threadIdx.x] = in[base + threadIdx.x];
    __syncthreads();
    out[base + threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

// Sums i % 7 over 16 K floats (64 KiB) of dynamic shared memory: needs the opt-in attribute.
__global__ void big_smem_kernel(float* out) {
    extern __shared__ float big[];
    for (int i = threadIdx.x; i < 16384; i += blockDim.x) big[i] = (float)(i % 7);
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < 16384; i++) s += big[i];
    if (threadIdx.x == 0) out[0] = s;
}

static void test_block_reduce(void) {
    const int n = 1000, threads = 256, blocks = (n + threads - 1) / threads;
    float h[1000], ref[4] = {0, 0, 0, 0}, got[4];
    for (int i = 0; i < n; i++) h[i] = (float)(i % 97), ref[i / threads] += h[i];
    float *d_in, *d_out;
    CHECK_CUDA(cudaMalloc(&d_in, n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_out, blocks * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(d_in, h, n * sizeof(float), cudaMemcpyHostToDevice));
    block_reduce_tree_kernel<<<blocks, threads>>>(d_in, d_out, n);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost));
    test_close("block_reduce_tree: per-block sums of 1000 ints (exact in fp32)", got, ref, 4, 0.0, 0.0);
    CHECK_CUDA(cudaFree(d_in));
    CHECK_CUDA(cudaFree(d_out));
}

static void test_warp_primitives(void) {
    const int threads = 64;
    int* d;
    static int h[64 * W_NCHECK];
    CHECK_CUDA(cudaMalloc(&d, sizeof h));
    warp_primitives_kernel<<<1, threads>>>(d);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    const char* names[W_NCHECK] = {"shfl_idx", "shfl_idx_width8", "shfl_up_scan", "shfl_down_reduce",
        "shfl_down_edge", "shfl_xor_butterfly", "ballot", "any", "all", "syncthreads_count",
        "sub_warp_masks", "cg_reduce_plus", "cg_reduce_greater", "cg_meta_group", "cg_tile8",
        "shfl_bf16", "shfl_half_width16", "shfl_double", "shfl_long_long", "reduce_add_sync"};
    for (int c = 0; c < W_NCHECK; c++) {
        int bad = -1, want = 0;
        for (int t = 0; t < threads && bad < 0; t++) {
            int lane = t % 32, w;
            switch (c) {
            case W_IDX: w = 30; break;
            case W_IDX8: w = (lane & ~7) + 2; break;
            case W_SCAN: w = (lane + 1) * (lane + 2) / 2; break;
            case W_DOWN: w = lane == 0 ? 496 : -1; break;  // only lane 0 holds the full sum
            case W_DOWN_EDGE: w = lane == 31 ? 131 : lane + 101; break;
            case W_XOR: w = 496; break;
            case W_BALLOT: w = 0x49249249; break;
            case W_ANY: w = 1; break;
            case W_ALL: w = 1; break;
            case W_COUNT_BAR: w = threads / 4; break;
            case W_HALVES: w = lane < 16 ? (lane ^ 1) : 31; break;
            case W_CG_SUM: w = 496; break;
            case W_CG_MAX: w = 31; break;
            case W_CG_META: w = (t / 32) * 100 + lane; break;
            case W_TILE8: w = 28 * 100 + (lane & ~7) + 7; break;
            case W_BF16: w = lane ^ 1; break;
            case W_HALF: w = (lane % 16) + 2 < 16 ? lane + 2 : lane; break;
            case W_DOUBLE: w = 31 - lane; break;
            case W_LL: w = lane >= 4 ? lane - 4 : lane; break;
            case W_REDUCE_ADD: w = 496; break;
            default: w = 0;
            }
            if (w != -1 && h[t * W_NCHECK + c] != w) bad = t, want = w;
        }
        char name[64];
        snprintf(name, sizeof name, "warp_primitives: %s", names[c]);
        test_report(bad < 0, name, "thread %d got %d, expected %d", bad, bad < 0 ? 0 : h[bad * W_NCHECK + c], want);
    }
    CHECK_CUDA(cudaFree(d));
}

static void test_atomics(void) {
    const int blocks = 8, threads = 256, n = blocks * threads;
    int *count, *imax, *bc;
    float *fsum, *fmx;
    unsigned long long* ull;
    CHECK_CUDA(cudaMalloc(&count, 4));
    CHECK_CUDA(cudaMalloc(&imax, 4));
    CHECK_CUDA(cudaMalloc(&bc, blocks * 4));
    CHECK_CUDA(cudaMalloc(&fsum, 4));
    CHECK_CUDA(cudaMalloc(&fmx, 4));
    CHECK_CUDA(cudaMalloc(&ull, 8));
    CHECK_CUDA(cudaMemset(count, 0, 4));
    CHECK_CUDA(cudaMemset(imax, 0, 4));
    CHECK_CUDA(cudaMemset(fsum, 0, 4));
    CHECK_CUDA(cudaMemset(fmx, 0, 4));
    CHECK_CUDA(cudaMemset(ull, 0, 8));
    atomics_kernel<<<blocks, threads>>>(count, fsum, imax, ull, fmx, bc);
    CHECK_CUDA(cudaGetLastError());
    int hc, hm, hb[blocks];
    float hs, hf;
    unsigned long long hu;
    CHECK_CUDA(cudaMemcpy(&hc, count, 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&hm, imax, 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&hs, fsum, 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&hf, fmx, 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&hu, ull, 8, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hb, bc, sizeof hb, cudaMemcpyDeviceToHost));
    int want_max = 0;
    for (int g = 0; g < n; g++) want_max = (g * 37) % 1000 > want_max ? (g * 37) % 1000 : want_max;
    test_report(hc == n, "atomics: atomicAdd int from 2048 threads", "got %d", hc);
    test_report(hs == 0.5f * n, "atomics: atomicAdd float", "got %g", hs);
    test_report(hm == want_max, "atomics: atomicMax", "got %d want %d", hm, want_max);
    test_report(hu == (unsigned long long)n << 33, "atomics: atomicAdd unsigned long long", "got %llu", hu);
    test_report(hf == 516.0f, "atomics: float max through atomicCAS loop", "got %g", hf);
    int ok = 1;
    for (int b = 0; b < blocks; b++) ok &= hb[b] == 2 * threads;
    test_report(ok, "atomics: shared-memory atomicAdd per block + atomicExch", "block 0 got %d", hb[0]);
    cudaFree(count), cudaFree(imax), cudaFree(bc), cudaFree(fsum), cudaFree(fmx), cudaFree(ull);
}

static void test_dynamic_smem(void) {
    const int threads = 96, blocks = 3, n = threads * blocks;
    float h[288], got[288], ref[288];
    for (int i = 0; i < n; i++) h[i] = (float)i, ref[i] = (float)((i / threads) * threads + threads - 1 - i % threads);
    float *d_in, *d_out;
    CHECK_CUDA(cudaMalloc(&d_in, sizeof h));
    CHECK_CUDA(cudaMalloc(&d_out, sizeof h));
    CHECK_CUDA(cudaMemcpy(d_in, h, sizeof h, cudaMemcpyHostToDevice));
    reverse_dynamic_smem_kernel<<<blocks, threads, threads * sizeof(float)>>>(d_in, d_out);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost));
    test_close("dynamic_smem: per-block reverse through extern __shared__", got, ref, n, 0.0, 0.0);

    float* d_s;
    const size_t smem = 16384 * sizeof(float);
    CHECK_CUDA(cudaMalloc(&d_s, sizeof(float)));
    big_smem_kernel<<<1, 128, smem>>>(d_s);
    cudaError_t e = cudaGetLastError();
    test_report(e == cudaErrorInvalidValue, "dynamic_smem: 64 KiB without opt-in is rejected", "got %s", cudaGetErrorName(e));
    CHECK_CUDA(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    big_smem_kernel<<<1, 128, smem>>>(d_s);
    CHECK_CUDA(cudaGetLastError());
    float s, want = 0.0f;
    for (int i = 0; i < 16384; i++) want += (float)(i % 7);
    CHECK_CUDA(cudaMemcpy(&s, d_s, sizeof s, cudaMemcpyDeviceToHost));
    test_close("dynamic_smem: 64 KiB after cudaFuncSetAttribute", &s, &want, 1, 0.0, 0.0);
    cudaFree(d_in), cudaFree(d_out), cudaFree(d_s);
}

int main(void) {
    test_block_reduce();
    test_warp_primitives();
    test_atomics();
    test_dynamic_smem();
    return test_exit_code();
}
