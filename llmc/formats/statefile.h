/*
 * statefile.h - the training-state file beside each model checkpoint.
 *
 * State file (magic 20261130, version 1): everything besides the weights that a bit-exact
 * resume needs. int32 header[256]:
 *   [0] magic [1] version [2] step (optimizer steps done) [3..4] numel (int64, lo/hi)
 *   [5] B [6] T [7] processes [8] rank [9] shuffle [10..11] seed (uint64)
 *   [12..27] dataloader state (8 x int64: epoch, shard, batch, 5 fingerprint words)
 *   [28..29] sampler RNG state (uint64) [30] the optimizer state that follows: 1 AdamW's m and v,
 *   2 Adafactor's (the same two numel-float arrays: llmc/train/adafactor.h says what they hold)
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
 * Version 4 (a --grad-compression run on several ranks; others still write version 3): the same,
 * plus [43] the scheme (llmc/train/gradcomp.h's GradCompKind) [44] its parameter (topk: FRAC's
 * fp32 bits) [45] ranks R [46..47] floats per rank K (int64) [48..49] shared floats S (int64:
 * powersgd's warm-started Q), and after v the ranks' error-feedback residuals, R x K floats in rank
 * order, then the S shared floats (all in the checksum).
 */
#ifndef LLMC_FORMATS_STATEFILE_H
#define LLMC_FORMATS_STATEFILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STATE_MAGIC 20261130
#define STATE_VERSION 4


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
    int optimizer;       /* [30]: 1 AdamW (also 0 when saving), 2 Adafactor */
    /* version 4: the error-feedback residuals (gc_ranks 0: none). Saving: gc_data is the caller's;
     * state_file_load allocates it (gc_ranks x gc_floats floats; the caller frees it). */
    int gc_kind, gc_ranks;
    int32_t gc_param;
    size_t gc_floats, gc_shared; /* floats per rank, shared floats after them */
    float *gc_data;              /* gc_ranks x gc_floats + gc_shared floats */
} TrainState;

void state_file_save(const char *path, const TrainState *st, const float *m, const float *v);
/* The same file from the moments in pieces, so that no whole fp32 copy of m and v need exist
 * (compact optimizer states are decoded a chunk at a time): moment returns elements [offset,
 * offset + count) of m (is_v 0) or v as floats, either a pointer into its own memory or scratch
 * (count floats) filled; offset is a multiple of STATE_CHUNK and count is STATE_CHUNK but at the
 * end. Byte-identical to state_file_save of the whole arrays; the scratch (STATE_CHUNK floats) is
 * the only memory it allocates. */
enum { STATE_CHUNK = 1 << 16 };
typedef const float *(*StateMomentFn)(void *ctx, int is_v, size_t offset, size_t count, float *scratch);
void state_file_save_chunks(const char *path, const TrainState *st, StateMomentFn moment, void *ctx);
/* Reads the header into st and the moments into m, v (numel floats each; NULL to skip). */
void state_file_load(const char *path, TrainState *st, float *m, float *v, size_t expect_numel);

#ifdef __cplusplus
}
#endif
#endif
