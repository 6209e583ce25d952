/*
 * attention_tc.cuh - the bf16/fp16 causal flash attention on tensor cores (included by
 * attention.cuh, whose head comment gives the math, the shapes and the backward contract).
 *
 * Layout of the work: a block is 4 warps and owns 64 rows (queries in the forward and the dq
 * kernel, keys in the dk/dv kernel); each warp owns 16 of them. The other side streams through
 * shared memory in tiles of 64 rows. Matrix products go through the warp matrix API (wmma,
 * m16n16k16, 16-bit inputs, fp32 accumulation); the elementwise work between them (mask,
 * online softmax, ds = p (dp - D)) is done by the warp's lanes on fp32 score tiles in shared
 * memory, lane l owning row l/2 and the half l%2 of the columns. Only the products' operands
 * are rounded to 16 bits: the probabilities P and the score gradients dS (as in every flash
 * attention); scores, the running max and sum, O, dq, dk, dv accumulate in fp32. The code never
 * depends on how a fragment spreads over the lanes. The forward keeps O in fragments and
 * rescales it (through shared memory) only when a row's max grows by more than e^8.
 *
 * Grouped-query attention: the forward and dq kernels read their head's key/value head in place;
 * a dk/dv block owns 64 keys of one key/value head and streams the query tiles of each of the
 * group's query heads in turn, so dk and dv sum over the group in registers.
 * Determinism: each output element is produced by one warp in a fixed order; no atomics.
 * dq is computed by its own kernel (one pass over the keys) rather than accumulated across
 * key blocks, which costs a second S and dP product but keeps the result reproducible.
 *
 * Requirements (checked): head size 16, 32, 64 or 128; inp, dout, out and dinp 16-byte aligned
 * (tiles move as 16-byte vectors). Shared memory per block: 3 tiles + scores for the forward,
 * 4 tiles + two score and two 16-bit tiles for dk/dv (about 90 KiB at HS = 64), so the launch
 * sets the kernel's dynamic shared memory limit once per instantiation.
 */
#ifndef LLMC_CUDA_ATTENTION_TC_CUH
#define LLMC_CUDA_ATTENTION_TC_CUH

#include <mma.h>
#include <stdio.h>

#include "llmc/cuda/common.cuh"

/* Leading dimensions (elements) and shared-memory offsets (bytes) of the tiles. Every tile
 * starts on a 32-byte boundary, as wmma loads and stores require. */
template <class T, int HS> struct AttnTC {
    static constexpr int WARPS = 4, ROWS = 64, TILE = 64, NK = HS / 16;
    static constexpr int LDT = HS + 8;                            /* [64][LDT] T: q, k, v, dout tiles */
    static constexpr int LDS = (HS > TILE ? HS : TILE) + 4;       /* [16][LDS] fp32: a warp's scores */
    static constexpr int LDP = TILE + 8;                          /* [16][LDP] T: a warp's P or dS */
    static constexpr int LDO = HS + 4;                            /* [16][LDO] fp32: a warp's O */
    static constexpr size_t TILE_BYTES = (size_t)ROWS * LDT * sizeof(T);
    static constexpr size_t S_BYTES = (size_t)WARPS * 16 * LDS * 4;
    static constexpr size_t P_BYTES = (size_t)WARPS * 16 * LDP * sizeof(T);
    static constexpr size_t O_BYTES = (size_t)WARPS * 16 * LDO * 4;
    /* forward: q k v | S | P | O */
    static constexpr size_t FWD_BYTES = 3 * TILE_BYTES + S_BYTES + P_BYTES + O_BYTES;
    /* dk/dv: k v q dout | lse D | S dP | P dS ;  dq: q dout k v | S dP | dS */
    static constexpr size_t DKDV_BYTES = 4 * TILE_BYTES + 2 * ROWS * 4 + 2 * S_BYTES + 2 * P_BYTES;
    static constexpr size_t DQ_BYTES = 4 * TILE_BYTES + 2 * S_BYTES + P_BYTES;
    static_assert(HS % 16 == 0 && HS <= 128, "head size must be a multiple of 16, at most 128");
};

/* rows [r0, r0 + 64) of one head's slice (columns [col0, col0 + HS) of a (T, row_stride)
 * matrix) into a [64][HS + 8] tile; rows at or past T become zeros. 16-byte vectors. */
