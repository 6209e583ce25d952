#include "llmc/cpu/llama.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/arch.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/lora.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/qbase.h"
#include "llmc/cpu/residual.h"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"

void llama_build(LlamaModel *model, const LlamaConfig *cfg) {
    const char *bad = llama_config_validate(cfg);
    if (bad) llmc_die("invalid Llama configuration: %s", bad);
    memset(model, 0, sizeof *model);
    model->cfg = *cfg;
    model->num_parameters = llama_parameter_specs(cfg, model->param_specs);
    model->train.params_floats = model->num_parameters;
    model->params_memory = (float *)mem_calloc(MEM_PARAMETERS, model->train.params_floats, sizeof(float), "parameters");
}

/* backward scratch: dresidual, dbuf_c (N, C each), dbuf_f1 (N, max(2F, QKV)), dbuf_f2 (N, F) */
static size_t llama_scratch_f1(const ModelConfig *c) {
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * (c->channels / c->num_heads);
    return 2 * (size_t)c->ffn_hidden > QKV ? 2 * (size_t)c->ffn_hidden : QKV;
}

void llama_plan(const LlamaConfig *cfg, int B, int T, int recompute, int training, MemPlan *p) {
    const ModelConfig *c = &cfg->base;
    TensorSpec act[LLAMA3_NUM_ACTIVATIONS];
    size_t acts = llama_activation_specs(cfg, B, T, recompute, act);
    p->recompute = recompute;
    /* the activation arena plus RoPE's cos/sin table (T, HS) */
    mem_plan_tables(p, llama_parameter_specs(cfg, NULL), act, LLAMA3_NUM_ACTIVATIONS,
                    acts + (size_t)T * (c->channels / c->num_heads), training);
    if (!training) return;
    size_t N = (size_t)B * T, C = (size_t)c->channels, F = (size_t)c->ffn_hidden;
    p->host[MEM_BWD_SCRATCH] = N * (2 * C + llama_scratch_f1(c) + F) * sizeof(float);
    /* the sgemm's own buffer at its largest call over the linear layers (out, in) */
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * (C / c->num_heads);
    const size_t layers[][2] = {{QKV, C}, {C, C}, {2 * F, C}, {C, F}, {(size_t)c->padded_vocab_size, C}};
    p->host[MEM_BLAS_PACKING] = matmul_blas_buffer_bytes(N, layers, 5);
}

void llama_allocate(LlamaModel *model, int B, int T) { llama_allocate_for(model, B, T, 0, 1); }

void llama_allocate_for(LlamaModel *model, int B, int T, int recompute, int training) {
    const ModelConfig *c = &model->cfg.base;
    if (T > c->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T, c->max_seq_len);
    if (recompute < 0 || recompute > LLAMA_CPU_MAX_RECOMPUTE)
        llmc_die("recompute level -r %d is not available for the CPU Llama (0, 1 or 2)", recompute);
    model->B = B, model->T = T;
    model->train.recompute = training ? recompute : 0;
    MemPlan plan;
    mem_plan_init(&plan, "CPU");
    llama_plan(&model->cfg, B, T, model->train.recompute, training, &plan);
    model->num_activations = llama_activation_specs(&model->cfg, B, T, model->train.recompute, model->act_specs);
    model->acts_memory = (float *)mem_calloc(MEM_ACTIVATIONS, plan.host[MEM_ACTIVATIONS] / sizeof(float), sizeof(float),
                                             "activations");
    model->freqs = model->acts_memory + model->num_activations;
    llama_rope_table(model->freqs, T, &model->cfg);
    if (!training) return;
    size_t N = (size_t)B * T, C = (size_t)c->channels;
    float *next = cpu_training_alloc_scratch(&model->train, &plan, N, C);
    model->train.dbuf_f1 = next;
    model->train.dbuf_f2 = model->train.dbuf_f1 + N * llama_scratch_f1(c);
    if (model->train.lora) return; /* a frozen base: no gradients */
    model->grads_memory = cpu_training_alloc_grads(&model->train, model->num_parameters);
}

void llama_plan_shard(const LlamaConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    TensorSpec specs[LLAMA3_NUM_PARAMETERS];
    size_t n = llama_parameter_specs(cfg, specs);
    cpu_zero_plan(specs, LLAMA3_NUM_PARAMETERS, n, zero, ranks, rank, p);
}

