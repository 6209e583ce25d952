/*
 * trainer.cuh - the CUDA trainer's state (CudaTrainer: the model, its context and streams) and its
 * distribution and optimizer machinery, mirroring llmc/cpu/zero.c for the CPU: the NCCL
 * communicator, the gradient buckets issued during the backward, ZeRO 1-3 over NCCL, --offload
 * optimizer's copies to and from the host, and the device AdamW as the training loop's
 * TrainOptimizer (llmc/train/optim.h). Included by train_gpt.cu only.
 *
 * Data parallelism (built with NCCL, LLMC_HAVE_NCCL): under mpirun/srun (with MPI), or started
 * with -pi tcp|fs, every rank drives the GPU of its local rank, joins llmc/dist/dist.c's process group
 * and an NCCL communicator whose unique id rank 0 broadcasts over that group (MPI or TCP).
 * -z 0: each rank keeps the whole AdamW state; the
 * summed micro-step gradients are averaged over the ranks (ncclAvg; each rank's are weighted
 * 1/accum by the loop, so the result is the gradient of the global batch's mean loss) on their
 * own stream, bucket by bucket during the last micro-step's backward (cuda_bucket_ready: a layer's
 * bucket as soon as its backward is queued, ordered after it by an event), and the norm waits for
 * the last bucket, so every rank holds the same gradients and agrees on the norm, the clip, the
 * fp16 skip decision and the update. -z 2: as -z 1 below, but no full-size gradient buffer: the
 * model (cudamodel_set_grad_slots) writes the outer tensors' gradients into a packed outer buffer
 * and each layer's into one of two packed layer slots; cuda_reduce_slot reduces a layer's slot,
 * on every micro-step as soon as its backward is queued, only to the ranks owning it (each rank's
 * part of a packed bucket is one run: one ncclReduce per rank) and the owner adds it into its
 * shard gradients (accumulated over the micro-steps; the outer buffer once, on the last); the
 * slot's next layer waits for that (slot_free). The norm is the shards' squares summed over the
 * ranks; the skip check and the update read the shard. The plan (cuda_plan) prices the same.
 * -z 3: as -z 2, and the model keeps its shard of the parameters (cudamodel_set_param_slots); the
 * outer tensors stay whole in its gather buffer (cuda_params_updated gathers them after every
 * update) and the model's per-layer params_hook (cuda_params_hook) gathers each layer into one of
 * two slots before its forward and before its backward (cuda_gather_bucket: each rank's part of
 * the packed layer copied from its shard, then a grouped ncclBroadcast per rank, on comm_stream),
 * prefetching the next; checkpoints all-gather the shards on the host (cuda_sync_to_host).
 * -z 1: each rank keeps m, v (and master weights) of its shard of the parameters only (dist.h's
 * shards), updates that shard, and the ranks then broadcast their shards to each other (one
 * grouped ncclBroadcast per rank: shards may differ in size, so any parameter count works on any
 * rank count); checkpoints gather m and v over the process group.
 * --optim-state bf16 | int8: the device m and v are compact (llmc/core/optstate.h; adamw.cuh's
 * adamw_update_compact). --offload optimizer (fp32 or bf16, -z 0 or 1): the device keeps no m, v
 * or master weights; the step's gradients are copied to pinned host memory, the
 * training loop's optimizer (llmc/train/optim.c, the CPU trainer's) updates the fp32 master copy
 * (host_params) and moments on the CPU, and the parameters are copied back (rounded to nearest in
 * bf16). Pipelined around the norm (which the clip and skip decisions need): the gradient copies
 * are queued per bucket during the last backward (on copy_stream, overlapping the layers below),
 * each followed by a host function (cuda_host_bucket_arrived) that converts the bucket to fp32 and
 * sums its squares; after the norm the loop's optim_step_buckets updates bucket by bucket (outer,
 * layer 0, 1, ...) and each bucket's parameters are queued back on copy_stream
 * (cuda_params_bucket_to_device) while the next one is updated; the next forward waits for the
 * last copy (cuda_params_from_host).
 * With several ranks the loop's optimizer reduces the host gradients over dist.c and (-z 1) shards m
 * and v; NCCL is not used then.
 * LLMC_TEST_UNBUCKETED (tests): no buckets, one reduction or copy after the backward, as before;
 * LLMC_TEST_TRACE_BUCKETS (tests): a line per bucket saying where the backward was when it was issued
 * (--offload: also when the host converted it, updated it and queued its parameters back);
 * LLMC_TEST_INF_RANK (tests): one rank's gradients made non-finite at one step (test_inf_step);
 * LLMC_TEST_DEVICE_LEAK=<class> (tests): every step allocates 4 KiB of that memory class from the
 * device allocator and never frees it (bypassing the accounting), which its leak check must name.
 * The device allocator (llmc/cuda/devalloc.cuh, the context's) records the step and phase of
 * every allocation: cuda_phase says where the trainer is; cuda_alloc_step_end checks for leaks.
 */
