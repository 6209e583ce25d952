/*
 * cudamodel.cuh - the CUDA model's runtime, shared by every architecture: build, memory plan and
 * allocation, host sync, the forward and backward drivers (staging, the chunked LM head and its
 * loss, the embedding's backward), the gradient norm, the AdamW update, offload copies and the
 * memory table. The struct and its views are arena.cuh's; each architecture's block sequence and
 * its CudaArch entry (arch.cuh) are its own file's (gpt2.cuh, llama.cuh, mlp.cuh), listed in
 * archs.cuh. cudamodel_build finds the entry of -e's architecture (cuda_arch_for) and every entry
 * point goes through it (m->arch): nothing here asks which architecture it is (the shared LM head
 * reads the activation rows named lnf, logits and losses through GPT-2's ActivationTensors slots,
 * gpt2cuda_point_activations, whatever the table). Tensors are stored in the run-time precision
 * T (fp32 | bf16 | fp16); losses, AdamW moments, master weights and norms are fp32. The LM head
 * and the loss run in chunks of head_rows positions, so the (B*T, Vp) logits are never stored: the
 * logits buffer holds one chunk (at most LLMC_HEAD_CHUNK_BYTES). In a training forward each chunk's
 * logits are computed, turned into losses and dlogits in place, and the head's backward for those
 * rows runs at once (dlnf rows into dbuf_c, the head's gradient +=), while they exist. With one chunk (B*T <= head_rows) this is the unchunked sequence
 * exactly. Precision is chosen at run time; with_storage_type() in the public functions below is
 * the one point where it becomes the template argument T.
 *
 * Contract: cudamodel_forward with targets and dloss != 0 also runs the head's backward (dlnf in
 * dbuf_c, the head's gradient accumulated), and cudamodel_backward must follow before the next forward;
 * the backward accumulates into the gradients (cudamodel_zero_grad per step). Without targets the
 * forward stops at lnf; cudamodel_logits_rows computes the logits of up to head_rows positions.
 * cudamodel_forward waits for its loss; a training loop that need not splits it: cudamodel_stage
 * (tokens through pinned buffers), cudamodel_forward_device and cudamodel_backward_layers (launches
 * only: a CUDA graph can capture them, graph.cuh), cudamodel_backward_encoder, and once per step
 * cudamodel_read_step_loss (the sum of the micro-steps' mean losses, kept on the device).
 *
 * fp16 loss scaling: micro-steps scale dloss by loss_scale; cudamodel_grad_norm unscales the
 * norm and, when it is not finite (an overflow), halves loss_scale, counts a skipped step and
 * returns the non-finite norm so the shared loop skips the update; every update that happens
 * counts towards loss_scale_window clean steps, after which the scale doubles.
 */
#ifndef LLMC_CUDA_MODEL_CUH
#define LLMC_CUDA_MODEL_CUH

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/formats/arch.h"
#include "llmc/dist/bucket.h"
#include "llmc/core/rng.h"
#include "llmc/core/mem.h"
#include "llmc/cuda/adamw.cuh"
#include "llmc/cuda/arch.cuh"
#include "llmc/cuda/archs.cuh"
#include "llmc/cuda/arena.cuh"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/cast.cuh"
#include "llmc/cuda/classifier.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/loss.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/nvtx.cuh"

/* ---- building ----------------------------------------------------------------------------- */
/* cudamodel_build's host copies: parameters, m, v (fp32), a logits row, the staging buffer (T). */
inline size_t cudamodel_build_host_bytes(size_t n, int Vp, size_t elem) {
    return 3 * n * sizeof(float) + (size_t)Vp * sizeof(float) + n * elem;
}

/* An upper bound of the workspace cuDNN's attention graphs ask for (it cannot be queried without a
 * GPU): the backward's fp32 softmax sum (B, NH, T) and dQ accumulator (B, NH, T, HS), and the
 * deterministic algorithm's bf16/fp16 dP buffer (B, NH, T64, T64), T64 = T rounded up to 64. The
 * memory table prints what cuDNN took (cudnn_att_workspace_bytes). */
inline size_t cudamodel_cudnn_workspace_bound(const ModelConfig *cfg, int B, int T_) {
    const size_t rows = (size_t)B * cfg->num_heads * T_, T64 = ((size_t)T_ + 63) / 64 * 64;
    return rows * (1 + (size_t)(cfg->channels / cfg->num_heads)) * sizeof(float) +
           (size_t)B * cfg->num_heads * T64 * T64 * 2;
}

enum { LLMC_READBACK_BYTES = 16 }; /* gpt2cuda's pinned readback buffer: a double and a float */

/* The CUDA backend's memory plan: device bytes by class (cudamodel_build and cudamodel_allocate
 * allocate exactly these; the cuBLASLt workspace is the context's) and the host copies. */
/* opt_elems: the parameters whose AdamW state (m, v, master) this rank keeps (all n, or its ZeRO-1
 * shard; at least 1 is allocated, so that an empty shard still has valid pointers). */
/* ac: the architecture and its config (its CUDA entry must exist; a recompute level within its
 * max_recompute). */
inline void cudamodel_plan(const ArchConfig *ac, int B, int T_, int recompute, Precision prec, int use_master,
                           int head_rows_request, size_t opt_elems, int training, MemPlan *p) {
    const CudaArch *ca = cuda_arch_for(ac->arch);
    if (!ca) llmc_die("cudamodel_plan: the CUDA runtime has no block sequence for %s", ac->arch->display);
    const ModelConfig *cfg = arch_config_cbase(ac);
    const size_t elem = precision_bytes(prec), N = (size_t)B * T_;
    const size_t n = ac->arch->parameter_specs(ac, NULL);
    const size_t C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden, F1 = ca->scratch_f1(cfg);
    use_master = use_master && prec != PRECISION_FP32;
    p->num_parameters = n;
    p->recompute = recompute;
    p->device_bytes[MEM_PARAMETERS] = n * elem;
    int head_rows = cudamodel_head_rows(N, cfg->padded_vocab_size, elem, head_rows_request);
    memset(p->act, 0, sizeof p->act); /* a shorter table ends at a NULL name */
    memset(p->act_bytes, 0, sizeof p->act_bytes);
    p->device_bytes[MEM_ACTIVATIONS] = ca->activation_specs(ac, B, T_, recompute, prec, head_rows, p->act, p->act_bytes);
    p->device_bytes[MEM_TOKENS] = 2 * N * sizeof(int);
    /* + the norm, the mean loss and the fp64 loss accumulator */
    const size_t fscratch = ca->fscratch_floats(cfg, N);
    p->device_bytes[MEM_OP_SCRATCH] = (fscratch + 2) * sizeof(float) + sizeof(double);
    p->device_bytes[MEM_WORKSPACE] = LLMC_CUBLASLT_WORKSPACE;
    const int cudnn = USE_CUDNN && prec != PRECISION_FP32 && ca->has_attention;
    if (cudnn) p->device_bytes[MEM_CUDNN_WORKSPACE] = cudamodel_cudnn_workspace_bound(cfg, B, T_);
    /* + the pinned token staging and readback buffers */
    p->host[MEM_STAGING] = cudamodel_build_host_bytes(n, cfg->padded_vocab_size, elem) + 2 * N * sizeof(int) + LLMC_READBACK_BYTES;
    snprintf(p->config, sizeof p->config, "%s, master weights %d, LM-head chunk %d rows, cuBLASLt workspace %d MiB%s",
             precision_name(prec), use_master, head_rows, LLMC_CUBLASLT_WORKSPACE >> 20,
             cudnn ? ", cuDNN attention (workspace: a bound)" : "");
    if (!training) return;
    p->device_bytes[MEM_BWD_SCRATCH] = (2 * N * C + N * F1 + N * F) * elem;
    p->device_bytes[MEM_GRADIENTS] = n * elem;
    const size_t ns = opt_elems ? opt_elems : 1;
    if (p->offload) { /* master weights (host_params) and gradients on the host; the loop's plan adds m, v */
        p->host[MEM_STAGING] -= 3 * n * sizeof(float);
        p->host[MEM_MASTER] = n * sizeof(float);
        p->host[MEM_GRADIENTS] = n * sizeof(float);
    } else {
        p->device_bytes[MEM_ADAM_M] = optstate_bytes(ns, p->optim_state);
        p->device_bytes[MEM_ADAM_V] = optstate_bytes(ns, p->optim_state);
        if (use_master) p->device_bytes[MEM_MASTER] = ns * sizeof(float);
    }
    p->device_bytes[MEM_OP_SCRATCH] += encoder_buckets_capacity((int)N) * sizeof(int);
    p->host[MEM_STAGING] += (encoder_buckets_capacity((int)N) + N) * sizeof(int);
}
/* -z 2 without a full gradient buffer (grad_slots): the gradient class is the outer bucket and
 * two layer slots, packed (bucket.h's bucket_packing), and the reduced gradients are the rank's
 * shard (shard elements, at least 1 allocated). */
