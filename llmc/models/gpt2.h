/*
 * gpt2.h - GPT-2's architecture: the descriptor (dN), its parameter and activation tables
 * (GPT2_PARAMETERS, GPT2_ACTIVATIONS) and what derives from them: the ParameterTensors struct
 * of pointers, element counts and offsets into the one arena, the checkpoint order (llm.c's),
 * the weight-decay choice and the init rule. The generic table code (ModelConfig, TensorSpec,
 * tensor_layer, tensor_table_init) is llmc/core/tensor.h; the architecture's entry in the
 * registry is llmc/formats/arch.h's gpt2_arch.
 */
#ifndef LLMC_MODEL_H
#define LLMC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills cfg for a GPT-2 of depth L from a descriptor "dN" or "gpt2:dN": d12/d24/d36/d48 are
 * GPT-2 124M/350M/774M/1558M (C 768/1024/1280/1600); any other N gets C = 64*N, NH = N. Also
 * llm.c's "gpt3:cC" (GPT-3's shapes by channels, maxT 2048; an unknown C is an error).
 * Returns 0, or -1 if the string is not a descriptor. */
int model_config_from_descriptor(ModelConfig *cfg, const char *desc);
/* model_config_validate's checks plus GPT-2's block: NKV == NH. NULL or a message. */
const char *gpt2_config_validate(const ModelConfig *cfg);

/* X(name, shape comment, numel expression, weight decay?, init rule, stacked over L?, tensor-parallel split)
 * Expressions may use Vp, C, L, maxT, F, QKV (= (NH + 2*NKV) * HS). Order = checkpoint order.
 * A stacked tensor holds L equal slices, layer l at offset l * numel / L (tensor_layer).
 * The split (llmc/core/tensor.h's TensorSplit; -tp N): c_attn (qkv) and c_fc by their output features
 * (qkv in its three q | k | v groups of C: each rank its heads' rows of each), the two c_proj by their
 * input features (their biases whole, added once after the sum over the group); wte by its rows, the
 * vocabulary (the tied LM head's output features: Megatron's vocabulary-parallel embedding, rank r
 * holding rows [r Vp/tp, (r+1) Vp/tp)); wpe and the layernorms whole on every rank. */
#define GPT2_PARAMETERS(X)                                                                        \
    X(wte,      "(Vp, C)",     (size_t)Vp * C,        1, INIT_NORMAL, 0, SPLIT_COL(1, Vp))         \
    X(wpe,      "(maxT, C)",   (size_t)maxT * C,      1, INIT_NORMAL, 0, SPLIT_NONE)               \
    X(ln1w,     "(L, C)",      (size_t)L * C,         0, INIT_ONES, 1, SPLIT_NONE)                 \
    X(ln1b,     "(L, C)",      (size_t)L * C,         0, INIT_ZEROS, 1, SPLIT_NONE)                \
    X(qkvw,     "(L, QKV, C)", (size_t)L * QKV * C,   1, INIT_NORMAL, 1, SPLIT_COL(3, C))          \
    X(qkvb,     "(L, QKV)",    (size_t)L * QKV,       0, INIT_ZEROS, 1, SPLIT_COL(3, C))           \
    X(attprojw, "(L, C, C)",   (size_t)L * C * C,     1, INIT_NORMAL_RESIDUAL, 1, SPLIT_ROW(C))    \
    X(attprojb, "(L, C)",      (size_t)L * C,         0, INIT_ZEROS, 1, SPLIT_NONE)                \
    X(ln2w,     "(L, C)",      (size_t)L * C,         0, INIT_ONES, 1, SPLIT_NONE)                 \
    X(ln2b,     "(L, C)",      (size_t)L * C,         0, INIT_ZEROS, 1, SPLIT_NONE)                \
    X(fcw,      "(L, F, C)",   (size_t)L * F * C,     1, INIT_NORMAL, 1, SPLIT_COL(1, F))          \
    X(fcb,      "(L, F)",      (size_t)L * F,         0, INIT_ZEROS, 1, SPLIT_COL(1, F))           \
    X(fcprojw,  "(L, C, F)",   (size_t)L * C * F,     1, INIT_NORMAL_RESIDUAL, 1, SPLIT_ROW(F))    \
    X(fcprojb,  "(L, C)",      (size_t)L * C,         0, INIT_ZEROS, 1, SPLIT_NONE)                \
    X(lnfw,     "(C)",         (size_t)C,             0, INIT_ONES, 0, SPLIT_NONE)                 \
    X(lnfb,     "(C)",         (size_t)C,             0, INIT_ZEROS, 0, SPLIT_NONE)

