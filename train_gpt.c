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
#include "llmc/formats/hf.h"
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

static uint32_t llama_save_model(void *m, const float *params, const char *path, int bf16) {
    LlamaModel *model = (LlamaModel *)m;
    return llama_checkpoint_write(path, &model->cfg, params, model->num_parameters, bf16);
}

static const char *llama_source; /* the run's -e: --save-hf copies its tokenizer files (an HF directory) */
static void llama_save_hf(void *m, const float *params, const char *run_dir, int step, int bf16) {
    LlamaModel *model = (LlamaModel *)m;
    hf_llama_save_checkpoint(run_dir, step, &model->cfg, params, model->num_parameters, bf16, llama_source);
}

/* the Llama whose plan --plan prints (a TrainPlanFn sees only the ModelConfig) */
static LlamaConfig plan_llama;
static void llama_cpu_plan(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p) {
    (void)cfg;
    llama_plan(&plan_llama, tc->B, tc->T, 1, p);
    if (shard_stage(tc)) llama_plan_shard(&plan_llama, tc->zero_stage, tc->num_processes, tc->process_rank, p);
}

/* -r: the CPU Llama keeps every activation; the run (and its plan and budget search) is -r 0 */
static void llama_no_recompute(TrainConfig *tc) {
    if (tc->recompute != 0) /* (--plan --json: stdout is the JSON) */
        fprintf(tc->plan && tc->json ? stderr : stdout,
                "note: -r %d: the CPU Llama keeps every activation (no recompute levels yet); running -r 0\n", tc->recompute);
    tc->recompute = 0;
}

static void llama_backend(TrainBackend *be, LlamaModel *model, const TrainConfig *tc) {
    be->model = model;
    be->cfg = model->cfg.base;
    be->num_parameters = model->num_parameters;
    be->train_micro_step = llama_train_micro_step;
    be->eval_loss = llama_eval_loss;
    be->zero_grad = llama_zero;
    be->next_logits = llama_next_logits;
    be->host_params = model->params_memory;
    be->host_grads = model->grads_memory;
    be->param_specs = model->param_specs;
    be->num_param_specs = LLAMA3_NUM_PARAMETERS;
    if (shard_stage(tc)) be->attach_optimizer = llama_attach_optimizer;
    be->print_memory = llama_memory;
    be->plan = llama_cpu_plan;
    be->save_model = llama_save_model;
    be->save_hf = llama_save_hf;
    be->flops_per_token = llama_flops_per_token(&model->cfg, tc->T);
}

static void build_model(GPT2 *model, const char *init, unsigned long long seed) {
    ModelConfig cfg;
    if (model_config_from_descriptor(&cfg, init) == 0) gpt2_build_random(model, &cfg, seed);
    else gpt2_build_from_checkpoint(model, init);
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
    /* --memory-budget prices candidates with the plan; the process's VmRSS at start counts too */
    const BudgetSpace space = {cpu_plan, 1, "CPU", 2, OPTIM_MAX_ZERO, 0, mem_process_start_rss(), NULL};
    /* a Llama's: no recompute levels on the CPU (the search skips that knob) */
    const BudgetSpace llama_space = {llama_cpu_plan, 1, "CPU", 0, OPTIM_MAX_ZERO, 0, mem_process_start_rss(),
                                     "the CPU Llama keeps every activation (no recompute levels)"};
    /* --plan: before any process group, run directory or model (-pn gives the rank count) */
    if (tc.plan && llama_config_from_init(tc.init, &plan_llama)) { /* a Llama: its header or name only */
        llama_no_recompute(&tc);
        if (tc.memory_budget[0]) return budget_plan_main_for(&tc, &llama_space, &plan_llama.base);
        MemPlan p;
        train_memory_plan(&tc, &plan_llama.base, llama_cpu_plan, 1, "CPU", &p);
        if (tc.json) mem_plan_print_json(&p, stdout);
        else mem_plan_print(&p, stdout);
        return 0;
    }
    if (tc.plan) return tc.memory_budget[0] ? budget_plan_main(&tc, &space) : train_plan_main(&tc, cpu_plan, 1, "CPU");
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
    char name[512];
    snprintf(name, sizeof name, "CPU fp32, %s, %d thread%s", blas, threads, threads == 1 ? "" : "s");
    TrainBackend be = {0};
    be.name = name;
    be.sync_to_host = cpu_sync_noop;
    be.sync_from_host = cpu_sync_noop;
    if (llama_config_from_init(init, &plan_llama)) { /* the architecture is the model's: name or file header */
        llama_no_recompute(&tc);
        if (tc.memory_budget[0]) {
            budget_fit(&tc, &plan_llama.base, &llama_space, cli_memory_budget_bytes(tc.memory_budget), "--memory-budget",
                       dist->rank == 0 ? stdout : NULL);
            budget_agree(dist, &tc);
        }
        LlamaModel llama;
        llama_build(&llama, &plan_llama);
        llama_load_init(init, &plan_llama, llama.params_memory, llama.num_parameters, tc.seed);
        llama_allocate_for(&llama, tc.B, tc.T, 1);
        llama_backend(&be, &llama, &tc);
        llama_source = tc.init;
        int status = train_run(&tc, &be, resume_step);
        llama_free(&llama);
        dist_finalize(dist);
        return status;
    }
    GPT2 model;
    build_model(&model, init, tc.seed);
    if (tc.memory_budget[0]) {
        budget_fit(&tc, &model.cfg, &space, cli_memory_budget_bytes(tc.memory_budget), "--memory-budget", dist->rank == 0 ? stdout : NULL);
        budget_agree(dist, &tc);
    }
    gpt2_allocate(&model, tc.B, tc.T, tc.recompute, 1);

    be.model = &model;
    be.cfg = model.cfg;
    be.num_parameters = model.num_parameters;
    be.train_micro_step = cpu_train_micro_step;
    be.eval_loss = cpu_eval_loss;
    be.zero_grad = cpu_zero_grad;
    be.next_logits = cpu_next_logits;
    be.host_params = model.params_memory;
    be.host_grads = model.grads_memory; /* the loop's optimizer (llmc/train/optim.c) does the rest */
    be.param_specs = model.param_specs;
    if (shard_stage(&tc)) be.attach_optimizer = cpu_attach_optimizer;
    be.print_memory = cpu_print_memory;
    be.plan = cpu_plan;

    int status = train_run(&tc, &be, resume_step);
    gpt2_free(&model);
    dist_finalize(dist);
    return status;
}
