/*
 * gpt2.cuh - GPT-2's block sequence on the GPU: the CUDA twin of llmc/cpu/gpt2.c's layers (same
 * tensor tables, llmc/models/gpt2.h), in the shared model struct (arena.cuh), with its entry
 * gpt2_cuda_arch (arch.cuh) at the end: the runtime (cudamodel.cuh) reaches it through the entry.
 * Differences from the CPU sequence, each for speed or memory:
 *  - tensors are stored in the run-time precision T (fp32 | bf16 | fp16); LayerNorm statistics and
 *    the attention logsumexp are fp32;
 *  - the residual add is fused into the LayerNorm that follows it;
 *  - attention is our flash attention: the table's `att` slot holds the per-row logsumexp
 *    (B, NH, T) fp32 instead of the (B, NH, T, T) probabilities;
 *  - optional GELU fusion into the matmul epilogues (-ge 1: forward, -ge 2: also backward);
 *  - recompute level 3 keeps only each block's input (residual3 per layer) and reruns the
 *    block's forward in the backward pass;
 *  - the `logits` slot holds one LM-head chunk (cudamodel.cuh's head and loss).
 * The ParameterTensors/ActivationTensors views are GPT-2's (their activation slots also point at
 * another architecture's tensors of the same name: lnf, logits, losses, ...: the shared LM head's).
 */
#ifndef LLMC_CUDA_GPT2_CUH
#define LLMC_CUDA_GPT2_CUH

#include <string.h>

#include "llmc/models/gpt2.h"
#include "llmc/cuda/adamw.cuh"
#include "llmc/cuda/arch.cuh"
#include "llmc/cuda/arena.cuh"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/gelu.cuh"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/nvtx.cuh"

inline size_t gpt2cuda_activation_specs(const ModelConfig *cfg, int B, int T, int recompute, Precision prec, int head_rows,
                                        TensorSpec specs[NUM_ACTIVATION_TENSORS], size_t bytes[NUM_ACTIVATION_TENSORS]) {
    /* level 0 of the shared table gives every per-layer tensor with all L layers */
    gpt2_activation_specs(cfg, B, T, 0, specs);
    const size_t L = (size_t)cfg->num_layers;
    size_t offset = 0;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) {
        TensorSpec *s = &specs[i];
        size_t unit = s->per_layer ? s->numel / L : s->numel;
        if (i == GPT2_A_att) { /* logsumexp (B, NH, T) */
            unit = (size_t)B * cfg->num_heads * T;
            s->shape = "(L, B, NH, T) lse";
        }
        if (i == GPT2_A_logits) { /* one LM-head chunk */
            unit = (size_t)head_rows * cfg->padded_vocab_size;
            s->shape = "(head_rows, Vp)";
        }
        s->per_layer = s->per_layer && gpt2_activation_stored_per_layer(s->name, recompute);
        s->numel = s->per_layer ? unit * L : unit;
        bytes[i] = s->numel * (cudamodel_act_is_fp32(s, i == GPT2_A_att) ? sizeof(float) : precision_bytes(prec));
        s->offset = offset; /* bytes here, 256-aligned */
        offset += (bytes[i] + 255) & ~(size_t)255;
    }
    return offset;
}

/* Layer l's activations for the current (B, T) (one shared copy when not stored per layer). */
template <class T> struct LayerActs {
    T *residual, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
};

