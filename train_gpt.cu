/*
 * train_gpt.cu - the GPU trainer (./train_gpt): the same flags, files and training loop as
 * ./train_gpt_cpu (llmc/train/train.c), with the CUDA model of llmc/cuda/cudamodel.cuh behind the
 * TrainBackend. Parse flags -> check the GPU -> build the model -> hand it to train_run().
 * Precision is a run-time choice: --precision fp32 | bf16 (default) | fp16.
 *
 * Data parallelism, ZeRO 1-3 and --offload optimizer (NCCL, the gradient buckets, the device AdamW
 * as the loop's optimizer): llmc/cuda/trainer.cuh.
 * Every architecture with a CUDA entry (llmc/cuda/arch.cuh, registered in llmc/cuda/archs.cuh) trains
 * the same way: a Llama 3 -e (llama3:dN, an HF directory, llmc's or llm.c's Llama file) writes
 * llmc's Llama file (fp32 or, --checkpoint-bf16 1, bf16) and --save-hf LlamaForCausalLM (with the
 * tokenizer files of an HF -e); the test MLP its own file. The entry says
 * which -r and -ge apply (the Llama and the MLP: -r 0 only, so --memory-budget searches -b, -z
 * with several ranks, and --offload for them); nothing here names an architecture.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "llmc/train/budget.h"
#include "llmc/core/check.h"
#include "llmc/train/cli.h"
#include "llmc/cuda/cudamodel.cuh"
#include "llmc/cuda/trainer.cuh"
#include "llmc/dist/dist.h"
#include "llmc/formats/arch.h"
#include "llmc/train/train.h"

/* ---- peak throughput table (dense, per GPU, TFLOP/s) ---------------------------------------- */
typedef struct {
    const char *name; /* substring of cudaDeviceProp.name */
    double bf16, tf32, fp32;
} PeakEntry;
static const PeakEntry peak_table[] = {
    {"H200", 989.0, 494.0, 67.0},
    {"H100 PCIe", 756.0, 378.0, 51.0},
    {"H100", 989.0, 494.0, 67.0},
    {"H800", 989.0, 494.0, 67.0},
    {"A100", 312.0, 156.0, 19.5},
    {"A800", 312.0, 156.0, 19.5},
    {"L40S", 362.0, 183.0, 91.6},
    {"RTX 4090", 165.0, 82.6, 82.6},
    {"RTX 3090", 71.0, 35.6, 35.6},
};

static double peak_flops_for(const cudaDeviceProp *props, Precision prec, int tf32, float override_tflops) {
    if (override_tflops > 0) return override_tflops * 1e12;
    for (size_t i = 0; i < sizeof peak_table / sizeof peak_table[0]; i++) {
        if (!strstr(props->name, peak_table[i].name)) continue;
        const PeakEntry *e = &peak_table[i];
        return 1e12 * (prec != PRECISION_FP32 ? e->bf16 : tf32 ? e->tf32 : e->fp32);
    }
    return 0.0;
}

/* ---- the CUDA backend: thin adapters from TrainBackend to llmc/cuda/cudamodel.cuh ---------------- */
/* A micro-step waits for nothing: the tokens go through pinned staging, the loss stays on the
 * device (cuda_step_loss reads the step's once). --cuda-graph 1: from the second micro-step on, the
 * forward and the backward down to the encoder replay as one CUDA graph (graph.cuh); the first
 * runs uncaptured so that one-time work (cuBLASLt algorithm timing) is done. */
