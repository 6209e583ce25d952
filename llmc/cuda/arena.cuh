/*
 * arena.cuh - the CUDA model's struct (CudaModel, both architectures) and the views into its
 * arenas: where a parameter, a gradient or a packed bucket of either is, whatever the ZeRO level
 * (-z 2's gradient slots, -z 3's gathered parameter slots), the LM head's chunk size, and the
 * per-layer hooks the block sequences call (parameters needed, backward layer begun, bucket ready).
 * The block sequences (gpt2.cuh, llama.cuh) and the shared runtime (cudamodel.cuh) read the model
 * through these views only; nothing here launches a kernel except the gradient slot's clear.
 */
#ifndef LLMC_CUDA_ARENA_CUH
#define LLMC_CUDA_ARENA_CUH

#include <stddef.h>
#include <stdint.h>

#include "llmc/models/gpt2.h"
#include "llmc/models/llama.h"
#include "llmc/train/plan.h"
#include "llmc/cuda/common.cuh"

enum { LLMC_ARCH_GPT2 = 0, LLMC_ARCH_LLAMA3 = 1 };

typedef struct {
    ModelConfig cfg;
    int arch;          /* LLMC_ARCH_GPT2 | LLMC_ARCH_LLAMA3 */
    LlamaConfig llama; /* the Llama's knobs beyond cfg (arch LLMC_ARCH_LLAMA3) */
    Precision precision;
    CudaContext *ctx;
    int recompute;    /* 0..3 */
    int head_rows;    /* positions per LM-head chunk (the logits buffer's rows) */
    int head_rows_request; /* set before cudamodel_allocate: > 0 fixes head_rows (tests); 0 = automatic */
    int gelu_fusion;  /* 0..2 */
    int use_master;   /* fp32 master weights (bf16/fp16 only) */
    uint64_t seed;    /* stochastic rounding */
    TensorSpec param_specs[NUM_PARAMETER_TENSORS]; /* the architecture's table (num_param_specs entries) */
    int num_param_specs;
    size_t head_offset; /* the LM head's weight in the arena: wte (GPT-2, tied Llama) or lm_head */
    size_t num_parameters;
    /* Device parameters and gradients in T, laid out by the table (contiguous, checkpoint
     * order). The ParameterTensors members are untyped slots: cast to T * before use. */
    void *params_memory, *grads_memory;
    ParameterTensors params; /* (gradients: cudamodel_grad, which knows -z 2's slots) */
    float *master, *m, *v; /* fp32, parameters [shard_lo, shard_hi) each; master NULL when not used */
    /* --optim-state (cudamodel_set_optim_state, before cudamodel_allocate): how m and v are stored
     * (OptStateType, llmc/core/optstate.h); compact states make m, v optstate_bytes(shard) bytes each. */
    int optim_state;
    /* --offload optimizer (cudamodel_set_offload, before cudamodel_allocate): no device m, v or
     * master; host_params is the fp32 master copy, the training loop's optimizer (llmc/train/optim.c)
     * updates it on the CPU from host_grads (pinned, fp32), filled by cudamodel_grads_to_host. */
    int offload;
    float *host_grads;
    /* ZeRO-1: the range of parameters whose optimizer state (m, v, master) this rank keeps and
     * updates (cudamodel_set_shard, before cudamodel_allocate); the whole [0, n) by default. The
     * caller gathers the updated parameters from the ranks after cudamodel_update and gathers the
     * host copies of m, v (and master) after cudamodel_sync_to_host, which fills only the shard. */
    size_t shard_lo, shard_hi;
    /* Gradient buckets (set by the trainer; NULL/0 by default: no hook, today's one reduction after
     * the backward). In the backward of a micro-step with grad_hook_armed (the optimizer step's
     * last), grad_hook(grad_hook_ctx, l) is called as soon as layer l's parameter gradients are
     * final - once layer l's backward is queued on the compute stream, before layer l - 1's is -
     * for l = L-1 .. 0, then grad_hook(ctx, -1) for the outer bucket (wte, wpe, lnfw, lnfb: wte's
     * gradient gets its last part from the encoder backward, the backward's last op). A bucket is
     * bucket_of_layer's (bucket.h): one layer's slice of each of the 12 stacked tensors. GPT-2's table
     * stacks each tensor over the layers, so a layer's gradients are 12 ranges of the arena, not
     * one. The hook runs on the host while the queued kernels run: it orders its own work after
     * them with an event. in_backward and backward_layer say where the backward's queueing is. */
    void (*grad_hook)(void *ctx, int bucket);
    void *grad_hook_ctx;
    int grad_hook_armed, in_backward, backward_layer;
    /* -z 2 without a full gradient buffer (cudamodel_set_grad_slots, before cudamodel_allocate; the
     * trainer's grad_hook is then required): grads_memory holds the outer bucket packed (outer_numel:
     * wte, wpe, lnfw, lnfb / the Llama's wte, lnfw, lm_head; accumulated over the step's micro-steps)
     * then two layer slots (layer_numel each: layer l's gradients packed in slot l & 1). Every
     * micro-step's backward clears layer l's slot (after slot_free[l & 1], which the hook records
     * once it has reduced the slot's previous layer) and calls grad_hook(ctx, l) when the layer is
     * done, on every micro-step, not only the armed one; the hook reduces the slot into this rank's
     * shard_grads (shard_hi - shard_lo elements, accumulated over the micro-steps:
     * cudamodel_shard_accumulate), which the norm and the update read (cudamodel_grad_at).
     * bucket_pos[i]: tensor i's place in its packed bucket. */
    int grad_slots;
    size_t outer_numel, layer_numel, bucket_pos[NUM_PARAMETER_TENSORS];
    void *shard_grads;
    cudaEvent_t slot_free[2];
    /* The per-layer "parameters needed" hook (NULL by default): params_hook(params_hook_ctx, l,
     * backward) is called on the host before the kernels of layer l's forward (backward 0: every
     * forward, training, eval or sampling; recompute included in the backward's call) or of its
     * backward (backward 1) are queued. A feature that keeps a layer's parameters elsewhere (a
     * ZeRO-3 gather into a slot, a host offload, a prefetch) makes them ready there, ordering its
     * copies before the compute stream's next work. gpt2cuda_layer_weights and the Llama's views
     * read the parameters through cudamodel_param, the one place that says where they are. Host
     * code: a CUDA graph capture (graph.cuh) runs it once, at capture. */
    void (*params_hook)(void *ctx, int layer, int backward);
    void *params_hook_ctx;
    int head_index; /* the LM head's parameter tensor: wte (GPT-2, tied Llama) or lm_head */
    /* -z 3 (cudamodel_set_param_slots, with grad_slots, before cudamodel_allocate; the trainer's
     * params_hook is then required): params_memory holds only this rank's shard [shard_lo,
     * shard_hi) (cudamodel_param_at); gather_memory the outer bucket's parameters, whole and packed
     * (gathered after every update), then two layer slots: layer l's parameters, gathered by the
     * hook into slot l & 1 (slot_layer says which layer a slot holds, -1 none or stale). */
    int param_slots;
    void *gather_memory;
    int slot_layer[2];
    /* Activations for the allocated (B, T): act_specs from the shared table with the CUDA
     * changes above; bytes per tensor in act_bytes. ActivationTensors members are untyped
     * slots too (T, or float for the ACT_STATS kind and `att`, the logsumexp). */
    int B, T;
    TensorSpec act_specs[NUM_ACTIVATION_TENSORS]; /* a shorter table (Llama) ends at a NULL name */
    size_t act_bytes[NUM_ACTIVATION_TENSORS], acts_total_bytes;
    void *acts_memory;
    ActivationTensors acts;
    /* backward scratch in T, one layer's worth, reused by every layer (as on the CPU):
     * dresidual (N, C): gradient of the residual stream, from the top down;
     * dbuf_c (N, C): dlnf, then per layer dln2, datty, dln1 (each dead before the next);
     * dbuf_f1 (N, F): dfch_gelu, later reused as dqkv (N, 3C fits since F >= 3C);
     * dbuf_f2 (N, F): dfch (the last N * F elements of the scratch).
     * (Llama: dbuf_f1 (N, max(2F, QKV)) dfch then dqkv, dbuf_f2 (N, F) dfch_swiglu.) */
    void *scratch_memory, *dresidual, *dbuf_c, *dbuf_f1, *dbuf_f2;
    size_t scratch_bytes;
    /* fp32 scratch shared by the ops (never live across two ops): LayerNorm/bias partial sums,
     * the attention row dots, the norm partials. */
    float *fscratch, *d_norm;
    size_t fscratch_floats;
    int *d_inputs, *d_targets, *d_buckets;
    int *h_buckets, *h_bucket_work; /* h_buckets pinned */
    /* Host -> device without waiting (cudamodel_stage): the micro-batch's tokens (and, training,
     * the encoder's buckets) go through pinned buffers; `staged` is recorded after their copies
     * and waited for before the buffers are written again. bucket_tokens: the distinct tokens of
     * the staged training batch (0: none staged; cudamodel_backward_encoder consumes them). */
    int *h_inputs, *h_targets;
    cudaEvent_t staged;
    int staged_once, bucket_tokens;
    /* The loss without waiting: d_loss the last forward's mean loss, d_loss_acc (fp64) the sum of
     * the training forwards' mean losses since cudamodel_zero_grad; read back through the pinned
     * h_readback (a double, then a float for the gradient norm). */
    float *d_loss;
    double *d_loss_acc;
    void *h_readback;
    void *h_staging; /* host copy of T parameters / a logits row */
    /* host views for checkpoints (TrainBackend.state.host_params, m, v) and next_logits */
    float *host_params, *host_m, *host_v, *host_logits;
    float mean_loss;
    MemPlan plan; /* what cudamodel_allocate allocated (cudamodel_plan) */
    /* fp16 dynamic loss scaling (1 and unused in fp32/bf16) */
    float loss_scale;
    int loss_scale_window, clean_steps;
    long long skipped_steps;
} CudaModel;
static_assert((int)LLAMA3_NUM_PARAMETERS <= (int)NUM_PARAMETER_TENSORS &&
                  (int)LLAMA3_NUM_ACTIVATIONS < (int)NUM_ACTIVATION_TENSORS,
              "CudaModel's tables hold the Llama's");

