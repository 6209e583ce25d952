/*
 * llama.h - the Llama 3 architecture in one place: its configuration (the knobs GPT-2 lacks),
 * its parameter and activation tables, and the shapes of the released models by name. The
 * CPU block sequence is in llmc/cpu/llama.c, its files in llmc/formats/llamafile.h, its registry
 * entry in llmc/formats/arch.h (llama3_arch); docs/ARCHITECTURES.md has the checklist.
 *
 * Block (pre-norm, no biases): x += wo(attention(rope(wqkv(rmsnorm(x)))));
 *                              x += wdown(swiglu(wgate_up(rmsnorm(x))))
 * then logits = rmsnorm(x) @ lm_head^T (wte^T when the model ties them: lm_head has 0 rows).
 * Shape vocabulary as in model.h, plus NKV key/value heads (NH % NKV == 0, grouped-query
 * attention) and F the SwiGLU width (fcw holds gate rows [0, F) and up rows [F, 2F)).
 */
#ifndef LLMC_LLAMA_H
#define LLMC_LLAMA_H

#include "llmc/models/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ModelConfig base;        /* maxT, V, Vp, L, NH, NKV, C, F */
    int tied;                /* the output head is wte (Llama 3.2 1B/3B) instead of lm_head */
    float norm_eps;          /* RMSNorm eps (1e-5) */
    float rope_theta;        /* 500000 for Llama 3 */
    float rope_factor;       /* Llama 3.1 frequency scaling (0: none): factor, low, high, original */
    float rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    float ffn_multiplier;    /* how F was derived (llama_ffn_hidden), when known (0: unknown): kept so */
    int ffn_multiple_of;     /* that llm.c's Llama 3 header, which stores these, round-trips */
} LlamaConfig;

/* Llama's MLP width: 2/3 of 4C, times ffn_dim_multiplier (<= 0: none), rounded up to a multiple
 * of multiple_of. 8B: C 4096, 1.3, 1024 -> 14336. */
int llama_ffn_hidden(int C, float ffn_dim_multiplier, int multiple_of);

/* Fills cfg from a name: "llama3.2-1b", "llama3.2-3b", "llama3.1-8b" (the released shapes), or
 * "llama3:dN" for a random-init model of depth N: C = 64N, NH = N, NKV the largest divisor of NH
 * that is at most NH/4 (at least 1), F from multiplier 1.0 and multiple_of 256, V 128256,
 * maxT 1024, theta 500000, no frequency scaling, untied head. Returns 0, or -1 if not a name. */
int llama_config_from_name(LlamaConfig *cfg, const char *name);
/* NULL, or what is wrong (NH % NKV, odd head size, non-positive eps or theta, ...). */
const char *llama_config_validate(const LlamaConfig *cfg);

/* X(name, shape comment, numel expression, weight decay?, init rule, stacked over L?)
 * Expressions may use Vp, C, L, F, QKV (= (NH + 2*NKV) * HS), TIED. Order = checkpoint order.
 * The family's tables (the Mixtral's, llmc/models/mixtral.h) share the attention half and the
 * head: LLAMA3_TRUNK_* (embedding, attention, the MLP's norm), then the MLP's rows, then
 * LLAMA3_HEAD_* (the final norm and head). */
#define LLAMA3_TRUNK_PARAMETERS(X)                                                \
    X(wte,      "(Vp, C)",        (size_t)Vp * C,          1, INIT_NORMAL, 0)          \
    X(ln1w,     "(L, C)",         (size_t)L * C,           0, INIT_ONES, 1)            \
    X(qkvw,     "(L, QKV, C)",    (size_t)L * QKV * C,     1, INIT_NORMAL, 1)          \
    X(attprojw, "(L, C, C)",      (size_t)L * C * C,       1, INIT_NORMAL_RESIDUAL, 1) \
    X(ln2w,     "(L, C)",         (size_t)L * C,           0, INIT_ONES, 1)
#define LLAMA3_HEAD_PARAMETERS(X)                                                 \
    X(lnfw,     "(C)",            (size_t)C,               0, INIT_ONES, 0)            \
    X(lm_head,  "(Vp, C) or ()",  TIED ? 0 : (size_t)Vp * C, 1, INIT_NORMAL, 0)
#define LLAMA3_PARAMETERS(X)                                                      \
    LLAMA3_TRUNK_PARAMETERS(X)                                                    \
    X(fcw,      "(L, 2F, C)",     (size_t)L * 2 * F * C,   1, INIT_NORMAL, 1)          \
    X(fcprojw,  "(L, C, F)",      (size_t)L * C * F,       1, INIT_NORMAL_RESIDUAL, 1) \
    LLAMA3_HEAD_PARAMETERS(X)

#define LLMC_LLAMA_INDEX(name, ...) LLAMA3_P_##name,
enum { LLAMA3_PARAMETERS(LLMC_LLAMA_INDEX) LLAMA3_NUM_PARAMETERS };
#undef LLMC_LLAMA_INDEX
/* a head row's place after the table's first head row (lnfw), in every family table */
#define LLMC_LLAMA_HINDEX(name, ...) LLAMA3_HP_##name,
enum { LLAMA3_HEAD_PARAMETERS(LLMC_LLAMA_HINDEX) };
#undef LLMC_LLAMA_HINDEX

