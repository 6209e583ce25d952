/*
 * checkpoint.h - model files (llm.c's format) and our training-state files.
 *
 * Model file (magic 20240326): int32 header[256] = {magic, version, maxT, V, L, NH, C, Vp, 0...},
 * then the parameters in table order (model.h), fp32 for version 3, bf16 for version 5.
 * The file size must be exactly 1024 + numel * (4 or 2).
 *
 * State file (magic 20261130, version 1): everything besides the weights that a bit-exact
 * resume needs. int32 header[256]:
 *   [0] magic [1] version [2] step (optimizer steps done) [3..4] numel (int64, lo/hi)
 *   [5] B [6] T [7] processes [8] rank [9] shuffle [10..11] seed (uint64)
 *   [12..27] dataloader state (8 x int64: epoch, shard, batch, 5 fingerprint words)
 *   [28..29] sampler RNG state (uint64) [30] 1 (AdamW moments follow)
 *   [32..39] backend state (4 x int64, 0 = none; the CUDA trainer keeps its fp16 loss scaler here)
 *   (version 2) [40] CRC-32 of the model file of the same step, [41] 1 = [40] is set,
 *   [42] CRC-32 of this file (header with [42] = 0, then m and v)
 * then AdamW m[numel] and v[numel] in fp32. Version 1 files (no checksums) still load.
 * Version 3 (the same layout): one file for the whole run (rank 0's, whatever the number of
 * ranks: m and v whole), and the dataloader position counts optimizer steps (one batch = -d
 * tokens, dataloader.h: data-parallel split); versions 1-2 counted micro-batches of B*T*processes
 * tokens, so they resume only where that equals -d (no accumulation). [5] B and [7] processes
 * record how the run was split, for the resume note.
 * --optim-state bf16/int8 runs write the same format: their moments decoded to fp32 (optim.h).
 * Checksum file "<model>.sum" (ours, one line "llmc-sum 1 crc32 <8 hex> bytes <n>"): the CRC-32
 * (zlib's) of the whole model file, written beside every model file we save and verified on
 * every load when present (a plain llm.c file has none and loads unverified).
 * Directory layout in -o: model_%08d.bin, state_%08d_%05d.bin (per rank), DONE_%08d written
 * last (it holds the resolved configuration as text); only steps with a DONE file are complete.
 * Every file is written atomically.
 */
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

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
#define STATE_MAGIC 20261130
#define STATE_VERSION 3

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

typedef struct {
    int step;
    size_t numel;
    int B, T, processes, rank, shuffle;
    uint64_t seed;
    int64_t loader[8];
    uint64_t sampler_rng;
    int64_t backend[4];
    uint32_t model_crc;  /* CRC-32 of the model file saved with this state */
    int has_model_crc;   /* 0: unknown (version 1 file) */
    int version;         /* as read */
} TrainState;

void state_file_save(const char *path, const TrainState *st, const float *m, const float *v);
/* Reads the header into st and the moments into m, v (numel floats each; NULL to skip). */
void state_file_load(const char *path, TrainState *st, float *m, float *v, size_t expect_numel);

/* Checkpoint directory helpers. */
void checkpoint_paths(const char *dir, int step, int rank, char *model, char *state, char *done, size_t len);
int checkpoint_latest_step(const char *dir);  /* highest step with a DONE file, or -1 */
/* Writes DONE_<step> holding text: the run's resolved configuration (cli.h's
 * train_config_to_text), which a resume compares with its own. */
void checkpoint_mark_done(const char *dir, int step, const char *text);
/* The text of DONE_<step> (malloc'd, NUL-terminated; free it), or NULL when the marker is empty
 * (written by llm.c or an older llmc) or unreadable. */
char *checkpoint_read_done(const char *dir, int step);
/* Deletes complete checkpoints beyond the newest `keep`, sparing multiples of `major` and the
 * step `protect` (the newest checkpoint known to be healthy; -1 = none). */
void checkpoint_prune(const char *dir, int keep, int major, int rank, int protect);

#ifdef __cplusplus
}
#endif
#endif