/* ---- the activation arena's sizes ----------------------------------------------------------- */
/* The LM head's chunk: request > 0 (capped at N), else as many positions as fit in
 * LLMC_HEAD_CHUNK_BYTES of logits, a multiple of 128 when that many fit (so every chunk's lnf
 * rows keep the same alignment, hence the same matmul plan), and at least 1. */
enum { LLMC_HEAD_CHUNK_BYTES = 1 << 30 };
inline int cudamodel_head_rows(size_t N, int Vp, size_t elem, int request) {
    size_t rows = request > 0 ? (size_t)request : (size_t)LLMC_HEAD_CHUNK_BYTES / ((size_t)Vp * elem);
    if (request <= 0 && rows >= 128) rows -= rows % 128;
    if (rows < 1) rows = 1;
    return (int)(rows < N ? rows : N);
}

/* Is this activation fp32 whatever the precision? Statistics, and the attention slot, which holds the
 * logsumexp on the GPU (lse: the table's row is its architecture's att). */
inline int cudamodel_act_is_fp32(const TensorSpec *s, int lse) { return s->kind == ACT_STATS || lse; }

/* ---- where a layer's parameters and gradients are (both architectures' only source) -------- */
/* In a packed buffer (-z 2's gradients, -z 3's gathered parameters: the outer bucket, then two layer
 * slots), where bucket l starts (l < 0: the outer bucket; layer l in slot l & 1), and where tensor i's
 * layer-l part is (l ignored for a tensor kept once); in elements. */