static float cuda_train_micro_step(void *p, const int *inputs, const int *targets, int B, int T, float dloss_scale) {
    CudaTrainer *tr = (CudaTrainer *)p;
    CudaModel *m = &tr->model;
    m->grad_hook_armed = ++tr->micro == tr->accum; /* the step's gradients are final in its last backward */
    if (m->grad_hook_armed && tr->step == tr->inf_step) dloss_scale = INFINITY; /* LLMC_TEST_INF_RANK */
    const float dloss = dloss_scale * m->loss_scale / (float)(B * T);
    cudamodel_stage(m, inputs, targets, B, T, 1);
    auto forward_backward = [&]() { /* (host code: with a graph, the phases are set at its capture) */
        cuda_phase(tr, "forward");
        cudamodel_forward_device(m, 1, B, T, dloss);
        cuda_phase(tr, "backward");
        cudamodel_backward_layers(m, B, T);
    };
    if (tr->use_graph && tr->micro_steps > 0) cuda_step_graph_run(&tr->graph, tr->ctx.stream, B, T, dloss, forward_backward);
    else forward_backward();
    cudamodel_backward_encoder(m, B, T);
    tr->micro_steps++;
    return NAN; /* not read: the loop asks cuda_step_loss */
}

static double cuda_step_loss(void *p) { return cudamodel_read_step_loss(&((CudaTrainer *)p)->model); }

static float cuda_eval_loss(void *p, const int *inputs, const int *targets, int B, int T) {
    cuda_phase((CudaTrainer *)p, "eval");
    return cudamodel_forward(&((CudaTrainer *)p)->model, inputs, targets, B, T, 0.0f);
}

static void cuda_eval_losses(void *p, const int *inputs, const int *targets, int B, int T, float *losses) {
    CudaModel *m = &((CudaTrainer *)p)->model;
    cuda_phase((CudaTrainer *)p, "eval");
    cudamodel_forward(m, inputs, targets, B, T, 0.0f);
    cudamodel_read_losses(m, losses, B * T);
}

static void cuda_zero_grad(void *p) { /* (the first call of a step) */
    CudaTrainer *tr = (CudaTrainer *)p;
    tr->micro = tr->buckets_issued = 0;
    tr->step++; /* the loop zeroes the gradients once per step, first */
    cuda_phase(tr, "forward");
#ifdef CUDASIM
    tr->syncs_seen = cudasim::stats().host_syncs;
#endif
    cudamodel_zero_grad(&tr->model);
}
static const float *cuda_next_logits(void *p, const int *tokens, int n) {
    cuda_phase((CudaTrainer *)p, "sample");
    return cudamodel_next_logits(&((CudaTrainer *)p)->model, tokens, n);
}

static void cuda_sync_from_host(void *p) { cudamodel_sync_from_host(&((CudaTrainer *)p)->model); }
static void cuda_print_memory(void *p, FILE *out) { cudamodel_print_memory(&((CudaTrainer *)p)->model, out); }

static void cuda_print_planned_vs_measured(const CudaTrainer *tr, const TrainConfig *tc);

/* MFU, device memory (current and the peak seen), the device allocator's reserved, allocated and
 * largest free bytes and, in fp16, the loss scale. The step line's call (text) ends the step for
 * the allocator: its leak check (cuda_alloc_step_end). */
