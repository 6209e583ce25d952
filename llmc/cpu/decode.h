/*
 * decode.h (CPU) - inference with a key/value cache: the forward pass of llmc/cpu/gpt2.c for
 * new tokens only, each attending to the keys and values kept from earlier positions, so that
 * generating one more token costs O(T) attention work instead of a whole O(T^2) forward.
 *
 * Math: the same ops, in the same order, as gpt2_forward for B = 1: position p's row of every
 * activation depends only on positions <= p, so running positions [len, len + n) against the
 * cached K/V of [0, len) gives the rows the full forward would give (up to the rounding of
 * matmuls over a different number of rows).
 *
 * Shapes: kv (L, maxT, 2C): per layer and position, its key then its value (C each, heads at
 * channels [h*HS, (h+1)*HS) as in qkv). Scratch rows are sized for max_chunk new tokens.
 */
#ifndef LLMC_CPU_DECODE_H
#define LLMC_CPU_DECODE_H

#include "llmc/cpu/gpt2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int len;        /* positions cached so far: the next token goes to position len */
    int max_len;    /* maxT */
    int max_chunk;  /* most new tokens per gpt2_forward_cached call */
    float *kv;      /* (L, maxT, 2C) */
    /* scratch, max_chunk rows each: residual (C), ln (C), qkv (3C), atty (C), proj (C),
     * fch (F), fch_gelu (F), logits (Vp), mean and rstd (1); att (NH, maxT) scores */
    float *residual, *ln, *qkv, *atty, *proj, *fch, *fch_gelu, *logits, *mean, *rstd, *att;
    float *memory;
} KVCache;

void kvcache_init(KVCache *cache, const GPT2 *model, int max_chunk);
void kvcache_free(KVCache *cache);
/* Forgets every cached position (the buffers stay). */
void kvcache_reset(KVCache *cache);

/* Runs tokens[0..n) at positions [cache->len, cache->len + n) and appends their keys and
 * values. Returns their logits, (n, Vp) in cache scratch (valid until the next call).
 * 1 <= n <= max_chunk and cache->len + n <= maxT, or it dies with a message. */
const float *gpt2_forward_cached(const GPT2 *model, KVCache *cache, const int *tokens, int n);

#ifdef __cplusplus
}
#endif
#endif
