/*
 * test_ops_cpu.c - every CPU op in llmc/cpu checked against this file's own double-precision
 * naive implementation of the math in the op's header, on small awkward shapes.
 *
 * Forward: the float op vs the naive double forward (atol + rtol*|ref|, reason next to each).
 * Backward: the scalar objective L = sum(out * w) with fixed random weights w, so dout = w;
 * the op's analytic gradients vs central finite differences of L computed entirely in double
 * by re-running the naive forward (FD error ~1e-10, far below float rounding of the op, so
 * every tolerance below is about the op's float arithmetic, not about the FD).
 * Gradient contracts are tested as written in the headers: accumulate (+=) targets are
 * pre-filled with known random values that must be kept and added to; overwrite (=) targets
 * are pre-filled with NaN that must be gone.
 * Also: AdamW one step vs a double reimplementation, global_norm_squared vs a double sum,
 * llmc_sgemm and llmc_sgemm_fallback vs a naive triple loop for all transposes with padded
 * leading dimensions (NaN in the padding, a canary after each row of C).
 *
 * Seeds are fixed and printed; `--seed N` replaces the base seed (each check adds its index).
 * Usage: test_ops_cpu [--seed N]
 */
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/moe.h"
#include "llmc/cpu/residual.h"
#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"
#include "test/testing.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SEED 1337ull

/* ---- deterministic data: xorshift64* ------------------------------------------------------ */

typedef struct {
    uint64_t s;
} Rng;

static Rng rng_make(const char *what, uint64_t seed) {
    printf("      %s: seed %llu\n", what, (unsigned long long)seed);
    Rng r = {seed * 0x2545F4914F6CDD1Dull + 0x9E3779B97F4A7C15ull};
    if (r.s == 0) r.s = 1;
    return r;
}

static uint64_t rng_u64(Rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [lo, hi) from 24 random bits. */
static float rng_uniform(Rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_u64(r) >> 40) / 16777216.0);
}

static int rng_int(Rng *r, int n) { return (int)(rng_u64(r) % (uint64_t)n); }

/* ---- buffers -------------------------------------------------------------------------------- */

static float *falloc(size_t n) {
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "test_ops_cpu: out of memory (%zu floats)\n", n);
        exit(2);
    }
    return p;
}

static double *dalloc(size_t n) {
    double *p = (double *)calloc(n ? n : 1, sizeof(double));
    if (!p) {
        fprintf(stderr, "test_ops_cpu: out of memory (%zu doubles)\n", n);
        exit(2);
    }
    return p;
}

static float *frand(Rng *r, size_t n, float lo, float hi) {
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = rng_uniform(r, lo, hi);
    return p;
}

