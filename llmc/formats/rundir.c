#include "llmc/formats/rundir.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef LLMC_GIT_COMMIT
#define LLMC_GIT_COMMIT "unknown"
#endif
const char *llmc_version(void) { return LLMC_GIT_COMMIT; }

static void make_dirs(const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            llmc_die("cannot create output directory '%s': %s", path, strerror(errno));
        *p = saved;
        if (saved == '\0') break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) llmc_die("output path '%s' exists but is not a directory", dir);
}

void rundir_lock(const char *dir) {
    make_dirs(dir);
    char path[1200];
    snprintf(path, sizeof path, "%s/.llmc.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) llmc_die("cannot create the lock file '%s': %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        llmc_die("output directory '%s' is in use by another trainer%s%s%s (lock '%s'); wait for it to finish, "
                 "or give this run another -o", dir, pid[0] ? " (PID " : "", pid, pid[0] ? ")" : "", path);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        llmc_die("cannot write the lock file '%s': %s", path, strerror(errno));
    /* fd stays open (and locked) until the process exits */
}

static int is_run_file(const char *name) {
    int step;
    char tail;
    return strcmp(name, "log.jsonl") == 0 || strncmp(name, "log.jsonl.tmp.", 14) == 0 ||
           strncmp(name, "model_", 6) == 0 || strncmp(name, "state_", 6) == 0 ||
           sscanf(name, "DONE_%8d%c", &step, &tail) >= 1;
}

int rundir_run_files(const char *dir, char *names, size_t len) {
    if (len) names[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    size_t used = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* temporary files are never a run's result: a dead process's were removed at start
         * (atomic_remove_stale), and a live one's cannot be a trainer's (the lock) */
        if (!is_run_file(e->d_name) || strstr(e->d_name, ".tmp.")) continue;
        if (count < 4 && used < len) {
            int k = snprintf(names + used, len - used, "%s%s", count ? ", " : "", e->d_name);
            if (k > 0) used += (size_t)k;
        } else if (count == 4 && used < len) {
            int k = snprintf(names + used, len - used, ", ...");
            if (k > 0) used += (size_t)k;
        }
        count++;
    }
    closedir(d);
    return count;
}

static void remove_matching(const char *dir, int done_markers) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_run_file(e->d_name) || (strncmp(e->d_name, "DONE_", 5) == 0) != done_markers) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0 || (errno == EISDIR && remove_tree(path) == 0)) continue; /* dirs: --save-hf's */
        if (errno != ENOENT) llmc_die("--overwrite: cannot delete '%s': %s", path, strerror(errno));
    }
    closedir(d);
}

void rundir_remove_run(const char *dir) {
    remove_matching(dir, 1);
    remove_matching(dir, 0);
}

void rundir_machine(char *host, size_t host_len, char *cpu, size_t cpu_len, int *cores) {
    if (gethostname(host, host_len) != 0) snprintf(host, host_len, "unknown");
    host[host_len - 1] = '\0';
    snprintf(cpu, cpu_len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0) continue;
            const char *v = strchr(line, ':');
            if (!v) continue;
            v++;
            while (*v == ' ' || *v == '\t') v++;
            snprintf(cpu, cpu_len, "%.*s", (int)strcspn(v, "\n"), v);
            break;
        }
        fclose(f);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    *cores = n > 0 ? (int)n : 1;
}

/* ---- checkpoints in -o: file names, DONE markers, pruning -------------------------------- */
void rundir_hf_dir(const char *run_dir, int step, char *out, size_t len) {
    snprintf(out, len, "%s/model_%08d_hf", run_dir, step);
}

void checkpoint_paths(const char *dir, int step, int rank, char *model, char *state, char *done, size_t len) {
    if (model) snprintf(model, len, "%s/model_%08d.bin", dir, step);
    if (state) snprintf(state, len, "%s/state_%08d_%05d.bin", dir, step, rank);
    if (done) snprintf(done, len, "%s/DONE_%08d", dir, step);
}

int checkpoint_latest_step(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int step;
        char tail;
        if (sscanf(e->d_name, "DONE_%8d%c", &step, &tail) == 1 && step > best) best = step;
    }
    closedir(d);
    return best;
}

void checkpoint_mark_done(const char *dir, int step, const char *text) {
    char done[4200];
    checkpoint_paths(dir, step, 0, NULL, NULL, done, sizeof done);
    AtomicFile af;
    atomic_open(&af, done);
    if (text && text[0]) fwriteCheck(text, 1, strlen(text), af.f, af.tmp_path);
    atomic_commit(&af);
}

char *checkpoint_read_done(const char *dir, int step) {
    char done[4200];
    checkpoint_paths(dir, step, 0, NULL, NULL, done, sizeof done);
    FILE *f = fopen(done, "rb");
    if (!f) return NULL;
    long long size = sumfile_size(f);
    char *text = NULL;
    if (size > 0 && size < (1 << 20)) {
        text = (char *)mallocCheck((size_t)size + 1, "DONE marker text");
        if (fread(text, 1, (size_t)size, f) != (size_t)size) {
            free(text);
            text = NULL;
        } else {
            text[size] = '\0';
        }
    }
    fclose(f);
    return text;
}

void checkpoint_prune(const char *dir, int keep, int major, int rank, int protect) {
    if (keep <= 0) return;
    DIR *d = opendir(dir);
    if (!d) return;
    int steps[4096], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        int step;
        char tail;
        if (sscanf(e->d_name, "DONE_%8d%c", &step, &tail) == 1) steps[n++] = step;
    }
    closedir(d);
    /* sort descending */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    for (int i = keep; i < n; i++) {
        if (major > 0 && steps[i] % major == 0) continue;
        if (steps[i] == protect) continue;
        char model[4200], state[4200], done[4200];
        checkpoint_paths(dir, steps[i], rank, model, state, done, sizeof model);
        unlink(done); /* first, so a crash mid-prune never leaves a DONE without its files */
        unlink(model);
        unlink(state);
        char sum[4300];
        sumfile_path(model, sum, sizeof sum);
        unlink(sum);
        char hf[4300];
        rundir_hf_dir(dir, steps[i], hf, sizeof hf);
        remove_tree(hf); /* --save-hf's directory, if any */
    }
}
