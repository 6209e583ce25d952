/* statefile.c - the training-state file (statefile.h). */
#include "llmc/formats/statefile.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put64(int32_t *h, int at, uint64_t v) {
    h[at] = (int32_t)(uint32_t)(v & 0xFFFFFFFFu);
    h[at + 1] = (int32_t)(uint32_t)(v >> 32);
}
static uint64_t get64(const int32_t *h, int at) {
    return (uint64_t)(uint32_t)h[at] | ((uint64_t)(uint32_t)h[at + 1] << 32);
}

static void state_header(int32_t h[256], const TrainState *st) {
    memset(h, 0, 256 * sizeof(int32_t));
    h[0] = STATE_MAGIC;
    h[1] = st->gc_ranks ? 4 : 3; /* (version 4 only where there is its section: other files stay as they were) */
    h[2] = st->step;
    put64(h, 3, st->numel);
    h[5] = st->B;
    h[6] = st->T;
    h[7] = st->processes;
    h[8] = st->rank;
    h[9] = st->shuffle;
    put64(h, 10, st->seed);
    for (int i = 0; i < 8; i++) put64(h, 12 + 2 * i, (uint64_t)st->loader[i]);
    put64(h, 28, st->sampler_rng);
    h[30] = st->optimizer ? st->optimizer : 1;
    for (int i = 0; i < 4; i++) put64(h, 32 + 2 * i, (uint64_t)st->backend[i]);
    h[40] = (int32_t)st->model_crc;
    h[41] = st->has_model_crc ? 1 : 0;
    if (st->gc_ranks) {
        h[43] = st->gc_kind;
        h[44] = st->gc_param;
        h[45] = st->gc_ranks;
        put64(h, 46, st->gc_floats);
        put64(h, 48, st->gc_shared);
    }
}

/* CRC-32 of the header (with its own checksum word [42] zero) and both moment arrays. */
static uint32_t state_crc(const int32_t h[256], const float *m, const float *v, size_t numel) {
    int32_t hz[256];
    memcpy(hz, h, sizeof hz);
    hz[42] = 0;
    uint32_t crc = sumfile_crc_update(sumfile_crc_update(0, NULL, 0), hz, sizeof hz);
    crc = sumfile_crc_update(crc, m, numel * sizeof(float));
    return sumfile_crc_update(crc, v, numel * sizeof(float));
}

static const float *whole_moment(void *ctx, int is_v, size_t offset, size_t count, float *scratch) {
    (void)count, (void)scratch;
    return ((const float *const *)ctx)[is_v] + offset;
}

void state_file_save(const char *path, const TrainState *st, const float *m, const float *v) {
    const float *mv[2] = {m, v};
    state_file_save_chunks(path, st, whole_moment, mv);
}

/* The header goes first with its checksum word 0, the moments after it chunk by chunk (the
 * checksum, state_crc's, accumulated on the way), then the header again with the checksum. */
void state_file_save_chunks(const char *path, const TrainState *st, StateMomentFn moment, void *ctx) {
    int32_t h[256];
    state_header(h, st);
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(h, 4, 256, af.f, af.tmp_path);
    uint32_t crc = sumfile_crc_update(sumfile_crc_update(0, NULL, 0), h, sizeof h);
    float *scratch = (float *)mallocCheck(STATE_CHUNK * sizeof(float), "training state chunk");
    for (int is_v = 0; is_v < 2; is_v++)
        for (size_t off = 0; off < st->numel; off += STATE_CHUNK) {
            const size_t count = st->numel - off < STATE_CHUNK ? st->numel - off : STATE_CHUNK;
            const float *x = moment(ctx, is_v, off, count, scratch);
            crc = sumfile_crc_update(crc, x, count * sizeof(float));
            fwriteCheck(x, sizeof(float), count, af.f, af.tmp_path);
        }
    free(scratch);
    if (st->gc_ranks) {
        const size_t k = (size_t)st->gc_ranks * st->gc_floats + st->gc_shared;
        crc = sumfile_crc_update(crc, st->gc_data, k * sizeof(float));
        fwriteCheck(st->gc_data, sizeof(float), k, af.f, af.tmp_path);
    }
    h[42] = (int32_t)crc;
    if (fseek(af.f, 0, SEEK_SET) != 0) llmc_die("cannot seek in '%s' to write its header", af.tmp_path);
    fwriteCheck(h, 4, 256, af.f, af.tmp_path);
    atomic_commit(&af);
}

