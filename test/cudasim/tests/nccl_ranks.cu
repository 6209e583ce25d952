// nccl_ranks.cu - cudasim self-test: multi-rank NCCL collectives against hand-worked results.
// One process per rank: under mpirun (OMPI_COMM_WORLD_RANK / _SIZE) or started by a script
// (CUDASIM_TEST_RANK / _SIZE). Rank 0 writes the ncclUniqueId to DIR/id, the others read it.
//   nccl_ranks DIR             every collective, P = 2..4
//   nccl_ranks DIR mismatch    rank 1 asks for another count: every rank must get ncclInvalidUsage
//   nccl_ranks DIR die         rank 1 kills itself after joining: the others' AllReduce must fail
//                              (ncclRemoteError) within 10 s
// test/cudasim/test_nccl_ranks.sh runs all three.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <vector>
#include "test/testing.h"

static int env_int(const char *a, const char *b) {
    const char *e = getenv(a);
    if (!e) e = getenv(b);
    return e ? atoi(e) : -1;
}
template <class T> static T *dev(const std::vector<T> &h) {
    T *d;
    cudaMalloc(&d, h.size() * sizeof(T) + 1);
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}
template <class T> static std::vector<T> host(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}
static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static bool exchange_id(const char *dir, int rank, ncclUniqueId *id) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/id", dir);
    if (rank == 0) {
        ncclGetUniqueId(id);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) return false;
        return true;
    }
    for (double t0 = now_s(); now_s() - t0 < 60; usleep(10000)) {
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        bool ok = fread(id, sizeof *id, 1, f) == 1;
        fclose(f);
        return ok;
    }
    return false;
}

