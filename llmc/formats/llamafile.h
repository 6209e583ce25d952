/*
 * llamafile.h - the Llama 3 checkpoint files: llmc's own (every knob in its header) and llm.c's
 * Llama 3 file (its llama3 branch). The HF LlamaForCausalLM directory is hf.h's.
 */
#ifndef LLMC_FORMATS_LLAMAFILE_H
#define LLMC_FORMATS_LLAMAFILE_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/models/llama.h"

#ifdef __cplusplus
extern "C" {
#endif

/* llmc's Llama checkpoint: int32 header[256] then the table's tensors as float32 or bfloat16. It
 * records what llm.c's GPT-2 header cannot; GPT-2 files keep llm.c's header (20240326), unchanged.
 *   [0] 20261130 (LLAMA_FILE_MAGIC)  [1] version 1  [2] architecture (1: Llama 3)  [3] maxT
 *   [4] V  [5] Vp  [6] L  [7] NH  [8] NKV  [9] C  [10] F  [11] tied (1: no lm_head stored)
 *   [12] dtype of the parameters: 0 float32, 1 bfloat16 (round to nearest even; --checkpoint-bf16 1)
 *   float32 in int32 slots: [16] norm eps  [17] rope theta  [18] rope factor (0: no scaling)
 *   [19] low_freq_factor  [20] high_freq_factor;  [21] original max position (int32)
 *   [22] ffn_dim_multiplier (float32)  [23] multiple_of: how F was derived, 0 when unknown
 * The file size must be exactly 1024 + numel * (4 or 2). Written with "<path>.sum" (modelfile.h's
 * model_file_write), verified on load when present. Every bad header field is a clear error
 * naming the file (exit 1). */
#define LLAMA_FILE_MAGIC 20261130
#define LLAMA_FILE_VERSION 1
#define LLAMA_ARCH_LLAMA3 1
#define LLAMA_FILE_DTYPE 12 /* the header slot */
#define LLAMA_DTYPE_FP32 0
#define LLAMA_DTYPE_BF16 1
void llama_file_read_header(const char *path, LlamaConfig *cfg);
/* The header's Llama knobs, [11] tied and [16..23] (Mixtral's file keeps them in the same slots):
 * put writes them into h, get reads them into cfg (no check: the reader's). */
void llama_header_put_knobs(int32_t h[256], const LlamaConfig *cfg);
void llama_header_get_knobs(const int32_t h[256], LlamaConfig *cfg);
/* 1 when llmc's Llama file at path stores bf16 parameters (dies on a bad header). */
int llama_file_is_bf16(const char *path);
/* Reads the parameters (n = llama_parameter_specs' total; bf16 widened to fp32) after checking
 * the size, verifies "<path>.sum" when present, refuses non-finite weights naming the tensor. */
void llama_file_load(const char *path, float *params, size_t n);
/* Writes llmc's Llama checkpoint (fp32, or bf16 rounded to nearest even) atomically, then
 * "<path>.sum"; returns the file's CRC-32. Dies (writing nothing) on a non-finite weight.
 * llama_checkpoint_save is the fp32 one. */
uint32_t llama_checkpoint_write(const char *path, const LlamaConfig *cfg, const float *params, size_t n, int bf16);
uint32_t llama_checkpoint_save(const char *path, const LlamaConfig *cfg, const float *params, size_t n);

/* llm.c's Llama 3 file (its llama3 branch, train_llama3.py write_model): int32 header[256]
 *   [0] 20240803 (LLMC_LLAMA3_MAGIC)  [1] version 3 (fp32) or 5 (bf16)  [2] maxT  [3] V  [4] L
 *   [5] NH  [6] NKV  [7] C  [8] multiple_of  [9] use_scaled_rope  [10] major  [11] minor version
 * then float32 header[256]: [0] ffn_dim_multiplier  [1] norm eps  [2] rope theta; then the
 * tensors: wte (V, C) (not padded), ln_1 (L, C), c_attn (L, QKV, C), c_proj (L, C, C), ln_2 (L, C),
 * c_fc = up (L, F, C), c_fc2 = gate (L, F, C), mlp c_proj (L, C, F), ln_f (C), lm_head (V, C).
 * F is llama_ffn_hidden(C, multiplier, multiple_of); use_scaled_rope means llm.c's fixed Llama 3.1
 * scaling (factor 8, low 1, high 4, original 8192). The head is always stored: a tied model is
 * written with lm_head = wte and reads back untied (the same function). A model whose F, RoPE
 * scaling or eps/theta the header cannot express is refused when writing, naming what. */
#define LLMC_LLAMA3_MAGIC 20240803
void llmc_llama3_read_header(const char *path, LlamaConfig *cfg, int *version);
void llmc_llama3_load(const char *path, const LlamaConfig *cfg, float *params, size_t n);
/* Writes version 3 (fp32) or 5 (bf16, round to nearest even), atomically. */
void llmc_llama3_write(const char *path, const LlamaConfig *cfg, const float *params, size_t n, int bf16);

#ifdef __cplusplus
}
#endif
#endif