static float *fnan(size_t n) {
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static float *fcopy(const float *x, size_t n) {
    float *p = falloc(n);
    memcpy(p, x, (n ? n : 1) * sizeof(float));
    return p;
}

static double *to_double(const float *x, size_t n) {
    double *p = dalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}

static double dot_d(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* test_close against a double reference (rounded to float: 6e-8 relative, below every tol). */
static int check_close_d(const char *name, const float *got, const double *ref, size_t n, double atol,
                         double rtol) {
    float *r = falloc(n);
    for (size_t i = 0; i < n; i++) r[i] = (float)ref[i];
    int ok = test_close(name, got, r, n, atol, rtol);
    free(r);
    return ok;
}

/* ref = prefill + grad: what an accumulating (+=) backward must leave behind. */
static double *plus_prefill(const float *prefill, const double *grad, size_t n) {
    double *p = dalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (double)prefill[i] + grad[i];
    return p;
}

static void check_bitwise(const char *name, const float *got, const float *ref, size_t n) {
    size_t i = 0;
    while (i < n && memcmp(got + i, ref + i, sizeof(float)) == 0) i++;
    test_report(i == n, name, "first difference at [%zu]: got %.9g, ref %.9g", i, i < n ? got[i] : 0.0,
                i < n ? ref[i] : 0.0);
}

/* ---- central finite differences in double ------------------------------------------------- */

typedef double (*Objective)(void *ctx);

/* grad[i] = (L(x + h e_i) - L(x - h e_i)) / 2h, h = 1e-5 * max(1, |x_i|), all in double:
 * truncation h^2 |L'''| / 6 ~ 1e-10, rounding ~ 1e-16 |L| / h ~ 1e-10. x is restored. */
static void fd_gradient(double *grad, double *x, size_t n, Objective L, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-5 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = L(ctx);
        x[i] = x0 - h;
        double lm = L(ctx);
        x[i] = x0;
        grad[i] = (lp - lm) / (2.0 * h);
    }
}

/* ---- encoder ------------------------------------------------------------------------------ */

typedef struct {
    int B, T, C;
    const int *inp;                 /* (B, T) */
    double *wte, *wpe, *w, *out;    /* (Vp, C), (maxT, C), (B, T, C), (B, T, C) */
} EncoderRef;

static double encoder_ref_loss(void *ctx) {
    EncoderRef *e = (EncoderRef *)ctx;
    for (int b = 0; b < e->B; b++)
        for (int t = 0; t < e->T; t++)
            for (int c = 0; c < e->C; c++) {
                size_t bt = (size_t)b * e->T + t;
                e->out[bt * e->C + c] = e->wte[(size_t)e->inp[bt] * e->C + c] + e->wpe[(size_t)t * e->C + c];
            }
    return dot_d(e->out, e->w, (size_t)e->B * e->T * e->C);
}

static void test_encoder(uint64_t seed) {
    const int B = 2, T = 5, C = 12, V = 13, Vp = 16, maxT = 7;
    printf("encoder: B=%d T=%d C=%d V=%d Vp=%d maxT=%d\n", B, T, C, V, Vp, maxT);
    Rng r = rng_make("encoder", seed);
    const size_t nout = (size_t)B * T * C, nwte = (size_t)Vp * C, nwpe = (size_t)maxT * C;
    /* tokens from a few ids, so rows repeat (the backward must sum them) and most rows of
     * wte are never used (their gradient must stay the pre-filled value); plus V-1 */
    int *inp = (int *)malloc((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) inp[i] = rng_int(&r, 4);
    inp[B * T - 1] = V - 1;
    float *wte = frand(&r, nwte, -1, 1), *wpe = frand(&r, nwpe, -1, 1), *w = frand(&r, nout, -1, 1);
    float *out = fnan(nout);
    encoder_forward(out, inp, wte, wpe, B, T, C);

    EncoderRef e = {B, T, C, inp, to_double(wte, nwte), to_double(wpe, nwpe), to_double(w, nout), dalloc(nout)};
    encoder_ref_loss(&e);
    /* a sum of two floats: correctly rounded, so the float result is the rounded double one */
    check_close_d("encoder_forward out", out, e.out, nout, 0, 6e-8);

    float *dwte = frand(&r, nwte, -1, 1), *dwpe = frand(&r, nwpe, -1, 1);
    float *dwte0 = fcopy(dwte, nwte), *dwpe0 = fcopy(dwpe, nwpe);
    encoder_backward(dwte, dwpe, w, inp, B, T, C);
    double *g_wte = dalloc(nwte), *g_wpe = dalloc(nwpe);
    fd_gradient(g_wte, e.wte, nwte, encoder_ref_loss, &e);
    fd_gradient(g_wpe, e.wpe, nwpe, encoder_ref_loss, &e);
    double *ref_wte = plus_prefill(dwte0, g_wte, nwte), *ref_wpe = plus_prefill(dwpe0, g_wpe, nwpe);
    /* sums of <= B*T terms of size <= 1 on top of a prefill <= 1: float rounding ~1e-7 */
    check_close_d("encoder_backward dwte (+= onto prefill, FD)", dwte, ref_wte, nwte, 1e-6, 1e-6);
    check_close_d("encoder_backward dwpe (+= onto prefill, FD)", dwpe, ref_wpe, nwpe, 1e-6, 1e-6);
    /* rows of wte no token uses and wpe rows t >= T: exactly the prefill */
    int untouched = 1;
    for (int v = 0; v < Vp; v++) {
        int used = 0;
        for (int i = 0; i < B * T; i++) used |= inp[i] == v;
        if (!used) untouched &= memcmp(dwte + (size_t)v * C, dwte0 + (size_t)v * C, C * sizeof(float)) == 0;
    }
    untouched &= memcmp(dwpe + (size_t)T * C, dwpe0 + (size_t)T * C, (size_t)(maxT - T) * C * sizeof(float)) == 0;
    test_report(untouched, "encoder_backward leaves unused dwte rows and dwpe rows t >= T bit-identical",
                "an untouched row changed");
    /* the token-only twin: the same dwte (the wte rows' gradient does not depend on wpe) */
    float *dwte_tok = fcopy(dwte0, nwte);
    embedding_backward(dwte_tok, w, inp, B * T, C);
    check_close_d("embedding_backward dwte (+= onto prefill, FD)", dwte_tok, ref_wte, nwte, 1e-6, 1e-6);
    free(dwte_tok);

    free(inp), free(wte), free(wpe), free(w), free(out), free(dwte), free(dwpe), free(dwte0), free(dwpe0);
    free(e.wte), free(e.wpe), free(e.w), free(e.out), free(g_wte), free(g_wpe), free(ref_wte), free(ref_wpe);
}

/* ---- layernorm ---------------------------------------------------------------------------- */

typedef struct {
    int N, C;
    double *inp, *weight, *bias, *w;   /* (N, C), (C), (C), (N, C) */
    double *out, *mean, *rstd;         /* (N, C), (N), (N) */
} LayernormRef;

static double layernorm_ref_loss(void *ctx) {
    LayernormRef *l = (LayernormRef *)ctx;
    for (int i = 0; i < l->N; i++) {
        const double *x = l->inp + (size_t)i * l->C;
        double m = 0.0, var = 0.0;
        for (int c = 0; c < l->C; c++) m += x[c];
        m /= l->C;
        for (int c = 0; c < l->C; c++) var += (x[c] - m) * (x[c] - m);
        var /= l->C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < l->C; c++) l->out[(size_t)i * l->C + c] = (x[c] - m) * s * l->weight[c] + l->bias[c];
        l->mean[i] = m;
        l->rstd[i] = s;
    }
    return dot_d(l->out, l->w, (size_t)l->N * l->C);
}

static void test_layernorm(uint64_t seed) {
    const int N = 37, C = 12; /* N > the backward's 32 row chunks, not a multiple of them */
    printf("layernorm: N=%d C=%d (row 5 offset by +40, row 6 scaled by 1e-2)\n", N, C);
    Rng r = rng_make("layernorm", seed);
    const size_t n = (size_t)N * C;
    float *inp = frand(&r, n, -2, 2), *weight = frand(&r, C, 0.5f, 1.5f), *bias = frand(&r, C, -1, 1);
    float *w = frand(&r, n, -1, 1);
    for (int c = 0; c < C; c++) inp[5 * C + c] += 40.0f, inp[6 * C + c] *= 1e-2f;
    float *out = fnan(n), *mean = fnan(N), *rstd = fnan(N);
    layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);

    LayernormRef l = {N, C, to_double(inp, n), to_double(weight, C), to_double(bias, C), to_double(w, n),
                      dalloc(n), dalloc(N), dalloc(N)};
    layernorm_ref_loss(&l);
    /* float two-pass over C=12: mean carries ~|x| eps = 40 * 6e-8 on the offset row, which
     * xhat amplifies by rstd (~1): a few 1e-6; rstd up to ~10 on the scaled row, rel. 1e-6 */
    check_close_d("layernorm_forward mean", mean, l.mean, N, 1e-6, 1e-6);
    check_close_d("layernorm_forward rstd", rstd, l.rstd, N, 0, 1e-5);
    check_close_d("layernorm_forward out", out, l.out, n, 2e-5, 1e-5);

    float *out2 = fnan(n);
    layernorm_recompute(out2, inp, mean, rstd, weight, bias, N, C);
    check_bitwise("layernorm_recompute == layernorm_forward (bit for bit)", out2, out, n);

    float *dinp = frand(&r, n, -1, 1), *dweight = frand(&r, C, -1, 1), *dbias = frand(&r, C, -1, 1);
    float *dinp0 = fcopy(dinp, n), *dweight0 = fcopy(dweight, C), *dbias0 = fcopy(dbias, C);
    layernorm_backward(dinp, dweight, dbias, w, inp, weight, mean, rstd, N, C);
    double *g_inp = dalloc(n), *g_weight = dalloc(C), *g_bias = dalloc(C);
    fd_gradient(g_inp, l.inp, n, layernorm_ref_loss, &l);
    fd_gradient(g_weight, l.weight, C, layernorm_ref_loss, &l);
    fd_gradient(g_bias, l.bias, C, layernorm_ref_loss, &l);
    double *ref_inp = plus_prefill(dinp0, g_inp, n), *ref_weight = plus_prefill(dweight0, g_weight, C),
           *ref_bias = plus_prefill(dbias0, g_bias, C);
    /* dinp scales with rstd (~100 on the 1e-2 row): float error ~1e-5 relative of that */
    check_close_d("layernorm_backward dinp (+= onto prefill, FD)", dinp, ref_inp, n, 1e-4, 1e-5);
    /* sums over N=37 rows of |dout * xhat| <= ~2: float rounding ~1e-6 */
    check_close_d("layernorm_backward dweight (+= onto prefill, FD)", dweight, ref_weight, C, 1e-5, 1e-5);
    check_close_d("layernorm_backward dbias (+= onto prefill, FD)", dbias, ref_bias, C, 1e-5, 1e-5);

    free(inp), free(weight), free(bias), free(w), free(out), free(mean), free(rstd), free(out2);
    free(dinp), free(dweight), free(dbias), free(dinp0), free(dweight0), free(dbias0);
    free(l.inp), free(l.weight), free(l.bias), free(l.w), free(l.out), free(l.mean), free(l.rstd);
    free(g_inp), free(g_weight), free(g_bias), free(ref_inp), free(ref_weight), free(ref_bias);
}

/* ---- matmul ------------------------------------------------------------------------------- */

typedef struct {
    int N, C, OC;
    double *inp, *weight, *bias, *w, *out; /* (N, C), (OC, C), (OC) or NULL, (N, OC), (N, OC) */
} MatmulRef;

static double matmul_ref_loss(void *ctx) {
    MatmulRef *m = (MatmulRef *)ctx;
    for (int i = 0; i < m->N; i++)
        for (int o = 0; o < m->OC; o++) {
            double s = m->bias ? m->bias[o] : 0.0;
            for (int c = 0; c < m->C; c++) s += m->inp[(size_t)i * m->C + c] * m->weight[(size_t)o * m->C + c];
            m->out[(size_t)i * m->OC + o] = s;
        }
    return dot_d(m->out, m->w, (size_t)m->N * m->OC);
}

