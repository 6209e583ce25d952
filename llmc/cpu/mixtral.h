/*
 * mixtral.h (CPU) - the Mixtral block sequence on the CPU over llmc/models/mixtral.h's tables
 * (fp32, every activation stored): the Llama's attention, then the routed expert MLP through
 * llmc/cpu/moe.h (router, grouping by expert, one matmul pair per expert, weighted combine) and
 * the load-balancing loss. Same contract as llmc/cpu/llama.h: mixtral_forward with targets and
 * dloss != 0 leaves dlogits (and the router's loss weights) for mixtral_backward, which must
 * follow and accumulates into grads. Deterministic: the same bits run to run and at any thread
 * count (the grouping is fixed; each token's k expert outputs are summed in slot order).
 *
 * The forward returns, with targets: the objective CE + aux_coef * aux (aux only when
 * output_router_logits) when training (dloss != 0), the cross-entropy when evaluating (dloss 0).
 * last_ce and last_aux (unscaled) hold the parts of the last forward with targets.
 */
#ifndef LLMC_CPU_MIXTRAL_H
#define LLMC_CPU_MIXTRAL_H

#include <stdio.h>

#include "llmc/core/logger.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/llama.h"
#include "llmc/cpu/training.h"
#include "llmc/models/mixtral.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    MixtralConfig cfg;
    TensorSpec param_specs[MIXTRAL_NUM_PARAMETERS];
    size_t num_parameters;
    float *params_memory, *grads_memory;
    int B, T;
    TensorSpec act_specs[MIXTRAL_NUM_ACTIVATIONS];
    size_t num_activations;
    float *acts_memory;
    float *freqs; /* RoPE cos/sin (T, HS/2, 2), after the activations */
    /* backward scratch: train.dresidual, train.dbuf_c and dbuf_r (N, C each: dln2 of the experts,
     * of the router), train.dbuf_f1 (max(N QKV, NK 2F)), train.dbuf_f2 (NK F), dbuf_y (NK C: the
     * grouped dy, then dx), dbuf_w (NK: the combine weights' gradient), dbuf_z (N E: the router
     * logits'). ZeRO: mixtral_shard; no LoRA (train.lora stays NULL). */
    CpuTraining train;
    float *dbuf_r, *dbuf_y, *dbuf_w, *dbuf_z;
    float last_ce, last_aux, dloss;
    int last_N;
    /* the auxiliary loss's gradient weights, dL/dp_e for every router row (set by the forward) */
    float aux_dprob[MIXTRAL_MAX_EXPERTS];
    /* per-step statistics since zero_grad (training forwards): sums of the cross-entropy and aux,
     * micro-steps, and per layer the min / max tokens per expert, summed over layers and micro-steps */
    double step_ce, step_aux;
    long long step_micro, step_min_tokens, step_max_tokens;
    /* expert parallelism (-ep, llmc/cpu/moe_ep.h; NULL: every expert here): the parameter table and
     * arenas are then this rank's shard (mixtral_shard_parameter_specs) */
    struct MoeEp *ep;
} MixtralModel;

void mixtral_build(MixtralModel *model, const MixtralConfig *cfg);
void mixtral_plan(const MixtralConfig *cfg, int B, int T, int training, MemPlan *p);
void mixtral_allocate_for(MixtralModel *model, int B, int T, int training);
void mixtral_zero_grad(MixtralModel *model);
void mixtral_shard(MixtralModel *model, int zero, int ranks, int rank, CpuShardHooks hooks);
void mixtral_plan_shard(const MixtralConfig *cfg, int zero, int ranks, int rank, MemPlan *p);
void mixtral_print_memory(const MixtralModel *model, FILE *out);
float mixtral_forward(MixtralModel *model, const int *inputs, const int *targets, int B, int T, float dloss);
void mixtral_backward(MixtralModel *model, const int *inputs, int B, int T);
void mixtral_free(MixtralModel *model);
/* -ep (after the whole parameters are loaded, before allocate): the model keeps only ep's shard
 * of the experts (its table, parameter arena and, allocated later, gradients); ep stays the
 * caller's. mixtral_plan_expert_parallel: the plan's classes for it (after mixtral_plan), -z 2's gradient
 * buckets over the shard's table included (mixtral_shard then takes the shard's table too). */
void mixtral_set_expert_parallel(MixtralModel *model, struct MoeEp *ep);
void mixtral_plan_expert_parallel(const MixtralConfig *cfg, int ways, int B, int T, int zero, int ranks, int rank,
                                  MemPlan *p);
/* The step's train_ce, train_aux (means over micro-steps) and routing statistics: as log fields
 * (lg) or as step-line text. */
void mixtral_step_log(const MixtralModel *model, char *text, size_t len, Logger *lg);

/* Inference with a key/value cache (./generate), as llama.h's: kv (L, maxT, 2 NKV HS); each chunk's
 * MLP is the routed experts (the same routing and grouping as training, for the chunk's rows). */
typedef struct {
    LlamaDecode d; /* the family's cache and attention buffers (llmc/cpu/llama.h) */
    float *probs, *rexp, *rw, *rrow, *count, *mx, *mh, *ms, *my;
    float *memory;
} MixtralKVCache;
void mixtral_kvcache_init(MixtralKVCache *c, const MixtralModel *model, int max_chunk);
void mixtral_kvcache_free(MixtralKVCache *c);
const float *mixtral_forward_cached(const MixtralModel *model, MixtralKVCache *c, const int *tokens, int n);

#ifdef __cplusplus
}
#endif
#endif
