#include "llmc/train/optim.h"
#include "llmc/core/check.h"
#include "llmc/cpu/adamw.h"
#include "llmc/core/optstate.h"
#include "llmc/core/mem.h"
#include "llmc/train/nvme.h"
#include "llmc/dist/layout.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void optim_init(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs) {
    optim_init_state(o, d, zero, n, specs, num_specs, OPTSTATE_FP32);
}

void optim_init_state(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs, int state) {
    optim_init_nvme(o, d, zero, n, specs, num_specs, state, NULL);
}

void optim_init_nvme(Optimizer *o, Dist *d, int zero, size_t n, const TensorSpec *specs, int num_specs, int state,
                     const char *nvme_dir) {
    *o = (Optimizer){.dist = d, .zero = zero, .n = n, .specs = specs, .num_specs = num_specs, .state = state,
                     .lo = 0, .hi = n, .tp = dist_tp_group()};
    if (zero >= 1) dist_shard(n, d->size, d->rank, &o->lo, &o->hi);
    size_t k = dist_shard_floats(n, zero, d->size, d->rank);
    size_t mb = optim_moment_bytes(n, zero, d->size, d->rank, state);
    if (nvme_dir && nvme_dir[0]) {
        o->nvme = nvme_open(nvme_dir, d->rank, o->hi - o->lo, state);
    } else {
        o->m = (float *)mem_calloc(MEM_ADAM_M, mb, 1, "AdamW m");
        o->v = (float *)mem_calloc(MEM_ADAM_V, mb, 1, "AdamW v");
    }
    if (zero >= 2) {
        o->gshard = (float *)mem_calloc(MEM_GRAD_SHARD, k, sizeof(float), "gradient shard");
        o->parts = (int *)mallocCheck(4 * 2 * (size_t)d->size * sizeof(int), "bucket parts");
    }
}

size_t optim_moment_bytes(size_t n, int zero, int ranks, int rank, int state) {
    return optstate_bytes(dist_shard_floats(n, zero, ranks, rank), state);
}

void optim_free(Optimizer *o) {
    size_t k = dist_shard_floats(o->n, o->zero, o->dist->size, o->dist->rank) * sizeof(float);
    size_t mb = optim_moment_bytes(o->n, o->zero, o->dist->size, o->dist->rank, o->state);
    mem_free(MEM_ADAM_M, o->m, mb);
    mem_free(MEM_ADAM_V, o->v, mb);
    nvme_close(o->nvme);
    mem_free(MEM_GRAD_SHARD, o->gshard, k);
    free(o->parts);
    memset(o, 0, sizeof *o);
}

float optim_loss_weight(const Optimizer *o, int accum) { return 1.0f / ((float)accum * (float)o->dist->size); }

void optim_reduce(Optimizer *o, float *grads) {
    if (o->zero < 2) dist_allreduce_f32(o->dist, grads, o->n);
}

void optim_zero_grad(Optimizer *o) {
    if (o->gshard) memset(o->gshard, 0, dist_shard_floats(o->n, o->zero, o->dist->size, o->dist->rank) * sizeof(float));
}

/* Every rank's run of b (counts, then displacements, into o->parts slot) */
static int *bucket_parts(Optimizer *o, const Bucket *b, int slot) {
    const int P = o->dist->size;
    int *counts = o->parts + (size_t)slot * 2 * P;
    for (int r = 0; r < P; r++) {
        size_t lo, hi, pos, count;
        dist_shard(o->n, P, r, &lo, &hi);
        bucket_part(b, lo, hi, &pos, &count);
        if (count > (size_t)INT_MAX || pos > (size_t)INT_MAX) llmc_die("a bucket of %zu floats exceeds what one MPI call takes", b->numel);
        counts[r] = (int)count;
        counts[P + r] = (int)pos;
    }
    return counts;
}

