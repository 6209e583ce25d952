/*
 * train_gpt.cu - the GPU trainer (./train_gpt): the same flags, files and training loop as
 * ./train_gpt_cpu (llmc/train/train.c), with the CUDA model of llmc/cuda/cudamodel.cuh behind the
 * TrainBackend. Parse flags -> check the GPU -> build the model -> hand it to train_run().
 * Precision is a run-time choice: --precision fp32 | bf16 (default) | fp16.
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
 * LLMC_TEST_INF_RANK (tests): one rank's gradients made non-finite at one step (test_inf_step).
 * A Llama 3 -e (llama3:dN, an HF directory, llmc's or llm.c's Llama file) trains the same way
 * (llmc/cuda/llama.cuh): checkpoints are llmc's Llama file (fp32 or, --checkpoint-bf16 1,
 * bf16), --save-hf writes LlamaForCausalLM (with the tokenizer files of an HF -e); -r 0 only, so
 * --memory-budget searches -b, -z (several ranks) and --offload for it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "llmc/train/budget.h"
#include "llmc/core/check.h"
#include "llmc/train/cli.h"
#include "llmc/cuda/graph.cuh"
#include "llmc/cuda/cudamodel.cuh"
#include "llmc/cuda/telemetry.cuh"
#include "llmc/dist/dist.h"
#include "llmc/formats/hf.h"
#include "llmc/models/llama.h"
#include "llmc/train/optim.h"
#include "llmc/train/train.h"
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

/* ---- peak throughput table (dense, per GPU, TFLOP/s) ---------------------------------------- */
typedef struct {
    const char *name; /* substring of cudaDeviceProp.name */
    double bf16, tf32, fp32;
} PeakEntry;
static const PeakEntry peak_table[] = {
    {"H200", 989.0, 494.0, 67.0},
    {"H100 PCIe", 756.0, 378.0, 51.0},
    {"H100", 989.0, 494.0, 67.0},
    {"H800", 989.0, 494.0, 67.0},
    {"A100", 312.0, 156.0, 19.5},
    {"A800", 312.0, 156.0, 19.5},
    {"L40S", 362.0, 183.0, 91.6},
    {"RTX 4090", 165.0, 82.6, 82.6},
    {"RTX 3090", 71.0, 35.6, 35.6},
};

static double peak_flops_for(const cudaDeviceProp *props, Precision prec, int tf32, float override_tflops) {
    if (override_tflops > 0) return override_tflops * 1e12;
    for (size_t i = 0; i < sizeof peak_table / sizeof peak_table[0]; i++) {
        if (!strstr(props->name, peak_table[i].name)) continue;
        const PeakEntry *e = &peak_table[i];
        return 1e12 * (prec != PRECISION_FP32 ? e->bf16 : tf32 ? e->tf32 : e->fp32);
    }
    return 0.0;
}

/* ---- the CUDA backend: thin adapters from TrainBackend to llmc/cuda/cudamodel.cuh ---------------- */
/* The model's grad_hook: bucket l's gradients are final (queued on the compute stream). The side
 * stream waits for them and then reduces them over the ranks (comm_stream) or, --offload
 * optimizer, copies them to the host (copy_stream), while the compute stream goes on with the
 * backward of the layers below. */
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

/* A micro-step waits for nothing: the tokens go through pinned staging, the loss stays on the
 * device (cuda_step_loss reads the step's once). --cuda-graph 1: from the second micro-step on, the
 * forward and the backward down to the encoder replay as one CUDA graph (graph.cuh); the first
 * runs uncaptured so that one-time work (cuBLASLt algorithm timing) is done. */
static float cuda_train_micro_step(void *p, const int *inputs, const int *targets, int B, int T, float dloss_scale) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    m->grad_hook_armed = ++tr->micro == tr->accum; /* the step's gradients are final in its last backward */
    if (m->grad_hook_armed && tr->step == tr->inf_step) dloss_scale = INFINITY; /* LLMC_TEST_INF_RANK */
    const float dloss = dloss_scale * m->loss_scale / (float)(B * T);
    cudamodel_stage(m, inputs, targets, B, T, 1);
    auto forward_backward = [&]() {
        cudamodel_forward_device(m, 1, B, T, dloss);
        cudamodel_backward_layers(m, B, T);
    };
    if (tr->use_graph && tr->micro_steps > 0) cuda_step_graph_run(&tr->graph, tr->ctx.stream, B, T, dloss, forward_backward);
    else forward_backward();
    cudamodel_backward_encoder(m, B, T);
    tr->micro_steps++;
    return NAN; /* not read: the loop asks cuda_step_loss */
}

