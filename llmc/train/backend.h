/*
 * backend.h - TrainBackend: what the training loop (train.h) asks of a model on one backend (CPU
 * or CUDA), in five parts: what the model does (ops: forward+backward of a micro-batch, the
 * evaluation loss, the logits of sampling, its memory plan), where its state lives (state: the host
 * parameters for checkpoints), its optimizer (the backend's own, or the loop's host AdamW fed
 * through hostopt: the host gradients and copies), and optional reporting.
 */
#ifndef LLMC_TRAIN_BACKEND_H
#define LLMC_TRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmc/core/logger.h"
#include "llmc/dist/dist.h"
#include "llmc/formats/arch.h"
#include "llmc/models/gpt2.h"
#include "llmc/train/cli.h"
#include "llmc/train/optim.h"
#include "llmc/train/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the model does, for the loop. */
typedef struct {
    /* Forward + backward of one micro-batch, gradients accumulated with weight dloss_scale
     * (the optimizer's loss_weight); returns the micro-batch's mean loss. */
    float (*train_micro_step)(void *model, const int *inputs, const int *targets, int B, int T, float dloss_scale);
    /* Optional: the sum of the micro-step mean losses since zero_grad, read once per step after the
     * last micro-step; then train_micro_step need not wait for its loss (its return value is not
     * used). NULL: the loop sums train_micro_step's returns (the CPU backends). */
    double (*step_loss)(void *model);
    /* Optional (distillation): the sums since zero_grad of the micro-steps' mean cross-entropy
     * (parts[0]) and mean distillation term KL(teacher_t || student_t) (parts[1]), unscaled; the
     * loop logs their step means as train_ce and train_kd. NULL: the loss has no parts. */
    void (*loss_parts)(void *model, double parts[2]);
    float (*eval_loss)(void *model, const int *inputs, const int *targets, int B, int T);
    /* Each position's loss (losses: B*T floats, host memory) of a forward without gradients
     * (multiple-choice evaluation, -h 1: llmc/train/eval.h). NULL: -h 1 is refused. */
    void (*eval_losses)(void *model, const int *inputs, const int *targets, int B, int T, float *losses);
    /* Clears the gradients (first, once per step). */
    void (*zero_grad)(void *model);
    /* Logits (at least V floats, host memory) for the position after tokens[0..n-1]. */
    const float *(*next_logits)(void *model, const int *tokens, int n);
    /* The backend's part of the memory plan for tc on cfg (model states, activations, scratch,
     * workspaces): the same function its allocation code takes its sizes from. */
    TrainPlanFn plan;
} TrainModelOps;

/* Where the model's state lives, for checkpoints. */
typedef struct {
    /* The host copy of the parameters (checkpoints; the loop's optimizer updates it). sync_to_host
     * fills the host copies from the device (no-op on CPU); sync_from_host pushes them back after
     * a load. */
    float *host_params;
    void (*sync_to_host)(void *model);
    void (*sync_from_host)(void *model);
    void (*print_memory)(void *model, FILE *out);
    /* Optional: backend state a bit-exact resume needs beyond weights and moments (the fp16
     * loss scaler), as 4 words saved in the state file; all zero means none. May be NULL. */
    void (*save_backend_state)(void *model, int64_t words[4]);
    void (*load_backend_state)(void *model, const int64_t words[4]);
    /* Optional, a run that trains an adapter (LoRA) on a frozen base: a checkpoint's model is what
     * save_model writes for step in dir from the trained parameters (host_params), returning the
     * CRC-32 the state file records; model_path names the file of that CRC (the resume checks it)
     * or, what == 1, the checkpoint's model as printed. NULL: the architecture's model file. */
    uint32_t (*save_model)(void *model, const char *dir, int step, const float *params);
    void (*model_path)(void *model, const char *dir, int step, int what, char *path, size_t len);
    /* Optional: the floats at host_params that every rank holds the same (the ranks' start-up
     * check compares their CRC); 0: num_parameters (expert parallelism: the tensors before the
     * experts, each rank's arena being its shard) */
    size_t agree_floats;
} TrainModelState;

/* What the loop's host AdamW (hostopt.h) needs of a backend that has no optimizer of its own; only
 * hostopt.c reads it. */
typedef struct {
    /* The host gradients (num_parameters floats, summed by train_micro_step, cleared by zero_grad)
     * and the parameter table (offsets, decay). */
    float *host_grads;
    const TensorSpec *param_specs;
    int num_param_specs; /* param_specs' entries; 0: the architecture's (arch->arch->num_param_specs) */
    /* Optional, a device backend (--offload optimizer): grads_to_host fills host_grads from the
     * device once per step, after the last micro-step; params_from_host pushes host_params (the
     * fp32 master copy) to the device after the update. With buckets (the update is then
     * optim_step_buckets'): grad_bucket_sumsq gives each bucket's sum of squared gradients
     * (optim_num_buckets entries, optim_bucket's order), accumulated as they reached the host, or
     * NULL; params_bucket_to_device queues a bucket's updated parameters for the device as soon
     * as they are final (params_from_host then only orders the next forward after the copies). */
    void (*grads_to_host)(void *model);
    void (*params_from_host)(void *model);
    const double *(*grad_bucket_sumsq)(void *model);
    void (*params_bucket_to_device)(void *model, const Bucket *b);
    /* Optional: called once the host optimizer exists, before the memory plan is checked, so that
     * for -z >= 2 the backend hands its gradients to it bucket by bucket and for -z 3 keeps only
     * its shard of the parameters. It updates host_params (-z 3: this rank's shard) and host_grads
     * (-z >= 2: the bucket buffers, never read by the loop). */
    void (*attach_optimizer)(void *model, Optimizer *opt, float **host_params, float **host_grads);
} TrainHostGrads;

/* Optional reporting: NULL fields print nothing. */
typedef struct {
    /* Extra step-line text and log fields (MFU, device memory). */
    void (*step_extras)(void *model, double step_ms, double tokens_per_s, char *text, size_t len, Logger *lg);
    /* -lg telemetry. Reads the device once, writes the reading as " | "-separated text (printed on
     * its own line after the step line) and as fields of the step's open log record. Called every
     * tc->gpu_log_every steps when that is > 0. */
    void (*telemetry)(void *model, char *text, size_t len, Logger *lg);
} TrainReporting;

typedef struct {
    const char *name;  /* e.g. "CPU fp32, OpenBLAS, 2 threads" */
    void *model;       /* what every function pointer below is called with */
    ModelConfig cfg;
    size_t num_parameters;
    /* The model's architecture and its config (formats/arch.h): the loop takes from it the parameter
     * table's size (hostopt.param_specs has arch->arch->num_param_specs entries), the checkpoint file
     * it writes (save: the whole model, state.host_params or at -z 3 the ranks' shards gathered),
     * --save-hf's directory and the flops per token. */
    const ArchConfig *arch;
    double peak_flops; /* device peak for MFU; 0 = not reported */
    int gpu;           /* 1: the GPU-only flags apply (the startup print shows them) */

    TrainModelOps ops;
    TrainModelState state;
    /* The backend's own optimizer (the CUDA trainer's device AdamW: its m and v, reductions and
     * update), or all zero: the loop's host AdamW over hostopt. */
    TrainOptimizer optimizer;
    TrainHostGrads hostopt;
    TrainReporting report;
} TrainBackend;

#ifdef __cplusplus
}
#endif
#endif
