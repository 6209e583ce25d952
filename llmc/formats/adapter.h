/*
 * adapter.h - LoRA adapter directories in Hugging Face PEFT's format (what PeftModel.save_pretrained
 * writes and PeftModel.from_pretrained reads):
 *   adapter_config.json        {"peft_type": "LORA", "r": R, "lora_alpha": A, "use_rslora": ..., "target_modules":
 *                              [...], "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": (GPT-2's Conv1D: true),
 *                              "base_model_name_or_path": -e, "task_type": "CAUSAL_LM", ...}
 *   adapter_model.safetensors  per targeted module and layer, F32: "<PEFT key>.lora_A.weight" [R, in] and
 *                              "....lora_B.weight" [out, R] (llmc/models/lora.h's lora_peft_key), with
 *                              "use_dora": true also "....lora_magnitude_vector" [out]; its
 *                              "__metadata__" also holds "llmc_base_crc32": the CRC-32 of the base model's fp32
 *                              parameters the adapter was trained on (written by llmc; PEFT ignores it).
 * Prompt tuning (LoraConfig.prompt_tokens; PEFT's PROMPT_TUNING): adapter_config.json {"peft_type":
 * "PROMPT_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": P, "token_dim": C, "num_layers", 
 * "num_attention_heads", "num_transformer_submodules": 1, "prompt_tuning_init": "RANDOM", ...} and the
 * one tensor "prompt_embeddings" [P, C] F32 (with the same llmc_base_crc32).
 * Directories are written atomically (atomicfile.h's atomic_dir_*). Reading checks everything and dies
 * naming the file: a config PEFT would not load as LoRA / DoRA on these modules (per-layer rank or
 * alpha patterns, layers_to_transform, a regular-expression target), a missing, misshapen or extra tensor.
 */
#ifndef LLMC_FORMATS_ADAPTER_H
#define LLMC_FORMATS_ADAPTER_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/models/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What adapter_config.json says (what lora_config_build takes). */
typedef struct {
    int rank;
    float alpha;
    int rslora;
    int dora;          /* use_dora */
    float dropout;
    char targets[512]; /* target_modules joined with commas ("all-linear" as given) */
    int prompt_tokens; /* PROMPT_TUNING: num_virtual_tokens (0: a LoRA adapter) */
    int token_dim;     /* PROMPT_TUNING: token_dim */
} AdapterFileConfig;

/* dir/adapter_model.safetensors */
void adapter_model_path(const char *dir, char *out, size_t len);
/* Reads and checks dir/adapter_config.json; dies naming it. */
void adapter_read_config(const char *dir, AdapterFileConfig *out);
/* Loads dir's tensors for lc into params (lc->num_parameters floats, our row order); every key lc needs
 * (DoRA: the magnitudes too) must be there with PEFT's shape and no other lora tensor. *has_crc: the file records the base's CRC
 * (llmc wrote it), in *base_crc. Dies naming the file and tensor. */
void adapter_load(const char *dir, const LoraConfig *lc, float *params, int *has_crc, uint32_t *base_crc);
/* Writes dir (atomically; an existing adapter directory there is replaced). Returns the CRC-32 of its
 * adapter_model.safetensors. */
uint32_t adapter_save(const char *dir, const LoraConfig *lc, const float *params, uint32_t base_crc, const char *base_name);
/* adapter_save, the file's __metadata__ also recording "llmc_quantize_base": the quantised base the
 * adapter was trained on (QLoRA: "nf4", "nf4+dq", "int8"; "" writes none, as adapter_save). */
uint32_t adapter_save_quant(const char *dir, const LoraConfig *lc, const float *params, uint32_t base_crc,
                            const char *base_name, const char *quantize_base);
/* dir's adapter_model.safetensors' llmc_quantize_base into out ("" when it records none: an fp32 base). */
void adapter_read_quantize_base(const char *dir, char *out, size_t len);

#ifdef __cplusplus
}
#endif
#endif
