/*
 * nccl.cpp - NCCL for cudasim, behind the real nccl.h declarations: ranks are separate processes
 * (launched by mpirun or anything else) on one machine, meeting in a POSIX shared-memory segment
 * named by the ncclUniqueId.
 *
 * Semantics (NCCL's documented ones; everything is synchronous, like cudasim's streams: a
 * collective has completed when the call returns):
 *   AllReduce(count)            recv[i] = op over ranks of send[i]
 *   ReduceScatter(recvcount)    recv[i] = op over ranks of send[rank*recvcount + i]
 *   AllGather(sendcount)        recv[r*sendcount + i] = send of rank r [i]
 *   Broadcast(count, root)      recv[i] = send of root [i]
 *   Reduce(count, root)         on root: recv[i] = op over ranks of send[i]; other ranks' recv untouched
 * In-place forms (send == recv, or NCCL's offset in-place forms) work. ncclAvg is the sum divided
 * by nranks. Reductions are deterministic: the values are combined in rank order (r0, r1, ...);
 * fp16/bf16 are combined in fp32 and rounded once (round to nearest even), so every rank gets
 * bit-identical results. Group calls (ncclGroupStart/End) are accepted; each collective inside
 * runs when called (every rank issues the same sequence, so the order is the same everywhere).
 *
 * Checks: every rank of a collective must call the same kind, count, type, op and root as rank 0,
 * else every rank prints what differs and gets ncclInvalidUsage. A rank whose process is gone
 * (exited, killed, zombie) makes the others' waits fail with ncclRemoteError within about 10 ms
 * of noticing; any wait longer than CUDASIM_NCCL_TIMEOUT seconds (default 600) fails with
 * ncclSystemError. After a failure (or ncclCommAbort) the segment is marked aborted and every
 * later call on any rank fails at once.
 *
 * Layout: a header (nranks, a barrier, the abort flag) then one slot per rank (its pid, the
 * descriptor of its current collective and a staging buffer). A collective moves through the
 * staging buffers in chunks: each rank copies its chunk in, barrier, each rank computes its
 * result from all slots in rank order, barrier. rank 0 unlinks the segment name once every rank
 * has joined, so nothing is left in /dev/shm after a normal run.
 * One rank (nranks == 1) needs no segment: every collective is a copy.
 */
#include "cudasim.h"

#if __has_include(<nccl.h>)
#include <nccl.h>

#include <atomic>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace {
size_t nccl_type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

const size_t kStage = 4u << 20; /* staging bytes per rank */
const int kCommMagic = 0x4e43434c;
const int kSegMagic = 0x53494d4e;

enum Kind { kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast, kJoin, kReduce };
const char *kind_name(int k) {
    static const char *n[] = {"?", "ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast", "join", "ncclReduce"};
    return k >= 0 && k <= kReduce ? n[k] : "?";
}

struct Desc {
    int kind, type, op, root;
    size_t count;
};
struct Slot {
    std::atomic<int> pid;
    Desc desc;
    alignas(64) unsigned char stage[kStage];
};
struct Seg {
    std::atomic<int> magic, nranks, joined, aborted;
    std::atomic<unsigned> arrived, generation;
    alignas(64) Slot slot[1]; /* nranks of them */
};
static_assert(std::atomic<int>::is_always_lock_free, "cross-process atomics need lock-free ints");

