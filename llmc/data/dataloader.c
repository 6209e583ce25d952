/*
 * dataloader.c - see dataloader.h for the layout, the order and the contract.
 *
 * Structure:
 *   Shard     one shard file (64-bit offsets throughout). Batches are read with pread, not
 *             through a memory map: a shard truncated while we train is then a short read and a
 *             clear error naming it, not a SIGBUS.
 *   Position  (epoch, shard_pos, batch_pos): where a batch sits in the stream.
 *   Plan      the permutation caches that map a Position to (shard, k), and the open file and
 *             read buffer of the shard being read. Each thread that maps positions owns its own
 *             Plan, so these need no locking.
 *   produce_batch()  Position -> this rank's inputs/targets, checking every token.
 * With prefetch, one worker thread owns `worker_plan` and fills a single slot one batch ahead
 * of the caller; the caller's own position `pos` is never touched by the worker.
 */
#include "llmc/data/dataloader.h"
#include "llmc/core/check.h"
#include "llmc/data/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

/* reserved[0] of a DataLoaderState written by dataloader_get_state: the fingerprint in
 * reserved[1..4] is valid. reserved[1] = shards, [2] = tokens in all shards,
 * [3] = tokens per global batch (B*T*nproc), [4] = 0 (sequential) or a non-zero hash of the
 * shuffle seed. Positions mean the same batches exactly when all of these agree, so a run may
 * resume with another (B, nproc) split of the same global batch. */
#define DL_STATE_MAGIC 20250601

#define DL_ERR_LEN 4400 /* a path (up to PATH_MAX) plus one sentence */

typedef struct {
    char *path;
    size_t file_bytes;  /* header + tokens, checked again each time the shard is opened to read */
    int token_bytes;    /* 2 or 4 */
    size_t ntok;
    int64_t nbatches;   /* global batches: floor((ntok - 1) / (B*T*nproc)) */
    uint32_t crc;       /* CRC-32 of its tokens as read at open (a sparse file's holes as zeros) */
} Shard;

typedef struct {
    int64_t epoch, shard_pos, batch_pos;
} Position;

/* Permutation caches (used only when shuffle = 1). */
typedef struct {
    int64_t order_epoch;   /* epoch whose shard order is in shard_order; -1 = none */
    uint32_t *shard_order; /* (nshards) shard_pos -> shard index */
    int64_t perm_epoch;    /* (perm_epoch, perm_shard): whose batch order is in batch_order */
    int perm_shard;        /* -1 = none */
    uint32_t *batch_order; /* (max_shard_batches) batch_pos -> k; allocated on first use */
    int fd, fd_shard;      /* the shard file open for reading (fd_shard -1 = none) */
    uint8_t *raw;          /* (B*T + 1) * 4 bytes: one rank's tokens as read */
} Plan;

typedef enum { SLOT_EMPTY, SLOT_FILLING, SLOT_FULL } SlotState;

struct DataLoader {
    /* configuration, immutable after open (read by both threads) */
    int B, T, rank, nproc, shuffle, vocab_size, prefetch;
    uint64_t seed;
    size_t tokens_per_batch; /* B*T*nproc: one global batch, without its +1 token */
    Shard *shards;
    int nshards;
    size_t num_tokens;
    int64_t batches_per_epoch;
    int64_t max_shard_batches;

    /* the caller's side: only the caller's thread touches these */
    Position pos;       /* the next batch dataloader_next returns */
    Plan caller_plan;   /* advances pos; also produces batches when prefetch = 0 */
    double last_wait_ms;

    /* prefetch: everything below is guarded by mu, except the slot buffers while FILLING
     * (then only the worker writes them) and worker_plan (worker thread only). */
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* worker waits: slot emptied, or stop */
    pthread_cond_t ready_cv; /* caller waits: slot no longer FILLING */
    int stop;
    SlotState slot_state;
    Position slot_pos;       /* the batch in the slot (FULL) or being made (FILLING) */
    Position want;           /* the batch the worker makes next */
    int32_t *slot_inputs;    /* (B*T) */
    int32_t *slot_targets;   /* (B*T) */
    char slot_err[DL_ERR_LEN]; /* non-empty: making slot_pos failed, raise it when consumed */
    Plan worker_plan;
};

