/*
 * hf.c - Hugging Face model directories (hf.h): the architecture table, config.json, and the
 * mapping between safetensors keys and model.h's parameter table.
 */
#include "llmc/formats/hf.h"
#include "llmc/core/check.h"
#include "llmc/formats/rundir.h"

#include <stdio.h>
#include <sys/stat.h>

int hf_is_model_dir(const char *path) {
    struct stat sb;
    char config[4400];
    snprintf(config, sizeof config, "%s/config.json", path);
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && lstat(config, &sb) == 0;
}

const char *const hf_tokenizer_files[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                          "special_tokens_map.json", "generation_config.json",
                                          "original/tokenizer.model", NULL};

#if LLMC_HAVE_CJSON
#include "llmc/core/atomicfile.h"
#include "llmc/core/dtype.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the architecture table ------------------------------------------------------------------ */
/* A dimension of an HF tensor, in the config's terms. Rows of DIM_V are the vocabulary: V rows in
 * the file, Vp in our tensor (the rows past V are zero). */
typedef enum { DIM_ZERO, DIM_ONE, DIM_V, DIM_C, DIM_MAXT, DIM_QKV, DIM_F, DIM_KV, DIM_NH, DIM_NKV, DIM_E } HfDim;

typedef struct {
    const char *param; /* the tensor of the architecture's table */
    const char *key;   /* HF key without the model prefix; "%d" = the layer (one HF tensor per layer) */
    HfDim rows, cols;  /* HF shape: (rows), or (rows, cols) */
    int conv1d;        /* stored (in, out) = (rows, cols); ours is (out, in): transposed both ways */
    HfDim at, at2;     /* where its rows start in our layer's slice: dim(at) + dim(at2) (q/k/v in qkvw) */
    HfDim rope_heads;  /* Llama q/k: rows laid out per head for HF's rotate-half RoPE (heads of HS rows,
                        * first the even then the odd channels of each pair); ours pairs (2i, 2i+1) */
    int bare;          /* the key never has the model prefix (Llama's lm_head.weight) */
    int experts;       /* one HF tensor per (layer, expert): the key's two "%d" (Mixtral's experts; our
                        * tensor stacks them over L then E, one slice each) */
} HfTensor;

/* The configuration an HF directory describes: Mixtral's knobs (experts) around Llama's around the
 * shared ModelConfig (a GPT-2 uses .base only, .llama.tied = 1; a Llama has num_experts 0). */
typedef MixtralConfig HfConfig;
enum { HF_MAX_PARAMS_GL = (int)NUM_PARAMETER_TENSORS > (int)LLAMA3_NUM_PARAMETERS ? (int)NUM_PARAMETER_TENSORS
                                                                                 : (int)LLAMA3_NUM_PARAMETERS,
       HF_MAX_PARAMS = HF_MAX_PARAMS_GL > (int)MIXTRAL_NUM_PARAMETERS ? HF_MAX_PARAMS_GL : (int)MIXTRAL_NUM_PARAMETERS };

typedef struct {
    const char *architecture; /* config.json "architectures"[0] */
    const char *model_type;   /* config.json "model_type" */
    const char *prefix;       /* save_pretrained's prefix of the body's keys; optional when reading */
    const char *tied_head;    /* the output head's key: absent, or equal to the first tensor (the embedding) */
    const char *const *buffers; /* per-layer ("%d") keys of stored buffers that are not weights: ignored */
    const HfTensor *tensors;
    int num_tensors;
    /* config.json -> cfg; 0, or -1 with a message (naming the field) in err */
    int (*read_config)(const cJSON *json, HfConfig *cfg, char *err, size_t errlen);
    void (*write_config)(cJSON *json, const HfConfig *cfg, int bf16);
    /* our parameter table for cfg (specs may be NULL): the total element count */
    size_t (*param_specs)(const HfConfig *cfg, TensorSpec *specs);
    int num_params;
} HfArchitecture;

static const HfTensor gpt2_tensors[] = {
    {"wte", "wte.weight", DIM_V, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"wpe", "wpe.weight", DIM_MAXT, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"ln1w", "h.%d.ln_1.weight", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"ln1b", "h.%d.ln_1.bias", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"qkvw", "h.%d.attn.c_attn.weight", DIM_C, DIM_QKV, 1, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"qkvb", "h.%d.attn.c_attn.bias", DIM_QKV, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"attprojw", "h.%d.attn.c_proj.weight", DIM_C, DIM_C, 1, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"attprojb", "h.%d.attn.c_proj.bias", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"ln2w", "h.%d.ln_2.weight", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"ln2b", "h.%d.ln_2.bias", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"fcw", "h.%d.mlp.c_fc.weight", DIM_C, DIM_F, 1, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"fcb", "h.%d.mlp.c_fc.bias", DIM_F, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"fcprojw", "h.%d.mlp.c_proj.weight", DIM_F, DIM_C, 1, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"fcprojb", "h.%d.mlp.c_proj.bias", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"lnfw", "ln_f.weight", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"lnfb", "ln_f.bias", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
};
static const char *const gpt2_buffers[] = {"h.%d.attn.bias", "h.%d.attn.masked_bias", NULL};

/* json[key] as an int in [lo, hi]: 1 found, 0 absent (or null), -1 wrong (message in err). */
static int config_int(const cJSON *json, const char *key, int lo, int hi, int *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(json, key);
    if (!v || cJSON_IsNull(v)) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d >= lo && d <= hi) || d != floor(d))
        return errf(err, errlen, "%s is not an integer in [%d, %d]", key, lo, hi);
    *out = (int)d;
    return 1;
}

/* json[key] as a boolean, def when absent; -1 wrong. */
static int config_bool(const cJSON *json, const char *key, int def, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(json, key);
    if (!v) return def;
    if (!cJSON_IsBool(v)) return errf(err, errlen, "%s is not true or false", key);
    return cJSON_IsTrue(v);
}

/* A config.json integer every architecture requires: its key, its ModelConfig field, its maximum. */
typedef struct {
    const char *key;
    size_t offset;
    int hi;
} HfSizeKey;

/* Each of sizes[0..n) into cfg (in [1, hi]); -1 with err naming a missing or bad key. */
static int read_sizes(const cJSON *json, const HfSizeKey *sizes, size_t n, ModelConfig *cfg, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        int rc = config_int(json, sizes[i].key, 1, sizes[i].hi, (int *)((char *)cfg + sizes[i].offset), err, errlen);
        if (rc < 0) return -1;
        if (rc == 0) return errf(err, errlen, "%s is missing", sizes[i].key);
    }
    return 0;
}

