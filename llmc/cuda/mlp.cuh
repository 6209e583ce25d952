/*
 * mlp.cuh - the MLP-only test architecture's block sequence on the GPU: the CUDA twin of
 * llmc/cpu/mlp.c over the same tables (llmc/models/mlp.h) and the existing CUDA ops
 * (encoder, rmsnorm, matmul, swiglu, residual, classifier), in its own small struct (MlpCudaT),
 * independent of the GPT-2/Llama runtime (cudamodel.cuh). Tensors in the storage type T (float,
 * __nv_bfloat16 or __half: MlpCudaT<T>; MlpCuda is the fp32 one); the norms' rstd and the losses
 * fp32 (the table's ACT_STATS rows); every activation stored.
 *
 * Differences from the CPU sequence: the embedding is encoder.cuh's with a (T_, C) table of zeros
 * as its position table (x + 0 is x: the forward is wte's rows exactly; the backward sums each
 * token's positions in order, as the CPU does, into dwte, and into a sink for the zeros' gradient);
 * the matmuls are cuBLASLt's (other summation orders: in fp32 the results agree to rounding).
 * Views: every per-layer pointer comes from the tables (TensorSpec offset + l * layer_numel; the
 * activation arena in bytes, each tensor 256-aligned, ACT_STATS tensors in fp32).
 *
 *   mlp_cuda_build(m, cfg, ctx)            arenas for the parameters and gradients
 *   mlp_cuda_allocate(m, B, T)             activations, backward scratch, the token buffers
 *   mlp_cuda_set_parameters(m, host)       host fp32 (num_parameters) -> device (rounded to T)
 *   mlp_cuda_forward(m, in, tg, B, T, dl)  in, tg host (B, T) ids (tg NULL: logits only); returns
 *                                          the mean loss; with dl != 0 leaves dlogits in logits
 *   mlp_cuda_backward(m)                   accumulates into m->grads (after a forward with dl != 0)
 *   mlp_cuda_zero_grad(m), mlp_cuda_free(m)
 */
#ifndef LLMC_CUDA_MLP_CUH
#define LLMC_CUDA_MLP_CUH

#include <stdlib.h>
#include <string.h>

#include "llmc/models/mlp.h"
#include "llmc/cuda/cast.cuh"
#include "llmc/cuda/classifier.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/residual.cuh"
#include "llmc/cuda/rmsnorm.cuh"
#include "llmc/cuda/swiglu.cuh"

template <class T> struct MlpCudaT {
    MlpConfig cfg;
    const CudaContext *ctx;
    TensorSpec param_specs[MLP_NUM_PARAMETERS], act_specs[MLP_NUM_ACTIVATIONS];
    size_t num_parameters, act_bytes[MLP_NUM_ACTIVATIONS], act_total_bytes;
    T *params, *grads; /* device arenas laid out by the parameter table */
    void *acts;        /* device: the activation table, each tensor at act_bytes[i] */
    int B, T_;
    /* device: the encoder's zero position table and its gradient sink (T_, C); backward scratch as
     * llmc/cpu/mlp.h's: dres, dbuf_c (N, C), dbuf_f1 (N, 2F), dbuf_f2 (N, F); rmsnorm's partials */
    T *zero_pos, *dpos_sink, *dres, *dbuf_c, *dbuf_f1, *dbuf_f2;
    float *norm_scratch, *staging; /* staging: fp32 parameters on their way to T */
    int *d_inputs, *d_targets, *d_buckets; /* device (N), (N), encoder buckets */
    int *h_buckets, *h_work;               /* host: the buckets as built, sort scratch */
    EncoderBuckets buckets;
    float *h_losses; /* host (N) */
    float mean_loss;
};
typedef MlpCudaT<float> MlpCuda;

