/*
 * plan.c - the training loop's part of the memory plan (optimizer moments, token, data and
 * checkpoint buffers), the whole plan of a run, --plan, and the loop's checks of the plan
 * against what was allocated (the planted leak, the leak check, planned against measured).
 */
#include "llmc/train/plan.h"
#include "llmc/core/check.h"
#include "llmc/core/optstate.h"
#include "llmc/formats/arch.h"
#include "llmc/cpu/adafactor.h"
#include "llmc/train/gradcomp.h"
#include "llmc/train/nvme.h"
#include "llmc/train/optim.h"

#include <stdlib.h>
#include <string.h>

/* --optimizer adafactor (llmc/train/adafactor.h; this module is below it) */
static int plan_adafactor(const TrainConfig *tc) { return strcmp(tc->optimizer, "adafactor") == 0; }

void mem_plan_add_loop(MemPlan *p, int B, int T, long long total_batch, int ranks, int rank, int zero,
                       int host_optimizer, int checkpoints, int validation) {
    const long long micro = (long long)B * T * ranks;
    if (total_batch == 0) total_batch = micro;
    if (total_batch % micro != 0)
        llmc_die("-d %lld is not a multiple of B*T*processes = %d*%d*%d = %lld tokens", total_batch, B, T, ranks, micro);
    p->B = B, p->T = T, p->ranks = ranks, p->rank = rank, p->zero = zero, p->total_batch = total_batch;
    p->accum = (int)(total_batch / micro);
    const size_t n = p->num_parameters;
    if (host_optimizer) {
        size_t k = dist_shard_floats(n, zero, ranks, rank); /* rank 0's is the largest */
        p->host[MEM_ADAM_M] = optim_moment_bytes(n, zero, ranks, rank, p->optim_state);
        p->host[MEM_ADAM_V] = optim_moment_bytes(n, zero, ranks, rank, p->optim_state);
        if (zero >= 2) p->host[MEM_GRAD_SHARD] = k * sizeof(float);
        /* whole m and v (and, -z 3, the parameters) gathered on rank 0; -z 0 compact states: one
         * chunk decoded at a time into the state file (statefile.h) */
        if (checkpoints && rank == 0 && optim_state_streamed_for(zero, p->optim_state))
            p->transient[MEM_CHECKPOINT] = STATE_CHUNK * sizeof(float);
        else if (checkpoints && rank == 0 && !optim_state_whole_for(zero, p->optim_state))
            p->transient[MEM_CHECKPOINT] = (zero == 3 ? 3 : 2) * n * sizeof(float);
        /* compact states: a sharded rank decodes its shard of one moment at a time to gather it */
        if (checkpoints && p->optim_state != OPTSTATE_FP32 && zero >= 1) p->transient[MEM_CHECKPOINT] += k * sizeof(float);
    }
    p->host[MEM_TOKENS] = train_token_buffer_bytes(B, T, total_batch);
    /* the train loader's prefetch slot (inputs, targets) and read buffer; the val loader's read buffer */
    p->host[MEM_DATA] = 3 * (size_t)total_batch * 4 + 4 + (validation ? ((size_t)B * T + 1) * 4 : 0);
}

size_t train_token_buffer_bytes(int B, int T, long long total_batch) {
    return (2 * (size_t)B * T + 2 * (size_t)total_batch) * sizeof(int);
}

void train_memory_plan(const TrainConfig *tc, const ModelConfig *cfg, TrainPlanFn backend_plan, int host_optimizer,
                       const char *device, MemPlan *p) {
    if (tc->T > cfg->max_seq_len) llmc_die("-t %d exceeds the model's maximum sequence length %d (maxT)", tc->T, cfg->max_seq_len);
    if (!host_optimizer && plan_adafactor(tc))
        llmc_die("--optimizer adafactor on the device is not built yet; use --offload optimizer (Adafactor on the host)");
    mem_plan_init(p, device);
    p->optim_state = optstate_parse(tc->optim_state);
    p->offload = strcmp(tc->offload, "optimizer") == 0;
    backend_plan(tc, cfg, p);
    mem_plan_add_loop(p, tc->B, tc->T, tc->total_batch, tc->num_processes, tc->process_rank, tc->zero_stage, host_optimizer,
                      tc->output_dir[0] != 0, tc->val_every > 0);
    if (host_optimizer && strcmp(tc->offload_device, "nvme") == 0) { /* the moments in a file, streamed through the ring */
        const size_t k = dist_shard_floats(p->num_parameters, tc->zero_stage, tc->num_processes, tc->process_rank);
        const size_t lo_hi = tc->zero_stage >= 1 ? k : p->num_parameters; /* the shard the file holds */
        p->host[MEM_ADAM_M] = p->host[MEM_ADAM_V] = 0;
        p->host[MEM_NVME_RING] = nvme_ring_bytes(p->optim_state);
        p->disk_bytes = nvme_file_bytes(lo_hi, p->optim_state);
        /* a checkpoint reads the file back: -z 0 a chunk at a time, else the shard decoded (and
         * gathered whole on rank 0) */
        if (tc->output_dir[0])
            p->transient[MEM_CHECKPOINT] = tc->zero_stage == 0 ? (tc->process_rank == 0 ? STATE_CHUNK * sizeof(float) : 0)
                                           : k * sizeof(float) + (tc->process_rank == 0 ? 2 * p->num_parameters * sizeof(float) : 0);
    }
    GradCompSpec gc;
    char err[256];
    if (host_optimizer && gradcomp_parse(tc->grad_compression, &gc, err, sizeof err) == 0 && gc.kind != GC_NONE) {
        /* --grad-compression: the residual and the ranks' payloads; a checkpoint gathers every
         * rank's residual on rank 0 (statefile.h, version 4) */
        p->host[MEM_GRAD_COMP] = gradcomp_plan_bytes(&gc, tc->init, p->num_parameters, cfg->num_layers + 1, tc->num_processes);
        if (tc->output_dir[0] && tc->process_rank == 0)
            p->transient[MEM_CHECKPOINT] += (size_t)tc->num_processes * gradcomp_residual_bytes(&gc, p->num_parameters, tc->num_processes);
        /* (powersgd: its Q, cols x RANK floats a matrix, is not counted here) */
    }
    if (host_optimizer && plan_adafactor(tc)) { /* its first moment and statistics in AdamW's m and v classes */
        adafactor_state_bytes(tc->init, tc->zero_stage, tc->num_processes, tc->process_rank, tc->adafactor_beta1 > 0.0f,
                              &p->host[MEM_ADAM_M], &p->host[MEM_ADAM_V]);
        p->host[MEM_GRAD_SHARD] = 0;
        /* -z 1 on several ranks: the whole packed state gathered on every rank (the all-gather's
         * buffers); else written from the state a chunk at a time on rank 0 */
        const int gathered = tc->zero_stage == 1 && tc->num_processes > 1;
        p->transient[MEM_CHECKPOINT] = !tc->output_dir[0] ? 0
                                       : gathered ? 2 * p->num_parameters * sizeof(float)
                                       : tc->process_rank == 0 ? STATE_CHUNK * sizeof(float) : 0;
    }
}

