#include "llmc/cpu/mixtral.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/arch.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/moe.h"
#include "llmc/cpu/residual.h"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
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
    p->num_parameters = mixtral_parameter_specs(cfg, NULL);
    p->recompute = 0;
    p->host[MEM_PARAMETERS] = p->num_parameters * sizeof(float);
    TensorSpec act[MIXTRAL_NUM_ACTIVATIONS];
    size_t acts = mixtral_activation_specs(cfg, B, T, act);
    _Static_assert((int)MIXTRAL_NUM_ACTIVATIONS <= (int)MODEL_MAX_ACTIVATIONS, "MemPlan.act holds the Mixtral table");
    memset(p->act, 0, sizeof p->act);
    memset(p->act_bytes, 0, sizeof p->act_bytes);
    for (int i = 0; i < MIXTRAL_NUM_ACTIVATIONS; i++) p->act[i] = act[i], p->act_bytes[i] = act[i].numel * sizeof(float);
    p->host[MEM_ACTIVATIONS] = (acts + (size_t)T * (c->channels / c->num_heads)) * sizeof(float);
    /* the plan's header line: total and active parameters; the grouped (permutation) buffers hold
     * B T K rows whatever the routing (dropless: an expert's rows are a slice of them, so no
     * per-expert worst case is needed) */
    snprintf(p->config, sizeof p->config, "Mixtral E %d top-%d: %zu active parameters per token of %zu, "
             "grouped expert rows B*T*K = %zu", cfg->num_experts, cfg->top_k, mixtral_active_parameters(cfg),
             p->num_parameters, (size_t)B * T * cfg->top_k);
    if (!training) return;
    p->host[MEM_GRADIENTS] = p->num_parameters * sizeof(float);
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
    const int HS = c->channels / c->num_heads;
    model->acts_memory = (float *)mem_calloc(MEM_ACTIVATIONS, plan.host[MEM_ACTIVATIONS] / sizeof(float), sizeof(float),
                                             "activations");
    model->freqs = model->acts_memory + model->num_activations;
    const LlamaConfig *lc = &model->cfg.llama;
    RopeConfig rc = {lc->rope_theta, lc->rope_factor, lc->rope_low_freq_factor, lc->rope_high_freq_factor,
                     lc->rope_original_max_pos};
    rope_freqs(model->freqs, T, HS, &rc);
    if (!training) return;
    const size_t N = (size_t)B * T, C = (size_t)c->channels, F = (size_t)c->ffn_hidden, K = (size_t)model->cfg.top_k;
    model->train.num_scratch = plan.host[MEM_BWD_SCRATCH] / sizeof(float);
    model->train.scratch_memory = (float *)mem_calloc(MEM_BWD_SCRATCH, model->train.num_scratch, sizeof(float), "backward scratch");
    model->train.dresidual = model->train.scratch_memory;
    model->train.dbuf_c = model->train.dresidual + N * C;
    model->dbuf_r = model->train.dbuf_c + N * C;
    model->train.dbuf_f1 = model->dbuf_r + N * C;
    model->train.dbuf_f2 = model->train.dbuf_f1 + N * scratch_f1(&model->cfg);
    model->dbuf_y = model->train.dbuf_f2 + N * K * F;
    model->dbuf_w = model->dbuf_y + N * K * C;
    model->dbuf_z = model->dbuf_w + N * K;
    model->train.grads_floats = model->num_parameters;
    model->grads_memory = (float *)mem_calloc(MEM_GRADIENTS, model->train.grads_floats, sizeof(float), "gradients");
}

void mixtral_plan_shard(const MixtralConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    TensorSpec specs[MIXTRAL_NUM_PARAMETERS];
    size_t n = mixtral_parameter_specs(cfg, specs);
    cpu_zero_plan(specs, MIXTRAL_NUM_PARAMETERS, n, zero, ranks, rank, p);
}