void optim_reduce_bucket(Optimizer *o, float *packed, const Bucket *b) {
    int *counts = bucket_parts(o, b, 3);
    dist_reduce_scatter_parts_f32(o->dist, packed, counts);
    /* a single process keeps its run where it is: it is the whole bucket, at 0 */
    bucket_shard_copy(b, o->lo, o->hi, packed, o->gshard, 1);
}

void optim_gather_bucket_begin(Optimizer *o, const float *pshard, float *packed, const Bucket *b, int slot) {
    int *counts = bucket_parts(o, b, slot);
    bucket_shard_copy(b, o->lo, o->hi, packed, (float *)pshard, 0);
    dist_allgather_parts_begin(o->dist, packed, counts, counts + o->dist->size, &o->gather[slot]);
}

void optim_gather_bucket_end(Optimizer *o, int slot) { dist_wait_request(o->dist, &o->gather[slot], "parameter all-gather"); }

void optim_gather_params(Optimizer *o, const float *pshard, float *full) { dist_gather_f32(o->dist, pshard, full, o->n); }

/* -tp (-z 0/1): the whole model's norm, each element counted once: the split tensors' squares summed
 * over the tensor-parallel group, the whole ones (the same on every rank of it) taken once. */
static float tp_grad_norm(Optimizer *o, const float *grads) {
    double split = 0.0, whole = 0.0;
    for (int i = 0; i < o->num_specs; i++) {
        double ss = global_norm_squared(grads + o->specs[i].offset, o->specs[i].numel);
        if (o->specs[i].split.kind != TENSOR_SPLIT_NONE) split += ss;
        else whole += ss;
    }
    dist_allreduce_f64(o->tp, &split, 1);
    return (float)sqrt(split + whole);
}

float optim_grad_norm(Optimizer *o, const float *grads) {
    if (o->zero < 2 && o->tp && o->tp->size > 1) return tp_grad_norm(o, grads);
    if (o->zero < 2) return (float)sqrt(global_norm_squared(grads, o->n)); /* identical grads everywhere */
    double ss = o->hi > o->lo ? global_norm_squared(o->gshard, o->hi - o->lo) : 0.0;
    dist_allreduce_f64(o->dist, &ss, 1);
    return (float)sqrt(ss);
}

/* --offload-device nvme: the update of one chunk [c0, c0 + count) of the shard, its m and v in the
 * ring: per element optim_step's arithmetic (fp32: adamw_update over each tensor's part; compact
 * states: adamw_update_compact over the chunk's blocks, which are the shard's blocks) */
typedef struct {
    const Optimizer *o;
    float *p;
    const float *g;
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int t;
} NvmeUpdate;

static void nvme_update_chunk(void *ctx, size_t c0, size_t count, void *m, void *v) {
    const NvmeUpdate *u = (const NvmeUpdate *)ctx;
    const Optimizer *o = u->o;
    const size_t lo = o->lo + c0, hi = lo + count; /* global indices */
    if (o->state != OPTSTATE_FP32) {
        OptSegments seg;
        optstate_segments(&seg, o->specs, o->num_specs, lo, hi, u->weight_decay);
        adamw_update_compact(u->p + c0, u->g + c0, m, v, o->state, count, &seg, u->lr, u->beta1, u->beta2, u->eps, u->t,
                             u->grad_scale);
        return;
    }
    for (int i = 0; i < o->num_specs; i++) {
        const TensorSpec *s = &o->specs[i];
        size_t a = s->offset > lo ? s->offset : lo;
        size_t b = s->offset + s->numel < hi ? s->offset + s->numel : hi;
        if (a >= b) continue;
        adamw_update(u->p + (a - o->lo), u->g + (a - o->lo), (float *)m + (a - lo), (float *)v + (a - lo), b - a, u->lr,
                     u->beta1, u->beta2, u->eps, s->decay ? u->weight_decay : 0.0f, u->t, u->grad_scale);
    }
}

