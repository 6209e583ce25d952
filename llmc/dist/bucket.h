/*
 * bucket.h - the shard and bucket arithmetic of ZeRO (no communication: dist.h moves the data).
 *
 * Shards: N elements over P ranks, rank r owns [r*S, min((r+1)*S, N)) with S = ceil(N / P);
 * ranks past the end own nothing. Any N on any P (no padding stored, the collectives take per-rank
 * counts).
 */
#ifndef LLMC_DIST_BUCKET_H
#define LLMC_DIST_BUCKET_H

#include <stddef.h>

#include "llmc/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shard of rank r: [*lo, *hi). */
void dist_shard(size_t n, int P, int r, size_t *lo, size_t *hi);

/* Floats of a rank's per-shard buffers (AdamW m and v, the -z >= 2 gradient shard, the -z 3
 * parameter shard) at ZeRO level zero: all n below level 1, else rank's shard of n over ranks; at
 * least 1, so that a rank past the end (owning nothing) still has buffers. The plan's and the
 * optimizer's one rule. */
size_t dist_shard_floats(size_t n, int zero, int ranks, int rank);

/* ---- buckets (ZeRO-2/3: gradients reduced and parameters gathered a group of tensors at a time) ----
 * A bucket is a list of slices of the flat parameter array in increasing offset order, packed
 * back to back in a buffer. Rank r's part of it (the elements in r's shard) is then one
 * contiguous run of the packed buffer: [pos, pos + count). */
enum { BUCKET_MAX_SLICES = 32 };
typedef struct {
    int n;
    size_t off[BUCKET_MAX_SLICES], len[BUCKET_MAX_SLICES];
    size_t numel; /* packed length */
} Bucket;
void bucket_add(Bucket *b, size_t off, size_t len);
/* Slice i of b within the flat range [lo, hi): its first flat index there in *a, its length returned
 * (0: none of it). */
static inline size_t bucket_slice_in(const Bucket *b, int i, size_t lo, size_t hi, size_t *a) {
    const size_t e = b->off[i] + b->len[i] < hi ? b->off[i] + b->len[i] : hi;
    *a = b->off[i] > lo ? b->off[i] : lo;
    return e > *a ? e - *a : 0;
}
/* The bucket of layer l (every stacked tensor's layer-l slice) or, l < 0, the outer bucket (the
 * non-empty tensors kept once: GPT-2's wte, wpe, lnfw, lnfb), in table order = flat offset order. */
void bucket_of_layer(Bucket *b, const TensorSpec *specs, int num_specs, int l);
/* The packed sizes of the outer bucket and of one layer's bucket; pos (may be NULL): each tensor's
 * place in its packed bucket. */
void bucket_packing(const TensorSpec *specs, int num_specs, size_t *outer, size_t *layer, size_t *pos);
/* The packed run [*pos, *pos + *count) of b whose flat indices lie in [lo, hi). */
void bucket_part(const Bucket *b, size_t lo, size_t hi, size_t *pos, size_t *count);
/* For every element of b with flat index in [lo, hi): shard[i - lo] += packed[k] (add 1, with
 * packed starting at this run's first element) or packed[k] = shard[i - lo] (add 0, packed the
 * whole bucket). */
void bucket_shard_copy(const Bucket *b, size_t lo, size_t hi, float *packed, float *shard, int add);

#ifdef __cplusplus
}
#endif
#endif
