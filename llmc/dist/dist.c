#include "llmc/dist/dist.h"
#include "llmc/dist/dist_ops.h"
#include "llmc/core/check.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef LLMC_HAVE_MPI
#define LLMC_HAVE_MPI 0
#endif
#if LLMC_HAVE_MPI
#include <mpi.h>
#endif

/* ---- launchers ------------------------------------------------------------------------- */
/* The world-size variables of the common launchers (OpenMPI's mpirun, PMIx, PMI; Slurm's only inside
 * a job step, srun), in the order they are asked; SLURM_NTASKS (an allocation, maybe without a step)
 * is asked after them, only beside SLURM_PROCID. */
static const char *const LAUNCHER_SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS",
                                                 NULL};

/* The first of LAUNCHER_SIZE_VARS whose value is above `above` (NULL: none), its value in *size. */
static const char *launcher_var_above(int above, int *size) {
    for (int i = 0; LAUNCHER_SIZE_VARS[i]; i++) {
        const char *v = getenv(LAUNCHER_SIZE_VARS[i]);
        if (v && atoi(v) > above) {
            *size = atoi(v);
            return LAUNCHER_SIZE_VARS[i];
        }
    }
    return NULL;
}

/* The world size a launcher announced in the environment (0: none), and which variable. */
static int launcher_size(const char **var) {
    int size;
    if ((*var = launcher_var_above(0, &size))) return size;
    const char *n = getenv("SLURM_NTASKS");
    if (n && getenv("SLURM_PROCID") && atoi(n) > 0) {
        *var = "SLURM_NTASKS";
        return atoi(n);
    }
    *var = NULL;
    return 0;
}

int dist_launcher_size(void) {
    const char *var;
    return launcher_size(&var);
}

