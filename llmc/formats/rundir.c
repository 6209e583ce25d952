#include "llmc/formats/rundir.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

/* ---- the run files: one table of the names a run writes (rundir.h) ----------------------- */
/* A number as printf's %0<width>d writes it: at least width digits, more only without a leading
 * zero, at most INT_MAX. Returns the character after it, or NULL. */
static const char *canonical_number(const char *s, int width, int *value) {
    int n = 0;
    long long v = 0;
    while (s[n] >= '0' && s[n] <= '9') {
        v = v * 10 + (s[n] - '0');
        if (v > INT_MAX) return NULL;
        n++;
    }
    if (n < width || (n > width && s[0] == '0')) return NULL;
    if (value) *value = (int)v;
    return s + n;
}

static RunFileKind base_kind(const char *name, int *step) {
    const char *p;
    if (strcmp(name, "log.jsonl") == 0) return RUN_FILE_LOG;
    if (strncmp(name, "DONE_", 5) == 0) return (p = canonical_number(name + 5, 8, step)) && !*p ? RUN_FILE_DONE : RUN_FILE_NONE;
    if (strncmp(name, "state_", 6) == 0) {
        if (!(p = canonical_number(name + 6, 8, step)) || *p != '_' || !(p = canonical_number(p + 1, 5, NULL)))
            return RUN_FILE_NONE;
        return strcmp(p, ".bin") == 0 ? RUN_FILE_STATE : RUN_FILE_NONE;
    }
    if (strncmp(name, "adapter_", 8) == 0) return (p = canonical_number(name + 8, 8, step)) && !*p ? RUN_FILE_ADAPTER : RUN_FILE_NONE;
    if (strncmp(name, "model_", 6) != 0 || !(p = canonical_number(name + 6, 8, step))) return RUN_FILE_NONE;
    if (strcmp(p, ".bin") == 0) return RUN_FILE_MODEL;
    if (strcmp(p, ".bin.sum") == 0) return RUN_FILE_SUM;
    if (strcmp(p, "_hf") == 0) return RUN_FILE_HF;
    return RUN_FILE_NONE;
}

/* base gets name without a temporary suffix "<name>.tmp.<pid>" (atomicfile.h's; the last ".tmp.",
 * pid as %ld writes it). Returns 1 for a temporary name, 0 for another, -1 for neither (".tmp."
 * followed by no pid, or too long). */
static int split_temp(const char *name, char *base, size_t len) {
    const char *t = strstr(name, ".tmp.");
    if (!t) return snprintf(base, len, "%s", name) < (int)len ? 0 : -1;
    for (const char *u; (u = strstr(t + 1, ".tmp."));) t = u;
    const char *end = canonical_number(t + 5, 1, NULL);
    if (!end || *end || t[5] == '0' || (size_t)(t - name) >= len) return -1;
    snprintf(base, len, "%.*s", (int)(t - name), name);
    return 1;
}

RunFileKind rundir_file_kind(const char *name, int *step, int *temp) {
    char base[512];
    int is_temp = split_temp(name, base, sizeof base);
    if (is_temp < 0) return RUN_FILE_NONE;
    RunFileKind kind = base_kind(base, step);
    size_t n = strlen(base);
    if (!kind && is_temp && n > 4 && strcmp(base + n - 4, ".old") == 0) { /* an HF or adapter directory being replaced */
        base[n - 4] = '\0';
        kind = base_kind(base, step);
        if (kind != RUN_FILE_HF && kind != RUN_FILE_ADAPTER) kind = RUN_FILE_NONE;
    }
    if (temp) *temp = is_temp;
    return kind;
}

/* a temporary run file, or one of the CUDA trainer's default matmul cache (lt_plans.cuh) */
static int is_run_temp(const char *name) {
    int temp;
    char base[512];
    return (rundir_file_kind(name, NULL, &temp) != RUN_FILE_NONE && temp) ||
           (split_temp(name, base, sizeof base) == 1 && strcmp(base, "matmul_algos.txt") == 0);
}

int rundir_remove_stale(const char *dir) { return atomic_remove_stale(dir, is_run_temp); }

/* the run files that are directories */
static int is_dir_kind(RunFileKind kind) { return kind == RUN_FILE_HF || kind == RUN_FILE_ADAPTER; }

/* The entry dir/name has the kind of file its run-file name says (a directory for an HF one, a
 * regular file otherwise; lstat: a symbolic link is neither). */
static int right_type(const char *path, RunFileKind kind, const char **what) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        *what = "gone";
        return errno == ENOENT;
    }
    *what = file_kind_name(st.st_mode);
    return is_dir_kind(kind) ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
}

/* The run files of a directory, one at a time: temporary files are never a run's result (a dead
 * process's were removed at start by rundir_remove_stale, and a live one's cannot be a trainer's:
 * the lock), so they are skipped. run_files_open: 0 when dir cannot be read; run_files_next: 1
 * with the next entry's kind, step, name and path, 0 (and closed) at the end; run_files_close when
 * leaving early. */
