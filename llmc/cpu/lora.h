/*
 * lora.h (CPU) - a model's LoRA adapters at run time: the adapter's parameter and gradient arenas
 * (llmc/models/lora.h's table), the saved A x of every targeted module and layer, and the two ops
 * a block sequence calls around each base matmul of a targeted site:
 *   forward:  out[:, off:off+out] += scale * (x A^T) B^T        (after the base matmul, before any
 *             in-place op on out such as RoPE)
 *   backward: d(xa) = scale * dout B; dB += scale * dout^T xa; dA += d(xa)^T x; dx += d(xa) A
 *             (after the base matmul's backward, which overwrites dx)
 * The base stays frozen: the block sequence allocates no gradient arena for it (model->lora set).
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
    size_t xa_floats;
    int N;                 /* the allocated B * T */
} LoraRun;

/* The adapter's parameters (MEM_PARAMETERS), initialised from seed as PEFT does. */
void lora_run_init(LoraRun *r, const LoraConfig *cfg, unsigned long long seed);
/* Activations for B * T rows (MEM_ACTIVATIONS) and, training, the gradients (MEM_GRADIENTS) and scratch. */
void lora_run_allocate(LoraRun *r, int B, int T, int training);
void lora_run_free(LoraRun *r);
/* Bytes lora_run_init + lora_run_allocate take, by class (the memory plan). */
size_t lora_plan_activations(const LoraConfig *cfg, int B, int T, int training);

/* The ops of every targeted module at `site` of layer l: out (N, width) the site's output, inp (N, in). */
void lora_forward_site(LoraRun *r, int site, int l, float *out, int width, const float *inp, int N);
void lora_backward_site(LoraRun *r, int site, int l, float *dinp, const float *dout, int width, const float *inp, int N);

#ifdef __cplusplus
}
#endif
#endif
