/*
 * nccl.cpp - single-rank NCCL for cudasim, behind the real nccl.h declarations.
 * With one rank every collective is a copy: AllReduce (any op, sum/avg/min/max/prod of one
 * value is the value), ReduceScatter and AllGather of `count` elements, Broadcast from root 0.
 * Communicators with nranks != 1 fail with ncclInvalidArgument and a printed reason.
 */
#include "cudasim.h"

#if __has_include(<nccl.h>)
#include <nccl.h>

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
struct Comm {
    int magic;
};
const int kCommMagic = 0x4e43434c;

ncclResult_t copy(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm, const char *fn) {
    size_t es = nccl_type_size(t);
    if (!comm || ((Comm *)comm)->magic != kCommMagic) {
        fprintf(stderr, "cudasim NCCL: %s: invalid communicator\n", fn);
        return ncclInvalidArgument;
    }
    if (!es) {
        fprintf(stderr, "cudasim NCCL: %s: unsupported data type %d\n", fn, (int)t);
        return ncclInvalidArgument;
    }
    if (send != recv && count) {
        cudaError_t e = cudaMemcpy(recv, send, count * es, cudaMemcpyDeviceToDevice);
        if (e != cudaSuccess) return ncclInvalidArgument;
    }
    return ncclSuccess;
}
} // namespace

extern "C" {
ncclResult_t ncclGetVersion(int *version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId, int rank) {
    if (nranks != 1 || rank != 0) {
        fprintf(stderr, "cudasim NCCL: ncclCommInitRank(nranks %d, rank %d): only a single rank is simulated\n", nranks, rank);
        return ncclInvalidArgument;
    }
    *comm = (ncclComm_t) new Comm{kCommMagic};
    return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    return ndev == 1 ? ncclCommInitRank(comm, 1, id, 0) : ncclInvalidArgument;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm) ((Comm *)comm)->magic = 0;
    delete (Comm *)comm;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t, int *count) {
    *count = 1;
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t, int *rank) {
    *rank = 0;
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    default: return "NCCL error (cudasim)";
    }
}
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t, ncclComm_t c, cudaStream_t) {
    return copy(s, r, count, t, c, "ncclAllReduce");
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t t, ncclRedOp_t, ncclComm_t c, cudaStream_t) {
    return copy(s, r, recvcount, t, c, "ncclReduceScatter");
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
    return copy(s, r, sendcount, t, c, "ncclAllGather");
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t) {
    if (root != 0) return ncclInvalidArgument;
    return copy(s, r, count, t, c, "ncclBroadcast");
}
} /* extern "C" */
#endif