void llama_shard(LlamaModel *model, int zero, int ranks, int rank, CpuShardHooks hooks) {
    cpu_training_shard(&model->train, model->param_specs, LLAMA3_NUM_PARAMETERS, model->cfg.base.num_layers, model->num_parameters, zero,
                       ranks, rank, hooks, &model->params_memory, &model->grads_memory);
}

/* ---- the family's shared pieces (llama.h) ----------------------------------------------- */

void llama_rope_table(float *freqs, int T, const LlamaConfig *cfg) {
    RopeConfig rc = {cfg->rope_theta, cfg->rope_factor, cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                     cfg->rope_original_max_pos};
    rope_freqs(freqs, T, cfg->base.channels / cfg->base.num_heads, &rc);
}

/* a trunk row's layer-l view (-z 2/3: in the layer's bucket or the outer bucket, zero.h) */
#define T_PARAM(name, l) cpu_zero_param_view(&t->train->zs, t->param_specs, LLAMA3_P_##name, l, t->params)
#define T_GRAD(name, l) cpu_zero_grad_view(&t->train->zs, t->param_specs, LLAMA3_P_##name, l, t->grads)
#define T_ACT(name, l) tensor_layer(t->acts, &t->act_specs[LLAMA3_A_##name], l)
/* a head row's */
#define H_PARAM(name) cpu_zero_param_view(&t->train->zs, t->param_specs, t->head_param + LLAMA3_HP_##name, 0, t->params)
#define H_GRAD(name) cpu_zero_grad_view(&t->train->zs, t->param_specs, t->head_param + LLAMA3_HP_##name, 0, t->grads)
#define H_ACT(name, l) tensor_layer(t->acts, &t->act_specs[t->head_act + LLAMA3_HA_##name], l)
/* the output head: lm_head, or wte when tied (lm_head then has no elements) */
#define HEAD(which) (t->cfg->tied ? which##_WTE : which(lm_head))
#define H_PARAM_WTE T_PARAM(wte, 0)
#define H_GRAD_WTE T_GRAD(wte, 0)
/* LoRA adapters on a site's output (lora.h), when the model has them */
#define LORA_FWD(site, out, width, inp, rows) \
    if (t->train->lora) lora_forward_site(t->train->lora, LORA_SITE_##site, l, out, width, inp, rows)
#define LORA_BWD(site, dinp, dout, width, inp) \
    if (t->train->lora) lora_backward_site(t->train->lora, LORA_SITE_##site, l, dinp, dout, width, inp, N)
/* the shape names of the family's config */
#define TRUNK_SHAPE(c)                                                                                     \
    const int C = (c)->channels, NH = (c)->num_heads, NKV = (c)->num_kv_heads, HS = C / NH;              \
    const int QKV = (NH + 2 * NKV) * HS;                                                                 \
    (void)QKV

void llama_trunk_embed(const LlamaTrunk *t, const int *inputs, const int *targets, int N) {
    const int C = t->cfg->base.channels, V = t->cfg->base.vocab_size;
    const float *wte = T_PARAM(wte, 0);
    float *encoded = T_ACT(encoded, 0);
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            llmc_die("token id at position %d is outside the vocabulary [0, %d)", i, V);
        memcpy(encoded + (size_t)i * C, wte + (size_t)inputs[i] * C, (size_t)C * sizeof(float));
    }
}

void llama_trunk_forward(const LlamaTrunk *t, int l, const float *x, int B, int T) {
    TRUNK_SHAPE(&t->cfg->base);
    const int N = B * T;
    const float eps = t->cfg->norm_eps;
    float *ln1 = T_ACT(ln1, l), *qkv = T_ACT(qkv, l), *atty = T_ACT(atty, l), *residual2 = T_ACT(residual2, l);
    rmsnorm_forward(ln1, T_ACT(ln1_rstd, l), x, T_PARAM(ln1w, l), N, C, eps);
    cpu_site_matmul_forward(t->train, LORA_SITE_QKV, l, qkv, ln1, T_PARAM(qkvw, l), NULL, N, C, QKV);
    LORA_FWD(QKV, qkv, QKV, ln1, N); /* before RoPE rotates q and k in place */
    rope_forward(qkv, t->freqs, B, T, NH, NKV, HS);
    attention_forward(atty, T_ACT(att, l), qkv, B, T, NH, NKV, HS);
    cpu_site_matmul_forward(t->train, LORA_SITE_ATTPROJ, l, residual2, atty, T_PARAM(attprojw, l), NULL, N, C, C);
    LORA_FWD(ATTPROJ, residual2, C, atty, N);
    residual_forward(residual2, residual2, x, (size_t)N * C);
    rmsnorm_forward(T_ACT(ln2, l), T_ACT(ln2_rstd, l), residual2, T_PARAM(ln2w, l), N, C, eps);
}

void llama_trunk_backward(const LlamaTrunk *t, int l, const float *x, int B, int T, float *dres, float *dbuf_c,
                          float *dbuf_f1) {
    TRUNK_SHAPE(&t->cfg->base);
    const int N = B * T;
    float *ln1 = T_ACT(ln1, l), *qkv = T_ACT(qkv, l), *atty = T_ACT(atty, l);
    if (t->train->recompute >= 2) rmsnorm_recompute(ln1, x, T_ACT(ln1_rstd, l), T_PARAM(ln1w, l), N, C);
    /* ln2 = rmsnorm(residual2) */
    rmsnorm_backward(dres, T_GRAD(ln2w, l), dbuf_c, T_ACT(residual2, l), T_PARAM(ln2w, l), T_ACT(ln2_rstd, l), N, C);
    /* residual2 = x + atty @ attprojw^T */
    float *datty = dbuf_c;
    cpu_site_matmul_backward(t->train, LORA_SITE_ATTPROJ, l, datty, T_GRAD(attprojw, l), NULL, dres, atty, T_PARAM(attprojw, l), N, C, C);
    LORA_BWD(ATTPROJ, datty, dres, C, atty);
    /* atty = attention(rope(qkv)): the saved qkv holds the rotated q and k */
    float *dqkv = dbuf_f1;
    attention_backward(dqkv, datty, qkv, T_ACT(att, l), B, T, NH, NKV, HS);
    rope_backward(dqkv, t->freqs, B, T, NH, NKV, HS);
    float *dln1 = dbuf_c;
    cpu_site_matmul_backward(t->train, LORA_SITE_QKV, l, dln1, T_GRAD(qkvw, l), NULL, dqkv, ln1, T_PARAM(qkvw, l), N, C, QKV);
    LORA_BWD(QKV, dln1, dqkv, QKV, ln1);
    rmsnorm_backward(dres, T_GRAD(ln1w, l), dln1, x, T_PARAM(ln1w, l), T_ACT(ln1_rstd, l), N, C);
}

float llama_head_forward(const LlamaTrunk *t, const int *targets, float dloss, int N) {
    const ModelConfig *c = &t->cfg->base;
    const int C = c->channels, L = c->num_layers, V = c->vocab_size, Vp = c->padded_vocab_size;
    float *lnf = H_ACT(lnf, 0), *logits = H_ACT(logits, 0);
    rmsnorm_forward(lnf, H_ACT(lnf_rstd, 0), H_ACT(residual3, L - 1), H_PARAM(lnfw), N, C, t->cfg->norm_eps);
    matmul_forward(logits, lnf, HEAD(H_PARAM), NULL, N, C, Vp);
    if (!targets) return 0.0f;
    float *losses = H_ACT(losses, 0);
    fused_classifier(logits, losses, targets, dloss, N, V, Vp, dloss != 0.0f);
    float sum = 0.0f;
    for (int i = 0; i < N; i++) sum += losses[i];
    return sum / N;
}

void llama_head_backward(const LlamaTrunk *t, int N, float *dres, float *dbuf_c) {
    const ModelConfig *c = &t->cfg->base;
    const int C = c->channels, L = c->num_layers, Vp = c->padded_vocab_size;
    /* logits = lnf @ head^T (dlogits already in the logits activation) */
    matmul_backward(dbuf_c, HEAD(H_GRAD), NULL, H_ACT(logits, 0), H_ACT(lnf, 0), HEAD(H_PARAM), N, C, Vp);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    rmsnorm_backward(dres, H_GRAD(lnfw), dbuf_c, H_ACT(residual3, L - 1), H_PARAM(lnfw), H_ACT(lnf_rstd, 0), N, C);
}

size_t llama_decode_layout(LlamaDecode *d, const LlamaConfig *cfg, int max_chunk, float *memory) {
    const ModelConfig *c = &cfg->base;
    const size_t C = (size_t)c->channels, Vp = (size_t)c->padded_vocab_size;
    const size_t L = (size_t)c->num_layers, T = (size_t)c->max_seq_len, NH = (size_t)c->num_heads;
    const size_t HS = C / NH, KV = 2 * (size_t)c->num_kv_heads * HS, QKV = NH * HS + KV, n = (size_t)max_chunk;
    const size_t sizes[] = {L * T * KV, T * HS, n * C, n * C, n * QKV, n * C, n * C, n * Vp, n, NH * T};
    float **ptrs[] = {&d->kv, &d->freqs, &d->residual, &d->ln, &d->qkv, &d->atty, &d->proj, &d->logits, &d->rstd,
                      &d->att};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof ptrs / sizeof ptrs[0], "one size per buffer");
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (memory) *ptrs[i] = memory + total;
        total += sizes[i];
    }
    if (!memory) return total;
    d->len = 0, d->max_len = c->max_seq_len, d->max_chunk = max_chunk;
    llama_rope_table(d->freqs, (int)T, cfg);
    return total;
}

