/*
 * plan.h - the training loop's part of the memory plan and the whole plan of a run.
 *
 * The classes, MemPlan and the accounting allocator are llmc/core/mem.h's; a backend prices its
 * own part (TrainPlanFn) and this module adds the loop's: the optimizer moments when the loop owns
 * the optimizer (optim.h's one rule for their bytes), the token buffers, the dataloader's buffers
 * and the checkpoint gather buffers. After setup the loop checks the allocation against the plan
 * (mem_check_plan), every step against the step before (the leak check), and after the first
 * step the planned peak against the measured one.
 */
#ifndef LLMC_TRAIN_PLAN_H
#define LLMC_TRAIN_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/core/logger.h"
#include "llmc/core/mem.h"
#include "llmc/models/gpt2.h"
#include "llmc/train/cli.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The loop's part, the same for every backend: optimizer moments (when the loop owns the
 * optimizer: host_optimizer), token buffers, dataloader buffers, checkpoint gather buffers.
 * Dies with a message when -d is not a multiple of B*T*ranks. */
void mem_plan_add_loop(MemPlan *p, int B, int T, long long total_batch, int ranks, int rank, int zero,
                       int host_optimizer, int checkpoints, int validation);
typedef void (*TrainPlanFn)(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p);
/* Bytes of the loop's token buffers (micro-batch inputs/targets, the whole step's). */
size_t train_token_buffer_bytes(int B, int T, long long total_batch);
/* The whole plan: the backend's part plus the loop's (optimizer when host_optimizer, tokens,
 * data, checkpoint buffers), for rank tc->process_rank of tc->num_processes. */
void train_memory_plan(const TrainConfig *tc, const ModelConfig *cfg, TrainPlanFn backend_plan, int host_optimizer,
                       const char *device, MemPlan *p);
/* --optimizer adafactor: what the AdamW classes hold, against AdamW's m + v (nothing otherwise). */
void train_plan_print_optimizer(const TrainConfig *tc, const MemPlan *p, int host_optimizer, FILE *out);
/* --plan [--json]: the model's shape from tc->init (a dN descriptor, or only the header of a
 * checkpoint file), the plan printed; allocates no model, touches no run directory. Returns 0. */
int train_plan_main(const TrainConfig *tc, TrainPlanFn backend_plan, int host_optimizer, const char *device);
/* The model's shape for --plan: a dN descriptor, or only the header of a checkpoint file. */
void train_plan_model_config(const TrainConfig *tc, ModelConfig *cfg);

/* LLMC_TEST_LEAK=<class name>: every step allocates 4 KiB of that class and never frees it (a
 * planted leak that the leak check must name). Returns the class, -1 when unset. */
int train_planted_leak_class(void);
/* The leak check: live accounted bytes after every step after base_step (this run's second step)
 * equal those after base_step (recorded into base at base_step); dies naming the class that grew. */
void train_check_leaks(int step, int base_step, size_t base[2][MEM_NUM_CLASSES]);
/* Planned against measured, after the first step: CPU the process's VmHWM less the runtime's
 * fixed overhead (VmRSS at process start), printed and logged as fields of lg's open record;
 * nothing for a GPU plan (the backend's step_extras reports device memory). */
void train_print_planned_vs_measured(const MemPlan *plan, Logger *lg);

#ifdef __cplusplus
}
#endif
#endif
