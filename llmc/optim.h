/*
 * optim.h - the training loop's optimizer: AdamW over host fp32 parameters and gradients, its
 * moments sharded over the ranks of the run (ZeRO), and the loss normalisation of a step.
 *
 * The backend only computes gradients (TrainBackend.host_grads); this module reduces them over
 * the ranks, computes the global gradient norm, applies AdamW to the shard this rank owns, and
 * gathers the updated parameters back to every rank.
 *
 *   -z 0: every rank keeps all of m and v; gradients all-reduced; every rank updates everything.
 *   -z 1: m and v sharded (dist.h's shards); gradients all-reduced; each rank updates its shard
 *         of the parameters, then the parameters are all-gathered.
 *   -z 2: as 1, but the gradients are reduce-scattered: a rank holds only its shard of the summed
 *         gradient (the CPU backward still accumulates the micro-steps into a full-size buffer).
 *   -z 3 (parameters sharded too) is not built: optim_init refuses it.
 * Every reduction is deterministic and identical on every rank (reduce-scatter in rank order then
 * all-gather), so the ranks never drift apart; against one process the sums differ only in the
 * order of float additions.
 *
 * Loss normalisation: a micro-step's loss gradient is weighted by optim_loss_weight (1 / (accum
 * steps x ranks)), so the summed gradient is that of the mean loss over the global batch.
 */
#ifndef LLMC_OPTIM_H
#define LLMC_OPTIM_H

#include <stddef.h>
#include <stdio.h>

#include "dist.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Dist *dist;
    int zero;
    size_t n;            /* parameters */
    size_t lo, hi;       /* the range of m, v (and of the parameters) this rank updates */
    float *m, *v;        /* hi - lo floats each */
    float *gshard;       /* -z 2: this rank's shard of the summed gradient */
    const TensorSpec *specs; /* the parameter table: offsets and weight decay choice */
    int num_specs;           /* its entries (the architecture's table) */
} Optimizer;

/* The highest ZeRO stage optim_init builds (--memory-budget searches up to it). */
enum { OPTIM_MAX_ZERO = 2 };

/* Dies on -z 3 (not built) with a message. */
void optim_init(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs);
void optim_free(Optimizer *o);
/* Floats of m (and of v, and of the -z 2 gradient shard) that rank allocates: the plan's and
 * optim_init's one rule. */
size_t optim_shard_floats(size_t n, int zero, int ranks, int rank);
float optim_loss_weight(const Optimizer *o, int accum);
/* Sums grads over the ranks (all of them, or this rank's shard for -z 2). */
void optim_reduce(Optimizer *o, float *grads);
/* The global L2 norm of the summed gradients, the same on every rank. */
float optim_grad_norm(Optimizer *o, const float *grads);
/* AdamW step t >= 1 on the summed gradients times grad_scale; then every rank has all the
 * updated parameters. */
void optim_step(Optimizer *o, float *params, const float *grads, float lr, float beta1, float beta2, float eps,
                float weight_decay, int t, float grad_scale);
/* Whole m and v (n floats each) for a checkpoint: gathered into m, v on rank 0 (others: unused). */
void optim_gather_state(Optimizer *o, float *m, float *v);
/* This rank's part of a checkpoint's whole m and v. */
void optim_load_state(Optimizer *o, const float *m, const float *v);
/* The per-rank optimizer memory table. */
void optim_print_memory(const Optimizer *o, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