static void cuda_step_extras(void *p, double step_ms, double tokens_per_s, char *text, size_t len, Logger *lg) {
    CudaTrainer *tr = (CudaTrainer *)p;
    (void)step_ms;
    if (text) cuda_alloc_step_end(tr);
    const DevAlloc *da = tr->ctx.alloc;
    const size_t largest_free = devalloc_largest_free(da);
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double used = (double)(total_b - free_b);
    if (used > tr->peak_used_bytes) tr->peak_used_bytes = used;
    if (text && tr->steps_seen++ == 0) cuda_print_planned_vs_measured(tr, &tr->tc);
#ifdef CUDASIM
    /* LLMC_COUNT_SYNCS=1: how often the host waited for the device in this step (from zero_grad on) */
    if (text && getenv("LLMC_COUNT_SYNCS")) printf("host syncs: %llu in this step\n", cudasim::stats().host_syncs - tr->syncs_seen);
#endif
    double mfu = tr->peak_flops > 0 ? tr->flops_per_token * tokens_per_s / tr->peak_flops : -1.0;
    const double GiB = 1073741824.0;
    const CudaModel *m = &tr->model;
    if (text) {
        char mfu_text[32];
        if (mfu >= 0) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100.0 * mfu);
        else snprintf(mfu_text, sizeof mfu_text, "n/a (set --peak-tflops)");
        const double MiB = 1048576.0;
        int k = snprintf(text, len, " | MFU %s | mem %.2f GiB (peak %.2f) | dev alloc %.1f MiB of %.1f reserved, largest free %.1f",
                         mfu_text, used / GiB, tr->peak_used_bytes / GiB, da->allocated / MiB, da->reserved / MiB, largest_free / MiB);
        if (m->precision == PRECISION_FP16 && k > 0 && (size_t)k < len)
            snprintf(text + k, len - k, " | loss scale %g (skipped %lld)", m->loss_scale, m->skipped_steps);
    }
    if (lg) {
        if (mfu >= 0) log_double(lg, "mfu", mfu);
        log_double(lg, "mem_gib", used / GiB);
        log_double(lg, "peak_mem_gib", tr->peak_used_bytes / GiB);
        log_int(lg, "dev_reserved", (long long)da->reserved);
        log_int(lg, "dev_allocated", (long long)da->allocated);
        log_int(lg, "dev_largest_free", (long long)largest_free);
        if (m->precision == PRECISION_FP16) {
            log_float(lg, "loss_scale", m->loss_scale);
            log_int(lg, "skipped_steps", m->skipped_steps);
        }
    }
}

/* -lg: one reading, printed by train_run after the step line and logged with the step. */
static void cuda_telemetry(void *p, char *text, size_t len, Logger *lg) {
    GpuTelemetry *t = &((CudaTrainer *)p)->telemetry;
    GpuReading r;
    gpu_telemetry_read(t, &r);
    gpu_reading_format(&r, text, len);
    gpu_reading_log(&r, lg);
}

/* The fp16 loss scaler travels in the state file: {scale bits, clean steps, skipped steps}. */
static void cuda_save_backend_state(void *p, int64_t words[4]) {
    const CudaModel *m = &((CudaTrainer *)p)->model;
    uint32_t bits;
    memcpy(&bits, &m->loss_scale, sizeof bits);
    words[0] = bits;
    words[1] = m->clean_steps;
    words[2] = m->skipped_steps;
    words[3] = 0;
}

static void cuda_load_backend_state(void *p, const int64_t words[4]) {
    CudaModel *m = &((CudaTrainer *)p)->model;
    if (words[0] == 0 || m->precision != PRECISION_FP16) return; /* none saved (e.g. by train_gpt_cpu) */
    uint32_t bits = (uint32_t)words[0];
    memcpy(&m->loss_scale, &bits, sizeof bits);
    m->clean_steps = (int)words[1];
    m->skipped_steps = words[2];
}

/* Test only: LLMC_TEST_INF_RANK=RANK:STEP makes rank RANK's gradients non-finite at step STEP (the
 * step's last micro-step scales dloss by inf), as an fp16 overflow on that rank alone would; every
 * rank must then skip the update and halve its loss scale. With LLMC_TEST_ALL_RANKS_STDOUT (every
 * rank keeps stdout: llmc/dist/dist.c) each rank ends with a line giving its parameters' CRC-32 (the
 * device bits), loss scale and skipped steps, so that a test sees whether the ranks agree. */
static int test_inf_step(const Dist *d) {
    const char *e = getenv("LLMC_TEST_INF_RANK");
    int rank, at;
    if (!e) return -1;
    if (sscanf(e, "%d:%d", &rank, &at) != 2) llmc_die("LLMC_TEST_INF_RANK=%s: expected RANK:STEP", e);
    return rank == d->rank ? at : -1;
}

