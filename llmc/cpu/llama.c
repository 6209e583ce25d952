#include "llama.h"

#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "attention.h"
#include "classifier.h"
#include "matmul.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"

void llama_build(LlamaModel *model, const LlamaConfig *cfg) {
    const char *bad = llama_config_validate(cfg);
    if (bad) llmc_die("invalid Llama configuration: %s", bad);
    memset(model, 0, sizeof *model);
    model->cfg = *cfg;
    model->num_parameters = llama_parameter_specs(cfg, model->param_specs);
    model->params_memory = (float *)mallocCheck(model->num_parameters * sizeof(float), "parameters");
}

void llama_allocate(LlamaModel *model, int B, int T) {
    const ModelConfig *c = &model->cfg.base;
    if (T > c->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T, c->max_seq_len);
    model->B = B, model->T = T;
    model->num_activations = llama_activation_specs(&model->cfg, B, T, model->act_specs);
    model->acts_memory = (float *)mallocCheck(model->num_activations * sizeof(float), "activations");
    const int HS = c->channels / c->num_heads;
    model->freqs = (float *)mallocCheck((size_t)T * HS * sizeof(float), "RoPE frequencies");
    RopeConfig rc = {model->cfg.rope_theta, model->cfg.rope_factor, model->cfg.rope_low_freq_factor,
                     model->cfg.rope_high_freq_factor, model->cfg.rope_original_max_pos};
    rope_freqs(model->freqs, T, HS, &rc);
    size_t N = (size_t)B * T, C = (size_t)c->channels, F = (size_t)c->ffn_hidden;
    size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * HS, F1 = 2 * F > QKV ? 2 * F : QKV;
    model->scratch_memory = (float *)mallocCheck(N * (2 * C + F1 + F) * sizeof(float), "backward scratch");
    model->dresidual = model->scratch_memory;
    model->dbuf_c = model->dresidual + N * C;
    model->dbuf_f1 = model->dbuf_c + N * C;
    model->dbuf_f2 = model->dbuf_f1 + N * F1;
    model->grads_memory = (float *)callocCheck(model->num_parameters, sizeof(float), "gradients");
}

/* Layer l's view of a parameter, gradient or activation, derived from the tables. */
#define PARAM(name, l) tensor_layer(model->params_memory, &model->param_specs[LLAMA3_P_##name], l)
#define GRAD(name, l) tensor_layer(model->grads_memory, &model->param_specs[LLAMA3_P_##name], l)
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
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            llmc_die("token id at position %d is outside the vocabulary [0, %d)", i, V);
        memcpy(ACT(encoded, 0) + (size_t)i * C, PARAM(wte, 0) + (size_t)inputs[i] * C, (size_t)C * sizeof(float));
    }
    for (int l = 0; l < L; l++) {
        float *residual = BLOCK_INPUT(l), *ln1 = ACT(ln1, l), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        float *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        float *residual3 = ACT(residual3, l);
        rmsnorm_forward(ln1, ACT(ln1_rstd, l), residual, PARAM(ln1w, l), N, C, eps);
        matmul_forward(qkv, ln1, PARAM(qkvw, l), NULL, N, C, QKV);
        rope_forward(qkv, model->freqs, B, T, NH, NKV, HS);
        attention_forward(atty, ACT(att, l), qkv, B, T, NH, NKV, HS);
        matmul_forward(residual2, atty, PARAM(attprojw, l), NULL, N, C, C);
        residual_forward(residual2, residual2, residual, (size_t)N * C);
        rmsnorm_forward(ln2, ACT(ln2_rstd, l), residual2, PARAM(ln2w, l), N, C, eps);
        matmul_forward(fch, ln2, PARAM(fcw, l), NULL, N, C, 2 * F);
        swiglu_forward(fch_swiglu, fch, N, F);
        matmul_forward(residual3, fch_swiglu, PARAM(fcprojw, l), NULL, N, F, C);
        residual_forward(residual3, residual3, residual2, (size_t)N * C);
    }
    rmsnorm_forward(ACT(lnf, 0), ACT(lnf_rstd, 0), ACT(residual3, L - 1), PARAM(lnfw, 0), N, C, eps);
    matmul_forward(ACT(logits, 0), ACT(lnf, 0), HEAD(PARAM), NULL, N, C, Vp);
    if (!targets) return model->mean_loss = 0.0f;
    float *losses = ACT(losses, 0);
    fused_classifier(ACT(logits, 0), losses, targets, dloss, N, V, Vp, dloss != 0.0f);
    float sum = 0.0f;
    for (int i = 0; i < N; i++) sum += losses[i];
    return model->mean_loss = sum / N;
}

