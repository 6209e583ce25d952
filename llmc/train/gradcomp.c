/* gradcomp.c - compressed gradient communication with error feedback (gradcomp.h).
 * No fused multiply-adds: every product and sum rounded on its own, as numpy's float32 does, so
 * that dev/reference/grad_compression.py gives the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "llmc/train/gradcomp.h"
#include "llmc/core/check.h"
#include "llmc/core/mem.h"
#include "llmc/core/rng.h"
#include "llmc/cpu/adafactor.h"
#include "llmc/formats/arch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static const char *const NAMES[] = {"none", "bf16", "int8", "topk", "powersgd"};
const char *gradcomp_name(int kind) { return kind >= 0 && kind <= GC_POWERSGD ? NAMES[kind] : "?"; }

int gradcomp_parse(const char *s, GradCompSpec *g, char *err, size_t len) {
    memset(g, 0, sizeof *g);
    char *end;
    if (strcmp(s, "none") == 0) return 0;
    if (strcmp(s, "bf16") == 0) return g->kind = GC_BF16, 0;
    if (strcmp(s, "int8") == 0) return g->kind = GC_INT8, 0;
    if (strncmp(s, "topk:", 5) == 0) {
        double f = strtod(s + 5, &end);
        if (end == s + 5 || *end || !(f > 0.0 && f < 1.0)) {
            snprintf(err, len, "'%s': topk:FRAC takes a fraction of each bucket strictly between 0 and 1 (e.g. topk:0.05)", s);
            return -1;
        }
        g->kind = GC_TOPK, g->frac = (float)f;
        return 0;
    }
    if (strncmp(s, "powersgd:", 9) == 0) {
        long r = strtol(s + 9, &end, 10);
        if (end == s + 9 || *end || r < 1 || r > 1024) {
            snprintf(err, len, "'%s': powersgd:RANK takes a rank from 1 to 1024 (e.g. powersgd:4)", s);
            return -1;
        }
        g->kind = GC_POWERSGD, g->rank = (int)r;
        return 0;
    }
    snprintf(err, len, "unknown scheme '%s' (none, bf16, int8, topk:FRAC, powersgd:RANK)", s);
    return -1;
}

int32_t gradcomp_param_word(const GradCompSpec *g) {
    if (g->kind == GC_TOPK) {
        int32_t w;
        memcpy(&w, &g->frac, sizeof w);
        return w;
    }
    return g->kind == GC_POWERSGD ? g->rank : 0;
}

/* topk: the elements a bucket of m sends */
static size_t topk_count(float frac, size_t m) {
    size_t k = (size_t)ceil((double)frac * (double)m);
    return k < 1 ? 1 : k > m ? m : k;
}

static size_t round4(size_t b) { return (b + 3) / 4 * 4; }

size_t gradcomp_payload_cap(const GradCompSpec *g, size_t n, int num_buckets) {
    switch (g->kind) {
    case GC_BF16: return round4(n * 2);
    case GC_INT8: return (n + GC_INT8_CHUNK - 1) / GC_INT8_CHUNK * 4 + round4(n);
    case GC_TOPK: { /* sum over buckets of ceil(frac m) <= ceil(frac n) + buckets */
        size_t k = (size_t)ceil((double)g->frac * (double)n) + (size_t)num_buckets;
        return (k < n ? k : n) * 8;
    }
    default: return 0;
    }
}

size_t gradcomp_residual_bytes(const GradCompSpec *g, size_t n, int ranks) {
    return g->kind == GC_NONE || ranks <= 1 ? 0 : n * sizeof(float);
}

size_t gradcomp_memory_bytes(const GradCompSpec *g, size_t n, int num_buckets, int ranks) {
    if (g->kind == GC_NONE || ranks <= 1) return 0;
    return gradcomp_residual_bytes(g, n, ranks) + (size_t)ranks * gradcomp_payload_cap(g, n, num_buckets) +
           (g->kind == GC_TOPK ? 65536 * sizeof(uint32_t) : 0);
}