int main(int argc, char **argv) {
    int rank = env_int("OMPI_COMM_WORLD_RANK", "CUDASIM_TEST_RANK"), P = env_int("OMPI_COMM_WORLD_SIZE", "CUDASIM_TEST_SIZE");
    const char *mode = argc > 2 ? argv[2] : "all";
    if (argc < 2 || rank < 0 || P < 2) {
        fprintf(stderr, "usage: under mpirun -np P (P >= 2): nccl_ranks DIR [mismatch|die]\n");
        return 2;
    }
    ncclUniqueId id;
    ncclComm_t comm;
    if (!exchange_id(argv[1], rank, &id)) {
        fprintf(stderr, "rank %d: could not exchange the unique id in %s\n", rank, argv[1]);
        return 1;
    }
    ncclResult_t r = ncclCommInitRank(&comm, P, id, rank);
    int cr = -1, cn = -1;
    ncclCommUserRank(comm, &cr);
    ncclCommCount(comm, &cn);
    test_report(r == ncclSuccess && cr == rank && cn == P, "nccl ranks: init, rank and count", "rank %d of %d: %s", cr, cn,
                ncclGetErrorString(r));
    if (r != ncclSuccess) return 1;

    if (!strcmp(mode, "mismatch")) {
        std::vector<float> x(5, 1.0f);
        float *d = dev(x);
        r = ncclAllReduce(d, d, rank == 1 ? 4 : 5, ncclFloat, ncclSum, comm, 0);
        test_report(r == ncclInvalidUsage, "nccl ranks: mismatched counts give ncclInvalidUsage", "rank %d: %s", rank,
                    ncclGetErrorString(r));
        return test_exit_code();
    }
    if (!strcmp(mode, "die")) {
        if (rank == 1) raise(SIGKILL);
        std::vector<float> x(5, 1.0f);
        float *d = dev(x);
        double t0 = now_s();
        r = ncclAllReduce(d, d, 5, ncclFloat, ncclSum, comm, 0);
        double dt = now_s() - t0;
        test_report(r == ncclRemoteError && dt < 10, "nccl ranks: a dead rank fails the others' AllReduce within 10 s",
                    "rank %d: %s after %.2f s", rank, ncclGetErrorString(r), dt);
        return test_exit_code();
    }

    const int n = 5;
    {   // AllReduce: rank q sends 10(q+1) + i; sum = 10 P(P+1)/2 + P i, max = 10P + i, min = 10 + i
        std::vector<float> x(n), sum(n), mx(n), mn(n), avg(n);
        for (int i = 0; i < n; i++) {
            x[i] = 10.0f * (rank + 1) + i;
            sum[i] = 10.0f * P * (P + 1) / 2 + (float)P * i;
            mx[i] = 10.0f * P + i;
            mn[i] = 10.0f + i;
            avg[i] = sum[i] / P;
        }
        float *s = dev(x), *d = dev(x);
        ncclGroupStart();
        ncclResult_t r1 = ncclAllReduce(s, d, n, ncclFloat, ncclSum, comm, 0);
        ncclGroupEnd();
        test_close("nccl ranks: AllReduce sum", host(d, n).data(), sum.data(), n, 0, 0);
        ncclResult_t r2 = ncclAllReduce(s, d, n, ncclFloat, ncclMax, comm, 0);
        test_close("nccl ranks: AllReduce max", host(d, n).data(), mx.data(), n, 0, 0);
        ncclResult_t r3 = ncclAllReduce(s, d, n, ncclFloat, ncclMin, comm, 0);
        test_close("nccl ranks: AllReduce min", host(d, n).data(), mn.data(), n, 0, 0);
        ncclResult_t r4 = ncclAllReduce(s, s, n, ncclFloat, ncclAvg, comm, 0); // in place
        test_close("nccl ranks: AllReduce avg in place", host(s, n).data(), avg.data(), n, 0, 0);
        test_report(r1 == ncclSuccess && r2 == ncclSuccess && r3 == ncclSuccess && r4 == ncclSuccess,
                    "nccl ranks: AllReduce results", "%d %d %d %d", r1, r2, r3, r4);
    }
    {   // rank order: 1e8, 1, -1e8, 1 summed left to right in fp32: P=2 1e8 (1e8+1 rounds to 1e8), P=3 0, P=4 1
        const float v[4] = {1e8f, 1.0f, -1e8f, 1.0f}, want[5] = {0, 0, 1e8f, 0.0f, 1.0f};
        float *d = dev(std::vector<float>{v[rank]});
        ncclAllReduce(d, d, 1, ncclFloat, ncclSum, comm, 0);
        test_close("nccl ranks: AllReduce adds in rank order", host(d, 1).data(), &want[P], 1, 0, 0);
    }
    {   // int product: (q+1) over ranks = P!; bf16 sum of q+1 = P(P+1)/2 (exact in bf16)
        int *d = dev(std::vector<int>{rank + 1});
        ncclAllReduce(d, d, 1, ncclInt32, ncclProd, comm, 0);
        int fact = 1;
        for (int q = 2; q <= P; q++) fact *= q;
        int got = host(d, 1)[0];
        test_report(got == fact, "nccl ranks: AllReduce int32 prod", "got %d want %d", got, fact);
        __nv_bfloat16 *b = dev(std::vector<__nv_bfloat16>(3, __float2bfloat16((float)(rank + 1))));
        ncclAllReduce(b, b, 3, ncclBfloat16, ncclSum, comm, 0);
        float gb = __bfloat162float(host(b, 3)[2]), wb = P * (P + 1) / 2.0f;
        test_close("nccl ranks: AllReduce bf16 sum", &gb, &wb, 1, 0, 0);
    }
    {   // ReduceScatter (recvcount 3): rank q sends 100q + j, j < 3P; rank me gets 100 P(P-1)/2 + P(3 me + i)
        std::vector<float> x(3 * P), want(3);
        for (int j = 0; j < 3 * P; j++) x[j] = 100.0f * rank + j;
        for (int i = 0; i < 3; i++) want[i] = 100.0f * P * (P - 1) / 2 + (float)P * (3 * rank + i);
        float *s = dev(x), *d = dev(std::vector<float>(3, -1.0f));
        r = ncclReduceScatter(s, d, 3, ncclFloat, ncclSum, comm, 0);
        test_close("nccl ranks: ReduceScatter", host(d, 3).data(), want.data(), 3, 0, 0);
        r = r == ncclSuccess ? ncclReduceScatter(s, s + 3 * rank, 3, ncclFloat, ncclSum, comm, 0) : r; // in place
        test_close("nccl ranks: ReduceScatter in place", host(s + 3 * rank, 3).data(), want.data(), 3, 0, 0);
        test_report(r == ncclSuccess, "nccl ranks: ReduceScatter results", "%s", ncclGetErrorString(r));
    }
    {   // AllGather (sendcount 2): rank q sends 7q, 7q+1; everyone gets 0,1, 7,8, 14,15, ...
        std::vector<float> want(2 * P);
        for (int j = 0; j < 2 * P; j++) want[j] = 7.0f * (j / 2) + j % 2;
        float *s = dev(std::vector<float>{7.0f * rank, 7.0f * rank + 1}), *d = dev(std::vector<float>(2 * P, -1.0f));
        r = ncclAllGather(s, d, 2, ncclFloat, comm, 0);
        test_close("nccl ranks: AllGather", host(d, 2 * P).data(), want.data(), 2 * P, 0, 0);
        std::vector<float> mine(2 * P, -1.0f);
        mine[2 * rank] = 7.0f * rank, mine[2 * rank + 1] = 7.0f * rank + 1;
        float *ip = dev(mine);
        ncclResult_t r2 = ncclAllGather(ip + 2 * rank, ip, 2, ncclFloat, comm, 0); // in place
        test_close("nccl ranks: AllGather in place", host(ip, 2 * P).data(), want.data(), 2 * P, 0, 0);
        test_report(r == ncclSuccess && r2 == ncclSuccess, "nccl ranks: AllGather results", "%d %d", r, r2);
    }
    {   // Broadcast from the last rank: 42 + i; the others start with zeros
        std::vector<float> x(4, 0.0f), want{42, 43, 44, 45};
        if (rank == P - 1) x = want;
        float *d = dev(x);
        r = ncclBroadcast(d, d, 4, ncclFloat, P - 1, comm, 0);
        test_close("nccl ranks: Broadcast from the last rank", host(d, 4).data(), want.data(), 4, 0, 0);
    }
    {   // larger than one staging chunk (4 MiB per rank): rank q sends q + i % 7; sum = P(P-1)/2 + P (i % 7)
        const size_t big = 2500000;
        std::vector<float> x(big), want(big);
        for (size_t i = 0; i < big; i++) x[i] = (float)rank + (float)(i % 7), want[i] = P * (P - 1) / 2.0f + (float)P * (i % 7);
        float *d = dev(x);
        r = ncclAllReduce(d, d, big, ncclFloat, ncclSum, comm, 0);
        test_close("nccl ranks: AllReduce over several chunks", host(d, big).data(), want.data(), big, 0, 0);
        std::vector<float> rs(big * P);
        for (size_t j = 0; j < rs.size(); j++) rs[j] = (float)(j % 5);
        float *s = dev(rs), *o = dev(std::vector<float>(big));
        r = ncclReduceScatter(s, o, big, ncclFloat, ncclSum, comm, 0);
        std::vector<float> w2(big);
        for (size_t i = 0; i < big; i++) w2[i] = (float)P * ((rank * big + i) % 5);
        test_close("nccl ranks: ReduceScatter over several chunks", host(o, big).data(), w2.data(), big, 0, 0);
    }
    test_report(ncclCommDestroy(comm) == ncclSuccess, "nccl ranks: destroy", "rank %d", rank);
    return test_exit_code();
}
