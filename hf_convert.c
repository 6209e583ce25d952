/*
 * hf_convert.c - ./hf_convert: llm.c model files <-> Hugging Face model directories (llmc/formats/hf.h).
 *
 *   ./hf_convert out/run1/model_00005000.bin gpt2-hf     # llm.c file -> HF directory
 *   ./hf_convert gpt2-hf model.bin                       # HF directory -> llm.c file (+ model.bin.sum)
 *
 * The direction follows the input: a directory with config.json is read as an HF directory,
 * anything else as an llm.c model file. --dtype fp32|bf16 picks the output's precision; by
 * default it is the input's (an llm.c bf16 file gives BF16 safetensors, an HF directory whose
 * weights are all BF16 gives a bf16 file, F16 and F32 give fp32), so llm.c -> HF -> llm.c gives
 * the same bytes. The output must not exist: nothing is ever replaced.
 *
 * Llama 3 (llmc/models/llama.h): IN is llmc's Llama checkpoint (magic 20261130), llm.c's Llama 3 file
 * (magic 20240803) or an HF LlamaForCausalLM directory; --format llmc|llama3|hf picks OUT's kind
 * (default: hf for a file, llmc for a directory), keeping the input's precision (fp32 or bf16)
 * unless --dtype says:
 *   ./hf_convert out/run1/model_00000010.bin llama3.bin --format llama3 [--dtype bf16]
 *   ./hf_convert Llama-3.2-1B/ model.bin                 # HF directory -> llmc's Llama checkpoint
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc/core/check.h"
#include "llmc/formats/arch.h"
#include "llmc/formats/hf.h"
#include "llmc/formats/llamafile.h"
#include "llmc/models/llama.h"
#include "llmc/models/gpt2.h"
#include "llmc/models/lora.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/adapter.h"

/* --adapter DIR: a PEFT LoRA adapter merged into IN's weights before OUT is written */
static const char *adapter_dir;

/* Merges --adapter into params (IN's fp32 weights): W += s B A, summed in double and rounded once to
 * fp32 (then once more to bf16 when OUT is bf16). The adapter must have been trained on IN (the CRC it
 * records, or its shapes). */
static void merge_adapter(const ArchConfig *ac, float *params, size_t n) {
    if (!adapter_dir) return;
    const int family = ac->arch == &llama3_arch ? LORA_FAMILY_LLAMA : ac->arch == &gpt2_arch ? LORA_FAMILY_GPT2 : 0;
    AdapterFileConfig fc;
    adapter_read_config(adapter_dir, &fc);
    if (fc.prompt_tokens)
        llmc_die("--adapter %s is a prompt-tuning adapter (PROMPT_TUNING): soft tokens at the input have no weights to merge "
                 "into; use the model with the adapter directory (./train_gpt_cpu -e IN --adapter %s)", adapter_dir, adapter_dir);
    LoraConfig lc;
    char err[512];
    if (lora_config_build(&lc, family, arch_config_cbase(ac), fc.rank, fc.alpha, fc.rslora, fc.dora, fc.targets, err,
                          sizeof err))
        llmc_die("%s/adapter_config.json: %s", adapter_dir, err);
    float *adapter = (float *)mallocCheck(lc.num_parameters * sizeof(float), "adapter");
    int has_crc;
    uint32_t crc = 0, base = sumfile_crc_update(0, params, n * sizeof(float));
    adapter_load(adapter_dir, &lc, adapter, &has_crc, &crc);
    if (has_crc && crc != base)
        llmc_die("adapter '%s' was trained on another base model: it records the base's crc32 %08x, this input has %08x",
                 adapter_dir, (unsigned)crc, (unsigned)base);
    TensorSpec specs[64];
    if (ac->arch->num_param_specs > 64) llmc_die("internal: parameter table too large");
    ac->arch->parameter_specs(ac, specs);
    size_t changed = lora_merge(&lc, adapter, specs, ac->arch->num_param_specs, params);
    printf("merged %s adapter '%s' (r %d, scale %g): %zu weights changed\n", lc.dora ? "DoRA" : "LoRA", adapter_dir, lc.rank,
           (double)lc.scale, changed);
    free(adapter);
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: ./hf_convert IN OUT [--dtype fp32|bf16] [--adapter DIR]\n\n"
            "  IN an llm.c model file (model_*.bin, fp32 or bf16): OUT is written as a Hugging Face directory\n"
            "     (config.json, model.safetensors, model.safetensors.sum)\n"
            "  IN a Hugging Face directory (config.json + model.safetensors or sharded safetensors with\n"
            "     model.safetensors.index.json): OUT is written as an llm.c model file (and OUT.sum)\n"
            "  IN a Llama: llmc's Llama checkpoint, llm.c's Llama 3 file (fp32 or bf16) or an HF LlamaForCausalLM\n"
            "     directory: OUT is written as --format llmc (llmc's Llama checkpoint), llama3 (llm.c's\n"
            "     Llama 3 file) or hf (HF directory); default: hf for a file, llmc for a directory\n"
            "  --dtype fp32|bf16   the output's precision (default: the input's)\n"
            "  --adapter DIR       merge this PEFT LoRA adapter (trained on IN) into the weights first: W += s B A\n"
            "                      (DoRA: W = m / ||W + s B A|| (W + s B A), per output row)\n"
            "                      in fp32 (the product summed in double), rounded once to OUT's precision\n"
            "OUT must not exist.\n");
}