void mixtral_shard(MixtralModel *model, int zero, int ranks, int rank, CpuShardHooks hooks) {
    cpu_zero_shard(&model->train.zs, model->param_specs, MIXTRAL_NUM_PARAMETERS, model->cfg.base.num_layers,
                   model->num_parameters, zero, ranks, rank, hooks, &model->params_memory, &model->train.params_floats,
                   &model->grads_memory, &model->train.grads_floats);
}

#define PARAM(name, l)                                                                                   \
    cpu_zero_view(&model->train.zs, model->param_specs, MIXTRAL_P_##name, l, model->params_memory,             \
                  model->train.zs.cur_params, model->train.zs.zero == 3 ? model->train.zs.gather_memory : NULL)
#define GRAD(name, l)                                                                                    \
    cpu_zero_view(&model->train.zs, model->param_specs, MIXTRAL_P_##name, l, model->grads_memory, model->train.zs.cur_grads, \
                  model->train.zs.zero >= 2 ? model->grads_memory : NULL)
#define ACT(name, l) tensor_layer(model->acts_memory, &model->act_specs[MIXTRAL_A_##name], l)
#define BLOCK_INPUT(l) ((l) == 0 ? ACT(encoded, 0) : ACT(residual3, (l) - 1))
#define HEAD(which) (model->cfg.llama.tied ? which(wte, 0) : which(lm_head, 0))

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

