/*
 * optim.h - the training loop's optimizer: AdamW over host fp32 parameters and gradients, its
 * moments sharded over the ranks of the run (ZeRO), and the loss normalisation of a step.
 *
 * The backend only computes gradients (TrainBackend.hostopt.host_grads); this module reduces them over
 * the ranks, computes the global gradient norm, applies AdamW to the shard this rank owns, and
 * gathers the updated parameters back to every rank.
 *
 *   -z 0: every rank keeps all of m and v; gradients all-reduced; every rank updates everything.
 *   -z 1: m and v sharded (dist.h's shards); gradients all-reduced; each rank updates its shard
 *         of the parameters, then the parameters are all-gathered.
 *   -z 2: as 1, but a rank holds only its shard of the summed gradient: the backend hands each
 *         bucket's gradients to optim_reduce_bucket as its backward produces them (a layer at a
 *         time), which reduce-scatters them and adds this rank's part into the shard; no
 *         full-size gradient buffer (the micro-steps accumulate into the shard).
 *   -z 3: as 2, and the parameters are sharded too: this rank keeps only its shard (updated in
 *         place, no all-gather after the step); the backend gathers a bucket's parameters before
 *         it uses them (optim_gather_bucket_begin/_end, nonblocking: the next layer prefetched).
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

#include "llmc/core/logger.h"
#include "llmc/dist/dist.h"
#include "llmc/formats/statefile.h"
#include "llmc/models/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Optimizer {
    Dist *dist;
    int zero;
    size_t n;            /* parameters */
    size_t lo, hi;       /* the range of m, v (and of the parameters) this rank updates */
    float *m, *v;        /* hi - lo floats each (fp32 states); compact states: their storage, cast */
    int state;           /* OptStateType (optstate.h): how m and v are stored */
    float *gshard;       /* -z >= 2: this rank's shard of the summed gradient */
    int *parts;          /* -z >= 2: per bucket call, every rank's counts then displacements (x 4 slots) */
    DistRequest gather[3]; /* -z 3: gathers in flight, by slot */
    const TensorSpec *specs; /* the parameter table: offsets and weight decay choice */
    int num_specs;           /* its entries (the architecture's table) */
    struct NvmeStore *nvme;  /* --offload-device nvme: m and v in a file (llmc/train/nvme.h); o->m, o->v NULL */
    Dist *tp;                /* -tp: the tensor-parallel group (dist/layout.h; dist is then the data-parallel
                              * one): the split tensors' squares are summed over it for the norm */
} Optimizer;

/* The highest ZeRO stage optim_init builds (--memory-budget searches up to it). */
enum { OPTIM_MAX_ZERO = 3 };

/* optim_init keeps fp32 moments; optim_init_state stores them as state (OptStateType: fp32,
 * bf16, int8; llmc/core/optstate.h). specs: the architecture's parameter table, num_specs entries. */
void optim_init(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs);
void optim_init_state(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs, int state);
/* The same with m and v in a file under nvme_dir (--offload-device nvme; NULL or "": in memory):
 * every step streams them through nvme.h's ring, the same bits as in memory; dies naming
 * --nvme-path when the directory does not take the file. */
void optim_init_nvme(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs, int state,
                     const char *nvme_dir);
/* Bytes of m (and of v) that rank allocates for moments stored as state: the plan's and
 * optim_init_state's one rule. */
size_t optim_moment_bytes(size_t n, int zero, int ranks, int rank, int state);
void optim_free(Optimizer *o);
float optim_loss_weight(const Optimizer *o, int accum);
/* Sums grads over the ranks (-z 0/1: all of them; -z >= 2: nothing left to do, the buckets were
 * reduced during the backward). --grad-compression: hostopt.c sums them through gradcomp.h instead. */
void optim_reduce(Optimizer *o, float *grads);
/* -z >= 2: clears the gradient shard (the start of a step). */
void optim_zero_grad(Optimizer *o);
/* -z >= 2: the bucket's gradients (packed, b->numel floats; overwritten) summed over the ranks
 * and this rank's part added into the gradient shard. */
void optim_reduce_bucket(Optimizer *o, float *packed, const Bucket *b);
/* -z 3: starts gathering the bucket's parameters into packed (b->numel floats) from every rank's
 * parameter shard (pshard: this rank's) into slot 0..2; _end waits for it. */
void optim_gather_bucket_begin(Optimizer *o, const float *pshard, float *packed, const Bucket *b, int slot);
void optim_gather_bucket_end(Optimizer *o, int slot);
/* The global L2 norm of the summed gradients, the same on every rank. */
float optim_grad_norm(Optimizer *o, const float *grads);
/* AdamW step t >= 1 on the summed gradients times grad_scale; then every rank has all the
 * updated parameters (-z 3: params is this rank's shard, updated in place). */
void optim_step(Optimizer *o, float *params, const float *grads, float lr, float beta1, float beta2, float eps,
                float weight_decay, int t, float grad_scale);
/* ---- the update in buckets (--offload optimizer, both trainers) ----
 * The parameters cut into the gradient buckets (dist.h), in the order the next forward needs
 * them: k = 0 is the outer bucket (embeddings, final LayerNorm), k = 1 .. L layer k - 1. Per
 * element the update is optim_step's (the same bits); only the gradient norm's summation order
 * differs (a sum of per-bucket partial sums, combined in bucket order: deterministic, but not
 * the bits of optim_grad_norm's sum over the flat array). */
