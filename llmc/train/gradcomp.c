/* gradcomp.c - compressed gradient communication with error feedback (gradcomp.h).
 * No fused multiply-adds: every product and sum rounded on its own, as numpy's float32 does, so
 * that dev/reference/grad_compression.py gives the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "llmc/train/gradcomp.h"
#include "llmc/core/check.h"
#include "llmc/core/mem.h"

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

void gradcomp_init(GradComp *g, const GradCompSpec *spec, Dist *d, size_t n, const TensorSpec *specs, int num_specs,
                   int max_buckets) {
    memset(g, 0, sizeof *g);
    g->spec = *spec, g->dist = d, g->n = n, g->specs = specs, g->num_specs = num_specs;
    g->num_buckets = count_buckets(specs, num_specs);
    g->max_buckets = max_buckets;
    if (g->num_buckets > max_buckets) llmc_die("internal: %d gradient buckets, planned for %d", g->num_buckets, max_buckets);
    if (spec->kind == GC_POWERSGD) llmc_die("flag --grad-compression powersgd:%d is not built yet (none, bf16, int8, topk:FRAC)", spec->rank);
    if (spec->kind == GC_TOPK && n > 0xFFFFFFFFu)
        llmc_die("flag --grad-compression topk: %zu parameters exceed the 32-bit indices it sends", n);
    const char *e = getenv("LLMC_TEST_GRAD_COMP_NO_RESIDUAL");
    g->no_residual = e && atoi(e) == 1;
    if (spec->kind == GC_NONE || d->size <= 1) return; /* (one process: nothing to send) */
    g->cap = gradcomp_payload_cap(spec, n, max_buckets);
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
    }
}

void gradcomp_free(GradComp *g) {
    if (current == g) current = NULL;
    if (g->residual) {
        mem_free(MEM_GRAD_COMP, g->residual, g->n * sizeof(float));
        mem_free(MEM_GRAD_COMP, g->payload, (size_t)g->dist->size * g->cap);
        if (g->hist) mem_free(MEM_GRAD_COMP, g->hist, 65536 * sizeof(uint32_t));
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

/* LLMC_TEST_GRAD_COMP_DUMP: n floats appended to this rank's file */
static void dump_floats(const GradComp *g, const float *x) {
    char path[1200];
    snprintf(path, sizeof path, "%s/rank%d.bin", g->dump, g->dist->rank);
    FILE *f = fopenCheck(path, "ab");
    fwriteCheck(x, sizeof(float), g->n, f, path);
    if (fclose(f) != 0) llmc_die("cannot write '%s'", path);
}

void gradcomp_reduce(GradComp *g, float *grads) {
    Dist *d = g->dist;
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
    const size_t res = g->residual ? g->n * sizeof(float) : 0, all = gradcomp_memory_bytes(&g->spec, g->n, g->max_buckets, g->dist->size);
    char scheme[48];
    if (g->spec.kind == GC_TOPK) snprintf(scheme, sizeof scheme, "topk:%g", (double)g->spec.frac);
    else snprintf(scheme, sizeof scheme, "%s", gradcomp_name(g->spec.kind));
    if (!g->residual) {
        fprintf(out, "note: --grad-compression %s with one process: nothing to communicate, the gradients are used "
                     "uncompressed (no residual)\n", scheme);
        return;
    }
    fprintf(out, "gradient compression (per rank, --grad-compression %s): error-feedback residual %zu bytes (%.1f MiB), "
                 "payloads %zu bytes (%.1f MiB: %d ranks x %zu), %zu bytes sent per step\n",
            scheme, res, res / MiB, all - res, (all - res) / MiB, g->dist->size, g->cap,
            payload_bytes(g) * (size_t)(g->dist->size - 1));
}