/* X(name, shape comment, numel expression, memory kind, level) with GPT-2's rule for the last column
 * (tensor_table_place_acts): 0 for a tensor that is not per layer, else R: stored for every layer
 * when the recompute level -r is below R, else one layer's worth, recomputed in backward. The CPU
 * Llama's levels: -r 1 recomputes the SwiGLU output, -r 2 also the RMSNorm outputs (from the stored
 * rstd); R = 4: always per layer. The family shares the rows as the parameters (LLAMA3_TRUNK_*, the
 * MLP's, LLAMA3_HEAD_*); the Mixtral's and the CUDA Llama's tables are read at -r 0 (all stored). */
#define LLAMA3_TRUNK_ACTIVATIONS(X)                                             \
    X(encoded,   "(B, T, C)",        (size_t)B * T * C,      ACT_RESIDUAL, 0)     \
    X(ln1,       "(L, B, T, C)",     (size_t)B * T * C,      ACT_LAYERNORM, 2)    \
    X(ln1_rstd,  "(L, B, T)",        (size_t)B * T,          ACT_STATS, 4)        \
    X(qkv,       "(L, B, T, QKV)",   (size_t)B * T * QKV,    ACT_ATTENTION, 4)    \
    X(atty,      "(L, B, T, C)",     (size_t)B * T * C,      ACT_ATTENTION, 4)    \
    X(att,       "(L, B, NH, T, T)", (size_t)B * NH * T * T, ACT_ATTENTION, 4)    \
    X(residual2, "(L, B, T, C)",     (size_t)B * T * C,      ACT_RESIDUAL, 4)     \
    X(ln2,       "(L, B, T, C)",     (size_t)B * T * C,      ACT_LAYERNORM, 2)    \
    X(ln2_rstd,  "(L, B, T)",        (size_t)B * T,          ACT_STATS, 4)
#define LLAMA3_HEAD_ACTIVATIONS(X)                                              \
    X(residual3, "(L, B, T, C)",     (size_t)B * T * C,      ACT_RESIDUAL, 4)     \
    X(lnf,       "(B, T, C)",        (size_t)B * T * C,      ACT_LAYERNORM, 0)    \
    X(lnf_rstd,  "(B, T)",           (size_t)B * T,          ACT_STATS, 0)        \
    X(logits,    "(B, T, Vp)",       (size_t)B * T * Vp,     ACT_LOGITS, 0)       \
    X(losses,    "(B, T)",           (size_t)B * T,          ACT_STATS, 0)
#define LLAMA3_ACTIVATIONS(X)                                                   \
    LLAMA3_TRUNK_ACTIVATIONS(X)                                                 \
    X(fch,       "(L, B, T, 2F)",    (size_t)B * T * 2 * F,  ACT_MLP, 4)          \
    X(fch_swiglu, "(L, B, T, F)",    (size_t)B * T * F,      ACT_GELU, 1)         \
    LLAMA3_HEAD_ACTIVATIONS(X)

#define LLMC_LLAMA_AINDEX(name, ...) LLAMA3_A_##name,
enum { LLAMA3_ACTIVATIONS(LLMC_LLAMA_AINDEX) LLAMA3_NUM_ACTIVATIONS };
#undef LLMC_LLAMA_AINDEX
/* a head activation's place after the table's first (residual3) */
#define LLMC_LLAMA_HAINDEX(name, ...) LLAMA3_HA_##name,
enum { LLAMA3_HEAD_ACTIVATIONS(LLMC_LLAMA_HAINDEX) };
#undef LLMC_LLAMA_HAINDEX

/* The tables for cfg (offsets, per-layer strides); return the total element counts. */
/* The names the tables' expressions use, as size_t locals (and TIED), for a LlamaConfig. */
#define LLAMA_SHAPE_NAMES(cfg)                                                                \
    const size_t Vp = (size_t)(cfg)->base.padded_vocab_size, C = (size_t)(cfg)->base.channels, \
                 L = (size_t)(cfg)->base.num_layers, F = (size_t)(cfg)->base.ffn_hidden,       \
                 NH = (size_t)(cfg)->base.num_heads,                                          \
                 QKV = ((size_t)(cfg)->base.num_heads + 2 * (size_t)(cfg)->base.num_kv_heads) * (C / NH); \
    const int TIED = (cfg)->tied;                                                             \
    (void)Vp, (void)C, (void)L, (void)F, (void)NH, (void)QKV, (void)TIED

size_t llama_parameter_specs(const LlamaConfig *cfg, TensorSpec specs[LLAMA3_NUM_PARAMETERS]);
size_t llama_activation_specs(const LlamaConfig *cfg, int B, int T, int recompute,
                              TensorSpec specs[LLAMA3_NUM_ACTIVATIONS]);
/* Random init by the table's rules (as gpt2_init_parameters: N(0, 0.02), residual projections
 * 0.02/sqrt(2L), gains 1, padded vocabulary rows 0). */
void llama_init_parameters(const LlamaConfig *cfg, const TensorSpec specs[LLAMA3_NUM_PARAMETERS], float *params,
                           unsigned long long seed);
/* Zeroes the padded vocabulary rows [V, Vp) of wte and, untied, of lm_head (the family's init). */
void llama_zero_vocab_padding(const LlamaConfig *cfg, float *wte, float *lm_head);

/* Training flops per token, 6N + 6LCT as gpt2_flops_per_token. */
double llama_flops_per_token(const LlamaConfig *cfg, int T);

#ifdef __cplusplus
}
#endif
#endif
