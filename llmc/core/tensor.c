/* tensor.c - the shared config limits, activation kind names and a table's random init (tensor.h). */
#include "llmc/core/tensor.h"
#include "llmc/core/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *const activation_kind_names[ACT_NUM_KINDS] = {
    "residual stream", "layernorm outputs", "norm stats + losses", "attention (qkv, att, y)",
    "mlp pre-activation", "gelu outputs", "logits / dlogits"};

const char *model_config_validate(const ModelConfig *cfg) {
    static char msg[256];
    if (cfg->max_seq_len < 1 || cfg->vocab_size < 1 || cfg->num_layers < 1 || cfg->num_heads < 1 ||
        cfg->channels < 1 || cfg->num_kv_heads < 1 || cfg->ffn_hidden < 1)
        return "all dimensions must be positive";
    /* explicit limits, far above any real GPT-2/Llama shape, so that every size computed from
     * them (parameters, activations, file bytes) fits in 64 bits and no int product overflows */
    if (cfg->max_seq_len > MODEL_MAX_SEQ_LEN || cfg->vocab_size > MODEL_MAX_VOCAB ||
        cfg->padded_vocab_size > MODEL_MAX_VOCAB || cfg->num_layers > MODEL_MAX_LAYERS ||
        cfg->channels > MODEL_MAX_CHANNELS || cfg->num_heads > cfg->channels ||
        cfg->num_kv_heads > cfg->num_heads || cfg->ffn_hidden > 4 * MODEL_MAX_CHANNELS) {
        snprintf(msg, sizeof msg, "a dimension is out of range (limits: maxT %d, vocab %d, layers %d, channels %d, heads <= channels)",
                 MODEL_MAX_SEQ_LEN, MODEL_MAX_VOCAB, MODEL_MAX_LAYERS, MODEL_MAX_CHANNELS);
        return msg;
    }
    if (cfg->padded_vocab_size < cfg->vocab_size) {
        snprintf(msg, sizeof msg, "padded vocab %d is smaller than vocab %d", cfg->padded_vocab_size,
                 cfg->vocab_size);
        return msg;
    }
    if (cfg->channels % cfg->num_heads != 0) {
        snprintf(msg, sizeof msg, "channels %d not divisible by heads %d", cfg->channels, cfg->num_heads);
        return msg;
    }
    return NULL;
}

void tensor_table_init(const TensorSpec *specs, int n, float *params, int num_layers, unsigned long long seed) {
    const float std = 0.02f, resid_std = 0.02f / sqrtf(2.0f * num_layers);
    enum { CHUNK = 1 << 18 };
    for (int i = 0; i < n; i++) {
        const TensorSpec *s = &specs[i];
        float *p = params + s->offset;
        if (s->init == INIT_ZEROS || s->init == INIT_ONES) {
            for (size_t j = 0; j < s->numel; j++) p[j] = s->init == INIT_ONES ? 1.0f : 0.0f;
            continue;
        }
        float sd = s->init == INIT_NORMAL_RESIDUAL ? resid_std : std;
        long long chunks = (long long)((s->numel + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static)
        for (long long k = 0; k < chunks; k++) {
            Rng rng;
            rng_seed(&rng, splitmix64(seed) ^ splitmix64(((uint64_t)i << 40) + (uint64_t)k));
            size_t j0 = (size_t)k * CHUNK, cnt = s->numel - j0 < CHUNK ? s->numel - j0 : CHUNK;
            rng_normal(&rng, p + j0, cnt, 0.0f, sd);
        }
    }
}

size_t tensor_table_place_params(TensorSpec *t, int n, size_t L) {
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        t[i].layer_numel = t[i].layer_numel ? t[i].numel / L : 0;
        t[i].offset = offset;
        offset += t[i].numel;
    }
    return offset;
}

size_t tensor_table_place_acts(TensorSpec *t, int n, size_t L, int recompute) {
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        t[i].per_layer = recompute < t[i].per_layer;
        if (t[i].per_layer) {
            t[i].layer_numel = t[i].numel;
            t[i].numel *= L;
        }
        t[i].offset = offset;
        offset += t[i].numel;
    }
    return offset;
}

size_t tensor_table_params(TensorSpec *specs, TensorSpec *table, int n, size_t L) {
    size_t total = tensor_table_place_params(table, n, L);
    if (specs) memcpy(specs, table, (size_t)n * sizeof *table);
    return total;
}

size_t tensor_table_acts(TensorSpec *specs, TensorSpec *table, int n, size_t L, int recompute) {
    size_t total = tensor_table_place_acts(table, n, L, recompute);
    if (specs) memcpy(specs, table, (size_t)n * sizeof *table);
    return total;
}

double model_flops_per_token(size_t n, const ModelConfig *cfg, int T) {
    return 6.0 * (double)n + 6.0 * cfg->num_layers * (double)cfg->channels * T;
}

void tensor_table_split(TensorSpec *t, int n, int tp) {
    for (int i = 0; i < n; i++)
        if (t[i].split.kind != TENSOR_SPLIT_NONE) t[i].numel /= (size_t)tp;
}

void tensor_split_copy(const TensorSpec *whole, const TensorSpec *local, int n, int tp, int rank, float *whole_arena,
                       float *local_arena, int to_local) {
    for (int i = 0; i < n; i++) {
        const TensorSpec *w = &whole[i], *s = &local[i];
        float *wp = whole_arena + w->offset, *lp = local_arena + s->offset;
        if (s->split.kind == TENSOR_SPLIT_NONE) {
            if (to_local) memcpy(lp, wp, s->numel * sizeof(float));
            else memcpy(wp, lp, s->numel * sizeof(float));
            continue;
        }
        const size_t wl = w->layer_numel ? w->layer_numel : w->numel, ll = s->layer_numel ? s->layer_numel : s->numel;
        const size_t layers = w->numel / wl, D = s->split.dim, d = D / (size_t)tp;
        const size_t outer = s->split.kind == TENSOR_SPLIT_COL ? (size_t)s->split.groups : wl / D;
        const size_t inner = wl / (outer * D), run = d * inner;
        for (size_t l = 0; l < layers; l++)
            for (size_t o = 0; o < outer; o++) {
                float *a = wp + l * wl + (o * D + (size_t)rank * d) * inner, *b = lp + l * ll + o * run;
                if (to_local) memcpy(b, a, run * sizeof(float));
                else memcpy(a, b, run * sizeof(float));
            }
    }
}
