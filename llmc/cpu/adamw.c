#include "adamw.h"

#include <math.h>

void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, float grad_scale) {
    const float c1 = 1.0f - powf(beta1, (float)t), c2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / c1, vhat = vi / c2;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
}

enum { NORM_CHUNKS = 256 };

double global_norm_squared(const float *grads, size_t n) {
    double partial[NORM_CHUNKS];
#pragma omp parallel for schedule(static)
    for (int k = 0; k < NORM_CHUNKS; k++) {
        size_t i0 = n * (size_t)k / NORM_CHUNKS, i1 = n * (size_t)(k + 1) / NORM_CHUNKS;
        double s = 0.0;
        for (size_t i = i0; i < i1; i++) s += (double)grads[i] * grads[i];
        partial[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < NORM_CHUNKS; k++) total += partial[k];
    return total;
}
