// layernorm_bf16.cu - cudasim self-test: a layernorm-style kernel with float4 (128-bit) loads,
// one warp per row, and a bf16/fp16 round-trip kernel checked bit-exactly against values
// worked out by hand from round-to-nearest-even.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test/testing.h"

// out = (x - mean) * rstd * w + b per row of C floats; C % 4 == 0, x 16-byte aligned.
// One warp per row: two passes (mean, then variance of x - mean), both with float4 loads.
__global__ void layernorm_rowwarp_float4_kernel(float* out, const float* x, const float* w,
                                                const float* b, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;  // whole warps leave together: no barrier follows
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)row * C);
    float s = 0.0f;
    for (int i = lane; i < C / 4; i += 32) {
        float4 v = xr[i];
        s += v.x + v.y + v.z + v.w;
    }
    for (int m = 16; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
    float mean = s / C;
    float q = 0.0f;
    for (int i = lane; i < C / 4; i += 32) {
        float4 v = __ldcs(xr + i);
        q += (v.x - mean) * (v.x - mean) + (v.y - mean) * (v.y - mean) +
             (v.z - mean) * (v.z - mean) + (v.w - mean) * (v.w - mean);
    }
    for (int m = 16; m > 0; m /= 2) q += __shfl_xor_sync(0xffffffffu, q, m);
    float rstd = rsqrtf(q / C + 1e-5f);
    float4* o = reinterpret_cast<float4*>(out + (size_t)row * C);
    for (int i = lane; i < C / 4; i += 32) {
        float4 v = xr[i], g = reinterpret_cast<const float4*>(w)[i], bb = reinterpret_cast<const float4*>(b)[i];
        o[i] = make_float4((v.x - mean) * rstd * g.x + bb.x, (v.y - mean) * rstd * g.y + bb.y,
                           (v.z - mean) * rstd * g.z + bb.z, (v.w - mean) * rstd * g.w + bb.w);
    }
}

// Round-trips floats through bf16 and fp16, 8 bf16 values per 128-bit int4 store.
__global__ void round_trip_kernel(float* bf_out, float* h_out, const float* in, int n) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    __nv_bfloat16 pack[8];
    for (int k = 0; k < 8; k++) pack[k] = __float2bfloat16(in[i + k]);
    int4 bits = *reinterpret_cast<int4*>(pack);
    __nv_bfloat16 back[8];
    *reinterpret_cast<int4*>(back) = bits;
    for (int k = 0; k < 8; k++) {
        bf_out[i + k] = __bfloat162float(back[k]);
        h_out[i + k] = __half2float(__float2half(in[i + k]));
    }
}

static void test_layernorm(void) {
    const int N = 5, C = 200;  // C/4 = 50: not a multiple of 32 lanes; N not a multiple of warps
    size_t n = (size_t)N * C;
    float *x = (float*)malloc(n * 4), *w = (float*)malloc(C * 4), *b = (float*)malloc(C * 4);
    float *ref = (float*)malloc(n * 4), *got = (float*)malloc(n * 4);
    unsigned seed = 1234u;  // fixed LCG seed
    for (size_t i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, x[i] = 100.0f + (seed >> 8) / 16777216.0f;
    for (int c = 0; c < C; c++) w[c] = 1.0f + 0.01f * c, b[c] = 0.1f * (c % 5);
    for (int r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[r * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m);
        double rs = 1.0 / sqrt(v / C + 1e-5);
        for (int c = 0; c < C; c++) ref[r * C + c] = (float)((x[r * C + c] - m) * rs * w[c] + b[c]);
    }
    float *dx, *dw, *db, *dout;
    cudaMalloc(&dx, n * 4), cudaMalloc(&dw, C * 4), cudaMalloc(&db, C * 4), cudaMalloc(&dout, n * 4);
    cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w, C * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, C * 4, cudaMemcpyHostToDevice);
    const int warps_per_block = 2;
    layernorm_rowwarp_float4_kernel<<<(N + warps_per_block - 1) / warps_per_block, 32 * warps_per_block>>>(dout, dx, dw, db, N, C);
    test_report(cudaGetLastError() == cudaSuccess, "layernorm: launch", "launch failed");
    cudaMemcpy(got, dout, n * 4, cudaMemcpyDeviceToHost);
    // fp32 two-pass vs double two-pass on inputs with mean 100: rstd error dominates
    test_close("layernorm: float4 row-per-warp vs double reference (N=5, C=200, mean 100)", got, ref, n, 1e-4, 1e-4);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout);
    free(x), free(w), free(b), free(ref), free(got);
}

