/* epopt.c - the expert-parallel host AdamW (epopt.h). */
#include "llmc/train/epopt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/moe_ep.h"

/* region i's group: all ranks (0, 2) or the replicas (1) */
static int over_replicas(int i) { return i == 1; }

static void regions(const MixtralConfig *cfg, int ways, int zero, int ranks, int rank, EpRegion reg[3], size_t *k) {
    TensorSpec s[MIXTRAL_NUM_PARAMETERS];
    const size_t n = mixtral_shard_parameter_specs(cfg, ways, s);
    const size_t xa = s[MIXTRAL_P_expfcw].offset, xb = s[MIXTRAL_P_expprojw].offset + s[MIXTRAL_P_expprojw].numel;
    reg[0] = (EpRegion){0, xa, 0, xa};
    reg[1] = (EpRegion){xa, xb - xa, 0, xb - xa};
    reg[2] = (EpRegion){xb, n - xb, 0, n - xb};
    *k = 0;
    for (int i = 0; i < 3; i++) {
        if (zero >= 1) {
            if (over_replicas(i)) dist_shard(reg[i].len, ranks / ways, rank / ways, &reg[i].lo, &reg[i].hi);
            else dist_shard(reg[i].len, ranks, rank, &reg[i].lo, &reg[i].hi);
        }
        *k += reg[i].hi - reg[i].lo;
    }
}

static float ep_loss_weight(void *p, int accum) { return 1.0f / ((float)accum * (float)((EpAdamW *)p)->dist->size); }

static void ep_zero_grad(void *p) {
    EpAdamW *h = (EpAdamW *)p;
    if (h->gshard) memset(h->gshard, 0, (h->k ? h->k : 1) * sizeof(float));
}

/* -z 2: a bucket's gradients (the model's backward hands each layer's over, then the outer ones):
 * each slice summed over its group (one tensor's: all ranks, or the replicas for the experts), the
 * part this rank updates added into its gradient shard */
void ep_adamw_reduce_bucket(void *p, float *packed, const Bucket *b) {
    EpAdamW *h = (EpAdamW *)p;
    size_t pos = 0;
    for (int i = 0; i < b->n; pos += b->len[i], i++) {
        float *x = packed + pos;
        const size_t off = b->off[i], len = b->len[i];
        int j = off < h->reg[1].off ? 0 : off < h->reg[2].off ? 1 : 2;
        if (over_replicas(j)) dist_group_allreduce_f32(h->dist, x, len, h->replica, h->replicas);
        else dist_allreduce_f32(h->dist, x, len);
        size_t at = 0;
        for (int q = 0; q < j; q++) at += h->reg[q].hi - h->reg[q].lo;
        const size_t lo = h->reg[j].off + h->reg[j].lo, hi = h->reg[j].off + h->reg[j].hi;
        const size_t a = off > lo ? off : lo, e = off + len < hi ? off + len : hi;
        for (size_t k = a; k < e; k++) h->gshard[at + (k - lo)] += x[k - off];
    }
}

static void ep_reduce(void *p) {
    EpAdamW *h = (EpAdamW *)p;
    if (h->gshard) return; /* -z 2: reduced bucket by bucket during the backward */
    float *g = h->be->hostopt.host_grads;
    dist_allreduce_f32(h->dist, g + h->reg[0].off, h->reg[0].len);
    dist_group_allreduce_f32(h->dist, g + h->reg[1].off, h->reg[1].len, h->replica, h->replicas);
    dist_allreduce_f32(h->dist, g + h->reg[2].off, h->reg[2].len);
}

static float ep_grad_norm(void *p) {
    EpAdamW *h = (EpAdamW *)p;
    const float *g = h->be->hostopt.host_grads;
    double ss = 0.0;
    if (h->gshard) { /* every element is in exactly one rank's shard */
        ss = global_norm_squared(h->gshard, h->k);
        dist_allreduce_f64(h->dist, &ss, 1);
        return (float)sqrt(ss);
    }
    if (h->dist->rank == 0) ss += global_norm_squared(g + h->reg[0].off, h->reg[0].len) + global_norm_squared(g + h->reg[2].off, h->reg[2].len);
    if (h->group == 0) ss += global_norm_squared(g + h->reg[1].off, h->reg[1].len);
    dist_allreduce_f64(h->dist, &ss, 1);
    return (float)sqrt(ss);
}

