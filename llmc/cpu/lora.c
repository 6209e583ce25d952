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

size_t lora_plan_activations(const LoraConfig *cfg, int B, int T, int training) {
    size_t N = (size_t)B * T, R = (size_t)cfg->rank;
    return (N * R * (size_t)cfg->num_modules * (size_t)cfg->num_layers + (training ? N * R : 0)) * sizeof(float);
}

void lora_run_allocate(LoraRun *r, int B, int T, int training) {
    const LoraConfig *c = &r->cfg;
    r->N = B * T;
    r->xa_floats = lora_plan_activations(c, B, T, training) / sizeof(float);
    r->xa = (float *)mem_calloc(MEM_ACTIVATIONS, r->xa_floats, sizeof(float), "LoRA activations");
    if (training) {
        r->dxa = r->xa + (size_t)r->N * c->rank * c->num_modules * c->num_layers;
        r->grads = (float *)mem_calloc(MEM_GRADIENTS, c->num_parameters, sizeof(float), "LoRA gradients");
    }
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
        llmc_sgemm(0, 0, N, R, mod->out, c->scale, d, width, B, R, 0.0f, r->dxa, R);       /* d(xa) (N, R) */
        llmc_sgemm(1, 0, mod->out, R, N, c->scale, d, width, xa, R, 1.0f, dB, R);          /* dB (out, R) */
        llmc_sgemm(1, 0, R, mod->in, N, 1.0f, r->dxa, R, inp, mod->in, 1.0f, dA, mod->in); /* dA (R, in) */
        llmc_sgemm(0, 0, N, mod->in, R, 1.0f, r->dxa, R, A, mod->in, 1.0f, dinp, mod->in); /* dx += */
    }
}
