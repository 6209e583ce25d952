/*
 * cuda_llama_ops.h - the Llama ops on CUDA (llmc/cuda/rmsnorm.cuh, swiglu.cuh, rope.cuh) against
 * their CPU twins (llmc/cpu/rmsnorm.h, swiglu.h, rope.h) in fp32, bf16 and fp16. Part of
 * test_cuda_ops (included by test/test_cuda_ops.cu after its helpers: Dev, upload, expect, ...;
 * run_llama_ops is called from its main), so test/test_cudasim_mutants.sh's planted bugs in
 * these files are caught by the same binary.
 *
 * Shapes: C and F whole numbers of 16-byte packs and not (the *_kernel16 forms and the
 * element-per-thread ones), B*T = 1, several dweight chunks, the one-pass RMSNorm backward with
 * 1..4 packs per lane, its wide form (5..8) and the two-pass one; RoPE with NKV = NH, NH/2 and
 * 1, with and without Llama 3.1 frequency scaling.
 */
#ifndef LLMC_TEST_CUDA_LLAMA_OPS_H
#define LLMC_TEST_CUDA_LLAMA_OPS_H

#include "llmc/cpu/rmsnorm.h"
#include "llmc/cpu/rope.h"
#include "llmc/cpu/swiglu.h"
#include "llmc/cuda/rmsnorm.cuh"
#include "llmc/cuda/rope.cuh"
#include "llmc/cuda/swiglu.cuh"

/* half an ulp of T relative to the value (bf16: 8 significant bits, fp16: 11), or 4 fp32 ulps */
template <class T> static double llama_round_rel(void) {
    if (sizeof(T) == 4) return 4 * ldexp(1.0, -24);
    return StorageInfo<T>::cuda_type == CUDA_R_16BF ? ldexp(1.0, -8) : ldexp(1.0, -11);
}
/* fp16 subnormal spacing / 2 (absolute floor of a rounding), else negligible */
template <class T> static double llama_tiny(void) { return StorageInfo<T>::cuda_type == CUDA_R_16F ? ldexp(1.0, -25) : 1e-30; }

template <class T> static void test_rmsnorm(Rng *r, int N, int C) {
    const size_t NC = (size_t)N * C;
    const float eps = 1e-5f;
    char sh[64];
    snprintf(sh, sizeof sh, "N=%d C=%d", N, C);
    float *x = randn(r, NC, 0.5f, 2.0f), *w = randn(r, C, 1, 0.3f);
    Dev<T> dx = upload<T>(x, NC), dw = upload<T>(w, C), dout = dev_alloc<T>(NC);
    Dev<float> drstd = dev_alloc<float>(N);
    float *out = (float *)malloc(NC * 4), *rstd = (float *)malloc(N * 4);
    rmsnorm_forward(out, rstd, x, w, N, C, eps);
    rmsnorm_forward(dout.p, drstd.p, dx.p, dw.p, N, C, eps, (cudaStream_t)0);
    /* fp32: the sum of squares in another order moves rstd by a few ulps; 16-bit: one rounding
     * of an O(1) value (LayerNorm's tolerances) */
    const Tols tout = {{1e-5, 1e-5}, {1e-2, 8e-3}, {2e-3, 1e-3}};
    expect("rmsnorm_forward out", dout, out, pick<T>(tout), sh);
    expect("rmsnorm_forward rstd", drstd, rstd, {1e-6, 1e-5}, sh);

    /* fused residual + rmsnorm (in place: residual = inp1) == residual_forward then
     * rmsnorm_forward, bit for bit, and close to the CPU on the T-rounded residual */
    float *x2 = randn(r, NC, 0.0f, 1.0f);
    Dev<T> dx2 = upload<T>(x2, NC), dres_a = dev_alloc<T>(NC), dres_b = dev_alloc<T>(NC);
    Dev<T> dn_a = dev_alloc<T>(NC), dn_b = dev_alloc<T>(NC);
    Dev<float> r2 = dev_alloc<float>(N), r3 = dev_alloc<float>(N);
    cudaCheck(cudaMemcpy(dres_a.p, dx.p, NC * sizeof(T), cudaMemcpyDeviceToDevice));
    fused_residual_rmsnorm_forward(dres_a.p, dn_a.p, r2.p, dres_a.p, dx2.p, dw.p, N, C, eps, (cudaStream_t)0);
    residual_forward(dres_b.p, dx.p, dx2.p, NC, (cudaStream_t)0);
    rmsnorm_forward(dn_b.p, r3.p, dres_b.p, dw.p, N, C, eps, (cudaStream_t)0);
    float *res_b = download(dres_b), *n_b = download(dn_b), *rs_b = download(r3);
    expect("fused_residual_rmsnorm residual == unfused", dres_a, res_b, {0, 0}, sh);
    expect("fused_residual_rmsnorm out == unfused", dn_a, n_b, {0, 0}, sh);
    expect("fused_residual_rmsnorm rstd == unfused", r2, rs_b, {0, 0}, sh);
    float *res_ref = (float *)malloc(NC * 4), *n_ref = (float *)malloc(NC * 4), *r_ref = (float *)malloc(N * 4);
    for (size_t i = 0; i < NC; i++) res_ref[i] = to_float(from_float<T>(x[i] + x2[i])); /* the GPU stores T */
    rmsnorm_forward(n_ref, r_ref, res_ref, w, N, C, eps);
    expect("fused_residual_rmsnorm out vs CPU", dn_a, n_ref, pick<T>(tout), sh);

    /* backward: dinp and dweight accumulate onto random values */
    float *dy = randn(r, NC, 0, 1), *dx0 = randn(r, NC, 0, 1), *dw0 = randn(r, C, 0, 1);
    Dev<T> ddy = upload<T>(dy, NC), ddx = upload<T>(dx0, NC), ddw = upload<T>(dw0, C);
    Dev<float> scratch = dev_alloc<float>(rmsnorm_backward_scratch_floats(N, C));
    rmsnorm_backward(dx0, dw0, dy, x, w, rstd, N, C);
    rmsnorm_backward(ddx.p, ddw.p, ddy.p, dx.p, dw.p, drstd.p, N, C, scratch.p, (cudaStream_t)0);
    /* LayerNorm's: dinp O(1), order effects amplified by rstd; dweight a sum over N rows */
    expect("rmsnorm_backward dinp", ddx, dx0, pick<T>({{1e-4, 1e-4}, {2e-2, 8e-3}, {4e-3, 1e-3}}), sh);
    expect("rmsnorm_backward dweight", ddw, dw0, pick<T>({{1e-4 * sqrt((double)N), 1e-4}, {2e-2, 8e-3}, {4e-3 * sqrt((double)N), 1e-3}}), sh);

    free(x), free(w), free(out), free(rstd), free(x2), free(res_b), free(n_b), free(rs_b), free(res_ref), free(n_ref);
    free(r_ref), free(dy), free(dx0), free(dw0);
    dev_free(dx), dev_free(dw), dev_free(dout), dev_free(drstd), dev_free(dx2), dev_free(dres_a), dev_free(dres_b);
    dev_free(dn_a), dev_free(dn_b), dev_free(r2), dev_free(r3), dev_free(ddy), dev_free(ddx), dev_free(ddw), dev_free(scratch);
}