float mixtral_forward(MixtralModel *model, const int *inputs, const int *targets, int B, int T, float dloss) {
    const ModelConfig *cfg = &model->cfg.base;
    if (!model->acts_memory) llmc_die("mixtral_forward: call mixtral_allocate_for first");
    if (T > model->T || (size_t)B * T > (size_t)model->B * model->T)
        llmc_die("mixtral_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int HS = C / NH, QKV = (NH + 2 * NKV) * HS;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, N = B * T;
    const int E = model->cfg.num_experts;
    const float eps = model->cfg.llama.norm_eps;
    cpu_zero_gather_outer(&model->train.zs);
    cpu_zero_prefetch_layer(&model->train.zs, 0);
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            llmc_die("token id at position %d is outside the vocabulary [0, %d)", i, V);
        memcpy(ACT(encoded, 0) + (size_t)i * C, PARAM(wte, 0) + (size_t)inputs[i] * C, (size_t)C * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        cpu_zero_use_layer(&model->train.zs, l, l + 1);
        float *residual = BLOCK_INPUT(l), *ln1 = ACT(ln1, l), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        float *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l), *residual3 = ACT(residual3, l);
        /* attention: the Llama's */
        rmsnorm_forward(ln1, ACT(ln1_rstd, l), residual, PARAM(ln1w, l), N, C, eps);
        matmul_forward(qkv, ln1, PARAM(qkvw, l), NULL, N, C, QKV);
        rope_forward(qkv, model->freqs, B, T, NH, NKV, HS);
        attention_forward(atty, ACT(att, l), qkv, B, T, NH, NKV, HS);
        matmul_forward(residual2, atty, PARAM(attprojw, l), NULL, N, C, C);
        residual_forward(residual2, residual2, residual, (size_t)N * C);
        /* the routed experts */
        rmsnorm_forward(ln2, ACT(ln2_rstd, l), residual2, PARAM(ln2w, l), N, C, eps);
        moe_forward(model, l, ln2, N, residual3, ACT(router_probs, l), ACT(route_expert, l), ACT(route_weight, l),
                    ACT(route_row, l), ACT(expert_count, l), ACT(moe_x, l), ACT(moe_h, l), ACT(moe_swiglu, l),
                    ACT(moe_y, l));
        residual_forward(residual3, residual3, residual2, (size_t)N * C);
    }
    cpu_zero_end_layers(&model->train.zs);
    rmsnorm_forward(ACT(lnf, 0), ACT(lnf_rstd, 0), ACT(residual3, L - 1), PARAM(lnfw, 0), N, C, eps);
    matmul_forward(ACT(logits, 0), ACT(lnf, 0), HEAD(PARAM), NULL, N, C, Vp);
    if (!targets) return model->train.mean_loss = 0.0f;
    float *losses = ACT(losses, 0);
    fused_classifier(ACT(logits, 0), losses, targets, dloss, N, V, Vp, dloss != 0.0f);
    float sum = 0.0f;
    for (int i = 0; i < N; i++) sum += losses[i];
    const float ce = sum / N;
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
    const ModelConfig *cfg = &model->cfg.base;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, QKV = (NH + 2 * NKV) * HS;
    const int Vp = cfg->padded_vocab_size, N = B * T;
    const int E = model->cfg.num_experts, K = model->cfg.top_k;
    float *dres = model->train.dresidual;
    int offset[MIXTRAL_MAX_EXPERTS + 1];
    cpu_zero_backward_begin(&model->train.zs, model->grads_memory);
    matmul_backward(model->train.dbuf_c, HEAD(GRAD), NULL, ACT(logits, 0), ACT(lnf, 0), HEAD(PARAM), N, C, Vp);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    rmsnorm_backward(dres, GRAD(lnfw, 0), model->train.dbuf_c, ACT(residual3, L - 1), PARAM(lnfw, 0), ACT(lnf_rstd, 0), N, C);
    for (int l = L - 1; l >= 0; l--) {
        cpu_zero_use_layer(&model->train.zs, l, l - 1);
        cpu_zero_layer_grads(&model->train.zs, model->grads_memory);
        float *residual = BLOCK_INPUT(l), *ln1 = ACT(ln1, l), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        float *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l);
        float *probs = ACT(router_probs, l), *rexp = ACT(route_expert, l), *rw = ACT(route_weight, l);
        float *rrow = ACT(route_row, l);
        float *mx = ACT(moe_x, l), *mh = ACT(moe_h, l), *ms = ACT(moe_swiglu, l), *my = ACT(moe_y, l);
        expert_offsets(ACT(expert_count, l), E, offset);
        /* residual3 = residual2 + combine(experts(gather(ln2))) */
        float *dy = model->dbuf_y, *dw = model->dbuf_w, *dsw = model->train.dbuf_f2, *dh = model->train.dbuf_f1;
        moe_combine_backward(dy, dw, dres, my, rw, rrow, N, K, C);
        const float *w13 = PARAM(expfcw, l), *w2 = PARAM(expprojw, l);
        float *dw13 = GRAD(expfcw, l), *dw2 = GRAD(expprojw, l);
        for (int e = 0; e < E; e++) {
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
        float *dln2 = model->train.dbuf_c, *dln2_router = model->dbuf_r, *dz = model->dbuf_z;
        moe_gather_backward(dln2, dy, rrow, N, K, C);
        moe_router_backward(dz, dw, probs, rexp, rw, model->aux_dprob, N, E, K);
        matmul_backward(dln2_router, GRAD(gatew, l), NULL, dz, ln2, PARAM(gatew, l), N, C, E);
        residual_forward(dln2, dln2, dln2_router, (size_t)N * C);
        rmsnorm_backward(dres, GRAD(ln2w, l), dln2, residual2, PARAM(ln2w, l), ACT(ln2_rstd, l), N, C);
        /* attention: the Llama's */
        float *datty = model->train.dbuf_c;
        matmul_backward(datty, GRAD(attprojw, l), NULL, dres, atty, PARAM(attprojw, l), N, C, C);
        float *dqkv = model->train.dbuf_f1;
        attention_backward(dqkv, datty, qkv, ACT(att, l), B, T, NH, NKV, HS);
        rope_backward(dqkv, model->freqs, B, T, NH, NKV, HS);
        float *dln1 = model->train.dbuf_c;
        matmul_backward(dln1, GRAD(qkvw, l), NULL, dqkv, ln1, PARAM(qkvw, l), N, C, QKV);
        rmsnorm_backward(dres, GRAD(ln1w, l), dln1, residual, PARAM(ln1w, l), ACT(ln1_rstd, l), N, C);
        cpu_zero_reduce_layer(&model->train.zs, l);
    }
    cpu_zero_end_layers(&model->train.zs);
    embedding_backward(GRAD(wte, 0), dres, inputs, N, C);
    cpu_zero_reduce_outer(&model->train.zs, model->grads_memory);
}

