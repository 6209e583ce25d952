/*
 * adafactor.c - the loop's host Adafactor behind TrainOptimizer (adafactor.h): the step over this
 * rank's units (llmc/cpu/adafactor.h), the -z 1 all-gather, the checkpoint's packed state.
 */
#include "llmc/train/adafactor.h"
#include "llmc/core/check.h"
#include "llmc/core/mem.h"
#include "llmc/cpu/adafactor.h"
#include "llmc/cpu/adamw.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int adafactor_selected(const TrainConfig *tc) { return strcmp(tc->optimizer, "adafactor") == 0; }

int train_state_optimizer(const TrainConfig *tc) {
    return adafactor_selected(tc) ? STATE_OPTIMIZER_ADAFACTOR : STATE_OPTIMIZER_ADAMW;
}

/* ---- the TrainOptimizer ---- */
static float af_loss_weight(void *p, int accum) { return 1.0f / ((float)accum * (float)((HostAdafactor *)p)->dist->size); }

static void af_reduce(void *p) {
    HostAdafactor *h = (HostAdafactor *)p;
    TrainBackend *be = h->be;
    if (be->hostopt.grads_to_host) be->hostopt.grads_to_host(be->model);
    dist_allreduce_f32(h->dist, be->hostopt.host_grads, h->n);
}

static float af_grad_norm(void *p) {
    HostAdafactor *h = (HostAdafactor *)p;
    return (float)sqrt(global_norm_squared(h->be->hostopt.host_grads, h->n)); /* identical grads everywhere */
}

static void af_step(void *p, const AdamWStep *s) {
    HostAdafactor *h = (HostAdafactor *)p;
    TrainBackend *be = h->be;
    float *params = be->state.host_params;
    const float *grads = be->hostopt.host_grads;
    const double b2t = 1.0 - pow((double)s->t, (double)h->decay_rate);
    AdafactorArgs a = {s->lr, (float)b2t, (float)(1.0 - b2t), 1e-30f, 1e-3f, h->clip, h->beta1, 0.0f, s->grad_scale, 0};
    if (h->relative_step) { /* HF's relative step (warmup_init off) with scale_parameter: -l and -k unused */
        double r = 1.0 / sqrt((double)s->t);
        a.lr = (float)(r < 1e-2 ? r : 1e-2);
        a.param_scale = 1;
    }
    for (int i = h->u0; i < h->u1; i++) {
        const AdafactorUnit *u = &h->units[i];
        a.weight_decay = u->decay ? s->weight_decay : 0.0f;
        float *st = h->stats + (u->soff - h->slo), *m = h->m ? h->m + (u->off - h->plo) : NULL;
        if (u->cols) adafactor_update_factored(params + u->off, grads + u->off, st, st + u->rows, m, u->rows, u->cols, &a);
        else adafactor_update_vector(params + u->off, grads + u->off, st, m, u->numel, &a);
    }
    if (h->parts) {
        DistRequest req;
        dist_allgather_parts_begin(h->dist, params, h->parts, h->parts + h->dist->size, &req);
        dist_wait_request(h->dist, &req, "Adafactor parameter all-gather");
    }
    if (be->hostopt.params_bucket_to_device) { /* a device backend's buckets, in the order the next forward needs them */
        Optimizer shape = {0};
        shape.specs = be->hostopt.param_specs, shape.num_specs = be->arch->arch->num_param_specs;
        Bucket b;
        for (int k = 0; k < optim_num_buckets(&shape); k++) optim_bucket(&shape, k, &b), be->hostopt.params_bucket_to_device(be->model, &b);
    }
    if (be->hostopt.params_from_host) be->hostopt.params_from_host(be->model);
}

/* One rank holding the whole state (-z 0, or one rank): the state file's arrays a chunk at a time,
 * straight from the state (zeros past the statistics, and for a missing first moment). */
static const float *af_moment_chunk(void *p, int is_v, size_t offset, size_t count, float *scratch) {
    const HostAdafactor *h = (const HostAdafactor *)p;
    const float *src = is_v ? h->stats : h->m;
    const size_t have = is_v ? h->num_stats : (h->m ? h->n : 0);
    if (offset + count <= have) return src + offset;
    size_t k = offset < have ? have - offset : 0;
    if (k) memcpy(scratch, src + offset, k * sizeof(float));
    memset(scratch + k, 0, (count - k) * sizeof(float));
    return scratch;
}

