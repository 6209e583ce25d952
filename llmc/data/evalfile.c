/*
 * evalfile.c - llm.c's multiple-choice evaluation files: reading, validation, batching, scoring
 * (evalfile.h).
 */
#include "llmc/data/evalfile.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EVALFILE_HEADER_INTS = 256, EVALFILE_HEADER_BYTES = EVALFILE_HEADER_INTS * 4 };

static unsigned word_at(const unsigned char *p, int word_bytes) {
    if (word_bytes == 2) return (unsigned)p[0] | (unsigned)p[1] << 8;
    return (unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 | (unsigned)p[3] << 24;
}

/* The file's bytes (dies naming it when it cannot be read). */
static unsigned char *read_all(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) llmc_die("eval file '%s': cannot open it: %s", path, strerror(errno));
    if (fseek(fp, 0, SEEK_END) != 0) llmc_die("eval file '%s': cannot seek in it (not a regular file?)", path);
    long n = ftell(fp);
    if (n < 0) llmc_die("eval file '%s': cannot tell its size (not a regular file?)", path);
    rewind(fp);
    unsigned char *buf = (unsigned char *)mallocCheck((size_t)n + 1, "eval file");
    if (fread(buf, 1, (size_t)n, fp) != (size_t)n) llmc_die("eval file '%s': read error", path);
    fclose(fp);
    *size = (size_t)n;
    return buf;
}

/* Dies with the example's index and byte offset. */
#define EXAMPLE_DIE(fmt, ...)                                                                                          \
    llmc_die("eval file '%s': example %d (at byte %zu): " fmt, path, i, pos, __VA_ARGS__)

EvalFile *evalfile_open(const char *path, int T, int vocab_size) {
    size_t size;
    unsigned char *buf = read_all(path, &size);
    if (size < EVALFILE_HEADER_BYTES)
        llmc_die("eval file '%s': %zu bytes, shorter than its 1024-byte header (truncated, or not an eval file)", path, size);
    int32_t header[EVALFILE_HEADER_INTS];
    memcpy(header, buf, sizeof header);
    if (header[0] != EVALFILE_MAGIC)
        llmc_die("eval file '%s': magic %d, expected %d (llm.c's write_evalfile; a token shard or another file?)", path,
                 header[0], EVALFILE_MAGIC);
    if (header[1] != EVALFILE_VERSION_U16 && header[1] != EVALFILE_VERSION_U32)
        llmc_die("eval file '%s': version %d, expected %d (uint16 tokens) or %d (uint32 tokens)", path, header[1],
                 EVALFILE_VERSION_U16, EVALFILE_VERSION_U32);
    const int N = header[2], wb = header[1] == EVALFILE_VERSION_U16 ? 2 : 4;
    const long long longest = header[3];
    if (N < 1) llmc_die("eval file '%s': header says %d examples; expected at least 1", path, N);
    if (longest < 1) llmc_die("eval file '%s': header's longest example is %lld bytes; expected > 0", path, longest);
    const unsigned start = wb == 2 ? 0xFFFFu : 0xFFFFFFFFu;
    /* the smallest example: 5 header words, a context and 4 completions of one token each */
    const size_t min_example = (size_t)(5 + 2 + EVAL_COMPLETIONS * 2) * wb, room = (size - EVALFILE_HEADER_BYTES) / min_example;
    if ((size_t)N > room)
        llmc_die("eval file '%s': header says %d examples, but its %zu bytes hold at most %zu (truncated, or a wrong count)",
                 path, N, size, room);

    EvalFile *f = (EvalFile *)callocCheck(1, sizeof(EvalFile), "eval file");
    snprintf(f->path, sizeof f->path, "%s", path);
    f->version = header[1], f->word_bytes = wb, f->num_examples = N;
    f->label = (int *)mallocCheck((size_t)N * sizeof(int), "eval labels");
    f->ctx_len = (int *)mallocCheck((size_t)N * sizeof(int), "eval context lengths");
    f->comp_len = (int *)mallocCheck((size_t)N * EVAL_COMPLETIONS * sizeof(int), "eval completion lengths");
    f->ctx_off = (size_t *)mallocCheck((size_t)N * sizeof(size_t), "eval offsets");
    f->comp_off = (size_t *)mallocCheck((size_t)N * EVAL_COMPLETIONS * sizeof(size_t), "eval offsets");
    f->tokens = (int *)mallocCheck((size - EVALFILE_HEADER_BYTES) / wb * sizeof(int) + 1, "eval tokens");
    size_t ntok = 0, pos = EVALFILE_HEADER_BYTES;
    for (int i = 0; i < N; i++) {
        if (pos + 5 * (size_t)wb > size)
            EXAMPLE_DIE("the file ends inside the example's header (%zu bytes; the header says %d examples): truncated",
                        size, N);
        const unsigned char *p = buf + pos;
        unsigned delim = word_at(p, wb), nbytes = word_at(p + wb, wb), index = word_at(p + 2 * wb, wb);
        unsigned label = word_at(p + 3 * wb, wb), ncomp = word_at(p + 4 * wb, wb);
        if (delim != start) EXAMPLE_DIE("starts with %u, not the example delimiter %u", delim, start);
        if (index != (unsigned)i) EXAMPLE_DIE("its index field is %u (expected %d)", index, i);
        if (nbytes > (unsigned)longest)
            EXAMPLE_DIE("%u bytes, more than the header's longest example (%lld bytes)", nbytes, longest);
        if (nbytes % wb || nbytes < 7u * wb) EXAMPLE_DIE("its size field is %u bytes, not a whole example", nbytes);
        if (pos + nbytes > size) EXAMPLE_DIE("%u bytes, but the file ends %zu bytes later: truncated", nbytes, size - pos);
        if (ncomp != EVAL_COMPLETIONS)
            EXAMPLE_DIE("%u completions; llm.c's evaluation takes exactly %d", ncomp, EVAL_COMPLETIONS);
        if (label >= ncomp) EXAMPLE_DIE("label %u is not below its number of completions (%u)", label, ncomp);
        const size_t end = pos + nbytes;
        size_t q = pos + 5 * (size_t)wb; /* <NUM> <tokens> blocks: the context, then each completion */
        for (int blk = 0; blk <= EVAL_COMPLETIONS; blk++) {
            if (q + wb > end) EXAMPLE_DIE("its size field (%u bytes) ends before its %s", nbytes, blk ? "completions" : "context");
            unsigned n = word_at(buf + q, wb);
            q += wb;
            if (n == 0) {
                if (blk == 0) EXAMPLE_DIE("%s", "an empty context (llm.c requires at least one token)");
                EXAMPLE_DIE("completion %d is empty", blk - 1);
            }
            if (q + (size_t)n * wb > end)
                EXAMPLE_DIE("its %s of %u tokens runs past its size field (%u bytes)", blk ? "completion" : "context", n, nbytes);
            if (blk == 0) f->ctx_len[i] = (int)n, f->ctx_off[i] = ntok;
            else {
                f->comp_len[(size_t)i * EVAL_COMPLETIONS + blk - 1] = (int)n;
                f->comp_off[(size_t)i * EVAL_COMPLETIONS + blk - 1] = ntok;
                long long row = (long long)f->ctx_len[i] + n;
                if (row >= T)
                    EXAMPLE_DIE("its context (%d tokens) + completion %d (%u tokens) = %lld tokens; they must be "
                                "fewer than -t %d (llm.c's rule)", f->ctx_len[i], blk - 1, n, row, T);
                if (row > f->max_row) f->max_row = (int)row;
            }
            for (unsigned k = 0; k < n; k++, q += wb) {
                unsigned tok = word_at(buf + q, wb);
                if (tok >= (unsigned)vocab_size)
                    EXAMPLE_DIE("token id %u (%s, token %u) is outside the model's vocabulary [0, %d)", tok,
                                blk ? "a completion" : "the context", k, vocab_size);
                f->tokens[ntok++] = (int)tok;
            }
        }
        if (q != end) EXAMPLE_DIE("its size field says %u bytes but its contents take %zu", nbytes, q - pos);
        f->label[i] = (int)label;
        pos = end;
    }
    if (pos != size)
        llmc_die("eval file '%s': %zu bytes follow the %d examples the header announces (a wrong count in the header?)",
                 path, size - pos, N);
    free(buf);
    return f;
}
#undef EXAMPLE_DIE