template <class T> inline LayerActs<T> gpt2cuda_layer(const CudaModel *m, int l, int B, int T_) {
    const ActivationTensors *a = &m->acts;
    const size_t N = (size_t)B * T_, C = (size_t)m->cfg.channels, F = (size_t)m->cfg.ffn_hidden;
    const size_t NH = (size_t)m->cfg.num_heads;
    const int r = m->recompute;
#define LLMC_AT(name, per) (gpt2_activation_stored_per_layer(#name, r) ? (size_t)l * (per) : 0)
    LayerActs<T> x;
    x.residual = l == 0 ? (T *)a->encoded : (T *)a->residual3 + (size_t)(l - 1) * N * C;
    x.ln1 = (T *)a->ln1 + LLMC_AT(ln1, N * C);
    x.ln1_mean = (float *)a->ln1_mean + LLMC_AT(ln1_mean, N);
    x.ln1_rstd = (float *)a->ln1_rstd + LLMC_AT(ln1_rstd, N);
    x.qkv = (T *)a->qkv + LLMC_AT(qkv, N * 3 * C);
    x.atty = (T *)a->atty + LLMC_AT(atty, N * C);
    x.lse = (float *)a->att + LLMC_AT(att, N * NH);
    x.residual2 = (T *)a->residual2 + LLMC_AT(residual2, N * C);
    x.ln2 = (T *)a->ln2 + LLMC_AT(ln2, N * C);
    x.ln2_mean = (float *)a->ln2_mean + LLMC_AT(ln2_mean, N);
    x.ln2_rstd = (float *)a->ln2_rstd + LLMC_AT(ln2_rstd, N);
    x.fch = (T *)a->fch + LLMC_AT(fch, N * F);
    x.fch_gelu = (T *)a->fch_gelu + LLMC_AT(fch_gelu, N * F);
    x.residual3 = (T *)a->residual3 + (size_t)l * N * C; /* always stored per layer */
#undef LLMC_AT
    return x;
}

/* Layer l's slice of a stacked (L, ...) parameter tensor, typed (decode.cuh's inference). */
#define LLMC_LAYER(T, p, l, per) ((T *)(p) + (size_t)(l) * (per))

/* A GPT-2 block's parameter (or gradient) views for layer l. */
template <class T> struct LayerWeights {
    T *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};
template <class T> inline LayerWeights<T> gpt2cuda_layer_weights(const CudaModel *m, int l, int grads) {
    LayerWeights<T> w;
#define LLMC_VIEW(name) w.name = grads ? cudamodel_grad<T>(m, GPT2_P_##name, l) : cudamodel_param<T>(m, GPT2_P_##name, l)
    LLMC_VIEW(ln1w), LLMC_VIEW(ln1b), LLMC_VIEW(qkvw), LLMC_VIEW(qkvb), LLMC_VIEW(attprojw), LLMC_VIEW(attprojb);
    LLMC_VIEW(ln2w), LLMC_VIEW(ln2b), LLMC_VIEW(fcw), LLMC_VIEW(fcb), LLMC_VIEW(fcprojw), LLMC_VIEW(fcprojb);
#undef LLMC_VIEW
    return w;
}

/* ---- building ----------------------------------------------------------------------------- */
inline void gpt2cuda_point_parameters(ParameterTensors *p, void *arena, const TensorSpec *specs, size_t elem) {
    float **slots = gpt2_parameter_slots(p);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) slots[i] = (float *)((char *)arena + specs[i].offset * elem);
}

/* The fp32 op scratch: its largest user (also serves inference: the classifier needs none). */
inline size_t gpt2cuda_fscratch_floats(const ModelConfig *cfg, size_t N) {
    const size_t C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden;
    size_t fs = NORM_BLOCKS;
    size_t cand[4] = {layernorm_backward_scratch_floats((int)N, (int)C), matmul_backward_scratch_floats((int)N, (int)F),
                      matmul_backward_scratch_floats((int)N, 3 * (int)C),
                      attention_backward_scratch_floats(N, cfg->num_heads, (int)C / cfg->num_heads)};
    for (int i = 0; i < 4; i++) fs = cand[i] > fs ? cand[i] : fs;
    return fs;
}

/* The ActivationTensors slots into the arena: GPT-2's table is those slots; another architecture's
 * tensors point the slots of the same name (lnf, logits, losses, ...), the others stay NULL. */