static void test_matmul(uint64_t seed, int with_bias) {
    const int N = 37, C = 12, OC = 7;
    printf("matmul (%s bias): N=%d C=%d OC=%d, sgemm backend: %s\n", with_bias ? "with" : "no", N, C, OC,
           llmc_sgemm_backend());
    Rng r = rng_make(with_bias ? "matmul+bias" : "matmul", seed);
    const size_t nin = (size_t)N * C, nw = (size_t)OC * C, nout = (size_t)N * OC;
    float *inp = frand(&r, nin, -1, 1), *weight = frand(&r, nw, -1, 1), *bias = frand(&r, OC, -1, 1);
    float *w = frand(&r, nout, -1, 1), *out = fnan(nout);
    matmul_forward(out, inp, weight, with_bias ? bias : NULL, N, C, OC);

    MatmulRef m = {N, C, OC, to_double(inp, nin), to_double(weight, nw), with_bias ? to_double(bias, OC) : NULL,
                   to_double(w, nout), dalloc(nout)};
    matmul_ref_loss(&m);
    char name[160];
    /* C=12 products of size <= 1 (+ bias) in float: error <= 12 * 6e-8 * 13 ~ 1e-5 worst case */
    snprintf(name, sizeof name, "matmul_forward%s out (NaN prefill overwritten)", with_bias ? "+bias" : "");
    check_close_d(name, out, m.out, nout, 1e-5, 1e-5);

    float *dinp = fnan(nin), *dweight = frand(&r, nw, -1, 1), *dbias = frand(&r, OC, -1, 1);
    float *dweight0 = fcopy(dweight, nw), *dbias0 = fcopy(dbias, OC);
    matmul_backward(dinp, dweight, with_bias ? dbias : NULL, w, inp, weight, N, C, OC);
    double *g_inp = dalloc(nin), *g_weight = dalloc(nw), *g_bias = dalloc(OC);
    fd_gradient(g_inp, m.inp, nin, matmul_ref_loss, &m);
    fd_gradient(g_weight, m.weight, nw, matmul_ref_loss, &m);
    double *ref_weight = plus_prefill(dweight0, g_weight, nw);
    /* dinp: OC=7 products; dweight: N=37 products + prefill; |terms| <= 1: rounding <= ~5e-6 */
    snprintf(name, sizeof name, "matmul_backward%s dinp (= over NaN prefill, FD)", with_bias ? "+bias" : "");
    check_close_d(name, dinp, g_inp, nin, 1e-5, 1e-5);
    snprintf(name, sizeof name, "matmul_backward%s dweight (+= onto prefill, FD)", with_bias ? "+bias" : "");
    check_close_d(name, dweight, ref_weight, nw, 2e-5, 1e-5);
    if (with_bias) {
        fd_gradient(g_bias, m.bias, OC, matmul_ref_loss, &m);
        double *ref_bias = plus_prefill(dbias0, g_bias, OC);
        check_close_d("matmul_backward+bias dbias (+= onto prefill, FD)", dbias, ref_bias, OC, 2e-5, 1e-5);
        free(ref_bias);
    } else {
        check_bitwise("matmul_backward with dbias=NULL leaves the caller's dbias alone", dbias, dbias0, OC);
    }

    free(inp), free(weight), free(bias), free(w), free(out), free(dinp), free(dweight), free(dbias);
    free(dweight0), free(dbias0), free(m.inp), free(m.weight), free(m.bias), free(m.w), free(m.out);
    free(g_inp), free(g_weight), free(g_bias), free(ref_weight);
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct {
    int B, T, NH, NKV, HS;
    double *inp, *w;   /* (B, T, (NH + 2 NKV) HS), (B, T, NH HS) */
    double *out, *att; /* (B, T, NH HS), (B, NH, T, T) */
} AttentionRef;

static double attention_ref_loss(void *ctx) {
    AttentionRef *a = (AttentionRef *)ctx;
    const int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS, C = NH * HS;
    const size_t QKV = (size_t)(NH + 2 * NKV) * HS;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                /* query head h shares key/value head h * NKV / NH (GQA) */
                const int g = h * NKV / NH;
                const double *q = a->inp + ((size_t)b * T + t) * QKV + h * HS;
                double *row = a->att + (((size_t)b * NH + h) * T + t) * T;
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u < T; u++) {
                    if (u > t) {
                        row[u] = 0.0;
                        continue;
                    }
                    const double *k = a->inp + ((size_t)b * T + u) * QKV + C + g * HS;
                    double s = 0.0;
                    for (int i = 0; i < HS; i++) s += q[i] * k[i];
                    row[u] = s / sqrt((double)HS);
                    mx = fmax(mx, row[u]);
                }
                for (int u = 0; u <= t; u++) sum += row[u] = exp(row[u] - mx);
                for (int u = 0; u <= t; u++) row[u] /= sum;
                for (int i = 0; i < HS; i++) {
                    double o = 0.0;
                    for (int u = 0; u <= t; u++) o += row[u] * a->inp[((size_t)b * T + u) * QKV + C + (size_t)NKV * HS + g * HS + i];
                    a->out[((size_t)b * T + t) * C + h * HS + i] = o;
                }
            }
    return dot_d(a->out, a->w, (size_t)B * T * C);
}

static void test_attention_case(uint64_t seed, int NH, int NKV) {
    const int B = 2, T = 5, HS = 4, C = NH * HS;
    printf("attention: B=%d T=%d NH=%d NKV=%d HS=%d\n", B, T, NH, NKV, HS);
    Rng r = rng_make("attention", seed + (uint64_t)(NH * 16 + NKV));
    const size_t nin = (size_t)B * T * (NH + 2 * NKV) * HS, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    /* |q.k|/sqrt(HS) up to ~6: peaked and flat softmax rows both occur */
    float *inp = frand(&r, nin, -2, 2), *w = frand(&r, nout, -1, 1);
    float *out = fnan(nout), *att = fnan(natt);
    attention_forward(out, att, inp, B, T, NH, NKV, HS);

    AttentionRef a = {B, T, NH, NKV, HS, to_double(inp, nin), to_double(w, nout), dalloc(nout), dalloc(natt)};
    attention_ref_loss(&a);
    /* softmax over <= 5 scores and a 5-term weighted sum of |v| <= 2, in float: ~1e-6 */
    check_close_d("attention_forward att (zeros above the diagonal)", att, a.att, natt, 2e-6, 1e-5);
    check_close_d("attention_forward out", out, a.out, nout, 1e-5, 1e-5);

    float *dinp = fnan(nin);
    attention_backward(dinp, w, inp, att, B, T, NH, NKV, HS);
    double *g_inp = dalloc(nin);
    fd_gradient(g_inp, a.inp, nin, attention_ref_loss, &a);
    /* chains of HS=4 and T=5 products of O(1..4) values through the softmax Jacobian, summed
     * over up to 4 query heads per key/value head: ~1e-6 */
    check_close_d(NKV < NH ? "attention_backward dinp, grouped K/V summed over the group (= over NaN prefill, FD)"
                           : "attention_backward dinp (= over NaN prefill, FD)",
                  dinp, g_inp, nin, 2e-5, 1e-5);

    free(inp), free(w), free(out), free(att), free(dinp), free(a.inp), free(a.w), free(a.out), free(a.att), free(g_inp);
}

/* ---- gelu --------------------------------------------------------------------------------- */

typedef struct {
    size_t N;
    double *inp, *w, *out;
} GeluRef;