#ifndef LLMC_CUDA_TRAINER_CUH
#define LLMC_CUDA_TRAINER_CUH

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cuda/cudamodel.cuh"
#include "llmc/cuda/graph.cuh"
#include "llmc/cuda/telemetry.cuh"
#include "llmc/dist/dist.h"
#include "llmc/train/backend.h"
#include "llmc/train/cli.h"
#include "llmc/train/optim.h"

#ifndef LLMC_HAVE_NCCL
#define LLMC_HAVE_NCCL 0
#endif
#if LLMC_HAVE_NCCL
#include <nccl.h>
#endif

/* --offload optimizer: the argument of a bucket's host function (cuda_host_bucket_arrived) */
typedef struct {
    void *tr; /* the CudaTrainer */
    int layer; /* the bucket: -1 outer, else the layer */
} HostBucket;

typedef struct {
    CudaModel model;
    CudaContext ctx;
    double peak_flops;       /* for MFU; 0 = unknown device */
    double flops_per_token;  /* 6N + 6LCT */
    double peak_used_bytes;  /* largest device use seen by step_extras */
    double context_bytes;    /* device use before llmc allocated anything but the cuBLASLt workspace */
    int steps_seen;
    TrainConfig tc;
    GpuTelemetry telemetry;  /* -lg; opened only when asked for */
    int use_graph;           /* --cuda-graph 1, where the configuration allows it */
    CudaStepGraph graph;
    long long micro_steps;
    unsigned long long syncs_seen; /* cudasim builds, LLMC_COUNT_SYNCS=1: the counter at the step's start */
    Dist *dist;
    /* Gradient buckets (the model's grad_hook, cuda_bucket_ready): on the last micro-step of a
     * step, each bucket's reduction (or --offload's copy to the host) is queued on a side stream
     * as soon as the backward has queued the kernels that finish its gradients. */
    int accum, micro;      /* micro-steps per optimizer step; this step's so far */
    int buckets_issued;    /* this step's */
    int trace;             /* LLMC_TEST_TRACE_BUCKETS set: a line per bucket (tests) */
    int step, inf_step;    /* the step under way; LLMC_TEST_INF_RANK's step on this rank (else -1) */
    int first_step;        /* this run's first step (the leak check's warm-up counts from it) */
    int planted_leak;      /* LLMC_TEST_DEVICE_LEAK's memory class, else -1 */
    cudaStream_t copy_stream; /* --offload optimizer: the gradients' copies to the host, the parameters' back */
    cudaEvent_t bucket_ready; /* recorded on the compute stream, waited for by the side stream */
    /* --offload optimizer with buckets: per bucket (optim_bucket's order: outer, layer 0, 1, ...)
     * its gradients' sum of squares, accumulated on the host as the bucket's copy lands (a host
     * function on copy_stream, cuda_host_bucket_arrived), and that function's argument */
    double *bucket_sumsq;
    HostBucket *host_buckets;
    int params_queued;        /* this step's buckets queued back to the device */
    cudaEvent_t params_ready; /* recorded on copy_stream after the step's last parameter copy */
#if LLMC_HAVE_NCCL
    ncclComm_t comm;          /* NULL with one rank */
    cudaStream_t comm_stream; /* gradient reduction */
    cudaEvent_t grads_done, reduced;
    cudaEvent_t gathered[3]; /* -z 3: the gathers of layer slots 0, 1 and of the outer bucket */
#endif
} CudaTrainer;

#if LLMC_HAVE_NCCL
static void nccl_check(ncclResult_t r, const char *what) {
    if (r != ncclSuccess)
        llmc_die("NCCL %s on rank %d: %s", what, dist_world()->rank, ncclGetErrorString(r));
}

/* The communicator of the process group: rank 0's unique id reaches the others through the
 * group's own broadcast (MPI with -pi mpi; TCP with -pi tcp | fs, llmc/dist/dist_tcp.c). */
