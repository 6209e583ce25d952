/*
 * attention_fa2.cuh - FlashAttention-2-class causal attention forward for bf16/fp16 on sm_80+
 * (included by attention.cuh, whose head comment gives the math and the saved logsumexp).
 *
 * Work: a block is 4 warps and owns 64 queries of one (batch, head), 16 per warp; key/value
 * tiles of 64 rows stream through shared memory, double-buffered with cp.async (the next tile
 * is in flight while the current one is multiplied). Everything between the global loads and
 * the output stays in registers, in the PTX fragment layouts of mma.m16n8k16 (ptx.cuh):
 *   - Q: the warp's 16 x HS rows as A fragments, loaded once with ldmatrix.x4;
 *   - S = Q K^T: K rows are the "col" B operand as stored, ldmatrix.x4 (no .trans);
 *   - online softmax on the S accumulators (a lane holds rows g and g+8, 2 columns per 8-key
 *     tile; row max/sum over the 4 lanes of a group with shuffles), in log2 units (exp2);
 *     O and the partial sums are rescaled by exp2(m_old - m_new) at every tile;
 *   - P = the S accumulators rounded to 16 bits and re-packed as the A operand of P V (the C
 *     layout of two 8-key tiles is the A layout of one 16-key step), no shared memory;
 *   - V: the "col" B operand needs consecutive keys per register, V is stored key-major, so
 *     ldmatrix.x4.trans.
 * Only P is rounded to 16 bits (as in every flash attention); S, m, l and O are fp32.
 * Shared memory: Q + 2 x (K, V) tiles of 64 rows, each row padded by 16 bytes (row stride
 * HS + 8 elements: 144 or 272 bytes, 16 mod 128), so the 8 row addresses of one ldmatrix
 * matrix fall in 8 different 16-byte bank groups: conflict-free without a swizzle.
 * 46080 bytes at HS = 64, 87040 at HS = 128 (the launch raises the limit once).
 *
 * GQA-ready: inp rows are [q (NH heads) | k (NKV heads) | v (NKV heads)] x HS, query head h reads
 * key/value head h / (NH / NKV) in place (GPT-2: NKV = NH, the (B, T, 3C) layout).
 * Not run on a GPU yet: verified through cudasim's PTX emulation (test/cudasim/include/ptx_sim.h)
 * against the CPU reference (test/test_cuda_ops.cu). Head sizes 64 and 128.
 */
#ifndef LLMC_CUDA_ATTENTION_FA2_CUH
#define LLMC_CUDA_ATTENTION_FA2_CUH

#include <stdio.h>

#include "common.cuh"
#include "ptx.cuh"

template <class T, int HS> struct AttnFA2 {
    static constexpr int WARPS = 4, BM = 64, BN = 64, LD = HS + 8;
    static constexpr size_t TILE_ELEMS = (size_t)64 * LD;
    static constexpr size_t SMEM_BYTES = 5 * TILE_ELEMS * sizeof(T); /* Q, K[2], V[2] */
    static_assert(HS == 64 || HS == 128, "the FA2 kernel is compiled for head sizes 64 and 128");
};

/* cp.async rows [r0, r0 + 64) of columns [col0, col0 + HS) of a (T, stride) matrix into a
 * [64][HS + 8] tile; rows at or past T become zeros (plain stores: padded V rows must be 0,
 * since P is 0 there and 0 * NaN would not be). */
template <class T, int HS>
__device__ inline void fa2_load_tile(T *tile, const T *src, int stride, int col0, int r0, int T_) {
    constexpr int LD = AttnFA2<T, HS>::LD, VEC = 16 / sizeof(T), PER_ROW = HS / VEC;
    for (int idx = threadIdx.x; idx < 64 * PER_ROW; idx += 128) {
        const int r = idx / PER_ROW, c = (idx % PER_ROW) * VEC, t = r0 + r;
        T *dst = tile + r * LD + c;
        if (t < T_) ptx_cp_async16(dst, src + (size_t)t * stride + col0 + c);
        else *reinterpret_cast<int4 *>(dst) = make_int4(0, 0, 0, 0);
    }
}

