/*
 * test_dataloader.c - checks llmc/dataloader against the llm.c layout computed here,
 * independently of the loader: global batch k of a shard covers tokens
 * [k*B*T*nproc, (k+1)*B*T*nproc + 1), rank r takes B*T + 1 of them from k*B*T*nproc + r*B*T.
 *
 * Shards are written with shard_write into a fresh mkdtemp directory under /tmp from a fixed,
 * printed seed. Failing inputs run in a forked child whose exit status and message are checked.
 * Usage: test_dataloader            all checks
 *        test_dataloader --bench    measure dataloader_last_wait_ms (prints, checks nothing)
 */
#include "llmc/data/dataloader.h"
#include "llmc/data/shard.h"
#include "test/testing.h"

#include <fcntl.h>
#include <glob.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TEST_SEED 20240611ull
#define GPT2_VOCAB 50257
#define LLAMA3_VOCAB 128256

static char tmp_dir[64];

/* ---- deterministic test data ----------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define MAX_SHARDS 8
typedef struct {
    char pattern[128];
    int nshards;
    char paths[MAX_SHARDS][128]; /* in sorted (glob) order */
    uint32_t *tok[MAX_SHARDS];
    size_t ntok[MAX_SHARDS];
} TestData;

/* Shards <tmp_dir>/<name>_NNN.bin with random tokens in [0, vocab); written in reverse
 * order so the loader's order comes from sorting, not from creation time. */
static void make_data(TestData *d, const char *name, int nshards, const size_t *ntok, int token_bytes,
                      uint32_t vocab) {
    memset(d, 0, sizeof *d);
    d->nshards = nshards;
    snprintf(d->pattern, sizeof d->pattern, "%s/%s_*.bin", tmp_dir, name);
    for (int s = nshards - 1; s >= 0; s--) {
        snprintf(d->paths[s], sizeof d->paths[s], "%s/%s_%03d.bin", tmp_dir, name, s);
        d->ntok[s] = ntok[s];
        d->tok[s] = malloc(ntok[s] * sizeof(uint32_t));
        for (size_t i = 0; i < ntok[s]; i++) d->tok[s][i] = (uint32_t)(rng_next() % vocab);
        shard_write(d->paths[s], d->tok[s], ntok[s], token_bytes);
    }
}

static void free_data(TestData *d) {
    for (int s = 0; s < d->nshards; s++) {
        unlink(d->paths[s]);
        free(d->tok[s]);
    }
}

/* The layout, computed here: rank's slice of global batch k of shard s. */
static void expect_batch(const TestData *d, int s, int64_t k, int B, int T, int rank, int nproc,
                         int32_t *in, int32_t *tg) {
    size_t bt = (size_t)B * T;
    size_t off = (size_t)k * bt * nproc + (size_t)rank * bt;
    for (size_t i = 0; i < bt; i++) {
        in[i] = (int32_t)d->tok[s][off + i];
        tg[i] = (int32_t)d->tok[s][off + i + 1];
    }
}

static int64_t shard_batches(const TestData *d, int s, int B, int T, int nproc) {
    return (int64_t)((d->ntok[s] - 1) / ((size_t)B * T * nproc));
}

/* Which (shard, k) a batch came from; -1 if none matches. */
static int identify(const TestData *d, int B, int T, int rank, int nproc, const int32_t *in, const int32_t *tg,
                    int *shard, int64_t *k) {
    size_t bt = (size_t)B * T;
    int32_t *ein = malloc(bt * 4), *etg = malloc(bt * 4);
    int found = -1;
    for (int s = 0; s < d->nshards && found < 0; s++)
        for (int64_t j = 0; j < shard_batches(d, s, B, T, nproc) && found < 0; j++) {
            expect_batch(d, s, j, B, T, rank, nproc, ein, etg);
            if (!memcmp(ein, in, bt * 4) && !memcmp(etg, tg, bt * 4)) *shard = s, *k = j, found = 0;
        }
    free(ein);
    free(etg);
    return found;
}

/* ---- forked children for the error paths ----------------------------------------------- */

typedef void (*ChildFn)(const void *arg);

/* Runs fn in a child process (stdout and stderr captured into out); returns its exit status,
 * or 128 + signal. */
static int run_child(ChildFn fn, const void *arg, char *out, size_t cap) {
    fflush(stdout);
    fflush(stderr);
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[1]);
        fn(arg);
        fflush(stdout);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    char scratch[4096];
    for (;;) {
        ssize_t r = n + 1 < cap ? read(fds[0], out + n, cap - 1 - n) : read(fds[0], scratch, sizeof scratch);
        if (r <= 0) break;
        if (n + 1 < cap) n += (size_t)r;
    }
    out[n] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The child must exit with status 1 and print "error: " plus every non-NULL needle. */
