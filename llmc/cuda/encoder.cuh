/*
 * encoder.cuh - token + position embedding (CUDA twin of llmc/cpu/encoder.h).
 * forward:  out[b,t,:] = wte[inp[b,t], :] + wpe[t, :]                              (overwrites)
 * backward: dwte[tok, :] += sum over positions with inp == tok of dout[b,t,:]
 *           dwpe[t, :]   += sum over b of dout[b,t,:]                              (accumulates)
 * Shapes: out, dout (B, T, C); inp (B, T) token ids in [0, V); wte, dwte (Vp, C); wpe, dwpe (maxT, C).
 * Token-only (no position table: Llama 3, the MLP): encoder_forward_wte, encoder_backward_wte
 * (out = wte[inp]; dwte as above).
 *
 * Determinism: the backward never races. The host groups the positions by token
 * (encoder_buckets_build: positions in increasing (b, t) order within each token), and one
 * block owns one token's row of dwte, summing its positions in that order starting from the
 * old dwte value - the same order of additions as the CPU reference, so in fp32 the result is
 * bit-identical to it. dwpe: one thread per (t, c) sums over b in order, likewise.
 *
 * Packed forms (16-byte packs, common.cuh): when C is a whole number of packs and the tables
 * and outputs are 16-byte aligned (encoder_packed), each thread moves one pack (forward,
 * dwpe) or one pack of a token's row (dwte), with the same additions in the same order as the
 * element-per-thread kernels, which remain for the other shapes.
 */
#ifndef LLMC_CUDA_ENCODER_CUH
#define LLMC_CUDA_ENCODER_CUH

#include <stdlib.h>

#include "llmc/cuda/common.cuh"

template <class T>
static __global__ void encoder_forward_kernel(T *out, const int *inp, const T *wte, const T *wpe, int N, int T_,
                                              int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    size_t bt = idx / C;
    int c = (int)(idx % C), t = (int)(bt % T_);
    out[idx] = from_float<T>(to_float(wte[(size_t)inp[bt] * C + c]) + to_float(wpe[(size_t)t * C + c]));
}

/* One pack of one position per thread. */
template <class T>
static __global__ void encoder_forward_kernel16(T *out, const int *inp, const T *wte, const T *wpe, int N, int T_, int C) {
    constexpr int P = Pack16<T>::size;
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (idx >= (size_t)N * C) return;
    size_t bt = idx / C;
    int c = (int)(idx % C), t = (int)(bt % T_);
    Pack16<T> a = load16(wte + (size_t)inp[bt] * C + c), b = load16(wpe + (size_t)t * C + c), y;
#pragma unroll
    for (int k = 0; k < P; k++) y.v[k] = from_float<T>(to_float(a.v[k]) + to_float(b.v[k]));
    store16(out + idx, y);
}

/* Whether the packed kernels can run: C a whole number of packs, the (C)-strided tables and
 * the outputs 16-byte aligned. */
template <class T> inline bool encoder_packed(int C, const void *a, const void *b, const void *c) {
    return C % Pack16<T>::size == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

template <class T>
void encoder_forward(T *out, const int *inp, const T *wte, const T *wpe, int B, int T_, int C, cudaStream_t stream) {
    llmcCheck(B > 0 && T_ > 0 && C > 0, "encoder_forward: B, T, C must be positive");
    const int block = 256;
    if (encoder_packed<T>(C, out, wte, wpe))
        encoder_forward_kernel16<<<ceil_div((long long)B * T_ * C / Pack16<T>::size, block), block, 0, stream>>>(
            out, inp, wte, wpe, B * T_, T_, C);
    else
        encoder_forward_kernel<<<ceil_div((long long)B * T_ * C, block), block, 0, stream>>>(out, inp, wte, wpe, B * T_, T_, C);
    kernelCheck();
}

/* The positions of a batch grouped by token, in device memory:
 * ints[0 .. n) the distinct tokens, ints[n .. 2n+1) offsets into the position list,
 * ints[2n+1 .. 2n+1+B*T) positions (b*T + t), increasing within each token. */
typedef struct {
    const int *d_ints;
    int num_tokens; /* n */
} EncoderBuckets;

/* Capacity in ints that encoder_buckets_build needs for N = B*T positions. */
inline size_t encoder_buckets_capacity(int N) { return 3 * (size_t)N + 1; }

/* Builds the bucket layout on the host into host_ints (encoder_buckets_capacity(N) ints, with
 * `work` another N ints of scratch); returns the number of distinct tokens. Counting sort by
 * token, stable, so positions stay in increasing order. vocab: ids are in [0, vocab). */
inline int encoder_buckets_build(int *host_ints, int *work, const int *inp, int N, int vocab) {
    /* work[i] = i, sorted stably by inp[i]: insertion into per-token linked lists would need
     * vocab-sized memory; a stable merge sort on N keys does not. */
    for (int i = 0; i < N; i++) work[i] = i;
    int *tmp = host_ints; /* borrow the output as merge scratch (3N+1 >= N ints) */
    for (int width = 1; width < N; width *= 2) {
        for (int lo = 0; lo < N; lo += 2 * width) {
            int mid = lo + width < N ? lo + width : N, hi = lo + 2 * width < N ? lo + 2 * width : N;
            int a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = inp[work[b]] < inp[work[a]] ? work[b++] : work[a++];
            while (a < mid) tmp[k++] = work[a++];
            while (b < hi) tmp[k++] = work[b++];
        }
        memcpy(work, tmp, (size_t)N * sizeof(int));
    }
    (void)vocab;
    int n = 0;
    for (int i = 0; i < N; i++)
        if (i == 0 || inp[work[i]] != inp[work[i - 1]]) n++;
    int *tokens = host_ints, *offsets = host_ints + n, *positions = host_ints + 2 * n + 1;
    int j = 0;
    for (int i = 0; i < N; i++) {
        if (i == 0 || inp[work[i]] != inp[work[i - 1]]) {
            tokens[j] = inp[work[i]];
            offsets[j] = i;
            j++;
        }
        positions[i] = work[i];
    }
    offsets[n] = N;
    return n;
}

/* One block per distinct token; threads stride over channels. */
template <class T>
static __global__ void encoder_backward_wte_kernel(T *dwte, const T *dout, const int *ints, int n, int C) {
    const int *tokens = ints, *offsets = ints + n, *positions = ints + 2 * n + 1;
    int j = blockIdx.x;
    T *row = dwte + (size_t)tokens[j] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = to_float(row[c]);
        for (int p = offsets[j]; p < offsets[j + 1]; p++) acc += to_float(dout[(size_t)positions[p] * C + c]);
        row[c] = from_float<T>(acc);
    }
}

