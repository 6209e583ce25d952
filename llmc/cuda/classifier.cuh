/*
 * classifier.cuh - softmax + cross-entropy + dlogits in one kernel (CUDA twin of
 * llmc/cpu/classifier.h), over the real vocabulary only.
 * For each row i of logits (N, Vp), columns v < V take part:
 *   max = max_v z[v]; sum = sum_v exp(z[v] - max)            (fp32; one pass, online: the sum
 *                                                               agrees with the CPU's to rounding)
 *   losses[i] = log(sum) + max - z[targets[i]]                (fp32)
 * With write_dlogits, logits is overwritten in place by the gradient of dloss * losses[i]:
 *   z[v] = exp(z[v] - max) / sum * dloss - dloss * [v == targets[i]] for v < V, 0 for V <= v < Vp
 * Shapes: logits (N, Vp) in T; losses (N) fp32; targets (N) in [0, V).
 * One block per row; block reductions in a fixed order (deterministic). 16-byte packs when Vp is
 * a whole number of them and logits is 16-byte aligned, one element per thread otherwise.
 */
#ifndef LLMC_CUDA_CLASSIFIER_CUH
#define LLMC_CUDA_CLASSIFIER_CUH

#include "llmc/cuda/common.cuh"

/* The end of a row's pass: the block's max and sum from each thread's running (tm, ts) (max of
 * the maxima, the sums moved to it; fixed-order block reductions through the shared red[32]);
 * thread 0 writes the row's loss log(sum) + max - zy. Returns the max; *inv = 1 / sum. */
__device__ inline float classifier_row_stats(float *losses, float tm, float ts, float zy, float *red, float *inv) {
    const float mx = block_max(tm, red);
    const float s = block_sum(tm == -INFINITY ? 0.0f : ts * expf(tm - mx), red);
    if (threadIdx.x == 0) losses[blockIdx.x] = logf(s) + mx - zy;
    *inv = 1.0f / s;
    return mx;
}

template <class T>
static __global__ void fused_classifier_rowblock_kernel(T *logits, float *losses, const int *targets, float dloss,
                                                        int V, int Vp, int write_dlogits) {
    __shared__ float red[32];
    T *z = logits + (size_t)blockIdx.x * Vp;
    const int y = targets[blockIdx.x];
    const float zy = to_float(z[y]); /* read before any thread overwrites the row */
    /* one pass over the row: each thread keeps a running max and a sum relative to it (online
     * softmax), then the block combines them: max of the maxima, sums moved to that max */
    float tm = -INFINITY, ts = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        const float x = to_float(z[v]);
        if (x > tm) {
            ts = ts * expf(tm - x) + 1.0f; /* expf(-inf) = 0 on the first element */
            tm = x;
        } else if (tm != -INFINITY) { /* (a row of -inf so far adds nothing) */
            ts += expf(x - tm);
        }
    }
    float inv;
    const float mx = classifier_row_stats(losses, tm, ts, zy, red, &inv);
    if (!write_dlogits) return;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float d = 0.0f;
        if (v < V) {
            d = expf(to_float(z[v]) - mx) * inv * dloss;
            if (v == y) d -= dloss;
        }
        z[v] = from_float<T>(d);
    }
}

/* The same over 16-byte packs (common.cuh): needs Vp a whole number of packs and a 16-byte
 * aligned logits pointer. Per pack: its maximum, then the running sum moved to the new maximum
 * and the pack's exponentials added (one rescale per pack instead of a branch per element). */
template <class T>
static __global__ void fused_classifier_rowblock_kernel16(T *logits, float *losses, const int *targets, float dloss,
                                                          int V, int Vp, int write_dlogits) {
    constexpr int P = Pack16<T>::size;
    __shared__ float red[32];
    T *z = logits + (size_t)blockIdx.x * Vp;
    const int y = targets[blockIdx.x];
    const float zy = to_float(z[y]); /* read before any thread overwrites the row */
    float tm = -INFINITY, ts = 0.0f;
    const int packs = Vp / P, live = (V + P - 1) / P; /* packs holding a real column */
    for (int p = threadIdx.x; p < live; p += blockDim.x) {
        const Pack16<T> x = load16(z + (size_t)p * P);
        float f[P], pm = -INFINITY;
#pragma unroll
        for (int j = 0; j < P; j++) {
            f[j] = p * P + j < V ? to_float(x.v[j]) : -INFINITY;
            pm = fmaxf(pm, f[j]);
        }
        if (pm == -INFINITY) continue; /* (a pack of -inf adds nothing) */
        const float m_new = fmaxf(tm, pm);
        float add = 0.0f;
#pragma unroll
        for (int j = 0; j < P; j++) add += expf(f[j] - m_new); /* expf(-inf) = 0 past V */
        ts = ts * expf(tm - m_new) + add;
        tm = m_new;
    }
    float inv;
    const float mx = classifier_row_stats(losses, tm, ts, zy, red, &inv);
    if (!write_dlogits) return;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
        Pack16<T> x = p < live ? load16(z + (size_t)p * P) : Pack16<T>{};
#pragma unroll
        for (int j = 0; j < P; j++) {
            const int v = p * P + j;
            float d = 0.0f;
            if (v < V) {
                d = expf(to_float(x.v[j]) - mx) * inv * dloss;
                if (v == y) d -= dloss;
            }
            x.v[j] = from_float<T>(d);
        }
        store16(z + (size_t)p * P, x);
    }
}

template <class T>
void fused_classifier(T *logits, float *losses, const int *targets, float dloss, int N, int V, int Vp,
                      int write_dlogits, cudaStream_t stream) {
    llmcCheck(N > 0 && V > 0 && Vp >= V, "fused_classifier: need N > 0 and 0 < V <= Vp");
    if (Vp % Pack16<T>::size == 0 && aligned16(logits))
        fused_classifier_rowblock_kernel16<<<N, 512, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    else
        fused_classifier_rowblock_kernel<<<N, 512, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    kernelCheck();
}

#endif
