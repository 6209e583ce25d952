/*
 * report.c - what the run says about itself: the samples it prints (report.h's SampleText), the
 * wall clock and durations, the validation record, the summary line and the log's run record.
 */
#include "llmc/train/report.h"
#include "llmc/core/check.h"
#include "llmc/formats/rundir.h"
#include "llmc/generate/sampler.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if LLMC_HAVE_PCRE2
#include "llmc/data/tokenizer.h"
#endif

/* ---- sampling ------------------------------------------------------------------------ */
void sample_text_open(SampleText *st, const TrainConfig *tc, const ModelConfig *cfg) {
    st->tok = NULL;
    st->eot = cfg->vocab_size > 50256 ? 50256 : cfg->vocab_size - 1;
#if LLMC_HAVE_PCRE2
    char path[1100], err[512];
    if (tc->tokenizer[0]) {
        snprintf(path, sizeof path, "%s", tc->tokenizer);
    } else if (tokenizer_find_llama3(tc->init, path, sizeof path) == 0) { /* an HF Llama 3 directory's */
    } else if (access("data/gpt2_tokenizer.bin", R_OK) == 0) {
        snprintf(path, sizeof path, "data/gpt2_tokenizer.bin");
    } else if (tokenizer_find_default(path, sizeof path) != 0) {
        printf("note: no GPT-2 tokenizer found (run 'make data'); samples are printed as token ids\n");
        return;
    }
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok) {
        if (tc->tokenizer[0]) llmc_die("--tokenizer: %s", err);
        printf("note: %s; samples are printed as token ids\n", err);
        return;
    }
    if (tokenizer_eot(tok) >= (uint32_t)cfg->vocab_size || tokenizer_vocab_size(tok) != (size_t)cfg->vocab_size) {
        printf("note: the tokenizer '%s' has %zu tokens, the model's vocabulary %d; samples are printed as token ids "
               "(give the model's own with --tokenizer)\n", path, tokenizer_vocab_size(tok), cfg->vocab_size);
        tokenizer_free(tok);
        return;
    }
    st->tok = tok;
    st->eot = (int)tokenizer_eot(tok);
#else
    if (tc->tokenizer[0]) llmc_die("--tokenizer: this build has no tokenizer (PCRE2 missing: apt-get install libpcre2-dev)");
    printf("note: built without the tokenizer (PCRE2); samples are printed as token ids\n");
#endif
}

static void print_token(const SampleText *st, int id) {
#if LLMC_HAVE_PCRE2
    if (st->tok) {
        size_t len;
        const unsigned char *bytes = tokenizer_token_bytes((const Tokenizer *)st->tok, (uint32_t)id, &len);
        for (size_t i = 0; bytes && i < len; i++) {
            unsigned char c = bytes[i];
            /* raw bytes go out unchanged except control characters, which could garble a terminal */
            if (c >= 0x20 || c == '\n' || c == '\t') putchar(c);
        }
        return;
    }
#endif
    (void)st;
    printf("%d ", id);
}

void sample_text_close(SampleText *st) {
#if LLMC_HAVE_PCRE2
    if (st->tok) tokenizer_free((Tokenizer *)st->tok);
#endif
    st->tok = NULL;
}

void sample_text_generate(TrainBackend *be, const SampleText *st, Rng *rng, int T, int gen_tokens) {
    int *tokens = (int *)mallocCheck(((size_t)gen_tokens + 1) * sizeof(int), "sample tokens");
    tokens[0] = st->eot;
    printf("generating:\n---\n");
    for (int n = 1; n <= gen_tokens; n++) {
        int window = n < T ? n : T;
        const float *logits = be->ops.next_logits(be->model, tokens + n - window, window);
        tokens[n] = sample_softmax(logits, be->cfg.vocab_size, rng_f32(rng));
        print_token(st, tokens[n]);
        fflush(stdout);
    }
    printf("\n---\n");
    free(tokens);
}

/* ---- what the run says about itself ------------------------------------------------------ */
double report_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void report_duration(char *buf, size_t len, double s) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t < 60) snprintf(buf, len, "%lds", t);
    else if (t < 3600) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
}

void report_val_note(ValRecord *best, ValRecord *last, float loss, int step) {
    if (best->step < 0 || loss < best->loss) *best = (ValRecord){loss, step};
    *last = (ValRecord){loss, step};
}

void report_summary(int first_step, int last_step, int max_steps, long long total_batch, double seconds,
                          const ValRecord *best, const ValRecord *last, const char *saved_model) {
    char took[32], val[160];
    report_duration(took, sizeof took, seconds);
    int steps = last_step - first_step + 1;
    if (last->step >= 0)
        snprintf(val, sizeof val, "val loss best %.6f (step %d), last %.6f (step %d)", best->loss, best->step, last->loss,
                 last->step);
    else
        snprintf(val, sizeof val, "no validation (-v 0)");
    printf("done: steps %d-%d of %d (%lld tokens) in %s | %s | %s%s\n", first_step, last_step, max_steps,
           (long long)steps * total_batch, took, val, saved_model[0] ? "model saved: " : "model not saved (no -o)",
           saved_model);
}

void report_run_record(Logger *lg, const TrainConfig *rc, const TrainBackend *be, int resume_step) {
    char host[256], cpu[256];
    int cores;
    rundir_machine(host, sizeof host, cpu, sizeof cpu, &cores);
    log_begin(lg);
    log_string(lg, "event", resume_step >= 0 ? "resume" : "start");
    if (resume_step >= 0) log_int(lg, "resumed_from", resume_step);
    log_string(lg, "version", llmc_version());
    log_string(lg, "host", host);
    log_string(lg, "cpu", cpu);
    log_int(lg, "cores", cores);
    log_string(lg, "backend", be->name);
    log_int(lg, "parameters", (long long)be->num_parameters);
    train_config_log(rc, lg);
    log_end(lg);
}
