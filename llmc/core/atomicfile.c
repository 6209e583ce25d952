#define _POSIX_C_SOURCE 200809L
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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
        if (p && strlen(p) >= sl && strcmp(p + strlen(p) - sl, suffix) == 0 && unlink(p) != 0 && errno == EISDIR)
            remove_tree(p); /* an atomic_dir_open directory */
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

int atomic_remove_stale(const char *dir, int (*ours)(const char *name)) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *tmp = strstr(e->d_name, ".tmp.");
        if (!tmp || (ours && !ours(e->d_name))) continue;
        char *end;
        errno = 0;
        long pid = strtol(tmp + 5, &end, 10);
        if (*end || end == tmp + 5 || errno || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to judge) */
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) continue;
        if (S_ISDIR(st.st_mode) ? remove_tree(path) == 0 : unlink(path) == 0) {
            printf("note: removed '%s', a temporary %s left by process %ld, which no longer runs\n", path,
                   S_ISDIR(st.st_mode) ? "directory" : "file", pid);
            removed++;
        }
    }
    closedir(d);
    return removed;
}

/* ---- directories ---------------------------------------------------------------------------- */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void atomic_dir_open(AtomicDir *ad, const char *path) {
    if (strlen(path) >= sizeof ad->path) llmc_die("output path too long: '%s'", path);
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISDIR(st.st_mode))
        llmc_die("output '%s' is %s; refusing to replace it with a directory", path, file_kind_name(st.st_mode));
    snprintf(ad->path, sizeof ad->path, "%s", path);
    for (size_t n = strlen(ad->path); n > 1 && ad->path[n - 1] == '/'; n--) ad->path[n - 1] = '\0'; /* "out/": "out" */
    snprintf(ad->tmp_path, sizeof ad->tmp_path, "%s.tmp.%ld", ad->path, (long)getpid());
    remove_tree(ad->tmp_path); /* this process's own leftover, if any */
    if (mkdir(ad->tmp_path, 0755) != 0) llmc_die("cannot create directory '%s': %s", ad->tmp_path, strerror(errno));
    pending_add(ad->tmp_path);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd); /* best effort, as for the parent directory of a file */
        close(fd);
    }
}

void atomic_dir_commit(AtomicDir *ad) {
    fsync_path(ad->tmp_path);
    struct stat st;
    char old[sizeof ad->tmp_path + 8] = "";
    if (lstat(ad->path, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            llmc_die("output '%s' is %s; refusing to replace it with a directory", ad->path, file_kind_name(st.st_mode));
        if (renameat2(AT_FDCWD, ad->tmp_path, AT_FDCWD, ad->path, RENAME_EXCHANGE) == 0) {
            snprintf(old, sizeof old, "%s", ad->tmp_path); /* now the old directory */
        } else {
            /* no RENAME_EXCHANGE here: move the old one aside (a ".tmp.<pid>" name, so that a crash
             * leaves it to atomic_remove_stale), then rename the new one into place */
            snprintf(old, sizeof old, "%s.old.tmp.%ld", ad->path, (long)getpid());
            remove_tree(old);
            if (rename(ad->path, old) != 0)
                llmc_die("cannot move '%s' aside to replace it: %s", ad->path, strerror(errno));
            if (rename(ad->tmp_path, ad->path) != 0) {
                int err = errno;
                rename(old, ad->path); /* put the old one back: nothing is lost */
                llmc_die("cannot rename '%s' to '%s': %s", ad->tmp_path, ad->path, strerror(err));
            }
            pending_add(old);
        }
    } else if (rename(ad->tmp_path, ad->path) != 0) {
        int err = errno;
        remove_tree(ad->tmp_path);
        pending_remove(ad->tmp_path);
        llmc_die("cannot rename '%s' to '%s': %s", ad->tmp_path, ad->path, strerror(err));
    }
    fsync_parent_dir(ad->path);
    if (old[0] && remove_tree(old) != 0)
        printf("warning: could not remove the replaced directory '%s': %s\n", old, strerror(errno));
    pending_remove(ad->tmp_path);
    if (old[0]) pending_remove(old);
}

void atomic_dir_abort(AtomicDir *ad) {
    remove_tree(ad->tmp_path);
    pending_remove(ad->tmp_path);
}
