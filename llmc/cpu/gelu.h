/* gelu, tanh approximation.
 * forward:  out = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
 * backward: dinp = dout * [0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) k (1 + 3*0.044715 x^2)]
 *           with u = k (x + 0.044715 x^3)   (overwrites dinp)
 * Shapes: out, inp, dinp, dout (N). */
#ifndef LLMC_CPU_GELU_H
#define LLMC_CPU_GELU_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
void gelu_forward(float *out, const float *inp, size_t N);
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);
#ifdef __cplusplus
}
#endif
#endif
