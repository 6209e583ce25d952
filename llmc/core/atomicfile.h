/*
 * atomicfile.h - writes that never leave a half file behind.
 *
 * atomic_open() creates "<path>.tmp.<pid>" next to the target; the caller writes through
 * af.f (use fwriteCheck with af.tmp_path); atomic_commit() flushes, fsyncs, closes and
 * renames over <path> (then fsyncs the directory). atomic_abort() removes the temp file.
 * A crash at any point leaves either the old <path> or the new one, never a mix.
 * Every open temporary file is also removed when the process exits before committing it (an
 * error anywhere ends in exit(1): the atexit handler removes them), so only a kill -9 or a
 * power cut can leave one behind; atomic_remove_stale() cleans those up on the next start.
 * The target must be a regular file or not exist: atomic_open refuses (dies) to replace a
 * device, FIFO, socket or directory by renaming over it.
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

/* Removes "*.tmp.<pid>" files (and directories, atomic_dir_open's) in dir whose process <pid> no
 * longer exists (left by a kill -9 or a crash of an earlier run), of those whose entry name ours
 * accepts (NULL: every one). Returns how many were removed. */
int atomic_remove_stale(const char *dir, int (*ours)(const char *name));

/* The same for a directory of files (a Hugging Face model directory): atomic_dir_open() creates
 * "<path>.tmp.<pid>/", which the caller fills (atomic_open inside it: each file fsynced);
 * atomic_dir_commit() fsyncs it and renames it to <path>: an existing directory there is swapped
 * out in one step (renameat2 RENAME_EXCHANGE; where the filesystem lacks it, moved aside first)
 * and then removed. A reader sees the old directory or the new one, never a part. The temporary
 * directory is removed when the process exits before committing it, like a temporary file.
 * <path> must be a directory or not exist (atomic_dir_open dies otherwise); a trailing '/' is
 * ignored ("out/" is "out"). */
typedef struct {
    char path[4096];
    char tmp_path[4096 + 32];
} AtomicDir;

void atomic_dir_open(AtomicDir *ad, const char *path);
void atomic_dir_commit(AtomicDir *ad);
void atomic_dir_abort(AtomicDir *ad);
/* Removes path and everything under it; symbolic links are removed, never followed. A path that
 * does not exist is not an error. Returns 0, or -1 with errno set. */
int remove_tree(const char *path);

#ifdef __cplusplus
}
#endif
#endif
