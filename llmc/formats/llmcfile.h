/*
 * llmcfile.h - an architecture's llmc checkpoint file over modelfile.h's llmc header, read and
 * written through its ModelArch entry (mlpfile.c's and mixtralfile.c's files).
 */
#ifndef LLMC_FORMATS_LLMCFILE_H
#define LLMC_FORMATS_LLMCFILE_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/formats/arch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An architecture's llmc checkpoint file (mlpfile.h's, mixtralfile.h's): modelfile.h's llmc header with
 * magic LLMC_FILE_MAGIC, version LLMC_FILE_VERSION and architecture `arch`, then the parameter
 * table's tensors as float32 or bfloat16 (1024 + numel * (4 or 2) bytes), "<path>.sum" beside it.
 * model: the architecture's entry (its display name in messages, config_validate, parameter_specs).
 * get: the architecture's slots (11 on) into c, whose shape is read; returns what is wrong with
 * slot 11, tied (NULL: nothing). put: slot 11 and the architecture's slots of h from c (slots 0..10
 * and 12 are written). */
typedef struct {
    const ModelArch *model;
    int32_t arch; /* slot 2 */
    const char *(*get)(const int32_t h[256], ArchConfig *c);
    void (*put)(int32_t h[256], const ArchConfig *c);
} LlmcFileKind;
/* 1 when path is a regular file with the magic and k's architecture (a FIFO is never opened; nothing
 * else is checked: the Llama family shares the magic). */
int llmc_file_is_mine(const LlmcFileKind *k, const char *path);
/* A config_from_init's file: 1 with c read from the header when init is k's file, else 0. */
int llmc_file_config_from(const LlmcFileKind *k, const char *init, ArchConfig *c);
/* The header at path as k->model's config in c; returns 1 when its parameters are bf16. Dies naming
 * the file and the field on a bad header ("'<path>': invalid <display> checkpoint header: ..."). */
int llmc_file_read_header(const LlmcFileKind *k, const char *path, ArchConfig *c);
/* The parameters (n = the table's total; bf16 widened to fp32) after checking the size; verifies
 * "<path>.sum" when present, refuses non-finite weights naming the tensor. Returns 1 when they
 * were stored as bf16. */
int llmc_file_load(const LlmcFileKind *k, const char *path, float *params, size_t n);
/* Writes the file (fp32, or bf16 rounded to nearest even) atomically, then "<path>.sum"; returns
 * the file's CRC-32. Dies (writing nothing) on a non-finite weight or an n that does not fit. */
uint32_t llmc_file_write(const LlmcFileKind *k, const char *path, const ArchConfig *c, const float *params, size_t n,
                         int bf16);

#ifdef __cplusplus
}
#endif
#endif
