/* attention: causal self-attention on a packed qkv tensor, with grouped-query attention.
 * inp (B, T, QKV), QKV = (NH + 2*NKV) * HS, holds [q (NH heads) | k (NKV heads) | v (NKV heads)]
 * per position, head h at channels [h*HS, (h+1)*HS) of its part. Query head h reads key/value
 * head g = h / (NH/NKV) in place (never copied to NH heads); NKV == NH is GPT-2's attention.
 * forward:  s[t,u] = q_t . k_u / sqrt(HS) for u <= t; att[t,:] = softmax(s[t, 0..t]) (0 above t)
 *           out[b,t,h*HS + i] = sum_u att[t,u] * v_u[i]
 * backward (overwrites dinp):
 *           datt[t,u] = dout_t . v_u;  dv_u += att[t,u] * dout_t
 *           ds[t,u] = att[t,u] * (datt[t,u] - sum_w att[t,w] * datt[t,w])
 *           dq_t += ds[t,u] * k_u / sqrt(HS);  dk_u += ds[t,u] * q_t / sqrt(HS)
 *           (dk, dv of a group sum over the group's query heads)
 * Shapes: out, dout (B, T, NH*HS); att (B, NH, T, T) saved softmax; inp, dinp (B, T, QKV).
 * Threads split the (b, group) pairs, which touch disjoint outputs: deterministic. */
#ifndef LLMC_CPU_ATTENTION_H
#define LLMC_CPU_ATTENTION_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
void attention_forward(float *out, float *att, const float *inp, int B, int T, int NH, int NKV, int HS);
/* One query row of the forward (also the KV-cache decode's, llmc/cpu/decode.c): q (HS) against
 * key u at k + u*stride and value u at v + u*stride, u = 0..t; att[0..t] gets the probabilities,
 * out (HS) the weighted sum of values; scale = 1/sqrt(HS). */
void attention_row(float *out, float *att, const float *q, const float *k, const float *v, size_t stride, int t, int HS,
                   float scale);
void attention_backward(float *dinp, const float *dout, const float *inp, const float *att,
                        int B, int T, int NH, int NKV, int HS);
#ifdef __cplusplus
}
#endif
#endif
