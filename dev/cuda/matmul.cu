/* matmul.cu - kernel lab for llmc/cuda/matmul.cuh (cuBLASLt + our bias-gradient kernels):
 * checks matmul_forward (with and without bias), matmul_forward_gelu (out and pre_gelu),
 * matmul_backward (dinp; dweight, dbias accumulating) and matmul_backward_dgelu against
 * llmc/cpu/matmul.h and llmc/cpu/gelu.h in bf16 and fp32 (TF32 off), then times them in TFLOP/s.
 * Usage: build/dev/cuda/matmul [--small] [--B b] [--T t] [--C c] [--OC oc] [--reps R]
 *   default B=8 T=1024 C=768 OC=3072 (GPT-2 124M fc layer; --C 3072 --OC 768 is fcproj);
 *   --small: B=2 T=300 C=64 OC=200 (N = 600: 3 bias-gradient chunks). The GELU epilogues need OC % 8 == 0 and C % 8 == 0. */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cuda/matmul.cuh"

typedef struct {
    int N, C, OC;
    float *x, *w, *b, *dy, *gw0, *gb0, *pre2; /* inputs (bf16-rounded); gw0, gb0: initial grads */
    float *out, *out_nb, *act;                /* forward with bias, without, gelu(out) */
    float *dinp, *gw, *gb, *dinp_dgelu;       /* backward; dinp * gelu'(pre2) */
} MmCase;

template <class T> static void lab_matmul(const LabDevice *dev, const LabOptions *opt, const CudaContext *ctx, MmCase *m) {
    const char *tn = StorageInfo<T>::name;
    const int N = m->N, C = m->C, OC = m->OC;
    const size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
    char name[160];
    T *x = lab_upload<T>(m->x, NC), *w = lab_upload<T>(m->w, OCC), *b = lab_upload<T>(m->b, OC);
    T *dy = lab_upload<T>(m->dy, NO), *pre2 = lab_upload<T>(m->pre2, NC), *out = lab_alloc<T>(NO), *pre = lab_alloc<T>(NO);
    T *dinp = lab_alloc<T>(NC), *gw = lab_upload<T>(m->gw0, OCC), *gb = lab_upload<T>(m->gb0, OC);
    float *scratch = lab_alloc<float>(matmul_backward_scratch_floats(N, OC));
    const T *no_bias = NULL;

    /* forward: fp32 (TF32 off) accumulates in another order over C terms of O(1/sqrt(C));
     * bf16: fp32 accumulation, one rounding of an O(1) output */
    const LabTol tf = lab_tol<T>({1e-5 * sqrt((double)C), 1e-5}, {2e-2, 8e-3});
    matmul_forward(out, x, w, b, N, C, OC, ctx);
    snprintf(name, sizeof name, "matmul_forward (bias) %s N=%d C=%d OC=%d", tn, N, C, OC);
    lab_check(name, out, m->out, NO, tf);
    matmul_forward(out, x, w, no_bias, N, C, OC, ctx);
    snprintf(name, sizeof name, "matmul_forward (no bias) %s", tn);
    lab_check(name, out, m->out_nb, NO, tf);
    if (OC % 8 == 0) {
        matmul_forward_gelu(out, pre, x, w, b, N, C, OC, ctx);
        snprintf(name, sizeof name, "matmul_forward_gelu pre_gelu %s", tn);
        lab_check(name, pre, m->out, NO, tf);
        /* cuBLASLt's GELU of the fp32 sum: not bit-identical to ours, plus one rounding */
        snprintf(name, sizeof name, "matmul_forward_gelu out %s", tn);
        lab_check(name, out, m->act, NO, lab_tol<T>({1e-5 * sqrt((double)C), 1e-5}, {3e-2, 1.6e-2}));
    }

    /* backward: dinp over OC terms (overwritten: starts as garbage); dweight, dbias over N rows
     * of O(1) terms on top of O(1) initial values */
    cudaCheck(cudaMemset(dinp, 0x3C, NC * sizeof(T)));
    matmul_backward(dinp, gw, gb, dy, x, w, N, C, OC, scratch, ctx);
    snprintf(name, sizeof name, "matmul_backward dinp %s", tn);
    lab_check(name, dinp, m->dinp, NC, lab_tol<T>({1e-5 * sqrt((double)OC), 1e-5}, {2e-2, 8e-3}));
    const LabTol tg = lab_tol<T>({1e-5 * sqrt((double)N), 1e-5}, {2e-2 * sqrt((double)N) / 4, 8e-3});
    snprintf(name, sizeof name, "matmul_backward dweight (accumulated) %s", tn);
    lab_check(name, gw, m->gw, OCC, tg);
    snprintf(name, sizeof name, "matmul_backward dbias (accumulated) %s", tn);
    lab_check(name, gb, m->gb, OC, tg);
    if (C % 8 == 0) {
        T *gw2 = lab_upload<T>(m->gw0, OCC), *gb2 = lab_upload<T>(m->gb0, OC);
        matmul_backward_dgelu(dinp, gw2, gb2, dy, x, w, pre2, N, C, OC, scratch, ctx);
        /* the epilogue multiplies the unrounded fp32 product by gelu'(pre) */
        snprintf(name, sizeof name, "matmul_backward_dgelu dinp %s", tn);
        lab_check(name, dinp, m->dinp_dgelu, NC, lab_tol<T>({2e-5 * sqrt((double)OC), 2e-5}, {3e-2, 1.6e-2}));
        snprintf(name, sizeof name, "matmul_backward_dgelu dweight (accumulated) %s", tn);
        lab_check(name, gw2, m->gw, OCC, tg);
        snprintf(name, sizeof name, "matmul_backward_dgelu dbias (accumulated) %s", tn);
        lab_check(name, gb2, m->gb, OC, tg);
        lab_free(gw2, gb2);
    }

    const double flops = 2.0 * N * C * OC, peak = sizeof(T) == 4 ? dev->fp32_tflops : dev->bf16_tflops;
    float f = lab_time_ms([&] { matmul_forward(out, x, w, b, N, C, OC, ctx); }, opt->reps, ctx->stream);
    snprintf(name, sizeof name, "matmul_forward (bias) %s", tn);
    lab_report_flops(dev, name, flops, f, peak);
    if (OC % 8 == 0) {
        float fg = lab_time_ms([&] { matmul_forward_gelu(out, pre, x, w, b, N, C, OC, ctx); }, opt->reps, ctx->stream);
        snprintf(name, sizeof name, "matmul_forward_gelu %s", tn);
        lab_report_flops(dev, name, flops, fg, peak);
    }
    float bw = lab_time_ms([&] { matmul_backward(dinp, gw, gb, dy, x, w, N, C, OC, scratch, ctx); }, opt->reps, ctx->stream);
    snprintf(name, sizeof name, "matmul_backward (+dbias) %s", tn);
    lab_report_flops(dev, name, 2.0 * flops, bw, peak);
    if (C % 8 == 0) {
        float bg = lab_time_ms([&] { matmul_backward_dgelu(dinp, gw, gb, dy, x, w, pre2, N, C, OC, scratch, ctx); },
                               opt->reps, ctx->stream);
        snprintf(name, sizeof name, "matmul_backward_dgelu %s", tn);
        lab_report_flops(dev, name, 2.0 * flops, bg, peak);
    }
    lab_free(x, w, b, dy, pre2, out, pre, dinp, gw, gb, scratch);
}

