#include "llama.h"

#include "atomicfile.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int llama_ffn_hidden(int C, float ffn_dim_multiplier, int multiple_of) {
    long hidden = 2 * (4L * C) / 3;
    if (ffn_dim_multiplier > 0) hidden = (long)(ffn_dim_multiplier * hidden);
    return (int)((hidden + multiple_of - 1) / multiple_of * multiple_of);
}

/* The released shapes (config.json of each model). */
static const struct {
    const char *name;
    int L, C, NH, NKV, tied;
    float ffn_mult;
    int multiple_of;
    float rope_factor;
} llama_models[] = {
    {"llama3.2-1b", 16, 2048, 32, 8, 1, 1.5f, 256, 32.0f},
    {"llama3.2-3b", 28, 3072, 24, 8, 1, 1.0f, 256, 32.0f},
    {"llama3.1-8b", 32, 4096, 32, 8, 0, 1.3f, 1024, 8.0f},
};

int llama_config_from_name(LlamaConfig *cfg, const char *name) {
    memset(cfg, 0, sizeof *cfg);
    ModelConfig *b = &cfg->base;
    b->vocab_size = b->padded_vocab_size = 128256; /* already a multiple of 128 */
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 500000.0f;
    for (size_t i = 0; i < sizeof llama_models / sizeof llama_models[0]; i++) {
        if (strcmp(name, llama_models[i].name) != 0) continue;
        b->max_seq_len = 131072;
        b->num_layers = llama_models[i].L;
        b->channels = llama_models[i].C;
        b->num_heads = llama_models[i].NH;
        b->num_kv_heads = llama_models[i].NKV;
        b->ffn_hidden = llama_ffn_hidden(b->channels, llama_models[i].ffn_mult, llama_models[i].multiple_of);
        cfg->tied = llama_models[i].tied;
        cfg->rope_factor = llama_models[i].rope_factor;
        cfg->rope_low_freq_factor = 1.0f;
        cfg->rope_high_freq_factor = 4.0f;
        cfg->rope_original_max_pos = 8192;
        return 0;
    }
    if (strncmp(name, "llama3:d", 8) != 0 || name[8] < '1' || name[8] > '9') return -1;
    char *end;
    long depth = strtol(name + 8, &end, 10);
    if (*end != '\0' || depth < 1 || depth > 1000) return -1;
    b->max_seq_len = 1024;
    b->num_layers = (int)depth;
    b->channels = (int)depth * 64;
    b->num_heads = (int)depth;
    b->num_kv_heads = 1;
    for (int k = 1; k <= b->num_heads / 4; k++)
        if (b->num_heads % k == 0) b->num_kv_heads = k;
    b->ffn_hidden = llama_ffn_hidden(b->channels, 1.0f, 256);
    return 0;
}

const char *llama_config_validate(const LlamaConfig *cfg) {
    static char msg[160];
    const ModelConfig *b = &cfg->base;
    if (b->num_heads < 1 || b->num_kv_heads < 1 || b->channels < 1) return "all dimensions must be positive";
    if (b->num_heads % b->num_kv_heads != 0) {
        snprintf(msg, sizeof msg, "heads %d not divisible by key/value heads %d", b->num_heads, b->num_kv_heads);
        return msg;
    }
    if (b->channels % b->num_heads != 0 || (b->channels / b->num_heads) % 2 != 0) {
        snprintf(msg, sizeof msg, "channels %d / heads %d must be an even head size (RoPE rotates pairs)",
                 b->channels, b->num_heads);
        return msg;
    }
    if (!(cfg->norm_eps > 0) || !(cfg->rope_theta > 1)) return "norm eps must be > 0 and rope theta > 1";
    if (cfg->rope_factor > 0 && !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor &&
                                  cfg->rope_low_freq_factor > 0 && cfg->rope_original_max_pos > 0))
        return "rope scaling needs 0 < low_freq_factor < high_freq_factor and original_max_pos > 0";
    ModelConfig gqa = *b; /* the shared limits; GPT-2's rule NKV == NH does not apply */
    gqa.num_kv_heads = gqa.num_heads;
    return model_config_validate(&gqa);
}

#define LLAMA_SHAPE_NAMES(cfg)                                                                \
    const size_t Vp = (size_t)(cfg)->base.padded_vocab_size, C = (size_t)(cfg)->base.channels, \
                 L = (size_t)(cfg)->base.num_layers, F = (size_t)(cfg)->base.ffn_hidden,       \
                 NH = (size_t)(cfg)->base.num_heads,                                          \
                 QKV = ((size_t)(cfg)->base.num_heads + 2 * (size_t)(cfg)->base.num_kv_heads) * (C / NH); \
    const int TIED = (cfg)->tied;                                                             \
    (void)Vp, (void)C, (void)L, (void)F, (void)NH, (void)QKV, (void)TIED

size_t llama_parameter_specs(const LlamaConfig *cfg, TensorSpec specs[LLAMA3_NUM_PARAMETERS]) {
    LLAMA_SHAPE_NAMES(cfg);
    TensorSpec table[] = {
#define LLMC_PARAM_SPEC(name, shape, numel, decay, init, stacked) {#name, shape, numel, 0, decay, init, 0, 0, stacked},
        LLAMA3_PARAMETERS(LLMC_PARAM_SPEC)
#undef LLMC_PARAM_SPEC
    };
    size_t offset = 0;
    for (int i = 0; i < LLAMA3_NUM_PARAMETERS; i++) {
        table[i].layer_numel = table[i].layer_numel ? table[i].numel / L : 0;
        table[i].offset = offset;
        offset += table[i].numel;
    }
    if (specs) memcpy(specs, table, sizeof table);
    return offset;
}