static GradComp *current;
GradComp *gradcomp_current(void) { return current; }

static int count_buckets(const TensorSpec *specs, int num_specs) {
    int layers = 0; /* optim.h's buckets: the outer one, then one a layer */
    for (int i = 0; i < num_specs; i++)
        if (specs[i].layer_numel && (int)(specs[i].numel / specs[i].layer_numel) > layers)
            layers = (int)(specs[i].numel / specs[i].layer_numel);
    return layers + 1;
}

/* powersgd: a matrix's rank */
static size_t psgd_r(int R, const AdafactorUnit *u) {
    size_t r = (size_t)R;
    if (r > u->rows) r = u->rows;
    if (r > u->cols) r = u->cols;
    return r;
}

/* powersgd: the floats of every Q (cols x r), every P (rows x r) and the vectors */
static void psgd_sizes(const AdafactorUnit *u, int nu, int R, size_t *q, size_t *p, size_t *vec) {
    *q = *p = *vec = 0;
    for (int i = 0; i < nu; i++) {
        if (!u[i].cols) *vec += u[i].numel;
        else *q += u[i].cols * psgd_r(R, &u[i]), *p += u[i].rows * psgd_r(R, &u[i]);
    }
}

static size_t psgd_bytes(size_t n, size_t q, size_t p, size_t vec, int ranks) {
    const size_t cap = 4 * (p + vec > q ? p + vec : q);
    return 4 * (n + (q ? q : 1) + (p ? p : 1)) + (size_t)ranks * cap; /* (Q and P: at least a float each) */
}

size_t gradcomp_plan_bytes(const GradCompSpec *g, const char *init, size_t n, int num_buckets, int ranks) {
    if (g->kind != GC_POWERSGD || ranks <= 1) return gradcomp_memory_bytes(g, n, num_buckets, ranks);
    ArchConfig ac;
    const ModelArch *arch = model_arch_for_init(init, &ac);
    TensorSpec *specs = (TensorSpec *)callocCheck((size_t)arch->num_param_specs, sizeof(TensorSpec), "parameter table");
    arch->parameter_specs(&ac, specs);
    int nu = adafactor_units(specs, arch->num_param_specs, arch_config_cbase(&ac), NULL, NULL);
    AdafactorUnit *u = (AdafactorUnit *)mallocCheck((size_t)(nu ? nu : 1) * sizeof *u, "matrices");
    adafactor_units(specs, arch->num_param_specs, arch_config_cbase(&ac), u, NULL);
    size_t q, p, vec;
    psgd_sizes(u, nu, g->rank, &q, &p, &vec);
    free(u), free(specs);
    return psgd_bytes(n, q, p, vec, ranks);
}

