#include "llmc/cpu/classifier.h"

#include <math.h>
#include <stddef.h>

void fused_classifier(float *logits, float *losses, const int *targets, float dloss, int N, int V, int Vp,
                      int write_dlogits) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * Vp;
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) maxval = z[v] > maxval ? z[v] : maxval;
        /* the sum of V ~ 50K exponentials accumulates in double: a float running sum drifts by
         * ~1e-5 relative at GPT-2's vocabulary, more than the GPU's tree reductions, and the
         * reference must be the more accurate of the two (seen on an H200, 2026-11-30) */
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += expf(z[v] - maxval);
        int y = targets[i];
        losses[i] = (float)log(sum) + maxval - z[y];
        if (!write_dlogits) continue;
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) z[v] = expf(z[v] - maxval) * inv * dloss;
        z[y] -= dloss;
        for (int v = V; v < Vp; v++) z[v] = 0.0f;
    }
}

void distill_classifier(float *logits, float *losses, const int *targets, const float *teacher, int teacher_stride,
                        float alpha, float temperature, float dloss, int N, int V, int Vp, double *ce_sum, double *kd_sum) {
    const float t = temperature, dce = dloss * (1.0f - alpha), dkd = dloss * alpha * t;
    double ce_total = 0.0, kd_total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : ce_total, kd_total)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * Vp;
        const float *r = teacher + (size_t)i * teacher_stride;
        float maxval = -INFINITY, tmax = -INFINITY;
        for (int v = 0; v < V; v++) {
            maxval = z[v] > maxval ? z[v] : maxval;
            tmax = r[v] > tmax ? r[v] : tmax;
        }
        /* (the sums in double, as fused_classifier's; max(z / t) = max(z) / t for t > 0) */
        const float smax_t = maxval / t, tmax_t = tmax / t;
        double sum = 0.0, sum_s = 0.0, sum_r = 0.0;
        for (int v = 0; v < V; v++) {
            sum += expf(z[v] - maxval);
            sum_s += expf(z[v] / t - smax_t);
            sum_r += expf(r[v] / t - tmax_t);
        }
        const int y = targets[i];
        const float ce = (float)log(sum) + maxval - z[y];
        const double lse_s = log(sum_s), lse_r = log(sum_r);
        double kd = 0.0;
        for (int v = 0; v < V; v++) {
            const double log_r = (double)(r[v] / t - tmax_t) - lse_r, log_q = (double)(z[v] / t - smax_t) - lse_s;
            kd += exp(log_r) * (log_r - log_q);
        }
        losses[i] = (1.0f - alpha) * ce + alpha * t * t * (float)kd;
        ce_total += ce;
        kd_total += kd;
        const float inv = (float)(1.0 / sum), inv_s = (float)(1.0 / sum_s), inv_r = (float)(1.0 / sum_r);
        for (int v = 0; v < V; v++) {
            const float q = expf(z[v] / t - smax_t) * inv_s, rv = expf(r[v] / t - tmax_t) * inv_r;
            z[v] = expf(z[v] - maxval) * inv * dce + dkd * (q - rv);
        }
        z[y] -= dce;
        for (int v = V; v < Vp; v++) z[v] = 0.0f;
    }
    *ce_sum = ce_total;
    *kd_sum = kd_total;
}
