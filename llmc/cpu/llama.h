/*
 * llama.h (CPU) - the Llama 3 block sequence on the CPU over the tables in llmc/models/llama.h
 * (fp32, every activation stored; no recompute levels yet). Same contract as llmc/cpu/gpt2.h:
 * llama_forward with targets and dloss != 0 leaves dlogits in the logits activation and
 * llama_backward must follow; llama_backward accumulates into grads.
 */
#ifndef LLMC_CPU_LLAMA_H
#define LLMC_CPU_LLAMA_H

#include <stdio.h>

#include "llmc/models/llama.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/training.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    LlamaConfig cfg;
    TensorSpec param_specs[LLAMA3_NUM_PARAMETERS];
    size_t num_parameters;
    float *params_memory, *grads_memory;
    int B, T;
    TensorSpec act_specs[LLAMA3_NUM_ACTIVATIONS];
    size_t num_activations;
    float *acts_memory;
    float *freqs; /* RoPE cos/sin (T, HS/2, 2) for the allocated T, after the activations */
    /* backward scratch: dbuf_c (B,T,C): dln2, then datty, then dln1; dbuf_f1 (B,T,max(2F,QKV)):
     * dfch, later dqkv; dbuf_f2 (B,T,F): dfch_swiglu. ZeRO: llama_shard. */
    CpuTraining train;
} LlamaModel;

/* cfg must pass llama_config_validate; params random (seeded) or loaded by the caller. Every
 * buffer goes through plan.h's accounting allocator, sized by llama_plan. */
void llama_build(LlamaModel *model, const LlamaConfig *cfg);
/* The memory plan for (B, T, training): parameters, gradients, activations by tensor (+ the RoPE
 * table), backward scratch, the sgemm's packing. llama_allocate_for allocates exactly these. */
void llama_plan(const LlamaConfig *cfg, int B, int T, int training, MemPlan *p);
void llama_allocate_for(LlamaModel *model, int B, int T, int training);
void llama_allocate(LlamaModel *model, int B, int T); /* training */
void llama_zero_grad(LlamaModel *model);
/* ZeRO -z 2 or 3 on rank `rank` of `ranks` (after llama_allocate with training), as gpt2_shard:
 * the backward hands per-layer gradient buckets to hooks.reduce and, -z 3, the model keeps only
 * this rank's parameter shard, each layer gathered before its forward and backward. The sizes
 * are llama_plan_shard's. */
void llama_shard(LlamaModel *model, int zero, int ranks, int rank, CpuShardHooks hooks);
/* llama_plan's classes for -z zero (>= 2) on rank `rank` of `ranks`. */
void llama_plan_shard(const LlamaConfig *cfg, int zero, int ranks, int rank, MemPlan *p);
void llama_print_memory(const LlamaModel *model, FILE *out);
float llama_forward(LlamaModel *model, const int *inputs, const int *targets, int B, int T, float dloss);
void llama_backward(LlamaModel *model, const int *inputs, int B, int T);
void llama_free(LlamaModel *model);

/* Inference with a key/value cache, as decode.h does for GPT-2: kv (L, maxT, 2 NKV HS) holds each
 * position's NKV keys then NKV values (after RoPE); query head h reads group h / (NH / NKV). */
typedef struct {
    int len, max_len, max_chunk;
    float *kv, *freqs; /* freqs: RoPE cos/sin for positions [0, maxT) */
    float *residual, *ln, *qkv, *atty, *proj, *fch, *fch_swiglu, *logits, *rstd, *att;
    float *memory;
} LlamaKVCache;
void llama_kvcache_init(LlamaKVCache *c, const LlamaModel *model, int max_chunk);
void llama_kvcache_free(LlamaKVCache *c);
/* tokens[0..n) at positions [len, len + n): their logits (n, Vp), valid until the next call. */
const float *llama_forward_cached(const LlamaModel *model, LlamaKVCache *c, const int *tokens, int n);

#ifdef __cplusplus
}
#endif
#endif