static int gpt2_read_config(const cJSON *json, HfConfig *hc, char *err, size_t errlen) {
    memset(hc, 0, sizeof *hc);
    hc->llama.tied = 1;
    ModelConfig *cfg = &hc->base;
    static const HfSizeKey sizes[] = {
        {"n_embd", offsetof(ModelConfig, channels), MODEL_MAX_CHANNELS},
        {"n_layer", offsetof(ModelConfig, num_layers), MODEL_MAX_LAYERS},
        {"n_head", offsetof(ModelConfig, num_heads), MODEL_MAX_CHANNELS},
        {"n_positions", offsetof(ModelConfig, max_seq_len), MODEL_MAX_SEQ_LEN},
        {"vocab_size", offsetof(ModelConfig, vocab_size), MODEL_MAX_VOCAB},
    };
    memset(cfg, 0, sizeof *cfg);
    if (read_sizes(json, sizes, sizeof sizes / sizeof sizes[0], cfg, err, errlen) < 0) return -1;
    cfg->num_kv_heads = cfg->num_heads;
    cfg->ffn_hidden = 4 * cfg->channels;
    cfg->padded_vocab_size = (cfg->vocab_size + 127) / 128 * 128;
    int inner = 0, rc = config_int(json, "n_inner", 1, 1 << 30, &inner, err, errlen);
    if (rc < 0) return -1;
    if (rc == 1 && inner != cfg->ffn_hidden)
        return errf(err, errlen, "n_inner %d is not 4 * n_embd = %d, the only MLP width GPT-2 here has", inner,
                    cfg->ffn_hidden);
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(json, "layer_norm_epsilon");
    if (eps && !(cJSON_IsNumber(eps) && fabs(eps->valuedouble - 1e-5) <= 1e-5 * 1e-6))
        return errf(err, errlen, "layer_norm_epsilon %s is not supported: llmc's LayerNorm uses 1e-5",
                    cJSON_IsNumber(eps) ? "other than 1e-5" : "(not a number)");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(json, "activation_function");
    if (act && !(cJSON_IsString(act) && (strcmp(act->valuestring, "gelu_new") == 0 ||
                                         strcmp(act->valuestring, "gelu_pytorch_tanh") == 0)))
        return errf(err, errlen, "activation_function '%.40s' is not supported: llmc's GELU is the tanh approximation "
                    "(gelu_new or gelu_pytorch_tanh)", cJSON_IsString(act) ? act->valuestring : "(not a string)");
    static const struct {
        const char *key;
        int want, def;
        const char *why;
    } flags[] = {
        {"scale_attn_weights", 1, 1, "attention scores are always scaled by 1/sqrt(head size)"},
        {"scale_attn_by_inverse_layer_idx", 0, 0, "attention scores are never scaled by the layer index"},
        {"add_cross_attention", 0, 0, "GPT-2 here is a decoder without cross-attention"},
        {"tie_word_embeddings", 1, 1, "the output head is tied to wte"},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        int v = config_bool(json, flags[i].key, flags[i].def, err, errlen);
        if (v < 0) return -1;
        if (v != flags[i].want)
            return errf(err, errlen, "%s %s is not supported: %s", flags[i].key, v ? "true" : "false", flags[i].why);
    }
    const char *bad = gpt2_config_validate(cfg);
    if (bad) return errf(err, errlen, "n_embd %d, n_layer %d, n_head %d, n_positions %d, vocab_size %d: %s",
                         cfg->channels, cfg->num_layers, cfg->num_heads, cfg->max_seq_len, cfg->vocab_size, bad);
    return 0;
}

/* config.json's head: "architectures": [architecture], "model_type", then the shape's numbers in order. */
typedef struct {
    const char *key;
    double value;
} JsonNumber;
static void write_config_head(cJSON *json, const char *architecture, const char *model_type, const JsonNumber *nums,
                              size_t n) {
    cJSON *archs = cJSON_AddArrayToObject(json, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(architecture));
    cJSON_AddStringToObject(json, "model_type", model_type);
    for (size_t i = 0; i < n; i++) cJSON_AddNumberToObject(json, nums[i].key, nums[i].value);
}

