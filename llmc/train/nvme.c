/*
 * nvme.c - the AdamW moments in a file per rank, streamed through a ring of slots (nvme.h).
 */
#include "llmc/train/nvme.h"
#include "llmc/core/check.h"
#include "llmc/core/mem.h"
#include "llmc/core/optstate.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#ifndef LLMC_HAVE_LIBURING
#define LLMC_HAVE_LIBURING 0
#endif
#if LLMC_HAVE_LIBURING
#include <liburing.h>
#endif

struct NvmeStore {
    char path[4200];
    int fd, state, direct;
    size_t k, chunk, half, slot, nchunks; /* elements; chunk elements; bytes of a moment's half, of a slot */
    unsigned char *ring;                  /* NVME_RING_SLOTS slots of `slot` bytes, 4096-aligned */
    int pending[NVME_RING_SLOTS];         /* an I/O in flight on the slot */
    int uring;                            /* 1: io_uring; 0: pread/pwrite (io_uring unavailable) */
#if LLMC_HAVE_LIBURING
    struct io_uring ur;
#endif
    double read_bytes, write_bytes, seconds; /* since nvme_take_rates */
};

static size_t pad_up(size_t b) { return (b + NVME_ALIGN - 1) / NVME_ALIGN * NVME_ALIGN; }

size_t nvme_chunk_floats(void) {
    const char *e = getenv("LLMC_TEST_NVME_CHUNK");
    if (e && e[0]) {
        char *end;
        unsigned long long v = strtoull(e, &end, 10);
        if (*end || v == 0 || v % 4096) llmc_die("LLMC_TEST_NVME_CHUNK=%s: give a positive multiple of 4096", e);
        return (size_t)v;
    }
    return (size_t)1 << 20;
}

size_t nvme_slot_bytes(int state) { return 2 * pad_up(optstate_bytes(nvme_chunk_floats(), state)); }
size_t nvme_ring_bytes(int state) { return NVME_RING_SLOTS * nvme_slot_bytes(state); }
size_t nvme_file_bytes(size_t k, int state) {
    const size_t ch = nvme_chunk_floats();
    return (k + ch - 1) / ch * nvme_slot_bytes(state);
}

/* ---- the files to remove at exit or on SIGINT/SIGTERM ---- */
enum { MAX_FILES = 8 };
static char cleanup_path[MAX_FILES][4200];
static volatile sig_atomic_t cleanup_used[MAX_FILES];
static pid_t cleanup_pid[MAX_FILES];

static void remove_files(void) {
    for (int i = 0; i < MAX_FILES; i++)
        if (cleanup_used[i] && cleanup_pid[i] == getpid()) unlink(cleanup_path[i]), cleanup_used[i] = 0;
}

static void on_signal(int sig) { /* async-signal-safe: unlink, signal, raise */
    remove_files();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void cleanup_add(const char *path) {
    static int registered;
    if (!registered) {
        atexit(remove_files);
        const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
        for (int i = 0; i < 3; i++) { /* a signal the caller ignores (nohup, a background job) stays ignored */
            struct sigaction old;
            if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_signal;
            sigemptyset(&sa.sa_mask);
            sigaction(sigs[i], &sa, NULL);
        }
        registered = 1;
    }
    for (int i = 0; i < MAX_FILES; i++)
        if (!cleanup_used[i]) {
            snprintf(cleanup_path[i], sizeof cleanup_path[i], "%s", path);
            cleanup_pid[i] = getpid();
            cleanup_used[i] = 1;
            return;
        }
    llmc_die("internal: more than %d --nvme-path files in one process", MAX_FILES);
}

static void cleanup_remove(const char *path) {
    for (int i = 0; i < MAX_FILES; i++)
        if (cleanup_used[i] && strcmp(cleanup_path[i], path) == 0) {
            unlink(path);
            cleanup_used[i] = 0;
        }
}

/* ---- opening ---- */
void nvme_check_dir(const char *dir) {
    struct stat st;
    if (!dir[0]) llmc_die("flag --nvme-path: give the directory for the optimizer state files (--offload-device nvme)");
    if (stat(dir, &st) != 0) {
        const int e = errno;
        struct stat ls;
        if (e == ENOENT && lstat(dir, &ls) == 0 && S_ISLNK(ls.st_mode))
            llmc_die("flag --nvme-path: '%s' is a symbolic link to nothing (its target does not exist)", dir);
        if (e == ELOOP) llmc_die("flag --nvme-path: '%s' is a symbolic link loop", dir);
        llmc_die("flag --nvme-path: '%s': %s (give an existing directory on a fast disk)", dir, strerror(e));
    }
    if (!S_ISDIR(st.st_mode)) llmc_die("flag --nvme-path: '%s' is %s, not a directory", dir, file_kind_name(st.st_mode));
    if (access(dir, W_OK | X_OK) != 0)
        llmc_die("flag --nvme-path: the directory '%s' is not writable (%s)", dir, strerror(errno));
}

static void check_space(const char *dir, size_t bytes) {
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) llmc_die("flag --nvme-path: cannot read the free space of '%s': %s", dir, strerror(errno));
    if (vs.f_flag & ST_RDONLY) llmc_die("flag --nvme-path: '%s' is on a read-only filesystem", dir);
    const double free_bytes = (double)vs.f_bavail * (double)vs.f_frsize;
    if (free_bytes < (double)bytes)
        llmc_die("flag --nvme-path: '%s' has %.0f bytes (%.1f MiB) free, the optimizer state file needs %zu bytes "
                 "(%.1f MiB): free space there or give another directory",
                 dir, free_bytes, free_bytes / 1048576.0, bytes, bytes / 1048576.0);
}