void optim_step(Optimizer *o, float *params, const float *grads, float lr, float beta1, float beta2, float eps,
                float weight_decay, int t, float grad_scale) {
    /* the shard's gradients: the summed gradient's [lo, hi); -z 3: params is the shard */
    const float *g = o->zero >= 2 ? o->gshard : grads + o->lo;
    float *p = o->zero == 3 ? params : params + o->lo;
    if (o->nvme) {
        NvmeUpdate u = {o, p, g, lr, beta1, beta2, eps, weight_decay, grad_scale, t};
        nvme_stream(o->nvme, nvme_update_chunk, &u);
        if (o->zero == 1 || o->zero == 2) dist_allgather_f32(o->dist, params, o->n);
        return;
    }
    if (o->state != OPTSTATE_FP32) {
        if (o->hi > o->lo) {
            OptSegments seg;
            optstate_segments(&seg, o->specs, o->num_specs, o->lo, o->hi, weight_decay);
            adamw_update_compact(p, g, o->m, o->v, o->state, o->hi - o->lo, &seg, lr, beta1, beta2, eps, t, grad_scale);
        }
        if (o->zero == 1 || o->zero == 2) dist_allgather_f32(o->dist, params, o->n);
        return;
    }
    for (int i = 0; i < o->num_specs; i++) {
        const TensorSpec *s = &o->specs[i];
        size_t a = s->offset > o->lo ? s->offset : o->lo;
        size_t b = s->offset + s->numel < o->hi ? s->offset + s->numel : o->hi;
        if (a >= b) continue;
        adamw_update(p + (a - o->lo), g + (a - o->lo), o->m + (a - o->lo), o->v + (a - o->lo), b - a, lr, beta1, beta2,
                     eps, s->decay ? weight_decay : 0.0f, t, grad_scale);
    }
    if (o->zero == 1 || o->zero == 2) dist_allgather_f32(o->dist, params, o->n);
}

int optim_state_whole_for(int zero, int state) { return zero == 0 && state == OPTSTATE_FP32; }
int optim_state_is_whole(const Optimizer *o) { return !o->nvme && optim_state_whole_for(o->zero, o->state); }
int optim_state_streamed_for(int zero, int state) { return zero == 0 && state != OPTSTATE_FP32; }

const float *optim_moment_chunk(void *p, int is_v, size_t offset, size_t count, float *x) {
    const Optimizer *o = (const Optimizer *)p;
    const size_t k = o->hi - o->lo, b0 = offset / OPTSTATE_BLOCK, nb = optstate_blocks(count);
    if (o->zero != 0 || offset % OPTSTATE_BLOCK || offset + count > k)
        llmc_die("optim_moment_chunk: [%zu, %zu) is not a block-aligned range of a whole moment (-z %d, %zu elements)",
                 offset, offset + count, o->zero, k);
    if (o->nvme) {
        nvme_read(o->nvme, is_v, offset, count, x);
        return x;
    }
    const void *state = is_v ? (const void *)o->v : (const void *)o->m;
#pragma omp parallel for schedule(static)
    for (long long b = 0; b < (long long)nb; b++)
        optstate_load_block(state, o->state, is_v, k, b0 + (size_t)b, x + (size_t)b * OPTSTATE_BLOCK);
    return x;
}

