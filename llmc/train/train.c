#include "llmc/train/train.h"
#include "llmc/core/atomicfile.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/statefile.h"
#include "llmc/data/dataloader.h"
#include "llmc/dist/dist.h"
#include "llmc/train/optim.h"
#include "llmc/core/optstate.h"
#include "llmc/formats/rundir.h"
#include "llmc/core/rng.h"
#include "llmc/generate/sampler.h"
#include "llmc/train/schedule.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#if LLMC_HAVE_PCRE2
#include "llmc/data/tokenizer.h"
#endif

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

/* ---- sampling ------------------------------------------------------------------------ */
typedef struct {
    void *tok; /* Tokenizer *, or NULL: print ids */
    int eot;
} SampleText;

static void sample_text_open(SampleText *st, const TrainConfig *tc, const ModelConfig *cfg) {
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

static void sample_text_close(SampleText *st) {
#if LLMC_HAVE_PCRE2
    if (st->tok) tokenizer_free((Tokenizer *)st->tok);
#endif
    st->tok = NULL;
}

static void generate(TrainBackend *be, const SampleText *st, Rng *rng, int T, int gen_tokens) {
    int *tokens = (int *)mallocCheck(((size_t)gen_tokens + 1) * sizeof(int), "sample tokens");
    tokens[0] = st->eot;
    printf("generating:\n---\n");
    for (int n = 1; n <= gen_tokens; n++) {
        int window = n < T ? n : T;
        const float *logits = be->next_logits(be->model, tokens + n - window, window);
        tokens[n] = sample_softmax(logits, be->cfg.vocab_size, rng_f32(rng));
        print_token(st, tokens[n]);
        fflush(stdout);
    }
    printf("\n---\n");
    free(tokens);
}

/* ---- checkpoints ------------------------------------------------------------------------ */
static int resolve_init_rank0(const TrainConfig *tc, char *init_path, size_t len);

int train_resolve_init(const TrainConfig *tc, char *init_path, size_t len) {
    Dist *d = dist_world();
    d->timeout_s = tc->dist_timeout; /* the collective watchdog (dist.h) from here on */
    if (d->size == 1) rundir_refuse_launcher(); /* a trainer that did not start a process group */
    /* rank 0 alone owns -o (lock, clean-up, the decision); the others take its answer */
    int step = d->rank == 0 ? resolve_init_rank0(tc, init_path, len) : 0;
    dist_bcast_bytes(d, &step, sizeof step);
    if (step >= 0) checkpoint_paths(tc->output_dir, step, 0, init_path, NULL, NULL, len);
    else snprintf(init_path, len, "%s", tc->init);
    return step;
}

static int resolve_init_rank0(const TrainConfig *tc, char *init_path, size_t len) {
    snprintf(init_path, len, "%s", tc->init);
    if (!tc->output_dir[0]) return -1;
    rundir_lock(tc->output_dir);
    atomic_remove_stale(tc->output_dir); /* temporary files of dead processes (kill -9, full disk) */
    char names[512];
    int files = rundir_run_files(tc->output_dir, names, sizeof names);
    int step = checkpoint_latest_step(tc->output_dir);
    if (tc->resume) {
        if (step >= 0) {
            checkpoint_paths(tc->output_dir, step, tc->process_rank, init_path, NULL, NULL, len);
            return step;
        }
        if (files > 0) {
            /* it died before its first checkpoint (a preempted or killed job): nothing can be resumed,
             * and a restart loop must not fail forever, so the run starts over */
            printf("note: -y 1: output directory '%s' holds a run (%s) with no complete checkpoint (it stopped before "
                   "its first one): nothing to resume, so it starts over and its files are replaced\n",
                   tc->output_dir, names);
            rundir_remove_run(tc->output_dir);
            return -1;
        }
        printf("note: -y 1: output directory '%s' holds no run yet: starting a new one from -e %s\n", tc->output_dir, tc->init);
        return -1;
    }
    if (files > 0 && !tc->overwrite)
        llmc_die("output directory '%s' already holds a run (%s); to continue it use -y 1, to delete its files and "
                 "start a new run there use --overwrite 1, or give another -o",
                 tc->output_dir, names);
    return -1;
}

/* Writes model, state and the DONE marker (which holds the resolved configuration rc).
 * healthy: the newest checkpoint step proven healthy (a later step trained from its weights
 * without diverging); pruning never deletes it. */
static void save_checkpoint(const TrainConfig *tc, const TrainConfig *rc, TrainBackend *be, Optimizer *opt,
                            DataLoader *loader, const Rng *sampler_rng, int step, int healthy) {
    char model[4200], state[4200];
    Dist *d = dist_world();
    /* one checkpoint for the whole run, written by rank 0: the model, and a state file holding all
     * of m and v (gathered from the ranks' shards), whatever the number of ranks */
    checkpoint_paths(tc->output_dir, step, 0, model, state, NULL, sizeof model);
    be->sync_to_host(be->model);
    float *m = be->host_m, *v = be->host_v, *params = be->host_params;
    /* the loop's optimizer: whole fp32 moments are written as they are; else gathered (and decoded) into copies */
    const int gathered = be->host_grads && !optim_state_is_whole(opt);
    if (be->host_grads && !gathered) m = opt->m, v = opt->v;
    if (gathered) {
        size_t n = d->rank == 0 ? be->num_parameters : 1;
        m = (float *)mallocCheck(n * sizeof(float), "AdamW m (checkpoint)");
        v = (float *)mallocCheck(n * sizeof(float), "AdamW v (checkpoint)");
        optim_gather_state(opt, m, v);
        if (opt->zero == 3) { /* the model file from the ranks' shards, on rank 0 */
            params = (float *)mallocCheck(n * sizeof(float), "parameters (checkpoint)");
            optim_gather_params(opt, be->host_params, params);
        }
    }
    if (d->rank == 0 || params == be->host_params) /* (-z 3: the whole model is rank 0's) */
        for (size_t i = 0; i < be->num_parameters; i++)
            if (!isfinite(params[i]))
                llmc_die("training diverged: weight %zu is %g at step %d; no checkpoint was written (earlier "
                         "checkpoints in '%s' are kept); lower the learning rate (-l) or clip gradients (--grad-clip)",
                         i, (double)params[i], step, tc->output_dir);
    if (d->rank != 0) {
        if (gathered) free(m), free(v);
        if (params != be->host_params) free(params);
        return;
    }
    TrainState st = {0};
    if (tc->process_rank == 0) {
        const ModelArch *arch = be->arch->arch;
        st.model_crc = arch->save(model, be->arch, params, be->num_parameters, tc->ckpt_bf16);
        st.has_model_crc = 1;
        if (tc->save_hf)
            arch->save_hf_checkpoint(tc->output_dir, step, be->arch, params, be->num_parameters, tc->ckpt_bf16, tc->init);
    }
    st.step = step;
    st.numel = be->num_parameters;
    st.B = tc->B;
    st.T = tc->T;
    st.processes = tc->num_processes;
    st.rank = tc->process_rank;
    st.shuffle = tc->shuffle;
    st.seed = tc->seed;
    DataLoaderState ds;
    dataloader_get_state(loader, &ds);
    _Static_assert(sizeof ds == sizeof st.loader, "the state file stores the whole DataLoaderState");
    memcpy(st.loader, &ds, sizeof ds);
    st.sampler_rng = sampler_rng->state;
    if (be->save_backend_state) be->save_backend_state(be->model, st.backend);
    state_file_save(state, &st, m, v);
    if (gathered) free(m), free(v);
    if (params != be->host_params) free(params);
    if (tc->process_rank == 0) {
        char config[16384];
        train_config_to_text(rc, config, sizeof config);
        checkpoint_mark_done(tc->output_dir, step, config);
        checkpoint_prune(tc->output_dir, tc->ckpt_keep, tc->ckpt_major, tc->process_rank, healthy);
    }
    printf("checkpoint: %s\n", model);
}

static void load_state(const TrainConfig *tc, TrainBackend *be, Optimizer *opt, DataLoader *loader, Rng *sampler_rng,
                       int step, long long total_batch) {
    char state[4200], model[4200];
    /* every rank reads the one state file (-o must be shared by the ranks' nodes) and keeps its shard */
    checkpoint_paths(tc->output_dir, step, 0, model, state, NULL, sizeof state);
    TrainState st;
    float *m = be->host_m, *v = be->host_v;
    if (be->host_grads) {
        m = (float *)mallocCheck(be->num_parameters * sizeof(float), "AdamW m (checkpoint)");
        v = (float *)mallocCheck(be->num_parameters * sizeof(float), "AdamW v (checkpoint)");
    }
    state_file_load(state, &st, m, v, be->num_parameters);
    if (be->host_grads) {
        optim_load_state(opt, m, v);
        free(m);
        free(v);
    }
    if (st.step != step) llmc_die("training state '%s' is for step %d, expected %d", state, st.step, step);
    if (st.has_model_crc) {
        uint32_t crc = sumfile_checksum(model);
        if (crc != st.model_crc)
            llmc_die("training state '%s' was saved with another model file than '%s' (crc32 %08x, the state "
                     "records %08x): the model and the state of step %d do not belong together",
                     state, model, (unsigned)crc, (unsigned)st.model_crc, step);
    }
    /* -b and the number of processes may change: a step's data is fixed by -d (the loader's
     * state checks that), and m and v are stored whole */
    if (st.T != tc->T || st.shuffle != tc->shuffle || st.seed != tc->seed)
        llmc_die("cannot resume from '%s': it was written with -t %d --shuffle %d --seed %llu, "
                 "this run has -t %d --shuffle %d --seed %llu (resume needs the same values)",
                 state, st.T, st.shuffle, (unsigned long long)st.seed, tc->T, tc->shuffle, (unsigned long long)tc->seed);
    if (st.version < 3 && (long long)st.B * st.T * st.processes != total_batch)
        llmc_die("training state '%s' is version %d, written before data parallelism: its data position counts "
                 "micro-batches of B*T*processes = %d*%d*%d tokens, which this build can continue only when that "
                 "is the whole step (-d %lld, no gradient accumulation)",
                 state, st.version, st.B, st.T, st.processes, total_batch);
    if (st.processes != tc->num_processes || st.B != tc->B)
        printf("resume: the checkpoint was written by %d process(es) with -b %d; continuing with %d x -b %d\n",
               st.processes, st.B, tc->num_processes, tc->B);
    DataLoaderState ds;
    memcpy(&ds, st.loader, sizeof ds);
    char err[4600];
    if (dataloader_check_state(loader, &ds, err, sizeof err) != 0) llmc_die("training state '%s': %s", state, err);
    dataloader_set_state(loader, &ds);
    sampler_rng->state = st.sampler_rng;
    if (be->load_backend_state) be->load_backend_state(be->model, st.backend);
    be->sync_from_host(be->model);
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

/* ---- what the run says about itself ------------------------------------------------------ */
static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 42s, 7m05s, 3h12m */
static void format_duration(char *buf, size_t len, double s) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t < 60) snprintf(buf, len, "%lds", t);
    else if (t < 3600) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
}

