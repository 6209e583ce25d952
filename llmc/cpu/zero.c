#include "llmc/cpu/zero.h"

#include <string.h>

#include "llmc/core/check.h"

static void make_bucket(const CpuZero *z, int l, Bucket *b) { /* l < 0: the outer bucket */
    bucket_of_layer(b, z->specs, z->num_specs, l);
}

void cpu_zero_plan(const TensorSpec *specs, int num_specs, size_t num_parameters, int zero, int ranks, int rank, MemPlan *p) {
    size_t outer, layer;
    bucket_packing(specs, num_specs, &outer, &layer, NULL);
    p->host[MEM_GRADIENTS] = (outer + layer) * sizeof(float);
    if (zero < 3) return;
    p->host[MEM_PARAMETERS] = dist_shard_floats(num_parameters, zero, ranks, rank) * sizeof(float);
    p->host[MEM_PARAM_GATHER] = (outer + 2 * layer) * sizeof(float);
}

void cpu_zero_shard(CpuZero *z, const TensorSpec *specs, int num_specs, int num_layers, size_t num_parameters, int zero,
                    int ranks, int rank, CpuShardHooks hooks, float **params, size_t *params_floats, float **grads,
                    size_t *grads_floats) {
    if (zero < 2) return;
    if (!*grads) llmc_die("internal: ZeRO -z %d on a model allocated without training buffers", zero);
    if (num_specs > CPU_ZERO_MAX_TENSORS) llmc_die("internal: a bucket holds at most %d tensors", CPU_ZERO_MAX_TENSORS);
    MemPlan plan;
    mem_plan_init(&plan, "CPU");
    cpu_zero_plan(specs, num_specs, num_parameters, zero, ranks, rank, &plan);
    *z = (CpuZero){.zero = zero, .hooks = hooks, .specs = specs, .num_specs = num_specs, .num_layers = num_layers};
    bucket_packing(specs, num_specs, &z->outer_numel, &z->layer_numel, z->pos);
    mem_free(MEM_GRADIENTS, *grads, *grads_floats * sizeof(float));
    *grads_floats = plan.host[MEM_GRADIENTS] / sizeof(float);
    *grads = (float *)mem_calloc(MEM_GRADIENTS, *grads_floats, sizeof(float), "gradient buckets");
    if (zero < 3) return;
    size_t lo, hi, k = plan.host[MEM_PARAMETERS] / sizeof(float);
    dist_shard(num_parameters, ranks, rank, &lo, &hi);
    float *shard = (float *)mem_calloc(MEM_PARAMETERS, k, sizeof(float), "parameter shard");
    memcpy(shard, *params + lo, (hi - lo) * sizeof(float));
    mem_free(MEM_PARAMETERS, *params, *params_floats * sizeof(float));
    *params = shard;
    *params_floats = k;
    z->gather_floats = plan.host[MEM_PARAM_GATHER] / sizeof(float);
    z->gather_memory = (float *)mem_calloc(MEM_PARAM_GATHER, z->gather_floats, sizeof(float), "gathered parameters");
}

void cpu_zero_free(CpuZero *z) {
    mem_free(MEM_PARAM_GATHER, z->gather_memory, z->gather_floats * sizeof(float));
    memset(z, 0, sizeof *z);
}

void cpu_zero_gather_outer(CpuZero *z) {
    if (z->zero != 3) return;
    Bucket b;
    make_bucket(z, -1, &b);
    z->hooks.gather_begin(z->hooks.ctx, z->gather_memory, &b, 2);
    z->hooks.gather_end(z->hooks.ctx, 2);
}

static float *layer_slot(const CpuZero *z, int l) { return z->gather_memory + z->outer_numel + (size_t)(l & 1) * z->layer_numel; }

void cpu_zero_prefetch_layer(CpuZero *z, int l) {
    if (z->zero != 3 || l < 0 || l >= z->num_layers) return;
    Bucket b;
    make_bucket(z, l, &b);
    z->hooks.gather_begin(z->hooks.ctx, layer_slot(z, l), &b, l & 1);
}

void cpu_zero_use_layer(CpuZero *z, int l, int next) {
    if (z->zero != 3) return;
    z->hooks.gather_end(z->hooks.ctx, l & 1);
    z->cur_params = layer_slot(z, l);
    cpu_zero_prefetch_layer(z, next);
}

void cpu_zero_backward_begin(CpuZero *z, float *grads) {
    cpu_zero_prefetch_layer(z, z->num_layers - 1);
    if (z->zero >= 2) memset(grads, 0, z->outer_numel * sizeof(float));
}

void cpu_zero_layer_grads(CpuZero *z, float *grads) {
    if (z->zero < 2) return;
    z->cur_grads = grads + z->outer_numel;
    memset(z->cur_grads, 0, z->layer_numel * sizeof(float));
}

void cpu_zero_reduce_layer(CpuZero *z, int l) {
    if (z->zero < 2) return;
    Bucket b;
    make_bucket(z, l, &b);
    z->hooks.reduce(z->hooks.ctx, z->cur_grads, &b);
}

void cpu_zero_end_layers(CpuZero *z) {
    z->cur_params = NULL;
    z->cur_grads = NULL;
}

void cpu_zero_reduce_outer(CpuZero *z, float *grads) {
    if (z->zero < 2) return;
    Bucket b;
    make_bucket(z, -1, &b);
    z->hooks.reduce(z->hooks.ctx, grads, &b);
}
