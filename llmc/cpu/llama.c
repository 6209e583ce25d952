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

void llama_plan(const LlamaConfig *cfg, int B, int T, int training, MemPlan *p) {
    const ModelConfig *c = &cfg->base;
    p->num_parameters = llama_parameter_specs(cfg, NULL);
    p->recompute = 0;
    p->host[MEM_PARAMETERS] = p->num_parameters * sizeof(float);
    TensorSpec act[LLAMA3_NUM_ACTIVATIONS];
    size_t acts = llama_activation_specs(cfg, B, T, act);
    _Static_assert((int)LLAMA3_NUM_ACTIVATIONS <= (int)NUM_ACTIVATION_TENSORS, "MemPlan.act holds the Llama table");
    memset(p->act, 0, sizeof p->act);
    memset(p->act_bytes, 0, sizeof p->act_bytes);
    for (int i = 0; i < LLAMA3_NUM_ACTIVATIONS; i++) p->act[i] = act[i], p->act_bytes[i] = act[i].numel * sizeof(float);
    /* the activation arena plus RoPE's cos/sin table (T, HS) */
    p->host[MEM_ACTIVATIONS] = (acts + (size_t)T * (c->channels / c->num_heads)) * sizeof(float);
    if (!training) return;
    p->host[MEM_GRADIENTS] = p->num_parameters * sizeof(float);
    size_t N = (size_t)B * T, C = (size_t)c->channels, F = (size_t)c->ffn_hidden;
    p->host[MEM_BWD_SCRATCH] = N * (2 * C + llama_scratch_f1(c) + F) * sizeof(float);
    /* the sgemm's own buffer at its largest call over the linear layers (out, in) */
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * (C / c->num_heads);
    const size_t layers[][2] = {{QKV, C}, {C, C}, {2 * F, C}, {C, F}, {(size_t)c->padded_vocab_size, C}};
    p->host[MEM_BLAS_PACKING] = matmul_blas_buffer_bytes(N, layers, 5);
}

void llama_allocate(LlamaModel *model, int B, int T) { llama_allocate_for(model, B, T, 1); }

void llama_allocate_for(LlamaModel *model, int B, int T, int training) {
    const ModelConfig *c = &model->cfg.base;
    if (T > c->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T, c->max_seq_len);
    model->B = B, model->T = T;
    MemPlan plan;
    mem_plan_init(&plan, "CPU");
    llama_plan(&model->cfg, B, T, training, &plan);
    model->num_activations = llama_activation_specs(&model->cfg, B, T, model->act_specs);
    const int HS = c->channels / c->num_heads;
    model->acts_memory = (float *)mem_calloc(MEM_ACTIVATIONS, plan.host[MEM_ACTIVATIONS] / sizeof(float), sizeof(float),
                                             "activations");
    model->freqs = model->acts_memory + model->num_activations;
    RopeConfig rc = {model->cfg.rope_theta, model->cfg.rope_factor, model->cfg.rope_low_freq_factor,
                     model->cfg.rope_high_freq_factor, model->cfg.rope_original_max_pos};
    rope_freqs(model->freqs, T, HS, &rc);
    if (!training) return;
    size_t N = (size_t)B * T, C = (size_t)c->channels;
    model->train.num_scratch = plan.host[MEM_BWD_SCRATCH] / sizeof(float);
    model->train.scratch_memory = (float *)mem_calloc(MEM_BWD_SCRATCH, model->train.num_scratch, sizeof(float), "backward scratch");
    model->train.dresidual = model->train.scratch_memory;
    model->train.dbuf_c = model->train.dresidual + N * C;
    model->train.dbuf_f1 = model->train.dbuf_c + N * C;
    model->train.dbuf_f2 = model->train.dbuf_f1 + N * llama_scratch_f1(c);
    if (model->train.lora) return; /* a frozen base: no gradients */
    model->train.grads_floats = model->num_parameters;
    model->grads_memory = (float *)mem_calloc(MEM_GRADIENTS, model->train.grads_floats, sizeof(float), "gradients");
}

void llama_plan_shard(const LlamaConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    TensorSpec specs[LLAMA3_NUM_PARAMETERS];
    size_t n = llama_parameter_specs(cfg, specs);
    cpu_zero_plan(specs, LLAMA3_NUM_PARAMETERS, n, zero, ranks, rank, p);
}

void llama_shard(LlamaModel *model, int zero, int ranks, int rank, CpuShardHooks hooks) {
    cpu_zero_shard(&model->train.zs, model->param_specs, LLAMA3_NUM_PARAMETERS, model->cfg.base.num_layers,
                   model->num_parameters, zero, ranks, rank, hooks, &model->params_memory, &model->train.params_floats,
                   &model->grads_memory, &model->train.grads_floats);
}