static double cuda_step_loss(void *p) { return cudamodel_read_step_loss(&((CudaTrainer *)p)->model); }

static float cuda_eval_loss(void *p, const int *inputs, const int *targets, int B, int T) {
    return cudamodel_forward(&((CudaTrainer *)p)->model, inputs, targets, B, T, 0.0f);
}

static void cuda_zero_grad(void *p) { /* (the first call of a step) */
    CudaTrainer *tr = (CudaTrainer *)p;
    tr->micro = tr->buckets_issued = 0;
    tr->step++; /* the loop zeroes the gradients once per step, first */
#ifdef CUDASIM
    tr->syncs_seen = cudasim::stats().host_syncs;
#endif
    cudamodel_zero_grad(&tr->model);
}
/* The loop asks for the norm once per step, after the last micro-step: the gradients are reduced
 * over the ranks first, so every rank computes the same norm. */
static float cuda_grad_norm(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    check_buckets_issued(tr);
#if LLMC_HAVE_NCCL
    nccl_reduce_grads(tr);
    if (tr->comm && tr->tc.zero_stage >= 2) return nccl_grad_norm_sharded(tr);
#endif
    return cudamodel_grad_norm(&tr->model);
}

static void cuda_update(void *p, const TrainConfig *tc, float lr, int t, float grad_scale) {
    CudaTrainer *tr = (CudaTrainer *)p;
    cudamodel_update(&tr->model, lr, tc->beta1, tc->beta2, tc->eps, tc->weight_decay, grad_scale, t);
#if LLMC_HAVE_NCCL
    nccl_gather_params(tr);
#endif
    if (tr->model.param_slots) cuda_params_updated(tr);
    /* the step's time (and MFU) must include the optimizer kernels, and a fault in them must
     * surface at this step, not the next one */
    cudaCheck(cudaStreamSynchronize(tr->ctx.stream));
}

static const float *cuda_next_logits(void *p, const int *tokens, int n) {
    return cudamodel_next_logits(&((CudaTrainer *)p)->model, tokens, n);
}

/* -z 1: the model fills only its shard of host_m, host_v (and, with master weights, host_params);
 * every rank gets the whole (the loop checks the parameters on every rank, rank 0 writes them),
 * then the parameters are re-derived from the whole master copy as cudamodel_sync_to_host does. */
static void cuda_sync_to_host(void *p) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    cudamodel_sync_to_host(m);
    if (m->shard_hi - m->shard_lo == m->num_parameters) return;
    dist_allgather_f32(tr->dist, m->host_m, m->num_parameters);
    dist_allgather_f32(tr->dist, m->host_v, m->num_parameters);
    if (m->master || m->param_slots) dist_allgather_f32(tr->dist, m->host_params, m->num_parameters); /* (-z 3: the shards) */
    if (m->master) cudamodel_sync_from_host(m);
}
static void cuda_sync_from_host(void *p) { cudamodel_sync_from_host(&((CudaTrainer *)p)->model); }
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
static void cuda_print_memory(void *p, FILE *out) { cudamodel_print_memory(&((CudaTrainer *)p)->model, out); }

static void cuda_print_planned_vs_measured(const CudaTrainer *tr, const TrainConfig *tc);

