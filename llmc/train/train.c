/*
 * train.c - the training loop (train.h): setup, the steps (micro-steps, reduction, clipping, the
 * update or its skip), evaluation, sampling and checkpoints on their schedule, and -x 0.
 */
#include "llmc/train/train.h"
#include "llmc/core/check.h"
#include "llmc/core/optstate.h"
#include "llmc/core/rng.h"
#include "llmc/data/dataloader.h"
#include "llmc/dist/dist.h"
#include "llmc/dist/layout.h"
#include "llmc/formats/statefile.h"
#include "llmc/formats/rundir.h"
#include "llmc/train/eval.h"
#include "llmc/train/adafactor.h"
#include "llmc/train/hostopt.h"
#include "llmc/train/optim.h"
#include "llmc/train/plan.h"
#include "llmc/train/report.h"
#include "llmc/train/schedule.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ---- z-score outlier detection for -sl / -sg -------------------------------------------
 * The window holds the last 128 finite values of a series, skipped steps included: a value that
 * was judged an outlier still enters the window, so after a lasting shift of the distribution the
 * mean follows and the detector stops skipping (for -sl 3 after at most ~13 steps: a value at the
 * new level has z = sqrt((1 - p) / p) when a fraction p of the window is at the new level).
 * Warm-up: no z-score until the window holds OUTLIER_WARMUP values. Non-finite values and
 * diverged steps (see train_run) never enter the window. */
enum { OUTLIER_WINDOW = 128, OUTLIER_WARMUP = 32 };
typedef struct {
    double values[OUTLIER_WINDOW];
    int count, next;
} Outliers;

static double outlier_zscore(const Outliers *o, double x) {
    if (o->count < OUTLIER_WARMUP) return 0.0; /* not enough history to judge */
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < o->count; i++) mean += o->values[i];
    mean /= o->count;
    for (int i = 0; i < o->count; i++) var += (o->values[i] - mean) * (o->values[i] - mean);
    double sd = sqrt(var / o->count);
    return sd > 0 ? (x - mean) / sd : 0.0;
}

static void outlier_push(Outliers *o, double x) {
    o->values[o->next] = x;
    o->next = (o->next + 1) % OUTLIER_WINDOW;
    if (o->count < OUTLIER_WINDOW) o->count++;
}

/* ---- the loop ----------------------------------------------------------------------------- */
static float evaluate(TrainBackend *be, DataLoader *val, int batches, int *inputs, int *targets, int B, int T) {
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next(val, inputs, targets);
        sum += be->ops.eval_loss(be->model, inputs, targets, B, T);
    }
    Dist *d = dist_data_group(); /* (-tp: the ranks of a tensor-parallel group evaluated the same slice) */
    dist_allreduce_f64(d, &sum, 1); /* every rank evaluated its slice of each global batch */
    return (float)(sum / batches / d->size);
}

/* Faults: every rank must run the same configuration on the same data and model. Rank 0's
 * description (resolved flags, training and validation data: size and content CRC, parameter
 * CRC) is sent to all; a rank whose own differs names the first differing line, and every rank
 * stops. (train, val: NULL when not used.) */
static void check_ranks_agree_in(Dist *d, const TrainConfig *rc, const TrainBackend *be, DataLoader *train,
                                 DataLoader *val, int with_params) {
    if (d->size == 1) return;
    TrainConfig c = *rc;
    c.process_rank = 0;
    enum { CAP = 32768 };
    char *mine = (char *)mallocCheck(CAP, "configuration text"), *root = (char *)mallocCheck(CAP, "configuration text");
    size_t n = train_config_to_text(&c, mine, CAP - 256);
    uLong crc = crc32(0L, Z_NULL, 0);
    const unsigned char *p = (const unsigned char *)be->state.host_params;
    for (size_t left = (be->state.agree_floats ? be->state.agree_floats : be->num_parameters) * sizeof(float); left > 0;) {
        uInt k = left > (1u << 30) ? (1u << 30) : (uInt)left;
        crc = crc32(crc, p, k);
        p += k;
        left -= k;
    }
    DataLoader *loaders[2] = {train, val};
    const char *names[2] = {"training", "validation"};
    for (int i = 0; i < 2; i++)
        if (loaders[i])
            n += (size_t)snprintf(mine + n, CAP - n, "%s data: %zu tokens in %d shard(s), content crc32 %08x\n", names[i],
                                  dataloader_num_tokens(loaders[i]), dataloader_num_shards(loaders[i]),
                                  (unsigned)dataloader_content_crc(loaders[i]));
    if (with_params) snprintf(mine + n, CAP - n, "initial parameters: %zu, crc32 %08lx\n", be->num_parameters, (unsigned long)crc);
    memcpy(root, mine, CAP);
    dist_bcast_bytes(d, root, CAP);
    uint64_t ok = strcmp(mine, root) == 0, *all = (uint64_t *)mallocCheck((size_t)d->size * sizeof(uint64_t), "ranks");
    if (!ok) {
        const char *a = mine, *b = root;
        while (*a && *b) { /* the first line that differs */
            size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
            if (la != lb || memcmp(a, b, la) != 0) {
                fprintf(stderr, "error: rank %d was started differently from rank 0: it has '%.*s' where rank 0 has "
                        "'%.*s'\n", d->rank, (int)la, a, (int)lb, b);
                break;
            }
            a += la + (a[la] == '\n');
            b += lb + (b[lb] == '\n');
        }
    }
    dist_allgather_u64(d, ok, all);
    int bad = 0;
    char ranks[256] = "";
    for (int r = 0; r < d->size; r++)
        if (!all[r]) {
            size_t k = strlen(ranks);
            if (k + 16 < sizeof ranks) snprintf(ranks + k, sizeof ranks - k, "%s%d", bad ? ", " : "", r);
            bad++;
        }
    free(mine);
    free(root);
    free(all);
    if (bad)
        llmc_die("the %d ranks were not started alike: rank(s) %s differ from rank 0 in flags, data or model (each "
                 "says how on stderr); start every rank with the same command and files (a data or model line: the "
                 "files under the same name hold other bytes on that rank, e.g. a relative path from another "
                 "working directory, or a copy that differs)", d->size, ranks);
}