template <class T, int HS>
__device__ inline void attn_tc_load_tile(T *tile, const T *src, int row_stride, int col0, int r0, int T_) {
    constexpr int LDT = AttnTC<T, HS>::LDT, VEC = 16 / sizeof(T), PER_ROW = HS / VEC;
    for (int idx = threadIdx.x; idx < 64 * PER_ROW; idx += blockDim.x) {
        int r = idx / PER_ROW, c = (idx % PER_ROW) * VEC, t = r0 + r;
        int4 v = make_int4(0, 0, 0, 0);
        if (t < T_) v = __ldg(reinterpret_cast<const int4 *>(src + (size_t)t * row_stride + col0 + c));
        *reinterpret_cast<int4 *>(tile + r * LDT + c) = v;
    }
}

/* One warp: acc[0..NK) (16 x HS, fp32) -> rows [r0, r0 + 16) of dst (row stride `stride`,
 * column offset col0), scaled, through the warp's fp32 scratch; rows >= T are not written. */
template <class T, int HS>
__device__ inline void attn_tc_store_rows(
    T *dst, size_t stride, int col0, int r0, int T_, float *scratch,
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[HS / 16]) {
    using namespace nvcuda;
    constexpr int LDS = AttnTC<T, HS>::LDS;
    const int lane = threadIdx.x % 32, rr = lane >> 1, half = lane & 1;
#pragma unroll
    for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(scratch + n * 16, acc[n], LDS, wmma::mem_row_major);
    __syncwarp();
    if (r0 + rr < T_) {
        T *row = dst + (size_t)(r0 + rr) * stride + col0;
        for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); c++) row[c] = from_float<T>(scratch[rr * LDS + c]);
    }
    __syncwarp();
}

/* One warp, the backward's two score-like products for a 16-row sub-tile j of the streamed side:
 *   s1 = A1 B1_j^T, s2 = A2 B2_j^T   (16 x 16 each, over HS; A* the warp's own 16 rows in
 *   fragments, B*_j rows [16j, 16j + 16) of a [64][HS + 8] tile), stored to fp32 scratch at
 *   column 16j. dk/dv: (K, Q) and (V, dout); dq: (Q, K) and (dout, V). */
template <class T, int HS>
__device__ inline void attn_tc_two_products(
    const nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major> (&a1)[HS / 16],
    const nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major> (&a2)[HS / 16],
    const T *b1, const T *b2, int j, float *s1, float *s2) {
    using namespace nvcuda;
    constexpr int LDT = AttnTC<T, HS>::LDT, LDS = AttnTC<T, HS>::LDS;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f1, f2;
    wmma::fill_fragment(f1, 0.0f);
    wmma::fill_fragment(f2, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> x1, x2;
        wmma::load_matrix_sync(x1, b1 + j * 16 * LDT + kk * 16, LDT);
        wmma::load_matrix_sync(x2, b2 + j * 16 * LDT + kk * 16, LDT);
        wmma::mma_sync(f1, a1[kk], x1, f1);
        wmma::mma_sync(f2, a2[kk], x2, f2);
    }
    wmma::store_matrix_sync(s1 + j * 16, f1, LDS, wmma::mem_row_major);
    wmma::store_matrix_sync(s2 + j * 16, f2, LDS, wmma::mem_row_major);
}
/* The same with A1, A2 read from the warp's 16 rows of [64][HS + 8] shared tiles at each k step
 * (the dk/dv kernel: K and V fragments held in registers for the whole run would leave too few
 * for dk and dv at HS 128 once the kernel loops over a group's query heads). */
template <class T, int HS>
__device__ inline void attn_tc_two_products(const T *a1, const T *a2, const T *b1, const T *b2, int j, float *s1,
                                            float *s2) {
    using namespace nvcuda;
    constexpr int LDT = AttnTC<T, HS>::LDT, LDS = AttnTC<T, HS>::LDS;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f1, f2;
    wmma::fill_fragment(f1, 0.0f);
    wmma::fill_fragment(f2, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> y1, y2;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> x1, x2;
        wmma::load_matrix_sync(y1, a1 + kk * 16, LDT);
        wmma::load_matrix_sync(y2, a2 + kk * 16, LDT);
        wmma::load_matrix_sync(x1, b1 + j * 16 * LDT + kk * 16, LDT);
        wmma::load_matrix_sync(x2, b2 + j * 16 * LDT + kk * 16, LDT);
        wmma::mma_sync(f1, y1, x1, f1);
        wmma::mma_sync(f2, y2, x2, f2);
    }
    wmma::store_matrix_sync(s1 + j * 16, f1, LDS, wmma::mem_row_major);
    wmma::store_matrix_sync(s2 + j * 16, f2, LDS, wmma::mem_row_major);
}

