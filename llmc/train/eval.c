/*
 * eval.c - multiple-choice evaluation over a TrainBackend (eval.h).
 */
#include "llmc/train/eval.h"
#include "llmc/core/check.h"
#include "llmc/dist/dist.h"
#include "llmc/dist/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int mc_eval_open(McEval *e, const TrainConfig *tc, const TrainBackend *be, int required) {
    memset(e, 0, sizeof *e);
    if (!tc->hellaswag) return 0;
    const char *path = tc->hellaswag_file;
    if (access(path, F_OK) != 0) {
        if (strcmp(path, TRAIN_DEFAULT_HELLASWAG_FILE) != 0 || required)
            llmc_die("-h 1: the eval file '%s' (--hellaswag-file) does not exist; prepare one with ./tokenizer evalfile "
                     "IN.jsonl OUT.bin (README: Evaluation)", path);
        if (tc->process_rank == 0)
            printf("note: -h 1: no HellaSwag file at '%s' (llm.c's default place; --hellaswag-file names another): "
                   "continuing without HellaSwag evaluation\n", path);
        return 0;
    }
    if (!be->ops.eval_losses) llmc_die("-h 1: the %s backend has no per-position losses for the evaluation", be->name);
    e->file = evalfile_open(path, tc->T, be->cfg.vocab_size);
    const int rounded = (e->file->max_row + 63) / 64 * 64;
    e->B = tc->B, e->T = rounded < tc->T ? rounded : tc->T; /* (max_row < -t: every row fits) */
    e->slice = evalfile_slice(e->file, tc->B, tc->process_rank, tc->num_processes);
    const size_t n = (size_t)tc->B * tc->T;
    e->inputs = (int *)mallocCheck(n * sizeof(int), "eval inputs");
    e->targets = (int *)mallocCheck(n * sizeof(int), "eval targets");
    e->mask = (unsigned char *)mallocCheck(n, "eval mask");
    e->losses = (float *)mallocCheck(n * sizeof(float), "eval losses");
    e->labels = (int *)mallocCheck((size_t)e->slice.per_batch * sizeof(int), "eval labels");
    if (tc->process_rank == 0)
        printf("hellaswag: %d examples in '%s' (longest context + completion %d tokens); %d batches of %d examples per "
               "rank, %d x %d positions each\n", e->file->num_examples, path, e->file->max_row, e->slice.num_batches,
               e->slice.per_batch, e->B, e->T);
    return 1;
}

McResult mc_eval_run(McEval *e, TrainBackend *be) {
    McResult r = {0, 0, 0.0};
    const double t0 = wall_s();
    double counts[2] = {0.0, 0.0}; /* correct, examples */
    for (int b = 0; b < e->slice.num_batches; b++) {
        int n = evalfile_batch(e->file, &e->slice, b, e->B, e->T, e->inputs, e->targets, e->mask, e->labels);
        be->ops.eval_losses(be->model, e->inputs, e->targets, e->B, e->T, e->losses); /* (every rank: -z 3 gathers) */
        counts[0] += evalfile_score(e->mask, e->losses, e->labels, e->slice.per_batch, e->T);
        counts[1] += n;
    }
    dist_allreduce_f64(dist_data_group(), counts, 2); /* (-tp: a tensor-parallel group scored one slice) */
    r.correct = (long long)counts[0];
    r.total = (long long)counts[1];
    r.seconds = wall_s() - t0;
    if (r.total != e->file->num_examples)
        llmc_die("internal: the ranks scored %lld of the %d examples of '%s'", r.total, e->file->num_examples, e->file->path);
    return r;
}

static double accuracy(const McResult *r) { return r->total ? (double)r->correct / (double)r->total : 0.0; }

void mc_eval_report(const McResult *r) {
    if (dist_world()->rank != 0) return;
    printf("HellaSwag: %lld/%lld = %f\n", r->correct, r->total, accuracy(r));
    fflush(stdout);
}

void mc_eval_report_fields(const McResult *r, Logger *lg) {
    const double acc = accuracy(r);
    log_double(lg, "hellaswag_acc", acc);
    log_int(lg, "hellaswag_correct", r->correct);
    log_int(lg, "hellaswag_total", r->total);
    log_double(lg, "hellaswag_examples_per_s", r->seconds > 0 ? r->total / r->seconds : 0.0);
}

void mc_eval_close(McEval *e) {
    if (!e->file) return;
    evalfile_close(e->file);
    free(e->inputs), free(e->targets), free(e->mask), free(e->losses), free(e->labels);
    memset(e, 0, sizeof *e);
}
