/*
 * test_decode_cuda.cu - the CUDA KV-cache decode (llmc/cuda/decode.cuh, ./generate_gpu's model)
 * against the CPU's (llmc/cpu/decode.h, ./generate's), through cudasim or on a GPU:
 *  - attention_decode against the CPU attention row (attention_row over the cache) at awkward
 *    sizes: head sizes 12 and 20 (not a power of two), one head, a first token (one key), a
 *    prompt chunk, a chunk ending at maxT, more keys than the kernel's threads; fp32 and bf16;
 *  - the whole model, fp32: every step's logits (prompt chunk, then one token at a time) and
 *    the greedy tokens of a free-running decode, token for token, for 24 tokens;
 *  - bf16 and fp16: the logits at every step of the CPU's greedy sequence within the trainer's
 *    model tolerances (test/test_gpt.cu: bf16 atol 6e-2 + rtol 2e-2; fp16 1.5e-2 + 5e-3). A CPU
 *    step is "well separated" when its top-2 logit gap exceeds 2 x that tolerance at the top
 *    logit: logits each within the tolerance cannot swap then. bf16 must give the CPU's argmax
 *    at every well-separated step of the CPU's sequence (at least a third of the steps must be,
 *    or the test model is too flat to say anything), and a free-running bf16 greedy decode must
 *    equal the CPU's up to its first step that is not well separated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmc/formats/modelfile.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/decode.h"
#include "llmc/cpu/gpt2.h"
#include "llmc/cuda/decode.cuh"
#include "llmc/core/rng.h"
#include "test/testing.h"

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- attention_decode against the CPU row ----------------------------------------------------- */
/* NKV key/value heads (grouped-query attention when < NH): qkv rows [q NH | k NKV | v NKV] x HS,
 * cache rows [k NKV | v NKV] x HS; query head h reads key/value head h / (NH / NKV). */
template <class T> static void check_attention(int C, int NH, int max_len, int pos, int n, int NKV = 0) {
    if (NKV == 0) NKV = NH;
    const int HS = C / NH, KV = 2 * NKV * HS;
    const size_t nq = (size_t)n * (C + KV), nkv = (size_t)max_len * KV;
    float *qkv = (float *)malloc(nq * sizeof(float)), *kv = (float *)malloc(nkv * sizeof(float));
    Rng rng;
    rng_seed(&rng, 1000u * C + pos);
    /* inputs exactly representable in T, so the CPU reference sees what the kernel sees */
    for (size_t i = 0; i < nq; i++) qkv[i] = to_float(from_float<T>(2.0f * rng_f32(&rng) - 1.0f));
    for (size_t i = 0; i < nkv; i++) kv[i] = to_float(from_float<T>(2.0f * rng_f32(&rng) - 1.0f));
    float *ref = (float *)malloc((size_t)n * C * sizeof(float)), *att = (float *)malloc(max_len * sizeof(float));
    const float scale = 1.0f / sqrtf((float)HS);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < NH; h++)
            attention_row(ref + (size_t)i * C + h * HS, att, qkv + (size_t)i * (C + KV) + h * HS,
                          kv + h / (NH / NKV) * HS, kv + (NKV + h / (NH / NKV)) * HS, (size_t)KV, pos + i, HS, scale);
    T *hq = (T *)malloc(nq * sizeof(T)), *hkv = (T *)malloc(nkv * sizeof(T)), *hout = (T *)malloc((size_t)n * C * sizeof(T));
    for (size_t i = 0; i < nq; i++) hq[i] = from_float<T>(qkv[i]);
    for (size_t i = 0; i < nkv; i++) hkv[i] = from_float<T>(kv[i]);
    T *dq, *dkv, *dout;
    float *scores;
    cudaCheck(cudaMalloc(&dq, nq * sizeof(T)));
    cudaCheck(cudaMalloc(&dkv, nkv * sizeof(T)));
    cudaCheck(cudaMalloc(&dout, (size_t)n * C * sizeof(T)));
    cudaCheck(cudaMalloc(&scores, (size_t)n * NH * max_len * sizeof(float)));
    cudaCheck(cudaMemcpy(dq, hq, nq * sizeof(T), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dkv, hkv, nkv * sizeof(T), cudaMemcpyHostToDevice));
    attention_decode(dout, scores, dq, dkv, pos, n, C, NH, NKV, max_len, (cudaStream_t)0);
    cudaCheck(cudaMemcpy(hout, dout, (size_t)n * C * sizeof(T), cudaMemcpyDeviceToHost));
    float *got = (float *)malloc((size_t)n * C * sizeof(float));
    for (size_t i = 0; i < (size_t)n * C; i++) got[i] = to_float(hout[i]);
    char name[160];
    snprintf(name, sizeof name, "attention_decode %s C %d NH %d NKV %d (HS %d) maxT %d: %d queries at positions %d..%d",
             sizeof(T) == 4 ? "fp32" : "bf16", C, NH, NKV, HS, max_len, n, pos, pos + n - 1);
    /* fp32: other summation orders (block reductions); bf16: plus the output's rounding (2^-9) */
    if (sizeof(T) == 4) test_close(name, got, ref, (size_t)n * C, 1e-6, 1e-5);
    else test_close(name, got, ref, (size_t)n * C, 1e-5, 4e-3);
    cudaCheck(cudaFree(dq));
    cudaCheck(cudaFree(dkv));
    cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(scores));
    free(qkv), free(kv), free(ref), free(att), free(hq), free(hkv), free(hout), free(got);
}

