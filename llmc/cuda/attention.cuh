/*
 * attention.cuh - causal multi-head self-attention as our own flash attention (CUDA twin of
 * llmc/cpu/attention.h). No (T, T) matrix ever exists in memory: the forward keeps a running
 * max and sum per query row (online softmax) and saves only the row's logsumexp; the backward
 * recomputes the probabilities from it.
 *
 * inp (B, T, (NH + 2 NKV) HS) holds [q (NH heads) | k (NKV heads) | v (NKV heads)] per
 * position, head h of each at [h*HS, (h+1)*HS) of its part; query head h reads key/value head
 * h / (NH / NKV) (grouped-query attention; GPT-2: NKV = NH, i.e. (B, T, 3C) = [q | k | v]).
 * K and V are read per group in place, never copied; dk, dv sum over the group's query heads.
 * forward:  s[t,u] = q_t . k_u / sqrt(HS) for u <= t;  p[t,u] = softmax_u(s[t, 0..t])
 *           out[b,t,h*HS + i] = sum_u p[t,u] v_u[i];   lse[b,h,t] = log(sum_u exp(s[t,u]))
 * backward (overwrites dinp; every element of dinp is written):
 *           D_t = dout_t . out_t  (= sum_u p[t,u] (dout_t . v_u))
 *           p[t,u] = exp(s[t,u] - lse_t);  dp[t,u] = dout_t . v_u;  ds = p (dp - D_t)
 *           dv_u = sum_t p[t,u] dout_t;  dk_u = sum_t ds[t,u] q_t / sqrt(HS);
 *           dq_t = sum_u ds[t,u] k_u / sqrt(HS)
 * Shapes: out, dout (B, T, C); lse (B, NH, T) fp32; inp, dinp as above; scratch:
 * attention_backward_scratch_floats(B*T, NH, HS) fp32 (the row dots D, then the FA2 backward's
 * dQ accumulator and turn counters).
 *
 * Kernels: CUDA-core fp32 math, one thread per row. The forward and the dq kernel give each
 * thread one query row and stream key/value tiles through shared memory; the dk/dv kernel gives
 * each thread one key row of a key/value head and streams the query tiles of the group's query
 * heads, one head after another. Every output element is written by exactly
 * one thread that sums in a fixed order: no atomics, bit-reproducible. Rows the causal mask
 * cuts off are skipped. Head sizes 16, 32, 64 and 128 are compiled (GPT-2: 64).
 * Differences from the CPU: the online softmax rescales the running sum instead of two passes,
 * so results agree to rounding, not bit for bit.
 */
#ifndef LLMC_CUDA_ATTENTION_CUH
#define LLMC_CUDA_ATTENTION_CUH

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "llmc/cuda/common.cuh"

/* Rows per block (one per thread) and rows per streamed tile, so the static shared memory
 * stays under 48 KiB for every compiled head size. */
template <int HS> struct AttentionTiles {
    static constexpr int rows = 4096 / HS < 64 ? 4096 / HS : 64;   /* threads per block */
    static constexpr int fwd_tile = 4096 / HS < 64 ? 4096 / HS : 64; /* keys per forward tile */
    static constexpr int bwd_tile = 1024 / HS < 32 ? 1024 / HS : 32; /* rows per backward tile */
};

template <int N> __device__ inline float dot_n(const float *a, const float *b) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) s += a[i] * b[i];
    return s;
}

/* The indices of a query-block kernel (the forward and dq; grid (T / BR, B * NH)): block (x,
 * b * NH + h) takes queries [q0, q0 + BR) of head h, one per thread (t: this thread's); C3 =
 * (NH + 2 NKV) HS is the qkv row, kcol and vcol the columns of h's key and value head
 * (h / (NH / NKV): grouped-query attention). */