void llama_decode_embed(const LlamaTrunk *t, LlamaDecode *d, const int *tokens, int n, const char *who) {
    const int C = t->cfg->base.channels, V = t->cfg->base.vocab_size;
    if (n < 1 || n > d->max_chunk) llmc_die("%s: %d tokens, expected 1..%d", who, n, d->max_chunk);
    if (d->len + n > d->max_len)
        llmc_die("the sequence would reach %d tokens, beyond the model's context of %d (maxT)", d->len + n, d->max_len);
    const float *wte = T_PARAM(wte, 0);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) llmc_die("token id %d is outside the vocabulary [0, %d)", tokens[i], V);
        memcpy(d->residual + (size_t)i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(float));
    }
}

void llama_decode_attention(const LlamaTrunk *t, LlamaDecode *d, int l, int n) {
    TRUNK_SHAPE(&t->cfg->base);
    const int KV = 2 * NKV * HS, pos = d->len;
    const float eps = t->cfg->norm_eps, scale = 1.0f / sqrtf((float)HS);
    float *kv = d->kv + (size_t)l * d->max_len * KV;
    rmsnorm_forward(d->ln, d->rstd, d->residual, T_PARAM(ln1w, l), n, C, eps);
    cpu_site_matmul_forward(t->train, LORA_SITE_QKV, l, d->qkv, d->ln, T_PARAM(qkvw, l), NULL, n, C, QKV);
    LORA_FWD(QKV, d->qkv, QKV, d->ln, n); /* before RoPE */
    /* positions [pos, pos + n): the cos/sin rows from pos on */
    rope_forward(d->qkv, d->freqs + (size_t)pos * HS, 1, n, NH, NKV, HS);
    for (int i = 0; i < n; i++) /* cache this position's keys and values (NKV heads each) */
        memcpy(kv + (size_t)(pos + i) * KV, d->qkv + (size_t)i * QKV + NH * HS, (size_t)KV * sizeof(float));
    for (int i = 0; i < n; i++) {
#pragma omp parallel for schedule(static)
        for (int h = 0; h < NH; h++) { /* query head h reads key/value head h / (NH / NKV) */
            const float *k = kv + (size_t)(h / (NH / NKV)) * HS;
            attention_row(d->atty + (size_t)i * C + h * HS, d->att + (size_t)h * (pos + n),
                          d->qkv + (size_t)i * QKV + h * HS, k, k + NKV * HS, (size_t)KV, pos + i, HS, scale);
        }
    }
    cpu_site_matmul_forward(t->train, LORA_SITE_ATTPROJ, l, d->proj, d->atty, T_PARAM(attprojw, l), NULL, n, C, C);
    LORA_FWD(ATTPROJ, d->proj, C, d->atty, n);
    residual_forward(d->residual, d->proj, d->residual, (size_t)n * C);
    rmsnorm_forward(d->ln, d->rstd, d->residual, T_PARAM(ln2w, l), n, C, eps);
}

