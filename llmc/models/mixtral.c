#include "llmc/models/mixtral.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mixtral_config_from_name(MixtralConfig *cfg, const char *name) {
    if (strncmp(name, "mixtral:d", 9) != 0 || name[9] < '1' || name[9] > '9') return -1;
    char *end;
    long depth = strtol(name + 9, &end, 10), E = 8, K = 2;
    if (*end == '-') { /* -eE-kK */
        if (end[1] != 'e' || end[2] < '1' || end[2] > '9') return -1;
        E = strtol(end + 2, &end, 10);
        if (end[0] != '-' || end[1] != 'k' || end[2] < '1' || end[2] > '9') return -1;
        K = strtol(end + 2, &end, 10);
    }
    if (*end != '\0' || depth < 1 || depth > 1000 || E > MIXTRAL_MAX_EXPERTS || K > MIXTRAL_MAX_EXPERTS) return -1;
    char llama_name[32];
    snprintf(llama_name, sizeof llama_name, "llama3:d%ld", depth);
    memset(cfg, 0, sizeof *cfg);
    if (llama_config_from_name(&cfg->llama, llama_name) != 0) return -1;
    cfg->num_experts = (int)E, cfg->top_k = (int)K;
    cfg->output_router_logits = 1, cfg->aux_coef = 0.02f;
    return 0;
}

const char *mixtral_config_validate(const MixtralConfig *cfg) {
    static char msg[160];
    const char *bad = llama_config_validate(&cfg->llama);
    if (bad) return bad;
    if (cfg->num_experts < 1 || cfg->num_experts > MIXTRAL_MAX_EXPERTS) {
        snprintf(msg, sizeof msg, "experts %d must be in [1, %d]", cfg->num_experts, MIXTRAL_MAX_EXPERTS);
        return msg;
    }
    if (cfg->top_k < 1 || cfg->top_k > cfg->num_experts) {
        snprintf(msg, sizeof msg, "top-k %d must be in [1, experts %d]", cfg->top_k, cfg->num_experts);
        return msg;
    }
    if (cfg->output_router_logits != 0 && cfg->output_router_logits != 1) return "output_router_logits must be 0 or 1";
    if (!isfinite(cfg->aux_coef) || cfg->aux_coef < 0) {
        snprintf(msg, sizeof msg, "router aux loss coefficient %g must be finite and >= 0", (double)cfg->aux_coef);
        return msg;
    }
    return NULL;
}

#define MIXTRAL_SHAPE_NAMES(cfg)                                                      \
    LLAMA_SHAPE_NAMES(&(cfg)->llama);                                                \
    const size_t E = (size_t)(cfg)->num_experts, K = (size_t)(cfg)->top_k;         \
    (void)E, (void)K

TENSOR_TABLE_FUNCTIONS(mixtral, MixtralConfig, MIXTRAL_SHAPE_NAMES, MIXTRAL_PARAMETERS, MIXTRAL_NUM_PARAMETERS, MIXTRAL_ACTIVATIONS, MIXTRAL_NUM_ACTIVATIONS)

void mixtral_init_parameters(const MixtralConfig *cfg, const TensorSpec specs[MIXTRAL_NUM_PARAMETERS], float *params,
                             unsigned long long seed) {
    tensor_table_init(specs, MIXTRAL_NUM_PARAMETERS, params, cfg->base.num_layers, seed);
    llama_zero_vocab_padding(&cfg->llama, params + specs[MIXTRAL_P_wte].offset, params + specs[MIXTRAL_P_lm_head].offset);
}

size_t mixtral_active_parameters(const MixtralConfig *cfg) {
    TensorSpec specs[MIXTRAL_NUM_PARAMETERS];
    size_t total = mixtral_parameter_specs(cfg, specs);
    size_t experts = specs[MIXTRAL_P_expfcw].numel + specs[MIXTRAL_P_expprojw].numel;
    return total - experts + experts / (size_t)cfg->num_experts * (size_t)cfg->top_k;
}

double mixtral_flops_per_token(const MixtralConfig *cfg, int T) {
    return model_flops_per_token(mixtral_active_parameters(cfg), &cfg->base, T);
}

/* ---- expert parallelism (issue 24 item 5): a rank's shard of the table ---- */
static int is_expert_row(int i) { return i == MIXTRAL_P_expfcw || i == MIXTRAL_P_expprojw; }

size_t mixtral_shard_parameter_specs(const MixtralConfig *cfg, int ways, TensorSpec specs[MIXTRAL_NUM_PARAMETERS]) {
    TensorSpec t[MIXTRAL_NUM_PARAMETERS];
    mixtral_parameter_specs(cfg, t);
    for (int i = 0; i < MIXTRAL_NUM_PARAMETERS; i++)
        if (is_expert_row(i)) t[i].numel /= (size_t)ways;
    size_t n = tensor_table_place_params(t, MIXTRAL_NUM_PARAMETERS, (size_t)cfg->base.num_layers);
    if (specs) memcpy(specs, t, sizeof t);
    return n;
}

void mixtral_shard_copy(const MixtralConfig *cfg, int ways, int shard, float *whole, float *local, int to_local,
                        int experts_only) {
    TensorSpec w[MIXTRAL_NUM_PARAMETERS], s[MIXTRAL_NUM_PARAMETERS];
    mixtral_parameter_specs(cfg, w);
    mixtral_shard_parameter_specs(cfg, ways, s);
    const int L = cfg->base.num_layers;
    for (int i = 0; i < MIXTRAL_NUM_PARAMETERS; i++) {
        if (!is_expert_row(i)) {
            if (experts_only) continue;
            if (to_local) memcpy(local + s[i].offset, whole + w[i].offset, w[i].numel * sizeof(float));
            else memcpy(whole + w[i].offset, local + s[i].offset, w[i].numel * sizeof(float));
            continue;
        }
        /* layer l's experts [shard El, +El) of the whole row are the shard's layer l */
        for (int l = 0; l < L; l++) {
            float *a = whole + w[i].offset + (size_t)l * w[i].layer_numel + (size_t)shard * s[i].layer_numel;
            float *b = local + s[i].offset + (size_t)l * s[i].layer_numel;
            if (to_local) memcpy(b, a, s[i].layer_numel * sizeof(float));
            else memcpy(a, b, s[i].layer_numel * sizeof(float));
        }
    }
}
