/*
 * dist.h - the process group of a data-parallel run, shared by both trainers.
 *
 * Two ways in, chosen by -pi (llm.c's flag):
 *  -pi mpi (default): started by mpirun (OpenMPI: OMPI_COMM_WORLD_*) or by Slurm's srun
 *    (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; MPI_Init picks the job up through PMI/PMIx).
 *    llm.c's -pn/-pr must agree with the launcher when given. Needs a build with MPI
 *    (LLMC_HAVE_MPI: the Makefile sets it for train_gpt_cpu when mpicc exists).
 *  -pi tcp -ps HOST[:PORT] / -pi fs -pf DIR: started by anything (a shell loop,
 *    scripts/run_dist.sh --pi, srun without MPI) with -pn P -pr R each (under srun or mpirun the
 *    launcher's rank and size, -pn/-pr must then agree); the collectives run over TCP sockets
 *    (llmc/dist/dist_tcp.c), so every build can do it, with or without MPI. tcp: rank 0 listens on
 *    HOST:PORT (default port 12345, llm.c's), the others connect. fs: rank 0 listens on a port
 *    the OS picks and publishes its address in DIR (a filesystem every rank sees) in the file
 *    llmc-rendezvous-<run id> (run id: $LLMC_RUN_ID, else $SLURM_JOB_ID.$SLURM_STEP_ID, else
 *    "default"); it removes any old one before listening and its own once every rank has
 *    connected, and a rank that read a stale one (its rank 0 is gone, or it is another run's:
 *    the file's random token does not match) reads it again until the deadline. Runs that share
 *    DIR at the same time need distinct run ids.
 * Any other build or -pi asked for more than one process stops and says how to get one.
 *
 * Every collective is over host memory and counts its bytes and time into comm_bytes / comm_ms
 * (the loop logs them per step). Deadlines, --dist-timeout (timeout_s):
 *  MPI: a rank that dies makes the collectives of the others fail; OpenMPI's mpirun then ends
 *    the job (MPI_ERRORS_ARE_FATAL). A rank that hangs (or dies unseen) is caught by the
 *    collective watchdog: every collective is started nonblocking and polled against the
 *    deadline; past it the waiting rank asks the others which collective they are in and dies
 *    naming the ranks that did not answer.
 *  TCP: every connect, send and receive is polled; a peer whose connection closes (it died or
 *    stopped) is named at once, one that moves no byte for timeout_s is named as hung. Rank 0
 *    (every other rank talks to it) tells the others which rank failed before it exits, so
 *    every rank exits 1 naming it.
 *  Work rank 0 does alone (dist_busy_begin .. dist_busy_end: clearing -o, sampling, writing a
 *    checkpoint) does not count against the others' deadline: meanwhile rank 0 sends each of them
 *    a heartbeat a few times per --dist-timeout (TCP: a header on the connection; MPI: a message
 *    from a helper thread, given MPI_THREAD_SERIALIZED), and a waiting rank counts its deadline
 *    from the last one. A rank 0 that hangs or is stopped there sends none and is named as before.
 *
 * Shards and buckets (ZeRO, which rank owns what): bucket.h, included here for the collectives'
 * users. The types of the group: group.h.
 */
#ifndef LLMC_DIST_H
#define LLMC_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/dist/bucket.h"
#include "llmc/dist/group.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The process group of this run. can_parallel: 0 for a trainer that cannot train data-parallel
 * yet (it refuses launchers with P > 1: dist_refuse_launcher). Dies with a clear message on any
 * mismatch. */
Dist *dist_init(int *argc, char ***argv, const DistFlags *f, int can_parallel);
/* This process's group: dist_init's, or one process when dist_init was never called. */
Dist *dist_world(void);
void dist_finalize(Dist *d);
/* 1 when this build can run several processes under mpirun/srun with -pi mpi (compiled with
 * MPI); -pi tcp and fs work in every build. */
