/*
 * dist_ops.h - the transports behind dist.h's collectives (private to llmc/dist/dist.c and dist_tcp.c).
 *
 * dist.c does what every transport shares (one rank: nothing to do; counting the collectives,
 * their bytes and time; summing gathered values in rank order) and calls the process group's
 * DistOps for the data movement: MPI (dist.c, a build with MPI) or TCP sockets (dist_tcp.c,
 * every build). Counts are elements of the given size, per rank, in rank order; displs[r] is
 * where rank r's run starts in buf. The runs of an all-gather lie back to back (displs[r+1] ==
 * displs[r] + counts[r]).
 */
#ifndef LLMC_DIST_OPS_H
#define LLMC_DIST_OPS_H

#include <stddef.h>

#include "llmc/dist/group.h"

typedef enum { DIST_F32, DIST_F64, DIST_U64, DIST_U32 } DistType;

typedef struct DistOps {
    const char *name;
    /* Sum over ranks of send (sum of counts floats, the runs in rank order): rank r's run of the
     * sum into recv. send NULL: in place, recv holds all of it and gets the run at its start. */
    void (*reduce_scatter_f32)(Dist *d, const float *send, float *recv, const int *counts, const char *what);
    /* Every rank's run buf[displs[r], + counts[r]) into every rank's buf (in place). */
    void (*allgatherv)(Dist *d, void *buf, const int *counts, const int *displs, DistType t, const char *what);
    /* The same started nonblocking (a transport may complete it here); wait completes it. */
    void (*allgatherv_begin)(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req);
    void (*wait)(Dist *d, DistRequest *req, const char *what);
    /* Rank 0's full receives every rank's run (shard: this rank's; rank 0's may alias full). */
    void (*gatherv_f32)(Dist *d, const float *shard, float *full, const int *counts, const int *displs, const char *what);
    void (*bcast)(Dist *d, void *buf, size_t bytes, const char *what);
    void (*barrier)(Dist *d, const char *what);
    /* Rank 0: starts (what >= 0, a DistBusy) or stops (what < 0) the heartbeat to the other
     * ranks (dist.h: dist_busy_begin). */
    void (*busy)(Dist *d, int what);
    void (*finalize)(Dist *d);
    /* Expert parallelism (dist.h: dist_alltoallv_f32): rank r's send run sdispls[r] + scounts[r]
     * goes to rank r, which receives it at rdispls[this rank] (rcounts[this rank] elements). */
    void (*alltoallv)(Dist *d, const void *send, const int *scounts, const int *sdispls, void *recv, const int *rcounts,
                      const int *rdispls, DistType t, const char *what);
} DistOps;

static inline size_t dist_type_size(DistType t) { return t == DIST_F32 || t == DIST_U32 ? 4 : 8; }

/* dist_tcp.c: joins the group of size processes (-pi tcp | fs, dist.h) as rank `rank`; fills
 * d->size, rank, local_rank, launcher, ops, transport. Dies naming the flag or rank on any
 * failure. */
void dist_tcp_join(Dist *d, const DistFlags *f, int size, int rank);

#endif
