/*
 * layout.h - the model-parallel layout of the process group (issue 25): -tp N splits the P ranks into
 * P/N tensor-parallel groups of N consecutive ranks (tp fastest in rank order, as Megatron: world rank
 * w is tp rank w % N of data-parallel rank w / N) and N data-parallel groups of the ranks with equal
 * tp rank. Each group is a Dist of its own, so every collective of dist.h runs on it.
 *
 * In this slice a group's collectives travel over the whole process group: each one is an all-gather
 * over every rank (each group's ranks then take their own group's runs, summed in group rank order
 * where it is a sum), so it works on every transport (MPI, -pi tcp, -pi fs) and every group of the
 * layout must run the same collective at the same time (they do: the groups' ranks run the same
 * model). It moves P/N times the bytes a sub-communicator would; MPI/NCCL sub-communicators are the
 * next step.
 */
#ifndef LLMC_DIST_LAYOUT_H
#define LLMC_DIST_LAYOUT_H

#include "llmc/dist/group.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Splits world into groups of tp (world->size must divide by tp: dies otherwise, naming -tp). */
void dist_layout_init(Dist *world, int tp);
/* This rank's tensor-parallel group (a one-rank group without -tp) and data-parallel group (the
 * whole process group without -tp). */
Dist *dist_tp_group(void);
Dist *dist_data_group(void);

#ifdef __cplusplus
}
#endif
#endif
