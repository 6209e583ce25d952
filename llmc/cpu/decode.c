#include "llmc/cpu/decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/lora.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/qbase.h"
#include "llmc/cpu/residual.h"

void kvcache_init(KVCache *cache, const GPT2 *model, int max_chunk) {
    const ModelConfig *cfg = &model->cfg;
    const size_t C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden, Vp = (size_t)cfg->padded_vocab_size;
    const size_t L = (size_t)cfg->num_layers, T = (size_t)cfg->max_seq_len, NH = (size_t)cfg->num_heads;
    const size_t n = (size_t)max_chunk;
    memset(cache, 0, sizeof *cache);
    cache->max_len = cfg->max_seq_len;
    cache->max_chunk = max_chunk;
    size_t sizes[] = {L * T * 2 * C, n * C, n * C, n * 3 * C, n * C, n * C, n * F, n * F, n * Vp, n, n, NH * T};
    float **ptrs[] = {&cache->kv, &cache->residual, &cache->ln, &cache->qkv, &cache->atty, &cache->proj,
                      &cache->fch, &cache->fch_gelu, &cache->logits, &cache->mean, &cache->rstd, &cache->att};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    cache->memory = (float *)mallocCheck(total * sizeof(float), "KV cache");
    float *p = cache->memory;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *ptrs[i] = p;
        p += sizes[i];
    }
}

void kvcache_free(KVCache *cache) {
    free(cache->memory);
    memset(cache, 0, sizeof *cache);
}

void kvcache_reset(KVCache *cache) { cache->len = 0; }

/* attention_forward (llmc/cpu/attention.c) for n new query rows at positions [pos, pos + n)
 * over the cached keys and values of layer kv (maxT, 2C) of positions [0, pos + n): the same
 * row arithmetic (attention_row), with the cache's key stride. */
static void attention_forward_cached(float *out, float *att, const float *qkv, const float *kv, int pos, int n,
                                     int C, int NH) {
    const int HS = C / NH;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int i = 0; i < n; i++) {
#pragma omp parallel for schedule(static)
        for (int h = 0; h < NH; h++) {
            const float *k = kv + h * HS;
            attention_row(out + (size_t)i * C + h * HS, att + (size_t)h * (pos + n), qkv + (size_t)i * 3 * C + h * HS, k,
                          k + C, 2 * (size_t)C, pos + i, HS, scale);
        }
    }
}

/* Layer l's view of a parameter, from the tensor table. */
#define PARAM(name, l) tensor_layer(model->params_memory, &model->param_specs[GPT2_P_##name], l)
/* LoRA adapters (unmerged) on a site's output, when the model has them */
#define LORA_FWD(site, out, width, inp) \
    if (model->train.lora) lora_forward_site(model->train.lora, LORA_SITE_##site, l, out, width, inp, n)

const float *gpt2_forward_cached(const GPT2 *model, KVCache *c, const int *tokens, int n) {
    const ModelConfig *cfg = &model->cfg;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, F = cfg->ffn_hidden;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, pos = c->len;
    if (n < 1 || n > c->max_chunk) llmc_die("gpt2_forward_cached: %d tokens, expected 1..%d", n, c->max_chunk);
    if (pos + n > c->max_len)
        llmc_die("the sequence would reach %d tokens, beyond the model's context of %d (maxT)", pos + n, c->max_len);
    const ParameterTensors *p = &model->params;
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) llmc_die("token id %d is outside the vocabulary [0, %d)", tokens[i], V);
        /* encoded = wte[token] + wpe[position] */
        const float *we = p->wte + (size_t)tokens[i] * C, *pe = p->wpe + (size_t)(pos + i) * C;
        float *x = c->residual + (size_t)i * C;
        for (int k = 0; k < C; k++) x[k] = we[k] + pe[k];
    }
    for (int l = 0; l < L; l++) {
        float *kv = c->kv + (size_t)l * c->max_len * 2 * C;
        layernorm_forward(c->ln, c->mean, c->rstd, c->residual, PARAM(ln1w, l), PARAM(ln1b, l), n, C);
        cpu_site_matmul_forward(&model->train, LORA_SITE_QKV, l, c->qkv, c->ln, PARAM(qkvw, l), PARAM(qkvb, l), n, C, 3 * C);
        LORA_FWD(QKV, c->qkv, 3 * C, c->ln);
        for (int i = 0; i < n; i++) /* cache this position's key and value */
            memcpy(kv + (size_t)(pos + i) * 2 * C, c->qkv + (size_t)i * 3 * C + C, 2 * (size_t)C * sizeof(float));
        attention_forward_cached(c->atty, c->att, c->qkv, kv, pos, n, C, NH);
        cpu_site_matmul_forward(&model->train, LORA_SITE_ATTPROJ, l, c->proj, c->atty, PARAM(attprojw, l), PARAM(attprojb, l), n, C, C);
        LORA_FWD(ATTPROJ, c->proj, C, c->atty);
        residual_forward(c->residual, c->proj, c->residual, (size_t)n * C);
        layernorm_forward(c->ln, c->mean, c->rstd, c->residual, PARAM(ln2w, l), PARAM(ln2b, l), n, C);
        cpu_site_matmul_forward(&model->train, LORA_SITE_FC, l, c->fch, c->ln, PARAM(fcw, l), PARAM(fcb, l), n, C, F);
        LORA_FWD(FC, c->fch, F, c->ln);
        gelu_forward(c->fch_gelu, c->fch, (size_t)n * F);
        cpu_site_matmul_forward(&model->train, LORA_SITE_FCPROJ, l, c->proj, c->fch_gelu, PARAM(fcprojw, l), PARAM(fcprojb, l), n, F, C);
        LORA_FWD(FCPROJ, c->proj, C, c->fch_gelu);
        residual_forward(c->residual, c->proj, c->residual, (size_t)n * C);
    }
    layernorm_forward(c->ln, c->mean, c->rstd, c->residual, p->lnfw, p->lnfb, n, C);
    matmul_forward(c->logits, c->ln, p->wte, NULL, n, C, Vp);
    c->len = pos + n;
    return c->logits;
}
