/*
 * lora.h - LoRA adapters (Hu et al.; Hugging Face PEFT's names and rules): which linear modules of
 * a model an adapter can target, PEFT's suffix matching of --lora-targets, the scale, and the
 * adapter's own parameter table (one (A, B) pair per targeted module, each stacked over the L
 * layers). Backend-independent: the CPU ops are llmc/cpu/lora.h, the files llmc/formats/adapter.h.
 *
 * A module is one of PEFT's nn.Linear / Conv1D names inside a block. Our weights fuse some of them:
 * GPT-2's c_attn is our qkvw whole (PEFT too has one c_attn adapter over q|k|v); the Llama's
 * q_proj, k_proj and v_proj are row blocks of qkvw and gate_proj, up_proj of fcw (gate first). An
 * adapter on a row block adds to that slice of the fused matmul's output only, as PEFT's separate
 * module computes. The output h = W x + scale * B (A x), A [R, in], B [out, R]; scale = alpha / R,
 * rsLoRA alpha / sqrt(R). PEFT's initialisation: A Kaiming-uniform (a = sqrt(5): U(-1/sqrt(in),
 * 1/sqrt(in))), B = 0, so step 0 computes exactly the base model.
 *
 * Our Llama's q and k rows are interleaved per head (RoPE pairs, llmc/formats/hf.c), HF's are in
 * rotate-half order: a q_proj / k_proj adapter's B rows are kept in our order and permuted on the
 * way to and from PEFT's files (lora_peft_row).
 *
 * DoRA (Liu et al.; PEFT's use_dora): each targeted module also has a magnitude vector m [out]
 * (initialised to the row norms of W), and its output is g * (W x + scale * B (A x)) + bias with
 * g = m / n per output row, n = ||W + scale B A|| per output row over the input features, taken as a
 * constant in the backward (detached, as PEFT does). A row where W + scale B A is all zero (n = 0:
 * PEFT 0.13.2 computes 0/0 = NaN there) gets g = 0 and no gradient: it outputs its bias only, as its
 * merged weight g (W + scale B A) = 0 does (lora_dora_gain).
 *
 * Prompt tuning (Lester et al.; PEFT's PROMPT_TUNING, task_type CAUSAL_LM) is the other adapter kind
 * this table holds (prompt_tokens > 0, no modules): P trained soft token embeddings
 * "prompt_embeddings" [P, C] put in place of the token embeddings of P extra positions in front of
 * every sequence, at the input only (GPT-2 still adds wpe[0..P); the Llama's RoPE positions are
 * 0..P+T-1), the loss over the T real positions only. Initialised as PEFT's RANDOM init (an
 * nn.Embedding's N(0, 1)), from a seeded draw.
 */
#ifndef LLMC_MODELS_LORA_H
#define LLMC_MODELS_LORA_H

#include <stddef.h>

#include "llmc/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The models LoRA knows: the module names differ. */
typedef enum { LORA_FAMILY_NONE, LORA_FAMILY_GPT2, LORA_FAMILY_LLAMA } LoraFamily;

/* Where a module's matmul sits in a block: the fused output it adds to. */
typedef enum { LORA_SITE_QKV, LORA_SITE_ATTPROJ, LORA_SITE_FC, LORA_SITE_FCPROJ, LORA_NUM_SITES } LoraSite;

enum { LORA_MAX_MODULES = 7, LORA_MAX_RANK = 4096 };

typedef struct {
    const char *name;  /* PEFT's module name: "c_attn", "q_proj" */
    const char *path;  /* its path inside a block: "attn.c_attn", "self_attn.q_proj" */
    int site;          /* LoraSite */
    int in, out;       /* A [R, in], B [out, R] */
    int out_offset;    /* the first column of the site's output it adds to */
    int rope_rows;     /* 1: q_proj / k_proj of the Llama (B rows permuted in PEFT's files) */
} LoraModule;

typedef struct {
    int family;        /* LoraFamily */
    int rank;          /* R */
    float alpha;       /* lora_alpha */
    int rslora;        /* use_rslora */
    int dora;          /* use_dora: a magnitude vector per module */
    float scale;       /* alpha / R, or alpha / sqrt(R) */
    int num_layers, head_size; /* L; HS for the RoPE row order */
    int num_modules;   /* the targeted modules, in the family's order */
    LoraModule modules[LORA_MAX_MODULES];
    /* A then B per module (specs[2 m], specs[2 m + 1]), stacked over L, then with DoRA the magnitudes
     * (specs[2 num_modules + m], (L, out)); every one decays */
    TensorSpec specs[3 * LORA_MAX_MODULES];
    int num_specs;
    int prompt_tokens; /* prompt tuning: P (specs[0] is prompt_embeddings (P, C), no modules); 0 = LoRA */
    int token_dim;     /* prompt tuning: C */
    size_t num_parameters;
} LoraConfig;