struct AttnQueryBlock {
    int C, C3, bh, b, h, kcol, vcol, q0, t;
};
template <int HS, int BR> __device__ inline AttnQueryBlock attn_query_block(int NH, int NKV) {
    const int C = NH * HS, bh = blockIdx.y, h = bh % NH, kcol = C + h / (NH / NKV) * HS, q0 = blockIdx.x * BR;
    return {C, (NH + 2 * NKV) * HS, bh, bh / NH, h, kcol, kcol + NKV * HS, q0, q0 + (int)threadIdx.x};
}

/* Keys and values of rows [k0, k0 + ROWS) (columns [kcol, kcol + HS) and [vcol, vcol + HS) of
 * the (T, C3) qkv rows at base) into the fp32 tiles ks, vs; rows at or past T become zeros.
 * The block's NT threads share the copy. */
template <int HS, int ROWS, int NT, class T>
__device__ inline void attn_load_kv_tile(float (*ks)[HS], float (*vs)[HS], const T *base, int C3, int kcol, int vcol,
                                         int k0, int T_) {
    for (int idx = threadIdx.x; idx < ROWS * HS; idx += NT) {
        int j = idx / HS, i = idx % HS, u = k0 + j;
        ks[j][i] = u < T_ ? to_float(base[(size_t)u * C3 + kcol + i]) : 0.0f;
        vs[j][i] = u < T_ ? to_float(base[(size_t)u * C3 + vcol + i]) : 0.0f;
    }
}