static double gelu_ref_loss(void *ctx) {
    GeluRef *g = (GeluRef *)ctx;
    const double k = sqrt(2.0 / M_PI);
    for (size_t i = 0; i < g->N; i++) {
        double x = g->inp[i];
        g->out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
    return dot_d(g->out, g->w, g->N);
}

static void test_gelu(uint64_t seed) {
    const size_t N = 37;
    printf("gelu: N=%zu, x in [-6, 6] plus 0\n", N);
    Rng r = rng_make("gelu", seed);
    float *inp = frand(&r, N, -6, 6), *w = frand(&r, N, -1, 1), *out = fnan(N);
    inp[0] = 0.0f;
    gelu_forward(out, inp, N);
    GeluRef g = {N, to_double(inp, N), to_double(w, N), dalloc(N)};
    gelu_ref_loss(&g);
    /* float tanhf and a few roundings on |out| <= 6: a few ulps */
    check_close_d("gelu_forward out", out, g.out, N, 1e-6, 1e-6);

    float *dinp = fnan(N);
    gelu_backward(dinp, inp, w, N);
    double *g_inp = dalloc(N);
    fd_gradient(g_inp, g.inp, N, gelu_ref_loss, &g);
    /* local derivative <= 1.13 in float: a few ulps; 1 - tanh^2 cancels for |x| > 3 (abs ~1e-7) */
    check_close_d("gelu_backward dinp (= over NaN prefill, FD)", dinp, g_inp, N, 1e-6, 1e-5);

    free(inp), free(w), free(out), free(dinp), free(g.inp), free(g.w), free(g.out), free(g_inp);
}

/* ---- rmsnorm (Llama) ---------------------------------------------------------------------- */

typedef struct {
    int N, C;
    double eps;
    double *inp, *weight, *w; /* (N, C), (C), (N, C) */
    double *out, *rstd;       /* (N, C), (N) */
} RmsnormRef;

static double rmsnorm_ref_loss(void *ctx) {
    RmsnormRef *r = (RmsnormRef *)ctx;
    for (int i = 0; i < r->N; i++) {
        const double *x = r->inp + (size_t)i * r->C;
        double ss = 0.0;
        for (int j = 0; j < r->C; j++) ss += x[j] * x[j];
        r->rstd[i] = 1.0 / sqrt(ss / r->C + r->eps);
        for (int j = 0; j < r->C; j++) r->out[(size_t)i * r->C + j] = x[j] * r->rstd[i] * r->weight[j];
    }
    return dot_d(r->out, r->w, (size_t)r->N * r->C);
}

static void test_rmsnorm(uint64_t seed) {
    const int N = 70, C = 24; /* N > one 64-row dweight chunk */
    const float eps = 1e-5f;
    printf("rmsnorm: N=%d C=%d eps=%g (row 5 scaled by 1e-2)\n", N, C, eps);
    Rng r = rng_make("rmsnorm", seed);
    const size_t n = (size_t)N * C;
    float *inp = frand(&r, n, -2, 2), *weight = frand(&r, C, 0.5f, 1.5f), *w = frand(&r, n, -1, 1);
    for (int j = 0; j < C; j++) inp[5 * C + j] *= 1e-2f;
    float *out = fnan(n), *rstd = fnan(N);
    rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    RmsnormRef ref = {N, C, eps, to_double(inp, n), to_double(weight, C), to_double(w, n), dalloc(n), dalloc(N)};
    rmsnorm_ref_loss(&ref);
    /* a float sum of 24 squares and one sqrt: a few ulps of rstd (up to ~1e2 on the small row) */
    check_close_d("rmsnorm_forward rstd", rstd, ref.rstd, N, 0, 1e-5);
    check_close_d("rmsnorm_forward out", out, ref.out, n, 1e-5, 1e-5);

    /* += contract: prefill the gradients with 1 and subtract it afterwards */
    float *dinp = (float *)malloc(n * sizeof(float)), *dweight = (float *)malloc(C * sizeof(float));
    for (size_t i = 0; i < n; i++) dinp[i] = 1.0f;
    for (int j = 0; j < C; j++) dweight[j] = 1.0f;
    rmsnorm_backward(dinp, dweight, w, inp, weight, rstd, N, C);
    for (size_t i = 0; i < n; i++) dinp[i] -= 1.0f;
    for (int j = 0; j < C; j++) dweight[j] -= 1.0f;
    double *g_inp = dalloc(n), *g_weight = dalloc(C);
    fd_gradient(g_inp, ref.inp, n, rmsnorm_ref_loss, &ref);
    fd_gradient(g_weight, ref.weight, C, rmsnorm_ref_loss, &ref);
    check_close_d("rmsnorm_backward dinp (+= onto prefill, FD)", dinp, g_inp, n, 1e-4, 1e-5);
    check_close_d("rmsnorm_backward dweight (+= onto prefill, FD)", dweight, g_weight, C, 1e-5, 1e-5);
    free(inp), free(weight), free(w), free(out), free(rstd), free(dinp), free(dweight);
    free(ref.inp), free(ref.weight), free(ref.w), free(ref.out), free(ref.rstd), free(g_inp), free(g_weight);
}

/* ---- swiglu (Llama's MLP) ----------------------------------------------------------------- */

typedef struct {
    int N, F;
    double *inp, *w, *out; /* (N, 2F), (N, F), (N, F) */
} SwigluRef;

static double swiglu_ref_loss(void *ctx) {
    SwigluRef *s = (SwigluRef *)ctx;
    for (int i = 0; i < s->N; i++)
        for (int j = 0; j < s->F; j++) {
            double g = s->inp[(size_t)i * 2 * s->F + j], u = s->inp[(size_t)i * 2 * s->F + s->F + j];
            s->out[(size_t)i * s->F + j] = g / (1.0 + exp(-g)) * u;
        }
    return dot_d(s->out, s->w, (size_t)s->N * s->F);
}

static void test_swiglu(uint64_t seed) {
    const int N = 7, F = 11;
    printf("swiglu: N=%d F=%d, gate and up in [-6, 6]\n", N, F);
    Rng r = rng_make("swiglu", seed);
    const size_t nin = (size_t)N * 2 * F, nout = (size_t)N * F;
    float *inp = frand(&r, nin, -6, 6), *w = frand(&r, nout, -1, 1), *out = fnan(nout);
    swiglu_forward(out, inp, N, F);
    SwigluRef ref = {N, F, to_double(inp, nin), to_double(w, nout), dalloc(nout)};
    swiglu_ref_loss(&ref);
    /* expf and two roundings on |out| <= 36 */
    check_close_d("swiglu_forward out", out, ref.out, nout, 1e-5, 1e-6);
    float *dinp = fnan(nin);
    swiglu_backward(dinp, inp, w, N, F);
    double *g_inp = dalloc(nin);
    fd_gradient(g_inp, ref.inp, nin, swiglu_ref_loss, &ref);
    check_close_d("swiglu_backward dinp, gate and up (= over NaN prefill, FD)", dinp, g_inp, nin, 1e-5, 1e-5);
    free(inp), free(w), free(out), free(dinp), free(ref.inp), free(ref.w), free(ref.out), free(g_inp);
}

/* ---- rope (Llama) ------------------------------------------------------------------------- */

typedef struct {
    int B, T, NH, NKV, HS;
    const double *inv_freq; /* (HS/2) */
    double *inp, *w, *out;  /* (B, T, QKV) each */
} RopeRef;

static double rope_ref_loss(void *ctx) {
    RopeRef *r = (RopeRef *)ctx;
    const size_t QKV = (size_t)(r->NH + 2 * r->NKV) * r->HS;
    for (int bt = 0; bt < r->B * r->T; bt++) {
        const int t = bt % r->T;
        const double *x = r->inp + (size_t)bt * QKV;
        double *o = r->out + (size_t)bt * QKV;
        for (size_t c = 0; c < QKV; c++) o[c] = x[c]; /* v passes through */
        for (int h = 0; h < r->NH + r->NKV; h++)
            for (int i = 0; i < r->HS / 2; i++) {
                size_t c = (size_t)h * r->HS + 2 * i;
                double a = t * r->inv_freq[i];
                o[c] = x[c] * cos(a) - x[c + 1] * sin(a);
                o[c + 1] = x[c] * sin(a) + x[c + 1] * cos(a);
            }
    }
    return dot_d(r->out, r->w, (size_t)r->B * r->T * QKV);
}

static void test_rope_case(uint64_t seed, int scaled) {
    const int B = 2, T = 6, NH = 4, NKV = 2, HS = 16;
    /* theta 8 and an original context of 16 put the wavelengths 2 pi 8^(i/8) (6.3 .. 21) in all
     * three of Llama 3.1's bands: kept (< 16/2), blended, divided by the factor (> 16/1) */
    RopeConfig rc = {8.0f, scaled ? 8.0f : 0.0f, 1.0f, 2.0f, 16};
    printf("rope: B=%d T=%d NH=%d NKV=%d HS=%d theta=%g%s\n", B, T, NH, NKV, HS, rc.theta,
           scaled ? ", Llama 3.1 scaling (factor 8, low 1, high 2, original 16)" : "");
    double inv_freq[HS / 2];
    for (int i = 0; i < HS / 2; i++) {
        double f = pow(8.0, -2.0 * i / HS), wavelen = 2 * M_PI / f;
        if (scaled && wavelen > 16.0) f = f / 8.0;
        else if (scaled && wavelen >= 8.0) {
            double smooth = (16.0 / wavelen - 1.0) / (2.0 - 1.0);
            f = (1 - smooth) * f / 8.0 + smooth * f;
        }
        inv_freq[i] = f;
    }
    Rng r = rng_make("rope", seed + (uint64_t)scaled);
    const size_t n = (size_t)B * T * (NH + 2 * NKV) * HS;
    float *inp = frand(&r, n, -2, 2), *w = frand(&r, n, -1, 1), *freqs = fnan((size_t)T * HS);
    rope_freqs(freqs, T, HS, &rc);
    float *out = (float *)malloc(n * sizeof(float));
    memcpy(out, inp, n * sizeof(float));
    rope_forward(out, freqs, B, T, NH, NKV, HS);
    RopeRef ref = {B, T, NH, NKV, HS, inv_freq, to_double(inp, n), to_double(w, n), dalloc(n)};
    rope_ref_loss(&ref);
    /* cos/sin rounded to float once, then two products: a few ulps of |x| <= 2.8 */
    check_close_d(scaled ? "rope_forward q, k rotated, v unchanged (Llama 3.1 scaled frequencies)"
                         : "rope_forward q, k rotated, v unchanged", out, ref.out, n, 2e-6, 1e-6);
    float *dinp = (float *)malloc(n * sizeof(float));
    memcpy(dinp, w, n * sizeof(float));
    rope_backward(dinp, freqs, B, T, NH, NKV, HS);
    double *g = dalloc(n);
    fd_gradient(g, ref.inp, n, rope_ref_loss, &ref);
    check_close_d("rope_backward (in place, FD)", dinp, g, n, 1e-6, 1e-5);
    free(inp), free(w), free(freqs), free(out), free(dinp), free(ref.inp), free(ref.w), free(ref.out), free(g);
}

/* ---- fused classifier --------------------------------------------------------------------- */

/* log(sum_v exp(z[v])) over z[0..n), in double with the maximum taken out first */
static double ref_logsumexp(const double *z, int n) {
    double m = -INFINITY, sum = 0.0;
    for (int v = 0; v < n; v++) m = fmax(m, z[v]);
    for (int v = 0; v < n; v++) sum += exp(z[v] - m);
    return m + log(sum);
}

typedef struct {
    int N, V, Vp;
    const int *targets;
    double dloss;
    double *logits, *losses; /* (N, Vp), (N) */
} ClassifierRef;

/* L = dloss * sum_i losses[i]; row i's loss depends only on row i, so dL/dlogits[i,:] is
 * exactly the gradient of dloss * losses[i] the op writes. Padded columns never enter. */
static double classifier_ref_loss(void *ctx) {
    ClassifierRef *c = (ClassifierRef *)ctx;
    double total = 0.0;
    for (int i = 0; i < c->N; i++) {
        const double *z = c->logits + (size_t)i * c->Vp;
        const double lse = ref_logsumexp(z, c->V);
        c->losses[i] = -(z[c->targets[i]] - lse); /* -log_softmax[target] */
        total += c->losses[i];
    }
    return c->dloss * total;
}

static void test_classifier(uint64_t seed) {
    const int N = 11, V = 13, Vp = 16;
    const float dloss = 1.0f / 11.0f * 0.75f;
    printf("fused_classifier: N=%d V=%d Vp=%d dloss=%g (row 3 offset by +100: expf would overflow "
           "without the max shift)\n", N, V, Vp, dloss);
    Rng r = rng_make("fused_classifier", seed);
    const size_t n = (size_t)N * Vp;
    float *logits = frand(&r, n, -4, 4);
    int *targets = (int *)malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = rng_int(&r, V);
    targets[0] = 0, targets[1] = V - 1;
    for (int v = 0; v < V; v++) logits[3 * Vp + v] += 100.0f;
    ClassifierRef cr = {N, V, Vp, targets, dloss, to_double(logits, n), dalloc(N)};
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) logits[(size_t)i * Vp + v] = NAN; /* padding must not be read */
    classifier_ref_loss(&cr); /* fills cr.losses */

    /* losses only: logits must be left untouched */
    float *logits_in = fcopy(logits, n), *losses = fnan(N);
    fused_classifier(logits, losses, targets, dloss, N, V, Vp, 0);
    /* lse = logf(sum) + max in float: ~|max| eps ~ 1e-5 on the +100 row, ~1e-6 elsewhere */
    check_close_d("fused_classifier losses vs double log-softmax (no dlogits)", losses, cr.losses, N, 2e-5, 1e-6);
    int same = 1;
    for (size_t i = 0; i < n; i++) same &= memcmp(logits + i, logits_in + i, sizeof(float)) == 0;
    test_report(same, "fused_classifier with write_dlogits=0 leaves logits untouched", "logits changed");

    float *losses2 = fnan(N);
    fused_classifier(logits, losses2, targets, dloss, N, V, Vp, 1);
    check_close_d("fused_classifier losses vs double log-softmax (with dlogits)", losses2, cr.losses, N, 2e-5, 1e-6);
    double *g = dalloc(n);
    fd_gradient(g, cr.logits, n, classifier_ref_loss, &cr);
    /* dloss * (softmax - onehot), |.| <= 0.07: expf and one division, relative ~1e-6 */
    check_close_d("fused_classifier dlogits in place vs FD of dloss*losses", logits, g, n, 1e-7, 1e-5);
    int zeros = 1;
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) {
            float z = logits[(size_t)i * Vp + v];
            zeros &= z == 0.0f && !signbit(z);
        }
    test_report(zeros, "fused_classifier padded columns V..Vp-1 are exactly +0 (were NaN)", "a padded column is not 0");

    free(logits), free(targets), free(logits_in), free(losses), free(losses2), free(cr.logits), free(cr.losses), free(g);
}

