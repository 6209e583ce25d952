#include "llmc/cpu/gelu.h"

#include <math.h>

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh over a block of values. glibc's libmvec has vector tanhf (8 lanes on AVX2, <= 4 ulp
 * like the scalar one's few); GCC only calls it under -ffast-math, so we call it ourselves.
 * GELU's tanh is most of the time the CPU spends outside matmuls. */
#if LLMC_HAVE_LIBMVEC && defined(__AVX2__)
#include <immintrin.h>
__m256 _ZGVdN8v_tanhf(__m256 x);
static void tanh_block(float *y, const float *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _ZGVdN8v_tanhf(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = tanhf(x[i]);
}
#else
static void tanh_block(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = tanhf(x[i]);
}
#endif

enum { BLOCK = 256 };

/* th[i] = tanh(k (x + 0.044715 x^3)) for a block: the part forward and backward share. */
static void gelu_tanh_block(float *th, const float *x, int n) {
    float u[BLOCK];
    for (int i = 0; i < n; i++) u[i] = GELU_SCALE * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    tanh_block(th, u, n);
}

/* The block of inp at i0 (BLOCK elements, fewer at the end of N): th = its tanh part; returns its length. */
static int gelu_tanh_at(float *th, const float *inp, size_t i0, size_t N) {
    int n = N - i0 < BLOCK ? (int)(N - i0) : BLOCK;
    gelu_tanh_block(th, inp + i0, n);
    return n;
}

void gelu_forward(float *out, const float *inp, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i0 = 0; i0 < N; i0 += BLOCK) {
        float th[BLOCK];
        const int n = gelu_tanh_at(th, inp, i0, N);
        const float *x = inp + i0;
        for (int i = 0; i < n; i++) out[i0 + i] = 0.5f * x[i] * (1.0f + th[i]);
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i0 = 0; i0 < N; i0 += BLOCK) {
        float th[BLOCK];
        const int n = gelu_tanh_at(th, inp, i0, N);
        const float *x = inp + i0;
        for (int i = 0; i < n; i++) {
            float sech2 = 1.0f - th[i] * th[i];
            float local = 0.5f * (1.0f + th[i]) + 0.5f * x[i] * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x[i] * x[i]);
            dinp[i0 + i] = local * dout[i0 + i];
        }
    }
}