static void expect_death(const char *name, ChildFn fn, const void *arg, const char *needle1, const char *needle2) {
    char out[1 << 16];
    int rc = run_child(fn, arg, out, sizeof out);
    int ok = rc == 1 && strstr(out, "error: ") && (!needle1 || strstr(out, needle1)) &&
             (!needle2 || strstr(out, needle2));
    test_report(ok, name, "exit status %d (want 1), output must contain 'error: '%s%s%s%s; got:\n%s", rc,
                needle1 ? ", '" : "", needle1 ? needle1 : "", needle2 ? "', '" : "", needle2 ? needle2 : "", out);
    if (ok) {
        char *nl = strstr(out, "error: ");
        printf("      (%.*s)\n", (int)strcspn(nl, "\n"), nl);
    }
}

/* ---- tests ----------------------------------------------------------------------------- */

/* Sequential order, wrapping, sizes and get_state against the layout computed here. */
static void test_sequential(const TestData *d, int B, int T, int rank, int nproc, int prefetch) {
    char name[128];
    snprintf(name, sizeof name, "sequential llm.c layout B=%d T=%d rank %d/%d prefetch=%d", B, T, rank, nproc,
             prefetch);
    DataLoader *dl = dataloader_open(d->pattern, B, T, rank, nproc, 0, 0, GPT2_VOCAB, prefetch);
    size_t bt = (size_t)B * T, tokens = 0;
    int64_t bpe = 0;
    for (int s = 0; s < d->nshards; s++) bpe += shard_batches(d, s, B, T, nproc), tokens += d->ntok[s];
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4), *ein = malloc(bt * 4), *etg = malloc(bt * 4);
    char why[256] = "";
    if (dataloader_num_shards(dl) != d->nshards || dataloader_num_tokens(dl) != tokens ||
        (int64_t)dataloader_batches_per_epoch(dl) != bpe)
        snprintf(why, sizeof why, "sizes: %d shards %zu tokens %zu batches, want %d %zu %lld",
                 dataloader_num_shards(dl), dataloader_num_tokens(dl), dataloader_batches_per_epoch(dl),
                 d->nshards, tokens, (long long)bpe);
    /* 2.5 epochs: wraps twice; epoch 1 and 2 repeat epoch 0 */
    for (int64_t epoch = 0, n = 0; epoch < 3 && !why[0]; epoch++)
        for (int s = 0; s < d->nshards && !why[0]; s++)
            for (int64_t k = 0; k < shard_batches(d, s, B, T, nproc) && !why[0]; k++, n++) {
                if (n >= bpe * 5 / 2) break;
                DataLoaderState st;
                dataloader_get_state(dl, &st);
                if (st.epoch != epoch || st.shard_pos != s || st.batch_pos != k) {
                    snprintf(why, sizeof why, "before batch %lld: state (%lld,%lld,%lld), want (%lld,%d,%lld)",
                             (long long)n, (long long)st.epoch, (long long)st.shard_pos, (long long)st.batch_pos,
                             (long long)epoch, s, (long long)k);
                    break;
                }
                dataloader_next(dl, in, tg);
                expect_batch(d, s, k, B, T, rank, nproc, ein, etg);
                if (memcmp(in, ein, bt * 4) || memcmp(tg, etg, bt * 4))
                    snprintf(why, sizeof why, "batch %lld (epoch %lld shard %d k %lld) differs from the layout",
                             (long long)n, (long long)epoch, s, (long long)k);
            }
    test_report(!why[0], name, "%s", why);
    dataloader_close(dl);
    free(in), free(tg), free(ein), free(etg);
}

/* P ranks with micro-batch B together see exactly what one process with B*P sees. */
static void test_ranks_cover(const TestData *d, int B, int T, int P, int shuffle) {
    char name[128];
    snprintf(name, sizeof name, "ranks P=%d x B=%d == one process B=%d (T=%d, shuffle=%d)", P, B, B * P, T, shuffle);
    size_t bt = (size_t)B * T;
    DataLoader *one = dataloader_open(d->pattern, B * P, T, 0, 1, shuffle, 7, GPT2_VOCAB, 0);
    DataLoader *rk[4];
    for (int r = 0; r < P; r++) rk[r] = dataloader_open(d->pattern, B, T, r, P, shuffle, 7, GPT2_VOCAB, r & 1);
    int32_t *bin = malloc(bt * P * 4), *btg = malloc(bt * P * 4), *in = malloc(bt * 4), *tg = malloc(bt * 4);
    int64_t nb = (int64_t)dataloader_batches_per_epoch(one) * 3 / 2;
    char why[160] = "";
    if (dataloader_batches_per_epoch(rk[P - 1]) != dataloader_batches_per_epoch(one))
        snprintf(why, sizeof why, "batches per epoch %zu vs %zu", dataloader_batches_per_epoch(rk[P - 1]),
                 dataloader_batches_per_epoch(one));
    for (int64_t n = 0; n < nb && !why[0]; n++) {
        dataloader_next(one, bin, btg);
        for (int r = 0; r < P; r++) {
            dataloader_next(rk[r], in, tg);
            if (memcmp(in, bin + r * bt, bt * 4) || memcmp(tg, btg + r * bt, bt * 4)) {
                snprintf(why, sizeof why, "batch %lld: rank %d's slice differs from rows [%d, %d) of B*P",
                         (long long)n, r, r * B, (r + 1) * B);
                break;
            }
        }
    }
    test_report(!why[0], name, "%s", why);
    dataloader_close(one);
    for (int r = 0; r < P; r++) dataloader_close(rk[r]);
    free(bin), free(btg), free(in), free(tg);
}

