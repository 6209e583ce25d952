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

#include "llmc/cuda/common.cuh"
#include "llmc/cuda/ptx.cuh"

template <class T, int HS> struct AttnFA2 {
    static constexpr int WARPS = 4, BM = 64, BN = 64, LD = HS + 8;
    static constexpr size_t TILE_ELEMS = (size_t)64 * LD;
    static constexpr size_t SMEM_BYTES = 5 * TILE_ELEMS * sizeof(T); /* Q, K[2], V[2] */
    static_assert(HS == 64 || HS == 128, "the FA2 kernel is compiled for head sizes 64 and 128");
};

/* cp.async rows [r0, r0 + ROWS) of columns [col0, col0 + HS) of a (T, stride) matrix into a
 * [ROWS][HS + 8] tile; rows at or past T become zeros (plain stores: padded V rows must be 0,
 * since P is 0 there and 0 * NaN would not be). */
template <class T, int HS, int ROWS = 64>
__device__ inline void fa2_load_rows(T *tile, const T *src, int stride, int col0, int r0, int T_) {
    constexpr int LD = HS + 8, VEC = 16 / sizeof(T), PER_ROW = HS / VEC;
    for (int idx = threadIdx.x; idx < ROWS * PER_ROW; idx += 128) {
        const int r = idx / PER_ROW, c = (idx % PER_ROW) * VEC, t = r0 + r;
        T *dst = tile + r * LD + c;
        if (t < T_) ptx_cp_async16(dst, src + (size_t)t * stride + col0 + c);
        else *reinterpret_cast<int4 *>(dst) = make_int4(0, 0, 0, 0);
    }
}

/* Fragments from a row-major [rows][LD] shared tile with ldmatrix.x4 (lane l addresses row
 * l%8 of matrix l/8):
 *   fa2_load_a:  the A fragment (16 x 16) at (r0, c0)
 *   fa2_load_b:  B fragments of two 8-wide n tiles whose n index is the tile's row (n0, n0+8),
 *                k along the row (c0 .. c0+15): b[0..1] for n0, b[2..3] for n0+8
 *   fa2_load_bt: B fragments with k along the tile's rows (r0 .. r0+15) and n along the row
 *                (n0, n0+8), through .trans */