void gradcomp_init(GradComp *g, const GradCompSpec *spec, Dist *d, size_t n, const TensorSpec *specs, int num_specs,
                   int max_buckets, const ModelConfig *cfg) {
    memset(g, 0, sizeof *g);
    g->spec = *spec, g->dist = d, g->n = n, g->specs = specs, g->num_specs = num_specs;
    g->num_buckets = count_buckets(specs, num_specs);
    g->max_buckets = max_buckets;
    if (g->num_buckets > max_buckets) llmc_die("internal: %d gradient buckets, planned for %d", g->num_buckets, max_buckets);
    if (spec->kind == GC_TOPK && n > 0xFFFFFFFFu)
        llmc_die("flag --grad-compression topk: %zu parameters exceed the 32-bit indices it sends", n);
    const char *e = getenv("LLMC_TEST_GRAD_COMP_NO_RESIDUAL");
    g->no_residual = e && atoi(e) == 1;
    if (spec->kind == GC_NONE || d->size <= 1) return; /* (one process: nothing to send) */
    g->zero_unit = getenv("LLMC_TEST_GRAD_COMP_ZERO_UNIT") ? atoi(getenv("LLMC_TEST_GRAD_COMP_ZERO_UNIT")) : -1;
    if (spec->kind == GC_POWERSGD) {
        g->num_units = adafactor_units(specs, num_specs, cfg, NULL, NULL);
        AdafactorUnit *u = (AdafactorUnit *)mallocCheck((size_t)(g->num_units ? g->num_units : 1) * sizeof *u, "matrices");
        adafactor_units(specs, num_specs, cfg, u, NULL);
        g->units = u;
        psgd_sizes(u, g->num_units, spec->rank, &g->q_floats, &g->p_floats, &g->vec_floats);
        g->cap = 4 * (g->p_floats + g->vec_floats > g->q_floats ? g->p_floats + g->vec_floats : g->q_floats);
        g->q = (float *)mem_calloc(MEM_GRAD_COMP, g->q_floats ? g->q_floats : 1, sizeof(float), "PowerSGD Q");
        g->phat = (float *)mem_calloc(MEM_GRAD_COMP, g->p_floats ? g->p_floats : 1, sizeof(float), "PowerSGD P");
        Rng rng; /* Q's start: the same on every rank */
        rng_seed(&rng, 0x9057D5ull);
        rng_normal(&rng, g->q, g->q_floats, 0.0f, 1.0f);
    } else g->cap = gradcomp_payload_cap(spec, n, max_buckets);
    g->residual = (float *)mem_calloc(MEM_GRAD_COMP, n, sizeof(float), "error-feedback residual");
    g->payload = (unsigned char *)mem_calloc(MEM_GRAD_COMP, (size_t)d->size, g->cap, "compressed gradient payloads");
    if (spec->kind == GC_TOPK) g->hist = (uint32_t *)mem_calloc(MEM_GRAD_COMP, 65536, sizeof(uint32_t), "top-k histogram");
    current = g;
    g->dump = getenv("LLMC_TEST_GRAD_COMP_DUMP");
    if (g->dump && d->rank == 0) { /* the buckets: "k offset length" a slice */
        char path[1200];
        snprintf(path, sizeof path, "%s/buckets.txt", g->dump);
        FILE *f = fopenCheck(path, "w");
        Bucket b;
        for (int k = 0; k < g->num_buckets; k++) {
            bucket_of_layer(&b, specs, num_specs, k - 1);
            for (int i = 0; i < b.n; i++) fprintf(f, "%d %zu %zu\n", k, b.off[i], b.len[i]);
        }
        if (fclose(f) != 0) llmc_die("cannot write '%s'", path);
        if (g->units) { /* powersgd: "offset numel rows cols" a matrix or vector (cols 0) */
            snprintf(path, sizeof path, "%s/units.txt", g->dump);
            f = fopenCheck(path, "w");
            const AdafactorUnit *u = (const AdafactorUnit *)g->units;
            for (int m = 0; m < g->num_units; m++) fprintf(f, "%zu %zu %zu %zu\n", u[m].off, u[m].numel, u[m].rows, u[m].cols);
            if (fclose(f) != 0) llmc_die("cannot write '%s'", path);
        }
    }
}

void gradcomp_free(GradComp *g) {
    if (current == g) current = NULL;
    if (g->residual) {
        mem_free(MEM_GRAD_COMP, g->residual, g->n * sizeof(float));
        mem_free(MEM_GRAD_COMP, g->payload, (size_t)g->dist->size * g->cap);
        if (g->hist) mem_free(MEM_GRAD_COMP, g->hist, 65536 * sizeof(uint32_t));
        if (g->q) mem_free(MEM_GRAD_COMP, g->q, (g->q_floats ? g->q_floats : 1) * sizeof(float));
        if (g->phat) mem_free(MEM_GRAD_COMP, g->phat, (g->p_floats ? g->p_floats : 1) * sizeof(float));
        free(g->units);
    }
    memset(g, 0, sizeof *g);
}

/* ---- the schemes ---- */
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static uint32_t mag_key(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7FFFFFFFu; /* |x|'s bits: ordered as |x| is */
}

/* topk: the bucket's K-th largest key (*thr) and how many elements with that key are sent (the
 * lowest indices first), by a radix select over the keys' two 16-bit halves. */