/* Reads n batches; records which (shard, k) each was as shard * 1e6 + k. Returns -1 if a
 * batch is not one of the layout's batches. */
static int record_order(const TestData *d, DataLoader *dl, int B, int T, int64_t n, int64_t *order) {
    size_t bt = (size_t)B * T;
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4);
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        int s = -1;
        int64_t k = -1;
        dataloader_next(dl, in, tg);
        rc = identify(d, B, T, 0, 1, in, tg, &s, &k);
        order[i] = s * 1000000 + k;
    }
    free(in), free(tg);
    return rc;
}

static void test_shuffle(const TestData *d) {
    const int B = 2, T = 8;
    const uint64_t seed = 1337;
    DataLoader *dl = dataloader_open(d->pattern, B, T, 0, 1, 1, seed, GPT2_VOCAB, 1);
    int64_t bpe = (int64_t)dataloader_batches_per_epoch(dl);
    int64_t *order = malloc(3 * bpe * sizeof(int64_t)), *again = malloc(3 * bpe * sizeof(int64_t));
    int ok = record_order(d, dl, B, T, 3 * bpe, order) == 0;
    test_report(ok, "shuffle: every batch is one of the layout's batches", "an unknown batch was returned");
    dataloader_close(dl);
    if (!ok) goto out;

    /* each epoch: every (shard, k) once, shards contiguous (shard order x batch order) */
    for (int e = 0; e < 3; e++) {
        char why[160] = "";
        int switches = 0;
        for (int64_t i = 0; i < bpe && !why[0]; i++) {
            int64_t v = order[e * bpe + i];
            for (int64_t j = 0; j < i; j++)
                if (order[e * bpe + j] == v) snprintf(why, sizeof why, "batch %lld seen twice", (long long)v);
            if (i > 0 && v / 1000000 != order[e * bpe + i - 1] / 1000000) switches++;
        }
        if (!why[0] && switches != d->nshards - 1)
            snprintf(why, sizeof why, "%d shard changes in one epoch, want %d (each shard contiguous)", switches,
                     d->nshards - 1);
        char name[96];
        snprintf(name, sizeof name, "shuffle: epoch %d visits all %lld batches exactly once", e, (long long)bpe);
        test_report(!why[0], name, "%s", why);
    }
    /* the shard order itself is permuted per epoch: the three epochs' shard orders differ */
    int shard_seq[3][MAX_SHARDS] = {{0}}, nseq[3] = {0, 0, 0};
    for (int e = 0; e < 3; e++)
        for (int64_t i = 0; i < bpe; i++)
            if (i == 0 || order[e * bpe + i] / 1000000 != order[e * bpe + i - 1] / 1000000)
                if (nseq[e] < MAX_SHARDS) shard_seq[e][nseq[e]++] = (int)(order[e * bpe + i] / 1000000);
    int all_same = !memcmp(shard_seq[0], shard_seq[1], sizeof shard_seq[0]) &&
                   !memcmp(shard_seq[1], shard_seq[2], sizeof shard_seq[0]);
    test_report(!all_same, "shuffle: shard order is permuted per epoch (epochs 0-2 not all equal)",
                "epochs 0, 1 and 2 visit the shards in the same order");
    int64_t seq_same = 0, e1_same = 0;
    for (int64_t i = 0, s = 0, k = 0; i < bpe; i++) {
        if (order[i] == s * 1000000 + k) seq_same++;
        if (++k == shard_batches(d, (int)s, B, T, 1)) k = 0, s++;
        if (order[i] == order[bpe + i]) e1_same++;
    }
    test_report(seq_same < bpe / 4, "shuffle: epoch 0 is not the sequential order", "%lld of %lld in place",
                (long long)seq_same, (long long)bpe);
    test_report(e1_same < bpe / 4, "shuffle: epoch 1 order differs from epoch 0", "%lld of %lld positions equal",
                (long long)e1_same, (long long)bpe);

    dl = dataloader_open(d->pattern, B, T, 0, 1, 1, seed, GPT2_VOCAB, 0);
    ok = record_order(d, dl, B, T, 3 * bpe, again) == 0 && !memcmp(order, again, 3 * bpe * sizeof(int64_t));
    test_report(ok, "shuffle: same seed -> same order (3 epochs, prefetch on vs off)", "orders differ");
    dataloader_close(dl);
    dl = dataloader_open(d->pattern, B, T, 0, 1, 1, seed + 1, GPT2_VOCAB, 0);
    ok = record_order(d, dl, B, T, bpe, again) == 0 && memcmp(order, again, bpe * sizeof(int64_t));
    test_report(ok, "shuffle: another seed -> another order", "same order for seeds %llu and %llu",
                (unsigned long long)seed, (unsigned long long)seed + 1);
    dataloader_close(dl);
out:
    free(order), free(again);
}

