// wmma.cu - cudasim self-test of the warp matrix shim (include/mma.h): D = A B + C on a
// 32 x 48 x 32 problem tiled over warps, for __half and __nv_bfloat16, A and B in row- and
// column-major memory, C loaded and D stored in both memory layouts, and an element-wise op on
// the fragment; against a host reference. Plain CUDA: `make cudasim-nvcc-check` compiles it
// with nvcc -arch=sm_90 as well.
#include <mma.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "test/testing.h"

using namespace nvcuda;

enum { M = 32, N = 48, K = 32 };

// One warp per 16 x 16 tile of D; block (32, 2): 2 warps, grid over the remaining tiles.
// A is M x K, B is K x N, C and D are M x N; *_col selects column-major memory.
template <class T, class LA, class LB>
__global__ void gemm_kernel(float* d, const T* a, const T* b, const float* c, int a_col, int b_col, int cd_col,
                            float alpha) {
    int warp = (blockIdx.x * blockDim.y + threadIdx.y);
    int tm = warp / (N / 16), tn = warp % (N / 16);
    if (tm >= M / 16) return;  // whole warps only
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::layout_t cl = cd_col ? wmma::mem_col_major : wmma::mem_row_major;
    const float* cp = cd_col ? c + (size_t)tn * 16 * M + tm * 16 : c + (size_t)tm * 16 * N + tn * 16;
    wmma::load_matrix_sync(acc, cp, cd_col ? M : N, cl);
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= alpha;  // layout-independent op
    for (int k = 0; k < K; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
        wmma::load_matrix_sync(fa, a_col ? a + (size_t)k * M + tm * 16 : a + (size_t)tm * 16 * K + k, a_col ? M : K);
        wmma::load_matrix_sync(fb, b_col ? b + (size_t)tn * 16 * K + k : b + (size_t)k * N + tn * 16, b_col ? K : N);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    float* dp = cd_col ? d + (size_t)tn * 16 * M + tm * 16 : d + (size_t)tm * 16 * N + tn * 16;
    wmma::store_matrix_sync(dp, acc, cd_col ? M : N, cl);
}

template <class T> static float to_f(T v);
template <> float to_f<__half>(__half v) { return __half2float(v); }
template <> float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> static T from_f(float v);
template <> __half from_f<__half>(float v) { return __float2half(v); }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

template <class T, class LA, class LB>
static void run(const char* tname, int cd_col) {
    const int a_col = std::is_same<LA, wmma::col_major>::value, b_col = std::is_same<LB, wmma::col_major>::value;
    T *ha = (T*)malloc(M * K * sizeof(T)), *hb = (T*)malloc(K * N * sizeof(T));
    float *hc = (float*)malloc(M * N * 4), *ref = (float*)malloc(M * N * 4), *got = (float*)malloc(M * N * 4);
    unsigned s = 12345;
    auto rnd = [&]() { s = s * 1664525u + 1013904223u; return (float)((s >> 9) % 2001) / 1000.0f - 1.0f; };
    for (int i = 0; i < M * K; i++) ha[i] = from_f<T>(rnd());
    for (int i = 0; i < K * N; i++) hb[i] = from_f<T>(rnd());
    for (int i = 0; i < M * N; i++) hc[i] = rnd();
    const float alpha = 0.5f;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = alpha * (double)hc[cd_col ? j * M + i : i * N + j];
            for (int k = 0; k < K; k++)
                acc += (double)to_f(ha[a_col ? k * M + i : i * K + k]) * to_f(hb[b_col ? j * K + k : k * N + j]);
            ref[cd_col ? j * M + i : i * N + j] = (float)acc;
        }
    T *da, *db;
    float *dc, *dd;
    cudaMalloc(&da, M * K * sizeof(T));
    cudaMalloc(&db, K * N * sizeof(T));
    cudaMalloc(&dc, M * N * 4);
    cudaMalloc(&dd, M * N * 4);
    cudaMemcpy(da, ha, M * K * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, K * N * sizeof(T), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc, M * N * 4, cudaMemcpyHostToDevice);
    const int tiles = (M / 16) * (N / 16);
    gemm_kernel<T, LA, LB><<<(tiles + 1) / 2, dim3(32, 2)>>>(dd, da, db, dc, a_col, b_col, cd_col, alpha);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(got, dd, M * N * 4, cudaMemcpyDeviceToHost);
    char name[160];
    snprintf(name, sizeof name, "wmma m16n16k16 %s: A %s, B %s, C/D %s", tname, a_col ? "col" : "row",
             b_col ? "col" : "row", cd_col ? "col" : "row");
    if (e != cudaSuccess) test_report(0, name, "%s", cudaGetErrorString(e));
    else test_close(name, got, ref, M * N, 2e-5, 1e-5);  // fp32 accumulation of exact products, K = 32
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
    free(ha), free(hb), free(hc), free(ref), free(got);
}

int main() {
    for (int cd = 0; cd < 2; cd++) {
        run<__half, wmma::row_major, wmma::row_major>("half", cd);
        run<__half, wmma::col_major, wmma::col_major>("half", cd);
        run<__nv_bfloat16, wmma::row_major, wmma::col_major>("bf16", cd);
        run<__nv_bfloat16, wmma::col_major, wmma::row_major>("bf16", cd);
    }
    return test_exit_code();
}