static void topk_threshold(uint32_t *hist, const float *x, const Bucket *b, size_t K, uint32_t *thr, size_t *take_eq) {
    memset(hist, 0, 65536 * sizeof *hist);
    for (int s = 0; s < b->n; s++)
        for (size_t i = b->off[s]; i < b->off[s] + b->len[s]; i++) hist[mag_key(x[i]) >> 16]++;
    size_t above = 0;
    int hi = 65535;
    for (; hi > 0 && above + hist[hi] < K; hi--) above += hist[hi];
    memset(hist, 0, 65536 * sizeof *hist);
    for (int s = 0; s < b->n; s++)
        for (size_t i = b->off[s]; i < b->off[s] + b->len[s]; i++) {
            uint32_t k = mag_key(x[i]);
            if ((int)(k >> 16) == hi) hist[k & 0xFFFFu]++;
        }
    int lo = 65535;
    for (; lo > 0 && above + hist[lo] < K; lo--) above += hist[lo];
    *thr = ((uint32_t)hi << 16) | (uint32_t)lo;
    *take_eq = K - above;
}

size_t gradcomp_compress(GradComp *g, float *x, unsigned char *out) {
    const size_t n = g->n;
    switch (g->spec.kind) {
    case GC_BF16: {
        uint16_t *h = (uint16_t *)out;
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)n; i++) {
            h[i] = to_bf16(x[i]);
            x[i] -= from_bf16(h[i]);
        }
        if (n % 2) h[n] = 0;
        return round4(n * 2);
    }
    case GC_INT8: {
        const size_t nch = (n + GC_INT8_CHUNK - 1) / GC_INT8_CHUNK;
        float *scale = (float *)out;
        int8_t *q = (int8_t *)(out + nch * 4);
#pragma omp parallel for schedule(static)
        for (long long c = 0; c < (long long)nch; c++) {
            const size_t a = (size_t)c * GC_INT8_CHUNK, e = a + GC_INT8_CHUNK < n ? a + GC_INT8_CHUNK : n;
            float mx = 0.0f;
            int bad = 0;
            for (size_t i = a; i < e; i++) mx = fmaxf(mx, fabsf(x[i])), bad |= !isfinite(x[i]);
            const float s = bad ? NAN : mx / 127.0f; /* non-finite: the chunk decodes to NaN (the loop skips the step) */
            scale[c] = s;
            for (size_t i = a; i < e; i++) {
                float r = s > 0.0f && !bad ? rintf(x[i] / s) : 0.0f;
                r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
                q[i] = (int8_t)r;
                x[i] -= (float)q[i] * s;
            }
        }
        for (size_t i = n; i < round4(n); i++) q[i] = 0;
        return nch * 4 + round4(n);
    }
    case GC_TOPK: {
        unsigned char *p = out;
        Bucket b;
        for (int k = 0; k < g->num_buckets; k++) {
            bucket_of_layer(&b, g->specs, g->num_specs, k - 1);
            if (!b.numel) continue;
            const size_t K = topk_count(g->spec.frac, b.numel);
            uint32_t thr;
            size_t take_eq;
            topk_threshold(g->hist, x, &b, K, &thr, &take_eq);
            for (int s = 0; s < b.n; s++)
                for (size_t i = b.off[s]; i < b.off[s] + b.len[s]; i++) {
                    const uint32_t key = mag_key(x[i]);
                    if (key < thr || (key == thr && !take_eq)) continue;
                    if (key == thr) take_eq--;
                    const uint32_t idx = (uint32_t)i;
                    memcpy(p, &idx, 4);
                    memcpy(p + 4, &x[i], 4);
                    p += 8;
                    x[i] = 0.0f; /* sent whole */
                }
        }
        return (size_t)(p - out);
    }
    default: llmc_die("internal: gradcomp_compress of scheme %d", g->spec.kind);
    }
}

/* The bytes every rank's payload takes this step (the same on every rank: it depends only on n
 * and the buckets). */
