/*
 * llama.cuh - the Llama 3 block sequence on the GPU: the CUDA twin of llmc/cpu/llama.c, in the
 * shared model struct (CudaModel, arena.cuh), with its entry llama3_cuda_arch (arch.cuh) at the
 * end. cudamodel.cuh keeps everything that does not depend on the architecture: the parameter and
 * gradient arenas laid out by the table, fp32 master weights, AdamW and its compact/offloaded/
 * sharded states, the fp16 loss scaler, the gradient norm, the host copies for checkpoints and the
 * chunked LM head with its loss; it reaches this file through the entry only.
 *
 * Differences from the CPU sequence, as for GPT-2 on CUDA: tensors in the run-time precision T
 * (RMSNorm's rstd, the attention logsumexp and the losses fp32); the residual add fused into the
 * RMSNorm that follows it (rmsnorm.cuh); the table's `att` holds the logsumexp (B, NH, T) per
 * layer, not the probabilities; `logits` holds one LM-head chunk. Grouped-query attention is
 * native (NKV passed to the attention calls: K/V are read per group, never copied). Every
 * activation is stored (no recompute levels: -r 0 only). RoPE's cos/sin table (T, HS) fp32 sits
 * after the table's tensors in the activation arena.
 * Views: every per-layer pointer comes from the tables (TensorSpec offset + l * layer_numel).
 */
#ifndef LLMC_CUDA_LLAMA_MODEL_CUH
#define LLMC_CUDA_LLAMA_MODEL_CUH

#include "llmc/models/llama.h"
#include "llmc/cuda/arch.cuh"
#include "llmc/cuda/arena.cuh"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/nvtx.cuh"
#include "llmc/cuda/rmsnorm.cuh"
#include "llmc/cuda/rope.cuh"
#include "llmc/cuda/swiglu.cuh"

/* ---- the tables on the GPU ------------------------------------------------------------------- */
/* RoPE's cos/sin table (T, HS) fp32: its bytes at the end of the activation arena, and where. */
inline size_t llamacuda_rope_bytes(const ModelConfig *cfg, int T_) {
    return (size_t)T_ * (cfg->channels / cfg->num_heads) * sizeof(float);
}
inline float *llamacuda_freqs(const CudaModel *m) {
    return (float *)((char *)m->acts_memory + m->acts_total_bytes - llamacuda_rope_bytes(&m->cfg, m->T));
}

static_assert((int)LLAMA3_NUM_PARAMETERS <= (int)NUM_PARAMETER_TENSORS &&
                  (int)LLAMA3_NUM_ACTIVATIONS < (int)NUM_ACTIVATION_TENSORS,
              "CudaModel's tables hold the Llama's");
#define LLAMACUDA_CFG(ac) arch_config_as(ac, const LlamaConfig)

/* The activation table with the CUDA changes (see top); offsets in bytes, 256-aligned, per-layer
 * strides (layer_numel) in elements. Returns the arena's bytes, RoPE's table included. */
inline size_t llamacuda_activation_specs(const ArchConfig *ac, int B, int T_, int recompute, Precision prec, int head_rows,
                                         TensorSpec *specs, size_t *bytes) {
    (void)recompute; /* every activation is stored */
    const LlamaConfig *lc = LLAMACUDA_CFG(ac);
    llama_activation_specs(lc, B, T_, 0, specs); /* -r 0: every activation stored */
    return cuda_arch_layout_activations(&lc->base, B, T_, prec, head_rows, LLAMA3_A_att, LLAMA3_A_logits, specs, bytes,
                                        LLAMA3_NUM_ACTIVATIONS) +
           llamacuda_rope_bytes(&lc->base, T_);
}

/* The fp32 op scratch: its largest user (no biases, so the matmuls need none). */
inline size_t llamacuda_fscratch_floats(const ModelConfig *cfg, size_t N) {
    size_t fs = NORM_BLOCKS;
    size_t cand[2] = {rmsnorm_backward_scratch_floats((int)N, cfg->channels),
                      attention_backward_scratch_floats(N, cfg->num_heads, cfg->channels / cfg->num_heads)};
    for (int i = 0; i < 2; i++) fs = cand[i] > fs ? cand[i] : fs;
    return fs;
}

/* The backward scratch's middle buffer (N rows of it): dfch (2F) and dqkv (QKV), as on the CPU. */
inline size_t llamacuda_scratch_f1(const ModelConfig *c) {
    const size_t QKV = (size_t)(c->num_heads + 2 * c->num_kv_heads) * (c->channels / c->num_heads);
    return 2 * (size_t)c->ffn_hidden > QKV ? 2 * (size_t)c->ffn_hidden : QKV;
}

