/*
 * train_gpt.c - the CPU trainer (./train_gpt_cpu): the reference implementation of the math.
 * Parse flags -> build the model -> hand the CPU backend to the shared training loop.
 * Everything that is not a CPU op (flags, files, data, schedule, logging, checkpoints) is in
 * llmc/ and shared with the CUDA trainer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/train/budget.h"
#include "llmc/core/check.h"
#include "llmc/train/cli.h"
#include "llmc/cpu/blas_select.h"
#include "llmc/cpu/llama.h"
#include "llmc/cpu/gpt2.h"
#include "llmc/dist/dist.h"
#include "llmc/formats/arch.h"
#include "llmc/train/optim.h"
#include "llmc/train/train.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

/* ---- the CPU backend: thin adapters from TrainBackend to llmc/cpu/gpt2.h ---------------- */
static float cpu_train_micro_step(void *m, const int *inputs, const int *targets, int B, int T, float dloss_scale) {
    GPT2 *model = (GPT2 *)m;
    float loss = gpt2_forward(model, inputs, targets, B, T, dloss_scale / (float)(B * T));
    gpt2_backward(model, inputs, B, T);
    return loss;
}

static float cpu_eval_loss(void *m, const int *inputs, const int *targets, int B, int T) {
    return gpt2_forward((GPT2 *)m, inputs, targets, B, T, 0.0f);
}

static void cpu_zero_grad(void *m) { gpt2_zero_grad((GPT2 *)m); }

static const float *cpu_next_logits(void *m, const int *tokens, int n) {
    GPT2 *model = (GPT2 *)m;
    gpt2_forward(model, tokens, NULL, 1, n, 0.0f);
    return model->acts.logits + (size_t)(n - 1) * model->cfg.padded_vocab_size;
}

static void cpu_sync_noop(void *m) { (void)m; }
static void cpu_print_memory(void *m, FILE *out) { gpt2_print_memory((GPT2 *)m, out); }

/* -z 2/3 shard the model's gradients (and parameters) when it trains (-x 0 only evaluates) */
static int shard_stage(const TrainConfig *tc) { return tc->zero_stage >= 2 && tc->max_steps != 0 ? tc->zero_stage : 0; }

static void cpu_plan(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p) {
    gpt2_plan(cfg, tc->B, tc->T, tc->recompute, 1, p);
    if (shard_stage(tc)) gpt2_plan_shard(cfg, tc->zero_stage, tc->num_processes, tc->process_rank, p);
}

/* ZeRO-2/3: the model's buckets go to (and come from) the loop's optimizer; params: the model's
 * parameter arena (-z 3: its shard), read when a gather starts */
typedef struct {
    float *const *params;
    Optimizer *opt;
} CpuShard;
static void cpu_reduce_bucket(void *ctx, float *packed, const Bucket *b) {
    optim_reduce_bucket(((CpuShard *)ctx)->opt, packed, b);
}
static void cpu_gather_begin(void *ctx, float *packed, const Bucket *b, int slot) {
    CpuShard *s = (CpuShard *)ctx;
    optim_gather_bucket_begin(s->opt, *s->params, packed, b, slot);
}
static void cpu_gather_end(void *ctx, int slot) { optim_gather_bucket_end(((CpuShard *)ctx)->opt, slot); }

static CpuShardHooks shard_hooks(float *const *params, Optimizer *opt) {
    static CpuShard shard;
    shard.params = params;
    shard.opt = opt;
    return (CpuShardHooks){&shard, cpu_reduce_bucket, cpu_gather_begin, cpu_gather_end};
}

static void cpu_attach_optimizer(void *m, Optimizer *opt, float **host_params, float **host_grads) {
    GPT2 *model = (GPT2 *)m;
    gpt2_shard(model, opt->zero, opt->dist->size, opt->dist->rank, shard_hooks(&model->params_memory, opt));
    *host_params = model->params_memory;
    *host_grads = model->grads_memory;
}

/* ---- the Llama backend: the same adapters over llmc/cpu/llama.h ---------------------------- */
static float llama_train_micro_step(void *m, const int *inputs, const int *targets, int B, int T, float dloss_scale) {
    LlamaModel *model = (LlamaModel *)m;
    float loss = llama_forward(model, inputs, targets, B, T, dloss_scale / (float)(B * T));
    llama_backward(model, inputs, B, T);
    return loss;
}

static float llama_eval_loss(void *m, const int *inputs, const int *targets, int B, int T) {
    return llama_forward((LlamaModel *)m, inputs, targets, B, T, 0.0f);
}

static void llama_zero(void *m) { llama_zero_grad((LlamaModel *)m); }

static const float *llama_next_logits(void *m, const int *tokens, int n) {
    LlamaModel *model = (LlamaModel *)m;
    llama_forward(model, tokens, NULL, 1, n, 0.0f);
    return tensor_layer(model->acts_memory, &model->act_specs[LLAMA3_A_logits], 0) +
           (size_t)(n - 1) * model->cfg.base.padded_vocab_size;
}

