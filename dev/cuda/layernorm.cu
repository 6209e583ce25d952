/* layernorm.cu - kernel lab for llmc/cuda/layernorm.cuh: checks layernorm_forward (out, mean,
 * rstd), layernorm_recompute, fused_residual_layernorm_forward and layernorm_backward against
 * llmc/cpu/layernorm.h in bf16 and fp32, then times them.
 * Usage: build/dev/cuda/layernorm [--small] [--B b] [--T t] [--C c] [--reps R]
 *   default B=8 T=1024 C=768 (GPT-2 124M); --small: B=3 T=37 C=200 (C not a multiple of 32). */
#include "dev/cuda/common_lab.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/residual.h"
#include "llmc/cuda/layernorm.cuh"

typedef struct {
    float *x, *x2, *w, *b, *dy, *dx0, *dw0, *db0;   /* inputs (bf16-rounded); dx0.. accumulate */
    float *out, *mean, *rstd;                        /* CPU forward of x */
    float *dx, *dw, *db;                             /* CPU backward: dx0.. + gradients */
} LnRef;

template <class T>
static void lab_layernorm(const LabDevice *dev, const LabOptions *opt, LnRef *h, int N, int C) {
    const char *tn = StorageInfo<T>::name;
    const size_t NC = (size_t)N * C;
    char name[160];
    T *x = lab_upload<T>(h->x, NC), *x2 = lab_upload<T>(h->x2, NC), *w = lab_upload<T>(h->w, C), *b = lab_upload<T>(h->b, C);
    T *dy = lab_upload<T>(h->dy, NC), *out = lab_alloc<T>(NC), *rec = lab_alloc<T>(NC), *res = lab_alloc<T>(NC);
    float *mean = lab_alloc<float>(N), *rstd = lab_alloc<float>(N), *m2 = lab_alloc<float>(N), *r2 = lab_alloc<float>(N);
    float *scratch = lab_alloc<float>(layernorm_backward_scratch_floats(N, C));

    /* out: fp32 summation order moves the mean (~4, ulp 5e-7) by a few ulps, times rstd ~1;
     * bf16: one rounding of an O(1) value. Stats are fp32 from identical inputs either way. */
    const LabTol tout = lab_tol<T>({1e-5, 1e-5}, {1e-2, 8e-3});
    layernorm_forward(out, mean, rstd, x, w, b, N, C, 0);
    snprintf(name, sizeof name, "layernorm_forward out %s N=%d C=%d", tn, N, C);
    lab_check(name, out, h->out, NC, tout);
    snprintf(name, sizeof name, "layernorm_forward mean %s", tn);
    lab_check(name, mean, h->mean, N, 1e-5, 1e-5);
    snprintf(name, sizeof name, "layernorm_forward rstd %s", tn);
    lab_check(name, rstd, h->rstd, N, 1e-5, 1e-4);
    layernorm_recompute(rec, x, mean, rstd, w, b, N, C, 0);
    float *fwd = lab_download(out, NC);
    snprintf(name, sizeof name, "layernorm_recompute == forward %s (bit-identical)", tn);
    lab_check(name, rec, fwd, NC, 0.0, 0.0);
    free(fwd);

    /* fused: residual = round_T(x + x2) (exact reference: one fp32 add, one rounding), and the
     * LayerNorm of that rounded residual */
    float *res_ref = lab_host_floats(NC);
    residual_forward(res_ref, h->x, h->x2, NC);
    lab_round<T>(res_ref, NC);
    float *ln_ref = lab_host_floats(NC), *mr = lab_host_floats(N), *rr = lab_host_floats(N);
    layernorm_forward(ln_ref, mr, rr, res_ref, h->w, h->b, N, C);
    fused_residual_layernorm_forward(res, rec, m2, r2, x, x2, w, b, N, C, 0);
    snprintf(name, sizeof name, "fused_residual_layernorm residual %s (exact)", tn);
    lab_check(name, res, res_ref, NC, 0.0, 0.0);
    snprintf(name, sizeof name, "fused_residual_layernorm out %s", tn);
    lab_check(name, rec, ln_ref, NC, tout);
    free(res_ref), free(ln_ref), free(mr), free(rr);

    /* backward accumulates onto the random dx0, dw0, db0.
     * dinp: O(1), fp32 order effects times rstd; bf16: one rounding of the sum.
     * dweight/dbias: sums over N rows in another order; bf16: one rounding. */
    T *dx = lab_upload<T>(h->dx0, NC), *dw = lab_upload<T>(h->dw0, C), *db = lab_upload<T>(h->db0, C);
    layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, scratch, 0);
    snprintf(name, sizeof name, "layernorm_backward dinp %s", tn);
    lab_check(name, dx, h->dx, NC, lab_tol<T>({1e-4, 1e-4}, {2e-2, 8e-3}));
    const LabTol tw = lab_tol<T>({1e-4 * sqrt((double)N), 1e-4}, {2e-2, 8e-3});
    snprintf(name, sizeof name, "layernorm_backward dweight %s", tn);
    lab_check(name, dw, h->dw, C, tw);
    snprintf(name, sizeof name, "layernorm_backward dbias %s", tn);
    lab_check(name, db, h->db, C, tw);

    /* bytes: forward reads x, writes out (+ mean, rstd); fused reads 2, writes 2; backward
     * reads dout, x, writes dinp (read-modify-write: + read) */
    const double E = sizeof(T), stats = 8.0 * N;
    float f = lab_time_ms([&] { layernorm_forward(out, mean, rstd, x, w, b, N, C, 0); }, opt->reps);
    float fr = lab_time_ms([&] { fused_residual_layernorm_forward(res, out, mean, rstd, x, x2, w, b, N, C, 0); }, opt->reps);
    float rc = lab_time_ms([&] { layernorm_recompute(rec, x, mean, rstd, w, b, N, C, 0); }, opt->reps);
    float bw = lab_time_ms([&] { layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C, scratch, 0); }, opt->reps);
    snprintf(name, sizeof name, "layernorm_forward %s", tn);
    lab_report_bandwidth(dev, name, 2.0 * NC * E + stats, f);
    snprintf(name, sizeof name, "fused_residual_layernorm %s", tn);
    lab_report_bandwidth(dev, name, 4.0 * NC * E + stats, fr);
    snprintf(name, sizeof name, "layernorm_recompute %s", tn);
    lab_report_bandwidth(dev, name, 2.0 * NC * E + stats, rc);
    snprintf(name, sizeof name, "layernorm_backward %s", tn);
    lab_report_bandwidth(dev, name, 4.0 * NC * E + stats, bw);
    lab_free(x, x2, w, b, dy, out, rec, res, dx, dw, db, mean, rstd, m2, r2, scratch);
}

