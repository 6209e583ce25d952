/*
 * llama.h (CPU) - the Llama 3 block sequence on the CPU over the tables in llmc/llama.h
 * (fp32, every activation stored; no recompute levels yet). Same contract as llmc/cpu/model.h:
 * llama_forward with targets and dloss != 0 leaves dlogits in the logits activation and
 * llama_backward must follow; llama_backward accumulates into grads.
 */
#ifndef LLMC_CPU_LLAMA_H
#define LLMC_CPU_LLAMA_H

#include "../llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    LlamaConfig cfg;
    TensorSpec param_specs[LLAMA3_NUM_PARAMETERS];
    size_t num_parameters;
    float *params_memory, *grads_memory;
    int B, T;
    TensorSpec act_specs[LLAMA3_NUM_ACTIVATIONS];
    size_t num_activations;
    float *acts_memory;
    float *freqs; /* RoPE cos/sin (T, HS/2, 2) for the allocated T */
    /* backward scratch, one layer's worth: dresidual (B,T,C) flows from the top down; dbuf_c
     * (B,T,C): dln2, then datty, then dln1; dbuf_f1 (B,T,max(2F,QKV)): dfch, later dqkv;
     * dbuf_f2 (B,T,F): dfch_swiglu. */
    float *dresidual, *dbuf_c, *dbuf_f1, *dbuf_f2, *scratch_memory;
    float mean_loss;
} LlamaModel;

/* cfg must pass llama_config_validate; params random (seeded) or loaded by the caller. */
void llama_build(LlamaModel *model, const LlamaConfig *cfg);
void llama_allocate(LlamaModel *model, int B, int T);
float llama_forward(LlamaModel *model, const int *inputs, const int *targets, int B, int T, float dloss);
void llama_backward(LlamaModel *model, const int *inputs, int B, int T);
void llama_free(LlamaModel *model);

#ifdef __cplusplus
}
#endif
#endif
