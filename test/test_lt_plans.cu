/*
 * test_lt_plans.cu - the cuBLASLt plan cache and algorithm tuning (llmc/cuda/lt_plans.cuh).
 *
 * Run through cudasim with CUDASIM_LT_ALGOS=4 CUDASIM_LT_SLOW_ALGO=0: the heuristic offers four
 * candidates that compute the same product, the first of them 20 ms slower per call. Checks:
 *   - tuning keeps a fast candidate (never the slow one) and prints one line per new shape;
 *   - tuning never changes a result: every op's outputs (overwritten ones, the accumulated weight
 *     and bias gradients, the GELU pre-activation) are bit-identical to the untuned run's, so a
 *     candidate that ran into the real accumulator (beta = 1) would be caught;
 *   - a second call of a shape reuses its plan (no second tuning line);
 *   - the cache file: written on tuning, read back by a new context (no tuning, same results);
 *     another GPU's file is ignored with a note; an algorithm this library never returned is
 *     retuned with a note; a file that is not a cache, or a malformed line, is an error naming
 *     the file (exit 1, checked in a child process).
 * Usage: CUDASIM_LT_ALGOS=4 CUDASIM_LT_SLOW_ALGO=0 test_lt_plans
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "llmc/cuda/matmul.cuh"
#include "llmc/core/rng.h"
#include "test/testing.h"

enum { N = 24, C = 40, OC = 72 };

/* Everything the four matmul entry points write, as host bytes. */
typedef struct {
    unsigned char *bytes;
    size_t len;
} Outputs;

template <class T> static T *dev_random(Rng *r, size_t n, float scale) {
    float *h = (float *)malloc(n * sizeof(float));
    rng_normal(r, h, n, 0.0f, scale);
    T *t = (T *)malloc(n * sizeof(T));
    for (size_t i = 0; i < n; i++) t[i] = from_float<T>(h[i]);
    T *d;
    cudaCheck(cudaMalloc(&d, n * sizeof(T)));
    cudaCheck(cudaMemcpy(d, t, n * sizeof(T), cudaMemcpyHostToDevice));
    free(h);
    free(t);
    return d;
}

static void append(Outputs *o, const void *dev, size_t bytes) {
    o->bytes = (unsigned char *)realloc(o->bytes, o->len + bytes);
    cudaCheck(cudaMemcpy(o->bytes + o->len, dev, bytes, cudaMemcpyDeviceToHost));
    o->len += bytes;
}

/* Runs forward (bias), forward+GELU, backward (dweight/dbias accumulate) and backward+DGELU twice
 * each on fixed random data (seed 1234) in context ctx; returns all outputs. */
template <class T> static Outputs run_ops(CudaContext *ctx) {
    Rng r;
    rng_seed(&r, 1234);
    T *inp = dev_random<T>(&r, (size_t)N * C, 1.0f), *w = dev_random<T>(&r, (size_t)OC * C, 0.2f);
    T *bias = dev_random<T>(&r, OC, 0.1f), *dout = dev_random<T>(&r, (size_t)N * OC, 1.0f);
    T *dw = dev_random<T>(&r, (size_t)OC * C, 1.0f), *db = dev_random<T>(&r, OC, 1.0f);
    T *pre_c = dev_random<T>(&r, (size_t)N * C, 1.0f);
    T *out, *pre, *act, *dinp;
    cudaCheck(cudaMalloc(&out, (size_t)N * OC * sizeof(T)));
    cudaCheck(cudaMalloc(&pre, (size_t)N * OC * sizeof(T)));
    cudaCheck(cudaMalloc(&act, (size_t)N * OC * sizeof(T)));
    cudaCheck(cudaMalloc(&dinp, (size_t)N * C * sizeof(T)));
    float *scratch;
    cudaCheck(cudaMalloc(&scratch, matmul_backward_scratch_floats(N, OC) * sizeof(float)));
    Outputs o = {NULL, 0};
    for (int rep = 0; rep < 2; rep++) {
        matmul_forward(out, inp, w, bias, N, C, OC, ctx);
        append(&o, out, (size_t)N * OC * sizeof(T));
        matmul_forward_gelu(act, pre, inp, w, bias, N, C, OC, ctx);
        append(&o, act, (size_t)N * OC * sizeof(T));
        append(&o, pre, (size_t)N * OC * sizeof(T));
        matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, scratch, ctx);
        append(&o, dinp, (size_t)N * C * sizeof(T));
        append(&o, dw, (size_t)OC * C * sizeof(T));
        append(&o, db, (size_t)OC * sizeof(T));
        matmul_backward_dgelu(dinp, dw, db, dout, inp, w, pre_c, N, C, OC, scratch, ctx);
        append(&o, dinp, (size_t)N * C * sizeof(T));
        append(&o, dw, (size_t)OC * C * sizeof(T));
    }
    void *all[] = {inp, w, bias, dout, dw, db, pre_c, out, pre, act, dinp, scratch};
    for (void *p : all) cudaCheck(cudaFree(p));
    return o;
}

