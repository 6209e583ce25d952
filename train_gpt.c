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
#include "llmc/cpu/arch.h"
#include "llmc/cpu/teacher.h"
#include "llmc/cpu/lora.h"
#include "llmc/cpu/mixtral.h"
#include "llmc/cpu/moe_ep.h"
#include "llmc/cpu/qbase.h"
#include "llmc/core/sumfile.h"
#include "llmc/formats/adapter.h"
#include "llmc/formats/rundir.h"
#include "llmc/dist/dist.h"
#include "llmc/dist/layout.h"
#include "llmc/formats/arch.h"
#include "llmc/train/lora.h"
#include "llmc/train/optim.h"
#include "llmc/train/train.h"
#include "llmc/train/tp.h"
#include "llmc/train/epopt.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if LLMC_USE_OPENBLAS
#include <cblas.h>
#endif

/* ---- the CPU backend: one set of TrainBackend adapters over llmc/cpu/arch.h's table -------- */
/* the architecture -e names, with its config, and its CPU entry: what a TrainPlanFn (which sees
 * only the ModelConfig) and the backend read */
static ArchConfig run_arch;
static const CpuArch *run_cpu;

/* be->model: the built model and its entry */
typedef struct {
    const CpuArch *a;
    void *model;
} CpuRun;

static void lora_dump_grads(void); /* (LoRA, below) */

/* ---- knowledge distillation (--teacher, llmc/cpu/teacher.h): a frozen teacher run forward only ---- */
static Teacher run_teacher;
static int use_teacher; /* (the teacher is loaded: the run trains with it) */

/* the teacher runs when the run trains (-x 0 evaluates the student's cross-entropy alone) */
static int teacher_wanted(const TrainConfig *tc) { return tc->teacher[0] && tc->max_steps != 0; }
static int use_teacher_flags(const TrainConfig *tc) { return teacher_wanted(tc); }

/* run_teacher for tc, checked against the student run_arch (-e tc->init) */
static void teacher_for(const TrainConfig *tc) {
    /* (a Mixtral student's objective adds the load-balancing loss, whose gradient its forward with
     * targets prepares: the distillation forward has none yet) */
    if (run_arch.arch == &mixtral_arch)
        llmc_die("--teacher with a Mixtral student (-e %s) is not built yet: its load-balancing loss is not part "
                 "of the distillation objective; distill into a dense student", tc->init);
    teacher_resolve(&run_teacher, tc->teacher, tc->distill_alpha, tc->distill_temperature, &run_arch, tc->init, tc->T);
}

/* ---- MoE expert parallelism (-ep N, issue 24 item 5): llmc/cpu/moe_ep.h (the exchange and the
 * rank layout), llmc/train/epopt.h (the optimizer and the whole-model checkpoints) ---- */
static MoeEp run_ep;
static EpAdamW run_ep_opt;
static int ep_ways(const TrainConfig *tc) { return tc->expert_parallel > 1 ? tc->expert_parallel : 1; }
static const MixtralConfig *ep_cfg(void) { return arch_config_as(&run_arch, const MixtralConfig); }

/* -ep's checks that need the model (run_arch) and the process count (d: the group, or NULL for --plan's -pn) */
static void ep_check(const TrainConfig *tc, Dist *d) {
    const int n = ep_ways(tc), ranks = d ? d->size : tc->num_processes;
    if (n == 1) return;
    if (run_arch.arch != &mixtral_arch)
        llmc_die("-ep %d: expert parallelism splits the experts of a mixture-of-experts model over ranks; -e %s is a "
                 "dense %s model (no experts): drop -ep", n, tc->init, run_arch.arch->display);
    const int E = ep_cfg()->num_experts;
    if (E % n != 0)
        llmc_die("-ep %d: the %d experts of -e %s do not split evenly over %d ranks (experts %% -ep must be 0; e.g. -ep %d)",
                 n, E, tc->init, n, E % 2 == 0 && n > 2 ? 2 : 1);
    if (ranks == 1)
        llmc_die("-ep %d with one process: expert parallelism needs -ep %d ranks or a multiple of them (e.g. mpirun -np %d "
                 "./train_gpt_cpu -ep %d ...); with one process drop -ep", n, n, n, n);
    if (ranks % n != 0)
        llmc_die("-ep %d does not divide the %d processes: the ranks form groups of %d (one per expert shard), so the "
                 "process count must be a multiple of %d", n, ranks, n, n);
    if (!d) return;
    uint64_t *all = (uint64_t *)mallocCheck((size_t)ranks * sizeof(uint64_t), "-ep of the ranks");
    dist_allgather_u64(d, (uint64_t)n, all);
    for (int r = 0; r < ranks; r++)
        if (all[r] != (uint64_t)n) llmc_die("-ep %d on rank %d but -ep %llu on rank %d: every rank needs the same -ep", n, d->rank, (unsigned long long)all[r], r);
    free(all);
}

