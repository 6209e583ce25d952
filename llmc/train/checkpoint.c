/*
 * checkpoint.c - the training loop's checkpoints: where a run's parameters come from (-e, or -y 1's
 * latest checkpoint in -o), writing model, state and DONE marker, loading the state of a resume
 * and comparing the resumed run's configuration with the saved one.
 */
#include "llmc/train/checkpoint.h"
#include "llmc/core/check.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/arch.h"
#include "llmc/formats/hf.h"
#include "llmc/formats/statefile.h"
#include "llmc/formats/rundir.h"
#include "llmc/train/lora.h"
#include "llmc/train/adafactor.h"
#include "llmc/train/gradcomp.h"
#include "llmc/train/tp.h"
#include "llmc/dist/layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int resolve_init_rank0(const TrainConfig *tc, char *init_path, size_t len);

int train_resolve_init(const TrainConfig *tc, char *init_path, size_t len) {
    Dist *d = dist_world();
    d->timeout_s = tc->dist_timeout; /* the collective watchdog (dist.h) from here on */
    if (d->size == 1) dist_refuse_launcher(); /* a trainer that did not start a process group */
    /* rank 0 alone owns -o (lock, clean-up, the decision); the others take its answer */
    dist_busy_begin(d, DIST_BUSY_OUTPUT_DIR); /* (rank 0 only: the others hear its heartbeat meanwhile) */
    int step = d->rank == 0 ? resolve_init_rank0(tc, init_path, len) : 0;
    dist_busy_end(d);
    dist_bcast_bytes(d, &step, sizeof step);
    if (step >= 0) checkpoint_paths(tc->output_dir, step, 0, init_path, NULL, NULL, len);
    else snprintf(init_path, len, "%s", tc->init);
    return step;
}

void train_check_init(TrainConfig *tc) {
    struct stat sb;
    if (stat(tc->init, &sb) == 0 && S_ISDIR(sb.st_mode) && !hf_is_model_dir(tc->init)) {
        int step = checkpoint_latest_step(tc->init);
        if (step >= 0)
            llmc_die("-e %s is a directory holding a run, not a model file: to train from its latest complete checkpoint give -e "
                     "%s/model_%08d.bin, or to continue that run give -o %s -y 1",
                     tc->init, tc->init, step, tc->init);
    }
    if (!tc->plan || !tc->resume || !tc->output_dir[0]) return;
    if (lora_wanted(tc)) return; /* a LoRA run resumes on -e, its base (lora.h's lora_resume_init) */
    int step = checkpoint_latest_step(tc->output_dir);
    if (step < 0) return; /* -y 1 starts a new run from -e */
    FILE *out = tc->json ? stderr : stdout; /* (--plan --json: stdout is the JSON) */
    char model[4200];
    checkpoint_paths(tc->output_dir, step, 0, model, NULL, NULL, sizeof model);
    fprintf(out, "note: --plan -y 1: the run in '%s' resumes from step %d: planning its model '%s'\n", tc->output_dir,
            step, model);
    char *text = checkpoint_read_done(tc->output_dir, step);
    if (text) {
        TrainConfig saved;
        train_config_defaults(&saved);
        train_config_from_text(&saved, text);
        free(text);
        if (strcmp(saved.init, tc->init) != 0 && !tc->allow_config_change)
            fprintf(out, "note: --plan -y 1: this -e (%s) differs from the run's (%s), which the real resume refuses: "
                    "give -e %s (or --allow-config-change 1)\n", tc->init, saved.init, saved.init);
    }
    if (snprintf(tc->init, sizeof tc->init, "%s", model) >= (int)sizeof tc->init)
        llmc_die("-o %s: the checkpoint's path is longer than -e takes (%zu bytes)", tc->output_dir, sizeof tc->init - 1);
    fflush(out);
}

