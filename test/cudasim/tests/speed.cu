// speed.cu - cudasim speed report (printed, not asserted): launch overhead, barrier fiber-switch
// rate, warp-shuffle rate, and a 2-layer tiny-transformer-shaped forward pass of kernels
// (B=4, T=64, C=128: layernorm, tiled matmuls, GELU, residual, softmax over V=256).
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__global__ void empty_kernel(void) {}

__global__ void barrier_loop_kernel(int* out, int iters) {
    int acc = 0;
    for (int i = 0; i < iters; i++) {
        acc += threadIdx.x;
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = acc;
}

__global__ void shuffle_loop_kernel(float* out, int iters) {
    float v = (float)threadIdx.x;
    for (int i = 0; i < iters; i++) v += __shfl_xor_sync(0xffffffffu, v, 1) * 1e-3f;
    out[threadIdx.x] = v;
}

// out (N, C) = layernorm(x) with unit weight, zero bias; one warp per row
__global__ void layernorm_kernel(float* out, const float* x, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const float* xr = x + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += xr[i];
    for (int m = 16; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
    float mean = s / C, q = 0.0f;
    for (int i = lane; i < C; i += 32) q += (xr[i] - mean) * (xr[i] - mean);
    for (int m = 16; m > 0; m /= 2) q += __shfl_xor_sync(0xffffffffu, q, m);
    float rstd = rsqrtf(q / C + 1e-5f);
    for (int i = lane; i < C; i += 32) out[(size_t)row * C + i] = (xr[i] - mean) * rstd;
}

// out (N, OC) = inp (N, IC) @ w (OC, IC)^T, 16x16 shared-memory tiles
__global__ void matmul_tiled_kernel(float* out, const float* inp, const float* w, int N, int IC, int OC) {
    __shared__ float a[16][17];
    __shared__ float b[16][17];
    int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < IC; k0 += 16) {
        a[threadIdx.y][threadIdx.x] = r < N && k0 + (int)threadIdx.x < IC ? inp[(size_t)r * IC + k0 + threadIdx.x] : 0.0f;
        int wr = blockIdx.x * 16 + threadIdx.y;
        b[threadIdx.y][threadIdx.x] = wr < OC && k0 + (int)threadIdx.x < IC ? w[(size_t)wr * IC + k0 + threadIdx.x] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16; k++) acc += a[threadIdx.y][k] * b[threadIdx.x][k];
        __syncthreads();
    }
    if (r < N && c < OC) out[(size_t)r * OC + c] = acc;
}

__global__ void gelu_kernel(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
}

__global__ void residual_kernel(float* x, const float* r, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += r[i];
}

__global__ void softmax_kernel(float* p, const float* logits, int N, int V) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    float mx = -INFINITY;
    for (int i = lane; i < V; i += 32) mx = fmaxf(mx, logits[(size_t)row * V + i]);
    for (int m = 16; m > 0; m /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
    float s = 0.0f;
    for (int i = lane; i < V; i += 32) s += expf(logits[(size_t)row * V + i] - mx);
    for (int m = 16; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffffu, s, m);
    for (int i = lane; i < V; i += 32) p[(size_t)row * V + i] = expf(logits[(size_t)row * V + i] - mx) / s;
}

static float* dmalloc(size_t n, float fill_scale) {
    float* d;
    cudaMalloc(&d, n * sizeof(float));
    float* h = new float[n];
    for (size_t i = 0; i < n; i++) h[i] = fill_scale * (float)((i * 2654435761u) % 1000) / 1000.0f - fill_scale / 2;
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    delete[] h;
    return d;
}

static void matmul(float* out, const float* inp, const float* w, int N, int IC, int OC) {
    matmul_tiled_kernel<<<dim3((OC + 15) / 16, (N + 15) / 16), dim3(16, 16)>>>(out, inp, w, N, IC, OC);
}

