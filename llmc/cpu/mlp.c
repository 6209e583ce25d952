/* mlp.c (CPU) - the MLP test architecture's block sequence: build, plan, forward, backward (mlp.h). */
#include "llmc/cpu/mlp.h"

#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/arch.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/residual.h"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/swiglu.h"

void mlp_build(MlpModel *model, const MlpConfig *cfg) {
    const char *bad = mlp_config_validate(cfg);
    if (bad) llmc_die("invalid MLP configuration: %s", bad);
    memset(model, 0, sizeof *model);
    model->cfg = *cfg;
    model->num_parameters = mlp_parameter_specs(cfg, model->param_specs);
    model->train.params_floats = model->num_parameters;
    model->params_memory = (float *)mem_calloc(MEM_PARAMETERS, model->train.params_floats, sizeof(float), "parameters");
}

/* backward scratch floats per position: dresidual, dbuf_c (C each), dbuf_f1 (2F), dbuf_f2 (F) */
static size_t scratch_per_row(const ModelConfig *c) { return 2 * (size_t)c->channels + 3 * (size_t)c->ffn_hidden; }

void mlp_plan(const MlpConfig *cfg, int B, int T, int training, MemPlan *p) {
    const ModelConfig *c = &cfg->base;
    TensorSpec act[MLP_NUM_ACTIVATIONS];
    size_t acts = mlp_activation_specs(cfg, B, T, act);
    mem_plan_tables(p, mlp_parameter_specs(cfg, NULL), act, MLP_NUM_ACTIVATIONS, acts, training);
    if (!training) return;
    const size_t N = (size_t)B * T;
    p->host[MEM_BWD_SCRATCH] = N * scratch_per_row(c) * sizeof(float);
    /* the sgemm's own buffer at its largest call over the linear layers (out, in) */
    const size_t C = (size_t)c->channels, F = (size_t)c->ffn_hidden;
    const size_t layers[][2] = {{2 * F, C}, {C, F}, {(size_t)c->padded_vocab_size, C}};
    p->host[MEM_BLAS_PACKING] = matmul_blas_buffer_bytes(N, layers, 3);
}

void mlp_allocate(MlpModel *model, int B, int T) { mlp_allocate_for(model, B, T, 1); }

void mlp_allocate_for(MlpModel *model, int B, int T, int training) {
    const ModelConfig *c = &model->cfg.base;
    if (T > c->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T, c->max_seq_len);
    if (model->acts_memory) llmc_die("mlp_allocate_for: the model is already allocated");
    model->B = B, model->T = T;
    MemPlan plan;
    mem_plan_init(&plan, "CPU");
    mlp_plan(&model->cfg, B, T, training, &plan);
    model->num_activations = mlp_activation_specs(&model->cfg, B, T, model->act_specs);
    model->acts_memory = (float *)mem_calloc(MEM_ACTIVATIONS, model->num_activations, sizeof(float), "activations");
    if (!training) return;
    const size_t N = (size_t)B * T, C = (size_t)c->channels, F = (size_t)c->ffn_hidden;
    float *next = cpu_training_alloc_scratch(&model->train, &plan, N, C);
    model->train.dbuf_f1 = next;
    model->train.dbuf_f2 = model->train.dbuf_f1 + N * 2 * F;
    model->grads_memory = cpu_training_alloc_grads(&model->train, model->num_parameters);
}

void mlp_plan_shard(const MlpConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    TensorSpec specs[MLP_NUM_PARAMETERS];
    size_t n = mlp_parameter_specs(cfg, specs);
    cpu_zero_plan(specs, MLP_NUM_PARAMETERS, n, zero, ranks, rank, p);
}

void mlp_shard(MlpModel *model, int zero, int ranks, int rank, CpuShardHooks hooks) {
    if (!model->grads_memory) llmc_die("mlp_shard: allocate the model for training first");
    cpu_training_shard(&model->train, model->param_specs, MLP_NUM_PARAMETERS, model->cfg.base.num_layers,
                       model->num_parameters, zero, ranks, rank, hooks, &model->params_memory, &model->grads_memory);
}

/* Layer l's view of a parameter, gradient or activation, from the tables (-z 2/3: in the
 * layer's bucket or the outer bucket, zero.h). */
#define PARAM(name, l)                                                                                 \
    cpu_zero_view(&model->train.zs, model->param_specs, MLP_P_##name, l, model->params_memory, model->train.zs.cur_params, \
                  model->train.zs.zero == 3 ? model->train.zs.gather_memory : NULL)
