/* attention.cu - kernel lab for llmc/cuda/attention.cuh: checks the flash attention forward
 * and backward against the CPU reference at one shape, then times them.
 * Usage: build/dev/cuda/attention [B T C NH]   (default GPT-2 124M: 8 1024 768 12) */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/attention.h"
#include "llmc/cuda/attention.cuh"

int main(int argc, char **argv) {
    int B = 8, T = 1024, C = 768, NH = 12;
    if (argc == 5) B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), NH = atoi(argv[4]);
    cuda_require_device();
    typedef __nv_bfloat16 X;
    const size_t N = (size_t)B * T;
    Rng r;
    rng_seed(&r, 1);
    float *qkv = (float *)malloc(N * 3 * C * 4), *dy = (float *)malloc(N * C * 4);
    rng_normal(&r, qkv, N * 3 * C, 0, 1);
    rng_normal(&r, dy, N * C, 0, 1);
    X *dqkv = lab_upload<X>(qkv, N * 3 * C), *ddy = lab_upload<X>(dy, N * C), *dout, *ddinp;
    float *lse, *scratch;
    cudaCheck(cudaMalloc(&dout, N * C * sizeof(X)));
    cudaCheck(cudaMalloc(&ddinp, N * 3 * C * sizeof(X)));
    cudaCheck(cudaMalloc(&lse, (size_t)B * NH * T * 4));
    cudaCheck(cudaMalloc(&scratch, (size_t)B * NH * T * 4));
    float *out = (float *)malloc(N * C * 4), *att = (float *)malloc((size_t)B * NH * T * T * 4), *dinp = (float *)malloc(N * 3 * C * 4);
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dinp, dy, qkv, att, B, T, C, NH);
    attention_forward(dout, lse, dqkv, B, T, C, NH, 0);
    attention_backward(ddinp, ddy, dqkv, dout, lse, B, T, C, NH, scratch, 0);
    printf("bf16 B=%d T=%d C=%d NH=%d: max |diff| out %.3g, dinp %.3g\n", B, T, C, NH,
           lab_max_abs_diff(dout, out, N * C), lab_max_abs_diff(ddinp, dinp, N * 3 * C));
    float fwd = lab_time_ms([&] { attention_forward(dout, lse, dqkv, B, T, C, NH, 0); }, 10);
    float bwd = lab_time_ms([&] { attention_backward(ddinp, ddy, dqkv, dout, lse, B, T, C, NH, scratch, 0); }, 10);
    double flops = 2.0 * 2.0 * B * NH * (double)T * T / 2 * (C / NH); /* causal half */
    printf("forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s, 2.5x forward flops)\n", fwd,
           flops / fwd / 1e9, bwd, 2.5 * flops / bwd / 1e9);
    return 0;
}