int main(void) {
    int* d_i;
    float* d_f;
    cudaMalloc(&d_i, sizeof(int));
    cudaMalloc(&d_f, 1024 * sizeof(float));
    double t0 = now_s();
    const int launches = 2000;
    for (int i = 0; i < launches; i++) empty_kernel<<<1, 1>>>();
    double t_launch = (now_s() - t0) / launches;

    const int iters = 200;
    t0 = now_s();
    barrier_loop_kernel<<<1, 1024>>>(d_i, iters);
    double t_bar = now_s() - t0;
    t0 = now_s();
    shuffle_loop_kernel<<<1, 1024>>>(d_f, iters);
    double t_shfl = now_s() - t0;

    const int B = 4, T = 64, C = 128, V = 256, L = 2, N = B * T;
    float *x = dmalloc((size_t)N * C, 2.0f), *ln = dmalloc((size_t)N * C, 0), *qkv = dmalloc((size_t)N * 3 * C, 0);
    float *h = dmalloc((size_t)N * 4 * C, 0), *proj = dmalloc((size_t)N * C, 0), *logits = dmalloc((size_t)N * V, 0);
    float *probs = dmalloc((size_t)N * V, 0), *wqkv = dmalloc((size_t)3 * C * C, 0.1f), *wfc = dmalloc((size_t)4 * C * C, 0.1f);
    float *wproj = dmalloc((size_t)4 * C * C, 0.1f), *wout = dmalloc((size_t)V * C, 0.1f);
    t0 = now_s();
    int kernels = 0;
    for (int l = 0; l < L; l++) {
        layernorm_kernel<<<N / 4, 128>>>(ln, x, N, C), kernels++;
        matmul(qkv, ln, wqkv, N, C, 3 * C), kernels++;
        matmul(proj, qkv, wqkv, N, C, C), kernels++;  // stands in for attention output projection
        residual_kernel<<<(N * C + 255) / 256, 256>>>(x, proj, N * C), kernels++;
        layernorm_kernel<<<N / 4, 128>>>(ln, x, N, C), kernels++;
        matmul(h, ln, wfc, N, C, 4 * C), kernels++;
        gelu_kernel<<<(N * 4 * C + 255) / 256, 256>>>(h, N * 4 * C), kernels++;
        matmul(proj, h, wproj, N, 4 * C, C), kernels++;
        residual_kernel<<<(N * C + 255) / 256, 256>>>(x, proj, N * C), kernels++;
    }
    layernorm_kernel<<<N / 4, 128>>>(ln, x, N, C), kernels++;
    matmul(logits, ln, wout, N, C, V), kernels++;
    softmax_kernel<<<N / 4, 128>>>(probs, logits, N, V), kernels++;
    cudaDeviceSynchronize();
    double t_model = now_s() - t0;
    float p0[V];
    cudaMemcpy(p0, probs, sizeof p0, cudaMemcpyDeviceToHost);
    double psum = 0;
    for (int i = 0; i < V; i++) psum += p0[i];
    double flops = 2.0 * N * C * (3 * C + C + 4 * C + 4 * C) * L + 2.0 * N * C * V;

    printf("cudasim speed (not asserted):\n");
    printf("  empty launch <<<1,1>>>:          %8.2f us per launch\n", t_launch * 1e6);
    printf("  __syncthreads, 1024 threads:     %8.1f ns per thread-barrier (%.1f M fiber switches/s)\n",
           t_bar / (1024.0 * iters) * 1e9, 1024.0 * iters / t_bar / 1e6);
    printf("  __shfl_xor_sync, 1024 threads:   %8.1f ns per lane-shuffle\n", t_shfl / (1024.0 * iters) * 1e9);
    printf("  2-layer tiny transformer fwd (B=%d T=%d C=%d V=%d): %d kernels in %.3f s (%.1f MFLOP/s simulated); "
           "softmax row sum %.6f\n", B, T, C, V, kernels, t_model, flops / t_model / 1e6, psum);
    int ok = fabs(psum - 1.0) < 1e-4;
    printf("%s: speed workload ran (softmax row sums to 1)\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