/* ---- the distillation classifier (--teacher) ------------------------------------------------ */

typedef struct {
    ClassifierRef c;        /* the student's logits (N, Vp), targets, dloss; losses: the combined per row */
    const double *teacher;  /* (N, TS) */
    int TS;
    double alpha, t, ce, kd; /* ce, kd: the sums over the rows */
} DistillRef;

/* L = dloss * sum_i [(1 - a) ce_i + a t^2 KL(softmax(r_i / t) || softmax(z_i / t))], in double */
static double distill_ref_loss(void *ctx) {
    DistillRef *d = (DistillRef *)ctx;
    const ClassifierRef *c = &d->c;
    double total = 0.0;
    d->ce = d->kd = 0.0;
    for (int i = 0; i < c->N; i++) {
        const double *z = c->logits + (size_t)i * c->Vp, *r = d->teacher + (size_t)i * d->TS;
        double mx = -INFINITY, mq = -INFINITY, mr = -INFINITY, sum = 0.0, sq = 0.0, sr = 0.0, kd = 0.0;
        for (int v = 0; v < c->V; v++) mx = fmax(mx, z[v]), mq = fmax(mq, z[v] / d->t), mr = fmax(mr, r[v] / d->t);
        for (int v = 0; v < c->V; v++) sum += exp(z[v] - mx), sq += exp(z[v] / d->t - mq), sr += exp(r[v] / d->t - mr);
        for (int v = 0; v < c->V; v++) {
            const double lr = r[v] / d->t - mr - log(sr), lq = z[v] / d->t - mq - log(sq);
            kd += exp(lr) * (lr - lq);
        }
        const double ce = -(z[c->targets[i]] - mx - log(sum));
        c->losses[i] = (1.0 - d->alpha) * ce + d->alpha * d->t * d->t * kd;
        d->ce += ce, d->kd += kd;
        total += c->losses[i];
    }
    return c->dloss * total;
}

