/*
 * generate.c - ./generate: continue a prompt with a trained model on the CPU (fp32), through
 * the KV-cache forward of llmc/cpu/decode.h. Flags, prompt, sampling and output are the front
 * end's (llmc/generate/generate.c), shared with ./generate_gpu (generate.cu).
 *
 *   ./generate -e out/run1/model_00005000.bin --prompt "The king" -g 100 --temperature 0.8
 */
#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/blas_select.h"
#include "llmc/cpu/decode.h"
#include "llmc/cpu/llama.h"
#include "llmc/cpu/gpt2.h"
#include "llmc/formats/arch.h"
#include "llmc/generate/generate.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

/* The CPU generator for each architecture (formats/arch.h's registry): load (build, parameters
 * from -e, the KV cache), the cached forward (logits of the last of n new tokens), free. */
typedef struct CpuGenerator CpuGenerator;
typedef struct {
    const ModelArch *arch;
    void (*load)(CpuGenerator *cg, const GenConfig *g, char *desc, size_t len);
    const float *(*forward)(CpuGenerator *cg, const int *tokens, int n);
    void (*free)(CpuGenerator *cg);
} CpuGenArch;

struct CpuGenerator {
    const CpuGenArch *gen; /* the architecture of -e */
    ArchConfig ac;
    size_t num_parameters;
    GPT2 model;
    KVCache cache;
    LlamaModel llama;
    LlamaKVCache llama_cache;
    char blas[320];
};

static void gpt2_gen_load(CpuGenerator *cg, const GenConfig *g, char *desc, size_t len) {
    gpt2_build(&cg->model, arch_config_base(&cg->ac));
    cg->ac.arch->load_init(g->init, &cg->ac, cg->model.params_memory, cg->model.num_parameters, g->seed);
    kvcache_init(&cg->cache, &cg->model, GENERATE_CHUNK);
    cg->num_parameters = cg->model.num_parameters;
    snprintf(desc, len, "CPU fp32, blas: %s", cg->blas);
}
static const float *gpt2_gen_forward(CpuGenerator *cg, const int *tokens, int n) {
    const float *logits = gpt2_forward_cached(&cg->model, &cg->cache, tokens, n);
    return logits + (size_t)(n - 1) * cg->model.cfg.padded_vocab_size;
}
static void gpt2_gen_free(CpuGenerator *cg) {
    kvcache_free(&cg->cache);
    gpt2_free(&cg->model);
}

static void llama_gen_load(CpuGenerator *cg, const GenConfig *g, char *desc, size_t len) {
    const LlamaConfig *lc = arch_config_as(&cg->ac, const LlamaConfig);
    llama_build(&cg->llama, lc);
    cg->ac.arch->load_init(g->init, &cg->ac, cg->llama.params_memory, cg->llama.num_parameters, g->seed);
    llama_kvcache_init(&cg->llama_cache, &cg->llama, GENERATE_CHUNK);
    cg->num_parameters = cg->llama.num_parameters;
    snprintf(desc, len, "CPU fp32, Llama 3 (NKV %d, F %d), blas: %s", lc->base.num_kv_heads, lc->base.ffn_hidden, cg->blas);
}
static const float *llama_gen_forward(CpuGenerator *cg, const int *tokens, int n) {
    return llama_forward_cached(&cg->llama, &cg->llama_cache, tokens, n) +
           (size_t)(n - 1) * cg->llama.cfg.base.padded_vocab_size;
}
static void llama_gen_free(CpuGenerator *cg) {
    llama_kvcache_free(&cg->llama_cache);
    llama_free(&cg->llama);
}

static const CpuGenArch cpu_gen_archs[] = {
    {&gpt2_arch, gpt2_gen_load, gpt2_gen_forward, gpt2_gen_free},
    {&llama3_arch, llama_gen_load, llama_gen_forward, llama_gen_free},
};

static void cpu_load(void *self, const GenConfig *g, ModelConfig *cfg, size_t *num_parameters, char *desc, size_t len) {
    CpuGenerator *cg = (CpuGenerator *)self;
    if (g->precision && strcmp(g->precision, "fp32") != 0)
        llmc_die("--precision %s: ./generate computes in fp32 on the CPU; bf16 and fp16 are ./generate_gpu's", g->precision);
#if defined(_OPENMP) && LLMC_USE_OPENBLAS
    openblas_set_num_threads(omp_get_max_threads());
#endif
    const ModelArch *arch = model_arch_for_init(g->init, &cg->ac);
    for (size_t i = 0; i < sizeof cpu_gen_archs / sizeof cpu_gen_archs[0]; i++)
        if (cpu_gen_archs[i].arch == arch) cg->gen = &cpu_gen_archs[i];
    if (!cg->gen) llmc_die("-e %s is a %s model: ./generate has no CPU decoder for it", g->init, arch->display);
    cg->gen->load(cg, g, desc, len);
    *cfg = *arch_config_base(&cg->ac);
    *num_parameters = cg->num_parameters;
}

static const float *cpu_forward(void *self, const int *tokens, int n) {
    CpuGenerator *cg = (CpuGenerator *)self;
    return cg->gen->forward(cg, tokens, n);
}

static void cpu_free(void *self) {
    CpuGenerator *cg = (CpuGenerator *)self;
    cg->gen->free(cg);
}

int main(int argc, char **argv) {
    static CpuGenerator cg;
    /* first: may re-execute the program with better OpenBLAS kernels */
    blas_choose_kernels(argv, cg.blas, sizeof cg.blas);
    GenerateBackend be = {"./generate", "fp32 only (bf16, fp16: ./generate_gpu)", &cg, cpu_load, cpu_forward, cpu_free};
    return generate_main(argc, argv, &be);
}