/* One warp: acc (16 x HS, fp32) += A B over the first nsub 16-wide sub-tiles, sub-tile j by
 * sub-tile j: A the warp's 16 rows of 16-bit scratch a (row stride LDP; columns [16j, 16j + 16)),
 * B rows [16j, 16j + 16) of a [64][HS + 8] tile b. The forward's O += P V and dq's dQ += dS K. */
template <class T, int HS>
__device__ inline void attn_tc_accumulate_product(
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[HS / 16], const T *a, const T *b,
    int nsub) {
    using namespace nvcuda;
    constexpr int LDT = AttnTC<T, HS>::LDT, LDP = AttnTC<T, HS>::LDP;
    for (int j = 0; j < nsub; j++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af;
        wmma::load_matrix_sync(af, a + j * 16, LDP);
#pragma unroll
        for (int n = 0; n < HS / 16; n++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf;
            wmma::load_matrix_sync(bf, b + j * 16 * LDT + n * 16, LDT);
            wmma::mma_sync(acc[n], af, bf, acc[n]);
        }
    }
}

template <class T, int HS>
static __global__ void __launch_bounds__(128)
    attention_forward_tc_kernel(T *out, float *lse, const T *inp, int T_, int NH, int NKV) {
    using namespace nvcuda;
    typedef AttnTC<T, HS> L;
    extern __shared__ __align__(128) unsigned char attn_fwd_smem[];
    T *qs = (T *)attn_fwd_smem, *ks = qs + 64 * L::LDT, *vs = ks + 64 * L::LDT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rr = lane >> 1, half = lane & 1;
    float *ss = (float *)(attn_fwd_smem + 3 * L::TILE_BYTES) + warp * 16 * L::LDS;
    T *ps = (T *)(attn_fwd_smem + 3 * L::TILE_BYTES + L::S_BYTES) + warp * 16 * L::LDP;
    float *os = (float *)(attn_fwd_smem + 3 * L::TILE_BYTES + L::S_BYTES + L::P_BYTES) + warp * 16 * L::LDO;
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int kcol = C + h / (NH / NKV) * HS, vcol = kcol + NKV * HS; /* h's key/value head */
    /* the last query blocks see the most keys: they go first, so the short ones fill the tail */
    const int q0 = (gridDim.x - 1 - blockIdx.x) * 64, w0 = q0 + warp * 16, t = w0 + rr; /* lane's query row */
    const float scale = 1.0f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * C3;

    attn_tc_load_tile<T, HS>(qs, base, C3, h * HS, q0, T_);
    __syncthreads();
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[L::NK];
    Acc of[L::NK]; /* O (16 x HS), unnormalised, relative to the row maxima m */
#pragma unroll
    for (int kk = 0; kk < L::NK; kk++) {
        wmma::load_matrix_sync(qf[kk], qs + warp * 16 * L::LDT + kk * 16, L::LDT);
        wmma::fill_fragment(of[kk], 0.0f);
    }

    /* The lane's row: m is the max the probabilities are taken against and l their sum (both
     * lanes of a row agree). Lazy rescaling: m moves only when a row's max grows by more than
     * RESCALE (then O goes through shared memory once to scale its rows, since a fragment's
     * rows are not addressable); otherwise p = exp(s - m) <= e^RESCALE, which 16-bit P and fp32
     * sums hold exactly as well. */
    const float RESCALE = 8.0f;
    float m = -INFINITY, l = 0.0f;
    const int kv_end = min(q0 + 64, T_);
    for (int k0 = 0; k0 < kv_end; k0 += 64) {
        __syncthreads(); /* every warp is done with the previous k, v tile */
        attn_tc_load_tile<T, HS>(ks, base, C3, kcol, k0, T_);
        attn_tc_load_tile<T, HS>(vs, base, C3, vcol, k0, T_);
        __syncthreads();
        if (w0 >= T_) continue;
        /* key sub-tiles holding a key <= the warp's last query (k0 <= w0, so at least one) */
        const int nsub = min(4, (w0 + 15 - k0) / 16 + 1);
        for (int j = 0; j < nsub; j++) {
            Acc sf;
            wmma::fill_fragment(sf, 0.0f);
#pragma unroll
            for (int kk = 0; kk < L::NK; kk++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
                wmma::load_matrix_sync(kf, ks + j * 16 * L::LDT + kk * 16, L::LDT);
                wmma::mma_sync(sf, qf[kk], kf, sf);
            }
            wmma::store_matrix_sync(ss + j * 16, sf, L::LDS, wmma::mem_row_major);
        }
        __syncwarp();
        /* this lane's 32 columns; keys u > t are masked (k0 <= t: the row's first key is always
         * in, so the max is finite) */
        const int c0 = half * 32, cend = min(c0 + 32, nsub * 16);
        float mx = -INFINITY;
        for (int c = c0; c < cend; c++)
            if (k0 + c <= t) mx = fmaxf(mx, ss[rr * L::LDS + c] * scale);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        if (__any_sync(0xffffffffu, mx > m + RESCALE)) { /* warp-uniform */
            const float m_new = fmaxf(m, mx), corr = expf(m - m_new); /* 0 while m = -inf */
            if (__any_sync(0xffffffffu, l > 0.0f)) {                  /* O is not all zeros */
#pragma unroll
                for (int n = 0; n < L::NK; n++) wmma::store_matrix_sync(os + n * 16, of[n], L::LDO, wmma::mem_row_major);
                __syncwarp();
                for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); c++) os[rr * L::LDO + c] *= corr;
                __syncwarp();
#pragma unroll
                for (int n = 0; n < L::NK; n++) wmma::load_matrix_sync(of[n], os + n * 16, L::LDO, wmma::mem_row_major);
            }
            l *= corr;
            m = m_new;
        }
        float sum = 0.0f;
        for (int c = c0; c < c0 + 32; c++) {
            float p = c < cend && k0 + c <= t ? expf(ss[rr * L::LDS + c] * scale - m) : 0.0f;
            sum += p;
            ps[rr * L::LDP + c] = from_float<T>(p);
        }
        l += sum + __shfl_xor_sync(0xffffffffu, sum, 1);
        __syncwarp();
        attn_tc_accumulate_product<T, HS>(of, ps, vs, nsub); /* O += P V */
        __syncwarp(); /* P and S are rewritten by the next tile */
    }
    if (w0 >= T_) return;