typedef struct {
    GPT2_PARAMETERS(LLMC_DECLARE_POINTER)
} ParameterTensors;
enum { NUM_PARAMETER_TENSORS = 0 GPT2_PARAMETERS(LLMC_COUNT_ONE) };
/* GPT2_P_wte, ...: each parameter's index in the table (for tensor_layer) */
#define LLMC_PARAM_INDEX(name, ...) GPT2_P_##name,
enum { GPT2_PARAMETERS(LLMC_PARAM_INDEX) };

/* X(name, shape comment, numel expression, memory kind, stored per layer below recompute level, tp)
 * Expressions may use B, T, C, L, NH, Vp, F, QKV. The fifth column is 0 for a tensor that is not
 * per layer; otherwise R: the tensor is stored for every layer when the recompute level is below
 * R, else one layer's worth is kept and recomputed in backward (R = 4: always per layer). The last
 * column is 1 for the tensors of the split regions (-tp N: a rank holds its heads' / its MLP
 * columns' / its vocabulary slice's 1/N of them), 0 for those whole on every rank.
 * Aliasing: logits is overwritten in place by dlogits during the training forward pass. */
#define GPT2_ACTIVATIONS(X) \
    X(encoded,  "(B, T, C)",        (size_t)B * T * C,       ACT_RESIDUAL,  0, 0) \
    X(ln1,      "(L, B, T, C)",     (size_t)B * T * C,       ACT_LAYERNORM, 2, 0) \
    X(ln1_mean, "(L, B, T)",        (size_t)B * T,           ACT_STATS,     3, 0) \
    X(ln1_rstd, "(L, B, T)",        (size_t)B * T,           ACT_STATS,     3, 0) \
    X(qkv,      "(L, B, T, QKV)",   (size_t)B * T * QKV,     ACT_ATTENTION, 3, 1) \
    X(atty,     "(L, B, T, C)",     (size_t)B * T * C,       ACT_ATTENTION, 3, 1) \
    X(att,      "(L, B, NH, T, T)", (size_t)B * NH * T * T,  ACT_ATTENTION, 3, 1) \
    X(residual2, "(L, B, T, C)",     (size_t)B * T * C,       ACT_RESIDUAL,  3, 0) \
    X(ln2,      "(L, B, T, C)",     (size_t)B * T * C,       ACT_LAYERNORM, 2, 0) \
    X(ln2_mean, "(L, B, T)",        (size_t)B * T,           ACT_STATS,     3, 0) \
    X(ln2_rstd, "(L, B, T)",        (size_t)B * T,           ACT_STATS,     3, 0) \
    X(fch,      "(L, B, T, F)",     (size_t)B * T * F,       ACT_MLP,       3, 1) \
    X(fch_gelu, "(L, B, T, F)",     (size_t)B * T * F,       ACT_GELU,      1, 1) \
    X(residual3, "(L, B, T, C)",     (size_t)B * T * C,       ACT_RESIDUAL,  4, 0) \
    X(lnf,      "(B, T, C)",        (size_t)B * T * C,       ACT_LAYERNORM, 0, 0) \
    X(lnf_mean, "(B, T)",           (size_t)B * T,           ACT_STATS,     0, 0) \
    X(lnf_rstd, "(B, T)",           (size_t)B * T,           ACT_STATS,     0, 0) \
    X(logits,   "(B, T, Vp)",       (size_t)B * T * Vp,      ACT_LOGITS,    0, 1) \
    X(losses,   "(B, T)",           (size_t)B * T,           ACT_STATS,     0, 0)