const float *llama_decode_head(const LlamaTrunk *t, LlamaDecode *d, int n) {
    const int C = t->cfg->base.channels, Vp = t->cfg->base.padded_vocab_size;
    rmsnorm_forward(d->ln, d->rstd, d->residual, H_PARAM(lnfw), n, C, t->cfg->norm_eps);
    matmul_forward(d->logits, d->ln, HEAD(H_PARAM), NULL, n, C, Vp);
    d->len += n;
    return d->logits;
}

float llama_family_forward(const LlamaTrunk *t, const int *inputs, const int *targets, int B, int T, float dloss) {
    const int L = t->cfg->base.num_layers, N = B * T;
    CpuZero *zs = &t->train->zs;
    cpu_zero_gather_outer(zs);
    cpu_zero_prefetch_layer(zs, 0);
    llama_trunk_embed(t, inputs, targets, N);
    if (t->train->lora) lora_prompt_forward(t->train->lora, T_ACT(encoded, 0), NULL, B, T, t->cfg->base.channels);
    for (int l = 0; l < L; l++) {
        cpu_zero_use_layer(zs, l, l + 1);
        llama_trunk_forward(t, l, l == 0 ? T_ACT(encoded, 0) : H_ACT(residual3, l - 1), B, T);
        t->ffn_forward(t->model, l, B, T);
    }
    cpu_zero_end_layers(zs);
    return llama_head_forward(t, targets, dloss, N);
}

