#include "llmc/cpu/moe_ep.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmc/core/check.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/swiglu.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void moe_ep_init(MoeEp *ep, Dist *d, int ways, const MixtralConfig *cfg) {
    memset(ep, 0, sizeof *ep);
    ep->ways = ways, ep->dist = d;
    ep->shard = d->rank % ways, ep->group = d->rank / ways;
    ep->E = cfg->num_experts, ep->K = cfg->top_k, ep->local = cfg->num_experts / ways;
    ep->L = cfg->base.num_layers, ep->C = cfg->base.channels, ep->F = cfg->base.ffn_hidden;
}

size_t moe_ep_rows(const MixtralConfig *cfg, int ways, int B, int T) {
    const int El = cfg->num_experts / ways, k = cfg->top_k < El ? cfg->top_k : El;
    return (size_t)ways * B * T * (size_t)k;
}

void moe_ep_bytes(const MixtralConfig *cfg, int ways, int B, int T, size_t *acts, size_t *scratch) {
    const size_t R = moe_ep_rows(cfg, ways, B, T), C = (size_t)cfg->base.channels, F = (size_t)cfg->base.ffn_hidden;
    const size_t L = (size_t)cfg->base.num_layers, El = (size_t)(cfg->num_experts / ways);
    *acts = L * R * (C + 3 * F) * sizeof(float) + L * (size_t)ways * El * sizeof(int32_t);
    *scratch = R * (2 * C + 3 * F) * sizeof(float);
}

void moe_ep_allocate(MoeEp *ep, int B, int T) {
    MixtralConfig c = {0};
    c.base.num_layers = ep->L, c.base.channels = ep->C, c.base.ffn_hidden = ep->F;
    c.num_experts = ep->E, c.top_k = ep->K;
    const size_t R = moe_ep_rows(&c, ep->ways, B, T), C = (size_t)ep->C, F = (size_t)ep->F, L = (size_t)ep->L;
    size_t acts, scratch;
    moe_ep_bytes(&c, ep->ways, B, T, &acts, &scratch);
    ep->rows = R;
    char *a = (char *)mem_calloc(MEM_ACTIVATIONS, acts, 1, "expert-parallel activations");
    ep->ex = (float *)a;
    ep->eh = ep->ex + L * R * C;
    ep->es = ep->eh + L * R * 2 * F;
    ep->rcount = (int32_t *)(ep->es + L * R * F);
    ep->stage = (float *)mem_calloc(MEM_BWD_SCRATCH, scratch, 1, "expert-parallel exchange buffers");
    ep->ey = ep->stage + R * C;
    ep->edsw = ep->ey + R * C;
    ep->edh = ep->edsw + R * F;
    ep->training = 1;
}

void moe_ep_free(MoeEp *ep) {
    if (!ep->training) return;
    const size_t R = ep->rows, C = (size_t)ep->C, F = (size_t)ep->F, L = (size_t)ep->L;
    mem_free(MEM_ACTIVATIONS, ep->ex, L * R * (C + 3 * F) * sizeof(float) + L * (size_t)ep->ways * ep->local * sizeof(int32_t));
    mem_free(MEM_BWD_SCRATCH, ep->stage, R * (2 * C + 3 * F) * sizeof(float));
    ep->training = 0;
}

void moe_ep_clear_stats(MoeEp *ep) { ep->a2a_bytes = 0, ep->a2a_ms = 0.0; }

/* The all-to-all counts of one exchange over the world: rows (times width) to / from the members
 * of this rank's group, 0 to every other rank. send[j], recv[j]: rows to / from member j. */
static void exchange(MoeEp *ep, const float *send, const int *send_rows, float *recv, const int *recv_rows, int width) {
    Dist *d = ep->dist;
    const int P = d->size, N = ep->ways, first = ep->group * N;
    int *c = (int *)callocCheck(2 * (size_t)P, sizeof(int), "all-to-all counts");
    long long bytes = 0;
    for (int j = 0; j < N; j++) {
        c[first + j] = send_rows[j] * width, c[P + first + j] = recv_rows[j] * width;
        if (first + j != d->rank) bytes += (long long)send_rows[j] * width * (long long)sizeof(float);
    }
    const double t0 = now_ms();
    dist_alltoallv_f32(d, send, c, recv, c + P);
    ep->a2a_ms += now_ms() - t0;
    ep->a2a_bytes += bytes;
    free(c);
}

/* This layer's routing tables: rows to each member (send) and from each member (recv), each
 * member's first row in the source-major staging buffer, each local expert's first row in the
 * expert-major buffers, and the rows per local expert; rc: (N, El) rows from member j for expert e. */
typedef struct {
    int send[MIXTRAL_MAX_EXPERTS], recv[MIXTRAL_MAX_EXPERTS], src_at[MIXTRAL_MAX_EXPERTS + 1];
    int exp_at[MIXTRAL_MAX_EXPERTS + 1];
} Routes;

static void routes(const MoeEp *ep, const float *count, const int32_t *rc, Routes *r) {
    const int N = ep->ways, El = ep->local;
    for (int j = 0; j < N; j++) {
        r->send[j] = 0, r->recv[j] = 0;
        for (int e = 0; e < El; e++) r->send[j] += (int)count[j * El + e], r->recv[j] += rc[j * El + e];
    }
    r->src_at[0] = 0;
    for (int j = 0; j < N; j++) r->src_at[j + 1] = r->src_at[j] + r->recv[j];
    r->exp_at[0] = 0;
    for (int e = 0; e < El; e++) {
        int n = 0;
        for (int j = 0; j < N; j++) n += rc[j * El + e];
        r->exp_at[e + 1] = r->exp_at[e] + n;
    }
    if ((size_t)r->src_at[N] > ep->rows)
        llmc_die("internal: expert parallelism received %d rows, more than the bound %zu", r->src_at[N], ep->rows);
}