/* cudamodel_build's architecture part for a Llama: its config checked, the head's tensor. */
inline void llamacuda_configure(CudaModel *m, const ArchConfig *ac) {
    const LlamaConfig *lc = LLAMACUDA_CFG(ac);
    const char *bad = llama_config_validate(lc);
    if (bad) llmc_die("invalid Llama configuration: %s", bad);
    m->head_index = lc->tied ? LLAMA3_P_wte : LLAMA3_P_lm_head;
    m->head_offset = m->param_specs[m->head_index].offset;
}

/* After cudamodel_allocate: RoPE's cos/sin table into the end of the activation arena. */
inline void llamacuda_allocated(CudaModel *m, int training) {
    (void)training;
    const int HS = m->cfg.channels / m->cfg.num_heads;
    const LlamaConfig *lc = LLAMACUDA_CFG(&m->ac);
    RopeConfig rc = {lc->rope_theta, lc->rope_factor, lc->rope_low_freq_factor, lc->rope_high_freq_factor,
                     lc->rope_original_max_pos};
    rope_freqs_to_device(llamacuda_freqs(m), m->T, HS, &rc);
}

/* ---- forward ------------------------------------------------------------------------------- */
/* Layer l's views in the functions below: */
#define PARAM(name, l) cudamodel_param<T>(m, LLAMA3_P_##name, l)
#define GRAD(name, l) cudamodel_grad<T>(m, LLAMA3_P_##name, l)
#define ACT(name, l) cuda_arch_act<T>(m, LLAMA3_A_##name, l)
#define STAT(name, l) cuda_arch_act<float>(m, LLAMA3_A_##name, l)

/* The trunk: embedding, the L blocks, the final RMSNorm into lnf (the LM head is shared:
 * cudamodel_forward_t). d_inputs are on the device. */
