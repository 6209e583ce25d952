/*
 * report.h - what the run says about itself: samples (SampleText: the tokenizer that prints
 * them, or token ids), the wall clock, durations, the validation record, the summary line at the
 * end and the log's first record.
 */
#ifndef LLMC_TRAIN_REPORT_H
#define LLMC_TRAIN_REPORT_H

#include <stddef.h>

#include "llmc/core/logger.h"
#include "llmc/core/rng.h"
#include "llmc/train/backend.h"
#include "llmc/train/cli.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void *tok; /* Tokenizer *, or NULL: print ids */
    int eot;
} SampleText;

/* The tokenizer of the samples: --tokenizer, an HF Llama 3 directory's, data/gpt2_tokenizer.bin
 * or the default one; none (ids printed, a note says why) when absent or of another vocabulary. */
void sample_text_open(SampleText *st, const TrainConfig *tc, const ModelConfig *cfg);
void sample_text_close(SampleText *st);
/* Samples gen_tokens tokens after <|endoftext|> (windows of at most T) and prints them. */
void sample_text_generate(TrainBackend *be, const SampleText *st, Rng *rng, int T, int gen_tokens);

/* Seconds of the monotonic clock. */
double report_wall_s(void);
/* 42s, 7m05s, 3h12m */
void report_duration(char *buf, size_t len, double s);

typedef struct {
    float loss;
    int step; /* -1: none yet */
} ValRecord;

/* Notes a validation loss of step as the last one, and as the best one when lower. */
void report_val_note(ValRecord *best, ValRecord *last, float loss, int step);
/* The one line at the end: steps, tokens, time, validation, where the model went. */
void report_summary(int first_step, int last_step, int max_steps, long long tokens, double seconds,
                    const ValRecord *best, const ValRecord *last, const char *saved_model);
/* The log's first record of this process: configuration, version, machine. */
void report_run_record(Logger *lg, const TrainConfig *rc, const TrainBackend *be, int resume_step);

#ifdef __cplusplus
}
#endif
#endif