static size_t payload_bytes(const GradComp *g) {
    if (g->spec.kind != GC_TOPK) return gradcomp_payload_cap(&g->spec, g->n, g->max_buckets);
    size_t k = 0;
    Bucket b;
    for (int i = 0; i < g->num_buckets; i++) {
        bucket_of_layer(&b, g->specs, g->num_specs, i - 1);
        if (b.numel) k += topk_count(g->spec.frac, b.numel);
    }
    return k * 8;
}

void gradcomp_decompress_add(const GradComp *g, const unsigned char *payload, float *sum) {
    const size_t n = g->n;
    switch (g->spec.kind) {
    case GC_BF16: {
        const uint16_t *h = (const uint16_t *)payload;
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)n; i++) sum[i] += from_bf16(h[i]);
        return;
    }
    case GC_INT8: {
        const size_t nch = (n + GC_INT8_CHUNK - 1) / GC_INT8_CHUNK;
        const float *scale = (const float *)payload;
        const int8_t *q = (const int8_t *)(payload + nch * 4);
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)n; i++) sum[i] += (float)q[i] * scale[(size_t)i / GC_INT8_CHUNK];
        return;
    }
    case GC_TOPK: {
        const size_t pairs = payload_bytes(g) / 8;
        for (size_t j = 0; j < pairs; j++) {
            uint32_t idx;
            float v;
            memcpy(&idx, payload + 8 * j, 4);
            memcpy(&v, payload + 8 * j + 4, 4);
            if (idx >= n) llmc_die("rank %d: a compressed gradient names element %u of %zu", g->dist->rank, idx, n);
            sum[idx] += v;
        }
        return;
    }
    default: llmc_die("internal: gradcomp_decompress_add of scheme %d", g->spec.kind);
    }
}

/* LLMC_TEST_GRAD_COMP_DUMP: n floats appended to this rank's file (name: "" or "_q", powersgd's Q) */
static void dump_n(const GradComp *g, const char *name, const float *x, size_t n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/rank%d%s.bin", g->dump, g->dist->rank, name);
    FILE *f = fopenCheck(path, "ab");
    fwriteCheck(x, sizeof(float), n, f, path);
    if (fclose(f) != 0) llmc_die("cannot write '%s'", path);
}
static void dump_floats(const GradComp *g, const float *x) { dump_n(g, "", x, g->n); }

/* ---- powersgd ---- */
/* Gram-Schmidt over the r columns of p (rows x r, row-major); a column left of norm 0 (a zero
 * matrix, or dependent columns) stays 0 instead of dividing by it. */
static void orthogonalise(float *p, size_t rows, size_t r) {
    for (size_t k = 0; k < r; k++) {
        for (size_t j = 0; j < k; j++) {
            double dot = 0.0;
            for (size_t i = 0; i < rows; i++) dot += (double)p[i * r + j] * (double)p[i * r + k];
            for (size_t i = 0; i < rows; i++) p[i * r + k] -= (float)dot * p[i * r + j];
        }
        double ss = 0.0;
        for (size_t i = 0; i < rows; i++) ss += (double)p[i * r + k] * (double)p[i * r + k];
        const float inv = ss > 1e-30 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (size_t i = 0; i < rows; i++) p[i * r + k] = inv > 0.0f ? p[i * r + k] * inv : 0.0f;
    }
}