inline size_t cudamodel_packed_bucket(const CudaModel *m, int l) {
    return l < 0 ? 0 : m->outer_numel + (size_t)(l & 1) * m->layer_numel;
}
inline size_t cudamodel_packed_pos(const CudaModel *m, int i, int l) {
    return cudamodel_packed_bucket(m, m->param_specs[i].layer_numel ? l : -1) + m->bucket_pos[i];
}
/* Parameter tensor i of layer l (l ignored for a tensor kept once), typed. */
template <class X> inline X *cudamodel_param(const CudaModel *m, int i, int l) {
    const TensorSpec *s = &m->param_specs[i];
    if (!m->param_slots) return (X *)m->params_memory + s->offset + (size_t)l * s->layer_numel;
    return (X *)m->gather_memory + cudamodel_packed_pos(m, i, l);
}
/* Flat parameter a in this rank's storage (in [shard_lo, shard_hi) at -z 3): the update's and the
 * host copies' view. */
template <class X> inline X *cudamodel_param_at(const CudaModel *m, size_t a) {
    return m->param_slots ? (X *)m->params_memory + (a - m->shard_lo) : (X *)m->params_memory + a;
}
/* Layer l's gathered parameters, packed (l < 0: the outer bucket); param_slots only. */
inline void *cudamodel_bucket_params(const CudaModel *m, int l) {
    return (char *)m->gather_memory + cudamodel_packed_bucket(m, l) * precision_bytes(m->precision);
}
/* Its gradient: in the arena, or (-z 2, grad_slots) in the outer bucket or layer l's slot. */
template <class X> inline X *cudamodel_grad(const CudaModel *m, int i, int l) {
    const TensorSpec *s = &m->param_specs[i];
    if (!m->grad_slots) return (X *)m->grads_memory + s->offset + (size_t)l * s->layer_numel;
    return (X *)m->grads_memory + cudamodel_packed_pos(m, i, l);
}
/* Layer l's packed gradient bucket (l < 0: the outer one); grad_slots only. */
inline void *cudamodel_bucket_grads(const CudaModel *m, int l) {
    return (char *)m->grads_memory + cudamodel_packed_bucket(m, l) * precision_bytes(m->precision);
}
/* The reduced gradient of flat parameter a (in [shard_lo, shard_hi) when grad_slots), for the norm
 * and the update. */
