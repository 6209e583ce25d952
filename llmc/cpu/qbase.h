/*
 * qbase.h (CPU) - a quantised frozen base (QLoRA; --quantize-base nf4|int8, llmc/core/quant.h): the
 * 2-D linear weights of the blocks (the LoRA modules of the family, llmc/models/lora.h: GPT-2's
 * c_attn, attn.c_proj, c_fc, mlp.c_proj; the Llama's q/k/v/o_proj and gate/up/down_proj) held as
 * quantised codes, one QuantMatrix per module and layer in Hugging Face's row order (the q_proj /
 * k_proj rows as HF stores them, lora_peft_row), so each is the module bitsandbytes would quantise.
 * Embeddings, norms, biases and the output head stay fp32.
 *
 * After quantising, the fp32 copy of those weights is released: their pages of the model's
 * parameter arena go back to the system (madvise MADV_DONTNEED; the arena keeps its layout, the
 * table's offsets of the fp32 tensors unchanged) and MEM_PARAMETERS counts the codes instead.
 *
 * The block sequences call the site matmuls through cpu_site_matmul_forward / _backward: without a
 * quantised base they are matmul_forward / matmul_backward; with one, each module's rows are
 * dequantised a panel of QBASE_PANEL_ROWS rows at a time into a small fp32 scratch (MEM_OP_SCRATCH)
 * that feeds the BLAS matmul (llmc_sgemm):
 *   forward:  out[:, rows] = inp @ panel^T (+ bias)
 *   backward: dinp = sum over panels dout[:, rows] @ panel (overwrites); no weight gradient (frozen)
 */
#ifndef LLMC_CPU_QBASE_H
#define LLMC_CPU_QBASE_H

#include <stddef.h>
#include <stdint.h>

#include "llmc/core/quant.h"
#include "llmc/cpu/training.h"
#include "llmc/models/lora.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { QBASE_PANEL_ROWS = 128 };

typedef struct QBase {
    int mode, double_quant;
    LoraConfig units;    /* every linear module of the blocks ("all-linear"): site, in, out, out_offset */
    QuantMatrix *q;      /* (module, layer): units.num_modules * L */
    int *hf_row_memory;  /* the rope_rows modules' (q_proj, k_proj): our row -> its HF row, out each */
    void *storage;       /* the codes, absmax and scales (MEM_PARAMETERS) */
    size_t storage_bytes, fp32_bytes; /* the codes' bytes; the fp32 weights they replace */
    float *panel;        /* the dequantisation scratch (MEM_OP_SCRATCH) */
    size_t panel_floats;
    uint32_t crc;        /* the codes' CRC-32 when built */
} QBase;

/* 0, or -1 with why in err (naming --quantize-base / --double-quant): the model's modules cannot be
 * quantised in mode (NF4: in features not a multiple of 64), or the family has no linear modules. */
int qbase_check(int mode, int double_quant, int family, const ModelConfig *cfg, char *err, size_t len);
/* The bytes qbase_build keeps (storage: the codes; panel: the scratch) and the fp32 bytes it releases. */
void qbase_plan(int mode, int double_quant, int family, const ModelConfig *cfg, size_t *storage, size_t *fp32,
                size_t *panel);
/* Quantises the model's block weights (params, its table specs, n rows) and releases their fp32 pages. */
void qbase_build(QBase *qb, int mode, int double_quant, int family, const ModelConfig *cfg, float *params,
                 const TensorSpec *specs, int n);
/* The CRC-32 of the codes now (qb->crc at build: the base stays unchanged through a run). */
uint32_t qbase_crc_now(const QBase *qb);
/* Frees the codes and the scratch; the released fp32 pages are counted back to MEM_PARAMETERS (the
 * model's free releases its arena whole). */
void qbase_free(QBase *qb);

/* A block's linear layer at site of layer l (matmul.h's shapes and contracts): tr->qbase NULL, the
 * fp32 weight; else the quantised one (weight is not read; dweight must be NULL). */
void cpu_site_matmul_forward(const CpuTraining *tr, int site, int l, float *out, const float *inp, const float *weight,
                             const float *bias, int N, int C, int OC);
void cpu_site_matmul_backward(const CpuTraining *tr, int site, int l, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int N, int C, int OC);

#ifdef __cplusplus
}
#endif
#endif
