#include "llmc/cpu/adamw.h"

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

void adamw_update_compact(float *params, const float *grads, void *m, void *v, int type, size_t k,
                          const OptSegments *seg, float lr, float beta1, float beta2, float eps, int t,
                          float grad_scale) {
    adamw_update_compact_blocks(params, grads, m, v, type, k, seg, 0, optstate_blocks(k), lr, beta1, beta2, eps, t,
                                grad_scale);
}

void adamw_update_compact_blocks(float *params, const float *grads, void *m, void *v, int type, size_t k,
                                 const OptSegments *seg, size_t b0, size_t b1, float lr, float beta1, float beta2,
                                 float eps, int t, float grad_scale) {
    const float c1 = 1.0f - powf(beta1, (float)t), c2 = 1.0f - powf(beta2, (float)t);
#pragma omp parallel for schedule(static)
    for (long long b = (long long)b0; b < (long long)b1; b++) {
        float mb[OPTSTATE_BLOCK], vb[OPTSTATE_BLOCK];
        const size_t j0 = (size_t)b * OPTSTATE_BLOCK, count = k - j0 < OPTSTATE_BLOCK ? k - j0 : OPTSTATE_BLOCK;
        optstate_load_block(m, type, 0, k, (size_t)b, mb);
        optstate_load_block(v, type, 1, k, (size_t)b, vb);
        int s = 0;
        for (size_t j = 0; j < count; j++) {
            const size_t i = j0 + j;
            while (i >= seg->end[s]) s++;
            params[i] = optstate_adamw(params[i], grads[i] * grad_scale, &mb[j], &vb[j], lr, beta1, beta2, c1, c2, eps,
                                       seg->decay[s]);
        }
        optstate_store_block(m, type, 0, k, (size_t)b, mb);
        optstate_store_block(v, type, 1, k, (size_t)b, vb);
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
