/*
 * lora.c (train) - the LoRA flags, start adapter and resume rules every trainer shares (lora.h).
 */
#include "llmc/train/lora.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "llmc/core/check.h"
#include "llmc/formats/adapter.h"
#include "llmc/formats/rundir.h"

int lora_wanted(const TrainConfig *tc) { return tc->lora_rank || tc->adapter[0] || tc->prompt_tokens; }

void lora_check_flags(const TrainConfig *tc) {
    if (tc->zero_stage >= 2)
        llmc_die("-z %d with LoRA: the frozen base has no gradients to shard and the adapter is small; use -z 0 or -z 1 "
                 "(the adapter's AdamW moments sharded over the ranks)", tc->zero_stage);
    if (tc->save_hf)
        llmc_die("--save-hf 1 with LoRA: checkpoints are adapter directories (PEFT's format); merge one into a model with "
                 "./hf_convert IN OUT --adapter DIR");
    if (tc->ckpt_bf16) llmc_die("--checkpoint-bf16 1 with LoRA: adapters are written in fp32 (PEFT's float32)");
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

void lora_resume_init(const TrainConfig *tc, int resume_step, char *init, size_t len) {
    if (resume_step < 0) return;
    char adapter[4200];
    rundir_adapter_dir(tc->output_dir, resume_step, adapter, sizeof adapter);
    if (lora_wanted(tc)) {
        if (!is_dir(adapter))
            llmc_die("-y 1: the checkpoint of step %d in '%s' has no adapter directory %s: that run trained the whole model; "
                     "resume it without --lora-rank / --adapter", resume_step, tc->output_dir, adapter);
        snprintf(init, len, "%s", tc->init); /* the base it was trained on, not a model file of -o */
    } else if (is_dir(adapter)) {
        llmc_die("-y 1: the run in '%s' trained LoRA adapters (%s): resume it with its --lora-rank (or --adapter) flags",
                 tc->output_dir, adapter);
    }
}

void lora_start_dir(const TrainConfig *tc, int resume_step, char *dir, size_t len) {
    if (resume_step >= 0) rundir_adapter_dir(tc->output_dir, resume_step, dir, len);
    else snprintf(dir, len, "%s", tc->adapter);
}

/* Whether two target lists select the same modules of the model. */
static int same_targets(int family, const ModelConfig *cfg, const char *a, const char *b, int rank) {
    LoraConfig x, y;
    char err[512];
    if (lora_config_build(&x, family, cfg, rank, 8.0f, 0, 0, a, err, sizeof err) ||
        lora_config_build(&y, family, cfg, rank, 8.0f, 0, 0, b, err, sizeof err) || x.num_modules != y.num_modules)
        return 0;
    for (int i = 0; i < x.num_modules; i++)
        if (strcmp(x.modules[i].path, y.modules[i].path) != 0) return 0;
    return 1;
}

/* Prompt tuning (--prompt-tokens, or from_dir's PROMPT_TUNING config): fills out and returns 1; 0 for LoRA. */
static int prompt_config(const TrainConfig *tc, int family, const ModelConfig *cfg, const char *from_dir, LoraConfig *out) {
    AdapterFileConfig fc = {0};
    if (from_dir[0]) adapter_read_config(from_dir, &fc);
    if (!tc->prompt_tokens && !fc.prompt_tokens) return 0;
    if (tc->lora_rank || tc->use_rslora || tc->use_dora || tc->lora_targets[0] || (from_dir[0] && !fc.prompt_tokens))
        llmc_die("--prompt-tokens with LoRA (--lora-rank, --lora-targets, --use-rslora, --use-dora, or a LoRA --adapter): "
                 "prompt tuning and LoRA adapters do not combine; give one of them");
    int P = tc->prompt_tokens;
    if (fc.prompt_tokens) {
        if (P && P != fc.prompt_tokens)
            llmc_die("--prompt-tokens %d differs from the adapter's num_virtual_tokens = %d (%s/adapter_config.json)", P,
                     fc.prompt_tokens, from_dir);
        if (fc.token_dim != cfg->channels)
            llmc_die("%s/adapter_config.json: token_dim %d, but -e %s has %d channels: the adapter belongs to another base "
                     "model", from_dir, fc.token_dim, tc->init, cfg->channels);
        P = fc.prompt_tokens;
    }
    char err[512];
    if (lora_prompt_config_build(out, family, cfg, P, tc->T, err, sizeof err) != 0) {
        if (fc.prompt_tokens) llmc_die("%s/adapter_config.json: num_virtual_tokens: %s", from_dir, err);
        llmc_die("%s", err);
    }
    return 1;
}

void lora_resolve_config(const TrainConfig *tc, int family, const char *model_name, const ModelConfig *cfg,
                         const char *from_dir, LoraConfig *out) {
    if (!family) llmc_die("--lora-rank: no LoRA sites for %s models (GPT-2 and Llama have them)", model_name);
    if (prompt_config(tc, family, cfg, from_dir, out)) return;
    int rank = tc->lora_rank, rslora = tc->use_rslora, dora = tc->use_dora;
    float alpha = tc->lora_alpha;
    char targets[512];
    snprintf(targets, sizeof targets, "%s", tc->lora_targets);
    if (from_dir[0]) {
        AdapterFileConfig fc;
        adapter_read_config(from_dir, &fc);
        if (rank && rank != fc.rank)
            llmc_die("--lora-rank %d differs from the adapter's r = %d (%s/adapter_config.json)", rank, fc.rank, from_dir);
        if (alpha != 8.0f && alpha != fc.alpha) /* (8: the flag's default, PEFT's) */
            llmc_die("--lora-alpha %g differs from the adapter's lora_alpha = %g (%s/adapter_config.json)", (double)alpha,
                     (double)fc.alpha, from_dir);
        if (rslora && !fc.rslora)
            llmc_die("--use-rslora 1 differs from the adapter's use_rslora false (%s/adapter_config.json)", from_dir);
        if (dora && !fc.dora)
            llmc_die("--use-dora 1 differs from the adapter's use_dora false (%s/adapter_config.json): it has no magnitude "
                     "vectors", from_dir);
        if (targets[0] && !same_targets(family, cfg, targets, fc.targets, fc.rank))
            llmc_die("--lora-targets %s selects other modules than the adapter's target_modules %s (%s/adapter_config.json)",
                     targets, fc.targets, from_dir);
        if (fc.dropout != 0.0f && tc->max_steps != 0)
            llmc_die("%s/adapter_config.json: lora_dropout %g: dropout is not supported when training (evaluate with -x 0, "
                     "or set it to 0)", from_dir, (double)fc.dropout);
        rank = fc.rank, alpha = fc.alpha, rslora = fc.rslora, dora = fc.dora;
        snprintf(targets, sizeof targets, "%s", fc.targets);
    }
    char err[512];
    if (lora_config_build(out, family, cfg, rank, alpha, rslora, dora, targets, err, sizeof err) != 0) {
        if (from_dir[0]) llmc_die("%s/adapter_config.json: %s", from_dir, err);
        llmc_die("%s", err);
    }
}

void lora_load_start(const char *from_dir, const LoraConfig *lc, float *params, uint32_t base_crc, const char *init) {
    int has_crc;
    uint32_t crc = 0;
    adapter_load(from_dir, lc, params, &has_crc, &crc);
    if (has_crc && crc != base_crc)
        llmc_die("adapter '%s' was trained on another base model: it records the base's crc32 %08x, -e %s has %08x "
                 "(give the -e it was trained on)", from_dir, (unsigned)crc, init, (unsigned)base_crc);
}
