/*
 * evalfile.h - multiple-choice evaluation files (llm.c's format: HellaSwag, MMLU) and their
 * batching exactly as llm.c's EvalLoader does it.
 *
 * Layout (llm.c's dev/data/data_common.py write_evalfile): int32 header[256] with
 *   [0] magic 20240522, [1] version (1: uint16 words, GPT-2; 2: uint32 words, Llama 3),
 *   [2] number of examples, [3] the longest example in bytes;
 * then the examples back to back, each a stream of words:
 *   <START 2^bits-1> <EXAMPLE_BYTES> <EXAMPLE_INDEX> <LABEL> <NUM_COMPLETIONS>
 *   <NUM> <context tokens...>, then NUM_COMPLETIONS times <NUM> <completion tokens...>
 * EXAMPLE_BYTES counts the whole stream of the example (START included).
 *
 * Batching (llm.c's EvalLoader): an example takes EVAL_COMPLETIONS (4) consecutive rows of a
 * B x T batch, rows 4i..4i+3 for the batch's i-th example (B/4 examples per batch; the rows past
 * 4*(B/4) stay unused). Row 4i+c holds the context then completion c; the target at position
 * ctx_len+k-1 is completion token k and the mask is 1 exactly there. llm.c requires
 * ctx_len > 0, completion length > 0 and ctx_len + completion length < T.
 * Data parallel: rank r of P takes examples [r*E, min((r+1)*E, N)), E = ceil(N / P), in
 * ceil(E / (B/4)) batches: every rank runs the same number of batches (some may be empty).
 */
#ifndef LLMC_EVALFILE_H
#define LLMC_EVALFILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EVALFILE_MAGIC 20240522
#define EVALFILE_VERSION_U16 1
#define EVALFILE_VERSION_U32 2
enum { EVAL_COMPLETIONS = 4 }; /* llm.c's ASSUMED_NUM_COMPLETIONS */

typedef struct {
    char path[1024];
    int version, word_bytes;     /* 1 and 2, or 2 and 4 */
    int num_examples;
    int *label;                  /* (N) */
    int *ctx_len;                /* (N) */
    int *comp_len;               /* (N, 4) */
    size_t *ctx_off, *comp_off;  /* (N), (N, 4): offsets into tokens */
    int *tokens;                 /* every context and completion token, in file order */
    int max_row;                 /* the longest context + completion */
} EvalFile;

/* Reads and validates the whole file against the run: T (every context + completion < T) and
 * the vocabulary (every token < vocab_size). Dies with an error naming the file and, for a bad
 * example, its index and byte offset. */
EvalFile *evalfile_open(const char *path, int T, int vocab_size);
void evalfile_close(EvalFile *f);

/* One rank's share of the examples and its batches (see the head comment). */
typedef struct {
    int start, end;       /* examples [start, end) */
    int per_batch;        /* B / 4 */
    int num_batches;      /* the same on every rank */
} EvalSlice;
/* Dies when B < 4 (no example fits a batch). */
EvalSlice evalfile_slice(const EvalFile *f, int B, int rank, int num_processes);

/* Batch b of the slice into inputs, targets and mask (B*T each; positions outside the examples
 * are token 0 with mask 0) and labels (per_batch entries; -1 where no example). Returns the
 * number of examples in the batch. */
int evalfile_batch(const EvalFile *f, const EvalSlice *s, int b, int B, int T, int *inputs, int *targets,
                   unsigned char *mask, int *labels);

/* llm.c's acc_norm over one batch: per example the completion with the lowest mean loss over its
 * mask positions (ties to the lower index) is its prediction; returns how many equal the label.
 * losses (B*T) are the per-position losses of a forward over evalfile_batch's inputs/targets. */
int evalfile_score(const unsigned char *mask, const float *losses, const int *labels, int per_batch, int T);

/* ---- writing (./tokenizer evalfile) ---- */
typedef struct {
    int version, word_bytes;
    uint32_t *words; /* the examples' stream */
    size_t n, cap;
    int num_examples;
    unsigned longest; /* bytes */
} EvalWriter;
/* version: EVALFILE_VERSION_U16 or _U32 (llm.c's "gpt-2" and "llama-3" files). */
void evalwriter_init(EvalWriter *w, int version);
/* Appends an example (ncomp completions; comps[c] has ncomp_tok[c] tokens) as write_evalfile does.
 * Returns NULL, or why it cannot be written (nothing appended then): no context or an empty
 * completion, not exactly 4 completions, a label out of range, a token or the example too large
 * for the version's words, too many examples. */
const char *evalwriter_add(EvalWriter *w, int label, const uint32_t *ctx, size_t nctx, const uint32_t *const *comps,
                           const size_t *ncomp_tok, int ncomp);
/* Writes the header and the examples to path atomically (dies naming it on failure). */
void evalwriter_save(const EvalWriter *w, const char *path);
void evalwriter_free(EvalWriter *w);

#ifdef __cplusplus
}
#endif
#endif
