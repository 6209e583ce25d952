/* mlpfile.c - the MLP test architecture's checkpoint file and its ModelArch entry (mlpfile.h). */
#include "llmc/formats/mlpfile.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc/core/check.h"
#include "llmc/formats/modelfile.h"

_Static_assert(sizeof(MlpConfig) <= MODEL_ARCH_CONFIG_BYTES, "MlpConfig fits an ArchConfig");

enum { SLOT_DTYPE = 12, SLOT_EPS = 16, DTYPE_FP32 = 0, DTYPE_BF16 = 1 };

/* the first three header words of a regular file (0 when it cannot be read: a FIFO is never opened) */
static int read_words(const char *path, int32_t w[3]) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t got = fread(w, sizeof w[0], 3, f);
    fclose(f);
    return got == 3;
}

int mlp_file_is_mine(const char *path) {
    int32_t w[3];
    return read_words(path, w) && w[0] == MLP_FILE_MAGIC && w[2] == MLP_FILE_ARCH;
}

/* what is wrong with header h (NULL: nothing); cfg filled from it */
static const char *header_problem(const int32_t *h, MlpConfig *cfg) {
    if (h[0] != MLP_FILE_MAGIC) return "bad magic (expected 20261130, an llmc checkpoint)";
    if (h[1] != MLP_FILE_VERSION) return "unsupported version (expected 1)";
    if (h[2] != MLP_FILE_ARCH) return "not the MLP architecture (slot 2 must be 2)";
    memset(cfg, 0, sizeof *cfg);
    llmc_header_get_shape(h, &cfg->base);
    memcpy(&cfg->norm_eps, &h[SLOT_EPS], sizeof(float));
    if (h[11] != 1) return "tied (slot 11) must be 1: the MLP's head is wte";
    if (h[SLOT_DTYPE] != DTYPE_FP32 && h[SLOT_DTYPE] != DTYPE_BF16) return "dtype (slot 12) must be 0 (fp32) or 1 (bf16)";
    return mlp_config_validate(cfg);
}

int mlp_file_read_header(const char *path, MlpConfig *cfg) {
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open MLP checkpoint '%s'", path);
    int32_t h[256];
    size_t got = fread(h, sizeof h[0], 256, f);
    fclose(f);
    if (got != 256) llmc_die("'%s': shorter than the 1024-byte MLP checkpoint header", path);
    const char *bad = header_problem(h, cfg);
    if (bad) llmc_die("'%s': invalid MLP checkpoint header: %s", path, bad);
    return h[SLOT_DTYPE] == DTYPE_BF16;
}

int mlp_file_load(const char *path, float *params, size_t n) {
    MlpConfig cfg;
    const int bf16 = mlp_file_read_header(path, &cfg);
    TensorSpec specs[MLP_NUM_PARAMETERS];
    if (mlp_parameter_specs(&cfg, specs) != n) llmc_die("MLP checkpoint '%s' does not match the model being loaded", path);
    model_file_read_params(path, MLP_FILE_HEADER_BYTES, params, n, bf16, specs, MLP_NUM_PARAMETERS);
    return bf16;
}

uint32_t mlp_file_write(const char *path, const MlpConfig *cfg, const float *params, size_t n, int bf16) {
    if (mlp_parameter_specs(cfg, NULL) != n) llmc_die("mlp_file_write: %zu parameters do not fit the config", n);
    _Static_assert(SLOT_DTYPE == 12 && DTYPE_FP32 == 0 && DTYPE_BF16 == 1, "llmc_header_put's dtype");
    int32_t h[256];
    llmc_header_put(h, MLP_FILE_MAGIC, MLP_FILE_VERSION, MLP_FILE_ARCH, &cfg->base, 1, bf16);
    memcpy(&h[SLOT_EPS], &cfg->norm_eps, sizeof(float));
    return model_file_write(path, h, sizeof h, params, n, bf16);
}

/* ---- the ModelArch entry ------------------------------------------------------------------ */

static const MlpConfig *mine(const ArchConfig *c) { return arch_config_as((ArchConfig *)c, MlpConfig); }

static int arch_config_from_init(const char *init, ArchConfig *c) {
    MlpConfig cfg;
    if (mlp_config_from_name(&cfg, init) == 0) {
        const char *bad = mlp_config_validate(&cfg);
        if (bad) llmc_die("-e %s: invalid MLP configuration: %s", init, bad);
    } else if (mlp_file_is_mine(init)) {
        mlp_file_read_header(init, &cfg);
    } else {
        return 0;
    }
    memset(c, 0, sizeof *c);
    c->arch = &mlp_arch;
    memcpy(&c->u, &cfg, sizeof cfg);
    return 1;
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
    return mlp_file_load(init, params, n);
}

static uint32_t arch_save(const char *path, const ArchConfig *c, const float *params, size_t n, int bf16) {
    return mlp_file_write(path, mine(c), params, n, bf16);
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
    .config_from_init = arch_config_from_init,
    .config_validate = arch_config_validate,
    .config_print = arch_config_print,
    .parameter_specs = arch_parameter_specs,
    .activation_specs = arch_activation_specs,
    .load_init = arch_load_init,
    .save = arch_save,
    .save_hf_checkpoint = arch_save_hf_checkpoint,
    .save_hf = arch_save_hf,
    .flops_per_token = arch_flops_per_token,
};
