/*
 * lora.c (CPU) - the LoRA adapter ops and arenas (lora.h).
 */
#include "llmc/cpu/lora.h"

#include <string.h>

#include "llmc/core/check.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/matmul.h"

void lora_run_init(LoraRun *r, const LoraConfig *cfg, unsigned long long seed) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    r->params = (float *)mem_calloc(MEM_PARAMETERS, cfg->num_parameters, sizeof(float), "LoRA adapter");
    lora_init_parameters(cfg, r->params, seed);
}

static float *gain_of(LoraRun *r, int m, int l);

/* DoRA: the sum and the largest of the modules' out */
static size_t dora_outs(const LoraConfig *cfg, size_t *most) {
    size_t sum = 0;
    *most = 0;
    for (int m = 0; cfg->dora && m < cfg->num_modules; m++) {
        sum += (size_t)cfg->modules[m].out;
        if ((size_t)cfg->modules[m].out > *most) *most = (size_t)cfg->modules[m].out;
    }
    return sum;
}

/* The arena: xa (module, layer) | dxa (training) | DoRA: gain (module, layer) | v (training) | dg (training) */
size_t lora_plan_activations(const LoraConfig *cfg, int B, int T, int training) {
    size_t N = (size_t)B * T, R = (size_t)cfg->rank, L = (size_t)cfg->num_layers, most;
    size_t outs = dora_outs(cfg, &most);
    size_t floats = N * R * (size_t)cfg->num_modules * L + (training ? N * R : 0);
    floats += 2 * outs * L + (training ? N * outs * L + N * most : 0);
    return floats * sizeof(float);
}

void lora_run_allocate(LoraRun *r, int B, int T, int training) {
    const LoraConfig *c = &r->cfg;
    size_t most, outs = dora_outs(c, &most);
    r->N = B * T;
    r->xa_floats = lora_plan_activations(c, B, T, training) / sizeof(float);
    if (!r->xa_floats) { /* prompt tuning: no sites, nothing saved */
        if (training) r->grads = (float *)mem_calloc(MEM_GRADIENTS, c->num_parameters, sizeof(float), "adapter gradients");
        return;
    }
    r->xa = (float *)mem_calloc(MEM_ACTIVATIONS, r->xa_floats, sizeof(float), "LoRA activations");
    float *next = r->xa + (size_t)r->N * c->rank * c->num_modules * c->num_layers;
    if (training) {
        r->dxa = next, next += (size_t)r->N * c->rank;
        r->grads = (float *)mem_calloc(MEM_GRADIENTS, c->num_parameters, sizeof(float), "LoRA gradients");
    }
    if (c->dora) {
        r->gain = next, next += 2 * outs * (size_t)c->num_layers;
        if (training) r->v = next, next += (size_t)r->N * outs * c->num_layers, r->dg = next;
        else /* inference: the adapter is fixed, each (module, layer)'s gains are computed once (1 / n < 0: not yet) */
            for (int m = 0; m < c->num_modules; m++)
                for (int l = 0; l < c->num_layers; l++) gain_of(r, m, l)[c->modules[m].out] = -1.0f;
    }
}

void lora_run_set_base(LoraRun *r, const float *base, const TensorSpec *specs, int n, int init) {
    r->base = base, r->base_specs = specs, r->num_base_specs = n;
    for (int m = 0; r->cfg.dora && m < r->cfg.num_modules; m++)
        if (!lora_site_weight(specs, n, r->cfg.modules[m].site))
            llmc_die("internal: DoRA on module %s, whose site weight the model does not have", r->cfg.modules[m].path);
    if (init) lora_dora_init(&r->cfg, r->params, specs, n, base);
}

void lora_run_free(LoraRun *r) {
    mem_free(MEM_PARAMETERS, r->params, r->cfg.num_parameters * sizeof(float));
    mem_free(MEM_GRADIENTS, r->grads, r->cfg.num_parameters * sizeof(float));
    mem_free(MEM_ACTIVATIONS, r->xa, r->xa_floats * sizeof(float));
    memset(r, 0, sizeof *r);
}

static float *xa_of(LoraRun *r, int m, int l) {
    return r->xa + ((size_t)m * r->cfg.num_layers + (size_t)l) * (size_t)r->N * r->cfg.rank;
}

