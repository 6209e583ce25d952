/*
 * test_quant.c - the C quantiser's output for test/test_qlora.py to compare with the double-precision
 * reference (dev/reference/nf4.py):
 *     test_quant nf4|int8 DQ ROWS COLS IN.f32 OUTDIR
 * reads a (ROWS, COLS) row-major float32 matrix and writes into OUTDIR (raw little-endian arrays):
 *   codes.bin    NF4: the packed 4-bit indices ((ROWS COLS + 1) / 2 bytes); int8: ROWS COLS int8 values
 *   absmax.f32   NF4: the dequantised absmax of every block (after double quantisation: as dequantised);
 *                int8: the per-row scales
 *   qabsmax.bin, absmax2.f32, mean.f32   NF4 with DQ 1: the 8-bit absmax indices, their absmax per 256, the mean
 *   dequant.f32  the dequantised matrix
 *   table.f32    the 16 NF4 code values; map.f32 the 256 values of the dynamic map
 * Exits 1 with a message on bad arguments or a matrix the mode rejects (quant_check).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/core/quant.h"

static void put(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "error: cannot write %s\n", path);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s nf4|int8 DQ ROWS COLS IN.f32 OUTDIR\n", argv[0]);
        return 1;
    }
    const int mode = quant_parse(argv[1]), dq = atoi(argv[2]);
    const size_t rows = (size_t)atol(argv[3]), cols = (size_t)atol(argv[4]), n = rows * cols;
    const char *bad = mode <= 0 ? "unknown mode" : quant_check(mode, dq, rows, cols);
    if (bad) {
        fprintf(stderr, "error: %s %d (%zu, %zu): %s\n", argv[1], dq, rows, cols, bad);
        return 1;
    }
    float *w = (float *)malloc(n * sizeof(float)), *out = (float *)malloc(n * sizeof(float));
    FILE *f = fopen(argv[5], "rb");
    if (!w || !out || !f || fread(w, sizeof(float), n, f) != n) {
        fprintf(stderr, "error: cannot read %zu floats from %s\n", n, argv[5]);
        return 1;
    }
    fclose(f);
    void *storage = malloc(quant_storage_bytes(mode, dq, rows, cols));
    QuantMatrix q;
    quant_matrix(&q, mode, dq, w, rows, cols, storage);
    for (size_t r = 0; r < rows; r++) quant_dequant_row(&q, r, out + r * cols);
    const char *dir = argv[6];
    put(dir, "dequant.f32", out, n * sizeof(float));
    put(dir, "table.f32", quant_nf4_table, sizeof quant_nf4_table);
    float map[256];
    quant_dynamic_map(map);
    put(dir, "map.f32", map, sizeof map);
    if (mode == QUANT_INT8) {
        put(dir, "codes.bin", q.codes, n);
        put(dir, "absmax.f32", q.absmax, rows * sizeof(float));
    } else {
        const size_t nb = n / QUANT_NF4_BLOCK, nb2 = (nb + QUANT_DQ_BLOCK - 1) / QUANT_DQ_BLOCK;
        float *a = (float *)malloc(nb * sizeof(float));
        for (size_t b = 0; b < nb; b++) a[b] = quant_block_absmax(&q, b);
        put(dir, "codes.bin", q.codes, (n + 1) / 2);
        put(dir, "absmax.f32", a, nb * sizeof(float));
        if (dq) {
            put(dir, "qabsmax.bin", q.qabsmax, nb);
            put(dir, "absmax2.f32", q.absmax2, nb2 * sizeof(float));
            put(dir, "mean.f32", &q.mean, sizeof(float));
        }
        free(a);
    }
    free(storage), free(w), free(out);
    return 0;
}
