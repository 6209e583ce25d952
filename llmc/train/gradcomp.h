/*
 * gradcomp.h - compressed gradient communication with error feedback (--grad-compression), for the
 * loop's host AdamW at -z 0 and -z 1 (optim.h's optim_reduce): the data-parallel sum of the ranks'
 * gradients, moved compressed over dist.h's collectives (MPI, -pi tcp, -pi fs alike).
 *
 * Schemes (lossy, each with an error-feedback residual per rank):
 *   bf16        every gradient rounded to bf16 (nearest even): 2 bytes an element.
 *   int8        chunks of GC_INT8_CHUNK elements of the flat gradient, each with an fp32 scale
 *               max|x| / 127 and codes round(x / scale) in [-127, 127]: 1 byte an element + 4 a chunk.
 *   topk:FRAC   per gradient bucket (optim.h's buckets: the outer one, then a layer's), the
 *               ceil(FRAC x numel) elements of largest magnitude (ties: the lower index), sent as
 *               (uint32 flat index, fp32 value): 8 bytes an element sent.
 *   powersgd:R  each matrix M (rows x cols; a stacked (L, out, in) tensor is L of them) as P = M Q
 *               (Q: cols x r, r = min(R, rows, cols), warm-started from the last step's), the ranks'
 *               P summed, orthogonalised (Gram-Schmidt; a column of norm 0 stays 0), Q = M^T P
 *               summed, the sum P Q^T; 1-D tensors sent uncompressed. Two all-gathers a step:
 *               4 (rows + cols) r bytes a matrix, 4 numel a vector. Q is training state too.
 * The reduction (bf16, int8, topk): x = this rank's gradient + its residual; c = compress(x); residual = x -
 * decompress(c); every rank's c all-gathered (one all-gather of P payloads of equal size), then
 * every rank decompresses them and sums them in rank order (into zeros), so every rank ends with
 * the same bits. Cost: a rank sends its payload to P - 1 ranks (comm_bytes counts payload x
 * (P - 1)), against 2 x 4n (P - 1) / P for the uncompressed reduce-scatter + all-gather: int8 saves
 * ~8/P x, bf16 ~4/P x, topk ~1/(FRAC P) x; beyond a few ranks a compressed reduce-scatter would be
 * needed to keep the saving (not built).
 *
 * The residual is training state: gathered into the one state file at every checkpoint (statefile.h,
 * version 4: each rank's residual in rank order) and loaded back on resume, bit-exactly with the same
 * number of ranks; on another number, rank r takes the sum of the old residuals q with q % P == r (the
 * total the next steps would have sent is kept). With one process there is nothing to communicate:
 * the gradients are used uncompressed, no residual (a note says so).
 */
#ifndef LLMC_TRAIN_GRADCOMP_H
#define LLMC_TRAIN_GRADCOMP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmc/core/tensor.h"
#include "llmc/dist/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GC_NONE = 0, GC_BF16 = 1, GC_INT8 = 2, GC_TOPK = 3, GC_POWERSGD = 4 } GradCompKind;
enum { GC_INT8_CHUNK = 256 };

typedef struct {
    int kind;   /* GradCompKind */
    float frac; /* topk: the fraction of each bucket sent, (0, 1) */
    int rank;   /* powersgd: the factorisation's rank */
} GradCompSpec;

/* --grad-compression's value into g: 0, or -1 with what is wrong in err. */
int gradcomp_parse(const char *s, GradCompSpec *g, char *err, size_t len);
const char *gradcomp_name(int kind);
/* The spec as one int32 for the state file (frac's bits for topk, the rank for powersgd). */
int32_t gradcomp_param_word(const GradCompSpec *g);

typedef struct GradComp {
    GradCompSpec spec;
    Dist *dist;
    size_t n;
    const TensorSpec *specs;
    int num_specs, num_buckets, max_buckets; /* topk: the buckets, and the most the plan allows for */
    float *residual;        /* n floats: what this rank has not sent yet */
    unsigned char *payload; /* P x cap bytes: every rank's payload, in rank order */
    size_t cap;             /* bytes per rank reserved in payload (the plan's bound) */
    uint32_t *hist;         /* topk: 65536 bins of the radix select */
    int no_residual;        /* tests only (LLMC_TEST_GRAD_COMP_NO_RESIDUAL=1): error feedback off */
    /* powersgd: the matrices (adafactor.h's units of the parameter table: a stacked (L, out, in)
     * tensor is L matrices; cols 0: a vector, sent uncompressed) and their rank r factors */
    void *units;             /* AdafactorUnit[num_units] */
    int num_units;
    size_t q_floats, p_floats, vec_floats; /* sum cols x r, sum rows x r, the vectors' elements */
    float *q;                /* the warm-started Q of every matrix (the same on every rank; training state) */
    float *phat;             /* the summed, orthogonalised P of every matrix */
    int zero_unit;           /* tests only (LLMC_TEST_GRAD_COMP_ZERO_UNIT=K): matrix K's gradient zeroed, -1 none */
    const char *dump;       /* tests only (LLMC_TEST_GRAD_COMP_DUMP=DIR): each step's inputs and outputs
                             * appended to DIR/rank<R>.bin, the buckets in DIR/buckets.txt */
} GradComp;

/* Bytes one rank's payload may take (the buffer's size per rank; topk: a bound over the buckets,
 * at most num_buckets of them) and the memory the compression holds: residual + P payloads
 * (+ topk's histogram). 0 for GC_NONE or one rank. The plan's and gradcomp_init's one rule. */
size_t gradcomp_payload_cap(const GradCompSpec *g, size_t n, int num_buckets);
size_t gradcomp_memory_bytes(const GradCompSpec *g, size_t n, int num_buckets, int ranks);
/* The plan's bytes for the model -e names (init: its header or descriptor; powersgd needs its
 * matrices' shapes). */
size_t gradcomp_plan_bytes(const GradCompSpec *g, const char *init, size_t n, int num_buckets, int ranks);
size_t gradcomp_residual_bytes(const GradCompSpec *g, size_t n, int ranks);

/* Allocates the residual (zero) and the payload buffers (class MEM_GRAD_COMP) and makes g the
 * run's (gradcomp_current); with one process, neither. specs: the parameter table (topk's buckets,
 * at most max_buckets: the model's layers + 1, the plan's bound). */
void gradcomp_init(GradComp *g, const GradCompSpec *spec, Dist *d, size_t n, const TensorSpec *specs, int num_specs,
                   int max_buckets, const ModelConfig *cfg);
void gradcomp_free(GradComp *g);
/* The run's compressor, or NULL when none is active. */
GradComp *gradcomp_current(void);
/* grads (this rank's, n floats) replaced by the sum over the ranks of their compressed gradients:
 * the same bits on every rank; the residual updated. */
void gradcomp_reduce(GradComp *g, float *grads);
/* One rank's compressor on x (n floats, overwritten by the residual x - decompress(c)): the payload
 * into out (gradcomp_payload_cap bytes; returns the bytes used). Tests compare it with
 * dev/reference/grad_compression.py. */
size_t gradcomp_compress(GradComp *g, float *x, unsigned char *out);
/* sum += decompress(payload) (n floats). */
void gradcomp_decompress_add(const GradComp *g, const unsigned char *payload, float *sum);
/* The startup print's line. */
void gradcomp_print_memory(const GradComp *g, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