/* ---- the model ---------------------------------------------------------------------------------- */
/* 2 layers, 5 heads of 12 channels, V 300 (padded 384), maxT 40: random GPT-2 weights with wpe x 20
 * and qkvw x 8 (as test/test_generate.py: position-dependent, sharply attending) and wte x 4
 * (logits a few units apart, so greedy choices are clear). */
static const ModelConfig CFG = {.max_seq_len = 40, .vocab_size = 300, .padded_vocab_size = 384, .num_layers = 2,
                                .num_heads = 5, .num_kv_heads = 5, .channels = 60, .ffn_hidden = 240};
enum { PROMPT = 7, STEPS = 24 };

struct CudaSide {
    CudaContext ctx;
    CudaModel model;
    CudaDecoder dec;
};
static CudaSide *cuda_side(const char *path, Precision p) {
    CudaSide *c = (CudaSide *)calloc(1, sizeof(CudaSide));
    cuda_context_init(&c->ctx, 0, 0);
    cudamodel_build(&c->model, path, 1, p, &c->ctx, 0);
    cuda_decoder_init(&c->dec, &c->model, 16);
    return c;
}
static void cuda_side_free(CudaSide *c) {
    cuda_decoder_free(&c->dec);
    cudamodel_free(&c->model);
    cuda_context_free(&c->ctx);
    free(c);
}