void dist_refuse_launcher(void) {
    int size;
    const char *var = launcher_var_above(1, &size);
    if (var)
        llmc_die("this process was started as one of %d by a launcher (%s=%s), but data parallelism is not "
                 "built yet in this trainer (./train_gpt_cpu built with MPI has it): the copies would train alone "
                 "and write the same files. Run one process (without mpirun/srun), or unset %s if it is stale",
                 size, var, getenv(var), var);
    const char *n = getenv("SLURM_NTASKS"), *rank = getenv("SLURM_PROCID");
    if (n && rank && !getenv("SLURM_STEP_NUM_TASKS") && atoi(n) > 1)
        llmc_die("this process was started as one of %d Slurm tasks (SLURM_NTASKS=%s, SLURM_PROCID=%s), but data "
                 "parallelism is not built yet in this trainer. Run one task (srun -n 1)", atoi(n), n, rank);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int dist_have_mpi(void) { return LLMC_HAVE_MPI ? 1 : 0; }

static Dist world = {.size = 1, .launcher = "one process", .timeout_s = DIST_DEFAULT_TIMEOUT_S};
Dist *dist_world(void) { return &world; }

#if LLMC_HAVE_MPI
static const DistOps mpi_ops;
static int mpi_heartbeat_ok; /* MPI gave MPI_THREAD_SERIALIZED: rank 0 can send heartbeats from a thread */
#endif

/* -pi tcp | fs: the size and rank from -pn / -pr, or from the launcher that started the
 * processes (srun, mpirun) when it announces them; then dist_tcp.c connects them. */
static void join_tcp(Dist *d, const DistFlags *f, int env_size, const char *var) {
    int size = f->pn, rank = f->pr;
    if (env_size > 1) {
        const char *rv = getenv("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : getenv("SLURM_PROCID") ? "SLURM_PROCID" : NULL;
        if (!rv)
            llmc_die("-pi %s: this process was started as one of %d (%s=%s) but the launcher gives no rank "
                     "(OMPI_COMM_WORLD_RANK or SLURM_PROCID): give each process -pn %d -pr RANK", f->init, env_size, var,
                     getenv(var), env_size);
        if (f->pn > 1 && f->pn != env_size)
            llmc_die("-pn %d does not match the %d processes the launcher started (%s=%s)", f->pn, env_size, var, getenv(var));
        int launcher_rank = atoi(getenv(rv));
        if (f->pr != 0 && f->pr != launcher_rank)
            llmc_die("-pr %d does not match this process's rank %d from the launcher (%s); drop -pr", f->pr, launcher_rank, rv);
        size = env_size, rank = launcher_rank;
    }
    if (rank < 0 || rank >= size) llmc_die("-pr %d: a rank is 0 .. %d with -pn %d", rank, size - 1, size);
    dist_tcp_join(d, f, size, rank);
}

/* The other ranks keep stderr (their errors) and lose stdout (tests: all keep it when
 * LLMC_TEST_ALL_RANKS_STDOUT is set, to compare what each rank would log). */
static Dist *one_voice(Dist *d) {
    llmc_set_error_rank(d->rank, d->size);
    if (d->rank != 0 && !getenv("LLMC_TEST_ALL_RANKS_STDOUT") && !freopen("/dev/null", "w", stdout))
        llmc_die("rank %d: cannot silence stdout", d->rank);
    return d;
}

Dist *dist_init(int *argc, char ***argv, const DistFlags *f, int can_parallel) {
    Dist *d = &world;
    memset(d, 0, sizeof *d);
    d->size = 1;
    d->timeout_s = f->timeout_s > 0 ? f->timeout_s : DIST_DEFAULT_TIMEOUT_S;
    snprintf(d->launcher, sizeof d->launcher, "one process");
    const char *var;
    int env_size = launcher_size(&var);
    if (!can_parallel || (env_size <= 1 && f->pn <= 1)) {
        if (!can_parallel) {
            if (f->pn > 1)
                llmc_die("-pn %d: this build of the trainer has no data parallelism (./train_gpt needs NCCL for it; "
                         "./train_gpt_cpu has it): each process would train alone and write the same files. Run one "
                         "process (-pn 1), or rebuild where NCCL is installed", f->pn);
            dist_refuse_launcher();
        }
        if (f->pr != 0) llmc_die("-pr %d: a rank is 0 .. %d with -pn %d", f->pr, f->pn - 1, f->pn);
        (void)argc, (void)argv;
        return d;
    }
    if (strcmp(f->init, "mpi") != 0) {
        join_tcp(d, f, env_size, var);
        return one_voice(d);
    }
    const int flag_pn = f->pn, flag_pr = f->pr;
#if LLMC_HAVE_MPI
    /* the launchers this build joins set a rank beside the size: OpenMPI's mpirun, Slurm's srun */
    int joinable = (getenv("OMPI_COMM_WORLD_SIZE") && getenv("OMPI_COMM_WORLD_RANK")) ||
                   (getenv("SLURM_STEP_NUM_TASKS") && getenv("SLURM_PROCID"));
    if (env_size > 1 && !joinable) {
        if (strcmp(var, "SLURM_NTASKS") == 0)
            llmc_die("this process runs in a Slurm allocation of %d tasks (SLURM_NTASKS=%s) but was not started by "
                     "srun: for data parallelism start the ranks with 'srun %s ...' (scripts/run_dist.sh), or run "
                     "one process with 'srun -n 1'", env_size, getenv(var), (*argv)[0]);
        llmc_die("this process was started as one of %d (%s=%s) by a launcher this build cannot join: data "
                 "parallelism runs under OpenMPI's mpirun or Slurm's srun (they also set OMPI_COMM_WORLD_RANK or "
                 "SLURM_PROCID). Start it with mpirun, or unset %s if it is stale", env_size, var, getenv(var), var);
    }
    if (env_size <= 1)
        llmc_die("-pn %d asks for %d processes, but this one was started alone: start them with a launcher, e.g. "
                 "'mpirun -np %d %s ...' (one node), 'mpirun -np %d --hostfile hosts ...' or 'srun -n %d ...', or "
                 "without MPI each with -pr RANK and -pi tcp -ps HOST or -pi fs -pf DIR (scripts/run_dist.sh)",
                 flag_pn, flag_pn, flag_pn, (*argv)[0], flag_pn, flag_pn);
    int provided;
    /* SERIALIZED: the heartbeat thread (dist_busy_begin) calls MPI while the main thread does not */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        llmc_die("MPI_Init failed (%s=%d)", var, env_size);
    d->mpi = 1;
    mpi_heartbeat_ok = provided >= MPI_THREAD_SERIALIZED;

    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    if (!mpi_heartbeat_ok && d->rank == 0)
        fprintf(stderr, "note: this MPI gives no MPI_THREAD_SERIALIZED: rank 0 sends no heartbeat, so its checkpoints "
                "and samples count against the others' --dist-timeout\n");
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &d->local_rank);
    MPI_Comm_free(&local);
    snprintf(d->launcher, sizeof d->launcher, "%s", getenv("OMPI_COMM_WORLD_SIZE") ? "mpirun" : var[0] == 'S' ? "srun" : "MPI launcher");
    if (d->size != env_size)
        llmc_die("rank %d: the launcher announced %d processes (%s) but MPI has %d", d->rank, env_size, var, d->size);
    if (flag_pn > 1 && flag_pn != d->size)
        llmc_die("-pn %d does not match the %d processes started by %s (drop -pn, or start %d)", flag_pn, d->size,
                 d->launcher, flag_pn);
    if (flag_pr != 0)
        llmc_die("-pr %d: under %s each process takes its rank from the launcher; drop -pr", flag_pr, d->launcher);
    d->ops = &mpi_ops;
    return one_voice(d);
#else
    (void)argc, (void)flag_pr;
    int want = env_size > 1 ? env_size : flag_pn;
    char who[96];
    if (env_size > 1) snprintf(who, sizeof who, "the launcher (%s=%d)", var, env_size);
    else snprintf(who, sizeof who, "-pn %d", flag_pn);
    llmc_die("%s asks for %d processes with -pi mpi, but this %s was built without MPI. Either start the %d "
             "processes yourself with -pn %d -pr RANK and -pi tcp -ps HOST[:PORT] or -pi fs -pf DIR (no MPI needed; "
             "scripts/run_dist.sh local %d --pi fs ...), or install OpenMPI (apt-get install openmpi-bin "
             "libopenmpi-dev), rebuild (make clean && make) and start it with 'mpirun -np %d %s ...'",
             who, want, (*argv)[0], want, want, want, want, (*argv)[0]);
#endif
    return d;
}

void dist_finalize(Dist *d) {
    if (d->ops && d->ops->finalize) d->ops->finalize(d);
    d->ops = NULL;
    d->mpi = 0;
}

enum { CHUNK = 1 << 28 };
static int count_of(size_t n) {
    if (n > (size_t)CHUNK * 4) llmc_die("dist: a shard of %zu elements exceeds what one collective call takes", n);
    return (int)n;
}
static void shard_counts(const Dist *d, size_t n, int *counts, int *displs) {
    for (int r = 0; r < d->size; r++) {
        size_t lo, hi;
        dist_shard(n, d->size, r, &lo, &hi);
        counts[r] = count_of(hi - lo);
        displs[r] = count_of(lo);
    }
}
/* The next collective's number; none may start during announced rank-0 work (dist_busy_begin). */
static void next_collective(Dist *d) {
    if (d->busy) llmc_die("internal: a collective while rank 0 is %s (dist_busy_begin)", dist_busy_name(d->busy - 1));
    d->collectives++;
}
#define COMM_BEGIN double t0_ = now_ms()
#define COMM_END(bytes) (d->comm_ms += now_ms() - t0_, d->comm_bytes += (long long)(bytes))

#if LLMC_HAVE_MPI

/* ---- the collective watchdog ----
 * Every collective is started nonblocking and waited for by dist_wait, which polls it against
 * the deadline d->timeout_s. A rank whose collective has not completed by then asks every other
 * rank (point-to-point, TAG_PROBE) which collective it is waiting in; a rank waiting in
 * dist_wait answers at once (TAG_ANSWER, its collective's number). The ranks that do not answer
 * within a grace period are named as hung or dead, and this rank dies (exit status 1; mpirun
 * then ends the job). */
enum { TAG_PROBE = 7101, TAG_ANSWER = 7102, TAG_BUSY = 7103 };

/* Rank 0's heartbeats (dist_busy_begin) waiting here: taken; 1 when there was one (the deadline
 * then counts from now), *what: the work it announced. */
static int take_heartbeats(Dist *d, int *what) {
    int flag, heard = 0;
    if (d->rank == 0) return 0;
    for (;;) {
        MPI_Iprobe(0, TAG_BUSY, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        if (!flag) return heard;
        MPI_Recv(what, 1, MPI_INT, 0, TAG_BUSY, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        heard = 1;
    }
}

static void answer_probes(Dist *d) {
    int flag;
    MPI_Status st;
    for (;;) {
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_PROBE, MPI_COMM_WORLD, &flag, &st);
        if (!flag) return;
        unsigned long long asked, mine = d->collectives;
        MPI_Recv(&asked, 1, MPI_UNSIGNED_LONG_LONG, st.MPI_SOURCE, TAG_PROBE, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(&mine, 1, MPI_UNSIGNED_LONG_LONG, st.MPI_SOURCE, TAG_ANSWER, MPI_COMM_WORLD);
    }
}

static void pause_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

/* Past the deadline: asks the other ranks where they are and dies naming the silent ones, unless
 * the collective (req) completes meanwhile (a slow rank, not a hung one: returns). */
static void name_the_missing(Dist *d, MPI_Request *wait_req, const char *what) {
    const int P = d->size;
    unsigned long long *theirs = (unsigned long long *)mallocCheck(((size_t)P + 1) * sizeof *theirs, "watchdog");
    unsigned long long *mine = theirs + P;
    *mine = d->collectives;
    MPI_Request *req = (MPI_Request *)mallocCheck(2 * (size_t)P * sizeof *req, "watchdog");
    int *got = (int *)callocCheck((size_t)P, sizeof(int), "watchdog");
    for (int r = 0; r < P; r++) {
        req[r] = req[P + r] = MPI_REQUEST_NULL;
        if (r == d->rank) continue;
        MPI_Irecv(&theirs[r], 1, MPI_UNSIGNED_LONG_LONG, r, TAG_ANSWER, MPI_COMM_WORLD, &req[r]);
        MPI_Isend(mine, 1, MPI_UNSIGNED_LONG_LONG, r, TAG_PROBE, MPI_COMM_WORLD, &req[P + r]);
    }
    double grace = d->timeout_s / 2 < 10.0 ? d->timeout_s / 2 : 10.0, t0 = now_ms();
    int pending = P - 1, done = 0;
    while (pending > 0 && now_ms() - t0 < grace * 1e3) {
        answer_probes(d);
        MPI_Test(wait_req, &done, MPI_STATUS_IGNORE);
        if (done) { /* it arrived: the answers still to come are dropped */
            fprintf(stderr, "note: rank %d: the %s (collective #%llu) took longer than --dist-timeout %g s; a slow rank "
                    "arrived during the watchdog's grace period, training continues\n", d->rank, what, *mine, d->timeout_s);
            for (int r = 0; r < P; r++)
                if (r != d->rank && !got[r]) {
                    MPI_Cancel(&req[r]);
                    MPI_Request_free(&req[r]);
                }
            for (int r = 0; r < P; r++)
                if (r != d->rank) MPI_Request_free(&req[P + r]);
            /* (theirs and mine stay allocated: freed requests may still use them) */
            free(req), free(got);
            return;
        }
        for (int r = 0; r < P; r++) {
            int flag = 0;
            if (r == d->rank || got[r]) continue;
            MPI_Test(&req[r], &flag, MPI_STATUS_IGNORE);
            if (flag) got[r] = 1, pending--;
        }
        pause_us(1000);
    }
    char silent[512] = "", elsewhere[512] = "";
    size_t ns = 0, ne = 0;
    for (int r = 0; r < P; r++) {
        if (r == d->rank) continue;
        if (!got[r] && ns < sizeof silent - 16) ns += (size_t)snprintf(silent + ns, sizeof silent - ns, "%s%d", ns ? ", " : "", r);
        else if (got[r] && theirs[r] != *mine && ne < sizeof elsewhere - 48)
            ne += (size_t)snprintf(elsewhere + ne, sizeof elsewhere - ne, "%srank %d is in collective #%llu", ne ? ", " : "", r,
                                   theirs[r]);
    }
    if (ns)
        llmc_die("rank %d: the %s (collective #%llu) did not complete within --dist-timeout %g s: rank%s %s did not "
                 "answer (hung, stopped or dead)%s%s",
                 d->rank, what, *mine, d->timeout_s, strchr(silent, ',') ? "s" : "", silent, ne ? "; " : "", elsewhere);
    llmc_die("rank %d: the %s (collective #%llu) did not complete within --dist-timeout %g s: every rank answered%s%s "
             "(the ranks are out of step; a bug)",
             d->rank, what, *mine, d->timeout_s, ne ? ": " : "", elsewhere);
}

/* Waits for a collective started by this rank, dying by the watchdog's rule past the deadline
 * (counted from rank 0's last heartbeat when it sends them). */
static void dist_wait(Dist *d, MPI_Request *req, const char *what) {
    int done = 0, busy = -1;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    double t0 = now_ms();
    const double limit = d->timeout_s * 1e3;
    for (long spins = 0;; spins++) {
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        if (spins < 2000) continue;
        answer_probes(d);
        if (take_heartbeats(d, &busy)) t0 = now_ms();
        double waited = now_ms() - t0;
        if (waited > limit) break;
        pause_us(waited < 10.0 ? 20 : 200);
    }
    if (busy >= 0)
        fprintf(stderr, "note: rank %d: rank 0's last heartbeat was more than --dist-timeout %g s ago; it said it was %s\n",
                d->rank, d->timeout_s, dist_busy_name(busy));
    name_the_missing(d, req, what);
}

/* Rank 0's heartbeat thread: a TAG_BUSY message to every other rank each period until stopped. */
static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, what;
    Dist *d;
} beat = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* One heartbeat to every other rank (the caller holds beat.mu or is the only thread calling MPI). */
static void beat_all(Dist *d) {
    for (int r = 1; r < d->size; r++) {
        MPI_Request req;
        MPI_Isend(&beat.what, 1, MPI_INT, r, TAG_BUSY, MPI_COMM_WORLD, &req);
        MPI_Request_free(&req); /* (eager: it completes by itself) */
    }
}

static void *heartbeat_main(void *arg) {
    (void)arg;
    Dist *d = beat.d;
    pthread_mutex_lock(&beat.mu);
    while (!beat.stop) {
        beat_all(d);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double at = ts.tv_sec + ts.tv_nsec * 1e-9 + dist_heartbeat_s(d);
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        while (!beat.stop && pthread_cond_timedwait(&beat.cv, &beat.mu, &ts) == 0) {}
    }
    pthread_mutex_unlock(&beat.mu);
    return NULL;
}

static void mpi_busy(Dist *d, int what) {
    if (!mpi_heartbeat_ok) return; /* (no thread support: the deadline runs as before) */
    if (what >= 0) {
        beat.d = d, beat.what = what, beat.stop = 0;
        beat_all(d); /* the first one now, before the work starts (whatever the thread's start-up takes) */
        if (pthread_create(&beat.thread, NULL, heartbeat_main, NULL) != 0) llmc_die("rank 0: cannot start the heartbeat thread");
        return;
    }
    pthread_mutex_lock(&beat.mu);
    beat.stop = 1;
    pthread_cond_signal(&beat.cv);
    pthread_mutex_unlock(&beat.mu);
    pthread_join(beat.thread, NULL);
}
#define START(call) MPI_Request req_; call; dist_wait(d, &req_, what)

static MPI_Datatype mpi_type(DistType t) {
    return t == DIST_F32 ? MPI_FLOAT : t == DIST_F64 ? MPI_DOUBLE : t == DIST_U32 ? MPI_UINT32_T : MPI_UINT64_T;
}

static void mpi_reduce_scatter_f32(Dist *d, const float *send, float *recv, const int *counts, const char *what) {
    START(MPI_Ireduce_scatter(send ? (const void *)send : MPI_IN_PLACE, recv, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req_));
}
static void mpi_allgatherv(Dist *d, void *buf, const int *counts, const int *displs, DistType t, const char *what) {
    START(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, mpi_type(t), MPI_COMM_WORLD, &req_));
}
static void mpi_allgatherv_begin(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req) {
    (void)d;
    _Static_assert(sizeof(MPI_Request) <= sizeof req->handle, "DistRequest holds an MPI_Request");
    MPI_Request r;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, MPI_COMM_WORLD, &r);
    memcpy(req->handle, &r, sizeof r);
    req->active = 1;
}
static void mpi_wait(Dist *d, DistRequest *req, const char *what) {
    MPI_Request r;
    memcpy(&r, req->handle, sizeof r);
    dist_wait(d, &r, what);
}
static void mpi_gatherv_f32(Dist *d, const float *shard, float *full, const int *counts, const int *displs, const char *what) {
    START(MPI_Igatherv(shard, counts[d->rank], MPI_FLOAT, full, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD, &req_));
}
static void mpi_bcast(Dist *d, void *buf, size_t bytes, const char *what) {
    for (size_t i = 0; i < bytes; i += CHUNK) {
        int k = (int)(bytes - i < CHUNK ? bytes - i : CHUNK);
        if (i) d->collectives++;
        START(MPI_Ibcast((char *)buf + i, k, MPI_BYTE, 0, MPI_COMM_WORLD, &req_));
    }
}
static void mpi_barrier(Dist *d, const char *what) { START(MPI_Ibarrier(MPI_COMM_WORLD, &req_)); }
/* A barrier first (the others wait, hearing the heartbeat, while rank 0 writes the last
 * checkpoint), then every heartbeat still queued taken, so none is left unreceived. */