/* every rank runs the sampling forward (its experts are needed); rank 0's logits are the ones sampled */
static const float *ep_share_logits(const float *row) {
    dist_bcast_bytes(dist_world(), (void *)row, (size_t)arch_config_base(&run_arch)->padded_vocab_size * sizeof(float));
    return row;
}

static void cpu_loss_parts(void *r, double parts[2]) {
    (void)r;
    parts[0] = run_teacher.ce_sum;
    parts[1] = run_teacher.kd_sum;
}

/* ---- prompt tuning (--prompt-tokens, llmc/cpu/lora.h): the model runs P + T positions ---------------- */
static int run_prompt;             /* P (0: none) */
static int *prompt_inputs, *prompt_targets; /* (B, P + T): the batch with the P soft-token positions in front */
static size_t prompt_ints;
static const LoraConfig *prompt_cfg(void);
static size_t prompt_plan_bytes(int B, int T) { return 2 * (size_t)B * (size_t)(run_prompt + T) * sizeof(int); }
static void prompt_allocate(int B, int T) {
    prompt_ints = prompt_plan_bytes(B, T) / sizeof(int);
    prompt_inputs = (int *)mem_calloc(MEM_ACTIVATIONS, prompt_ints, sizeof(int), "prompt tuning's batch");
    prompt_targets = prompt_inputs + prompt_ints / 2;
}
/* forward (and backward when dloss != 0) over the prompt and the batch; the loss over the batch's positions */
static float prompt_step(CpuRun *run, const int *inputs, const int *targets, int B, int T, float dloss, float *losses) {
    const int W = run_prompt + T, Vp = run->a->parts(run->model).cfg->padded_vocab_size;
    lora_prompt_inputs(prompt_cfg(), inputs, targets, B, T, prompt_inputs, prompt_targets);
    run->a->forward(run->model, prompt_inputs, targets ? prompt_targets : NULL, B, W, dloss);
    if (!targets) return 0.0f;
    const float *all = run->a->losses(run->model);
    float loss = lora_prompt_mask(prompt_cfg(), all, dloss != 0.0f ? (float *)run->a->logits(run->model) : NULL, B, T, Vp);
    for (int b = 0; losses && b < B; b++) memcpy(losses + (size_t)b * T, all + (size_t)b * W + run_prompt, (size_t)T * sizeof(float));
    if (dloss != 0.0f) run->a->backward(run->model, prompt_inputs, B, W);
    return loss;
}

static float cpu_train_micro_step(void *r, const int *inputs, const int *targets, int B, int T, float dloss_scale) {
    CpuRun *run = (CpuRun *)r;
    const float dloss = dloss_scale / (float)(B * T);
    if (run_prompt) {
        float loss = prompt_step(run, inputs, targets, B, T, dloss, NULL);
        lora_dump_grads();
        return loss;
    }
    float loss = use_teacher ? teacher_distill_forward(&run_teacher, run->a, run->model, inputs, targets, B, T, dloss)
                             : run->a->forward(run->model, inputs, targets, B, T, dloss);
    run->a->backward(run->model, inputs, B, T);
    lora_dump_grads();
    return loss;
}

static float cpu_eval_loss(void *r, const int *inputs, const int *targets, int B, int T) {
    CpuRun *run = (CpuRun *)r;
    if (run_prompt) return prompt_step(run, inputs, targets, B, T, 0.0f, NULL);
    return run->a->forward(run->model, inputs, targets, B, T, 0.0f);
}

static void cpu_eval_losses(void *r, const int *inputs, const int *targets, int B, int T, float *losses) {
    CpuRun *run = (CpuRun *)r;
    if (run_prompt) {
        prompt_step(run, inputs, targets, B, T, 0.0f, losses);
        return;
    }
    run->a->forward(run->model, inputs, targets, B, T, 0.0f);
    memcpy(losses, run->a->losses(run->model), (size_t)B * T * sizeof(float));
}

/* ---- LoRA (llmc/cpu/lora.h): adapters on a frozen base ---------------------------------------- */
/* The run's adapters: their table (from the flags, or --adapter's / the resumed checkpoint's
 * adapter_config.json), arenas, and the base's CRC (of its fp32 parameters as loaded). */
static LoraRun run_lora;
static LoraConfig run_lora_cfg;
static int use_lora;
static const LoraConfig *prompt_cfg(void) { return &run_lora_cfg; }
static uint32_t run_base_crc;
static char run_base_name[1100];

/* QLoRA (--quantize-base, llmc/cpu/qbase.h): the base's block weights held quantised; run_held_crc: the
 * CRC of what the run holds of the base after quantising (the fp32 arena and the codes), checked at
 * every checkpoint as run_base_crc is without it */
static QBase run_qbase;
static int use_qbase;
static uint32_t run_held_crc;
static char run_quantize_name[16]; /* qbase_file_name: what each adapter records */

