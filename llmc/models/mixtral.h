/*
 * mixtral.h - the Mixtral architecture (Hugging Face MixtralForCausalLM): a Llama 3 block whose
 * SwiGLU MLP is a sparse mixture of E experts. Its configuration (the Llama's knobs plus E, top-k
 * and the load-balancing loss), its parameter and activation tables, its random-init descriptors.
 * The CPU block sequence is llmc/cpu/mixtral.c (routing ops llmc/cpu/moe.h), its file and table
 * entry llmc/formats/mixtralfile.h (mixtral_arch); docs/ARCHITECTURES.md has the checklist.
 *
 * Block: x += wo(attention(rope(wqkv(rmsnorm(x)))))           (the Llama's, GQA, RoPE scaling)
 *        h = rmsnorm(x); p = softmax(h @ gatew^T) over the E experts;
 *        the top-k experts of p (ties: the lower expert index), their weights p / sum(top-k p);
 *        x += sum over the k chosen e of weight_e * expprojw_e(swiglu(expfcw_e(h)))
 * Dropless: every routed token is computed (no capacity). expfcw_e holds gate rows [0, F) (HF w1)
 * and up rows [F, 2F) (HF w3); expprojw_e is HF w2. Expert tensors are one table row each,
 * stacked over L and, inside a layer, over E (expert e of layer l at layer_numel * l + e * size).
 *
 * Auxiliary load-balancing loss (transformers >= 4.37, load_balancing_loss_func, no padding
 * mask): the router probabilities of all L layers pooled (M = L * B * T rows),
 * aux = E * sum_e f_e * P_e, f_e = (number of (row, slot) choosing e) / M, P_e = mean_rows p_e;
 * its gradient flows through P only. The objective is CE + aux_coef * aux when
 * output_router_logits, else CE.
 */
#ifndef LLMC_MIXTRAL_H
#define LLMC_MIXTRAL_H

#include "llmc/models/llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    union {
        ModelConfig base;    /* maxT, V, Vp, L, NH, NKV, C, F (F: each expert's SwiGLU width) */
        LlamaConfig llama;   /* the Llama's knobs: tied head, eps, RoPE and its scaling */
    };
    int num_experts;         /* E (HF num_local_experts) */
    int top_k;               /* K (HF num_experts_per_tok), 1 <= K <= E */
    int output_router_logits; /* 1: the objective adds aux_coef * aux (HF output_router_logits) */
    float aux_coef;          /* HF router_aux_loss_coef, finite and >= 0 */
} MixtralConfig;

enum { MIXTRAL_MAX_EXPERTS = 256 };

/* "mixtral:dN" (the Llama's llama3:dN shape, E 8, top-2, aux on with coefficient 0.02) or
 * "mixtral:dN-eE-kK" (E experts, top-K). Returns 0, or -1 if not such a name. */
int mixtral_config_from_name(MixtralConfig *cfg, const char *name);
/* NULL, or what is wrong (the Llama's checks, then E, K, the coefficient). */
const char *mixtral_config_validate(const MixtralConfig *cfg);

/* X(name, shape, numel, weight decay?, init rule, stacked over L?); names as in llama.h plus E, K. */
#define MIXTRAL_PARAMETERS(X)                                                          \
    LLAMA3_TRUNK_PARAMETERS(X)                                                           \
    X(gatew,    "(L, E, C)",      (size_t)L * E * C,         1, INIT_NORMAL, 1)          \
    X(expfcw,   "(L, E, 2F, C)",  (size_t)L * E * 2 * F * C, 1, INIT_NORMAL, 1)          \
    X(expprojw, "(L, E, C, F)",   (size_t)L * E * C * F,     1, INIT_NORMAL_RESIDUAL, 1) \
    LLAMA3_HEAD_PARAMETERS(X)

