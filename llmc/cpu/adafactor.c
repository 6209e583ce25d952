/* adafactor.c - Adafactor's per-tensor update and the units of a parameter table (adafactor.h). */
#include "llmc/cpu/adafactor.h"
#include "llmc/core/check.h"
#include "llmc/cpu/adamw.h"

#include "llmc/dist/bucket.h"
#include "llmc/formats/arch.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The step size of the tensor: lr, or with param_scale lr * max(eps2, RMS(params)). */
static float step_size(const float *params, size_t n, const AdafactorArgs *a) {
    if (!a->param_scale) return a->lr;
    float rms = (float)sqrt(global_norm_squared(params, n) / (double)n); /* (fixed chunks: deterministic) */
    return a->lr * (rms > a->eps2 ? rms : a->eps2);
}

/* u /= max(1, RMS(u) / clip), from the sum of squares of u. */
static float clip_divisor(double sumsq, size_t n, float clip) {
    float d = (float)sqrt(sumsq / (double)n) / clip;
    return d > 1.0f ? d : 1.0f;
}

/* The last part of the update on element i: u (before the clip divisor and lr). */
static inline float finish(float *p, float *m, float u, float div, float lr, const AdafactorArgs *a) {
    u = u / div * lr;
    if (m) u = *m = a->beta1 * *m + (1.0f - a->beta1) * u;
    float x = *p;
    if (a->weight_decay != 0.0f) x = x + x * (-a->weight_decay * lr);
    *p = x - u;
    return u;
}

void adafactor_update_factored(float *params, const float *grads, float *row, float *col, float *m, size_t rows,
                               size_t cols, const AdafactorArgs *a) {
    const float lr = step_size(params, rows * cols, a), s = a->grad_scale;
    double *colsum = (double *)callocCheck(cols, sizeof(double), "Adafactor column sums");
    /* the row statistics (rows in parallel), then the column sums row by row (a fixed order) */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        const float *g = grads + i * cols;
        double r = 0.0;
        for (size_t j = 0; j < cols; j++) {
            float gj = g[j] * s;
            r += (double)(gj * gj + a->eps1);
        }
        row[i] = row[i] * a->b2t + (float)(r / (double)cols) * a->one_minus_b2t;
    }
    for (size_t i = 0; i < rows; i++) {
        const float *g = grads + i * cols;
        for (size_t j = 0; j < cols; j++) {
            float gj = g[j] * s;
            colsum[j] += (double)(gj * gj + a->eps1);
        }
    }
    double rmean = 0.0;
    for (size_t i = 0; i < rows; i++) rmean += row[i];
    const float rm = (float)(rmean / (double)rows);
    for (size_t j = 0; j < cols; j++) {
        col[j] = col[j] * a->b2t + (float)(colsum[j] / (double)rows) * a->one_minus_b2t;
        colsum[j] = 1.0f / sqrtf(col[j]); /* (reused: the column factors, as floats) */
    }
    double *rowsq = (double *)mallocCheck(rows * sizeof(double), "Adafactor row sums");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        const float rf = 1.0f / sqrtf(row[i] / rm);
        const float *g = grads + i * cols;
        double r = 0.0;
        for (size_t j = 0; j < cols; j++) {
            float u = rf * (float)colsum[j] * (g[j] * s);
            r += (double)u * u;
        }
        rowsq[i] = r;
    }
    double ss = 0.0; /* (summed in row order: the same bits for any number of threads) */
    for (size_t i = 0; i < rows; i++) ss += rowsq[i];
    free(rowsq);
    const float div = clip_divisor(ss, rows * cols, a->clip);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++) {
        const float rf = 1.0f / sqrtf(row[i] / rm);
        const size_t o = i * cols;
        for (size_t j = 0; j < cols; j++)
            finish(params + o + j, m ? m + o + j : NULL, rf * (float)colsum[j] * (grads[o + j] * s), div, lr, a);
    }
    free(colsum);
}

void adafactor_update_vector(float *params, const float *grads, float *v, float *m, size_t n, const AdafactorArgs *a) {
    const float lr = step_size(params, n, a), s = a->grad_scale;
    enum { CHUNKS = 64 };
    double part[CHUNKS]; /* fixed chunks, summed in order: the same bits for any number of threads */
#pragma omp parallel for schedule(static)
    for (int k = 0; k < CHUNKS; k++) {
        double r = 0.0;
        for (size_t i = n * (size_t)k / CHUNKS; i < n * (size_t)(k + 1) / CHUNKS; i++) {
            float g = grads[i] * s;
            v[i] = v[i] * a->b2t + (g * g + a->eps1) * a->one_minus_b2t;
            float u = (1.0f / sqrtf(v[i])) * g;
            r += (double)u * u;
        }
        part[k] = r;
    }
    double ss = 0.0;
    for (int k = 0; k < CHUNKS; k++) ss += part[k];
    const float div = clip_divisor(ss, n, a->clip);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) finish(params + i, m ? m + i : NULL, (1.0f / sqrtf(v[i])) * (grads[i] * s), div, lr, a);
}