size_t llama_activation_specs(const LlamaConfig *cfg, int Bi, int Ti, TensorSpec specs[LLAMA3_NUM_ACTIVATIONS]) {
    LLAMA_SHAPE_NAMES(cfg);
    const size_t B = (size_t)Bi, T = (size_t)Ti;
    TensorSpec table[] = {
#define LLMC_ACT_SPEC(name, shape, numel, kind, per_layer) {#name, shape, numel, 0, 0, 0, kind, per_layer, 0},
        LLAMA3_ACTIVATIONS(LLMC_ACT_SPEC)
#undef LLMC_ACT_SPEC
    };
    size_t offset = 0;
    for (int i = 0; i < LLAMA3_NUM_ACTIVATIONS; i++) {
        if (table[i].per_layer) {
            table[i].layer_numel = table[i].numel;
            table[i].numel *= L;
        }
        table[i].offset = offset;
        offset += table[i].numel;
    }
    if (specs) memcpy(specs, table, sizeof table);
    return offset;
}

void llama_init_parameters(const LlamaConfig *cfg, const TensorSpec specs[LLAMA3_NUM_PARAMETERS], float *params,
                           unsigned long long seed) {
    tensor_table_init(specs, LLAMA3_NUM_PARAMETERS, params, cfg->base.num_layers, seed);
    const size_t C = (size_t)cfg->base.channels, pad = (size_t)(cfg->base.padded_vocab_size - cfg->base.vocab_size);
    memset(params + specs[LLAMA3_P_wte].offset + (size_t)cfg->base.vocab_size * C, 0, pad * C * sizeof(float));
    if (!cfg->tied)
        memset(params + specs[LLAMA3_P_lm_head].offset + (size_t)cfg->base.vocab_size * C, 0, pad * C * sizeof(float));
}

static float slot_f32(const int32_t *h, int i) {
    float v;
    memcpy(&v, &h[i], sizeof v);
    return v;
}

void llama_file_read_header(const char *path, LlamaConfig *cfg) {
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open Llama checkpoint '%s'", path);
    int32_t h[256];
    size_t got = fread(h, sizeof(int32_t), 256, f);
    fclose(f);
    if (got != 256) llmc_die("'%s': shorter than the 1024-byte Llama header", path);
    if (h[0] != LLAMA_FILE_MAGIC) llmc_die("'%s': bad magic %d (expected %d, an llmc Llama checkpoint)", path, h[0], LLAMA_FILE_MAGIC);
    if (h[1] != LLAMA_FILE_VERSION) llmc_die("'%s': unsupported Llama checkpoint version %d (expected %d)", path, h[1], LLAMA_FILE_VERSION);
    if (h[2] != LLAMA_ARCH_LLAMA3) llmc_die("'%s': unknown architecture %d (1 is Llama 3)", path, h[2]);
    memset(cfg, 0, sizeof *cfg);
    ModelConfig *b = &cfg->base;
    b->max_seq_len = h[3], b->vocab_size = h[4], b->padded_vocab_size = h[5], b->num_layers = h[6];
    b->num_heads = h[7], b->num_kv_heads = h[8], b->channels = h[9], b->ffn_hidden = h[10];
    cfg->tied = h[11];
    cfg->norm_eps = slot_f32(h, 16), cfg->rope_theta = slot_f32(h, 17), cfg->rope_factor = slot_f32(h, 18);
    cfg->rope_low_freq_factor = slot_f32(h, 19), cfg->rope_high_freq_factor = slot_f32(h, 20);
    cfg->rope_original_max_pos = h[21];
    const char *bad = h[11] != 0 && h[11] != 1 ? "tied must be 0 or 1" : llama_config_validate(cfg);
    if (bad) llmc_die("'%s': invalid Llama header: %s", path, bad);
}

void llama_file_load(const char *path, float *params, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open Llama checkpoint '%s'", path);
    if (fseeko(f, 0, SEEK_END) != 0) llmc_die("'%s': cannot seek", path);
    off_t size = ftello(f);
    off_t want = 1024 + (off_t)(n * sizeof(float));
    if (size != want)
        llmc_die("'%s': %lld bytes, but its header describes %lld (1024 + %zu float32 parameters)", path,
                 (long long)size, (long long)want, n);
    fseeko(f, 1024, SEEK_SET);
    freadCheck(params, sizeof(float), n, f, path);
    fclose(f);
}

void llama_file_write(const char *path, const LlamaConfig *cfg, const float *params, size_t n) {
    int32_t h[256] = {0};
    const ModelConfig *b = &cfg->base;
    h[0] = LLAMA_FILE_MAGIC, h[1] = LLAMA_FILE_VERSION, h[2] = LLAMA_ARCH_LLAMA3, h[3] = b->max_seq_len;
    h[4] = b->vocab_size, h[5] = b->padded_vocab_size, h[6] = b->num_layers, h[7] = b->num_heads;
    h[8] = b->num_kv_heads, h[9] = b->channels, h[10] = b->ffn_hidden, h[11] = cfg->tied;
    const float fs[] = {cfg->norm_eps, cfg->rope_theta, cfg->rope_factor, cfg->rope_low_freq_factor,
                        cfg->rope_high_freq_factor};
    memcpy(&h[16], fs, sizeof fs);
    h[21] = cfg->rope_original_max_pos;
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(h, sizeof(int32_t), 256, af.f, af.tmp_path);
    fwriteCheck(params, sizeof(float), n, af.f, af.tmp_path);
    atomic_commit(&af);
}
