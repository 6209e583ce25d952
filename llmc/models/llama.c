#include "llmc/models/llama.h"

#include "llmc/core/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int llama_ffn_hidden(int C, float ffn_dim_multiplier, int multiple_of) {
    long hidden = 2 * (4L * C) / 3;
    if (ffn_dim_multiplier > 0) hidden = (long)(ffn_dim_multiplier * hidden);
    return (int)((hidden + multiple_of - 1) / multiple_of * multiple_of);
}

/* The released shapes (config.json of each model). */
static const struct {
    const char *name;
    int L, C, NH, NKV, tied;
    float ffn_mult;
    int multiple_of;
    float rope_factor;
} llama_models[] = {
    {"llama3.2-1b", 16, 2048, 32, 8, 1, 1.5f, 256, 32.0f},
    {"llama3.2-3b", 28, 3072, 24, 8, 1, 1.0f, 256, 32.0f},
    {"llama3.1-8b", 32, 4096, 32, 8, 0, 1.3f, 1024, 8.0f},
};

int llama_config_from_name(LlamaConfig *cfg, const char *name) {
    memset(cfg, 0, sizeof *cfg);
    ModelConfig *b = &cfg->base;
    b->vocab_size = b->padded_vocab_size = 128256; /* already a multiple of 128 */
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 500000.0f;
    for (size_t i = 0; i < sizeof llama_models / sizeof llama_models[0]; i++) {
        if (strcmp(name, llama_models[i].name) != 0) continue;
        b->max_seq_len = 131072;
        b->num_layers = llama_models[i].L;
        b->channels = llama_models[i].C;
        b->num_heads = llama_models[i].NH;
        b->num_kv_heads = llama_models[i].NKV;
        b->ffn_hidden = llama_ffn_hidden(b->channels, llama_models[i].ffn_mult, llama_models[i].multiple_of);
        cfg->tied = llama_models[i].tied;
        cfg->rope_factor = llama_models[i].rope_factor;
        cfg->rope_low_freq_factor = 1.0f;
        cfg->rope_high_freq_factor = 4.0f;
        cfg->rope_original_max_pos = 8192;
        cfg->ffn_multiplier = llama_models[i].ffn_mult, cfg->ffn_multiple_of = llama_models[i].multiple_of;
        return 0;
    }
    if (strncmp(name, "llama3:d", 8) != 0 || name[8] < '1' || name[8] > '9') return -1;
    char *end;
    long depth = strtol(name + 8, &end, 10);
    if (*end != '\0' || depth < 1 || depth > 1000) return -1;
    b->max_seq_len = 1024;
    b->num_layers = (int)depth;
    b->channels = (int)depth * 64;
    b->num_heads = (int)depth;
    b->num_kv_heads = 1;
    for (int k = 1; k <= b->num_heads / 4; k++)
        if (b->num_heads % k == 0) b->num_kv_heads = k;
    b->ffn_hidden = llama_ffn_hidden(b->channels, 1.0f, 256);
    cfg->ffn_multiplier = 1.0f, cfg->ffn_multiple_of = 256;
    return 0;
}

const char *llama_config_validate(const LlamaConfig *cfg) {
    static char msg[160];
    const ModelConfig *b = &cfg->base;
    if (b->num_heads < 1 || b->num_kv_heads < 1 || b->channels < 1) return "all dimensions must be positive";
    if (b->num_heads % b->num_kv_heads != 0) {
        snprintf(msg, sizeof msg, "heads %d not divisible by key/value heads %d", b->num_heads, b->num_kv_heads);
        return msg;
    }
    if (b->channels % b->num_heads != 0 || (b->channels / b->num_heads) % 2 != 0) {
        snprintf(msg, sizeof msg, "channels %d / heads %d must be an even head size (RoPE rotates pairs)",
                 b->channels, b->num_heads);
        return msg;
    }
    if (!(cfg->norm_eps > 0) || !(cfg->rope_theta > 1) || !isfinite(cfg->norm_eps) || !isfinite(cfg->rope_theta))
        return "norm eps must be > 0 and rope theta > 1 (both finite)";
    if (!isfinite(cfg->rope_factor) || !isfinite(cfg->rope_low_freq_factor) || !isfinite(cfg->rope_high_freq_factor))
        return "rope scaling factors must be finite";
    if (cfg->rope_factor > 0 && !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor &&
                                  cfg->rope_low_freq_factor > 0 && cfg->rope_original_max_pos > 0))
        return "rope scaling needs 0 < low_freq_factor < high_freq_factor and original_max_pos > 0";
    return model_config_validate(b); /* the shared limits (GPT-2's rule NKV == NH is gpt2_config_validate's) */
}

TENSOR_TABLE_FUNCTIONS_LEVELS(llama, LlamaConfig, LLAMA_SHAPE_NAMES, LLAMA3_PARAMETERS, LLAMA3_NUM_PARAMETERS, LLAMA3_ACTIVATIONS, LLAMA3_NUM_ACTIVATIONS)

void llama_init_parameters(const LlamaConfig *cfg, const TensorSpec specs[LLAMA3_NUM_PARAMETERS], float *params,
                           unsigned long long seed) {
    tensor_table_init(specs, LLAMA3_NUM_PARAMETERS, params, cfg->base.num_layers, seed);
    llama_zero_vocab_padding(cfg, params + specs[LLAMA3_P_wte].offset, params + specs[LLAMA3_P_lm_head].offset);
}

void llama_zero_vocab_padding(const LlamaConfig *cfg, float *wte, float *lm_head) {
    const size_t C = (size_t)cfg->base.channels, V = (size_t)cfg->base.vocab_size;
    const size_t pad = (size_t)cfg->base.padded_vocab_size - V;
    memset(wte + V * C, 0, pad * C * sizeof(float));
    if (!cfg->tied) memset(lm_head + V * C, 0, pad * C * sizeof(float));
}

double llama_flops_per_token(const LlamaConfig *cfg, int T) {
    return model_flops_per_token(llama_parameter_specs(cfg, NULL), &cfg->base, T);
}
