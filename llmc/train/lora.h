/*
 * lora.h (train) - what a trainer does with LoRA flags, whatever its backend: whether they ask for
 * adapters, which other flags go with them, the adapter table they resolve to (the flags, or the
 * adapter directory a run starts from: --adapter, or on -y 1 the checkpoint's adapter_NNNNNNNN/),
 * the start adapter loaded and checked against the base, and the -o / -e of a resume. The backend
 * keeps the arenas and ops (the CPU's: llmc/cpu/lora.h).
 */
#ifndef LLMC_TRAIN_LORA_H
#define LLMC_TRAIN_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/models/lora.h"
#include "llmc/train/cli.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The flags ask for adapters (a rank, or an adapter directory to start from). */
int lora_wanted(const TrainConfig *tc);
/* Dies on flags that do not go with adapters: -z 2/3 (the frozen base has no gradients to shard),
 * --save-hf, --checkpoint-bf16. */
void lora_check_flags(const TrainConfig *tc);
/* -y 1 (resume_step >= 0): a LoRA run resumes on -e, its base (init gets tc->init); a run in -o that
 * trained adapters resumed without LoRA flags, or a full run resumed with them, is an error. */
void lora_resume_init(const TrainConfig *tc, int resume_step, char *init, size_t len);
/* The adapter directory the run starts from ('' = new adapters): the checkpoint's on -y 1, else --adapter. */
void lora_start_dir(const TrainConfig *tc, int resume_step, char *dir, size_t len);
/* The adapter table for a model of family on cfg: the flags, or from_dir's adapter_config.json (the
 * flags given must agree with it; dropout > 0 only with -x 0). Dies naming the flag or file. */
void lora_resolve_config(const TrainConfig *tc, int family, const char *model_name, const ModelConfig *cfg,
                         const char *from_dir, LoraConfig *out);
/* Loads from_dir's tensors into params (lc's table) and dies when the directory records another base
 * than base_crc (the CRC-32 of the base's fp32 parameters; init names it in the message). */
void lora_load_start(const char *from_dir, const LoraConfig *lc, float *params, uint32_t base_crc, const char *init);

#ifdef __cplusplus
}
#endif
#endif
