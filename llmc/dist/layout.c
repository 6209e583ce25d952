/* layout.c - the tensor- and data-parallel groups (layout.h) as Dists whose collectives run over the
 * parent's all-gather. */
#include "llmc/dist/layout.h"
#include "llmc/core/check.h"
#include "llmc/dist/dist.h"
#include "llmc/dist/dist_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Dist *parent;
    int *members;  /* the group's parent ranks, in group rank order */
    int *index_of; /* every parent rank's index within its own group */
} Group;

static Dist tp_group = {.size = 1, .launcher = "one process", .timeout_s = DIST_DEFAULT_TIMEOUT_S};
static Dist data_group;
static Group tp_state, data_state;
static int have_layout;

Dist *dist_tp_group(void) { return &tp_group; }
Dist *dist_data_group(void) { return have_layout ? &data_group : dist_world(); }

/* Every parent rank's run of counts[its group index] elements (the groups run the same call, so the
 * counts of rank i of any group are counts[i]) gathered from mine into a fresh buffer; pd: where each
 * parent rank's run starts there. */
static void *gather_all(Dist *d, const void *mine, const int *counts, DistType t, int **pd_out, const char *what) {
    Group *g = (Group *)d->transport;
    Dist *p = g->parent;
    const size_t es = dist_type_size(t);
    int *pc = (int *)mallocCheck(2 * (size_t)p->size * sizeof(int), "group counts"), *pd = pc + p->size;
    long long total = 0;
    for (int r = 0; r < p->size; r++) {
        pc[r] = counts[g->index_of[r]];
        pd[r] = (int)total;
        total += pc[r];
    }
    if (total > 0x7fffffffLL) llmc_die("dist: a group collective of %lld elements exceeds what one call takes", total);
    char *all = (char *)mallocCheck((size_t)(total ? total : 1) * es, "group all-gather");
    memcpy(all + (size_t)pd[p->rank] * es, mine, (size_t)pc[p->rank] * es);
    p->collectives++;
    p->ops->allgatherv(p, all, pc, pd, t, what);
    memmove(pc, pd, (size_t)p->size * sizeof(int));
    *pd_out = pc;
    return all;
}

static void group_allgatherv(Dist *d, void *buf, const int *counts, const int *displs, DistType t, const char *what) {
    Group *g = (Group *)d->transport;
    const size_t es = dist_type_size(t);
    int *pd;
    char *all = (char *)gather_all(d, (char *)buf + (size_t)displs[d->rank] * es, counts, t, &pd, what);
    for (int j = 0; j < d->size; j++)
        memcpy((char *)buf + (size_t)displs[j] * es, all + (size_t)pd[g->members[j]] * es, (size_t)counts[j] * es);
    free(all), free(pd);
}

static void group_reduce_scatter(Dist *d, const float *send, float *recv, const int *counts, const char *what) {
    Group *g = (Group *)d->transport;
    int total = 0, mine = 0;
    for (int j = 0; j < d->size; j++) {
        if (j == d->rank) mine = total;
        total += counts[j];
    }
    int *whole = (int *)mallocCheck((size_t)d->size * sizeof(int), "group counts"), *pd;
    for (int j = 0; j < d->size; j++) whole[j] = total;
    float *all = (float *)gather_all(d, send ? send : recv, whole, DIST_F32, &pd, what);
    for (int i = 0; i < counts[d->rank]; i++) { /* summed in group rank order: the same bits on every rank */
        float s = 0.0f;
        for (int j = 0; j < d->size; j++) s += all[(size_t)pd[g->members[j]] + (size_t)mine + (size_t)i];
        recv[i] = s;
    }
    free(all), free(pd), free(whole);
}

static void group_allgatherv_begin(Dist *d, float *buf, const int *counts, const int *displs, DistRequest *req) {
    group_allgatherv(d, buf, counts, displs, DIST_F32, "all-gather (group)");
    req->active = 0; /* complete here */
}
static void group_wait(Dist *d, DistRequest *req, const char *what) { (void)d, (void)req, (void)what; }

