/*
 * train.h - the training-loop policy both trainers share: data, schedule, gradient
 * accumulation, clipping, evaluation, sampling, logging, checkpoints and resume.
 * A backend (CPU or CUDA) supplies the model operations through TrainBackend (backend.h); the
 * loop never touches a tensor itself except through the host views for checkpoints. Its rooms:
 * plan.c (the memory plan), checkpoint.c (resolve, save, resume), report.c (samples, summary,
 * run record) and train.c (the loop).
 */
#ifndef LLMC_TRAIN_H
#define LLMC_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "llmc/train/backend.h"
#include "llmc/train/checkpoint.h"
#include "llmc/train/cli.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs the whole training job; returns the process exit status. */
int train_run(const TrainConfig *tc, TrainBackend *be, int resume_step);

#ifdef __cplusplus
}
#endif
#endif