static int resolve_init_rank0(const TrainConfig *tc, char *init_path, size_t len) {
    snprintf(init_path, len, "%s", tc->init);
    if (!tc->output_dir[0]) return -1;
    rundir_lock(tc->output_dir);
    rundir_remove_stale(tc->output_dir); /* temporary run files of dead processes (kill -9, full disk) */
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
            rundir_remove_run(tc->output_dir, tc->init, "-y 1 (starting over)");
            return -1;
        }
        printf("note: -y 1: output directory '%s' holds no run yet: starting a new one from -e %s\n", tc->output_dir, tc->init);
        return -1;
    }
    if (files > 0 && tc->overwrite) /* deleted once the run is set up (train.c); refused now if it cannot be */
        rundir_check_removable(tc->output_dir, tc->init, "--overwrite 1");
    if (files > 0 && !tc->overwrite)
        llmc_die("output directory '%s' already holds a run (%s); to continue it use -y 1, to delete its files and "
                 "start a new run there use --overwrite 1, or give another -o",
                 tc->output_dir, names);
    return -1;
}

/* -tp: the whole model, m and v (3 x the whole count, *n) on rank 0 from the tensor-parallel ranks'
 * parts (NULL elsewhere); a collective over every rank. m and v are whole on the data-parallel group's
 * rank 0 (-z 1 gathered them there); the other ranks send their parameters in their place (unused). */
static float *tp_gather_whole(const TrainBackend *be, const OptimStateView *sv, size_t *n) {
    const TensorSpec *specs = be->hostopt.param_specs;
    const int ns = be->arch->arch->num_param_specs, have = dist_data_group()->rank == 0;
    const size_t nl = be->num_parameters, nw = train_tp_whole_numel(specs, ns, train_tp_size());
    float *w = dist_world()->rank == 0 ? (float *)mallocCheck(3 * nw * sizeof(float), "the whole model (checkpoint)") : NULL;
    train_tp_gather(specs, ns, nl, sv->params, w);
    train_tp_gather(specs, ns, nl, have ? sv->m : sv->params, w ? w + nw : NULL);
    train_tp_gather(specs, ns, nl, have ? sv->v : sv->params, w ? w + 2 * nw : NULL);
    *n = nw;
    return w;
}

void train_save_checkpoint(const TrainConfig *tc, const TrainConfig *rc, TrainBackend *be, TrainOptimizer *opt,
                            DataLoader *loader, const Rng *sampler_rng, int step, int healthy) {
    char model[4200], state[4200];
    Dist *d = dist_world();
    /* one checkpoint for the whole run, written by rank 0: the model, and a state file holding all
     * of m and v (gathered from the ranks' shards), whatever the number of ranks */
    checkpoint_paths(tc->output_dir, step, 0, model, state, NULL, sizeof model);
    be->state.sync_to_host(be->model);
    OptimStateView sv;
    opt->state(opt->ctx, &sv);
    const float *params = sv.params, *m = sv.m, *v = sv.v;
    size_t n = be->num_parameters;
    float *tp_whole = NULL; /* -tp: rank 0 writes the whole model (every layout's checkpoint is the same) */
    if (train_tp_size() > 1) {
        size_t nw;
        tp_whole = tp_gather_whole(be, &sv, &nw);
        if (tp_whole) params = tp_whole, m = tp_whole + nw, v = tp_whole + 2 * nw, n = nw;
    }
    if (sv.whole_params) /* (-z 3: the whole model is rank 0's) */
        for (size_t i = 0; i < n; i++)
            if (!isfinite(params[i]))
                llmc_die("training diverged: weight %zu is %g at step %d; no checkpoint was written (earlier "
                         "checkpoints in '%s' are kept); lower the learning rate (-l) or clip gradients (--grad-clip)",
                         i, (double)params[i], step, tc->output_dir);
    /* --grad-compression: every rank's residual, in rank order, on rank 0 (version 4) */
    GradComp *gc = gradcomp_current();
    float *residuals = NULL;
    if (gc) {
        residuals = (float *)mallocCheck((d->rank == 0 ? (size_t)d->size * gc->n + gc->q_floats : 1) * sizeof(float),
                                         "residuals (checkpoint)");
        dist_gather_f32(d, gc->residual, residuals, (size_t)d->size * gc->n); /* (shards of P x n over P ranks: n each) */
        if (d->rank == 0 && gc->q_floats) /* powersgd's Q: the same on every rank */
            memcpy(residuals + (size_t)d->size * gc->n, gc->q, gc->q_floats * sizeof(float));
    }
    if (d->rank != 0) {
        if (opt->state_release) opt->state_release(opt->ctx, &sv);
        free(residuals);
        return;
    }
    dist_busy_begin(d, DIST_BUSY_CHECKPOINT); /* the others wait in their next collective: rank 0's heartbeat */
    TrainState st = {0};
    if (gc) {
        st.gc_kind = gc->spec.kind;
        st.gc_param = gradcomp_param_word(&gc->spec);
        st.gc_ranks = d->size;
        st.gc_floats = gc->n;
        st.gc_shared = gc->q_floats;
        st.gc_data = residuals;
    }
    if (tc->process_rank == 0 && be->state.save_model) { /* an adapter run: its adapter directory */
        st.model_crc = be->state.save_model(be->model, tc->output_dir, step, params);
        st.has_model_crc = 1;
        be->state.model_path(be->model, tc->output_dir, step, 1, model, sizeof model);
    } else if (tc->process_rank == 0) {
        const ModelArch *arch = be->arch->arch;
        st.model_crc = arch->save(model, be->arch, params, n, tc->ckpt_bf16);
        st.has_model_crc = 1;
        if (tc->save_hf)
            arch->save_hf_checkpoint(tc->output_dir, step, be->arch, params, n, tc->ckpt_bf16, tc->init);
    }
    st.step = step;
    st.numel = n;
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
    st.optimizer = train_state_optimizer(tc);
    if (be->state.save_backend_state) be->state.save_backend_state(be->model, st.backend);
    if (m) state_file_save(state, &st, m, v);
    else state_file_save_chunks(state, &st, sv.moment, sv.moment_ctx); /* compact moments, a chunk at a time */
    if (opt->state_release) opt->state_release(opt->ctx, &sv);
    free(residuals);
    free(tp_whole);
    if (tc->process_rank == 0) {
        char config[16384];
        train_config_to_text(rc, config, sizeof config);
        checkpoint_mark_done(tc->output_dir, step, config);
        checkpoint_prune(tc->output_dir, tc->ckpt_keep, tc->ckpt_major, tc->process_rank, healthy);
    }
    dist_busy_end(d);
    printf("checkpoint: %s\n", model);
}

