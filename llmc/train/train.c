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
#include "llmc/formats/modelfile.h"
#include "llmc/formats/rundir.h"
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
        sum += be->eval_loss(be->model, inputs, targets, B, T);
    }
    Dist *d = dist_world();
    dist_allreduce_f64(d, &sum, 1); /* every rank evaluated its slice of each global batch */
    return (float)(sum / batches / d->size);
}

/* Faults: every rank must run the same configuration on the same data and model. Rank 0's
 * description (resolved flags, training data size, parameter CRC) is sent to all; a rank whose
 * own differs names the first differing line, and every rank stops. */
static void check_ranks_agree(Dist *d, const TrainConfig *rc, const TrainBackend *be, DataLoader *train) {
    if (d->size == 1) return;
    TrainConfig c = *rc;
    c.process_rank = 0;
    enum { CAP = 32768 };
    char *mine = (char *)mallocCheck(CAP, "configuration text"), *root = (char *)mallocCheck(CAP, "configuration text");
    size_t n = train_config_to_text(&c, mine, CAP - 256);
    uLong crc = crc32(0L, Z_NULL, 0);
    const unsigned char *p = (const unsigned char *)be->host_params;
    for (size_t left = be->num_parameters * sizeof(float); left > 0;) {
        uInt k = left > (1u << 30) ? (1u << 30) : (uInt)left;
        crc = crc32(crc, p, k);
        p += k;
        left -= k;
    }
    snprintf(mine + n, CAP - n, "training data: %zu tokens in %d shard(s)\ninitial parameters: %zu, crc32 %08lx\n",
             dataloader_num_tokens(train), dataloader_num_shards(train), be->num_parameters, (unsigned long)crc);
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
                 "says how on stderr); start every rank with the same command and files", d->size, ranks);
}

/* -x 0: the validation loss of the loaded model (-e, or with -y 1 the latest checkpoint in -o),
 * over the batches a training run's evaluation uses; printed, and logged with "eval_only" when
 * -o is given (appended: the log's existing lines are kept). No training data, no checkpoint. */