#pragma unroll
    for (int n = 0; n < L::NK; n++) wmma::store_matrix_sync(os + n * 16, of[n], L::LDO, wmma::mem_row_major);
    __syncwarp();
    if (t >= T_) return;
    const float inv = 1.0f / l;
    T *dst = out + ((size_t)b * T_ + t) * C + h * HS;
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); c++) dst[c] = from_float<T>(os[rr * L::LDO + c] * inv);
    if (half == 0) lse[(size_t)bh * T_ + t] = m + logf(l);
}

/* dk, dv for 64 keys per block (16 per warp); query tiles stream through shared memory.
 *   S^T = K Q^T, dP^T = V dO^T (16 keys x 64 queries per warp), P^T = exp(S^T scale - lse),
 *   dS^T = P^T (dP^T - D);  dV += P^T dO,  dK += dS^T Q  (scaled once at the end). */
template <class T, int HS>
static __global__ void __launch_bounds__(128)
    attention_backward_dkdv_tc_kernel(T *dinp, const T *dout, const T *inp, const float *lse, const float *D, int T_,
                                      int NH, int NKV) {
    using namespace nvcuda;
    typedef AttnTC<T, HS> L;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
    extern __shared__ __align__(128) unsigned char attn_dkdv_smem[];
    T *ks = (T *)attn_dkdv_smem, *vs = ks + 64 * L::LDT, *qs = vs + 64 * L::LDT, *dos = qs + 64 * L::LDT;
    unsigned char *rest = attn_dkdv_smem + 4 * L::TILE_BYTES;
    float *lses = (float *)rest, *Ds = lses + 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rr = lane >> 1, half = lane & 1;
    float *st = (float *)(rest + 2 * 64 * 4) + warp * 16 * L::LDS;
    float *dpt = (float *)(rest + 2 * 64 * 4 + L::S_BYTES) + warp * 16 * L::LDS;
    T *pt = (T *)(rest + 2 * 64 * 4 + 2 * L::S_BYTES) + warp * 16 * L::LDP;
    T *dst = (T *)(rest + 2 * 64 * 4 + 2 * L::S_BYTES + L::P_BYTES) + warp * 16 * L::LDP;
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, G = NH / NKV;
    const int bkv = blockIdx.y, b = bkv / NKV, kvh = bkv % NKV; /* the group's query heads in order */
    const int kcol = C + kvh * HS, vcol = kcol + NKV * HS;
    const int k0 = blockIdx.x * 64, w0 = k0 + warp * 16, u = w0 + rr; /* lane's key row */
    const float scale = 1.0f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * C3;
    const T *dbase = dout + (size_t)b * T_ * C;

    attn_tc_load_tile<T, HS>(ks, base, C3, kcol, k0, T_);
    attn_tc_load_tile<T, HS>(vs, base, C3, vcol, k0, T_);
    __syncthreads();
    const T *kw = ks + warp * 16 * L::LDT, *vw = vs + warp * 16 * L::LDT; /* the warp's key rows */
    Acc dk[L::NK], dv[L::NK];
#pragma unroll
    for (int kk = 0; kk < L::NK; kk++) {
        wmma::fill_fragment(dk[kk], 0.0f);
        wmma::fill_fragment(dv[kk], 0.0f);
    }
    for (int h = kvh * G; h < (kvh + 1) * G; h++)
    for (int t0 = k0; t0 < T_; t0 += 64) {
        const int bh = b * NH + h;
        __syncthreads(); /* every warp is done with the previous query tile */
        attn_tc_load_tile<T, HS>(qs, base, C3, h * HS, t0, T_);
        attn_tc_load_tile<T, HS>(dos, dbase, C, h * HS, t0, T_);
        for (int i = threadIdx.x; i < 64; i += blockDim.x) {
            lses[i] = t0 + i < T_ ? lse[(size_t)bh * T_ + t0 + i] : 0.0f;
            Ds[i] = t0 + i < T_ ? D[(size_t)bh * T_ + t0 + i] : 0.0f;
        }
        __syncthreads();
        if (w0 >= T_) continue;
        /* query sub-tiles with a query >= the warp's first key, and not wholly past T */
        const int jfirst = max(0, (w0 - t0) / 16), jend = min(4, (T_ - t0 + 15) / 16);
        for (int j = jfirst; j < jend; j++) attn_tc_two_products<T, HS>(kw, vw, qs, dos, j, st, dpt);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            const int tq = t0 + c;
            const bool in = c >= jfirst * 16 && c < jend * 16 && tq >= u && tq < T_;
            const float p = in ? expf(st[rr * L::LDS + c] * scale - lses[c]) : 0.0f;
            const float ds = in ? p * (dpt[rr * L::LDS + c] - Ds[c]) : 0.0f;
            pt[rr * L::LDP + c] = from_float<T>(p);
            dst[rr * L::LDP + c] = from_float<T>(ds);
        }
        __syncwarp();
        for (int j = jfirst; j < jend; j++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pa, da;
            wmma::load_matrix_sync(pa, pt + j * 16, L::LDP);
            wmma::load_matrix_sync(da, dst + j * 16, L::LDP);
#pragma unroll
            for (int n = 0; n < L::NK; n++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> ob, qb;
                wmma::load_matrix_sync(ob, dos + j * 16 * L::LDT + n * 16, L::LDT);
                wmma::load_matrix_sync(qb, qs + j * 16 * L::LDT + n * 16, L::LDT);
                wmma::mma_sync(dv[n], pa, ob, dv[n]);
                wmma::mma_sync(dk[n], da, qb, dk[n]);
            }
        }
    }
    if (w0 >= T_) return; /* after the last block-wide barrier */