template <int LD, class T> __device__ inline void fa2_load_a(unsigned (&a)[4], const T *tile, int r0, int c0) {
    const int lane = threadIdx.x % 32;
    ptx_ldmatrix<4, false>(a, tile + (r0 + lane % 8 + (lane / 8) % 2 * 8) * LD + c0 + lane / 16 * 8);
}
template <int LD, class T> __device__ inline void fa2_load_b(unsigned (&b)[4], const T *tile, int n0, int c0) {
    const int lane = threadIdx.x % 32;
    ptx_ldmatrix<4, false>(b, tile + (n0 + lane % 8 + lane / 16 * 8) * LD + c0 + (lane / 8) % 2 * 8);
}
template <int LD, class T> __device__ inline void fa2_load_bt(unsigned (&b)[4], const T *tile, int r0, int n0) {
    const int lane = threadIdx.x % 32;
    ptx_ldmatrix<4, true>(b, tile + (r0 + lane % 8 + (lane / 8) % 2 * 8) * LD + n0 + lane / 16 * 8);
}
/* acc[n], acc[n+1] += a * (the two n tiles of b) */
template <class T> __device__ inline void fa2_mma2(float (&acc0)[4], float (&acc1)[4], const unsigned (&a)[4],
                                                   const unsigned (&b)[4]) {
    const unsigned b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    ptx_mma_m16n8k16<T>(acc0, a, b0);
    ptx_mma_m16n8k16<T>(acc1, a, b1);
}
/* The accumulators of 8-wide tiles 2kk and 2kk+1 (rows g, g+8) as the A fragment of k step kk */
template <class T> __device__ inline void fa2_pack_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack2<T>(c0[0], c0[1]), a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]), a[3] = pack2<T>(c1[2], c1[3]);
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

    fa2_load_rows<T, HS>(qs, base, stride, h * HS, q0, T_);
    fa2_load_rows<T, HS>(ks, base, stride, kcol, 0, T_);
    fa2_load_rows<T, HS>(vs, base, stride, vcol, 0, T_);
    ptx_cp_async_commit();

    unsigned qf[HS / 16][4];
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* per row; l: this lane's columns */

    for (int it = 0; it < ntiles; it++) {
        const int buf = it & 1, k0 = it * 64;
        if (it + 1 < ntiles) { /* prefetch the next tile into the other buffer */
            fa2_load_rows<T, HS>(ks + (buf ^ 1) * L::TILE_ELEMS, base, stride, kcol, k0 + 64, T_);
            fa2_load_rows<T, HS>(vs + (buf ^ 1) * L::TILE_ELEMS, base, stride, vcol, k0 + 64, T_);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>(); /* all but the newest group: this tile (and Q) landed */
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads(); /* every thread's copies of this tile are visible */
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) fa2_load_a<LD>(qf[kk], qs, warp * 16, kk * 16);
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
                fa2_load_b<LD>(r, kt, np * 16, kk * 16);
                fa2_mma2<T>(s[2 * np], s[2 * np + 1], qf[kk], r);
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
            unsigned pa[4];
            fa2_pack_a<T>(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                unsigned r[4];
                fa2_load_bt<LD>(r, vt, kk * 16, dp * 16);
                fa2_mma2<T>(o[2 * dp], o[2 * dp + 1], pa, r);
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

/* ---- backward: 5 products in one kernel, as FlashAttention-2 does; deterministic ----
 * A pre-pass (attention_backward_rowdot) computes D = rowsum(dO o O). Then a block owns 64 keys
 * of one key/value head (16 per warp) and streams the query tiles of every query head of its
 * group (cp.async, double-buffered, with lse and D). Per query tile:
 *   S^T = K Q^T, dP^T = V dO^T                        (2 products, per warp: 16 keys x BQ)
 *   P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - D)  (in the accumulators)
 *   dV += P^T dO, dK += dS^T Q                          (2 products; P^T, dS^T re-packed as A)
 *   dQ_tile = dS K                                      (1 product, over the block's 64 keys)
 * dK and dV stay in registers for the whole run. dQ sums over key blocks, i.e. over blocks:
 * dS^T goes through shared memory (16-bit, [64 keys][BQ + 8]) so that each warp multiplies a
 * 16-row piece of dQ over all 64 keys (A = dS through ldmatrix.trans, B = K through .trans),
 * then adds it to an fp32 accumulator in global memory (the scratch) IN KEY-BLOCK ORDER: each
 * (batch, head, query tile) has a turn counter; key block n waits until it reads n (blocks
 * 0 .. n-1 have added), adds, and sets n + 1. Key block 0 stores instead of adding, the last
 * contributor (the diagonal block) writes dQ * scale to dinp in T. No float atomics, so the
 * result is reproducible bit for bit. Cost against the 7-product two-kernel scheme it replaces:
 * no recomputation of S and dP (2 of 7 products), one launch less; in exchange each (key block,
 * query tile) pair reads and writes BQ x HS fp32 of accumulator (L2-resident in practice, as
 * FlashAttention-2's atomics are), scratch of B*NH*T*HS floats plus one int per query tile,
 * and a block may wait on its predecessor's store (blocks of a row launch in key-block order:
 * block n waits only on lower-numbered blocks, which the GPU has already scheduled).
 * Query tiles are 64 rows at HS 64 and 16 at HS 128 (register budget: dK and dV alone hold 128
 * registers per thread there). */
template <class T, int HS> struct AttnFA2Bwd {
    static constexpr int LD = HS + 8, BQ = HS == 128 ? 16 : 64, DS_LD = BQ + 8;
    static constexpr size_t KV_ELEMS = (size_t)64 * LD, Q_ELEMS = (size_t)BQ * LD, DS_ELEMS = (size_t)64 * DS_LD;
    /* the dQ product: a warp owns 16 query rows x DQC columns of the tile's BQ x HS */
    static constexpr int DQ_ROW_WARPS = BQ / 16, DQC = HS * DQ_ROW_WARPS / 4;
    static_assert(DQC % 16 == 0 && 4 / DQ_ROW_WARPS * DQC == HS, "the 4 warps tile dQ in 16 x DQC pieces");
    /* K, V | Q[2], dO[2] | dS^T | lse[2][BQ], D[2][BQ] */
    static constexpr size_t BYTES = (2 * KV_ELEMS + 4 * Q_ELEMS + DS_ELEMS) * sizeof(T) + 4 * BQ * sizeof(float);
};

/* rows [r0, r0 + ROWS) of a (B*NH, T) fp32 vector scaled by `mul` into smem; 0 past T */
template <int ROWS>
__device__ inline void fa2_load_rowvec(float *dst, const float *src, int r0, int T_, float mul) {
    for (int i = threadIdx.x; i < ROWS; i += 128) dst[i] = r0 + i < T_ ? src[r0 + i] * mul : 0.0f;
}

/* The A fragment (16 x 16) at (r0, c0) of the transpose of a row-major [rows][LD] shared tile
 * (A's row r is the tile's column r0 + r), through ldmatrix.trans */
template <int LD, class T> __device__ inline void fa2_load_at(unsigned (&a)[4], const T *tile, int r0, int c0) {
    const int lane = threadIdx.x % 32;
    ptx_ldmatrix<4, true>(a, tile + (c0 + lane % 8 + lane / 16 * 8) * LD + r0 + (lane / 8) % 2 * 8);
}

/* The dQ accumulator's turn counters: one int per (batch, head, query tile of BQ rows). Block
 * `turn` of a tile's contributors waits until the counter reads `turn`. Under cudasim blocks run
 * one after another in launch order, so every predecessor has finished: a counter that does not
 * read `turn` there is a block waiting for a later one (a deadlock on the GPU), reported. */
__device__ inline void fa2_wait_turn(const int *counter, int turn) {
    if (threadIdx.x == 0) {
#ifdef CUDASIM
        if (*counter != turn)
            ::cudasim::detail::device_error(__FILE__, __LINE__,
                                            "FA2 backward: dQ turn counter reads %d, this block's turn is %d "
                                            "(a block waiting for a later one deadlocks on the GPU)",
                                            *counter, turn);
#else
        while (*(volatile const int *)counter != turn) __nanosleep(64);
#endif
        __threadfence(); /* the predecessors' accumulator stores are visible after the counter */
    }
}
__device__ inline void fa2_pass_turn(int *counter, int next) {
    __threadfence(); /* this thread's accumulator stores before the counter (after the barrier) */
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(counter, next);
}

template <class T, int HS>
static __global__ void __launch_bounds__(128)
    attention_backward_fa2_kernel(T *dinp, const T *dout, const T *inp, const float *lse, const float *D,
                                  float *dq_acc, int *turns, int T_, int NH, int NKV) {
    typedef AttnFA2Bwd<T, HS> L;
    constexpr int LD = L::LD, BQ = L::BQ, NT = HS / 8, NQ = BQ / 8, DS_LD = L::DS_LD;
    extern __shared__ __align__(128) unsigned char attn_fa2_bwd_smem[];
    T *ks = (T *)attn_fa2_bwd_smem, *vs = ks + L::KV_ELEMS, *qs = vs + L::KV_ELEMS, *dos = qs + 2 * L::Q_ELEMS;
    T *dst_s = dos + 2 * L::Q_ELEMS; /* dS^T: [64 keys][BQ queries] */
    float *lses = (float *)(dst_s + L::DS_ELEMS), *Ds = lses + 2 * BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    const int bkv = blockIdx.y, b = bkv / NKV, kvh = bkv % NKV, G = NH / NKV;
    const int stride = (NH + 2 * NKV) * HS;
    const int kb = blockIdx.x, k0 = kb * 64, key0 = k0 + warp * 16 + g; /* this lane's keys: key0, key0 + 8 */
    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = 1.4426950408889634f * scale;
    const T *base = inp + (size_t)b * T_ * stride, *dbase = dout + (size_t)b * T_ * NH * HS;
    const int kcol = NH * HS + kvh * HS, vcol = (NH + NKV) * HS + kvh * HS;
    const int nq = (T_ - k0 + BQ - 1) / BQ, nit = G * nq; /* (query head, query tile) pairs */
    const int qtiles = (T_ + BQ - 1) / BQ;
    /* this warp's 16 x DQC piece of the dQ tile: rows dq_r0.., columns dq_c0.. */
    const int dq_r0 = warp % L::DQ_ROW_WARPS * 16, dq_c0 = warp / L::DQ_ROW_WARPS * L::DQC;

    /* the tile pair `it` (head kvh*G + it/nq, queries from k0 + (it%nq)*BQ) into buffer it&1 */
    auto load = [&](int it) {
        const int h = kvh * G + it / nq, t0 = k0 + it % nq * BQ, buf = it & 1;
        fa2_load_rows<T, HS, BQ>(qs + buf * L::Q_ELEMS, base, stride, h * HS, t0, T_);
        fa2_load_rows<T, HS, BQ>(dos + buf * L::Q_ELEMS, dbase, NH * HS, h * HS, t0, T_);
        const size_t bh = (size_t)b * NH + h;
        fa2_load_rowvec<BQ>(lses + buf * BQ, lse + bh * T_, t0, T_, 1.4426950408889634f);
        fa2_load_rowvec<BQ>(Ds + buf * BQ, D + bh * T_, t0, T_, 1.0f);
    };
    fa2_load_rows<T, HS, 64>(ks, base, stride, kcol, k0, T_);
    fa2_load_rows<T, HS, 64>(vs, base, stride, vcol, k0, T_);
    load(0);
    ptx_cp_async_commit();

    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) dk[n][i] = dv[n][i] = 0.0f;
    for (int it = 0; it < nit; it++) {
        const int buf = it & 1, h = kvh * G + it / nq, t0 = k0 + it % nq * BQ;
        if (it + 1 < nit) {
            load(it + 1);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>();
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads();
        const T *qt = qs + buf * L::Q_ELEMS, *dot = dos + buf * L::Q_ELEMS;
        const float *lt = lses + buf * BQ, *dt = Ds + buf * BQ;
        /* S^T = K Q^T and dP^T = V dO^T: 16 keys x BQ queries */
        float st[NQ][4], dpt[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) st[j][i] = dpt[j][i] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            unsigned ka[4], va[4];
            fa2_load_a<LD>(ka, ks, warp * 16, kk * 16);
            fa2_load_a<LD>(va, vs, warp * 16, kk * 16);
#pragma unroll
            for (int np = 0; np < NQ / 2; np++) {
                unsigned r[4];
                fa2_load_b<LD>(r, qt, np * 16, kk * 16);
                fa2_mma2<T>(st[2 * np], st[2 * np + 1], ka, r);
                fa2_load_b<LD>(r, dot, np * 16, kk * 16);
                fa2_mma2<T>(dpt[2 * np], dpt[2 * np + 1], va, r);
            }
        }
        /* P^T and dS^T in place (query q valid when key <= q < T) */
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = 8 * j + 2 * tq + i % 2, q = t0 + c, key = key0 + (i / 2) * 8;
                const float p = q >= key && q < T_ ? exp2f(st[j][i] * scale_log2 - lt[c]) : 0.0f;
                st[j][i] = p;
                dpt[j][i] = p * (dpt[j][i] - dt[c]);
            }
        /* dV += P^T dO, dK += dS^T Q: k runs over the tile's queries */
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            unsigned pa[4], da[4];
            fa2_pack_a<T>(pa, st[2 * kk], st[2 * kk + 1]);
            fa2_pack_a<T>(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                unsigned r[4];
                fa2_load_bt<LD>(r, dot, kk * 16, dp * 16);
                fa2_mma2<T>(dv[2 * dp], dv[2 * dp + 1], pa, r);
                fa2_load_bt<LD>(r, qt, kk * 16, dp * 16);
                fa2_mma2<T>(dk[2 * dp], dk[2 * dp + 1], da, r);
            }
            /* this warp's 16 rows of dS^T, as rounded for dK, into shared memory for dQ */
#pragma unroll
            for (int half = 0; half < 2; half++) {
                T *row = dst_s + (warp * 16 + g + half * 8) * DS_LD + kk * 16 + 2 * tq;
                *reinterpret_cast<unsigned *>(row) = da[half];
                *reinterpret_cast<unsigned *>(row + 8) = da[2 + half];
            }
        }
        /* dQ: add into the accumulator in key-block order (see the head comment) */
        const size_t bh = (size_t)b * NH + h;
        const int last = t0 / 64; /* key blocks 0 .. t0/64 reach this query tile */
        int *turn = turns + bh * qtiles + t0 / BQ;
        fa2_wait_turn(turn, kb);
        __syncthreads(); /* all 64 keys' dS^T are in shared memory; the earlier blocks have added */
        /* this warp's 16 x DQC piece = dS (16 queries x 64 keys) K (64 keys x DQC columns) */
        constexpr int DQN = L::DQC / 16;
        {
            const int c0 = dq_c0;
            float dq[2 * DQN][4];
#pragma unroll
            for (int n = 0; n < 2 * DQN; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                unsigned da[4];
                fa2_load_at<DS_LD>(da, dst_s, dq_r0, kk * 16);
#pragma unroll
                for (int n = 0; n < DQN; n++) {
                    unsigned r[4];
                    fa2_load_bt<LD>(r, ks, kk * 16, c0 + n * 16);
                    fa2_mma2<T>(dq[2 * n], dq[2 * n + 1], da, r);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = t0 + dq_r0 + g + r * 8;
                if (row >= T_) continue;
                float *acc = dq_acc + (bh * T_ + row) * HS + c0 + 2 * tq;
                T *out = dinp + ((size_t)b * T_ + row) * stride + h * HS + c0 + 2 * tq;
#pragma unroll
                for (int n = 0; n < 2 * DQN; n++) {
                    float2 v = make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
                    if (kb > 0) { /* key block 0 stores, the others add */
                        const float2 prev = __ldcg(reinterpret_cast<const float2 *>(acc + 8 * n));
                        v.x += prev.x, v.y += prev.y;
                    }
                    if (kb == last) *reinterpret_cast<unsigned *>(out + 8 * n) = pack2<T>(v.x * scale, v.y * scale);
                    else __stcg(reinterpret_cast<float2 *>(acc + 8 * n), v);
                }
            }
        }
        fa2_pass_turn(turn, kb + 1); /* its barrier also frees dS^T and this buffer for the prefetch */
    }
    T *rows = dinp + (size_t)b * T_ * stride;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + r * 8;
        if (key >= T_) continue;
        T *dkr = rows + (size_t)key * stride + kcol + 2 * tq, *dvr = rows + (size_t)key * stride + vcol + 2 * tq;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            *reinterpret_cast<unsigned *>(dkr + 8 * n) = pack2<T>(dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
            *reinterpret_cast<unsigned *>(dvr + 8 * n) = pack2<T>(dv[n][2 * r], dv[n][2 * r + 1]);
        }
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

inline void attention_fa2_check(const char *who, int B, int T_, int NH, int NKV, int HS) {
    attention_check_sizes(who, B, T_, NH * HS, NH, NKV);
    if (HS != 64 && HS != 128)
        llmc_check_failed(who, "head size must be 64 or 128",
                          "HINT: a caller bug (attention_fa2_supports() says which shapes run here)", __func__,
                          __FILE__, __LINE__);
}

/* out (B, T, NH*HS); lse (B, NH, T); inp (B, T, (NH + 2 NKV) * HS) as in the head comment.
 * HS 64 or 128, NKV dividing NH; inp and out 16-byte aligned. */
template <class T>
void attention_forward_fa2(T *out, float *lse, const T *inp, int B, int T_, int NH, int NKV, int HS,
                           cudaStream_t stream) {
    attention_fa2_check("attention_forward_fa2", B, T_, NH, NKV, HS);
    attention_tc_check_io("attention_forward_fa2", inp, out, "out");
    if (HS == 64) attention_forward_fa2_hs<T, 64>(out, lse, inp, B, T_, NH, NKV, stream);
    else attention_forward_fa2_hs<T, 128>(out, lse, inp, B, T_, NH, NKV, stream);
}

/* The scratch of attention_backward_fa2, in floats: D (B*NH*T, rounded up to 4), the dQ
 * accumulator (B*NH*T*HS) and the turn counters (one int per query tile of BQ >= 16 rows, bounded by
 * B*NH*T). Callers that know only N = B*T can use it: it depends on B and T through N. */
inline size_t attention_fa2_scratch_floats(size_t N, int NH, int HS) {
    const size_t rows = N * (size_t)NH;
    return (rows + 3) / 4 * 4 + rows * (size_t)HS + rows;
}

template <class T, int HS>
static void attention_backward_fa2_hs(T *dinp, const T *dout, const T *inp, const float *lse, float *scratch, int B,
                                      int T_, int NH, int NKV, cudaStream_t stream) {
    typedef AttnFA2Bwd<T, HS> L;
    static bool ready = false;
    attention_tc_smem(attention_backward_fa2_kernel<T, HS>, L::BYTES, &ready);
    const size_t rows = (size_t)B * NH * T_;
    float *dq_acc = scratch + (rows + 3) / 4 * 4;
    int *turns = (int *)(dq_acc + rows * HS);
    cudaCheck(cudaMemsetAsync(turns, 0, (size_t)B * NH * ceil_div(T_, L::BQ) * sizeof(int), stream));
    attention_backward_fa2_kernel<T, HS><<<dim3(ceil_div(T_, 64), B * NKV), 128, L::BYTES, stream>>>(
        dinp, dout, inp, lse, scratch, dq_acc, turns, T_, NH, NKV);
    kernelCheck();
}

/* dinp (same layout as inp, every element written); dout, out (B, T, NH*HS); lse from the
 * forward; scratch: attention_fa2_scratch_floats(B*T, NH, HS) floats, 16-byte aligned. */
template <class T>
void attention_backward_fa2(T *dinp, const T *dout, const T *inp, const T *out, const float *lse, int B, int T_,
                            int NH, int NKV, int HS, float *scratch, cudaStream_t stream) {
    attention_fa2_check("attention_backward_fa2", B, T_, NH, NKV, HS);
    attention_tc_check_io("attention_backward_fa2", inp, dinp, "dinp");
    attention_tc_check_aligned("attention_backward_fa2", scratch, "scratch");
    attention_backward_rowdot(scratch, dout, out, B, T_, NH, HS, stream); /* checks dout's alignment */
    if (HS == 64) attention_backward_fa2_hs<T, 64>(dinp, dout, inp, lse, scratch, B, T_, NH, NKV, stream);
    else attention_backward_fa2_hs<T, 128>(dinp, dout, inp, lse, scratch, B, T_, NH, NKV, stream);
}

inline bool attention_fa2_supports(int HS) { return HS == 64 || HS == 128; }

#endif
