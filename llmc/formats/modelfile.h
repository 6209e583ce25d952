/*
 * modelfile.h - GPT-2's model file (llm.c's format) and the pieces any model file is made of
 * (a header, parameters fp32 or bf16, "<path>.sum": llmc/core/sumfile.h).
 *
 * Model file (magic 20240326): int32 header[256] = {magic, version, maxT, V, L, NH, C, Vp, 0...},
 * then the parameters in table order (model.h), fp32 for version 3, bf16 for version 5.
 * The file size must be exactly 1024 + numel * (4 or 2).
 *
 * Checksum file "<model>.sum" (ours, one line "llmc-sum 1 crc32 <8 hex> bytes <n>"): the CRC-32
 * (zlib's) of the whole model file, written beside every model file we save and verified on
 * every load when present (a plain llm.c file has none and loads unverified).
 */
#ifndef LLMC_FORMATS_MODELFILE_H
#define LLMC_FORMATS_MODELFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmc/core/dtype.h"
#include "llmc/core/sumfile.h"
#include "llmc/models/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5

/* Reads and validates a model file's header and size; dies with a message naming the file. */
void model_file_read_header(const char *path, ModelConfig *cfg, int *version);
/* Loads the parameters (converting bf16 to fp32) into params (numel floats, laid out by the
 * table for the file's config). Verifies the file against "<path>.sum" when that exists and
 * dies on a mismatch or on any non-finite weight. */
void model_file_load(const char *path, float *params, size_t numel);
/* Writes params as version 3 (fp32) or 5 (bf16, round to nearest even), atomically, then its
 * checksum file "<path>.sum"; returns the file's CRC-32. Dies (writing nothing) if a weight is
 * not finite. */
uint32_t model_file_save(const char *path, const ModelConfig *cfg, const float *params, size_t numel, int version);
/* The pieces any model file (GPT-2's above, llmc's Llama file) is made of: a header, then numel
 * parameters as fp32 or bf16 (round to nearest even when writing), then "<path>.sum".
 * model_file_write: refuses (dies, writing nothing) a non-finite weight; writes header and
 * parameters atomically, then the checksum file; returns the file's CRC-32.
 * model_file_read_params: checks the file's size against header_bytes + numel * (4 or 2) (a
 * truncated file is an error saying so), reads the parameters, verifies "<path>.sum" when it
 * exists (else a note), and dies on a non-finite weight naming its tensor in specs[0..nspecs).
 * model_params_write/read: the parameter bytes alone (crc: updated with them; NULL: none). */
uint32_t model_file_write(const char *path, const void *header, size_t header_bytes, const float *params, size_t numel,
                          int bf16);
void model_file_read_params(const char *path, size_t header_bytes, float *params, size_t numel, int bf16,
                            const TensorSpec *specs, int nspecs);
void model_params_write(FILE *f, const char *path, const float *params, size_t numel, int bf16, uint32_t *crc);
void model_params_read(FILE *f, const char *path, float *params, size_t numel, int bf16, uint32_t *crc);
/* llmc's own model file header (magic 20261130: llamafile.h's Llama 3, mlpfile.h's MLP, mixtralfile.h's
 * Mixtral): int32 h[256]
 *   [0] magic  [1] version  [2] architecture  [3] maxT  [4] V  [5] Vp  [6] L  [7] NH  [8] NKV  [9] C
 *   [10] F  [11] tied  [12] dtype (0 float32, 1 bfloat16); the slots from 13 on are the architecture's.
 * llmc_header_put: h all zero, then slots 0..12 from the arguments and *b (bf16: dtype 1, else 0).
 * llmc_header_get_shape: b's maxT, V, Vp, L, NH, NKV, C, F from slots 3..10 (the rest of *b as it was;
 * checking the other slots is the architecture's). */
void llmc_header_put(int32_t h[256], int32_t magic, int32_t version, int32_t arch, const ModelConfig *b, int32_t tied,
                     int bf16);
void llmc_header_get_shape(const int32_t h[256], ModelConfig *b);
#define LLMC_FILE_MAGIC 20261130
#define LLMC_FILE_VERSION 1

/* Config fields kept in llmc header slots: each a 4-byte int32 or float32 at offset in the config
 * struct, stored as its bytes in h[slot]. put: h[slot] from the config; get: the config from h. */
typedef struct {
    int slot;
    size_t offset;
} LlmcHeaderField;
void llmc_header_put_fields(int32_t h[256], const LlmcHeaderField *fields, int n, const void *cfg);
void llmc_header_get_fields(const int32_t h[256], const LlmcHeaderField *fields, int n, void *cfg);
/* (an architecture's whole file over this header: llmcfile.h) */


#ifdef __cplusplus
}
#endif
#endif