static void gpt2_write_config(cJSON *json, const HfConfig *hc, int bf16) {
    const ModelConfig *cfg = &hc->base;
    const JsonNumber shape[] = {{"vocab_size", cfg->vocab_size}, {"n_positions", cfg->max_seq_len},
                                {"n_ctx", cfg->max_seq_len},     {"n_embd", cfg->channels},
                                {"n_layer", cfg->num_layers},    {"n_head", cfg->num_heads}};
    write_config_head(json, "GPT2LMHeadModel", "gpt2", shape, sizeof shape / sizeof shape[0]);
    cJSON_AddNullToObject(json, "n_inner");
    cJSON_AddStringToObject(json, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(json, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(json, "initializer_range", 0.02);
    cJSON_AddTrueToObject(json, "scale_attn_weights");
    cJSON_AddTrueToObject(json, "tie_word_embeddings");
    cJSON_AddTrueToObject(json, "use_cache");
    int eot = cfg->vocab_size > 50256 ? 50256 : cfg->vocab_size - 1; /* GPT-2's <|endoftext|> */
    cJSON_AddNumberToObject(json, "bos_token_id", eot);
    cJSON_AddNumberToObject(json, "eos_token_id", eot);
    cJSON_AddStringToObject(json, "torch_dtype", bf16 ? "bfloat16" : "float32");
}

static size_t gpt2_specs(const HfConfig *cfg, TensorSpec *specs) { return gpt2_parameter_specs(&cfg->base, specs); }

/* ---- LlamaForCausalLM ---- */
/* the Llama family's rows around the feed-forward ones (MixtralForCausalLM's too): the embedding and
 * each layer's attention, then the final norm and the head */
#define LLAMA_FAMILY_ATTENTION_ROWS                                                                                 \
    {"wte", "embed_tokens.weight", DIM_V, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},                           \
    {"ln1w", "layers.%d.input_layernorm.weight", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},           \
    {"qkvw", "layers.%d.self_attn.q_proj.weight", DIM_C, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_NH, 0, 0},              \
    {"qkvw", "layers.%d.self_attn.k_proj.weight", DIM_KV, DIM_C, 0, DIM_C, DIM_ZERO, DIM_NKV, 0, 0},               \
    {"qkvw", "layers.%d.self_attn.v_proj.weight", DIM_KV, DIM_C, 0, DIM_C, DIM_KV, DIM_ZERO, 0, 0},                \
    {"attprojw", "layers.%d.self_attn.o_proj.weight", DIM_C, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},        \
    {"ln2w", "layers.%d.post_attention_layernorm.weight", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0}
#define LLAMA_FAMILY_HEAD_ROWS                                                                                      \
    {"lnfw", "norm.weight", DIM_C, DIM_ONE, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},                                \
    {"lm_head", "lm_head.weight", DIM_V, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 1, 0} /* untied only */
static const HfTensor llama_tensors[] = {
    LLAMA_FAMILY_ATTENTION_ROWS,
    {"fcw", "layers.%d.mlp.gate_proj.weight", DIM_F, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"fcw", "layers.%d.mlp.up_proj.weight", DIM_F, DIM_C, 0, DIM_F, DIM_ZERO, DIM_ZERO, 0, 0},
    {"fcprojw", "layers.%d.mlp.down_proj.weight", DIM_C, DIM_F, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    LLAMA_FAMILY_HEAD_ROWS,
};
static const char *const llama_buffers[] = {"layers.%d.self_attn.rotary_emb.inv_freq", NULL};

/* json[key] as a positive number that fp32 holds (normal: FLT_MIN..FLT_MAX, where it is stored,
 * used and written back as it was read): 1 found, 0 absent (or null), -1 wrong. */
static int config_float(const cJSON *json, const char *key, float *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(json, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return errf(err, errlen, "%s is not a positive number", key);
    if (!(v->valuedouble >= FLT_MIN && v->valuedouble <= FLT_MAX))
        return errf(err, errlen, "%s %g is outside the range of fp32, in which llmc keeps it (%g to %g)", key,
                    v->valuedouble, (double)FLT_MIN, (double)FLT_MAX);
    *out = (float)v->valuedouble;
    return 1;
}

static int llama_read_config(const cJSON *json, HfConfig *cfg, char *err, size_t errlen) {
    static const HfSizeKey sizes[] = {
        {"hidden_size", offsetof(ModelConfig, channels), MODEL_MAX_CHANNELS},
        {"intermediate_size", offsetof(ModelConfig, ffn_hidden), 4 * MODEL_MAX_CHANNELS},
        {"num_hidden_layers", offsetof(ModelConfig, num_layers), MODEL_MAX_LAYERS},
        {"num_attention_heads", offsetof(ModelConfig, num_heads), MODEL_MAX_CHANNELS},
        {"max_position_embeddings", offsetof(ModelConfig, max_seq_len), MODEL_MAX_SEQ_LEN},
        {"vocab_size", offsetof(ModelConfig, vocab_size), MODEL_MAX_VOCAB},
    };
    memset(cfg, 0, sizeof *cfg);
    ModelConfig *b = &cfg->base;
    if (read_sizes(json, sizes, sizeof sizes / sizeof sizes[0], b, err, errlen) < 0) return -1;
    b->padded_vocab_size = (b->vocab_size + 127) / 128 * 128;
    b->num_kv_heads = b->num_heads; /* HF's default: no grouping */
    if (config_int(json, "num_key_value_heads", 1, MODEL_MAX_CHANNELS, &b->num_kv_heads, err, errlen) < 0) return -1;
    int head_dim = 0, rc = config_int(json, "head_dim", 1, MODEL_MAX_CHANNELS, &head_dim, err, errlen);
    if (rc < 0) return -1;
    if (rc == 1 && head_dim * b->num_heads != b->channels)
        return errf(err, errlen, "head_dim %d is not hidden_size / num_attention_heads = %d, the only head size here",
                    head_dim, b->channels / b->num_heads);
    cfg->llama.norm_eps = 1e-6f;      /* transformers' LlamaConfig defaults */
    cfg->llama.rope_theta = 10000.0f;
    if (config_float(json, "rms_norm_eps", &cfg->llama.norm_eps, err, errlen) < 0 ||
        config_float(json, "rope_theta", &cfg->llama.rope_theta, err, errlen) < 0)
        return -1;
    cfg->llama.tied = config_bool(json, "tie_word_embeddings", 0, err, errlen);
    if (cfg->llama.tied < 0) return -1;
    for (const char *const *k = (const char *const[]){"attention_bias", "mlp_bias", NULL}; *k; k++) {
        int v = config_bool(json, *k, 0, err, errlen);
        if (v < 0) return -1;
        if (v) return errf(err, errlen, "%s true is not supported: Llama here has no biases", *k);
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(json, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
        return errf(err, errlen, "hidden_act '%.40s' is not supported: the MLP is SwiGLU (silu)",
                    cJSON_IsString(act) ? act->valuestring : "(not a string)");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(json, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!type) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsObject(rs) || !cJSON_IsString(type) || strcmp(type->valuestring, "llama3") != 0)
            return errf(err, errlen, "rope_scaling of type '%.40s' is not supported (only \"llama3\" or null)",
                        cJSON_IsString(type) ? type->valuestring : "(none)");
        if (config_float(rs, "factor", &cfg->llama.rope_factor, err, errlen) != 1 ||
            config_float(rs, "low_freq_factor", &cfg->llama.rope_low_freq_factor, err, errlen) != 1 ||
            config_float(rs, "high_freq_factor", &cfg->llama.rope_high_freq_factor, err, errlen) != 1 ||
            config_int(rs, "original_max_position_embeddings", 1, MODEL_MAX_SEQ_LEN, &cfg->llama.rope_original_max_pos, err,
                       errlen) != 1) {
            if (!err[0]) errf(err, errlen, "rope_scaling needs factor, low_freq_factor, high_freq_factor and "
                              "original_max_position_embeddings");
            return -1;
        }
    }
    const char *bad = llama_config_validate(&cfg->llama);
    if (bad) return errf(err, errlen, "hidden_size %d, num_attention_heads %d, num_key_value_heads %d: %s", b->channels,
                         b->num_heads, b->num_kv_heads, bad);
    return 0;
}

static void llama_write_config(cJSON *json, const HfConfig *cfg, int bf16) {
    const ModelConfig *b = &cfg->base;
    const JsonNumber shape[] = {{"vocab_size", b->vocab_size},
                                {"hidden_size", b->channels},
                                {"intermediate_size", b->ffn_hidden},
                                {"num_hidden_layers", b->num_layers},
                                {"num_attention_heads", b->num_heads},
                                {"num_key_value_heads", b->num_kv_heads},
                                {"head_dim", b->channels / b->num_heads},
                                {"max_position_embeddings", b->max_seq_len}};
    write_config_head(json, "LlamaForCausalLM", "llama", shape, sizeof shape / sizeof shape[0]);
    cJSON_AddStringToObject(json, "hidden_act", "silu");
    cJSON_AddNumberToObject(json, "rms_norm_eps", cfg->llama.norm_eps);
    cJSON_AddNumberToObject(json, "rope_theta", cfg->llama.rope_theta);
    if (cfg->llama.rope_factor > 0) {
        cJSON *rs = cJSON_AddObjectToObject(json, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", cfg->llama.rope_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", cfg->llama.rope_low_freq_factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", cfg->llama.rope_high_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", cfg->llama.rope_original_max_pos);
    } else {
        cJSON_AddNullToObject(json, "rope_scaling");
    }
    cJSON_AddBoolToObject(json, "tie_word_embeddings", cfg->llama.tied);
    cJSON_AddFalseToObject(json, "attention_bias");
    cJSON_AddFalseToObject(json, "mlp_bias");
    cJSON_AddNumberToObject(json, "initializer_range", 0.02);
    cJSON_AddTrueToObject(json, "use_cache");
    cJSON_AddStringToObject(json, "torch_dtype", bf16 ? "bfloat16" : "float32");
}

static size_t llama_specs(const HfConfig *cfg, TensorSpec *specs) { return llama_parameter_specs(&cfg->llama, specs); }

/* ---- MixtralForCausalLM: the Llama's config and tensors, the MLP replaced by routed experts ---- */
static const HfTensor mixtral_tensors[] = {
    LLAMA_FAMILY_ATTENTION_ROWS,
    {"gatew", "layers.%d.block_sparse_moe.gate.weight", DIM_E, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 0},
    {"expfcw", "layers.%d.block_sparse_moe.experts.%d.w1.weight", DIM_F, DIM_C, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 1},
    {"expfcw", "layers.%d.block_sparse_moe.experts.%d.w3.weight", DIM_F, DIM_C, 0, DIM_F, DIM_ZERO, DIM_ZERO, 0, 1},
    {"expprojw", "layers.%d.block_sparse_moe.experts.%d.w2.weight", DIM_C, DIM_F, 0, DIM_ZERO, DIM_ZERO, DIM_ZERO, 0, 1},
    LLAMA_FAMILY_HEAD_ROWS,
};

static int mixtral_read_config(const cJSON *json, HfConfig *cfg, char *err, size_t errlen) {
    if (llama_read_config(json, cfg, err, errlen) != 0) return -1;
    int rc = config_int(json, "num_local_experts", 1, MIXTRAL_MAX_EXPERTS, &cfg->num_experts, err, errlen);
    if (rc < 0) return -1;
    if (rc == 0) return errf(err, errlen, "num_local_experts is missing");
    cfg->top_k = 2; /* transformers' MixtralConfig defaults */
    cfg->aux_coef = 0.001f;
    if (config_int(json, "num_experts_per_tok", 1, MIXTRAL_MAX_EXPERTS, &cfg->top_k, err, errlen) < 0) return -1;
    if (cfg->top_k > cfg->num_experts)
        return errf(err, errlen, "num_experts_per_tok %d is more than num_local_experts %d", cfg->top_k, cfg->num_experts);
    const cJSON *coef = cJSON_GetObjectItemCaseSensitive(json, "router_aux_loss_coef");
    if (coef && !cJSON_IsNull(coef)) {
        if (!cJSON_IsNumber(coef) || !(coef->valuedouble >= 0) || !(coef->valuedouble <= FLT_MAX))
            return errf(err, errlen, "router_aux_loss_coef is not a finite number >= 0");
        cfg->aux_coef = (float)coef->valuedouble;
    }
    cfg->output_router_logits = config_bool(json, "output_router_logits", 0, err, errlen);
    if (cfg->output_router_logits < 0) return -1;
    int window = 0;
    if ((rc = config_int(json, "sliding_window", 1, INT32_MAX, &window, err, errlen)) < 0) return -1;
    if (rc == 1 && window < cfg->base.max_seq_len)
        return errf(err, errlen, "sliding_window %d is less than max_position_embeddings %d: llmc's attention is full "
                    "causal (null, or at least the context, is supported)", window, cfg->base.max_seq_len);
    const char *bad = mixtral_config_validate(cfg);
    if (bad) return errf(err, errlen, "%s", bad);
    return 0;
}

static void mixtral_write_config(cJSON *json, const HfConfig *cfg, int bf16) {
    llama_write_config(json, cfg, bf16);
    cJSON *archs = cJSON_CreateArray();
    cJSON_AddItemToArray(archs, cJSON_CreateString("MixtralForCausalLM"));
    cJSON_ReplaceItemInObjectCaseSensitive(json, "architectures", archs);
    cJSON_ReplaceItemInObjectCaseSensitive(json, "model_type", cJSON_CreateString("mixtral"));
    cJSON_DeleteItemFromObjectCaseSensitive(json, "mlp_bias");
    cJSON_AddNumberToObject(json, "num_local_experts", cfg->num_experts);
    cJSON_AddNumberToObject(json, "num_experts_per_tok", cfg->top_k);
    cJSON_AddNumberToObject(json, "router_aux_loss_coef", cfg->aux_coef);
    cJSON_AddBoolToObject(json, "output_router_logits", cfg->output_router_logits);
    cJSON_AddNullToObject(json, "sliding_window");
    cJSON_AddNumberToObject(json, "attention_dropout", 0.0);
}

static size_t mixtral_specs(const HfConfig *cfg, TensorSpec *specs) { return mixtral_parameter_specs(cfg, specs); }

static const HfArchitecture architectures[] = {
    {"GPT2LMHeadModel", "gpt2", "transformer.", "lm_head.weight", gpt2_buffers, gpt2_tensors,
     (int)(sizeof gpt2_tensors / sizeof gpt2_tensors[0]), gpt2_read_config, gpt2_write_config, gpt2_specs,
     NUM_PARAMETER_TENSORS},
    {"LlamaForCausalLM", "llama", "model.", "lm_head.weight", llama_buffers, llama_tensors,
     (int)(sizeof llama_tensors / sizeof llama_tensors[0]), llama_read_config, llama_write_config, llama_specs,
     LLAMA3_NUM_PARAMETERS},
    {"MixtralForCausalLM", "mixtral", "model.", "lm_head.weight", llama_buffers, mixtral_tensors,
     (int)(sizeof mixtral_tensors / sizeof mixtral_tensors[0]), mixtral_read_config, mixtral_write_config,
     mixtral_specs, MIXTRAL_NUM_PARAMETERS},
};
enum { NUM_ARCHITECTURES = sizeof architectures / sizeof architectures[0] };

static int64_t dim_value(HfDim d, const HfConfig *hc) {
    const ModelConfig *c = &hc->base;
    switch (d) {
    case DIM_E: return hc->num_experts;
    case DIM_ONE: return 1;
    case DIM_V: return c->vocab_size;
    case DIM_C: return c->channels;
    case DIM_MAXT: return c->max_seq_len;
    case DIM_QKV: return (int64_t)(c->num_heads + 2 * c->num_kv_heads) * (c->channels / c->num_heads);
    case DIM_F: return c->ffn_hidden;
    case DIM_KV: return (int64_t)c->num_kv_heads * (c->channels / c->num_heads);
    case DIM_NH: return c->num_heads;
    case DIM_NKV: return c->num_kv_heads;
    case DIM_ZERO: return 0;
    }
    return 0;
}

/* the rows of a layer's slice of our tensor where this HF tensor starts */
static size_t row_offset(const HfTensor *t, const HfConfig *c) {
    return (size_t)(dim_value(t->at, c) + dim_value(t->at2, c)) * (size_t)(t->cols == DIM_ONE ? 1 : dim_value(t->cols, c));
}

/* HF rotate-half row r of a head <-> our interleaved row: HF row p * HS/2 + i holds our row 2i + p */
static size_t rope_row(size_t hf_row, size_t HS) {
    size_t h = hf_row / HS, r = hf_row % HS, p = r / (HS / 2), i = r % (HS / 2);
    return h * HS + 2 * i + p;
}

static int per_layer(const HfTensor *t) { return strstr(t->key, "%d") != NULL; }
/* how many HF tensors a row is: 1, one per layer, or one per (layer, expert) */
static int instances(const HfTensor *t, const HfConfig *hc) {
    return !per_layer(t) ? 1 : t->experts ? hc->base.num_layers * hc->num_experts : hc->base.num_layers;
}

/* The spec of t's parameter; t's rows lie inside its layer slice (checked on every use). */
static const TensorSpec *param_spec(const HfArchitecture *a, const HfTensor *t, const TensorSpec *specs,
                                    const HfConfig *cfg) {
    const TensorSpec *s = NULL;
    for (int i = 0; i < a->num_params && !s; i++)
        if (strcmp(specs[i].name, t->param) == 0) s = &specs[i];
    llmcCheck(s != NULL, "the HF tensor map names parameters of the architecture's table");
    size_t rows = t->rows == DIM_V ? (size_t)cfg->base.padded_vocab_size : (size_t)dim_value(t->rows, cfg);
    size_t layers = (size_t)instances(t, cfg);
    llmcCheck(s->numel == 0 || row_offset(t, cfg) + rows * (size_t)dim_value(t->cols, cfg) <= s->numel / layers,
              "HF shapes fit the architecture's table"); /* numel 0: a tied head, not in the directory */
    return s;
}

/* the HF tensors of cfg: a tied model has no lm_head row (its head is the embedding) */
static int row_present(const HfTensor *t, const TensorSpec *s) { (void)t; return s->numel > 0; }

/* Every element of the table but the padded vocabulary rows is some HF tensor's, exactly once. */
static void check_coverage(const HfArchitecture *a, const TensorSpec *specs, const HfConfig *cfg, size_t numel) {
    size_t covered = 0;
    for (int r = 0; r < a->num_tensors; r++) {
        const HfTensor *t = &a->tensors[r];
        const TensorSpec *s = param_spec(a, t, specs, cfg);
        if (!row_present(t, s)) continue;
        size_t rows = t->rows == DIM_V ? (size_t)cfg->base.padded_vocab_size : (size_t)dim_value(t->rows, cfg);
        covered += (size_t)instances(t, cfg) * rows * (size_t)dim_value(t->cols, cfg);
    }
    llmcCheck(covered == numel, "the HF tensor map covers every parameter once");
}

/* instance i of row t (i: the layer, or layer * E + expert for a row of experts) */
static void key_name(const HfTensor *t, const char *prefix, int i, const HfConfig *hc, char *out, size_t len) {
    char key[256];
    if (t->experts) snprintf(key, sizeof key, t->key, i / hc->num_experts, i % hc->num_experts);
    else snprintf(key, sizeof key, t->key, i);
    snprintf(out, len, "%s%s", t->bare ? "" : prefix, key);
}

/* ---- config.json --------------------------------------------------------------------------------- */
static char *read_text(const char *path, const char *what, size_t limit, size_t *len) {
    char err[4400];
    FILE *f = fopen_regular(path, err, sizeof err);
    if (!f) llmc_die("%s: %s", what, err);
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || (size_t)sb.st_size > limit)
        llmc_die("%s '%s' is larger than %zu bytes", what, path, limit);
    char *text = (char *)mallocCheck((size_t)sb.st_size + 1, what);
    *len = fread(text, 1, (size_t)sb.st_size, f);
    fclose(f);
    if (*len != (size_t)sb.st_size) llmc_die("cannot read %s '%s'", what, path);
    text[*len] = '\0';
    return text;
}

/* The table row that config.json names ("architectures", else "model_type"); NULL with a message. */
static const HfArchitecture *find_architecture(const cJSON *json, char *err, size_t errlen) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(json, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(json, "model_type");
    const cJSON *first = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (archs && !(cJSON_IsString(first) && cJSON_GetArraySize(archs) == 1)) {
        errf(err, errlen, "\"architectures\" is not a list of one name");
        return NULL;
    }
    if (type && !cJSON_IsString(type)) {
        errf(err, errlen, "\"model_type\" is not a string");
        return NULL;
    }
    if (!archs && !type) {
        errf(err, errlen, "names no architecture (neither \"architectures\" nor \"model_type\")");
        return NULL;
    }
    const char *name = archs ? first->valuestring : type->valuestring;
    for (int i = 0; i < NUM_ARCHITECTURES; i++) {
        const HfArchitecture *a = &architectures[i];
        if (strcmp(name, archs ? a->architecture : a->model_type) != 0) continue;
        if (type && strcmp(type->valuestring, a->model_type) != 0) {
            errf(err, errlen, "has model_type '%.60s' with architecture %s (expected model_type '%s')", type->valuestring,
                 a->architecture, a->model_type);
            return NULL;
        }
        return a;
    }
    errf(err, errlen, "names architecture '%.60s', which llmc does not support (supported: %s, %s, %s)", name,
         architectures[0].architecture, architectures[1].architecture, architectures[2].architecture);
    return NULL;
}

static void check_weights(const char *dir, const HfArchitecture *a, const HfConfig *hc);

static const HfArchitecture *read_config(const char *dir, HfConfig *cfg) {
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *text = read_text(path, "Hugging Face config", 1 << 20, &len);
    cJSON *json = cJSON_ParseWithLength(text, len);
    free(text);
    char err[1024] = "", why[900] = "";
    const HfArchitecture *arch = NULL;
    if (!cJSON_IsObject(json)) snprintf(err, sizeof err, "is not a JSON object");
    else if ((arch = find_architecture(json, err, sizeof err)) && arch->read_config(json, cfg, why, sizeof why) != 0)
        snprintf(err, sizeof err, "(%s): %s", arch->architecture, why);
    cJSON_Delete(json);
    if (err[0]) llmc_die("Hugging Face config '%s' %s", path, err);
    check_weights(dir, arch, cfg);
    return arch;
}

static int is_llama(const HfArchitecture *a) { return a == &architectures[1]; }
static int is_mixtral(const HfArchitecture *a) { return a == &architectures[2]; }

void hf_read_config(const char *dir, ModelConfig *cfg) {
    HfConfig hc;
    const HfArchitecture *a = read_config(dir, &hc);
    if (is_llama(a) || is_mixtral(a))
        llmc_die("Hugging Face directory '%s' is a %s: this program reads GPT-2 models only (Llama, Mixtral: "
                 "./train_gpt_cpu, ./generate, ./hf_convert)", dir, a->architecture);
    *cfg = hc.base;
}

/* 1 when dir is a Hugging Face directory of architecture a (its config in *hc) */
static int read_config_of(const char *dir, const HfArchitecture *a, HfConfig *hc) {
    return hf_is_model_dir(dir) && read_config(dir, hc) == a;
}

int hf_read_llama_config(const char *dir, LlamaConfig *cfg) {
    HfConfig hc;
    if (!read_config_of(dir, &architectures[1], &hc)) return 0;
    *cfg = hc.llama;
    return 1;
}

int hf_read_mixtral_config(const char *dir, MixtralConfig *cfg) { return read_config_of(dir, &architectures[2], cfg); }

/* ---- loading ------------------------------------------------------------------------------------- */
static void verify_checksums(const char *dir, const Safetensors *st) {
    int unverified = 0;
    for (int i = 0; i < st->num_files; i++) {
        uint32_t want_crc;
        long long want_bytes;
        if (!sumfile_read(st->files[i].path, &want_crc, &want_bytes)) {
            unverified++;
            continue;
        }
        uint32_t crc = sumfile_checksum(st->files[i].path);
        if (crc != want_crc || (long long)st->files[i].size != want_bytes)
            llmc_die("safetensors file '%s' does not match its checksum file '%s.sum' (crc32 %08x, %llu bytes; "
                     "recorded %08x, %lld bytes): the file is damaged or was replaced", st->files[i].path,
                     st->files[i].path, (unsigned)crc, (unsigned long long)st->files[i].size, (unsigned)want_crc,
                     want_bytes);
    }
    if (unverified)
        printf("note: Hugging Face directory '%s': %d of %d safetensors file(s) have no checksum file (as from the "
               "Hugging Face hub): loaded without verifying them\n", dir, unverified, st->num_files);
}

static void die_shape(const char *dir, const Safetensors *st, const StTensor *t, const int64_t *want, int ndim) {
    char got[256] = "", need[256] = "";
    for (int d = 0; d < t->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    for (int d = 0; d < ndim; d++)
        snprintf(need + strlen(need), sizeof need - strlen(need), "%s%lld", d ? ", " : "", (long long)want[d]);
    llmc_die("Hugging Face directory '%s': tensor '%s' (in '%s') has shape [%s], but config.json's sizes need [%s]", dir,
             t->name, st->files[t->file].path, got, need);
}

/* The tensor name for (row, layer), checked present and of the HF shape; marks it used. */
static const StTensor *locate(const char *dir, const Safetensors *st, const HfArchitecture *a, const HfTensor *row,
                              const char *prefix, int layer, const HfConfig *cfg, char *used) {
    char name[512];
    key_name(row, prefix, layer, cfg, name, sizeof name);
    const StTensor *t = safetensors_find(st, name);
    if (!t)
        llmc_die("Hugging Face directory '%s' has no tensor '%s' (an %s with config.json's n_layer %d needs it)", dir,
                 name, a->architecture, cfg->base.num_layers);
    int64_t want[2] = {dim_value(row->rows, cfg), dim_value(row->cols, cfg)};
    int ndim = row->cols == DIM_ONE ? 1 : 2;
    if (t->ndim != ndim || t->shape[0] != want[0] || (ndim == 2 && t->shape[1] != want[1])) die_shape(dir, st, t, want, ndim);
    used[t - st->tensors] = 1;
    return t;
}

/* "transformer." or "": the key style of this directory (one style for all keys). */
static const char *key_prefix(const char *dir, const Safetensors *st, const HfArchitecture *a, const HfConfig *hc) {
    char with[512];
    key_name(&a->tensors[0], a->prefix, 0, hc, with, sizeof with);
    const char *bare = with + strlen(a->prefix);
    int has_with = safetensors_find(st, with) != NULL, has_bare = safetensors_find(st, bare) != NULL;
    if (has_with && has_bare)
        llmc_die("Hugging Face directory '%s' holds both '%s' and '%s': keys must all have the '%s' prefix or none "
                 "have it", dir, with, bare, a->prefix);
    if (!has_with && !has_bare) llmc_die("Hugging Face directory '%s' has no tensor '%s' (or '%s')", dir, with, bare);
    return has_with ? a->prefix : "";
}

static int is_buffer(const HfArchitecture *a, const char *prefix, const char *name, int layers) {
    size_t pl = strlen(prefix);
    if (strncmp(name, prefix, pl) != 0) return 0;
    for (const char *const *b = a->buffers; *b; b++)
        for (int l = 0; l < layers; l++) {
            char key[256];
            snprintf(key, sizeof key, *b, l);
            if (strcmp(name + pl, key) == 0) return 1;
        }
    return 0;
}

/* Every key and shape of st against a's tensor map for hc (specs: a's table for it): dies naming
 * the first tensor that is missing, of another shape, or not the model's. Returns the key prefix;
 * *largest: the element count of the largest tensor. Only the safetensors headers are read. */
static const char *check_tensors(const char *dir, const Safetensors *st, const HfArchitecture *a, const HfConfig *hc,
                                 const TensorSpec *specs, uint64_t *largest) {
    const HfConfig *cfg = hc;
    const char *prefix = key_prefix(dir, st, a, hc);
    char *used = (char *)callocCheck((size_t)st->num_tensors + 1, 1, "HF key check");
    *largest = 0;
    for (int r = 0; r < a->num_tensors; r++) {
        const HfTensor *row = &a->tensors[r];
        if (!row_present(row, param_spec(a, row, specs, cfg))) continue;
        for (int l = 0; l < instances(row, cfg); l++) {
            uint64_t n = safetensors_numel(locate(dir, st, a, row, prefix, l, cfg, used));
            if (n > *largest) *largest = n;
        }
    }
    const StTensor *head = hc->llama.tied ? safetensors_find(st, a->tied_head) : NULL;
    if (head) {
        HfTensor head_row = a->tensors[0];
        head_row.key = a->tied_head;
        locate(dir, st, a, &head_row, "", 0, cfg, used);
    }
    for (int i = 0; i < st->num_tensors; i++)
        if (!used[i] && !is_buffer(a, prefix, st->tensors[i].name, cfg->base.num_layers))
            llmc_die("Hugging Face directory '%s': tensor '%s' (in '%s') is not part of an %s with config.json's sizes "
                     "(%d layers%s) and '%s' keys", dir, st->tensors[i].name, st->files[st->tensors[i].file].path,
                     a->architecture, cfg->base.num_layers, hc->llama.tied ? ", tied head" : "", prefix[0] ? prefix : "unprefixed");
    free(used);
    return prefix;
}

/* config.json's sizes against the weights' headers, before anything of the model's size is
 * allocated: a config.json that the weights do not hold is an error naming the tensor. */
static void check_weights(const char *dir, const HfArchitecture *a, const HfConfig *hc) {
    TensorSpec specs[HF_MAX_PARAMS];
    const size_t numel = a->param_specs(hc, specs);
    check_coverage(a, specs, hc, numel);
    Safetensors *st = safetensors_open_dir(dir);
    uint64_t largest;
    check_tensors(dir, st, a, hc, specs, &largest);
    safetensors_close(st);
}

/* Reads an HF tensor into dst: transposed for Conv1D, rows reordered from HF's rotate-half layout
 * for RoPE'd projections (HS = head size), rows beyond the file's left as they are.
 * Returns 0, or -1 with a message in err (a non-finite weight). */
static int read_into(const char *dir, const Safetensors *st, const StTensor *t, const HfTensor *row, float *buf,
                     float *dst, size_t HS, char *err, size_t errlen) {
    safetensors_read_f32(st, t, buf);
    const uint64_t n = safetensors_numel(t);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(buf[i]))
            return errf(err, errlen, "Hugging Face directory '%s': tensor '%s' (in '%s') has a non-finite weight (%g) "
                        "at index %llu", dir, t->name, st->files[t->file].path, (double)buf[i], (unsigned long long)i);
    if (row->conv1d) { /* file (in, out) -> ours (out, in) */
        const size_t in = (size_t)t->shape[0], out = (size_t)t->shape[1];
        for (size_t i = 0; i < in; i++)
            for (size_t o = 0; o < out; o++) dst[o * in + i] = buf[i * out + o];
    } else if (row->rope_heads != DIM_ZERO) {
        const size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
        for (size_t r = 0; r < rows; r++) memcpy(dst + rope_row(r, HS) * cols, buf + r * cols, cols * sizeof(float));
    } else {
        memcpy(dst, buf, n * sizeof(float));
    }
    return 0;
}

/* Loads dir (architecture a, configuration cfg) into params laid out by a's table. Returns 1 when
 * every weight was stored as BF16. */
static int load_dir(const char *dir, const HfArchitecture *a, const HfConfig *hc, float *params, size_t numel) {
    const ModelConfig cfg = hc->base;
    TensorSpec specs[HF_MAX_PARAMS];
    if (a->param_specs(hc, specs) != numel)
        llmc_die("Hugging Face directory '%s' does not match the model being loaded", dir);
    check_coverage(a, specs, hc, numel);
    const size_t HS = (size_t)(cfg.channels / cfg.num_heads);
    Safetensors *st = safetensors_open_dir(dir);
    uint64_t largest;
    const char *prefix = check_tensors(dir, st, a, hc, specs, &largest);
    const StTensor *head = hc->llama.tied ? safetensors_find(st, a->tied_head) : NULL;
    verify_checksums(dir, st);

    /* errors found while reading are reported after the buffer is freed (no leak at the exit) */
    float *buf = (float *)mallocCheck((size_t)(largest ? largest : 1) * sizeof(float), "HF read buffer");
    memset(params, 0, numel * sizeof(float)); /* the padded vocabulary rows stay zero */
    int all_bf16 = 1, rc = 0;
    char err[2048] = "";
    for (int r = 0; r < a->num_tensors && rc == 0; r++) {
        const HfTensor *row = &a->tensors[r];
        const TensorSpec *s = param_spec(a, row, specs, hc);
        if (!row_present(row, s)) continue;
        const int layers = instances(row, hc);
        char name[512];
        for (int l = 0; l < layers && rc == 0; l++) {
            key_name(row, prefix, l, hc, name, sizeof name);
            const StTensor *t = safetensors_find(st, name);
            all_bf16 &= t->dtype == ST_BF16;
            rc = read_into(dir, st, t, row, buf, params + s->offset + l * (s->numel / layers) + row_offset(row, hc),
                           HS, err, sizeof err);
        }
    }
    if (rc == 0 && head) { /* tied: it must be the embedding, row for row */
        const TensorSpec *s = param_spec(a, &a->tensors[0], specs, hc);
        safetensors_read_f32(st, head, buf);
        all_bf16 &= head->dtype == ST_BF16;
        uint64_t n = safetensors_numel(head);
        for (uint64_t i = 0; i < n && rc == 0; i++)
            if (buf[i] != params[s->offset + i])
                rc = errf(err, sizeof err, "Hugging Face directory '%s': tensor '%s' (in '%s') differs from the "
                          "embedding at index %llu (%g, the embedding %g): an untied output head, which %s here cannot "
                          "represent", dir, head->name, st->files[head->file].path, (unsigned long long)i,
                          (double)buf[i], (double)params[s->offset + i], a->architecture);
    }
    free(buf);
    safetensors_close(st);
    if (rc) llmc_die("%s", err);
    return all_bf16;
}

int hf_load(const char *dir, float *params, size_t numel) {
    HfConfig hc;
    const HfArchitecture *a = read_config(dir, &hc);
    if (is_llama(a) || is_mixtral(a)) llmc_die("Hugging Face directory '%s' is a %s: not a GPT-2 model", dir, a->architecture);
    return load_dir(dir, a, &hc, params, numel);
}

/* a Llama's config as the HfConfig (no experts) */
static HfConfig llama_hf(const LlamaConfig *cfg) {
    HfConfig hc;
    memset(&hc, 0, sizeof hc);
    hc.llama = *cfg;
    return hc;
}

/* dir's parameters for the model cfg describes, read from dir as architecture a (the caller read cfg
 * from dir: another shape or expert count is a bug, who names the caller) */
static int load_as(const char *dir, const HfArchitecture *a, const HfConfig *cfg, float *params, size_t numel,
                   const char *who) {
    HfConfig hc;
    llmcCheck(read_config(dir, &hc) == a && memcmp(&hc.base, &cfg->base, sizeof hc.base) == 0 &&
                  hc.num_experts == cfg->num_experts, who);
    return load_dir(dir, a, &hc, params, numel);
}

int hf_llama_load(const char *dir, const LlamaConfig *cfg, float *params, size_t numel) {
    HfConfig hc = llama_hf(cfg);
    return load_as(dir, &architectures[1], &hc, params, numel, "hf_llama_load: the directory's config");
}

int hf_mixtral_load(const char *dir, const MixtralConfig *cfg, float *params, size_t numel) {
    return load_as(dir, &architectures[2], cfg, params, numel, "hf_mixtral_load: the directory's config");
}

/* ---- writing ------------------------------------------------------------------------------------- */
/* json printed (cJSON's layout) with a final newline into path, atomically; json freed */
static void write_json(const char *path, cJSON *json) {
    char *text = cJSON_Print(json);
    cJSON_Delete(json);
    if (!text) llmc_die("out of memory writing '%s'", path);
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(text, 1, strlen(text), af.f, af.tmp_path);
    fwriteCheck("\n", 1, 1, af.f, af.tmp_path);
    free(text);
    atomic_commit(&af);
}

/* Adds to json every field of from/config.json (an HF directory of architecture a: the run's -e)
 * that json does not set (bos_token_id, eos_token_id, pad_token_id, transformers_version, ...):
 * what read_config accepted, it left as the model it describes, so the copy describes the same
 * one. transformers' newer "dtype" (torch_dtype's new name) is written with our torch_dtype. */
static void carry_fields(cJSON *json, const HfArchitecture *a, const char *from) {
    char path[4400], err[4600];
    snprintf(path, sizeof path, "%s/config.json", from);
    /* read when a checkpoint is written: a source changed since startup is a note, never a late failure */
    FILE *f = fopen_regular(path, err, sizeof err);
    struct stat sb;
    char *text = f && fstat(fileno(f), &sb) == 0 && sb.st_size <= (1 << 20) ? (char *)malloc((size_t)sb.st_size + 1) : NULL;
    size_t len = text ? fread(text, 1, (size_t)sb.st_size, f) : 0;
    if (f) fclose(f);
    cJSON *src = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!cJSON_IsObject(src) || find_architecture(src, err, sizeof err) != a) { /* another model: nothing to carry */
        printf("note: --save-hf: '%s' (of -e) is not a readable %s config.json now: the config.json written holds "
               "llmc's fields only\n", path, a->architecture);
        cJSON_Delete(src);
        return;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, src) {
        if (!item->string || cJSON_GetObjectItemCaseSensitive(json, item->string)) continue;
        const cJSON *ours = strcmp(item->string, "dtype") == 0 ? cJSON_GetObjectItemCaseSensitive(json, "torch_dtype") : NULL;
        cJSON *copy = cJSON_Duplicate(ours ? ours : item, 1);
        if (!copy) llmc_die("out of memory copying config.json fields from '%s'", path);
        cJSON_AddItemToObject(json, item->string, copy);
    }
    cJSON_Delete(src);
}

/* config_from: an HF directory whose config.json fields we do not set are kept (NULL: none). */
static void write_config(const char *path, const HfArchitecture *a, const HfConfig *cfg, int bf16,
                         const char *config_from) {
    cJSON *json = cJSON_CreateObject();
    a->write_config(json, cfg, bf16);
    if (config_from) carry_fields(json, a, config_from);
    write_json(path, json);
}

/* Above this many bytes the weights are written as shards model-0000i-of-0000n.safetensors with
 * model.safetensors.index.json, as save_pretrained does (its default max_shard_size, 5 GB);
 * LLMC_HF_SHARD_BYTES overrides it (tests write small shards). */
static uint64_t shard_limit(void) {
    const char *e = getenv("LLMC_HF_SHARD_BYTES");
    char *end;
    unsigned long long v = e && *e ? strtoull(e, &end, 10) : 0;
    if (e && *e && (*end || v == 0)) llmc_die("LLMC_HF_SHARD_BYTES=%s: not a positive byte count", e);
    return v ? (uint64_t)v : 5000000000ull;
}

static void write_index(const char *path, const StWriteTensor *w, int count, const int *shard_of, int shards,
                        uint64_t total) {
    cJSON *json = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(json, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON *map = cJSON_AddObjectToObject(json, "weight_map");
    char file[64];
    for (int k = 0; k < count; k++) {
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard_of[k] + 1, shards);
        cJSON_AddStringToObject(map, w[k].name, file);
    }
    write_json(path, json);
}

/* Writes the safetensors of dir (the temporary directory): one file, or shards with their index. */
static void write_weights(const char *dir, const StWriteTensor *w, int count, int bf16) {
    const size_t esize = bf16 ? 2 : 4;
    uint64_t total = 0;
    for (int k = 0; k < count; k++) total += (uint64_t)w[k].shape[0] * (uint64_t)(w[k].ndim == 2 ? w[k].shape[1] : 1) * esize;
    const uint64_t limit = shard_limit();
    char path[4400];
    uint64_t bytes;
    if (total <= limit) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        uint32_t crc = safetensors_write(path, w, count, bf16 ? ST_BF16 : ST_F32, &bytes);
        sumfile_write(path, crc, (long long)bytes);
        return;
    }
    int *shard_of = (int *)callocCheck((size_t)count, sizeof(int), "HF shard map");
    int shards = 0;
    uint64_t in_shard = 0;
    for (int k = 0; k < count; k++) { /* in order; a new shard when this tensor would pass the limit */
        uint64_t b = (uint64_t)w[k].shape[0] * (uint64_t)(w[k].ndim == 2 ? w[k].shape[1] : 1) * esize;
        if (k == 0 || (in_shard > 0 && in_shard + b > limit)) shards++, in_shard = 0;
        shard_of[k] = shards - 1;
        in_shard += b;
    }
    for (int sh = 0, first = 0; sh < shards; sh++) {
        int last = first;
        while (last < count && shard_of[last] == sh) last++;
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, sh + 1, shards);
        uint32_t crc = safetensors_write(path, w + first, last - first, bf16 ? ST_BF16 : ST_F32, &bytes);
        sumfile_write(path, crc, (long long)bytes);
        first = last;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_index(path, w, count, shard_of, shards, total);
    free(shard_of);
}

/* Copies the hf_tokenizer_files that the directory from holds into to (atomic_open: each file
 * fsynced); returns how many. Never blocks on a FIFO (hf_check_save_source refused it at startup;
 * one put there since is an error here). */
static int copy_tokenizer_files(const char *from, const char *to) {
    int copied = 0;
    for (const char *const *name = hf_tokenizer_files; *name; name++) {
        char src[4400], dst[4400], err[4600];
        snprintf(src, sizeof src, "%s/%s", from, *name);
        const int status = regular_file_status(src, err, sizeof err);
        if (status == 0) continue;
        FILE *in = status > 0 ? fopen_regular(src, err, sizeof err) : NULL;
        if (!in) llmc_die("cannot copy a tokenizer file into the --save-hf directory: %s", err);
        snprintf(dst, sizeof dst, "%s/%s", to, *name);
        char *slash = strrchr(dst, '/');
        if (strchr(*name, '/')) { /* original/tokenizer.model: its directory first */
            *slash = 0;
            if (mkdir(dst, 0755) != 0 && errno != EEXIST) llmc_die("cannot create directory '%s': %s", dst, strerror(errno));
            *slash = '/';
        }
        AtomicFile af;
        atomic_open(&af, dst);
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwriteCheck(buf, 1, n, af.f, af.tmp_path);
        if (ferror(in))
            llmc_die("cannot read tokenizer file '%s' (to copy it into the --save-hf directory): %s", src, strerror(errno));
        fclose(in);
        atomic_commit(&af);
        copied++;
    }
    return copied;
}

/* source: the HF directory the model came from (NULL: none): its config.json fields that we do
 * not set are kept (carry_fields); with copy_tokenizer its tokenizer files are copied in too.
 * Returns how many were copied. */
static int save_dir(const char *dir, const HfArchitecture *a, const HfConfig *hc, const float *params, size_t numel,
                    int bf16, const char *source, int copy_tokenizer) {
    const HfConfig *cfg = hc;
    TensorSpec specs[HF_MAX_PARAMS];
    llmcCheck(a->param_specs(hc, specs) == numel, "hf_save: params laid out by the architecture's table");
    check_coverage(a, specs, cfg, numel);
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(params[i]))
            llmc_die("not writing Hugging Face directory '%s': weight %zu is %g (the weights are not finite)", dir, i,
                     (double)params[i]);
    const size_t HS = (size_t)(cfg->base.channels / cfg->base.num_heads);
    int count = 0;
    size_t permuted = 0; /* floats of the rows rewritten into HF's rotate-half order */
    for (int r = 0; r < a->num_tensors; r++) {
        const HfTensor *row = &a->tensors[r];
        if (!row_present(row, param_spec(a, row, specs, cfg))) continue;
        int layers = instances(row, cfg);
        count += layers;
        if (row->rope_heads != DIM_ZERO)
            permuted += (size_t)layers * (size_t)dim_value(row->rows, cfg) * (size_t)dim_value(row->cols, cfg);
    }
    StWriteTensor *w = (StWriteTensor *)callocCheck((size_t)count, sizeof *w, "HF tensor list");
    char (*names)[512] = (char (*)[512])callocCheck((size_t)count, 512, "HF tensor names");
    float *perm = (float *)mallocCheck((permuted ? permuted : 1) * sizeof(float), "HF rotate-half rows");
    float *next = perm;
    int k = 0;
    for (int r = 0; r < a->num_tensors; r++) {
        const HfTensor *row = &a->tensors[r];
        const TensorSpec *s = param_spec(a, row, specs, cfg);
        if (!row_present(row, s)) continue;
        const int layers = instances(row, cfg);
        for (int l = 0; l < layers; l++, k++) {
            key_name(row, a->prefix, l, cfg, names[k], sizeof names[k]);
            w[k].name = names[k];
            w[k].ndim = row->cols == DIM_ONE ? 1 : 2;
            w[k].shape[0] = dim_value(row->rows, cfg); /* DIM_V: the first V of our Vp rows */
            w[k].shape[1] = dim_value(row->cols, cfg);
            w[k].data = params + s->offset + l * (s->numel / layers) + row_offset(row, cfg);
            w[k].transpose = row->conv1d;
            if (row->rope_heads != DIM_ZERO) { /* HF row r holds our row rope_row(r) */
                const size_t rows = (size_t)w[k].shape[0], cols = (size_t)w[k].shape[1];
                for (size_t i = 0; i < rows; i++)
                    memcpy(next + i * cols, w[k].data + rope_row(i, HS) * cols, cols * sizeof(float));
                w[k].data = next;
                next += rows * cols;
            }
        }
    }
    AtomicDir ad;
    atomic_dir_open(&ad, dir);
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", ad.tmp_path);
    write_config(path, a, hc, bf16, source);
    write_weights(ad.tmp_path, w, count, bf16);
    const int copied = source && copy_tokenizer ? copy_tokenizer_files(source, ad.tmp_path) : 0;
    free(perm);
    free(names);
    free(w);
    atomic_dir_commit(&ad);
    return copied;
}

