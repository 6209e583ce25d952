#include "llmc/cpu/training.h"

#include "llmc/core/mem.h"

void cpu_training_free(CpuTraining *tr, float *params, float *grads, float *acts, size_t acts_floats) {
    mem_free(MEM_PARAMETERS, params, tr->params_floats * sizeof(float));
    if (grads) mem_free(MEM_GRADIENTS, grads, tr->grads_floats * sizeof(float));
    cpu_zero_free(&tr->zs);
    if (acts) mem_free(MEM_ACTIVATIONS, acts, acts_floats * sizeof(float));
    if (tr->scratch_memory) mem_free(MEM_BWD_SCRATCH, tr->scratch_memory, tr->num_scratch * sizeof(float));
}

void cpu_training_print_memory(FILE *out, const char *what, size_t num_parameters, const char *note,
                               const TensorSpec *act_specs, int n_acts, const CpuTraining *tr, int has_grads) {
    const double MiB = 1048576.0;
    double kinds[ACT_NUM_KINDS] = {0};
    for (int i = 0; i < n_acts; i++) kinds[act_specs[i].kind] += act_specs[i].numel * sizeof(float);
    fprintf(out, "memory (CPU, fp32, %s): parameters %zu (%s%.1f MiB%s), ", what, num_parameters, note,
            tr->params_floats * sizeof(float) / MiB, tr->zs.zero == 3 ? " this shard" : "");
    if (tr->zs.zero == 3) fprintf(out, "parameters gathered %.1f MiB, ", tr->zs.gather_floats * sizeof(float) / MiB);
    fprintf(out, "gradients%s %.1f MiB, activations", tr->zs.zero >= 2 ? " (2 buckets, -z >= 2)" : "",
            (has_grads ? tr->grads_floats : 0) * sizeof(float) / MiB);
    for (int k = 0; k < ACT_NUM_KINDS; k++) fprintf(out, "%s %s %.1f MiB", k ? "," : "", activation_kind_names[k], kinds[k] / MiB);
    fprintf(out, ", backward scratch %.1f MiB\n", tr->num_scratch * sizeof(float) / MiB);
}

float *cpu_training_alloc_grads(CpuTraining *tr, size_t num_parameters) {
    tr->grads_floats = num_parameters;
    return (float *)mem_calloc(MEM_GRADIENTS, tr->grads_floats, sizeof(float), "gradients");
}

void cpu_training_shard(CpuTraining *tr, const TensorSpec *specs, int num_specs, int num_layers, size_t num_parameters,
                        int zero, int ranks, int rank, CpuShardHooks hooks, float **params, float **grads) {
    cpu_zero_shard(&tr->zs, specs, num_specs, num_layers, num_parameters, zero, ranks, rank, hooks, params,
                   &tr->params_floats, grads, &tr->grads_floats);
}

float *cpu_training_alloc_scratch(CpuTraining *tr, const MemPlan *plan, size_t N, size_t C) {
    tr->num_scratch = plan->host[MEM_BWD_SCRATCH] / sizeof(float);
    tr->scratch_memory = (float *)mem_calloc(MEM_BWD_SCRATCH, tr->num_scratch, sizeof(float), "backward scratch");
    tr->dresidual = tr->scratch_memory;
    tr->dbuf_c = tr->dresidual + N * C;
    return tr->dbuf_c + N * C;
}