template <class T>
static __global__ void encoder_backward_wpe_kernel(T *dwpe, const T *dout, int B, int T_, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T_ * C) return;
    float acc = to_float(dwpe[idx]);
    for (int b = 0; b < B; b++) acc += to_float(dout[(size_t)b * T_ * C + idx]);
    dwpe[idx] = from_float<T>(acc);
}

/* Packed twins of the two kernels above: a thread owns P consecutive channels. */
template <class T>
static __global__ void encoder_backward_wte_kernel16(T *dwte, const T *dout, const int *ints, int n, int C) {
    constexpr int P = Pack16<T>::size;
    const int *tokens = ints, *offsets = ints + n, *positions = ints + 2 * n + 1;
    int j = blockIdx.x;
    T *row = dwte + (size_t)tokens[j] * C;
    for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
        float acc[P];
        pack_to_floats(acc, load16(row + c));
        for (int p = offsets[j]; p < offsets[j + 1]; p++) pack_add_to_floats(acc, load16(dout + (size_t)positions[p] * C + c));
        store16(row + c, floats_to_pack<T>(acc));
    }
}

template <class T>
static __global__ void encoder_backward_wpe_kernel16(T *dwpe, const T *dout, int B, int T_, int C) {
    constexpr int P = Pack16<T>::size;
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (idx >= (size_t)T_ * C) return;
    float acc[P];
    pack_to_floats(acc, load16(dwpe + idx));
    for (int b = 0; b < B; b++) pack_add_to_floats(acc, load16(dout + (size_t)b * T_ * C + idx));
    store16(dwpe + idx, floats_to_pack<T>(acc));
}

template <class T>
void encoder_backward(T *dwte, T *dwpe, const T *dout, const EncoderBuckets *buckets, int B, int T_, int C,
                      cudaStream_t stream) {
    llmcCheck(B > 0 && T_ > 0 && C > 0 && buckets->num_tokens > 0, "encoder_backward: empty batch");
    const int block = 256;
    if (encoder_packed<T>(C, dwte, dwpe, dout)) {
        encoder_backward_wte_kernel16<<<buckets->num_tokens, 128, 0, stream>>>(dwte, dout, buckets->d_ints, buckets->num_tokens, C);
        kernelCheck();
        encoder_backward_wpe_kernel16<<<ceil_div((long long)T_ * C / Pack16<T>::size, block), block, 0, stream>>>(dwpe, dout, B, T_, C);
        kernelCheck();
        return;
    }
    encoder_backward_wte_kernel<<<buckets->num_tokens, 128, 0, stream>>>(dwte, dout, buckets->d_ints, buckets->num_tokens, C);
    kernelCheck();
    encoder_backward_wpe_kernel<<<ceil_div((long long)T_ * C, block), block, 0, stream>>>(dwpe, dout, B, T_, C);
    kernelCheck();
}

/* ---- token-only: out[i, :] = wte[inp[i], :] ------------------------------------------------ */
template <class T> static __global__ void encoder_forward_wte_kernel(T *out, const int *inp, const T *wte, int N, int C) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    out[idx] = wte[(size_t)inp[idx / C] * C + idx % C];
}

template <class T> void encoder_forward_wte(T *out, const int *inp, const T *wte, int N, int C, cudaStream_t stream) {
    encoder_forward_wte_kernel<<<ceil_div((long long)N * C, 256), 256, 0, stream>>>(out, inp, wte, N, C);
    kernelCheck();
}

/* dwte += each token's positions' rows of dout, summed in position order (encoder_backward's dwte). */
template <class T> void encoder_backward_wte(T *dwte, const T *dout, const EncoderBuckets *buckets, int C, cudaStream_t stream) {
    if (encoder_packed<T>(C, dwte, dout, dout))
        encoder_backward_wte_kernel16<<<buckets->num_tokens, 128, 0, stream>>>(dwte, dout, buckets->d_ints, buckets->num_tokens, C);
    else
        encoder_backward_wte_kernel<<<buckets->num_tokens, 128, 0, stream>>>(dwte, dout, buckets->d_ints, buckets->num_tokens, C);
    kernelCheck();
}

#endif