static void test_rank_summary(const CudaTrainer *tr) {
    if (!getenv("LLMC_TEST_ALL_RANKS_STDOUT")) return;
    const CudaModel *m = &tr->model;
    const size_t bytes = (m->param_slots ? m->shard_hi - m->shard_lo : m->num_parameters) * precision_bytes(m->precision); /* -z 3: the shard */
    unsigned char *h = (unsigned char *)mallocCheck(bytes, "parameters (LLMC_TEST_ALL_RANKS_STDOUT)");
    cudaCheck(cudaMemcpy(h, m->params_memory, bytes, cudaMemcpyDeviceToHost));
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < bytes; off += 1u << 30) crc = crc32(crc, h + off, (uInt)(bytes - off < (1u << 30) ? bytes - off : 1u << 30));
    free(h);
    printf("rank %d: parameters crc32 %08lx | loss scale %g (skipped %lld)\n", tr->dist->rank, (unsigned long)crc,
           m->loss_scale, m->skipped_steps);
}

/* The architecture of -e and its config (formats/arch.h; detect_arch): run_arch once -e is resolved;
 * plan_arch the one cuda_plan prices (a TrainPlanFn sees only the ModelConfig: it takes the rest
 * of the config from here), the registry's fallback while -e names none explicitly (plan_explicit 0). */
static ArchConfig run_arch, plan_arch;
static int plan_explicit;

/* The backend's part of the memory plan (train_memory_plan adds the loop's). */
static void cuda_plan(const TrainConfig *tc, const ModelConfig *cfg, MemPlan *p) {
    ArchConfig ac = plan_arch;
    *arch_config_base(&ac) = *cfg; /* the shape priced */
    size_t lo = 0, hi = ac.arch->parameter_specs(&ac, NULL);
    if (tc->zero_stage >= 1 && !p->offload) dist_shard(hi, tc->num_processes, tc->process_rank, &lo, &hi); /* as main() shards */
    const Precision prec = (Precision)precision_parse(tc->precision);
    cudamodel_plan(&ac, tc->B, tc->T, tc->recompute, prec, tc->master_weights, 0, hi - lo, 1, p);
    if (tc->zero_stage >= 2 && !p->offload) { /* as main(): cudamodel_set_grad_slots */
        TensorSpec specs[NUM_PARAMETER_TENSORS];
        ac.arch->parameter_specs(&ac, specs);
        cudamodel_plan_grad_slots(specs, ac.arch->num_param_specs, hi - lo, prec, tc->zero_stage >= 3, p);
    }
}

/* Planned against measured device memory after the first step: cudaMemGetInfo's use less what the
 * CUDA context held before llmc allocated anything (the runtime's fixed overhead). */
static void cuda_print_planned_vs_measured(const CudaTrainer *tr, const TrainConfig *tc) {
    MemPlan plan;
    train_memory_plan(tc, &tr->model.cfg, cuda_plan, tr->model.offload, "GPU", &plan);
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    double used = (double)(total_b - free_b), planned = (double)mem_plan_peak(&plan, 1, NULL);
    double overhead = tr->context_bytes, measured = used - overhead;
    printf("memory: planned device peak %.1f MiB; measured (cudaMemGetInfo) %.1f MiB = CUDA context overhead %.1f MiB "
           "+ %.1f MiB; planned / measured %.4f\n",
           planned / 1048576.0, used / 1048576.0, overhead / 1048576.0, measured / 1048576.0, planned / measured);
}