inline void gpt2cuda_point_activations(CudaModel *m) {
    static const char *const slot_names[] = {
#define LLMC_ACT_NAME(name, ...) #name,
        GPT2_ACTIVATIONS(LLMC_ACT_NAME)
#undef LLMC_ACT_NAME
    };
    float **slots = (float **)&m->acts;
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) {
        slots[i] = NULL;
        for (int j = 0; j < NUM_ACTIVATION_TENSORS && m->act_specs[j].name; j++)
            if (strcmp(m->act_specs[j].name, slot_names[i]) == 0) slots[i] = (float *)((char *)m->acts_memory + m->act_specs[j].offset);
    }
}

/* ---- forward ------------------------------------------------------------------------------- */
/* Block l from its ln1 (already computed) to residual3 and the next LayerNorm (finish = 1), or
 * only up to fch_gelu (finish = 0: the recompute of level 3, which needs nothing later). */
template <class T> void gpt2cuda_block_forward(CudaModel *m, int l, int B, int T_, int finish) {
    NVTX_RANGE_LAYER(finish ? "forward layer" : "recompute layer", l);
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, NH = cfg->num_heads, F = cfg->ffn_hidden, L = cfg->num_layers, N = B * T_;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    LayerActs<T> x = gpt2cuda_layer<T>(m, l, B, T_);
    const LayerWeights<T> p = gpt2cuda_layer_weights<T>(m, l, 0);
    matmul_forward(x.qkv, x.ln1, p.qkvw, p.qkvb, N, C, 3 * C, ctx);
    attention_forward(x.atty, x.lse, x.qkv, B, T_, C, NH, cfg->num_kv_heads, s);
    matmul_forward(x.residual2, x.atty, p.attprojw, p.attprojb, N, C, C, ctx);
    fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, x.residual, p.ln2w, p.ln2b, N, C, s);
    if (m->gelu_fusion >= 1) {
        matmul_forward_gelu(x.fch_gelu, x.fch, x.ln2, p.fcw, p.fcb, N, C, F, ctx);
    } else {
        matmul_forward(x.fch, x.ln2, p.fcw, p.fcb, N, C, F, ctx);
        gelu_forward(x.fch_gelu, x.fch, (size_t)N * F, s);
    }
    if (!finish) return;
    matmul_forward(x.residual3, x.fch_gelu, p.fcprojw, p.fcprojb, N, F, C, ctx);
    if (l + 1 < L) {
        cudamodel_params_needed(m, l + 1, 0); /* (its ln1w, ln1b) */
        LayerActs<T> y = gpt2cuda_layer<T>(m, l + 1, B, T_);
        const LayerWeights<T> q = gpt2cuda_layer_weights<T>(m, l + 1, 0);
        fused_residual_layernorm_forward(x.residual3, y.ln1, y.ln1_mean, y.ln1_rstd, x.residual3, x.residual2, q.ln1w, q.ln1b,
                                         N, C, s);
    } else {
        fused_residual_layernorm_forward(x.residual3, (T *)m->acts.lnf, (float *)m->acts.lnf_mean, (float *)m->acts.lnf_rstd,
                                         x.residual3, x.residual2, cudamodel_param<T>(m, GPT2_P_lnfw, 0),
                                         cudamodel_param<T>(m, GPT2_P_lnfb, 0), N, C, s);
    }
}

