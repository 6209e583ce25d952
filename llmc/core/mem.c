/*
 * mem.c - the memory classes, the plan's table and printing, the accounting allocator and the
 * process's resident-set figures (mem.h).
 */
#include "llmc/core/mem.h"
#include "llmc/core/check.h"
#include "llmc/core/optstate.h"

#include <stdlib.h>
#include <string.h>

const char *const mem_class_names[MEM_NUM_CLASSES] = {
    "parameters", "master_weights", "gradients", "adamw_m", "adamw_v", "gradient_shard", "parameter_gather", "activations",
    "backward_scratch", "op_scratch", "workspaces", "token_buffers", "host_staging", "dataloader", "blas_packing", "checkpoint_gather",
    "cudnn_workspace", "grad_compression", "nvme_ring", "test_leak"};
const int mem_class_accounted[MEM_NUM_CLASSES] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1};

void mem_plan_tables(MemPlan *p, size_t num_parameters, const TensorSpec *act, int n_acts, size_t act_floats,
                     int training) {
    if (n_acts > MODEL_MAX_ACTIVATIONS) llmc_die("internal: %d activation rows, MemPlan holds %d", n_acts, MODEL_MAX_ACTIVATIONS);
    p->num_parameters = num_parameters;
    p->recompute = 0;
    p->host[MEM_PARAMETERS] = num_parameters * sizeof(float);
    memset(p->act, 0, sizeof p->act);
    memset(p->act_bytes, 0, sizeof p->act_bytes);
    for (int i = 0; i < n_acts; i++) p->act[i] = act[i], p->act_bytes[i] = act[i].numel * sizeof(float);
    p->host[MEM_ACTIVATIONS] = act_floats * sizeof(float);
    if (training) p->host[MEM_GRADIENTS] = num_parameters * sizeof(float);
}

void mem_plan_init(MemPlan *p, const char *device) {
    memset(p, 0, sizeof *p);
    p->device = device;
    p->ranks = 1;
}

size_t mem_plan_peak(const MemPlan *p, int step_only, const char **phase) {
    size_t sum = 0;
    int gpu = strcmp(p->device, "GPU") == 0;
    for (int c = 0; c < MEM_NUM_CLASSES; c++) sum += gpu ? p->device_bytes[c] : p->host[c];
    size_t t = 0;
    if (!gpu && !step_only)
        for (int c = 0; c < MEM_NUM_CLASSES; c++) t += p->transient[c];
    if (phase)
        *phase = t ? "checkpoint save (every arena live, plus the whole m and v gathered on rank 0)"
                   : "backward (every arena is allocated for the run: all stored activations, the backward scratch, "
                     "gradients and optimizer state live at once)";
    return sum + t;
}

size_t mem_plan_accounted(const MemPlan *p, MemClass c, int device) { return device ? p->device_bytes[c] : p->host[c]; }

static double mib(size_t b) { return (double)b / 1048576.0; }

void mem_plan_print(const MemPlan *p, FILE *out) {
    int gpu = strcmp(p->device, "GPU") == 0;
    fprintf(out, "memory plan (%s, rank %d): %zu parameters, B %d, T %d, -r %d, %d rank%s, -z %d, -d %lld (%d accumulation steps), "
                 "--optim-state %s, --offload %s%s%s\n",
            p->device, p->rank, p->num_parameters, p->B, p->T, p->recompute, p->ranks, p->ranks == 1 ? "" : "s", p->zero,
            p->total_batch, p->accum, optstate_name(p->optim_state), p->offload ? "optimizer" : "none",
            p->config[0] ? ", " : "", p->config);
    fprintf(out, "  %-20s %16s %12s%s\n", "class", "bytes", "MiB", gpu ? "   (device)       host bytes" : "");
    for (int c = 0; c < MEM_NUM_CLASSES; c++) {
        size_t b = gpu ? p->device_bytes[c] : p->host[c];
        size_t h = p->host[c];
        if (c == MEM_TEST_LEAK || (!b && !h && !p->transient[c])) continue;
        if (gpu) fprintf(out, "  %-20s %16zu %12.1f %20zu\n", mem_class_names[c], b, mib(b), h);
        else if (p->transient[c])
            fprintf(out, "  %-20s %16zu %12.1f   (checkpoint save only)\n", mem_class_names[c], p->transient[c],
                    mib(p->transient[c]));
        else fprintf(out, "  %-20s %16zu %12.1f%s\n", mem_class_names[c], b, mib(b),
                     mem_class_accounted[c] ? "" : "   (allocated by a library, planned, not accounted)");
    }
    fprintf(out, "  activations by tensor (x L: one per layer; x 1: one copy):\n");
    for (int i = 0; i < MODEL_MAX_ACTIVATIONS && p->act[i].name; i++) { /* a shorter table ends at a NULL name */
        const TensorSpec *s = &p->act[i];
        fprintf(out, "    %-10s %-18s %s %16zu %12.1f\n", s->name, s->shape, s->per_layer ? "x L" : "x 1",
                p->act_bytes[i], mib(p->act_bytes[i]));
    }
    if (p->disk_bytes)
        fprintf(out, "  %-20s %16zu %12.1f   (disk: the AdamW moments' file under --nvme-path, not memory)\n", "nvme_disk",
                p->disk_bytes, mib(p->disk_bytes));
    const char *phase;
    size_t step = mem_plan_peak(p, 1, NULL), peak = mem_plan_peak(p, 0, &phase);
    fprintf(out, "  step peak %zu bytes (%.1f MiB)\n", step, mib(step));
    fprintf(out, "  peak %zu bytes (%.1f MiB, %.2f GiB) of the %s, in %s\n", peak, mib(peak), mib(peak) / 1024.0,
            gpu ? "device" : "process (plus the runtime's fixed overhead)", phase);
}

