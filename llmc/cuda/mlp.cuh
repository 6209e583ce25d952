/*
 * mlp.cuh - the MLP-only test architecture's block sequence on the GPU: the CUDA twin of
 * llmc/cpu/mlp.c over the same tables (llmc/models/mlp.h) and the existing CUDA ops (encoder's
 * token-only embedding, rmsnorm, matmul, swiglu), in the runtime's model struct (CudaModel,
 * arena.cuh) with its entry mlp_cuda_arch (arch.cuh) at the end: ./train_gpt trains it through the
 * runtime (cudamodel.cuh), which names nothing of it. Tensors in the run-time precision T; the
 * norms' rstd and the losses fp32 (the table's ACT_STATS rows); every activation stored (-r 0).
 *
 * Differences from the CPU sequence: the residual add is fused into the RMSNorm that follows it
 * (rmsnorm.cuh, as the Llama's); the LM head and its loss are the runtime's (chunked: the table's
 * `logits` holds one chunk); the matmuls are cuBLASLt's (other summation orders: in fp32 the
 * results agree to rounding). The embedding's backward sums each token's positions in order, as
 * the CPU does. Views: every per-layer pointer comes from the tables (arena.cuh's cudamodel_param
 * and cudamodel_grad, arch.cuh's cuda_arch_act).
 */
#ifndef LLMC_CUDA_MLP_CUH
#define LLMC_CUDA_MLP_CUH

#include "llmc/models/mlp.h"
#include "llmc/cuda/arch.cuh"
#include "llmc/cuda/arena.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/rmsnorm.cuh"
#include "llmc/cuda/swiglu.cuh"

static_assert((int)MLP_NUM_PARAMETERS <= (int)NUM_PARAMETER_TENSORS && (int)MLP_NUM_ACTIVATIONS < (int)NUM_ACTIVATION_TENSORS,
              "CudaModel's tables hold the MLP's");
#define MLP_CUDA_CFG(ac) arch_config_as(ac, const MlpConfig)

/* ---- the tables on the GPU ------------------------------------------------------------------- */
inline size_t mlp_cuda_activation_specs(const ArchConfig *ac, int B, int T_, int recompute, Precision prec, int head_rows,
                                        TensorSpec *specs, size_t *bytes) {
    (void)recompute; /* every activation is stored */
    const MlpConfig *mc = MLP_CUDA_CFG(ac);
    mlp_activation_specs(mc, B, T_, specs);
    return cuda_arch_layout_activations(&mc->base, B, T_, prec, head_rows, -1, MLP_A_logits, specs, bytes,
                                        MLP_NUM_ACTIVATIONS);
}

/* The fp32 op scratch: RMSNorm's backward partials or the gradient norm's (no biases: the matmuls need none). */
inline size_t mlp_cuda_fscratch_floats(const ModelConfig *cfg, size_t N) {
    const size_t rms = rmsnorm_backward_scratch_floats((int)N, cfg->channels);
    return rms > (size_t)NORM_BLOCKS ? rms : (size_t)NORM_BLOCKS;
}

/* The backward scratch's middle buffer: dfch (N, 2F), as llmc/cpu/mlp.h's dbuf_f1. */
inline size_t mlp_cuda_scratch_f1(const ModelConfig *cfg) { return 2 * (size_t)cfg->ffn_hidden; }

/* cudamodel_build's part: the config checked; the head is wte (always tied). */
inline void mlp_cuda_configure(CudaModel *m, const ArchConfig *ac) {
    const char *bad = mlp_config_validate(MLP_CUDA_CFG(ac));
    if (bad) llmc_die("invalid MLP configuration: %s", bad);
    m->head_index = MLP_P_wte;
    m->head_offset = m->param_specs[MLP_P_wte].offset;
}

/* Layer l's views in the functions below: */
#define PARAM(name, l) cudamodel_param<T>(m, MLP_P_##name, l)
#define GRAD(name, l) cudamodel_grad<T>(m, MLP_P_##name, l)
#define ACT(name, l) cuda_arch_act<T>(m, MLP_A_##name, l)
#define STAT(name, l) cuda_arch_act<float>(m, MLP_A_##name, l)
#define BLOCK_INPUT(l) ((l) == 0 ? ACT(encoded, 0) : ACT(residual, (l) - 1))

/* ---- forward ------------------------------------------------------------------------------- */
/* encoded = wte[inputs]; per layer residual_l = input + swiglu(ln @ fcw^T) @ fcprojw^T with
 * ln = rmsnorm(input); lnf = rmsnorm(residual_{L-1}). d_inputs are on the device. */
