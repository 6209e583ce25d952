/* residual: out = inp1 + inp2 (out may alias inp1). Its backward is the identity into both
 * inputs, which the model does by letting both consumers accumulate into one buffer.
 * Shapes: out, inp1, inp2 (N). */
#ifndef LLMC_CPU_RESIDUAL_H
#define LLMC_CPU_RESIDUAL_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
void residual_forward(float *out, const float *inp1, const float *inp2, size_t N);
#ifdef __cplusplus
}
#endif
#endif