#define LLMC_MIXTRAL_INDEX(name, ...) MIXTRAL_P_##name,
enum { MIXTRAL_PARAMETERS(LLMC_MIXTRAL_INDEX) MIXTRAL_NUM_PARAMETERS };
#undef LLMC_MIXTRAL_INDEX

/* X(name, shape, numel, memory kind, per layer?); every activation stored. NK = B T K routed rows:
 * route_* hold each (token, slot)'s expert (an integer in a float), weight and row of the grouped
 * buffers; moe_* are the grouped (permuted) rows, expert by expert, tokens in position order. */
#define MIXTRAL_ACTIVATIONS(X)                                                   \
    LLAMA3_TRUNK_ACTIVATIONS(X)                                                 \
    X(router_probs, "(L, B, T, E)",  (size_t)B * T * E,      ACT_STATS, 1)        \
    X(route_expert, "(L, B, T, K)",  (size_t)B * T * K,      ACT_STATS, 1)        \
    X(route_weight, "(L, B, T, K)",  (size_t)B * T * K,      ACT_STATS, 1)        \
    X(route_row,    "(L, B, T, K)",  (size_t)B * T * K,      ACT_STATS, 1)        \
    X(expert_count, "(L, E)",        (size_t)E,              ACT_STATS, 1)        \
    X(moe_x,     "(L, NK, C)",       (size_t)B * T * K * C,  ACT_MLP, 1)          \
    X(moe_h,     "(L, NK, 2F)",      (size_t)B * T * K * 2 * F, ACT_MLP, 1)       \
    X(moe_swiglu, "(L, NK, F)",      (size_t)B * T * K * F,  ACT_GELU, 1)         \
    X(moe_y,     "(L, NK, C)",       (size_t)B * T * K * C,  ACT_MLP, 1)          \
    LLAMA3_HEAD_ACTIVATIONS(X)

#define LLMC_MIXTRAL_AINDEX(name, ...) MIXTRAL_A_##name,
enum { MIXTRAL_ACTIVATIONS(LLMC_MIXTRAL_AINDEX) MIXTRAL_NUM_ACTIVATIONS };
#undef LLMC_MIXTRAL_AINDEX

size_t mixtral_parameter_specs(const MixtralConfig *cfg, TensorSpec specs[MIXTRAL_NUM_PARAMETERS]);
size_t mixtral_activation_specs(const MixtralConfig *cfg, int B, int T, TensorSpec specs[MIXTRAL_NUM_ACTIVATIONS]);
/* Random init by the table's rules (llama_init_parameters': padded vocabulary rows 0). */
void mixtral_init_parameters(const MixtralConfig *cfg, const TensorSpec specs[MIXTRAL_NUM_PARAMETERS], float *params,
                             unsigned long long seed);
/* Total and active (per token: K of the E experts) parameter counts. */
size_t mixtral_active_parameters(const MixtralConfig *cfg);
/* Training flops per token: 6 * active parameters + 6LCT (the attention term as the Llama's). */
double mixtral_flops_per_token(const MixtralConfig *cfg, int T);

/* Expert parallelism (-ep ways, llmc/cpu/moe_ep.h): a rank's table, every row as the whole
 * table's but the expert rows (expfcw, expprojw) holding E / ways experts a layer, placed back
 * to back as usual; its total returned. mixtral_shard_copy copies between the whole arena and
 * shard `shard`'s (experts [shard E/ways, +E/ways) of every layer): whole -> local (to_local 1)
 * or back; experts_only: the expert rows alone (a shard's expert rows received by themselves
 * pass local = buffer - the shard table's expfcw offset). */
size_t mixtral_shard_parameter_specs(const MixtralConfig *cfg, int ways, TensorSpec specs[MIXTRAL_NUM_PARAMETERS]);
void mixtral_shard_copy(const MixtralConfig *cfg, int ways, int shard, float *whole, float *local, int to_local,
                        int experts_only);

#ifdef __cplusplus
}
#endif
#endif
