/*
 * adafactor.h - the training loop's host Adafactor (--optimizer adafactor) as a TrainOptimizer,
 * beside hostopt.h's AdamW: over the backend's host gradients and parameters (both trainers; the
 * CUDA trainer through --offload optimizer), the math in llmc/cpu/adafactor.h.
 *
 * Units: every 2-D weight is factored (row and column statistics), every other tensor keeps a
 * full second moment; a stacked (L, out, in) tensor is L matrices and a stacked (L, C) tensor L
 * vectors, each its own unit (as PyTorch's per-module parameters), so the RMS clipping and
 * --adafactor-relative-step's parameter scale are per unit too. The shape comes from the table's
 * shape text: a unit of two dimensions with at least 2 rows and 2 columns is factored.
 *
 * ZeRO: -z 0 every rank updates every unit; -z 1 the units are dealt out by whole units (a unit
 * belongs to the rank whose dist_shard range holds its first element), each rank keeps the
 * statistics (and first moment) of its units only, updates their parameters, and the parameters
 * are all-gathered. -z 2 and 3 are refused.
 *
 * Checkpoint (the state file's [30] = 2, statefile.h): its two numel-float arrays hold the first
 * moment in parameter order (zeros without --adafactor-beta1) and the packed second-moment
 * statistics (unit by unit in table order: rows then columns, or the vector; zeros after them),
 * whole and independent of the number of ranks; the step is the state file's. A rank holding
 * the whole state writes it a chunk at a time (no copy); at -z 1 with several ranks every rank
 * gathers whole copies (2 x numel floats, the checkpoint's transient). Resuming with another
 * --optimizer is an error.
 */
#ifndef LLMC_TRAIN_ADAFACTOR_H
#define LLMC_TRAIN_ADAFACTOR_H

#include "llmc/cpu/adafactor.h"
#include "llmc/dist/dist.h"
#include "llmc/train/backend.h"
#include "llmc/train/cli.h"
#include "llmc/train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The state file's optimizer kinds (statefile.h header [30]). */
enum { STATE_OPTIMIZER_ADAMW = 1, STATE_OPTIMIZER_ADAFACTOR = 2 };

typedef struct {
    Dist *dist;
    TrainBackend *be;
    int zero;
    AdafactorUnit *units;
    int num_units, u0, u1;      /* this rank's units [u0, u1) */
    size_t n, num_stats;        /* parameters; packed statistics of all units */
    size_t plo, phi, slo, shi;  /* this rank's parameters and statistics */
    float *stats;               /* shi - slo floats */
    float *m;                   /* phi - plo floats when beta1 > 0, else NULL */
    float beta1, clip, decay_rate;
    int relative_step;
    int *parts;                 /* -z 1: every rank's parameter counts, then displacements */
} HostAdafactor;

/* 1 when tc selects Adafactor; the state file's kind for tc. */
int adafactor_selected(const TrainConfig *tc);
int train_state_optimizer(const TrainConfig *tc);
/* Builds h for tc over be's parameter table (dies on what it does not build: -z 2/3,
 * --optim-state other than fp32) and fills o with its ops. */
void host_adafactor_open(TrainOptimizer *o, HostAdafactor *h, const TrainConfig *tc, TrainBackend *be, Dist *d);

#ifdef __cplusplus
}
#endif
#endif
