/*
 * adamw.cuh - the fused AdamW update and the global gradient norm (CUDA twin of
 * llmc/cpu/adamw.h).
 *
 * adamw_update, step t >= 1, c1 = 1 - beta1^t, c2 = 1 - beta2^t (computed on the host with the
 * CPU's powf):
 *   g = grads * grad_scale          (grad_scale: the clip factor, times 1/loss-scale in fp16)
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2            (fp32 moments)
 *   w -= lr * (m / c1 / (sqrt(v / c2) + eps) + weight_decay * w)
 * w is the fp32 master copy when `master` != NULL (then params = round(master)), else params
 * read as fp32. Writing a bf16/fp16 param rounds stochastically (unbiased: the expected stored
 * value is the fp32 value), with random bits from a hash of (seed, index): reproducible.
 * Shapes: params, grads (n) in T; master, m, v (n) fp32. idx0 (default 0): the index of element 0
 * in the whole tensor, so that updating a tensor in pieces (a ZeRO shard) draws the same random
 * bits as updating it at once.
 *
 * global_norm_squared: sum of grads^2 into out[0] (fp32, device). Each of up to NORM_BLOCKS
 * blocks (a count fixed by n) reduces a fixed grid-stride subset, then one thread adds the partials in order in double:
 * deterministic. An inf or NaN anywhere makes the result non-finite (the fp16 overflow check).
 * scratch: NORM_BLOCKS floats.
 *
 * Both run over 16-byte packs (adamw_update_kernel16, norm_squared_partial_reduce16) when the
 * pointers are 16-byte aligned, element by element otherwise; the packed AdamW computes each
 * element exactly as the other (same formula, same random bits).
 */
#ifndef LLMC_CUDA_ADAMW_CUH
#define LLMC_CUDA_ADAMW_CUH

#include <math.h>

#include "llmc/core/optstate.h"
#include "llmc/cuda/common.cuh"

enum { NORM_BLOCKS = 512 };

__host__ __device__ inline uint32_t llmc_hash32(uint64_t seed, uint64_t idx) {
    uint64_t z = seed ^ (idx * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint32_t)(z >> 32);
}

/* Round x to T choosing between the two neighbours with probability proportional to proximity. */
template <class T> __device__ inline T stochastic_round(float x, uint32_t r);
template <> __device__ inline float stochastic_round<float>(float x, uint32_t r) {
    (void)r;
    return x;
}
template <> __device__ inline __nv_bfloat16 stochastic_round<__nv_bfloat16>(float x, uint32_t r) {
    if (!isfinite(x)) return __float2bfloat16(x);
    /* adding uniform noise below the kept 16 bits, then truncating, rounds up with probability
     * equal to the dropped fraction */
    uint32_t bits = __float_as_uint(x) + (r >> 16);
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)(bits >> 16);
    return __nv_bfloat16(raw);
}
template <> __device__ inline __half stochastic_round<__half>(float x, uint32_t r) {
    __half h = __float2half(x); /* nearest */
    float f = __half2float(h);
    if (f == x || !isfinite(x) || !isfinite(f)) return h;
    __half_raw raw = h;
    unsigned short bits = raw.x == 0x8000 ? 0 : raw.x; /* -0 and +0 share a neighbourhood */
    bool pos = (bits & 0x8000) == 0;
    unsigned short other;
    if (f < x) other = bits == 0 ? 0x0001 : pos ? bits + 1 : bits - 1;    /* next representable up */
    else other = bits == 0 ? 0x8001 : pos ? bits - 1 : bits + 1;           /* next representable down */
    __half_raw o;
    o.x = other;
    float fo = __half2float(__half(o));
    if (!isfinite(fo)) return h;
    float p = (x - f) / (fo - f); /* in (0, 0.5]: distance to the nearest over the gap */
    return (float)(r >> 8) * (1.0f / 16777216.0f) < p ? __half(o) : h;
}

