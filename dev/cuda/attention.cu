/* attention.cu - kernel lab for llmc/cuda/attention.cuh: checks the flash attention forward
 * (out) and backward (dinp, which also exercises the saved logsumexp) against
 * llmc/cpu/attention.h, then times them: bf16 on the FlashAttention-2-class kernels (what the
 * trainer runs for head sizes 64 and 128), bf16 on the wmma tensor-core kernels and on the
 * CUDA-core kernels (for the ratios), and fp32.
 * Usage: build/dev/cuda/attention [--small] [--B b] [--T t] [--C c] [--NH nh] [--reps R]
 *   default B=8 T=1024 C=768 NH=12 (GPT-2 124M); --small: B=2 T=67 C=128 NH=2 (HS 64). */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/attention.h"
#include "llmc/cuda/attention.cuh"

enum LabKernel { LAB_FA2, LAB_WMMA, LAB_SIMT };

template <class T>
static void lab_attention(const LabDevice *dev, const LabOptions *opt, float *qkv, float *dy, const float *out_ref,
                          const float *dinp_ref, int B, int T_, int C, int NH, LabKernel kernel) {
    const char *tn = sizeof(T) == 4          ? "fp32 (CUDA cores)"
                     : kernel == LAB_SIMT     ? "bf16 (CUDA cores)"
                     : kernel == LAB_WMMA     ? "bf16 (wmma tensor cores)"
                                              : "bf16 (FA2: mma.sync, ldmatrix, cp.async)";
    /* the kernels by name: with USE_CUDNN=1 the generic attention_forward would be cuDNN's */
    auto fwd_fn = [&](T *o, float *l, const T *in) {
        if constexpr (sizeof(T) == 2) {
            if (kernel == LAB_FA2) return attention_forward_fa2(o, l, in, B, T_, NH, NH, C / NH, (cudaStream_t)0);
            if (kernel == LAB_WMMA) return attention_forward_tc(o, l, in, B, T_, C, NH, NH, 0);
        }
        attention_forward_simt(o, l, in, B, T_, C, NH, NH, 0);
    };
    auto bwd_fn = [&](T *di, const T *dy_, const T *in, const T *o, const float *l, float *sc) {
        if constexpr (sizeof(T) == 2) {
            if (kernel == LAB_FA2) return attention_backward_fa2(di, dy_, in, o, l, B, T_, NH, NH, C / NH, sc, (cudaStream_t)0);
            if (kernel == LAB_WMMA) return attention_backward_tc(di, dy_, in, o, l, B, T_, C, NH, NH, sc, 0);
        }
        attention_backward_simt(di, dy_, in, o, l, B, T_, C, NH, NH, sc, 0);
    };
    const size_t N = (size_t)B * T_, NBHT = (size_t)B * NH * T_;
    char name[160];
    T *d_qkv = lab_upload<T>(qkv, N * 3 * C), *d_dy = lab_upload<T>(dy, N * C), *d_out = lab_alloc<T>(N * C);
    T *d_dinp = lab_alloc<T>(N * 3 * C);
    float *lse = lab_alloc<float>(NBHT), *scratch = lab_alloc<float>(attention_backward_scratch_floats(N, NH, C / NH));
    cudaCheck(cudaMemset(d_dinp, 0x5A, N * 3 * C * sizeof(T))); /* overwritten: start from garbage */

    fwd_fn(d_out, lse, d_qkv);
    /* fp32: online vs two-pass softmax, order effects only; bf16: one rounding of O(1) */
    snprintf(name, sizeof name, "attention_forward out %s B=%d T=%d C=%d NH=%d", tn, B, T_, C, NH);
    lab_check(name, d_out, out_ref, N * C, lab_tol<T>({2e-5, 1e-4}, {1e-2, 8e-3}));
    bwd_fn(d_dinp, d_dy, d_qkv, d_out, lse, scratch);
    /* fp32: recomputed probabilities, other order; bf16: the rounded out enters D = dout . out,
     * and sums over up to T terms are rounded once */
    snprintf(name, sizeof name, "attention_backward dinp %s", tn);
    lab_check(name, d_dinp, dinp_ref, N * 3 * C, lab_tol<T>({1e-4, 1e-4}, {3e-2, 1.6e-2}));

    float fwd = lab_time_ms([&] { fwd_fn(d_out, lse, d_qkv); }, opt->reps);
    float bwd = lab_time_ms([&] { bwd_fn(d_dinp, d_dy, d_qkv, d_out, lse, scratch); }, opt->reps);
    /* causal: q.k and p.v over the lower triangle, 2 flops per multiply-add each; the backward
     * needs 5 such products (s, dp, dv, dq, dk): 2.5x, counted as useful work (the tensor-core
     * dq kernel recomputes s and dp, 7 products in all). Percentages are of the bf16 tensor
     * peak for 16-bit types, of the fp32 peak for fp32. */
    const double flops = 2.0 * 2.0 * B * NH * ((double)T_ * (T_ + 1) / 2) * (C / NH);
    const double peak = sizeof(T) == 4 ? dev->fp32_tflops : dev->bf16_tflops;
    snprintf(name, sizeof name, "attention_forward %s", tn);
    lab_report_flops(dev, name, flops, fwd, peak);
    snprintf(name, sizeof name, "attention_backward %s", tn);
    lab_report_flops(dev, name, 2.5 * flops, bwd, peak);
    lab_free(d_qkv, d_dy, d_out, d_dinp, lse, scratch);
}

int main(int argc, char **argv) {
    int B = 8, T = 1024, C = 768, NH = 12;
    LabSize sizes[] = {{"B", &B, 2, "batch"}, {"T", &T, 67, "sequence length"}, {"C", &C, 128, "channels"},
                       {"NH", &NH, 2, "heads (C/NH in 16, 32, 64, 128)"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 1);
    const size_t N = (size_t)B * T;
    float *qkv = lab_bf16_normal(&r, N * 3 * C, 0.0f, 1.0f), *dy = lab_bf16_normal(&r, N * C, 0.0f, 1.0f);
    float *out = lab_host_floats(N * C), *dinp = lab_host_floats(N * 3 * C);
    float *att = lab_host_floats((size_t)B * NH * T * T);
    attention_forward(out, att, qkv, B, T, NH, NH, C / NH); /* GPT-2: NKV == NH */
    attention_backward(dinp, dy, qkv, att, B, T, NH, NH, C / NH);
    free(att);
    if (attention_fa2_supports(C / NH)) lab_attention<__nv_bfloat16>(&dev, &opt, qkv, dy, out, dinp, B, T, C, NH, LAB_FA2);
    lab_attention<__nv_bfloat16>(&dev, &opt, qkv, dy, out, dinp, B, T, C, NH, LAB_WMMA);
    lab_attention<__nv_bfloat16>(&dev, &opt, qkv, dy, out, dinp, B, T, C, NH, LAB_SIMT);
    lab_attention<float>(&dev, &opt, qkv, dy, out, dinp, B, T, C, NH, LAB_SIMT);
    free(qkv), free(dy), free(out), free(dinp);
    return test_exit_code();
}
