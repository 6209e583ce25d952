/*
 * generate.c - ./generate: continue a prompt with a trained model on the CPU (fp32), through
 * the KV-cache forward of llmc/cpu/decode.h. Flags, prompt, sampling and output are the front
 * end's (llmc/generate/generate.c), shared with ./generate_gpu (generate.cu).
 *
 *   ./generate -e out/run1/model_00005000.bin --prompt "The king" -g 100 --temperature 0.8
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/blas_select.h"
#include "llmc/cpu/arch.h"
#include "llmc/cpu/lora.h"
#include "llmc/cpu/qbase.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/adapter.h"
#include "llmc/formats/arch.h"
#include "llmc/generate/generate.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

/* The model of -e and its KV cache, through the CPU backend's table (llmc/cpu/arch.h). */
typedef struct {
    const CpuArch *a; /* the architecture of -e */
    ArchConfig ac;
    void *model, *cache;
    char blas[320];
    LoraRun lora; /* --adapter's (cfg.num_parameters 0: none) */
    int *seq, len;  /* prompt tuning (lora.cfg.prompt_tokens P): the tokens so far, behind the P soft tokens */
    int *inputs;    /* (P + maxT - P): what the full forward of each call runs */
    QBase qbase;  /* --quantize-base's (storage NULL: none) */
} CpuGenerator;

/* --quantize-base: the loaded base's block linear weights quantised (after --adapter checked its CRC on
 * the fp32 base), their fp32 pages released; the decoder's site matmuls read the codes. */
static void cpu_quantize_base(CpuGenerator *cg, const GenConfig *g) {
    char err[512];
    const int mode = quant_parse(g->quantize_base);
    if (cg->lora.cfg.dora)
        llmc_die("--quantize-base with the DoRA adapter %s is not built yet (its row norms read the fp32 weights)", g->adapter);
    if (!cg->a->set_qbase) llmc_die("--quantize-base: ./generate has no quantised base for %s models", cg->ac.arch->display);
    if (qbase_check(mode, g->double_quant, cg->a->lora_family, arch_config_base(&cg->ac), err, sizeof err) != 0)
        llmc_die("-e %s: %s", g->init, err);
    CpuModelParts parts = cg->a->parts(cg->model);
    qbase_build(&cg->qbase, mode, g->double_quant, cg->a->lora_family, arch_config_base(&cg->ac), *parts.params, parts.specs,
                cg->ac.arch->num_param_specs);
    cg->a->set_qbase(cg->model, &cg->qbase);
}

/* --adapter DIR on the loaded base: PEFT's adapter, unmerged (the forward adds s B (A x) at each
 * targeted module); an adapter trained on another base (the CRC it records, or its shapes) is an error. */
static void cpu_load_adapter(CpuGenerator *cg, const GenConfig *g) {
    if (!cg->a->lora_family) llmc_die("--adapter %s: ./generate has no LoRA sites for %s models", g->adapter, cg->ac.arch->display);
    AdapterFileConfig fc;
    adapter_read_config(g->adapter, &fc);
    LoraConfig lc;
    char err[512];
    const ModelConfig *mc = arch_config_base(&cg->ac);
    if (fc.prompt_tokens && fc.token_dim != mc->channels)
        llmc_die("%s/adapter_config.json: token_dim %d, but -e %s has %d channels: the adapter belongs to another base model",
                 g->adapter, fc.token_dim, g->init, mc->channels);
    if (fc.prompt_tokens ? lora_prompt_config_build(&lc, cg->a->lora_family, mc, fc.prompt_tokens, 1, err, sizeof err)
                         : lora_config_build(&lc, cg->a->lora_family, mc, fc.rank, fc.alpha, fc.rslora, fc.dora, fc.targets, err,
                                             sizeof err))
        llmc_die("%s/adapter_config.json: %s", g->adapter, err);
    CpuModelParts parts = cg->a->parts(cg->model);
    uint32_t base = sumfile_crc_update(0, *parts.params, parts.num_parameters * sizeof(float)), crc = 0;
    int has_crc;
    lora_run_init(&cg->lora, &lc, 0);
    adapter_load(g->adapter, &lc, cg->lora.params, &has_crc, &crc);
    if (has_crc && crc != base)
        llmc_die("adapter '%s' was trained on another base model: it records the base's crc32 %08x, -e %s has %08x", g->adapter,
                 (unsigned)crc, g->init, (unsigned)base);
    lora_run_set_base(&cg->lora, *parts.params, parts.specs, cg->ac.arch->num_param_specs, 0); /* (DoRA reads W, b) */
    cg->a->set_lora(cg->model, &cg->lora);
    if (!lc.prompt_tokens) {
        lora_run_allocate(&cg->lora, 1, GENERATE_CHUNK, 0);
        return;
    }
    /* prompt tuning: the soft tokens go in front of the sequence at the embedding of the full forward
     * (the KV-cache decoder has no hook for them): each call runs the whole sequence again */
    lora_run_allocate(&cg->lora, 1, mc->max_seq_len, 0);
    cg->a->allocate(cg->model, 1, mc->max_seq_len, 0, 0);
    cg->seq = (int *)callocCheck((size_t)mc->max_seq_len, sizeof(int), "sequence");
    cg->inputs = (int *)callocCheck((size_t)mc->max_seq_len, sizeof(int), "sequence with the soft tokens");
}