/* ---- PRNG: splitmix64 stream, unbiased bounded draws, Fisher-Yates --------------------- */

static uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n), n >= 1: draws below 2^64 mod n are rejected so every value is equally
 * likely. */
static uint64_t rng_below(uint64_t *state, uint64_t n) {
    uint64_t reject_below = (0 - n) % n;
    for (;;) {
        uint64_t x = splitmix64_next(state);
        if (x >= reject_below) return x % n;
    }
}

/* The PRNG state for one permutation: a function of (seed, epoch, stream) only.
 * stream 0 = the shard order, stream s + 1 = the batch order within shard s. */
static uint64_t stream_state(uint64_t seed, int64_t epoch, int64_t stream) {
    uint64_t s = seed;
    uint64_t h = splitmix64_next(&s);
    s = h ^ (uint64_t)epoch;
    h = splitmix64_next(&s);
    s = h ^ (uint64_t)stream;
    return splitmix64_next(&s);
}

/* Fisher-Yates: a uniformly random permutation of a[0..n) in place. */
static void shuffle_u32(uint32_t *a, int64_t n, uint64_t *state) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(state, (uint64_t)i + 1);
        uint32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- Plan: Position -> (shard index, batch k) ------------------------------------------ */

static void plan_init(Plan *p) {
    p->order_epoch = -1;
    p->shard_order = NULL;
    p->perm_epoch = -1;
    p->perm_shard = -1;
    p->batch_order = NULL;
    p->fd = -1;
    p->fd_shard = -1;
    p->raw = NULL;
}

static void plan_free(Plan *p) {
    free(p->shard_order);
    free(p->batch_order);
    free(p->raw);
    if (p->fd >= 0) close(p->fd);
    plan_init(p);
}

/* Index (into dl->shards) of the shard_pos-th shard of `epoch`. */
static int plan_shard_at(const DataLoader *dl, Plan *p, int64_t epoch, int64_t shard_pos) {
    if (!dl->shuffle) return (int)shard_pos;
    if (p->order_epoch != epoch) {
        if (!p->shard_order) p->shard_order = mallocCheck((size_t)dl->nshards * sizeof(uint32_t), "shard order");
        for (int i = 0; i < dl->nshards; i++) p->shard_order[i] = (uint32_t)i;
        uint64_t st = stream_state(dl->seed, epoch, 0);
        shuffle_u32(p->shard_order, dl->nshards, &st);
        p->order_epoch = epoch;
    }
    return (int)p->shard_order[shard_pos];
}

/* Batch k (within shard `shard`) at batch_pos in `epoch`. */
static int64_t plan_batch_at(const DataLoader *dl, Plan *p, int64_t epoch, int shard, int64_t batch_pos) {
    if (!dl->shuffle) return batch_pos;
    if (p->perm_epoch != epoch || p->perm_shard != shard) {
        if (!p->batch_order)
            p->batch_order = mallocCheck((size_t)dl->max_shard_batches * sizeof(uint32_t), "batch order");
        int64_t n = dl->shards[shard].nbatches;
        for (int64_t i = 0; i < n; i++) p->batch_order[i] = (uint32_t)i;
        uint64_t st = stream_state(dl->seed, epoch, (int64_t)shard + 1);
        shuffle_u32(p->batch_order, n, &st);
        p->perm_epoch = epoch;
        p->perm_shard = shard;
    }
    return p->batch_order[batch_pos];
}

/* One batch forward; positions stay normalised (see DataLoaderState). */
static void position_advance(const DataLoader *dl, Plan *p, Position *pos) {
    int s = plan_shard_at(dl, p, pos->epoch, pos->shard_pos);
    if (++pos->batch_pos < dl->shards[s].nbatches) return;
    pos->batch_pos = 0;
    if (++pos->shard_pos < dl->nshards) return;
    pos->shard_pos = 0;
    pos->epoch++;
}