/* -x 0: the validation loss of the loaded model (-e, or with -y 1 the latest checkpoint in -o),
 * over the batches a training run's evaluation uses; printed, and logged with "eval_only" when
 * -o is given (appended: the log's existing lines are kept). No training data, no checkpoint. */
/* Every rank against rank 0: flags and data over the whole group; the parameters over the ranks that
 * hold the same ones (-tp: the data-parallel group; each tensor-parallel rank holds its own part). */
static void check_ranks_agree(Dist *d, const TrainConfig *rc, const TrainBackend *be, DataLoader *train,
                              DataLoader *val) {
    if (d == dist_world() || dist_tp_group()->size == 1) {
        check_ranks_agree_in(d, rc, be, train, val, 1);
        return;
    }
    check_ranks_agree_in(dist_world(), rc, be, train, val, 0);
    check_ranks_agree_in(d, rc, be, train, val, 1);
}

static int evaluate_only(const TrainConfig *tc, TrainBackend *be, int resume_step) {
    const int B = tc->B, T = tc->T;
    if (tc->val_every <= 0 && !tc->hellaswag)
        llmc_die("-x 0 evaluates the validation loss (or with -h 1 the eval file), but -v %d disables validation and "
                 "-h is 0", tc->val_every);
    if (T > be->cfg.max_seq_len) llmc_die("-t %d exceeds the model's maximum sequence length %d (maxT)", T, be->cfg.max_seq_len);
    McEval mc;
    mc_eval_open(&mc, tc, be, 1); /* (first: a bad eval file stops the run before any work) */
    DataLoader *val = NULL;
    int batches = 0;
    if (tc->val_every > 0) {
        val = dataloader_open(tc->val_pattern, B, T, tc->process_rank, tc->num_processes, 0, 0, be->cfg.vocab_size, 0);
        int avail = (int)dataloader_batches_per_epoch(val);
        batches = tc->val_max_steps < 0 || tc->val_max_steps > avail ? avail : tc->val_max_steps;
    }
    int *inputs = (int *)mallocCheck((size_t)B * T * sizeof(int), "input tokens");
    int *targets = (int *)mallocCheck((size_t)B * T * sizeof(int), "target tokens");
    const int step = resume_step < 0 ? 0 : resume_step;
    check_ranks_agree(dist_data_group(), tc, be, NULL, val); /* (-tp: the ranks holding the same part) */
    printf("evaluation only (-x 0): %s, %zu parameters%s, %d validation batches of %d x %d tokens\n",
           resume_step < 0 ? tc->init : tc->output_dir, be->num_parameters,
           dist_tp_group()->size > 1 ? " on each tensor-parallel rank (-tp)" : "", batches, B, T);
    printf("backend: %s\n", be->name);
    float vl = 0.0f;
    if (val) {
        vl = evaluate(be, val, batches, inputs, targets, B, T);
        printf("val loss %.6f (step %d)\n", vl, step);
        fflush(stdout);
    }
    McResult mr = {0, 0, 0.0};
    if (mc.file) {
        mr = mc_eval_run(&mc, be);
        mc_eval_report(&mr);
        if (dist_world()->rank == 0)
            printf("hellaswag: %lld examples in %.2f s: %.1f examples/s (%d rank%s)\n", mr.total, mr.seconds,
                   mr.seconds > 0 ? mr.total / mr.seconds : 0.0, tc->num_processes, tc->num_processes == 1 ? "" : "s");
        fflush(stdout);
    }
    if (tc->output_dir[0] && dist_world()->rank == 0) { /* rank 0 writes the log */
        Logger lg; /* the directory was created and locked by train_resolve_init */
        logger_open(&lg, tc->output_dir, INT_MAX); /* keeps every existing line */
        log_begin(&lg);
        log_int(&lg, "step", step);
        if (val) log_float(&lg, "val_loss", vl);
        if (mc.file) mc_eval_report_fields(&mr, &lg);
        log_int(&lg, "eval_only", 1);
        log_string(&lg, "model", resume_step < 0 ? tc->init : tc->output_dir);
        log_end(&lg);
        logger_close(&lg);
    }
    if (val) dataloader_close(val);
    mc_eval_close(&mc);
    free(inputs);
    free(targets);
    return 0;
}

/* Test only: LLMC_TEST_HANG=RANK:STEP[:SECONDS] makes rank RANK stop (sleep; for SECONDS when
 * given) before step STEP's gradient reduction, so that the tests see the other ranks' collective
 * watchdog name it (or, stopped for less than the watchdog's grace, wait for it). */
