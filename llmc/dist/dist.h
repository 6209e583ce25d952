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
 *
 * Shards (ZeRO): N elements over P ranks, rank r owns [r*S, min((r+1)*S, N)) with
 * S = ceil(N / P); ranks past the end own nothing. Any N on any P (no padding stored, the
 * collectives take per-rank counts).
 */
#ifndef LLMC_DIST_H
#define LLMC_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/models/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

struct DistOps;
typedef struct {
    int rank, size, local_rank;
    int mpi;                 /* 1: MPI was initialised (finalised by dist_finalize) */
    char launcher[64];       /* "mpirun", "srun", "-pi tcp", "-pi fs", "one process" */
    double comm_ms;          /* time spent in collectives since dist_take_comm */
    long long comm_bytes;    /* bytes this rank sent into collectives since dist_take_comm */
    double timeout_s;        /* the collective watchdog's deadline (--dist-timeout) */
    unsigned long long collectives; /* collectives started so far (the watchdog names them by number) */
    const struct DistOps *ops;      /* the transport (size > 1): MPI or TCP (llmc/dist/dist_ops.h) */
    void *transport;                /* its state */
} Dist;

#define DIST_DEFAULT_TIMEOUT_S 300.0

/* llm.c's process-group flags as given (cli.c's train_config_dist_flags). */
typedef struct {
    int pn, pr;             /* -pn / -pr (1 / 0 when not given) */
    const char *init;       /* -pi: "mpi", "tcp" or "fs" */
    const char *server;     /* -ps HOST[:PORT] (tcp) */
    const char *fs_path;    /* -pf DIR (fs) */
    double timeout_s;       /* --dist-timeout: also bounds connecting (tcp, fs) */
} DistFlags;

/* The process group of this run. can_parallel: 0 for a trainer that cannot train data-parallel
 * yet (it refuses launchers with P > 1 like rundir_refuse_launcher). Dies with a clear message
 * on any mismatch. */
Dist *dist_init(int *argc, char ***argv, const DistFlags *f, int can_parallel);
/* This process's group: dist_init's, or one process when dist_init was never called. */
Dist *dist_world(void);
void dist_finalize(Dist *d);
/* 1 when this build can run several processes under mpirun/srun with -pi mpi (compiled with
 * MPI); -pi tcp and fs work in every build. */
int dist_have_mpi(void);

/* Shard of rank r: [*lo, *hi). */
void dist_shard(size_t n, int P, int r, size_t *lo, size_t *hi);

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
/* Every rank's value; out[P]. */
void dist_allgather_u64(Dist *d, uint64_t v, uint64_t *out);
void dist_barrier(Dist *d);
/* ---- buckets (ZeRO-2/3: gradients reduced and parameters gathered a group of tensors at a time) ----
 * A bucket is a list of slices of the flat parameter array in increasing offset order, packed
 * back to back in a buffer. Rank r's part of it (the elements in r's shard) is then one
 * contiguous run of the packed buffer: [pos, pos + count). */
enum { BUCKET_MAX_SLICES = 32 };
typedef struct {
    int n;
    size_t off[BUCKET_MAX_SLICES], len[BUCKET_MAX_SLICES];
    size_t numel; /* packed length */
} Bucket;
void bucket_add(Bucket *b, size_t off, size_t len);
/* Slice i of b within the flat range [lo, hi): its first flat index there in *a, its length returned
 * (0: none of it). */
static inline size_t bucket_slice_in(const Bucket *b, int i, size_t lo, size_t hi, size_t *a) {
    const size_t e = b->off[i] + b->len[i] < hi ? b->off[i] + b->len[i] : hi;
    *a = b->off[i] > lo ? b->off[i] : lo;
    return e > *a ? e - *a : 0;
}
/* The bucket of layer l (every stacked tensor's layer-l slice) or, l < 0, the outer bucket (the
 * non-empty tensors kept once: GPT-2's wte, wpe, lnfw, lnfb), in table order = flat offset order. */
void bucket_of_layer(Bucket *b, const TensorSpec *specs, int num_specs, int l);
/* The packed sizes of the outer bucket and of one layer's bucket; pos (may be NULL): each tensor's
 * place in its packed bucket. */
void bucket_packing(const TensorSpec *specs, int num_specs, size_t *outer, size_t *layer, size_t *pos);
/* The packed run [*pos, *pos + *count) of b whose flat indices lie in [lo, hi). */
void bucket_part(const Bucket *b, size_t lo, size_t hi, size_t *pos, size_t *count);
/* For every element of b with flat index in [lo, hi): shard[i - lo] += packed[k] (add 1, with
 * packed starting at this run's first element) or packed[k] = shard[i - lo] (add 0, packed the
 * whole bucket). */
void bucket_shard_copy(const Bucket *b, size_t lo, size_t hi, float *packed, float *shard, int add);

/* A nonblocking collective in flight (dist_wait_request completes it). */
typedef struct {
    unsigned char handle[16];
    int active;
} DistRequest;
/* In-place sum over ranks of buf (sum of counts floats): rank r's run of counts[r] floats (in
 * rank order) ends up, summed, at the start of rank r's buf. */
void dist_reduce_scatter_parts_f32(Dist *d, float *buf, const int *counts);
/* Starts the in-place all-gather of every rank's run buf[displs[r], + counts[r]); counts and
 * displs must stay untouched until dist_wait_request. */
void dist_allgather_parts_begin(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req);
void dist_wait_request(Dist *d, DistRequest *req, const char *what);

/* Communication since the last call (then reset). */
void dist_take_comm(Dist *d, double *ms, long long *bytes);

#ifdef __cplusplus
}
#endif
#endif