/* the local full arena's runs that region i's [lo, hi) covers, tensor by tensor */
static void ep_step(void *p, const AdamWStep *a) {
    EpAdamW *h = (EpAdamW *)p;
    float *params = h->be->state.host_params;
    const float *g = h->be->hostopt.host_grads;
    size_t at = 0; /* region i's moments start at m + at */
    for (int i = 0; i < 3; i++) {
        const EpRegion *r = &h->reg[i];
        const size_t lo = r->off + r->lo, hi = r->off + r->hi;
        for (int t = 0; t < MIXTRAL_NUM_PARAMETERS; t++) {
            const TensorSpec *s = &h->specs[t];
            size_t x = s->offset > lo ? s->offset : lo, y = s->offset + s->numel < hi ? s->offset + s->numel : hi;
            if (x >= y) continue;
            const size_t mo = at + (x - lo);
            adamw_update(params + x, h->gshard ? h->gshard + mo : g + x, h->m + mo, h->v + mo, y - x, a->lr, a->beta1, a->beta2, a->eps,
                         s->decay ? a->weight_decay : 0.0f, a->t, a->grad_scale);
        }
        at += r->hi - r->lo;
    }
    if (h->zero == 0) return;
    dist_allgather_f32(h->dist, params + h->reg[0].off, h->reg[0].len);
    dist_group_allgather_f32(h->dist, params + h->reg[1].off, h->reg[1].len, h->replica, h->replicas);
    dist_allgather_f32(h->dist, params + h->reg[2].off, h->reg[2].len);
}

/* m or v as a whole local arena (n floats): the shards' runs placed, then (-z 1) all-gathered */
static float *local_moment(EpAdamW *h, const float *mine) {
    float *x = (float *)mallocCheck(h->n * sizeof(float) + 4, "AdamW moment (checkpoint)");
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        const EpRegion *r = &h->reg[i];
        memcpy(x + r->off + r->lo, mine + at, (r->hi - r->lo) * sizeof(float));
        at += r->hi - r->lo;
    }
    if (h->zero >= 1) {
        dist_allgather_f32(h->dist, x + h->reg[0].off, h->reg[0].len);
        dist_group_allgather_f32(h->dist, x + h->reg[1].off, h->reg[1].len, h->replica, h->replicas);
        dist_allgather_f32(h->dist, x + h->reg[2].off, h->reg[2].len);
    }
    return x;
}

/* rank 0's whole arena (n_whole floats, else NULL) from every shard's local one: its own non-expert
 * tensors, the experts of ranks 0 .. N - 1 (all-to-all group 0) */
static float *gather_whole(EpAdamW *h, const float *local) {
    Dist *d = h->dist;
    const int P = d->size, N = h->ways;
    const size_t xn = h->reg[1].len;
    int *c = (int *)callocCheck(2 * (size_t)P, sizeof(int), "expert gather counts");
    if (d->rank > 0 && d->rank < N) c[0] = (int)xn;
    if (d->rank == 0)
        for (int j = 1; j < N; j++) c[P + j] = (int)xn;
    if (xn > (size_t)1 << 30) llmc_die("expert parallelism: an expert shard of %zu floats exceeds one all-to-all", xn);
    float *got = (float *)mallocCheck(((d->rank == 0 ? (size_t)(N - 1) : 0) * xn + 1) * sizeof(float), "experts (checkpoint)");
    dist_alltoallv_f32(d, local + h->reg[1].off, c, got, c + P);
    free(c);
    if (d->rank != 0) {
        free(got);
        return NULL;
    }
    float *whole = (float *)mallocCheck(h->n_whole * sizeof(float), "whole model (checkpoint)");
    mixtral_shard_copy(&h->cfg, N, 0, whole, (float *)local, 0, 0);
    for (int j = 1; j < N; j++) mixtral_shard_copy(&h->cfg, N, j, whole, got + (size_t)(j - 1) * xn - h->reg[1].off, 0, 1);
    free(got);
    return whole;
}

