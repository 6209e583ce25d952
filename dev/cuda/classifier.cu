/* classifier.cu - kernel lab for llmc/cuda/classifier.cuh: checks fused_classifier in eval form
 * (losses only, logits untouched) and training form (losses, dlogits in place, padded columns
 * zero) against llmc/cpu/classifier.h in bf16 and fp32, then times both.
 * Usage: build/dev/cuda/classifier [--small] [--B b] [--T t] [--V v] [--Vp vp] [--reps R]
 *   default B=8 T=1024 V=50257 Vp=50304 (GPT-2 124M); --small: B=2 T=37 V=1001 Vp=1024. */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cuda/classifier.cuh"

typedef struct {
    int N, V, Vp;
    float dloss;
    float *z;                  /* logits (N, Vp), bf16-rounded; padded columns hold 1e4 */
    int *y;                    /* targets (N) */
    float *loss_eval, *loss;   /* CPU losses, eval and training form (equal) */
    float *dz;                 /* CPU dlogits (N, Vp) */
} ClsCase;

template <class T> static void lab_classifier(const LabDevice *dev, const LabOptions *opt, ClsCase *c) {
    const char *tn = StorageInfo<T>::name;
    const int N = c->N, V = c->V, Vp = c->Vp;
    const size_t NV = (size_t)N * Vp;
    char name[160];
    T *z = lab_upload<T>(c->z, NV);
    int *y = lab_alloc<int>(N);
    float *losses = lab_alloc<float>(N);
    cudaCheck(cudaMemcpy(y, c->y, N * sizeof(int), cudaMemcpyHostToDevice));

    /* losses: fp32 on identical inputs; only expf/logf and the summation order differ */
    const LabTol tl = {1e-5, 1e-5};
    fused_classifier(z, losses, y, 0.0f, N, V, Vp, 0, 0);
    snprintf(name, sizeof name, "fused_classifier eval losses %s N=%d V=%d Vp=%d", tn, N, V, Vp);
    lab_check(name, losses, c->loss_eval, N, tl);
    snprintf(name, sizeof name, "fused_classifier eval leaves logits untouched %s", tn);
    lab_check(name, z, c->z, NV, 0.0, 0.0);
    fused_classifier(z, losses, y, c->dloss, N, V, Vp, 1, 0);
    snprintf(name, sizeof name, "fused_classifier losses %s", tn);
    lab_check(name, losses, c->loss, N, tl);
    /* dlogits = dloss (p - onehot): at the target p - 1 cancels, leaving a few fp32 ulps of
     * dloss absolute; bf16: plus one rounding (one ulp). Padded columns: the reference is 0 and
     * atol is 1e-6 dloss, so they must be (close to) 0 rather than the 1e4 logits. */
    snprintf(name, sizeof name, "fused_classifier dlogits %s", tn);
    lab_check(name, z, c->dz, NV, lab_tol<T>({1e-6 * c->dloss, 1e-4}, {1e-6 * c->dloss, lab_ulp<T>()}));

    const double E = sizeof(T);
    float fe = lab_time_ms([&] { fused_classifier(z, losses, y, 0.0f, N, V, Vp, 0, 0); }, opt->reps);
    float ft = lab_time_ms([&] { fused_classifier(z, losses, y, c->dloss, N, V, Vp, 1, 0); }, opt->reps);
    snprintf(name, sizeof name, "fused_classifier eval %s", tn);
    lab_report_bandwidth(dev, name, (double)N * V * E + 8.0 * N, fe); /* read logits once, targets, losses */
    snprintf(name, sizeof name, "fused_classifier train %s", tn);
    lab_report_bandwidth(dev, name, (double)N * V * E + NV * E + 8.0 * N, ft); /* + write dlogits */
    lab_free(z, y, losses);
}

int main(int argc, char **argv) {
    int B = 8, T = 1024, V = 50257, Vp = 50304;
    LabSize sizes[] = {{"B", &B, 2, "batch"}, {"T", &T, 37, "sequence length"}, {"V", &V, 1001, "vocabulary"},
                       {"Vp", &Vp, 1024, "padded vocabulary (row length)"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 8);
    if (Vp < V) llmc_die("--Vp must be at least --V");
    ClsCase c;
    c.N = B * T, c.V = V, c.Vp = Vp, c.dloss = 1.0f / (B * T);
    const size_t NV = (size_t)c.N * Vp;
    printf("(N = B*T = %d rows, dloss 1/N)\n", c.N);
    c.z = lab_host_normal(&r, NV, 0.0f, 3.0f);
    for (int i = 0; i < c.N; i++)
        for (int v = V; v < Vp; v++) c.z[(size_t)i * Vp + v] = 1e4f; /* padded columns must not count */
    lab_round<__nv_bfloat16>(c.z, NV);
    c.y = (int *)mallocCheck(c.N * sizeof(int), "targets");
    for (int i = 0; i < c.N; i++) c.y[i] = (int)(rng_u32(&r) % (uint32_t)V);
    c.y[0] = V - 1;
    c.loss_eval = lab_host_floats(c.N), c.loss = lab_host_floats(c.N), c.dz = lab_host_floats(NV);
    memcpy(c.dz, c.z, NV * sizeof(float));
    fused_classifier(c.dz, c.loss_eval, c.y, 0.0f, c.N, V, Vp, 0);
    fused_classifier(c.dz, c.loss, c.y, c.dloss, c.N, V, Vp, 1);
    lab_classifier<__nv_bfloat16>(&dev, &opt, &c);
    lab_classifier<float>(&dev, &opt, &c);
    free(c.z), free(c.y), free(c.loss_eval), free(c.loss), free(c.dz);
    return test_exit_code();
}
