/*
 * test_llama_cpu.c - the CPU Llama model (llmc/cpu/llama.c) against the PyTorch reference
 * (dev/reference/train_llama3.py), and the Llama tables and checkpoint header.
 *
 * usage: test_llama_cpu MODEL.bin DEBUG_STATE.bin   (files from train_llama3.py)
 *        test_llama_cpu --shapes                     (the released models' sizes, no allocation)
 * Checks, as test_gpt2_cpu.c does for GPT-2 (same tolerances, same reasons): logits, loss, every
 * gradient tensor, a 10-step loss/grad-norm trajectory under the reference's AdamW and the
 * parameters after it; and that writing the loaded model back gives the reference's file byte
 * for byte (the header records NKV, F, eps, RoPE theta and scaling).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/formats/llamafile.h"
#include "llmc/formats/modelfile.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/llama.h"
#include "test/cpu_arch_checks.h"
#include "test/debug_state.h"
#include "test/testing.h"

static void load(LlamaModel *m, const char *path) {
    LlamaConfig cfg;
    llama_file_read_header(path, &cfg);
    llama_build(m, &cfg);
    llama_file_load(path, m->params_memory, m->num_parameters);
}

/* The released shapes by name: F from ffn_dim_multiplier/multiple_of and the parameter counts
 * published with the models (1B and 3B tie the head to wte; 8B does not). */
static void test_shapes(void) {
    static const struct { const char *name; int F; size_t params; } known[] = {
        {"llama3.2-1b", 8192, 1235814400}, {"llama3.2-3b", 8192, 3212749824}, {"llama3.1-8b", 14336, 8030261248}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        LlamaConfig cfg;
        int rc = llama_config_from_name(&cfg, known[i].name);
        size_t n = rc == 0 ? llama_parameter_specs(&cfg, NULL) : 0;
        const char *bad = rc == 0 ? llama_config_validate(&cfg) : "not a name";
        printf("%s: L %d C %d NH %d NKV %d F %d V %d tied %d: %zu parameters (%.2f GiB in fp32)\n", known[i].name,
               cfg.base.num_layers, cfg.base.channels, cfg.base.num_heads, cfg.base.num_kv_heads, cfg.base.ffn_hidden,
               cfg.base.vocab_size, cfg.tied, n, n * 4.0 / (1 << 30));
        test_report(!bad && cfg.base.ffn_hidden == known[i].F && n == known[i].params, known[i].name,
                    "F %d (expected %d), %zu parameters (expected %zu)%s%s", cfg.base.ffn_hidden, known[i].F, n,
                    known[i].params, bad ? ": " : "", bad ? bad : "");
    }
    LlamaConfig d;
    int rc = llama_config_from_name(&d, "llama3:d8");
    test_report(rc == 0 && !llama_config_validate(&d) && d.base.channels == 512 && d.base.num_heads == 8 &&
                    d.base.num_kv_heads == 2 && !d.tied,
                "llama3:d8 is C 512, NH 8, NKV 2, untied", "C %d NH %d NKV %d", d.base.channels, d.base.num_heads,
                d.base.num_kv_heads);
    test_report(llama_config_from_name(&d, "llama3:x") == -1 && llama_config_from_name(&d, "llama4-1b") == -1,
                "unknown Llama names are refused", "");
}

/* ./generate's KV-cache forward (llama_forward_cached) against the full forward: the first
 * sequence of the batch fed in chunks of 1, 2, 3, ... tokens gives the full forward's logits at
 * every position (RoPE at the cache's position, NKV key/value heads cached per group). */
static void test_decode(const char *path, const int *tokens, int T) {
    LlamaModel model;
    load(&model, path);
    llama_allocate_for(&model, 1, T, 0, 0);
    void *cache = check_cached_decode(&llama3_cpu_arch, &model, tokens, T,
                                      "KV-cache decode (chunks of 1..8 tokens) equals the full forward's logits");
    llama3_cpu_arch.kvcache_free(cache);
    free(cache);
    llama_free(&model);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--shapes") == 0) {
        test_shapes();
        return test_exit_code();
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.bin DEBUG_STATE.bin | --shapes\n", argv[0]);
        return 2;
    }
    LlamaModel model;
    load(&model, argv[1]);
    DebugState d;
    read_debug_state(argv[2], &d, model.num_parameters);
    const ModelConfig *cfg = &model.cfg.base;
    test_report(d.V == cfg->vocab_size && d.L == cfg->num_layers && d.C == cfg->channels && d.NH == cfg->num_heads &&
                    d.NKV == cfg->num_kv_heads && d.F == cfg->ffn_hidden,
                "debug state matches the checkpoint's config", "");
    printf("config: L %d NH %d NKV %d C %d F %d V %d, batch B %d T %d, %d steps, theta %g, rope factor %g\n", d.L,
           d.NH, d.NKV, d.C, d.F, d.V, d.B, d.T, d.nsteps, model.cfg.rope_theta, model.cfg.rope_factor);

    /* the header round trip: the loaded model written back is the reference's file */
    char path[4200];
    snprintf(path, sizeof path, "%s.rewritten", argv[2]);
    llama_checkpoint_save(path, &model.cfg, model.params_memory, model.num_parameters);
    FILE *a = fopenCheck(argv[1], "rb"), *b = fopenCheck(path, "rb");
    int same = 1, ca, cb;
    do {
        ca = fgetc(a), cb = fgetc(b);
        same &= ca == cb;
    } while (ca != EOF && cb != EOF);
    fclose(a), fclose(b), remove(path);
    char sum[4300];
    sumfile_path(path, sum, sizeof sum);
    remove(sum);
    test_report(same, "Llama checkpoint written back is byte-identical (header: arch, NKV, F, eps, RoPE)", "");

    check_debug_first_step(&llama3_cpu_arch, &model, &d);
    const int B = d.B, T = d.T;

    /* the N-step trajectory on the same batch, with the reference's AdamW settings */
    llama_free(&model);
    load(&model, argv[1]);
    llama_allocate(&model, B, T);
    const size_t n = model.num_parameters;
    float *m = (float *)callocCheck(n, sizeof(float), "m"), *v = (float *)callocCheck(n, sizeof(float), "v");
    int traj_ok = 1;
    for (int step = 0; step < d.nsteps; step++) {
        memset(model.grads_memory, 0, n * sizeof(float));
        float l = llama_forward(&model, d.x, d.y, B, T, 1.0f / (B * T));
        llama_backward(&model, d.x, B, T);
        float norm = (float)sqrt(global_norm_squared(model.grads_memory, n));
        float scale = d.grad_clip > 0 && norm > d.grad_clip ? d.grad_clip / norm : 1.0f;
        for (int i = 0; i < LLAMA3_NUM_PARAMETERS; i++) {
            const TensorSpec *s = &model.param_specs[i];
            adamw_update(model.params_memory + s->offset, model.grads_memory + s->offset, m + s->offset, v + s->offset,
                         s->numel, d.lr, d.beta1, d.beta2, d.eps, s->decay ? d.weight_decay : 0.0f, step + 1, scale);
        }
        traj_ok &= check_debug_step(&d, step, l, norm);
    }
    test_report(traj_ok, "10-step loss and grad-norm trajectory", "see the steps above");
    test_close("parameters after the trajectory", model.params_memory, d.params_after, n, 1e-5, 1e-4);
    llama_free(&model);
    test_decode(argv[1], d.x, T);
    free(m), free(v);
    return test_exit_code();
}
