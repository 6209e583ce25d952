/*
 * adapter.c - PEFT LoRA adapter directories (adapter.h).
 */
#include "llmc/formats/adapter.h"

#include <stdio.h>
#include <string.h>

#include "llmc/core/check.h"

void adapter_model_path(const char *dir, char *out, size_t len) { snprintf(out, len, "%s/adapter_model.safetensors", dir); }

#if LLMC_HAVE_CJSON
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "llmc/core/atomicfile.h"
#include "llmc/formats/safetensors.h"

/* the whole file as text (NUL-terminated, malloc'd); dies naming it */
static char *read_file_text(const char *path, const char *what, size_t limit) {
    FILE *f = fopen(path, "rb");
    if (!f) llmc_die("cannot open %s '%s': %s", what, path, strerror(errno));
    char *buf = (char *)mallocCheck(limit + 1, what);
    size_t n = fread(buf, 1, limit + 1, f);
    fclose(f);
    if (n > limit) llmc_die("%s '%s' is larger than %zu bytes", what, path, limit);
    buf[n] = '\0';
    return buf;
}

/* j[key]: absent or null -> def; a number -> it; anything else dies naming the file */
static double number_field(const cJSON *j, const char *key, double def, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsNumber(v)) llmc_die("PEFT adapter config '%s': %s is not a number", path, key);
    return v->valuedouble;
}

static int bool_field(const cJSON *j, const char *key, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) llmc_die("PEFT adapter config '%s': %s is not true or false", path, key);
    return cJSON_IsTrue(v);
}

/* a count field j[key] in 1..most; dies naming the file */
static int count_field(const cJSON *j, const char *key, int most, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > most)
        llmc_die("PEFT adapter config '%s': %s is not a count between 1 and %d", path, key, most);
    return (int)v->valuedouble;
}

/* PROMPT_TUNING's fields: soft tokens at the input of a causal LM, one transformer submodule */
static void read_prompt_config(const cJSON *j, const char *path, AdapterFileConfig *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "task_type");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "CAUSAL_LM") != 0)
        llmc_die("PEFT adapter config '%s': prompt tuning with task_type %s; only \"CAUSAL_LM\" is supported", path,
                 cJSON_IsString(v) ? v->valuestring : "missing");
    out->prompt_tokens = count_field(j, "num_virtual_tokens", MODEL_MAX_SEQ_LEN, path);
    out->token_dim = count_field(j, "token_dim", MODEL_MAX_CHANNELS, path);
    if (number_field(j, "num_transformer_submodules", 1.0, path) != 1.0)
        llmc_die("PEFT adapter config '%s': num_transformer_submodules is not 1 (a causal LM has one)", path);
}