/* MFU, device memory (current and the peak seen) and, in fp16, the loss scale. */
static void cuda_step_extras(void *p, double step_ms, double tokens_per_s, char *text, size_t len, Logger *lg) {
    CudaTrainer *tr = (CudaTrainer *)p;
    (void)step_ms;
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double used = (double)(total_b - free_b);
    if (used > tr->peak_used_bytes) tr->peak_used_bytes = used;
    if (text && tr->steps_seen++ == 0) cuda_print_planned_vs_measured(tr, &tr->tc);
#ifdef CUDASIM
    /* LLMC_COUNT_SYNCS=1: how often the host waited for the device in this step (from zero_grad on) */
    if (text && getenv("LLMC_COUNT_SYNCS")) printf("host syncs: %llu in this step\n", cudasim::stats().host_syncs - tr->syncs_seen);
#endif
    double mfu = tr->peak_flops > 0 ? tr->flops_per_token * tokens_per_s / tr->peak_flops : -1.0;
    const double GiB = 1073741824.0;
    const CudaModel *m = &tr->model;
    if (text) {
        char mfu_text[32];
        if (mfu >= 0) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100.0 * mfu);
        else snprintf(mfu_text, sizeof mfu_text, "n/a (set --peak-tflops)");
        int k = snprintf(text, len, " | MFU %s | mem %.2f GiB (peak %.2f)", mfu_text, used / GiB, tr->peak_used_bytes / GiB);
        if (m->precision == PRECISION_FP16 && k > 0 && (size_t)k < len)
            snprintf(text + k, len - k, " | loss scale %g (skipped %lld)", m->loss_scale, m->skipped_steps);
    }
    if (lg) {
        if (mfu >= 0) log_double(lg, "mfu", mfu);
        log_double(lg, "mem_gib", used / GiB);
        log_double(lg, "peak_mem_gib", tr->peak_used_bytes / GiB);
        if (m->precision == PRECISION_FP16) {
            log_float(lg, "loss_scale", m->loss_scale);
            log_int(lg, "skipped_steps", m->skipped_steps);
        }
    }
}

/* -lg: one reading, printed by train_run after the step line and logged with the step. */
static void cuda_telemetry(void *p, char *text, size_t len, Logger *lg) {
    GpuTelemetry *t = &((CudaTrainer *)p)->telemetry;
    GpuReading r;
    gpu_telemetry_read(t, &r);
    gpu_reading_format(&r, text, len);
    gpu_reading_log(&r, lg);
}

/* The fp16 loss scaler travels in the state file: {scale bits, clean steps, skipped steps}. */
static void cuda_save_backend_state(void *p, int64_t words[4]) {
    const CudaModel *m = &((CudaTrainer *)p)->model;
    uint32_t bits;
    memcpy(&bits, &m->loss_scale, sizeof bits);
    words[0] = bits;
    words[1] = m->clean_steps;
    words[2] = m->skipped_steps;
    words[3] = 0;
}

static void cuda_load_backend_state(void *p, const int64_t words[4]) {
    CudaModel *m = &((CudaTrainer *)p)->model;
    if (words[0] == 0 || m->precision != PRECISION_FP16) return; /* none saved (e.g. by train_gpt_cpu) */
    uint32_t bits = (uint32_t)words[0];
    memcpy(&m->loss_scale, &bits, sizeof bits);
    m->clean_steps = (int)words[1];
    m->skipped_steps = words[2];
}

/* Test only: LLMC_TEST_INF_RANK=RANK:STEP makes rank RANK's gradients non-finite at step STEP (the
 * step's last micro-step scales dloss by inf), as an fp16 overflow on that rank alone would; every
 * rank must then skip the update and halve its loss scale. With LLMC_TEST_ALL_RANKS_STDOUT (every
 * rank keeps stdout: llmc/dist/dist.c) each rank ends with a line giving its parameters' CRC-32 (the
 * device bits), loss scale and skipped steps, so that a test sees whether the ranks agree. */
static int test_inf_step(const Dist *d) {
    const char *e = getenv("LLMC_TEST_INF_RANK");
    int rank, at;
    if (!e) return -1;
    if (sscanf(e, "%d:%d", &rank, &at) != 2) llmc_die("LLMC_TEST_INF_RANK=%s: expected RANK:STEP", e);
    return rank == d->rank ? at : -1;
}

static void test_rank_summary(const CudaTrainer *tr) {
    if (!getenv("LLMC_TEST_ALL_RANKS_STDOUT")) return;
    const CudaModel *m = &tr->model;
    const size_t bytes = (m->param_slots ? m->shard_hi - m->shard_lo : m->num_parameters) * precision_bytes(m->precision); /* -z 3: the shard */
    unsigned char *h = (unsigned char *)mallocCheck(bytes, "parameters (LLMC_TEST_ALL_RANKS_STDOUT)");
    cudaCheck(cudaMemcpy(h, m->params_memory, bytes, cudaMemcpyDeviceToHost));
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < bytes; off += 1u << 30) crc = crc32(crc, h + off, (uInt)(bytes - off < (1u << 30) ? bytes - off : 1u << 30));
    free(h);
    printf("rank %d: parameters crc32 %08lx | loss scale %g (skipped %lld)\n", tr->dist->rank, (unsigned long)crc,
           m->loss_scale, m->skipped_steps);
}