static void mpi_finalize(Dist *d) {
    if (!d->mpi) return;
    if (d->size > 1) {
        int busy;
        d->collectives++;
        mpi_barrier(d, "barrier at the end");
        take_heartbeats(d, &busy);
    }
    MPI_Finalize();
}
/* expert parallelism's exchange (dist_alltoallv_f32) */
static void mpi_alltoallv(Dist *d, const void *send, const int *scounts, const int *sdispls, void *recv, const int *rcounts,
                          const int *rdispls, DistType t, const char *what) {
    START(MPI_Ialltoallv(send, scounts, sdispls, mpi_type(t), recv, rcounts, rdispls, mpi_type(t), MPI_COMM_WORLD, &req_));
}
static const DistOps mpi_ops = {"MPI", mpi_reduce_scatter_f32, mpi_allgatherv, mpi_allgatherv_begin, mpi_wait,
                                mpi_gatherv_f32, mpi_bcast, mpi_barrier, mpi_busy, mpi_finalize, mpi_alltoallv};
#endif

/* ---- the collectives: what every transport shares ---- */

/* MPI_Allreduce may round differently on different ranks (the standard only advises against it);
 * a reduce-scatter (each element summed once, by its owner) then an all-gather gives every rank
 * the same bits. */
void dist_allreduce_f32(Dist *d, float *buf, size_t n) {
    if (d->size == 1) return;
    size_t lo, hi;
    dist_shard(n, d->size, d->rank, &lo, &hi);
    float *shard = (float *)mallocCheck((hi > lo ? hi - lo : 1) * sizeof(float), "gradient shard");
    dist_reduce_scatter_f32(d, buf, shard, n);
    memcpy(buf + lo, shard, (hi - lo) * sizeof(float));
    free(shard);
    dist_allgather_f32(d, buf, n);
}