void llama_family_backward(const LlamaTrunk *t, const int *inputs, int B, int T) {
    const int C = t->cfg->base.channels, L = t->cfg->base.num_layers, N = B * T;
    CpuTraining *tr = t->train;
    float *dres = tr->dresidual;
    cpu_zero_backward_begin(&tr->zs, t->grads);
    llama_head_backward(t, N, dres, tr->dbuf_c);
    for (int l = L - 1; l >= 0; l--) {
        cpu_zero_use_layer(&tr->zs, l, l - 1);
        cpu_zero_layer_grads(&tr->zs, t->grads);
        if (tr->recompute >= 2) /* the MLP's input, what the forward did not keep (-r 2) */
            rmsnorm_recompute(T_ACT(ln2, l), T_ACT(residual2, l), T_ACT(ln2_rstd, l), T_PARAM(ln2w, l), N, C);
        t->ffn_backward(t->model, l, B, T);
        llama_trunk_backward(t, l, l == 0 ? T_ACT(encoded, 0) : H_ACT(residual3, l - 1), B, T, dres, tr->dbuf_c,
                             tr->dbuf_f1);
        cpu_zero_reduce_layer(&tr->zs, l);
    }
    cpu_zero_end_layers(&tr->zs);
    if (tr->lora) lora_prompt_backward(tr->lora, dres, B, T, C); /* prompt tuning: the soft tokens' rows */
    if (t->grads) embedding_backward(T_GRAD(wte, 0), dres, inputs, N, C); /* encoded = wte[inputs] */
    cpu_zero_reduce_outer(&tr->zs, t->grads);
}

const float *llama_family_decode(const LlamaTrunk *t, LlamaDecode *d, const int *tokens, int n, const char *who) {
    const int C = t->cfg->base.channels, L = t->cfg->base.num_layers;
    llama_decode_embed(t, d, tokens, n, who);
    for (int l = 0; l < L; l++) {
        llama_decode_attention(t, d, l, n);
        t->ffn_decode(t->model, d, l, n);
        residual_forward(d->residual, d->proj, d->residual, (size_t)n * C);
    }
    return llama_decode_head(t, d, n);
}

#undef HEAD
#undef LORA_FWD
#undef LORA_BWD

/* ---- the Llama's block sequence ---------------------------------------------------------- */

