/*
 * tensor.h - the generic tensor-table machinery every architecture uses: the shared shape
 * (ModelConfig and its limits), a table row (TensorSpec), layer views (tensor_layer), init
 * rules and the random initialisation of a whole table. An architecture's own tables (its
 * X-macro rows) live in llmc/models/<arch>.h.
 *
 * Shape vocabulary: B batch, T sequence, C channels, V vocab, Vp padded vocab, L layers,
 * NH heads, NKV key/value heads, HS head size, maxT the longest sequence, F the MLP width.
 */
#ifndef LLMC_CORE_TENSOR_H
#define LLMC_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int max_seq_len;       /* maxT */
    int vocab_size;        /* V, the real vocabulary (50257 for GPT-2) */
    int padded_vocab_size; /* Vp, V rounded up to a multiple of 128 */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int num_kv_heads;      /* NKV; == NH for GPT-2 */
    int channels;          /* C */
    int ffn_hidden;        /* F; 4*C for GPT-2 */
} ModelConfig;

/* The limits and divisibility every architecture shares (GPT-2 adds NKV == NH: gpt2_config_validate);
 * returns NULL or a message describing the problem. */
const char *model_config_validate(const ModelConfig *cfg);
/* The limits model_config_validate enforces (checkpoint headers are checked against them before
 * any size is computed). */
#define MODEL_MAX_SEQ_LEN (1 << 24)
#define MODEL_MAX_VOCAB (1 << 24)
#define MODEL_MAX_LAYERS (1 << 12)
#define MODEL_MAX_CHANNELS (1 << 16)
/* entries an architecture's activation table may have (MemPlan holds one such table) */
enum { MODEL_MAX_ACTIVATIONS = 32 };

typedef enum { INIT_NORMAL, INIT_NORMAL_RESIDUAL, INIT_ZEROS, INIT_ONES } InitRule;

/* X-macro helpers: a struct member per row, a row count. */
#define LLMC_DECLARE_POINTER(name, ...) float *name;
#define LLMC_COUNT_ONE(...) +1

typedef enum { ACT_RESIDUAL, ACT_LAYERNORM, ACT_STATS, ACT_ATTENTION, ACT_MLP, ACT_GELU, ACT_LOGITS,
               ACT_NUM_KINDS } ActivationKind;
extern const char *const activation_kind_names[ACT_NUM_KINDS];

/* How a parameter splits over the ranks of a tensor-parallel group (Megatron's layout; the parameter
 * table's split column, e.g. llmc/models/gpt2.h). Weights are (out, in): SPLIT_COL splits the output
 * features (Megatron's column-parallel linear; its bias splits with it), SPLIT_ROW the input features
 * (row-parallel; its bias is whole on every rank and added once, after the sum over the group).
 * One layer of the whole tensor is viewed as (outer, dim, inner) and the dim axis is cut into tp
 * equal blocks, rank r holding block r: SPLIT_COL(G, D): outer = G groups of D output features
 * (GPT-2's qkv: 3 groups q | k | v of C, so each rank holds its heads' q, k and v), inner = the rest
 * of the layer; SPLIT_ROW(D): dim = D input features, outer = the rest, inner = 1. */
enum { TENSOR_SPLIT_NONE, TENSOR_SPLIT_COL, TENSOR_SPLIT_ROW };
typedef struct {
    int kind;   /* TENSOR_SPLIT_* */
    int groups; /* SPLIT_COL: the groups of output features (1, or 3 for a fused q | k | v) */
    size_t dim; /* the split extent of the whole tensor (output features per group, or input features) */
} TensorSplit;
#define SPLIT_NONE {TENSOR_SPLIT_NONE, 0, 0}
#define SPLIT_COL(groups, dim) {TENSOR_SPLIT_COL, groups, dim}
#define SPLIT_ROW(dim) {TENSOR_SPLIT_ROW, 1, dim}

typedef struct {
    const char *name;
    const char *shape;
    size_t numel;   /* elements in the whole tensor (all layers) */
    size_t offset;  /* elements from the start of its arena */
    int decay;      /* parameters: weight decay applies */
    int init;       /* parameters: an InitRule */
    int kind;       /* activations: an ActivationKind */
    int per_layer;  /* activations: numel counts all stored layers */
    size_t layer_numel; /* elements between layer l and l + 1 (0: one copy shared by every layer) */
    TensorSplit split;  /* parameters: how it splits over a tensor-parallel group (kind 0: whole on every rank) */
} TensorSpec;

/* Training flops per token of a model of n parameters, the usual 6N + 6LCT (forward + backward,
 * attention's two matmuls counted for the causal half). */
double model_flops_per_token(size_t n, const ModelConfig *cfg, int T);

/* A table row from an X-macro row: parameters X(name, shape, numel, decay, init, stacked) carry
 * "stacked" in layer_numel, activations X(name, shape, numel, kind, level) their per-layer level in
 * per_layer, until tensor_table_place_* lays the table out. */