static void io_fail(const NvmeStore *s, const char *what, size_t off, size_t len, int err, long got) {
    if (err)
        llmc_die("flag --nvme-path: %s %zu bytes at offset %zu of '%s' failed: %s%s", what, len, off, s->path, strerror(err),
                 err == ENOSPC || err == EFBIG ? " (the disk is full: free space there or give another directory)" : "");
    llmc_die("flag --nvme-path: %s %zu bytes at offset %zu of '%s' moved only %ld bytes", what, len, off, s->path, got);
}

static void pio(NvmeStore *s, int write, unsigned char *buf, size_t len, size_t off) {
    for (size_t done = 0; done < len;) {
        ssize_t r = write ? pwrite(s->fd, buf + done, len - done, (off_t)(off + done))
                          : pread(s->fd, buf + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) io_fail(s, write ? "writing" : "reading", off, len, r < 0 ? errno : 0, (long)done);
        done += (size_t)r;
    }
}

NvmeStore *nvme_open(const char *dir, int rank, size_t k, int state) {
    nvme_check_dir(dir);
    const size_t bytes = nvme_file_bytes(k, state);
    check_space(dir, bytes);
    NvmeStore *s = (NvmeStore *)callocCheck(1, sizeof *s, "NVMe optimizer state");
    s->state = state, s->k = k, s->chunk = nvme_chunk_floats();
    s->half = pad_up(optstate_bytes(s->chunk, state)), s->slot = 2 * s->half;
    s->nchunks = (k + s->chunk - 1) / s->chunk;
    const size_t dl = strlen(dir);
    snprintf(s->path, sizeof s->path, "%s%sllmc-optstate-%ld-%d.bin", dir, dl && dir[dl - 1] == '/' ? "" : "/",
             (long)getpid(), rank);
    /* (LLMC_TEST_NVME_BUFFERED=1 / LLMC_TEST_NVME_SYNC=1: the tests' way to the paths of a filesystem
     * that refuses O_DIRECT and of a kernel without io_uring) */
    const char *buffered = getenv("LLMC_TEST_NVME_BUFFERED"), *sync_io = getenv("LLMC_TEST_NVME_SYNC");
    s->direct = !(buffered && buffered[0] == '1');
    s->fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (s->direct ? O_DIRECT : 0), 0600);
    if (s->fd < 0 && errno == EINVAL) s->direct = 0, s->fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        const int e = errno;
        if (e == EEXIST) llmc_die("flag --nvme-path: '%s' exists already (not this run's file: left as it is)", s->path);
        llmc_die("flag --nvme-path: cannot create '%s': %s%s", s->path, strerror(e),
                 e == EROFS || e == EACCES || e == EPERM ? " (the directory is not writable)" : "");
    }
    cleanup_add(s->path); /* from here every exit removes it */
    int e = posix_fallocate(s->fd, 0, (off_t)bytes); /* the space reserved now, not found missing mid-run */
    if (e == EOPNOTSUPP || e == EINVAL) e = ftruncate(s->fd, (off_t)bytes) == 0 ? 0 : errno;
    if (e)
        llmc_die("flag --nvme-path: cannot reserve %zu bytes (%.1f MiB) for '%s': %s%s", bytes, bytes / 1048576.0, s->path,
                 strerror(e), e == ENOSPC || e == EFBIG ? " (the disk is full: free space there or give another directory)" : "");
    if (posix_memalign((void **)&s->ring, NVME_ALIGN, nvme_ring_bytes(state)) != 0)
        llmc_die("out of memory allocating the --nvme-path staging ring (%zu bytes)", nvme_ring_bytes(state));
    memset(s->ring, 0, nvme_ring_bytes(state));
    mem_account(MEM_NVME_RING, (long long)nvme_ring_bytes(state), 0);
    if (s->direct && bytes) { /* some filesystems take O_DIRECT at open and refuse it at the first I/O */
        ssize_t r = pwrite(s->fd, s->ring, NVME_ALIGN, 0);
        if (r < 0 && errno == EINVAL) {
            s->direct = 0;
            fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) & ~O_DIRECT);
        } else if (r != NVME_ALIGN) {
            io_fail(s, "writing", 0, NVME_ALIGN, r < 0 ? errno : 0, (long)r);
        }
    }
    if (!s->direct) printf("note: --nvme-path '%s': the filesystem refuses O_DIRECT; buffered I/O\n", dir);