static int evaluate_only(const TrainConfig *tc, TrainBackend *be, int resume_step) {
    const int B = tc->B, T = tc->T;
    if (tc->val_every <= 0) llmc_die("-x 0 evaluates the validation loss, but -v %d disables validation", tc->val_every);
    DataLoader *val = dataloader_open(tc->val_pattern, B, T, tc->process_rank, tc->num_processes, 0, 0,
                                      be->cfg.vocab_size, 0);
    int avail = (int)dataloader_batches_per_epoch(val);
    int batches = tc->val_max_steps < 0 || tc->val_max_steps > avail ? avail : tc->val_max_steps;
    int *inputs = (int *)mallocCheck((size_t)B * T * sizeof(int), "input tokens");
    int *targets = (int *)mallocCheck((size_t)B * T * sizeof(int), "target tokens");
    const int step = resume_step < 0 ? 0 : resume_step;
    printf("evaluation only (-x 0): %s, %zu parameters, %d validation batches of %d x %d tokens\n",
           resume_step < 0 ? tc->init : tc->output_dir, be->num_parameters, batches, B, T);
    printf("backend: %s\n", be->name);
    float vl = evaluate(be, val, batches, inputs, targets, B, T);
    printf("val loss %.6f (step %d)\n", vl, step);
    fflush(stdout);
    if (tc->output_dir[0] && dist_world()->rank == 0) { /* rank 0 writes the log */
        Logger lg; /* the directory was created and locked by train_resolve_init */
        logger_open(&lg, tc->output_dir, INT_MAX); /* keeps every existing line */
        log_begin(&lg);
        log_int(&lg, "step", step);
        log_float(&lg, "val_loss", vl);
        log_int(&lg, "eval_only", 1);
        log_string(&lg, "model", resume_step < 0 ? tc->init : tc->output_dir);
        log_end(&lg);
        logger_close(&lg);
    }
    dataloader_close(val);
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

int train_run(const TrainConfig *tc, TrainBackend *be, int resume_step) {
    if (tc->max_steps == 0) return evaluate_only(tc, be, resume_step);
    const ModelConfig *cfg = &be->cfg;
    const int B = tc->B, T = tc->T, P = tc->num_processes;
    if (T > cfg->max_seq_len) llmc_die("-t %d exceeds the model's maximum sequence length %d (maxT)", T, cfg->max_seq_len);
    const long long micro_tokens = (long long)B * T * P;
    const long long total_batch = tc->total_batch ? tc->total_batch : micro_tokens;
    if (total_batch % micro_tokens != 0)
        llmc_die("-d %lld is not a multiple of B*T*processes = %d*%d*%d = %lld tokens", total_batch, B, T, P, micro_tokens);
    if (total_batch / micro_tokens > INT_MAX)
        llmc_die("-d %lld needs %lld gradient accumulation steps of %lld tokens; at most %d are supported",
                 total_batch, total_batch / micro_tokens, micro_tokens, INT_MAX);
    const int accum = (int)(total_batch / micro_tokens);
    Dist *dist = dist_world();
    if (P != dist->size) llmc_die("internal: -pn %d but the process group has %d ranks", P, dist->size);

    char origin[4200];
    if (resume_step >= 0) checkpoint_paths(tc->output_dir, resume_step, 0, origin, NULL, NULL, sizeof origin);
    else snprintf(origin, sizeof origin, "%s", tc->init);
    /* The training data's unit is a whole optimizer step, so its order never depends on the
     * number of ranks or -b (dataloader.h: data-parallel split). */
    const int step_rows = (int)(total_batch / T);
    DataLoader *train = dataloader_open_for_model(tc->train_pattern, step_rows, T, 0, 1, tc->shuffle, tc->seed,
                                                  cfg->vocab_size, 1, origin);
    DataLoader *val = NULL;
    int val_batches = 0;
    if (tc->val_every > 0) {
        val = dataloader_open_for_model(tc->val_pattern, B, T, tc->process_rank, P, 0, 0, cfg->vocab_size, 0, origin);
        int avail = (int)dataloader_batches_per_epoch(val);
        val_batches = tc->val_max_steps < 0 || tc->val_max_steps > avail ? avail : tc->val_max_steps;
    }
    int max_steps = tc->max_steps;
    if (max_steps < 0) {
        max_steps = (int)dataloader_batches_per_epoch(train);
        if (max_steps < 1)
            llmc_die("one epoch of '%s' (%zu tokens) is shorter than one optimizer step of %lld tokens",
                     tc->train_pattern, dataloader_num_tokens(train), total_batch);
    }
    if (resume_step == max_steps) { /* a restart loop (-y 1) after the run finished: nothing is lost, nothing to do */
        if (dist->rank == 0)
            printf("the run in '%s' already reached step %d (-x %d): nothing left to train; its last checkpoint "
                   "is complete\n", tc->output_dir, resume_step, max_steps);
        dataloader_close(train);
        if (val) dataloader_close(val);
        return 0;
    }
    if (resume_step > max_steps)
        llmc_die("the checkpoint in '%s' is at step %d, past -x %d (give -x %d or more to continue it)", tc->output_dir,
                 resume_step, max_steps, resume_step);
    /* the configuration as run: -d, -x (and, from the trainer, --threads) resolved */
    TrainConfig rc = *tc;
    rc.total_batch = total_batch;
    rc.max_steps = max_steps;
    if (resume_step >= 0) train_resume_check_config(&rc, resume_step);
    const double run_start = report_wall_s();

    int *inputs = (int *)mem_calloc(MEM_TOKENS, (size_t)B * T, sizeof(int), "input tokens");
    int *targets = (int *)mem_calloc(MEM_TOKENS, (size_t)B * T, sizeof(int), "target tokens");
    int *step_inputs = (int *)mem_calloc(MEM_TOKENS, (size_t)total_batch, sizeof(int), "step input tokens");
    int *step_targets = (int *)mem_calloc(MEM_TOKENS, (size_t)total_batch, sizeof(int), "step target tokens");
    /* the loop's optimizer when the backend hands over host gradients; else the backend's own */
    Optimizer opt = {0};
    if (be->host_grads)
        optim_init_state(&opt, dist, tc->zero_stage, be->num_parameters, be->param_specs,
                         be->num_param_specs ? be->num_param_specs : NUM_PARAMETER_TENSORS, optstate_parse(tc->optim_state));
    else if (tc->zero_stage > be->zero_max)
        llmc_die("-z %d: this backend keeps its own optimizer, which shards up to -z %d", tc->zero_stage, be->zero_max);
    check_ranks_agree(dist, &rc, be, train); /* (before -z 3 leaves each rank only its shard) */
    if (be->host_grads && be->attach_optimizer) be->attach_optimizer(be->model, &opt, &be->host_params, &be->host_grads);
    /* what is allocated now must be this rank's plan, class by class */
    MemPlan plan;
    train_memory_plan(&rc, cfg, be->plan, be->host_grads != NULL, be->gpu ? "GPU" : "CPU", &plan);
    mem_check_plan(&plan);
    const int leak_class = train_planted_leak_class();
    size_t leak_base[2][MEM_NUM_CLASSES] = {{0}};
    Rng sampler_rng;
    rng_seed(&sampler_rng, tc->seed ^ 0x5A3C9E1Dull);
    if (resume_step >= 0) train_load_state(tc, be, &opt, train, &sampler_rng, resume_step, total_batch);
    if (tc->overwrite && dist->rank == 0) {
        char names[512];
        int n = rundir_run_files(tc->output_dir, names, sizeof names);
        rundir_remove_run(tc->output_dir);
        if (n) printf("--overwrite 1: deleted the %d file(s) of the previous run in '%s' (%s)\n", n, tc->output_dir, names);
    }
    Logger lg;
    logger_open(&lg, dist->rank == 0 ? tc->output_dir : "", resume_step); /* rank 0 writes the log */
    report_run_record(&lg, &rc, be, resume_step);
    SampleText text = {0};
    if (tc->sample_every > 0) sample_text_open(&text, tc, cfg);

    train_config_print(&rc, be->gpu, stdout);
    printf("backend: %s\n", be->name);
    printf("model: L %d, NH %d, C %d, maxT %d, V %d (padded %d): %zu parameters\n", cfg->num_layers, cfg->num_heads,
           cfg->channels, cfg->max_seq_len, cfg->vocab_size, cfg->padded_vocab_size, be->num_parameters);
    printf("train data: %zu tokens in %d shard(s); val: %d batches of %lld tokens\n", dataloader_num_tokens(train),
           dataloader_num_shards(train), val_batches, micro_tokens);
    printf("batch: %lld tokens per step = %d x %d x %d processes x %d accumulation steps; %d steps%s\n", total_batch,
           B, T, P, accum, max_steps, resume_step >= 0 ? " (resuming)" : "");
    if (P > 1) printf("processes: %d ranks started by %s\n", P, dist->launcher);
    if (resume_step >= 0) printf("resumed from step %d in '%s'\n", resume_step, tc->output_dir);
    be->print_memory(be->model, stdout);
    if (be->host_grads) optim_print_memory(&opt, stdout);
    printf("memory plan: %zu bytes accounted = the plan, class by class (--plan prints it)\n", mem_live_total(be->gpu));
    fflush(stdout);

    const int schedule = lr_schedule_parse(tc->schedule);
    const double flops_per_step =
        (be->flops_per_token > 0 ? be->flops_per_token : gpt2_flops_per_token(cfg, T)) * (double)total_batch;
    Outliers loss_hist = {{0}, 0, 0}, norm_hist = {{0}, 0, 0};
    const float diverged_loss = 10.0f * logf((float)cfg->vocab_size > 2.0f ? (float)cfg->vocab_size : 2.0f);
    /* last_ckpt: the newest checkpoint written (or resumed from); healthy_ckpt: the newest one a
     * later step trained from without diverging (its weights gave a sane loss) */
    int consecutive_skips = 0, last_diverged = 0, last_ckpt = resume_step, healthy_ckpt = -1;
    int have_overfit_batch = 0;
    ValRecord val_best = {0.0f, -1}, val_last = {0.0f, -1};
    char saved_model[4200] = "";
    const double batches_per_epoch = (double)dataloader_batches_per_epoch(train);
    const int first_step = resume_step < 0 ? 1 : resume_step + 1;
    const int offload = be->host_grads && strcmp(tc->offload, "optimizer") == 0;
    if (val && resume_step < 0) {
        float vl = evaluate(be, val, val_batches, inputs, targets, B, T);
        report_val_note(&val_best, &val_last, vl, 0);
        printf("val loss %.6f (step 0)\n", vl);
        log_begin(&lg);
        log_int(&lg, "step", 0);
        log_float(&lg, "val_loss", vl);
        log_end(&lg);
    }
    const double loop_start = report_wall_s();
    int last_step = first_step - 1; /* the last step done */
    for (int step = first_step; step <= max_steps; step++) {
        double t0 = now_ms(), wait_ms = 0.0, comm_ms;
        long long comm_bytes;
        dist_take_comm(dist, &comm_ms, &comm_bytes); /* counted from here */
        be->zero_grad(be->model);
        if (be->host_grads) optim_zero_grad(&opt);
        double loss_sum = 0.0;
        if (!tc->overfit_batch || !have_overfit_batch) {
            dataloader_next(train, step_inputs, step_targets);
            wait_ms += dataloader_last_wait_ms(train);
            have_overfit_batch = 1;
        }
        const float loss_weight = be->host_grads ? optim_loss_weight(&opt, accum) : 1.0f / accum;
        for (int micro = 0; micro < accum; micro++) {
            /* this rank's rows of the step (dataloader.h: data-parallel split) */
            size_t row = ((size_t)micro * P + (size_t)dist->rank) * (size_t)B;
            memcpy(inputs, step_inputs + row * T, (size_t)B * T * sizeof(int));
            memcpy(targets, step_targets + row * T, (size_t)B * T * sizeof(int));
            loss_sum += be->train_micro_step(be->model, inputs, targets, B, T, loss_weight);
        }
        if (be->step_loss) loss_sum = be->step_loss(be->model); /* (the returns above were not waited for) */
        if (be->host_grads && be->grads_to_host) be->grads_to_host(be->model);
        test_hang(dist, step);
        if (be->host_grads) optim_reduce(&opt, be->host_grads);
        dist_allreduce_f64(dist, &loss_sum, 1);
        float loss = (float)(loss_sum / accum / P);
        float lr = lr_at(schedule, step - 1, max_steps, tc->warmup, tc->lr, tc->final_frac);
        /* --offload optimizer: the norm from per-bucket sums of squares (one rank: those the backend
         * accumulated as each bucket's gradients reached the host; more: computed now, after the
         * reduction), the update bucket by bucket (optim_step_buckets) */
        const double *sumsq = offload && P == 1 && be->grad_bucket_sumsq ? be->grad_bucket_sumsq(be->model) : NULL;
        float norm = !be->host_grads ? be->grad_norm(be->model)
                     : offload       ? optim_grad_norm_buckets(&opt, be->host_grads, sumsq)
                                     : optim_grad_norm(&opt, be->host_grads);
        /* Divergence (always on): a non-finite loss, or one above diverged_loss (ten times a
         * uniform guess's ln V), means the weights are broken: the update is skipped, no checkpoint
         * is written and the value never enters the outlier windows. A non-finite gradient norm
         * with a sane loss (e.g. an fp16 loss-scale overflow) only skips the update. -sl/-sg
         * outliers skip the update but do enter the windows (see Outliers). */
        const int diverged = !isfinite(loss) || loss > diverged_loss;
        const int finite_norm = isfinite(norm);
        double lz = diverged || !finite_norm ? 0.0 : outlier_zscore(&loss_hist, loss);
        double nz = diverged || !finite_norm ? 0.0 : outlier_zscore(&norm_hist, norm);
        const char *skip = diverged ? (isfinite(loss) ? "diverged loss" : "non-finite loss")
                           : !finite_norm ? "non-finite gradient"
                           : tc->skip_loss_z > 0 && lz > tc->skip_loss_z ? "loss outlier"
                           : tc->skip_norm_z > 0 && nz > tc->skip_norm_z ? "grad-norm outlier"
                                                                          : NULL;
        if (!skip) {
            float scale = tc->grad_clip > 0.0f && norm > tc->grad_clip ? tc->grad_clip / norm : 1.0f;
            if (be->host_grads) {
                if (offload)
                    optim_step_buckets(&opt, be->host_params, be->host_grads, lr, tc->beta1, tc->beta2, tc->eps,
                                       tc->weight_decay, step, scale, be->params_bucket_to_device, be->model);
                else
                    optim_step(&opt, be->host_params, be->host_grads, lr, tc->beta1, tc->beta2, tc->eps,
                               tc->weight_decay, step, scale);
                if (be->params_from_host) be->params_from_host(be->model);
            } else {
                be->update(be->model, tc, lr, step, scale);
            }
        }
        if (!diverged && finite_norm) {
            outlier_push(&loss_hist, loss);
            outlier_push(&norm_hist, norm);
        }
        consecutive_skips = skip ? consecutive_skips + 1 : 0;
        last_diverged = diverged;
        if (!diverged) healthy_ckpt = last_ckpt;
        double step_ms = now_ms() - t0;
        double tok_s = total_batch / (step_ms / 1e3);
        dist_take_comm(dist, &comm_ms, &comm_bytes);
        if (leak_class >= 0) mem_calloc((MemClass)leak_class, 4096, 1, "planted leak (LLMC_TEST_LEAK)");
        train_check_leaks(step, first_step + 1, leak_base);
        char extra[256] = "", elapsed[32], eta[32], comm[96] = "";
        if (P > 1) snprintf(comm, sizeof comm, " | comm %.1f ms, %.2f MB", comm_ms, comm_bytes / 1e6);
        if (be->step_extras) be->step_extras(be->model, step_ms, tok_s, extra, sizeof extra, NULL);
        else
            snprintf(extra, sizeof extra, " | mem %.2f GiB (peak %.2f)", mem_live_total(0) / 1073741824.0,
                     mem_peak_total(0) / 1073741824.0);
        /* ETA from this process's mean time per step so far, evaluation and checkpoints included */
        double now = report_wall_s();
        report_duration(elapsed, sizeof elapsed, now - run_start);
        report_duration(eta, sizeof eta, (now - loop_start) / (step - first_step + 1) * (max_steps - step));
        printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f GFLOP/s | data wait %.2f ms"
               " | epoch %.2f | %s, ETA %s%s%s%s%s\n",
               step, max_steps, loss, lr, norm, step_ms, tok_s, flops_per_step / (step_ms * 1e6), wait_ms,
               (double)step / batches_per_epoch, elapsed, eta, comm, extra, skip ? " | SKIPPED: " : "", skip ? skip : "");
        fflush(stdout);
        log_begin(&lg);
        log_int(&lg, "step", step);
        log_float(&lg, "train_loss", loss);
        log_float(&lg, "lr", lr);
        log_float(&lg, "grad_norm", norm);
        log_double(&lg, "step_ms", step_ms);
        log_double(&lg, "tokens_per_s", tok_s);
        log_double(&lg, "data_wait_ms", wait_ms);
        if (P > 1) {
            log_double(&lg, "comm_ms", comm_ms);
            log_int(&lg, "comm_bytes", comm_bytes);
        }
        if (skip) log_string(&lg, "skipped", skip);
        if (be->step_extras) be->step_extras(be->model, step_ms, tok_s, NULL, 0, &lg);
        log_int(&lg, "mem_bytes", (long long)mem_live_total(be->gpu));
        log_int(&lg, "mem_peak_bytes", (long long)mem_peak_total(be->gpu));
        log_object_begin(&lg, "mem_by_class");
        for (int c = 0; c < MEM_NUM_CLASSES; c++)
            if (mem_live((MemClass)c, be->gpu)) log_int(&lg, mem_class_names[c], (long long)mem_live((MemClass)c, be->gpu));
        log_object_end(&lg);
        if (be->telemetry && tc->gpu_log_every > 0 && step % tc->gpu_log_every == 0) {
            char gpu[512];
            be->telemetry(be->model, gpu, sizeof gpu, &lg);
            printf("gpu  %5d/%d%s\n", step, max_steps, gpu);
            fflush(stdout);
        }
        if (step == first_step && dist->rank == 0) train_print_planned_vs_measured(&plan, &lg); /* fields of this record */
        log_end(&lg);

        last_step = step;
        int last = step == max_steps;
        if (val && (step % tc->val_every == 0 || last)) {
            float vl = evaluate(be, val, val_batches, inputs, targets, B, T);
            report_val_note(&val_best, &val_last, vl, step);
            printf("val loss %.6f (step %d)\n", vl, step);
            log_begin(&lg);
            log_int(&lg, "step", step);
            log_float(&lg, "val_loss", vl);
            log_end(&lg);
        }
        /* rank 0 prints the sample; with -z 3 every rank runs it (each forward gathers from all; the
         * GPU's own optimizer too, hence the flag, not opt.zero) */
        if (tc->sample_every > 0 && (step % tc->sample_every == 0 || last) && (dist->rank == 0 || tc->zero_stage == 3)) sample_text_generate(be, &text, &sampler_rng, T, tc->gen_tokens);
        if (tc->max_skips > 0 && consecutive_skips >= tc->max_skips) {
            char where[4400] = "there is no healthy checkpoint";
            if (healthy_ckpt >= 0)
                snprintf(where, sizeof where, "the newest healthy checkpoint is step %d in '%s'", healthy_ckpt, tc->output_dir);
            if (last_ckpt > healthy_ckpt && last_ckpt > resume_step) {
                size_t n = strlen(where);
                snprintf(where + n, sizeof where - n, " (step %d was saved after it and may hold the diverging weights)",
                         last_ckpt);
            }
            llmc_die("training stopped at step %d: %d consecutive steps were skipped (last: %s, loss %g, grad norm %g; "
                     "--max-skips %d); %s. Lower the learning rate (-l), or raise -sl/-sg or --max-skips",
                     step, consecutive_skips, skip, (double)loss, (double)norm, tc->max_skips, where);
        }
        if (last && last_diverged)
            llmc_die("the last step (%d) diverged (%s, loss %g): the run did not end in a usable model%s; the newest "
                     "healthy checkpoint is step %d (-1: none). Lower the learning rate (-l)",
                     step, skip, (double)loss, tc->output_dir[0] ? " and no final checkpoint was written" : "",
                     healthy_ckpt);
        /* with -o the last step is always saved: the model, and the state to continue it */
        if (tc->output_dir[0] && (last || (tc->ckpt_every > 0 && step % tc->ckpt_every == 0))) {
            if (last_diverged) {
                /* a diverged model is never written */
                printf("note: no checkpoint at step %d: the step diverged (%s)\n", step, skip);
            } else {
                train_save_checkpoint(tc, &rc, be, &opt, train, &sampler_rng, step, healthy_ckpt);
                checkpoint_paths(tc->output_dir, step, 0, saved_model, NULL, NULL, sizeof saved_model);
                last_ckpt = step;
            }
        }
    }
    report_summary(first_step, last_step, max_steps, total_batch, report_wall_s() - run_start, &val_best, &val_last, saved_model);
    sample_text_close(&text);
    logger_close(&lg);
    dataloader_close(train);
    if (val) dataloader_close(val);
    mem_free(MEM_TOKENS, inputs, (size_t)B * T * sizeof(int));
    mem_free(MEM_TOKENS, targets, (size_t)B * T * sizeof(int));
    mem_free(MEM_TOKENS, step_inputs, (size_t)total_batch * sizeof(int));
    mem_free(MEM_TOKENS, step_targets, (size_t)total_batch * sizeof(int));
    if (be->host_grads) optim_free(&opt);
    return 0;
}