typedef struct {
    float loss;
    int step; /* -1: none yet */
} ValRecord;

static void val_note(ValRecord *best, ValRecord *last, float loss, int step) {
    if (best->step < 0 || loss < best->loss) *best = (ValRecord){loss, step};
    *last = (ValRecord){loss, step};
}

/* The one line at the end: steps, tokens, time, validation, where the model went. */
static void print_summary(int first_step, int last_step, int max_steps, long long total_batch, double seconds,
                          const ValRecord *best, const ValRecord *last, const char *saved_model) {
    char took[32], val[160];
    format_duration(took, sizeof took, seconds);
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

/* Resume: the checkpoint's saved configuration against this run's resolved one (rc). */
static void resume_check_config(const TrainConfig *rc, int step) {
    char *text = checkpoint_read_done(rc->output_dir, step);
    char where[1200];
    snprintf(where, sizeof where, "the checkpoint at step %d in '%s'", step, rc->output_dir);
    if (!text) {
        printf("note: %s has no saved configuration (written by llm.c or an older llmc): flags not compared\n", where);
        return;
    }
    TrainConfig saved;
    train_config_defaults(&saved);
    train_config_from_text(&saved, text);
    free(text);
    /* An architecture without recompute levels (Llama) keeps every activation: both trainers run it
     * at -r 0 whatever -r says, and older binaries saved the -r given (1 by default), which is no
     * difference from this run's 0. */
    char model[4200];
    ArchConfig ac;
    checkpoint_paths(rc->output_dir, step, 0, model, NULL, NULL, sizeof model);
    if (rc->recompute == 0 && saved.recompute != 0 && !model_arch_for_init(model, &ac)->recompute_levels)
        saved.recompute = 0;
    train_config_compare(&saved, rc, where, stdout);
}

/* The log's first record of this process: configuration, version, machine. */
static void log_run_record(Logger *lg, const TrainConfig *rc, const TrainBackend *be, int resume_step) {
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

size_t train_token_buffer_bytes(int B, int T, long long total_batch) {
    return (2 * (size_t)B * T + 2 * (size_t)total_batch) * sizeof(int);
}

void train_memory_plan(const TrainConfig *tc, const ModelConfig *cfg, TrainPlanFn backend_plan, int host_optimizer,
                       const char *device, MemPlan *p) {
    if (tc->T > cfg->max_seq_len) llmc_die("-t %d exceeds the model's maximum sequence length %d (maxT)", tc->T, cfg->max_seq_len);
    mem_plan_init(p, device);
    p->optim_state = optstate_parse(tc->optim_state);
    p->offload = strcmp(tc->offload, "optimizer") == 0;
    backend_plan(tc, cfg, p);
    mem_plan_add_loop(p, tc->B, tc->T, tc->total_batch, tc->num_processes, tc->process_rank, tc->zero_stage, host_optimizer,
                      tc->output_dir[0] != 0, tc->val_every > 0);
}

void train_plan_model_config(const TrainConfig *tc, ModelConfig *cfg) {
    ArchConfig ac;
    model_arch_for_init(tc->init, &ac); /* the header only: no parameters read */
    *cfg = *arch_config_base(&ac);
}

int train_plan_main(const TrainConfig *tc, TrainPlanFn backend_plan, int host_optimizer, const char *device) {
    ModelConfig cfg;
    train_plan_model_config(tc, &cfg);
    MemPlan p;
    train_memory_plan(tc, &cfg, backend_plan, host_optimizer, device, &p);
    if (tc->json) mem_plan_print_json(&p, stdout);
    else mem_plan_print(&p, stdout);
    return 0;
}

/* LLMC_TEST_LEAK=<class name>: every step allocates 4 KiB of that class and never frees it (a
 * planted leak that the leak check must name). Returns -1 when unset. */
static int planted_leak_class(void) {
    const char *e = getenv("LLMC_TEST_LEAK");
    if (!e || !e[0]) return -1;
    for (int c = 0; c < MEM_NUM_CLASSES; c++)
        if (strcmp(e, mem_class_names[c]) == 0) return c;
    llmc_die("LLMC_TEST_LEAK=%s: not a memory class name", e);
}

/* The leak check: live accounted bytes after every step after base_step (this run's second step)
 * equal those after base_step. */
static void check_leaks(int step, int base_step, size_t base[2][MEM_NUM_CLASSES]) {
    for (int device = 0; device < 2; device++)
        for (int c = 0; c < MEM_NUM_CLASSES; c++) {
            size_t now = mem_live((MemClass)c, device);
            if (step == base_step) base[device][c] = now;
            else if (step > base_step && now != base[device][c])
                llmc_die("memory leak: %s memory class '%s' grew from %zu bytes after step %d to %zu bytes after step %d",
                         device ? "device" : "host", mem_class_names[c], base[device][c], base_step, now, step);
        }
}

/* Planned against measured, after the first step: CPU the process's VmHWM less the runtime's
 * fixed overhead (VmRSS at process start); GPU from the backend's own figure (step_extras). */
static void print_planned_vs_measured(const MemPlan *plan, Logger *lg) {
    size_t planned = mem_plan_peak(plan, 1, NULL), hwm = mem_process_hwm(), base = mem_process_start_rss();
    if (strcmp(plan->device, "CPU") != 0 || !hwm) return;
    double measured = (double)hwm - (double)base;
    printf("memory: planned peak %.1f MiB; measured VmHWM %.1f MiB = runtime overhead %.1f MiB (VmRSS at start) "
           "+ %.1f MiB; planned / measured %.4f\n",
           planned / 1048576.0, hwm / 1048576.0, base / 1048576.0, measured / 1048576.0, planned / measured);
    log_int(lg, "mem_planned_peak", (long long)planned);
    log_int(lg, "mem_measured_hwm", (long long)hwm);
    log_int(lg, "mem_runtime_overhead", (long long)base);
    log_double(lg, "mem_planned_over_measured", planned / measured);
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
    if (resume_step >= 0) resume_check_config(&rc, resume_step);
    const double run_start = wall_s();

    int *inputs = (int *)mem_calloc(MEM_TOKENS, (size_t)B * T, sizeof(int), "input tokens");
    int *targets = (int *)mem_calloc(MEM_TOKENS, (size_t)B * T, sizeof(int), "target tokens");
    int *step_inputs = (int *)mem_calloc(MEM_TOKENS, (size_t)total_batch, sizeof(int), "step input tokens");
    int *step_targets = (int *)mem_calloc(MEM_TOKENS, (size_t)total_batch, sizeof(int), "step target tokens");
    /* the loop's optimizer when the backend hands over host gradients; else the backend's own */
    Optimizer opt = {0};
    if (be->host_grads)
        optim_init_state(&opt, dist, tc->zero_stage, be->num_parameters, be->param_specs,
                         be->arch->arch->num_param_specs, optstate_parse(tc->optim_state));
    else if (tc->zero_stage > be->zero_max)
        llmc_die("-z %d: this backend keeps its own optimizer, which shards up to -z %d", tc->zero_stage, be->zero_max);
    check_ranks_agree(dist, &rc, be, train); /* (before -z 3 leaves each rank only its shard) */
    if (be->host_grads && be->attach_optimizer) be->attach_optimizer(be->model, &opt, &be->host_params, &be->host_grads);
    /* what is allocated now must be this rank's plan, class by class */
    MemPlan plan;
    train_memory_plan(&rc, cfg, be->plan, be->host_grads != NULL, be->gpu ? "GPU" : "CPU", &plan);
    mem_check_plan(&plan);
    const int leak_class = planted_leak_class();
    size_t leak_base[2][MEM_NUM_CLASSES] = {{0}};
    Rng sampler_rng;
    rng_seed(&sampler_rng, tc->seed ^ 0x5A3C9E1Dull);
    if (resume_step >= 0) load_state(tc, be, &opt, train, &sampler_rng, resume_step, total_batch);
    if (tc->overwrite && dist->rank == 0) {
        char names[512];
        int n = rundir_run_files(tc->output_dir, names, sizeof names);
        rundir_remove_run(tc->output_dir);
        if (n) printf("--overwrite 1: deleted the %d file(s) of the previous run in '%s' (%s)\n", n, tc->output_dir, names);
    }
    Logger lg;
    logger_open(&lg, dist->rank == 0 ? tc->output_dir : "", resume_step); /* rank 0 writes the log */
    log_run_record(&lg, &rc, be, resume_step);
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
        be->arch->arch->flops_per_token(be->arch, T) * (double)total_batch;
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
        val_note(&val_best, &val_last, vl, 0);
        printf("val loss %.6f (step 0)\n", vl);
        log_begin(&lg);
        log_int(&lg, "step", 0);
        log_float(&lg, "val_loss", vl);
        log_end(&lg);
    }
    const double loop_start = wall_s();
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
        check_leaks(step, first_step + 1, leak_base);
        char extra[256] = "", elapsed[32], eta[32], comm[96] = "";
        if (P > 1) snprintf(comm, sizeof comm, " | comm %.1f ms, %.2f MB", comm_ms, comm_bytes / 1e6);
        if (be->step_extras) be->step_extras(be->model, step_ms, tok_s, extra, sizeof extra, NULL);
        else
            snprintf(extra, sizeof extra, " | mem %.2f GiB (peak %.2f)", mem_live_total(0) / 1073741824.0,
                     mem_peak_total(0) / 1073741824.0);
        /* ETA from this process's mean time per step so far, evaluation and checkpoints included */
        double now = wall_s();
        format_duration(elapsed, sizeof elapsed, now - run_start);
        format_duration(eta, sizeof eta, (now - loop_start) / (step - first_step + 1) * (max_steps - step));
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
        if (step == first_step && dist->rank == 0) print_planned_vs_measured(&plan, &lg); /* fields of this record */
        log_end(&lg);

        last_step = step;
        int last = step == max_steps;
        if (val && (step % tc->val_every == 0 || last)) {
            float vl = evaluate(be, val, val_batches, inputs, targets, B, T);
            val_note(&val_best, &val_last, vl, step);
            printf("val loss %.6f (step %d)\n", vl, step);
            log_begin(&lg);
            log_int(&lg, "step", step);
            log_float(&lg, "val_loss", vl);
            log_end(&lg);
        }
        /* rank 0 prints the sample; with -z 3 every rank runs it (each forward gathers from all; the
         * GPU's own optimizer too, hence the flag, not opt.zero) */
        if (tc->sample_every > 0 && (step % tc->sample_every == 0 || last) && (dist->rank == 0 || tc->zero_stage == 3)) generate(be, &text, &sampler_rng, T, tc->gen_tokens);
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
                save_checkpoint(tc, &rc, be, &opt, train, &sampler_rng, step, healthy_ckpt);
                checkpoint_paths(tc->output_dir, step, 0, saved_model, NULL, NULL, sizeof saved_model);
                last_ckpt = step;
            }
        }
    }
    print_summary(first_step, last_step, max_steps, total_batch, wall_s() - run_start, &val_best, &val_last, saved_model);
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
