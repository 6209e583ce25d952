/*
 * lora.c - the LoRA module tables, PEFT's target matching, the adapter's parameter table and its
 * initialisation (lora.h).
 */
#include "llmc/models/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/core/rng.h"

/* A family's modules, in block order; in/out/offset from the shape (lora_config_build). */
typedef struct {
    const char *name, *path;
    int site;
    int rope_rows;
} ModuleRow;

static const ModuleRow gpt2_modules[] = {
    {"c_attn", "attn.c_attn", LORA_SITE_QKV, 0},
    {"c_proj", "attn.c_proj", LORA_SITE_ATTPROJ, 0},
    {"c_fc", "mlp.c_fc", LORA_SITE_FC, 0},
    {"c_proj", "mlp.c_proj", LORA_SITE_FCPROJ, 0},
};
static const ModuleRow llama_modules[] = {
    {"q_proj", "self_attn.q_proj", LORA_SITE_QKV, 1},   {"k_proj", "self_attn.k_proj", LORA_SITE_QKV, 1},
    {"v_proj", "self_attn.v_proj", LORA_SITE_QKV, 0},   {"o_proj", "self_attn.o_proj", LORA_SITE_ATTPROJ, 0},
    {"gate_proj", "mlp.gate_proj", LORA_SITE_FC, 0},    {"up_proj", "mlp.up_proj", LORA_SITE_FC, 0},
    {"down_proj", "mlp.down_proj", LORA_SITE_FCPROJ, 0},
};

static const ModuleRow *family_modules(int family, int *n) {
    if (family == LORA_FAMILY_GPT2) return *n = 4, gpt2_modules;
    if (family == LORA_FAMILY_LLAMA) return *n = 7, llama_modules;
    return *n = 0, NULL;
}

const char *lora_default_targets(int family) {
    return family == LORA_FAMILY_GPT2 ? "c_attn" : family == LORA_FAMILY_LLAMA ? "q_proj,v_proj" : "";
}

void lora_module_names(int family, char *out, size_t len) {
    int n;
    const ModuleRow *rows = family_modules(family, &n);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used < len; i++) {
        int k = snprintf(out + used, len - used, "%s%s", i ? ", " : "", rows[i].path);
        if (k > 0) used += (size_t)k;
    }
}

/* PEFT: the module key equals the target or ends with "." + target (the key here is the path in a
 * block; PEFT's full key "transformer.h.0.attn.c_attn" ends the same way). */
static int target_matches(const char *target, const char *path) {
    size_t t = strlen(target), p = strlen(path);
    if (t == p) return strcmp(target, path) == 0;
    return t < p && path[p - t - 1] == '.' && strcmp(path + p - t, target) == 0;
}

/* in, out and the output offset of module row r for cfg */
static void module_shape(int family, const ModuleRow *r, const ModelConfig *cfg, LoraModule *m) {
    const int C = cfg->channels, F = cfg->ffn_hidden, HS = C / cfg->num_heads;
    const int Q = cfg->num_heads * HS, KV = cfg->num_kv_heads * HS;
    m->in = C, m->out = C, m->out_offset = 0;
    switch (r->site) {
    case LORA_SITE_QKV:
        if (family == LORA_FAMILY_GPT2) m->out = Q + 2 * KV;
        else if (strcmp(r->name, "q_proj") == 0) m->out = Q;
        else m->out = KV, m->out_offset = strcmp(r->name, "k_proj") == 0 ? Q : Q + KV;
        break;
    case LORA_SITE_FC:
        m->out = F;
        if (strcmp(r->name, "up_proj") == 0) m->out_offset = F;
        break;
    case LORA_SITE_FCPROJ: m->in = F; break;
    default: break;
    }
}

