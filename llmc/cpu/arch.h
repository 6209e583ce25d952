/*
 * arch.h (CPU) - the CPU backend's per-architecture table: one CpuArch per architecture that has
 * a CPU block sequence, with uniform entry points over `void *model` (the architecture's own model
 * struct, model_size bytes). ./train_gpt_cpu (train_gpt.c) and ./generate (generate.c) hold one
 * set of adapters over it; each entry is defined beside its block sequence (gpt2_cpu_arch in
 * llmc/cpu/gpt2_arch.c, llama3_cpu_arch in llmc/cpu/llama.c, ...) and listed in cpu_archs[] (arch.c).
 * docs/ARCHITECTURES.md has the steps to add one.
 */
#ifndef LLMC_CPU_ARCH_H
#define LLMC_CPU_ARCH_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/core/logger.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/zero.h"
#include "llmc/dist/group.h"
#include "llmc/formats/arch.h"

#ifdef __cplusplus
extern "C" {
#endif

struct LoraRun; /* llmc/cpu/lora.h */
struct QBase;   /* llmc/cpu/qbase.h */

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
    /* The per-position losses (B, T) the last forward with targets left (multiple-choice
     * evaluation, llmc/train/eval.h). */
    const float *(*losses)(const void *model);
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

    /* ./generate: the KV cache (cache_size bytes, zeroed by the caller) for up to max_chunk new
     * tokens per call; forward_cached: tokens[0..n) at the cache's next positions, their logits
     * (n, Vp), valid until the next call; describe: the architecture's part of the banner ("" or
     * e.g. "Llama 3 (NKV 2, F 512), "). */
    size_t cache_size;
    void (*kvcache_init)(void *cache, const void *model, int max_chunk);
    void (*kvcache_free)(void *cache);
    const float *(*forward_cached)(const void *model, void *cache, const int *tokens, int n);
    void (*describe)(const ArchConfig *cfg, char *out, size_t len);

    /* LoRA (llmc/cpu/lora.h): the family of module names (llmc/models/lora.h; LORA_FAMILY_NONE: no
     * adapters) and set_lora, which gives the built model its adapters before allocate (the base is
     * then frozen). NULL / 0 where the block sequence has no LoRA sites. */
    int lora_family;
    void (*set_lora)(void *model, struct LoraRun *lora);
    /* QLoRA (llmc/cpu/qbase.h): gives the built model its quantised base (after quantising, the fp32
     * block weights are not read). NULL where the block sequence has no LoRA sites. */
    void (*set_qbase)(void *model, struct QBase *qbase);

    /* Optional (NULL: none): the architecture's own parts of a training step since zero_grad,
     * as log fields (lg) or step-line text (Mixtral: train_ce, train_aux, tokens per expert). */
    void (*step_log)(const void *model, char *text, size_t len, Logger *lg);

    /* Tensor parallelism (-tp N; NULL: not built for the architecture): tp_split keeps this rank's part
     * of a built model whose whole parameters are loaded (before allocate; tp: the group, dist/layout.h),
     * tp_validate says why cfg does not split over tp ranks (NULL: it does), tp_plan is plan for one
     * rank of tp. */
    void (*tp_split)(void *model, Dist *tp);
    const char *(*tp_validate)(const ArchConfig *cfg, int tp);
    void (*tp_plan)(const ArchConfig *cfg, int tp, int B, int T, int recompute, int training, MemPlan *p);
} CpuArch;

/* The uniform wrappers over a block sequence with llmc/cpu/llama.h's function shapes (P_build(Model *,
 * const Config *), P_allocate_for(Model *, B, T, training), P_plan(const Config *, B, T, training,
 * MemPlan *), ..., P_forward_cached): static functions P_cpu_build, P_cpu_allocate, ... that
 * CPU_ARCH_SEQUENCE_ENTRY lists. Model has cfg (Config, starting with a ModelConfig base),
 * num_parameters, params_memory, grads_memory, param_specs, acts_memory, act_specs; LOGITS and
 * LOSSES are its activation table's logits and losses indices. CPU_ARCH_SEQUENCE is for an
 * architecture that keeps every activation (no -r levels: P_cpu_fix_recompute notes -r and runs 0;
 * WHO names the model in that note, "MLP"); one with recompute levels (the Llama) takes
 * CPU_ARCH_SEQUENCE_COMMON / CPU_ARCH_SEQUENCE_COMMON_ENTRY and writes its own P_cpu_allocate and
 * P_cpu_plan (and the entry's max_recompute). */
#define CPU_ARCH_SEQUENCE(P, Model, Config, Cache, LOGITS, LOSSES, WHO)                                             \
    CPU_ARCH_SEQUENCE_COMMON(P, Model, Config, Cache, LOGITS, LOSSES)                                              \
    static void P##_cpu_allocate(void *m, int B, int T, int recompute, int training) {                             \
        (void)recompute;                                                                                           \
        P##_allocate_for((Model *)m, B, T, training);                                                              \
    }                                                                                                              \
    static void P##_cpu_plan(const ArchConfig *c, int B, int T, int recompute, int training, MemPlan *p) {       \
        (void)recompute;                                                                                           \
        P##_plan(P##_cpu_cfg(c), B, T, training, p);                                                               \
    }                                                                                                              \
    static int P##_cpu_fix_recompute(int recompute, FILE *note) {                                                  \
        if (recompute != 0)                                                                                        \
            fprintf(note, "note: -r %d: the CPU " WHO " keeps every activation (no recompute levels yet); "       \
                          "running -r 0\n", recompute);                                                            \
        return 0;                                                                                                  \
    }