void llama_backward(LlamaModel *model, const int *inputs, int B, int T) {
    const ModelConfig *cfg = &model->cfg.base;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, QKV = (NH + 2 * NKV) * HS;
    const int Vp = cfg->padded_vocab_size, N = B * T;
    float *dres = model->dresidual;
    /* logits = lnf @ head^T (dlogits already in the logits activation) */
    matmul_backward(model->dbuf_c, HEAD(GRAD), NULL, ACT(logits, 0), ACT(lnf, 0), HEAD(PARAM), N, C, Vp);
    memset(dres, 0, (size_t)N * C * sizeof(float));
    rmsnorm_backward(dres, GRAD(lnfw, 0), model->dbuf_c, ACT(residual3, L - 1), PARAM(lnfw, 0), ACT(lnf_rstd, 0), N, C);
    for (int l = L - 1; l >= 0; l--) {
        float *residual = BLOCK_INPUT(l), *ln1 = ACT(ln1, l), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        float *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        /* residual3 = residual2 + fch_swiglu @ fcprojw^T */
        float *dfch_swiglu = model->dbuf_f2, *dfch = model->dbuf_f1;
        matmul_backward(dfch_swiglu, GRAD(fcprojw, l), NULL, dres, fch_swiglu, PARAM(fcprojw, l), N, F, C);
        swiglu_backward(dfch, fch, dfch_swiglu, N, F);
        float *dln2 = model->dbuf_c;
        matmul_backward(dln2, GRAD(fcw, l), NULL, dfch, ln2, PARAM(fcw, l), N, C, 2 * F);
        rmsnorm_backward(dres, GRAD(ln2w, l), dln2, residual2, PARAM(ln2w, l), ACT(ln2_rstd, l), N, C);
        /* residual2 = residual + atty @ attprojw^T */
        float *datty = model->dbuf_c;
        matmul_backward(datty, GRAD(attprojw, l), NULL, dres, atty, PARAM(attprojw, l), N, C, C);
        /* atty = attention(rope(qkv)): the saved qkv holds the rotated q and k */
        float *dqkv = model->dbuf_f1;
        attention_backward(dqkv, datty, qkv, ACT(att, l), B, T, NH, NKV, HS);
        rope_backward(dqkv, model->freqs, B, T, NH, NKV, HS);
        float *dln1 = model->dbuf_c;
        matmul_backward(dln1, GRAD(qkvw, l), NULL, dqkv, ln1, PARAM(qkvw, l), N, C, QKV);
        rmsnorm_backward(dres, GRAD(ln1w, l), dln1, residual, PARAM(ln1w, l), ACT(ln1_rstd, l), N, C);
    }
    /* encoded = wte[inputs] */
    float *dwte = GRAD(wte, 0);
    for (int i = 0; i < N; i++) {
        float *row = dwte + (size_t)inputs[i] * C;
        for (int j = 0; j < C; j++) row[j] += dres[(size_t)i * C + j];
    }
}

void llama_free(LlamaModel *model) {
    free(model->params_memory);
    free(model->grads_memory);
    free(model->acts_memory);
    free(model->scratch_memory);
    free(model->freqs);
    memset(model, 0, sizeof *model);
}