/* the adapter files' name of the run's quantised base: "nf4", "nf4+dq", "int8" ("" = fp32) */
static const char *qbase_file_name(const TrainConfig *tc) {
    if (!tc->quantize_base[0]) return "";
    return tc->double_quant ? "nf4+dq" : tc->quantize_base;
}

/* run_lora_cfg for tc on the model (the flags, or from_dir's adapter_config.json). */
static void lora_config_for(const TrainConfig *tc, const char *from_dir) {
    lora_resolve_config(tc, run_cpu->lora_family, run_arch.arch->display, arch_config_base(&run_arch), from_dir, &run_lora_cfg);
}

/* The quantised base's line: the codes in place of the fp32 block weights, and the scratch. */
static void qbase_print_memory(FILE *out) {
    const double MiB = 1048576.0;
    fprintf(out, "quantised base (%s): of the parameters above, the block linear weights' %.2f MiB fp32 are held as "
                 "%.2f MiB of codes and scales (%.2fx; their fp32 pages released), a %.2f MiB dequantisation panel; "
                 "embeddings, norms, biases and the head stay fp32\n",
            quant_name(run_qbase.mode, run_qbase.double_quant), run_qbase.fp32_bytes / MiB, run_qbase.storage_bytes / MiB,
            (double)run_qbase.storage_bytes / (double)run_qbase.fp32_bytes, run_qbase.panel_floats * sizeof(float) / MiB);
}

/* The adapter's line under the model's memory table: what trains and what is frozen. */
static void lora_print_memory(void *r, FILE *out) {
    if (!use_lora) return;
    if (use_qbase) qbase_print_memory(out);
    const LoraConfig *c = &run_lora_cfg;
    if (c->prompt_tokens) {
        fprintf(out, "prompt tuning: %d soft tokens x %d channels = %zu parameters (%.2f MiB) trained, gradients %.2f MiB; the "
                     "activations above are for the %d + -t positions of each sequence; the base's %zu parameters frozen (no "
                     "gradients, no AdamW state, no master copy)\n", c->prompt_tokens, c->token_dim, c->num_parameters,
                c->num_parameters * sizeof(float) / 1048576.0, run_lora.grads ? c->num_parameters * sizeof(float) / 1048576.0 : 0.0,
                c->prompt_tokens, ((CpuRun *)r)->a->parts(((CpuRun *)r)->model).num_parameters);
        return;
    }
    char names[512];
    lora_target_names(c, names, sizeof names);
    const double MiB = 1048576.0, bytes = (double)c->num_parameters * sizeof(float);
    size_t mags = 0;
    for (int i = 2 * c->num_modules; i < c->num_specs; i++) mags += c->specs[i].numel;
    char dora[96] = "";
    if (c->dora) snprintf(dora, sizeof dora, ", %zu of them magnitudes", mags);
    fprintf(out, "%s: r %d, alpha %g, scale %g%s, targets %s: %zu adapter parameters%s (%.2f MiB) trained, gradients %.2f "
                 "MiB, saved activations %.2f MiB; the base's %zu parameters frozen (no gradients, no AdamW state, no master copy)\n",
            c->dora ? "DoRA" : "LoRA", c->rank, (double)c->alpha, (double)c->scale, c->rslora ? " (rsLoRA)" : "", names,
            c->num_parameters, dora, bytes / MiB,
            run_lora.grads ? bytes / MiB : 0.0, run_lora.xa_floats * sizeof(float) / MiB,
            ((CpuRun *)r)->a->parts(((CpuRun *)r)->model).num_parameters);
}

/* the CRC-32 of the base's fp32 parameters, as the run holds them now */
static uint32_t base_crc_now(CpuRun *run) {
    CpuModelParts parts = run->a->parts(run->model);
    return sumfile_crc_update(0, *parts.params, parts.num_parameters * sizeof(float));
}

/* Each checkpoint records the base's CRC computed again: the base stays bit-identical through training. */
static uint32_t cpu_lora_save(void *r, const char *dir, int step, const float *params) {
    char path[4200];
    rundir_adapter_dir(dir, step, path, sizeof path);
    uint32_t crc = base_crc_now((CpuRun *)r) ^ (use_qbase ? qbase_crc_now(&run_qbase) : 0);
    if (crc != run_held_crc)
        llmc_die("internal: the frozen base model changed during training (crc32 %08x, %08x at the start); no adapter written",
                 (unsigned)crc, (unsigned)run_held_crc);
    return adapter_save_quant(path, &run_lora_cfg, params, run_base_crc, run_base_name, run_quantize_name);
}

/* LLMC_LORA_DUMP_GRADS=DIR (tests): the first micro-step's adapter gradients written as an adapter
 * directory (PEFT's keys and row order), to compare with a reference's. */