static void check_flags(const TrainConfig *tc, int *precision) {
    *precision = precision_parse(tc->precision);
    if (*precision < 0) llmc_die("--precision %s: use fp32, bf16 or fp16", tc->precision);
    if (tc->recompute < 0 || tc->recompute > 3) llmc_die("-r %d: recompute level must be 0, 1, 2 or 3", tc->recompute);
    if (tc->gelu_fusion < -1 || tc->gelu_fusion > 2) llmc_die("-ge %d: GELU fusion must be -1 (auto), 0, 1 or 2", tc->gelu_fusion);
    if (tc->zero_stage > CUDA_MAX_ZERO) llmc_die("-z %d: use -z 0, 1, 2 or 3", tc->zero_stage);
    if (strcmp(tc->offload_device, "nvme") == 0 && strcmp(tc->offload, "optimizer") != 0)
        llmc_die("flag --offload-device nvme: ./train_gpt keeps the optimizer state on the device unless --offload optimizer "
                 "moves it to the host; give --offload optimizer --offload-device nvme");
    if (strcmp(tc->offload, "optimizer") == 0) {
        if (*precision == PRECISION_FP16)
            llmc_die("--offload optimizer with --precision fp16 is not built (the fp16 loss scaler lives in the device "
                     "optimizer); use --precision bf16 or fp32");
        if (tc->zero_stage > 1) /* the loop's optimizer takes -z 2 buckets only from a backend that hands them over */
            llmc_die("--offload optimizer in train_gpt runs with -z 0 or 1 for now (-z %d given)", tc->zero_stage);
        if (tc->batch_ramp[0]) /* the device optimizer's loss weight tells the micro-steps each step's count */
            llmc_die("--batch-ramp with --offload optimizer is not built in train_gpt (use one of them)");
    }
}

/* --cuda-graph 1 where the configuration allows it (graph.cuh); otherwise a note and kernel-by-kernel
 * launches. fp16 is allowed: its loss scale is baked into the graph, which is captured anew when
 * the scale changes. */
static int cuda_graph_allowed(const TrainConfig *tc, const CudaModel *m, FILE *note) {
    if (!tc->cuda_graph) return 0;
    const char *why = tc->num_processes > 1 ? "more than one process (not built yet)"
                      : m->offload         ? "--offload optimizer (not built yet)"
                      : m->grad_hook       ? "per-layer gradient buckets (not built yet)"
                      : USE_CUDNN && m->precision != PRECISION_FP32 ? "cuDNN attention (its capture is untested)"
                                                                    : NULL;
    if (why && note) fprintf(note, "note: --cuda-graph 1 is not used with %s; kernels are launched one by one\n", why);
    return why == NULL;
}

/* The architecture init names and its CUDA entry (llmc/cuda/archs.cuh's cuda_arch_for), into
 * run_arch and plan_arch. resolve 1: init is the model's own path (after -y 1 found it), asked of
 * the whole registry; 0: only an architecture -e names explicitly (model_arch_explicit: a path
 * not yet resolved, such as a run directory, reads as the fallback's for now). An architecture
 * without a CUDA entry stops here, naming it, before any device or process group (resolve 0) or
 * as cudamodel_build would (resolve 1). -r and -ge become what the entry runs, with notes (note). */
static const CudaArch *detect_arch(TrainConfig *tc, const char *init, int note, int resolve) {
    const ModelArch *a = resolve ? model_arch_for_init(init, &run_arch) : model_arch_explicit(init, &run_arch);
    plan_explicit = a != NULL;
    if (!a) { /* the fallback's (the registry's last entry), its shape not known yet */
        memset(&run_arch, 0, sizeof run_arch);
        for (int i = 0; model_archs[i]; i++) run_arch.arch = model_archs[i];
    }
    plan_arch = run_arch;
    const CudaArch *ca = cuda_arch_for(run_arch.arch);
    if (resolve) cuda_arch_refuse(run_arch.arch, ca, init, "the CUDA runtime", "");
    else cuda_arch_refuse(run_arch.arch, ca, init, "the CUDA trainer", " (./train_gpt_cpu trains it)");
    cuda_arch_fix_flags(ca, &tc->recompute, &tc->gelu_fusion, note ? stdout : NULL);
    return ca;
}

/* What --memory-budget may change for the architecture detect_arch found: -r up to its
 * max_recompute, -b, -z with several ranks, --offload optimizer (not with fp16). */
static BudgetSpace budget_space(int precision, const CudaArch *ca) {
    BudgetSpace s = {cuda_plan, 0, "GPU", 3, CUDA_MAX_ZERO, precision != PRECISION_FP16, 0, NULL};
    s.max_recompute = ca->max_recompute;
    s.no_recompute = ca->no_recompute;
    return s;
}

