/*
 * hostopt.h - the training loop's host AdamW (optim.h's Optimizer) as a TrainOptimizer: over the
 * backend's host gradients and parameters (TrainBackend.hostopt.host_grads, state.host_params), with ZeRO 1-3
 * (the backend's attach_optimizer hands -z >= 2 buckets to it) and, --offload optimizer, the norm
 * from the backend's per-bucket sums of squares and the update bucket by bucket, each bucket's
 * parameters queued back to the device as soon as they are final.
 */
#ifndef LLMC_TRAIN_HOSTOPT_H
#define LLMC_TRAIN_HOSTOPT_H

#include "llmc/dist/dist.h"
#include "llmc/train/backend.h"
#include "llmc/train/cli.h"
#include "llmc/train/gradcomp.h"
#include "llmc/train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Optimizer opt;
    TrainBackend *be;
    int offload; /* --offload optimizer: the bucketed norm and update */
    GradComp gc; /* --grad-compression (gradcomp.h): the ranks' sum at -z 0/1 sent compressed */
    double nvme_read_MBps, nvme_write_MBps; /* --offload-device nvme: the last step's I/O rates */
} HostAdamW;

/* Builds h for tc's -z, --optim-state and --offload over be's parameter table, attaches it to the
 * backend (be->hostopt.attach_optimizer: -z >= 2 buckets, -z 3 parameter shard) and fills o with its ops. */
void host_adamw_open(TrainOptimizer *o, HostAdamW *h, const TrainConfig *tc, TrainBackend *be, Dist *d);

#ifdef __cplusplus
}
#endif
#endif
