/* rmsnorm (Llama): root-mean-square normalisation over the last dimension, a gain and no bias.
 * forward:  rstd = 1/sqrt(sum(x^2)/C + eps); out = x * rstd * weight
 * backward (accumulates into dinp and dweight):
 *           xhat = x * rstd; dnorm = dout * weight
 *           dinp += rstd * (dnorm - xhat * mean(dnorm * xhat)); dweight += sum_rows(dout * xhat)
 * Shapes: out, inp, dinp, dout (N, C); rstd (N); weight, dweight (C).
 * dweight is reduced in fixed row chunks, so results do not depend on threads. */
#ifndef LLMC_CPU_RMSNORM_H
#define LLMC_CPU_RMSNORM_H
#ifdef __cplusplus
extern "C" {
#endif
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
/* out from the forward's stored rstd (recompute -r 2): the forward's values, bit for bit */
void rmsnorm_recompute(float *out, const float *inp, const float *rstd, const float *weight, int N, int C);
void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int N, int C);
#ifdef __cplusplus
}
#endif
#endif
