/*
 * cpu_arch_checks.h - the checks every architecture's CPU block sequence takes against its PyTorch
 * reference (test_llama_cpu.c, test_mlp_cpu.c, test_mixtral_cpu.c), through its CPU table entry
 * (llmc/cpu/arch.h): the first step's logits, loss and gradients against the reference's debug
 * state, and the KV-cache decode (the first sequence fed to forward_cached in chunks of 1, 2, ..., 8
 * tokens gives the full forward's logits at every position); and what those tests share: loading a
 * model through the table, one AdamW step on the reference's batch, one-rank -z 2/3 hooks, files.
 */
#ifndef LLMC_TEST_CPU_ARCH_CHECKS_H
#define LLMC_TEST_CPU_ARCH_CHECKS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"
#include "llmc/cpu/adamw.h"
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

/* The model -e init names, through a's table entries alone: taken by config_from_init (else dies),
 * valid, built, and its parameters from load_init (seed for descriptors). */
static inline void cpu_arch_load(const CpuArch *a, void *model, ArchConfig *ac, const char *init, unsigned long long seed) {
    const ModelArch *ma = a->arch;
    if (!ma->config_from_init(init, ac) || ac->arch != ma) llmc_die("'%s' is not taken by %s_arch", init, ma->name);
    const char *bad = ma->config_validate(ac);
    if (bad) llmc_die("'%s': %s", init, bad);
    a->build(model, ac);
    CpuModelParts parts = a->parts(model);
    ma->load_init(init, ac, *parts.params, parts.num_parameters, seed);
}

/* the file at path, loaded through the table and allocated for (B, T) */
static inline void cpu_arch_load_for(const CpuArch *a, void *model, const char *path, int B, int T, int training) {
    ArchConfig ac;
    cpu_arch_load(a, model, &ac, path, 0);
    a->allocate(model, B, T, 0, training);
}

/* One AdamW step on the reference's batch with its settings (step t from 1, moments m and v);
 * returns the loss and the gradient norm in *norm. */
static inline float cpu_arch_train_step(const CpuArch *a, void *model, const DebugState *d, float *m, float *v, int t,
                                        float *norm) {
    CpuModelParts p = a->parts(model);
    float *params = *p.params, *grads = *p.grads;
    a->zero_grad(model);
    const float loss = a->forward(model, d->x, d->y, d->B, d->T, 1.0f / (d->B * d->T));
    a->backward(model, d->x, d->B, d->T);
    *norm = (float)sqrt(global_norm_squared(grads, p.num_parameters));
    const float scale = d->grad_clip > 0 && *norm > d->grad_clip ? d->grad_clip / *norm : 1.0f;
    for (int i = 0; i < a->arch->num_param_specs; i++) {
        const TensorSpec *s = &p.specs[i];
        if (!s->numel) continue;
        adamw_update(params + s->offset, grads + s->offset, m + s->offset, v + s->offset, s->numel, d->lr, d->beta1,
                     d->beta2, d->eps, s->decay ? d->weight_decay : 0.0f, t, scale);
    }
    return loss;
}

/* d->nsteps AdamW steps of model (built and allocated for training) on the reference's batch, from
 * moments m and v (n floats each, zero); each step's objective and gradient norm must be the
 * reference's (check_debug_step), reported once as what. */
static inline void check_trajectory(const CpuArch *a, void *model, const DebugState *d, float *m, float *v,
                                    const char *what) {
    int ok = 1;
    for (int step = 0; step < d->nsteps; step++) {
        float norm;
        const float l = cpu_arch_train_step(a, model, d, m, v, step + 1, &norm);
        ok &= check_debug_step(d, step, l, norm);
    }
    test_report(ok, what, "see the steps above");
}

/* -z 2/3 with one rank: the hooks stand in for the optimizer (reduce: a bucket's gradients into
 * whole ones; gather: a bucket's parameters from a whole copy) */
typedef struct {
    float *grads;
    const float *params;
} ZeroCtx;
static inline void zero_reduce(void *ctx, float *packed, const Bucket *b) {
    for (int i = 0; i < b->n; packed += b->len[i], i++)
        memcpy(((ZeroCtx *)ctx)->grads + b->off[i], packed, b->len[i] * sizeof(float));
}
static inline void zero_gather_begin(void *ctx, float *packed, const Bucket *b, int slot) {
    (void)slot;
    for (int i = 0; i < b->n; packed += b->len[i], i++)
        memcpy(packed, ((ZeroCtx *)ctx)->params + b->off[i], b->len[i] * sizeof(float));
}
static inline void zero_gather_end(void *ctx, int slot) { (void)ctx, (void)slot; }

/* model (built and allocated for training) sharded at -z zero on one rank, its parameters from
 * params (a whole copy): one forward and backward on the reference's batch; the whole gradients
 * land in zc->grads (n floats, zeroed here by the caller's calloc). Returns the loss. */
static inline float cpu_arch_zero_step(const CpuArch *a, void *model, const DebugState *d, int zero, ZeroCtx *zc) {
    a->shard(model, zero, 1, 0, (CpuShardHooks){zc, zero_reduce, zero_gather_begin, zero_gather_end});
    a->zero_grad(model);
    const float loss = a->forward(model, d->x, d->y, d->B, d->T, 1.0f / (d->B * d->T));
    a->backward(model, d->x, d->B, d->T);
    return loss;
}

/* 1 when the two files hold the same bytes */
static inline int same_bytes(const char *pa, const char *pb) {
    FILE *a = fopenCheck(pa, "rb"), *b = fopenCheck(pb, "rb");
    int same = 1, ca, cb;
    do {
        ca = fgetc(a), cb = fgetc(b);
        same &= ca == cb;
    } while (ca != EOF && cb != EOF);
    fclose(a), fclose(b);
    return same;
}

/* a model file and its "<path>.sum" */
static inline void remove_with_sum(const char *path) {
    char sum[4300];
    sumfile_path(path, sum, sizeof sum);
    remove(path), remove(sum);
}

#endif
