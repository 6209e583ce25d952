/* mlpfile.c - the MLP test architecture's checkpoint file and its ModelArch entry (mlpfile.h). */
#include "llmc/formats/mlpfile.h"

#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/formats/llmcfile.h"
#include "llmc/formats/modelfile.h"

_Static_assert(sizeof(MlpConfig) <= MODEL_ARCH_CONFIG_BYTES, "MlpConfig fits an ArchConfig");

enum { SLOT_EPS = 16 };

static const MlpConfig *mine(const ArchConfig *c) { return arch_config_as((ArchConfig *)c, MlpConfig); }

/* the file (mlpfile.h), read and written by llmcfile.h's llmc_file_*: [11] tied = 1, [16] eps */
static const char *file_get(const int32_t h[256], ArchConfig *c) {
    memcpy(&arch_config_as(c, MlpConfig)->norm_eps, &h[SLOT_EPS], sizeof(float));
    return h[11] != 1 ? "tied (slot 11) must be 1: the MLP's head is wte" : NULL;
}
static void file_put(int32_t h[256], const ArchConfig *c) {
    h[11] = 1;
    memcpy(&h[SLOT_EPS], &mine(c)->norm_eps, sizeof(float));
}
static const LlmcFileKind mlp_file = {&mlp_arch, MLP_FILE_ARCH, file_get, file_put};

/* ---- the ModelArch entry ------------------------------------------------------------------ */

static int arch_config_from_init(const char *init, ArchConfig *c) {
    MlpConfig cfg;
    if (mlp_config_from_name(&cfg, init) == 0) return arch_config_named(c, &mlp_arch, &cfg, sizeof cfg, init);
    return llmc_file_config_from(&mlp_file, init, c);
}

static const char *arch_config_validate(const ArchConfig *c) { return mlp_config_validate(mine(c)); }

static void arch_config_print(const ArchConfig *c, FILE *out) {
    const MlpConfig *cfg = mine(c);
    const ModelConfig *b = &cfg->base;
    fprintf(out, "MLP: L %d, C %d, F %d, maxT %d, V %d (padded %d), norm eps %g, head tied to wte\n", b->num_layers,
            b->channels, b->ffn_hidden, b->max_seq_len, b->vocab_size, b->padded_vocab_size, (double)cfg->norm_eps);
}

static size_t arch_parameter_specs(const ArchConfig *c, TensorSpec *specs) { return mlp_parameter_specs(mine(c), specs); }

static size_t arch_activation_specs(const ArchConfig *c, int B, int T, int recompute, TensorSpec *specs) {
    (void)recompute; /* no recompute levels: every activation is stored */
    return mlp_activation_specs(mine(c), B, T, specs);
}

static int arch_load_init(const char *init, const ArchConfig *c, float *params, size_t n, unsigned long long seed) {
    MlpConfig named;
    if (mlp_config_from_name(&named, init) == 0) {
        if (mlp_parameter_specs(mine(c), NULL) != n) llmc_die("-e %s: %zu parameters do not fit the config", init, n);
        mlp_init_parameters(mine(c), params, seed);
        return 0;
    }
    return llmc_file_load(&mlp_file, init, params, n);
}

static uint32_t arch_save(const char *path, const ArchConfig *c, const float *params, size_t n, int bf16) {
    return llmc_file_write(&mlp_file, path, c, params, n, bf16);
}

/* --save-hf 1 and ./hf_convert: this architecture has no Hugging Face format */
static LLMC_NORETURN void no_hf(const char *what, const char *path) {
    llmc_die("%s '%s': no Hugging Face format for mlp", what, path);
}
static void arch_save_hf_checkpoint(const char *run_dir, int step, const ArchConfig *c, const float *params, size_t n,
                                    int bf16, const char *source) {
    (void)step, (void)c, (void)params, (void)n, (void)bf16, (void)source;
    no_hf("--save-hf 1 in run directory", run_dir);
}
static void arch_save_hf(const char *dir, const ArchConfig *c, const float *params, size_t n, int bf16) {
    (void)c, (void)params, (void)n, (void)bf16;
    no_hf("cannot write", dir);
}

static double arch_flops_per_token(const ArchConfig *c, int T) { return mlp_flops_per_token(mine(c), T); }

const ModelArch mlp_arch = {
    .name = "mlp",
    .display = "MLP",
    .hf_architecture = NULL,
    .num_param_specs = MLP_NUM_PARAMETERS,
    .num_act_specs = MLP_NUM_ACTIVATIONS,
    MODEL_ARCH_FUNCTIONS,
};