/* The architecture of -e and its config (formats/arch.h); plan_llama: the Llama whose plan cuda_plan
 * prices (a TrainPlanFn sees only the ModelConfig), NULL: a GPT-2. */
static ArchConfig run_arch;
static const LlamaConfig *plan_llama;

/* The backend's part of the memory plan (train_memory_plan adds the loop's). */
static void cuda_plan(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p) {
    size_t lo = 0, hi = plan_llama ? llama_parameter_specs(plan_llama, NULL) : gpt2_parameter_specs(cfg, NULL);
    if (tc->zero_stage >= 1 && !p->offload) dist_shard(hi, tc->num_processes, tc->process_rank, &lo, &hi); /* as main() shards */
    const Precision prec = (Precision)precision_parse(tc->precision);
    cudamodel_plan(plan_llama, cfg, tc->B, tc->T, tc->recompute, prec, tc->master_weights, 0, hi - lo, 1, p);
    if (tc->zero_stage >= 2 && !p->offload) { /* as main(): cudamodel_set_grad_slots */
        TensorSpec specs[NUM_PARAMETER_TENSORS];
        const int num = plan_llama ? (int)LLAMA3_NUM_PARAMETERS : (int)NUM_PARAMETER_TENSORS;
        if (plan_llama) llama_parameter_specs(plan_llama, specs);
        else gpt2_parameter_specs(cfg, specs);
        cudamodel_plan_grad_slots(specs, num, hi - lo, prec, tc->zero_stage >= 3, p);
    }
}

/* Planned against measured device memory after the first step: cudaMemGetInfo's use less what the
 * CUDA context held before llmc allocated anything (the runtime's fixed overhead). */
static void cuda_print_planned_vs_measured(const CudaTrainer *tr, const TrainConfig *tc) {
    MemPlan plan;
    train_memory_plan(tc, &tr->model.cfg, cuda_plan, tr->model.offload, "GPU", &plan);
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double used = (double)(total_b - free_b), planned = (double)mem_plan_peak(&plan, 1, NULL);
    double overhead = tr->context_bytes, measured = used - overhead;
    printf("memory: planned device peak %.1f MiB; measured (cudaMemGetInfo) %.1f MiB = CUDA context overhead %.1f MiB "
           "+ %.1f MiB; planned / measured %.4f\n",
           planned / 1048576.0, used / 1048576.0, overhead / 1048576.0, measured / 1048576.0, planned / measured);
}

/* The highest ZeRO stage the CUDA optimizer shards (-z 1: m, v and master weights; -z 2: also the
 * gradients, reduced layer by layer from two packed slots into the shard). */
enum { CUDA_MAX_ZERO = 3 };

static void check_flags(const TrainConfig *tc, int *precision) {
    *precision = precision_parse(tc->precision);
    if (*precision < 0) llmc_die("--precision %s: use fp32, bf16 or fp16", tc->precision);
    if (tc->recompute < 0 || tc->recompute > 3) llmc_die("-r %d: recompute level must be 0, 1, 2 or 3", tc->recompute);
    if (tc->gelu_fusion < -1 || tc->gelu_fusion > 2) llmc_die("-ge %d: GELU fusion must be -1 (auto), 0, 1 or 2", tc->gelu_fusion);
    if (tc->zero_stage > CUDA_MAX_ZERO) llmc_die("-z %d: use -z 0, 1, 2 or 3", tc->zero_stage);
    if (strcmp(tc->offload, "optimizer") == 0) {
        if (*precision == PRECISION_FP16)
            llmc_die("--offload optimizer with --precision fp16 is not built (the fp16 loss scaler lives in the device "
                     "optimizer); use --precision bf16 or fp32");
        if (tc->zero_stage > 1) /* the loop's optimizer takes -z 2 buckets only from a backend that hands them over */
            llmc_die("--offload optimizer in train_gpt runs with -z 0 or 1 for now (-z %d given)", tc->zero_stage);
    }
}

/* --cuda-graph 1 where the configuration allows it (graph.cuh); otherwise a note and kernel-by-kernel
 * launches. fp16 is allowed: its loss scale is baked into the graph, which is captured anew when
 * the scale changes. */