static void lora_dump_grads(void) {
    static int done;
    const char *dir = getenv("LLMC_LORA_DUMP_GRADS");
    if (done || !dir || !dir[0] || !use_lora || dist_world()->rank != 0) return;
    done = 1;
    adapter_save(dir, &run_lora_cfg, run_lora.grads, run_base_crc, "gradients (LLMC_LORA_DUMP_GRADS)");
}

static void cpu_lora_model_path(void *r, const char *dir, int step, int what, char *path, size_t len) {
    (void)r;
    char d[4200];
    rundir_adapter_dir(dir, step, d, sizeof d);
    if (what == 1) snprintf(path, len, "%s", d);
    else adapter_model_path(d, path, len);
}

/* --quantize-base's mode for the model of run_arch (and its adapters, run_lora_cfg); dies naming the flags:
 * a module NF4 cannot quantise, a DoRA adapter (its norms read the fp32 weights; --adapter's config too). */
static int qbase_flags_check(const TrainConfig *tc) {
    char err[512];
    const int mode = quant_parse(tc->quantize_base);
    if (qbase_check(mode, tc->double_quant, run_cpu->lora_family, arch_config_base(&run_arch), err, sizeof err) != 0)
        llmc_die("-e %s: %s", tc->init, err);
    if (run_lora_cfg.dora)
        llmc_die("--quantize-base %s with a DoRA adapter (%s): DoRA on a quantised base is not built yet (its row norms "
                 "read the fp32 weights)", tc->quantize_base, tc->adapter[0] ? tc->adapter : "--use-dora 1");
    return mode;
}

/* --quantize-base: the loaded base's block weights quantised (their fp32 pages released); -y 1: the
 * checkpoint's adapter must record the same quantisation (its steps ran on that base). */
static void qbase_attach(const TrainConfig *tc, CpuRun *run, const char *from, int resume_step) {
    char was[32];
    if (resume_step >= 0) {
        adapter_read_quantize_base(from, was, sizeof was);
        const char *hint = !was[0]                      ? "no --quantize-base"
                           : strcmp(was, "nf4+dq") == 0 ? "--quantize-base nf4 --double-quant 1"
                           : strcmp(was, "nf4") == 0    ? "--quantize-base nf4 --double-quant 0"
                           : strcmp(was, "int8") == 0   ? "--quantize-base int8"
                                                        : NULL;
        if (!hint)
            llmc_die("-y 1: the adapter of step %d (%s) records an unknown quantised base '%s' (llmc_quantize_base: nf4, "
                     "nf4+dq or int8)", resume_step, from, was);
        if (strcmp(was, qbase_file_name(tc)) != 0)
            llmc_die("-y 1: the adapter of step %d (%s) was trained on a %s base, this run asks for %s: resume with %s",
                     resume_step, from, was[0] ? was : "fp32", tc->quantize_base[0] ? qbase_file_name(tc) : "fp32 (no --quantize-base)",
                     hint);
    }
    snprintf(run_quantize_name, sizeof run_quantize_name, "%s", qbase_file_name(tc));
    if (!tc->quantize_base[0]) return;
    const int mode = qbase_flags_check(tc);
    CpuModelParts parts = run->a->parts(run->model);
    qbase_build(&run_qbase, mode, tc->double_quant, run_cpu->lora_family, arch_config_base(&run_arch), *parts.params,
                parts.specs, run_arch.arch->num_param_specs);
    run->a->set_qbase(run->model, &run_qbase);
    use_qbase = 1;
}

/* The adapters for the built model (its base parameters loaded): the table, A and B from the seed
 * or from the adapter directory (the resumed checkpoint's, else --adapter's), the base's CRC checked
 * against the one the directory records; the model's sites get them (its base is then frozen). */
static void lora_attach(const TrainConfig *tc, CpuRun *run, int resume_step) {
    char from[4200];
    lora_start_dir(tc, resume_step, from, sizeof from);
    lora_config_for(tc, from);
    run_base_crc = base_crc_now(run);
    snprintf(run_base_name, sizeof run_base_name, "%s", tc->init);
    lora_run_init(&run_lora, &run_lora_cfg, tc->seed);
    if (from[0]) lora_load_start(from, &run_lora_cfg, run_lora.params, run_base_crc, tc->init);
    CpuModelParts parts = run->a->parts(run->model); /* DoRA reads W and b; fresh magnitudes are W's row norms */
    lora_run_set_base(&run_lora, *parts.params, parts.specs, run_arch.arch->num_param_specs, !from[0]);
    run->a->set_lora(run->model, &run_lora);
    use_lora = 1;
    run_prompt = run_lora_cfg.prompt_tokens;
    if (run_prompt && use_teacher_flags(tc))
        llmc_die("--prompt-tokens with --teacher: distillation with prompt tuning is not built yet");
    if (run_prompt && tc->quantize_base[0])
        llmc_die("--quantize-base %s with prompt tuning (--prompt-tokens / a PROMPT_TUNING --adapter): not built yet; "
                 "QLoRA's quantised base is for LoRA adapters", tc->quantize_base);
    if (run_prompt && tc->tensor_parallel > 1) llmc_die("--prompt-tokens with -tp %d: not built for tensor parallelism", tc->tensor_parallel);
    qbase_attach(tc, run, from, resume_step);
    run_held_crc = base_crc_now(run) ^ (use_qbase ? qbase_crc_now(&run_qbase) : 0);
}