int dist_have_mpi(void);
/* Dies when a multi-process launcher (mpirun, srun, ...) started this process as one of several
 * and the trainer has no process group to join: the copies would train alone and write the same
 * files. */
void dist_refuse_launcher(void);

/* In-place sum over ranks. */
void dist_allreduce_f32(Dist *d, float *buf, size_t n);
void dist_allreduce_f64(Dist *d, double *buf, int n);
/* full (n floats, every rank) summed over ranks; this rank's shard of the sum into shard. */
void dist_reduce_scatter_f32(Dist *d, const float *full, float *shard, size_t n);
/* Every rank's shard (in full at its offset) copied into every rank's full (in place). */
void dist_allgather_f32(Dist *d, float *full, size_t n);
/* Rank 0's full receives every rank's shard (shard: this rank's part, rank 0's may alias). */
void dist_gather_f32(Dist *d, const float *shard, float *full, size_t n);
void dist_bcast_bytes(Dist *d, void *buf, size_t bytes);
/* Every rank's run of bytes (a multiple of 4, the same on every rank) at buf + r * bytes into every
 * rank's buf (in place); the runs are moved as they are (any bits). */
void dist_allgather_bytes(Dist *d, void *buf, size_t bytes);
/* Every rank's value; out[P]. */
void dist_allgather_u64(Dist *d, uint64_t v, uint64_t *out);
void dist_barrier(Dist *d);
/* In-place sum over ranks of buf (sum of counts floats): rank r's run of counts[r] floats (in
 * rank order) ends up, summed, at the start of rank r's buf. */
void dist_reduce_scatter_parts_f32(Dist *d, float *buf, const int *counts);
/* Starts the in-place all-gather of every rank's run buf[displs[r], + counts[r]); counts and
 * displs must stay untouched until dist_wait_request. */
void dist_allgather_parts_begin(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req);
void dist_wait_request(Dist *d, DistRequest *req, const char *what);

/* ---- expert parallelism (issue 24): all-to-all and collectives over a group of ranks ----
 * Every rank calls each of these together (one collective over the world); a rank exchanges only
 * with the ranks it names. dist_alltoallv_f32: scounts[r] floats of send (the runs back to back in
 * rank order) go to rank r; rcounts[r] floats from rank r land in recv, back to back in rank
 * order (counts must agree pairwise). dist_alltoall_i32: n ints to and from every rank, by rank.
 * dist_group_*: over the m ranks members[] (this rank among them; every rank's group a part of one
 * partition of the ranks): the in-place sum (each element summed by one member, in member order,
 * then sent to all: the same bits on every member) and the in-place all-gather of dist_shard(n, m,
 * j)'s runs, member j holding run j. */
void dist_alltoallv_f32(Dist *d, const float *send, const int *scounts, float *recv, const int *rcounts);
void dist_alltoall_i32(Dist *d, const int32_t *send, int n, int32_t *recv);
void dist_group_allreduce_f32(Dist *d, float *buf, size_t n, const int *members, int m);
void dist_group_allgather_f32(Dist *d, float *full, size_t n, const int *members, int m);

/* Work only rank 0 does while the others wait in their next collective (DIST_BUSY_*: what it
 * is, named in the others' error when rank 0 goes silent in it). Between begin and end rank 0
 * sends the heartbeat (above) and may run no collective. On other ranks, and with one process,
 * both do nothing. */
typedef enum { DIST_BUSY_OUTPUT_DIR, DIST_BUSY_SAMPLE, DIST_BUSY_CHECKPOINT, DIST_BUSY_COUNT } DistBusy;
void dist_busy_begin(Dist *d, DistBusy what);
void dist_busy_end(Dist *d);

/* The number of processes a launcher (mpirun, srun, ...) announced in the environment; 0: none. */
int dist_launcher_size(void);

/* Communication since the last call (then reset). */
void dist_take_comm(Dist *d, double *ms, long long *bytes);

#ifdef __cplusplus
}
#endif
#endif