int lora_config_build(LoraConfig *lc, int family, const ModelConfig *cfg, int rank, float alpha, int rslora, int dora,
                      const char *targets, char *err, size_t errlen) {
    memset(lc, 0, sizeof *lc);
    int n;
    const ModuleRow *rows = family_modules(family, &n);
    char names[256];
    lora_module_names(family, names, sizeof names);
    if (!rows) return snprintf(err, errlen, "--lora-rank: this model has no LoRA target modules"), -1;
    if (!(alpha > 0.0f)) return snprintf(err, errlen, "--lora-alpha must be positive, got %g", (double)alpha), -1;
    if (rank < 1 || rank > LORA_MAX_RANK)
        return snprintf(err, errlen, "--lora-rank must be between 1 and %d, got %d", LORA_MAX_RANK, rank), -1;
    const char *list = targets && targets[0] ? targets : lora_default_targets(family);
    int chosen[LORA_MAX_MODULES] = {0};
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        size_t k = strlen(t);
        while (k && t[k - 1] == ' ') t[--k] = '\0';
        if (!k) return snprintf(err, errlen, "--lora-targets '%s': an empty name in the list", list), -1;
        int matched = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(t, "all-linear") == 0 || target_matches(t, rows[i].path)) chosen[i] = 1, matched = 1;
        if (!matched)
            return snprintf(err, errlen, "--lora-targets: '%s' matches no module of this model (its modules: %s; "
                                         "or all-linear)", t, names), -1;
    }
    lc->family = family, lc->rank = rank, lc->alpha = alpha, lc->rslora = rslora, lc->dora = dora;
    lc->scale = rslora ? alpha / sqrtf((float)rank) : alpha / (float)rank;
    lc->num_layers = cfg->num_layers, lc->head_size = cfg->channels / cfg->num_heads;
    for (int i = 0; i < n; i++) {
        if (!chosen[i]) continue;
        LoraModule *m = &lc->modules[lc->num_modules++];
        m->name = rows[i].name, m->path = rows[i].path, m->site = rows[i].site, m->rope_rows = rows[i].rope_rows;
        module_shape(family, &rows[i], cfg, m);
        int most = m->in < m->out ? m->in : m->out;
        if (rank > most)
            return snprintf(err, errlen, "--lora-rank %d exceeds min(in, out) = min(%d, %d) of module %s", rank, m->in,
                            m->out, m->path), -1;
    }
    const size_t L = (size_t)cfg->num_layers, R = (size_t)rank;
    size_t off = 0;
    for (int i = 0; i < lc->num_modules; i++) {
        const LoraModule *m = &lc->modules[i];
        for (int w = 0; w < 2; w++) {
            TensorSpec *s = &lc->specs[2 * i + w];
            memset(s, 0, sizeof *s);
            s->name = w ? "lora_B" : "lora_A";
            s->shape = w ? "(L, out, R)" : "(L, R, in)";
            s->layer_numel = R * (size_t)(w ? m->out : m->in);
            s->numel = L * s->layer_numel;
            s->offset = off;
            s->decay = 1; /* HF Trainer: every tensor but biases and norms decays; LoRA has neither */
            s->init = w ? INIT_ZEROS : INIT_NORMAL;
            off += s->numel;
        }
    }
    lc->num_specs = 2 * lc->num_modules;
    for (int i = 0; dora && i < lc->num_modules; i++) { /* after every A and B: LoRA's layout unchanged */
        TensorSpec *s = &lc->specs[lc->num_specs++];
        memset(s, 0, sizeof *s);
        s->name = "lora_magnitude_vector";
        s->shape = "(L, out)";
        s->layer_numel = (size_t)lc->modules[i].out;
        s->numel = L * s->layer_numel;
        s->offset = off;
        s->decay = 1; /* HF Trainer's rule: the magnitude is no bias or norm weight, it decays */
        s->init = INIT_ONES; /* (lora_dora_init sets it from the base) */
        off += s->numel;
    }
    lc->num_parameters = off;
    return 0;
}