#if LLMC_HAVE_LIBURING
    int ue = sync_io && sync_io[0] == '1' ? -ENOSYS : io_uring_queue_init(2 * NVME_RING_SLOTS, &s->ur, 0);
    s->uring = ue == 0;
    if (ue) printf("note: --nvme-path: io_uring is not available here (%s); synchronous reads and writes\n", strerror(-ue));
#else
    (void)sync_io;
    printf("note: --nvme-path: this build has no liburing (apt-get install liburing-dev, then make); synchronous reads and writes\n");
#endif
    return s;
}

void nvme_close(NvmeStore *s) {
    if (!s) return;
#if LLMC_HAVE_LIBURING
    if (s->uring) io_uring_queue_exit(&s->ur);
#endif
    close(s->fd);
    cleanup_remove(s->path);
    free(s->ring);
    mem_account(MEM_NVME_RING, -(long long)nvme_ring_bytes(s->state), 0);
    free(s);
}

const char *nvme_path(const NvmeStore *s) { return s->path; }

/* ---- the stream ---- */
static unsigned char *slot_at(NvmeStore *s, int i) { return s->ring + (size_t)i * s->slot; }
static size_t chunk_count(const NvmeStore *s, size_t c) {
    size_t c0 = c * s->chunk;
    return s->k - c0 < s->chunk ? s->k - c0 : s->chunk;
}

/* Chunk c's whole region from or to slot i: queued (io_uring) or done now. */
static void submit(NvmeStore *s, int i, size_t c, int write) {
    const size_t off = c * s->slot;
    if (write) s->write_bytes += (double)s->slot;
    else s->read_bytes += (double)s->slot;
#if LLMC_HAVE_LIBURING
    if (s->uring) {
        struct io_uring_sqe *q = io_uring_get_sqe(&s->ur);
        if (!q) llmc_die("internal: the --nvme-path io_uring queue is full");
        if (write) io_uring_prep_write(q, s->fd, slot_at(s, i), (unsigned)s->slot, (unsigned long long)off);
        else io_uring_prep_read(q, s->fd, slot_at(s, i), (unsigned)s->slot, (unsigned long long)off);
        io_uring_sqe_set_data64(q, (uint64_t)i | (uint64_t)write << 8 | (uint64_t)c << 16);
        int r = io_uring_submit(&s->ur);
        if (r < 0) io_fail(s, write ? "queueing a write of" : "queueing a read of", off, s->slot, -r, 0);
        s->pending[i] = 1;
        return;
    }
#endif
    pio(s, write, slot_at(s, i), s->slot, off);
}

/* Until slot i's I/O (if any) completed. */
static void wait_slot(NvmeStore *s, int i) {
#if LLMC_HAVE_LIBURING
    while (s->uring && s->pending[i]) {
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&s->ur, &cqe);
        if (r == -EINTR) continue;
        if (r < 0) io_fail(s, "waiting for", 0, s->slot, -r, 0);
        const uint64_t d = io_uring_cqe_get_data64(cqe);
        const int res = cqe->res, slot = (int)(d & 0xff), write = (int)(d >> 8 & 1);
        const size_t c = (size_t)(d >> 16);
        io_uring_cqe_seen(&s->ur, cqe);
        if (res < 0 || (size_t)res != s->slot)
            io_fail(s, write ? "writing" : "reading", c * s->slot, s->slot, res < 0 ? -res : 0, res);
        s->pending[slot] = 0;
    }
