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

#include "llmc/core/tensor.h"

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

/* ---- the units of a parameter table (llmc/train/adafactor.h says what they are) ---- */
typedef struct {
    size_t off, numel; /* its parameters [off, off + numel) */
    size_t rows, cols; /* factored: rows x cols; cols 0: a vector */
    size_t soff;       /* its statistics in the packed state: rows + cols floats, or numel */
    int decay;         /* weight decay applies */
} AdafactorUnit;
/* The units of a parameter table (units may be NULL); returns their number, *num_stats the
 * packed statistics' floats. */
int adafactor_units(const TensorSpec *specs, int num_specs, const ModelConfig *cfg, AdafactorUnit *units,
                    size_t *num_stats);
/* The units rank owns at stage zero: [*u0, *u1) (the rank whose dist_shard range holds a unit's
 * first element; every unit at -z 0), and their parameters [*plo, *phi) and statistics [*slo, *shi). */
void adafactor_units_of_rank(const AdafactorUnit *u, int nu, size_t n, int zero, int ranks, int rank, int *u0, int *u1);
void adafactor_unit_range(const AdafactorUnit *u, int nu, int u0, int u1, size_t *plo, size_t *phi, size_t *slo,
                          size_t *shi);
/* The plan's bytes of Adafactor on rank of ranks at stage zero for the model init names (-e: its
 * header or descriptor only): the first moment (0 without one) and the statistics. */
void adafactor_state_bytes(const char *init, int zero, int ranks, int rank, int first_moment, size_t *m_bytes,
                           size_t *v_bytes);
#ifdef __cplusplus
}
#endif
#endif