/* The device of this local rank, its CUDA context (what it holds before llmc allocates: the
 * runtime's overhead), the NCCL communicator and the matmul algorithm cache. Returns what llmc may
 * allocate on the device. */
static size_t cuda_start(CudaTrainer *tr, const TrainConfig *tc, Dist *dist) {
    tr->dist = dist;
    int devices = 1;
    cudaCheck(cudaGetDeviceCount(&devices));
    cuda_context_init(&tr->ctx, dist->local_rank % devices, tc->tf32); /* one GPU per local rank */
    mem_account(MEM_WORKSPACE, (long long)tr->ctx.lt_workspace_bytes, 1); /* the context's cuBLASLt workspace */
    size_t free_b = 0, total_b = 0;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    tr->context_bytes = (double)(total_b - free_b) - (double)tr->ctx.lt_workspace_bytes;
#if LLMC_HAVE_NCCL
    nccl_start(tr);
#endif
    tr->ctx.lt_algos = tc->matmul_algos;
    tr->ctx.lt_log = stdout;
    if (tc->matmul_cache[0] || tc->output_dir[0]) {
        int n = tc->matmul_cache[0] ? snprintf(tr->ctx.lt_cache_path, sizeof tr->ctx.lt_cache_path, "%s", tc->matmul_cache)
                                    : snprintf(tr->ctx.lt_cache_path, sizeof tr->ctx.lt_cache_path, "%s/matmul_algos.txt", tc->output_dir);
        if (n >= (int)sizeof tr->ctx.lt_cache_path) llmc_die("--matmul-cache: the path is too long");
    }
    return free_b + tr->ctx.lt_workspace_bytes; /* the plan counts that workspace */
}

/* --memory-budget, and the device's free memory when the plan exceeds it: the search's choice of
 * -r, -b, -z and --offload, the same on every rank, checked like given flags. */
static void cuda_fit(TrainConfig *tc, const CudaTrainer *tr, const BudgetSpace *space, size_t device_free, int *precision) {
    const ModelConfig *cfg = &tr->model.cfg;
    FILE *note = tr->dist->rank == 0 ? stdout : NULL;
    if (tc->memory_budget[0]) budget_fit(tc, cfg, space, cli_memory_budget_bytes(tc->memory_budget), "--memory-budget", note);
    if (budget_peak(tc, cfg, space) > device_free) { /* it would run out of memory: fit the device instead */
        if (note) fprintf(note, "memory: the plan exceeds the device's free memory; searching with that as the budget\n");
        budget_fit(tc, cfg, space, device_free, "device free memory (cudaMemGetInfo)", note);
    }
    budget_agree(tr->dist, tc);
    check_flags(tc, precision); /* what the search chose, too */
}

/* The backend's model half (the optimizer half: cuda_trainer_optimizer). */
static void cuda_backend(TrainBackend *be, CudaTrainer *tr, const char *name) {
    const CudaModel *m = &tr->model;
    memset(be, 0, sizeof *be);
    be->name = name;
    be->model = tr;
    be->cfg = m->cfg;
    be->num_parameters = m->num_parameters;
    be->peak_flops = tr->peak_flops;
    be->gpu = 1;
    be->ops.train_micro_step = cuda_train_micro_step;
    be->ops.step_loss = cuda_step_loss;
    be->ops.eval_loss = cuda_eval_loss;
    be->ops.eval_losses = cuda_eval_losses;
    be->ops.zero_grad = cuda_zero_grad;
    be->ops.next_logits = cuda_next_logits;
    be->state.sync_from_host = cuda_sync_from_host;
    be->state.print_memory = cuda_print_memory;
    be->report.step_extras = cuda_step_extras;
    be->state.save_backend_state = cuda_save_backend_state;
    be->state.load_backend_state = cuda_load_backend_state;
    be->ops.plan = cuda_plan;
    be->arch = &run_arch; /* the checkpoint files, --save-hf and the flops are the architecture's */
    if (tr->tc.gpu_log_every > 0) {
        gpu_telemetry_open(&tr->telemetry, tr->ctx.device, LLMC_NVML_LIBRARY);
        gpu_telemetry_print_source(&tr->telemetry, tr->tc.gpu_log_every);
        be->report.telemetry = cuda_telemetry;
    }
}

