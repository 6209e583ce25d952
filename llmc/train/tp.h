/*
 * tp.h - the training loop's side of tensor parallelism (-tp N, issue 25): a rank's parameter arena
 * holds its part of each split tensor (the table's split column, llmc/core/tensor.h) and the other
 * tensors whole; checkpoints (the model file, and m and v in the state file) hold the whole model's
 * layout whatever the layout of the run, so any layout resumes from them.
 */
#ifndef LLMC_TRAIN_TP_H
#define LLMC_TRAIN_TP_H

#include <stddef.h>

#include "llmc/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ranks of this process's tensor-parallel group (1: no -tp). */
int train_tp_size(void);
/* The whole model's element count for a rank's table local (n rows) of a group of tp. */
size_t train_tp_whole_numel(const TensorSpec *local, int n, int tp);
/* Collective over the tensor-parallel group: every rank's arena mine (its table local, nlocal floats)
 * assembled into whole (the whole model's layout) on the group's rank 0 (whole NULL: not wanted
 * there); whole is not touched on the other ranks. */
void train_tp_gather(const TensorSpec *local, int n, size_t nlocal, const float *mine, float *whole);
/* This rank's part of the whole arena whole, into mine (no communication). */
void train_tp_take(const TensorSpec *local, int n, const float *whole, float *mine);
/* Collective over the tensor-parallel group (the vocabulary-parallel LM head): every rank's Vp/tp
 * logits of one position (rank r's: vocabulary entries r Vp/tp onwards) assembled into all Vp, on every
 * rank; the result lives in a buffer of this module's until the next call. */
const float *train_tp_logits_row(const float *mine, int Vp);

#ifdef __cplusplus
}
#endif
#endif
