#include "llmc/cpu/gpt2.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"
#include "llmc/core/mem.h"
#include "llmc/core/sumfile.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/lora.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/qbase.h"
#include "llmc/cpu/residual.h"

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

/* ---- tensor parallelism (-tp N, Megatron's split; the table's split column) ------------------ */
static int tp_size(const GPT2 *model) { return model->tp ? model->tp->size : 1; }

void gpt2_tp_split(GPT2 *model, Dist *tp) {
    if (!tp || tp->size == 1) return;
    const char *bad = gpt2_tp_validate(&model->cfg, tp->size);
    if (bad) llmc_die("-tp %d: %s", tp->size, bad);
    if (model->acts_memory || model->grads_memory) llmc_die("internal: gpt2_tp_split after gpt2_allocate");
    TensorSpec local[NUM_PARAMETER_TENSORS];
    size_t n = gpt2_parameter_specs_tp(&model->cfg, tp->size, local);
    float *mine = (float *)mem_calloc(MEM_PARAMETERS, n, sizeof(float), "parameters (this tensor-parallel rank's)");
    tensor_split_copy(model->param_specs, local, NUM_PARAMETER_TENSORS, tp->size, tp->rank, model->params_memory, mine, 1);
    mem_free(MEM_PARAMETERS, model->params_memory, model->train.params_floats * sizeof(float));
    model->params_memory = mine;
    model->num_parameters = model->train.params_floats = n;
    memcpy(model->param_specs, local, sizeof local);
    gpt2_point_parameters(&model->params, mine, local);
    model->tp = tp;
}

/* A row-parallel product's output (N, C): every rank's partial sum added over the group, then the
 * bias (whole on every rank, added once). Without -tp the matmul added the bias already. */
static void tp_sum_rows(const GPT2 *model, float *out, const float *bias, int N, int C) {
    if (tp_size(model) == 1) return;
    dist_allreduce_f32(model->tp, out, (size_t)N * C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] += bias[c];
}
/* A column-parallel product's input gradient (N, C): each rank's part summed over the group. */
static void tp_sum_input_grad(const GPT2 *model, float *dinp, int N, int C) {
    if (tp_size(model) > 1) dist_allreduce_f32(model->tp, dinp, (size_t)N * C);
}

/* ---- the vocabulary-parallel wte, tied LM head and cross-entropy (-tp, as Megatron) ----------
 * When the table splits wte (its split column: rows, the vocabulary), rank r holds rows [lo, lo + Vr)
 * of it, Vr = Vp/tp, and its Vr columns of the logits; the full logits are never gathered. */
static int tp_vocab_split(const GPT2 *model, int *lo, int *Vr) {
    const TensorSpec *s = &model->param_specs[GPT2_P_wte];
    if (tp_size(model) == 1 || s->split.kind == TENSOR_SPLIT_NONE) return 0;
    *Vr = (int)(s->split.dim / (size_t)tp_size(model));
    *lo = model->tp->rank * *Vr;
    return 1;
}

/* encoded = wte[inputs] + wpe: each rank writes the rows of the tokens in its slice (zeros for the
 * others), one all-reduce over the group (one nonzero term per element: exactly wte's row), then wpe. */
static void tp_encoder_forward(const GPT2 *model, float *out, const int *inp, const float *wte, const float *wpe, int B,
                               int T, int C) {
    int lo, Vr;
    tp_vocab_split(model, &lo, &Vr);
    const size_t N = (size_t)B * T;
    for (size_t bt = 0; bt < N; bt++) {
        float *o = out + bt * C;
        const int k = inp[bt] - lo;
        if (k >= 0 && k < Vr) memcpy(o, wte + (size_t)k * C, (size_t)C * sizeof(float));
        else zero(o, (size_t)C);
    }
    dist_allreduce_f32(model->tp, out, N * C);
    for (size_t bt = 0; bt < N; bt++)
        for (int c = 0; c < C; c++) out[bt * C + c] += wpe[(bt % (size_t)T) * C + c];
}

/* encoder_backward over this rank's rows: dwpe (whole) from every position, dwte (its slice) from the
 * positions whose token it holds; dout is the same on every rank (no communication). The same (b, t)
 * order per channel as encoder_backward. */