inline void cudamodel_plan_grad_slots(const TensorSpec *specs, int num_specs, size_t shard, Precision prec, int zero3, MemPlan *p) {
    size_t outer, layer;
    bucket_packing(specs, num_specs, &outer, &layer, NULL);
    p->device_bytes[MEM_GRADIENTS] = (outer + 2 * layer) * precision_bytes(prec);
    p->device_bytes[MEM_GRAD_SHARD] = (shard ? shard : 1) * precision_bytes(prec);
    if (!zero3) return; /* -z 3: the parameters' shard, and the outer bucket whole + two gathered layers */
    p->device_bytes[MEM_PARAMETERS] = (shard ? shard : 1) * precision_bytes(prec);
    p->device_bytes[MEM_PARAM_GATHER] = (outer + 2 * layer) * precision_bytes(prec);
}

/* cudaMallocHost counted to the host's staging class. */
inline void *cudamodel_pinned(size_t bytes) {
    void *p = NULL;
    cudaCheck(cudaMallocHost(&p, bytes));
    memset(p, 0, bytes);
    mem_account(MEM_STAGING, (long long)bytes, 0);
    return p;
}

/* Device memory of class c from the context's allocator (devalloc.cuh), counted to the device
 * column of the accounting allocator; cudamodel_free_device gives it back. */
inline void *cudamodel_malloc(CudaModel *m, MemClass c, size_t bytes) {
    void *p = devalloc_malloc(m->ctx->alloc, c, bytes);
    mem_account(c, (long long)bytes, 1);
    return p;
}

#if USE_CUDNN
/* cudnn_att_set_allocator's pair: the device allocator (ctx) for cuDNN's attention workspace. */
inline void *cudamodel_cudnn_alloc(void *ctx, size_t bytes) { return devalloc_malloc((DevAlloc *)ctx, MEM_CUDNN_WORKSPACE, bytes); }
inline void cudamodel_cudnn_release(void *ctx, void *p) { devalloc_free((DevAlloc *)ctx, p); }
#endif

/* The model of architecture ac (its CUDA entry: cuda_arch_for, else an error naming init, the
 * -e it came from) with zero host parameters: the caller fills host_params (num_parameters fp32),
 * which cudamodel_allocate puts on the device. */
inline void cudamodel_build_config(CudaModel *m, const ArchConfig *ac, const char *init, unsigned long long seed,
                                   Precision prec, CudaContext *ctx, int use_master) {
    const CudaArch *ca = cuda_arch_for(ac->arch);
    cuda_arch_refuse(ac->arch, ca, init, "the CUDA runtime", "");
    memset(m, 0, sizeof *m);
    m->arch = ca;
    m->ac = *ac;
    m->cfg = *arch_config_cbase(ac);
    m->num_parameters = ac->arch->parameter_specs(ac, m->param_specs);
    m->num_param_specs = ac->arch->num_param_specs;
    m->precision = prec;
    m->ctx = ctx;
    m->seed = seed;
    m->use_master = use_master && prec != PRECISION_FP32;
    const size_t n = m->num_parameters, elem = precision_bytes(prec);
    m->host_params = (float *)mem_calloc(MEM_STAGING, n, sizeof(float), "host parameters");
    m->host_m = (float *)mem_calloc(MEM_STAGING, n, sizeof(float), "host AdamW m");
    m->host_v = (float *)mem_calloc(MEM_STAGING, n, sizeof(float), "host AdamW v");
    m->host_logits = (float *)mem_calloc(MEM_STAGING, (size_t)m->cfg.padded_vocab_size, sizeof(float), "host logits row");
    m->h_staging = mem_calloc(MEM_STAGING, n, elem, "host staging");
    m->params_memory = cudamodel_malloc(m, MEM_PARAMETERS, n * elem);
    ca->configure(m, ac);
    m->shard_lo = 0;
    m->shard_hi = n;
    m->loss_scale = prec == PRECISION_FP16 ? 65536.0f : 1.0f;
    m->loss_scale_window = 1000;
}

/* The model -e init names (formats/arch.h's model_arch_for_init: a descriptor or name, a file, an
 * HF directory) with its parameters in host_params: the architecture's load_init (random by the
 * table's rules for a name, with seed; else the file's, verified). */
inline void cudamodel_build(CudaModel *m, const char *init, unsigned long long seed, Precision prec, CudaContext *ctx,
                           int use_master) {
    ArchConfig ac; /* the architecture is the model's: name or file header */
    const ModelArch *arch = model_arch_for_init(init, &ac);
    cudamodel_build_config(m, &ac, init, seed, prec, ctx, use_master);
    arch->load_init(init, &ac, m->host_params, m->num_parameters, seed);
}

inline void cudamodel_sync_from_host(CudaModel *m);

/* Keep the optimizer state of parameters [lo, hi) only (ZeRO-1); before cudamodel_allocate. */
inline void cudamodel_set_optim_state(CudaModel *m, int state) {
    if (m->m || m->offload) llmc_die("cudamodel_set_optim_state: after allocation or with offload (the loop's optimizer keeps the states)");
    m->optim_state = state;
}

