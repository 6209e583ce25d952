#include "llmc/train/budget.h"
#include "llmc/core/check.h"
#include "llmc/dist/dist.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rough factors (README "Memory"): an elementwise pass per layer recomputed in the backward
 * costs about 1% of a step (-r 1: GELU; -r 2: also the two layernorms, 1% more); halving the
 * micro-batch costs about 4% (twice the micro-steps: per-call overheads and smaller matmuls);
 * each ZeRO stage raised about 5% (its gathers and scatters not hidden behind compute).
 * -r 3 (the GPU's whole block) adds the blocks' forward flops, counted from the model. */
enum { COST_ELEMENTWISE_PCT = 1, COST_HALVE_BATCH_PCT = 4, COST_ZERO_STAGE_PCT = 5, COST_OFFLOAD_PCT = 15 };
/* --offload optimizer, the last resort (~15%): per step the gradients go to the host and the
 * parameters back (4 bytes per parameter in bf16 over PCIe) and the CPU runs AdamW over 16 bytes
 * of state per parameter, none of it overlapped with the GPU yet: for GPT-2 124M on an H200 about
 * 10 ms of copies and 20-30 ms of CPU update against a ~280 ms step. */

static int offloaded(const TrainConfig *tc) { return strcmp(tc->offload, "optimizer") == 0; }

static double recompute_cost(const ModelConfig *cfg, int T, int r) {
    double c = COST_ELEMENTWISE_PCT / 100.0 * (r >= 1) + COST_ELEMENTWISE_PCT / 100.0 * (r >= 2);
    if (r >= 3) {
        /* a forward of the blocks = a third of their forward + backward: everything but the LM head */
        double per_token = gpt2_flops_per_token(cfg, T);
        double head = 6.0 * (double)cfg->padded_vocab_size * cfg->channels;
        c += (per_token - head) / 3.0 / per_token;
    }
    return c;
}

double budget_cost(const TrainConfig *tc, const ModelConfig *cfg, int recompute, int B, int zero, int offload) {
    return recompute_cost(cfg, tc->T, recompute) - recompute_cost(cfg, tc->T, tc->recompute) +
           COST_HALVE_BATCH_PCT / 100.0 * log2((double)tc->B / B) + COST_ZERO_STAGE_PCT / 100.0 * (zero - tc->zero_stage) +
           COST_OFFLOAD_PCT / 100.0 * (offload - offloaded(tc));
}

size_t budget_peak(const TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s) {
    MemPlan p;
    train_memory_plan(tc, cfg, s->plan, s->host_optimizer || offloaded(tc), s->device, &p);
    return mem_plan_peak(&p, 0, NULL) + s->overhead;
}

static double gib(size_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

/* A budget as the messages print it: GiB, or bytes below 1 MiB (which "0.000 GiB" would hide). */
typedef struct {
    char s[48];
} SizeText;
static SizeText budget_text(size_t b) {
    SizeText t;
    if (b < (1u << 20)) snprintf(t.s, sizeof t.s, "%zu bytes", b);
    else snprintf(t.s, sizeof t.s, "%.3f GiB", gib(b));
    return t;
}

/* tc with -d resolved (0 = one micro-batch per rank) */
static TrainConfig resolved(const TrainConfig *tc) {
    TrainConfig r = *tc;
    if (!r.total_batch) r.total_batch = (long long)r.B * r.T * r.num_processes;
    return r;
}

int budget_fit(TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s, size_t budget, const char *why, FILE *out) {
    TrainConfig base = resolved(tc);
    size_t need = budget_peak(&base, cfg, s);
    if (need <= budget) {
        if (out)
            fprintf(out, "%s %s: the requested configuration fits (peak %.3f GiB)\n", why, budget_text(budget).s,
                    gib(need));
        return 0;
    }
    const int P = base.num_processes;
    const int zmax = P > 1 ? s->max_zero : base.zero_stage;
    TrainConfig best = base, smallest = base;
    double best_cost = INFINITY;
    size_t best_peak = 0, smallest_peak = need;
    for (int B = base.B; B >= 1; B--) {
        if (base.total_batch % ((long long)B * base.T * P) != 0) continue;
        for (int r = base.recompute; r <= s->max_recompute; r++)
            for (int z = base.zero_stage; z <= zmax; z++) {
                /* o: --offload optimizer, as given, or tried last where the trainer builds it (one
                 * process, -z 0) */
                const int o_lo = offloaded(&base), o_hi = s->can_offload && P == 1 && z == 0 ? 1 : o_lo;
                for (int o = o_lo; o <= o_hi; o++) {
                    TrainConfig c = base;
                    c.B = B, c.recompute = r, c.zero_stage = z;
                    if (o) snprintf(c.offload, sizeof c.offload, "optimizer");
                    size_t peak = budget_peak(&c, cfg, s);
                    if (peak < smallest_peak) smallest = c, smallest_peak = peak;
                    double cost = budget_cost(&base, cfg, r, B, z, o);
                    if (peak <= budget && cost < best_cost) best = c, best_cost = cost, best_peak = peak;
                }
            }
    }
    /* -b 1 always keeps -d exact (it is a multiple of T * processes), so only -b 1 has no smaller one */
    const char *no_batch = base.B == 1 ? " (-b is 1 already: no smaller micro-batch)" : "";
    char fixed_r[200] = ""; /* a model without recompute levels: say that -r was not searched */
    if (s->no_recompute) snprintf(fixed_r, sizeof fixed_r, "; -r not searched: %s", s->no_recompute);
    if (best_cost == INFINITY)
        llmc_die("%s %s: nothing fits; the requested configuration (-r %d, -b %d, -z %d, --offload %s) needs %.3f GiB "
                 "and the smallest peak found is %.3f GiB (-r %d, -b %d, -z %d, --offload %s, -d %lld)%s%s",
                 why, budget_text(budget).s, base.recompute, base.B, base.zero_stage, base.offload, gib(need),
                 gib(smallest_peak), smallest.recompute, smallest.B, smallest.zero_stage, smallest.offload,
                 smallest.total_batch, no_batch, fixed_r);
    long long accum = best.total_batch / ((long long)best.B * best.T * P);
    const int o0 = offloaded(&base), o1 = offloaded(&best);
    if (out) fprintf(out, "%s %s: the requested configuration (-r %d, -b %d, -z %d, --offload %s) needs %.3f GiB; chose "
                 "-r %d, -b %d, -z %d, --offload %s, -d %lld (%lld accumulation steps), peak %.3f GiB; predicted cost +%.0f%% "
                 "step time (recompute %+.0f%%, micro-batch %+.0f%%, ZeRO %+.0f%%, offload %+.0f%%)%s\n",
            why, budget_text(budget).s, base.recompute, base.B, base.zero_stage, base.offload, gib(need), best.recompute,
            best.B, best.zero_stage, best.offload, best.total_batch, accum, gib(best_peak), 100.0 * best_cost,
            100.0 * budget_cost(&base, cfg, best.recompute, base.B, base.zero_stage, o0),
            100.0 * budget_cost(&base, cfg, base.recompute, best.B, base.zero_stage, o0),
            100.0 * budget_cost(&base, cfg, base.recompute, base.B, best.zero_stage, o0),
            100.0 * budget_cost(&base, cfg, base.recompute, base.B, base.zero_stage, o1), fixed_r);
    *tc = best;
    return 1;
}

/* The peak of tc at micro-batch B (-d as given, or one micro-batch per rank); 0 when B does
 * not keep a given -d exact. */
static size_t peak_at_batch(const TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s, long long B) {
    const long long P = tc->num_processes, micro = B * tc->T * P;
    if (B < 1 || micro > INT32_MAX || (tc->total_batch && tc->total_batch % micro != 0)) return 0;
    TrainConfig c = *tc;
    c.B = (int)B;
    c.total_batch = tc->total_batch ? tc->total_batch : micro;
    return budget_peak(&c, cfg, s);
}

int budget_max_batch(const TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *s, size_t budget, size_t *peak,
                     int *next_batch, size_t *next) {
    const long long TP = (long long)tc->T * tc->num_processes, limit = INT32_MAX / TP;
    long long best = 0, above = 0; /* above: the next candidate larger than best (0: none) */
    if (tc->total_batch) { /* the divisors of -d / (T * P), from the top */
        for (long long b = tc->total_batch % TP ? 0 : tc->total_batch / TP; b >= 1 && !best; b--) {
            if (!peak_at_batch(tc, cfg, s, b)) continue; /* not a divisor */
            if (peak_at_batch(tc, cfg, s, b) <= budget) best = b;
            else above = b;
        }
    } else { /* the peak grows with B: double, then bisect */
        long long lo = 0, hi = 1;
        while (hi <= limit && peak_at_batch(tc, cfg, s, hi) <= budget) lo = hi, hi *= 2;
        if (hi > limit + 1) hi = limit + 1;
        while (hi - lo > 1) {
            long long mid = lo + (hi - lo) / 2;
            if (peak_at_batch(tc, cfg, s, mid) <= budget) lo = mid;
            else hi = mid;
        }
        best = lo;
        above = best < limit ? best + 1 : 0;
    }
    if (peak) *peak = best ? peak_at_batch(tc, cfg, s, best) : 0;
    if (next_batch) *next_batch = (int)above;
    if (next) *next = above ? peak_at_batch(tc, cfg, s, above) : 0;
    return (int)best;
}

int budget_plan_main(TrainConfig *tc, const BudgetSpace *s) {
    ModelConfig cfg;
    train_plan_model_config(tc, &cfg);
    return budget_plan_main_for(tc, s, &cfg);
}

int budget_plan_main_for(TrainConfig *tc, const BudgetSpace *s, const ModelConfig *cfg) {
    size_t budget = cli_memory_budget_bytes(tc->memory_budget);
    FILE *note = tc->json ? stderr : stdout;
    if (tc->max_batch) {
        const long long TP = (long long)tc->T * tc->num_processes;
        if (tc->total_batch && tc->total_batch % TP != 0) /* no -b at all keeps it exact: say so, not "too big" */
            llmc_die("--max-batch: -d %lld is not a multiple of -t * processes = %d * %d = %lld tokens, so no -b "
                     "keeps it exact; give a -d that is (e.g. %lld), or leave -d out",
                     tc->total_batch, tc->T, tc->num_processes, TP, (tc->total_batch / TP + 1) * TP);
        size_t peak, next;
        int next_b;
        int B = budget_max_batch(tc, cfg, s, budget, &peak, &next_b, &next);
        if (!B)
            llmc_die("--memory-budget %s: not even -b 1 fits at -t %d, -r %d, -z %d (it needs %.3f GiB)",
                     budget_text(budget).s, tc->T, tc->recompute, tc->zero_stage, gib(next));
        char after[160];
        if (next_b)
            snprintf(after, sizeof after, "-b %d needs %.3f GiB", next_b, gib(next));
        else if (tc->total_batch)
            snprintf(after, sizeof after, "no larger -b keeps -d %lld exact", tc->total_batch);
        else
            snprintf(after, sizeof after, "no larger -b: B * T * processes must stay below 2^31 tokens");
        if (tc->json)
            printf("{\"max_batch\": %d, \"peak_bytes\": %zu, \"next_batch\": %d, \"next_peak_bytes\": %zu, "
                   "\"budget_bytes\": %zu, \"overhead_bytes\": %zu}\n", B, peak, next_b, next, budget, s->overhead);
        else
            printf("max batch: -b %d fits --memory-budget %s at -t %d, -r %d, -z %d (peak %.3f GiB; %s)\n",
                   B, budget_text(budget).s, tc->T, tc->recompute, tc->zero_stage, gib(peak), after);
        return 0;
    }
    budget_fit(tc, cfg, s, budget, "--memory-budget", note);
    MemPlan p;
    train_memory_plan(tc, cfg, s->plan, s->host_optimizer || offloaded(tc), s->device, &p);
    if (tc->json) mem_plan_print_json(&p, stdout);
    else mem_plan_print(&p, stdout);
    return 0;
}

void budget_agree(Dist *d, TrainConfig *tc) {
    long long knobs[5] = {tc->B, tc->recompute, tc->zero_stage, tc->total_batch, offloaded(tc)};
    dist_bcast_bytes(d, knobs, sizeof knobs);
    tc->B = (int)knobs[0], tc->recompute = (int)knobs[1], tc->zero_stage = (int)knobs[2], tc->total_batch = knobs[3];
    snprintf(tc->offload, sizeof tc->offload, "%s", knobs[4] ? "optimizer" : "none");
}