/* --grad-compression: this rank's error-feedback residual from the state's (version 4). The same
 * ranks: its own, bit-exact; another number: rank r sums the old ranks q with q % P == r, in order
 * (the total still to be sent is kept). Another scheme: an error, or with --allow-config-change 1
 * the residual starts at zero (a note says so). */
static void load_residual(const TrainConfig *tc, TrainState *st, const char *state) {
    GradComp *gc = gradcomp_current();
    GradCompSpec want;
    char err[256], saved[48], now[48];
    if (gradcomp_parse(tc->grad_compression, &want, err, sizeof err) != 0) llmc_die("flag --grad-compression: %s", err);
    if (!st->gc_ranks) {
        if (gc) printf("note: resume: '%s' holds no error-feedback residual (written by one process or without "
                       "--grad-compression): it starts at zero\n", state);
        return;
    }
    float saved_frac;
    memcpy(&saved_frac, &st->gc_param, sizeof saved_frac);
    if (st->gc_kind == GC_TOPK) snprintf(saved, sizeof saved, "topk:%g", (double)saved_frac);
    else if (st->gc_kind == GC_POWERSGD) snprintf(saved, sizeof saved, "powersgd:%d", st->gc_param);
    else snprintf(saved, sizeof saved, "%s", gradcomp_name(st->gc_kind));
    snprintf(now, sizeof now, "%s", tc->grad_compression);
    const int same = want.kind == st->gc_kind && gradcomp_param_word(&want) == st->gc_param;
    if (!same && !tc->allow_config_change) {
        free(st->gc_data);
        llmc_die("cannot resume from '%s': it holds the error-feedback residuals of --grad-compression %s, this run has "
                 "--grad-compression %s (resume with --grad-compression %s, or pass --allow-config-change 1 to drop "
                 "the residuals and start them at zero)", state, saved, now, saved);
    }
    if (!same || !gc) {
        if (!same) printf("note: resume: --allow-config-change 1: the --grad-compression %s residuals in '%s' are dropped; "
                          "%s starts with none\n", saved, state, now);
        else printf("note: resume: one process sends nothing compressed: the residuals of the %d ranks in '%s' are "
                    "dropped\n", st->gc_ranks, state);
        free(st->gc_data);
        st->gc_data = NULL;
        return;
    }
    const Dist *d = gc->dist;
    const size_t n = gc->n;
    if (st->gc_shared != gc->q_floats)
        llmc_die("training state '%s': its --grad-compression %s state holds %zu shared floats, this model's needs %zu",
                 state, saved, st->gc_shared, gc->q_floats);
    if (gc->q_floats) memcpy(gc->q, st->gc_data + (size_t)st->gc_ranks * n, gc->q_floats * sizeof(float));
    if (st->gc_ranks == d->size) memcpy(gc->residual, st->gc_data + (size_t)d->rank * n, n * sizeof(float));
    else {
        memset(gc->residual, 0, n * sizeof(float));
        for (int q = d->rank; q < st->gc_ranks; q += d->size)
            for (size_t i = 0; i < n; i++) gc->residual[i] += st->gc_data[(size_t)q * n + i];
        if (d->rank == 0)
            printf("resume: the error-feedback residuals of %d ranks resharded onto %d (rank r takes the sum of the "
                   "old ranks q with q %% %d == r)\n", st->gc_ranks, d->size, d->size);
    }
    free(st->gc_data);
    st->gc_data = NULL;
}