/* Compares n next batches of a and b. */
static int same_batches(DataLoader *a, DataLoader *b, size_t bt, int64_t n, char *why, size_t whylen) {
    int32_t *ai = malloc(bt * 4), *at = malloc(bt * 4), *bi = malloc(bt * 4), *btg = malloc(bt * 4);
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        dataloader_next(a, ai, at);
        dataloader_next(b, bi, btg);
        if (memcmp(ai, bi, bt * 4) || memcmp(at, btg, bt * 4)) {
            snprintf(why, whylen, "batch %lld after the split differs", (long long)i);
            ok = 0;
        }
    }
    free(ai), free(at), free(bi), free(btg);
    return ok;
}

static void skip_batches(DataLoader *dl, size_t bt, int64_t n) {
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4);
    for (int64_t i = 0; i < n; i++) dataloader_next(dl, in, tg);
    free(in), free(tg);
}

/* get_state after k batches -> a fresh loader + set_state continues identically. */
static void test_resume(const TestData *d) {
    const int B = 2, T = 8;
    const size_t bt = (size_t)B * T;
    DataLoader *probe = dataloader_open(d->pattern, B, T, 1, 2, 1, 99, GPT2_VOCAB, 0);
    int64_t bpe = (int64_t)dataloader_batches_per_epoch(probe);
    dataloader_close(probe);
    int64_t ks[] = {0, 5, bpe - 3, bpe - 1, bpe, 2 * bpe + 1};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        DataLoader *a = dataloader_open(d->pattern, B, T, 1, 2, 1, 99, GPT2_VOCAB, 1);
        DataLoader *b = dataloader_open(d->pattern, B, T, 1, 2, 1, 99, GPT2_VOCAB, 1);
        skip_batches(a, bt, ks[i]);
        skip_batches(b, bt, 3); /* b has consumed and prefetched something that must be discarded */
        DataLoaderState st;
        dataloader_get_state(a, &st);
        dataloader_set_state(b, &st);
        char why[160] = "", name[128];
        int ok = same_batches(a, b, bt, 8, why, sizeof why);
        if (ok && ks[i] == bpe && !(st.epoch == 1 && st.shard_pos == 0 && st.batch_pos == 0)) {
            snprintf(why, sizeof why, "state after one epoch is (%lld,%lld,%lld), want (1,0,0)", (long long)st.epoch,
                     (long long)st.shard_pos, (long long)st.batch_pos);
            ok = 0;
        }
        snprintf(name, sizeof name, "resume: state after %lld batches (epoch %lld) continues identically",
                 (long long)ks[i], (long long)st.epoch);
        test_report(ok, name, "%s", why);
        dataloader_close(a);
        dataloader_close(b);
    }

    /* reset == a fresh loader; a hand-written state (reserved all 0) is accepted */
    DataLoader *a = dataloader_open(d->pattern, B, T, 0, 1, 1, 5, GPT2_VOCAB, 1);
    DataLoader *b = dataloader_open(d->pattern, B, T, 0, 1, 1, 5, GPT2_VOCAB, 0);
    skip_batches(a, bt, bpe + 7);
    dataloader_reset(a);
    char why[160] = "";
    test_report(same_batches(a, b, bt, bpe + 3, why, sizeof why), "reset: back to the first batch of epoch 0", "%s",
                why);
    dataloader_close(a);
    dataloader_close(b);

    a = dataloader_open(d->pattern, B, T, 0, 1, 0, 0, GPT2_VOCAB, 1);
    DataLoaderState st = {0, 2, 3, {0}};
    dataloader_set_state(a, &st);
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4), *ein = malloc(bt * 4), *etg = malloc(bt * 4);
    dataloader_next(a, in, tg);
    expect_batch(d, 2, 3, B, T, 0, 1, ein, etg);
    test_report(!memcmp(in, ein, bt * 4) && !memcmp(tg, etg, bt * 4),
                "set_state: hand-written {epoch 0, shard 2, batch 3} gives that batch", "wrong batch");
    dataloader_close(a);
    free(in), free(tg), free(ein), free(etg);
}

static void test_prefetch_equal(const TestData *d, int shuffle) {
    const int B = 3, T = 5;
    DataLoader *on = dataloader_open(d->pattern, B, T, 1, 2, shuffle, 42, GPT2_VOCAB, 1);
    DataLoader *off = dataloader_open(d->pattern, B, T, 1, 2, shuffle, 42, GPT2_VOCAB, 0);
    int64_t n = (int64_t)dataloader_batches_per_epoch(on) * 5 / 2;
    char why[160] = "", name[96];
    snprintf(name, sizeof name, "prefetch on == off (2.5 epochs, shuffle=%d)", shuffle);
    test_report(same_batches(on, off, (size_t)B * T, n, why, sizeof why), name, "%s", why);
    dataloader_close(on);
    dataloader_close(off);
}

