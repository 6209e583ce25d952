#define _POSIX_C_SOURCE 200809L
#include "atomicfile.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <unistd.h>

void atomic_open(AtomicFile *af, const char *path) {
    if (strlen(path) >= sizeof af->path) llmc_die("output path too long: '%s'", path);
    snprintf(af->path, sizeof af->path, "%s", path);
    snprintf(af->tmp_path, sizeof af->tmp_path, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) llmc_die("cannot create '%s': %s", af->tmp_path, strerror(errno));
}

static void fsync_parent_dir(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int fd = open(dirname(dir), O_RDONLY);
    if (fd >= 0) {
        fsync(fd); /* best effort: some filesystems refuse fsync on directories */
        close(fd);
    }
}

void atomic_commit(AtomicFile *af) {
    int bad = fflush(af->f) != 0 || ferror(af->f) || fsync(fileno(af->f)) != 0;
    int err = errno;
    if (fclose(af->f) != 0) bad = 1, err = errno;
    af->f = NULL;
    if (bad) {
        unlink(af->tmp_path);
        llmc_die("writing '%s' failed: %s (nothing was replaced)", af->path, strerror(err));
    }
    if (rename(af->tmp_path, af->path) != 0) {
        err = errno;
        unlink(af->tmp_path);
        llmc_die("cannot rename '%s' to '%s': %s", af->tmp_path, af->path, strerror(err));
    }
    fsync_parent_dir(af->path);
}

void atomic_abort(AtomicFile *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    unlink(af->tmp_path);
}
