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
 * The backward runs as one kernel over 16-byte packs (layernorm_backward_fused16_kernel) when C is
 * a whole number of packs (C % 8 for 16-bit, C % 4 for fp32) up to 128 packs and the pointers are
 * 16-byte aligned; otherwise as the dinp kernel plus a column-sum kernel (two passes).
 * The forward, the fused residual forward and the recompute likewise run over 16-byte packs
 * (*_kernel16) when C is a whole number of packs and the pointers are 16-byte aligned (the
 * forwards: up to 8 packs per lane, the row held in registers), else element by element; the
 * packed forward and the fused one share ln_row_finish16, so they stay bit-identical.
 */
#ifndef LLMC_CUDA_LAYERNORM_CUH
#define LLMC_CUDA_LAYERNORM_CUH

#include <initializer_list>
#include <type_traits>

#include "llmc/cuda/common.cuh"

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

/* ---- packed forwards: one warp per row, lane l holds packs l, l + 32, ... (K at most) ------ */

/* Statistics of a row held in registers (x[k] is pack lane + 32 k; packs >= npacks are
 * ignored), then out = ln_apply(...) stored in packs, and mean/rstd by lane 0. */
template <class T, int K>
__device__ inline void ln_row_finish16(T *out, float *mean, float *rstd, int row, const float (&x)[K][Pack16<T>::size],
                                       const T *weight, const T *bias, int npacks, int C, int lane) {
    constexpr int P = Pack16<T>::size;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (lane + 32 * k < npacks)
#pragma unroll
            for (int j = 0; j < P; j++) s += x[k][j];
    const float m = warp_sum(s) / (float)C;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (lane + 32 * k < npacks)
#pragma unroll
            for (int j = 0; j < P; j++) {
                const float d = x[k][j] - m;
                v += d * d;
            }
    const float rs = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int p = lane + 32 * k;
        if (p >= npacks) continue;
        const Pack16<T> w = load16(weight + (size_t)p * P), b = load16(bias + (size_t)p * P);
        Pack16<T> y;
#pragma unroll
        for (int j = 0; j < P; j++) y.v[j] = from_float<T>(ln_apply(x[k][j], m, rs, to_float(w.v[j]), to_float(b.v[j])));
        store16(out + (size_t)row * C + (size_t)p * P, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

template <class T, int K>
static __global__ void layernorm_forward_kernel16(T *out, float *mean, float *rstd, const T *inp, const T *weight,
                                                  const T *bias, int N, int C) {
    constexpr int P = Pack16<T>::size;
    const int row = blockIdx.x * LN_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32, npacks = C / P;
    if (row >= N) return;
    float x[K][P];
    load_row16<T, K>(x, inp + (size_t)row * C, npacks, lane);
    ln_row_finish16<T, K>(out, mean, rstd, row, x, weight, bias, npacks, C, lane);
}

/* residual = round_T(inp1 + inp2), stored, and its LayerNorm from the rounded values; residual
 * may alias inp1 (each lane reads its packs before writing them). */
template <class T, int K>
static __global__ void fused_residual_layernorm_kernel16(T *residual, T *out, float *mean, float *rstd, const T *inp1,
                                                         const T *inp2, const T *weight, const T *bias, int N, int C) {
    constexpr int P = Pack16<T>::size;
    const int row = blockIdx.x * LN_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32, npacks = C / P;
    if (row >= N) return;
    float x[K][P];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int p = lane + 32 * k;
        const size_t at = (size_t)row * C + (size_t)p * P;
        Pack16<T> a, b;
        if (p < npacks) {
            a = load16(inp1 + at), b = load16(inp2 + at);
#pragma unroll
            for (int j = 0; j < P; j++) a.v[j] = from_float<T>(to_float(a.v[j]) + to_float(b.v[j]));
            store16(residual + at, a);
        }
#pragma unroll
        for (int j = 0; j < P; j++) x[k][j] = p < npacks ? to_float(a.v[j]) : 0.0f;
    }
    ln_row_finish16<T, K>(out, mean, rstd, row, x, weight, bias, npacks, C, lane);
}

/* The recompute, one pack per thread. */
template <class T>
static __global__ void layernorm_recompute_kernel16(T *out, const T *inp, const float *mean, const float *rstd,
                                                    const T *weight, const T *bias, int N, int C) {
    constexpr int P = Pack16<T>::size;
    const size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (idx >= (size_t)N * C) return;
    const size_t row = idx / C;
    const int c = (int)(idx % C);
    const float m = mean[row], s = rstd[row];
    const Pack16<T> x = load16(inp + idx), w = load16(weight + c), b = load16(bias + c);
    Pack16<T> y;
#pragma unroll
    for (int j = 0; j < P; j++) y.v[j] = from_float<T>(ln_apply(to_float(x.v[j]), m, s, to_float(w.v[j]), to_float(b.v[j])));
    store16(out + idx, y);
}

/* Whether C is a whole number of packs and every pointer given is 16-byte aligned. */
template <class T> inline bool ln_packable(int C, std::initializer_list<const void *> ptrs) {
    if (C % Pack16<T>::size != 0) return false;
    for (const void *p : ptrs)
        if (!aligned16(p)) return false;
    return true;
}

/* The packs per lane (1, 2, 4 or 8) a packed forward holds for C, or 0: element by element. */
template <class T> inline int layernorm_forward_packs(int C, std::initializer_list<const void *> ptrs) {
    if (!ln_packable<T>(C, ptrs)) return 0;
    const int k = ceil_div(C / Pack16<T>::size, 32);
    return k <= 1 ? 1 : k <= 2 ? 2 : k <= 4 ? 4 : k <= 8 ? 8 : 0;
}

/* Calls launch(std::integral_constant<int, K>{}) with K = packs (1, 2, 4 or 8). */
template <class Fn> inline void ln_with_packs(int packs, Fn &&launch) {
    if (packs == 1) launch(std::integral_constant<int, 1>{});
    else if (packs == 2) launch(std::integral_constant<int, 2>{});
    else if (packs == 4) launch(std::integral_constant<int, 4>{});
    else launch(std::integral_constant<int, 8>{});
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

/* The whole backward in one pass over dout and inp (16-byte packs, common.cuh): block = one
 * chunk of LN_ROWS_PER_CHUNK rows, warp w takes rows w, w + 8, ...; lane l owns packs l, l + 32,
 * ..., K of them at most (C <= 32 K P). Per row: dinp += ... as above; per lane, dweight and
 * dbias partial sums over its rows in registers; then the warps add theirs into shared memory
 * one after another (a fixed order: deterministic) and the block writes its chunk's partials,
 * which layernorm_backward_finish_kernel adds in chunk order. Shared memory: 2 C floats. */
template <class T, int K>
static __global__ void layernorm_backward_fused16_kernel(T *dinp, float *partial, const T *dout, const T *inp,
                                                         const T *weight, const float *mean, const float *rstd,
                                                         int N, int C) {
    constexpr int P = Pack16<T>::size;
    extern __shared__ float ln_acc[]; /* (2, C) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, npacks = C / P;
    const int r0 = blockIdx.x * LN_ROWS_PER_CHUNK, r1 = min(r0 + (int)LN_ROWS_PER_CHUNK, N);
    float w[K][P], aw[K][P], ab[K][P];
    load_row16<T, K>(w, weight, npacks, lane);
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int j = 0; j < P; j++) aw[k][j] = 0.0f, ab[k][j] = 0.0f;
    for (int row = r0 + warp; row < r1; row += LN_WARPS_PER_BLOCK)
        norm_backward_row<true, T, K>(dinp, dout, inp, (size_t)row * C, w, mean[row], rstd[row], npacks, C, aw, ab);
    float *out = partial + (size_t)blockIdx.x * 2 * C; /* this chunk's (dweight, dbias) partials */
    block_sum_lane_packs<K, P, LN_WARPS_PER_BLOCK>(ln_acc, out, aw, npacks, C);
    block_sum_lane_packs<K, P, LN_WARPS_PER_BLOCK>(ln_acc + C, out + C, ab, npacks, C);
}

/* The packs per lane the fused backward needs for C, or 0 when it cannot run (C not a whole
 * number of packs, unaligned pointers, or more than 4 packs per lane: registers). */
template <class T>
inline int layernorm_backward_fused_packs(int C, const void *dinp, const void *dout, const void *inp, const void *weight) {
    constexpr int P = Pack16<T>::size;
    if (C % P != 0 || !aligned16(dinp) || !aligned16(dout) || !aligned16(inp) || !aligned16(weight)) return 0;
    const int k = ceil_div(C / P, 32);
    return k <= 4 ? k : 0;
}

inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)ceil_div(N, LN_ROWS_PER_CHUNK) * 2 * (size_t)C;
}

