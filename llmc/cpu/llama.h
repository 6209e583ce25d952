/*
 * llama.h (CPU) - the Llama 3 block sequence on the CPU over the tables in llmc/models/llama.h
 * (fp32; recompute levels -r 0..2 as llama_plan says). Same contract as llmc/cpu/gpt2.h:
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
/* The memory plan for (B, T, recompute, training): parameters, gradients, activations by tensor at
 * the -r level (+ the RoPE table), backward scratch, the sgemm's packing. llama_allocate_for
 * allocates exactly these. -r 1 recomputes the SwiGLU output in backward, -r 2 also the two
 * RMSNorm outputs (models/llama.h's levels): the same bits as -r 0, less memory. */
enum { LLAMA_CPU_MAX_RECOMPUTE = 2 };
void llama_plan(const LlamaConfig *cfg, int B, int T, int recompute, int training, MemPlan *p);
void llama_allocate_for(LlamaModel *model, int B, int T, int recompute, int training);
void llama_allocate(LlamaModel *model, int B, int T); /* training, -r 0 */
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

/* ---- the family's shared pieces: llama.c's block sequence and the Mixtral's (llmc/cpu/mixtral.c)
 * run the same embedding, attention half (LLAMA3_TRUNK_* rows: they have the same indices in every
 * family table) and head (LLAMA3_HEAD_* rows, from head_param / head_act on); only the MLP differs.
 * A LlamaTrunk is a model's tables and arenas as these pieces see them. */
struct LlamaDecode;
typedef struct {
    const LlamaConfig *cfg;
    const TensorSpec *param_specs, *act_specs;
    float *params, *grads, *acts, *freqs; /* grads NULL: a frozen base (no weight gradients) */
    CpuTraining *train;                   /* ZeRO state, LoRA (NULL: none), backward scratch */
    int head_param, head_act;             /* the table's lnfw and residual3 rows */
    /* the architecture's MLP of layer l, on model: residual3 = residual2 + mlp(ln2) (forward);
     * from dres at residual3 to dln2 in train->dbuf_c (backward, accumulating its weights'
     * gradients); the decode's: d->proj = mlp(d->ln) for n positions */
    void *model;
    void (*ffn_forward)(void *model, int l, int B, int T);
    void (*ffn_backward)(void *model, int l, int B, int T);
    void (*ffn_decode)(void *model, struct LlamaDecode *d, int l, int n);
} LlamaTrunk;
/* The whole block sequence over t (the ZeRO hooks, embedding, each layer's trunk and MLP, the
 * head): the forward returns the mean loss (0 without targets); the backward follows it. */
float llama_family_forward(const LlamaTrunk *t, const int *inputs, const int *targets, int B, int T, float dloss);
void llama_family_backward(const LlamaTrunk *t, const int *inputs, int B, int T);
/* RoPE's cos/sin (T, HS/2, 2) for cfg's theta and scaling */
void llama_rope_table(float *freqs, int T, const LlamaConfig *cfg);
/* encoded = wte[inputs] (dies on a token id, or a target, outside the vocabulary) */
void llama_trunk_embed(const LlamaTrunk *t, const int *inputs, const int *targets, int N);
/* layer l from its input x to ln2: residual2 = x + attention(rope(qkv(rmsnorm(x)))), ln2 = rmsnorm(residual2) */
void llama_trunk_forward(const LlamaTrunk *t, int l, const float *x, int B, int T);
/* its backward, given dln2 in dbuf_c (the MLP's): dres += the gradient at residual2 and, through the
 * attention, at x; dbuf_c and dbuf_f1 ((B, T, QKV) at least) are scratch */
void llama_trunk_backward(const LlamaTrunk *t, int l, const float *x, int B, int T, float *dres, float *dbuf_c,
                          float *dbuf_f1);
/* lnf, logits from the last layer's residual3; with targets, the losses and (dloss != 0) dlogits in
 * the logits activation; returns the mean loss (0 without targets) */
float llama_head_forward(const LlamaTrunk *t, const int *targets, float dloss, int N);
/* from dlogits to dres (cleared first) at the last layer's residual3; dbuf_c (B, T, C) is scratch */
void llama_head_backward(const LlamaTrunk *t, int N, float *dres, float *dbuf_c);

/* Inference with a key/value cache, as decode.h does for GPT-2: kv (L, maxT, 2 NKV HS) holds each
 * position's NKV keys then NKV values (after RoPE); query head h reads group h / (NH / NKV). The
 * family's shared part (the MLP's buffers are the model's own, after it in memory). */
typedef struct LlamaDecode {
    int len, max_len, max_chunk;
    float *kv, *freqs; /* freqs: RoPE cos/sin for positions [0, maxT) */
    float *residual, *ln, *qkv, *atty, *proj, *logits, *rstd, *att;
} LlamaDecode;
/* The floats d needs for max_chunk positions; memory non-NULL: points d's buffers into it (the
 * first that many floats) and fills the RoPE table. */
size_t llama_decode_layout(LlamaDecode *d, const LlamaConfig *cfg, int max_chunk, float *memory);
/* tokens[0..n) at positions [len, len + n) into d->residual (checks n and the context) */
void llama_decode_embed(const LlamaTrunk *t, LlamaDecode *d, const int *tokens, int n, const char *who);
/* layer l of the n positions: attention over the cache (and appends their keys and values), its
 * residual, then d->ln = rmsnorm(d->residual) for the MLP, whose output the caller adds */
void llama_decode_attention(const LlamaTrunk *t, LlamaDecode *d, int l, int n);
/* the logits (n, Vp) of the n positions; advances len */
const float *llama_decode_head(const LlamaTrunk *t, LlamaDecode *d, int n);
/* tokens[0..n) through embed, every layer's attention and t->ffn_decode, and the head */
const float *llama_family_decode(const LlamaTrunk *t, LlamaDecode *d, const int *tokens, int n, const char *who);

typedef struct {
    LlamaDecode d;
    float *fch, *fch_swiglu;
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