void adapter_read_config(const char *dir, AdapterFileConfig *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        llmc_die("--adapter %s: not a directory (a PEFT adapter directory holds adapter_config.json and "
                 "adapter_model.safetensors)", dir);
    char *text = read_file_text(path, "PEFT adapter config", 1 << 20);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j || !cJSON_IsObject(j)) llmc_die("PEFT adapter config '%s' is not a JSON object", path);
    memset(out, 0, sizeof *out);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "PROMPT_TUNING") == 0) {
        read_prompt_config(j, path, out);
        cJSON_Delete(j);
        return;
    }
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA") != 0)
        llmc_die("PEFT adapter config '%s': peft_type is %s, expected \"LORA\" or \"PROMPT_TUNING\" (the adapters "
                 "supported)", path, cJSON_IsString(v) ? v->valuestring : "missing");
    v = cJSON_GetObjectItemCaseSensitive(j, "r");
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > LORA_MAX_RANK)
        llmc_die("PEFT adapter config '%s': r is not a rank between 1 and %d", path, LORA_MAX_RANK);
    out->rank = (int)v->valuedouble;
    double alpha = number_field(j, "lora_alpha", 8.0, path); /* PEFT's default */
    if (!(alpha > 0.0 && alpha <= 1e6)) llmc_die("PEFT adapter config '%s': lora_alpha must be in (0, 1e6]", path);
    out->alpha = (float)alpha;
    double dropout = number_field(j, "lora_dropout", 0.0, path);
    if (!(dropout >= 0.0 && dropout < 1.0)) llmc_die("PEFT adapter config '%s': lora_dropout must be in [0, 1)", path);
    out->dropout = (float)dropout;
    out->rslora = bool_field(j, "use_rslora", path);
    out->dora = bool_field(j, "use_dora", path);
    v = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "none") != 0)
        llmc_die("PEFT adapter config '%s': bias is \"%s\"; only \"none\" is supported (no trained biases)", path, v->valuestring);
    static const char *const patterns[] = {"rank_pattern", "alpha_pattern", NULL};
    for (int i = 0; patterns[i]; i++) {
        v = cJSON_GetObjectItemCaseSensitive(j, patterns[i]);
        if (v && !cJSON_IsNull(v) && cJSON_GetArraySize(v) > 0)
            llmc_die("PEFT adapter config '%s': %s is not empty; per-module ranks and alphas are not supported", path, patterns[i]);
    }
    v = cJSON_GetObjectItemCaseSensitive(j, "layers_to_transform");
    if (v && !cJSON_IsNull(v)) llmc_die("PEFT adapter config '%s': layers_to_transform is set; only adapters on every layer are supported", path);
    v = cJSON_GetObjectItemCaseSensitive(j, "modules_to_save");
    if (v && !cJSON_IsNull(v) && cJSON_GetArraySize(v) > 0)
        llmc_die("PEFT adapter config '%s': modules_to_save is set; fully trained extra modules are not supported", path);
    v = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    if (cJSON_IsString(v)) {
        if (strcmp(v->valuestring, "all-linear") != 0)
            llmc_die("PEFT adapter config '%s': target_modules is the regular expression '%s'; give a list of module names",
                     path, v->valuestring);
        snprintf(out->targets, sizeof out->targets, "all-linear");
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
        size_t used = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e)) llmc_die("PEFT adapter config '%s': target_modules holds a non-string", path);
            int k = snprintf(out->targets + used, sizeof out->targets - used, "%s%s", used ? "," : "", e->valuestring);
            if (k < 0 || (size_t)k >= sizeof out->targets - used) llmc_die("PEFT adapter config '%s': target_modules is too long", path);
            used += (size_t)k;
        }
    } else {
        llmc_die("PEFT adapter config '%s': target_modules is missing (a list of module names)", path);
    }
    cJSON_Delete(j);
}

/* "__metadata__".key of a safetensors file as a string into out (len bytes), if the file has it */
static int read_meta(const char *path, const char *key, char *out, size_t len) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char le[8];
    int found = 0;
    if (fread(le, 1, 8, f) == 8) {
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)le[i] << (8 * i);
        if (n < ST_MAX_HEADER) {
            char *json = (char *)mallocCheck((size_t)n + 1, "safetensors header");
            if (fread(json, 1, (size_t)n, f) == (size_t)n) {
                json[n] = '\0';
                cJSON *j = cJSON_Parse(json);
                const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "__metadata__");
                const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, key);
                if (c && !cJSON_IsString(c)) llmc_die("adapter '%s': its __metadata__ %s is not a string", path, key);
                if (c) snprintf(out, len, "%s", c->valuestring), found = 1;
                cJSON_Delete(j);
            }
            free(json);
        }
    }
    fclose(f);
    return found;
}

/* "__metadata__".llmc_base_crc32 of a safetensors file, if any */
static int read_base_crc(const char *path, uint32_t *crc) {
    char text[64];
    if (!read_meta(path, "llmc_base_crc32", text, sizeof text)) return 0;
    unsigned v = 0;
    char end;
    if (strlen(text) != 8 || sscanf(text, "%8x%c", &v, &end) != 1)
        llmc_die("adapter '%s': its __metadata__ llmc_base_crc32 is not 8 hex digits", path);
    *crc = v;
    return 1;
}

void adapter_read_quantize_base(const char *dir, char *out, size_t len) {
    char path[4200];
    adapter_model_path(dir, path, sizeof path);
    if (!read_meta(path, "llmc_quantize_base", out, len)) snprintf(out, len, "%s", "");
}