/* A Llama between llmc's Llama checkpoint, llm.c's Llama 3 file and an HF LlamaForCausalLM directory */
static int convert_llama(const char *in, const char *out, const ArchConfig *ac, const char *dtype, const char *format) {
    const LlamaConfig *cfg = arch_config_as(ac, const LlamaConfig);
    const int from_hf = hf_is_model_dir(in);
    int32_t h[2] = {0, 0};
    if (!from_hf) {
        FILE *f = fopenCheck(in, "rb");
        freadCheck(h, sizeof h[0], 2, f, in);
        fclose(f);
    }
    const int from_llmc = !from_hf && h[0] == LLAMA_FILE_MAGIC;
    const char *to = format ? format : from_hf ? "llmc" : "hf";
    if (from_hf && strcmp(to, "hf") == 0) hf_check_save_source(in); /* its tokenizer files are copied too */
    size_t n = llama_parameter_specs(cfg, NULL);
    float *params = (float *)mallocCheck(n * sizeof(float), "parameters");
    int in_bf16 = ac->arch->load_init(in, ac, params, n, 0);
    merge_adapter(ac, params, n);
    const int bf16 = dtype ? strcmp(dtype, "bf16") == 0 : in_bf16;
    if (strcmp(to, "llama3") == 0) llmc_llama3_write(out, cfg, params, n, bf16);
    else if (strcmp(to, "hf") == 0 && from_hf) hf_llama_save_from(out, cfg, params, n, bf16, in); /* its fields kept */
    else if (strcmp(to, "hf") == 0) ac->arch->save_hf(out, ac, params, n, bf16);
    else ac->arch->save(out, ac, params, n, bf16);
    const char *kind = from_hf ? "Hugging Face LlamaForCausalLM directory" : from_llmc ? "llmc Llama checkpoint" : "llm.c Llama 3 file";
    printf("%s (%s%s) -> %s (%s, %s): L %d, NH %d, NKV %d, C %d, F %d, maxT %d, V %d: %zu parameters\n", in, kind,
           in_bf16 ? ", bf16" : "", out, to, bf16 ? "bf16" : "fp32", cfg->base.num_layers, cfg->base.num_heads,
           cfg->base.num_kv_heads, cfg->base.channels, cfg->base.ffn_hidden, cfg->base.max_seq_len, cfg->base.vocab_size, n);
    free(params);
    return 0;
}

