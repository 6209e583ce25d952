/*
 * model.h (CPU) - GPT-2 on the CPU: the reference sequencing of forward, backward and the
 * AdamW update over the tensors declared in llmc/models/gpt2.h.
 *
 * Contract: gpt2_forward with targets and dloss != 0 is a training forward: the classifier
 * leaves dlogits (scaled by dloss) in acts.logits, and gpt2_backward must follow before the
 * next forward. gpt2_backward accumulates into grads (call gpt2_zero_grad per step).
 */
#ifndef LLMC_CPU_MODEL_H
#define LLMC_CPU_MODEL_H

#include <stdio.h>

#include "llmc/dist/dist.h"
#include "llmc/models/gpt2.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/training.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ZeRO-2/3 (gpt2_shard): what the trainer's optimizer (llmc/train/optim.h) does with a bucket (zero.h) */
typedef CpuShardHooks GPT2ShardHooks;

typedef struct {
    ModelConfig cfg;
    TensorSpec param_specs[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    ParameterTensors params, grads;
    float *params_memory, *grads_memory, *m_memory, *v_memory;
    /* activations for the allocated (B, T) and recompute level */
    int B, T, recompute;
    TensorSpec act_specs[NUM_ACTIVATION_TENSORS];
    size_t num_activations;
    ActivationTensors acts;
    float *acts_memory;
    /* backward scratch: dbuf_c (B,T,C): dln2, then datty, then dln1 (each dead before the next is
     * written); dbuf_f1 (B,T,max(F,QKV)): dfch_gelu, later reused as dqkv (B,T,QKV); dbuf_f2
     * (B,T,F): dfch. ZeRO: gpt2_shard. */
    CpuTraining train;
    /* -tp N (gpt2_tp_split): this rank's tensor-parallel group (NULL: none); the arenas then hold this
     * rank's part of each split tensor (the table's split column) and of the split activations */
    Dist *tp;
} GPT2;

/* gpt2_build: the model for cfg with its parameter arena allocated (zero; the caller fills it, e.g.
 * from formats/arch.h's gpt2_arch.load_init). gpt2_build_random: random as GPT-2 initialises
 * (std 0.02, residual projections 0.02/sqrt(2L), biases 0, gains 1, padded vocab rows 0). */
void gpt2_build(GPT2 *model, const ModelConfig *cfg);
void gpt2_build_random(GPT2 *model, const ModelConfig *cfg, unsigned long long seed);
/* The CPU backend's memory plan for (B, T, recompute, training): parameters, gradients,
 * activations by tensor, backward scratch. gpt2_allocate allocates exactly these sizes. */
void gpt2_plan(const ModelConfig *cfg, int B, int T, int recompute, int training, MemPlan *p);
/* gpt2_plan for one rank of a tensor-parallel group of tp (gpt2_plan: tp 1). */
void gpt2_plan_tp(const ModelConfig *cfg, int tp, int B, int T, int recompute, int training, MemPlan *p);
/* -tp: a built model (its whole parameters loaded, not yet allocated) keeps only this rank's part
 * of each split tensor (Megatron's split: llmc/models/gpt2.h's split column); its forward and backward
 * then sum over tp after each row-parallel product and each column-parallel input gradient, and with
 * wte split by its vocabulary rows the embedding sums its rows over tp, the LM head computes this
 * rank's Vp/tp columns of acts.logits ((B, T, Vp/tp)) and the cross-entropy reduces each position's
 * max and sum of exps over tp (acts.losses whole on every rank). Dies when the shape does not divide
 * (gpt2_tp_validate). tp NULL or of one rank: nothing changes. */
void gpt2_tp_split(GPT2 *model, Dist *tp);
/* Activations for batches up to (B, T), plus gradients if training. */
void gpt2_allocate(GPT2 *model, int B, int T, int recompute, int training);
/* Returns the mean loss over B*T positions when targets != NULL (else 0; logits are left in
 * acts.logits). B*T must not exceed the allocated B*T, T not the allocated T. */
float gpt2_forward(GPT2 *model, const int *inputs, const int *targets, int B, int T, float dloss);
void gpt2_backward(GPT2 *model, const int *inputs, int B, int T);
void gpt2_zero_grad(GPT2 *model);
/* ZeRO -z 2 or 3 on rank `rank` of `ranks` (after gpt2_allocate with training): frees the whole
 * gradients for the bucket buffers and, -z 3, keeps only this rank's shard of the parameters
 * (dist.h's dist_shard) plus the gather buffers. The sizes are gpt2_plan_shard's. */
void gpt2_shard(GPT2 *model, int zero, int ranks, int rank, GPT2ShardHooks hooks);
/* gpt2_plan's classes for -z zero (>= 2) on rank `rank` of `ranks`. */
void gpt2_plan_shard(const ModelConfig *cfg, int zero, int ranks, int rank, MemPlan *p);
/* The global L2 norm of the gradients. */
float gpt2_grad_norm(const GPT2 *model);
/* AdamW step t >= 1 on grads * grad_scale (the clipping factor), decay on the table's choice,
 * with moments m_memory/v_memory allocated on the first call. The reference for tests; the
 * trainers' optimizer (llmc/train/optim.c) keeps its own (possibly sharded) moments instead. */
void gpt2_update(GPT2 *model, float lr, float beta1, float beta2, float eps, float weight_decay,
                 float grad_scale, int t);
void gpt2_free(GPT2 *model);
/* The startup memory table: parameters, gradients, m and v (when gpt2_update made them),
 * activations by kind, scratch. */
void gpt2_print_memory(const GPT2 *model, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