template <class T> static void test_swiglu(Rng *r, int N, int F) {
    const size_t NF = (size_t)N * F;
    char sh[64];
    snprintf(sh, sizeof sh, "N=%d F=%d", N, F);
    float *x = randn(r, 2 * NF, 0, 2), *dy = randn(r, NF, 0, 1);
    Dev<T> dx = upload<T>(x, 2 * NF), ddy = upload<T>(dy, NF), dout = dev_alloc<T>(NF), ddx = dev_alloc<T>(2 * NF);
    float *out = (float *)malloc(NF * 4), *dxr = (float *)malloc(2 * NF * 4);
    swiglu_forward(out, x, N, F);
    swiglu_backward(dxr, x, dy, N, F);
    swiglu_forward(dout.p, dx.p, N, F, (cudaStream_t)0);
    swiglu_backward(ddx.p, dx.p, ddy.p, N, F, (cudaStream_t)0); /* overwrites the garbage in ddx */
    /* The same fp32 formulas; the device's expf and glibc's differ by up to 3 ulp, which moves
     * sigmoid and the products by a few ulps (8 allowed). dgate's factor 1 + g (1 - sig)
     * cancels near g = -1.28: its error is absolute, 8 ulp times (1 + |g|), times |dout up sig|.
     * 16-bit: one rounding of the result on top (half an ulp of T). */
    const double ulp8 = 8 * ldexp(1.0, -24), rr = llama_round_rel<T>(), tiny = llama_tiny<T>();
    double *bf = (double *)malloc(NF * sizeof(double)), *bb = (double *)malloc(2 * NF * sizeof(double));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            const size_t o = (size_t)i * F + j, g = (size_t)i * 2 * F + j;
            const double gate = x[g], up = x[g + F], sig = 1 / (1 + exp(-gate));
            bf[o] = (ulp8 + rr) * fabs(out[o]) + tiny;
            bb[g] = fabs(dy[o] * up * sig) * ulp8 * (1 + fabs(gate)) + (ulp8 + rr) * fabs(dxr[g]) + tiny;
            bb[g + F] = (ulp8 + rr) * fabs(dxr[g + F]) + tiny;
        }
    expect_within("swiglu_forward out", dout, out, bf, sh);
    expect_within("swiglu_backward dinp (dgate | dup)", ddx, dxr, bb, sh);
    free(bf), free(bb), free(x), free(dy), free(out), free(dxr);
    dev_free(dx), dev_free(ddy), dev_free(dout), dev_free(ddx);
}

/* per-element bounds for a rotated copy of `in` (ref): rotated pairs may differ by the fp32
 * rounding of a c - b s (contracted or not: 4 ulp of |a| + |b|) plus one rounding to T; value
 * heads must be untouched (bound ~0) */
