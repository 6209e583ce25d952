/* mixtralfile.c - the Mixtral checkpoint file and its ModelArch entry (mixtralfile.h). */
#include "llmc/formats/mixtralfile.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc/core/check.h"
#include "llmc/formats/hf.h"
#include "llmc/formats/modelfile.h"

_Static_assert(sizeof(MixtralConfig) <= MODEL_ARCH_CONFIG_BYTES, "MixtralConfig fits an ArchConfig");

enum { SLOT_DTYPE = 12, DTYPE_FP32 = 0, DTYPE_BF16 = 1, SLOT_E = 24, SLOT_K = 25, SLOT_ORL = 26, SLOT_COEF = 27 };

static float slot_f32(const int32_t *h, int i) {
    float v;
    memcpy(&v, &h[i], sizeof v);
    return v;
}

int mixtral_file_is_mine(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t w[3];
    size_t got = fread(w, sizeof w[0], 3, f);
    fclose(f);
    return got == 3 && w[0] == MIXTRAL_FILE_MAGIC && w[2] == MIXTRAL_FILE_ARCH;
}

static const char *header_problem(const int32_t *h, MixtralConfig *cfg) {
    if (h[0] != MIXTRAL_FILE_MAGIC) return "bad magic (expected 20261130, an llmc checkpoint)";
    if (h[1] != MIXTRAL_FILE_VERSION) return "unsupported version (expected 1)";
    if (h[2] != MIXTRAL_FILE_ARCH) return "not the Mixtral architecture (slot 2 must be 3)";
    memset(cfg, 0, sizeof *cfg);
    llmc_header_get_shape(h, &cfg->base);
    LlamaConfig *l = &cfg->llama;
    l->tied = h[11];
    l->norm_eps = slot_f32(h, 16), l->rope_theta = slot_f32(h, 17), l->rope_factor = slot_f32(h, 18);
    l->rope_low_freq_factor = slot_f32(h, 19), l->rope_high_freq_factor = slot_f32(h, 20);
    l->rope_original_max_pos = h[21];
    l->ffn_multiplier = slot_f32(h, 22), l->ffn_multiple_of = h[23];
    cfg->num_experts = h[SLOT_E], cfg->top_k = h[SLOT_K], cfg->output_router_logits = h[SLOT_ORL];
    cfg->aux_coef = slot_f32(h, SLOT_COEF);
    if (h[11] != 0 && h[11] != 1) return "tied (slot 11) must be 0 or 1";
    if (h[SLOT_DTYPE] != DTYPE_FP32 && h[SLOT_DTYPE] != DTYPE_BF16) return "dtype (slot 12) must be 0 (fp32) or 1 (bf16)";
    return mixtral_config_validate(cfg);
}

int mixtral_file_read_header(const char *path, MixtralConfig *cfg) {
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open Mixtral checkpoint '%s'", path);
    int32_t h[256];
    size_t got = fread(h, sizeof h[0], 256, f);
    fclose(f);
    if (got != 256) llmc_die("'%s': shorter than the 1024-byte Mixtral checkpoint header", path);
    const char *bad = header_problem(h, cfg);
    if (bad) llmc_die("'%s': invalid Mixtral checkpoint header: %s", path, bad);
    return h[SLOT_DTYPE] == DTYPE_BF16;
}

int mixtral_file_load(const char *path, float *params, size_t n) {
    MixtralConfig cfg;
    const int bf16 = mixtral_file_read_header(path, &cfg);
    TensorSpec specs[MIXTRAL_NUM_PARAMETERS];
    if (mixtral_parameter_specs(&cfg, specs) != n) llmc_die("Mixtral checkpoint '%s' does not match the model being loaded", path);
    model_file_read_params(path, 1024, params, n, bf16, specs, MIXTRAL_NUM_PARAMETERS);
    return bf16;
}

uint32_t mixtral_file_write(const char *path, const MixtralConfig *cfg, const float *params, size_t n, int bf16) {
    if (mixtral_parameter_specs(cfg, NULL) != n) llmc_die("mixtral_file_write: %zu parameters do not fit the config", n);
    _Static_assert(SLOT_DTYPE == 12 && DTYPE_FP32 == 0 && DTYPE_BF16 == 1, "llmc_header_put's dtype");
    int32_t h[256];
    const LlamaConfig *l = &cfg->llama;
    llmc_header_put(h, MIXTRAL_FILE_MAGIC, MIXTRAL_FILE_VERSION, MIXTRAL_FILE_ARCH, &cfg->base, l->tied, bf16);
    const float fs[] = {l->norm_eps, l->rope_theta, l->rope_factor, l->rope_low_freq_factor, l->rope_high_freq_factor};
    memcpy(&h[16], fs, sizeof fs);
    h[21] = l->rope_original_max_pos;
    memcpy(&h[22], &l->ffn_multiplier, sizeof(float));
    h[23] = l->ffn_multiple_of;
    h[SLOT_E] = cfg->num_experts, h[SLOT_K] = cfg->top_k, h[SLOT_ORL] = cfg->output_router_logits;
    memcpy(&h[SLOT_COEF], &cfg->aux_coef, sizeof(float));
    return model_file_write(path, h, sizeof h, params, n, bf16);
}

