/*
 * training.h (CPU) - what every CPU model's run-time struct carries for training, beside its
 * tables and arenas: one layer's backward scratch, the last forward's loss, the ZeRO-2/3 state,
 * the LoRA adapters and the arena sizes as allocated. The block sequences (gpt2.c, llama.c, mlp.c)
 * say what each scratch buffer holds for their architecture.
 */
#pragma once

#include <stddef.h>
#include <stdio.h>

#include "llmc/cpu/zero.h"

struct LoraRun;
struct QBase;

typedef struct {
    /* backward scratch, one layer's worth, reused by every layer: dresidual (B,T,C), the gradient
     * of the residual stream, flows from the top down; dbuf_c (B,T,C), dbuf_f1, dbuf_f2: the
     * architecture's (its header says) */
    float *dresidual, *dbuf_c, *dbuf_f1, *dbuf_f2, *scratch_memory;
    size_t num_scratch;
    float mean_loss;
    /* ZeRO-2/3 (the model's *_shard; zs.zero 0: whole gradients and parameters): zero.h's buckets
     * and gathers over the model's table; params_floats / grads_floats: the arenas as allocated */
    CpuZero zs;
    size_t params_floats, grads_floats;
    /* LoRA adapters (llmc/cpu/lora.h; NULL: none), set before allocate: the base is then frozen (no
     * gradient arena; the backward computes the adapters' gradients and the inputs' only) */
    struct LoraRun *lora;
    /* the -r level the activations were allocated for (the Llama family's; 0: every one stored) */
    int recompute;
    /* a quantised frozen base (llmc/cpu/qbase.h; NULL: fp32): the block sequences' site matmuls
     * (cpu_site_matmul_forward / _backward) read its codes instead of the fp32 weights */
    struct QBase *qbase;
} CpuTraining;

/* The training fields' buffers freed with the parameter and gradient arenas (params_floats and
 * grads_floats long) and the activation arena (acts_floats long; NULL: not allocated). */
void cpu_training_free(CpuTraining *tr, float *params, float *grads, float *acts, size_t acts_floats);
/* The startup memory line of a CPU model: "memory (CPU, fp32, <what>): parameters N (<note>X MiB),
 * ..., gradients, activations by kind (act_specs, n_acts), backward scratch"; note may be "". */
void cpu_training_print_memory(FILE *out, const char *what, size_t num_parameters, const char *note,
                               const TensorSpec *act_specs, int n_acts, const CpuTraining *tr, int has_grads);
/* The gradient arena for num_parameters (MEM_GRADIENTS; grads_floats set). */
float *cpu_training_alloc_grads(CpuTraining *tr, size_t num_parameters);
/* ZeRO -z 2/3 over a model's table (zero.h's cpu_zero_shard with the arenas kept in tr). */
void cpu_training_shard(CpuTraining *tr, const TensorSpec *specs, int num_specs, int num_layers, size_t num_parameters,
                        int zero, int ranks, int rank, CpuShardHooks hooks, float **params, float **grads);
/* The backward scratch as the plan sized it (MEM_BWD_SCRATCH): dresidual and dbuf_c, (N, C) each,
 * first; returns the rest (the architecture's dbuf_f1, dbuf_f2, ... go there). */
float *cpu_training_alloc_scratch(CpuTraining *tr, const MemPlan *plan, size_t N, size_t C);
