/*
 * layernorm.cuh - LayerNorm over the last dimension (CUDA twin of llmc/cpu/layernorm.h), plus
 * the residual add fused in front of it.
 *
 * forward:  mean = sum(x)/C; rstd = 1/sqrt(sum((x - mean)^2)/C + 1e-5)     (two-pass, as the CPU)
 *           out = (x - mean) * rstd * weight + bias                          (overwrites)
 * fused_residual_layernorm_forward: residual = inp1 + inp2 (rounded to T), then the LayerNorm
 *           of the stored residual - bit-identical to residual_forward followed by
 *           layernorm_forward, because both read the rounded residual back through the same
 *           row-statistics code (ln_row_stats) and the same ln_apply.
 * recompute: out from the saved mean/rstd with ln_apply: bit-identical to the forward.
 * backward (accumulates into dinp, dweight, dbias):
 *           xhat = (x - mean) * rstd; dnorm = dout * weight
 *           dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
 *           dweight += sum_rows(dout * xhat); dbias += sum_rows(dout)
 * Shapes: out, inp, dinp, dout, residual, inp1, inp2 (N, C) with N = B*T; mean, rstd (N) fp32;
 *         weight, bias, dweight, dbias (C).
 * Layout: one warp per row for the row-wise work. dweight/dbias are reduced deterministically:
 * fixed chunks of LN_ROWS_PER_CHUNK rows write partial sums to `scratch`
 * (layernorm_backward_scratch_floats(N, C) floats), then one pass adds the chunks in order.
 */
#ifndef LLMC_CUDA_LAYERNORM_CUH
#define LLMC_CUDA_LAYERNORM_CUH

#include "common.cuh"

enum { LN_WARPS_PER_BLOCK = 8, LN_ROWS_PER_CHUNK = 256 };

/* The row statistics every LayerNorm kernel uses (one warp, lane = threadIdx.x % 32). */
template <class T>
__device__ inline void ln_row_stats(const T *x, int C, int lane, float *mean, float *rstd) {
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += to_float(x[c]);
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = to_float(x[c]) - m;
        v += d * d;
    }
    v = warp_sum(v) / (float)C;
    *mean = m;
    *rstd = 1.0f / sqrtf(v + 1e-5f);
}

/* out = (x - mean) * rstd * weight + bias with pinned rounding (no contraction differences
 * between the forward and the recompute). */
__device__ inline float ln_apply(float x, float m, float s, float w, float b) {
    return __fmaf_rn(__fmul_rn(x - m, s), w, b);
}

template <class T>
static __global__ void layernorm_forward_rowwarp_kernel(T *out, float *mean, float *rstd, const T *inp, const T *weight,
                                                        const T *bias, int N, int C) {
    int row = blockIdx.x * LN_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return; /* whole warps leave together */
    const T *x = inp + (size_t)row * C;
    float m, s;
    ln_row_stats(x, C, lane, &m, &s);
    T *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) o[c] = from_float<T>(ln_apply(to_float(x[c]), m, s, to_float(weight[c]), to_float(bias[c])));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <class T>
static __global__ void fused_residual_layernorm_rowwarp_kernel(T *residual, T *out, float *mean, float *rstd,
                                                               const T *inp1, const T *inp2, const T *weight,
                                                               const T *bias, int N, int C) {
    int row = blockIdx.x * LN_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    T *x = residual + base;
    /* residual may alias inp1: each lane reads and then writes only its own elements */
    for (int c = lane; c < C; c += 32) x[c] = from_float<T>(to_float(inp1[base + c]) + to_float(inp2[base + c]));
    __syncwarp();
    float m, s;
    ln_row_stats(x, C, lane, &m, &s);
    T *o = out + base;
    for (int c = lane; c < C; c += 32) o[c] = from_float<T>(ln_apply(to_float(x[c]), m, s, to_float(weight[c]), to_float(bias[c])));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

template <class T>
static __global__ void layernorm_recompute_kernel(T *out, const T *inp, const float *mean, const float *rstd,
                                                  const T *weight, const T *bias, int N, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    size_t row = idx / C;
    int c = (int)(idx % C);
    out[idx] = from_float<T>(ln_apply(to_float(inp[idx]), mean[row], rstd[row], to_float(weight[c]), to_float(bias[c])));
}

/* dinp += ..., one warp per row. */
template <class T>
static __global__ void layernorm_backward_dinp_rowwarp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                                              const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * LN_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t base = (size_t)row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = (to_float(inp[base + c]) - m) * s;
        float dnorm = to_float(weight[c]) * to_float(dout[base + c]);
        dnorm_mean += dnorm;
        dnorm_xhat_mean += dnorm * xhat;
    }
    dnorm_mean = warp_sum(dnorm_mean) / (float)C;
    dnorm_xhat_mean = warp_sum(dnorm_xhat_mean) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (to_float(inp[base + c]) - m) * s;
        float dnorm = to_float(weight[c]) * to_float(dout[base + c]);
        float d = s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
        dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + d);
    }
}