void optim_gather_state(Optimizer *o, float *m, float *v) {
    if (o->nvme) { /* decoded from the file: straight into m, v (-z 0, rank 0), else gathered */
        const size_t k = o->hi - o->lo;
        if (o->zero == 0) {
            if (o->dist->rank != 0) return;
            nvme_read(o->nvme, 0, 0, k, m);
            nvme_read(o->nvme, 1, 0, k, v);
            return;
        }
        float *x = (float *)mallocCheck((k ? k : 1) * sizeof(float), "AdamW moment (read for a checkpoint)");
        nvme_read(o->nvme, 0, 0, k, x);
        dist_gather_f32(o->dist, x, m, o->n);
        nvme_read(o->nvme, 1, 0, k, x);
        dist_gather_f32(o->dist, x, v, o->n);
        free(x);
        return;
    }
    if (o->state != OPTSTATE_FP32) { /* decoded to fp32, one moment at a time */
        const size_t k = o->hi - o->lo;
        if (o->zero == 0) {
            if (o->dist->rank != 0) return;
            optstate_decode(o->m, o->state, 0, k, m);
            optstate_decode(o->v, o->state, 1, k, v);
            return;
        }
        float *x = (float *)mallocCheck((k ? k : 1) * sizeof(float), "AdamW moment (decoded for a checkpoint)");
        optstate_decode(o->m, o->state, 0, k, x);
        dist_gather_f32(o->dist, x, m, o->n);
        optstate_decode(o->v, o->state, 1, k, x);
        dist_gather_f32(o->dist, x, v, o->n);
        free(x);
        return;
    }
    if (o->zero == 0) { /* every rank has it all: rank 0's copy is the checkpoint's */
        if (o->dist->rank != 0) return;
        memcpy(m, o->m, o->n * sizeof(float));
        memcpy(v, o->v, o->n * sizeof(float));
        return;
    }
    dist_gather_f32(o->dist, o->m, m, o->n);
    dist_gather_f32(o->dist, o->v, v, o->n);
}

void optim_load_state(Optimizer *o, const float *m, const float *v) {
    if (o->nvme) {
        nvme_write_all(o->nvme, m + o->lo, v + o->lo);
        return;
    }
    if (o->state != OPTSTATE_FP32) {
        optstate_encode(o->m, o->state, 0, o->hi - o->lo, m + o->lo);
        optstate_encode(o->v, o->state, 1, o->hi - o->lo, v + o->lo);
        return;
    }
    memcpy(o->m, m + o->lo, (o->hi - o->lo) * sizeof(float));
    memcpy(o->v, v + o->lo, (o->hi - o->lo) * sizeof(float));
}

void optim_print_memory(const Optimizer *o, FILE *out) {
    const double MiB = 1048576.0;
    size_t k = o->hi - o->lo, mb = optstate_bytes(k, o->state);
    static const char *const what[] = {"not sharded", "moments sharded", "moments + gradients sharded",
                                       "moments + gradients + parameters sharded"};
    if (o->nvme) nvme_print(o->nvme, out);
    fprintf(out, "optimizer (per rank, -z %d: %s, %d rank%s, %s moments): AdamW m %zu bytes (%.1f MiB), AdamW v %zu bytes "
                 "(%.1f MiB)%s, reduced gradient %zu bytes (%.1f MiB), parameters %zu bytes (%.1f MiB)\n",
            o->zero, what[o->zero], o->dist->size, o->dist->size == 1 ? "" : "s", optstate_name(o->state), mb,
            mb / MiB, mb, mb / MiB, o->nvme ? " (on disk, not in memory)" : "",
            (o->zero >= 2 ? k : o->n) * sizeof(float), (o->zero >= 2 ? k : o->n) * sizeof(float) / MiB,
            (o->zero == 3 ? k : o->n) * sizeof(float), (o->zero == 3 ? k : o->n) * sizeof(float) / MiB);
}

/* ---- the update in buckets ---- */
int optim_num_buckets(const Optimizer *o) {
    int layers = 0;
    for (int i = 0; i < o->num_specs; i++)
        if (o->specs[i].layer_numel && (int)(o->specs[i].numel / o->specs[i].layer_numel) > layers)
            layers = (int)(o->specs[i].numel / o->specs[i].layer_numel);
    return layers + 1;
}

void optim_bucket(const Optimizer *o, int k, Bucket *b) { bucket_of_layer(b, o->specs, o->num_specs, k - 1); }

double optim_bucket_sumsq(const float *grads, const Bucket *b) {
    double s = 0.0;
    for (int i = 0; i < b->n; i++) s += global_norm_squared(grads + b->off[i], b->len[i]);
    return s;
}