#pragma unroll
    for (int n = 0; n < L::NK; n++)
        for (int i = 0; i < dk[n].num_elements; i++) dk[n].x[i] *= scale;
    T *rows = dinp + (size_t)b * T_ * C3;
    attn_tc_store_rows<T, HS>(rows, C3, kcol, w0, T_, st, dk);
    attn_tc_store_rows<T, HS>(rows, C3, vcol, w0, T_, st, dv);
}

/* dq for 64 queries per block (16 per warp); key tiles stream through shared memory.
 *   S = Q K^T, dP = dO V^T, P = exp(S scale - lse), dS = P (dP - D);  dQ += dS K (scaled). */
template <class T, int HS>
static __global__ void __launch_bounds__(128)
    attention_backward_dq_tc_kernel(T *dinp, const T *dout, const T *inp, const float *lse, const float *D, int T_,
                                    int NH, int NKV) {
    using namespace nvcuda;
    typedef AttnTC<T, HS> L;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
    extern __shared__ __align__(128) unsigned char attn_dq_smem[];
    T *qs = (T *)attn_dq_smem, *dos = qs + 64 * L::LDT, *ks = dos + 64 * L::LDT, *vs = ks + 64 * L::LDT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rr = lane >> 1, half = lane & 1;
    float *ss = (float *)(attn_dq_smem + 4 * L::TILE_BYTES) + warp * 16 * L::LDS;
    float *dps = (float *)(attn_dq_smem + 4 * L::TILE_BYTES + L::S_BYTES) + warp * 16 * L::LDS;
    T *dss = (T *)(attn_dq_smem + 4 * L::TILE_BYTES + 2 * L::S_BYTES) + warp * 16 * L::LDP;
    const int C = NH * HS, C3 = (NH + 2 * NKV) * HS, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int kcol = C + h / (NH / NKV) * HS, vcol = kcol + NKV * HS; /* h's key/value head */
    /* the last query blocks see the most keys: they go first, so the short ones fill the tail */
    const int q0 = (gridDim.x - 1 - blockIdx.x) * 64, w0 = q0 + warp * 16, t = w0 + rr; /* lane's query row */
    const float scale = 1.0f / sqrtf((float)HS);
    const T *base = inp + (size_t)b * T_ * C3;

    attn_tc_load_tile<T, HS>(qs, base, C3, h * HS, q0, T_);
    attn_tc_load_tile<T, HS>(dos, dout + (size_t)b * T_ * C, C, h * HS, q0, T_);
    const float lse_t = t < T_ ? lse[(size_t)bh * T_ + t] : 0.0f, D_t = t < T_ ? D[(size_t)bh * T_ + t] : 0.0f;
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[L::NK], of[L::NK];
    Acc dq[L::NK];
#pragma unroll
    for (int kk = 0; kk < L::NK; kk++) {
        wmma::load_matrix_sync(qf[kk], qs + warp * 16 * L::LDT + kk * 16, L::LDT);
        wmma::load_matrix_sync(of[kk], dos + warp * 16 * L::LDT + kk * 16, L::LDT);
        wmma::fill_fragment(dq[kk], 0.0f);
    }
    const int kv_end = min(q0 + 64, T_);
    for (int k0 = 0; k0 < kv_end; k0 += 64) {
        __syncthreads();
        attn_tc_load_tile<T, HS>(ks, base, C3, kcol, k0, T_);
        attn_tc_load_tile<T, HS>(vs, base, C3, vcol, k0, T_);
        __syncthreads();
        if (w0 >= T_) continue;
        const int nsub = min(4, (w0 + 15 - k0) / 16 + 1);
        for (int j = 0; j < nsub; j++) attn_tc_two_products<T, HS>(qf, of, ks, vs, j, ss, dps);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            const bool in = c < nsub * 16 && k0 + c <= t && t < T_;
            const float p = in ? expf(ss[rr * L::LDS + c] * scale - lse_t) : 0.0f;
            const float ds = in ? p * (dps[rr * L::LDS + c] - D_t) : 0.0f;
            dss[rr * L::LDP + c] = from_float<T>(ds);
        }
        __syncwarp();
        attn_tc_accumulate_product<T, HS>(dq, dss, ks, nsub); /* dQ += dS K */
    }
    if (w0 >= T_) return;