/* source (a run's -e) when it is a Hugging Face directory, whose tokenizer files and fields a save carries; else NULL */
static const char *hf_source(const char *source) { return source && source[0] && hf_is_model_dir(source) ? source : NULL; }

void hf_save(const char *dir, const ModelConfig *cfg, const float *params, size_t numel, int bf16) {
    HfConfig hc;
    memset(&hc, 0, sizeof hc);
    hc.base = *cfg;
    hc.llama.tied = 1;
    save_dir(dir, &architectures[0], &hc, params, numel, bf16, NULL, 0);
}

void hf_save_checkpoint(const char *run_dir, int step, const ModelConfig *cfg, const float *params, size_t numel,
                        int bf16, const char *source) {
    char dir[4400];
    rundir_hf_dir(run_dir, step, dir, sizeof dir);
    HfConfig hc;
    memset(&hc, 0, sizeof hc);
    hc.base = *cfg;
    hc.llama.tied = 1;
    save_dir(dir, &architectures[0], &hc, params, numel, bf16, hf_source(source), 0);
}

void hf_llama_save(const char *dir, const LlamaConfig *cfg, const float *params, size_t numel, int bf16) {
    HfConfig hc = llama_hf(cfg);
    save_dir(dir, &architectures[1], &hc, params, numel, bf16, NULL, 0);
}