void evalfile_close(EvalFile *f) {
    if (!f) return;
    free(f->label), free(f->ctx_len), free(f->comp_len), free(f->ctx_off), free(f->comp_off), free(f->tokens);
    free(f);
}

EvalSlice evalfile_slice(const EvalFile *f, int B, int rank, int num_processes) {
    if (B < EVAL_COMPLETIONS)
        llmc_die("eval file '%s': -b %d is too small: one example takes %d rows of the batch (-b %d or more)", f->path, B,
                 EVAL_COMPLETIONS, EVAL_COMPLETIONS);
    EvalSlice s;
    const int per_process = (f->num_examples + num_processes - 1) / num_processes;
    s.per_batch = B / EVAL_COMPLETIONS;
    s.num_batches = (per_process + s.per_batch - 1) / s.per_batch;
    long long lo = (long long)per_process * rank, hi = lo + per_process;
    s.start = (int)(lo < f->num_examples ? lo : f->num_examples);
    s.end = (int)(hi < f->num_examples ? hi : f->num_examples);
    return s;
}

int evalfile_batch(const EvalFile *f, const EvalSlice *s, int b, int B, int T, int *inputs, int *targets,
                   unsigned char *mask, int *labels) {
    const size_t n = (size_t)B * T;
    memset(inputs, 0, n * sizeof(int));
    memset(targets, 0, n * sizeof(int));
    memset(mask, 0, n);
    int count = 0;
    for (int j = 0; j < s->per_batch; j++) {
        const int e = s->start + b * s->per_batch + j;
        if (e >= s->end) {
            labels[j] = -1;
            continue;
        }
        labels[j] = f->label[e];
        count++;
        const int cl = f->ctx_len[e];
        for (int c = 0; c < EVAL_COMPLETIONS; c++) {
            const size_t row = (size_t)(j * EVAL_COMPLETIONS + c) * T;
            memcpy(inputs + row, f->tokens + f->ctx_off[e], (size_t)cl * sizeof(int));
            const int *comp = f->tokens + f->comp_off[(size_t)e * EVAL_COMPLETIONS + c];
            const int len = f->comp_len[(size_t)e * EVAL_COMPLETIONS + c];
            for (int k = 0; k < len; k++) {
                inputs[row + cl + k] = comp[k];
                targets[row + cl + k - 1] = comp[k]; /* the token before predicts it */
                mask[row + cl + k - 1] = 1;
            }
        }
    }
    return count;
}