static void test_hang(const Dist *d, int step) {
    const char *e = getenv("LLMC_TEST_HANG");
    int rank, at, seconds = 0;
    if (!e || sscanf(e, "%d:%d:%d", &rank, &at, &seconds) < 2 || rank != d->rank || at != step) return;
    fprintf(stderr, "rank %d: LLMC_TEST_HANG: sleeping before step %d's reduction\n", rank, step);
    if (seconds > 0) sleep((unsigned)seconds);
    else
        for (;;) sleep(3600);
}

/* One training run: its configuration, backend, optimizer, data, plan and the loop's state. */
typedef struct {
    const TrainConfig *tc;
    TrainConfig rc; /* the configuration as run: -d, -x (and, from the trainer, --threads) resolved */
    TrainBackend *be;
    TrainOptimizer opt;
    HostAdamW host; /* the loop's own optimizer, when the backend has none */
    HostAdafactor adafactor; /* or, --optimizer adafactor, the loop's Adafactor */
    /* dist: every rank (rank 0 logs and writes); data: the data-parallel group (the whole group
     * without -tp), whose ranks take their rows of each step and sum the gradients (dist/layout.h) */
    Dist *dist, *data;
    int B, T, P, accum, max_steps, first_step, resume_step;
    long long micro_tokens, total_batch;
    DataLoader *train, *val;
    int val_batches;
    McEval mc; /* -h 1 */
    int *inputs, *targets, *step_inputs, *step_targets;
    /* --batch-ramp (ramp_tokens > 0): the training loader's unit is ramp_start tokens and a step
     * takes batch_ramp_step_tokens(..., seen_tokens) of them; else every step is total_batch.
     * trained_tokens: this process's steps' tokens (the summary line) */
    long long ramp_tokens, ramp_start, seen_tokens, trained_tokens;
    MemPlan plan;
    int leak_class;
    size_t leak_base[2][MEM_NUM_CLASSES];
    Rng sampler_rng;
    Logger lg;
    SampleText text;
    int schedule;
    double flops_per_step, batches_per_epoch, run_start, loop_start;
    Outliers loss_hist, norm_hist;
    float diverged_loss;
    /* last_ckpt: the newest checkpoint written (or resumed from); healthy_ckpt: the newest one a
     * later step trained from without diverging (its weights gave a sane loss) */
    int consecutive_skips, last_diverged, last_ckpt, healthy_ckpt, have_overfit_batch;
    ValRecord val_best, val_last;
    char saved_model[4200];
} Run;

/* One step's figures, for its line and log record. */
typedef struct {
    int step;
    long long tokens; /* the step's batch */
    float loss, lr, norm;
    int has_parts;
    double ce, kd; /* (has_parts: the backend's loss_parts, the distillation's terms) */
    double step_ms, tok_s, wait_ms, comm_ms;
    long long comm_bytes;
    const char *skip; /* why the update was skipped, or NULL */
} StepResult;

/* --batch-ramp: the steps of one epoch of the training data (units of ramp_start tokens). */
static int ramp_steps_per_epoch(const Run *r) {
    const long long units = (long long)dataloader_batches_per_epoch(r->train);
    long long used = 0, seen = 0;
    int steps = 0;
    for (;;) {
        long long k = batch_ramp_step_tokens(r->ramp_tokens, r->ramp_start, r->total_batch, seen) / r->ramp_start;
        if (used + k > units || steps == INT_MAX - 1) return steps;
        used += k, seen += k * r->ramp_start, steps++;
    }
}

/* The tokens trained before step (1-based): the ramp's steps summed, else (step - 1) * total_batch. */
static long long tokens_before(const Run *r, int step) {
    if (!r->ramp_tokens) return (long long)(step - 1) * r->total_batch;
    long long seen = 0;
    for (int s = 1; s < step; s++) seen += batch_ramp_step_tokens(r->ramp_tokens, r->ramp_start, r->total_batch, seen);
    return seen;
}

/* The batch (-d resolved), the data, -x resolved. Returns 0, or 1 when a finished run has nothing
 * left to train (the loaders closed again). */
