#include "llmc/cpu/layernorm.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"

static void layernorm_row(float *o, const float *x, float m, float s, const float *weight,
                          const float *bias, int C) {
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C) {
    const float eps = 1e-5f;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        /* two passes, each accumulated in double: a float running sum of C values with a large
         * common offset drifts by ~sqrt(C) ulps of the sum, more than the GPU's tree reduction
         * (seen on an H200 at C = 768, 2026-11-30); the reference must be the accurate one */
        double acc = 0.0;
        for (int c = 0; c < C; c++) acc += x[c];
        float m = (float)(acc / C);
        acc = 0.0;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            acc += d * d;
        }
        float v = (float)(acc / C);
        float s = 1.0f / sqrtf(v + eps);
        layernorm_row(out + (size_t)i * C, x, m, s, weight, bias, C);
        mean[i] = m;
        rstd[i] = s;
    }
}

void layernorm_recompute(float *out, const float *inp, const float *mean, const float *rstd,
                         const float *weight, const float *bias, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        layernorm_row(out + (size_t)i * C, inp + (size_t)i * C, mean[i], rstd[i], weight, bias, C);
}

/* Row chunks for the deterministic dweight/dbias reduction: a fixed count, not the thread count. */
enum { LN_CHUNKS = 32 };

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C) {
    float *partial = (float *)mallocCheck((size_t)LN_CHUNKS * 2 * C * sizeof(float), "layernorm partials");
    memset(partial, 0, (size_t)LN_CHUNKS * 2 * C * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int k = 0; k < LN_CHUNKS; k++) {
        float *pw = partial + (size_t)k * 2 * C, *pb = pw + C;
        int i0 = (int)((long long)N * k / LN_CHUNKS), i1 = (int)((long long)N * (k + 1) / LN_CHUNKS);
        for (int i = i0; i < i1; i++) {
            const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            /* two reductions: mean(dnorm) and mean(dnorm * xhat) */
            float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                float dnorm = weight[c] * dy[c];
                dnorm_mean += dnorm;
                dnorm_xhat_mean += dnorm * xhat;
            }
            dnorm_mean /= C;
            dnorm_xhat_mean /= C;
            for (int c = 0; c < C; c++) {
                float xhat = (x[c] - m) * s;
                float dnorm = weight[c] * dy[c];
                pb[c] += dy[c];
                pw[c] += xhat * dy[c];
                dx[c] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
            }
        }
    }
    for (int k = 0; k < LN_CHUNKS && dweight; k++) { /* (NULL: a frozen LayerNorm) */
        const float *pw = partial + (size_t)k * 2 * C, *pb = pw + C;
        for (int c = 0; c < C; c++) {
            dweight[c] += pw[c];
            dbias[c] += pb[c];
        }
    }
    free(partial);
}
