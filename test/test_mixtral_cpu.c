/*
 * test_mixtral_cpu.c - the Mixtral architecture on the CPU (llmc/cpu/mixtral.c, llmc/cpu/moe.c)
 * against the PyTorch reference (dev/reference/train_mixtral.py), through its ModelArch entry
 * (mixtral_arch) and its CPU entry (mixtral_cpu_arch).
 *
 * usage: test_mixtral_cpu MODEL.bin DEBUG_STATE.bin STATS.bin   (files from train_mixtral.py)
 *          the checkpoint saved back byte for byte; the first forward's CE, aux and tokens per
 *          expert (every layer) against STATS; logits, the objective, every gradient (router and
 *          experts included); the 10-step AdamW trajectory and the parameters after it; the same
 *          bits on a second run; -z 2 and -z 3 (one rank) bit for bit as -z 0; ./generate's cached
 *          decode in chunks of 1..8 tokens gives the full forward's logits.
 *        test_mixtral_cpu --tie MODEL.bin DEBUG_STATE.bin STATS.bin   (an all-zero router: every
 *          router row ties) every token's experts are 0..K-1 in order, the routing, CE and aux
 *          on the reference's batch the reference's (a tie broken another way fails).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/mixtral.h"
#include "llmc/formats/mixtralfile.h"
#include "test/cpu_arch_checks.h"
#include "test/debug_state.h"
#include "test/testing.h"

static void load(MixtralModel *m, ArchConfig *ac, const char *init) { cpu_arch_load(&mixtral_cpu_arch, m, ac, init, 0); }

static void load_for(MixtralModel *m, const char *path, int B, int T, int training) {
    cpu_arch_load_for(&mixtral_cpu_arch, m, path, B, T, training);
}

/* STATS: float32 CE, aux, then L x E tokens per expert */
static float *read_stats(const char *path, size_t n) {
    float *s = (float *)mallocCheck(n * sizeof(float), "stats");
    FILE *f = fopenCheck(path, "rb");
    freadCheck(s, sizeof(float), n, f, path);
    fclose(f);
    return s;
}

static void check_stats(MixtralModel *m, const DebugState *d, const float *stats, const char *what) {
    const int L = m->cfg.base.num_layers, E = m->cfg.num_experts;
    mixtral_forward(m, d->x, d->y, d->B, d->T, 0.0f);
    char name[160];
    snprintf(name, sizeof name, "%s: cross-entropy", what);
    test_report(fabsf(m->last_ce - stats[0]) <= 1e-5f * fabsf(stats[0]) + 1e-6f, name, "got %.7f, reference %.7f", m->last_ce,
                stats[0]);
    snprintf(name, sizeof name, "%s: auxiliary load-balancing loss (transformers >= 4.37)", what);
    test_report(fabsf(m->last_aux - stats[1]) <= 1e-5f * fabsf(stats[1]) + 1e-6f, name, "got %.7f, reference %.7f",
                m->last_aux, stats[1]);
    int same = 1;
    for (int l = 0; l < L; l++) {
        const float *count = tensor_layer(m->acts_memory, &m->act_specs[MIXTRAL_A_expert_count], l);
        for (int e = 0; e < E; e++) same &= count[e] == stats[2 + l * E + e];
    }
    snprintf(name, sizeof name, "%s: tokens per expert in every layer (the routing)", what);
    test_report(same, name, "");
}

static void test_trajectory(const char *path, const DebugState *d) {
    MixtralModel model;
    load_for(&model, path, d->B, d->T, 1);
    const size_t n = model.num_parameters;
    float *m = (float *)callocCheck(n, sizeof(float), "m"), *v = (float *)callocCheck(n, sizeof(float), "v");
    check_trajectory(&mixtral_cpu_arch, &model, d, m, v, "10-step AdamW trajectory (objective and grad norm)");
    /* dense tensors at the Llama's tolerance; an expert that sees a handful of tokens gets gradients
     * whose fp32 rounding AdamW's normalisation carries into its weights: a looser absolute bound */
    for (int i = 0; i < MIXTRAL_NUM_PARAMETERS; i++) {
        const TensorSpec *s = &model.param_specs[i];
        if (!s->numel) continue;
        const int expert = i == MIXTRAL_P_expfcw || i == MIXTRAL_P_expprojw || i == MIXTRAL_P_gatew;
        char name[96];
        snprintf(name, sizeof name, "parameters after the trajectory: %s %s", s->name, s->shape);
        test_close(name, model.params_memory + s->offset, d->params_after + s->offset, s->numel, expert ? 5e-5 : 1e-5, 1e-4);
    }
    mixtral_free(&model);
    free(m), free(v);
}

/* one training step's loss and gradients, copied out */
static float step_grads(const char *path, const DebugState *d, float *grads) {
    MixtralModel model;
    load_for(&model, path, d->B, d->T, 1);
    const size_t n = model.num_parameters;
    mixtral_zero_grad(&model);
    const float loss = mixtral_forward(&model, d->x, d->y, d->B, d->T, 1.0f / (d->B * d->T));
    mixtral_backward(&model, d->x, d->B, d->T);
    memcpy(grads, model.grads_memory, n * sizeof(float));
    mixtral_free(&model);
    return loss;
}