template <class T> void llamacuda_trunk_forward(CudaModel *m, int B, int T_) {
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, QKV = (NH + 2 * NKV) * HS, N = B * T_;
    const float eps = LLAMACUDA_CFG(&m->ac)->norm_eps;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    T *encoded = ACT(encoded, 0);
    encoder_forward_wte(encoded, m->d_inputs, PARAM(wte, 0), N, C, s); /* (no position table) */
    cudamodel_params_needed(m, 0, 0);
    rmsnorm_forward(ACT(ln1, 0), STAT(ln1_rstd, 0), encoded, PARAM(ln1w, 0), N, C, eps, s);
    for (int l = 0; l < L; l++) {
        NVTX_RANGE_LAYER("forward layer", l);
        if (l > 0) cudamodel_params_needed(m, l, 0);
        T *residual = l == 0 ? encoded : ACT(residual3, l - 1), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        T *residual2 = ACT(residual2, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_swiglu = ACT(fch_swiglu, l);
        T *residual3 = ACT(residual3, l);
        matmul_forward(qkv, ACT(ln1, l), PARAM(qkvw, l), (const T *)NULL, N, C, QKV, ctx);
        rope_forward(qkv, llamacuda_freqs(m), B, T_, NH, NKV, HS, s);
        attention_forward(atty, STAT(att, l), qkv, B, T_, C, NH, NKV, s);
        matmul_forward(residual2, atty, PARAM(attprojw, l), (const T *)NULL, N, C, C, ctx);
        /* residual2 += residual, then ln2 = rmsnorm(residual2) */
        fused_residual_rmsnorm_forward(residual2, ln2, STAT(ln2_rstd, l), residual2, residual, PARAM(ln2w, l), N, C, eps, s);
        matmul_forward(fch, ln2, PARAM(fcw, l), (const T *)NULL, N, C, 2 * F, ctx);
        swiglu_forward(fch_swiglu, fch, N, F, s);
        matmul_forward(residual3, fch_swiglu, PARAM(fcprojw, l), (const T *)NULL, N, F, C, ctx);
        /* residual3 += residual2, then the next block's ln1 (or lnf) */
        if (l + 1 < L) cudamodel_params_needed(m, l + 1, 0); /* (its ln1w) */
        if (l + 1 < L)
            fused_residual_rmsnorm_forward(residual3, ACT(ln1, l + 1), STAT(ln1_rstd, l + 1), residual3, residual2,
                                           PARAM(ln1w, l + 1), N, C, eps, s);
        else
            fused_residual_rmsnorm_forward(residual3, ACT(lnf, 0), STAT(lnf_rstd, 0), residual3, residual2, PARAM(lnfw, 0), N,
                                           C, eps, s);
    }
}

/* ---- backward ------------------------------------------------------------------------------ */
/* After the training forward (the LM head's backward left dlnf in dbuf_c and the head's gradient
 * accumulated): the blocks' and lnf's gradients, down to the embedding's output gradient (dresidual);
 * launches only, so a CUDA graph can capture it (cudamodel.cuh's cudamodel_backward_layers). */
template <class T> void llamacuda_backward_layers_t(CudaModel *m, int B, int T_) {
    NVTX_RANGE("backward");
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, NKV = cfg->num_kv_heads;
    const int F = cfg->ffn_hidden, HS = C / NH, QKV = (NH + 2 * NKV) * HS, N = B * T_;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    float *fs = m->fscratch;
    T *dres = (T *)m->dresidual, *dbuf_c = (T *)m->dbuf_c, *dbuf_f1 = (T *)m->dbuf_f1, *dbuf_f2 = (T *)m->dbuf_f2;
    /* lnf = rmsnorm(residual3[L-1]) */
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)N * C * sizeof(T), s));
    rmsnorm_backward(dres, GRAD(lnfw, 0), dbuf_c, ACT(residual3, L - 1), PARAM(lnfw, 0), STAT(lnf_rstd, 0), N, C, fs, s);
    m->in_backward = 1;
    for (int l = L - 1; l >= 0; l--) {
        NVTX_RANGE_LAYER("backward layer", l);
        cudamodel_backward_layer_begin(m, l);
        T *residual = l == 0 ? ACT(encoded, 0) : ACT(residual3, l - 1), *qkv = ACT(qkv, l), *atty = ACT(atty, l);
        /* residual3 = residual2 + fch_swiglu @ fcprojw^T */
        T *dfch_swiglu = dbuf_f2, *dfch = dbuf_f1;
        matmul_backward(dfch_swiglu, GRAD(fcprojw, l), (T *)NULL, dres, ACT(fch_swiglu, l), PARAM(fcprojw, l), N, F, C, fs, ctx);
        swiglu_backward(dfch, ACT(fch, l), dfch_swiglu, N, F, s);
        /* fch = ln2 @ fcw^T (gate | up) */
        T *dln2 = dbuf_c;
        matmul_backward(dln2, GRAD(fcw, l), (T *)NULL, dfch, ACT(ln2, l), PARAM(fcw, l), N, C, 2 * F, fs, ctx);
        /* ln2 = rmsnorm(residual2) */
        rmsnorm_backward(dres, GRAD(ln2w, l), dln2, ACT(residual2, l), PARAM(ln2w, l), STAT(ln2_rstd, l), N, C, fs, s);
        /* residual2 = residual + atty @ attprojw^T */
        T *datty = dbuf_c;
        matmul_backward(datty, GRAD(attprojw, l), (T *)NULL, dres, atty, PARAM(attprojw, l), N, C, C, fs, ctx);
        /* atty = attention(rope(qkv)): the stored qkv holds the rotated q and k */
        T *dqkv = dbuf_f1;
        attention_backward(dqkv, datty, qkv, atty, STAT(att, l), B, T_, C, NH, NKV, fs, s);
        rope_backward(dqkv, llamacuda_freqs(m), B, T_, NH, NKV, HS, s);
        /* qkv = ln1 @ qkvw^T */
        T *dln1 = dbuf_c;
        matmul_backward(dln1, GRAD(qkvw, l), (T *)NULL, dqkv, ACT(ln1, l), PARAM(qkvw, l), N, C, QKV, fs, ctx);
        /* ln1 = rmsnorm(residual) */
        rmsnorm_backward(dres, GRAD(ln1w, l), dln1, residual, PARAM(ln1w, l), STAT(ln1_rstd, l), N, C, fs, s);
        cudamodel_bucket_ready(m, l); /* layer l's gradients are final (arena.cuh's grad_hook) */
    }
}

#undef GRAD
#undef STAT
#undef ACT
#undef PARAM

/* The CUDA runtime's entry for Llama 3 (arch.cuh; listed in archs.cuh). */
inline const CudaArch llama3_cuda_arch = {
    &llama3_arch, "Llama", /* named */ 1, /* decoder */ 0, llamacuda_configure,
    /* max_recompute, no_recompute */ 0, "the CUDA Llama has -r 0 only",
    /* has_gelu, has_attention, lse_act */ 0, 1, LLAMA3_A_att,
    llamacuda_activation_specs, llamacuda_fscratch_floats, llamacuda_scratch_f1, llamacuda_allocated,
    CUDA_ARCH_PER_PRECISION(llamacuda_trunk_forward), CUDA_ARCH_PER_PRECISION(llamacuda_backward_layers_t),
    CUDA_ARCH_WTE_BACKWARD(LLAMA3_P_wte), /* encoded = wte[inputs] */
};

#endif
