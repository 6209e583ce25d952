/*
 * epopt.h - the host AdamW of an expert-parallel Mixtral run (-ep N, llmc/cpu/moe_ep.h has the
 * rank layout) as a TrainOptimizer: over this rank's parameter table (every tensor but the
 * experts whole, the experts of its shard), with
 *   - the gradients of the non-expert tensors summed over all P ranks, those of the experts over
 *     the D = P / N ranks holding the same experts (dist.h's group all-reduce);
 *   - -z 0: m and v for the rank's table; -z 1: the non-expert tensors' moments sharded over the P
 *     ranks, the experts' over their D replicas, the updated parameters all-gathered over the same
 *     groups; -z 2: also the summed gradients (the backward hands its buckets over, a layer at a
 *     time; each tensor's slice is all-reduced over its group and this rank's part kept); -z 3 is
 *     refused by cli.c;
 *   - checkpoints of the whole model: rank 0 gathers the experts (and their moments) of the N
 *     shards into the usual whole Mixtral and state file, so a run resumes on any -ep and rank
 *     count (load_end keeps this rank's shard of the whole moments; the model file is loaded whole
 *     and cut by mixtral_set_expert_parallel).
 * The global gradient norm sums every parameter once (the non-expert ones of rank 0, the experts
 * of ranks 0 .. N - 1), the same on every rank.
 */
#ifndef LLMC_TRAIN_EPOPT_H
#define LLMC_TRAIN_EPOPT_H

#include <stdio.h>

#include "llmc/core/mem.h"
#include "llmc/dist/dist.h"
#include "llmc/models/mixtral.h"
#include "llmc/train/backend.h"
#include "llmc/train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t off, len, lo, hi; /* a run of the rank's arena and the part of it this rank updates */
} EpRegion;

typedef struct {
    Dist *dist;
    TrainBackend *be; /* host_params / host_grads: this rank's arena */
    MixtralConfig cfg;
    int ways, shard, group, replicas, zero;
    size_t n, n_whole;
    TensorSpec specs[MIXTRAL_NUM_PARAMETERS]; /* this rank's table */
    EpRegion reg[3]; /* [0, xa) and [xb, n): over all ranks; [xa, xb) the experts: over the replicas */
    int *replica;    /* the D ranks holding this rank's experts */
    float *m, *v;    /* the regions' [lo, hi) back to back */
    float *gshard;   /* -z 2: the summed gradient's same runs */
    size_t k;
} EpAdamW;

/* The optimizer for tc (-z 0, 1 or 2) over be's arena of the -ep ways shard table of cfg. -z 2: the
 * model's gradient buckets go to ep_adamw_reduce_bucket (its ctx: h; llmc/cpu/zero.h's reduce hook). */
void ep_adamw_open(TrainOptimizer *o, EpAdamW *h, const TrainConfig *tc, TrainBackend *be, Dist *d,
                   const MixtralConfig *cfg, int ways);
void ep_adamw_reduce_bucket(void *h, float *packed, const Bucket *b);
/* The plan's classes of it (AdamW m and v; the checkpoint's transient gathers) for rank `rank`. */
void ep_adamw_plan(const MixtralConfig *cfg, int ways, int zero, int ranks, int rank, int checkpoints, MemPlan *p);
/* --plan's text: the expert shards, the per-rank parameters and the all-to-all buffers. */
void ep_plan_print(const MixtralConfig *cfg, int ways, int ranks, int B, int T, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