/* --offload optimizer: the host copies of m and v go (the loop's optimizer owns the moments),
 * host_params becomes the master copy (class master_weights, host), and the pinned fp32 host
 * gradients are allocated. Before cudamodel_allocate; one rank, bf16 or fp32. */
inline void cudamodel_set_offload(CudaModel *m) {
    const size_t n = m->num_parameters;
    if (m->m || m->shard_hi - m->shard_lo != n) llmc_die("cudamodel_set_offload: after allocation or with a ZeRO shard");
    mem_free(MEM_STAGING, m->host_m, n * sizeof(float));
    mem_free(MEM_STAGING, m->host_v, n * sizeof(float));
    m->host_m = m->host_v = NULL;
    mem_account(MEM_STAGING, -(long long)(n * sizeof(float)), 0); /* host_params: now the master copy */
    mem_account(MEM_MASTER, (long long)(n * sizeof(float)), 0);
    cudaCheck(cudaMallocHost((void **)&m->host_grads, n * sizeof(float)));
    memset(m->host_grads, 0, n * sizeof(float));
    mem_account(MEM_GRADIENTS, (long long)(n * sizeof(float)), 0);
    /* the staging buffer (same bytes, same class) pinned too: the bf16 gradients' per-bucket copies
     * (cudamodel_grads_copy_to_host) then run asynchronously; into pageable memory each copy would
     * hold the host, and with it the queueing of the rest of the backward, until it completed */
    const size_t stage = n * precision_bytes(m->precision);
    free(m->h_staging);
    cudaCheck(cudaMallocHost(&m->h_staging, stage));
    memset(m->h_staging, 0, stage);
    m->offload = 1;
    m->use_master = 0;
}

/* -z 2: no full gradient buffer (see grad_slots); before cudamodel_allocate, after cudamodel_set_shard.
 * The trainer must set grad_hook (it reduces each slot into the shard). */
inline void cudamodel_set_grad_slots(CudaModel *m) {
    if (m->m || m->offload) llmc_die("cudamodel_set_grad_slots: after allocation or with offload");
    bucket_packing(m->param_specs, m->num_param_specs, &m->outer_numel, &m->layer_numel, m->bucket_pos);
    m->grad_slots = 1;
}
/* -z 3: the parameters sharded too (see param_slots); after cudamodel_set_grad_slots. */
inline void cudamodel_set_param_slots(CudaModel *m) {
    if (!m->grad_slots) llmc_die("cudamodel_set_param_slots: before cudamodel_set_grad_slots");
    m->param_slots = 1;
}

inline void cudamodel_set_shard(CudaModel *m, size_t lo, size_t hi) {
    if (m->m || lo > hi || hi > m->num_parameters) llmc_die("cudamodel_set_shard: [%zu, %zu) after allocation or outside the parameters", lo, hi);
    m->shard_lo = lo;
    m->shard_hi = hi;
}

/* Activations for batches up to (B, T), plus gradients, moments and scratch if training. */
inline void cudamodel_allocate(CudaModel *m, int B, int T_, int recompute, int gelu_fusion, int training) {
    const ModelConfig *cfg = &m->cfg;
    const CudaArch *ca = m->arch;
    if (ca->max_recompute == 0 && recompute != 0)
        llmc_die("recompute level -r %d: a %s on CUDA keeps every activation (-r 0)", recompute, ca->who);
    if (!ca->has_gelu && gelu_fusion > 0) llmc_die("-ge %d: a %s has no GELU (its MLP is SwiGLU); use -ge -1 or 0", gelu_fusion, ca->who);
    if (!ca->has_gelu) gelu_fusion = 0;
    if (T_ > cfg->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T_, cfg->max_seq_len);
    if (recompute < 0 || recompute > 3) llmc_die("recompute level -r %d: use 0, 1, 2 or 3", recompute);
    if (gelu_fusion < -1 || gelu_fusion > 2) llmc_die("-ge %d: use -1 (auto), 0, 1 or 2", gelu_fusion);
    /* auto: the cuBLASLt GELU epilogues (forward and backward) wherever the shape allows them
     * (GPT-2's MLP width 4C always does: C is a multiple of the head size) */
    if (gelu_fusion == -1) gelu_fusion = cfg->ffn_hidden % 8 == 0 ? 2 : 0;
    if (gelu_fusion > 0 && cfg->ffn_hidden % 8 != 0) llmc_die("-ge %d needs the MLP width %d to be a multiple of 8", gelu_fusion, cfg->ffn_hidden);
    const int HS = cfg->channels / cfg->num_heads;
    if (ca->has_attention && HS != 16 && HS != 32 && HS != 64 && HS != 128)
        llmc_die("head size %d: the CUDA attention supports 16, 32, 64, 128", HS);
    m->B = B;
    m->T = T_;
    m->recompute = recompute;
    m->gelu_fusion = gelu_fusion;
    MemPlan *plan = &m->plan;
    mem_plan_init(plan, "GPU");
    plan->optim_state = m->optim_state;
    plan->offload = m->offload;
    cudamodel_plan(&m->ac, B, T_, recompute, m->precision, m->use_master, m->head_rows_request, m->shard_hi - m->shard_lo,
                   training, plan);
    if (training && m->grad_slots)
        cudamodel_plan_grad_slots(m->param_specs, m->num_param_specs, m->shard_hi - m->shard_lo, m->precision, m->param_slots, plan);
    if (m->param_slots) { /* the whole parameters (cudamodel_build's) give way to the shard and the gather buffer */
        devalloc_free(m->ctx->alloc, m->params_memory);
        mem_account(MEM_PARAMETERS, -(long long)(m->num_parameters * precision_bytes(m->precision)), 1);
        m->params_memory = cudamodel_malloc(m, MEM_PARAMETERS, plan->device_bytes[MEM_PARAMETERS]);
        m->gather_memory = cudamodel_malloc(m, MEM_PARAM_GATHER, plan->device_bytes[MEM_PARAM_GATHER]);
        memset(&m->params, 0, sizeof m->params); /* (decode.cuh's views: not at -z 3) */
    }
    m->head_rows = cudamodel_head_rows((size_t)B * T_, cfg->padded_vocab_size, precision_bytes(m->precision), m->head_rows_request);
    memcpy(m->act_specs, plan->act, sizeof m->act_specs);
    memcpy(m->act_bytes, plan->act_bytes, sizeof m->act_bytes);
    m->acts_total_bytes = plan->device_bytes[MEM_ACTIVATIONS];
    m->acts_memory = cudamodel_malloc(m, MEM_ACTIVATIONS, m->acts_total_bytes);
    cudaCheck(cudaMemset(m->acts_memory, 0, m->acts_total_bytes));
    gpt2cuda_point_activations(m);
    const size_t N = (size_t)B * T_, C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden;
    const size_t elem = precision_bytes(m->precision);
    m->d_inputs = (int *)cudamodel_malloc(m, MEM_TOKENS, N * sizeof(int));
    m->d_targets = (int *)cudamodel_malloc(m, MEM_TOKENS, N * sizeof(int));
    m->h_inputs = (int *)cudamodel_pinned(2 * N * sizeof(int));
    m->h_targets = m->h_inputs + N;
    m->h_readback = cudamodel_pinned(LLMC_READBACK_BYTES);
    cudaCheck(cudaEventCreateWithFlags(&m->staged, cudaEventDisableTiming));
    m->fscratch_floats = ca->fscratch_floats(cfg, N);
    m->fscratch = (float *)cudamodel_malloc(m, MEM_OP_SCRATCH, m->fscratch_floats * sizeof(float));
    m->d_norm = (float *)cudamodel_malloc(m, MEM_OP_SCRATCH, sizeof(float));
    m->d_loss = (float *)cudamodel_malloc(m, MEM_OP_SCRATCH, sizeof(float));
    m->d_loss_acc = (double *)cudamodel_malloc(m, MEM_OP_SCRATCH, sizeof(double));
    cudaCheck(cudaMemset(m->d_loss_acc, 0, sizeof(double)));
    if (training) {
        m->scratch_bytes = plan->device_bytes[MEM_BWD_SCRATCH];
        m->scratch_memory = cudamodel_malloc(m, MEM_BWD_SCRATCH, m->scratch_bytes);
        m->dresidual = m->scratch_memory;
        m->dbuf_c = (char *)m->dresidual + N * C * elem;
        m->dbuf_f1 = (char *)m->dbuf_c + N * C * elem;
        m->dbuf_f2 = (char *)m->scratch_memory + m->scratch_bytes - N * F * elem;
        m->grads_memory = cudamodel_malloc(m, MEM_GRADIENTS, plan->device_bytes[MEM_GRADIENTS]);
        cudaCheck(cudaMemset(m->grads_memory, 0, plan->device_bytes[MEM_GRADIENTS]));
        if (m->grad_slots) {
            m->shard_grads = cudamodel_malloc(m, MEM_GRAD_SHARD, plan->device_bytes[MEM_GRAD_SHARD]);
            cudaCheck(cudaMemset(m->shard_grads, 0, plan->device_bytes[MEM_GRAD_SHARD]));
            for (int i = 0; i < 2; i++) cudaCheck(cudaEventCreateWithFlags(&m->slot_free[i], cudaEventDisableTiming));
        }
        if (!m->offload) {
            m->m = (float *)cudamodel_malloc(m, MEM_ADAM_M, plan->device_bytes[MEM_ADAM_M]);
            m->v = (float *)cudamodel_malloc(m, MEM_ADAM_V, plan->device_bytes[MEM_ADAM_V]);
        }
        if (m->use_master) m->master = (float *)cudamodel_malloc(m, MEM_MASTER, plan->device_bytes[MEM_MASTER]);
        m->d_buckets = (int *)cudamodel_malloc(m, MEM_OP_SCRATCH, encoder_buckets_capacity((int)N) * sizeof(int));
        m->h_buckets = (int *)cudamodel_pinned(encoder_buckets_capacity((int)N) * sizeof(int));
        m->h_bucket_work = (int *)mem_calloc(MEM_STAGING, N, sizeof(int), "encoder bucket work");
    }
#if USE_CUDNN
    /* cuDNN's attention graphs and workspace now, not in the first step (and counted in the table);
     * the workspace from the device allocator (class cudnn_workspace) */
    if (m->precision != PRECISION_FP32 && ca->has_attention) cudnn_att_set_allocator(cudamodel_cudnn_alloc, cudamodel_cudnn_release, m->ctx->alloc);
    if (m->precision != PRECISION_FP32 && ca->has_attention)
        cudnn_att_prepare(B, T_, cfg->channels, cfg->num_heads, cfg->num_kv_heads, m->precision == PRECISION_FP16);
#endif
    if (ca->allocated) ca->allocated(m, training);
    cudamodel_sync_from_host(m); /* parameters (and zero moments) onto the device */
}

