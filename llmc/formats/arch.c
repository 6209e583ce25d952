/*
 * arch.c - the architecture registry (arch.h): GPT-2's and Llama 3's entries, and what -e names.
 * Each entry's functions are thin: the work is in models/ (tables, config), modelfile.c,
 * llamafile.c and hf.c (files).
 */
#include "llmc/formats/arch.h"
#include "llmc/core/check.h"
#include "llmc/formats/hf.h"
#include "llmc/formats/llamafile.h"
#include "llmc/formats/modelfile.h"
#include "llmc/formats/rundir.h"
#include "llmc/models/gpt2.h"
#include "llmc/models/llama.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* the magic of a regular file (0 when it cannot be read or is not a regular file: a FIFO is never
 * opened here, the GPT-2 reader refuses it with its message) */
static int32_t file_magic(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t magic = 0;
    if (fread(&magic, sizeof magic, 1, f) != 1) magic = 0;
    fclose(f);
    return magic;
}

/* ---- GPT-2: a dN / gpt2:dN descriptor, llm.c's model file, an HF GPT2LMHeadModel directory --- */

/* The fallback: every init that no other entry takes is GPT-2's, and its reader says what is
 * wrong with it (a directory that is no HF directory, a bad magic, a missing file). */
static int gpt2_from_init(const char *path, ArchConfig *ac) {
    memset(ac, 0, sizeof *ac);
    ac->arch = &gpt2_arch;
    ModelConfig *cfg = arch_config_base(ac);
    if (model_config_from_descriptor(cfg, path) == 0) {
        const char *bad = gpt2_config_validate(cfg);
        if (bad) llmc_die("invalid model configuration: %s", bad);
        return 1;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (hf_is_model_dir(path)) { /* a Hugging Face model directory (hf.h) */
            hf_read_config(path, cfg);
            return 1;
        }
        /* (the trainer says how to continue a run directory first: train_check_init) */
        int step = checkpoint_latest_step(path);
        char hint[1200] = "";
        if (step >= 0) snprintf(hint, sizeof hint, ", such as its latest complete checkpoint '%s/model_%08d.bin'", path, step);
        llmc_die("model checkpoint '%s' is a directory, not a model file (nor a Hugging Face directory: it has no "
                 "config.json): give a model file%s", path, hint);
    }
    int version;
    model_file_read_header(path, cfg, &version);
    return 1;
}

static const char *gpt2_validate(const ArchConfig *ac) { return gpt2_config_validate(arch_config_cbase(ac)); }

static void gpt2_print(const ArchConfig *ac, FILE *out) {
    const ModelConfig *c = arch_config_cbase(ac);
    fprintf(out, "GPT-2: L %d, NH %d, C %d, maxT %d, V %d (Vp %d)\n", c->num_layers, c->num_heads, c->channels,
            c->max_seq_len, c->vocab_size, c->padded_vocab_size);
}

static size_t gpt2_params(const ArchConfig *ac, TensorSpec *specs) { return gpt2_parameter_specs(arch_config_cbase(ac), specs); }
static size_t gpt2_acts(const ArchConfig *ac, int B, int T, int recompute, TensorSpec *specs) {
    return gpt2_activation_specs(arch_config_cbase(ac), B, T, recompute, specs);
}

static int gpt2_load(const char *init, const ArchConfig *ac, float *params, size_t n, unsigned long long seed) {
    const ModelConfig *cfg = arch_config_cbase(ac);
    ModelConfig named;
    if (model_config_from_descriptor(&named, init) == 0) {
        TensorSpec specs[NUM_PARAMETER_TENSORS];
        gpt2_parameter_specs(cfg, specs);
        gpt2_init_parameters(cfg, specs, params, seed);
        return 0;
    }
    if (hf_is_model_dir(init)) return hf_load(init, params, n);
    ModelConfig file_cfg;
    int version;
    model_file_read_header(init, &file_cfg, &version);
    model_file_load(init, params, n);
    return version == MODEL_VERSION_BF16;
}

static uint32_t gpt2_save(const char *path, const ArchConfig *ac, const float *params, size_t n, int bf16) {
    return model_file_save(path, arch_config_cbase(ac), params, n, bf16 ? MODEL_VERSION_BF16 : MODEL_VERSION_FP32);
}

static void gpt2_save_hf_ckpt(const char *run_dir, int step, const ArchConfig *ac, const float *params, size_t n, int bf16,
                              const char *source) {
    hf_save_checkpoint(run_dir, step, arch_config_cbase(ac), params, n, bf16, source);
}

static void gpt2_save_hf(const char *dir, const ArchConfig *ac, const float *params, size_t n, int bf16) {
    hf_save(dir, arch_config_cbase(ac), params, n, bf16);
}

static double gpt2_flops(const ArchConfig *ac, int T) { return gpt2_flops_per_token(arch_config_cbase(ac), T); }

const ModelArch gpt2_arch = {
    "gpt2", "GPT-2", "GPT2LMHeadModel", NUM_PARAMETER_TENSORS, NUM_ACTIVATION_TENSORS, 1,
    gpt2_from_init, gpt2_validate, gpt2_print, gpt2_params, gpt2_acts,
    gpt2_load, gpt2_save, gpt2_save_hf_ckpt, gpt2_save_hf, gpt2_flops,
};

/* ---- Llama 3: a name (llama3:dN, llama3.2-1b, ...), llmc's or llm.c's file, an HF directory --- */
_Static_assert(sizeof(LlamaConfig) <= MODEL_ARCH_CONFIG_BYTES, "LlamaConfig must fit ArchConfig");
#define LLAMA(ac) arch_config_as(ac, const LlamaConfig)

