/*
 * hostopt.c - the loop's host AdamW behind TrainOptimizer (hostopt.h): thin adapters from the
 * interface to optim.h's functions and the backend's host-gradient hooks.
 */
#include "llmc/train/hostopt.h"
#include "llmc/core/check.h"
#include "llmc/core/optstate.h"
#include "llmc/train/nvme.h"

#include <stdlib.h>
#include <string.h>

static float host_loss_weight(void *p, int accum) { return optim_loss_weight(&((HostAdamW *)p)->opt, accum); }

static void host_zero_grad(void *p) { optim_zero_grad(&((HostAdamW *)p)->opt); }

/* A device backend's gradients reach the host first (--offload optimizer), then the ranks' sum. */
static void host_reduce(void *p) {
    HostAdamW *h = (HostAdamW *)p;
    TrainBackend *be = h->be;
    if (be->hostopt.grads_to_host) be->hostopt.grads_to_host(be->model);
    if (h->gc.residual) gradcomp_reduce(&h->gc, be->hostopt.host_grads); /* --grad-compression, several ranks */
    else optim_reduce(&h->opt, be->hostopt.host_grads);
}

/* --offload optimizer: from per-bucket sums of squares (one rank: those the backend accumulated
 * as each bucket's gradients reached the host; more: computed now, after the reduction). */
static float host_grad_norm(void *p) {
    HostAdamW *h = (HostAdamW *)p;
    TrainBackend *be = h->be;
    if (!h->offload) return optim_grad_norm(&h->opt, be->hostopt.host_grads);
    const double *sumsq = h->opt.dist->size == 1 && be->hostopt.grad_bucket_sumsq ? be->hostopt.grad_bucket_sumsq(be->model) : NULL;
    return optim_grad_norm_buckets(&h->opt, be->hostopt.host_grads, sumsq);
}

static void host_step(void *p, const AdamWStep *s) {
    HostAdamW *h = (HostAdamW *)p;
    TrainBackend *be = h->be;
    if (h->offload)
        optim_step_buckets(&h->opt, be->state.host_params, be->hostopt.host_grads, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay,
                           s->t, s->grad_scale, be->hostopt.params_bucket_to_device, be->model);
    else
        optim_step(&h->opt, be->state.host_params, be->hostopt.host_grads, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay, s->t,
                   s->grad_scale);
    if (be->hostopt.params_from_host) be->hostopt.params_from_host(be->model);
}

enum { COPY_MOMENTS = 1, COPY_PARAMS = 2 };

/* Whole fp32 moments are written as they are; whole compact ones (-z 0) decoded a chunk at a time
 * as the state file is written (no fp32 copy: the peak stays below fp32's); else gathered (and
 * decoded) into copies on rank 0, and at -z 3 the model too from the ranks' shards. */
static void host_state(void *p, OptimStateView *s) {
    HostAdamW *h = (HostAdamW *)p;
    Optimizer *o = &h->opt;
    TrainBackend *be = h->be;
    memset(s, 0, sizeof *s);
    s->params = be->state.host_params;
    s->whole_params = 1;
    if (optim_state_is_whole(o)) {
        s->m = o->m, s->v = o->v;
        return;
    }
    if (optim_state_streamed_for(o->zero, o->state) || (o->nvme && o->zero == 0)) { /* (nvme: read from the file) */
        s->moment = optim_moment_chunk, s->moment_ctx = o;
        return;
    }
    size_t n = o->dist->rank == 0 ? be->num_parameters : 1;
    s->m = (float *)mallocCheck(n * sizeof(float), "AdamW m (checkpoint)");
    s->v = (float *)mallocCheck(n * sizeof(float), "AdamW v (checkpoint)");
    s->copies = COPY_MOMENTS;
    optim_gather_state(o, s->m, s->v);
    if (o->zero == 3) { /* the model file from the ranks' shards, on rank 0 */
        s->params = (float *)mallocCheck(n * sizeof(float), "parameters (checkpoint)");
        s->copies |= COPY_PARAMS;
        s->whole_params = o->dist->rank == 0;
        optim_gather_params(o, be->state.host_params, s->params);
    }
}