static void tp_encoder_backward(const GPT2 *model, float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                                int T, int C) {
    int lo, Vr;
    tp_vocab_split(model, &lo, &Vr);
    enum { CB = 64 };
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int c1 = c0 + CB < C ? c0 + CB : C;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            const int k = inp[bt] - lo;
            float *dpe = dwpe + (size_t)(bt % T) * C, *dwe = k >= 0 && k < Vr ? dwte + (size_t)k * C : NULL;
            for (int c = c0; c < c1; c++) dpe[c] += d[c];
            if (dwe)
                for (int c = c0; c < c1; c++) dwe[c] += d[c];
        }
    }
}

/* fused_classifier over the vocabulary slices (logits: (N, Vr), this rank's columns lo..lo+Vr-1, of
 * which those below V are real): each row's max over the group (all-gathered, then the max), then the
 * sums of exps and the target's logit (the one rank that holds it) summed over the group in double;
 * every rank gets every position's loss; dlogits (dloss != 0) for this rank's slice only. */
static void tp_classifier(const GPT2 *model, float *logits, float *losses, const int *targets, float dloss, int N, int V,
                          int write_dlogits) {
    int lo, Vr;
    tp_vocab_split(model, &lo, &Vr);
    const int tp = model->tp->size, nv = V - lo < 0 ? 0 : V - lo > Vr ? Vr : V - lo; /* the real columns held */
    float *maxes = (float *)mallocCheck((size_t)tp * N * sizeof(float), "vocabulary-parallel maxima");
    double *sums = (double *)mallocCheck(2 * (size_t)N * sizeof(double), "vocabulary-parallel sums");
    float *mine = maxes + (size_t)model->tp->rank * N;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *z = logits + (size_t)i * Vr;
        float m = -INFINITY;
        for (int v = 0; v < nv; v++) m = z[v] > m ? z[v] : m;
        mine[i] = m;
    }
    dist_allgather_f32(model->tp, maxes, (size_t)tp * N);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float m = maxes[i];
        for (int r = 1; r < tp; r++) m = maxes[(size_t)r * N + i] > m ? maxes[(size_t)r * N + i] : m;
        maxes[i] = m;
        const float *z = logits + (size_t)i * Vr;
        double sum = 0.0;
        for (int v = 0; v < nv; v++) sum += expf(z[v] - m);
        const int k = targets[i] - lo;
        sums[2 * i] = sum;
        sums[2 * i + 1] = k >= 0 && k < nv ? (double)z[k] : 0.0;
    }
    dist_allreduce_f64(model->tp, sums, 2 * N);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *z = logits + (size_t)i * Vr;
        const float m = maxes[i];
        const double sum = sums[2 * i];
        losses[i] = (float)log(sum) + m - (float)sums[2 * i + 1];
        if (!write_dlogits) continue;
        const float inv = (float)(1.0 / sum);
        for (int v = 0; v < nv; v++) z[v] = expf(z[v] - m) * inv * dloss;
        const int k = targets[i] - lo;
        if (k >= 0 && k < nv) z[k] -= dloss;
        for (int v = nv; v < Vr; v++) z[v] = 0.0f;
    }
    free(maxes), free(sums);
}

/* LLMC_TEST_TP_CHECK=1 (tests): the gradients of the tensors that are whole on every rank must be
 * bit-identical over the group after each backward (every rank computes them from the same summed
 * inputs); dies otherwise. */
static void tp_check_replicated(const GPT2 *model) {
    static int said;
    const char *e = getenv("LLMC_TEST_TP_CHECK");
    if (tp_size(model) == 1 || !e || !e[0] || !model->grads_memory) return;
    uint32_t crc = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)
        if (model->param_specs[i].split.kind == TENSOR_SPLIT_NONE)
            crc = sumfile_crc_update(crc, model->grads_memory + model->param_specs[i].offset,
                                     model->param_specs[i].numel * sizeof(float));
    uint64_t all[64];
    if (model->tp->size > 64) return;
    dist_allgather_u64(model->tp, crc, all);
    for (int r = 1; r < model->tp->size; r++)
        if (all[r] != all[0])
            llmc_die("LLMC_TEST_TP_CHECK: the replicated tensors' gradients differ between tensor-parallel ranks 0 and %d "
                     "(crc32 %08x, %08x)", r, (unsigned)all[0], (unsigned)all[r]);
    if (!said++)
        fprintf(stderr, "tp check: the replicated tensors' gradients are bit-identical on the %d tensor-parallel ranks\n",
                model->tp->size);
}