template <class T> void mlp_cuda_trunk_forward(CudaModel *m, int B, int T_) {
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, L = cfg->num_layers, F = cfg->ffn_hidden, N = B * T_;
    const float eps = MLP_CUDA_CFG(&m->ac)->norm_eps;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    encoder_forward_wte(ACT(encoded, 0), m->d_inputs, PARAM(wte, 0), N, C, s);
    cudamodel_params_needed(m, 0, 0);
    rmsnorm_forward(ACT(ln, 0), STAT(ln_rstd, 0), ACT(encoded, 0), PARAM(lnw, 0), N, C, eps, s);
    for (int l = 0; l < L; l++) {
        if (l > 0) cudamodel_params_needed(m, l, 0);
        T *input = BLOCK_INPUT(l), *out = ACT(residual, l);
        matmul_forward(ACT(fch, l), ACT(ln, l), PARAM(fcw, l), (const T *)NULL, N, C, 2 * F, ctx);
        swiglu_forward(ACT(fch_swiglu, l), ACT(fch, l), N, F, s);
        matmul_forward(out, ACT(fch_swiglu, l), PARAM(fcprojw, l), (const T *)NULL, N, F, C, ctx);
        /* out += input, then the next block's ln (or lnf) */
        if (l + 1 < L) {
            cudamodel_params_needed(m, l + 1, 0); /* (its lnw) */
            fused_residual_rmsnorm_forward(out, ACT(ln, l + 1), STAT(ln_rstd, l + 1), out, input, PARAM(lnw, l + 1), N, C, eps, s);
        } else {
            fused_residual_rmsnorm_forward(out, ACT(lnf, 0), STAT(lnf_rstd, 0), out, input, PARAM(lnfw, 0), N, C, eps, s);
        }
    }
}

/* ---- backward ------------------------------------------------------------------------------ */
/* From dlnf (dbuf_c, the runtime's LM-head backward) down to the embedding's output gradient
 * (dresidual: the gradient of each block's output, and through the identity of its input). */
template <class T> void mlp_cuda_backward_layers(CudaModel *m, int B, int T_) {
    const ModelConfig *cfg = &m->cfg;
    const int C = cfg->channels, L = cfg->num_layers, F = cfg->ffn_hidden, N = B * T_;
    const CudaContext *ctx = m->ctx;
    cudaStream_t s = ctx->stream;
    float *fs = m->fscratch;
    T *dres = (T *)m->dresidual, *dbuf_c = (T *)m->dbuf_c, *dbuf_f1 = (T *)m->dbuf_f1, *dbuf_f2 = (T *)m->dbuf_f2;
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)N * C * sizeof(T), s));
    rmsnorm_backward(dres, GRAD(lnfw, 0), dbuf_c, ACT(residual, L - 1), PARAM(lnfw, 0), STAT(lnf_rstd, 0), N, C, fs, s);
    m->in_backward = 1;
    for (int l = L - 1; l >= 0; l--) {
        cudamodel_backward_layer_begin(m, l);
        T *dfch_swiglu = dbuf_f2, *dfch = dbuf_f1, *dln = dbuf_c;
        matmul_backward(dfch_swiglu, GRAD(fcprojw, l), (T *)NULL, dres, ACT(fch_swiglu, l), PARAM(fcprojw, l), N, F, C, fs, ctx);
        swiglu_backward(dfch, ACT(fch, l), dfch_swiglu, N, F, s);
        matmul_backward(dln, GRAD(fcw, l), (T *)NULL, dfch, ACT(ln, l), PARAM(fcw, l), N, C, 2 * F, fs, ctx);
        rmsnorm_backward(dres, GRAD(lnw, l), dln, BLOCK_INPUT(l), PARAM(lnw, l), STAT(ln_rstd, l), N, C, fs, s);
        cudamodel_bucket_ready(m, l); /* layer l's gradients are final (arena.cuh's grad_hook) */
    }
}

#undef BLOCK_INPUT
#undef STAT
#undef ACT
#undef GRAD
#undef PARAM

/* The CUDA runtime's entry for the MLP (arch.cuh; listed in archs.cuh). */
inline const CudaArch mlp_cuda_arch = {
    &mlp_arch, "MLP", /* named */ 1, /* decoder */ 0, mlp_cuda_configure,
    /* max_recompute, no_recompute */ 0, "the CUDA MLP has -r 0 only",
    /* has_gelu, has_attention, lse_act */ 0, 0, -1,
    mlp_cuda_activation_specs, mlp_cuda_fscratch_floats, mlp_cuda_scratch_f1, NULL,
    CUDA_ARCH_PER_PRECISION(mlp_cuda_trunk_forward), CUDA_ARCH_PER_PRECISION(mlp_cuda_backward_layers),
    CUDA_ARCH_WTE_BACKWARD(MLP_P_wte), /* encoded = wte[inputs] */
};

#endif
