#include "optim.h"
#include "check.h"
#include "cpu/adamw.h"
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void optim_init(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs) {
    if (zero == 3)
        llmc_die("-z 3: ZeRO stage 3 (parameters sharded, gathered layer by layer before use) is not built yet; "
                 "use -z 2 (moments and gradients sharded) or -z 1 (moments sharded)");
    memset(o, 0, sizeof *o);
    o->dist = d;
    o->zero = zero;
    o->n = n;
    o->specs = specs;
    o->num_specs = num_specs;
    o->lo = 0;
    o->hi = n;
    if (zero >= 1) dist_shard(n, d->size, d->rank, &o->lo, &o->hi);
    size_t k = optim_shard_floats(n, zero, d->size, d->rank);
    o->m = (float *)mem_calloc(MEM_ADAM_M, k, sizeof(float), "AdamW m");
    o->v = (float *)mem_calloc(MEM_ADAM_V, k, sizeof(float), "AdamW v");
    if (zero == 2) o->gshard = (float *)mem_calloc(MEM_GRAD_SHARD, k, sizeof(float), "gradient shard");
}

size_t optim_shard_floats(size_t n, int zero, int ranks, int rank) {
    size_t lo = 0, hi = n;
    if (zero >= 1) dist_shard(n, ranks, rank, &lo, &hi);
    /* at least one float each, so that a rank past the end (owning nothing) still has buffers */
    return hi - lo ? hi - lo : 1;
}

void optim_free(Optimizer *o) {
    size_t k = optim_shard_floats(o->n, o->zero, o->dist->size, o->dist->rank) * sizeof(float);
    mem_free(MEM_ADAM_M, o->m, k);
    mem_free(MEM_ADAM_V, o->v, k);
    mem_free(MEM_GRAD_SHARD, o->gshard, k);
    memset(o, 0, sizeof *o);
}

float optim_loss_weight(const Optimizer *o, int accum) { return 1.0f / ((float)accum * (float)o->dist->size); }

void optim_reduce(Optimizer *o, float *grads) {
    if (o->zero == 2) dist_reduce_scatter_f32(o->dist, grads, o->gshard, o->n);
    else dist_allreduce_f32(o->dist, grads, o->n);
}

float optim_grad_norm(Optimizer *o, const float *grads) {
    if (o->zero != 2) return (float)sqrt(global_norm_squared(grads, o->n)); /* identical grads everywhere */
    double ss = o->hi > o->lo ? global_norm_squared(o->gshard, o->hi - o->lo) : 0.0;
    dist_allreduce_f64(o->dist, &ss, 1);
    return (float)sqrt(ss);
}

void optim_step(Optimizer *o, float *params, const float *grads, float lr, float beta1, float beta2, float eps,
                float weight_decay, int t, float grad_scale) {
    /* the shard's gradients: the summed gradient's [lo, hi) */
    const float *g = o->zero == 2 ? o->gshard : grads + o->lo;
    for (int i = 0; i < o->num_specs; i++) {
        const TensorSpec *s = &o->specs[i];
        size_t a = s->offset > o->lo ? s->offset : o->lo;
        size_t b = s->offset + s->numel < o->hi ? s->offset + s->numel : o->hi;
        if (a >= b) continue;
        adamw_update(params + a, g + (a - o->lo), o->m + (a - o->lo), o->v + (a - o->lo), b - a, lr, beta1, beta2,
                     eps, s->decay ? weight_decay : 0.0f, t, grad_scale);
    }
    if (o->zero >= 1) dist_allgather_f32(o->dist, params, o->n);
}

void optim_gather_state(Optimizer *o, float *m, float *v) {
    if (o->zero == 0) { /* every rank has it all: rank 0's copy is the checkpoint's */
        if (o->dist->rank != 0) return;
        memcpy(m, o->m, o->n * sizeof(float));
        memcpy(v, o->v, o->n * sizeof(float));
        return;
    }
    dist_gather_f32(o->dist, o->m, m, o->n);
    dist_gather_f32(o->dist, o->v, v, o->n);
}

void optim_load_state(Optimizer *o, const float *m, const float *v) {
    memcpy(o->m, m + o->lo, (o->hi - o->lo) * sizeof(float));
    memcpy(o->v, v + o->lo, (o->hi - o->lo) * sizeof(float));
}

void optim_print_memory(const Optimizer *o, FILE *out) {
    const double MiB = 1048576.0;
    size_t k = o->hi - o->lo;
    static const char *const what[] = {"not sharded", "moments sharded", "moments + gradients sharded"};
    fprintf(out, "optimizer (per rank, -z %d: %s, %d rank%s): AdamW m %zu bytes (%.1f MiB), AdamW v %zu bytes "
                 "(%.1f MiB), reduced gradient %zu bytes (%.1f MiB), parameters %zu bytes (%.1f MiB)\n",
            o->zero, what[o->zero], o->dist->size, o->dist->size == 1 ? "" : "s", k * sizeof(float),
            k * sizeof(float) / MiB, k * sizeof(float), k * sizeof(float) / MiB,
            (o->zero == 2 ? k : o->n) * sizeof(float), (o->zero == 2 ? k : o->n) * sizeof(float) / MiB,
            o->n * sizeof(float), o->n * sizeof(float) / MiB);
}