static int cuda_graph_allowed(const TrainConfig *tc, const CudaModel *m, FILE *note) {
    if (!tc->cuda_graph) return 0;
    const char *why = tc->num_processes > 1 ? "more than one process (not built yet)"
                      : m->offload         ? "--offload optimizer (not built yet)"
                      : m->grad_hook       ? "per-layer gradient buckets (not built yet)"
                      : USE_CUDNN && m->precision != PRECISION_FP32 ? "cuDNN attention (its capture is untested)"
                                                                    : NULL;
    if (why && note) fprintf(note, "note: --cuda-graph 1 is not used with %s; kernels are launched one by one\n", why);
    return why == NULL;
}

/* Is init a Llama (a name, an HF directory, llmc's or llm.c's Llama file)? Then plan_llama is
 * it, and the flags a Llama on CUDA does not take are refused or noted (once: note). resolve:
 * run_arch becomes init's architecture, whatever it is (the model's own path: after -y 1 found
 * it); else only the Llama entry is asked (the GPT-2 fallback would read a path not yet resolved). */
static int detect_llama(TrainConfig *tc, const char *init, int note, int resolve) {
    const int found = resolve ? model_arch_for_init(init, &run_arch) != NULL : llama3_arch.config_from_init(init, &run_arch);
    plan_llama = found && run_arch.arch == &llama3_arch ? arch_config_as(&run_arch, const LlamaConfig) : NULL;
    if (!plan_llama) return 0;
    if (tc->recompute != 0 && note)
        printf("note: -r %d: the CUDA Llama keeps every activation (no recompute levels yet); using -r 0\n", tc->recompute);
    if (tc->gelu_fusion > 0 && note) printf("note: -ge %d: a Llama has no GELU (SwiGLU MLP); ignored\n", tc->gelu_fusion);
    tc->recompute = 0;
    tc->gelu_fusion = 0;
    return 1;
}

/* What --memory-budget may change for the model detect_llama found: -r (GPT-2 only), -b, -z with
 * several ranks, --offload optimizer (not with fp16). */
