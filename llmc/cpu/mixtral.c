#include "llmc/cpu/mixtral.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/arch.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/moe.h"
#include "llmc/cpu/moe_ep.h"
#include "llmc/cpu/residual.h"
#include "llmc/cpu/swiglu.h"

void mixtral_build(MixtralModel *model, const MixtralConfig *cfg) {
    const char *bad = mixtral_config_validate(cfg);
    if (bad) llmc_die("invalid Mixtral configuration: %s", bad);
    memset(model, 0, sizeof *model);
    model->cfg = *cfg;
    model->num_parameters = mixtral_parameter_specs(cfg, model->param_specs);
    model->train.params_floats = model->num_parameters;
    model->params_memory = (float *)mem_calloc(MEM_PARAMETERS, model->train.params_floats, sizeof(float), "parameters");
}

/* the scratch widths per token (see MixtralModel) */
static size_t scratch_f1(const MixtralConfig *cfg) {
    const ModelConfig *c = &cfg->base;
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * (c->channels / c->num_heads);
    size_t moe = (size_t)cfg->top_k * 2 * (size_t)c->ffn_hidden;
    return moe > QKV ? moe : QKV;
}
static size_t scratch_per_token(const MixtralConfig *cfg) {
    const size_t C = (size_t)cfg->base.channels, F = (size_t)cfg->base.ffn_hidden, K = (size_t)cfg->top_k;
    return 3 * C + scratch_f1(cfg) + K * F + K * C + K + (size_t)cfg->num_experts;
}

void mixtral_plan(const MixtralConfig *cfg, int B, int T, int training, MemPlan *p) {
    const ModelConfig *c = &cfg->base;
    TensorSpec act[MIXTRAL_NUM_ACTIVATIONS];
    size_t acts = mixtral_activation_specs(cfg, B, T, act);
    /* the activation arena plus RoPE's cos/sin table (T, HS), as the Llama's */
    mem_plan_tables(p, mixtral_parameter_specs(cfg, NULL), act, MIXTRAL_NUM_ACTIVATIONS,
                    acts + (size_t)T * (c->channels / c->num_heads), training);
    /* the plan's header line: total and active parameters; the grouped (permutation) buffers hold
     * B T K rows whatever the routing (dropless: an expert's rows are a slice of them, so no
     * per-expert worst case is needed) */
    snprintf(p->config, sizeof p->config, "Mixtral E %d top-%d: %zu active parameters per token of %zu, "
             "grouped expert rows B*T*K = %zu", cfg->num_experts, cfg->top_k, mixtral_active_parameters(cfg),
             p->num_parameters, (size_t)B * T * cfg->top_k);
    if (!training) return;
    p->host[MEM_BWD_SCRATCH] = (size_t)B * T * scratch_per_token(cfg) * sizeof(float);
    p->host[MEM_BLAS_PACKING] = (size_t)B * T * (size_t)c->padded_vocab_size * sizeof(float);
}

void mixtral_allocate_for(MixtralModel *model, int B, int T, int training) {
    const ModelConfig *c = &model->cfg.base;
    if (T > c->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T, c->max_seq_len);
    if ((double)B * T * model->cfg.top_k >= 16777216.0)
        llmc_die("Mixtral: B %d x T %d x top-k %d routed rows exceed 2^24 (the routing tables hold exact integers "
                 "in floats)", B, T, model->cfg.top_k);
    model->B = B, model->T = T;
    MemPlan plan;
    mem_plan_init(&plan, "CPU");
    mixtral_plan(&model->cfg, B, T, training, &plan);
    model->num_activations = mixtral_activation_specs(&model->cfg, B, T, model->act_specs);
    model->acts_memory = (float *)mem_calloc(MEM_ACTIVATIONS, plan.host[MEM_ACTIVATIONS] / sizeof(float), sizeof(float),
                                             "activations");
    model->freqs = model->acts_memory + model->num_activations;
    llama_rope_table(model->freqs, T, &model->cfg.llama);
    if (!training) return;
    const size_t N = (size_t)B * T, C = (size_t)c->channels, F = (size_t)c->ffn_hidden, K = (size_t)model->cfg.top_k;
    float *next = cpu_training_alloc_scratch(&model->train, &plan, N, C);
    model->dbuf_r = next;
    model->train.dbuf_f1 = model->dbuf_r + N * C;
    model->train.dbuf_f2 = model->train.dbuf_f1 + N * scratch_f1(&model->cfg);
    model->dbuf_y = model->train.dbuf_f2 + N * K * F;
    model->dbuf_w = model->dbuf_y + N * K * C;
    model->dbuf_z = model->dbuf_w + N * K;
    model->grads_memory = cpu_training_alloc_grads(&model->train, model->num_parameters);
    if (model->ep) moe_ep_allocate(model->ep, B, T);
}