static void test_uint32(void) {
    TestData d;
    size_t ntok[2] = {3001, 1500};
    make_data(&d, "u32", 2, ntok, 4, LLAMA3_VOCAB);
    uint32_t big = 0;
    for (size_t i = 0; i < ntok[0]; i++) big = d.tok[0][i] > big ? d.tok[0][i] : big;
    test_report(big > 0xFFFF, "uint32 shards: test data has tokens > 65535", "max token %u", big);
    const int B = 4, T = 32;
    DataLoader *dl = dataloader_open(d.pattern, B, T, 0, 1, 0, 0, LLAMA3_VOCAB, 1);
    size_t bt = (size_t)B * T;
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4), *ein = malloc(bt * 4), *etg = malloc(bt * 4);
    int ok = 1;
    for (int s = 0; s < 2; s++)
        for (int64_t k = 0; k < shard_batches(&d, s, B, T, 1); k++) {
            dataloader_next(dl, in, tg);
            expect_batch(&d, s, k, B, T, 0, 1, ein, etg);
            ok &= !memcmp(in, ein, bt * 4) && !memcmp(tg, etg, bt * 4);
        }
    test_report(ok, "uint32 shards (magic 20240801): one epoch matches the layout", "a batch differs");
    dataloader_close(dl);
    free(in), free(tg), free(ein), free(etg);
    free_data(&d);
}

/* A sparse uint16 shard of > 2 GiB: a batch near its end, at byte offsets > 2^31. */
static void test_sparse_big(void) {
    const int B = 4, T = 64;
    const size_t ntok = (size_t)1200 * 1000 * 1000; /* 2.4 GB of tokens */
    char path[128];
    snprintf(path, sizeof path, "%s/big_000.bin", tmp_dir);
    int32_t h[SHARD_HEADER_INTS] = {SHARD_MAGIC_U16, SHARD_VERSION_U16, (int32_t)ntok};
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    int ok = fd >= 0 && write(fd, h, sizeof h) == (ssize_t)sizeof h &&
             ftruncate(fd, (off_t)(SHARD_HEADER_BYTES + ntok * 2)) == 0;
    size_t bt = (size_t)B * T;
    int64_t nb = (int64_t)((ntok - 1) / bt);
    size_t start = (size_t)(nb - 1) * bt; /* the last batch */
    uint16_t tail[B * T + 1];
    for (size_t i = 0; i <= bt; i++) tail[i] = (uint16_t)(1 + rng_next() % (GPT2_VOCAB - 1));
    off_t off = (off_t)(SHARD_HEADER_BYTES + start * 2);
    ok = ok && pwrite(fd, tail, sizeof tail, off) == (ssize_t)sizeof tail;
    if (fd >= 0) close(fd);
    if (!ok) {
        test_report(0, "sparse 2.4 GB shard", "could not create %s", path);
        unlink(path);
        return;
    }
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/big_*.bin", tmp_dir);
    DataLoader *dl = dataloader_open(pattern, B, T, 0, 1, 0, 0, GPT2_VOCAB, 1);
    DataLoaderState st = {0, 0, nb - 1, {0}};
    dataloader_set_state(dl, &st);
    int32_t in[B * T], tg[B * T];
    dataloader_next(dl, in, tg);
    int same = 1;
    for (size_t i = 0; i < bt; i++) same &= in[i] == tail[i] && tg[i] == tail[i + 1];
    test_report(same && (int64_t)dataloader_batches_per_epoch(dl) == nb && dataloader_num_tokens(dl) == ntok,
                "sparse 2.4 GB uint16 shard: last batch (byte offset > 2^31) read correctly",
                "batch differs or sizes wrong (%zu batches, want %lld)", dataloader_batches_per_epoch(dl),
                (long long)nb);
    dataloader_next(dl, in, tg); /* wraps to batch 0: zeros of the hole */
    DataLoaderState after;
    dataloader_get_state(dl, &after);
    test_report(in[0] == 0 && after.epoch == 1 && after.batch_pos == 1, "sparse shard: wraps to epoch 1",
                "token %d, state (%lld,%lld,%lld)", in[0], (long long)after.epoch, (long long)after.shard_pos,
                (long long)after.batch_pos);
    dataloader_close(dl);
    unlink(path);
}

/* The content CRC the ranks compare (dataloader_content_crc): a sparse shard (holes read as
 * zeros, skipped by the scan: 3 MiB + 7 of them, not a multiple of the scan's chunk) has the CRC of
 * the same bytes written out; one token changed anywhere changes it. */