/* ---- the units ---- */
/* The value of one dimension of a shape text ("C", "2F", "QKV", "Vp", "maxT", "64"). */
static size_t dim_value(const char *s, size_t len, const ModelConfig *cfg, const char *tensor) {
    size_t mult = 0, i = 0;
    while (i < len && isdigit((unsigned char)s[i])) mult = mult * 10 + (size_t)(s[i++] - '0');
    const char *sym = s + i;
    size_t k = len - i, v = 0;
    if (k == 0) return mult;
    if (k == 1 && sym[0] == 'C') v = (size_t)cfg->channels;
    else if (k == 1 && sym[0] == 'F') v = (size_t)cfg->ffn_hidden;
    else if (k == 1 && sym[0] == 'V') v = (size_t)cfg->vocab_size;
    else if (k == 2 && !strncmp(sym, "Vp", 2)) v = (size_t)cfg->padded_vocab_size;
    else if (k == 4 && !strncmp(sym, "maxT", 4)) v = (size_t)cfg->max_seq_len;
    else if (k == 3 && !strncmp(sym, "QKV", 3))
        v = (size_t)(cfg->num_heads + 2 * cfg->num_kv_heads) * (size_t)(cfg->channels / cfg->num_heads);
    else llmc_die("internal: Adafactor cannot read dimension '%.*s' of tensor %s's shape", (int)len, s, tensor);
    return (mult ? mult : 1) * v;
}

/* A unit's shape from the table's text: *cols for a 2-D unit (one layer's slice of a stacked
 * tensor), 0 for anything else. */
static size_t unit_cols(const TensorSpec *s, const ModelConfig *cfg) {
    const char *p = strchr(s->shape, '('), *end = p ? strchr(p, ')') : NULL;
    if (!p || !end) llmc_die("internal: tensor %s's shape '%s' is not '(...)'", s->name, s->shape);
    const char *dims[8];
    size_t lens[8];
    int nd = 0;
    for (const char *q = p + 1; q < end && nd < 8;) {
        while (q < end && (*q == ' ' || *q == ',')) q++;
        if (q >= end) break;
        const char *e = q;
        while (e < end && *e != ',' && *e != ' ') e++;
        dims[nd] = q, lens[nd++] = (size_t)(e - q);
        q = e;
    }
    int first = s->layer_numel ? 1 : 0; /* (L, ...): the layer's slice */
    if (nd - first != 2) return 0;
    return dim_value(dims[nd - 1], lens[nd - 1], cfg, s->name);
}

int adafactor_units(const TensorSpec *specs, int num_specs, const ModelConfig *cfg, AdafactorUnit *units,
                    size_t *num_stats) {
    int nu = 0;
    size_t soff = 0;
    for (int i = 0; i < num_specs; i++) {
        const TensorSpec *s = &specs[i];
        if (!s->numel) continue;
        const size_t un = s->layer_numel ? s->layer_numel : s->numel, count = s->numel / un;
        size_t cols = unit_cols(s, cfg), rows = cols ? un / cols : 0;
        if (cols && rows * cols != un)
            llmc_die("internal: tensor %s (%zu elements a unit) is not %zu columns wide", s->name, un, cols);
        if (rows < 2 || cols < 2) rows = cols = 0; /* a vector (or a degenerate matrix: kept whole) */
        for (size_t l = 0; l < count; l++, nu++) {
            if (units) units[nu] = (AdafactorUnit){s->offset + l * un, un, rows, cols, soff, s->decay};
            soff += cols ? rows + cols : un;
        }
    }
    if (num_stats) *num_stats = soff;
    return nu;
}

void adafactor_units_of_rank(const AdafactorUnit *u, int nu, size_t n, int zero, int ranks, int rank, int *u0, int *u1) {
    if (zero == 0) {
        *u0 = 0, *u1 = nu;
        return;
    }
    size_t lo, hi;
    dist_shard(n, ranks, rank, &lo, &hi);
    int a = 0;
    while (a < nu && u[a].off < lo) a++;
    int b = a;
    while (b < nu && u[b].off < hi) b++;
    *u0 = a, *u1 = b;
}

void adafactor_unit_range(const AdafactorUnit *u, int nu, int u0, int u1, size_t *plo, size_t *phi, size_t *slo,
                          size_t *shi) {
    if (u0 >= u1) { /* no units: an empty range where the next rank's begins */
        size_t p = u0 < nu ? u[u0].off : (nu ? u[nu - 1].off + u[nu - 1].numel : 0);
        size_t s = u0 < nu ? u[u0].soff : (nu ? u[nu - 1].soff + (u[nu - 1].cols ? u[nu - 1].rows + u[nu - 1].cols : u[nu - 1].numel) : 0);
        *plo = *phi = p, *slo = *shi = s;
        return;
    }
    const AdafactorUnit *l = &u[u1 - 1];
    *plo = u[u0].off, *phi = l->off + l->numel;
    *slo = u[u0].soff, *shi = l->soff + (l->cols ? l->rows + l->cols : l->numel);
}

void adafactor_state_bytes(const char *init, int zero, int ranks, int rank, int first_moment, size_t *m_bytes,
                           size_t *v_bytes) {
    ArchConfig ac;
    const ModelArch *arch = model_arch_for_init(init, &ac);
    TensorSpec *specs = (TensorSpec *)callocCheck((size_t)arch->num_param_specs, sizeof(TensorSpec), "parameter table");
    size_t n = arch->parameter_specs(&ac, specs), ns;
    int nu = adafactor_units(specs, arch->num_param_specs, arch_config_cbase(&ac), NULL, &ns);
    AdafactorUnit *u = (AdafactorUnit *)mallocCheck((size_t)(nu ? nu : 1) * sizeof *u, "Adafactor units");
    adafactor_units(specs, arch->num_param_specs, arch_config_cbase(&ac), u, &ns);
    int u0, u1;
    size_t plo, phi, slo, shi;
    adafactor_units_of_rank(u, nu, n, zero, ranks, rank, &u0, &u1);
    adafactor_unit_range(u, nu, u0, u1, &plo, &phi, &slo, &shi);
    *m_bytes = first_moment ? (phi - plo) * sizeof(float) : 0;
    *v_bytes = (shi - slo) * sizeof(float);
    free(u);
    free(specs);
}