/* Every rank's n values (8 bytes each) in rank order into all[P * n] (this rank's are at
 * all[rank * n] already). */
static void allgather_values(Dist *d, void *all, int n, DistType t, const char *what) {
    int *counts = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "counts");
    for (int r = 0; r < d->size; r++) counts[r] = n, counts[d->size + r] = r * n;
    next_collective(d);
    d->ops->allgatherv(d, all, counts, counts + d->size, t, what);
    free(counts);
}

/* every rank's values gathered, then summed in rank order: the same bits everywhere */
void dist_allreduce_f64(Dist *d, double *buf, int n) {
    if (d->size == 1) return;
    double *all = (double *)mallocCheck((size_t)n * (size_t)d->size * sizeof(double), "allreduce");
    memcpy(all + (size_t)d->rank * n, buf, (size_t)n * sizeof(double));
    COMM_BEGIN;
    allgather_values(d, all, n, DIST_F64, "all-reduce (fp64)");
    COMM_END((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int r = 0; r < d->size; r++) s += all[(size_t)r * n + i];
        buf[i] = s;
    }
    free(all);
}

void dist_reduce_scatter_f32(Dist *d, const float *full, float *shard, size_t n) {
    size_t lo, hi;
    dist_shard(n, d->size, d->rank, &lo, &hi);
    if (d->size == 1) {
        memcpy(shard, full + lo, (hi - lo) * sizeof(float));
        return;
    }
    int *counts = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "shard counts");
    shard_counts(d, n, counts, counts + d->size);
    COMM_BEGIN;
    next_collective(d);
    d->ops->reduce_scatter_f32(d, full, shard, counts, "reduce-scatter");
    COMM_END(n * sizeof(float) / (size_t)d->size * (size_t)(d->size - 1)); /* a ring's share */
    free(counts);
}