#define TENSOR_PARAM_ROW(name, shape, numel, decay, init, stacked) {#name, shape, numel, 0, decay, init, 0, 0, stacked, SPLIT_NONE},
#define TENSOR_ACT_ROW(name, shape, numel, kind, level) {#name, shape, numel, 0, 0, 0, kind, level, 0, SPLIT_NONE},
/* A parameter row with a tensor-parallel split column (SPLIT_NONE, SPLIT_COL(G, D), SPLIT_ROW(D)). */
#define TENSOR_PARAM_SPLIT_ROW(name, shape, numel, decay, init, stacked, split) \
    {#name, shape, numel, 0, decay, init, 0, 0, stacked, split},
/* Offsets back to back in table order; a stacked parameter gets layer_numel = numel / L. Returns
 * the total element count. */
size_t tensor_table_place_params(TensorSpec *t, int n, size_t L);
/* Offsets back to back; an activation whose level is above recompute is stored for each of the L
 * layers (numel *= L, layer_numel = one layer's, per_layer = 1), else once (per_layer = 0). */
size_t tensor_table_place_acts(TensorSpec *t, int n, size_t L, int recompute);
/* An architecture's *_parameter_specs / *_activation_specs in one call: place table (its rows as
 * written by the X-macros) and copy it to specs (NULL: only the total is wanted); returns the total. */
size_t tensor_table_params(TensorSpec *specs, TensorSpec *table, int n, size_t L);
size_t tensor_table_acts(TensorSpec *specs, TensorSpec *table, int n, size_t L, int recompute);
/* Defines an architecture's two table functions from its X-macros PARAMS / ACTS (NP / NA rows) over
 * the size_t names SHAPE_NAMES(cfg) declares (L among them):
 *   size_t PREFIX_parameter_specs(const Config *cfg, TensorSpec specs[NP]);
 *   size_t PREFIX_activation_specs(const Config *cfg, int B, int T, TensorSpec specs[NA]);
 * TENSOR_TABLE_FUNCTIONS for tables whose activations are all stored (the last column 0: once, 1: per
 * layer); TENSOR_TABLE_FUNCTIONS_LEVELS for tables with recompute levels (the last column R as
 * tensor_table_place_acts reads it), whose activation function takes int recompute after T. */
#define TENSOR_TABLE_PARAMETER_FUNCTION(PREFIX, Config, SHAPE_NAMES, PARAMS, NP)                        \
    size_t PREFIX##_parameter_specs(const Config *cfg, TensorSpec specs[NP]) {                         \
        SHAPE_NAMES(cfg);                                                                              \
        TensorSpec table[] = {PARAMS(TENSOR_PARAM_ROW)};                                               \
        return tensor_table_params(specs, table, NP, L);                                               \
    }
#define TENSOR_TABLE_FUNCTIONS(PREFIX, Config, SHAPE_NAMES, PARAMS, NP, ACTS, NA)                       \
    TENSOR_TABLE_PARAMETER_FUNCTION(PREFIX, Config, SHAPE_NAMES, PARAMS, NP)                           \
    size_t PREFIX##_activation_specs(const Config *cfg, int Bi, int Ti, TensorSpec specs[NA]) {        \
        SHAPE_NAMES(cfg);                                                                              \
        const size_t B = (size_t)Bi, T = (size_t)Ti;                                                   \
        TensorSpec table[] = {ACTS(TENSOR_ACT_ROW)};                                                   \
        return tensor_table_acts(specs, table, NA, L, 0);                                              \
    }
#define TENSOR_TABLE_FUNCTIONS_LEVELS(PREFIX, Config, SHAPE_NAMES, PARAMS, NP, ACTS, NA)                \
    TENSOR_TABLE_PARAMETER_FUNCTION(PREFIX, Config, SHAPE_NAMES, PARAMS, NP)                           \
    size_t PREFIX##_activation_specs(const Config *cfg, int Bi, int Ti, int recompute, TensorSpec specs[NA]) { \
        SHAPE_NAMES(cfg);                                                                              \
        const size_t B = (size_t)Bi, T = (size_t)Ti;                                                   \
        TensorSpec table[] = {ACTS(TENSOR_ACT_ROW)};                                                   \
        return tensor_table_acts(specs, table, NA, L, recompute);                                      \
    }

/* Tensor parallelism over a table whose rows carry a split: tensor_table_split divides each split row's
 * numel by tp (before tensor_table_place_params: a rank's own table). tensor_split_copy moves rank
 * `rank`'s part of every tensor between a whole arena (laid out by whole, the table for tp 1) and the
 * rank's arena (laid out by local): to_local 1 copies whole -> local, 0 local -> whole. */
void tensor_table_split(TensorSpec *t, int n, int tp);
void tensor_split_copy(const TensorSpec *whole, const TensorSpec *local, int n, int tp, int rank, float *whole_arena,
                       float *local_arena, int to_local);

/* Layer l's view of the tensor s in arena: per-layer views and strides come from the table,
 * never from hand-written shape products. */
static inline float *tensor_layer(float *arena, const TensorSpec *s, int l) {
    return arena + s->offset + (size_t)l * s->layer_numel;
}

/* The random initialisation of any architecture's table (n tensors): N(0, 0.02), INIT_NORMAL_RESIDUAL
 * N(0, 0.02/sqrt(2L)), INIT_ZEROS 0, INIT_ONES 1; each (tensor, chunk) draws from its own stream. */
void tensor_table_init(const TensorSpec *specs, int n, float *params, int num_layers, unsigned long long seed);

#ifdef __cplusplus
}
#endif
#endif
