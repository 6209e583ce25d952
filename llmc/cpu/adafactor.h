/* Adafactor's update of one parameter tensor (Shazeer & Stern 2018; the semantics of HF
 * transformers' Adafactor with relative_step, scale_parameter and warmup_init off, or with
 * relative_step and scale_parameter on: args.param_scale):
 *   g  = grads * grad_scale                                  (grad_scale: the loop's clipping factor)
 *   factored (rows x cols):  row = b2t row + (1 - b2t) mean_j(g^2 + eps1)     (rows)
 *                            col = b2t col + (1 - b2t) mean_i(g^2 + eps1)     (cols)
 *                            u   = g * rsqrt(row / mean(row)) (per row) * rsqrt(col) (per column)
 *   a vector (n):            v   = b2t v + (1 - b2t) (g^2 + eps1);  u = g * rsqrt(v)
 *   u  /= max(1, RMS(u) / clip);  u *= lr   (lr *= max(eps2, RMS(params)) first with param_scale)
 *   beta1 > 0:  m = beta1 m + (1 - beta1) u;  u = m
 *   params += params * (-weight_decay * lr);  params -= u
 * b2t = 1 - t^decay_rate (decay_rate -0.8 by default). Means and RMS are summed in double; the
 * elementwise math is fp32. Shapes: params, grads, m: rows*cols (or n); row (rows), col (cols), v (n);
 * m NULL when beta1 == 0. Deterministic for any number of threads. */
#ifndef LLMC_CPU_ADAFACTOR_H
#define LLMC_CPU_ADAFACTOR_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
typedef struct {
    float lr;           /* the step's learning rate (relative step: min(1e-2, 1/sqrt(t))) */
    float b2t, one_minus_b2t; /* 1 - t^decay_rate and its complement (each rounded from double) */
    float eps1, eps2;   /* 1e-30 (added to g^2), 1e-3 (the floor of RMS(params) with param_scale) */
    float clip;         /* clip_threshold: the RMS the update is clipped to */
    float beta1;        /* 0: no first moment */
    float weight_decay; /* this tensor's */
    float grad_scale;
    int param_scale;    /* 1: lr scaled by max(eps2, RMS(params)) (HF scale_parameter) */
} AdafactorArgs;

void adafactor_update_factored(float *params, const float *grads, float *row, float *col, float *m, size_t rows,
                               size_t cols, const AdafactorArgs *a);
void adafactor_update_vector(float *params, const float *grads, float *v, float *m, size_t n, const AdafactorArgs *a);
#ifdef __cplusplus
}
#endif
#endif
