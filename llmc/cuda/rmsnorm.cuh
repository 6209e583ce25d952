/*
 * rmsnorm.cuh - RMSNorm over the last dimension (Llama; CUDA twin of llmc/cpu/rmsnorm.h), plus
 * the residual add fused in front of it (as layernorm.cuh does for LayerNorm).
 *
 * forward:  rstd = 1/sqrt(sum(x^2)/C + eps); out = x * rstd * weight               (overwrites)
 * fused_residual_rmsnorm_forward: residual = inp1 + inp2 (rounded to T), then the RMSNorm of the
 *           stored residual - bit-identical to residual_forward followed by rmsnorm_forward,
 *           because both read the rounded residual back through the same row code (rms_row).
 * backward (accumulates into dinp and dweight):
 *           xhat = x * rstd; dnorm = dout * weight
 *           dinp += rstd * (dnorm - xhat * mean(dnorm * xhat)); dweight += sum_rows(dout * xhat)
 * Shapes: out, inp, dinp, dout, residual, inp1, inp2 (N, C) with N = B*T; rstd (N) fp32;
 *         weight, dweight (C).
 * Layout: one warp per row for the row-wise work; a lane takes units lane, lane + 32, ... of a
 * row, a unit being one 16-byte pack (common.cuh's Pack16) when C is a whole number of packs and
 * the pointers are 16-byte aligned (the *_kernel16 forms), else one element.
 * dweight is reduced deterministically: fixed chunks of RMS_ROWS_PER_CHUNK rows write partial
 * sums to `scratch` (rmsnorm_backward_scratch_floats(N, C) floats), then one pass adds the
 * chunks in order. The backward runs as one kernel over packs (rmsnorm_backward_fused16_kernel)
 * when C is a whole number of packs up to 256 packs (8 per lane: bf16/fp16 C <= 2048, fp32
 * C <= 1024) and the pointers are aligned; otherwise as the dinp kernel plus a column-sum kernel
 * (two passes). Up to 4 packs per lane the row's weight, dout and xhat stay in registers; from 5
 * to 8 (the "wide" form) only the dweight sums do, and a row's dout, inp and the weight are read
 * a second time for the dinp update (from cache) instead of held.
 */
#ifndef LLMC_CUDA_RMSNORM_CUH
#define LLMC_CUDA_RMSNORM_CUH

#include <initializer_list>
#include <type_traits>

#include "llmc/cuda/common.cuh"

enum { RMS_WARPS_PER_BLOCK = 8, RMS_ROWS_PER_CHUNK = 256 };

/* One element, shaped like a Pack16 so that one row body serves both forms. */
template <class T> struct Pack1 {
    static constexpr int size = 1;
    T v[1];
};
template <class T, bool PACKED> using RmsUnit = typename std::conditional<PACKED, Pack16<T>, Pack1<T>>::type;
template <class T, bool PACKED> __device__ inline RmsUnit<T, PACKED> rms_load(const T *p) {
    if constexpr (PACKED) {
        return load16(p);
    } else {
        Pack1<T> r;
        r.v[0] = *p;
        return r;
    }
}
template <class T, bool PACKED> __device__ inline void rms_store(T *p, const RmsUnit<T, PACKED> &x) {
    if constexpr (PACKED) store16(p, x);
    else *p = x.v[0];
}

