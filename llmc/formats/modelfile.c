#include "llmc/formats/modelfile.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/hf.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void model_file_read_header(const char *path, ModelConfig *cfg, int *version) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (hf_is_model_dir(path)) { /* a Hugging Face model directory (hf.h) */
            hf_read_config(path, cfg);
            *version = MODEL_VERSION_FP32;
            return;
        }
        int step = checkpoint_latest_step(path);
        char hint[1200] = "";
        if (step >= 0) snprintf(hint, sizeof hint, " (its latest complete checkpoint is '%s/model_%08d.bin')", path, step);
        llmc_die("model checkpoint '%s' is a directory, not a model file: give a model_NNNNNNNN.bin file%s, or "
                 "continue the run in it with -o %s -y 1", path, hint, path);
    }
    FILE *f = sumfile_open_for_reading(path, "model checkpoint");
    int32_t h[256];
    size_t got = fread(h, 4, 256, f);
    long long size = sumfile_size(f);
    fclose(f);
    if (got != 256) llmc_die("model checkpoint '%s' is truncated: %lld bytes, shorter than the 1024-byte header", path, size);
    if (h[0] != MODEL_MAGIC)
        llmc_die("'%s' is not a model checkpoint: magic %d, expected %d (llm.c model file)", path, h[0], MODEL_MAGIC);
    if (h[1] != MODEL_VERSION_FP32 && h[1] != MODEL_VERSION_BF16)
        llmc_die("model checkpoint '%s' has version %d; supported: 3 (fp32) and 5 (bf16)", path, h[1]);
    /* every field is range-checked (model_config_validate's limits) before any size is computed,
     * and sizes are computed in 64 bits: no product below can overflow */
    memset(cfg, 0, sizeof *cfg);
    cfg->max_seq_len = h[2];
    cfg->vocab_size = h[3];
    cfg->num_layers = h[4];
    cfg->num_heads = h[5];
    cfg->channels = h[6];
    cfg->padded_vocab_size = h[7];
    cfg->num_kv_heads = h[5];
    cfg->ffn_hidden = h[6] > 0 && h[6] <= MODEL_MAX_CHANNELS ? 4 * h[6] : 1;
    const char *bad = gpt2_config_validate(cfg);
    if (bad)
        llmc_die("model checkpoint '%s' has an invalid header (maxT %d, V %d, L %d, NH %d, C %d, Vp %d): %s",
                 path, h[2], h[3], h[4], h[5], h[6], h[7], bad);
    size_t numel = gpt2_parameter_specs(cfg, NULL);
    long long want = 1024 + (long long)numel * (h[1] == MODEL_VERSION_FP32 ? 4 : 2);
    if (size != want)
        llmc_die("model checkpoint '%s' is %lld bytes, but its header (L %d, C %d, Vp %d, version %d) needs %lld%s",
                 path, size, h[4], h[6], h[7], h[1], want, size < want ? ": the file is truncated" : "");
    *version = h[1];
}

/* ---- model files of any header: parameters fp32 or bf16, CRC-32, "<path>.sum" -------------- */
void model_params_write(FILE *f, const char *path, const float *params, size_t numel, int bf16, uint32_t *crc) {
    if (!bf16) {
        fwriteCheck(params, sizeof(float), numel, f, path);
        if (crc) *crc = sumfile_crc_update(*crc, params, numel * sizeof(float));
        return;
    }
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = (uint16_t *)mallocCheck(CHUNK * sizeof(uint16_t), "bf16 write buffer");
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t n = numel - i < CHUNK ? numel - i : CHUNK;
        for (size_t j = 0; j < n; j++) buf[j] = float_to_bf16(params[i + j]);
        fwriteCheck(buf, sizeof(uint16_t), n, f, path);
        if (crc) *crc = sumfile_crc_update(*crc, buf, n * sizeof(uint16_t));
    }
    free(buf);
}

void model_params_read(FILE *f, const char *path, float *params, size_t numel, int bf16, uint32_t *crc) {
    if (!bf16) {
        freadCheck(params, sizeof(float), numel, f, path);
        if (crc) *crc = sumfile_crc_update(*crc, params, numel * sizeof(float));
        return;
    }
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = (uint16_t *)mallocCheck(CHUNK * sizeof(uint16_t), "bf16 read buffer");
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t n = numel - i < CHUNK ? numel - i : CHUNK;
        freadCheck(buf, sizeof(uint16_t), n, f, path);
        if (crc) *crc = sumfile_crc_update(*crc, buf, n * sizeof(uint16_t));
        for (size_t j = 0; j < n; j++) params[i + j] = bf16_to_float(buf[j]);
    }
    free(buf);
}