/* staging (source-major: member j's rows, within them expert by expert) <-> expert-major
 * (expert e's rows, within them member by member); to_expert 1: staging -> grouped */
static void reorder(const MoeEp *ep, const int32_t *rc, const Routes *r, float *staging, float *grouped, int width,
                    int to_expert) {
    const int N = ep->ways, El = ep->local;
    int at[MIXTRAL_MAX_EXPERTS];
    for (int e = 0; e < El; e++) at[e] = r->exp_at[e];
    for (int j = 0; j < N; j++) {
        size_t src = (size_t)r->src_at[j];
        for (int e = 0; e < El; e++) {
            const size_t n = (size_t)rc[j * El + e] * width;
            float *s = staging + src * width, *g = grouped + (size_t)at[e] * width;
            if (to_expert) memcpy(g, s, n * sizeof(float));
            else memcpy(s, g, n * sizeof(float));
            src += (size_t)rc[j * El + e];
            at[e] += rc[j * El + e];
        }
    }
}

void moe_ep_forward(MoeEp *ep, int l, const float *w13, const float *w2, const float *mx, const float *count, float *my) {
    const int N = ep->ways, El = ep->local, C = ep->C, F = ep->F;
    const size_t R = ep->rows;
    int32_t sc[MIXTRAL_MAX_EXPERTS];
    int32_t *rc = ep->rcount + (size_t)l * N * El;
    for (int e = 0; e < N * El; e++) sc[e] = (int32_t)count[e]; /* (member j's experts are j El ..) */
    /* the counts, over the world: El ints to each member of the group, none to the others */
    {
        Dist *d = ep->dist;
        const int P = d->size, first = ep->group * N;
        int32_t *s = (int32_t *)callocCheck(2 * (size_t)P * El, sizeof(int32_t), "expert counts");
        for (int j = 0; j < N; j++) memcpy(s + (size_t)(first + j) * El, sc + (size_t)j * El, (size_t)El * sizeof(int32_t));
        const double t0 = now_ms();
        dist_alltoall_i32(d, s, El, s + (size_t)P * El);
        ep->a2a_ms += now_ms() - t0;
        ep->a2a_bytes += (long long)(N - 1) * El * (long long)sizeof(int32_t);
        memcpy(rc, s + (size_t)P * El + (size_t)first * El, (size_t)N * El * sizeof(int32_t));
        free(s);
    }
    Routes r;
    routes(ep, count, rc, &r);
    float *ex = ep->ex + (size_t)l * R * C, *eh = ep->eh + (size_t)l * R * 2 * F, *es = ep->es + (size_t)l * R * F;
    exchange(ep, mx, r.send, ep->stage, r.recv, C);
    reorder(ep, rc, &r, ep->stage, ex, C, 1);
    for (int e = 0; e < El; e++) {
        const int rows = r.exp_at[e + 1] - r.exp_at[e];
        const size_t a = (size_t)r.exp_at[e];
        if (rows == 0) continue;
        matmul_forward(eh + a * 2 * F, ex + a * C, w13 + (size_t)e * 2 * F * C, NULL, rows, C, 2 * F);
        swiglu_forward(es + a * F, eh + a * 2 * F, rows, F);
        matmul_forward(ep->ey + a * C, es + a * F, w2 + (size_t)e * C * F, NULL, rows, F, C);
    }
    reorder(ep, rc, &r, ep->stage, ep->ey, C, 0);
    exchange(ep, ep->stage, r.recv, my, r.send, C);
}

void moe_ep_backward(MoeEp *ep, int l, const float *w13, const float *w2, float *dw13, float *dw2, float *dy,
                     const float *count) {
    const int N = ep->ways, El = ep->local, C = ep->C, F = ep->F;
    const size_t R = ep->rows;
    const int32_t *rc = ep->rcount + (size_t)l * N * El;
    Routes r;
    routes(ep, count, rc, &r);
    const float *ex = ep->ex + (size_t)l * R * C, *eh = ep->eh + (size_t)l * R * 2 * F, *es = ep->es + (size_t)l * R * F;
    float *ed = ep->ey;
    exchange(ep, dy, r.send, ep->stage, r.recv, C);
    reorder(ep, rc, &r, ep->stage, ed, C, 1);
    for (int e = 0; e < El; e++) {
        const int n = r.exp_at[e + 1] - r.exp_at[e];
        const size_t a = (size_t)r.exp_at[e];
        if (n == 0) continue;
        matmul_backward(ep->edsw + a * F, dw2 + (size_t)e * C * F, NULL, ed + a * C, es + a * F, w2 + (size_t)e * C * F, n,
                        F, C);
        swiglu_backward(ep->edh + a * 2 * F, eh + a * 2 * F, ep->edsw + a * F, n, F);
        /* dx of these rows replaces their dy (consumed above) */
        matmul_backward(ed + a * C, dw13 + (size_t)e * 2 * F * C, NULL, ep->edh + a * 2 * F, ex + a * C,
                        w13 + (size_t)e * 2 * F * C, n, C, 2 * F);
    }
    reorder(ep, rc, &r, ep->stage, ed, C, 0);
    exchange(ep, ep->stage, r.recv, dy, r.send, C);
}
