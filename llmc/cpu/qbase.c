/*
 * qbase.c (CPU) - the quantised frozen base and its site matmuls (qbase.h).
 */
#include "llmc/cpu/qbase.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "llmc/core/check.h"
#include "llmc/core/mem.h"
#include "llmc/core/sumfile.h"
#include "llmc/cpu/matmul.h"

/* every linear module of the family's blocks (lora_config_build's table, rank 1) */
static int all_modules(int family, const ModelConfig *cfg, LoraConfig *lc, char *err, size_t len) {
    if (lora_config_build(lc, family, cfg, 1, 8.0f, 0, 0, "all-linear", err, len) != 0) return -1;
    return 0;
}

int qbase_check(int mode, int double_quant, int family, const ModelConfig *cfg, char *err, size_t len) {
    LoraConfig lc;
    char why[512];
    if (double_quant && mode != QUANT_NF4)
        return snprintf(err, len, "--double-quant 1 is for --quantize-base nf4 only (got %s)", quant_name(mode, 0)), -1;
    if (!family || all_modules(family, cfg, &lc, why, sizeof why) != 0)
        return snprintf(err, len, "--quantize-base: this model has no linear modules to quantise"), -1;
    for (int m = 0; m < lc.num_modules; m++) {
        const char *bad = quant_check(mode, double_quant, (size_t)lc.modules[m].out, (size_t)lc.modules[m].in);
        if (bad)
            return snprintf(err, len, "--quantize-base %s: module %s is (%d, %d): %s", quant_name(mode, 0),
                            lc.modules[m].path, lc.modules[m].out, lc.modules[m].in, bad), -1;
    }
    return 0;
}

void qbase_plan(int mode, int double_quant, int family, const ModelConfig *cfg, size_t *storage, size_t *fp32,
                size_t *panel) {
    LoraConfig lc;
    char err[512];
    *storage = *fp32 = *panel = 0;
    if (all_modules(family, cfg, &lc, err, sizeof err) != 0) llmc_die("internal: qbase_plan: %s", err);
    size_t cols = 0;
    for (int m = 0; m < lc.num_modules; m++) {
        const LoraModule *u = &lc.modules[m];
        *storage += (size_t)lc.num_layers * quant_storage_bytes(mode, double_quant, (size_t)u->out, (size_t)u->in);
        *fp32 += (size_t)lc.num_layers * (size_t)u->out * (size_t)u->in * sizeof(float);
        if ((size_t)u->in > cols) cols = (size_t)u->in;
    }
    *panel = (size_t)QBASE_PANEL_ROWS * cols * sizeof(float);
}

/* Returns the pages wholly inside [p, p + bytes) to the system (their contents read as zeros after). */
static void release_pages(float *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + bytes) & ~(page - 1);
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
        llmc_die("internal: madvise(MADV_DONTNEED) on the quantised base's fp32 pages failed");
}

void qbase_build(QBase *qb, int mode, int double_quant, int family, const ModelConfig *cfg, float *params,
                 const TensorSpec *specs, int n) {
    char err[512];
    memset(qb, 0, sizeof *qb);
    if (qbase_check(mode, double_quant, family, cfg, err, sizeof err) != 0) llmc_die("%s", err);
    qb->mode = mode, qb->double_quant = double_quant;
    all_modules(family, cfg, &qb->units, err, sizeof err);
    const LoraConfig *lc = &qb->units;
    const int L = lc->num_layers, M = lc->num_modules;
    size_t panel_bytes;
    qbase_plan(mode, double_quant, family, cfg, &qb->storage_bytes, &qb->fp32_bytes, &panel_bytes);
    qb->storage = mem_calloc(MEM_PARAMETERS, qb->storage_bytes, 1, "quantised base");
    qb->panel_floats = panel_bytes / sizeof(float);
    qb->panel = (float *)mem_calloc(MEM_OP_SCRATCH, qb->panel_floats, sizeof(float), "quantised base: dequantisation panel");
    qb->q = (QuantMatrix *)callocCheck((size_t)M * L, sizeof(QuantMatrix), "quantised base");
    size_t rows_total = 0, most = 0; /* the rope_rows modules' rows, and the largest of them (out x in) */
    for (int m = 0; m < M; m++) {
        if (!lc->modules[m].rope_rows) continue;
        rows_total += (size_t)lc->modules[m].out;
        if ((size_t)lc->modules[m].out * lc->modules[m].in > most) most = (size_t)lc->modules[m].out * lc->modules[m].in;
    }
    qb->hf_row_memory = rows_total ? (int *)callocCheck(rows_total, sizeof(int), "quantised base rows") : NULL;
    float *hf = most ? (float *)mallocCheck(most * sizeof(float), "quantised base: q_proj / k_proj in HF's row order") : NULL;
    char *next = (char *)qb->storage;
    int *rows = qb->hf_row_memory;
    for (int m = 0; m < M; m++) {
        const LoraModule *u = &lc->modules[m];
        const TensorSpec *w = lora_site_weight(specs, n, u->site);
        if (!w) llmc_die("internal: qbase_build: the model has no weight for module %s", u->path);
        if (u->rope_rows) /* our row of HF row r is lora_peft_row(r): invert */
            for (int r = 0; r < u->out; r++) rows[lora_peft_row(lc, m, (size_t)r)] = r;
        for (int l = 0; l < L; l++) {
            const float *W = tensor_layer(params, w, l) + (size_t)u->out_offset * u->in;
            for (int r = 0; u->rope_rows && r < u->out; r++) /* (other modules' rows are HF's already) */
                memcpy(hf + (size_t)r * u->in, W + lora_peft_row(lc, m, (size_t)r) * u->in, (size_t)u->in * sizeof(float));
            quant_matrix(&qb->q[(size_t)m * L + l], mode, double_quant, u->rope_rows ? hf : W, (size_t)u->out, (size_t)u->in,
                         next);
            next += quant_storage_bytes(mode, double_quant, (size_t)u->out, (size_t)u->in);
        }
        if (u->rope_rows) rows += u->out;
    }
    free(hf);
    for (int s = 0; s < LORA_NUM_SITES; s++) { /* the fp32 copies: every row of each site weight is a module's */
        const TensorSpec *w = lora_site_weight(specs, n, s);
        if (w) release_pages(params + w->offset, w->numel * sizeof(float));
    }
    mem_account(MEM_PARAMETERS, -(long long)qb->fp32_bytes, 0);
    qb->crc = qbase_crc_now(qb);
}