float optim_grad_norm_buckets(Optimizer *o, const float *grads, const double *sumsq) {
    if (o->zero >= 2) return optim_grad_norm(o, grads);
    double ss = 0.0;
    Bucket b;
    for (int k = 0; k < optim_num_buckets(o); k++) {
        if (!sumsq) optim_bucket(o, k, &b);
        ss += sumsq ? sumsq[k] : optim_bucket_sumsq(grads, &b);
    }
    return (float)sqrt(ss);
}

/* The decay of the tensor holding flat index i. */
static float decay_at(const Optimizer *o, size_t i, float weight_decay) {
    for (int s = 0; s < o->num_specs; s++)
        if (i >= o->specs[s].offset && i < o->specs[s].offset + o->specs[s].numel) return o->specs[s].decay ? weight_decay : 0.0f;
    return 0.0f;
}

void optim_step_buckets(Optimizer *o, float *params, const float *grads, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int t, float grad_scale, OptimBucketDone bucket_done, void *ctx) {
    const int nb = optim_num_buckets(o), trace = getenv("LLMC_TEST_TRACE_BUCKETS") != NULL;
    Bucket b;
    /* -z 3: the parameters are this rank's shard, no per-bucket copies to make; --offload-device
     * nvme: the moments stream in the file's (flat) order, each bucket's parameters final at the end */
    if (o->zero == 3 || o->nvme) {
        optim_step(o, params, grads, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
        for (int k = 0; k < nb && bucket_done; k++) optim_bucket(o, k, &b), bucket_done(ctx, &b);
        return;
    }
    const float *g = o->zero >= 2 ? o->gshard : grads + o->lo; /* as optim_step */
    float *p = params + o->lo;
    const size_t k_shard = o->hi - o->lo;
    OptSegments seg;
    unsigned char *done = NULL; /* compact states: a block holds elements of two buckets; updated once */
    if (o->state != OPTSTATE_FP32 && k_shard) {
        optstate_segments(&seg, o->specs, o->num_specs, o->lo, o->hi, weight_decay);
        done = (unsigned char *)callocCheck(optstate_blocks(k_shard), 1, "AdamW blocks updated");
    }
    const int gather = o->zero == 1 || o->zero == 2;
    for (int k = 0; k < nb; k++) {
        optim_bucket(o, k, &b);
        for (int i = 0; i < b.n; i++) {
            size_t a, n = bucket_slice_in(&b, i, o->lo, o->hi, &a);
            if (!n) continue;
            a -= o->lo; /* shard-local: [a, e) */
            const size_t e = a + n;
            if (!done) { /* a slice lies in one tensor */
                adamw_update(p + a, g + a, o->m + a, o->v + a, e - a, lr, beta1, beta2, eps,
                             decay_at(o, b.off[i], weight_decay), t, grad_scale);
                continue;
            }
            size_t b0 = a / OPTSTATE_BLOCK, b1 = (e + OPTSTATE_BLOCK - 1) / OPTSTATE_BLOCK;
            while (b0 < b1) { /* the runs of blocks not yet updated */
                while (b0 < b1 && done[b0]) b0++;
                size_t r = b0;
                while (r < b1 && !done[r]) done[r++] = 1;
                if (r > b0)
                    adamw_update_compact_blocks(p, g, o->m, o->v, o->state, k_shard, &seg, b0, r, lr, beta1, beta2, eps,
                                                t, grad_scale);
                b0 = r;
            }
        }
        if (trace) printf("trace: update of parameter bucket %d done\n", k - 1);
        if (bucket_done && !gather) bucket_done(ctx, &b);
    }
    free(done);
    if (!gather) return;
    dist_allgather_f32(o->dist, params, o->n);
    for (int k = 0; k < nb && bucket_done; k++) optim_bucket(o, k, &b), bucket_done(ctx, &b);
}
