/*
 * mixtralfile.h - the Mixtral checkpoint file (llmc's Llama file family) and its ModelArch entry
 * (mixtral_arch). The HF MixtralForCausalLM directory is hf.h's.
 *
 * int32 header[256] then the table's tensors (llmc/models/mixtral.h) as float32 or bfloat16:
 * slots 0..23 as llmc's Llama file (llamafile.h) with [2] architecture 3 (Mixtral), plus
 *   [24] E (experts)  [25] top-k  [26] output_router_logits (0/1)  [27] router_aux_loss_coef (float32)
 * Llama files (architecture 1) are unchanged. Bad header fields are errors naming the file.
 */
#ifndef LLMC_FORMATS_MIXTRALFILE_H
#define LLMC_FORMATS_MIXTRALFILE_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/formats/arch.h"
#include "llmc/models/mixtral.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MIXTRAL_FILE_MAGIC 20261130
#define MIXTRAL_FILE_VERSION 1
#define MIXTRAL_FILE_ARCH 3

/* 1 when path is a regular file with the Mixtral magic and architecture. */
int mixtral_file_is_mine(const char *path);
/* The header into cfg (dies naming the file on a bad field); returns 1 when the parameters are bf16. */
int mixtral_file_read_header(const char *path, MixtralConfig *cfg);
/* The parameters (n = the table's total), verified (size, "<path>.sum", finite); returns bf16. */
int mixtral_file_load(const char *path, float *params, size_t n);
/* Writes the checkpoint atomically with "<path>.sum"; returns its CRC-32. */
uint32_t mixtral_file_write(const char *path, const MixtralConfig *cfg, const float *params, size_t n, int bf16);

#ifdef __cplusplus
}
#endif
#endif