/* ---- host views ---------------------------------------------------------------------------- */
/* Device -> host_params, host_m, host_v (the parameters from the master copy when there is one).
 * With master weights the device parameters are also re-derived from the master by rounding
 * to nearest - what cudamodel_sync_from_host does after a load - so a run that continues and a
 * run resumed from this checkpoint hold the same bits (a stochastic rounding cannot be
 * reproduced from the fp32 file). */
inline void cudamodel_sync_to_host(CudaModel *m) {
    const size_t n = m->num_parameters, lo = m->shard_lo, ns = m->shard_hi - m->shard_lo;
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    if (m->offload) return; /* host_params is the master copy; the loop's optimizer has m and v */
    if (m->master) { /* (sharded: only the shard's host_params and parameters) */
        cudaCheck(cudaMemcpy(m->host_params + lo, m->master, ns * sizeof(float), cudaMemcpyDeviceToHost));
        with_storage_type(m->precision, [&](auto tag) {
            typedef decltype(tag) T;
            if (ns) cast_copy(cudamodel_param_at<T>(m, lo), m->master, ns, m->ctx->stream);
        });
        cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    } else {
        with_storage_type(m->precision, [&](auto tag) {
            typedef decltype(tag) T;
            T *stage = (T *)m->h_staging;
            const size_t a = m->param_slots ? lo : 0, k = m->param_slots ? ns : n; /* -z 3: the shard only */
            cudaCheck(cudaMemcpy(stage, cudamodel_param_at<T>(m, a), k * sizeof(T), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < k; i++) m->host_params[a + i] = to_float(stage[i]);
        });
    }
    if (m->m && m->optim_state != OPTSTATE_FP32) { /* compact: decoded on the host (optstate.c) */
        const size_t bytes = optstate_bytes(ns ? ns : 1, m->optim_state);
        llmcCheck(bytes <= n * precision_bytes(m->precision), "the host staging buffer holds a compact moment");
        cudaCheck(cudaMemcpy(m->h_staging, m->m, bytes, cudaMemcpyDeviceToHost));
        optstate_decode(m->h_staging, m->optim_state, 0, ns, m->host_m + lo);
        cudaCheck(cudaMemcpy(m->h_staging, m->v, bytes, cudaMemcpyDeviceToHost));
        optstate_decode(m->h_staging, m->optim_state, 1, ns, m->host_v + lo);
    } else if (m->m) {
        cudaCheck(cudaMemcpy(m->host_m + lo, m->m, ns * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(m->host_v + lo, m->v, ns * sizeof(float), cudaMemcpyDeviceToHost));
    }
}

/* host_params, host_m, host_v -> device (parameters rounded to nearest in T). */
inline void cudamodel_sync_from_host(CudaModel *m) {
    const size_t n = m->num_parameters;
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        T *stage = (T *)m->h_staging;
        for (size_t i = 0; i < n; i++) stage[i] = from_float<T>(m->host_params[i]);
        if (!m->param_slots) {
            cudaCheck(cudaMemcpy(m->params_memory, stage, n * sizeof(T), cudaMemcpyHostToDevice));
            return;
        }
        /* -z 3: the shard, and the outer bucket packed into the gather buffer; no layer gathered */
        if (m->shard_hi > m->shard_lo)
            cudaCheck(cudaMemcpy(m->params_memory, stage + m->shard_lo, (m->shard_hi - m->shard_lo) * sizeof(T), cudaMemcpyHostToDevice));
        Bucket b;
        bucket_of_layer(&b, m->param_specs, m->num_param_specs, -1);
        size_t k = 0;
        for (int i = 0; i < b.n; k += b.len[i], i++)
            cudaCheck(cudaMemcpy((T *)m->gather_memory + k, stage + b.off[i], b.len[i] * sizeof(T), cudaMemcpyHostToDevice));
        m->slot_layer[0] = m->slot_layer[1] = -1;
    });
    const size_t lo = m->shard_lo, ns = m->shard_hi - m->shard_lo;
    if (m->master) cudaCheck(cudaMemcpy(m->master, m->host_params + lo, ns * sizeof(float), cudaMemcpyHostToDevice));
    if (m->m && m->optim_state != OPTSTATE_FP32) { /* compact: encoded on the host (optstate.c) */
        const size_t bytes = optstate_bytes(ns ? ns : 1, m->optim_state);
        llmcCheck(bytes <= n * precision_bytes(m->precision), "the host staging buffer holds a compact moment");
        optstate_encode(m->h_staging, m->optim_state, 0, ns, m->host_m + lo);
        cudaCheck(cudaMemcpy(m->m, m->h_staging, bytes, cudaMemcpyHostToDevice));
        optstate_encode(m->h_staging, m->optim_state, 1, ns, m->host_v + lo);
        cudaCheck(cudaMemcpy(m->v, m->h_staging, bytes, cudaMemcpyHostToDevice));
    } else if (m->m) {
        cudaCheck(cudaMemcpy(m->m, m->host_m + lo, ns * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(m->v, m->host_v + lo, ns * sizeof(float), cudaMemcpyHostToDevice));
    }
}

/* ---- forward ------------------------------------------------------------------------------- */
/* The forward from the staged tokens (cudamodel_stage) in d_inputs/d_targets, without waiting:
 * with targets the mean loss lands in d_loss (and, training: dloss != 0, is added to d_loss_acc).
 * Only launches and device-to-device work, so a CUDA graph can capture it (graph.cuh). */
template <class T> void cudamodel_forward_t(CudaModel *m, int has_targets, int B, int T_, float dloss) {
    NVTX_RANGE("forward");
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, V = cfg->vocab_size, Vp = cfg->padded_vocab_size, N = B * T_;
    ActivationTensors *a = &m->acts;
    cudaStream_t s = m->ctx->stream;
    m->arch->trunk_forward[m->precision](m, B, T_); /* the architecture's, up to lnf */
    if (!has_targets) return;
    const int write = dloss != 0.0f, R = m->head_rows;
    const T *head = cudamodel_param<T>(m, m->head_index, 0); /* wte or the Llama's untied head */
    for (int r0 = 0; r0 < N; r0 += R) { /* the LM head, the loss and (training) the head's backward, by chunks */
        NVTX_RANGE("LM head chunk");
        const int rows = R < N - r0 ? R : N - r0;
        const T *x = (const T *)a->lnf + (size_t)r0 * C;
        matmul_forward((T *)a->logits, x, head, (const T *)NULL, rows, C, Vp, m->ctx);
        fused_classifier((T *)a->logits, (float *)a->losses + r0, m->d_targets + r0, dloss, rows, V, Vp, write, s);
        if (write) /* logits = lnf @ wte^T: dlnf (these rows of dbuf_c) and wte's gradient, from the dlogits */
            matmul_backward((T *)m->dbuf_c + (size_t)r0 * C, cudamodel_grad<T>(m, m->head_index, 0), (T *)NULL,
                            (const T *)a->logits, x, head, rows, C, Vp, m->fscratch, m->ctx);
    }
    loss_mean(m->d_loss, write ? m->d_loss_acc : (double *)NULL, (const float *)a->losses, N, s);
}

/* The micro-batch's tokens to the device without waiting for them: checked, copied into the pinned
 * buffers (once the previous copies from them are done), then cudaMemcpyAsync'd into d_inputs,
 * d_targets; training (a forward with dloss != 0 follows): also the encoder's gradient buckets,
 * built on the host from the inputs, into d_buckets. */
inline void cudamodel_stage(CudaModel *m, const int *inputs, const int *targets, int B, int T_, int training) {
    const ModelConfig *cfg = &m->cfg;
    if (!m->acts_memory) llmc_die("cudamodel_forward: call cudamodel_allocate first");
    if (B < 1 || T_ < 1 || T_ > m->T || (size_t)B * T_ > (size_t)m->B * m->T)
        llmc_die("cudamodel_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T_, m->B, m->T);
    const int N = B * T_;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= cfg->vocab_size || (targets && (targets[i] < 0 || targets[i] >= cfg->vocab_size)))
            llmc_die("token id %d at position %d is outside the vocabulary [0, %d)",
                     inputs[i] < 0 || inputs[i] >= cfg->vocab_size ? inputs[i] : targets[i], i, cfg->vocab_size);
    if (training && !m->grads_memory) llmc_die("cudamodel_forward: a training forward needs the training buffers");
    cudaStream_t s = m->ctx->stream;
    if (m->staged_once) cudaCheck(cudaEventSynchronize(m->staged)); /* the last copies out of the pinned buffers */
    memcpy(m->h_inputs, inputs, (size_t)N * sizeof(int));
    cudaCheck(cudaMemcpyAsync(m->d_inputs, m->h_inputs, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (targets) {
        memcpy(m->h_targets, targets, (size_t)N * sizeof(int));
        cudaCheck(cudaMemcpyAsync(m->d_targets, m->h_targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    }
    m->bucket_tokens = 0;
    if (training) {
        m->bucket_tokens = encoder_buckets_build(m->h_buckets, m->h_bucket_work, inputs, N, cfg->vocab_size);
        cudaCheck(cudaMemcpyAsync(m->d_buckets, m->h_buckets, (2 * (size_t)m->bucket_tokens + 1 + N) * sizeof(int),
                                  cudaMemcpyHostToDevice, s));
    }
    cudaCheck(cudaEventRecord(m->staged, s));
    m->staged_once = 1;
}

inline void cudamodel_forward_device(CudaModel *m, int has_targets, int B, int T_, float dloss) {
    if (dloss != 0.0f && !m->grads_memory) llmc_die("cudamodel_forward: a training forward needs the training buffers");
    with_storage_type(m->precision, [&](auto tag) { cudamodel_forward_t<decltype(tag)>(m, has_targets, B, T_, dloss); });
}

/* The mean loss of the last forward (waits for it). */
inline float cudamodel_read_loss(CudaModel *m) {
    float *h = (float *)((double *)m->h_readback + 1);
    cudaCheck(cudaMemcpyAsync(h, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, m->ctx->stream));
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    return *h;
}

/* The sum of the training forwards' mean losses since cudamodel_zero_grad (waits for them). */
inline double cudamodel_read_step_loss(CudaModel *m) {
    double *h = (double *)m->h_readback;
    cudaCheck(cudaMemcpyAsync(h, m->d_loss_acc, sizeof(double), cudaMemcpyDeviceToHost, m->ctx->stream));
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    return *h;
}

/* Returns the mean loss over B*T positions when targets != NULL (else 0; logits are left in
 * the logits buffer). dloss: the weight of each position's loss in the gradient (0: eval).
 * Waits for the loss; a training loop that need not uses cudamodel_stage, cudamodel_forward_device
 * and, once per step, cudamodel_read_step_loss. */
inline float cudamodel_forward(CudaModel *m, const int *inputs, const int *targets, int B, int T_, float dloss) {
    cudamodel_stage(m, inputs, targets, B, T_, targets && dloss != 0.0f);
    cudamodel_forward_device(m, targets != NULL, B, T_, dloss);
    if (!targets) {
        cudaCheck(cudaStreamSynchronize(m->ctx->stream));
        return m->mean_loss = 0.0f;
    }
    return m->mean_loss = cudamodel_read_loss(m);
}

/* Each position's loss (N floats into host memory) of the last forward with targets (waits for it). */
inline void cudamodel_read_losses(CudaModel *m, float *losses, int N) {
    cudaCheck(cudaMemcpyAsync(losses, m->acts.losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, m->ctx->stream));
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
}

/* ---- backward ------------------------------------------------------------------------------ */
/* dst += src, elementwise, in fp32 arithmetic. */
template <class T> static __global__ void accumulate_kernel(T *dst, const T *src, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

/* -z 2 (grad_slots): this rank's part of a packed gradient bucket b (run: its first element, the
 * part already reduced over the ranks; bucket.h's bucket_part says where it is) added into
 * shard_grads, slice by slice, on stream st. */
inline void cudamodel_shard_accumulate(CudaModel *m, const Bucket *b, const void *run, cudaStream_t st) {
    size_t k = 0;
    for (int i = 0; i < b->n; i++) {
        size_t a, n = bucket_slice_in(b, i, m->shard_lo, m->shard_hi, &a);
        if (!n) continue;
        with_storage_type(m->precision, [&](auto tag) {
            typedef decltype(tag) T;
            accumulate_kernel<<<ceil_div((long long)n, 256), 256, 0, st>>>(cudamodel_grad_at<T>(m, a), (const T *)run + k, n);
        });
        kernelCheck();
        k += n;
    }
}

/* The embedding's backward (GPT-2's: encoded = wte[inputs] + wpe), the architecture's, from the
 * staged buckets (its grid is the batch's number of distinct tokens, so it stays outside a CUDA
 * graph); then the outer bucket is ready. */
inline void cudamodel_backward_encoder(CudaModel *m, int B, int T_) {
    if (!m->bucket_tokens) llmc_die("cudamodel_backward: no training forward (dloss != 0) staged its batch");
    EncoderBuckets eb;
    eb.num_tokens = m->bucket_tokens;
    eb.d_ints = m->d_buckets;
    m->arch->embedding_backward[m->precision](m, &eb, B, T_);
    cudamodel_bucket_ready(m, -1);
    m->bucket_tokens = 0;
    m->in_backward = 0;
}

inline void cudamodel_backward_layers(CudaModel *m, int B, int T_) {
    if (!m->grads_memory) llmc_die("cudamodel_backward: the model was allocated without training buffers");
    m->arch->backward_layers[m->precision](m, B, T_);
}

/* After the training forward of the same batch (whose staging built the encoder's buckets from
 * these inputs); does not wait for the device. */
inline void cudamodel_backward(CudaModel *m, const int *inputs, int B, int T_) {
    (void)inputs;
    cudamodel_backward_layers(m, B, T_);
    cudamodel_backward_encoder(m, B, T_);
}

inline void cudamodel_zero_grad(CudaModel *m) {
    if (m->grads_memory)
        cudaCheck(cudaMemsetAsync(m->grads_memory, 0, m->plan.device_bytes[MEM_GRADIENTS], m->ctx->stream));
    if (m->shard_grads)
        cudaCheck(cudaMemsetAsync(m->shard_grads, 0, m->plan.device_bytes[MEM_GRAD_SHARD], m->ctx->stream));
    if (m->d_loss_acc) cudaCheck(cudaMemsetAsync(m->d_loss_acc, 0, sizeof(double), m->ctx->stream));
}

/* The sum of squares of the gradients [lo, hi) into d_norm (fp32, device; 0 for an empty range),
 * on the compute stream: a ZeRO-2 rank's part of the norm (the ranks then sum d_norm). */
inline void cudamodel_grad_norm_squared(CudaModel *m, size_t lo, size_t hi) {
    if (hi <= lo) {
        cudaCheck(cudaMemsetAsync(m->d_norm, 0, sizeof(float), m->ctx->stream));
        return;
    }
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        global_norm_squared(m->d_norm, (const T *)cudamodel_grad_at<T>(m, lo), hi - lo, m->fscratch, m->ctx->stream);
    });
}

/* The norm from the sum of squares in d_norm (cudamodel_grad_norm_squared's, maybe summed over
 * the ranks since), unscaled; fp16: the overflow check. */
inline float cudamodel_grad_norm_finish(CudaModel *m) {
    float *sq = (float *)((double *)m->h_readback + 1); /* pinned: the copy need not stage */
    cudaCheck(cudaMemcpyAsync(sq, m->d_norm, sizeof(float), cudaMemcpyDeviceToHost, m->ctx->stream));
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    float norm = sqrtf(*sq) / m->loss_scale;
    if (m->precision == PRECISION_FP16 && !isfinite(norm)) {
        m->loss_scale = m->loss_scale > 1.0f ? m->loss_scale * 0.5f : 1.0f;
        m->clean_steps = 0;
        m->skipped_steps++;
    }
    return norm;
}

/* The global L2 norm of the (unscaled) gradients; fp16: also the overflow check (see top). */
inline float cudamodel_grad_norm(CudaModel *m) {
    NVTX_RANGE("gradient norm");
    cudamodel_grad_norm_squared(m, 0, m->num_parameters);
    return cudamodel_grad_norm_finish(m);
}

/* --offload optimizer: the device gradients [off, off + len) queued for copying on stream st, to
 * host_grads (fp32) or, in bf16/fp16, to the same place of the staging buffer
 * (cudamodel_grads_from_staging converts them once every copy has completed). */
inline void cudamodel_grads_copy_to_host(CudaModel *m, size_t off, size_t len, cudaStream_t st) {
    const size_t elem = precision_bytes(m->precision);
    void *dst = m->precision == PRECISION_FP32 ? (void *)(m->host_grads + off) : (void *)((char *)m->h_staging + off * elem);
    cudaCheck(cudaMemcpyAsync(dst, (const char *)m->grads_memory + off * elem, len * elem, cudaMemcpyDeviceToHost, st));
}

/* The staged bf16/fp16 gradients into host_grads (fp32); nothing in fp32 (copied there directly). */
inline void cudamodel_grads_from_staging(CudaModel *m) {
    const size_t n = m->num_parameters;
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        if (sizeof(T) == sizeof(float)) return;
        const T *stage = (const T *)m->h_staging;
        if (m->precision == PRECISION_BF16) optstate_from_bf16(m->host_grads, (const uint16_t *)stage, n); /* OpenMP */
        else
            for (size_t i = 0; i < n; i++) m->host_grads[i] = to_float(stage[i]);
    });
}

/* The bucket's staged bf16/fp16 gradients into host_grads (fp32); nothing in fp32. Host code only
 * (no CUDA call): it runs in a host function on the copy stream once the bucket's copies landed. */
inline void cudamodel_grads_bucket_from_staging(CudaModel *m, const Bucket *b) {
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        if (sizeof(T) == sizeof(float)) return;
        const T *stage = (const T *)m->h_staging;
        for (int i = 0; i < b->n; i++) {
            const size_t off = b->off[i], len = b->len[i];
            if (m->precision == PRECISION_BF16) optstate_from_bf16(m->host_grads + off, (const uint16_t *)stage + off, len);
            else
                for (size_t j = off; j < off + len; j++) m->host_grads[j] = to_float(stage[j]);
        }
    });
}

