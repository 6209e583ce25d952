/* llamafile.c - llmc's Llama checkpoint and llm.c's Llama 3 file (llamafile.h). */
#include "llmc/formats/llamafile.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/formats/modelfile.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* [11] tied and [16..23] eps, RoPE and its scaling, how F was derived */
static const LlmcHeaderField knobs[] = {
    {11, offsetof(LlamaConfig, tied)},
    {16, offsetof(LlamaConfig, norm_eps)},
    {17, offsetof(LlamaConfig, rope_theta)},
    {18, offsetof(LlamaConfig, rope_factor)},
    {19, offsetof(LlamaConfig, rope_low_freq_factor)},
    {20, offsetof(LlamaConfig, rope_high_freq_factor)},
    {21, offsetof(LlamaConfig, rope_original_max_pos)},
    {22, offsetof(LlamaConfig, ffn_multiplier)},
    {23, offsetof(LlamaConfig, ffn_multiple_of)},
};
enum { NUM_KNOBS = sizeof knobs / sizeof knobs[0] };

void llama_header_put_knobs(int32_t h[256], const LlamaConfig *cfg) { llmc_header_put_fields(h, knobs, NUM_KNOBS, cfg); }
void llama_header_get_knobs(const int32_t h[256], LlamaConfig *cfg) { llmc_header_get_fields(h, knobs, NUM_KNOBS, cfg); }

/* the header of llmc's Llama file at path into cfg; returns 1 when its parameters are bf16 */
static int read_header(const char *path, LlamaConfig *cfg) {
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
    llmc_header_get_shape(h, &cfg->base);
    llama_header_get_knobs(h, cfg);
    const int dtype = h[LLAMA_FILE_DTYPE];
    const char *bad = h[11] != 0 && h[11] != 1                                   ? "tied must be 0 or 1"
                      : dtype != LLAMA_DTYPE_FP32 && dtype != LLAMA_DTYPE_BF16 ? "dtype (slot 12) must be 0 (fp32) or 1 (bf16)"
                                                                               : llama_config_validate(cfg);
    if (bad) llmc_die("'%s': invalid Llama header: %s", path, bad);
    return dtype == LLAMA_DTYPE_BF16;
}

void llama_file_read_header(const char *path, LlamaConfig *cfg) { (void)read_header(path, cfg); }

void llama_file_load(const char *path, float *params, size_t n) {
    LlamaConfig cfg;
    const int bf16 = read_header(path, &cfg);
    TensorSpec specs[LLAMA3_NUM_PARAMETERS];
    if (llama_parameter_specs(&cfg, specs) != n) llmc_die("Llama checkpoint '%s' does not match the model being loaded", path);
    model_file_read_params(path, 1024, params, n, bf16, specs, LLAMA3_NUM_PARAMETERS);
}

uint32_t llama_checkpoint_write(const char *path, const LlamaConfig *cfg, const float *params, size_t n, int bf16) {
    if (llama_parameter_specs(cfg, NULL) != n) llmc_die("llama_checkpoint_write: %zu parameters do not fit the config", n);
    _Static_assert(LLAMA_FILE_DTYPE == 12 && LLAMA_DTYPE_FP32 == 0 && LLAMA_DTYPE_BF16 == 1, "llmc_header_put's dtype");
    int32_t h[256];
    llmc_header_put(h, LLAMA_FILE_MAGIC, LLAMA_FILE_VERSION, LLAMA_ARCH_LLAMA3, &cfg->base, cfg->tied, bf16);
    llama_header_put_knobs(h, cfg);
    return model_file_write(path, h, sizeof h, params, n, bf16);
}

uint32_t llama_checkpoint_save(const char *path, const LlamaConfig *cfg, const float *params, size_t n) {
    return llama_checkpoint_write(path, cfg, params, n, 0);
}

int llama_file_is_bf16(const char *path) {
    LlamaConfig cfg;
    return read_header(path, &cfg);
}

/* ---- llm.c's Llama 3 file ---------------------------------------------------------------- */

/* llm.c's fixed Llama 3.1 RoPE scaling (use_scaled_rope = 1) */
static void llmc_llama3_scaling(LlamaConfig *cfg) {
    cfg->rope_factor = 8.0f, cfg->rope_low_freq_factor = 1.0f, cfg->rope_high_freq_factor = 4.0f;
    cfg->rope_original_max_pos = 8192;
}

