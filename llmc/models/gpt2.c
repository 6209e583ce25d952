#include "llmc/models/gpt2.h"
#include "llmc/core/check.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


const char *gpt2_config_validate(const ModelConfig *cfg) {
    const char *bad = model_config_validate(cfg);
    if (bad) return bad;
    if (cfg->num_kv_heads != cfg->num_heads) return "grouped KV heads are not supported by GPT-2 blocks";
    return NULL;
}

/* llm.c's GPT-3 descriptors "gpt3:cC": GPT-2 blocks in GPT-3's published shapes (by channels:
 * depth and head size), maxT 2048. Returns 0, -1 when desc is not one; dies on an unknown C. */
static int gpt3_config_from_descriptor(ModelConfig *cfg, const char *desc) {
    static const int shapes[][3] = {{384, 6, 64},   {768, 12, 64},   {1024, 24, 64},  {1536, 24, 96},  {2048, 24, 128},
                                    {2560, 32, 80}, {4096, 32, 128}, {5140, 40, 128}, {12288, 96, 128}};
    if (strncmp(desc, "gpt3:c", 6) != 0) return -1;
    char *end;
    long c = strtol(desc + 6, &end, 10);
    for (size_t i = 0; *end == '\0' && i < sizeof shapes / sizeof shapes[0]; i++)
        if (shapes[i][0] == c) {
            memset(cfg, 0, sizeof *cfg);
            cfg->max_seq_len = 2048;
            cfg->vocab_size = 50257;
            cfg->padded_vocab_size = 50304;
            cfg->num_layers = shapes[i][1];
            cfg->channels = (int)c;
            cfg->num_heads = (int)c / shapes[i][2];
            cfg->num_kv_heads = cfg->num_heads;
            cfg->ffn_hidden = 4 * cfg->channels;
            return 0;
        }
    llmc_die("-e %s: llm.c's GPT-3 descriptors are gpt3:c384, c768, c1024, c1536, c2048, c2560, c4096, c5140 and "
             "c12288 (the channels of GPT-3's shapes)", desc);
}

int model_config_from_descriptor(ModelConfig *cfg, const char *desc) {
    if (gpt3_config_from_descriptor(cfg, desc) == 0) return 0;
    if (strncmp(desc, "gpt2:", 5) == 0) desc += 5;
    if (desc[0] != 'd' || desc[1] < '1' || desc[1] > '9') return -1;
    char *end;
    long depth = strtol(desc + 1, &end, 10);
    if (*end != '\0' || depth < 1 || depth > 1000) return -1;
    memset(cfg, 0, sizeof *cfg);
    cfg->max_seq_len = 1024;
    cfg->vocab_size = 50257;
    cfg->padded_vocab_size = 50304;
    cfg->num_layers = (int)depth;
    /* GPT-2's published shapes; any other depth keeps d12's aspect: 64 channels and one
     * 64-wide head per layer */
    static const int known[][3] = {{12, 768, 12}, {24, 1024, 16}, {36, 1280, 20}, {48, 1600, 25}};
    cfg->channels = (int)depth * 64;
    cfg->num_heads = (int)depth;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (known[i][0] == depth) cfg->channels = known[i][1], cfg->num_heads = known[i][2];
    cfg->num_kv_heads = cfg->num_heads;
    cfg->ffn_hidden = 4 * cfg->channels;
    return 0;
}


/* Local names the table's expressions refer to. */
#define LLMC_SHAPE_NAMES(cfg)                                                          \
    const size_t Vp = (size_t)(cfg)->padded_vocab_size, C = (size_t)(cfg)->channels,   \
                 L = (size_t)(cfg)->num_layers, maxT = (size_t)(cfg)->max_seq_len,     \
                 F = (size_t)(cfg)->ffn_hidden, NH = (size_t)(cfg)->num_heads,         \
                 QKV = ((size_t)(cfg)->num_heads + 2 * (size_t)(cfg)->num_kv_heads) *  \
                       ((size_t)(cfg)->channels / (size_t)(cfg)->num_heads);           \
    (void)Vp, (void)C, (void)L, (void)maxT, (void)F, (void)NH, (void)QKV

size_t gpt2_parameter_specs(const ModelConfig *cfg, TensorSpec specs[NUM_PARAMETER_TENSORS]) {
    return gpt2_parameter_specs_tp(cfg, 1, specs);
}

size_t gpt2_parameter_specs_tp(const ModelConfig *cfg, int tp, TensorSpec specs[NUM_PARAMETER_TENSORS]) {
    LLMC_SHAPE_NAMES(cfg);
    TensorSpec table[] = {GPT2_PARAMETERS(TENSOR_PARAM_SPLIT_ROW)};
    tensor_table_split(table, NUM_PARAMETER_TENSORS, tp);
    return tensor_table_params(specs, table, NUM_PARAMETER_TENSORS, L);
}