struct Comm {
    int magic, rank, nranks;
    Seg *seg;
    size_t seg_bytes;
    char name[64];
};

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double timeout_s() {
    const char *e = getenv("CUDASIM_NCCL_TIMEOUT");
    double t = e ? atof(e) : 0;
    return t > 0 ? t : 600;
}
bool pid_alive(int pid) {
    if (pid <= 0) return true; /* not joined yet */
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Waits until done() or failure; checks the peers every 10 ms. */
template <class F> ncclResult_t wait_for(Comm *c, const char *what, F done) {
    double start = now_s(), limit = timeout_s(), next_check = start + 0.01;
    for (unsigned spin = 0;; spin++) {
        if (done()) return ncclSuccess;
        if (c->seg->aborted.load() && !done()) { /* done() again: the abort may have come after it */
            fprintf(stderr, "cudasim NCCL: rank %d: %s: the communicator was aborted by another rank\n", c->rank, what);
            return ncclRemoteError;
        }
        if (spin < 64) continue;
        usleep(spin < 1000 ? 20 : 200);
        double t = now_s();
        if (t < next_check) continue;
        next_check = t + 0.01;
        for (int r = 0; r < c->nranks; r++)
            if (r != c->rank && !pid_alive(c->seg->slot[r].pid.load())) {
                fprintf(stderr, "cudasim NCCL: rank %d: %s: rank %d (pid %d) is gone\n", c->rank, what, r, c->seg->slot[r].pid.load());
                c->seg->aborted.store(1);
                return ncclRemoteError;
            }
        if (t - start > limit) {
            fprintf(stderr, "cudasim NCCL: rank %d: %s: no progress for %.0f s (CUDASIM_NCCL_TIMEOUT)\n", c->rank, what, limit);
            c->seg->aborted.store(1);
            return ncclSystemError;
        }
    }
}

ncclResult_t barrier(Comm *c, const char *what) {
    Seg *s = c->seg;
    unsigned gen = s->generation.load();
    if (s->arrived.fetch_add(1) + 1 == (unsigned)c->nranks) {
        s->arrived.store(0);
        s->generation.fetch_add(1);
        return ncclSuccess;
    }
    return wait_for(c, what, [&] { return s->generation.load() != gen; });
}

Comm *check_comm(ncclComm_t comm, const char *fn) {
    Comm *c = (Comm *)comm;
    if (!c || c->magic != kCommMagic) {
        fprintf(stderr, "cudasim NCCL: %s: invalid communicator\n", fn);
        return nullptr;
    }
    return c;
}

/* Every rank's descriptor equals rank 0's (called between two barriers). */
ncclResult_t check_descs(Comm *c) {
    const Desc &a = c->seg->slot[0].desc;
    for (int r = 1; r < c->nranks; r++) {
        const Desc &b = c->seg->slot[r].desc;
        if (a.kind != b.kind || a.type != b.type || a.op != b.op || a.root != b.root || a.count != b.count) {
            fprintf(stderr,
                    "cudasim NCCL: rank %d: mismatched collectives: rank 0 called %s(count %zu, type %d, op %d, root %d), "
                    "rank %d called %s(count %zu, type %d, op %d, root %d)\n",
                    c->rank, kind_name(a.kind), a.count, a.type, a.op, a.root, r, kind_name(b.kind), b.count, b.type, b.op,
                    b.root);
            return ncclInvalidUsage;
        }
    }
    return ncclSuccess;
}

float to_f(const void *p, ncclDataType_t t) {
    return t == ncclFloat16 ? __half2float(*(const __half *)p) : __bfloat162float(*(const __nv_bfloat16 *)p);
}
void from_f(void *p, float v, ncclDataType_t t) {
    if (t == ncclFloat16) *(__half *)p = __float2half_rn(v);
    else *(__nv_bfloat16 *)p = __float2bfloat16_rn(v);
}
template <class T> T combine(T a, T b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return a + b;
    }
}
/* out[i] = op over ranks r of (T)stage_r[off + i], in rank order. */
template <class T> void reduce_typed(Comm *c, size_t off, size_t n, T *out, ncclRedOp_t op) {
    for (size_t i = 0; i < n; i++) {
        T acc = ((const T *)c->seg->slot[0].stage)[off + i];
        for (int r = 1; r < c->nranks; r++) acc = combine(acc, ((const T *)c->seg->slot[r].stage)[off + i], op);
        if (op == ncclAvg) acc = acc / (T)c->nranks;
        out[i] = acc;
    }
}
void reduce(Comm *c, size_t off, size_t n, void *out, ncclDataType_t t, ncclRedOp_t op) {
    switch (t) {
    case ncclInt8: reduce_typed(c, off, n, (int8_t *)out, op); break;
    case ncclUint8: reduce_typed(c, off, n, (uint8_t *)out, op); break;
    case ncclInt32: reduce_typed(c, off, n, (int32_t *)out, op); break;
    case ncclUint32: reduce_typed(c, off, n, (uint32_t *)out, op); break;
    case ncclInt64: reduce_typed(c, off, n, (int64_t *)out, op); break;
    case ncclUint64: reduce_typed(c, off, n, (uint64_t *)out, op); break;
    case ncclFloat32: reduce_typed(c, off, n, (float *)out, op); break;
    case ncclFloat64: reduce_typed(c, off, n, (double *)out, op); break;
    default: /* fp16 / bf16: fp32 in rank order, one rounding */
        for (size_t i = 0; i < n; i++) {
            float acc = to_f(c->seg->slot[0].stage + 2 * (off + i), t);
            for (int r = 1; r < c->nranks; r++) acc = combine(acc, to_f(c->seg->slot[r].stage + 2 * (off + i), t), op);
            if (op == ncclAvg) acc /= c->nranks;
            from_f((char *)out + 2 * i, acc, t);
        }
    }
}

