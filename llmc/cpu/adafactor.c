/* adafactor.c - Adafactor's per-tensor update (adafactor.h). */
#include "llmc/cpu/adafactor.h"
#include "llmc/core/check.h"
#include "llmc/cpu/adamw.h"

#include <math.h>
#include <stdlib.h>

/* The step size of the tensor: lr, or with param_scale lr * max(eps2, RMS(params)). */
static float step_size(const float *params, size_t n, const AdafactorArgs *a) {
    if (!a->param_scale) return a->lr;
    float rms = (float)sqrt(global_norm_squared(params, n) / (double)n); /* (fixed chunks: deterministic) */
    return a->lr * (rms > a->eps2 ? rms : a->eps2);
}

/* u /= max(1, RMS(u) / clip), from the sum of squares of u. */
static float clip_divisor(double sumsq, size_t n, float clip) {
    float d = (float)sqrt(sumsq / (double)n) / clip;
    return d > 1.0f ? d : 1.0f;
}

/* The last part of the update on element i: u (before the clip divisor and lr). */
static inline float finish(float *p, float *m, float u, float div, float lr, const AdafactorArgs *a) {
    u = u / div * lr;
    if (m) u = *m = a->beta1 * *m + (1.0f - a->beta1) * u;
    float x = *p;
    if (a->weight_decay != 0.0f) x = x + x * (-a->weight_decay * lr);
    *p = x - u;
    return u;
}

void adafactor_update_factored(float *params, const float *grads, float *row, float *col, float *m, size_t rows,
                               size_t cols, const AdafactorArgs *a) {
    const float lr = step_size(params, rows * cols, a), s = a->grad_scale;
    double *colsum = (double *)callocCheck(cols, sizeof(double), "Adafactor column sums");
    /* the row statistics (rows in parallel), then the column sums row by row (a fixed order) */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        const float *g = grads + i * cols;
        double r = 0.0;
        for (size_t j = 0; j < cols; j++) {
            float gj = g[j] * s;
            r += (double)(gj * gj + a->eps1);
        }
        row[i] = row[i] * a->b2t + (float)(r / (double)cols) * a->one_minus_b2t;
    }
    for (size_t i = 0; i < rows; i++) {
        const float *g = grads + i * cols;
        for (size_t j = 0; j < cols; j++) {
            float gj = g[j] * s;
            colsum[j] += (double)(gj * gj + a->eps1);
        }
    }
    double rmean = 0.0;
    for (size_t i = 0; i < rows; i++) rmean += row[i];
    const float rm = (float)(rmean / (double)rows);
    for (size_t j = 0; j < cols; j++) {
        col[j] = col[j] * a->b2t + (float)(colsum[j] / (double)rows) * a->one_minus_b2t;
        colsum[j] = 1.0f / sqrtf(col[j]); /* (reused: the column factors, as floats) */
    }
    double *rowsq = (double *)mallocCheck(rows * sizeof(double), "Adafactor row sums");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        const float rf = 1.0f / sqrtf(row[i] / rm);
        const float *g = grads + i * cols;
        double r = 0.0;
        for (size_t j = 0; j < cols; j++) {
            float u = rf * (float)colsum[j] * (g[j] * s);
            r += (double)u * u;
        }
        rowsq[i] = r;
    }
    double ss = 0.0; /* (summed in row order: the same bits for any number of threads) */
    for (size_t i = 0; i < rows; i++) ss += rowsq[i];
    free(rowsq);
    const float div = clip_divisor(ss, rows * cols, a->clip);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        const float rf = 1.0f / sqrtf(row[i] / rm);
        const size_t o = i * cols;
        for (size_t j = 0; j < cols; j++)
            finish(params + o + j, m ? m + o + j : NULL, rf * (float)colsum[j] * (grads[o + j] * s), div, lr, a);
    }
    free(colsum);
}

void adafactor_update_vector(float *params, const float *grads, float *v, float *m, size_t n, const AdafactorArgs *a) {
    const float lr = step_size(params, n, a), s = a->grad_scale;
    enum { CHUNKS = 64 };
    double part[CHUNKS]; /* fixed chunks, summed in order: the same bits for any number of threads */
#pragma omp parallel for schedule(static)
    for (int k = 0; k < CHUNKS; k++) {
        double r = 0.0;
        for (size_t i = n * (size_t)k / CHUNKS; i < n * (size_t)(k + 1) / CHUNKS; i++) {
            float g = grads[i] * s;
            v[i] = v[i] * a->b2t + (g * g + a->eps1) * a->one_minus_b2t;
            float u = (1.0f / sqrtf(v[i])) * g;
            r += (double)u * u;
        }
        part[k] = r;
    }
    double ss = 0.0;
    for (int k = 0; k < CHUNKS; k++) ss += part[k];
    const float div = clip_divisor(ss, n, a->clip);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) finish(params + i, m ? m + i : NULL, (1.0f / sqrtf(v[i])) * (grads[i] * s), div, lr, a);
}