/* ---- expert parallelism (moe_ep.h) ---- */
void mixtral_set_expert_parallel(MixtralModel *model, MoeEp *ep) {
    const int ways = ep->ways;
    const size_t n = mixtral_shard_parameter_specs(&model->cfg, ways, model->param_specs);
    float *local = (float *)mem_calloc(MEM_PARAMETERS, n, sizeof(float), "parameters (this rank's experts)");
    mixtral_shard_copy(&model->cfg, ways, ep->shard, model->params_memory, local, 1, 0);
    mem_free(MEM_PARAMETERS, model->params_memory, model->train.params_floats * sizeof(float));
    model->params_memory = local;
    model->num_parameters = model->train.params_floats = n;
    model->ep = ep;
}

void mixtral_plan_expert_parallel(const MixtralConfig *cfg, int ways, int B, int T, int zero, int ranks, int rank,
                                  MemPlan *p) {
    TensorSpec specs[MIXTRAL_NUM_PARAMETERS];
    const size_t n = mixtral_shard_parameter_specs(cfg, ways, specs);
    const int training = p->host[MEM_GRADIENTS] != 0;
    size_t acts, scratch;
    moe_ep_bytes(cfg, ways, B, T, &acts, &scratch);
    p->num_parameters = n;
    p->host[MEM_PARAMETERS] = n * sizeof(float);
    if (!training) return;
    p->host[MEM_GRADIENTS] = n * sizeof(float);
    p->host[MEM_ACTIVATIONS] += acts;
    p->host[MEM_BWD_SCRATCH] += scratch;
    if (zero >= 2) cpu_zero_plan(specs, MIXTRAL_NUM_PARAMETERS, n, zero, ranks, rank, p); /* the gradient buckets */
}

void mixtral_plan_shard(const MixtralConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    TensorSpec specs[MIXTRAL_NUM_PARAMETERS];
    size_t n = mixtral_parameter_specs(cfg, specs);
    cpu_zero_plan(specs, MIXTRAL_NUM_PARAMETERS, n, zero, ranks, rank, p);
}

void mixtral_shard(MixtralModel *model, int zero, int ranks, int rank, CpuShardHooks hooks) {
    cpu_training_shard(&model->train, model->param_specs, MIXTRAL_NUM_PARAMETERS, model->cfg.base.num_layers, model->num_parameters, zero,
                       ranks, rank, hooks, &model->params_memory, &model->grads_memory);
}

/* the family's shared pieces see the trunk rows at the Llama's indices (llmc/cpu/llama.h) */
#define SAME_ROW(p, name) _Static_assert((int)MIXTRAL_##p##_##name == (int)LLAMA3_##p##_##name, "trunk row " #name)
SAME_ROW(P, wte); SAME_ROW(P, ln1w); SAME_ROW(P, qkvw); SAME_ROW(P, attprojw); SAME_ROW(P, ln2w);
SAME_ROW(A, encoded); SAME_ROW(A, ln1); SAME_ROW(A, ln1_rstd); SAME_ROW(A, qkv); SAME_ROW(A, atty); SAME_ROW(A, att);
SAME_ROW(A, residual2); SAME_ROW(A, ln2); SAME_ROW(A, ln2_rstd);
#undef SAME_ROW