void hf_llama_save_from(const char *dir, const LlamaConfig *cfg, const float *params, size_t numel, int bf16,
                        const char *source) {
    HfConfig hc = llama_hf(cfg);
    save_dir(dir, &architectures[1], &hc, params, numel, bf16, source, 1);
}

void hf_llama_save_checkpoint(const char *run_dir, int step, const LlamaConfig *cfg, const float *params, size_t numel,
                              int bf16, const char *source) {
    char dir[4400];
    rundir_hf_dir(run_dir, step, dir, sizeof dir);
    const char *from = hf_source(source);
    static int told; /* the note, once per run */
    HfConfig hc = llama_hf(cfg);
    if (save_dir(dir, &architectures[1], &hc, params, numel, bf16, from, 1) == 0 && !told++)
        printf("note: --save-hf: %s holds no tokenizer files (%s); to load it in transformers without a separate "
               "tokenizer, copy the model's tokenizer.json, tokenizer_config.json and special_tokens_map.json (and "
               "generation_config.json) from its Hugging Face release into each model_NNNNNNNN_hf directory\n",
               dir, from ? "the -e directory has none" : "the run did not start from a Hugging Face directory (-e)");
}

void hf_mixtral_save(const char *dir, const MixtralConfig *cfg, const float *params, size_t numel, int bf16) {
    save_dir(dir, &architectures[2], cfg, params, numel, bf16, NULL, 0);
}