static void test_distill_classifier(uint64_t seed) {
    const int N = 9, V = 13, Vp = 16, TS = 20;
    const float dloss = 1.0f / 9.0f * 0.5f, alpha = 0.7f, t = 2.5f;
    printf("distill_classifier: N=%d V=%d Vp=%d teacher stride %d alpha %g t %g dloss=%g\n", N, V, Vp, TS, (double)alpha,
           (double)t, dloss);
    Rng r = rng_make("distill_classifier", seed);
    const size_t n = (size_t)N * Vp;
    float *logits = frand(&r, n, -4, 4), *teacher = frand(&r, (size_t)N * TS, -6, 6);
    int *targets = (int *)malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = rng_int(&r, V);
    for (int v = 0; v < V; v++) logits[2 * Vp + v] += 100.0f, teacher[4 * TS + v] -= 80.0f; /* (the max shifts) */
    DistillRef dr = {{N, V, Vp, targets, dloss, to_double(logits, n), dalloc(N)}, to_double(teacher, (size_t)N * TS), TS,
                     alpha, t, 0.0, 0.0};
    for (int i = 0; i < N; i++) {
        for (int v = V; v < Vp; v++) logits[(size_t)i * Vp + v] = NAN; /* padding must not be read */
        for (int v = V; v < TS; v++) teacher[(size_t)i * TS + v] = NAN;
    }
    distill_ref_loss(&dr);
    const double ce_ref = dr.ce, kd_ref = dr.kd;
    float *in = fcopy(logits, n), *losses = fnan(N);
    double ce, kd;
    distill_classifier(logits, losses, targets, teacher, TS, alpha, t, dloss, N, V, Vp, &ce, &kd);
    check_close_d("distill_classifier losses vs double (1-a) CE + a t^2 KL", losses, dr.c.losses, N, 2e-5, 1e-6);
    test_report(fabs(ce - ce_ref) <= 1e-5 * fabs(ce_ref) && fabs(kd - kd_ref) <= 1e-5 * fabs(kd_ref) + 1e-7 && kd_ref > 0.1,
                "distill_classifier CE and KL sums vs double", "ce %g vs %g, kd %g vs %g", ce, ce_ref, kd, kd_ref);
    double *g = dalloc(n);
    fd_gradient(g, dr.c.logits, n, distill_ref_loss, &dr);
    check_close_d("distill_classifier dlogits in place vs FD of dloss*losses (the a t (q - p) term)", logits, g, n, 1e-7, 1e-5);
    int zeros = 1;
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) zeros &= logits[(size_t)i * Vp + v] == 0.0f && !signbit(logits[(size_t)i * Vp + v]);
    test_report(zeros, "distill_classifier padded columns V..Vp-1 are exactly +0", "a padded column is not 0");
    /* alpha 0: fused_classifier's losses and dlogits bit for bit */
    float *a0 = fcopy(in, n), *f0 = fcopy(in, n), *la = fnan(N), *lf = fnan(N);
    distill_classifier(a0, la, targets, teacher, TS, 0.0f, t, dloss, N, V, Vp, &ce, &kd);
    fused_classifier(f0, lf, targets, dloss, N, V, Vp, 1);
    test_report(memcmp(a0, f0, n * sizeof(float)) == 0 && memcmp(la, lf, (size_t)N * sizeof(float)) == 0,
                "distill_classifier with alpha 0 is fused_classifier bit for bit", "dlogits or losses differ");
    free(logits), free(teacher), free(targets), free(dr.c.logits), free(dr.c.losses), free((void *)dr.teacher), free(in);
    free(losses), free(g), free(a0), free(f0), free(la), free(lf);
}

/* ---- residual ------------------------------------------------------------------------------- */

static void test_residual(uint64_t seed) {
    const size_t N = 37;
    printf("residual: N=%zu (backward is the identity, done by the model's accumulation)\n", N);
    Rng r = rng_make("residual", seed);
    float *a = frand(&r, N, -3, 3), *b = frand(&r, N, -3, 3), *out = fnan(N), *ref = falloc(N);
    for (size_t i = 0; i < N; i++) ref[i] = a[i] + b[i]; /* one IEEE add: bit-exact */
    residual_forward(out, a, b, N);
    check_bitwise("residual_forward out == inp1 + inp2", out, ref, N);
    residual_forward(a, a, b, N);
    check_bitwise("residual_forward with out aliasing inp1", a, ref, N);
    free(a), free(b), free(out), free(ref);
}

/* ---- adamw + global_norm_squared ---------------------------------------------------------- */