int lora_prompt_config_build(LoraConfig *lc, int family, const ModelConfig *cfg, int P, int T, char *err, size_t errlen) {
    memset(lc, 0, sizeof *lc);
    if (P < 1) return snprintf(err, errlen, "--prompt-tokens %d: give at least one soft token (P >= 1)", P), -1;
    if ((long long)P + T > cfg->max_seq_len)
        return snprintf(err, errlen, "--prompt-tokens %d + -t %d = %lld positions exceed the model's maximum %d (maxT): "
                                     "the model sees the P soft tokens and the T tokens of each sequence; lower one of them",
                        P, T, (long long)P + T, cfg->max_seq_len), -1;
    lc->family = family, lc->prompt_tokens = P, lc->token_dim = cfg->channels;
    lc->num_layers = cfg->num_layers, lc->head_size = cfg->channels / cfg->num_heads;
    TensorSpec *s = &lc->specs[0];
    s->name = "prompt_embeddings";
    s->shape = "(P, C)";
    s->numel = (size_t)P * (size_t)cfg->channels;
    s->decay = 1; /* HF Trainer's rule: no bias or norm weight, it decays */
    s->init = INIT_NORMAL;
    lc->num_specs = 1;
    lc->num_parameters = s->numel;
    return 0;
}

void lora_target_names(const LoraConfig *lc, char *out, size_t len) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < lc->num_modules && used < len; i++) {
        int dup = 0; /* GPT-2's two c_proj: PEFT lists the target, we list each path once */
        for (int j = 0; j < i; j++) dup |= strcmp(lc->modules[j].path, lc->modules[i].path) == 0;
        if (dup) continue;
        int k = snprintf(out + used, len - used, "%s%s", used ? "," : "", lc->modules[i].path);
        if (k > 0) used += (size_t)k;
    }
}

void lora_peft_key(const LoraConfig *lc, int m, int l, int which, char *out, size_t len) {
    const char *prefix = lc->family == LORA_FAMILY_GPT2 ? "base_model.model.transformer.h" : "base_model.model.model.layers";
    if (which == 2) snprintf(out, len, "%s.%d.%s.lora_magnitude_vector", prefix, l, lc->modules[m].path);
    else snprintf(out, len, "%s.%d.%s.lora_%c.weight", prefix, l, lc->modules[m].path, which ? 'B' : 'A');
}

const TensorSpec *lora_magnitude_spec(const LoraConfig *lc, int m) { return &lc->specs[2 * lc->num_modules + m]; }

static const TensorSpec *spec_named(const TensorSpec *specs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0) return &specs[i];
    return NULL;
}

const TensorSpec *lora_site_weight(const TensorSpec *specs, int n, int site) {
    static const char *const names[LORA_NUM_SITES] = {"qkvw", "attprojw", "fcw", "fcprojw"};
    return spec_named(specs, n, names[site]);
}

const TensorSpec *lora_site_bias(const TensorSpec *specs, int n, int site) {
    static const char *const names[LORA_NUM_SITES] = {"qkvb", "attprojb", "fcb", "fcprojb"};
    return spec_named(specs, n, names[site]);
}

void lora_dora_norms(const LoraConfig *lc, int m, const float *A, const float *B, const float *W, float *norms) {
    const LoraModule *mod = &lc->modules[m];
    const int R = lc->rank, in = mod->in;
    const double s = lc->scale;
#pragma omp parallel for
    for (int r = 0; r < mod->out; r++) {
        const float *w = W + (size_t)r * in, *b = B + (size_t)r * R;
        double sum = 0.0;
        for (int c = 0; c < in; c++) {
            double d = 0.0;
            for (int k = 0; k < R; k++) d += (double)b[k] * A[(size_t)k * in + c];
            const double x = (double)w[c] + s * d;
            sum += x * x;
        }
        norms[r] = (float)sqrt(sum);
    }
}

void lora_dora_init(const LoraConfig *lc, float *adapter, const TensorSpec *specs, int n, const float *base) {
    for (int m = 0; lc->dora && m < lc->num_modules; m++) {
        const LoraModule *mod = &lc->modules[m];
        const TensorSpec *w = lora_site_weight(specs, n, mod->site);
        for (int l = 0; w && l < lc->num_layers; l++)
            lora_dora_norms(lc, m, tensor_layer(adapter, &lc->specs[2 * m], l), tensor_layer(adapter, &lc->specs[2 * m + 1], l),
                            tensor_layer((float *)base, w, l) + (size_t)mod->out_offset * mod->in,
                            tensor_layer(adapter, lora_magnitude_spec(lc, m), l));
    }
}

