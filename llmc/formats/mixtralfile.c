/* mixtralfile.c - the Mixtral checkpoint file and its ModelArch entry (mixtralfile.h). */
#include "llmc/formats/mixtralfile.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/formats/hf.h"
#include "llmc/formats/llamafile.h"
#include "llmc/formats/llmcfile.h"
#include "llmc/formats/modelfile.h"

_Static_assert(sizeof(MixtralConfig) <= MODEL_ARCH_CONFIG_BYTES, "MixtralConfig fits an ArchConfig");

/* [24] E  [25] top-k  [26] output_router_logits  [27] router_aux_loss_coef; the Llama's knobs beside them */
static const LlmcHeaderField expert_fields[] = {
    {24, offsetof(MixtralConfig, num_experts)},
    {25, offsetof(MixtralConfig, top_k)},
    {26, offsetof(MixtralConfig, output_router_logits)},
    {27, offsetof(MixtralConfig, aux_coef)},
};
enum { NUM_EXPERT_FIELDS = sizeof expert_fields / sizeof expert_fields[0] };

static const MixtralConfig *mine(const ArchConfig *c) { return arch_config_as((ArchConfig *)c, MixtralConfig); }

/* the file (mixtralfile.h), read and written by llmcfile.h's llmc_file_* */
static const char *file_get(const int32_t h[256], ArchConfig *c) {
    MixtralConfig *m = arch_config_as(c, MixtralConfig);
    llama_header_get_knobs(h, &m->llama);
    llmc_header_get_fields(h, expert_fields, NUM_EXPERT_FIELDS, m);
    return h[11] != 0 && h[11] != 1 ? "tied (slot 11) must be 0 or 1" : NULL;
}
static void file_put(int32_t h[256], const ArchConfig *c) {
    llama_header_put_knobs(h, &mine(c)->llama);
    llmc_header_put_fields(h, expert_fields, NUM_EXPERT_FIELDS, mine(c));
}
static const LlmcFileKind mixtral_file = {&mixtral_arch, MIXTRAL_FILE_ARCH, file_get, file_put};

/* ---- the ModelArch entry ------------------------------------------------------------------ */

static int arch_config_from_init(const char *init, ArchConfig *c) {
    MixtralConfig cfg;
    if (mixtral_config_from_name(&cfg, init) == 0) return arch_config_named(c, &mixtral_arch, &cfg, sizeof cfg, init);
    if (strncmp(init, "mixtral:", 8) == 0)
        llmc_die("-e %s: not a Mixtral descriptor (mixtral:dN or mixtral:dN-eE-kK, N, E, K >= 1, K <= E <= %d)", init,
                 MIXTRAL_MAX_EXPERTS);
    if (llmc_file_config_from(&mixtral_file, init, c)) return 1;
    return hf_read_mixtral_config(init, &cfg) && arch_config_take(c, &mixtral_arch, &cfg, sizeof cfg);
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
    return llmc_file_load(&mixtral_file, init, params, n);
}

static uint32_t arch_save(const char *path, const ArchConfig *c, const float *params, size_t n, int bf16) {
    return llmc_file_write(&mixtral_file, path, c, params, n, bf16);
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
    MODEL_ARCH_FUNCTIONS,
};