/* Layer l's view of a parameter, gradient or activation, derived from the tables (-z 2/3: in
 * the layer's bucket or the outer bucket, zero.h). */
#define PARAM(name, l)                                                                                   \
    cpu_zero_view(&model->train.zs, model->param_specs, LLAMA3_P_##name, l, model->params_memory,              \
                  model->train.zs.cur_params, model->train.zs.zero == 3 ? model->train.zs.gather_memory : NULL)
#define GRAD(name, l)                                                                                    \
    (model->grads_memory ? cpu_zero_view(&model->train.zs, model->param_specs, LLAMA3_P_##name, l, model->grads_memory,   \
                                         model->train.zs.cur_grads, model->train.zs.zero >= 2 ? model->grads_memory : NULL)   \
                         : NULL)
/* LoRA adapters on a site's output (lora.h), when the model has them */
#define LORA_FWD(site, out, width, inp) \
    if (model->train.lora) lora_forward_site(model->train.lora, LORA_SITE_##site, l, out, width, inp, N)
#define LORA_FWD_N(site, out, width, inp) /* (the decode's n rows) */ \
    if (model->train.lora) lora_forward_site(model->train.lora, LORA_SITE_##site, l, out, width, inp, n)
#define LORA_BWD(site, dinp, dout, width, inp) \
    if (model->train.lora) lora_backward_site(model->train.lora, LORA_SITE_##site, l, dinp, dout, width, inp, N)
#define ACT(name, l) tensor_layer(model->acts_memory, &model->act_specs[LLAMA3_A_##name], l)
#define BLOCK_INPUT(l) ((l) == 0 ? ACT(encoded, 0) : ACT(residual3, (l) - 1))
/* the output head: lm_head, or wte when tied (lm_head then has no elements) */
#define HEAD(which) (model->cfg.tied ? which(wte, 0) : which(lm_head, 0))

float llama_forward(LlamaModel *model, const int *inputs, const int *targets, int B, int T, float dloss) {
    const ModelConfig *cfg = &model->cfg.base;
    if (!model->acts_memory) llmc_die("llama_forward: call llama_allocate first");
    if (T > model->T || (size_t)B * T > (size_t)model->B * model->T)
        llmc_die("llama_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, QKV = (NH + 2 * NKV) * HS;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, N = B * T;
    const float eps = model->cfg.norm_eps;
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
        float *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        float *residual3 = ACT(residual3, l);
        rmsnorm_forward(ln1, ACT(ln1_rstd, l), residual, PARAM(ln1w, l), N, C, eps);
        matmul_forward(qkv, ln1, PARAM(qkvw, l), NULL, N, C, QKV);
        LORA_FWD(QKV, qkv, QKV, ln1); /* before RoPE rotates q and k in place */
        rope_forward(qkv, model->freqs, B, T, NH, NKV, HS);
        attention_forward(atty, ACT(att, l), qkv, B, T, NH, NKV, HS);
        matmul_forward(residual2, atty, PARAM(attprojw, l), NULL, N, C, C);
        LORA_FWD(ATTPROJ, residual2, C, atty);
        residual_forward(residual2, residual2, residual, (size_t)N * C);
        rmsnorm_forward(ln2, ACT(ln2_rstd, l), residual2, PARAM(ln2w, l), N, C, eps);
        matmul_forward(fch, ln2, PARAM(fcw, l), NULL, N, C, 2 * F);
        LORA_FWD(FC, fch, 2 * F, ln2);
        swiglu_forward(fch_swiglu, fch, N, F);
        matmul_forward(residual3, fch_swiglu, PARAM(fcprojw, l), NULL, N, F, C);
        LORA_FWD(FCPROJ, residual3, C, fch_swiglu);
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
    return model->train.mean_loss = sum / N;
}

void llama_backward(LlamaModel *model, const int *inputs, int B, int T) {
    const ModelConfig *cfg = &model->cfg.base;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, QKV = (NH + 2 * NKV) * HS;
    const int Vp = cfg->padded_vocab_size, N = B * T;
    float *dres = model->train.dresidual;
    cpu_zero_backward_begin(&model->train.zs, model->grads_memory);
    /* logits = lnf @ head^T (dlogits already in the logits activation) */
    matmul_backward(model->train.dbuf_c, HEAD(GRAD), NULL, ACT(logits, 0), ACT(lnf, 0), HEAD(PARAM), N, C, Vp);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    rmsnorm_backward(dres, GRAD(lnfw, 0), model->train.dbuf_c, ACT(residual3, L - 1), PARAM(lnfw, 0), ACT(lnf_rstd, 0), N, C);
    for (int l = L - 1; l >= 0; l--) {
        cpu_zero_use_layer(&model->train.zs, l, l - 1);
        cpu_zero_layer_grads(&model->train.zs, model->grads_memory);
        float *residual = BLOCK_INPUT(l), *ln1 = ACT(ln1, l), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        float *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        /* residual3 = residual2 + fch_swiglu @ fcprojw^T */
        float *dfch_swiglu = model->train.dbuf_f2, *dfch = model->train.dbuf_f1;
        matmul_backward(dfch_swiglu, GRAD(fcprojw, l), NULL, dres, fch_swiglu, PARAM(fcprojw, l), N, F, C);
        LORA_BWD(FCPROJ, dfch_swiglu, dres, C, fch_swiglu);
        swiglu_backward(dfch, fch, dfch_swiglu, N, F);
        float *dln2 = model->train.dbuf_c;
        matmul_backward(dln2, GRAD(fcw, l), NULL, dfch, ln2, PARAM(fcw, l), N, C, 2 * F);
        LORA_BWD(FC, dln2, dfch, 2 * F, ln2);
        rmsnorm_backward(dres, GRAD(ln2w, l), dln2, residual2, PARAM(ln2w, l), ACT(ln2_rstd, l), N, C);
        /* residual2 = residual + atty @ attprojw^T */
        float *datty = model->train.dbuf_c;
        matmul_backward(datty, GRAD(attprojw, l), NULL, dres, atty, PARAM(attprojw, l), N, C, C);
        LORA_BWD(ATTPROJ, datty, dres, C, atty);
        /* atty = attention(rope(qkv)): the saved qkv holds the rotated q and k */
        float *dqkv = model->train.dbuf_f1;
        attention_backward(dqkv, datty, qkv, ACT(att, l), B, T, NH, NKV, HS);
        rope_backward(dqkv, model->freqs, B, T, NH, NKV, HS);
        float *dln1 = model->train.dbuf_c;
        matmul_backward(dln1, GRAD(qkvw, l), NULL, dqkv, ln1, PARAM(qkvw, l), N, C, QKV);
        LORA_BWD(QKV, dln1, dqkv, QKV, ln1);
        rmsnorm_backward(dres, GRAD(ln1w, l), dln1, residual, PARAM(ln1w, l), ACT(ln1_rstd, l), N, C);
        cpu_zero_reduce_layer(&model->train.zs, l);
    }
    cpu_zero_end_layers(&model->train.zs);
    if (model->grads_memory) embedding_backward(GRAD(wte, 0), dres, inputs, N, C); /* encoded = wte[inputs] */
    cpu_zero_reduce_outer(&model->train.zs, model->grads_memory);
}

void llama_zero_grad(LlamaModel *model) {
    if (model->train.zs.zero >= 2) return; /* the buckets are cleared as the backward fills them */
    if (model->grads_memory) memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

void llama_free(LlamaModel *model) {
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

void llama_print_memory(const LlamaModel *model, FILE *out) {
    const double MiB = 1048576.0;
    double kinds[ACT_NUM_KINDS] = {0};
    for (int i = 0; i < LLAMA3_NUM_ACTIVATIONS; i++)
        kinds[model->act_specs[i].kind] += model->act_specs[i].numel * sizeof(float);
    fprintf(out, "memory (CPU, fp32, Llama): parameters %zu (%.1f MiB%s), ", model->num_parameters,
            model->train.params_floats * sizeof(float) / MiB, model->train.zs.zero == 3 ? " this shard" : "");
    if (model->train.zs.zero == 3) fprintf(out, "parameters gathered %.1f MiB, ", model->train.zs.gather_floats * sizeof(float) / MiB);
    fprintf(out, "gradients%s %.1f MiB, activations", model->train.zs.zero >= 2 ? " (2 buckets, -z >= 2)" : "",
            model->train.grads_floats * sizeof(float) / MiB);
    for (int k = 0; k < ACT_NUM_KINDS; k++) fprintf(out, "%s %s %.1f MiB", k ? "," : "", activation_kind_names[k], kinds[k] / MiB);
    fprintf(out, ", backward scratch %.1f MiB\n", model->train.num_scratch * sizeof(float) / MiB);
}

/* ---- decode with a key/value cache (./generate) -------------------------------------------- */

void llama_kvcache_init(LlamaKVCache *c, const LlamaModel *model, int max_chunk) {
    const ModelConfig *cfg = &model->cfg.base;
    const size_t C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden, Vp = (size_t)cfg->padded_vocab_size;
    const size_t L = (size_t)cfg->num_layers, T = (size_t)cfg->max_seq_len, NH = (size_t)cfg->num_heads;
    const size_t HS = C / NH, KV = 2 * (size_t)cfg->num_kv_heads * HS, QKV = NH * HS + KV, n = (size_t)max_chunk;
    memset(c, 0, sizeof *c);
    c->max_len = cfg->max_seq_len;
    c->max_chunk = max_chunk;
    size_t sizes[] = {L * T * KV, T * HS, n * C, n * C, n * QKV, n * C, n * C, n * 2 * F, n * F, n * Vp, n, NH * T};
    float **ptrs[] = {&c->kv, &c->freqs, &c->residual, &c->ln, &c->qkv, &c->atty, &c->proj,
                      &c->fch, &c->fch_swiglu, &c->logits, &c->rstd, &c->att};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    c->memory = (float *)mallocCheck(total * sizeof(float), "Llama KV cache");
    float *p = c->memory;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) *ptrs[i] = p, p += sizes[i];
    RopeConfig rc = {model->cfg.rope_theta, model->cfg.rope_factor, model->cfg.rope_low_freq_factor,
                     model->cfg.rope_high_freq_factor, model->cfg.rope_original_max_pos};
    rope_freqs(c->freqs, (int)T, (int)HS, &rc);
}

void llama_kvcache_free(LlamaKVCache *c) {
    free(c->memory);
    memset(c, 0, sizeof *c);
}

const float *llama_forward_cached(const LlamaModel *model, LlamaKVCache *c, const int *tokens, int n) {
    const ModelConfig *cfg = &model->cfg.base;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, KV = 2 * NKV * HS, QKV = NH * HS + KV;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, pos = c->len;
    const float eps = model->cfg.norm_eps, scale = 1.0f / sqrtf((float)HS);
    if (n < 1 || n > c->max_chunk) llmc_die("llama_forward_cached: %d tokens, expected 1..%d", n, c->max_chunk);
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
        LORA_FWD_N(QKV, c->qkv, QKV, c->ln); /* before RoPE */
        /* positions [pos, pos + n): the cos/sin rows from pos on */
        rope_forward(c->qkv, c->freqs + (size_t)pos * HS, 1, n, NH, NKV, HS);
        for (int i = 0; i < n; i++) /* cache this position's keys and values (NKV heads each) */
            memcpy(kv + (size_t)(pos + i) * KV, c->qkv + (size_t)i * QKV + NH * HS, (size_t)KV * sizeof(float));
        for (int i = 0; i < n; i++) {
#pragma omp parallel for schedule(static)
            for (int h = 0; h < NH; h++) { /* query head h reads key/value head h / (NH / NKV) */
                const float *k = kv + (size_t)(h / (NH / NKV)) * HS;
                attention_row(c->atty + (size_t)i * C + h * HS, c->att + (size_t)h * (pos + n),
                              c->qkv + (size_t)i * QKV + h * HS, k, k + NKV * HS, (size_t)KV, pos + i, HS, scale);
            }
        }
        matmul_forward(c->proj, c->atty, PARAM(attprojw, l), NULL, n, C, C);
        LORA_FWD_N(ATTPROJ, c->proj, C, c->atty);
        residual_forward(c->residual, c->proj, c->residual, (size_t)n * C);
        rmsnorm_forward(c->ln, c->rstd, c->residual, PARAM(ln2w, l), n, C, eps);
        matmul_forward(c->fch, c->ln, PARAM(fcw, l), NULL, n, C, 2 * F);
        LORA_FWD_N(FC, c->fch, 2 * F, c->ln);
        swiglu_forward(c->fch_swiglu, c->fch, n, F);
        matmul_forward(c->proj, c->fch_swiglu, PARAM(fcprojw, l), NULL, n, F, C);
        LORA_FWD_N(FCPROJ, c->proj, C, c->fch_swiglu);
        residual_forward(c->residual, c->proj, c->residual, (size_t)n * C);
    }
    rmsnorm_forward(c->ln, c->rstd, c->residual, PARAM(lnfw, 0), n, C, eps);
    matmul_forward(c->logits, c->ln, HEAD(PARAM), NULL, n, C, Vp);
    c->len = pos + n;
    return c->logits;
}

/* ---- the CPU backend's entry (llmc/cpu/arch.h) ------------------------------------------ */
CPU_ARCH_SEQUENCE(llama, LlamaModel, LlamaConfig, LlamaKVCache, LLAMA3_A_logits, LLAMA3_A_losses, "Llama")

static void llama_cpu_describe(const ArchConfig *cfg, char *out, size_t len) {
    const ModelConfig *b = arch_config_cbase(cfg);
    snprintf(out, len, "Llama 3 (NKV %d, F %d), ", b->num_kv_heads, b->ffn_hidden);
}

static void llama_cpu_set_lora(void *m, struct LoraRun *lora) { ((LlamaModel *)m)->train.lora = lora; }

const CpuArch llama3_cpu_arch = {
    .arch = &llama3_arch,
    CPU_ARCH_SEQUENCE_ENTRY(llama, LlamaModel, LlamaKVCache, "Llama"),
    .describe = llama_cpu_describe,
    .lora_family = LORA_FAMILY_LLAMA,
    .set_lora = llama_cpu_set_lora,
};
