/*
 * sumfile.h - whole-file CRC-32 checksums and the "<path>.sum" files beside what we write.
 *
 * A checksum file "<path>.sum" is one line "llmc-sum 1 crc32 <8 hex> bytes <n>": the CRC-32
 * (zlib's) and size of the whole file at path. Written beside every model file and safetensors
 * file we save, verified on every load when present (a plain llm.c file has none).
 */
#ifndef LLMC_CORE_SUMFILE_H
#define LLMC_CORE_SUMFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* crc (0 to start) updated with n bytes at p: zlib's CRC-32. */
uint32_t sumfile_crc_update(uint32_t crc, const void *p, size_t n);
/* The size of the open file f in bytes (-1 when fstat fails). */
long long sumfile_size(FILE *f);
/* path opened for reading as a regular file; dies with "<what>: <why>" otherwise. */
FILE *sumfile_open_for_reading(const char *path, const char *what);
/* CRC-32 of the whole file at path (dies if it cannot be read). */
uint32_t sumfile_checksum(const char *path);
/* "<path>.sum" into out. */
void sumfile_path(const char *path, char *out, size_t len);
/* sumfile_read returns 1 with its crc and bytes, 0 when there is none, and dies if it exists but
 * is malformed; sumfile_write writes it atomically. */
int sumfile_read(const char *path, uint32_t *crc, long long *bytes);
void sumfile_write(const char *path, uint32_t crc, long long bytes);

#ifdef __cplusplus
}
#endif
#endif
