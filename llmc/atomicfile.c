#define _POSIX_C_SOURCE 200809L
#include "atomicfile.h"
#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- temp files not yet committed: removed at exit ---------------------------------------- */
enum { MAX_PENDING = 64 };
static char *pending[MAX_PENDING];
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t pending_once = PTHREAD_ONCE_INIT;

static void remove_pending_at_exit(void) {
    /* no lock: exit() may run while another thread holds it; the paths are only read here.
     * Only this process's own files: a forked child exiting must not remove its parent's. */
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".tmp.%ld", (long)getpid());
    size_t sl = strlen(suffix);
    for (int i = 0; i < MAX_PENDING; i++) {
        const char *p = pending[i];
        if (p && strlen(p) >= sl && strcmp(p + strlen(p) - sl, suffix) == 0) unlink(p);
    }
}
static void register_atexit(void) { atexit(remove_pending_at_exit); }

static void pending_add(const char *tmp_path) {
    pthread_once(&pending_once, register_atexit);
    char *copy = strdup(tmp_path);
    pthread_mutex_lock(&pending_mu);
    for (int i = 0; copy && i < MAX_PENDING; i++)
        if (!pending[i]) {
            pending[i] = copy;
            copy = NULL;
        }
    pthread_mutex_unlock(&pending_mu);
    free(copy); /* table full: this file is still removed on every error path but exit */
}

static void pending_remove(const char *tmp_path) {
    pthread_mutex_lock(&pending_mu);
    for (int i = 0; i < MAX_PENDING; i++)
        if (pending[i] && strcmp(pending[i], tmp_path) == 0) {
            char *p = pending[i];
            pending[i] = NULL;
            free(p);
            break;
        }
    pthread_mutex_unlock(&pending_mu);
}

void atomic_open(AtomicFile *af, const char *path) {
    if (strlen(path) >= sizeof af->path) llmc_die("output path too long: '%s'", path);
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        llmc_die("output '%s' is %s; refusing to replace it (give the path of a regular file)", path,
                 file_kind_name(st.st_mode));
    snprintf(af->path, sizeof af->path, "%s", path);
    snprintf(af->tmp_path, sizeof af->tmp_path, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) llmc_die("cannot create '%s': %s", af->tmp_path, strerror(errno));
    pending_add(af->tmp_path);
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
        pending_remove(af->tmp_path);
        llmc_die("writing '%s' failed: %s (nothing was replaced)", af->path, strerror(err));
    }
    if (rename(af->tmp_path, af->path) != 0) {
        err = errno;
        unlink(af->tmp_path);
        pending_remove(af->tmp_path);
        llmc_die("cannot rename '%s' to '%s': %s", af->tmp_path, af->path, strerror(err));
    }
    pending_remove(af->tmp_path);
    fsync_parent_dir(af->path);
}

void atomic_abort(AtomicFile *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    unlink(af->tmp_path);
    pending_remove(af->tmp_path);
}

int atomic_remove_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *tmp = strstr(e->d_name, ".tmp.");
        if (!tmp) continue;
        char *end;
        errno = 0;
        long pid = strtol(tmp + 5, &end, 10);
        if (*end || end == tmp + 5 || errno || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to judge) */
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (unlink(path) == 0) {
            printf("note: removed '%s', a temporary file left by process %ld, which no longer runs\n", path, pid);
            removed++;
        }
    }
    closedir(d);
    return removed;
}