void train_plan_model_config(const TrainConfig *tc, ModelConfig *cfg) {
    ArchConfig ac;
    model_arch_for_init(tc->init, &ac); /* the header only: no parameters read */
    *cfg = *arch_config_base(&ac);
}

void train_plan_print_optimizer(const TrainConfig *tc, const MemPlan *p, int host_optimizer, FILE *out) {
    if (!host_optimizer || !plan_adafactor(tc)) return;
    size_t adamw = 2 * optim_moment_bytes(p->num_parameters, tc->zero_stage, tc->num_processes, tc->process_rank, OPTSTATE_FP32);
    size_t mine = p->host[MEM_ADAM_M] + p->host[MEM_ADAM_V];
    fprintf(out, "optimizer: Adafactor: second-moment statistics %zu bytes (class adamw_v), first moment %zu bytes "
                 "(class adamw_m): %.2f%% of AdamW's m + v (%zu bytes)\n",
            p->host[MEM_ADAM_V], p->host[MEM_ADAM_M], 100.0 * (double)mine / (double)(adamw ? adamw : 1), adamw);
}

int train_plan_main(const TrainConfig *tc, TrainPlanFn backend_plan, int host_optimizer, const char *device) {
    ModelConfig cfg;
    train_plan_model_config(tc, &cfg);
    MemPlan p;
    train_memory_plan(tc, &cfg, backend_plan, host_optimizer, device, &p);
    if (tc->json) mem_plan_print_json(&p, stdout);
    else mem_plan_print(&p, stdout);
    if (!tc->json) train_plan_print_optimizer(tc, &p, host_optimizer, stdout);
    return 0;
}

int train_planted_leak_class(void) {
    const char *e = getenv("LLMC_TEST_LEAK");
    if (!e || !e[0]) return -1;
    for (int c = 0; c < MEM_NUM_CLASSES; c++)
        if (strcmp(e, mem_class_names[c]) == 0) return c;
    llmc_die("LLMC_TEST_LEAK=%s: not a memory class name", e);
}

void train_check_leaks(int step, int base_step, size_t base[2][MEM_NUM_CLASSES]) {
    for (int device = 0; device < 2; device++)
        for (int c = 0; c < MEM_NUM_CLASSES; c++) {
            size_t now = mem_live((MemClass)c, device);
            if (step == base_step) base[device][c] = now;
            else if (step > base_step && now != base[device][c])
                llmc_die("memory leak: %s memory class '%s' grew from %zu bytes after step %d to %zu bytes after step %d",
                         device ? "device" : "host", mem_class_names[c], base[device][c], base_step, now, step);
        }
}

/* Planned against measured, after the first step: CPU the process's VmHWM less the runtime's
 * fixed overhead (VmRSS at process start); GPU from the backend's own figure (step_extras). */
void train_print_planned_vs_measured(const MemPlan *plan, Logger *lg) {
    size_t planned = mem_plan_peak(plan, 1, NULL), hwm = mem_process_hwm(), base = mem_process_start_rss();
    if (strcmp(plan->device, "CPU") != 0 || !hwm) return;
    double measured = (double)hwm - (double)base;
    printf("memory: planned peak %.1f MiB; measured VmHWM %.1f MiB = runtime overhead %.1f MiB (VmRSS at start) "
           "+ %.1f MiB; planned / measured %.4f\n",
           planned / 1048576.0, hwm / 1048576.0, base / 1048576.0, measured / 1048576.0, planned / measured);
    log_int(lg, "mem_planned_peak", (long long)planned);
    log_int(lg, "mem_measured_hwm", (long long)hwm);
    log_int(lg, "mem_runtime_overhead", (long long)base);
    log_double(lg, "mem_planned_over_measured", planned / measured);
}

