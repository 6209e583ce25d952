/*
 * train.h - the training-loop policy both trainers share: data, schedule, gradient
 * accumulation, clipping, evaluation, sampling, logging, checkpoints and resume.
 * A backend (CPU or CUDA) supplies the model operations through TrainBackend; the loop never
 * touches a tensor itself except through the host views for checkpoints.
 */
#ifndef LLMC_TRAIN_H
#define LLMC_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "llmc/train/cli.h"
#include "llmc/dist/dist.h"
#include "llmc/core/logger.h"
#include "llmc/formats/arch.h"
#include "llmc/models/gpt2.h"
#include "llmc/train/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

struct Optimizer;

typedef struct {
    const char *name;          /* e.g. "CPU fp32, OpenBLAS, 2 threads" */
    void *model;
    ModelConfig cfg;
    size_t num_parameters;
    double peak_flops;         /* device peak for MFU; 0 = not reported */
    int gpu;                   /* 1: the GPU-only flags apply (the startup print shows them) */
    /* Forward + backward of one micro-batch, gradients accumulated with weight dloss_scale
     * (1/accumulation steps); returns the micro-batch's mean loss. */
    float (*train_micro_step)(void *model, const int *inputs, const int *targets, int B, int T, float dloss_scale);
    /* Optional: the sum of the micro-step mean losses since zero_grad, read once per step after the
     * last micro-step; then train_micro_step need not wait for its loss (its return value is not
     * used). NULL: the loop sums train_micro_step's returns (the CPU backends). */
    double (*step_loss)(void *model);
    float (*eval_loss)(void *model, const int *inputs, const int *targets, int B, int T);
    void (*zero_grad)(void *model);
    /* Global L2 norm of the accumulated gradients. */
    float (*grad_norm)(void *model);
    /* AdamW step t (1-based) with this lr on the gradients times grad_scale (the clip factor). */
    void (*update)(void *model, const TrainConfig *tc, float lr, int t, float grad_scale);
    /* Logits (at least V floats, host memory) for the position after tokens[0..n-1]. */
    const float *(*next_logits)(void *model, const int *tokens, int n);
    /* Host copies of parameters and AdamW moments for checkpoints. sync_to_host fills them
     * from the device (no-op on CPU); sync_from_host pushes them back after a load. */
    float *host_params, *host_m, *host_v;
    /* Host gradients (num_parameters floats, summed by train_micro_step, cleared by zero_grad):
     * when set, the loop's optimizer (optim.h) owns AdamW, reduces these over the ranks and
     * updates host_params itself; grad_norm, update, host_m and host_v are then unused. NULL:
     * the backend's own optimizer (grad_norm, update, host_m/host_v for checkpoints), one rank. */
    float *host_grads;
    const TensorSpec *param_specs; /* with host_grads: the parameter table (offsets, decay) */
    /* Optional, a device backend with host_grads (--offload optimizer): grads_to_host fills
     * host_grads from the device once per step, after the last micro-step; params_from_host
     * pushes host_params (the fp32 master copy) to the device after the loop's update. */
    void (*grads_to_host)(void *model);
    void (*params_from_host)(void *model);
    /* Optional, with --offload optimizer (the loop then updates bucket by bucket, optim.h's
     * optim_step_buckets): grad_bucket_sumsq gives each bucket's sum of squared gradients
     * (optim_num_buckets entries, optim_bucket's order), accumulated as they reached the host,
     * or NULL; params_bucket_to_device queues a bucket's updated parameters for the device as soon
     * as they are final (params_from_host then only orders the next forward after the copies). */
    const double *(*grad_bucket_sumsq)(void *model);
    void (*params_bucket_to_device)(void *model, const Bucket *b);
    /* Optional, with host_grads: called once the loop's optimizer (optim.h) exists, before the
     * memory plan is checked, so that for -z >= 2 the backend hands its gradients to it bucket by
     * bucket and for -z 3 keeps only its shard of the parameters. It updates host_params (-z 3:
     * this rank's shard) and host_grads (-z >= 2: the bucket buffers, never read by the loop). */
    void (*attach_optimizer)(void *model, struct Optimizer *opt, float **host_params, float **host_grads);
    /* Without host_grads: the highest -z the backend's own optimizer shards (0: none; 1: m, v and
     * master weights sharded, parameters gathered after its update, host_m/host_v whole after
     * sync_to_host on every rank). */
    int zero_max;
    void (*sync_to_host)(void *model);
    void (*sync_from_host)(void *model);
    void (*print_memory)(void *model, FILE *out);
    /* Optional: backend state a bit-exact resume needs beyond weights and moments (the fp16
     * loss scaler), as 4 words saved in the state file; all zero means none. May be NULL. */
    void (*save_backend_state)(void *model, int64_t words[4]);
    void (*load_backend_state)(void *model, const int64_t words[4]);
    /* Optional: extra step-line text and log fields (MFU, device memory); may be NULL. */
    void (*step_extras)(void *model, double step_ms, double tokens_per_s, char *text, size_t len, Logger *lg);
    /* Optional: -lg telemetry. Reads the device once, writes the reading as " | "-separated text
     * (printed on its own line after the step line) and as fields of the step's open log
     * record. Called every tc->gpu_log_every steps when that is > 0. NULL: no telemetry (CPU). */
    void (*telemetry)(void *model, char *text, size_t len, Logger *lg);
    /* The backend's part of the memory plan for tc on cfg (model states, activations, scratch,
     * workspaces): the same function its allocation code takes its sizes from. */
    void (*plan)(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p);
    /* The model's architecture and its config (formats/arch.h): the loop takes from it the parameter
     * table's size (param_specs has arch->arch->num_param_specs entries), the checkpoint file it
     * writes (save: the whole model, host_params or at -z 3 the ranks' shards gathered), --save-hf's
     * directory and the flops per token. */
    const ArchConfig *arch;
} TrainBackend;

typedef void (*TrainPlanFn)(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p);
/* Bytes of the loop's token buffers (micro-batch inputs/targets, the whole step's). */
size_t train_token_buffer_bytes(int B, int T, long long total_batch);
/* The whole plan: the backend's part plus the loop's (optimizer when host_optimizer, tokens,
 * data, checkpoint buffers), for rank tc->process_rank of tc->num_processes. */
void train_memory_plan(const TrainConfig *tc, const ModelConfig *cfg, TrainPlanFn backend_plan, int host_optimizer,
                       const char *device, MemPlan *p);
/* --plan [--json]: the model's shape from tc->init (a dN descriptor, or only the header of a
 * checkpoint file), the plan printed; allocates no model, touches no run directory. Returns 0. */
int train_plan_main(const TrainConfig *tc, TrainPlanFn backend_plan, int host_optimizer, const char *device);
/* The model's shape for --plan: a dN descriptor, or only the header of a checkpoint file. */
void train_plan_model_config(const TrainConfig *tc, ModelConfig *cfg);

/* Refuses multi-process launchers unless the trainer started a process group (dist.h); rank 0
 * locks -o and decides (every rank gets its answer) where the parameters
 * come from: the latest complete checkpoint in -o when -y 1 (its step is returned), else
 * tc->init (returns -1). Dies when -o holds another run and neither -y 1 nor --overwrite 1 says
 * what to do with it, and when -y 1 finds a run there with no complete checkpoint; -y 1 on a
 * directory with no run files starts a new run. */
int train_resolve_init(const TrainConfig *tc, char *init_path, size_t len);

/* Runs the whole training job; returns the process exit status. */
int train_run(const TrainConfig *tc, TrainBackend *be, int resume_step);

#ifdef __cplusplus
}
#endif
#endif
