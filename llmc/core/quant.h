/*
 * quant.h - block quantisation of a frozen (rows, cols) row-major fp32 matrix, as QLoRA stores its
 * base (Dettmers et al.; bitsandbytes' quantize_4bit / int8 formats), and its dequantisation.
 *
 * NF4 (bitsandbytes' quant_type "nf4", blocksize 64): the matrix flattened row-major in blocks of 64
 * values, an fp32 absmax per block (max |x|), each value the index of the NF4 code (quant_nf4_table)
 * nearest x / absmax (bitsandbytes' decision tree: above the midpoint of two codes, the upper one),
 * two 4-bit indices per byte with the first value in the high nibble (an odd count: the last low
 * nibble 0). Dequantised: table[index] * absmax (one fp32 product). A block whose absmax is 0 gets
 * index 7 (the code 0.0) everywhere and dequantises to 0 (bitsandbytes computes 0 * (1/0) = NaN).
 * cols must be a multiple of 64 (quant_check): blocks never straddle rows, so a row of our fused or
 * permuted weights (q|k|v, gate|up, RoPE-interleaved q and k) quantises as in its own HF module.
 *
 * Double quantisation (bitsandbytes' compress_statistics=True): the absmax values get their mean
 * subtracted (fp32 mean), then are quantised blockwise in blocks of 256 with the signed 8-bit dynamic
 * map (quant_dynamic_map: bitsandbytes' create_dynamic_map(signed=True)), an fp32 absmax2 per block of
 * 256; absmax[b] = map[q8[b]] * absmax2[b / 256] + mean, in fp32 as bitsandbytes' dequantize_blockwise
 * then "+= offset" do.
 *
 * int8: per row an fp32 scale = absmax / 127 (absmax = max |x| of the row), each value
 * rint(x * 127 / absmax) (ties to even, torch.round's rule), dequantised q * scale; a zero row: 0.
 *
 * Codes are decided in double (x / absmax against the midpoints in double), so they equal the
 * double-precision reference's (dev/reference/nf4.py) exactly; bitsandbytes normalises in fp32
 * (x * (1/absmax)), which can give the other of two neighbouring codes only where x / absmax is within
 * an fp32 rounding of a midpoint.
 */
#ifndef LLMC_CORE_QUANT_H
#define LLMC_CORE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { QUANT_NONE, QUANT_NF4, QUANT_INT8 } QuantMode;

enum { QUANT_NF4_BLOCK = 64, QUANT_DQ_BLOCK = 256 };

/* bitsandbytes' NF4 code values (bitsandbytes/functional.py, get_4bit_type('nf4'); the QLoRA
 * paper's Appendix E): the quantiles of N(0, 1) normalised to [-1, 1] with an exact 0. */
extern const float quant_nf4_table[16];

/* "nf4" -> QUANT_NF4, "int8" -> QUANT_INT8, "" or "none" -> QUANT_NONE; -1: unknown. */
int quant_parse(const char *name);
/* "nf4", "nf4 (double-quant)", "int8" */
const char *quant_name(int mode, int double_quant);
/* bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 sorted values
 * in [-1, 1], computed in double and rounded once to fp32 (bitsandbytes: torch float32 arithmetic,
 * which may differ in the last bit). */
void quant_dynamic_map(float map[256]);

/* One quantised matrix; its arrays point into storage of quant_storage_bytes (quant_matrix). */
typedef struct {
    int mode, double_quant;
    size_t rows, cols;
    uint8_t *codes;   /* NF4: (rows cols + 1) / 2 bytes; int8: rows cols int8 values */
    float *absmax;    /* NF4 without double quantisation: one per block of 64; int8: the per-row scale */
    uint8_t *qabsmax; /* NF4 double quantisation: one map index per block */
    float *absmax2;   /* its fp32 absmax per 256 blocks */
    float mean;       /* the mean subtracted from the absmax values */
} QuantMatrix;

/* NULL, or why (rows, cols) cannot be quantised in mode (NF4: cols not a multiple of 64). */
const char *quant_check(int mode, int double_quant, size_t rows, size_t cols);
/* The bytes quant_matrix keeps for a (rows, cols) matrix. */
size_t quant_storage_bytes(int mode, int double_quant, size_t rows, size_t cols);
/* Quantises w (rows, cols) into q, whose arrays are carved from storage (quant_storage_bytes, 4-aligned). */
void quant_matrix(QuantMatrix *q, int mode, int double_quant, const float *w, size_t rows, size_t cols, void *storage);
/* The dequantised absmax of NF4 block b (double quantisation undone; fp32 as bitsandbytes computes it). */
float quant_block_absmax(const QuantMatrix *q, size_t b);
/* Row r of the dequantised matrix into out (cols floats). */
void quant_dequant_row(const QuantMatrix *q, size_t r, float *out);

#ifdef __cplusplus
}
#endif
#endif
