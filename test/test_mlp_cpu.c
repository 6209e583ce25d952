/*
 * test_mlp_cpu.c - the MLP-only test architecture on the CPU (llmc/cpu/mlp.c) against the PyTorch
 * reference (dev/reference/train_mlp.py), reached only through its ModelArch entry (mlp_arch) and
 * its own headers: the checkpoint header read through config_from_init on the file's path.
 *
 * usage: test_mlp_cpu MODEL.bin DEBUG_STATE.bin [--past-maxT]   (files from train_mlp.py)
 *        test_mlp_cpu --descriptors TMPDIR   (mlp:dN, random init, bf16 files: no reference needed)
 * Checks (test_llama_cpu.c's tolerances): logits, loss, every gradient tensor, the 10-step
 * loss/grad-norm trajectory under the reference's AdamW and the parameters after it; the loaded
 * model saved through the table is the reference's file byte for byte; save -> reload -> train is
 * bit-identical to training on; -z 2 and -z 3 (zero.h's buckets and gathers, one rank) give the
 * -z 0 loss and gradients bit for bit; ./generate's cached forward (chunks of 1..8 tokens) gives
 * the full forward's logits. --past-maxT then feeds the cache past maxT (the script expects the error).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/mlp.h"
#include "llmc/formats/mlpfile.h"
#include "llmc/formats/modelfile.h"
#include "test/cpu_arch_checks.h"
#include "test/debug_state.h"
#include "test/testing.h"

/* the model -e init names, built and loaded through the table (seed for descriptors) */
static void load(MlpModel *m, ArchConfig *ac, const char *init, unsigned long long seed) {
    cpu_arch_load(&mlp_cpu_arch, m, ac, init, seed);
    test_report(mlp_arch.parameter_specs(ac, NULL) == m->num_parameters, "the table's size is the model's", "");
}

/* the file at path, loaded through the table and allocated for (B, T) */
static void load_for(MlpModel *m, const char *path, int B, int T, int training) {
    ArchConfig ac;
    load(m, &ac, path, 0);
    mlp_allocate_for(m, B, T, training);
}

