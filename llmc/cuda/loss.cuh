/*
 * loss.cuh - the mean of a micro-batch's per-position losses on the device, so a training
 * micro-step never waits for its loss: the step's mean losses add up in a device accumulator the
 * host reads once per step (model.cuh: cudamodel_read_step_loss).
 * Order (deterministic, the same every run): one block of LOSS_MEAN_THREADS threads; thread t sums
 * positions t, t + LOSS_MEAN_THREADS, ... in increasing order in fp32, then a fixed binary tree
 * over the threads; the mean is that sum / n in fp32 (as the CPU's sum / n, in another order).
 */
#ifndef LLMC_CUDA_LOSS_CUH
#define LLMC_CUDA_LOSS_CUH

#include "llmc/cuda/common.cuh"

enum { LOSS_MEAN_THREADS = 256 };

/* *mean = sum(losses[0..n)) / n; and *acc += *mean (fp64) when acc is not NULL. */
static __global__ void loss_mean_kernel(float *mean, double *acc, const float *losses, int n) {
    __shared__ float part[LOSS_MEAN_THREADS];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += LOSS_MEAN_THREADS) s += losses[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = LOSS_MEAN_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float m = part[0] / (float)n;
        *mean = m;
        if (acc) *acc += (double)m;
    }
}

inline void loss_mean(float *mean, double *acc, const float *losses, int n, cudaStream_t stream) {
    llmcCheck(n > 0, "loss_mean: n must be positive");
    loss_mean_kernel<<<1, LOSS_MEAN_THREADS, 0, stream>>>(mean, acc, losses, n);
    kernelCheck();
}

#endif