static int run_open(Run *r, const TrainConfig *tc, TrainBackend *be, int resume_step) {
    const ModelConfig *cfg = &be->cfg;
    memset(r, 0, sizeof *r);
    r->tc = tc, r->be = be, r->resume_step = resume_step;
    const int B = r->B = tc->B, T = r->T = tc->T, P = r->P = tc->num_processes;
    if (T > cfg->max_seq_len) llmc_die("-t %d exceeds the model's maximum sequence length %d (maxT)", T, cfg->max_seq_len);
    const long long micro_tokens = r->micro_tokens = (long long)B * T * P;
    const long long total_batch = r->total_batch = tc->total_batch ? tc->total_batch : micro_tokens;
    if (total_batch % micro_tokens != 0)
        llmc_die("-d %lld is not a multiple of B*T*processes = %d*%d*%d = %lld tokens", total_batch, B, T, P, micro_tokens);
    if (total_batch / micro_tokens > INT_MAX)
        llmc_die("-d %lld needs %lld gradient accumulation steps of %lld tokens; at most %d are supported",
                 total_batch, total_batch / micro_tokens, micro_tokens, INT_MAX);
    r->accum = (int)(total_batch / micro_tokens);
    if (tc->batch_ramp[0]) {
        batch_ramp_parse(tc->batch_ramp, &r->ramp_tokens, &r->ramp_start); /* (checked by the flag parser) */
        if (!r->ramp_start) r->ramp_start = micro_tokens;
        if (r->ramp_start % micro_tokens != 0 || total_batch % r->ramp_start != 0)
            llmc_die("--batch-ramp %s: START %lld must be a multiple of B*T*processes = %lld tokens and divide -d %lld",
                     tc->batch_ramp, r->ramp_start, micro_tokens, total_batch);
    }
    Dist *dist = r->dist = dist_world();
    r->data = dist_data_group();
    if (P != r->data->size) llmc_die("internal: -pn %d but the data-parallel group has %d ranks", P, r->data->size);

    char origin[4200];
    if (resume_step >= 0) checkpoint_paths(tc->output_dir, resume_step, 0, origin, NULL, NULL, sizeof origin);
    else snprintf(origin, sizeof origin, "%s", tc->init);
    /* The training data's unit is a whole optimizer step, so its order never depends on the
     * number of ranks or -b (dataloader.h: data-parallel split). */
    const int step_rows = (int)((r->ramp_tokens ? r->ramp_start : total_batch) / T);
    r->train = dataloader_open_for_model(tc->train_pattern, step_rows, T, 0, 1, tc->shuffle, tc->seed, cfg->vocab_size, 1,
                                         origin);
    if (tc->val_every > 0) {
        r->val = dataloader_open_for_model(tc->val_pattern, B, T, tc->process_rank, P, 0, 0, cfg->vocab_size, 0, origin);
        int avail = (int)dataloader_batches_per_epoch(r->val);
        r->val_batches = tc->val_max_steps < 0 || tc->val_max_steps > avail ? avail : tc->val_max_steps;
    }
    mc_eval_open(&r->mc, tc, be, 0);
    int max_steps = r->max_steps = tc->max_steps;
    if (max_steps < 0) {
        max_steps = r->max_steps = r->ramp_tokens ? ramp_steps_per_epoch(r) : (int)dataloader_batches_per_epoch(r->train);
        if (max_steps < 1)
            llmc_die("one epoch of '%s' (%zu tokens) is shorter than one optimizer step of %lld tokens",
                     tc->train_pattern, dataloader_num_tokens(r->train), total_batch);
    }
    if (resume_step == max_steps) { /* a restart loop (-y 1) after the run finished: nothing is lost, nothing to do */
        if (dist->rank == 0)
            printf("the run in '%s' already reached step %d (-x %d): nothing left to train; its last checkpoint "
                   "is complete\n", tc->output_dir, resume_step, max_steps);
        dataloader_close(r->train);
        if (r->val) dataloader_close(r->val);
        mc_eval_close(&r->mc);
        return 1;
    }
    if (resume_step > max_steps)
        llmc_die("the checkpoint in '%s' is at step %d, past -x %d (give -x %d or more to continue it)", tc->output_dir,
                 resume_step, max_steps, resume_step);
    r->rc = *tc;
    r->rc.total_batch = total_batch;
    r->rc.max_steps = max_steps;
    if (resume_step >= 0) train_resume_check_config(&r->rc, resume_step);
    r->run_start = report_wall_s();
    return 0;
}

/* Token buffers, the optimizer (the backend's own, else the loop's host AdamW), the plan checked,
 * a resume's state loaded, the log and the sample tokenizer opened. */
static void run_setup(Run *r) {
    const TrainConfig *tc = r->tc;
    TrainBackend *be = r->be;
    r->inputs = (int *)mem_calloc(MEM_TOKENS, (size_t)r->B * r->T, sizeof(int), "input tokens");
    r->targets = (int *)mem_calloc(MEM_TOKENS, (size_t)r->B * r->T, sizeof(int), "target tokens");
    r->step_inputs = (int *)mem_calloc(MEM_TOKENS, (size_t)r->total_batch, sizeof(int), "step input tokens");
    r->step_targets = (int *)mem_calloc(MEM_TOKENS, (size_t)r->total_batch, sizeof(int), "step target tokens");
    /* (before -z 3 leaves each rank only its shard; -tp: over the data-parallel group, whose ranks hold
     * the same part of the model) */
    check_ranks_agree(r->data, &r->rc, be, r->train, r->val);
    const int host_optimizer = be->optimizer.step == NULL;
    r->opt = be->optimizer;
    if (!host_optimizer && adafactor_selected(tc))
        llmc_die("--optimizer adafactor on the device is not built yet; use --offload optimizer (Adafactor on the host)");
    if (host_optimizer && adafactor_selected(tc)) host_adafactor_open(&r->opt, &r->adafactor, tc, be, r->data);
    else if (host_optimizer) host_adamw_open(&r->opt, &r->host, tc, be, r->data);
    if (tc->zero_stage > r->opt.zero_max)
        llmc_die("-z %d: this backend keeps its own optimizer, which shards up to -z %d", tc->zero_stage, r->opt.zero_max);
    /* what is allocated now must be this rank's plan, class by class */
    train_memory_plan(&r->rc, &be->cfg, be->ops.plan, host_optimizer, be->gpu ? "GPU" : "CPU", &r->plan);
    mem_check_plan(&r->plan);
    r->leak_class = train_planted_leak_class();
    rng_seed(&r->sampler_rng, tc->seed ^ 0x5A3C9E1Dull);
    if (r->resume_step >= 0)
        train_load_state(tc, be, &r->opt, r->train, &r->sampler_rng, r->resume_step, r->total_batch);
    if (tc->overwrite && r->dist->rank == 0) {
        char names[512];
        dist_busy_begin(r->dist, DIST_BUSY_OUTPUT_DIR);
        int n = rundir_run_files(tc->output_dir, names, sizeof names);
        rundir_remove_run(tc->output_dir, tc->init, "--overwrite 1");
        dist_busy_end(r->dist);
        if (n) printf("--overwrite 1: deleted the %d file(s) of the previous run in '%s' (%s)\n", n, tc->output_dir, names);
    }
    logger_open(&r->lg, r->dist->rank == 0 ? tc->output_dir : "", r->resume_step); /* rank 0 writes the log */
    report_run_record(&r->lg, &r->rc, be, r->resume_step);
    if (tc->sample_every > 0) sample_text_open(&r->text, tc, &be->cfg);
}