static BudgetSpace budget_space(int precision) {
    BudgetSpace s = {cuda_plan, 0, "GPU", 3, CUDA_MAX_ZERO, precision != PRECISION_FP16, 0, NULL};
    if (plan_llama) s.max_recompute = 0, s.no_recompute = "the CUDA Llama has -r 0 only";
    return s;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* every line reaches a pipe or a log file as it is printed */
    TrainConfig tc;
    train_config_defaults(&tc);
    train_config_parse(&tc, argc, argv, "train_gpt");
    int precision;
    check_flags(&tc, &precision);
    detect_llama(&tc, tc.init, !tc.plan, 0); /* (--plan --json prints only the JSON) */
    /* --memory-budget prices candidates with the device plan (the CUDA context's own use is not in it) */
    /* --offload optimizer (given, or chosen by the search: not with fp16) makes the loop's host optimizer */
    BudgetSpace space = budget_space(precision);
    const int given_offload = strcmp(tc.offload, "optimizer") == 0;
    /* --plan: no device, no process group, no run directory, no model */
    if (tc.plan && plan_llama) { /* a Llama: its header or name only */
        if (tc.memory_budget[0]) return budget_plan_main_for(&tc, &space, &plan_llama->base);
        MemPlan p;
        train_memory_plan(&tc, &plan_llama->base, cuda_plan, given_offload, "GPU", &p);
        if (tc.json) mem_plan_print_json(&p, stdout);
        else mem_plan_print(&p, stdout);
        return 0;
    }
    if (tc.plan) return tc.memory_budget[0] ? budget_plan_main(&tc, &space) : train_plan_main(&tc, cuda_plan, given_offload, "GPU");
    /* the process group: mpirun/srun ranks (a build with MPI and NCCL), -pi tcp|fs ranks (NCCL), or one process */
    const DistFlags dist_flags = train_config_dist_flags(&tc);
    Dist *dist = dist_init(&argc, &argv, &dist_flags, LLMC_HAVE_NCCL);
    tc.num_processes = dist->size;
    tc.process_rank = dist->rank;
    check_flags(&tc, &precision); /* again: the launcher may have given the process count */
    cuda_require_device();

    static CudaTrainer tr; /* large; one per process */
    tr.dist = dist;
    int devices = 1;
    cudaCheck(cudaGetDeviceCount(&devices));
    cuda_context_init(&tr.ctx, dist->local_rank % devices, tc.tf32); /* one GPU per local rank */
    size_t device_free = 0; /* what llmc may allocate on the device */
    mem_account(MEM_WORKSPACE, (long long)tr.ctx.lt_workspace_bytes, 1); /* the context's cuBLASLt workspace */
    {
        size_t free_b = 0, total_b = 0;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        tr.context_bytes = (double)(total_b - free_b) - (double)tr.ctx.lt_workspace_bytes;
        device_free = free_b + tr.ctx.lt_workspace_bytes; /* the plan counts that workspace */
    }
#if LLMC_HAVE_NCCL
    nccl_start(&tr);
#endif
    tr.ctx.lt_algos = tc.matmul_algos;
    tr.ctx.lt_log = stdout;
    if (tc.matmul_cache[0] || tc.output_dir[0]) {
        int n = tc.matmul_cache[0] ? snprintf(tr.ctx.lt_cache_path, sizeof tr.ctx.lt_cache_path, "%s", tc.matmul_cache)
                                   : snprintf(tr.ctx.lt_cache_path, sizeof tr.ctx.lt_cache_path, "%s/matmul_algos.txt", tc.output_dir);
        if (n >= (int)sizeof tr.ctx.lt_cache_path) llmc_die("--matmul-cache: the path is too long");
    }
    char init[1100];
    int resume_step = train_resolve_init(&tc, init, sizeof init);
    const int llama = detect_llama(&tc, init, 0, 1); /* a resumed run's checkpoint: the same architecture */
    space = budget_space(precision);
    tr.tc = tc;
    CudaModel *m = &tr.model;
    cudamodel_build(m, init, tc.seed, (Precision)precision, &tr.ctx, tc.master_weights);
    FILE *note = dist->rank == 0 ? stdout : NULL;
    if (tc.memory_budget[0]) budget_fit(&tc, &m->cfg, &space, cli_memory_budget_bytes(tc.memory_budget), "--memory-budget", note);
    if (budget_peak(&tc, &m->cfg, &space) > device_free) { /* it would run out of memory: fit the device instead */
        if (note) fprintf(note, "memory: the plan exceeds the device's free memory; searching with that as the budget\n");
        budget_fit(&tc, &m->cfg, &space, device_free, "device free memory (cudaMemGetInfo)", note);
    }
    budget_agree(dist, &tc);
    check_flags(&tc, &precision); /* what the search chose, too */
    tr.tc = tc;
    const int offload = strcmp(tc.offload, "optimizer") == 0;
    if (offload) cudamodel_set_offload(m); /* the loop's optimizer keeps m, v (as --optim-state says) */
    else cudamodel_set_optim_state(m, optstate_parse(tc.optim_state));
    if (tc.zero_stage >= 1 && !offload) { /* this rank's optimizer state only (-z 2: and reduced gradients) */
        size_t lo, hi;
        dist_shard(m->num_parameters, dist->size, dist->rank, &lo, &hi);
        cudamodel_set_shard(m, lo, hi);
        if (tc.zero_stage >= 2) cudamodel_set_grad_slots(m); /* no full gradient buffer */
        if (tc.zero_stage >= 3) { /* no full parameters: each layer gathered when needed */
            cudamodel_set_param_slots(m);
            m->params_hook = cuda_params_hook;
            m->params_hook_ctx = &tr;
        }
    }
    cudamodel_allocate(m, tc.B, tc.T, tc.recompute, tc.gelu_fusion, 1);
    const ModelConfig *cfg = &m->cfg;
    tr.peak_flops = peak_flops_for(&tr.ctx.props, m->precision, tc.tf32, tc.peak_tflops);
    tr.flops_per_token = run_arch.arch->flops_per_token(&run_arch, tc.T);
    /* gradient buckets: reduced over the ranks, or copied to the host, as the backward makes them */
    const long long micro_tokens = (long long)tc.B * tc.T * dist->size;
    tr.accum = tc.total_batch > 0 ? (int)(tc.total_batch / micro_tokens) : 1;
    tr.trace = getenv("LLMC_TEST_TRACE_BUCKETS") != NULL;
    tr.step = resume_step < 0 ? 0 : resume_step; /* (-1: a fresh run) */
    tr.inf_step = test_inf_step(dist);
#if LLMC_HAVE_NCCL
    const int comm = tr.comm != NULL;
#else
    const int comm = 0;
#endif
    if (m->grad_slots || ((comm || offload) && !getenv("LLMC_TEST_UNBUCKETED"))) { /* (-z 2 needs it) */
        cudaCheck(cudaEventCreateWithFlags(&tr.bucket_ready, cudaEventDisableTiming));
        if (offload) {
            cudaCheck(cudaStreamCreateWithFlags(&tr.copy_stream, cudaStreamNonBlocking));
            cudaCheck(cudaEventCreateWithFlags(&tr.params_ready, cudaEventDisableTiming));
            const int nb = cfg->num_layers + 1;
            tr.bucket_sumsq = (double *)callocCheck(nb, sizeof(double), "gradient bucket sums of squares");
            tr.host_buckets = (HostBucket *)mallocCheck(nb * sizeof *tr.host_buckets, "host bucket arguments");
            for (int k = 0; k < nb; k++) tr.host_buckets[k] = {&tr, k - 1};
        }
        m->grad_hook = cuda_bucket_ready;
        m->grad_hook_ctx = &tr;
    }
    tr.use_graph = cuda_graph_allowed(&tc, m, dist->rank == 0 ? stdout : NULL);

    char name[512];
    snprintf(name, sizeof name, "CUDA %s%s on %s (sm_%d%d)%s%s, GELU fusion %d, recompute %d", llama ? "Llama 3 " : "",
             precision_name(m->precision), tr.ctx.props.name, tr.ctx.props.major, tr.ctx.props.minor, m->master ? ", fp32 master weights" : "",
             m->precision == PRECISION_FP32 ? (tc.tf32 ? ", TF32 on" : ", TF32 off") : "", m->gelu_fusion, tc.recompute);
    if (tr.use_graph) snprintf(name + strlen(name), sizeof name - strlen(name), ", CUDA graph");
    TrainBackend be;
    memset(&be, 0, sizeof be);
    be.name = name;
    be.model = &tr;
    be.cfg = m->cfg;
    be.num_parameters = m->num_parameters;
    be.peak_flops = tr.peak_flops;
    be.gpu = 1;
    be.train_micro_step = cuda_train_micro_step;
    be.step_loss = cuda_step_loss;
    be.eval_loss = cuda_eval_loss;
    be.zero_grad = cuda_zero_grad;
    be.grad_norm = cuda_grad_norm;
    be.update = cuda_update;
    be.next_logits = cuda_next_logits;
    be.host_params = m->host_params;
    be.host_m = m->host_m;
    be.host_v = m->host_v;
    be.zero_max = CUDA_MAX_ZERO;
    if (offload) {
        be.host_grads = m->host_grads;
        be.param_specs = m->param_specs;
        be.host_m = be.host_v = NULL;
        be.grads_to_host = cuda_grads_to_host;
        be.params_from_host = cuda_params_from_host;
        if (m->grad_hook) {
            be.grad_bucket_sumsq = cuda_grad_bucket_sumsq;
            be.params_bucket_to_device = cuda_params_bucket_to_device;
        }
    }
    be.sync_to_host = cuda_sync_to_host;
    be.sync_from_host = cuda_sync_from_host;
    be.print_memory = cuda_print_memory;
    be.step_extras = cuda_step_extras;
    be.save_backend_state = cuda_save_backend_state;
    be.load_backend_state = cuda_load_backend_state;
    be.plan = cuda_plan;
    be.arch = &run_arch; /* the checkpoint files, --save-hf and the flops are the architecture's */
    if (tc.gpu_log_every > 0) {
        gpu_telemetry_open(&tr.telemetry, tr.ctx.device, LLMC_NVML_LIBRARY);
        gpu_telemetry_print_source(&tr.telemetry, tc.gpu_log_every);
        be.telemetry = cuda_telemetry;
    }

    int status = train_run(&tc, &be, resume_step);
    test_rank_summary(&tr);
    if (tr.use_graph && dist->rank == 0)
        printf("CUDA graph: %lld capture(s), %lld launch(es) for %lld micro-steps\n", tr.graph.captures, tr.graph.launches,
               tr.micro_steps);
    cuda_step_graph_free(&tr.graph);
    gpu_telemetry_close(&tr.telemetry);
    if (tr.copy_stream) cudaCheck(cudaStreamDestroy(tr.copy_stream));
    if (tr.bucket_ready) cudaCheck(cudaEventDestroy(tr.bucket_ready));
    if (tr.params_ready) cudaCheck(cudaEventDestroy(tr.params_ready));
    free(tr.bucket_sumsq);
    free(tr.host_buckets);
#if LLMC_HAVE_NCCL
    nccl_stop(&tr);
#endif
    cudamodel_free(m);
    cuda_context_free(&tr.ctx);
    dist_finalize(dist);
    return status;
}
