/*
 * moe_ep.h (CPU) - expert parallelism for the Mixtral block sequence (issue 24 item 5, -ep N):
 * the E experts of every layer split over N ranks, each rank computing only its own experts for
 * the tokens of the N ranks of its all-to-all group.
 *
 * Ranks (P processes, N | P, D = P / N data-parallel replicas of each expert):
 *   rank r holds experts [s El, (s + 1) El) of every layer, s = r % N, El = E / N (its shard);
 *   its all-to-all group is the N consecutive ranks g N .. g N + N - 1, g = r / N (one of each shard);
 *   the ranks holding the same experts are s, s + N, ..., s + (D - 1) N (their expert gradients are
 *   summed over that replica group; every other parameter is data-parallel over all P ranks).
 *
 * One layer's exchange (forward): the token side routes and groups its B T K rows by expert
 * (llmc/cpu/moe.h, experts in index order, so the rows for group member j are one run), sends
 * member j its run and the per-expert counts (all-to-all); the expert side reorders what arrived
 * into expert-major order (expert by expert, within an expert by source rank, within a source in
 * the source's token order), computes its experts (one matmul pair per expert) and sends each
 * source its rows' outputs back in the order they came; the token side combines them as before.
 * Backward: the grouped dy goes the same way, the experts' backward accumulates their weight
 * gradients and dx returns. Deterministic (fixed orders; the same bits run to run); against one
 * process the sums differ only in float order (an expert's rows of several ranks go through one
 * matmul here, while one process sums the ranks' gradients after separate ones).
 *
 * Dropless buffers: every routed row is computed, so the expert side must hold the worst case, all
 * rows of all N members routed here: R = N B T min(K, El) rows (a token sends at most min(K, El)
 * rows to one shard, its K experts being distinct); stored per layer for the backward (the rows,
 * SwiGLU input and output: R (C + 3F) floats a layer, activations class) plus one layer's
 * scratch (staging, outputs and gradients: R (2C + 3F), backward scratch class).
 */
#ifndef LLMC_CPU_MOE_EP_H
#define LLMC_CPU_MOE_EP_H

#include <stddef.h>

#include "llmc/core/mem.h"
#include "llmc/dist/dist.h"
#include "llmc/models/mixtral.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MoeEp {
    int ways, shard, group, local; /* N, s, g, El (above) */
    Dist *dist;
    int L, C, F, E, K;
    size_t rows; /* R (above) */
    int32_t *rcount; /* (L, N, El): rows received from each member for each local expert (forward, kept for backward) */
    float *ex, *eh, *es; /* (L, R, C), (L, R, 2F), (L, R, F): the expert side's rows, SwiGLU input, output */
    float *stage, *ey, *edsw, *edh; /* scratch: (R, C) staging, (R, C) outputs / dy, (R, F), (R, 2F) */
    long long a2a_bytes; /* bytes this rank sent to others in the exchanges since moe_ep_clear_stats */
    double a2a_ms;
    int training;
} MoeEp;

/* The rank layout of -ep ways on d (ways | d->size and ways | E checked by the caller). */
void moe_ep_init(MoeEp *ep, Dist *d, int ways, const MixtralConfig *cfg);
/* R for (B, T). */
size_t moe_ep_rows(const MixtralConfig *cfg, int ways, int B, int T);
/* Bytes of the per-layer activations and of the scratch (the plan's and moe_ep_allocate's rule). */
void moe_ep_bytes(const MixtralConfig *cfg, int ways, int B, int T, size_t *acts, size_t *scratch);
void moe_ep_allocate(MoeEp *ep, int B, int T);
void moe_ep_free(MoeEp *ep);
void moe_ep_clear_stats(MoeEp *ep);
/* Layer l's experts for the grouped rows mx (count: rows per expert, all E, as moe_permute's) into
 * my (the rows' outputs, same order); w13 and w2: layer l's local experts (El of them). */
void moe_ep_forward(MoeEp *ep, int l, const float *w13, const float *w2, const float *mx, const float *count, float *my);
/* The reverse: dy (the grouped rows' gradient) in, their dx out (in place); the local experts'
 * weight gradients accumulated into dw13, dw2. */
void moe_ep_backward(MoeEp *ep, int l, const float *w13, const float *w2, float *dw13, float *dw2, float *dy,
                     const float *count);

#ifdef __cplusplus
}
#endif
#endif
