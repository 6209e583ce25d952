/*
 * cpu_arch_checks.h - the checks every architecture's CPU block sequence takes against its PyTorch
 * reference (test_llama_cpu.c, test_mlp_cpu.c), through its CPU table entry (llmc/cpu/arch.h): the
 * first step's logits, loss and gradients against the reference's debug state, and the KV-cache
 * decode (the first sequence fed to forward_cached in chunks of 1, 2, ..., 8 tokens gives the
 * full forward's logits at every position).
 */
#ifndef LLMC_TEST_CPU_ARCH_CHECKS_H
#define LLMC_TEST_CPU_ARCH_CHECKS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/arch.h"
#include "test/debug_state.h"
#include "test/testing.h"

/* model: a's, built with the reference's parameters. Allocated for training at the debug state's
 * (B, T); its logits (no targets), loss and gradients (one backward at weight 1/(B T)) must be the
 * reference's. Leaves the gradients in the model. */
static void check_debug_first_step(const CpuArch *a, void *model, const DebugState *d) {
    const int B = d->B, T = d->T;
    a->allocate(model, B, T, 0, 1);
    a->forward(model, d->x, NULL, B, T, 0.0f);
    check_debug_logits(d, a->logits(model));
    float loss = a->forward(model, d->x, d->y, B, T, 1.0f / (B * T));
    test_report(fabsf(loss - d->loss) <= 1e-5f, "forward loss", "got %.7f, reference %.7f", loss, d->loss);
    a->backward(model, d->x, B, T);
    CpuModelParts parts = a->parts(model);
    check_debug_gradients(d, parts.specs, a->arch->num_param_specs, *parts.grads);
}

/* model: a's, built and allocated for batches of (1, T) at least. Returns the cache after the
 * last chunk (the caller checks what it likes, then a->kvcache_free and free). */
static void *check_cached_decode(const CpuArch *a, void *model, const int *tokens, int T, const char *what) {
    a->forward(model, tokens, NULL, 1, T, 0.0f);
    const ModelConfig *cfg = a->parts(model).cfg;
    const int Vp = cfg->padded_vocab_size, V = cfg->vocab_size;
    const float *full = a->logits(model);
    void *cache = mallocCheck(a->cache_size, "KV cache");
    memset(cache, 0, a->cache_size);
    a->kvcache_init(cache, model, 8);
    float *got = (float *)mallocCheck((size_t)T * V * sizeof(float), "cached logits");
    float *want = (float *)mallocCheck((size_t)T * V * sizeof(float), "full logits");
    for (int t = 0; t < T; t++) memcpy(want + (size_t)t * V, full + (size_t)t * Vp, V * sizeof(float));
    for (int pos = 0, chunk = 1; pos < T; pos += chunk, chunk = chunk % 8 + 1) {
        int n = pos + chunk > T ? T - pos : chunk;
        const float *logits = a->forward_cached(model, cache, tokens + pos, n);
        for (int i = 0; i < n; i++) memcpy(got + (size_t)(pos + i) * V, logits + (size_t)i * Vp, V * sizeof(float));
        chunk = n;
    }
    test_close(what, got, want, (size_t)T * V, 1e-5, 1e-4);
    free(got), free(want);
    return cache;
}

#endif
