/*
 * fuzz_model_file.c - llm.c model files (llmc/checkpoint.c: model_file_read_header, then
 * model_file_load), as `-e FILE` and `-y 1` read them.
 *
 * Promises checked: a bad file is a clean error (exit 1, through fuzz_call); a file that is
 * accepted has exactly 1024 + numel * (4 or 2) bytes, where numel is the parameter count of its
 * header computed without wrapping around (the model.h table evaluated in long double), and
 * its payload loads as those bytes, bf16 widened to fp32.
 */
#include "llmc/checkpoint.h"
#include "llmc/model.h"
#include "test/fuzz/fuzz.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *path;
    const uint8_t *data;
    size_t size;
} Input;

/* The parameter count of cfg with every product in long double: no wrap-around. */
static long double exact_numel(const ModelConfig *cfg) {
    const long double Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers,
                      maxT = cfg->max_seq_len, F = cfg->ffn_hidden,
                      QKV = (long double)(cfg->num_heads + 2.0L * cfg->num_kv_heads) * (C / cfg->num_heads);
    (void)Vp, (void)C, (void)L, (void)maxT, (void)F, (void)QKV;
    long double total = 0;
#define ADD_NUMEL(name, shape, numel, decay, init) total += (numel);
    GPT2_PARAMETERS(ADD_NUMEL)
#undef ADD_NUMEL
    return total;
}

/* Known open: issue 12 defect 9, being fixed on another branch: model_file_read_header's
 * arithmetic overflows (signed) for headers with huge dimensions. With LLMC_FUZZ_SKIP_KNOWN=1
 * (test/test_fuzz.sh sets it until the fix is merged) such headers are not tried: those whose
 * 4 * C overflows an int or whose parameter bytes reach 2^62. Delete this with the fix. */
static int known_open_defect9(const uint8_t *data, size_t size) {
    int32_t h[8];
    if (size < sizeof h) return 0;
    memcpy(h, data, sizeof h);
    if (h[6] > INT_MAX / 4 || h[6] < INT_MIN / 4) return 1; /* 4 * C comes before any check */
    for (int i = 2; i < 8; i++)
        if (h[i] < 1) return 0; /* rejected before the parameter count */
    ModelConfig cfg = {.max_seq_len = h[2], .vocab_size = h[3], .num_layers = h[4], .num_heads = h[5],
                       .num_kv_heads = h[5], .channels = h[6], .padded_vocab_size = h[7], .ffn_hidden = 4 * h[6]};
    return exact_numel(&cfg) * 4 >= 0x1p62L;
}

static void load(void *arg) {
    const Input *in = arg;
    ModelConfig cfg;
    int version;
    model_file_read_header(in->path, &cfg, &version);
    size_t numel = gpt2_parameter_specs(&cfg, NULL);
    long double exact = exact_numel(&cfg);
    if ((long double)numel != exact)
        fuzz_fail("header (maxT %d V %d Vp %d L %d NH %d C %d) accepted with parameter count %zu, exactly %.0Lf",
                  cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, cfg.num_layers, cfg.num_heads,
                  cfg.channels, numel, exact);
    size_t width = version == MODEL_VERSION_FP32 ? 4 : 2;
    if (in->size != 1024 + numel * width)
        fuzz_fail("accepted a %zu-byte file whose header needs %zu bytes", in->size, 1024 + numel * width);
    float *params = malloc(numel * sizeof(float) + 1);
    model_file_load(in->path, params, numel);
    for (size_t i = 0; i < numel; i++) {
        uint32_t want;
        if (width == 4) {
            memcpy(&want, in->data + 1024 + 4 * i, 4);
        } else {
            uint16_t b;
            memcpy(&b, in->data + 1024 + 2 * i, 2);
            want = (uint32_t)b << 16;
        }
        if (memcmp(&want, &params[i], 4) != 0) fuzz_fail("parameter %zu was not loaded as stored", i);
    }
    free(params);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int skip_known = -1;
    if (skip_known < 0) skip_known = getenv("LLMC_FUZZ_SKIP_KNOWN") && atoi(getenv("LLMC_FUZZ_SKIP_KNOWN"));
    if (skip_known && known_open_defect9(data, size)) return 0;
    char path[4200];
    fuzz_write_file("model.bin", data, size, path, sizeof path);
    Input in = {path, data, size};
    fuzz_call(load, &in);
    return 0;
}