/* The update of one element: the formula above, shared by both kernels. */
__device__ inline float adamw_element(float g, float *m, float *v, float w, float lr, float beta1, float beta2, float c1,
                                      float c2, float eps, float weight_decay) {
    const float mi = beta1 * *m + (1.0f - beta1) * g;
    const float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    const float mhat = mi / c1, vhat = vi / c2;
    return w - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * w);
}

template <class T>
static __global__ void adamw_update_kernel(T *params, float *master, const T *grads, float *m, float *v, size_t n,
                                           float lr, float beta1, float beta2, float c1, float c2, float eps,
                                           float weight_decay, float grad_scale, uint64_t seed, size_t idx0) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float w = master ? master[i] : to_float(params[i]);
    w = adamw_element(to_float(grads[i]) * grad_scale, &m[i], &v[i], w, lr, beta1, beta2, c1, c2, eps, weight_decay);
    if (master) master[i] = w;
    params[i] = stochastic_round<T>(w, llmc_hash32(seed, idx0 + i));
}

/* P = Pack16<T>::size elements per thread: params and grads as one 16-byte pack, master, m and
 * v as P/4 packs of 4 floats; the last thread also does the tail (n % P). All pointers 16-byte
 * aligned (master may be NULL). */
template <class T>
static __global__ void adamw_update_kernel16(T *params, float *master, const T *grads, float *m, float *v, size_t n,
                                             float lr, float beta1, float beta2, float c1, float c2, float eps,
                                             float weight_decay, float grad_scale, uint64_t seed, size_t idx0) {
    constexpr int P = Pack16<T>::size, Q = P / 4;
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i + P <= n) {
        const Pack16<T> g = load16(grads + i);
        Pack16<T> p;
        Pack16<float> mp[Q], vp[Q], wp[Q];
#pragma unroll
        for (int q = 0; q < Q; q++) {
            mp[q] = load16(m + i + 4 * q), vp[q] = load16(v + i + 4 * q);
            if (master) wp[q] = load16(master + i + 4 * q);
        }
        if (!master) p = load16(params + i);
#pragma unroll
        for (int j = 0; j < P; j++) {
            float &mj = mp[j / 4].v[j % 4], &vj = vp[j / 4].v[j % 4];
            const float w = master ? wp[j / 4].v[j % 4] : to_float(p.v[j]);
            const float nw = adamw_element(to_float(g.v[j]) * grad_scale, &mj, &vj, w, lr, beta1, beta2, c1, c2, eps,
                                           weight_decay);
            wp[j / 4].v[j % 4] = nw;
            p.v[j] = stochastic_round<T>(nw, llmc_hash32(seed, idx0 + i + j));
        }
#pragma unroll
        for (int q = 0; q < Q; q++) {
            store16(m + i + 4 * q, mp[q]), store16(v + i + 4 * q, vp[q]);
            if (master) store16(master + i + 4 * q, wp[q]);
        }
        store16(params + i, p);
    } else {
        for (size_t k = i; k < n; k++) {
            const float w = master ? master[k] : to_float(params[k]);
            const float nw = adamw_element(to_float(grads[k]) * grad_scale, &m[k], &v[k], w, lr, beta1, beta2, c1, c2,
                                           eps, weight_decay);
            if (master) master[k] = nw;
            params[k] = stochastic_round<T>(nw, llmc_hash32(seed, idx0 + k));
        }
    }
}

template <class T>
void adamw_update(T *params, float *master, const T *grads, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, float grad_scale, uint64_t seed,
                  cudaStream_t stream, size_t idx0 = 0) {
    llmcCheck(n > 0 && t >= 1, "adamw_update: need n > 0 and step t >= 1");
    const float c1 = 1.0f - powf(beta1, (float)t), c2 = 1.0f - powf(beta2, (float)t);
    const int block = 256;
    if (aligned16(params) && aligned16(grads) && aligned16(m) && aligned16(v) && (master == NULL || aligned16(master)))
        adamw_update_kernel16<<<ceil_div((long long)ceil_div((long long)n, Pack16<T>::size), block), block, 0, stream>>>(
            params, master, grads, m, v, n, lr, beta1, beta2, c1, c2, eps, weight_decay, grad_scale, seed, idx0);
    else
        adamw_update_kernel<<<ceil_div((long long)n, block), block, 0, stream>>>(params, master, grads, m, v, n, lr, beta1,
                                                                                beta2, c1, c2, eps, weight_decay,
                                                                                grad_scale, seed, idx0);
    kernelCheck();
}