#define GRAD(name, l)                                                                                  \
    cpu_zero_view(&model->train.zs, model->param_specs, MLP_P_##name, l, model->grads_memory, model->train.zs.cur_grads, \
                  model->train.zs.zero >= 2 ? model->grads_memory : NULL)
/* (ACT: in the activations `acts` laid out by `aspecs`, the model's own or a decode cache's) */
#define ACT(name, l) tensor_layer(acts, &aspecs[MLP_A_##name], l)
#define BLOCK_INPUT(l) ((l) == 0 ? ACT(encoded, 0) : ACT(residual, (l) - 1))

/* The trunk over N positions into the activations acts (laid out by aspecs): the embedding, the
 * blocks, the final norm and the logits. zs: the ZeRO hooks to run (NULL: none, the decode's). */
static void forward_trunk(const MlpModel *model, CpuZero *zs, float *acts, const TensorSpec *aspecs, const int *inputs,
                          const int *targets, int N) {
    const ModelConfig *cfg = &model->cfg.base;
    const int C = cfg->channels, L = cfg->num_layers, F = cfg->ffn_hidden, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    const float eps = model->cfg.norm_eps;
    if (zs) cpu_zero_gather_outer(zs), cpu_zero_prefetch_layer(zs, 0);
    for (int i = 0; i < N; i++) { /* encoded = wte[inputs] (no positions) */
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            llmc_die("token id at position %d is outside the vocabulary [0, %d)", i, V);
        memcpy(ACT(encoded, 0) + (size_t)i * C, PARAM(wte, 0) + (size_t)inputs[i] * C, (size_t)C * sizeof(float));
    }
    for (int l = 0; l < L; l++) { /* residual_l = input + swiglu(ln @ fcw^T) @ fcprojw^T */
        if (zs) cpu_zero_use_layer(zs, l, l + 1);
        float *input = BLOCK_INPUT(l), *ln = ACT(ln, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        float *out = ACT(residual, l);
        rmsnorm_forward(ln, ACT(ln_rstd, l), input, PARAM(lnw, l), N, C, eps);
        matmul_forward(fch, ln, PARAM(fcw, l), NULL, N, C, 2 * F);
        swiglu_forward(fch_swiglu, fch, N, F);
        matmul_forward(out, fch_swiglu, PARAM(fcprojw, l), NULL, N, F, C);
        residual_forward(out, out, input, (size_t)N * C);
    }
    if (zs) cpu_zero_end_layers(zs);
    rmsnorm_forward(ACT(lnf, 0), ACT(lnf_rstd, 0), ACT(residual, L - 1), PARAM(lnfw, 0), N, C, eps);
    matmul_forward(ACT(logits, 0), ACT(lnf, 0), PARAM(wte, 0), NULL, N, C, Vp);
}

float mlp_forward(MlpModel *model, const int *inputs, const int *targets, int B, int T, float dloss) {
    const ModelConfig *cfg = &model->cfg.base;
    if (!model->acts_memory) llmc_die("mlp_forward: call mlp_allocate first");
    if (T > model->T || (size_t)B * T > (size_t)model->B * model->T)
        llmc_die("mlp_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    const int N = B * T;
    float *acts = model->acts_memory;
    const TensorSpec *aspecs = model->act_specs;
    forward_trunk(model, &model->train.zs, acts, aspecs, inputs, targets, N);
    if (!targets) return model->train.mean_loss = 0.0f;
    float *losses = ACT(losses, 0);
    fused_classifier(ACT(logits, 0), losses, targets, dloss, N, cfg->vocab_size, cfg->padded_vocab_size, dloss != 0.0f);
    float sum = 0.0f;
    for (int i = 0; i < N; i++) sum += losses[i];
    return model->train.mean_loss = sum / N;
}

void mlp_backward(MlpModel *model, const int *inputs, int B, int T) {
    const ModelConfig *cfg = &model->cfg.base;
    if (!model->grads_memory) llmc_die("mlp_backward: the model was allocated without training buffers");
    const int C = cfg->channels, L = cfg->num_layers, F = cfg->ffn_hidden, Vp = cfg->padded_vocab_size, N = B * T;
    float *dres = model->train.dresidual, *acts = model->acts_memory;
    const TensorSpec *aspecs = model->act_specs;
    cpu_zero_backward_begin(&model->train.zs, model->grads_memory);
    /* logits = lnf @ wte^T (dlogits already in the logits activation) */
    matmul_backward(model->train.dbuf_c, GRAD(wte, 0), NULL, ACT(logits, 0), ACT(lnf, 0), PARAM(wte, 0), N, C, Vp);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    rmsnorm_backward(dres, GRAD(lnfw, 0), model->train.dbuf_c, ACT(residual, L - 1), PARAM(lnfw, 0), ACT(lnf_rstd, 0), N, C);
    for (int l = L - 1; l >= 0; l--) { /* dres: the gradient of residual_l, and (identity) of its input */
        cpu_zero_use_layer(&model->train.zs, l, l - 1);
        cpu_zero_layer_grads(&model->train.zs, model->grads_memory);
        float *input = BLOCK_INPUT(l), *ln = ACT(ln, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        float *dfch_swiglu = model->train.dbuf_f2, *dfch = model->train.dbuf_f1, *dln = model->train.dbuf_c;
        matmul_backward(dfch_swiglu, GRAD(fcprojw, l), NULL, dres, fch_swiglu, PARAM(fcprojw, l), N, F, C);
        swiglu_backward(dfch, fch, dfch_swiglu, N, F);
        matmul_backward(dln, GRAD(fcw, l), NULL, dfch, ln, PARAM(fcw, l), N, C, 2 * F);
        rmsnorm_backward(dres, GRAD(lnw, l), dln, input, PARAM(lnw, l), ACT(ln_rstd, l), N, C);
        cpu_zero_reduce_layer(&model->train.zs, l);
    }
    cpu_zero_end_layers(&model->train.zs);
    embedding_backward(GRAD(wte, 0), dres, inputs, N, C); /* encoded = wte[inputs] */
    cpu_zero_reduce_outer(&model->train.zs, model->grads_memory);
}

void mlp_zero_grad(MlpModel *model) {
    if (model->train.zs.zero >= 2) return; /* the buckets are cleared as the backward fills them */
    if (model->grads_memory) memset(model->grads_memory, 0, model->num_parameters * sizeof(float));
}

void mlp_free(MlpModel *model) {
    cpu_training_free(&model->train, model->params_memory, model->grads_memory, model->acts_memory,
                      model->num_activations);
    memset(model, 0, sizeof *model);
}

void mlp_print_memory(const MlpModel *model, FILE *out) {
    cpu_training_print_memory(out, "MLP", model->num_parameters, "", model->act_specs, MLP_NUM_ACTIVATIONS,
                              &model->train, model->grads_memory != NULL);
}

/* ---- decode (./generate): no keys or values to keep, only the position count --------------- */

void mlp_kvcache_init(MlpKVCache *c, const MlpModel *model, int max_chunk) {
    memset(c, 0, sizeof *c);
    c->max_len = model->cfg.base.max_seq_len;
    c->max_chunk = max_chunk;
    const size_t n = mlp_activation_specs(&model->cfg, 1, max_chunk, c->act_specs);
    c->acts = (float *)callocCheck(n, sizeof(float), "MLP decode activations");
}

void mlp_kvcache_free(MlpKVCache *c) {
    free(c->acts);
    memset(c, 0, sizeof *c);
}

const float *mlp_forward_cached(const MlpModel *model, MlpKVCache *c, const int *tokens, int n) {
    if (n < 1 || n > c->max_chunk) llmc_die("mlp_forward_cached: %d tokens, expected 1..%d", n, c->max_chunk);
    if (c->len + n > c->max_len)
        llmc_die("the sequence would reach %d tokens, beyond the model's context of %d (maxT)", c->len + n, c->max_len);
    float *acts = c->acts;
    const TensorSpec *aspecs = c->act_specs;
    forward_trunk(model, NULL, acts, aspecs, tokens, NULL, n);
    c->len += n;
    return ACT(logits, 0);
}

/* ---- the CPU backend's entry (llmc/cpu/arch.h) ------------------------------------------ */
CPU_ARCH_SEQUENCE(mlp, MlpModel, MlpConfig, MlpKVCache, MLP_A_logits, MLP_A_losses, "MLP")

static void mlp_cpu_describe(const ArchConfig *cfg, char *out, size_t len) {
    snprintf(out, len, "MLP (F %d), ", arch_config_cbase(cfg)->ffn_hidden);
}

const CpuArch mlp_cpu_arch = {
    .arch = &mlp_arch,
    CPU_ARCH_SEQUENCE_ENTRY(mlp, MlpModel, MlpKVCache, "MLP"),
    .describe = mlp_cpu_describe,
};