#define PARAM(name, l) cpu_zero_param_view(&model->train.zs, model->param_specs, MIXTRAL_P_##name, l, model->params_memory)
#define GRAD(name, l) cpu_zero_grad_view(&model->train.zs, model->param_specs, MIXTRAL_P_##name, l, model->grads_memory)
#define ACT(name, l) tensor_layer(model->acts_memory, &model->act_specs[MIXTRAL_A_##name], l)

/* each expert's first grouped row (offset[E] = N K), from the per-expert counts */
static void expert_offsets(const float *count, int E, int *offset) {
    offset[0] = 0;
    for (int e = 0; e < E; e++) offset[e + 1] = offset[e] + (int)count[e];
}

/* The routed experts of layer l for the n rows of x (rmsnorm'd): out (n, C) (=); the routing
 * and grouped buffers as the activation table's (probs (n, E), rexp/rw/rrow (n, K), count (E),
 * mx/my (n K, C), mh (n K, 2F), ms (n K, F)). */
static void moe_forward(const MixtralModel *model, int l, const float *x, int n, float *out, float *probs, float *rexp,
                        float *rw, float *rrow, float *count, float *mx, float *mh, float *ms, float *my) {
    const int C = model->cfg.base.channels, F = model->cfg.base.ffn_hidden;
    const int E = model->cfg.num_experts, K = model->cfg.top_k;
    int offset[MIXTRAL_MAX_EXPERTS + 1];
    matmul_forward(probs, x, PARAM(gatew, l), NULL, n, C, E);
    moe_router_forward(probs, rexp, rw, n, E, K);
    moe_permute(rrow, count, offset, rexp, n, E, K);
    moe_gather(mx, x, rrow, n, K, C);
    const float *w13 = PARAM(expfcw, l), *w2 = PARAM(expprojw, l);
    if (model->ep) { /* -ep: the experts on their ranks (moe_ep.h) */
        moe_ep_forward(model->ep, l, w13, w2, mx, count, my);
        moe_combine_forward(out, my, rw, rrow, n, K, C);
        return;
    }
    for (int e = 0; e < E; e++) {
        const int rows = offset[e + 1] - offset[e];
        const size_t r = (size_t)offset[e];
        if (rows == 0) continue;
        matmul_forward(mh + r * 2 * F, mx + r * C, w13 + (size_t)e * 2 * F * C, NULL, rows, C, 2 * F);
        swiglu_forward(ms + r * F, mh + r * 2 * F, rows, F);
        matmul_forward(my + r * C, ms + r * F, w2 + (size_t)e * C * F, NULL, rows, F, C);
    }
    moe_combine_forward(out, my, rw, rrow, n, K, C);
}

/* the family's MLP hooks (llmc/cpu/llama.h): residual3 = residual2 + the routed experts of ln2 */
static void moe_ffn_forward(void *m, int l, int B, int T) {
    const MixtralModel *model = (const MixtralModel *)m;
    const int C = model->cfg.base.channels, N = B * T;
    float *residual3 = ACT(residual3, l);
    moe_forward(model, l, ACT(ln2, l), N, residual3, ACT(router_probs, l), ACT(route_expert, l), ACT(route_weight, l),
                ACT(route_row, l), ACT(expert_count, l), ACT(moe_x, l), ACT(moe_h, l), ACT(moe_swiglu, l),
                ACT(moe_y, l));
    residual_forward(residual3, residual3, ACT(residual2, l), (size_t)N * C);
}