/* --offload optimizer, after the host update of one bucket: its host_params (fp32 master) put in
 * the pinned staging buffer (bf16: rounded to nearest, as cudamodel_params_from_host) and queued
 * for the device on stream st; the host goes on at once. fp32 or bf16 (offload's precisions). */
inline void cudamodel_params_bucket_to_device(CudaModel *m, const Bucket *b, cudaStream_t st) {
    const size_t elem = precision_bytes(m->precision);
    if (m->precision == PRECISION_FP16) llmc_die("internal: --offload optimizer's parameter copies in fp16");
    for (int i = 0; i < b->n; i++) {
        const size_t off = b->off[i], len = b->len[i];
        char *stage = (char *)m->h_staging + off * elem;
        if (m->precision == PRECISION_BF16) optstate_to_bf16((uint16_t *)stage, m->host_params + off, len);
        else memcpy(stage, m->host_params + off, len * sizeof(float));
        cudaCheck(cudaMemcpyAsync((char *)m->params_memory + off * elem, stage, len * elem, cudaMemcpyHostToDevice, st));
    }
}

/* --offload optimizer: the accumulated device gradients (T) into host_grads (fp32, pinned). */
inline void cudamodel_grads_to_host(CudaModel *m) {
    cudamodel_grads_copy_to_host(m, 0, m->num_parameters, m->ctx->stream);
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    cudamodel_grads_from_staging(m);
}