/* PEFT's default target_modules for the family (peft 0.13.2's
 * TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING): "c_attn" for GPT-2, "q_proj,v_proj" for Llama. */
const char *lora_default_targets(int family);
/* The family's module names as a list ("c_attn, attn.c_proj, ..."), for messages. */
void lora_module_names(int family, char *out, size_t len);

/* Fills lc for a model of shape cfg: targets is a comma-separated list of PEFT target names, each
 * matching the modules whose path equals it or ends with "." + it (PEFT's rule; "c_proj" matches
 * both of GPT-2's), or "all-linear" (every linear layer but the output head); "" takes PEFT's
 * default. Returns 0, or -1 with a message naming the flag in err: rank outside 1..min(in, out)
 * of a targeted module, a target that matches no module, alpha not positive. */
int lora_config_build(LoraConfig *lc, int family, const ModelConfig *cfg, int rank, float alpha, int rslora, int dora,
                      const char *targets, char *err, size_t errlen);
/* Fills lc for prompt tuning with P soft tokens on a model of shape cfg running sequences of T
 * tokens: returns 0, or -1 with a message naming the flags in err (P < 1, P + T > maxT). */
int lora_prompt_config_build(LoraConfig *lc, int family, const ModelConfig *cfg, int P, int T, char *err, size_t errlen);
/* The targets as PEFT's adapter_config.json lists them: module names, comma-separated. */
void lora_target_names(const LoraConfig *lc, char *out, size_t len);

/* PEFT's key of module m's A (which 0), B (which 1) or DoRA magnitude (which 2) in layer l:
 * "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight" (GPT-2),
 * "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight" (Llama),
 * "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector" (no ".weight": PEFT's file). */
void lora_peft_key(const LoraConfig *lc, int m, int l, int which, char *out, size_t len);
/* Row r of module m's output in PEFT's (HF's) order -> the row in ours (identity but for rope_rows). */
size_t lora_peft_row(const LoraConfig *lc, int m, size_t hf_row);

/* The DoRA magnitude table of module m (lc->dora). */
const TensorSpec *lora_magnitude_spec(const LoraConfig *lc, int m);
/* The base table's (specs, n) weight of a site (qkvw, attprojw, fcw, fcprojw) and its bias (qkvb, ...;
 * NULL where the model has none). */
const TensorSpec *lora_site_weight(const TensorSpec *specs, int n, int site);
const TensorSpec *lora_site_bias(const TensorSpec *specs, int n, int site);
/* DoRA: norms[r] = ||W[r] + scale * B[r] A|| over the input features, for each of module m's output rows
 * (W: the module's rows of its site's weight, (out, in); A (R, in), B (out, R)), summed in double. */
void lora_dora_norms(const LoraConfig *lc, int m, const float *A, const float *B, const float *W, float *norms);
/* g = m / n, and 0 where n = 0 (the direction W + scale B A is all zero: no NaN, no gradient). */
static inline float lora_dora_gain(float magnitude, float norm) { return norm > 0.0f ? magnitude / norm : 0.0f; }
/* DoRA's initial magnitudes (PEFT's): each module's row norms of W + scale B A (with B = 0: of W),
 * the base (base, specs, n) given as for lora_merge. */
void lora_dora_init(const LoraConfig *lc, float *adapter, const TensorSpec *specs, int n, const float *base);

/* Merges the adapter into the base: each targeted module's rows of its site's weight (the base table
 * specs, n rows, looked up by name: qkvw, attprojw, fcw, fcprojw) get W += scale * B A (DoRA:
 * W = g (W + scale B A), g = m / ||W + scale B A|| per row), in double and rounded once to fp32.
 * Returns the number of weights changed. */
size_t lora_merge(const LoraConfig *lc, const float *adapter, const TensorSpec *specs, int n, float *params);

/* The initial adapter: A Kaiming-uniform from seed (one stream per tensor), B zero. */
void lora_init_parameters(const LoraConfig *lc, float *params, unsigned long long seed);

#ifdef __cplusplus
}
#endif
#endif