void gpt2_build(GPT2 *model, const ModelConfig *cfg) {
    memset(model, 0, sizeof *model);
    model->cfg = *cfg;
    model->num_parameters = gpt2_parameter_specs(cfg, model->param_specs);
    model->params_memory = (float *)mem_calloc(MEM_PARAMETERS, model->num_parameters, sizeof(float), "parameters");
    model->train.params_floats = model->num_parameters;
    gpt2_point_parameters(&model->params, model->params_memory, model->param_specs);
}

void gpt2_build_random(GPT2 *model, const ModelConfig *cfg, unsigned long long seed) {
    const char *bad = gpt2_config_validate(cfg);
    if (bad) llmc_die("invalid model configuration: %s", bad);
    gpt2_build(model, cfg);
    gpt2_init_parameters(cfg, model->param_specs, model->params_memory, seed);
}

void gpt2_plan(const ModelConfig *cfg, int B, int T, int recompute, int training, MemPlan *p) {
    gpt2_plan_tp(cfg, 1, B, T, recompute, training, p);
}

void gpt2_plan_tp(const ModelConfig *cfg, int tp, int B, int T, int recompute, int training, MemPlan *p) {
    p->num_parameters = gpt2_parameter_specs_tp(cfg, tp, NULL);
    p->recompute = recompute;
    p->host[MEM_PARAMETERS] = p->num_parameters * sizeof(float);
    p->host[MEM_ACTIVATIONS] = gpt2_activation_specs_tp(cfg, B, T, recompute, tp, p->act) * sizeof(float);
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) p->act_bytes[i] = p->act[i].numel * sizeof(float);
    if (!training) return;
    p->host[MEM_GRADIENTS] = p->num_parameters * sizeof(float);
    /* dresidual, dbuf_c (B,T,C each); dbuf_f1 (B,T,max(F,QKV)), dbuf_f2 (B,T,F): see GPT2 (-tp: F and
     * QKV are this rank's F/tp and QKV/tp) */
    size_t N = (size_t)B * T, C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden / (size_t)tp;
    size_t QKV = (size_t)(cfg->num_heads + 2 * cfg->num_kv_heads) * (C / cfg->num_heads) / (size_t)tp;
    p->host[MEM_BWD_SCRATCH] = N * (2 * C + (F > QKV ? F : QKV) + F) * sizeof(float);
    /* the sgemm's own buffer at its largest call over the linear layers (out, in) */
    const size_t layers[][2] = {{QKV, C}, {C, C / (size_t)tp}, {F, C}, {C, F}, {(size_t)cfg->padded_vocab_size / (size_t)tp, C}};
    p->host[MEM_BLAS_PACKING] = matmul_blas_buffer_bytes(N, layers, 5);
}