/* A context whose tuning lines go to a temporary file (returned in *log). */
static void context(CudaContext *ctx, int algos, const char *cache, FILE **log) {
    cuda_context_init(ctx, 0, 0);
    ctx->lt_algos = algos;
    *log = tmpfile();
    ctx->lt_log = *log;
    snprintf(ctx->lt_cache_path, sizeof ctx->lt_cache_path, "%s", cache ? cache : "");
}

static char *slurp(FILE *f) {
    fflush(f);
    long n = ftell(f);
    char *s = (char *)calloc((size_t)n + 1, 1);
    rewind(f);
    if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
    return s;
}

static int count_lines(const char *s, const char *prefix) {
    int n = 0;
    size_t len = strlen(prefix);
    for (const char *p = s; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, len) == 0) n++;
    return n;
}

static int same(const Outputs &a, const Outputs &b) { return a.len == b.len && a.len && memcmp(a.bytes, b.bytes, a.len) == 0; }

/* run_ops in c, a new context (context()'s algos and cache); *text, unless text is NULL: what c
 * printed (the caller frees it). */
template <class T> static Outputs run_in(CudaContext *c, int algos, const char *cache, char **text) {
    FILE *log;
    context(c, algos, cache, &log);
    Outputs o = run_ops<T>(c);
    if (text) *text = slurp(log);
    return o;
}

/* Edits the cache file with a sed script, then run_in a tuning context (4 candidates) reading it. */
template <class T> static Outputs run_edited_cache(CudaContext *c, const char *cache, const char *sed_script, char **text) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "sed -i '%s' %s", sed_script, cache);
    if (system(cmd) != 0) test_report(0, "sed", "could not edit %s", cache);
    return run_in<T>(c, 4, cache, text);
}

/* The shapes run_ops uses: forward, forward+GELU, backward's dinp, backward+DGELU's dinp, and the
 * dweight product both backwards share. */
enum { SHAPES = 5 };