/* adamw_update_compact: the update of adamw_update on k elements whose m and v are stored as
 * state (bf16 or blockwise int8, llmc/core/optstate.h), the twin of llmc/cpu/adamw.c's
 * adamw_update_compact: one thread block per OPTSTATE_BLOCK elements decodes its m and v with
 * optstate.h's element codes, updates in fp32 (optstate_adamw), takes the block's scales (int8)
 * with block_max and encodes. The element decay comes from seg (the shard's tensor segments).
 * Shapes: params, grads (k) in T; master (k) fp32 or NULL; m, v optstate_bytes(k, state) bytes.
 * idx0: the global index of element 0 (the random bits of a bf16/fp16 parameter's rounding).
 * This element-per-thread form runs where a pointer is not 16-byte aligned; otherwise the packed
 * adamw_update_compact_kernel16 below, which writes the same bytes. */
template <class T>
static __global__ void adamw_update_compact_kernel(T *params, float *master, const T *grads, void *m, void *v, int state,
                                                   size_t k, OptSegments seg, float lr, float beta1, float beta2,
                                                   float c1, float c2, float eps, float grad_scale, uint64_t seed,
                                                   size_t idx0) {
    __shared__ float red[32];
    const size_t b = blockIdx.x, nb = gridDim.x, j = b * OPTSTATE_BLOCK + threadIdx.x;
    const bool live = j < k;
    float mi = 0.0f, vi = 0.0f;
    float *m_scale = (float *)m, *v_scale = (float *)v;
    uint8_t *m_code = (uint8_t *)m + nb * sizeof(float), *v_code = (uint8_t *)v + nb * sizeof(float);
    if (live) {
        if (state == OPTSTATE_BF16) {
            mi = bf16_to_float(((const uint16_t *)m)[j]);
            vi = bf16_to_float(((const uint16_t *)v)[j]);
        } else {
            mi = optstate_q8m_decode((int8_t)m_code[j], m_scale[b]);
            vi = optstate_q8v_decode(v_code[j], v_scale[b]);
        }
        int s = 0;
        while (j >= seg.end[s]) s++;
        float g = to_float(grads[j]) * grad_scale;
        float w = master ? master[j] : to_float(params[j]);
        w = optstate_adamw(w, g, &mi, &vi, lr, beta1, beta2, c1, c2, eps, seg.decay[s]);
        if (master) master[j] = w;
        params[j] = stochastic_round<T>(w, llmc_hash32(seed, idx0 + j));
    }
    if (state == OPTSTATE_BF16) {
        if (live) {
            ((uint16_t *)m)[j] = float_to_bf16(mi);
            ((uint16_t *)v)[j] = float_to_bf16(vi);
        }
        return;
    }
    /* int8: the block's scales (every thread takes part; idle ones contribute 0) */
    const float am = block_max(live ? optstate_q8_scale_term(mi, 0) : 0.0f, red);
    const float av = block_max(live ? optstate_q8_scale_term(vi, 1) : 0.0f, red);
    if (live) {
        m_code[j] = (uint8_t)optstate_q8m_encode(mi, am);
        v_code[j] = optstate_q8v_encode(vi, av);
    }
    if (threadIdx.x == 0) m_scale[b] = am, v_scale[b] = av;
}