void adapter_load(const char *dir, const LoraConfig *lc, float *params, int *has_crc, uint32_t *base_crc) {
    char path[4200], key[512];
    adapter_model_path(dir, path, sizeof path);
    Safetensors *st = safetensors_open_file(path);
    int used = 0;
    if (lc->prompt_tokens) { /* prompt_embeddings [P, C], and nothing else */
        const StTensor *t = safetensors_find(st, "prompt_embeddings");
        if (!t) llmc_die("adapter '%s' has no tensor prompt_embeddings (its adapter_config.json is PROMPT_TUNING)", path);
        if (t->ndim != 2 || t->shape[0] != lc->prompt_tokens || t->shape[1] != lc->token_dim)
            llmc_die("adapter '%s': prompt_embeddings has shape [%lld, %lld], this base model needs [%d, %d] (num_virtual_tokens, "
                     "its channels): the adapter belongs to another base model", path,
                     (long long)(t->ndim > 0 ? t->shape[0] : 0), (long long)(t->ndim > 1 ? t->shape[1] : 0),
                     lc->prompt_tokens, lc->token_dim);
        safetensors_read_f32(st, t, params);
        if (st->num_tensors != 1)
            llmc_die("adapter '%s' holds %d tensors; a prompt-tuning adapter holds prompt_embeddings only", path, st->num_tensors);
        used = 1;
    }
    for (int m = 0; m < lc->num_modules; m++) {
        const LoraModule *mod = &lc->modules[m];
        for (int w = 0; w < 2; w++) {
            const TensorSpec *s = &lc->specs[2 * m + w];
            const int64_t rows = w ? mod->out : lc->rank, cols = w ? lc->rank : mod->in;
            float *tmp = (float *)mallocCheck(s->layer_numel * sizeof(float), "adapter tensor");
            for (int l = 0; l < lc->num_layers; l++) {
                lora_peft_key(lc, m, l, w, key, sizeof key);
                const StTensor *t = safetensors_find(st, key);
                if (!t) llmc_die("adapter '%s' has no tensor %s (its adapter_config.json targets %s)", path, key, mod->path);
                if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
                    llmc_die("adapter '%s': tensor %s has shape [%lld, %lld], this base model needs [%lld, %lld]: the adapter "
                             "belongs to another base model", path, key, (long long)(t->ndim > 0 ? t->shape[0] : 0),
                             (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)rows, (long long)cols);
                safetensors_read_f32(st, t, tmp);
                float *dst = tensor_layer(params, s, l);
                if (w) /* B: PEFT's rows -> ours */
                    for (int64_t r = 0; r < rows; r++)
                        memcpy(dst + lora_peft_row(lc, m, (size_t)r) * (size_t)cols, tmp + (size_t)r * cols, (size_t)cols * sizeof(float));
                else memcpy(dst, tmp, s->layer_numel * sizeof(float));
                used++;
            }
            free(tmp);
        }
    }
    for (int m = 0; lc->dora && m < lc->num_modules; m++) { /* DoRA's magnitudes [out], rows in PEFT's order */
        const LoraModule *mod = &lc->modules[m];
        float *tmp = (float *)mallocCheck((size_t)mod->out * sizeof(float), "adapter tensor");
        for (int l = 0; l < lc->num_layers; l++) {
            lora_peft_key(lc, m, l, 2, key, sizeof key);
            const StTensor *t = safetensors_find(st, key);
            if (!t)
                llmc_die("adapter '%s' has no tensor %s: its adapter_config.json has use_dora true, and DoRA needs each "
                         "module's magnitude vector", path, key);
            if (t->ndim != 1 || t->shape[0] != mod->out)
                llmc_die("adapter '%s': DoRA magnitude %s has %d dimension%s [%lld%s], this base model needs [%d] (one per "
                         "output row of %s)", path, key, t->ndim, t->ndim == 1 ? "" : "s",
                         (long long)(t->ndim > 0 ? t->shape[0] : 0), t->ndim > 1 ? ", ..." : "", mod->out, mod->path);
            safetensors_read_f32(st, t, tmp);
            float *dst = tensor_layer(params, lora_magnitude_spec(lc, m), l);
            for (int r = 0; r < mod->out; r++) dst[lora_peft_row(lc, m, (size_t)r)] = tmp[r];
            used++;
        }
        free(tmp);
    }
    if (st->num_tensors != used) {
        /* more tensors than the targets need: name one */
        for (int i = 0; i < st->num_tensors; i++) {
            int ours = 0;
            for (int m = 0; m < lc->num_modules && !ours; m++)
                for (int l = 0; l < lc->num_layers && !ours; l++)
                    for (int w = 0; w < (lc->dora ? 3 : 2) && !ours; w++) {
                        lora_peft_key(lc, m, l, w, key, sizeof key);
                        ours = strcmp(key, st->tensors[i].name) == 0;
                    }
            if (!ours && !lc->dora && strstr(st->tensors[i].name, "lora_magnitude_vector"))
                llmc_die("adapter '%s' holds the DoRA magnitude %s, but its adapter_config.json has use_dora false", path,
                         st->tensors[i].name);
            if (!ours)
                llmc_die("adapter '%s' holds tensor %s, which is no module this base model has for its targets: the "
                         "adapter belongs to another base model", path, st->tensors[i].name);
        }
    }
    safetensors_close(st);
    *has_crc = read_base_crc(path, base_crc);
}