/* One row of the forward (one warp; residual-add first when inp2 is not null). */
template <class T, bool PACKED>
__device__ inline void rms_row(T *residual, T *out, float *rstd, const T *inp1, const T *inp2, const T *weight, int N,
                               int C, float eps) {
    constexpr int P = RmsUnit<T, PACKED>::size;
    const int row = blockIdx.x * RMS_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32, units = C / P;
    if (row >= N) return; /* whole warps leave together */
    const size_t base = (size_t)row * C;
    const T *x = inp1 + base;
    if (inp2 != nullptr) {
        /* residual may alias inp1: each lane reads and then writes only its own units */
        for (int u = lane; u < units; u += 32) {
            const RmsUnit<T, PACKED> a = rms_load<T, PACKED>(inp1 + base + (size_t)u * P),
                                     b = rms_load<T, PACKED>(inp2 + base + (size_t)u * P);
            RmsUnit<T, PACKED> s;
#pragma unroll
            for (int j = 0; j < P; j++) s.v[j] = from_float<T>(to_float(a.v[j]) + to_float(b.v[j]));
            rms_store<T, PACKED>(residual + base + (size_t)u * P, s);
        }
        __syncwarp();
        x = residual + base;
    }
    float ss = 0.0f;
    for (int u = lane; u < units; u += 32) {
        const RmsUnit<T, PACKED> a = rms_load<T, PACKED>(x + (size_t)u * P);
#pragma unroll
        for (int j = 0; j < P; j++) ss += to_float(a.v[j]) * to_float(a.v[j]);
    }
    const float s = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    for (int u = lane; u < units; u += 32) {
        const RmsUnit<T, PACKED> a = rms_load<T, PACKED>(x + (size_t)u * P), w = rms_load<T, PACKED>(weight + (size_t)u * P);
        RmsUnit<T, PACKED> o;
#pragma unroll
        for (int j = 0; j < P; j++) o.v[j] = from_float<T>(__fmul_rn(__fmul_rn(to_float(a.v[j]), s), to_float(w.v[j])));
        rms_store<T, PACKED>(out + base + (size_t)u * P, o);
    }
    if (lane == 0) rstd[row] = s;
}

template <class T>
static __global__ void rmsnorm_forward_rowwarp_kernel(T *residual, T *out, float *rstd, const T *inp1, const T *inp2,
                                                      const T *weight, int N, int C, float eps) {
    rms_row<T, false>(residual, out, rstd, inp1, inp2, weight, N, C, eps);
}

template <class T>
static __global__ void rmsnorm_forward_kernel16(T *residual, T *out, float *rstd, const T *inp1, const T *inp2,
                                                const T *weight, int N, int C, float eps) {
    rms_row<T, true>(residual, out, rstd, inp1, inp2, weight, N, C, eps);
}

/* dinp += ..., one warp per row (the two-pass form). */
template <class T>
static __global__ void rmsnorm_backward_dinp_rowwarp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                                            const float *rstd, int N, int C) {
    const int row = blockIdx.x * RMS_WARPS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const size_t base = (size_t)row * C;
    const float s = rstd[row];
    float dot = 0.0f; /* sum(dnorm * xhat) */
    for (int c = lane; c < C; c += 32) dot += to_float(weight[c]) * to_float(dout[base + c]) * (to_float(inp[base + c]) * s);
    dot = warp_sum(dot) / (float)C;
    for (int c = lane; c < C; c += 32) {
        const float xhat = to_float(inp[base + c]) * s, dnorm = to_float(weight[c]) * to_float(dout[base + c]);
        dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + s * (dnorm - xhat * dot));
    }
}

/* Partial column sums of dout * xhat over one chunk of rows: block (32, 8), grid (ceil(C/32),
 * chunks). partial layout: (chunks, C). */
