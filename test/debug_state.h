/*
 * debug_state.h - the PyTorch references' debug state (dev/reference/train_gpt2.py and
 * train_llama3.py, version 3), read by test_gpt2_cpu.c and test_llama_cpu.c: header (B, T, V,
 * Vp, steps, L, NH, C, maxT, and for Llama NKV and F; the AdamW settings as floats from word 16),
 * then inputs, targets, logits, loss, all gradients, the N-step loss and grad-norm trajectory and
 * the parameters after it. A file longer than its header says is an error.
 */
#ifndef LLMC_TEST_DEBUG_STATE_H
#define LLMC_TEST_DEBUG_STATE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/models/gpt2.h"
#include "test/testing.h"

typedef struct {
    int B, T, V, Vp, nsteps, L, NH, C, maxT, NKV, F;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int *x, *y;
    float *logits, loss, *grads, *losses, *norms, *params_after;
} DebugState;

static void read_debug_state(const char *path, DebugState *d, size_t num_params) {
    FILE *f = fopenCheck(path, "rb");
    int32_t h[256];
    freadCheck(h, 4, 256, f, path);
    if (h[0] != 20240327 || h[1] != 3) llmc_die("'%s' is not a version-3 debug state (magic %d, version %d)", path, h[0], h[1]);
    d->B = h[2], d->T = h[3], d->V = h[4], d->Vp = h[5], d->nsteps = h[6];
    d->L = h[7], d->NH = h[8], d->C = h[9], d->maxT = h[10], d->NKV = h[11], d->F = h[12];
    float hp[6];
    memcpy(hp, h + 16, sizeof hp);
    d->lr = hp[0], d->beta1 = hp[1], d->beta2 = hp[2], d->eps = hp[3], d->weight_decay = hp[4], d->grad_clip = hp[5];
    size_t BT = (size_t)d->B * d->T;
    d->x = (int *)mallocCheck(BT * sizeof(int), "x");
    d->y = (int *)mallocCheck(BT * sizeof(int), "y");
    d->logits = (float *)mallocCheck(BT * d->V * sizeof(float), "logits");
    d->grads = (float *)mallocCheck(num_params * sizeof(float), "grads");
    d->losses = (float *)mallocCheck(d->nsteps * sizeof(float), "losses");
    d->norms = (float *)mallocCheck(d->nsteps * sizeof(float), "norms");
    d->params_after = (float *)mallocCheck(num_params * sizeof(float), "params");
    freadCheck(d->x, sizeof(int), BT, f, path);
    freadCheck(d->y, sizeof(int), BT, f, path);
    freadCheck(d->logits, sizeof(float), BT * d->V, f, path);
    freadCheck(&d->loss, sizeof(float), 1, f, path);
    freadCheck(d->grads, sizeof(float), num_params, f, path);
    freadCheck(d->losses, sizeof(float), d->nsteps, f, path);
    freadCheck(d->norms, sizeof(float), d->nsteps, f, path);
    freadCheck(d->params_after, sizeof(float), num_params, f, path);
    char extra;
    if (fread(&extra, 1, 1, f) != 0) llmc_die("debug state '%s' is longer than its header says", path);
    fclose(f);
}

static float max_abs(const float *a, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
    return m;
}

/* The forward's logits (B*T rows of Vp, the first V of each real) against the reference's. */
static void check_debug_logits(const DebugState *d, const float *logits_vp) {
    const size_t rows = (size_t)d->B * d->T, V = (size_t)d->V;
    float *logits = (float *)mallocCheck(rows * V * sizeof(float), "logits copy");
    for (size_t i = 0; i < rows; i++) memcpy(logits + i * V, logits_vp + i * (size_t)d->Vp, V * sizeof(float));
    test_close("forward logits", logits, d->logits, rows * V, 1e-4, 1e-4);
    free(logits);
}

/* Every gradient of the parameter table (n tensors) against the reference's. */
static void check_debug_gradients(const DebugState *d, const TensorSpec *specs, int n, const float *grads) {
    for (int i = 0; i < n; i++) {
        const TensorSpec *s = &specs[i];
        char name[64];
        snprintf(name, sizeof name, "gradient %s %s", s->name, s->shape);
        const float *ref = d->grads + s->offset;
        test_close(name, grads + s->offset, ref, s->numel, 1e-3 * max_abs(ref, s->numel), 1e-3);
    }
}

/* One step of the N-step trajectory: its loss and grad norm against the reference's (relative
 * 1e-4 and 1e-3); prints the step's line, marked when out of tolerance. Returns 1 when within. */
static inline int check_debug_step(const DebugState *d, int step, float loss, float norm) {
    int ok = fabsf(loss - d->losses[step]) <= 1e-4f * fabsf(d->losses[step]) &&
             fabsf(norm - d->norms[step]) <= 1e-3f * fabsf(d->norms[step]);
    printf("  step %2d: loss %.6f (ref %.6f)  norm %.6f (ref %.6f)%s\n", step, loss, d->losses[step], norm,
           d->norms[step], ok ? "" : "  <-- out of tolerance");
    return ok;
}

#endif