/* The packed form: COMPACT_E = 16 elements per thread, every array moved in 16-byte packs
 * (params and grads 16 / Pack16<T>::size packs, master 4, bf16 m and v 2, int8 codes 1), so the
 * 16 threads of a half-warp hold one OPTSTATE_BLOCK; its int8 scales are their maximum (a max
 * is exact in any order, so these are the element form's bits; a block whose terms are all NaN
 * gets -inf, as block_max gives it). All pointers 16-byte aligned; the int8 codes follow nb
 * scales, so they are 16-byte aligned only when nb is a multiple of 4, and moved as four 4-byte
 * words otherwise. The thread holding the end of k does its last elements one by one. */
enum { COMPACT_E = 16, COMPACT_THREADS = 256 };
static_assert(OPTSTATE_BLOCK % COMPACT_E == 0 && OPTSTATE_BLOCK / COMPACT_E == 16, "a half-warp per state block");

/* 16 int8 codes at p (4-byte aligned): one 16-byte access where p allows, else four words */
__device__ inline Pack16<uint8_t> load_codes(const uint8_t *p, bool a16) {
    if (a16) return load16(p);
    Pack16<uint8_t> r;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const uint32_t w = __ldcg(reinterpret_cast<const unsigned int *>(p) + q);
        memcpy(r.v + 4 * q, &w, 4);
    }
    return r;
}
__device__ inline void store_codes(uint8_t *p, const Pack16<uint8_t> &x, bool a16) {
    if (a16) return store16(p, x);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        unsigned int w;
        memcpy(&w, x.v + 4 * q, 4);
        __stcg(reinterpret_cast<unsigned int *>(p) + q, w);
    }
}