#define PARAM(name, l) cpu_zero_param_view(&model->train.zs, model->param_specs, LLAMA3_P_##name, l, model->params_memory)
#define GRAD(name, l) cpu_zero_grad_view(&model->train.zs, model->param_specs, LLAMA3_P_##name, l, model->grads_memory)
#define ACT(name, l) tensor_layer(model->acts_memory, &model->act_specs[LLAMA3_A_##name], l)
/* LoRA adapters on the MLP's sites (the trunk's are llama_trunk_*'s) */
#define LORA_FWD(site, out, width, inp, rows) \
    if (model->train.lora) lora_forward_site(model->train.lora, LORA_SITE_##site, l, out, width, inp, rows)
#define LORA_BWD(site, dinp, dout, width, inp) \
    if (model->train.lora) lora_backward_site(model->train.lora, LORA_SITE_##site, l, dinp, dout, width, inp, N)

/* residual3 = residual2 + fcprojw(swiglu(fcw(ln2))) */
static void swiglu_ffn_forward(void *m, int l, int B, int T) {
    LlamaModel *model = (LlamaModel *)m;
    const int C = model->cfg.base.channels, F = model->cfg.base.ffn_hidden, N = B * T;
    float *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l), *residual3 = ACT(residual3, l);
    cpu_site_matmul_forward(&model->train, LORA_SITE_FC, l, fch, ln2, PARAM(fcw, l), NULL, N, C, 2 * F);
    LORA_FWD(FC, fch, 2 * F, ln2, N);
    swiglu_forward(fch_swiglu, fch, N, F);
    cpu_site_matmul_forward(&model->train, LORA_SITE_FCPROJ, l, residual3, fch_swiglu, PARAM(fcprojw, l), NULL, N, F, C);
    LORA_FWD(FCPROJ, residual3, C, fch_swiglu, N);
    residual_forward(residual3, residual3, ACT(residual2, l), (size_t)N * C);
}

static void swiglu_ffn_backward(void *m, int l, int B, int T) {
    LlamaModel *model = (LlamaModel *)m;
    const int C = model->cfg.base.channels, F = model->cfg.base.ffn_hidden, N = B * T;
    float *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l), *dres = model->train.dresidual;
    if (model->train.recompute >= 1) swiglu_forward(fch_swiglu, fch, N, F); /* not kept by the forward (-r 1) */
    /* residual3 = residual2 + fch_swiglu @ fcprojw^T */
    float *dfch_swiglu = model->train.dbuf_f2, *dfch = model->train.dbuf_f1;
    cpu_site_matmul_backward(&model->train, LORA_SITE_FCPROJ, l, dfch_swiglu, GRAD(fcprojw, l), NULL, dres, fch_swiglu, PARAM(fcprojw, l), N, F, C);
    LORA_BWD(FCPROJ, dfch_swiglu, dres, C, fch_swiglu);
    swiglu_backward(dfch, fch, dfch_swiglu, N, F);
    /* fch = ln2 @ fcw^T */
    float *dln2 = model->train.dbuf_c;
    cpu_site_matmul_backward(&model->train, LORA_SITE_FC, l, dln2, GRAD(fcw, l), NULL, dfch, ln2, PARAM(fcw, l), N, C, 2 * F);
    LORA_BWD(FC, dln2, dfch, 2 * F, ln2);
}

static void swiglu_ffn_decode(void *m, LlamaDecode *d, int l, int n) {
    LlamaModel *model = (LlamaModel *)m;
    const int C = model->cfg.base.channels, F = model->cfg.base.ffn_hidden;
    LlamaKVCache *c = (LlamaKVCache *)d; /* d is the cache's first member */
    cpu_site_matmul_forward(&model->train, LORA_SITE_FC, l, c->fch, d->ln, PARAM(fcw, l), NULL, n, C, 2 * F);
    LORA_FWD(FC, c->fch, 2 * F, d->ln, n);
    swiglu_forward(c->fch_swiglu, c->fch, n, F);
    cpu_site_matmul_forward(&model->train, LORA_SITE_FCPROJ, l, d->proj, c->fch_swiglu, PARAM(fcprojw, l), NULL, n, F, C);
    LORA_FWD(FCPROJ, d->proj, C, c->fch_swiglu, n);
}

static LlamaTrunk trunk_of(const LlamaModel *model) {
    return (LlamaTrunk){&model->cfg, model->param_specs, model->act_specs, model->params_memory, model->grads_memory,
                        model->acts_memory, model->freqs, (CpuTraining *)&model->train, LLAMA3_P_lnfw,
                        LLAMA3_A_residual3, (void *)model, swiglu_ffn_forward, swiglu_ffn_backward, swiglu_ffn_decode};
}