size_t lora_peft_row(const LoraConfig *lc, int m, size_t hf_row) {
    if (!lc->modules[m].rope_rows) return hf_row;
    /* HF rotate-half row p * HS/2 + i of a head is our interleaved row 2i + p (llmc/formats/hf.c) */
    size_t HS = (size_t)lc->head_size, h = hf_row / HS, r = hf_row % HS, p = r / (HS / 2), i = r % (HS / 2);
    return h * HS + 2 * i + p;
}

size_t lora_merge(const LoraConfig *lc, const float *adapter, const TensorSpec *specs, int n, float *params) {
    size_t changed = 0;
    const int R = lc->rank;
    for (int m = 0; m < lc->num_modules; m++) {
        const LoraModule *mod = &lc->modules[m];
        const TensorSpec *w = lora_site_weight(specs, n, mod->site);
        if (!w) continue; /* (lora_config_build's families all have the four) */
        double *row = lc->dora ? (double *)malloc((size_t)mod->in * sizeof(double)) : NULL;
        if (lc->dora && !row) llmc_die("out of memory merging the DoRA adapter");
        for (int l = 0; l < lc->num_layers; l++) {
            const float *A = tensor_layer((float *)adapter, &lc->specs[2 * m], l);
            const float *Bm = tensor_layer((float *)adapter, &lc->specs[2 * m + 1], l);
            const float *mag = lc->dora ? tensor_layer((float *)adapter, lora_magnitude_spec(lc, m), l) : NULL;
            float *W = tensor_layer(params, w, l) + (size_t)mod->out_offset * mod->in;
            for (int r = 0; r < mod->out; r++) {
                double sum = 0.0;
                for (int c = 0; c < mod->in; c++) {
                    double d = 0.0;
                    for (int k = 0; k < R; k++) d += (double)Bm[(size_t)r * R + k] * A[(size_t)k * mod->in + c];
                    float *x = &W[(size_t)r * mod->in + c];
                    const double v = (double)*x + (double)lc->scale * d;
                    if (row) row[c] = v, sum += v * v;
                    else *x = (float)v;
                    changed++;
                }
                if (!row) continue;
                /* DoRA: g (W + s B A), g = m / ||W + s B A|| (lora_dora_gain: 0 where the norm is 0) */
                const double norm = sqrt(sum), g = norm > 0.0 ? (double)mag[r] / norm : 0.0;
                for (int c = 0; c < mod->in; c++) W[(size_t)r * mod->in + c] = (float)(g * row[c]);
            }
        }
        free(row);
    }
    return changed;
}

void lora_init_parameters(const LoraConfig *lc, float *params, unsigned long long seed) {
    if (lc->prompt_tokens) { /* PEFT's RANDOM init: the nn.Embedding's N(0, 1) */
        Rng rng;
        rng_seed(&rng, splitmix64(seed ^ 0x9e0ULL));
        rng_normal(&rng, params, lc->specs[0].numel, 0.0f, 1.0f);
        return;
    }
    for (int i = 0; i < lc->num_modules; i++) {
        const TensorSpec *a = &lc->specs[2 * i], *b = &lc->specs[2 * i + 1];
        Rng rng;
        rng_seed(&rng, splitmix64(seed ^ (0x10a0ULL + (unsigned long long)i)));
        const float bound = 1.0f / sqrtf((float)lc->modules[i].in); /* kaiming_uniform_(a=sqrt(5)) */
        for (size_t k = 0; k < a->numel; k++) params[a->offset + k] = (2.0f * rng_f32(&rng) - 1.0f) * bound;
        memset(params + b->offset, 0, b->numel * sizeof(float));
    }
}