template <class T>
static double *rope_bounds(const float *in, const float *ref, int BT, int NH, int NKV, int HS) {
    const size_t QKV = (size_t)(NH + 2 * NKV) * HS, n = (size_t)BT * QKV;
    double *b = (double *)malloc(n * sizeof(double));
    for (size_t e = 0; e < n; e++) {
        const size_t col = e % QKV, pair = e - e % 2;
        b[e] = col < (size_t)(NH + NKV) * HS
                   ? 4 * ldexp(1.0, -24) * (fabs(in[pair]) + fabs(in[pair + 1])) + llama_round_rel<T>() * fabs(ref[e]) + llama_tiny<T>()
                   : 1e-30;
    }
    return b;
}

template <class T> static void test_rope(Rng *r, int B, int T_, int NH, int NKV, int HS, bool scaled) {
    const size_t n = (size_t)B * T_ * (NH + 2 * NKV) * HS;
    char sh[96];
    snprintf(sh, sizeof sh, "B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T_, NH, NKV, HS, scaled ? " llama3.1 scaling" : "");
    const RopeConfig rc = scaled ? RopeConfig{500000.0f, 8.0f, 1.0f, 4.0f, 8192} : RopeConfig{10000.0f, 0, 0, 0, 0};
    float *freqs = (float *)malloc((size_t)T_ * HS * 4);
    rope_freqs(freqs, T_, HS, &rc);
    Dev<float> dfreqs = dev_alloc<float>((size_t)T_ * HS);
    rope_freqs_to_device(dfreqs.p, T_, HS, &rc);
    expect("rope_freqs_to_device == CPU rope_freqs", dfreqs, freqs, {0, 0}, sh);

    float *q = randn(r, n, 0, 1), *dq = randn(r, n, 0, 1);
    Dev<T> dqkv = upload<T>(q, n), ddqkv = upload<T>(dq, n);
    float *qr = copy_of(q, n), *dqr = copy_of(dq, n);
    rope_forward(qr, freqs, B, T_, NH, NKV, HS);
    rope_backward(dqr, freqs, B, T_, NH, NKV, HS);
    rope_forward(dqkv.p, dfreqs.p, B, T_, NH, NKV, HS, (cudaStream_t)0);
    rope_backward(ddqkv.p, dfreqs.p, B, T_, NH, NKV, HS, (cudaStream_t)0);
    double *bq = rope_bounds<T>(q, qr, B * T_, NH, NKV, HS), *bd = rope_bounds<T>(dq, dqr, B * T_, NH, NKV, HS);
    expect_within("rope_forward qkv (q, k rotated; v untouched)", dqkv, qr, bq, sh);
    expect_within("rope_backward dqkv (inverse rotation)", ddqkv, dqr, bd, sh);
    free(freqs), free(q), free(dq), free(qr), free(dqr), free(bq), free(bd);
    dev_free(dfreqs), dev_free(dqkv), dev_free(ddqkv);
}

template <class T> static void run_llama_ops_for(unsigned long long seed) {
    Rng r;
    rng_seed(&r, seed + 5555 + StorageInfo<T>::cuda_type);
    /* N, C: B*T = 1; the one-pass backward with 1..4 packs per lane (16-bit: C = 32 1, 512 2,
     * 768 3, 1024 4; fp32: 32 1, 256 2, 384 3, 512 4), its wide form with 5..8 (16-bit: 1280 5,
     * 2048 8; fp32: 768 6, 1024 8; 1280 over two chunks) and the two-pass one (16-bit 2560, fp32
     * 1280 and 2048: over 8 packs per lane); C not a whole number of packs (36: packed in fp32
     * only; 30: never); several chunks, uneven rows */
    static const int rms[][2] = {{1, 32},  {13, 48}, {7, 768}, {3, 1024}, {4, 512},  {2, 256},   {2, 384},
                                 {10, 36}, {9, 30},  {600, 64}, {3, 2048}, {2, 2560}, {300, 1280}};
    for (const auto &s : rms) test_rmsnorm<T>(&r, s[0], s[1]);
    /* N, F: packed (F % 8 == 0), packed in fp32 only (12), never (7); N = 1 */
    static const int sw[][2] = {{1, 16}, {5, 64}, {3, 12}, {4, 7}};
    for (const auto &s : sw) test_swiglu<T>(&r, s[0], s[1]);
    /* B, T, NH, NKV, HS, scaled: NKV = NH, NH/2, 1; HS 16 (packed), 4 (packed in fp32 only), 6
     * (never); B*T = 1; T = 40 for larger angles */
    static const int rp[][6] = {{1, 1, 4, 4, 16, 0}, {2, 5, 4, 2, 16, 1}, {1, 40, 4, 1, 16, 1},
                                {1, 4, 3, 3, 4, 0},  {2, 3, 2, 1, 6, 1}};
    for (const auto &s : rp) test_rope<T>(&r, s[0], s[1], s[2], s[3], s[4], s[5] != 0);
}

static void run_llama_ops(unsigned long long seed) {
    run_llama_ops_for<float>(seed);
    run_llama_ops_for<__nv_bfloat16>(seed);
    run_llama_ops_for<__half>(seed);
}

#endif