void gpt2_allocate(GPT2 *model, int B, int T, int recompute, int training) {
    const ModelConfig *cfg = &model->cfg;
    if (T > cfg->max_seq_len)
        llmc_die("sequence length -t %d exceeds the model's maximum %d (maxT)", T, cfg->max_seq_len);
    if (recompute < 0 || recompute > 2)
        llmc_die("recompute level -r %d is not available on the CPU (0, 1 or 2)", recompute);
    model->B = B;
    model->T = T;
    model->recompute = recompute;
    MemPlan plan;
    mem_plan_init(&plan, "CPU");
    gpt2_plan_tp(cfg, tp_size(model), B, T, recompute, training, &plan);
    memcpy(model->act_specs, plan.act, sizeof model->act_specs);
    model->num_activations = plan.host[MEM_ACTIVATIONS] / sizeof(float);
    model->acts_memory = (float *)mem_calloc(MEM_ACTIVATIONS, model->num_activations, sizeof(float), "activations");
    gpt2_point_activations(&model->acts, model->acts_memory, model->act_specs);
    if (!training) return;
    const size_t tp = (size_t)tp_size(model);
    size_t N = (size_t)B * T, C = (size_t)cfg->channels, F = (size_t)cfg->ffn_hidden / tp;
    size_t QKV = (size_t)(cfg->num_heads + 2 * cfg->num_kv_heads) * (C / cfg->num_heads) / tp;
    size_t F1 = F > QKV ? F : QKV; /* dbuf_f1 holds dfch_gelu (F) and later dqkv (QKV) (-tp: this rank's) */
    model->train.num_scratch = plan.host[MEM_BWD_SCRATCH] / sizeof(float);
    model->train.scratch_memory = (float *)mem_calloc(MEM_BWD_SCRATCH, model->train.num_scratch, sizeof(float), "backward scratch");
    model->train.dresidual = model->train.scratch_memory;
    model->train.dbuf_c = model->train.dresidual + N * C;
    model->train.dbuf_f1 = model->train.dbuf_c + N * C;
    model->train.dbuf_f2 = model->train.dbuf_f1 + N * F1;
    if (model->train.lora) return; /* a frozen base: no gradients (model->grads stays all NULL) */
    model->train.grads_floats = plan.host[MEM_GRADIENTS] / sizeof(float);
    model->grads_memory = (float *)mem_calloc(MEM_GRADIENTS, model->train.grads_floats, sizeof(float), "gradients");
    gpt2_point_parameters(&model->grads, model->grads_memory, model->param_specs);
}

/* ---- ZeRO-2/3 (gpt2_shard): zero.h's buckets over the GPT-2 table --------------------------- */
void gpt2_plan_shard(const ModelConfig *cfg, int zero, int ranks, int rank, MemPlan *p) {
    TensorSpec specs[NUM_PARAMETER_TENSORS];
    size_t n = gpt2_parameter_specs(cfg, specs);
    cpu_zero_plan(specs, NUM_PARAMETER_TENSORS, n, zero, ranks, rank, p);
}

void gpt2_shard(GPT2 *model, int zero, int ranks, int rank, GPT2ShardHooks hooks) {
    if (zero < 2) return;
    CpuZero *z = &model->train.zs;
    cpu_training_shard(&model->train, model->param_specs, NUM_PARAMETER_TENSORS, model->cfg.num_layers,
                       model->num_parameters, zero, ranks, rank, hooks, &model->params_memory, &model->grads_memory);
    float **g = gpt2_parameter_slots(&model->grads), **p = gpt2_parameter_slots(&model->params);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)
        g[i] = model->param_specs[i].layer_numel ? NULL : model->grads_memory + z->pos[i];
    if (zero < 3) return;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++)
        p[i] = model->param_specs[i].layer_numel ? NULL : z->gather_memory + z->pos[i];
}


/* Layer l's view of a parameter, gradient or activation, derived from the tensor table (one
 * shared copy for every l when the table keeps a single layer; -z 2/3: the layer's bucket). */