static void host_state_release(void *p, OptimStateView *s) {
    (void)p;
    if (s->copies & COPY_MOMENTS) free(s->m), free(s->v);
    if (s->copies & COPY_PARAMS) free(s->params);
    memset(s, 0, sizeof *s);
}

static void host_load_begin(void *p, float **m, float **v) {
    size_t n = ((HostAdamW *)p)->be->num_parameters;
    *m = (float *)mallocCheck(n * sizeof(float), "AdamW m (checkpoint)");
    *v = (float *)mallocCheck(n * sizeof(float), "AdamW v (checkpoint)");
}

static void host_load_end(void *p, float *m, float *v) {
    optim_load_state(&((HostAdamW *)p)->opt, m, v);
    free(m);
    free(v);
}

static void host_print_memory(void *p, FILE *out) {
    HostAdamW *h = (HostAdamW *)p;
    optim_print_memory(&h->opt, out);
    if (h->gc.spec.kind != GC_NONE) gradcomp_print_memory(&h->gc, out);
}

/* --offload-device nvme: the I/O rate of the step's pass over the file */
static void host_io_report(void *p, char *line, size_t len, Logger *lg) {
    HostAdamW *h = (HostAdamW *)p;
    if (!h->opt.nvme) return;
    if (line) { /* the step line comes first: the rates are taken then, the log record repeats them */
        nvme_take_rates(h->opt.nvme, &h->nvme_read_MBps, &h->nvme_write_MBps);
        snprintf(line, len, " | nvme %.0f MB/s read, %.0f MB/s write", h->nvme_read_MBps, h->nvme_write_MBps);
    }
    if (lg) {
        log_double(lg, "nvme_read_MBps", h->nvme_read_MBps);
        log_double(lg, "nvme_write_MBps", h->nvme_write_MBps);
    }
}

static void host_free(void *p) {
    gradcomp_free(&((HostAdamW *)p)->gc);
    optim_free(&((HostAdamW *)p)->opt);
}

void host_adamw_open(TrainOptimizer *o, HostAdamW *h, const TrainConfig *tc, TrainBackend *be, Dist *d) {
    memset(h, 0, sizeof *h);
    h->be = be;
    h->offload = strcmp(tc->offload, "optimizer") == 0;
    optim_init_nvme(&h->opt, d, tc->zero_stage, be->num_parameters, be->hostopt.param_specs,
                    be->hostopt.num_param_specs ? be->hostopt.num_param_specs : be->arch->arch->num_param_specs,
                    optstate_parse(tc->optim_state), strcmp(tc->offload_device, "nvme") == 0 ? tc->nvme_path : NULL);
    if (be->hostopt.attach_optimizer) be->hostopt.attach_optimizer(be->model, &h->opt, &be->state.host_params, &be->hostopt.host_grads);
    GradCompSpec gc;
    char err[256];
    if (gradcomp_parse(tc->grad_compression, &gc, err, sizeof err) != 0) llmc_die("flag --grad-compression: %s", err);
    if (gc.kind != GC_NONE) /* (cli.c refused -z 2/3) */
        gradcomp_init(&h->gc, &gc, d, be->num_parameters, h->opt.specs, h->opt.num_specs, be->cfg.num_layers + 1,
                      &be->cfg);
    /* in TrainOptimizer's order: ctx, zero_max, then the ops */
    static const TrainOptimizer ops = {NULL, OPTIM_MAX_ZERO, host_loss_weight, host_zero_grad, host_reduce, host_grad_norm,
                                       host_step, host_state, host_state_release, host_load_begin, host_load_end,
                                       host_print_memory, host_free, host_io_report};
    *o = ops;
    o->ctx = h;
}
