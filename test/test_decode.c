/*
 * test_decode.c - the KV-cache forward (llmc/cpu/decode.h) against the full forward
 * (gpt2_forward): every position's logits, whether fed as one prompt chunk, chunks of several
 * tokens or one token at a time, and the greedy choice at every position.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/cpu/decode.h"
#include "llmc/cpu/gpt2.h"
#include "llmc/core/rng.h"
#include "llmc/generate/sampler.h"
#include "test/testing.h"

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(void) {
    /* a small GPT-2 with an unpadded-vocabulary tail (V 300 -> Vp 384) and odd head count */
    ModelConfig cfg = {.max_seq_len = 48, .vocab_size = 300, .padded_vocab_size = 384, .num_layers = 3,
                       .num_heads = 3, .num_kv_heads = 3, .channels = 48, .ffn_hidden = 192};
    const int T = cfg.max_seq_len, V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
    printf("seed 20241130: L %d NH %d C %d maxT %d V %d\n", cfg.num_layers, cfg.num_heads, cfg.channels, T, V);
    GPT2 model;
    gpt2_build_random(&model, &cfg, 20241130);
    gpt2_allocate(&model, 1, T, 0, 0);
    int tokens[48];
    Rng rng;
    rng_seed(&rng, 7);
    for (int t = 0; t < T; t++) tokens[t] = (int)(rng_u32(&rng) % (uint32_t)V);
    gpt2_forward(&model, tokens, NULL, 1, T, 0.0f);
    float *full = (float *)malloc((size_t)T * Vp * sizeof(float));
    memcpy(full, model.acts.logits, (size_t)T * Vp * sizeof(float));

    /* Tolerance: the cached path runs each matmul over n rows instead of T, and BLAS may block
     * (and so round) differently by row count; everything else is the same arithmetic. */
    const double atol = 1e-5, rtol = 1e-5;
    const int chunkings[3][4] = {{T, 0}, {5, 7, 1, 0}, {1, 0}}; /* chunk sizes, repeating the last */
    const char *names[3] = {"whole prompt in one chunk", "chunks of 5, 7, then 1", "one token at a time"};
    KVCache cache;
    kvcache_init(&cache, &model, T);
    float *cached = (float *)malloc((size_t)T * Vp * sizeof(float));
    for (int c = 0; c < 3; c++) {
        kvcache_reset(&cache);
        int pos = 0, k = 0;
        while (pos < T) {
            int n = chunkings[c][k];
            if (chunkings[c][k + 1] != 0) k++;
            if (n > T - pos) n = T - pos;
            const float *lg = gpt2_forward_cached(&model, &cache, tokens + pos, n);
            memcpy(cached + (size_t)pos * Vp, lg, (size_t)n * Vp * sizeof(float));
            pos += n;
        }
        char name[160];
        snprintf(name, sizeof name, "KV-cache logits equal the full forward's at all %d positions (%s)", T, names[c]);
        test_close(name, cached, full, (size_t)T * Vp, atol, rtol);
        int same = 1, first_bad = -1;
        for (int t = 0; t < T && same; t++)
            if (argmax(cached + (size_t)t * Vp, V) != argmax(full + (size_t)t * Vp, V)) same = 0, first_bad = t;
        snprintf(name, sizeof name, "KV-cache greedy token equals the full forward's at every position (%s)", names[c]);
        test_report(same, name, "differs at position %d", first_bad);
        test_report(cache.len == T, "the cache holds every position fed", "len %d, expected %d", cache.len, T);
    }
    /* the padded logits past V stay zero (wte's padded rows are zero) and are never sampled */
    int pad_zero = 1;
    for (int t = 0; t < T; t++)
        for (int i = V; i < Vp; i++) pad_zero &= cached[(size_t)t * Vp + i] == 0.0f;
    test_report(pad_zero, "KV-cache padded logits are zero", "");
    test_report(sample_filtered(cached, V, 0.0f, 0, 1.0f, 0.5f) == argmax(cached, V),
                "greedy sampling (temperature 0) is the argmax", "");

    free(full);
    free(cached);
    kvcache_free(&cache);
    gpt2_free(&model);
    return test_exit_code();
}
