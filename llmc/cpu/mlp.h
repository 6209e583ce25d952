/*
 * mlp.h (CPU) - the MLP-only test architecture's block sequence on the CPU over the tables in
 * llmc/models/mlp.h (fp32, every activation stored). The function shapes are llmc/cpu/llama.h's,
 * so the CPU backend's per-architecture table holds either: mlp_forward with targets and
 * dloss != 0 leaves dlogits in the logits activation and mlp_backward must follow;
 * mlp_backward accumulates into grads. ZeRO -z 2/3 through llmc/cpu/zero.h, as the Llama's.
 */
#ifndef LLMC_CPU_MLP_H
#define LLMC_CPU_MLP_H

#include <stdio.h>

#include "llmc/models/mlp.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/training.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    MlpConfig cfg;
    TensorSpec param_specs[MLP_NUM_PARAMETERS];
    size_t num_parameters;
    float *params_memory, *grads_memory;
    int B, T;
    TensorSpec act_specs[MLP_NUM_ACTIVATIONS];
    size_t num_activations;
    float *acts_memory;
    /* backward scratch: dbuf_c (B,T,C): dlnf, then each layer's dln; dbuf_f1 (B,T,2F): dfch;
     * dbuf_f2 (B,T,F): dfch_swiglu. ZeRO: mlp_shard; no LoRA (train.lora stays NULL). */
    CpuTraining train;
} MlpModel;

/* cfg must pass mlp_config_validate (dies naming the problem); the parameters are allocated
 * (zero) through plan.h's accounting allocator: the caller fills them (mlp_init_parameters or a file). */
void mlp_build(MlpModel *model, const MlpConfig *cfg);
/* The memory plan for (B, T, training): parameters, gradients, activations by tensor, backward
 * scratch, the sgemm's packing. mlp_allocate_for allocates exactly these. */
void mlp_plan(const MlpConfig *cfg, int B, int T, int training, MemPlan *p);
void mlp_allocate_for(MlpModel *model, int B, int T, int training);
void mlp_allocate(MlpModel *model, int B, int T); /* training */
void mlp_zero_grad(MlpModel *model);
/* ZeRO -z 2 or 3 on rank `rank` of `ranks` (after mlp_allocate with training), as llama_shard:
 * the backward hands per-layer gradient buckets to hooks.reduce and, -z 3, the model keeps only
 * this rank's parameter shard, each layer gathered before its forward and backward. The sizes
 * are mlp_plan_shard's. */
void mlp_shard(MlpModel *model, int zero, int ranks, int rank, CpuShardHooks hooks);
/* mlp_plan's classes for -z zero (>= 2) on rank `rank` of `ranks`. */
void mlp_plan_shard(const MlpConfig *cfg, int zero, int ranks, int rank, MemPlan *p);
void mlp_print_memory(const MlpModel *model, FILE *out);
/* inputs, targets (B, T) token ids in [0, V) (targets NULL: logits only); returns the mean loss
 * (0 without targets). dloss: the weight of each position's loss in the gradient (1/(B*T)). */
float mlp_forward(MlpModel *model, const int *inputs, const int *targets, int B, int T, float dloss);
void mlp_backward(MlpModel *model, const int *inputs, int B, int T);
void mlp_free(MlpModel *model);

/* Inference for ./generate, in the shape of llama.h's KV-cache decode: the model has no attention,
 * so a position's logits depend on its token alone and nothing is cached but the position count
 * (len, checked against maxT) and one chunk's activations (max_chunk positions). */
typedef struct {
    int len, max_len, max_chunk;
    TensorSpec act_specs[MLP_NUM_ACTIVATIONS]; /* the table for (1, max_chunk) */
    float *acts;
} MlpKVCache;
void mlp_kvcache_init(MlpKVCache *c, const MlpModel *model, int max_chunk);
void mlp_kvcache_free(MlpKVCache *c);
/* tokens[0..n) at positions [len, len + n): their logits (n, Vp), valid until the next call. */
const float *mlp_forward_cached(const MlpModel *model, MlpKVCache *c, const int *tokens, int n);

#ifdef __cplusplus
}
#endif
#endif
