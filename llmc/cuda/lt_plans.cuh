/*
 * lt_plans.cuh - one cuBLASLt plan per matmul shape: descriptors built once, the algorithm
 * chosen once by timing the heuristic's top candidates, the choice remembered in a file.
 *
 * A matmul shape seen before reuses its plan: no descriptor creation and no heuristic query per
 * call. A new shape asks the heuristic for up to ctx->lt_algos candidates (--matmul-algos); with
 * more than one, each runs once to warm up and LT_TUNE_REPS times between CUDA events, and the
 * fastest is kept. Candidates write into the real output only when that cannot change a result
 * (beta == 0 and no overlap with an input); otherwise into temporary buffers, so tuning never
 * alters the numbers of the call that triggered it. One line per tuned shape says what was chosen.
 *
 * Reproducibility: algorithms round differently, and timing can rank near-equal candidates either
 * way. The choices are therefore written to a cache file (ctx->lt_cache_path: --matmul-cache, by
 * default <-o>/matmul_algos.txt) each time a shape is tuned, and read back at start, so a resumed
 * run uses exactly the algorithms its first part used. The file records the GPU and the cuBLASLt
 * version; a file from another GPU or version is ignored with a note, a malformed one is an error.
 *
 * File format (text): "llmc-matmul-algos 1", "gpu <device name>", "cublaslt <version>", then one
 * line per shape: the LtKey fields in declaration order, then the 8 words of cublasLtMatmulAlgo_t
 * in hex.
 */
#ifndef LLMC_CUDA_LT_PLANS_CUH
#define LLMC_CUDA_LT_PLANS_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/atomicfile.h"
#include "llmc/cuda/common.cuh"

enum { LT_TUNE_REPS = 5, LT_MAX_ALGOS = 64, LT_KEY_FIELDS = 16 };

/* Everything that selects descriptors and algorithm: types, ops, sizes, leading dimensions,
 * epilogue and the pointer alignments the heuristic was told (pointers themselves vary per call). */
typedef struct {
    int type, compute, transa, transb, m, n, k, lda, ldb, ldd, epilogue, has_bias, ldaux;
    int align_a, align_b, align_d;
} LtKey;

typedef struct {
    LtKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int have_algo; /* from the cache file, not yet checked against this process's descriptors */
} LtPlan;

struct LtPlanCache {
    LtPlan *plans;
    int count, capacity;
    char gpu[256];
    size_t version;
};

static inline int lt_key_equal(const LtKey *a, const LtKey *b) { return memcmp(a, b, sizeof *a) == 0; }

static inline const char *lt_epilogue_name(int e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "bias+gelu";
    case CUBLASLT_EPILOGUE_DGELU: return "dgelu";
    case CUBLASLT_EPILOGUE_BGRADB: return "bgradb";
    default: return "other";
    }
}

static inline const char *lt_type_name(int type) {
    return type == CUDA_R_32F ? "fp32" : type == CUDA_R_16BF ? "bf16" : type == CUDA_R_16F ? "fp16" : "?";
}

static inline size_t lt_type_bytes(int type) { return type == CUDA_R_32F ? 4 : 2; }

static void lt_plans_free(struct LtPlanCache *c) {
    if (!c) return;
    for (int i = 0; i < c->count; i++) {
        LtPlan *p = &c->plans[i];
        if (!p->op) continue;
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->ld);
        cublasLtMatmulDescDestroy(p->op);
    }
    free(c->plans);
    free(c);
}

static LtPlan *lt_plan_add(struct LtPlanCache *c, const LtKey *key) {
    if (c->count == c->capacity) {
        c->capacity = c->capacity ? 2 * c->capacity : 32;
        c->plans = (LtPlan *)realloc(c->plans, (size_t)c->capacity * sizeof(LtPlan));
        if (!c->plans) llmc_die("out of host memory for the matmul plans");
    }
    LtPlan *p = &c->plans[c->count++];
    memset(p, 0, sizeof *p);
    p->key = *key;
    return p;
}