static void write_tokens_at(const char *path, size_t ntok, const uint16_t *toks, const size_t *at, int n, int dense) {
    int32_t h[SHARD_HEADER_INTS] = {SHARD_MAGIC_U16, SHARD_VERSION_U16, (int32_t)ntok};
    FILE *f = fopen(path, "wb");
    fwrite(h, sizeof h, 1, f);
    if (dense) {
        uint16_t *all = calloc(ntok, 2);
        for (int i = 0; i < n; i++) all[at[i]] = toks[i];
        fwrite(all, 2, ntok, f);
        free(all);
    } else {
        if (ftruncate(fileno(f), (off_t)(SHARD_HEADER_BYTES + ntok * 2)) != 0) perror("ftruncate");
        for (int i = 0; i < n; i++) {
            fseek(f, (long)(SHARD_HEADER_BYTES + at[i] * 2), SEEK_SET);
            fwrite(&toks[i], 2, 1, f);
        }
    }
    fclose(f);
}

static uint32_t content_crc_of(const char *path) {
    DataLoader *dl = dataloader_open(path, 2, 8, 0, 1, 0, 0, GPT2_VOCAB, 0);
    uint32_t crc = dataloader_content_crc(dl);
    dataloader_close(dl);
    return crc;
}

static void test_content_crc(void) {
    const size_t ntok = (3u << 20) / 2 * 3 + 7; /* 9 MiB + 14 bytes of tokens */
    const size_t at[4] = {0, 1234567, 3 * (1u << 19) + 1, ntok - 1};
    const uint16_t toks[4] = {17, 50000, 3, 999};
    char sparse[128], dense[128], changed[128];
    snprintf(sparse, sizeof sparse, "%s/crc_sparse.bin", tmp_dir);
    snprintf(dense, sizeof dense, "%s/crc_dense.bin", tmp_dir);
    snprintf(changed, sizeof changed, "%s/crc_changed.bin", tmp_dir);
    write_tokens_at(sparse, ntok, toks, at, 4, 0);
    write_tokens_at(dense, ntok, toks, at, 4, 1);
    const uint16_t other[4] = {17, 50000, 4, 999};
    write_tokens_at(changed, ntok, other, at, 4, 1);
    uint32_t a = content_crc_of(sparse), b = content_crc_of(dense), c = content_crc_of(changed);
    test_report(a == b, "content CRC: a sparse shard equals the same bytes written densely", "%08x vs %08x", a, b);
    test_report(b != c, "content CRC: one token changed changes it", "both %08x", b);
    unlink(sparse), unlink(dense), unlink(changed);
}

/* ---- error paths (each in a child) ------------------------------------------------------ */

typedef struct {
    const char *pattern;
    int B, T, rank, nproc, prefetch, vocab;
    int64_t nbatches;        /* how many dataloader_next calls to make */
    DataLoaderState state;   /* set before reading when use_state */
    int use_state;
} ChildArgs;

static void child_read(const void *argp) {
    const ChildArgs *a = argp;
    DataLoader *dl = dataloader_open(a->pattern, a->B, a->T, a->rank, a->nproc, 0, 0, a->vocab, a->prefetch);
    if (a->use_state) dataloader_set_state(dl, &a->state);
    size_t bt = (size_t)a->B * a->T;
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4);
    for (int64_t i = 0; i < a->nbatches; i++) {
        dataloader_next(dl, in, tg);
        printf("batches-ok %lld\n", (long long)i + 1);
        fflush(stdout);
    }
    dataloader_close(dl);
    free(in), free(tg);
}

static void child_state_from_other_batch(const void *argp) {
    const ChildArgs *a = argp;
    DataLoader *other = dataloader_open(a->pattern, a->B * 2, a->T, 0, 1, 0, 0, a->vocab, 0);
    DataLoaderState st;
    dataloader_get_state(other, &st);
    dataloader_close(other);
    DataLoader *dl = dataloader_open(a->pattern, a->B, a->T, 0, 1, 0, 0, a->vocab, 0);
    dataloader_set_state(dl, &st);
}

static void child_state_other_seed(const void *argp) {
    const ChildArgs *a = argp;
    DataLoader *other = dataloader_open(a->pattern, a->B, a->T, 0, 1, 1, 1, a->vocab, 0);
    DataLoaderState st;
    dataloader_get_state(other, &st);
    dataloader_close(other);
    DataLoader *dl = dataloader_open(a->pattern, a->B, a->T, 0, 1, 1, 2, a->vocab, 1);
    dataloader_set_state(dl, &st);
}

/* A token >= vocab_size at position p of the second shard: dataloader_open dies before any batch
 * is read (every shard is checked whole at open), naming the shard, the position and the token;
 * also for a token in the shard's tail that no batch reads. */