#define PARAM(name, l) cpu_zero_view(&model->train.zs, model->param_specs, GPT2_P_##name, l, model->params_memory, model->train.zs.cur_params, NULL)
#define GRAD(name, l) (model->grads_memory ? cpu_zero_view(&model->train.zs, model->param_specs, GPT2_P_##name, l, model->grads_memory, model->train.zs.cur_grads, NULL) : NULL)
/* LoRA adapters on a site's output (lora.h), when the model has them */
#define LORA_FWD(site, out, width, inp) \
    if (model->train.lora) lora_forward_site(model->train.lora, LORA_SITE_##site, l, out, width, inp, N)
#define LORA_BWD(site, dinp, dout, width, inp) \
    if (model->train.lora) lora_backward_site(model->train.lora, LORA_SITE_##site, l, dinp, dout, width, inp, N)
#define ACT(name, l) tensor_layer(model->acts_memory, &model->act_specs[GPT2_A_##name], l)
/* the residual stream entering block l */
#define BLOCK_INPUT(l) ((l) == 0 ? ACT(encoded, 0) : ACT(residual3, (l) - 1))

float gpt2_forward(GPT2 *model, const int *inputs, const int *targets, int B, int T, float dloss) {
    const ModelConfig *cfg = &model->cfg;
    if (!model->acts_memory) llmc_die("gpt2_forward: call gpt2_allocate first");
    if (T > model->T || (size_t)B * T > (size_t)model->B * model->T)
        llmc_die("gpt2_forward: batch (%d, %d) exceeds the allocated (%d, %d)", B, T, model->B, model->T);
    for (int i = 0; i < B * T; i++)
        if (inputs[i] < 0 || inputs[i] >= cfg->vocab_size || (targets && (targets[i] < 0 || targets[i] >= cfg->vocab_size)))
            llmc_die("token id %d at position %d is outside the vocabulary [0, %d)",
                     inputs[i] < 0 || inputs[i] >= cfg->vocab_size ? inputs[i] : targets[i], i, cfg->vocab_size);
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, F = cfg->ffn_hidden;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, N = B * T;
    const ParameterTensors *p = &model->params;
    ActivationTensors *a = &model->acts;

    /* -tp: this rank's heads (NH/tp, NKV/tp), qkv rows (QKV/tp) and MLP columns (F/tp) */
    const int tp = tp_size(model), HS = C / NH, NHr = NH / tp, NKVr = cfg->num_kv_heads / tp, QKVr = (NHr + 2 * NKVr) * HS;
    const int Cr = C / tp, Fr = F / tp;
    cpu_zero_gather_outer(&model->train.zs);
    cpu_zero_prefetch_layer(&model->train.zs, 0);
    int vlo, Vr; /* -tp: this rank's vocabulary rows [vlo, vlo + Vr) of wte and columns of the logits */
    const int vocab_split = tp_vocab_split(model, &vlo, &Vr);
    if (vocab_split) tp_encoder_forward(model, a->encoded, inputs, p->wte, p->wpe, B, T, C);
    else encoder_forward(a->encoded, inputs, p->wte, p->wpe, B, T, C);
    if (model->train.lora) lora_prompt_forward(model->train.lora, a->encoded, p->wpe, B, T, C); /* (never with -tp) */
    for (int l = 0; l < L; l++) {
        cpu_zero_use_layer(&model->train.zs, l, l + 1);
        float *residual = BLOCK_INPUT(l), *qkv = ACT(qkv, l), *atty = ACT(atty, l), *residual2 = ACT(residual2, l);
        float *ln1 = ACT(ln1, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_gelu = ACT(fch_gelu, l);
        float *residual3 = ACT(residual3, l);
        layernorm_forward(ln1, ACT(ln1_mean, l), ACT(ln1_rstd, l), residual, PARAM(ln1w, l), PARAM(ln1b, l), N, C);
        cpu_site_matmul_forward(&model->train, LORA_SITE_QKV, l, qkv, ln1, PARAM(qkvw, l), PARAM(qkvb, l), N, C, QKVr);
        LORA_FWD(QKV, qkv, QKVr, ln1);
        attention_forward(atty, ACT(att, l), qkv, B, T, NHr, NKVr, HS);
        cpu_site_matmul_forward(&model->train, LORA_SITE_ATTPROJ, l, residual2, atty, PARAM(attprojw, l),
                                tp > 1 ? NULL : PARAM(attprojb, l), N, Cr, C);
        tp_sum_rows(model, residual2, PARAM(attprojb, l), N, C);
        LORA_FWD(ATTPROJ, residual2, C, atty);
        residual_forward(residual2, residual2, residual, (size_t)N * C);
        layernorm_forward(ln2, ACT(ln2_mean, l), ACT(ln2_rstd, l), residual2, PARAM(ln2w, l), PARAM(ln2b, l), N, C);
        cpu_site_matmul_forward(&model->train, LORA_SITE_FC, l, fch, ln2, PARAM(fcw, l), PARAM(fcb, l), N, C, Fr);
        LORA_FWD(FC, fch, Fr, ln2);
        gelu_forward(fch_gelu, fch, (size_t)N * Fr);
        cpu_site_matmul_forward(&model->train, LORA_SITE_FCPROJ, l, residual3, fch_gelu, PARAM(fcprojw, l),
                                tp > 1 ? NULL : PARAM(fcprojb, l), N, Fr, C);
        tp_sum_rows(model, residual3, PARAM(fcprojb, l), N, C);
        LORA_FWD(FCPROJ, residual3, C, fch_gelu);
        residual_forward(residual3, residual3, residual2, (size_t)N * C);
    }
    cpu_zero_end_layers(&model->train.zs);
    const float *top = ACT(residual3, L - 1);
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, top, p->lnfw, p->lnfb, N, C);
    matmul_forward(a->logits, a->lnf, p->wte, NULL, N, C, vocab_split ? Vr : Vp);
    if (!targets) return model->train.mean_loss = 0.0f;
    if (vocab_split) tp_classifier(model, a->logits, a->losses, targets, dloss, N, V, dloss != 0.0f);
    else fused_classifier(a->logits, a->losses, targets, dloss, N, V, Vp, dloss != 0.0f);
    float sum = 0.0f;
    for (int i = 0; i < N; i++) sum += a->losses[i];
    return model->train.mean_loss = sum / N;
}

void gpt2_backward(GPT2 *model, const int *inputs, int B, int T) {
    const ModelConfig *cfg = &model->cfg;
    if (!model->grads_memory && !model->train.lora) llmc_die("gpt2_backward: the model was allocated without training buffers");
    const int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, F = cfg->ffn_hidden;
    const int Vp = cfg->padded_vocab_size, N = B * T, tp = tp_size(model);
    const int Cr = C / tp, Fr = F / tp; /* -tp: this rank's attention output and MLP columns */
    const size_t NC = (size_t)N * C, NF = (size_t)N * Fr;
    const ParameterTensors *p = &model->params;
    ParameterTensors *g = &model->grads;
    ActivationTensors *a = &model->acts;
    float *dres = model->train.dresidual;
    cpu_zero_backward_begin(&model->train.zs, model->grads_memory);

    /* logits = lnf @ wte^T (dlogits already in a->logits; -tp: this rank's vocabulary columns, dlnf summed) */
    int vlo, Vr;
    const int vocab_split = tp_vocab_split(model, &vlo, &Vr);
    matmul_backward(model->train.dbuf_c, g->wte, NULL, a->logits, a->lnf, p->wte, N, C, vocab_split ? Vr : Vp);
    if (vocab_split) tp_sum_input_grad(model, model->train.dbuf_c, N, C);
    /* lnf = layernorm(residual3[L-1]) */
    zero(dres, NC);
    const float *top = ACT(residual3, L - 1);
    layernorm_backward(dres, g->lnfw, g->lnfb, model->train.dbuf_c, top, p->lnfw, a->lnf_mean, a->lnf_rstd, N, C);

    const int HS = C / NH, NHr = NH / tp, NKVr = cfg->num_kv_heads / tp, QKVr = (NHr + 2 * NKVr) * HS;
    for (int l = L - 1; l >= 0; l--) {
        float *residual = BLOCK_INPUT(l), *qkv = ACT(qkv, l), *atty = ACT(atty, l), *residual2 = ACT(residual2, l);
        float *ln1 = ACT(ln1, l), *ln2 = ACT(ln2, l), *fch = ACT(fch, l), *fch_gelu = ACT(fch_gelu, l);
        cpu_zero_use_layer(&model->train.zs, l, l - 1);
        cpu_zero_layer_grads(&model->train.zs, model->grads_memory);
        /* recompute what the forward did not keep, with the forward's own code */
        if (model->recompute >= 1) gelu_forward(fch_gelu, fch, NF);
        if (model->recompute >= 2)
            layernorm_recompute(ln2, residual2, ACT(ln2_mean, l), ACT(ln2_rstd, l), PARAM(ln2w, l), PARAM(ln2b, l), N, C);
        /* residual3 = residual2 + fch_gelu @ fcprojw^T + fcprojb: dres flows on to residual2 */
        float *dfch_gelu = model->train.dbuf_f1, *dfch = model->train.dbuf_f2;
        cpu_site_matmul_backward(&model->train, LORA_SITE_FCPROJ, l, dfch_gelu, GRAD(fcprojw, l), GRAD(fcprojb, l), dres,
                                 fch_gelu, PARAM(fcprojw, l), N, Fr, C);
        LORA_BWD(FCPROJ, dfch_gelu, dres, C, fch_gelu);
        /* fch_gelu = gelu(fch) */
        gelu_backward(dfch, fch, dfch_gelu, NF);
        /* fch = ln2 @ fcw^T + fcb */
        float *dln2 = model->train.dbuf_c;
        cpu_site_matmul_backward(&model->train, LORA_SITE_FC, l, dln2, GRAD(fcw, l), GRAD(fcb, l), dfch, ln2, PARAM(fcw, l),
                                 N, C, Fr);
        LORA_BWD(FC, dln2, dfch, Fr, ln2);
        tp_sum_input_grad(model, dln2, N, C);
        /* ln2 = layernorm(residual2) */
        layernorm_backward(dres, GRAD(ln2w, l), GRAD(ln2b, l), dln2, residual2, PARAM(ln2w, l), ACT(ln2_mean, l),
                           ACT(ln2_rstd, l), N, C);
        /* residual2 = residual + atty @ attprojw^T + attprojb */
        float *datty = model->train.dbuf_c;
        cpu_site_matmul_backward(&model->train, LORA_SITE_ATTPROJ, l, datty, GRAD(attprojw, l), GRAD(attprojb, l), dres, atty,
                                 PARAM(attprojw, l), N, Cr, C);
        LORA_BWD(ATTPROJ, datty, dres, C, atty);
        /* atty = attention(qkv) */
        float *dqkv = model->train.dbuf_f1;
        attention_backward(dqkv, datty, qkv, ACT(att, l), B, T, NHr, NKVr, HS);
        /* qkv = ln1 @ qkvw^T + qkvb */
        if (model->recompute >= 2)
            layernorm_recompute(ln1, residual, ACT(ln1_mean, l), ACT(ln1_rstd, l), PARAM(ln1w, l), PARAM(ln1b, l), N, C);
        float *dln1 = model->train.dbuf_c;
        cpu_site_matmul_backward(&model->train, LORA_SITE_QKV, l, dln1, GRAD(qkvw, l), GRAD(qkvb, l), dqkv, ln1,
                                 PARAM(qkvw, l), N, C, QKVr);
        LORA_BWD(QKV, dln1, dqkv, QKVr, ln1);
        tp_sum_input_grad(model, dln1, N, C);
        /* ln1 = layernorm(residual) */
        layernorm_backward(dres, GRAD(ln1w, l), GRAD(ln1b, l), dln1, residual, PARAM(ln1w, l), ACT(ln1_mean, l),
                           ACT(ln1_rstd, l), N, C);
        cpu_zero_reduce_layer(&model->train.zs, l);
    }
    cpu_zero_end_layers(&model->train.zs);
    /* encoded = wte[inputs] + wpe */
    if (model->train.lora) lora_prompt_backward(model->train.lora, dres, B, T, C); /* prompt tuning's soft tokens */
    if (g->wte && vocab_split) tp_encoder_backward(model, g->wte, g->wpe, dres, inputs, B, T, C);
    else if (g->wte) encoder_backward(g->wte, g->wpe, dres, inputs, B, T, C); /* (a frozen base: none) */
    cpu_zero_reduce_outer(&model->train.zs, model->grads_memory);
    tp_check_replicated(model);
}

void gpt2_zero_grad(GPT2 *model) {
    if (model->train.zs.zero >= 2) return; /* the buckets are cleared as the backward fills them */
    if (model->grads_memory) zero(model->grads_memory, model->num_parameters);
}

float gpt2_grad_norm(const GPT2 *model) {
    if (model->train.zs.zero >= 2) llmc_die("internal: gpt2_grad_norm on a sharded model (the optimizer has the gradients)");
    return (float)sqrt(global_norm_squared(model->grads_memory, model->num_parameters));
}

void gpt2_update(GPT2 *model, float lr, float beta1, float beta2, float eps, float weight_decay,
                 float grad_scale, int t) {
    if (model->train.zs.zero >= 2) llmc_die("internal: gpt2_update on a sharded model (the optimizer updates it)");
    if (!model->m_memory) { /* allocated on first use: a trainer's optimizer (llmc/train/optim.c) keeps its own */
        model->m_memory = (float *)callocCheck(model->num_parameters, sizeof(float), "AdamW m");
        model->v_memory = (float *)callocCheck(model->num_parameters, sizeof(float), "AdamW v");
    }
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const TensorSpec *s = &model->param_specs[i];
        adamw_update(model->params_memory + s->offset, model->grads_memory + s->offset, model->m_memory + s->offset,
                     model->v_memory + s->offset, s->numel, lr, beta1, beta2, eps, s->decay ? weight_decay : 0.0f,
                     t, grad_scale);
    }
}

void gpt2_free(GPT2 *model) {
    mem_free(MEM_PARAMETERS, model->params_memory, model->train.params_floats * sizeof(float));
    mem_free(MEM_GRADIENTS, model->grads_memory, model->train.grads_floats * sizeof(float));
    cpu_zero_free(&model->train.zs);
    free(model->m_memory);
    free(model->v_memory);
    mem_free(MEM_ACTIVATIONS, model->acts_memory, model->num_activations * sizeof(float));
    mem_free(MEM_BWD_SCRATCH, model->train.scratch_memory, model->train.num_scratch * sizeof(float));
    memset(model, 0, sizeof *model);
}

void gpt2_print_memory(const GPT2 *model, FILE *out) {
    const double MiB = 1048576.0;
    double pbytes = model->num_parameters * sizeof(float), shard = model->train.params_floats * sizeof(float);
    double gbytes = model->train.grads_floats * sizeof(float), gather = model->train.zs.gather_floats * sizeof(float);
    double kinds[ACT_NUM_KINDS] = {0};
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++)
        kinds[model->act_specs[i].kind] += model->act_specs[i].numel * sizeof(float);
    int training = model->grads_memory != NULL;
    int moments = model->m_memory != NULL;
    double total = shard + gather + gbytes * training + pbytes * 2 * moments + model->num_activations * sizeof(float) + model->train.num_scratch * sizeof(float);
    fprintf(out, "+-------------------------------------+------------+\n");
    fprintf(out, "| memory (CPU, fp32)                  |        MiB |\n");
    fprintf(out, "+-------------------------------------+------------+\n");
    fprintf(out, "| parameters (%12zu)%-13s| %10.1f |\n", model->num_parameters, model->train.zs.zero == 3 ? " this shard" : "",
            shard / MiB);
    if (model->train.zs.zero == 3) fprintf(out, "| parameters gathered (3 buckets)     | %10.1f |\n", gather / MiB);
    if (training) fprintf(out, "| gradients%-27s| %10.1f |\n", model->train.zs.zero >= 2 ? " (2 buckets, -z >= 2)" : "", gbytes / MiB);
    if (moments) {
        fprintf(out, "| AdamW m                             | %10.1f |\n", pbytes / MiB);
        fprintf(out, "| AdamW v                             | %10.1f |\n", pbytes / MiB);
    }
    for (int k = 0; k < ACT_NUM_KINDS; k++)
        fprintf(out, "| activations: %-22s | %10.1f |\n", activation_kind_names[k], kinds[k] / MiB);
    if (training)
        fprintf(out, "| backward scratch (one layer)        | %10.1f |\n", model->train.num_scratch * sizeof(float) / MiB);
    fprintf(out, "| total                               | %10.1f |\n", total / MiB);
    fprintf(out, "+-------------------------------------+------------+\n");
    if (tp_size(model) > 1)
        fprintf(out, "tensor parallel: rank %d of %d holds %zu of the model's %zu parameters (its 1/%d of c_attn, c_fc and both "
                     "c_proj, and wte's vocabulary rows %d..%d, the tied LM head; wpe and layernorms whole) and its 1/%d of "
                     "qkv, atty, att, fch, fch_gelu and the logits\n",
                model->tp->rank, model->tp->size, model->num_parameters, gpt2_parameter_specs(&model->cfg, NULL),
                model->tp->size, model->tp->rank * (model->cfg.padded_vocab_size / model->tp->size),
                (model->tp->rank + 1) * (model->cfg.padded_vocab_size / model->tp->size) - 1, model->tp->size);
}