int evalfile_score(const unsigned char *mask, const float *losses, const int *labels, int per_batch, int T) {
    int correct = 0;
    for (int j = 0; j < per_batch; j++) {
        if (labels[j] < 0) continue; /* no example in these rows */
        float best = 0.0f;
        int pick = -1;
        for (int c = 0; c < EVAL_COMPLETIONS; c++) {
            const size_t row = (size_t)(j * EVAL_COMPLETIONS + c) * T;
            float sum = 0.0f; /* fp32 in position order, as llm.c */
            int count = 0;
            for (int t = 0; t < T; t++)
                if (mask[row + t]) sum += losses[row + t], count++;
            const float mean = count > 0 ? sum / count : 0.0f;
            if (c == 0 || mean < best) best = mean, pick = c; /* strict: ties keep the lower index */
        }
        correct += pick == labels[j];
    }
    return correct;
}

/* ---- writing ------------------------------------------------------------------------------ */
void evalwriter_init(EvalWriter *w, int version) {
    memset(w, 0, sizeof *w);
    w->version = version;
    w->word_bytes = version == EVALFILE_VERSION_U16 ? 2 : 4;
}

static void push_word(EvalWriter *w, uint32_t v) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 4096;
        uint32_t *grown = (uint32_t *)realloc(w->words, w->cap * sizeof(uint32_t));
        if (!grown) llmc_die("out of memory: %zu words of eval file examples", w->cap);
        w->words = grown;
    }
    w->words[w->n++] = v;
}

const char *evalwriter_add(EvalWriter *w, int label, const uint32_t *ctx, size_t nctx, const uint32_t *const *comps,
                           const size_t *ncomp_tok, int ncomp) {
    const uint64_t max_word = w->word_bytes == 2 ? 0xFFFFu : 0xFFFFFFFFu; /* also the delimiter */
    if (ncomp != EVAL_COMPLETIONS) return "not exactly 4 endings (llm.c's evaluation takes 4)";
    if (label < 0 || label >= ncomp) return "the label is not the index of one of the endings";
    if (nctx == 0) return "the context has no tokens";
    if ((uint64_t)w->num_examples + 1 >= max_word) return "too many examples for the file's index field";
    uint64_t words = 6 + nctx;
    for (int c = 0; c < ncomp; c++) {
        if (ncomp_tok[c] == 0) return "an ending has no tokens";
        words += 1 + ncomp_tok[c];
    }
    if (words * w->word_bytes >= max_word) return "the example is too long for the file's size field";
    for (size_t i = 0; i < nctx; i++)
        if (ctx[i] >= max_word) return "a token id does not fit the file's words";
    for (int c = 0; c < ncomp; c++)
        for (size_t i = 0; i < ncomp_tok[c]; i++)
            if (comps[c][i] >= max_word) return "a token id does not fit the file's words";
    push_word(w, (uint32_t)max_word);
    push_word(w, (uint32_t)(words * w->word_bytes));
    push_word(w, (uint32_t)w->num_examples);
    push_word(w, (uint32_t)label);
    push_word(w, (uint32_t)ncomp);
    push_word(w, (uint32_t)nctx);
    for (size_t i = 0; i < nctx; i++) push_word(w, ctx[i]);
    for (int c = 0; c < ncomp; c++) {
        push_word(w, (uint32_t)ncomp_tok[c]);
        for (size_t i = 0; i < ncomp_tok[c]; i++) push_word(w, comps[c][i]);
    }
    if (words * w->word_bytes > w->longest) w->longest = (unsigned)(words * w->word_bytes);
    w->num_examples++;
    return NULL;
}

void evalwriter_save(const EvalWriter *w, const char *path) {
    int32_t header[EVALFILE_HEADER_INTS] = {EVALFILE_MAGIC, w->version, w->num_examples, (int32_t)w->longest};
    AtomicFile af;
    atomic_open(&af, path);
    fwriteCheck(header, sizeof header, 1, af.f, af.tmp_path);
    unsigned char buf[4096];
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        for (int b = 0; b < w->word_bytes; b++) buf[k++] = (unsigned char)(w->words[i] >> (8 * b));
        if (k + 4 > sizeof buf || i + 1 == w->n) {
            fwriteCheck(buf, 1, k, af.f, af.tmp_path);
            k = 0;
        }
    }
    atomic_commit(&af);
}

void evalwriter_free(EvalWriter *w) {
    free(w->words);
    memset(w, 0, sizeof *w);
}