/* Reads the cache file if it exists. Another GPU's or cuBLASLt version's file: a note, ignored. */
static void lt_cache_load(struct LtPlanCache *c, const char *path, FILE *log) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[1024];
    int lineno = 0, ok = 1;
    char gpu[256] = "";
    size_t version = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = '\0';
        else if (!feof(f)) llmc_die("matmul cache %s line %d: longer than %d characters", path, lineno, (int)sizeof line - 2);
        if (lineno == 1) {
            if (strcmp(line, "llmc-matmul-algos 1") != 0)
                llmc_die("matmul cache %s: not a matmul algorithm file (first line '%s', expected "
                         "'llmc-matmul-algos 1'); delete it or give another --matmul-cache", path, line);
        } else if (lineno == 2) {
            if (strncmp(line, "gpu ", 4) != 0) llmc_die("matmul cache %s line 2: expected 'gpu <name>'", path);
            snprintf(gpu, sizeof gpu, "%.255s", line + 4);
        } else if (lineno == 3) {
            char end;
            if (sscanf(line, "cublaslt %zu%c", &version, &end) != 1)
                llmc_die("matmul cache %s line 3: expected 'cublaslt <version>'", path);
            if (strcmp(gpu, c->gpu) != 0 || version != c->version) {
                if (log)
                    fprintf(log, "note: matmul cache %s is for %s with cuBLASLt %zu, not %s with cuBLASLt %zu: retuning\n", path,
                       gpu, version, c->gpu, c->version);
                ok = 0;
                break;
            }
        } else {
            LtKey k;
            int *v = &k.type;
            unsigned long long w[8];
            char end;
            int n = sscanf(line, "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %llx %llx %llx %llx %llx %llx %llx %llx%c",
                           &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
                           &v[12], &v[13], &v[14], &v[15], &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &end);
            if (n != LT_KEY_FIELDS + 8)
                llmc_die("matmul cache %s line %d: expected %d integers and 8 hex words, got '%s'", path, lineno,
                         LT_KEY_FIELDS, line);
            LtPlan *p = lt_plan_add(c, &k);
            for (int i = 0; i < 8; i++) p->algo.data[i] = (uint64_t)w[i];
            p->have_algo = 1;
        }
    }
    fclose(f);
    if (lineno == 0) llmc_die("matmul cache %s is empty; delete it or give another --matmul-cache", path);
    if (ok && lineno < 3) llmc_die("matmul cache %s: truncated header (%d lines)", path, lineno);
    if (!ok) {
        for (int i = 0; i < c->count; i++) c->plans[i].have_algo = 0;
        c->count = 0;
    }
}

static void lt_cache_save(const struct LtPlanCache *c, const char *path) {
    AtomicFile af;
    atomic_open(&af, path);
    fprintf(af.f, "llmc-matmul-algos 1\ngpu %s\ncublaslt %zu\n", c->gpu, c->version);
    for (int i = 0; i < c->count; i++) {
        const LtPlan *p = &c->plans[i];
        if (!p->have_algo) continue;
        const int *v = &p->key.type;
        for (int j = 0; j < LT_KEY_FIELDS; j++) fprintf(af.f, "%d ", v[j]);
        for (int j = 0; j < 8; j++) fprintf(af.f, j < 7 ? "%llx " : "%llx\n", (unsigned long long)p->algo.data[j]);
    }
    if (ferror(af.f)) llmc_die("cannot write the matmul cache %s", af.tmp_path);
    atomic_commit(&af);
}

static struct LtPlanCache *lt_plans_of(CudaContext *ctx) {
    if (ctx->lt_plans) return ctx->lt_plans;
    struct LtPlanCache *c = (struct LtPlanCache *)calloc(1, sizeof *c);
    if (!c) llmc_die("out of host memory for the matmul plans");
    snprintf(c->gpu, sizeof c->gpu, "%s", ctx->props.name);
    c->version = cublasLtGetVersion();
    if (ctx->lt_cache_path[0]) lt_cache_load(c, ctx->lt_cache_path, ctx->lt_log);
    ctx->lt_plans = c;
    ctx->lt_plans_free = lt_plans_free;
    return c;
}