const char *gpt2_tp_validate(const ModelConfig *cfg, int tp) {
    static char msg[256];
    if (cfg->num_heads % tp != 0)
        snprintf(msg, sizeof msg, "the model's %d attention heads (NH) do not divide by -tp %d (each rank holds NH/tp heads)",
                 cfg->num_heads, tp);
    else if (cfg->ffn_hidden % tp != 0)
        snprintf(msg, sizeof msg, "the model's MLP width %d (4*C) does not divide by -tp %d (each rank holds F/tp columns)",
                 cfg->ffn_hidden, tp);
    else if (cfg->padded_vocab_size % tp != 0)
        snprintf(msg, sizeof msg, "the model's padded vocabulary Vp %d does not divide by -tp %d (each rank holds Vp/tp "
                 "rows of wte and of the LM head's logits; pad the vocabulary to a multiple of %d)",
                 cfg->padded_vocab_size, tp, tp);
    else return NULL;
    return msg;
}

float **gpt2_parameter_slots(ParameterTensors *p) {
    /* ParameterTensors holds exactly NUM_PARAMETER_TENSORS float* members in table order. */
    _Static_assert(sizeof(ParameterTensors) == NUM_PARAMETER_TENSORS * sizeof(float *),
                   "ParameterTensors must hold only the table's pointers");
    return (float **)p;
}

void gpt2_point_parameters(ParameterTensors *p, float *arena, const TensorSpec specs[NUM_PARAMETER_TENSORS]) {
    float **slots = gpt2_parameter_slots(p);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) slots[i] = arena + specs[i].offset;
}

int gpt2_activation_stored_per_layer(const char *name, int recompute) {
#define LLMC_ACT_LEVEL(name, shape, numel, kind, keep_below, tp) {#name, keep_below},
    static const struct { const char *name; int keep_below; } levels[] = {GPT2_ACTIVATIONS(LLMC_ACT_LEVEL)};
#undef LLMC_ACT_LEVEL
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (strcmp(levels[i].name, name) == 0) return recompute < levels[i].keep_below;
    return 0;
}

size_t gpt2_activation_specs(const ModelConfig *cfg, int Bi, int Ti, int recompute,
                             TensorSpec specs[NUM_ACTIVATION_TENSORS]) {
    return gpt2_activation_specs_tp(cfg, Bi, Ti, recompute, 1, specs);
}

size_t gpt2_activation_specs_tp(const ModelConfig *cfg, int Bi, int Ti, int recompute, int tp,
                                TensorSpec specs[NUM_ACTIVATION_TENSORS]) {
    LLMC_SHAPE_NAMES(cfg);
    const size_t B = (size_t)Bi, T = (size_t)Ti;
#define LLMC_ACT_ROW(name, shape, numel, kind, level, split) TENSOR_ACT_ROW(name, shape, numel, kind, level)
#define LLMC_ACT_SPLIT(name, shape, numel, kind, level, split) split,
    TensorSpec table[] = {GPT2_ACTIVATIONS(LLMC_ACT_ROW)};
    static const int split[] = {GPT2_ACTIVATIONS(LLMC_ACT_SPLIT)};
#undef LLMC_ACT_ROW
#undef LLMC_ACT_SPLIT
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++)
        if (split[i]) table[i].numel /= (size_t)tp;
    return tensor_table_acts(specs, table, NUM_ACTIVATION_TENSORS, L, recompute);
}

void gpt2_point_activations(ActivationTensors *a, float *arena, const TensorSpec specs[NUM_ACTIVATION_TENSORS]) {
    _Static_assert(sizeof(ActivationTensors) == NUM_ACTIVATION_TENSORS * sizeof(float *),
                   "ActivationTensors must hold only the table's pointers");
    float **slots = (float **)a;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) slots[i] = arena + specs[i].offset;
}

double gpt2_flops_per_token(const ModelConfig *cfg, int T) {
    return model_flops_per_token(gpt2_parameter_specs(cfg, NULL), cfg, T);
}


void gpt2_init_parameters(const ModelConfig *cfg, const TensorSpec specs[NUM_PARAMETER_TENSORS], float *params,
                          unsigned long long seed) {
    tensor_table_init(specs, NUM_PARAMETER_TENSORS, params, cfg->num_layers, seed);
    /* the padded vocabulary rows never take part: keep them zero (wte is the first tensor) */
    size_t C = (size_t)cfg->channels;
    memset(params + specs[0].offset + (size_t)cfg->vocab_size * C, 0,
           (size_t)(cfg->padded_vocab_size - cfg->vocab_size) * C * sizeof(float));
}