template <class T>
static __global__ void rmsnorm_backward_partial_kernel(float *partial, const T *dout, const T *inp, const float *rstd,
                                                       int N, int C) {
    __shared__ float sw[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
    const int r0 = chunk * RMS_ROWS_PER_CHUNK, r1 = min(r0 + (int)RMS_ROWS_PER_CHUNK, N);
    float acc = 0.0f;
    if (c < C)
        for (int i = r0 + (int)threadIdx.y; i < r1; i += 8) acc += to_float(dout[(size_t)i * C + c]) * (to_float(inp[(size_t)i * C + c]) * rstd[i]);
    sw[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float w = 0.0f;
        for (int k = 0; k < 8; k++) w += sw[k][threadIdx.x];
        partial[(size_t)chunk * C + c] = w;
    }
}

template <class T>
static __global__ void rmsnorm_backward_finish_kernel(T *dweight, const float *partial, int chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float w = 0.0f;
    for (int k = 0; k < chunks; k++) w += partial[(size_t)k * C + c];
    dweight[c] = from_float<T>(to_float(dweight[c]) + w);
}

/* The whole backward in one pass over dout and inp (16-byte packs): block = one chunk of
 * RMS_ROWS_PER_CHUNK rows, warp w takes rows w, w + 8, ...; lane l owns packs l, l + 32, ...,
 * K of them at most (C <= 32 K P). Per row: dinp += ... as above; per lane, dweight partial sums
 * over its rows in registers; then the warps add theirs into shared memory one after another (a
 * fixed order: deterministic) and the block writes its chunk's partials, which
 * rmsnorm_backward_finish_kernel adds in chunk order. Shared memory: C floats.
 * K > 4 (wide): the row's values are not held between the dot and the update but read again,
 * with the same arithmetic in the same order (so the results equal the narrow form's bits). */
/* What the wide backward reads (twice) at pack p of a row that starts at element base. */
template <class T> struct RmsPacks {
    Pack16<T> dout, inp, weight;
};
template <class T>
__device__ inline RmsPacks<T> rms_packs(const T *dout, const T *inp, const T *weight, size_t base, int p) {
    constexpr int P = Pack16<T>::size;
    return {load16(dout + base + (size_t)p * P), load16(inp + base + (size_t)p * P), load16(weight + (size_t)p * P)};
}

template <class T, int K>
static __global__ void rmsnorm_backward_fused16_kernel(T *dinp, float *partial, const T *dout, const T *inp,
                                                       const T *weight, const float *rstd, int N, int C) {
    constexpr int P = Pack16<T>::size;
    constexpr bool WIDE = K > 4;
    extern __shared__ float rms_acc[]; /* (C) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, npacks = C / P;
    const int r0 = blockIdx.x * RMS_ROWS_PER_CHUNK, r1 = min(r0 + (int)RMS_ROWS_PER_CHUNK, N);
    float aw[K][P];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int j = 0; j < P; j++) aw[k][j] = 0.0f;
    if constexpr (WIDE) {
        for (int row = r0 + warp; row < r1; row += RMS_WARPS_PER_BLOCK) {
            const size_t base = (size_t)row * C;
            const float s = rstd[row];
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int p = lane + 32 * k;
                if (p >= npacks) continue;
                const RmsPacks<T> q = rms_packs(dout, inp, weight, base, p);
#pragma unroll
                for (int j = 0; j < P; j++)
                    dot += to_float(q.weight.v[j]) * to_float(q.dout.v[j]) * (to_float(q.inp.v[j]) * s);
            }
            dot = warp_sum(dot) / (float)C;
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int p = lane + 32 * k;
                if (p >= npacks) continue;
                const RmsPacks<T> q = rms_packs(dout, inp, weight, base, p);
                Pack16<T> d = load16(dinp + base + (size_t)p * P);
#pragma unroll
                for (int j = 0; j < P; j++) {
                    const float dy = to_float(q.dout.v[j]), xh = to_float(q.inp.v[j]) * s;
                    d.v[j] = from_float<T>(to_float(d.v[j]) + s * (to_float(q.weight.v[j]) * dy - xh * dot));
                    aw[k][j] += dy * xh;
                }
                store16(dinp + base + (size_t)p * P, d);
            }
        }
    } else {
        float w[K][P];
        load_row16<T, K>(w, weight, npacks, lane);
        for (int row = r0 + warp; row < r1; row += RMS_WARPS_PER_BLOCK)
            norm_backward_row<false, T, K>(dinp, dout, inp, (size_t)row * C, w, 0.0f, rstd[row], npacks, C, aw, aw);
    }
    block_sum_lane_packs<K, P, RMS_WARPS_PER_BLOCK>(rms_acc, partial + (size_t)blockIdx.x * C, aw, npacks, C);
}

/* Whether the forward can run on packs: C a whole number of them, every pointer aligned. */
template <class T> inline bool rmsnorm_packable(int C, std::initializer_list<const void *> ptrs) {
    if (C % Pack16<T>::size != 0) return false;
    for (const void *p : ptrs)
        if (p != nullptr && !aligned16(p)) return false;
    return true;
}

/* The packs per lane the one-pass backward needs for C, or 0 when it cannot run (C not a whole
 * number of packs, unaligned pointers, or more than 8 packs per lane: registers). */
template <class T>
inline int rmsnorm_backward_fused_packs(int C, const void *dinp, const void *dout, const void *inp, const void *weight) {
    if (!rmsnorm_packable<T>(C, {dinp, dout, inp, weight})) return 0;
    const int k = ceil_div(C / Pack16<T>::size, 32);
    return k <= 8 ? k : 0;
}

inline size_t rmsnorm_backward_scratch_floats(int N, int C) {
    return (size_t)ceil_div(N, RMS_ROWS_PER_CHUNK) * (size_t)C;
}

/* residual and inp2 are null for the plain forward. */
template <class T>
static void rmsnorm_forward_launch(T *residual, T *out, float *rstd, const T *inp1, const T *inp2, const T *weight, int N,
                                   int C, float eps, cudaStream_t stream) {
    const int grid = ceil_div(N, RMS_WARPS_PER_BLOCK), block = 32 * RMS_WARPS_PER_BLOCK;
    if (rmsnorm_packable<T>(C, {residual, out, inp1, inp2, weight}))
        rmsnorm_forward_kernel16<<<grid, block, 0, stream>>>(residual, out, rstd, inp1, inp2, weight, N, C, eps);
    else
        rmsnorm_forward_rowwarp_kernel<<<grid, block, 0, stream>>>(residual, out, rstd, inp1, inp2, weight, N, C, eps);
    kernelCheck();
}

template <class T>
void rmsnorm_forward(T *out, float *rstd, const T *inp, const T *weight, int N, int C, float eps, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "rmsnorm_forward: N and C must be positive");
    rmsnorm_forward_launch<T>(nullptr, out, rstd, inp, nullptr, weight, N, C, eps, stream);
}

template <class T>
void fused_residual_rmsnorm_forward(T *residual, T *out, float *rstd, const T *inp1, const T *inp2, const T *weight,
                                    int N, int C, float eps, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "fused_residual_rmsnorm_forward: N and C must be positive");
    llmcCheck(inp2 != residual, "fused_residual_rmsnorm_forward: only inp1 may alias residual");
    rmsnorm_forward_launch<T>(residual, out, rstd, inp1, inp2, weight, N, C, eps, stream);
}

