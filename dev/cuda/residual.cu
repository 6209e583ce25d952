/* residual.cu - kernel lab for llmc/cuda/residual.cuh: checks residual_forward (also in place,
 * out = inp1) against llmc/cpu/residual.h in bf16 and fp32, then times it.
 * Usage: build/dev/cuda/residual [--small] [--N n] [--reps R]
 *   default N = B*T*C = 8*1024*768 (GPT-2 124M residual stream); --small: N = 100003.
 * Exactness: one fp32 add of the same two values, rounded once to T: the GPU result must equal
 * the CPU's fp32 sum rounded to T bit for bit (tolerance 0). */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/residual.h"
#include "llmc/cuda/residual.cuh"

template <class T> static void lab_residual(const LabDevice *dev, const LabOptions *opt, float *a, float *b, const float *sum, size_t N) {
    const char *tn = StorageInfo<T>::name;
    char name[128];
    T *d_a = lab_upload<T>(a, N), *d_b = lab_upload<T>(b, N), *d_out = lab_alloc<T>(N);
    float *ref = lab_host_floats(N);
    memcpy(ref, sum, N * sizeof(float));
    lab_round<T>(ref, N);
    residual_forward(d_out, d_a, d_b, N, 0);
    snprintf(name, sizeof name, "residual_forward %s N=%zu (exact)", tn, N);
    lab_check(name, d_out, ref, N, 0.0, 0.0);
    cudaCheck(cudaMemcpy(d_out, d_a, N * sizeof(T), cudaMemcpyDeviceToDevice));
    residual_forward(d_out, d_out, d_b, N, 0);
    snprintf(name, sizeof name, "residual_forward in place (out = inp1) %s (exact)", tn);
    lab_check(name, d_out, ref, N, 0.0, 0.0);
    float ms = lab_time_ms([&] { residual_forward(d_out, d_a, d_b, N, 0); }, opt->reps);
    snprintf(name, sizeof name, "residual_forward %s", tn);
    lab_report_bandwidth(dev, name, 3.0 * N * sizeof(T), ms); /* read 2, write 1 */
    free(ref);
    lab_free(d_a, d_b, d_out);
}

int main(int argc, char **argv) {
    int N = 8 * 1024 * 768;
    LabSize sizes[] = {{"N", &N, 100003, "elements"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 5);
    /* different scales, so the sums need rounding */
    float *a = lab_bf16_normal(&r, N, 0.0f, 1.0f), *b = lab_bf16_normal(&r, N, 0.0f, 0.01f);
    float *sum = lab_host_floats(N);
    residual_forward(sum, a, b, N);
    lab_residual<__nv_bfloat16>(&dev, &opt, a, b, sum, N);
    lab_residual<float>(&dev, &opt, a, b, sum, N);
    free(a), free(b), free(sum);
    return test_exit_code();
}