/* Byte ranges [p, p + n) that share an address. */
static inline int lt_overlap(const void *p, size_t n, const void *q, size_t m) {
    if (!p || !q) return 0;
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + m && b < a + n;
}

typedef struct {
    const void *A, *B, *bias;
    void *D, *aux;
    float beta;
} LtArgs;

static cublasStatus_t lt_run(const CudaContext *ctx, LtPlan *p, const cublasLtMatmulAlgo_t *algo, const LtArgs *x) {
    if (x->bias)
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &x->bias, sizeof x->bias));
    if (x->aux)
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x->aux, sizeof x->aux));
    const float alpha = 1.0f;
    return cublasLtMatmul(ctx->lt, p->op, &alpha, x->A, p->la, x->B, p->lb, &x->beta, x->D, p->ld, x->D, p->ld, algo,
                          ctx->lt_workspace, ctx->lt_workspace_bytes, ctx->stream);
}

/* Times the candidates on copies where needed; returns the index of the fastest that ran. */
static int lt_tune(const CudaContext *ctx, LtPlan *p, const cublasLtMatmulHeuristicResult_t *cand, int n,
                   const LtArgs *x, float *ms) {
    const LtKey *k = &p->key;
    const size_t e = lt_type_bytes(k->type);
    const size_t a_bytes = (size_t)k->lda * (k->transa ? k->m : k->k) * e;
    const size_t b_bytes = (size_t)k->ldb * (k->transb ? k->k : k->n) * e;
    const size_t d_bytes = (size_t)k->ldd * k->n * e, aux_bytes = (size_t)k->ldaux * k->n * e;
    const int aux_written = k->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || k->epilogue == CUBLASLT_EPILOGUE_GELU_AUX;
    /* D is read when beta != 0; written outputs must not feed an input of a later candidate */
    int d_copy = x->beta != 0.0f || lt_overlap(x->D, d_bytes, x->A, a_bytes) || lt_overlap(x->D, d_bytes, x->B, b_bytes) ||
                 (!aux_written && lt_overlap(x->D, d_bytes, x->aux, aux_bytes));
    int aux_copy = aux_written && (lt_overlap(x->aux, aux_bytes, x->A, a_bytes) || lt_overlap(x->aux, aux_bytes, x->B, b_bytes));
    LtArgs t = *x;
    if (d_copy) {
        t.D = devalloc_malloc(ctx->alloc, MEM_WORKSPACE, d_bytes); /* (freed below: never live past the tuning) */
        if (x->beta != 0.0f) cudaCheck(cudaMemcpyAsync(t.D, x->D, d_bytes, cudaMemcpyDeviceToDevice, ctx->stream));
    }
    if (aux_copy) t.aux = devalloc_malloc(ctx->alloc, MEM_WORKSPACE, aux_bytes);
    /* beta != 0 accumulates into the copy on every run; the values are irrelevant to the timing */
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    int best = -1;
    for (int i = 0; i < n; i++) {
        ms[i] = -1.0f;
        if (lt_run(ctx, p, &cand[i].algo, &t) != CUBLAS_STATUS_SUCCESS) continue; /* warm-up; skip what cannot run */
        cudaCheck(cudaEventRecord(start, ctx->stream));
        for (int r = 0; r < LT_TUNE_REPS; r++) cublasCheck(lt_run(ctx, p, &cand[i].algo, &t));
        cudaCheck(cudaEventRecord(stop, ctx->stream));
        cudaCheck(cudaEventSynchronize(stop));
        cudaCheck(cudaEventElapsedTime(&ms[i], start, stop));
        ms[i] /= LT_TUNE_REPS;
        if (best < 0 || ms[i] < ms[best]) best = i;
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    if (d_copy) devalloc_free(ctx->alloc, t.D);
    if (aux_copy) devalloc_free(ctx->alloc, t.aux);
    return best;
}

static inline void lt_print_choice(FILE *log, const LtPlan *p, int best, int n, const float *ms) {
    const LtKey *k = &p->key;
    int id = -1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
    fprintf(log, "matmul %s m=%d n=%d k=%d op(%c,%c) epilogue %s: candidate %d of %d (algo id %d), %.4f ms; "
           "heuristic's first %.4f ms\n",
           lt_type_name(k->type), k->m, k->n, k->k, k->transa ? 'T' : 'N', k->transb ? 'T' : 'N',
           lt_epilogue_name(k->epilogue), best + 1, n, id, (double)ms[best], (double)ms[0]);
}

/* The plan for this call's shape, built (and tuned, on its first call) as needed. */
static LtPlan *lt_plan_for(CudaContext *ctx, const LtKey *key, const LtArgs *x) {
    struct LtPlanCache *c = lt_plans_of(ctx);
    LtPlan *p = NULL;
    for (int i = 0; i < c->count; i++)
        if (lt_key_equal(&c->plans[i].key, key)) p = &c->plans[i];
    if (p && p->op) return p;
    if (!p) p = lt_plan_add(c, key);

    const cudaDataType_t type = (cudaDataType_t)key->type;
    cublasCheck(cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)key->compute, CUDA_R_32F));
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = (cublasLtEpilogue_t)key->epilogue;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    /* the heuristic reads the bias and aux pointers, so they are set before it runs */
    if (key->has_bias) {
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &x->bias, sizeof x->bias));
    }
    if (key->ldaux) {
        int64_t ld = key->ldaux;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &type, sizeof type));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x->aux, sizeof x->aux));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, type, key->transa ? key->k : key->m, key->transa ? key->m : key->k, key->lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, type, key->transb ? key->n : key->k, key->transb ? key->k : key->n, key->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, type, key->m, key->n, key->ldd));

    if (p->have_algo) { /* from the cache file: used when cuBLASLt confirms it fits these descriptors */
        cublasLtMatmulHeuristicResult_t check;
        if (cublasLtMatmulAlgoCheck(ctx->lt, p->op, p->la, p->lb, p->ld, p->ld, &p->algo, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= ctx->lt_workspace_bytes)
            return p;
        if (ctx->lt_log)
            fprintf(ctx->lt_log, "note: matmul cache %s: the algorithm for m=%d n=%d k=%d no longer fits; retuning\n", ctx->lt_cache_path,
               key->m, key->n, key->k);
    }
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx->lt_workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* The heuristic never sees A, B, C, D: it assumes they are 256-byte aligned unless told
     * otherwise (MIN_ALIGNMENT_*_BYTES, default 256), and may pick an algorithm that
     * cublasLtMatmul then cannot run on less aligned pointers. Ours are per-layer slices and are
     * only guaranteed 16-byte aligned (e.g. C = 1600 with an odd B*T), so state the real alignment
     * (it is part of the key). */
    const uint32_t align[3] = {(uint32_t)key->align_a, (uint32_t)key->align_b, (uint32_t)key->align_d};
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof align[0]));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof align[1]));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof align[2]));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof align[2]));
    cublasLtMatmulHeuristicResult_t cand[LT_MAX_ALGOS];
    int found = 0, want = ctx->lt_algos < 1 ? 1 : ctx->lt_algos > LT_MAX_ALGOS ? LT_MAX_ALGOS : ctx->lt_algos;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, want, cand, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0)
        llmc_check_failed("cublasLtMatmulAlgoGetHeuristic", "no algorithm for this matmul",
                          "HINT: unsupported combination of type, epilogue and leading dimensions "
                          "(GELU epilogues need the output width to be a multiple of 8)",
                          __func__, __FILE__, __LINE__);
    int best = 0;
    if (found > 1) {
        float ms[LT_MAX_ALGOS];
        best = lt_tune(ctx, p, cand, found, x, ms);
        if (best < 0) llmc_die("matmul m=%d n=%d k=%d: none of cuBLASLt's %d candidate algorithms ran", key->m, key->n, key->k, found);
        p->algo = cand[best].algo;
        if (ctx->lt_log) lt_print_choice(ctx->lt_log, p, best, found, ms);
    } else {
        p->algo = cand[0].algo;
    }
    p->have_algo = 1;
    if (ctx->lt_cache_path[0]) lt_cache_save(c, ctx->lt_cache_path);
    return p;
}

#endif