template <class X> inline X *cudamodel_grad_at(const CudaModel *m, size_t a) {
    return m->grad_slots ? (X *)m->shard_grads + (a - m->shard_lo) : (X *)m->grads_memory + a;
}

/* The parameters-needed hook (see params_hook). */
inline void cudamodel_params_needed(CudaModel *m, int l, int backward) {
    if (m->params_hook) m->params_hook(m->params_hook_ctx, l, backward);
}

/* Before queueing layer l's backward (both architectures): where the backward is (grad_hook's
 * trace), the layer's parameters made ready (params_hook) and, -z 2, its gradient slot, which waits
 * for the reduction of the layer that used it before and is then cleared. */
inline void cudamodel_backward_layer_begin(CudaModel *m, int l) {
    m->backward_layer = l;
    cudamodel_params_needed(m, l, 1);
    if (!m->grad_slots) return;
    cudaCheck(cudaStreamWaitEvent(m->ctx->stream, m->slot_free[l & 1], 0));
    cudaCheck(cudaMemsetAsync(cudamodel_bucket_grads(m, l), 0, m->layer_numel * precision_bytes(m->precision), m->ctx->stream));
}

/* ---- the backward's bucket hook ---------------------------------------------------------- */
/* Bucket l's gradients are final for this step (see grad_hook). */
inline void cudamodel_bucket_ready(CudaModel *m, int l) {
    if (m->grad_hook && (m->grad_hook_armed || (m->grad_slots && l >= 0))) m->grad_hook(m->grad_hook_ctx, l);
}

#endif
