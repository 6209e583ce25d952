/* AdamW with decoupled weight decay and bias correction, step t >= 1:
 *   g = grads * grad_scale                      (grad_scale: the clipping factor)
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   params -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * params)
 * global_norm_squared: sum of g^2 in double over fixed chunks (deterministic for any threads).
 * Shapes: params, grads, m, v (n).
 * adamw_update_compact: the same update (optstate_adamw) on k elements whose m and v are stored
 * as type (llmc/core/optstate.h: fp32, bf16 or blockwise int8): block by block, decode, update in
 * fp32, encode; the weight decay of element j from seg. */
#ifndef LLMC_CPU_ADAMW_H
#define LLMC_CPU_ADAMW_H
#include <stddef.h>

#include "llmc/core/optstate.h"
#ifdef __cplusplus
extern "C" {
#endif
void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t, float grad_scale);
void adamw_update_compact(float *params, const float *grads, void *m, void *v, int type, size_t k,
                          const OptSegments *seg, float lr, float beta1, float beta2, float eps, int t,
                          float grad_scale);
/* The same on blocks [b0, b1) of the k elements only (the update in buckets, llmc/train/optim.c). */
void adamw_update_compact_blocks(float *params, const float *grads, void *m, void *v, int type, size_t k,
                                 const OptSegments *seg, size_t b0, size_t b1, float lr, float beta1, float beta2,
                                 float eps, int t, float grad_scale);
double global_norm_squared(const float *grads, size_t n);
#ifdef __cplusplus
}
#endif
#endif