static void cpu_load(void *self, const GenConfig *g, ModelConfig *cfg, size_t *num_parameters, char *desc, size_t len) {
    CpuGenerator *cg = (CpuGenerator *)self;
    if (g->precision && strcmp(g->precision, "fp32") != 0)
        llmc_die("--precision %s: ./generate computes in fp32 on the CPU; bf16 and fp16 are ./generate_gpu's", g->precision);
#if defined(_OPENMP) && LLMC_USE_OPENBLAS
    openblas_set_num_threads(omp_get_max_threads());
#endif
    const ModelArch *arch = model_arch_for_init(g->init, &cg->ac);
    cg->a = cpu_arch_for(arch);
    if (!cg->a) llmc_die("-e %s is a %s model: ./generate has no CPU decoder for it", g->init, arch->display);
    cg->model = callocCheck(1, cg->a->model_size, "model");
    cg->a->build(cg->model, &cg->ac);
    CpuModelParts parts = cg->a->parts(cg->model);
    cg->ac.arch->load_init(g->init, &cg->ac, *parts.params, parts.num_parameters, g->seed);
    if (g->adapter) cpu_load_adapter(cg, g);
    if (g->quantize_base) cpu_quantize_base(cg, g);
    cg->cache = callocCheck(1, cg->a->cache_size, "KV cache");
    cg->a->kvcache_init(cg->cache, cg->model, GENERATE_CHUNK);
    char what[160];
    cg->a->describe(&cg->ac, what, sizeof what);
    char quant[64] = "";
    if (g->quantize_base) snprintf(quant, sizeof quant, "base quantised %s, ", quant_name(cg->qbase.mode, cg->qbase.double_quant));
    const int P = cg->lora.cfg.prompt_tokens;
    char kind[96];
    snprintf(kind, sizeof kind, P ? "prompt-tuning adapter (%d soft tokens), " : "LoRA adapter (unmerged), ", P);
    snprintf(desc, len, "CPU fp32, %s%s%sblas: %s", what, g->adapter ? kind : "", quant, cg->blas);
    *cfg = *arch_config_base(&cg->ac);
    cfg->max_seq_len -= P; /* (the soft tokens take P of the model's positions) */
    *num_parameters = parts.num_parameters;
}

static const float *cpu_forward(void *self, const int *tokens, int n) {
    CpuGenerator *cg = (CpuGenerator *)self;
    const int P = cg->lora.cfg.prompt_tokens;
    if (P) { /* the whole sequence so far behind the soft tokens (P + len <= maxT: the front end's limit) */
        memcpy(cg->seq + cg->len, tokens, (size_t)n * sizeof(int));
        cg->len += n;
        lora_prompt_inputs(&cg->lora.cfg, cg->seq, NULL, 1, cg->len, cg->inputs, NULL);
        cg->a->forward(cg->model, cg->inputs, NULL, 1, P + cg->len, 0.0f);
        return cg->a->logits(cg->model) + (size_t)(P + cg->len - 1) * arch_config_base(&cg->ac)->padded_vocab_size;
    }
    return cg->a->forward_cached(cg->model, cg->cache, tokens, n) +
           (size_t)(n - 1) * arch_config_base(&cg->ac)->padded_vocab_size;
}

static void cpu_free(void *self) {
    CpuGenerator *cg = (CpuGenerator *)self;
    cg->a->kvcache_free(cg->cache);
    free(cg->cache);
    qbase_free(&cg->qbase); /* (before the model: the released pages are counted back to its arena) */
    cg->a->free(cg->model);
    free(cg->model);
    if (cg->lora.params) lora_run_free(&cg->lora);
    free(cg->seq);
    free(cg->inputs);
}

int main(int argc, char **argv) {
    static CpuGenerator cg;
    /* first: may re-execute the program with better OpenBLAS kernels */
    blas_choose_kernels(argv, cg.blas, sizeof cg.blas);
    GenerateBackend be = {"./generate", "fp32 only (bf16, fp16: ./generate_gpu)", &cg, cpu_load, cpu_forward, cpu_free};
    return generate_main(argc, argv, &be);
}
