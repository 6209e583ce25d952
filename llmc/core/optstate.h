/*
 * optstate.h - how the AdamW moments m and v are stored (--optim-state fp32 | bf16 | int8): the
 * one implementation of the compact codes, used by the CPU optimizer (llmc/train/optim.c, through
 * llmc/core/optstate.c) and, element by element, by the CUDA kernel (llmc/cuda/adamw.cuh includes
 * this header: its functions are __host__ __device__).
 *
 * fp32: k floats per moment (the default; the update is the plain one, bit for bit).
 * bf16: k bf16 values per moment, rounded to nearest (ties to even) after each update. v is
 *       stored itself, not sqrt(v): bf16 has fp32's exponent range, so v never under- or
 *       overflows, and sqrt(v) would double v's relative rounding error. A change of v smaller
 *       than half a bf16 step (2^-9 to 2^-8 relative) is rounded away; with beta2 = 0.999 a
 *       decaying v (0.1% per step) therefore stays put until new gradients move it, which errs
 *       on the side of smaller steps.
 * int8: blocks of OPTSTATE_BLOCK consecutive elements of the rank's shard (block b holds
 *       elements [b*256, (b+1)*256) counted from the shard's first element), each with one fp32
 *       scale a = the block's largest magnitude. The codes are quadratic, fine near zero:
 *         m:       signed byte q, |q| <= 127:  m = sign(q) * (q^2 / 127^2) * a      (a = max |m|)
 *         sqrt(v): unsigned byte q <= 255:     u = (q^2 / 255^2) * a, v = u^2        (a = max u)
 *       so m spans 1 : 16129 and v spans 1 : 4.2e9 within a block (v, through sqrt, has the
 *       wider range it needs; a linear code would round most of a block's small v to 0, and
 *       m / (sqrt(0) + eps) explodes). Quantising picks q = rint(K * sqrt(|x| / a)) (nearest in
 *       the code's sqrt domain; K = 127 or 255). The element equal to a gets q = K and decodes
 *       to a exactly, so decode-then-encode gives back the same codes and scales
 *       (optstate_roundtrip_exact in test_core checks it): a state file written as fp32 resumes
 *       bit-exactly with the same shard layout (the same number of ranks and -z).
 *       Memory of one moment of k elements: 4 * ceil(k / 256) bytes of scales, then k bytes of
 *       codes.
 * The AdamW update itself is always computed in fp32: a block is decoded, updated, re-encoded.
 */
#ifndef LLMC_OPTSTATE_H
#define LLMC_OPTSTATE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llmc/core/dtype.h"
#include "llmc/core/tensor.h"


#ifdef __cplusplus
extern "C" {
#endif

typedef enum { OPTSTATE_FP32 = 0, OPTSTATE_BF16 = 1, OPTSTATE_INT8 = 2 } OptStateType;
enum { OPTSTATE_BLOCK = 256 };

/* "fp32" | "bf16" | "int8" -> the type; -1 for anything else. */
int optstate_parse(const char *name);
const char *optstate_name(int type);
/* Bytes of one moment (m or v) of k elements stored as type. */
size_t optstate_bytes(size_t k, int type);
/* The blocks of k elements (int8: one scale each). */
static inline size_t optstate_blocks(size_t k) { return (k + OPTSTATE_BLOCK - 1) / OPTSTATE_BLOCK; }

/* Moment storage by block: element j0 .. j0 + count - 1 of a moment of k elements, where
 * j0 = block * OPTSTATE_BLOCK and count = min(256, k - j0). load decodes into x (fp32; for v the
 * value v itself), store encodes x. is_v selects v's code. Used by the CPU optimizer and the
 * CUDA trainer's host copies. */
void optstate_load_block(const void *state, int type, int is_v, size_t k, size_t block, float *x);
void optstate_store_block(void *state, int type, int is_v, size_t k, size_t block, const float *x);
/* A whole moment: k floats <-> its storage (blocks of the storage as above). */
void optstate_decode(const void *state, int type, int is_v, size_t k, float *x);
void optstate_encode(void *state, int type, int is_v, size_t k, const float *x);

/* The weight decay of each element of a shard [lo, hi): the parameter tensors cut into segments
 * (local indices, ends increasing), so that one pass over the shard's blocks knows each
 * element's decay. */
enum { OPTSTATE_MAX_SEGMENTS = 64 };
typedef struct {
    int count;
    size_t end[OPTSTATE_MAX_SEGMENTS];   /* segment s is [end[s-1], end[s]) of the shard */
    float decay[OPTSTATE_MAX_SEGMENTS];  /* weight_decay or 0 (the table's decay choice) */
} OptSegments;
/* specs: nspecs tensors laid out back to back (offset, numel, decay). Dies past the maximum. */
void optstate_segments(OptSegments *s, const TensorSpec *specs, int nspecs, size_t lo, size_t hi, float weight_decay);

/* One AdamW element in fp32, given c1 = 1 - beta1^t and c2 = 1 - beta2^t: the same formula as
 * llmc/cpu/adamw.h's adamw_update. Updates *m and *v, returns the new weight. */
LLMC_HD static inline float optstate_adamw(float w, float g, float *m, float *v, float lr, float beta1, float beta2,
                                           float c1, float c2, float eps, float weight_decay) {
    float mi = beta1 * *m + (1.0f - beta1) * g;
    float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / c1, vhat = vi / c2;
    return w - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * w);
}

/* n values to bf16 (round to nearest even) and back, OpenMP: the CUDA trainer's --offload copies
 * (fp32 master weights to bf16 parameters, bf16 gradients to fp32). */
void optstate_to_bf16(uint16_t *dst, const float *src, size_t n);
void optstate_from_bf16(float *dst, const uint16_t *src, size_t n);

/* ---- the element codes (shared with the CUDA kernel); bf16 is llmc/core/dtype.h's ---- */

/* int8 m: x in [-a, a] with scale a > 0 (a = 0: every code 0). */
LLMC_HD static inline int8_t optstate_q8m_encode(float x, float a) {
    if (!(a > 0.0f)) return 0;
    float r = fabsf(x) / a; /* <= 1 */
    int q = (int)rintf(sqrtf(r) * 127.0f);
    q = q > 127 ? 127 : q;
    return (int8_t)(x < 0.0f ? -q : q);
}
LLMC_HD static inline float optstate_q8m_decode(int8_t q, float a) {
    int k = q < 0 ? -(int)q : (int)q;
    float c = (float)(k * k) / 16129.0f;
    return q < 0 ? -(c * a) : c * a;
}
/* int8 v, through u = sqrt(v) >= 0 with scale a = the block's largest u. */
LLMC_HD static inline uint8_t optstate_q8v_encode(float v, float a) {
    if (!(a > 0.0f)) return 0;
    float r = sqrtf(v) / a;
    int q = (int)rintf(sqrtf(r) * 255.0f);
    return (uint8_t)(q > 255 ? 255 : q);
}
LLMC_HD static inline float optstate_q8v_decode(uint8_t q, float a) {
    float u = (float)((int)q * (int)q) / 65025.0f * a;
    return u * u;
}
/* The scale of a block from its values x (m: max |x|; v: max sqrt(x)). */
LLMC_HD static inline float optstate_q8_scale_term(float x, int is_v) { return is_v ? sqrtf(x) : fabsf(x); }

#ifdef __cplusplus
}
#endif
#endif