template <class T, int HS>
static __global__ void attention_forward_flash_kernel(T *out, float *lse, const T *inp, int T_, int NH, int NKV) {
    constexpr int BR = AttentionTiles<HS>::rows, BC = AttentionTiles<HS>::fwd_tile, CH = 8;
    __shared__ float ks[BC][HS], vs[BC][HS];
    const auto [C, C3, bh, b, h, kcol, vcol, q0, t] = attn_query_block<HS, BR>(NH, NKV);
    const bool active = t < T_;
    const float scale = 1.0f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * C3;
    float q[HS], o[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) {
        q[i] = active ? to_float(base[(size_t)t * C3 + h * HS + i]) : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int kv_end = min(q0 + BR, T_);
    for (int k0 = 0; k0 < kv_end; k0 += BC) {
        __syncthreads(); /* the previous tile is no longer read */
        attn_load_kv_tile<HS, BC, BR>(ks, vs, base, C3, kcol, vcol, k0, T_);
        __syncthreads();
        if (!active) continue;
        const int jmax = min(BC, t - k0 + 1); /* keys u <= t in this tile */
        for (int j = 0; j < jmax; j += CH) {
            float s[CH], cm = m;
#pragma unroll
            for (int jj = 0; jj < CH; jj++) {
                s[jj] = j + jj < jmax ? dot_n<HS>(q, ks[j + jj]) * scale : -INFINITY;
                cm = fmaxf(cm, s[jj]);
            }
            float corr = expf(m - cm); /* 0 on the first chunk (m = -inf), where l = o = 0 */
            l *= corr;
#pragma unroll
            for (int i = 0; i < HS; i++) o[i] *= corr;
            m = cm;
#pragma unroll
            for (int jj = 0; jj < CH; jj++) {
                if (j + jj >= jmax) break;
                float p = expf(s[jj] - m);
                l += p;
#pragma unroll
                for (int i = 0; i < HS; i++) o[i] += p * vs[j + jj][i];
            }
        }
    }
    if (!active) return;
    const float inv = 1.0f / l;
    T *dst = out + ((size_t)b * T_ + t) * C + h * HS;
#pragma unroll
    for (int i = 0; i < HS; i++) dst[i] = from_float<T>(o[i] * inv);
    lse[(size_t)bh * T_ + t] = m + logf(l);
}

/* D[b,h,t] = dout_t . out_t over the head's HS channels. One warp per position (b, t): each
 * lane reads 16-byte vectors of the row (coalesced), the lanes holding one head's channels
 * combine their partial sums with shuffles (a fixed order: deterministic), and the first of
 * them writes D. Needs 16-byte aligned rows (C a multiple of 16 / sizeof(T)). */
template <class T>
static __global__ void attention_backward_rowdot_kernel(float *D, const T *dout, const T *out, int B, int T_, int NH,
                                                        int HS) {
    constexpr int VEC = 16 / sizeof(T);
    const int C = NH * HS, per_head = HS / VEC; /* lanes per head: a power of two <= 32 */
    const long long pos = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (pos >= (long long)B * T_) return; /* whole warps leave together */
    const int lane = threadIdx.x % 32, b = (int)(pos / T_), t = (int)(pos % T_);
    const T *dr = dout + pos * C, *orow = out + pos * C;
    for (int v0 = 0; v0 < C / VEC; v0 += 32) {
        const int v = v0 + lane;
        float s = 0.0f;
        if (v < C / VEC) {
            const int4 dv = __ldg(reinterpret_cast<const int4 *>(dr + (size_t)v * VEC));
            const int4 ov = __ldg(reinterpret_cast<const int4 *>(orow + (size_t)v * VEC));
            const T *d = reinterpret_cast<const T *>(&dv), *o = reinterpret_cast<const T *>(&ov);
#pragma unroll
            for (int i = 0; i < VEC; i++) s += to_float(d[i]) * to_float(o[i]);
        }
        for (int off = 1; off < per_head; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        const int h = v * VEC / HS;
        if (v < C / VEC && lane % per_head == 0) D[((size_t)b * NH + h) * T_ + t] = s;
    }
}

/* dk, dv for one key row per thread; query tiles stream through shared memory. */
template <class T, int HS>
static __global__ void attention_backward_dkdv_kernel(T *dinp, const T *dout, const T *inp, const float *lse,
                                                      const float *D, int T_, int NH, int NKV) {
    constexpr int BR = AttentionTiles<HS>::rows, BQ = AttentionTiles<HS>::bwd_tile;
    __shared__ float kt[HS][BR], vt[HS][BR]; /* own rows, transposed: thread x reads column x */
    __shared__ float qs[BQ][HS], dos[BQ][HS], lses[BQ], ds_[BQ];
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, G = NH / NKV;
    const int bkv = blockIdx.y, b = bkv / NKV, kvh = bkv % NKV; /* the group's query heads in order */
    const int kcol = C + kvh * HS, vcol = kcol + NKV * HS;
    const int k0 = blockIdx.x * BR, u = k0 + threadIdx.x;
    const bool active = u < T_;
    const float scale = 1.0f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * C3;
    const T *dbase = dout + (size_t)b * T_ * C;
    for (int i = 0; i < HS; i++) {
        kt[i][threadIdx.x] = active ? to_float(base[(size_t)u * C3 + kcol + i]) : 0.0f;
        vt[i][threadIdx.x] = active ? to_float(base[(size_t)u * C3 + vcol + i]) : 0.0f;
    }
    float dk[HS], dv[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) dk[i] = dv[i] = 0.0f;
    for (int h = kvh * G; h < (kvh + 1) * G; h++)
    for (int t0 = k0; t0 < T_; t0 += BQ) {
        const size_t bh = (size_t)b * NH + h;
        __syncthreads();
        for (int idx = threadIdx.x; idx < BQ * HS; idx += BR) {
            int j = idx / HS, i = idx % HS, t = t0 + j;
            qs[j][i] = t < T_ ? to_float(base[(size_t)t * C3 + h * HS + i]) : 0.0f;
            dos[j][i] = t < T_ ? to_float(dbase[(size_t)t * C + h * HS + i]) : 0.0f;
        }
        for (int j = threadIdx.x; j < BQ; j += BR) {
            int t = t0 + j;
            lses[j] = t < T_ ? lse[(size_t)bh * T_ + t] : 0.0f;
            ds_[j] = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        for (int j = 0; j < BQ; j++) {
            int t = t0 + j;
            if (t >= T_) break;
            if (t < u) continue; /* causal: only queries at or after this key */
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                s += qs[j][i] * kt[i][threadIdx.x];
                dp += dos[j][i] * vt[i][threadIdx.x];
            }
            float p = expf(s * scale - lses[j]);
            float ds = p * (dp - ds_[j]) * scale;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                dv[i] += p * dos[j][i];
                dk[i] += ds * qs[j][i];
            }
        }
    }
    if (!active) return;
    T *row = dinp + ((size_t)b * T_ + u) * C3;
#pragma unroll
    for (int i = 0; i < HS; i++) {
        row[kcol + i] = from_float<T>(dk[i]);
        row[vcol + i] = from_float<T>(dv[i]);
    }
}

/* dq for one query row per thread; key/value tiles stream through shared memory. */
template <class T, int HS>
static __global__ void attention_backward_dq_kernel(T *dinp, const T *dout, const T *inp, const float *lse,
                                                    const float *D, int T_, int NH, int NKV) {
    constexpr int BR = AttentionTiles<HS>::rows, BK = AttentionTiles<HS>::bwd_tile;
    __shared__ float qt[HS][BR], dot_[HS][BR];
    __shared__ float ks[BK][HS], vs[BK][HS];
    const auto [C, C3, bh, b, h, kcol, vcol, q0, t] = attn_query_block<HS, BR>(NH, NKV);
    const bool active = t < T_;
    const float scale = 1.0f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * C3;
    for (int i = 0; i < HS; i++) {
        qt[i][threadIdx.x] = active ? to_float(base[(size_t)t * C3 + h * HS + i]) : 0.0f;
        dot_[i][threadIdx.x] = active ? to_float(dout[((size_t)b * T_ + t) * C + h * HS + i]) : 0.0f;
    }
    const float lse_t = active ? lse[(size_t)bh * T_ + t] : 0.0f, D_t = active ? D[(size_t)bh * T_ + t] : 0.0f;
    float dq[HS];
#pragma unroll
    for (int i = 0; i < HS; i++) dq[i] = 0.0f;
    const int kv_end = min(q0 + BR, T_);
    for (int k0 = 0; k0 < kv_end; k0 += BK) {
        __syncthreads();
        attn_load_kv_tile<HS, BK, BR>(ks, vs, base, C3, kcol, vcol, k0, T_);
        __syncthreads();
        if (!active) continue;
        const int jmax = min(BK, t - k0 + 1);
        for (int j = 0; j < jmax; j++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < HS; i++) {
                s += qt[i][threadIdx.x] * ks[j][i];
                dp += dot_[i][threadIdx.x] * vs[j][i];
            }
            float p = expf(s * scale - lse_t);
            float ds = p * (dp - D_t) * scale;
#pragma unroll
            for (int i = 0; i < HS; i++) dq[i] += ds * ks[j][i];
        }
    }
    if (!active) return;
    T *row = dinp + ((size_t)b * T_ + t) * C3 + h * HS;
#pragma unroll
    for (int i = 0; i < HS; i++) row[i] = from_float<T>(dq[i]);
}