void state_file_load(const char *path, TrainState *st, float *m, float *v, size_t expect_numel) {
    FILE *f = sumfile_open_for_reading(path, "training state");
    int32_t h[256];
    if (fread(h, 4, 256, f) != 256) llmc_die("training state '%s' is truncated (shorter than its header)", path);
    if (h[0] != STATE_MAGIC) llmc_die("'%s' is not a training state file: magic %d, expected %d", path, h[0], STATE_MAGIC);
    if (h[1] < 1 || h[1] > STATE_VERSION)
        llmc_die("training state '%s' has version %d; this build reads versions 1 to %d", path, h[1], STATE_VERSION);
    memset(st, 0, sizeof *st);
    st->version = h[1];
    st->step = h[2];
    st->numel = (size_t)get64(h, 3);
    st->B = h[5];
    st->T = h[6];
    st->processes = h[7];
    st->rank = h[8];
    st->shuffle = h[9];
    st->seed = get64(h, 10);
    for (int i = 0; i < 8; i++) st->loader[i] = (int64_t)get64(h, 12 + 2 * i);
    st->sampler_rng = get64(h, 28);
    st->optimizer = h[30];
    if (st->optimizer != 1 && st->optimizer != 2)
        llmc_die("training state '%s' holds optimizer state of unknown kind %d (1 AdamW, 2 Adafactor): the file is "
                 "damaged or from a newer build", path, st->optimizer);
    for (int i = 0; i < 4; i++) st->backend[i] = (int64_t)get64(h, 32 + 2 * i);
    int checked = h[1] >= 2; /* version 1 files carry no checksums */
    if (checked) {
        st->model_crc = (uint32_t)h[40];
        st->has_model_crc = h[41] == 1;
    }
    /* the header's own checks: a file that passes its checksum but was written by hand or by a
     * broken build must still not resume into nonsense */
    if (st->step < 0) llmc_die("training state '%s' has a negative step %d", path, st->step);
    if (st->sampler_rng == 0)
        llmc_die("training state '%s' has sampler RNG state 0, which the generator never reaches (it would "
                 "sample degenerate text): the file is damaged",
                 path);
    if (st->numel != expect_numel)
        llmc_die("training state '%s' is for a model of %zu parameters, this model has %zu", path, st->numel, expect_numel);
    if (h[1] >= 4 && h[45] != 0) {
        st->gc_kind = h[43];
        st->gc_param = h[44];
        st->gc_ranks = h[45];
        st->gc_floats = (size_t)get64(h, 46);
        st->gc_shared = (size_t)get64(h, 48);
        if (st->gc_kind < 1 || st->gc_kind > 4 || st->gc_ranks < 1 || st->gc_ranks > (1 << 20) || st->gc_floats != st->numel ||
            st->gc_shared > st->numel)
            llmc_die("training state '%s' has a damaged gradient-compression section (scheme %d, %d ranks of %zu floats "
                     "for %zu parameters)", path, st->gc_kind, st->gc_ranks, st->gc_floats, st->numel);
    }
    long long want = 1024 + 2LL * (long long)st->numel * 4 + ((long long)st->gc_ranks * (long long)st->gc_floats + (long long)st->gc_shared) * 4;
    if (sumfile_size(f) != want)
        llmc_die("training state '%s' is %lld bytes, expected %lld: the file is damaged", path, sumfile_size(f), want);
    if (!m || !v) {
        fclose(f);
        return;
    }
    freadCheck(m, sizeof(float), st->numel, f, path);
    freadCheck(v, sizeof(float), st->numel, f, path);
    uint32_t crc = checked ? state_crc(h, m, v, st->numel) : 0;
    if (st->gc_ranks) {
        const size_t k = (size_t)st->gc_ranks * st->gc_floats + st->gc_shared;
        st->gc_data = (float *)mallocCheck(k * sizeof(float), "error-feedback residuals (resume)");
        freadCheck(st->gc_data, sizeof(float), k, f, path);
        crc = sumfile_crc_update(crc, st->gc_data, k * sizeof(float));
    }
    fclose(f);
    if (checked && (uint32_t)h[42] != crc)
        llmc_die("training state '%s' fails its checksum (crc32 recorded %08x): the file is damaged", path,
                 (unsigned)h[42]);
    if (!checked)
        printf("note: training state '%s' is version 1 (no checksums): loaded without verifying it\n", path);
}