/* --offload optimizer, after the host update: host_params (fp32 master) -> the device parameters
 * (bf16: rounded to nearest on the host with OpenMP, the same bits as cudamodel_sync_from_host). */
inline void cudamodel_params_from_host(CudaModel *m) {
    const size_t n = m->num_parameters;
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
    if (m->precision == PRECISION_FP32) {
        cudaCheck(cudaMemcpy(m->params_memory, m->host_params, n * sizeof(float), cudaMemcpyHostToDevice));
    } else if (m->precision == PRECISION_BF16) {
        optstate_to_bf16((uint16_t *)m->h_staging, m->host_params, n);
        cudaCheck(cudaMemcpy(m->params_memory, m->h_staging, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    } else {
        cudamodel_sync_from_host(m);
    }
}

/* AdamW step t >= 1 on grads * grad_scale (the clip factor), decay as the table says; only the
 * parameters of the shard [shard_lo, shard_hi). */
inline void cudamodel_update(CudaModel *m, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                            int t) {
    NVTX_RANGE("optimizer");
    const float scale = grad_scale / m->loss_scale;
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        if (m->optim_state != OPTSTATE_FP32) { /* compact m, v: the whole shard in one launch */
            const size_t lo = m->shard_lo, ns = m->shard_hi - m->shard_lo;
            if (!ns) return;
            OptSegments seg;
            optstate_segments(&seg, m->param_specs, NUM_PARAMETER_TENSORS, lo, m->shard_hi, weight_decay);
            adamw_update_compact(cudamodel_param_at<T>(m, lo), m->master, (const T *)cudamodel_grad_at<T>(m, lo), m->m, m->v,
                                 m->optim_state, ns, &seg, lr, beta1, beta2, eps, t, scale,
                                 splitmix64(m->seed ^ ((uint64_t)t << 8)), m->ctx->stream, lo);
            return;
        }
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            const TensorSpec *s = &m->param_specs[i];
            size_t a = s->offset > m->shard_lo ? s->offset : m->shard_lo;
            size_t b = s->offset + s->numel < m->shard_hi ? s->offset + s->numel : m->shard_hi;
            if (a >= b) continue;
            const size_t k = a - m->shard_lo; /* into the shard's m, v, master */
            uint64_t seed = splitmix64(m->seed ^ ((uint64_t)t << 8) ^ (uint64_t)i);
            adamw_update(cudamodel_param_at<T>(m, a), m->master ? m->master + k : (float *)NULL,
                         (const T *)cudamodel_grad_at<T>(m, a), m->m + k, m->v + k, b - a, lr, beta1, beta2, eps,
                         s->decay ? weight_decay : 0.0f, t, scale, seed, m->ctx->stream, a - s->offset);
        }
    });
    if (m->precision == PRECISION_FP16 && ++m->clean_steps >= m->loss_scale_window) {
        m->loss_scale *= 2.0f;
        m->clean_steps = 0;
    }
}