#pragma unroll
    for (int n = 0; n < L::NK; n++)
        for (int i = 0; i < dq[n].num_elements; i++) dq[n].x[i] *= scale;
    attn_tc_store_rows<T, HS>(dinp + (size_t)b * T_ * C3, C3, h * HS, w0, T_, ss, dq);
}

inline void attention_tc_check_aligned(const char *who, const void *p, const char *name) {
    if ((uintptr_t)p % 16 == 0) return;
    char what[128];
    snprintf(what, sizeof what, "%s is not 16-byte aligned", name);
    llmc_check_failed(who, what, "HINT: a caller bug (tensor-core attention moves 16-byte vectors)", __func__, __FILE__,
                      __LINE__);
}

/* A 16-bit tensor-core launcher's input and output (named out_name in the message) 16-byte aligned. */
template <class T> inline void attention_tc_check_io(const char *who, const T *inp, const T *out, const char *out_name) {
    static_assert(sizeof(T) == 2, "tensor-core attention (own and FA2) is for bf16 and fp16");
    attention_tc_check_aligned(who, inp, "inp");
    attention_tc_check_aligned(who, out, out_name);
}

/* Raise a kernel's dynamic shared memory limit once (it needs more than the default 48 KiB). */
template <class K> inline void attention_tc_smem(K kernel, size_t bytes, bool *done) {
    if (*done) return;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *done = true;
}