/* The plan's figures with adapters: the base's parameters plus the adapter's, gradients and AdamW
 * state for the adapter only (p->num_parameters: what trains), the saved A x per module and layer. */
static void lora_plan(const TrainConfig *tc, MemPlan *p) {
    const size_t n = run_lora_cfg.num_parameters;
    p->num_parameters = n;
    p->host[MEM_PARAMETERS] += n * sizeof(float);
    int training = p->host[MEM_GRADIENTS] != 0;
    p->host[MEM_GRADIENTS] = training ? n * sizeof(float) : 0;
    p->host[MEM_ACTIVATIONS] += lora_plan_activations(&run_lora_cfg, tc->B, tc->T, training);
    if (run_lora_cfg.prompt_tokens) { /* (the model's plan is for T + P positions: cpu_plan) */
        run_prompt = run_lora_cfg.prompt_tokens;
        p->host[MEM_ACTIVATIONS] += prompt_plan_bytes(tc->B, tc->T);
    }
    if (!tc->quantize_base[0]) return;
    size_t codes, fp32, panel; /* QLoRA: the codes in place of the block weights' fp32, and the panel */
    qbase_plan(qbase_flags_check(tc), tc->double_quant, run_cpu->lora_family, arch_config_base(&run_arch), &codes,
               &fp32, &panel);
    p->host[MEM_PARAMETERS] += codes - fp32;
    p->host[MEM_OP_SCRATCH] += panel;
}

/* --plan with --quantize-base: what the quantisation keeps, by part (the classes above hold it). */
static void qbase_plan_print(const TrainConfig *tc, FILE *out) {
    size_t codes, fp32, panel;
    const int mode = qbase_flags_check(tc);
    qbase_plan(mode, tc->double_quant, run_cpu->lora_family, arch_config_base(&run_arch), &codes, &fp32, &panel);
    fprintf(out, "  quantised base (--quantize-base %s): block linear weights %zu bytes fp32 -> %zu bytes of codes and "
                 "scales (in parameters), dequantisation panel %zu bytes (in op_scratch)\n",
            quant_name(mode, tc->double_quant), fp32, codes, panel);
}

static void cpu_zero_grad(void *r) {
    ((CpuRun *)r)->a->zero_grad(((CpuRun *)r)->model);
    teacher_clear_sums(&run_teacher);
    if (use_lora && run_lora.grads) memset(run_lora.grads, 0, run_lora_cfg.num_parameters * sizeof(float));
}

static const float *cpu_next_logits(void *r, const int *tokens, int n) {
    CpuRun *run = (CpuRun *)r;
    if (run_prompt) prompt_step(run, tokens, NULL, 1, n, 0.0f, NULL), n += run_prompt; /* (the row after the prompt) */
    else run->a->forward(run->model, tokens, NULL, 1, n, 0.0f);
    const int Vp = run->a->parts(run->model).cfg->padded_vocab_size, tp = train_tp_size();
    const float *row = run->a->logits(run->model) + (size_t)(n - 1) * (size_t)(Vp / tp); /* (-tp: this rank's columns) */
    if (tp > 1) return train_tp_logits_row(row, Vp);
    return run_ep.ways > 1 ? ep_share_logits(row) : row;
}

/* the architecture's own parts of a step (CpuArch.step_log: Mixtral's train_ce, train_aux and
 * routing statistics), after the loop's memory figures on the step line */
static void cpu_step_extras(void *r, double step_ms, double tokens_per_s, char *text, size_t len, Logger *lg) {
    (void)step_ms, (void)tokens_per_s;
    CpuRun *run = (CpuRun *)r;
    if (text) {
        int n = snprintf(text, len, " | mem %.2f GiB (peak %.2f)", mem_live_total(0) / 1073741824.0,
                         mem_peak_total(0) / 1073741824.0);
        if (n > 0 && (size_t)n < len) run->a->step_log(run->model, text + n, len - (size_t)n, NULL);
    }
    if (lg) run->a->step_log(run->model, NULL, 0, lg);
}

static void cpu_sync_noop(void *r) { (void)r; }
static void lora_print_memory(void *r, FILE *out);
static void cpu_print_memory(void *r, FILE *out) {
    ((CpuRun *)r)->a->print_memory(((CpuRun *)r)->model, out);
    lora_print_memory(r, out);
    if (use_teacher) teacher_print(&run_teacher, run_teacher.B, run_teacher.T, out);
}