static void moe_ffn_backward(void *m, int l, int B, int T) {
    MixtralModel *model = (MixtralModel *)m;
    const int C = model->cfg.base.channels, F = model->cfg.base.ffn_hidden, N = B * T;
    const int E = model->cfg.num_experts, K = model->cfg.top_k;
    int offset[MIXTRAL_MAX_EXPERTS + 1];
    float *ln2 = ACT(ln2, l), *dres = model->train.dresidual;
    float *probs = ACT(router_probs, l), *rexp = ACT(route_expert, l), *rw = ACT(route_weight, l);
    float *rrow = ACT(route_row, l);
    float *mx = ACT(moe_x, l), *mh = ACT(moe_h, l), *ms = ACT(moe_swiglu, l), *my = ACT(moe_y, l);
    expert_offsets(ACT(expert_count, l), E, offset);
    /* residual3 = residual2 + combine(experts(gather(ln2))) */
    float *dy = model->dbuf_y, *dw = model->dbuf_w, *dsw = model->train.dbuf_f2, *dh = model->train.dbuf_f1;
    moe_combine_backward(dy, dw, dres, my, rw, rrow, N, K, C);
    const float *w13 = PARAM(expfcw, l), *w2 = PARAM(expprojw, l);
    float *dw13 = GRAD(expfcw, l), *dw2 = GRAD(expprojw, l);
    if (model->ep) moe_ep_backward(model->ep, l, w13, w2, dw13, dw2, dy, ACT(expert_count, l));
    for (int e = 0; e < E && !model->ep; e++) {
        const int n = offset[e + 1] - offset[e];
        const size_t r = (size_t)offset[e];
        if (n == 0) continue;
        matmul_backward(dsw + r * F, dw2 + (size_t)e * C * F, NULL, dy + r * C, ms + r * F, w2 + (size_t)e * C * F, n,
                        F, C);
        swiglu_backward(dh + r * 2 * F, mh + r * 2 * F, dsw + r * F, n, F);
        /* dx of these rows replaces their dy (consumed above) */
        matmul_backward(dy + r * C, dw13 + (size_t)e * 2 * F * C, NULL, dh + r * 2 * F, mx + r * C,
                        w13 + (size_t)e * 2 * F * C, n, C, 2 * F);
    }
    /* dln2: the experts' inputs and the router's */
    float *dln2 = model->train.dbuf_c, *dln2_router = model->dbuf_r, *dz = model->dbuf_z;
    moe_gather_backward(dln2, dy, rrow, N, K, C);
    moe_router_backward(dz, dw, probs, rexp, rw, model->aux_dprob, N, E, K);
    matmul_backward(dln2_router, GRAD(gatew, l), NULL, dz, ln2, PARAM(gatew, l), N, C, E);
    residual_forward(dln2, dln2, dln2_router, (size_t)N * C);
}

static void moe_ffn_decode(void *m, LlamaDecode *d, int l, int n) {
    const MixtralModel *model = (const MixtralModel *)m;
    MixtralKVCache *c = (MixtralKVCache *)d; /* d is the cache's first member */
    moe_forward(model, l, d->ln, n, d->proj, c->probs, c->rexp, c->rw, c->rrow, c->count, c->mx, c->mh, c->ms, c->my);
}

static LlamaTrunk trunk_of(const MixtralModel *model) {
    return (LlamaTrunk){&model->cfg.llama, model->param_specs, model->act_specs, model->params_memory,
                        model->grads_memory, model->acts_memory, model->freqs, (CpuTraining *)&model->train,
                        MIXTRAL_P_lnfw, MIXTRAL_A_residual3, (void *)model, moe_ffn_forward, moe_ffn_backward,
                        moe_ffn_decode};
}