template <class T, int HS>
static void attention_forward_tc_hs(T *out, float *lse, const T *inp, int B, int T_, int NH, int NKV,
                                    cudaStream_t stream) {
    typedef AttnTC<T, HS> L;
    static bool ready = false;
    attention_tc_smem(attention_forward_tc_kernel<T, HS>, L::FWD_BYTES, &ready);
    attention_forward_tc_kernel<T, HS><<<dim3(ceil_div(T_, 64), B * NH), 128, L::FWD_BYTES, stream>>>(out, lse, inp,
                                                                                                       T_, NH, NKV);
    kernelCheck();
}

template <class T, int HS>
static void attention_backward_tc_hs(T *dinp, const T *dout, const T *inp, const float *lse, const float *D, int B,
                                     int T_, int NH, int NKV, cudaStream_t stream) {
    typedef AttnTC<T, HS> L;
    static bool ready_kv = false, ready_q = false;
    attention_tc_smem(attention_backward_dkdv_tc_kernel<T, HS>, L::DKDV_BYTES, &ready_kv);
    attention_tc_smem(attention_backward_dq_tc_kernel<T, HS>, L::DQ_BYTES, &ready_q);
    attention_backward_dkdv_tc_kernel<T, HS><<<dim3(ceil_div(T_, 64), B * NKV), 128, L::DKDV_BYTES, stream>>>(
        dinp, dout, inp, lse, D, T_, NH, NKV);
    kernelCheck();
    attention_backward_dq_tc_kernel<T, HS><<<dim3(ceil_div(T_, 64), B * NH), 128, L::DQ_BYTES, stream>>>(
        dinp, dout, inp, lse, D, T_, NH, NKV);
    kernelCheck();
}

template <class T>
void attention_forward_tc(T *out, float *lse, const T *inp, int B, int T_, int C, int NH, int NKV,
                          cudaStream_t stream) {
    attention_check_sizes("attention_forward", B, T_, C, NH, NKV);
    attention_tc_check_io("attention_forward", inp, out, "out");
    with_head_size(C / NH, [&](auto hs) { attention_forward_tc_hs<T, decltype(hs)::value>(out, lse, inp, B, T_, NH, NKV, stream); });
}

template <class T>
void attention_backward_tc(T *dinp, const T *dout, const T *inp, const T *out, const float *lse, int B, int T_, int C,
                           int NH, int NKV, float *scratch, cudaStream_t stream) {
    attention_check_sizes("attention_backward", B, T_, C, NH, NKV);
    attention_tc_check_io("attention_backward", inp, dinp, "dinp");
    const int HS = C / NH;
    attention_backward_rowdot(scratch, dout, out, B, T_, NH, HS, stream); /* checks dout's alignment */
    with_head_size(HS, [&](auto hs) {
        attention_backward_tc_hs<T, decltype(hs)::value>(dinp, dout, inp, lse, scratch, B, T_, NH, NKV, stream);
    });
}

#endif