void mixtral_zero_grad(MixtralModel *model) {
    model->step_ce = model->step_aux = 0.0;
    model->step_micro = model->step_min_tokens = model->step_max_tokens = 0;
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
    }
    if (text)
        snprintf(text, len, " | ce %.6f | aux %.4f | expert tokens min %lld max %lld", model->step_ce / n,
                 model->step_aux / n, model->step_min_tokens, model->step_max_tokens);
}

void mixtral_free(MixtralModel *model) {
    const ModelConfig *c = &model->cfg.base;
    mem_free(MEM_PARAMETERS, model->params_memory, model->train.params_floats * sizeof(float));
    mem_free(MEM_GRADIENTS, model->grads_memory, model->train.grads_floats * sizeof(float));
    cpu_zero_free(&model->train.zs);
    if (model->acts_memory)
        mem_free(MEM_ACTIVATIONS, model->acts_memory,
                 (model->num_activations + (size_t)model->T * (c->channels / c->num_heads)) * sizeof(float));
    mem_free(MEM_BWD_SCRATCH, model->train.scratch_memory, model->train.num_scratch * sizeof(float));
    memset(model, 0, sizeof *model);
}

void mixtral_print_memory(const MixtralModel *model, FILE *out) {
    const double MiB = 1048576.0;
    double kinds[ACT_NUM_KINDS] = {0};
    for (int i = 0; i < MIXTRAL_NUM_ACTIVATIONS; i++)
        kinds[model->act_specs[i].kind] += model->act_specs[i].numel * sizeof(float);
    fprintf(out, "memory (CPU, fp32, Mixtral): parameters %zu (%zu active per token; %.1f MiB%s), ",
            model->num_parameters, mixtral_active_parameters(&model->cfg), model->train.params_floats * sizeof(float) / MiB,
            model->train.zs.zero == 3 ? " this shard" : "");
    fprintf(out, "gradients%s %.1f MiB, activations", model->train.zs.zero >= 2 ? " (2 buckets, -z >= 2)" : "",
            model->train.grads_floats * sizeof(float) / MiB);
    for (int k = 0; k < ACT_NUM_KINDS; k++) fprintf(out, "%s %s %.1f MiB", k ? "," : "", activation_kind_names[k], kinds[k] / MiB);
    fprintf(out, ", backward scratch %.1f MiB\n", model->train.num_scratch * sizeof(float) / MiB);
}

/* ---- decode with a key/value cache (./generate): the Llama's cache, the routed experts ------ */

void mixtral_kvcache_init(MixtralKVCache *c, const MixtralModel *model, int max_chunk) {
    const ModelConfig *cfg = &model->cfg.base;
    const size_t C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden, Vp = (size_t)cfg->padded_vocab_size;
    const size_t L = (size_t)cfg->num_layers, T = (size_t)cfg->max_seq_len, NH = (size_t)cfg->num_heads;
    const size_t HS = C / NH, KV = 2 * (size_t)cfg->num_kv_heads * HS, QKV = NH * HS + KV, n = (size_t)max_chunk;
    const size_t E = (size_t)model->cfg.num_experts, K = (size_t)model->cfg.top_k;
    memset(c, 0, sizeof *c);
    c->max_len = cfg->max_seq_len;
    c->max_chunk = max_chunk;
    size_t sizes[] = {L * T * KV, T * HS, n * C, n * C, n * QKV, n * C, n * C, n * Vp, n, NH * T,
                      n * E, n * K, n * K, n * K, E, n * K * C, n * K * 2 * F, n * K * F, n * K * C};
    float **ptrs[] = {&c->kv, &c->freqs, &c->residual, &c->ln, &c->qkv, &c->atty, &c->proj, &c->logits, &c->rstd,
                      &c->att, &c->probs, &c->rexp, &c->rw, &c->rrow, &c->count, &c->mx, &c->mh, &c->ms, &c->my};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof ptrs / sizeof ptrs[0], "one size per buffer");
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    c->memory = (float *)mallocCheck(total * sizeof(float), "Mixtral KV cache");
    float *p = c->memory;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) *ptrs[i] = p, p += sizes[i];
    const LlamaConfig *lc = &model->cfg.llama;
    RopeConfig rc = {lc->rope_theta, lc->rope_factor, lc->rope_low_freq_factor, lc->rope_high_freq_factor,
                     lc->rope_original_max_pos};
    rope_freqs(c->freqs, (int)T, (int)HS, &rc);
}

