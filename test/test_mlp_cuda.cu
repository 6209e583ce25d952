/*
 * test_mlp_cuda.cu - the MLP test architecture on the CUDA runtime (llmc/cuda/cudamodel.cuh through
 * its entry mlp_cuda_arch, llmc/cuda/mlp.cuh) against its CPU block sequence (llmc/cpu/mlp.c) on
 * the same random parameters and batches (through the cudasim harness on machines without a GPU,
 * natively with nvcc):
 *   -e mlp:d2 builds the MLP's entry with the CPU's parameter count; for a config of the test's
 *   own (cudamodel_build_config): the logits of the inference forward (the runtime's LM head),
 *   the loss and every gradient tensor of one step, two CUDA runs bit-identical, and a 5-step
 *   AdamW trajectory (CPU AdamW on the CPU model, the runtime's gradient norm and device AdamW,
 *   cudamodel_update, on the CUDA one) with the parameters after it.
 * Two shapes: L 2, C 64, F 256, V 97 (the 16-byte packed kernels) and L 3, C 50, F 30, V 61
 * (C and F not whole packs: the element-wise kernels). fp32 (TF32 off) and bf16 (fp32 master
 * weights for the device AdamW); tolerances as test_gpt.cu's (below, with reasons). bf16 checks the
 * losses of the trajectory, not the parameters after it (each bf16 step rounds them stochastically).
 * Usage: test_mlp_cuda; exits non-zero if any check fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/rng.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/mlp.h"
#include "llmc/cuda/cast.cuh"
#include "llmc/cuda/cudamodel.cuh"
#include "llmc/cuda/mlp.cuh"
#include "test/testing.h"

enum { STEPS = 5 };
static const float LR = 1e-3f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f, CLIP = 1.0f;

typedef struct {
    MlpConfig cfg;
    int B, T;
    float *init;           /* the random parameters both models start from */
    int *inputs, *targets; /* 3 batches of B*T */
    char tag[48];
} Setup;

static void setup_init(Setup *s, int L, int C, int F, int V, unsigned long long seed) {
    memset(s, 0, sizeof *s);
    ModelConfig *b = &s->cfg.base;
    b->max_seq_len = 64, b->vocab_size = V, b->padded_vocab_size = (V + 127) / 128 * 128;
    b->num_layers = L, b->num_heads = b->num_kv_heads = 1, b->channels = C, b->ffn_hidden = F;
    s->cfg.norm_eps = 1e-5f;
    s->B = 2, s->T = 16;
    snprintf(s->tag, sizeof s->tag, "L %d C %d F %d V %d", L, C, F, V);
    const size_t n = mlp_parameter_specs(&s->cfg, NULL), N = (size_t)3 * s->B * s->T;
    s->init = (float *)mallocCheck(n * sizeof(float), "init");
    mlp_init_parameters(&s->cfg, s->init, seed);
    s->inputs = (int *)mallocCheck(N * sizeof(int), "inputs");
    s->targets = (int *)mallocCheck(N * sizeof(int), "targets");
    Rng rng;
    rng_seed(&rng, seed + 1);
    for (size_t i = 0; i < N; i++) s->inputs[i] = (int)(rng_u32(&rng) % V), s->targets[i] = (int)(rng_u32(&rng) % V);
}

typedef struct {
    double logits_atol, logits_rtol, grad_frac, loss_atol;
} Tol;
/* fp32: the same math in other summation orders and the online softmax (~1e-6 relative); bf16:
 * an 8-bit mantissa, ~10 roundings between the loss and a weight gradient (test_gpt.cu's values) */
template <class Real> static Tol tol_of(void) { return sizeof(Real) == 4 ? Tol{1e-5, 1e-5, 2e-4, 1e-5} : Tol{6e-2, 2e-2, 8e-2, 2e-2}; }

static const int *batch_in(const Setup *s, int k) { return s->inputs + (size_t)k * s->B * s->T; }
static const int *batch_tg(const Setup *s, int k) { return s->targets + (size_t)k * s->B * s->T; }

static void cpu_model(const Setup *s, MlpModel *m) {
    mlp_build(m, &s->cfg);
    memcpy(m->params_memory, s->init, m->num_parameters * sizeof(float));
    mlp_allocate(m, s->B, s->T);
}

