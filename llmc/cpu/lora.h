/*
 * lora.h (CPU) - a model's LoRA adapters at run time: the adapter's parameter and gradient arenas
 * (llmc/models/lora.h's table), the saved A x of every targeted module and layer, and the two ops
 * a block sequence calls around each base matmul of a targeted site:
 *   forward:  out[:, off:off+out] += scale * (x A^T) B^T        (after the base matmul, before any
 *             in-place op on out such as RoPE)
 *   backward: d(xa) = scale * dout B; dB += scale * dout^T xa; dA += d(xa)^T x; dx += d(xa) A
 *             (after the base matmul's backward, which overwrites dx)
 * The base stays frozen: the block sequence allocates no gradient arena for it (model->lora set).
 * DoRA (cfg.dora; llmc/models/lora.h): the site's slice y = W x + b (the base matmul's) becomes
 *   forward:  n = ||W + scale B A|| per row (this forward's A, B), g = m / n, v = y - b + scale (x A^T) B^T,
 *             y = g v + b (training keeps v and g)
 *   backward: dm += (dout . v) / n summed over the rows of the batch; the LoRA backward above with
 *             g dout for dout; dx += ((g - 1) dout) W (the base matmul's backward gave dout W)
 * which needs the base weights and biases (lora_run_set_base).
 * Prompt tuning (cfg.prompt_tokens = P; no sites): the model runs P + T positions, the caller's
 * inputs hold any token at the first P of each row (lora_prompt_inputs); the two ops at the input:
 *   forward:  encoded[b, p] = prompt[p] (+ wpe[p] for GPT-2), p < P (after the embedding lookup)
 *   backward: dprompt[p] += sum_b dencoded[b, p] (the gradient reaching the block stack's input)
 */
#ifndef LLMC_CPU_LORA_H
#define LLMC_CPU_LORA_H

#include <stddef.h>

#include "llmc/models/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct LoraRun {
    LoraConfig cfg;
    float *params, *grads; /* cfg.num_parameters each (grads: when training) */
    float *xa;             /* (module, layer): N x R each, the forward's A x */
    float *dxa;            /* N x R backward scratch */
    float *gain;           /* DoRA, (module, layer): out floats each, g = m / n, then out floats 1 / n (0 where n = 0);
                            * without gradients (inference) computed at the first forward only */
    float *v;              /* DoRA training, (module, layer): N x out each, the forward's v */
    float *dg;             /* DoRA training: N x max(out) backward scratch */
    size_t xa_floats;
    int N;                 /* the allocated B * T */
    const float *base;     /* DoRA: the frozen base's parameters and their table (lora_run_set_base) */
    const TensorSpec *base_specs;
    int num_base_specs;
} LoraRun;

/* The adapter's parameters (MEM_PARAMETERS), initialised from seed as PEFT does. */
void lora_run_init(LoraRun *r, const LoraConfig *cfg, unsigned long long seed);
/* DoRA: the base model's parameters (base, its table specs, n entries) the sites read W and b from;
 * with fresh adapters (no adapter directory) also sets the magnitudes to W's row norms (init 1). */
void lora_run_set_base(LoraRun *r, const float *base, const TensorSpec *specs, int n, int init);
/* Activations for B * T rows (MEM_ACTIVATIONS) and, training, the gradients (MEM_GRADIENTS) and scratch. */
void lora_run_allocate(LoraRun *r, int B, int T, int training);
void lora_run_free(LoraRun *r);
/* Bytes lora_run_init + lora_run_allocate take, by class (the memory plan). */
size_t lora_plan_activations(const LoraConfig *cfg, int B, int T, int training);

/* Prompt tuning's ops (no-ops without it): encoded, dencoded (B, T, C) with T = P + the sequence;
 * wpe (T, C) or NULL (the Llama: no learned positions). */
void lora_prompt_forward(LoraRun *r, float *encoded, const float *wpe, int B, int T, int C);
void lora_prompt_backward(LoraRun *r, const float *dencoded, int B, int T, int C);
/* Prompt tuning's batch: inputs, targets (B, T) -> out_inputs, out_targets (B, P + T), the first P of
 * each row token 0 (replaced by the prompt in the forward) and target 0 (masked: lora_prompt_mask). */
void lora_prompt_inputs(const LoraConfig *cfg, const int *inputs, const int *targets, int B, int T, int *out_inputs,
                        int *out_targets);
/* After a forward over (B, P + T) with targets: the mean of the losses over the B * T real positions;
 * dlogits (B, P + T, Vp), when not NULL, zeroed at the P prompt positions (no loss there). */
float lora_prompt_mask(const LoraConfig *cfg, const float *losses, float *dlogits, int B, int T, int Vp);

/* The ops of every targeted module at `site` of layer l: out (N, width) the site's output, inp (N, in). */
void lora_forward_site(LoraRun *r, int site, int l, float *out, int width, const float *inp, int N);
void lora_backward_site(LoraRun *r, int site, int l, float *dinp, const float *dout, int width, const float *inp, int N);

#ifdef __cplusplus
}
#endif
#endif
