/* encoder.cu - kernel lab for llmc/cuda/encoder.cuh: checks encoder_forward and
 * encoder_backward (dwte through the host-built token buckets, dwpe) against
 * llmc/cpu/encoder.h in bf16 and fp32, then times them (and the host bucket build).
 * Usage: build/dev/cuda/encoder [--small] [--B b] [--T t] [--C c] [--V v] [--Vp vp] [--reps R]
 *   default B=8 T=1024 C=768 V=50257 Vp=50304 (GPT-2 124M); --small: B=3 T=37 C=72 V=301 Vp=320.
 *
 * Exactness: the kernels add in the CPU's order in fp32 and round once to T, so the GPU result
 * must equal the CPU's fp32 result rounded to T bit for bit (in fp32: equal), forward and
 * backward; the tolerance is 0 against the T-rounded reference. */
#include <time.h>

#include "dev/cuda/common_lab.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cuda/encoder.cuh"

typedef struct {
    int B, T, C, V, Vp;
    int *inp;                    /* (B, T) token ids */
    float *wte, *wpe, *dout;     /* (Vp, C), (T, C), (B, T, C) */
    float *dwte0, *dwpe0;        /* initial gradients (backward accumulates) */
    float *out, *dwte, *dwpe;    /* the CPU results (fp32) */
} EncCase;

static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ref rounded to T, then compared with tolerance 0 */
template <class T> static void check_exact(const char *name, const T *d, const float *ref, size_t n) {
    float *r = lab_host_floats(n);
    memcpy(r, ref, n * sizeof(float));
    lab_round<T>(r, n);
    lab_check(name, d, r, n, 0.0, 0.0);
    free(r);
}

template <class T> static void lab_encoder(const LabDevice *dev, const LabOptions *opt, EncCase *e) {
    const char *tn = StorageInfo<T>::name;
    const int N = e->B * e->T, C = e->C;
    const size_t NC = (size_t)N * C, VC = (size_t)e->Vp * C, TC = (size_t)e->T * C;
    char name[160];
    T *wte = lab_upload<T>(e->wte, VC), *wpe = lab_upload<T>(e->wpe, TC), *dout = lab_upload<T>(e->dout, NC);
    T *out = lab_alloc<T>(NC), *dwte = lab_upload<T>(e->dwte0, VC), *dwpe = lab_upload<T>(e->dwpe0, TC);
    int *inp = lab_alloc<int>(N);
    cudaCheck(cudaMemcpy(inp, e->inp, N * sizeof(int), cudaMemcpyHostToDevice));

    encoder_forward(out, inp, wte, wpe, e->B, e->T, C, 0);
    snprintf(name, sizeof name, "encoder_forward %s B=%d T=%d C=%d V=%d (exact)", tn, e->B, e->T, C, e->V);
    check_exact(name, out, e->out, NC);

    int *hb = (int *)mallocCheck(encoder_buckets_capacity(N) * sizeof(int), "buckets");
    int *work = (int *)mallocCheck(N * sizeof(int), "bucket scratch");
    double t0 = wall_ms();
    EncoderBuckets eb;
    eb.num_tokens = encoder_buckets_build(hb, work, e->inp, N, e->V);
    double build_ms = wall_ms() - t0;
    int *d_ints = lab_alloc<int>(encoder_buckets_capacity(N));
    cudaCheck(cudaMemcpy(d_ints, hb, encoder_buckets_capacity(N) * sizeof(int), cudaMemcpyHostToDevice));
    eb.d_ints = d_ints;
    encoder_backward(dwte, dwpe, dout, &eb, e->B, e->T, C, 0);
    snprintf(name, sizeof name, "encoder_backward dwte %s (exact, %d distinct tokens)", tn, eb.num_tokens);
    check_exact(name, dwte, e->dwte, VC);
    snprintf(name, sizeof name, "encoder_backward dwpe %s (exact)", tn);
    check_exact(name, dwpe, e->dwpe, TC);

    const double E = sizeof(T);
    float f = lab_time_ms([&] { encoder_forward(out, inp, wte, wpe, e->B, e->T, C, 0); }, opt->reps);
    float b = lab_time_ms([&] { encoder_backward(dwte, dwpe, dout, &eb, e->B, e->T, C, 0); }, opt->reps);
    snprintf(name, sizeof name, "encoder_forward %s", tn);
    /* write out, read the wte rows and wpe once, the ids */
    lab_report_bandwidth(dev, name, 2.0 * NC * E + TC * E + 4.0 * N, f);
    snprintf(name, sizeof name, "encoder_backward %s", tn);
    /* dout read by both kernels; the touched dwte rows and dwpe read + written; the buckets */
    lab_report_bandwidth(dev, name, 2.0 * NC * E + 2.0 * eb.num_tokens * C * E + 2.0 * TC * E + 4.0 * (2.0 * N + 1), b);
    printf("HOST encoder_buckets_build (N=%d)         %9.4f ms (CPU, once per batch)\n", N, build_ms);
    free(hb), free(work);
    lab_free(wte, wpe, dout, out, dwte, dwpe, inp, d_ints);
}