#else
    (void)s, (void)i;
#endif
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void nvme_stream(NvmeStore *s, NvmeChunkFn fn, void *ctx) {
    if (!s->nchunks) return;
    const double t0 = now_s();
    submit(s, 0, 0, 0);
    for (size_t c = 0; c < s->nchunks; c++) {
        const int i = (int)(c % NVME_RING_SLOTS), next = (int)((c + 1) % NVME_RING_SLOTS);
        wait_slot(s, i); /* chunk c read */
        if (c + 1 < s->nchunks) {
            wait_slot(s, next); /* chunk c - 2 written: its slot is free */
            submit(s, next, c + 1, 0);
        }
        unsigned char *m = slot_at(s, i);
        fn(ctx, c * s->chunk, chunk_count(s, c), m, m + s->half);
        submit(s, i, c, 1);
    }
    for (int i = 0; i < NVME_RING_SLOTS; i++) wait_slot(s, i);
    s->seconds += now_s() - t0;
}

void nvme_read(NvmeStore *s, int is_v, size_t offset, size_t count, float *x) {
    if (offset + count > s->k) llmc_die("internal: nvme_read [%zu, %zu) of %zu elements", offset, offset + count, s->k);
    unsigned char *buf = slot_at(s, 0);
    for (size_t c = offset / s->chunk; count && c < s->nchunks; c++) {
        const size_t c0 = c * s->chunk, n = chunk_count(s, c);
        if (c0 >= offset + count) break;
        pio(s, 0, buf, s->half, c * s->slot + (is_v ? s->half : 0));
        const size_t a = offset > c0 ? offset - c0 : 0, e = offset + count < c0 + n ? offset + count - c0 : n;
        for (size_t b = a / OPTSTATE_BLOCK; b * OPTSTATE_BLOCK < e; b++) { /* the blocks of [a, e) */
            float tmp[OPTSTATE_BLOCK];
            optstate_load_block(buf, s->state, is_v, n, b, tmp);
            const size_t j0 = b * OPTSTATE_BLOCK, lo = j0 > a ? j0 : a, hi = j0 + OPTSTATE_BLOCK < e ? j0 + OPTSTATE_BLOCK : e;
            memcpy(x + (c0 + lo - offset), tmp + (lo - j0), (hi - lo) * sizeof(float));
        }
    }
}

void nvme_write_all(NvmeStore *s, const float *m, const float *v) {
    unsigned char *buf = slot_at(s, 0);
    for (size_t c = 0; c < s->nchunks; c++) {
        const size_t c0 = c * s->chunk, n = chunk_count(s, c);
        memset(buf, 0, s->slot);
        optstate_encode(buf, s->state, 0, n, m + c0);
        optstate_encode(buf + s->half, s->state, 1, n, v + c0);
        pio(s, 1, buf, s->slot, c * s->slot);
    }
}

void nvme_take_rates(NvmeStore *s, double *read_MBps, double *write_MBps) {
    *read_MBps = s->seconds > 0 ? s->read_bytes / s->seconds / 1e6 : 0.0;
    *write_MBps = s->seconds > 0 ? s->write_bytes / s->seconds / 1e6 : 0.0;
    s->read_bytes = s->write_bytes = s->seconds = 0;
}

void nvme_print(const NvmeStore *s, FILE *out) {
    const double MiB = 1048576.0;
    fprintf(out, "optimizer state on disk: '%s', %zu bytes (%.1f MiB) in %zu chunk%s of %zu elements; staging ring %d x %zu "
                 "bytes (%.1f MiB, host); %s, %s\n",
            s->path, s->nchunks * s->slot, s->nchunks * s->slot / MiB, s->nchunks, s->nchunks == 1 ? "" : "s", s->chunk,
            NVME_RING_SLOTS, s->slot, NVME_RING_SLOTS * s->slot / MiB, s->uring ? "io_uring" : "pread/pwrite",
            s->direct ? "O_DIRECT" : "buffered");
}