inline void attention_check_sizes(const char *who, int B, int T_, int C, int NH, int NKV) {
    if (B <= 0 || T_ <= 0 || C <= 0 || NH <= 0 || C % NH != 0)
        llmc_check_failed(who, "B, T, C, NH must be positive and C divisible by NH", "HINT: a caller bug", __func__,
                          __FILE__, __LINE__);
    if (NKV <= 0 || NH % NKV != 0)
        llmc_check_failed(who, "the key/value head count NKV must be positive and divide NH", "HINT: a caller bug",
                          __func__, __FILE__, __LINE__);
    int HS = C / NH;
    if (HS != 16 && HS != 32 && HS != 64 && HS != 128)
        llmc_check_failed(who, "head size C/NH must be 16, 32, 64 or 128",
                          "HINT: add the head size to the dispatch in llmc/cuda/attention.cuh", __func__, __FILE__,
                          __LINE__);
    if ((long long)B * NH > 65535) llmc_check_failed(who, "B*NH exceeds the 65535 grid rows", "HINT: a caller bug", __func__, __FILE__, __LINE__);
}

/* The one dispatch from a run-time head size (checked above) to the compiled ones: calls
 * fn(std::integral_constant<int, HS>{}). */
template <class Fn> inline void with_head_size(int HS, Fn &&fn) {
    switch (HS) {
    case 16: fn(std::integral_constant<int, 16>{}); break;
    case 32: fn(std::integral_constant<int, 32>{}); break;
    case 64: fn(std::integral_constant<int, 64>{}); break;
    case 128: fn(std::integral_constant<int, 128>{}); break;
    }
}

