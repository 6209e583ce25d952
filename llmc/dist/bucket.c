/*
 * bucket.c - the shard and bucket arithmetic of ZeRO (see bucket.h).
 */
#include "llmc/dist/bucket.h"
#include "llmc/core/check.h"

#include <string.h>

void dist_shard(size_t n, int P, int r, size_t *lo, size_t *hi) {
    size_t s = (n + (size_t)P - 1) / (size_t)P;
    size_t a = s * (size_t)r, b = a + s;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

size_t dist_shard_floats(size_t n, int zero, int ranks, int rank) {
    size_t lo = 0, hi = n;
    if (zero >= 1) dist_shard(n, ranks, rank, &lo, &hi);
    /* at least one float each, so that a rank past the end (owning nothing) still has buffers */
    return hi - lo ? hi - lo : 1;
}

void bucket_add(Bucket *b, size_t off, size_t len) {
    if (b->n == BUCKET_MAX_SLICES) llmc_die("internal: a bucket holds at most %d slices", BUCKET_MAX_SLICES);
    if (b->n && off < b->off[b->n - 1] + b->len[b->n - 1]) llmc_die("internal: bucket slices out of order");
    b->off[b->n] = off;
    b->len[b->n++] = len;
    b->numel += len;
}

void bucket_of_layer(Bucket *b, const TensorSpec *specs, int num_specs, int l) {
    memset(b, 0, sizeof *b);
    for (int i = 0; i < num_specs; i++) {
        const TensorSpec *s = &specs[i];
        if (l < 0 && !s->layer_numel && s->numel) bucket_add(b, s->offset, s->numel);
        if (l >= 0 && s->layer_numel) bucket_add(b, s->offset + (size_t)l * s->layer_numel, s->layer_numel);
    }
}

void bucket_packing(const TensorSpec *specs, int num_specs, size_t *outer, size_t *layer, size_t *pos) {
    *outer = *layer = 0;
    for (int i = 0; i < num_specs; i++) {
        size_t *size = specs[i].layer_numel ? layer : outer;
        if (pos) pos[i] = *size;
        *size += specs[i].layer_numel ? specs[i].layer_numel : specs[i].numel;
    }
}

void bucket_part(const Bucket *b, size_t lo, size_t hi, size_t *pos, size_t *count) {
    *pos = *count = 0;
    for (int i = 0; i < b->n; i++) {
        size_t a;
        *pos += bucket_slice_in(b, i, 0, lo, &a);
        *count += bucket_slice_in(b, i, lo, hi, &a);
    }
}

void bucket_shard_copy(const Bucket *b, size_t lo, size_t hi, float *packed, float *shard, int add) {
    size_t k = 0; /* packed index of slice i's first element (add 1: of the run's first) */
    for (int i = 0; i < b->n; i++) {
        size_t a, n = bucket_slice_in(b, i, lo, hi, &a);
        if (add) {
            for (size_t j = 0; j < n; j++) shard[a - lo + j] += packed[k + j];
            k += n;
        } else {
            memcpy(packed + k + (a - b->off[i]), shard + (a - lo), n * sizeof(float));
            k += b->len[i];
        }
    }
}