template <class T>
void layernorm_forward(T *out, float *mean, float *rstd, const T *inp, const T *weight, const T *bias, int N, int C,
                       cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "layernorm_forward: N and C must be positive");
    const int grid = ceil_div(N, LN_WARPS_PER_BLOCK), block = 32 * LN_WARPS_PER_BLOCK;
    if (int k = layernorm_forward_packs<T>(C, {out, inp, weight, bias})) {
        ln_with_packs(k, [&](auto K) {
            auto kernel = layernorm_forward_kernel16<T, decltype(K)::value>;
            kernel<<<grid, block, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
        });
        kernelCheck();
        return;
    }
    layernorm_forward_rowwarp_kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    kernelCheck();
}

template <class T>
void fused_residual_layernorm_forward(T *residual, T *out, float *mean, float *rstd, const T *inp1, const T *inp2,
                                      const T *weight, const T *bias, int N, int C, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "fused_residual_layernorm_forward: N and C must be positive");
    llmcCheck(inp2 != residual, "fused_residual_layernorm_forward: only inp1 may alias residual");
    if (int k = layernorm_forward_packs<T>(C, {residual, out, inp1, inp2, weight, bias})) {
        ln_with_packs(k, [&](auto K) {
            auto kernel = fused_residual_layernorm_kernel16<T, decltype(K)::value>;
            kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(residual, out, mean, rstd, inp1, inp2,
                                                                                           weight, bias, N, C);
        });
        kernelCheck();
        return;
    }
    fused_residual_layernorm_rowwarp_kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(
        residual, out, mean, rstd, inp1, inp2, weight, bias, N, C);
    kernelCheck();
}

