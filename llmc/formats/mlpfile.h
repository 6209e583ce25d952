/*
 * mlpfile.h - the MLP-only test architecture's checkpoint file and its ModelArch entry
 * (mlp_arch, arch.h's interface over llmc/models/mlp.h).
 *
 * The file is llmc's own header idea (the Llama's, llmc/models/llama.h) with its own
 * architecture id: int32 header[256] then the table's tensors as float32 or bfloat16.
 *   [0] 20261130 (MLP_FILE_MAGIC, shared with the Llama file)  [1] version 1
 *   [2] architecture 2 (MLP_FILE_ARCH; 1 is the Llama's)  [3] maxT  [4] V  [5] Vp  [6] L
 *   [7] NH = 1  [8] NKV = 1  [9] C  [10] F  [11] tied = 1 (the head is wte; nothing else stored)
 *   [12] dtype of the parameters: 0 float32, 1 bfloat16 (round to nearest even)
 *   float32 in an int32 slot: [16] norm eps. Every other slot is 0.
 * The file size must be exactly 1024 + numel * (4 or 2). Written atomically with "<path>.sum"
 * (modelfile.h's model_file_write), verified on load when present. A bad header field is a clear
 * error naming the file (exit 1).
 */
#ifndef LLMC_FORMATS_MLPFILE_H
#define LLMC_FORMATS_MLPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/formats/arch.h"
#include "llmc/models/mlp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLP_FILE_MAGIC 20261130
#define MLP_FILE_VERSION 1
#define MLP_FILE_ARCH 2
#define MLP_FILE_HEADER_BYTES 1024

/* 1 when path is a regular file with MLP_FILE_MAGIC and architecture MLP_FILE_ARCH (nothing
 * else is checked: the Llama's file shares the magic and is not this architecture's). */
int mlp_file_is_mine(const char *path);
/* The header of the MLP file at path into cfg; returns 1 when its parameters are bf16. Dies on a
 * bad header, naming the file and the field. */
int mlp_file_read_header(const char *path, MlpConfig *cfg);
/* The parameters (n = mlp_parameter_specs' total; bf16 widened to fp32), after checking the size;
 * verifies "<path>.sum" when present, refuses non-finite weights naming the tensor. Returns 1
 * when they were stored as bf16. */
int mlp_file_load(const char *path, float *params, size_t n);
/* Writes the file (fp32, or bf16 rounded to nearest even) atomically, then "<path>.sum"; returns
 * the file's CRC-32. Dies (writing nothing) on a non-finite weight or an n that does not fit. */
uint32_t mlp_file_write(const char *path, const MlpConfig *cfg, const float *params, size_t n, int bf16);

/* The architecture table entry: name "mlp", descriptors "mlp:dN" and its own files; no Hugging
 * Face format (hf_architecture NULL; save_hf and save_hf_checkpoint die saying so). It must stand
 * before llama3_arch in the registry: the Llama reader refuses an architecture id it does not know. */
extern const ModelArch mlp_arch;

#ifdef __cplusplus
}
#endif
#endif
