/*
 * hf.h - Hugging Face model directories: config.json with model.safetensors (or the shards named
 * by model.safetensors.index.json). Read as a model by -e DIR (both trainers and ./generate,
 * through llmc/formats/modelfile.c), written beside each checkpoint with --save-hf 1, converted to and
 * from llm.c model files by ./hf_convert.
 *
 * Each architecture is one row of a table in hf.c: the name in config.json's "architectures",
 * a reader and a writer of its config.json, and its tensor map (HF key, HF shape in the config's
 * dimensions, stored transposed or not, where its rows start in our tensor, RoPE row order).
 * GPT2LMHeadModel and LlamaForCausalLM are its rows.
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

#include "llmc/models/llama.h"
#include "llmc/models/mixtral.h"
#include "llmc/models/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when path is a directory holding a config.json (anything else is not an HF directory). */
int hf_is_model_dir(const char *path);
/* The model configuration from dir/config.json; dies naming the file and field on anything
 * this model cannot represent (a float field outside fp32's range included), and naming the
 * tensor when the safetensors headers do not hold its sizes (every key and shape is checked here,
 * before the caller allocates anything of the model's size; hf_read_llama_config does the same). */
void hf_read_config(const char *dir, ModelConfig *cfg);
/* Loads dir's weights into params (numel floats laid out by model.h's table for the config).
 * Returns 1 when every weight was stored as BF16, else 0. Dies naming the key and file. */
int hf_load(const char *dir, float *params, size_t numel);
/* Writes dir as an HF directory (F32, or BF16 when bf16), atomically (atomicfile.h's
 * AtomicDir: a directory already there is replaced whole). Dies, writing nothing, on a
 * non-finite weight. */
void hf_save(const char *dir, const ModelConfig *cfg, const float *params, size_t numel, int bf16);
/* Llama (transformers' LlamaForCausalLM): config.json's hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, max_position_embeddings, vocab_size (required),
 * num_key_value_heads, head_dim (= hidden_size / heads), rms_norm_eps (default 1e-6), rope_theta
 * (default 10000), rope_scaling (null or type "llama3"), tie_word_embeddings (default false);
 * hidden_act silu, no attention/mlp bias. Keys "model." + embed_tokens, layers.N.{input_layernorm,
 * self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm; lm_head.weight
 * when untied. q_proj/k_proj rows are in HF's rotate-half order (per head: the first, then the
 * second element of every pair); ours pairs channels (2i, 2i+1) (llmc/cpu/rope.h), so those rows
 * are permuted on reading and writing. Written as one model.safetensors, or above 5 GB as shards
 * model-0000i-of-0000n.safetensors with model.safetensors.index.json (LLMC_HF_SHARD_BYTES sets
 * the limit). hf_read_llama_config returns 1 and fills cfg when dir is an HF Llama directory, 0
 * for any other path; hf_llama_load returns 1 when every weight was BF16. */
int hf_read_llama_config(const char *dir, LlamaConfig *cfg);
int hf_llama_load(const char *dir, const LlamaConfig *cfg, float *params, size_t numel);
void hf_llama_save(const char *dir, const LlamaConfig *cfg, const float *params, size_t numel, int bf16);
/* hf_llama_save for a model read from the HF directory source (./hf_convert HF -> HF): its
 * config.json fields that the writer does not set are kept and its tokenizer files copied, as
 * hf_llama_save_checkpoint does. */
void hf_llama_save_from(const char *dir, const LlamaConfig *cfg, const float *params, size_t numel, int bf16,
                        const char *source);
/* --save-hf 1: writes the HF directory beside the checkpoint of step (rundir.h's rundir_hf_dir) as
 * hf_save does. When source (the run's -e) is an HF directory of the same architecture, the fields
 * of its config.json that the writer does not set (bos_token_id, eos_token_id, ...) are kept. */
void hf_save_checkpoint(const char *run_dir, int step, const ModelConfig *cfg, const float *params, size_t numel,
                        int bf16, const char *source);
/* The tokenizer files --save-hf copies from a Llama run's HF directory (relative paths; NULL ends). */
extern const char *const hf_tokenizer_files[];
/* --save-hf 1 for a Llama (both trainers): writes that directory (hf_llama_save) for the checkpoint
 * of step, with the hf_tokenizer_files that source (the run's -e) holds when it is an HF directory,
 * copied byte for byte inside the same atomic directory (complete or absent), and its config.json
 * fields that the writer does not set, as hf_save_checkpoint. When it copies none, says once on
 * stdout how to add them. */
void hf_llama_save_checkpoint(const char *run_dir, int step, const LlamaConfig *cfg, const float *params, size_t numel,
                              int bf16, const char *source);
/* --save-hf 1, at startup (both trainers, before any step or run directory): when source (-e) is
 * an HF Llama directory, every hf_tokenizer_files name it holds must be a regular file (and
 * "original" a directory), or it dies naming the file and what it is (a FIFO, a directory, a
 * symbolic link loop): the copy at the first checkpoint can then neither block nor fail late. */
void hf_check_save_source(const char *source);

/* Mixtral (transformers' MixtralForCausalLM): the Llama's config.json fields, tensors and rules
 * (above), plus num_local_experts (required), num_experts_per_tok (default 2, at most the
 * experts), router_aux_loss_coef (default 0.001, finite, >= 0), output_router_logits (default
 * false) and sliding_window (null, or at least max_position_embeddings: the attention is full);
 * keys model.layers.L.block_sparse_moe.gate.weight (E, C) and
 * model.layers.L.block_sparse_moe.experts.K.w1 / w3 (F, C), w2 (C, F). A missing or mis-shaped
 * expert tensor is an error naming the key and the file. hf_read_mixtral_config: 1 and cfg filled
 * for an HF Mixtral directory, 0 for any other path. --save-hf 1 copies the source's tokenizer files
 * as the Llama's does (without its note). */
int hf_read_mixtral_config(const char *dir, MixtralConfig *cfg);
int hf_mixtral_load(const char *dir, const MixtralConfig *cfg, float *params, size_t numel);
void hf_mixtral_save(const char *dir, const MixtralConfig *cfg, const float *params, size_t numel, int bf16);
void hf_mixtral_save_checkpoint(const char *run_dir, int step, const MixtralConfig *cfg, const float *params,
                                size_t numel, int bf16, const char *source);

#ifdef __cplusplus
}
#endif
#endif
