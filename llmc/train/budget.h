/*
 * budget.h - --memory-budget: choose the cheapest configuration whose memory plan fits.
 *
 * The search changes only knobs that keep the training math (up to float summation order):
 * the recompute level -r, the micro-batch -b (with -d fixed, so more accumulation steps) and,
 * with several ranks, the ZeRO stage -z, and last (GPU trainer, one process) --offload optimizer. Every candidate is priced by the backend's plan
 * function through train_memory_plan (no second memory formula) and by a predicted step-time
 * cost (budget_cost); the cheapest candidate that fits wins.
 */
#ifndef LLMC_BUDGET_H
#define LLMC_BUDGET_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/train/cli.h"
#include "llmc/dist/dist.h"
#include "llmc/models/gpt2.h"
#include "llmc/train/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The knobs a trainer offers and how its memory is priced. */
typedef struct {
    TrainPlanFn plan;      /* the backend's part of the plan (train_memory_plan adds the loop's) */
    int host_optimizer;    /* the loop owns AdamW (CPU trainer) */
    const char *device;    /* "CPU" or "GPU" */
    int max_recompute;     /* the highest -r the backend has */
    int max_zero;          /* the highest -z the optimizer has (used with several ranks only) */
    int can_offload;       /* --offload optimizer is a candidate (GPU trainer, one process, -z 0, not fp16) */
    size_t overhead;       /* bytes outside the plan counted against the budget (CPU: VmRSS at start) */
    const char *no_recompute; /* why -r is not a knob (a model with no recompute levels: max_recompute 0),
                               * said with the choice and in the error; NULL where it is */
} BudgetSpace;

/* The predicted step-time cost of (recompute, B, zero) against tc's own, as a fraction (0.05 =
 * 5% slower); README "Memory" states the factors. */
double budget_cost(const TrainConfig *tc, const ModelConfig *cfg, int recompute, int B, int zero, int offload);

/* The peak the budget is compared with: the plan's peak (checkpoint phase included) plus
 * s->overhead. */
size_t budget_peak(const TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s);

/* When tc's peak exceeds budget bytes: sets tc->recompute, tc->B, tc->total_batch (resolved,
 * unchanged in value) and tc->zero_stage to the cheapest candidate that fits and prints one line
 * on out (unless NULL) saying what was chosen and its predicted cost; why names where the budget came from.
 * Dies naming the smallest peak found when nothing fits. Returns 1 when tc changed. */
int budget_fit(TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s, size_t budget, const char *why, FILE *out);

/* Every rank takes rank 0's -b, -r, -z and -d: the searches of the ranks may differ at the margin
 * (each counts its own start-up VmRSS, or its own device's free memory). */
void budget_agree(Dist *d, TrainConfig *tc);

/* The largest micro-batch B whose plan fits the budget at tc's -r, -t, -z (with -d given: only
 * B that keep it exact); 0 when not even B = 1 fits. peak (of B), next_batch (the next larger
 * candidate: B + 1, or with -d the next B that keeps it exact; 0 when there is none) and next (its
 * peak, 0 when none) may be NULL. */
int budget_max_batch(const TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s, size_t budget, size_t *peak,
                     int *next_batch, size_t *next);

/* --plan with --memory-budget [--max-batch]: the search's answer, then the chosen plan (or the
 * largest B); the model's shape as train_plan_main reads it (no model allocated). Returns 0. */
int budget_plan_main(TrainConfig *tc, const BudgetSpace *s);
/* The same for a model whose shape the caller has resolved (another architecture: s->plan prices
 * it, cfg carries its common shape). */
int budget_plan_main_for(TrainConfig *tc, const BudgetSpace *s, const ModelConfig *cfg);

#ifdef __cplusplus
}
#endif
#endif