static void run_print_start(const Run *r) {
    const TrainBackend *be = r->be;
    const ModelConfig *cfg = &be->cfg;
    train_config_print(&r->rc, be->gpu, stdout);
    printf("backend: %s\n", be->name);
    printf("model: L %d, NH %d, C %d, maxT %d, V %d (padded %d): %zu parameters", cfg->num_layers, cfg->num_heads,
           cfg->channels, cfg->max_seq_len, cfg->vocab_size, cfg->padded_vocab_size,
           dist_tp_group()->size > 1 ? be->arch->arch->parameter_specs(be->arch, NULL) : be->num_parameters);
    if (dist_tp_group()->size > 1) printf(" (%zu on each of the %d tensor-parallel ranks: -tp)", be->num_parameters, dist_tp_group()->size);
    printf("\n");
    printf("train data: %zu tokens in %d shard(s); val: %d batches of %lld tokens\n", dataloader_num_tokens(r->train),
           dataloader_num_shards(r->train), r->val_batches, r->micro_tokens);
    printf("batch: %lld tokens per step = %d x %d x %d processes x %d accumulation steps; %d steps%s\n", r->total_batch,
           r->B, r->T, r->P, r->accum, r->max_steps, r->resume_step >= 0 ? " (resuming)" : "");
    if (r->dist->size > 1 && r->dist->size != r->P)
        printf("processes: %d ranks started by %s: %d data-parallel x %d tensor-parallel (-tp; tp fastest in rank order)\n",
               r->dist->size, r->dist->launcher, r->P, r->dist->size / r->P);
    else if (r->P > 1) printf("processes: %d ranks started by %s\n", r->P, r->dist->launcher);
    if (r->resume_step >= 0) printf("resumed from step %d in '%s'\n", r->resume_step, r->tc->output_dir);
    be->state.print_memory(be->model, stdout);
    if (r->opt.print_memory) r->opt.print_memory(r->opt.ctx, stdout);
    printf("memory plan: %zu bytes accounted = the plan, class by class (--plan prints it)\n", mem_live_total(be->gpu));
    fflush(stdout);
}

/* The validation loss (val) and the multiple-choice evaluation (mc) of step, printed and logged
 * in one record. */
static void run_validate(Run *r, int step, int val, int mc) {
    float vl = 0.0f;
    if (val) {
        vl = evaluate(r->be, r->val, r->val_batches, r->inputs, r->targets, r->B, r->T);
        report_val_note(&r->val_best, &r->val_last, vl, step);
        printf("val loss %.6f (step %d)\n", vl, step);
    }
    McResult mr = {0, 0, 0.0};
    if (mc) {
        mr = mc_eval_run(&r->mc, r->be);
        mc_eval_report(&mr);
    }
    log_begin(&r->lg);
    log_int(&r->lg, "step", step);
    if (val) log_float(&r->lg, "val_loss", vl);
    if (mc) mc_eval_report_fields(&mr, &r->lg);
    log_end(&r->lg);
}

/* The step's gradients: cleared, the micro-steps over this rank's rows, reduced over the ranks.
 * Returns the step's mean loss over the global batch. */