static int llama3_from_init(const char *init, ArchConfig *ac) {
    memset(ac, 0, sizeof *ac);
    LlamaConfig *cfg = arch_config_as(ac, LlamaConfig);
    if (llama_config_from_name(cfg, init) == 0) {
        const char *bad = llama_config_validate(cfg);
        if (bad) llmc_die("-e %s: invalid Llama configuration: %s", init, bad);
    } else if (!hf_read_llama_config(init, cfg)) { /* not a Hugging Face LlamaForCausalLM directory */
        int32_t magic = file_magic(init);
        int version;
        if (magic == LLAMA_FILE_MAGIC) llama_file_read_header(init, cfg);
        else if (magic == LLMC_LLAMA3_MAGIC) llmc_llama3_read_header(init, cfg, &version);
        else return 0;
    }
    ac->arch = &llama3_arch;
    return 1;
}

static const char *llama3_validate(const ArchConfig *ac) { return llama_config_validate(LLAMA(ac)); }

static void llama3_print(const ArchConfig *ac, FILE *out) {
    const LlamaConfig *l = LLAMA(ac);
    const ModelConfig *c = &l->base;
    fprintf(out, "Llama 3: L %d, NH %d, NKV %d, C %d, F %d, maxT %d, V %d (Vp %d), %s head, eps %g, theta %g\n",
            c->num_layers, c->num_heads, c->num_kv_heads, c->channels, c->ffn_hidden, c->max_seq_len, c->vocab_size,
            c->padded_vocab_size, l->tied ? "tied" : "untied", (double)l->norm_eps, (double)l->rope_theta);
}

static size_t llama3_params(const ArchConfig *ac, TensorSpec *specs) { return llama_parameter_specs(LLAMA(ac), specs); }
static size_t llama3_acts(const ArchConfig *ac, int B, int T, int recompute, TensorSpec *specs) {
    return llama_activation_specs(LLAMA(ac), B, T, recompute, specs);
}

static int llama3_load(const char *init, const ArchConfig *ac, float *params, size_t n, unsigned long long seed) {
    const LlamaConfig *cfg = LLAMA(ac);
    LlamaConfig named;
    if (llama_config_from_name(&named, init) == 0) {
        TensorSpec specs[LLAMA3_NUM_PARAMETERS];
        llama_parameter_specs(cfg, specs);
        llama_init_parameters(cfg, specs, params, seed);
        return 0;
    }
    if (hf_is_model_dir(init)) return hf_llama_load(init, cfg, params, n);
    if (file_magic(init) == LLAMA_FILE_MAGIC) {
        llama_file_load(init, params, n);
        return llama_file_is_bf16(init);
    }
    LlamaConfig file_cfg;
    int version;
    llmc_llama3_read_header(init, &file_cfg, &version);
    llmc_llama3_load(init, cfg, params, n);
    return version == 5;
}

static uint32_t llama3_save(const char *path, const ArchConfig *ac, const float *params, size_t n, int bf16) {
    return llama_checkpoint_write(path, LLAMA(ac), params, n, bf16);
}

static void llama3_save_hf_ckpt(const char *run_dir, int step, const ArchConfig *ac, const float *params, size_t n,
                                int bf16, const char *source) {
    hf_llama_save_checkpoint(run_dir, step, LLAMA(ac), params, n, bf16, source);
}

static void llama3_save_hf(const char *dir, const ArchConfig *ac, const float *params, size_t n, int bf16) {
    hf_llama_save(dir, LLAMA(ac), params, n, bf16);
}

static double llama3_flops(const ArchConfig *ac, int T) { return llama_flops_per_token(LLAMA(ac), T); }

const ModelArch llama3_arch = {
    "llama3", "Llama 3", "LlamaForCausalLM", LLAMA3_NUM_PARAMETERS, LLAMA3_NUM_ACTIVATIONS, 1,
    llama3_from_init, llama3_validate, llama3_print, llama3_params, llama3_acts,
    llama3_load, llama3_save, llama3_save_hf_ckpt, llama3_save_hf, llama3_flops,
};

int arch_config_named(ArchConfig *c, const ModelArch *a, const void *cfg, size_t bytes, const char *init) {
    arch_config_take(c, a, cfg, bytes);
    const char *bad = a->config_validate(c);
    if (bad) llmc_die("-e %s: invalid %s configuration: %s", init, a->display, bad);
    return 1;
}

/* ---- the registry ------------------------------------------------------------------------- */
/* mlp before the Llama: they share the file magic, and the Llama reader refuses the MLP's id */
/* mixtral before the Llama too: its file shares the magic (architecture 3), its HF directory is not a Llama's */
const ModelArch *const model_archs[] = {&mlp_arch, &mixtral_arch, &llama3_arch, &gpt2_arch, NULL};

const ModelArch *model_arch_for_init(const char *init, ArchConfig *cfg) {
    for (int i = 0; model_archs[i]; i++)
        if (model_archs[i]->config_from_init(init, cfg)) return model_archs[i];
    llmc_die("-e %s: no architecture recognises it", init);
}

const ModelArch *model_arch_explicit(const char *init, ArchConfig *cfg) {
    for (int i = 0; model_archs[i] && model_archs[i + 1]; i++) /* (the last: the fallback) */
        if (model_archs[i]->config_from_init(init, cfg)) return model_archs[i];
    return NULL;
}

const ModelArch *model_arch_by_name(const char *name) {
    for (int i = 0; model_archs[i]; i++)
        if (strcmp(model_archs[i]->name, name) == 0) return model_archs[i];
    return NULL;
}