void model_file_read_params(const char *path, size_t header_bytes, float *params, size_t numel, int bf16,
                            const TensorSpec *specs, int nspecs) {
    FILE *f = sumfile_open_for_reading(path, "model checkpoint");
    long long bytes = sumfile_size(f);
    long long want = (long long)header_bytes + (long long)numel * (bf16 ? 2 : 4);
    if (bytes != want)
        llmc_die("model checkpoint '%s' is %lld bytes, but its header describes %lld (%zu header bytes + %zu %s "
                 "parameters)%s", path, bytes, want, header_bytes, numel, bf16 ? "bf16" : "fp32",
                 bytes < want ? ": the file is truncated" : "");
    unsigned char h[4096];
    if (header_bytes > sizeof h) llmc_die("model_file_read_params: a %zu-byte header", header_bytes);
    freadCheck(h, 1, header_bytes, f, path);
    uint32_t crc = sumfile_crc_update(sumfile_crc_update(0, NULL, 0), h, header_bytes);
    model_params_read(f, path, params, numel, bf16, &crc);
    fclose(f);
    uint32_t want_crc;
    long long want_bytes;
    char sum[4200];
    sumfile_path(path, sum, sizeof sum);
    if (sumfile_read(path, &want_crc, &want_bytes)) {
        if (want_crc != crc || want_bytes != bytes)
            llmc_die("model checkpoint '%s' does not match its checksum file '%s' (crc32 %08x, %lld bytes; recorded "
                     "%08x, %lld bytes): the file is damaged or was replaced",
                     path, sum, (unsigned)crc, bytes, (unsigned)want_crc, want_bytes);
    } else {
        printf("note: '%s' has no checksum file ('%s', e.g. a plain llm.c checkpoint): loaded without verifying it\n",
               path, sum);
    }
    /* NaN/Inf weights never train into anything: refuse them, naming the tensor */
    for (int t = 0; t < nspecs; t++)
        for (size_t i = 0; i < specs[t].numel; i++)
            if (!isfinite(params[specs[t].offset + i]))
                llmc_die("model checkpoint '%s' has a non-finite weight (%g) in tensor %s at index %zu: the model "
                         "diverged or the file is damaged",
                         path, (double)params[specs[t].offset + i], specs[t].name, i);
}

uint32_t model_file_write(const char *path, const void *header, size_t header_bytes, const float *params, size_t numel,
                          int bf16) {
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(params[i]))
            llmc_die("not writing model checkpoint '%s': weight %zu is %g (the weights are not finite)", path, i,
                     (double)params[i]);
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(header, 1, header_bytes, af.f, af.tmp_path);
    uint32_t crc = sumfile_crc_update(sumfile_crc_update(0, NULL, 0), header, header_bytes);
    model_params_write(af.f, af.tmp_path, params, numel, bf16, &crc);
    char sum[4200];
    sumfile_path(path, sum, sizeof sum);
    unlink(sum); /* a crash between the two commits leaves a model without a sum, never a wrong sum */
    atomic_commit(&af);
    sumfile_write(path, crc, (long long)header_bytes + (long long)numel * (bf16 ? 2 : 4));
    return crc;
}

void model_file_load(const char *path, float *params, size_t numel) {
    if (hf_is_model_dir(path)) {
        hf_load(path, params, numel);
        return;
    }
    ModelConfig cfg;
    int version;
    model_file_read_header(path, &cfg, &version);
    TensorSpec specs[NUM_PARAMETER_TENSORS];
    if (gpt2_parameter_specs(&cfg, specs) != numel)
        llmc_die("model checkpoint '%s' does not match the model being loaded", path);
    model_file_read_params(path, 1024, params, numel, version == MODEL_VERSION_BF16, specs, NUM_PARAMETER_TENSORS);
}

uint32_t model_file_save(const char *path, const ModelConfig *cfg, const float *params, size_t numel, int version) {
    int32_t h[256] = {0};
    h[0] = MODEL_MAGIC;
    h[1] = version;
    h[2] = cfg->max_seq_len;
    h[3] = cfg->vocab_size;
    h[4] = cfg->num_layers;
    h[5] = cfg->num_heads;
    h[6] = cfg->channels;
    h[7] = cfg->padded_vocab_size;
    return model_file_write(path, h, sizeof h, params, numel, version == MODEL_VERSION_BF16);
}

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
    h[1] = STATE_VERSION;
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
    h[30] = 1;
    for (int i = 0; i < 4; i++) put64(h, 32 + 2 * i, (uint64_t)st->backend[i]);
    h[40] = (int32_t)st->model_crc;
    h[41] = st->has_model_crc ? 1 : 0;
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

void state_file_save(const char *path, const TrainState *st, const float *m, const float *v) {
    int32_t h[256];
    state_header(h, st);
    h[42] = (int32_t)state_crc(h, m, v, st->numel);
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(h, 4, 256, af.f, af.tmp_path);
    fwriteCheck(m, sizeof(float), st->numel, af.f, af.tmp_path);
    fwriteCheck(v, sizeof(float), st->numel, af.f, af.tmp_path);
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
    long long want = 1024 + 2LL * (long long)st->numel * 4;
    if (sumfile_size(f) != want)
        llmc_die("training state '%s' is %lld bytes, expected %lld: the file is damaged", path, sumfile_size(f), want);
    if (!m || !v) {
        fclose(f);
        return;
    }
    freadCheck(m, sizeof(float), st->numel, f, path);
    freadCheck(v, sizeof(float), st->numel, f, path);
    fclose(f);
    if (checked && (uint32_t)h[42] != state_crc(h, m, v, st->numel))
        llmc_die("training state '%s' fails its checksum (crc32 recorded %08x): the file is damaged", path,
                 (unsigned)h[42]);
    if (!checked)
        printf("note: training state '%s' is version 1 (no checksums): loaded without verifying it\n", path);
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
        hf_checkpoint_dir(dir, steps[i], hf, sizeof hf);
        remove_tree(hf); /* --save-hf's directory, if any */
    }
}
