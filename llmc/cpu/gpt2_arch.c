/*
 * gpt2_arch.c (CPU) - GPT-2's entry in the CPU backend's table (llmc/cpu/arch.h): its block
 * sequence (llmc/cpu/gpt2.h) and its KV-cache decode (llmc/cpu/decode.h). A file of its own:
 * decode.h includes gpt2.h, so gpt2.c cannot include decode.h without a loop.
 */
#include "llmc/cpu/arch.h"
#include "llmc/cpu/decode.h"
#include "llmc/cpu/gpt2.h"
#include "llmc/models/lora.h"

static void arch_build(void *m, const ArchConfig *cfg) { gpt2_build(m, arch_config_cbase(cfg)); }
static void arch_allocate(void *m, int B, int T, int recompute, int training) { gpt2_allocate(m, B, T, recompute, training); }
static void arch_free(void *m) { gpt2_free(m); }
static void arch_zero_grad(void *m) { gpt2_zero_grad(m); }
static float arch_forward(void *m, const int *inputs, const int *targets, int B, int T, float dloss) {
    return gpt2_forward(m, inputs, targets, B, T, dloss);
}
static void arch_backward(void *m, const int *inputs, int B, int T) { gpt2_backward(m, inputs, B, T); }
static const float *arch_logits(const void *m) { return ((const GPT2 *)m)->acts.logits; }
static const float *arch_losses(const void *m) { return ((const GPT2 *)m)->acts.losses; }
static CpuModelParts arch_parts(void *m) {
    GPT2 *model = m;
    return (CpuModelParts){&model->cfg, model->num_parameters, &model->params_memory, &model->grads_memory,
                           model->param_specs};
}
static void arch_print_memory(const void *m, FILE *out) { gpt2_print_memory(m, out); }
static void arch_plan(const ArchConfig *cfg, int B, int T, int recompute, int training, MemPlan *p) {
    gpt2_plan(arch_config_cbase(cfg), B, T, recompute, training, p);
}
static void arch_plan_shard(const ArchConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    gpt2_plan_shard(arch_config_cbase(cfg), zero, ranks, rank, p);
}
static void arch_shard(void *m, int zero, int ranks, int rank, CpuShardHooks hooks) { gpt2_shard(m, zero, ranks, rank, hooks); }
static void arch_kvcache_init(void *c, const void *m, int max_chunk) { kvcache_init(c, m, max_chunk); }
static void arch_kvcache_free(void *c) { kvcache_free(c); }
static const float *arch_forward_cached(const void *m, void *c, const int *tokens, int n) {
    return gpt2_forward_cached(m, c, tokens, n);
}
static void arch_set_lora(void *m, struct LoraRun *lora) { ((GPT2 *)m)->train.lora = lora; }
static void arch_tp_split(void *m, Dist *tp) { gpt2_tp_split(m, tp); }
static const char *arch_tp_validate(const ArchConfig *cfg, int tp) { return gpt2_tp_validate(arch_config_cbase(cfg), tp); }
static void arch_tp_plan(const ArchConfig *cfg, int tp, int B, int T, int recompute, int training, MemPlan *p) {
    gpt2_plan_tp(arch_config_cbase(cfg), tp, B, T, recompute, training, p);
}
static void arch_set_qbase(void *m, struct QBase *qbase) { ((GPT2 *)m)->train.qbase = qbase; }
static void arch_describe(const ArchConfig *cfg, char *out, size_t len) {
    (void)cfg;
    snprintf(out, len, "%s", "");
}

const CpuArch gpt2_cpu_arch = {
    .arch = &gpt2_arch,
    .model_size = sizeof(GPT2),
    .build = arch_build,
    .allocate = arch_allocate,
    .free = arch_free,
    .zero_grad = arch_zero_grad,
    .forward = arch_forward,
    .backward = arch_backward,
    .logits = arch_logits,
    .losses = arch_losses,
    .parts = arch_parts,
    .print_memory = arch_print_memory,
    .plan = arch_plan,
    .plan_shard = arch_plan_shard,
    .shard = arch_shard,
    .max_recompute = 2, /* no_recompute, fix_recompute: NULL (-r 0-2 run as given) */
    .cache_size = sizeof(KVCache),
    .kvcache_init = arch_kvcache_init,
    .kvcache_free = arch_kvcache_free,
    .forward_cached = arch_forward_cached,
    .describe = arch_describe,
    .lora_family = LORA_FAMILY_GPT2,
    .set_lora = arch_set_lora,
    .tp_split = arch_tp_split,
    .tp_validate = arch_tp_validate,
    .tp_plan = arch_tp_plan,
    .set_qbase = arch_set_qbase,
};
