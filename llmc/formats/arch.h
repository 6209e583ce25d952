/*
 * arch.h - the architecture table: what each model architecture (GPT-2, Llama 3, ...) is, asked
 * by every consumer instead of testing "is -e a Llama?". One ModelArch per architecture, one
 * registry (model_archs[] in arch.c) in recognition order; docs/ARCHITECTURES.md has the steps.
 *
 * A ModelArch says, for its architecture: how -e names it (a descriptor such as d4, gpt2:d4 or
 * llama3:d1, a released name, a file magic, an HF config.json "architectures" entry), its
 * configuration (read, checked, printed), its parameter and activation tables, how its
 * parameters are loaded and saved (its own checkpoint file, the HF directory beside a checkpoint),
 * and its training flops per token. The per-backend pieces (block sequences, KV caches, CUDA
 * kernels) are not here: llmc/cpu/arch.h holds the CPU backend's table (CpuArch, cpu_arch_for),
 * llmc/cuda/arch.cuh the CUDA runtime's (CudaArch, cuda_arch_for in llmc/cuda/archs.cuh).
 *
 * ArchConfig holds the architecture's own configuration struct in place. Every such struct
 * starts with a ModelConfig (the shared shape: maxT, V, Vp, L, NH, NKV, C, F), so
 * arch_config_base() is valid for any architecture; the architecture's code reads its full
 * struct through arch_config_as (GPT-2's is the ModelConfig alone, Llama's a LlamaConfig).
 */
#ifndef LLMC_FORMATS_ARCH_H
#define LLMC_FORMATS_ARCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "llmc/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ModelArch;

/* The bytes an architecture's config struct may take (checked by a static assertion beside it). */
enum { MODEL_ARCH_CONFIG_BYTES = 256 };

typedef struct {
    const struct ModelArch *arch;
    union {
        ModelConfig base; /* the first member of every architecture's config struct */
        unsigned char bytes[MODEL_ARCH_CONFIG_BYTES];
        double align;
    } u;
} ArchConfig;

static inline ModelConfig *arch_config_base(ArchConfig *c) { return &c->u.base; }
static inline const ModelConfig *arch_config_cbase(const ArchConfig *c) { return &c->u.base; }
/* The architecture's own struct (e.g. arch_config_as(c, LlamaConfig)). */
#define arch_config_as(c, type) ((type *)(void *)&(c)->u)

typedef struct ModelArch {
    const char *name;             /* "gpt2", "llama3": the -e descriptor prefix ("llama3:d1") */
    const char *display;          /* "GPT-2", "Llama 3": for logs and errors */
    const char *hf_architecture;  /* config.json's "architectures" entry ("LlamaForCausalLM"), or NULL */
    int num_param_specs;          /* entries of its parameter table */
    int num_act_specs;            /* entries of its activation table */
    int recompute_levels;         /* 1: its activation table has -r levels; 0: every activation is
                                   * stored and the trainers run -r 0 (the resume check knows) */

    /* -e: returns 1 and fills cfg (cfg->arch set; only a header or config.json read, no
     * parameters) when init names this architecture, 0 when it does not. Dies on a file of this
     * architecture with a bad header, naming the file. The last registry entry is the fallback:
     * it takes every init and its reader reports what is wrong with it. */
    int (*config_from_init)(const char *init, ArchConfig *cfg);
    /* NULL, or what is wrong with cfg (a message). */
    const char *(*config_validate)(const ArchConfig *cfg);
    /* One line of the shape (L, NH, NKV, C, F, maxT, V and the architecture's own knobs). */
    void (*config_print)(const ArchConfig *cfg, FILE *out);

    /* The tables for cfg (specs may be NULL); return the total element counts. The activation
     * table is at recompute level `recompute` (architectures without recompute levels ignore it). */
    size_t (*parameter_specs)(const ArchConfig *cfg, TensorSpec *specs);
    size_t (*activation_specs)(const ArchConfig *cfg, int B, int T, int recompute, TensorSpec *specs);

    /* The parameters for init (cfg from config_from_init(init)): random by the table's rules for
     * a descriptor or name (seed), else the file's or HF directory's, verified (size, "<path>.sum",
     * finite). n: parameter_specs' total. Returns 1 when the stored weights were bf16, else 0. */
    int (*load_init)(const char *init, const ArchConfig *cfg, float *params, size_t n, unsigned long long seed);
    /* Writes params as the architecture's checkpoint file at path (fp32, or bf16 rounded to
     * nearest even), atomically, with "<path>.sum"; returns the file's CRC-32. */
    uint32_t (*save)(const char *path, const ArchConfig *cfg, const float *params, size_t n, int bf16);
    /* --save-hf 1: the HF directory beside checkpoint step of run_dir (source: the run's -e, whose
     * tokenizer files an architecture may copy). */
    void (*save_hf_checkpoint)(const char *run_dir, int step, const ArchConfig *cfg, const float *params, size_t n,
                               int bf16, const char *source);
    /* ./hf_convert: the HF directory dir (atomically; F32 or BF16). */
    void (*save_hf)(const char *dir, const ArchConfig *cfg, const float *params, size_t n, int bf16);

    /* Training flops per token at sequence length T (6N + 6LCT): the basis of GFLOP/s and MFU. */
    double (*flops_per_token)(const ArchConfig *cfg, int T);
} ModelArch;