static void nccl_start(CudaTrainer *tr) {
    Dist *d = tr->dist;
    if (d->size == 1) return;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (d->rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    dist_bcast_bytes(d, &id, sizeof id);
    nccl_check(ncclCommInitRank(&tr->comm, d->size, id, d->rank), "ncclCommInitRank");
    cudaCheck(cudaStreamCreateWithFlags(&tr->comm_stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&tr->grads_done, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&tr->reduced, cudaEventDisableTiming));
    for (int i = 0; i < 3; i++) cudaCheck(cudaEventCreateWithFlags(&tr->gathered[i], cudaEventDisableTiming));
}

static ncclDataType_t nccl_type(Precision p) {
    return p == PRECISION_FP32 ? ncclFloat32 : p == PRECISION_BF16 ? ncclBfloat16 : ncclFloat16;
}

/* -z 0/1: a bucket's gradients averaged over the ranks (an in-place all-reduce per slice of the
 * arena), queued on comm_stream (ordered after the compute stream's work by the caller). */
static void nccl_reduce_bucket(CudaTrainer *tr, const Bucket *b) {
    CudaModel *m = &tr->model;
    const size_t elem = precision_bytes(m->precision);
    const ncclDataType_t type = nccl_type(m->precision);
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < b->n; i++) {
        char *p = (char *)m->grads_memory + b->off[i] * elem;
        nccl_check(ncclAllReduce(p, p, b->len[i], type, ncclAvg, tr->comm, tr->comm_stream), "ncclAllReduce (gradients)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    tr->dist->comm_bytes += (long long)(b->numel * elem); /* the step line's "comm" */
}

/* -z 2: a packed bucket's gradients (a layer's slot, or the outer bucket) averaged over the ranks
 * into their owners: rank r's part of the packed bucket is one contiguous run (dist.h's
 * bucket_part), reduced in place to rank r (a reduce-scatter as ncclReduce calls: the shards need
 * not be equal or aligned to the slices). On comm_stream, ordered after the backward by the caller. */
static void nccl_reduce_packed(CudaTrainer *tr, const Bucket *b, char *packed) {
    CudaModel *m = &tr->model;
    const size_t elem = precision_bytes(m->precision);
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < tr->dist->size; r++) {
        size_t lo, hi, pos, count;
        dist_shard(m->num_parameters, tr->dist->size, r, &lo, &hi);
        bucket_part(b, lo, hi, &pos, &count);
        char *q = packed + pos * elem;
        if (count) nccl_check(ncclReduce(q, q, count, nccl_type(m->precision), ncclAvg, r, tr->comm, tr->comm_stream), "ncclReduce (gradients)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    tr->dist->comm_bytes += (long long)(b->numel * elem); /* the step line's "comm" */
}
#endif

/* The stream for work that must follow everything queued on the compute stream so far: with
 * several ranks the communication stream, made to wait for it; with one, the compute stream. */
static cudaStream_t comm_stream_after_compute(CudaTrainer *tr) {
#if LLMC_HAVE_NCCL
    if (tr->comm) {
        cudaCheck(cudaEventRecord(tr->bucket_ready, tr->ctx.stream));
        cudaCheck(cudaStreamWaitEvent(tr->comm_stream, tr->bucket_ready, 0));
        return tr->comm_stream;
    }
#endif
    return tr->ctx.stream;
}

/* -z 2 (the model's grad_slots): bucket l's packed gradients (layer l's slot on every micro-step;
 * l < 0: the outer bucket, on the last) reduced over the ranks and this rank's part added into its
 * shard gradients (accumulated over the micro-steps), then the slot marked free for the layer that
 * uses it next (slot_free). On comm_stream, after the compute stream's work so far; with one
 * rank no reduction, the add on the compute stream. */
static void cuda_reduce_slot(CudaTrainer *tr, const Bucket *b, int l) {
    CudaModel *m = &tr->model;
    char *packed = (char *)cudamodel_bucket_grads(m, l);
    cudaStream_t st = comm_stream_after_compute(tr);
#if LLMC_HAVE_NCCL
    if (tr->comm) nccl_reduce_packed(tr, b, packed);
#endif
    size_t pos, count;
    bucket_part(b, m->shard_lo, m->shard_hi, &pos, &count);
    cudamodel_shard_accumulate(m, b, packed + pos * precision_bytes(m->precision), st);
    if (l >= 0) cudaCheck(cudaEventRecord(m->slot_free[l & 1], st));
}

/* -z 3 (the model's param_slots): bucket l's parameters (l < 0: the outer bucket) gathered from the
 * ranks' shards into its packed place in the gather buffer: each rank copies its part (one
 * contiguous run of the packed bucket, dist.h's bucket_part) there from its shard, slice by
 * slice, and broadcasts it to the others (grouped ncclBroadcast, one per rank). On comm_stream
 * after the compute stream's work queued so far (the slot's previous layer is done with it),
 * recorded in gathered[slot]; with one rank, copies on the compute stream. */
static void cuda_gather_bucket(CudaTrainer *tr, int l) {
    CudaModel *m = &tr->model;
    const size_t elem = precision_bytes(m->precision);
    char *dst = (char *)cudamodel_bucket_params(m, l);
    Bucket b;
    bucket_of_layer(&b, m->param_specs, m->num_param_specs, l);
    cudaStream_t st = comm_stream_after_compute(tr);
    size_t k = 0;
    for (int i = 0; i < b.n; k += b.len[i], i++) {
        size_t a, n = bucket_slice_in(&b, i, m->shard_lo, m->shard_hi, &a);
        if (n)
            cudaCheck(cudaMemcpyAsync(dst + (k + a - b.off[i]) * elem, (char *)m->params_memory + (a - m->shard_lo) * elem,
                                      n * elem, cudaMemcpyDeviceToDevice, st));
    }
#if LLMC_HAVE_NCCL
    if (tr->comm) {
        nccl_check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < tr->dist->size; r++) {
            size_t lo, hi, pos, count;
            dist_shard(m->num_parameters, tr->dist->size, r, &lo, &hi);
            bucket_part(&b, lo, hi, &pos, &count);
            char *q = dst + pos * elem;
            if (count) nccl_check(ncclBroadcast(q, q, count, nccl_type(m->precision), r, tr->comm, st), "ncclBroadcast (parameter gather)");
        }
        nccl_check(ncclGroupEnd(), "ncclGroupEnd");
        tr->dist->comm_bytes += (long long)(b.numel * elem);
        cudaCheck(cudaEventRecord(tr->gathered[l < 0 ? 2 : l & 1], st));
    }
#endif
}

/* -z 3: the compute stream waits for bucket l's gather (queued by cuda_gather_bucket). */
static void cuda_wait_gather(CudaTrainer *tr, int l) {
#if LLMC_HAVE_NCCL
    if (tr->comm) cudaCheck(cudaStreamWaitEvent(tr->ctx.stream, tr->gathered[l < 0 ? 2 : l & 1], 0));
#else
    (void)tr, (void)l;
#endif
}

/* -z 3: layer l's parameters in its slot (gathered unless the slot holds them already), the
 * compute stream waiting for them. */
static void cuda_need_layer(CudaTrainer *tr, int l) {
    CudaModel *m = &tr->model;
    if (m->slot_layer[l & 1] != l) {
        cuda_gather_bucket(tr, l);
        m->slot_layer[l & 1] = l;
    }
    cuda_wait_gather(tr, l);
}

/* The model's params_hook at -z 3: layer l is needed now; the next layer in this direction (l + 1
 * forward, l - 1 backward) is prefetched into the other slot, whose last user's kernels are
 * queued by now (a layer's forward reads the next layer's first norm at its end: the model asks
 * for l + 1 then, before its last kernel). */
static void cuda_params_hook(void *p, int l, int backward) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    cuda_need_layer(tr, l);
    const int next = backward ? l - 1 : l + 1;
    if (next >= 0 && next < m->cfg.num_layers && m->slot_layer[next & 1] != next) {
        cuda_gather_bucket(tr, next);
        m->slot_layer[next & 1] = next;
    }
}

/* -z 3, after the update: the outer parameters gathered again from the updated shards (the compute
 * stream waits), and the layer slots stale. */
static void cuda_params_updated(CudaTrainer *tr) {
    CudaModel *m = &tr->model;
    cuda_gather_bucket(tr, -1);
    cuda_wait_gather(tr, -1);
    m->slot_layer[0] = m->slot_layer[1] = -1;
}
#if LLMC_HAVE_NCCL

/* Before the norm: the gradients averaged over the ranks, and the compute stream made to wait for
 * that. The buckets were queued during the backward (cuda_bucket_ready); without the hook
 * (LLMC_TEST_UNBUCKETED) the whole arena is one bucket, queued now. */
static void nccl_reduce_grads(CudaTrainer *tr) {
    CudaModel *m = &tr->model;
    if (!tr->comm) return;
    NVTX_RANGE("gradient reduction (wait)");
    if (!m->grad_hook) {
        Bucket all;
        memset(&all, 0, sizeof all);
        bucket_add(&all, 0, m->num_parameters);
        cudaCheck(cudaEventRecord(tr->grads_done, tr->ctx.stream));
        cudaCheck(cudaStreamWaitEvent(tr->comm_stream, tr->grads_done, 0));
        nccl_reduce_bucket(tr, &all);
    }
    cudaCheck(cudaEventRecord(tr->reduced, tr->comm_stream));
    cudaCheck(cudaStreamWaitEvent(tr->ctx.stream, tr->reduced, 0));
}

/* -z 1, after the update: every rank's shard of the parameters to every rank. */
static void nccl_gather_params(CudaTrainer *tr) {
    CudaModel *m = &tr->model;
    if (!tr->comm || m->shard_hi - m->shard_lo == m->num_parameters || m->param_slots) return;
    NVTX_RANGE("all-gather parameters");
    const size_t elem = precision_bytes(m->precision);
    ncclDataType_t type = nccl_type(m->precision);
    cudaCheck(cudaEventRecord(tr->grads_done, tr->ctx.stream));
    cudaCheck(cudaStreamWaitEvent(tr->comm_stream, tr->grads_done, 0));
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < tr->dist->size; r++) {
        size_t lo, hi;
        dist_shard(m->num_parameters, tr->dist->size, r, &lo, &hi);
        char *p = (char *)m->params_memory + lo * elem;
        if (hi > lo) nccl_check(ncclBroadcast(p, p, hi - lo, type, r, tr->comm, tr->comm_stream), "ncclBroadcast (parameters)");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    cudaCheck(cudaEventRecord(tr->reduced, tr->comm_stream));
    cudaCheck(cudaStreamWaitEvent(tr->ctx.stream, tr->reduced, 0));
    tr->dist->comm_bytes += (long long)((m->shard_hi - m->shard_lo) * elem);
}

/* -z 2: the norm from each rank's shard, the sums of squares added over the ranks. */
static float nccl_grad_norm_sharded(CudaTrainer *tr) {
    CudaModel *m = &tr->model;
    cudamodel_grad_norm_squared(m, m->shard_lo, m->shard_hi);
    nccl_check(ncclAllReduce(m->d_norm, m->d_norm, 1, ncclFloat32, ncclSum, tr->comm, tr->ctx.stream), "ncclAllReduce (norm)");
    tr->dist->comm_bytes += (long long)sizeof(float);
    return cudamodel_grad_norm_finish(m);
}

static void nccl_stop(CudaTrainer *tr) {
    if (!tr->comm) return;
    ncclCommDestroy(tr->comm);
    cudaStreamDestroy(tr->comm_stream);
    cudaEventDestroy(tr->grads_done);
    cudaEventDestroy(tr->reduced);
    for (int i = 0; i < 3; i++) cudaEventDestroy(tr->gathered[i]);
    tr->comm = NULL;
}
#endif


/* ---- gradient buckets ------------------------------------------------------------------- */
/* --offload optimizer: a host function on copy_stream, run once bucket l's gradient copies have
 * landed: bf16 -> fp32 into host_grads and the bucket's sum of squares (non-finite stays so: the
 * skip decision then costs only the sum of the buckets'). Host code only (no CUDA call). */
static void CUDART_CB cuda_host_bucket_arrived(void *arg) {
    HostBucket *hb = (HostBucket *)arg;
    CudaTrainer *tr = (CudaTrainer *)hb->tr;
    CudaModel *m = &tr->model;
    Bucket b;
    bucket_of_layer(&b, m->param_specs, m->num_param_specs, hb->layer);
    cudamodel_grads_bucket_from_staging(m, &b);
    tr->bucket_sumsq[hb->layer + 1] = optim_bucket_sumsq(m->host_grads, &b);
    if (tr->trace) printf("trace: host gradient bucket %d converted and summed\n", hb->layer);
}

/* The model's grad_hook: bucket l's gradients are final (queued on the compute stream). The side
 * stream waits for them and then reduces them over the ranks (comm_stream) or, --offload
 * optimizer, copies them to the host (copy_stream), while the compute stream goes on with the
 * backward of the layers below. */
static void cuda_bucket_ready(void *p, int l) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    Bucket b;
    bucket_of_layer(&b, m->param_specs, m->num_param_specs, l);
    tr->buckets_issued++;
    if (tr->trace) {
        if (m->in_backward) printf("trace: gradient bucket %d issued during the backward at layer %d\n", l, m->backward_layer);
        else printf("trace: gradient bucket %d issued after the backward\n", l);
    }
    if (m->grad_slots) {
        NVTX_RANGE_LAYER("reduce gradient slot", l);
        cuda_reduce_slot(tr, &b, l);
        return;
    }
#if LLMC_HAVE_NCCL
    cudaStream_t side = m->offload ? tr->copy_stream : tr->comm_stream;
#else
    cudaStream_t side = tr->copy_stream;
#endif
    cudaCheck(cudaEventRecord(tr->bucket_ready, tr->ctx.stream));
    cudaCheck(cudaStreamWaitEvent(side, tr->bucket_ready, 0));
    if (m->offload) {
        for (int i = 0; i < b.n; i++) cudamodel_grads_copy_to_host(m, b.off[i], b.len[i], side);
        /* the host converts and sums the bucket as soon as its copies have landed, while the GPU
         * goes on with the backward of the layers below */
        cudaCheck(cudaLaunchHostFunc(side, cuda_host_bucket_arrived, &tr->host_buckets[l + 1]));
        return;
    }
#if LLMC_HAVE_NCCL
    NVTX_RANGE_LAYER("reduce gradient bucket", l);
    nccl_reduce_bucket(tr, &b);
#endif
}