int optim_num_buckets(const Optimizer *o);
void optim_bucket(const Optimizer *o, int k, Bucket *b);
/* Sum of squares of the bucket's gradients (grads: the whole flat array; non-finite stays so). */
double optim_bucket_sumsq(const float *grads, const Bucket *b);
/* The global L2 norm from the buckets' sums of squares: sumsq[k] (optim_num_buckets entries,
 * computed as the gradients arrived, valid only when nothing changes grads afterwards: one rank)
 * or, sumsq NULL, computed now from grads. -z >= 2: optim_grad_norm. */
float optim_grad_norm_buckets(Optimizer *o, const float *grads, const double *sumsq);
/* optim_step, bucket by bucket in the order above; after each bucket's parameters are final
 * (this rank's; -z 1 and 2: after one all-gather at the end) bucket_done(ctx, b) is called, so
 * that a backend can queue that bucket's copy to the device while the next one is updated.
 * bucket_done may be NULL. -z 3: optim_step, then bucket_done for each bucket. */
typedef void (*OptimBucketDone)(void *ctx, const Bucket *b);
void optim_step_buckets(Optimizer *o, float *params, const float *grads, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int t, float grad_scale, OptimBucketDone bucket_done, void *ctx);
/* Whole m and v (n floats each) for a checkpoint: gathered into m, v on rank 0 (others: unused).
 * Compact states are decoded to fp32 (the state file stays rank-count independent; see README). */
void optim_gather_state(Optimizer *o, float *m, float *v);
/* 1 when this rank already holds the whole of m and v in fp32 (-z 0 with fp32 states): a checkpoint
 * then writes o->m and o->v as they are, without a gathered copy (the plan counts no transient). */
int optim_state_is_whole(const Optimizer *o);
/* The one rule for both: whole fp32 moments need no checkpoint copy. */
int optim_state_whole_for(int zero, int state);
/* 1 when the checkpoint decodes the moments a chunk at a time into the state file (-z 0 with
 * compact states: the rank holds all of them; the plan counts one chunk, STATE_CHUNK floats). */
int optim_state_streamed_for(int zero, int state);
/* -z 0, compact states: elements [offset, offset + count) of m (is_v 0) or v decoded into x
 * (offset a multiple of OPTSTATE_BLOCK; statefile.h's StateMomentFn shape, ctx the Optimizer). */
const float *optim_moment_chunk(void *o, int is_v, size_t offset, size_t count, float *x);
/* -z 3: the whole parameters gathered from the shards (pshard) into full on rank 0. */
void optim_gather_params(Optimizer *o, const float *pshard, float *full);
/* This rank's part of a checkpoint's whole m and v (encoded when the states are compact). */
void optim_load_state(Optimizer *o, const float *m, const float *v);
/* The per-rank optimizer memory table. */
void optim_print_memory(const Optimizer *o, FILE *out);

/* ---- the optimizer of the training loop: one interface, two implementations ----
 * TrainOptimizer is what train_run asks of an optimizer, whoever keeps it: the loop's host AdamW
 * above (llmc/train/hostopt.h: over the backend's host gradients, ZeRO 1-3, --offload's buckets)
 * or a backend's own (the CUDA trainer's device AdamW, llmc/cuda/trainer.cuh). Per step: zero_grad
 * (after the backend cleared its gradients), the micro-steps with loss_weight, reduce (the summed
 * gradients over the ranks), grad_norm (the global norm, the same on every rank), then step or,
 * skipped, nothing. ctx is the implementation's; NULL ops do nothing. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int t;            /* the step, from 1 */
    float grad_scale; /* the clip factor on the summed gradients */
} AdamWStep;

/* The whole state for a checkpoint, on rank 0: m and v (num_parameters floats each, fp32) and the
 * parameters; whole_params: params holds every parameter on this rank (checked finite here).
 * m and v NULL: the moments come a chunk at a time from moment(moment_ctx, ...) instead (compact
 * states, decoded while the state file is written: statefile.h's state_file_save_chunks). */
typedef struct {
    float *m, *v, *params;
    int whole_params;
    int copies; /* the implementation's: what state_release frees */
    StateMomentFn moment;
    void *moment_ctx;
} OptimStateView;

typedef struct TrainOptimizer {
    void *ctx;
    int zero_max; /* the highest -z it shards */
    float (*loss_weight)(void *ctx, int accum); /* a micro-step's loss gradient weight */
    void (*zero_grad)(void *ctx);
    void (*reduce)(void *ctx);
    float (*grad_norm)(void *ctx);
    void (*step)(void *ctx, const AdamWStep *s);
    /* After the backend's sync_to_host: the state for a checkpoint (collective: every rank calls
     * it); state_release frees what state allocated. */
    void (*state)(void *ctx, OptimStateView *s);
    void (*state_release)(void *ctx, OptimStateView *s);
    /* Resume: load_begin gives buffers for the whole m and v (num_parameters floats) that the
     * state file is read into; load_end keeps this rank's part (and frees what load_begin gave). */
    void (*load_begin)(void *ctx, float **m, float **v);
    void (*load_end)(void *ctx, float *m, float *v);
    void (*print_memory)(void *ctx, FILE *out);
    void (*free)(void *ctx);
    /* After a step (may be NULL): the optimizer's I/O since the last call, appended to the step
     * line (line, len) and, lg not NULL, as fields of its log record (--offload-device nvme). */
    void (*io_report)(void *ctx, char *line, size_t len, Logger *lg);
} TrainOptimizer;

#ifdef __cplusplus
}
#endif
#endif