/* Partial column sums of dout * xhat and dout over one chunk of rows: block (32, 8), grid
 * (ceil(C/32), chunks). partial layout: (chunks, 2, C). */
template <class T>
static __global__ void layernorm_backward_partial_kernel(float *partial, const T *dout, const T *inp, const float *mean,
                                                         const float *rstd, int N, int C) {
    __shared__ float sw[8][33], sb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    int r0 = chunk * LN_ROWS_PER_CHUNK, r1 = min(r0 + (int)LN_ROWS_PER_CHUNK, N);
    float accw = 0.0f, accb = 0.0f;
    if (c < C) {
        for (int i = r0 + (int)threadIdx.y; i < r1; i += 8) {
            size_t at = (size_t)i * C + c;
            float dy = to_float(dout[at]);
            float xhat = (to_float(inp[at]) - mean[i]) * rstd[i];
            accw += dy * xhat;
            accb += dy;
        }
    }
    sw[threadIdx.y][threadIdx.x] = accw;
    sb[threadIdx.y][threadIdx.x] = accb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float w = 0.0f, b = 0.0f;
        for (int k = 0; k < 8; k++) {
            w += sw[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        partial[(size_t)chunk * 2 * C + c] = w;
        partial[(size_t)chunk * 2 * C + C + c] = b;
    }
}

template <class T>
static __global__ void layernorm_backward_finish_kernel(T *dweight, T *dbias, const float *partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float w = 0.0f, b = 0.0f;
    for (int k = 0; k < chunks; k++) {
        w += partial[(size_t)k * 2 * C + c];
        b += partial[(size_t)k * 2 * C + C + c];
    }
    dweight[c] = from_float<T>(to_float(dweight[c]) + w);
    dbias[c] = from_float<T>(to_float(dbias[c]) + b);
}

inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)ceil_div(N, LN_ROWS_PER_CHUNK) * 2 * (size_t)C;
}

template <class T>
void layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *weight, const T *bias, int N, int C,
                       cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "layernorm_forward: N and C must be positive");
    layernorm_forward_rowwarp_kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    kernelCheck();
}

template <class T>
void fused_residual_layernorm_forward(T *residual, T *out, float *mean, float *rstd, const T *inp1, const T *inp2,
                                      const T *weight, const T *bias, int N, int C, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "fused_residual_layernorm_forward: N and C must be positive");
    llmcCheck(inp2 != residual, "fused_residual_layernorm_forward: only inp1 may alias residual");
    fused_residual_layernorm_rowwarp_kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(
        residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    kernelCheck();
}

template <class T>
void layernorm_recompute(T *out, const T *inp, const float *mean, const float *rstd, const T *weight, const T *bias,
                         int N, int C, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "layernorm_recompute: N and C must be positive");
    const int block = 256;
    layernorm_recompute_kernel<<<ceil_div((long long)N * C, block), block, 0, stream>>>(out, inp, mean, rstd, weight, bias, N, C);
    kernelCheck();
}

/* scratch: layernorm_backward_scratch_floats(N, C) floats of device memory. */
template <class T>
void layernorm_backward(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight, const float *mean,
                        const float *rstd, int N, int C, float *scratch, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "layernorm_backward: N and C must be positive");
    layernorm_backward_dinp_rowwarp_kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    kernelCheck();
    int chunks = ceil_div(N, LN_ROWS_PER_CHUNK);
    /* the chunks are grid.y, which a GPU caps at 65535 (N up to 16.7M rows) */
    llmcCheck(chunks <= 65535, "layernorm_backward: N / LN_ROWS_PER_CHUNK exceeds the 65535 grid rows");
    layernorm_backward_partial_kernel<<<dim3(ceil_div(C, 32), chunks), dim3(32, 8), 0, stream>>>(scratch, dout, inp, mean,
                                                                                                 rstd, N, C);
    kernelCheck();
    layernorm_backward_finish_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dweight, dbias, scratch, chunks, C);
    kernelCheck();
}

#endif