static void test_determinism_and_zero(const char *path, const DebugState *d, size_t n) {
    float *g0 = (float *)mallocCheck(n * sizeof(float), "g0"), *g1 = (float *)mallocCheck(n * sizeof(float), "g1");
    const float l0 = step_grads(path, d, g0), l1 = step_grads(path, d, g1);
    test_report(l0 == l1 && memcmp(g0, g1, n * sizeof(float)) == 0, "a second run gives the same bits (loss, gradients)", "");
    for (int zero = 2; zero <= 3; zero++) {
        MixtralModel model;
        load_for(&model, path, d->B, d->T, 1);
        float *params = (float *)mallocCheck(n * sizeof(float), "params");
        memcpy(params, model.params_memory, n * sizeof(float));
        ZeroCtx zc = {(float *)callocCheck(n, sizeof(float), "whole grads"), params};
        const float loss = cpu_arch_zero_step(&mixtral_cpu_arch, &model, d, zero, &zc);
        char name[96];
        snprintf(name, sizeof name, "-z %d: the loss and every gradient equal -z 0's bit for bit", zero);
        test_report(loss == l0 && memcmp(zc.grads, g0, n * sizeof(float)) == 0, name, "loss %.9g vs %.9g", loss, l0);
        mixtral_free(&model);
        free(zc.grads), free(params);
    }
    free(g0), free(g1);
}

/* an all-zero router: every row ties; experts 0..K-1 in order with weights 1/K, and the routing,
 * CE and aux on the reference's batch are the reference's */
static void test_tie(const char *path, const char *state_path, const char *stats_path) {
    MixtralModel model;
    ArchConfig ac;
    load(&model, &ac, path);
    DebugState d;
    read_debug_state(state_path, &d, model.num_parameters);
    const int L = model.cfg.base.num_layers, E = model.cfg.num_experts, K = model.cfg.top_k, N = d.B * d.T;
    mixtral_allocate_for(&model, d.B, d.T, 0);
    const float *stats = read_stats(stats_path, 2 + (size_t)L * E);
    check_stats(&model, &d, stats, "tied router");
    int order = 1;
    for (int l = 0; l < L; l++) {
        const float *ex = tensor_layer(model.acts_memory, &model.act_specs[MIXTRAL_A_route_expert], l);
        const float *w = tensor_layer(model.acts_memory, &model.act_specs[MIXTRAL_A_route_weight], l);
        const float *count = tensor_layer(model.acts_memory, &model.act_specs[MIXTRAL_A_expert_count], l);
        for (int t = 0; t < N; t++)
            for (int j = 0; j < K; j++) order &= ex[t * K + j] == (float)j && fabsf(w[t * K + j] - 1.0f / K) < 1e-6f;
        for (int e = 0; e < E; e++) order &= count[e] == (e < K ? (float)N : 0.0f);
    }
    test_report(order, "a tied router (all-zero gate) picks experts 0..K-1 in order, weights 1/K", "");
    free((void *)stats);
    mixtral_free(&model);
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--tie") == 0) {
        test_tie(argv[2], argv[3], argv[4]);
        return test_exit_code();
    }
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.bin DEBUG_STATE.bin STATS.bin | --tie MODEL.bin DEBUG_STATE.bin STATS.bin\n", argv[0]);
        return 2;
    }
    MixtralModel model;
    ArchConfig ac;
    load(&model, &ac, argv[1]);
    DebugState d;
    read_debug_state(argv[2], &d, model.num_parameters);
    const ModelConfig *cfg = &model.cfg.base;
    test_report(d.V == cfg->vocab_size && d.L == cfg->num_layers && d.C == cfg->channels && d.F == cfg->ffn_hidden &&
                    d.NKV == cfg->num_kv_heads,
                "debug state matches the checkpoint's config", "");
    printf("config: L %d C %d NH %d NKV %d F %d E %d top-%d V %d, batch B %d T %d, %d steps\n", d.L, d.C, d.NH, d.NKV,
           d.F, model.cfg.num_experts, model.cfg.top_k, d.V, d.B, d.T, d.nsteps);
    char path[4200];
    snprintf(path, sizeof path, "%s.rewritten", argv[2]);
    mixtral_arch.save(path, &ac, model.params_memory, model.num_parameters, 0);
    test_report(same_bytes(argv[1], path), "Mixtral checkpoint saved through mixtral_arch is the reference's file byte for byte", "");
    remove_with_sum(path);
    const float *stats = read_stats(argv[3], 2 + (size_t)cfg->num_layers * model.cfg.num_experts);
    mixtral_allocate_for(&model, d.B, d.T, 1);
    check_stats(&model, &d, stats, "first forward");
    mixtral_free(&model);
    load(&model, &ac, argv[1]);
    check_debug_first_step(&mixtral_cpu_arch, &model, &d);
    const size_t n = model.num_parameters;
    mixtral_free(&model);
    test_trajectory(argv[1], &d);
    test_determinism_and_zero(argv[1], &d, n);
    /* ./generate's cached forward (chunks of 1..8 tokens) against the full forward's logits */
    load_for(&model, argv[1], 1, d.T, 0);
    MixtralKVCache *cache = (MixtralKVCache *)check_cached_decode(&mixtral_cpu_arch, &model, d.x, d.T,
                                                                  "cached decode (chunks of 1..8 tokens) equals the full forward's logits");
    test_report(cache->d.len == d.T, "the cache counts the positions fed", "");
    mixtral_cpu_arch.kvcache_free(cache);
    free(cache);
    mixtral_free(&model);
    free((void *)stats);
    return test_exit_code();
}