float llama_forward(LlamaModel *model, const int *inputs, const int *targets, int B, int T, float dloss) {
    if (!model->acts_memory) llmc_die("llama_forward: call llama_allocate first");
    if (T > model->T || (size_t)B * T > (size_t)model->B * model->T)
        llmc_die("llama_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    const LlamaTrunk t = trunk_of(model);
    return model->train.mean_loss = llama_family_forward(&t, inputs, targets, B, T, dloss);
}

void llama_backward(LlamaModel *model, const int *inputs, int B, int T) {
    const LlamaTrunk t = trunk_of(model);
    llama_family_backward(&t, inputs, B, T);
}

void llama_zero_grad(LlamaModel *model) {
    if (model->train.zs.zero >= 2) return; /* the buckets are cleared as the backward fills them */
    if (model->grads_memory) memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

void llama_free(LlamaModel *model) {
    const ModelConfig *c = &model->cfg.base;
    cpu_training_free(&model->train, model->params_memory, model->grads_memory, model->acts_memory,
                      model->num_activations + (size_t)model->T * (c->channels / c->num_heads));
    memset(model, 0, sizeof *model);
}

void llama_print_memory(const LlamaModel *model, FILE *out) {
    cpu_training_print_memory(out, "Llama", model->num_parameters, "", model->act_specs, LLAMA3_NUM_ACTIVATIONS,
                              &model->train, model->grads_memory != NULL);
}

/* ---- decode with a key/value cache (./generate) -------------------------------------------- */

void llama_kvcache_init(LlamaKVCache *c, const LlamaModel *model, int max_chunk) {
    const size_t F = (size_t)model->cfg.base.ffn_hidden, n = (size_t)max_chunk;
    memset(c, 0, sizeof *c);
    const size_t shared = llama_decode_layout(&c->d, &model->cfg, max_chunk, NULL);
    c->memory = (float *)mallocCheck((shared + n * 2 * F + n * F) * sizeof(float), "Llama KV cache");
    llama_decode_layout(&c->d, &model->cfg, max_chunk, c->memory);
    c->fch = c->memory + shared;
    c->fch_swiglu = c->fch + n * 2 * F;
}

void llama_kvcache_free(LlamaKVCache *c) {
    free(c->memory);
    memset(c, 0, sizeof *c);
}

const float *llama_forward_cached(const LlamaModel *model, LlamaKVCache *c, const int *tokens, int n) {
    const LlamaTrunk t = trunk_of(model);
    return llama_family_decode(&t, &c->d, tokens, n, "llama_forward_cached");
}

/* ---- the CPU backend's entry (llmc/cpu/arch.h) ------------------------------------------ */
CPU_ARCH_SEQUENCE_COMMON(llama, LlamaModel, LlamaConfig, LlamaKVCache, LLAMA3_A_logits, LLAMA3_A_losses)
static void llama_cpu_allocate(void *m, int B, int T, int recompute, int training) {
    llama_allocate_for((LlamaModel *)m, B, T, recompute, training);
}
static void llama_cpu_plan(const ArchConfig *c, int B, int T, int recompute, int training, MemPlan *p) {
    llama_plan(llama_cpu_cfg(c), B, T, recompute, training, p);
}

static void llama_cpu_describe(const ArchConfig *cfg, char *out, size_t len) {
    const ModelConfig *b = arch_config_cbase(cfg);
    snprintf(out, len, "Llama 3 (NKV %d, F %d), ", b->num_kv_heads, b->ffn_hidden);
}

static void llama_cpu_set_lora(void *m, struct LoraRun *lora) { ((LlamaModel *)m)->train.lora = lora; }
static void llama_cpu_set_qbase(void *m, struct QBase *qbase) { ((LlamaModel *)m)->train.qbase = qbase; }

const CpuArch llama3_cpu_arch = {
    .arch = &llama3_arch,
    CPU_ARCH_SEQUENCE_COMMON_ENTRY(llama, LlamaModel, LlamaKVCache),
    .allocate = llama_cpu_allocate,
    .plan = llama_cpu_plan,
    .max_recompute = LLAMA_CPU_MAX_RECOMPUTE, /* no_recompute, fix_recompute: NULL (-r 0-2 run as given) */
    .describe = llama_cpu_describe,
    .lora_family = LORA_FAMILY_LLAMA,
    .set_lora = llama_cpu_set_lora,
    .set_qbase = llama_cpu_set_qbase,
};
