/* adamw.cu - kernel lab for llmc/cuda/adamw.cuh: checks adamw_update (fp32 params; bf16 params
 * with an fp32 master copy; bf16 params without one) and global_norm_squared against
 * llmc/cpu/adamw.h, checks that bf16 stochastic rounding lands on a neighbour of the master
 * value and is unbiased, then times the update and the norm.
 * Usage: build/dev/cuda/adamw [--small] [--n n] [--reps R]
 *   default n = 124475904 (GPT-2 124M parameters); --small: n = 100003.
 * fp16 parameters (the other stochastic-rounding path) are covered by test/test_cuda_ops.cu. */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cuda/adamw.cuh"

static const float LR = 1e-2f, B1 = 0.9f, B2 = 0.95f, EPS = 1e-8f, WD = 0.1f, CLIP = 0.7f;
static const int STEP = 3;
static const uint64_t SR_SEED = 42;

typedef struct {
    size_t n;
    float *p, *g, *m, *v;    /* inputs, bf16-rounded (v >= 0) */
    float *rp, *rm, *rv;     /* the CPU update of copies of p, m, v */
} AdamCase;

/* The fp32 moments and master: the same formula in fp32, FMA contraction only. */
static const LabTol TIGHT = {1e-7, 1e-6};

/* got (bf16 bits) must be master rounded down or up to bf16 (truncation of the fp32 bits is the
 * neighbour toward zero; +1 in the bits the one away from zero). */
