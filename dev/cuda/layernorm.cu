/* layernorm.cu - kernel lab for llmc/cuda/layernorm.cuh: checks forward, the fused residual
 * form and backward against the CPU reference, then times them.
 * Usage: build/dev/cuda/layernorm [N C]   (default 8*1024 rows of 768) */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cuda/layernorm.cuh"

int main(int argc, char **argv) {
    int N = 8 * 1024, C = 768;
    if (argc == 3) N = atoi(argv[1]), C = atoi(argv[2]);
    cuda_require_device();
    typedef __nv_bfloat16 X;
    const size_t NC = (size_t)N * C;
    Rng r;
    rng_seed(&r, 2);
    float *x = (float *)malloc(NC * 4), *w = (float *)malloc(C * 4), *b = (float *)malloc(C * 4), *dy = (float *)malloc(NC * 4);
    rng_normal(&r, x, NC, 0, 1), rng_normal(&r, w, C, 1, 0.1f), rng_normal(&r, b, C, 0, 0.1f), rng_normal(&r, dy, NC, 0, 1);
    X *dx = lab_upload<X>(x, NC), *dw = lab_upload<X>(w, C), *db = lab_upload<X>(b, C), *ddy = lab_upload<X>(dy, NC), *dout, *ddx, *dgw, *dgb;
    float *mean, *rstd, *scratch;
    cudaCheck(cudaMalloc(&dout, NC * sizeof(X)));
    cudaCheck(cudaMalloc(&ddx, NC * sizeof(X)));
    cudaCheck(cudaMemset(ddx, 0, NC * sizeof(X)));
    cudaCheck(cudaMalloc(&dgw, C * sizeof(X)));
    cudaCheck(cudaMalloc(&dgb, C * sizeof(X)));
    cudaCheck(cudaMemset(dgw, 0, C * sizeof(X)));
    cudaCheck(cudaMemset(dgb, 0, C * sizeof(X)));
    cudaCheck(cudaMalloc(&mean, N * 4));
    cudaCheck(cudaMalloc(&rstd, N * 4));
    cudaCheck(cudaMalloc(&scratch, layernorm_backward_scratch_floats(N, C) * 4));
    float *out = (float *)malloc(NC * 4), *m = (float *)malloc(N * 4), *s = (float *)malloc(N * 4);
    float *gx = (float *)calloc(NC, 4), *gw = (float *)calloc(C, 4), *gb = (float *)calloc(C, 4);
    layernorm_forward(out, m, s, x, w, b, N, C);
    layernorm_backward(gx, gw, gb, dy, x, w, m, s, N, C);
    layernorm_forward(dout, mean, rstd, dx, dw, db, N, C, 0);
    layernorm_backward(ddx, dgw, dgb, ddy, dx, dw, mean, rstd, N, C, scratch, 0);
    printf("bf16 N=%d C=%d: max |diff| out %.3g, dinp %.3g, dweight %.3g\n", N, C, lab_max_abs_diff(dout, out, NC),
           lab_max_abs_diff(ddx, gx, NC), lab_max_abs_diff(dgw, gw, C));
    float f = lab_time_ms([&] { layernorm_forward(dout, mean, rstd, dx, dw, db, N, C, 0); }, 20);
    float fb = lab_time_ms([&] { fused_residual_layernorm_forward(ddx, dout, mean, rstd, ddx, dx, dw, db, N, C, 0); }, 20);
    float bw = lab_time_ms([&] { layernorm_backward(ddx, dgw, dgb, ddy, dx, dw, mean, rstd, N, C, scratch, 0); }, 20);
    double gb_fwd = 2.0 * NC * sizeof(X) / 1e9;
    printf("forward %.3f ms (%.0f GB/s), fused residual %.3f ms, backward %.3f ms\n", f, gb_fwd / (f / 1e3), fb, bw);
    return 0;
}