static void group_gatherv(Dist *d, const float *shard, float *full, const int *counts, const int *displs, const char *what) {
    Group *g = (Group *)d->transport;
    int *pd;
    float *all = (float *)gather_all(d, shard, counts, DIST_F32, &pd, what);
    if (d->rank == 0)
        for (int j = 0; j < d->size; j++)
            memmove(full + displs[j], all + pd[g->members[j]], (size_t)counts[j] * sizeof(float));
    free(all), free(pd);
}

static void group_bcast(Dist *d, void *buf, size_t bytes, const char *what) {
    Group *g = (Group *)d->transport;
    const size_t words = (bytes + 3) / 4;
    if (words > 0x7fffffff / (size_t)g->parent->size) llmc_die("dist: a group broadcast of %zu bytes is too large", bytes);
    int *counts = (int *)mallocCheck((size_t)d->size * sizeof(int), "group counts"), *pd;
    for (int j = 0; j < d->size; j++) counts[j] = (int)words;
    uint32_t *mine = (uint32_t *)callocCheck(words ? words : 1, 4, "group broadcast");
    memcpy(mine, buf, bytes);
    uint32_t *all = (uint32_t *)gather_all(d, mine, counts, DIST_U32, &pd, what);
    memcpy(buf, all + pd[g->members[0]], bytes);
    free(all), free(pd), free(counts), free(mine);
}

static void group_barrier(Dist *d, const char *what) {
    Dist *p = ((Group *)d->transport)->parent;
    p->collectives++;
    p->ops->barrier(p, what);
}
static void group_busy(Dist *d, int what) { (void)d, (void)what; } /* (the heartbeat is the whole group's) */
static void group_finalize(Dist *d) { (void)d; }

static const DistOps group_ops = {"group", group_reduce_scatter, group_allgatherv, group_allgatherv_begin, group_wait,
                                  group_gatherv, group_bcast, group_barrier, group_busy, group_finalize,
                                  NULL /* alltoallv: -ep runs over the world, never over a -tp group (cli.c refuses both) */};

/* d: the group of the parent's ranks r with key(r) == key(parent rank), ordered by r */
static void make_group(Dist *d, Group *g, Dist *world, int tp, int by_tp) {
    const int P = world->size, me = world->rank;
    g->parent = world;
    g->members = (int *)mallocCheck((size_t)P * sizeof(int), "group members");
    g->index_of = (int *)mallocCheck((size_t)P * sizeof(int), "group members");
    int n = 0;
    for (int r = 0; r < P; r++) {
        g->index_of[r] = by_tp ? r % tp : r / tp;
        if (by_tp ? r / tp == me / tp : r % tp == me % tp) g->members[n++] = r;
    }
    memset(d, 0, sizeof *d);
    d->size = n;
    d->rank = by_tp ? me % tp : me / tp;
    d->local_rank = world->local_rank;
    d->timeout_s = world->timeout_s;
    snprintf(d->launcher, sizeof d->launcher, "%.40s (%s group)", world->launcher, by_tp ? "tp" : "dp");
    d->ops = n > 1 ? &group_ops : NULL;
    d->transport = g;
}

void dist_layout_init(Dist *world, int tp) {
    if (tp < 1 || world->size % tp != 0)
        llmc_die("flag -tp %d: %d process%s do%s not divide into tensor-parallel groups of %d (start a multiple of %d "
                 "processes: the data-parallel size is processes / tp)", tp, world->size, world->size == 1 ? "" : "es",
                 world->size == 1 ? "es" : "", tp, tp);
    if (tp == 1) return;
    make_group(&tp_group, &tp_state, world, tp, 1);
    make_group(&data_group, &data_state, world, tp, 0);
    have_layout = 1;
}
