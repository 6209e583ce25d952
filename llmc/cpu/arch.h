/*
 * arch.h (CPU) - the CPU backend's per-architecture table: one CpuArch per architecture that has
 * a CPU block sequence, with uniform entry points over `void *model` (the architecture's own model
 * struct, model_size bytes). ./train_gpt_cpu (train_gpt.c) and ./generate (generate.c) hold one
 * set of adapters over it; each entry is defined beside its block sequence (gpt2_cpu_arch in
 * llmc/cpu/gpt2.c, llama3_cpu_arch in llmc/cpu/llama.c, ...) and listed in cpu_archs[] (arch.c).
 * docs/ARCHITECTURES.md has the steps to add one.
 */
#ifndef LLMC_CPU_ARCH_H
#define LLMC_CPU_ARCH_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/core/mem.h"
#include "llmc/cpu/zero.h"
#include "llmc/formats/arch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A built model's parameter arena, as the trainer's optimizer sees it. params and grads are the
 * addresses of the model's arena pointers: -z 3 (shard) replaces the arena with this rank's shard. */
typedef struct {
    const ModelConfig *cfg; /* the shared shape (Vp for the logits rows) */
    size_t num_parameters;
    float **params, **grads;
    const TensorSpec *specs; /* the parameter table */
} CpuModelParts;

typedef struct CpuArch {
    const struct ModelArch *arch; /* formats/arch.h's entry this is the CPU backend of */
    size_t model_size;            /* sizeof the model struct that `model` points to */

    /* The model for cfg (cfg->arch == arch) with its parameter arena allocated (zero); the caller
     * fills it through arch->load_init. */
    void (*build)(void *model, const ArchConfig *cfg);
    /* Activations for batches up to (B, T) at recompute level `recompute` (architectures without
     * levels get 0), plus gradients and backward scratch when training. */
    void (*allocate)(void *model, int B, int T, int recompute, int training);
    void (*free)(void *model);
    void (*zero_grad)(void *model);
    /* inputs, targets (B, T) (targets NULL: logits only); returns the mean loss (0 without
     * targets). dloss != 0 (the weight of one position's loss) leaves dlogits for backward,
     * which must follow and accumulates into the gradients. */
    float (*forward)(void *model, const int *inputs, const int *targets, int B, int T, float dloss);
    void (*backward)(void *model, const int *inputs, int B, int T);
    /* The logits activation (B, T, Vp) the last forward without targets left. */
    const float *(*logits)(const void *model);
    CpuModelParts (*parts)(void *model);
    void (*print_memory)(const void *model, FILE *out);

    /* The memory plan for (B, T, recompute, training) and its ZeRO -z zero (>= 2) classes on rank
     * `rank` of `ranks`; allocate and shard allocate exactly these. */
    void (*plan)(const ArchConfig *cfg, int B, int T, int recompute, int training, MemPlan *p);
    void (*plan_shard)(const ArchConfig *cfg, int zero, int ranks, int rank, MemPlan *p);
    /* ZeRO -z 2 or 3 (after allocate with training): gradient buckets go to hooks.reduce; -z 3
     * keeps only this rank's parameter shard, gathered through the hooks. */
    void (*shard)(void *model, int zero, int ranks, int rank, CpuShardHooks hooks);

    /* Recompute: the highest -r level (the budget search's range); why there is none (NULL: there
     * are levels); fix_recompute(r, note): the level to run for -r r, printing a note line to
     * `note` when it differs (NULL: -r runs as given). */
    int max_recompute;
    const char *no_recompute;
    int (*fix_recompute)(int recompute, FILE *note);

    /* ./generate: the KV cache for up to max_chunk new tokens per call (the architecture's own
     * cache struct, heap-allocated); forward_cached: tokens[0..n) at the cache's next positions,
     * their logits (n, Vp), valid until the next call; describe: the architecture's part of the
     * banner ("" or e.g. "Llama 3 (NKV 2, F 512), "). */
    void *(*kvcache_new)(const void *model, int max_chunk);
    void (*kvcache_free)(void *cache);
    const float *(*forward_cached)(const void *model, void *cache, const int *tokens, int n);
    void (*describe)(const ArchConfig *cfg, char *out, size_t len);
} CpuArch;

/* The registry (arch.c), ending with NULL. */
extern const CpuArch *const cpu_archs[];
/* The CPU entry of arch, or NULL when the CPU has no block sequence for it. */
const CpuArch *cpu_arch_for(const struct ModelArch *arch);

/* The registry's entries (defined beside each architecture's block sequence). */
extern const CpuArch gpt2_cpu_arch;
extern const CpuArch llama3_cpu_arch;
extern const CpuArch mlp_cpu_arch;

#ifdef __cplusplus
}
#endif
#endif