#define CPU_ARCH_SEQUENCE_COMMON(P, Model, Config, Cache, LOGITS, LOSSES)                                             \
    static const Config *P##_cpu_cfg(const ArchConfig *c) { return arch_config_as((ArchConfig *)c, const Config); } \
    static void P##_cpu_build(void *m, const ArchConfig *c) { P##_build((Model *)m, P##_cpu_cfg(c)); }              \
    static void P##_cpu_free(void *m) { P##_free((Model *)m); }                                                    \
    static void P##_cpu_zero_grad(void *m) { P##_zero_grad((Model *)m); }                                         \
    static float P##_cpu_forward(void *m, const int *in, const int *tg, int B, int T, float dloss) {              \
        return P##_forward((Model *)m, in, tg, B, T, dloss);                                                       \
    }                                                                                                              \
    static void P##_cpu_backward(void *m, const int *in, int B, int T) { P##_backward((Model *)m, in, B, T); }     \
    static const float *P##_cpu_logits(const void *m) {                                                            \
        return tensor_layer(((const Model *)m)->acts_memory, &((const Model *)m)->act_specs[LOGITS], 0);         \
    }                                                                                                              \
    static const float *P##_cpu_losses(const void *m) {                                                            \
        return tensor_layer(((const Model *)m)->acts_memory, &((const Model *)m)->act_specs[LOSSES], 0);         \
    }                                                                                                              \
    static CpuModelParts P##_cpu_parts(void *m) {                                                                  \
        Model *model = (Model *)m;                                                                                 \
        return (CpuModelParts){&model->cfg.base, model->num_parameters, &model->params_memory,                    \
                               &model->grads_memory, model->param_specs};                                          \
    }                                                                                                              \
    static void P##_cpu_print_memory(const void *m, FILE *out) { P##_print_memory((const Model *)m, out); }        \
    static void P##_cpu_plan_shard(const ArchConfig *c, int zero, int ranks, int rank, MemPlan *p) {              \
        P##_plan_shard(P##_cpu_cfg(c), zero, ranks, rank, p);                                                      \
    }                                                                                                              \
    static void P##_cpu_shard(void *m, int zero, int ranks, int rank, CpuShardHooks hooks) {                      \
        P##_shard((Model *)m, zero, ranks, rank, hooks);                                                           \
    }                                                                                                              \
    static void P##_cpu_kvcache_init(void *c, const void *m, int max_chunk) {                                      \
        P##_kvcache_init((Cache *)c, (const Model *)m, max_chunk);                                                 \
    }                                                                                                              \
    static void P##_cpu_kvcache_free(void *c) { P##_kvcache_free((Cache *)c); }                                    \
    static const float *P##_cpu_forward_cached(const void *m, void *c, const int *tokens, int n) {                \
        return P##_forward_cached((const Model *)m, (Cache *)c, tokens, n);                                        \
    }

/* The entry's fields CPU_ARCH_SEQUENCE(P, Model, ...) defines, in a designated initializer:
 * {.arch = &..., CPU_ARCH_SEQUENCE_ENTRY(P, Model, Cache, WHO), .describe = ...}; _COMMON_ENTRY:
 * CPU_ARCH_SEQUENCE_COMMON's (the entry adds .allocate, .plan and its recompute fields). */
#define CPU_ARCH_SEQUENCE_COMMON_ENTRY(P, Model, Cache)                                                            \
    .model_size = sizeof(Model), .build = P##_cpu_build, .free = P##_cpu_free,                                     \
    .zero_grad = P##_cpu_zero_grad, .forward = P##_cpu_forward, .backward = P##_cpu_backward,                      \
    .logits = P##_cpu_logits, .losses = P##_cpu_losses, .parts = P##_cpu_parts,                                    \
    .print_memory = P##_cpu_print_memory, .plan_shard = P##_cpu_plan_shard, .shard = P##_cpu_shard,                \
    .cache_size = sizeof(Cache), .kvcache_init = P##_cpu_kvcache_init, .kvcache_free = P##_cpu_kvcache_free,       \
    .forward_cached = P##_cpu_forward_cached
#define CPU_ARCH_SEQUENCE_ENTRY(P, Model, Cache, WHO)                                                              \
    CPU_ARCH_SEQUENCE_COMMON_ENTRY(P, Model, Cache), .allocate = P##_cpu_allocate, .plan = P##_cpu_plan,           \
    .max_recompute = 0, .no_recompute = "the CPU " WHO " keeps every activation (no recompute levels)",           \
    .fix_recompute = P##_cpu_fix_recompute

/* The registry (arch.c), ending with NULL. */
extern const CpuArch *const cpu_archs[];
/* The CPU entry of arch, or NULL when the CPU has no block sequence for it. */
const CpuArch *cpu_arch_for(const struct ModelArch *arch);

/* The registry's entries (defined beside each architecture's block sequence). */
extern const CpuArch gpt2_cpu_arch;
extern const CpuArch llama3_cpu_arch;
extern const CpuArch mlp_cpu_arch;
extern const CpuArch mixtral_cpu_arch;

#ifdef __cplusplus
}
#endif
#endif
