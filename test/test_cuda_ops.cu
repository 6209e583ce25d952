/*
 * test_cuda_ops.cu - every CUDA op (the llmc/cuda headers) against its CPU twin (llmc/cpu), in
 * fp32, bf16 and fp16, on awkward shapes (not multiples of the block sizes, B*T = 1, a large
 * mean offset for LayerNorm, vocab not a multiple of anything).
 *
 * Method: random inputs from a fixed, printed seed are rounded to the storage type T first, so
 * the CPU (fp32) and the GPU see the same values; what remains is the GPU's rounding of its
 * outputs to T and summation order. Each comparison is |got - ref| <= atol + rtol*|ref| with
 * the tolerances written next to the op and the reason; NaN/Inf always fail (test/testing.h).
 * Outputs sit between canary regions that must be untouched afterwards. Accumulating outputs
 * start from random values (to tell += from =), overwritten ones from garbage.
 *
 * Usage: test_cuda_ops [--seed N] [--big]   (--big: GPT-2 124M shapes, for real GPUs)
 * Exits non-zero if any check fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmc/cpu/adamw.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/residual.h"
#include "llmc/cuda/adamw.cuh"
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/cast.cuh"
#include "llmc/cuda/classifier.cuh"
#include "llmc/cuda/encoder.cuh"
#include "llmc/cuda/gelu.cuh"
#include "llmc/cuda/layernorm.cuh"
#include "llmc/cuda/matmul.cuh"
#include "llmc/cuda/residual.cuh"
#include "llmc/formats/modelfile.h"
#include "llmc/core/rng.h"
#include "test/testing.h"

/* ---- tolerances: one per precision, chosen by the storage type ---------------------------- */
typedef struct {
    double atol, rtol;
} Tol;
typedef struct {
    Tol fp32, bf16, fp16;
} Tols;
template <class T> static Tol pick(const Tols &t);
template <> Tol pick<float>(const Tols &t) { return t.fp32; }
template <> Tol pick<__nv_bfloat16>(const Tols &t) { return t.bf16; }
template <> Tol pick<__half>(const Tols &t) { return t.fp16; }

/* ---- device arrays with canaries ----------------------------------------------------------- */
enum { CANARY_BYTES = 256 };
static const unsigned char CANARY = 0xA7;

template <class T> struct Dev {
    unsigned char *base = nullptr;
    T *p = nullptr;
    size_t n = 0;
};

template <class T> static Dev<T> dev_alloc(size_t n) {
    Dev<T> d;
    d.n = n;
    size_t bytes = n * sizeof(T) + 2 * CANARY_BYTES;
    cudaCheck(cudaMalloc((void **)&d.base, bytes));
    cudaCheck(cudaMemset(d.base, CANARY, bytes));
    d.p = (T *)(d.base + CANARY_BYTES);
    return d;
}

template <class T> static void dev_free(Dev<T> &d) {
    cudaCheck(cudaFree(d.base));
    d.base = nullptr;
}