/* the directory's adapter_config.json from j (deleted) */
static void write_config(AtomicDir *ad, cJSON *j) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    char path[4400];
    snprintf(path, sizeof path, "%s/adapter_config.json", ad->tmp_path);
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(text, 1, strlen(text), af.f, af.tmp_path);
    atomic_commit(&af);
    free(text);
}

/* the directory's adapter_model.safetensors (F32, the base's CRC in __metadata__); returns its CRC-32 */
static uint32_t write_tensors(AtomicDir *ad, const StWriteTensor *w, int n, uint32_t base_crc, const char *quantize_base) {
    char crc_text[16], path[4400];
    snprintf(crc_text, sizeof crc_text, "%08x", (unsigned)base_crc);
    const char *meta[] = {"llmc_base_crc32", crc_text, quantize_base[0] ? "llmc_quantize_base" : NULL, quantize_base, NULL};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", ad->tmp_path);
    uint64_t bytes;
    return safetensors_write_meta(path, w, n, ST_F32, meta, &bytes);
}

/* PEFT 0.13's PromptTuningConfig fields, and prompt_embeddings [P, C] */
static uint32_t prompt_save(AtomicDir *ad, const LoraConfig *lc, const float *params, uint32_t base_crc, const char *base_name) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNullToObject(j, "auto_mapping");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_name);
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddNumberToObject(j, "num_attention_heads", lc->token_dim / lc->head_size);
    cJSON_AddNumberToObject(j, "num_layers", lc->num_layers);
    cJSON_AddNumberToObject(j, "num_transformer_submodules", 1);
    cJSON_AddNumberToObject(j, "num_virtual_tokens", lc->prompt_tokens);
    cJSON_AddStringToObject(j, "peft_type", "PROMPT_TUNING");
    cJSON_AddStringToObject(j, "prompt_tuning_init", "RANDOM");
    cJSON_AddNullToObject(j, "prompt_tuning_init_text");
    cJSON_AddNullToObject(j, "revision");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddNumberToObject(j, "token_dim", lc->token_dim);
    cJSON_AddNullToObject(j, "tokenizer_kwargs");
    cJSON_AddNullToObject(j, "tokenizer_name_or_path");
    write_config(ad, j);
    StWriteTensor w = {"prompt_embeddings", 2, {lc->prompt_tokens, lc->token_dim}, params, 0};
    uint32_t crc = write_tensors(ad, &w, 1, base_crc, "");
    atomic_dir_commit(ad);
    return crc;
}

uint32_t adapter_save(const char *dir, const LoraConfig *lc, const float *params, uint32_t base_crc, const char *base_name) {
    return adapter_save_quant(dir, lc, params, base_crc, base_name, "");
}

