/*
 * eval.h - multiple-choice evaluation (-h 1): llm.c's HellaSwag/MMLU scoring of an eval file
 * (llmc/data/evalfile.h) through a TrainBackend's per-position losses, at the run's B and T.
 * Each rank scores its share of the examples (evalfile_slice); the correct counts are summed over
 * the ranks, so the result does not depend on the rank count. The forward runs on B x T' with T' the
 * file's longest context + completion rounded up to a multiple of 64 (at most -t): in a causal
 * model the positions after a row's tokens cannot change its losses, so the scores are those of
 * llm.c's B x T batch for T/T' of the work (every context + completion must still be shorter than
 * -t, llm.c's rule). Printed as llm.c prints it,
 * "HellaSwag: N/M = ACC", and logged as hellaswag_acc, hellaswag_correct, hellaswag_total.
 */
#ifndef LLMC_TRAIN_EVAL_H
#define LLMC_TRAIN_EVAL_H

#include "llmc/core/logger.h"
#include "llmc/data/evalfile.h"
#include "llmc/train/backend.h"
#include "llmc/train/cli.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    EvalFile *file; /* NULL: -h 0, or the default file is absent */
    EvalSlice slice;
    int B, T; /* the batch: B rows of T positions, T = the run's -t, or fewer (mc_eval_open) */
    int *inputs, *targets, *labels;
    unsigned char *mask;
    float *losses;
} McEval;

typedef struct {
    long long correct, total;
    double seconds; /* this rank's wall time for the whole evaluation */
} McResult;

/* For -h 1: opens and validates tc->hellaswag_file for the run's B, T and the backend's vocabulary.
 * Returns 1 when evaluation will run; 0 for -h 0, or (required 0) when the file is llm.c's default
 * path and absent (rank 0 prints a note; llm.c's behaviour). Dies when a file named with
 * --hellaswag-file (or, required 1: -x 0, the default one) is absent, a file is bad, or the backend
 * has no eval_losses. */
int mc_eval_open(McEval *e, const TrainConfig *tc, const TrainBackend *be, int required);
/* Every rank: scores its examples (the same number of forwards on every rank), sums over ranks. */
McResult mc_eval_run(McEval *e, TrainBackend *be);
/* Rank 0 prints "HellaSwag: N/M = ACC" (llm.c's line). */
void mc_eval_report(const McResult *r);
/* hellaswag_acc, hellaswag_correct, hellaswag_total and hellaswag_examples_per_s into lg's open record. */
void mc_eval_report_fields(const McResult *r, Logger *lg);
void mc_eval_close(McEval *e);

#ifdef __cplusplus
}
#endif
#endif