/* Every bucket of the step was issued (the hook ran on the step's last micro-step). */
static void check_buckets_issued(const CudaTrainer *tr) {
    const int L = tr->model.cfg.num_layers, want = tr->model.grad_slots ? tr->accum * L + 1 : L + 1; /* -z 2: layers every micro-step */
    if (tr->model.grad_hook && tr->buckets_issued != want)
        llmc_die("internal: %d of the %d gradient buckets were issued this step (micro-step %d of %d)", tr->buckets_issued,
                 want, tr->micro, tr->accum);
}

/* The highest ZeRO stage the CUDA optimizer shards (-z 1: m, v and master weights; -z 2: also the
 * gradients, reduced layer by layer from two packed slots into the shard). */
enum { CUDA_MAX_ZERO = 3 };

/* ---- the device allocator's view of the run ---------------------------------------------- */
/* Where the trainer is: the device allocator records it with every allocation (a static string:
 * setup, forward, backward, update, eval, sample, checkpoint, end). */
static void cuda_phase(CudaTrainer *tr, const char *phase) { devalloc_set_phase(tr->ctx.alloc, tr->step, phase); }

/* LLMC_TEST_DEVICE_LEAK=<memory class name> (tests): the class of the planted leak, else -1. */
static int cuda_planted_leak_class(void) {
    const char *e = getenv("LLMC_TEST_DEVICE_LEAK");
    if (!e || !e[0]) return -1;
    for (int c = 0; c < MEM_NUM_CLASSES; c++)
        if (strcmp(e, mem_class_names[c]) == 0) return c;
    llmc_die("LLMC_TEST_DEVICE_LEAK=%s: not a memory class name", e);
}