void dist_allgather_f32(Dist *d, float *full, size_t n) {
    if (d->size == 1) return;
    int *counts = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "shard counts");
    shard_counts(d, n, counts, counts + d->size);
    COMM_BEGIN;
    next_collective(d);
    d->ops->allgatherv(d, full, counts, counts + d->size, DIST_F32, "all-gather");
    COMM_END((size_t)counts[d->rank] * sizeof(float) * (size_t)(d->size - 1));
    free(counts);
}

void dist_gather_f32(Dist *d, const float *shard, float *full, size_t n) {
    size_t lo, hi;
    dist_shard(n, d->size, d->rank, &lo, &hi);
    if (d->size == 1) {
        if (full + lo != shard) memmove(full + lo, shard, (hi - lo) * sizeof(float));
        return;
    }
    int *counts = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "shard counts");
    shard_counts(d, n, counts, counts + d->size);
    COMM_BEGIN;
    next_collective(d);
    d->ops->gatherv_f32(d, shard, full, counts, counts + d->size, "gather");
    COMM_END((hi - lo) * sizeof(float));
    free(counts);
}

void dist_bcast_bytes(Dist *d, void *buf, size_t bytes) {
    if (d->size == 1) return;
    COMM_BEGIN;
    next_collective(d);
    d->ops->bcast(d, buf, bytes, "broadcast");
    COMM_END(bytes);
}