static void ep_state(void *p, OptimStateView *s) {
    EpAdamW *h = (EpAdamW *)p;
    memset(s, 0, sizeof *s);
    float *m = h->zero ? local_moment(h, h->m) : h->m, *v = h->zero ? local_moment(h, h->v) : h->v;
    s->params = gather_whole(h, h->be->state.host_params);
    s->m = gather_whole(h, m);
    s->v = gather_whole(h, v);
    if (h->zero) free(m), free(v);
    s->whole_params = h->dist->rank == 0;
    s->copies = 1;
}

static void ep_state_release(void *p, OptimStateView *s) {
    (void)p;
    if (s->copies) free(s->params), free(s->m), free(s->v);
    memset(s, 0, sizeof *s);
}

static void ep_load_begin(void *p, float **m, float **v) {
    EpAdamW *h = (EpAdamW *)p;
    *m = (float *)mallocCheck(h->n_whole * sizeof(float), "AdamW m (checkpoint)");
    *v = (float *)mallocCheck(h->n_whole * sizeof(float), "AdamW v (checkpoint)");
}

/* this rank's shard of the whole moments: its table's, then its regions' runs */
static void keep_mine(EpAdamW *h, float *whole, float *mine) {
    float *x = (float *)mallocCheck(h->n * sizeof(float) + 4, "AdamW moment (resume)");
    mixtral_shard_copy(&h->cfg, h->ways, h->shard, whole, x, 1, 0);
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        const EpRegion *r = &h->reg[i];
        memcpy(mine + at, x + r->off + r->lo, (r->hi - r->lo) * sizeof(float));
        at += r->hi - r->lo;
    }
    free(x);
}

static void ep_load_end(void *p, float *m, float *v) {
    EpAdamW *h = (EpAdamW *)p;
    keep_mine(h, m, h->m);
    keep_mine(h, v, h->v);
    free(m), free(v);
}

static void ep_print_memory(void *p, FILE *out) {
    EpAdamW *h = (EpAdamW *)p;
    const double MiB = 1048576.0;
    fprintf(out, "optimizer (per rank, -ep %d, -z %d: %s): AdamW m %zu bytes (%.1f MiB), AdamW v the same; experts "
                 "%d..%d of %d, their gradients summed over %d rank%s, the rest over all %d\n",
            h->ways, h->zero, h->zero == 2   ? "moments + gradients sharded (experts over their replicas)"
                              : h->zero ? "moments sharded (experts over their replicas)"
                                        : "not sharded",
            h->k * sizeof(float), h->k * sizeof(float) / MiB, h->shard * (h->cfg.num_experts / h->ways),
            (h->shard + 1) * (h->cfg.num_experts / h->ways) - 1, h->cfg.num_experts, h->replicas,
            h->replicas == 1 ? "" : "s", h->dist->size);
}

static void ep_free(void *p) {
    EpAdamW *h = (EpAdamW *)p;
    mem_free(MEM_ADAM_M, h->m, (h->k ? h->k : 1) * sizeof(float));
    mem_free(MEM_ADAM_V, h->v, (h->k ? h->k : 1) * sizeof(float));
    if (h->gshard) mem_free(MEM_GRAD_SHARD, h->gshard, (h->k ? h->k : 1) * sizeof(float));
    free(h->replica);
}