/* The checkpoint's arrays: streamed from the whole state (-z 0, one rank) on rank 0, or (-z 1,
 * several ranks) gathered into whole copies on every rank (the all-gather's buffers). */
static void af_state(void *p, OptimStateView *sv) {
    HostAdafactor *h = (HostAdafactor *)p;
    memset(sv, 0, sizeof *sv);
    sv->params = h->be->state.host_params;
    sv->whole_params = 1;
    if (!h->parts) {
        sv->moment = af_moment_chunk, sv->moment_ctx = h;
        return;
    }
    sv->m = (float *)callocCheck(h->n, sizeof(float), "Adafactor first moment (checkpoint)");
    sv->v = (float *)callocCheck(h->n, sizeof(float), "Adafactor statistics (checkpoint)");
    sv->copies = 1;
    if (h->m) memcpy(sv->m + h->plo, h->m, (h->phi - h->plo) * sizeof(float));
    if (h->stats) memcpy(sv->v + h->slo, h->stats, (h->shi - h->slo) * sizeof(float));
    if (!h->parts) return;
    const int P = h->dist->size;
    int *sc = (int *)mallocCheck(2 * (size_t)P * sizeof(int), "Adafactor state parts");
    for (int r = 0; r < P; r++) {
        int u0, u1;
        size_t plo, phi, slo, shi;
        adafactor_units_of_rank(h->units, h->num_units, h->n, h->zero, P, r, &u0, &u1);
        adafactor_unit_range(h->units, h->num_units, u0, u1, &plo, &phi, &slo, &shi);
        sc[r] = (int)(shi - slo), sc[P + r] = (int)slo;
    }
    DistRequest req;
    if (h->m) {
        dist_allgather_parts_begin(h->dist, sv->m, h->parts, h->parts + P, &req);
        dist_wait_request(h->dist, &req, "Adafactor first moment gather");
    }
    dist_allgather_parts_begin(h->dist, sv->v, sc, sc + P, &req);
    dist_wait_request(h->dist, &req, "Adafactor statistics gather");
    free(sc);
}

static void af_state_release(void *p, OptimStateView *sv) {
    (void)p;
    if (sv->copies) free(sv->m), free(sv->v);
    memset(sv, 0, sizeof *sv);
}

static void af_load_begin(void *p, float **m, float **v) {
    size_t n = ((HostAdafactor *)p)->n;
    *m = (float *)mallocCheck(n * sizeof(float), "Adafactor first moment (checkpoint)");
    *v = (float *)mallocCheck(n * sizeof(float), "Adafactor statistics (checkpoint)");
}

static void af_load_end(void *p, float *m, float *v) {
    HostAdafactor *h = (HostAdafactor *)p;
    if (h->m) memcpy(h->m, m + h->plo, (h->phi - h->plo) * sizeof(float));
    if (h->stats) memcpy(h->stats, v + h->slo, (h->shi - h->slo) * sizeof(float));
    free(m);
    free(v);
}

static void af_print_memory(void *p, FILE *out) {
    HostAdafactor *h = (HostAdafactor *)p;
    const double MiB = 1048576.0;
    int factored = 0;
    for (int i = h->u0; i < h->u1; i++) factored += h->units[i].cols != 0;
    size_t sb = (h->shi - h->slo) * sizeof(float), mb = h->m ? (h->phi - h->plo) * sizeof(float) : 0;
    size_t adamw = 2 * (h->zero ? h->phi - h->plo : h->n) * sizeof(float);
    fprintf(out, "optimizer (per rank, -z %d: %s, %d rank%s): Adafactor, %d of %d units (%d factored matrices): "
                 "second-moment statistics %zu bytes (%.1f MiB), first moment %zu bytes (%.1f MiB)%s; AdamW's m + v "
                 "for the same parameters: %zu bytes (%.1f MiB)\n",
            h->zero, h->zero ? "state sharded by whole units" : "not sharded", h->dist->size, h->dist->size == 1 ? "" : "s",
            h->u1 - h->u0, h->num_units, factored, sb, sb / MiB, mb, mb / MiB, h->m ? "" : " (no --adafactor-beta1)",
            adamw, adamw / MiB);
    if (h->relative_step)
        fprintf(out, "optimizer: --adafactor-relative-step 1: each tensor's step size is min(1e-2, 1/sqrt(t)) x max(1e-3, "
                     "RMS of the tensor); -l, its schedule and the step line's lr are not used\n");
}

