/* swiglu (Llama's MLP nonlinearity) on a packed [gate | up] tensor.
 * forward:  out = silu(gate) * up, silu(x) = x * sigmoid(x)
 * backward (overwrites dinp): dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))
 *                             dup = dout * silu(gate)
 * Shapes: inp, dinp (N, 2F) with gate in columns [0, F) and up in [F, 2F); out, dout (N, F). */
#ifndef LLMC_CPU_SWIGLU_H
#define LLMC_CPU_SWIGLU_H
#ifdef __cplusplus
extern "C" {
#endif
void swiglu_forward(float *out, const float *inp, int N, int F);
void swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F);
#ifdef __cplusplus
}
#endif
#endif
