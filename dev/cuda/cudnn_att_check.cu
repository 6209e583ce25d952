/* cudnn_att_check.cu - kernel lab for llmc/cuda/cudnn_att.h: runs cuDNN's fused attention and
 * our own flash attention (llmc/cuda/attention.cuh, itself checked against the CPU by
 * dev/cuda/attention.cu) on the same inputs in bf16 and fp16, checks out, lse and dinp of the
 * cuDNN path against ours, then times both. "Ours" is called by name (attention_forward_tc /
 * attention_backward_tc): with USE_CUDNN=1 the generic attention_forward routes to cuDNN itself.
 * Build (needs the cudnn_frontend headers, mk/cudnn.mk) and run (needs an sm_80+ GPU):
 *   make build/dev/cuda/cudnn_att_check USE_CUDNN=1 && build/dev/cuda/cudnn_att_check
 * Usage: build/dev/cuda/cudnn_att_check [--small] [--B b] [--T t] [--C c] [--NH nh] [--reps R]
 *   default B=8 T=1024 C=768 NH=12 (GPT-2 124M); --small: B=2 T=67 C=128 NH=2 (HS 64).
 * Not part of `make cuda-lab` without USE_CUDNN=1, and never built through the cudasim harness
 * (it has no cuDNN). The tolerances below are estimates that no GPU run has confirmed yet. */
#include "dev/cuda/common_lab.h"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/cudnn_att.h"

template <class T>
static void lab_cudnn_attention(const LabDevice *dev, const LabOptions *opt, float *qkv, float *dy, int B, int T_,
                                int C, int NH) {
    const char *tn = StorageInfo<T>::name;
    const int is_fp16 = StorageInfo<T>::cuda_type == CUDA_R_16F;
    const size_t N = (size_t)B * T_, NBHT = (size_t)B * NH * T_;
    char name[200];
    T *d_qkv = lab_upload<T>(qkv, N * 3 * C), *d_dy = lab_upload<T>(dy, N * C);
    T *out_own = lab_alloc<T>(N * C), *out_dnn = lab_alloc<T>(N * C);
    T *dinp_own = lab_alloc<T>(N * 3 * C), *dinp_dnn = lab_alloc<T>(N * 3 * C);
    float *lse_own = lab_alloc<float>(NBHT), *lse_dnn = lab_alloc<float>(NBHT), *scratch = lab_alloc<float>(NBHT);
    /* every element of out, lse and dinp must be written: start both paths from garbage (a
     * huge bf16/fp16 and fp32 pattern, so an unwritten element fails the comparison) */
    cudaCheck(cudaMemset(out_dnn, 0x5A, N * C * sizeof(T)));
    cudaCheck(cudaMemset(lse_dnn, 0x5A, NBHT * sizeof(float)));
    cudaCheck(cudaMemset(dinp_dnn, 0x5A, N * 3 * C * sizeof(T)));
    cudaCheck(cudaMemset(dinp_own, 0x5A, N * 3 * C * sizeof(T)));

    /* the reference: our kernels (forward, then backward from their own out and lse) */
    attention_forward_tc(out_own, lse_own, d_qkv, B, T_, C, NH, NH, 0);
    attention_backward_tc(dinp_own, d_dy, d_qkv, out_own, lse_own, B, T_, C, NH, NH, scratch, 0);
    /* cuDNN, each direction from its own forward */
    attention_forward_cudnn(out_dnn, lse_dnn, d_qkv, B, T_, C, NH, NH, is_fp16, 0);
    attention_backward_cudnn(dinp_dnn, d_dy, d_qkv, out_dnn, lse_dnn, B, T_, C, NH, NH, is_fp16, 0);
    cudaCheck(cudaDeviceSynchronize());

    float *ref_out = lab_download(out_own, N * C), *ref_lse = lab_download(lse_own, NBHT);
    float *ref_dinp = lab_download(dinp_own, N * 3 * C);
    /* out: both multiply P, rounded to the storage type, by V on tensor cores, in other orders
     * and tilings: a relative 2^-9 (bf16) per probability on top of the one rounding of out */
    snprintf(name, sizeof name, "cudnn attention_forward out %s B=%d T=%d C=%d NH=%d vs ours", tn, B, T_, C, NH);
    lab_check(name, out_dnn, ref_out, N * C, 1.5e-2, 8e-3);
    /* lse: fp32 logsumexp of the same fp32 scores in another order; a wrong convention (log2,
     * unscaled scores) would be off by tens of percent */
    snprintf(name, sizeof name, "cudnn attention_forward lse %s (natural log of scaled scores)", tn);
    lab_check(name, lse_dnn, ref_lse, NBHT, 1e-3, 1e-4);
    /* dinp: sums over up to T terms of products of rounded P and dP; scaled by the tensor's rms
     * since dq, dk and dv cancel */
    const double rms = lab_rms(ref_dinp, N * 3 * C);
    snprintf(name, sizeof name, "cudnn attention_backward dinp %s vs ours (rms %.3g)", tn, rms);
    lab_check(name, dinp_dnn, ref_dinp, N * 3 * C, 3e-2 * rms, 2e-2);
    printf("      cuDNN workspace: %.1f MiB\n", cudnn_att_workspace_bytes() / 1048576.0);

    float fwd_own = lab_time_ms([&] { attention_forward_tc(out_own, lse_own, d_qkv, B, T_, C, NH, NH, 0); }, opt->reps);
    float fwd_dnn = lab_time_ms([&] { attention_forward_cudnn(out_dnn, lse_dnn, d_qkv, B, T_, C, NH, NH, is_fp16, 0); },
                                opt->reps);
    float bwd_own = lab_time_ms(
        [&] { attention_backward_tc(dinp_own, d_dy, d_qkv, out_own, lse_own, B, T_, C, NH, NH, scratch, 0); }, opt->reps);
    float bwd_dnn = lab_time_ms(
        [&] { attention_backward_cudnn(dinp_dnn, d_dy, d_qkv, out_dnn, lse_dnn, B, T_, C, NH, NH, is_fp16, 0); },
        opt->reps);
    /* causal flops as dev/cuda/attention.cu counts them: q.k and p.v over the lower triangle,
     * 2 flops per multiply-add; the backward 2.5x. Both against the tensor-core peak. */
    const double flops = 2.0 * 2.0 * B * NH * ((double)T_ * (T_ + 1) / 2) * (C / NH);
    const struct {
        const char *what;
        double flops;
        float ms;
    } rows[] = {{"forward ours", flops, fwd_own},
                {"forward cudnn", flops, fwd_dnn},
                {"backward ours", 2.5 * flops, bwd_own},
                {"backward cudnn", 2.5 * flops, bwd_dnn}};
    for (const auto &r : rows) {
        snprintf(name, sizeof name, "attention %s %s", r.what, tn);
        lab_report_flops(dev, name, r.flops, r.ms, dev->bf16_tflops);
    }
    printf("cuDNN speedup %s: forward %.2fx, backward %.2fx\n", tn, fwd_own / fwd_dnn, bwd_own / bwd_dnn);
    free(ref_out), free(ref_lse), free(ref_dinp);
    lab_free(d_qkv, d_dy, out_own, out_dnn, dinp_own, dinp_dnn, lse_own, lse_dnn, scratch);
}