static void af_free(void *p) {
    HostAdafactor *h = (HostAdafactor *)p;
    if (h->stats) mem_free(MEM_ADAM_V, h->stats, (h->shi - h->slo) * sizeof(float));
    if (h->m) mem_free(MEM_ADAM_M, h->m, (h->phi - h->plo) * sizeof(float));
    free(h->units);
    free(h->parts);
    memset(h, 0, sizeof *h);
}

void host_adafactor_open(TrainOptimizer *o, HostAdafactor *h, const TrainConfig *tc, TrainBackend *be, Dist *d) {
    if (tc->zero_stage > 1)
        llmc_die("-z %d: --optimizer adafactor shards its state at -z 1 (by whole matrices) at most; -z 2 and 3 are "
                 "not built for it (use -z 0 or 1, or --optimizer adamw)", tc->zero_stage);
    if (strcmp(tc->optim_state, "fp32") != 0)
        llmc_die("--optim-state %s: --optimizer adafactor keeps its statistics in fp32 (--optim-state is AdamW's)",
                 tc->optim_state);
    memset(h, 0, sizeof *h);
    h->dist = d, h->be = be, h->zero = tc->zero_stage, h->n = be->num_parameters;
    h->beta1 = tc->adafactor_beta1, h->clip = tc->adafactor_clip, h->decay_rate = tc->adafactor_decay_rate;
    h->relative_step = tc->adafactor_relative_step;
    const TensorSpec *specs = be->hostopt.param_specs;
    const int ns = be->arch->arch->num_param_specs;
    h->num_units = adafactor_units(specs, ns, &be->cfg, NULL, &h->num_stats);
    h->units = (AdafactorUnit *)mallocCheck((size_t)(h->num_units ? h->num_units : 1) * sizeof *h->units, "Adafactor units");
    adafactor_units(specs, ns, &be->cfg, h->units, &h->num_stats);
    if (h->num_stats > h->n) llmc_die("internal: Adafactor's %zu statistics exceed the %zu parameters", h->num_stats, h->n);
    adafactor_units_of_rank(h->units, h->num_units, h->n, h->zero, d->size, d->rank, &h->u0, &h->u1);
    adafactor_unit_range(h->units, h->num_units, h->u0, h->u1, &h->plo, &h->phi, &h->slo, &h->shi);
    if (h->shi > h->slo) h->stats = (float *)mem_calloc(MEM_ADAM_V, (h->shi - h->slo) * sizeof(float), 1, "Adafactor statistics");
    if (h->beta1 > 0.0f && h->phi > h->plo)
        h->m = (float *)mem_calloc(MEM_ADAM_M, (h->phi - h->plo) * sizeof(float), 1, "Adafactor first moment");
    if (h->zero == 1 && d->size > 1) {
        if (h->n > (size_t)INT_MAX) llmc_die("-z 1 with --optimizer adafactor: %zu parameters exceed what one MPI call takes", h->n);
        h->parts = (int *)mallocCheck(2 * (size_t)d->size * sizeof(int), "Adafactor parameter parts");
        for (int r = 0; r < d->size; r++) {
            int u0, u1;
            size_t plo, phi, slo, shi;
            adafactor_units_of_rank(h->units, h->num_units, h->n, h->zero, d->size, r, &u0, &u1);
            adafactor_unit_range(h->units, h->num_units, u0, u1, &plo, &phi, &slo, &shi);
            h->parts[r] = (int)(phi - plo), h->parts[d->size + r] = (int)plo;
        }
    }
    static const TrainOptimizer ops = {NULL, 1, af_loss_weight, NULL, af_reduce, af_grad_norm, af_step, af_state,
                                       af_state_release, af_load_begin, af_load_end, af_print_memory, af_free, NULL};
    *o = ops;
    o->ctx = h;
}