void dist_allgather_bytes(Dist *d, void *buf, size_t bytes) {
    if (d->size == 1) return;
    if (bytes % 4) llmc_die("internal: dist_allgather_bytes of %zu bytes, not a multiple of 4", bytes);
    int *counts = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "counts");
    for (int r = 0; r < d->size; r++) counts[r] = count_of(bytes / 4), counts[d->size + r] = count_of((size_t)r * bytes / 4);
    COMM_BEGIN;
    next_collective(d);
    d->ops->allgatherv(d, buf, counts, counts + d->size, DIST_U32, "all-gather (compressed gradients)");
    COMM_END(bytes * (size_t)(d->size - 1));
    free(counts);
}

void dist_allgather_u64(Dist *d, uint64_t v, uint64_t *out) {
    out[d->rank] = v;
    if (d->size > 1) allgather_values(d, out, 1, DIST_U64, "all-gather (u64)");
}

void dist_barrier(Dist *d) {
    if (d->size == 1) return;
    next_collective(d);
    d->ops->barrier(d, "barrier");
}

void dist_reduce_scatter_parts_f32(Dist *d, float *buf, const int *counts) {
    if (d->size == 1) return;
    size_t total = 0;
    for (int r = 0; r < d->size; r++) total += (size_t)counts[r];
    COMM_BEGIN;
    next_collective(d);
    d->ops->reduce_scatter_f32(d, NULL, buf, counts, "reduce-scatter (bucket)");
    COMM_END((total - (size_t)counts[d->rank]) * sizeof(float));
}