static void test_adamw(uint64_t seed, int t) {
    const size_t n = 1001;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.7f;
    printf("adamw: n=%zu t=%d lr=%g beta1=%g beta2=%g eps=%g wd=%g grad_scale=%g\n", n, t, lr, beta1, beta2, eps,
           wd, grad_scale);
    Rng r = rng_make("adamw", seed);
    float *p = frand(&r, n, -2, 2), *g = frand(&r, n, -1, 1), *m = frand(&r, n, -0.1f, 0.1f),
          *v = frand(&r, n, 1e-4f, 1e-2f);
    if (t == 1) /* a true first step: moments start at zero */
        for (size_t i = 0; i < n; i++) m[i] = v[i] = 0.0f;
    double *rp = to_double(p, n), *rm = to_double(m, n), *rv = to_double(v, n);
    const double b1 = beta1, b2 = beta2, c1 = 1.0 - pow(b1, t), c2 = 1.0 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * grad_scale;
        rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
        rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
        rp[i] -= (double)lr * (rm[i] / c1 / (sqrt(rv[i] / c2) + (double)eps) + (double)wd * rp[i]);
    }
    adamw_update(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, grad_scale);
    char name[96];
    /* m: beta1 m (<= 0.09) and (1-beta1) g (<= 0.07) round at ~4e-9 each and may cancel */
    snprintf(name, sizeof name, "adamw_update m (t=%d)", t);
    check_close_d(name, m, rm, n, 2e-8, 1e-6);
    /* v: a sum of two positive terms, no cancellation: a few ulps */
    snprintf(name, sizeof name, "adamw_update v (t=%d)", t);
    check_close_d(name, v, rv, n, 1e-11, 1e-6);
    /* params <= 2 round at 1.2e-7; the float 1 - beta^t cancels (rel. ~1e-6 at t=5) in a step ~lr */
    snprintf(name, sizeof name, "adamw_update params (t=%d)", t);
    check_close_d(name, p, rp, n, 5e-7, 0);
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv);
}

static void test_global_norm(uint64_t seed) {
    const size_t sizes[] = {0, 1, 255, 257, 100003};
    Rng r = rng_make("global_norm_squared", seed);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *g = frand(&r, n, -3, 3);
        double ref = 0.0;
        for (size_t i = 0; i < n; i++) ref += (double)g[i] * (double)g[i]; /* products exact in double */
        double got = global_norm_squared(g, n);
        /* only the summation order differs, in double: rel. ~n * 1e-16 */
        char name[96];
        snprintf(name, sizeof name, "global_norm_squared n=%zu vs double sum", n);
        test_report(fabs(got - ref) <= 1e-12 * ref && isfinite(got), name, "got %.17g, ref %.17g", got, ref);
        free(g);
    }
}

/* ---- sgemm -------------------------------------------------------------------------------- */

typedef void (*SgemmFn)(int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

/* C(M,N) = alpha op(A) op(B) + beta C with lda/ldb/ldc padded by 3/2/5 elements: NaN in
 * the padding of A and B (must never be read), a canary in the padding of C (must never
 * be written), NaN in C itself when beta == 0 (must be ignored). */
static void sgemm_case(Rng *r, int ta, int tb, int M, int N, int K, float alpha, float beta) {
    const int rows_a = ta ? K : M, cols_a = ta ? M : K, lda = cols_a + 3;
    const int rows_b = tb ? N : K, cols_b = tb ? K : N, ldb = cols_b + 2;
    const int ldc = N + 5;
    const float canary = 12345.0f;
    float *A = fnan((size_t)rows_a * lda), *B = fnan((size_t)rows_b * ldb), *C0 = falloc((size_t)M * ldc);
    for (int i = 0; i < rows_a; i++)
        for (int j = 0; j < cols_a; j++) A[(size_t)i * lda + j] = rng_uniform(r, -1, 1);
    for (int i = 0; i < rows_b; i++)
        for (int j = 0; j < cols_b; j++) B[(size_t)i * ldb + j] = rng_uniform(r, -1, 1);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) C0[(size_t)i * ldc + j] = j >= N ? canary : beta == 0.0f ? NAN : rng_uniform(r, -1, 1);

    double *ref = dalloc((size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b;
            }
            ref[(size_t)i * N + j] = alpha * s + (beta == 0.0f ? 0.0 : beta * (double)C0[(size_t)i * ldc + j]);
        }

    const SgemmFn fns[2] = {llmc_sgemm, llmc_sgemm_fallback};
    const char *names[2] = {"llmc_sgemm", "llmc_sgemm_fallback"};
    float *dense = falloc((size_t)M * N);
    for (int f = 0; f < 2; f++) {
        float *Cm = fcopy(C0, (size_t)M * ldc);
        fns[f](ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
        int canary_ok = 1;
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) dense[(size_t)i * N + j] = Cm[(size_t)i * ldc + j];
            for (int j = N; j < ldc; j++) canary_ok &= Cm[(size_t)i * ldc + j] == canary;
        }
        char name[160];
        snprintf(name, sizeof name, "%s ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g lda=%d ldb=%d ldc=%d", names[f],
                 ta, tb, M, N, K, alpha, beta, lda, ldb, ldc);
        /* K float products of |.| <= 1 summed in float: ~2e-5 seen at K=270 (|C| up to ~10);
         * 1e-4 is far below any indexing/transpose/beta mistake (O(0.1)) */
        check_close_d(name, dense, ref, (size_t)M * N, 1e-4, 1e-5);
        snprintf(name, sizeof name, "%s ta=%d tb=%d M=%d N=%d K=%d beta=%g: C padding (ldc) untouched", names[f],
                 ta, tb, M, N, K, beta);
        test_report(canary_ok, name, "a canary between N and ldc was overwritten");
        free(Cm);
    }
    free(A), free(B), free(C0), free(ref), free(dense);
}

static void test_sgemm(uint64_t seed) {
    printf("sgemm: llmc_sgemm backend %s; the fallback always runs too\n", llmc_sgemm_backend());
    Rng r = rng_make("sgemm", seed);
    const float betas[3] = {0.0f, 1.0f, 0.5f};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int b = 0; b < 3; b++) sgemm_case(&r, ta, tb, 7, 9, 11, -1.25f, betas[b]);
    /* past the fallback's blocking (K blocks of 256, N blocks of 512) */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) sgemm_case(&r, ta, tb, 5, 530, 270, 0.75f, betas[(ta * 2 + tb) % 3]);
}

/* ---- main --------------------------------------------------------------------------------- */

/* ---- moe routing (Mixtral) ------------------------------------------------------------------ */

typedef struct {
    int N, E, K;
    const float *expert;       /* (N, K): the selection, fixed (the objective is smooth around it) */
    double *z, *dw, *extra;    /* logits (N, E); weights of the renormalised top-k (N, K); of p (E) */
} RouterRef;

/* L = sum_t [sum_j dw(t, j) w(t, j) + sum_e extra(e) p(t, e)], p = softmax(z), w = p_sel / sum p_sel */
static double router_ref_loss(void *ctx) {
    RouterRef *r = (RouterRef *)ctx;
    double L = 0.0;
    for (int t = 0; t < r->N; t++) {
        const double *z = r->z + (size_t)t * r->E;
        double p[64], S = 0.0;
        const double lse = ref_logsumexp(z, r->E);
        for (int e = 0; e < r->E; e++) p[e] = exp(z[e] - lse), L += r->extra[e] * p[e];
        for (int j = 0; j < r->K; j++) S += p[(int)r->expert[t * r->K + j]];
        for (int j = 0; j < r->K; j++) L += r->dw[t * r->K + j] * p[(int)r->expert[t * r->K + j]] / S;
    }
    return L;
}