static float run_gradients(Run *r, StepResult *s) {
    TrainBackend *be = r->be;
    const int B = r->B, T = r->T;
    r->be->ops.zero_grad(be->model);
    if (r->opt.zero_grad) r->opt.zero_grad(r->opt.ctx);
    double loss_sum = 0.0;
    if (!r->tc->overfit_batch || !r->have_overfit_batch) {
        const long long unit = r->ramp_tokens ? r->ramp_start : r->total_batch;
        for (long long u = 0; u < s->tokens / unit; u++) { /* --batch-ramp: the step's units back to back */
            dataloader_next(r->train, r->step_inputs + u * unit, r->step_targets + u * unit);
            s->wait_ms += dataloader_last_wait_ms(r->train);
        }
        r->have_overfit_batch = 1;
    }
    const int accum = (int)(s->tokens / r->micro_tokens);
    const float loss_weight = r->opt.loss_weight(r->opt.ctx, accum); /* (the CUDA trainer takes accum from here) */
    for (int micro = 0; micro < accum; micro++) {
        /* this rank's rows of the step (dataloader.h: data-parallel split) */
        size_t row = ((size_t)micro * r->P + (size_t)r->data->rank) * (size_t)B;
        memcpy(r->inputs, r->step_inputs + row * T, (size_t)B * T * sizeof(int));
        memcpy(r->targets, r->step_targets + row * T, (size_t)B * T * sizeof(int));
        loss_sum += be->ops.train_micro_step(be->model, r->inputs, r->targets, B, T, loss_weight);
    }
    if (be->ops.step_loss) loss_sum = be->ops.step_loss(be->model); /* (the returns above were not waited for) */
    test_hang(r->dist, s->step);
    r->opt.reduce(r->opt.ctx);
    dist_allreduce_f64(r->data, &loss_sum, 1);
    if (be->ops.loss_parts) {
        double parts[2];
        be->ops.loss_parts(be->model, parts);
        dist_allreduce_f64(r->data, parts, 2);
        s->has_parts = 1, s->ce = parts[0] / accum / r->P, s->kd = parts[1] / accum / r->P;
    }
    return (float)(loss_sum / accum / r->P);
}

/* Divergence (always on): a non-finite loss, or one above diverged_loss (ten times a uniform
 * guess's ln V), means the weights are broken: the update is skipped, no checkpoint is written
 * and the value never enters the outlier windows. A non-finite gradient norm with a sane loss
 * (e.g. an fp16 loss-scale overflow) only skips the update. -sl/-sg outliers skip the update but
 * do enter the windows (see Outliers). Updates unless skipped; returns 1 when the step diverged. */
static int run_update(Run *r, StepResult *s) {
    const TrainConfig *tc = r->tc;
    const float loss = s->loss, norm = s->norm;
    const int diverged = !isfinite(loss) || loss > r->diverged_loss;
    const int finite_norm = isfinite(norm);
    double lz = diverged || !finite_norm ? 0.0 : outlier_zscore(&r->loss_hist, loss);
    double nz = diverged || !finite_norm ? 0.0 : outlier_zscore(&r->norm_hist, norm);
    s->skip = diverged ? (isfinite(loss) ? "diverged loss" : "non-finite loss")
              : !finite_norm ? "non-finite gradient"
              : tc->skip_loss_z > 0 && lz > tc->skip_loss_z ? "loss outlier"
              : tc->skip_norm_z > 0 && nz > tc->skip_norm_z ? "grad-norm outlier"
                                                             : NULL;
    if (!s->skip) {
        float scale = tc->grad_clip > 0.0f && norm > tc->grad_clip ? tc->grad_clip / norm : 1.0f;
        const AdamWStep a = {s->lr, tc->beta1, tc->beta2, tc->eps, tc->weight_decay, s->step, scale};
        r->opt.step(r->opt.ctx, &a);
    }
    if (!diverged && finite_norm) {
        outlier_push(&r->loss_hist, loss);
        outlier_push(&r->norm_hist, norm);
    }
    r->consecutive_skips = s->skip ? r->consecutive_skips + 1 : 0;
    r->last_diverged = diverged;
    if (!diverged) r->healthy_ckpt = r->last_ckpt;
    return diverged;
}

/* The step line: loss, lr, norm, time, throughput, data wait, epoch, elapsed and ETA. */
static void run_print_step(const Run *r, const StepResult *s) {
    char extra[256] = "", elapsed[32], eta[32], comm[160] = "";
    const TrainBackend *be = r->be;
    if (r->dist->size > 1) snprintf(comm, sizeof comm, " | comm %.1f ms, %.2f MB", s->comm_ms, s->comm_bytes / 1e6);
    if (r->opt.io_report) r->opt.io_report(r->opt.ctx, comm + strlen(comm), sizeof comm - strlen(comm), NULL);
    if (be->report.step_extras) be->report.step_extras(be->model, s->step_ms, s->tok_s, extra, sizeof extra, NULL);
    else
        snprintf(extra, sizeof extra, " | mem %.2f GiB (peak %.2f)", mem_live_total(0) / 1073741824.0,
                 mem_peak_total(0) / 1073741824.0);
    /* ETA from this process's mean time per step so far, evaluation and checkpoints included */
    double now = report_wall_s();
    report_duration(elapsed, sizeof elapsed, now - r->run_start);
    report_duration(eta, sizeof eta, (now - r->loop_start) / (s->step - r->first_step + 1) * (r->max_steps - s->step));
    char parts[64] = ""; /* (distillation: the loss's two terms) */
    if (s->has_parts) snprintf(parts, sizeof parts, " (ce %.4f, kd %.4g)", s->ce, s->kd);
    printf("step %5d/%d | loss %.6f%s | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f GFLOP/s | data wait %.2f ms"
           " | epoch %.2f | %s, ETA %s%s%s%s%s\n",
           s->step, r->max_steps, s->loss, parts, s->lr, s->norm, s->step_ms, s->tok_s,
           r->flops_per_step * ((double)s->tokens / r->total_batch) / (s->step_ms * 1e6),
           s->wait_ms,
           r->ramp_tokens ? (double)r->seen_tokens / ((double)r->ramp_start * r->batches_per_epoch) : (double)s->step / r->batches_per_epoch,
           elapsed, eta, comm, extra, s->skip ? " | SKIPPED: " : "",
           s->skip ? s->skip : "");
    fflush(stdout);
}