/* scratch: rmsnorm_backward_scratch_floats(N, C) floats of device memory. */
template <class T>
void rmsnorm_backward(T *dinp, T *dweight, const T *dout, const T *inp, const T *weight, const float *rstd, int N, int C,
                      float *scratch, cudaStream_t stream) {
    llmcCheck(N > 0 && C > 0, "rmsnorm_backward: N and C must be positive");
    const int chunks = ceil_div(N, RMS_ROWS_PER_CHUNK);
    const int k = rmsnorm_backward_fused_packs<T>(C, dinp, dout, inp, weight);
    if (k > 0) {
        const size_t smem = (size_t)C * sizeof(float);
        auto launch = [&](auto kernel) {
            if (smem > 48 * 1024) cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            kernel<<<chunks, 32 * RMS_WARPS_PER_BLOCK, smem, stream>>>(dinp, scratch, dout, inp, weight, rstd, N, C);
        };
        if (k == 1) launch(rmsnorm_backward_fused16_kernel<T, 1>);
        else if (k == 2) launch(rmsnorm_backward_fused16_kernel<T, 2>);
        else if (k == 3) launch(rmsnorm_backward_fused16_kernel<T, 3>);
        else if (k == 4) launch(rmsnorm_backward_fused16_kernel<T, 4>);
        else launch(rmsnorm_backward_fused16_kernel<T, 8>); /* the wide form: 5..8 packs per lane */
        kernelCheck();
    } else {
        rmsnorm_backward_dinp_rowwarp_kernel<<<ceil_div(N, RMS_WARPS_PER_BLOCK), 32 * RMS_WARPS_PER_BLOCK, 0, stream>>>(
            dinp, dout, inp, weight, rstd, N, C);
        kernelCheck();
        /* the chunks are grid.y, which a GPU caps at 65535 (N up to 16.7M rows) */
        llmcCheck(chunks <= 65535, "rmsnorm_backward: N / RMS_ROWS_PER_CHUNK exceeds the 65535 grid rows");
        rmsnorm_backward_partial_kernel<<<dim3(ceil_div(C, 32), chunks), dim3(32, 8), 0, stream>>>(scratch, dout, inp,
                                                                                                   rstd, N, C);
        kernelCheck();
    }
    rmsnorm_backward_finish_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dweight, scratch, chunks, C);
    kernelCheck();
}

#endif
