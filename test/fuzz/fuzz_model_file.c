/*
 * fuzz_model_file.c - llm.c model files (llmc/formats/modelfile.c: model_file_read_header, then
 * model_file_load), as `-e FILE` and `-y 1` read them.
 *
 * Promises checked: a bad file is a clean error (exit 1, through fuzz_call); a file that is
 * accepted has exactly 1024 + numel * (4 or 2) bytes, where numel is the parameter count of its
 * header computed without wrapping around (the model.h table evaluated in long double), and
 * its payload loads as those bytes, bf16 widened to fp32.
 */
#include "llmc/formats/modelfile.h"
#include "llmc/models/gpt2.h"
#include "test/fuzz/fuzz.h"

#include <stdlib.h>
#include <string.h>

/* The parameter count of cfg with every product in long double: no wrap-around. */
static long double exact_numel(const ModelConfig *cfg) {
    const long double Vp = cfg->padded_vocab_size, C = cfg->channels, L = cfg->num_layers,
                      maxT = cfg->max_seq_len, F = cfg->ffn_hidden,
                      QKV = (long double)(cfg->num_heads + 2.0L * cfg->num_kv_heads) * (C / cfg->num_heads);
    (void)Vp, (void)C, (void)L, (void)maxT, (void)F, (void)QKV;
    long double total = 0;
#define ADD_NUMEL(name, shape, numel, ...) total += (numel);
    GPT2_PARAMETERS(ADD_NUMEL)
#undef ADD_NUMEL
    return total;
}

static void load(void *arg) {
    const FuzzFile *in = arg;
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
    return fuzz_file_target("model.bin", data, size, load);
}