/* The step's log record (with -lg the telemetry line, after the first step planned vs measured). */
static void run_log_step(Run *r, const StepResult *s) {
    TrainBackend *be = r->be;
    Logger *lg = &r->lg;
    log_begin(lg);
    log_int(lg, "step", s->step);
    log_float(lg, "train_loss", s->loss);
    if (s->has_parts) {
        log_float(lg, "train_ce", (float)s->ce);
        log_float(lg, "train_kd", (float)s->kd);
    }
    if (r->ramp_tokens) log_int(lg, "step_tokens", s->tokens); /* (only with the ramp: other logs stay as they were) */
    log_float(lg, "lr", s->lr);
    log_float(lg, "grad_norm", s->norm);
    log_double(lg, "step_ms", s->step_ms);
    log_double(lg, "tokens_per_s", s->tok_s);
    log_double(lg, "data_wait_ms", s->wait_ms);
    if (r->dist->size > 1) {
        log_double(lg, "comm_ms", s->comm_ms);
        log_int(lg, "comm_bytes", s->comm_bytes);
    }
    if (s->skip) log_string(lg, "skipped", s->skip);
    if (r->opt.io_report) r->opt.io_report(r->opt.ctx, NULL, 0, lg);
    if (be->report.step_extras) be->report.step_extras(be->model, s->step_ms, s->tok_s, NULL, 0, lg);
    log_int(lg, "mem_bytes", (long long)mem_live_total(be->gpu));
    log_int(lg, "mem_peak_bytes", (long long)mem_peak_total(be->gpu));
    log_object_begin(lg, "mem_by_class");
    for (int c = 0; c < MEM_NUM_CLASSES; c++)
        if (mem_live((MemClass)c, be->gpu)) log_int(lg, mem_class_names[c], (long long)mem_live((MemClass)c, be->gpu));
    log_object_end(lg);
    if (be->report.telemetry && r->tc->gpu_log_every > 0 && s->step % r->tc->gpu_log_every == 0) {
        char gpu[512];
        be->report.telemetry(be->model, gpu, sizeof gpu, lg);
        printf("gpu  %5d/%d%s\n", s->step, r->max_steps, gpu);
        fflush(stdout);
    }
    if (s->step == r->first_step && r->dist->rank == 0) train_print_planned_vs_measured(&r->plan, lg); /* fields of this record */
    log_end(lg);
}

/* --max-skips reached, or the last step diverged: the run stops with where to go on from. */
static void run_check_stop(const Run *r, const StepResult *s, int last) {
    const TrainConfig *tc = r->tc;
    if (tc->max_skips > 0 && r->consecutive_skips >= tc->max_skips) {
        char where[4400] = "there is no healthy checkpoint";
        if (r->healthy_ckpt >= 0)
            snprintf(where, sizeof where, "the newest healthy checkpoint is step %d in '%s'", r->healthy_ckpt, tc->output_dir);
        if (r->last_ckpt > r->healthy_ckpt && r->last_ckpt > r->resume_step) {
            size_t n = strlen(where);
            snprintf(where + n, sizeof where - n, " (step %d was saved after it and may hold the diverging weights)",
                     r->last_ckpt);
        }
        llmc_die("training stopped at step %d: %d consecutive steps were skipped (last: %s, loss %g, grad norm %g; "
                 "--max-skips %d); %s. Lower the learning rate (-l), or raise -sl/-sg or --max-skips",
                 s->step, r->consecutive_skips, s->skip, (double)s->loss, (double)s->norm, tc->max_skips, where);
    }
    if (last && r->last_diverged)
        llmc_die("the last step (%d) diverged (%s, loss %g): the run did not end in a usable model%s; the newest "
                 "healthy checkpoint is step %d (-1: none). Lower the learning rate (-l)",
                 s->step, s->skip, (double)s->loss, tc->output_dir[0] ? " and no final checkpoint was written" : "",
                 r->healthy_ckpt);
}

/* After the step's record: validation, the sample, the stop checks and the checkpoint. */
static void run_after_step(Run *r, const StepResult *s) {
    const TrainConfig *tc = r->tc;
    const int step = s->step, last = step == r->max_steps;
    /* -h 1 evaluates where llm.c does: with validation (every -v steps after step 0) and at the last step */
    const int val = r->val && (step % tc->val_every == 0 || last);
    const int mc = r->mc.file && ((tc->val_every > 0 && step % tc->val_every == 0) || last);
    if (val || mc) run_validate(r, step, val, mc);
    /* rank 0 prints the sample; with -z 3 every rank runs it (each forward gathers from all; the
     * GPU's own optimizer too, hence the flag, not the optimizer's stage) */
    /* (-ep: every rank holds some experts; -tp: every rank of a tensor-parallel group runs the forward) */
    const int all_sample = tc->zero_stage == 3 || tc->expert_parallel > 1 || dist_tp_group()->size > 1;
    if (tc->sample_every > 0 && (step % tc->sample_every == 0 || last) && (r->dist->rank == 0 || all_sample)) {
        if (!all_sample) dist_busy_begin(r->dist, DIST_BUSY_SAMPLE); /* the others wait: rank 0's heartbeat */
        sample_text_generate(r->be, &r->text, &r->sampler_rng, r->T, tc->gen_tokens);
        dist_busy_end(r->dist);
    }
    run_check_stop(r, s, last);
    /* with -o the last step is always saved: the model, and the state to continue it */
    if (tc->output_dir[0] && (last || (tc->ckpt_every > 0 && step % tc->ckpt_every == 0))) {
        if (r->last_diverged) {
            /* a diverged model is never written */
            printf("note: no checkpoint at step %d: the step diverged (%s)\n", step, s->skip);
        } else {
            train_save_checkpoint(tc, &r->rc, r->be, &r->opt, r->train, &r->sampler_rng, step, r->healthy_ckpt);
            checkpoint_paths(tc->output_dir, step, 0, r->saved_model, NULL, NULL, sizeof r->saved_model);
            if (r->be->state.model_path) r->be->state.model_path(r->be->model, tc->output_dir, step, 1, r->saved_model, sizeof r->saved_model);
            r->last_ckpt = step;
        }
    }
}

