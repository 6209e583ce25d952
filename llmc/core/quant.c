/*
 * quant.c - NF4 (with double quantisation) and int8 block quantisation (quant.h).
 */
#include "llmc/core/quant.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/check.h"

/* bitsandbytes/functional.py get_4bit_type('nf4') (also csrc/kernels.cu dDequantizeNF4 and the QLoRA
 * paper, Appendix E), copied digit for digit. */
const float quant_nf4_table[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

int quant_parse(const char *name) {
    if (!name || !name[0] || strcmp(name, "none") == 0) return QUANT_NONE;
    if (strcmp(name, "nf4") == 0) return QUANT_NF4;
    if (strcmp(name, "int8") == 0) return QUANT_INT8;
    return -1;
}

const char *quant_name(int mode, int double_quant) {
    if (mode == QUANT_NF4) return double_quant ? "nf4 (double-quant)" : "nf4";
    return mode == QUANT_INT8 ? "int8" : "none";
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void quant_dynamic_map(float map[256]) {
    int k = 0;
    for (int i = 0; i < 7; i++) { /* exponent 10^(i - 6), 2^i fraction values, both signs */
        const int n = (1 << i) + 1; /* linspace(0.1, 1, n) boundaries; the values are their midpoints */
        const double step = 0.9 / (n - 1), scale = pow(10.0, i - 6);
        for (int j = 0; j + 1 < n; j++) {
            const double lo = 0.1 + j * step, hi = j + 2 == n ? 1.0 : 0.1 + (j + 1) * step;
            const double v = scale * (lo + hi) / 2.0;
            map[k++] = (float)v;
            map[k++] = (float)-v;
        }
    }
    map[k++] = 0.0f;
    map[k++] = 1.0f; /* 254 + 2 = 256 */
    qsort(map, 256, sizeof(float), cmp_float);
}

const char *quant_check(int mode, int double_quant, size_t rows, size_t cols) {
    if (mode == QUANT_NF4 && cols % QUANT_NF4_BLOCK)
        return "nf4 needs the input features to be a multiple of 64 (blocks of 64 within a row)";
    if (double_quant && mode != QUANT_NF4) return "double quantisation is for nf4 only";
    if (!rows || !cols) return "an empty matrix";
    return NULL;
}

static size_t align4(size_t n) { return (n + 3) & ~(size_t)3; }
static size_t nf4_blocks(size_t n) { return (n + QUANT_NF4_BLOCK - 1) / QUANT_NF4_BLOCK; }

size_t quant_storage_bytes(int mode, int double_quant, size_t rows, size_t cols) {
    const size_t n = rows * cols;
    if (mode == QUANT_INT8) return rows * sizeof(float) + align4(n);
    const size_t nb = nf4_blocks(n), nb2 = (nb + QUANT_DQ_BLOCK - 1) / QUANT_DQ_BLOCK;
    if (!double_quant) return nb * sizeof(float) + align4((n + 1) / 2);
    return nb2 * sizeof(float) + align4((n + 1) / 2) + align4(nb);
}

/* the index of the NF4 code nearest x (in [-1, 1]): above a midpoint, the upper code */
static int nf4_index(double x) {
    int i = 0;
    while (i < 15 && x > 0.5 * ((double)quant_nf4_table[i] + (double)quant_nf4_table[i + 1])) i++;
    return i;
}

/* the index of the map value nearest x (the lower one on a tie) */
static int map_index(const float *map, double x) {
    int best = 0;
    double d = fabs(x - map[0]);
    for (int i = 1; i < 256; i++) {
        const double e = fabs(x - map[i]);
        if (e < d) d = e, best = i;
    }
    return best;
}

static void quant_double(QuantMatrix *q, const float *absmax, size_t nb) {
    double sum = 0.0;
    for (size_t b = 0; b < nb; b++) sum += absmax[b];
    q->mean = (float)(sum / (double)nb);
    float map[256];
    quant_dynamic_map(map);
    for (size_t b0 = 0; b0 < nb; b0 += QUANT_DQ_BLOCK) {
        const size_t b1 = b0 + QUANT_DQ_BLOCK < nb ? b0 + QUANT_DQ_BLOCK : nb;
        double most = 0.0;
        for (size_t b = b0; b < b1; b++) most = fmax(most, fabs((double)absmax[b] - q->mean));
        const float a2 = (float)most;
        q->absmax2[b0 / QUANT_DQ_BLOCK] = a2;
        for (size_t b = b0; b < b1; b++)
            q->qabsmax[b] = (uint8_t)(a2 > 0.0f ? map_index(map, ((double)absmax[b] - q->mean) / a2) : map_index(map, 0.0));
    }
}

void quant_matrix(QuantMatrix *q, int mode, int double_quant, const float *w, size_t rows, size_t cols, void *storage) {
    const char *bad = quant_check(mode, double_quant, rows, cols);
    if (bad) llmc_die("internal: quant_matrix (%zu, %zu): %s", rows, cols, bad);
    memset(q, 0, sizeof *q);
    q->mode = mode, q->double_quant = double_quant, q->rows = rows, q->cols = cols;
    const size_t n = rows * cols;
    char *s = (char *)storage;
    if (mode == QUANT_INT8) {
        q->absmax = (float *)s, q->codes = (uint8_t *)(s + rows * sizeof(float));
        for (size_t r = 0; r < rows; r++) {
            const float *x = w + r * cols;
            double most = 0.0;
            for (size_t c = 0; c < cols; c++) most = fmax(most, fabs((double)x[c]));
            q->absmax[r] = (float)(most / 127.0);
            for (size_t c = 0; c < cols; c++)
                ((int8_t *)q->codes)[r * cols + c] = (int8_t)(most > 0.0 ? nearbyint((double)x[c] * 127.0 / most) : 0.0);
        }
        return;
    }
    const size_t nb = nf4_blocks(n), nb2 = (nb + QUANT_DQ_BLOCK - 1) / QUANT_DQ_BLOCK;
    float *absmax = double_quant ? (float *)malloc(nb * sizeof(float)) : (float *)s;
    if (!absmax) llmc_die("out of memory quantising a (%zu, %zu) matrix", rows, cols);
    if (double_quant) {
        q->absmax2 = (float *)s;
        q->codes = (uint8_t *)(s + nb2 * sizeof(float));
        q->qabsmax = q->codes + align4((n + 1) / 2);
    } else {
        q->absmax = absmax;
        q->codes = (uint8_t *)(s + nb * sizeof(float));
    }
    memset(q->codes, 0, (n + 1) / 2);
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * QUANT_NF4_BLOCK, i1 = i0 + QUANT_NF4_BLOCK < n ? i0 + QUANT_NF4_BLOCK : n;
        float most = 0.0f;
        for (size_t i = i0; i < i1; i++) most = fmaxf(most, fabsf(w[i]));
        absmax[b] = most;
        for (size_t i = i0; i < i1; i++) {
            const int code = most > 0.0f ? nf4_index((double)w[i] / (double)most) : 7;
            q->codes[i / 2] |= (uint8_t)(i % 2 ? code : code << 4); /* the first value in the high nibble */
        }
    }
    if (double_quant) quant_double(q, absmax, nb), free(absmax);
}

static float dq_map[256]; /* quant_dynamic_map, made once (dequantisation runs in OpenMP threads) */
static pthread_once_t map_once = PTHREAD_ONCE_INIT;
static void make_map(void) { quant_dynamic_map(dq_map); }

float quant_block_absmax(const QuantMatrix *q, size_t b) {
    if (!q->double_quant) return q->absmax[b];
    pthread_once(&map_once, make_map);
    const float scaled = dq_map[q->qabsmax[b]] * q->absmax2[b / QUANT_DQ_BLOCK];
    return scaled + q->mean;
}

void quant_dequant_row(const QuantMatrix *q, size_t r, float *out) {
    const size_t cols = q->cols, i0 = r * cols;
    if (q->mode == QUANT_INT8) {
        const int8_t *c = (const int8_t *)q->codes + i0;
        const float s = q->absmax[r];
        for (size_t j = 0; j < cols; j++) out[j] = (float)c[j] * s;
        return;
    }
    for (size_t j = 0; j < cols; j += QUANT_NF4_BLOCK) { /* (cols % 64 == 0: whole blocks) */
        const float a = quant_block_absmax(q, (i0 + j) / QUANT_NF4_BLOCK);
        const uint8_t *c = q->codes + (i0 + j) / 2;
        for (size_t k = 0; k < QUANT_NF4_BLOCK; k += 2) {
            out[j + k] = quant_nf4_table[c[k / 2] >> 4] * a;
            out[j + k + 1] = quant_nf4_table[c[k / 2] & 15] * a;
        }
    }
}
