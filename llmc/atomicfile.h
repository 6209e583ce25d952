/*
 * atomicfile.h - writes that never leave a half file behind.
 *
 * atomic_open() creates "<path>.tmp.<pid>" next to the target; the caller writes through
 * af.f (use fwriteCheck with af.tmp_path); atomic_commit() flushes, fsyncs, closes and
 * renames over <path> (then fsyncs the directory). atomic_abort() removes the temp file.
 * A crash at any point leaves either the old <path> or the new one, never a mix.
 */
#ifndef LLMC_ATOMICFILE_H
#define LLMC_ATOMICFILE_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE *f;
    char path[4096];
    char tmp_path[4096 + 32];
} AtomicFile;

void atomic_open(AtomicFile *af, const char *path);   /* dies with a clear message on failure */
void atomic_commit(AtomicFile *af);                    /* dies with a clear message on failure */
void atomic_abort(AtomicFile *af);

#ifdef __cplusplus
}
#endif
#endif
