// host_api.cu - cudasim self-test: streams, events, memcpy/memset of every kind, device
// properties, launch-configuration errors, error state, and launch forms (templates with
// explicit and deduced arguments, multi-line launches, launches through a function pointer).
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <type_traits>
#include "test/testing.h"

__global__ void fill_kernel(float* out, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value + i;
}

template <typename T, int Scale>
__global__ void scale_kernel(T* out, const T* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * (T)Scale;
}

// deduced template arguments, including a std::bool_constant tag like llm.c uses
template <typename T, bool Negate>
__global__ void copy_maybe_negate_kernel(T* out, const T* in, int n, std::bool_constant<Negate>) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = Negate ? -in[i] : in[i];
}

__global__ void index_2d_kernel(int* out, int width) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    out[y * width + x] = (int)(gridDim.x * 1000 + blockDim.y * 100 + y * 10 + x);
}

__global__ void empty_kernel(void) {}

static int expect_error(const char* name, cudaError_t want) {
    cudaError_t e = cudaGetLastError();
    test_report(e == want, name, "got %s, want %s", cudaGetErrorName(e), cudaGetErrorName(want));
    return e == want;
}

int main(void) {
    const int n = 1000;
    float *d_a, *d_b, *h_pinned;
    test_report(cudaMalloc(&d_a, n * sizeof(float)) == cudaSuccess && cudaMalloc(&d_b, n * sizeof(float)) == cudaSuccess &&
                    cudaMallocHost(&h_pinned, n * sizeof(float)) == cudaSuccess,
                "memory: cudaMalloc / cudaMallocHost", "allocation failed");
    cudaStream_t s;
    cudaEvent_t start, stop;
    cudaStreamCreate(&s);
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, s);
    fill_kernel<<<(n + 255) / 256, 256, 0, s>>>(d_a, 2.0f, n);
    cudaMemcpyAsync(d_b, d_a, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    scale_kernel<float, 3><<<(n + 127) / 128,
                             128, 0,
                             s>>>(d_b, d_b, n);  // multi-line, explicit template arguments
    cudaMemcpyAsync(h_pinned, d_b, n * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaEventRecord(stop, s);
    cudaEventSynchronize(stop);
    cudaStreamSynchronize(s);
    float ms = -1.0f;
    test_report(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms >= 0.0f, "events: elapsed time", "ms %g", ms);
    static float want[1000];
    for (int i = 0; i < n; i++) want[i] = 3.0f * (2.0f + i);
    test_close("streams: kernel -> D2D copy -> templated kernel -> D2H in stream order", h_pinned, want, n, 0.0, 0.0);

    copy_maybe_negate_kernel<<<4, 256>>>(d_b, d_a, n, std::bool_constant<true>{});
    float h[1000];
    cudaMemcpy(h, d_b, sizeof h, cudaMemcpyDeviceToHost);
    test_report(h[7] == -9.0f && h[999] == -1001.0f, "launch: deduced template kernel with bool_constant", "h[7] %g", h[7]);

    void (*fn)(float*, float, int) = fill_kernel;
    fn<<<dim3(4), dim3(256)>>>(d_a, -1.0f, n);
    cudaMemcpy(h, d_a, sizeof h, cudaMemcpyDeviceToHost);
    test_report(h[10] == 9.0f, "launch: through a function pointer", "h[10] %g", h[10]);

    int* d_idx;
    int hi[4 * 6];
    cudaMallocManaged(&d_idx, sizeof hi);
    index_2d_kernel<<<dim3(2, 3), dim3(2, 2)>>>(d_idx, 4);
    cudaDeviceSynchronize();
    test_report(d_idx[5 * 4 + 3] == 2000 + 200 + 53, "launch: 2-D grid and block, managed memory read on host", "got %d", d_idx[23]);
    memcpy(hi, d_idx, sizeof hi);

    cudaMemset(d_a, 0, n * sizeof(float));
    cudaMemcpy(h, d_a, sizeof h, cudaMemcpyDefault);
    test_report(h[0] == 0.0f && h[999] == 0.0f, "memset + cudaMemcpyDefault", "h[0] %g", h[0]);

    // error paths: invalid launches do not run and set the error returned by cudaGetLastError
    empty_kernel<<<1, 1025>>>();
    expect_error("config: 1025 threads per block", cudaErrorInvalidConfiguration);
    test_report(cudaGetLastError() == cudaSuccess, "config: cudaGetLastError resets the error", "still set");
    empty_kernel<<<1, dim3(1, 1, 65)>>>();
    expect_error("config: block.z = 65", cudaErrorInvalidConfiguration);
    empty_kernel<<<dim3(1, 65536), 32>>>();
    expect_error("config: grid.y = 65536", cudaErrorInvalidConfiguration);
    empty_kernel<<<dim3(1, 1, 70000), 32>>>();
    expect_error("config: grid.z = 70000", cudaErrorInvalidConfiguration);
    empty_kernel<<<0, 32>>>();
    expect_error("config: empty grid", cudaErrorInvalidConfiguration);
    empty_kernel<<<1, 32, 49 * 1024>>>();
    cudaError_t peek = cudaPeekAtLastError();
    expect_error("config: 49 KiB dynamic smem without opt-in", cudaErrorInvalidValue);
    test_report(peek == cudaErrorInvalidValue, "errors: cudaPeekAtLastError sees the error", "got %s", cudaGetErrorName(peek));
    test_report(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) == cudaErrorInvalidValue,
                "config: cudaFuncSetAttribute above 227 KiB fails", "accepted");
    cudaGetLastError();
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
    empty_kernel<<<1, 32, 227 * 1024>>>();
    expect_error("config: 227 KiB after opt-in is accepted", cudaSuccess);
    empty_kernel<<<1, 32, 228 * 1024>>>();
    expect_error("config: 228 KiB is rejected", cudaErrorInvalidValue);
    test_report(cudaMemcpy(h, d_a, (n + 1) * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
                "memcpy: reading past the end of an allocation is rejected", "accepted");
    test_report(cudaMemcpy(d_a, h, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
                "memcpy: host pointer given as the device side is rejected", "accepted");
    cudaGetLastError();

    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    test_report(strcmp(p.name, "cudasim (H200-shaped)") == 0 && p.major == 9 && p.minor == 0 && p.multiProcessorCount == 132 &&
                    p.sharedMemPerBlockOptin == 227 * 1024 && p.sharedMemPerMultiprocessor == 228 * 1024 &&
                    p.maxThreadsPerBlock == 1024 && p.totalGlobalMem > 140e9 && p.sharedMemPerBlock == 48 * 1024,
                "device: H200-shaped properties", "name '%s' sm_%d%d, %d SMs", p.name, p.major, p.minor, p.multiProcessorCount);
    int v = 0, count = 0, dev = -1;
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    cudaGetDeviceCount(&count);
    cudaGetDevice(&dev);
    test_report(v == 227 * 1024 && count == 1 && dev == 0 && cudaSetDevice(0) == cudaSuccess, "device: attributes, count, get/set", "optin %d", v);
    char bus_id[32] = "";
    test_report(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0) == cudaSuccess && strcmp(bus_id, "0000:00:00.0") == 0,
                "device: cudaDeviceGetPCIBusId is 0000:00:00.0", "got '%s'", bus_id);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    test_report(total_b > 140e9 && free_b < total_b && total_b - free_b >= 2 * n * sizeof(float), "device: cudaMemGetInfo", "free %zu total %zu", free_b, total_b);
    /* pinned host memory is the host's: cudaMallocHost leaves the device's free memory as it was */
    float *h_more = NULL;
    size_t free_pinned = 0;
    cudaMallocHost(&h_more, (size_t)64 << 20);
    cudaMemGetInfo(&free_pinned, &total_b);
    test_report(h_more && free_pinned == free_b, "device: cudaMallocHost leaves cudaMemGetInfo's free bytes alone",
                "free %zu before, %zu after 64 MiB pinned", free_b, free_pinned);
    cudaFreeHost(h_more);
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fill_kernel, 256, 0);
    test_report(blocks == 8, "device: occupancy of 256-thread blocks is 8 per SM", "got %d", blocks);
    test_report(strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument") == 0, "errors: cudaGetErrorString", "got '%s'",
                cudaGetErrorString(cudaErrorInvalidValue));

    cudaEventDestroy(start), cudaEventDestroy(stop), cudaStreamDestroy(s);
    test_report(cudaFree(d_a) == cudaSuccess && cudaFree(d_b) == cudaSuccess && cudaFreeHost(h_pinned) == cudaSuccess &&
                    cudaFree(d_idx) == cudaSuccess,
                "memory: frees", "a free failed");
    test_report(cudaFree(d_a) == cudaErrorInvalidValue, "memory: double cudaFree is rejected", "accepted");
    cudaGetLastError();
    return test_exit_code();
}