static void psgd_reduce(GradComp *g, float *x, float *grads) {
    Dist *d = g->dist;
    const AdafactorUnit *u = (const AdafactorUnit *)g->units;
    const int R = g->spec.rank, P = d->size;
    const size_t n1 = g->p_floats + g->vec_floats, n2 = g->q_floats;
    float *mine = (float *)g->payload + (size_t)d->rank * n1;
    /* phase 1: P = M Q of every matrix, then the vectors as they are */
    size_t po = 0, qo = 0, vo = g->p_floats;
    for (int m = 0; m < g->num_units; m++) {
        const float *M = x + u[m].off;
        if (!u[m].cols) {
            memcpy(mine + vo, M, u[m].numel * sizeof(float));
            vo += u[m].numel;
            continue;
        }
        const size_t rows = u[m].rows, cols = u[m].cols, r = psgd_r(R, &u[m]);
        const float *Q = g->q + qo;
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)rows; i++)
            for (size_t k = 0; k < r; k++) {
                float acc = 0.0f;
                for (size_t j = 0; j < cols; j++) acc += M[(size_t)i * cols + j] * Q[j * r + k];
                mine[po + (size_t)i * r + k] = acc;
            }
        po += rows * r, qo += cols * r;
    }
    dist_allgather_bytes(d, g->payload, n1 * 4);
    memset(grads, 0, g->n * sizeof(float));
    memset(g->phat, 0, g->p_floats * sizeof(float));
    for (int rk = 0; rk < P; rk++) { /* summed in rank order */
        const float *t = (const float *)g->payload + (size_t)rk * n1;
        for (size_t i = 0; i < g->p_floats; i++) g->phat[i] += t[i];
        vo = g->p_floats;
        for (int m = 0; m < g->num_units; m++)
            if (!u[m].cols) {
                for (size_t i = 0; i < u[m].numel; i++) grads[u[m].off + i] += t[vo + i];
                vo += u[m].numel;
            }
    }
    po = 0;
    for (int m = 0; m < g->num_units; m++)
        if (u[m].cols) orthogonalise(g->phat + po, u[m].rows, psgd_r(R, &u[m])), po += u[m].rows * psgd_r(R, &u[m]);
    /* phase 2: Q = M^T P^ of every matrix */
    mine = (float *)g->payload + (size_t)d->rank * n2;
    po = qo = 0;
    for (int m = 0; m < g->num_units; m++) {
        if (!u[m].cols) continue;
        const float *M = x + u[m].off, *Ph = g->phat + po;
        const size_t rows = u[m].rows, cols = u[m].cols, r = psgd_r(R, &u[m]);
#pragma omp parallel for schedule(static)
        for (long long j = 0; j < (long long)cols; j++)
            for (size_t k = 0; k < r; k++) {
                float acc = 0.0f;
                for (size_t i = 0; i < rows; i++) acc += M[i * cols + (size_t)j] * Ph[i * r + k];
                mine[qo + (size_t)j * r + k] = acc;
            }
        po += rows * r, qo += cols * r;
    }
    dist_allgather_bytes(d, g->payload, n2 * 4);
    memset(g->q, 0, g->q_floats * sizeof(float));
    for (int rk = 0; rk < P; rk++) {
        const float *t = (const float *)g->payload + (size_t)rk * n2;
        for (size_t i = 0; i < g->q_floats; i++) g->q[i] += t[i];
    }
    /* the sum P^ Q^T; this rank's residual M - P^ Q_rank^T; the vectors were sent whole */
    po = qo = 0;
    for (int m = 0; m < g->num_units; m++) {
        float *M = x + u[m].off, *G = grads + u[m].off;
        if (!u[m].cols) {
            memset(M, 0, u[m].numel * sizeof(float));
            continue;
        }
        const size_t rows = u[m].rows, cols = u[m].cols, r = psgd_r(R, &u[m]);
        const float *Ph = g->phat + po, *Q = g->q + qo, *Qr = mine + qo;
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)rows; i++)
            for (size_t j = 0; j < cols; j++) {
                float s = 0.0f, own = 0.0f;
                for (size_t k = 0; k < r; k++) {
                    s += Ph[(size_t)i * r + k] * Q[j * r + k];
                    own += Ph[(size_t)i * r + k] * Qr[j * r + k];
                }
                G[(size_t)i * cols + j] = s;
                M[(size_t)i * cols + j] -= own;
            }
        po += rows * r, qo += cols * r;
    }
}

