/* layernorm over the last dimension, eps 1e-5, biased variance (two-pass: mean, then
 * the mean of squared deviations).
 * forward:  mean = sum(x)/C; rstd = 1/sqrt(sum((x-mean)^2)/C + eps)
 *           out = (x - mean) * rstd * weight + bias
 * backward (accumulates into dinp, dweight, dbias):
 *           xhat = (x - mean) * rstd; dnorm = dout * weight
 *           dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
 *           dweight += sum_rows(dout * xhat); dbias += sum_rows(dout)
 * Shapes: out, inp, dinp, dout (N, C) with N = B*T; mean, rstd (N); weight, bias (C).
 * dweight/dbias are reduced in fixed row chunks, so results do not depend on threads. */
#ifndef LLMC_CPU_LAYERNORM_H
#define LLMC_CPU_LAYERNORM_H
#ifdef __cplusplus
extern "C" {
#endif
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C);
/* Recomputes out from inp and the saved mean/rstd (bit-identical to layernorm_forward). */
void layernorm_recompute(float *out, const float *inp, const float *mean, const float *rstd,
                         const float *weight, const float *bias, int N, int C);
void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C);
#ifdef __cplusplus
}
#endif
#endif
