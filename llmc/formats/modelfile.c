#include "llmc/formats/modelfile.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void model_file_read_header(const char *path, ModelConfig *cfg, int *version) {
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

/* ---- llmc's own header (20261130): the slots every architecture shares --------------------- */
void llmc_header_put(int32_t h[256], int32_t magic, int32_t version, int32_t arch, const ModelConfig *b, int32_t tied,
                     int bf16) {
    memset(h, 0, 256 * sizeof h[0]);
    h[0] = magic, h[1] = version, h[2] = arch, h[3] = b->max_seq_len;
    h[4] = b->vocab_size, h[5] = b->padded_vocab_size, h[6] = b->num_layers, h[7] = b->num_heads;
    h[8] = b->num_kv_heads, h[9] = b->channels, h[10] = b->ffn_hidden, h[11] = tied;
    h[12] = bf16 ? 1 : 0;
}

void llmc_header_get_shape(const int32_t h[256], ModelConfig *b) {
    b->max_seq_len = h[3], b->vocab_size = h[4], b->padded_vocab_size = h[5], b->num_layers = h[6];
    b->num_heads = h[7], b->num_kv_heads = h[8], b->channels = h[9], b->ffn_hidden = h[10];
}

void llmc_header_put_fields(int32_t h[256], const LlmcHeaderField *fields, int n, const void *cfg) {
    for (int i = 0; i < n; i++) memcpy(&h[fields[i].slot], (const char *)cfg + fields[i].offset, sizeof h[0]);
}

void llmc_header_get_fields(const int32_t h[256], const LlmcHeaderField *fields, int n, void *cfg) {
    for (int i = 0; i < n; i++) memcpy((char *)cfg + fields[i].offset, &h[fields[i].slot], sizeof h[0]);
}

/* ---- model files of any header: parameters fp32 or bf16, CRC-32, "<path>.sum" -------------- */
/* The parameter bytes in one direction (writing: params -> f, else f -> params); bf16 through a
 * 64K-element buffer, rounded to nearest even on the way out. crc covers the bytes as stored. */
static void params_transfer(FILE *f, const char *path, float *params, size_t numel, int bf16, uint32_t *crc,
                            int writing) {
    if (!bf16) {
        if (writing) fwriteCheck(params, sizeof(float), numel, f, path);
        else freadCheck(params, sizeof(float), numel, f, path);
        if (crc) *crc = sumfile_crc_update(*crc, params, numel * sizeof(float));
        return;
    }
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = (uint16_t *)mallocCheck(CHUNK * sizeof(uint16_t), writing ? "bf16 write buffer" : "bf16 read buffer");
    for (size_t i = 0; i < numel; i += CHUNK) {
        size_t n = numel - i < CHUNK ? numel - i : CHUNK;
        if (writing) {
            for (size_t j = 0; j < n; j++) buf[j] = float_to_bf16(params[i + j]);
            fwriteCheck(buf, sizeof(uint16_t), n, f, path);
        } else {
            freadCheck(buf, sizeof(uint16_t), n, f, path);
        }
        if (crc) *crc = sumfile_crc_update(*crc, buf, n * sizeof(uint16_t));
        if (!writing)
            for (size_t j = 0; j < n; j++) params[i + j] = bf16_to_float(buf[j]);
    }
    free(buf);
}

void model_params_write(FILE *f, const char *path, const float *params, size_t numel, int bf16, uint32_t *crc) {
    params_transfer(f, path, (float *)params, numel, bf16, crc, 1); /* not written to when writing */
}

void model_params_read(FILE *f, const char *path, float *params, size_t numel, int bf16, uint32_t *crc) {
    params_transfer(f, path, params, numel, bf16, crc, 0);
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