typedef struct {
    GPT2_ACTIVATIONS(LLMC_DECLARE_POINTER)
} ActivationTensors;
enum { NUM_ACTIVATION_TENSORS = 0 GPT2_ACTIVATIONS(LLMC_COUNT_ONE) };
/* (C and C++: GPT-2's activation table fits a MemPlan) */
typedef char gpt2_activations_fit_memplan[(int)NUM_ACTIVATION_TENSORS <= (int)MODEL_MAX_ACTIVATIONS ? 1 : -1];
/* GPT2_A_encoded, ...: each activation's index in the table */
#define LLMC_ACT_INDEX(name, ...) GPT2_A_##name,
enum { GPT2_ACTIVATIONS(LLMC_ACT_INDEX) };


/* The parameter table for cfg; returns the total element count. specs may be NULL. */
size_t gpt2_parameter_specs(const ModelConfig *cfg, TensorSpec specs[NUM_PARAMETER_TENSORS]);
/* The table of one rank of a tensor-parallel group of tp (the split rows' numel / tp; tp 1: the
 * whole table); the total element count. gpt2_tp_validate: NULL when cfg splits over tp ranks, else
 * what does not divide. */
size_t gpt2_parameter_specs_tp(const ModelConfig *cfg, int tp, TensorSpec specs[NUM_PARAMETER_TENSORS]);
const char *gpt2_tp_validate(const ModelConfig *cfg, int tp);
/* Points every member of p into the arena laid out by the specs. */
void gpt2_point_parameters(ParameterTensors *p, float *arena, const TensorSpec specs[NUM_PARAMETER_TENSORS]);
/* The tensor pointers in table order (for loops over all parameters). */
float **gpt2_parameter_slots(ParameterTensors *p);

/* Does each layer of the named activation have its own storage at this recompute level? (the
 * table's last column; for backends that look tensors up by name) */
int gpt2_activation_stored_per_layer(const char *name, int recompute);

/* Recompute levels: 0 none, 1 GELU output, 2 also the LayerNorm outputs, 3 (GPU) everything
 * but each block's input (residual3), the block is rerun in backward. */
size_t gpt2_activation_specs(const ModelConfig *cfg, int B, int T, int recompute,
                             TensorSpec specs[NUM_ACTIVATION_TENSORS]);
/* The same for one rank of a tensor-parallel group of tp (the table's tp column: those tensors / tp). */
size_t gpt2_activation_specs_tp(const ModelConfig *cfg, int B, int T, int recompute, int tp,
                                TensorSpec specs[NUM_ACTIVATION_TENSORS]);
void gpt2_point_activations(ActivationTensors *a, float *arena, const TensorSpec specs[NUM_ACTIVATION_TENSORS]);

/* GPT-2's random initialisation into params (laid out by specs): N(0, 0.02), residual
 * projections N(0, 0.02/sqrt(2L)), biases 0, norm gains 1, padded vocabulary rows 0. Each
 * (tensor, chunk) draws from its own stream, so the result depends only on the seed. */
void gpt2_init_parameters(const ModelConfig *cfg, const TensorSpec specs[NUM_PARAMETER_TENSORS], float *params,
                          unsigned long long seed);

/* Training flops per token, the usual 6N + 6LCT (N = all parameters; forward + backward,
 * attention's two matmuls counted for the causal half): the basis of GFLOP/s and MFU. */
double gpt2_flops_per_token(const ModelConfig *cfg, int T);

#ifdef __cplusplus
}
#endif
#endif