/* e.g. "CUDA bf16 on NVIDIA H100 (sm_90), GELU fusion 1, recompute 1" (GPT-2), "CUDA Llama 3 bf16 on ..."
 * (an entry that is named: its display name) */
static void cuda_backend_name(const CudaTrainer *tr, const TrainConfig *tc, char *name, size_t len) {
    const CudaModel *m = &tr->model;
    const cudaDeviceProp *props = &tr->ctx.props;
    snprintf(name, len, "CUDA %s%s%s on %s (sm_%d%d)%s%s, GELU fusion %d, recompute %d", m->arch->named ? m->ac.arch->display : "",
             m->arch->named ? " " : "", precision_name(m->precision), props->name, props->major, props->minor, m->master ? ", fp32 master weights" : "",
             m->precision == PRECISION_FP32 ? (tc->tf32 ? ", TF32 on" : ", TF32 off") : "", m->gelu_fusion, tc->recompute);
    if (tr->use_graph) snprintf(name + strlen(name), len - strlen(name), ", CUDA graph");
}

static void cuda_finish(CudaTrainer *tr) {
    test_rank_summary(tr);
    if (tr->use_graph && tr->dist->rank == 0)
        printf("CUDA graph: %lld capture(s), %lld launch(es) for %lld micro-steps\n", tr->graph.captures, tr->graph.launches,
               tr->micro_steps);
    cuda_step_graph_free(&tr->graph);
    gpu_telemetry_close(&tr->telemetry);
    cuda_trainer_free(tr);
    cudamodel_free(&tr->model);
    cuda_context_free(&tr->ctx);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* every line reaches a pipe or a log file as it is printed */
    TrainConfig tc;
    train_config_defaults(&tc);
    train_config_parse(&tc, argc, argv, "train_gpt");
    if (tc.expert_parallel > 1) /* MoE expert parallelism: the CPU trainer's for now (llmc/cpu/moe_ep.h) */
        llmc_die("-ep %d (--expert-parallel): expert parallelism is not built yet on CUDA (Mixtral trains on "
                 "./train_gpt_cpu)", tc.expert_parallel);
    if (tc.quantize_base[0]) /* QLoRA: the CPU trainer's for now (llmc/cpu/qbase.h) */
        llmc_die("--quantize-base is not built for ./train_gpt yet (QLoRA on a quantised base runs on ./train_gpt_cpu)");
    if (tc.lora_rank || tc.adapter[0]) /* LoRA: the CPU trainer's for now (llmc/cpu/lora.h) */
        llmc_die("--lora-rank / --adapter%s: LoRA%s fine-tuning is not built yet on CUDA; use ./train_gpt_cpu",
                 tc.use_dora ? " / --use-dora" : "", tc.use_dora ? " and DoRA" : "");
    if (tc.teacher[0]) /* distillation: the CPU trainer's for now */
        llmc_die("--teacher is not built for ./train_gpt yet (knowledge distillation runs on ./train_gpt_cpu)");
    if (strcmp(tc.grad_compression, "none") != 0) /* llmc/train/gradcomp.h: the CPU trainer's for now */
        llmc_die("--grad-compression is not built for ./train_gpt yet (./train_gpt_cpu has it, -z 0/1 on several ranks)");
    if (tc.tensor_parallel > 1) /* issue 25: the CPU trainer's for now */
        llmc_die("flag -tp %d (--tensor-parallel): tensor parallelism is not built yet for ./train_gpt (./train_gpt_cpu "
                 "has it for GPT-2)", tc.tensor_parallel);
    int precision;
    check_flags(&tc, &precision);
    train_check_init(&tc); /* -e a run directory; --plan -y 1: the checkpoint's model */
    const CudaArch *ca = detect_arch(&tc, tc.init, !tc.plan, 0); /* (--plan --json prints only the JSON) */
    /* --memory-budget prices candidates with the device plan (the CUDA context's own use is not in it) */
    /* --offload optimizer (given, or chosen by the search: not with fp16) makes the loop's host optimizer */
    BudgetSpace space = budget_space(precision, ca);
    const int given_offload = strcmp(tc.offload, "optimizer") == 0;
    /* --plan: no device, no process group, no run directory, no model */
    if (tc.plan && plan_explicit) { /* its header or name only */
        const ModelConfig *cfg = arch_config_cbase(&plan_arch);
        if (tc.memory_budget[0]) return budget_plan_main_for(&tc, &space, cfg);
        MemPlan p;
        train_memory_plan(&tc, cfg, cuda_plan, given_offload, "GPU", &p);
        if (tc.json) mem_plan_print_json(&p, stdout);
        else mem_plan_print(&p, stdout);
        return 0;
    }
    if (tc.plan) return tc.memory_budget[0] ? budget_plan_main(&tc, &space) : train_plan_main(&tc, cuda_plan, given_offload, "GPU");
    /* the process group: mpirun/srun ranks (a build with MPI and NCCL), -pi tcp|fs ranks (NCCL), or one process */
    const DistFlags dist_flags = train_config_dist_flags(&tc);
    Dist *dist = dist_init(&argc, &argv, &dist_flags, LLMC_HAVE_NCCL);
    tc.num_processes = dist->size;
    tc.process_rank = dist->rank;
    check_flags(&tc, &precision); /* again: the launcher may have given the process count */
    cuda_require_device();

    static CudaTrainer tr; /* large; one per process */
    const size_t device_free = cuda_start(&tr, &tc, dist);
    char init[1100];
    int resume_step = train_resolve_init(&tc, init, sizeof init);
    ca = detect_arch(&tc, init, 0, 1); /* a resumed run's checkpoint: the same architecture */
    space = budget_space(precision, ca);
    tr.tc = tc;
    CudaModel *m = &tr.model;
    cudamodel_build(m, init, tc.seed, (Precision)precision, &tr.ctx, tc.master_weights);
    cuda_fit(&tc, &tr, &space, device_free, &precision);
    tr.tc = tc;
    const int offload = strcmp(tc.offload, "optimizer") == 0;
    if (offload) cudamodel_set_offload(m); /* the loop's optimizer keeps m, v (as --optim-state says) */
    else cudamodel_set_optim_state(m, optstate_parse(tc.optim_state));
    cuda_trainer_shard(&tr, tc.zero_stage, offload);
    cudamodel_allocate(m, tc.B, tc.T, tc.recompute, tc.gelu_fusion, 1);
    tr.peak_flops = peak_flops_for(&tr.ctx.props, m->precision, tc.tf32, tc.peak_tflops);
    tr.flops_per_token = run_arch.arch->flops_per_token(&run_arch, tc.T);
    tr.step = resume_step < 0 ? 0 : resume_step; /* (-1: a fresh run) */
    tr.inf_step = test_inf_step(dist);
    tr.first_step = tr.step + 1;
    tr.planted_leak = cuda_planted_leak_class();
    cuda_trainer_buckets(&tr, &tc, offload);
    tr.use_graph = cuda_graph_allowed(&tc, m, dist->rank == 0 ? stdout : NULL);

    char name[512];
    cuda_backend_name(&tr, &tc, name, sizeof name);
    TrainBackend be;
    cuda_backend(&be, &tr, name);
    cuda_trainer_optimizer(&tr, &be, offload);
    cuda_phase(&tr, "setup"); /* (the loop's own setup: a resume's state, the first evaluation) */
    int status = train_run(&tc, &be, resume_step);
    if (tc.memory_snapshot[0]) cuda_write_memory_snapshot(&tr, tc.memory_snapshot);
    cuda_finish(&tr);
    dist_finalize(dist);
    return status;
}