/* The warm-up of the device leak check, in steps: the run's first step tunes the matmuls (lt_plans.cuh's
 * copies, freed again) and the second captures the CUDA graph (--cuda-graph 1); the baseline is
 * the allocated bytes of each class at the end of the second step. */
enum { CUDA_LEAK_WARMUP_STEPS = 2 };

/* The end of a step: the planted leak (LLMC_TEST_DEVICE_LEAK), then the device allocator's leak check. */
static void cuda_alloc_step_end(CudaTrainer *tr) {
    if (tr->planted_leak >= 0) {
        cuda_phase(tr, "update");
        devalloc_malloc(tr->ctx.alloc, tr->planted_leak, 4096); /* never freed */
    }
    devalloc_check_leaks(tr->ctx.alloc, tr->step, tr->first_step + CUDA_LEAK_WARMUP_STEPS - 1);
}

/* --memory-snapshot FILE: the device allocator's snapshot (rank r > 0: FILE.rank<r>), at the run's end. */
static void cuda_write_memory_snapshot(CudaTrainer *tr, const char *path) {
    char file[1100];
    if (tr->dist->rank == 0) snprintf(file, sizeof file, "%s", path);
    else snprintf(file, sizeof file, "%s.rank%d", path, tr->dist->rank);
    devalloc_write_snapshot(tr->ctx.alloc, file, tr->step, "end");
    if (tr->dist->rank == 0) printf("memory snapshot: %s (scripts/memory_snapshot.py %s prints its timeline)\n", file, file);
}

