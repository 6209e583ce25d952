/* mlp.c - the MLP-only test architecture's configuration, tables, init and flops (mlp.h). */
#include "llmc/models/mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mlp_config_from_name(MlpConfig *cfg, const char *name) {
    if (strncmp(name, "mlp:d", 5) != 0 || name[5] < '1' || name[5] > '9') return -1;
    char *end;
    long depth = strtol(name + 5, &end, 10);
    if (*end != '\0' || depth < 1 || depth > 1000) return -1;
    memset(cfg, 0, sizeof *cfg);
    ModelConfig *b = &cfg->base;
    b->max_seq_len = 1024;
    b->vocab_size = 50257;
    b->padded_vocab_size = 50304;
    b->num_layers = (int)depth;
    b->num_heads = b->num_kv_heads = 1;
    b->channels = 64 * (int)depth;
    b->ffn_hidden = 4 * b->channels;
    cfg->norm_eps = 1e-5f;
    return 0;
}

const char *mlp_config_validate(const MlpConfig *cfg) {
    const ModelConfig *b = &cfg->base;
    if (b->num_heads != 1 || b->num_kv_heads != 1) return "an MLP model has no attention heads (NH and NKV must be 1)";
    if (!(cfg->norm_eps > 0)) return "norm eps must be > 0";
    return model_config_validate(b);
}

#define MLP_SHAPE_NAMES(cfg)                                                                    \
    const size_t Vp = (size_t)(cfg)->base.padded_vocab_size, C = (size_t)(cfg)->base.channels, \
                 L = (size_t)(cfg)->base.num_layers, F = (size_t)(cfg)->base.ffn_hidden;       \
    (void)Vp, (void)C, (void)L, (void)F

TENSOR_TABLE_FUNCTIONS(mlp, MlpConfig, MLP_SHAPE_NAMES, MLP_PARAMETERS, MLP_NUM_PARAMETERS, MLP_ACTIVATIONS, MLP_NUM_ACTIVATIONS)

void mlp_init_parameters(const MlpConfig *cfg, float *params, unsigned long long seed) {
    TensorSpec specs[MLP_NUM_PARAMETERS];
    mlp_parameter_specs(cfg, specs);
    tensor_table_init(specs, MLP_NUM_PARAMETERS, params, cfg->base.num_layers, seed);
    const size_t C = (size_t)cfg->base.channels, pad = (size_t)(cfg->base.padded_vocab_size - cfg->base.vocab_size);
    memset(params + specs[MLP_P_wte].offset + (size_t)cfg->base.vocab_size * C, 0, pad * C * sizeof(float));
}

double mlp_flops_per_token(const MlpConfig *cfg, int T) {
    (void)T;
    return 6.0 * (double)mlp_parameter_specs(cfg, NULL);
}