void dist_allgather_parts_begin(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req) {
    req->active = 0;
    if (d->size == 1) return;
    COMM_BEGIN; /* (a transport that completes it here: its time counts here) */
    next_collective(d);
    d->ops->allgatherv_begin(d, buf, counts, displs, req);
    COMM_END((long long)counts[d->rank] * (long long)sizeof(float) * (d->size - 1));
}

void dist_wait_request(Dist *d, DistRequest *req, const char *what) {
    if (req->active) {
        COMM_BEGIN;
        d->ops->wait(d, req, what);
        COMM_END(0);
    }
    req->active = 0;
}

/* ---- all-to-all and rank-group collectives (expert parallelism, issue 24) ----
 * One all-to-all over the world per call: ranks outside a group exchange nothing with it, so
 * every group of a partition runs its collective in the same call. */
static void alltoallv_displs(Dist *d, const void *send, const int *scounts, const int *sdispls, void *recv,
                             const int *rcounts, const int *rdispls, const char *what) {
    if (d->size == 1) {
        if (scounts[0] != rcounts[0]) llmc_die("internal: dist all-to-all sends %d to itself, expects %d", scounts[0], rcounts[0]);
        memmove((float *)recv + rdispls[0], (const float *)send + sdispls[0], (size_t)scounts[0] * sizeof(float));
        return;
    }
    size_t sent = 0;
    for (int r = 0; r < d->size; r++) sent += r == d->rank ? 0 : (size_t)scounts[r];
    COMM_BEGIN;
    next_collective(d);
    d->ops->alltoallv(d, send, scounts, sdispls, recv, rcounts, rdispls, DIST_U32, what);
    COMM_END(sent * 4);
}

/* displacements back to back from the counts: out[0 .. P) for the sends, out[P .. 2P) for the receives */
static int *prefix_displs(const Dist *d, const int *scounts, const int *rcounts) {
    int *out = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "all-to-all displacements");
    size_t a = 0, b = 0;
    for (int r = 0; r < d->size; r++) {
        out[r] = count_of(a), out[d->size + r] = count_of(b);
        a += (size_t)scounts[r], b += (size_t)rcounts[r];
    }
    count_of(a), count_of(b);
    return out;
}

void dist_alltoallv_f32(Dist *d, const float *send, const int *scounts, float *recv, const int *rcounts) {
    int *displs = prefix_displs(d, scounts, rcounts);
    alltoallv_displs(d, send, scounts, displs, recv, rcounts, displs + d->size, "all-to-all (experts)");
    free(displs);
}

void dist_alltoall_i32(Dist *d, const int32_t *send, int n, int32_t *recv) {
    int *c = (int *)mallocCheck(3 * (size_t)d->size * sizeof(int), "all-to-all counts");
    for (int r = 0; r < d->size; r++) c[r] = n, c[d->size + r] = r * n;
    alltoallv_displs(d, send, c, c + d->size, recv, c, c + d->size, "all-to-all (expert counts)");
    free(c);
}

/* this rank's place in members (dies when it is not one) */
static int member_index(const Dist *d, const int *members, int m) {
    for (int j = 0; j < m; j++)
        if (members[j] == d->rank) return j;
    llmc_die("internal: rank %d is not in its own rank group", d->rank);
}