void mem_plan_print_json(const MemPlan *p, FILE *out) {
    int gpu = strcmp(p->device, "GPU") == 0;
    const char *phase;
    size_t peak = mem_plan_peak(p, 0, &phase);
    fprintf(out, "{\"device\": \"%s\", \"parameters\": %zu, \"B\": %d, \"T\": %d, \"recompute\": %d, \"ranks\": %d, \"rank\": %d, "
                 "\"zero\": %d, \"optim_state\": \"%s\", \"offload\": %d, \"total_batch\": %lld, \"accum\": %d, \"peak_bytes\": %zu, \"step_peak_bytes\": %zu, "
                 "\"peak_phase\": \"%s\", \"classes\": {",
            p->device, p->num_parameters, p->B, p->T, p->recompute, p->ranks, p->rank, p->zero, optstate_name(p->optim_state),
            p->offload, p->total_batch, p->accum, peak,
            mem_plan_peak(p, 1, NULL), phase);
    int first = 1;
    for (int c = 0; c < MEM_NUM_CLASSES; c++) {
        if (c == MEM_TEST_LEAK) continue;
        fprintf(out, "%s\"%s\": %zu", first ? "" : ", ", mem_class_names[c],
                c == MEM_CHECKPOINT ? p->transient[c] : gpu ? p->device_bytes[c] : p->host[c]);
        first = 0;
    }
    fprintf(out, "}, \"host_classes\": {");
    for (int c = 0; c < MEM_TEST_LEAK; c++) fprintf(out, "%s\"%s\": %zu", c ? ", " : "", mem_class_names[c], p->host[c]);
    if (p->disk_bytes) fprintf(out, "}, \"disk_bytes\": %zu, \"activations\": {", p->disk_bytes);
    else fprintf(out, "}, \"activations\": {");
    for (int i = 0; i < MODEL_MAX_ACTIVATIONS && p->act[i].name; i++)
        fprintf(out, "%s\"%s\": %zu", i ? ", " : "", p->act[i].name, p->act_bytes[i]);
    fprintf(out, "}}\n");
}

/* ---- the accounting allocator ---- */
static size_t live[2][MEM_NUM_CLASSES], live_total[2], peak_total[2];

void mem_account(MemClass c, long long delta, int device) {
    live[device][c] += (size_t)delta; /* unsigned wrap: a negative delta subtracts */
    live_total[device] += (size_t)delta;
    if (live_total[device] > peak_total[device]) peak_total[device] = live_total[device];
}

void *mem_calloc(MemClass c, size_t n, size_t size, const char *what) {
    void *p = callocCheck(n ? n : 1, size, what);
    mem_account(c, (long long)((n ? n : 1) * size), 0);
    return p;
}

void mem_free(MemClass c, void *p, size_t bytes) {
    if (!p) return;
    free(p);
    mem_account(c, -(long long)bytes, 0);
}

size_t mem_live(MemClass c, int device) { return live[device][c]; }
size_t mem_live_total(int device) { return live_total[device]; }
size_t mem_peak_total(int device) { return peak_total[device]; }

void mem_check_plan(const MemPlan *p) {
    for (int device = 0; device < 2; device++)
        for (int c = 0; c < MEM_NUM_CLASSES; c++) {
            if (!mem_class_accounted[c] || c == MEM_TEST_LEAK) continue;
            size_t planned = device ? p->device_bytes[c] : p->host[c];
            if (live[device][c] != planned)
                llmc_die("internal: %s memory class '%s': allocated %zu bytes but the plan says %zu (a bug: the plan "
                         "and the allocation code disagree)",
                         device ? "device" : "host", mem_class_names[c], live[device][c], planned);
        }
}

static size_t proc_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t v = 0, n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) {
            v = (size_t)strtoull(line + n, NULL, 10);
            break;
        }
    fclose(f);
    return v * 1024;
}
size_t mem_process_rss(void) { return proc_status_kib("VmRSS:"); }
size_t mem_process_hwm(void) { return proc_status_kib("VmHWM:"); }

static size_t start_rss;
__attribute__((constructor)) static void note_start_rss(void) { start_rss = mem_process_rss(); }
size_t mem_process_start_rss(void) { return start_rss; }
