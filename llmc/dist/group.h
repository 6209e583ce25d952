/*
 * group.h - the process group's types (dist.h): the group itself (Dist), the flags that pick how
 * it is joined (DistFlags) and a nonblocking collective in flight (DistRequest). Apart from dist.h
 * so that the transports (dist_ops.h, dist_tcp.c) take them without the collectives' header.
 */
#ifndef LLMC_DIST_GROUP_H
#define LLMC_DIST_GROUP_H

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
    int busy;                /* rank 0: the announced work in progress (DistBusy + 1; dist_busy_begin), 0: none */
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

/* A nonblocking collective in flight (dist_wait_request completes it). */
typedef struct {
    unsigned char handle[16];
    int active;
} DistRequest;

/* What announced rank-0 work is (DistBusy, dist.h): "preparing the output directory", "sampling",
 * "writing a checkpoint"; "?" out of range. */
const char *dist_busy_name(int what);
/* The period of rank 0's heartbeat during such work: a few per --dist-timeout, at most 2 s. */
double dist_heartbeat_s(const Dist *d);

#ifdef __cplusplus
}
#endif
#endif