static void test_bad_token(int prefetch, int in_tail) {
    const int B = 2, T = 8;
    const size_t bt = (size_t)B * T;
    TestData d;
    size_t ntok[2] = {100, 200};
    make_data(&d, "vocab", 2, ntok, 2, GPT2_VOCAB);
    size_t p = in_tail ? ntok[1] - 1 : 4 * bt + 5; /* 199: past the last global batch's +1 token */
    uint32_t bad = in_tail ? 60000 : GPT2_VOCAB; /* == vocab_size is already out of range */
    d.tok[1][p] = bad;
    shard_write(d.paths[1], d.tok[1], ntok[1], 2);
    ChildArgs a = {d.pattern, B, T, 0, 1, prefetch, GPT2_VOCAB, 3, {0, 0, 0, {0}}, 0};
    char name[128], pos[64], badtok[32], out[1 << 16];
    snprintf(badtok, sizeof badtok, "token %u ", bad);
    snprintf(name, sizeof name, "token >= vocab_size (%s) -> error at open, before any batch, prefetch=%d",
             in_tail ? "in the shard's unread tail" : "in a batch", prefetch);
    snprintf(pos, sizeof pos, "position %zu", p);
    int rc = run_child(child_read, &a, out, sizeof out);
    int ok = rc == 1 && strstr(out, d.paths[1]) && strstr(out, pos) && strstr(out, badtok) &&
             !strstr(out, "batches-ok");
    test_report(ok, name, "exit %d; want 1, '%s', '%s', '%s' and no batch; got:\n%s", rc, d.paths[1], pos, badtok,
                out);
    if (ok) printf("      (%.*s)\n", (int)strcspn(strstr(out, "error: "), "\n"), strstr(out, "error: "));
    free_data(&d);
}

/* A shard truncated while a loader reads it: the next batch from the lost part is an error naming
 * the shard (pread sees the short file; a memory map would die of SIGBUS), prefetch on and off. */
static void child_truncate_mid_run(const void *argp) {
    const ChildArgs *a = argp;
    DataLoader *dl = dataloader_open(a->pattern, a->B, a->T, 0, 1, 0, 0, a->vocab, a->prefetch);
    size_t bt = (size_t)a->B * a->T;
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4);
    dataloader_next(dl, in, tg);
    printf("batches-ok 1\n");
    fflush(stdout);
    glob_t g;
    if (glob(a->pattern, 0, NULL, &g) == 0) {
        if (truncate(g.gl_pathv[0], SHARD_HEADER_BYTES + 10) != 0) perror("truncate");
        globfree(&g);
    }
    for (int i = 0; i < 50; i++) dataloader_next(dl, in, tg);
    printf("survived\n");
    dataloader_close(dl);
    free(in), free(tg);
}

static void test_truncated_while_reading(int prefetch) {
    TestData d;
    size_t ntok[1] = {4000};
    make_data(&d, "trunc", 1, ntok, 2, GPT2_VOCAB);
    ChildArgs a = {d.pattern, 2, 8, 0, 1, prefetch, GPT2_VOCAB, 0, {0, 0, 0, {0}}, 0};
    char name[128], out[1 << 16];
    snprintf(name, sizeof name, "shard truncated while in use -> error naming it, no SIGBUS, prefetch=%d", prefetch);
    int rc = run_child(child_truncate_mid_run, &a, out, sizeof out);
    int ok = rc == 1 && strstr(out, "batches-ok 1") && strstr(out, d.paths[0]) && strstr(out, "truncated") &&
             !strstr(out, "survived");
    test_report(ok, name, "exit %d (want 1); output:\n%s", rc, out);
    free_data(&d);
}

static void test_bad_inputs(const TestData *good) {
    char pattern[128], path[128];
    ChildArgs a = {pattern, 2, 8, 0, 1, 0, GPT2_VOCAB, 1, {0, 0, 0, {0}}, 0};

    snprintf(pattern, sizeof pattern, "%s/nothing_*.bin", tmp_dir);
    expect_death("glob with no match -> error naming the pattern", child_read, &a, "no data shard matches", pattern);
    snprintf(pattern, sizeof pattern, "%s/no_such_dir/shard_*.bin", tmp_dir);
    snprintf(path, sizeof path, "%s/no_such_dir", tmp_dir);
    expect_death("glob under a missing directory -> error naming the directory", child_read, &a, "cannot read directory", path);

    uint32_t toks[400];
    for (int i = 0; i < 400; i++) toks[i] = (uint32_t)(rng_next() % GPT2_VOCAB);
    snprintf(pattern, sizeof pattern, "%s/bad_*.bin", tmp_dir);
    snprintf(path, sizeof path, "%s/bad_000.bin", tmp_dir);

    shard_write(path, toks, 400, 2);
    if (truncate(path, SHARD_HEADER_BYTES + 300 * 2) != 0) perror("truncate");
    expect_death("truncated shard -> error naming the file", child_read, &a, path, "truncated");

    shard_write(path, toks, 400, 2);
    int fd = open(path, O_WRONLY);
    int32_t magic = 12345;
    if (fd < 0 || pwrite(fd, &magic, 4, 0) != 4) perror("pwrite");
    if (fd >= 0) close(fd);
    expect_death("wrong magic -> error naming the file", child_read, &a, path, "magic 12345");

    shard_write(path, toks, 16, 2); /* B*T*nproc + 1 = 17 tokens needed */
    expect_death("shard too short for one global batch -> error", child_read, &a, path, "too few");
    shard_write(path, toks, 17, 2);
    test_report(run_child(child_read, &a, (char[4096]){0}, 4096) == 0, "shard of exactly B*T*nproc + 1 tokens is fine",
                "the child failed");
    unlink(path);

    ChildArgs r = {good->pattern, 2, 8, 3, 3, 0, GPT2_VOCAB, 1, {0, 0, 0, {0}}, 0};
    expect_death("rank >= nproc -> error", child_read, &r, "rank 3", NULL);

    ChildArgs s = {good->pattern, 2, 8, 0, 1, 1, GPT2_VOCAB, 1, {0, 3, 0, {0}}, 1};
    expect_death("set_state: shard_pos out of range -> error", child_read, &s, "shard_pos 3", "3 shards");
    s.state.shard_pos = 1;
    s.state.batch_pos = shard_batches(good, 1, 2, 8, 1);
    expect_death("set_state: batch_pos out of range -> error", child_read, &s, "batch_pos", good->paths[1]);
    s.state.batch_pos = 0;
    s.state.epoch = -1;
    expect_death("set_state: negative epoch -> error", child_read, &s, "negative epoch", NULL);
    expect_death("set_state: state from another global batch size -> error", child_state_from_other_batch, &s,
                 "tokens per global batch", NULL);
    expect_death("set_state: state from another shuffle seed -> error", child_state_other_seed, &s, "seed", NULL);
}