template <class T, int HS>
static __global__ void __launch_bounds__(128)
    attention_forward_fa2_kernel(T *out, float *lse, const T *inp, int T_, int NH, int NKV) {
    typedef AttnFA2<T, HS> L;
    constexpr int LD = L::LD, NT = HS / 8; /* 8-column tiles of O */
    extern __shared__ __align__(128) unsigned char attn_fa2_smem[];
    T *qs = (T *)attn_fa2_smem, *ks = qs + L::TILE_ELEMS, *vs = ks + 2 * L::TILE_ELEMS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int stride = (NH + 2 * NKV) * HS;
    /* the last query blocks see the most keys: they go first, so the short ones fill the tail */
    const int q0 = (gridDim.x - 1 - blockIdx.x) * 64;
    const int row0 = q0 + warp * 16 + g; /* this lane's rows: row0 and row0 + 8 */
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * stride;
    const int kcol = NH * HS + kvh * HS, vcol = (NH + NKV) * HS + kvh * HS;
    const int ntiles = (min(q0 + 64, T_) + 63) / 64;

    fa2_load_tile<T, HS>(qs, base, stride, h * HS, q0, T_);
    fa2_load_tile<T, HS>(ks, base, stride, kcol, 0, T_);
    fa2_load_tile<T, HS>(vs, base, stride, vcol, 0, T_);
    ptx_cp_async_commit();

    unsigned qf[HS / 16][4];
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* per row; l: this lane's columns */

    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, k0 = it * 64;
        if (it + 1 < ntiles) { /* prefetch the next tile into the other buffer */
            fa2_load_tile<T, HS>(ks + (buf ^ 1) * L::TILE_ELEMS, base, stride, kcol, k0 + 64, T_);
            fa2_load_tile<T, HS>(vs + (buf ^ 1) * L::TILE_ELEMS, base, stride, vcol, k0 + 64, T_);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>(); /* all but the newest group: this tile (and Q) landed */
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads(); /* every thread's copies of this tile are visible */
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++)
                ptx_ldmatrix<4, false>(qf[kk], qs + (warp * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + kk * 16 + lane / 16 * 8);
        }
        const T *kt = ks + buf * L::TILE_ELEMS, *vt = vs + buf * L::TILE_ELEMS;
        /* S = Q K^T: 16 x 64 as 8 tiles of 8 keys */
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
#pragma unroll
            for (int np = 0; np < 4; np++) {
                unsigned r[4];
                ptx_ldmatrix<4, false>(r, kt + (np * 16 + lane % 8 + lane / 16 * 8) * LD + kk * 16 + (lane / 8) % 2 * 8);
                const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                ptx_mma_m16n8k16<T>(s[2 * np], qf[kk], b0);
                ptx_mma_m16n8k16<T>(s[2 * np + 1], qf[kk], b1);
            }
        }
        /* mask (key > query, key >= T), scale to log2 units, row max over the group's 4 lanes */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + (i / 2) * 8, key = k0 + 8 * j + 2 * tq + i % 2;
                s[j][i] = key <= row && key < T_ ? s[j][i] * scale_log2 : -INFINITY;
                mx[i / 2] = fmaxf(mx[i / 2], s[j][i]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            /* key k0 <= q0 <= row is in every tile a row reaches, so the new max is finite */
            const float m_new = fmaxf(m[r], mx[r]);
            corr[r] = exp2f(m[r] - m_new); /* 0 on the first tile (m = -inf, O = l = 0) */
            m[r] = m_new;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= corr[0], o[n][1] *= corr[0];
            o[n][2] *= corr[1], o[n][3] *= corr[1];
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s[j][i] = exp2f(s[j][i] - m[i / 2]);
                l[i / 2] += s[j][i];
            }
        /* O += P V: the S accumulators of key tiles 2kk, 2kk+1 are the A fragment of step kk */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const unsigned pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                    pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                unsigned r[4];
                ptx_ldmatrix<4, true>(r, vt + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * LD + dp * 16 + lane / 16 * 8);
                const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                ptx_mma_m16n8k16<T>(o[2 * dp], pa, b0);
                ptx_mma_m16n8k16<T>(o[2 * dp + 1], pa, b1);
            }
        }
        __syncthreads(); /* this buffer is refilled by the next iteration's prefetch */
    }
    const int C = NH * HS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int row = row0 + r * 8;
        if (row >= T_) continue;
        const float inv = 1.0f / sum;
        T *dst = out + ((size_t)b * T_ + row) * C + h * HS + 2 * tq;
#pragma unroll
        for (int n = 0; n < NT; n++)
            *reinterpret_cast<unsigned *>(dst + 8 * n) = pack2<T>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
        if (tq == 0) lse[(size_t)bh * T_ + row] = (m[r] + log2f(sum)) * 0.6931471805599453f;
    }
}

template <class T, int HS>
static void attention_forward_fa2_hs(T *out, float *lse, const T *inp, int B, int T_, int NH, int NKV,
                                     cudaStream_t stream) {
    typedef AttnFA2<T, HS> L;
    static bool ready = false;
    attention_tc_smem(attention_forward_fa2_kernel<T, HS>, L::SMEM_BYTES, &ready);
    attention_forward_fa2_kernel<T, HS><<<dim3(ceil_div(T_, 64), B * NH), 128, L::SMEM_BYTES, stream>>>(
        out, lse, inp, T_, NH, NKV);
    kernelCheck();
}

/* out (B, T, NH*HS); lse (B, NH, T); inp (B, T, (NH + 2 NKV) * HS) as in the head comment.
 * HS 64 or 128, NKV dividing NH; inp and out 16-byte aligned. */
template <class T>
void attention_forward_fa2(T *out, float *lse, const T *inp, int B, int T_, int NH, int NKV, int HS,
                           cudaStream_t stream) {
    static_assert(sizeof(T) == 2, "the FA2 attention is for bf16 and fp16");
    attention_check_sizes("attention_forward_fa2", B, T_, NH * HS, NH);
    if ((HS != 64 && HS != 128) || NKV <= 0 || NH % NKV != 0)
        llmc_check_failed("attention_forward_fa2", "head size must be 64 or 128 and NKV must divide NH",
                          "HINT: a caller bug (attention_fa2_supports() says which shapes run here)", __func__,
                          __FILE__, __LINE__);
    attention_tc_check_aligned("attention_forward_fa2", inp, "inp");
    attention_tc_check_aligned("attention_forward_fa2", out, "out");
    if (HS == 64) attention_forward_fa2_hs<T, 64>(out, lse, inp, B, T_, NH, NKV, stream);
    else attention_forward_fa2_hs<T, 128>(out, lse, inp, B, T_, NH, NKV, stream);
}

inline bool attention_fa2_supports(int HS) { return HS == 64 || HS == 128; }

#endif