/* DoRA: the (module, layer)'s gains g (out floats, then out floats 1 / n) and saved v (N x out) */
static size_t dora_before(const LoraConfig *c, int m, int l) {
    size_t before = 0;
    for (int i = 0; i < m; i++) before += (size_t)c->modules[i].out * c->num_layers;
    return before + (size_t)c->modules[m].out * l;
}
static float *gain_of(LoraRun *r, int m, int l) { return r->gain + 2 * dora_before(&r->cfg, m, l); }
static float *v_of(LoraRun *r, int m, int l) { return r->v ? r->v + (size_t)r->N * dora_before(&r->cfg, m, l) : NULL; }

/* the module's rows of its site's base weight, and its bias (NULL: none) */
static const float *dora_weight(const LoraRun *r, const LoraModule *mod, int l, const float **bias) {
    const TensorSpec *w = lora_site_weight(r->base_specs, r->num_base_specs, mod->site);
    const TensorSpec *b = lora_site_bias(r->base_specs, r->num_base_specs, mod->site);
    if (!r->base || !w) llmc_die("internal: DoRA forward without the base weights (lora_run_set_base)");
    *bias = b ? tensor_layer((float *)r->base, b, l) + mod->out_offset : NULL;
    return tensor_layer((float *)r->base, w, l) + (size_t)mod->out_offset * mod->in;
}

/* y (N rows of stride width: W x + b + scale (x A^T) B^T) -> g (y - b) + b, keeping v = y - b */
static void dora_forward(LoraRun *r, int m, int l, const float *A, const float *B, float *y, int width, int N) {
    const LoraModule *mod = &r->cfg.modules[m];
    const float *bias;
    const float *W = dora_weight(r, mod, l, &bias);
    const float *mag = tensor_layer(r->params, lora_magnitude_spec(&r->cfg, m), l);
    float *g = gain_of(r, m, l), *inv = g + mod->out, *v = v_of(r, m, l);
    const int out = mod->out;
    if (r->grads || inv[0] < 0.0f) { /* training: this step's A and B; inference: the first forward only */
        lora_dora_norms(&r->cfg, m, A, B, W, inv); /* (detached: a constant of the backward) */
        for (int o = 0; o < out; o++) {
            g[o] = lora_dora_gain(mag[o], inv[o]);
            inv[o] = inv[o] > 0.0f ? 1.0f / inv[o] : 0.0f;
        }
    }
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float *row = y + (size_t)n * width, *vrow = v ? v + (size_t)n * out : NULL;
        for (int o = 0; o < out; o++) {
            const float b = bias ? bias[o] : 0.0f, x = row[o] - b;
            if (vrow) vrow[o] = x;
            row[o] = g[o] * x + b;
        }
    }
}
void lora_forward_site(LoraRun *r, int site, int l, float *out, int width, const float *inp, int N) {
    const LoraConfig *c = &r->cfg;
    const int R = c->rank;
    if (N > r->N) llmc_die("internal: LoRA forward of %d rows, %d allocated", N, r->N);
    for (int m = 0; m < c->num_modules; m++) {
        const LoraModule *mod = &c->modules[m];
        if (mod->site != site) continue;
        const float *A = tensor_layer(r->params, &c->specs[2 * m], l), *B = tensor_layer(r->params, &c->specs[2 * m + 1], l);
        float *xa = xa_of(r, m, l);
        llmc_sgemm(0, 1, N, R, mod->in, 1.0f, inp, mod->in, A, mod->in, 0.0f, xa, R);                             /* (N, R) */
        llmc_sgemm(0, 1, N, mod->out, R, c->scale, xa, R, B, R, 1.0f, out + mod->out_offset, width);             /* += */
        if (c->dora) dora_forward(r, m, l, A, B, out + mod->out_offset, width, N);
    }
}