/* The communication since the last call: the whole group's collectives and (-tp) those of the
 * tensor- and data-parallel groups (dist/layout.h), which count on their own Dists. */
static void take_comm(Run *r, double *ms, long long *bytes) {
    Dist *groups[3] = {r->dist, dist_tp_group(), r->data};
    *ms = 0.0, *bytes = 0;
    for (int i = 0; i < 3; i++) {
        if (i > 0 && (groups[i] == r->dist || groups[i]->size == 1)) continue;
        double m;
        long long b;
        dist_take_comm(groups[i], &m, &b);
        *ms += m, *bytes += b;
    }
}

static void run_step(Run *r, int step) {
    StepResult s = {0};
    s.step = step;
    s.tokens = r->ramp_tokens ? batch_ramp_step_tokens(r->ramp_tokens, r->ramp_start, r->total_batch, r->seen_tokens)
                              : r->total_batch;
    double t0 = now_ms();
    take_comm(r, &s.comm_ms, &s.comm_bytes); /* counted from here */
    s.loss = run_gradients(r, &s);
    s.lr = lr_at(r->schedule, step - 1, r->max_steps, r->tc->warmup, r->tc->lr, r->tc->final_frac);
    s.norm = r->opt.grad_norm(r->opt.ctx);
    run_update(r, &s);
    s.step_ms = now_ms() - t0;
    s.tok_s = s.tokens / (s.step_ms / 1e3);
    r->seen_tokens += s.tokens;
    r->trained_tokens += s.tokens;
    take_comm(r, &s.comm_ms, &s.comm_bytes);
    if (r->leak_class >= 0) mem_calloc((MemClass)r->leak_class, 4096, 1, "planted leak (LLMC_TEST_LEAK)");
    train_check_leaks(step, r->first_step + 1, r->leak_base);
    run_print_step(r, &s);
    run_log_step(r, &s);
    run_after_step(r, &s);
}

static void run_close(Run *r, int last_step) {
    report_summary(r->first_step, last_step, r->max_steps, r->trained_tokens, report_wall_s() - r->run_start, &r->val_best,
                   &r->val_last, r->saved_model);
    sample_text_close(&r->text);
    logger_close(&r->lg);
    dataloader_close(r->train);
    if (r->val) dataloader_close(r->val);
    mc_eval_close(&r->mc);
    mem_free(MEM_TOKENS, r->inputs, (size_t)r->B * r->T * sizeof(int));
    mem_free(MEM_TOKENS, r->targets, (size_t)r->B * r->T * sizeof(int));
    mem_free(MEM_TOKENS, r->step_inputs, (size_t)r->total_batch * sizeof(int));
    mem_free(MEM_TOKENS, r->step_targets, (size_t)r->total_batch * sizeof(int));
    if (r->opt.free) r->opt.free(r->opt.ctx);
}

int train_run(const TrainConfig *tc, TrainBackend *be, int resume_step) {
    if (tc->max_steps == 0) return evaluate_only(tc, be, resume_step);
    static Run run; /* large (the plan, the outlier windows); one run per process */
    Run *r = &run;
    if (run_open(r, tc, be, resume_step)) return 0;
    run_setup(r);
    run_print_start(r);
    const ModelConfig *cfg = &be->cfg;
    r->schedule = lr_schedule_parse(tc->schedule);
    r->flops_per_step =
        be->arch->arch->flops_per_token(be->arch, r->T) * (double)r->total_batch;
    r->diverged_loss = 10.0f * logf((float)cfg->vocab_size > 2.0f ? (float)cfg->vocab_size : 2.0f);
    r->last_ckpt = resume_step, r->healthy_ckpt = -1;
    r->val_best = r->val_last = (ValRecord){0.0f, -1};
    r->batches_per_epoch = (double)dataloader_batches_per_epoch(r->train);
    r->first_step = resume_step < 0 ? 1 : resume_step + 1;
    r->seen_tokens = tokens_before(r, r->first_step);
    if (r->val && resume_step < 0) run_validate(r, 0, 1, 0);
    r->loop_start = report_wall_s();
    int last_step = r->first_step - 1; /* the last step done */
    for (int step = r->first_step; step <= r->max_steps; step++) {
        run_step(r, step);
        last_step = step;
    }
    run_close(r, last_step);
    return 0;
}