int main(int argc, char **argv) {
    EncCase e;
    e.B = 8, e.T = 1024, e.C = 768, e.V = 50257, e.Vp = 50304;
    LabSize sizes[] = {{"B", &e.B, 3, "batch"},        {"T", &e.T, 37, "sequence length"}, {"C", &e.C, 72, "channels"},
                       {"V", &e.V, 301, "vocabulary"}, {"Vp", &e.Vp, 320, "padded vocabulary (rows of wte)"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 4);
    if (e.Vp < e.V) llmc_die("--Vp must be at least --V");
    const int N = e.B * e.T, C = e.C;
    const size_t NC = (size_t)N * C, VC = (size_t)e.Vp * C, TC = (size_t)e.T * C;
    /* a quarter of the positions hold one of 4 frequent tokens (long buckets), the rest are
     * uniform over the vocabulary; the last token id appears too */
    e.inp = (int *)mallocCheck(N * sizeof(int), "tokens");
    for (int i = 0; i < N; i++)
        e.inp[i] = rng_u32(&r) % 4 == 0 ? (int)(rng_u32(&r) % 4) : (int)(rng_u32(&r) % (uint32_t)e.V);
    e.inp[N - 1] = e.V - 1;
    e.wte = lab_host_normal(&r, VC, 0.0f, 0.02f), e.wpe = lab_host_normal(&r, TC, 0.0f, 0.01f);
    e.dout = lab_host_normal(&r, NC, 0.0f, 1.0f);
    e.dwte0 = lab_host_normal(&r, VC, 0.0f, 1.0f), e.dwpe0 = lab_host_normal(&r, TC, 0.0f, 1.0f);
    float *all[] = {e.wte, e.wpe, e.dout, e.dwte0, e.dwpe0};
    size_t lens[] = {VC, TC, NC, VC, TC};
    for (int k = 0; k < 5; k++) lab_round<__nv_bfloat16>(all[k], lens[k]);
    e.out = lab_host_floats(NC), e.dwte = lab_host_floats(VC), e.dwpe = lab_host_floats(TC);
    encoder_forward(e.out, e.inp, e.wte, e.wpe, e.B, e.T, C);
    memcpy(e.dwte, e.dwte0, VC * 4), memcpy(e.dwpe, e.dwpe0, TC * 4);
    encoder_backward(e.dwte, e.dwpe, e.dout, e.inp, e.B, e.T, C);
    lab_encoder<__nv_bfloat16>(&dev, &opt, &e);
    lab_encoder<float>(&dev, &opt, &e);
    float *hfree[] = {e.wte, e.wpe, e.dout, e.dwte0, e.dwpe0, e.out, e.dwte, e.dwpe};
    for (float *p : hfree) free(p);
    free(e.inp);
    return test_exit_code();
}