/* ---- producing a batch ----------------------------------------------------------------- */

/* The shard file `s` open for reading in this Plan (one open file per thread, reopened when the
 * shard changes). Returns the fd, or -1 with a message if it is gone or changed size. */
static int plan_shard_fd(const DataLoader *dl, Plan *p, int s, char *err, size_t errlen) {
    if (p->fd_shard == s) return p->fd;
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->fd_shard = -1;
    const Shard *sh = &dl->shards[s];
    int fd = open(sh->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open data shard '%s': %s", sh->path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != sh->file_bytes) {
        snprintf(err, errlen, "data shard '%s' changed while in use: it is now %lld bytes, it was %zu; "
                 "do not modify shards while training reads them",
                 sh->path, S_ISREG(st.st_mode) ? (long long)st.st_size : -1LL, sh->file_bytes);
        close(fd);
        return -1;
    }
    p->fd = fd;
    p->fd_shard = s;
    return fd;
}

/* Reads exactly n bytes at off; -1 on a short read or an error. */
static int pread_full(int fd, void *dst, size_t n, off_t off) {
    uint8_t *d = dst;
    while (n > 0) {
        ssize_t got = pread(fd, d, n, off);
        if (got < 0 && errno == EINTR) continue;
        if (got == 0) errno = 0; /* end of file: the file is shorter than expected */
        if (got <= 0) return -1;
        d += got, n -= (size_t)got, off += got;
    }
    return 0;
}

/* Fills this rank's inputs/targets (B*T each) for the batch at pos. Returns 0, or -1 with a
 * message in err if the shard cannot be read in full (it was truncated or replaced while in
 * use) or a token is >= vocab_size (inputs/targets are then incomplete). */
static int produce_batch(const DataLoader *dl, Plan *p, Position pos, int32_t *inputs, int32_t *targets,
                         char *err, size_t errlen) {
    int s = plan_shard_at(dl, p, pos.epoch, pos.shard_pos);
    const Shard *sh = &dl->shards[s];
    int64_t k = plan_batch_at(dl, p, pos.epoch, s, pos.batch_pos);
    size_t bt = (size_t)dl->B * (size_t)dl->T;
    size_t start = (size_t)k * dl->tokens_per_batch + (size_t)dl->rank * bt; /* token index in shard */
    if (!p->raw) p->raw = mallocCheck((bt + 1) * 4, "shard read buffer");
    int fd = plan_shard_fd(dl, p, s, err, errlen);
    if (fd < 0) return -1;
    size_t bytes = (bt + 1) * (size_t)sh->token_bytes;
    off_t off = (off_t)SHARD_HEADER_BYTES + (off_t)start * sh->token_bytes;
    if (pread_full(fd, p->raw, bytes, off) != 0) {
        struct stat st;
        long long now = fstat(fd, &st) == 0 ? (long long)st.st_size : -1LL;
        snprintf(err, errlen, "cannot read data shard '%s' at byte %lld (%zu bytes): it is now %lld bytes, it was "
                 "%zu; it was truncated or changed while training read it",
                 sh->path, (long long)off, bytes, now, sh->file_bytes);
        return -1;
    }
    const uint16_t *t16 = (const uint16_t *)p->raw;
    const uint32_t *t32 = (const uint32_t *)p->raw;
    uint32_t vocab = (uint32_t)dl->vocab_size;
    for (size_t i = 0; i <= bt; i++) {
        uint32_t tok = sh->token_bytes == 2 ? t16[i] : t32[i];
        if (tok >= vocab) { /* checked at open; the file changed since */
            snprintf(err, errlen,
                     "data shard '%s': token %u at position %zu (of %zu tokens) is >= vocab_size %d: the shard "
                     "changed while training read it",
                     sh->path, tok, start + i, sh->ntok, dl->vocab_size);
            return -1;
        }
        if (i < bt) inputs[i] = (int32_t)tok;
        if (i > 0) targets[i - 1] = (int32_t)tok;
    }
    return 0;
}