template <class T, int HS>
static void attention_forward_hs(T *out, float *lse, const T *inp, int B, int T_, int NH, int NKV,
                                 cudaStream_t stream) {
    constexpr int BR = AttentionTiles<HS>::rows;
    attention_forward_flash_kernel<T, HS><<<dim3(ceil_div(T_, BR), B * NH), BR, 0, stream>>>(out, lse, inp, T_, NH, NKV);
    kernelCheck();
}

template <class T, int HS>
static void attention_backward_hs(T *dinp, const T *dout, const T *inp, const float *lse, const float *D, int B,
                                  int T_, int NH, int NKV, cudaStream_t stream) {
    constexpr int BR = AttentionTiles<HS>::rows;
    attention_backward_dkdv_kernel<T, HS><<<dim3(ceil_div(T_, BR), B * NKV), BR, 0, stream>>>(dinp, dout, inp, lse, D,
                                                                                             T_, NH, NKV);
    kernelCheck();
    attention_backward_dq_kernel<T, HS><<<dim3(ceil_div(T_, BR), B * NH), BR, 0, stream>>>(dinp, dout, inp, lse, D,
                                                                                          T_, NH, NKV);
    kernelCheck();
}

/* The CUDA-core kernels, for any storage type (fp32 uses them; the lab compares them). */
template <class T>
void attention_forward_simt(T *out, float *lse, const T *inp, int B, int T_, int C, int NH, int NKV,
                            cudaStream_t stream) {
    attention_check_sizes("attention_forward", B, T_, C, NH, NKV);
    with_head_size(C / NH, [&](auto hs) {
        attention_forward_hs<T, decltype(hs)::value>(out, lse, inp, B, T_, NH, NKV, stream);
    });
}

template <class T>
void attention_backward_rowdot(float *D, const T *dout, const T *out, int B, int T_, int NH, int HS, cudaStream_t stream) {
    if ((uintptr_t)dout % 16 || (uintptr_t)out % 16 || (NH * HS) % (16 / sizeof(T)))
        llmc_check_failed("attention_backward_rowdot", "dout and out rows must be 16-byte aligned",
                          "HINT: a caller bug", __func__, __FILE__, __LINE__);
    const int block = 256, warps = block / 32;
    attention_backward_rowdot_kernel<<<ceil_div((long long)B * T_, warps), block, 0, stream>>>(D, dout, out, B, T_,
                                                                                             NH, HS);
    kernelCheck();
}

template <class T>
void attention_backward_simt(T *dinp, const T *dout, const T *inp, const T *out, const float *lse, int B, int T_,
                             int C, int NH, int NKV, float *scratch, cudaStream_t stream) {
    attention_check_sizes("attention_backward", B, T_, C, NH, NKV);
    const int HS = C / NH;
    attention_backward_rowdot(scratch, dout, out, B, T_, NH, HS, stream);
    with_head_size(HS, [&](auto hs) {
        attention_backward_hs<T, decltype(hs)::value>(dinp, dout, inp, lse, scratch, B, T_, NH, NKV, stream);
    });
}

#include "llmc/cuda/attention_tc.cuh"
#include "llmc/cuda/attention_fa2.cuh"

/* `make USE_CUDNN=1` routes bf16/fp16 attention through cuDNN's fused SDPA (cudnn_att.h: same
 * tensors, same saved logsumexp). */