__device__ inline float half_warp_max(float x) {
    for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

template <class T>
static __global__ void adamw_update_compact_kernel16(T *params, float *master, const T *grads, void *m, void *v,
                                                     int state, size_t k, size_t nb, OptSegments seg, float lr,
                                                     float beta1, float beta2, float c1, float c2, float eps,
                                                     float grad_scale, uint64_t seed, size_t idx0) {
    constexpr int E = COMPACT_E, PT = Pack16<T>::size;
    const size_t j0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * E, b = j0 / OPTSTATE_BLOCK;
    const int live = j0 >= k ? 0 : k - j0 < (size_t)E ? (int)(k - j0) : E;
    float *m_scale = (float *)m, *v_scale = (float *)v;
    uint8_t *m_code = (uint8_t *)m + nb * sizeof(float), *v_code = (uint8_t *)v + nb * sizeof(float);
    uint16_t *m16 = (uint16_t *)m, *v16 = (uint16_t *)v;
    float mi[E], vi[E], g[E], w[E];
    if (live == E) { /* decode, load, update: whole packs */
        if (state == OPTSTATE_BF16) {
#pragma unroll
            for (int q = 0; q < E / 8; q++) {
                const Pack16<uint16_t> a = load16(m16 + j0 + 8 * q), c = load16(v16 + j0 + 8 * q);
#pragma unroll
                for (int e = 0; e < 8; e++) mi[8 * q + e] = bf16_to_float(a.v[e]), vi[8 * q + e] = bf16_to_float(c.v[e]);
            }
        } else {
            const bool a16 = (nb & 3) == 0;
            const Pack16<uint8_t> a = load_codes(m_code + j0, a16), c = load_codes(v_code + j0, a16);
            const float ms = m_scale[b], vs = v_scale[b];
#pragma unroll
            for (int e = 0; e < E; e++)
                mi[e] = optstate_q8m_decode((int8_t)a.v[e], ms), vi[e] = optstate_q8v_decode(c.v[e], vs);
        }
#pragma unroll
        for (int q = 0; q < E / PT; q++) {
            const Pack16<T> gp = load16(grads + j0 + PT * q);
#pragma unroll
            for (int e = 0; e < PT; e++) g[PT * q + e] = to_float(gp.v[e]) * grad_scale;
        }
        if (master) {
#pragma unroll
            for (int q = 0; q < E / 4; q++) {
                const Pack16<float> wp = load16(master + j0 + 4 * q);
#pragma unroll
                for (int e = 0; e < 4; e++) w[4 * q + e] = wp.v[e];
            }
        } else {
#pragma unroll
            for (int q = 0; q < E / PT; q++) {
                const Pack16<T> pp = load16(params + j0 + PT * q);
#pragma unroll
                for (int e = 0; e < PT; e++) w[PT * q + e] = to_float(pp.v[e]);
            }
        }
        int s = 0;
#pragma unroll
        for (int e = 0; e < E; e++) {
            while (j0 + e >= seg.end[s]) s++;
            w[e] = optstate_adamw(w[e], g[e], &mi[e], &vi[e], lr, beta1, beta2, c1, c2, eps, seg.decay[s]);
        }
        if (master) {
#pragma unroll
            for (int q = 0; q < E / 4; q++) {
                Pack16<float> wp;
#pragma unroll
                for (int e = 0; e < 4; e++) wp.v[e] = w[4 * q + e];
                store16(master + j0 + 4 * q, wp);
            }
        }
#pragma unroll
        for (int q = 0; q < E / PT; q++) {
            Pack16<T> pp;
#pragma unroll
            for (int e = 0; e < PT; e++) pp.v[e] = stochastic_round<T>(w[PT * q + e], llmc_hash32(seed, idx0 + j0 + PT * q + e));
            store16(params + j0 + PT * q, pp);
        }
    } else { /* the end of k: element by element, as adamw_update_compact_kernel */
        int s = 0;
        for (int e = 0; e < live; e++) {
            const size_t j = j0 + e;
            if (state == OPTSTATE_BF16) mi[e] = bf16_to_float(m16[j]), vi[e] = bf16_to_float(v16[j]);
            else mi[e] = optstate_q8m_decode((int8_t)m_code[j], m_scale[b]), vi[e] = optstate_q8v_decode(v_code[j], v_scale[b]);
            while (j >= seg.end[s]) s++;
            float wj = master ? master[j] : to_float(params[j]);
            wj = optstate_adamw(wj, to_float(grads[j]) * grad_scale, &mi[e], &vi[e], lr, beta1, beta2, c1, c2, eps,
                                seg.decay[s]);
            if (master) master[j] = wj;
            params[j] = stochastic_round<T>(wj, llmc_hash32(seed, idx0 + j));
        }
    }
    if (state == OPTSTATE_BF16) { /* (the same for every thread of the grid) */
        if (live == E) {
#pragma unroll
            for (int q = 0; q < E / 8; q++) {
                Pack16<uint16_t> a, c;
#pragma unroll
                for (int e = 0; e < 8; e++) a.v[e] = float_to_bf16(mi[8 * q + e]), c.v[e] = float_to_bf16(vi[8 * q + e]);
                store16(m16 + j0 + 8 * q, a), store16(v16 + j0 + 8 * q, c);
            }
        } else {
            for (int e = 0; e < live; e++) m16[j0 + e] = float_to_bf16(mi[e]), v16[j0 + e] = float_to_bf16(vi[e]);
        }
        return;
    }
    /* int8: the block's scales over its half-warp (every thread takes part; idle elements 0) */
    float am = 0.0f, av = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++)
        if (e < live) {
            const float tm = optstate_q8_scale_term(mi[e], 0), tv = optstate_q8_scale_term(vi[e], 1);
            am = e == 0 ? tm : fmaxf(am, tm), av = e == 0 ? tv : fmaxf(av, tv);
        }
    if (live > 0 && live < E) am = fmaxf(am, 0.0f), av = fmaxf(av, 0.0f);
    am = half_warp_max(am), av = half_warp_max(av);
    if (isnan(am)) am = -INFINITY;
    if (isnan(av)) av = -INFINITY;
    if (live == E) {
        Pack16<uint8_t> a, c;
#pragma unroll
        for (int e = 0; e < E; e++) a.v[e] = (uint8_t)optstate_q8m_encode(mi[e], am), c.v[e] = optstate_q8v_encode(vi[e], av);
        store_codes(m_code + j0, a, (nb & 3) == 0), store_codes(v_code + j0, c, (nb & 3) == 0);
    } else {
        for (int e = 0; e < live; e++) m_code[j0 + e] = (uint8_t)optstate_q8m_encode(mi[e], am), v_code[j0 + e] = optstate_q8v_encode(vi[e], av);
    }
    if (threadIdx.x % 16 == 0 && live > 0) m_scale[b] = am, v_scale[b] = av;
}