int main(int argc, char **argv) {
    const char *paths[2] = {NULL, NULL}, *dtype = NULL, *format = NULL;
    int npaths = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--dtype") == 0 || strncmp(argv[i], "--dtype=", 8) == 0) {
            if (argv[i][7] == '=') dtype = argv[i] + 8;
            else if (i + 1 < argc) dtype = argv[++i];
            else llmc_die("flag --dtype needs a value: fp32 or bf16");
            if (strcmp(dtype, "fp32") != 0 && strcmp(dtype, "bf16") != 0)
                llmc_die("--dtype %s: the output's precision is fp32 or bf16", dtype);
        } else if (strcmp(argv[i], "--format") == 0 || strncmp(argv[i], "--format=", 9) == 0) {
            if (argv[i][8] == '=') format = argv[i] + 9;
            else if (i + 1 < argc) format = argv[++i];
            else llmc_die("flag --format needs a value: llmc, llama3 or hf");
            if (strcmp(format, "llmc") != 0 && strcmp(format, "llama3") != 0 && strcmp(format, "hf") != 0)
                llmc_die("--format %s: a Llama is written as llmc (llmc's Llama checkpoint), llama3 (llm.c's Llama 3 "
                         "file) or hf (a Hugging Face directory)", format);
        } else if (strcmp(argv[i], "--adapter") == 0) {
            if (i + 1 >= argc) llmc_die("flag --adapter needs a value: a PEFT LoRA adapter directory");
            adapter_dir = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            usage(stderr);
            llmc_die("unknown flag '%s'", argv[i]);
        } else if (npaths < 2) {
            paths[npaths++] = argv[i];
        } else {
            usage(stderr);
            llmc_die("too many arguments ('%s'): give IN and OUT", argv[i]);
        }
    }
    if (npaths != 2) {
        usage(stderr);
        llmc_die("give IN and OUT");
    }
    const char *in = paths[0], *out = paths[1];
    struct stat sb;
    if (lstat(out, &sb) == 0) llmc_die("output '%s' already exists: remove it or give another path", out);

    ArchConfig ac; /* (a path that does not exist: GPT-2's reader says so) */
    const ModelArch *arch = stat(in, &sb) == 0 ? model_arch_for_init(in, &ac) : (gpt2_arch.config_from_init(in, &ac), &gpt2_arch);
    if (arch == &llama3_arch) return convert_llama(in, out, &ac, dtype, format);
    if (format) llmc_die("--format %s: '%s' is not a Llama file (--format is for Llama conversions)", format, in);

    const ModelConfig cfg = *arch_config_base(&ac);
    size_t numel = arch->parameter_specs(&ac, NULL);
    float *params = (float *)mallocCheck(numel * sizeof(float), "parameters");
    const int from_hf = hf_is_model_dir(in);
    int bf16 = arch->load_init(in, &ac, params, numel, 0);
    merge_adapter(&ac, params, numel);
    if (dtype) bf16 = strcmp(dtype, "bf16") == 0;
    if (from_hf) {
        arch->save(out, &ac, params, numel, bf16);
    } else {
        /* the padded vocabulary rows (Vp - V) are not part of an HF model */
        TensorSpec specs[NUM_PARAMETER_TENSORS];
        gpt2_parameter_specs(&cfg, specs);
        ParameterTensors p;
        gpt2_point_parameters(&p, params, specs);
        size_t nonzero = 0;
        for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < (size_t)cfg.padded_vocab_size * cfg.channels; i++)
            nonzero += p.wte[i] != 0.0f;
        if (nonzero)
            printf("note: '%s' has %zu non-zero weights in wte's padded vocabulary rows (%d..%d), which an HF "
                   "directory does not hold: they are dropped (no token reads them)\n",
                   in, nonzero, cfg.vocab_size, cfg.padded_vocab_size - 1);
        arch->save_hf(out, &ac, params, numel, bf16);
    }
    printf("%s (%s) -> %s (%s): L %d, NH %d, C %d, maxT %d, V %d: %zu parameters\n", in,
           from_hf ? "Hugging Face directory" : "llm.c model file", out,
           from_hf ? (bf16 ? "llm.c model file, bf16" : "llm.c model file, fp32")
                   : (bf16 ? "Hugging Face directory, BF16" : "Hugging Face directory, F32"),
           cfg.num_layers, cfg.num_heads, cfg.channels, cfg.max_seq_len, cfg.vocab_size, numel);
    free(params);
    return 0;
}