/* ---- backward ------------------------------------------------------------------------------ */
/* The backward down to the encoder's output gradient (dresidual): launches only (graph.cuh). */
template <class T> void gpt2cuda_backward_layers_t(CudaModel *m, int B, int T_) {
    NVTX_RANGE("backward");
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, F = cfg->ffn_hidden;
    const int N = B * T_;
    const size_t NC = (size_t)N * C, NF = (size_t)N * F;
    ActivationTensors *a = &m->acts;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    float *fs = m->fscratch;
    T *dres = (T *)m->dresidual, *dbuf_c = (T *)m->dbuf_c, *dbuf_f1 = (T *)m->dbuf_f1, *dbuf_f2 = (T *)m->dbuf_f2;

    /* (the LM head's backward ran in the forward, chunk by chunk: dlnf is in dbuf_c) */
    /* lnf = layernorm(residual3[L-1]) */
    cudaCheck(cudaMemsetAsync(dres, 0, NC * sizeof(T), s));
    T *top = (T *)a->residual3 + (size_t)(L - 1) * NC;
    layernorm_backward(dres, cudamodel_grad<T>(m, GPT2_P_lnfw, 0), cudamodel_grad<T>(m, GPT2_P_lnfb, 0), dbuf_c, top,
                       cudamodel_param<T>(m, GPT2_P_lnfw, 0), (float *)a->lnf_mean, (float *)a->lnf_rstd, N, C, fs, s);
    m->in_backward = 1;
    for (int l = L - 1; l >= 0; l--) {
        NVTX_RANGE_LAYER("backward layer", l);
        cudamodel_backward_layer_begin(m, l);
        LayerActs<T> x = gpt2cuda_layer<T>(m, l, B, T_);
        const LayerWeights<T> p = gpt2cuda_layer_weights<T>(m, l, 0), g = gpt2cuda_layer_weights<T>(m, l, 1);
        /* recompute what the forward did not keep, with the forward's own kernels */
        if (m->recompute >= 3) {
            layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, x.residual, p.ln1w, p.ln1b, N, C, s);
            gpt2cuda_block_forward<T>(m, l, B, T_, 0);
        } else {
            if (m->recompute >= 1) gelu_forward(x.fch_gelu, x.fch, NF, s);
            if (m->recompute >= 2) layernorm_recompute(x.ln2, x.residual2, x.ln2_mean, x.ln2_rstd, p.ln2w, p.ln2b, N, C, s);
        }
        /* residual3 = residual2 + fch_gelu @ fcprojw^T + fcprojb: dres flows on to residual2 */
        T *dfch_gelu = dbuf_f1, *dfch = dbuf_f2;
        if (m->gelu_fusion >= 2) {
            /* ... and fch_gelu = gelu(fch), through the DGELU epilogue */
            matmul_backward_dgelu(dfch, g.fcprojw, g.fcprojb, dres, x.fch_gelu, p.fcprojw, x.fch, N, F, C, fs, ctx);
        } else {
            matmul_backward(dfch_gelu, g.fcprojw, g.fcprojb, dres, x.fch_gelu, p.fcprojw, N, F, C, fs, ctx);
            /* fch_gelu = gelu(fch) */
            gelu_backward(dfch, x.fch, dfch_gelu, NF, s);
        }
        /* fch = ln2 @ fcw^T + fcb */
        T *dln2 = dbuf_c;
        matmul_backward(dln2, g.fcw, g.fcb, dfch, x.ln2, p.fcw, N, C, F, fs, ctx);
        /* ln2 = layernorm(residual2) */
        layernorm_backward(dres, g.ln2w, g.ln2b, dln2, x.residual2, p.ln2w, x.ln2_mean, x.ln2_rstd, N, C, fs, s);
        /* residual2 = residual + atty @ attprojw^T + attprojb */
        T *datty = dbuf_c;
        matmul_backward(datty, g.attprojw, g.attprojb, dres, x.atty, p.attprojw, N, C, C, fs, ctx);
        /* atty = attention(qkv) */
        T *dqkv = dbuf_f1;
        attention_backward(dqkv, datty, x.qkv, x.atty, x.lse, B, T_, C, NH, cfg->num_kv_heads, fs, s);
        /* qkv = ln1 @ qkvw^T + qkvb */
        if (m->recompute == 2) layernorm_recompute(x.ln1, x.residual, x.ln1_mean, x.ln1_rstd, p.ln1w, p.ln1b, N, C, s);
        T *dln1 = dbuf_c;
        matmul_backward(dln1, g.qkvw, g.qkvb, dqkv, x.ln1, p.qkvw, N, C, 3 * C, fs, ctx);
        /* ln1 = layernorm(residual) */
        layernorm_backward(dres, g.ln1w, g.ln1b, dln1, x.residual, p.ln1w, x.ln1_mean, x.ln1_rstd, N, C, fs, s);
        cudamodel_bucket_ready(m, l);
    }
}

