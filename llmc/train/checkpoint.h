/*
 * checkpoint.h - the training loop's checkpoints: resolving -e / -y 1, saving model + state + DONE
 * marker, loading the state of a resume and comparing its saved configuration.
 */
#ifndef LLMC_TRAIN_CHECKPOINT_H
#define LLMC_TRAIN_CHECKPOINT_H

#include <stddef.h>

#include "llmc/core/rng.h"
#include "llmc/data/dataloader.h"
#include "llmc/train/backend.h"
#include "llmc/train/cli.h"
#include "llmc/train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Refuses multi-process launchers unless the trainer started a process group (dist.h); rank 0
 * locks -o and decides (every rank gets its answer) where the parameters
 * come from: the latest complete checkpoint in -o when -y 1 (its step is returned), else
 * tc->init (returns -1). Dies when -o holds another run and neither -y 1 nor --overwrite 1 says
 * what to do with it; -y 1 on a directory with no run files starts a new run, on a run with no
 * complete checkpoint deletes its files and starts over. Deleting never takes the -e input (rundir.h):
 * --overwrite 1 or -y 1 starting over with -e a file of the run in -o is an error, nothing deleted. */
int train_resolve_init(const TrainConfig *tc, char *init_path, size_t len);
/* Before --plan and before the run directory is touched (both trainers): -e naming a run
 * directory is an error saying how to use it (its checkpoint as -e, or -o DIR -y 1); with --plan
 * -y 1 and a complete checkpoint in -o, tc->init becomes that checkpoint's model (what the resume
 * trains), with a note (and one when the saved -e differs from tc->init: the resume refuses that). */
void train_check_init(TrainConfig *tc);

/* Writes model, state and the DONE marker (which holds the resolved configuration rc) of step.
 * healthy: the newest checkpoint step proven healthy (a later step trained from its weights
 * without diverging); pruning never deletes it. Rank 0 writes; every rank takes part in gathers. */
void train_save_checkpoint(const TrainConfig *tc, const TrainConfig *rc, TrainBackend *be, TrainOptimizer *opt,
                           DataLoader *loader, const Rng *sampler_rng, int step, int healthy);
/* Resume: every rank reads step's one state file, keeps its shard of m and v, and restores the
 * loader position, the sampler's generator and the backend's state; dies when the state does not
 * belong to the model or to this run's -t / --shuffle / --seed. */
void train_load_state(const TrainConfig *tc, TrainBackend *be, TrainOptimizer *opt, DataLoader *loader, Rng *sampler_rng,
                      int step, long long total_batch);
/* Resume: the checkpoint's saved configuration against this run's resolved one (rc). */
void train_resume_check_config(const TrainConfig *rc, int step);

#ifdef __cplusplus
}
#endif
#endif