/* Tensor i's layer-l view (parameters and gradients in T; activations in T, ACT_STATS in fp32). */
template <class T> inline T *mlp_cuda_param_view(T *arena, const TensorSpec *specs, int i, int l) {
    return arena + specs[i].offset + (size_t)l * specs[i].layer_numel;
}
template <class U, class T> inline U *mlp_cuda_act_view(const MlpCudaT<T> *m, int i, int l) {
    return (U *)((char *)m->acts + m->act_bytes[i]) + (size_t)l * m->act_specs[i].layer_numel;
}
/* (MLP_CUDA_ACT is used inside the templates below: T is their storage type) */
#define MLP_CUDA_PARAM(m, name, l) mlp_cuda_param_view((m)->params, (m)->param_specs, MLP_P_##name, l)
#define MLP_CUDA_GRAD(m, name, l) mlp_cuda_param_view((m)->grads, (m)->param_specs, MLP_P_##name, l)
#define MLP_CUDA_ACT(m, name, l) mlp_cuda_act_view<T>(m, MLP_A_##name, l)
#define MLP_CUDA_STAT(m, name, l) mlp_cuda_act_view<float>(m, MLP_A_##name, l)
#define MLP_CUDA_BLOCK_INPUT(m, l) ((l) == 0 ? MLP_CUDA_ACT(m, encoded, 0) : MLP_CUDA_ACT(m, residual, (l) - 1))

template <class U> inline U *mlp_cuda_alloc(size_t n) {
    U *p = NULL;
    cudaCheck(cudaMalloc(&p, n * sizeof(U)));
    cudaCheck(cudaMemset(p, 0, n * sizeof(U)));
    return p;
}

template <class T> inline void mlp_cuda_build(MlpCudaT<T> *m, const MlpConfig *cfg, const CudaContext *ctx) {
    const char *bad = mlp_config_validate(cfg);
    if (bad) llmc_die("invalid MLP configuration: %s", bad);
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ctx = ctx;
    m->num_parameters = mlp_parameter_specs(cfg, m->param_specs);
    m->params = mlp_cuda_alloc<T>(m->num_parameters);
    m->grads = mlp_cuda_alloc<T>(m->num_parameters);
}

template <class T> inline void mlp_cuda_allocate(MlpCudaT<T> *m, int B, int T_) {
    const ModelConfig *c = &m->cfg.base;
    if (T_ > c->max_seq_len) llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T_, c->max_seq_len);
    if (m->acts) llmc_die("mlp_cuda_allocate: the model is already allocated");
    const size_t N = (size_t)B * T_, C = (size_t)c->channels, F = (size_t)c->ffn_hidden;
    m->B = B, m->T_ = T_;
    mlp_activation_specs(&m->cfg, B, T_, m->act_specs);
    m->act_total_bytes = 0;
    for (int i = 0; i < MLP_NUM_ACTIVATIONS; i++) {
        m->act_bytes[i] = m->act_total_bytes;
        const size_t es = m->act_specs[i].kind == ACT_STATS ? sizeof(float) : sizeof(T);
        m->act_total_bytes += (m->act_specs[i].numel * es + 255) / 256 * 256;
    }
    m->acts = mlp_cuda_alloc<char>(m->act_total_bytes);
    m->zero_pos = mlp_cuda_alloc<T>((size_t)T_ * C);
    m->dpos_sink = mlp_cuda_alloc<T>((size_t)T_ * C);
    m->dres = mlp_cuda_alloc<T>(N * C);
    m->dbuf_c = mlp_cuda_alloc<T>(N * C);
    m->dbuf_f1 = mlp_cuda_alloc<T>(N * 2 * F);
    m->dbuf_f2 = mlp_cuda_alloc<T>(N * F);
    m->norm_scratch = mlp_cuda_alloc<float>(rmsnorm_backward_scratch_floats((int)N, (int)C));
    cudaCheck(cudaMalloc(&m->d_inputs, N * sizeof(int)));
    cudaCheck(cudaMalloc(&m->d_targets, N * sizeof(int)));
    cudaCheck(cudaMalloc(&m->d_buckets, encoder_buckets_capacity((int)N) * sizeof(int)));
    m->h_buckets = (int *)mallocCheck(encoder_buckets_capacity((int)N) * sizeof(int), "encoder buckets");
    m->h_work = (int *)mallocCheck(N * sizeof(int), "encoder bucket scratch");
    m->h_losses = (float *)mallocCheck(N * sizeof(float), "losses");
}

template <class T> inline void mlp_cuda_set_parameters(MlpCudaT<T> *m, const float *host) {
    if (!m->staging) m->staging = mlp_cuda_alloc<float>(m->num_parameters);
    cudaCheck(cudaMemcpy(m->staging, host, m->num_parameters * sizeof(float), cudaMemcpyHostToDevice));
    cast_copy(m->params, (const float *)m->staging, m->num_parameters, m->ctx->stream);
    cudaCheck(cudaStreamSynchronize(m->ctx->stream));
}

