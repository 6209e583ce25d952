/*
 * check.h - the one family of failure reports used everywhere.
 *
 * Two kinds of failure:
 *  - llmc_die(): the user gave us something wrong (a flag, a file). Prints
 *    "error: <message>" and exits with status 1. Never a crash, never an assert.
 *  - the *Check macros: a call that must not fail did fail (fopen, malloc, fread).
 *    They print the statement, function, file and line, and a HINT on how to fix
 *    it, then exit with status 1.
 * No macro here hides a return; all multi-statement macros are do { } while (0).
 */
#ifndef LLMC_CHECK_H
#define LLMC_CHECK_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define LLMC_NORETURN __attribute__((noreturn))
#define LLMC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LLMC_NORETURN
#define LLMC_PRINTF(a, b)
#endif

/* "error: <fmt>" on stderr in one write() ("error: rank N: <fmt>" once llmc_set_error_rank said
 * several ranks run), exit(1). For bad user input. */
void llmc_die(const char *fmt, ...) LLMC_PRINTF(1, 2) LLMC_NORETURN;
/* For a function that reports failure in its caller's buffer: fmt formatted into err[0..errlen)
 * (nothing written when err is NULL or errlen 0); returns -1, the failure to return. */
int errf(char *err, size_t errlen, const char *fmt, ...) LLMC_PRINTF(3, 4);
/* This process's rank among ranks: fatal messages then start "rank N: " (dist_init calls it). */
void llmc_set_error_rank(int rank, int ranks);

/* The generator behind every *Check macro: reports what failed, where, and a hint. */
void llmc_check_failed(const char *statement, const char *detail, const char *hint,
                       const char *func, const char *file, int line) LLMC_NORETURN;

/* Checked wrappers: each returns only on success. `path` names the file in messages. */
FILE *fopen_check(const char *path, const char *mode, const char *func, const char *file, int line);
void fread_check(void *dst, size_t size, size_t count, FILE *f, const char *path,
                 const char *func, const char *file, int line);
void fwrite_check(const void *src, size_t size, size_t count, FILE *f, const char *path,
                  const char *func, const char *file, int line);
void *malloc_check(size_t bytes, const char *what, const char *func, const char *file, int line);
void *calloc_check(size_t count, size_t size, const char *what, const char *func, const char *file, int line);

/* Opens path for reading only if it is a regular file: a FIFO, device or directory is refused
 * instead of blocking in open() or reading forever (opened O_NONBLOCK, checked with fstat, then
 * switched back to blocking reads). Returns NULL with a one-line reason naming the file in err. */
FILE *fopen_regular(const char *path, char *err, size_t errlen);
/* What is at path, for a file a program will read (never blocks: fopen_regular's test): 1 a
 * regular file it can open, 0 nothing (not even a dangling symbolic link), -1 something it cannot
 * read (a FIFO, a directory, a device, a symbolic link loop or to nothing, no permission), with a
 * one-line reason naming the file in err. */
int regular_file_status(const char *path, char *err, size_t errlen);
/* "a FIFO", "a directory", "a character device", ... for messages. */
const char *file_kind_name(unsigned mode);

#define fopenCheck(path, mode) fopen_check((path), (mode), __func__, __FILE__, __LINE__)
#define freadCheck(dst, size, count, f, path) \
    fread_check((dst), (size), (count), (f), (path), __func__, __FILE__, __LINE__)
#define fwriteCheck(src, size, count, f, path) \
    fwrite_check((src), (size), (count), (f), (path), __func__, __FILE__, __LINE__)
#define mallocCheck(bytes, what) malloc_check((bytes), (what), __func__, __FILE__, __LINE__)
#define callocCheck(count, size, what) calloc_check((count), (size), (what), __func__, __FILE__, __LINE__)

/* An internal invariant that user input cannot break; reported like the others. */
#define llmcCheck(cond, hint) \
    do { \
        if (!(cond)) llmc_check_failed(#cond, "invariant violated", (hint), __func__, __FILE__, __LINE__); \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* LLMC_CHECK_H */
