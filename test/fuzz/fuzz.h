/*
 * fuzz.h - what the libFuzzer targets in test/fuzz share (docs/FUZZING.md; build: mk/fuzz.mk).
 *
 * Each target is one file, fuzz_NAME.c, defining LLVMFuzzerTestOneInput; it feeds one parser of
 * outside data the fuzzer's bytes (through a file in a private temporary directory where the
 * parser reads files) and checks what the parser promises.
 *
 * The llmc code reports bad input by printing "error: ..." and calling exit(1) (llmc_die and the
 * *Check macros in llmc/core/check.h). Under the fuzzer that must not end the process, and the
 * parsers must run in-process for the coverage feedback to work. So the fuzz binaries are
 * linked with -Wl,--wrap for exit and for the calls that acquire something (heap blocks, FILEs,
 * file descriptors, mappings, glob results): fuzz_call() runs a parser, turns an exit() inside
 * it into a return, and then releases whatever the parser had acquired and not released, as
 * the process's exit would have. When the parser returns normally nothing is released for it:
 * a leak on a success path is a leak, and LeakSanitizer reports it.
 */
#ifndef LLMC_FUZZ_H
#define LLMC_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Runs fn(arg). Returns -1 when fn returns, or the status fn passed to exit(). */
int fuzz_call(void (*fn)(void *), void *arg);

/* Writes data to NAME in this process's temporary directory (created on first use, removed at
 * exit); the full path goes to path. Aborts if the write fails (a harness problem). */
void fuzz_write_file(const char *name, const void *data, size_t size, char *path, size_t pathlen);

/* What a file target's parser gets: the fuzzer's bytes and the file they were written to. */
typedef struct {
    const char *path;
    const uint8_t *data;
    size_t size;
} FuzzFile;

/* The body of a file target's LLVMFuzzerTestOneInput: writes data to NAME (fuzz_write_file) and
 * runs fn on a FuzzFile of it through fuzz_call. Returns 0 (libFuzzer's "keep going"). */
int fuzz_file_target(const char *name, const uint8_t *data, size_t size, void (*fn)(void *));

/* This process's temporary directory (created on first use). */
const char *fuzz_tmpdir(void);

/* Aborts with a message: a broken promise of the code under test (the fuzzer saves the input). */
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
