/* encoder: token + position embedding.
 * forward:  out[b,t,:] = wte[inp[b,t], :] + wpe[t, :]
 * backward: dwte[inp[b,t], :] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]   (accumulates)
 * Shapes: out, dout (B, T, C); inp (B, T); wte (Vp, C); wpe (maxT, C).
 * Backward is deterministic: positions are visited in (b, t) order for every channel.
 * embedding_backward: the token-only twin (no wpe; Llama, mlp): dwte[inp[i], :] += dout[i, :] over
 * the N = B*T positions in order (accumulates). */
#ifndef LLMC_CPU_ENCODER_H
#define LLMC_CPU_ENCODER_H
#ifdef __cplusplus
extern "C" {
#endif
void encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);
void embedding_backward(float *dwte, const float *dout, const int *inp, int N, int C);
#ifdef __cplusplus
}
#endif
#endif