/* An entry's functions when its file defines them as static arch_<member> (arch_config_from_init,
 * arch_config_validate, ..., arch_save_hf, arch_flops_per_token): mlpfile.c's, mixtralfile.c's. */
#define MODEL_ARCH_FUNCTIONS                                                                                       \
    .config_from_init = arch_config_from_init, .config_validate = arch_config_validate,                           \
    .config_print = arch_config_print, .parameter_specs = arch_parameter_specs,                                   \
    .activation_specs = arch_activation_specs, .load_init = arch_load_init, .save = arch_save,                     \
    .save_hf_checkpoint = arch_save_hf_checkpoint, .save_hf = arch_save_hf, .flops_per_token = arch_flops_per_token

/* c as architecture a's config cfg (bytes long, at most MODEL_ARCH_CONFIG_BYTES), the rest zero; returns 1
 * (a config_from_init that took its init). */
static inline int arch_config_take(ArchConfig *c, const ModelArch *a, const void *cfg, size_t bytes) {
    memset(c, 0, sizeof *c);
    c->arch = a;
    memcpy(&c->u, cfg, bytes);
    return 1;
}

/* A config_from_init's named descriptor: cfg taken as a's config (arch_config_take) and checked by
 * a->config_validate (dies "-e <init>: invalid <display> configuration: ..."); returns 1. */
int arch_config_named(ArchConfig *c, const ModelArch *a, const void *cfg, size_t bytes, const char *init);

/* The registry, in recognition order, ending with NULL (GPT-2 last: the fallback). */
extern const ModelArch *const model_archs[];

/* The architecture -e names, with its config filled (header only). Dies when no entry takes it
 * (never with the GPT-2 fallback registered). */
const ModelArch *model_arch_for_init(const char *init, ArchConfig *cfg);
/* The architecture init names explicitly - a descriptor or name, a file magic, an HF directory of
 * an entry before the fallback - with its config filled (header only); NULL when none does (then
 * init is the fallback's, GPT-2's, or a path not yet resolved, such as a run directory that -y 1
 * resolves later: only model_arch_for_init on the resolved path is sure). */
const ModelArch *model_arch_explicit(const char *init, ArchConfig *cfg);
/* The entry of that name ("gpt2", "llama3"), or NULL. */
const ModelArch *model_arch_by_name(const char *name);

/* The registry's entries (defined beside each architecture's code). */
extern const ModelArch gpt2_arch;
extern const ModelArch llama3_arch;
extern const ModelArch mlp_arch;
extern const ModelArch mixtral_arch;

#ifdef __cplusplus
}
#endif
#endif
