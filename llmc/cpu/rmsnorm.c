#include "llmc/cpu/rmsnorm.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"

/* out = x * r * weight for one row (the forward's and the recompute's one expression) */
static void rmsnorm_row(float *o, const float *x, float r, const float *weight, int C) {
    for (int j = 0; j < C; j++) o[j] = x[j] * r * weight[j];
}

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float ss = 0.0f;
        for (int j = 0; j < C; j++) ss += x[j] * x[j];
        float r = 1.0f / sqrtf(ss / C + eps);
        rmsnorm_row(out + (size_t)i * C, x, r, weight, C);
        rstd[i] = r;
    }
}

void rmsnorm_recompute(float *out, const float *inp, const float *rstd, const float *weight, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) rmsnorm_row(out + (size_t)i * C, inp + (size_t)i * C, rstd[i], weight, C);
}

/* rows per dweight partial sum: fixed, so the reduction order does not depend on threads */
enum { RMSNORM_CHUNK = 64 };

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int N, int C) {
    const int chunks = (N + RMSNORM_CHUNK - 1) / RMSNORM_CHUNK;
    float *partial = (float *)callocCheck((size_t)chunks * C, sizeof(float), "rmsnorm dweight partials");
#pragma omp parallel for schedule(static)
    for (int c = 0; c < chunks; c++) {
        float *dw = partial + (size_t)c * C;
        const int end = (c + 1) * RMSNORM_CHUNK < N ? (c + 1) * RMSNORM_CHUNK : N;
        for (int i = c * RMSNORM_CHUNK; i < end; i++) {
            const float *x = inp + (size_t)i * C, *d = dout + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            const float r = rstd[i];
            float dot = 0.0f; /* sum(dnorm * xhat) */
            for (int j = 0; j < C; j++) dot += d[j] * weight[j] * x[j] * r;
            dot /= C;
            for (int j = 0; j < C; j++) {
                float xhat = x[j] * r;
                dx[j] += r * (d[j] * weight[j] - xhat * dot);
                dw[j] += d[j] * xhat;
            }
        }
    }
    for (int c = 0; c < chunks && dweight; c++) /* (NULL: a frozen RMSNorm) */
        for (int j = 0; j < C; j++) dweight[j] += partial[(size_t)c * C + j];
    free(partial);
}