/* the element count of llm.c's layout: V rows of wte and lm_head, every block tensor, ln_f */
static size_t llmc_llama3_numel(const LlamaConfig *cfg) {
    TensorSpec specs[LLAMA3_NUM_PARAMETERS];
    LlamaConfig untied = *cfg;
    untied.tied = 0;
    size_t n = llama_parameter_specs(&untied, specs);
    size_t pad = (size_t)(cfg->base.padded_vocab_size - cfg->base.vocab_size) * cfg->base.channels;
    return n - 2 * pad;
}

void llmc_llama3_read_header(const char *path, LlamaConfig *cfg, int *version) {
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open llm.c Llama 3 checkpoint '%s'", path);
    int32_t h[256];
    float hf[256];
    size_t got = fread(h, sizeof h[0], 256, f);
    got += fread(hf, sizeof hf[0], 256, f);
    fseeko(f, 0, SEEK_END);
    long long size = (long long)ftello(f);
    fclose(f);
    if (got != 512) llmc_die("'%s': shorter than llm.c's 2048-byte Llama 3 header (%lld bytes)", path, size);
    if (h[0] != LLMC_LLAMA3_MAGIC) llmc_die("'%s': bad magic %d (expected %d, llm.c's Llama 3 file)", path, h[0], LLMC_LLAMA3_MAGIC);
    if (h[1] != 3 && h[1] != 5) llmc_die("'%s': llm.c Llama 3 checkpoint version %d; supported: 3 (fp32) and 5 (bf16)", path, h[1]);
    if (h[8] < 1 || h[8] > MODEL_MAX_CHANNELS || (h[9] != 0 && h[9] != 1) || !(hf[0] >= 0 && hf[0] <= 16) ||
        h[7] < 1 || h[7] > MODEL_MAX_CHANNELS)
        llmc_die("'%s': invalid llm.c Llama 3 header (C %d, multiple_of %d, use_scaled_rope %d, ffn_dim_multiplier %g)",
                 path, h[7], h[8], h[9], (double)hf[0]);
    memset(cfg, 0, sizeof *cfg);
    ModelConfig *b = &cfg->base;
    b->max_seq_len = h[2], b->vocab_size = h[3], b->num_layers = h[4], b->num_heads = h[5];
    b->num_kv_heads = h[6], b->channels = h[7];
    b->padded_vocab_size = h[3] > 0 && h[3] <= MODEL_MAX_VOCAB ? (h[3] + 127) / 128 * 128 : h[3];
    b->ffn_hidden = llama_ffn_hidden(h[7], hf[0], h[8]);
    cfg->ffn_multiplier = hf[0], cfg->ffn_multiple_of = h[8];
    cfg->norm_eps = hf[1], cfg->rope_theta = hf[2];
    if (h[9]) llmc_llama3_scaling(cfg);
    const char *bad = llama_config_validate(cfg);
    if (bad) llmc_die("'%s': invalid llm.c Llama 3 header: %s", path, bad);
    long long want = 2048 + (long long)llmc_llama3_numel(cfg) * (h[1] == 3 ? 4 : 2);
    if (size != want)
        llmc_die("'%s': %lld bytes, but its llm.c Llama 3 header (L %d, C %d, V %d, F %d, version %d) describes %lld%s",
                 path, size, b->num_layers, b->channels, b->vocab_size, b->ffn_hidden, h[1], want,
                 size < want ? ": the file is truncated" : "");
    *version = h[1];
}

/* Each tensor of llm.c's order as (our tensor, rows of layer l to fill): the SwiGLU matrix is
 * stored as c_fc (up, our fcw rows [F, 2F)) for every layer, then c_fc2 (gate, rows [0, F)). */
typedef void (*TensorIO)(FILE *f, const char *path, float *p, size_t count, int bf16);
static void io_read(FILE *f, const char *path, float *p, size_t count, int bf16) { model_params_read(f, path, p, count, bf16, NULL); }
static void io_write(FILE *f, const char *path, float *p, size_t count, int bf16) { model_params_write(f, path, p, count, bf16, NULL); }

static void llmc_llama3_tensors(const LlamaConfig *cfg, float *params, FILE *f, const char *path, int bf16, TensorIO io) {
    TensorSpec s[LLAMA3_NUM_PARAMETERS];
    llama_parameter_specs(cfg, s);
    const size_t V = (size_t)cfg->base.vocab_size, C = (size_t)cfg->base.channels, F = (size_t)cfg->base.ffn_hidden;
    const int L = cfg->base.num_layers;
    io(f, path, params + s[LLAMA3_P_wte].offset, V * C, bf16);
    const int whole[] = {LLAMA3_P_ln1w, LLAMA3_P_qkvw, LLAMA3_P_attprojw, LLAMA3_P_ln2w};
    for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++) io(f, path, params + s[whole[i]].offset, s[whole[i]].numel, bf16);
    for (int half = 1; half >= 0; half--) /* up (rows [F, 2F)), then gate (rows [0, F)) */
        for (int l = 0; l < L; l++) io(f, path, tensor_layer(params, &s[LLAMA3_P_fcw], l) + half * F * C, F * C, bf16);
    io(f, path, params + s[LLAMA3_P_fcprojw].offset, s[LLAMA3_P_fcprojw].numel, bf16);
    io(f, path, params + s[LLAMA3_P_lnfw].offset, C, bf16);
    io(f, path, params + s[cfg->tied ? LLAMA3_P_wte : LLAMA3_P_lm_head].offset, V * C, bf16);
}