ncclResult_t collective(Kind kind, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm) {
    const char *fn = kind_name(kind);
    Comm *c = check_comm(comm, fn);
    if (!c) return ncclInvalidArgument;
    size_t es = nccl_type_size(t);
    if (!es) {
        fprintf(stderr, "cudasim NCCL: %s: unsupported data type %d\n", fn, (int)t);
        return ncclInvalidArgument;
    }
    if ((unsigned)op >= (unsigned)ncclNumOps) {
        fprintf(stderr, "cudasim NCCL: %s: unsupported reduction op %d\n", fn, (int)op);
        return ncclInvalidArgument;
    }
    if (root < 0 || root >= c->nranks) {
        fprintf(stderr, "cudasim NCCL: %s: root %d outside 0..%d\n", fn, root, c->nranks - 1);
        return ncclInvalidArgument;
    }
    const int P = c->nranks, me = c->rank;
    if (P == 1) {
        if (send != recv && count) memmove(recv, send, count * es);
        return ncclSuccess;
    }
    if (c->seg->aborted.load()) {
        fprintf(stderr, "cudasim NCCL: rank %d: %s: the communicator was aborted\n", me, fn);
        return ncclRemoteError;
    }
    Slot &mine = c->seg->slot[me];
    mine.desc = Desc{kind, (int)t, kind == kAllReduce || kind == kReduceScatter || kind == kReduce ? (int)op : 0, root, count};
    /* chunk: elements per rank block that fit in a slot */
    size_t chunk = kind == kReduceScatter ? kStage / es / P : kStage / es;
    bool first = true;
    for (size_t i0 = 0; first || i0 < count; i0 += chunk, first = false) {
        size_t n = count - i0 < chunk ? count - i0 : chunk;
        const char *s = (const char *)send;
        char *d = (char *)recv;
        if (kind == kReduceScatter)
            for (int b = 0; b < P; b++) memcpy(mine.stage + b * n * es, s + (b * count + i0) * es, n * es);
        else if (kind != kBroadcast || me == root)
            memcpy(mine.stage, s + i0 * es, n * es);
        ncclResult_t r = barrier(c, fn);
        if (r == ncclSuccess && first) r = check_descs(c);
        if (r != ncclSuccess) {
            c->seg->aborted.store(1);
            return r;
        }
        switch (kind) {
        case kAllReduce: reduce(c, 0, n, d + i0 * es, t, op); break;
        case kReduce:
            if (me == root) reduce(c, 0, n, d + i0 * es, t, op);
            break;
        case kReduceScatter: reduce(c, me * n, n, d + i0 * es, t, op); break;
        case kAllGather:
            for (int b = 0; b < P; b++) memcpy(d + (b * count + i0) * es, c->seg->slot[b].stage, n * es);
            break;
        default: memcpy(d + i0 * es, c->seg->slot[root].stage, n * es); break;
        }
        if ((r = barrier(c, fn)) != ncclSuccess) return r;
    }
    return ncclSuccess;
}

void unmap(Comm *c) {
    if (c->seg) munmap(c->seg, c->seg_bytes);
    c->seg = nullptr;
}
} // namespace