int main(int argc, char **argv) {
    int B = 8, T = 1024, C = 768;
    LabSize sizes[] = {{"B", &B, 3, "batch"}, {"T", &T, 37, "sequence length"}, {"C", &C, 200, "channels"}};
    auto [dev, opt, r] = lab_begin_op(argc, argv, __FILE__, sizes, 2);
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    LnRef h;
    /* a mean offset of 4: the two-pass variance must not cancel */
    h.x = lab_host_normal(&r, NC, 4.0f, 1.0f), h.x2 = lab_host_normal(&r, NC, 0.0f, 1.0f);
    h.w = lab_host_normal(&r, C, 1.0f, 0.3f), h.b = lab_host_normal(&r, C, 0.0f, 0.3f);
    h.dy = lab_host_normal(&r, NC, 0.0f, 1.0f), h.dx0 = lab_host_normal(&r, NC, 0.0f, 1.0f);
    h.dw0 = lab_host_normal(&r, C, 0.0f, 1.0f), h.db0 = lab_host_normal(&r, C, 0.0f, 1.0f);
    float *all[] = {h.x, h.x2, h.w, h.b, h.dy, h.dx0, h.dw0, h.db0};
    size_t lens[] = {NC, NC, (size_t)C, (size_t)C, NC, NC, (size_t)C, (size_t)C};
    for (int k = 0; k < 8; k++) lab_round<__nv_bfloat16>(all[k], lens[k]);
    h.out = lab_host_floats(NC), h.mean = lab_host_floats(N), h.rstd = lab_host_floats(N);
    layernorm_forward(h.out, h.mean, h.rstd, h.x, h.w, h.b, N, C);
    h.dx = lab_host_floats(NC), h.dw = lab_host_floats(C), h.db = lab_host_floats(C);
    memcpy(h.dx, h.dx0, NC * 4), memcpy(h.dw, h.dw0, C * 4), memcpy(h.db, h.db0, C * 4);
    layernorm_backward(h.dx, h.dw, h.db, h.dy, h.x, h.w, h.mean, h.rstd, N, C);
    lab_layernorm<__nv_bfloat16>(&dev, &opt, &h, N, C);
    lab_layernorm<float>(&dev, &opt, &h, N, C);
    float *hfree[] = {h.x, h.x2, h.w, h.b, h.dy, h.dx0, h.dw0, h.db0, h.out, h.mean, h.rstd, h.dx, h.dw, h.db};
    for (float *p : hfree) free(p);
    return test_exit_code();
}
