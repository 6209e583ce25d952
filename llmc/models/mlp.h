/*
 * mlp.h - the MLP-only test architecture ("mlp"): a language model without attention or
 * positions, kept to prove that an architecture is its own files (docs/ARCHITECTURES.md) and to
 * give the block-sequence contract a second, small user. Its configuration, parameter and
 * activation tables, the shape of `-e mlp:dN`, its init and flops. Its checkpoint file and its
 * ModelArch entry (mlp_arch) are llmc/formats/mlpfile.h's; the CPU block sequence is
 * llmc/cpu/mlp.h's, the CUDA one llmc/cuda/mlp.cuh's.
 *
 * Model: x = wte[idx]; per layer x += fcprojw · swiglu(fcw · rmsnorm(x) lnw);
 *        logits = rmsnorm(x) lnfw @ wte^T (the head is always tied to wte).
 * rmsnorm(x) = x / sqrt(mean(x^2) + eps); fcw holds gate rows [0, F) and up rows [F, 2F) as
 * the Llama's does. There are no heads: NH = NKV = 1 (the shared limits need them positive).
 */
#ifndef LLMC_MODELS_MLP_H
#define LLMC_MODELS_MLP_H

#include <stddef.h>

#include "llmc/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    ModelConfig base; /* maxT, V, Vp, L, NH = NKV = 1, C, F */
    float norm_eps;   /* RMSNorm eps (1e-5) */
} MlpConfig;

/* "mlp:dN" (N in 1..1000): L = N, C = 64N, F = 4C, V 50257 (GPT-2's tokenizer, so the project's
 * data trains it), Vp 50304, maxT 1024 (a limit only: there are no positions), eps 1e-5.
 * Returns 0 and fills cfg, or -1 when name is not such a descriptor. */
int mlp_config_from_name(MlpConfig *cfg, const char *name);
/* NULL, or what is wrong (NH or NKV not 1, eps not > 0, the shared limits). */
const char *mlp_config_validate(const MlpConfig *cfg);

/* X(name, shape comment, numel expression, weight decay?, init rule, stacked over L?)
 * Expressions may use Vp, C, L, F. Order = checkpoint order. */
#define MLP_PARAMETERS(X)                                                    \
    X(wte,     "(Vp, C)",    (size_t)Vp * C,        1, INIT_NORMAL, 0)          \
    X(lnw,     "(L, C)",     (size_t)L * C,         0, INIT_ONES, 1)            \
    X(fcw,     "(L, 2F, C)", (size_t)L * 2 * F * C, 1, INIT_NORMAL, 1)          \
    X(fcprojw, "(L, C, F)",  (size_t)L * C * F,     1, INIT_NORMAL_RESIDUAL, 1) \
    X(lnfw,    "(C)",        (size_t)C,             0, INIT_ONES, 0)

#define LLMC_MLP_INDEX(name, ...) MLP_P_##name,
enum { MLP_PARAMETERS(LLMC_MLP_INDEX) MLP_NUM_PARAMETERS };
#undef LLMC_MLP_INDEX

/* X(name, shape comment, numel expression (one layer's when per layer), memory kind, per layer?)
 * (all stored; no recompute levels). residual l is block l's output. */
#define MLP_ACTIVATIONS(X)                                                 \
    X(encoded,    "(B, T, C)",     (size_t)B * T * C,     ACT_RESIDUAL, 0)  \
    X(ln,         "(L, B, T, C)",  (size_t)B * T * C,     ACT_LAYERNORM, 1) \
    X(ln_rstd,    "(L, B, T)",     (size_t)B * T,         ACT_STATS, 1)     \
    X(fch,        "(L, B, T, 2F)", (size_t)B * T * 2 * F, ACT_MLP, 1)       \
    X(fch_swiglu, "(L, B, T, F)",  (size_t)B * T * F,     ACT_GELU, 1)      \
    X(residual,   "(L, B, T, C)",  (size_t)B * T * C,     ACT_RESIDUAL, 1)  \
    X(lnf,        "(B, T, C)",     (size_t)B * T * C,     ACT_LAYERNORM, 0) \
    X(lnf_rstd,   "(B, T)",        (size_t)B * T,         ACT_STATS, 0)     \
    X(logits,     "(B, T, Vp)",    (size_t)B * T * Vp,    ACT_LOGITS, 0)    \
    X(losses,     "(B, T)",        (size_t)B * T,         ACT_STATS, 0)

#define LLMC_MLP_AINDEX(name, ...) MLP_A_##name,
enum { MLP_ACTIVATIONS(LLMC_MLP_AINDEX) MLP_NUM_ACTIVATIONS };
#undef LLMC_MLP_AINDEX

/* The tables for cfg (offsets, per-layer strides; specs may be NULL); return the total counts. */
size_t mlp_parameter_specs(const MlpConfig *cfg, TensorSpec specs[MLP_NUM_PARAMETERS]);
size_t mlp_activation_specs(const MlpConfig *cfg, int B, int T, TensorSpec specs[MLP_NUM_ACTIVATIONS]);
/* Random init by the table's rules (tensor_table_init: N(0, 0.02), fcprojw 0.02/sqrt(2L), gains
 * 1), then the padded vocabulary rows of wte zeroed. params: mlp_parameter_specs' total. */
void mlp_init_parameters(const MlpConfig *cfg, float *params, unsigned long long seed);
/* Training flops per token at sequence length T: 6N (no attention term: nothing grows with T). */
double mlp_flops_per_token(const MlpConfig *cfg, int T);

#ifdef __cplusplus
}
#endif
#endif