void llmc_llama3_load(const char *path, const LlamaConfig *cfg, float *params, size_t n) {
    LlamaConfig file_cfg;
    int version;
    llmc_llama3_read_header(path, &file_cfg, &version);
    if (llama_parameter_specs(cfg, NULL) != n || cfg->tied)
        llmc_die("'%s' does not match the model being loaded", path);
    memset(params, 0, n * sizeof(float)); /* the padded vocabulary rows */
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open llm.c Llama 3 checkpoint '%s'", path);
    fseeko(f, 2048, SEEK_SET);
    llmc_llama3_tensors(cfg, params, f, path, version == 5, io_read);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(params[i])) llmc_die("'%s' has a non-finite weight (%g) at parameter %zu", path, (double)params[i], i);
}

void llmc_llama3_write(const char *path, const LlamaConfig *cfg, const float *params, size_t n, int bf16) {
    const ModelConfig *b = &cfg->base;
    if (llama_parameter_specs(cfg, NULL) != n) llmc_die("llmc_llama3_write: %zu parameters do not fit the config", n);
    int use_scaled = cfg->rope_factor > 0;
    if (use_scaled && !(cfg->rope_factor == 8.0f && cfg->rope_low_freq_factor == 1.0f &&
                        cfg->rope_high_freq_factor == 4.0f && cfg->rope_original_max_pos == 8192))
        llmc_die("cannot write '%s' as llm.c's Llama 3 file: its header only knows Llama 3.1's RoPE scaling (factor 8, "
                 "low 1, high 4, original 8192); this model has factor %g, low %g, high %g, original %d",
                 path, (double)cfg->rope_factor, (double)cfg->rope_low_freq_factor, (double)cfg->rope_high_freq_factor,
                 cfg->rope_original_max_pos);
    /* F as llm.c computes it: some (ffn_dim_multiplier, multiple_of) that gives this F */
    const int F = b->ffn_hidden, C = b->channels, h0 = 2 * (4 * C) / 3;
    static const int multiples[] = {1024, 256, 128, 64, 32, 16, 8, 4, 2, 1};
    float mult = cfg->ffn_multiplier;
    int multiple_of = cfg->ffn_multiple_of > 0 && llama_ffn_hidden(C, mult, cfg->ffn_multiple_of) == F ? cfg->ffn_multiple_of : 0;
    for (size_t i = 0; i < sizeof multiples / sizeof multiples[0] && multiple_of == 0; i++) {
        float cand[] = {1.0f, (float)F / (float)h0, nextafterf((float)F / (float)h0, 2.0f * F)};
        for (int k = 0; k < 3 && multiple_of == 0; k++)
            if (llama_ffn_hidden(C, cand[k], multiples[i]) == F) mult = cand[k], multiple_of = multiples[i];
    }
    if (multiple_of == 0)
        llmc_die("cannot write '%s' as llm.c's Llama 3 file: no ffn_dim_multiplier/multiple_of gives F %d from C %d",
                 path, F, C);
    int32_t h[256] = {0};
    float hf[256] = {0};
    h[0] = LLMC_LLAMA3_MAGIC, h[1] = bf16 ? 5 : 3, h[2] = b->max_seq_len, h[3] = b->vocab_size, h[4] = b->num_layers;
    h[5] = b->num_heads, h[6] = b->num_kv_heads, h[7] = C, h[8] = multiple_of, h[9] = use_scaled, h[10] = 3, h[11] = 1;
    hf[0] = mult, hf[1] = cfg->norm_eps, hf[2] = cfg->rope_theta;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(params[i])) llmc_die("not writing '%s': weight %zu is %g (not finite)", path, i, (double)params[i]);
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(h, sizeof h[0], 256, af.f, af.tmp_path);
    fwriteCheck(hf, sizeof hf[0], 256, af.f, af.tmp_path);
    llmc_llama3_tensors(cfg, (float *)params, af.f, af.tmp_path, bf16, io_write);
    atomic_commit(&af);
}