void train_load_state(const TrainConfig *tc, TrainBackend *be, TrainOptimizer *opt, DataLoader *loader, Rng *sampler_rng,
                       int step, long long total_batch) {
    char state[4200], model[4200];
    /* every rank reads the one state file (-o must be shared by the ranks' nodes) and keeps its shard */
    checkpoint_paths(tc->output_dir, step, 0, model, state, NULL, sizeof state);
    if (be->state.model_path) be->state.model_path(be->model, tc->output_dir, step, 0, model, sizeof model);
    TrainState st;
    float *m, *v;
    opt->load_begin(opt->ctx, &m, &v);
    if (train_tp_size() > 1) { /* -tp: the file holds the whole model's m and v (any layout's): this rank's part */
        const TensorSpec *specs = be->hostopt.param_specs;
        const int ns = be->arch->arch->num_param_specs;
        const size_t nw = train_tp_whole_numel(specs, ns, train_tp_size());
        float *wm = (float *)mallocCheck(nw * sizeof(float), "AdamW m (checkpoint)");
        float *wv = (float *)mallocCheck(nw * sizeof(float), "AdamW v (checkpoint)");
        state_file_load(state, &st, wm, wv, nw);
        train_tp_take(specs, ns, wm, m);
        train_tp_take(specs, ns, wv, v);
        free(wm), free(wv);
    } else
        state_file_load(state, &st, m, v, be->num_parameters);
    if (st.optimizer != train_state_optimizer(tc)) {
        static const char *const names[] = {"", "adamw", "adafactor"};
        llmc_die("cannot resume from '%s': it holds the state of --optimizer %s, this run has --optimizer %s (an "
                 "optimizer's state does not carry over to another; resume with --optimizer %s, or start a new run)",
                 state, names[st.optimizer], tc->optimizer, names[st.optimizer]);
    }
    if (opt->load_end) opt->load_end(opt->ctx, m, v);
    load_residual(tc, &st, state);
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
    if (be->state.load_backend_state) be->state.load_backend_state(be->model, st.backend);
    be->state.sync_from_host(be->model);
}

void train_resume_check_config(const TrainConfig *rc, int step) {
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
    if (saved.ckpt_bf16)
        printf("note: %s was written with --checkpoint-bf16 1: its weights were rounded to bf16, so this run continues "
               "from the rounded weights (and the fp32 AdamW state) and is not bit-identical to a run that never "
               "stopped; fp32 checkpoints (--checkpoint-bf16 0) resume bit-exactly\n", where);
    /* An architecture without recompute levels (the Mixtral) keeps every activation: the trainers run
     * it at -r 0 whatever -r says, and older binaries saved the -r given (1 by default), which is no
     * difference from this run's 0. */
    char model[4200];
    ArchConfig ac;
    checkpoint_paths(rc->output_dir, step, 0, model, NULL, NULL, sizeof model);
    if (rc->recompute == 0 && saved.recompute != 0 && !model_arch_for_init(model, &ac)->recompute_levels)
        saved.recompute = 0;
    train_config_compare(&saved, rc, where, stdout);
}