void mixtral_kvcache_free(MixtralKVCache *c) {
    free(c->memory);
    memset(c, 0, sizeof *c);
}

const float *mixtral_forward_cached(const MixtralModel *model, MixtralKVCache *c, const int *tokens, int n) {
    const ModelConfig *cfg = &model->cfg.base;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int HS = C / NH, KV = 2 * NKV * HS, QKV = NH * HS + KV;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, pos = c->len;
    const float eps = model->cfg.llama.norm_eps, scale = 1.0f / sqrtf((float)HS);
    if (n < 1 || n > c->max_chunk) llmc_die("mixtral_forward_cached: %d tokens, expected 1..%d", n, c->max_chunk);
    if (pos + n > c->max_len)
        llmc_die("the sequence would reach %d tokens, beyond the model's context of %d (maxT)", pos + n, c->max_len);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) llmc_die("token id %d is outside the vocabulary [0, %d)", tokens[i], V);
        memcpy(c->residual + (size_t)i * C, PARAM(wte, 0) + (size_t)tokens[i] * C, (size_t)C * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        float *kv = c->kv + (size_t)l * c->max_len * KV;
        rmsnorm_forward(c->ln, c->rstd, c->residual, PARAM(ln1w, l), n, C, eps);
        matmul_forward(c->qkv, c->ln, PARAM(qkvw, l), NULL, n, C, QKV);
        rope_forward(c->qkv, c->freqs + (size_t)pos * HS, 1, n, NH, NKV, HS);
        for (int i = 0; i < n; i++)
            memcpy(kv + (size_t)(pos + i) * KV, c->qkv + (size_t)i * QKV + NH * HS, (size_t)KV * sizeof(float));
        for (int i = 0; i < n; i++) {
#pragma omp parallel for schedule(static)
            for (int h = 0; h < NH; h++) {
                const float *k = kv + (size_t)(h / (NH / NKV)) * HS;
                attention_row(c->atty + (size_t)i * C + h * HS, c->att + (size_t)h * (pos + n),
                              c->qkv + (size_t)i * QKV + h * HS, k, k + NKV * HS, (size_t)KV, pos + i, HS, scale);
            }
        }
        matmul_forward(c->proj, c->atty, PARAM(attprojw, l), NULL, n, C, C);
        residual_forward(c->residual, c->proj, c->residual, (size_t)n * C);
        rmsnorm_forward(c->ln, c->rstd, c->residual, PARAM(ln2w, l), n, C, eps);
        moe_forward(model, l, c->ln, n, c->proj, c->probs, c->rexp, c->rw, c->rrow, c->count, c->mx, c->mh, c->ms, c->my);
        residual_forward(c->residual, c->proj, c->residual, (size_t)n * C);
    }
    rmsnorm_forward(c->ln, c->rstd, c->residual, PARAM(lnfw, 0), n, C, eps);
    matmul_forward(c->logits, c->ln, HEAD(PARAM), NULL, n, C, Vp);
    c->len = pos + n;
    return c->logits;
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