int main(int argc, char **argv) {
    int B = 8, T = 1024, C = 768, OC = 3072;
    LabSize sizes[] = {{"B", &B, 2, "batch"}, {"T", &T, 300, "sequence length"}, {"C", &C, 64, "input channels"},
                       {"OC", &OC, 200, "output channels"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 7);
    CudaContext ctx;
    cuda_context_init(&ctx, 0, 0); /* TF32 off: fp32 is compared tightly */
    MmCase m;
    m.N = B * T, m.C = C, m.OC = OC;
    const int N = m.N;
    const size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
    printf("(N = B*T = %d rows; CPU sgemm: %s)\n", N, llmc_sgemm_backend());
    m.x = lab_host_normal(&r, NC, 0.0f, 1.0f), m.w = lab_host_normal(&r, OCC, 0.0f, 1.0f / sqrtf((float)C));
    m.b = lab_host_normal(&r, OC, 0.0f, 0.5f), m.dy = lab_host_normal(&r, NO, 0.0f, 1.0f);
    m.gw0 = lab_host_normal(&r, OCC, 0.0f, 1.0f), m.gb0 = lab_host_normal(&r, OC, 0.0f, 1.0f);
    m.pre2 = lab_host_normal(&r, NC, 0.0f, 1.5f);
    float *all[] = {m.x, m.w, m.b, m.dy, m.gw0, m.gb0, m.pre2};
    size_t lens[] = {NC, OCC, (size_t)OC, NO, OCC, (size_t)OC, NC};
    for (int k = 0; k < 7; k++) lab_round<__nv_bfloat16>(all[k], lens[k]);
    m.out = lab_host_floats(NO), m.out_nb = lab_host_floats(NO), m.act = lab_host_floats(NO);
    matmul_forward(m.out, m.x, m.w, m.b, N, C, OC);
    matmul_forward(m.out_nb, m.x, m.w, NULL, N, C, OC);
    gelu_forward(m.act, m.out, NO);
    m.dinp = lab_host_floats(NC), m.gw = lab_host_floats(OCC), m.gb = lab_host_floats(OC), m.dinp_dgelu = lab_host_floats(NC);
    memcpy(m.gw, m.gw0, OCC * 4), memcpy(m.gb, m.gb0, OC * 4);
    matmul_backward(m.dinp, m.gw, m.gb, m.dy, m.x, m.w, N, C, OC);
    gelu_backward(m.dinp_dgelu, m.pre2, m.dinp, NC);
    lab_matmul<__nv_bfloat16>(&dev, &opt, &ctx, &m);
    lab_matmul<float>(&dev, &opt, &ctx, &m);
    cuda_context_free(&ctx);
    float *hfree[] = {m.x, m.w, m.b, m.dy, m.gw0, m.gb0, m.pre2, m.out, m.out_nb, m.act, m.dinp, m.gw, m.gb, m.dinp_dgelu};
    for (float *p : hfree) free(p);
    return test_exit_code();
}