void gradcomp_reduce(GradComp *g, float *grads) {
    Dist *d = g->dist;
    if (g->spec.kind == GC_POWERSGD) {
        if (g->dump) dump_floats(g, grads), dump_floats(g, g->residual), dump_n(g, "_q", g->q, g->q_floats);
        float *x = g->residual;
        if (g->no_residual) memset(x, 0, g->n * sizeof(float));
        for (size_t i = 0; i < g->n; i++) x[i] += grads[i];
        if (g->zero_unit >= 0) { /* tests: the zero_unit-th matrix's gradient all zero */
            const AdafactorUnit *u = (const AdafactorUnit *)g->units;
            for (int m = 0, k = 0; m < g->num_units; m++)
                if (u[m].cols && k++ == g->zero_unit) memset(x + u[m].off, 0, u[m].numel * sizeof(float));
        }
        psgd_reduce(g, x, grads);
        for (size_t i = 0; i < g->n; i++)
            if (!isfinite(x[i])) x[i] = 0.0f;
        if (g->dump) dump_floats(g, g->residual), dump_floats(g, grads), dump_n(g, "_q", g->q, g->q_floats);
        return;
    }
    const size_t n = g->n, bytes = payload_bytes(g);
    if (bytes > g->cap) llmc_die("internal: a compressed gradient of %zu bytes exceeds its buffer of %zu", bytes, g->cap);
    if (g->dump) dump_floats(g, grads), dump_floats(g, g->residual); /* per step: gradient, residual, residual after, sum */
    float *x = g->residual; /* x = gradient + residual, in the residual's buffer; the compressor leaves the new residual */
    if (g->no_residual) memset(x, 0, n * sizeof(float));
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) x[i] += grads[i];
    gradcomp_compress(g, x, g->payload + (size_t)d->rank * bytes); /* (the runs back to back) */
    /* a non-finite gradient is sent as it is (the loop then skips the step); it must not stay in
     * the residual and poison every later step */
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++)
        if (!isfinite(x[i])) x[i] = 0.0f;
    dist_allgather_bytes(d, g->payload, bytes);
    memset(grads, 0, n * sizeof(float));
    for (int r = 0; r < d->size; r++) gradcomp_decompress_add(g, g->payload + (size_t)r * bytes, grads);
    if (g->dump) dump_floats(g, g->residual), dump_floats(g, grads);
}

void gradcomp_print_memory(const GradComp *g, FILE *out) {
    const double MiB = 1048576.0;
    const size_t res = g->residual ? g->n * sizeof(float) : 0,
                 all = g->spec.kind == GC_POWERSGD ? psgd_bytes(g->n, g->q_floats, g->p_floats, g->vec_floats, g->dist->size)
                                                   : gradcomp_memory_bytes(&g->spec, g->n, g->max_buckets, g->dist->size);
    char scheme[48];
    if (g->spec.kind == GC_TOPK) snprintf(scheme, sizeof scheme, "topk:%g", (double)g->spec.frac);
    else if (g->spec.kind == GC_POWERSGD) snprintf(scheme, sizeof scheme, "powersgd:%d", g->spec.rank);
    else snprintf(scheme, sizeof scheme, "%s", gradcomp_name(g->spec.kind));
    if (!g->residual) {
        fprintf(out, "note: --grad-compression %s with one process: nothing to communicate, the gradients are used "
                     "uncompressed (no residual)\n", scheme);
        return;
    }
    const size_t pay = (size_t)g->dist->size * g->cap, factors = all - res - pay; /* powersgd: Q and P */
    char extra[96] = "";
    if (g->q) snprintf(extra, sizeof extra, ", PowerSGD Q and P %zu bytes", factors);
    fprintf(out, "gradient compression (per rank, --grad-compression %s): error-feedback residual %zu bytes (%.1f MiB), "
                 "payloads %zu bytes (%.1f MiB: %d ranks x %zu)%s, %zu bytes sent per step\n",
            scheme, res, res / MiB, pay, pay / MiB, g->dist->size, g->cap, extra,
            (g->spec.kind == GC_POWERSGD ? 4 * (g->p_floats + g->vec_floats + g->q_floats) : payload_bytes(g)) *
                (size_t)(g->dist->size - 1));
}