typedef struct {
    DIR *d;
    const char *dir, *name;
    RunFileKind kind;
    int step;
    char path[4400];
} RunFiles;

static int run_files_open(RunFiles *it, const char *dir) {
    it->dir = dir;
    it->d = opendir(dir);
    return it->d != NULL;
}

static void run_files_close(RunFiles *it) {
    if (it->d) closedir(it->d);
    it->d = NULL;
}

static int run_files_next(RunFiles *it) {
    struct dirent *e;
    while (it->d && (e = readdir(it->d))) {
        int temp;
        it->kind = rundir_file_kind(e->d_name, &it->step, &temp);
        if (!it->kind || temp) continue;
        it->name = e->d_name;
        snprintf(it->path, sizeof it->path, "%s/%s", it->dir, e->d_name);
        return 1;
    }
    run_files_close(it);
    return 0;
}

int rundir_run_files(const char *dir, char *names, size_t len) {
    if (len) names[0] = '\0';
    RunFiles it;
    if (!run_files_open(&it, dir)) return 0;
    int count = 0;
    size_t used = 0;
    while (run_files_next(&it)) {
        const char *what, *path = it.path;
        RunFileKind kind = it.kind;
        if (!right_type(path, kind, &what)) {
            run_files_close(&it);
            llmc_die("output directory '%s' holds '%s', which has the name of a run file but is %s (a run writes %s "
                     "there): no run wrote it, so none will replace or delete it; move it out of '%s' or give another -o",
                     dir, path, what, is_dir_kind(kind) ? "a directory" : "a regular file", dir);
        }
        if (count < 4 && used < len) {
            int k = snprintf(names + used, len - used, "%s%s", count ? ", " : "", it.name);
            if (k > 0) used += (size_t)k;
        } else if (count == 4 && used < len) {
            int k = snprintf(names + used, len - used, ", ...");
            if (k > 0) used += (size_t)k;
        }
        count++;
    }
    return count;
}

void rundir_check_removable(const char *dir, const char *keep, const char *why) {
    char names[8];
    rundir_run_files(dir, names, sizeof names); /* (dies on a run file's name of the wrong kind) */
    char keep_real[PATH_MAX];
    if (!keep || !keep[0] || !realpath(keep, keep_real)) return; /* a name (d4), or nothing there */
    RunFiles it;
    if (!run_files_open(&it, dir)) return;
    while (run_files_next(&it)) {
        char real[PATH_MAX];
        const char *path = it.path;
        if (!realpath(path, real)) continue;
        size_t n = strlen(real);
        if (strcmp(real, keep_real) == 0 || (is_dir_kind(it.kind) && strncmp(keep_real, real, n) == 0 && keep_real[n] == '/')) {
            run_files_close(&it);
            llmc_die("%s would delete the run in '%s', and -e %s is %s '%s': the model this run starts from. Nothing "
                     "was deleted; copy it out of '%s' and give the copy as -e, or continue that run with -y 1",
                     why, dir, keep, strcmp(real, keep_real) == 0 ? "its file" : "inside its directory", path, dir);
        }
    }
}

static void remove_matching(const char *dir, int done_markers) {
    RunFiles it;
    if (!run_files_open(&it, dir)) return;
    while (run_files_next(&it)) {
        if ((it.kind == RUN_FILE_DONE) != done_markers) continue;
        const char *what;
        if (!right_type(it.path, it.kind, &what)) continue; /* (rundir_check_removable refused it; gone since) */
        if (is_dir_kind(it.kind) ? remove_tree(it.path) == 0 : unlink(it.path) == 0) continue;
        if (errno != ENOENT) {
            run_files_close(&it);
            llmc_die("--overwrite: cannot delete '%s': %s", it.path, strerror(errno));
        }
    }
}

void rundir_remove_run(const char *dir, const char *keep, const char *why) {
    rundir_check_removable(dir, keep, why);
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

void rundir_adapter_dir(const char *run_dir, int step, char *out, size_t len) {
    snprintf(out, len, "%s/adapter_%08d", run_dir, step);
}

void checkpoint_paths(const char *dir, int step, int rank, char *model, char *state, char *done, size_t len) {
    if (model) snprintf(model, len, "%s/model_%08d.bin", dir, step);
    if (state) snprintf(state, len, "%s/state_%08d_%05d.bin", dir, step, rank);
    if (done) snprintf(done, len, "%s/DONE_%08d", dir, step);
}

int checkpoint_latest_step(const char *dir) {
    RunFiles it;
    if (!run_files_open(&it, dir)) return -1;
    int best = -1;
    while (run_files_next(&it))
        if (it.kind == RUN_FILE_DONE && it.step > best) best = it.step;
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
    RunFiles it;
    if (!run_files_open(&it, dir)) return;
    int steps[4096], n = 0;
    while (run_files_next(&it))
        if (it.kind == RUN_FILE_DONE && n < 4096) steps[n++] = it.step;
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
        rundir_adapter_dir(dir, steps[i], hf, sizeof hf);
        remove_tree(hf); /* a LoRA run's adapter, if any */
    }
}