float mixtral_forward(MixtralModel *model, const int *inputs, const int *targets, int B, int T, float dloss) {
    const ModelConfig *cfg = &model->cfg.base;
    if (!model->acts_memory) llmc_die("mixtral_forward: call mixtral_allocate_for first");
    if (T > model->T || (size_t)B * T > (size_t)model->B * model->T)
        llmc_die("mixtral_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    const int L = cfg->num_layers, N = B * T;
    const int E = model->cfg.num_experts;
    const LlamaTrunk t = trunk_of(model);
    const float ce = llama_family_forward(&t, inputs, targets, B, T, dloss);
    if (!targets) return model->train.mean_loss = 0.0f;
    /* aux = E sum_e f_e P_e over the L N pooled router rows; its gradient through P only:
     * d aux / d p(row, e) = E f_e / M */
    const double M = (double)L * N;
    double aux = 0.0;
    int min_sum = 0, max_sum = 0;
    for (int e = 0; e < E; e++) {
        double cnt = 0.0, psum = 0.0;
        for (int l = 0; l < L; l++) {
            cnt += ACT(expert_count, l)[e];
            const float *probs = ACT(router_probs, l);
            for (int t = 0; t < N; t++) psum += probs[(size_t)t * E + e];
        }
        aux += (cnt / M) * (psum / M);
        model->aux_dprob[e] = (float)(model->cfg.aux_coef * (double)dloss * N * E * cnt / (M * M));
    }
    aux *= E;
    for (int l = 0; l < L; l++) {
        const float *count = ACT(expert_count, l);
        int lo = (int)count[0], hi = (int)count[0];
        for (int e = 1; e < E; e++) lo = (int)count[e] < lo ? (int)count[e] : lo, hi = (int)count[e] > hi ? (int)count[e] : hi;
        min_sum += lo, max_sum += hi;
    }
    const int with_aux = model->cfg.output_router_logits;
    if (!with_aux) memset(model->aux_dprob, 0, sizeof model->aux_dprob);
    model->last_ce = ce, model->last_aux = (float)aux, model->dloss = dloss, model->last_N = N;
    if (dloss == 0.0f) return model->train.mean_loss = ce; /* evaluation: the cross-entropy */
    const float objective = with_aux ? ce + model->cfg.aux_coef * (float)aux : ce;
    model->step_ce += ce, model->step_aux += aux, model->step_micro++;
    model->step_min_tokens += min_sum, model->step_max_tokens += max_sum;
    return model->train.mean_loss = objective;
}

void mixtral_backward(MixtralModel *model, const int *inputs, int B, int T) {
    const LlamaTrunk t = trunk_of(model);
    llama_family_backward(&t, inputs, B, T);
}

void mixtral_zero_grad(MixtralModel *model) {
    model->step_ce = model->step_aux = 0.0;
    model->step_micro = model->step_min_tokens = model->step_max_tokens = 0;
    if (model->ep) moe_ep_clear_stats(model->ep);
    if (model->train.zs.zero >= 2) return;
    if (model->grads_memory) memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

void mixtral_step_log(const MixtralModel *model, char *text, size_t len, Logger *lg) {
    const double n = model->step_micro > 0 ? (double)model->step_micro : 1.0;
    if (lg) {
        log_float(lg, "train_ce", (float)(model->step_ce / n));
        log_float(lg, "train_aux", (float)(model->step_aux / n));
        log_int(lg, "expert_tokens_min", model->step_min_tokens);
        log_int(lg, "expert_tokens_max", model->step_max_tokens);
        if (model->ep) log_int(lg, "a2a_bytes", model->ep->a2a_bytes), log_double(lg, "a2a_ms", model->ep->a2a_ms);
    }
    if (text) {
        int k = snprintf(text, len, " | ce %.6f | aux %.4f | expert tokens min %lld max %lld", model->step_ce / n,
                         model->step_aux / n, model->step_min_tokens, model->step_max_tokens);
        if (model->ep && k > 0 && (size_t)k < len)
            snprintf(text + k, len - (size_t)k, " | a2a %.2f MB, %.1f ms", model->ep->a2a_bytes / 1e6, model->ep->a2a_ms);
    }
}

void mixtral_free(MixtralModel *model) {
    const ModelConfig *c = &model->cfg.base;
    if (model->ep) moe_ep_free(model->ep);
    cpu_training_free(&model->train, model->params_memory, model->grads_memory, model->acts_memory,
                      model->num_activations + (size_t)model->T * (c->channels / c->num_heads));
    memset(model, 0, sizeof *model);
}

void mixtral_print_memory(const MixtralModel *model, FILE *out) {
    char note[64];
    if (model->ep)
        snprintf(note, sizeof note, "experts %d..%d of %d here (-ep %d); ", model->ep->shard * model->ep->local,
                 (model->ep->shard + 1) * model->ep->local - 1, model->cfg.num_experts, model->ep->ways);
    else snprintf(note, sizeof note, "%zu active per token; ", mixtral_active_parameters(&model->cfg));
    cpu_training_print_memory(out, "Mixtral", model->num_parameters, note, model->act_specs, MIXTRAL_NUM_ACTIVATIONS,
                              &model->train, model->grads_memory != NULL);
}

/* ---- decode with a key/value cache (./generate): the Llama's cache, the routed experts ------ */

void mixtral_kvcache_init(MixtralKVCache *c, const MixtralModel *model, int max_chunk) {
    const size_t C = (size_t)model->cfg.base.channels, F = (size_t)model->cfg.base.ffn_hidden, n = (size_t)max_chunk;
    const size_t E = (size_t)model->cfg.num_experts, K = (size_t)model->cfg.top_k;
    memset(c, 0, sizeof *c);
    const size_t shared = llama_decode_layout(&c->d, &model->cfg.llama, max_chunk, NULL);
    const size_t sizes[] = {n * E, n * K, n * K, n * K, E, n * K * C, n * K * 2 * F, n * K * F, n * K * C};
    float **ptrs[] = {&c->probs, &c->rexp, &c->rw, &c->rrow, &c->count, &c->mx, &c->mh, &c->ms, &c->my};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof ptrs / sizeof ptrs[0], "one size per buffer");
    size_t total = shared;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    c->memory = (float *)mallocCheck(total * sizeof(float), "Mixtral KV cache");
    llama_decode_layout(&c->d, &model->cfg.llama, max_chunk, c->memory);
    float *p = c->memory + shared;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) *ptrs[i] = p, p += sizes[i];
}