uint32_t adapter_save_quant(const char *dir, const LoraConfig *lc, const float *params, uint32_t base_crc,
                            const char *base_name, const char *quantize_base) {
    AtomicDir ad;
    atomic_dir_open(&ad, dir);
    if (lc->prompt_tokens) return prompt_save(&ad, lc, params, base_crc, base_name);
    /* adapter_config.json: PEFT 0.13's LoraConfig fields that describe this adapter */
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(j, "auto_mapping");
    cJSON_AddStringToObject(j, "base_model_name_or_path", base_name);
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "fan_in_fan_out", lc->family == LORA_FAMILY_GPT2); /* GPT-2's Conv1D */
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddBoolToObject(j, "init_lora_weights", 1);
    cJSON_AddNullToObject(j, "layers_pattern");
    cJSON_AddNullToObject(j, "layers_to_transform");
    cJSON_AddNumberToObject(j, "lora_alpha", lc->alpha);
    cJSON_AddNumberToObject(j, "lora_dropout", 0.0);
    cJSON_AddNullToObject(j, "modules_to_save");
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddNumberToObject(j, "r", lc->rank);
    cJSON_AddItemToObject(j, "rank_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(j, "revision");
    cJSON *targets = cJSON_AddArrayToObject(j, "target_modules");
    char names[512];
    lora_target_names(lc, names, sizeof names);
    for (char *save = NULL, *t = strtok_r(names, ",", &save); t; t = strtok_r(NULL, ",", &save))
        cJSON_AddItemToArray(targets, cJSON_CreateString(t));
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddBoolToObject(j, "use_dora", lc->dora);
    cJSON_AddBoolToObject(j, "use_rslora", lc->rslora);
    write_config(&ad, j);
    /* adapter_model.safetensors: F32, PEFT's keys, B rows in PEFT's order */
    const int n = (lc->dora ? 3 : 2) * lc->num_modules * lc->num_layers;
    StWriteTensor *w = (StWriteTensor *)callocCheck((size_t)n, sizeof *w, "adapter tensors");
    char(*keys)[256] = callocCheck((size_t)n, 256, "adapter keys");
    float *permuted = (float *)mallocCheck(lc->num_parameters * sizeof(float), "adapter (PEFT row order)");
    int k = 0;
    for (int l = 0; l < lc->num_layers; l++)
        for (int m = 0; m < lc->num_modules; m++)
            for (int b = 0; b < 2; b++, k++) {
                const LoraModule *mod = &lc->modules[m];
                const TensorSpec *s = &lc->specs[2 * m + b];
                const float *src = tensor_layer((float *)params, s, l);
                float *dst = tensor_layer(permuted, s, l);
                const size_t rows = (size_t)(b ? mod->out : lc->rank), cols = (size_t)(b ? lc->rank : mod->in);
                for (size_t r = 0; r < rows; r++)
                    memcpy(dst + r * cols, src + (b ? lora_peft_row(lc, m, r) : r) * cols, cols * sizeof(float));
                lora_peft_key(lc, m, l, b, keys[k], sizeof keys[k]);
                w[k] = (StWriteTensor){keys[k], 2, {(int64_t)rows, (int64_t)cols}, dst, 0};
            }
    for (int l = 0; lc->dora && l < lc->num_layers; l++) /* DoRA: the magnitudes [out], after every A and B */
        for (int m = 0; m < lc->num_modules; m++, k++) {
            const LoraModule *mod = &lc->modules[m];
            const TensorSpec *s = lora_magnitude_spec(lc, m);
            const float *src = tensor_layer((float *)params, s, l);
            float *dst = tensor_layer(permuted, s, l);
            for (int r = 0; r < mod->out; r++) dst[r] = src[lora_peft_row(lc, m, (size_t)r)];
            lora_peft_key(lc, m, l, 2, keys[k], sizeof keys[k]);
            w[k] = (StWriteTensor){keys[k], 1, {(int64_t)mod->out}, dst, 0};
        }
    uint32_t crc = write_tensors(&ad, w, n, base_crc, quantize_base);
    free(permuted);
    free(keys);
    free(w);
    atomic_dir_commit(&ad);
    return crc;
}

#else /* no cJSON */
#define NO_CJSON "this build has no JSON support (cJSON was not found when it was built: apt-get install libcjson-dev, then make)"
void adapter_read_config(const char *dir, AdapterFileConfig *out) {
    (void)out;
    llmc_die("--adapter %s: %s", dir, NO_CJSON);
}
void adapter_load(const char *dir, const LoraConfig *lc, float *params, int *has_crc, uint32_t *base_crc) {
    (void)lc, (void)params, (void)has_crc, (void)base_crc;
    llmc_die("--adapter %s: %s", dir, NO_CJSON);
}
uint32_t adapter_save(const char *dir, const LoraConfig *lc, const float *params, uint32_t base_crc, const char *base_name) {
    return adapter_save_quant(dir, lc, params, base_crc, base_name, "");
}
uint32_t adapter_save_quant(const char *dir, const LoraConfig *lc, const float *params, uint32_t base_crc,
                            const char *base_name, const char *quantize_base) {
    (void)lc, (void)params, (void)base_crc, (void)base_name, (void)quantize_base;
    llmc_die("cannot write the LoRA adapter '%s': %s", dir, NO_CJSON);
}
void adapter_read_quantize_base(const char *dir, char *out, size_t len) {
    (void)dir;
    snprintf(out, len, "%s", "");
}
#endif
