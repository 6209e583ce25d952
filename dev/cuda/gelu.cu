/* gelu.cu - kernel lab for llmc/cuda/gelu.cuh: checks gelu_forward and gelu_backward (also in
 * place: out = inp, dinp = dout) against llmc/cpu/gelu.h in bf16 and fp32, then times them.
 * Usage: build/dev/cuda/gelu [--small] [--N n] [--reps R]
 *   default N = B*T*4C = 8*1024*3072 (the MLP activation of GPT-2 124M); --small: N = 100003. */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cuda/gelu.cuh"

/* Tolerances (|got - ref| <= atol + rtol |ref|):
 * fp32: rtol 1e-5: CUDA's tanhf and glibc's (vector) tanhf differ by a few ulp;
 *       atol 1e-6 forward: 1 + tanh(u) cancels for x << 0, so the absolute error is ~|x| ulp(1);
 *       atol 1e-5 backward: 1 - tanh^2 cancels likewise, times |x|^3-sized factors and dout.
 * bf16: the same atol, rtol = one bf16 ulp (2^-7): both fp32 results round to bf16 and may
 *       straddle a rounding boundary. */
template <class T> static double gelu_rtol(void) { return sizeof(T) == 4 ? 1e-5 : lab_ulp<T>(); }

template <class T>
static void lab_gelu(const LabDevice *dev, const LabOptions *opt, float *x, float *dy, const float *out_ref,
                     const float *dinp_ref, size_t N) {
    const char *tn = StorageInfo<T>::name;
    char name[128];
    T *d_x = lab_upload<T>(x, N), *d_dy = lab_upload<T>(dy, N), *d_out = lab_alloc<T>(N), *d_dinp = lab_alloc<T>(N);
    T *d_work = lab_alloc<T>(N);

    gelu_forward(d_out, d_x, N, 0);
    snprintf(name, sizeof name, "gelu_forward %s N=%zu", tn, N);
    lab_check(name, d_out, out_ref, N, 1e-6, gelu_rtol<T>());
    gelu_backward(d_dinp, d_x, d_dy, N, 0);
    snprintf(name, sizeof name, "gelu_backward %s N=%zu", tn, N);
    lab_check(name, d_dinp, dinp_ref, N, 1e-5, gelu_rtol<T>());

    /* in place: the contract allows out == inp and dinp == dout; results must be bit-identical */
    float *out_got = lab_download(d_out, N), *dinp_got = lab_download(d_dinp, N);
    cudaCheck(cudaMemcpy(d_work, d_x, N * sizeof(T), cudaMemcpyDeviceToDevice));
    gelu_forward(d_work, d_work, N, 0);
    snprintf(name, sizeof name, "gelu_forward in place %s (bit-identical)", tn);
    lab_check(name, d_work, out_got, N, 0.0, 0.0);
    cudaCheck(cudaMemcpy(d_work, d_dy, N * sizeof(T), cudaMemcpyDeviceToDevice));
    gelu_backward(d_work, d_x, d_work, N, 0);
    snprintf(name, sizeof name, "gelu_backward in place %s (bit-identical)", tn);
    lab_check(name, d_work, dinp_got, N, 0.0, 0.0);
    free(out_got);
    free(dinp_got);

    float fwd = lab_time_ms([&] { gelu_forward(d_out, d_x, N, 0); }, opt->reps);
    float bwd = lab_time_ms([&] { gelu_backward(d_dinp, d_x, d_dy, N, 0); }, opt->reps);
    snprintf(name, sizeof name, "gelu_forward %s", tn);
    lab_report_bandwidth(dev, name, 2.0 * N * sizeof(T), fwd); /* read inp, write out */
    snprintf(name, sizeof name, "gelu_backward %s", tn);
    lab_report_bandwidth(dev, name, 3.0 * N * sizeof(T), bwd); /* read inp, dout; write dinp */
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_dy));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_work));
}

int main(int argc, char **argv) {
    int N = 8 * 1024 * 3072;
    LabSize sizes[] = {{"N", &N, 100003, "elements"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 3);
    /* std 2: the tails (|x| up to ~10) reach the saturated and cancelling parts of tanh */
    float *x = lab_bf16_normal(&r, N, 0.0f, 2.0f), *dy = lab_bf16_normal(&r, N, 0.0f, 1.0f);
    float *out = lab_host_floats(N), *dinp = lab_host_floats(N);
    gelu_forward(out, x, N);
    gelu_backward(dinp, x, dy, N);
    lab_gelu<__nv_bfloat16>(&dev, &opt, x, dy, out, dinp, N);
    lab_gelu<float>(&dev, &opt, x, dy, out, dinp, N);
    free(x);
    free(dy);
    free(out);
    free(dinp);
    return test_exit_code();
}