static void test_round_trip(void) {
    const int n = 16;
    // inputs and their bf16 / fp16 round-to-nearest-even results, worked out by hand:
    // bf16 keeps 8 significant bits (ulp at 1 is 2^-7), fp16 keeps 11 (ulp at 1 is 2^-10).
    const float t8 = 1.0f / 256, t11 = 1.0f / 2048;
    float in[16] = {1.0f + t8, 1.0f + 3 * t8, 1.0f + t8 * 1.5f, -2.0f - 2 * t8 * 1.0f, 3.140625f, 0.0f, -0.0f, 65504.0f,
                    1.0f + t11, 1.0f + 3 * t11, 1e-3f, 100000.0f, INFINITY, -INFINITY, 0.1f, 1.0f};
    float want_bf[16] = {1.0f, 1.0f + 4 * t8, 1.0f + 2 * t8, -2.0f, 3.140625f, 0.0f, -0.0f, 65536.0f,
                         1.0f, 1.0f, 131.0f / 131072.0f, 99840.0f, INFINITY, -INFINITY, 0.10009765625f, 1.0f};
    float want_h[16] = {1.00390625f, 1.01171875f, 1.005859375f, -2.0078125f, 3.140625f, 0.0f, -0.0f, 65504.0f,
                        1.0f, 1.0f + 4 * t11, 0.0010004043579101562f, INFINITY, INFINITY, -INFINITY, 0.0999755859375f, 1.0f};
    float *d_in, *d_bf, *d_h;
    cudaMalloc(&d_in, sizeof in), cudaMalloc(&d_bf, sizeof in), cudaMalloc(&d_h, sizeof in);
    cudaMemcpy(d_in, in, sizeof in, cudaMemcpyHostToDevice);
    round_trip_kernel<<<1, 2>>>(d_bf, d_h, d_in, n);
    float bf[16], h[16];
    cudaMemcpy(bf, d_bf, sizeof bf, cudaMemcpyDeviceToHost);
    cudaMemcpy(h, d_h, sizeof h, cudaMemcpyDeviceToHost);
    int bad_bf = -1, bad_h = -1;
    for (int i = 0; i < n; i++) {
        if (memcmp(&bf[i], &want_bf[i], 4) && bad_bf < 0) bad_bf = i;
        if (memcmp(&h[i], &want_h[i], 4) && bad_h < 0) bad_h = i;
    }
    test_report(bad_bf < 0, "round_trip: float -> bf16 -> float, RNE, bit-exact (through int4 stores)",
                "input %.9g: got %.9g want %.9g", bad_bf < 0 ? 0 : in[bad_bf], bad_bf < 0 ? 0 : bf[bad_bf], bad_bf < 0 ? 0 : want_bf[bad_bf]);
    test_report(bad_h < 0, "round_trip: float -> fp16 -> float, RNE, bit-exact",
                "input %.9g: got %.9g want %.9g", bad_h < 0 ? 0 : in[bad_h], bad_h < 0 ? 0 : h[bad_h], bad_h < 0 ? 0 : want_h[bad_h]);
    cudaFree(d_in), cudaFree(d_bf), cudaFree(d_h);
}

int main(void) {
    test_layernorm();
    test_round_trip();
    return test_exit_code();
}