/* Fails the test `name` if a byte around the data changed. */
template <class T> static void check_canary(const Dev<T> &d, const char *name) {
    unsigned char buf[2 * CANARY_BYTES];
    cudaCheck(cudaMemcpy(buf, d.base, CANARY_BYTES, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(buf + CANARY_BYTES, d.base + CANARY_BYTES + d.n * sizeof(T), CANARY_BYTES, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 2 * CANARY_BYTES; i++) bad += buf[i] != CANARY;
    if (bad) test_report(0, name, "%d canary bytes around the output were overwritten", bad);
}

/* host floats -> device T (the host copy is rounded to T in place, so both sides agree) */
template <class T> static Dev<T> upload(float *h, size_t n) {
    Dev<T> d = dev_alloc<T>(n);
    T *tmp = (T *)malloc(n * sizeof(T) + 1);
    for (size_t i = 0; i < n; i++) {
        tmp[i] = from_float<T>(h[i]);
        h[i] = to_float(tmp[i]);
    }
    cudaCheck(cudaMemcpy(d.p, tmp, n * sizeof(T), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

template <class T> static float *download(const Dev<T> &d) {
    T *tmp = (T *)malloc(d.n * sizeof(T) + 1);
    cudaCheck(cudaMemcpy(tmp, d.p, d.n * sizeof(T), cudaMemcpyDeviceToHost));
    float *h = (float *)malloc(d.n * sizeof(float) + 1);
    for (size_t i = 0; i < d.n; i++) h[i] = to_float(tmp[i]);
    free(tmp);
    return h;
}

static Dev<int> upload_ints(const int *h, size_t n) {
    Dev<int> d = dev_alloc<int>(n);
    cudaCheck(cudaMemcpy(d.p, h, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

/* Compares a device output with the reference and checks its canaries. */
template <class T> static void expect(const char *what, const Dev<T> &d, const float *ref, Tol tol, const char *shape) {
    char name[256];
    snprintf(name, sizeof name, "%s [%s %s]", what, StorageInfo<T>::name, shape);
    cudaCheck(cudaDeviceSynchronize());
    float *got = download(d);
    test_close(name, got, ref, d.n, tol.atol, tol.rtol);
    check_canary(d, name);
    free(got);
}

/* Like expect(), with a bound per element (an error model that varies across the tensor). */
template <class T> static void expect_within(const char *what, const Dev<T> &d, const float *ref, const double *bound, const char *shape) {
    char name[256];
    snprintf(name, sizeof name, "%s [%s %s]", what, StorageInfo<T>::name, shape);
    cudaCheck(cudaDeviceSynchronize());
    float *got = download(d);
    size_t bad = 0, worst = 0;
    double worst_ratio = -1.0;
    for (size_t i = 0; i < d.n; i++) {
        double diff = fabs((double)got[i] - ref[i]), ratio = diff / bound[i];
        if (!isfinite(got[i]) || !isfinite(ref[i])) ratio = INFINITY;
        if (ratio > 1.0) bad++;
        if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
    }
    test_report(bad == 0, name, "%zu of %zu elements outside their bound; worst at [%zu]: got %.9g, ref %.9g, bound %.3g",
                bad, d.n, worst, got[worst], ref[worst], bound[worst]);
    if (bad == 0) printf("      (%zu elements, worst |diff| / bound %.3g)\n", d.n, worst_ratio);
    check_canary(d, name);
    free(got);
}

/* Compares n elements at a device pointer inside a Dev (a view: no canaries of its own). */
template <class T> static void expect_view(const char *what, const T *p, size_t n, const float *ref, Tol tol, const char *shape) {
    char name[256];
    snprintf(name, sizeof name, "%s [%s %s]", what, StorageInfo<T>::name, shape);
    cudaCheck(cudaDeviceSynchronize());
    T *tmp = (T *)malloc(n * sizeof(T) + 1);
    float *got = (float *)malloc(n * sizeof(float) + 1);
    cudaCheck(cudaMemcpy(tmp, p, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) got[i] = to_float(tmp[i]);
    test_close(name, got, ref, n, tol.atol, tol.rtol);
    free(tmp), free(got);
}

static float *randn(Rng *r, size_t n, float mean, float std) {
    float *h = (float *)malloc(n * sizeof(float) + 1);
    rng_normal(r, h, n, mean, std);
    return h;
}
static float *copy_of(const float *h, size_t n) {
    float *c = (float *)malloc(n * sizeof(float) + 1);
    memcpy(c, h, n * sizeof(float));
    return c;
}

typedef struct {
    int B, T, C, NH, V, Vp, F;
} Shape;

static void shape_text(char *buf, size_t len, const Shape &s) {
    snprintf(buf, len, "B=%d T=%d C=%d NH=%d V=%d", s.B, s.T, s.C, s.NH, s.V);
}

/* ---- the ops ------------------------------------------------------------------------------- */
template <class T> static void test_encoder(Rng *r, const Shape &s, const char *sh_) {
    const int N = s.B * s.T, C = s.C;
    char sh[200]; /* which kernels ran: packed when C is a whole number of 16-byte packs */
    snprintf(sh, sizeof sh, "%s, %s", sh_, C % Pack16<T>::size == 0 ? "packed" : "element per thread");
    float *wte = randn(r, (size_t)s.Vp * C, 0, 1), *wpe = randn(r, (size_t)s.T * C, 0, 1);
    int *inp = (int *)malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) inp[i] = (int)(rng_u32(r) % (uint32_t)(s.V < 5 ? s.V : 5)); /* repeats on purpose */
    Dev<T> dwte_ = upload<T>(wte, (size_t)s.Vp * C), dwpe = upload<T>(wpe, (size_t)s.T * C);
    Dev<int> dinp = upload_ints(inp, N);
    Dev<T> dout = dev_alloc<T>((size_t)N * C);
    float *ref = (float *)malloc((size_t)N * C * sizeof(float));
    encoder_forward(ref, inp, wte, wpe, s.B, s.T, C);
    encoder_forward(dout.p, dinp.p, dwte_.p, dwpe.p, s.B, s.T, C, (cudaStream_t)0);
    /* one add of two T values, rounded once to T */
    expect("encoder_forward out", dout, ref, pick<T>({{0, 0}, {1e-6, 4e-3}, {1e-6, 5e-4}}), sh);

    /* backward accumulates: start from the random tables */
    float *g = randn(r, (size_t)N * C, 0, 1);
    Dev<T> dg = upload<T>(g, (size_t)N * C);
    float *rwte = copy_of(wte, (size_t)s.Vp * C), *rwpe = copy_of(wpe, (size_t)s.T * C);
    encoder_backward(rwte, rwpe, g, inp, s.B, s.T, C);
    int *hb = (int *)malloc(encoder_buckets_capacity(N) * sizeof(int)), *work = (int *)malloc(N * sizeof(int));
    EncoderBuckets eb;
    eb.num_tokens = encoder_buckets_build(hb, work, inp, N, s.V);
    Dev<int> db = upload_ints(hb, encoder_buckets_capacity(N));
    eb.d_ints = db.p;
    encoder_backward(dwte_.p, dwpe.p, dg.p, &eb, s.B, s.T, C, (cudaStream_t)0);
    /* fp32: the same additions in the same order as the CPU: bit-identical. 16-bit: the sum is
     * kept in fp32 and rounded once to T. */
    Tols t = {{0, 0}, {1e-6, 4e-3}, {1e-6, 5e-4}};
    expect("encoder_backward dwte", dwte_, rwte, pick<T>(t), sh);
    expect("encoder_backward dwpe", dwpe, rwpe, pick<T>(t), sh);
    free(wte), free(wpe), free(inp), free(ref), free(g), free(rwte), free(rwpe), free(hb), free(work);
    dev_free(dwte_), dev_free(dwpe), dev_free(dinp), dev_free(dout), dev_free(dg), dev_free(db);
}

template <class T> static void test_layernorm(Rng *r, const Shape &s, const char *sh_) {
    const int N = s.B * s.T, C = s.C;
    char sh[200]; /* the forwards' path: packs per lane (0: element per thread) */
    snprintf(sh, sizeof sh, "%s, forward packs/lane %d", sh_, C % Pack16<T>::size ? 0 : layernorm_forward_packs<T>(C, {}));
    const size_t NC = (size_t)N * C;
    /* a large mean offset: the two-pass variance must not cancel */
    float *x = randn(r, NC, 300.0f, 2.0f), *w = randn(r, C, 1, 0.3f), *b = randn(r, C, 0, 0.3f);
    Dev<T> dx = upload<T>(x, NC), dw = upload<T>(w, C), db = upload<T>(b, C);
    Dev<T> dout = dev_alloc<T>(NC);
    Dev<float> dmean = dev_alloc<float>(N), drstd = dev_alloc<float>(N);
    float *out = (float *)malloc(NC * 4), *mean = (float *)malloc(N * 4), *rstd = (float *)malloc(N * 4);
    layernorm_forward(out, mean, rstd, x, w, b, N, C);
    layernorm_forward(dout.p, dmean.p, drstd.p, dx.p, dw.p, db.p, N, C, (cudaStream_t)0);
    /* out: fp32 differs by summation order: the mean ~300 has an ulp of 3e-5 and moves by a
     * few ulps, times rstd ~0.5 and |w| ~1; 16-bit: one rounding of an O(1) value.
     * Stats are fp32 from identical inputs. */
    const Tols tout = {{1.5e-4, 1e-4}, {1e-2, 8e-3}, {2e-3, 1e-3}};
    expect("layernorm_forward out", dout, out, pick<T>(tout), sh);
    Tol stat = {1e-5, 1e-5};
    expect("layernorm_forward mean", dmean, mean, stat, sh);
    expect("layernorm_forward rstd", drstd, rstd, {1e-5, 1e-4}, sh);

    /* recompute from the saved stats: bit-identical to the forward */
    Dev<T> drec = dev_alloc<T>(NC);
    layernorm_recompute(drec.p, dx.p, dmean.p, drstd.p, dw.p, db.p, N, C, (cudaStream_t)0);
    float *fwd = download(dout);
    expect("layernorm_recompute == forward", drec, fwd, {0, 0}, sh);

    /* fused residual + layernorm == residual_forward then layernorm_forward, bit for bit, and
     * close to the CPU on the T-rounded residual */
    float *x2 = randn(r, NC, 0.0f, 1.0f);
    Dev<T> dx2 = upload<T>(x2, NC);
    Dev<T> dres_a = dev_alloc<T>(NC), dres_b = dev_alloc<T>(NC), dln_a = dev_alloc<T>(NC), dln_b = dev_alloc<T>(NC);
    Dev<float> m2 = dev_alloc<float>(N), r2 = dev_alloc<float>(N), m3 = dev_alloc<float>(N), r3 = dev_alloc<float>(N);
    cudaCheck(cudaMemcpy(dres_a.p, dx.p, NC * sizeof(T), cudaMemcpyDeviceToDevice));
    fused_residual_layernorm_forward(dres_a.p, dln_a.p, m2.p, r2.p, dres_a.p, dx2.p, dw.p, db.p, N, C, (cudaStream_t)0);
    residual_forward(dres_b.p, dx.p, dx2.p, NC, (cudaStream_t)0);
    layernorm_forward(dln_b.p, m3.p, r3.p, dres_b.p, dw.p, db.p, N, C, (cudaStream_t)0);
    float *res_b = download(dres_b), *ln_b = download(dln_b);
    expect("fused_residual_layernorm residual == unfused", dres_a, res_b, {0, 0}, sh);
    expect("fused_residual_layernorm out == unfused", dln_a, ln_b, {0, 0}, sh);
    float *res_ref = (float *)malloc(NC * 4);
    residual_forward(res_ref, x, x2, NC);
    for (size_t i = 0; i < NC; i++) res_ref[i] = to_float(from_float<T>(res_ref[i])); /* the GPU stores T */
    float *ln_ref = (float *)malloc(NC * 4), *m_ref = (float *)malloc(N * 4), *r_ref = (float *)malloc(N * 4);
    layernorm_forward(ln_ref, m_ref, r_ref, res_ref, w, b, N, C);
    expect("fused_residual_layernorm out vs CPU", dln_a, ln_ref, pick<T>(tout), sh);

    /* backward: dinp, dweight, dbias accumulate onto random values */
    float *dy = randn(r, NC, 0, 1), *dx0 = randn(r, NC, 0, 1), *dw0 = randn(r, C, 0, 1), *db0 = randn(r, C, 0, 1);
    Dev<T> ddy = upload<T>(dy, NC), ddx = upload<T>(dx0, NC), ddw = upload<T>(dw0, C), ddb = upload<T>(db0, C);
    Dev<float> scratch = dev_alloc<float>(layernorm_backward_scratch_floats(N, C));
    layernorm_backward(dx0, dw0, db0, dy, x, w, mean, rstd, N, C);
    layernorm_backward(ddx.p, ddw.p, ddb.p, ddy.p, dx.p, dw.p, dmean.p, drstd.p, N, C, scratch.p, (cudaStream_t)0);
    /* dinp: O(1) values, fp32 order effects amplified by rstd; 16-bit: one rounding of the sum.
     * dweight/dbias: sums over N rows in another order (fp32), one rounding (16-bit). */
    expect("layernorm_backward dinp", ddx, dx0, pick<T>({{1e-4, 1e-4}, {2e-2, 8e-3}, {4e-3, 1e-3}}), sh);
    Tols tw = {{1e-4 * sqrt((double)N), 1e-4}, {2e-2, 8e-3}, {4e-3 * sqrt((double)N), 1e-3}};
    expect("layernorm_backward dweight", ddw, dw0, pick<T>(tw), sh);
    expect("layernorm_backward dbias", ddb, db0, pick<T>(tw), sh);

    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(fwd), free(x2), free(res_b), free(ln_b);
    free(res_ref), free(ln_ref), free(m_ref), free(r_ref), free(dy), free(dx0), free(dw0), free(db0);
    dev_free(dx), dev_free(dw), dev_free(db), dev_free(dout), dev_free(dmean), dev_free(drstd), dev_free(drec);
    dev_free(dx2), dev_free(dres_a), dev_free(dres_b), dev_free(dln_a), dev_free(dln_b), dev_free(m2), dev_free(r2);
    dev_free(m3), dev_free(r3), dev_free(ddy), dev_free(ddx), dev_free(ddw), dev_free(ddb), dev_free(scratch);
}

template <class T> static void test_matmul(Rng *r, const CudaContext *ctx, int N, int C, int OC, const char *sh) {
    const float ws = 1.0f / sqrtf((float)C);
    float *x = randn(r, (size_t)N * C, 0, 1), *w = randn(r, (size_t)OC * C, 0, ws), *b = randn(r, OC, 0, 0.5f);
    Dev<T> dx = upload<T>(x, (size_t)N * C), dw = upload<T>(w, (size_t)OC * C), db = upload<T>(b, OC);
    Dev<T> dout = dev_alloc<T>((size_t)N * OC);
    float *ref = (float *)malloc((size_t)N * OC * 4);
    /* fp32 (TF32 off): fp32 accumulation in another order, O(1) outputs; 16-bit: fp32
     * accumulation, one rounding of an O(1) output */
    Tols tf = {{1e-5 * sqrt((double)C), 1e-5}, {2e-2, 8e-3}, {4e-3, 1e-3}};
    matmul_forward(ref, x, w, b, N, C, OC);
    matmul_forward(dout.p, dx.p, dw.p, db.p, N, C, OC, ctx);
    expect("matmul_forward out (bias)", dout, ref, pick<T>(tf), sh);
    matmul_forward(ref, x, w, NULL, N, C, OC);
    matmul_forward(dout.p, dx.p, dw.p, (const T *)NULL, N, C, OC, ctx);
    expect("matmul_forward out (no bias)", dout, ref, pick<T>(tf), sh);

    if (OC % 8 == 0) { /* the GELU epilogue */
        Dev<T> dpre = dev_alloc<T>((size_t)N * OC);
        float *pre = (float *)malloc((size_t)N * OC * 4), *act = (float *)malloc((size_t)N * OC * 4);
        matmul_forward(pre, x, w, b, N, C, OC);
        for (size_t i = 0; i < (size_t)N * OC; i++) pre[i] = to_float(from_float<T>(pre[i])); /* stored in T */
        gelu_forward(act, pre, (size_t)N * OC);
        matmul_forward_gelu(dout.p, dpre.p, dx.p, dw.p, db.p, N, C, OC, ctx);
        expect("matmul_forward_gelu pre_gelu", dpre, pre, pick<T>(tf), sh);
        /* the epilogue applies GELU to the unrounded fp32 sum: one extra T rounding apart */
        expect("matmul_forward_gelu out", dout, act, pick<T>({{1e-5 * sqrt((double)C), 1e-5}, {3e-2, 1.6e-2}, {6e-3, 2e-3}}), sh);
        dev_free(dpre);
        free(pre), free(act);
    }

    /* backward: dinp overwritten (starts as garbage), dweight and dbias accumulate */
    float *dy = randn(r, (size_t)N * OC, 0, 1), *gw = randn(r, (size_t)OC * C, 0, 1), *gb = randn(r, OC, 0, 1);
    float *gw0 = copy_of(gw, (size_t)OC * C); /* dweight before any accumulation */
    Dev<T> ddy = upload<T>(dy, (size_t)N * OC), dgw = upload<T>(gw, (size_t)OC * C), dgb = upload<T>(gb, OC);
    Dev<T> ddx = dev_alloc<T>((size_t)N * C);
    cudaCheck(cudaMemset(ddx.p, 0x3C, (size_t)N * C * sizeof(T)));
    Dev<float> scratch = dev_alloc<float>(matmul_backward_scratch_floats(N, OC));
    float *rdx = (float *)malloc((size_t)N * C * 4);
    matmul_backward(rdx, gw, gb, dy, x, w, N, C, OC);
    matmul_backward(ddx.p, dgw.p, dgb.p, ddy.p, dx.p, dw.p, N, C, OC, scratch.p, ctx);
    /* dinp: K = OC terms of size ws; dweight/dbias: K = N terms of O(1) on top of O(1) */
    expect("matmul_backward dinp", ddx, rdx, pick<T>({{1e-5 * sqrt((double)OC), 1e-5}, {2e-2, 8e-3}, {4e-3, 1e-3}}), sh);
    Tols tg = {{1e-5 * sqrt((double)N), 1e-5}, {2e-2 * sqrt((double)N) / 4, 8e-3}, {4e-3 * sqrt((double)N) / 4, 1e-3}};
    expect("matmul_backward dweight", dgw, gw, pick<T>(tg), sh);
    expect("matmul_backward dbias", dgb, gb, pick<T>(tg), sh);
    {   /* where the bias gradient came from: the BGRADB epilogue in 16-bit, our kernels in fp32 */
        int bgrad_plans = 0;
        for (int i = 0; ctx->lt_plans && i < ctx->lt_plans->count; i++)
            bgrad_plans += ctx->lt_plans->plans[i].key.epilogue == CUBLASLT_EPILOGUE_BGRADB &&
                           ctx->lt_plans->plans[i].key.type == (int)StorageInfo<T>::cuda_type;
        char name[256];
        snprintf(name, sizeof name, "matmul_backward dbias from the BGRADB epilogue in 16-bit only [%s %s]", StorageInfo<T>::name, sh);
        test_report((bgrad_plans > 0) == (sizeof(T) == 2), name, "%d BGRADB plans of this type", bgrad_plans);
    }

    if (C % 8 == 0) { /* DGELU epilogue: dinp = (dout @ W) * gelu'(pre) */
        float *pre = randn(r, (size_t)N * C, 0, 1.5f);
        Dev<T> dpre = upload<T>(pre, (size_t)N * C);
        float *ref_dx = (float *)malloc((size_t)N * C * 4);
        float *gw2 = copy_of(gw, (size_t)OC * C), *gb2 = copy_of(gb, OC);
        matmul_backward(rdx, gw2, gb2, dy, x, w, N, C, OC);
        /* the epilogue multiplies the unrounded fp32 product by gelu'(pre) */
        gelu_backward(ref_dx, pre, rdx, (size_t)N * C);
        matmul_backward_dgelu(ddx.p, dgw.p, dgb.p, ddy.p, dx.p, dw.p, dpre.p, N, C, OC, scratch.p, ctx);
        expect("matmul_backward_dgelu dinp", ddx, ref_dx, pick<T>({{2e-5 * sqrt((double)OC), 2e-5}, {3e-2, 1.6e-2}, {6e-3, 2e-3}}), sh);
        /* the reference stores dweight in T after each accumulation, as the device does: two
         * roundings of values ~2K (N = 4096: -540 seen on an H200) are more than tg allows for
         * an unrounded reference; the remaining difference is the product's, as in dweight above */
        if (sizeof(T) < 4) {
            float *p1 = (float *)calloc((size_t)OC * C, sizeof(float)), *pb = (float *)calloc(OC, sizeof(float));
            matmul_backward(rdx, p1, pb, dy, x, w, N, C, OC); /* the product alone */
            for (size_t i = 0; i < (size_t)OC * C; i++) {
                float v = to_float(from_float<T>(gw0[i]));
                v = to_float(from_float<T>(v + p1[i]));
                gw2[i] = to_float(from_float<T>(v + p1[i]));
            }
            free(p1), free(pb);
        }
        expect("matmul_backward_dgelu dweight (accumulated twice)", dgw, gw2, pick<T>(tg), sh);
        dev_free(dpre);
        free(pre), free(ref_dx), free(gw2), free(gb2);
    }
    free(x), free(w), free(b), free(ref), free(dy), free(gw), free(gb), free(rdx), free(gw0);
    dev_free(dx), dev_free(dw), dev_free(db), dev_free(dout), dev_free(ddy), dev_free(dgw), dev_free(dgb), dev_free(ddx);
    dev_free(scratch);
}

/* The reference logsumexp (B, NH, T) of causal attention over qkv (B, T, (NH + 2 NKV) HS), in
 * double; query head h reads key head h / (NH / NKV). */
static float *attention_lse_ref(const float *qkv, int B, int T_, int C, int NH, int NKV) {
    const int HS = C / NH, W = (NH + 2 * NKV) * HS;
    float *lse = (float *)malloc((size_t)B * NH * T_ * 4);
    const double scale = 1.0 / sqrt((double)HS);
    double *sc = (double *)malloc(T_ * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T_; t++) {
                const float *q = qkv + ((size_t)b * T_ + t) * W + h * HS;
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const float *k = qkv + ((size_t)b * T_ + u) * W + C + h / (NH / NKV) * HS;
                    double d = 0.0;
                    for (int i = 0; i < HS; i++) d += (double)q[i] * k[i];
                    sc[u] = d * scale;
                    mx = sc[u] > mx ? sc[u] : mx;
                }
                for (int u = 0; u <= t; u++) sum += exp(sc[u] - mx);
                lse[((size_t)b * NH + h) * T_ + t] = (float)(mx + log(sum));
            }
    free(sc);
    return lse;
}

/* growing: keys scaled by 1 + u/8 at position u, so scores grow along the sequence and each
 * new key tile raises the row maxima by more than the forward's lazy-rescale threshold */
template <class T> static void test_attention(Rng *r, const Shape &s, const char *sh_, bool growing = false) {
    const int B = s.B, T_ = s.T, C = s.C, NH = s.NH, N = B * T_;
    const size_t N3 = (size_t)N * 3 * C;
    float *qkv = randn(r, N3, 0, 1);
    char sh[160];
    snprintf(sh, sizeof sh, "%s%s", sh_, growing ? ", growing scores" : "");
    if (growing)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) qkv[(size_t)i * 3 * C + C + c] *= 1.0f + (float)(i % T_) / 8.0f;
    Dev<T> dqkv = upload<T>(qkv, N3);
    Dev<T> dout = dev_alloc<T>((size_t)N * C);
    Dev<float> dlse = dev_alloc<float>((size_t)B * NH * T_);
    float *out = (float *)malloc((size_t)N * C * 4), *att = (float *)malloc((size_t)B * NH * T_ * T_ * 4);
    attention_forward(out, att, qkv, B, T_, NH, NH, C / NH);
    attention_forward(dout.p, dlse.p, dqkv.p, B, T_, C, NH, NH, (cudaStream_t)0);
    /* fp32: online vs two-pass softmax, order effects only; 16-bit: one rounding of O(1) */
    expect("attention_forward out", dout, out, pick<T>({{2e-5, 1e-4}, {1e-2, 8e-3}, {2e-3, 1e-3}}), sh);
    float *lse = attention_lse_ref(qkv, B, T_, C, NH, NH);
    /* logsumexp in fp32 vs a double reference: O(1..10) values */
    expect("attention_forward logsumexp", dlse, lse, {1e-5, 1e-5}, sh);

    /* backward overwrites dinp: start from garbage */
    float *dy = randn(r, (size_t)N * C, 0, 1);
    Dev<T> ddy = upload<T>(dy, (size_t)N * C);
    Dev<T> ddinp = dev_alloc<T>(N3);
    cudaCheck(cudaMemset(ddinp.p, 0x5A, N3 * sizeof(T)));
    Dev<float> scratch = dev_alloc<float>(attention_backward_scratch_floats((size_t)N, NH, C / NH));
    float *dinp = (float *)malloc(N3 * 4);
    float *out_t = download(dout); /* the GPU's out (in T) is what its backward uses */
    attention_backward(dinp, dy, qkv, att, B, T_, NH, NH, C / NH);
    attention_backward(ddinp.p, ddy.p, dqkv.p, dout.p, dlse.p, B, T_, C, NH, NH, scratch.p, (cudaStream_t)0);
    /* fp32: recomputed probabilities, other order; 16-bit: out and the result rounded to T
     * (D = dout . out uses the rounded out), sums over up to T terms */
    if (!growing || sizeof(T) == 4) {
        expect("attention_backward dinp", ddinp, dinp, pick<T>({{1e-4, 1e-4}, {3e-2, 1.6e-2}, {6e-3, 3e-3}}), sh);
    } else {
        /* Peaked softmax: ds = p (dp - D) cancels where p ~ 1, and D uses the 16-bit out, so
         * every 16-bit backward (the fp32-math CUDA-core one too) is off the exact reference by
         * ~6% there. Compare the tensor-core backward with the CUDA-core one on the same device
         * inputs instead: they differ only by the 16-bit P and dS of the tensor-core products. */
        Dev<T> simt = dev_alloc<T>(N3);
        attention_backward_simt(simt.p, ddy.p, dqkv.p, dout.p, dlse.p, B, T_, C, NH, NH, scratch.p, (cudaStream_t)0);
        float *ref = download(simt);
        expect("attention_backward dinp vs the CUDA-core kernels", ddinp, ref, pick<T>({{0, 0}, {3e-2, 1.6e-2}, {6e-3, 3e-3}}), sh);
        free(ref);
        dev_free(simt);
    }
    free(qkv), free(out), free(att), free(lse), free(dy), free(dinp), free(out_t);
    dev_free(dqkv), dev_free(dout), dev_free(dlse), dev_free(ddy), dev_free(ddinp), dev_free(scratch);
}

/* Grouped-query attention (NKV key/value heads, inp rows [q: NH heads | k: NKV | v: NKV] x HS)
 * through one CUDA path called by name, against the CPU attention with the same NKV (which reads
 * each key/value head for its NH / NKV query heads and sums their dk, dv), on the 16-bit
 * inputs the kernel sees. path: the FA2 kernels (attention_fa2.cuh, bf16/fp16), the wmma
 * kernels (attention_tc.cuh, bf16/fp16) or the CUDA-core ones (any T; fp32's only path).
 * growing: keys scaled by 1 + u/8 at position u, so every key tile raises the row maxima and the
 * running output must be rescaled. */
enum AttPath { ATT_FA2, ATT_WMMA, ATT_SIMT };
static const char *const att_path_name[] = {"FA2", "wmma", "CUDA cores"};
template <class T>
static void test_attention_gqa(Rng *r, int B, int T_, int NH, int NKV, int HS, AttPath path, bool growing = false) {
    const int C = NH * HS, W = (NH + 2 * NKV) * HS, N = B * T_;
    char sh[160];
    snprintf(sh, sizeof sh, "%s B=%d T=%d NH=%d NKV=%d HS=%d%s", att_path_name[path], B, T_, NH, NKV, HS,
             growing ? ", growing scores" : "");
    float *inp = randn(r, (size_t)N * W, 0, 1);
    if (growing)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < NKV * HS; c++) inp[(size_t)i * W + C + c] *= 1.0f + (float)(i % T_) / 8.0f;
    /* the reference sees the 16-bit inputs the kernel sees */
    Dev<T> dinp = upload<T>(inp, (size_t)N * W);
    float *rounded = download(dinp);
    Dev<T> dout = dev_alloc<T>((size_t)N * C);
    Dev<float> dlse = dev_alloc<float>((size_t)B * NH * T_);
    float *out = (float *)malloc((size_t)N * C * 4), *att = (float *)malloc((size_t)B * NH * T_ * T_ * 4);
    attention_forward(out, att, rounded, B, T_, NH, NKV, HS);
    auto forward = [&](T *o, float *l) {
        if constexpr (sizeof(T) == 2) {
            if (path == ATT_FA2) return attention_forward_fa2(o, l, dinp.p, B, T_, NH, NKV, HS, (cudaStream_t)0);
            if (path == ATT_WMMA) return attention_forward_tc(o, l, dinp.p, B, T_, C, NH, NKV, (cudaStream_t)0);
        }
        attention_forward_simt(o, l, dinp.p, B, T_, C, NH, NKV, (cudaStream_t)0);
    };
    forward(dout.p, dlse.p);
    /* the tolerances of test_attention's forward: fp32 order effects; 16-bit: P and the output
     * rounded to 16 bits */
    expect("attention forward out (GQA)", dout, out, pick<T>({{2e-5, 1e-4}, {1e-2, 8e-3}, {2e-3, 1e-3}}), sh);
    float *lse = attention_lse_ref(rounded, B, T_, C, NH, NKV);
    /* logsumexp in fp32 vs a double reference: O(1..10) values */
    expect("attention forward logsumexp (GQA)", dlse, lse, {1e-5, 1e-5}, sh);

    /* backward overwrites dinp: start from garbage */
    float *dy = randn(r, (size_t)N * C, 0, 1), *dref = (float *)malloc((size_t)N * W * 4);
    Dev<T> ddy = upload<T>(dy, (size_t)N * C), ddinp = dev_alloc<T>((size_t)N * W);
    Dev<float> scratch = dev_alloc<float>(attention_backward_scratch_floats((size_t)N, NH, HS));
    cudaCheck(cudaMemset(ddinp.p, 0x5A, (size_t)N * W * sizeof(T)));
    attention_backward(dref, dy, rounded, att, B, T_, NH, NKV, HS);
    auto backward = [&](T *di) {
        if constexpr (sizeof(T) == 2) {
            if (path == ATT_FA2)
                return attention_backward_fa2(di, ddy.p, dinp.p, dout.p, dlse.p, B, T_, NH, NKV, HS, scratch.p, (cudaStream_t)0);
            if (path == ATT_WMMA)
                return attention_backward_tc(di, ddy.p, dinp.p, dout.p, dlse.p, B, T_, C, NH, NKV, scratch.p, (cudaStream_t)0);
        }
        attention_backward_simt(di, ddy.p, dinp.p, dout.p, dlse.p, B, T_, C, NH, NKV, scratch.p, (cudaStream_t)0);
    };
    backward(ddinp.p);
    /* the tolerances of test_attention's backward: fp32: recomputed probabilities, other order;
     * 16-bit: out, P, dS and the result rounded to 16 bits, sums over up to T (times the group
     * size for dk, dv) terms (growing scores: see test_attention, compared there) */
    if (!growing || sizeof(T) == 4) {
        expect("attention backward dinp (GQA)", ddinp, dref, pick<T>({{1e-4, 1e-4}, {3e-2, 1.6e-2}, {6e-3, 3e-3}}), sh);
    } else {
        Dev<T> simt = dev_alloc<T>((size_t)N * W);
        attention_backward_simt(simt.p, ddy.p, dinp.p, dout.p, dlse.p, B, T_, C, NH, NKV, scratch.p, (cudaStream_t)0);
        float *ref = download(simt);
        expect("attention backward dinp (GQA) vs the CUDA-core kernels", ddinp, ref, pick<T>({{0, 0}, {3e-2, 1.6e-2}, {6e-3, 3e-3}}), sh);
        free(ref);
        dev_free(simt);
    }
    if (path == ATT_FA2 && T_ == 129) { /* several key blocks, 32-row query tiles, a group of 2 */
        /* a second run over the scratch the first left (dQ accumulator, turn counters) gives the
         * same bits: the first key block stores, not adds, and the counters start from zero */
        Dev<T> again = dev_alloc<T>((size_t)N * W);
        backward(again.p);
        float *a1 = download(ddinp), *a2 = download(again);
        char name[224];
        snprintf(name, sizeof name, "attention backward (GQA) run twice: the same bits [%s]", sh);
        test_report(memcmp(a1, a2, (size_t)N * W * 4) == 0, name, "the two runs differ");
        free(a1), free(a2);
        dev_free(again);
    }
    free(inp), free(rounded), free(out), free(att), free(lse), free(dy), free(dref);
    dev_free(dinp), dev_free(dout), dev_free(dlse), dev_free(ddy), dev_free(ddinp), dev_free(scratch);
}

template <class T> static void test_gelu(Rng *r, size_t n, const char *sh) {
    float *x = randn(r, n, 0, 2), *dy = randn(r, n, 0, 1);
    Dev<T> dx = upload<T>(x, n), ddy = upload<T>(dy, n), dout = dev_alloc<T>(n), ddx = dev_alloc<T>(n);
    float *out = (float *)malloc(n * 4), *dxr = (float *)malloc(n * 4);
    gelu_forward(out, x, n);
    gelu_backward(dxr, x, dy, n);
    gelu_forward(dout.p, dx.p, n, (cudaStream_t)0);
    gelu_backward(ddx.p, dx.p, ddy.p, n, (cudaStream_t)0);
    /* fp32: the device's tanhf and glibc's (libmvec's <= 4 ulp, CUDA's <= 2 ulp) differ by up to
     * 6 ulp of th = tanh(u), and both formulas are evaluated in fp32. forward: out = x/2 (1 + th),
     * so |d out / d th| = |x|/2; backward: local = (1 + th)/2 + x/2 (1 - th^2) k (1 + 3a x^2), so
     * |d local / d th| = |1/2 - x th k (1 + 3a x^2)|, large where th ~ -1 and 1 + th cancels (|x| ~ 4;
     * seen on an H200: 2.4e-6 apart at a value of 6.5e-5). The bound per element is that
     * sensitivity times 6 ulp of th, plus a few fp32 roundings of the result; 16-bit: one rounding
     * of the result (half an ulp: 2^-8 or 2^-11 relative) on top. */
    const double k = 0.7978845608028654, a = 0.044715, ulp_th = ldexp(1.0, -24);
    const double round_rel = sizeof(T) == 4 ? 4 * ldexp(1.0, -24) : StorageInfo<T>::cuda_type == CUDA_R_16BF ? ldexp(1.0, -8) : ldexp(1.0, -11);
    const double tiny = StorageInfo<T>::cuda_type == CUDA_R_16F ? ldexp(1.0, -25) : 1e-30; /* fp16 subnormal spacing / 2 */
    double *bf = (double *)calloc(n, sizeof(double)), *bb = (double *)calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        const double xi = x[i], th = tanh(k * (xi + a * xi * xi * xi));
        const double sens_f = fabs(xi) / 2, sens_b = fabs(0.5 - xi * th * k * (1 + 3 * a * xi * xi)) * fabs(dy[i]);
        bf[i] = sens_f * 6 * ulp_th + round_rel * fabs(out[i]) + tiny;
        bb[i] = sens_b * 6 * ulp_th + round_rel * fabs(dxr[i]) + 4 * ldexp(1.0, -24) * fabs(dy[i]) + tiny;
    }
    expect_within("gelu_forward out", dout, out, bf, sh);
    expect_within("gelu_backward dinp", ddx, dxr, bb, sh);
    /* views one element in: the pointers are not 16-byte aligned, so the element-per-thread
     * kernels run; they must give the same bits as the packed ones */
    if (n > 1) {
        float *fw = download(dout), *bw = download(ddx);
        cudaCheck(cudaMemset(dout.p, 0x7f, n * sizeof(T)));
        cudaCheck(cudaMemset(ddx.p, 0x7f, n * sizeof(T)));
        gelu_forward(dout.p + 1, dx.p + 1, n - 1, (cudaStream_t)0);
        gelu_backward(ddx.p + 1, dx.p + 1, ddy.p + 1, n - 1, (cudaStream_t)0);
        expect_view("gelu_forward unaligned view == packed", dout.p + 1, n - 1, fw + 1, {0, 0}, sh);
        expect_view("gelu_backward unaligned view == packed", ddx.p + 1, n - 1, bw + 1, {0, 0}, sh);
        free(fw), free(bw);
    }
    free(bf), free(bb);
    free(x), free(dy), free(out), free(dxr);
    dev_free(dx), dev_free(ddy), dev_free(dout), dev_free(ddx);
}

template <class T> static void test_classifier(Rng *r, int N, int V, int Vp, const char *sh) {
    float *z = randn(r, (size_t)N * Vp, 0, 3);
    int *y = (int *)malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) y[i] = (int)(rng_u32(r) % (uint32_t)V);
    for (int i = 0; i < N; i++) z[(size_t)i * Vp + V] = 1e4f * (Vp > V); /* padded columns must not count */
    Dev<T> dz = upload<T>(z, (size_t)N * Vp);
    Dev<int> dy = upload_ints(y, N);
    Dev<float> dl = dev_alloc<float>(N);
    float *zr = copy_of(z, (size_t)N * Vp), *lr = (float *)malloc(N * 4);
    /* eval: losses only, logits untouched */
    fused_classifier(zr, lr, y, 0.0f, N, V, Vp, 0);
    fused_classifier(dz.p, dl.p, dy.p, 0.0f, N, V, Vp, 0, (cudaStream_t)0);
    Tol tl = {1e-5, 1e-5}; /* fp32 on identical inputs; only exp/log and sum order differ */
    expect("fused_classifier losses (eval)", dl, lr, tl, sh);
    expect("fused_classifier leaves logits (eval)", dz, z, {0, 0}, sh);
    /* fp16 trains with loss scaling, which keeps dlogits above the subnormal range; test it
     * at the scale it is used (dloss 1), the others at the unscaled 1/N */
    const bool is_fp16 = StorageInfo<T>::cuda_type == CUDA_R_16F;
    const float dloss = is_fp16 ? 1.0f : 1.0f / N;
    fused_classifier(zr, lr, y, dloss, N, V, Vp, 1);
    fused_classifier(dz.p, dl.p, dy.p, dloss, N, V, Vp, 1, (cudaStream_t)0);
    expect("fused_classifier losses", dl, lr, tl, sh);
    /* dlogits = dloss * (p - onehot): at the target p - 1 cancels, leaving a few fp32 ulps of
     * dloss absolute (expf and sum order); 16-bit: plus one rounding of the result */
    const double at = 1e-6 * dloss;
    /* fp16: values below 6e-5 are subnormal, spaced 6e-8 apart: half a spacing absolute */
    expect("fused_classifier dlogits", dz, zr, pick<T>({{at, 1e-4}, {at, 4e-3}, {at + 3e-8, 5e-4}}), sh);
    float *got = download(dz);
    int nonzero = 0;
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) nonzero += got[(size_t)i * Vp + v] != 0.0f;
    char name[300];
    snprintf(name, sizeof name, "fused_classifier padded columns zero [%s %s]", StorageInfo<T>::name, sh);
    test_report(nonzero == 0, name, "%d padded dlogits are not exactly 0", nonzero);
    free(z), free(y), free(zr), free(lr), free(got);
    dev_free(dz), dev_free(dy), dev_free(dl);
}

template <class T> static void test_adamw(Rng *r, size_t n, const char *sh) {
    float *p = randn(r, n, 0, 1), *g = randn(r, n, 0, 1), *m = randn(r, n, 0, 0.1f), *v = randn(r, n, 0, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, clip = 0.7f;
    const int t = 3;
    Dev<T> dp = upload<T>(p, n), dg = upload<T>(g, n);
    Dev<float> dm = upload<float>(m, n), dv = upload<float>(v, n), dmaster = upload<float>(p, n);
    float *rp = copy_of(p, n), *rm = copy_of(m, n), *rv = copy_of(v, n);
    adamw_update(rp, g, rm, rv, n, lr, b1, b2, eps, wd, t, clip);
    const bool use_master = sizeof(T) != 4;
    adamw_update(dp.p, use_master ? dmaster.p : (float *)NULL, dg.p, dm.p, dv.p, n, lr, b1, b2, eps, wd, t, clip, 42,
                 (cudaStream_t)0);
    Tol tight = {1e-7, 1e-6}; /* fp32 moments and master: the same formula, contraction only */
    expect("adamw_update m", dm, rm, tight, sh);
    expect("adamw_update v", dv, rv, tight, sh);
    if (use_master) {
        expect("adamw_update master", dmaster, rp, tight, sh);
        /* params: a stochastic rounding of the master: within one T ulp (2^-7 / 2^-10 relative) */
        expect("adamw_update params (rounded master)", dp, rp, pick<T>({{0, 0}, {1e-30, 7.9e-3}, {6e-8, 9.8e-4}}), sh);
    } else {
        expect("adamw_update params", dp, rp, tight, sh);
    }
    {   /* the element-per-thread kernel (pointers one element off 16 bytes) gives the packed
         * kernel's bits: the same inputs at index 1 of each buffer, the same random bits (idx0) */
        Dev<T> up = dev_alloc<T>(n + 1), ug = dev_alloc<T>(n + 1);
        Dev<float> um = dev_alloc<float>(n + 1), uv = dev_alloc<float>(n + 1), umaster = dev_alloc<float>(n + 1);
        T *tmp = (T *)malloc(n * sizeof(T));
        for (size_t i = 0; i < n; i++) tmp[i] = from_float<T>(p[i]);
        cudaCheck(cudaMemcpy(up.p + 1, tmp, n * sizeof(T), cudaMemcpyHostToDevice));
        for (size_t i = 0; i < n; i++) tmp[i] = from_float<T>(g[i]);
        cudaCheck(cudaMemcpy(ug.p + 1, tmp, n * sizeof(T), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(um.p + 1, m, n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(uv.p + 1, v, n * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(umaster.p + 1, p, n * 4, cudaMemcpyHostToDevice));
        adamw_update(up.p + 1, use_master ? umaster.p + 1 : (float *)NULL, ug.p + 1, um.p + 1, uv.p + 1, n, lr, b1, b2, eps,
                     wd, t, clip, 42, (cudaStream_t)0);
        float *packed_p = download(dp), *packed_m = download(dm), *packed_v = download(dv);
        expect_view("adamw_update element kernel == packed: params", up.p + 1, n, packed_p, {0, 0}, sh);
        expect_view("adamw_update element kernel == packed: m", um.p + 1, n, packed_m, {0, 0}, sh);
        expect_view("adamw_update element kernel == packed: v", uv.p + 1, n, packed_v, {0, 0}, sh);
        free(tmp), free(packed_p), free(packed_m), free(packed_v);
        dev_free(up), dev_free(ug), dev_free(um), dev_free(uv), dev_free(umaster);
    }
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv);
    dev_free(dp), dev_free(dg), dev_free(dm), dev_free(dv), dev_free(dmaster);
}

/* adamw_update_compact: the packed kernel (16 elements per thread in 16-byte packs, the int8
 * scales over a half-warp) writes the element-per-thread kernel's bytes (params, master, m and
 * v), for bf16 and int8 states, on k with a partial last block and a tail shorter than a pack
 * (the caller gives a k whose int8 codes are 16-byte aligned and one whose are not),
 * over three segments (decay, none, decay). The element kernel runs on the same inputs placed
 * off 16 bytes (one element for params, grads and master, 4 bytes for the states). */
template <class T> static void test_adamw_compact(Rng *r, size_t k, const char *sh) {
    float *p = randn(r, k, 0, 1), *g = randn(r, k, 0, 1), *m = randn(r, k, 0, 0.1f), *v = randn(r, k, 0, 0.1f);
    for (size_t i = 0; i < k; i++) v[i] = v[i] * v[i];
    OptSegments seg;
    memset(&seg, 0, sizeof seg);
    seg.count = 3, seg.end[0] = k / 3, seg.end[1] = k / 2, seg.end[2] = k;
    seg.decay[0] = 0.1f, seg.decay[1] = 0.0f, seg.decay[2] = 0.1f;
    const bool use_master = sizeof(T) != 4;
    T *tp = (T *)malloc(k * sizeof(T)), *tg = (T *)malloc(k * sizeof(T));
    for (size_t i = 0; i < k; i++) tp[i] = from_float<T>(p[i]), tg[i] = from_float<T>(g[i]);
    for (int state : {(int)OPTSTATE_BF16, (int)OPTSTATE_INT8}) {
        const size_t sb = optstate_bytes(k, state);
        uint8_t *hm = (uint8_t *)malloc(sb), *hv = (uint8_t *)malloc(sb);
        optstate_encode(hm, state, 0, k, m);
        optstate_encode(hv, state, 1, k, v);
        const size_t sizes[5] = {k * sizeof(T), k * sizeof(T), k * 4, sb, sb};
        const void *src[5] = {tp, tg, p, hm, hv};
        uint8_t *out[2][5];
        for (int c = 0; c < 2; c++) { /* c 0: 16-byte aligned (packed); 1: off 16 bytes (element kernel) */
            const size_t off[5] = {c * sizeof(T), c * sizeof(T), c * 4u, c * 4u, c * 4u};
            char *d[5];
            for (int a = 0; a < 5; a++) {
                cudaCheck(cudaMalloc((void **)&d[a], sizes[a] + 16));
                d[a] += off[a];
                cudaCheck(cudaMemcpy(d[a], src[a], sizes[a], cudaMemcpyHostToDevice));
            }
            adamw_update_compact<T>((T *)d[0], use_master ? (float *)d[2] : (float *)NULL, (const T *)d[1], d[3], d[4],
                                    state, k, &seg, 1e-2f, 0.9f, 0.95f, 1e-8f, 3, 0.7f, 42, (cudaStream_t)0, 7);
            cudaCheck(cudaDeviceSynchronize());
            for (int a = 0; a < 5; a++) {
                out[c][a] = (uint8_t *)malloc(sizes[a]);
                cudaCheck(cudaMemcpy(out[c][a], d[a], sizes[a], cudaMemcpyDeviceToHost));
                cudaCheck(cudaFree(d[a] - off[a]));
            }
        }
        static const char *const what[5] = {"params", "grads", "master", "m", "v"};
        for (int a = 0; a < 5; a++) {
            size_t first = sizes[a];
            for (size_t i = 0; i < sizes[a] && first == sizes[a]; i++)
                if (out[0][a][i] != out[1][a][i]) first = i;
            char name[256];
            snprintf(name, sizeof name, "adamw_update_compact %s state: packed kernel == element kernel, %s bytes [%s %s]",
                     state == OPTSTATE_BF16 ? "bf16" : "int8", what[a], StorageInfo<T>::name, sh);
            test_report(first == sizes[a], name, "byte %zu of %zu differs (%u vs %u)", first, sizes[a],
                        first < sizes[a] ? out[0][a][first] : 0u, first < sizes[a] ? out[1][a][first] : 0u);
            free(out[0][a]), free(out[1][a]);
        }
        free(hm), free(hv);
    }
    free(tp), free(tg), free(p), free(g), free(m), free(v);
}

/* Stochastic rounding is unbiased: many copies of one value between two T neighbours round to
 * a mean within a few standard errors of the value. */
template <class T> static void test_stochastic_rounding(const char *sh) {
    const size_t n = 8192;
    const float x = 1.0f + 0.3f * (sizeof(T) == 2 && StorageInfo<T>::cuda_type == CUDA_R_16BF ? 0.0078125f : 0.0009765625f);
    float *p = (float *)malloc(n * 4), *zeros = (float *)calloc(n, 4);
    for (size_t i = 0; i < n; i++) p[i] = x;
    Dev<float> master = dev_alloc<float>(n), dm = upload<float>(zeros, n), dv = upload<float>(zeros, n);
    cudaCheck(cudaMemcpy(master.p, p, n * 4, cudaMemcpyHostToDevice));
    Dev<T> dp = dev_alloc<T>(n), dg = upload<T>(zeros, n);
    adamw_update(dp.p, master.p, dg.p, dm.p, dv.p, n, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f, 7, (cudaStream_t)0);
    float *got = download(dp);
    double mean = 0.0;
    for (size_t i = 0; i < n; i++) mean += got[i];
    mean /= n;
    const double ulp = StorageInfo<T>::cuda_type == CUDA_R_16BF ? 0.0078125 : 0.0009765625;
    const double se = ulp * sqrt(0.3 * 0.7 / n);
    char name[160];
    snprintf(name, sizeof name, "stochastic rounding is unbiased [%s %s]", StorageInfo<T>::name, sh);
    test_report(fabs(mean - x) < 6 * se, name, "mean %.9g of %zu roundings of %.9g (6 standard errors: %.3g)", mean, n, x, 6 * se);
    free(p), free(zeros), free(got);
    dev_free(master), dev_free(dm), dev_free(dv), dev_free(dp), dev_free(dg);
}

template <class T> static void test_norm(Rng *r, size_t n, const char *sh) {
    float *g = randn(r, n, 0, 1);
    Dev<T> dg = upload<T>(g, n);
    Dev<float> out = dev_alloc<float>(1), scratch = dev_alloc<float>(NORM_BLOCKS);
    float ref = (float)global_norm_squared(g, n);
    global_norm_squared(out.p, dg.p, n, scratch.p, (cudaStream_t)0);
    /* fp32 sums of n squares in another order; the inputs are identical */
    expect("global_norm_squared", out, &ref, {1e-6, 1e-5}, sh);
    {   /* the element-per-thread kernel: a view one element off 16 bytes */
        float ref1 = (float)global_norm_squared(g + 1, n - 1);
        global_norm_squared(out.p, dg.p + 1, n - 1, scratch.p, (cudaStream_t)0);
        expect("global_norm_squared (unaligned view)", out, &ref1, {1e-6, 1e-5}, sh);
    }
    /* an inf or a NaN anywhere must make the result non-finite (fp16 overflow detection) */
    const float bad[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        T v = from_float<T>(bad[k]);
        cudaCheck(cudaMemcpy(dg.p + n / 2, &v, sizeof(T), cudaMemcpyHostToDevice));
        global_norm_squared(out.p, dg.p, n, scratch.p, (cudaStream_t)0);
        float got;
        cudaCheck(cudaMemcpy(&got, out.p, 4, cudaMemcpyDeviceToHost));
        char name[300];
        snprintf(name, sizeof name, "global_norm_squared flags a planted %s [%s %s]", k ? "NaN" : "inf", StorageInfo<T>::name, sh);
        test_report(!isfinite(got), name, "got finite %g", got);
    }
    free(g);
    dev_free(dg), dev_free(out), dev_free(scratch);
}

template <class T> static void test_residual(Rng *r, size_t n, const char *sh) {
    float *a = randn(r, n, 0, 1), *b = randn(r, n, 0, 1);
    Dev<T> da = upload<T>(a, n), db = upload<T>(b, n), dout = dev_alloc<T>(n);
    float *ref = (float *)malloc(n * 4);
    for (size_t i = 0; i < n; i++) ref[i] = to_float(from_float<T>(a[i] + b[i])); /* one fp32 add, one rounding */
    residual_forward(dout.p, da.p, db.p, n, (cudaStream_t)0);
    expect("residual_forward out", dout, ref, {0, 0}, sh);
    if (n > 1) { /* unaligned views (element-per-thread kernel), and in place (out aliases inp1) */
        cudaCheck(cudaMemset(dout.p, 0x7f, n * sizeof(T)));
        residual_forward(dout.p + 1, da.p + 1, db.p + 1, n - 1, (cudaStream_t)0);
        expect_view("residual_forward unaligned view", dout.p + 1, n - 1, ref + 1, {0, 0}, sh);
        residual_forward(da.p, da.p, db.p, n, (cudaStream_t)0);
        expect("residual_forward in place (out = inp1)", da, ref, {0, 0}, sh);
    }
    free(a), free(b), free(ref);
    dev_free(da), dev_free(db), dev_free(dout);
}

template <class T> static void test_cast(Rng *r, size_t n, const char *sh) {
    float *x = randn(r, n, 0, 100);
    Dev<float> dx = dev_alloc<float>(n);
    cudaCheck(cudaMemcpy(dx.p, x, n * 4, cudaMemcpyHostToDevice));
    Dev<T> dt = dev_alloc<T>(n);
    cast_copy(dt.p, dx.p, n, (cudaStream_t)0);
    float *ref = (float *)malloc(n * 4);
    for (size_t i = 0; i < n; i++) ref[i] = to_float(from_float<T>(x[i])); /* host RNE */
    expect("cast_copy float -> T (round to nearest even)", dt, ref, {0, 0}, sh);
    {   /* back to float (exact), and unaligned views through the element-per-thread kernel */
        Dev<float> back = dev_alloc<float>(n);
        cast_copy(back.p, dt.p, n, (cudaStream_t)0);
        expect("cast_copy T -> float (exact)", back, ref, {0, 0}, sh);
        if (n > 1) {
            cudaCheck(cudaMemset(dt.p, 0x7f, n * sizeof(T)));
            cast_copy(dt.p + 1, dx.p + 1, n - 1, (cudaStream_t)0);
            expect_view("cast_copy float -> T unaligned view", dt.p + 1, n - 1, ref + 1, {0, 0}, sh);
        }
        dev_free(back);
    }
    if (StorageInfo<T>::cuda_type == CUDA_R_16BF) { /* and the checkpoint writer agrees */
        int bad = 0;
        for (size_t i = 0; i < n; i++) bad += bf16_to_float(float_to_bf16(x[i])) != ref[i];
        test_report(bad == 0, "float_to_bf16 (checkpoint.c) == device bf16 rounding", "%d differences", bad);
    }
    free(x), free(ref);
    dev_free(dx), dev_free(dt);
}

/* --attention: only the attention tests (test/test_cudasim_mutants.sh runs its attention
 * mutants so: the same checks of those kernels, a fraction of the time) */
static int g_attention_only = 0;

template <class T> static void run_all(unsigned long long seed, const CudaContext *ctx, const Shape *shapes, int nshapes) {
    for (int k = 0; k < nshapes; k++) {
        const Shape &s = shapes[k];
        char sh[128];
        shape_text(sh, sizeof sh, s);
        Rng r;
        rng_seed(&r, seed + 1000 * k + StorageInfo<T>::cuda_type);
        if (g_attention_only) {
            test_attention<T>(&r, s, sh);
            continue;
        }
        test_encoder<T>(&r, s, sh);
        test_layernorm<T>(&r, s, sh);
        if (k == 0) {
            /* the layernorm backward's paths: one-pass packed kernel with 1..4 packs per lane (C = 768
             * bf16: 3, C = 1024 bf16: 4; fp32 C = 768: two-pass), C not a whole number of packs
             * (36: packed in fp32 only; 30: never), several chunks with uneven rows per warp (600) */
            /* the packed forwards hold 1, 2, 4 or 8 packs per lane: C = 384 gives 2 (bf16) and 4
             * (fp32), C = 1024 fp32 8; the encoder's packed and element-per-thread kernels alike */
            static const Shape ln_extra[] = {{1, 7, 768, 12, 7, 16, 3072}, {1, 3, 1024, 16, 7, 16, 4096},
                                             {2, 5, 36, 3, 7, 16, 144},    {1, 9, 30, 3, 7, 16, 120},
                                             {1, 600, 64, 4, 7, 16, 256},  {1, 3, 384, 6, 7, 16, 1536}};
            for (const Shape &e : ln_extra) {
                char she[128];
                shape_text(she, sizeof she, e);
                test_layernorm<T>(&r, e, she);
                if (e.C < 64) test_encoder<T>(&r, e, she);
            }
        }
        test_matmul<T>(&r, ctx, s.B * s.T, s.C, 3 * s.C, sh);
        test_matmul<T>(&r, ctx, s.B * s.T, s.F, s.C, sh);
        test_attention<T>(&r, s, sh);
        test_gelu<T>(&r, (size_t)s.B * s.T * s.F + 3, sh);
        test_residual<T>(&r, (size_t)s.B * s.T * s.C + 5, sh);
        test_classifier<T>(&r, s.B * s.T, s.V, s.Vp, sh);
        if (k == 0) test_classifier<T>(&r, 5, 13, 13, "N=5 V=Vp=13 (element per thread)"); /* Vp not whole packs */
        test_adamw<T>(&r, (size_t)s.C * s.F + 5, sh);
        if (k == 0) {
            /* 8 state blocks (the int8 codes 16-byte aligned) and 6 (8-byte aligned: word accesses) */
            test_adamw_compact<T>(&r, 7 * OPTSTATE_BLOCK + 123, "k=1915 (8 state blocks, a partial one)");
            test_adamw_compact<T>(&r, 6 * OPTSTATE_BLOCK - 3, "k=1533 (6 state blocks, a partial one)");
        }
        test_norm<T>(&r, (size_t)s.C * s.F * 3 + 7, sh);
        test_cast<T>(&r, 1000, sh);
    }
    if (sizeof(T) == 2 && !g_attention_only) test_stochastic_rounding<T>("n=8192");
    /* attention over several 64-row tiles (partial last tiles) for head sizes 32, 64, 128 */
    static const Shape att[] = {{1, 150, 64, 2, 1, 1, 1}, {1, 129, 128, 2, 1, 1, 1}, {2, 97, 256, 2, 1, 1, 1}};
    for (int k = 0; k < (int)(sizeof att / sizeof att[0]); k++) {
        char sh[128];
        shape_text(sh, sizeof sh, att[k]);
        Rng r;
        rng_seed(&r, seed + 77 * k + StorageInfo<T>::cuda_type);
        test_attention<T>(&r, att[k], sh);
        if (k == 0) test_attention<T>(&r, att[k], sh, true);
    }
    Rng r;
    rng_seed(&r, seed + 4242 + StorageInfo<T>::cuda_type);
    if constexpr (sizeof(T) == 2) {
        /* the FA2 kernels: T within one tile, one past it, several tiles; NKV = NH, NH/2, 1 */
        static const int fa2[][5] = {{1, 1, 2, 2, 64},  {2, 7, 4, 2, 128}, {1, 64, 2, 2, 64},
                                     {1, 65, 4, 1, 64}, {1, 129, 4, 2, 128}, {1, 256, 2, 1, 64}};
        for (const auto &f : fa2) test_attention_gqa<T>(&r, f[0], f[1], f[2], f[3], f[4], ATT_FA2);
        test_attention_gqa<T>(&r, 1, 150, 2, 2, 64, ATT_FA2, true); /* test_attention's growing shape */
        /* the wmma kernels with GQA: NKV = NH/2 across two tiles, NKV = 1 at HS 128 */
        test_attention_gqa<T>(&r, 1, 70, 4, 2, 64, ATT_WMMA);
        test_attention_gqa<T>(&r, 2, 9, 2, 1, 128, ATT_WMMA);
    }
    if constexpr (sizeof(T) == 4) { /* the CUDA-core kernels with GQA (fp32's path) */
        test_attention_gqa<T>(&r, 1, 70, 4, 2, 32, ATT_SIMT);
        test_attention_gqa<T>(&r, 2, 9, 4, 1, 64, ATT_SIMT);
    }
}

/* LLMC_ATTENTION picks the bf16/fp16 kernels (attention.cuh); each case runs in a child process,
 * since the choice is made once per process: exit status (0: FA2 at HS 64, 2: not), stderr. */
static int attention_choice(const char *value, char *err, size_t len) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        if (value) setenv("LLMC_ATTENTION", value, 1);
        else unsetenv("LLMC_ATTENTION");
        _exit(attention_use_fa2(64) && !attention_use_fa2(32) ? 0 : 2);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], err, len - 1);
    err[n > 0 ? n : 0] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_attention_choice(void) {
    char err[256];
    int rc = attention_choice(NULL, err, sizeof err);
    test_report(rc == 0, "attention: FA2 by default at head size 64 (sm_90), wmma at 32", "exit %d, stderr %s", rc, err);
    rc = attention_choice("fa2", err, sizeof err);
    test_report(rc == 0, "attention: LLMC_ATTENTION=fa2 is the default", "exit %d, stderr %s", rc, err);
    rc = attention_choice("wmma", err, sizeof err);
    test_report(rc == 2, "attention: LLMC_ATTENTION=wmma selects the wmma kernels", "exit %d, stderr %s", rc, err);
    rc = attention_choice("flash", err, sizeof err);
    test_report(rc == 1 && strstr(err, "error: LLMC_ATTENTION=flash") != NULL,
                "attention: LLMC_ATTENTION=flash is an error naming the variable (exit 1)", "exit %d, stderr %s", rc, err);
}

#include "test/cuda_llama_ops.h" /* the Llama ops: run_llama_ops */

int main(int argc, char **argv) {
    unsigned long long seed = 20240601;
    int big = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--big") == 0) big = 1;
        else if (strcmp(argv[i], "--attention") == 0) g_attention_only = 1;
        else llmc_die("usage: %s [--seed N] [--big] [--attention]", argv[0]);
    }
    printf("test_cuda_ops: seed %llu%s (rerun with --seed %llu to reproduce)\n", seed, big ? ", GPT-2 124M shapes" : "", seed);
    cuda_require_device();
    CudaContext ctx;
    cuda_context_init(&ctx, 0, 0); /* TF32 off: fp32 is compared tightly */
    if (!big) test_attention_choice();
    run_llama_ops(seed);
    /* B, T, C, NH, V, Vp, F: odd sizes on purpose; B*T = 1 in the first */
    static const Shape tiny[] = {{1, 1, 32, 2, 7, 16, 128}, {2, 13, 48, 3, 101, 128, 192}, {3, 33, 64, 1, 300, 384, 256}};
    static const Shape gpt2[] = {{4, 1024, 768, 12, 50257, 50304, 3072}, {1, 1, 768, 12, 50257, 50304, 3072}};
    const Shape *shapes = big ? gpt2 : tiny;
    int nshapes = big ? 2 : 3;
    run_all<float>(seed, &ctx, shapes, nshapes);
    run_all<__nv_bfloat16>(seed, &ctx, shapes, nshapes);
    run_all<__half>(seed, &ctx, shapes, nshapes);
    cuda_context_free(&ctx);
    return test_exit_code();
}