static void llama_memory(void *m, FILE *out) { llama_print_memory((LlamaModel *)m, out); }

static void llama_attach_optimizer(void *m, Optimizer *opt, float **host_params, float **host_grads) {
    LlamaModel *model = (LlamaModel *)m;
    llama_shard(model, opt->zero, opt->dist->size, opt->dist->rank, shard_hooks(&model->params_memory, opt));
    *host_params = model->params_memory;
    *host_grads = model->grads_memory;
}

/* the architecture -e names, with its config: what a TrainPlanFn (which sees only the
 * ModelConfig) and the backend read */
static ArchConfig run_arch;

static void llama_cpu_plan(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p) {
    (void)cfg;
    const LlamaConfig *lc = arch_config_as(&run_arch, const LlamaConfig);
    llama_plan(lc, tc->B, tc->T, 1, p);
    if (shard_stage(tc)) llama_plan_shard(lc, tc->zero_stage, tc->num_processes, tc->process_rank, p);
}

/* -r: the CPU Llama keeps every activation; the run (and its plan and budget search) is -r 0 */
static void llama_no_recompute(TrainConfig *tc) {
    if (tc->recompute != 0) /* (--plan --json: stdout is the JSON) */
        fprintf(tc->plan && tc->json ? stderr : stdout,
                "note: -r %d: the CPU Llama keeps every activation (no recompute levels yet); running -r 0\n", tc->recompute);
    tc->recompute = 0;
}

/* A CPU model's adapters (the TrainBackend entries that differ by architecture). */
typedef struct {
    float (*train_micro_step)(void *model, const int *inputs, const int *targets, int B, int T, float dloss_scale);
    float (*eval_loss)(void *model, const int *inputs, const int *targets, int B, int T);
    void (*zero_grad)(void *model);
    const float *(*next_logits)(void *model, const int *tokens, int n);
    void (*attach_optimizer)(void *model, Optimizer *opt, float **host_params, float **host_grads);
    void (*print_memory)(void *model, FILE *out);
    TrainPlanFn plan;
} CpuModelOps;

static const CpuModelOps gpt2_ops = {cpu_train_micro_step, cpu_eval_loss, cpu_zero_grad, cpu_next_logits,
                                     cpu_attach_optimizer, cpu_print_memory, cpu_plan};
static const CpuModelOps llama_ops = {llama_train_micro_step, llama_eval_loss, llama_zero, llama_next_logits,
                                      llama_attach_optimizer, llama_memory, llama_cpu_plan};

/* Every CPU model's parameters and gradients live in host memory and the loop's optimizer
 * (llmc/train/optim.c) updates them; ops are its adapters. */
static void host_backend(TrainBackend *be, void *model, const ModelConfig *cfg, size_t n, float *params, float *grads,
                         const TensorSpec *specs, const CpuModelOps *ops, const TrainConfig *tc) {
    be->model = model;
    be->cfg = *cfg;
    be->num_parameters = n;
    be->host_params = params;
    be->host_grads = grads;
    be->param_specs = specs;
    be->train_micro_step = ops->train_micro_step;
    be->eval_loss = ops->eval_loss;
    be->zero_grad = ops->zero_grad;
    be->next_logits = ops->next_logits;
    if (shard_stage(tc)) be->attach_optimizer = ops->attach_optimizer;
    be->print_memory = ops->print_memory;
    be->plan = ops->plan;
}

static void budget_fit_run(TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *space, Dist *dist) {
    if (!tc->memory_budget[0]) return;
    budget_fit(tc, cfg, space, cli_memory_budget_bytes(tc->memory_budget), "--memory-budget", dist->rank == 0 ? stdout : NULL);
    budget_agree(dist, tc);
}

/* Build (parameters from init), allocate, train, free: one per architecture. */
static int gpt2_run(TrainConfig *tc, const char *init, const BudgetSpace *space, Dist *dist, TrainBackend *be, int resume_step) {
    GPT2 model;
    gpt2_build(&model, arch_config_base(&run_arch));
    run_arch.arch->load_init(init, &run_arch, model.params_memory, model.num_parameters, tc->seed);
    budget_fit_run(tc, &model.cfg, space, dist);
    gpt2_allocate(&model, tc->B, tc->T, tc->recompute, 1);
    host_backend(be, &model, &model.cfg, model.num_parameters, model.params_memory, model.grads_memory, model.param_specs,
                 &gpt2_ops, tc);
    int status = train_run(tc, be, resume_step);
    gpt2_free(&model);
    return status;
}

static int llama_run(TrainConfig *tc, const char *init, const BudgetSpace *space, Dist *dist, TrainBackend *be, int resume_step) {
    budget_fit_run(tc, arch_config_base(&run_arch), space, dist);
    LlamaModel llama;
    llama_build(&llama, arch_config_as(&run_arch, const LlamaConfig));
    run_arch.arch->load_init(init, &run_arch, llama.params_memory, llama.num_parameters, tc->seed);
    llama_allocate_for(&llama, tc->B, tc->T, 1);
    host_backend(be, &llama, &llama.cfg.base, llama.num_parameters, llama.params_memory, llama.grads_memory,
                 llama.param_specs, &llama_ops, tc);
    int status = train_run(tc, be, resume_step);
    llama_free(&llama);
    return status;
}