/* ---- the device AdamW as the loop's TrainOptimizer (llmc/train/optim.h) ---------------------- */
/* The ranks' gradients are averaged by NCCL (ncclAvg): a micro-step weighs its own 1/accum. Called
 * once per step before its micro-steps: accum is this step's count (--batch-ramp changes it), which
 * tells the micro-steps which is the last (its backward reduces the buckets). */
static float cuda_loss_weight(void *p, int accum) {
    ((CudaTrainer *)p)->accum = accum;
    return 1.0f / accum;
}

/* Once per step, after the last micro-step: the gradients reduced over the ranks (the buckets
 * were queued during the backward), so every rank computes the same norm. */
static void cuda_reduce(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    check_buckets_issued(tr);
#if LLMC_HAVE_NCCL
    nccl_reduce_grads(tr);
#endif
}

static float cuda_grad_norm(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
#if LLMC_HAVE_NCCL
    if (tr->comm && tr->tc.zero_stage >= 2) return nccl_grad_norm_sharded(tr);
#endif
    return cudamodel_grad_norm(&tr->model);
}

static void cuda_update(void *p, const AdamWStep *s) {
    CudaTrainer *tr = (CudaTrainer *)p;
    cuda_phase(tr, "update");
    cudamodel_update(&tr->model, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay, s->grad_scale, s->t);
#if LLMC_HAVE_NCCL
    nccl_gather_params(tr);
#endif
    if (tr->model.param_slots) cuda_params_updated(tr);
    /* the step's time (and MFU) must include the optimizer kernels, and a fault in them must
     * surface at this step, not the next one */
    cudaCheck(cudaStreamSynchronize(tr->ctx.stream));
}