int main(int argc, char **argv) {
    int B = 8, T = 1024, C = 768, NH = 12;
    LabSize sizes[] = {{"B", &B, 2, "batch"}, {"T", &T, 67, "sequence length"}, {"C", &C, 128, "channels"},
                       {"NH", &NH, 2, "heads (C/NH a multiple of 8 for cuDNN; 16, 32, 64 or 128 for ours)"}};
    LabOptions opt;
    lab_parse(argc, argv, "Checks and times llmc/cuda/cudnn_att.h (cuDNN SDPA) against llmc/cuda/attention.cuh.",
              sizes, 4, &opt);
    LabDevice dev = lab_device_init();
    const size_t N = (size_t)B * T;
    const uint64_t seed = 1;
    printf("cudnn attention lab: B=%d T=%d C=%d NH=%d, seed %llu, %d timed repeats\n", B, T, C, NH,
           (unsigned long long)seed, opt.reps);
    Rng r;
    rng_seed(&r, seed);
    float *qkv = lab_host_normal(&r, N * 3 * C, 0.0f, 1.0f), *dy = lab_host_normal(&r, N * C, 0.0f, 1.0f);
    /* lab_upload rounds these to each storage type in turn; both paths see the same device data */
    lab_round<__nv_bfloat16>(qkv, N * 3 * C);
    lab_round<__nv_bfloat16>(dy, N * C);
    lab_cudnn_attention<__nv_bfloat16>(&dev, &opt, qkv, dy, B, T, C, NH);
    lab_cudnn_attention<__half>(&dev, &opt, qkv, dy, B, T, C, NH);
    cudnn_att_destroy();
    free(qkv), free(dy);
    return test_exit_code();
}