void hf_mixtral_save_checkpoint(const char *run_dir, int step, const MixtralConfig *cfg, const float *params,
                                size_t numel, int bf16, const char *source) {
    char dir[4400];
    rundir_hf_dir(run_dir, step, dir, sizeof dir);
    save_dir(dir, &architectures[2], cfg, params, numel, bf16, hf_source(source), 1);
}

void hf_check_save_source(const char *source) {
    if (!source || !source[0] || !hf_is_model_dir(source)) return;
    HfConfig hc;
    const HfArchitecture *a = read_config(source, &hc);
    if (!is_llama(a) && !is_mixtral(a)) return; /* only the Llama's and Mixtral's --save-hf copy tokenizer files */
    for (const char *const *name = hf_tokenizer_files; *name; name++) {
        char path[4400], err[4600];
        const char *slash = strchr(*name, '/');
        struct stat sb;
        if (slash) { /* original/tokenizer.model: "original" must be a directory when it is there */
            snprintf(path, sizeof path, "%s/%.*s", source, (int)(slash - *name), *name);
            if (lstat(path, &sb) == 0 && (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
                int e = errno;
                llmc_die("--save-hf 1 copies the tokenizer files of -e %s into each model_NNNNNNNN_hf directory, but "
                         "'%s' (which would hold %s) is %s, not a directory", source, path, *name,
                         stat(path, &sb) != 0 ? (e == ELOOP ? "a symbolic link loop" : "a symbolic link to nothing")
                                              : file_kind_name(sb.st_mode));
            }
        }
        snprintf(path, sizeof path, "%s/%s", source, *name);
        if (regular_file_status(path, err, sizeof err) < 0)
            llmc_die("--save-hf 1 copies the tokenizer files of -e %s into each model_NNNNNNNN_hf directory, but %s "
                     "(put the file itself there, or remove it)", source, err);
    }
}

#else /* no cJSON: the directory is recognised, but cannot be read or written */
void hf_check_save_source(const char *source) { (void)source; }
#define NO_CJSON "this build has no Hugging Face support (cJSON was not found when it was built: apt-get install " \
                 "libcjson-dev, then make)"
void hf_read_config(const char *dir, ModelConfig *cfg) {
    (void)cfg;
    llmc_die("'%s' is a Hugging Face model directory, but %s", dir, NO_CJSON);
}
int hf_load(const char *dir, float *params, size_t numel) {
    (void)params, (void)numel;
    llmc_die("'%s' is a Hugging Face model directory, but %s", dir, NO_CJSON);
}
void hf_save(const char *dir, const ModelConfig *cfg, const float *params, size_t numel, int bf16) {
    (void)cfg, (void)params, (void)numel, (void)bf16;
    llmc_die("cannot write Hugging Face directory '%s': %s", dir, NO_CJSON);
}
void hf_save_checkpoint(const char *run_dir, int step, const ModelConfig *cfg, const float *params, size_t numel,
                        int bf16, const char *source) {
    (void)step, (void)cfg, (void)params, (void)numel, (void)bf16, (void)source;
    llmc_die("cannot write a Hugging Face directory in '%s': %s", run_dir, NO_CJSON);
}
int hf_read_llama_config(const char *dir, LlamaConfig *cfg) {
    (void)dir, (void)cfg;
    return 0; /* the GPT-2 reader then says that this build cannot read it */
}
int hf_llama_load(const char *dir, const LlamaConfig *cfg, float *params, size_t numel) {
    (void)cfg, (void)params, (void)numel;
    llmc_die("'%s' is a Hugging Face model directory, but %s", dir, NO_CJSON);
}
int hf_read_mixtral_config(const char *dir, MixtralConfig *cfg) {
    (void)dir, (void)cfg;
    return 0;
}
int hf_mixtral_load(const char *dir, const MixtralConfig *cfg, float *params, size_t numel) {
    (void)cfg, (void)params, (void)numel;
    llmc_die("'%s' is a Hugging Face model directory, but %s", dir, NO_CJSON);
}
void hf_mixtral_save(const char *dir, const MixtralConfig *cfg, const float *params, size_t numel, int bf16) {
    (void)cfg, (void)params, (void)numel, (void)bf16;
    llmc_die("cannot write Hugging Face directory '%s': %s", dir, NO_CJSON);
}
void hf_mixtral_save_checkpoint(const char *run_dir, int step, const MixtralConfig *cfg, const float *params,
                                size_t numel, int bf16, const char *source) {
    (void)step, (void)cfg, (void)params, (void)numel, (void)bf16, (void)source;
    llmc_die("cannot write a Hugging Face directory in '%s': %s", run_dir, NO_CJSON);
}
void hf_llama_save(const char *dir, const LlamaConfig *cfg, const float *params, size_t numel, int bf16) {
    (void)cfg, (void)params, (void)numel, (void)bf16;
    llmc_die("cannot write Hugging Face directory '%s': %s", dir, NO_CJSON);
}
void hf_llama_save_from(const char *dir, const LlamaConfig *cfg, const float *params, size_t numel, int bf16,
                        const char *source) {
    (void)source;
    hf_llama_save(dir, cfg, params, numel, bf16);
}
void hf_llama_save_checkpoint(const char *run_dir, int step, const LlamaConfig *cfg, const float *params, size_t numel,
                              int bf16, const char *source) {
    (void)step, (void)cfg, (void)params, (void)numel, (void)bf16, (void)source;
    llmc_die("cannot write a Hugging Face directory in '%s': %s", run_dir, NO_CJSON);
}
#endif