uint32_t qbase_crc_now(const QBase *qb) { return sumfile_crc_update(0, qb->storage, qb->storage_bytes); }

void qbase_free(QBase *qb) {
    if (!qb->storage) return;
    mem_account(MEM_PARAMETERS, (long long)qb->fp32_bytes, 0);
    mem_free(MEM_PARAMETERS, qb->storage, qb->storage_bytes);
    mem_free(MEM_OP_SCRATCH, qb->panel, qb->panel_floats * sizeof(float));
    free(qb->q);
    free(qb->hf_row_memory);
    memset(qb, 0, sizeof *qb);
}

/* module m's HF row of our row r */
static size_t hf_row_of(const QBase *qb, int m, size_t r) {
    const int *rows = qb->hf_row_memory;
    for (int i = 0; i < m; i++) rows += qb->units.modules[i].rope_rows ? qb->units.modules[i].out : 0;
    return qb->units.modules[m].rope_rows ? (size_t)rows[r] : r;
}

/* rows [r0, r0 + p) of module m's layer l, dequantised into the panel (p x in) */
static void dequant_panel(const QBase *qb, int m, int l, int r0, int p) {
    const QuantMatrix *q = &qb->q[(size_t)m * qb->units.num_layers + l];
    const int threaded = (size_t)p * q->cols >= ((size_t)1 << 17); /* (a small panel: fewer than a thread start's worth) */
#pragma omp parallel for schedule(static) if (threaded)
    for (int i = 0; i < p; i++) quant_dequant_row(q, hf_row_of(qb, m, (size_t)(r0 + i)), qb->panel + (size_t)i * q->cols);
}

/* the site's modules cover its OC output rows with C inputs each (a bug otherwise) */
static void check_site(const QBase *qb, int site, int C, int OC) {
    int rows = 0;
    for (int m = 0; m < qb->units.num_modules; m++)
        if (qb->units.modules[m].site == site) {
            if (qb->units.modules[m].in != C) llmc_die("internal: quantised site %d: in %d, the matmul's C %d", site, qb->units.modules[m].in, C);
            rows += qb->units.modules[m].out;
        }
    if (rows != OC) llmc_die("internal: quantised site %d covers %d of %d output rows", site, rows, OC);
}

void cpu_site_matmul_forward(const CpuTraining *tr, int site, int l, float *out, const float *inp, const float *weight,
                             const float *bias, int N, int C, int OC) {
    const QBase *qb = tr->qbase;
    if (!qb) {
        matmul_forward(out, inp, weight, bias, N, C, OC);
        return;
    }
    check_site(qb, site, C, OC);
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
    }
    for (int m = 0; m < qb->units.num_modules; m++) {
        const LoraModule *u = &qb->units.modules[m];
        if (u->site != site) continue;
        for (int r0 = 0; r0 < u->out; r0 += QBASE_PANEL_ROWS) {
            const int p = u->out - r0 < QBASE_PANEL_ROWS ? u->out - r0 : QBASE_PANEL_ROWS;
            dequant_panel(qb, m, l, r0, p);
            llmc_sgemm(0, 1, N, p, C, 1.0f, inp, C, qb->panel, C, bias ? 1.0f : 0.0f, out + u->out_offset + r0, OC);
        }
    }
}

void cpu_site_matmul_backward(const CpuTraining *tr, int site, int l, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int N, int C, int OC) {
    const QBase *qb = tr->qbase;
    if (!qb) {
        matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
        return;
    }
    if (dweight || dbias) llmc_die("internal: a weight or bias gradient for the quantised (frozen) base");
    check_site(qb, site, C, OC);
    float beta = 0.0f;
    for (int m = 0; m < qb->units.num_modules; m++) {
        const LoraModule *u = &qb->units.modules[m];
        if (u->site != site) continue;
        for (int r0 = 0; r0 < u->out; r0 += QBASE_PANEL_ROWS, beta = 1.0f) {
            const int p = u->out - r0 < QBASE_PANEL_ROWS ? u->out - r0 : QBASE_PANEL_ROWS;
            dequant_panel(qb, m, l, r0, p);
            llmc_sgemm(0, 0, N, C, p, 1.0f, dout + u->out_offset + r0, OC, qb->panel, C, beta, dinp, C);
        }
    }
}