void lora_backward_site(LoraRun *r, int site, int l, float *dinp, const float *dout, int width, const float *inp, int N) {
    const LoraConfig *c = &r->cfg;
    const int R = c->rank;
    for (int m = 0; m < c->num_modules; m++) {
        const LoraModule *mod = &c->modules[m];
        if (mod->site != site) continue;
        const float *A = tensor_layer(r->params, &c->specs[2 * m], l), *B = tensor_layer(r->params, &c->specs[2 * m + 1], l);
        float *dA = tensor_layer(r->grads, &c->specs[2 * m], l), *dB = tensor_layer(r->grads, &c->specs[2 * m + 1], l);
        const float *xa = xa_of(r, m, l), *d = dout + mod->out_offset;
        int ld = width;
        if (c->dora) { /* dm, and d := g dout for the LoRA backward */
            const int out = mod->out;
            const float *g = gain_of(r, m, l), *inv = g + out, *v = v_of(r, m, l);
            float *dm = tensor_layer(r->grads, lora_magnitude_spec(c, m), l), *dg = r->dg;
            if (!v) llmc_die("internal: DoRA backward without the forward's saved activations");
#pragma omp parallel for
            for (int o = 0; o < out; o++) {
                double sum = 0.0;
                for (int n = 0; n < N; n++) sum += (double)d[(size_t)n * width + o] * v[(size_t)n * out + o];
                dm[o] += (float)(sum * inv[o]);
            }
#pragma omp parallel for
            for (int n = 0; n < N; n++)
                for (int o = 0; o < out; o++) dg[(size_t)n * out + o] = g[o] * d[(size_t)n * width + o];
            d = dg, ld = out;
        }
        llmc_sgemm(0, 0, N, R, mod->out, c->scale, d, ld, B, R, 0.0f, r->dxa, R);          /* d(xa) (N, R) */
        llmc_sgemm(1, 0, mod->out, R, N, c->scale, d, ld, xa, R, 1.0f, dB, R);             /* dB (out, R) */
        llmc_sgemm(1, 0, R, mod->in, N, 1.0f, r->dxa, R, inp, mod->in, 1.0f, dA, mod->in); /* dA (R, in) */
        llmc_sgemm(0, 0, N, mod->in, R, 1.0f, r->dxa, R, A, mod->in, 1.0f, dinp, mod->in); /* dx += */
        if (c->dora) { /* the base matmul's backward gave dout W; the module's is (g dout) W */
            const int out = mod->out;
            const float *g = gain_of(r, m, l), *dout_m = dout + mod->out_offset, *bias;
            const float *W = dora_weight(r, mod, l, &bias);
            float *dg = r->dg;
#pragma omp parallel for
            for (int n = 0; n < N; n++)
                for (int o = 0; o < out; o++) dg[(size_t)n * out + o] = (g[o] - 1.0f) * dout_m[(size_t)n * width + o];
            llmc_sgemm(0, 0, N, mod->in, out, 1.0f, dg, out, W, mod->in, 1.0f, dinp, mod->in);
        }
    }
}

/* ---- prompt tuning (cfg.prompt_tokens) ---------------------------------------------------------- */
void lora_prompt_forward(LoraRun *r, float *encoded, const float *wpe, int B, int T, int C) {
    const int P = r->cfg.prompt_tokens;
    if (!P) return;
    if (P > T || C != r->cfg.token_dim) llmc_die("internal: prompt forward of (%d, %d, %d), %d soft tokens", B, T, C, P);
    for (int b = 0; b < B; b++)
        for (int p = 0; p < P; p++) {
            float *row = encoded + ((size_t)b * T + p) * C;
            const float *e = r->params + (size_t)p * C;
            for (int c = 0; c < C; c++) row[c] = wpe ? e[c] + wpe[(size_t)p * C + c] : e[c];
        }
}

void lora_prompt_backward(LoraRun *r, const float *dencoded, int B, int T, int C) {
    const int P = r->cfg.prompt_tokens;
    if (!P || !r->grads) return;
    for (int b = 0; b < B; b++)
        for (int p = 0; p < P; p++) {
            const float *d = dencoded + ((size_t)b * T + p) * C;
            float *g = r->grads + (size_t)p * C;
            for (int c = 0; c < C; c++) g[c] += d[c];
        }
}

void lora_prompt_inputs(const LoraConfig *cfg, const int *inputs, const int *targets, int B, int T, int *out_inputs,
                        int *out_targets) {
    const int P = cfg->prompt_tokens, W = P + T;
    for (int b = 0; b < B; b++) {
        memset(out_inputs + (size_t)b * W, 0, (size_t)P * sizeof(int));
        memcpy(out_inputs + (size_t)b * W + P, inputs + (size_t)b * T, (size_t)T * sizeof(int));
        if (!targets) continue;
        memset(out_targets + (size_t)b * W, 0, (size_t)P * sizeof(int));
        memcpy(out_targets + (size_t)b * W + P, targets + (size_t)b * T, (size_t)T * sizeof(int));
    }
}

float lora_prompt_mask(const LoraConfig *cfg, const float *losses, float *dlogits, int B, int T, int Vp) {
    const int P = cfg->prompt_tokens, W = P + T;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) sum += losses[(size_t)b * W + P + t];
        if (dlogits) memset(dlogits + (size_t)b * W * Vp, 0, (size_t)P * Vp * sizeof(float));
    }
    return sum / (float)(B * T);
}