template <class T> inline void mlp_cuda_zero_grad(MlpCudaT<T> *m) {
    cudaCheck(cudaMemsetAsync(m->grads, 0, m->num_parameters * sizeof(T), m->ctx->stream));
    if (m->dpos_sink) cudaCheck(cudaMemsetAsync(m->dpos_sink, 0, (size_t)m->T_ * m->cfg.base.channels * sizeof(T), m->ctx->stream));
}

/* the token ids to the device, checked, and (for the backward) grouped by token */
template <class T> inline void mlp_cuda_upload_tokens(MlpCudaT<T> *m, const int *inputs, const int *targets, int N) {
    const int V = m->cfg.base.vocab_size;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            llmc_die("token id at position %d is outside the vocabulary [0, %d)", i, V);
    cudaStream_t s = m->ctx->stream;
    cudaCheck(cudaMemcpyAsync(m->d_inputs, inputs, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    if (targets) cudaCheck(cudaMemcpyAsync(m->d_targets, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, s));
    cudaCheck(cudaStreamSynchronize(s)); /* h_buckets is rewritten below while a copy may read it */
    m->buckets.num_tokens = encoder_buckets_build(m->h_buckets, m->h_work, inputs, N, V);
    m->buckets.d_ints = m->d_buckets;
    cudaCheck(cudaMemcpyAsync(m->d_buckets, m->h_buckets, encoder_buckets_capacity(N) * sizeof(int),
                              cudaMemcpyHostToDevice, s));
}

template <class T> inline float mlp_cuda_forward(MlpCudaT<T> *m, const int *inputs, const int *targets, int B, int T_, float dloss) {
    const ModelConfig *c = &m->cfg.base;
    if (!m->acts) llmc_die("mlp_cuda_forward: call mlp_cuda_allocate first");
    if (T_ != m->T_ || B != m->B) llmc_die("mlp_cuda_forward: batch (%d, %d) is not the allocated (%d, %d)", B, T_, m->B, m->T_);
    const int C = c->channels, L = c->num_layers, F = c->ffn_hidden, V = c->vocab_size, Vp = c->padded_vocab_size;
    const int N = B * T_;
    const float eps = m->cfg.norm_eps;
    cudaStream_t s = m->ctx->stream;
    mlp_cuda_upload_tokens(m, inputs, targets, N);
    encoder_forward(MLP_CUDA_ACT(m, encoded, 0), m->d_inputs, MLP_CUDA_PARAM(m, wte, 0), m->zero_pos, B, T_, C, s);
    for (int l = 0; l < L; l++) { /* residual_l = input + swiglu(ln @ fcw^T) @ fcprojw^T */
        T *input = MLP_CUDA_BLOCK_INPUT(m, l), *ln = MLP_CUDA_ACT(m, ln, l), *fch = MLP_CUDA_ACT(m, fch, l);
        T *fch_swiglu = MLP_CUDA_ACT(m, fch_swiglu, l), *out = MLP_CUDA_ACT(m, residual, l);
        rmsnorm_forward(ln, MLP_CUDA_STAT(m, ln_rstd, l), input, MLP_CUDA_PARAM(m, lnw, l), N, C, eps, s);
        matmul_forward(fch, ln, MLP_CUDA_PARAM(m, fcw, l), (const T *)NULL, N, C, 2 * F, m->ctx);
        swiglu_forward(fch_swiglu, fch, N, F, s);
        matmul_forward(out, fch_swiglu, MLP_CUDA_PARAM(m, fcprojw, l), (const T *)NULL, N, F, C, m->ctx);
        residual_forward(out, out, input, (size_t)N * C, s);
    }
    rmsnorm_forward(MLP_CUDA_ACT(m, lnf, 0), MLP_CUDA_STAT(m, lnf_rstd, 0), MLP_CUDA_ACT(m, residual, L - 1),
                    MLP_CUDA_PARAM(m, lnfw, 0), N, C, eps, s);
    matmul_forward(MLP_CUDA_ACT(m, logits, 0), MLP_CUDA_ACT(m, lnf, 0), MLP_CUDA_PARAM(m, wte, 0), (const T *)NULL, N,
                   C, Vp, m->ctx);
    if (!targets) {
        cudaCheck(cudaStreamSynchronize(s));
        return m->mean_loss = 0.0f;
    }
    float *losses = MLP_CUDA_STAT(m, losses, 0);
    fused_classifier(MLP_CUDA_ACT(m, logits, 0), losses, m->d_targets, dloss, N, V, Vp, dloss != 0.0f, s);
    cudaCheck(cudaMemcpyAsync(m->h_losses, losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    float sum = 0.0f; /* in position order, as the CPU's */
    for (int i = 0; i < N; i++) sum += m->h_losses[i];
    return m->mean_loss = sum / N;
}

template <class T> inline void mlp_cuda_backward(MlpCudaT<T> *m) {
    const ModelConfig *c = &m->cfg.base;
    const int C = c->channels, L = c->num_layers, F = c->ffn_hidden, Vp = c->padded_vocab_size, N = m->B * m->T_;
    cudaStream_t s = m->ctx->stream;
    /* logits = lnf @ wte^T (dlogits already in the logits activation) */
    matmul_backward(m->dbuf_c, MLP_CUDA_GRAD(m, wte, 0), (T *)NULL, MLP_CUDA_ACT(m, logits, 0), MLP_CUDA_ACT(m, lnf, 0),
                    MLP_CUDA_PARAM(m, wte, 0), N, C, Vp, (float *)NULL, m->ctx);
    cudaCheck(cudaMemsetAsync(m->dres, 0, (size_t)N * C * sizeof(T), s));
    rmsnorm_backward(m->dres, MLP_CUDA_GRAD(m, lnfw, 0), m->dbuf_c, MLP_CUDA_ACT(m, residual, L - 1),
                     MLP_CUDA_PARAM(m, lnfw, 0), MLP_CUDA_STAT(m, lnf_rstd, 0), N, C, m->norm_scratch, s);
    for (int l = L - 1; l >= 0; l--) { /* dres: the gradient of residual_l, and (identity) of its input */
        T *input = MLP_CUDA_BLOCK_INPUT(m, l), *ln = MLP_CUDA_ACT(m, ln, l), *fch = MLP_CUDA_ACT(m, fch, l);
        T *fch_swiglu = MLP_CUDA_ACT(m, fch_swiglu, l);
        matmul_backward(m->dbuf_f2, MLP_CUDA_GRAD(m, fcprojw, l), (T *)NULL, m->dres, fch_swiglu,
                        MLP_CUDA_PARAM(m, fcprojw, l), N, F, C, (float *)NULL, m->ctx);
        swiglu_backward(m->dbuf_f1, fch, m->dbuf_f2, N, F, s);
        matmul_backward(m->dbuf_c, MLP_CUDA_GRAD(m, fcw, l), (T *)NULL, m->dbuf_f1, ln, MLP_CUDA_PARAM(m, fcw, l), N, C,
                        2 * F, (float *)NULL, m->ctx);
        rmsnorm_backward(m->dres, MLP_CUDA_GRAD(m, lnw, l), m->dbuf_c, input, MLP_CUDA_PARAM(m, lnw, l),
                         MLP_CUDA_STAT(m, ln_rstd, l), N, C, m->norm_scratch, s);
    }
    /* encoded = wte[inputs] (+ the zero table): each token's positions summed in order */
    encoder_backward(MLP_CUDA_GRAD(m, wte, 0), m->dpos_sink, m->dres, &m->buckets, m->B, m->T_, C, s);
    cudaCheck(cudaStreamSynchronize(s));
}

template <class T> inline void mlp_cuda_free(MlpCudaT<T> *m) {
    void *fs[] = {m->params, m->grads, m->acts, m->zero_pos, m->dpos_sink, m->dres, m->dbuf_c, m->dbuf_f1, m->dbuf_f2,
                  m->norm_scratch, m->staging};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) cudaCheck(cudaFree(fs[i]));
    int *is[] = {m->d_inputs, m->d_targets, m->d_buckets};
    for (size_t i = 0; i < sizeof is / sizeof is[0]; i++) cudaCheck(cudaFree(is[i]));
    free(m->h_buckets), free(m->h_work), free(m->h_losses);
    memset(m, 0, sizeof *m);
}

#endif