void ep_adamw_open(TrainOptimizer *o, EpAdamW *h, const TrainConfig *tc, TrainBackend *be, Dist *d,
                   const MixtralConfig *cfg, int ways) {
    memset(h, 0, sizeof *h);
    h->dist = d, h->be = be, h->cfg = *cfg, h->ways = ways, h->zero = tc->zero_stage;
    h->shard = d->rank % ways, h->group = d->rank / ways, h->replicas = d->size / ways;
    h->n = mixtral_shard_parameter_specs(cfg, ways, h->specs);
    h->n_whole = mixtral_parameter_specs(cfg, NULL);
    regions(cfg, ways, h->zero, d->size, d->rank, h->reg, &h->k);
    h->replica = (int *)mallocCheck((size_t)h->replicas * sizeof(int), "replica ranks");
    for (int j = 0; j < h->replicas; j++) h->replica[j] = h->shard + j * ways;
    h->m = (float *)mem_calloc(MEM_ADAM_M, h->k ? h->k : 1, sizeof(float), "AdamW m");
    h->v = (float *)mem_calloc(MEM_ADAM_V, h->k ? h->k : 1, sizeof(float), "AdamW v");
    if (h->zero >= 2) h->gshard = (float *)mem_calloc(MEM_GRAD_SHARD, h->k ? h->k : 1, sizeof(float), "gradient shard");
    static const TrainOptimizer ops = {NULL, 2, ep_loss_weight, ep_zero_grad, ep_reduce, ep_grad_norm, ep_step, ep_state,
                                       ep_state_release, ep_load_begin, ep_load_end, ep_print_memory, ep_free, NULL};
    *o = ops;
    o->ctx = h;
}

void ep_adamw_plan(const MixtralConfig *cfg, int ways, int zero, int ranks, int rank, int checkpoints, MemPlan *p) {
    EpRegion reg[3];
    size_t k;
    regions(cfg, ways, zero, ranks, rank, reg, &k);
    p->host[MEM_ADAM_M] = p->host[MEM_ADAM_V] = (k ? k : 1) * sizeof(float);
    if (zero >= 2) p->host[MEM_GRAD_SHARD] = (k ? k : 1) * sizeof(float);
    if (!checkpoints) return;
    const size_t n = mixtral_shard_parameter_specs(cfg, ways, NULL), whole = mixtral_parameter_specs(cfg, NULL);
    /* -z 1: m and v as whole local arenas on every rank; rank 0: the whole model, m and v, and the
     * other shards' experts as they arrive */
    size_t t = zero ? 2 * n * sizeof(float) : 0;
    if (rank == 0) t += (3 * whole + (size_t)(ways - 1) * reg[1].len) * sizeof(float);
    p->transient[MEM_CHECKPOINT] = t;
}

void ep_plan_print(const MixtralConfig *cfg, int ways, int ranks, int B, int T, FILE *out) {
    TensorSpec w[MIXTRAL_NUM_PARAMETERS], s[MIXTRAL_NUM_PARAMETERS];
    mixtral_parameter_specs(cfg, w);
    const size_t n = mixtral_shard_parameter_specs(cfg, ways, s);
    const size_t ex = s[MIXTRAL_P_expfcw].numel + s[MIXTRAL_P_expprojw].numel;
    const size_t exw = w[MIXTRAL_P_expfcw].numel + w[MIXTRAL_P_expprojw].numel;
    const int El = cfg->num_experts / ways, k = cfg->top_k < El ? cfg->top_k : El;
    size_t acts, scratch;
    moe_ep_bytes(cfg, ways, B, T, &acts, &scratch);
    const double MiB = 1048576.0;
    fprintf(out, "expert parallelism: -ep %d over %d ranks (%d replica%s of each expert shard): rank r holds experts "
                 "[(r %% %d) x %d, +%d) of each layer; per rank %zu parameters = %zu expert (of %zu) + %zu shared\n",
            ways, ranks, ranks / ways, ranks / ways == 1 ? "" : "s", ways, El, El, n, ex, exw, n - ex);
    fprintf(out, "expert parallelism: all-to-all buffers (dropless bound: all %d ranks' B*T tokens routed to one rank, "
                 "at most min(top-k %d, %d local experts) = %d rows each): R = %zu rows a layer; stored per layer "
                 "R*(C + 3F) floats, %.2f MiB in all (activations); staging, outputs and gradients R*(2C + 3F) floats, "
                 "%.2f MiB (backward scratch); each of a layer's 4 exchanges a micro-step (2 forward, 2 backward) sends at most "
                 "B*T*K rows of C floats\n",
            ways, cfg->top_k, El, k, moe_ep_rows(cfg, ways, B, T), acts / MiB, scratch / MiB);
}
