/*
 * training.h (CPU) - what every CPU model's run-time struct carries for training, beside its
 * tables and arenas: one layer's backward scratch, the last forward's loss, the ZeRO-2/3 state,
 * the LoRA adapters and the arena sizes as allocated. The block sequences (gpt2.c, llama.c, mlp.c)
 * say what each scratch buffer holds for their architecture.
 */
#pragma once

#include <stddef.h>

#include "llmc/cpu/zero.h"

struct LoraRun;

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
} CpuTraining;
