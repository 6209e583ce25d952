/*
 * mem.h - the memory plan and the accounting allocator.
 *
 * Every allocation of the model, the optimizer and the scratch goes through mem_calloc (host)
 * or mem_account (a device allocation made elsewhere), by class. A backend's plan function
 * computes the bytes of every class from the same tables and functions its allocation code
 * reads (the allocation code takes its sizes from the plan), so the plan is the allocation:
 * after setup the loop checks mem_live(c) == plan.bytes[c] for every accounted class and dies
 * naming the class that differs (a bug, not a user error). The loop's own part of the plan
 * (optimizer moments, token and data buffers) is priced in llmc/train/plan.h.
 *
 * Classes that are planned but not accounted (the dataloader's buffers, library workspaces the
 * runtime allocates itself) are marked in mem_class_accounted.
 */
#ifndef LLMC_CORE_MEM_H
#define LLMC_CORE_MEM_H

#include <stddef.h>
#include <stdio.h>

#include "llmc/core/tensor.h" /* TensorSpec, MODEL_MAX_ACTIVATIONS */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MEM_PARAMETERS,     /* the model's parameters (compute precision on the GPU) */
    MEM_MASTER,         /* fp32 master weights (GPU, low precision with -w 1) */
    MEM_GRADIENTS,      /* the gradient arena */
    MEM_ADAM_M,         /* AdamW first moment (this rank's shard) */
    MEM_ADAM_V,         /* AdamW second moment (this rank's shard) */
    MEM_GRAD_SHARD,     /* -z >= 2: this rank's shard of the summed gradient */
    MEM_PARAM_GATHER,   /* -z 3: the gathered parameters of the buckets in use (the rest are sharded) */
    MEM_ACTIVATIONS,    /* the activation arena (by tensor in MemPlan.act) */
    MEM_BWD_SCRATCH,    /* backward scratch, one layer's worth */
    MEM_OP_SCRATCH,     /* fp32 op scratch (GPU: norms, classifier, LM-head chunk) */
    MEM_WORKSPACE,      /* cuBLASLt / cuDNN / attention workspaces (GPU) */
    MEM_TOKENS,         /* the loop's input/target buffers (micro-batch and whole step) */
    MEM_STAGING,        /* host copies and staging buffers of a device backend */
    MEM_DATA,           /* dataloader prefetch buffers (planned, allocated by the dataloader) */
    MEM_BLAS_PACKING,   /* CPU: the part of the sgemm's packing buffer it touches (planned: matmul_blas_buffer_bytes) */
    MEM_CHECKPOINT,     /* transient: whole m and v gathered to write a checkpoint (rank 0); -z 0 compact
                         * states: one chunk decoded at a time into the state file */
    MEM_CUDNN_WORKSPACE, /* GPU, cuDNN builds: the attention graphs' workspace (planned bound, cuDNN sizes it) */
    MEM_GRAD_COMP,      /* --grad-compression: the error-feedback residual and the ranks' payloads (llmc/train/gradcomp.h) */
    MEM_NVME_RING,      /* --offload-device nvme: the staging ring the moments stream through (llmc/train/nvme.h) */
    MEM_TEST_LEAK,      /* only the planted leak of LLMC_TEST_LEAK */
    MEM_NUM_CLASSES
} MemClass;

extern const char *const mem_class_names[MEM_NUM_CLASSES];
/* 1 where every byte of the class goes through mem_calloc/mem_account. */
extern const int mem_class_accounted[MEM_NUM_CLASSES];

typedef struct {
    const char *device;                    /* "CPU" (process memory) or "GPU" (device memory) */
    size_t host[MEM_NUM_CLASSES];          /* host bytes by class, live for the whole run */
    size_t device_bytes[MEM_NUM_CLASSES];  /* device bytes by class (GPU backend) */
    size_t transient[MEM_NUM_CLASSES];     /* host bytes live only in one phase (checkpoint save) */
    TensorSpec act[MODEL_MAX_ACTIVATIONS];
    size_t act_bytes[MODEL_MAX_ACTIVATIONS]; /* bytes of each activation tensor */
    size_t num_parameters;
    int B, T, recompute, zero, ranks, rank, accum;
    int optim_state;                       /* --optim-state (OptStateType): the bytes of m and v */
    int offload;                           /* --offload optimizer: master weights and moments on the host */
    size_t disk_bytes;                     /* --offload-device nvme: the moments' file under --nvme-path (not memory) */
    long long total_batch;
    char config[256];                      /* precision and backend knobs, as text */
} MemPlan;

void mem_plan_init(MemPlan *p, const char *device);
/* A model's tables into its plan (every activation stored, -r 0): num_parameters fp32 parameters
 * (and gradients when training), the n_acts activation rows, and an activation arena of
 * act_floats (the table's total plus any extra the model keeps there, e.g. the RoPE table). */
void mem_plan_tables(MemPlan *p, size_t num_parameters, const TensorSpec *act, int n_acts, size_t act_floats,
                     int training);
/* The planned peak: of the process (host) for the CPU, of the device for the GPU; phase names
 * the phase that reaches it. step_only leaves out the checkpoint phase. */
size_t mem_plan_peak(const MemPlan *p, int step_only, const char **phase);
void mem_plan_print(const MemPlan *p, FILE *out);
void mem_plan_print_json(const MemPlan *p, FILE *out);
/* The bytes accounted for class c: the device's on a GPU plan, else the host's. */
size_t mem_plan_accounted(const MemPlan *p, MemClass c, int device);

/* ---- the accounting allocator ---- */
/* calloc(n, size) counted to class c; dies (naming what) when it fails. */
void *mem_calloc(MemClass c, size_t n, size_t size, const char *what);
/* frees p, allocated with mem_calloc(c, ...) of bytes in all. */
void mem_free(MemClass c, void *p, size_t bytes);
/* Counts an allocation made elsewhere (device memory): delta bytes, device 1 or host 0. */
void mem_account(MemClass c, long long delta, int device);
size_t mem_live(MemClass c, int device);
size_t mem_live_total(int device);
size_t mem_peak_total(int device);
/* Dies naming the first accounted class whose live bytes differ from the plan's. */
void mem_check_plan(const MemPlan *p);
/* VmRSS / VmHWM of this process in bytes (0 where /proc is absent). */
size_t mem_process_rss(void);
size_t mem_process_hwm(void);
/* VmRSS when the process started (before main): the runtime's fixed overhead. */
size_t mem_process_start_rss(void);

#ifdef __cplusplus
}
#endif
#endif
