/*
 * zero.h (CPU) - ZeRO-2/3 for any architecture's parameter table: the buckets a CPU backward
 * hands to the trainer's optimizer (llmc/train/optim.h) and the per-layer parameter gathers of -z 3.
 *
 * Buckets: the outer bucket holds the tensors outside the layers (GPT-2: wte, wpe, lnfw, lnfb;
 * Llama: wte, lnfw, lm_head), a layer's bucket that layer's slice of every stacked tensor; both
 * packed in table order (= flat offset order). pos[i] is tensor i's place in its bucket.
 *
 * -z >= 2: the gradient arena holds the outer bucket (filled through the whole backward) then
 * one layer's bucket, each handed to hooks.reduce when complete. -z 3: the model keeps only its
 * rank's shard of the flat parameters (dist_shard); gather_memory holds the outer bucket's
 * parameters, then two layers' (the one in use and the next, prefetched).
 */
#ifndef LLMC_CPU_ZERO_H
#define LLMC_CPU_ZERO_H

#include "llmc/dist/dist.h"
#include "llmc/models/gpt2.h"
#include "llmc/core/mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the trainer's optimizer does with a bucket. reduce: the bucket's gradients (packed) are
 * complete for this micro-step. gather_begin/_end (-z 3): the bucket's parameters into packed
 * from the shards, nonblocking in slot 0..2 (0/1: layers, 2: the outer bucket). */
typedef struct {
    void *ctx;
    void (*reduce)(void *ctx, float *packed, const Bucket *b);
    void (*gather_begin)(void *ctx, float *packed, const Bucket *b, int slot);
    void (*gather_end)(void *ctx, int slot);
} CpuShardHooks;

enum { CPU_ZERO_MAX_TENSORS = BUCKET_MAX_SLICES };

typedef struct {
    int zero; /* 0 (or 1): whole gradients and parameters; 2 or 3 after cpu_zero_shard */
    CpuShardHooks hooks;
    const TensorSpec *specs; /* the model's parameter table (num_specs tensors, L layers) */
    int num_specs, num_layers;
    size_t outer_numel, layer_numel, pos[CPU_ZERO_MAX_TENSORS];
    float *gather_memory;    /* -z 3 */
    size_t gather_floats;
    const float *cur_params; /* the gathered layer in use (-z 3), else NULL */
    float *cur_grads;        /* the layer's gradient bucket in use (-z >= 2), else NULL */
} CpuZero;

/* The classes -z zero (>= 2) changes for rank `rank` of `ranks`: gradients (the two buckets) and,
 * -z 3, parameters (the shard) and the gathered buckets. */
void cpu_zero_plan(const TensorSpec *specs, int num_specs, size_t num_parameters, int zero, int ranks, int rank, MemPlan *p);

/* -z 2 or 3 (else nothing): frees the whole gradients *grads for the bucket buffers and, -z 3,
 * keeps only this rank's shard of *params plus the gather buffers; sizes are cpu_zero_plan's and
 * *params_floats / *grads_floats say what is allocated. specs must outlive z. */
void cpu_zero_shard(CpuZero *z, const TensorSpec *specs, int num_specs, int num_layers, size_t num_parameters, int zero,
                    int ranks, int rank, CpuShardHooks hooks, float **params, size_t *params_floats, float **grads,
                    size_t *grads_floats);
void cpu_zero_free(CpuZero *z);

/* Tensor i's layer-l view: in the bucket in use (cur) for a layer tensor, in the outer bucket
 * (outer, when it is packed) for the others, else in the whole arena. */
static inline float *cpu_zero_view(const CpuZero *z, const TensorSpec *specs, int i, int l, float *arena, const float *cur,
                                   float *outer) {
    const TensorSpec *s = &specs[i];
    if (s->layer_numel) return cur ? (float *)cur + z->pos[i] : tensor_layer(arena, s, l);
    return outer ? outer + z->pos[i] : arena + s->offset;
}

/* A parameter's layer-l view (-z 3: in the gathered buckets) and its gradient's (-z >= 2: in the
 * bucket being filled; grads NULL, a frozen base: NULL), as every block sequence reads them. */
static inline float *cpu_zero_param_view(const CpuZero *z, const TensorSpec *specs, int i, int l, float *params) {
    return cpu_zero_view(z, specs, i, l, params, z->cur_params, z->zero == 3 ? z->gather_memory : NULL);
}
static inline float *cpu_zero_grad_view(const CpuZero *z, const TensorSpec *specs, int i, int l, float *grads) {
    return grads ? cpu_zero_view(z, specs, i, l, grads, z->cur_grads, z->zero >= 2 ? grads : NULL) : NULL;
}

/* The forward's hooks (-z 3; nothing otherwise): the outer parameters gathered (they stay for
 * the backward that may follow), layer l's gather started, layer l in use (its gather waited
 * for, layer next's started). */
void cpu_zero_gather_outer(CpuZero *z);
void cpu_zero_prefetch_layer(CpuZero *z, int l);
void cpu_zero_use_layer(CpuZero *z, int l, int next);
/* The backward's hooks: begin (the top layer's gather started, the outer gradients cleared),
 * layer_grads (layer l's bucket cleared and in use, -z >= 2), reduce_layer (layer l's bucket
 * handed to the optimizer), end_layers (no layer in use), reduce_outer (the outer bucket). */
void cpu_zero_backward_begin(CpuZero *z, float *grads);
void cpu_zero_layer_grads(CpuZero *z, float *grads);
void cpu_zero_reduce_layer(CpuZero *z, int l);
void cpu_zero_end_layers(CpuZero *z);
void cpu_zero_reduce_outer(CpuZero *z, float *grads);

#ifdef __cplusplus
}
#endif
#endif