/* ---- wait-time measurement ------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench(void) {
    TestData d;
    size_t ntok[2] = {(size_t)64 << 20, (size_t)64 << 20}; /* 2 x 128 MiB */
    make_data(&d, "bench", 2, ntok, 2, GPT2_VOCAB);
    enum { nbatches = 200 };
    const int B = 16, T = 1024;
    const double work_ms = 3.0;
    size_t bt = (size_t)B * T;
    int32_t *in = malloc(bt * 4), *tg = malloc(bt * 4);
    printf("bench: B=%d T=%d, %d batches, consumer works %.1f ms per batch, shuffle=1, pages evicted first\n", B, T,
           nbatches, work_ms);
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        for (int s = 0; s < 2; s++) { /* cold start: drop our shards from the page cache */
            int fd = open(d.paths[s], O_RDONLY);
            if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
        }
        DataLoader *dl = dataloader_open(d.pattern, B, T, 0, 1, 1, 3, GPT2_VOCAB, prefetch);
        double waits[nbatches], total = 0, t0 = now_ms();
        for (int i = 0; i < nbatches; i++) {
            dataloader_next(dl, in, tg);
            waits[i] = dataloader_last_wait_ms(dl);
            if (i > 0) total += waits[i];
            struct timespec ts = {0, (long)(work_ms * 1e6)};
            nanosleep(&ts, NULL);
        }
        double loop_ms = now_ms() - t0, first = waits[0];
        qsort(waits + 1, nbatches - 1, sizeof(double), cmp_double);
        printf("bench: prefetch=%d  first batch %.3f ms; batches 2..%d: mean %.4f ms, median %.4f, p90 %.4f, "
               "max %.3f; loop %.0f ms\n",
               prefetch, first, nbatches, total / (nbatches - 1), waits[nbatches / 2], waits[nbatches * 9 / 10],
               waits[nbatches - 1], loop_ms);
        dataloader_close(dl);
    }
    free(in), free(tg);
    free_data(&d);
}

int main(int argc, char **argv) {
    (void)test_close; /* testing.h helper this binary does not need; silences -Wunused-function */
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/llmc_test_dataloader_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    rng_state = TEST_SEED;
    printf("test_dataloader: seed %llu, shards in %s\n", (unsigned long long)TEST_SEED, tmp_dir);
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        bench();
        rmdir(tmp_dir);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--bench]\n", argv[0]);
        return 2;
    }

    TestData d;
    size_t ntok[3] = {1000, 617, 2345};
    make_data(&d, "train", 3, ntok, 2, GPT2_VOCAB);
    test_sequential(&d, 2, 8, 0, 1, 0);
    test_sequential(&d, 2, 8, 0, 1, 1);
    test_sequential(&d, 3, 5, 1, 2, 1);
    test_sequential(&d, 1, 16, 2, 3, 0);
    test_sequential(&d, 4, 64, 0, 1, 1);
    for (int P = 1; P <= 3; P++) {
        test_ranks_cover(&d, 2, 8, P, 0);
        test_ranks_cover(&d, 2, 8, P, 1);
    }
    test_shuffle(&d);
    test_resume(&d);
    test_prefetch_equal(&d, 0);
    test_prefetch_equal(&d, 1);
    test_uint32();
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        test_bad_token(prefetch, 0);
        test_bad_token(prefetch, 1);
        test_truncated_while_reading(prefetch);
    }
    test_bad_inputs(&d);
    test_sparse_big();
    test_content_crc();
    free_data(&d);
    rmdir(tmp_dir);
    return test_exit_code();
}