static void test_moe_case(uint64_t seed, int E, int K) {
    const int N = 9, C = 5;
    printf("moe routing: N=%d E=%d top-%d C=%d (row 0 all tied, row 1 two tied maxima)\n", N, E, K, C);
    Rng r = rng_make("moe", seed);
    float *z = frand(&r, (size_t)N * E, -3, 3);
    for (int e = 0; e < E; e++) z[e] = 0.25f;     /* a tie of every expert */
    z[E + 1] = z[E + E - 1] = 3.5f;                /* experts 1 and E-1 tie for the top */
    double *zd = to_double(z, (size_t)N * E);
    float *probs = fcopy(z, (size_t)N * E), *ex = fnan((size_t)N * K), *w = fnan((size_t)N * K);
    moe_router_forward(probs, ex, w, N, E, K);
    /* the double softmax and the stable descending order (ties: the lower index first) */
    double *pd = dalloc((size_t)N * E), *wd = dalloc((size_t)N * K);
    int order_ok = 1;
    for (int t = 0; t < N; t++) {
        double m = zd[t * E], s = 0.0;
        for (int e = 1; e < E; e++) m = fmax(m, zd[t * E + e]);
        for (int e = 0; e < E; e++) s += exp(zd[t * E + e] - m);
        for (int e = 0; e < E; e++) pd[t * E + e] = exp(zd[t * E + e] - m) / s;
        int taken[64] = {0};
        double S = 0.0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || z[t * E + e] > z[t * E + best])) best = e;
            taken[best] = 1;
            order_ok &= ex[t * K + j] == (float)best;
            S += pd[t * E + best];
        }
        for (int j = 0; j < K; j++) wd[t * K + j] = pd[t * E + (int)ex[t * K + j]] / S;
    }
    order_ok &= ex[0] == 0.0f && (K < 2 || ex[1] == 1.0f) && ex[K] == 1.0f && (K < 2 || ex[K + 1] == (float)(E - 1));
    test_report(order_ok, "moe_router_forward top-k: by probability, ties to the lower expert index", "");
    check_close_d("moe_router_forward softmax probabilities", probs, pd, (size_t)N * E, 1e-7, 1e-6);
    check_close_d("moe_router_forward renormalised top-k weights", w, wd, (size_t)N * K, 1e-7, 1e-6);
    /* grouping: every (token, slot) once, experts in index order, tokens in position order */
    float *row = fnan((size_t)N * K), *count = fnan((size_t)E);
    int offset[65];
    moe_permute(row, count, offset, ex, N, E, K);
    int seen[64 * 8] = {0}, group_ok = offset[0] == 0 && offset[E] == N * K;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const int e = (int)ex[t * K + j], rr = (int)row[t * K + j];
            group_ok &= rr >= offset[e] && rr < offset[e + 1] && !seen[rr]++;
            for (int u = 0; u < t; u++) /* an earlier token of the same expert has an earlier row */
                for (int i = 0; i < K; i++)
                    if ((int)ex[u * K + i] == e) group_ok &= (int)row[u * K + i] < rr;
        }
    for (int e = 0; e < E; e++) group_ok &= count[e] == (float)(offset[e + 1] - offset[e]);
    test_report(group_ok, "moe_permute: grouped by expert, tokens in position order, each pair once, counts", "");
    /* gather / combine forward and backward vs double */
    const size_t NK = (size_t)N * K;
    float *x = frand(&r, (size_t)N * C, -1, 1), *xg = fnan(NK * C), *yg = frand(&r, NK * C, -1, 1);
    float *out = fnan((size_t)N * C), *dout = frand(&r, (size_t)N * C, -1, 1);
    moe_gather(xg, x, row, N, K, C);
    moe_combine_forward(out, yg, w, row, N, K, C);
    float *dyg = fnan(NK * C), *dwt = fnan(NK), *dx = fnan((size_t)N * C);
    moe_combine_backward(dyg, dwt, dout, yg, w, row, N, K, C);
    moe_gather_backward(dx, yg, row, N, K, C);
    double *xg_d = dalloc(NK * C), *out_d = dalloc((size_t)N * C), *dyg_d = dalloc(NK * C), *dw_d = dalloc(NK);
    double *dx_d = dalloc((size_t)N * C);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            const size_t rr = (size_t)row[t * K + j];
            for (int c = 0; c < C; c++) {
                xg_d[rr * C + c] = x[t * C + c];
                out_d[t * C + c] += (double)w[t * K + j] * yg[rr * C + c];
                dyg_d[rr * C + c] = (double)w[t * K + j] * dout[t * C + c];
                dw_d[t * K + j] += (double)dout[t * C + c] * yg[rr * C + c];
                dx_d[t * C + c] += yg[rr * C + c];
            }
        }
    check_close_d("moe_gather rows (=)", xg, xg_d, NK * C, 0, 0);
    check_close_d("moe_combine_forward (=, over NaN prefill)", out, out_d, (size_t)N * C, 1e-6, 1e-6);
    check_close_d("moe_combine_backward dyg (=)", dyg, dyg_d, NK * C, 1e-7, 1e-6);
    check_close_d("moe_combine_backward dweight (=)", dwt, dw_d, NK, 1e-6, 1e-6);
    check_close_d("moe_gather_backward (=)", dx, dx_d, (size_t)N * C, 1e-6, 1e-6);
    /* router backward vs finite differences of the double objective */
    float *dwr = frand(&r, NK, -1, 1), *extra = frand(&r, (size_t)E, -1, 1), *dz = fnan((size_t)N * E);
    moe_router_backward(dz, dwr, probs, ex, w, extra, N, E, K);
    RouterRef ref = {N, E, K, ex, zd, to_double(dwr, NK), to_double(extra, (size_t)E)};
    double *g = dalloc((size_t)N * E);
    fd_gradient(g, zd, (size_t)N * E, router_ref_loss, &ref);
    check_close_d("moe_router_backward dlogits through the renormalisation and the softmax (=, FD)", dz, g,
                  (size_t)N * E, 1e-6, 1e-5);
    free(z), free(zd), free(probs), free(ex), free(w), free(pd), free(wd), free(row), free(count), free(x), free(xg);
    free(yg), free(out), free(dout), free(dyg), free(dwt), free(dx), free(xg_d), free(out_d), free(dyg_d), free(dw_d);
    free(dx_d), free(dwr), free(extra), free(dz), free(ref.dw), free(ref.extra), free(g);
}

int main(int argc, char **argv) {
    uint64_t seed = DEFAULT_SEED;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            errno = 0;
            seed = strtoull(argv[++i], &end, 10);
            if (errno || *end || end == argv[i]) {
                fprintf(stderr, "test_ops_cpu: --seed needs an unsigned integer, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--seed N]\n", argv[0]);
            return 2;
        }
    }
    printf("test_ops_cpu: base seed %llu (rerun with --seed N)\n", (unsigned long long)seed);
    test_encoder(seed + 1);
    test_layernorm(seed + 2);
    test_matmul(seed + 3, 0);
    test_matmul(seed + 4, 1);
    test_attention_case(seed + 5, 3, 3); /* GPT-2: one key/value head per query head */
    test_attention_case(seed + 5, 4, 2); /* grouped-query: two query heads per key/value head */
    test_attention_case(seed + 5, 4, 1); /* multi-query: one key/value head */
    test_rmsnorm(seed + 11);
    test_swiglu(seed + 12);
    test_rope_case(seed + 13, 0);
    test_rope_case(seed + 13, 1);
    test_gelu(seed + 6);
    test_classifier(seed + 7);
    test_distill_classifier(seed + 7);
    test_residual(seed + 8);
    test_adamw(seed + 9, 1);
    test_adamw(seed + 10, 5);
    test_global_norm(seed + 11);
    test_sgemm(seed + 12);
    test_moe_case(seed + 14, 6, 2);
    test_moe_case(seed + 15, 4, 1);
    test_moe_case(seed + 16, 8, 3);
    return test_exit_code();
}