void mixtral_kvcache_free(MixtralKVCache *c) {
    free(c->memory);
    memset(c, 0, sizeof *c);
}

const float *mixtral_forward_cached(const MixtralModel *model, MixtralKVCache *c, const int *tokens, int n) {
    const LlamaTrunk t = trunk_of(model);
    return llama_family_decode(&t, &c->d, tokens, n, "mixtral_forward_cached");
}

/* ---- the CPU backend's entry (llmc/cpu/arch.h) ------------------------------------------ */
CPU_ARCH_SEQUENCE(mixtral, MixtralModel, MixtralConfig, MixtralKVCache, MIXTRAL_A_logits, MIXTRAL_A_losses, "Mixtral")

static void mixtral_cpu_describe(const ArchConfig *cfg, char *out, size_t len) {
    const MixtralConfig *m = arch_config_as((ArchConfig *)cfg, const MixtralConfig);
    snprintf(out, len, "Mixtral (E %d, top-%d, NKV %d, F %d), ", m->num_experts, m->top_k, m->base.num_kv_heads,
             m->base.ffn_hidden);
}

static void mixtral_cpu_step_log(const void *m, char *text, size_t len, Logger *lg) {
    mixtral_step_log((const MixtralModel *)m, text, len, lg);
}

const CpuArch mixtral_cpu_arch = {
    .arch = &mixtral_arch,
    CPU_ARCH_SEQUENCE_ENTRY(mixtral, MixtralModel, MixtralKVCache, "Mixtral"),
    .describe = mixtral_cpu_describe,
    .step_log = mixtral_cpu_step_log,
};
