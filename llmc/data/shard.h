/*
 * shard.h - token shard files (llm.c's format and its 32-bit variant).
 *
 * Layout: int32 header[256], then ntok tokens.
 *   header[0] magic: 20240520 (uint16 tokens, version 1) or 20240801 (uint32 tokens, version 7)
 *   header[1] version, header[2] ntok (tokens in this shard; < 2^31 per shard)
 * File size must be exactly 1024 + ntok * token_bytes. All offsets are 64-bit.
 */
#ifndef LLMC_SHARD_H
#define LLMC_SHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define SHARD_MAGIC_U16 20240520
#define SHARD_VERSION_U16 1
#define SHARD_MAGIC_U32 20240801
#define SHARD_VERSION_U32 7

typedef struct {
    int token_bytes;  /* 2 or 4 */
    size_t ntok;      /* number of tokens after the header */
} ShardInfo;

/* Reads and validates the header and the file size against it. On any problem
 * returns -1 and writes a one-line reason naming the file into err (if non-NULL). */
int shard_read_header(const char *path, ShardInfo *info, char *err, size_t errlen);

/* Writes tokens as a shard, atomically. token_bytes 2 or 4; dies (naming the file) if a
 * token does not fit in token_bytes or the write fails. */
void shard_write(const char *path, const uint32_t *tokens, size_t ntok, int token_bytes);

#ifdef __cplusplus
}
#endif
#endif