static void check_sr_neighbour(const char *name, const __nv_bfloat16 *d_params, const float *d_master, size_t n) {
    __nv_bfloat16 *got = (__nv_bfloat16 *)mallocCheck(n * sizeof(__nv_bfloat16), "params download");
    float *master = lab_host_floats(n);
    cudaCheck(cudaMemcpy(got, d_params, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(master, d_master, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0, first = 0, up = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t mb;
        memcpy(&mb, &master[i], 4);
        uint16_t toward0 = (uint16_t)(mb >> 16), gb;
        memcpy(&gb, &got[i], 2);
        int exact = (mb & 0xffffu) == 0;
        int ok = gb == toward0 || (!exact && gb == (uint16_t)(toward0 + 1));
        up += gb != toward0;
        if (!ok && bad++ == 0) first = i;
    }
    test_report(bad == 0, name, "%zu of %zu params are not a bf16 neighbour of the master; first [%zu]: %.9g vs master %.9g",
                bad, n, first, (double)__bfloat162float(got[first]), (double)master[first]);
    printf("      (%.1f%% rounded away from zero)\n", 100.0 * up / (n ? n : 1));
    free(got), free(master);
}

/* lr = 0 leaves every master value at x = 1 + 0.3 ulp; the mean of the stochastic roundings must
 * be x within 6 standard errors (nearest rounding would give 1, 0.3 ulp = ~250 errors away). */
static void check_sr_unbiased(size_t n) {
    const float ulp = 0.0078125f, x = 1.0f + 0.3f * ulp;
    float *h = lab_host_floats(n);
    for (size_t i = 0; i < n; i++) h[i] = x;
    float *master = lab_alloc<float>(n), *m = lab_alloc<float>(n), *v = lab_alloc<float>(n);
    __nv_bfloat16 *params = lab_alloc<__nv_bfloat16>(n), *g = lab_alloc<__nv_bfloat16>(n);
    cudaCheck(cudaMemcpy(master, h, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(m, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(v, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(g, 0, n * sizeof(__nv_bfloat16)));
    adamw_update(params, master, g, m, v, n, 0.0f, B1, B2, EPS, 0.0f, 1, 1.0f, SR_SEED, 0);
    float *got = lab_download(params, n);
    double mean = 0.0;
    for (size_t i = 0; i < n; i++) mean += got[i];
    mean /= (double)n;
    const double se = ulp * sqrt(0.3 * 0.7 / (double)n);
    char name[128];
    snprintf(name, sizeof name, "stochastic rounding to bf16 is unbiased (n=%zu)", n);
    test_report(fabs(mean - x) < 6 * se, name, "mean %.9g of %zu roundings of %.9g (6 standard errors: %.3g)", mean, n,
                (double)x, 6 * se);
    free(h), free(got);
    lab_free(master, m, v, params, g);
}

/* T params, with or without the fp32 master copy. */
template <class T> static void lab_adamw(const LabDevice *dev, const LabOptions *opt, AdamCase *a, int use_master) {
    const char *tn = StorageInfo<T>::name;
    const char *form = use_master ? " + fp32 master" : "";
    const size_t n = a->n;
    char name[160];
    T *params = lab_upload<T>(a->p, n), *grads = lab_upload<T>(a->g, n);
    float *m = lab_upload<float>(a->m, n), *v = lab_upload<float>(a->v, n);
    float *master = use_master ? lab_upload<float>(a->p, n) : NULL;
    adamw_update(params, master, grads, m, v, n, LR, B1, B2, EPS, WD, STEP, CLIP, SR_SEED, 0);
    snprintf(name, sizeof name, "adamw_update m %s%s n=%zu", tn, form, n);
    lab_check(name, m, a->rm, n, TIGHT);
    snprintf(name, sizeof name, "adamw_update v %s%s", tn, form);
    lab_check(name, v, a->rv, n, TIGHT);
    if (master) {
        snprintf(name, sizeof name, "adamw_update master %s", tn);
        lab_check(name, master, a->rp, n, TIGHT);
    }
    /* fp32 params: the update itself; 16-bit: a stochastic rounding, within one ulp */
    snprintf(name, sizeof name, "adamw_update params %s%s", tn, form);
    lab_check(name, params, a->rp, n, lab_tol<T>(TIGHT, {1e-30, 7.9e-3}));
    if (master && sizeof(T) == 2) {
        snprintf(name, sizeof name, "adamw_update params are bf16 neighbours of the master");
        check_sr_neighbour(name, (const __nv_bfloat16 *)params, master, n);
    }

    /* bytes: read grads, m, v and params or master; write m, v, params (and master) */
    const double E = sizeof(T), bytes = master ? n * (24.0 + 2 * E) : n * (16.0 + 3 * E);
    float ms = lab_time_ms([&] { adamw_update(params, master, grads, m, v, n, LR, B1, B2, EPS, WD, STEP, CLIP, SR_SEED, 0); },
                           opt->reps);
    snprintf(name, sizeof name, "adamw_update %s%s", tn, form);
    lab_report_bandwidth(dev, name, bytes, ms);
    lab_free(params, grads, m, v, master);
}

/* global_norm_squared of T grads vs the CPU's double sum; inf/NaN must propagate. */
template <class T> static void lab_norm(const LabDevice *dev, const LabOptions *opt, float *g, size_t n) {
    const char *tn = StorageInfo<T>::name;
    char name[160];
    T *grads = lab_upload<T>(g, n);
    float *out = lab_alloc<float>(1), *scratch = lab_alloc<float>(NORM_BLOCKS);
    float ref = (float)global_norm_squared(g, n);
    global_norm_squared(out, grads, n, scratch, 0);
    /* fp32 partial sums of n squares in another order, identical inputs */
    snprintf(name, sizeof name, "global_norm_squared %s n=%zu", tn, n);
    lab_check(name, out, &ref, 1, 1e-6, 1e-5);
    float first, again;
    cudaCheck(cudaMemcpy(&first, out, 4, cudaMemcpyDeviceToHost));
    global_norm_squared(out, grads, n, scratch, 0);
    cudaCheck(cudaMemcpy(&again, out, 4, cudaMemcpyDeviceToHost));
    snprintf(name, sizeof name, "global_norm_squared %s is bit-reproducible", tn);
    test_report(memcmp(&first, &again, 4) == 0, name, "%.9g then %.9g", (double)first, (double)again);
    float ms = lab_time_ms([&] { global_norm_squared(out, grads, n, scratch, 0); }, opt->reps);
    snprintf(name, sizeof name, "global_norm_squared %s", tn);
    lab_report_bandwidth(dev, name, (double)n * sizeof(T), ms);
    const float planted[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        T bad = from_float<T>(planted[k]);
        cudaCheck(cudaMemcpy(grads + n / 2, &bad, sizeof(T), cudaMemcpyHostToDevice));
        global_norm_squared(out, grads, n, scratch, 0);
        float got;
        cudaCheck(cudaMemcpy(&got, out, 4, cudaMemcpyDeviceToHost));
        snprintf(name, sizeof name, "global_norm_squared %s flags a planted %s", tn, k ? "NaN" : "inf");
        test_report(!isfinite(got), name, "got finite %g", (double)got);
    }
    lab_free(grads, out, scratch);
}

int main(int argc, char **argv) {
    int n = 124475904;
    LabSize sizes[] = {{"n", &n, 100003, "parameters"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 9);
    printf("(lr %g beta1 %g beta2 %g eps %g wd %g step %d grad_scale %g)\n", LR, B1, B2, EPS, WD, STEP, CLIP);
    AdamCase a;
    a.n = n;
    a.p = lab_host_normal(&r, n, 0.0f, 1.0f), a.g = lab_host_normal(&r, n, 0.0f, 1.0f);
    a.m = lab_host_normal(&r, n, 0.0f, 0.1f), a.v = lab_host_normal(&r, n, 0.0f, 0.1f);
    for (size_t i = 0; i < a.n; i++) a.v[i] = fabsf(a.v[i]);
    float *all[] = {a.p, a.g, a.m, a.v};
    for (float *h : all) lab_round<__nv_bfloat16>(h, a.n);
    a.rp = lab_host_floats(n), a.rm = lab_host_floats(n), a.rv = lab_host_floats(n);
    memcpy(a.rp, a.p, a.n * 4), memcpy(a.rm, a.m, a.n * 4), memcpy(a.rv, a.v, a.n * 4);
    adamw_update(a.rp, a.g, a.rm, a.rv, a.n, LR, B1, B2, EPS, WD, STEP, CLIP);
    lab_adamw<__nv_bfloat16>(&dev, &opt, &a, 1);
    lab_adamw<__nv_bfloat16>(&dev, &opt, &a, 0);
    lab_adamw<float>(&dev, &opt, &a, 0);
    check_sr_unbiased(a.n < (1u << 20) ? a.n : (1u << 20));
    lab_norm<__nv_bfloat16>(&dev, &opt, a.g, a.n);
    lab_norm<float>(&dev, &opt, a.g, a.n);
    float *hfree[] = {a.p, a.g, a.m, a.v, a.rp, a.rm, a.rv};
    for (float *p : hfree) free(p);
    return test_exit_code();
}