/* ---- the entry (arch.cuh) ----------------------------------------------------------------- */
/* The trunk: the encoder, the L blocks, lnf (the LM head is shared: cudamodel_forward_t). */
template <class T> void gpt2cuda_trunk_forward(CudaModel *m, int B, int T_) {
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, N = B * T_;
    ActivationTensors *a = &m->acts;
    cudaStream_t s = m->ctx->stream;
    encoder_forward((T *)a->encoded, m->d_inputs, cudamodel_param<T>(m, GPT2_P_wte, 0), cudamodel_param<T>(m, GPT2_P_wpe, 0), B,
                    T_, C, s);
    LayerActs<T> x0 = gpt2cuda_layer<T>(m, 0, B, T_);
    cudamodel_params_needed(m, 0, 0);
    const LayerWeights<T> p0 = gpt2cuda_layer_weights<T>(m, 0, 0);
    layernorm_forward(x0.ln1, x0.ln1_mean, x0.ln1_rstd, (T *)a->encoded, p0.ln1w, p0.ln1b, N, C, s);
    for (int l = 0; l < cfg->num_layers; l++) {
        if (l > 0) cudamodel_params_needed(m, l, 0);
        gpt2cuda_block_forward<T>(m, l, B, T_, 1);
    }
}

/* encoded = wte[inputs] + wpe: the staged buckets' scatter into wte's and wpe's gradients. */
template <class T> void gpt2cuda_embedding_backward(CudaModel *m, const EncoderBuckets *eb, int B, int T_) {
    encoder_backward(cudamodel_grad<T>(m, GPT2_P_wte, 0), cudamodel_grad<T>(m, GPT2_P_wpe, 0), (T *)m->dresidual, eb, B, T_,
                     m->cfg.channels, m->ctx->stream);
}

/* The head is wte (tied); the ParameterTensors views (decode.cuh's) into the arena. */
inline void gpt2cuda_configure(CudaModel *m, const ArchConfig *ac) {
    (void)ac;
    m->head_index = GPT2_P_wte;
    gpt2cuda_point_parameters(&m->params, m->params_memory, m->param_specs, precision_bytes(m->precision));
}

inline size_t gpt2cuda_arch_activation_specs(const ArchConfig *ac, int B, int T_, int recompute, Precision prec, int head_rows,
                                             TensorSpec *specs, size_t *bytes) {
    return gpt2cuda_activation_specs(arch_config_cbase(ac), B, T_, recompute, prec, head_rows, specs, bytes);
}

/* dbuf_f1 holds dfch_gelu, later dqkv: F wide (F >= 3C, checked by gpt2cuda_allocated). */
inline size_t gpt2cuda_scratch_f1(const ModelConfig *cfg) { return (size_t)cfg->ffn_hidden; }

inline void gpt2cuda_allocated(CudaModel *m, int training) {
    if (training && m->cfg.ffn_hidden < 3 * m->cfg.channels)
        llmc_die("the backward scratch reuses the MLP buffer for dqkv: needs F >= 3C");
}

/* The CUDA runtime's entry for GPT-2 (arch.cuh; listed in archs.cuh). */
inline const CudaArch gpt2_cuda_arch = {
    &gpt2_arch, "GPT-2", /* named */ 0, /* decoder */ 1, gpt2cuda_configure,
    /* max_recompute, no_recompute */ 3, NULL,
    /* has_gelu, has_attention, lse_act */ 1, 1, GPT2_A_att,
    gpt2cuda_arch_activation_specs, gpt2cuda_fscratch_floats, gpt2cuda_scratch_f1, gpt2cuda_allocated,
    CUDA_ARCH_PER_PRECISION(gpt2cuda_trunk_forward), CUDA_ARCH_PER_PRECISION(gpt2cuda_backward_layers_t),
    CUDA_ARCH_PER_PRECISION(gpt2cuda_embedding_backward),
};

#endif