#ifndef USE_CUDNN
#define USE_CUDNN 0
#endif
#if USE_CUDNN != 0 && USE_CUDNN != 1
#error "USE_CUDNN must be 0 or 1"
#endif
#if USE_CUDNN
#include "llmc/cuda/cudnn_att.h"
#endif

/* bf16/fp16 attention without cuDNN: the FlashAttention-2-class kernels (attention_fa2.cuh)
 * on sm_80+ for head sizes 64 and 128, else the wmma kernels (attention_tc.cuh).
 * LLMC_ATTENTION=wmma in the environment selects the wmma kernels everywhere, LLMC_ATTENTION=fa2
 * (or unset) the default; any other value is an error. */
inline bool attention_use_fa2(int HS) {
    static int fa2 = -1; /* decided once per process */
    if (fa2 < 0) {
        const char *e = getenv("LLMC_ATTENTION");
        if (e && *e && strcmp(e, "fa2") != 0 && strcmp(e, "wmma") != 0) {
            fprintf(stderr, "error: LLMC_ATTENTION=%s: expected fa2 (the default) or wmma\n", e);
            exit(1);
        }
        int dev = 0, major = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        fa2 = major >= 8 && !(e && strcmp(e, "wmma") == 0);
    }
    return fa2 && attention_fa2_supports(HS);
}

/* What attention_forward/backward run for a storage type and head size (for the startup print). */
template <class T> inline const char *attention_impl_name(int HS) {
    if (sizeof(T) == 4) return "own flash attention, CUDA cores (fp32)";
    if (USE_CUDNN) return "cuDNN fused SDPA (USE_CUDNN=1)";
    return attention_use_fa2(HS) ? "own FlashAttention-2-class attention, tensor cores (mma.sync, ldmatrix, cp.async)"
                                 : "own flash attention, tensor cores (wmma)";
}

/* fp32 runs on CUDA cores (the tight reference); bf16 and fp16 on tensor cores, or cuDNN. */
template <class T>
void attention_forward(T *out, float *lse, const T *inp, int B, int T_, int C, int NH, int NKV, cudaStream_t stream) {
    if constexpr (sizeof(T) == 4) attention_forward_simt(out, lse, inp, B, T_, C, NH, NKV, stream);
    else {
#if USE_CUDNN
        attention_forward_cudnn(out, lse, inp, B, T_, C, NH, NKV, (int)std::is_same<T, __half>::value, stream);
#else
        if (C % NH == 0 && attention_use_fa2(C / NH)) attention_forward_fa2(out, lse, inp, B, T_, NH, NKV, C / NH, stream);
        else attention_forward_tc(out, lse, inp, B, T_, C, NH, NKV, stream);
#endif
    }
}

/* The scratch attention_backward needs, in floats, for N = B*T rows: the row dots D (every
 * path) and the FA2 backward's dQ accumulator and turn counters. */
inline size_t attention_backward_scratch_floats(size_t N, int NH, int HS) { return attention_fa2_scratch_floats(N, NH, HS); }

/* scratch: attention_backward_scratch_floats(B*T, NH, C/NH) floats, 16-byte aligned (the cuDNN
 * path keeps its own workspace). */
template <class T>
void attention_backward(T *dinp, const T *dout, const T *inp, const T *out, const float *lse, int B, int T_, int C,
                        int NH, int NKV, float *scratch, cudaStream_t stream) {
    if constexpr (sizeof(T) == 4) attention_backward_simt(dinp, dout, inp, out, lse, B, T_, C, NH, NKV, scratch, stream);
    else {
#if USE_CUDNN
        (void)scratch;
        attention_backward_cudnn(dinp, dout, inp, out, lse, B, T_, C, NH, NKV, (int)std::is_same<T, __half>::value,
                                 stream);
#else
        if (C % NH == 0 && attention_use_fa2(C / NH))
            attention_backward_fa2(dinp, dout, inp, out, lse, B, T_, NH, NKV, C / NH, scratch, stream);
        else attention_backward_tc(dinp, dout, inp, out, lse, B, T_, C, NH, NKV, scratch, stream);
#endif
    }
}

#endif