template <class T>
void layernorm_recompute(T *out, const T *inp, const float *mean, const float *rstd, const T *weight, const T *bias,
                         int N, int C, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "layernorm_recompute: N and C must be positive");
    const int block = 256;
    if (ln_packable<T>(C, {out, inp, weight, bias})) {
        layernorm_recompute_kernel16<<<ceil_div((long long)N * C / Pack16<T>::size, block), block, 0, stream>>>(
            out, inp, mean, rstd, weight, bias, N, C);
        kernelCheck();
        return;
    }
    layernorm_recompute_kernel<<<ceil_div((long long)N * C, block), block, 0, stream>>>(out, inp, mean, rstd, weight, bias, N, C);
    kernelCheck();
}

/* scratch: layernorm_backward_scratch_floats(N, C) floats of device memory. */
template <class T>
void layernorm_backward(T *dinp, T *dweight, T *dbias, const T *dout, const T *inp, const T *weight, const float *mean,
                        const float *rstd, int N, int C, float *scratch, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "layernorm_backward: N and C must be positive");
    int chunks = ceil_div(N, LN_ROWS_PER_CHUNK);
    const int k = layernorm_backward_fused_packs<T>(C, dinp, dout, inp, weight);
    if (k > 0) {
        const size_t smem = 2 * (size_t)C * sizeof(float);
        auto launch = [&](auto kernel) {
            if (smem > 48 * 1024) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            kernel<<<chunks, 32 * LN_WARPS_PER_BLOCK, smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N, C);
        };
        if (k == 1) launch(layernorm_backward_fused16_kernel<T, 1>);
        else if (k == 2) launch(layernorm_backward_fused16_kernel<T, 2>);
        else if (k == 3) launch(layernorm_backward_fused16_kernel<T, 3>);
        else launch(layernorm_backward_fused16_kernel<T, 4>);
        kernelCheck();
        layernorm_backward_finish_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dweight, dbias, scratch, chunks, C);
        kernelCheck();
        return;
    }
    layernorm_backward_dinp_rowwarp_kernel<<<ceil_div(N, LN_WARPS_PER_BLOCK), 32 * LN_WARPS_PER_BLOCK, 0, stream>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    kernelCheck();
    /* the chunks are grid.y, which a GPU caps at 65535 (N up to 16.7M rows) */
    llmcCheck(chunks <= 65535, "layernorm_backward: N / LN_ROWS_PER_CHUNK exceeds the 65535 grid rows");
    layernorm_backward_partial_kernel<<<dim3(ceil_div(C, 32), chunks), dim3(32, 8), 0, stream>>>(scratch, dout, inp, mean,
                                                                                                 rstd, N, C);
    kernelCheck();
    layernorm_backward_finish_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dweight, dbias, scratch, chunks, C);
    kernelCheck();
}

#endif