void dist_group_allreduce_f32(Dist *d, float *buf, size_t n, const int *members, int m) {
    if (m <= 1) return;
    const int P = d->size, me = member_index(d, members, m);
    size_t lo, hi;
    dist_shard(n, m, me, &lo, &hi);
    const size_t k = hi - lo;
    float *parts = (float *)mallocCheck(((size_t)m * k + 1) * sizeof(float), "group all-reduce");
    int *c = (int *)callocCheck(4 * (size_t)P, sizeof(int), "group all-reduce counts");
    /* reduce-scatter: member j gets every member's run j, summed here in member order */
    for (int j = 0; j < m; j++) {
        size_t a, b;
        dist_shard(n, m, j, &a, &b);
        c[members[j]] = count_of(b - a), c[P + members[j]] = count_of(a);
        c[2 * P + members[j]] = count_of(k), c[3 * P + members[j]] = count_of((size_t)j * k);
    }
    alltoallv_displs(d, buf, c, c + P, parts, c + 2 * P, c + 3 * P, "group all-reduce (reduce-scatter)");
    for (size_t i = 0; i < k; i++) {
        float s = parts[i];
        for (int j = 1; j < m; j++) s += parts[(size_t)j * k + i];
        parts[i] = s;
    }
    /* all-gather: this rank's summed run to every member */
    for (int j = 0; j < m; j++) {
        int t;
        t = c[members[j]], c[members[j]] = c[2 * P + members[j]], c[2 * P + members[j]] = t;
        c[P + members[j]] = 0;
        size_t a, b;
        dist_shard(n, m, j, &a, &b);
        c[3 * P + members[j]] = count_of(a);
    }
    alltoallv_displs(d, parts, c, c + P, buf, c + 2 * P, c + 3 * P, "group all-reduce (all-gather)");
    free(parts);
    free(c);
}

void dist_group_allgather_f32(Dist *d, float *full, size_t n, const int *members, int m) {
    if (m <= 1) return;
    const int P = d->size, me = member_index(d, members, m);
    size_t lo, hi;
    dist_shard(n, m, me, &lo, &hi);
    float *mine = (float *)mallocCheck((hi - lo + 1) * sizeof(float), "group all-gather");
    memcpy(mine, full + lo, (hi - lo) * sizeof(float));
    int *c = (int *)callocCheck(4 * (size_t)P, sizeof(int), "group all-gather counts");
    for (int j = 0; j < m; j++) {
        size_t a, b;
        dist_shard(n, m, j, &a, &b);
        c[members[j]] = count_of(hi - lo);
        c[2 * P + members[j]] = count_of(b - a), c[3 * P + members[j]] = count_of(a);
    }
    alltoallv_displs(d, mine, c, c + P, full, c + 2 * P, c + 3 * P, "group all-gather");
    free(mine);
    free(c);
}

static const char *const BUSY_NAMES[DIST_BUSY_COUNT] = {"preparing the output directory", "sampling",
                                                        "writing a checkpoint"};
const char *dist_busy_name(int what) { return what >= 0 && what < DIST_BUSY_COUNT ? BUSY_NAMES[what] : "?"; }

double dist_heartbeat_s(const Dist *d) { return d->timeout_s / 4 < 2.0 ? d->timeout_s / 4 : 2.0; }

void dist_busy_begin(Dist *d, DistBusy what) {
    if (d->size == 1 || d->rank != 0) return;
    if (d->busy) llmc_die("internal: rank 0 announced %s while %s", dist_busy_name(what), dist_busy_name(d->busy - 1));
    d->busy = (int)what + 1;
    if (d->ops->busy) d->ops->busy(d, (int)what);
    /* Tests only: LLMC_TEST_BUSY_SLEEP=SECONDS makes every announced work this long (a slow disk) */
    const char *e = getenv("LLMC_TEST_BUSY_SLEEP");
    if (e && atof(e) > 0) {
        fprintf(stderr, "rank 0: LLMC_TEST_BUSY_SLEEP: %s for %g s\n", dist_busy_name(what), atof(e));
        struct timespec ts = {(time_t)atof(e), (long)((atof(e) - (double)(time_t)atof(e)) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {}
    }
}

void dist_busy_end(Dist *d) {
    if (d->size == 1 || d->rank != 0 || !d->busy) return;
    if (d->ops->busy) d->ops->busy(d, -1);
    d->busy = 0;
}

void dist_take_comm(Dist *d, double *ms, long long *bytes) {
    *ms = d->comm_ms;
    *bytes = d->comm_bytes;
    d->comm_ms = 0.0;
    d->comm_bytes = 0;
}