/* ---- prefetch worker ------------------------------------------------------------------- */

static void *prefetch_main(void *arg) {
    DataLoader *dl = arg;
    pthread_mutex_lock(&dl->mu);
    for (;;) {
        while (!dl->stop && dl->slot_state != SLOT_EMPTY) pthread_cond_wait(&dl->work_cv, &dl->mu);
        if (dl->stop) break;
        Position pos = dl->want;
        dl->slot_pos = pos;
        dl->slot_state = SLOT_FILLING;
        pthread_mutex_unlock(&dl->mu);

        if (produce_batch(dl, &dl->worker_plan, pos, dl->slot_inputs, dl->slot_targets, dl->slot_err,
                          sizeof dl->slot_err) == 0)
            dl->slot_err[0] = '\0';

        pthread_mutex_lock(&dl->mu);
        position_advance(dl, &dl->worker_plan, &dl->want);
        dl->slot_state = SLOT_FULL;
        pthread_cond_broadcast(&dl->ready_cv);
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

/* Drops any prefetched batch and makes `pos` the next batch (caller's thread). */
static void move_to(DataLoader *dl, Position pos) {
    if (dl->prefetch) {
        pthread_mutex_lock(&dl->mu);
        while (dl->slot_state == SLOT_FILLING) pthread_cond_wait(&dl->ready_cv, &dl->mu);
        dl->slot_state = SLOT_EMPTY;
        dl->want = pos;
        pthread_cond_signal(&dl->work_cv);
        pthread_mutex_unlock(&dl->mu);
    }
    dl->pos = pos;
}

/* ---- open / close ---------------------------------------------------------------------- */

/* crc extended by n zero bytes, in O(log n) (a hole of a sparse shard: gigabytes are common in
 * tests), the same value as feeding the zeros. */
static uint32_t crc_append_zeros(uint32_t crc, uint64_t n) {
    static const unsigned char zero[4096];
    uLong block = crc32(0L, zero, sizeof zero); /* the CRC of len zero bytes, len doubling */
    uint64_t len = sizeof zero;
    for (uint64_t q = n / sizeof zero; q; q >>= 1) {
        if (q & 1) crc = (uint32_t)crc32_combine(crc, block, (z_off_t)len);
        block = crc32_combine(block, block, (z_off_t)len);
        len *= 2;
    }
    return (uint32_t)crc32(crc, zero, (uInt)(n % sizeof zero));
}

/* Every token of the shard must be < vocab_size: checked once, at open, over the whole file (a
 * max over 1 MiB chunks, which the compiler vectorises), so a bad shard fails before training
 * instead of at whichever batch holds the bad token. The same read gives the tokens' CRC-32
 * (*crc: ranks compare it, so that the same path with other content on another node is caught;
 * it costs a CRC pass over data read anyway). */
static void scan_vocab(int fd, const char *path, const ShardInfo *info, int vocab_size, const char *vocab_origin,
                       uint32_t *crc) {
    enum { CHUNK_BYTES = 1 << 20 };
    uint8_t *buf = mallocCheck(CHUNK_BYTES, "shard scan buffer");
    size_t per = CHUNK_BYTES / (size_t)info->token_bytes;
    *crc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < info->ntok;) {
        off_t off = (off_t)SHARD_HEADER_BYTES + (off_t)done * info->token_bytes;
        /* holes of a sparse file read as token 0, always in range: skip them (zeros in the CRC) */
        off_t data = lseek(fd, off, SEEK_DATA);
        if (data < 0 && errno == ENXIO) {
            *crc = crc_append_zeros(*crc, (uint64_t)(info->ntok - done) * (uint64_t)info->token_bytes);
            break;
        }
        if (data > off) {
            size_t skip_to = (size_t)(data - SHARD_HEADER_BYTES) / (size_t)info->token_bytes;
            if (skip_to > done) {
                size_t to = skip_to < info->ntok ? skip_to : info->ntok;
                *crc = crc_append_zeros(*crc, (uint64_t)(to - done) * (uint64_t)info->token_bytes);
                done = to;
                continue;
            }
        }
        size_t n = info->ntok - done < per ? info->ntok - done : per;
        if (pread_full(fd, buf, n * (size_t)info->token_bytes, off) != 0)
            llmc_die("cannot read data shard '%s' at byte %lld: %s", path, (long long)off,
                     errno ? strerror(errno) : "the file is shorter than its header says");
        uint32_t max = 0;
        if (info->token_bytes == 2) {
            const uint16_t *t = (const uint16_t *)buf;
            uint16_t m = 0;
            for (size_t i = 0; i < n; i++) m = t[i] > m ? t[i] : m;
            max = m;
        } else {
            const uint32_t *t = (const uint32_t *)buf;
            for (size_t i = 0; i < n; i++) max = t[i] > max ? t[i] : max;
        }
        if (max >= (uint32_t)vocab_size) {
            size_t i = 0;
            uint32_t tok = 0;
            for (; i < n; i++) {
                tok = info->token_bytes == 2 ? ((const uint16_t *)buf)[i] : ((const uint32_t *)buf)[i];
                if (tok >= (uint32_t)vocab_size) break;
            }
            free(buf);
            if (vocab_origin)
                llmc_die("data shard '%s': token %u at position %zu (of %zu tokens) is >= vocab_size %d, the "
                         "vocabulary size in the header of the model '%s': either that header is wrong (a damaged "
                         "model file) or the shard was made with another tokenizer",
                         path, tok, done + i, info->ntok, vocab_size, vocab_origin);
            llmc_die("data shard '%s': token %u at position %zu (of %zu tokens) is >= vocab_size %d: the shard was "
                     "made with another tokenizer, or vocab_size is wrong",
                     path, tok, done + i, info->ntok, vocab_size);
        }
        *crc = (uint32_t)crc32(*crc, buf, (uInt)(n * (size_t)info->token_bytes));
        done += n;
    }
    free(buf);
}

static void shard_open(Shard *sh, const char *path, const char *pattern, size_t tokens_per_batch,
                       int B, int T, int nproc, int vocab_size, const char *vocab_origin) {
    struct stat st;
    if (stat(path, &st) != 0) llmc_die("cannot stat data shard '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        llmc_die("'%s' (matched by the data pattern '%s') is not a regular file", path, pattern);
    ShardInfo info;
    char err[DL_ERR_LEN];
    if (shard_read_header(path, &info, err, sizeof err) != 0) llmc_die("%s", err);
    if (info.ntok < tokens_per_batch + 1)
        llmc_die("data shard '%s' has %zu tokens, too few for one global batch of B*T*nproc + 1 = "
                 "%d*%d*%d + 1 = %zu tokens (for the training data, one optimizer step: -d tokens + 1); use a "
                 "smaller batch (-d, -b), sequence length (-t) or fewer processes, or a larger shard",
                 path, info.ntok, B, T, nproc, tokens_per_batch + 1);

    size_t bytes = (size_t)SHARD_HEADER_BYTES + info.ntok * (size_t)info.token_bytes;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) llmc_die("cannot open data shard '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != bytes)
        llmc_die("data shard '%s' changed size while being opened (now %lld bytes, expected %zu)", path,
                 (long long)st.st_size, bytes);
    scan_vocab(fd, path, &info, vocab_size, vocab_origin, &sh->crc);
    close(fd);

    size_t plen = strlen(path) + 1;
    sh->path = mallocCheck(plen, "shard path");
    memcpy(sh->path, path, plen);
    sh->file_bytes = bytes;
    sh->token_bytes = info.token_bytes;
    sh->ntok = info.ntok;
    sh->nbatches = (int64_t)((info.ntok - 1) / tokens_per_batch);
}

static void check_open_args(const char *pattern, int B, int T, int rank, int nproc, int shuffle,
                            int vocab_size, int prefetch) {
    if (!pattern || !pattern[0]) llmc_die("dataloader: empty data file pattern");
    if (B < 1) llmc_die("dataloader '%s': batch size B must be >= 1 (got %d)", pattern, B);
    if (T < 1) llmc_die("dataloader '%s': sequence length T must be >= 1 (got %d)", pattern, T);
    if (nproc < 1) llmc_die("dataloader '%s': number of processes must be >= 1 (got %d)", pattern, nproc);
    if (rank < 0 || rank >= nproc)
        llmc_die("dataloader '%s': rank %d is outside [0, %d) for %d processes", pattern, rank, nproc, nproc);
    if (vocab_size < 1) llmc_die("dataloader '%s': vocab_size must be >= 1 (got %d)", pattern, vocab_size);
    if (shuffle != 0 && shuffle != 1) llmc_die("dataloader '%s': shuffle must be 0 or 1 (got %d)", pattern, shuffle);
    if (prefetch != 0 && prefetch != 1)
        llmc_die("dataloader '%s': prefetch must be 0 or 1 (got %d)", pattern, prefetch);
}

/* glob's error callback: the directory it could not read (a missing one, typically), for the message. */
static _Thread_local char glob_failed_path[1024];
static _Thread_local int glob_failed_errno;
static int glob_error(const char *path, int eerrno) {
    snprintf(glob_failed_path, sizeof glob_failed_path, "%s", path);
    glob_failed_errno = eerrno;
    return 1; /* stop: GLOB_ERR */
}

DataLoader *dataloader_open(const char *pattern, int B, int T, int rank, int nproc,
                            int shuffle, uint64_t seed, int vocab_size, int prefetch) {
    return dataloader_open_for_model(pattern, B, T, rank, nproc, shuffle, seed, vocab_size, prefetch, NULL);
}

DataLoader *dataloader_open_for_model(const char *pattern, int B, int T, int rank, int nproc, int shuffle,
                                      uint64_t seed, int vocab_size, int prefetch, const char *vocab_origin) {
    check_open_args(pattern, B, T, rank, nproc, shuffle, vocab_size, prefetch);
    glob_t g;
    glob_failed_path[0] = 0;
    int grc = glob(pattern, GLOB_ERR, glob_error, &g);
    if (grc == GLOB_NOMATCH)
        llmc_die("no data shard matches '%s'; check the path (-i / -j) and that the data was prepared", pattern);
    if (grc == GLOB_ABORTED && glob_failed_path[0])
        llmc_die("no data shard matches '%s': cannot read directory '%s' (%s); check the path (-i / -j)", pattern,
                 glob_failed_path, strerror(glob_failed_errno));
    if (grc != 0)
        llmc_die("cannot expand the data pattern '%s': %s", pattern,
                 grc == GLOB_NOSPACE ? "out of memory" : "read error in a directory");
    if (g.gl_pathc > (size_t)1 << 30) llmc_die("data pattern '%s' matches too many files (%zu)", pattern, g.gl_pathc);

    DataLoader *dl = callocCheck(1, sizeof *dl, "DataLoader");
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->nproc = nproc;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->vocab_size = vocab_size;
    dl->prefetch = prefetch;
    dl->tokens_per_batch = (size_t)B * (size_t)T * (size_t)nproc;
    dl->nshards = (int)g.gl_pathc;
    dl->shards = callocCheck((size_t)dl->nshards, sizeof(Shard), "shard table");
    for (int i = 0; i < dl->nshards; i++) {
        Shard *sh = &dl->shards[i];
        shard_open(sh, g.gl_pathv[i], pattern, dl->tokens_per_batch, B, T, nproc, vocab_size, vocab_origin);
        dl->num_tokens += sh->ntok;
        dl->batches_per_epoch += sh->nbatches;
        if (sh->nbatches > dl->max_shard_batches) dl->max_shard_batches = sh->nbatches;
    }
    globfree(&g);

    plan_init(&dl->caller_plan);
    plan_init(&dl->worker_plan);
    if (prefetch) {
        size_t bt = (size_t)B * (size_t)T;
        dl->slot_inputs = mallocCheck(bt * sizeof(int32_t), "prefetch inputs");
        dl->slot_targets = mallocCheck(bt * sizeof(int32_t), "prefetch targets");
        dl->slot_state = SLOT_EMPTY;
        llmcCheck(pthread_mutex_init(&dl->mu, NULL) == 0, "");
        llmcCheck(pthread_cond_init(&dl->work_cv, NULL) == 0, "");
        llmcCheck(pthread_cond_init(&dl->ready_cv, NULL) == 0, "");
        int trc = pthread_create(&dl->worker, NULL, prefetch_main, dl);
        if (trc != 0) llmc_die("dataloader '%s': cannot start the prefetch thread: %s", pattern, strerror(trc));
    }
    return dl;
}

void dataloader_close(DataLoader *dl) {
    if (!dl) return;
    if (dl->prefetch) {
        pthread_mutex_lock(&dl->mu);
        dl->stop = 1;
        pthread_cond_broadcast(&dl->work_cv);
        pthread_mutex_unlock(&dl->mu);
        pthread_join(dl->worker, NULL);
        pthread_cond_destroy(&dl->ready_cv);
        pthread_cond_destroy(&dl->work_cv);
        pthread_mutex_destroy(&dl->mu);
        free(dl->slot_inputs);
        free(dl->slot_targets);
    }
    plan_free(&dl->caller_plan);
    plan_free(&dl->worker_plan);
    for (int i = 0; i < dl->nshards; i++) free(dl->shards[i].path);
    free(dl->shards);
    free(dl);
}

/* ---- the batch stream ------------------------------------------------------------------ */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void dataloader_next(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    double t0 = now_ms();
    size_t bt = (size_t)dl->B * (size_t)dl->T;
    if (!dl->prefetch) {
        char err[DL_ERR_LEN];
        if (produce_batch(dl, &dl->caller_plan, dl->pos, inputs, targets, err, sizeof err) != 0)
            llmc_die("%s", err);
    } else {
        pthread_mutex_lock(&dl->mu);
        while (dl->slot_state != SLOT_FULL) pthread_cond_wait(&dl->ready_cv, &dl->mu);
        llmcCheck(dl->slot_pos.epoch == dl->pos.epoch && dl->slot_pos.shard_pos == dl->pos.shard_pos &&
                      dl->slot_pos.batch_pos == dl->pos.batch_pos,
                  "the prefetched batch must be the caller's next batch");
        if (dl->slot_err[0]) {
            char err[DL_ERR_LEN];
            memcpy(err, dl->slot_err, sizeof err);
            pthread_mutex_unlock(&dl->mu);
            llmc_die("%s", err);
        }
        memcpy(inputs, dl->slot_inputs, bt * sizeof(int32_t));
        memcpy(targets, dl->slot_targets, bt * sizeof(int32_t));
        dl->slot_state = SLOT_EMPTY;
        pthread_cond_signal(&dl->work_cv);
        pthread_mutex_unlock(&dl->mu);
    }
    position_advance(dl, &dl->caller_plan, &dl->pos);
    dl->last_wait_ms = now_ms() - t0;
}

void dataloader_reset(DataLoader *dl) {
    Position start = {0, 0, 0};
    move_to(dl, start);
}

size_t dataloader_num_tokens(const DataLoader *dl) { return dl->num_tokens; }
size_t dataloader_batches_per_epoch(const DataLoader *dl) { return (size_t)dl->batches_per_epoch; }
int dataloader_num_shards(const DataLoader *dl) { return dl->nshards; }
uint32_t dataloader_content_crc(const DataLoader *dl) {
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (int i = 0; i < dl->nshards; i++) { /* each shard's CRC and token count, in glob order */
        uint64_t v[2] = {dl->shards[i].crc, dl->shards[i].ntok};
        crc = (uint32_t)crc32(crc, (const unsigned char *)v, sizeof v);
    }
    return crc;
}
double dataloader_last_wait_ms(const DataLoader *dl) { return dl->last_wait_ms; }

/* ---- state ----------------------------------------------------------------------------- */

static int64_t seed_fingerprint(const DataLoader *dl) {
    if (!dl->shuffle) return 0;
    return (int64_t)(stream_state(dl->seed, -1, -1) >> 1) | 1;
}

void dataloader_get_state(const DataLoader *dl, DataLoaderState *st) {
    memset(st, 0, sizeof *st);
    st->epoch = dl->pos.epoch;
    st->shard_pos = dl->pos.shard_pos;
    st->batch_pos = dl->pos.batch_pos;
    st->reserved[0] = DL_STATE_MAGIC;
    st->reserved[1] = dl->nshards;
    st->reserved[2] = (int64_t)dl->num_tokens;
    st->reserved[3] = (int64_t)dl->tokens_per_batch;
    st->reserved[4] = seed_fingerprint(dl);
}

int dataloader_check_state(DataLoader *dl, const DataLoaderState *st, char *err, size_t errlen) {
    const char *first = dl->shards[0].path;
    const int64_t *r = st->reserved;
    int by_hand = r[0] == 0 && r[1] == 0 && r[2] == 0 && r[3] == 0 && r[4] == 0;
    if (!by_hand && r[0] != DL_STATE_MAGIC) {
        snprintf(err, errlen, "data loader state for '%s...' is not one written by dataloader_get_state "
                 "(reserved[0] = %lld, expected %d or all reserved fields 0)",
                 first, (long long)r[0], DL_STATE_MAGIC);
        return -1;
    }
    if (!by_hand && (r[1] != dl->nshards || r[2] != (int64_t)dl->num_tokens)) {
        snprintf(err, errlen, "data loader state was saved for %lld shards with %lld tokens, but the data starting at "
                 "'%s' has %d shards with %zu tokens; resume with the same data files",
                 (long long)r[1], (long long)r[2], first, dl->nshards, dl->num_tokens);
        return -1;
    }
    if (!by_hand && r[3] != (int64_t)dl->tokens_per_batch) {
        snprintf(err, errlen, "data loader state was saved with %lld tokens per global batch (B*T*processes), this run "
                 "has %zu (B=%d, T=%d, %d processes); resume with the same global batch",
                 (long long)r[3], dl->tokens_per_batch, dl->B, dl->T, dl->nproc);
        return -1;
    }
    if (!by_hand && r[4] != seed_fingerprint(dl)) {
        snprintf(err, errlen, "data loader state was saved with %s, this run uses %s; resume with the same "
                 "shuffle setting and seed",
                 r[4] ? "shuffle on" : "shuffle off",
                 dl->shuffle ? (r[4] ? "shuffle on with a different seed" : "shuffle on") : "shuffle off");
        return -1;
    }
    if (st->epoch < 0) {
        snprintf(err, errlen, "data loader state has a negative epoch %lld (data '%s'...)", (long long)st->epoch, first);
        return -1;
    }
    if (st->shard_pos < 0 || st->shard_pos >= dl->nshards) {
        snprintf(err, errlen, "data loader state has shard_pos %lld, but there are %d shards (data '%s'...)",
                 (long long)st->shard_pos, dl->nshards, first);
        return -1;
    }
    int s = plan_shard_at(dl, &dl->caller_plan, st->epoch, st->shard_pos);
    if (st->batch_pos < 0 || st->batch_pos >= dl->shards[s].nbatches) {
        snprintf(err, errlen, "data loader state has batch_pos %lld, but shard '%s' (shard_pos %lld of epoch %lld) has "
                 "%lld global batches of %zu tokens",
                 (long long)st->batch_pos, dl->shards[s].path, (long long)st->shard_pos,
                 (long long)st->epoch, (long long)dl->shards[s].nbatches, dl->tokens_per_batch);
        return -1;
    }
    return 0;
}

void dataloader_set_state(DataLoader *dl, const DataLoaderState *st) {
    char err[DL_ERR_LEN];
    if (dataloader_check_state(dl, st, err, sizeof err) != 0) llmc_die("%s", err);
    Position pos = {st->epoch, st->shard_pos, st->batch_pos};
    move_to(dl, pos);
}
