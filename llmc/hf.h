/*
 * hf.h - Hugging Face model directories: config.json with model.safetensors (or the shards named
 * by model.safetensors.index.json). Read as a model by -e DIR (both trainers and ./generate,
 * through llmc/checkpoint.c), written beside each checkpoint with --save-hf 1, converted to and
 * from llm.c model files by ./hf_convert.
 *
 * Each architecture is one row of a table in hf.c: the name in config.json's "architectures",
 * a reader and a writer of its config.json, and its tensor map (HF key, HF shape in the config's
 * dimensions, stored transposed or not). GPT2LMHeadModel is the row today; LlamaForCausalLM
 * becomes one more row once the model has Llama blocks.
 *
 * GPT-2 (transformers' GPT2LMHeadModel):
 * - config.json: n_embd, n_layer, n_head, n_positions, vocab_size are required; what this model
 *   cannot represent is refused with a message naming the field: layer_norm_epsilon other than
 *   1e-5, activation_function other than gelu_new / gelu_pytorch_tanh (the tanh GELU), n_inner
 *   other than 4 * n_embd, scale_attn_weights false, scale_attn_by_inverse_layer_idx,
 *   add_cross_attention, tie_word_embeddings false, model_type other than gpt2.
 * - keys with the "transformer." prefix (save_pretrained) or without it (the original release),
 *   one style per directory. Conv1D weights (c_attn, c_proj, c_fc) are stored (in, out) and
 *   transposed into our (out, in). lm_head.weight may be absent (tied) or must equal wte. The
 *   stored causal-mask buffers h.N.attn.bias and h.N.attn.masked_bias are ignored. wte's V rows
 *   are padded with zero rows to Vp. Any other key, a missing key or a wrong shape is an error
 *   naming the key and its file. Weights must be finite.
 * - written: config.json, model.safetensors (F32, or BF16 with --checkpoint-bf16 1 / --dtype
 *   bf16) with "transformer." keys and no lm_head (tied, as save_pretrained writes it), and
 *   model.safetensors.sum (our CRC-32 file, checkpoint.h), verified on reading when present.
 */
#ifndef LLMC_HF_H
#define LLMC_HF_H

#include <stddef.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when path is a directory holding a config.json (anything else is not an HF directory). */
int hf_is_model_dir(const char *path);
/* The model configuration from dir/config.json; dies naming the file and field on anything
 * this model cannot represent. */
void hf_read_config(const char *dir, ModelConfig *cfg);
/* Loads dir's weights into params (numel floats laid out by model.h's table for the config).
 * Returns 1 when every weight was stored as BF16, else 0. Dies naming the key and file. */
int hf_load(const char *dir, float *params, size_t numel);
/* Writes dir as an HF directory (F32, or BF16 when bf16), atomically (atomicfile.h's
 * AtomicDir: a directory already there is replaced whole). Dies, writing nothing, on a
 * non-finite weight. */
void hf_save(const char *dir, const ModelConfig *cfg, const float *params, size_t numel, int bf16);
/* The HF directory written beside checkpoint step of a run: "<run_dir>/model_%08d_hf". */
void hf_checkpoint_dir(const char *run_dir, int step, char *out, size_t len);
/* --save-hf 1: writes that directory (hf_save) for the checkpoint of step. */
void hf_save_checkpoint(const char *run_dir, int step, const ModelConfig *cfg, const float *params, size_t numel,
                        int bf16);

#ifdef __cplusplus
}
#endif
#endif