extern "C" {
ncclResult_t ncclGetVersion(int *version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static std::atomic<unsigned> serial{0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/cudasim-nccl-%d-%lx-%u", (int)getpid(),
             (unsigned long)(ts.tv_sec * 1000000000ull + ts.tv_nsec), serial.fetch_add(1));
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        fprintf(stderr, "cudasim NCCL: ncclCommInitRank(nranks %d, rank %d): rank outside 0..nranks-1\n", nranks, rank);
        return ncclInvalidArgument;
    }
    Comm *c = new Comm{kCommMagic, rank, nranks, nullptr, 0, {0}};
    if (nranks == 1) {
        *comm = (ncclComm_t)c;
        return ncclSuccess;
    }
    if (id.internal[0] != '/' || !memchr(id.internal, 0, sizeof id.internal) || strlen(id.internal) >= sizeof c->name) {
        fprintf(stderr, "cudasim NCCL: ncclCommInitRank: the unique id is not one ncclGetUniqueId made\n");
        delete c;
        return ncclInvalidArgument;
    }
    snprintf(c->name, sizeof c->name, "%s", id.internal);
    c->seg_bytes = offsetof(Seg, slot) + sizeof(Slot) * nranks;
    int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->seg_bytes) != 0) {
        fprintf(stderr, "cudasim NCCL: rank %d: shared memory %s: %s\n", rank, c->name, strerror(errno));
        if (fd >= 0) close(fd);
        delete c;
        return ncclSystemError;
    }
    void *p = mmap(nullptr, c->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "cudasim NCCL: rank %d: mmap %s: %s\n", rank, c->name, strerror(errno));
        delete c;
        return ncclSystemError;
    }
    c->seg = (Seg *)p;
    int zero = 0;
    c->seg->nranks.compare_exchange_strong(zero, nranks);
    if (c->seg->nranks.load() != nranks) {
        fprintf(stderr, "cudasim NCCL: rank %d: ncclCommInitRank with nranks %d, but another rank said %d\n", rank, nranks,
                c->seg->nranks.load());
        c->seg->aborted.store(1);
        unmap(c);
        delete c;
        return ncclInvalidArgument;
    }
    int none = 0;
    if (!c->seg->slot[rank].pid.compare_exchange_strong(none, (int)getpid())) {
        fprintf(stderr, "cudasim NCCL: rank %d: ncclCommInitRank: rank %d joined twice\n", rank, rank);
        c->seg->aborted.store(1);
        unmap(c);
        delete c;
        return ncclInvalidUsage;
    }
    c->seg->joined.fetch_add(1);
    ncclResult_t r = wait_for(c, "ncclCommInitRank (waiting for every rank to join)",
                              [&] { return c->seg->joined.load() >= nranks; });
    if (r == ncclSuccess) r = barrier(c, "ncclCommInitRank");
    if (rank == 0) shm_unlink(c->name);
    if (r != ncclSuccess) {
        unmap(c);
        delete c;
        return r;
    }
    *comm = (ncclComm_t)c;
    return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    if (ndev != 1) {
        fprintf(stderr, "cudasim NCCL: ncclCommInitAll(%d devices): cudasim has one device per process\n", ndev);
        return ncclInvalidArgument;
    }
    return ncclCommInitRank(comm, 1, id, 0);
}
ncclResult_t ncclCommFinalize(ncclComm_t comm) { return check_comm(comm, "ncclCommFinalize") ? ncclSuccess : ncclInvalidArgument; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    Comm *c = check_comm(comm, "ncclCommDestroy");
    if (!c) return ncclInvalidArgument;
    unmap(c);
    c->magic = 0;
    delete c;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    Comm *c = check_comm(comm, "ncclCommAbort");
    if (!c) return ncclInvalidArgument;
    if (c->seg) c->seg->aborted.store(1);
    return ncclCommDestroy(comm);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    Comm *c = check_comm(comm, "ncclCommGetAsyncError");
    if (!c) return ncclInvalidArgument;
    *err = c->seg && c->seg->aborted.load() ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    Comm *c = check_comm(comm, "ncclCommCount");
    if (!c) return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    Comm *c = check_comm(comm, "ncclCommUserRank");
    if (!c) return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!check_comm(comm, "ncclCommCuDevice")) return ncclInvalidArgument;
    *device = 0;
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
const char *ncclGetLastError(ncclComm_t) { return "see the cudasim NCCL message on stderr"; }
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
    return collective(kAllReduce, s, r, count, t, op, 0, c);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t) {
    return collective(kReduceScatter, s, r, recvcount, t, op, 0, c);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
    return collective(kAllGather, s, r, sendcount, t, ncclSum, 0, c);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t) {
    return collective(kReduce, s, r, count, t, op, root, c);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t) {
    return collective(kBroadcast, s, r, count, t, ncclSum, root, c);
}
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
    return ncclBroadcast(buff, buff, count, t, root, c, st);
}
} /* extern "C" */
#endif