template <class T> static void test_precision(const char *dir) {
    const char *p = StorageInfo<T>::name;
    char name[256], cache[1024];
    CudaContext c1, c4;
    char *untuned, *text;
    Outputs base = run_in<T>(&c1, 1, NULL, &untuned);
    Outputs tuned = run_in<T>(&c4, 4, NULL, &text);
    snprintf(name, sizeof name, "%s: tuning keeps the results bit-identical (%zu bytes of outputs)", p, base.len);
    test_report(same(base, tuned), name, "outputs differ from the untuned run's");
    snprintf(name, sizeof name, "%s: one tuning line per shape, none choosing the slow candidate", p);
    test_report(count_lines(text, "matmul ") == SHAPES && !strstr(text, "candidate 1 of 4"), name,
                "expected %d lines without 'candidate 1 of 4':\n%s", SHAPES, text);
    snprintf(name, sizeof name, "%s: --matmul-algos 1 tunes nothing and prints nothing", p);
    test_report(untuned[0] == '\0', name, "printed:\n%s", untuned);
    free(text);
    free(untuned);

    /* the cache file: written by a tuning context, read by the next one */
    snprintf(cache, sizeof cache, "%s/algos_%s.txt", dir, p);
    CudaContext cw, cr;
    Outputs written = run_in<T>(&cw, 4, cache, NULL);
    Outputs reread = run_in<T>(&cr, 4, cache, &text);
    FILE *f = fopen(cache, "r");
    char line[1024];
    int lines = 0;
    while (f && fgets(line, sizeof line, f)) lines++;
    if (f) fclose(f);
    snprintf(name, sizeof name, "%s: the cache file holds a header and one line per shape", p);
    test_report(lines == 3 + SHAPES, name, "%d lines in %s", lines, cache);
    snprintf(name, sizeof name, "%s: a context reading the cache tunes nothing and computes the same", p);
    test_report(text[0] == '\0' && same(written, reread) && same(base, reread), name, "printed:\n%s", text);
    free(text);

    /* another GPU's file: a note, then tuning as if there were none */
    CudaContext co;
    Outputs o2 = run_edited_cache<T>(&co, cache, "s/^gpu .*/gpu Some Other GPU/", &text);
    snprintf(name, sizeof name, "%s: another GPU's cache file is ignored with a note and retuned", p);
    test_report(strstr(text, "is for Some Other GPU") && count_lines(text, "matmul ") == SHAPES && same(base, o2), name,
                "printed:\n%s", text);
    free(text);

    /* an algorithm the library never returned (a stale file): AlgoCheck refuses it, retuned */
    CudaContext cs;
    Outputs o3 = run_edited_cache<T>(&cs, cache, "4s/6c6c6d6373696d/1234/", &text);
    snprintf(name, sizeof name, "%s: a cached algorithm that no longer fits is retuned with a note", p);
    test_report(strstr(text, "no longer fits") && count_lines(text, "matmul ") == 1 && same(base, o3), name,
                "printed:\n%s", text);
    free(text);
    CudaContext *all[] = {&c1, &c4, &cw, &cr, &co, &cs};
    for (CudaContext *c : all) cuda_context_free(c);
    free(base.bytes), free(tuned.bytes), free(written.bytes), free(reread.bytes), free(o2.bytes), free(o3.bytes);
}

/* A cache file with these contents makes the first matmul die (exit 1) with a message naming it. */
static void expect_error(const char *dir, const char *what, const char *contents, const char *message) {
    char path[1024], name[256];
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    FILE *f = fopen(path, "w");
    fputs(contents, f);
    fclose(f);
    int fd[2];
    if (pipe(fd) != 0) return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        CudaContext c;
        FILE *log;
        context(&c, 4, path, &log);
        Outputs o = run_ops<float>(&c);
        (void)o;
        _exit(0);
    }
    close(fd[1]);
    char buf[4096] = "";
    size_t got = 0;
    ssize_t n;
    while ((n = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)n;
    buf[got] = '\0';
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    snprintf(name, sizeof name, "a cache file %s is an error naming the file", what);
    test_report(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(buf, path) && strstr(buf, message), name,
                "exit status %d, stderr: %s", WIFEXITED(status) ? WEXITSTATUS(status) : -1, buf);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *algos = getenv("CUDASIM_LT_ALGOS"), *slow = getenv("CUDASIM_LT_SLOW_ALGO");
    if (!algos || atoi(algos) != 4 || !slow || atoi(slow) != 0) {
        printf("FAIL: run as CUDASIM_LT_ALGOS=4 CUDASIM_LT_SLOW_ALGO=0 %s (through cudasim)\n", "test_lt_plans");
        return 1;
    }
    char dir[] = "/tmp/llmc_lt_plans.XXXXXX";
    if (!mkdtemp(dir)) {
        printf("FAIL: mkdtemp\n");
        return 1;
    }
    test_precision<float>(dir);
    test_precision<__nv_bfloat16>(dir);
    expect_error(dir, "that is not one", "something else\n", "not a matmul algorithm file");
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, 0));
    char header[512];
    snprintf(header, sizeof header, "llmc-matmul-algos 1\ngpu %s\ncublaslt %zu\n1 2 3\n", props.name, cublasLtGetVersion());
    expect_error(dir, "with a malformed line", header, "line 4");
    expect_error(dir, "that is empty", "", "is empty");
    char rm[1100];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) printf("note: could not remove %s\n", dir);
    return test_exit_code();
}