/* -z 2/3 shard the model's gradients (and parameters) when it trains (-x 0 only evaluates) */
static int shard_stage(const TrainConfig *tc) { return tc->zero_stage >= 2 && tc->max_steps != 0 ? tc->zero_stage : 0; }

static void cpu_plan(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p) {
    (void)cfg; /* run_arch's base */
    const int T = tc->T + (lora_wanted(tc) ? run_lora_cfg.prompt_tokens : 0); /* prompt tuning: the P soft tokens' positions too */
    if (tc->tensor_parallel > 1) run_cpu->tp_plan(&run_arch, tc->tensor_parallel, tc->B, T, tc->recompute, 1, p);
    else run_cpu->plan(&run_arch, tc->B, T, tc->recompute, 1, p);
    if (ep_ways(tc) > 1) { /* this rank's experts and exchange buffers, and the expert-parallel AdamW */
        mixtral_plan_expert_parallel(ep_cfg(), ep_ways(tc), tc->B, tc->T, shard_stage(tc), tc->num_processes,
                                     tc->process_rank, p);
        ep_adamw_plan(ep_cfg(), ep_ways(tc), tc->zero_stage, tc->num_processes, tc->process_rank, tc->output_dir[0] != 0, p);
    }
    if (lora_wanted(tc)) lora_plan(tc, p);
    if (shard_stage(tc) && ep_ways(tc) == 1)
        run_cpu->plan_shard(&run_arch, tc->zero_stage, tc->num_processes, tc->process_rank, p);
    /* (after the shard's classes: the teacher is whole on every rank) */
    if (teacher_wanted(tc)) teacher_plan(&run_teacher, tc->B, tc->T, p, NULL);
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

static void cpu_attach_optimizer(void *r, Optimizer *opt, float **host_params, float **host_grads) {
    CpuRun *run = (CpuRun *)r;
    CpuModelParts parts = run->a->parts(run->model);
    run->a->shard(run->model, opt->zero, opt->dist->size, opt->dist->rank, shard_hooks(parts.params, opt));
    *host_params = *parts.params;
    *host_grads = *parts.grads;
}

/* Every CPU model's parameters and gradients live in host memory and the loop's optimizer
 * (llmc/train/optim.c) updates them. */
static void host_backend(TrainBackend *be, CpuRun *run, const TrainConfig *tc) {
    CpuModelParts parts = run->a->parts(run->model);
    be->model = run;
    be->cfg = *parts.cfg;
    be->num_parameters = parts.num_parameters;
    be->state.host_params = *parts.params;
    be->hostopt.host_grads = *parts.grads;
    be->hostopt.param_specs = parts.specs;
    be->ops.train_micro_step = cpu_train_micro_step;
    be->ops.eval_loss = cpu_eval_loss;
    be->ops.eval_losses = cpu_eval_losses;
    be->ops.zero_grad = cpu_zero_grad;
    be->ops.next_logits = cpu_next_logits;
    if (shard_stage(tc)) be->hostopt.attach_optimizer = cpu_attach_optimizer;
    be->state.print_memory = cpu_print_memory;
    if (use_lora) { /* the loop trains the adapter: its arena is the parameters, the base stays in the model */
        be->num_parameters = run_lora_cfg.num_parameters;
        be->state.host_params = run_lora.params;
        be->hostopt.host_grads = run_lora.grads;
        be->hostopt.param_specs = run_lora_cfg.specs;
        be->hostopt.num_param_specs = run_lora_cfg.num_specs;
        be->state.save_model = cpu_lora_save;
        be->state.model_path = cpu_lora_model_path;
    }
    be->ops.plan = cpu_plan;
    if (use_teacher) be->ops.loss_parts = cpu_loss_parts;
    if (run->a->step_log) be->report.step_extras = cpu_step_extras;
}

static void budget_fit_run(TrainConfig *tc, const ModelConfig *cfg, const BudgetSpace *space, Dist *dist) {
    if (!tc->memory_budget[0]) return;
    budget_fit(tc, cfg, space, cli_memory_budget_bytes(tc->memory_budget), "--memory-budget", dist->rank == 0 ? stdout : NULL);
    budget_agree(dist, tc);
}

/* Build (parameters from init), fit --memory-budget, allocate, train, free. */
static int cpu_run(TrainConfig *tc, const char *init, const BudgetSpace *space, Dist *dist, TrainBackend *be, int resume_step) {
    CpuRun run = {run_cpu, callocCheck(1, run_cpu->model_size, "model")};
    run_cpu->build(run.model, &run_arch);
    CpuModelParts parts = run_cpu->parts(run.model);
    run_arch.arch->load_init(init, &run_arch, *parts.params, parts.num_parameters, tc->seed);
    const size_t whole = parts.num_parameters;
    if (ep_ways(tc) > 1) { /* the whole model loaded, this rank's experts kept */
        moe_ep_init(&run_ep, dist, ep_ways(tc), ep_cfg());
        mixtral_set_expert_parallel((MixtralModel *)run.model, &run_ep);
    }
    if (tc->tensor_parallel > 1) run_cpu->tp_split(run.model, dist_tp_group()); /* (the whole model loaded first) */
    if (lora_wanted(tc)) lora_attach(tc, &run, resume_step);
    budget_fit_run(tc, arch_config_base(&run_arch), space, dist);
    if (teacher_wanted(tc)) { /* (after the budget's -b: its activations are for the run's B) */
        teacher_load(&run_teacher, tc->seed, tc->B, tc->T);
        tc->teacher_crc = run_teacher.crc, tc->has_teacher_crc = 1; /* (saved with each checkpoint) */
        use_teacher = 1;
    }
    run_cpu->allocate(run.model, tc->B, tc->T + run_prompt, tc->recompute, 1);
    if (use_lora) lora_run_allocate(&run_lora, tc->B, tc->T + run_prompt, 1);
    if (run_prompt) prompt_allocate(tc->B, tc->T);
    host_backend(be, &run, tc);
    if (run_ep.ways > 1) { /* checkpoints are of the whole model; the ranks agree on the shared tensors */
        TensorSpec s[MIXTRAL_NUM_PARAMETERS];
        mixtral_shard_parameter_specs(ep_cfg(), run_ep.ways, s);
        be->num_parameters = whole;
        be->state.agree_floats = s[MIXTRAL_P_expfcw].offset;
        ep_adamw_open(&be->optimizer, &run_ep_opt, tc, be, dist, ep_cfg(), run_ep.ways);
        if (shard_stage(tc)) { /* -z 2: the gradient buckets to the optimizer as the backward completes them */
            CpuShardHooks hooks = {&run_ep_opt, ep_adamw_reduce_bucket, NULL, NULL};
            run.a->shard(run.model, tc->zero_stage, dist->size, dist->rank, hooks);
            be->hostopt.host_grads = *run.a->parts(run.model).grads;
        }
    }
    int status = train_run(tc, be, resume_step);
    if (use_lora) lora_run_free(&run_lora);
    if (run_prompt) mem_free(MEM_ACTIVATIONS, prompt_inputs, prompt_ints * sizeof(int));
    if (use_qbase) qbase_free(&run_qbase);
    if (use_teacher) teacher_free(&run_teacher);
    run_cpu->free(run.model);
    free(run.model);
    return status;
}

/* The CPU entry of init's architecture (run_arch, run_cpu and the budget's space filled; the
 * flags its block sequence fixes fixed); dies when the CPU has none. */
static void cpu_arch_for_init(const char *init, TrainConfig *tc, BudgetSpace *space) {
    const ModelArch *arch = model_arch_for_init(init, &run_arch);
    const CpuArch *a = cpu_arch_for(arch);
    if (!a) llmc_die("-e %s is a %s model: the CPU trainer has no block sequence for it", init, arch->display);
    if (tc->tensor_parallel > 1 && !a->tp_split)
        llmc_die("flag -tp %d with -e %s (a %s model): tensor parallelism is built for GPT-2 only so far (the Llama "
                 "family's split is not built yet); give -tp 1", tc->tensor_parallel, init, arch->display);
    const char *bad = tc->tensor_parallel > 1 ? a->tp_validate(&run_arch, tc->tensor_parallel) : NULL;
    if (bad) llmc_die("flag -tp %d with -e %s: %s", tc->tensor_parallel, init, bad);
    if (a->fix_recompute) /* (--plan --json: stdout is the JSON) */
        tc->recompute = a->fix_recompute(tc->recompute, tc->plan && tc->json ? stderr : stdout);
    /* (adapters: -z 0 or 1 only, lora_check_flags) */
    *space = (BudgetSpace){cpu_plan, 1, "CPU", a->max_recompute, lora_wanted(tc) ? 1 : OPTIM_MAX_ZERO, 0, mem_process_start_rss(),
                           a->no_recompute};
    run_cpu = a;
    if (teacher_wanted(tc)) teacher_for(tc);
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
    if (tc.memory_snapshot[0]) /* llmc/core/mem.c counts bytes by class, not allocations: no snapshot to write */
        llmc_die("flag --memory-snapshot is ./train_gpt's (the device allocator's live allocations); the CPU trainer's "
                 "memory by class is in every log.jsonl record (mem_by_class) and in --plan");
    train_check_init(&tc); /* -e a run directory; --plan -y 1: the checkpoint's model */
    int threads = 1;
#ifdef _OPENMP
    if (tc.threads > 0) omp_set_num_threads(tc.threads);
    threads = omp_get_max_threads();
#endif
#if LLMC_USE_OPENBLAS
    openblas_set_num_threads(threads);
#endif
    tc.threads = threads; /* logged and saved as used; the plan prices the sgemm's buffers for them */
    BudgetSpace space; /* --memory-budget prices candidates with the plan; the process's VmRSS at start counts too */
    /* --plan: before any process group, run directory or model (-pn gives the rank count); the
     * model's header or name only */
    if (lora_wanted(&tc)) lora_check_flags(&tc);
    if (tc.plan) {
        cpu_arch_for_init(tc.init, &tc, &space);
        if (lora_wanted(&tc)) lora_config_for(&tc, tc.adapter);
        if (tc.memory_budget[0]) return budget_plan_main_for(&tc, &space, arch_config_base(&run_arch));
        MemPlan p;
        ep_check(&tc, NULL);
        const int tp = tc.tensor_parallel; /* -tp: rank -pr's figures, of data-parallel rank -pr / tp */
        if (tc.num_processes % tp != 0)
            llmc_die("flag --plan with -tp %d: give the processes of the run, -pn (a multiple of %d), whose rank -pr "
                     "to plan", tp, tp);
        tc.num_processes /= tp, tc.process_rank /= tp;
        train_memory_plan(&tc, arch_config_base(&run_arch), cpu_plan, ep_ways(&tc) == 1, "CPU", &p);
        if (tc.json) mem_plan_print_json(&p, stdout);
        else mem_plan_print(&p, stdout), train_plan_print_optimizer(&tc, &p, 1, stdout);
        if (ep_ways(&tc) > 1 && !tc.json) ep_plan_print(ep_cfg(), ep_ways(&tc), tc.num_processes, tc.B, tc.T, stdout);
        if (tp > 1 && !tc.json)
            printf("tensor parallel: -tp %d over %d data-parallel rank(s): the figures are one rank's (its 1/%d of the split "
                   "tensors and activations; %zu parameters of the model's %zu)\n", tp, tc.num_processes, tp,
                   p.num_parameters, run_cpu->arch->parameter_specs(&run_arch, NULL));
        if (tc.quantize_base[0] && !tc.json) qbase_plan_print(&tc, stdout);
        if (lora_wanted(&tc) && run_lora_cfg.prompt_tokens && !tc.json)
            printf("  prompt tuning (--prompt-tokens %d): %d x %d = %zu trained parameters (gradients and AdamW state for them "
                   "only; the base frozen), activations for %d + %d positions per sequence\n", run_lora_cfg.prompt_tokens,
                   run_lora_cfg.prompt_tokens, run_lora_cfg.token_dim, run_lora_cfg.num_parameters, run_lora_cfg.prompt_tokens, tc.T);
        if (teacher_wanted(&tc) && !tc.json) teacher_print(&run_teacher, tc.B, tc.T, stdout);
        return 0;
    }
    if (tc.teacher[0] && tc.max_steps == 0)
        printf("note: -x 0 evaluates the student's cross-entropy: --teacher %s is not loaded\n", tc.teacher);
    /* a bad --teacher (missing, another vocabulary) stops here, before any run directory exists */
    if (teacher_wanted(&tc)) model_arch_for_init(tc.init, &run_arch), teacher_for(&tc);
    /* the process group: mpirun/srun ranks (a build with MPI), or one process */
    const DistFlags dist_flags = train_config_dist_flags(&tc);
    if (tc.tensor_parallel > 1) { /* a model that does not split stops before any process group or run directory */
        BudgetSpace early;
        cpu_arch_for_init(tc.init, &tc, &early);
    }
    Dist *dist = dist_init(&argc, &argv, &dist_flags, 1);
    dist_layout_init(dist, tc.tensor_parallel); /* -tp: the loop's ranks are the data-parallel group's */
    tc.num_processes = dist_data_group()->size;
    tc.process_rank = dist_data_group()->rank;
    if (tc.gpu_log_every > 0)
        printf("note: -lg %d: the CPU trainer has no GPU telemetry; continuing without it\n", tc.gpu_log_every);


    char init[1100];
    int resume_step = train_resolve_init(&tc, init, sizeof init);
    lora_resume_init(&tc, resume_step, init, sizeof init); /* a LoRA run resumes on -e, its base */
    cpu_arch_for_init(init, &tc, &space); /* the architecture is the model's: name or file header */
    ep_check(&tc, dist);
    char name[512];
    snprintf(name, sizeof name, "CPU fp32, %s, %d thread%s", blas, threads, threads == 1 ? "" : "s");
    TrainBackend be = {0};
    be.name = name;
    be.state.sync_to_host = cpu_sync_noop;
    be.state.sync_from_host = cpu_sync_noop;
    be.arch = &run_arch;
    int status = cpu_run(&tc, init, &space, dist, &be, resume_step);
    dist_finalize(dist);
    return status;
}