/* Logits of positions row0 .. row0 + rows - 1 (rows <= head_rows) of the last forward, into the
 * logits buffer (rows, Vp). */
inline void cudamodel_logits_rows(CudaModel *m, int row0, int rows) {
    const int C = m->cfg.channels, Vp = m->cfg.padded_vocab_size;
    if (rows < 1 || rows > m->head_rows || row0 < 0 || (size_t)row0 + rows > (size_t)m->B * m->T)
        llmc_die("cudamodel_logits_rows: rows %d..%d do not fit the allocated batch or head chunk (%d)", row0, row0 + rows - 1,
                 m->head_rows);
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        matmul_forward((T *)m->acts.logits, (const T *)m->acts.lnf + (size_t)row0 * C,
                       (const T *)cudamodel_param<T>(m, m->head_index, 0), (const T *)NULL, rows, C, Vp, m->ctx);
    });
}

/* The logits (V floats, host) after tokens[0..n-1], for sampling. */
inline const float *cudamodel_next_logits(CudaModel *m, const int *tokens, int n) {
    cudamodel_forward(m, tokens, NULL, 1, n, 0.0f);
    cudamodel_logits_rows(m, n - 1, 1);
    const int Vp = m->cfg.padded_vocab_size;
    with_storage_type(m->precision, [&](auto tag) {
        typedef decltype(tag) T;
        T *stage = (T *)m->h_staging;
        cudaCheck(cudaMemcpy(stage, (T *)m->acts.logits, (size_t)Vp * sizeof(T), cudaMemcpyDeviceToHost));
        for (int i = 0; i < Vp; i++) m->host_logits[i] = to_float(stage[i]);
    });
    return m->host_logits;
}

