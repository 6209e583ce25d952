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
#include "llmc/generate/generate.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

typedef struct {
    int is_llama; /* the architecture of -e: a Llama name or file, else GPT-2 */
    GPT2 model;
    KVCache cache;
    LlamaModel llama;
    LlamaKVCache llama_cache;
    char blas[320];
} CpuGenerator;

static void cpu_load(void *self, const GenConfig *g, ModelConfig *cfg, size_t *num_parameters, char *desc, size_t len) {
    CpuGenerator *cg = (CpuGenerator *)self;
    if (g->precision && strcmp(g->precision, "fp32") != 0)
        llmc_die("--precision %s: ./generate computes in fp32 on the CPU; bf16 and fp16 are ./generate_gpu's", g->precision);
#if defined(_OPENMP) && LLMC_USE_OPENBLAS
    openblas_set_num_threads(omp_get_max_threads());
#endif
    LlamaConfig lc;
    if (llama_config_from_init(g->init, &lc)) {
        cg->is_llama = 1;
        llama_build(&cg->llama, &lc);
        llama_load_init(g->init, &lc, cg->llama.params_memory, cg->llama.num_parameters, g->seed);
        llama_kvcache_init(&cg->llama_cache, &cg->llama, GENERATE_CHUNK);
        *cfg = lc.base;
        *num_parameters = cg->llama.num_parameters;
        snprintf(desc, len, "CPU fp32, Llama 3 (NKV %d, F %d), blas: %s", lc.base.num_kv_heads, lc.base.ffn_hidden, cg->blas);
        return;
    }
    ModelConfig mc;
    if (model_config_from_descriptor(&mc, g->init) == 0) gpt2_build_random(&cg->model, &mc, g->seed);
    else gpt2_build_from_checkpoint(&cg->model, g->init);
    kvcache_init(&cg->cache, &cg->model, GENERATE_CHUNK);
    *cfg = cg->model.cfg;
    *num_parameters = cg->model.num_parameters;
    snprintf(desc, len, "CPU fp32, blas: %s", cg->blas);
}

static const float *cpu_forward(void *self, const int *tokens, int n) {
    CpuGenerator *cg = (CpuGenerator *)self;
    if (cg->is_llama)
        return llama_forward_cached(&cg->llama, &cg->llama_cache, tokens, n) +
               (size_t)(n - 1) * cg->llama.cfg.base.padded_vocab_size;
    const float *logits = gpt2_forward_cached(&cg->model, &cg->cache, tokens, n);
    return logits + (size_t)(n - 1) * cg->model.cfg.padded_vocab_size;
}

static void cpu_free(void *self) {
    CpuGenerator *cg = (CpuGenerator *)self;
    if (cg->is_llama) {
        llama_kvcache_free(&cg->llama_cache);
        llama_free(&cg->llama);
        return;
    }
    kvcache_free(&cg->cache);
    gpt2_free(&cg->model);
}

int main(int argc, char **argv) {
    static CpuGenerator cg;
    /* first: may re-execute the program with better OpenBLAS kernels */
    blas_choose_kernels(argv, cg.blas, sizeof cg.blas);
    GenerateBackend be = {"./generate", "fp32 only (bf16, fp16: ./generate_gpu)", &cg, cpu_load, cpu_forward, cpu_free};
    return generate_main(argc, argv, &be);
}