/* The CPU backend's entry for each architecture (formats/arch.h's registry): its plan, the
 * flags its block sequence fixes, what --memory-budget may search, and its run. */
typedef struct {
    const ModelArch *arch;
    TrainPlanFn plan;
    void (*fix_flags)(TrainConfig *tc); /* NULL: none */
    int max_recompute;                  /* the budget search's -r range */
    const char *no_recompute;           /* why it has none (NULL: it has) */
    int (*run)(TrainConfig *tc, const char *init, const BudgetSpace *space, Dist *dist, TrainBackend *be, int resume_step);
} CpuArch;

static const CpuArch cpu_archs[] = {
    {&gpt2_arch, cpu_plan, NULL, 2, NULL, gpt2_run},
    {&llama3_arch, llama_cpu_plan, llama_no_recompute, 0, "the CPU Llama keeps every activation (no recompute levels)",
     llama_run},
};

/* The CPU entry of init's architecture (run_arch filled); dies when the CPU has none. */
static const CpuArch *cpu_arch_for_init(const char *init, TrainConfig *tc, BudgetSpace *space) {
    const ModelArch *arch = model_arch_for_init(init, &run_arch);
    for (size_t i = 0; i < sizeof cpu_archs / sizeof cpu_archs[0]; i++) {
        const CpuArch *a = &cpu_archs[i];
        if (a->arch != arch) continue;
        if (a->fix_flags) a->fix_flags(tc);
        *space = (BudgetSpace){a->plan, 1, "CPU", a->max_recompute, OPTIM_MAX_ZERO, 0, mem_process_start_rss(), a->no_recompute};
        return a;
    }
    llmc_die("-e %s is a %s model: the CPU trainer has no block sequence for it", init, arch->display);
}

int main(int argc, char **argv) {
    char blas[320]; /* first: may re-execute the program with better OpenBLAS kernels */
    blas_choose_kernels(argv, blas, sizeof blas);
    setvbuf(stdout, NULL, _IOLBF, 0); /* every line reaches a pipe or a log file as it is printed */
    TrainConfig tc;
    train_config_defaults(&tc);
    snprintf(tc.precision, sizeof tc.precision, "fp32");
    train_config_parse(&tc, argc, argv, "train_gpt_cpu");
    if (strcmp(tc.precision, "fp32") != 0)
        llmc_die("--precision %s: the CPU trainer computes in fp32 only (use ./train_gpt for bf16/fp16)", tc.precision);
    if (tc.recompute > 2) llmc_die("-r %d: recompute level 3 (whole block) is GPU-only; the CPU takes 0, 1 or 2", tc.recompute);
    BudgetSpace space; /* --memory-budget prices candidates with the plan; the process's VmRSS at start counts too */
    /* --plan: before any process group, run directory or model (-pn gives the rank count); the
     * model's header or name only */
    if (tc.plan) {
        const CpuArch *a = cpu_arch_for_init(tc.init, &tc, &space);
        if (tc.memory_budget[0]) return budget_plan_main_for(&tc, &space, arch_config_base(&run_arch));
        MemPlan p;
        train_memory_plan(&tc, arch_config_base(&run_arch), a->plan, 1, "CPU", &p);
        if (tc.json) mem_plan_print_json(&p, stdout);
        else mem_plan_print(&p, stdout);
        return 0;
    }
    /* the process group: mpirun/srun ranks (a build with MPI), or one process */
    const DistFlags dist_flags = train_config_dist_flags(&tc);
    Dist *dist = dist_init(&argc, &argv, &dist_flags, 1);
    tc.num_processes = dist->size;
    tc.process_rank = dist->rank;
    if (tc.gpu_log_every > 0)
        printf("note: -lg %d: the CPU trainer has no GPU telemetry; continuing without it\n", tc.gpu_log_every);

    int threads = 1;
#ifdef _OPENMP
    if (tc.threads > 0) omp_set_num_threads(tc.threads);
    threads = omp_get_max_threads();
#endif
#if LLMC_USE_OPENBLAS
    openblas_set_num_threads(threads);
#endif
    tc.threads = threads; /* logged and saved as used */

    char init[1100];
    int resume_step = train_resolve_init(&tc, init, sizeof init);
    const CpuArch *a = cpu_arch_for_init(init, &tc, &space); /* the architecture is the model's: name or file header */
    char name[512];
    snprintf(name, sizeof name, "CPU fp32, %s, %d thread%s", blas, threads, threads == 1 ? "" : "s");
    TrainBackend be = {0};
    be.name = name;
    be.sync_to_host = cpu_sync_noop;
    be.sync_from_host = cpu_sync_noop;
    be.arch = &run_arch;
    int status = a->run(&tc, init, &space, dist, &be, resume_step);
    dist_finalize(dist);
    return status;
}