template <class T>
void adamw_update_compact(T *params, float *master, const T *grads, void *m, void *v, int state, size_t k,
                          const OptSegments *seg, float lr, float beta1, float beta2, float eps, int t, float grad_scale,
                          uint64_t seed, cudaStream_t stream, size_t idx0 = 0) {
    llmcCheck(k > 0 && t >= 1 && (state == OPTSTATE_BF16 || state == OPTSTATE_INT8),
              "adamw_update_compact: need k > 0, step t >= 1 and a bf16 or int8 state");
    const float c1 = 1.0f - powf(beta1, (float)t), c2 = 1.0f - powf(beta2, (float)t);
    const size_t nb = optstate_blocks(k);
    const bool packed = aligned16(params) && aligned16(grads) && (master == NULL || aligned16(master)) && aligned16(m) &&
                        aligned16(v);
    if (packed)
        adamw_update_compact_kernel16<<<(unsigned)ceil_div((long long)ceil_div((long long)k, COMPACT_E), COMPACT_THREADS),
                                        COMPACT_THREADS, 0, stream>>>(params, master, grads, m, v, state, k, nb, *seg, lr,
                                                                      beta1, beta2, c1, c2, eps, grad_scale, seed, idx0);
    else
        adamw_update_compact_kernel<<<(unsigned)nb, OPTSTATE_BLOCK, 0, stream>>>(
            params, master, grads, m, v, state, k, *seg, lr, beta1, beta2, c1, c2, eps, grad_scale, seed, idx0);
    kernelCheck();
}

template <class T>
static __global__ void norm_squared_partial_kernel(float *partial, const T *x, size_t n) {
    __shared__ float red[32];
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = to_float(x[i]);
        s += g * g;
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* Packed twin: the same blocks, each thread a fixed grid-stride subset of 16-byte packs; thread 0
 * of block 0 adds the tail (n % P). Loads only (the partials are single floats): named
 * *_reduce16, which test_sass.sh checks for 128-bit loads. */
template <class T>
static __global__ void norm_squared_partial_reduce16(float *partial, const T *x, size_t n) {
    constexpr int P = Pack16<T>::size;
    __shared__ float red[32];
    float s = 0.0f;
    const size_t packs = n / P;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += (size_t)gridDim.x * blockDim.x) {
        const Pack16<T> a = load16(x + i * P);
#pragma unroll
        for (int j = 0; j < P; j++) {
            const float g = to_float(a.v[j]);
            s += g * g;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (size_t i = packs * P; i < n; i++) {
            const float g = to_float(x[i]);
            s += g * g;
        }
    s = block_sum(s, red);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

static __global__ void norm_squared_finish_kernel(float *out, const float *partial, int count) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int k = 0; k < count; k++) s += partial[k];
    out[0] = (float)s;
}

template <class T>
void global_norm_squared(float *out, const T *grads, size_t n, float *scratch, cudaStream_t stream) {
    llmcCheck(n > 0, "global_norm_squared: n must be positive");
    /* the block count depends on n only (at least 4096 elements per block): deterministic */
    const size_t max_blocks = NORM_BLOCKS;
    const int blocks = (int)(n / 4096 + 1 < max_blocks ? n / 4096 + 1 : max_blocks);
    if (aligned16(grads)) norm_squared_partial_reduce16<<<blocks, 256, 0, stream>>>(scratch, grads, n);
    else norm_squared_partial_kernel<<<blocks, 256, 0, stream>>>(scratch, grads, n);
    kernelCheck();
    norm_squared_finish_kernel<<<1, 32, 0, stream>>>(out, scratch, blocks);
    kernelCheck();
}

#endif
