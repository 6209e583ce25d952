/* common_lab.h - helpers for the kernel lab programs in dev/cuda: random device tensors,
 * CPU comparison and cudaEvent timing. Each lab program #includes the real llmc/cuda header
 * it studies (never a copy). Build: make build/dev/cuda/NAME; run on a GPU. */
#ifndef LLMC_DEV_CUDA_COMMON_LAB_H
#define LLMC_DEV_CUDA_COMMON_LAB_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llmc/cuda/common.cuh"
#include "llmc/rng.h"

template <class T> static T *lab_upload(float *h, size_t n) {
    T *tmp = (T *)malloc(n * sizeof(T)), *d;
    for (size_t i = 0; i < n; i++) h[i] = to_float(tmp[i] = from_float<T>(h[i]));
    cudaCheck(cudaMalloc(&d, n * sizeof(T)));
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(T), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

template <class T> static float lab_max_abs_diff(const T *d, const float *ref, size_t n) {
    T *tmp = (T *)malloc(n * sizeof(T));
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(T), cudaMemcpyDeviceToHost));
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(to_float(tmp[i]) - ref[i]));
    free(tmp);
    return worst;
}

/* Mean milliseconds of fn() over `reps` runs after one warmup. */
template <class F> static float lab_time_ms(F fn, int reps) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    fn();
    cudaCheck(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) fn();
    cudaCheck(cudaEventRecord(b));
    cudaCheck(cudaEventSynchronize(b));
    float ms;
    cudaCheck(cudaEventElapsedTime(&ms, a, b));
    return ms / reps;
}
#endif