/* ---- the ModelArch entry ------------------------------------------------------------------ */

static const MixtralConfig *mine(const ArchConfig *c) { return arch_config_as((ArchConfig *)c, MixtralConfig); }

static int arch_config_from_init(const char *init, ArchConfig *c) {
    MixtralConfig cfg;
    if (mixtral_config_from_name(&cfg, init) == 0) {
        const char *bad = mixtral_config_validate(&cfg);
        if (bad) llmc_die("-e %s: invalid Mixtral configuration: %s", init, bad);
    } else if (strncmp(init, "mixtral:", 8) == 0) {
        llmc_die("-e %s: not a Mixtral descriptor (mixtral:dN or mixtral:dN-eE-kK, N, E, K >= 1, K <= E <= %d)", init,
                 MIXTRAL_MAX_EXPERTS);
    } else if (mixtral_file_is_mine(init)) {
        mixtral_file_read_header(init, &cfg);
    } else if (!hf_read_mixtral_config(init, &cfg)) {
        return 0;
    }
    memset(c, 0, sizeof *c);
    c->arch = &mixtral_arch;
    memcpy(&c->u, &cfg, sizeof cfg);
    return 1;
}

static const char *arch_config_validate(const ArchConfig *c) { return mixtral_config_validate(mine(c)); }

static void arch_config_print(const ArchConfig *c, FILE *out) {
    const MixtralConfig *m = mine(c);
    const ModelConfig *b = &m->base;
    fprintf(out, "Mixtral: L %d, NH %d, NKV %d, C %d, F %d, E %d, top-%d, maxT %d, V %d (Vp %d), %s head, eps %g, "
                 "theta %g, aux loss %s (coef %g); parameters %zu, %zu active\n",
            b->num_layers, b->num_heads, b->num_kv_heads, b->channels, b->ffn_hidden, m->num_experts, m->top_k,
            b->max_seq_len, b->vocab_size, b->padded_vocab_size, m->llama.tied ? "tied" : "untied",
            (double)m->llama.norm_eps, (double)m->llama.rope_theta, m->output_router_logits ? "on" : "off",
            (double)m->aux_coef, mixtral_parameter_specs(m, NULL), mixtral_active_parameters(m));
}

static size_t arch_parameter_specs(const ArchConfig *c, TensorSpec *specs) { return mixtral_parameter_specs(mine(c), specs); }

static size_t arch_activation_specs(const ArchConfig *c, int B, int T, int recompute, TensorSpec *specs) {
    (void)recompute;
    return mixtral_activation_specs(mine(c), B, T, specs);
}

static int arch_load_init(const char *init, const ArchConfig *c, float *params, size_t n, unsigned long long seed) {
    MixtralConfig named;
    if (mixtral_config_from_name(&named, init) == 0) {
        TensorSpec specs[MIXTRAL_NUM_PARAMETERS];
        if (mixtral_parameter_specs(mine(c), specs) != n) llmc_die("-e %s: %zu parameters do not fit the config", init, n);
        mixtral_init_parameters(mine(c), specs, params, seed);
        return 0;
    }
    if (hf_is_model_dir(init)) return hf_mixtral_load(init, mine(c), params, n);
    return mixtral_file_load(init, params, n);
}

static uint32_t arch_save(const char *path, const ArchConfig *c, const float *params, size_t n, int bf16) {
    return mixtral_file_write(path, mine(c), params, n, bf16);
}

static void arch_save_hf_checkpoint(const char *run_dir, int step, const ArchConfig *c, const float *params, size_t n,
                                    int bf16, const char *source) {
    hf_mixtral_save_checkpoint(run_dir, step, mine(c), params, n, bf16, source);
}

static void arch_save_hf(const char *dir, const ArchConfig *c, const float *params, size_t n, int bf16) {
    hf_mixtral_save(dir, mine(c), params, n, bf16);
}

static double arch_flops_per_token(const ArchConfig *c, int T) { return mixtral_flops_per_token(mine(c), T); }

const ModelArch mixtral_arch = {
    .name = "mixtral",
    .display = "Mixtral",
    .hf_architecture = "MixtralForCausalLM",
    .num_param_specs = MIXTRAL_NUM_PARAMETERS,
    .num_act_specs = MIXTRAL_NUM_ACTIVATIONS,
    .recompute_levels = 0,
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