/* After cuda_sync_to_host: the host copies are whole on every rank. */
static void cuda_optim_state(void *p, OptimStateView *s) {
    CudaModel *m = &((CudaTrainer *)p)->model;
    memset(s, 0, sizeof *s);
    s->m = m->host_m, s->v = m->host_v, s->params = m->host_params;
    s->whole_params = 1;
}

/* A resume reads the moments into the host copies (cuda_sync_from_host then pushes them). */
static void cuda_optim_load_begin(void *p, float **m, float **v) {
    CudaModel *model = &((CudaTrainer *)p)->model;
    *m = model->host_m, *v = model->host_v;
}

/* The device AdamW (m, v and master weights on the device, -z 1-3 sharded over NCCL). */
static TrainOptimizer cuda_optimizer(CudaTrainer *tr) {
    /* ctx, zero_max, loss_weight, zero_grad, reduce, grad_norm, step, state, state_release, load_begin, load_end */
    TrainOptimizer o = {tr, CUDA_MAX_ZERO, cuda_loss_weight, NULL, cuda_reduce, cuda_grad_norm, cuda_update, cuda_optim_state, NULL,
                        cuda_optim_load_begin, NULL, NULL, NULL, NULL};
    return o;
}

/* -z 1: the model fills only its shard of host_m, host_v (and, with master weights, host_params);
 * every rank gets the whole (the loop checks the parameters on every rank, rank 0 writes them),
 * then the parameters are re-derived from the whole master copy as cudamodel_sync_to_host does. */
static void cuda_sync_to_host(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    cuda_phase(tr, "checkpoint");
    CudaModel *m = &tr->model;
    cudamodel_sync_to_host(m);
    if (m->shard_hi - m->shard_lo == m->num_parameters) return;
    dist_allgather_f32(tr->dist, m->host_m, m->num_parameters);
    dist_allgather_f32(tr->dist, m->host_v, m->num_parameters);
    if (m->master || m->param_slots) dist_allgather_f32(tr->dist, m->host_params, m->num_parameters); /* (-z 3: the shards) */
    if (m->master) cudamodel_sync_from_host(m);
}
/* --offload optimizer: the buckets' copies (queued during the backward) waited for, then converted;
 * without the hook (LLMC_TEST_UNBUCKETED) one copy after the backward. */
static void cuda_grads_to_host(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    check_buckets_issued(tr);
    if (!m->grad_hook) {
        cudamodel_grads_to_host(m);
        return;
    }
    NVTX_RANGE("gradients to host (wait)");
    cudaCheck(cudaStreamSynchronize(tr->copy_stream)); /* the last bucket's host function included */
    tr->params_queued = 0;
}
/* The buckets' sums of squares of this step (cuda_host_bucket_arrived), with buckets only. */
static const double *cuda_grad_bucket_sumsq(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    return tr->model.grad_hook ? tr->bucket_sumsq : NULL;
}
/* The loop's optim_step_buckets finished bucket b: its parameters are queued for the device on
 * copy_stream (ordered after the compute stream's work: the backward read the old ones) while
 * the host updates the next bucket. */
static void cuda_params_bucket_to_device(void *p, const Bucket *b) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    if (tr->params_queued++ == 0) {
        cudaCheck(cudaEventRecord(tr->bucket_ready, tr->ctx.stream));
        cudaCheck(cudaStreamWaitEvent(tr->copy_stream, tr->bucket_ready, 0));
    }
    NVTX_RANGE("parameter bucket to device");
    cudamodel_params_bucket_to_device(m, b, tr->copy_stream);
    if (tr->trace) printf("trace: parameter bucket %d queued to the device\n", tr->params_queued - 2);
}
/* After the loop's update: with buckets, the copies are queued already and the next forward (the
 * compute stream) waits for the last one; without (LLMC_TEST_UNBUCKETED), one copy now. */
static void cuda_params_from_host(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    if (!tr->model.grad_hook) {
        cudamodel_params_from_host(&tr->model);
        return;
    }
    if (tr->params_queued != tr->model.cfg.num_layers + 1)
        llmc_die("internal: %d of the %d parameter buckets were queued to the device", tr->params_queued,
                 tr->model.cfg.num_layers + 1);
    cudaCheck(cudaEventRecord(tr->params_ready, tr->copy_stream));
    /* One wait, not one per layer through the model's params_hook: the loop queues the next forward
     * only after the whole host update, so a per-layer wait would hide only the last buckets'
     * copies. Hiding the update itself behind the next forward needs the update on a host thread,
     * and bounds the gain by the forward's time, small beside a memory-bound CPU AdamW over the
     * billions of parameters offload is for (about 16-20 bytes of host traffic per parameter). */
    cudaCheck(cudaStreamWaitEvent(tr->ctx.stream, tr->params_ready, 0));
}

