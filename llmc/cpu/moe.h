/*
 * moe.h - the routing ops of a sparse mixture-of-experts MLP (Mixtral, llmc/models/mixtral.h), on
 * the CPU. N tokens, E experts, top-K. Expert ids and grouped-row numbers are stored as exact
 * integers in float arrays (the activation arena is float; N K < 2^24 is checked by the caller).
 *
 * moe_router_forward: probs (N, E) holds the router logits on entry, softmax(logits) on exit
 *   (overwrites); expert (N, K) the top-K experts of each row in order of probability (ties: the
 *   lower expert index first), weight (N, K) their probabilities divided by their sum.
 * moe_permute: the grouping of the N K (token, slot) pairs by expert, experts in index order and
 *   within an expert tokens in position order (deterministic; no capacity, nothing dropped):
 *   row (N, K) = each pair's row in the grouped buffers, count (E) = rows per expert (=), and
 *   offset (E + 1, int) = each expert's first row.
 * moe_gather: xg[row(t, j)] = x[t] (=), rows of width C.
 * moe_gather_backward: dx[t] = sum over j of dxg[row(t, j)], j in slot order (=).
 * moe_combine_forward: out[t] = sum over j of weight(t, j) * yg[row(t, j)], j in slot order (=).
 * moe_combine_backward: dyg[row(t, j)] = weight(t, j) * dout[t] (=), dweight(t, j) = dout[t] . yg[row(t, j)] (=).
 * moe_router_backward: dlogits (N, E) (=) from dweight (the combine's) through the renormalisation
 *   and the softmax, plus dprob_extra[e] added to every row's dL/dp_e before the softmax (the
 *   auxiliary loss's gradient, constant over rows; NULL: none).
 */
#ifndef LLMC_CPU_MOE_H
#define LLMC_CPU_MOE_H
#ifdef __cplusplus
extern "C" {
#endif

void moe_router_forward(float *probs, float *expert, float *weight, int N, int E, int K);
void moe_permute(float *row, float *count, int *offset, const float *expert, int N, int E, int K);
void moe_gather(float *xg, const float *x, const float *row, int N, int K, int C);
void moe_gather_backward(float *dx, const float *dxg, const float *row, int N, int K, int C);
void moe_combine_forward(float *out, const float *yg, const float *weight, const float *row, int N, int K, int C);
void moe_combine_backward(float *dyg, float *dweight, const float *dout, const float *yg, const float *weight,
                          const float *row, int N, int K, int C);
void moe_router_backward(float *dlogits, const float *dweight, const float *probs, const float *expert,
                         const float *weight, const float *dprob_extra, int N, int E, int K);

#ifdef __cplusplus
}
#endif
#endif
