/*
 * mlpfile.h - the MLP-only test architecture's checkpoint file and its ModelArch entry
 * (mlp_arch, arch.h's interface over llmc/models/mlp.h).
 *
 * The file is llmc's own header idea (the Llama's, llmc/models/llama.h) with its own
 * architecture id: int32 header[256] then the table's tensors as float32 or bfloat16.
 *   [0] 20261130 (LLMC_FILE_MAGIC, shared with the Llama file)  [1] version 1
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

#define MLP_FILE_ARCH 2 /* magic and version: modelfile.h's LLMC_FILE_MAGIC, LLMC_FILE_VERSION */

/* The file is read and written through llmcfile.h's llmc_file_* (mlpfile.c's LlmcFileKind):
 * is_mine takes a regular file with the magic and architecture 2 (the Llama's file shares the
 * magic and is not this architecture's); a bad header dies naming the file and the field; a load
 * checks the size, "<path>.sum" when present and refuses non-finite weights naming the tensor. */

/* The architecture table entry: name "mlp", descriptors "mlp:dN" and its own files; no Hugging
 * Face format (hf_architecture NULL; save_hf and save_hf_checkpoint die saying so). It must stand
 * before llama3_arch in the registry: the Llama reader refuses an architecture id it does not know. */
extern const ModelArch mlp_arch;

#ifdef __cplusplus
}
#endif
#endif