/* ---- setting it up, tearing it down ------------------------------------------------------- */
/* -z >= 1 (not with --offload optimizer): this rank's optimizer state only (-z 2: and reduced
 * gradients in two packed slots, -z 3: and its shard of the parameters, each layer gathered when
 * needed); before cudamodel_allocate. */
static void cuda_trainer_shard(CudaTrainer *tr, int zero, int offload) {
    CudaModel *m = &tr->model;
    if (zero < 1 || offload) return;
    size_t lo, hi;
    dist_shard(m->num_parameters, tr->dist->size, tr->dist->rank, &lo, &hi);
    cudamodel_set_shard(m, lo, hi);
    if (zero >= 2) cudamodel_set_grad_slots(m); /* no full gradient buffer */
    if (zero >= 3) { /* no full parameters: each layer gathered when needed */
        cudamodel_set_param_slots(m);
        m->params_hook = cuda_params_hook;
        m->params_hook_ctx = tr;
    }
}

/* Gradient buckets: reduced over the ranks, or copied to the host, as the backward makes them
 * (-z 2 needs them; LLMC_TEST_UNBUCKETED: none otherwise); after cudamodel_allocate. */
static void cuda_trainer_buckets(CudaTrainer *tr, const TrainConfig *tc, int offload) {
    CudaModel *m = &tr->model;
    const long long micro_tokens = (long long)tc->B * tc->T * tr->dist->size;
    tr->accum = tc->total_batch > 0 ? (int)(tc->total_batch / micro_tokens) : 1;
    tr->trace = getenv("LLMC_TEST_TRACE_BUCKETS") != NULL;
#if LLMC_HAVE_NCCL
    const int comm = tr->comm != NULL;
#else
    const int comm = 0;
#endif
    if (!m->grad_slots && (!(comm || offload) || getenv("LLMC_TEST_UNBUCKETED"))) return;
    cudaCheck(cudaEventCreateWithFlags(&tr->bucket_ready, cudaEventDisableTiming));
    if (offload) {
        cudaCheck(cudaStreamCreateWithFlags(&tr->copy_stream, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&tr->params_ready, cudaEventDisableTiming));
        const int nb = m->cfg.num_layers + 1;
        tr->bucket_sumsq = (double *)callocCheck(nb, sizeof(double), "gradient bucket sums of squares");
        tr->host_buckets = (HostBucket *)mallocCheck(nb * sizeof *tr->host_buckets, "host bucket arguments");
        for (int k = 0; k < nb; k++) tr->host_buckets[k] = {tr, k - 1};
    }
    m->grad_hook = cuda_bucket_ready;
    m->grad_hook_ctx = tr;
}

/* The optimizer half of the backend: the device AdamW, or with --offload optimizer the loop's
 * host AdamW over the host gradients (copied bucket by bucket when there are buckets); and the
 * host copies for checkpoints (cuda_sync_to_host gathers the ZeRO shards). */
static void cuda_trainer_optimizer(CudaTrainer *tr, TrainBackend *be, int offload) {
    CudaModel *m = &tr->model;
    be->state.host_params = m->host_params;
    be->state.sync_to_host = cuda_sync_to_host;
    if (!offload) {
        be->optimizer = cuda_optimizer(tr);
        return;
    }
    be->hostopt.host_grads = m->host_grads;
    be->hostopt.param_specs = m->param_specs;
    be->hostopt.grads_to_host = cuda_grads_to_host;
    be->hostopt.params_from_host = cuda_params_from_host;
    if (m->grad_hook) {
        be->hostopt.grad_bucket_sumsq = cuda_grad_bucket_sumsq;
        be->hostopt.params_bucket_to_device = cuda_params_bucket_to_device;
    }
}

/* The streams, events and buffers of the buckets, and the communicator. */
static void cuda_trainer_free(CudaTrainer *tr) {
    if (tr->copy_stream) cudaCheck(cudaStreamDestroy(tr->copy_stream));
    if (tr->bucket_ready) cudaCheck(cudaEventDestroy(tr->bucket_ready));
    if (tr->params_ready) cudaCheck(cudaEventDestroy(tr->params_ready));
    free(tr->bucket_sumsq);
    free(tr->host_buckets);
#if LLMC_HAVE_NCCL
    nccl_stop(tr);
#endif
}

#endif
