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

#define MIXTRAL_FILE_ARCH 3 /* magic and version: modelfile.h's LLMC_FILE_MAGIC, LLMC_FILE_VERSION */
/* Read and written through llmcfile.h's llmc_file_* (mixtralfile.c's LlmcFileKind): the
 * parameters verified (size, "<path>.sum", finite), written atomically with "<path>.sum". */

#ifdef __cplusplus
}
#endif
#endif
