/*
 * arch.cuh - the CUDA runtime's per-architecture table: one CudaArch per architecture that has a
 * CUDA block sequence. The runtime (cudamodel.cuh) builds, plans, allocates, runs and prints a
 * model through its entry (CudaModel.arch) and never asks which architecture it is; the LM head,
 * its loss, the optimizer, the host copies and ZeRO stay shared. Each entry is defined beside its
 * block sequence (gpt2_cuda_arch in gpt2.cuh, llama3_cuda_arch in llama.cuh, ...) and listed in
 * cuda_archs[] (archs.cuh). docs/ARCHITECTURES.md has the steps to add one.
 *
 * The templated code (one instance per storage type T) is reached through arrays indexed by
 * Precision: CUDA_ARCH_PER_PRECISION(f) fills one with f<float>, f<__nv_bfloat16>, f<__half>.
 */
#ifndef LLMC_CUDA_ARCH_CUH
#define LLMC_CUDA_ARCH_CUH

#include <stddef.h>
#include <stdio.h>

#include "llmc/core/check.h"
#include "llmc/formats/arch.h"
#include "llmc/cuda/arena.cuh"
#include "llmc/cuda/common.cuh"
#include "llmc/cuda/encoder.cuh"

enum { CUDA_NUM_PRECISIONS = 3 }; /* PRECISION_FP32, PRECISION_BF16, PRECISION_FP16 */
#define CUDA_ARCH_PER_PRECISION(f) {f<float>, f<__nv_bfloat16>, f<__half>}

typedef struct CudaArch {
    const ModelArch *arch; /* formats/arch.h's entry this is the CUDA block sequence of */
    /* In the trainer's notes and refusals: "the CUDA Llama", "a Llama has no GELU". */
    const char *who;
    int named;   /* 1: the backend name says the architecture ("CUDA Llama 3 bf16 on ..."); GPT-2's does not */
    int decoder; /* 1: ./generate_gpu's KV-cache decode (decode.cuh) runs it */

    /* cudamodel_build's part, after the parameter arena is allocated (the config, m->cfg, m->ac,
     * and the parameter table are set): its own checks of the config, the LM head's tensor
     * (head_index, head_offset), any parameter views. */
    void (*configure)(CudaModel *m, const ArchConfig *ac);

    /* Recompute and -ge: the highest -r level (0: every activation is kept; the trainer notes -r
     * and runs 0, cudamodel_allocate refuses it); why there is none, for the budget search (NULL:
     * there are levels); has_gelu 0: -ge does not apply (noted and run as 0). */
    int max_recompute;
    const char *no_recompute;
    int has_gelu;
    /* 1: it has attention (the head-size check, cuDNN's graphs and workspace, the memory table's
     * attention line); lse_act: the activation row holding the attention logsumexp (fp32, the
     * memory table's row of its own), -1 none. */
    int has_attention;
    int lse_act;

    /* The activation table on the GPU at (B, T, recompute, prec) with one LM-head chunk of
     * head_rows rows: offsets in bytes (256-aligned), bytes per tensor; returns the arena's bytes.
     * Its rows named like GPT-2's (lnf, logits, losses) are the shared LM head's. */
    size_t (*activation_specs)(const ArchConfig *ac, int B, int T, int recompute, Precision prec, int head_rows,
                               TensorSpec *specs, size_t *bytes);
    /* The fp32 op scratch's floats for N positions (its largest user; at least NORM_BLOCKS). */
    size_t (*fscratch_floats)(const ModelConfig *cfg, size_t N);
    /* The backward scratch's middle buffer width (dbuf_f1: N rows of it; see arena.cuh). */
    size_t (*scratch_f1)(const ModelConfig *cfg);
    /* After cudamodel_allocate's buffers exist (NULL: nothing): e.g. the Llama's RoPE table. */
    void (*allocated)(CudaModel *m, int training);

    /* Per precision: the trunk (the embedding and the blocks, up to lnf: the LM head is shared),
     * from the staged tokens; the backward from dlnf (in dbuf_c) down to the embedding's output
     * gradient (dresidual), calling cudamodel_backward_layer_begin / cudamodel_bucket_ready per
     * layer; the embedding's backward from dresidual with the staged token buckets. Launches
     * only (a CUDA graph captures the first two: graph.cuh). */
    void (*trunk_forward[CUDA_NUM_PRECISIONS])(CudaModel *m, int B, int T);
    void (*backward_layers[CUDA_NUM_PRECISIONS])(CudaModel *m, int B, int T);
    void (*embedding_backward[CUDA_NUM_PRECISIONS])(CudaModel *m, const EncoderBuckets *eb, int B, int T);
} CudaArch;