/* The runtime's model of s->cfg in Real, from s->init, allocated for training at (B, T). */
template <class Real> static CudaModel *cuda_model(const Setup *s, CudaContext *ctx) {
    CudaModel *m = (CudaModel *)callocCheck(1, sizeof *m, "CUDA model");
    ArchConfig ac;
    memset(&ac, 0, sizeof ac);
    ac.arch = &mlp_arch;
    *arch_config_as(&ac, MlpConfig) = s->cfg;
    const Precision p = sizeof(Real) == 4 ? PRECISION_FP32 : PRECISION_BF16;
    cudamodel_build_config(m, &ac, s->tag, 1, p, ctx, 1); /* (bf16: fp32 master weights) */
    memcpy(m->host_params, s->init, m->num_parameters * sizeof(float));
    cudamodel_allocate(m, s->B, s->T, 0, -1, 1);
    return m;
}

static void cuda_model_free(CudaModel *m) {
    cudamodel_free(m);
    free(m);
}

/* n elements of T on the device as fp32 on the host (malloc'd) */
template <class Real> static float *to_host(const Real *d, size_t n, cudaStream_t stream) {
    float *tmp = NULL, *h = (float *)mallocCheck(n * sizeof(float), "host copy");
    cudaCheck(cudaMalloc(&tmp, n * sizeof(float)));
    cast_copy(tmp, d, n, stream);
    cudaCheck(cudaStreamSynchronize(stream));
    cudaCheck(cudaMemcpy(h, tmp, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(tmp));
    return h;
}

template <class Real> static void name_of(char *out, size_t len, const char *what, const Setup *s) {
    snprintf(out, len, "%s [%s, %s]", what, s->tag, StorageInfo<Real>::name);
}

/* logits, loss, every gradient of one step; two CUDA runs bit-identical */
template <class Real> static void compare_step(const Setup *s, CudaContext *ctx) {
    const Tol tol = tol_of<Real>();
    char name[160];
    MlpModel cpu;
    cpu_model(s, &cpu);
    const int B = s->B, T = s->T, Vp = s->cfg.base.padded_vocab_size, N = B * T;
    mlp_forward(&cpu, batch_in(s, 0), NULL, B, T, 0.0f);
    float *ref_logits = (float *)mallocCheck((size_t)N * Vp * sizeof(float), "logits");
    memcpy(ref_logits, tensor_layer(cpu.acts_memory, &cpu.act_specs[MLP_A_logits], 0), (size_t)N * Vp * sizeof(float));
    mlp_zero_grad(&cpu);
    const float loss = mlp_forward(&cpu, batch_in(s, 0), batch_tg(s, 0), B, T, 1.0f / N);
    mlp_backward(&cpu, batch_in(s, 0), B, T);

    float *grads[2];
    for (int run = 0; run < 2; run++) {
        CudaModel *m = cuda_model<Real>(s, ctx);
        cudamodel_forward(m, batch_in(s, 0), NULL, B, T, 0.0f);
        if (run == 0) { /* the LM head, chunk by chunk */
            float *lg = (float *)mallocCheck((size_t)N * Vp * sizeof(float), "logits");
            for (int r0 = 0; r0 < N; r0 += m->head_rows) {
                const int rows = m->head_rows < N - r0 ? m->head_rows : N - r0;
                cudamodel_logits_rows(m, r0, rows);
                float *part = to_host((const Real *)m->acts.logits, (size_t)rows * Vp, ctx->stream);
                memcpy(lg + (size_t)r0 * Vp, part, (size_t)rows * Vp * sizeof(float));
                free(part);
            }
            name_of<Real>(name, sizeof name, "CUDA logits == CPU logits", s);
            test_close(name, lg, ref_logits, (size_t)N * Vp, tol.logits_atol, tol.logits_rtol);
            free(lg);
        }
        cudamodel_zero_grad(m);
        const float lgpu = cudamodel_forward(m, batch_in(s, 0), batch_tg(s, 0), B, T, 1.0f / N);
        cudamodel_backward(m, batch_in(s, 0), B, T);
        if (run == 0) {
            name_of<Real>(name, sizeof name, "CUDA loss == CPU loss", s);
            test_close(name, &lgpu, &loss, 1, tol.loss_atol, 0);
        }
        grads[run] = to_host((const Real *)m->grads_memory, m->num_parameters, ctx->stream);
        cuda_model_free(m);
    }
    for (int i = 0; i < MLP_NUM_PARAMETERS; i++) {
        const TensorSpec *ts = &cpu.param_specs[i];
        const float *ref = cpu.grads_memory + ts->offset;
        float mx = 0.0f;
        for (size_t j = 0; j < ts->numel; j++) mx = fmaxf(mx, fabsf(ref[j]));
        char what[96];
        snprintf(what, sizeof what, "CUDA gradient %s %s == CPU", ts->name, ts->shape);
        name_of<Real>(name, sizeof name, what, s);
        test_close(name, grads[0] + ts->offset, ref, ts->numel, tol.grad_frac * mx + 1e-12, tol.grad_frac);
    }
    name_of<Real>(name, sizeof name, "two CUDA runs give bit-identical gradients", s);
    test_report(memcmp(grads[0], grads[1], cpu.num_parameters * sizeof(float)) == 0, name, "");
    free(grads[0]), free(grads[1]), free(ref_logits);
    mlp_free(&cpu);
}

/* STEPS AdamW steps over the 3 batches on both models: losses and the parameters after them */
template <class Real> static void compare_trajectory(const Setup *s, CudaContext *ctx) {
    char name[160];
    MlpModel cpu;
    cpu_model(s, &cpu);
    CudaModel *m = cuda_model<Real>(s, ctx); /* 16-bit parameters: AdamW updates fp32 master weights */
    const size_t n = cpu.num_parameters;
    const int N = s->B * s->T;
    float *cm = (float *)callocCheck(n, sizeof(float), "m"), *cv = (float *)callocCheck(n, sizeof(float), "v");
    float got[STEPS], ref[STEPS];
    for (int t = 1; t <= STEPS; t++) {
        const int *in = batch_in(s, t % 3), *tg = batch_tg(s, t % 3);
        mlp_zero_grad(&cpu);
        ref[t - 1] = mlp_forward(&cpu, in, tg, s->B, s->T, 1.0f / N);
        mlp_backward(&cpu, in, s->B, s->T);
        const float norm = (float)sqrt(global_norm_squared(cpu.grads_memory, n));
        const float scale = norm > CLIP ? CLIP / norm : 1.0f;
        cudamodel_zero_grad(m);
        got[t - 1] = cudamodel_forward(m, in, tg, s->B, s->T, 1.0f / N);
        cudamodel_backward(m, in, s->B, s->T);
        const float gnorm = cudamodel_grad_norm(m);
        const float gscale = gnorm > CLIP ? CLIP / gnorm : 1.0f;
        for (int i = 0; i < MLP_NUM_PARAMETERS; i++) {
            const TensorSpec *ts = &cpu.param_specs[i];
            adamw_update(cpu.params_memory + ts->offset, cpu.grads_memory + ts->offset, cm + ts->offset, cv + ts->offset,
                         ts->numel, LR, B1, B2, EPS, ts->decay ? WD : 0.0f, t, scale);
        }
        cudamodel_update(m, LR, B1, B2, EPS, WD, gscale, t);
        cudaCheck(cudaStreamSynchronize(ctx->stream));
    }
    name_of<Real>(name, sizeof name, "5-step AdamW losses: CUDA == CPU", s);
    test_close(name, got, ref, STEPS, sizeof(Real) == 4 ? 1e-4 : 3 * tol_of<Real>().loss_atol, 0);
    if (sizeof(Real) == 4) {
        cudamodel_sync_to_host(m);
        name_of<Real>(name, sizeof name, "parameters after 5 steps: CUDA == CPU", s);
        test_close(name, m->host_params, cpu.params_memory, n, 1e-5, 1e-4);
    }
    free(cm), free(cv);
    cuda_model_free(m);
    mlp_free(&cpu);
}

/* -e mlp:d2: the runtime picks the MLP's entry (archs.cuh) and the CPU's parameter count */
static void check_descriptor(CudaContext *ctx) {
    CudaModel *m = (CudaModel *)callocCheck(1, sizeof *m, "CUDA model");
    cudamodel_build(m, "mlp:d2", 1, PRECISION_FP32, ctx, 0);
    MlpConfig cfg;
    const int named = mlp_config_from_name(&cfg, "mlp:d2") == 0;
    test_report(named && m->arch == &mlp_cuda_arch && m->ac.arch == &mlp_arch &&
                    m->num_parameters == mlp_parameter_specs(&cfg, NULL) && m->head_index == MLP_P_wte,
                "cudamodel_build -e mlp:d2: the MLP's CUDA entry, the CPU's parameter count, the head tied to wte",
                "%s, %zu parameters, head %d", m->ac.arch ? m->ac.arch->name : "?", m->num_parameters, m->head_index);
    cuda_model_free(m);
}

int main(void) {
    CudaContext ctx;
    cuda_context_init(&ctx, 0, 0); /* TF32 off */
    check_descriptor(&ctx);
    const int shapes[][4] = {{2, 64, 256, 97}, {3, 50, 30, 61}};
    for (int i = 0; i < 2; i++) {
        Setup s;
        setup_init(&s, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 1234 + i);
        compare_step<float>(&s, &ctx);
        compare_trajectory<float>(&s, &ctx);
        compare_step<__nv_bfloat16>(&s, &ctx);
        compare_trajectory<__nv_bfloat16>(&s, &ctx);
        free(s.init), free(s.inputs), free(s.targets);
    }
    cuda_context_free(&ctx);
    return test_exit_code();
}