inline void cudamodel_free(CudaModel *m) {
    void *dev[] = {m->params_memory, m->gather_memory, m->grads_memory, m->shard_grads, m->master, m->m, m->v, m->acts_memory, m->scratch_memory,
                   m->fscratch, m->d_norm, m->d_loss, m->d_loss_acc, m->d_inputs, m->d_targets, m->d_buckets};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) devalloc_free(m->ctx->alloc, dev[i]);
    if (m->offload) cudaCheck(cudaFreeHost(m->h_staging)); /* pinned (cudamodel_set_offload) */
    if (m->offload) m->h_staging = NULL;
    void *host[] = {m->h_bucket_work, m->h_staging, m->host_params, m->host_m, m->host_v, m->host_logits};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    void *pinned[] = {m->h_buckets, m->h_inputs, m->h_readback};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) cudaCheck(cudaFreeHost(pinned[i]));
    if (m->staged) cudaCheck(cudaEventDestroy(m->staged));
    for (int i = 0; i < 2; i++)
        if (m->slot_free[i]) cudaCheck(cudaEventDestroy(m->slot_free[i]));
    if (m->host_grads) cudaCheck(cudaFreeHost(m->host_grads));
    /* the accounting: what cudamodel_allocate allocated is its plan (with cudamodel_build's part);
     * a model built but never allocated holds only the parameters and the host copies */
    const size_t n = m->num_parameters, elem = precision_bytes(m->precision);
    if (m->acts_memory) {
        for (int c = 0; c < MEM_NUM_CLASSES; c++)
            if (c != MEM_WORKSPACE) mem_account((MemClass)c, -(long long)m->plan.device_bytes[c], 1); /* the context's */
        mem_account(MEM_STAGING, -(long long)m->plan.host[MEM_STAGING], 0);
        mem_account(MEM_MASTER, -(long long)m->plan.host[MEM_MASTER], 0);    /* --offload optimizer */
        mem_account(MEM_GRADIENTS, -(long long)m->plan.host[MEM_GRADIENTS], 0);
    } else if (m->params_memory) {
        mem_account(MEM_PARAMETERS, -(long long)(n * elem), 1);
        mem_account(MEM_STAGING, -(long long)cudamodel_build_host_bytes(n, m->cfg.padded_vocab_size, elem), 0);
    }
    memset(m, 0, sizeof *m);
}

/* The startup memory table: what we allocated by purpose, then what the device reports. */
inline void cudamodel_print_memory(const CudaModel *m, FILE *out) {
    const double MiB = 1048576.0;
    const size_t n = m->num_parameters, elem = precision_bytes(m->precision);
    double kinds[ACT_NUM_KINDS] = {0}, lse = 0.0;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS && m->act_specs[i].name; i++) {
        if (i == m->arch->lse_act) lse += m->act_bytes[i];
        else kinds[m->act_specs[i].kind] += m->act_bytes[i];
    }
    int training = m->grads_memory != NULL;
    double total = 0.0;
    const int HS = m->cfg.channels / m->cfg.num_heads;
    if (m->arch->has_attention)
        fprintf(out, "attention: %s\n", m->precision == PRECISION_FP32 ? attention_impl_name<float>(HS)
                                                                       : attention_impl_name<__nv_bfloat16>(HS));
    fprintf(out, "+-------------------------------------+------------+\n");
    fprintf(out, "| memory (GPU, %-4s, -r %d)             |        MiB |\n", precision_name(m->precision), m->recompute);
    fprintf(out, "+-------------------------------------+------------+\n");
#define LLMC_ROW(label, bytes)                                                  \
    do {                                                                        \
        fprintf(out, "| %-35s | %10.1f |\n", label, (double)(bytes) / MiB);     \
        total += (double)(bytes);                                               \
    } while (0)
    char label[64];
    snprintf(label, sizeof label, "parameters (%zu, %s%s)", n, precision_name(m->precision), m->param_slots ? ", shard" : "");
    LLMC_ROW(label, m->param_slots ? m->plan.device_bytes[MEM_PARAMETERS] : n * elem);
    if (m->param_slots) LLMC_ROW("params gathered (outer + 2 layers)", m->plan.device_bytes[MEM_PARAM_GATHER]);
    if (training) {
        const size_t ns = m->shard_hi - m->shard_lo; /* this rank's (ZeRO-1) */
        const char *part = ns < n ? ", shard" : "";
        snprintf(label, sizeof label, "master weights (fp32%s)", part);
        if (m->master) LLMC_ROW(label, ns * sizeof(float));
        if (m->offload) {
            LLMC_ROW("AdamW m, v, master: host (offload)", 0);
        } else {
            const size_t mb = optstate_bytes(ns ? ns : 1, m->optim_state);
            snprintf(label, sizeof label, "AdamW m (%s%s)", optstate_name(m->optim_state), part);
            LLMC_ROW(label, mb);
            snprintf(label, sizeof label, "AdamW v (%s%s)", optstate_name(m->optim_state), part);
            LLMC_ROW(label, mb);
        }
        if (m->grad_slots) { /* -z 2 */
            LLMC_ROW("gradients (outer + 2 layer slots)", m->plan.device_bytes[MEM_GRADIENTS]);
            LLMC_ROW("gradients (reduced, shard)", m->plan.device_bytes[MEM_GRAD_SHARD]);
        } else {
            LLMC_ROW("gradients", n * elem);
        }
    }
    for (int k = 0; k < ACT_NUM_KINDS; k++) {
        snprintf(label, sizeof label, "activations: %s", activation_kind_names[k]);
        LLMC_ROW(label, kinds[k]);
    }
    if (m->arch->lse_act >= 0) LLMC_ROW("activations: attention logsumexp", lse);
    if (training) LLMC_ROW("backward scratch (one layer)", m->scratch_bytes);
    LLMC_ROW("fp32 op scratch", m->fscratch_floats * sizeof(float));
    LLMC_ROW("cuBLASLt workspace", m->ctx->lt_workspace_bytes);
#if USE_CUDNN
    if (m->precision != PRECISION_FP32 && m->arch->has_attention) LLMC_ROW("cuDNN attention workspace", cudnn_att_workspace_bytes());
    if (m->precision != PRECISION_FP32 && m->arch->has_attention && cudnn_att_workspace_bytes() > cudamodel_cudnn_workspace_bound(&m->cfg, m->B, m->T))
        fprintf(out, "warning: cuDNN's attention workspace exceeds the plan's bound of %zu bytes\n",
                cudamodel_cudnn_workspace_bound(&m->cfg, m->B, m->T));
#endif
#undef LLMC_ROW
    fprintf(out, "| total allocated by llmc             | %10.1f |\n", total / MiB);
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    fprintf(out, "| device in use (cudaMemGetInfo)      | %10.1f |\n", (double)(total_b - free_b) / MiB);
    fprintf(out, "| device total                        | %10.1f |\n", (double)total_b / MiB);
    fprintf(out, "+-------------------------------------+------------+\n");
}

#endif