/* -r and -ge for arch: what the trainer runs (a level beyond max_recompute runs at it; -ge 0
 * without GELU), with a note line to `note` (NULL: none) when it differs from what was given. */
inline void cuda_arch_fix_flags(const CudaArch *a, int *recompute, int *gelu_fusion, FILE *note) {
    if (*recompute > a->max_recompute) {
        if (note && a->max_recompute == 0)
            fprintf(note, "note: -r %d: the CUDA %s keeps every activation (no recompute levels yet); using -r 0\n", *recompute,
                    a->who);
        else if (note)
            fprintf(note, "note: -r %d: the CUDA %s has recompute levels up to %d; using -r %d\n", *recompute, a->who,
                    a->max_recompute, a->max_recompute);
        *recompute = a->max_recompute;
    }
    if (a->has_gelu) return;
    if (*gelu_fusion > 0 && note) fprintf(note, "note: -ge %d: a %s has no GELU (SwiGLU MLP); ignored\n", *gelu_fusion, a->who);
    *gelu_fusion = 0;
}

/* A table of n activation rows (from the architecture's shared table at (B, T)) laid out on the
 * GPU: row lse (-1 none) holds the attention logsumexp (B, NH, T) per layer, row logits one LM-head
 * chunk (head_rows, Vp); per-layer rows L layers; ACT_STATS rows and lse fp32, the others in
 * prec; offsets in bytes, 256-aligned. Returns the bytes. */
inline size_t cuda_arch_layout_activations(const ModelConfig *cfg, int B, int T_, Precision prec, int head_rows, int lse,
                                           int logits, TensorSpec *specs, size_t *bytes, int n) {
    const size_t L = (size_t)cfg->num_layers;
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        TensorSpec *s = &specs[i];
        if (i == lse) { /* logsumexp (B, NH, T) */
            s->layer_numel = (size_t)B * cfg->num_heads * T_;
            s->shape = "(L, B, NH, T) lse";
        }
        if (i == logits) { /* one LM-head chunk */
            s->layer_numel = 0;
            s->numel = (size_t)head_rows * cfg->padded_vocab_size;
            s->shape = "(head_rows, Vp)";
        }
        if (s->layer_numel) s->numel = s->layer_numel * L;
        bytes[i] = s->numel * (cudamodel_act_is_fp32(s, i == lse) ? sizeof(float) : precision_bytes(prec));
        s->offset = offset;
        offset += (bytes[i] + 255) & ~(size_t)255;
    }
    return offset;
}

/* Layer l's view of activation i, typed; from the table only (parameters and gradients:
 * arena.cuh's cudamodel_param and cudamodel_grad). */
template <class X> inline X *cuda_arch_act(const CudaModel *m, int i, int l) {
    const TensorSpec *s = &m->act_specs[i];
    return (X *)((char *)m->acts_memory + s->offset) + (size_t)l * s->layer_numel;
}

/* The token-only embedding's backward (encoded = wte[inputs], no position table: the Llama, the
 * MLP), for an entry's embedding_backward: the staged buckets' deterministic scatter of dresidual
 * into parameter WTE's gradient (encoder.cuh). CUDA_ARCH_WTE_BACKWARD(WTE) fills the array. */
template <class T, int WTE> void cuda_arch_wte_backward(CudaModel *m, const EncoderBuckets *eb, int B, int T_) {
    (void)B, (void)T_;
    encoder_backward_wte(cudamodel_grad<T>(m, WTE, 0), (const T *)m->dresidual, eb, m->cfg.channels, m->ctx->stream);
}
#define CUDA_ARCH_WTE_BACKWARD(WTE) \
    {cuda_arch_wte_backward<float, WTE>, cuda_arch_wte_backward<__nv_bfloat16, WTE>, cuda_arch_wte_backward<__half, WTE>}

/* Dies naming init when arch has no CUDA entry (who: "the CUDA trainer", "the CUDA runtime";
 * after: what else to say, "" or e.g. " (./train_gpt_cpu trains it)"). */
inline void cuda_arch_refuse(const ModelArch *arch, const CudaArch *entry, const char *init, const char *who,
                             const char *after) {
    if (!entry) llmc_die("-e %s is a %s model: %s has no block sequence for it yet%s", init, arch->display, who, after);
}

#endif