/* mlp:dN's shape, the seeded init's rules, a header that is the Llama's, bf16 files */
static void test_descriptors(const char *dir) {
    ArchConfig ac;
    test_report(mlp_arch.config_from_init("mlp:d2", &ac) == 1 && ac.arch == &mlp_arch, "mlp:d2 is taken", "");
    const MlpConfig *cfg = arch_config_as(&ac, MlpConfig);
    const ModelConfig *b = &cfg->base;
    test_report(b->num_layers == 2 && b->channels == 128 && b->ffn_hidden == 512 && b->vocab_size == 50257 &&
                    b->padded_vocab_size == 50304 && b->num_heads == 1 && !mlp_arch.config_validate(&ac),
                "mlp:d2 is L 2, C 128, F 512, V 50257 (Vp 50304)", "L %d C %d F %d V %d", b->num_layers, b->channels,
                b->ffn_hidden, b->vocab_size);
    mlp_arch.config_print(&ac, stdout);
    ArchConfig other;
    const char *not_mine[] = {"d4", "llama3:d1", "mlp:d0", "mlp:dx", "mlp:d2x", "gpt2:d2", "/nonexistent/file.bin"};
    int refused = 1;
    for (size_t i = 0; i < sizeof not_mine / sizeof not_mine[0]; i++) refused &= mlp_arch.config_from_init(not_mine[i], &other) == 0;
    test_report(refused, "other descriptors and missing files are not taken (d4, llama3:d1, mlp:d0, ...)", "");
    /* a Llama file (same magic, architecture 1) is the Llama's */
    char path[4200];
    snprintf(path, sizeof path, "%s/llama_header.bin", dir);
    int32_t h[256] = {20261130, 1, 1};
    FILE *f = fopenCheck(path, "wb");
    fwriteCheck(h, sizeof h[0], 256, f, path);
    fclose(f);
    test_report(mlp_arch.config_from_init(path, &other) == 0, "a Llama checkpoint header (architecture 1) is not taken", "");
    remove(path);

    TensorSpec specs[MLP_NUM_PARAMETERS];
    const size_t n = mlp_arch.parameter_specs(&ac, specs);
    const size_t C = 128, L = 2, F = 512, Vp = 50304;
    test_report(n == Vp * C + L * C + L * 2 * F * C + L * C * F + C, "mlp:d2's parameter count from the table", "%zu", n);
    test_report(mlp_arch.flops_per_token(&ac, 64) == 6.0 * n && mlp_arch.flops_per_token(&ac, 1024) == 6.0 * n,
                "flops per token are 6N (no attention term)", "");
    float *p1 = (float *)mallocCheck(n * sizeof(float), "p1"), *p2 = (float *)mallocCheck(n * sizeof(float), "p2");
    test_report(mlp_arch.load_init("mlp:d2", &ac, p1, n, 7) == 0, "a descriptor's init reports fp32", "");
    mlp_arch.load_init("mlp:d2", &ac, p2, n, 7);
    test_report(memcmp(p1, p2, n * sizeof(float)) == 0, "the same seed gives the same init", "");
    mlp_arch.load_init("mlp:d2", &ac, p2, n, 8);
    test_report(memcmp(p1, p2, n * sizeof(float)) != 0, "another seed gives another init", "");
    int rules = 1;
    for (size_t i = 0; i < L * C; i++) rules &= p1[specs[MLP_P_lnw].offset + i] == 1.0f;
    for (size_t i = 0; i < C; i++) rules &= p1[specs[MLP_P_lnfw].offset + i] == 1.0f;
    for (size_t i = 50257 * C; i < Vp * C; i++) rules &= p1[specs[MLP_P_wte].offset + i] == 0.0f;
    double ss = 0, ssp = 0;
    const TensorSpec *fc = &specs[MLP_P_fcw], *pj = &specs[MLP_P_fcprojw];
    for (size_t i = 0; i < fc->numel; i++) ss += (double)p1[fc->offset + i] * p1[fc->offset + i];
    for (size_t i = 0; i < pj->numel; i++) ssp += (double)p1[pj->offset + i] * p1[pj->offset + i];
    const double sd = sqrt(ss / fc->numel), sdp = sqrt(ssp / pj->numel);
    rules &= fabs(sd - 0.02) < 0.001 && fabs(sdp - 0.01) < 0.0005; /* 0.02 / sqrt(2L), L = 2 */
    test_report(rules, "init rules: gains 1, padded rows 0, fcw N(0, 0.02), fcprojw N(0, 0.02/sqrt(2L))",
                "fcw sd %g, fcprojw sd %g", sd, sdp);

    /* bf16 through the table: rounded to nearest even, reported as bf16, read back through -e */
    snprintf(path, sizeof path, "%s/bf16.bin", dir);
    mlp_arch.save(path, &ac, p1, n, 1);
    ArchConfig back;
    test_report(mlp_arch.config_from_init(path, &back) == 1 && memcmp(&back.u, &ac.u, sizeof(MlpConfig)) == 0,
                "a saved file's config reads back through config_from_init", "");
    test_report(mlp_arch.load_init(path, &back, p2, n, 0) == 1, "a bf16 file loads as bf16", "");
    int rounded = 1;
    for (size_t i = 0; i < n; i++) rounded &= p2[i] == bf16_to_float(float_to_bf16(p1[i]));
    test_report(rounded, "bf16 weights are the fp32 ones rounded to nearest even", "");
    remove_with_sum(path);
    free(p1), free(p2);
}

static void test_zero(const char *path, const DebugState *d) {
    MlpModel model;
    load_for(&model, path, d->B, d->T, 1);
    const size_t n = model.num_parameters;
    const float dloss = 1.0f / (d->B * d->T);
    mlp_zero_grad(&model);
    const float loss0 = mlp_forward(&model, d->x, d->y, d->B, d->T, dloss);
    mlp_backward(&model, d->x, d->B, d->T);
    float *params = (float *)mallocCheck(n * sizeof(float), "params"), *grads0 = (float *)mallocCheck(n * sizeof(float), "grads");
    memcpy(params, model.params_memory, n * sizeof(float));
    memcpy(grads0, model.grads_memory, n * sizeof(float));
    mlp_free(&model);
    for (int zero = 2; zero <= 3; zero++) {
        ZeroCtx zc = {(float *)callocCheck(n, sizeof(float), "whole grads"), params};
        load_for(&model, path, d->B, d->T, 1);
        const float loss = cpu_arch_zero_step(&mlp_cpu_arch, &model, d, zero, &zc);
        char name[96];
        snprintf(name, sizeof name, "-z %d: the loss and every gradient equal -z 0's bit for bit", zero);
        test_report(loss == loss0 && memcmp(zc.grads, grads0, n * sizeof(float)) == 0, name, "loss %.9g vs %.9g", loss,
                    loss0);
        if (zero == 3) mlp_print_memory(&model, stdout);
        mlp_free(&model);
        free(zc.grads);
    }
    free(params), free(grads0);
}