int main(void) {
    check_attention<float>(60, 5, 40, 0, 1);     /* the first token: one key */
    check_attention<float>(60, 5, 40, 0, 16);    /* a prompt chunk */
    check_attention<float>(60, 5, 40, 23, 5);    /* a chunk after cached positions */
    check_attention<float>(60, 5, 40, 36, 4);    /* ending at maxT */
    check_attention<float>(20, 1, 300, 290, 3);  /* one head of 20; 291..293 keys > 128 threads */
    check_attention<float>(96, 3, 200, 130, 1);
    check_attention<__nv_bfloat16>(60, 5, 40, 23, 5);
    check_attention<__nv_bfloat16>(20, 1, 300, 290, 3);
    /* grouped-query attention: NKV = NH/2, NKV = 1 (the cache holds each group's head once) */
    check_attention<float>(64, 4, 40, 23, 5, 2);
    check_attention<float>(64, 4, 40, 36, 4, 1);
    check_attention<__nv_bfloat16>(64, 4, 40, 23, 5, 1);

    const int V = CFG.vocab_size, Vp = CFG.padded_vocab_size;
    GPT2 cpu;
    gpt2_build_random(&cpu, &CFG, 20241130);
    const size_t C = CFG.channels;
    for (size_t i = 0; i < (size_t)CFG.max_seq_len * C; i++) cpu.params.wpe[i] *= 20.0f;
    for (size_t i = 0; i < (size_t)CFG.num_layers * 3 * C * C; i++) cpu.params.qkvw[i] *= 8.0f;
    for (size_t i = 0; i < (size_t)Vp * C; i++) cpu.params.wte[i] *= 4.0f;
    char path[128];
    snprintf(path, sizeof path, "/tmp/llmc_test_decode_cuda_%d.bin", (int)getpid());
    model_file_save(path, &CFG, cpu.params_memory, cpu.num_parameters, MODEL_VERSION_FP32);

    /* the CPU's greedy decode: its tokens, logits and top-2 gaps at every step */
    int seq[PROMPT + STEPS];
    for (int i = 0; i < PROMPT; i++) seq[i] = (37 * i + 11) % V;
    static float cpu_logits[STEPS][384];
    float gap[STEPS], top[STEPS];
    KVCache cache;
    kvcache_init(&cache, &cpu, 16);
    const float *lg = gpt2_forward_cached(&cpu, &cache, seq, PROMPT) + (size_t)(PROMPT - 1) * Vp;
    for (int s = 0; s < STEPS; s++) {
        memcpy(cpu_logits[s], lg, (size_t)Vp * sizeof(float));
        int best = argmax(lg, V), second = best == 0 ? 1 : 0;
        for (int i = 0; i < V; i++)
            if (i != best && lg[i] > lg[second]) second = i;
        gap[s] = lg[best] - lg[second];
        top[s] = lg[best];
        seq[PROMPT + s] = best;
        if (s + 1 < STEPS) lg = gpt2_forward_cached(&cpu, &cache, &seq[PROMPT + s], 1);
    }
    int distinct = 0;
    for (int s = 0; s < STEPS; s++) {
        int seen = 0;
        for (int r = 0; r < s; r++) seen |= seq[PROMPT + r] == seq[PROMPT + s];
        distinct += !seen;
    }
    test_report(distinct >= 6, "the test model's greedy continuation varies (a stale-cache bug changes it)",
                "only %d distinct tokens in %d", distinct, STEPS);

    const Precision precs[3] = {PRECISION_FP32, PRECISION_BF16, PRECISION_FP16};
    const double atol[3] = {1e-5, 6e-2, 1.5e-2}, rtol[3] = {1e-5, 2e-2, 5e-3};
    for (int k = 0; k < 3; k++) {
        const char *pn = precision_name(precs[k]);
        char name[160];
        /* teacher-forced on the CPU's sequence: the logits of every step */
        CudaSide *c = cuda_side(path, precs[k]);
        static float got[STEPS][384];
        const float *g = cuda_decoder_forward(&c->dec, seq, PROMPT);
        for (int s = 0; s < STEPS; s++) {
            memcpy(got[s], g, (size_t)V * sizeof(float));
            if (s + 1 < STEPS) g = cuda_decoder_forward(&c->dec, &seq[PROMPT + s], 1);
        }
        snprintf(name, sizeof name, "%s decode logits equal the CPU decode's at all %d steps (prompt chunk, then 1 token each)",
                 pn, STEPS);
        int ok = 1;
        for (int s = 0; s < STEPS && ok; s++) {
            char step[200];
            snprintf(step, sizeof step, "%s: step %d", name, s);
            if (s + 1 < STEPS) { /* one line per precision unless a step fails */
                for (int i = 0; i < V && ok; i++)
                    ok = fabs(got[s][i] - cpu_logits[s][i]) <= atol[k] + rtol[k] * fabs(cpu_logits[s][i]);
                if (!ok) test_close(step, got[s], cpu_logits[s], V, atol[k], rtol[k]);
            } else {
                ok = test_close(name, got[s], cpu_logits[s], V, atol[k], rtol[k]);
            }
        }
        cuda_side_free(c);
        if (precs[k] == PRECISION_FP16) continue;

        /* free-running greedy decode on the GPU */
        c = cuda_side(path, precs[k]);
        int gen[STEPS];
        int cur[PROMPT];
        memcpy(cur, seq, sizeof cur);
        g = cuda_decoder_forward(&c->dec, cur, PROMPT);
        for (int s = 0; s < STEPS; s++) {
            gen[s] = argmax(g, V);
            if (s + 1 < STEPS) g = cuda_decoder_forward(&c->dec, &gen[s], 1);
        }
        cuda_side_free(c);
        int want = STEPS; /* fp32: every token; bf16: up to the first narrow CPU gap */
        if (precs[k] != PRECISION_FP32)
            for (int s = 0; s < STEPS; s++)
                if (gap[s] <= 2.0 * (atol[k] + rtol[k] * fabs(top[s]))) {
                    want = s;
                    break;
                }
        int same = 0;
        while (same < want && gen[same] == seq[PROMPT + same]) same++;
        snprintf(name, sizeof name, "%s greedy decode equals the CPU's for the first %d tokens (of %d)", pn, want, STEPS);
        test_report(same == want, name, "first difference at token %d (%d vs the CPU's %d); %d tokens well separated", same,
                    same < STEPS ? gen[same] : -1, same < STEPS ? seq[PROMPT + same] : -1, want);
        if (precs[k] == PRECISION_FP32) continue;
        /* teacher-forced: the argmax at every well-separated step of the CPU's sequence */
        int separated = 0, agree = 0, first_bad = -1;
        for (int s = 0; s < STEPS; s++) {
            if (gap[s] <= 2.0 * (atol[k] + rtol[k] * fabs(top[s]))) continue;
            separated++;
            if (argmax(got[s], V) == seq[PROMPT + s]) agree++;
            else if (first_bad < 0) first_bad = s;
        }
        snprintf(name, sizeof name, "%s argmax equals the CPU's at each of the %d well-separated steps of %d", pn, separated, STEPS);
        test_report(agree == separated && separated >= STEPS / 3, name, "%d of %d agree (first disagreement at step %d); at least %d needed",
                    agree, separated, first_bad, STEPS / 3);
    }
    kvcache_free(&cache);
    gpt2_free(&cpu);
    char sum[160];
    sumfile_path(path, sum, sizeof sum);
    unlink(sum);
    unlink(path);
    return test_exit_code();
}