/* the cached forward in chunks of 1, 2, ..., 8 tokens against the full forward of the sequence */
static void test_decode(const char *path, const int *tokens, int T) {
    MlpModel model;
    load_for(&model, path, 1, T, 0);
    MlpKVCache *cache = (MlpKVCache *)check_cached_decode(&mlp_cpu_arch, &model, tokens, T,
                                                          "cached decode (chunks of 1..8 tokens) equals the full forward's logits");
    test_report(cache->len == T && cache->max_len == model.cfg.base.max_seq_len, "the cache counts the positions fed", "");
    mlp_cpu_arch.kvcache_free(cache);
    free(cache);
    mlp_free(&model);
}

/* the N-step trajectory on the reference's batch under its AdamW settings; then save (through
 * the table) -> reload -> 3 more steps, bit-identical to 3 more steps of the model in memory */
static void test_trajectory(const char *path, const DebugState *d) {
    MlpModel model, back;
    load_for(&model, path, d->B, d->T, 1);
    const size_t n = model.num_parameters;
    float *m = (float *)callocCheck(n, sizeof(float), "m"), *v = (float *)callocCheck(n, sizeof(float), "v");
    check_trajectory(&mlp_cpu_arch, &model, d, m, v, "10-step loss and grad-norm trajectory");
    test_close("parameters after the trajectory", model.params_memory, d->params_after, n, 1e-5, 1e-4);
    char saved[4200];
    snprintf(saved, sizeof saved, "%s.trained", path);
    ArchConfig ac;
    mlp_arch.config_from_init(path, &ac);
    mlp_arch.save(saved, &ac, model.params_memory, n, 0);
    load_for(&back, saved, d->B, d->T, 1);
    float *m2 = (float *)mallocCheck(n * sizeof(float), "m2"), *v2 = (float *)mallocCheck(n * sizeof(float), "v2");
    memcpy(m2, m, n * sizeof(float)), memcpy(v2, v, n * sizeof(float));
    int same = 1;
    for (int t = d->nsteps + 1; t <= d->nsteps + 3; t++) {
        float na, nb;
        const float la = cpu_arch_train_step(&mlp_cpu_arch, &model, d, m, v, t, &na);
        const float lb = cpu_arch_train_step(&mlp_cpu_arch, &back, d, m2, v2, t, &nb);
        same &= la == lb && na == nb;
    }
    same &= memcmp(model.params_memory, back.params_memory, n * sizeof(float)) == 0;
    test_report(same, "save -> reload -> 3 steps is bit-identical to 3 steps in memory", "");
    remove_with_sum(saved);
    mlp_free(&model), mlp_free(&back);
    free(m), free(v), free(m2), free(v2);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--descriptors") == 0) {
        test_descriptors(argv[2]);
        return test_exit_code();
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.bin DEBUG_STATE.bin | --descriptors TMPDIR\n", argv[0]);
        return 2;
    }
    MlpModel model;
    ArchConfig ac;
    load(&model, &ac, argv[1], 0);
    DebugState d;
    read_debug_state(argv[2], &d, model.num_parameters);
    const ModelConfig *cfg = &model.cfg.base;
    test_report(d.V == cfg->vocab_size && d.L == cfg->num_layers && d.C == cfg->channels && d.F == cfg->ffn_hidden,
                "debug state matches the checkpoint's config", "");
    printf("config: L %d C %d F %d V %d, batch B %d T %d, %d steps\n", d.L, d.C, d.F, d.V, d.B, d.T, d.nsteps);

    char path[4200];
    snprintf(path, sizeof path, "%s.rewritten", argv[2]);
    mlp_arch.save(path, &ac, model.params_memory, model.num_parameters, 0);
    test_report(same_bytes(argv[1], path), "MLP checkpoint saved through mlp_arch is the reference's file byte for byte", "");
    remove_with_sum(path);

    check_debug_first_step(&mlp_cpu_arch, &model, &d);
    mlp_free(&model);
    test_trajectory(argv[1], &d);
    test_zero(argv[1], &d);
    test_decode(argv[1], d.x, d.T);
    if (argc == 4 && strcmp(argv[3], "--past-maxT") == 0) { /* (the script expects an error naming maxT) */
        load(&model, &ac, argv[1], 0);
        MlpKVCache cache;
        mlp_kvcache_init(&cache, &model, 8);
        for (int pos = 0; pos <= model.cfg.base.max_seq_len; pos += 8) mlp_forward_cached(&model, &cache, d.x, 8);
    }
    return test_exit_code();
}
